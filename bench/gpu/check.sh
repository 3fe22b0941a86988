#!/usr/bin/env bash
# check.sh — THE GPU check: run it on a machine with an NVIDIA GPU, in one call, and commit the
# table it writes to bench/results/gpu-<date>.md. Usage: bench/gpu/check.sh OUT_DIR
#
# In order, each step logged to OUT_DIR/raw.log, the table OUT_DIR/gpu-check.md rewritten
# after every step (a run cut short still leaves what it got):
#   1. build libloom-cuda.so, test_cuda_ops, loom-gpu-bench and loom-gpu-e2e for this device's
#      architecture only (all cores; cmocka from .gpu-deps/ where the system lacks it — run
#      bench/gpu/pack-deps.sh here and carry .gpu-deps; without it the tests are not built);
#   2. test_cuda_ops: each op against the CPU backend, whole models' logits, engines, batch
#      invariance (16 requests together and alone); then its kernel and engine tests again in
#      the fast mode (LOOM_CUDA_BATCH_INVARIANT=0), with 16-bit operands (LOOM_CUDA_MATH=bf16)
#      and on Hopper's wgmma GEMM (LOOM_CUDA_WGMMA=1);
#   3. the card's ceilings and loom's kernels timed against them (loom-gpu-bench);
#   4. the same shapes by PyTorch (cuBLAS matmul, flash SDPA) and, time allowing, Hugging Face
#      transformers generating with a random Llama-3-8B shape (bench/gpu/peers.py);
#   5. end to end: prefill and decode tokens/s of synthetic Gemma-3-270M and Llama-3-8B shapes,
#      again with CUDA graphs (LOOM_CUDA_GRAPHS=1), in the fast mode for two of them and with
#      BF16 math for the Llama-3-8B shape;
#   5b. Nsight Compute (ncu) over a decode step and a prefill: the three heaviest kernels of each
#      with achieved bandwidth, tensor-pipe use and stall reasons (bench/gpu/ncu.sh);
#   6. the tests' teeth: the plugin rebuilt with a planted off-by-one in attention's mask
#      (LOOM_CUDA_PLANTED_BUG) must make test_attention fail;
#   7. time allowing: e2e with graphs, in the fast mode, in bf16 math and on the wgmma GEMM,
#      then the ncu pass (5b above), then e2e without the fusions (LOOM_CUDA_FUSE=0).
# Every step has a share of one 460 s deadline; a step that fails or runs out is reported and
# the next still runs. Nothing here needs the network.
set -uo pipefail
out=${1:?usage: bench/gpu/check.sh OUT_DIR}
cd "$(dirname "$0")/../.."
mkdir -p "$out"
log="$out/raw.log"
md="$out/gpu-check.md"
: >"$log"
start=$(date +%s)
deadline=$((start + 460))
elapsed() { echo $(($(date +%s) - start)); }
# budget N: the seconds a step may take: N, or what is left before the deadline (at least 10)
budget() {
    local left=$((deadline - $(date +%s)))
    [ "$left" -lt "$1" ] && echo $((left > 10 ? left : 10)) || echo "$1"
}
step() { echo "=== $* ($(elapsed) s)" | tee -a "$log"; }
status=()
gpu="?"
table() {
    {
        echo "# GPU check, $(date -u +%Y-%m-%d) — $gpu"
        echo
        echo "Commit $(git rev-parse --short HEAD 2>/dev/null || echo '?')$(git diff --quiet HEAD 2>/dev/null || echo ' (with uncommitted changes)'); \`bench/gpu/check.sh\`, $(elapsed) s so far."
        echo
        echo "| step | result |"
        echo "|---|---|"
        printf '%s\n' "${status[@]}"
        echo
        [ -s "$out/peers.md" ] && cat "$out/peers.md" && echo
        if [ -s "$out/e2e.jsonl" ]; then
            echo "End to end (synthetic models, loom_model_load_synthetic; prefill: one call of 512 or 2,048 tokens; decode: B requests of 16-token prompts generating 64 tokens each, B*64 / wall time). Mode: invariant (the default) or fast (LOOM_CUDA_BATCH_INVARIANT=0); graphs: LOOM_CUDA_GRAPHS=1; fusions: a layer's q/k norms, rope and KV write in one launch and Gemma's post-norm, residual add and next norm in one (on, the default) or as separate launches (LOOM_CUDA_FUSE=0); math: f32 (the default), bf16 (LOOM_CUDA_MATH=bf16) or bf16+wgmma (and LOOM_CUDA_WGMMA=1, which the device takes on Hopper only: see the wgmma test row):"
            echo
            echo "| model | weights | mode | graphs | fusions | math | load s | prefill 512 tok/s | prefill 2048 tok/s | decode B=1 tok/s | B=16 | B=64 |"
            echo "|---|---|---|---|---|---|---:|---:|---:|---:|---:|---:|"
            python3 - "$out/e2e.jsonl" "$out/e2e-modes.jsonl" <<'PY'
import json, os, sys
for path in sys.argv[1:]:
    if not os.path.exists(path):
        continue
    for l in open(path):
        if not l.startswith("{"):
            continue
        try:  # a run cut short leaves a line without its end
            r = json.loads(l)
        except json.JSONDecodeError:
            continue
        mode = "invariant" if r.get("invariant", True) else "fast"
        graphs = "on" if r.get("graphs") else "off"
        qk = "on" if r.get("fused", True) else "off"
        print(f"| {r['model']} | {r['type']} | {mode} | {graphs} | {qk} | {r.get('math', 'f32')} | {r['load_s']} | "
              f"{r['prefill_512_tps']} | {r.get('prefill_2048_tps', '')} | "
              f"{r.get('decode_b1_tps', '')} | {r.get('decode_b16_tps', '')} | "
              f"{r.get('decode_b64_tps', '')} |")
PY
            echo
        fi
        [ -s "$out/ncu.md" ] && cat "$out/ncu.md" && echo
    } >"$md"
}

