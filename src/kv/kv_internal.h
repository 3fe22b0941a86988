/* kv_internal.h — the KV manager's data structures and the helpers its files share
 * (kv_manager.c, kv_blocks.c, kv_prefix.c, kv_swap.c, kv_query.c, kv_check.c). Not for use
 * outside src/kv. */
#pragma once

#include "kv/kv_manager.h"

/* Where a block is. Every block is in exactly one of these, which kv_check verifies. */
enum {
    LOOM__KV_FREE = 0,   /* unreferenced, not indexed: on the free stack */
    LOOM__KV_CACHED = 1, /* unreferenced, indexed: on the LRU list, evictable */
    LOOM__KV_OWNED = 2,  /* referenced by a table or pinned by a pending copy-on-write */
};

/* One KV group: its block pool, prefix index and every sequence's table for it. */
typedef struct loom__kv_group {
    int32_t n_blocks;
    int32_t window;    /* 0: full attention */
    int32_t watermark; /* blocks admissions keep free */

    /* per block, [n_blocks] */
    int32_t *ref;      /* table entries of resident sequences naming the block */
    int32_t *pin;      /* pending copy-on-writes reading the block */
    int32_t *pin_fill; /* while pinned: the most slots any pinner has committed in the block (a
                          pinner's rollback returns it there, so those slots must survive) */
    uint8_t *where;    /* LOOM__KV_FREE / CACHED / OWNED */
    uint8_t *hashed;   /* 1: the hash index maps hash[b] to b (then the block is immutable) */
    uint64_t *hash;    /* the block's hash while hashed */
    int32_t *prev;     /* LRU links of cached blocks (-1 ends); head = next to evict */
    int32_t *next;

    int32_t lru_head, lru_tail, n_cached;
    int32_t *free_ids; /* [n_blocks] stack of free blocks */
    int32_t n_free;

    /* Open-addressing hash index (linear probing, backward-shift deletion, load <= 1/2):
     * slots hold block ids (-1 empty); a slot's key is hash[slot's block]. */
    int32_t *slots; /* [slot_mask + 1] */
    uint64_t slot_mask;
    int32_t n_indexed;

    int32_t *tables; /* [max_seqs][max_blocks] block ids, LOOM_KV_NO_BLOCK where none */

    /* loom__kv_unused_slots' scratch, [n_blocks]: a block's fill is valid while its stamp is
     * the current pass's (no clearing of the arrays per pass) */
    int32_t *fill;
    uint32_t *stamp;
    uint32_t pass;

    int64_t evictions, cow_copies, window_releases, swapped_out, swapped_in;
} loom__kv_group;

/* One sequence slot. Its per-group and per-block arrays live in loom__kv (flat, by slot). */
typedef struct loom__kv_seq {
    bool live;
    bool swapped;
    bool reserved;
    int32_t n_pos;      /* computed positions */
    int32_t n_res;      /* positions reserved by the pending step */
    int32_t n_table;    /* logical table length: ceil((n_pos + n_res) / block_size) */
    int32_t idx_from;   /* first full block not yet offered to the prefix index */
    int32_t n_cached;   /* tokens reused at admission */
    uint64_t root;      /* hash chain root: (model salt, cache salt) */
    uint64_t state;     /* hash state of the committed partial last block (its parent's hash
                           mixed with its tokens so far) */
    uint64_t res_state; /* the same after the pending step's tokens */
} loom__kv_seq;

struct loom__kv {
    int32_t block_size;
    int32_t n_groups;
    int32_t max_seqs;
    int32_t max_seq_len;
    int32_t max_blocks; /* table entries per sequence: ceil(max_seq_len / block_size) */
    bool caching;
    bool rewrites; /* params.writes_rewrite_block */
    uint64_t model_salt;

    loom__kv_group *groups; /* [n_groups] */
    loom__kv_seq *seqs;     /* [max_seqs] */
    int32_t *seq_lo;        /* [max_seqs][n_groups] first held table entry (window groups) */
    int32_t *seq_cow;       /* [max_seqs][n_groups] pinned copy-on-write source, or -1 */
    uint64_t *seq_hash;     /* [max_seqs][max_blocks] hash of each full (or reserved-full) block */
    int32_t *free_seqs;     /* [max_seqs] stack of unused slots */
    int32_t n_free_seqs;
    uint64_t *scratch; /* [max_blocks] prompt block hashes during admission */

