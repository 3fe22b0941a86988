/* gemm.cu — matmul out = x·wᵀ on tensor cores at float32 accuracy (mma.cuh): every step by
 * default; in the fast mode steps of more than 8 tokens (1..8 go to gemv.cu).
 *
 * A block of 4 warps computes a tile of 64 weight rows by 64 tokens; each warp owns 32 rows by
 * 32 tokens (2 x 4 m16n8k8 tiles, 32 accumulators per lane). K runs in 32-value chunks, one
 * loom_dequant32 chunk each:
 *   - the weight rows' stored bytes arrive a stage at a time (a K-quant super-block; 8 blocks
 *     of q4_0 / q5_0, 4 of q8_0; 128 bytes of the float formats): all threads copy them
 *     into shared memory in contiguous 4-byte (or 2-, 1-byte) pieces. A thread decoding its
 *     own row straight from global memory would have a warp's loads touch 32 rows, 32 cache
 *     lines per instruction; copied this way they touch one or two. Staged rows are padded to
 *     an odd number of words, so that 32 threads reading 32 rows hit 32 banks;
 *   - per chunk, threads 0..63 decode their row's 32 values from the stage (loom_dequant32 on
 *     the staged bytes), threads 64..127 load the 64 tokens' 32 activations (four rows of 128
 *     bytes per warp instruction); both land in a tile K-contiguous (the mma's row.col), rows
 *     padded to 36 floats so that the fragment reads — lane (g, i) at row g, column i — and the
 *     16-byte stores hit 32 different banks. Two tiles alternate, so one barrier per chunk
 *     suffices: warps done with a chunk decode the next while others still multiply.
 *
 * Arithmetic: activations split into TF32 hi + lo; weights that decode to exact TF32 values
 * (F16, BF16, FP8 units, whose row scale is applied once to each dot at the end, as gemv.cu
 * does) take 2 instructions per tile, the others are split too and take 3 (mma.cuh). Within a
 * k-step the instructions run pass by pass over a row half's 4 tiles (all lo·hi, then all
 * hi·lo, then all hi·hi), so consecutive mma's do not wait on each other's accumulator; each
 * accumulator still sees its terms in the one order of loom_mma_3xtf32 / loom_mma_2xtf32_b.
 * BF16 math (LOOM_K_MATH_BF16, a template parameter): the decoded weights and the activations
 * are rounded to BF16 as they enter the tile (each value's rounding depends on itself alone)
 * and a k-step of 16 is one m16n8k16 per row half and token tile: a sixth (a quarter) of the
 * instructions at twice their rate. Segments, folds and splits are unchanged.
 *
 * Batch invariance — the backend's default order for every step, one token or thousands: an
 * output's sum runs in segments of K at fixed places — seg_chunks 32-value chunks each, a
 * multiple of 8 set by K alone (gemm_seg_chunks: 256 values, more where K has over 16 of them);
 * each segment's sum starts from zero and runs over its chunks in K order, k-step by k-step, in
 * the same three (two) instructions; the segments' sums then meet in a left fold, ((0 + s0) +
 * s1) + ..., in float32. Nothing depends on n_tokens: a token sits at place t mod 64 of its
 * tile, and an mma's output element depends only on its own row and column. Where the grid of
 * tiles is too small to fill the device (decode steps: one token tile), blocks also split K at
 * segment boundaries (grid.z), each writing its segments' sums apart into a scratch area, and
 * gemm_fold_kernel folds them in the same order — the same bits as one block folding them in
 * registers, so the split is free to follow the step's size. No atomics anywhere. */
#include "cp_async.cuh"
#include "dequant.cuh"
#include "mbarrier.cuh"
#include "mma.cuh"
#include "tma.cuh"
#include "wgmma.cuh"

#define GEMM_THREADS 128
#define GEMM_ROWS    64 /* weight rows per block: the mma's M */
#define GEMM_TOKENS  64 /* tokens per block: the mma's N */
#define GEMM_LD      36 /* floats per row of a tile: a 32-value chunk and 4 of padding */
/* Chunks per segment of K at the least (the fold's unit: whole stages of every format), and the
 * most segments a row has. */
#define GEMM_SEG_CHUNKS 8
#define GEMM_MAX_SEGS   16
/* The most scratch a split takes; a split that would need more does not happen. */
#define GEMM_WORK_MAX ((size_t)64 << 20)
/* The wgmma kernel (LOOM_K_MATH_BF16_WGMMA, gemm_wgmma.cuh): two warpgroups, 128 weight rows by
 * 128 tokens a block. */
#define GEMM_WG_THREADS 256
#define GEMM_WG_ROWS    128
#define GEMM_WG_TOKENS  128

/* A kernel's tile (weight rows, tokens) and the blocks an SM holds at once: the mma.sync
 * kernel's 3 (its __launch_bounds__), the wgmma kernel's 1 (its registers). */
static __host__ __device__ __forceinline__ int gemm_tile_rows(int math) {
    return math == LOOM_K_MATH_BF16_WGMMA ? GEMM_WG_ROWS : GEMM_ROWS;
}
static __host__ __device__ __forceinline__ int gemm_tile_tokens(int math) {
    return math == LOOM_K_MATH_BF16_WGMMA ? GEMM_WG_TOKENS : GEMM_TOKENS;
}
static __host__ __device__ __forceinline__ int gemm_residency(int math) {
    return math == LOOM_K_MATH_BF16_WGMMA ? 1 : 3;
}

typedef struct gemm_args {
    loom__k_weight w;
    const float *x; /* [n_tokens, w.k], rows x_stride bytes apart */
    size_t x_stride;
    int64_t n_tokens;
    float *out; /* [n_tokens, w.n], rows out_stride bytes apart */
    size_t out_stride;
    /* NULL: each block runs all of K, folds its segments and writes out. Else: block z runs
     * segments [z segs_per_block, (z + 1) segs_per_block) and writes segment j's sums to
     * partial[(j n_tokens + t) w.n + n]; gemm_fold_kernel writes out. */
    float *partial;
    int64_t segs_per_block;
    int64_t seg_chunks; /* chunks per segment (gemm_seg_chunks(w.k)) */
} gemm_args;

/* Up to LOOM_K_GEMM_MULTI products of one x in one launch (matmul_multi: q, k and v; gate and
 * up): weight j takes the row tiles (blockIdx.y) [tile0[j], tile0[j + 1]) and, splitting, the
 * fold's blocks [fold0[j], fold0[j + 1]). Each output gets the bits of its own product. */
