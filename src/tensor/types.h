/* types.h — what loom knows of each tensor element type (loom_type, in loom_backend.h): its
 * name and its block layout's size.
 *
 * Below 0x100 the numeric values are GGUF's (ggml's) type ids, so a type read from a file maps
 * directly. A "block" is the unit a quantized row is made of: block_elems values stored in
 * block_bytes. This header is plain C with no dependencies so CUDA code can include it too. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "loom_backend.h"

typedef struct loom__type_traits {
    const char *name;     /* "q4_K", as GGUF tools print it; NULL for an id loom does not know */
    uint32_t block_elems; /* values per block (1 for plain types) */
    uint32_t block_bytes; /* bytes per block */
    bool quantized;
    bool can_dequantize; /* loom can turn it into float32 (weights of this type are runnable) */
    /* Each row ends with its own float32 scale, after its values padded to a multiple of 4
     * bytes (LOOM_TYPE_FP8_E4M3_ROWS, loom_backend.h): loom__type_row_bytes counts both. */
    bool row_scale;
} loom__type_traits;

/* Traits of t, or NULL if t is not a known type id (ids come from files: check them). */
const loom__type_traits *loom__type_get_traits(uint32_t t);

/* Name of a type id for messages: "q4_K"; for GGUF ids loom has no traits for, their GGUF name
 * ("iq2_xxs"); otherwise "unknown(45)" in a static thread-local buffer. Never NULL. */
const char *loom__type_name(uint32_t t);

/* Bytes of a row of n elements of type t (for a row_scale type, the padded values and the
 * scale). Returns false if n is not a multiple of the block size, t is unknown, or the size
 * overflows. */
bool loom__type_row_bytes(uint32_t t, int64_t n, size_t *out);

/* The scales KV pages of element type t carry: FP8 pages one float per (position, KV head)
 * (loom.h's loom_kv_cache_type says why), every other type none. */
static inline loom_kv_scale_kind loom__kv_scale_kind_of(loom_type t) {
    return t == LOOM_TYPE_FP8_E4M3 || t == LOOM_TYPE_FP8_E5M2 ? LOOM_KV_SCALE_PER_TOKEN_HEAD
                                                              : LOOM_KV_SCALE_NONE;
}
