/* kv_manager.c — the KV manager's life cycle and sequence operations: create/destroy, admit
 * (with the prefix-cache match), fork, free, and a step's reserve / commit / rollback with
 * copy-on-write and sliding-window release. See kv_manager.h for the contract. */
#include "kv/kv_internal.h"

#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/checked.h"
#include "core/status.h"

/* ==== creation ================================================================================ */

loom__kv_params loom__kv_default_params(void) {
    loom__kv_params p;
    memset(&p, 0, sizeof p);
    p.block_size = LOOM_KV_DEFAULT_BLOCK_SIZE;
    p.max_seqs = 256;
    p.max_seq_len = 4096;
    p.prefix_caching = true;
    p.watermark = 0.01f;
    return p;
}

static loom_status check_params(const loom__kv_params *p) {
    LOOM_RETURN_IF(p->block_size < 1 || p->block_size > 65536, LOOM_ERR_INVALID_ARG,
                   "kv: block_size %d outside [1, 65536]", p->block_size);
    LOOM_RETURN_IF(p->n_groups < 1 || p->n_groups > 64 || p->groups == NULL, LOOM_ERR_INVALID_ARG,
                   "kv: n_groups %d outside [1, 64] or groups NULL", p->n_groups);
    for (int32_t g = 0; g < p->n_groups; g++)
        LOOM_RETURN_IF(p->groups[g].n_blocks < 1 || p->groups[g].window < 0, LOOM_ERR_INVALID_ARG,
                       "kv: group %d: n_blocks %d, window %d", g, p->groups[g].n_blocks,
                       p->groups[g].window);
    LOOM_RETURN_IF(p->max_seqs < 1 || p->max_seq_len < 1, LOOM_ERR_INVALID_ARG,
                   "kv: max_seqs %d and max_seq_len %d must be >= 1", p->max_seqs, p->max_seq_len);
    LOOM_RETURN_IF(!(p->watermark >= 0.0f && p->watermark < 1.0f), LOOM_ERR_INVALID_ARG,
                   "kv: watermark %g outside [0, 1)", (double)p->watermark);
    return LOOM_OK;
}

loom_status loom__kv_create(const loom__kv_params *p, loom__kv **out) {
    LOOM_CHECK_ARG(p != NULL && out != NULL);
    *out = NULL;
    LOOM_TRY(check_params(p));

    loom__kv *kv = loom__calloc(1, sizeof *kv);
    LOOM_RETURN_IF(!kv, LOOM_ERR_OUT_OF_MEMORY, "kv: cannot allocate the manager");
    kv->block_size = p->block_size;
    kv->n_groups = p->n_groups;
    kv->max_seqs = p->max_seqs;
    kv->max_seq_len = p->max_seq_len;
    kv->max_blocks = loom__kv_blocks_for(kv, p->max_seq_len);
    kv->caching = p->prefix_caching;
    kv->rewrites = p->writes_rewrite_block;
    kv->model_salt = p->model_salt;

    loom_status st = LOOM_OK;
    size_t ms = (size_t)kv->max_seqs, per_group = 0, per_block = 0;
    bool overflow = loom__mul_overflow_size(ms, (size_t)kv->n_groups, &per_group) ||
                    loom__mul_overflow_size(ms, (size_t)kv->max_blocks, &per_block);
    kv->groups = loom__calloc((size_t)kv->n_groups, sizeof *kv->groups);
    kv->seqs = loom__calloc(ms, sizeof *kv->seqs);
    kv->seq_lo = overflow ? NULL : loom__calloc(per_group, sizeof *kv->seq_lo);
    kv->seq_cow = overflow ? NULL : loom__calloc(per_group, sizeof *kv->seq_cow);
    kv->seq_hash = overflow ? NULL : loom__calloc(per_block, sizeof *kv->seq_hash);
    kv->free_seqs = loom__calloc(ms, sizeof *kv->free_seqs);
    kv->scratch = loom__calloc((size_t)kv->max_blocks, sizeof *kv->scratch);
    if (!kv->groups || !kv->seqs || !kv->seq_lo || !kv->seq_cow || !kv->seq_hash ||
        !kv->free_seqs || !kv->scratch) {
        st = loom__fail(LOOM_ERR_OUT_OF_MEMORY,
                        "kv: cannot allocate tables for %d sequences of %d blocks", kv->max_seqs,
                        kv->max_blocks);
        goto fail;
    }
    for (int32_t g = 0; g < kv->n_groups; g++)
        LOOM_TRY_GOTO(st,
                      loom__kv_group_init(&kv->groups[g], p->groups[g].n_blocks,
                                          p->groups[g].window, p->watermark, kv->max_seqs,
                                          kv->max_blocks),
                      fail);
    for (size_t i = 0; i < per_group; i++) kv->seq_cow[i] = -1;
    /* Lowest slot on top, so the first sequence is 0. */
    for (int32_t i = 0; i < kv->max_seqs; i++) kv->free_seqs[i] = kv->max_seqs - 1 - i;
    kv->n_free_seqs = kv->max_seqs;
    *out = kv;
    return LOOM_OK;
fail:
    loom__kv_destroy(kv);
    return st;
}

