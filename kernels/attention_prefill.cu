/* attention_prefill.cu — tiled prefill attention over the paged KV cache on tensor cores
 * (mma.sync m16n8k8, TF32, sm_80+), for the sequences of a step with many new rows: those with
 * LOOM_K_ATTN_PREFILL_ROWS or more (step_begin lists them; attention.cu's dispatch sends the
 * rows of the others to the split-KV kernel).
 *
 * Tiling. A block takes one tile of one sequence's new rows and one KV head: PF_M = 64 query
 * vectors, the tile's rows times the query heads of the KV head's GQA group, packed row by row
 * (vector m = row * group + head; 64 / group rows per tile), so every K/V position read from
 * the pages serves all the group's heads. Each of its four warps holds 16 vectors (one m16 row
 * block of the mma). The block walks the positions from its first row's window start to its
 * last row's position in tiles of PF_N = 32 (at multiples of 32): each K/V tile is gathered
 * through the block table into shared memory as float32 (positions outside the range as
 * zeros), then each warp computes S = Q Kᵀ for its vectors, masks it (causal: position <= the
 * row's; window: position > the row's - window), soft-caps it, updates its online softmax
 * (float32 maximum, sum and accumulator per vector) and adds P V to its accumulator.
 *
 * Arithmetic (float32 accuracy, mma.cuh's TF32 splitting): Q is float32, split hi + lo where
 * each fragment is loaded. F16, BF16 and FP8 pages hold values that are exact TF32, so Q Kᵀ
 * takes two instructions per product (q_lo k + q_hi k) and P V two (p_lo v + p_hi v), P split
 * the same way; F32 pages split K and V as well (three instructions). FP8 pages are read as
 * their codes' values: the (position, KV head) scale of K multiplies that position's score
 * column after Q Kᵀ, the scale of V the probability that weighs the position (P V), while the
 * softmax sum takes the unscaled probability. Masked positions get a weight of exactly 0.
 *
 * Bits. The output of a vector depends only on its own row's positions and the tile grid of
 * positions (absolute multiples of PF_N): an mma output element reads one row of A and one
 * column of B; a tile none of whose positions a warp's vectors attend is skipped, and would
 * have changed nothing (every weight +0, the correction exp(0) = 1). So within this kernel a
 * sequence's result does not depend on the batch, nor on which rows share its tile; but its
 * rows and split-KV's give different last bits, and which kernel a row takes follows how many
 * rows its sequence has in the step, which the scheduler's cut decides. So only the backend's
 * fast mode (LOOM_CUDA_BATCH_INVARIANT=0) runs this kernel; by default every row stays on
 * split-KV.
 *
 * Not here (attention.cu keeps them on the split-KV kernel): the layers of merged pairs, head
 * sizes that are not a multiple of 8, pages whose strides do not align to 4 elements, and a
 * device whose shared memory per block is too small for the tile. */
#include "mma.cuh"

#include <math.h>

#include "tensor/fp8.h"

#define PF_WARPS   4
#define PF_THREADS (PF_WARPS * 32)
#define PF_M       (PF_WARPS * 16) /* query vectors per block */
#define PF_N       32              /* positions per K/V tile */
#define PF_NT      (PF_N / 8)      /* n8 tiles of a warp's S */

typedef struct pf_args {
    loom__k_kv kv;
    loom__k_attn p;
    int32_t group;         /* query heads per KV head */
    int32_t rows_per_tile; /* PF_M / group */
} pf_args;

/* Shared memory: the tile's page offsets and FP8 scales (two buffers: the next tile's are
 * looked up while this one loads), Q [PF_M][ld], K and V [PF_N][ld] as float32, where
 * ld = head_dim + 4 makes every fragment load below free of bank conflicts (a row of the
 * fragment's eight falls 4 or 12 banks past the one before, its four columns in between). */
#define PF_HEAD_BYTES (2 * PF_N * (sizeof(long long) + 2 * sizeof(float)))

static size_t pf_smem_bytes(int32_t head_dim) {
    return PF_HEAD_BYTES + (size_t)(PF_M + 2 * PF_N) * (size_t)(head_dim + 4) * sizeof(float);
}

/* A row's first attended position; the same rule, planted bug included, as attention.cu's
 * row_range. */
