#!/usr/bin/env bash
# Tensor/pipeline-parallel decode against its single-process peers, interleaved
# round by round so the machine's speed drift hits every configuration alike;
# prints the median decode tokens/s of each and the ratios the roadmap asks for.
#
#   bench/parallel-bench.sh [build/bin/tessera] [MODEL.gguf] [ROUNDS]
#
# Sections (each skipped, with the reason, when it cannot run here):
#   1. tp=2 as 2 processes x 1 thread vs 1 process x 2 threads, and llama.cpp's
#      llama-bench tg with 2 threads on the same file (LLAMA_BENCH=path/to/llama-bench);
#   2. pp=2 vs one stage with one thread, throughput with 8 and with 16 sequences,
#      next to the bound the micro-batches set: each stage runs B/2-token
#      micro-batches, so pp=2 with B sequences cannot beat 2x one stage's
#      throughput at B/2 sequences;
#   3. two network-namespace hosts joined by a veth shaped with tc tbf (10 Gbit/s,
#      then 1 Gbit/s) and an emulated 0.1 ms one-way delay (TESSERA_TCP_DELAY_US),
#      one rank of one thread each: tp=2 vs tp=1 with one thread (needs root);
#   4. bytes communicated per decode token for tp=2 and pp=2 (from --ledger).
# Environment: TG (tokens generated per run, 64), BATCHES (pp sequence counts, "8 16").
# Section 3's latency model: a token's TP exchanges run one after another, each at
# least one emulated delay, so a rank that computes exactly half of the one-rank time
# per token T and idles through every delay reaches T / (T/2 + exchanges x delay). (A
# rank warms its next matrix while it waits, so it may do a little better.)
set -u
TESSERA=${1:-build/bin/tessera}
MODEL=${2:-/tmp/tinyllama-q8_0.gguf}
ROUNDS=${3:-3}
TG=${TG:-64}
BATCHES=${BATCHES:-8 16}
LLAMA_BENCH=${LLAMA_BENCH:-}
[ -x "$TESSERA" ] || { echo "no tessera binary at $TESSERA" >&2; exit 2; }
[ -f "$MODEL" ] || { echo "no model at $MODEL (see README: tessera synth)" >&2; exit 2; }
OUT=$(mktemp -d /tmp/tessera-pbench.XXXXXX)
trap 'rm -rf "$OUT"' EXIT

# Decode tokens/s of one `tessera generate` run (the stats line's figure; for a batch
# its steady state, "all decoding": a pipeline's later micro-batches still prefill
# while the first decode, which the overall figure would count as decode time).
tok_s() {
  "$TESSERA" generate "$MODEL" -p "Once upon a time" -n "$TG" --temp 0 --ignore-eos "$@" \
    2> "$OUT/err" > /dev/null || { echo "FAILED: $*: $(tail -3 "$OUT/err")" >&2; echo 0; return; }
  local steady
  steady=$(grep -oE 'all decoding: [0-9.]+ tok/s' "$OUT/err" | grep -oE '[0-9.]+')
  if [ -n "$steady" ] && awk -v v="$steady" 'BEGIN {exit !(v > 0)}'; then
    echo "$steady"
    return
  fi
  grep -oE 'generated [0-9]+ tokens, [0-9.]+ tok/s' "$OUT/err" | grep -oE '[0-9.]+ tok/s' | cut -d' ' -f1
}
median() { sort -g | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR+1)/2] : (a[NR/2] + a[NR/2+1]) / 2}'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN {printf "%.2f", (b > 0) ? a / b : 0}'; }

echo "model: $MODEL ($(stat -c %s "$MODEL") bytes), $TG tokens per run, $ROUNDS interleaved rounds"
echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')"

# --- 1. tp=2 vs one process with 2 threads (and llama.cpp) ---
: > "$OUT/t2"; : > "$OUT/tp2"; : > "$OUT/llama"
for _ in $(seq "$ROUNDS"); do
  tok_s -t 2 >> "$OUT/t2"
  tok_s --tp 2 >> "$OUT/tp2"
  if [ -n "$LLAMA_BENCH" ] && [ -x "$LLAMA_BENCH" ]; then
    "$LLAMA_BENCH" -m "$MODEL" -p 0 -n "$TG" -t 2 -r 1 -o csv 2> /dev/null |
      tail -1 | awk -F, '{gsub(/"/, "", $0); for (i = 1; i <= NF; i++) v[i] = $i; print v[NF-1]}' >> "$OUT/llama"
  fi
