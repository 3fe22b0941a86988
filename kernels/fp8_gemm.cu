/* fp8_gemm.cu — the two small kernels around cuBLASLt's FP8 GEMM (src/backend/cuda/
 * cuda_fp8_gemm.c): activations quantized to E4M3 with one scale per token (max |x| / 448, the
 * weights' rule, tensor/fp8.h's rounding), and the epilogue that multiplies each raw product
 * sum of codes by its weight row's scale and its token's. */
#include "common.cuh"

#include "tensor/fp8.h"

#define QUANT_THREADS 256

typedef struct quant_args {
    const float *x;
    size_t x_stride;
    int64_t k;
    uint8_t *xq;
    size_t xq_stride;
    float *scale;
} quant_args;

/* One block per token row. */
static __global__ void __launch_bounds__(QUANT_THREADS) quant_kernel(quant_args a) {
    __shared__ float red[QUANT_THREADS / 32];
    const int64_t t = blockIdx.x;
    const float *x = (const float *)((const char *)a.x + (size_t)t * a.x_stride);
    uint8_t *q = a.xq + (size_t)t * a.xq_stride;
    float m = 0.0f;
    for (int64_t i = threadIdx.x; i < a.k; i += blockDim.x) m = fmaxf(m, fabsf(x[i]));
    m = loom_warp_max(m);
    if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = m;
    __syncthreads();
    float amax = 0.0f;
    for (int w = 0; w < QUANT_THREADS / 32; w++) amax = fmaxf(amax, red[w]);
    const float s = amax / 448.0f;
    if (threadIdx.x == 0) a.scale[t] = s;
    for (int64_t i = threadIdx.x; i < a.k; i += blockDim.x)
        q[i] = s > 0.0f ? loom__f32_to_fp8_e4m3(x[i] / s) : 0;
}

typedef struct scale_args {
    loom__k_weight w;
    float *out;
    size_t out_stride;
    int64_t n_tokens;
    const float *token_scale;
} scale_args;

/* out[t][n] *= scale(row n) * token_scale[t]; threads over n. */
static __global__ void scale_kernel(scale_args a) {
    const int64_t n = (int64_t)blockIdx.x * blockDim.x + threadIdx.x, t = blockIdx.y;
    if (n >= a.w.n) return;
    const uint8_t *row = (const uint8_t *)a.w.data + (size_t)n * a.w.stride;
    const float ws = *(const float *)(row + ((a.w.k + 3) & ~(int64_t)3));
    float *o = (float *)((char *)a.out + (size_t)t * a.out_stride) + n;
    *o = *o * (ws * a.token_scale[t]);
}

#if !defined(LOOM_K_EMULATE) /* tests/kernels_emu/ launches the kernels itself */
extern "C" loom_status loom__cuda_fp8_quantize_acts(cudaStream_t stream, const float *x,
                                                    size_t x_stride, int64_t n_tokens, int64_t k,
                                                    uint8_t *xq, size_t xq_stride, float *scale) {
    if (n_tokens == 0) return LOOM_OK;
    if (n_tokens > 0x7fffffff)
        LOOM_K_UNSUPPORTED("cuda: fp8 quantize of %lld rows", (long long)n_tokens);
    quant_args a = {x, x_stride, k, xq, xq_stride, scale};
    quant_kernel<<<(unsigned)n_tokens, QUANT_THREADS, 0, stream>>>(a);
    LOOM_K_LAUNCHED("fp8 activation quantize");
    return LOOM_OK;
}

extern "C" loom_status loom__cuda_fp8_scale_out(cudaStream_t stream, const loom__k_weight *w,
                                                float *out, size_t out_stride, int64_t n_tokens,
                                                const float *token_scale) {
    if (n_tokens == 0 || w->n == 0) return LOOM_OK;
    if (n_tokens > 65535)
        LOOM_K_UNSUPPORTED("cuda: fp8 epilogue of %lld rows", (long long)n_tokens);
    scale_args a = {*w, out, out_stride, n_tokens, token_scale};
    scale_kernel<<<dim3((unsigned)loom_cdiv(w->n, 256), (unsigned)n_tokens), 256, 0, stream>>>(a);
    LOOM_K_LAUNCHED("fp8 epilogue");
    return LOOM_OK;
}
#endif
