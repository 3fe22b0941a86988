/* quant_k.c — the K-quant formats (256-value super-blocks): decoding of q2_K .. q6_K, their row
 * dot products, and the reference quantizer of q8_K, the activation format of K-quant integer
 * dot products.
 *
 * Decoding follows the format's definition (quant_layouts.h) with the float32 operations in
 * the order the `gguf` Python package (and ggml's reference) uses: the sub-block scale is
 * formed first (d * sc), then applied to the code, then the sub-block offset subtracted, each
 * rounded separately (no FMA contraction), so the results are bit-identical to theirs. */
#include <math.h>

#include "tensor/quant_internal.h"

/* No fused multiply-add: results must round each operation as the reference does. GCC keeps
 * contraction off in ISO C mode (the build's -std=c11); clang needs to be told. */
#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#endif

/* ---- q2_K --------------------------------------------------------------------------------- */

LOOM__INLINE void decode_q2_K(const void *blk, float *y) {
    const loom__block_q2_K *b = (const loom__block_q2_K *)blk;
    float d = loom__f16_to_f32(b->d);
    float dmin = loom__f16_to_f32(b->dmin);
    /* Value v = 128h + 32s + l sits in bits 2s of qs[32h + l]; sub-block v / 16. */
    for (int h = 0; h < 2; h++) {
        for (int s = 0; s < 4; s++) {
            for (int half = 0; half < 2; half++) {
                uint8_t sc = b->scales[8 * h + 2 * s + half];
                float dl = d * (float)(sc & 15u);
                float ml = dmin * (float)(sc >> 4);
                const uint8_t *q = b->qs + 32 * h + 16 * half;
                float *out = y + 128 * h + 32 * s + 16 * half;
                for (int l = 0; l < 16; l++) out[l] = dl * (float)((q[l] >> (2 * s)) & 3u) - ml;
            }
        }
    }
}

/* ---- q3_K --------------------------------------------------------------------------------- */

/* The 16 signed 6-bit sub-block scales (already minus 32). */
static void unpack_scales_q3_K(const uint8_t packed[12], int sc[16]) {
    for (int i = 0; i < 16; i++) {
        unsigned lo = (packed[i % 8] >> (4 * (i / 8))) & 15u;
        unsigned hi = (packed[8 + i % 4] >> (2 * (i / 4))) & 3u;
        sc[i] = (int)(lo | hi << 4) - 32;
    }
}

LOOM__INLINE void decode_q3_K(const void *blk, float *y) {
    const loom__block_q3_K *b = (const loom__block_q3_K *)blk;
    float d = loom__f16_to_f32(b->d);
    int sc[16];
    unpack_scales_q3_K(b->scales, sc);
    /* Value v = 128h + 32s + l: low bits at 2s of qs[32h + l], high bit v / 32 of hmask[l]; a
     * clear high bit means the code is 4 lower. */
    for (int h = 0; h < 2; h++) {
        for (int s = 0; s < 4; s++) {
            int hbit = 4 * h + s; /* == v / 32 */
            for (int half = 0; half < 2; half++) {
                float dl = d * (float)sc[8 * h + 2 * s + half];
                int l0 = 16 * half;
                float *out = y + 128 * h + 32 * s;
                for (int l = l0; l < l0 + 16; l++) {
                    int lo = (b->qs[32 * h + l] >> (2 * s)) & 3;
                    int high = (b->hmask[l] >> hbit) & 1;
                    out[l] = dl * (float)(lo - (high ? 0 : 4));
                }
            }
        }
    }
}

/* ---- q4_K and q5_K ------------------------------------------------------------------------ */

/* The 8 six-bit scales and mins packed in 12 bytes (layout in quant_layouts.h). */
static void unpack_scales_mins_k4(const uint8_t p[LOOM_K_SCALE_BYTES], uint8_t sc[8],
                                  uint8_t mn[8]) {
    for (int i = 0; i < 4; i++) {
        sc[i] = p[i] & 63u;
        mn[i] = p[i + 4] & 63u;
        sc[i + 4] = (uint8_t)((p[i + 8] & 15u) | (p[i] >> 6) << 4);
        mn[i + 4] = (uint8_t)((p[i + 8] >> 4) | (p[i + 4] >> 6) << 4);
    }
}

