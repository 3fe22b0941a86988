/* kv_desc_check.c — loom__kv_desc_check (kv_desc.h). */
#include "kv/kv_desc.h"

#include <stdint.h>

#include "core/checked.h"
#include "core/status.h"
#include "tensor/types.h"

size_t loom__kv_elt_bytes(loom_type t) {
    switch (t) {
    case LOOM_TYPE_F32:
        return 4;
    case LOOM_TYPE_F16:
    case LOOM_TYPE_BF16:
        return 2;
    case LOOM_TYPE_FP8_E4M3:
    case LOOM_TYPE_FP8_E5M2:
        return 1;
    default:
        return 0;
    }
}

#define BAD_IF(cond, status, ...) LOOM_RETURN_IF(cond, status, "kv descriptor: " __VA_ARGS__)

/* The scalar fields: sizes, type, layout, strides. */
static loom_status check_shape(const loom_kv_desc *kv, size_t *elt) {
    BAD_IF(kv->n_seqs < 0, LOOM_ERR_INVALID_ARG, "n_seqs %d", kv->n_seqs);
    BAD_IF(kv->block_size < 1 || kv->n_blocks < 1 || kv->n_kv_heads < 1 || kv->head_dim < 1 ||
               kv->n_layers < 1,
           LOOM_ERR_INVALID_ARG,
           "block_size %d, n_blocks %d, n_kv_heads %d, head_dim %d, n_layers %d must be >= 1",
           kv->block_size, kv->n_blocks, kv->n_kv_heads, kv->head_dim, kv->n_layers);
    BAD_IF(kv->window < 0, LOOM_ERR_INVALID_ARG, "window %d is negative", kv->window);
    *elt = loom__kv_elt_bytes(kv->kv_type);
    BAD_IF(*elt == 0, LOOM_ERR_UNSUPPORTED, "kv type %s is not a KV element type",
           loom__type_name(kv->kv_type));
    BAD_IF((kv->kv_type == LOOM_TYPE_FP8_E4M3 || kv->kv_type == LOOM_TYPE_FP8_E5M2) &&
               kv->scale_kind == LOOM_KV_SCALE_NONE,
           LOOM_ERR_INVALID_ARG, "%s pages without scales", loom__type_name(kv->kv_type));
    BAD_IF((kv->kv_flags & ~(LOOM_KV_HADAMARD | LOOM_KV_MERGED)) != 0, LOOM_ERR_UNSUPPORTED,
           "unknown kv_flags %#x", (unsigned)kv->kv_flags);
    BAD_IF((kv->kv_flags & LOOM_KV_HADAMARD) && (kv->head_dim & (kv->head_dim - 1)) != 0,
           LOOM_ERR_INVALID_ARG, "the Hadamard rotation needs a power-of-two head_dim, not %d",
           kv->head_dim);
    BAD_IF(kv->layout != LOOM_KV_LAYOUT_NHD, LOOM_ERR_UNSUPPORTED, "unknown layout %d",
           (int)kv->layout);
    size_t slot, block_min, pool;
    BAD_IF(loom__mul_overflow_size((size_t)kv->n_kv_heads * (size_t)kv->head_dim, *elt, &slot),
           LOOM_ERR_INVALID_ARG, "a slot's size overflows");
    BAD_IF(kv->token_stride < slot || kv->token_stride % *elt != 0, LOOM_ERR_INVALID_ARG,
           "token_stride %zu (a slot needs %zu bytes)", kv->token_stride, slot);
    BAD_IF(loom__mul_overflow_size((size_t)kv->block_size, kv->token_stride, &block_min) ||
               kv->block_stride < block_min || kv->block_stride % *elt != 0,
           LOOM_ERR_INVALID_ARG, "block_stride %zu is smaller than block_size * token_stride",
           kv->block_stride);
    BAD_IF(loom__mul_overflow_size((size_t)kv->n_blocks, kv->block_stride, &pool),
           LOOM_ERR_INVALID_ARG, "a pool of %d blocks of %zu bytes overflows", kv->n_blocks,
           kv->block_stride);
    return LOOM_OK;
}

