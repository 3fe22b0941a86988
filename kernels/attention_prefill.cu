/* attention_prefill.cu — tiled attention over the paged KV cache on tensor cores (mma.sync
 * m16n8k8, TF32, sm_80+; m16n8k16 in BF16 math; wgmma on sm_90 with LOOM_CUDA_WGMMA=1, head
 * sizes 64 and 128: PF_WG_BF16 / PF_WG_F16 below). In the batch-invariant default it takes every
 * row of a step, decodes included, wherever it runs the layer; in the fast mode
 * (LOOM_CUDA_BATCH_INVARIANT=0) the sequences of a step with LOOM_K_ATTN_PREFILL_ROWS new rows or
 * more (step_begin lists them; attention.cu's dispatch sends the rows of the others to the split-KV
 * kernel).
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
 * (float32 maximum, sum and accumulator per vector) and adds P V to its accumulator. The wgmma
 * forms over pages of their own 16-bit type run warp-specialised (pf_direct,
 * attn_prefill_ws_kernel): a producer warpgroup copies the tiles as the pages hold them, by
 * cp.async into a ring of stages synchronised by mbarriers, for two consumer warpgroups of 64
 * vectors each, which run the same walk on their tiles; the values, and so the bits, are the
 * ones the register path gathers.
 *
 * Segments. The online softmax restarts at every multiple of PF_SEG = 256 positions; at a
 * segment's end its state (maximum, sum over the row's four lanes, accumulator) is folded into
 * the vector's running fold (pf_fold: registers and shared memory). A step whose blocks would
 * leave the device idle (decode steps, short chunks of long contexts) splits the positions
 * across blocks (grid.z) at segment boundaries instead: each block leaves its segments' states
 * in a scratch area and pf_fold_kernel folds them in the same order with the same arithmetic —
 * the same bits, so the split may follow the step's size.
 * Arithmetic (float32 accuracy, mma.cuh's TF32 splitting): Q is float32, split hi + lo where
 * each fragment is loaded. F16, BF16 and FP8 pages hold values that are exact TF32, so Q Kᵀ
 * takes two instructions per product (q_lo k + q_hi k) and P V two (p_lo v + p_hi v), P split
 * the same way; F32 pages split K and V as well (three instructions). FP8 pages are read as
 * their codes' values: the (position, KV head) scale of K multiplies that position's score
 * column after Q Kᵀ, the scale of V the probability that weighs the position (P V), while the
 * softmax sum takes the unscaled probability. Masked positions get a weight of exactly 0.
 * BF16 math (LOOM_K_MATH_BF16, pf_ops_of): Q, K, V and P in one 16-bit type instead, one
 * m16n8k16 per product tile — F16 for F16 pages (their values exact in it), BF16 for BF16, F32
 * and FP8 pages (FP8 codes exact in it, the scales applied outside the products as above, in
 * BF16's range: F16's would lose P times a small V scale to its subnormals, or overflow); Q is
 * rounded to the type, so a query element past F16's 65504 over F16 pages becomes infinite (the
 * default's float32 Q does not); P's A fragments are S's C fragments
 * packed in place. The softmax, masks, segments and folds are the same code, so the bits
 * argument below holds for either form (a device-wide setting, never a choice per step).
 *
 * Bits. The output of a vector depends only on its own row's positions and the tile grid of
 * positions (absolute multiples of PF_N): an mma output element reads one row of A and one
 * column of B; a tile none of whose positions a warp's vectors attend is skipped, and a vector
 * that attends none of a tile its warp runs adds nothing to its state (its correction is
 * exp(0) = 1 and its P V sum is not added), so the tiles a warp runs never change a vector's
 * bits. So within this kernel a
 * sequence's result does not depend on the batch, nor on which rows share its tile, nor on
 * the split: a row's bits are the same in a whole prompt, in any chunk of it, and decoded alone.
 * Its rows and split-KV's give different last bits; in the fast mode which kernel a row takes
 * follows how many rows its sequence has in the step, which the scheduler's cut decides, so
 * only the default keeps every row here (and every row of a layer this kernel does not run on
 * split-KV).
 *
 * Not here (attention.cu keeps them on the split-KV kernel): the layers of merged pairs, head
 * sizes that are not a multiple of 8, pages whose strides do not align to 4 elements, and a
 * device whose shared memory per block is too small for the tile. */
#include "cp_async.cuh"
#include "mbarrier.cuh"
#include "mma.cuh"
#include "wgmma.cuh"

#include <math.h>

#include "tensor/fp8.h"

#define PF_WARPS   4
#define PF_THREADS (PF_WARPS * 32)
#define PF_M       (PF_WARPS * 16) /* query vectors per block */
#define PF_N       32              /* positions per K/V tile */
#define PF_NT      (PF_N / 8)      /* n8 tiles of a warp's S */

/* Positions per segment: a vector's softmax state restarts at every multiple of PF_SEG and the
 * segments' states meet in a left fold (pf_fold), so that blocks may split a long context at
 * segment boundaries (decode steps) with the bits of one block walking it whole. */
#define PF_SEG 256
/* The most scratch a split takes; a split that would need more does not happen. */
#define PF_WORK_MAX ((size_t)64 << 20)

typedef struct pf_args {
    loom__k_kv kv;
    loom__k_attn p;
    int32_t group;         /* query heads per KV head */
    int32_t rows_per_tile; /* PF_M / group */
    int32_t all;           /* 1: every sequence of the step (the invariant default); 0: the
                              prefill sequences (kv.prefill_seqs) */
    /* NULL: each block walks all its rows' positions and writes out. Else: block z walks the
     * segments [z segs_per_block, (z + 1) segs_per_block) and leaves each vector's state of
     * segment j at part + ((row n_head + head) seg_stride + j) (head_dim + 2): the
     * accumulator, then the maximum and the sum; pf_fold_kernel folds them into out. */
    float *part;
    int32_t segs_per_block, seg_stride;
    int32_t direct; /* the wgmma forms warp-specialised (pf_direct, attn_prefill_ws_kernel) */
} pf_args;

/* Shared memory: the tile's page offsets and FP8 scales (two buffers: the next tile's are
 * looked up while this one loads), Q [PF_M][ld], K and V [PF_N][ld] as float32, where
 * ld = head_dim + 4 makes every fragment load below free of bank conflicts (a row of the
 * fragment's eight falls 4 or 12 banks past the one before, its four columns in between);
 * then, for head sizes over PF_FOLD_REGS_HD, the folded accumulators [PF_M][head_dim + 8]
 * (each lane its own elements, two at a time: rows 8 banks apart) — smaller heads keep them in
 * registers, which keeps head size 128 within the 99 KB of sm_86/89 (but for PF_BF16_QR and
 * PF_F16_QR, whose registers hold Q instead). */
#define PF_HEAD_BYTES   (2 * PF_N * (sizeof(long long) + 2 * sizeof(float)))
#define PF_FOLD_REGS_HD 128

/* The products' operands (the kernel's OPS): Q and P split into TF32 hi + lo against exact
 * K and V (F16, BF16, FP8 pages), all four split (F32 pages), or everything in one 16-bit type
 * (LOOM_K_MATH_BF16: F16 for F16 pages, whose values it holds exactly; BF16 for the others).
 * The 16-bit forms keep Q, K and V in shared memory as 16-bit values, two to a
 * word as the mma's registers hold them: Q and K by row, head elements 2e and 2e + 1 in word e,
 * pf_qk_words(head_dim) words a row (4 past a multiple of 8: the fragment reads, lane (g, i)
 * word i of row g, hit 32 banks; the words past head_dim are zeros, read by the last 16-wide
 * step where head_dim is 8 past a multiple of 16); V by pairs of positions, positions 2p and
 * 2p + 1 of head element d in word d of row p, pf_v_words(head_dim) words a row (8 past a
 * multiple of 32: lane (g, i) reads word g of row i, 32 banks), so that each B register of P V
 * is one word, as K's are. */
#define PF_TF32    0
#define PF_TF32_KV 1
#define PF_BF16    2
#define PF_F16     3
/* The 16-bit forms on Hopper's warpgroup MMA (LOOM_K_MATH_BF16_WGMMA, head sizes 64 and 128):
 * the four warps are one warpgroup; S = Q Kᵀ is m64n32k16's with Q from registers (loaded once
 * from its tile) and K in shared memory, P V m64n{head size}k16's with P from the registers S
 * left (the A fragment mma.sync's form packs) and V in shared memory. Q and K are stored in
 * wgmma.cuh's K-major layout (rows: vectors or positions, K: head elements), V by position in its
 * N-major layout (K: positions, N: head elements; imm-trans-b), so that K and V tiles are copies of
 * the pages' rows (pf_direct); the fold lives in shared memory (the registers hold S, O and each
 * tile's P V). Every warp runs every tile its block walks (a warpgroup instruction): a warp whose
 * vectors attend none of a tile changes nothing, as for the skipped tiles of the forms above. */
#define PF_WG_BF16 4
#define PF_WG_F16  5
/* PF_BF16 and PF_F16 for head sizes 72 .. 128 with Q's A fragments held in registers for the
 * whole walk (as the wgmma forms and, at head sizes up to 64, the 16-bit forms themselves hold
 * them), which leaves no registers for the fold: it goes to shared memory (34 KB). Where a block
 * may have more than 100 KB of shared memory (sm_80, sm_90) that costs no block per SM; on
 * sm_86/89 (99 KB) it would, so they keep PF_BF16 / PF_F16 (pf_ops_of). The same bits. */
#define PF_BF16_QR     6
#define PF_F16_QR      7
#define PF_QR_MIN_SMEM (100 << 10)
/* The warp-specialised forms (attn_prefill_ws_kernel): a producer and two consumer warpgroups,
 * a ring of K/V stages, the registers a thread of each after setmaxnreg, the barriers' bytes. */
#define PF_WS_THREADS       (3 * PF_THREADS)
#define PF_WS_STAGES        4
#define PF_WS_PRODUCER_REGS 40
#define PF_WS_CONSUMER_REGS 232
#define PF_WS_BAR_BYTES     128

