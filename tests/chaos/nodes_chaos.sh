#!/usr/bin/env bash
# Chaos across two hosts: `tessera serve --nnodes 2` on two network-namespace
# "hosts" joined by a veth pair, each node under its own launcher. LAYOUT:
#   tp2     (default) one rank a node; node 0 holds the driver, the HTTP front and
#           the store, node 1 the other rank
#   tp2pp2  two ranks a node, a pipeline stage each; the driver and the front are
#           on node 1 (the last stage), the store on node 0
# Under a bounded load, each run injects one fault on the node without the driver
# at a random moment:
#   kill  kill -9 of one of its ranks (its launcher starts them again in the next
#         epoch)
#   stop  SIGSTOP of one of its ranks (a frozen peer: the driver's heartbeat check)
#   link  the link down for LINK_DOWN_S seconds (default 3), then up again
#   node  the whole node lost (its launcher and ranks killed), then started again
#         by hand after NODE_DOWN_S seconds (default 2): it rejoins the current
#         epoch (tp2 only: under tp2pp2 that node hosts the store, whose loss ends
#         the job)
# Each run must end in recovery (a restart counted in /metrics, /health 200 again)
# within 30 s of the fault's end (for kill and stop: of the signal), with every request of the load completed (none
# failed, none lost); at the end, SIGTERM must leave no rank process and no
# shared-memory segment. Prints one line per run and p50/p99 per fault.
#
#   tests/chaos/nodes_chaos.sh TESSERA MODEL [RUNS] [FAULT ...]   (default: all four)
# Needs root (network namespaces), iproute2, curl, python3. Exit 77 = skipped.
# KEEP_LOGS=DIR keeps the nodes' logs there.
set -euo pipefail

