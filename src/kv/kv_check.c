/* kv_check.c — loom__kv_check: recounts everything the KV manager keeps incrementally (reference
 * counts, pins, free stack, LRU list, hash index, sequence tables) and reports the first
 * disagreement. A debugging aid for tests; it allocates scratch counters on each call. */
#include "kv/kv_internal.h"

#include <stdlib.h>

#include "core/alloc.h"
#include "core/status.h"

#define KV_BAD(...) return loom__fail(LOOM_ERR_INTERNAL, "kv check: " __VA_ARGS__)

/* Scratch per block of one group: references, pins and the pinners' largest committed fill
 * found in tables, and a visit mark. */
typedef struct check_counts {
    int32_t *ref;
    int32_t *pin;
    int32_t *fill;
    uint8_t *seen;
} check_counts;

/* One sequence's rows in one group: shape, references and pins (the writers are checked once
 * every pinner is counted, in check_writes). */
static loom_status check_seq_group(const loom__kv *kv, int32_t seq, int32_t gi, check_counts *c) {
    const loom__kv_group *g = &kv->groups[gi];
    const loom__kv_seq *s = &kv->seqs[seq];
    const int32_t *table = loom__kv_table(kv, gi, seq);
    const int32_t lo = loom__kv_seq_lo(kv, seq)[gi];
    const int32_t cow = loom__kv_seq_cow(kv, seq)[gi];
    const int32_t bs = kv->block_size;

    if (lo != loom__kv_window_lo(kv, g->window, s->n_pos))
        KV_BAD("seq %d group %d: window start %d, expected %d at n_pos %d", seq, gi, lo,
               loom__kv_window_lo(kv, g->window, s->n_pos), s->n_pos);
    if (lo > s->n_table)
        KV_BAD("seq %d group %d: window start %d past table end %d", seq, gi, lo, s->n_table);
    for (int32_t i = 0; i < kv->max_blocks; i++) {
        int32_t b = table[i];
        bool held = !s->swapped && i >= lo && i < s->n_table;
        if (!held) {
            if (b != LOOM_KV_NO_BLOCK)
                KV_BAD("seq %d group %d: entry %d holds block %d outside [%d, %d)%s", seq, gi, i, b,
                       lo, s->n_table, s->swapped ? " while swapped out" : "");
            continue;
        }
        if (b < 0 || b >= g->n_blocks)
            KV_BAD("seq %d group %d: entry %d holds invalid block %d", seq, gi, i, b);
        c->ref[b]++;
        /* Committed full blocks that are indexed carry the hash the sequence computed. */
        if (i < s->n_pos / bs && g->hashed[b] && g->hash[b] != loom__kv_seq_hash(kv, seq)[i])
            KV_BAD("seq %d group %d: entry %d: block %d indexed under another hash", seq, gi, i, b);
    }
    if (cow >= 0) {
        if (!s->reserved || s->n_res == 0 || s->n_pos % bs == 0 || cow >= g->n_blocks)
            KV_BAD("seq %d group %d: stray copy-on-write source %d", seq, gi, cow);
        if (table[s->n_pos / bs] == cow)
            KV_BAD("seq %d group %d: copy-on-write source %d still in the table", seq, gi, cow);
        c->pin[cow]++;
        if (s->n_pos % bs > c->fill[cow]) c->fill[cow] = s->n_pos % bs;
    }
    return LOOM_OK;
}

/* The blocks a pending step writes: one owner, not indexed (an indexed block is frozen), and
 * not below the committed fill of a pending copy-on-write that may roll back into it. */
