#!/usr/bin/env bash
# Runs every libFuzzer target in BUILD_DIR/bin (*_fuzz) for FUZZ_SECONDS seconds
# each (default 30), starting from its committed seed corpus fuzz/corpus/<name
# without _fuzz>. New inputs go to a scratch directory, not the committed corpus.
# A crash leaves its reproducer in BUILD_DIR/fuzz-artifacts/ and fails the script.
# Usage: scripts/run-fuzzers.sh [BUILD_DIR]   (make fuzz uses build-fuzz)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-build-fuzz}
[[ "$build" = /* ]] || build="$root/$build"
seconds=${FUZZ_SECONDS:-30}
shopt -s nullglob
fuzzers=("$build"/bin/*_fuzz)
if [[ ${#fuzzers[@]} -eq 0 ]]; then
  echo "run-fuzzers: no *_fuzz binaries in $build/bin (configure with the fuzz preset)" >&2
  exit 1
fi
mkdir -p "$build/fuzz-artifacts"
for fuzzer in "${fuzzers[@]}"; do
  name=$(basename "$fuzzer" _fuzz)
  seeds="$root/fuzz/corpus/$name"
  scratch="$build/fuzz-corpus/$name"
  mkdir -p "$scratch"
  echo "run-fuzzers: $name for ${seconds}s (seeds: $seeds)"
  log="$build/fuzz-artifacts/${name}.log"
  set +e
  "$fuzzer" -max_total_time="$seconds" -max_len=65536 -rss_limit_mb=2048 -timeout=10 \
    -print_final_stats=1 -artifact_prefix="$build/fuzz-artifacts/${name}-" \
    "$scratch" "$seeds" >"$log" 2>&1
  status=$?
  set -e
  grep -E '^(#[0-9]+ +DONE|stat::number_of_executed_units|stat::peak_rss_mb|==[0-9]+==ERROR|SUMMARY)' "$log" || true
  if [[ $status -ne 0 ]]; then
    tail -n 40 "$log" >&2
    echo "run-fuzzers: $name FAILED (exit $status); log $log, reproducers in $build/fuzz-artifacts/" >&2
    exit 1
  fi
done
echo "run-fuzzers: all fuzzers ran clean"
