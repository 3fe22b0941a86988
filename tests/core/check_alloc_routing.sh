#!/usr/bin/env bash
# check_alloc_routing.sh — test_alloc_routing: every allocation of src/ goes through
# core/alloc.h (loom__malloc and friends), so the allocation-failure sweep
# (tests/core/test_alloc_sweep.c) reaches all of them. Fails on a direct call of a libc
# allocator anywhere in src/ but core/alloc.* (the one place that calls them) and backend/cuda/
# (the CUDA plugin's host code: a library of its own, built by nvcc, outside the sweep).
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root" || exit 1
# A call: the name not preceded by an identifier character, a member access or "loom__".
pattern='(^|[^A-Za-z0-9_.>])(malloc|calloc|realloc|reallocarray|aligned_alloc|posix_memalign|memalign|valloc|pvalloc|strdup|strndup|asprintf|vasprintf)[[:space:]]*\('
hits=$(grep -rnE --include='*.c' --include='*.h' "$pattern" src \
           | grep -vE '^src/core/alloc\.(c|h):' | grep -vE '^src/backend/cuda/' \
           | grep -vE '^[^:]+:[0-9]+:[[:space:]]*(/?\*|//)')
if [ -n "$hits" ]; then
    echo "FAIL: libc allocators called directly (use core/alloc.h: loom__malloc, loom__calloc,"
    echo "loom__realloc, loom__aligned_alloc):"
    echo "$hits"
    exit 1
fi
n=$(grep -rnoE --include='*.c' --include='*.h' 'loom__(malloc|calloc|realloc|aligned_alloc)\(' src \
        | grep -vcE '^src/core/alloc\.(c|h):')
echo "ok: no direct libc allocator call under src/ (but core/alloc.* and backend/cuda/); $n calls go through core/alloc.h"