void loom__kv_destroy(loom__kv *kv) {
    if (!kv) return;
    if (kv->groups)
        for (int32_t g = 0; g < kv->n_groups; g++) loom__kv_group_free(&kv->groups[g]);
    free(kv->groups);
    free(kv->seqs);
    free(kv->seq_lo);
    free(kv->seq_cow);
    free(kv->seq_hash);
    free(kv->free_seqs);
    free(kv->scratch);
    free(kv);
}

loom_status loom__kv_seq_valid(const loom__kv *kv, int32_t seq) {
    LOOM_RETURN_IF(seq < 0 || seq >= kv->max_seqs || !kv->seqs[seq].live, LOOM_ERR_INVALID_ARG,
                   "kv: unknown sequence %d", seq);
    return LOOM_OK;
}

static int32_t take_slot(loom__kv *kv) {
    int32_t seq = kv->free_seqs[--kv->n_free_seqs];
    loom__kv_seq *s = &kv->seqs[seq];
    memset(s, 0, sizeof *s);
    s->live = true;
    int32_t *cow = loom__kv_seq_cow(kv, seq);
    for (int32_t g = 0; g < kv->n_groups; g++) cow[g] = -1;
    return seq;
}

/* ==== admission, fork, free =================================================================== */

loom_status loom__kv_seq_admit(loom__kv *kv, uint64_t cache_salt, const int32_t *prompt,
                               int32_t n_prompt, int32_t *out_seq, int32_t *out_n_cached) {
    LOOM_CHECK_ARG(kv != NULL && prompt != NULL && out_seq != NULL && n_prompt >= 1);
    LOOM_RETURN_IF(n_prompt > kv->max_seq_len, LOOM_ERR_CONTEXT_FULL,
                   "kv: prompt of %d tokens exceeds max_seq_len %d", n_prompt, kv->max_seq_len);
    LOOM_RETURN_IF(kv->n_free_seqs == 0, LOOM_ERR_CONTEXT_FULL, "kv: %d sequences alive already",
                   kv->max_seqs);

    const uint64_t root = loom__kv_hash_root(kv->model_salt, cache_salt);
    int32_t reuse, take;
    loom__kv_prefix_match(kv, root, prompt, n_prompt, &reuse, &take);

    const int32_t seq = take_slot(kv);
    loom__kv_seq *s = &kv->seqs[seq];
    s->root = root;
    s->n_pos = reuse;
    s->n_table = take;
    s->idx_from = reuse / kv->block_size; /* reused blocks are indexed already */
    s->n_cached = reuse;
    for (int32_t gi = 0; gi < kv->n_groups; gi++) {
        loom__kv_group *g = &kv->groups[gi];
        int32_t *table = loom__kv_table(kv, gi, seq);
        int32_t lo = loom__kv_window_lo(kv, g->window, reuse);
        loom__kv_seq_lo(kv, seq)[gi] = lo;
        for (int32_t i = lo; i < take; i++) {
            int32_t b = loom__kv_index_find(g, kv->scratch[i]);
            loom__kv_block_ref(g, b); /* found by the match just now */
            table[i] = b;
        }
    }
    memcpy(loom__kv_seq_hash(kv, seq), kv->scratch, (size_t)take * sizeof *kv->scratch);
    /* The hash state of a partly reused last block (only when the whole prompt was cached):
     * its parent's hash mixed with the tokens it keeps. */
    const int32_t full = reuse / kv->block_size;
    uint64_t state = full > 0 ? kv->scratch[full - 1] : root;
    for (int32_t t = full * kv->block_size; t < reuse; t++)
        state = loom__kv_hash_token(state, prompt[t]);
    s->state = state;

    kv->admissions++;
    kv->query_tokens += n_prompt;
    kv->hit_tokens += reuse;
    *out_seq = seq;
    if (out_n_cached) *out_n_cached = reuse;
    return LOOM_OK;
}

