/* types.c — the table of tensor element types: names, block sizes, and what loom can do with
 * each. Type ids arrive from model files, so every lookup checks its id. */
#include "tensor/types.h"

#include <stdio.h>

#include "tensor/quant_layouts.h"

/* ---- the traits table --------------------------------------------------------------------- */

/* A plain type: one value per "block". */
#define PLAIN(nm, bytes, deq)                                                                      \
    {                                                                                              \
        .name = nm, .block_elems = 1, .block_bytes = bytes, .quantized = false,                    \
        .can_dequantize = deq                                                                      \
    }

/* A block type: sizes come from the layout struct, so the table cannot drift from it. */
#define BLOCK(nm, elems, blk, deq)                                                                 \
    {                                                                                              \
        .name = nm, .block_elems = elems, .block_bytes = sizeof(blk), .quantized = true,           \
        .can_dequantize = deq                                                                      \
    }

static const loom__type_traits type_traits[LOOM_TYPE_GGUF_END_] = {
    [LOOM_TYPE_F32] = PLAIN("f32", 4, true),
    [LOOM_TYPE_F16] = PLAIN("f16", 2, true),
    [LOOM_TYPE_Q4_0] = BLOCK("q4_0", LOOM_QK_LEGACY, loom__block_q4_0, true),
    [LOOM_TYPE_Q4_1] = BLOCK("q4_1", LOOM_QK_LEGACY, loom__block_q4_1, true),
    [LOOM_TYPE_Q5_0] = BLOCK("q5_0", LOOM_QK_LEGACY, loom__block_q5_0, true),
    [LOOM_TYPE_Q5_1] = BLOCK("q5_1", LOOM_QK_LEGACY, loom__block_q5_1, true),
    [LOOM_TYPE_Q8_0] = BLOCK("q8_0", LOOM_QK_LEGACY, loom__block_q8_0, true),
    /* q8_1 and q8_K are activation formats (the other operand of integer dot products), never
     * weights in a model file loom runs, so loom does not dequantize them. */
    [LOOM_TYPE_Q8_1] = BLOCK("q8_1", LOOM_QK_LEGACY, loom__block_q8_1, false),
    [LOOM_TYPE_Q2_K] = BLOCK("q2_K", LOOM_QK_K, loom__block_q2_K, true),
    [LOOM_TYPE_Q3_K] = BLOCK("q3_K", LOOM_QK_K, loom__block_q3_K, true),
    [LOOM_TYPE_Q4_K] = BLOCK("q4_K", LOOM_QK_K, loom__block_q4_K, true),
    [LOOM_TYPE_Q5_K] = BLOCK("q5_K", LOOM_QK_K, loom__block_q5_K, true),
    [LOOM_TYPE_Q6_K] = BLOCK("q6_K", LOOM_QK_K, loom__block_q6_K, true),
    [LOOM_TYPE_Q8_K] = BLOCK("q8_K", LOOM_QK_K, loom__block_q8_K, false),
    [LOOM_TYPE_I8] = PLAIN("i8", 1, false),
    [LOOM_TYPE_I16] = PLAIN("i16", 2, false),
    [LOOM_TYPE_I32] = PLAIN("i32", 4, false),
    [LOOM_TYPE_I64] = PLAIN("i64", 8, false),
    [LOOM_TYPE_F64] = PLAIN("f64", 8, false),
    [LOOM_TYPE_BF16] = PLAIN("bf16", 2, true),
};

/* GGUF ids of formats loom does not implement, named only so that "unsupported type iq2_xxs"
 * reads better than a number. They have no traits: loom__type_get_traits returns NULL. */
static const char *const foreign_names[LOOM_TYPE_GGUF_END_] = {
    [4] = "q4_2",   [5] = "q4_3",        [16] = "iq2_xxs",    [17] = "iq2_xs",     [18] = "iq3_xxs",
    [19] = "iq1_s", [20] = "iq4_nl",     [21] = "iq3_s",      [22] = "iq2_s",      [23] = "iq4_xs",
    [29] = "iq1_m", [31] = "q4_0_4_4",   [32] = "q4_0_4_8",   [33] = "q4_0_8_8",   [34] = "tq1_0",
    [35] = "tq2_0", [36] = "iq4_nl_4_4", [37] = "iq4_nl_4_8", [38] = "iq4_nl_8_8", [39] = "mxfp4",
};

/* loom's own element types outside GGUF's ids: the KV-cache ones (one byte each, never
 * dequantized as weights), and FP8 weight rows with a scale each (converted at load, never read
 * from a file: the GGUF reader accepts only ids below LOOM_TYPE_GGUF_END_). */
static const loom__type_traits kv_traits[] = {
    [LOOM_TYPE_FP8_E4M3 - LOOM_TYPE_FP8_E4M3] = PLAIN("fp8_e4m3", 1, false),
    [LOOM_TYPE_FP8_E5M2 - LOOM_TYPE_FP8_E4M3] = PLAIN("fp8_e5m2", 1, false),
    [LOOM_TYPE_FP8_E4M3_ROWS - LOOM_TYPE_FP8_E4M3] = {.name = "fp8_e4m3_rows",
                                                      .block_elems = 1,
                                                      .block_bytes = 1,
                                                      .quantized = true,
                                                      .can_dequantize = true,
                                                      .row_scale = true},
};

/* ---- lookups ------------------------------------------------------------------------------ */

const loom__type_traits *loom__type_get_traits(uint32_t t) {
    if (t >= LOOM_TYPE_FP8_E4M3 && t - LOOM_TYPE_FP8_E4M3 < sizeof kv_traits / sizeof *kv_traits)
        return &kv_traits[t - LOOM_TYPE_FP8_E4M3];
    if (t >= LOOM_TYPE_GGUF_END_ || type_traits[t].name == NULL) return NULL;
    return &type_traits[t];
}

const char *loom__type_name(uint32_t t) {
    static _Thread_local char unknown[32];
    const loom__type_traits *tr = loom__type_get_traits(t);
    if (tr) return tr->name;
    if (t < LOOM_TYPE_GGUF_END_ && foreign_names[t]) return foreign_names[t];
    snprintf(unknown, sizeof unknown, "unknown(%u)", (unsigned)t);
    return unknown;
}

bool loom__type_row_bytes(uint32_t t, int64_t n, size_t *out) {
    const loom__type_traits *tr = loom__type_get_traits(t);
    if (!tr || !out || n < 0 || n % tr->block_elems != 0) return false;
    uint64_t blocks = (uint64_t)n / tr->block_elems;
    size_t bytes;
    /* The builtin checks the product against size_t itself, so a 32-bit host also refuses rows
     * whose block count alone exceeds its address space. */
    if (__builtin_mul_overflow(blocks, (uint64_t)tr->block_bytes, &bytes)) return false;
    if (tr->row_scale) { /* values padded to 4 bytes, then the float32 scale */
        if (__builtin_add_overflow(bytes, (size_t)3 + sizeof(float), &bytes)) return false;
        bytes -= bytes % 4;
    }
    *out = bytes;
    return true;
}
