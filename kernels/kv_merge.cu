/* kv_merge.cu — the KV write of merged layer pairs (loom_backend.h, LOOM_KV_MERGED), as the CPU
 * backend's cpu_kv_merge.c does it, with the same scalar arithmetic (src/tensor/kv_merge.h).
 *
 * The pair's earlier layer: one block per (row, kv head) stores the head row's direction in the
 * layer's pages and its norm in the merge block. The later layer: a token's decision reads the
 * earlier slots of its block, so one block walks a run of rows (one sequence's positions inside
 * one page block) in order; a block is launched per row and only the blocks whose row starts a
 * run do any work. Per row: the norms and directions of every head (sums in double, as the
 * CPU's), the distance, then thread 0 decides (keep in a free row, displace the least distant
 * kept token, or merge the newcomer) and the block writes the rows the decision names. */
#include "common.cuh"

#include "loom_backend.h"

#include "tensor/kv_merge.h"

#define MERGE_THREADS 128

typedef struct merge_args {
    loom__k_kv kv;
    const float *k, *v;
    size_t k_stride, v_stride;
    char *pool[2]; /* the pair's pools (the earlier layer's): K, V */
    loom__k_merge m;
} merge_args;

template <int KV> static __device__ __forceinline__ size_t elt() {
    return KV == LOOM_K_F32 ? 4 : 2;
}

/* Sum over the block's threads, in double (a fixed tree: the same order every call). red holds
 * MERGE_THREADS / 32 doubles; every thread receives the sum. */
static __device__ double block_sum(double x, double *red) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
    if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = x;
    __syncthreads();
    double s = 0.0;
    for (int w = 0; w < MERGE_THREADS / 32; w++) s += red[w];
    __syncthreads();
    return s;
}

/* ---- the earlier layer ------------------------------------------------------------------- */

template <int KV>
static __global__ void __launch_bounds__(MERGE_THREADS) store_a_kernel(merge_args a) {
    __shared__ double red[MERGE_THREADS / 32];
    const loom__k_kv &kv = a.kv;
    const int r = blockIdx.x, h = blockIdx.y, H = kv.n_kv_heads, hd = kv.head_dim;
    const int s = kv.row_seq[r];
    const int p = kv.pos_start[s] + (r - kv.q_start[s]);
    const int blk = kv.block_ids[kv.indptr[s] + p / kv.block_size], slot = p % kv.block_size;
    float *norm = (float *)(a.m.base + (size_t)blk * a.m.block_stride);
    for (int kv_i = 0; kv_i < 2; kv_i++) {
        const float *x = (const float *)((const char *)(kv_i ? a.v : a.k) +
                                         (size_t)r * (kv_i ? a.v_stride : a.k_stride)) +
                         (size_t)h * hd;
        double xx = 0.0;
        for (int e = threadIdx.x; e < hd; e += blockDim.x) xx += (double)x[e] * (double)x[e];
        const float n = (float)sqrt(block_sum(xx, red));
        char *row = a.pool[kv_i] + (size_t)blk * kv.block_stride + (size_t)slot * kv.token_stride +
                    (size_t)h * hd * elt<KV>();
        for (int e = threadIdx.x; e < hd; e += blockDim.x)
            loom_kv_put<KV>(row, e, n == 0.0f ? 0.0f : x[e] / n);
        if (threadIdx.x == 0) norm[((size_t)slot * H + h) * 4 + kv_i] = n;
    }
}

/* ---- the later layer --------------------------------------------------------------------- */

/* One page block's merge bookkeeping. */
typedef struct mblock {
    char *base;
    float *norm, *dist;
    int32_t *state;
    char *rows;    /* [R][2][H][hd] */
    char *page[2]; /* the pair's K and V rows of slot 0 */
    size_t row_bytes;
} mblock;

template <int KV> static __device__ mblock mblock_at(const merge_args &a, int blk) {
    mblock b;
    b.base = a.m.base + (size_t)blk * a.m.block_stride;
    b.norm = (float *)b.base;
    b.dist = (float *)(b.base + a.m.dist_at);
    b.state = (int32_t *)(b.base + a.m.state_at);
    b.rows = b.base + a.m.rows_at;
    b.page[0] = a.pool[0] + (size_t)blk * a.kv.block_stride;
    b.page[1] = a.pool[1] + (size_t)blk * a.kv.block_stride;
    b.row_bytes = (size_t)a.kv.n_kv_heads * a.kv.head_dim * elt<KV>();
    return b;
}

/* Row kv_i of the pair's pages at slot t, and retained row r. */
static __device__ __forceinline__ char *a_row(const mblock &b, const loom__k_kv &kv, int kv_i,
                                              int t) {
    return b.page[kv_i] + (size_t)t * kv.token_stride;
}
static __device__ __forceinline__ char *kept_row(const mblock &b, int kv_i, int r) {
    return b.rows + ((size_t)r * 2 + kv_i) * b.row_bytes;
}