typedef struct gemm_multi {
    gemm_args m[LOOM_K_GEMM_MULTI];
    int32_t n;
    int32_t tile0[LOOM_K_GEMM_MULTI + 1], fold0[LOOM_K_GEMM_MULTI + 1];
    /* the wgmma kernel's x as BF16 rows x16_stride bytes apart (gemm_x16_kernel) */
    const uint8_t *x16;
    size_t x16_stride;
    int32_t
        plain; /* 1: BF16 weights on gemm_wg_kernel, not warp-specialised (LOOM_CUDA_GEMM_WS=0) */
} gemm_multi;

/* The product block b (a row tile or a fold block, by the prefix `first`) belongs to, and the
 * block's place in it. Selected field by field: no local copy of the parameters. */
static __device__ __forceinline__ int gemm_pick_index(const gemm_multi &mm, const int32_t *first,
                                                      int b) {
    int j = 0;
#pragma unroll
    for (int i = 1; i < LOOM_K_GEMM_MULTI; i++)
        if (i < mm.n && b >= first[i]) j = i;
    return j;
}
static __device__ __forceinline__ gemm_args gemm_pick(const gemm_multi &mm, const int32_t *first,
                                                      int b, int *local) {
    const int j = gemm_pick_index(mm, first, b);
    gemm_args a = mm.m[0];
#pragma unroll
    for (int i = 1; i < LOOM_K_GEMM_MULTI; i++)
        if (j == i) a = mm.m[i];
    *local = b - first[j];
    return a;
}

/* One chunk of the block's operands: the weight rows' decoded values and the tokens'
 * activations, each row K-contiguous: float32 (LOOM_K_MATH_F32), or rounded to BF16
 * (LOOM_K_MATH_BF16), two values a word (the lower K in the low half, as the mma takes them):
 * rows of 20 words, 16 and 4 of padding, so that the fragment reads — lane (g, i) a word i
 * (+ 4) of row g — hit 32 different banks, and the 16-byte stores of a row's quarter too. */
#define GEMM_LDW 20
template <int MATH> struct gemm_tile {
    float w[GEMM_ROWS][GEMM_LD];
    float x[GEMM_TOKENS][GEMM_LD];
};
template <> struct gemm_tile<LOOM_K_MATH_BF16> {
    uint32_t w[GEMM_ROWS][GEMM_LDW];
    uint32_t x[GEMM_TOKENS][GEMM_LDW];
};

/* ---- the stage of stored weight bytes ------------------------------------------------------ */

/* Values per block of the format (1: a float format) and the block's bytes. */
template <int T> static __host__ __device__ constexpr int gemm_block_values() {
    return T == LOOM_K_Q4_K || T == LOOM_K_Q5_K || T == LOOM_K_Q6_K   ? 256
           : T == LOOM_K_Q8_0 || T == LOOM_K_Q4_0 || T == LOOM_K_Q5_0 ? 32
                                                                      : 1;
}
template <int T> static __host__ __device__ constexpr int gemm_block_bytes() {
    return T == LOOM_K_F32                       ? 4
           : T == LOOM_K_F16 || T == LOOM_K_BF16 ? 2
           : T == LOOM_K_FP8_ROWS                ? 1
           : T == LOOM_K_Q8_0                    ? 34
           : T == LOOM_K_Q4_0                    ? 18
           : T == LOOM_K_Q5_0                    ? 22
           : T == LOOM_K_Q4_K                    ? 144
           : T == LOOM_K_Q5_K                    ? 176
                                                 : 210;
}
/* Chunks per stage: a K-quant super-block, 8 blocks of q4_0 / q5_0 and 4 of q8_0 (136 to 210
 * bytes), 128 bytes of the float formats. Small enough that two tiles and the stage fit the
 * default 48 KB of shared memory (all but q6_K: 50.4 KB, which opts in). */
template <int T> static __host__ __device__ constexpr int gemm_stage_chunks() {
    return T == LOOM_K_Q8_0             ? 4
           : gemm_block_values<T>() > 1 ? 8
                                        : 128 / (32 * gemm_block_bytes<T>());
}
static_assert(GEMM_SEG_CHUNKS % 8 == 0, "a segment holds whole stages (8 chunks at most)");

/* Chunks per segment for rows of k values: a multiple of GEMM_SEG_CHUNKS giving at most
 * GEMM_MAX_SEGS segments. A rule on k alone: every product of one weight sums alike. */
static __host__ __device__ __forceinline__ int64_t gemm_seg_chunks(int64_t k) {
    const int64_t units = loom_cdiv(loom_cdiv(k, 32), GEMM_SEG_CHUNKS);
    return GEMM_SEG_CHUNKS * loom_cdiv(units, GEMM_MAX_SEGS);
}
template <int T> static __host__ __device__ constexpr int gemm_stage_bytes() {
    return gemm_stage_chunks<T>() * 32 / gemm_block_values<T>() * gemm_block_bytes<T>();
}
/* Bytes between staged rows: an odd number of 4-byte words, so that 32 threads reading the same
 * byte of 32 rows hit 32 banks. FP8 rows are read 16 bytes at a time (dequant.cuh): a multiple
 * of 16 that is 16 past a multiple of 128 spreads each 8-thread phase over the 32 banks. */
template <int T> static __host__ __device__ constexpr int gemm_stage_pitch() {
    return T == LOOM_K_FP8_ROWS ? 144 : (((gemm_stage_bytes<T>() + 3) / 4) | 1) * 4;
}
template <int T, int MATH> static __host__ __device__ constexpr size_t gemm_smem_bytes() {
    return 2 * sizeof(gemm_tile<MATH>) + (size_t)GEMM_ROWS * gemm_stage_pitch<T>();
}

/* An unsigned integer of U bytes. */
template <int U> struct gemm_piece;
template <> struct gemm_piece<4> { typedef unsigned int type; };
template <> struct gemm_piece<2> { typedef unsigned short type; };
template <> struct gemm_piece<1> { typedef unsigned char type; };

/* Stage s of the block's ROWS rows — the stored bytes of their values [s V, s V + V) — into
 * raw, by the block's THREADS threads in U-byte pieces (U divides the weights' address, stride
 * and stage bytes), BATCH loads in flight before their stores (more would cost registers the
 * kernels' residency does not leave). The bytes of the piece a row's values end inside (the
 * last stage of a row whose K ends inside it) are copied one by one; bytes past the row's
 * values and rows past the last are not read, and nothing decodes them. */
