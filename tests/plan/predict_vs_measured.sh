#!/usr/bin/env bash
# Predicted vs measured decode on this machine, one and two ranks: calibrates a
# cluster file (`tessera plan --calibrate`, with the shm/TCP link fits), writes a
# random-weight model of a benchmark shape (`tessera synth`) unless one is given,
# measures greedy decoding with `tessera generate` for tp1 (all cores), tp1 (1
# thread), tp2, pp2, pp2 --batch 8 and dp2 (two replicas of 1 thread decoding
# --batch 8 each at once, what `serve --dp 2` runs behind its front), and prints the planner's prediction for the
# same layout on the calibrated file beside each, with the ratio. The machine is
# calibrated before and again after the measurements: this VM's speed drifts for
# minutes at a time, so the prediction is the mean of the two and both are printed
# (far apart = the machine changed state mid-run; rerun).
# A benchmark, not a test: it prints and exits 0 (1 only when a step fails).
#
#   tests/plan/predict_vs_measured.sh [build/bin/tessera] [shape] [type] [model.gguf]
#   shape: 110m (default; dim 768, 12 layers, ffn 2048, vocab 32000) or tinyllama
#   (dim 2048, 22 layers, 32 heads / 4 kv, ffn 5632); type: q8_0 (default), f16, f32.
#   model.gguf: use this file (e.g. /work/models-synth/tinyllama-1.1b-q8_0.gguf)
#   instead of writing one; its shape must be `shape`'s.
# Environment: TG (tokens generated per run, 64), BATCH (pp2 throughput row, 8),
# SKIP_BENCH_COMM=1 keeps the link presets (faster; tp2/pp2 rows then use them).
#
# How each row maps onto the planner (docs/plan.md, "CPU nodes"): the calibrated file
# describes one rank per core; "tp1, all cores" plans with --devices-per-node 1 (one
# rank owning every core's thread), the other rows with one thread per rank. pp2 runs
# with --pp-layers set to the planner's even split so both talk about the same stages.
set -euo pipefail
TESSERA=${1:-build/bin/tessera}
SHAPE=${2:-110m}
TYPE=${3:-q8_0}
MODEL=${4:-}
TG=${TG:-64}
BATCH=${BATCH:-8}
work=$(mktemp -d /tmp/tessera-plan-check-XXXXXX)
trap 'rm -rf "$work"' EXIT

case "$SHAPE" in
  110m)
    shape=(--dim 768 --layers 12 --heads 12 --ffn 2048 --vocab 32000)
    layers=12
    ;;
  tinyllama)
    shape=(--dim 2048 --layers 22 --heads 32 --kv-heads 4 --ffn 5632 --vocab 32000)
    layers=22
    ;;
  *) echo "unknown shape $SHAPE (110m, tinyllama)" >&2; exit 2 ;;
esac
# The planner's pp=2 stages: the first L mod 2 ones one layer longer.
half=$(((layers + 1) / 2))
pp_layers="0-$((half - 1)),$half-$((layers - 1))"

echo "== calibrating this machine" >&2
skip=()
[[ "${SKIP_BENCH_COMM:-0}" == 1 ]] && skip=(--skip-bench)
"$TESSERA" plan --calibrate "${skip[@]}" --out "$work/cluster.json" > /dev/null
if [[ -z "$MODEL" ]]; then
  echo "== writing a $SHAPE $TYPE model" >&2
  MODEL="$work/model.gguf"
  "$TESSERA" synth "${shape[@]}" --type "$TYPE" -o "$MODEL" > /dev/null
fi

prompt="Once upon a time there was a little robot who lived in a big city and liked to"
# measure NAME PLAN_ARGS... -- GENERATE_ARGS...: one generate run, its stderr kept.
measure() {
  local name=$1
  shift
  echo "== $name: tessera generate $*" >&2
  "$TESSERA" generate "$MODEL" -p "$prompt" -n "$TG" --temp 0 --ignore-eos \
    --no-display-prompt --report "$@" > /dev/null 2> "$work/$name.txt"
}
measure tp1_all
measure tp1_1t -t 1
measure tp2 --tp 2 -t 1
measure pp2 --pp 2 -t 1 --pp-layers "$pp_layers"
measure pp2_b$BATCH --pp 2 -t 1 --pp-layers "$pp_layers" --batch "$BATCH"
# dp2: two independent replicas at once (no communication between them).
echo "== dp2_b$BATCH: two of tessera generate -t 1 --batch $BATCH at once" >&2
for r in 0 1; do
  "$TESSERA" generate "$MODEL" -p "$prompt" -n "$TG" --temp 0 --ignore-eos \
    --no-display-prompt --report -t 1 --batch "$BATCH" > /dev/null 2> "$work/dp2_b$BATCH.$r.txt" &
done
wait
cat "$work/dp2_b$BATCH.0.txt" > "$work/dp2_b$BATCH.txt"
echo "== calibrating this machine again" >&2
"$TESSERA" plan --calibrate "${skip[@]}" --out "$work/cluster_after.json" > /dev/null
prompt_tokens=$(sed -n 's/^prompt \([0-9]*\) tokens.*/\1/p' "$work/tp1_1t.txt")

