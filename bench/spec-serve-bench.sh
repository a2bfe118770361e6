#!/usr/bin/env bash
# Speculative decoding under `tessera serve` at several concurrencies: for each
# level C, serve with `--speculative SPEC` against plain serve, interleaved round by
# round (the order alternating) so this VM's speed drift hits both alike, each
# loaded by `tessera bench serve` with C streams. Prints per level the median output
# tokens/s of both, their ratio and the server's acceptance (accepted / proposed,
# from its /metrics). The speed-up shrinks as the batch grows (a batched decode step
# is no longer nearly free); issue 34 asks >= 0.97x at 16 (the adaptive k).
#
#   bench/spec-serve-bench.sh [build/bin/tessera] MODEL.gguf SPEC [ROUNDS]
#   SPEC: ngram, or draft:PATH
# Environment: LEVELS ("1 4 16"), PROMPTS_PER_SLOT (2, at least 4 prompts a level),
# INPUT (16 prompt words), OUTPUT (64 tokens), SPEC_TOKENS (4), THREADS (2), PORT (8240);
# LLAMA_SERVER (path to llama.cpp's llama-server: with a draft SPEC, also llama-server
# plain and with --spec-draft-model, the same threads and draft length, in the same
# rounds).
# A benchmark, not a test: it prints and exits 0 (2 when it cannot run).
set -u
TESSERA=${1:-build/bin/tessera}
MODEL=${2:?usage: spec-serve-bench.sh [TESSERA] MODEL.gguf SPEC [ROUNDS]}
SPEC=${3:?usage: spec-serve-bench.sh [TESSERA] MODEL.gguf SPEC [ROUNDS]}
ROUNDS=${4:-2}
LEVELS=${LEVELS:-1 4 16}
PROMPTS_PER_SLOT=${PROMPTS_PER_SLOT:-2}
INPUT=${INPUT:-16}
OUTPUT=${OUTPUT:-64}
SPEC_TOKENS=${SPEC_TOKENS:-4}
THREADS=${THREADS:-2}
LLAMA_SERVER=${LLAMA_SERVER:-}
[ -z "$LLAMA_SERVER" ] || [[ "$SPEC" == draft:* ]] || { echo "LLAMA_SERVER needs a draft SPEC" >&2; exit 2; }
PORT=${PORT:-8240}
[ -x "$TESSERA" ] || { echo "no tessera binary at $TESSERA" >&2; exit 2; }
[ -f "$MODEL" ] || { echo "no model at $MODEL" >&2; exit 2; }
command -v curl > /dev/null || { echo "needs curl" >&2; exit 2; }
OUT=$(mktemp -d /tmp/tessera-specserve.XXXXXX)
# shellcheck source=serve-lib.sh
source "$(dirname "$0")/serve-lib.sh"
trap 'stop_server; rm -rf "$OUT"' EXIT

# The running server's acceptance (accepted / proposed guesses) from its /metrics.
acceptance() {
  curl -sf "http://127.0.0.1:$PORT/metrics" |
    awk '$1 == "tessera_spec_decode_accepted_tokens_total" {a = $2}
         $1 == "tessera_spec_decode_proposed_tokens_total" {p = $2}
         END {if (p > 0) printf "%.2f", a / p; else print "-"}'
}
# serve_tok_s with --speculative, which also reads the acceptance before the
# server stops: prints "TOK_S ACCEPTANCE".
spec_run() {
  PORT=$(next_port)
  "$TESSERA" serve "$MODEL" --port "$PORT" --max-num-seqs "$CONCURRENCY" -t "$THREADS" \
    --speculative "$SPEC" --spec-tokens "$SPEC_TOKENS" > "$OUT/serve.log" 2>&1 &
  SERVER_PID=$!
  local tok_s=0 acc=-
  if wait_ready "$PORT"; then
    tok_s=$(load_tok_s)
    acc=$(acceptance)
  fi
  stop_server
  echo "$tok_s $acc"
}

# llama-server's output tokens/s under the same load: FLAGS... after the model.
llama_tok_s() {
  PORT=$(next_port)
  "$LLAMA_SERVER" -m "$MODEL" --port "$PORT" -t "$THREADS" -np "$CONCURRENCY" \
    -c $((CONCURRENCY * 512)) "$@" > "$OUT/llama.log" 2>&1 &
  SERVER_PID=$!
  local tok_s=0
  wait_ready "$PORT" && tok_s=$(load_tok_s)
  stop_server
  echo "$tok_s"
}

declare -A PLAIN SPECULATIVE ACCEPT LLAMA LLAMA_SPEC
echo "model $MODEL; --speculative $SPEC --spec-tokens $SPEC_TOKENS; $THREADS threads; levels $LEVELS; $ROUNDS rounds"
for round in $(seq "$ROUNDS"); do
  for CONCURRENCY in $LEVELS; do
    NUM_PROMPTS=$((CONCURRENCY * PROMPTS_PER_SLOT < 4 ? 4 : CONCURRENCY * PROMPTS_PER_SLOT))
    if ((round % 2)); then
      plain=$(serve_tok_s "$TESSERA" -t "$THREADS")
      read -r spec acc <<< "$(spec_run)"
    else
      read -r spec acc <<< "$(spec_run)"
      plain=$(serve_tok_s "$TESSERA" -t "$THREADS")
    fi
    PLAIN[$CONCURRENCY]+=" $plain"
    SPECULATIVE[$CONCURRENCY]+=" $spec"
    ACCEPT[$CONCURRENCY]+=" $acc"
    echo "round $round, concurrency $CONCURRENCY: plain $plain, speculative $spec out tok/s (acceptance $acc)"
    if [ -n "$LLAMA_SERVER" ]; then
      lplain=$(llama_tok_s)
      lspec=$(llama_tok_s --spec-type draft-simple --spec-draft-model "${SPEC#draft:}" \
        --spec-draft-n-max "$SPEC_TOKENS" \
        --spec-draft-n-min 0 -td "$THREADS")
      LLAMA[$CONCURRENCY]+=" $lplain"
      LLAMA_SPEC[$CONCURRENCY]+=" $lspec"
      echo "round $round, concurrency $CONCURRENCY: llama-server plain $lplain, with the draft $lspec out tok/s"
    fi
  done
done
echo
printf "%11s %14s %14s %7s %11s\n" concurrency "plain tok/s" "spec tok/s" ratio acceptance
for c in $LEVELS; do
  p=$(median "${PLAIN[$c]}")
  s=$(median "${SPECULATIVE[$c]}")
  printf "%11s %14s %14s %7s %11s\n" "$c" "$p" "$s" "$(ratio "$s" "$p")" "$(echo ${ACCEPT[$c]})"
done
if [ -n "$LLAMA_SERVER" ]; then
  echo
  printf "%11s %14s %14s %7s %18s\n" concurrency "llama plain" "llama draft" ratio "tessera/llama spec"
  for c in $LEVELS; do
    p=$(median "${LLAMA[$c]}")
    s=$(median "${LLAMA_SPEC[$c]}")
    printf "%11s %14s %14s %7s %18s\n" "$c" "$p" "$s" "$(ratio "$s" "$p")" \
      "$(ratio "$(median "${SPECULATIVE[$c]}")" "$s")"
  done
fi