step "device"
nvidia-smi >>"$log" 2>&1 || echo "nvidia-smi failed" >>"$log"
cc=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1 | tr -d ' ')
gpu=$(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | head -1)
arch=${cc/./}
[ "$arch" = "90" ] && arch=90a # Hopper: the arch-specific target
[ -n "$arch" ] || arch=90a
echo "compute capability ${cc:-?} -> $arch-real; ${gpu:-no nvidia-smi}" | tee -a "$log"

step "build"
jobs=$(nproc)
gen=()
command -v ninja >/dev/null && gen=(-G Ninja)
extra=()
targets=(loom-cuda loom-gpu-bench loom-gpu-e2e loom-gpu-ncu)
if [ -f .gpu-deps/include/cmocka.h ]; then
    extra+=(-DCMOCKA_INCLUDE_DIR="$PWD/.gpu-deps/include" -DCMOCKA_LIBRARY="$PWD/.gpu-deps/lib/libcmocka.so.0")
    export LD_LIBRARY_PATH="$PWD/.gpu-deps/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    targets+=(test_cuda_ops)
elif [ -f /usr/include/cmocka.h ]; then
    targets+=(test_cuda_ops)
else
    extra+=(-DLOOM_BUILD_TESTS=OFF)
fi
b0=$(date +%s)
if timeout "$(budget 200)" cmake -S . -B build-gpu "${gen[@]}" -DCMAKE_BUILD_TYPE=Release \
        -DLOOM_CUDA=ON -DLOOM_CUDA_ARCHITECTURES="$arch-real" -DLOOM_BUILD_EXAMPLES=OFF \
        "${extra[@]}" >>"$log" 2>&1 &&
   timeout "$(budget 200)" cmake --build build-gpu -j"$jobs" --target "${targets[@]}" >>"$log" 2>&1; then
    status+=("| build ($arch-real, $jobs jobs: ${targets[*]}) | ok, $(($(date +%s) - b0)) s |")
