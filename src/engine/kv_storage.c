/* kv_storage.c — the pools, the descriptor builder and the batched block copies
 * (kv_storage.h). */
#include "engine/kv_storage.h"

#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/checked.h"
#include "core/status.h"
#include "engine/kv_plan.h"
#include "kv/kv_desc.h"
#include "tensor/types.h"

/* Whether layer il keeps pools of its own under layer_src (NULL: the model's own map). */
static bool is_source(const loom_model *m, const int32_t *layer_src, int32_t il) {
    return (layer_src ? layer_src[il] : m->cfg.layers[il].kv_src) == il;
}

loom_status loom__kv_cache_type_resolve(loom_kv_cache_type kv_type, loom_type *out) {
    switch (kv_type) {
    case LOOM_KV_CACHE_F16:
        *out = LOOM_TYPE_F16;
        return LOOM_OK;
    case LOOM_KV_CACHE_BF16:
        *out = LOOM_TYPE_BF16;
        return LOOM_OK;
    case LOOM_KV_CACHE_F32:
        *out = LOOM_TYPE_F32;
        return LOOM_OK;
    case LOOM_KV_CACHE_FP8_E4M3:
        *out = LOOM_TYPE_FP8_E4M3;
        return LOOM_OK;
    case LOOM_KV_CACHE_FP8_E5M2:
        *out = LOOM_TYPE_FP8_E5M2;
        return LOOM_OK;
    }
    return loom__fail(LOOM_ERR_INVALID_ARG, "unknown kv_type %d (a loom_kv_cache_type)",
                      (int)kv_type);
}

/* A slot's values, and the scales after a block's values (FP8). */
static size_t token_bytes(const loom_model *m, loom_type kv_type) {
    return (size_t)m->cfg.n_head_kv * (size_t)m->cfg.head_dim * loom__kv_elt_bytes(kv_type);
}

static size_t scale_token_bytes(const loom_model *m, loom_type kv_type) {
    return loom__kv_scale_kind_of(kv_type) == LOOM_KV_SCALE_PER_TOKEN_HEAD
               ? (size_t)m->cfg.n_head_kv * sizeof(float)
               : 0;
}

size_t loom__kv_storage_layer_block_bytes(const loom_model *m, loom_type kv_type,
                                          int32_t block_size) {
    const size_t bytes =
        (size_t)block_size * (token_bytes(m, kv_type) + scale_token_bytes(m, kv_type));
    return (bytes + 15) & ~(size_t)15;
}

size_t loom__kv_storage_merge_block_bytes(const loom_model *m, loom_type kv_type,
                                          int32_t block_size, int32_t retain) {
    const size_t bytes = loom_kv_merge_rows_at(block_size, m->cfg.n_head_kv) +
                         (size_t)retain * 2 * token_bytes(m, kv_type);
    return (bytes + 15) & ~(size_t)15;
}

/* Whether layer il is the later layer of a merged pair (the one whose index keys its pool). */
static bool is_merged_b(const int32_t *merge_with, int32_t il) {
    return merge_with != NULL && merge_with[il] >= 0 && merge_with[il] < il;
}

size_t loom__kv_storage_block_bytes(const loom_model *m, const int32_t *layer_src,
                                    const loom__kv_merge *merge, loom_type kv_type,
                                    int32_t block_size, int32_t g) {
    const loom__model_config *c = &m->cfg;
    const int32_t *with = merge && merge->n_pairs > 0 ? merge->with : NULL;
    size_t layers = 0, pairs = 0;
    for (int32_t il = 0; il < c->n_layer; il++) {
        layers += c->layers[il].kv_group == g && is_source(m, layer_src, il);
        pairs += c->layers[il].kv_group == g && is_merged_b(with, il);
    }
    const size_t merge_bytes =
        pairs ? loom__kv_storage_merge_block_bytes(m, kv_type, block_size,
                                                   loom__kv_merge_rows(merge->retain, block_size))
              : 0;
    return layers * 2 * loom__kv_storage_layer_block_bytes(m, kv_type, block_size) +
           pairs * merge_bytes;
}