/* The pair's row of slot t becomes slerp(itself, the direction in `other`): other is a stored
 * row (kept_row) when from_x is NULL, else x / xnorm[h] (the newcomer's fresh values). */
template <int KV>
static __device__ void merge_into_a(const merge_args &a, const mblock &b, int t, int kv_i,
                                    const char *other, const float *from_x, const float *xnorm,
                                    double *red) {
    const int H = a.kv.n_kv_heads, hd = a.kv.head_dim;
    char *ar = a_row(b, a.kv, kv_i, t);
    for (int h = 0; h < H; h++) {
        const char *ah = ar + (size_t)h * hd * elt<KV>();
        double dd = 0.0, aa = 0.0, bb = 0.0;
        for (int e = threadIdx.x; e < hd; e += blockDim.x) {
            const float av = loom_kv_get<KV>(ah, e);
            const float bv = from_x ? (xnorm[h] == 0.0f ? 0.0f : from_x[h * hd + e] / xnorm[h])
                                    : loom_kv_get<KV>(other + (size_t)h * hd * elt<KV>(), e);
            dd += (double)av * bv;
            aa += (double)av * av;
            bb += (double)bv * bv;
        }
        dd = block_sum(dd, red);
        aa = block_sum(aa, red);
        bb = block_sum(bb, red);
        float ca, cb;
        loom__merge_slerp(dd, aa, bb, a.m.t, &ca, &cb);
        for (int e = threadIdx.x; e < hd; e += blockDim.x) {
            const float av = loom_kv_get<KV>(ah, e);
            const float bv = from_x ? (xnorm[h] == 0.0f ? 0.0f : from_x[h * hd + e] / xnorm[h])
                                    : loom_kv_get<KV>(other + (size_t)h * hd * elt<KV>(), e);
            loom_kv_put<KV>((char *)ah, e, fmaf(ca, av, cb * bv));
        }
        __syncthreads(); /* every read of this head before the next head's sums */
    }
}

/* Whether row r starts a run: its sequence's first new row or a position at a block's start. */
static __device__ __forceinline__ bool run_start(const loom__k_kv &kv, int r) {
    const int s = kv.row_seq[r];
    return r == kv.q_start[s] || (kv.pos_start[s] + (r - kv.q_start[s])) % kv.block_size == 0;
}

