#!/usr/bin/env bash
# Chaos runs against `tessera serve` over local ranks: under a bounded load
# (`tessera bench serve`), a random rank that is not the driver is killed (-9) or
# frozen (SIGSTOP) at a random moment, RUNS times per layout. Each run must end in
# recovery (a restart counted in /metrics, /health 200 again) within 30 s and
# every request of the load must complete (none failed, none lost); at the end,
# SIGTERM must leave no rank process and no shared-memory segment of any epoch.
# Prints one line per run and the recovery time's p50/p99 per layout.
#
#   tests/chaos/serve_chaos.sh TESSERA MODEL [RUNS] [LAYOUT ...]
#   LAYOUT: "tp2" (default: tp2 and tp2pp2)
# Needs: curl, python3 (JSON of the load generator). Not root: the link faults
# between network-namespace hosts are not part of it.
set -euo pipefail

tessera=${1:?usage: serve_chaos.sh TESSERA MODEL [RUNS] [LAYOUT ...]}
model=${2:?usage: serve_chaos.sh TESSERA MODEL [RUNS] [LAYOUT ...]}
runs=${3:-10}
shift $(($# < 3 ? $# : 3))
layouts=("$@")
[ ${#layouts[@]} -gt 0 ] || layouts=(tp2 tp2pp2)

work=$(mktemp -d /tmp/tessera-chaos.XXXXXX)
server_pid=
cleanup() {
  [ -n "$server_pid" ] && kill -9 -- "-$server_pid" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

fail() {
  echo "chaos: FAIL: $*" >&2
  [ -f "$work/serve.log" ] && tail -20 "$work/serve.log" >&2
  exit 1
}

metric() {  # metric NAME: its value on /metrics, or -1
  curl -sf "$url/metrics" | awk -v k="$1" '$1 == k { print $2; found = 1 } END { if (!found) print -1 }'
}

env_of() {  # env_of PID KEY
  tr '\0' '\n' <"/proc/$1/environ" 2>/dev/null | sed -n "s/^$2=//p"
}

now() { date +%s.%N; }

percentile() {  # percentile P < values
  sort -g | awk -v p="$1" '{ v[NR] = $1 } END { i = int((NR - 1) * p / 100 + 0.5) + 1; print v[i] }'
}

for layout in "${layouts[@]}"; do
  tp=$(sed -n 's/.*tp\([0-9]*\).*/\1/p' <<<"$layout")
  pp=$(sed -n 's/.*pp\([0-9]*\).*/\1/p' <<<"$layout")
  tp=${tp:-1}
  pp=${pp:-1}
  world=$((tp * pp))
  driver=$(((pp - 1) * tp))  # the last stage's first rank drives and serves
  port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  url="http://127.0.0.1:$port"
  TESSERA_COMM_FROZEN_MS=${TESSERA_COMM_FROZEN_MS:-2000} setsid "$tessera" serve "$model" \
    --port "$port" -t 1 --tp "$tp" --pp "$pp" --max-restarts 100000 \
    >"$work/serve.log" 2>&1 &
  server_pid=$!
  for _ in $(seq 600); do
    curl -sf "$url/health" >/dev/null 2>&1 && break
    sleep 0.05
  done
  curl -sf "$url/health" >/dev/null || fail "$layout: the server did not start"
  job=
  for child in $(pgrep -P "$server_pid"); do job=$(env_of "$child" TESSERA_JOB_ID); done
  [ -n "$job" ] || fail "$layout: no TESSERA_JOB_ID on the ranks"

  : >"$work/recovery.txt"
  for run in $(seq "$runs"); do
    restarts_before=$(metric tessera_engine_restarts_total)
    "$tessera" bench serve --base-url "$url" -n 24 --max-concurrency 4 --input-len 16 \
      --output-len 48 --ignore-eos --seed "$run" --timeout 120 --json "$work/load.json" \
      >"$work/load.log" 2>&1 &
    load=$!
    sleep "0.$((RANDOM % 5 + 1))"
    workers=()
    for child in $(pgrep -P "$server_pid"); do
      rank=$(env_of "$child" RANK)
      [ -n "$rank" ] && [ "$rank" != "$driver" ] && workers+=("$child:$rank")
    done
    [ ${#workers[@]} -eq $((world - 1)) ] || fail "$layout run $run: ${#workers[@]} workers"
    victim=${workers[$((RANDOM % ${#workers[@]}))]}
    if ((RANDOM % 2)); then fault=kill; signal=KILL; else fault=stop; signal=STOP; fi
    start=$(now)
    kill -s "$signal" "${victim%%:*}"
    # A request after the fault: the load may be over, and an idle frozen rank is
    # only found by the next step that waits on it.
    curl -s -o "$work/probe.json" -w '%{http_code}' "$url/v1/completions" \
      -H 'Content-Type: application/json' \
      -d '{"prompt":"Once upon a time","max_tokens":16,"temperature":0}' >"$work/probe.code" &
    probe=$!
    recovered=
    while :; do
      elapsed=$(awk -v a="$(now)" -v b="$start" 'BEGIN { print a - b }')
      if [ "$(metric tessera_engine_restarts_total)" != "$restarts_before" ] &&
        curl -sf "$url/health" >/dev/null 2>&1; then
        recovered=$elapsed
        break
      fi
      awk -v e="$elapsed" 'BEGIN { exit !(e > 30) }' && break
      sleep 0.02
    done
    [ -n "$recovered" ] || fail "$layout run $run: no recovery within 30 s after $fault of rank ${victim#*:}"
    wait "$probe" || true
    [ "$(cat "$work/probe.code")" = 200 ] ||
      fail "$layout run $run: the request sent after the fault got $(cat "$work/probe.code"): $(cat "$work/probe.json")"
    wait "$load" || fail "$layout run $run: the load generator failed: $(tail -3 "$work/load.log")"
    read -r completed failed < <(python3 -c 'import json, sys; j = json.load(open(sys.argv[1])); print(j["completed"], j["failed"])' "$work/load.json")
    [ "$completed" = 24 ] && [ "$failed" = 0 ] ||
      fail "$layout run $run: $completed of 24 requests completed, $failed failed"
    printf '%s run %3d: %-4s rank %s -> recovered in %.2f s, 24/24 + 1 requests completed\n' \
      "$layout" "$run" "$fault" "${victim#*:}" "$recovered"
    echo "$recovered" >>"$work/recovery.txt"
  done

  ranks=$(pgrep -P "$server_pid" | tr '\n' ' ')
  kill -TERM "$server_pid"
  for _ in $(seq 200); do kill -0 "$server_pid" 2>/dev/null || break; sleep 0.05; done
  kill -0 "$server_pid" 2>/dev/null && fail "$layout: the server did not stop on SIGTERM"
  wait "$server_pid" || fail "$layout: the server exited with $?"
  server_pid=
  for r in $ranks; do kill -0 "$r" 2>/dev/null && fail "$layout: rank pid $r left behind"; done
  left=$(ls /dev/shm | grep -c "^tessera-$job" || true)
  [ "$left" = 0 ] || fail "$layout: $left shared-memory segments of job $job left"
  p50=$(percentile 50 <"$work/recovery.txt")
  p99=$(percentile 99 <"$work/recovery.txt")
  echo "$layout: $runs faults, all recovered; recovery p50 ${p50} s, p99 ${p99} s; 0 requests lost, 0 processes and 0 shm segments left"
done