/* ---- create and destroy -------------------------------------------------------------------- */

void loom__kv_storage_destroy(loom__kv_storage *st) {
    if (st == NULL || st->model == NULL) return;
    const loom__backend *be = st->model->backend;
    if (st->buf) be->ops->buffer_free(be->dev, st->buf);
    for (int32_t g = 0; g < LOOM_MAX_KV_GROUPS; g++) {
        be->ops->host_free(be->dev, st->indptr[g]);
        be->ops->host_free(be->dev, st->block_ids[g]);
    }
    be->ops->host_free(be->dev, st->q_start);
    be->ops->host_free(be->dev, st->pos_start);
    be->ops->host_free(be->dev, st->kv_len);
    free(st->k_base);
    free(st->v_base);
    free(st->layer_src);
    free(st->k_scale);
    free(st->v_scale);
    free(st->merge_with);
    free(st->merge_base);
    free(st->ranges);
    memset(st, 0, sizeof *st);
}

/* n int32 of pinned host memory at *out. */
static loom_status host_ints(const loom__backend *be, size_t n, int32_t **out) {
    void *p = NULL;
    LOOM_TRY(be->ops->host_alloc(be->dev, n * sizeof(int32_t), &p));
    *out = p;
    return LOOM_OK;
}

static loom_status create(const loom_model *m, const loom__kv_storage_params *p,
                          loom__kv_storage *st) {
    const loom__model_config *c = &m->cfg;
    const loom__backend *be = m->backend;
    const size_t elt = loom__kv_elt_bytes(p->kv_type);
    LOOM_RETURN_IF(elt == 0, LOOM_ERR_INVALID_ARG, "kv storage: pages of %s",
                   loom__type_name(p->kv_type));
    LOOM_RETURN_IF(p->block_size < 1 || p->max_seqs < 1 || p->block_cap < 0 ||
                       p->max_copy_blocks < 0 || p->group_blocks == NULL,
                   LOOM_ERR_INVALID_ARG, "kv storage: bad sizes");
    st->kv_type = p->kv_type;
    st->scale_kind = loom__kv_scale_kind_of(p->kv_type);
    st->kv_flags = p->kv_flags;
    st->block_size = p->block_size;
    st->n_groups = c->n_kv_groups;
    st->n_layers = c->n_layer;
    st->token_stride = token_bytes(m, p->kv_type);
    st->scale_token_stride = scale_token_bytes(m, p->kv_type);
    st->block_stride = loom__kv_storage_layer_block_bytes(m, p->kv_type, p->block_size);
    for (int32_t g = 0; g < st->n_groups; g++) st->group_blocks[g] = p->group_blocks[g];
    st->layer_src = loom__calloc((size_t)c->n_layer, sizeof *st->layer_src);
    LOOM_RETURN_IF(!st->layer_src, LOOM_ERR_OUT_OF_MEMORY, "kv storage: out of memory");
    for (int32_t il = 0; il < c->n_layer; il++)
        st->layer_src[il] = p->layer_src ? p->layer_src[il] : c->layers[il].kv_src;
    const int32_t *src = st->layer_src;
    const bool merged = p->merge != NULL && p->merge->n_pairs > 0;
    LOOM_RETURN_IF(merged != ((p->kv_flags & LOOM_KV_MERGED) != 0), LOOM_ERR_INVALID_ARG,
                   "kv storage: LOOM_KV_MERGED must be set exactly when the plan has pairs");
    if (merged) {
        st->merge_with = loom__malloc((size_t)c->n_layer * sizeof *st->merge_with);
        st->merge_base = loom__calloc((size_t)c->n_layer, sizeof *st->merge_base);
        LOOM_RETURN_IF(!st->merge_with || !st->merge_base, LOOM_ERR_OUT_OF_MEMORY,
                       "kv storage: out of memory");
        memcpy(st->merge_with, p->merge->with, (size_t)c->n_layer * sizeof *st->merge_with);
        st->merge_retain = loom__kv_merge_rows(p->merge->retain, p->block_size);
        st->merge_t = p->merge->t;
        st->merge_block_stride =
            loom__kv_storage_merge_block_bytes(m, p->kv_type, p->block_size, st->merge_retain);
    }
    LOOM_TRY(loom__kv_plan_check(m, src, st->merge_with));

    /* Pools: every source layer's K then V, each of its group's size. */
    size_t total = 0;
    for (int32_t il = 0; il < c->n_layer; il++) {
        if (!is_source(m, src, il)) continue;
        size_t layer_bytes;
        LOOM_RETURN_IF(loom__mul_overflow_size(st->block_stride,
                                               (size_t)st->group_blocks[c->layers[il].kv_group],
                                               &layer_bytes) ||
                           loom__add_overflow_size(total, 2 * layer_bytes, &total),
                       LOOM_ERR_OUT_OF_MEMORY, "kv storage: the pools' size overflows");
    }
    for (int32_t il = 0; il < c->n_layer; il++) {
        if (!is_merged_b(st->merge_with, il)) continue;
        size_t pool_bytes;
        LOOM_RETURN_IF(loom__mul_overflow_size(st->merge_block_stride,
                                               (size_t)st->group_blocks[c->layers[il].kv_group],
                                               &pool_bytes) ||
                           loom__add_overflow_size(total, pool_bytes, &total),
                       LOOM_ERR_OUT_OF_MEMORY, "kv storage: the pools' size overflows");
    }
    LOOM_TRY(be->ops->buffer_alloc(be->dev, total, &st->buf));
    st->k_base = loom__calloc((size_t)c->n_layer, sizeof *st->k_base);
    st->v_base = loom__calloc((size_t)c->n_layer, sizeof *st->v_base);
    st->k_scale = loom__calloc((size_t)c->n_layer, sizeof *st->k_scale);
    st->v_scale = loom__calloc((size_t)c->n_layer, sizeof *st->v_scale);
    LOOM_RETURN_IF(!st->k_base || !st->v_base || !st->k_scale || !st->v_scale,
                   LOOM_ERR_OUT_OF_MEMORY, "kv storage: out of memory");
    const size_t scale_at = st->token_stride * (size_t)p->block_size; /* in each block */
    char *at = be->ops->buffer_base(be->dev, st->buf);
    for (int32_t il = 0; il < c->n_layer; il++) {
        if (!is_source(m, src, il)) continue;
        size_t layer_bytes = st->block_stride * (size_t)st->group_blocks[c->layers[il].kv_group];
        st->k_base[il] = at;
        st->v_base[il] = at + layer_bytes;
        if (st->scale_kind != LOOM_KV_SCALE_NONE) {
            st->k_scale[il] = at + scale_at;
            st->v_scale[il] = at + layer_bytes + scale_at;
        }
        at += 2 * layer_bytes;
    }
    for (int32_t il = 0; il < c->n_layer; il++) {
        if (!is_merged_b(st->merge_with, il)) continue;
        st->merge_base[il] = st->merge_base[st->merge_with[il]] = at;
        at += st->merge_block_stride * (size_t)st->group_blocks[c->layers[il].kv_group];
    }

    /* The descriptors' arrays. */
    st->max_seqs = p->max_seqs;
    st->block_cap = p->block_cap;
    const size_t S = (size_t)p->max_seqs;
    for (int32_t g = 0; g < st->n_groups; g++) {
        LOOM_TRY(host_ints(be, S + 1, &st->indptr[g]));
        LOOM_TRY(host_ints(be, p->block_cap > 0 ? (size_t)p->block_cap : 1, &st->block_ids[g]));
    }
    LOOM_TRY(host_ints(be, S + 1, &st->q_start));
    LOOM_TRY(host_ints(be, S + 1, &st->pos_start));
    LOOM_TRY(host_ints(be, S + 1, &st->kv_len));

    /* A block moves in 2 ranges per source layer of its group and one per merged pair. */
    size_t ranges = 0;
    for (int32_t il = 0; il < c->n_layer; il++)
        ranges += 2 * is_source(m, src, il) + is_merged_b(st->merge_with, il);
    st->ranges_cap = (size_t)p->max_copy_blocks * ranges;
    st->ranges = loom__malloc((st->ranges_cap ? st->ranges_cap : 1) * sizeof *st->ranges);
    LOOM_RETURN_IF(!st->ranges, LOOM_ERR_OUT_OF_MEMORY, "kv storage: out of memory");
    return LOOM_OK;
}

