/* qgemm_f16.c — tile kernels (qgemm.h) for F16 weights with F16 activations.
 *
 * The one-row kernel converts both the weight row and the activation row from half precision
 * for every (row, token) pair. Here a prepared token row holds its activations already as
 * float32 (zero-padded to a multiple of 32 values), and a weight row's 32-value chunk is
 * converted once for up to NT_MAX tokens (tile, weights in place). With AVX-512, steps of many
 * tokens (16 or 24 and more, prepare_min_tokens_f16) convert the weight rows too, once per
 * group of rows and block of tokens, and multiply blocks of 2 rows x 6 tokens (tile_prepared).
 *
 * Arithmetic of qdot.c's f16 dot, unchanged: w[i] * x[i] added into lane i % 32 (a product of
 * two halves is exact in float32, so the fused multiply-add rounds once, as the separate add
 * does), lanes folded 16, 8, 4, 2, 1 apart. A partial last chunk adds +0.0 products to its
 * unused lanes, which leaves them unchanged (no lane is ever -0.0: lanes start at +0.0 and a
 * sum is -0.0 only when both terms are). */
#include "tensor/qgemm.h"

#include <stdint.h>
#include <string.h>

#include "tensor/qdot_internal.h"

#if defined(LOOM_QDOT_AVX2)

#define CH 32 /* values per chunk: the dot's 32 lanes, as 4 vectors of 8 */

#if defined(LOOM_QDOT_AVX512)
#define NT_MAX 8 /* 16 accumulators (2 per token) + 2 weight vectors of the 32 zmm registers */
#else
#define NT_MAX 2 /* 8 accumulators + 4 weight vectors of the 16 ymm registers */
#endif

static size_t x_row_bytes(int64_t K) {
    const size_t n = (size_t)((K + CH - 1) / CH * CH) * sizeof(float);
    return (n + 63) & ~(size_t)63;
}

static void prepare_f16(const void *act, void *x, int64_t K) {
    const uint16_t *h = (const uint16_t *)act;
    float *f = (float *)x;
    int64_t i = 0;
    for (; i + 8 <= K; i += 8)
        _mm256_store_ps(f + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(h + i))));
    for (; i < K; i++) f[i] = _cvtsh_ss(h[i]);
    for (int64_t k = K; k < (K + CH - 1) / CH * CH; k++) f[k] = 0.0f;
}

#if defined(LOOM_QDOT_AVX512)
/* The 32-value chunk of row w (K halves) at c as float32 in wv[0] (lanes 0..15) and wv[1]
 * (16..31); past K, zero halves, so +0.0 products. */
LOOM__QINLINE void load_chunk(const uint16_t *w, int64_t c, int64_t K, __m512 wv[2]) {
    if (c + CH <= K) {
        wv[0] = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(w + c)));
        wv[1] = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(w + c + 16)));
    } else {
        uint16_t tail[CH] = {0};
        memcpy(tail, w + c, (size_t)(K - c) * sizeof(uint16_t));
        wv[0] = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)tail));
        wv[1] = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(tail + 16)));
    }
}

/* Row w (K halves) against NT prepared tokens; lanes 0..15 and 16..31 of the dot are the two
 * 512-bit accumulators of a token. */
LOOM__QINLINE void row_tokens(const uint16_t *w, const float *x0, size_t x_floats, int64_t K,
                              int NT, float *out, size_t out_stride) {
    __m512 acc[NT_MAX][2];
    for (int j = 0; j < NT; j++) acc[j][0] = acc[j][1] = _mm512_setzero_ps();
    for (int64_t c = 0; c < K; c += CH) {
        __m512 wv[2];
        loom__qd_prefetch(w + c, CH * sizeof(uint16_t));
        load_chunk(w, c, K, wv);
        for (int j = 0; j < NT; j++) {
            const float *x = x0 + (size_t)j * x_floats + c;
            acc[j][0] = _mm512_fmadd_ps(wv[0], _mm512_load_ps(x), acc[j][0]);
            acc[j][1] = _mm512_fmadd_ps(wv[1], _mm512_load_ps(x + 16), acc[j][1]);
        }
    }
    for (int j = 0; j < NT; j++) {
        /* 16 apart, then 8 apart (the halves), then 4, 2, 1 (loom__qd_fold8_ps) */
        const __m512 s = _mm512_add_ps(acc[j][0], acc[j][1]);
        const __m256 h = _mm256_add_ps(_mm512_castps512_ps256(s), _mm512_extractf32x8_ps(s, 1));
        out[(size_t)j * out_stride] = loom__qd_fold8_ps(h);
    }
}

