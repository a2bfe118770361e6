#!/usr/bin/env bash
# The MPI transport across rank processes started by mpirun (Open MPI on this host):
#  1. every collective checked against its exact reference over MPI (np 3);
#     ... and with MPI's own all-gather and all-to-all(v) (TESSERA_MPI_COLLECTIVES);
#  2. `tessera generate --tp 2 --pp 2` with every link on MPI, and with two
#     "hosts" (TESSERA_HOST_ID per rank: shared memory inside each, MPI between):
#     logits bit-identical to one rank; `--ep 2 --ledger` on MPI's collectives:
#     identical logits, ledger equal to the planner's prediction;
#  3. --transport mpi without an MPI launcher: refused, saying how to start it;
#  4. kill -9 of one rank mid-run, or SIGSTOP (frozen: tessera's heartbeat, not
#     MPI, notices): the MPI job ends within seconds, no hang;
#  5. two hosts as network namespaces (root; mpirun starts the far rank's daemon
#     through scripts/netns-rsh-agent.sh): auto picks MPI between them (Open MPI's
#     TCP), every all-reduce and all-gather exact.
#   tests/comm/mpi_test.sh TESSERA SHARED_DIR
set -u
TESSERA=${1:?usage: mpi_test.sh TESSERA SHARED_DIR}
SHARED=${2:?usage: mpi_test.sh TESSERA SHARED_DIR}
[ -x "$TESSERA" ] || { echo "SKIP: the tessera CLI is not built in this tree"; exit 77; }
"$TESSERA" version | grep -q '^transports:.* mpi' || { echo "SKIP: built without MPI"; exit 77; }
command -v mpirun > /dev/null || { echo "SKIP: no mpirun"; exit 77; }
MODEL=$SHARED/models/stories260K.gguf
[ -f "$MODEL" ] || { echo "SKIP: no shared models"; exit 77; }
OUT=$(mktemp -d /tmp/tessera-mpi.XXXXXX)
trap 'rm -rf "$OUT"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# Under AddressSanitizer (make test's ASan pass) Open MPI's own allocations at
# MPI_Init read as leaks: leak detection off, every other check on.
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"
# Ranks as processes of this host, shared memory between them inside Open MPI.
MPIRUN=(timeout 120 mpirun --oversubscribe --mca btl self,vader -x ASAN_OPTIONS)

# 1. The collectives, exact.
"${MPIRUN[@]}" -np 3 "$TESSERA" bench comm --transport mpi --op all -b 8 -e 1M --iters 2 \
  --warmup 1 --check --timeout-ms 60000 > "$OUT/bench.txt" 2>&1 || fail "bench comm: $(tail -20 "$OUT/bench.txt")"
grep -q 'mpi (world rank' "$OUT/bench.txt" || grep -q '#wrong' "$OUT/bench.txt" || fail "no bench output"
echo "ok: every collective over MPI, np 3, exact ($(grep -c '^ *[0-9]' "$OUT/bench.txt") rows)"
TESSERA_MPI_COLLECTIVES=all "${MPIRUN[@]}" -np 3 -x TESSERA_MPI_COLLECTIVES "$TESSERA" bench comm \
  --transport mpi --op allgather --op alltoall --op alltoallv --op alltoallvskew -b 8 -e 1M \
  --iters 2 --warmup 1 --check --timeout-ms 60000 > "$OUT/bench-mpi.txt" 2>&1 ||
  fail "bench comm on MPI's collectives: $(tail -20 "$OUT/bench-mpi.txt")"
rows=$(grep -c '^ *[0-9].* mpi ' "$OUT/bench-mpi.txt")
[ "$rows" -ge 60 ] || fail "MPI's collectives were not used ($rows rows): $(head -12 "$OUT/bench-mpi.txt")"
echo "ok: all-gather and all-to-all(v) on MPI's own collectives, np 3, exact ($rows rows)"
TESSERA_MPI_COLLECTIVES=allgather,bogus "${MPIRUN[@]}" -np 2 -x TESSERA_MPI_COLLECTIVES "$TESSERA" \
  bench comm --transport mpi --op allgather -b 8 -e 8 > "$OUT/bogus.txt" 2>&1 &&
  fail "TESSERA_MPI_COLLECTIVES=allgather,bogus was accepted"
