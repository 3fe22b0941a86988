#!/usr/bin/env bash
# check_no_abort.sh — test_no_abort: the library never ends the process. No source of libloom or
# its plugins (src/, kernels/) may call exit, abort, an assert or a trap, on any path: a bad
# file, a hostile request or a full memory must cost one call a status, never the caller its
# process (issue 18). Comments are ignored; tests and tools may abort.
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
hits=$(grep -rnE '\b(exit|_Exit|quick_exit|abort|assert)[[:space:]]*\(|__builtin_trap|#include <assert\.h>' \
    "$root/src" "$root/kernels" --include='*.c' --include='*.h' --include='*.cu' --include='*.cuh' |
    grep -vE '^[^:]+:[0-9]+:[[:space:]]*(/\*|\*|//)')
if [ -n "$hits" ]; then
    echo "FAIL: the library may end the process here:"
    echo "$hits"
    exit 1
fi
echo "ok: no exit, abort, assert or trap under src/ and kernels/"