loom_status loom__kv_seq_fork(loom__kv *kv, int32_t parent, int32_t *out_child) {
    LOOM_CHECK_ARG(kv != NULL && out_child != NULL);
    LOOM_TRY(loom__kv_seq_valid(kv, parent));
    const loom__kv_seq *ps = &kv->seqs[parent];
    LOOM_RETURN_IF(ps->swapped || ps->reserved, LOOM_ERR_INVALID_ARG,
                   "kv: cannot fork sequence %d while it is %s", parent,
                   ps->swapped ? "swapped out" : "reserved");
    LOOM_RETURN_IF(kv->n_free_seqs == 0, LOOM_ERR_CONTEXT_FULL, "kv: %d sequences alive already",
                   kv->max_seqs);

    const int32_t child = take_slot(kv);
    loom__kv_seq *cs = &kv->seqs[child];
    *cs = kv->seqs[parent];
    cs->n_cached = 0; /* the child reused nothing from the prefix cache itself */
    for (int32_t gi = 0; gi < kv->n_groups; gi++) {
        loom__kv_group *g = &kv->groups[gi];
        const int32_t *pt = loom__kv_table(kv, gi, parent);
        int32_t *ct = loom__kv_table(kv, gi, child);
        int32_t lo = loom__kv_seq_lo(kv, parent)[gi];
        loom__kv_seq_lo(kv, child)[gi] = lo;
        for (int32_t i = lo; i < cs->n_table; i++) {
            loom__kv_block_ref(g, pt[i]);
            ct[i] = pt[i];
        }
    }
    memcpy(loom__kv_seq_hash(kv, child), loom__kv_seq_hash(kv, parent),
           (size_t)cs->n_table * sizeof(uint64_t));
    *out_child = child;
    return LOOM_OK;
}

static void rollback_reservation(loom__kv *kv, int32_t seq);

loom_status loom__kv_seq_free(loom__kv *kv, int32_t seq) {
    LOOM_CHECK_ARG(kv != NULL);
    LOOM_TRY(loom__kv_seq_valid(kv, seq));
    loom__kv_seq *s = &kv->seqs[seq];
    if (s->reserved) rollback_reservation(kv, seq);
    if (!s->swapped) {
        for (int32_t gi = 0; gi < kv->n_groups; gi++) {
            loom__kv_group *g = &kv->groups[gi];
            int32_t *table = loom__kv_table(kv, gi, seq);
            /* Last block first: the LRU then evicts a prefix's tail before its head, and a
             * head without its tail is still a hit while a tail without its head never is. */
            for (int32_t i = s->n_table - 1; i >= loom__kv_seq_lo(kv, seq)[gi]; i--) {
                loom__kv_block_unref(g, table[i]);
                table[i] = LOOM_KV_NO_BLOCK;
            }
        }
    }
    s->live = false;
    kv->free_seqs[kv->n_free_seqs++] = seq;
    return LOOM_OK;
}

/* ==== reserve, commit, rollback =============================================================== */

/* The block a write of n > 0 tokens at n_pos would land in while others still need it, or -1.
 * Only the partly filled last block can be one (full blocks are never written again), when
 *  - another table shares it, or it is indexed (and so immutable), or
 *  - a pending copy-on-write pinned it after committing more of its slots than this sequence
 *    has (sharers' fills differ after one committed and the other rolled back): that
 *    sequence's rollback returns it here and needs those slots intact. With equal fills (a
 *    fork) the in-place write only touches slots the pinner never committed — unless a write
 *    rewrites earlier slots too (writes_rewrite_block): then any pin means a copy. */
