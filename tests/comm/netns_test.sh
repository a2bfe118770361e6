#!/usr/bin/env bash
# Two-host test on one machine: two network namespaces joined by a veth pair act
# as two hosts; `tessera launch` runs 2 ranks in each (world of 4: shared memory
# inside a namespace, TCP across) and `tessera bench comm --check` runs every
# collective over that mix. Needs root and `ip netns`; otherwise it prints why and
# exits 77 (ctest: skipped).
#   tests/comm/netns_test.sh path/to/tessera
set -u
TESSERA=${1:?usage: netns_test.sh TESSERA_BINARY}
skip() { echo "SKIP: $*"; exit 77; }
# The sanitizer pass builds only the test binaries, not the CLI.
[ -x "$TESSERA" ] || skip "the tessera CLI is not built in this tree ($TESSERA)"

ID=$$
PORT=$((20000 + ID % 20000))
OUT=$(mktemp -d /tmp/tessera-netns.XXXXXX)
# shellcheck source=../../scripts/netns-pair.sh
source "$(dirname "$0")/../../scripts/netns-pair.sh"
cleanup() {
  netns_pair_down
  rm -rf "$OUT"
}
trap cleanup EXIT
netns_pair_up tsr || skip "$NETNS_ERROR"

BENCH=("$TESSERA" bench comm --op all -b 8 -e 1M --iters 2 --warmup 1 --check --timeout-ms 60000)
for node in 0 1; do
  ns=$NS0
  [ $node = 1 ] && ns=$NS1
  ip netns exec "$ns" timeout 120 "$TESSERA" launch --nproc 2 --nnodes 2 --node-rank $node \
    --rdzv "$A0:$PORT" --token netns-test-token -- "${BENCH[@]}" > "$OUT/node$node.txt" 2>&1 &
  eval "PID$node=$!"
done
wait "$PID0"; RC0=$?
wait "$PID1"; RC1=$?
cat "$OUT/node0.txt"
if [ $RC0 != 0 ] || [ $RC1 != 0 ]; then
  echo "FAIL: node 0 exited $RC0, node 1 exited $RC1"
  echo "--- node 1 output:"; cat "$OUT/node1.txt"
  exit 1
fi
grep -q "transport tcp $A1" "$OUT/node0.txt" || grep -q "transport shm" "$OUT/node0.txt" || {
  echo "FAIL: unexpected transport line"; exit 1; }
grep -q "ERROR" "$OUT/node0.txt" && { echo "FAIL: wrong results"; exit 1; }
echo "PASS: 4 ranks on 2 namespaces (shm inside, tcp across), every collective checked"
