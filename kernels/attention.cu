/* attention.cu — attention over the paged KV cache, split-KV (flash-decoding): every query row
 * attends to positions max(0, p - window + 1) .. p of its sequence, cut into splits whose
 * number and bounds depend only on that length (ceil(len / 256) splits, at most 16), so a
 * row's result never depends on what else is in the batch. One block per (split, KV head,
 * row) handles the query heads of one GQA group together, so each K/V position is read once
 * for all of them; four warps take every fourth position and keep an online softmax (float32
 * maximum, sum and accumulator) per head; the warps' states meet in shared memory, and a merge
 * kernel combines the splits in order.
 *
 * Head sizes 64, 128 and 256 over 16-byte-aligned pages (not merged pairs) take the vector
 * form below: each position's K and V read as 16-byte vectors, a warp over several positions
 * at once; other shapes the scalar form, one position per warp at a time.
 *
 * FP8 pages are read as they lie: each position's codes widened to float32 and multiplied by
 * its (position, head) scale, the values the CPU backend's attention reads. The layers of a
 * merged pair (kv_merge.cu) read directions multiplied by their own norms, the later layer a
 * retained row where its token kept one.
 *
 * Where the layer is one the tiled tensor-core kernel (attention_prefill.cu) runs, it takes
 * every row in the batch-invariant default, and in the fast mode the rows of a step's prefill
 * sequences (LOOM_K_ATTN_PREFILL_ROWS new rows or more), this kernel the other rows through
 * the step's list of them (loom__k_kv's split_rows). Where it does not, this kernel takes every
 * row. */
#include "common.cuh"

#include <math.h>

#include "tensor/fp8.h"

#define ATTN_WARPS 4

typedef struct attn_args {
    loom__k_kv kv;
    loom__k_attn p;
    const int32_t *rows; /* the rows this kernel takes (kv.split_rows), or NULL: all, in order */
    int32_t row0;        /* first of them in this launch */
} attn_args;

/* The step row of a launch's row rr. */
static __device__ __forceinline__ int attn_row(const attn_args &a, int rr) {
    return a.rows != NULL ? a.rows[a.row0 + rr] : a.row0 + rr;
}

/* A row's splits: its attended range [lo, pos] and how it is cut. */
static __device__ __forceinline__ void row_range(const loom__k_kv &kv, int r, int *lo, int *pos,
                                                 int *n_splits, int *chunk) {
    const int s = kv.row_seq[r];
    *pos = kv.pos_start[s] + (r - kv.q_start[s]);
    *lo = kv.window > 0 && *pos - kv.window + 1 > 0 ? *pos - kv.window + 1 : 0;
#if defined(LOOM_K_PLANTED_BUG)
    /* A deliberate off-by-one, built only by bench/gpu/check.sh's planted-bug step to show that
     * test_cuda_ops catches it: long rows lose position 0. Never in a real build. */
    if (*pos >= 4000 && *lo == 0) *lo = 1;
#endif
    const int len = *pos - *lo + 1;
    int ns = (len + LOOM_K_ATTN_SPLIT_MIN - 1) / LOOM_K_ATTN_SPLIT_MIN;
    if (ns > LOOM_K_ATTN_MAX_SPLITS) ns = LOOM_K_ATTN_MAX_SPLITS;
    *n_splits = ns;
    *chunk = (len + ns - 1) / ns;
}

template <int KV> static __device__ __forceinline__ float load_kv(const char *base, int e) {
    if (KV == LOOM_K_F32) return ((const float *)base)[e];
    if (KV == LOOM_K_F16) return __half2float(((const __half *)base)[e]);
    if (KV == LOOM_K_FP8_E4M3) return loom__fp8_e4m3_to_f32(((const uint8_t *)base)[e]);
    if (KV == LOOM_K_FP8_E5M2) return loom__fp8_e5m2_to_f32(((const uint8_t *)base)[e]);
    return __bfloat162float(((const __nv_bfloat16 *)base)[e]);
}