static loom_status check_writes(const loom__kv *kv, int32_t seq, int32_t gi,
                                const check_counts *c) {
    const loom__kv_group *g = &kv->groups[gi];
    const loom__kv_seq *s = &kv->seqs[seq];
    const int32_t *table = loom__kv_table(kv, gi, seq);
    const int32_t bs = kv->block_size;
    if (!s->reserved || s->n_res == 0 || s->swapped) return LOOM_OK;
    for (int32_t i = s->n_pos / bs; i < s->n_table; i++) {
        int32_t b = table[i];
        if (g->ref[b] != 1 || g->hashed[b])
            KV_BAD("seq %d group %d: writes block %d (entry %d) with %d references%s", seq, gi, b,
                   i, g->ref[b], g->hashed[b] ? ", indexed" : "");
        int32_t from = i == s->n_pos / bs ? s->n_pos % bs : 0; /* first slot written */
        if (c->pin[b] > 0 && from < c->fill[b])
            KV_BAD("seq %d group %d: writes slot %d of block %d, below a pinner's fill %d", seq, gi,
                   from, b, c->fill[b]);
    }
    return LOOM_OK;
}

static loom_status check_seqs(const loom__kv *kv) {
    int32_t n_live = 0;
    for (int32_t i = 0; i < kv->n_free_seqs; i++) {
        int32_t seq = kv->free_seqs[i];
        if (seq < 0 || seq >= kv->max_seqs || kv->seqs[seq].live)
            KV_BAD("free slot list holds %d, which is live or invalid", seq);
    }
    for (int32_t seq = 0; seq < kv->max_seqs; seq++) {
        const loom__kv_seq *s = &kv->seqs[seq];
        if (!s->live) continue;
        n_live++;
        if (s->n_pos < 0 || s->n_res < 0 || (!s->reserved && s->n_res != 0) ||
            (int64_t)s->n_pos + s->n_res > kv->max_seq_len)
            KV_BAD("seq %d: n_pos %d, n_res %d, reserved %d", seq, s->n_pos, s->n_res, s->reserved);
        if (s->n_table != loom__kv_blocks_for(kv, (int64_t)s->n_pos + s->n_res))
            KV_BAD("seq %d: table length %d for %d positions", seq, s->n_table,
                   s->n_pos + s->n_res);
        if (s->idx_from < 0 || s->idx_from > s->n_pos / kv->block_size)
            KV_BAD("seq %d: index cursor %d past %d full blocks", seq, s->idx_from,
                   s->n_pos / kv->block_size);
        if (s->swapped && s->reserved) KV_BAD("seq %d: swapped out and reserved", seq);
    }
    if (n_live + kv->n_free_seqs != kv->max_seqs)
        KV_BAD("%d live sequences + %d free slots != %d", n_live, kv->n_free_seqs, kv->max_seqs);
    return LOOM_OK;
}

