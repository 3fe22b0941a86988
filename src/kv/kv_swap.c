/* kv_swap.c — preemption by swapping: swap_out lists a sequence's blocks for the engine to copy
 * to host memory and releases them; swap_in allocates fresh blocks for the same table entries.
 * The sequence's logical state (positions, hashes, table shape, window start) never changes. */
#include "kv/kv_internal.h"

#include "core/status.h"

/* Table entries the sequence holds (resident) or will hold again (swapped out), all groups. */
static int32_t held_blocks(const loom__kv *kv, int32_t seq) {
    int32_t n = 0;
    for (int32_t g = 0; g < kv->n_groups; g++)
        n += kv->seqs[seq].n_table - loom__kv_seq_lo(kv, seq)[g];
    return n;
}

loom_status loom__kv_swap_out(loom__kv *kv, int32_t seq, int32_t *blocks, int32_t cap,
                              int32_t *offsets) {
    LOOM_CHECK_ARG(kv != NULL && offsets != NULL && (blocks != NULL || cap == 0));
    LOOM_TRY(loom__kv_seq_valid(kv, seq));
    loom__kv_seq *s = &kv->seqs[seq];
    LOOM_RETURN_IF(s->swapped || s->reserved, LOOM_ERR_INVALID_ARG,
                   "kv: cannot swap out sequence %d while it is %s", seq,
                   s->swapped ? "swapped out" : "reserved");
    int32_t held = held_blocks(kv, seq);
    LOOM_RETURN_IF(held > cap, LOOM_ERR_BUFFER_TOO_SMALL,
                   "kv: sequence %d holds %d blocks, room for %d", seq, held, cap);

    int32_t k = 0;
    for (int32_t gi = 0; gi < kv->n_groups; gi++) {
        loom__kv_group *g = &kv->groups[gi];
        int32_t *table = loom__kv_table(kv, gi, seq);
        const int32_t lo = loom__kv_seq_lo(kv, seq)[gi];
        offsets[gi] = k;
        for (int32_t i = lo; i < s->n_table; i++) blocks[k++] = table[i];
        /* Released last-first, as loom__kv_seq_free does, for the same LRU reason. The blocks
         * keep their contents until something allocates, which is after the engine's copies. */
        for (int32_t i = s->n_table - 1; i >= lo; i--) {
            loom__kv_block_unref(g, table[i]);
            table[i] = LOOM_KV_NO_BLOCK;
        }
        g->swapped_out += s->n_table - lo;
    }
    offsets[kv->n_groups] = k;
    s->swapped = true;
    kv->swap_outs++;
    return LOOM_OK;
}

loom_status loom__kv_swap_in(loom__kv *kv, int32_t seq, int32_t *blocks, int32_t cap,
                             int32_t *offsets) {
    LOOM_CHECK_ARG(kv != NULL && offsets != NULL && (blocks != NULL || cap == 0));
    LOOM_TRY(loom__kv_seq_valid(kv, seq));
    loom__kv_seq *s = &kv->seqs[seq];
    LOOM_RETURN_IF(!s->swapped, LOOM_ERR_INVALID_ARG, "kv: sequence %d is not swapped out", seq);
    int32_t held = held_blocks(kv, seq);
    LOOM_RETURN_IF(held > cap, LOOM_ERR_BUFFER_TOO_SMALL,
                   "kv: sequence %d needs %d blocks listed, room for %d", seq, held, cap);
    for (int32_t gi = 0; gi < kv->n_groups; gi++) {
        int32_t need = s->n_table - loom__kv_seq_lo(kv, seq)[gi];
        int32_t avail = loom__kv_available(&kv->groups[gi]);
        LOOM_RETURN_IF(need > avail, LOOM_ERR_CONTEXT_FULL,
                       "kv: swapping in sequence %d: group %d needs %d blocks, %d available", seq,
                       gi, need, avail);
    }

    int32_t k = 0;
    for (int32_t gi = 0; gi < kv->n_groups; gi++) {
        loom__kv_group *g = &kv->groups[gi];
        int32_t *table = loom__kv_table(kv, gi, seq);
        offsets[gi] = k;
        for (int32_t i = loom__kv_seq_lo(kv, seq)[gi]; i < s->n_table; i++)
            blocks[k++] = table[i] = loom__kv_block_alloc(g);
        g->swapped_in += s->n_table - loom__kv_seq_lo(kv, seq)[gi];
    }
    offsets[kv->n_groups] = k;
    s->swapped = false;
    /* The fresh blocks hold garbage until the engine's copies run; they are indexed at the next
     * commit, which proves a forward (and so the copies before it) succeeded. */
    s->idx_from = 0;
    kv->swap_ins++;
    return LOOM_OK;
}
