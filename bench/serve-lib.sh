# Shared by the serving benchmarks (sourced, not run): one `tessera serve` at a time
# on a fresh port, measured with `tessera bench serve`.
#   load_tok_s                   the load against the server on $PORT: out tok/s
#   serve_tok_s BINARY FLAGS...  starts BINARY serve $MODEL FLAGS, runs the load
#                                ($NUM_PROMPTS prompts, $CONCURRENCY streams, $INPUT
#                                prompt words, $OUTPUT tokens, EOS ignored), stops
#                                it; prints the output tokens/s (0 when it failed);
#                                the load's report stays in $OUT/bench.txt
#   median "V1 V2 …", ratio A B
# Uses $TESSERA (the load generator), $MODEL, $PORT (the first port less one; each
# server takes the next), $OUT.
SERVER_PID=""
# A fresh port for each server (the last one may be in TIME_WAIT, or still held by
# a server that is slow to exit), counted in a file: the callers run in $(...).
next_port() {
  local last
  last=$(cat "$OUT/port" 2> /dev/null || echo "$PORT")
  echo $((last + 1)) > "$OUT/port"
  echo $((last + 1))
}
stop_server() {
  [ -n "$SERVER_PID" ] && kill -TERM "$SERVER_PID" 2> /dev/null && wait "$SERVER_PID" 2> /dev/null
  SERVER_PID=""
}

wait_ready() {  # port
  for _ in $(seq 240); do
    curl -sf "http://127.0.0.1:$1/health" > /dev/null 2>&1 && return 0
    sleep 0.25
  done
  echo "server did not come up on port $1" >&2
  return 1
}

# The load against the server on $PORT: its output tokens/s (0 when it failed).
load_tok_s() {
  "$TESSERA" bench serve --base-url "http://127.0.0.1:$PORT" \
    --num-prompts "$NUM_PROMPTS" --max-concurrency "$CONCURRENCY" \
    --input-len "$INPUT" --output-len "$OUTPUT" --ignore-eos --seed 1 > "$OUT/bench.txt" 2>&1
  local tok_s
  tok_s=$(awk '/Output token throughput/ {print $NF}' "$OUT/bench.txt")
  echo "${tok_s:-0}"
}

serve_tok_s() {  # binary flags...
  local binary=$1
  shift
  PORT=$(next_port)
  "$binary" serve "$MODEL" --port "$PORT" --max-num-seqs "$CONCURRENCY" "$@" > "$OUT/serve.log" 2>&1 &
  SERVER_PID=$!
  local tok_s=0
  wait_ready "$PORT" && tok_s=$(load_tok_s)
  stop_server
  echo "$tok_s"
}

median() { tr ' ' '\n' <<< "$1" | grep -v '^$' | sort -g | awk '{v[NR] = $1} END {print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2}'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN {printf "%.3f", (b > 0) ? a / b : 0}'; }
