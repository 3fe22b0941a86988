/* gemv.cu — matmul out = x·wᵀ for weights in their stored format (dequant.cuh), decoded in
 * registers. One warp per output row n and group of up to 8 tokens: lane l takes the row's
 * 32-value chunks l, l + 32, ..., decodes each once and multiplies it with the group's tokens;
 * the lanes' sums then meet in a fixed butterfly. The order of every output's additions is
 * thus the same whatever the number of tokens (a token's result does not depend on its batch).
 *
 * This is the CUDA backend's fast path for decode steps when batch invariance is off
 * (LOOM_CUDA_BATCH_INVARIANT=0). Steps of more than 8 tokens go to the tensor-core GEMM
 * (gemm.cu), which reads each weight chunk once per 64 tokens instead of once per 8; it sums in
 * another order, so a token's bits here are the same in every step of 1..8 tokens, and there the
 * same in every step of more than 8. The default (invariant) mode runs the GEMM for every step.
 * The kernel below still takes any number of tokens, in groups of 8 (grid.y). */
#include "dequant.cuh"

#define GEMV_WARPS  4
#define GEMV_TOKENS LOOM_K_GEMV_MAX_TOKENS

typedef struct gemv_args {
    loom__k_weight w;
    const float *x;
    size_t x_stride;
    int64_t n_tokens;
    float *out;
    size_t out_stride;
} gemv_args;

template <int T>
static __global__ void __launch_bounds__(GEMV_WARPS * 32) gemv_kernel(gemv_args a) {
    const int lane = threadIdx.x & 31;
    const int64_t n = (int64_t)blockIdx.x * GEMV_WARPS + (threadIdx.x >> 5);
    if (n >= a.w.n) return;
    const int64_t t0 = (int64_t)blockIdx.y * GEMV_TOKENS;
    const int nt = a.n_tokens - t0 < GEMV_TOKENS ? (int)(a.n_tokens - t0) : GEMV_TOKENS;
    const int64_t k = a.w.k, n_chunks = loom_cdiv(k, 32);
    const uint8_t *row = (const uint8_t *)a.w.data + (size_t)n * a.w.stride;
    float acc[GEMV_TOKENS];
#pragma unroll
    for (int t = 0; t < GEMV_TOKENS; t++) acc[t] = 0.0f;
    for (int64_t c = lane; c < n_chunks; c += 32) {
        float v[32];
        loom_dequant32<T>(row, c, k, v);
        const int64_t left = k - 32 * c;
#pragma unroll
        for (int t = 0; t < GEMV_TOKENS; t++) {
            if (t < nt) {
                const float *x =
                    (const float *)((const char *)a.x + (t0 + t) * a.x_stride) + 32 * c;
                float s = 0.0f;
                if (left >= 32 && ((uintptr_t)x & 15) == 0) {
                    const float4 *x4 = (const float4 *)x;
#pragma unroll
                    for (int j = 0; j < 8; j++) {
                        const float4 q = x4[j];
                        s = fmaf(v[4 * j], q.x, s);
                        s = fmaf(v[4 * j + 1], q.y, s);
                        s = fmaf(v[4 * j + 2], q.z, s);
                        s = fmaf(v[4 * j + 3], q.w, s);
                    }
                } else {
#pragma unroll
                    for (int j = 0; j < 32; j++)
                        if (j < left) s = fmaf(v[j], x[j], s);
                }
                acc[t] += s;
            }
        }
    }
    const float row_scale = T == LOOM_K_FP8_ROWS ? loom_fp8_rows_scale256(row, k) : 1.0f;
#pragma unroll
    for (int t = 0; t < GEMV_TOKENS; t++) {
        float s = loom_warp_sum(acc[t]);
        if (T == LOOM_K_FP8_ROWS) s *= row_scale; /* once per dot, as the CPU */
        if (lane == 0 && t < nt) ((float *)((char *)a.out + (t0 + t) * a.out_stride))[n] = s;
    }
}

#if LOOM_K_HOST_CODE /* tests/kernels_emu/ launches the kernels itself */
template <int T> static loom_status gemv_launch(cudaStream_t stream, const gemv_args &a) {
    const int64_t gy = loom_cdiv(a.n_tokens, GEMV_TOKENS);
    const int64_t gx = loom_cdiv(a.w.n, GEMV_WARPS);
    if (gy > 65535 || gx > 0x7fffffff)
        LOOM_K_UNSUPPORTED("cuda: matmul of %lld tokens by %lld rows", (long long)a.n_tokens,
                           (long long)a.w.n);
    LOOM_K_LAUNCH((gemv_kernel<T>), (dim3((unsigned)gx, (unsigned)gy), GEMV_WARPS * 32, 0, stream),
                  a);
    LOOM_K_LAUNCHED("matmul");
    return LOOM_OK;
}

extern "C" loom_status loom__cuda_gemv(cudaStream_t stream, const loom__k_weight *w, const float *x,
                                       size_t x_stride, int64_t n_tokens, float *out,
                                       size_t out_stride) {
    if (n_tokens == 0 || w->n == 0) return LOOM_OK;
    gemv_args a = {*w, x, x_stride, n_tokens, out, out_stride};
    switch (w->type) {
    case LOOM_K_F32:
        return gemv_launch<LOOM_K_F32>(stream, a);
    case LOOM_K_F16:
        return gemv_launch<LOOM_K_F16>(stream, a);
    case LOOM_K_BF16:
        return gemv_launch<LOOM_K_BF16>(stream, a);
    case LOOM_K_Q8_0:
        return gemv_launch<LOOM_K_Q8_0>(stream, a);
    case LOOM_K_Q4_0:
        return gemv_launch<LOOM_K_Q4_0>(stream, a);
    case LOOM_K_Q5_0:
        return gemv_launch<LOOM_K_Q5_0>(stream, a);
    case LOOM_K_Q4_K:
        return gemv_launch<LOOM_K_Q4_K>(stream, a);
    case LOOM_K_Q5_K:
        return gemv_launch<LOOM_K_Q5_K>(stream, a);
    case LOOM_K_Q6_K:
        return gemv_launch<LOOM_K_Q6_K>(stream, a);
    case LOOM_K_FP8_ROWS:
        return gemv_launch<LOOM_K_FP8_ROWS>(stream, a);
    default:
        LOOM_K_UNSUPPORTED("cuda: matmul of weight type %u", (unsigned)w->type);
    }
}
#endif
