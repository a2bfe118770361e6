#!/usr/bin/env bash
# The main job on the embedded default: for now, the collective benchmark on two
# local ranks over shared memory. Extra arguments go to `tessera bench comm`.
set -euo pipefail
cd "$(dirname "$0")/.."
exec build/bin/tessera bench comm --np 2 "$@"
