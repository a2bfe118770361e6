#!/usr/bin/env bash
# Tensor and pipeline parallelism across two "hosts": two network namespaces
# joined by a veth pair, one `tessera generate --nnodes 2` per namespace, ranks
# talking TCP across (shared memory inside). Runs tp=2 (one rank per host), pp=2
# (one stage per host) and tp=2 x pp=2 (a stage per host), each checked byte for
# byte against the single-rank logits. Needs root and `ip netns`; otherwise it
# prints why and exits 77 (ctest: skipped).
#   tests/engine/parallel_netns_test.sh path/to/tessera path/to/shared
set -u
TESSERA=${1:?usage: parallel_netns_test.sh TESSERA SHARED_DIR}
SHARED=${2:?usage: parallel_netns_test.sh TESSERA SHARED_DIR}
skip() { echo "SKIP: $*"; exit 77; }
[ -x "$TESSERA" ] || skip "the tessera CLI is not built in this tree ($TESSERA)"
MODEL=$SHARED/models/stories260K-moe4x2.gguf
[ -f "$MODEL" ] || skip "no shared models"

ID=$$
OUT=$(mktemp -d /tmp/tessera-pnetns.XXXXXX)
# shellcheck source=../../scripts/netns-pair.sh
source "$(dirname "$0")/../../scripts/netns-pair.sh"
cleanup() {
  netns_pair_down
  rm -rf "$OUT"
}
trap cleanup EXIT
netns_pair_up tpn || skip "$NETNS_ERROR"

GEN=(generate "$MODEL" -p "Once upon a time there was" -n 10 --temp 0 --ignore-eos --batch 2
     --prefill-chunk 4 --timeout-ms 60000)
"$TESSERA" "${GEN[@]}" --dump-logits "$OUT/single.bin" > "$OUT/single.txt" 2>&1 || {
  echo "FAIL: single rank"; cat "$OUT/single.txt"; exit 1; }

PORT=$((21000 + ID % 20000))
for layout in "--tp 2" "--pp 2" "--tp 2 --pp 2"; do
  PORT=$((PORT + 1))
  for node in 0 1; do
    ns=$NS0
    [ $node = 1 ] && ns=$NS1
    # shellcheck disable=SC2086
    ip netns exec "$ns" timeout 120 "$TESSERA" "${GEN[@]}" $layout --nnodes 2 --node-rank $node \
      --rdzv "$A0:$PORT" --token netns-parallel --dump-logits "$OUT/node$node.bin" \
      > "$OUT/node$node.txt" 2>&1 &
    eval "PID$node=$!"
  done
  wait "$PID0"; RC0=$?
  wait "$PID1"; RC1=$?
  if [ $RC0 != 0 ] || [ $RC1 != 0 ]; then
    echo "FAIL: $layout: node 0 exited $RC0, node 1 exited $RC1"
    echo "--- node 0:"; cat "$OUT/node0.txt"; echo "--- node 1:"; cat "$OUT/node1.txt"
    exit 1
  fi
  # The driver (last stage, tp rank 0) lives on node 1 whenever pp = 2 or tp = 2 with
  # one rank per node puts rank 0 on node 0: find whichever wrote logits.
  dumped=""
  for node in 0 1; do [ -s "$OUT/node$node.bin" ] && dumped=$OUT/node$node.bin; done
  [ -n "$dumped" ] || { echo "FAIL: $layout: no logits written"; exit 1; }
  cmp -s "$OUT/single.bin" "$dumped" || { echo "FAIL: $layout: logits differ across hosts"; exit 1; }
  grep -q " tcp" "$OUT"/node*.txt || { echo "FAIL: $layout: no rank reports a TCP link"; cat "$OUT"/node*.txt; exit 1; }
  rm -f "$OUT"/node*.bin
  echo "ok: $layout across two namespaces over TCP: logits bit-identical to one rank"
done
echo PASS