static __device__ __forceinline__ int pf_lo(const loom__k_kv &kv, int pos) {
    int lo = kv.window > 0 && pos - kv.window + 1 > 0 ? pos - kv.window + 1 : 0;
#if defined(LOOM_K_PLANTED_BUG)
    /* A deliberate off-by-one, built only by bench/gpu/check.sh's planted-bug step to show that
     * test_cuda_ops catches it: long rows lose position 0. Never in a real build. */
    if (pos >= 4000 && lo == 0) lo = 1;
#endif
    return lo;
}

/* P V reads P from the registers S was left in. S's C fragment holds, per lane, the positions
 * (columns) 2i and 2i+1 of an n8 tile; the A fragment of P V wants columns i and i+4. Rather
 * than move P between lanes, the k dimension of P V is taken in another order: k index kk
 * stands for position pf_pv_pos(kk) of the tile, so A's column i + 4t (a[r], t = r / 2) is
 * position 2i + t, which this lane holds (C element pf_a_from_c(r): the same row, column
 * 2i + t), and B's row kk (V) is read at position pf_pv_pos(kk). */
static __device__ __forceinline__ int pf_pv_pos(int kk) {
    return 2 * (kk & 3) + (kk >> 2);
}
static __device__ __forceinline__ int pf_a_from_c(int r) {
    return 2 * (r & 1) + (r >> 1);
}

/* Four elements of a page row as float32, exactly. FP8 codes unscaled. */
static __device__ __forceinline__ float4 pf_load4(uint32_t type, const char *p) {
    switch (type) {
    case LOOM_K_F32:
        return *(const float4 *)p;
    case LOOM_K_F16: {
        const uint2 u = *(const uint2 *)p;
        return make_float4(loom_h2f((uint16_t)u.x), loom_h2f((uint16_t)(u.x >> 16)),
                           loom_h2f((uint16_t)u.y), loom_h2f((uint16_t)(u.y >> 16)));
    }
    case LOOM_K_BF16: {
        const uint2 u = *(const uint2 *)p;
        return make_float4(loom_bf2f((uint16_t)u.x), loom_bf2f((uint16_t)(u.x >> 16)),
                           loom_bf2f((uint16_t)u.y), loom_bf2f((uint16_t)(u.y >> 16)));
    }
    case LOOM_K_FP8_E4M3: {
        const uint32_t u = *(const uint32_t *)p;
        return make_float4(
            loom__fp8_e4m3_to_f32((uint8_t)u), loom__fp8_e4m3_to_f32((uint8_t)(u >> 8)),
            loom__fp8_e4m3_to_f32((uint8_t)(u >> 16)), loom__fp8_e4m3_to_f32((uint8_t)(u >> 24)));
    }
    default: {
        const uint32_t u = *(const uint32_t *)p;
        return make_float4(
            loom__fp8_e5m2_to_f32((uint8_t)u), loom__fp8_e5m2_to_f32((uint8_t)(u >> 8)),
            loom__fp8_e5m2_to_f32((uint8_t)(u >> 16)), loom__fp8_e5m2_to_f32((uint8_t)(u >> 24)));
    }
    }
}

static __host__ __device__ __forceinline__ size_t pf_elt_bytes(uint32_t type) {
    return type == LOOM_K_F32 ? 4 : (type == LOOM_K_FP8_E4M3 || type == LOOM_K_FP8_E5M2) ? 1 : 2;
}

static __device__ __forceinline__ bool pf_fp8(uint32_t type) {
    return type == LOOM_K_FP8_E4M3 || type == LOOM_K_FP8_E5M2;
}

/* Threads 0 .. PF_N-1: the page offset (-1: outside [lo, hi], not read) and the FP8 scales of
 * positions j0 .. j0+PF_N-1 of KV head kvh. */
static __device__ __forceinline__ void pf_lookup(const pf_args &a, const int32_t *table, int kvh,
                                                 int j0, int lo, int hi, long long *row_at,
                                                 float *ksc, float *vsc) {
    const loom__k_kv &kv = a.kv;
    const int t = threadIdx.x;
    if (t >= PF_N) return;
    const int j = j0 + t;
    long long at = -1;
    float k_s = 0.0f, v_s = 0.0f;
    if (j >= lo && j <= hi) {
        const int blk = table[j / kv.block_size], slot = j % kv.block_size;
        at = (long long)((size_t)blk * kv.block_stride + (size_t)slot * kv.token_stride +
                         (size_t)kvh * kv.head_dim * pf_elt_bytes(kv.kv_type));
        if (pf_fp8(kv.kv_type)) {
            const size_t sat = (size_t)blk * kv.scale_block_stride +
                               (size_t)slot * kv.scale_token_stride + (size_t)kvh * sizeof(float);
            k_s = *(const float *)((const char *)a.p.k_scale + sat);
            v_s = *(const float *)((const char *)a.p.v_scale + sat);
        }
    }
    row_at[t] = at;
    ksc[t] = k_s;
    vsc[t] = v_s;
}

