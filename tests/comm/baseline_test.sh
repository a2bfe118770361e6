#!/usr/bin/env bash
# `tessera bench comm --baseline` measures the machine's limits in the run: memory
# copy on 1 and 2 threads, TCP loopback one way and both ways from cache-resident
# buffers, one way again from and into 64 MiB buffers, and the cache-line round
# trip. Checks the line printed and that each bandwidth lands in the --json baseline
# record as a positive number (the round trip is 0 on a one-CPU machine, so only
# its presence is checked).
# Usage: baseline_test.sh TESSERA. Exits 77 (CTest: skipped) when the tessera
# binary is not built in this build tree (`make test`'s ASan pass).
set -uo pipefail
tessera=$1
[[ -x "$tessera" ]] || { echo "tessera not built here: $tessera"; exit 77; }
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
out=$("$tessera" bench comm --np 2 --transport tcp --op allreduce -b 8 -e 8 --iters 2 \
  --warmup 1 --baseline --json "$dir/b.json" --timeout-ms 60000) || { echo "$out"; exit 1; }
echo "$out" | grep '^# baseline'
grep -q 'GB/s one way ([0-9.]* from and into 64 MiB buffers)' <<<"$out" ||
  { echo "no memory-sized loopback figure in the baseline line"; exit 1; }
for field in memcpy_1t_gbps memcpy_2t_gbps tcp_one_way_gbps tcp_both_ways_gbps \
  tcp_one_way_memory_gbps; do
  value=$(grep -o "\"$field\":[0-9.]*" "$dir/b.json" | cut -d: -f2)
  [[ -n "$value" ]] || { echo "$field missing from the JSON baseline record"; exit 1; }
  awk -v v="$value" 'BEGIN { exit !(v > 0) }' || { echo "$field is $value"; exit 1; }
done
grep -q '"cacheline_roundtrip_us":[0-9.]*' "$dir/b.json" ||
  { echo "cacheline_roundtrip_us missing from the JSON baseline record"; exit 1; }
echo "baseline figures present and positive"
