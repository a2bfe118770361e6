#!/usr/bin/env bash
# Prefix caching on vs off (`tessera serve` vs `tessera serve --no-prefix-cache`),
# interleaved round by round so this VM's speed drift hits both alike, on three
# workloads of `tessera bench serve` (concurrency C, greedy, EOS ignored):
#   shared     one shared system prompt of PREFIX words + QUESTION-word questions,
#              OUTPUT tokens out, C × PROMPTS_PER_SLOT requests
#   multiturn  CONVERSATIONS conversations of TURNS turns at MT_CONCURRENCY requests
#              in flight, each turn resending the conversation
#              (previous prompt + the server's answer) + a QUESTION-word question
#   control    nothing shared: random prompts of PREFIX + QUESTION words
# MODES ("on off"; add "nowait" for the cache on with --prefix-wait-tokens 0, the
# requests that arrive together then each computing a prompt no one has cached yet,
# or "batched" for the cache on with --admit-prefill-tokens 0); SERVE_FLAGS:
# more flags for every tessera server; "llama" for llama.cpp's llama-server at
# LLAMA_SERVER (built beside the project) on the same file and workload.
# Prints per round and as medians: mean TTFT, output tok/s, the hit rate the
# client saw (usage.prompt_tokens_details.cached_tokens), and for multiturn the
# mean TTFT of the last turn; then the ratios issue 31 asks for:
#   shared: mean TTFT on/off (target <= 0.2), throughput on/off (>= 1.5)
#   multiturn: TTFT of the last turn on/off (<= 0.25)
#   control: throughput on/off (>= 0.97)
#
#   bench/prefix-cache-bench.sh [build/bin/tessera] MODEL.gguf [ROUNDS]
# Environment: CONCURRENCY (4), PREFIX (1024 words), QUESTION (64), OUTPUT (64),
# TURNS (8), CONVERSATIONS (C), MT_CONCURRENCY (C), PROMPTS_PER_SLOT (4), THREADS (all cores), PORT (8240), WORKLOADS
# ("shared multiturn control"), LOCK (a file to hold with flock -x around each
# timed run; empty: none).
# A benchmark, not a test: it prints and exits 0 (2 when it cannot run).
set -u
TESSERA=${1:-build/bin/tessera}
MODEL=${2:?usage: prefix-cache-bench.sh [TESSERA] MODEL.gguf [ROUNDS]}
ROUNDS=${3:-3}
CONCURRENCY=${CONCURRENCY:-4}
PREFIX=${PREFIX:-1024}
QUESTION=${QUESTION:-64}
OUTPUT=${OUTPUT:-64}
TURNS=${TURNS:-8}
CONVERSATIONS=${CONVERSATIONS:-$CONCURRENCY}
MT_CONCURRENCY=${MT_CONCURRENCY:-$CONCURRENCY}
PROMPTS_PER_SLOT=${PROMPTS_PER_SLOT:-4}
THREADS=${THREADS:-}
PORT=${PORT:-8240}
WORKLOADS=${WORKLOADS:-shared multiturn control}
LOCK=${LOCK:-}
MODES=${MODES:-on off}
[ -x "$TESSERA" ] || { echo "no tessera binary at $TESSERA" >&2; exit 2; }
[ -f "$MODEL" ] || { echo "no model at $MODEL" >&2; exit 2; }
command -v curl > /dev/null || { echo "needs curl" >&2; exit 2; }
command -v jq > /dev/null || { echo "needs jq" >&2; exit 2; }
OUT=$(mktemp -d /tmp/tessera-pcbench.XXXXXX)
# shellcheck source=serve-lib.sh
source "$(dirname "$0")/serve-lib.sh"  # stop_server, wait_ready, median, ratio
trap 'stop_server; rm -rf "$OUT"' EXIT

workload_flags() {  # workload
  case $1 in
    shared) echo "--dataset shared-prefix --prefix-len $PREFIX --input-len $QUESTION" \
                 "--num-prompts $((CONCURRENCY * PROMPTS_PER_SLOT))" ;;
    multiturn) echo "--dataset multi-turn --num-turns $TURNS --input-len $QUESTION" \
                    "--num-prompts $((CONVERSATIONS * TURNS))" ;;
    control) echo "--dataset random --input-len $((PREFIX + QUESTION))" \
                  "--num-prompts $((CONCURRENCY * PROMPTS_PER_SLOT))" ;;
  esac
}

