/* norm_rope_store.cu — a layer's attention inputs finished in one launch: each row's per-head
 * RMS norms of q and k (where the model has them), their rotary embedding, and the KV write of
 * k and v into the pages. The forward pass otherwise runs rms_norm twice, rope twice and
 * kv_store: five launches a layer, each a short kernel whose fixed cost, not its bytes, is the
 * time at decode. The values have those kernels' bits: the same reduction (loom_rms_inv), the
 * same angles and rotation (rope.cuh), the same conversions (loom_kv_put). */
#include "rope.cuh"

#define QK_NO_STORE (-1) /* KV: the pages are written by kv_store after this launch */

typedef struct qk_args {
    loom__k_qk a;
    loom__k_kv kv; /* KV != QK_NO_STORE */
    void *k_pool, *v_pool;
    int heads_per_block; /* kv heads a block takes: n_kv_heads / gridDim.y */
} qk_args;

/* Blocks a launch keeps (about 8 per SM of a large GPU) when it gives a block several kv heads of
 * its row: past that, every block computes the row's angles (double-precision pow and sincos,
 * slow on GPUs without full-rate FP64) for fewer heads than it could. */
#define QK_MIN_BLOCKS 1024

/* Head xh normed in place as rms_norm_kernel norms a row of head_dim values (w given), then
 * rotated by the block's angles (cs: cosines, then sines, one per frequency). The barrier
 * before the rotation lets a thread rotate pairs other threads normed. */
static __device__ void qk_head(float *xh, const loom__k_rope &p, const float *w, float eps,
                               const float *cs, float *warp_sums) {
    const int hd = p.head_dim, half = p.n_rot / 2;
    if (w != nullptr) {
        float s = 0.0f;
        for (int e = threadIdx.x; e < hd; e += LOOM_RMS_THREADS) s = fmaf(xh[e], xh[e], s);
        const float inv = loom_rms_inv(s, hd, eps, warp_sums);
        for (int e = threadIdx.x; e < hd; e += LOOM_RMS_THREADS) xh[e] = xh[e] * inv * w[e];
    }
    __syncthreads();
    for (int i = threadIdx.x; i < half; i += LOOM_RMS_THREADS)
        loom_rope_rotate(xh, p, i, cs[i], cs[LOOM_K_QK_MAX_FREQS + i]);
}

/* One block of LOOM_RMS_THREADS per row and heads_per_block kv heads: for each, its group of
 * query heads, then its k head, then (KV != QK_NO_STORE) its k and v rows into their page slot.
 * The angles are the row's, computed once per block. */
template <int KV>
static __global__ void __launch_bounds__(LOOM_RMS_THREADS) norm_rope_store_kernel(qk_args g) {
    __shared__ float warp_sums[LOOM_RMS_THREADS / 32];
    __shared__ float cs[2 * LOOM_K_QK_MAX_FREQS];
    const loom__k_qk &a = g.a;
    const loom__k_rope &p = a.rope;
    const int64_t r = blockIdx.x;
    const int group = p.n_head / a.n_kv_heads, hd = p.head_dim;
    const double pos = (double)p.pos[r];
    for (int i = threadIdx.x; i < p.n_rot / 2; i += LOOM_RMS_THREADS)
        loom_rope_angle(p, pos, i, &cs[i], &cs[LOOM_K_QK_MAX_FREQS + i]);
    float *q_row = (float *)((char *)a.q + r * a.q_stride);
    float *k_row = (float *)((char *)a.k + r * a.k_stride);
    const float *v_row = (const float *)((const char *)a.v + r * a.v_stride);
    for (int hh = 0; hh < g.heads_per_block; hh++) {
        const int h = blockIdx.y * g.heads_per_block + hh;
        float *q = q_row + (int64_t)h * group * hd;
        for (int j = 0; j < group; j++)
            qk_head(q + (int64_t)j * hd, p, a.q_norm, a.eps, cs, warp_sums);
        float *k = k_row + (int64_t)h * hd;
        qk_head(k, p, a.k_norm, a.eps, cs, warp_sums);
        if (KV == QK_NO_STORE) continue;
        __syncthreads(); /* k's rotated pairs, written by other threads, are read below */
        const loom__k_kv &kv = g.kv;
        const int s = kv.row_seq[r];
        const int ps = kv.pos_start[s] + ((int)r - kv.q_start[s]);
        const int blk = kv.block_ids[kv.indptr[s] + ps / kv.block_size];
        const size_t at =
            (size_t)blk * kv.block_stride + (size_t)(ps % kv.block_size) * kv.token_stride;
        const size_t elt = KV == LOOM_K_F32 ? 4 : 2;
        char *kd = (char *)g.k_pool + at + (size_t)h * hd * elt;
        char *vd = (char *)g.v_pool + at + (size_t)h * hd * elt;
        const float *v = v_row + (int64_t)h * hd;
        for (int e = threadIdx.x; e < hd; e += LOOM_RMS_THREADS) {
            loom_kv_put<(KV < 0 ? LOOM_K_F32 : KV)>(kd, e, k[e]);
            loom_kv_put<(KV < 0 ? LOOM_K_F32 : KV)>(vd, e, v[e]);
        }
    }
}

