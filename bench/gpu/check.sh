#!/usr/bin/env bash
# check.sh — THE GPU check: run it on a machine with an NVIDIA GPU, in one call, and commit the
# table it writes to bench/results/gpu-<date>.md. Usage: bench/gpu/check.sh OUT_DIR
#
# In order, each step logged to OUT_DIR/raw.log and summarised in OUT_DIR/gpu-check.md:
#   1. build libloom-cuda.so, the CUDA tests and loom-gpu-bench for this device's architecture
#      only (all cores; cmocka from .gpu-deps/ where the system lacks it: bench/gpu/pack-deps.sh);
#   2. every CUDA test (ctest -R cuda): each op against the CPU backend, whole models;
#   3. the card's ceilings and loom's kernels timed against them (loom-gpu-bench);
#   4. the same shapes by PyTorch (cuBLAS matmul, flash SDPA) and, time allowing, Hugging Face
#      transformers generating with a random Llama-3-8B shape (bench/gpu/peers.py).
# A step that fails is reported and the next still runs; the script aims to end within 8
# minutes on an H200. Nothing here needs the network.
set -uo pipefail
out=${1:?usage: bench/gpu/check.sh OUT_DIR}
cd "$(dirname "$0")/../.."
mkdir -p "$out"
log="$out/raw.log"
md="$out/gpu-check.md"
: >"$log"
start=$(date +%s)
elapsed() { echo $(($(date +%s) - start)); }
step() { echo "=== $* ($(elapsed) s)" | tee -a "$log"; }
status=()

step "device"
nvidia-smi >>"$log" 2>&1 || echo "nvidia-smi failed" >>"$log"
cc=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1 | tr -d ' ')
gpu=$(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | head -1)
arch=${cc/./}
[ "$arch" = "90" ] && arch=90a # Hopper: the arch-specific target (wgmma, TMA) where used
[ -n "$arch" ] || arch=90a
echo "compute capability $cc -> $arch-real; $gpu" | tee -a "$log"

step "build"
jobs=$(nproc)
gen=()
command -v ninja >/dev/null && gen=(-G Ninja)
extra=()
if [ -f .gpu-deps/include/cmocka.h ]; then
    extra+=(-DCMOCKA_INCLUDE_DIR="$PWD/.gpu-deps/include" -DCMOCKA_LIBRARY="$PWD/.gpu-deps/lib/libcmocka.so.0")
    export LD_LIBRARY_PATH="$PWD/.gpu-deps/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
b0=$(date +%s)
if cmake -S . -B build-gpu "${gen[@]}" -DCMAKE_BUILD_TYPE=Release -DLOOM_CUDA=ON \
        -DLOOM_CUDA_ARCHITECTURES="$arch-real" -DLOOM_BUILD_EXAMPLES=OFF "${extra[@]}" >>"$log" 2>&1 &&
   cmake --build build-gpu -j"$jobs" --target loom-cuda test_cuda_ops test_cuda_nodevice \
        loom-gpu-bench >>"$log" 2>&1; then
    status+=("| build ($arch-real, $jobs jobs) | ok, $(($(date +%s) - b0)) s |")
else
    status+=("| build ($arch-real) | FAILED (raw.log) |")
    tail -40 "$log"
fi
export LOOM_BACKEND_PATH="$PWD/build-gpu"

step "tests"
if [ -x build-gpu/tests/test_cuda_ops ]; then
    (cd build-gpu/tests && LOOM_TEST_TMP="$PWD" timeout 240 ./test_cuda_ops) >"$out/test_cuda_ops.log" 2>&1
    rc=$?
    cat "$out/test_cuda_ops.log" >>"$log"
    passed=$(grep -c '^\[       OK \]' "$out/test_cuda_ops.log")
    failed=$(grep '^\[  FAILED  \] test_' "$out/test_cuda_ops.log" | sed 's/.*\] //' | tr '\n' ' ')
    case $rc in
    0) status+=("| test_cuda_ops | ok: $passed tests passed |") ;;
    77) status+=("| test_cuda_ops | SKIPPED: $(head -1 "$out/test_cuda_ops.log") |") ;;
    124) status+=("| test_cuda_ops | TIMED OUT after 240 s ($passed passed) |") ;;
    *) status+=("| test_cuda_ops | FAILED rc=$rc: $failed($passed passed; test_cuda_ops.log) |") ;;
    esac
    grep -E "error|FAIL" "$out/test_cuda_ops.log" | head -20
else
    status+=("| test_cuda_ops | not built |")
fi

step "kernels"
if [ -x build-gpu/bench/loom-gpu-bench ]; then
    timeout 150 build-gpu/bench/loom-gpu-bench >"$out/loom-bench.jsonl" 2>>"$log"
    rc=$?
    cat "$out/loom-bench.jsonl" >>"$log"
    status+=("| loom-gpu-bench | $([ $rc = 0 ] && echo ok || echo "FAILED rc=$rc") |")
fi

step "peers"
left=$((450 - $(elapsed)))
if [ -s "$out/loom-bench.jsonl" ] && python3 -c "import torch" 2>/dev/null; then
    hf=$((left > 150 ? left - 120 : 0))
    timeout $((left > 60 ? left : 60)) python3 bench/gpu/peers.py "$out/loom-bench.jsonl" \
        --hf-seconds "$hf" >"$out/peers.md" 2>>"$log"
    rc=$?
    status+=("| peers (torch$([ $hf -gt 0 ] && echo ', transformers')) | $([ $rc = 0 ] && echo ok || echo "FAILED rc=$rc") |")
else
    status+=("| peers | not run (no bench output or no torch) |")
fi

step "table"
{
    echo "# GPU check, $(date -u +%Y-%m-%d) — $gpu"
    echo
    echo "Commit $(git rev-parse --short HEAD 2>/dev/null || echo '?')$(git diff --quiet 2>/dev/null || echo ' (with uncommitted changes)'); \`bench/gpu/check.sh\`, $(elapsed) s in all."
    echo
    echo "| step | result |"
    echo "|---|---|"
    printf '%s\n' "${status[@]}"
    echo
    [ -s "$out/peers.md" ] && cat "$out/peers.md"
} >"$md"
cat "$md"