template <int KV> static __device__ __forceinline__ size_t kv_elt_bytes() {
    return KV == LOOM_K_F32 ? 4 : (KV == LOOM_K_FP8_E4M3 || KV == LOOM_K_FP8_E5M2) ? 1 : 2;
}

/* Workspace: partial outputs [rows][n_head][splits][head_dim], then (max, sum) pairs
 * [rows][n_head][splits][2]. */
static __device__ __forceinline__ float *part_out(const attn_args &a, int rr, int h, int sp) {
    return a.p.work + (((size_t)rr * a.p.n_head + h) * LOOM_K_ATTN_MAX_SPLITS + sp) * a.kv.head_dim;
}
static __device__ __forceinline__ float *part_ml(const attn_args &a, int rr, int h, int sp) {
    return a.p.work +
           (size_t)LOOM_K_ATTN_ROWS * a.p.n_head * LOOM_K_ATTN_MAX_SPLITS * a.kv.head_dim +
           (((size_t)rr * a.p.n_head + h) * LOOM_K_ATTN_MAX_SPLITS + sp) * 2;
}

/* Where element e of a query head lives in q_s and in a warp's comb: CPL = 1 (the scalar form), at
 * e; else (the vector form, whose lanes read CPL 16-byte chunks of a head each, lane sub chunks sub
 * CPL .. + CPL - 1) its chunk c = e / 4 moves to c ^ ((c / 8) % CPL). Unswizzled, the chunks one
 * ld.shared.v4 of a warp reads (CPL apart) fall in 8 / CPL of the 8 bank quads, so it takes CPL
 * times the wavefronts it needs (2 for 16-bit pages, 4 for FP8, every position and query head);
 * swizzled, every lane 8 chunks apart differs in the bits the XOR changes, and the chunks cover
 * all 8. Stays within a head: CPL <= 4, the head a multiple of 16. */
template <int CPL> static __device__ __forceinline__ int q_at(int e) {
    const int c = e >> 2;
    return (c ^ ((c >> 3) & (CPL - 1))) << 2 | (e & 3);
}

/* The block's warps' online-softmax states (comb: [ATTN_WARPS][G][hd] accumulators placed by
 * q_at<CPL>, ml: [ATTN_WARPS][G] (max, sum) pairs, after a barrier) into the split's partial
 * output, in warp order; a warp that saw no position has m = -inf and weighs nothing. */
template <int CPL>
static __device__ __forceinline__ void combine_warps(const attn_args &a, int rr, int kvh, int split,
                                                     int G, int hd, const float *comb,
                                                     const float *ml) {
    for (int i = threadIdx.x; i < G * hd; i += blockDim.x) {
        const int g = i / hd, e = i % hd;
        float M = -INFINITY;
        for (int w = 0; w < ATTN_WARPS; w++) M = fmaxf(M, ml[(w * G + g) * 2]);
        float A = 0.0f, L = 0.0f;
        for (int w = 0; w < ATTN_WARPS; w++) {
            const float mw = ml[(w * G + g) * 2];
            if (mw == -INFINITY) continue;
            const float f = expf(mw - M);
            A += comb[(w * G + g) * hd + q_at<CPL>(e)] * f;
            L += ml[(w * G + g) * 2 + 1] * f;
        }
        const int h = kvh * G + g;
        part_out(a, rr, h, split)[e] = A;
        if (e == 0) {
            part_ml(a, rr, h, split)[0] = M;
            part_ml(a, rr, h, split)[1] = L;
        }
    }
}

/* The block's shared memory (q_s [G][hd]: the row's query heads of this KV head, placed by
 * q_at<CPL>; comb [ATTN_WARPS][G][hd] and ml [ATTN_WARPS][G][2]: the warps' softmax states), with
 * q staged into q_s; both split-KV forms. */
