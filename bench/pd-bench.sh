#!/usr/bin/env bash
# Prefill/decode disaggregation (`tessera serve --pd 1:1`, issue 33) against two
# colocated data-parallel replicas (`--dp 2`), same resources (two processes of
# one compute thread each), interleaved round by round on the same prompts and
# arrival times: a mixed load of SHORT-word prompts with a LONG_FRACTION share of
# LONG-word ones, OUTPUT tokens out, Poisson arrivals at RATE req/s.
# Per mode and round: p50/p99 TPOT (per request: (e2e - TTFT) / (tokens - 1)),
# p50/p99 TTFT, goodput (requests/s meeting TTFT <= SLO_TTFT_MS and TPOT <=
# SLO_TPOT_MS), out tok/s; for pd, from the decode instance's own /metrics: KV
# transfers, bytes, the share streamed while the prefill ran, the time left after
# the prefill's end (its last burst to the last block in: what streaming did not hide)
# and prefill end to first decoded token p50/p99 (histogram bucket bounds).
# The raw link to compare with: `tessera bench comm --op sendrecv --np 2`.
#
#   bench/pd-bench.sh [build/bin/tessera] MODEL.gguf
# Environment: ROUNDS (2), N (40 requests), RATE (0.5), SHORT (64), LONG (2048),
# LONG_FRACTION (0.2), OUTPUT (128), SLO_TTFT_MS (2000), SLO_TPOT_MS (50),
# MODES ("colo pd"), PORT (8440), LOCK (flock -x this file around each timed
# run; empty: none).
# A benchmark, not a test: prints and exits 0 (2 when it cannot run).
set -u
TESSERA=${1:-build/bin/tessera}
MODEL=${2:?usage: pd-bench.sh [TESSERA] MODEL.gguf}
ROUNDS=${ROUNDS:-2}
N=${N:-40}
RATE=${RATE:-0.5}
SHORT=${SHORT:-64}
LONG=${LONG:-2048}
LONG_FRACTION=${LONG_FRACTION:-0.2}
OUTPUT=${OUTPUT:-128}
SLO_TTFT_MS=${SLO_TTFT_MS:-2000}
SLO_TPOT_MS=${SLO_TPOT_MS:-50}
MODES=${MODES:-colo pd}
PORT=${PORT:-8440}
LOCK=${LOCK:-}
[ -x "$TESSERA" ] || { echo "no tessera binary at $TESSERA" >&2; exit 2; }
[ -f "$MODEL" ] || { echo "no model at $MODEL" >&2; exit 2; }
for tool in curl jq; do command -v $tool > /dev/null || { echo "needs $tool" >&2; exit 2; }; done
OUT=$(mktemp -d /tmp/tessera-pdbench.XXXXXX)
SERVER_PID=""
stop_server() {
  [ -n "$SERVER_PID" ] && kill -TERM "$SERVER_PID" 2> /dev/null && wait "$SERVER_PID" 2> /dev/null
  SERVER_PID=""
}
trap 'stop_server; rm -rf "$OUT"' EXIT

start_server() {  # flags…
  PORT=$((PORT + 1))
  "$TESSERA" serve "$MODEL" --port "$PORT" -t 1 --max-model-len $((LONG * 2 + OUTPUT + 64)) \
    "$@" > "$OUT/serve.log" 2>&1 &
  SERVER_PID=$!
  for _ in $(seq 2400); do
    curl -sf "http://127.0.0.1:$PORT/health" 2> /dev/null | grep -q '"ok"' && return 0
    sleep 0.05
  done
  echo "server did not come up: $*" >&2
  cat "$OUT/serve.log" >&2
  return 1
}