else
    status+=("| build ($arch-real) | FAILED (raw.log) |")
    tail -40 "$log"
fi
export LOOM_BACKEND_PATH="$PWD/build-gpu"
table

step "tests"
# run_tests LABEL LOG SECONDS [VAR=VALUE ...]: test_cuda_ops under env, its row in the table;
# sets rc
run_tests() {
    local label=$1 name=$2 t=$3
    shift 3
    (cd build-gpu/tests && env LOOM_TEST_TMP="$PWD" "$@" timeout "$t" ./test_cuda_ops) \
        >"$out/$name" 2>&1
    rc=$?
    cat "$out/$name" >>"$log"
    local passed failed
    passed=$(grep -c '^\[       OK \]' "$out/$name")
    failed=$(grep '^\[  FAILED  \] test_' "$out/$name" | sed 's/.*\] //' | tr '\n' ' ')
    case $rc in
    0) status+=("| $label | ok: $passed tests passed |") ;;
    77) status+=("| $label | SKIPPED: $(head -1 "$out/$name") |") ;;
    124) status+=("| $label | TIMED OUT after $t s ($passed passed) |") ;;
    *) status+=("| $label | FAILED rc=$rc: $failed($passed passed; $name) |") ;;
    esac
    grep -E "error|FAIL" "$out/$name" | head -20
}
if [ -x build-gpu/tests/test_cuda_ops ]; then
    run_tests test_cuda_ops test_cuda_ops.log "$(budget 150)"
    # the fast mode (LOOM_CUDA_BATCH_INVARIANT=0): the kernels only it runs (the GEMV for
    # decode steps, split-KV decode attention, cuBLASLt's FP8 GEMM) and its engine
    if [ $rc != 77 ]; then
        run_tests "test_cuda_ops, fast mode (LOOM_CUDA_BATCH_INVARIANT=0)" test_cuda_ops_fast.log \
            "$(budget 90)" LOOM_CUDA_BATCH_INVARIANT=0 \
            LOOM_TEST_ONLY=test_matmul,test_attention_batches,test_attention,test_models_logits,test_models_engine,test_fp8_gemm,test_engine_batch_invariance
        # BF16 math (LOOM_CUDA_MATH=bf16): the 16-bit forms of the GEMM and the tiled kernel,
        # against the CPU within BF16 tolerances, their bits across steps as strictly
        run_tests "test_cuda_ops, BF16 math (LOOM_CUDA_MATH=bf16)" test_cuda_ops_bf16.log \
            "$(budget 80)" LOOM_CUDA_MATH=bf16 \
            LOOM_TEST_ONLY=test_matmul,test_matmul_multi,test_attention_batches,test_attention,test_models_logits,test_engine_batch_invariance
        # the wgmma kernels (LOOM_CUDA_WGMMA=1, Hopper): the GEMM's own test, then the matmuls,
        # attention (head sizes 64 and 128 on wgmma), models and engine on them (elsewhere the
        # device ignores the variable and test_wgmma_gemm says so)
        run_tests "test_cuda_ops, wgmma (LOOM_CUDA_MATH=bf16 LOOM_CUDA_WGMMA=1)" \
            test_cuda_ops_wgmma.log "$(budget 80)" LOOM_CUDA_MATH=bf16 LOOM_CUDA_WGMMA=1 \
            LOOM_TEST_ONLY=test_wgmma_gemm,test_matmul,test_matmul_multi,test_attention_batches,test_attention,test_models_logits,test_engine_batch_invariance
        grep -m5 "wgmma gemm" "$out/test_cuda_ops_wgmma.log"
    fi
else
    status+=("| test_cuda_ops | not built (no cmocka: carry .gpu-deps) |")
fi
table

