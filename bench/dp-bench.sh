#!/usr/bin/env bash
# Data parallelism (`tessera serve --dp 2`), three measurements (issue 32):
#   router    16 tenants' shared prefixes (PREFIX words each, tenants' requests
#             shuffled), one replica vs dp=2 round-robin vs dp=2 prefix-affinity,
#             interleaved round by round: client-side prefix-cache hit rate
#             (usage.prompt_tokens_details.cached_tokens), mean TTFT, out tok/s;
#             ratios PA/single hit rate (target >= 0.9), PA/RR hit rate (>= 1.5),
#             PA/RR mean TTFT (<= 0.6).
#   failover  RUNS runs of a FO_PROMPTS-request load on dp=2 with kill -9 of one
#             replica at a random moment: requests lost (failed in the client and
#             not a stream ended by the front's explicit error event), time from the
#             kill to /health "degraded" and to "ok" again (the replica restarted).
#   threads   dp=2 × 1 thread vs one replica × 2 threads at STREAMS concurrent
#             streams (random prompts), interleaved: out tok/s, ratio (>= 0.9).
#   netns     the same with dp=2's second replica on another network-namespace
#             host (10 Gbit/s veth; the front, its first replica, the 2-thread
#             replica and the client on the first): out tok/s, ratio (>= 0.9).
#
#   bench/dp-bench.sh [build/bin/tessera] MODEL.gguf [router|failover|threads|netns ...]
# Environment: ROUNDS (2), PREFIX (1024), QUESTION (32), OUTPUT (16),
# PER_TENANT (4), CONCURRENCY (8), RUNS (20), FO_MODEL (MODEL), FO_PROMPTS (200),
# STREAMS (16), TH_PROMPTS (64), PA_FLAGS (more flags for the prefix-affinity front,
# e.g. "--router-load-margin 8"), MODES (router: "single rr pa"), PORT (8340), LOCK (flock -x this file around
# each timed run; empty: none).
# A benchmark, not a test: prints and exits 0 (2 when it cannot run).
set -u
TESSERA=${1:-build/bin/tessera}
MODEL=${2:?usage: dp-bench.sh [TESSERA] MODEL.gguf [router|failover|threads ...]}
shift 2
PARTS=${*:-router failover threads}
ROUNDS=${ROUNDS:-2}
PREFIX=${PREFIX:-1024}
QUESTION=${QUESTION:-32}
OUTPUT=${OUTPUT:-16}
PER_TENANT=${PER_TENANT:-4}
CONCURRENCY=${CONCURRENCY:-8}
RUNS=${RUNS:-20}
FO_MODEL=${FO_MODEL:-$MODEL}
FO_PROMPTS=${FO_PROMPTS:-200}
STREAMS=${STREAMS:-16}
TH_PROMPTS=${TH_PROMPTS:-64}
PORT=${PORT:-8340}
LOCK=${LOCK:-}
[ -x "$TESSERA" ] || { echo "no tessera binary at $TESSERA" >&2; exit 2; }
[ -f "$MODEL" ] || { echo "no model at $MODEL" >&2; exit 2; }
for tool in curl jq; do command -v $tool > /dev/null || { echo "needs $tool" >&2; exit 2; }; done
OUT=$(mktemp -d /tmp/tessera-dpbench.XXXXXX)
SERVER_PID=""
stop_server() {
  [ -n "$SERVER_PID" ] && kill -TERM "$SERVER_PID" 2> /dev/null && wait "$SERVER_PID" 2> /dev/null
  SERVER_PID=""
}
trap 'stop_server; rm -rf "$OUT"' EXIT

# In network namespace $NETNS when it is set (the netns part).
in_ns() { if [ -n "${NETNS:-}" ]; then ip netns exec "$NETNS" "$@"; else "$@"; fi; }

wait_healthy() {  # url: up to 60 s
  for _ in $(seq 1200); do
    in_ns curl -sf "$1/health" 2> /dev/null | grep -q '"ok"' && return 0
    sleep 0.05
  done
  return 1
}

start_server() {  # model flags…
  PORT=$((PORT + 1))  # a fresh port each time: the last one may be in TIME_WAIT
  local model=$1
  shift
  in_ns "$TESSERA" serve "$model" --port "$PORT" "$@" > "$OUT/serve.log" 2>&1 &
  SERVER_PID=$!
  wait_healthy "http://127.0.0.1:$PORT" && return 0
  echo "server did not come up: $*" >&2
  return 1
}

bench() {  # json flags…
  local json=$1
  shift
  # shellcheck disable=SC2086
  in_ns ${LOCK:+flock -x "$LOCK"} "$TESSERA" bench serve --base-url "http://127.0.0.1:$PORT" \
    --ignore-eos --json "$json" "$@" > "$OUT/bench.txt" 2>&1
}

