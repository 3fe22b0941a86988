/* gemm_wgmma.cuh — gemm.cu's product on Hopper's warpgroup MMA (LOOM_K_MATH_BF16_WGMMA): BF16
 * operands, float32 sums, in the segments and folds of gemm_kernel. Included by gemm.cu (its
 * stage copy, decoders, arguments and fold); sm_90a device code, the emulator's elsewhere.
 *
 * A block of two warpgroups (256 threads) computes 128 weight rows by 128 tokens; warpgroup g
 * owns rows 64 g .. 64 g + 63, all 128 tokens: 64 float32 accumulators a thread. K runs in
 * 32-value chunks as in gemm_kernel:
 *   - the weight rows' stored bytes arrive a stage at a time (gemm_stage, all threads);
 *   - per chunk, threads 0..127 decode their row's 32 values (gemm_decode), threads 128..255
 *     load four 8-value pieces of the tokens' activations; both rounded to BF16 (nearest even)
 *     into a chunk tile in the canonical K-major layout of wgmma.cuh (LBO 128, SBO 512: the 4
 *     core matrices of 8 rows across a chunk's K side by side). Each thread stores 16-byte rows
 *     of core matrices, a quarter-warp's 8 stores one whole core matrix: no bank conflicts;
 *   - the chunk is two k16 steps, one m64n128k16 each per warpgroup, A at the warpgroup's rows
 *     and B the tokens' tile, committed as one group.
 * Two chunk tiles alternate. The wgmma's of chunk c run while the threads decode and load chunk
 * c + 1 (and copy the next stage); before the barrier that hands the tiles of c + 1 to the
 * tensor cores, each warpgroup waits for its chunk c, so when any thread passes that barrier
 * no wgmma reads the tiles chunk c + 2 will overwrite. Generic-proxy stores reach the wgmma's
 * (async proxy) through fence.proxy.async before that barrier.
 *
 * Sums: within a segment, the accumulator of each output runs its chunks in K order, k16 step by
 * k16 step (the first step of a segment with scale-d 0: each segment's sum starts from zero);
 * at the segment's end the warpgroup waits for its last group and folds the sum into the
 * registers of the fold (or writes it apart, splitting), as gemm_kernel does. A token's output
 * depends on its own column of B only, so its bits do not depend on the step's other tokens nor
 * on the split — within this kernel: its bits are not gemm_kernel's, the two sum the products
 * of a k16 step in the tensor cores' own orders. */

#define GEMM_WG_TILE 8192 /* bytes of one operand's chunk: 128 rows of 32 BF16 values */

/* Byte offset of row r's 8-value group kg (of a chunk) in a chunk tile: core matrices of 8 rows
 * by 16 bytes, kg's 128 bytes apart (LBO), each 8 rows 512 bytes apart (SBO). */
static __device__ __forceinline__ int gemm_wg_at(int r, int kg) {
    return (r >> 3) * 512 + kg * 128 + (r & 7) * 16;
}
#define GEMM_WG_LBO 128
#define GEMM_WG_SBO 512

/* Shared memory: two chunks' tiles (weights, then tokens, each), then the stage. */
template <int T> static __host__ __device__ constexpr size_t gemm_wg_smem_bytes() {
    return 4 * (size_t)GEMM_WG_TILE + (size_t)GEMM_WG_ROWS * gemm_stage_pitch<T>();
}

/* Eight values rounded to BF16, packed (the lower K in the lower half of each word). */
static __device__ __forceinline__ uint4 gemm_wg_pack8(const float *v) {
    return make_uint4(loom_mma16_pack<LOOM_MMA16_BF16>(v[0], v[1]),
                      loom_mma16_pack<LOOM_MMA16_BF16>(v[2], v[3]),
                      loom_mma16_pack<LOOM_MMA16_BF16>(v[4], v[5]),
                      loom_mma16_pack<LOOM_MMA16_BF16>(v[6], v[7]));
}

/* Piece j (0..3) of thread u's (128..255 less 128) share of the tokens' tile: token
 * 8 (4 j + u / 32) + u % 8, values 8 ((u % 32) / 8) .. + 7 of the chunk. A warp loads 8 tokens'
 * 128 bytes; a quarter-warp stores one core matrix. */
