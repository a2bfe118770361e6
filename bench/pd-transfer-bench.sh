#!/usr/bin/env bash
# One prompt's KV hand-off on an idle `tessera serve --pd 1:1` pair: N prompts of
# ~2,000 tokens (distinct, so no prefix cache helps), one at a time, each reporting
# (usage.tessera_kv_transfer) its bytes, those streamed while the prefill ran, the
# transfer left after the prefill's end (its last burst's frame to the last block
# in, decode side; GB/s of the bytes sent then), the hand-off (the prefill's end to
# the request's first decoded token) and the whole request (2 tokens out) as the
# client saw it. With a second binary, the two alternate round by round
# (A/B on the same machine state). Beside them the raw link: `tessera bench comm
# --op sendrecv` between two processes over shared memory, 8 and 64 MiB.
#
# With NETNS=1 (root, iproute2 with tc), then the same across two network-namespace
# "hosts" joined by a veth pair shaped to 10 Gbit/s: the front and the prefill
# instance on host 0 (`--pd 1:0 --pd-decode URL --pd-store A0:PORT`), the decode
# instance on host 1 (`--pd-join A0:PORT --pd-role decode:0`), KV over TCP; beside
# it the raw TCP link between the hosts (`tessera launch --nnodes 2 … bench comm
# --op sendrecv`), and the same with --kv-transfer-dtype q8_0 and fp8_e4m3.
#
#   bench/pd-transfer-bench.sh [build/bin/tessera] MODEL.gguf [N] [OTHER_TESSERA]
# With TP=1 each round also runs a tp=2 prefill instance and a tp=2 decode
# instance (--prefill-tp 2, --decode-tp 2; the other side one rank): the blocks
# gathered from, or scattered to, the instance's two ranks (docs/pd.md); the
# second binary too, when given.
#
# FLAGS: serve flags for every run, e.g. FLAGS="--max-num-batched-tokens 4096" to
# prefill each prompt in one step (its K/V then streams layer by layer only).
#
# Environment: ROUNDS (2), WORDS (1800 words a prompt), PORT (9400), NETNS (0), TP (0),
# FLAGS ("").
# A benchmark, not a test: prints and exits 0 (2 when it cannot run).
set -u
TESSERA=${1:-build/bin/tessera}
MODEL=${2:?usage: pd-transfer-bench.sh [TESSERA] MODEL.gguf [N] [OTHER_TESSERA]}
N=${3:-4}
OTHER=${4:-}
ROUNDS=${ROUNDS:-2}
WORDS=${WORDS:-1800}
PORT=${PORT:-9400}
for tool in curl jq python3; do command -v $tool > /dev/null || { echo "needs $tool" >&2; exit 2; }; done
NETNS=${NETNS:-0}
OUT=$(mktemp -d /tmp/tessera-pdx.XXXXXX)
SERVER_PIDS=()
stop_servers() {
  for pid in "${SERVER_PIDS[@]}"; do kill -TERM "$pid" 2> /dev/null; done
  for pid in "${SERVER_PIDS[@]}"; do wait "$pid" 2> /dev/null; done
  SERVER_PIDS=()
}
trap 'stop_servers; [ "$NETNS" = 1 ] && netns_pair_down; rm -rf "$OUT"' EXIT
IN0=()     # runs a command on the front's host (netns: host 0)
HOST=127.0.0.1

run() {  # binary label round [serve flags…]
  local bin=$1 label=$2 round=$3
  shift 3
  # shellcheck disable=SC2206
  local extra=(${FLAGS:-})
  set -- "${extra[@]}" "$@"
  PORT=$((PORT + 4))
  if [ -n "${NS1:-}" ]; then  # the decode instance on host 1
    "${IN0[@]}" "$bin" serve "$MODEL" -t 1 --host "$HOST" --port "$PORT" --pd 1:0 \
      --pd-decode "http://$A1:$((PORT + 1))" --pd-store "$A0:$((PORT + 2))" "$@" \
      > "$OUT/serve.log" 2>&1 &
    SERVER_PIDS+=($!)
    ip netns exec "$NS1" "$bin" serve "$MODEL" -t 1 --host "$A1" --port $((PORT + 1)) \
      --pd-join "$A0:$((PORT + 2))" --pd-role decode:0 "$@" > "$OUT/decode.log" 2>&1 &
    SERVER_PIDS+=($!)
  else
    "$bin" serve "$MODEL" --pd 1:1 -t 1 --port "$PORT" "$@" > "$OUT/serve.log" 2>&1 &
    SERVER_PIDS+=($!)
  fi
  for _ in $(seq 600); do
    "${IN0[@]}" curl -sf "http://$HOST:$PORT/health" 2> /dev/null | grep -q '"ok"' && break
    sleep 0.1
  done
  for r in $(seq "$N"); do
    python3 - "$round" "$r" "$WORDS" > "$OUT/req.json" <<'PY'
import json, random, sys
round_, r, words = (int(a) for a in sys.argv[1:])
rng = random.Random(round_ * 1000 + r)
vocab = "alpha beta gamma delta river stone cloud light paper green".split()
print(json.dumps({"prompt": " ".join(rng.choice(vocab) for _ in range(words)),
                  "max_tokens": 2, "temperature": 0}))
PY
    local t0 t1
    t0=$(date +%s%N)
    "${IN0[@]}" curl -s "http://$HOST:$PORT/v1/completions" -H 'Content-Type: application/json' \
      -d @"$OUT/req.json" > "$OUT/resp.json"
    t1=$(date +%s%N)
    jq -r --arg l "$label" --argjson e2e "$(( (t1 - t0) / 1000000 ))" '.usage.tessera_kv_transfer |
        if . == null then "\($l): no transfer" else
        "\($l): \(.tokens) tokens, \(.bytes / 1e6 | floor) MB (\((.streamed_bytes // 0) / 1e6 | floor) MB" +
        " before the prefill ended), after its end \(.transfer_ms * 10 | round / 10) ms" +
        " = \((.bytes - (.streamed_bytes // 0)) / .transfer_ms / 1e6 * 100 | round / 100) GB/s," +
        " hand-off \(.handoff_ms * 10 | round / 10) ms, request \($e2e) ms" end' "$OUT/resp.json"
  done
  stop_servers
}