grep -q "TESSERA_MPI_COLLECTIVES='allgather,bogus' is not known" "$OUT/bogus.txt" ||
  fail "TESSERA_MPI_COLLECTIVES=allgather,bogus: $(head -5 "$OUT/bogus.txt")"

# 2. Bit-identical logits.
GEN=(generate "$MODEL" -p "Once upon a time there was" -n 12 --temp 0 --ignore-eos --batch 3
     --prefill-chunk 4 --timeout-ms 30000)
"$TESSERA" "${GEN[@]}" --dump-logits "$OUT/single.bin" > "$OUT/single.txt" 2>&1 ||
  fail "single rank: $(cat "$OUT/single.txt")"
"${MPIRUN[@]}" -np 4 "$TESSERA" "${GEN[@]}" --tp 2 --pp 2 --transport mpi \
  --dump-logits "$OUT/mpi.bin" > "$OUT/mpi.txt" 2>&1 || fail "--transport mpi: $(tail -20 "$OUT/mpi.txt")"
cmp -s "$OUT/single.bin" "$OUT/mpi.bin" || fail "--transport mpi: logits differ from one rank"
grep -q 'mpi' "$OUT/mpi.txt" || fail "--transport mpi: the rank report names no mpi link: $(cat "$OUT/mpi.txt")"
echo "ok: --tp 2 --pp 2 --transport mpi bit-identical to one rank"
# Two hosts: ranks 0-1 and 2-3 (one pipeline stage each); auto: shm inside, MPI between.
"${MPIRUN[@]}" -np 2 -x TESSERA_HOST_ID=host-a "$TESSERA" "${GEN[@]}" --tp 2 --pp 2 \
  --dump-logits "$OUT/mixed.bin" : -np 2 -x TESSERA_HOST_ID=host-b "$TESSERA" "${GEN[@]}" \
  --tp 2 --pp 2 --dump-logits "$OUT/mixed.bin" > "$OUT/mixed.txt" 2>&1 ||
  fail "two hosts: $(tail -20 "$OUT/mixed.txt")"
cmp -s "$OUT/single.bin" "$OUT/mixed.bin" || fail "two hosts: logits differ from one rank"
grep -q 'shm' "$OUT/mixed.txt" && grep -q 'mpi' "$OUT/mixed.txt" ||
  fail "two hosts: expected shm and mpi links: $(cat "$OUT/mixed.txt")"
echo "ok: two hosts under mpirun (shm inside, MPI between) bit-identical to one rank"
# Expert parallelism on MPI's all-to-allv and all-gather: same logits, ledger = model.
MOE=$SHARED/models/stories260K-moe4x2.gguf
GEN_MOE=(generate "$MOE" -p "Once upon a time there was" -n 12 --temp 0 --ignore-eos --batch 3
         --prefill-chunk 4 --timeout-ms 30000)
"$TESSERA" "${GEN_MOE[@]}" --dump-logits "$OUT/moe-single.bin" > "$OUT/moe-single.txt" 2>&1 ||
  fail "MoE single rank: $(cat "$OUT/moe-single.txt")"
TESSERA_MPI_COLLECTIVES=all "${MPIRUN[@]}" -np 2 -x TESSERA_MPI_COLLECTIVES "$TESSERA" "${GEN_MOE[@]}" \
  --ep 2 --transport mpi --ledger --dump-logits "$OUT/moe-mpi.bin" > "$OUT/moe-mpi.txt" 2>&1 ||
  fail "--ep 2 on MPI's collectives: $(tail -20 "$OUT/moe-mpi.txt")"
cmp -s "$OUT/moe-single.bin" "$OUT/moe-mpi.bin" || fail "--ep 2 on MPI's collectives: logits differ"
grep -q 'ep/all_to_allv.* ok$' "$OUT/moe-mpi.txt" || fail "--ep 2 ledger: $(grep all_to_allv "$OUT/moe-mpi.txt")"
grep -q '| model.*!!' "$OUT/moe-mpi.txt" && fail "--ep 2 on MPI's collectives: the ledger differs from the model"
echo "ok: --ep 2 on MPI's all-to-allv bit-identical to one rank, ledger = model"

