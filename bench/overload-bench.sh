#!/usr/bin/env bash
# Overload: measures a server's capacity (requests/s with enough concurrency to
# saturate it), then offers 10x that rate and reports how many were refused with
# 429 and how fast, the accepted requests' latencies, and the server's RSS (peak of
# samples every 100 ms, and VmHWM) during each phase.
# Usage: bench/overload-bench.sh TESSERA MODEL [SERVE_FLAGS...]
# Run it under `flock -x` of the shared CPU lock.
set -euo pipefail
tessera=$1
model=$2
shift 2
port=${PORT:-18136}
"$tessera" serve "$model" --port "$port" "$@" >/tmp/overload-serve.log 2>&1 &
server=$!
trap 'kill $server 2>/dev/null; wait $server 2>/dev/null || true' EXIT
for _ in $(seq 100); do
  curl -sf "http://127.0.0.1:$port/health" >/dev/null && break
  sleep 0.1
done
rss() { awk '/VmRSS/ {print $2}' /proc/$server/status; }
sample() {  # peak VmRSS (KiB) while $1 runs
  local peak=0 pid
  "$@" &
  pid=$!
  while kill -0 $pid 2>/dev/null; do
    local now
    now=$(rss)
    ((now > peak)) && peak=$now
    sleep 0.1
  done
  wait $pid
  echo "peak server RSS during the run: $((peak / 1024)) MiB" >&2
}
common=(--base-url "http://127.0.0.1:$port" --input-len 32 --output-len 64 --ignore-eos)
echo "server RSS at rest: $(($(rss) / 1024)) MiB"
echo "== capacity: 96 requests, at most ${CAP_CONCURRENCY:-16} in flight"
sample "$tessera" bench serve "${common[@]}" -n 96 --max-concurrency "${CAP_CONCURRENCY:-16}" --json /tmp/overload-cap.json |
  grep -E "Successful|Failed|refused|Request throughput|Median E2EL|P99 E2EL|Median TTFT|P99 TTFT"
cap=$(grep -o '"request_throughput": *[0-9.e+-]*' /tmp/overload-cap.json | head -1 | sed 's/.*: *//')
rate=$(awk -v c="$cap" 'BEGIN{printf "%.1f", 10 * c}')
n=$(awk -v r="$rate" 'BEGIN{n = int(r * 10); if (n < 200) n = 200; if (n > 2000) n = 2000; print n}')
echo "== overload: $n requests at $rate req/s (10 x $cap)"
sample "$tessera" bench serve "${common[@]}" -n "$n" --request-rate "$rate" --json /tmp/overload-10x.json |
  grep -E "Successful|Failed|refused|time to refusal|Request throughput|Median E2EL|P99 E2EL|Median TTFT|P99 TTFT|×"
echo "server VmHWM: $(($(awk '/VmHWM/ {print $2}' /proc/$server/status) / 1024)) MiB"
