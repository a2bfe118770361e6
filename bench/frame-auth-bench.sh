#!/usr/bin/env bash
# Decode throughput at tp=2 over TCP with per-frame authentication (the default)
# against TESSERA_TCP_FRAME_AUTH=0, interleaved A/B (the order alternates round by
# round), each run under `flock -x` of the shared CPU lock; the generated text must
# be the same both ways. Prints each round's pair and the medians.
# Usage: bench/frame-auth-bench.sh TESSERA MODEL [ROUNDS=5] [TOKENS=200]
set -euo pipefail
tessera=$1
model=$2
rounds=${3:-5}
tokens=${4:-200}
lock=${CPU_LOCK:-/work/.cpu.lock}
run() {  # $1 = 1|0: tok/s of the decode, text into $2
  TESSERA_TCP_FRAME_AUTH=$1 flock -x "$lock" "$tessera" generate "$model" -p "Once upon a time" \
    -n "$tokens" --temp 0 --tp 2 --transport tcp -t 1 >"$2.out" 2>"$2.err"
  grep -o 'generated [0-9]* tokens, [0-9.]* tok/s' "$2.err" | awk '{print $4}'
}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
on=() off=()
for ((r = 0; r < rounds; r++)); do
  if ((r % 2 == 0)); then
    a=$(run 1 "$tmp/on"); b=$(run 0 "$tmp/off")
  else
    b=$(run 0 "$tmp/off"); a=$(run 1 "$tmp/on")
  fi
  cmp -s "$tmp/on.out" "$tmp/off.out" || { echo "outputs differ" >&2; exit 1; }
  on+=("$a"); off+=("$b")
  echo "round $r: authenticated $a tok/s, unauthenticated $b tok/s"
done
median() { printf '%s\n' "$@" | sort -g | awk '{v[NR]=$1} END {print (NR%2) ? v[(NR+1)/2] : (v[NR/2]+v[NR/2+1])/2}'; }
m_on=$(median "${on[@]}"); m_off=$(median "${off[@]}")
echo "median: authenticated $m_on tok/s, unauthenticated $m_off tok/s, ratio $(awk -v a="$m_on" -v b="$m_off" 'BEGIN{printf "%.3f", a/b}')"
