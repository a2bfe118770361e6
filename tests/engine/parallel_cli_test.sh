#!/usr/bin/env bash
# `tessera generate --tp/--pp/--ep` as real rank processes: logits bit-identical to one
# rank (--dump-logits, byte for byte), invalid plans refused before loading, and a
# killed rank taking the whole job down within 10 s with an error naming it —
# under one launcher, and across two "nodes" (two launchers on this host) where
# the survivors learn it from the transport — leaving no processes or shm behind.
#   tests/engine/parallel_cli_test.sh path/to/tessera path/to/shared
set -u
TESSERA=${1:?usage: parallel_cli_test.sh TESSERA SHARED_DIR}
SHARED=${2:?usage: parallel_cli_test.sh TESSERA SHARED_DIR}
[ -x "$TESSERA" ] || { echo "SKIP: the tessera CLI is not built in this tree"; exit 77; }
MODELS=$SHARED/models
[ -f "$MODELS/stories260K.gguf" ] || { echo "SKIP: no shared models"; exit 77; }
OUT=$(mktemp -d /tmp/tessera-parallel.XXXXXX)
trap 'rm -rf "$OUT"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

# 1. Bit-identical logits, dense and MoE, prefill + decode, batch of 3.
for model in stories260K.gguf stories260K-moe4x2.gguf; do
  GEN=("$TESSERA" generate "$MODELS/$model" -p "Once upon a time there was" -n 12 --temp 0
       --ignore-eos --batch 3 --prefill-chunk 4 --timeout-ms 30000)
  "${GEN[@]}" --dump-logits "$OUT/single.bin" > "$OUT/single.txt" 2>&1 || fail "single rank: $(cat "$OUT/single.txt")"
  layouts=("--tp 2" "--pp 2" "--tp 2 --pp 2" "--pp 3" "--tp 4")
  # Sequence parallelism (dense only) on every step, and on the prefill chunks only.
  [ "$model" = stories260K.gguf ] &&
    layouts+=("--tp 2 --sp --sp-min-tokens 1" "--tp 2 --pp 2 --sp --sp-min-tokens 4")
  # Expert parallelism (MoE only): whole experts per rank, the same logits.
  [ "$model" = stories260K-moe4x2.gguf ] && layouts+=("--ep 2" "--tp 4 --ep 2" "--ep 2 --pp 2")
  # Data-parallel attention: each rank its own sequences, the experts over both.
  [ "$model" = stories260K-moe4x2.gguf ] && layouts+=("--ep 2 --dp-attention")
  # ... and with hot experts copied onto both ranks (--ep-placement).
  echo '{"experts": [[0], [0, 1], [1, 0], [1]]}' > "$OUT/placement.json"
  # ... and a table per layer (the model's 5), each copying other experts.
  echo '{"layers": [[[0], [0, 1], [1], [1]], [[0, 1], [0], [1], [1]], [[0], [0], [1, 0], [1]],
                    [[0], [0], [1], [1, 0]], [[1], [1], [0], [0]]]}' > "$OUT/per-layer.json"
  [ "$model" = stories260K-moe4x2.gguf ] &&
    layouts+=("--ep 2 --ep-redundant 1 --ep-placement $OUT/placement.json"
              "--ep 2 --pp 2 --ep-redundant 1 --ep-placement $OUT/per-layer.json")
  for layout in "${layouts[@]}"; do
    # shellcheck disable=SC2086
    "${GEN[@]}" $layout --dump-logits "$OUT/par.bin" > "$OUT/par.txt" 2>&1 ||
      fail "$model $layout: $(cat "$OUT/par.txt")"
    cmp -s "$OUT/single.bin" "$OUT/par.bin" || fail "$model $layout: logits differ from one rank"
    diff <(grep -v '^prompt\|^ *[0-9]\|^rank\|^(compute\|^ep load' "$OUT/single.txt") \
         <(grep -v '^prompt\|^ *[0-9]\|^rank\|^(compute\|^ep load' "$OUT/par.txt") > /dev/null ||
      fail "$model $layout: text differs"
    echo "ok: $model $layout bit-identical ($(stat -c %s "$OUT/par.bin") bytes of logits)"
  done
done

# 2. Invalid plans are refused before anything loads.
expect_refused() {
  local needle=$1; shift
  "$TESSERA" generate "$MODELS/stories260K-ffn192-Q8_0.gguf" -p hi -n 2 "$@" > "$OUT/bad.txt" 2>&1 &&
    fail "$* was accepted"
  grep -q "$needle" "$OUT/bad.txt" || fail "$*: expected '$needle', got: $(cat "$OUT/bad.txt")"
  echo "ok: $* refused: $(grep -o "$needle.*" "$OUT/bad.txt" | head -1 | cut -c1-110)"
}
expect_refused "must divide the 8 query heads" --tp 3
expect_refused "K-chunks" --tp 4
expect_refused "exceeds the model's 5 layers" --pp 6
expect_refused "should start at layer" --pp 2 --pp-layers 0-1,3-4
expect_refused "needs a mixture-of-experts model" --ep 2
expect_refused "must divide --tp" --tp 2 --ep 4
expect_refused "it needs --tp 2 or more" --sp
expect_refused "needs a mixture-of-experts model" --ep 2 --dp-attention
"$TESSERA" generate "$MODELS/stories260K-moe4x2.gguf" -p hi -n 2 --ep 2 --dp-attention --tp 2 \
  > "$OUT/bad.txt" 2>&1 && fail "--dp-attention with --tp 2 was accepted"
