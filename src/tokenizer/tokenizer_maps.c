/* tokenizer_maps.c — open-addressing hash tables for token lookup (see tokenizer_maps.h).
 * Both tables are sized to at most half full, so linear probing stays short, and both hash
 * under a random key of their own (core/hash.h): their keys come from the model file, and a
 * vocabulary or merge list written to collide must not make loading quadratic. */
#include "tokenizer/tokenizer_maps.h"

#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/hash.h"
#include "core/status.h"

static size_t table_size(size_t n) {
    size_t cap = 16;
    while (cap < 2 * n) cap *= 2;
    return cap;
}

/* ---- text -> id ------------------------------------------------------------------------------ */

loom_status loom__textmap_init(loom__textmap *m, const char *arena, const size_t *off, size_t n) {
    size_t cap = table_size(n);
    m->arena = arena;
    m->off = off;
    m->mask = cap - 1;
    m->key = loom__hash_key_random();
    m->slots = loom__malloc(cap * sizeof *m->slots);
    LOOM_RETURN_IF(!m->slots, LOOM_ERR_OUT_OF_MEMORY, "tokenizer: out of memory (%zu slots)", cap);
    memset(m->slots, 0xFF, cap * sizeof *m->slots); /* every slot -1 */
    return LOOM_OK;
}

void loom__textmap_free(loom__textmap *m) {
    free(m->slots);
    m->slots = NULL;
}

static int text_equal(const loom__textmap *m, int32_t id, const char *s, size_t len) {
    size_t a = m->off[id], b = m->off[id + 1];
    return b - a == len && memcmp(m->arena + a, s, len) == 0;
}

int32_t loom__textmap_add(loom__textmap *m, int32_t id) {
    const char *s = m->arena + m->off[id];
    size_t len = m->off[id + 1] - m->off[id];
    for (size_t i = loom__hash_keyed(s, len, &m->key) & m->mask;; i = (i + 1) & m->mask) {
        int32_t cur = m->slots[i];
        if (cur < 0) {
            m->slots[i] = id;
            return -1;
        }
        if (text_equal(m, cur, s, len)) return cur;
    }
}

int32_t loom__textmap_find(const loom__textmap *m, const char *s, size_t len) {
    for (size_t i = loom__hash_keyed(s, len, &m->key) & m->mask;; i = (i + 1) & m->mask) {
        int32_t cur = m->slots[i];
        if (cur < 0) return -1;
        if (text_equal(m, cur, s, len)) return cur;
    }
}

/* ---- (left, right) -> merge ------------------------------------------------------------------ */

loom_status loom__pairmap_init(loom__pairmap *m, size_t n) {
    size_t cap = table_size(n);
    m->mask = cap - 1;
    m->key = loom__hash_key_random();
    m->keys = loom__malloc(cap * sizeof *m->keys);
    m->vals = loom__malloc(cap * sizeof *m->vals);
    if (!m->keys || !m->vals) {
        loom__pairmap_free(m);
        return loom__fail(LOOM_ERR_OUT_OF_MEMORY, "tokenizer: out of memory (%zu merge slots)",
                          cap);
    }
    memset(m->keys, 0xFF, cap * sizeof *m->keys);
    return LOOM_OK;
}

void loom__pairmap_free(loom__pairmap *m) {
    free(m->keys);
    free(m->vals);
    m->keys = NULL;
    m->vals = NULL;
}

static uint64_t pair_key(int32_t left, int32_t right) {
    return ((uint64_t)(uint32_t)left << 32) | (uint32_t)right;
}

static size_t pair_slot(const loom__pairmap *m, uint64_t key) {
    return (size_t)loom__hash_keyed(&key, sizeof key, &m->key) & m->mask;
}

void loom__pairmap_add(loom__pairmap *m, int32_t left, int32_t right, loom__merge v) {
    uint64_t key = pair_key(left, right);
    for (size_t i = pair_slot(m, key);; i = (i + 1) & m->mask) {
        if (m->keys[i] == key) return;
        if (m->keys[i] == UINT64_MAX) {
            m->keys[i] = key;
            m->vals[i] = v;
            return;
        }
    }
}

const loom__merge *loom__pairmap_find(const loom__pairmap *m, int32_t left, int32_t right) {
    uint64_t key = pair_key(left, right);
    for (size_t i = pair_slot(m, key);; i = (i + 1) & m->mask) {
        if (m->keys[i] == key) return &m->vals[i];
        if (m->keys[i] == UINT64_MAX) return NULL;
    }
}