median() { tr ' ' '\n' <<< "$1" | grep -v '^$' | sort -g | awk '{v[NR] = $1} END {print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2}'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN {printf "%.3f", (b > 0) ? a / b : 0}'; }
declare -A R
record() { R[$1]="${R[$1]:-} $2"; }

router_part() {
  echo "== router: 16 tenants x $PREFIX-word prefixes + $QUESTION-word questions, $((16 * PER_TENANT)) requests," \
    "concurrency $CONCURRENCY, $OUTPUT out, $ROUNDS rounds"
  read -r -a modes <<< "${MODES:-single rr pa}"
  for round in $(seq "$ROUNDS"); do
    [ $((round % 2)) -eq 0 ] && read -r -a modes <<< "$(tr " " "\n" <<< "${MODES:-single rr pa}" | tac | tr "\n" " ")"
    for mode in "${modes[@]}"; do
      case $mode in
        single) start_server "$MODEL" -t 1 ;;
        rr) start_server "$MODEL" -t 1 --dp 2 --router round-robin ;;
        pa) start_server "$MODEL" -t 1 --dp 2 --router prefix-affinity ${PA_FLAGS:-} ;;
      esac || continue
      bench "$OUT/r.json" --dataset shared-prefix --prefix-len "$PREFIX" --num-prefixes 16 \
        --shuffle-tenants --input-len "$QUESTION" --output-len "$OUTPUT" \
        --num-prompts $((16 * PER_TENANT)) --max-concurrency "$CONCURRENCY" --seed "$round"
      read -r hit ttft toks <<< "$(jq -r '[(.prefix_cache_hit_rate // 0), .ttft_ms.mean, .output_throughput] | map(tostring) | join(" ")' "$OUT/r.json" 2> /dev/null || echo "0 0 0")"
      stop_server
      record "${mode}_hit" "$hit"
      record "${mode}_ttft" "$ttft"
      record "${mode}_toks" "$toks"
      printf "round %d %-6s: hit rate %.3f, mean TTFT %8.1f ms, %7.1f out tok/s\n" "$round" "$mode" "$hit" "$ttft" "$toks"
    done
  done
  for mode in ${MODES:-single rr pa}; do
    printf "%-6s: median hit rate %.3f (%s), mean TTFT %8.1f ms (%s), out tok/s %7.1f\n" "$mode" \
      "$(median "${R[${mode}_hit]:-}")" "${R[${mode}_hit]:-}" "$(median "${R[${mode}_ttft]:-}")" \
      "${R[${mode}_ttft]:-}" "$(median "${R[${mode}_toks]:-}")"
  done
  echo "prefix-affinity / single hit rate $(ratio "$(median "${R[pa_hit]:-}")" "$(median "${R[single_hit]:-}")") (target >= 0.9)," \
    "/ round-robin hit rate $(ratio "$(median "${R[pa_hit]:-}")" "$(median "${R[rr_hit]:-}")") (>= 1.5)," \
    "mean TTFT / round-robin $(ratio "$(median "${R[pa_ttft]:-}")" "$(median "${R[rr_ttft]:-}")") (<= 0.6)"
}

