/* kv_storage.h — the K/V pools of an engine or a session in backend memory, the one builder of
 * a step's paged-KV descriptors (loom_backend.h) over the KV manager's block tables, and the
 * block copies the manager asks for (copy-on-write, swap), each batch of them one backend call.
 *
 * Pools exist only for source layers: a layer that reuses an earlier layer's K/V (the
 * storage's layer map: the model's kv_src, or the engine's plan, kv_plan.h) has none, and its
 * descriptor entry points at its source through layer_src. Each KV group's pools have that group's
 * number of blocks. Every layer's pools, K then V, live in one backend buffer. The per-step
 * descriptor arrays are host memory from the backend's host_alloc (pinned for a device, which
 * uploads them once per step).
 *
 * FP8 pages carry their scales inside each block, after the values: a block of an FP8 pool is
 * [block_size][n_kv_heads][head_dim] bytes, then [block_size][n_kv_heads] float32 scales, the
 * whole rounded up to 16 bytes. So every block copy (copy-on-write, swap) moves a block's
 * scales with its values without a second set of ranges, the values of each slot stay 16-byte
 * aligned for vector loads, and the budget counts the scales as the pages' own bytes.
 *
 * A merged pair (kv_plan.h) has one merge pool besides its earlier layer's pools, after all
 * the pools in the same buffer: one merge block per block of the group (loom_backend.h gives its
 * layout), copied with the block and counted in its bytes. */
#pragma once

#include "engine/kv_plan.h"
#include "kv/kv_manager.h"
#include "model/model.h"

typedef struct loom__kv_storage {
    const loom_model *model;
    loom_type kv_type;
    loom_kv_scale_kind scale_kind; /* PER_TOKEN_HEAD for FP8 pages, NONE otherwise */
    uint32_t kv_flags;
    int32_t block_size;
    int32_t n_groups;
    int32_t n_layers;
    int32_t group_blocks[LOOM_MAX_KV_GROUPS]; /* blocks of each group's pools */
    size_t token_stride, block_stride;
    loom_buffer *buf;
    void **k_base, **v_base;   /* [n_layers]; NULL for a layer reusing another's */
    int32_t *layer_src;        /* [n_layers] the layer whose pools each reads */
    void **k_scale, **v_scale; /* [n_layers] FP8: the scales of block 0 (inside the pools) */
    size_t scale_token_stride;
    /* Merged pairs (kv_flags & LOOM_KV_MERGED): */
    int32_t *merge_with;       /* [n_layers] the other layer of each pair, or -1; NULL: none */
    void **merge_base;         /* [n_layers] each pair's merge pool, at both of its layers */
    size_t merge_block_stride; /* bytes of one merge block */
    int32_t merge_retain;      /* retained rows per merge block */
    float merge_t;

    /* The descriptors' arrays, for steps of up to max_seqs sequences (host_alloc). */
    int32_t max_seqs;
    int64_t block_cap; /* entries of each group's block_ids */
    int32_t *indptr[LOOM_MAX_KV_GROUPS];
    int32_t *block_ids[LOOM_MAX_KV_GROUPS];
    int32_t *q_start, *pos_start, *kv_len;

    /* The ranges of one batched copy: up to max_copy_blocks blocks at a time. */
    loom_copy_range *ranges;
    size_t ranges_cap;
} loom__kv_storage;

typedef struct loom__kv_storage_params {
    loom_type kv_type;           /* F16, BF16, F32, FP8_E4M3 or FP8_E5M2 */
    uint32_t kv_flags;           /* LOOM_KV_HADAMARD or 0 */
    int32_t block_size;          /* positions per block */
    const int32_t *group_blocks; /* [the model's n_kv_groups] blocks of each group's pools */
    int32_t max_seqs;            /* sequences in one step */
    int64_t block_cap;           /* table entries one step can need in a group */
    int32_t max_copy_blocks;     /* most blocks one loom__kv_storage_copy moves */
    const int32_t *layer_src;    /* [n_layer] the layer whose pools each layer reads (checked by
                                    loom__kv_plan_check; copied); NULL: the model's own map */
    const loom__kv_merge *merge; /* the plan's merged pairs (copied); NULL or no pairs: none.
                                    kv_flags has LOOM_KV_MERGED exactly when it has pairs */
} loom__kv_storage_params;

/* The element type of kv_type pages. Errors: INVALID_ARG (not a loom_kv_cache_type). */
loom_status loom__kv_cache_type_resolve(loom_kv_cache_type kv_type, loom_type *out);

/* Bytes of one block of one layer's K (or V) pool: values, and FP8's scales. */
size_t loom__kv_storage_layer_block_bytes(const loom_model *m, loom_type kv_type,
                                          int32_t block_size);

/* Bytes of one block of a merged pair's merge pool keeping retain rows (loom_backend.h). */
size_t loom__kv_storage_merge_block_bytes(const loom_model *m, loom_type kv_type,
                                          int32_t block_size, int32_t retain);

/* Bytes of one block of group g: every source layer of the group under layer_src (NULL: the
 * model's own map), K and V, and the merge block of each of the group's merged pairs (merge
 * NULL: none). */
size_t loom__kv_storage_block_bytes(const loom_model *m, const int32_t *layer_src,
                                    const loom__kv_merge *merge, loom_type kv_type,
                                    int32_t block_size, int32_t g);

/* Allocates the pools and the per-step arrays. Errors: INVALID_ARG (a bad kv type, sizes),
 * OUT_OF_MEMORY, the backend's. On failure *st is destroyed and zeroed. */
loom_status loom__kv_storage_create(const loom_model *m, const loom__kv_storage_params *p,
                                    loom__kv_storage *st);
void loom__kv_storage_destroy(loom__kv_storage *st);

/* The descriptors of one step, one per KV group, into out[n_groups]: sequence b = seqs[b]
 * (b < n <= max_seqs) computes n_new[b] rows of the step, rows in batch order. With skip NULL
 * n_new[b] is the sequence's whole reservation; otherwise the rows are positions
 * n_pos + skip[b] .. n_pos + skip[b] + n_new[b] - 1 of it (a reservation computed in several
 * chunks: a session's long prompt). Every descriptor is checked (loom__kv_desc_check) before
 * this returns, so the backend may trust them. The arrays stay valid until the next call.
 * Errors: those of loom__kv_fill_desc and loom__kv_desc_check, INVALID_ARG (skip + n_new past a
 * reservation). */
loom_status loom__kv_storage_descs(loom__kv_storage *st, const loom__kv *kv, int32_t n,
                                   const int32_t *seqs, const int32_t *n_new, const int32_t *skip,
                                   loom_kv_desc *out);

/* Copies n whole blocks (every source layer's K and V) in one backend call on stream: block
 * blocks[i] of group groups[i] to block dst[i] of the same group (DEVICE), to the host slot at
 * host[i] (TO_HOST) or from it (FROM_HOST). A host slot holds the group's source layers' K
 * block then V block, layer after layer, then its merged pairs' merge blocks:
 * loom__kv_storage_block_bytes bytes.
 * Errors: INVALID_ARG (n > max_copy_blocks), the backend's. */
loom_status loom__kv_storage_copy(loom__kv_storage *st, void *stream, loom_copy_kind kind,
                                  int32_t n, const int32_t *groups, const int32_t *blocks,
                                  const int32_t *dst, char *const *host);
