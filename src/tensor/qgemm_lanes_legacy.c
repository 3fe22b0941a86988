/* qgemm_lanes_legacy.c — token-lane kernels (qgemm.h) for q4_0, q4_1, q5_0, q5_1, q8_0.
 *
 * Prepared group of LW tokens (qgemm_lanes.h: 16 with AVX-512, else 8), per block b (XB bytes
 * apart):
 *   codes    [8 chunks c][LW tokens j][4 bytes]  = token j's codes 4c .. 4c+3 of block b
 *   dx[LW]   float   activation scales       sx[LW]  float  q8_1's stored d * sum (q4_1, q5_1)
 *   xoff[LW] int32   off * sum(codes) with off the weight's code offset (see qgemm_legacy.c)
 * Per row and block: the block's unsigned codes u are unpacked once (qgemm_unpack.h) and each
 * 4-byte chunk is broadcast against the LW tokens' chunk: after 8 vpdpbusd, lane j holds
 * sum(u x) of token j, and isum = that - xoff. The float part is qdot_legacy.c's, on vectors of
 * LW tokens: t = (dw * dx) * isum (+ mw * sx), added to accumulator b % 8; the 8 accumulators
 * are folded as loom__qd_fold8 folds lanes. Same operations per (row, token) as the one-row
 * kernels, so the same bits. */
#include "tensor/qgemm.h"

#include <string.h>

#include "tensor/qdot_internal.h"
#include "tensor/qgemm_unpack.h"

#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#endif

#if defined(LOOM_QDOT_VNNI)

#include "tensor/qgemm_lanes.h"

#define LQ     32                     /* values per block */
#define XB     (LW * 32 + 3 * LW * 4) /* prepared bytes per block: codes, dx, sx, xoff */
#define XB_DX  (LW * 32)
#define XB_SX  (LW * 36)
#define XB_OFF (LW * 40)

static size_t x8_bytes(int64_t K) {
    return ((size_t)(K / LQ) * XB + 63) & ~(size_t)63;
}

/* act: n rows of q8_0 (with_s false) or q8_1 blocks. */
LOOM__QINLINE void prepare_lanes(const void *act, size_t act_stride, int n, void *x8, int64_t K,
                                 bool with_s, int off) {
    const size_t bytes = with_s ? sizeof(loom__block_q8_1) : sizeof(loom__block_q8_0);
    const size_t codes = with_s ? offsetof(loom__block_q8_1, qs) : offsetof(loom__block_q8_0, qs);
    memset(x8, 0, x8_bytes(K));
    for (int j = 0; j < n; j++) {
        const uint8_t *a = (const uint8_t *)act + (size_t)j * act_stride;
        uint8_t *xb = (uint8_t *)x8;
        for (int64_t b = 0; b < K / LQ; b++, a += bytes, xb += XB) {
            int32_t sum = 0;
            for (int c = 0; c < 8; c++) {
                memcpy(xb + 4 * LW * c + 4 * j, a + codes + 4 * c, 4);
                for (int i = 0; i < 4; i++) sum += ((const int8_t *)(a + codes))[4 * c + i];
            }
            ((float *)(xb + XB_DX))[j] = loom__qd_f16((const uint16_t *)a);
            ((float *)(xb + XB_SX))[j] = with_s ? loom__qd_f16((const uint16_t *)(a + 2)) : 0.0f;
            ((int32_t *)(xb + XB_OFF))[j] = off * sum;
        }
    }
}

#define LANES_PREPARE(name, with_s, off)                                                           \
    static void name(const void *act, size_t act_stride, int n, void *x8, int64_t K) {             \
        prepare_lanes(act, act_stride, n, x8, K, with_s, off);                                     \
    }
LANES_PREPARE(prepare_off8, false, 8)
LANES_PREPARE(prepare_off16, false, 16)
LANES_PREPARE(prepare_off128, false, 128)
LANES_PREPARE(prepare_q8_1, true, 0)