raw() {
  "$TESSERA" bench comm --op sendrecv --np 2 --transport shm -b 8M -e 64M 2> /dev/null |
    awk '$1 ~ /^[0-9]+$/ {printf "raw shm sendrecv %d MiB: %s GB/s\n", $1 / 1048576, $7}'
}

echo "model: $MODEL, $N prompts of $WORDS words a round, $ROUNDS rounds${FLAGS:+, flags: $FLAGS}"
raw
for round in $(seq "$ROUNDS"); do
  echo "== round $round"
  if [ -n "$OTHER" ] && [ $((round % 2)) -eq 0 ]; then
    run "$OTHER" B "$round"
    run "$TESSERA" A "$round"
  elif [ -n "$OTHER" ]; then
    run "$TESSERA" A "$round"
    run "$OTHER" B "$round"
  else
    run "$TESSERA" A "$round"
  fi
  if [ "${TP:-0}" = 1 ]; then
    run "$TESSERA" "A prefill-tp2" "$round" --prefill-tp 2
    [ -n "$OTHER" ] && run "$OTHER" "B prefill-tp2" "$round" --prefill-tp 2
    run "$TESSERA" "A decode-tp2" "$round" --decode-tp 2
    [ -n "$OTHER" ] && run "$OTHER" "B decode-tp2" "$round" --decode-tp 2
  fi
done
raw

[ "$NETNS" = 1 ] || exit 0
# shellcheck source=../scripts/netns-pair.sh
source "$(dirname "$0")/../scripts/netns-pair.sh"
echo "== across two namespace hosts, 10 Gbit/s (veth + tc tbf), KV over TCP"
netns_bench_up pdt || exit 0
netns_pair_shape 10gbit
export TESSERA_CLUSTER_TOKEN=${TESSERA_CLUSTER_TOKEN:-pd-transfer-bench-$$}
IN0=(ip netns exec "$NS0")
HOST=$A0
raw_tcp_print() {
  # netns_pair_run sends stdout nowhere: run node 0 here instead, node 1 beside it.
  PORT=$((PORT + 4))
  ip netns exec "$NS1" "$TESSERA" launch --nproc 1 --nnodes 2 --node-rank 1 --rdzv "$A0:$PORT" \
    --token "$TESSERA_CLUSTER_TOKEN" -- "$TESSERA" bench comm --op sendrecv -b 8M -e 64M \
    > /dev/null 2>&1 &
  local other=$!
  ip netns exec "$NS0" "$TESSERA" launch --nproc 1 --nnodes 2 --node-rank 0 --rdzv "$A0:$PORT" \
    --token "$TESSERA_CLUSTER_TOKEN" -- "$TESSERA" bench comm --op sendrecv -b 8M -e 64M 2> /dev/null |
    awk '$1 ~ /^[0-9]+$/ {printf "raw tcp sendrecv across the hosts %d MiB: %s GB/s\n", $1 / 1048576, $7}'
  wait "$other"
}
raw_tcp_print
for round in $(seq "$ROUNDS"); do
  echo "== netns round $round"
  bins=("A $TESSERA")
  if [ -n "$OTHER" ] && [ $((round % 2)) -eq 0 ]; then
    bins=("B $OTHER" "A $TESSERA")
  elif [ -n "$OTHER" ]; then
    bins=("A $TESSERA" "B $OTHER")
  fi
  for entry in "${bins[@]}"; do
    label=${entry%% *} bin=${entry#* }
    run "$bin" "$label tcp f16" "$round"
    run "$bin" "$label tcp q8_0" "$round" --kv-transfer-dtype q8_0
    run "$bin" "$label tcp fp8_e4m3" "$round" --kv-transfer-dtype fp8_e4m3
  done
done
raw_tcp_print
