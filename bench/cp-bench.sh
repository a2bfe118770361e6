#!/usr/bin/env bash
# Context parallelism (--cp 2: two rank processes of one thread each, every
# sequence's KV spans spread over them, the whole prompt's rows split by span)
# against one process of two threads, in interleaved rounds: prefill tokens/s of
# long prompts (the whole prompt in one step), rank 0's KV pool and peak RSS, and
# the logits of both compared byte for byte (--dump-logits). Each rank's KV pool is
# sized for its share of the prompt plus 512 tokens of slack (N + 512 alone, N/cp +
# 512 a cp rank).
#
#   bench/cp-bench.sh [build/bin/tessera] [MODEL.gguf] [ROUNDS]
#
# Environment: PROMPT_TOKENS (prompt lengths, "4096 8192 16384"), CP (2).
set -u
TESSERA=${1:-build/bin/tessera}
MODEL=${2:-build/synth-110m-32k.gguf}
ROUNDS=${3:-3}
PROMPT_TOKENS=${PROMPT_TOKENS:-4096 8192 16384}
CP=${CP:-2}
. "$(dirname "$0")/prefill-lib.sh"

echo "model: $MODEL, cp=$CP x 1 thread vs 1 process x $CP threads, $ROUNDS interleaved rounds"
echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')"
printf '%8s | %12s %12s %6s | %10s %10s | %9s %9s | %s\n' prompt "1x$CP tok/s" "cp$CP tok/s" \
  ratio "KV MiB 1x" "cp" "RSS MiB 1x" "cp" "logits"
for n in $PROMPT_TOKENS; do
  : > "$OUT/one"; : > "$OUT/cp"
  same=identical
  for _ in $(seq "$ROUNDS"); do
    KV_TOKENS=$((n + 512)) run "$n" one --threads "$CP" >> "$OUT/one"
    KV_TOKENS=$((n / CP + 512)) run "$n" cp --cp "$CP" --threads 1 >> "$OUT/cp"
    cmp -s "$OUT/logits-one" "$OUT/logits-cp" || same=DIFFER
    rm -f "$OUT/logits-one" "$OUT/logits-cp"
  done
  one=$(cut -d' ' -f1 "$OUT/one" | median); cp=$(cut -d' ' -f1 "$OUT/cp" | median)
  printf '%8s | %12.1f %12.1f %6s | %10s %10s | %9s %9s | %s\n' \
    "$(head -1 "$OUT/one" | cut -d' ' -f4)" "$one" "$cp" "$(ratio "$cp" "$one")" \
    "$(head -1 "$OUT/one" | cut -d' ' -f5)" "$(head -1 "$OUT/cp" | cut -d' ' -f5)" \
    "$(cut -d' ' -f3 "$OUT/one" | median)" "$(cut -d' ' -f3 "$OUT/cp" | median)" "$same"
done

# --- across two network-namespace hosts: cp=2 against tp=2 ---
# One rank per namespace, 1 thread each, joined by a veth shaped with tc tbf
# (10 Gbit/s) and a 100 us emulated one-way delay on every TCP message; the planner's
# bytes for the prefill step (from one host's --ledger, "model" = plan/'s exact
# prediction, which the measured bytes match) beside each.
NETNS_PROMPTS=${NETNS_PROMPTS:-4096 8192}
DELAY_US=100
echo
echo "across two namespace hosts (10 Gbit/s, $DELAY_US us one way): cp=2 vs tp=2, 1 thread a rank"
# shellcheck source=../scripts/netns-pair.sh
source "$(dirname "$0")/../scripts/netns-pair.sh"
if netns_bench_up cpb; then
  trap 'netns_pair_down; rm -rf "$OUT"' EXIT
  netns_pair_shape 10gbit
  NETNS_DELAY_US=$DELAY_US
  PORT=$((30000 + $$ % 20000))
  across() {  # n, layout flags...: prints node 0's prefill tok/s
    local n=$1; shift
    PORT=$((PORT + 1))
    netns_pair_run "$OUT/ns" "$PORT" "$TESSERA" generate "$MODEL" -p "$(prompt_of "$n")" -n 1 \
      --temp 0 --ignore-eos --prefill-chunk $((n * 2)) -c $((n + 512)) -t 1 --token cpbench \
      --dump-logits "$OUT/across-{node}" "$@"
    grep -oE 'prefill [0-9.]+ tok/s' "$OUT/ns0" | grep -oE '[0-9.]+' | head -1
  }
  # The prefill step's predicted bytes sent by the busiest rank, summed over keys.
  predicted() {  # n, layout flags...
    local n=$1; shift
    "$TESSERA" generate "$MODEL" -p "$(prompt_of "$n")" -n 1 --temp 0 --prefill-chunk $((n * 2)) \
      -c $((n + 512)) --ledger "$@" 2> /dev/null |
      awk '/^step 0 /{on = 1; next} /^step /{on = 0} on && / calls / {
             for (i = 1; i <= NF; i++) if ($i == "model") {print $(i + 1), $(i + 2)}}' |
      awk '{v = $1; u = $2; m = (u == "KiB") ? 1024 : (u == "MiB") ? 1048576 : (u == "GiB") ? 1073741824 : 1;
            s += v * m} END {printf "%.1f MiB", s / 1048576}'
  }
  printf '%8s | %12s %12s %6s | %14s %14s | %s\n' prompt "tp2 tok/s" "cp2 tok/s" ratio \
    "tp2 bytes/rank" "cp2 bytes/rank" "logits"
  for n in $NETNS_PROMPTS; do
    : > "$OUT/tp"; : > "$OUT/cpx"
    same=identical
    for _ in $(seq "$ROUNDS"); do
      across "$n" --tp 2 >> "$OUT/tp"
      cp "$OUT/across-0" "$OUT/logits-tp"
      across "$n" --cp 2 >> "$OUT/cpx"
      cmp -s "$OUT/logits-tp" "$OUT/across-0" || same=DIFFER
    done
    tp=$(median < "$OUT/tp"); cpx=$(median < "$OUT/cpx")
    printf '%8s | %12.1f %12.1f %6s | %14s %14s | %s\n' "$n" "$tp" "$cpx" "$(ratio "$cpx" "$tp")" \
      "$(predicted "$n" --tp 2)" "$(predicted "$n" --cp 2)" "$same"
  done
  netns_pair_down
fi