done
T2=$(median < "$OUT/t2"); TP2=$(median < "$OUT/tp2")
echo
echo "1. decode, tokens/s (median of $ROUNDS)"
printf "   %-44s %8s\n" "1 process x 2 threads" "$T2"
printf "   %-44s %8s   %sx the 2-thread process (target >= 0.9)\n" "tp=2: 2 processes x 1 thread (shm)" "$TP2" "$(ratio "$TP2" "$T2")"
if [ -s "$OUT/llama" ]; then
  L=$(median < "$OUT/llama")
  printf "   %-44s %8s   tp=2 is %sx llama.cpp (target >= 1)\n" "llama.cpp llama-bench tg$TG, 2 threads" "$L" "$(ratio "$TP2" "$L")"
else
  echo "   llama.cpp: skipped (set LLAMA_BENCH=path/to/llama-bench)"
fi

# --- 2. pp=2 throughput with a batch ---
echo
echo "2. decode throughput, tokens/s (median of $ROUNDS)"
for B in $BATCHES; do
  H=$((B / 2))
  if [ "$H" -lt 1 ]; then echo "   $B sequences: skipped (a pipeline of 2 stages needs at least 2)"; continue; fi
  : > "$OUT/s1"; : > "$OUT/half"; : > "$OUT/pp2"; : > "$OUT/pair"
  for _ in $(seq "$ROUNDS"); do
    tok_s -t 1 --batch "$B" >> "$OUT/s1"
    tok_s -t 1 --batch "$H" >> "$OUT/half"
    tok_s --pp 2 -t 1 --batch "$B" >> "$OUT/pp2"
    # The machine's own limit: two independent one-thread runs at once (no
    # communication at all) against one alone.
    tok_s -t 1 --batch "$B" > "$OUT/pa" &
    tok_s -t 1 --batch "$B" > "$OUT/pb"
    wait
    awk '{s += $1} END {print s}' "$OUT/pa" "$OUT/pb" >> "$OUT/pair"
  done
  S1=$(median < "$OUT/s1"); HALF=$(median < "$OUT/half"); PP2=$(median < "$OUT/pp2"); PAIR=$(median < "$OUT/pair")
  BOUND=$(awk -v h="$HALF" 'BEGIN {printf "%.1f", 2 * h}')
  echo "   $B sequences:"
  printf "   %-44s %8s\n" "one stage, 1 thread" "$S1"
  printf "   %-44s %8s   %sx one: the machine's 2-core limit\n" "two independent 1-thread runs at once (sum)" "$PAIR" "$(ratio "$PAIR" "$S1")"
  printf "   %-44s %8s   %sx one: 2 x one stage with $H sequences, what $H-token micro-batches allow\n" "micro-batch bound" "$BOUND" "$(ratio "$BOUND" "$S1")"
  printf "   %-44s %8s   %sx one stage (target >= 1.7), %s of the micro-batch bound\n" "pp=2: 2 stages x 1 thread (shm)" "$PP2" "$(ratio "$PP2" "$S1")" "$(ratio "$PP2" "$BOUND")"
done

