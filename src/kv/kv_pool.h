/* kv_pool.h — a simple paged-KV block allocator and per-sequence block tables.
 *
 * The pool hands out block ids; it does not own the storage (the session allocates each
 * layer's K and V pool in backend memory, laid out as tensor/kv_desc.h describes). The full KV
 * manager (prefix cache, copy-on-write, preemption) replaces this with its own issue; the
 * block-table shape it fills stays the same. */
#pragma once

#include "loom.h"

typedef struct loom__kv_pool {
    int32_t n_blocks;
    int32_t n_free;
    int32_t *free_ids; /* [n_blocks] stack of free block ids */
} loom__kv_pool;

typedef struct loom__kv_seq {
    int32_t *blocks;  /* [cap] physical block ids in position order */
    int32_t n_blocks; /* blocks held */
    int32_t cap;
    int32_t n_pos;    /* positions stored */
} loom__kv_seq;

loom_status loom__kv_pool_init(loom__kv_pool *pool, int32_t n_blocks);
void loom__kv_pool_destroy(loom__kv_pool *pool);

/* Makes seq hold enough blocks for n_pos positions (block_size tokens each), taking blocks from
 * pool. On failure (LOOM_ERR_CONTEXT_FULL when the pool is empty, OUT_OF_MEMORY) seq is
 * unchanged. Does not change seq->n_pos: the caller commits positions after the forward. */
loom_status loom__kv_seq_reserve(loom__kv_seq *seq, loom__kv_pool *pool, int32_t n_pos,
                                int32_t block_size);

/* Returns every block of seq to pool and empties it (keeps its table's memory). */
void loom__kv_seq_clear(loom__kv_seq *seq, loom__kv_pool *pool);

/* Frees the table's memory (after loom__kv_seq_clear). */
void loom__kv_seq_destroy(loom__kv_seq *seq);