#if LOOM_K_HOST_CODE /* tests/kernels_emu/ launches the kernels itself */
template <int KV> static loom_status qk_launch(cudaStream_t stream, const qk_args &g) {
    dim3 grid((unsigned)g.a.rope.n_rows, (unsigned)(g.a.n_kv_heads / g.heads_per_block));
    LOOM_K_LAUNCH((norm_rope_store_kernel<KV>), (grid, LOOM_RMS_THREADS, 0, stream), g);
    LOOM_K_LAUNCHED("norm_rope_store");
    return LOOM_OK;
}

extern "C" loom_status loom__cuda_norm_rope_store(cudaStream_t stream, const loom__k_qk *a,
                                                  const loom__k_kv *kv, void *k_pool,
                                                  void *v_pool) {
    const loom__k_rope &p = a->rope;
    if (p.n_rows == 0) return LOOM_OK;
    if (p.n_rows > 0x7fffffff || a->n_kv_heads <= 0 || a->n_kv_heads > 65535 ||
        p.n_head % a->n_kv_heads != 0 || p.n_rot < 0 || p.n_rot > 2 * LOOM_K_QK_MAX_FREQS ||
        p.n_rot > p.head_dim)
        LOOM_K_UNSUPPORTED("cuda: norm_rope_store of %lld rows, %d query heads over %d kv heads, "
                           "n_rot %d of %d",
                           (long long)p.n_rows, p.n_head, a->n_kv_heads, p.n_rot, p.head_dim);
    /* the most kv heads a block that still leaves QK_MIN_BLOCKS blocks (a divisor of n_kv_heads) */
    int per_block = 1;
    for (int d = 2; d <= a->n_kv_heads; d++)
        if (a->n_kv_heads % d == 0 && p.n_rows * (a->n_kv_heads / d) >= QK_MIN_BLOCKS)
            per_block = d;
    qk_args g = {*a, {}, k_pool, v_pool, per_block};
    if (kv == NULL) return qk_launch<QK_NO_STORE>(stream, g);
    g.kv = *kv;
    switch (kv->kv_type) {
    case LOOM_K_F32:
        return qk_launch<LOOM_K_F32>(stream, g);
    case LOOM_K_F16:
        return qk_launch<LOOM_K_F16>(stream, g);
    case LOOM_K_BF16:
        return qk_launch<LOOM_K_BF16>(stream, g);
    default:
        LOOM_K_UNSUPPORTED("cuda: norm_rope_store into kv type %u (kv_store writes it)",
                           (unsigned)kv->kv_type);
    }
}
#endif
