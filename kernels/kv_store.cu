/* kv_store.cu — the KV write: scatters a step's new K and V rows into their pages through the
 * step's descriptor (row r of sequence s is position pos_start[s] + r - q_start[s], stored in
 * block block_ids[indptr[s] + p / block_size], slot p % block_size), converted to the pools'
 * element type (F32, F16 or BF16, rounded to nearest even; FP8 with a scale per row and head,
 * computed and rounded by the conversions the CPU backend uses, tensor/fp8.h). */
#include "common.cuh"

#include "tensor/fp8.h"

typedef struct store_args {
    loom__k_kv kv;
    const float *k, *v;
    size_t k_stride, v_stride;
    void *k_pool, *v_pool;
    char *k_scale, *v_scale; /* FP8 only */
} store_args;

/* One block per (row, kv head); threads over the head's elements. */
template <int KV> static __global__ void kv_store_kernel(store_args a) {
    const loom__k_kv &kv = a.kv;
    const int r = blockIdx.x, h = blockIdx.y;
    const int s = kv.row_seq[r];
    const int p = kv.pos_start[s] + (r - kv.q_start[s]);
    const int blk = kv.block_ids[kv.indptr[s] + p / kv.block_size];
    const size_t at = (size_t)blk * kv.block_stride + (size_t)(p % kv.block_size) * kv.token_stride;
    const size_t elt = KV == LOOM_K_F32 ? 4 : 2;
    char *kd = (char *)a.k_pool + at + (size_t)h * kv.head_dim * elt;
    char *vd = (char *)a.v_pool + at + (size_t)h * kv.head_dim * elt;
    const float *kr = (const float *)((const char *)a.k + (size_t)r * a.k_stride) + h * kv.head_dim;
    const float *vr = (const float *)((const char *)a.v + (size_t)r * a.v_stride) + h * kv.head_dim;
    for (int e = threadIdx.x; e < kv.head_dim; e += blockDim.x) {
        loom_kv_put<KV>(kd, e, kr[e]);
        loom_kv_put<KV>(vd, e, vr[e]);
    }
}

#define STORE_THREADS 128

/* max |x| over n elements, and whether any is NaN, over the block's threads (every thread
 * gets the result). */
static __device__ float block_amax(const float *x, int n, float *red) {
    float m = 0.0f;
    bool nan = false;
    for (int e = threadIdx.x; e < n; e += blockDim.x) {
        const float a = fabsf(x[e]);
        nan |= a != a;
        m = a > m ? a : m;
    }
    for (int o = 16; o > 0; o >>= 1) {
        const float y = __shfl_xor_sync(0xffffffffu, m, o);
        m = y > m ? y : m;
    }
    nan = __any_sync(0xffffffffu, nan) != 0;
    if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = nan ? NAN : m;
    __syncthreads();
    float r = 0.0f;
    bool any_nan = false;
    for (int w = 0; w < (int)(blockDim.x >> 5); w++) {
        any_nan |= red[w] != red[w];
        r = red[w] > r ? red[w] : r;
    }
    __syncthreads();
    return any_nan ? NAN : r;
}

/* One row and head of FP8 codes and its scale, as the CPU's kvs_put_fp8 computes them. */
template <int KV>
static __device__ void store_fp8(const float *x, int n, uint8_t *dst, float *scale, float *red) {
    const float amax = block_amax(x, n, red);
    const float s = amax != amax ? NAN : amax / (KV == LOOM_K_FP8_E4M3 ? 448.0f : 57344.0f);
    if (threadIdx.x == 0) *scale = s;
    for (int e = threadIdx.x; e < n; e += blockDim.x) {
        const float y = s > 0.0f ? x[e] / s : 0.0f; /* s = 0: every element is 0 */
        dst[e] = KV == LOOM_K_FP8_E4M3 ? loom__f32_to_fp8_e4m3(y) : loom__f32_to_fp8_e5m2(y);
    }
}

