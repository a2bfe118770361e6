#!/usr/bin/env bash
# Every `tessera` command once, briefly, on small models: generate (one rank, tp 2,
# pp 2, tp 2 x pp 2, cp 2, a batch, MoE, every weight type: F32, F16, Q8_0, Q4_0 from
# ../shared/models, Q4_K and Q6_K written by `tessera synth`), serve with a few
# requests (curl, and `bench serve` against it), bench model / comm / serve, plan
# (presets, a GGUF, --calibrate --skip-bench and the file it writes), inspect,
# synth, launch, version. A step fails on a non-zero exit or a sanitizer report in
# its output: in the ASan build (`make test-asan` builds tessera) this is the
# commands' sanitizer check; in the release build a quick end-to-end smoke test.
#   tests/cli/smoke_test.sh TESSERA SHARED_DIR
# Exits 77 (CTest: skipped) when the binary is not built in this tree or the shared
# models are missing.
set -uo pipefail
tessera=${1:?usage: smoke_test.sh TESSERA SHARED_DIR}
shared=${2:?usage: smoke_test.sh TESSERA SHARED_DIR}
[[ -x "$tessera" ]] || { echo "SKIP: tessera not built here: $tessera"; exit 77; }
models=$shared/models
[[ -f "$models/stories260K.gguf" ]] || { echo "SKIP: no shared models in $models"; exit 77; }
# UBSan reports and goes on by default: stop at the first report instead (ASan
# stops anyway). Leak checking stays on.
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1}
tmp=$(mktemp -d /tmp/tessera-smoke.XXXXXX)
server_pid=
cleanup() {
  [[ -n "$server_pid" ]] && kill "$server_pid" 2>/dev/null
  rm -rf "$tmp"
}
trap cleanup EXIT
fail() { echo "FAIL: $*"; exit 1; }
start_s=$EPOCHREALTIME
elapsed() { awk -v a="$1" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.1f", b - a }'; }
sanitizer_report='ERROR: AddressSanitizer|ERROR: LeakSanitizer|SUMMARY: [A-Za-z]*Sanitizer|runtime error: '

# Fails the test when FILE holds a sanitizer report (a rank process's report need
# not change the exit status its launcher returns).
check_clean() {
  if grep -Eq "$sanitizer_report" "$1"; then
    cat "$1"
    fail "$2: sanitizer report"
  fi
}

# step NAME TESSERA_ARGS...: runs `tessera ARGS` (at most 300 s), output in
# $tmp/NAME.log; fails on a non-zero exit or a sanitizer report.
step() {
  local name=$1
  shift
  local t0 rc
  t0=$EPOCHREALTIME
  timeout 300 "$tessera" "$@" >"$tmp/$name.log" 2>&1
  rc=$?
  check_clean "$tmp/$name.log" "$name"
  if [[ $rc != 0 ]]; then
    tail -n 40 "$tmp/$name.log"
    fail "$name: 'tessera $*' exited $rc"
  fi
  printf 'ok %-28s %6s s\n' "$name" "$(elapsed "$t0")"
}

expect_in() {  # NAME PATTERN: the step's output matches PATTERN
  grep -Eq -- "$2" "$tmp/$1.log" || { cat "$tmp/$1.log"; fail "$1: no '$2' in its output"; }
}

step version version
# synth: the K-quant models (dim 512 so that tp 2 splits whole super-blocks).
for type in q4_k q6_k; do
  step "synth_$type" synth --dim 512 --layers 2 --heads 8 --kv-heads 4 --ffn 512 --vocab 512 \
    --type "$type" --seed 38 -o "$tmp/$type.gguf"
done
step synth_moe synth --arch moe --dim 64 --layers 2 --heads 4 --kv-heads 2 --ffn 96 \
  --experts 4 --experts-used 2 --type q8_0 -o "$tmp/moe.gguf"

for model in stories260K.gguf stories260K-F16.gguf stories260K-ffn192-Q8_0.gguf \
  stories260K-ffn192-Q4_0.gguf stories260K-moe4x2.gguf llama-2-tiny-random.gguf; do
  [[ -f "$models/$model" ]] || fail "missing shared model $models/$model"
done
step inspect inspect "$models/stories260K.gguf"
expect_in inspect "tensors check: OK"
step inspect_json inspect --json "$models/stories260K-moe4x2.gguf"
step inspect_q4_k inspect "$tmp/q4_k.gguf"
expect_in inspect_q4_k "q4_k"

# generate: every weight type on one rank, greedy, a few tokens.
gen=(-p "Once upon a time" -n 6 --temp 0 --ignore-eos --timeout-ms 120000)
step gen_f32 generate "$models/stories260K.gguf" "${gen[@]}"
step gen_f16 generate "$models/stories260K-F16.gguf" "${gen[@]}"
step gen_q8_0 generate "$models/stories260K-ffn192-Q8_0.gguf" "${gen[@]}"
step gen_q4_0 generate "$models/stories260K-ffn192-Q4_0.gguf" "${gen[@]}"
step gen_q4_k generate "$tmp/q4_k.gguf" "${gen[@]}"
step gen_q6_k generate "$tmp/q6_k.gguf" "${gen[@]}"
step gen_llama2 generate "$models/llama-2-tiny-random.gguf" "${gen[@]}"
# Parallel layouts, a batch, MoE (experts split by tp), a K-quant column shard.
step gen_tp2 generate "$models/stories260K.gguf" "${gen[@]}" --tp 2
step gen_pp2 generate "$models/stories260K-ffn192-Q8_0.gguf" "${gen[@]}" --pp 2
step gen_tp2_pp2 generate "$models/stories260K.gguf" "${gen[@]}" --tp 2 --pp 2 -t 1
step gen_batch generate "$models/stories260K-ffn192-Q4_0.gguf" "${gen[@]}" --batch 3 \
  --prefill-chunk 4
step gen_moe generate "$models/stories260K-moe4x2.gguf" "${gen[@]}"
step gen_moe_tp2 generate "$models/stories260K-moe4x2.gguf" "${gen[@]}" --tp 2
step gen_synth_moe generate "$tmp/moe.gguf" "${gen[@]}" --batch 2
step gen_q4_k_tp2 generate "$tmp/q4_k.gguf" "${gen[@]}" --tp 2 --ledger
# Context parallelism: a prompt of three 256-token spans over cp 2 (split prefill,
# then decode over the distributed KV), the ledger beside the planner's.
long=$(printf 'Once upon a time there was a little dog who liked to play in the park. %.0s' {1..40})
step gen_cp2 generate "$models/stories260K.gguf" -p "$long" -n 4 --temp 0 --cp 2 -t 1 --ledger
expect_in gen_cp2 "cp/all_gather"
expect_in gen_cp2 "cp/send"
# Speculative decoding (n-gram guesses) on two ranks: the same logits, bit for
# bit, as without; the stats line counts the guesses.
copy=(-p "Tom had a red ball. He liked the ball. Tom had a red ball. He liked the" -n 40 --temp 0
  --ignore-eos --tp 2)
step gen_plain_tp2 generate "$models/stories260K.gguf" "${copy[@]}" --dump-logits "$tmp/plain.f32"
step gen_spec_tp2 generate "$models/stories260K.gguf" "${copy[@]}" --dump-logits "$tmp/spec.f32" \
  --speculative ngram
expect_in gen_spec_tp2 "speculative ngram: [0-9]+/[0-9]+ guesses accepted"
cmp -s "$tmp/plain.f32" "$tmp/spec.f32" || fail "gen_spec_tp2: logits differ from plain decoding"
# A draft model (the target's Q4_0 sibling, on the driver rank) guessing for a tp 2 target.
step gen_plain_ffn192 generate "$models/stories260K-ffn192.gguf" "${copy[@]}" \
  --dump-logits "$tmp/plain192.f32"
step gen_draft_tp2 generate "$models/stories260K-ffn192.gguf" "${copy[@]}" \
  --dump-logits "$tmp/draft192.f32" --speculative "draft:$models/stories260K-ffn192-Q4_0.gguf"
expect_in gen_draft_tp2 "speculative draft: [0-9]+/[0-9]+ guesses accepted"
cmp -s "$tmp/plain192.f32" "$tmp/draft192.f32" || fail "gen_draft_tp2: logits differ from plain"

# serve: a few requests over HTTP (curl), then `bench serve` against it; SIGTERM
# stops it cleanly.
"$tessera" serve "$models/stories260K.gguf" --host 127.0.0.1 --port 0 --max-num-seqs 4 \
  --speculative ngram --spec-tokens 3 >"$tmp/serve.log" 2>&1 &
server_pid=$!
port=
for _ in $(seq 1 600); do
  port=$(sed -n 's|.* on http://127.0.0.1:\([0-9]*\) .*|\1|p' "$tmp/serve.log")
  [[ -n "$port" ]] && break
  kill -0 "$server_pid" 2>/dev/null || { cat "$tmp/serve.log"; fail "serve exited early"; }
  sleep 0.1
done
[[ -n "$port" ]] || { cat "$tmp/serve.log"; fail "serve did not report its port"; }
url=http://127.0.0.1:$port
curl -sf "$url/health" >/dev/null || fail "serve: no /health"
for stream in false true false; do
  curl -sf "$url/v1/completions" -H 'Content-Type: application/json' \
    -d "{\"prompt\": \"Once upon a time\", \"max_tokens\": 5, \"temperature\": 0, \"stream\": $stream}" \
    >"$tmp/completion.json" || fail "serve: completion (stream $stream) failed"
  grep -q '"text"' "$tmp/completion.json" || { cat "$tmp/completion.json"; fail "serve: no text"; }
done
code=$(curl -s -o /dev/null -w '%{http_code}' "$url/v1/completions" -d '{"prompt": "x",')
[[ "$code" == 400 ]] || fail "serve: malformed JSON gave HTTP $code, not 400"
step bench_serve bench serve --base-url "$url" -n 6 --input-len 8 --output-len 4 \
  --max-concurrency 3 --ignore-eos --json "$tmp/bench_serve.json"
curl -sf "$url/metrics" >"$tmp/metrics.txt" || fail "serve: no /metrics"
grep -q 'tessera_requests_total' "$tmp/metrics.txt" || fail "serve: metrics"
grep -q 'tessera_spec_decode_enabled 1' "$tmp/metrics.txt" || fail "serve: speculative metrics"
kill -TERM "$server_pid"
wait "$server_pid"
rc=$?
server_pid=
check_clean "$tmp/serve.log" serve
[[ $rc == 0 ]] || { tail -n 40 "$tmp/serve.log"; fail "serve exited $rc after SIGTERM"; }
echo "ok serve (4 requests over curl, 6 from bench serve)"

# bench model: tiny tests, one of them on a K-quant model (its GEMV probe too).
step bench_model bench model "$models/stories260K.gguf" -t 1 --pp 8 --tg 4 -r 1
expect_in bench_model "tg4"
step bench_model_q4_k bench model "$tmp/q4_k.gguf" -t 2 --pp 0 --tg 2 -r 1
step bench_comm bench comm --np 2 --op all -b 8 -e 4K --iters 2 --warmup 1 --check \
  --timeout-ms 60000
step launch launch --nproc 2 -- "$tessera" bench comm --op allreduce -b 8 -e 4K --iters 2 \
  --warmup 1 --check --timeout-ms 60000

# plan: presets, a GGUF, one layout in detail, this machine calibrated (every weight
# type's kernel rates, at their real sizes) and planned on.
step plan_list plan --list
step plan_preset plan -m llama-3-8b -c 8xh100 --top 3
step plan_gguf plan -m "$models/stories260K-moe4x2.gguf" -c 4xdesktop-1gbe --layout tp=2 \
  --json
# --probe-seconds 0.02: the calibration's every buffer at its real size, timed briefly.
# SMOKE_QUICK=1 (the ASan pass) leaves it out: filling those buffers takes two minutes
# under ASan, and the kernels it times have their own sanitizer tests.
if [[ "${SMOKE_QUICK:-0}" == 1 ]]; then
  echo "skip plan_calibrate (SMOKE_QUICK=1)"
else
  step plan_calibrate plan --calibrate --skip-bench --probe-seconds 0.02 --out "$tmp/cluster.json"
  for type in f32 f16 bf16 q8_0 q4_0 q4_k q6_k; do
    grep -q "\"$type\"" "$tmp/cluster.json" || fail "plan --calibrate: no $type rate"
  done
  grep -q '"gemv_cols_gbps"' "$tmp/cluster.json" || fail "plan --calibrate: no row-length sweep"
  step plan_calibrated plan -m "$tmp/q4_k.gguf" -c "$tmp/cluster.json" --layout tp=2
fi

echo "cli smoke test passed in $(elapsed "$start_s") s"
