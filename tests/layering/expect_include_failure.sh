#!/usr/bin/env bash
# expect_include_failure.sh CMAKE BUILD_DIR TARGET HEADER — test_layering: building TARGET (a
# probe that includes HEADER from a layer that may not) must fail, and fail because HEADER is
# not on that layer's include path. Also checks that no source under src/ escapes its layer's
# include path with a relative include ("../").
set -uo pipefail
cmake_bin=$1 build=$2 target=$3 header=$4
root=$(cd "$(dirname "$0")/../.." && pwd)
out=$("$cmake_bin" --build "$build" --target "$target" 2>&1)
rc=$?
if [ $rc -eq 0 ]; then
    echo "FAIL: $target built, but it includes $header, which its layer may not use"
    exit 1
fi
# gcc: "sched/sched.h: No such file or directory"; clang: "'sched/sched.h' file not found"
if ! grep -qE "$header: No such file or directory|'$header' file not found" <<<"$out"; then
    echo "FAIL: $target failed to build, but not for the missing $header:"
    echo "$out" | tail -20
    exit 1
fi
echo "ok: $target does not build: $(grep -m1 "$header" <<<"$out")"
if grep -rnE '#include "\.\./' "$root/src" "$root/include"; then
    echo "FAIL: a relative include bypasses the layers' include paths"
    exit 1
fi
echo "ok: no relative includes under src/"
