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
[ "$(id -u)" = 0 ] || skip "needs root to create network namespaces"
command -v ip > /dev/null || skip "iproute2 (ip) is not installed"

ID=$$
NS0=tsr0_$ID
NS1=tsr1_$ID
V0=tsv0_$ID
V1=tsv1_$ID
SUBNET=10.$((ID % 200 + 20)).$((ID / 200 % 250)).
A0=${SUBNET}1
A1=${SUBNET}2
PORT=$((20000 + ID % 20000))
OUT=$(mktemp -d /tmp/tessera-netns.XXXXXX)
cleanup() {
  ip netns del "$NS0" 2> /dev/null
  ip netns del "$NS1" 2> /dev/null
  rm -rf "$OUT"
}
trap cleanup EXIT
ip netns add "$NS0" 2> "$OUT/err" || skip "network namespaces unavailable: $(cat "$OUT/err")"
ip netns add "$NS1" || skip "cannot create a second namespace"
ip link add "$V0" type veth peer name "$V1" 2> "$OUT/err" || skip "veth unavailable: $(cat "$OUT/err")"
ip link set "$V0" netns "$NS0" && ip link set "$V1" netns "$NS1" || exit 1
ip -n "$NS0" addr add "$A0/24" dev "$V0" && ip -n "$NS1" addr add "$A1/24" dev "$V1" || exit 1
for ns in "$NS0" "$NS1"; do ip -n "$ns" link set lo up; done
ip -n "$NS0" link set "$V0" up && ip -n "$NS1" link set "$V1" up || exit 1

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