# 3. Without an MPI launcher.
"$TESSERA" "${GEN[@]}" --tp 2 --transport mpi > "$OUT/nompi.txt" 2>&1 && fail "--transport mpi without mpirun was accepted"
grep -q 'one MPI launcher' "$OUT/nompi.txt" || fail "--transport mpi without mpirun: $(cat "$OUT/nompi.txt")"
echo "ok: --transport mpi without mpirun refused: $(grep -o 'transport mpi needs.*' "$OUT/nompi.txt" | head -1 | cut -c1-100)"

# 4. A killed or frozen rank ends the MPI job within seconds.
stop_one_rank() {
  local signal=$1 needle=$2
  "${MPIRUN[@]}" -np 2 "$TESSERA" bench comm --transport mpi --op allreduce -b 256K -e 256K \
    --iters 100000000 --timeout-ms 60000 > "$OUT/kill.txt" 2>&1 &
  local job=$! victim="" pid
  for _ in $(seq 1 100); do
    for pid in $(pgrep -f "tessera bench comm --transport mpi --op allreduce -b 256K"); do
      tr '\0' '\n' < "/proc/$pid/environ" 2>/dev/null | grep -qx 'OMPI_COMM_WORLD_RANK=1' && victim=$pid
    done
    [ -n "$victim" ] && break
    sleep 0.1
  done
  [ -n "$victim" ] || { kill "$job"; fail "rank 1 never started: $(cat "$OUT/kill.txt")"; }
  # Past MPI_Init and the rendezvous (the op's header is printed once the
  # communicator is up): a rank stopped inside MPI_Init blocks the others there,
  # where no tessera heartbeat runs yet, and only mpirun's timeout ends the job.
  for _ in $(seq 1 600); do
    grep -q '^# allreduce' "$OUT/kill.txt" 2> /dev/null && break
    sleep 0.1
  done
  grep -q '^# allreduce' "$OUT/kill.txt" || { kill "$job"; fail "the benchmark never started: $(cat "$OUT/kill.txt")"; }
  sleep 1
  local start rc took
  start=$(date +%s)
  kill "-$signal" "$victim"
  wait "$job"
  rc=$?
  took=$(( $(date +%s) - start ))
  kill -9 "$victim" 2> /dev/null
  [ "$rc" != 0 ] || fail "the job exited 0 after SIG$signal of a rank"
  [ "$took" -le 20 ] || fail "the job took ${took}s to end after SIG$signal of a rank"
  grep -q "$needle" "$OUT/kill.txt" || fail "SIG$signal: expected '$needle' in: $(cat "$OUT/kill.txt")"
  echo "ok: SIG$signal of rank 1 ended the MPI job in ${took}s (exit $rc): $(grep -o "$needle.*" "$OUT/kill.txt" | head -1 | cut -c1-90)"
}
stop_one_rank KILL "exited on signal 9"
stop_one_rank STOP "stopped responding"

# 5. Two network-namespace hosts, MPI between them.
ID=$$
# shellcheck source=../../scripts/netns-pair.sh
source "$(dirname "$0")/../../scripts/netns-pair.sh"
if ! netns_pair_up tmpi; then
  echo "skipped 5: $NETNS_ERROR"
  exit 0
fi
trap 'netns_pair_down; rm -rf "$OUT"' EXIT
export "TESSERA_NETNS_OF_${A1//./_}=$NS1"
ip netns exec "$NS0" timeout 120 mpirun -x ASAN_OPTIONS --mca plm_rsh_agent "$(dirname "$0")/../../scripts/netns-rsh-agent.sh" \
  --mca btl self,vader,tcp --mca oob_tcp_if_include "$A0/24" --mca btl_tcp_if_include "$A0/24" \
  -H "localhost:1,$A1:1" -np 2 "$TESSERA" bench comm --op allreduce --op allgather -b 8 -e 64K \
  --iters 2 --warmup 1 --check --timeout-ms 60000 > "$OUT/netns.txt" 2>&1 ||
  fail "two namespace hosts: $(tail -20 "$OUT/netns.txt")"
grep -q 'transport mpi (world rank 1)' "$OUT/netns.txt" || fail "two namespace hosts: not over MPI: $(head -3 "$OUT/netns.txt")"
echo "ok: two namespace hosts, MPI (Open MPI over TCP) between them, all-reduce and all-gather exact"