template <int CPL>
static __device__ __forceinline__ void stage_q(const attn_args &a, int r, int kvh, int G, int hd,
                                               float *sm, float **q_s, float **comb, float **ml) {
    *q_s = sm;
    *comb = sm + G * hd;
    *ml = *comb + ATTN_WARPS * G * hd;
    const float *qrow = (const float *)((const char *)a.p.q + (size_t)r * a.p.q_stride);
    for (int i = threadIdx.x; i < G * hd; i += blockDim.x) {
        const int g = i / hd, e = i - g * hd;
        (*q_s)[g * hd + q_at<CPL>(e)] = qrow[kvh * G * hd + i];
    }
    __syncthreads();
}

/* The (position, KV head) scales of FP8 pages at (block, slot). */
static __device__ __forceinline__ void fp8_scales(const attn_args &a, int blk, int slot, int kvh,
                                                  float *ks, float *vs) {
    const size_t sat = (size_t)blk * a.kv.scale_block_stride +
                       (size_t)slot * a.kv.scale_token_stride + (size_t)kvh * sizeof(float);
    *ks = *(const float *)((const char *)a.p.k_scale + sat);
    *vs = *(const float *)((const char *)a.p.v_scale + sat);
}

/* HDC: head elements per lane (head_dim <= 32 * HDC); MAXG: most query heads per KV head. */
template <int KV, int HDC, int MAXG>
static __global__ void __launch_bounds__(ATTN_WARPS * 32) attn_split_kernel(attn_args a) {
    const loom__k_kv &kv = a.kv;
    const int split = blockIdx.x, kvh = blockIdx.y, rr = blockIdx.z, r = attn_row(a, rr);
    int lo, pos, ns, chunk;
    row_range(kv, r, &lo, &pos, &ns, &chunk);
    if (split >= ns) return;
    const int a0 = lo + split * chunk;
    const int a1 = a0 + chunk < pos + 1 ? a0 + chunk : pos + 1;
    const int hd = kv.head_dim, G = a.p.n_head / kv.n_kv_heads;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;

    LOOM_K_DYN_SMEM(attn_sm);
    float *q_s, *comb, *ml;
    stage_q<1>(a, r, kvh, G, hd, (float *)attn_sm, &q_s, &comb, &ml);

    float m[MAXG], l[MAXG], acc[MAXG][HDC];
#pragma unroll
    for (int g = 0; g < MAXG; g++) {
        m[g] = -INFINITY;
        l[g] = 0.0f;
#pragma unroll
        for (int i = 0; i < HDC; i++) acc[g][i] = 0.0f;
    }
    const int32_t *table = kv.block_ids + kv.indptr[kv.row_seq[r]];
    const size_t elt = kv_elt_bytes<KV>();
    const bool fp8 = KV == LOOM_K_FP8_E4M3 || KV == LOOM_K_FP8_E5M2;
    for (int t = a0 + warp; t < a1; t += ATTN_WARPS) {
        const int blk = table[t / kv.block_size], slot = t % kv.block_size;
        const size_t at =
            (size_t)blk * kv.block_stride + (size_t)slot * kv.token_stride + (size_t)kvh * hd * elt;
        const char *kp = (const char *)a.p.k_pool + at, *vp = (const char *)a.p.v_pool + at;
        float ks = 1.0f, vs = 1.0f;
        if (!fp8 && a.p.merge.base != NULL) { /* a merged pair: direction times norm */
            const char *mb = a.p.merge.base + (size_t)blk * a.p.merge.block_stride;
            const float *nrm = (const float *)mb + ((size_t)slot * kv.n_kv_heads + kvh) * 4 +
                               (a.p.merge.later ? 2 : 0);
            ks = nrm[0];
            vs = nrm[1];
            if (a.p.merge.later) {
                const int32_t kept = *(const int32_t *)(mb + a.p.merge.state_at + 4 * (size_t)slot);
                if (kept >= 0 && kept < a.p.merge.retain) {
                    const size_t row = (size_t)kv.n_kv_heads * hd * elt;
                    kp = mb + a.p.merge.rows_at + (size_t)kept * 2 * row + (size_t)kvh * hd * elt;
                    vp = kp + row;
                }
            }
        }
        if (fp8) fp8_scales(a, blk, slot, kvh, &ks, &vs);
        float kf[HDC], vf[HDC];
#pragma unroll
        for (int i = 0; i < HDC; i++) {
            const int e = lane + 32 * i;
            kf[i] = e < hd ? load_kv<KV>(kp, e) * ks : 0.0f;
            vf[i] = e < hd ? load_kv<KV>(vp, e) * vs : 0.0f;
        }
#pragma unroll
        for (int g = 0; g < MAXG; g++) {
            if (g < G) {
                float d = 0.0f;
#pragma unroll
                for (int i = 0; i < HDC; i++) {
                    const int e = lane + 32 * i;
                    if (e < hd) d = fmaf(q_s[g * hd + e], kf[i], d);
                }
                float sc = loom_warp_sum(d) * a.p.scale;
                if (a.p.softcap > 0.0f) sc = a.p.softcap * tanhf(sc / a.p.softcap);
                const float mn = fmaxf(m[g], sc);
                const float co = expf(m[g] - mn), cn = expf(sc - mn);
                /* fmaf: the per-position update's FMA asked for (the build contracts nothing) */
                l[g] = fmaf(l[g], co, cn);
#pragma unroll
                for (int i = 0; i < HDC; i++) acc[g][i] = fmaf(acc[g][i], co, cn * vf[i]);
                m[g] = mn;
            }
        }
    }
#pragma unroll
    for (int g = 0; g < MAXG; g++) {
        if (g < G) {
#pragma unroll
            for (int i = 0; i < HDC; i++) {
                const int e = lane + 32 * i;
                if (e < hd) comb[(warp * G + g) * hd + e] = acc[g][i];
            }
            if (lane == 0) {
                ml[(warp * G + g) * 2] = m[g];
                ml[(warp * G + g) * 2 + 1] = l[g];
            }
        }
    }
    __syncthreads();
    combine_warps<1>(a, rr, kvh, split, G, hd, comb, ml);
}

