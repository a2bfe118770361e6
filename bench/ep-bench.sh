#!/usr/bin/env bash
# Expert parallelism against its single-process peers on a synthetic MoE model,
# interleaved round by round so the machine's speed drift hits every
# configuration alike: decode tokens/s of ep=2 (2 processes x 1 thread) and of
# data-parallel attention (--ep 2 --dp-attention: each rank its own sequences'
# attention) vs one process with 2 threads vs tp=2, at batch 1 and 16, the per-rank
# peak RSS of each against one rank's, and the ep bytes of one decode step next to
# the planner (--ledger).
#
#   bench/ep-bench.sh [build/bin/tessera] [MODEL.gguf] [ROUNDS]
#
# Without MODEL, writes a Mixtral-like synthetic model (SYNTH_ARGS, default dim
# 1024, 16 layers, 8 experts top-2, FFN 1792, Q8_0) to /tmp.
# Environment: TG (tokens generated per run, 32), BATCHES ("1 16").
set -u
TESSERA=${1:-build/bin/tessera}
MODEL=${2:-}
ROUNDS=${3:-3}
TG=${TG:-32}
BATCHES=${BATCHES:-1 16}
SYNTH_ARGS=${SYNTH_ARGS:---arch moe --dim 1024 --layers 16 --heads 16 --kv-heads 4 --ffn 1792 --experts 8 --experts-used 2 --type q8_0 --seed 1}
[ -x "$TESSERA" ] || { echo "no tessera binary at $TESSERA" >&2; exit 2; }
if [ -z "$MODEL" ]; then
  MODEL=/tmp/tessera-ep-bench-moe.gguf
  if [ ! -f "$MODEL" ]; then
    # shellcheck disable=SC2086
    "$TESSERA" synth $SYNTH_ARGS -o "$MODEL" > /dev/null || { echo "synth failed" >&2; exit 2; }
  fi
fi
[ -f "$MODEL" ] || { echo "no model at $MODEL" >&2; exit 2; }
OUT=$(mktemp -d /tmp/tessera-epbench.XXXXXX)
trap 'rm -rf "$OUT"' EXIT

# Decode tokens/s of one `tessera generate` run (for a batch, its steady state).
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

echo
echo "1. decode, tokens/s (median of $ROUNDS)"
for B in $BATCHES; do
  : > "$OUT/t2"; : > "$OUT/ep2"; : > "$OUT/tp2"; : > "$OUT/dpa"
  for _ in $(seq "$ROUNDS"); do
    tok_s -t 2 --batch "$B" >> "$OUT/t2"
    tok_s --ep 2 -t 1 --batch "$B" >> "$OUT/ep2"
    tok_s --tp 2 -t 1 --batch "$B" >> "$OUT/tp2"
    tok_s --ep 2 --dp-attention -t 1 --batch "$B" >> "$OUT/dpa"
  done
  T2=$(median < "$OUT/t2"); EP2=$(median < "$OUT/ep2"); TP2=$(median < "$OUT/tp2")
  DPA=$(median < "$OUT/dpa")
  echo "   batch $B:"
  printf "   %-40s %8s\n" "1 process x 2 threads" "$T2"
  printf "   %-40s %8s   %sx the 2-thread process\n" "tp=2: 2 processes x 1 thread" "$TP2" "$(ratio "$TP2" "$T2")"
  printf "   %-40s %8s   %sx the 2-thread process, %sx tp=2\n" "ep=2 (tp2 ep2): 2 processes x 1 thread" "$EP2" "$(ratio "$EP2" "$T2")" "$(ratio "$EP2" "$TP2")"
  printf "   %-40s %8s   %sx the 2-thread process, %sx tp2 ep2\n" "dp attention (dp2 ep2): 2 x 1 thread" "$DPA" "$(ratio "$DPA" "$T2")" "$(ratio "$DPA" "$EP2")"
done

echo
echo "2. peak RSS (MiB, the per-rank report's VmHWM)"
"$TESSERA" generate "$MODEL" -p "Once upon a time" -n 4 --temp 0 --ignore-eos -t 1 --report \
  2> "$OUT/r1" > /dev/null
"$TESSERA" generate "$MODEL" -p "Once upon a time" -n 4 --temp 0 --ignore-eos --ep 2 -t 1 \
  2> "$OUT/r2" > /dev/null
"$TESSERA" generate "$MODEL" -p "Once upon a time" -n 4 --temp 0 --ignore-eos --tp 2 -t 1 \
  2> "$OUT/r3" > /dev/null
"$TESSERA" generate "$MODEL" -p "Once upon a time" -n 4 --temp 0 --ignore-eos --ep 2 --dp-attention \
  -t 1 2> "$OUT/r4" > /dev/null