static int32_t cow_source(const loom__kv *kv, int32_t seq, int32_t gi, int32_t n) {
    const loom__kv_seq *s = &kv->seqs[seq];
    const int32_t fill = s->n_pos % kv->block_size;
    if (n == 0 || fill == 0) return -1;
    const loom__kv_group *g = &kv->groups[gi];
    int32_t b = loom__kv_table(kv, gi, seq)[s->n_pos / kv->block_size];
    bool in_place = g->ref[b] == 1 && !g->hashed[b] &&
                    (g->pin[b] == 0 || (!kv->rewrites && fill >= g->pin_fill[b]));
    return in_place ? -1 : b;
}

int32_t loom__kv_step_need(const loom__kv *kv, int32_t seq, int32_t gi, int32_t n) {
    const loom__kv_seq *s = &kv->seqs[seq];
    return loom__kv_blocks_for(kv, (int64_t)s->n_pos + n) - s->n_table +
           (cow_source(kv, seq, gi, n) >= 0 ? 1 : 0);
}

loom_status loom__kv_reserve(loom__kv *kv, int32_t seq, int32_t n, const int32_t *tokens,
                             loom__kv_copy *copies, int32_t copies_cap, int32_t *n_copies) {
    LOOM_CHECK_ARG(kv != NULL && n_copies != NULL && n >= 0 && (tokens != NULL || n == 0) &&
                   (copies != NULL || copies_cap == 0));
    LOOM_TRY(loom__kv_seq_valid(kv, seq));
    loom__kv_seq *s = &kv->seqs[seq];
    LOOM_RETURN_IF(s->swapped || s->reserved, LOOM_ERR_INVALID_ARG,
                   "kv: cannot reserve for sequence %d while it is %s", seq,
                   s->swapped ? "swapped out" : "reserved");
    LOOM_RETURN_IF(n > kv->max_seq_len - s->n_pos, LOOM_ERR_CONTEXT_FULL,
                   "kv: sequence %d: %d + %d positions exceed max_seq_len %d", seq, s->n_pos, n,
                   kv->max_seq_len);

    /* Check everything first, so that a failure changes nothing. */
    int32_t n_cow = 0;
    for (int32_t gi = 0; gi < kv->n_groups; gi++) {
        int32_t need = loom__kv_step_need(kv, seq, gi, n);
        int32_t avail = loom__kv_available(&kv->groups[gi]);
        LOOM_RETURN_IF(need > avail, LOOM_ERR_CONTEXT_FULL,
                       "kv: sequence %d: group %d needs %d blocks, %d available", seq, gi, need,
                       avail);
        n_cow += cow_source(kv, seq, gi, n) >= 0;
    }
    LOOM_RETURN_IF(n_cow > copies_cap, LOOM_ERR_BUFFER_TOO_SMALL,
                   "kv: %d copies needed, room for %d", n_cow, copies_cap);

    const int32_t n_table = loom__kv_blocks_for(kv, (int64_t)s->n_pos + n);
    *n_copies = 0;
    for (int32_t gi = 0; gi < kv->n_groups; gi++) {
        loom__kv_group *g = &kv->groups[gi];
        int32_t *table = loom__kv_table(kv, gi, seq);
        int32_t src = cow_source(kv, seq, gi, n);
        if (src >= 0) {
            /* Pinned rather than kept referenced: a sharer reserving in this same step then
             * sees itself as the only owner and writes in place (no second copy), while the
             * pin keeps the source from being reused until commit or rollback. */
            int32_t dst = loom__kv_block_alloc(g);
            g->pin[src]++;
            int32_t fill = s->n_pos % kv->block_size;
            if (fill > g->pin_fill[src]) g->pin_fill[src] = fill;
            loom__kv_block_unref(g, src);
            table[s->n_pos / kv->block_size] = dst;
            loom__kv_seq_cow(kv, seq)[gi] = src;
            copies[(*n_copies)++] = (loom__kv_copy){.group = gi, .src = src, .dst = dst};
            g->cow_copies++;
        }
        for (int32_t i = s->n_table; i < n_table; i++) table[i] = loom__kv_block_alloc(g);
    }

    /* Hash the new tokens now (they are not kept); the hashes of blocks they complete wait in
     * the sequence's hash array until commit indexes them. */
    uint64_t *hash = loom__kv_seq_hash(kv, seq);
    uint64_t state = s->state;
    for (int32_t t = 0; t < n; t++) {
        state = loom__kv_hash_token(state, tokens[t]);
        int32_t pos = s->n_pos + t + 1;
        if (pos % kv->block_size == 0) {
            state = loom__kv_hash_finish(state);
            hash[pos / kv->block_size - 1] = state; /* the next block's chain starts here */
        }
    }
    s->res_state = state;
    s->n_res = n;
    s->n_table = n_table;
    s->reserved = true;
    return LOOM_OK;
}

