#!/usr/bin/env bash
# test-alloc-faults.sh — the allocation-failure sweep (issue 18, item 2): builds build-faults
# with LOOM_ALLOC_FAULTS (every allocation of the library counted, the N-th made to fail: see
# src/core/alloc.h) under AddressSanitizer + UndefinedBehaviorSanitizer, and runs the sweeps,
# tests/core/test_alloc_sweep.c (model loading, engine creation, sessions, the tokenizer,
# traces) and test_alloc_sweep_engine.c (submit, engine steps, bursts of requests), which make
# each allocation fail in turn and check for a clean status, no leak (LeakSanitizer) and an
# object still usable. Only the sweeps are built. The Python for
# the configure step (conformance tests, not run here): $LOOM_PYTHON, else .venv's, else
# python3.
set -euo pipefail
cd "$(dirname "$0")/.."
start=$SECONDS
PY=${LOOM_PYTHON:-$PWD/.venv/bin/python}
[ -x "$PY" ] || PY=$(command -v python3)
jobs=$(nproc)

cmake -S . -B build-faults -DCMAKE_BUILD_TYPE=RelWithDebInfo -DLOOM_WERROR=ON \
      -DLOOM_SANITIZE=address,undefined -DLOOM_ALLOC_FAULTS=ON -DLOOM_CUDA=OFF \
      -DLOOM_BUILD_BENCH=OFF -DLOOM_BUILD_EXAMPLES=OFF -DLOOM_PYTHON="$PY" >/dev/null
cmake --build build-faults -j"$jobs" --target test_alloc_sweep test_alloc_sweep_engine
log=$(mktemp)
trap 'rm -f "$log"' EXIT
ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
    ctest --test-dir build-faults -R '^test_alloc_sweep' -j"$jobs" --output-on-failure \
          --no-tests=error | tee "$log"
# Built with the option, the sweeps never skip (exit 77): a skip here means one did not run.
if grep -q "Skipped" "$log"; then
    echo "test-alloc-faults: a sweep was skipped (built without LOOM_ALLOC_FAULTS?)"
    exit 1
fi
# The per-phase counts (failure points and outcomes), from the test's log.
grep -E '^(sweep |llama, |gemma3, )' build-faults/Testing/Temporary/LastTest.log || true
echo "test-alloc-faults: $((SECONDS - start)) s"
