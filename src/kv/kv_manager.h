/* kv_manager.h — the paged KV-cache manager: block pools, per-sequence block tables, the
 * automatic prefix cache, copy-on-write forks, swap, sliding-window release and the paged-KV
 * descriptor arrays (loom_backend.h) for each step.
 *
 * The manager deals in block ids only. The engine owns the K/V storage of every pool in backend
 * memory and performs the data copies the manager asks for (copy-on-write, swap out, swap in).
 *
 * Model of the world
 *   - A model's layers fall into KV groups (gemma3: the global layers, and the local layers
 *     with window 512). Each group has its own block pool and each sequence has one block table
 *     per group. All groups share one block size and one logical table length: entry i of a
 *     table covers positions [i * block_size, (i + 1) * block_size).
 *   - A sequence holds n_pos computed ("committed") positions. A step reserves n new positions
 *     (loom__kv_reserve), the engine runs the forward, then commits (loom__kv_commit) or rolls
 *     back (loom__kv_rollback). Positions only move forward.
 *   - Sliding-window groups (window w > 0): a query at position q sees positions q-w+1 .. q, and
 *     the next query of a sequence is at n_pos, so table entry i is never read again once
 *     (i + 1) * block_size <= n_pos - w + 1. Such entries are released when a commit makes them
 *     so; they read LOOM_KV_NO_BLOCK from then on. The descriptor carries them too, so that
 *     position p stays at entry p / block_size: a backend must not read (or validate) entries
 *     outside the window of the queries it runs.
 *
 * Prefix caching
 *   A full block is named by a 64-bit hash chained from its parent block's hash and its token
 *   ids, rooted in (model_salt, the sequence's cache_salt). A block enters the hash index only
 *   once its contents are computed (at commit), and an indexed block is immutable. When the
 *   last reference to a full indexed block goes, the block stays cached and evictable; eviction
 *   takes the least recently released block first (a sequence releases its blocks last-first,
 *   so its tail is evicted before its head: the head is what later prompts are likeliest to
 *   share, and a tail without its head can never be hit).
 *   Blocks are allocated from never-cached free blocks before any cached block is evicted.
 *
 *   Admission (loom__kv_seq_admit) reuses the longest cached prefix of the prompt, but never the
 *   whole prompt: at least its last token is computed so that the caller gets logits. When
 *   every block of the prompt is cached (prompt length P a multiple of block_size), the
 *   sequence reuses P - 1 tokens and takes the last block too; that block is indexed, hence
 *   immutable, so the step that recomputes position P - 1 copy-on-writes it (one block copy
 *   instead of recomputing block_size - 1 tokens, which is what vLLM does).
 *
 *   Sliding-window groups take part in prefix caching too: a cached prefix of L tokens is a hit
 *   only if every full-attention group holds the blocks covering [0, L) and every sliding group
 *   holds those covering [max(0, L - w + 1), L) — what the first computed query (at L) reads.
 *   The longest L satisfying every group wins; blocks a sliding group does not need are left
 *   out (LOOM_KV_NO_BLOCK), exactly as if they had been released.
 *
 *   Hashes are not cryptographic: two different prefixes share a 64-bit hash with probability
 *   about n^2 / 2^64 for n cached blocks, in which case the later one would read the earlier
 *   one's KV. Callers serving mutually untrusting tenants give each tenant its own cache_salt.
 *
 * Copy-on-write
 *   loom__kv_seq_fork shares every block of the parent with the child. Full shared blocks are
 *   never written again. A step that writes into a block that is shared (referenced by two
 *   tables) or indexed first moves the writer onto a fresh block: loom__kv_reserve returns the
 *   (src, dst) copy that the engine must perform before the forward. The source stays pinned
 *   until commit or rollback, so a rollback restores the table exactly, and the other sharer,
 *   now its only owner, writes it in place in the same step (its writes happen in the forward,
 *   after the copy has read it). So a fork followed by both sequences decoding costs one copy.
 *   The exception: if the copier has committed more of the block's slots than the other sharer
 *   (their fills differ once one committed a step the other rolled back), the other copies too,
 *   since writing in place would overwrite a slot the copier gets back if it rolls back.
 *
 * Ownership and threads: a loom__kv is created and destroyed by the engine and is driven by the
 * engine's step thread only (no internal locking; concurrent calls on one manager are not
 * allowed; distinct managers are independent). Pointers passed in are only read during the
 * call; out-arrays are caller-owned.
 *
 * Memory: everything is allocated by loom__kv_create, sized by max_seqs, max_seq_len and the
 * group pools (about max_seqs * ceil(max_seq_len / block_size) * (4 * n_groups + 8) bytes for
 * tables and per-block hashes, plus about 34 bytes per pool block and a hash index of 8 to 16
 * bytes per block). No other function allocates, except loom__kv_check (scratch counters; it is
 * a test and debug aid, not for the step path).
 *
 * Errors: every function checks its arguments and returns LOOM_ERR_INVALID_ARG for NULL
 * pointers, an unknown or dead sequence id, n < 0 or a call in the wrong state (for example a
 * second reserve before commit); a failing call changes nothing. The thread-local message
 * (loom_last_error) says which. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "loom_backend.h" /* LOOM_KV_NO_BLOCK: a table entry that holds no block */

