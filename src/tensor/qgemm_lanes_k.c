/* qgemm_lanes_k.c — token-lane kernels (qgemm.h) for q4_K, q5_K and q6_K.
 *
 * Prepared group of LW tokens (qgemm_lanes.h), per super-block (XK bytes apart):
 *   codes  [64 chunks c][LW tokens j][4 bytes]   token j's codes 4c .. 4c+3
 *   bsums  [8 pairs p][LW tokens j][2 int16]     token j's sums of 16 codes 2p and 2p+1
 *   d[LW]  float                                  token j's q8_K scale
 * Per row and super-block: the unsigned codes u (qgemm_unpack.h) of each sub-block are
 * broadcast 4 at a time against the tokens' chunks, so lane j of a vpdpbusd accumulator holds
 * token j's sub-block sum S; isum = sum over sub-blocks of scale * S (vpmulld; exact), msum =
 * the bsum multipliers against the tokens' bsums (vpmaddwd on pairs). Then qdot_k.c's float
 * part on vectors of LW tokens, super-block by super-block — the same operations per (row,
 * token) as the one-row kernels, so the same bits. */
#include "tensor/qgemm.h"

#include <string.h>

#include "tensor/qdot_internal.h"
#include "tensor/qgemm_unpack.h"

#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#endif

#if defined(LOOM_QDOT_VNNI)

#include "tensor/qgemm_lanes.h"

#define XK       (LW * (256 + 32 + 4)) /* prepared bytes per super-block: codes, bsums, d */
#define XK_BSUMS (LW * 256)
#define XK_D     (LW * 288)

static size_t x8_bytes(int64_t K) {
    return ((size_t)(K / LOOM_QK_K) * XK + 63) & ~(size_t)63;
}

static void prepare_x8(const void *act, size_t act_stride, int n, void *x8, int64_t K) {
    memset(x8, 0, x8_bytes(K));
    for (int j = 0; j < n; j++) {
        const loom__block_q8_K *a =
            (const loom__block_q8_K *)((const uint8_t *)act + (size_t)j * act_stride);
        for (int64_t b = 0; b < K / LOOM_QK_K; b++) {
            uint8_t *xb = (uint8_t *)x8 + (size_t)b * XK;
            for (int c = 0; c < 64; c++) memcpy(xb + 4 * LW * c + 4 * j, a[b].qs + 4 * c, 4);
            for (int p = 0; p < 8; p++)
                memcpy(xb + XK_BSUMS + 4 * LW * p + 4 * j, a[b].bsums + 2 * p, 4);
            ((float *)(xb + XK_D))[j] = a[b].d;
        }
    }
}

/* Lane j: sum over the n4 4-byte chunks starting at chunk c0 of u[4c] . x_j[4c]. */
LOOM__QINLINE vi chunk_sums(const uint8_t *u, const uint8_t *xb, int c0, int n4) {
    vi s = V_ZERO_SI();
    for (int c = c0; c < c0 + n4; c++) {
        int32_t chunk;
        memcpy(&chunk, u + 4 * c, 4);
        s = V_DPBUSD(s, V_SET1_EPI32(chunk), V_LOAD_SI(xb + 4 * LW * c));
    }
    return s;
}

