#!/usr/bin/env bash
# Rank processes on one host: every collective checked against its exact reference
# (`tessera bench comm --check`, non-zero exit on any wrong element) at sizes that go
# as single copy (process_vm_readv between the processes) and above; messages from
# 512 KiB are also copied past the cache (TESSERA_COPY_BYPASS_CACHE_BYTES). Single copy
# starts at 64 KiB here (TESSERA_SHM_SINGLE_COPY_BYTES; off by default). Then the same
# with the buffers in shared memory (--register): messages from 16 KiB are read in
# place from the sender's shared buffer.
# Usage: single_copy_test.sh TESSERA. Exits 77 (CTest: skipped) when the tessera
# binary is not built in this build tree (`make test`'s ASan pass).
set -uo pipefail
tessera=$1
[[ -x "$tessera" ]] || { echo "tessera not built here: $tessera"; exit 77; }
TESSERA_SHM_SINGLE_COPY_BYTES=64K TESSERA_COPY_BYPASS_CACHE_BYTES=512K "$tessera" bench comm \
  --np 3 --op all -b 64K -e 4M --iters 2 --warmup 1 --check --timeout-ms 60000 || exit 1
TESSERA_SHM_SHARED_BUFFER_BYTES=16K TESSERA_COPY_BYPASS_CACHE_BYTES=512K exec "$tessera" bench \
  comm --np 3 --op all -b 16K -e 4M --iters 2 --warmup 1 --check --register --timeout-ms 60000
