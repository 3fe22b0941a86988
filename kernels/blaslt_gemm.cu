/* blaslt_gemm.cu — the small kernels around cuBLASLt's GEMMs of the fast mode (src/backend/
 * cuda/cuda_blaslt_gemm.c). For the FP8 GEMM: activations quantized to E4M3 with one scale per
 * token (max |x| / 448, the weights' rule, tensor/fp8.h's rounding), and the epilogue that
 * multiplies each raw product sum of codes by its weight row's scale and its token's. For the
 * BF16 GEMM (BF16 math): activations rounded to BF16, nearest even. */
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

typedef struct bf16_args {
    const float *x;
    size_t x_stride;
    int64_t k;
    uint16_t *xb;
    size_t xb_stride;
} bf16_args;

/* xb[t][i] = x[t][i] rounded to BF16 (nearest even; overflow to infinity, NaN stays NaN): grid
 * (pieces of a row, rows), one value a thread. */
static __global__ void __launch_bounds__(256) bf16_kernel(bf16_args a) {
    const int64_t t = blockIdx.y;
    const float *x = (const float *)((const char *)a.x + (size_t)t * a.x_stride);
    uint16_t *o = (uint16_t *)((char *)a.xb + (size_t)t * a.xb_stride);
    for (int64_t i = (int64_t)blockIdx.x * 256 + threadIdx.x; i < a.k;
         i += (int64_t)gridDim.x * 256)
        o[i] = __bfloat16_as_ushort(__float2bfloat16_rn(x[i]));
}

#if LOOM_K_HOST_CODE /* tests/kernels_emu/ launches the kernels itself */
extern "C" loom_status loom__cuda_acts_to_bf16(cudaStream_t stream, const float *x, size_t x_stride,
                                               int64_t n_tokens, int64_t k, uint16_t *xb,
                                               size_t xb_stride) {
    if (n_tokens == 0 || k == 0) return LOOM_OK;
    if (n_tokens > 65535)
        LOOM_K_UNSUPPORTED("cuda: bf16 activations of %lld rows", (long long)n_tokens);
    const int64_t pieces = loom_cdiv(k, 256);
    bf16_args a = {x, x_stride, k, xb, xb_stride};
    LOOM_K_LAUNCH((bf16_kernel),
                  (dim3((unsigned)(pieces < 64 ? pieces : 64), (unsigned)n_tokens), 256, 0, stream),
                  a);
    LOOM_K_LAUNCHED("bf16 activations");
    return LOOM_OK;
}

extern "C" loom_status loom__cuda_fp8_quantize_acts(cudaStream_t stream, const float *x,
                                                    size_t x_stride, int64_t n_tokens, int64_t k,
                                                    uint8_t *xq, size_t xq_stride, float *scale) {
    if (n_tokens == 0) return LOOM_OK;
    if (n_tokens > 0x7fffffff)
        LOOM_K_UNSUPPORTED("cuda: fp8 quantize of %lld rows", (long long)n_tokens);
    quant_args a = {x, x_stride, k, xq, xq_stride, scale};
    LOOM_K_LAUNCH((quant_kernel), ((unsigned)n_tokens, QUANT_THREADS, 0, stream), a);
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
    LOOM_K_LAUNCH((scale_kernel),
                  (dim3((unsigned)loom_cdiv(w->n, 256), (unsigned)n_tokens), 256, 0, stream), a);
    LOOM_K_LAUNCHED("fp8 epilogue");
    return LOOM_OK;
}
#endif