/* ---- the vector form: 16-byte loads ------------------------------------------------------ */
/* The common shapes (head sizes 64, 128, 256 over pages whose rows are 16-byte aligned; not the
 * layers of merged pairs) read each position's K and V as 16-byte vectors: a lane holds EPL
 * consecutive elements of a vector (8 of F16 and BF16, 4 of F32, 16 of FP8), LPP lanes cover a
 * position's row, and a warp takes 32 / LPP positions at a time — each lane group keeping its
 * own online softmax over its positions, the groups' states combined in a fixed xor tree when
 * the split is done. A position's dot products reduce over the group's lanes by shuffles, once
 * per query head, so one load of K and V serves the whole GQA group as before. Results differ
 * from the scalar form in the order of the additions only; a row's bits still depend on the
 * row alone. */

/* Elements of one 16-byte vector, lanes per position, vectors per lane, for a page type and a
 * head size. */
template <int KV> static __host__ __device__ constexpr int vec_epl() {
    return KV == LOOM_K_F32 ? 4 : (KV == LOOM_K_FP8_E4M3 || KV == LOOM_K_FP8_E5M2) ? 16 : 8;
}
template <int KV, int HD> static __host__ __device__ constexpr int vec_lpp() {
    return HD / vec_epl<KV>() < 32 ? HD / vec_epl<KV>() : 32;
}
template <int KV, int HD> static __host__ __device__ constexpr int vec_vpl() {
    return HD / vec_epl<KV>() / vec_lpp<KV, HD>();
}
/* The most query heads per KV head the vector form holds accumulators for (registers): 8, or
 * 4 where a lane holds 16 elements. */
template <int KV, int HD> static __host__ __device__ constexpr int vec_maxg() {
    return vec_epl<KV>() * vec_vpl<KV, HD>() > 8 ? 4 : 8;
}