loom_status loom__kv_storage_create(const loom_model *m, const loom__kv_storage_params *p,
                                    loom__kv_storage *st) {
    LOOM_CHECK_ARG(m != NULL && p != NULL && st != NULL);
    memset(st, 0, sizeof *st);
    st->model = m;
    loom_status s = create(m, p, st);
    if (s != LOOM_OK) loom__kv_storage_destroy(st);
    return s;
}

/* ---- descriptors --------------------------------------------------------------------------- */

loom_status loom__kv_storage_descs(loom__kv_storage *st, const loom__kv *kv, int32_t n,
                                   const int32_t *seqs, const int32_t *n_new, const int32_t *skip,
                                   loom_kv_desc *out) {
    LOOM_RETURN_IF(n < 0 || n > st->max_seqs, LOOM_ERR_INVALID_ARG,
                   "kv storage: %d sequences in a step of at most %d", n, st->max_seqs);
    const loom__model_config *c = &st->model->cfg;
    for (int32_t g = 0; g < st->n_groups; g++)
        LOOM_TRY(loom__kv_fill_desc(kv, g, n, seqs, skip ? NULL : n_new, st->indptr[g],
                                    st->block_ids[g], st->block_cap, g == 0 ? st->q_start : NULL,
                                    g == 0 ? st->pos_start : NULL, g == 0 ? st->kv_len : NULL));
    if (skip != NULL) {
        /* Part of each reservation: the rows from skip[b] on, n_new[b] of them. */
        st->q_start[0] = 0;
        for (int32_t b = 0; b < n; b++) {
            const int32_t reserved = st->kv_len[b] - st->pos_start[b];
            LOOM_RETURN_IF(skip[b] < 0 || n_new[b] < 0 || skip[b] + n_new[b] > reserved,
                           LOOM_ERR_INVALID_ARG,
                           "kv storage: sequence %d: rows %d .. %d of a reservation of %d", seqs[b],
                           skip[b], skip[b] + n_new[b], reserved);
            st->pos_start[b] += skip[b];
            st->kv_len[b] = st->pos_start[b] + n_new[b];
            st->q_start[b + 1] = st->q_start[b] + n_new[b];
        }
    }
    for (int32_t g = 0; g < st->n_groups; g++) {
        out[g] = (loom_kv_desc){
            .n_seqs = n,
            .indptr = st->indptr[g],
            .block_ids = st->block_ids[g],
            .q_start = st->q_start,
            .pos_start = st->pos_start,
            .kv_len = st->kv_len,
            .block_size = st->block_size,
            .n_blocks = st->group_blocks[g],
            .n_kv_heads = c->n_head_kv,
            .head_dim = c->head_dim,
            .window = c->kv_group_window[g],
            .kv_type = st->kv_type,
            .layout = LOOM_KV_LAYOUT_NHD,
            .token_stride = st->token_stride,
            .block_stride = st->block_stride,
            .n_layers = st->n_layers,
            .k_base = st->k_base,
            .v_base = st->v_base,
            .layer_src = st->layer_src,
            .scale_kind = st->scale_kind,
            .k_scale = st->scale_kind != LOOM_KV_SCALE_NONE ? st->k_scale : NULL,
            .v_scale = st->scale_kind != LOOM_KV_SCALE_NONE ? st->v_scale : NULL,
            .scale_token_stride = st->scale_token_stride,
            .scale_block_stride = st->block_stride,
            .kv_flags = st->kv_flags,
            .merge_with = st->merge_with,
            .merge_base = st->merge_base,
            .merge_block_stride = st->merge_block_stride,
            .merge_retain = st->merge_retain,
            .merge_t = st->merge_t,
        };
        loom_status s = loom__kv_desc_check(&out[g], st->q_start[n]);
        if (s != LOOM_OK) {
            loom__error_prefix("KV group %d", g);
            return s;
        }
    }
    return LOOM_OK;
}

