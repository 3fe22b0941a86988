/* gemm_wgmma.cuh — gemm.cu's product on Hopper's warpgroup MMA (LOOM_K_MATH_BF16_WGMMA): BF16
 * operands, float32 sums, in the segments and folds of gemm_kernel. Included by gemm.cu (its
 * stage copy, decoders, arguments and fold); sm_90a device code, the emulator's elsewhere.
 *
 * Before the kernel, gemm_x16_kernel rounds x to BF16 once (nearest even; rows padded with
 * zeros to whole chunks). A block of two warpgroups (256 threads) computes 128 weight rows by
 * 128 tokens; warpgroup g owns rows 64 g .. 64 g + 63, all 128 tokens: 64 float32 accumulators
 * a thread. K runs in 32-value chunks as in gemm_kernel; a chunk's tiles (128 rows of 32 BF16
 * values each, 8 KB) are in the canonical K-major layout of wgmma.cuh with SBO 128 and LBO 2048:
 * the 128 rows' first 8 values (16 bytes a row, core matrices of 8 rows stacked), then their
 * next 8, ... — what a tensor-map copy of 8 values by 128 rows lands (tma.cuh):
 *   - the tokens' tile arrives by cp.async (threads 128..255, 16 bytes a copy: one row of a
 *     core matrix), GEMM_WG_AHEAD chunks ahead, into GEMM_WG_SLOTS slots;
 *   - BF16 weights whose rows are 16-byte aligned (DIRECT) arrive the same way (threads
 *     0..127); other weights' stored bytes arrive a stage at a time (gemm_stage, all threads),
 *     threads 0..127 decode their row's 32 values of the next chunk (gemm_decode) while the
 *     tensor cores run this one, and store them rounded to BF16 into one of two tiles. A
 *     quarter-warp's 8 16-byte stores or copies are one whole core matrix: no bank conflicts;
 *   - the chunk is two k16 steps, one m64n128k16 each per warpgroup, A at the warpgroup's rows
 *     and B the tokens' tile, committed as one group.
 * Before the barrier that hands chunk c's tiles to the tensor cores, each thread waits for its
 * copies of chunk c and each warpgroup for its wgmma's of chunk c - 1; so when any thread
 * passes that barrier no wgmma reads the tiles that chunks c + 1 .. c + AHEAD are being copied
 * or decoded into. Generic-proxy stores and cp.async reach the wgmma's (async proxy) through
 * fence.proxy.async before that barrier.
 *
 * Sums: within a segment, the accumulator of each output runs its chunks in K order, k16 step by
 * k16 step (the first step of a segment with scale-d 0: each segment's sum starts from zero);
 * the segment's sums are folded (or written apart, splitting) after the next chunk's wait, as
 * gemm_kernel folds them. A token's output depends on its own column of B only, so its bits do
 * not depend on the step's other tokens nor on the split — within this kernel: its bits are not
 * gemm_kernel's, the two sum the products of a k16 step in the tensor cores' own orders. */

#define GEMM_WG_TILE 8192 /* bytes of one operand's chunk: 128 rows of 32 BF16 values */
/* Chunk tiles loaded by cp.async: chunk c's lands in slot c % GEMM_WG_SLOTS, issued
 * GEMM_WG_AHEAD chunks ahead; the slot chunk c + AHEAD takes was last read by chunk c + AHEAD -
 * SLOTS = c - 2's wgmma's, done before the barrier of chunk c - 1. */
#define GEMM_WG_AHEAD 2
#define GEMM_WG_SLOTS (GEMM_WG_AHEAD + 2)

/* Byte offset of row r's 8-value group kg (of a chunk) in a chunk tile: rows 16 bytes apart (core
 * matrices of 8 rows by 16 bytes, SBO 128 apart), each kg's 128 rows 2048 bytes apart (LBO). */
static __host__ __device__ __forceinline__ int gemm_wg_at(int r, int kg) {
    return kg * 2048 + r * 16;
}
#define GEMM_WG_LBO 2048
#define GEMM_WG_SBO 128

/* BF16 activations' row stride: k values padded with zeros to a whole chunk (16-byte pieces). */
static __host__ __device__ __forceinline__ size_t gemm_x16_stride(int64_t k) {
    return (size_t)loom_cdiv(k, 32) * 64;
}

