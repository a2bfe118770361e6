#!/usr/bin/env bash
# deploy/slurm/ on a real Slurm: installs slurm-wlm + munge from Debian when they
# are missing, starts a one-node cluster of its own (munged, slurmctld, slurmd on
# ports picked here, state in a temporary directory, nothing of the system's
# configuration touched), then
#   1. sbatch --wait deploy/slurm/generate.sbatch (1 node x 4 tasks: tp 2 x pp 2)
#      and checks the text equals `tessera generate` on one rank;
#   2. sbatch deploy/slurm/serve.sbatch, waits for the API on the node it names,
#      checks a completion against the same text, scancels, and checks that no
#      rank is left.
# Skips (exit 77) with the reason when it cannot install or start Slurm.
#   tests/deploy/slurm_test.sh TESSERA MODEL.gguf      (make test-slurm)
set -uo pipefail
TESSERA=$(realpath "$1")
MODEL=$(realpath "$2")
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
skip() { echo "SKIP: $*"; exit 77; }
fail() { echo "FAIL: $*"; for f in "$WORK"/*.log "$WORK"/*.out; do [ -f "$f" ] && { echo "== $f"; tail -n 30 "$f"; }; done; exit 1; }

[ -f "$MODEL" ] || skip "no model at $MODEL"
if ! command -v slurmctld >/dev/null || ! command -v slurmd >/dev/null || ! command -v munged >/dev/null; then
  [ "$(id -u)" -eq 0 ] || skip "slurm-wlm and munge are not installed and this is not root"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends slurm-wlm munge \
    >/dev/null 2>&1 || skip "apt-get install slurm-wlm munge failed"
fi
[ "$(id -u)" -eq 0 ] || skip "starting slurmd needs root"

WORK=$(mktemp -d /tmp/tessera-slurm.XXXXXX)
PIDS=()
cleanup() {
  [ -n "${SERVE_JOB:-}" ] && scancel "$SERVE_JOB" 2>/dev/null
  for ((i = ${#PIDS[@]} - 1; i >= 0; i--)); do kill "${PIDS[i]}" 2>/dev/null; wait "${PIDS[i]}" 2>/dev/null; done
  rm -rf "$WORK"
}
trap cleanup EXIT
free_port() { /usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

# munge: a key of our own, its socket in $WORK.
dd if=/dev/urandom of="$WORK/munge.key" bs=1024 count=1 status=none
chmod 400 "$WORK/munge.key"
munged --force --foreground --key-file="$WORK/munge.key" --socket="$WORK/munge.sock" \
  --pid-file="$WORK/munged.pid" --log-file="$WORK/munged.log" --seed-file="$WORK/munge.seed" \
  >"$WORK/munged.out" 2>&1 &
PIDS+=($!)
for _ in $(seq 50); do [ -S "$WORK/munge.sock" ] && break; sleep 0.1; done
[ -S "$WORK/munge.sock" ] || skip "munged did not start: $(tail -n 3 "$WORK/munged.log" "$WORK/munged.out" 2>/dev/null)"

HOST=$(hostname -s)
mkdir -p "$WORK/state" "$WORK/spool"
export SLURM_CONF=$WORK/slurm.conf
cat >"$SLURM_CONF" <<CONF
ClusterName=tessera-test
SlurmctldHost=$HOST
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$WORK/munge.sock
CredType=cred/munge
SlurmctldPort=$(free_port)
SlurmdPort=$(free_port)
StateSaveLocation=$WORK/state
SlurmdSpoolDir=$WORK/spool
SlurmctldPidFile=$WORK/slurmctld.pid
SlurmdPidFile=$WORK/slurmd.pid
SlurmctldLogFile=$WORK/slurmctld.log
SlurmdLogFile=$WORK/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SwitchType=switch/none
MpiDefault=none
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SlurmdParameters=config_overrides
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
ReturnToService=2
NodeName=$HOST CPUs=4 State=UNKNOWN
PartitionName=test Nodes=$HOST Default=YES MaxTime=INFINITE State=UP
CONF
slurmctld -D -i -f "$SLURM_CONF" >"$WORK/slurmctld.out" 2>&1 &
PIDS+=($!)
slurmd -D -f "$SLURM_CONF" -N "$HOST" >"$WORK/slurmd.out" 2>&1 &
PIDS+=($!)
state=""
for _ in $(seq 100); do
  state=$(sinfo -h -o %T 2>/dev/null | head -n 1)
  [ "$state" = idle ] && break
  sleep 0.2
done
[ "$state" = idle ] || skip "the one-node Slurm did not come up (node state '$state'): $(tail -n 3 "$WORK/slurmctld.log" "$WORK/slurmd.log" 2>/dev/null | tr '\n' ' ')"
echo "slurm up: node $HOST idle ($(sinfo -V))"

PROMPT="Once upon a time"
WANT=$("$TESSERA" generate "$MODEL" -p "$PROMPT" -n 64 --temp 0 -t 1 2>/dev/null)
[ -n "$WANT" ] || fail "tessera generate on one rank printed nothing"

# 1. generate over 4 tasks.
cd "$WORK" || exit 1
start=$(date +%s.%N)
sbatch --wait --quiet --nodes=1 --ntasks-per-node=4 --cpus-per-task=1 --output="$WORK/generate.out" \
  --export=ALL,TESSERA="$TESSERA" "$ROOT/deploy/slurm/generate.sbatch" "$MODEL" "$PROMPT" \
  || fail "generate.sbatch failed"
echo "generate.sbatch: $(echo "$(date +%s.%N) - $start" | bc) s"
grep -q "tp 2 x pp 2" "$WORK/generate.out" || fail "generate.sbatch did not run tp 2 x pp 2"
grep -qF "$WANT" "$WORK/generate.out" || fail "tp 2 x pp 2 under srun differs from one rank: $(cat "$WORK/generate.out")"
echo "generate.sbatch: 4 ranks under srun print the one-rank text"

# 2. serve over 4 tasks, then scancel.
PORT=$(free_port)
SERVE_JOB=$(sbatch --parsable --nodes=1 --ntasks-per-node=4 --cpus-per-task=1 --output="$WORK/serve.out" \
  --export=ALL,TESSERA="$TESSERA",TESSERA_PORT="$PORT",MASTER_PORT="$(free_port)" \
  "$ROOT/deploy/slurm/serve.sbatch" "$MODEL") || fail "sbatch serve.sbatch failed"
url=""
for _ in $(seq 300); do
  url=$(grep -o 'http://[^ ]*/' "$WORK/serve.out" 2>/dev/null | head -n 1)
  [ -n "$url" ] && curl -sf "${url}health" >/dev/null 2>&1 && break
  sleep 0.2
done
curl -sf "${url}health" >/dev/null || fail "serve.sbatch's server did not answer at '${url}health'"
got=$(curl -sf "${url}v1/completions" -H 'Content-Type: application/json' \
  -d "{\"prompt\": \"$PROMPT\", \"max_tokens\": 64, \"temperature\": 0}" |
  /usr/bin/python3 -c 'import json,sys; print(json.load(sys.stdin)["choices"][0]["text"])')
[ -n "$got" ] || fail "serve.sbatch's server answered no text"
[[ "$WANT" == *"$PROMPT$got"* ]] || fail "served text '$got' is not the one-rank text '$WANT'"
ranks=$(curl -sf "${url}ui/state" | /usr/bin/python3 -c 'import json,sys; print(len(json.load(sys.stdin)["ranks"]))')
[ "$ranks" = 4 ] || fail "the live view shows $ranks ranks"
echo "serve.sbatch: $url answers with the one-rank text; live view shows 4 ranks"
scancel "$SERVE_JOB"
for _ in $(seq 100); do [ -z "$(squeue -h -j "$SERVE_JOB" 2>/dev/null)" ] && break; sleep 0.2; done
[ -z "$(squeue -h -j "$SERVE_JOB" 2>/dev/null)" ] || fail "the serve job did not end after scancel"
SERVE_JOB=""
sleep 1
if pgrep -f "$TESSERA serve $MODEL --host 0.0.0.0 --port $PORT" >/dev/null; then
  fail "ranks left after scancel"
fi
echo PASS