template <int T, int U, int ROWS, int THREADS>
static __device__ __forceinline__ void gemm_stage_copy(const gemm_args &a, int64_t n0, int64_t s,
                                                       uint8_t *raw) {
    typedef typename gemm_piece<U>::type piece;
    constexpr int B = gemm_stage_bytes<T>(), P = gemm_stage_pitch<T>(), PIECES = B / U;
    constexpr int ITERS = (ROWS * PIECES + THREADS - 1) / THREADS, BATCH = 6;
    const int64_t row_bytes = a.w.k / gemm_block_values<T>() * gemm_block_bytes<T>();
    const int64_t left = row_bytes - s * B;
    const int valid = left < B ? (int)left : B, whole = valid / U * U;
    const int rows = a.w.n - n0 < ROWS ? (int)(a.w.n - n0) : ROWS;
    const uint8_t *src = (const uint8_t *)a.w.data + (size_t)n0 * a.w.stride + (size_t)(s * B);
#pragma unroll 1 /* one batch in flight at a time: unrolled, every load would be hoisted */
    for (int i0 = 0; i0 < ITERS; i0 += BATCH) {
        piece buf[BATCH];
#pragma unroll
        for (int i = 0; i < BATCH; i++) {
            const int p = threadIdx.x + THREADS * (i0 + i), r = p / PIECES;
            const int o = U * (p - r * PIECES);
            if (i0 + i < ITERS && r < rows && o < whole)
                buf[i] = __ldg((const piece *)(src + (size_t)r * a.w.stride + o));
        }
#pragma unroll
        for (int i = 0; i < BATCH; i++) {
            const int p = threadIdx.x + THREADS * (i0 + i), r = p / PIECES;
            const int o = U * (p - r * PIECES);
            if (i0 + i < ITERS && r < rows && o < whole) *(piece *)(raw + r * P + o) = buf[i];
        }
    }
    if (whole < valid)
        for (int r = threadIdx.x; r < rows; r += THREADS)
            for (int o = whole; o < valid; o++) raw[r * P + o] = src[(size_t)r * a.w.stride + o];
}

/* The same in the widest pieces w_align allows (the low bits of the weights' address, stride
 * and stage bytes). */
template <int T, int ROWS, int THREADS>
static __device__ __forceinline__ void gemm_stage(const gemm_args &a, int64_t n0, int64_t s,
                                                  unsigned w_align, uint8_t *raw) {
    if (w_align == 0)
        gemm_stage_copy<T, 4, ROWS, THREADS>(a, n0, s, raw);
    else if ((w_align & 1) == 0)
        gemm_stage_copy<T, 2, ROWS, THREADS>(a, n0, s, raw);
    else
        gemm_stage_copy<T, 1, ROWS, THREADS>(a, n0, s, raw);
}

/* The low bits of the weights' address, stride and stage bytes: the stage copy's pieces. */
template <int T> static __device__ __forceinline__ unsigned gemm_w_align(const gemm_args &a) {
    return (unsigned)(((uintptr_t)a.w.data | a.w.stride | (size_t)gemm_stage_bytes<T>()) & 3);
}

/* The chunks [c_begin, c_end) a block runs: all of K, or, splitting, its group's segments
 * (blockIdx.z). c_begin is a segment's start. */
static __device__ __forceinline__ void gemm_chunk_range(const gemm_args &a, int64_t *c_begin,
                                                        int64_t *c_end) {
    const int64_t n_chunks = loom_cdiv(a.w.k, 32);
    *c_begin = a.partial != NULL ? (int64_t)blockIdx.z * a.segs_per_block * a.seg_chunks : 0;
    *c_end = a.partial != NULL && *c_begin + a.segs_per_block * a.seg_chunks < n_chunks
                 ? *c_begin + a.segs_per_block * a.seg_chunks
                 : n_chunks;
}

/* ---- a chunk ------------------------------------------------------------------------------- */

/* Staged row r's values of chunk cl (of the staged stage s) into v; zeros past the last row. */
template <int T>
static __device__ __forceinline__ void gemm_decode(const gemm_args &a, const uint8_t *raw,
                                                   int64_t n0, int r, int64_t s, int cl,
                                                   float v[32]) {
    if (n0 + r < a.w.n) {
        /* the stage's values start at s * 32 * (chunks per stage): K relative to them */
        const int64_t k_stage = a.w.k - s * 32 * gemm_stage_chunks<T>();
        loom_dequant32<T>(raw + r * gemm_stage_pitch<T>(), cl, k_stage, v);
    } else {
#pragma unroll
        for (int j = 0; j < 32; j++) v[j] = 0.0f;
    }
}
/* The x pieces of x thread u (0..63: threads 64..127): for j = 0..7, token 8 j + gemm_x_row(u),
 * values 4 gemm_x_quad(u) .. + 3 of the chunk. A warp takes 8 tokens by 4 pieces (its half of
 * the chunk), lanes 4b .. 4b + 3 token bitrev3(b): shared stores are served a half warp (8 bytes
 * a lane) or a quarter warp (16) at a time, and the rows they take (BF16: tokens 0, 4, 2, 6 of
 * GEMM_LDW = 20 words, banks 0, 16, 8, 24 on; float32: tokens 0, 4 of GEMM_LD = 36, banks 0 and
 * 16 on) fill the 32 banks once: 2 wavefronts a BF16 store, 4 a float32 one, the least. (One
 * token of 8 pieces a quarter warp, as before, was as good for float32 but 2-way for BF16; tokens
 * in order, 2-way for float32.) Global reads: a token's 4 pieces are 64 contiguous bytes. */
static __device__ __forceinline__ int gemm_x_row(int u) {
    const int b = (u & 31) >> 2;
    return (b & 1) << 2 | (b & 2) | b >> 2;
}
static __device__ __forceinline__ int gemm_x_quad(int u) {
    return (u & 3) | (u >> 5) << 2;
}

/* This thread's share of chunk c (chunk cl of the staged stage s) into v: threads 0..63 decode
 * staged row tid, threads 64..127 read eight 4-value pieces of the tokens' activations (zeros
 * past the last token and past k: x is never read beyond its rows' k values). x_vec: x and its
 * stride are 16-byte aligned, so a whole piece is one 16-byte load. */
template <int T>
static __device__ __forceinline__ void gemm_fetch(const gemm_args &a, const uint8_t *raw,
                                                  int64_t n0, int64_t t0, int64_t s, int cl,
                                                  int64_t c, bool x_vec, float v[32]) {
    const int64_t k = a.w.k;
    if (threadIdx.x < GEMM_ROWS) {
        gemm_decode<T>(a, raw, n0, (int)threadIdx.x, s, cl, v);
    } else {
        const int u = threadIdx.x - GEMM_ROWS;
        const int64_t col = 32 * c + 4 * gemm_x_quad(u);
#pragma unroll
        for (int j = 0; j < 8; j++) {
            const int64_t t = t0 + 8 * j + gemm_x_row(u);
            float4 q = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            if (t < a.n_tokens) {
                const float *xr = (const float *)((const char *)a.x + (size_t)t * a.x_stride);
                if (x_vec && col + 4 <= k) {
                    q = *(const float4 *)(xr + col);
                } else {
                    if (col < k) q.x = xr[col];
                    if (col + 1 < k) q.y = xr[col + 1];
                    if (col + 2 < k) q.z = xr[col + 2];
                    if (col + 3 < k) q.w = xr[col + 3];
                }
            }
            v[4 * j] = q.x;
            v[4 * j + 1] = q.y;
            v[4 * j + 2] = q.z;
            v[4 * j + 3] = q.w;
        }
    }
}

