#!/usr/bin/env bash
# Speculative decoding (n-gram or draft-model guesses) against plain decoding, `tessera generate`
# one rank, interleaved round by round (the order alternating) so this VM's speed
# drift hits both alike, on two workloads:
#   copy     greedy on a "repeat this text" prompt: the text the model
#            reproduces (and its own loops) is what n-gram guesses find
#   nomatch  sampled (temperature 1, a fixed seed, no top-k/top-p/min-p), where
#            little repeats: guesses are rare or wrong, the adaptive k backs off
# Prints per round and as medians the decode tok/s (generate's stats line: tokens
# after the first / decode time) of both and their ratio, with the acceptance
# (accepted / proposed guesses, kept guesses per verification).
# Targets (issue 34): copy >= 1.8x at acceptance >= 0.7; nomatch >= 0.97x.
#
#   bench/spec-bench.sh [build/bin/tessera] MODEL.gguf [ROUNDS]
# Environment: N (300 tokens), THREADS (1), SPEC (ngram, or draft:PATH), SPEC_TOKENS (4), WORKLOADS
# ("copy nomatch"), COPY_TEXT (the passage repeated), LOCK (a file to hold with
# flock -x around each timed run; empty: none).
# A benchmark, not a test: it prints and exits 0 (2 when it cannot run).
set -u
TESSERA=${1:-build/bin/tessera}
MODEL=${2:?usage: spec-bench.sh [TESSERA] MODEL.gguf [ROUNDS]}
ROUNDS=${3:-5}
N=${N:-300}
THREADS=${THREADS:-1}
SPEC=${SPEC:-ngram}
SPEC_TOKENS=${SPEC_TOKENS:-4}
WORKLOADS=${WORKLOADS:-copy nomatch}
COPY_TEXT=${COPY_TEXT:-Once upon a time, there was a little girl named Lily. She loved to play outside in the park.}
LOCK=${LOCK:-}
[ -x "$TESSERA" ] || { echo "no tessera binary at $TESSERA" >&2; exit 2; }
[ -f "$MODEL" ] || { echo "no model at $MODEL" >&2; exit 2; }

copy_prompt="Repeat this text: $COPY_TEXT Repeat this text: $COPY_TEXT Repeat this text:"
nomatch_prompt="Once upon a time"

locked() {
  if [ -n "$LOCK" ]; then flock -x "$LOCK" "$@"; else "$@"; fi
}

# run WORKLOAD MODE -> "TOK_S ACCEPTED PROPOSED VERIFIED_PER" on stdout
run() {
  local workload=$1 mode=$2 args=() log
  if [ "$workload" = copy ]; then
    args=(-p "$copy_prompt" --temp 0)
  else
    args=(-p "$nomatch_prompt" --temp 1 --top-k 0 --top-p 1 --min-p 0 --seed 7)
  fi
  [ "$mode" = spec ] && args+=(--speculative "$SPEC" --spec-tokens "$SPEC_TOKENS")
  log=$(locked "$TESSERA" generate "$MODEL" "${args[@]}" -n "$N" --ignore-eos \
    --no-display-prompt -t "$THREADS" 2>&1 > /dev/null) || { echo "generate failed: $log" >&2; return 1; }
  local tok_s acc prop per
  tok_s=$(sed -n 's/.*generated [0-9]* tokens, \([0-9.]*\) tok\/s.*/\1/p' <<< "$log")
  acc=$(sed -n 's/.*speculative [a-z]*: \([0-9]*\)\/\([0-9]*\) guesses accepted ([0-9.]*), \([0-9.]*\) per.*/\1 \2 \3/p' <<< "$log")
  echo "$tok_s ${acc:-0 0 0}"
}

median() { sort -g | awk '{ v[NR] = $1 } END { if (NR % 2) print v[(NR + 1) / 2]; else printf "%.2f\n", (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }

echo "# $(basename "$MODEL"), $N tokens, $THREADS thread(s), --speculative $SPEC --spec-tokens $SPEC_TOKENS, $ROUNDS rounds, $(date -u '+%Y-%m-%d %H:%M UTC')"
for workload in $WORKLOADS; do
  plain_all=() spec_all=() ratio_all=()
  acc_line=""
  for round in $(seq 1 "$ROUNDS"); do
    if [ $((round % 2)) = 1 ]; then order="plain spec"; else order="spec plain"; fi
    for mode in $order; do
      read -r tok_s acc prop per <<< "$(run "$workload" "$mode")" || exit 1
      if [ "$mode" = plain ]; then plain=$tok_s; else spec=$tok_s acc_line="$acc/$prop accepted, $per per verification"; fi
    done
    ratio=$(awk -v a="$spec" -v b="$plain" 'BEGIN { printf "%.3f", a / b }')
    printf '%-8s round %d: plain %8.1f tok/s  speculative %8.1f tok/s  ratio %s  (%s)\n' \
      "$workload" "$round" "$plain" "$spec" "$ratio" "$acc_line"
    plain_all+=("$plain") spec_all+=("$spec") ratio_all+=("$ratio")
  done
  rate=$(awk -v l="$acc_line" 'BEGIN { split(l, a, "[/ ]"); if (a[2] > 0) printf "%.2f", a[1] / a[2]; else print "-" }')
  printf '%-8s median: plain %s tok/s, speculative %s tok/s, ratio %s (median of the rounds'"'"' ratios), acceptance %s (%s)\n' \
    "$workload" "$(printf '%s\n' "${plain_all[@]}" | median)" "$(printf '%s\n' "${spec_all[@]}" | median)" \
    "$(printf '%s\n' "${ratio_all[@]}" | median)" "$rate" "$acc_line"
done