# --- 3. two namespace hosts over a shaped veth ---
echo
DELAY_US=100  # emulated one-way delay of every TCP message (TESSERA_TCP_DELAY_US)
echo "3. tp=2 across two network-namespace hosts (tbf rate, $DELAY_US us emulated one-way delay)"
# shellcheck source=../scripts/netns-pair.sh
source "$(dirname "$0")/../scripts/netns-pair.sh"
if netns_bench_up pb; then
  trap 'netns_pair_down; rm -rf "$OUT"' EXIT
  ID=$$
  PORT=$((30000 + ID % 20000))
  NETNS_DELAY_US=$DELAY_US
  across() {  # rate
    PORT=$((PORT + 1))
    netns_pair_run "$OUT/ns" "$PORT" "$TESSERA" generate "$MODEL" -p "Once upon a time" \
      -n "$TG" --temp 0 --ignore-eos --tp 2 -t 1 --token pbench
    grep -oE 'generated [0-9]+ tokens, [0-9.]+ tok/s' "$OUT/ns0" | grep -oE '[0-9.]+ tok/s' | cut -d' ' -f1
  }
  # The machine's limit at batch 1: two independent one-thread decodes at once share
  # the memory bus, so tp=2 (each rank streaming half the weights) can at best reach
  # their sum over one run alone.
  : > "$OUT/one1"; : > "$OUT/pair1"
  for _ in $(seq "$ROUNDS"); do
    tok_s -t 1 >> "$OUT/one1"
    tok_s -t 1 > "$OUT/pa" &
    tok_s -t 1 > "$OUT/pb"
    wait
    awk '{s += $1} END {print s}' "$OUT/pa" "$OUT/pb" >> "$OUT/pair1"
  done
  LIMIT=$(ratio "$(median < "$OUT/pair1")" "$(median < "$OUT/one1")")
  printf "   machine limit: two independent 1-thread runs at once = %sx one alone\n" "$LIMIT"
  # The exchanges of one decode token (all-reduces and gathers, one after another).
  EXCHANGES=$("$TESSERA" generate "$MODEL" -p "Once upon a time" -n 3 --temp 0 --ignore-eos --tp 2 --ledger 2> /dev/null |
    awk '/^step [0-9]+ decode/ {d++; first = d == 1; next} /^step/ {first = 0} first && / calls / {n += $2} END {print n + 0}')
  printf "   latency model: %s exchanges a token x %s us one way: tp=2 ~ T / (T/2 + %s ms), T = tp=1's time a token\n" \
    "$EXCHANGES" "$DELAY_US" "$(awk -v x="$EXCHANGES" -v d="$DELAY_US" 'BEGIN {printf "%.1f", x * d / 1000}')"
  for rate in 10gbit 1gbit; do
    burst=$([ $rate = 10gbit ] && echo 4mb || echo 512kb)
    netns_pair_shape "$rate" "$burst"
    : > "$OUT/one"; : > "$OUT/two"
    for _ in $(seq "$ROUNDS"); do
      tok_s -t 1 >> "$OUT/one"
      across >> "$OUT/two"
    done
    ONE=$(median < "$OUT/one"); TWO=$(median < "$OUT/two")
    # No exchange count (the ledger run failed): no model, rather than a wrong one.
    BOUND=$(awk -v one="$ONE" -v x="$EXCHANGES" -v d="$DELAY_US" \
      'BEGIN {if (one > 0 && x > 0) printf "%.2fx", 1 / (0.5 + x * d * 1e-6 * one); else printf "unknown"}')
    printf "   %-8s tp=1 x 1 thread %7s tok/s | tp=2 across hosts %7s tok/s = %sx%s, %s of the limit; latency model %s\n" \
      "$rate" "$ONE" "$TWO" "$(ratio "$TWO" "$ONE")" "$([ $rate = 10gbit ] && echo ' (target >= 1.6)')" \
      "$(awk -v r="$(ratio "$TWO" "$ONE")" -v l="$LIMIT" 'BEGIN {printf "%.2f", (l > 0 ? r / l : 0)}')" "$BOUND"
  done
  netns_pair_down
fi

# --- 4. bytes per decode token ---
echo
echo "4. bytes per rank for one decode token (the busiest rank, from --ledger)"
for layout in "--tp 2" "--pp 2"; do
  # shellcheck disable=SC2086
  "$TESSERA" generate "$MODEL" -p "Once upon a time" -n 4 --temp 0 --ignore-eos $layout --ledger \
    2> /dev/null > "$OUT/ledger"
  awk '/^step [0-9]+ decode/ {d++; first = d == 1; next} /^step/ {first = 0} first && /calls/ {print}' \
    "$OUT/ledger" | sed "s/^/   $layout: /"
done
