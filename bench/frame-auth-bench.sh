#!/usr/bin/env bash
# Decode throughput at tp=2 over TCP under each wire protection, interleaved (the
# order rotates round by round), each run under `flock -x` of the shared CPU lock;
# the generated text must be the same every way. Prints each round and the medians
# with their ratio to the first mode.
#   MODES   which protections, first is the reference (default "auth plain"):
#           auth  per-frame AES-256-GMAC (the default of the TCP transport)
#           plain TESSERA_TCP_FRAME_AUTH=0 (nothing after the token handshake)
#           tls   TESSERA_TCP_TLS=1 (TLS 1.3, AES-256-GCM)
#   NETNS=1 the two ranks on two network-namespace hosts (root) joined by a veth
#           pair shaped to 10 Gbit/s, instead of two processes on one host
# Usage: [MODES="auth tls"] [NETNS=1] bench/frame-auth-bench.sh TESSERA MODEL [ROUNDS=5] [TOKENS=200]
set -euo pipefail
tessera=$1
model=$2
rounds=${3:-5}
tokens=${4:-200}
read -r -a modes <<< "${MODES:-auth plain}"
lock=${CPU_LOCK:-/work/.cpu.lock}
tmp=$(mktemp -d)
cleanup() { rm -rf "$tmp"; }
if [ "${NETNS:-0}" = 1 ]; then
  # shellcheck source=../scripts/netns-pair.sh
  source "$(dirname "$0")/../scripts/netns-pair.sh"
  netns_pair_up fab || { echo "NETNS=1: $NETNS_ERROR" >&2; netns_pair_down; exit 1; }
  cleanup() { netns_pair_down; rm -rf "$tmp"; }
  netns_pair_shape 10gbit
fi
trap cleanup EXIT
env_of() {
  case $1 in
    auth) echo TESSERA_TCP_FRAME_AUTH=1 ;;
    plain) echo TESSERA_TCP_FRAME_AUTH=0 ;;
    tls) echo TESSERA_TCP_TLS=1 ;;
    *) echo "unknown mode $1 (auth, plain, tls)" >&2; exit 2 ;;
  esac
}
port=$((30000 + $$ % 20000))
run() {  # mode: tok/s of the decode; text into $tmp/MODE.out
  local mode=$1 knob
  knob=$(env_of "$mode")
  if [ "${NETNS:-0}" = 1 ]; then
    port=$((port + 1))
    (
      exec 9> "$lock"
      flock -x 9
      for node in 0 1; do
        ns=$NS0; [ $node = 1 ] && ns=$NS1
        env "$knob" ip netns exec "$ns" "$tessera" generate "$model" -p "Once upon a time" \
          -n "$tokens" --temp 0 --tp 2 -t 1 --nnodes 2 --node-rank $node --rdzv "$A0:$port" \
          --token wirebench > "$tmp/$mode.out$node" 2> "$tmp/$mode.err$node" &
      done
      wait
    )
    mv "$tmp/$mode.out0" "$tmp/$mode.out"
    cp "$tmp/$mode.err0" "$tmp/$mode.err"
  else
    env "$knob" flock -x "$lock" "$tessera" generate "$model" -p "Once upon a time" \
      -n "$tokens" --temp 0 --tp 2 --transport tcp -t 1 > "$tmp/$mode.out" 2> "$tmp/$mode.err"
  fi
  grep -o 'generated [0-9]* tokens, [0-9.]* tok/s' "$tmp/$mode.err" | awk '{print $4}'
}
declare -A figures
for ((r = 0; r < rounds; r++)); do
  line="round $r:"
  for ((i = 0; i < ${#modes[@]}; i++)); do
    mode=${modes[$(((i + r) % ${#modes[@]}))]}
    figures[$mode]+="$(run "$mode") "
  done
  for mode in "${modes[@]}"; do
    cmp -s "$tmp/${modes[0]}.out" "$tmp/$mode.out" || { echo "outputs differ ($mode)" >&2; exit 1; }
    line+=" $mode $(echo "${figures[$mode]}" | awk '{print $NF}')"
  done
  echo "$line tok/s"
done
median() { printf '%s\n' $1 | sort -g | awk '{v[NR]=$1} END {print (NR%2) ? v[(NR+1)/2] : (v[NR/2]+v[NR/2+1])/2}'; }
ref=$(median "${figures[${modes[0]}]}")
for mode in "${modes[@]}"; do
  m=$(median "${figures[$mode]}")
  echo "median $mode: $m tok/s, ratio to ${modes[0]} $(awk -v a="$m" -v b="$ref" 'BEGIN{printf "%.3f", a/b}')"
done