/* Prepared rows (AVX-512, steps of many tokens): the weights are converted to float32 once
 * per group of rows and block of tokens, so that the loop below is loads and FMAs only. The
 * conversion is fused into the group's first block of tokens (fill), where it overlaps the
 * weights' arrival from memory as the in-place kernel's does; a separate pass would wait for
 * them (16 tokens x the 56 MB LM head of the SmolLM2-shaped model: 10.8 vs 17.6 ms).
 *
 * A block of R rows x NT tokens keeps 2 * R * NT accumulators in registers (lanes 0..15 and
 * 16..31 of each pair's dot); 2 rows x 6 tokens is 24 accumulators, 4 weight and 2 token
 * vectors of the 32 registers, and 16 loads per 24 FMAs. Six tokens' rows (up to 37 KB at K =
 * 1536) stay in L1 while the rows pass, where the in-place kernel's 8 or 16 tokens spill. Per
 * (row, token) the arithmetic is the one-row dot's, above. */
#define NR_BLK 2
#define NT_BLK 6

static size_t w_row_bytes_f16(int64_t K) {
    return x_row_bytes(K); /* the same float32 row, zero-padded to whole chunks */
}

/* The 12 dots of a full block (2 rows x 6 tokens) folded together: the additions of
 * loom__qd_fold8_ps's order (16 apart, 8, 4, 2, 1; the lower operand first), done on vectors
 * that hold several pairs at each level instead of one pair's lanes at a time. Pair p = 2 j + r
 * (token j, row r). */
LOOM__QINLINE void fold_2x6(const __m512 acc[NR_BLK][NT_BLK][2], float *out, size_t out_stride) {
    __m512 S[12], H[6], B[3], C[2];
    for (int j = 0; j < 6; j++)
        for (int r = 0; r < 2; r++) S[2 * j + r] = _mm512_add_ps(acc[r][j][0], acc[r][j][1]);
    /* 8 apart: H[m] = pair 2m's 8 sums, then pair 2m + 1's */
    for (int m = 0; m < 6; m++)
        H[m] = _mm512_add_ps(_mm512_shuffle_f32x4(S[2 * m], S[2 * m + 1], 0x44),
                             _mm512_shuffle_f32x4(S[2 * m], S[2 * m + 1], 0xEE));
    /* 4 apart: 128-bit block k of B[n] holds pair 4n + k */
    for (int n = 0; n < 3; n++)
        B[n] = _mm512_add_ps(_mm512_shuffle_f32x4(H[2 * n], H[2 * n + 1], 0x88),
                             _mm512_shuffle_f32x4(H[2 * n], H[2 * n + 1], 0xDD));
    /* 2 apart: block k of C[q] holds pairs 8q + k (lanes 0, 1) and 8q + 4 + k (lanes 2, 3) */
    const __m512 z = _mm512_setzero_ps();
    C[0] = _mm512_add_ps(_mm512_shuffle_ps(B[0], B[1], 0x44), _mm512_shuffle_ps(B[0], B[1], 0xEE));
    C[1] = _mm512_add_ps(_mm512_shuffle_ps(B[2], z, 0x44), _mm512_shuffle_ps(B[2], z, 0xEE));
    /* 1 apart: lane 4k + l holds pair 4l + k; permuted so that lane p holds pair p */
    const __m512 R =
        _mm512_add_ps(_mm512_shuffle_ps(C[0], C[1], 0x88), _mm512_shuffle_ps(C[0], C[1], 0xDD));
    const __m512 P = _mm512_permutexvar_ps(
        _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15), R);
    /* tokens 2q and 2q + 1, 2 rows each, from 128-bit block q */
    const __m128 v0 = _mm512_extractf32x4_ps(P, 0), v1 = _mm512_extractf32x4_ps(P, 1),
                 v2 = _mm512_extractf32x4_ps(P, 2);
    _mm_storel_pi((__m64 *)out, v0);
    _mm_storeh_pi((__m64 *)(out + out_stride), v0);
    _mm_storel_pi((__m64 *)(out + 2 * out_stride), v1);
    _mm_storeh_pi((__m64 *)(out + 3 * out_stride), v1);
    _mm_storel_pi((__m64 *)(out + 4 * out_stride), v2);
    _mm_storeh_pi((__m64 *)(out + 5 * out_stride), v2);
}