median() { tr ' ' '\n' <<< "$1" | grep -v '^$' | sort -g | awk '{v[NR] = $1} END {print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2}'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN {printf "%.3f", (b > 0) ? a / b : 0}'; }
declare -A R
record() { R[$1]="${R[$1]:-} $2"; }

echo "== mixed load: $N requests, $(awk -v f="$LONG_FRACTION" 'BEGIN {print f * 100}')% $LONG-word / rest $SHORT-word prompts, $OUTPUT out, Poisson $RATE req/s; SLO TTFT <= $SLO_TTFT_MS ms, TPOT <= $SLO_TPOT_MS ms"
for round in $(seq "$ROUNDS"); do
  for mode in $MODES; do
    case $mode in
      colo) flags=(--dp 2) ;;
      pd) flags=(--pd 1:1) ;;
    esac
    start_server "${flags[@]}" || exit 2
    # shellcheck disable=SC2086
    ${LOCK:+flock -x "$LOCK"} "$TESSERA" bench serve --base-url "http://127.0.0.1:$PORT" \
      --ignore-eos --dataset mixed --input-len "$SHORT" --long-input-len "$LONG" \
      --long-fraction "$LONG_FRACTION" --output-len "$OUTPUT" --num-prompts "$N" \
      --request-rate "$RATE" --seed "$round" --json "$OUT/r.json" > "$OUT/bench.txt" 2>&1
    if [ "$mode" = pd ]; then  # the decode instance's own /metrics (its URL is in the log)
      url=$(grep -o 'http://[0-9.:]*[^(]*(.*decode instance 0' "$OUT/serve.log" | grep -o 'http://[0-9.:]*' | head -1)
      curl -sf "$url/metrics" > "$OUT/decode.metrics" || : > "$OUT/decode.metrics"
      read -r kvbytes kvstreamed kvsec kvn h50 h99 <<< "$(awk '
        /^tessera_pd_kv_transfer_bytes_total / {b = $2}
        /^tessera_pd_kv_streamed_bytes_total / {st = $2}
        /^tessera_pd_kv_transfer_seconds_sum / {s = $2}
        /^tessera_pd_kv_transfer_seconds_count / {n = $2}
        /^tessera_pd_handoff_seconds_bucket/ {match($0, /le="[^"]*"/); le = substr($0, RSTART + 4, RLENGTH - 5); k++; L[k] = le; C[k] = $2}
        /^tessera_pd_handoff_seconds_count / {t = $2}
        END {
          p50 = "nan"; p99 = "nan"
          for (i = 1; i <= k; i++) {
            if (p50 == "nan" && C[i] >= 0.5 * t) p50 = L[i]
            if (p99 == "nan" && C[i] >= 0.99 * t) p99 = L[i]
          }
          printf "%s %s %s %s %s %s", b + 0, st + 0, s + 0, n + 0, p50, p99
        }' "$OUT/decode.metrics")"
      record pd_after_ms "$(awk -v s="$kvsec" -v n="$kvn" 'BEGIN {printf "%.1f", (n > 0) ? s / n * 1e3 : 0}')"
      record pd_h50 "$h50"
      record pd_h99 "$h99"
      printf "round %d pd  : %d transfers, %.1f MB (%.0f %% streamed while the prefill ran), mean %.1f ms left after the prefill's end, prefill end to first token p50 <= %s s, p99 <= %s s (bucket bounds)\n" \
        "$round" "$kvn" "$(awk -v b="$kvbytes" 'BEGIN {print b / 1e6}')" \
        "$(awk -v b="$kvbytes" -v st="$kvstreamed" 'BEGIN {print (b > 0) ? 100 * st / b : 0}')" \
        "$(awk -v s="$kvsec" -v n="$kvn" 'BEGIN {printf "%.1f", (n > 0) ? s / n * 1e3 : 0}')" "$h50" "$h99"
    fi
    stop_server
    read -r tpot50 tpot99 ttft50 ttft99 good toks <<< "$(jq -r --argjson sttft "$SLO_TTFT_MS" \
      --argjson stpot "$SLO_TPOT_MS" '
      def pct(p): sort | if length == 0 then 0 else .[((length - 1) * p | floor)] end;
      .requests as $r | .duration_s as $d
      | [range(0; $r.ttft_ms | length)]
      | map(select($r.ttft_ms[.] != null and $r.output_tokens[.] > 1)
            | {ttft: $r.ttft_ms[.], tpot: (($r.e2el_ms[.] - $r.ttft_ms[.]) / ($r.output_tokens[.] - 1))})
      | [(map(.tpot) | pct(0.5)), (map(.tpot) | pct(0.99)), (map(.ttft) | pct(0.5)),
         (map(.ttft) | pct(0.99)),
         ((map(select(.ttft <= $sttft and .tpot <= $stpot)) | length) / $d)]
      | map(tostring) | join(" ")' "$OUT/r.json") $(jq -r .output_throughput "$OUT/r.json")"
    for k in tpot50 tpot99 ttft50 ttft99 good toks; do record "${mode}_$k" "${!k}"; done
    printf "round %d %-4s: TPOT p50 %7.1f p99 %7.1f ms, TTFT p50 %8.1f p99 %8.1f ms, goodput %.3f req/s, %6.1f out tok/s\n" \
      "$round" "$mode" "$tpot50" "$tpot99" "$ttft50" "$ttft99" "$good" "$toks"
  done
done
echo "== medians over $ROUNDS rounds (each round's values in brackets)"
for mode in $MODES; do
  printf "%-4s: TPOT p99 %s ms [%s], TTFT p99 %s ms [%s], goodput %s req/s [%s], %s out tok/s\n" "$mode" \
    "$(median "${R[${mode}_tpot99]}")" "${R[${mode}_tpot99]}" "$(median "${R[${mode}_ttft99]}")" \
    "${R[${mode}_ttft99]}" "$(median "${R[${mode}_good]}")" "${R[${mode}_good]}" "$(median "${R[${mode}_toks]}")"
done
if [[ " $MODES " == *" pd "* ]]; then
  echo "pd KV transfer: mean ms left after the prefill's end [${R[pd_after_ms]:-}], prefill end to first token p50 [${R[pd_h50]:-}] p99 [${R[pd_h99]:-}] s"
fi
if [[ " $MODES " == *" colo "* && " $MODES " == *" pd "* ]]; then
  echo "pd/colo: p99 TPOT $(ratio "$(median "${R[pd_tpot99]}")" "$(median "${R[colo_tpot99]}")") (target <= 0.5)," \
    "goodput $(ratio "$(median "${R[pd_good]}")" "$(median "${R[colo_good]}")") (target >= 1.3)"
fi
