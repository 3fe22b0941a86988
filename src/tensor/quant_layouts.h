/* quant_layouts.h — the byte layouts of GGUF's block-quantized formats, as plain C structs.
 *
 * These are facts of the file format: a row of a quantized tensor is an array of these blocks,
 * back to back, with no padding. Half-precision fields are stored as their raw IEEE binary16
 * bits (uint16_t) so this header needs neither a half type nor any other header of loom, and
 * CUDA code can include it unchanged. Every struct's size is checked against the format below.
 *
 * Notation in the comments: a block holds `elems` values y[0..elems), reconstructed from small
 * integer codes q and per-block (or per-sub-block) scales d and offsets m.
 */
#pragma once

#include <stdint.h>

#ifdef __cplusplus
#define LOOM_LAYOUT_ASSERT(cond, msg) static_assert(cond, msg)
#else
#define LOOM_LAYOUT_ASSERT(cond, msg) _Static_assert(cond, msg)
#endif

#define LOOM_QK_LEGACY     32  /* values per block of the q4_0 .. q8_1 formats */
#define LOOM_QK_K          256 /* values per super-block of the K-quant formats */
#define LOOM_K_SCALE_BYTES 12  /* packed 6-bit scales and mins of q4_K / q5_K */

/* ---- legacy formats: 32 values per block -------------------------------------------------- */

/* q4_0: y[j] = d * (q[j] - 8), q 4-bit. Byte qs[j] holds q[j] in its low nibble and q[j + 16]
 * in its high nibble. */
typedef struct loom__block_q4_0 {
    uint16_t d;                     /* f16 scale */
    uint8_t qs[LOOM_QK_LEGACY / 2]; /* [16] nibble pairs */
} loom__block_q4_0;

/* q4_1: y[j] = d * q[j] + m, q 4-bit, nibbles packed as in q4_0. */
typedef struct loom__block_q4_1 {
    uint16_t d; /* f16 scale */
    uint16_t m; /* f16 offset (the block minimum) */
    uint8_t qs[LOOM_QK_LEGACY / 2];
} loom__block_q4_1;

/* q5_0: y[j] = d * (q[j] - 16), q 5-bit: low 4 bits packed as in q4_0, bit 4 of q[j] is bit j
 * of qh read as a little-endian 32-bit word. */
typedef struct loom__block_q5_0 {
    uint16_t d;
    uint8_t qh[4]; /* high bits, little-endian uint32 (bytes, so the struct stays 2-aligned) */
    uint8_t qs[LOOM_QK_LEGACY / 2];
} loom__block_q5_0;

/* q5_1: y[j] = d * q[j] + m, q 5-bit packed as in q5_0. */
typedef struct loom__block_q5_1 {
    uint16_t d;
    uint16_t m;
    uint8_t qh[4];
    uint8_t qs[LOOM_QK_LEGACY / 2];
} loom__block_q5_1;

/* q8_0: y[j] = d * q[j], q signed 8-bit. */
typedef struct loom__block_q8_0 {
    uint16_t d;
    int8_t qs[LOOM_QK_LEGACY];
} loom__block_q8_0;

/* q8_1: as q8_0 plus s = d * sum(q) (an activation format for dot products with q4_1/q5_1). */
typedef struct loom__block_q8_1 {
    uint16_t d;
    uint16_t s; /* f16 d * sum(qs) */
    int8_t qs[LOOM_QK_LEGACY];
} loom__block_q8_1;

/* ---- K-quants: 256-value super-blocks made of 16- or 32-value sub-blocks ------------------- */

/* q2_K: 16 sub-blocks of 16. Sub-block i: y = d * (scales[i] & 15) * q - dmin * (scales[i] >> 4),
 * q 2-bit. Codes: value v = 128*h + 32*s + l (h in 0..1, s in 0..3, l in 0..31) is bits
 * 2s..2s+1 of qs[32*h + l]; v belongs to sub-block v / 16. */
typedef struct loom__block_q2_K {
    uint8_t scales[LOOM_QK_K / 16]; /* [16] 4-bit scale (low) and 4-bit min (high) */
    uint8_t qs[LOOM_QK_K / 4];      /* [64] 2-bit codes */
    uint16_t d;                     /* f16 super-block scale of the scales */
    uint16_t dmin;                  /* f16 super-block scale of the mins */
} loom__block_q2_K;

/* q3_K: 16 sub-blocks of 16. Sub-block i: y = d * (sc[i] - 32) * q, q = lo - (hi ? 0 : 4) in
 * -4..3 where lo (2 bits) is packed as q2_K's codes and hi is bit v / 32 of hmask[v % 32].
 * sc[i] is 6 bits: low 4 bits are nibble (i / 8) of scales[i % 8], high 2 bits are bits
 * 2*(i / 4) .. +1 of scales[8 + i % 4]. */