static __host__ __device__ int pf_ops_of(uint32_t kv_type, int32_t math, int32_t head_dim,
                                         int32_t smem_optin) {
    if (math == LOOM_K_MATH_BF16_WGMMA && (head_dim == 64 || head_dim == 128))
        return kv_type == LOOM_K_F16 ? PF_WG_F16 : PF_WG_BF16;
    if (math == LOOM_K_MATH_BF16 || math == LOOM_K_MATH_BF16_WGMMA) {
        if (head_dim > 64 && head_dim <= 128 && smem_optin > PF_QR_MIN_SMEM)
            return kv_type == LOOM_K_F16 ? PF_F16_QR : PF_BF16_QR;
        return kv_type == LOOM_K_F16 ? PF_F16 : PF_BF16;
    }
    return kv_type == LOOM_K_F32 ? PF_TF32_KV : PF_TF32;
}
static __host__ __device__ bool pf_wg(int ops) {
    return ops == PF_WG_BF16 || ops == PF_WG_F16;
}

/* The warp-specialised forms' shared memory (attn_prefill_ws_kernel): the barriers, two Q tiles,
 * the stages' K and V, two folds. */
static __host__ __device__ size_t pf_ws_smem_bytes(int32_t head_dim) {
    const size_t hd = (size_t)head_dim;
    return PF_WS_BAR_BYTES + 2 * PF_M * hd * 2 + (size_t)PF_WS_STAGES * 2 * PF_N * hd * 2 +
           2 * PF_M * (hd + 8) * sizeof(float);
}

/* Whether the wgmma forms run warp-specialised (attn_prefill_ws_kernel), the K and V tiles
 * copied by cp.async as the pages hold them: pages of the products' own 16-bit type (F16 pages
 * in PF_WG_F16, BF16 pages in PF_WG_BF16: the values need no rounding), every position's row of
 * a head 16-byte aligned in both pools, the device's shared memory a block enough, and a
 * sequence in the step with more rows than one tile (else the second consumer would have
 * nothing: decode steps and short chunks keep attn_prefill_kernel's more blocks per SM). K
 * lands in the K-major layout of pf_load_tile16, V by position in wgmma.cuh's N-major layout (P
 * V's B with imm-trans-b), so no value passes through registers. Other pages (F32, FP8), and
 * every page with tile_regs (LOOM_CUDA_ATTN_ASYNC=0), go through attn_prefill_kernel's
 * registers, one tile at a time. The two kernels give the same bits (attn_prefill_ws_kernel), so
 * the choice may follow the step's shape. */
static __host__ __device__ int pf_direct(const loom__k_kv *kv, const loom__k_attn *p, int ops) {
    const uint32_t own = ops == PF_WG_F16 ? LOOM_K_F16 : LOOM_K_BF16;
    if (!pf_wg(ops) || kv->kv_type != own || p->tile_regs) return 0;
    if (pf_ws_smem_bytes(kv->head_dim) > (size_t)p->smem_optin) return 0;
    if (p->n_head < 1 || kv->n_kv_heads < 1) return 0;
    const int32_t rows = p->invariant ? kv->max_rows : kv->prefill_max_rows;
    if (rows <= PF_M / (p->n_head / kv->n_kv_heads)) return 0;
    const uintptr_t bits = (uintptr_t)p->k_pool | (uintptr_t)p->v_pool |
                           (uintptr_t)kv->token_stride | (uintptr_t)kv->block_stride |
                           (uintptr_t)kv->head_dim * 2;
    return (bits & 15) == 0;
}

/* The launch's blocks along x: a block takes one PF_M-vector tile of a sequence's rows, or two
 * (warp-specialised); the blocks of the sequences' last tiles first. */
static __host__ __device__ int64_t pf_grid_x(const loom__k_kv *kv, int all, int32_t rows_per_tile,
                                             int direct) {
    const int64_t seqs = all ? kv->n_seqs : kv->n_prefill_seqs;
    const int64_t rows = all ? kv->max_rows : kv->prefill_max_rows;
    const int64_t per_block = (int64_t)rows_per_tile * (direct ? 2 : 1);
    return seqs * ((rows + per_block - 1) / per_block);
}

/* Byte offset of 16-bit element (r, k) of a tile in wgmma.cuh's K-major layout with LBO 128:
 * rows' groups of 8 sbo bytes apart. */
static __device__ __forceinline__ int pf_wg_at(int r, int k, int sbo) {
    return (r >> 3) * sbo + (r & 7) * 16 + (k >> 3) * 128 + (k & 7) * 2;
}

static __host__ __device__ int pf_qk_words(int32_t head_dim) {
    return head_dim / 2 + (head_dim % 16 != 0 ? 8 : 4);
}
static __host__ __device__ int pf_v_words(int32_t head_dim) {
    return head_dim + (8 - head_dim % 32 + 32) % 32;
}

/* The shared memory of a block of the form (ops; direct: warp-specialised). */
static __host__ __device__ size_t pf_smem_bytes(int32_t head_dim, int ops, int direct) {
    if (direct) return pf_ws_smem_bytes(head_dim);
    const size_t fold =
        head_dim > PF_FOLD_REGS_HD || pf_wg(ops) || ops == PF_BF16_QR || ops == PF_F16_QR
            ? (size_t)PF_M * (size_t)(head_dim + 8) * sizeof(float)
            : 0;
    if (pf_wg(ops)) /* Q [PF_M][hd], K and V [PF_N][hd], 16-bit */
        return PF_HEAD_BYTES + (size_t)(PF_M + 2 * PF_N) * (size_t)head_dim * 2 + fold;
    if (ops >= PF_BF16)
        return PF_HEAD_BYTES +
               ((size_t)(PF_M + PF_N) * (size_t)pf_qk_words(head_dim) +
                (size_t)(PF_N / 2) * (size_t)pf_v_words(head_dim)) *
                   sizeof(uint32_t) +
               fold;
    return PF_HEAD_BYTES + (size_t)(PF_M + 2 * PF_N) * (size_t)(head_dim + 4) * sizeof(float) +
           fold;
}

/* The left fold of a vector's segment states, the same arithmetic in the kernel (registers and
 * shared memory) and in pf_fold_kernel (a split context): (M, L) is the fold so far, (m, l) the
 * next segment's maximum and sum; returns 0 (an empty segment: nothing changes), 1 (the first
 * non-empty one: the fold takes it as it is) or 2 (the fold becomes L a + l b, O a + o b, with
 * the coefficients set here). Every product and sum rounded on its own (no contraction), so that
 * two compilations give the same bits. */
