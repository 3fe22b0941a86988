/* cpu_check.c — argument validation shared by the CPU ops, so every op reports a bad shape,
 * type or descriptor with a status and a message naming the op and the mismatch. */
#include "backend/cpu/cpu_internal.h"

#include "core/checked.h"
#include "core/status.h"
#include "tensor/types.h"

#include <stdint.h>

/* ------------------------------------------------------------------------------------------ */
/* Tensors                                                                                    */
/* ------------------------------------------------------------------------------------------ */

/* Shape and addressing checks common to every tensor: rows of `row_bytes` fit in row_stride,
 * and the whole view's byte span does not overflow. */
static loom_status check_view(const char *op, const char *name, const loom_tensor *t,
                              size_t row_bytes) {
    LOOM_RETURN_IF(t->ne[1] < 0, LOOM_ERR_INVALID_ARG, "%s: %s has %lld rows", op, name,
                   (long long)t->ne[1]);
    LOOM_RETURN_IF(t->ne[1] > 1 && t->row_stride < row_bytes, LOOM_ERR_INVALID_ARG,
                   "%s: %s row_stride %zu is smaller than a row (%zu bytes)", op, name,
                   t->row_stride, row_bytes);
    if (t->ne[1] == 0) return LOOM_OK;
    LOOM_RETURN_IF(t->data == NULL, LOOM_ERR_INVALID_ARG, "%s: %s has no data", op, name);
    size_t span;
    LOOM_RETURN_IF(loom__mul_overflow_size((size_t)(t->ne[1] - 1), t->row_stride, &span) ||
                       loom__add_overflow_size(span, row_bytes, &span) ||
                       (uintptr_t)t->data + span < (uintptr_t)t->data,
                   LOOM_ERR_INVALID_ARG, "%s: %s spans more bytes than the address space", op,
                   name);
    return LOOM_OK;
}

loom_status loom__cpu_check_f32(const char *op, const char *name, const loom_tensor *t) {
    LOOM_RETURN_IF(t == NULL, LOOM_ERR_INVALID_ARG, "%s: %s is NULL", op, name);
    LOOM_RETURN_IF(t->type != LOOM_TYPE_F32, LOOM_ERR_UNSUPPORTED, "%s: %s must be f32, got %s", op,
                   name, loom__type_name(t->type));
    LOOM_RETURN_IF(t->ne[0] < 1 || t->ne[0] > INT64_MAX / 4, LOOM_ERR_INVALID_ARG,
                   "%s: %s has %lld elements per row", op, name, (long long)t->ne[0]);
    LOOM_RETURN_IF((uintptr_t)t->data % sizeof(float) != 0 || t->row_stride % sizeof(float) != 0,
                   LOOM_ERR_INVALID_ARG, "%s: %s data or row_stride is not float-aligned", op,
                   name);
    return check_view(op, name, t, (size_t)t->ne[0] * sizeof(float));
}

loom_status loom__cpu_check_weight(const char *op, const char *name, const loom_tensor *t) {
    LOOM_RETURN_IF(t == NULL, LOOM_ERR_INVALID_ARG, "%s: %s is NULL", op, name);
    const loom__type_traits *tr = loom__type_get_traits(t->type);
    LOOM_RETURN_IF(tr == NULL || !tr->can_dequantize, LOOM_ERR_UNSUPPORTED,
                   "%s: %s has type %s, which the cpu backend cannot read", op, name,
                   loom__type_name(t->type));
    size_t row_bytes;
    LOOM_RETURN_IF(t->ne[0] < 1 || !loom__type_row_bytes(t->type, t->ne[0], &row_bytes),
                   LOOM_ERR_INVALID_ARG,
                   "%s: %s row of %lld elements is not a whole number of %s blocks (%u each)", op,
                   name, (long long)t->ne[0], loom__type_name(t->type), (unsigned)tr->block_elems);
    /* Rows are read through their element or block type: F32 needs 4-byte alignment, and
     * F16, BF16 and every block format (whose scales are 16-bit fields) need 2. GGUF data
     * always satisfies this (tensors are 32-byte aligned, encoded rows have even sizes). */
    const size_t align = t->type == LOOM_TYPE_F32 ? 4 : 2;
    LOOM_RETURN_IF((uintptr_t)t->data % align != 0 || t->row_stride % align != 0,
                   LOOM_ERR_INVALID_ARG, "%s: %s data or row_stride is not %zu-byte aligned", op,
                   name, align);
    return check_view(op, name, t, row_bytes);
}