/* Shared memory: the newcomer's norms [2][H] (K, V), then the block_sum area. */
template <int KV>
static __global__ void __launch_bounds__(MERGE_THREADS) store_b_kernel(merge_args a) {
    LOOM_K_DYN_SMEM(merge_sm);
    double *smem = (double *)merge_sm;
    double *red = smem;
    float *xnorm = (float *)(smem + MERGE_THREADS / 32); /* [2][H] */
    __shared__ int32_t decide[2]; /* the newcomer's row (-1: merged), victim */
    const loom__k_kv &kv = a.kv;
    int r = blockIdx.x;
    if (!run_start(kv, r)) return;
    const int H = kv.n_kv_heads, hd = kv.head_dim, R = a.m.retain;
    do {
        const int s = kv.row_seq[r];
        const int p = kv.pos_start[s] + (r - kv.q_start[s]);
        const int blk = kv.block_ids[kv.indptr[s] + p / kv.block_size], t = p % kv.block_size;
        const mblock b = mblock_at<KV>(a, blk);
        const float *x[2] = {(const float *)((const char *)a.k + (size_t)r * a.k_stride),
                             (const float *)((const char *)a.v + (size_t)r * a.v_stride)};
        /* Norms, then the distance to the pair's stored directions. */
        float d = 0.0f;
        for (int kv_i = 0; kv_i < 2; kv_i++) {
            for (int h = 0; h < H; h++) {
                const float *xh = x[kv_i] + (size_t)h * hd;
                const char *ah = a_row(b, kv, kv_i, t) + (size_t)h * hd * elt<KV>();
                double xx = 0.0;
                for (int e = threadIdx.x; e < hd; e += blockDim.x) xx += (double)xh[e] * xh[e];
                const float n = (float)sqrt(block_sum(xx, red));
                /* The direction's elements as the CPU rounds them (x[e] / n in float). */
                double ab = 0.0, aa = 0.0, bb = 0.0;
                for (int e = threadIdx.x; e < hd; e += blockDim.x) {
                    const double bv = n == 0.0f ? 0.0f : xh[e] / n, av = loom_kv_get<KV>(ah, e);
                    ab += av * bv;
                    aa += av * av;
                    bb += bv * bv;
                }
                ab = block_sum(ab, red);
                aa = block_sum(aa, red);
                bb = block_sum(bb, red);
                const float dh = loom__merge_dist(ab, aa, bb);
                d = dh > d ? dh : d;
                if (threadIdx.x == 0) {
                    xnorm[kv_i * H + h] = n;
                    b.norm[((size_t)t * H + h) * 4 + 2 + kv_i] = n;
                }
            }
        }
        __syncthreads();
        if (threadIdx.x == 0) {
            b.dist[t] = d;
            int row = -1, victim = -1;
            if (R > 0) { /* cpu_kv_merge.c's kept_victim */
                uint64_t used[LOOM_KV_MERGE_MAX_RETAIN / 64];
                for (int i = 0; i < (R + 63) / 64; i++) used[i] = 0;
                int n_kept = 0;
                for (int j = 0; j < t; j++) {
                    const int rj = b.state[j];
                    if (rj < 0 || rj >= R || (used[rj / 64] >> (rj % 64) & 1)) continue;
                    used[rj / 64] |= (uint64_t)1 << (rj % 64);
                    n_kept++;
                    if (victim < 0 || b.dist[j] <= b.dist[victim]) victim = j;
                }
                if (n_kept < R) {
                    row = 0;
                    while (used[row / 64] >> (row % 64) & 1) row++;
                    victim = -1;
                } else if (d > b.dist[victim]) {
                    row = b.state[victim];
                } else {
                    victim = -1;
                }
            }
            decide[0] = row;
            decide[1] = victim;
        }
        __syncthreads();
        const int row = decide[0], victim = decide[1];
        if (victim >= 0) { /* the victim is merged from its two stored directions */
            for (int kv_i = 0; kv_i < 2; kv_i++)
                merge_into_a<KV>(a, b, victim, kv_i, kept_row(b, kv_i, row), NULL, NULL, red);
            if (threadIdx.x == 0) b.state[victim] = -1;
        }
        if (row >= 0) {
            for (int kv_i = 0; kv_i < 2; kv_i++) {
                char *dst = kept_row(b, kv_i, row);
                for (int i = threadIdx.x; i < H * hd; i += blockDim.x) {
                    const float n = xnorm[kv_i * H + i / hd];
                    loom_kv_put<KV>(dst, i, n == 0.0f ? 0.0f : x[kv_i][i] / n);
                }
            }
            if (threadIdx.x == 0) b.state[t] = row;
        } else {
            for (int kv_i = 0; kv_i < 2; kv_i++)
                merge_into_a<KV>(a, b, t, kv_i, NULL, x[kv_i], xnorm + kv_i * H, red);
            if (threadIdx.x == 0) b.state[t] = -1;
        }
        __syncthreads(); /* this row's writes before the next row reads the block */
        r++;
    } while (r < kv.n_rows && !run_start(kv, r));
}

#if LOOM_K_HOST_CODE /* tests/kernels_emu/ launches the kernels itself */
template <int KV> static loom_status merge_launch(cudaStream_t stream, const merge_args &a) {
    if (!a.m.later) {
        dim3 grid((unsigned)a.kv.n_rows, (unsigned)a.kv.n_kv_heads);
        LOOM_K_LAUNCH((store_a_kernel<KV>), (grid, MERGE_THREADS, 0, stream), a);
        LOOM_K_LAUNCHED("kv_store (merged pair, earlier layer)");
        return LOOM_OK;
    }
    const size_t smem = (MERGE_THREADS / 32) * sizeof(double) + 2 * (size_t)a.kv.n_kv_heads * 4;
    LOOM_K_LAUNCH((store_b_kernel<KV>), ((unsigned)a.kv.n_rows, MERGE_THREADS, smem, stream), a);
    LOOM_K_LAUNCHED("kv_store (merged pair, later layer)");
    return LOOM_OK;
}

extern "C" loom_status loom__cuda_kv_store_merged(cudaStream_t stream, const loom__k_kv *kv,
                                                  const float *k, size_t k_stride, const float *v,
                                                  size_t v_stride, void *k_pool, void *v_pool,
                                                  const loom__k_merge *m) {
    if (kv->n_rows == 0) return LOOM_OK;
    if (kv->n_kv_heads > 4096 || m->retain > LOOM_KV_MERGE_MAX_RETAIN)
        LOOM_K_UNSUPPORTED("cuda: merged kv_store of %d heads", kv->n_kv_heads);
    merge_args a = {*kv, k, v, k_stride, v_stride, {(char *)k_pool, (char *)v_pool}, *m};
    switch (kv->kv_type) {
    case LOOM_K_F32:
        return merge_launch<LOOM_K_F32>(stream, a);
    case LOOM_K_F16:
        return merge_launch<LOOM_K_F16>(stream, a);
    case LOOM_K_BF16:
        return merge_launch<LOOM_K_BF16>(stream, a);
    default:
        LOOM_K_UNSUPPORTED("cuda: merged pairs over kv type %u (f32, f16, bf16)",
                           (unsigned)kv->kv_type);
    }
}
#endif