typedef struct loom__block_q3_K {
    uint8_t hmask[LOOM_QK_K / 8]; /* [32] high bit of each code */
    uint8_t qs[LOOM_QK_K / 4];    /* [64] low 2 bits of each code */
    uint8_t scales[12];           /* 16 packed 6-bit scales */
    uint16_t d;                   /* f16 */
} loom__block_q3_K;

/* q4_K: 8 sub-blocks of 32. Sub-block i: y = d * sc[i] * q - dmin * mn[i], q 4-bit. Values of
 * sub-blocks 2c and 2c+1 are the low and high nibbles of qs[32c .. 32c+32). The 6-bit sc and mn
 * are packed in scales[12]: for i < 4, sc[i] = scales[i] & 63, mn[i] = scales[i+4] & 63; for
 * i >= 4, sc[i] = (scales[i+4] & 15) | (scales[i-4] >> 6) << 4 and
 * mn[i] = (scales[i+4] >> 4) | (scales[i] >> 6) << 4. */
typedef struct loom__block_q4_K {
    uint16_t d;    /* f16 */
    uint16_t dmin; /* f16 */
    uint8_t scales[LOOM_K_SCALE_BYTES];
    uint8_t qs[LOOM_QK_K / 2]; /* [128] */
} loom__block_q4_K;

/* q5_K: as q4_K with a fifth bit: bit 4 of the code of value v is bit v / 32 of qh[v % 32]. */
typedef struct loom__block_q5_K {
    uint16_t d;
    uint16_t dmin;
    uint8_t scales[LOOM_K_SCALE_BYTES];
    uint8_t qh[LOOM_QK_K / 8]; /* [32] */
    uint8_t qs[LOOM_QK_K / 2]; /* [128] */
} loom__block_q5_K;

/* q6_K: 16 sub-blocks of 16. Sub-block i: y = d * scales[i] * (q - 32), q 6-bit. Value
 * v = 128*h + 32*s + l (h in 0..1, s in 0..3, l in 0..31): low 4 bits are nibble (s / 2) of
 * ql[64*h + 32*(s % 2) + l], high 2 bits are bits 2s..2s+1 of qh[32*h + l]. */
typedef struct loom__block_q6_K {
    uint8_t ql[LOOM_QK_K / 2];     /* [128] low 4 bits */
    uint8_t qh[LOOM_QK_K / 4];     /* [64] high 2 bits */
    int8_t scales[LOOM_QK_K / 16]; /* [16] signed 8-bit sub-block scales */
    uint16_t d;                    /* f16 */
} loom__block_q6_K;

/* q8_K: the activation format K-quant dot products use: y = d * q, plus the sums of each group
 * of 16 codes (so the min terms of q2_K..q5_K come out of one multiply per group). */
typedef struct loom__block_q8_K {
    float d;                       /* float32 scale (not f16) */
    int8_t qs[LOOM_QK_K];          /* [256] */
    int16_t bsums[LOOM_QK_K / 16]; /* [16] sum of qs[16g .. 16g+16) */
} loom__block_q8_K;

LOOM_LAYOUT_ASSERT(sizeof(loom__block_q4_0) == 18, "q4_0 block is 18 bytes");
LOOM_LAYOUT_ASSERT(sizeof(loom__block_q4_1) == 20, "q4_1 block is 20 bytes");
LOOM_LAYOUT_ASSERT(sizeof(loom__block_q5_0) == 22, "q5_0 block is 22 bytes");
LOOM_LAYOUT_ASSERT(sizeof(loom__block_q5_1) == 24, "q5_1 block is 24 bytes");
LOOM_LAYOUT_ASSERT(sizeof(loom__block_q8_0) == 34, "q8_0 block is 34 bytes");
LOOM_LAYOUT_ASSERT(sizeof(loom__block_q8_1) == 36, "q8_1 block is 36 bytes");
LOOM_LAYOUT_ASSERT(sizeof(loom__block_q2_K) == 84, "q2_K block is 84 bytes");
LOOM_LAYOUT_ASSERT(sizeof(loom__block_q3_K) == 110, "q3_K block is 110 bytes");
LOOM_LAYOUT_ASSERT(sizeof(loom__block_q4_K) == 144, "q4_K block is 144 bytes");
LOOM_LAYOUT_ASSERT(sizeof(loom__block_q5_K) == 176, "q5_K block is 176 bytes");
LOOM_LAYOUT_ASSERT(sizeof(loom__block_q6_K) == 210, "q6_K block is 210 bytes");
LOOM_LAYOUT_ASSERT(sizeof(loom__block_q8_K) == 292, "q8_K block is 292 bytes");