/* v (gemm_fetch's share) into the tile, rounded to BF16 where the tile holds BF16 (nearest
 * even: each value's rounding depends on the value alone). */
static __device__ __forceinline__ void gemm_put(gemm_tile<LOOM_K_MATH_BF16> &s, const float v[32]) {
    uint32_t p[16];
#pragma unroll
    for (int j = 0; j < 16; j++) p[j] = loom_mma16_pack<LOOM_MMA16_BF16>(v[2 * j], v[2 * j + 1]);
    if (threadIdx.x < GEMM_ROWS) {
        uint32_t *d = s.w[threadIdx.x];
#pragma unroll
        for (int j = 0; j < 4; j++)
            *(uint4 *)(d + 4 * j) = make_uint4(p[4 * j], p[4 * j + 1], p[4 * j + 2], p[4 * j + 3]);
    } else {
        const int u = threadIdx.x - GEMM_ROWS;
#pragma unroll
        for (int j = 0; j < 8; j++)
            *(uint2 *)&s.x[8 * j + gemm_x_row(u)][2 * gemm_x_quad(u)] =
                make_uint2(p[2 * j], p[2 * j + 1]);
    }
}
static __device__ __forceinline__ void gemm_put(gemm_tile<LOOM_K_MATH_F32> &s, const float v[32]) {
    if (threadIdx.x < GEMM_ROWS) {
        float *d = s.w[threadIdx.x];
#pragma unroll
        for (int j = 0; j < 8; j++)
            *(float4 *)(d + 4 * j) =
                make_float4(v[4 * j], v[4 * j + 1], v[4 * j + 2], v[4 * j + 3]);
    } else {
        const int u = threadIdx.x - GEMM_ROWS;
#pragma unroll
        for (int j = 0; j < 8; j++)
            *(float4 *)&s.x[8 * j + gemm_x_row(u)][4 * gemm_x_quad(u)] =
                make_float4(v[4 * j], v[4 * j + 1], v[4 * j + 2], v[4 * j + 3]);
    }
}

/* acc += the warp's 32 rows (from wr) times its 32 tokens (from wt) over one chunk: four
 * k-steps of 8; in each, the 4 token tiles' fragments are read once, then each 16-row half
 * runs its instructions in passes over the 4 tiles. W_EXACT: the weights are exact TF32. */
template <bool W_EXACT>
static __device__ __forceinline__ void gemm_chunk(const gemm_tile<LOOM_K_MATH_F32> &s, int lane,
                                                  int wr, int wt, int nt, float acc[2][4][4]) {
    /* The warp's token tiles holding no token of the step (nt: tokens in the block) are
     * skipped: an mma's output column depends on its own column only, so this changes no bits
     * of the others. Warp-uniform. */
    if (wt >= nt) return;
    const int n_ni = nt - wt >= 32 ? 4 : (nt - wt + 7) / 8;
#pragma unroll
    for (int kk = 0; kk < 32; kk += 8) {
        uint32_t bh[4][2], bl[4][2];
#pragma unroll
        for (int ni = 0; ni < 4; ni++)
#pragma unroll
            for (int r = 0; r < 2; r++)
                if (ni < n_ni)
                    loom_tf32_split(
                        s.x[wt + 8 * ni + loom_mma_b_col(lane)][kk + loom_mma_b_row(lane, r)],
                        &bh[ni][r], &bl[ni][r]);
#pragma unroll
        for (int mi = 0; mi < 2; mi++) {
            uint32_t ah[4], al[4];
#pragma unroll
            for (int r = 0; r < 4; r++) {
                const float f =
                    s.w[wr + 16 * mi + loom_mma_a_row(lane, r)][kk + loom_mma_a_col(lane, r)];
                if constexpr (W_EXACT)
                    ah[r] = __float_as_uint(f);
                else
                    loom_tf32_split(f, &ah[r], &al[r]);
            }
            /* smallest terms first, as loom_mma_3xtf32 and loom_mma_2xtf32_b */
            if constexpr (!W_EXACT) {
#pragma unroll
                for (int ni = 0; ni < 4; ni++)
                    if (ni < n_ni) loom_mma_tf32(acc[mi][ni], al, bh[ni]);
            }
#pragma unroll
            for (int ni = 0; ni < 4; ni++)
                if (ni < n_ni) loom_mma_tf32(acc[mi][ni], ah, bl[ni]);
#pragma unroll
            for (int ni = 0; ni < 4; ni++)
                if (ni < n_ni) loom_mma_tf32(acc[mi][ni], ah, bh[ni]);
        }
    }
}

/* The same over a BF16 tile: two k-steps of 16, one m16n8k16 per row half and token tile. The
 * fragments are words of the tile (two values adjacent in K). */
static __device__ __forceinline__ void gemm_chunk16(const gemm_tile<LOOM_K_MATH_BF16> &s, int lane,
                                                    int wr, int wt, int nt, float acc[2][4][4]) {
    if (wt >= nt) return;
    const int n_ni = nt - wt >= 32 ? 4 : (nt - wt + 7) / 8;
#pragma unroll
    for (int kk = 0; kk < 32; kk += 16) {
        uint32_t b[4][2];
#pragma unroll
        for (int ni = 0; ni < 4; ni++)
#pragma unroll
            for (int r = 0; r < 2; r++)
                if (ni < n_ni)
                    b[ni][r] = s.x[wt + 8 * ni + loom_mma16_b_col(lane)]
                                  [(kk + loom_mma16_b_row(lane, r)) / 2];
#pragma unroll
        for (int mi = 0; mi < 2; mi++) {
            uint32_t a[4];
#pragma unroll
            for (int r = 0; r < 4; r++)
                a[r] = s.w[wr + 16 * mi + loom_mma16_a_row(lane, r)]
                          [(kk + loom_mma16_a_col(lane, r)) / 2];
#pragma unroll
            for (int ni = 0; ni < 4; ni++)
                if (ni < n_ni) loom_mma16<LOOM_MMA16_BF16>(acc[mi][ni], a, b[ni]);
        }
    }
}

/* ---- the kernel ---------------------------------------------------------------------------- */

/* grid (token tiles, row tiles, K groups): the blocks of one weight tile run side by side and
 * share its reads through L2. Shared memory: two tiles, then the stage (gemm_smem_bytes). Three
 * blocks per SM: the segment's accumulators and the fold's take 64 registers of the 168. */