LOOM__INLINE void decode_q4_K(const void *blk, float *y) {
    const loom__block_q4_K *b = (const loom__block_q4_K *)blk;
    float d = loom__f16_to_f32(b->d);
    float dmin = loom__f16_to_f32(b->dmin);
    uint8_t sc[8], mn[8];
    unpack_scales_mins_k4(b->scales, sc, mn);
    /* Sub-blocks 2c and 2c+1 are the low and high nibbles of qs[32c .. 32c+32). */
    for (int c = 0; c < 4; c++) {
        float d_lo = d * (float)sc[2 * c], m_lo = dmin * (float)mn[2 * c];
        float d_hi = d * (float)sc[2 * c + 1], m_hi = dmin * (float)mn[2 * c + 1];
        const uint8_t *q = b->qs + 32 * c;
        float *out = y + 64 * c;
        for (int l = 0; l < 32; l++) out[l] = d_lo * (float)(q[l] & 15u) - m_lo;
        for (int l = 0; l < 32; l++) out[32 + l] = d_hi * (float)(q[l] >> 4) - m_hi;
    }
}

LOOM__INLINE void decode_q5_K(const void *blk, float *y) {
    const loom__block_q5_K *b = (const loom__block_q5_K *)blk;
    float d = loom__f16_to_f32(b->d);
    float dmin = loom__f16_to_f32(b->dmin);
    uint8_t sc[8], mn[8];
    unpack_scales_mins_k4(b->scales, sc, mn);
    /* As q4_K; bit 4 of value v's code is bit v / 32 of qh[v % 32]. */
    for (int c = 0; c < 4; c++) {
        float d_lo = d * (float)sc[2 * c], m_lo = dmin * (float)mn[2 * c];
        float d_hi = d * (float)sc[2 * c + 1], m_hi = dmin * (float)mn[2 * c + 1];
        const uint8_t *q = b->qs + 32 * c;
        float *out = y + 64 * c;
        for (int l = 0; l < 32; l++) {
            unsigned code = (q[l] & 15u) | ((b->qh[l] >> (2 * c)) & 1u) << 4;
            out[l] = d_lo * (float)code - m_lo;
        }
        for (int l = 0; l < 32; l++) {
            unsigned code = (unsigned)(q[l] >> 4) | ((b->qh[l] >> (2 * c + 1)) & 1u) << 4;
            out[32 + l] = d_hi * (float)code - m_hi;
        }
    }
}

/* ---- q6_K --------------------------------------------------------------------------------- */

LOOM__INLINE void decode_q6_K(const void *blk, float *y) {
    const loom__block_q6_K *b = (const loom__block_q6_K *)blk;
    float d = loom__f16_to_f32(b->d);
    /* Value v = 128h + 32s + l: low nibble (s / 2) of ql[64h + 32(s % 2) + l], high two bits at
     * 2s of qh[32h + l]; sub-block v / 16. One pass over l produces the four values (s = 0..3)
     * that share qh[32h + l], with constant shifts. */
    for (int h = 0; h < 2; h++) {
        const uint8_t *ql = b->ql + 64 * h, *qh = b->qh + 32 * h;
        const int8_t *sc = b->scales + 8 * h;
        float *out = y + 128 * h;
        for (int half = 0; half < 2; half++) {
            float d0 = d * (float)sc[0 + half], d1 = d * (float)sc[2 + half];
            float d2 = d * (float)sc[4 + half], d3 = d * (float)sc[6 + half];
            for (int l = 16 * half; l < 16 * half + 16; l++) {
                int q0 = (int)((ql[l] & 15u) | (qh[l] & 3u) << 4) - 32;
                int q1 = (int)((ql[l + 32] & 15u) | ((qh[l] >> 2) & 3u) << 4) - 32;
                int q2 = (int)((ql[l] >> 4) | ((qh[l] >> 4) & 3u) << 4) - 32;
                int q3 = (int)((ql[l + 32] >> 4) | ((qh[l] >> 6) & 3u) << 4) - 32;
                out[l] = d0 * (float)q0;
                out[l + 32] = d1 * (float)q1;
                out[l + 64] = d2 * (float)q2;
                out[l + 96] = d3 * (float)q3;
            }
        }
    }
}