#define LOOM_KV_DEFAULT_BLOCK_SIZE 16

typedef struct loom__kv loom__kv;

/* ---- creation ------------------------------------------------------------------------------ */

typedef struct loom__kv_group_params {
    int32_t n_blocks; /* blocks in this group's pool (the engine converts bytes into blocks) */
    int32_t window;   /* sliding window in positions; 0: full attention */
} loom__kv_group_params;

typedef struct loom__kv_params {
    int32_t block_size;                  /* tokens per block (default 16) */
    int32_t n_groups;                    /* KV groups (>= 1; default 0: the caller must set it) */
    const loom__kv_group_params *groups; /* [n_groups], copied by loom__kv_create */
    int32_t max_seqs;    /* sequences alive at once, swapped ones included (default 256) */
    int32_t max_seq_len; /* positions one sequence may hold (default 4096) */
    bool prefix_caching; /* reuse computed blocks across sequences (default true) */
    uint64_t model_salt; /* model identity, mixed into every block hash (default 0) */
    float watermark;     /* fraction of each pool that admissions keep free (default 0.01) */
    /* A store at slot t may rewrite earlier slots of its block (merged layer pairs,
     * loom_backend.h): a block a pending copy-on-write has pinned is then never written in
     * place (default false). */
    bool writes_rewrite_block;
} loom__kv_params;

loom__kv_params loom__kv_default_params(void);

/* Creates a manager with every pool's blocks free. *out is owned by the caller (destroy it).
 * Errors: LOOM_ERR_INVALID_ARG (NULL, block_size outside [1, 65536], n_groups outside [1, 64],
 * a pool of < 1 block, a negative window, max_seqs or max_seq_len < 1, watermark outside
 * [0, 1)), LOOM_ERR_OUT_OF_MEMORY. */
loom_status loom__kv_create(const loom__kv_params *p, loom__kv **out);

/* Frees the manager and everything it holds. Accepts NULL. */
void loom__kv_destroy(loom__kv *kv);

/* ---- sequences ------------------------------------------------------------------------------ */

/* Admits a new sequence whose prompt is prompt[0 .. n_prompt). Reuses the longest cached prefix
 * (see above; fewer than n_prompt tokens), taking a reference on each reused block, and sets
 * the sequence's computed length to *out_n_cached. Allocates nothing else: the engine then
 * reserves prompt[*out_n_cached ..] in one or more steps. The prompt is only read.
 * cache_salt: the request's cache salt (0 when it has none); only sequences with equal salts
 * (and the manager's model_salt) share blocks. Counts n_prompt query tokens and *out_n_cached
 * hit tokens in the stats. out_n_cached may be NULL.
 * Errors: LOOM_ERR_INVALID_ARG (NULL prompt/out_seq, n_prompt < 1), LOOM_ERR_CONTEXT_FULL
 * (n_prompt > max_seq_len, or max_seqs sequences alive). */
loom_status loom__kv_seq_admit(loom__kv *kv, uint64_t cache_salt, const int32_t *prompt,
                               int32_t n_prompt, int32_t *out_seq, int32_t *out_n_cached);

/* Creates a child sharing every block, position and hash of parent (reference counts grow;
 * nothing is copied until one of them writes a shared block). The parent must be resident
 * and have no pending reservation.
 * Errors: LOOM_ERR_INVALID_ARG (bad parent, parent swapped out or reserved),
 * LOOM_ERR_CONTEXT_FULL (max_seqs sequences alive). */