/* One block of one row against the LW tokens: t of qdot_legacy.c, lanes = tokens. */
LOOM__QINLINE vf block_term(const uint8_t *blk, const uint8_t *xb, legacy_fmt fmt, bool with_min) {
    vi s = V_ZERO_SI();
    if (fmt == FMT_Q8_0) {
        /* the codes are bytes already: broadcast them from the block, flip the top bits */
        const int8_t *qs = ((const loom__block_q8_0 *)blk)->qs;
        const vi flip = V_SET1_EPI32((int32_t)0x80808080u);
        for (int c = 0; c < 8; c++) {
            int32_t chunk;
            memcpy(&chunk, qs + 4 * c, 4); /* a broadcast load; the flip stays in vectors */
            s = V_DPBUSD(s, V_XOR_SI(V_SET1_EPI32(chunk), flip), V_LOAD_SI(xb + 4 * LW * c));
        }
    } else {
        _Alignas(32) uint8_t u[LQ];
        _mm256_store_si256((__m256i *)u, block_codes(blk, fmt));
        for (int c = 0; c < 8; c++) {
            int32_t chunk;
            memcpy(&chunk, u + 4 * c, 4);
            s = V_DPBUSD(s, V_SET1_EPI32(chunk), V_LOAD_SI(xb + 4 * LW * c));
        }
    }
    const vi isum = V_SUB_EPI32(s, V_LOAD_SI(xb + XB_OFF));
    /* d (and m) are the block's first f16 fields in every legacy format */
    const vf dw = V_SET1_PS(loom__qd_f16((const uint16_t *)blk));
    vf t = V_MUL_PS(V_MUL_PS(dw, V_LOAD_PS((const float *)(xb + XB_DX))), V_CVT(isum));
    if (with_min) {
        const vf mw = V_SET1_PS(loom__qd_f16((const uint16_t *)blk + 1));
        t = V_ADD_PS(t, V_MUL_PS(mw, V_LOAD_PS((const float *)(xb + XB_SX))));
    }
    return t;
}

LOOM__QINLINE void tile8_legacy(const void *w, size_t w_stride, int nr, const void *x8, int nt,
                                int64_t K, float *out, size_t out_stride, legacy_fmt fmt,
                                bool with_min) {
    const int64_t nb = K / LQ;
    const size_t wb = legacy_block_bytes(fmt);
    for (int r = 0; r < nr; r++) {
        const uint8_t *wr = (const uint8_t *)w + (size_t)r * w_stride;
        const uint8_t *xb = (const uint8_t *)x8;
        vf acc[8];
        for (int k = 0; k < 8; k++) acc[k] = V_ZERO_PS();
        /* k is a constant in every statement (the last group tests b + k < nb instead of
         * looping to it), so the 8 accumulators stay in registers */
        for (int64_t b = 0; b < nb; b += 8) {
            /* a row is read from memory once per call: ask for its bytes a few KiB ahead (the
             * LM head streams 170 MB per step; this is 7% of its time there) */
            loom__qd_prefetch(wr + (size_t)b * wb, 8 * wb);
#if defined(__GNUC__)
#pragma GCC unroll 8
#endif
            for (int k = 0; k < 8; k++)
                if (b + k < nb)
                    acc[k] = V_ADD_PS(acc[k], block_term(wr + (size_t)(b + k) * wb,
                                                         xb + (size_t)(b + k) * XB, fmt, with_min));
        }
        /* loom__qd_fold8's order, on vectors */
        const vf f0 = V_ADD_PS(acc[0], acc[4]), f1 = V_ADD_PS(acc[1], acc[5]);
        const vf f2 = V_ADD_PS(acc[2], acc[6]), f3 = V_ADD_PS(acc[3], acc[7]);
        _Alignas(64) float lane[LW];
        V_STORE_PS(lane, V_ADD_PS(V_ADD_PS(f0, f2), V_ADD_PS(f1, f3)));
        for (int j = 0; j < nt; j++) out[(size_t)j * out_stride + (size_t)r] = lane[j];
    }
}

#define LANES_TILE(fmt, FMT, with_min, prep)                                                       \
    static void tile8_##fmt(const void *w, size_t ws, int nr, const void *x8, int nt, int64_t K,   \
                            float *out, size_t os) {                                               \
        tile8_legacy(w, ws, nr, x8, nt, K, out, os, FMT, with_min);                                \
    }                                                                                              \
    static const loom__qgemm_lanes lanes_##fmt = {LW, x8_bytes, prep, tile8_##fmt};
LANES_TILE(q4_0, FMT_Q4_0, false, prepare_off8)
LANES_TILE(q4_1, FMT_Q4_1, true, prepare_q8_1)
LANES_TILE(q5_0, FMT_Q5_0, false, prepare_off16)
LANES_TILE(q5_1, FMT_Q5_1, true, prepare_q8_1)
LANES_TILE(q8_0, FMT_Q8_0, false, prepare_off128)

const loom__qgemm_lanes *LOOM_ISA_SYM(loom__qgemm_lanes_legacy)(uint32_t weight_type) {
    switch (weight_type) {
    case LOOM_TYPE_Q4_0:
        return &lanes_q4_0;
    case LOOM_TYPE_Q4_1:
        return &lanes_q4_1;
    case LOOM_TYPE_Q5_0:
        return &lanes_q5_0;
    case LOOM_TYPE_Q5_1:
        return &lanes_q5_1;
    case LOOM_TYPE_Q8_0:
        return &lanes_q8_0;
    default:
        return NULL;
    }
}

#else /* no integer dot instructions */

const loom__qgemm_lanes *LOOM_ISA_SYM(loom__qgemm_lanes_legacy)(uint32_t weight_type) {
    (void)weight_type;
    return NULL;
}

#endif
