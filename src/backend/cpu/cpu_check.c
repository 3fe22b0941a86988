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

static loom_status check_kv_arrays(const char *op, const loom_kv_desc *kv, int32_t layer,
                                   bool via_layer_src, int32_t *pool_layer) {
    LOOM_RETURN_IF(kv == NULL, LOOM_ERR_INVALID_ARG, "%s: kv descriptor is NULL", op);
    LOOM_RETURN_IF(kv->n_seqs < 0, LOOM_ERR_INVALID_ARG, "%s: kv n_seqs %d", op, kv->n_seqs);
    LOOM_RETURN_IF(kv->indptr == NULL || kv->q_start == NULL ||
                       (kv->n_seqs > 0 && (kv->pos_start == NULL || kv->kv_len == NULL)),
                   LOOM_ERR_INVALID_ARG, "%s: kv descriptor is missing an array", op);
    LOOM_RETURN_IF(kv->block_size < 1 || kv->n_blocks < 1 || kv->n_kv_heads < 1 || kv->head_dim < 1,
                   LOOM_ERR_INVALID_ARG,
                   "%s: kv block_size %d, n_blocks %d, n_kv_heads %d, head_dim %d must be >= 1", op,
                   kv->block_size, kv->n_blocks, kv->n_kv_heads, kv->head_dim);
    LOOM_RETURN_IF(kv->kv_type != LOOM_TYPE_F16 && kv->kv_type != LOOM_TYPE_F32,
                   LOOM_ERR_UNSUPPORTED, "%s: kv type %s (cpu supports f16 and f32)", op,
                   loom__type_name(kv->kv_type));
    size_t elt = kv->kv_type == LOOM_TYPE_F32 ? 4 : 2;
    size_t head_row = (size_t)kv->n_kv_heads * (size_t)kv->head_dim * elt;
    size_t block_min;
    LOOM_RETURN_IF(kv->token_stride < head_row || kv->token_stride % elt != 0, LOOM_ERR_INVALID_ARG,
                   "%s: kv token_stride %zu (a slot needs %zu bytes)", op, kv->token_stride,
                   head_row);
    LOOM_RETURN_IF(loom__mul_overflow_size((size_t)kv->block_size, kv->token_stride, &block_min) ||
                       kv->block_stride < block_min || kv->block_stride % elt != 0,
                   LOOM_ERR_INVALID_ARG,
                   "%s: kv block_stride %zu is smaller than block_size * token_stride", op,
                   kv->block_stride);
    size_t pool;
    LOOM_RETURN_IF(loom__mul_overflow_size((size_t)kv->n_blocks, kv->block_stride, &pool),
                   LOOM_ERR_INVALID_ARG, "%s: kv pool size overflows", op);
    LOOM_RETURN_IF(layer < 0 || layer >= kv->n_layers, LOOM_ERR_INVALID_ARG,
                   "%s: layer %d outside [0, %d)", op, layer, kv->n_layers);
    LOOM_RETURN_IF(kv->k_base == NULL || kv->v_base == NULL, LOOM_ERR_INVALID_ARG,
                   "%s: kv descriptor has no pool bases", op);
    int32_t src = layer;
    if (via_layer_src && kv->layer_src != NULL) {
        src = kv->layer_src[layer];
        LOOM_RETURN_IF(src < 0 || src >= kv->n_layers, LOOM_ERR_INVALID_ARG,
                       "%s: layer_src[%d] = %d outside [0, %d)", op, layer, src, kv->n_layers);
    }
    LOOM_RETURN_IF(kv->k_base[src] == NULL || kv->v_base[src] == NULL, LOOM_ERR_INVALID_ARG,
                   "%s: layer %d has no K/V pool", op, src);
    LOOM_RETURN_IF((uintptr_t)kv->k_base[src] % elt != 0 || (uintptr_t)kv->v_base[src] % elt != 0,
                   LOOM_ERR_INVALID_ARG, "%s: layer %d K/V pool is not element-aligned", op, src);
    *pool_layer = src;
    return LOOM_OK;
}

loom_status loom__cpu_check_kv_desc(const char *op, const loom_kv_desc *kv, int32_t layer,
                                    bool via_layer_src, int32_t read_window, int64_t *n_rows,
                                    int32_t *pool_layer) {
    LOOM_TRY(check_kv_arrays(op, kv, layer, via_layer_src, pool_layer));
    LOOM_RETURN_IF(kv->indptr[0] != 0 || kv->q_start[0] != 0, LOOM_ERR_INVALID_ARG,
                   "%s: kv indptr[0] = %d and q_start[0] = %d must be 0", op, kv->indptr[0],
                   kv->q_start[0]);
    LOOM_RETURN_IF(kv->block_ids == NULL && kv->indptr[kv->n_seqs] != 0, LOOM_ERR_INVALID_ARG,
                   "%s: kv block_ids is NULL", op);
    /* Structure first (a malformed descriptor is a caller bug), then contents. */
    for (int32_t s = 0; s < kv->n_seqs; s++)
        LOOM_RETURN_IF(kv->q_start[s + 1] < kv->q_start[s] || kv->indptr[s + 1] < kv->indptr[s],
                       LOOM_ERR_INVALID_ARG, "%s: sequence %d: q_start or indptr decreases", op, s);
    for (int32_t s = 0; s < kv->n_seqs; s++) {
        int64_t n_new = (int64_t)kv->q_start[s + 1] - kv->q_start[s];
        int64_t n_tab = (int64_t)kv->indptr[s + 1] - kv->indptr[s];
        LOOM_RETURN_IF(kv->pos_start[s] < 0, LOOM_ERR_BAD_INPUT,
                       "%s: sequence %d: pos_start %d is negative", op, s, kv->pos_start[s]);
        if (n_new == 0) continue;
        int64_t last = (int64_t)kv->pos_start[s] + n_new - 1; /* position of the last new row */
        LOOM_RETURN_IF(kv->kv_len[s] <= last, LOOM_ERR_BAD_INPUT,
                       "%s: sequence %d: kv_len %d does not cover position %lld", op, s,
                       kv->kv_len[s], (long long)last);
        LOOM_RETURN_IF(last / kv->block_size >= n_tab, LOOM_ERR_BAD_INPUT,
                       "%s: sequence %d: position %lld needs block %lld but its table holds %lld",
                       op, s, (long long)last, (long long)(last / kv->block_size),
                       (long long)n_tab);
        /* Only the entries this op touches must hold blocks: a sliding-window table has
         * released (negative) entries before the window of its first new row. */
        int64_t first = 0;
        if (read_window < 0) first = kv->pos_start[s];
        if (read_window > 0) first = (int64_t)kv->pos_start[s] - read_window + 1;
        if (first < 0) first = 0;
        for (int64_t b = kv->indptr[s] + first / kv->block_size;
             b <= kv->indptr[s] + last / kv->block_size; b++) {
            int32_t id = kv->block_ids[b];
            LOOM_RETURN_IF(id < 0 || id >= kv->n_blocks, LOOM_ERR_BAD_INPUT,
                           "%s: sequence %d: block id %d (table entry %lld) outside [0, %d)", op,
                           s, id, (long long)(b - kv->indptr[s]), kv->n_blocks);
        }
    }
    *n_rows = kv->q_start[kv->n_seqs];
    return LOOM_OK;
}