/* Shared memory: the token tiles' slots; then the weights' — slots too where they are copied
 * as they are stored (DIRECT: BF16 rows), else two decoded tiles and the stage of stored bytes. */
template <int T, bool DIRECT> static __host__ __device__ constexpr size_t gemm_wg_smem_bytes() {
    return DIRECT ? 2 * (size_t)GEMM_WG_SLOTS * GEMM_WG_TILE
                  : (size_t)(GEMM_WG_SLOTS + 2) * GEMM_WG_TILE +
                        (size_t)GEMM_WG_ROWS * gemm_stage_pitch<T>();
}

/* Eight values rounded to BF16, packed (the lower K in the lower half of each word). */
static __device__ __forceinline__ uint4 gemm_wg_pack8(const float *v) {
    return make_uint4(
        loom_mma16_pack<LOOM_MMA16_BF16>(v[0], v[1]), loom_mma16_pack<LOOM_MMA16_BF16>(v[2], v[3]),
        loom_mma16_pack<LOOM_MMA16_BF16>(v[4], v[5]), loom_mma16_pack<LOOM_MMA16_BF16>(v[6], v[7]));
}

/* x as BF16 rows (gemm_x16_stride apart), zeros past k: one thread per 8 values, grid (tokens,
 * row pieces / 256): tokens on x, whose 2^31 - 1 blocks no step reaches. Each value's rounding
 * depends on the value alone. */
static __global__ void __launch_bounds__(256)
    gemm_x16_kernel(const float *x, size_t x_stride, int64_t k, uint8_t *x16) {
    const int64_t t = blockIdx.x, k0 = 8 * ((int64_t)blockIdx.y * 256 + threadIdx.x);
    const size_t stride = gemm_x16_stride(k);
    if (k0 >= (int64_t)stride / 2) return;
    const float *xr = (const float *)((const char *)x + (size_t)t * x_stride);
    float v[8];
#pragma unroll
    for (int e = 0; e < 8; e++) v[e] = k0 + e < k ? xr[k0 + e] : 0.0f;
    *(uint4 *)(x16 + (size_t)t * stride + 2 * k0) = gemm_wg_pack8(v);
}

/* Piece j (0..3) of the 128 threads' (u = 0..127) share of a chunk tile's copies: row
 * 8 (4 j + u / 32) + u % 8, 8-value group (u % 32) / 8. A warp reads 8 rows' 64 bytes; a
 * quarter-warp writes one core matrix. */
static __device__ __forceinline__ int gemm_wg_row(int u, int j) {
    return 8 * (4 * j + (u >> 5)) + (u & 7);
}
static __device__ __forceinline__ int gemm_wg_kg(int u) {
    return (u & 31) >> 3;
}

/* Chunk c's token tile into dst by 128 threads (u = 0..127): rows of x16 (tokens past the step:
 * zeros). */
static __device__ __forceinline__ void
gemm_wg_copy_x(const gemm_multi &mm, int64_t t0, int64_t n_tokens, int64_t c, uint8_t *dst, int u) {
#pragma unroll
    for (int j = 0; j < 4; j++) {
        const int r = gemm_wg_row(u, j);
        const bool in = t0 + r < n_tokens;
        const uint8_t *src =
            in ? mm.x16 + (size_t)(t0 + r) * mm.x16_stride + (size_t)(64 * c + 16 * gemm_wg_kg(u))
               : mm.x16;
        loom_cp_async16(dst + gemm_wg_at(r, gemm_wg_kg(u)), src, in ? 16 : 0);
    }
}

/* Chunk c's weight tile into dst by 128 threads (u = 0..127), copied as stored (BF16 rows,
 * 16-byte aligned): rows past the last and values past k read as zeros. */
static __device__ __forceinline__ void gemm_wg_copy_w(const gemm_args &a, int64_t n0, int64_t c,
                                                      uint8_t *dst, int u) {
#pragma unroll
    for (int j = 0; j < 4; j++) {
        const int r = gemm_wg_row(u, j), kg = gemm_wg_kg(u);
        const int64_t k0 = 32 * c + 8 * kg, left = a.w.k - k0;
        const int bytes = n0 + r >= a.w.n || left <= 0 ? 0 : left >= 8 ? 16 : 2 * (int)left;
        const uint8_t *src =
            bytes == 0 ? (const uint8_t *)a.w.data
                       : (const uint8_t *)a.w.data + (size_t)(n0 + r) * a.w.stride + 2 * (size_t)k0;
        loom_cp_async16(dst + gemm_wg_at(r, kg), src, bytes);
    }
}

