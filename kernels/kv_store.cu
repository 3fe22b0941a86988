/* kv_store.cu — the KV write: scatters a step's new K and V rows into their pages through the
 * step's descriptor (row r of sequence s is position pos_start[s] + r - q_start[s], stored in
 * block block_ids[indptr[s] + p / block_size], slot p % block_size), converted to the pools'
 * element type (F32, F16 or BF16, rounded to nearest even). */
#include "common.cuh"

typedef struct store_args {
    loom__k_kv kv;
    const float *k, *v;
    size_t k_stride, v_stride;
    void *k_pool, *v_pool;
} store_args;

template <int KV> static __device__ __forceinline__ void store_one(void *base, int64_t i, float x) {
    if (KV == LOOM_K_F32)
        ((float *)base)[i] = x;
    else if (KV == LOOM_K_F16)
        ((__half *)base)[i] = __float2half_rn(x);
    else
        ((__nv_bfloat16 *)base)[i] = __float2bfloat16_rn(x);
}

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
        store_one<KV>(kd, e, kr[e]);
        store_one<KV>(vd, e, vr[e]);
    }
}

template <int KV> static loom_status store_launch(cudaStream_t stream, const store_args &a) {
    dim3 grid((unsigned)a.kv.n_rows, (unsigned)a.kv.n_kv_heads);
    kv_store_kernel<KV><<<grid, 128, 0, stream>>>(a);
    LOOM_K_LAUNCHED("kv_store");
    return LOOM_OK;
}

extern "C" loom_status loom__cuda_kv_store(cudaStream_t stream, const loom__k_kv *kv,
                                           const float *k, size_t k_stride, const float *v,
                                           size_t v_stride, void *k_pool, void *v_pool) {
    if (kv->n_rows == 0) return LOOM_OK;
    if (kv->n_kv_heads > 65535) LOOM_K_UNSUPPORTED("cuda: kv_store of %d heads", kv->n_kv_heads);
    store_args a = {*kv, k, v, k_stride, v_stride, k_pool, v_pool};
    switch (kv->kv_type) {
    case LOOM_K_F32:
        return store_launch<LOOM_K_F32>(stream, a);
    case LOOM_K_F16:
        return store_launch<LOOM_K_F16>(stream, a);
    case LOOM_K_BF16:
        return store_launch<LOOM_K_BF16>(stream, a);
    default:
        LOOM_K_UNSUPPORTED("cuda: kv_store of kv type %u", (unsigned)kv->kv_type);
    }
}