/* A group's blocks against the recount, the free stack, the LRU list and the index. */
static loom_status check_group(const loom__kv *kv, int32_t gi, check_counts *c) {
    const loom__kv_group *g = &kv->groups[gi];
    int32_t n_free = 0, n_cached = 0, n_hashed = 0;
    for (int32_t b = 0; b < g->n_blocks; b++) {
        if (g->ref[b] != c->ref[b])
            KV_BAD("group %d: block %d has refcount %d, %d table references", gi, b, g->ref[b],
                   c->ref[b]);
        if (g->pin[b] != c->pin[b])
            KV_BAD("group %d: block %d has %d pins, %d pending copies", gi, b, g->pin[b],
                   c->pin[b]);
        if (g->pin_fill[b] < c->fill[b] || (g->pin[b] == 0 && g->pin_fill[b] != 0))
            KV_BAD("group %d: block %d: pinned fill %d, pinners committed %d", gi, b,
                   g->pin_fill[b], c->fill[b]);
        bool owned = g->ref[b] > 0 || g->pin[b] > 0;
        int want = owned ? LOOM__KV_OWNED : g->hashed[b] ? LOOM__KV_CACHED : LOOM__KV_FREE;
        if (g->where[b] != want)
            KV_BAD("group %d: block %d is in state %d, expected %d (ref %d, pin %d, indexed %d)",
                   gi, b, g->where[b], want, g->ref[b], g->pin[b], g->hashed[b]);
        n_free += g->where[b] == LOOM__KV_FREE;
        n_cached += g->where[b] == LOOM__KV_CACHED;
        if (g->hashed[b]) {
            n_hashed++;
            if (loom__kv_index_find(g, g->hash[b]) != b)
                KV_BAD("group %d: block %d is not found under its hash", gi, b);
        }
        c->seen[b] = 0;
    }
    if (n_free != g->n_free || n_cached != g->n_cached)
        KV_BAD("group %d: %d free and %d cached blocks, counters say %d and %d", gi, n_free,
               n_cached, g->n_free, g->n_cached);
    for (int32_t i = 0; i < g->n_free; i++) {
        int32_t b = g->free_ids[i];
        if (b < 0 || b >= g->n_blocks || g->where[b] != LOOM__KV_FREE || c->seen[b])
            KV_BAD("group %d: free stack entry %d is block %d (bad, not free or twice)", gi, i, b);
        c->seen[b] = 1;
    }
    int32_t n = 0, prev = -1;
    for (int32_t b = g->lru_head; b >= 0; prev = b, b = g->next[b]) {
        if (b >= g->n_blocks || g->where[b] != LOOM__KV_CACHED || c->seen[b] ||
            g->prev[b] != prev || ++n > g->n_cached)
            KV_BAD("group %d: LRU list broken at block %d", gi, b);
        c->seen[b] = 1;
    }
    if (n != g->n_cached || g->lru_tail != prev)
        KV_BAD("group %d: LRU list has %d blocks ending at %d, expected %d ending at %d", gi, n,
               prev, g->n_cached, g->lru_tail);
    int32_t n_slots = 0;
    for (uint64_t i = 0; i <= g->slot_mask; i++) {
        int32_t b = g->slots[i];
        if (b < 0) continue;
        n_slots++;
        if (b >= g->n_blocks || !g->hashed[b])
            KV_BAD("group %d: index slot %llu holds unindexed block %d", gi, (unsigned long long)i,
                   b);
    }
    if (n_slots != n_hashed || n_hashed != g->n_indexed)
        KV_BAD("group %d: %d index slots, %d indexed blocks, counter %d", gi, n_slots, n_hashed,
               g->n_indexed);
    return LOOM_OK;
}

loom_status loom__kv_check(const loom__kv *kv) {
    LOOM_CHECK_ARG(kv != NULL);
    LOOM_TRY(check_seqs(kv));
    int32_t max_nb = 1;
    for (int32_t gi = 0; gi < kv->n_groups; gi++)
        if (kv->groups[gi].n_blocks > max_nb) max_nb = kv->groups[gi].n_blocks;
    check_counts c = {
        .ref = loom__calloc((size_t)max_nb, sizeof *c.ref),
        .pin = loom__calloc((size_t)max_nb, sizeof *c.pin),
        .fill = loom__calloc((size_t)max_nb, sizeof *c.fill),
        .seen = loom__calloc((size_t)max_nb, 1),
    };
    loom_status st = LOOM_OK;
    if (!c.ref || !c.pin || !c.fill || !c.seen) {
        st = loom__fail(LOOM_ERR_OUT_OF_MEMORY, "kv check: cannot allocate counters");
        goto done;
    }
    for (int32_t gi = 0; gi < kv->n_groups && st == LOOM_OK; gi++) {
        for (int32_t b = 0; b < kv->groups[gi].n_blocks; b++) c.ref[b] = c.pin[b] = c.fill[b] = 0;
        for (int32_t seq = 0; seq < kv->max_seqs && st == LOOM_OK; seq++) {
            if (kv->seqs[seq].live) {
                st = check_seq_group(kv, seq, gi, &c);
            } else {
                const int32_t *table = loom__kv_table(kv, gi, seq);
                for (int32_t i = 0; i < kv->max_blocks; i++)
                    if (table[i] != LOOM_KV_NO_BLOCK) {
                        st = loom__fail(LOOM_ERR_INTERNAL,
                                        "kv check: dead slot %d group %d: entry %d holds %d", seq,
                                        gi, i, table[i]);
                        break;
                    }
            }
        }
        for (int32_t seq = 0; seq < kv->max_seqs && st == LOOM_OK; seq++)
            if (kv->seqs[seq].live) st = check_writes(kv, seq, gi, &c);
        if (st == LOOM_OK) st = check_group(kv, gi, &c);
    }
done:
    free(c.ref);
    free(c.pin);
    free(c.fill);
    free(c.seen);
    return st;
}