static __device__ __forceinline__ int pf_fold(float *M, float *L, float m, float l, float *ca,
                                              float *cb) {
    if (m == -INFINITY) return 0;
    if (*M == -INFINITY) {
        *M = m;
        *L = l;
        return 1;
    }
    const float mn = fmaxf(*M, m);
    *ca = expf(*M - mn);
    *cb = expf(m - mn);
    *L = __fadd_rn(__fmul_rn(*L, *ca), __fmul_rn(l, *cb));
    *M = mn;
    return 2;
}
static __device__ __forceinline__ float pf_fold_value(int how, float O, float o, float ca,
                                                      float cb) {
    return how == 0 ? O : how == 1 ? o : __fadd_rn(__fmul_rn(O, ca), __fmul_rn(o, cb));
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

/* Eight elements at p as float32 (lo: the first four): 16-bit pages where p is 16-byte aligned
 * (al16) in one 16-byte load, so that a warp's lanes reading a row's 64 contiguous bytes touch
 * its two sectors once (as two 8-byte loads, each would touch both for half of them); else as
 * pf_load4 reads them, twice. The same values either way. */
static __device__ __forceinline__ void pf_load8(uint32_t type, const char *p, bool al16, float4 *lo,
                                                float4 *hi) {
    if (al16 && (type == LOOM_K_F16 || type == LOOM_K_BF16)) {
        const uint4 u = *(const uint4 *)p;
        const uint32_t w[4] = {u.x, u.y, u.z, u.w};
        float v[8];
#pragma unroll
        for (int i = 0; i < 8; i++) {
            const uint16_t h = (uint16_t)(w[i / 2] >> (16 * (i % 2)));
            v[i] = type == LOOM_K_F16 ? loom_h2f(h) : loom_bf2f(h);
        }
        *lo = make_float4(v[0], v[1], v[2], v[3]);
        *hi = make_float4(v[4], v[5], v[6], v[7]);
        return;
    }
    *lo = pf_load4(type, p);
    *hi = pf_load4(type, p + 4 * pf_elt_bytes(type));
}

static __device__ __forceinline__ bool pf_fp8(uint32_t type) {
    return type == LOOM_K_FP8_E4M3 || type == LOOM_K_FP8_E5M2;
}

/* Threads 0 .. PF_N-1: the page offset (-1: outside [lo, hi], not read) and the FP8 scales of
 * positions j0 .. j0+PF_N-1 of KV head kvh. */
/* A block's tile of one sequence's new rows (the WG kernel's block, or one consumer of a
 * warp-specialised block): its rows and the positions it walks — its rows' [first attended,
 * last], from the tile of PF_N holding the first, within the block's group of segments
 * (blockIdx.z) where the step splits. Not active: no such tile, or no position in the group. */
typedef struct pf_tile {
    int row0, rows, pos0, pos_last, lo_first, j_begin, j_end;
    bool active;
} pf_tile;

static __device__ __forceinline__ pf_tile pf_tile_of(const pf_args &a, int s, int tile) {
    const loom__k_kv &kv = a.kv;
    pf_tile t = {0, 0, 0, 0, 0, 0, -1, false};
    if (tile < 0) return t;
    const int q0 = kv.q_start[s], n_new = kv.q_start[s + 1] - q0, BR = a.rows_per_tile;
    t.row0 = q0 + tile * BR;
    t.rows = n_new - tile * BR < BR ? n_new - tile * BR : BR;
    t.pos0 = kv.pos_start[s] + tile * BR;
    t.pos_last = t.pos0 + t.rows - 1;
    t.lo_first = pf_lo(kv, t.pos0);
    t.j_begin = t.lo_first / PF_N * PF_N;
    t.j_end = t.pos_last;
    if (a.part != NULL) {
        const long long g0 = (long long)blockIdx.z * a.segs_per_block * PF_SEG;
        const long long g1 = g0 + (long long)a.segs_per_block * PF_SEG - 1;
        if (g0 > t.j_begin) t.j_begin = (int)g0;
        if (g1 < t.j_end) t.j_end = (int)g1;
    }
    t.active = t.j_begin <= t.j_end;
    return t;
}

/* The byte offset of position j's row of KV head kvh in the pools (through the sequence's block
 * table), or -1 outside [lo, hi] (a position no row of the block attends: zeros). */
static __device__ __forceinline__ long long pf_row_at(const loom__k_kv &kv, const int32_t *table,
                                                      int kvh, int j, int lo, int hi) {
    if (j < lo || j > hi) return -1;
    const int blk = table[j / kv.block_size], slot = j % kv.block_size;
    return (long long)((size_t)blk * kv.block_stride + (size_t)slot * kv.token_stride +
                       (size_t)kvh * kv.head_dim * pf_elt_bytes(kv.kv_type));
}

static __device__ __forceinline__ void pf_lookup(const pf_args &a, const int32_t *table, int kvh,
                                                 int j0, int lo, int hi, long long *row_at,
                                                 float *ksc, float *vsc) {
    const loom__k_kv &kv = a.kv;
    const int t = threadIdx.x;
    if (t >= PF_N) return;
    const int j = j0 + t;
    const long long at = pf_row_at(kv, table, kvh, j, lo, hi);
    float k_s = 0.0f, v_s = 0.0f;
    if (at >= 0) {
        if (pf_fp8(kv.kv_type)) {
            const int blk = table[j / kv.block_size], slot = j % kv.block_size;
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

/* Byte offset of 16-bit element d of position jl in the wgmma forms' V tile: wgmma.cuh's N-major
 * layout (N: head elements, K: the tile's positions; P V's B with imm-trans-b) with LBO 128 and
 * SBO PF_N * 16: a core matrix holds 8 positions' 16 bytes of 8 head elements, as a K tile's holds
 * 8 positions' 16 bytes (pf_wg_at). */
static __device__ __forceinline__ int pf_wgv_at(int jl, int d) {
    return (d >> 3) * (PF_N * 16) + (jl >> 3) * 128 + (jl & 7) * 16 + (d & 7) * 2;
}

/* The same into the 16-bit tiles, each value rounded to OP16 (exact but for F32 pages; FP8
 * codes unscaled, as pf_load_tile leaves them); positions not read are zeros.
 *
 * The mma.sync forms' layouts (above): K a position and 4 elements at a time (8 bytes), by row,
 * ldw words a row; V two positions and 4 elements, by pairs of positions, the 4 elements' words
 * side by side (16 bytes).
 *
 * The wgmma forms' (WG): K and V [PF_N][hd] by position, K in wgmma.cuh's K-major layout
 * (pf_wg_at), V in its N-major one (pf_wgv_at); in both the bank of element (jl, d) is
 * 4 (jl & 7) + (d & 7) / 2, so a store fills the 32 banks only if its lanes cover the 8 positions
 * of a core matrix. So each goes 8 elements (16 bytes, one core-matrix row) a lane, positions
 * fastest: a quarter warp fills a core matrix (a row by position read in 64-byte runs, 4 lanes).
 * (The direct forms copy the same pieces to the same places: pf_copy_tile.) */
template <int OP16, bool WG>
static __device__ __forceinline__ void pf_load_tile16(const pf_args &a, const long long *row_at,
                                                      uint8_t *ks, uint8_t *vs) {
    const int hd = a.kv.head_dim, per = hd / 4, ldw = pf_qk_words(hd), ldv = pf_v_words(hd);
    const uint32_t type = a.kv.kv_type;
    const size_t elt = pf_elt_bytes(type);
    const char *kp = (const char *)a.p.k_pool, *vp = (const char *)a.p.v_pool;
    const float4 zero = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if constexpr (WG) {
        const int chunks = hd / 8; /* 16-byte core-matrix rows a position */
        /* every row's 8-element pieces 16-byte aligned (pf_load8) */
        const bool al16 = (((uintptr_t)kp | (uintptr_t)vp | (uintptr_t)a.kv.token_stride |
                            (uintptr_t)a.kv.block_stride | (uintptr_t)(hd * elt)) &
                           15) == 0;
        for (int it = threadIdx.x; it < PF_N * chunks; it += PF_THREADS) {
            const int rest = it >> 3, jl = rest / chunks * 8 + (it & 7), c = rest % chunks * 8;
            const long long at = row_at[jl];
            float4 k0 = zero, k1 = zero, v0 = zero, v1 = zero;
            if (at >= 0) {
                pf_load8(type, kp + at + (size_t)c * elt, al16, &k0, &k1);
                pf_load8(type, vp + at + (size_t)c * elt, al16, &v0, &v1);
            }
            *(uint4 *)(ks + pf_wg_at(jl, c, hd * 16)) =
                make_uint4(loom_mma16_pack<OP16>(k0.x, k0.y), loom_mma16_pack<OP16>(k0.z, k0.w),
                           loom_mma16_pack<OP16>(k1.x, k1.y), loom_mma16_pack<OP16>(k1.z, k1.w));
            *(uint4 *)(vs + pf_wgv_at(jl, c)) =
                make_uint4(loom_mma16_pack<OP16>(v0.x, v0.y), loom_mma16_pack<OP16>(v0.z, v0.w),
                           loom_mma16_pack<OP16>(v1.x, v1.y), loom_mma16_pack<OP16>(v1.z, v1.w));
        }
    } else {
        for (int it = threadIdx.x; it < PF_N * per; it += PF_THREADS) {
            const int jl = it / per, c = (it - jl * per) * 4;
            const long long at = row_at[jl];
            float4 k4 = zero;
            if (at >= 0) k4 = pf_load4(type, kp + at + (size_t)c * elt);
            *(uint2 *)(ks + 4 * (jl * ldw + c / 2)) =
                make_uint2(loom_mma16_pack<OP16>(k4.x, k4.y), loom_mma16_pack<OP16>(k4.z, k4.w));
        }
        for (int it = threadIdx.x; it < PF_N / 2 * per; it += PF_THREADS) {
            const int jp = it / per, c = (it - jp * per) * 4;
            float4 v[2];
#pragma unroll
            for (int e = 0; e < 2; e++) {
                const long long at = row_at[2 * jp + e];
                v[e] = zero;
                if (at >= 0) v[e] = pf_load4(type, vp + at + (size_t)c * elt);
            }
            *(uint4 *)(vs + 4 * (jp * ldv + c)) = make_uint4(
                loom_mma16_pack<OP16>(v[0].x, v[1].x), loom_mma16_pack<OP16>(v[0].y, v[1].y),
                loom_mma16_pack<OP16>(v[0].z, v[1].z), loom_mma16_pack<OP16>(v[0].w, v[1].w));
        }
    }
}

/* The warp-specialised forms' tile copy (pf_direct; head size HD, the tiles' layout's): K and V
 * of positions j0 .. j0 + PF_N - 1 into ks (the K-major layout of pf_load_tile16) and vs
 * (pf_wgv_at), 16 bytes a producer thread (t: 0 .. PF_THREADS - 1) by cp.async, each piece's row
 * looked up by the thread itself (pf_row_at), positions outside [lo, hi] zero-filled. A quarter
 * warp copies one core matrix of each (8 positions' same 16 bytes: 128 contiguous bytes of
 * shared memory), a warp 64 contiguous bytes of 8 positions' rows. */
template <int HD>
static __device__ __forceinline__ void pf_copy_tile(const pf_args &a, const int32_t *table, int kvh,
                                                    int j0, int lo, int hi, int t, uint8_t *ks,
                                                    uint8_t *vs) {
    constexpr int chunks = HD / 8; /* 16-byte pieces of a position's row */
    const char *kp = (const char *)a.p.k_pool, *vp = (const char *)a.p.v_pool;
#pragma unroll
    for (int it = t; it < PF_N * chunks; it += PF_THREADS) {
        const int rest = it >> 3, jl = rest / chunks * 8 + (it & 7), c = rest % chunks;
        const long long at = pf_row_at(a.kv, table, kvh, j0 + jl, lo, hi);
        const size_t off = at >= 0 ? (size_t)at + (size_t)c * 16 : 0; /* 0: a valid address */
        const int n = at >= 0 ? 16 : 0;
        loom_cp_async16(ks + pf_wg_at(jl, 8 * c, HD * 16), kp + off, n);
        loom_cp_async16(vs + pf_wgv_at(jl, 8 * c), vp + off, n);
    }
}

/* One tile's scores to weights for this lane's two vectors (S's C fragments sc, positions j0 ..
 * j0 + PF_N - 1), every form's same arithmetic: the scores as the CPU forms them (times K's FP8
 * scale, times scale, soft-capped), masked to -inf (vin, vlo, vpos: the vectors' range), each
 * vector's maximum over the tile (its row's four lanes), the running maximum and sum updated and
 * the accumulator o corrected; sc left holding the weights (times V's FP8 scale: P V's, while the
 * sum takes them as they are). any[h]: whether vector h attends any position of the tile — O
 * += P V below adds the tile's sum (each head element's sum over the tile from zero) only where
 * it does, so a vector that attends none keeps O as it was, bit for bit, whatever the other
 * vectors of its warp attend (whether the warp runs this tile depends on them, that is on how
 * the step cut the rows), rather than trusting the tensor core to leave O unchanged when adding
 * products of 0. */
static __device__ __forceinline__ void
pf_softmax_weights(float (&sc)[PF_NT][4], int j0, int lane, const bool vin[2], const int vlo[2],
                   const int vpos[2], float scale, float cap, bool fp8, const float *kscb,
                   const float *vscb, float m_run[2], float l_run[2], float corr[2], bool any[2]) {
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
#pragma unroll
    for (int h = 0; h < 2; h++) {
        mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 1));
        mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 2));
        const float mn = fmaxf(m_run[h], mx[h]);
        /* nothing attended yet: stays -inf, weights 0, correction 1 */
        corr[h] = mn == -INFINITY ? 1.0f : expf(m_run[h] - mn);
        m_run[h] = mn;
    }
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
    any[0] = mx[0] != -INFINITY;
    any[1] = mx[1] != -INFINITY;
}

/* The accumulator's correction for this lane's two vectors (pf_softmax_weights' corr). */
template <int HDMAX>
static __device__ __forceinline__ void pf_correct(float (&o)[HDMAX / 8][4], const float corr[2]) {
#pragma unroll
    for (int dn = 0; dn < HDMAX / 8; dn++)
#pragma unroll
        for (int r = 0; r < 4; r++) o[dn][r] *= corr[r >> 1];
}

/* pf_softmax_weights, then the accumulator corrected: a tile's whole softmax step. */
template <int HDMAX>
static __device__ __forceinline__ void
pf_softmax_tile(float (&sc)[PF_NT][4], int j0, int lane, const bool vin[2], const int vlo[2],
                const int vpos[2], float scale, float cap, bool fp8, const float *kscb,
                const float *vscb, float m_run[2], float l_run[2], float (&o)[HDMAX / 8][4],
                bool any[2]) {
    float corr[2];
    pf_softmax_weights(sc, j0, lane, vin, vlo, vpos, scale, cap, fp8, kscb, vscb, m_run, l_run,
                       corr, any);
    pf_correct<HDMAX>(o, corr);
}

