#!/usr/bin/env bash
# The main job on the embedded default: an OpenAI-compatible server on
# http://127.0.0.1:8000 with the model split tensor-parallel over 2 local rank
# processes, until Ctrl-C. The model: $MODEL (make run MODEL=path.gguf), else
# models/stories260K.gguf, shipped in the repository (a tiny real model that
# writes children's stories; models/README.md). MODEL=synth-110m serves a
# 110M-parameter random-weight llama (Q8_0) synthesised on first run into build/
# instead: real serving at a realistic size, random text. Extra arguments go to
# `tessera serve` (make run RUN_ARGS="--port 8080").
set -euo pipefail
cd "$(dirname "$0")/.."
TESSERA=build/bin/tessera
MODEL=${MODEL:-models/stories260K.gguf}
if [ "$MODEL" = synth-110m ]; then
  MODEL=build/synth-110m.gguf
  # The tokenizer of the shared test vocabulary when it is there, else a synthetic one.
  vocab=()
  [ -f ../shared/models/llama-2-tiny-random.gguf ] && vocab=(--vocab-from ../shared/models/llama-2-tiny-random.gguf)
  [ -f "$MODEL" ] || "$TESSERA" synth --dim 768 --layers 12 --heads 12 --ffn 2048 --type q8_0 \
    "${vocab[@]}" --seed 1 --name synth-110m -o "$MODEL"
fi
NAME=$(basename "$MODEL" .gguf)
cat << EOF_HELP
tessera serve $MODEL --tp 2  (http://127.0.0.1:8000, model "$NAME"; Ctrl-C stops it)
try, from another shell:
  curl -s http://127.0.0.1:8000/v1/completions -H 'Content-Type: application/json' \\
    -d '{"model": "$NAME", "prompt": "Once upon a time", "max_tokens": 48}'
  curl -sN http://127.0.0.1:8000/v1/completions -H 'Content-Type: application/json' \\
    -d '{"model": "$NAME", "prompt": "Once upon a time", "max_tokens": 48, "stream": true}'
  curl -s http://127.0.0.1:8000/v1/chat/completions -H 'Content-Type: application/json' \\
    -d '{"model": "$NAME", "messages": [{"role": "user", "content": "Lily saw a cat"}], "max_tokens": 48}'
  curl -s http://127.0.0.1:8000/metrics | grep tessera_
  build/bin/tessera bench serve --num-prompts 32 --max-concurrency 8 --input-len 64 --output-len 64
EOF_HELP
exec "$TESSERA" serve "$MODEL" --tp 2 "$@"