/* The K and V tile of the offsets row_at into ks, vs [PF_N][ld], four elements a thread at a
 * time; positions not read are zeros. */
static __device__ __forceinline__ void pf_load_tile(const pf_args &a, const long long *row_at,
                                                    float *ks, float *vs, int ld) {
    const int hd = a.kv.head_dim, per = hd / 4;
    const uint32_t type = a.kv.kv_type;
    const size_t elt = pf_elt_bytes(type);
    const char *kp = (const char *)a.p.k_pool, *vp = (const char *)a.p.v_pool;
    for (int it = threadIdx.x; it < PF_N * per; it += PF_THREADS) {
        const int jl = it / per, c = (it - jl * per) * 4;
        const long long at = row_at[jl];
        float4 k4 = make_float4(0.0f, 0.0f, 0.0f, 0.0f), v4 = k4;
        if (at >= 0) {
            k4 = pf_load4(type, kp + at + (size_t)c * elt);
            v4 = pf_load4(type, vp + at + (size_t)c * elt);
        }
        *(float4 *)(ks + jl * ld + c) = k4;
        *(float4 *)(vs + jl * ld + c) = v4;
    }
}

/* HDMAX: the head size the accumulator registers are laid out for (head_dim <= HDMAX, a
 * multiple of 8); F32KV: F32 pages, whose K and V are split hi + lo too. */
template <int HDMAX, bool F32KV>
static __global__ void __launch_bounds__(PF_THREADS) attn_prefill_kernel(pf_args a) {
    const loom__k_kv &kv = a.kv;
    /* blockIdx.x: the prefill sequences' tiles, the last tile of each (the most positions)
     * first; a sequence with fewer tiles than the longest has nothing at the end. */
    const int n_pf = kv.n_prefill_seqs;
    const int s = kv.prefill_seqs[blockIdx.x % n_pf], back = (int)(blockIdx.x / n_pf);
    const int q0 = kv.q_start[s], n_new = kv.q_start[s + 1] - q0, BR = a.rows_per_tile;
    const int n_tiles = (n_new + BR - 1) / BR;
    if (back >= n_tiles) return;
    const int tile = n_tiles - 1 - back;
    const int row0 = q0 + tile * BR, rows = n_new - tile * BR < BR ? n_new - tile * BR : BR;
    const int pos0 = kv.pos_start[s] + tile * BR, pos_last = pos0 + rows - 1;
    const int kvh = blockIdx.y, G = a.group, hd = kv.head_dim, ld = hd + 4;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const bool fp8 = pf_fp8(kv.kv_type);
    const float scale = a.p.scale, cap = a.p.softcap;

    LOOM_K_DYN_SMEM(pf_sm);
    long long *row_at = (long long *)pf_sm;                       /* [2][PF_N] */
    float *ksc = (float *)(pf_sm + 2 * PF_N * sizeof(long long)); /* [2][PF_N] */
    float *vsc = ksc + 2 * PF_N;                                  /* [2][PF_N] */
    float *qs = (float *)(pf_sm + PF_HEAD_BYTES);                 /* [PF_M][ld] */
    float *ks = qs + PF_M * ld;                                   /* [PF_N][ld] */
    float *vs = ks + PF_N * ld;                                   /* [PF_N][ld] */

    /* Q: vector m = row m / G, head kvh * G + m % G; vectors past the tile's rows are zeros. */
    for (int e = threadIdx.x; e < PF_M * hd; e += PF_THREADS) {
        const int m = e / hd, d = e - m * hd, rl = m / G;
        float x = 0.0f;
        if (rl < rows) {
            const float *qrow =
                (const float *)((const char *)a.p.q + (size_t)(row0 + rl) * a.p.q_stride);
            x = qrow[(size_t)(kvh * G + m - rl * G) * hd + d];
        }
        qs[m * ld + d] = x;
    }

    /* This lane's two vectors (rows g and g+8 of its warp's C fragments): in the tile, their
     * position and first attended position. */
    bool vin[2];
    int vpos[2], vlo[2];
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const int rl = (warp * 16 + loom_mma_c_row(lane, 2 * h)) / G;
        vin[h] = rl < rows;
        vpos[h] = pos0 + rl;
        vlo[h] = pf_lo(kv, vpos[h]);
    }
    /* The warp's rows attend to positions [w_lo, w_hi] at most (lo grows with the position). */
    const int wr0 = warp * 16 / G, wr1_ = (warp * 16 + 15) / G;
    const int wr1 = wr1_ < rows - 1 ? wr1_ : rows - 1;
    const bool w_any = wr0 < rows;
    const int w_lo = pf_lo(kv, pos0 + wr0), w_hi = pos0 + wr1;

    float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.0f, 0.0f}; /* l: this lane's part */
    float o[HDMAX / 8][4];
