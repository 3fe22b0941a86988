/* sched_index.c — the scheduler's id → slot hash index: open addressing with linear probing,
 * kept at most half full, deletion by backward shift so churn leaves no tombstones behind. */
#include <stdlib.h>

#include "core/alloc.h"
#include "core/hash.h"
#include "core/status.h"
#include "sched/sched_internal.h"

/* Smallest power of two >= 2 * n_items (and >= 16), or 0 if that would overflow int32_t. */
static int32_t index_cap_for(int32_t n_items) {
    int64_t want = (int64_t)n_items * 2, cap = 16;
    while (cap < want) cap *= 2;
    return cap > INT32_MAX / 2 ? 0 : (int32_t)cap;
}

loom_status loom__sched_index_init(sched_index *ix, int32_t n_items) {
    int32_t cap = index_cap_for(n_items);
    LOOM_RETURN_IF(cap == 0, LOOM_ERR_OUT_OF_MEMORY, "sched: index for %d requests", n_items);
    uint64_t *keys = loom__malloc((size_t)cap * sizeof *keys);
    int32_t *vals = loom__malloc((size_t)cap * sizeof *vals);
    if (!keys || !vals) {
        free(keys);
        free(vals);
        return loom__fail(LOOM_ERR_OUT_OF_MEMORY, "sched: index of %d entries", cap);
    }
    for (int32_t i = 0; i < cap; i++) vals[i] = -1;
    ix->keys = keys;
    ix->vals = vals;
    ix->cap = cap;
    return LOOM_OK;
}

void loom__sched_index_free(sched_index *ix) {
    free(ix->keys);
    free(ix->vals);
    ix->keys = NULL;
    ix->vals = NULL;
    ix->cap = 0;
}

int32_t loom__sched_index_find(const sched_index *ix, uint64_t id) {
    uint32_t mask = (uint32_t)ix->cap - 1;
    for (uint32_t i = (uint32_t)loom__hash_mix64(id) & mask;; i = (i + 1) & mask) {
        if (ix->vals[i] < 0) return -1;
        if (ix->keys[i] == id) return ix->vals[i];
    }
}

void loom__sched_index_put(sched_index *ix, uint64_t id, int32_t slot) {
    uint32_t mask = (uint32_t)ix->cap - 1;
    uint32_t i = (uint32_t)loom__hash_mix64(id) & mask;
    while (ix->vals[i] >= 0) i = (i + 1) & mask;
    ix->keys[i] = id;
    ix->vals[i] = slot;
}

void loom__sched_index_del(sched_index *ix, uint64_t id) {
    uint32_t mask = (uint32_t)ix->cap - 1;
    uint32_t i = (uint32_t)loom__hash_mix64(id) & mask;
    while (ix->vals[i] >= 0 && ix->keys[i] != id) i = (i + 1) & mask;
    if (ix->vals[i] < 0) return;
    /* Backward shift: pull later members of the probe run into the hole when their home
     * position does not lie cyclically in (hole, j], so every lookup still finds them. */
    uint32_t hole = i;
    for (uint32_t j = (hole + 1) & mask; ix->vals[j] >= 0; j = (j + 1) & mask) {
        uint32_t home = (uint32_t)loom__hash_mix64(ix->keys[j]) & mask;
        bool stays = hole <= j ? (hole < home && home <= j) : (hole < home || home <= j);
        if (stays) continue;
        ix->keys[hole] = ix->keys[j];
        ix->vals[hole] = ix->vals[j];
        hole = j;
    }
    ix->vals[hole] = -1;
}

loom_status loom__sched_index_grow(sched_index *ix, int32_t n_items) {
    int32_t cap = index_cap_for(n_items);
    LOOM_RETURN_IF(cap == 0, LOOM_ERR_OUT_OF_MEMORY, "sched: index for %d requests", n_items);
    if (cap <= ix->cap) return LOOM_OK;
    sched_index grown;
    LOOM_TRY(loom__sched_index_init(&grown, n_items));
    for (int32_t i = 0; i < ix->cap; i++)
        if (ix->vals[i] >= 0) loom__sched_index_put(&grown, ix->keys[i], ix->vals[i]);
    loom__sched_index_free(ix);
    *ix = grown;
    return LOOM_OK;
}
