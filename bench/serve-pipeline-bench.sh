#!/usr/bin/env bash
# Serving throughput of the one engine loop across layouts, interleaved round by
# round so this VM's speed drift hits every configuration alike: `tessera serve` at
# C concurrent streams with one 1-thread rank, with two pipeline stages of one
# thread each, and `tessera generate --pp 2 --batch C` (the same loop with every
# request submitted up front) — then, when BASELINE names another build's tessera,
# serve tp=1 (all cores) and tp=2 (one thread each) of both builds side by side.
# Prints each configuration's median output tokens/s and the ratios the engine-loop
# issue asks for:
#   serve pp2 / serve pp1 (one thread each)   (target >= 1.6)
#   serve pp2 / generate pp2 --batch C         (target >= 0.9)
#   this build / BASELINE, serve tp1 and tp2   (target >= 0.97)
#
#   bench/serve-pipeline-bench.sh [build/bin/tessera] MODEL.gguf [ROUNDS]
# Environment: BASELINE (another tessera binary), CONCURRENCY (16), INPUT (16 prompt
# words), OUTPUT (64 tokens), PROMPTS_PER_SLOT (2), PORT (8140).
# A benchmark, not a test: it prints and exits 0 (2 when it cannot run).
set -u
TESSERA=${1:-build/bin/tessera}
MODEL=${2:?usage: serve-pipeline-bench.sh [TESSERA] MODEL.gguf [ROUNDS]}
ROUNDS=${3:-3}
BASELINE=${BASELINE:-}
CONCURRENCY=${CONCURRENCY:-16}
INPUT=${INPUT:-16}
OUTPUT=${OUTPUT:-64}
PROMPTS_PER_SLOT=${PROMPTS_PER_SLOT:-2}
PORT=${PORT:-8140}
[ -x "$TESSERA" ] || { echo "no tessera binary at $TESSERA" >&2; exit 2; }
[ -f "$MODEL" ] || { echo "no model at $MODEL" >&2; exit 2; }
[ -z "$BASELINE" ] || [ -x "$BASELINE" ] || { echo "BASELINE $BASELINE is not executable" >&2; exit 2; }
command -v curl > /dev/null || { echo "needs curl" >&2; exit 2; }
OUT=$(mktemp -d /tmp/tessera-spbench.XXXXXX)
NUM_PROMPTS=$((CONCURRENCY * PROMPTS_PER_SLOT))
# shellcheck source=serve-lib.sh
source "$(dirname "$0")/serve-lib.sh"
trap 'stop_server; rm -rf "$OUT"' EXIT

# Output tokens/s of `tessera generate --batch CONCURRENCY` (every generated token over
# the wall time of the whole batch, prefill included, as a server's throughput is).
generate_tok_s() {  # flags...
  local prompt
  prompt=$(printf ' the%.0s' $(seq "$INPUT"))
  "$TESSERA" generate "$MODEL" -p "$prompt" -n "$OUTPUT" --temp 0 --ignore-eos \
    --batch "$CONCURRENCY" "$@" 2>&1 > /dev/null |
    awk '/generated/ {
      for (i = 1; i <= NF; ++i) {
        if ($i == "generated") tokens = $(i + 1)
        if ($i == "wall;") wall = $(i - 2)
      }
      if (wall > 0) printf "%.1f\n", tokens / wall
    }'
}

declare -A RESULTS
record() { RESULTS[$1]="${RESULTS[$1]:-} $2"; }

echo "model $MODEL; $CONCURRENCY streams, ~$INPUT prompt words, $OUTPUT output tokens, $ROUNDS rounds"
for round in $(seq "$ROUNDS"); do
  record serve_pp1_t1 "$(serve_tok_s "$TESSERA" -t 1)"
  record serve_pp2_t1 "$(serve_tok_s "$TESSERA" --pp 2 -t 1)"
  record generate_pp2_t1 "$(generate_tok_s --pp 2 -t 1)"
  if [ -n "$BASELINE" ]; then
    record serve_tp1 "$(serve_tok_s "$TESSERA")"
    record base_serve_tp1 "$(serve_tok_s "$BASELINE")"
    record serve_tp2 "$(serve_tok_s "$TESSERA" --tp 2 -t 1)"
    record base_serve_tp2 "$(serve_tok_s "$BASELINE" --tp 2 -t 1)"
  fi
  echo "round $round:$(for k in "${!RESULTS[@]}"; do printf ' %s=%s' "$k" "${RESULTS[$k]##* }"; done)"
done
echo
printf "%-18s %12s   %s\n" configuration "out tok/s" "(each round)"
for k in serve_pp1_t1 serve_pp2_t1 generate_pp2_t1 serve_tp1 base_serve_tp1 serve_tp2 base_serve_tp2; do
  [ -n "${RESULTS[$k]:-}" ] && printf "%-18s %12s   %s\n" "$k" "$(median "${RESULTS[$k]}")" "${RESULTS[$k]}"
done
echo
pp1=$(median "${RESULTS[serve_pp1_t1]}")
pp2=$(median "${RESULTS[serve_pp2_t1]}")
gen=$(median "${RESULTS[generate_pp2_t1]}")
echo "serve pp2 / serve pp1 (1 thread each):  $(ratio "$pp2" "$pp1")   (target >= 1.6)"
echo "serve pp2 / generate pp2 --batch $CONCURRENCY:  $(ratio "$pp2" "$gen")   (target >= 0.9)"
if [ -n "$BASELINE" ]; then
  echo "serve tp1, this build / baseline:       $(ratio "$(median "${RESULTS[serve_tp1]}")" "$(median "${RESULTS[base_serve_tp1]}")")   (target >= 0.97)"
  echo "serve tp2, this build / baseline:       $(ratio "$(median "${RESULTS[serve_tp2]}")" "$(median "${RESULTS[base_serve_tp2]}")")   (target >= 0.97)"
fi
