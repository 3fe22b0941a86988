/* kv_query.c — the KV manager's read-only side: the descriptor's CSR arrays for a batch,
 * capacity queries for the scheduler, stats and per-sequence inspection. Nothing here changes
 * the manager or allocates. */
#include "kv/kv_internal.h"

#include <string.h>

#include "core/status.h"

/* ==== the descriptor ========================================================================== */

int64_t loom__kv_desc_block_cap(const loom__kv *kv, int32_t n_seqs) {
    if (!kv || n_seqs < 0) return 0;
    return (int64_t)n_seqs * kv->max_blocks;
}

loom_status loom__kv_fill_desc(const loom__kv *kv, int32_t group, int32_t n_seqs,
                               const int32_t *seqs, const int32_t *n_new, int32_t *indptr,
                               int32_t *block_ids, int64_t block_cap, int32_t *q_start,
                               int32_t *pos_start, int32_t *kv_len) {
    LOOM_CHECK_ARG(kv != NULL && indptr != NULL && n_seqs >= 0 && (seqs != NULL || n_seqs == 0));
    LOOM_RETURN_IF(group < 0 || group >= kv->n_groups, LOOM_ERR_INVALID_ARG,
                   "kv: group %d outside [0, %d)", group, kv->n_groups);
    /* Validate the whole batch before writing anything. */
    int64_t n_entries = 0, n_rows = 0;
    for (int32_t b = 0; b < n_seqs; b++) {
        LOOM_TRY(loom__kv_seq_valid(kv, seqs[b]));
        const loom__kv_seq *s = &kv->seqs[seqs[b]];
        LOOM_RETURN_IF(s->swapped, LOOM_ERR_INVALID_ARG, "kv: sequence %d is swapped out", seqs[b]);
        int32_t expect = s->reserved ? s->n_res : 0;
        LOOM_RETURN_IF(n_new && n_new[b] != expect, LOOM_ERR_INVALID_ARG,
                       "kv: sequence %d: %d new tokens in the batch, %d reserved", seqs[b],
                       n_new[b], expect);
        n_entries += s->n_table;
        n_rows += expect;
    }
    LOOM_RETURN_IF(n_rows > INT32_MAX || n_entries > INT32_MAX, LOOM_ERR_INVALID_ARG,
                   "kv: batch of %lld rows and %lld table entries is too large", (long long)n_rows,
                   (long long)n_entries);
    LOOM_RETURN_IF(n_entries > block_cap, LOOM_ERR_BUFFER_TOO_SMALL,
                   "kv: batch needs %lld table entries, room for %lld", (long long)n_entries,
                   (long long)block_cap);
    LOOM_RETURN_IF(block_ids == NULL && n_entries > 0, LOOM_ERR_INVALID_ARG,
                   "kv: block_ids is NULL");

    int32_t e = 0, q = 0;
    indptr[0] = 0;
    if (q_start) q_start[0] = 0;
    for (int32_t b = 0; b < n_seqs; b++) {
        const loom__kv_seq *s = &kv->seqs[seqs[b]];
        memcpy(block_ids + e, loom__kv_table(kv, group, seqs[b]),
               (size_t)s->n_table * sizeof *block_ids);
        e += s->n_table;
        q += s->n_res;
        indptr[b + 1] = e;
        if (q_start) q_start[b + 1] = q;
        if (pos_start) pos_start[b] = s->n_pos;
        if (kv_len) kv_len[b] = s->n_pos + s->n_res;
    }
    return LOOM_OK;
}

/* ==== capacity ================================================================================ */

int32_t loom__kv_n_groups(const loom__kv *kv) {
    return kv ? kv->n_groups : 0;
}
int32_t loom__kv_block_size(const loom__kv *kv) {
    return kv ? kv->block_size : 0;
}

int32_t loom__kv_blocks_available(const loom__kv *kv, int32_t group) {
    if (!kv || group < 0 || group >= kv->n_groups) return -1;
    return loom__kv_available(&kv->groups[group]);
}