/* Rows wp (R of them, w_floats apart, prepared) against NT prepared tokens; Kp: K rounded up
 * to whole chunks (both sides are zero there, so the products are +0.0). FILL: convert the
 * rows from wh (halves, wh_stride bytes apart) into wp on the way. */
LOOM__QINLINE uintptr_t rows_tokens(const uint16_t *wh, size_t wh_stride, float *wp,
                                    size_t w_floats, int R, const float *x0, size_t x_floats,
                                    int64_t K, int64_t Kp, int NT, int FILL, float *out,
                                    size_t out_stride, uintptr_t pf, uintptr_t pf_end) {
    __m512 acc[NR_BLK][NT_BLK][2];
    for (int r = 0; r < R; r++)
        for (int j = 0; j < NT; j++) acc[r][j][0] = acc[r][j][1] = _mm512_setzero_ps();
    for (int64_t c = 0; c < Kp; c += CH) {
        __m512 wv[NR_BLK][2];
        for (int r = 0; r < R; r++) {
            float *wr = wp + (size_t)r * w_floats + c;
            if (FILL) {
                const uint16_t *h = (const uint16_t *)((const uint8_t *)wh + (size_t)r * wh_stride);
                loom__qd_prefetch(h + c, CH * sizeof(uint16_t));
                load_chunk(h, c, K, wv[r]);
                _mm512_store_ps(wr, wv[r][0]);
                _mm512_store_ps(wr + 16, wv[r][1]);
            } else {
                wv[r][0] = _mm512_load_ps(wr);
                wv[r][1] = _mm512_load_ps(wr + 16);
            }
        }
        if (!FILL && pf < pf_end) { /* the next group's rows, one line per chunk */
            _mm_prefetch((const char *)pf, _MM_HINT_T1);
            pf += 64;
        }
        for (int j = 0; j < NT; j++) {
            const float *x = x0 + (size_t)j * x_floats + c;
            __m512 xa = _mm512_load_ps(x), xb = _mm512_load_ps(x + 16);
            if (R > 1) /* loaded once for both rows, not folded into each FMA */
                __asm__("" : "+v"(xa), "+v"(xb));
            for (int r = 0; r < R; r++) {
                acc[r][j][0] = _mm512_fmadd_ps(wv[r][0], xa, acc[r][j][0]);
                acc[r][j][1] = _mm512_fmadd_ps(wv[r][1], xb, acc[r][j][1]);
            }
        }
    }
    if (R == 2 && NT == 6) { /* the full blocks: 1.04-1.07x at K = 576 (alternated in-process) */
        fold_2x6(acc, out, out_stride);
        return pf;
    }
    for (int r = 0; r < R; r++)
        for (int j = 0; j < NT; j++) {
            /* 16 apart, then 8 apart (the halves), then 4, 2, 1 (loom__qd_fold8_ps) */
            const __m512 s = _mm512_add_ps(acc[r][j][0], acc[r][j][1]);
            const __m256 h = _mm256_add_ps(_mm512_castps512_ps256(s), _mm512_extractf32x8_ps(s, 1));
            out[(size_t)j * out_stride + (size_t)r] = loom__qd_fold8_ps(h);
        }
    return pf;
}

/* R rows against NT (1..NT_BLK) tokens, with NT and FILL constants in each call so that the
 * accumulators stay in registers. */
#define ROWS_TOKENS(nt, fill)                                                                      \
    return rows_tokens(wh, wh_stride, wp, w_floats, R, x0, x_floats, K, Kp, nt, fill, out,         \
                       out_stride, pf, pf_end)