/* P's A fragments for the 16-bit forms: two n8 tiles of S's C fragments (the weights) side by
 * side, packed, the positions in their own order (pf_pv_pos). */
template <int OP16>
static __device__ __forceinline__ void pf_pack_p(const float (&sc)[PF_NT][4],
                                                 uint32_t (&pa)[PF_N / 16][4]) {
#pragma unroll
    for (int u = 0; u < PF_N / 16; u++) {
        pa[u][0] = loom_mma16_pack<OP16>(sc[2 * u][0], sc[2 * u][1]);
        pa[u][1] = loom_mma16_pack<OP16>(sc[2 * u][2], sc[2 * u][3]);
        pa[u][2] = loom_mma16_pack<OP16>(sc[2 * u + 1][0], sc[2 * u + 1][1]);
        pa[u][3] = loom_mma16_pack<OP16>(sc[2 * u + 1][2], sc[2 * u + 1][3]);
    }
}

/* The wgmma forms' S = Q Kᵀ for the warpgroup's 64 vectors against the tile's 32 positions:
 * k16 steps over the head (head size HD), Q's A fragments from registers (qf), K from its tile
 * in the K-major layout (pf_wg_at), scale-d 0 first (S from zero). */
template <int HD, int OP16>
static __device__ __forceinline__ void
pf_wg_scores_issue(float (&sc)[PF_NT][4], const uint32_t (&qf)[HD / 16][4], const uint8_t *k_tile) {
    loom_wg_fence_acc<PF_N / 2>(&sc[0][0]);
    loom_wg_fence();
#pragma unroll
    for (int d0 = 0; d0 < HD; d0 += 16)
        loom_wg_rs<OP16, PF_N>(&sc[0][0], qf[d0 / 16],
                               loom_wg_desc(k_tile + d0 / 8 * 128, 128, HD * 16), d0 == 0 ? 0 : 1);
    loom_wg_commit();
}
template <int HD, int OP16>
static __device__ __forceinline__ void
pf_wg_scores(float (&sc)[PF_NT][4], const uint32_t (&qf)[HD / 16][4], const uint8_t *k_tile) {
    pf_wg_scores_issue<HD, OP16>(sc, qf, k_tile);
    loom_wg_wait<0>();
    loom_wg_fence_acc<PF_N / 2>(&sc[0][0]);
}

/* The wgmma forms' O += P V: P's A fragments pa (packed from S's C fragments, the positions in
 * their own order), V from its tile by position (N-major, pf_wgv_at), the tile's sum from zero
 * added where the vector attends any of the tile (pf_softmax_tile). */
template <int HD, int OP16>
static __device__ __forceinline__ void
pf_wg_pv_issue(float (&t)[HD / 8][4], uint32_t (&pa)[PF_N / 16][4], const uint8_t *v_tile) {
    loom_wg_fence_regs<PF_N / 4>(&pa[0][0]);
    loom_wg_fence();
#pragma unroll
    for (int u = 0; u < PF_N / 16; u++)
        loom_wg_rs<OP16, HD, true>(
            &t[0][0], pa[u], loom_wg_desc(v_tile + 2 * u * 128, 128, PF_N * 16), u == 0 ? 0 : 1);
    loom_wg_commit();
}
/* After the wait for pf_wg_pv_issue's group: O += the tile's sum t where the vector attends. */
template <int HD>
static __device__ __forceinline__ void pf_wg_pv_add(float (&o)[HD / 8][4], float (&t)[HD / 8][4],
                                                    const bool any[2]) {
    loom_wg_fence_acc<HD / 2>(&t[0][0]);
#pragma unroll
    for (int dn = 0; dn < HD / 8; dn++)
#pragma unroll
        for (int r = 0; r < 4; r++)
            if (any[r >> 1]) o[dn][r] += t[dn][r];
}
template <int HD, int OP16>
static __device__ __forceinline__ void pf_wg_pv(float (&o)[HD / 8][4], uint32_t (&pa)[PF_N / 16][4],
                                                const uint8_t *v_tile, const bool any[2]) {
    float t[HD / 8][4];
    pf_wg_pv_issue<HD, OP16>(t, pa, v_tile);
    loom_wg_wait<0>();
    pf_wg_pv_add<HD>(o, t, any);
}

/* The end of a segment for this lane's two vectors: their states (the sums of the four lanes
 * of each row) are folded into the running fold (M, L and, FOLD_REGS, the
 * accumulator Of in registers; else in shared memory ot), or, splitting, left in a.part; then
 * the segment's state restarts. Warp-uniform. */
template <int HDMAX, bool FOLD_REGS>
static __device__ __forceinline__ void
pf_segment_end(const pf_args &a, int seg, int warp, int lane, int row0, int kvh, const bool vin[2],
               float m_run[2], float l_run[2], float o[HDMAX / 8][4], float M[2], float L[2],
               float (*Of)[4], float *ot) {
    const int hd = a.kv.head_dim, G = a.group;
#pragma unroll
    for (int h = 0; h < 2; h++) {
        float l = l_run[h];
        l += __shfl_xor_sync(0xffffffffu, l, 1);
        l += __shfl_xor_sync(0xffffffffu, l, 2);
        const int m = warp * 16 + loom_mma_c_row(lane, 2 * h);
        if (a.part != NULL) {
            if (vin[h]) {
                const int rl = m / G, head = kvh * G + m - rl * G;
                float *st = a.part + (((size_t)(row0 + rl) * a.p.n_head + head) * a.seg_stride +
                                      (size_t)seg) *
                                         (size_t)(hd + 2);
#pragma unroll
                for (int dn = 0; dn < HDMAX / 8; dn++) {
                    if (dn * 8 >= hd) break;
                    st[dn * 8 + loom_mma_c_col(lane, 2 * h)] = o[dn][2 * h];
                    st[dn * 8 + loom_mma_c_col(lane, 2 * h + 1)] = o[dn][2 * h + 1];
                }
                if ((lane & 3) == 0) {
                    st[hd] = m_run[h];
                    st[hd + 1] = l;
                }
            }
        } else {
            float ca = 0.0f, cb = 0.0f;
            const int how = pf_fold(&M[h], &L[h], m_run[h], l, &ca, &cb);
#pragma unroll
            for (int dn = 0; dn < HDMAX / 8; dn++) {
                if (dn * 8 >= hd) break;
                if constexpr (FOLD_REGS) {
                    Of[dn][2 * h] = pf_fold_value(how, Of[dn][2 * h], o[dn][2 * h], ca, cb);
                    Of[dn][2 * h + 1] =
                        pf_fold_value(how, Of[dn][2 * h + 1], o[dn][2 * h + 1], ca, cb);
                } else {
                    float2 *at =
                        (float2 *)(ot + m * (hd + 8) + dn * 8 + loom_mma_c_col(lane, 2 * h));
                    const float2 O = *at;
                    *at = make_float2(pf_fold_value(how, O.x, o[dn][2 * h], ca, cb),
                                      pf_fold_value(how, O.y, o[dn][2 * h + 1], ca, cb));
                }
            }
        }
        m_run[h] = -INFINITY;
        l_run[h] = 0.0f;
#pragma unroll
        for (int dn = 0; dn < HDMAX / 8; dn++) o[dn][2 * h] = o[dn][2 * h + 1] = 0.0f;
    }
}

/* out = the fold's accumulator / its sum (as the CPU: times 1 / l), for this lane's two vectors
 * (warp: the warp's place in its warpgroup), the fold in registers (Of) or shared memory (ot). */
template <int HDMAX, bool FOLD_REGS>
static __device__ __forceinline__ void pf_write_out(const pf_args &a, int warp, int lane, int row0,
                                                    int kvh, const bool vin[2], const float L[2],
                                                    const float (*Of)[4], const float *ot) {
    const int hd = a.kv.head_dim, G = a.group;
#pragma unroll
    for (int h = 0; h < 2; h++) {
        if (!vin[h]) continue;
        const int m = warp * 16 + loom_mma_c_row(lane, 2 * h), rl = m / G;
        const float inv = L[h] > 0.0f ? 1.0f / L[h] : 0.0f;
        float *orow = (float *)((char *)a.p.out + (size_t)(row0 + rl) * a.p.out_stride) +
                      (size_t)(kvh * G + m - rl * G) * hd;
        const float *frow = ot + m * (hd + 8);
#pragma unroll
        for (int dn = 0; dn < HDMAX / 8; dn++) {
            if (dn * 8 >= hd) break;
            const int c0 = dn * 8 + loom_mma_c_col(lane, 2 * h);
            if constexpr (FOLD_REGS) {
                orow[c0] = Of[dn][2 * h] * inv;
                orow[c0 + 1] = Of[dn][2 * h + 1] * inv;
            } else { /* one 8-byte read (rows 8 banks apart: a half warp's 4 rows, 32 banks) */
                const float2 f = *(const float2 *)(frow + c0);
                orow[c0] = f.x * inv;
                orow[c0 + 1] = f.y * inv;
            }
        }
    }
}

/* HDMAX: the head size the accumulator registers are laid out for (head_dim <= HDMAX, a
 * multiple of 8; the wgmma forms: head_dim == HDMAX); OPS: the products' operands (PF_TF32 ..
 * PF_WG_F16, pf_ops_of). */