loom_status loom__kv_seq_need(const loom__kv *kv, int32_t seq, int32_t n, int32_t *need) {
    LOOM_CHECK_ARG(kv != NULL && need != NULL && n >= 0);
    LOOM_TRY(loom__kv_seq_valid(kv, seq));
    const loom__kv_seq *s = &kv->seqs[seq];
    LOOM_RETURN_IF(s->reserved, LOOM_ERR_INVALID_ARG, "kv: sequence %d is reserved", seq);
    LOOM_RETURN_IF(n > kv->max_seq_len - s->n_pos, LOOM_ERR_CONTEXT_FULL,
                   "kv: sequence %d: %d + %d positions exceed max_seq_len %d", seq, s->n_pos, n,
                   kv->max_seq_len);
    for (int32_t g = 0; g < kv->n_groups; g++) {
        if (s->swapped) /* swap-in's blocks are fresh and exclusive: no copy-on-write after */
            need[g] = s->n_table - loom__kv_seq_lo(kv, seq)[g] +
                      loom__kv_blocks_for(kv, (int64_t)s->n_pos + n) - s->n_table;
        else
            need[g] = loom__kv_step_need(kv, seq, g, n);
    }
    return LOOM_OK;
}

loom_status loom__kv_admit_need(const loom__kv *kv, uint64_t cache_salt, const int32_t *prompt,
                                int32_t n_prompt, int32_t n_first, int32_t *need,
                                int32_t *n_cached) {
    LOOM_CHECK_ARG(kv != NULL && prompt != NULL && need != NULL && n_prompt >= 1 && n_first >= 0);
    LOOM_RETURN_IF(n_prompt > kv->max_seq_len, LOOM_ERR_CONTEXT_FULL,
                   "kv: prompt of %d tokens exceeds max_seq_len %d", n_prompt, kv->max_seq_len);
    int32_t reuse, take;
    loom__kv_prefix_match(kv, loom__kv_hash_root(kv->model_salt, cache_salt), prompt, n_prompt,
                          &reuse, &take);
    if (n_first > n_prompt - reuse) n_first = n_prompt - reuse;
    for (int32_t gi = 0; gi < kv->n_groups; gi++) {
        const loom__kv_group *g = &kv->groups[gi];
        int32_t n = 0;
        /* Reused blocks sitting in the LRU leave the free pool when revived. */
        for (int32_t i = loom__kv_window_lo(kv, g->window, reuse); i < take; i++)
            n += g->where[loom__kv_index_find(g, kv->scratch[i])] == LOOM__KV_CACHED;
        n += loom__kv_blocks_for(kv, (int64_t)reuse + n_first) - take;
        /* A partly reused last block is indexed, so writing its last slot copies it first. */
        if (n_first > 0 && reuse % kv->block_size != 0) n++;
        need[gi] = n;
    }
    if (n_cached) *n_cached = reuse;
    return LOOM_OK;
}

bool loom__kv_fits(const loom__kv *kv, const int32_t *need, bool keep_watermark) {
    if (!kv || !need) return false;
    for (int32_t gi = 0; gi < kv->n_groups; gi++) {
        const loom__kv_group *g = &kv->groups[gi];
        int32_t avail = loom__kv_available(g) - (keep_watermark ? g->watermark : 0);
        if (need[gi] > avail) return false;
    }
    return true;
}

/* ==== inspection ============================================================================== */

loom_status loom__kv_get_group_stats(const loom__kv *kv, int32_t group, loom__kv_group_stats *out) {
    LOOM_CHECK_ARG(kv != NULL && out != NULL);
    LOOM_RETURN_IF(group < 0 || group >= kv->n_groups, LOOM_ERR_INVALID_ARG,
                   "kv: group %d outside [0, %d)", group, kv->n_groups);
    const loom__kv_group *g = &kv->groups[group];
    memset(out, 0, sizeof *out);
    out->n_blocks = g->n_blocks;
    out->window = g->window;
    out->n_free = g->n_free;
    out->n_cached = g->n_cached;
    out->n_used = g->n_blocks - g->n_free - g->n_cached;
    out->watermark = g->watermark;
    out->evictions = g->evictions;
    out->cow_copies = g->cow_copies;
    out->window_releases = g->window_releases;
    out->swapped_out = g->swapped_out;
    out->swapped_in = g->swapped_in;
    return LOOM_OK;
}

/* Raises block b's fill for this pass to f (slots 0 .. f-1 computed), keeping *unused equal to
 * the sum of (block_size - fill) over the blocks seen so far. */
static void raise_fill(loom__kv_group *g, int32_t b, int32_t f, int32_t bs, int64_t *unused) {
    if (g->stamp[b] != g->pass) {
        g->stamp[b] = g->pass;
        g->fill[b] = f;
        *unused += bs - f;
    } else if (f > g->fill[b]) {
        *unused -= f - g->fill[b];
        g->fill[b] = f;
    }
}

