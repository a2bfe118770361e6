#!/usr/bin/env bash
# Hot-expert replicas on a skewed load: a synthetic MoE whose router favours a
# quarter of its experts (tessera synth --router-skew), decoded under --ep 2 with
# every expert at home against --ep 2 with a placement balanced for the measured
# load (generate --ep-placement-out, --ep-redundant R), in interleaved rounds.
# Prints each run's busiest-rank share of the expert rows, decode tokens/s, the
# ratio, and whether the logits are byte-identical. Then the same live: two
# servers, one re-placing copies from the load it measures (serve --ep-rebalance),
# the other with every expert at home, under the same load (part 2 below).
#
#   bench/ep-balance-bench.sh [build/bin/tessera] [ROUNDS]
#
# Environment: SKEW (0.5), BY_LAYER (0; 1: each layer its own hot experts),
# REDUNDANT (2), BATCH (16), TG (32), DIM (1024), LAYERS (8), EXPERTS (8); serving: CONCURRENCY (16), NUM_PROMPTS (48), INPUT (32),
# OUTPUT (48).
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
BY_LAYER_FLAG=()
[ "${BY_LAYER:-0}" = 1 ] && BY_LAYER_FLAG=(--router-skew-by-layer)
"$TESSERA" synth --arch moe --dim "$DIM" --layers "$LAYERS" --heads 16 --ffn $((DIM * 2)) \
  --experts "$EXPERTS" --experts-used 2 --type q8_0 --router-skew "$SKEW" "${BY_LAYER_FLAG[@]}" \
  -o "$MODEL" >&2 || exit 2

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

echo "model: synthetic MoE dim $DIM, $LAYERS layers, $EXPERTS experts top-2, router skew $SKEW${BY_LAYER_FLAG[*]:+ by layer}; batch $BATCH, $TG tokens, $ROUNDS rounds"
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

# --- 2. the same, live, in a running server (serve --ep-rebalance) ---
# Two servers on the skewed model, --ep 2 --ep-redundant $REDUNDANT, 1 thread a
# rank: one keeps every expert at home (--ep-rebalance 0), the other re-places
# copies from the load it measures (--ep-rebalance 2). Each first serves a warm-up
# load (untimed; on the live one until /metrics shows a re-placement), then the
# measured load ($CONCURRENCY streams); rounds interleaved. The busiest EP rank's
# share of the rows its experts computed during the measured load comes from
# /metrics (tessera_ep_rank_rows_computed_total).
CONCURRENCY=${CONCURRENCY:-16}
NUM_PROMPTS=${NUM_PROMPTS:-48}
INPUT=${INPUT:-32}
OUTPUT=${OUTPUT:-48}
PORT=$((20000 + $$ % 20000))
# shellcheck source=serve-lib.sh
source "$(dirname "$0")/serve-lib.sh"
computed() {  # the rows each EP rank's experts computed so far, "r0 r1 …"
  # The server polls its ranks after a step at most once a second: one more
  # one-token request after a second makes the sample current.
  sleep 1.1
  curl -s "http://127.0.0.1:$PORT/v1/completions" \
    -d '{"prompt": "Once", "max_tokens": 1, "temperature": 0}' > /dev/null
  curl -s "http://127.0.0.1:$PORT/metrics" |
    awk '/^tessera_ep_rank_rows_computed_total/ {printf "%s ", $NF}'
}
busiest_share() {  # before after: busiest rank's rows over the mean, between the two samples
  awk -v a="$1" -v b="$2" 'BEGIN {n = split(a, x, " "); split(b, y, " "); s = 0; m = 0
    for (i = 1; i <= n; i++) {d = y[i] - x[i]; s += d; if (d > m) m = d}
    printf "%.2f", (s > 0) ? m / (s / n) : 0}'
}
served() {  # rebalance-seconds: "tok/s busiest/mean pause-ms"
  PORT=$(next_port)
  "$TESSERA" serve "$MODEL" --port "$PORT" --max-num-seqs "$CONCURRENCY" -t 1 --ep 2 \
    --ep-redundant "$REDUNDANT" --ep-rebalance "$1" > "$OUT/serve.log" 2>&1 &
  SERVER_PID=$!
  local tok_s=0 share=0 pause=0 before after
  if wait_ready "$PORT"; then
    for _ in $(seq 10); do  # warm-up; the live server until it re-placed its experts
      load_tok_s > /dev/null
      [ "$1" = 0 ] && break
      curl -s "http://127.0.0.1:$PORT/metrics" | grep -q '^tessera_ep_rebalances_total [1-9]' && break
    done
    before=$(computed)
    tok_s=$(load_tok_s)
    after=$(computed)
    share=$(busiest_share "$before" "$after")
    # The pause of the last re-placement; "none" when the server kept its placement
    # (the warm-up never showed a gain of 5%), so that the row says what it compares.
    pause=$(curl -s "http://127.0.0.1:$PORT/metrics" |
      awk '/^tessera_ep_rebalances_total/ {n = $NF}
           /^tessera_ep_rebalance_last_seconds/ {ms = $NF * 1000}
           END {if (n > 0) printf "%.1f", ms; else printf "none"}')
  fi
  grep "experts re-placed" "$OUT/serve.log" | tail -1 | sed 's/^/   /' >&2
  stop_server
  echo "$tok_s $share ${pause:-none}"
}
echo
echo "serve, $CONCURRENCY streams, $NUM_PROMPTS prompts of $INPUT words, $OUTPUT tokens; $ROUNDS rounds"
: > "$OUT/fixed"; : > "$OUT/live"
for _ in $(seq "$ROUNDS"); do
  served 0 >> "$OUT/fixed"
  served 2 >> "$OUT/live"
done
col() { median "$(cut -d' ' -f"$1" "$OUT/$2")"; }  # serve-lib's median takes its values
fixed=$(col 1 fixed); live=$(col 1 live)
printf '%-34s %10s %14s %10s\n' server "out tok/s" "busiest/mean" "pause ms"
printf '%-34s %10.1f %14s %10s\n' "experts at home (--ep-rebalance 0)" "$fixed" \
  "$(col 2 fixed)" "-"
printf '%-34s %10.1f %14s %10s\n' "live re-placement (--ep-rebalance 2)" "$live" \
  "$(col 2 live)" "$(col 3 live)"
awk -v a="$live" -v b="$fixed" 'BEGIN {printf "live / at home: %.2fx\n", (b > 0) ? a / b : 0}'