loom_status loom__kv_seq_fork(loom__kv *kv, int32_t parent, int32_t *out_child);

/* Ends a sequence: a pending reservation is rolled back, then every block it holds is released
 * (full indexed blocks stay in the prefix cache, evictable) and its id becomes invalid. This is
 * also preemption by recompute: the engine later re-admits the request with its prompt and the
 * tokens generated so far, and the prefix cache gives back whatever was not evicted meanwhile.
 * Works on a swapped-out sequence too (it then holds no blocks).
 * Errors: LOOM_ERR_INVALID_ARG (bad id). */
loom_status loom__kv_seq_free(loom__kv *kv, int32_t seq);

/* ---- one step ------------------------------------------------------------------------------ */

/* A block copy the engine performs (in every layer of the group, K and V) before the forward. */
typedef struct loom__kv_copy {
    int32_t group; /* KV group whose pools hold both blocks */
    int32_t src;   /* block to read */
    int32_t dst;   /* block to write */
} loom__kv_copy;

/* Makes room in every group for the sequence's next n tokens, tokens[0 .. n), at positions
 * n_pos .. n_pos + n - 1: appends blocks and, where the partly filled last block is shared or
 * indexed, moves the sequence onto a copy, writing the copy into copies[0 .. *n_copies) (at
 * most one per group, so copies_cap >= n_groups always suffices). The engine must perform the
 * copies before the forward. The tokens are hashed now (they name the blocks they fill);
 * the blocks become cacheable only at loom__kv_commit. n = 0 is allowed (an empty reservation).
 * May evict cached blocks (least recently used first).
 * Errors (nothing changed): LOOM_ERR_INVALID_ARG (bad id, swapped out, already reserved,
 * n < 0, tokens NULL with n > 0, copies NULL with copies_cap > 0), LOOM_ERR_CONTEXT_FULL
 * (n_pos + n > max_seq_len, or a pool lacks free + evictable blocks),
 * LOOM_ERR_BUFFER_TOO_SMALL (copies_cap too small for the copies needed). */
loom_status loom__kv_reserve(loom__kv *kv, int32_t seq, int32_t n, const int32_t *tokens,
                             loom__kv_copy *copies, int32_t copies_cap, int32_t *n_copies);

/* The forward succeeded: the reserved positions become computed, full blocks enter the prefix
 * index (unless an equal block already has), copy-on-write sources are unpinned and blocks that
 * left a sliding window are released. Errors: LOOM_ERR_INVALID_ARG (bad id, nothing reserved). */
loom_status loom__kv_commit(loom__kv *kv, int32_t seq);

/* The forward failed: undoes the reservation (blocks appended by it return to the pool, a
 * copy-on-write is undone). Cached blocks evicted by the reservation stay evicted.
 * Errors: LOOM_ERR_INVALID_ARG (bad id, nothing reserved). */
loom_status loom__kv_rollback(loom__kv *kv, int32_t seq);

/* ---- the descriptor ------------------------------------------------------------------------ */

/* Entries of block_ids[] that a batch of n_seqs sequences can need in one group (each table
 * holds at most ceil(max_seq_len / block_size) entries): size the array once with it. */
int64_t loom__kv_desc_block_cap(const loom__kv *kv, int32_t n_seqs);

/* Fills, for one group, the CSR arrays of loom_kv_desc for a batch: sequence s = seqs[b] gets
 * its new rows q_start[b] .. q_start[b+1) (n_new[b] of them, in batch order), pos_start[b] =
 * its n_pos, kv_len[b] = n_pos + n_new[b], and its whole table (released entries included, as
 * LOOM_KV_NO_BLOCK, so that position p stays at entry p / block_size) at block_ids[indptr[b] ..
 * indptr[b+1]). n_new[b] must equal the sequence's reservation (0 if it has none); n_new may be
 * NULL to take the reservations as they are. q_start, pos_start and kv_len are the same for
 * every group and may be NULL. A sequence must appear once. Reads only; allocates nothing.
 * Errors: LOOM_ERR_INVALID_ARG (NULL indptr, bad group or id, swapped out, n_new mismatch),
 * LOOM_ERR_BUFFER_TOO_SMALL (the tables need more than block_cap entries; nothing written). */
