#!/usr/bin/env bash
# scripts/check-layers.sh against copies of src/: the tree as it is passes; an
# include that runs up the layers, a link edge that does, and a folder the table
# does not place each fail with a message naming them.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d /tmp/tessera-layers.XXXXXX)
trap 'rm -rf "$work"' EXIT
fresh() {  # a copy of the repository's src/ under $work/$1
  mkdir -p "$work/$1"
  cp -r "$repo/src" "$work/$1/"
  echo "$work/$1"
}
expect_fail() {  # name root needle
  local out
  if out=$("$repo/scripts/check-layers.sh" "$2" 2>&1); then
    echo "FAIL: $1: check-layers passed" >&2
    exit 1
  fi
  grep -qF "$3" <<< "$out" || { echo "FAIL: $1: no '$3' in: $out" >&2; exit 1; }
  echo "ok: $1"
}

"$repo/scripts/check-layers.sh" "$(fresh clean)" > /dev/null
echo "ok: the tree passes"

root=$(fresh include)
echo '#include "serve/metrics.h"' >> "$root/src/kernels/matmul.h"
expect_fail "kernels including serve" "$root" "src/kernels/matmul.h"

root=$(fresh link)
echo 'target_link_libraries(tessera_comm PUBLIC tessera_engine)' >> "$root/src/comm/CMakeLists.txt"
expect_fail "comm linking engine" "$root" "tessera_engine"

root=$(fresh folder)
mkdir -p "$root/src/router" && echo '#pragma once' > "$root/src/router/router.h"
expect_fail "an unplaced folder" "$root" "router"