# One server (cache on or off), one workload: prints "ttft_ms tok_s hit_rate last_turn_ttft_ms".
run_one() {  # workload on|off
  local flags=()
  [ "$2" = off ] && flags+=(--no-prefix-cache)
  [ "$2" = nowait ] && flags+=(--prefix-wait-tokens 0)
  [ "$2" = batched ] && flags+=(--admit-prefill-tokens 0)
  # shellcheck disable=SC2206
  [ -n "${SERVE_FLAGS:-}" ] && flags+=($SERVE_FLAGS)
  [ -n "$THREADS" ] && flags+=(-t "$THREADS")
  if [ "$2" = llama ]; then
    # llama.cpp's llama-server with its default prompt caching (each slot keeps its
    # last prompt's KV; --cache-ram's host cache as the build defaults), one slot per
    # concurrent request, room for the longest conversation in every slot.
    "$LLAMA_SERVER" -m "$MODEL" --port "$PORT" ${THREADS:+-t "$THREADS"} --parallel "$CONCURRENCY" \
      -c $(((PREFIX + (QUESTION + OUTPUT) * TURNS + 64) * CONCURRENCY)) > "$OUT/serve.log" 2>&1 &
  else
    "$TESSERA" serve "$MODEL" --port "$PORT" --max-num-seqs "$CONCURRENCY" "${flags[@]}" \
      > "$OUT/serve.log" 2>&1 &
  fi
  SERVER_PID=$!
  local line="0 0 0 0"
  if wait_ready "$PORT"; then
    # shellcheck disable=SC2046
    ${LOCK:+flock -x "$LOCK"} "$TESSERA" bench serve --base-url "http://127.0.0.1:$PORT" \
      $(workload_flags "$1") --output-len "$OUTPUT" \
      --max-concurrency "$([ "$1" = multiturn ] && echo "$MT_CONCURRENCY" || echo "$CONCURRENCY")" \
      --ignore-eos --seed 1 --json "$OUT/run.json" > "$OUT/bench.txt" 2>&1
    line=$(jq -r '[.ttft_ms.mean, .output_throughput, (.prefix_cache_hit_rate // 0),
                   ((.ttft_ms_by_turn // []) | if length > 0 then .[-1].mean else 0 end)]
                  | map(tostring) | join(" ")' "$OUT/run.json" 2> /dev/null || echo "0 0 0 0")
  fi
  stop_server
  echo "$line"
}

declare -A RESULTS
record() { RESULTS[$1]="${RESULTS[$1]:-} $2"; }

echo "model $MODEL; concurrency $CONCURRENCY, prefix $PREFIX + question $QUESTION words," \
  "$OUTPUT out, $PROMPTS_PER_SLOT prompts per slot; $CONVERSATIONS conversations of $TURNS turns" \
  "at concurrency $MT_CONCURRENCY; $ROUNDS rounds"
for round in $(seq "$ROUNDS"); do
  for w in $WORKLOADS; do
    # Alternate which goes first, so neither always runs on a warmer machine.
    order=$MODES
    [ $((round % 2)) -eq 0 ] && order=$(tr ' ' '\n' <<< "$MODES" | grep -v '^$' | tac | tr '\n' ' ')
    for mode in $order; do
      PORT=$((PORT + 1))  # a fresh port each time (here: run_one runs in a subshell)
      read -r ttft toks hit last <<< "$(run_one "$w" "$mode")"
      record "${w}_${mode}_ttft" "$ttft"
      record "${w}_${mode}_toks" "$toks"
      record "${w}_${mode}_hit" "$hit"
      record "${w}_${mode}_last" "$last"
      printf "round %d %-9s cache %-3s: mean TTFT %8.1f ms, %7.1f out tok/s, hit rate %.3f, last-turn TTFT %8.1f ms\n" \
        "$round" "$w" "$mode" "$ttft" "$toks" "$hit" "$last"
    done
  done
done
echo
for w in $WORKLOADS; do
  for mode in $MODES; do
    printf "%-9s cache %-3s: median mean TTFT %8.1f ms (%s), out tok/s %7.1f (%s), hit rate %s, last-turn TTFT %s\n" \
      "$w" "$mode" "$(median "${RESULTS[${w}_${mode}_ttft]}")" "${RESULTS[${w}_${mode}_ttft]# }" \
      "$(median "${RESULTS[${w}_${mode}_toks]}")" "${RESULTS[${w}_${mode}_toks]# }" \
      "$(median "${RESULTS[${w}_${mode}_hit]}")" "$(median "${RESULTS[${w}_${mode}_last]}")"
  done
done
echo
m() { median "${RESULTS[$1]:-}"; }
if [[ " $MODES " == *" batched "* ]]; then
  for w in $WORKLOADS; do
    echo "$w: prompts admitted one step after another (--admit-prefill-tokens 64) vs together" \
      "(0): mean TTFT on/batched $(ratio "$(m "${w}_on_ttft")" "$(m "${w}_batched_ttft")")," \
      "last-turn TTFT on/batched $(ratio "$(m "${w}_on_last")" "$(m "${w}_batched_last")")," \
      "throughput on/batched $(ratio "$(m "${w}_on_toks")" "$(m "${w}_batched_toks")")"
  done
fi
for w in $WORKLOADS; do
  case $w in
    shared)
      echo "shared: mean TTFT on/off $(ratio "$(m shared_on_ttft)" "$(m shared_off_ttft)") (target <= 0.2)," \
        "throughput on/off $(ratio "$(m shared_on_toks)" "$(m shared_off_toks)") (target >= 1.5)"
      if [[ " $MODES " == *" nowait "* ]]; then
        echo "shared: waiting for blocks being computed vs not: mean TTFT on/nowait" \
          "$(ratio "$(m shared_on_ttft)" "$(m shared_nowait_ttft)"), throughput on/nowait" \
          "$(ratio "$(m shared_on_toks)" "$(m shared_nowait_toks)")"
      fi ;;
    multiturn)
      echo "multiturn: turn-$TURNS TTFT on/off $(ratio "$(m multiturn_on_last)" "$(m multiturn_off_last)") (target <= 0.25)," \
        "throughput on/off $(ratio "$(m multiturn_on_toks)" "$(m multiturn_off_toks)")" ;;
    control)
      echo "control: throughput on/off $(ratio "$(m control_on_toks)" "$(m control_off_toks)") (target >= 0.97)" ;;
  esac
done