static __device__ __forceinline__ int gemm_wg_x_row(int u, int j) {
    return 8 * (4 * j + (u >> 5)) + (u & 7);
}
static __device__ __forceinline__ int gemm_wg_x_kg(int u) {
    return (u & 31) >> 3;
}

/* This thread's share of chunk c (chunk cl of the staged stage s) into v: threads 0..127 decode
 * staged row tid, threads 128..255 read their four pieces of x (zeros past the last token and
 * past k). */
template <int T>
static __device__ __forceinline__ void gemm_wg_fetch(const gemm_args &a, const uint8_t *raw,
                                                     int64_t n0, int64_t t0, int64_t s, int cl,
                                                     int64_t c, bool x_vec, float v[32]) {
    if (threadIdx.x < GEMM_WG_ROWS) {
        gemm_decode<T>(a, raw, n0, (int)threadIdx.x, s, cl, v);
        return;
    }
    const int u = threadIdx.x - GEMM_WG_ROWS;
    const int64_t k = a.w.k, col = 32 * c + 8 * gemm_wg_x_kg(u);
#pragma unroll
    for (int j = 0; j < 4; j++) {
        float *p = v + 8 * j;
        const int64_t t = t0 + gemm_wg_x_row(u, j);
#pragma unroll
        for (int e = 0; e < 8; e++) p[e] = 0.0f;
        if (t >= a.n_tokens) continue;
        const float *xr = (const float *)((const char *)a.x + (size_t)t * a.x_stride);
        if (x_vec && col + 8 <= k) {
            const float4 lo = *(const float4 *)(xr + col), hi = *(const float4 *)(xr + col + 4);
            p[0] = lo.x, p[1] = lo.y, p[2] = lo.z, p[3] = lo.w;
            p[4] = hi.x, p[5] = hi.y, p[6] = hi.z, p[7] = hi.w;
        } else {
#pragma unroll
            for (int e = 0; e < 8; e++)
                if (col + e < k) p[e] = xr[col + e];
        }
    }
}

/* v (gemm_wg_fetch's share) into the chunk's tiles w and x, rounded to BF16. */
static __device__ __forceinline__ void gemm_wg_put(uint8_t *w, uint8_t *x, const float v[32]) {
    if (threadIdx.x < GEMM_WG_ROWS) {
#pragma unroll
        for (int kg = 0; kg < 4; kg++)
            *(uint4 *)(w + gemm_wg_at((int)threadIdx.x, kg)) = gemm_wg_pack8(v + 8 * kg);
    } else {
        const int u = threadIdx.x - GEMM_WG_ROWS;
#pragma unroll
        for (int j = 0; j < 4; j++)
            *(uint4 *)(x + gemm_wg_at(gemm_wg_x_row(u, j), gemm_wg_x_kg(u))) =
                gemm_wg_pack8(v + 8 * j);
    }
}