step "kernels"
if [ -x build-gpu/bench/loom-gpu-bench ]; then
    timeout "$(budget 100)" build-gpu/bench/loom-gpu-bench >"$out/loom-bench.jsonl" 2>>"$log"
    rc=$?
    cat "$out/loom-bench.jsonl" >>"$log"
    status+=("| loom-gpu-bench | $([ $rc = 0 ] && echo ok || echo "FAILED rc=$rc (raw.log)") |")
fi
table

step "peers"
if [ -s "$out/loom-bench.jsonl" ] && python3 -c "import torch" 2>/dev/null; then
    t=$(budget 150)
    hf=$((t > 110 ? t - 60 : 0))
    timeout "$t" python3 bench/gpu/peers.py "$out/loom-bench.jsonl" --hf-seconds "$hf" \
        >"$out/peers.md" 2>>"$log"
    rc=$?
    status+=("| peers (torch$([ $hf -gt 0 ] && echo ', transformers')) | $([ $rc = 0 ] && echo ok || echo "FAILED rc=$rc (raw.log)") |")
else
    status+=("| peers | not run (no bench output or no torch) |")
fi
table

step "end to end"
if [ -x build-gpu/bench/loom-gpu-e2e ]; then
    timeout "$(budget 120)" build-gpu/bench/loom-gpu-e2e --backend cuda >"$out/e2e.jsonl" 2>>"$log"
    rc=$?
    cat "$out/e2e.jsonl" >>"$log"
    status+=("| loom-gpu-e2e | $([ $rc = 0 ] && echo ok || echo "FAILED rc=$rc (raw.log)") |")
fi
table

step "planted bug"
if [ -x build-gpu/tests/test_cuda_ops ] && [ $((deadline - $(date +%s))) -gt 40 ]; then
    if timeout "$(budget 90)" cmake -S . -B build-gpu-planted "${gen[@]}" -DCMAKE_BUILD_TYPE=Release \
            -DLOOM_CUDA=ON -DLOOM_CUDA_ARCHITECTURES="$arch-real" -DLOOM_CUDA_PLANTED_BUG=ON \
            -DLOOM_BUILD_EXAMPLES=OFF -DLOOM_BUILD_BENCH=OFF "${extra[@]}" >>"$log" 2>&1 &&
       timeout "$(budget 90)" cmake --build build-gpu-planted -j"$jobs" --target loom-cuda test_cuda_ops \
            >>"$log" 2>&1; then
        (cd build-gpu-planted/tests && LOOM_TEST_TMP="$PWD" LOOM_TEST_ONLY=test_attention \
            LOOM_BACKEND_PATH="$PWD/.." timeout "$(budget 60)" ./test_cuda_ops) >"$out/planted.log" 2>&1
        rc=$?
        cat "$out/planted.log" >>"$log"
        if [ $rc = 77 ]; then
            status+=("| planted off-by-one in the attention mask | skipped: $(head -1 "$out/planted.log") |")
        elif [ $rc != 0 ] && grep -q "normalised error" "$out/planted.log"; then
            status+=("| planted off-by-one in the attention mask | caught: $(grep -m1 'normalised error' "$out/planted.log") |")
        else
            status+=("| planted off-by-one in the attention mask | NOT CAUGHT (rc=$rc; planted.log) |")
        fi
    else
        status+=("| planted bug | build FAILED (raw.log) |")
    fi
else
    status+=("| planted bug | not run (no test build, or no time left) |")
fi
table

