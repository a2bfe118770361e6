#!/usr/bin/env bash
# Prefill/decode disaggregation across two "hosts": two network namespaces joined
# by a veth pair. Host 0 runs the front (`serve --pd 1:0 --pd-decode URL
# --pd-store A0:PORT`) and its local prefill instance; host 1 runs the decode
# instance by hand (`serve --pd-join A0:PORT --pd-role decode:0`). The KV blocks
# cross over TCP (the decode side's log names the link), every completion is
# checked against a plain one-process server (text, tokens, logprobs: the blocks
# travel in the cache's own dtype), and the decode instance reports the bytes.
# Then the decode instance is killed (-9) and started again by hand, now over two
# tensor-parallel ranks (`--tp 2`): it joins again (a new link generation), the
# prefill instance relinks, and the outputs are still one server's — blocks
# gathered on one side, scattered on the other, across the hosts.
# Bad joins are refused naming what is wrong: no token, a role the front does
# not have. Needs root and `ip netns`; otherwise exits 77 (ctest: skipped).
#   tests/serve/pd_netns_test.sh path/to/tessera path/to/shared
set -u
TESSERA=${1:?usage: pd_netns_test.sh TESSERA SHARED_DIR}
SHARED=${2:?usage: pd_netns_test.sh TESSERA SHARED_DIR}
skip() { echo "SKIP: $*"; exit 77; }
fail() { echo "FAIL: $*"; for f in "$OUT"/*.log; do echo "--- $f"; tail -20 "$f"; done; exit 1; }
[ -x "$TESSERA" ] || skip "the tessera CLI is not built in this tree ($TESSERA)"
MODEL=$SHARED/models/stories260K.gguf
[ -f "$MODEL" ] || skip "no shared models"
for tool in curl jq; do command -v $tool > /dev/null || skip "needs $tool"; done

OUT=$(mktemp -d /tmp/tessera-pdnetns.XXXXXX)
# shellcheck source=../../scripts/netns-pair.sh
source "$(dirname "$0")/../../scripts/netns-pair.sh"
PIDS=()
cleanup() {
  for pid in "${PIDS[@]}"; do kill -TERM "$pid" 2> /dev/null; done
  for pid in "${PIDS[@]}"; do wait "$pid" 2> /dev/null; done
  netns_pair_down
  rm -rf "$OUT"
}
trap cleanup EXIT
netns_pair_up pdn || skip "$NETNS_ERROR"

export TESSERA_CLUSTER_TOKEN=pd-netns-$$
PORT=$((22000 + $$ % 20000))
REF_PORT=$PORT FRONT_PORT=$((PORT + 1)) STORE_PORT=$((PORT + 2)) DECODE_PORT=$((PORT + 3))

wait_health() {  # NS URL
  for _ in $(seq 600); do
    ip netns exec "$1" curl -sf "$2/health" 2> /dev/null | grep -q '"ok"' && return 0
    sleep 0.05
  done
  return 1
}
complete() {  # NS URL PROMPT → the completion's JSON
  ip netns exec "$1" curl -sf "$2/v1/completions" -H 'Content-Type: application/json' \
    -d "$(jq -n --arg p "$3" '{prompt: $p, max_tokens: 12, temperature: 0, logprobs: 3}')"
}

# The reference: one plain server (on host 0; any host would do).
ip netns exec "$NS0" "$TESSERA" serve "$MODEL" -t 1 --host "$A0" --port "$REF_PORT" \
  > "$OUT/ref.log" 2>&1 &
PIDS+=($!)
# The front and its prefill instance on host 0; the decode instance on host 1.
ip netns exec "$NS0" "$TESSERA" serve "$MODEL" -t 1 --host "$A0" --port "$FRONT_PORT" \
  --pd 1:0 --pd-decode "http://$A1:$DECODE_PORT" --pd-store "$A0:$STORE_PORT" \
  > "$OUT/front.log" 2>&1 &
PIDS+=($!)
ip netns exec "$NS1" "$TESSERA" serve "$MODEL" -t 1 --host "$A1" --port "$DECODE_PORT" \
  --pd-join "$A0:$STORE_PORT" --pd-role decode:0 > "$OUT/decode.log" 2>&1 &
PIDS+=($!)
wait_health "$NS0" "http://$A0:$REF_PORT" || fail "the reference server did not come up"
wait_health "$NS0" "http://$A0:$FRONT_PORT" || fail "the front did not report ok"

# Prompts of a few blocks each (16 tokens a block), so their KV travels; distinct
# per round (ROUND), so that no prefix cache holds them.
base="Once upon a time there was a little girl named Lily. She liked to play in the park"
check_prompts() {  # ROUND
  for i in 1 2 3 4; do
    prompt="$base with her friend number $i of round $1. They ran and laughed and played all day."
    for k in $(seq "$i"); do prompt="$prompt The dog barked at the cat."; done
    want=$(complete "$NS0" "http://$A0:$REF_PORT" "$prompt") || fail "reference request $i"
    got=$(complete "$NS0" "http://$A0:$FRONT_PORT" "$prompt") || fail "front request $i"
    for field in '.choices[0].text' '.choices[0].logprobs.tokens' \
                 '.choices[0].logprobs.token_logprobs' '.choices[0].logprobs.top_logprobs'; do
      [ "$(jq -c "$field" <<< "$want")" = "$(jq -c "$field" <<< "$got")" ] ||
        fail "round $1 request $i: $field differs from one server: $(jq -c "$field" <<< "$want") vs $(jq -c "$field" <<< "$got")"
    done
    tokens=$(jq '.usage.tessera_kv_transfer.tokens // 0' <<< "$got")
    bytes=$(jq '.usage.tessera_kv_transfer.bytes // 0' <<< "$got")
    [ "$tokens" -ge 16 ] && [ "$bytes" -gt 0 ] ||
      fail "round $1 request $i: no KV transfer in its usage: $(jq -c .usage <<< "$got")"
    echo "ok: round $1 request $i: $tokens prompt tokens' KV ($bytes B) from host 0 to host 1, output identical"
  done
}
check_prompts 1
grep -q "KV transfer link to prefill instance 0 up (tcp" "$OUT/decode.log" ||
  fail "the decode instance's link is not TCP"
total=$(ip netns exec "$NS1" curl -sf "http://$A1:$DECODE_PORT/metrics" |
  awk '/^tessera_pd_kv_transfer_bytes_total / {print $2}')
[ "${total:-0}" != 0 ] || fail "the decode instance's /metrics counts no transferred bytes"
echo "ok: link over TCP across the hosts; the decode instance counts $total B"

# The decode instance dies; started again by hand, over two tp ranks, it rejoins.
kill -KILL "${PIDS[2]}"
wait "${PIDS[2]}" 2> /dev/null
ip netns exec "$NS1" "$TESSERA" serve "$MODEL" -t 1 --tp 2 --host "$A1" --port "$DECODE_PORT" \
  --pd-join "$A0:$STORE_PORT" --pd-role decode:0 > "$OUT/decode2.log" 2>&1 &
PIDS+=($!)
wait_health "$NS1" "http://$A1:$DECODE_PORT" || fail "the restarted decode instance did not come up"
for _ in $(seq 200); do  # the front marks it up again once it answers
  ip netns exec "$NS0" curl -sf "http://$A0:$FRONT_PORT/v1/completions" -H 'Content-Type: application/json' \
    -d '{"prompt": "Hello", "max_tokens": 1}' > /dev/null 2>&1 && break
  sleep 0.1
done
check_prompts 2
grep -q "tp2" "$OUT/decode2.log" || fail "the restarted decode instance is not over two tp ranks"
grep -q "KV transfer link to prefill instance 0 up (tcp" "$OUT/decode2.log" ||
  fail "the restarted decode instance did not link over TCP"
echo "ok: a decode instance restarted by hand (now tp=2) rejoined; outputs still one server's"

# A join with no token, and one with a role the front does not have: refused.
if ip netns exec "$NS1" env -u TESSERA_CLUSTER_TOKEN "$TESSERA" serve "$MODEL" -t 1 \
  --host "$A1" --port $((PORT + 4)) --pd-join "$A0:$STORE_PORT" --pd-role decode:0 \
  > "$OUT/notoken.log" 2>&1; then
  fail "a join without the cluster token was accepted"
fi
if ip netns exec "$NS1" "$TESSERA" serve "$MODEL" -t 1 --host "$A1" --port $((PORT + 5)) \
  --pd-join "$A0:$STORE_PORT" --pd-role decode:1 > "$OUT/badrole.log" 2>&1; then
  fail "a join as decode instance 1 of 1 was accepted"
fi
grep -q "pd-role" "$OUT/badrole.log" || fail "the bad role's error does not name --pd-role"
echo "ok: a join without the token, and one as a decode instance the front lacks, are refused"
echo PASS