/* The n = EPL values of one 16-byte vector at p, as float32. */
template <int KV> static __device__ __forceinline__ void vec_load(const char *p, float *v) {
    const uint4 w = *(const uint4 *)p;
    const uint32_t u[4] = {w.x, w.y, w.z, w.w};
    if (KV == LOOM_K_F32) {
#pragma unroll
        for (int i = 0; i < 4; i++) v[i] = __uint_as_float(u[i]);
    } else if (KV == LOOM_K_F16 || KV == LOOM_K_BF16) {
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const uint16_t lo = (uint16_t)(u[i] & 0xffffu), hi = (uint16_t)(u[i] >> 16);
            v[2 * i] = KV == LOOM_K_F16 ? loom_h2f(lo) : loom_bf2f(lo);
            v[2 * i + 1] = KV == LOOM_K_F16 ? loom_h2f(hi) : loom_bf2f(hi);
        }
    } else {
#pragma unroll
        for (int i = 0; i < 16; i++) {
            const uint8_t b = (uint8_t)(u[i >> 2] >> (8 * (i & 3)));
            v[i] = KV == LOOM_K_FP8_E4M3 ? loom__fp8_e4m3_to_f32(b) : loom__fp8_e5m2_to_f32(b);
        }
    }
}

template <int KV, int HD>
static __global__ void __launch_bounds__(ATTN_WARPS * 32) attn_vec_kernel(attn_args a) {
    constexpr int EPL = vec_epl<KV>(), LPP = vec_lpp<KV, HD>(), VPL = vec_vpl<KV, HD>();
    constexpr int EL = EPL * VPL, PPW = 32 / LPP, MAXG = vec_maxg<KV, HD>();
    const loom__k_kv &kv = a.kv;
    const int split = blockIdx.x, kvh = blockIdx.y, rr = blockIdx.z, r = attn_row(a, rr);
    int lo, pos, ns, chunk;
    row_range(kv, r, &lo, &pos, &ns, &chunk);
    if (split >= ns) return;
    const int a0 = lo + split * chunk;
    const int a1 = a0 + chunk < pos + 1 ? a0 + chunk : pos + 1;
    const int G = a.p.n_head / kv.n_kv_heads;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int grp = lane / LPP, sub = lane % LPP;

    LOOM_K_DYN_SMEM(attn_sm);
    float *q_s, *comb, *ml;
    stage_q<EPL / 4>(a, r, kvh, G, HD, (float *)attn_sm, &q_s, &comb, &ml);

    /* this lane's elements of a row: vector v covers [(v LPP + sub) EPL, + EPL) */
    float m[MAXG], l[MAXG], acc[MAXG][EL];
#pragma unroll
    for (int g = 0; g < MAXG; g++) {
        m[g] = -INFINITY;
        l[g] = 0.0f;
#pragma unroll
        for (int i = 0; i < EL; i++) acc[g][i] = 0.0f;
    }
    const int32_t *table = kv.block_ids + kv.indptr[kv.row_seq[r]];
    const size_t elt = kv_elt_bytes<KV>();
    const bool fp8 = KV == LOOM_K_FP8_E4M3 || KV == LOOM_K_FP8_E5M2;
    /* warp w takes positions a0 + (k ATTN_WARPS + w) PPW + grp, k = 0, 1, ... */
    for (int t0 = a0 + warp * PPW; t0 < a1; t0 += ATTN_WARPS * PPW) {
        const int t = t0 + grp;
        const bool valid = t < a1;
        float kf[EL], vf[EL];
        float ks = 1.0f, vs = 1.0f;
        if (valid) {
            const int blk = table[t / kv.block_size], slot = t % kv.block_size;
            const size_t at = (size_t)blk * kv.block_stride + (size_t)slot * kv.token_stride +
                              (size_t)kvh * HD * elt;
            const char *kp = (const char *)a.p.k_pool + at, *vp = (const char *)a.p.v_pool + at;
#pragma unroll
            for (int v = 0; v < VPL; v++) {
                vec_load<KV>(kp + (size_t)((v * LPP + sub) * EPL) * elt, kf + v * EPL);
                vec_load<KV>(vp + (size_t)((v * LPP + sub) * EPL) * elt, vf + v * EPL);
            }
            if (fp8) fp8_scales(a, blk, slot, kvh, &ks, &vs);
        } else {
#pragma unroll
            for (int i = 0; i < EL; i++) kf[i] = vf[i] = 0.0f;
        }
#pragma unroll
        for (int i = 0; i < EL; i++) {
            kf[i] *= ks;
            vf[i] *= vs;
        }
#pragma unroll
        for (int g = 0; g < MAXG; g++) {
            if (g < G) {
                float d = 0.0f;
#pragma unroll
                for (int v = 0; v < VPL; v++)
#pragma unroll
                    for (int i = 0; i < EPL; i += 4) { /* an ld.shared.v4 a chunk (q_at) */
                        const float4 q4 =
                            *(const float4 *)(q_s + g * HD +
                                              q_at<EPL / 4>((v * LPP + sub) * EPL + i));
                        d = fmaf(q4.x, kf[v * EPL + i], d);
                        d = fmaf(q4.y, kf[v * EPL + i + 1], d);
                        d = fmaf(q4.z, kf[v * EPL + i + 2], d);
                        d = fmaf(q4.w, kf[v * EPL + i + 3], d);
                    }
                    /* the group's lanes: a fixed tree within the LPP-lane group */
#pragma unroll
                for (int o = LPP / 2; o > 0; o >>= 1) d += __shfl_xor_sync(0xffffffffu, d, o);
                if (valid) {
                    float sc = d * a.p.scale;
                    if (a.p.softcap > 0.0f) sc = a.p.softcap * tanhf(sc / a.p.softcap);
                    const float mn = fmaxf(m[g], sc);
                    const float co = expf(m[g] - mn), cn = expf(sc - mn);
                    l[g] = fmaf(l[g], co, cn);
#pragma unroll
                    for (int i = 0; i < EL; i++) acc[g][i] = fmaf(acc[g][i], co, cn * vf[i]);
                    m[g] = mn;
                }
            }
        }
    }
    /* the lane groups' states into one per warp: a fixed xor tree over the groups (a group that
     * saw no position has m = -inf and weighs 0) */
#pragma unroll
    for (int o = LPP; o < 32; o <<= 1) {
#pragma unroll
        for (int g = 0; g < MAXG; g++) {
            const float m2 = __shfl_xor_sync(0xffffffffu, m[g], o);
            const float l2 = __shfl_xor_sync(0xffffffffu, l[g], o);
            const float M = fmaxf(m[g], m2);
            const float f1 = M == -INFINITY ? 0.0f : expf(m[g] - M);
            const float f2 = M == -INFINITY ? 0.0f : expf(m2 - M);
            l[g] = l[g] * f1 + l2 * f2;
#pragma unroll
            for (int i = 0; i < EL; i++) {
                const float a2 = __shfl_xor_sync(0xffffffffu, acc[g][i], o);
                acc[g][i] = acc[g][i] * f1 + a2 * f2;
            }
            m[g] = M;
        }
    }
#pragma unroll
    for (int g = 0; g < MAXG; g++) {
        if (g < G && grp == 0) {
#pragma unroll
            for (int v = 0; v < VPL; v++)
#pragma unroll
                for (int i = 0; i < EPL; i += 4) /* q_at's place: the stores cover the banks */
                    *(float4 *)(comb + (warp * G + g) * HD +
                                q_at<EPL / 4>((v * LPP + sub) * EPL + i)) =
                        make_float4(acc[g][v * EPL + i], acc[g][v * EPL + i + 1],
                                    acc[g][v * EPL + i + 2], acc[g][v * EPL + i + 3]);
            if (lane == 0) {
                ml[(warp * G + g) * 2] = m[g];
                ml[(warp * G + g) * 2 + 1] = l[g];
            }
        }
    }
    __syncthreads();
    combine_warps<EPL / 4>(a, rr, kvh, split, G, HD, comb, ml);
}