template <int T, int MATH>
static __global__ void __launch_bounds__(GEMM_THREADS, 3) gemm_kernel(gemm_multi mm) {
    int row_tile = 0;
    const gemm_args a = gemm_pick(mm, mm.tile0, (int)blockIdx.y, &row_tile);
    constexpr bool W_EXACT = T == LOOM_K_F16 || T == LOOM_K_BF16 || T == LOOM_K_FP8_ROWS;
    constexpr int SC = gemm_stage_chunks<T>();
    LOOM_K_DYN_SMEM(gemm_sm);
    gemm_tile<MATH> *tiles = (gemm_tile<MATH> *)gemm_sm;
    uint8_t *raw = gemm_sm + 2 * sizeof(gemm_tile<MATH>);
    const int64_t t0 = (int64_t)blockIdx.x * GEMM_TOKENS, n0 = (int64_t)row_tile * GEMM_ROWS;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int wr = 32 * (warp & 1), wt = 32 * (warp >> 1);
    const int nt = a.n_tokens - t0 < GEMM_TOKENS ? (int)(a.n_tokens - t0) : GEMM_TOKENS;
    const int64_t seg_chunks = a.seg_chunks;
    int64_t c_begin, c_end;
    gemm_chunk_range(a, &c_begin, &c_end);
    const bool x_vec = (((uintptr_t)a.x | a.x_stride) & 15) == 0;
    const unsigned w_align = gemm_w_align<T>(a);

    float acc[2][4][4], fold[2][4][4];
#pragma unroll
    for (int mi = 0; mi < 2; mi++)
#pragma unroll
        for (int ni = 0; ni < 4; ni++)
#pragma unroll
            for (int r = 0; r < 4; r++) acc[mi][ni][r] = fold[mi][ni][r] = 0.0f;

    for (int64_t c = c_begin; c < c_end; c++) {
        const int64_t s = c / SC;
        const int cl = (int)(c - s * SC);
        if (cl == 0) {
            /* The stage before was last read by the decodes of chunk c - 1, which every thread
             * finished before passing that chunk's barrier. */
            gemm_stage<T, GEMM_ROWS, GEMM_THREADS>(a, n0, s, w_align, raw);
            __syncthreads();
        }
        /* Tile c & 1 was last read in chunk c - 2, which every warp finished before passing
         * the barrier of chunk c - 1 (c_begin is even). */
        gemm_tile<MATH> &tile = tiles[c & 1];
        float v[32];
        gemm_fetch<T>(a, raw, n0, t0, s, cl, c, x_vec, v);
        gemm_put(tile, v);
        __syncthreads();
        if constexpr (MATH == LOOM_K_MATH_BF16)
            gemm_chunk16(tile, lane, wr, wt, nt, acc);
        else
            gemm_chunk<W_EXACT>(tile, lane, wr, wt, nt, acc);
        if ((c + 1) % seg_chunks != 0 && c + 1 != c_end) continue;
        /* the end of a segment: fold its sums (or set them apart), then start the next at 0 */
        const int64_t seg = c / seg_chunks;
#pragma unroll
        for (int mi = 0; mi < 2; mi++)
#pragma unroll
            for (int ni = 0; ni < 4; ni++)
#pragma unroll
                for (int r = 0; r < 4; r++) {
                    if (a.partial == NULL) {
                        fold[mi][ni][r] += acc[mi][ni][r];
                    } else {
                        const int64_t n = n0 + wr + 16 * mi + loom_mma_c_row(lane, r);
                        const int64_t t = t0 + wt + 8 * ni + loom_mma_c_col(lane, r);
                        if (n < a.w.n && t < a.n_tokens)
                            a.partial[(seg * a.n_tokens + t) * a.w.n + n] = acc[mi][ni][r];
                    }
                    acc[mi][ni][r] = 0.0f;
                }
    }
    if (a.partial != NULL) return;

#pragma unroll
    for (int mi = 0; mi < 2; mi++)
#pragma unroll
        for (int h = 0; h < 2; h++) { /* accumulators 2h, 2h + 1: one weight row */
            const int64_t n = n0 + wr + 16 * mi + loom_mma_c_row(lane, 2 * h);
            if (n >= a.w.n) continue;
            float row_scale = 1.0f;
            if constexpr (T == LOOM_K_FP8_ROWS)
                row_scale = loom_fp8_rows_scale256(
                    (const uint8_t *)a.w.data + (size_t)n * a.w.stride, a.w.k);
#pragma unroll
            for (int ni = 0; ni < 4; ni++)
#pragma unroll
                for (int e = 0; e < 2; e++) {
                    const int r = 2 * h + e;
                    const int64_t t = t0 + wt + 8 * ni + loom_mma_c_col(lane, r);
                    if (t >= a.n_tokens) continue;
                    float d = fold[mi][ni][r];
                    if constexpr (T == LOOM_K_FP8_ROWS) d *= row_scale; /* once per dot */
                    ((float *)((char *)a.out + (size_t)t * a.out_stride))[n] = d;
                }
        }
}

/* out[t][n] = the left fold of the n_segs segment sums partial[(j n_tokens + t) w.n + n], in
 * the kernel's order and arithmetic (0 + s0, then + s1, ...), times the FP8 rows' scale. One
 * thread per output, consecutive threads on consecutive n. */
static __global__ void __launch_bounds__(256) gemm_fold_kernel(gemm_multi mm, int64_t n_segs) {
    int fb = 0;
    const gemm_args a = gemm_pick(mm, mm.fold0, (int)blockIdx.x, &fb);
    const int64_t n = (int64_t)fb * 256 + threadIdx.x, t = blockIdx.y;
    if (n >= a.w.n) return;
    float d = 0.0f;
    for (int64_t j = 0; j < n_segs; j++) d += a.partial[(j * a.n_tokens + t) * a.w.n + n];
    if (a.w.type == LOOM_K_FP8_ROWS)
        d *= loom_fp8_rows_scale256((const uint8_t *)a.w.data + (size_t)n * a.w.stride, a.w.k);
    ((float *)((char *)a.out + (size_t)t * a.out_stride))[n] = d;
}

#include "gemm_wgmma.cuh"

/* How a product splits K across blocks: the K groups (1: no split) and segments per group. A
 * rule on the shapes, the kernel and the device's size only; any rule gives the same bits.
 * Splits while the grid of tiles holds fewer blocks than the SMs hold at once (R, the kernel's
 * residency: 3 or 1) less one per SM where R > 1, into enough groups for R per SM, where the
 * segment sums' traffic (written, then read: 8 bytes per segment, token and row) stays within an
 * eighth of the weights' bytes and the scratch within GEMM_WORK_MAX. */
typedef struct gemm_plan {
    int64_t groups, segs_per_block, n_segs, seg_chunks;
    size_t partial_bytes; /* 0: no split */
} gemm_plan;