loom_status loom__kv_commit(loom__kv *kv, int32_t seq) {
    LOOM_CHECK_ARG(kv != NULL);
    LOOM_TRY(loom__kv_seq_valid(kv, seq));
    loom__kv_seq *s = &kv->seqs[seq];
    LOOM_RETURN_IF(!s->reserved, LOOM_ERR_INVALID_ARG, "kv: sequence %d has nothing reserved", seq);
    s->n_pos += s->n_res;
    s->n_res = 0;
    s->state = s->res_state;
    s->reserved = false;
    const int32_t n_full = s->n_pos / kv->block_size;
    const uint64_t *hash = loom__kv_seq_hash(kv, seq);
    for (int32_t gi = 0; gi < kv->n_groups; gi++) {
        loom__kv_group *g = &kv->groups[gi];
        int32_t *table = loom__kv_table(kv, gi, seq);
        int32_t *cow = &loom__kv_seq_cow(kv, seq)[gi];
        if (*cow >= 0) loom__kv_block_unpin(g, *cow);
        *cow = -1;
        /* Now computed, completed blocks may serve other prompts. A duplicate of an indexed
         * block (computed twice) stays unindexed and is simply freed later. */
        if (kv->caching)
            for (int32_t i = s->idx_from; i < n_full; i++)
                if (table[i] >= 0 && !g->hashed[table[i]])
                    (void)loom__kv_index_insert(g, table[i], hash[i]);
        /* Entries no query at n_pos or later can see leave the window. */
        int32_t *lo = &loom__kv_seq_lo(kv, seq)[gi];
        int32_t new_lo = loom__kv_window_lo(kv, g->window, s->n_pos);
        for (; *lo < new_lo; (*lo)++) {
            loom__kv_block_unref(g, table[*lo]);
            table[*lo] = LOOM_KV_NO_BLOCK;
            g->window_releases++;
        }
    }
    s->idx_from = n_full;
    return LOOM_OK;
}

static void rollback_reservation(loom__kv *kv, int32_t seq) {
    loom__kv_seq *s = &kv->seqs[seq];
    const int32_t n_table = loom__kv_blocks_for(kv, s->n_pos);
    for (int32_t gi = 0; gi < kv->n_groups; gi++) {
        loom__kv_group *g = &kv->groups[gi];
        int32_t *table = loom__kv_table(kv, gi, seq);
        for (int32_t i = s->n_table - 1; i >= n_table; i--) {
            loom__kv_block_unref(g, table[i]);
            table[i] = LOOM_KV_NO_BLOCK;
        }
        int32_t *cow = &loom__kv_seq_cow(kv, seq)[gi];
        if (*cow >= 0) {
            int32_t i = s->n_pos / kv->block_size;
            int32_t dst = table[i];
            loom__kv_block_ref(g, *cow);
            loom__kv_block_unpin(g, *cow);
            table[i] = *cow;
            loom__kv_block_unref(g, dst);
            g->cow_copies--; /* the copy never took effect */
            *cow = -1;
        }
    }
    s->n_table = n_table;
    s->n_res = 0;
    s->reserved = false;
}

loom_status loom__kv_rollback(loom__kv *kv, int32_t seq) {
    LOOM_CHECK_ARG(kv != NULL);
    LOOM_TRY(loom__kv_seq_valid(kv, seq));
    LOOM_RETURN_IF(!kv->seqs[seq].reserved, LOOM_ERR_INVALID_ARG,
                   "kv: sequence %d has nothing reserved", seq);
    rollback_reservation(kv, seq);
    return LOOM_OK;
}
