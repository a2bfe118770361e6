#!/usr/bin/env bash
# tessera serve against llama.cpp's llama-server on the same GGUF, same threads,
# measured with the same `tessera bench serve` in one session: for each
# concurrency, one server at a time (the other stopped), tessera first.
#
#   LLAMA_SERVER=path/to/llama-server bench/serve-vs-llama.sh [build/bin/tessera] MODEL.gguf
# Environment: CONCURRENCY ("1 4 16"), INPUT (128), OUTPUT (128), PROMPTS_PER_SLOT (4),
# THREADS (all cores), PORT (8123), SEED (1: the prompts and arrivals), DATASET (random;
# mixed = a quarter of the prompts 8x longer, for TPOT under long prefills).
set -u
TESSERA=${1:-build/bin/tessera}
MODEL=${2:?usage: serve-vs-llama.sh [TESSERA] MODEL.gguf}
LLAMA_SERVER=${LLAMA_SERVER:-}
CONCURRENCY=${CONCURRENCY:-1 4 16}
INPUT=${INPUT:-128}
OUTPUT=${OUTPUT:-128}
PROMPTS_PER_SLOT=${PROMPTS_PER_SLOT:-4}
THREADS=${THREADS:-$(nproc)}
PORT=${PORT:-8123}
SEED=${SEED:-1}
DATASET=${DATASET:-random}
LONGEST=$INPUT
[ "$DATASET" = mixed ] && LONGEST=$((INPUT * 8))
NAME=$(basename "$MODEL" .gguf)
OUT=$(mktemp -d /tmp/tessera-svl.XXXXXX)
SERVER_PID=""
stop_server() {
  [ -n "$SERVER_PID" ] && kill -TERM "$SERVER_PID" 2> /dev/null && wait "$SERVER_PID" 2> /dev/null
  SERVER_PID=""
}
trap 'stop_server; rm -rf "$OUT"' EXIT
[ -x "$TESSERA" ] || { echo "no tessera at $TESSERA" >&2; exit 2; }
[ -n "$LLAMA_SERVER" ] && [ -x "$LLAMA_SERVER" ] || echo "note: LLAMA_SERVER not set: tessera only" >&2

wait_ready() {  # port
  for _ in $(seq 120); do
    curl -sf "http://127.0.0.1:$1/health" > /dev/null 2>&1 && return 0
    sleep 0.5
  done
  echo "server did not come up" >&2
  return 1
}

# One benchmark: prints "tok/s ttft_p50 ttft_p99 tpot_p50 tpot_p99 failed tok/s_with_failed"
# (ms; the last counts the tokens that failed requests streamed before their error).
bench() {  # port concurrency
  local port=$1 c=$2
  "$TESSERA" bench serve --base-url "http://127.0.0.1:$port" --model "$NAME" \
    --num-prompts $((c * PROMPTS_PER_SLOT)) --max-concurrency "$c" --input-len "$INPUT" \
    --output-len "$OUTPUT" --dataset "$DATASET" --ignore-eos --seed "$SEED" --json "$OUT/r.json" > "$OUT/bench.txt" 2>&1
  awk '
    /Output token throughput/ {tp = $NF; tpf = $NF}
    /Output throughput with them/ {tpf = $NF}
    /Median TTFT/ {t50 = $NF} /P99 TTFT/ {t99 = $NF}
    /Median TPOT/ {p50 = $NF} /P99 TPOT/ {p99 = $NF}
    /Failed requests/ {failed = $NF}
    END {printf "%s %s %s %s %s %s %s\n", tp, t50, t99, p50, p99, failed, tpf}' "$OUT/bench.txt"
}

echo "model $MODEL, $THREADS threads, $DATASET prompts of ~$INPUT (up to $LONGEST) / output $OUTPUT tokens, $PROMPTS_PER_SLOT prompts per slot"
printf "%-12s %5s %12s %10s %10s %10s %10s %7s %12s\n" server conc "out tok/s" "TTFT p50" "TTFT p99" \
  "TPOT p50" "TPOT p99" failed "+failed tok/s"
for c in $CONCURRENCY; do
  "$TESSERA" serve "$MODEL" --port "$PORT" -t "$THREADS" --max-num-seqs "$((c > 1 ? c : 2))" \
    --served-model-name "$NAME" > "$OUT/tessera.log" 2>&1 &
  SERVER_PID=$!
  wait_ready "$PORT" && read -r tp t50 t99 p50 p99 failed tpf <<< "$(bench "$PORT" "$c")" &&
    printf "%-12s %5s %12s %10s %10s %10s %10s %7s %12s\n" tessera "$c" "$tp" "$t50" "$t99" "$p50" \
      "$p99" "$failed" "$tpf"
  stop_server
  T_TP=${tp:-0}
  if [ -n "$LLAMA_SERVER" ] && [ -x "$LLAMA_SERVER" ]; then
    # Its own port: the previous server's may still be in TIME_WAIT.
    "$LLAMA_SERVER" -m "$MODEL" --port "$((PORT + 1))" -t "$THREADS" --parallel "$c" \
      -c $(((LONGEST * 2 + OUTPUT) * c + 256)) --alias "$NAME" > "$OUT/llama.log" 2>&1 &
    SERVER_PID=$!
    # The ratio gives llama-server the tokens of its failed streams too (it fails some
    # streams of random-weight models at their end, after doing the work).
    wait_ready "$((PORT + 1))" &&
      read -r tp t50 t99 p50 p99 failed tpf <<< "$(bench "$((PORT + 1))" "$c")" &&
      printf "%-12s %5s %12s %10s %10s %10s %10s %7s %12s   tessera/llama throughput %s\n" \
        llama-server "$c" "$tp" "$t50" "$t99" "$p50" "$p99" "$failed" "$tpf" \
        "$(awk -v a="$T_TP" -v b="$tpf" 'BEGIN {printf "%.2f", (b > 0) ? a / b : 0}')"
    stop_server
  fi
done
