/* quant.c — the entry points of quant.h: row dequantize, quantize and dot, which check their
 * arguments and dispatch to the per-format kernels (quant_float.c, quant_legacy.c, quant_k.c,
 * quant_fp8.c). */
#include "tensor/quant.h"

#include <math.h>

#include "tensor/quant_internal.h"

/* ---- dispatch ----------------------------------------------------------------------------- */

static const loom__qkernels *kernels_of(uint32_t t) {
    const loom__qkernels *k = loom__qkernels_float(t);
    if (!k) k = loom__qkernels_legacy(t);
    if (!k) k = loom__qkernels_kquant(t);
    if (!k) k = loom__qkernels_fp8(t);
    return k;
}

/* True if n is a valid value count for a row of t (>= 0, whole blocks). */
static bool whole_blocks(uint32_t t, int64_t n) {
    const loom__type_traits *tr = loom__type_get_traits(t);
    return tr && n >= 0 && n % tr->block_elems == 0;
}

bool loom__dequantize_row(uint32_t t, const void *src, float *dst, int64_t n) {
    const loom__type_traits *tr = loom__type_get_traits(t);
    const loom__qkernels *k = kernels_of(t);
    if (!tr || !tr->can_dequantize || !k || !k->dequant_row || !whole_blocks(t, n)) return false;
    if (n == 0) return true;
    if (!src || !dst) return false;
    k->dequant_row(src, dst, n);
    return true;
}

bool loom__quantize_row(uint32_t t, const float *src, void *dst, int64_t n) {
    const loom__qkernels *k = kernels_of(t);
    if (!k || !k->quant_row || !whole_blocks(t, n)) return false;
    if (n == 0) return true;
    if (!src || !dst) return false;
    k->quant_row(src, dst, n);
    return true;
}

loom__vec_dot_fn loom__vec_dot_get(uint32_t t) {
    const loom__type_traits *tr = loom__type_get_traits(t);
    const loom__qkernels *k = kernels_of(t);
    if (!tr || !tr->can_dequantize || !k) return NULL;
    return k->dot;
}

float loom__vec_dot_f32(const void *w_row, uint32_t t, const float *x, int64_t n) {
    loom__vec_dot_fn dot = loom__vec_dot_get(t);
    if (!dot || !whole_blocks(t, n)) return NAN;
    if (n == 0) return 0.0f;
    if (!w_row || !x) return NAN;
    return dot(w_row, x, n);
}