tessera=${1:?usage: nodes_chaos.sh TESSERA MODEL [RUNS] [FAULT ...]}
model=${2:?usage: nodes_chaos.sh TESSERA MODEL [RUNS] [FAULT ...]}
runs=${3:-4}
shift $(($# < 3 ? $# : 3))
faults=("$@")
[ ${#faults[@]} -gt 0 ] || faults=(kill stop link node)
tessera=$(readlink -f "$tessera")
model=$(readlink -f "$model")

# shellcheck source=../../scripts/netns-pair.sh
source "$(dirname "$0")/../../scripts/netns-pair.sh"
if ! netns_pair_up nch; then
  echo "skipped: $NETNS_ERROR"
  netns_pair_down
  exit 77
fi
work=$(mktemp -d /tmp/tessera-nodes-chaos.XXXXXX)
node0= node1=
layout=${LAYOUT:-tp2}
case $layout in
  tp2) pp=1 front=0 ;;
  tp2pp2) pp=2 front=1 ;;
  *) echo "LAYOUT must be tp2 or tp2pp2" >&2; exit 2 ;;
esac
other=$((1 - front))
cleanup() {
  [ -n "${KEEP_LOGS:-}" ] && cp -r "$work" "$KEEP_LOGS"
  [ -n "$node0" ] && kill -9 -- "-$node0" 2>/dev/null || true
  [ -n "$node1" ] && kill -9 -- "-$node1" 2>/dev/null || true
  netns_pair_down
  rm -rf "$work"
}
trap cleanup EXIT

fail() {
  echo "nodes chaos: FAIL: $*" >&2
  for f in node0.log node1.log load.log; do
    [ -f "$work/$f" ] && { echo "--- $f" >&2; tail -15 "$work/$f" >&2; }
  done
  exit 1
}
ns_of() { if [ "$1" = 0 ]; then echo "$NS0"; else echo "$NS1"; fi; }
in0() { ip netns exec "$(ns_of "$front")" "$@"; }  # on the front's node
metric() {  # metric NAME: its value on /metrics, or -1
  in0 curl -sf "$url/metrics" | awk -v k="$1" '$1 == k { print $2; found = 1 } END { if (!found) print -1 }'
}
env_of() { tr '\0' '\n' <"/proc/$1/environ" 2>/dev/null | sed -n "s/^$2=//p"; }
now() { date +%s.%N; }
since() { awk -v a="$(now)" -v b="$1" 'BEGIN { print a - b }'; }
percentile() {  # percentile P < values
  sort -g | awk -v p="$1" '{ v[NR] = $1 } END { i = int((NR - 1) * p / 100 + 0.5) + 1; print v[i] }'
}

rdzv_port=$((20000 + $$ % 20000))
http_port=$((rdzv_port + 1))
front_addr=$A0
[ "$front" = 1 ] && front_addr=$A1
url="http://$front_addr:$http_port"
token=$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')
export TESSERA_COMM_FROZEN_MS=${TESSERA_COMM_FROZEN_MS:-2000}
common=(serve "$model" -t 1 --tp 2 --pp "$pp" --nnodes 2 --rdzv "$A0:$rdzv_port"
  --token "$token" --max-restarts 100000 --host "$front_addr" --port "$http_port")
start_node() {  # start_node N: node N's serve command (its launcher and ranks)
  ip netns exec "$(ns_of "$1")" setsid "$tessera" "${common[@]}" --node-rank "$1" \
    >>"$work/node$1.log" 2>&1 &
  eval "node$1=\$!"
}
start_node 0
start_node 1
launcher_of() { if [ "$1" = 0 ]; then echo "$node0"; else echo "$node1"; fi; }
for _ in $(seq 600); do
  in0 curl -sf "$url/health" >/dev/null 2>&1 && break
  sleep 0.05
done
in0 curl -sf "$url/health" >/dev/null || fail "the server did not start"
job=$(env_of "$(pgrep -P "$node0" | head -1)" TESSERA_JOB_ID)
[ -n "$job" ] || fail "no TESSERA_JOB_ID on node 0's rank"
[ "$layout" = tp2pp2 ] && for i in "${!faults[@]}"; do
  [ "${faults[$i]}" = node ] && { echo "$layout: no 'node' fault (node 0 hosts the store)"; unset "faults[$i]"; }
done
faults=("${faults[@]}")

declare -A times
for run in $(seq "$runs"); do
  for fault in "${faults[@]}"; do
    restarts_before=$(metric tessera_engine_restarts_total)
    in0 "$tessera" bench serve --base-url "$url" -n 16 --max-concurrency 4 --input-len 16 \
      --output-len 48 --ignore-eos --seed "$run" --timeout 120 --json "$work/load.json" \
      >"$work/load.log" 2>&1 &
    load=$!
    sleep "0.$((RANDOM % 5 + 1))"
    mapfile -t ranks < <(pgrep -P "$(launcher_of "$other")")
    [ ${#ranks[@]} -eq "$pp" ] || fail "run $run: node $other has ${#ranks[@]} ranks"
    victim=${ranks[$((RANDOM % ${#ranks[@]}))]}
    # The fault, and a request sent right after it (an idle frozen rank or a dead
    # link is found by the next step that waits on it), then the fault's end.
    case $fault in
      kill) kill -KILL "$victim" ;;
      stop) kill -STOP "$victim" ;;
      link) ip -n "$NS1" link set "$V1" down ;;
      node)
        kill -9 -- "-$(launcher_of "$other")"
        wait "$(launcher_of "$other")" 2>/dev/null || true
        ;;
      *) fail "unknown fault $fault (kill, stop, link, node)" ;;
    esac
    in0 curl -s -o "$work/probe.json" -w '%{http_code}' "$url/v1/completions" \
      -H 'Content-Type: application/json' \
      -d '{"prompt":"Once upon a time","max_tokens":16,"temperature":0}' >"$work/probe.code" &
    probe=$!
    case $fault in
      link)
        sleep "${LINK_DOWN_S:-3}"
        ip -n "$NS1" link set "$V1" up
        ;;
      node)
        sleep "${NODE_DOWN_S:-2}"
        start_node "$other"
        ;;
    esac
    start=$(now)
    recovered=
    while :; do
      elapsed=$(since "$start")
      if [ "$(metric tessera_engine_restarts_total)" != "$restarts_before" ] &&
        in0 curl -sf "$url/health" >/dev/null 2>&1; then
        recovered=$elapsed
        break
      fi
      awk -v e="$elapsed" 'BEGIN { exit !(e > 30) }' && break
      sleep 0.05
    done
    [ -n "$recovered" ] || fail "run $run: no recovery within 30 s after $fault"
    wait "$probe" || true
    [ "$(cat "$work/probe.code")" = 200 ] ||
      fail "run $run: the request sent after $fault got $(cat "$work/probe.code"): $(cat "$work/probe.json")"
    wait "$load" || fail "run $run: the load generator failed after $fault"
    read -r completed failed < <(python3 -c 'import json, sys; j = json.load(open(sys.argv[1])); print(j["completed"], j["failed"])' "$work/load.json")
    [ "$completed" = 16 ] && [ "$failed" = 0 ] ||
      fail "run $run: $completed of 16 requests completed, $failed failed after $fault"
    printf '%s run %3d: %-4s -> recovered in %.2f s, 16/16 + 1 requests completed\n' "$layout" "$run" "$fault" "$recovered"
    times[$fault]+="$recovered "
  done
done

ranks="$(pgrep -P "$node0" | tr '\n' ' ') $(pgrep -P "$node1" | tr '\n' ' ')"
driver_launcher=$(launcher_of "$front")
follower_launcher=$(launcher_of "$other")
kill -TERM "$driver_launcher"
for _ in $(seq 200); do kill -0 "$driver_launcher" 2>/dev/null || break; sleep 0.05; done
kill -0 "$driver_launcher" 2>/dev/null && fail "node $front (the driver's) did not stop on SIGTERM"
wait "$driver_launcher" || fail "node $front (the driver's) exited with $?"
for _ in $(seq 400); do kill -0 "$follower_launcher" 2>/dev/null || break; sleep 0.05; done
kill -0 "$follower_launcher" 2>/dev/null && fail "node $other's launcher did not end with the job"
node0= node1=
for r in $ranks; do kill -0 "$r" 2>/dev/null && fail "rank pid $r left behind"; done
left=$(ls /dev/shm | grep -c "^tessera-$job" || true)
[ "$left" = 0 ] || fail "$left shared-memory segments of job $job left"
for fault in "${faults[@]}"; do
  read -r -a t <<<"${times[$fault]}"
  echo "$fault: ${#t[@]} faults, all recovered; recovery p50 $(printf '%s\n' "${t[@]}" | percentile 50) s, p99 $(printf '%s\n' "${t[@]}" | percentile 99) s"
done
echo "0 requests lost, 0 processes and 0 shm segments left"