static __host__ __device__ gemm_plan gemm_plan_of(const loom__k_weight *const *ws, int n,
                                                  int64_t n_tokens, int n_sms, int math) {
    const int64_t sc = gemm_seg_chunks(ws[0]->k);
    gemm_plan p = {1, 0, loom_cdiv(loom_cdiv(ws[0]->k, 32), sc), sc, 0};
    p.segs_per_block = p.n_segs;
    int64_t row_tiles = 0, rows = 0;
    for (int j = 0; j < n; j++) {
        row_tiles += loom_cdiv(ws[j]->n, gemm_tile_rows(math));
        rows += ws[j]->n;
    }
    const int64_t tiles = loom_cdiv(n_tokens, gemm_tile_tokens(math)) * row_tiles;
    const int res = gemm_residency(math);
    if (n_sms <= 0 || p.n_segs < 2 || tiles >= (res > 1 ? res - 1 : 1) * (int64_t)n_sms) return p;
    if (8.0 * (double)p.n_segs * (double)n_tokens > (double)ws[0]->stride / 8) return p;
    const double bytes = 4.0 * (double)p.n_segs * (double)n_tokens * (double)rows;
    if (bytes > (double)GEMM_WORK_MAX) return p;
    int64_t groups = loom_cdiv(res * (int64_t)n_sms, tiles);
    if (groups > p.n_segs) groups = p.n_segs;
    p.segs_per_block = loom_cdiv(p.n_segs, groups);
    p.groups = loom_cdiv(p.n_segs, p.segs_per_block);
    if (p.groups > 1)
        p.partial_bytes = (size_t)bytes;
    else
        p.segs_per_block = p.n_segs;
    return p;
}

/* The launch's parameters for products j < n of one x (each weight's row tiles, of the math's
 * kernel, after the one before's; partials, splitting, the same way in work), under plan pl. */
static __host__ __device__ gemm_multi gemm_multi_of(const loom__k_weight *const *ws, int n,
                                                    const float *x, size_t x_stride,
                                                    int64_t n_tokens, float *const *outs,
                                                    const size_t *out_strides, const gemm_plan &pl,
                                                    float *work, int math) {
    gemm_multi mm = {};
    mm.n = n;
    size_t part_at = 0;
    for (int j = 0; j < n; j++) {
        gemm_args &a = mm.m[j];
        a.w = *ws[j];
        a.x = x;
        a.x_stride = x_stride;
        a.n_tokens = n_tokens;
        a.out = outs[j];
        a.out_stride = out_strides[j];
        a.partial = pl.partial_bytes != 0 ? work + part_at : NULL;
        a.segs_per_block = pl.segs_per_block;
        a.seg_chunks = pl.seg_chunks;
        part_at += (size_t)pl.n_segs * (size_t)n_tokens * (size_t)ws[j]->n;
        mm.tile0[j + 1] = mm.tile0[j] + (int32_t)loom_cdiv(ws[j]->n, gemm_tile_rows(math));
        mm.fold0[j + 1] = mm.fold0[j] + (int32_t)loom_cdiv(ws[j]->n, 256);
    }
    for (int j = n + 1; j <= LOOM_K_GEMM_MULTI; j++) {
        mm.tile0[j] = mm.tile0[n];
        mm.fold0[j] = mm.fold0[n];
    }
    return mm;
}

/* ---- launch -------------------------------------------------------------------------------- */

#if LOOM_K_HOST_CODE /* tests/kernels_emu/ launches the kernel itself */
#include <mutex>

/* The warp-specialised GEMM's tensor maps, encoded once rather than on every launch (a decode
 * step without CUDA graphs launches some 350 matmuls, each with 2 to 5 maps). A map is a function
 * of its arguments alone, so one cached under all of them is right whenever they match: a freed
 * weight's address taken by another of the same shape maps the same bytes, and a step of other
 * tokens has other sizes. Direct-mapped by a hash of the arguments, behind a mutex. The encoder
 * the cache stands before is the driver's (one for every device of the process). */
#define GEMM_TMAP_CACHE 512
struct gemm_tmap_key {
    loom__k_tmap_encode_fn enc;
    void *addr;
    uint64_t dims[2], stride;
    uint32_t box[2];
    int dtype, l2;
};
struct gemm_tmap_entry {
    bool used;
    gemm_tmap_key key;
    loom_k_tmap map;
};
static gemm_tmap_entry g_tmap_cache[GEMM_TMAP_CACHE];
static std::mutex g_tmap_mu;
static std::atomic<loom__k_tmap_encode_fn> g_tmap_driver;

/* loom__k_tmap_encode_fn over the cache: the 2-D, unit-stride, unswizzled maps gemm_tmaps_of
 * asks for; anything else goes to the driver as it is. */