step "graphs, the fast mode, bf16 math"
# the same models with LOOM_CUDA_GRAPHS=1, in the fast mode and with LOOM_CUDA_MATH=bf16: what
# graphs give, what batch invariance (the default) costs end to end, what 16-bit operands give
if [ -x build-gpu/bench/loom-gpu-e2e ]; then
    : >"$out/e2e-modes.jsonl"
    # graphs where launches weigh most (a small model); the fast mode where the matmuls do
    LOOM_CUDA_GRAPHS=1 timeout "$(budget 40)" build-gpu/bench/loom-gpu-e2e --backend cuda \
        --only gemma3-270m:bf16 >>"$out/e2e-modes.jsonl" 2>>"$log"
    for cfg in gemma3-270m:bf16 llama3-8b:q4_K; do
        LOOM_CUDA_BATCH_INVARIANT=0 timeout "$(budget 50)" build-gpu/bench/loom-gpu-e2e \
            --backend cuda --only "$cfg" >>"$out/e2e-modes.jsonl" 2>>"$log"
    done
    # BF16 math where prefill is compute-bound: the peers' arithmetic, the issue's comparison;
    # invariant (loom's kernels), then fast (cuBLASLt's BF16 GEMM for the prefill's matmuls)
    LOOM_CUDA_MATH=bf16 timeout "$(budget 50)" build-gpu/bench/loom-gpu-e2e --backend cuda \
        --only llama3-8b:bf16 >>"$out/e2e-modes.jsonl" 2>>"$log"
    LOOM_CUDA_MATH=bf16 LOOM_CUDA_BATCH_INVARIANT=0 timeout "$(budget 50)" \
        build-gpu/bench/loom-gpu-e2e --backend cuda --only llama3-8b:bf16 \
        >>"$out/e2e-modes.jsonl" 2>>"$log"
    # and on the wgmma GEMM (Hopper), invariant
    LOOM_CUDA_MATH=bf16 LOOM_CUDA_WGMMA=1 timeout "$(budget 50)" build-gpu/bench/loom-gpu-e2e \
        --backend cuda --only llama3-8b:bf16 >>"$out/e2e-modes.jsonl" 2>>"$log"
    cat "$out/e2e-modes.jsonl" >>"$log"
    status+=("| loom-gpu-e2e, graphs, fast mode, bf16 math, wgmma | $(grep -c '^{' "$out/e2e-modes.jsonl") of 6 runs (raw.log) |")
fi
table

step "ncu"
# Nsight Compute over one decode step and one prefill of the Llama-3-8B shape (Q4_K, 2 layers):
# each kernel's time first, then the three heaviest of each with their memory throughput,
# tensor-pipe use and stall reasons (ncu.md; the raw reports ncu-*.csv).
if command -v ncu >/dev/null && [ -x build-gpu/bench/loom-gpu-ncu ] &&
   [ $((deadline - $(date +%s))) -gt 60 ]; then
    bench/gpu/ncu.sh "$out" build-gpu/bench/loom-gpu-ncu "$(budget 90)" >>"$log" 2>&1
    status+=("| ncu | $([ -s "$out/ncu.md" ] && echo "ok (ncu.md)" || echo "FAILED (raw.log)") |")
else
    status+=("| ncu | not run (no ncu, no driver binary, or no time left) |")
fi
table

step "fusions off"
# Last, time allowing (loom-gpu-bench's qk rows time the same fusion kernel by kernel): the
# small model without the fusions (norm_rope_store, norm_add_rms_norm; LOOM_CUDA_FUSE=0), with
# graphs (against step 7's graphs row) and without (against step 5's default row)
if [ -x build-gpu/bench/loom-gpu-e2e ] && [ $((deadline - $(date +%s))) -gt 30 ]; then
    n0=$(grep -c '^{' "$out/e2e-modes.jsonl" 2>/dev/null)
    for g in 1 0; do
        LOOM_CUDA_GRAPHS=$g LOOM_CUDA_FUSE=0 timeout "$(budget 40)" build-gpu/bench/loom-gpu-e2e \
            --backend cuda --only gemma3-270m:bf16 >>"$out/e2e-modes.jsonl" 2>>"$log"
    done
    n1=$(grep -c '^{' "$out/e2e-modes.jsonl" 2>/dev/null)
    status+=("| loom-gpu-e2e without the fusions (LOOM_CUDA_FUSE=0) | $((${n1:-0} - ${n0:-0})) of 2 runs |")
else
    status+=("| loom-gpu-e2e without the fusions | not run (no e2e binary, or no time left) |")
fi

table
cat "$md"