failover_part() {
  echo "== failover: $RUNS runs of $FO_PROMPTS requests (concurrency 16, 128 out) on dp=2, kill -9 of a replica at a random moment"
  local total_lost=0
  for run in $(seq "$RUNS"); do
    start_server "$FO_MODEL" -t 1 --dp 2 || continue
    "$TESSERA" bench serve --base-url "http://127.0.0.1:$PORT" --ignore-eos --json "$OUT/f.json" \
      --dataset random --input-len 32 --output-len 128 --num-prompts "$FO_PROMPTS" \
      --max-concurrency 16 --seed "$run" > "$OUT/bench.txt" 2>&1 &
    local bench_pid=$!
    local delay_ms=$((100 + RANDOM % 900))
    sleep "$(awk -v m=$delay_ms 'BEGIN {print m / 1000}')"
    local victims
    victims=($(pgrep -P "$SERVER_PID"))
    local victim=${victims[$((RANDOM % ${#victims[@]}))]}
    local t0 t_degraded="" t_ok=""
    t0=$(date +%s%N)
    kill -9 "$victim"
    while [ -z "$t_ok" ]; do
      local h
      h=$(curl -s --max-time 1 "http://127.0.0.1:$PORT/health")
      local now
      now=$(date +%s%N)
      [ -z "$t_degraded" ] && [[ "$h" == *degraded* || "$h" == *unavailable* ]] && t_degraded=$now
      [ -n "$t_degraded" ] && [[ "$h" == *'"ok"'* ]] && t_ok=$now
      [ $(((now - t0) / 1000000000)) -gt 60 ] && break
      sleep 0.01
    done
    wait "$bench_pid"
    local broken
    broken=$(curl -s "http://127.0.0.1:$PORT/metrics" | awk '/^tessera_dp_broken_streams_total/ {print $2}')
    local reruns
    reruns=$(curl -s "http://127.0.0.1:$PORT/metrics" | awk '/^tessera_dp_reruns_total/ {print $2}')
    stop_server
    read -r completed failed <<< "$(jq -r '[.completed, .failed] | map(tostring) | join(" ")' "$OUT/f.json" 2> /dev/null || echo "0 $FO_PROMPTS")"
    local lost=$((FO_PROMPTS - completed - ${broken:-0}))
    total_lost=$((total_lost + lost))
    local deg_ms=-1 ok_ms=-1
    [ -n "$t_degraded" ] && deg_ms=$(((t_degraded - t0) / 1000000))
    [ -n "$t_ok" ] && ok_ms=$(((t_ok - t0) / 1000000))
    record fo_deg "$deg_ms"
    record fo_ok "$ok_ms"
    printf "run %2d: kill at %4d ms: completed %d, ended by an error event %s, re-run %s, lost %d; degraded after %d ms, ok again after %d ms\n" \
      "$run" "$delay_ms" "$completed" "${broken:-?}" "${reruns:-?}" "$lost" "$deg_ms" "$ok_ms"
  done
  echo "failover: $total_lost requests lost in $RUNS runs; to degraded: median $(median "${R[fo_deg]:-}") ms (${R[fo_deg]:-});" \
    "to rejoin: median $(median "${R[fo_ok]:-}") ms (${R[fo_ok]:-})"
}

threads_part() {
  echo "== threads: dp=2 x 1 thread vs 1 replica x 2 threads, $STREAMS streams, $TH_PROMPTS requests, $ROUNDS rounds"
  local modes=(dp tp)
  for round in $(seq "$ROUNDS"); do
    [ $((round % 2)) -eq 0 ] && modes=(tp dp)
    for mode in "${modes[@]}"; do
      case $mode in
        dp) start_server "$MODEL" -t 1 --dp 2 --router least-outstanding ;;
        tp) start_server "$MODEL" -t 2 ;;
      esac || continue
      bench "$OUT/t.json" --dataset random --input-len 128 --output-len 64 \
        --num-prompts "$TH_PROMPTS" --max-concurrency "$STREAMS" --seed "$round"
      local toks
      toks=$(jq -r '.output_throughput' "$OUT/t.json" 2> /dev/null || echo 0)
      stop_server
      record "th_$mode" "$toks"
      printf "round %d %-2s: %7.1f out tok/s\n" "$round" "$mode" "$toks"
    done
  done
  echo "dp=2x1 / 1x2 threads: $(ratio "$(median "${R[th_dp]:-}")" "$(median "${R[th_tp]:-}")") (medians $(median "${R[th_dp]:-}") vs $(median "${R[th_tp]:-}") out tok/s; target >= 0.9)"
}

netns_part() {
  echo "== netns: dp=2 x 1 thread, its second replica on another namespace host (10 Gbit/s)," \
    "vs 1 replica x 2 threads, $STREAMS streams, $TH_PROMPTS requests, $ROUNDS rounds"
  # shellcheck source=../scripts/netns-pair.sh
  source "$(dirname "$0")/../scripts/netns-pair.sh"
  netns_bench_up dpb || return 0
  trap 'stop_server; [ -n "${REMOTE_PID:-}" ] && kill "$REMOTE_PID" 2> /dev/null; netns_pair_down; rm -rf "$OUT"' EXIT
  netns_pair_shape 10gbit
  local modes=(dp tp)
  for round in $(seq "$ROUNDS"); do
    [ $((round % 2)) -eq 0 ] && modes=(tp dp)
    for mode in "${modes[@]}"; do
      REMOTE_PID=""
      case $mode in
        dp)
          PORT=$((PORT + 1))
          local remote="http://$A1:$PORT"
          ip netns exec "$NS1" "$TESSERA" serve "$MODEL" --host "$A1" --port "$PORT" -t 1 \
            > "$OUT/remote.log" 2>&1 &
          REMOTE_PID=$!
          NETNS=$NS0 wait_healthy "$remote" || { echo "remote replica did not come up" >&2; continue; }
          NETNS=$NS0 start_server "$MODEL" -t 1 --dp 1 --replica "$remote" \
            --router least-outstanding ;;
        tp) NETNS=$NS0 start_server "$MODEL" -t 2 ;;
      esac || continue
      NETNS=$NS0 bench "$OUT/t.json" --dataset random --input-len 128 --output-len 64 \
        --num-prompts "$TH_PROMPTS" --max-concurrency "$STREAMS" --seed "$round"
      local toks
      toks=$(jq -r '.output_throughput' "$OUT/t.json" 2> /dev/null || echo 0)
      stop_server
      [ -n "$REMOTE_PID" ] && kill -TERM "$REMOTE_PID" 2> /dev/null && wait "$REMOTE_PID" 2> /dev/null
      record "ns_$mode" "$toks"
      printf "round %d %-2s: %7.1f out tok/s\n" "$round" "$mode" "$toks"
    done
  done
  echo "dp=2 across hosts / 1x2 threads: $(ratio "$(median "${R[ns_dp]:-}")" "$(median "${R[ns_tp]:-}")") (medians $(median "${R[ns_dp]:-}") vs $(median "${R[ns_tp]:-}") out tok/s; target >= 0.9)"
  netns_pair_down
}

for part in $PARTS; do
  "${part}_part"
  echo
done
