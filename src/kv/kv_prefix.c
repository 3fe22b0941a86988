/* kv_prefix.c — prefix caching: the chained 64-bit block hashes, each group's hash index
 * (open addressing) and the admission match that finds the longest reusable prefix. */
#include "kv/kv_internal.h"

#include "core/hash.h"

#include <string.h>

/* ==== hashing ================================================================================= */

uint64_t loom__kv_hash_root(uint64_t model_salt, uint64_t cache_salt) {
    /* Nested so that (model, cache) salts never commute, and bijective in each for the other
     * fixed: different cache salts always give different roots. */
    return loom__hash_mix64(loom__hash_mix64(model_salt ^ 0x6b76726f6f744d53ULL) ^ cache_salt ^
                            0x9e3779b97f4a7c15ULL);
}

uint64_t loom__kv_hash_token(uint64_t state, int32_t token) {
    /* For a fixed state, distinct tokens give distinct states (xor then a bijection). */
    uint64_t t = (uint64_t)(uint32_t)token * 0x9e3779b97f4a7c15ULL + 0x2545f4914f6cdd1dULL;
    return loom__hash_mix64(state ^ t);
}

uint64_t loom__kv_hash_finish(uint64_t state) {
    /* Marks the block boundary, so a block's hash differs from its last token's state. */
    return loom__hash_mix64(state ^ 0xb10cb10cb10cb10cULL);
}

/* ==== the index =============================================================================== */

static uint64_t home_slot(const loom__kv_group *g, uint64_t hash) {
    return hash & g->slot_mask;
}

int32_t loom__kv_index_find(const loom__kv_group *g, uint64_t hash) {
    /* Terminates: the load is at most 1/2, so an empty slot always lies ahead. */
    for (uint64_t i = home_slot(g, hash);; i = (i + 1) & g->slot_mask) {
        int32_t b = g->slots[i];
        if (b < 0) return -1;
        if (g->hash[b] == hash) return b;
    }
}

bool loom__kv_index_insert(loom__kv_group *g, int32_t b, uint64_t hash) {
    uint64_t i = home_slot(g, hash);
    for (; g->slots[i] >= 0; i = (i + 1) & g->slot_mask)
        if (g->hash[g->slots[i]] == hash) return false; /* an equal block is cached already */
    g->slots[i] = b;
    g->hash[b] = hash;
    g->hashed[b] = 1;
    g->n_indexed++;
    return true;
}

void loom__kv_index_remove(loom__kv_group *g, int32_t b) {
    uint64_t i = home_slot(g, g->hash[b]);
    while (g->slots[i] != b) i = (i + 1) & g->slot_mask;
    /* Backward-shift deletion: pull later members of the probe run into the hole unless their
     * home lies cyclically in (hole, j], so every key stays reachable without tombstones. */
    for (uint64_t j = i;;) {
        j = (j + 1) & g->slot_mask;
        int32_t m = g->slots[j];
        if (m < 0) break;
        uint64_t k = home_slot(g, g->hash[m]);
        bool stays = i <= j ? (i < k && k <= j) : (i < k || k <= j);
        if (stays) continue;
        g->slots[i] = m;
        i = j;
    }
    g->slots[i] = -1;
    g->hashed[b] = 0;
    g->n_indexed--;
}

/* ==== the admission match ===================================================================== */

/* Whether every window group holds the blocks the first query at L reads: entries
 * [lo(L), take) with hashes h[]. */
static bool window_groups_hit(const loom__kv *kv, const uint64_t *h, int32_t reuse, int32_t take) {
    for (int32_t gi = 0; gi < kv->n_groups; gi++) {
        const loom__kv_group *g = &kv->groups[gi];
        if (g->window == 0) continue;
        for (int32_t i = loom__kv_window_lo(kv, g->window, reuse); i < take; i++)
            if (loom__kv_index_find(g, h[i]) < 0) return false;
    }
    return true;
}

void loom__kv_prefix_match(const loom__kv *kv, uint64_t root, const int32_t *prompt,
                           int32_t n_prompt, int32_t *n_reuse, int32_t *n_take) {
    const int32_t bs = kv->block_size;
    const int32_t n_full = n_prompt / bs;
    *n_reuse = 0;
    *n_take = 0;
    if (!kv->caching || n_full == 0) return;

    uint64_t *h = kv->scratch; /* scratch is the manager's, writable even through const */
    uint64_t state = root;
    for (int32_t i = 0; i < n_full; i++) {
        for (int32_t t = 0; t < bs; t++) state = loom__kv_hash_token(state, prompt[i * bs + t]);
        h[i] = state = loom__kv_hash_finish(state);
    }

    /* Full-attention groups need every block of the prefix: the longest run present in all. */
    int32_t k_max = n_full;
    for (int32_t gi = 0; gi < kv->n_groups; gi++) {
        const loom__kv_group *g = &kv->groups[gi];
        if (g->window != 0) continue;
        int32_t k = 0;
        while (k < k_max && loom__kv_index_find(g, h[k]) >= 0) k++;
        k_max = k;
    }
    /* Window groups need only the blocks near the end of the prefix, so a shorter prefix may
     * hit where a longer one misses: take the longest k that satisfies them all. */
    for (int32_t k = k_max; k > 0; k--) {
        /* The whole prompt cached: reuse all but its last token (recomputed for its logits). */
        int32_t reuse = (int64_t)k * bs == n_prompt ? n_prompt - 1 : k * bs;
        int32_t take = loom__kv_blocks_for(kv, reuse);
        if (window_groups_hit(kv, h, reuse, take)) {
            *n_reuse = reuse;
            *n_take = take;
            return;
        }
    }
}