/* The scale pools of source layer l, for the descriptor's scale kind. */
static loom_status check_scales(const loom_kv_desc *kv, int32_t l) {
    if (kv->scale_kind == LOOM_KV_SCALE_NONE) return LOOM_OK;
    BAD_IF(kv->scale_kind != LOOM_KV_SCALE_PER_HEAD &&
               kv->scale_kind != LOOM_KV_SCALE_PER_TOKEN_HEAD,
           LOOM_ERR_UNSUPPORTED, "unknown scale kind %d", (int)kv->scale_kind);
    BAD_IF(kv->k_scale == NULL || kv->v_scale == NULL || kv->k_scale[l] == NULL ||
               kv->v_scale[l] == NULL,
           LOOM_ERR_INVALID_ARG, "layer %d has no K/V scales", l);
    BAD_IF((uintptr_t)kv->k_scale[l] % sizeof(float) != 0 ||
               (uintptr_t)kv->v_scale[l] % sizeof(float) != 0,
           LOOM_ERR_INVALID_ARG, "layer %d's scales are not float-aligned", l);
    if (kv->scale_kind == LOOM_KV_SCALE_PER_TOKEN_HEAD) {
        size_t slot = (size_t)kv->n_kv_heads * sizeof(float), block_min;
        BAD_IF(kv->scale_token_stride < slot || kv->scale_token_stride % sizeof(float) != 0 ||
                   loom__mul_overflow_size((size_t)kv->block_size, kv->scale_token_stride,
                                           &block_min) ||
                   kv->scale_block_stride < block_min,
               LOOM_ERR_INVALID_ARG, "scale strides %zu / %zu do not hold a slot's %d scales",
               kv->scale_token_stride, kv->scale_block_stride, kv->n_kv_heads);
    }
    return LOOM_OK;
}

/* Every layer maps to a source layer whose pools are set. */
static loom_status check_layers(const loom_kv_desc *kv, size_t elt) {
    BAD_IF(kv->k_base == NULL || kv->v_base == NULL, LOOM_ERR_INVALID_ARG, "no pool bases");
    for (int32_t l = 0; l < kv->n_layers; l++) {
        int32_t src = kv->layer_src ? kv->layer_src[l] : l;
        BAD_IF(src < 0 || src >= kv->n_layers, LOOM_ERR_INVALID_ARG,
               "layer_src[%d] = %d outside [0, %d)", l, src, kv->n_layers);
        if (src != l) {
            BAD_IF(kv->layer_src[src] != src, LOOM_ERR_INVALID_ARG,
                   "layer %d reads layer %d, which reads layer %d (a source reads its own pools)",
                   l, src, kv->layer_src[src]);
            continue;
        }
        BAD_IF(kv->k_base[l] == NULL || kv->v_base[l] == NULL, LOOM_ERR_INVALID_ARG,
               "layer %d has no K/V pool", l);
        BAD_IF((uintptr_t)kv->k_base[l] % elt != 0 || (uintptr_t)kv->v_base[l] % elt != 0,
               LOOM_ERR_INVALID_ARG, "layer %d's K/V pool is not element-aligned", l);
        LOOM_TRY(check_scales(kv, l));
    }
    return LOOM_OK;
}

/* Merged pairs: each pair two layers of the map (the later reading the earlier, a source), one
 * aligned merge pool between them, blocks large enough for the layout of loom_backend.h. */
static loom_status check_merges(const loom_kv_desc *kv, size_t elt) {
    if (!(kv->kv_flags & LOOM_KV_MERGED)) return LOOM_OK;
    BAD_IF(kv->merge_with == NULL || kv->merge_base == NULL || kv->layer_src == NULL,
           LOOM_ERR_INVALID_ARG, "merged pairs without merge_with, merge_base or layer_src");
    BAD_IF(kv->kv_type != LOOM_TYPE_F16 && kv->kv_type != LOOM_TYPE_BF16 &&
               kv->kv_type != LOOM_TYPE_F32,
           LOOM_ERR_UNSUPPORTED, "merged pairs over %s pages (F16, BF16 or F32)",
           loom__type_name(kv->kv_type));
    BAD_IF(kv->kv_flags & LOOM_KV_HADAMARD, LOOM_ERR_UNSUPPORTED,
           "merged pairs with the Hadamard rotation");
    BAD_IF(kv->merge_retain < 0 || kv->merge_retain > kv->block_size ||
               kv->merge_retain > LOOM_KV_MERGE_MAX_RETAIN,
           LOOM_ERR_INVALID_ARG, "merge_retain %d outside [0, min(block_size %d, %d)]",
           kv->merge_retain, kv->block_size, LOOM_KV_MERGE_MAX_RETAIN);
    BAD_IF(!(kv->merge_t >= 0.0f && kv->merge_t <= 1.0f), LOOM_ERR_INVALID_ARG,
           "merge_t %g outside [0, 1]", (double)kv->merge_t);
    size_t rows, need = 0, pool;
    const size_t row = (size_t)kv->n_kv_heads * (size_t)kv->head_dim * elt;
    BAD_IF(loom__mul_overflow_size((size_t)kv->merge_retain * 2, row, &rows) ||
               loom__add_overflow_size(loom_kv_merge_rows_at(kv->block_size, kv->n_kv_heads), rows,
                                       &need) ||
               kv->merge_block_stride < need || kv->merge_block_stride % 16 != 0 ||
               loom__mul_overflow_size((size_t)kv->n_blocks, kv->merge_block_stride, &pool),
           LOOM_ERR_INVALID_ARG, "merge_block_stride %zu (a merge block needs %zu bytes, x16)",
           kv->merge_block_stride, need);
    for (int32_t l = 0; l < kv->n_layers; l++) {
        const int32_t p = kv->merge_with[l];
        if (p == -1) continue;
        BAD_IF(p < 0 || p >= kv->n_layers || p == l || kv->merge_with[p] != l, LOOM_ERR_INVALID_ARG,
               "merge_with[%d] = %d is not the other layer of a pair", l, p);
        const int32_t a = l < p ? l : p, b = l < p ? p : l;
        BAD_IF(kv->layer_src[a] != a || kv->layer_src[b] != a, LOOM_ERR_INVALID_ARG,
               "merged pair %d, %d: layer_src must map both to %d (they map to %d and %d)", a, b, a,
               kv->layer_src[a], kv->layer_src[b]);
        for (int32_t o = 0; o < kv->n_layers; o++) /* its pages hold directions: no third reader */
            BAD_IF(o != a && o != b && kv->layer_src[o] == a, LOOM_ERR_INVALID_ARG,
                   "layer %d reads layer %d, which is in a merged pair", o, a);
        BAD_IF(kv->merge_base[l] == NULL || kv->merge_base[l] != kv->merge_base[p] ||
                   (uintptr_t)kv->merge_base[l] % 16 != 0,
               LOOM_ERR_INVALID_ARG, "merged pair %d, %d: no shared 16-byte aligned merge pool", a,
               b);
    }
    return LOOM_OK;
}