loom_status loom__kv_fill_desc(const loom__kv *kv, int32_t group, int32_t n_seqs,
                               const int32_t *seqs, const int32_t *n_new, int32_t *indptr,
                               int32_t *block_ids, int64_t block_cap, int32_t *q_start,
                               int32_t *pos_start, int32_t *kv_len);

/* ---- preemption by swapping ---------------------------------------------------------------- */

/* Swaps a resident sequence out: writes, group by group, the blocks it holds in table order to
 * blocks[offsets[g] .. offsets[g+1]) (offsets has n_groups + 1 entries), then releases them
 * (shared ones stay with their other owners, full indexed ones stay cached). The engine copies
 * block j of the list to its host slot j before its next call that can allocate (reserve,
 * swap_in). Positions, hashes and the table's shape are kept. Needs cap >= the sequence's
 * n_held (loom__kv_seq_get_info).
 * Errors: LOOM_ERR_INVALID_ARG (bad id, already swapped, reserved, NULL arrays),
 * LOOM_ERR_BUFFER_TOO_SMALL (nothing changed). */
loom_status loom__kv_swap_out(loom__kv *kv, int32_t seq, int32_t *blocks, int32_t cap,
                              int32_t *offsets);

/* Swaps a sequence back in: allocates fresh blocks for exactly the entries swap_out listed and
 * writes them in the same order (blocks[offsets[g] .. offsets[g+1]) per group); the engine
 * copies host slot j into block j before the next forward. The blocks are offered to the
 * prefix index at the sequence's next commit (once the copies have demonstrably run).
 * Errors: LOOM_ERR_INVALID_ARG (bad id, not swapped out, NULL arrays),
 * LOOM_ERR_BUFFER_TOO_SMALL, LOOM_ERR_CONTEXT_FULL (a pool lacks blocks); nothing changed. */
loom_status loom__kv_swap_in(loom__kv *kv, int32_t seq, int32_t *blocks, int32_t cap,
                             int32_t *offsets);

/* ---- capacity queries for the scheduler ---------------------------------------------------- */

int32_t loom__kv_n_groups(const loom__kv *kv);
int32_t loom__kv_block_size(const loom__kv *kv);

/* Blocks of a group that an allocation can take now: free ones plus evictable cached ones.
 * Returns -1 for a bad group. */
int32_t loom__kv_blocks_available(const loom__kv *kv, int32_t group);

/* Blocks per group (need[n_groups]) the sequence would take from the pools to run its next n
 * tokens: new table entries plus a copy-on-write of a shared last block; for a swapped-out
 * sequence, the swap-in's blocks as well. Sliding-window releases happen only at commit (the
 * step's queries still read those blocks), so they never lower this peak.
 * Errors: LOOM_ERR_INVALID_ARG (bad id, n < 0, reserved, NULL need), LOOM_ERR_CONTEXT_FULL
 * (n_pos + n > max_seq_len). */
loom_status loom__kv_seq_need(const loom__kv *kv, int32_t seq, int32_t n, int32_t *need);

/* Blocks per group a not yet admitted prompt would take: admitting it (reviving evictable
 * cached blocks of its prefix) and reserving its first n_first uncached tokens (0 for just the
 * admission). *n_cached (may be NULL) receives the tokens admission would reuse. Read-only:
 * the stats and the LRU order do not change. n_first is clipped to the uncached rest.
 * Errors: LOOM_ERR_INVALID_ARG (NULL, n_prompt < 1, n_first < 0), LOOM_ERR_CONTEXT_FULL
 * (n_prompt > max_seq_len). */
loom_status loom__kv_admit_need(const loom__kv *kv, uint64_t cache_salt, const int32_t *prompt,
                                int32_t n_prompt, int32_t n_first, int32_t *need,
                                int32_t *n_cached);

/* True when every group can give need[g] blocks now; with keep_watermark (new admissions),
 * while still leaving the group's watermark blocks (watermark * n_blocks rounded down, at least
 * 1 for a non-zero watermark) free, so
 * that running sequences can grow without being preempted at once. */
bool loom__kv_fits(const loom__kv *kv, const int32_t *need, bool keep_watermark);

/* ---- inspection ---------------------------------------------------------------------------- */

