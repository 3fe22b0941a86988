/* get_rows.cu — the embedding gather: rows of a weight table, decoded to float32, for every
 * weight type the kernels read in place (dequant.cuh). One block per output row; threads over
 * its 32-value chunks. */
#include "dequant.cuh"

typedef struct rows_args {
    loom__k_weight w;
    const int32_t *ids;
    float *out;
    size_t out_stride;
} rows_args;

template <int T> static __global__ void get_rows_kernel(rows_args a) {
    const int64_t i = blockIdx.x;
    const int32_t id = a.ids[i];
    float *o = (float *)((char *)a.out + i * a.out_stride);
    const int64_t k = a.w.k, n_chunks = loom_cdiv(k, 32);
    if (id < 0 || id >= a.w.n) { /* out of the host's sight: poison rather than read astray */
        for (int64_t j = threadIdx.x; j < k; j += blockDim.x) o[j] = __int_as_float(0x7fc00000);
        return;
    }
    const uint8_t *row = (const uint8_t *)a.w.data + (size_t)id * a.w.stride;
    const float scale = T == LOOM_K_FP8_ROWS ? loom_fp8_rows_scale256(row, k) : 1.0f;
    for (int64_t c = threadIdx.x; c < n_chunks; c += blockDim.x) {
        float v[32];
        loom_dequant32<T>(row, c, k, v);
        const int64_t left = k - 32 * c;
#pragma unroll
        for (int j = 0; j < 32; j++)
            if (j < left) o[32 * c + j] = T == LOOM_K_FP8_ROWS ? v[j] * scale : v[j];
    }
}

extern "C" int loom__cuda_weight_type_native(uint32_t type) {
    switch (type) {
    case LOOM_K_F32:
    case LOOM_K_F16:
    case LOOM_K_BF16:
    case LOOM_K_Q8_0:
    case LOOM_K_Q4_0:
    case LOOM_K_Q5_0:
    case LOOM_K_Q4_K:
    case LOOM_K_Q5_K:
    case LOOM_K_Q6_K:
    case LOOM_K_FP8_ROWS:
        return 1;
    default:
        return 0;
    }
}

#if LOOM_K_HOST_CODE /* tests/kernels_emu/ launches the kernels itself */
template <int T>
static loom_status rows_launch(cudaStream_t stream, const rows_args &a, int64_t n_ids) {
    LOOM_K_LAUNCH((get_rows_kernel<T>), ((unsigned)n_ids, 128, 0, stream), a);
    LOOM_K_LAUNCHED("get_rows");
    return LOOM_OK;
}

extern "C" loom_status loom__cuda_get_rows(cudaStream_t stream, const loom__k_weight *w,
                                           const int32_t *ids, int64_t n_ids, float *out,
                                           size_t out_stride) {
    if (n_ids == 0) return LOOM_OK;
    if (n_ids > 0x7fffffff) LOOM_K_UNSUPPORTED("cuda: get_rows of %lld ids", (long long)n_ids);
    rows_args a = {*w, ids, out, out_stride};
    switch (w->type) {
    case LOOM_K_F32:
        return rows_launch<LOOM_K_F32>(stream, a, n_ids);
    case LOOM_K_F16:
        return rows_launch<LOOM_K_F16>(stream, a, n_ids);
    case LOOM_K_BF16:
        return rows_launch<LOOM_K_BF16>(stream, a, n_ids);
    case LOOM_K_Q8_0:
        return rows_launch<LOOM_K_Q8_0>(stream, a, n_ids);
    case LOOM_K_Q4_0:
        return rows_launch<LOOM_K_Q4_0>(stream, a, n_ids);
    case LOOM_K_Q5_0:
        return rows_launch<LOOM_K_Q5_0>(stream, a, n_ids);
    case LOOM_K_Q4_K:
        return rows_launch<LOOM_K_Q4_K>(stream, a, n_ids);
    case LOOM_K_Q5_K:
        return rows_launch<LOOM_K_Q5_K>(stream, a, n_ids);
    case LOOM_K_Q6_K:
        return rows_launch<LOOM_K_Q6_K>(stream, a, n_ids);
    case LOOM_K_FP8_ROWS:
        return rows_launch<LOOM_K_FP8_ROWS>(stream, a, n_ids);
    default:
        LOOM_K_UNSUPPORTED("cuda: get_rows of weight type %u", (unsigned)w->type);
    }
}
#endif