static int gemm_tmap_encode_cached(void *map, int dtype, uint32_t rank, void *addr,
                                   const uint64_t *dims, const uint64_t *strides,
                                   const uint32_t *box, const uint32_t *elem_strides,
                                   int interleave, int swizzle, int l2, int oob) {
    const loom__k_tmap_encode_fn enc = g_tmap_driver.load(std::memory_order_relaxed);
    if (enc == NULL) return 1;
    if (rank != 2 || elem_strides[0] != 1 || elem_strides[1] != 1 || interleave != 0 ||
        swizzle != 0 || oob != 0)
        return enc(map, dtype, rank, addr, dims, strides, box, elem_strides, interleave, swizzle,
                   l2, oob);
    gemm_tmap_key k;
    memset(&k, 0, sizeof k); /* padding too: the key is compared and hashed as bytes */
    k.enc = enc;
    k.addr = addr;
    k.dims[0] = dims[0], k.dims[1] = dims[1], k.stride = strides[0];
    k.box[0] = box[0], k.box[1] = box[1];
    k.dtype = dtype, k.l2 = l2;
    uint64_t h = 0xcbf29ce484222325ull; /* FNV-1a */
    for (size_t b = 0; b < sizeof k; b++)
        h = (h ^ ((const unsigned char *)&k)[b]) * 0x100000001b3ull;
    gemm_tmap_entry &e = g_tmap_cache[h % GEMM_TMAP_CACHE];
    {
        std::lock_guard<std::mutex> lock(g_tmap_mu);
        if (e.used && memcmp(&e.key, &k, sizeof k) == 0) {
            memcpy(map, &e.map, sizeof e.map);
            return 0;
        }
    }
    const int rc =
        enc(map, dtype, rank, addr, dims, strides, box, elem_strides, interleave, swizzle, l2, oob);
    if (rc != 0) return rc;
    std::lock_guard<std::mutex> lock(g_tmap_mu);
    e.used = true;
    e.key = k;
    memcpy(&e.map, map, sizeof e.map);
    return 0;
}
template <int T, int MATH>
static loom_status gemm_launch(cudaStream_t stream, const gemm_multi &mm, const gemm_plan &pl,
                               loom__k_tmap_encode_fn enc) {
    const int64_t gx = loom_cdiv(mm.m[0].n_tokens, gemm_tile_tokens(MATH));
    const int64_t gy = mm.tile0[mm.n];
    if (gx > 0x7fffffff || gy > 65535 || pl.groups > 65535 ||
        (pl.partial_bytes != 0 && (mm.m[0].n_tokens > 65535 || mm.fold0[mm.n] > 0x7fffffff)))
        LOOM_K_UNSUPPORTED("cuda: matmul (gemm) of %lld tokens by %lld row tiles",
                           (long long)mm.m[0].n_tokens, (long long)gy);
    const dim3 grid((unsigned)gx, (unsigned)gy, (unsigned)pl.groups);
    static std::atomic<int> optin[LOOM_K_OPTIN_DEVICES]; /* past 48 KB (sm_80+ allow 163 KB) */
    if constexpr (MATH == LOOM_K_MATH_BF16_WGMMA) {
        const int64_t k = mm.m[0].w.k, pieces = (int64_t)gemm_x16_stride(k) / 16;
        if (loom_cdiv(pieces, 256) > 65535)
            LOOM_K_UNSUPPORTED("cuda: matmul (wgmma gemm) of rows of %lld values", (long long)k);
        LOOM_K_LAUNCH(
            (gemm_x16_kernel),
            (dim3((unsigned)mm.m[0].n_tokens, (unsigned)loom_cdiv(pieces, 256)), 256, 0, stream),
            mm.m[0].x, mm.m[0].x_stride, k, (uint8_t *)mm.x16);
        LOOM_K_LAUNCHED("gemm (wgmma): x to bf16");
        /* BF16 rows 16-byte aligned are copied to their tiles as stored */
        bool direct = T == LOOM_K_BF16;
        for (int j = 0; j < mm.n; j++)
            direct = direct && (((uintptr_t)mm.m[j].w.data | mm.m[j].w.stride) & 15) == 0;
        if constexpr (T == LOOM_K_BF16) {
            if (direct && !mm.plain) { /* warp-specialised */
                constexpr size_t smem = gemm_ws_smem_bytes();
                static std::atomic<int> optin_w[LOOM_K_OPTIN_DEVICES];
                static std::atomic<int> regs_w[LOOM_K_OPTIN_DEVICES];
                loom_status st = loom_k_regs_check(gemm_wg_ws_kernel<T>, GEMM_WS_LAUNCH_REGS,
                                                   regs_w, "gemm (wgmma, warp-specialised)");
                if (st == LOOM_OK)
                    st = loom_k_smem_optin(gemm_wg_ws_kernel<T>, smem, optin_w,
                                           "gemm (wgmma, warp-specialised)");
                if (st != LOOM_OK) return st;
                gemm_tmaps tm = {}; /* none where the encoder is absent or refuses a map */
                static std::atomic<int> refused_told;
                if (enc != NULL) g_tmap_driver.store(enc, std::memory_order_relaxed);
                if (enc != NULL && !gemm_tmaps_of(mm, gemm_tmap_encode_cached, &tm) &&
                    refused_told.exchange(1) == 0)
                    loom__log(LOOM_LOG_WARN,
                              "cuda: the driver refused a tensor map of the wgmma GEMM (k %lld, "
                              "%lld tokens): its copies are cp.async's where it does",
                              (long long)mm.m[0].w.k, (long long)mm.m[0].n_tokens);
                LOOM_K_LAUNCH((gemm_wg_ws_kernel<T>), (grid, GEMM_WS_THREADS, smem, stream), mm,
                              tm);
            } else if (direct) {
                constexpr size_t smem = gemm_wg_smem_bytes<T, true>();
                static std::atomic<int> optin_d[LOOM_K_OPTIN_DEVICES];
                const loom_status st =
                    loom_k_smem_optin(gemm_wg_kernel<T, true>, smem, optin_d, "gemm (wgmma)");
                if (st != LOOM_OK) return st;
                LOOM_K_LAUNCH((gemm_wg_kernel<T, true>), (grid, GEMM_WG_THREADS, smem, stream), mm);
            }
        }
        if (!direct) {
            constexpr size_t smem = gemm_wg_smem_bytes<T, false>();
            const loom_status st =
                loom_k_smem_optin(gemm_wg_kernel<T, false>, smem, optin, "gemm (wgmma)");
            if (st != LOOM_OK) return st;
            LOOM_K_LAUNCH((gemm_wg_kernel<T, false>), (grid, GEMM_WG_THREADS, smem, stream), mm);
        }
        LOOM_K_LAUNCHED("gemm (wgmma)");
    } else {
        constexpr size_t smem = gemm_smem_bytes<T, MATH>();
        const loom_status st = loom_k_smem_optin(gemm_kernel<T, MATH>, smem, optin, "gemm");
        if (st != LOOM_OK) return st;
        LOOM_K_LAUNCH((gemm_kernel<T, MATH>), (grid, GEMM_THREADS, smem, stream), mm);
        LOOM_K_LAUNCHED("gemm");
    }
    if (pl.partial_bytes == 0) return LOOM_OK;
    LOOM_K_LAUNCH((gemm_fold_kernel),
                  (dim3((unsigned)mm.fold0[mm.n], (unsigned)mm.m[0].n_tokens), 256, 0, stream), mm,
                  pl.n_segs);
    LOOM_K_LAUNCHED("gemm fold");
    return LOOM_OK;
}

extern "C" size_t loom__cuda_gemm_multi_work_bytes(int n, const loom__k_weight *const *ws,
                                                   int64_t n_tokens, int n_sms, int math) {
    if (n < 1 || n > LOOM_K_GEMM_MULTI || n_tokens <= 0) return 0;
    for (int j = 0; j < n; j++)
        if (ws[j]->n <= 0 || ws[j]->k <= 0 || ws[j]->k != ws[0]->k) return 0;
    return gemm_plan_of(ws, n, n_tokens, n_sms, math).partial_bytes;
}

extern "C" size_t loom__cuda_gemm_x16_bytes(int64_t n_tokens, int64_t k, int math) {
    if (math != LOOM_K_MATH_BF16_WGMMA || n_tokens <= 0 || k <= 0) return 0;
    return (size_t)n_tokens * gemm_x16_stride(k);
}

extern "C" size_t loom__cuda_gemm_work_bound_cap(void) {
    return GEMM_WORK_MAX;
}