template <int HDMAX, int OPS>
static __global__ void __launch_bounds__(PF_THREADS) attn_prefill_kernel(pf_args a) {
    constexpr bool F32KV = OPS == PF_TF32_KV, M16 = OPS >= PF_BF16;
    constexpr bool WG = OPS == PF_WG_BF16 || OPS == PF_WG_F16, QR = OPS >= PF_BF16_QR;
    constexpr int OP16 =
        OPS == PF_F16 || OPS == PF_WG_F16 || OPS == PF_F16_QR ? LOOM_MMA16_F16 : LOOM_MMA16_BF16;
    /* the fold in registers (small heads, mma.sync forms) or in shared memory (ot) */
    constexpr bool FOLD_REGS = HDMAX <= PF_FOLD_REGS_HD && !WG && !QR;
    /* Q's A fragments in registers for the whole walk (the wgmma forms, QR, and the 16-bit forms
     * up to head size 64) */
    constexpr bool QREGS = WG || QR || (M16 && HDMAX <= 64);
    const loom__k_kv &kv = a.kv;
    /* blockIdx.x: the sequences' tiles, the last tile of each (the most positions) first; a
     * sequence with fewer tiles than the longest has nothing at the end. blockIdx.z: the
     * group of segments (splitting; else 0). */
    const int n_pf = a.all ? kv.n_seqs : kv.n_prefill_seqs;
    const int s = a.all ? (int)(blockIdx.x % n_pf) : kv.prefill_seqs[blockIdx.x % n_pf];
    const int back = (int)(blockIdx.x / n_pf);
    const int n_tiles = (kv.q_start[s + 1] - kv.q_start[s] + a.rows_per_tile - 1) / a.rows_per_tile;
    if (back >= n_tiles) return;
    const pf_tile tl = pf_tile_of(a, s, n_tiles - 1 - back);
    if (!tl.active) return;
    const int row0 = tl.row0, rows = tl.rows, pos0 = tl.pos0, pos_last = tl.pos_last;
    const int lo_first = tl.lo_first, j_begin = tl.j_begin, j_end = tl.j_end;
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
    float *ot = vs + PF_N * ld; /* [PF_M][hd + 8]: the fold (HDMAX > PF_FOLD_REGS_HD) */
    /* the 16-bit forms' tiles in the same place, two values a word: Q [PF_M][ldw], K
     * [PF_N][ldw], V [PF_N / 2][ldv], then ot */
    const int ldw = pf_qk_words(hd), ldv = pf_v_words(hd);
    uint32_t *qs16 = (uint32_t *)(pf_sm + PF_HEAD_BYTES);
    uint32_t *ks16 = qs16 + PF_M * ldw, *vs16 = ks16 + PF_N * ldw;
    if constexpr (M16) ot = (float *)(vs16 + PF_N / 2 * ldv);
    /* the wgmma forms' tiles: Q [PF_M][hd], K [PF_N][hd] (pf_wg_at), V [PF_N][hd] (pf_wgv_at),
     * then ot */
    uint8_t *qg = pf_sm + PF_HEAD_BYTES, *kg = qg + PF_M * hd * 2, *vg = kg + PF_N * hd * 2;
    if constexpr (WG) ot = (float *)(vg + PF_N * hd * 2);

    /* Q: vector m = row m / G, head kvh * G + m % G; vectors past the tile's rows are zeros
     * (and, 16-bit, the 8 columns past head_dim, of K's rows too). */
    const int qld = WG ? hd / 2 : M16 ? ldw : hd; /* words (16-bit) or floats a row */
    for (int e = threadIdx.x; e < PF_M * qld; e += PF_THREADS) {
        /* the wgmma forms: rows fastest, a warp's 32 words one core matrix (pf_load_tile16) */
        const int m = WG ? (e >> 3) / qld * 8 + (e & 7) : e / qld;
        const int d = WG ? (e >> 3) % qld * 2 : (e - m * qld) * (M16 ? 2 : 1), rl = m / G;
        float x0 = 0.0f, x1 = 0.0f;
        if (rl < rows && d < hd) {
            const float *qrow =
                (const float *)((const char *)a.p.q + (size_t)(row0 + rl) * a.p.q_stride) +
                (size_t)(kvh * G + m - rl * G) * hd;
            x0 = qrow[d];
            if (M16) x1 = qrow[d + 1]; /* hd is even */
        }
        if constexpr (WG) {
            *(uint32_t *)(qg + pf_wg_at(m, d, hd * 16)) = loom_mma16_pack<OP16>(x0, x1);
        } else if constexpr (M16) {
            qs16[m * ldw + d / 2] = loom_mma16_pack<OP16>(x0, x1);
            if (m < PF_N && d >= hd) ks16[m * ldw + d / 2] = 0;
        } else {
            qs[m * ld + d] = x0;
        }
        if (!FOLD_REGS && !WG && d < hd) {
            ot[m * (hd + 8) + d] = 0.0f;
            if (M16) ot[m * (hd + 8) + d + 1] = 0.0f;
        }
    }
    if constexpr (WG) /* the fold from zero: in the loop above, its stores would be 2-way */
        for (int i = threadIdx.x; i < PF_M * (hd + 8); i += PF_THREADS) ot[i] = 0.0f;

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

    /* The segment's state (l: this lane's part) and the fold of the segments before */
    float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.0f, 0.0f};
    float M[2] = {-INFINITY, -INFINITY}, L[2] = {0.0f, 0.0f};
    constexpr int OF = FOLD_REGS ? HDMAX / 8 : 1; /* the fold in registers */
    float o[HDMAX / 8][4], Of[OF][4];
#pragma unroll
    for (int dn = 0; dn < HDMAX / 8; dn++)
#pragma unroll
        for (int r = 0; r < 4; r++) o[dn][r] = 0.0f;
#pragma unroll
    for (int dn = 0; dn < OF; dn++)