LOOM__QINLINE void tile8_k(const void *w, size_t w_stride, int nr, const void *x8, int nt,
                           int64_t K, float *out, size_t out_stride, k_fmt fmt) {
    const int64_t nsb = K / LOOM_QK_K;
    const size_t wb = k_block_bytes(fmt);
    for (int r = 0; r < nr; r++) {
        const uint8_t *wr = (const uint8_t *)w + (size_t)r * w_stride;
        vf sum = V_ZERO_PS();
        for (int64_t b = 0; b < nsb; b++) {
            const uint8_t *blk = wr + (size_t)b * wb, *xb = (const uint8_t *)x8 + (size_t)b * XK;
            _Alignas(32) uint8_t u[LOOM_QK_K];
            for (int k = 0; k < 8; k++)
                _mm256_store_si256((__m256i *)(u + 32 * k), chunk_codes(blk, k, fmt));
            const sb_meta m = block_meta(blk, fmt);
            _Alignas(32) int16_t sc[16], m16[16];
            _mm256_store_si256((__m256i *)sc, m.sc16); /* q4_K/q5_K: scales 0..7 (twice) */
            _mm256_store_si256((__m256i *)m16, m.m16);
            vi isum = V_ZERO_SI();
            if (fmt == FMT_Q6_K) {
                for (int i = 0; i < 16; i++) /* 16-value sub-blocks: 4 chunks each */
                    isum = V_ADD_EPI32(
                        isum, V_MULLO_EPI32(chunk_sums(u, xb, 4 * i, 4), V_SET1_EPI32(sc[i])));
            } else {
                for (int i = 0; i < 8; i++) /* 32-value sub-blocks: 8 chunks each */
                    isum = V_ADD_EPI32(
                        isum, V_MULLO_EPI32(chunk_sums(u, xb, 8 * i, 8), V_SET1_EPI32(sc[i])));
            }
            vi msum = V_ZERO_SI();
            for (int p = 0; p < 8; p++) {
                const int32_t pair = (int32_t)((uint32_t)(uint16_t)m16[2 * p] |
                                               (uint32_t)(uint16_t)m16[2 * p + 1] << 16);
                msum = V_ADD_EPI32(
                    msum, V_MADD_EPI16(V_LOAD_SI(xb + XK_BSUMS + 4 * LW * p), V_SET1_EPI32(pair)));
            }
            const vf dx = V_LOAD_PS((const float *)(xb + XK_D));
            vf t;
            if (fmt == FMT_Q6_K) {
                t = V_MUL_PS(V_MUL_PS(dx, V_SET1_PS(m.d)), V_CVT(V_SUB_EPI32(isum, msum)));
            } else {
                const vf a = V_MUL_PS(V_MUL_PS(dx, V_SET1_PS(m.d)), V_CVT(isum));
                const vf c = V_MUL_PS(V_MUL_PS(dx, V_SET1_PS(m.dmin)), V_CVT(msum));
                t = V_SUB_PS(a, c);
            }
            sum = V_ADD_PS(sum, t);
        }
        _Alignas(64) float lane[LW];
        V_STORE_PS(lane, sum);
        for (int j = 0; j < nt; j++) out[(size_t)j * out_stride + (size_t)r] = lane[j];
    }
}

#define LANES_TILE(fmt, FMT)                                                                       \
    static void tile8_##fmt(const void *w, size_t ws, int nr, const void *x8, int nt, int64_t K,   \
                            float *out, size_t os) {                                               \
        tile8_k(w, ws, nr, x8, nt, K, out, os, FMT);                                               \
    }                                                                                              \
    static const loom__qgemm_lanes lanes_##fmt = {LW, x8_bytes, prepare_x8, tile8_##fmt};
LANES_TILE(q4_K, FMT_Q4_K)
LANES_TILE(q5_K, FMT_Q5_K)
LANES_TILE(q6_K, FMT_Q6_K)

const loom__qgemm_lanes *LOOM_ISA_SYM(loom__qgemm_lanes_kquant)(uint32_t weight_type) {
    switch (weight_type) {
    case LOOM_TYPE_Q4_K:
        return &lanes_q4_K;
    case LOOM_TYPE_Q5_K:
        return &lanes_q5_K;
    case LOOM_TYPE_Q6_K:
        return &lanes_q6_K;
    default:
        return NULL;
    }
}

#else /* no integer dot instructions */

const loom__qgemm_lanes *LOOM_ISA_SYM(loom__qgemm_lanes_kquant)(uint32_t weight_type) {
    (void)weight_type;
    return NULL;
}

#endif
