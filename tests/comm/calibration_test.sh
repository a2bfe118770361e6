#!/usr/bin/env bash
# The copy-mode calibration between rank processes (docs/comm.md, "Single copy"):
# `bench comm --calibrate` measures streamed against single-copy exchanges, prints
# the table and writes the host's cache; the next job reads it (cached); the
# environment's window wins (env); TESSERA_COMM_CALIBRATION=off keeps the defaults;
# a corrupt cache is measured again. Checks the lines and the cache, not the
# timings. Usage: calibration_test.sh TESSERA. Exits 77 (CTest: skipped) when the
# tessera binary is not built in this build tree.
set -uo pipefail
tessera=$1
[[ -x "$tessera" ]] || { echo "tessera not built here: $tessera"; exit 77; }
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
export TESSERA_CACHE_DIR=$dir/cache
unset TESSERA_SHM_SINGLE_COPY_BYTES TESSERA_SHM_SINGLE_COPY_MAX_BYTES TESSERA_COMM_CALIBRATION
bench() {
  "$tessera" bench comm --np 2 --transport shm --op allgather -b 1M -e 1M --iters 2 --warmup 1 \
    --check --timeout-ms 60000 "$@"
}
fail() { echo "FAIL: $*"; echo "$out"; exit 1; }

out=$(bench --calibrate) || fail "bench comm --calibrate"
echo "$out" | grep '^# copy mode'
grep -q '^# copy mode: .*(calibrated in [0-9]* ms; cache ' <<<"$out" || fail "not calibrated"
grep -q '^# decision: single copy ' <<<"$out" || fail "no decision line"
[[ $(echo "$out" | grep -cE "^ +[0-9]+( +[0-9.]+){4} +[0-9]+ (stream|single copy)$") -ge 5 ]] ||
  fail "no calibration table"
cache=$(ls "$TESSERA_CACHE_DIR"/comm-calibration-*.json) || fail "no cache file"
grep -q '"single_copy_min_bytes"' "$cache" || fail "cache without a decision"
[[ $(ls "$TESSERA_CACHE_DIR" | wc -l) -eq 1 ]] || fail "temporary files left in the cache dir"

out=$(bench) || fail "bench comm (cached)"
grep -q '^# copy mode: .*(cached; cache ' <<<"$out" || fail "the second job did not read the cache"

out=$(TESSERA_SHM_SINGLE_COPY_BYTES=64k bench) || fail "bench comm (env)"
grep -q '^# copy mode: .* \[64 KiB, 8 MiB) (env' <<<"$out" || fail "the environment did not win"

out=$(TESSERA_COMM_CALIBRATION=off bench) || fail "bench comm (off)"
grep -q '^# copy mode: .* never (default' <<<"$out" || fail "off did not keep the defaults"

echo '{"version": 1, "host":' > "$cache"
out=$(bench 2>&1) || fail "bench comm (corrupt cache)"
grep -q 'is corrupt' <<<"$out" || fail "no warning about the corrupt cache"
grep -q '^# copy mode: .*(calibrated in' <<<"$out" || fail "a corrupt cache was not measured again"
grep -q '"single_copy_min_bytes"' "$cache" || fail "the corrupt cache was not rewritten"
echo "calibration: measured, cached, env and off as expected"
