#!/usr/bin/env bash
# Predicted vs measured on this machine, one rank: calibrates a cluster file
# (`tessera plan --calibrate`), writes a random-weight model of a benchmark shape
# (`tessera synth`), measures prefill and decode with `tessera bench model`, and
# prints the planner's prediction for the same workload beside each, with the ratio.
# A benchmark, not a test: it prints and exits 0 (1 only when a step fails).
#
#   tests/plan/predict_vs_measured.sh [build/bin/tessera] [shape] [type]
#   shape: 110m (default; dim 768, 12 layers, ffn 2048, vocab 32000) or tinyllama
#   (dim 2048, 22 layers, 32 heads / 4 kv, ffn 5632); type: q8_0 (default), f16, f32.
# Environment: PP (prompt tokens, 128), TG (generated tokens, 32), REPS (3),
# BENCH_COMM=1 to also fit the shm/TCP links (slower).
# tp=2 / pp=2 rows need multi-rank generation (issue 4); see docs/plan.md.
set -euo pipefail
TESSERA=${1:-build/bin/tessera}
SHAPE=${2:-110m}
TYPE=${3:-q8_0}
PP=${PP:-128}
TG=${TG:-32}
REPS=${REPS:-3}
work=$(mktemp -d /tmp/tessera-plan-check-XXXXXX)
trap 'rm -rf "$work"' EXIT

case "$SHAPE" in
  110m) shape=(--dim 768 --layers 12 --heads 12 --ffn 2048 --vocab 32000) ;;
  tinyllama) shape=(--dim 2048 --layers 22 --heads 32 --kv-heads 4 --ffn 5632 --vocab 32000) ;;
  *) echo "unknown shape $SHAPE (110m, tinyllama)" >&2; exit 2 ;;
esac

echo "== calibrating this machine" >&2
skip=(--skip-bench)
[[ "${BENCH_COMM:-0}" == 1 ]] && skip=()
"$TESSERA" plan --calibrate "${skip[@]}" --out "$work/cluster.json" > /dev/null
echo "== writing a $SHAPE $TYPE model" >&2
"$TESSERA" synth "${shape[@]}" --type "$TYPE" -o "$work/model.gguf" > /dev/null
echo "== measuring (bench model, 1 thread, pp$PP, tg$TG, $REPS reps)" >&2
"$TESSERA" bench model "$work/model.gguf" -t 1 --pp "$PP" --tg "$TG" --reps "$REPS" \
  --kv-type f16 --json "$work/measured.json" > /dev/null
# The benchmark runs one thread while the other cores idle: plan with the 1-thread
# bandwidth (the cluster file's per-device figure assumes every core busy).
bw1=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['measured']['read_bytes_per_s_1_thread'] / 1e9)" "$work/cluster.json")
# tg N = a 1-token prompt then N-1 decode steps from an empty context: the planner's
# decode context (prompt + output/2) matches with prompt 1, output N.
"$TESSERA" plan -m "$work/model.gguf" -c "$work/cluster.json" --memory-bandwidth "$bw1" \
  --layout tp=1 --prompt 1 --output "$TG" --kv-dtype f16 --json > "$work/tg.json"
"$TESSERA" plan -m "$work/model.gguf" -c "$work/cluster.json" --memory-bandwidth "$bw1" \
  --layout tp=1 --prompt "$PP" --output 1 --kv-dtype f16 --json > "$work/pp.json"

python3 - "$work" <<'PY'
import json, sys
work = sys.argv[1]
measured = {r["test"]: r for r in json.load(open(f"{work}/measured.json"))}
cluster = json.load(open(f"{work}/cluster.json"))
tg = json.load(open(f"{work}/tg.json"))["layouts"][0]
pp = json.load(open(f"{work}/pp.json"))["layouts"][0]
d = cluster["device"]
bw1 = cluster["measured"]["read_bytes_per_s_1_thread"] / 1e9
print(f"machine: {bw1:.2f} GB/s read by one thread, "
      f"{d['tflops'] * 1e3:.2f} GFLOP/s f32 GEMM per thread")
print(f"{'test':<8} {'predicted':>12} {'measured':>12} {'ratio':>7}  bound")
for name, rec in measured.items():
    if name.startswith("tg"):
        predicted = tg["tpot_seconds"]
        got = rec["seconds"] / rec["tokens"]
        bound = "memory" if tg["decode_pass"]["memory_bound"] else "compute"
        label = "s/token"
    else:
        predicted = pp["ttft_seconds"]
        got = rec["seconds"]
        bound = "memory" if pp["prefill_pass"]["memory_bound"] else "compute"
        label = "s/prompt"
    ratio = predicted / got
    flag = "within 25%" if 0.75 <= ratio <= 1.25 else "OUTSIDE 25%"
    print(f"{name:<8} {predicted:>12.5f} {got:>12.5f} {ratio:>7.2f}  {bound}  ({label}; {flag})")
PY