LOOM__QINLINE uintptr_t rows_tokens_any(const uint16_t *wh, size_t wh_stride, float *wp,
                                        size_t w_floats, int R, const float *x0, size_t x_floats,
                                        int64_t K, int64_t Kp, int NT, int fill, float *out,
                                        size_t out_stride, uintptr_t pf, uintptr_t pf_end) {
    if (fill) {
        switch (NT) {
        case 6:
            ROWS_TOKENS(6, 1);
        case 5:
            ROWS_TOKENS(5, 1);
        case 4:
            ROWS_TOKENS(4, 1);
        case 3:
            ROWS_TOKENS(3, 1);
        case 2:
            ROWS_TOKENS(2, 1);
        default:
            ROWS_TOKENS(1, 1);
        }
    } else {
        switch (NT) {
        case 6:
            ROWS_TOKENS(6, 0);
        case 5:
            ROWS_TOKENS(5, 0);
        case 4:
            ROWS_TOKENS(4, 0);
        case 3:
            ROWS_TOKENS(3, 0);
        case 2:
            ROWS_TOKENS(2, 0);
        default:
            ROWS_TOKENS(1, 0);
        }
    }
}
#undef ROWS_TOKENS

/* nr rows against nt tokens: blocks of NT_BLK tokens (they stay in L1 while the rows pass),
 * each against the rows in pairs; the first block converts the rows into wp when fill is
 * set. */
static void tile_f16_prepared(const void *w, size_t w_stride, int nr, void *wp, int fill,
                              const void *x, size_t x_stride, int nt, int64_t K, float *out,
                              size_t out_stride) {
    const size_t x_floats = x_stride / sizeof(float);
    const size_t w_floats = w_row_bytes_f16(K) / sizeof(float);
    const int64_t Kp = (K + CH - 1) / CH * CH;
    /* The call that fills wp also prefetches the rows that follow this group (the matmul's
     * next group, when there is one; a prefetch past the tensor is harmless, and addresses are
     * integers here so that none is formed past it) while its later blocks run on wp, so that
     * the next fill finds them in L2 instead of waiting for memory: 1.07-1.09x on the
     * 49,152-row LM head at 16 and 24 tokens. */
    uintptr_t pf = (uintptr_t)w + (uintptr_t)nr * w_stride;
    const uintptr_t pf_end = fill ? pf + (uintptr_t)nr * w_stride : pf;
    for (int t0 = 0; t0 < nt; t0 += NT_BLK) {
        const int n = nt - t0 < NT_BLK ? nt - t0 : NT_BLK, f = fill && t0 == 0;
        const float *xt = (const float *)x + (size_t)t0 * x_floats;
        float *o = out + (size_t)t0 * out_stride;
        int r = 0;
        for (; r + 2 <= nr; r += 2)
            pf = rows_tokens_any((const uint16_t *)((const uint8_t *)w + (size_t)r * w_stride),
                                 w_stride, (float *)wp + (size_t)r * w_floats, w_floats, 2, xt,
                                 x_floats, K, Kp, n, f, o + r, out_stride, pf, pf_end);
        if (r < nr)
            pf = rows_tokens_any((const uint16_t *)((const uint8_t *)w + (size_t)r * w_stride),
                                 w_stride, (float *)wp + (size_t)r * w_floats, w_floats, 1, xt,
                                 x_floats, K, Kp, n, f, o + r, out_stride, pf, pf_end);
    }
}
#else
/* Row w (K halves) against NT prepared tokens; lanes 8k .. 8k+7 of the dot are acc[.][k]. */
LOOM__QINLINE void row_tokens(const uint16_t *w, const float *x0, size_t x_floats, int64_t K,
                              int NT, float *out, size_t out_stride) {
    __m256 acc[NT_MAX][4];
    for (int j = 0; j < NT; j++)
        for (int k = 0; k < 4; k++) acc[j][k] = _mm256_setzero_ps();
    for (int64_t c = 0; c < K; c += CH) {
        __m256 wv[4];
        loom__qd_prefetch(w + c, CH * sizeof(uint16_t));
        if (c + CH <= K) {
            for (int k = 0; k < 4; k++)
                wv[k] = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(w + c + 8 * k)));
        } else { /* tail: zero halves, so +0.0 products */
            uint16_t tail[CH] = {0};
            memcpy(tail, w + c, (size_t)(K - c) * sizeof(uint16_t));
            for (int k = 0; k < 4; k++)
                wv[k] = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(tail + 8 * k)));
        }
        for (int j = 0; j < NT; j++) {
            const float *x = x0 + (size_t)j * x_floats + c;
            for (int k = 0; k < 4; k++)
                acc[j][k] = _mm256_fmadd_ps(wv[k], _mm256_load_ps(x + 8 * k), acc[j][k]);
        }
    }
    for (int j = 0; j < NT; j++) {
        /* 16 apart, then 8 apart (vector adds), then 4, 2, 1 (loom__qd_fold8_ps) */
        const __m256 s0 = _mm256_add_ps(acc[j][0], acc[j][2]);
        const __m256 s1 = _mm256_add_ps(acc[j][1], acc[j][3]);
        out[(size_t)j * out_stride] = loom__qd_fold8_ps(_mm256_add_ps(s0, s1));
    }
}
#endif