loom_status loom__cpu_check_same_shape(const char *op, const char *name_a, const loom_tensor *a,
                                       const char *name_b, const loom_tensor *b) {
    LOOM_RETURN_IF(a->ne[0] != b->ne[0] || a->ne[1] != b->ne[1], LOOM_ERR_INVALID_ARG,
                   "%s: %s is [%lld, %lld] but %s is [%lld, %lld]", op, name_a, (long long)a->ne[1],
                   (long long)a->ne[0], name_b, (long long)b->ne[1], (long long)b->ne[0]);
    return LOOM_OK;
}

/* Byte span [lo, hi) of a view whose rows are elt_bytes * ne[0] long (only called on
 * validated tensors, so nothing overflows). */
static void view_span(const loom_tensor *t, uintptr_t *lo, uintptr_t *hi) {
    const loom__type_traits *tr = loom__type_get_traits(t->type);
    size_t row_bytes = 0;
    if (tr == NULL || !loom__type_row_bytes(t->type, t->ne[0], &row_bytes))
        row_bytes = t->row_stride;
    *lo = (uintptr_t)t->data;
    *hi = *lo + (t->ne[1] > 0 ? (size_t)(t->ne[1] - 1) * t->row_stride + row_bytes : 0);
}

bool loom__cpu_tensors_overlap(const loom_tensor *a, const loom_tensor *b) {
    uintptr_t alo, ahi, blo, bhi;
    view_span(a, &alo, &ahi);
    view_span(b, &blo, &bhi);
    return alo < bhi && blo < ahi;
}

/* ------------------------------------------------------------------------------------------ */
/* The paged-KV descriptor                                                                    */
/* ------------------------------------------------------------------------------------------ */

loom_status loom__cpu_check_kv_use(const char *op, const loom_kv_desc *kv, int32_t layer,
                                   bool via_layer_src, int32_t *pool_layer) {
    LOOM_RETURN_IF(kv == NULL, LOOM_ERR_INVALID_ARG, "%s: kv descriptor is NULL", op);
    LOOM_RETURN_IF(kv->kv_type != LOOM_TYPE_F16 && kv->kv_type != LOOM_TYPE_F32,
                   LOOM_ERR_UNSUPPORTED, "%s: kv type %s (cpu stores f16 and f32)", op,
                   loom__type_name(kv->kv_type));
    LOOM_RETURN_IF(kv->layout != LOOM_KV_LAYOUT_NHD || kv->scale_kind != LOOM_KV_SCALE_NONE,
                   LOOM_ERR_UNSUPPORTED, "%s: kv layout %d with scales %d (cpu: NHD, no scales)",
                   op, (int)kv->layout, (int)kv->scale_kind);
    LOOM_RETURN_IF(layer < 0 || layer >= kv->n_layers, LOOM_ERR_INVALID_ARG,
                   "%s: layer %d outside [0, %d)", op, layer, kv->n_layers);
    int32_t src = via_layer_src && kv->layer_src != NULL ? kv->layer_src[layer] : layer;
    /* kv_store writes only the layers that own pools (a reusing layer stores nothing). */
    LOOM_RETURN_IF(!via_layer_src && kv->layer_src != NULL && kv->layer_src[layer] != layer,
                   LOOM_ERR_INVALID_ARG, "%s: layer %d reads layer %d's pools and stores none", op,
                   layer, kv->layer_src[layer]);
    *pool_layer = src;
    return LOOM_OK;
}