#pragma unroll
    for (int dn = 0; dn < HDMAX / 8; dn++)
#pragma unroll
        for (int r = 0; r < 4; r++) o[dn][r] = 0.0f;

    const int32_t *table = kv.block_ids + kv.indptr[s];
    const int lo_first = pf_lo(kv, pos0), j_begin = lo_first / PF_N * PF_N;
    pf_lookup(a, table, kvh, j_begin, lo_first, pos_last, row_at, ksc, vsc);
    __syncthreads();
    int buf = 0;
    for (int j0 = j_begin; j0 <= pos_last; j0 += PF_N, buf ^= 1) {
        pf_load_tile(a, row_at + buf * PF_N, ks, vs, ld);
        if (j0 + PF_N <= pos_last)
            pf_lookup(a, table, kvh, j0 + PF_N, lo_first, pos_last, row_at + (buf ^ 1) * PF_N,
                      ksc + (buf ^ 1) * PF_N, vsc + (buf ^ 1) * PF_N);
        __syncthreads();
        if (w_any && j0 <= w_hi && j0 + PF_N - 1 >= w_lo) { /* warp-uniform */
            const float *kscb = ksc + buf * PF_N, *vscb = vsc + buf * PF_N;
            /* S = Q Kᵀ: [16 vectors][PF_N positions] in C fragments. */
            float sc[PF_NT][4];
#pragma unroll
            for (int nt = 0; nt < PF_NT; nt++)
#pragma unroll
                for (int r = 0; r < 4; r++) sc[nt][r] = 0.0f;
            const float *qw = qs + warp * 16 * ld;
#pragma unroll 2
            for (int d0 = 0; d0 < hd; d0 += 8) {
                uint32_t qh[4], ql[4];
#pragma unroll
                for (int r = 0; r < 4; r++)
                    loom_tf32_split(qw[loom_mma_a_row(lane, r) * ld + d0 + loom_mma_a_col(lane, r)],
                                    &qh[r], &ql[r]);
#pragma unroll
                for (int nt = 0; nt < PF_NT; nt++) {
                    /* B = Kᵀ: row (k) = head element, column (n) = position */
                    const float *kr = ks + (nt * 8 + loom_mma_b_col(lane)) * ld + d0;
                    if (F32KV) {
                        uint32_t kh[2], kl[2];
#pragma unroll
                        for (int r = 0; r < 2; r++)
                            loom_tf32_split(kr[loom_mma_b_row(lane, r)], &kh[r], &kl[r]);
                        loom_mma_3xtf32(sc[nt], qh, ql, kh, kl);
                    } else {
                        uint32_t kb[2];
#pragma unroll
                        for (int r = 0; r < 2; r++)
                            kb[r] = __float_as_uint(kr[loom_mma_b_row(lane, r)]);
                        loom_mma_2xtf32_a(sc[nt], qh, ql, kb);
                    }
                }
            }
            /* Scores as the CPU forms them (times K's FP8 scale, times scale, soft-capped),
             * masked to -inf, and each vector's maximum over the tile (its row's four lanes). */
            float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
            for (int nt = 0; nt < PF_NT; nt++)
#pragma unroll
                for (int r = 0; r < 4; r++) {
                    const int h = r >> 1, jl = nt * 8 + loom_mma_c_col(lane, r), j = j0 + jl;
                    float x = sc[nt][r];
                    if (fp8) x *= kscb[jl];
                    x *= scale;
                    if (cap > 0.0f) x = cap * tanhf(x / cap);
                    x = vin[h] && j >= vlo[h] && j <= vpos[h] ? x : -INFINITY;
                    sc[nt][r] = x;
                    mx[h] = fmaxf(mx[h], x);
                }
            float corr[2];
#pragma unroll
            for (int h = 0; h < 2; h++) {
                mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 1));
                mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 2));
                const float mn = fmaxf(m_run[h], mx[h]);
                /* nothing attended yet: stays -inf, weights 0, correction 1 */
                corr[h] = mn == -INFINITY ? 1.0f : expf(m_run[h] - mn);
                m_run[h] = mn;
            }
            /* Weights; the sum takes them as they are, P V times V's FP8 scale. */
            float ls[2] = {0.0f, 0.0f};