/* The head size the vector form runs a layer with (64, 128 or 256), or 0: the scalar form
 * (other head sizes, merged pairs, pages not 16-byte aligned, more query heads per KV head
 * than its accumulators hold). A rule on the layer alone, so a row's kernel does not depend on
 * its batch. */
template <int KV> static int attn_vec_hd(const loom__k_kv &kv, const loom__k_attn &p) {
    const int hd = kv.head_dim;
    if ((hd != 64 && hd != 128 && hd != 256) || p.merge.base != NULL) return 0;
    const int G = p.n_head / kv.n_kv_heads;
    const int maxg = hd == 64    ? vec_maxg<KV, 64>()
                     : hd == 128 ? vec_maxg<KV, 128>()
                                 : vec_maxg<KV, 256>();
    if (G > maxg) return 0;
    const uintptr_t align = (uintptr_t)p.k_pool | (uintptr_t)p.v_pool | (uintptr_t)kv.token_stride |
                            (uintptr_t)kv.block_stride;
    return align % 16 == 0 ? hd : 0;
}

/* One block per (row, query head): the row's splits in order. */
static __global__ void attn_merge_kernel(attn_args a) {
    const int rr = blockIdx.x, h = blockIdx.y, r = attn_row(a, rr);
    int lo, pos, ns, chunk;
    row_range(a.kv, r, &lo, &pos, &ns, &chunk);
    const int hd = a.kv.head_dim;
    float M = -INFINITY;
    for (int sp = 0; sp < ns; sp++) M = fmaxf(M, part_ml(a, rr, h, sp)[0]);
    float L = 0.0f;
    for (int sp = 0; sp < ns; sp++) {
        const float ms = part_ml(a, rr, h, sp)[0];
        if (ms != -INFINITY) L += part_ml(a, rr, h, sp)[1] * expf(ms - M);
    }
    float *o = (float *)((char *)a.p.out + (size_t)r * a.p.out_stride) + (size_t)h * hd;
    for (int e = threadIdx.x; e < hd; e += blockDim.x) {
        float A = 0.0f;
        for (int sp = 0; sp < ns; sp++) {
            const float ms = part_ml(a, rr, h, sp)[0];
            if (ms != -INFINITY) A += part_out(a, rr, h, sp)[e] * expf(ms - M);
        }
        o[e] = A / L;
    }
}