rss() {  # the peak RSS column of the per-rank report: the field before the first "|"
  awk '$1 ~ /^[0-9]+$/ {for (i = 2; i <= NF; i++) if ($i == "|") {print $(i - 1); break}}' "$1"
}
ONE=$(rss "$OUT/r1" | head -1)
printf "   %-24s %s\n" "one rank" "$ONE"
for f in r2:"ep=2" r3:"tp=2" r4:"dp attention"; do
  name=${f#*:}
  for v in $(rss "$OUT/${f%%:*}"); do
    printf "   %-24s %s   %sx one rank\n" "$name rank" "$v" "$(ratio "$v" "$ONE")"
  done
done

echo
echo "3. one decode step's communication, ep=2 (from --ledger: measured | planner)"
"$TESSERA" generate "$MODEL" -p "Once upon a time" -n 3 --temp 0 --ignore-eos --ep 2 -t 1 \
  --batch 16 --ledger 2> /dev/null > "$OUT/ledger"
awk '/^step [0-9]+ decode/ {d++; first = d == 1; if (first) print "   " $0; next} /^step/ {first = 0} first {print "   " $0}' \
  "$OUT/ledger"

# --- across two network-namespace hosts: ep=2 against tp=2 ---
# One rank per namespace, 1 thread each, joined by a veth shaped with tc tbf
# (10 Gbit/s) and a 100 us emulated one-way delay on every TCP message; beside each,
# the planner's bytes a rank sends in one decode step (from a local --ledger run:
# "model" is plan/'s exact prediction, which the measured bytes match there).
NETNS_BATCH=${NETNS_BATCH:-16}
echo
echo "4. across two namespace hosts (10 Gbit/s, 100 us one way): ep=2 vs tp=2, batch $NETNS_BATCH, 1 thread a rank"
# shellcheck source=../scripts/netns-pair.sh
source "$(dirname "$0")/../scripts/netns-pair.sh"
if netns_bench_up epb; then
  trap 'netns_pair_down; rm -rf "$OUT"' EXIT
  netns_pair_shape 10gbit
  NETNS_DELAY_US=100
  PORT=$((30000 + $$ % 20000))
  across() {  # layout flags...: node 0's decode tok/s
    PORT=$((PORT + 1))
    netns_pair_run "$OUT/ns" "$PORT" "$TESSERA" generate "$MODEL" -p "Once upon a time" -n "$TG" \
      --temp 0 --ignore-eos --batch "$NETNS_BATCH" -t 1 --token epbench \
      --dump-logits "$OUT/across-{node}" "$@" ||
      { echo "FAILED across hosts: $*: $(tail -3 "$OUT/ns0")" >&2; echo 0; return; }
    grep -oE 'all decoding: [0-9.]+ tok/s' "$OUT/ns0" | grep -oE '[0-9.]+'
  }
  # One decode step's predicted bytes sent by the busiest rank, summed over keys.
  predicted() {  # layout flags...
    "$TESSERA" generate "$MODEL" -p "Once upon a time" -n 3 --temp 0 --ignore-eos \
      --batch "$NETNS_BATCH" -t 1 --ledger "$@" 2> /dev/null |
      awk '/^step [0-9]+ decode/ {d++; on = d == 1; next} /^step /{on = 0} on && / calls / {
             for (i = 1; i <= NF; i++) if ($i == "model") {print $(i + 1), $(i + 2)}}' |
      awk '{v = $1; u = $2; m = (u == "KiB") ? 1024 : (u == "MiB") ? 1048576 : 1; s += v * m}
           END {printf "%.1f KiB", s / 1024}'
  }
  : > "$OUT/xtp"; : > "$OUT/xep"; : > "$OUT/xdpa"
  same=identical
  for _ in $(seq "$ROUNDS"); do
    across --tp 2 >> "$OUT/xtp"
    cp "$OUT/across-0" "$OUT/logits-tp"
    across --tp 2 --ep 2 >> "$OUT/xep"
    cmp -s "$OUT/logits-tp" "$OUT/across-0" || same=DIFFER
    across --ep 2 --dp-attention >> "$OUT/xdpa"
    cmp -s "$OUT/logits-tp" "$OUT/across-0" || same=DIFFER
  done
  XTP=$(median < "$OUT/xtp"); XEP=$(median < "$OUT/xep"); XDPA=$(median < "$OUT/xdpa")
  printf "   %-34s %8s tok/s   planner: %s a rank per decode step\n" "tp=2 (experts sliced)" "$XTP" \
    "$(predicted --tp 2)"
  printf "   %-34s %8s tok/s   planner: %s a rank per decode step   %sx tp=2\n" \
    "ep=2 (tp2 ep2, whole experts)" "$XEP" "$(predicted --tp 2 --ep 2)" "$(ratio "$XEP" "$XTP")"
  printf "   %-34s %8s tok/s   planner: %s a rank per decode step   %sx tp=2\n" \
    "dp attention (dp2 ep2)" "$XDPA" "$(predicted --ep 2 --dp-attention)" "$(ratio "$XDPA" "$XTP")"
  echo "   logits: $same"
  netns_pair_down
fi
