#!/usr/bin/env bash
# Hot-expert replicas on a skewed load: a synthetic MoE whose router favours a
# quarter of its experts (tessera synth --router-skew), decoded under --ep 2 with
# every expert at home against --ep 2 with a placement balanced for the measured
# load (generate --ep-placement-out, --ep-redundant R), in interleaved rounds.
# Prints each run's busiest-rank share of the expert rows, decode tokens/s, the
# ratio, and whether the logits are byte-identical.
#
#   bench/ep-balance-bench.sh [build/bin/tessera] [ROUNDS]
#
# Environment: SKEW (0.5), REDUNDANT (2), BATCH (16), TG (32), DIM (1024),
# LAYERS (8), EXPERTS (8).
set -u
TESSERA=${1:-build/bin/tessera}
ROUNDS=${2:-3}
SKEW=${SKEW:-0.5}
REDUNDANT=${REDUNDANT:-2}
BATCH=${BATCH:-16}
TG=${TG:-32}
DIM=${DIM:-1024}
LAYERS=${LAYERS:-8}
EXPERTS=${EXPERTS:-8}
[ -x "$TESSERA" ] || { echo "no tessera binary at $TESSERA" >&2; exit 2; }
OUT=$(mktemp -d /tmp/tessera-epbal.XXXXXX)
trap 'rm -rf "$OUT"' EXIT
MODEL=$OUT/skewed.gguf
"$TESSERA" synth --arch moe --dim "$DIM" --layers "$LAYERS" --heads 16 --ffn $((DIM * 2)) \
  --experts "$EXPERTS" --experts-used 2 --type q8_0 --router-skew "$SKEW" -o "$MODEL" >&2 || exit 2

GEN=("$TESSERA" generate "$MODEL" -p "Once upon a time" -n "$TG" --temp 0 --ignore-eos
     --batch "$BATCH" --ep 2)
# The placement, from one measuring run.
"${GEN[@]}" --ep-redundant "$REDUNDANT" --ep-placement-out "$OUT/placement.json" \
  > /dev/null 2> "$OUT/measure.err" || { cat "$OUT/measure.err" >&2; exit 1; }
grep "^wrote" "$OUT/measure.err"
echo "placement: $(cat "$OUT/placement.json")"

run() {  # tag, flags… -> "tok/s max/mean"
  local tag=$1; shift
  "${GEN[@]}" "$@" --dump-logits "$OUT/$tag.bin" > /dev/null 2> "$OUT/err" ||
    { echo "FAILED: $*: $(tail -3 "$OUT/err")" >&2; echo "0 0"; return; }
  local tok_s imb
  tok_s=$(grep -oE 'all decoding: [0-9.]+ tok/s' "$OUT/err" | grep -oE '[0-9.]+')
  imb=$(grep -oE 'max/mean [0-9.]+' "$OUT/err" | tail -1 | grep -oE '[0-9.]+$')
  echo "${tok_s:-0} ${imb:-0}"
}
median() { sort -g | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR+1)/2] : (a[NR/2] + a[NR/2+1]) / 2}'; }

echo "model: synthetic MoE dim $DIM, $LAYERS layers, $EXPERTS experts top-2, router skew $SKEW; batch $BATCH, $TG tokens, $ROUNDS rounds"
echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')"
: > "$OUT/home"; : > "$OUT/bal"
same=identical
for _ in $(seq "$ROUNDS"); do
  run home >> "$OUT/home"
  run bal --ep-redundant "$REDUNDANT" --ep-placement "$OUT/placement.json" >> "$OUT/bal"
  cmp -s "$OUT/home.bin" "$OUT/bal.bin" || same=DIFFER
done
home=$(cut -d' ' -f1 "$OUT/home" | median); bal=$(cut -d' ' -f1 "$OUT/bal" | median)
printf '%-22s %10s %14s\n' layout "tok/s" "busiest/mean"
printf '%-22s %10.1f %14s\n' "ep2, experts at home" "$home" "$(cut -d' ' -f2 "$OUT/home" | median)"
printf '%-22s %10.1f %14s\n' "ep2, balanced +$REDUNDANT" "$bal" "$(cut -d' ' -f2 "$OUT/bal" | median)"
awk -v a="$bal" -v b="$home" 'BEGIN {printf "balanced / at home: %.2fx\n", (b > 0) ? a / b : 0}'
echo "logits: $same"
