# Shared by bench/sp-bench.sh and bench/cp-bench.sh (sourced, not run): checks
# $TESSERA, writes the 110M model with a 32k context on first use, and defines
#   prompt_of N            a prompt of about N tokens
#   run N TAG ARGS...      one generate of a one-step prefill; prints
#                          "prefill_tok_s act_mib_rank0 rss_mib_rank0 prompt_tokens
#                           kv_mib_rank0", its logits in $OUT/logits-TAG
#                          (KV_TOKENS: the KV capacity, default 2N + 64)
#   median, ratio A B
# Uses $TESSERA, $MODEL; sets $OUT (removed on exit).
[ -x "$TESSERA" ] || { echo "no tessera binary at $TESSERA" >&2; exit 2; }
# The 110M shape with a 32k context (tessera synth; the tokenizer of the shared test
# vocabulary), written on first use.
if [ ! -f "$MODEL" ] && [ "$MODEL" = build/synth-110m-32k.gguf ]; then
  "$TESSERA" synth --dim 768 --layers 12 --heads 12 --ffn 2048 --type q8_0 --ctx 32768 \
    --vocab-from ../shared/models/llama-2-tiny-random.gguf --seed 1 --name synth-110m-32k \
    -o "$MODEL" >&2 || exit 2
fi
[ -f "$MODEL" ] || { echo "no model at $MODEL" >&2; exit 2; }
OUT=$(mktemp -d /tmp/tessera-prefill.XXXXXX)
trap 'rm -rf "$OUT"' EXIT

# A prompt of about N tokens: a sentence repeated (the stats line gives the real count).
prompt_of() {
  local n=$1 text=""
  while [ $(( ${#text} / 4 )) -lt "$n" ]; do text+="The quick brown fox jumps over the lazy dog near the river bank. "; done
  printf '%s' "$text"
}

# Runs one generate (see the top).
run() {
  local n=$1 tag=$2; shift 2
  "$TESSERA" generate "$MODEL" -p "$(prompt_of "$n")" -n 1 --temp 0 --ignore-eos \
    --prefill-chunk $((n * 2)) -c "${KV_TOKENS:-$((n * 2 + 64))}" --report \
    --dump-logits "$OUT/logits-$tag" "$@" \
    2> "$OUT/err" > /dev/null || { echo "FAILED: $*: $(tail -3 "$OUT/err")" >&2; echo "0 0 0 0 0"; return; }
  local tok_s prompt act rss kv
  tok_s=$(grep -oE 'prefill [0-9.]+ tok/s' "$OUT/err" | grep -oE '[0-9.]+' | head -1)
  prompt=$(grep -oE 'prompt [0-9]+ tokens' "$OUT/err" | grep -oE '[0-9]+' | head -1)
  # rank 0's row of the per-rank report: rank stage tp weights KV act RSS | …
  # Rank 0's row of the per-rank report: rank stage tp cp weights KV act RSS | …
  act=$(awk '$1 == "0" && $2 == "0" && $3 == "0" && $4 == "0" {print $7; exit}' "$OUT/err")
  rss=$(awk '$1 == "0" && $2 == "0" && $3 == "0" && $4 == "0" {print $8; exit}' "$OUT/err")
  kv=$(awk '$1 == "0" && $2 == "0" && $3 == "0" && $4 == "0" {print $6; exit}' "$OUT/err")
  echo "${tok_s:-0} ${act:-0} ${rss:-0} ${prompt:-0} ${kv:-0}"
}
median() { sort -g | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR+1)/2] : (a[NR/2] + a[NR/2+1]) / 2}'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN {printf "%.2f", (b > 0) ? a / b : 0}'; }