extern "C" size_t loom__cuda_gemm_work_bound(const loom__k_weight *w, int64_t max_tokens, int n_sms,
                                             int math) {
    if (w->n <= 0 || w->k <= 0 || n_sms <= 0) return 0;
    size_t most = 0;
    /* only steps whose tiles number fewer than two per SM (one, on wgmma) split: a short loop */
    const int64_t row_tiles = loom_cdiv(w->n, gemm_tile_rows(math));
    const int64_t split_below = (gemm_residency(math) > 1 ? gemm_residency(math) - 1 : 1) * n_sms;
    for (int64_t t = 1;
         t <= max_tokens && loom_cdiv(t, gemm_tile_tokens(math)) * row_tiles < split_below; t++) {
        const size_t b = gemm_plan_of(&w, 1, t, n_sms, math).partial_bytes;
        most = b > most ? b : most;
    }
    return most;
}

template <int MATH>
static loom_status gemm_dispatch(cudaStream_t stream, uint32_t type, const gemm_multi &mm,
                                 const gemm_plan &pl, loom__k_tmap_encode_fn enc) {
    switch (type) {
    case LOOM_K_F32:
        return gemm_launch<LOOM_K_F32, MATH>(stream, mm, pl, enc);
    case LOOM_K_F16:
        return gemm_launch<LOOM_K_F16, MATH>(stream, mm, pl, enc);
    case LOOM_K_BF16:
        return gemm_launch<LOOM_K_BF16, MATH>(stream, mm, pl, enc);
    case LOOM_K_Q8_0:
        return gemm_launch<LOOM_K_Q8_0, MATH>(stream, mm, pl, enc);
    case LOOM_K_Q4_0:
        return gemm_launch<LOOM_K_Q4_0, MATH>(stream, mm, pl, enc);
    case LOOM_K_Q5_0:
        return gemm_launch<LOOM_K_Q5_0, MATH>(stream, mm, pl, enc);
    case LOOM_K_Q4_K:
        return gemm_launch<LOOM_K_Q4_K, MATH>(stream, mm, pl, enc);
    case LOOM_K_Q5_K:
        return gemm_launch<LOOM_K_Q5_K, MATH>(stream, mm, pl, enc);
    case LOOM_K_Q6_K:
        return gemm_launch<LOOM_K_Q6_K, MATH>(stream, mm, pl, enc);
    case LOOM_K_FP8_ROWS:
        return gemm_launch<LOOM_K_FP8_ROWS, MATH>(stream, mm, pl, enc);
    default:
        LOOM_K_UNSUPPORTED("cuda: matmul of weight type %u", (unsigned)type);
    }
}

extern "C" loom_status loom__cuda_gemm_multi(cudaStream_t stream, int n,
                                             const loom__k_weight *const *ws, const float *x,
                                             size_t x_stride, int64_t n_tokens, float *const *outs,
                                             const size_t *out_strides,
                                             const loom__k_gemm_work *work, int math) {
    if (math != LOOM_K_MATH_F32 && math != LOOM_K_MATH_BF16 && math != LOOM_K_MATH_BF16_WGMMA)
        return loom__fail(LOOM_ERR_INVALID_ARG, "cuda: gemm with math %d", math);
    if (n < 1 || n > LOOM_K_GEMM_MULTI)
        return loom__fail(LOOM_ERR_INVALID_ARG, "cuda: gemm of %d weights (1 .. %d)", n,
                          LOOM_K_GEMM_MULTI);
    for (int j = 1; j < n; j++)
        if (ws[j]->type != ws[0]->type || ws[j]->k != ws[0]->k)
            return loom__fail(LOOM_ERR_INVALID_ARG,
                              "cuda: gemm of weights of other types or widths in one launch");
    if (n_tokens == 0) return LOOM_OK;
    const int n_sms = work != NULL ? work->n_sms : 0;
    const gemm_plan pl = gemm_plan_of(ws, n, n_tokens, n_sms, math);
    if (pl.partial_bytes != 0 && (work == NULL || work->bytes < pl.partial_bytes))
        return loom__fail(LOOM_ERR_INTERNAL, "cuda: gemm needs %zu bytes of scratch, has %zu",
                          pl.partial_bytes, work != NULL ? work->bytes : (size_t)0);
    const size_t x16_need = loom__cuda_gemm_x16_bytes(n_tokens, ws[0]->k, math);
    if (x16_need != 0 && (work == NULL || work->x16 == NULL || work->x16_bytes < x16_need))
        return loom__fail(LOOM_ERR_INTERNAL,
                          "cuda: gemm (wgmma) needs %zu bytes for x in BF16, has %zu", x16_need,
                          work != NULL ? work->x16_bytes : (size_t)0);
    gemm_multi mm = gemm_multi_of(ws, n, x, x_stride, n_tokens, outs, out_strides, pl,
                                  pl.partial_bytes != 0 ? (float *)work->data : NULL, math);
    if (mm.tile0[n] == 0) return LOOM_OK; /* no rows */
    if (x16_need != 0) {
        mm.x16 = (const uint8_t *)work->x16;
        mm.x16_stride = gemm_x16_stride(ws[0]->k);
    }
    mm.plain = work != NULL && work->gemm_plain;
    const loom__k_tmap_encode_fn enc = work != NULL ? work->tmap_encode : NULL;
    switch (math) {
    case LOOM_K_MATH_BF16:
        return gemm_dispatch<LOOM_K_MATH_BF16>(stream, ws[0]->type, mm, pl, enc);
    case LOOM_K_MATH_BF16_WGMMA:
        return gemm_dispatch<LOOM_K_MATH_BF16_WGMMA>(stream, ws[0]->type, mm, pl, enc);
    default:
        return gemm_dispatch<LOOM_K_MATH_F32>(stream, ws[0]->type, mm, pl, enc);
    }
}

/* Writes 1 to *runs where this device's code carries gemm_wg_kernel's instructions (a warp:
 * the emulated backend's blocks are whole warps). */
static __global__ void gemm_wg_probe_kernel(int *runs) {
    if (threadIdx.x == 0) *runs = LOOM_WGMMA_HAS;
}

extern "C" loom_status loom__cuda_wgmma_probe(int *runs) {
    *runs = 0;
    int *d = NULL;
    cudaError_t e = cudaMalloc((void **)&d, sizeof(int));
    if (e == cudaSuccess) {
        LOOM_K_LAUNCH((gemm_wg_probe_kernel), (1, 32, 0, 0), d);
        e = cudaGetLastError();
        if (e == cudaSuccess) e = cudaMemcpy(runs, d, sizeof(int), cudaMemcpyDeviceToHost);
        const cudaError_t f = cudaFree(d);
        if (e == cudaSuccess) e = f;
    }
    if (e != cudaSuccess) {
        *runs = 0;
        (void)cudaGetLastError();
        return loom__fail(LOOM_ERR_BACKEND, "cuda: wgmma probe: %s (%s)", cudaGetErrorString(e),
                          cudaGetErrorName(e));
    }
    return LOOM_OK;
}

#endif