grep -q "not supported with --tp" "$OUT/bad.txt" || fail "dp attention + tp: $(cat "$OUT/bad.txt")"
echo "ok: --dp-attention with --tp 2 refused"
# Its ledger is the planner's, byte for byte (the counts, dispatch, combine, logits).
"$TESSERA" generate "$MODELS/stories260K-moe4x2.gguf" -p "Once upon a time" -n 6 --temp 0 \
  --batch 3 --ep 2 --dp-attention --ledger > "$OUT/dpa-ledger.txt" 2>&1 ||
  fail "dp attention ledger: $(cat "$OUT/dpa-ledger.txt")"
grep -q "measured vs model: 0 differences" "$OUT/dpa-ledger.txt" ||
  fail "dp attention ledger differs from the planner: $(grep '!!\|differences' "$OUT/dpa-ledger.txt")"
grep -q "ep/send" "$OUT/dpa-ledger.txt" || fail "dp attention: no logits sent to the driver"
echo "ok: --ep 2 --dp-attention ledger = planner"
echo '{"experts": [[0], [1]]}' > "$OUT/bad-placement.json"
"$TESSERA" generate "$MODELS/stories260K-moe4x2.gguf" -p hi -n 2 --ep 2 \
  --ep-placement "$OUT/bad-placement.json" > "$OUT/bad.txt" 2>&1 && fail "a 2-expert placement was accepted"
grep -q "lists 2 experts; the model has 4" "$OUT/bad.txt" || fail "bad placement: $(cat "$OUT/bad.txt")"
echo "ok: a placement naming 2 of 4 experts refused"

# 3. A killed rank stops the job within 10 s; nothing is left behind.
"$TESSERA" synth --dim 512 --layers 8 --heads 8 --ffn 1024 --type f32 --ctx 4096 \
  -o "$OUT/kill.gguf" > /dev/null || fail "synth"
LONG=(generate "$OUT/kill.gguf" -p "a b c" -n 4000 --temp 0 --ignore-eos --timeout-ms 60000)
# The job's id, from a rank's environment: its shm names are tessera-<job>-*
# (other tests running in parallel have their own).
job_of() { tr '\0' '\n' < "/proc/$1/environ" 2> /dev/null | sed -n 's/^TESSERA_JOB_ID=//p'; }
wait_children() {  # parent pid, count
  for _ in $(seq 1 100); do
    [ "$(pgrep -P "$1" | wc -l)" -ge "$2" ] && return 0
    sleep 0.1
  done
  return 1
}
check_clean() {  # what, job id
  sleep 0.5
  pgrep -f "$OUT/kill.gguf" > /dev/null && fail "$1: rank processes left behind"
  [ -n "$2" ] || fail "$1: could not read the job id"
  ls /dev/shm | grep -q "^tessera-$2-" && fail "$1: shm segments of job $2 left behind"
  return 0
}
"$TESSERA" "${LONG[@]}" --tp 2 --pp 2 > "$OUT/k1.txt" 2>&1 &
PARENT=$!
wait_children $PARENT 4 || fail "ranks did not start"
sleep 1.5
VICTIM=$(pgrep -P $PARENT | sed -n 2p)
JOB=$(job_of "$VICTIM")
start=$(date +%s%N)
kill -9 "$VICTIM"
wait $PARENT; rc=$?
elapsed_ms=$(( ($(date +%s%N) - start) / 1000000 ))
[ $rc != 0 ] || fail "one launcher: job exited 0 after a rank was killed"
[ $elapsed_ms -lt 10000 ] || fail "one launcher: took $elapsed_ms ms"
grep -q "local rank 1 (pid $VICTIM) exited with 137" "$OUT/k1.txt" || fail "one launcher: $(cat "$OUT/k1.txt")"
check_clean "one launcher" "$JOB"
echo "ok: one launcher, rank 1 killed: job exited $rc after $elapsed_ms ms, nothing left"

# Two launchers ("nodes") on this host: node 0's ranks only learn from the transport.
PORT=$((25000 + $$ % 20000))
NODE=("${LONG[@]}" --tp 2 --pp 2 --nnodes 2 --rdzv 127.0.0.1:$PORT --token parallel-test)
"$TESSERA" "${NODE[@]}" --node-rank 0 > "$OUT/n0.txt" 2>&1 &
P0=$!
"$TESSERA" "${NODE[@]}" --node-rank 1 > "$OUT/n1.txt" 2>&1 &
P1=$!
wait_children $P1 2 || fail "node 1's ranks did not start"
sleep 2
VICTIM=$(pgrep -P $P1 | head -1)  # world rank 2
JOB=$(job_of "$VICTIM")
start=$(date +%s%N)
kill -9 "$VICTIM"
wait $P0; rc0=$?
elapsed_ms=$(( ($(date +%s%N) - start) / 1000000 ))
wait $P1
[ $rc0 != 0 ] || fail "two nodes: node 0 exited 0"
[ $elapsed_ms -lt 10000 ] || fail "two nodes: node 0 took $elapsed_ms ms"
grep -q "rank 2 .*pid $VICTIM" "$OUT/n0.txt" || fail "two nodes: node 0 did not name rank 2: $(cat "$OUT/n0.txt")"
check_clean "two nodes" "$JOB"
echo "ok: two nodes, world rank 2 killed: node 0 exited $rc0 after $elapsed_ms ms: $(grep -o 'rank 2 .*' "$OUT/n0.txt" | head -1)"
echo PASS