/* ---- q8_K (activation format): reference quantizer ----------------------------------------
 * The value of largest magnitude maps to code -128 (its sign goes into d), the rest to the
 * nearest code, ties away from zero, clamped to [-128, 127]. bsums hold the sums of each group
 * of 16 codes. Non-finite input gives a defined block (NaN codes become 0), never UB. */

static void quant_block_q8_K(const float *x, loom__block_q8_K *b) {
    int imax = 0;
    for (int j = 1; j < LOOM_QK_K; j++)
        if (fabsf(x[j]) > fabsf(x[imax])) imax = j;
    float max = x[imax];
    if (max == 0.0f) {
        b->d = 0.0f;
        for (int j = 0; j < LOOM_QK_K; j++) b->qs[j] = 0;
        for (int g = 0; g < LOOM_QK_K / 16; g++) b->bsums[g] = 0;
        return;
    }
    float iscale = -128.0f / max;
    for (int j = 0; j < LOOM_QK_K; j++) {
        float v = iscale * x[j];
        int8_t q;
        if (!(v == v))
            q = 0;
        else if (v >= 127.0f)
            q = 127;
        else if (v <= -128.0f)
            q = -128;
        else
            q = (int8_t)roundf(v);
        b->qs[j] = q;
    }
    b->d = 1.0f / iscale;
    for (int g = 0; g < LOOM_QK_K / 16; g++) {
        int sum = 0;
        for (int l = 0; l < 16; l++) sum += b->qs[16 * g + l];
        b->bsums[g] = (int16_t)sum; /* |sum| <= 16 * 128: fits */
    }
}

static void quant_row_q8_K(const float *src, void *dst, int64_t n) {
    loom__block_q8_K *b = (loom__block_q8_K *)dst;
    for (int64_t i = 0; i < n / LOOM_QK_K; i++) quant_block_q8_K(src + i * LOOM_QK_K, &b[i]);
}

/* ---- row kernels -------------------------------------------------------------------------- */

#define K_ROW_KERNELS(fmt)                                                                         \
    static void dequant_row_##fmt(const void *src, float *dst, int64_t n) {                        \
        loom__dequant_blocks(src, dst, n, sizeof(loom__block_##fmt), LOOM_QK_K, decode_##fmt);     \
    }                                                                                              \
    static float dot_##fmt(const void *w, const float *x, int64_t n) {                             \
        return loom__dot_blocks(w, x, n, sizeof(loom__block_##fmt), LOOM_QK_K, decode_##fmt);      \
    }                                                                                              \
    static const loom__qkernels kernels_##fmt = {                                                  \
        .dequant_row = dequant_row_##fmt, .quant_row = NULL, .dot = dot_##fmt};

K_ROW_KERNELS(q2_K)
K_ROW_KERNELS(q3_K)
K_ROW_KERNELS(q4_K)
K_ROW_KERNELS(q5_K)
K_ROW_KERNELS(q6_K)

static const loom__qkernels kernels_q8_K = {
    .dequant_row = NULL, .quant_row = quant_row_q8_K, .dot = NULL};

const loom__qkernels *loom__qkernels_kquant(uint32_t t) {
    switch (t) {
    case LOOM_TYPE_Q2_K:
        return &kernels_q2_K;
    case LOOM_TYPE_Q3_K:
        return &kernels_q3_K;
    case LOOM_TYPE_Q4_K:
        return &kernels_q4_K;
    case LOOM_TYPE_Q5_K:
        return &kernels_q5_K;
    case LOOM_TYPE_Q6_K:
        return &kernels_q6_K;
    case LOOM_TYPE_Q8_K:
        return &kernels_q8_K;
    default:
        return NULL;
    }
}