/* One block per (row, kv head), FP8 pages. */
template <int KV> static __global__ void kv_store_fp8_kernel(store_args a) {
    __shared__ float red[STORE_THREADS / 32];
    const loom__k_kv &kv = a.kv;
    const int r = blockIdx.x, h = blockIdx.y;
    const int s = kv.row_seq[r];
    const int p = kv.pos_start[s] + (r - kv.q_start[s]);
    const int blk = kv.block_ids[kv.indptr[s] + p / kv.block_size];
    const int slot = p % kv.block_size;
    const size_t at =
        (size_t)blk * kv.block_stride + (size_t)slot * kv.token_stride + (size_t)h * kv.head_dim;
    const size_t sat = (size_t)blk * kv.scale_block_stride + (size_t)slot * kv.scale_token_stride +
                       (size_t)h * sizeof(float);
    const float *kr = (const float *)((const char *)a.k + (size_t)r * a.k_stride) + h * kv.head_dim;
    const float *vr = (const float *)((const char *)a.v + (size_t)r * a.v_stride) + h * kv.head_dim;
    store_fp8<KV>(kr, kv.head_dim, (uint8_t *)a.k_pool + at, (float *)(a.k_scale + sat), red);
    store_fp8<KV>(vr, kv.head_dim, (uint8_t *)a.v_pool + at, (float *)(a.v_scale + sat), red);
}

#if LOOM_K_HOST_CODE /* tests/kernels_emu/ launches the kernels itself */
template <int KV> static loom_status store_fp8_launch(cudaStream_t stream, const store_args &a) {
    dim3 grid((unsigned)a.kv.n_rows, (unsigned)a.kv.n_kv_heads);
    LOOM_K_LAUNCH((kv_store_fp8_kernel<KV>), (grid, STORE_THREADS, 0, stream), a);
    LOOM_K_LAUNCHED("kv_store (fp8)");
    return LOOM_OK;
}

template <int KV> static loom_status store_launch(cudaStream_t stream, const store_args &a) {
    dim3 grid((unsigned)a.kv.n_rows, (unsigned)a.kv.n_kv_heads);
    LOOM_K_LAUNCH((kv_store_kernel<KV>), (grid, 128, 0, stream), a);
    LOOM_K_LAUNCHED("kv_store");
    return LOOM_OK;
}

extern "C" loom_status loom__cuda_kv_store(cudaStream_t stream, const loom__k_kv *kv,
                                           const float *k, size_t k_stride, const float *v,
                                           size_t v_stride, void *k_pool, void *v_pool,
                                           void *k_scale, void *v_scale) {
    if (kv->n_rows == 0) return LOOM_OK;
    if (kv->n_kv_heads > 65535) LOOM_K_UNSUPPORTED("cuda: kv_store of %d heads", kv->n_kv_heads);
    store_args a = {
        *kv, k, v, k_stride, v_stride, k_pool, v_pool, (char *)k_scale, (char *)v_scale};
    switch (kv->kv_type) {
    case LOOM_K_F32:
        return store_launch<LOOM_K_F32>(stream, a);
    case LOOM_K_F16:
        return store_launch<LOOM_K_F16>(stream, a);
    case LOOM_K_BF16:
        return store_launch<LOOM_K_BF16>(stream, a);
    case LOOM_K_FP8_E4M3:
    case LOOM_K_FP8_E5M2:
        if (k_scale == NULL || v_scale == NULL)
            LOOM_K_UNSUPPORTED("cuda: kv_store of fp8 pages without scales");
        return kv->kv_type == LOOM_K_FP8_E4M3 ? store_fp8_launch<LOOM_K_FP8_E4M3>(stream, a)
                                              : store_fp8_launch<LOOM_K_FP8_E5M2>(stream, a);
    default:
        LOOM_K_UNSUPPORTED("cuda: kv_store of kv type %u", (unsigned)kv->kv_type);
    }
}
#endif