/* Decoded weights (gemm_decode's 32 values of row tid) into the chunk's weight tile, rounded to
 * BF16 (nearest even). */
static __device__ __forceinline__ void gemm_wg_put_w(uint8_t *w, const float v[32]) {
#pragma unroll
    for (int kg = 0; kg < 4; kg++)
        *(uint4 *)(w + gemm_wg_at((int)threadIdx.x, kg)) = gemm_wg_pack8(v + 8 * kg);
}

/* Segment seg's sums (acc, waited for) of warpgroup wg's rows: into the fold, or apart into the
 * scratch (splitting). wq: the warp's place in its warpgroup. */
static __device__ __forceinline__ void gemm_wg_settle(const gemm_args &a, const float (&acc)[64],
                                                      float (&fold)[64], int64_t seg, int64_t n0,
                                                      int64_t t0, int wg, int wq, int lane) {
#pragma unroll
    for (int j = 0; j < 64; j++) {
        if (a.partial == NULL) {
            fold[j] += acc[j];
        } else {
            const int64_t n = n0 + 64 * wg + 16 * wq + (lane >> 2) + 8 * ((j >> 1) & 1);
            const int64_t t = t0 + 8 * (j >> 2) + 2 * (lane & 3) + (j & 1);
            if (n < a.w.n && t < a.n_tokens) a.partial[(seg * a.n_tokens + t) * a.w.n + n] = acc[j];
        }
    }
}

/* The fold of warpgroup wg's rows into out (FP8 rows: times the row's scale, once per dot). */
template <int T>
static __device__ __forceinline__ void gemm_wg_write_out(const gemm_args &a,
                                                         const float (&fold)[64], int64_t n0,
                                                         int64_t t0, int wg, int wq, int lane) {
#pragma unroll
    for (int h = 0; h < 2; h++) { /* accumulators j with (j / 2) % 2 == h: one weight row */
        const int64_t n = n0 + 64 * wg + 16 * wq + (lane >> 2) + 8 * h;
        if (n >= a.w.n) continue;
        float row_scale = 1.0f;
        if constexpr (T == LOOM_K_FP8_ROWS)
            row_scale =
                loom_fp8_rows_scale256((const uint8_t *)a.w.data + (size_t)n * a.w.stride, a.w.k);
#pragma unroll
        for (int j = 0; j < 64; j++) {
            if (((j >> 1) & 1) != h) continue;
            const int64_t t = t0 + 8 * (j >> 2) + 2 * (lane & 3) + (j & 1);
            if (t >= a.n_tokens) continue;
            float d = fold[j];
            if constexpr (T == LOOM_K_FP8_ROWS) d *= row_scale; /* once per dot */
            ((float *)((char *)a.out + (size_t)t * a.out_stride))[n] = d;
        }
    }
}

/* A chunk's products for warpgroup wg (its 64 rows of the weight tile tw, the token tile tx):
 * two k16 steps of m64n128k16, one group; both kernels issue exactly these, so their bits agree.
 * seg_start: the chunk opens a segment, whose sum starts from zero (scale-d 0). */
static __device__ __forceinline__ void gemm_wg_chunk(float (&acc)[64], const uint8_t *tx,
                                                     const uint8_t *tw, int wg, bool seg_start) {
    loom_wg_fence();
    loom_wg_fence_acc<64>(acc);
#pragma unroll
    for (int ks = 0; ks < 2; ks++) /* k16 step ks: the chunk's 8-value groups 2 ks, 2 ks + 1 */
        loom_wg_ss<LOOM_MMA16_BF16, 128>(
            acc,
            loom_wg_desc(tw + 64 * wg / 8 * GEMM_WG_SBO + 2 * ks * GEMM_WG_LBO, GEMM_WG_LBO,
                         GEMM_WG_SBO),
            loom_wg_desc(tx + 2 * ks * GEMM_WG_LBO, GEMM_WG_LBO, GEMM_WG_SBO),
            seg_start && ks == 0 ? 0 : 1);
    loom_wg_commit();
    loom_wg_fence_acc<64>(acc);
}