loom_status loom__kv_unused_slots(loom__kv *kv, int32_t group, int64_t *out) {
    LOOM_CHECK_ARG(kv != NULL && out != NULL);
    LOOM_RETURN_IF(group < 0 || group >= kv->n_groups, LOOM_ERR_INVALID_ARG,
                   "kv: group %d outside [0, %d)", group, kv->n_groups);
    loom__kv_group *g = &kv->groups[group];
    if (++g->pass == 0) { /* the stamps wrapped: start them over */
        memset(g->stamp, 0, (size_t)g->n_blocks * sizeof *g->stamp);
        g->pass = 1;
    }
    const int32_t bs = kv->block_size;
    int64_t unused = 0;
    for (int32_t s = 0; s < kv->max_seqs; s++) {
        const loom__kv_seq *q = &kv->seqs[s];
        if (!q->live || q->swapped) continue;
        const int32_t *table = loom__kv_table(kv, group, s);
        for (int32_t i = loom__kv_seq_lo(kv, s)[group]; i < q->n_table; i++) {
            if (table[i] == LOOM_KV_NO_BLOCK) continue;
            const int64_t f = (int64_t)q->n_pos - (int64_t)i * bs;
            raise_fill(g, table[i], f < 0 ? 0 : f > bs ? bs : (int32_t)f, bs, &unused);
        }
        const int32_t src = loom__kv_seq_cow(kv, s)[group];
        if (src >= 0) raise_fill(g, src, g->pin_fill[src], bs, &unused);
    }
    *out = unused;
    return LOOM_OK;
}

loom_status loom__kv_get_stats(const loom__kv *kv, loom__kv_stats *out) {
    LOOM_CHECK_ARG(kv != NULL && out != NULL);
    memset(out, 0, sizeof *out);
    out->n_groups = kv->n_groups;
    out->n_seqs = kv->max_seqs - kv->n_free_seqs;
    for (int32_t i = 0; i < kv->max_seqs; i++)
        out->n_swapped += kv->seqs[i].live && kv->seqs[i].swapped;
    out->admissions = kv->admissions;
    out->prefix_query_tokens = kv->query_tokens;
    out->prefix_hit_tokens = kv->hit_tokens;
    out->swap_outs = kv->swap_outs;
    out->swap_ins = kv->swap_ins;
    for (int32_t gi = 0; gi < kv->n_groups; gi++) {
        out->evictions += kv->groups[gi].evictions;
        out->cow_copies += kv->groups[gi].cow_copies;
        out->window_releases += kv->groups[gi].window_releases;
    }
    return LOOM_OK;
}

loom_status loom__kv_seq_get_info(const loom__kv *kv, int32_t seq, loom__kv_seq_info *out) {
    LOOM_CHECK_ARG(kv != NULL && out != NULL);
    LOOM_TRY(loom__kv_seq_valid(kv, seq));
    const loom__kv_seq *s = &kv->seqs[seq];
    memset(out, 0, sizeof *out);
    out->n_pos = s->n_pos;
    out->n_reserved = s->n_res;
    out->reserved = s->reserved;
    out->swapped = s->swapped;
    out->n_cached = s->n_cached;
    out->n_table = s->n_table;
    for (int32_t g = 0; g < kv->n_groups; g++)
        out->n_held += s->n_table - loom__kv_seq_lo(kv, seq)[g];
    return LOOM_OK;
}

loom_status loom__kv_seq_table(const loom__kv *kv, int32_t seq, int32_t group,
                               const int32_t **table, int32_t *n) {
    LOOM_CHECK_ARG(kv != NULL && table != NULL && n != NULL);
    LOOM_TRY(loom__kv_seq_valid(kv, seq));
    LOOM_RETURN_IF(group < 0 || group >= kv->n_groups, LOOM_ERR_INVALID_ARG,
                   "kv: group %d outside [0, %d)", group, kv->n_groups);
    *table = loom__kv_table(kv, group, seq);
    *n = kv->seqs[seq].n_table;
    return LOOM_OK;
}

loom_status loom__kv_seq_exclusive_blocks(const loom__kv *kv, int32_t seq, int32_t group,
                                          int32_t *n) {
    const int32_t *table;
    int32_t n_table;
    LOOM_TRY(loom__kv_seq_table(kv, seq, group, &table, &n_table));
    const loom__kv_group *g = &kv->groups[group];
    int32_t k = 0;
    for (int32_t i = 0; i < n_table; i++)
        k += table[i] != LOOM_KV_NO_BLOCK && g->ref[table[i]] == 1;
    *n = k;
    return LOOM_OK;
}