# plan NAME CONCURRENCY PLAN_ARGS...: the planner's estimate for the same layout; the
# decode context (prompt + output/2) is the runs' average.
plan() {
  local name=$1 concurrency=$2
  shift 2
  for when in "" _after; do
    "$TESSERA" plan -m "$MODEL" -c "$work/cluster$when.json" --prompt "$prompt_tokens" \
      --output "$TG" --kv-dtype f16 --concurrency "$concurrency" "$@" --json \
      > "$work/$name$when.json"
  done
}
plan tp1_all 1 --devices-per-node 1 --layout tp=1
plan tp1_1t 1 --layout tp=1
plan tp2 1 --layout tp=2
plan pp2 1 --layout pp=2
plan pp2_b$BATCH "$BATCH" --layout pp=2
plan dp2_b$BATCH "$((2 * BATCH))" --layout dp=2

python3 - "$work" "$BATCH" <<'PY'
import json, re, sys
work, batch = sys.argv[1], int(sys.argv[2])
for when in ("", "_after"):
    cluster = json.load(open(f"{work}/cluster{when}.json"))
    m = cluster["measured"]
    print(f"machine {'after' if when else 'before'}: {m['threads']} cores; read "
          f"{m['read_bytes_per_s_1_thread'] / 1e9:.1f} GB/s one thread, "
          f"{m['read_bytes_per_s_all'] / 1e9:.1f} GB/s all; q8_0 GEMV "
          f"{cluster['device']['gemv_gbps'].get('q8_0', 0):.1f} GB/s per thread; shm "
          f"{cluster['intra_link']['bandwidth_gbps']:.1f} GB/s, "
          f"{cluster['intra_link']['latency_us']:.2f} us")
rows = [("tp1_all", "tp1, all cores (1 rank)", 1), ("tp1_1t", "tp1, 1 thread", 1),
        ("tp2", "tp2, 2 ranks x 1 thread", 1), ("pp2", "pp2, 2 ranks x 1 thread", 1),
        (f"pp2_b{batch}", f"pp2 --batch {batch} (throughput)", batch),
        (f"dp2_b{batch}", f"dp2, 2 x 1 thread, {batch} seqs each", batch)]
print(f"{'layout':<30} {'pred ms':>8} {'(before/after)':>15} {'meas ms':>8} {'pred tok/s':>10} "
      f"{'meas tok/s':>10} {'ratio':>6}  {'driver ms/step':>14}  verdict")
for key, label, seqs in rows:
    text = open(f"{work}/{key}.txt").read()
    tok_s = float(re.search(r"generated \d+ tokens, ([0-9.]+) tok/s", text).group(1))
    # A batch: the steady state once every sequence decodes (a pipeline's second
    # micro-batch still prefills while the first decodes; the planner predicts decode).
    steady = re.search(r"all decoding: ([0-9.]+) tok/s", text)
    if seqs > 1 and steady and float(steady.group(1)) > 0:
        tok_s = float(steady.group(1))
    if key.startswith("dp2"):  # a replica's rate: the mean of the two that ran at once
        rates = [float(re.search(r"all decoding: ([0-9.]+) tok/s",
                                 open(f"{work}/{key}.{r}.txt").read()).group(1)) for r in (0, 1)]
        tok_s = sum(rates) / 2
    # The per-rank table: the driver (last stage, tp rank 0) is the last row listed
    # for the last stage; "per step" is its decode step time.
    steps = re.findall(r"^\s*\d+\s+(\d+)\s+(\d+)\s.*?\|\s+\d+\s+([0-9.]+) ms", text, re.M)
    driver_ms = float([s for s in steps if s[1] == "0"][-1][2]) if steps else float("nan")
    # TPOT without prefill stalls, with each calibration; the prediction is their mean.
    before, after = (json.load(open(f"{work}/{key}{when}.json"))["layouts"][0]["decode_pass"]
                     ["seconds"] for when in ("", "_after"))
    step_s = (before + after) / 2
    pred_tok_s = seqs / step_s
    meas_ms = 1e3 * seqs / tok_s  # one sequence's time per token
    ratio = step_s * 1e3 / meas_ms  # predicted / measured step time
    verdict = "within 25%" if 0.75 <= ratio <= 1.25 else "OUTSIDE 25%"
    both = f"{before * 1e3:.2f}/{after * 1e3:.2f}"
    print(f"{label:<30} {step_s * 1e3:>8.2f} {both:>15} {meas_ms:>8.2f} {pred_tok_s:>10.1f} "
          f"{tok_s:>10.1f} {ratio:>6.2f}  {driver_ms:>14.2f}  {verdict}")
print("ratio = predicted / measured decode step time (= measured / predicted tok/s); "
      "measured ms = sequences / tok/s; dp2's tok/s are one replica's (the deployment "
      "makes twice that)")
PY
