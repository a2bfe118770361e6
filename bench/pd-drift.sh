#!/usr/bin/env bash
# How far a lossy --kv-transfer-dtype moves the decode's output (issue 33): the
# same N greedy requests (LONG-word prompts, OUTPUT tokens) to one plain server
# and to `--pd 1:1` with each transfer dtype; per dtype: texts equal, the largest
# and mean |logprob change| of the sampled tokens up to each request's first
# differing token, and the bytes sent per prompt token.
#   bench/pd-drift.sh [build/bin/tessera] MODEL.gguf
# Environment: N (8), LONG (512), OUTPUT (32), DTYPES ("f16 q8_0 fp8_e4m3 mxfp8"), PORT (8540).
set -u
TESSERA=${1:-build/bin/tessera}
MODEL=${2:?usage: pd-drift.sh [TESSERA] MODEL.gguf}
N=${N:-8}
LONG=${LONG:-512}
OUTPUT=${OUTPUT:-32}
DTYPES=${DTYPES:-f16 q8_0 fp8_e4m3 mxfp8}
PORT=${PORT:-8540}
for tool in curl jq; do command -v $tool > /dev/null || { echo "needs $tool" >&2; exit 2; }; done
OUT=$(mktemp -d /tmp/tessera-pddrift.XXXXXX)
SERVER_PID=""
stop_server() {
  [ -n "$SERVER_PID" ] && kill -TERM "$SERVER_PID" 2> /dev/null && wait "$SERVER_PID" 2> /dev/null
  SERVER_PID=""
}
trap 'stop_server; rm -rf "$OUT"' EXIT
start_server() {
  PORT=$((PORT + 1))
  "$TESSERA" serve "$MODEL" --port "$PORT" -t 1 "$@" > "$OUT/serve.log" 2>&1 &
  SERVER_PID=$!
  for _ in $(seq 2400); do
    curl -sf "http://127.0.0.1:$PORT/health" 2> /dev/null | grep -q '"ok"' && return 0
    sleep 0.05
  done
  echo "server did not come up: $*" >&2
  return 1
}
WORDS=(the cat dog sat on mat and ran to a big red house with old tree by sea in sun)
run() {  # tag
  for i in $(seq "$N"); do
    local p="Story $i:"
    for j in $(seq "$LONG"); do p="$p ${WORDS[$(((i * 13 + j * 7 + j / 11) % 20))]}"; done
    curl -s "http://127.0.0.1:$PORT/v1/completions" -H 'Content-Type: application/json' \
      -d "{\"prompt\":\"$p\",\"max_tokens\":$OUTPUT,\"temperature\":0,\"ignore_eos\":true,\"logprobs\":1}" \
      > "$OUT/$1.$i.json"
  done
}
start_server || exit 2
run plain
stop_server
for dtype in $DTYPES; do
  start_server --pd 1:1 --kv-transfer-dtype "$dtype" || exit 2
  run "$dtype"
  stop_server
  same=0 worst=0 sum=0 count=0 bytes=0 tokens=0
  for i in $(seq "$N"); do
    read -r eq w s c b t <<< "$(jq -rn --slurpfile a "$OUT/plain.$i.json" --slurpfile b "$OUT/$dtype.$i.json" '
      ($a[0].choices[0].logprobs) as $x | ($b[0].choices[0].logprobs) as $y
      | ([range(0; [$x.tokens | length, $y.tokens | length] | min)]
         | reduce .[] as $k ({stop: false, d: []};
             if .stop or $x.tokens[$k] != $y.tokens[$k] then .stop = true
             else .d += [($x.token_logprobs[$k] - $y.token_logprobs[$k]) | fabs] end) | .d) as $d
      | [(if $a[0].choices[0].text == $b[0].choices[0].text then 1 else 0 end), ($d | max // 0),
         ($d | add // 0), ($d | length), ($b[0].usage.tessera_kv_transfer.bytes // 0),
         ($b[0].usage.tessera_kv_transfer.tokens // 0)] | map(tostring) | join(" ")')"
    same=$((same + eq))
    worst=$(awk -v a="$worst" -v b="$w" 'BEGIN {print (b > a) ? b : a}')
    sum=$(awk -v a="$sum" -v b="$s" 'BEGIN {print a + b}')
    count=$((count + c))
    bytes=$((bytes + b))
    tokens=$((tokens + t))
  done
  printf "%-9s: %d of %d texts equal; |logprob change| max %.5f, mean %.6f over %d tokens; %s bytes per prompt token\n" \
    "$dtype" "$same" "$N" "$worst" "$(awk -v s="$sum" -v c="$count" 'BEGIN {print (c > 0) ? s / c : 0}')" \
    "$count" "$(awk -v b="$bytes" -v t="$tokens" 'BEGIN {printf "%.1f", (t > 0) ? b / t : 0}')"
done