/* grid (token tiles, row tiles, K groups), as gemm_kernel's. DIRECT: BF16 weights whose rows
 * are 16-byte aligned, copied into their tiles as the activations are; else the stage copy and
 * gemm_decode by threads 0..127, two weight tiles alternating. */
template <int T, bool DIRECT>
static __global__ void __launch_bounds__(GEMM_WG_THREADS, 1) gemm_wg_kernel(gemm_multi mm) {
#if LOOM_WGMMA_HAS
    int row_tile = 0;
    const gemm_args a = gemm_pick(mm, mm.tile0, (int)blockIdx.y, &row_tile);
    constexpr int SC = gemm_stage_chunks<T>();
    LOOM_K_DYN_SMEM(gemm_sm);
    uint8_t *xs = gemm_sm, *ws = gemm_sm + GEMM_WG_SLOTS * GEMM_WG_TILE;
    uint8_t *raw = ws + 2 * GEMM_WG_TILE; /* !DIRECT */
    const int64_t t0 = (int64_t)blockIdx.x * GEMM_WG_TOKENS;
    const int64_t n0 = (int64_t)row_tile * GEMM_WG_ROWS;
    const int lane = threadIdx.x & 31, wg = threadIdx.x >> 7, wq = (threadIdx.x >> 5) & 3;
    const bool w_thread = threadIdx.x < GEMM_WG_ROWS;
    const int64_t seg_chunks = a.seg_chunks;
    int64_t c_begin, c_end;
    gemm_chunk_range(a, &c_begin, &c_end);
    const unsigned w_align = gemm_w_align<T>(a);

    /* acc needs no zeros: a segment's first wgmma does not read it (scale-d 0); values the
     * compiler would have to move into it would make ptxas wait for the wgmma's in flight */
    float acc[64], fold[64];
#pragma unroll
    for (int j = 0; j < 64; j++) fold[j] = 0.0f;
    auto settle = [&](int64_t seg) { gemm_wg_settle(a, acc, fold, seg, n0, t0, wg, wq, lane); };
    /* chunk c's copies (the token tile; the weight tile too where DIRECT) into their slots */
    auto copy = [&](int64_t c) {
        const int slot = (int)(c % GEMM_WG_SLOTS);
        if (!w_thread)
            gemm_wg_copy_x(mm, t0, a.n_tokens, c, xs + slot * GEMM_WG_TILE,
                           (int)threadIdx.x - GEMM_WG_ROWS);
        else if (DIRECT)
            gemm_wg_copy_w(a, n0, c, ws + slot * GEMM_WG_TILE, (int)threadIdx.x);
    };

    for (int i = 0; i < GEMM_WG_AHEAD; i++) { /* one group per chunk, empty past the end */
        if (c_begin + i < c_end) copy(c_begin + i);
        loom_cp_async_commit();
    }
    float v[32];
    if constexpr (!DIRECT) {
        gemm_stage<T, GEMM_WG_ROWS, GEMM_WG_THREADS>(a, n0, c_begin / SC, w_align, raw);
        __syncthreads();
        if (w_thread)
            gemm_decode<T>(a, raw, n0, (int)threadIdx.x, c_begin / SC, (int)(c_begin % SC), v);
    }
    for (int64_t c = c_begin; c < c_end; c++) {
        if (c + GEMM_WG_AHEAD < c_end) copy(c + GEMM_WG_AHEAD);
        loom_cp_async_commit();
        const int slot = (int)(c % GEMM_WG_SLOTS);
        uint8_t *tx = xs + slot * GEMM_WG_TILE;
        uint8_t *tw = DIRECT ? ws + slot * GEMM_WG_TILE : ws + (c & 1) * GEMM_WG_TILE;
        /* the decoded tile c & 1 was last read by chunk c - 2's wgmma's, which every warpgroup
         * waited for before the barrier of chunk c - 1 */
        if (!DIRECT && w_thread) gemm_wg_put_w(tw, v);
        /* this thread's copies of chunk c (the newest AHEAD groups, c + 1 .., may still fly) */
        loom_cp_async_wait<GEMM_WG_AHEAD>();
        /* this warpgroup's chunk c - 1: one wait in every chunk, at one place, so that ptxas
         * finds the same wgmma's in flight on every path (else it adds waits of its own) */
        loom_wg_wait<0>();
        loom_wg_fence_acc<64>(acc);
        const bool seg_start = c % seg_chunks == 0; /* c_begin is a segment's start */
        if (seg_start && c != c_begin) settle(c / seg_chunks - 1);
        loom_wg_fence_proxy_async(); /* the stores and copies above, for the tensor cores */
        __syncthreads();
        gemm_wg_chunk(acc, tx, tw, wg, seg_start);
        if (!DIRECT && c + 1 < c_end) {
            const int64_t s1 = (c + 1) / SC;
            if (s1 * SC == c + 1) {
                /* the stage before was last read by the decodes of chunk c, done before the
                 * barrier above */
                gemm_stage<T, GEMM_WG_ROWS, GEMM_WG_THREADS>(a, n0, s1, w_align, raw);
                __syncthreads();
            }
            if (w_thread)
                gemm_decode<T>(a, raw, n0, (int)threadIdx.x, s1, (int)(c + 1 - s1 * SC), v);
        }
    }
    loom_cp_async_wait<0>(); /* the empty groups past the end */
    loom_wg_wait<0>();
    loom_wg_fence_acc<64>(acc);
    if (c_end > c_begin) settle((c_end - 1) / seg_chunks);
    if (a.partial != NULL) return;

    gemm_wg_write_out<T>(a, fold, n0, t0, wg, wq, lane);
#else
    (void)mm; /* no wgmma in this build's code for the device: never launched (the probe) */
#endif
}