typedef struct loom__kv_group_stats {
    int32_t n_blocks;        /* pool size */
    int32_t window;          /* 0: full attention */
    int32_t n_used;          /* held by sequences or pinned by a pending copy */
    int32_t n_cached;        /* unreferenced but cached (evictable, LRU) */
    int32_t n_free;          /* unreferenced and empty */
    int32_t watermark;       /* blocks admissions keep free */
    int64_t evictions;       /* cached blocks evicted to make room */
    int64_t cow_copies;      /* copy-on-write copies issued (and not rolled back) */
    int64_t window_releases; /* blocks released because they left the sliding window */
    int64_t swapped_out;     /* blocks listed by swap_out */
    int64_t swapped_in;      /* blocks allocated by swap_in */
} loom__kv_group_stats;

typedef struct loom__kv_stats {
    int32_t n_groups;
    int32_t n_seqs;              /* live sequences, swapped ones included */
    int32_t n_swapped;           /* of which swapped out */
    int64_t admissions;          /* loom__kv_seq_admit calls that succeeded */
    int64_t prefix_query_tokens; /* prompt tokens looked up at admission */
    int64_t prefix_hit_tokens;   /* of which reused from the cache */
    int64_t evictions;           /* totals over the groups */
    int64_t cow_copies;
    int64_t window_releases;
    int64_t swap_outs; /* sequences swapped out */
    int64_t swap_ins;  /* sequences swapped in */
} loom__kv_stats;

/* Errors: LOOM_ERR_INVALID_ARG (NULL, bad group). */
loom_status loom__kv_get_stats(const loom__kv *kv, loom__kv_stats *out);
loom_status loom__kv_get_group_stats(const loom__kv *kv, int32_t group, loom__kv_group_stats *out);

/* Internal fragmentation of a group, exactly: *out = the slots of its owned blocks that hold no
 * computed position. A block's filled slots are the most that any holder has computed in it
 * (a table entry of a resident sequence, counting its computed positions only, or a pending
 * copy-on-write's source at the fill it pinned), so a block shared by several sequences counts
 * once; slots reserved by a pending step count as unused until it commits. O(blocks held by
 * the resident sequences); uses scratch in the manager, hence not const. Errors:
 * LOOM_ERR_INVALID_ARG (NULL, bad group). */
loom_status loom__kv_unused_slots(loom__kv *kv, int32_t group, int64_t *out);

typedef struct loom__kv_seq_info {
    int32_t n_pos;      /* computed positions */
    int32_t n_reserved; /* positions reserved by a pending step (0 when none) */
    bool reserved;      /* a reserve awaits its commit or rollback */
    bool swapped;       /* swapped out: holds no blocks */
    int32_t n_cached;   /* prompt tokens reused from the prefix cache at admission */
    int32_t n_table;    /* logical table length, ceil((n_pos + n_reserved) / block_size) */
    int32_t n_held;     /* blocks held over all groups (what swap_out lists); swapped out: the
                           blocks swap_in will allocate */
} loom__kv_seq_info;

/* Errors: LOOM_ERR_INVALID_ARG (NULL, bad id). */
loom_status loom__kv_seq_get_info(const loom__kv *kv, int32_t seq, loom__kv_seq_info *out);

/* A read-only view of the sequence's table in one group: (*table)[0 .. *n) with n = n_table,
 * LOOM_KV_NO_BLOCK for entries not held. Valid until the next call that changes the manager.
 * Errors: LOOM_ERR_INVALID_ARG (NULL, bad id or group). */
loom_status loom__kv_seq_table(const loom__kv *kv, int32_t seq, int32_t group,
                               const int32_t **table, int32_t *n);

/* The blocks of the sequence's table in group that no other sequence names (reference count
 * 1): exactly what freeing or swapping out the sequence makes available. Blocks it shares — a
 * prefix another request found in the cache, the prompt of its sibling samples — stay with
 * their other owners. Errors: LOOM_ERR_INVALID_ARG (NULL, bad id or group). */
loom_status loom__kv_seq_exclusive_blocks(const loom__kv *kv, int32_t seq, int32_t group,
                                          int32_t *n);

/* Verifies every invariant: each block is exactly one of free, cached-evictable or owned;
 * reference counts equal the table references and pins equal the pending copies; a block a
 * pending step writes has one owner and is not indexed; the hash index and the LRU list are
 * consistent; counters match. Returns LOOM_OK or LOOM_ERR_INTERNAL with a message naming the
 * first violation. O(pools + tables); meant for tests and debug builds. */
loom_status loom__kv_check(const loom__kv *kv);