#pragma unroll
        for (int r = 0; r < 4; r++) Of[dn][r] = 0.0f;

    const int32_t *table = kv.block_ids + kv.indptr[s];
    pf_lookup(a, table, kvh, j_begin, lo_first, pos_last, row_at, ksc, vsc);
    __syncthreads();
    /* The 16-bit forms (QREGS): the warp's Q rows as the A fragments of S = Q Kᵀ, k16 step by step
     * (mma.sync m16n8k16's A fragment, which is also the ISA's m64nNk16 register fragment for
     * wgmma: loom_mma16_a_row/col), held for the whole walk, so that S reads only K from shared
     * memory (the mma.sync forms: a fifth less traffic for S and P V together; wgmma: 1 KB
     * a k16 step, not 3). */
    uint32_t qf[QREGS ? HDMAX / 16 : 1][4];
    if constexpr (QREGS) {
#pragma unroll
        for (int k16 = 0; k16 < HDMAX / 16; k16++) {
            if (k16 * 16 >= hd) break; /* the mma.sync forms: hd < HDMAX */
#pragma unroll
            for (int r = 0; r < 4; r++) {
                const int m = warp * 16 + loom_mma16_a_row(lane, r);
                const int d = k16 * 16 + loom_mma16_a_col(lane, r);
                qf[k16][r] =
                    WG ? *(const uint32_t *)(qg + pf_wg_at(m, d, hd * 16)) : qs16[m * ldw + d / 2];
            }
        }
        if constexpr (WG) loom_wg_fence_regs<(QREGS ? HDMAX / 4 : 4)>(&qf[0][0]);
    }
    int buf = 0;
    for (int j0 = j_begin; j0 <= j_end; j0 += PF_N, buf ^= 1) {
        const uint8_t *k_tile = kg, *v_tile = vg;
        if constexpr (WG)
            pf_load_tile16<OP16, true>(a, row_at + buf * PF_N, kg, vg);
        else if constexpr (M16)
            pf_load_tile16<OP16, false>(a, row_at + buf * PF_N, (uint8_t *)ks16, (uint8_t *)vs16);
        else
            pf_load_tile(a, row_at + buf * PF_N, ks, vs, ld);
        if (j0 + PF_N <= j_end)
            pf_lookup(a, table, kvh, j0 + PF_N, lo_first, pos_last, row_at + (buf ^ 1) * PF_N,
                      ksc + (buf ^ 1) * PF_N, vsc + (buf ^ 1) * PF_N);
        if constexpr (WG) loom_wg_fence_proxy_async(); /* the tiles, for the wgmma's */
        __syncthreads();
        /* warp-uniform; the wgmma forms: every warp (the block's rows attend every tile it
         * walks, so some warp needs it) */
        if (WG || (w_any && j0 <= w_hi && j0 + PF_N - 1 >= w_lo)) {
            const float *kscb = ksc + buf * PF_N, *vscb = vsc + buf * PF_N;
            /* S = Q Kᵀ: [16 vectors][PF_N positions] in C fragments. */
            float sc[PF_NT][4];
#pragma unroll
            for (int nt = 0; nt < PF_NT; nt++)
#pragma unroll
                for (int r = 0; r < 4; r++) sc[nt][r] = 0.0f;
            if constexpr (WG) {
                pf_wg_scores<HDMAX, OP16>(sc, qf, k_tile);
            } else if constexpr (QREGS) {
#pragma unroll
                for (int k16 = 0; k16 < HDMAX / 16; k16++) {
                    const int d0 = k16 * 16;
                    if (d0 >= hd) break;
#pragma unroll
                    for (int nt = 0; nt < PF_NT; nt++) {
                        /* B = Kᵀ: rows (k) head elements, column (n) position */
                        const uint32_t *kr = ks16 + (nt * 8 + loom_mma16_b_col(lane)) * ldw;
                        const uint32_t kb[2] = {kr[(d0 + loom_mma16_b_row(lane, 0)) / 2],
                                                kr[(d0 + loom_mma16_b_row(lane, 1)) / 2]};
                        loom_mma16<OP16>(sc[nt], qf[k16], kb);
                    }
                }
            } else if constexpr (M16) {
                const uint32_t *qw16 = qs16 + warp * 16 * ldw;
#pragma unroll 2
                for (int d0 = 0; d0 < hd; d0 += 16) {
                    uint32_t qa[4];
#pragma unroll
                    for (int r = 0; r < 4; r++)
                        qa[r] = qw16[loom_mma16_a_row(lane, r) * ldw +
                                     (d0 + loom_mma16_a_col(lane, r)) / 2];
#pragma unroll
                    for (int nt = 0; nt < PF_NT; nt++) {
                        /* B = Kᵀ: rows (k) head elements, column (n) position */
                        const uint32_t *kr = ks16 + (nt * 8 + loom_mma16_b_col(lane)) * ldw;
                        const uint32_t kb[2] = {kr[(d0 + loom_mma16_b_row(lane, 0)) / 2],
                                                kr[(d0 + loom_mma16_b_row(lane, 1)) / 2]};
                        loom_mma16<OP16>(sc[nt], qa, kb);
                    }
                }
            } else {
                const float *qw = qs + warp * 16 * ld;
#pragma unroll 2
                for (int d0 = 0; d0 < hd; d0 += 8) {
                    uint32_t qh[4], ql[4];
#pragma unroll
                    for (int r = 0; r < 4; r++)
                        loom_tf32_split(
                            qw[loom_mma_a_row(lane, r) * ld + d0 + loom_mma_a_col(lane, r)], &qh[r],
                            &ql[r]);
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
            }
            bool any[2];
            pf_softmax_tile<HDMAX>(sc, j0, lane, vin, vlo, vpos, scale, cap, fp8, kscb, vscb, m_run,
                                   l_run, o, any);
            /* O += P V, k over the tile's positions in pf_pv_pos order (above) */
            if constexpr (M16) {
                /* P's A fragments: two n8 tiles of S's C fragments side by side, packed (the
                 * positions in their own order); V's B fragment: positions (k) 2i, 2i + 1
                 * (+ 8) of the 16, head element g: one word of V's pairs per register (the
                 * wgmma forms: the same A fragments, V from its N-major tile). */
                uint32_t pa[PF_N / 16][4];
                pf_pack_p<OP16>(sc, pa);
                if constexpr (WG) pf_wg_pv<HDMAX, OP16>(o, pa, v_tile, any);
#pragma unroll
                for (int dn = 0; dn < (WG ? 0 : HDMAX / 8); dn++) {
                    if (dn * 8 >= hd) break;
                    float t[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
                    for (int u = 0; u < PF_N / 16; u++) {
                        const uint32_t *vt = vs16 + (8 * u) * ldv + dn * 8 + loom_mma16_b_col(lane);
                        const uint32_t vb[2] = {vt[loom_mma16_b_row(lane, 0) / 2 * ldv],
                                                vt[loom_mma16_b_row(lane, 1) / 2 * ldv]};
                        loom_mma16<OP16>(t, pa[u], vb);
                    }
#pragma unroll
                    for (int r = 0; r < 4; r++)
                        if (any[r >> 1]) o[dn][r] += t[r];
                }
            } else {
                uint32_t ph[PF_NT][4], pl[PF_NT][4];
#pragma unroll
                for (int nt = 0; nt < PF_NT; nt++)
#pragma unroll
                    for (int r = 0; r < 4; r++)
                        loom_tf32_split(sc[nt][pf_a_from_c(r)], &ph[nt][r], &pl[nt][r]);
                const int v0 = pf_pv_pos(loom_mma_b_row(lane, 0)) * ld;
                const int v1 = pf_pv_pos(loom_mma_b_row(lane, 1)) * ld;
#pragma unroll
                for (int dn = 0; dn < HDMAX / 8; dn++) {
                    if (dn * 8 >= hd) break;
                    float t[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
                    for (int nt = 0; nt < PF_NT; nt++) {
                        const float *vt = vs + nt * 8 * ld + loom_mma_b_col(lane) + dn * 8;
                        if (F32KV) {
                            uint32_t vh[2], vl[2];
                            loom_tf32_split(vt[v0], &vh[0], &vl[0]);
                            loom_tf32_split(vt[v1], &vh[1], &vl[1]);
                            loom_mma_3xtf32(t, ph[nt], pl[nt], vh, vl);
                        } else {
                            const uint32_t vb[2] = {__float_as_uint(vt[v0]),
                                                    __float_as_uint(vt[v1])};
                            loom_mma_2xtf32_a(t, ph[nt], pl[nt], vb);
                        }
                    }
#pragma unroll
                    for (int r = 0; r < 4; r++)
                        if (any[r >> 1]) o[dn][r] += t[r];
                }
            }
        }
        /* the segment ends at a multiple of PF_SEG or at the end of the walk */
        if ((j0 + PF_N) % PF_SEG == 0 || j0 + PF_N > j_end)
            pf_segment_end<HDMAX, FOLD_REGS>(a, j0 / PF_SEG, warp, lane, row0, kvh, vin, m_run,
                                             l_run, o, M, L, Of, ot);
        __syncthreads();
    }
    if (a.part != NULL) return; /* pf_fold_kernel writes out */

    pf_write_out<HDMAX, FOLD_REGS>(a, warp, lane, row0, kvh, vin, L, Of, ot);
}

/* The warp-specialised wgmma forms (pf_direct: the tiles' pages of the products' 16-bit type,
 * 16-byte aligned, on sm_90; LOOM_CUDA_ATTN_ASYNC=0 keeps attn_prefill_kernel's register path):
 * PF_WS_THREADS = three warpgroups a block. Warpgroup 0 produces: it gives registers back
 * (setmaxnreg) and copies the K and V tiles by cp.async into a ring of PF_WS_STAGES stages, each
 * thread looking up its own pieces' rows through the block table, each stage's copies arriving
 * on its "full" mbarrier as they land (cp.async.mbarrier.arrive); before it copies into a stage
 * again it waits on the stage's "empty" mbarrier, on which the consumers arrive when their
 * wgmma's are done with it. Warpgroups 1 and 2 consume: each takes the registers the producer gave
 * back and one of two PF_M-vector tiles of the sequence's rows (the two attn_prefill_kernel's
 * blocks would take: the later first), and runs attn_prefill_kernel's wgmma walk on its tile
 * (pf_wg_scores_issue, pf_softmax_weights, pf_correct, pf_pack_p, pf_wg_pv_issue, pf_wg_pv_add,
 * pf_segment_end, pf_write_out) over the stages as they fill, pipelined within the warpgroup
 * (each tile's S issued together with the last tile's P V, which runs while this tile's softmax
 * does, as FlashAttention-3 describes), skipping the tiles outside its own walk (the block walks
 * the union of the two). So each K/V tile is read from memory once for 128 vectors, not twice for
 * 64, the copies leave the tensor cores' warps alone, and up to PF_WS_STAGES tiles are in flight. A
 * consumer's vectors see the tiles, positions and arithmetic of attn_prefill_kernel's block of the
 * same tile (positions one consumer's rows do not attend and the other's do hold data rather than
 * zeros, and weigh 0: the same bits), so the two kernels give the same bits — over finite
 * pages: an infinite value (an F16 page's overflow) times a weight of 0 is NaN in P V, which
 * both kernels already give to a tile's rows that do not attend it, and this one to the other
 * consumer's rows too.
 * Registers: the launch gives each of the 384 threads 168 (65536 / 384 rounded down to 8); the
 * producer drops to PF_WS_PRODUCER_REGS, the consumers rise to PF_WS_CONSUMER_REGS: 40 128 + 232
 * 256 = 168 384, the block's pool (a consumer's setmaxnreg.inc waits until the pool has what it
 * asks for: asking for more would never return; the static_assert below).
 * Shared memory: the barriers, both consumers' Q tiles (K-major, pf_wg_at), the stages (K then
 * V, as attn_prefill_kernel's tiles), both consumers' folds [PF_M][HD + 8]: 164 KB at head size
 * 128, 84 KB at 64 (pf_smem_bytes). */
#define PF_WS_LAUNCH_REGS /* the registers a thread the split needs at launch */                   \
    ((PF_WS_PRODUCER_REGS * PF_THREADS + PF_WS_CONSUMER_REGS * 2 * PF_THREADS + PF_WS_THREADS -    \
      1) /                                                                                         \
     PF_WS_THREADS)
static_assert(PF_WS_LAUNCH_REGS <= 65536 / PF_WS_THREADS / 8 * 8,
              "the warpgroups' registers exceed the block's");
template <int HD, int OPS>
static __global__ void __launch_bounds__(PF_WS_THREADS, 1) attn_prefill_ws_kernel(pf_args a) {
#if LOOM_WGMMA_HAS
    constexpr int OP16 = OPS == PF_WG_F16 ? LOOM_MMA16_F16 : LOOM_MMA16_BF16;
    constexpr int TILE = PF_N * HD * 2; /* K's bytes in a stage, and V's */
    const loom__k_kv &kv = a.kv;
    const int n_pf = a.all ? kv.n_seqs : kv.n_prefill_seqs;
    const int s = a.all ? (int)(blockIdx.x % n_pf) : kv.prefill_seqs[blockIdx.x % n_pf];
    const int pair = (int)(blockIdx.x / n_pf);
    const int n_tiles = (kv.q_start[s + 1] - kv.q_start[s] + a.rows_per_tile - 1) / a.rows_per_tile;
    if (2 * pair >= n_tiles) return;
    /* consumer c's tile: the later of the pair first (the most positions) */
    const pf_tile t0 = pf_tile_of(a, s, n_tiles - 1 - 2 * pair);
    const pf_tile t1 = pf_tile_of(a, s, n_tiles - 2 - 2 * pair);
    if (!t0.active && !t1.active) return;
    const int n_active = (t0.active ? 1 : 0) + (t1.active ? 1 : 0);
    /* the walk (both tiles' walks: they overlap or touch, the rows being consecutive) and the
     * positions some row of the block attends (the rest are zeros) */
    const int jb = t1.active && (!t0.active || t1.j_begin < t0.j_begin) ? t1.j_begin : t0.j_begin;
    const int je = t0.active ? t0.j_end : t1.j_end;
    const int lo = t1.active ? t1.lo_first : t0.lo_first;
    const int hi = t0.active ? t0.pos_last : t1.pos_last;
    const int kvh = blockIdx.y, G = a.group;

    LOOM_K_DYN_SMEM(pf_sm);
    uint64_t *full = (uint64_t *)pf_sm, *empty = full + PF_WS_STAGES;
    uint8_t *qg = pf_sm + PF_WS_BAR_BYTES;                     /* [2][PF_M][HD], pf_wg_at */
    uint8_t *stage = qg + 2 * PF_M * HD * 2;                   /* [PF_WS_STAGES][K, V] */
    float *folds = (float *)(stage + PF_WS_STAGES * 2 * TILE); /* [2][PF_M][HD + 8] */
    if (threadIdx.x == 0)
        for (int st = 0; st < PF_WS_STAGES; st++) {
            loom_mbar_init(full + st, PF_THREADS);
            loom_mbar_init(empty + st, PF_THREADS * n_active);
        }
    /* both consumers' Q (vector m = row m / G, head kvh G + m % G; zeros past the tile's rows),
     * rows fastest (a warp's 32 words one core matrix); the folds from zero */
    for (int e = threadIdx.x; e < PF_M * HD; e += PF_WS_THREADS) {
        const int c = e / (PF_M * HD / 2), ec = e - c * (PF_M * HD / 2);
        const int m = (ec >> 3) / (HD / 2) * 8 + (ec & 7), d = (ec >> 3) % (HD / 2) * 2;
        const int rl = m / G;
        const pf_tile t = c == 0 ? t0 : t1;
        float x0 = 0.0f, x1 = 0.0f;
        if (t.active && rl < t.rows) {
            const float *qrow =
                (const float *)((const char *)a.p.q + (size_t)(t.row0 + rl) * a.p.q_stride) +
                (size_t)(kvh * G + m - rl * G) * HD;
            x0 = qrow[d];
            x1 = qrow[d + 1];
        }
        *(uint32_t *)(qg + c * PF_M * HD * 2 + pf_wg_at(m, d, HD * 16)) =
            loom_mma16_pack<OP16>(x0, x1);
    }
    for (int i = threadIdx.x; i < 2 * PF_M * (HD + 8); i += PF_WS_THREADS) folds[i] = 0.0f;
    __syncthreads(); /* the barriers' init, Q, the folds; the last block-wide barrier */

    if (threadIdx.x < PF_THREADS) { /* the producer */
        loom_wg_maxnreg_dec<PF_WS_PRODUCER_REGS>();
        const int32_t *table = kv.block_ids + kv.indptr[s];
        int i = 0;
        for (int j0 = jb; j0 <= je; j0 += PF_N, i++) {
            const int st = i % PF_WS_STAGES;
            loom_mbar_wait(empty + st, ((i / PF_WS_STAGES) & 1) ^ 1);
            uint8_t *k_tile = stage + st * 2 * TILE;
            pf_copy_tile<HD>(a, table, kvh, j0, lo, hi, (int)threadIdx.x, k_tile, k_tile + TILE);
            loom_cp_async_mbar_arrive(full + st);
        }
        /* every stage released before the block may end: no copy outlives its shared memory */
        for (int e = i; e < i + PF_WS_STAGES; e++)
            loom_mbar_wait(empty + e % PF_WS_STAGES, ((e / PF_WS_STAGES) & 1) ^ 1);
        return;
    }
    const int c = (int)threadIdx.x / PF_THREADS - 1;
    const pf_tile me = c == 0 ? t0 : t1;
    if (!me.active) return; /* (not counted on the empty barriers) */
    loom_wg_maxnreg_inc<PF_WS_CONSUMER_REGS>();
    const int warp = (threadIdx.x >> 5) & 3, lane = threadIdx.x & 31;
    const uint8_t *qc = qg + c * PF_M * HD * 2;
    float *ot = folds + c * PF_M * (HD + 8);
    const float scale = a.p.scale, cap = a.p.softcap;
    bool vin[2];
    int vpos[2], vlo[2];
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const int rl = (warp * 16 + loom_mma_c_row(lane, 2 * h)) / G;
        vin[h] = rl < me.rows;
        vpos[h] = me.pos0 + rl;
        vlo[h] = pf_lo(kv, vpos[h]);
    }
    float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.0f, 0.0f};
    float M[2] = {-INFINITY, -INFINITY}, L[2] = {0.0f, 0.0f};
    float o[HD / 8][4];
#pragma unroll
    for (int dn = 0; dn < HD / 8; dn++)
#pragma unroll
        for (int r = 0; r < 4; r++) o[dn][r] = 0.0f;
    uint32_t qf[HD / 16][4];
#pragma unroll
    for (int k16 = 0; k16 < HD / 16; k16++)
#pragma unroll
        for (int r = 0; r < 4; r++)
            qf[k16][r] =
                *(const uint32_t *)(qc + pf_wg_at(warp * 16 + loom_mma16_a_row(lane, r),
                                                  k16 * 16 + loom_mma16_a_col(lane, r), HD * 16));
    loom_wg_fence_regs<HD / 4>(&qf[0][0]);
    /* The walk, pipelined within the warpgroup: each tile's S issued, then the last tile's P V,
     * so that the tensor cores run that P V while this tile's softmax runs; then the P V waited
     * for and added, the last tile's stage released. The accumulator sees the same operations in
     * the same order as attn_prefill_kernel's walk (o *= corr_i, o += t_i, o *= corr_i+1, ...;
     * a tile that opens a segment takes its softmax from a fresh state while the last one's
     * segment ends after its P V is in): the same bits. Nothing is in flight where paths meet
     * (the loop's entry, its back edge, a segment's end), so ptxas need not wait or serialise on
     * its own. The walk's tiles outside the consumer's own (the other consumer's) are only waited
     * for and released. */
    int i = 0, j0 = jb;
    for (; j0 < me.j_begin; j0 += PF_N, i++) {
        loom_mbar_wait(full + i % PF_WS_STAGES, (i / PF_WS_STAGES) & 1);
        loom_mbar_arrive(empty + i % PF_WS_STAGES);
    }
    float sn[PF_NT][4];        /* a tile's S, then its weights */
    float t[HD / 8][4];        /* a tile's P V */
    uint32_t pa[PF_N / 16][4]; /* the last tile's P, which its P V reads */
    bool any[2];
    float corr[2];
    /* the consumer's first tile: S and softmax; its P V is issued with the next tile's S */
    loom_mbar_wait(full + i % PF_WS_STAGES, (i / PF_WS_STAGES) & 1);
    loom_wg_fence_proxy_async(); /* the landed copies, for this thread's wgmma's */
    pf_wg_scores_issue<HD, OP16>(sn, qf, stage + i % PF_WS_STAGES * 2 * TILE);
    loom_wg_wait<0>();
    loom_wg_fence_acc<PF_N / 2>(&sn[0][0]);
    pf_softmax_weights(sn, j0, lane, vin, vlo, vpos, scale, cap, false, NULL, NULL, m_run, l_run,
                       corr, any);
    pf_correct<HD>(o, corr);
    pf_pack_p<OP16>(sn, pa);
    for (j0 += PF_N, i++; j0 <= me.j_end; j0 += PF_N, i++) {
        const int i_last = i - 1, j_last = j0 - PF_N; /* the last tile */
        const int st = i % PF_WS_STAGES;
        loom_mbar_wait(full + st, (i / PF_WS_STAGES) & 1);
        loom_wg_fence_proxy_async();
        pf_wg_scores_issue<HD, OP16>(sn, qf, stage + st * 2 * TILE);
        pf_wg_pv_issue<HD, OP16>(t, pa, stage + i_last % PF_WS_STAGES * 2 * TILE + TILE);
        loom_wg_wait<1>(); /* this tile's S (the last one's P V runs on) */
        loom_wg_fence_acc<PF_N / 2>(&sn[0][0]);
        /* the softmax on a copy: no instruction but a wgmma defines sn while a group flies */
        float sc[PF_NT][4];
#pragma unroll
        for (int nt = 0; nt < PF_NT; nt++)
#pragma unroll
            for (int r = 0; r < 4; r++) sc[nt][r] = sn[nt][r];
        const bool opens = j0 % PF_SEG == 0; /* and the last tile ended a segment */
        float m_new[2], l_new[2];
        bool any_new[2];
#pragma unroll
        for (int h = 0; h < 2; h++) {
            m_new[h] = opens ? -INFINITY : m_run[h];
            l_new[h] = opens ? 0.0f : l_run[h];
        }
        pf_softmax_weights(sc, j0, lane, vin, vlo, vpos, scale, cap, false, NULL, NULL, m_new,
                           l_new, corr, any_new);
        loom_wg_wait<0>(); /* the last tile's P V */
        pf_wg_pv_add<HD>(o, t, any);
        loom_mbar_arrive(empty + i_last % PF_WS_STAGES); /* its stage read by both wgmma's */
        if (opens)
            pf_segment_end<HD, false>(a, j_last / PF_SEG, warp, lane, me.row0, kvh, vin, m_run,
                                      l_run, o, M, L, NULL, ot);
#pragma unroll
        for (int h = 0; h < 2; h++) {
            m_run[h] = m_new[h];
            l_run[h] = l_new[h];
            any[h] = any_new[h];
        }
        pf_correct<HD>(o, corr);
        pf_pack_p<OP16>(sc, pa);
    }
    const int i_last = i - 1, j_last = j0 - PF_N;
    /* the consumer's last tile's P V, and its segment's end */
    pf_wg_pv_issue<HD, OP16>(t, pa, stage + i_last % PF_WS_STAGES * 2 * TILE + TILE);
    loom_wg_wait<0>();
    pf_wg_pv_add<HD>(o, t, any);
    loom_mbar_arrive(empty + i_last % PF_WS_STAGES);
    pf_segment_end<HD, false>(a, j_last / PF_SEG, warp, lane, me.row0, kvh, vin, m_run, l_run, o, M,
                              L, NULL, ot);
    for (; j0 <= je; j0 += PF_N, i++) {
        loom_mbar_wait(full + i % PF_WS_STAGES, (i / PF_WS_STAGES) & 1);
        loom_mbar_arrive(empty + i % PF_WS_STAGES);
    }
    if (a.part != NULL) return; /* pf_fold_kernel writes out */
    pf_write_out<HD, false>(a, warp, lane, me.row0, kvh, vin, L, NULL, ot);
#else
    (void)a;
#endif
}