#pragma unroll
            for (int nt = 0; nt < PF_NT; nt++)
#pragma unroll
                for (int r = 0; r < 4; r++) {
                    const int h = r >> 1;
                    const float w = sc[nt][r] == -INFINITY ? 0.0f : expf(sc[nt][r] - m_run[h]);
                    ls[h] += w;
                    sc[nt][r] = fp8 ? w * vscb[nt * 8 + loom_mma_c_col(lane, r)] : w;
                }
#pragma unroll
            for (int h = 0; h < 2; h++) l_run[h] = l_run[h] * corr[h] + ls[h];
#pragma unroll
            for (int dn = 0; dn < HDMAX / 8; dn++)
#pragma unroll
                for (int r = 0; r < 4; r++) o[dn][r] *= corr[r >> 1];
                    /* O += P V, k over the tile's positions in pf_pv_pos order (above). */
#pragma unroll
            for (int nt = 0; nt < PF_NT; nt++) {
                uint32_t ph[4], pl[4];
#pragma unroll
                for (int r = 0; r < 4; r++) loom_tf32_split(sc[nt][pf_a_from_c(r)], &ph[r], &pl[r]);
                const float *vt = vs + nt * 8 * ld + loom_mma_b_col(lane);
                const int v0 = pf_pv_pos(loom_mma_b_row(lane, 0)) * ld;
                const int v1 = pf_pv_pos(loom_mma_b_row(lane, 1)) * ld;
#pragma unroll
                for (int dn = 0; dn < HDMAX / 8; dn++) {
                    if (dn * 8 >= hd) break;
                    if (F32KV) {
                        uint32_t vh[2], vl[2];
                        loom_tf32_split(vt[v0 + dn * 8], &vh[0], &vl[0]);
                        loom_tf32_split(vt[v1 + dn * 8], &vh[1], &vl[1]);
                        loom_mma_3xtf32(o[dn], ph, pl, vh, vl);
                    } else {
                        const uint32_t vb[2] = {__float_as_uint(vt[v0 + dn * 8]),
                                                __float_as_uint(vt[v1 + dn * 8])};
                        loom_mma_2xtf32_a(o[dn], ph, pl, vb);
                    }
                }
            }
        }
        __syncthreads();
    }

    /* The row sums over the four lanes, then out = acc / l (as the CPU: times 1 / l). */
#pragma unroll
    for (int h = 0; h < 2; h++) {
        l_run[h] += __shfl_xor_sync(0xffffffffu, l_run[h], 1);
        l_run[h] += __shfl_xor_sync(0xffffffffu, l_run[h], 2);
        if (!vin[h]) continue;
        const int m = warp * 16 + loom_mma_c_row(lane, 2 * h), rl = m / G;
        const float inv = l_run[h] > 0.0f ? 1.0f / l_run[h] : 0.0f;
        float *orow = (float *)((char *)a.p.out + (size_t)(row0 + rl) * a.p.out_stride) +
                      (size_t)(kvh * G + m - rl * G) * hd;
#pragma unroll
        for (int dn = 0; dn < HDMAX / 8; dn++) {
            if (dn * 8 >= hd) break;
            orow[dn * 8 + loom_mma_c_col(lane, 2 * h)] = o[dn][2 * h] * inv;
            orow[dn * 8 + loom_mma_c_col(lane, 2 * h + 1)] = o[dn][2 * h + 1] * inv;
        }
    }
}

/* ------------------------------------------------------------------------------------------ */
/* Launch                                                                                     */
/* ------------------------------------------------------------------------------------------ */

