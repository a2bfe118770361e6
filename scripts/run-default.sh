#!/usr/bin/env bash
# The main job on the embedded default: an OpenAI-compatible server on
# http://127.0.0.1:8000 with the model split tensor-parallel over 2 local rank
# processes, until Ctrl-C. The model: $TESSERA_MODEL if set, else
# ../shared/models/stories260K.gguf when present, else a small random-weight model
# synthesised into build/ (real serving, gibberish text). Extra arguments go to
# `tessera serve` (e.g. make run RUN_ARGS="--tp 1 --port 8080").
set -euo pipefail
cd "$(dirname "$0")/.."
TESSERA=build/bin/tessera
MODEL=${TESSERA_MODEL:-}
if [ -z "$MODEL" ]; then
  if [ -f ../shared/models/stories260K.gguf ]; then
    MODEL=../shared/models/stories260K.gguf
  else
    MODEL=build/default-model.gguf
    [ -f "$MODEL" ] || "$TESSERA" synth --dim 256 --layers 4 --heads 8 --ffn 512 --type q8_0 \
      --seed 1 --name default -o "$MODEL"
  fi
fi
NAME=$(basename "$MODEL" .gguf)
cat << EOF_HELP
tessera serve $MODEL --tp 2  (http://127.0.0.1:8000, model "$NAME"; Ctrl-C stops it)
try, from another shell:
  curl -s http://127.0.0.1:8000/v1/completions -H 'Content-Type: application/json' \\
    -d '{"model": "$NAME", "prompt": "Once upon a time", "max_tokens": 48}'
  curl -sN http://127.0.0.1:8000/v1/completions -H 'Content-Type: application/json' \\
    -d '{"model": "$NAME", "prompt": "Once upon a time", "max_tokens": 48, "stream": true}'
  curl -s http://127.0.0.1:8000/metrics | grep tessera_
  build/bin/tessera bench serve --num-prompts 32 --max-concurrency 8 --input-len 64 --output-len 64
EOF_HELP
exec "$TESSERA" serve "$MODEL" --tp 2 "$@"
