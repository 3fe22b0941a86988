/* id_map.c — see id_map.h. Linear probing over a power-of-two table with tombstones; the
 * table is rebuilt when live + deleted slots pass 70% so probes stay short. */
#include "engine/id_map.h"

#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/hash.h"
#include "core/status.h"

#define DELETED UINT64_MAX

static uint32_t slot_of(uint64_t id, uint32_t cap) {
    return (uint32_t)loom__hash_mix64(id) & (cap - 1);
}

loom_status loom__id_map_init(loom__id_map *m, uint32_t cap) {
    uint32_t c = 16;
    while (c < cap) c *= 2;
    memset(m, 0, sizeof *m);
    m->keys = loom__calloc(c, sizeof *m->keys);
    m->vals = loom__calloc(c, sizeof *m->vals);
    if (!m->keys || !m->vals) {
        loom__id_map_free(m);
        return loom__fail(LOOM_ERR_OUT_OF_MEMORY, "engine: out of memory");
    }
    m->cap = c;
    return LOOM_OK;
}

void loom__id_map_free(loom__id_map *m) {
    free(m->keys);
    free(m->vals);
    memset(m, 0, sizeof *m);
}

static loom_status rebuild(loom__id_map *m, uint32_t cap) {
    loom__id_map n;
    LOOM_TRY(loom__id_map_init(&n, cap));
    for (uint32_t i = 0; i < m->cap; i++) {
        uint64_t k = m->keys[i];
        if (k == 0 || k == DELETED) continue;
        uint32_t s = slot_of(k, n.cap);
        while (n.keys[s]) s = (s + 1) & (n.cap - 1);
        n.keys[s] = k;
        n.vals[s] = m->vals[i];
        n.count++;
        n.used++;
    }
    loom__id_map_free(m);
    *m = n;
    return LOOM_OK;
}

loom_status loom__id_map_put(loom__id_map *m, uint64_t id, void *val) {
    LOOM_RETURN_IF(id == 0 || id == DELETED, LOOM_ERR_INVALID_ARG, "id_map: reserved id");
    if ((m->used + 1) * 10 > m->cap * 7) {
        LOOM_TRY(rebuild(m, (m->count + 1) * 10 > m->cap * 3 ? m->cap * 2 : m->cap));
    }
    uint32_t s = slot_of(id, m->cap), tomb = UINT32_MAX;
    while (m->keys[s]) {
        if (m->keys[s] == id) {
            m->vals[s] = val;
            return LOOM_OK;
        }
        if (m->keys[s] == DELETED && tomb == UINT32_MAX) tomb = s;
        s = (s + 1) & (m->cap - 1);
    }
    if (tomb != UINT32_MAX) {
        s = tomb;
    } else {
        m->used++;
    }
    m->keys[s] = id;
    m->vals[s] = val;
    m->count++;
    return LOOM_OK;
}

static uint32_t find(const loom__id_map *m, uint64_t id) {
    if (id == 0 || id == DELETED || m->cap == 0) return UINT32_MAX;
    uint32_t s = slot_of(id, m->cap);
    while (m->keys[s]) {
        if (m->keys[s] == id) return s;
        s = (s + 1) & (m->cap - 1);
    }
    return UINT32_MAX;
}

void *loom__id_map_get(const loom__id_map *m, uint64_t id) {
    uint32_t s = find(m, id);
    return s == UINT32_MAX ? NULL : m->vals[s];
}

void *loom__id_map_del(loom__id_map *m, uint64_t id) {
    uint32_t s = find(m, id);
    if (s == UINT32_MAX) return NULL;
    void *v = m->vals[s];
    m->keys[s] = DELETED;
    m->vals[s] = NULL;
    m->count--;
    return v;
}
