/* kv_blocks.c — one KV group's block pool: reference counts and copy-on-write pins, the free
 * stack of empty blocks and the LRU list of evictable cached blocks.
 *
 * A block with no reference and no pin is parked: on the free stack if it holds nothing worth
 * keeping, on the LRU tail if it is indexed by the prefix cache. Allocation prefers the free
 * stack so that cached prefixes survive as long as memory allows; only then does it evict the
 * LRU head (least recently released). */
#include "kv/kv_internal.h"

#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/checked.h"
#include "core/status.h"

/* ==== creation ================================================================================ */

static void *kv_calloc(size_t n, size_t elt, bool *ok) {
    size_t bytes;
    if (loom__mul_overflow_size(n, elt, &bytes)) {
        *ok = false;
        return NULL;
    }
    void *p = loom__calloc(bytes ? bytes : 1, 1);
    if (!p) *ok = false;
    return p;
}

loom_status loom__kv_group_init(loom__kv_group *g, int32_t n_blocks, int32_t window,
                                float watermark, int32_t max_seqs, int32_t max_blocks) {
    memset(g, 0, sizeof *g);
    g->n_blocks = n_blocks;
    g->window = window;
    /* Rounded down (with slack for the float's representation error: 0.05f * 100 is 5), but
     * any non-zero fraction keeps at least one block. */
    g->watermark = (int32_t)((double)watermark * (double)n_blocks + 1e-4);
    if (g->watermark == 0 && watermark > 0.0f) g->watermark = 1;

    /* Index capacity: the smallest power of two >= 2 * n_blocks keeps probes short. */
    uint64_t n_slots = 2;
    while (n_slots < 2 * (uint64_t)n_blocks) n_slots *= 2;
    g->slot_mask = n_slots - 1;

    bool ok = true;
    size_t nb = (size_t)n_blocks;
    g->ref = kv_calloc(nb, sizeof *g->ref, &ok);
    g->pin = kv_calloc(nb, sizeof *g->pin, &ok);
    g->pin_fill = kv_calloc(nb, sizeof *g->pin_fill, &ok);
    g->where = kv_calloc(nb, sizeof *g->where, &ok);
    g->hashed = kv_calloc(nb, sizeof *g->hashed, &ok);
    g->hash = kv_calloc(nb, sizeof *g->hash, &ok);
    g->prev = kv_calloc(nb, sizeof *g->prev, &ok);
    g->next = kv_calloc(nb, sizeof *g->next, &ok);
    g->free_ids = kv_calloc(nb, sizeof *g->free_ids, &ok);
    g->fill = kv_calloc(nb, sizeof *g->fill, &ok);
    g->stamp = kv_calloc(nb, sizeof *g->stamp, &ok);
    g->slots = kv_calloc((size_t)n_slots, sizeof *g->slots, &ok);
    size_t n_entries = 0;
    if (loom__mul_overflow_size((size_t)max_seqs, (size_t)max_blocks, &n_entries)) ok = false;
    g->tables = kv_calloc(n_entries, sizeof *g->tables, &ok);
    if (!ok) {
        loom__kv_group_free(g);
        return loom__fail(LOOM_ERR_OUT_OF_MEMORY,
                          "kv: cannot allocate a group of %d blocks for %d sequences of %d "
                          "blocks",
                          n_blocks, max_seqs, max_blocks);
    }
    for (uint64_t i = 0; i < n_slots; i++) g->slots[i] = -1;
    for (size_t i = 0; i < n_entries; i++) g->tables[i] = LOOM_KV_NO_BLOCK;
    /* Lowest ids on top, so a fresh manager hands out 0, 1, 2, ... (readable tests). */
    for (int32_t i = 0; i < n_blocks; i++) {
        g->free_ids[i] = n_blocks - 1 - i;
        g->prev[i] = g->next[i] = -1;
        g->where[i] = LOOM__KV_FREE;
    }
    g->n_free = n_blocks;
    g->lru_head = g->lru_tail = -1;
    return LOOM_OK;
}

void loom__kv_group_free(loom__kv_group *g) {
    free(g->ref);
    free(g->pin);
    free(g->pin_fill);
    free(g->where);
    free(g->hashed);
    free(g->hash);
    free(g->prev);
    free(g->next);
    free(g->free_ids);
    free(g->fill);
    free(g->stamp);
    free(g->slots);
    free(g->tables);
    memset(g, 0, sizeof *g);
}

/* ==== the LRU list ============================================================================ */

static void lru_push_tail(loom__kv_group *g, int32_t b) {
    g->prev[b] = g->lru_tail;
    g->next[b] = -1;
    if (g->lru_tail >= 0)
        g->next[g->lru_tail] = b;
    else
        g->lru_head = b;
    g->lru_tail = b;
    g->n_cached++;
}

static void lru_unlink(loom__kv_group *g, int32_t b) {
    if (g->prev[b] >= 0)
        g->next[g->prev[b]] = g->next[b];
    else
        g->lru_head = g->next[b];
    if (g->next[b] >= 0)
        g->prev[g->next[b]] = g->prev[b];
    else
        g->lru_tail = g->prev[b];
    g->prev[b] = g->next[b] = -1;
    g->n_cached--;
}

/* ==== references ============================================================================== */

/* The block lost its last reference and pin: keep it cached if indexed, else free it. */
static void park(loom__kv_group *g, int32_t b) {
    if (g->hashed[b]) {
        g->where[b] = LOOM__KV_CACHED;
        lru_push_tail(g, b);
    } else {
        g->where[b] = LOOM__KV_FREE;
        g->free_ids[g->n_free++] = b;
    }
}

int32_t loom__kv_block_alloc(loom__kv_group *g) {
    int32_t b;
    if (g->n_free > 0) {
        b = g->free_ids[--g->n_free];
    } else {
        /* Evict: the block's old contents stop being a cache entry. */
        b = g->lru_head;
        lru_unlink(g, b);
        loom__kv_index_remove(g, b);
        g->evictions++;
    }
    g->where[b] = LOOM__KV_OWNED;
    g->ref[b] = 1;
    return b;
}

void loom__kv_block_ref(loom__kv_group *g, int32_t b) {
    if (g->where[b] == LOOM__KV_CACHED) lru_unlink(g, b);
    g->where[b] = LOOM__KV_OWNED;
    g->ref[b]++;
}

void loom__kv_block_unref(loom__kv_group *g, int32_t b) {
    if (--g->ref[b] == 0 && g->pin[b] == 0) park(g, b);
}

void loom__kv_block_unpin(loom__kv_group *g, int32_t b) {
    if (--g->pin[b] > 0) return;
    g->pin_fill[b] = 0;
    if (g->ref[b] == 0) park(g, b);
}
