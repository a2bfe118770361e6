#!/usr/bin/env bash
# Decoding after a context-parallel prefill, both ways issue 35 names: the KV kept
# distributed (--cp 2: each rank folds its own spans' partials, one all-gather of
# them a layer — what tessera runs) against gathering the KV to one rank once, which
# then decodes alone (the alternative the planner prices in its "attention partials"
# item). Measured, in interleaved rounds: cp=2's decode step (2 ranks × 1 thread)
# and one rank's decode step (1 thread) at the same context — what the gathered rank
# runs — and the one-time gather as one point-to-point message of the bytes it moves
# (`tessera bench comm --op sendrecv`, shared memory). Beside each, the planner's
# prediction on this machine's calibrated cluster file, and the number of decode
# steps after which the gather pays off, measured and predicted.
#
#   bench/cp-decode-bench.sh [build/bin/tessera] [MODEL.gguf] [ROUNDS]
# Environment: PROMPT_TOKENS ("4096 8192"), TG (64 tokens decoded), SKIP_BENCH_COMM
# (1: link presets, faster calibration).
# A benchmark, not a test: prints and exits 0 (2 when it cannot run).
set -u
TESSERA=${1:-build/bin/tessera}
MODEL=${2:-build/synth-110m-32k.gguf}
ROUNDS=${3:-3}
PROMPT_TOKENS=${PROMPT_TOKENS:-4096 8192}
TG=${TG:-64}
. "$(dirname "$0")/prefill-lib.sh"
command -v python3 > /dev/null || { echo "needs python3" >&2; exit 2; }

skip=()
[ "${SKIP_BENCH_COMM:-0}" = 1 ] && skip=(--skip-bench)
"$TESSERA" plan --calibrate "${skip[@]}" --out "$OUT/cluster.json" > /dev/null 2>&1 ||
  { echo "calibration failed" >&2; exit 2; }

# Decode ms a token of one sequence after an N-token prompt (flags: the layout).
decode_ms() {
  local n=$1; shift
  "$TESSERA" generate "$MODEL" -p "$(prompt_of "$n")" -n "$TG" --temp 0 --ignore-eos \
    --prefill-chunk $((n * 2)) -c $((n + TG + 512)) "$@" 2> "$OUT/err" > /dev/null ||
    { echo "FAILED: $*: $(tail -3 "$OUT/err")" >&2; echo 0; return; }
  grep -oE 'generated [0-9]+ tokens, [0-9.]+ tok/s' "$OUT/err" | grep -oE '[0-9.]+ tok/s' |
    awk '{printf "%.3f\n", 1000 / $1}'
}
# Microseconds of one shm message of B bytes between two processes.
message_us() {
  "$TESSERA" bench comm --op sendrecv --np 2 --transport shm -b "$1" -e "$1" 2> /dev/null |
    awk '$1 ~ /^[0-9]+$/ {print $6; exit}'
}

echo "model: $MODEL, cp=2 (2 x 1 thread) vs the KV gathered to one rank (1 thread), $TG tokens decoded, $ROUNDS rounds"
printf '%7s | %9s %9s | %9s %9s | %11s %10s %10s | %9s %9s\n' context "cp2 ms" "plan" \
  "1 rank ms" "plan" "gather MiB" "gather ms" "plan" "pays off" "plan"
for n in $PROMPT_TOKENS; do
  : > "$OUT/cp"; : > "$OUT/one"
  for _ in $(seq "$ROUNDS"); do
    decode_ms "$n" --cp 2 -t 1 >> "$OUT/cp"
    decode_ms "$n" -t 1 >> "$OUT/one"
  done
  prompt=$(grep -oE 'prompt [0-9]+ tokens' "$OUT/err" | grep -oE '[0-9]+' | head -1)
  CP_MS=$(median < "$OUT/cp"); ONE_MS=$(median < "$OUT/one")
  for layout in cp=2 tp=1; do
    "$TESSERA" plan -m "$MODEL" -c "$OUT/cluster.json" --layout "$layout" --prompt "$prompt" \
      --output "$TG" --kv-dtype f16 --concurrency 1 --json > "$OUT/plan-$layout.json" 2> /dev/null
  done
  read -r PLAN_CP PLAN_ONE GATHER_B PLAN_GATHER < <(python3 - "$OUT" <<'PY'
import json, re, sys
out = sys.argv[1]
cp = json.load(open(f"{out}/plan-cp=2.json"))["layouts"][0]
one = json.load(open(f"{out}/plan-tp=1.json"))["layouts"][0]
cluster = json.load(open(f"{out}/cluster.json"))
note = next(i["note"] for i in cp["decode_pass"]["comm"] if i["what"] == "attention partials")
value, unit = re.search(r"would move ([0-9.]+) (B|KiB|MiB|GiB)", note).groups()
gathered = float(value) * {"B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}[unit]
link = cluster["intra_link"]
gather_s = link["latency_us"] * 1e-6 + gathered / (link["bandwidth_gbps"] * 1e9)
print(f"{cp['tpot_seconds'] * 1e3:.3f} {one['tpot_seconds'] * 1e3:.3f} {gathered:.0f} "
      f"{gather_s * 1e3:.3f}")
PY
  )
  GATHER_US=$(message_us "$GATHER_B")
  GATHER_MS=$(awk -v u="${GATHER_US:-0}" 'BEGIN {printf "%.2f", u / 1000}')
  # The gather pays off once the steps it saves (cp's step over one rank's, when
  # one rank is faster) add up to it; never when the distributed step is faster.
  payoff() { awk -v g="$1" -v c="$2" -v o="$3" 'BEGIN {d = c - o; if (d <= 0) print "never"; else printf "%.0f", g / d}'; }
  printf '%7s | %9s %9s | %9s %9s | %11.1f %10s %10s | %9s %9s\n' "$prompt" "$CP_MS" "$PLAN_CP" \
    "$ONE_MS" "$PLAN_ONE" "$(awk -v b="$GATHER_B" 'BEGIN {print b / 1048576}')" "$GATHER_MS" \
    "$PLAN_GATHER" "$(payoff "$GATHER_MS" "$CP_MS" "$ONE_MS")" \
    "$(payoff "$PLAN_GATHER" "$PLAN_CP" "$PLAN_ONE")"
done
echo "ms: decode step of the one sequence (median of the rounds; plan: the planner's TPOT on the"
echo "calibrated cluster); gather: the KV of cp rank 1's spans moved to rank 0 once, as one shm"
echo "message (measured) and at the calibrated link's rate (plan); pays off: decode steps after"
echo "which the gather's one-time cost is repaid by the faster one-rank steps ('never' when the"
echo "distributed step is the faster)."
