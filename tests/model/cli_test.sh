#!/usr/bin/env bash
# `tessera inspect` and `tessera synth` end to end: a good model, bad files (clear
# message, exit 1), synth determinism and read-back. Usage: cli_test.sh TESSERA SHARED_DIR
# Exits 77 (CTest: skipped) when the tessera binary is not built in this build tree.
set -uo pipefail
tessera=$1
shared=$2
[[ -x "$tessera" ]] || { echo "tessera not built here: $tessera"; exit 77; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

# Expects `tessera ARGS...` to exit 1 with a message matching PATTERN on stderr.
expect_error() {
  local pattern=$1; shift
  if "$tessera" "$@" >"$tmp/out" 2>"$tmp/err"; then fail "'$*' succeeded"; fi
  grep -q -- "$pattern" "$tmp/err" || { cat "$tmp/err"; fail "'$*': no '$pattern' in stderr"; }
}

"$tessera" synth --dim 64 --layers 2 --heads 4 --kv-heads 2 --ffn 96 --type q4_0 --seed 5 \
  -o "$tmp/a.gguf" >/dev/null || fail "synth"
"$tessera" synth --dim 64 --layers 2 --heads 4 --kv-heads 2 --ffn 96 --type q4_0 --seed 5 \
  -o "$tmp/b.gguf" >/dev/null || fail "synth again"
cmp -s "$tmp/a.gguf" "$tmp/b.gguf" || fail "same seed gave different bytes"
"$tessera" inspect "$tmp/a.gguf" >"$tmp/out" || fail "inspect synth model"
grep -q "tensors check: OK" "$tmp/out" || fail "inspect: no 'tensors check: OK'"
grep -q "blk.1.ffn_down.weight *q4_0 *\[96, 64\]" "$tmp/out" || fail "inspect: tensor table"
"$tessera" inspect --json "$tmp/a.gguf" >"$tmp/out.json" || fail "inspect --json"
grep -q '"num_kv_heads": 2' "$tmp/out.json" || fail "inspect --json: config"
if command -v python3 >/dev/null; then
  python3 -c "import json,sys; json.load(open(sys.argv[1]))" "$tmp/out.json" || fail "invalid JSON"
fi

size=$(stat -c %s "$tmp/a.gguf")
head -c $((size / 2)) "$tmp/a.gguf" >"$tmp/truncated.gguf"
expect_error "extends past the end of the file" inspect "$tmp/truncated.gguf"
head -c 100 "$tmp/a.gguf" >"$tmp/short.gguf"
expect_error "truncated" inspect "$tmp/short.gguf"
{ printf 'GGUX'; tail -c +5 "$tmp/a.gguf"; } >"$tmp/magic.gguf"
expect_error "bad magic" inspect "$tmp/magic.gguf"
expect_error "cannot open" inspect "$tmp/missing.gguf"
expect_error "must divide --heads" synth --dim 64 --layers 1 --heads 4 --kv-heads 3 --ffn 96 \
  -o "$tmp/x.gguf"

# bench model: llama-bench's tests after a context of --depth tokens, one JSON
# record per (test, depth, threads); the model's path (a quote and a backslash in
# it here) escaped in the JSON.
odd="$tmp/a \"quoted\" \\ model.gguf"
cp "$tmp/a.gguf" "$odd"
"$tessera" bench model "$odd" -t 1 --pp 8 --tg 4 -d 0,20 -r 2 --json "$tmp/bench.json" \
  >"$tmp/out" || fail "bench model"
grep -q "| *1 | *tg4 @ d20 |" "$tmp/out" || { cat "$tmp/out"; fail "bench model: no 'tg4 @ d20' row"; }
grep -q "| *1 | *pp8 |" "$tmp/out" || fail "bench model: no 'pp8' row"
if command -v python3 >/dev/null; then
  python3 - "$tmp/bench.json" <<'PY' || fail "bench model --json records"
import json, sys
records = json.load(open(sys.argv[1]))
got = [(r["test"], r["depth"]) for r in records]
assert got == [("pp8", 0), ("tg4", 0), ("pp8 @ d20", 20), ("tg4 @ d20", 20)], got
assert all(r["tokens_per_s"] > 0 and r["threads"] == 1 for r in records), records
assert all(r["model"].endswith('/a "quoted" \\ model.gguf') for r in records), records
tg0, tg20 = records[1], records[3]
# KV read per decode token: the mean context of the test's steps, 2.5 and 22.5.
assert abs(tg20["kv_bytes_per_token"] / tg0["kv_bytes_per_token"] - 22.5 / 2.5) < 1e-6, records
# The roofline's bandwidth: the mean of the probes around the thread count's tests
# (two where the peak RSS can be reset between them, else one).
probes = tg0["memory_read_probes_bytes_per_s"]
assert len(probes) in (1, 2) and min(probes) > 0, records
assert abs(sum(probes) / len(probes) - tg0["memory_read_bytes_per_s"]) < 1, records
# The roofline: weights at the kernels' GEMV rate for the model's types (probed like
# the read bandwidth), the KV cache at the read probe's; beside it the read probe alone.
gemv = tg0["gemv_probes_bytes_per_s"]
assert len(gemv) == len(probes) and min(gemv) > 0, records
assert abs(sum(gemv) / len(gemv) - tg0["gemv_bytes_per_s"]) < 1, records
for r in (tg0, tg20):
    want = r["tokens_per_s"] * (r["weight_bytes_per_token"] / r["gemv_bytes_per_s"] +
                                r["kv_bytes_per_token"] / r["memory_read_bytes_per_s"])
    assert abs(r["roofline_fraction"] / want - 1) < 1e-9, r
    assert abs(r["read_roofline_fraction"] * r["memory_read_bytes_per_s"] /
               r["implied_bytes_per_s"] - 1) < 1e-9, r
PY
fi
expect_error "--depth wants a comma-separated list" bench model "$tmp/a.gguf" -d 0,x
expect_error "no test to run" bench model "$tmp/a.gguf" --pp 0 --tg 0
# An unwritable --json path fails before any test runs (no table on stdout).
expect_error "cannot create --json file" bench model "$tmp/a.gguf" --json "$tmp/no/such/dir/b.json"
if grep -q "pp512" "$tmp/out"; then fail "bench model ran its tests before refusing --json"; fi
expect_error "--threads wants a comma-separated list" bench model "$tmp/a.gguf" -t 0

# A Hugging Face checkpoint (safetensors, sharded) of the same weights as a GGUF:
# inspect and generate take the directory, and greedy text is the GGUF's.
"$tessera" synth --dim 64 --layers 2 --heads 4 --kv-heads 2 --ffn 96 --type f16 --seed 5 \
  -o "$tmp/c.gguf" >/dev/null || fail "synth f16"
"$tessera" synth --dim 64 --layers 2 --heads 4 --kv-heads 2 --ffn 96 --type f16 --seed 5 \
  --format safetensors --shard-mib 0.05 -o "$tmp/ckpt" >/dev/null || fail "synth safetensors"
[[ -f "$tmp/ckpt/model.safetensors.index.json" && -f "$tmp/ckpt/tokenizer.json" && \
   -f "$tmp/ckpt/config.json" && -f "$tmp/ckpt/tokenizer_config.json" ]] || fail "checkpoint files"
[[ ! -e "$tmp/ckpt/.synth-tmp.gguf" ]] || fail "synth left its temporary GGUF"
"$tessera" inspect "$tmp/ckpt" >"$tmp/out" || fail "inspect checkpoint"
grep -q "tensors check: OK" "$tmp/out" || fail "inspect checkpoint: no 'tensors check: OK'"
grep -q "^checkpoint: " "$tmp/out" || fail "inspect checkpoint: header"
for m in c.gguf ckpt; do
  "$tessera" generate "$tmp/$m" -p "hello world" -n 12 --temp 0 -t 1 >"$tmp/gen_$m" 2>/dev/null \
    || fail "generate $m"
done
cmp -s "$tmp/gen_c.gguf" "$tmp/gen_ckpt" || fail "checkpoint and GGUF generate different text"
mkdir -p "$tmp/empty"
expect_error "not a Hugging Face checkpoint: config.json is missing" inspect "$tmp/empty"
expect_error "needs --type f32, f16 or bf16" synth --dim 64 --layers 1 --heads 4 --ffn 96 \
  --type q8_0 --format safetensors -o "$tmp/q8ckpt"

if [[ -f "$shared/models/stories260K.gguf" ]]; then
  "$tessera" inspect "$shared/models/stories260K.gguf" >"$tmp/out" || fail "inspect stories260K"
  grep -q "heads 8, kv heads 4, head dim 8, ffn 172" "$tmp/out" || fail "stories260K config"
fi
echo "cli tests passed"
