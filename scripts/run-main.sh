#!/usr/bin/env bash
# run-main.sh — the README's main job: set up, build, and generate text on the CPU backend.
#   scripts/run-main.sh [MODEL.gguf] [PROMPT] [extra loom-generate flags...]
# Without a model path it writes a small synthetic llama model (random weights: the text is
# gibberish by design) — the real default model (Gemma 3 270M) arrives with the gemma3
# architecture.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/python ] || scripts/setup-python.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DLOOM_PYTHON="$PWD/.venv/bin/python" >/dev/null
cmake --build build -j"$(nproc)" --target loom-generate >/dev/null

model="${1:-}"
if [ -z "$model" ]; then
    model=models/synthetic-llama.gguf
    if [ ! -f "$model" ]; then
        mkdir -p models
        PYTHONPATH=tests/conformance .venv/bin/python -c \
            "import synth_llama as s; s.write_llama('$model', s.SHAPES[0])"
    fi
fi
prompt="${2:-Once upon a time}"
shift $(( $# > 2 ? 2 : $# ))
exec build/loom-generate -m "$model" -p "$prompt" -n 64 "$@"
