#!/usr/bin/env bash
# fuzz.sh [SECONDS] [TARGET...] — builds the libFuzzer targets (tests/fuzz/fuzz_*.c) with clang,
# AddressSanitizer and UndefinedBehaviorSanitizer in build-fuzz/, and runs each for SECONDS
# (default 60) from its seeds (tests/fuzz/corpus/<target>/, and GGUF files that
# tests/fuzz/make_corpus.py --gguf writes into build-fuzz/seeds/). A crash, a leak, a sanitizer report, an input slower than
# 10 s or one that needs more than 2 GB fails the run; the input is copied into
# tests/fuzz/regress/<target>/, which the ordinary test suite replays (commit it with the fix).
# The corpus grown by a run stays in build-fuzz/corpus/ and seeds the next local run.
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-60}
shift || true
PY="$PWD/.venv/bin/python"
jobs=$(nproc)
CC=clang CXX=clang++ cmake -S . -B build-fuzz -DCMAKE_BUILD_TYPE=RelWithDebInfo -DLOOM_WERROR=ON \
    -DLOOM_FUZZ=ON -DLOOM_SANITIZE=address,undefined -DLOOM_CUDA=OFF -DLOOM_BUILD_BENCH=OFF \
    -DLOOM_BUILD_EXAMPLES=OFF -DLOOM_PYTHON="$PY" >/dev/null
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
    for f in tests/fuzz/fuzz_*.c; do targets+=("$(basename "$f" .c)"); done
fi
cmake --build build-fuzz -j"$jobs" --target "${targets[@]}"
"$PY" tests/fuzz/make_corpus.py --gguf build-fuzz/seeds >/dev/null
export ASAN_OPTIONS=detect_leaks=1:allocator_may_return_null=1
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
failed=()
for t in "${targets[@]}"; do
    work=build-fuzz/corpus/$t
    art=build-fuzz/artifacts/$t
    mkdir -p "$work" "$art"
    seeds=()
    for d in tests/fuzz/corpus/"$t" build-fuzz/seeds/"$t"; do
        [ -n "$(ls -A "$d" 2>/dev/null)" ] && seeds+=("$d")
    done
    if [ ${#seeds[@]} -eq 0 ]; then
        echo "fuzz: $t has no seeds (tests/fuzz/corpus/$t, build-fuzz/seeds/$t)"
        failed+=("$t")
        continue
    fi
    log=build-fuzz/$t.log
    echo "fuzz: $t for ${secs} s"
    rc=0
    build-fuzz/tests/fuzz/"$t" "$work" "${seeds[@]}" -max_total_time="$secs" \
        -timeout=10 -rss_limit_mb=2048 -max_len=65536 -print_final_stats=1 \
        -artifact_prefix="$art/" >"$log" 2>&1 || rc=$?
    { grep -E "^stat::number_of_executed_units|^stat::peak_rss_mb|cov: [0-9]+" "$log" || true; } |
        tail -3 | sed "s/^/  $t: /"
    if [ $rc -ne 0 ]; then
        tail -40 "$log"
        mkdir -p tests/fuzz/regress/"$t"
        for a in "$art"/*; do
            [ -f "$a" ] || continue
            cp "$a" tests/fuzz/regress/"$t"/
            echo "fuzz: $t: kept $(basename "$a") in tests/fuzz/regress/$t/"
        done
        failed+=("$t")
    fi
done
if [ ${#failed[@]} -gt 0 ]; then
    echo "fuzz: FAILED: ${failed[*]} (logs in build-fuzz/*.log)"
    exit 1
fi
echo "fuzz: every target ran ${secs} s clean"