/* ---- batched copies ------------------------------------------------------------------------ */

/* One range of a block copy: block `block` of a pool of `stride`-byte blocks to block `to`
 * (DEVICE), to the host at *slot (TO_HOST) or from it (FROM_HOST); *slot then moves past it. */
static void put_range(loom_copy_range *r, loom_copy_kind kind, char *pool, size_t stride,
                      int32_t block, int32_t to, char **slot) {
    char *at = pool + (size_t)block * stride;
    r->bytes = stride;
    switch (kind) {
    case LOOM_COPY_DEVICE:
        r->src = at;
        r->dst = pool + (size_t)to * stride;
        break;
    case LOOM_COPY_TO_HOST:
        r->src = at;
        r->dst = *slot;
        break;
    case LOOM_COPY_FROM_HOST:
        r->src = *slot;
        r->dst = at;
        break;
    }
    if (*slot != NULL) *slot += stride;
}

loom_status loom__kv_storage_copy(loom__kv_storage *st, void *stream, loom_copy_kind kind,
                                  int32_t n, const int32_t *groups, const int32_t *blocks,
                                  const int32_t *dst, char *const *host) {
    if (n == 0) return LOOM_OK;
    const loom__model_config *c = &st->model->cfg;
    size_t k = 0;
    for (int32_t i = 0; i < n; i++) {
        const int32_t g = groups[i];
        LOOM_RETURN_IF(
            g < 0 || g >= st->n_groups || blocks[i] < 0 || blocks[i] >= st->group_blocks[g] ||
                (kind == LOOM_COPY_DEVICE && (dst[i] < 0 || dst[i] >= st->group_blocks[g])),
            LOOM_ERR_INVALID_ARG, "kv storage: copy %d: block %d of group %d", i, blocks[i], g);
        const int32_t to = kind == LOOM_COPY_DEVICE ? dst[i] : -1;
        char *slot = kind == LOOM_COPY_DEVICE ? NULL : host[i];
        /* Every source layer's K and V blocks, then each merged pair's merge block. */
        for (int pass = 0; pass < 2; pass++) {
            for (int32_t il = 0; il < c->n_layer; il++) {
                if (c->layers[il].kv_group != g) continue;
                if (pass == 0 ? !is_source(st->model, st->layer_src, il)
                              : !is_merged_b(st->merge_with, il))
                    continue;
                const size_t need = pass == 0 ? 2 : 1;
                LOOM_RETURN_IF(k + need > st->ranges_cap, LOOM_ERR_INVALID_ARG,
                               "kv storage: a copy of more blocks than %zu ranges hold",
                               st->ranges_cap);
                if (pass == 0) {
                    put_range(&st->ranges[k++], kind, st->k_base[il], st->block_stride, blocks[i],
                              to, &slot);
                    put_range(&st->ranges[k++], kind, st->v_base[il], st->block_stride, blocks[i],
                              to, &slot);
                } else {
                    put_range(&st->ranges[k++], kind, st->merge_base[il], st->merge_block_stride,
                              blocks[i], to, &slot);
                }
            }
        }
    }
    return st->model->backend->ops->copy_batch(stream, kind, st->ranges, k);
}
