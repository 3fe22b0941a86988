#!/usr/bin/env bash
# smem-banks.sh — shared-memory bank conflicts and global-memory coalescing of the CUDA kernels,
# by kernel and by source line, without a GPU: test_kernels_emu built with clang's load/store
# hooks (LOOM_EMU_SMEM_BANKS) runs the kernels on the emulator over its test cases, and
# tests/kernels_emu/smem_banks.cpp counts each warp request's shared-memory wavefronts (32 banks
# of 4-byte words) and global 32-byte sectors against the least it could take.
# Usage: bench/gpu/smem-banks.sh OUT.md [PART ...]   (parts: test_kernels_emu's; default all)
# Builds in build-banks (LOOM_BANKS_BUILD to change). Needs clang and addr2line.
# The model's limits (the host compiler's access widths, warps paired by their n-th access) are
# in smem_banks.cpp; a line where the width matters is worth a look at nvcc's PTX.
set -euo pipefail
cd "$(dirname "$0")/../.."
out=${1:?usage: bench/gpu/smem-banks.sh OUT.md [PART ...]}
shift
build=${LOOM_BANKS_BUILD:-build-banks}
CC=clang CXX=clang++ cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DLOOM_EMU_SMEM_BANKS=ON -DLOOM_CUDA=OFF -DLOOM_BUILD_BENCH=OFF -DLOOM_BUILD_EXAMPLES=OFF \
    -DLOOM_BUILD_SERVER=OFF >/dev/null
cmake --build "$build" -j"$(nproc)" --target test_kernels_emu >/dev/null
report=$(mktemp)
trap 'rm -f "$report"' EXIT
start=$(date +%s)
LOOM_EMU_BANKS="$report" "$build/tests/test_kernels_emu" "$@" >"$report.log" 2>&1 || {
    cat "$report.log"
    echo "smem-banks: test_kernels_emu failed" >&2
    exit 1
}
rm -f "$report.log"
{
    echo "# Memory accesses of the CUDA kernels (emulated): shared-memory banks, global sectors"
    echo
    echo "Commit $(git rev-parse --short HEAD)$(git diff --quiet HEAD -- kernels || echo ' (kernels/ modified)'), $(date -u +%Y-%m-%d);" \
        "\`bench/gpu/smem-banks.sh\` over test_kernels_emu's parts: ${*:-all}, $(($(date +%s) - start)) s."
    echo "A request is one warp's memory instruction. Shared memory: its wavefronts are the most distinct"
    echo "4-byte words one of the 32 banks holds among those its lanes touch; the least is its words / 32."
    echo "Global memory (what the tests keep on the heap): the 32-byte sectors it touches; the least is"
    echo "its bytes / 32. No caches."
    echo "Excess: wavefronts over the least. A request is the n-th execution of an access by each lane"
    echo "of a warp between two of its collectives. Widths are the host compiler's, merged within"
    echo "16-byte lines (see tests/kernels_emu/smem_banks.cpp)."
    echo
    cat "$report"
} >"$out"
echo "smem-banks: wrote $out"
