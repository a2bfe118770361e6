#!/usr/bin/env bash
# Runs `tessera bench comm` and the Open MPI reference benchmark (tessera_mpi_bench)
# interleaved — tessera, MPI, tessera, MPI, … per op — so both see the same
# machine state, then prints per op and size: tessera busbw, MPI busbw, ratio
# (best of the rounds for each). The baseline (memcpy, TCP loopback, cache-line
# round trip) is measured in the same run. With --register, two more runs per op and
# round: tessera with its buffers in shared memory (`bench comm --register`,
# nccl-tests' -R: same-host peers read them in place), and Open MPI with its buffers
# from MPI_Alloc_mem (its own allocator); the shared column's ratio is against the
# faster of Open MPI's two.
#
#   bench/compare-mpi.sh [--build DIR] [--np 2] [--transport shm|tcp]
#                        [--ops "allreduce allgather reducescatter alltoall"]
#                        [--min-bytes 8] [--max-bytes 256M] [--rounds 2] [--register]
set -euo pipefail
BUILD=build
NP=2
TRANSPORT=shm
OPS="allreduce allgather reducescatter alltoall"
MIN=8
MAX=256M
ROUNDS=2
REGISTER=0
while [ $# -gt 0 ]; do
  case "$1" in
    --build) BUILD=$2; shift 2 ;;
    --np) NP=$2; shift 2 ;;
    --transport) TRANSPORT=$2; shift 2 ;;
    --ops) OPS=$2; shift 2 ;;
    --min-bytes) MIN=$2; shift 2 ;;
    --max-bytes) MAX=$2; shift 2 ;;
    --rounds) ROUNDS=$2; shift 2 ;;
    --register) REGISTER=1; shift ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
done
TESSERA=$BUILD/bin/tessera
MPIBENCH=$BUILD/bin/tessera_mpi_bench
for b in "$TESSERA" "$MPIBENCH"; do
  [ -x "$b" ] || { echo "missing $b (build it: cmake --build $BUILD)" >&2; exit 1; }
done
MPIRUN=(mpirun -np "$NP")
[ "$(id -u)" = 0 ] && MPIRUN+=(--allow-run-as-root)
MPIRUN+=(--oversubscribe)
if [ "$TRANSPORT" = tcp ]; then
  MPIRUN+=(--mca btl self,tcp)
else
  MPIRUN+=(--mca btl self,vader)
fi
OUT=$(mktemp -d /tmp/tessera-compare.XXXXXX)
trap 'rm -rf "$OUT"' EXIT

echo "# compare-mpi: np $NP, transport $TRANSPORT, ops: $OPS, sizes $MIN..$MAX, $ROUNDS interleaved rounds"
echo "# load before: $(cut -d' ' -f1-3 /proc/loadavg)"
"$TESSERA" bench comm --np "$NP" --transport "$TRANSPORT" --op allreduce -b 8 -e 8 --baseline \
  --json "$OUT/baseline.json" | grep '^# baseline' || true
for round in $(seq 1 "$ROUNDS"); do
  for op in $OPS; do
    "$TESSERA" bench comm --np "$NP" --transport "$TRANSPORT" --op "$op" -b "$MIN" -e "$MAX" \
      --json "$OUT/tessera-$op-$round.json" > "$OUT/tessera-$op-$round.txt"
    if [ "$REGISTER" = 1 ]; then
      "$TESSERA" bench comm --np "$NP" --transport "$TRANSPORT" --op "$op" -b "$MIN" -e "$MAX" \
        --register --json "$OUT/shared-$op-$round.json" > "$OUT/shared-$op-$round.txt"
      "${MPIRUN[@]}" "$MPIBENCH" --op "$op" -b "$MIN" -e "$MAX" --alloc-mem \
        --json "$OUT/mpialloc-$op-$round.json" > "$OUT/mpialloc-$op-$round.txt" \
        2> "$OUT/mpialloc-$op-$round.err" || {
          echo "mpirun failed:" >&2; cat "$OUT/mpialloc-$op-$round.err" >&2; exit 1; }
    fi
    "${MPIRUN[@]}" "$MPIBENCH" --op "$op" -b "$MIN" -e "$MAX" \
      --json "$OUT/mpi-$op-$round.json" > "$OUT/mpi-$op-$round.txt" 2> "$OUT/mpi-$op-$round.err" || {
        echo "mpirun failed:" >&2; cat "$OUT/mpi-$op-$round.err" >&2; exit 1; }
  done
done
echo "# load after: $(cut -d' ' -f1-3 /proc/loadavg)"
python3 - "$OUT" <<'PY'
import glob, json, os, sys
out = sys.argv[1]
best = {}
lat = {}
for path in glob.glob(os.path.join(out, "*-*-*.json")):
    system = os.path.basename(path).split("-")[0]
    for rec in json.load(open(path)):
        if rec.get("op") == "baseline":
            continue
        key = (rec["op"], rec["bytes"])
        cur = best.setdefault(key, {})
        # Best of the rounds: highest busbw, lowest time.
        if system not in cur or rec["time_us"] < cur[system]["time_us"]:
            cur[system] = rec
shared = any("shared" in cur for cur in best.values())
print("#")
head = "# %-14s %12s %12s %12s %12s %12s %7s" % ("op", "size(B)", "tessera_us", "mpi_us",
                                                 "tessera_bus", "mpi_bus", "ratio")
if shared:
    head += " %12s %12s %12s %7s" % ("mpialloc_us", "shared_us", "shared_bus", "ratio")
print(head)
for (op, size) in sorted(best, key=lambda k: (k[0], k[1])):
    cur = best[(op, size)]
    if "tessera" not in cur or "mpi" not in cur:
        continue
    t, m = cur["tessera"], cur["mpi"]
    ratio = m["time_us"] / t["time_us"] if t["time_us"] > 0 else 0.0
    line = "  %-14s %12d %12.2f %12.2f %12.2f %12.2f %7.2f" % (
        op, size, t["time_us"], m["time_us"], t["busbw_gbps"], m["busbw_gbps"], ratio)
    if shared and "shared" in cur and "mpialloc" in cur:
        s, a = cur["shared"], cur["mpialloc"]
        mpi_best = min(m["time_us"], a["time_us"])
        line += " %12.2f %12.2f %12.2f %7.2f" % (
            a["time_us"], s["time_us"], s["busbw_gbps"],
            mpi_best / s["time_us"] if s["time_us"] > 0 else 0.0)
    print(line)
print("# ratio = MPI time / tessera time = tessera busbw / MPI busbw (> 1: tessera faster)")
if shared:
    print("# mpialloc: Open MPI with buffers from MPI_Alloc_mem; shared: tessera with its "
          "buffers in shared memory (bench comm --register); its ratio is against the faster "
          "of mpi and mpialloc")
PY