/* Head elements per lane, and the most query heads per KV head, for a head size. */
static int attn_hdc(int32_t head_dim) {
    return head_dim <= 64 ? 2 : head_dim <= 128 ? 4 : head_dim <= 256 ? 8 : 0;
}
static int attn_maxg(int hdc) {
    return hdc == 8 ? 8 : 16;
}

#if LOOM_K_HOST_CODE /* tests/kernels_emu/ launches the kernels itself */
extern "C" size_t loom__cuda_attention_work_bytes(int32_t n_head, int32_t head_dim) {
    return (size_t)LOOM_K_ATTN_ROWS * (size_t)n_head * LOOM_K_ATTN_MAX_SPLITS *
           ((size_t)head_dim + 2) * sizeof(float);
}

extern "C" int loom__cuda_attention_shape_ok(int32_t n_head, int32_t n_kv_heads, int32_t head_dim) {
    if (n_head < 1 || n_kv_heads < 1 || n_head % n_kv_heads != 0 || head_dim < 1) return 0;
    const int hdc = attn_hdc(head_dim);
    return hdc != 0 && n_head / n_kv_heads <= attn_maxg(hdc) && n_kv_heads <= 65535;
}

/* The rows split-KV takes: n of them, rows[i] (NULL: row i). */
typedef struct attn_rows {
    const int32_t *rows;
    int32_t n;
} attn_rows;