/* The DIRECT product warp-specialised (LOOM_CUDA_GEMM_WS, the default for BF16 weights with
 * 16-byte-aligned rows): three warpgroups. Warpgroup 0 produces: it gives registers back
 * (setmaxnreg) and copies each chunk's token and weight tiles into a ring of GEMM_WS_STAGES
 * stages, completing on the stage's "full" mbarrier; before it copies into a stage again it waits
 * on the stage's "empty" mbarrier. The copies are TMA's where the host encoded tensor maps
 * (gemm_tmaps: thread 0 alone announces a stage's 16 KB, then issues 8 tensor-map copies of 8
 * values by 128 rows; LOOM_CUDA_GEMM_TMA=0 turns them off), else cp.async's by all 128 threads,
 * each arriving when its copies land. Both fill the stage with the same bytes. Warpgroups 1 and 2
 * are gemm_wg_kernel's two (rows 64 (g - 1) ..): each takes the producer's registers, waits on the
 * chunk's full barrier, lets the previous chunk's stage go (its wgmma's waited for: one group in
 * flight while the next chunk is awaited), and issues the chunk's wgmma's as gemm_wg_kernel does
 * — the same instructions on the same tiles in the same order, so the same bits — without a
 * block-wide barrier a chunk, and with the copies off the tensor cores' warps. Registers: the
 * producer keeps 56 (at 40 ptxas spilled 52 bytes of its copies' addresses), the consumers 224
 * (gemm_wg_kernel<BF16, true> needs 206 with its copies). */
#define GEMM_WS_THREADS       (GEMM_WG_THREADS + 128)
#define GEMM_WS_STAGES        6
#define GEMM_WS_BAR_BYTES     128 /* the full and empty barriers */
#define GEMM_WS_PRODUCER_REGS 56
#define GEMM_WS_CONSUMER_REGS 224

/* The block's registers at launch (ptxas: 65536 / 384 rounded down to 8, 168 a thread) are the
 * pool the warpgroups' setmaxnreg redistributes: a consumer's .inc waits until the pool has what
 * it asks for, so asking for more than the producer gave back would never return. */
#define GEMM_WS_LAUNCH_REGS /* the registers a thread the split needs at launch */                 \
    ((GEMM_WS_PRODUCER_REGS * 128 + GEMM_WS_CONSUMER_REGS * 256 + GEMM_WS_THREADS - 1) /           \
     GEMM_WS_THREADS)
static_assert(GEMM_WS_LAUNCH_REGS <= 65536 / GEMM_WS_THREADS / 8 * 8,
              "the warpgroups' registers exceed the block's");

static __host__ __device__ constexpr size_t gemm_ws_smem_bytes() {
    return GEMM_WS_BAR_BYTES + 2 * (size_t)GEMM_WS_STAGES * GEMM_WG_TILE;
}