/* grid (token tiles, row tiles, K groups), as gemm_kernel's. */
template <int T>
static __global__ void __launch_bounds__(GEMM_WG_THREADS, 1) gemm_wg_kernel(gemm_multi mm) {
#if LOOM_WGMMA_HAS
    int row_tile = 0;
    const gemm_args a = gemm_pick(mm, mm.tile0, (int)blockIdx.y, &row_tile);
    constexpr int SC = gemm_stage_chunks<T>();
    LOOM_K_DYN_SMEM(gemm_sm);
    uint8_t *raw = gemm_sm + 4 * GEMM_WG_TILE;
    const int64_t t0 = (int64_t)blockIdx.x * GEMM_WG_TOKENS;
    const int64_t n0 = (int64_t)row_tile * GEMM_WG_ROWS;
    const int lane = threadIdx.x & 31, wg = threadIdx.x >> 7, wq = (threadIdx.x >> 5) & 3;
    const int64_t n_chunks = loom_cdiv(a.w.k, 32);
    const int64_t seg0 = a.partial != NULL ? (int64_t)blockIdx.z * a.segs_per_block : 0;
    const int64_t seg_chunks = a.seg_chunks;
    const int64_t c_begin = seg0 * seg_chunks;
    const int64_t c_end = a.partial != NULL && c_begin + a.segs_per_block * seg_chunks < n_chunks
                              ? c_begin + a.segs_per_block * seg_chunks
                              : n_chunks;
    const bool x_vec = (((uintptr_t)a.x | a.x_stride) & 15) == 0;
    const unsigned w_align =
        (unsigned)(((uintptr_t)a.w.data | a.w.stride | (size_t)gemm_stage_bytes<T>()) & 3);

    /* acc needs no zeros: a segment's first wgmma does not read it (scale-d 0); values the
     * compiler would have to move into it would make ptxas wait for the wgmma's in flight */
    float acc[64], fold[64];
#pragma unroll
    for (int j = 0; j < 64; j++) fold[j] = 0.0f;

    /* segment seg's sums, waited for: into the fold, or apart into the scratch */
    auto settle = [&](int64_t seg) {
#pragma unroll
        for (int j = 0; j < 64; j++) {
            if (a.partial == NULL) {
                fold[j] += acc[j];
            } else {
                const int64_t n = n0 + 64 * wg + 16 * wq + (lane >> 2) + 8 * ((j >> 1) & 1);
                const int64_t t = t0 + 8 * (j >> 2) + 2 * (lane & 3) + (j & 1);
                if (n < a.w.n && t < a.n_tokens)
                    a.partial[(seg * a.n_tokens + t) * a.w.n + n] = acc[j];
            }
        }
    };
    float v[32];
    gemm_stage<T, GEMM_WG_ROWS, GEMM_WG_THREADS>(a, n0, c_begin / SC, w_align, raw);
    __syncthreads();
    gemm_wg_fetch<T>(a, raw, n0, t0, c_begin / SC, (int)(c_begin % SC), c_begin, x_vec, v);
    for (int64_t c = c_begin; c < c_end; c++) {
        /* tiles c & 1 were last read by chunk c - 2's wgmma's, which every warpgroup waited for
         * before the barrier of chunk c - 1 */
        uint8_t *tw = gemm_sm + (c & 1) * 2 * GEMM_WG_TILE, *tx = tw + GEMM_WG_TILE;
        gemm_wg_put(tw, tx, v);
        /* this warpgroup's chunk c - 1: one wait in every chunk, at one place, so that ptxas
         * finds the same wgmma's in flight on every path (else it adds waits of its own) */
        loom_wg_wait<0>();
        const bool seg_start = c % seg_chunks == 0; /* c_begin is a segment's start */
        if (seg_start && c != c_begin) settle(c / seg_chunks - 1);
        loom_wg_fence_proxy_async();
        __syncthreads();
        loom_wg_fence();
#pragma unroll
        for (int ks = 0; ks < 2; ks++) /* k16 step ks: the chunk's 8-value groups 2 ks, 2 ks + 1 */
            loom_wg_bf16_m64n128k16(
                acc, loom_wg_desc(tw + 64 * wg / 8 * GEMM_WG_SBO + 2 * ks * GEMM_WG_LBO,
                                  GEMM_WG_LBO, GEMM_WG_SBO),
                loom_wg_desc(tx + 2 * ks * GEMM_WG_LBO, GEMM_WG_LBO, GEMM_WG_SBO),
                seg_start && ks == 0 ? 0 : 1); /* a segment's sum starts from zero */
        loom_wg_commit();
        if (c + 1 < c_end) {
            const int64_t s1 = (c + 1) / SC;
            if (s1 * SC == c + 1) {
                /* the stage before was last read by the decodes of chunk c, done before the
                 * barrier above */
                gemm_stage<T, GEMM_WG_ROWS, GEMM_WG_THREADS>(a, n0, s1, w_align, raw);
                __syncthreads();
            }
            gemm_wg_fetch<T>(a, raw, n0, t0, s1, (int)(c + 1 - s1 * SC), c + 1, x_vec, v);
        }
    }
    loom_wg_wait<0>();
    if (c_end > c_begin) settle((c_end - 1) / seg_chunks);
    if (a.partial != NULL) return;

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
#else
    (void)mm; /* no wgmma in this build's code for the device: never launched (the probe) */
#endif
}