#if !defined(LOOM_K_EMULATE) /* tests/kernels_emu/ launches the kernel itself */
template <int HDMAX, bool F32KV>
static loom_status pf_launch(cudaStream_t stream, const pf_args &a, unsigned blocks, size_t smem) {
    if (smem > 48 * 1024) { /* past the default: the kernel opts in (checked against the device) */
        const cudaError_t e =
            cudaFuncSetAttribute(attn_prefill_kernel<HDMAX, F32KV>,
                                 cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
        if (e != cudaSuccess) {
            (void)cudaGetLastError();
            return loom__fail(LOOM_ERR_BACKEND,
                              "cuda: prefill attention with %zu bytes of shared "
                              "memory: %s (%s)",
                              smem, cudaGetErrorString(e), cudaGetErrorName(e));
        }
    }
    const dim3 grid(blocks, (unsigned)a.kv.n_kv_heads);
    attn_prefill_kernel<HDMAX, F32KV><<<grid, PF_THREADS, smem, stream>>>(a);
    LOOM_K_LAUNCHED("attention (prefill)");
    return LOOM_OK;
}
#endif

/* Whether the layer is one the kernel runs (the header comment's list), the device aside. */
static bool pf_layer_ok(const loom__k_kv *kv, const loom__k_attn *p) {
    if (p->merge.base != NULL) return false;
    const uint32_t t = kv->kv_type;
    const bool fp8 = t == LOOM_K_FP8_E4M3 || t == LOOM_K_FP8_E5M2;
    if (t != LOOM_K_F32 && t != LOOM_K_F16 && t != LOOM_K_BF16 && !fp8) return false;
    if (kv->head_dim < 8 || kv->head_dim > 256 || kv->head_dim % 8 != 0) return false;
    if (p->n_head % kv->n_kv_heads != 0 || p->n_head / kv->n_kv_heads > PF_M) return false;
    /* rows are read four elements at a time */
    const size_t al = 4 * pf_elt_bytes(t);
    if (kv->token_stride % al != 0 || kv->block_stride % al != 0 ||
        (uintptr_t)p->k_pool % al != 0 || (uintptr_t)p->v_pool % al != 0)
        return false;
    if (fp8 && (p->k_scale == NULL || p->v_scale == NULL || kv->scale_token_stride % 4 != 0 ||
                kv->scale_block_stride % 4 != 0 || (uintptr_t)p->k_scale % 4 != 0 ||
                (uintptr_t)p->v_scale % 4 != 0))
        return false;
    return true;
}

#if !defined(LOOM_K_EMULATE)
extern "C" loom_status loom__cuda_attention_prefill(cudaStream_t stream, const loom__k_kv *kv,
                                                    const loom__k_attn *p, int *ran) {
    *ran = 0;
    if (kv->n_prefill_seqs <= 0 || !pf_layer_ok(kv, p)) return LOOM_OK;
    const size_t smem = pf_smem_bytes(kv->head_dim);
    int dev = 0, optin = 0;
    cudaError_t e = cudaGetDevice(&dev);
    if (e == cudaSuccess)
        e = cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev);
    if (e != cudaSuccess)
        return loom__fail(LOOM_ERR_BACKEND,
                          "cuda: prefill attention: the device's shared memory: "
                          "%s (%s)",
                          cudaGetErrorString(e), cudaGetErrorName(e));
    if (smem > (size_t)optin) return LOOM_OK; /* the split-KV kernel takes every row */
    pf_args a = {*kv, *p, p->n_head / kv->n_kv_heads, 0};
    a.rows_per_tile = PF_M / a.group;
    const int64_t blocks =
        (int64_t)kv->n_prefill_seqs * loom_cdiv(kv->prefill_max_rows, a.rows_per_tile);
    if (blocks > 0x7fffffff) return LOOM_OK;
    const bool f32 = kv->kv_type == LOOM_K_F32;
    loom_status st = LOOM_OK;
    switch (kv->head_dim <= 64 ? 64 : kv->head_dim <= 128 ? 128 : 256) {
    case 64:
        st = f32 ? pf_launch<64, true>(stream, a, (unsigned)blocks, smem)
                 : pf_launch<64, false>(stream, a, (unsigned)blocks, smem);
        break;
    case 128:
        st = f32 ? pf_launch<128, true>(stream, a, (unsigned)blocks, smem)
                 : pf_launch<128, false>(stream, a, (unsigned)blocks, smem);
        break;
    case 256:
        st = f32 ? pf_launch<256, true>(stream, a, (unsigned)blocks, smem)
                 : pf_launch<256, false>(stream, a, (unsigned)blocks, smem);
        break;
    default:
        LOOM_K_UNSUPPORTED("cuda: prefill attention with head_dim %d", kv->head_dim);
    }
    if (st == LOOM_OK) *ran = 1;
    return st;
}
#endif
