#!/usr/bin/env bash
# One prompt's KV hand-off on an idle `tessera serve --pd 1:1` pair: N prompts of
# ~2,000 tokens (distinct, so no prefix cache helps), one at a time, each reporting
# (usage.tessera_kv_transfer) its bytes, the transfer (the prefill instance's reply
# to the last block in, decode side) and the hand-off (the reply to the request's
# first decoded token). With a second binary, the two alternate round by round
# (A/B on the same machine state). Beside them the raw link: `tessera bench comm
# --op sendrecv` between two processes over shared memory, 8 and 64 MiB.
#
#   bench/pd-transfer-bench.sh [build/bin/tessera] MODEL.gguf [N] [OTHER_TESSERA]
# Environment: ROUNDS (2), WORDS (1800 words a prompt), PORT (9400).
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
OUT=$(mktemp -d /tmp/tessera-pdx.XXXXXX)
SERVER_PID=""
trap '[ -n "$SERVER_PID" ] && kill -TERM "$SERVER_PID" 2> /dev/null; rm -rf "$OUT"' EXIT

run() {  # binary label round
  local bin=$1 label=$2 round=$3
  PORT=$((PORT + 1))
  "$bin" serve "$MODEL" --pd 1:1 -t 1 --port "$PORT" > "$OUT/serve.log" 2>&1 &
  SERVER_PID=$!
  for _ in $(seq 600); do
    curl -sf "http://127.0.0.1:$PORT/health" 2> /dev/null | grep -q '"ok"' && break
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
    curl -s "http://127.0.0.1:$PORT/v1/completions" -H 'Content-Type: application/json' \
      -d @"$OUT/req.json" | jq -r --arg l "$label" '.usage.tessera_kv_transfer |
        if . == null then "\($l): no transfer" else
        "\($l): \(.tokens) tokens, \(.bytes / 1e6 | floor) MB, transfer \(.transfer_ms * 10 | round / 10) ms" +
        " = \(.bytes / .transfer_ms / 1e6 * 100 | round / 100) GB/s, hand-off \(.handoff_ms * 10 | round / 10) ms" end'
  done
  kill -TERM "$SERVER_PID" 2> /dev/null
  wait "$SERVER_PID" 2> /dev/null
  SERVER_PID=""
}

raw() {
  "$TESSERA" bench comm --op sendrecv --np 2 --transport shm -b 8M -e 64M 2> /dev/null |
    awk '$1 ~ /^[0-9]+$/ {printf "raw shm sendrecv %d MiB: %s GB/s\n", $1 / 1048576, $7}'
}

echo "model: $MODEL, $N prompts of $WORDS words a round, $ROUNDS rounds"
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
done
raw