/* The warp-specialised kernel's tensor maps (tma.cuh), a __grid_constant__ parameter: x16's and
 * each weight's, BF16, boxes of 8 values by 128 rows (one kg column of a chunk tile). on = 0:
 * none; the producer warpgroup copies by cp.async. */
typedef struct gemm_tmaps {
    loom_k_tmap x, w[LOOM_K_GEMM_MULTI];
    int32_t on;
} gemm_tmaps;

/* The maps of mm's x16 and weights through the driver's encoder; false where it refuses one (the
 * launch then copies by cp.async). Values past a tensor's sizes land as zeros, as the cp.async
 * copies' do: x16's rows past the step's tokens, the weights' rows past n and values past k. */
static inline bool gemm_tmaps_of(const gemm_multi &mm, loom__k_tmap_encode_fn enc, gemm_tmaps *tm) {
    /* coordinates are 32-bit */
    if (mm.m[0].n_tokens > INT32_MAX || mm.m[0].w.k > INT32_MAX) return false;
    for (int j = 0; j < mm.n; j++)
        if (mm.m[j].w.n > INT32_MAX) return false;
    const uint32_t box[2] = {8, GEMM_WG_ROWS}, ones[2] = {1, 1};
    const int BF16 = 9,
              L2_128B = 2; /* CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, ..._L2_PROMOTION_L2_128B */
    {
        const uint64_t dims[2] = {(uint64_t)mm.x16_stride / 2, (uint64_t)mm.m[0].n_tokens},
                       strides[1] = {(uint64_t)mm.x16_stride};
        if (enc(&tm->x, BF16, 2, (void *)mm.x16, dims, strides, box, ones, 0, 0, L2_128B, 0) != 0)
            return false;
    }
    for (int j = 0; j < mm.n; j++) {
        const loom__k_weight &w = mm.m[j].w;
        const uint64_t dims[2] = {(uint64_t)w.k, (uint64_t)w.n}, strides[1] = {(uint64_t)w.stride};
        if (enc(&tm->w[j], BF16, 2, (void *)w.data, dims, strides, box, ones, 0, 0, L2_128B, 0) !=
            0)
            return false;
    }
    tm->on = 1;
    return true;
}

