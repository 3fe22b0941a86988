/* tensor_check.c — argument checks of tensor views every backend's ops share: the view's
 * type, shape, alignment and byte span, computed on its addresses only (a device backend's
 * addresses are never dereferenced here), each failure a status with a message naming the op
 * and the argument. */
#include "tensor/tensor_check.h"

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

loom_status loom__check_f32(const char *op, const char *name, const loom_tensor *t) {
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

loom_status loom__check_weight(const char *backend, const char *op, const char *name,
                               const loom_tensor *t) {
    LOOM_RETURN_IF(t == NULL, LOOM_ERR_INVALID_ARG, "%s: %s is NULL", op, name);
    const loom__type_traits *tr = loom__type_get_traits(t->type);
    LOOM_RETURN_IF(tr == NULL || !tr->can_dequantize, LOOM_ERR_UNSUPPORTED,
                   "%s: %s has type %s, which the %s backend cannot read", op, name,
                   loom__type_name(t->type), backend);
    size_t row_bytes;
    LOOM_RETURN_IF(t->ne[0] < 1 || !loom__type_row_bytes(t->type, t->ne[0], &row_bytes),
                   LOOM_ERR_INVALID_ARG,
                   "%s: %s row of %lld elements is not a whole number of %s blocks (%u each)", op,
                   name, (long long)t->ne[0], loom__type_name(t->type), (unsigned)tr->block_elems);
    /* Rows are read through their element or block type: F32 needs 4-byte alignment, and
     * F16, BF16 and every block format (whose scales are 16-bit fields) need 2. GGUF data
     * always satisfies this (tensors are 32-byte aligned, encoded rows have even sizes). FP8
     * rows end with a float32 scale at a multiple of 4 bytes: 4, like F32. */
    const size_t align = t->type == LOOM_TYPE_F32 || tr->row_scale ? 4 : 2;
    LOOM_RETURN_IF((uintptr_t)t->data % align != 0 || t->row_stride % align != 0,
                   LOOM_ERR_INVALID_ARG, "%s: %s data or row_stride is not %zu-byte aligned", op,
                   name, align);
    return check_view(op, name, t, row_bytes);
}

loom_status loom__check_same_shape(const char *op, const char *name_a, const loom_tensor *a,
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

bool loom__tensors_overlap(const loom_tensor *a, const loom_tensor *b) {
    uintptr_t alo, ahi, blo, bhi;
    view_span(a, &alo, &ahi);
    view_span(b, &blo, &bhi);
    return alo < bhi && blo < ahi;
}