    int64_t admissions, query_tokens, hit_tokens, swap_outs, swap_ins;
};

/* ---- small accessors ------------------------------------------------------------------------ */

static inline int32_t *loom__kv_table(const loom__kv *kv, int32_t g, int32_t seq) {
    return kv->groups[g].tables + (size_t)seq * (size_t)kv->max_blocks;
}
static inline int32_t loom__kv_blocks_for(const loom__kv *kv, int64_t n_pos) {
    return (int32_t)((n_pos + kv->block_size - 1) / kv->block_size);
}
/* First table entry a window group still needs when the next query is at n_pos. */
static inline int32_t loom__kv_window_lo(const loom__kv *kv, int32_t window, int32_t n_pos) {
    if (window <= 0) return 0;
    int64_t first = (int64_t)n_pos - window + 1;
    return first > 0 ? (int32_t)(first / kv->block_size) : 0;
}
static inline int32_t loom__kv_available(const loom__kv_group *g) {
    return g->n_free + g->n_cached;
}

static inline int32_t *loom__kv_seq_lo(const loom__kv *kv, int32_t seq) {
    return kv->seq_lo + (size_t)seq * (size_t)kv->n_groups;
}
static inline int32_t *loom__kv_seq_cow(const loom__kv *kv, int32_t seq) {
    return kv->seq_cow + (size_t)seq * (size_t)kv->n_groups;
}
static inline uint64_t *loom__kv_seq_hash(const loom__kv *kv, int32_t seq) {
    return kv->seq_hash + (size_t)seq * (size_t)kv->max_blocks;
}

/* Checks seq names a live slot; sets the error message otherwise. */
loom_status loom__kv_seq_valid(const loom__kv *kv, int32_t seq);

/* Blocks group g must hand out for a resident, unreserved sequence's next n tokens: new
 * table entries plus a copy-on-write of its last block (kv_manager.c). */
int32_t loom__kv_step_need(const loom__kv *kv, int32_t seq, int32_t g, int32_t n);

/* ---- kv_blocks.c: pools --------------------------------------------------------------------- */

loom_status loom__kv_group_init(loom__kv_group *g, int32_t n_blocks, int32_t window,
                                float watermark, int32_t max_seqs, int32_t max_blocks);
void loom__kv_group_free(loom__kv_group *g);
/* Takes a block (free first, else evicts the least recently used cached one) with ref = 1.
 * The caller has checked loom__kv_available(g) > 0. */
int32_t loom__kv_block_alloc(loom__kv_group *g);
/* Adds a table reference (revives a cached block out of the LRU list). */
void loom__kv_block_ref(loom__kv_group *g, int32_t b);
/* Drops a table reference; the last one parks the block (cached if indexed, else free). */
void loom__kv_block_unref(loom__kv_group *g, int32_t b);
/* Drops a copy-on-write pin. */
void loom__kv_block_unpin(loom__kv_group *g, int32_t b);

/* ---- kv_prefix.c: hashing and the index ----------------------------------------------------- */

uint64_t loom__kv_hash_root(uint64_t model_salt, uint64_t cache_salt);
uint64_t loom__kv_hash_token(uint64_t state, int32_t token);
uint64_t loom__kv_hash_finish(uint64_t state); /* a full block's hash from its state */
int32_t loom__kv_index_find(const loom__kv_group *g, uint64_t hash);
/* Indexes b under hash unless an equal block is indexed already; returns whether it did. */
bool loom__kv_index_insert(loom__kv_group *g, int32_t b, uint64_t hash);
void loom__kv_index_remove(loom__kv_group *g, int32_t b);

/* The admission match: hashes the prompt's full blocks into kv->scratch and finds the tokens
 * L < n_prompt to reuse; *n_take = ceil(L / block_size) table entries, of which entries below
 * loom__kv_window_lo(window, L) are skipped in window groups. */
void loom__kv_prefix_match(const loom__kv *kv, uint64_t root, const int32_t *prompt,
                           int32_t n_prompt, int32_t *n_reuse, int32_t *n_take);