/* A split context's fold: row blockIdx.x of the step, query head blockIdx.y; the segments its
 * positions cover, in order, by pf_fold, then out = O / L — the kernel's arithmetic on the
 * states it left. */
static __global__ void __launch_bounds__(128) pf_fold_kernel(pf_args a) {
    const loom__k_kv &kv = a.kv;
    const int r = blockIdx.x, head = blockIdx.y, hd = kv.head_dim;
    const int s = kv.row_seq[r], pos = kv.pos_start[s] + (r - kv.q_start[s]);
    const int seg0 = pf_lo(kv, pos) / PF_SEG, seg1 = pos / PF_SEG;
    const float *base = a.part + ((size_t)r * a.p.n_head + head) * a.seg_stride * (size_t)(hd + 2);
    float *orow = (float *)((char *)a.p.out + (size_t)r * a.p.out_stride) + (size_t)head * hd;
    for (int d = threadIdx.x; d < hd; d += 128) {
        float M = -INFINITY, L = 0.0f, O = 0.0f;
        for (int j = seg0; j <= seg1; j++) {
            const float *st = base + (size_t)j * (hd + 2);
            float ca = 0.0f, cb = 0.0f;
            const int how = pf_fold(&M, &L, st[hd], st[hd + 1], &ca, &cb);
            O = pf_fold_value(how, O, st[d], ca, cb);
        }
        const float inv = L > 0.0f ? 1.0f / L : 0.0f;
        orow[d] = O * inv;
    }
}

/* How a step's tiled attention splits the positions: groups of segments (1: no split), and
 * the partial states' size. A rule on the step's shape and the device's size; any rule gives
 * the same bits. Splits the invariant mode's steps whose blocks are fewer than an SM holds at
 * once (two of attn_prefill_kernel's, one of the warp-specialised kernel's, whose blocks take
 * two tiles), into enough groups for that, where the states fit PF_WORK_MAX. */
typedef struct pf_plan {
    int32_t groups, segs_per_block, seg_stride;
    size_t part_bytes; /* 0: no split */
} pf_plan;