/* Rows against nt tokens, in calls of constant token counts (each keeps its accumulators in
 * registers): NT_MAX at a time, then 4, 2, 1. */
static void tile_f16(const void *w, size_t w_stride, int nr, const void *x, size_t x_stride, int nt,
                     int64_t K, float *out, size_t out_stride) {
    const size_t x_floats = x_stride / sizeof(float);
    for (int r = 0; r < nr; r++) {
        const uint16_t *wr = (const uint16_t *)((const uint8_t *)w + (size_t)r * w_stride);
        int t0 = 0;
        while (t0 < nt) {
            const float *xt = (const float *)x + (size_t)t0 * x_floats;
            float *o = out + (size_t)t0 * out_stride + (size_t)r;
            const int left = nt - t0;
            if (left >= NT_MAX) {
                row_tokens(wr, xt, x_floats, K, NT_MAX, o, out_stride);
                t0 += NT_MAX;
#if NT_MAX > 4
            } else if (left >= 4) {
                row_tokens(wr, xt, x_floats, K, 4, o, out_stride);
                t0 += 4;
#endif
            } else if (left >= 2) {
                row_tokens(wr, xt, x_floats, K, 2, o, out_stride);
                t0 += 2;
            } else {
                row_tokens(wr, xt, x_floats, K, 1, o, out_stride);
                t0 += 1;
            }
        }
    }
}

#if defined(LOOM_QDOT_AVX512)
/* Where prepared rows pay (2 threads, 16 tokens, alternated in one process, weights cold as in
 * a model: a fresh copy of the matrix for each call): at K = 1536 from 16 tokens (1.46x: the
 * in-place kernel's 16 token rows no longer fit L1), at K = 576 from 24 (16: 0.90x; 24:
 * 1.10x; 32: 1.24x). */
static int prepare_min_tokens_f16(int64_t K) {
    return K >= 1024 ? 16 : 24;
}
#endif

/* One token gains nothing: the row's conversion is not shared (loom-kernel-bench). Prepared
 * rows 24 tokens per call (four blocks of NT_BLK). */
static const loom__qgemm_kernels kernels_f16 = {
    .min_tokens = 2,
    .x_row_bytes = x_row_bytes,
    .prepare_x = prepare_f16,
    .tile = tile_f16,
#if defined(LOOM_QDOT_AVX512)
    .w_row_bytes = w_row_bytes_f16,
    .tile_prepared = tile_f16_prepared,
    .prepare_min_tokens = prepare_min_tokens_f16,
    .prepared_tokens_per_call = 4 * NT_BLK,
#endif
};

const loom__qgemm_kernels *LOOM_ISA_SYM(loom__qgemm_float)(uint32_t weight_type) {
    return weight_type == LOOM_TYPE_F16 ? &kernels_f16 : NULL;
}

#else /* no AVX2: the one-row kernels */

const loom__qgemm_kernels *LOOM_ISA_SYM(loom__qgemm_float)(uint32_t weight_type) {
    (void)weight_type;
    return NULL;
}

#endif
