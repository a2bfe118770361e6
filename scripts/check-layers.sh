#!/usr/bin/env bash
# check-layers: fails when a folder of src/ depends on one it may not — an
# `#include "X/…"` (or a CMake target_link_libraries edge tessera_X) that runs up
# or across the layers of docs/architecture.md — and when src/ holds a folder this
# table does not place. apps/, tests/, bench/ and fuzz/ may include anything.
# Usage: scripts/check-layers.sh [ROOT]   (make test runs it; exit 1 on a violation)
set -euo pipefail
root=${1:-$(cd "$(dirname "$0")/.." && pwd)}

# Each folder of src/ and the folders it may use besides itself: the order
# base ← comm ← parallel ← model ← engine ← serve, with kernels on base only,
# kv on kernels, and plan/ and bench/ on base only (leaves that apps/ joins).
# Changing an edge is a design change: update docs/architecture.md with it.
declare -A allowed=(
  [base]=""
  [comm]="base"
  [kernels]="base"
  [kv]="base kernels"
  [parallel]="base comm"
  [model]="base kernels parallel"
  [engine]="base comm kernels kv parallel model"
  [serve]="base comm kernels kv parallel model engine"
  [plan]="base"
  [bench]="base"
)

fail=0
report() {
  echo "$1" >&2
  fail=1
}

may_use() {  # may_use FROM TO
  [[ "$1" == "$2" ]] && return 0
  local dep
  for dep in ${allowed[$1]}; do [[ "$dep" == "$2" ]] && return 0; done
  return 1
}

# Every folder of src/ must have a place in the table.
for path in "$root"/src/*/; do
  dir=$(basename "$path")
  [[ -v "allowed[$dir]" ]] ||
    report "src/$dir: not in the layer table of scripts/check-layers.sh (place it there and in docs/architecture.md)"
done

# Includes: only prefixes that are folders of src/ count ("hwy/…" is Highway's).
while IFS=: read -r file line text; do
  from=${file#"$root"/src/}
  from=${from%%/*}
  [[ "$text" =~ include[[:space:]]*\"([A-Za-z0-9_]+)/ ]] || continue
  to=${BASH_REMATCH[1]}
  [[ -d "$root/src/$to" && -v "allowed[$from]" ]] || continue
  may_use "$from" "$to" ||
    report "${file#"$root"/}:$line: $from -> $to (${from} may use: ${allowed[$from]:-nothing})"
done < <(grep -rnE '^[[:space:]]*#[[:space:]]*include[[:space:]]*"[A-Za-z0-9_]+/' "$root"/src || true)

# Link edges: target_link_libraries(tessera_X … tessera_Y …), over several lines.
while read -r cmake from to; do
  [[ -v "allowed[$from]" && -v "allowed[$to]" ]] || continue
  may_use "$from" "$to" ||
    report "${cmake#"$root"/}: target_link_libraries: tessera_$from -> tessera_$to ($from may use: ${allowed[$from]:-nothing})"
done < <(awk '
  /target_link_libraries\(/ { inside = 1; from = "" }
  inside {
    for (i = 1; i <= NF; ++i) {
      w = $i; sub(/^target_link_libraries\(/, "", w); done = sub(/\).*$/, "", w)
      if (w ~ /^tessera_/) { sub(/^tessera_/, "", w); if (from == "") from = w; else print FILENAME, from, w }
      if (done) { inside = 0; break }
    }
  }' "$root"/src/*/CMakeLists.txt)

if ((fail)); then
  echo "check-layers: FAILED (the layers: docs/architecture.md)" >&2
  exit 1
fi
echo "check-layers: ok — every #include and link edge in src/ follows the layers (docs/architecture.md)"