static __host__ __device__ pf_plan pf_plan_of(const loom__k_kv *kv, const loom__k_attn *p,
                                              int all) {
    pf_plan pl = {1, 0, 0, 0};
    pl.seg_stride = (kv->max_kv_len + PF_SEG - 1) / PF_SEG;
    if (pl.seg_stride < 1) pl.seg_stride = 1;
    pl.segs_per_block = pl.seg_stride;
    if (!all || p->n_sms <= 0 || pl.seg_stride < 2) return pl;
    const int32_t br = PF_M / (p->n_head / kv->n_kv_heads);
    /* the blocks the step's kernel has, and how many an SM holds: the warp-specialised one 1
     * (its shared memory and registers), attn_prefill_kernel 2 */
    const int direct =
        pf_direct(kv, p, pf_ops_of(kv->kv_type, p->math, kv->head_dim, p->smem_optin));
    const int64_t resident = direct ? 1 : 2, want = resident * (int64_t)p->n_sms;
    const int64_t blocks = pf_grid_x(kv, 1, br, direct) * kv->n_kv_heads;
    if (blocks >= want) return pl;
    const double bytes = 4.0 * (double)kv->n_rows * p->n_head * pl.seg_stride * (kv->head_dim + 2);
    if (bytes > (double)PF_WORK_MAX) return pl;
    int64_t groups = (want + blocks - 1) / blocks;
    if (groups > pl.seg_stride) groups = pl.seg_stride;
    pl.segs_per_block = (int32_t)((pl.seg_stride + groups - 1) / groups);
    pl.groups = (pl.seg_stride + pl.segs_per_block - 1) / pl.segs_per_block;
    if (pl.groups > 1)
        pl.part_bytes = (size_t)bytes;
    else
        pl.segs_per_block = pl.seg_stride;
    return pl;
}

/* ------------------------------------------------------------------------------------------ */
/* Launch                                                                                     */
/* ------------------------------------------------------------------------------------------ */

#if LOOM_K_HOST_CODE /* tests/kernels_emu/ launches the kernel itself */
/* WS: attn_prefill_ws_kernel (a.direct), else attn_prefill_kernel. */
template <int HDMAX, int OPS, bool WS = false>
static loom_status pf_launch(cudaStream_t stream, const pf_args &a, unsigned blocks,
                             unsigned groups, size_t smem) {
    /* past the default 48 KB: the kernel opts in (checked against the device before) */
    static std::atomic<int> optin[LOOM_K_OPTIN_DEVICES];
    const dim3 grid(blocks, (unsigned)a.kv.n_kv_heads, groups);
    if constexpr (WS) {
        static std::atomic<int> regs[LOOM_K_OPTIN_DEVICES];
        loom_status st = loom_k_regs_check(attn_prefill_ws_kernel<HDMAX, OPS>, PF_WS_LAUNCH_REGS,
                                           regs, "tiled attention (warp-specialised)");
        if (st == LOOM_OK)
            st = loom_k_smem_optin(attn_prefill_ws_kernel<HDMAX, OPS>, smem, optin,
                                   "tiled attention (warp-specialised)");
        if (st != LOOM_OK) return st;
        LOOM_K_LAUNCH((attn_prefill_ws_kernel<HDMAX, OPS>), (grid, PF_WS_THREADS, smem, stream), a);
    } else {
        const loom_status st =
            loom_k_smem_optin(attn_prefill_kernel<HDMAX, OPS>, smem, optin, "tiled attention");
        if (st != LOOM_OK) return st;
        LOOM_K_LAUNCH((attn_prefill_kernel<HDMAX, OPS>), (grid, PF_THREADS, smem, stream), a);
    }
    LOOM_K_LAUNCHED("attention (tiled)");
    if (a.part == NULL) return LOOM_OK;
    LOOM_K_LAUNCH((pf_fold_kernel),
                  (dim3((unsigned)a.kv.n_rows, (unsigned)a.p.n_head), 128, 0, stream), a);
    LOOM_K_LAUNCHED("attention (tiled fold)");
    return LOOM_OK;
}

template <int HDMAX>
static loom_status pf_launch_ops(cudaStream_t stream, const pf_args &a, int ops, unsigned blocks,
                                 unsigned groups, size_t smem) {
    switch (ops) {
    case PF_TF32:
        return pf_launch<HDMAX, PF_TF32>(stream, a, blocks, groups, smem);
    case PF_TF32_KV:
        return pf_launch<HDMAX, PF_TF32_KV>(stream, a, blocks, groups, smem);
    case PF_BF16:
        return pf_launch<HDMAX, PF_BF16>(stream, a, blocks, groups, smem);
    case PF_F16:
        return pf_launch<HDMAX, PF_F16>(stream, a, blocks, groups, smem);
    case PF_BF16_QR:
    case PF_F16_QR: /* head sizes 72 .. 128 (pf_ops_of) */
        if constexpr (HDMAX == 128) {
            if (ops == PF_F16_QR)
                return pf_launch<HDMAX, PF_F16_QR>(stream, a, blocks, groups, smem);
            return pf_launch<HDMAX, PF_BF16_QR>(stream, a, blocks, groups, smem);
        }
        LOOM_K_UNSUPPORTED("cuda: tiled attention (Q in registers) with head_dim %d",
                           a.kv.head_dim);
    default: /* the wgmma forms, whose head size is HDMAX (pf_ops_of) */
        if constexpr (HDMAX == 64 || HDMAX == 128) {
            if (a.direct && ops == PF_WG_F16)
                return pf_launch<HDMAX, PF_WG_F16, true>(stream, a, blocks, groups, smem);
            if (a.direct)
                return pf_launch<HDMAX, PF_WG_BF16, true>(stream, a, blocks, groups, smem);
            if (ops == PF_WG_F16)
                return pf_launch<HDMAX, PF_WG_F16>(stream, a, blocks, groups, smem);
            return pf_launch<HDMAX, PF_WG_BF16>(stream, a, blocks, groups, smem);
        }
        LOOM_K_UNSUPPORTED("cuda: tiled attention (wgmma) with head_dim %d", a.kv.head_dim);
    }
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

#if LOOM_K_HOST_CODE
extern "C" int loom__cuda_attention_tiled_ok(const loom__k_kv *kv, const loom__k_attn *p) {
    return pf_layer_ok(kv, p) &&
           pf_smem_bytes(kv->head_dim, pf_ops_of(kv->kv_type, p->math, kv->head_dim, p->smem_optin),
                         0) <= (size_t)p->smem_optin; /* (pf_direct checks its own) */
}

extern "C" size_t loom__cuda_attention_tiled_work_bound(int32_t n_head, int32_t n_kv_heads,
                                                        int32_t head_dim, int32_t max_tokens,
                                                        int32_t max_ctx, int n_sms) {
    if (n_head < 1 || n_kv_heads < 1 || n_head % n_kv_heads != 0 || head_dim < 1 || n_sms < 1 ||
        max_tokens < 1 || max_ctx < 1)
        return 0;
    /* a split step has fewer than 2 n_sms blocks: rows < (rows per tile) 2 n_sms / n_kv_heads */
    const int64_t per_tile = PF_M / (n_head / n_kv_heads);
    int64_t rows = per_tile * 2 * (int64_t)n_sms / n_kv_heads;
    if (rows > max_tokens) rows = max_tokens;
    const double bytes = 4.0 * (double)rows * n_head * (double)((max_ctx + PF_SEG - 1) / PF_SEG) *
                         (double)(head_dim + 2);
    return bytes > (double)PF_WORK_MAX ? PF_WORK_MAX : (size_t)bytes;
}

extern "C" size_t loom__cuda_attention_tiled_work_bytes(const loom__k_kv *kv,
                                                        const loom__k_attn *p) {
    if (!p->invariant || kv->n_rows == 0 || !loom__cuda_attention_tiled_ok(kv, p)) return 0;
    return pf_plan_of(kv, p, 1).part_bytes;
}

extern "C" loom_status loom__cuda_attention_prefill(cudaStream_t stream, const loom__k_kv *kv,
                                                    const loom__k_attn *p, int *ran) {
    *ran = 0;
    const int all = p->invariant != 0;
    if ((all ? kv->n_seqs : kv->n_prefill_seqs) <= 0 || !loom__cuda_attention_tiled_ok(kv, p))
        return LOOM_OK; /* the split-KV kernel takes every row */
    const int ops = pf_ops_of(kv->kv_type, p->math, kv->head_dim, p->smem_optin);
    const int direct = pf_direct(kv, p, ops);
    const size_t smem = pf_smem_bytes(kv->head_dim, ops, direct);
    const pf_plan pl = pf_plan_of(kv, p, all);
    if (pl.part_bytes > p->tiled_work_bytes)
        return loom__fail(LOOM_ERR_INTERNAL,
                          "cuda: tiled attention needs %zu bytes of scratch, "
                          "has %zu",
                          pl.part_bytes, p->tiled_work_bytes);
    pf_args a = {*kv,
                 *p,
                 p->n_head / kv->n_kv_heads,
                 0,
                 all,
                 pl.part_bytes != 0 ? p->tiled_work : NULL,
                 pl.segs_per_block,
                 pl.seg_stride,
                 direct};
    a.rows_per_tile = PF_M / a.group;
    const int64_t blocks = pf_grid_x(kv, all, a.rows_per_tile, direct);
    if (blocks > 0x7fffffff || pl.groups > 65535) {
        /* the fast mode may send the rows to split-KV; the invariant mode may not (the
         * layer's rows would change kernels with the step) */
        if (all)
            LOOM_K_UNSUPPORTED("cuda: tiled attention of %lld blocks in %d groups",
                               (long long)blocks, (int)pl.groups);
        return LOOM_OK;
    }
    const unsigned g = (unsigned)pl.groups;
    loom_status st = LOOM_OK;
    switch (kv->head_dim <= 64 ? 64 : kv->head_dim <= 128 ? 128 : 256) {
    case 64:
        st = pf_launch_ops<64>(stream, a, ops, (unsigned)blocks, g, smem);
        break;
    case 128:
        st = pf_launch_ops<128>(stream, a, ops, (unsigned)blocks, g, smem);
        break;
    case 256:
        st = pf_launch_ops<256>(stream, a, ops, (unsigned)blocks, g, smem);
        break;
    default:
        LOOM_K_UNSUPPORTED("cuda: prefill attention with head_dim %d", kv->head_dim);
    }
    if (st == LOOM_OK) *ran = 1;
    return st;
}
#endif