template <int T>
static __global__ void __launch_bounds__(GEMM_WS_THREADS, 1)
    gemm_wg_ws_kernel(gemm_multi mm, const __grid_constant__ gemm_tmaps tm) {
#if LOOM_WGMMA_HAS
    int row_tile = 0;
    const gemm_args a = gemm_pick(mm, mm.tile0, (int)blockIdx.y, &row_tile);
    const bool tma = tm.on != 0;
    LOOM_K_DYN_SMEM(gemm_sm);
    uint64_t *full = (uint64_t *)gemm_sm, *empty = full + GEMM_WS_STAGES;
    uint8_t *tiles = gemm_sm + GEMM_WS_BAR_BYTES; /* stage st: x's tile, then w's */
    const int64_t t0 = (int64_t)blockIdx.x * GEMM_WG_TOKENS;
    const int64_t n0 = (int64_t)row_tile * GEMM_WG_ROWS;
    const int64_t seg_chunks = a.seg_chunks;
    int64_t c_begin, c_end;
    gemm_chunk_range(a, &c_begin, &c_end);
    if (threadIdx.x == 0)
        for (int st = 0; st < GEMM_WS_STAGES; st++) {
            loom_mbar_init(full + st, tma ? 1 : 128);
            loom_mbar_init(empty + st, GEMM_WG_THREADS);
        }
    if (threadIdx.x == 0) loom_mbar_init_fence();
    __syncthreads(); /* the barriers' init; the last block-wide barrier */

    if (threadIdx.x < 128) { /* the producer */
        loom_wg_maxnreg_dec<GEMM_WS_PRODUCER_REGS>();
        if (tma) { /* thread 0 alone: four tensor-map copies an operand a chunk */
            if (threadIdx.x != 0) return;
            const loom_k_tmap *wmap = &tm.w[gemm_pick_index(mm, mm.tile0, (int)blockIdx.y)];
            int64_t i = 0;
            for (int64_t c = c_begin; c < c_end; c++, i++) {
                const int st = (int)(i % GEMM_WS_STAGES);
                loom_mbar_wait(empty + st, (unsigned)((i / GEMM_WS_STAGES) & 1) ^ 1u);
                loom_mbar_arrive_expect_tx(full + st, 2 * GEMM_WG_TILE);
                uint8_t *tx = tiles + 2 * st * GEMM_WG_TILE;
#pragma unroll
                for (int kg = 0; kg < 4; kg++) {
                    const int k0 = (int)(32 * c) + 8 * kg;
                    loom_tma_load_2d(tx + kg * GEMM_WG_LBO, &tm.x, k0, (int)t0, full + st);
                    loom_tma_load_2d(tx + GEMM_WG_TILE + kg * GEMM_WG_LBO, wmap, k0, (int)n0,
                                     full + st);
                }
            }
            for (int64_t e = i; e < i + GEMM_WS_STAGES; e++)
                loom_mbar_wait(empty + e % GEMM_WS_STAGES,
                               (unsigned)((e / GEMM_WS_STAGES) & 1) ^ 1u);
            return;
        }
        const int u = (int)threadIdx.x;
        int64_t i = 0;
        for (int64_t c = c_begin; c < c_end; c++, i++) {
            const int st = (int)(i % GEMM_WS_STAGES);
            loom_mbar_wait(empty + st, (unsigned)((i / GEMM_WS_STAGES) & 1) ^ 1u);
            uint8_t *tx = tiles + 2 * st * GEMM_WG_TILE;
            gemm_wg_copy_x(mm, t0, a.n_tokens, c, tx, u);
            gemm_wg_copy_w(a, n0, c, tx + GEMM_WG_TILE, u);
            loom_cp_async_mbar_arrive(full + st);
        }
        /* every stage released before the block may end: no copy outlives its shared memory */
        for (int64_t e = i; e < i + GEMM_WS_STAGES; e++)
            loom_mbar_wait(empty + e % GEMM_WS_STAGES, (unsigned)((e / GEMM_WS_STAGES) & 1) ^ 1u);
        return;
    }
    loom_wg_maxnreg_inc<GEMM_WS_CONSUMER_REGS>();
    const int lane = threadIdx.x & 31, wg = (int)(threadIdx.x >> 7) - 1,
              wq = (threadIdx.x >> 5) & 3;
    float acc[64], fold[64]; /* acc: no zeros needed (gemm_wg_kernel) */
#pragma unroll
    for (int j = 0; j < 64; j++) fold[j] = 0.0f;
    int64_t i = 0;
    for (int64_t c = c_begin; c < c_end; c++, i++) {
        const int st = (int)(i % GEMM_WS_STAGES);
        loom_mbar_wait(full + st, (unsigned)((i / GEMM_WS_STAGES) & 1));
        /* chunk c - 1's wgmma's (one wait a chunk, at one place: gemm_wg_kernel), then its stage
         * goes back to the producer */
        loom_wg_wait<0>();
        loom_wg_fence_acc<64>(acc);
        if (c != c_begin) loom_mbar_arrive(empty + (i - 1) % GEMM_WS_STAGES);
        const bool seg_start = c % seg_chunks == 0; /* c_begin is a segment's start */
        if (seg_start && c != c_begin)
            gemm_wg_settle(a, acc, fold, c / seg_chunks - 1, n0, t0, wg, wq, lane);
        /* the landed cp.async copies, for this thread's wgmma's (the tensor-map copies wrote
         * through the async proxy: the wait is enough) */
        if (!tma) loom_wg_fence_proxy_async();
        const uint8_t *tx = tiles + 2 * st * GEMM_WG_TILE, *tw = tx + GEMM_WG_TILE;
        gemm_wg_chunk(acc, tx, tw, wg, seg_start);
    }
    loom_wg_wait<0>();
    loom_wg_fence_acc<64>(acc);
    if (c_end > c_begin) {
        loom_mbar_arrive(empty + (i - 1) % GEMM_WS_STAGES);
        gemm_wg_settle(a, acc, fold, (c_end - 1) / seg_chunks, n0, t0, wg, wq, lane);
    }
    if (a.partial != NULL) return;
    gemm_wg_write_out<T>(a, fold, n0, t0, wg, wq, lane);
#else
    (void)mm; /* no wgmma in this build's code for the device: never launched (the probe) */
#endif
}
