#!/usr/bin/env bash
# Sequence parallelism (--sp) against plain tensor parallelism at tp=2, in
# interleaved rounds: prefill tokens/s of long prompts (the whole prompt in one
# step), each rank's activation scratch (the per-rank report's act MiB) and peak
# RSS, and the logits of both compared byte for byte (--dump-logits).
#
#   bench/sp-bench.sh [build/bin/tessera] [MODEL.gguf] [ROUNDS]
#
# A second table times decode (TG tokens, batches of BATCHES sequences) with --sp
# on every step (--sp-min-tokens 1) against plain tp: the cost of SP's extra calls
# on short steps, which --sp-min-tokens avoids.
# Environment: PROMPT_TOKENS (prompt lengths, "1024 4096"), TP (2), TG (32),
# BATCHES ("1 16").
set -u
TESSERA=${1:-build/bin/tessera}
MODEL=${2:-build/synth-110m-32k.gguf}
ROUNDS=${3:-3}
PROMPT_TOKENS=${PROMPT_TOKENS:-1024 4096}
TP=${TP:-2}
TG=${TG:-32}
BATCHES=${BATCHES:-1 16}
. "$(dirname "$0")/prefill-lib.sh"

echo "model: $MODEL, tp=$TP, $ROUNDS interleaved rounds, one-step prefill"
echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')"
printf '%8s | %12s %12s %6s | %9s %9s | %9s %9s | %s\n' prompt "tp tok/s" "tp+sp tok/s" ratio \
  "act MiB" "+sp" "RSS MiB" "+sp" "logits"
for n in $PROMPT_TOKENS; do
  : > "$OUT/tp"; : > "$OUT/sp"
  same=identical
  for _ in $(seq "$ROUNDS"); do
    run "$n" tp --tp "$TP" >> "$OUT/tp"
    run "$n" sp --tp "$TP" --sp >> "$OUT/sp"
    cmp -s "$OUT/logits-tp" "$OUT/logits-sp" || same=DIFFER
    rm -f "$OUT/logits-tp" "$OUT/logits-sp"
  done
  tp=$(cut -d' ' -f1 "$OUT/tp" | median); sp=$(cut -d' ' -f1 "$OUT/sp" | median)
  printf '%8s | %12.1f %12.1f %6s | %9s %9s | %9s %9s | %s\n' "$(head -1 "$OUT/tp" | cut -d' ' -f4)" \
    "$tp" "$sp" "$(ratio "$sp" "$tp")" "$(head -1 "$OUT/tp" | cut -d' ' -f2)" \
    "$(head -1 "$OUT/sp" | cut -d' ' -f2)" "$(cut -d' ' -f3 "$OUT/tp" | median)" \
    "$(cut -d' ' -f3 "$OUT/sp" | median)" "$same"
done

# Decode: steady-state tokens/s of a batch (the stats line's "all decoding" figure
# when there is one, else the generated figure).
decode_tok_s() {
  "$TESSERA" generate "$MODEL" -p "Once upon a time" -n "$TG" --temp 0 --ignore-eos "$@" \
    2> "$OUT/err" > /dev/null || { echo "FAILED: $*: $(tail -3 "$OUT/err")" >&2; echo 0; return; }
  local steady
  steady=$(grep -oE 'all decoding: [0-9.]+ tok/s' "$OUT/err" | grep -oE '[0-9.]+')
  if [ -n "$steady" ]; then echo "$steady"; return; fi
  grep -oE 'generated [0-9]+ tokens, [0-9.]+ tok/s' "$OUT/err" | grep -oE '[0-9.]+ tok/s' | cut -d' ' -f1
}
echo
printf '%8s | %12s %12s %6s\n' batch "tp tok/s" "tp+sp tok/s" ratio
for b in $BATCHES; do
  : > "$OUT/dtp"; : > "$OUT/dsp"
  for _ in $(seq "$ROUNDS"); do
    decode_tok_s --tp "$TP" --batch "$b" >> "$OUT/dtp"
    decode_tok_s --tp "$TP" --batch "$b" --sp --sp-min-tokens 1 >> "$OUT/dsp"
  done
  tp=$(median < "$OUT/dtp"); sp=$(median < "$OUT/dsp")
  printf '%8s | %12.1f %12.1f %6s\n' "$b" "$tp" "$sp" "$(ratio "$sp" "$tp")"
done