/* The CSR arrays' structure, then the contents every new row depends on. */
static loom_status check_tables(const loom_kv_desc *kv, int64_t n_rows) {
    BAD_IF(kv->indptr == NULL || kv->q_start == NULL ||
               (kv->n_seqs > 0 && (kv->pos_start == NULL || kv->kv_len == NULL)),
           LOOM_ERR_INVALID_ARG, "an array is missing");
    BAD_IF(kv->indptr[0] != 0 || kv->q_start[0] != 0, LOOM_ERR_INVALID_ARG,
           "indptr[0] = %d and q_start[0] = %d must be 0", kv->indptr[0], kv->q_start[0]);
    for (int32_t s = 0; s < kv->n_seqs; s++)
        BAD_IF(kv->q_start[s + 1] < kv->q_start[s] || kv->indptr[s + 1] < kv->indptr[s],
               LOOM_ERR_INVALID_ARG, "sequence %d: q_start or indptr decreases", s);
    BAD_IF(kv->q_start[kv->n_seqs] != n_rows, LOOM_ERR_INVALID_ARG,
           "%d new rows described, the step has %lld", kv->q_start[kv->n_seqs], (long long)n_rows);
    BAD_IF(kv->block_ids == NULL && kv->indptr[kv->n_seqs] != 0, LOOM_ERR_INVALID_ARG,
           "block_ids is NULL");
    for (int32_t s = 0; s < kv->n_seqs; s++) {
        const int64_t n_new = (int64_t)kv->q_start[s + 1] - kv->q_start[s];
        const int64_t n_tab = (int64_t)kv->indptr[s + 1] - kv->indptr[s];
        const int64_t pos = kv->pos_start[s];
        BAD_IF(pos < 0, LOOM_ERR_BAD_INPUT, "sequence %d: pos_start %lld is negative", s,
               (long long)pos);
        BAD_IF(kv->kv_len[s] != pos + n_new, LOOM_ERR_BAD_INPUT,
               "sequence %d: kv_len %d, but %lld new rows from position %lld", s, kv->kv_len[s],
               (long long)n_new, (long long)pos);
        if (n_new == 0) continue;
        const int64_t last = pos + n_new - 1; /* position of the last new row */
        BAD_IF(last / kv->block_size >= n_tab, LOOM_ERR_BAD_INPUT,
               "sequence %d: position %lld needs block %lld but its table holds %lld", s,
               (long long)last, (long long)(last / kv->block_size), (long long)n_tab);
        /* What the step touches: attention reads back to the window of the first new row;
         * entries before it may have been released. */
        int64_t first = kv->window > 0 ? pos - kv->window + 1 : 0;
        if (first < 0) first = 0;
        for (int64_t b = kv->indptr[s] + first / kv->block_size;
             b <= kv->indptr[s] + last / kv->block_size; b++) {
            const int32_t id = kv->block_ids[b];
            BAD_IF(id < 0 || id >= kv->n_blocks, LOOM_ERR_BAD_INPUT,
                   "sequence %d: block id %d (table entry %lld) outside [0, %d)", s, id,
                   (long long)(b - kv->indptr[s]), kv->n_blocks);
        }
    }
    return LOOM_OK;
}

loom_status loom__kv_desc_check(const loom_kv_desc *kv, int64_t n_rows) {
    LOOM_RETURN_IF(kv == NULL, LOOM_ERR_INVALID_ARG, "kv descriptor is NULL");
    size_t elt;
    LOOM_TRY(check_shape(kv, &elt));
    LOOM_TRY(check_layers(kv, elt));
    LOOM_TRY(check_merges(kv, elt));
    return check_tables(kv, n_rows);
}