template <int KV, int HDC, int MAXG>
static loom_status attn_run(cudaStream_t stream, const loom__k_kv *kv, const loom__k_attn *p,
                            attn_rows rs) {
    const int G = p->n_head / kv->n_kv_heads;
    const size_t smem =
        ((size_t)G * kv->head_dim * (1 + ATTN_WARPS) + ATTN_WARPS * G * 2) * sizeof(float);
    const int vec_hd = attn_vec_hd<KV>(*kv, *p);
    for (int32_t row0 = 0; row0 < rs.n; row0 += LOOM_K_ATTN_ROWS) {
        const int rows = rs.n - row0 < LOOM_K_ATTN_ROWS ? rs.n - row0 : LOOM_K_ATTN_ROWS;
        attn_args a = {*kv, *p, rs.rows, row0};
        dim3 grid(LOOM_K_ATTN_MAX_SPLITS, (unsigned)kv->n_kv_heads, (unsigned)rows);
        if (vec_hd == 64)
            LOOM_K_LAUNCH((attn_vec_kernel<KV, 64>), (grid, ATTN_WARPS * 32, smem, stream), a);
        else if (vec_hd == 128)
            LOOM_K_LAUNCH((attn_vec_kernel<KV, 128>), (grid, ATTN_WARPS * 32, smem, stream), a);
        else if (vec_hd == 256)
            LOOM_K_LAUNCH((attn_vec_kernel<KV, 256>), (grid, ATTN_WARPS * 32, smem, stream), a);
        else
            LOOM_K_LAUNCH((attn_split_kernel<KV, HDC, MAXG>), (grid, ATTN_WARPS * 32, smem, stream),
                          a);
        LOOM_K_LAUNCHED("attention (splits)");
        LOOM_K_LAUNCH((attn_merge_kernel),
                      (dim3((unsigned)rows, (unsigned)p->n_head), 128, 0, stream), a);
        LOOM_K_LAUNCHED("attention (merge)");
    }
    return LOOM_OK;
}

template <int KV>
static loom_status attn_by_hd(cudaStream_t stream, const loom__k_kv *kv, const loom__k_attn *p,
                              attn_rows rs) {
    switch (attn_hdc(kv->head_dim)) {
    case 2:
        return attn_run<KV, 2, 16>(stream, kv, p, rs);
    case 4:
        return attn_run<KV, 4, 16>(stream, kv, p, rs);
    case 8:
        return attn_run<KV, 8, 8>(stream, kv, p, rs);
    default:
        LOOM_K_UNSUPPORTED("cuda: attention with head_dim %d (at most 256)", kv->head_dim);
    }
}

extern "C" loom_status loom__cuda_attention(cudaStream_t stream, const loom__k_kv *kv,
                                            const loom__k_attn *p) {
    if (kv->n_rows == 0) return LOOM_OK;
    if (!loom__cuda_attention_shape_ok(p->n_head, kv->n_kv_heads, kv->head_dim))
        LOOM_K_UNSUPPORTED("cuda: attention with %d query heads, %d kv heads of %d", p->n_head,
                           kv->n_kv_heads, kv->head_dim);
    /* The tiled kernel's rows (all of them in the invariant mode); the rest here (all rows
     * where it declined the layer). */
    int tiled = 0;
    const loom_status st = loom__cuda_attention_prefill(stream, kv, p, &tiled);
    if (st != LOOM_OK) return st;
    const attn_rows rs = !tiled         ? attn_rows{NULL, kv->n_rows}
                         : p->invariant ? attn_rows{NULL, 0}
                                        : attn_rows{kv->split_rows, kv->n_split_rows};
    if (rs.n == 0) return LOOM_OK;
    switch (kv->kv_type) {
    case LOOM_K_F32:
        return attn_by_hd<LOOM_K_F32>(stream, kv, p, rs);
    case LOOM_K_F16:
        return attn_by_hd<LOOM_K_F16>(stream, kv, p, rs);
    case LOOM_K_BF16:
        return attn_by_hd<LOOM_K_BF16>(stream, kv, p, rs);
    case LOOM_K_FP8_E4M3:
    case LOOM_K_FP8_E5M2:
        if (p->k_scale == NULL || p->v_scale == NULL)
            LOOM_K_UNSUPPORTED("cuda: attention over fp8 pages without scales");
        return kv->kv_type == LOOM_K_FP8_E4M3 ? attn_by_hd<LOOM_K_FP8_E4M3>(stream, kv, p, rs)
                                              : attn_by_hd<LOOM_K_FP8_E5M2>(stream, kv, p, rs);
    default:
        LOOM_K_UNSUPPORTED("cuda: attention over kv type %u", (unsigned)kv->kv_type);
    }
}
#endif
