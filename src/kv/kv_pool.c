/* kv_pool.c — the block stack and per-sequence block tables of kv_pool.h. */
#include "kv/kv_pool.h"

#include <stdlib.h>
#include <string.h>

#include "core/status.h"

loom_status loom__kv_pool_init(loom__kv_pool *pool, int32_t n_blocks) {
    LOOM_CHECK_ARG(pool != NULL && n_blocks > 0);
    memset(pool, 0, sizeof *pool);
    pool->free_ids = malloc((size_t)n_blocks * sizeof *pool->free_ids);
    LOOM_RETURN_IF(!pool->free_ids, LOOM_ERR_OUT_OF_MEMORY, "kv: cannot allocate %d block ids",
                   n_blocks);
    /* Lowest ids on top of the stack, so a fresh sequence gets blocks 0, 1, 2, ... */
    for (int32_t i = 0; i < n_blocks; i++) pool->free_ids[i] = n_blocks - 1 - i;
    pool->n_blocks = n_blocks;
    pool->n_free = n_blocks;
    return LOOM_OK;
}

void loom__kv_pool_destroy(loom__kv_pool *pool) {
    if (!pool) return;
    free(pool->free_ids);
    memset(pool, 0, sizeof *pool);
}

loom_status loom__kv_seq_reserve(loom__kv_seq *seq, loom__kv_pool *pool, int32_t n_pos,
                                int32_t block_size) {
    LOOM_CHECK_ARG(seq && pool && n_pos >= 0 && block_size > 0);
    int32_t need = (int32_t)(((int64_t)n_pos + block_size - 1) / block_size);
    if (need <= seq->n_blocks) return LOOM_OK;
    int32_t extra = need - seq->n_blocks;
    LOOM_RETURN_IF(extra > pool->n_free, LOOM_ERR_CONTEXT_FULL,
                   "kv: %d more blocks needed, %d free", extra, pool->n_free);
    if (need > seq->cap) {
        int32_t cap = seq->cap ? seq->cap : 16;
        while (cap < need) cap *= 2;
        int32_t *grown = realloc(seq->blocks, (size_t)cap * sizeof *grown);
        LOOM_RETURN_IF(!grown, LOOM_ERR_OUT_OF_MEMORY, "kv: cannot grow a block table to %d",
                       cap);
        seq->blocks = grown;
        seq->cap = cap;
    }
    while (seq->n_blocks < need) seq->blocks[seq->n_blocks++] = pool->free_ids[--pool->n_free];
    return LOOM_OK;
}

void loom__kv_seq_clear(loom__kv_seq *seq, loom__kv_pool *pool) {
    while (seq->n_blocks > 0) pool->free_ids[pool->n_free++] = seq->blocks[--seq->n_blocks];
    seq->n_pos = 0;
}

void loom__kv_seq_destroy(loom__kv_seq *seq) {
    if (!seq) return;
    free(seq->blocks);
    memset(seq, 0, sizeof *seq);
}
