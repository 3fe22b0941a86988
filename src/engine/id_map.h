/* id_map.h — an open-addressing map from 64-bit ids (never 0) to pointers, for the engine's
 * request tables. Grows by doubling; lookups are O(1) expected. Not thread-safe. */
#pragma once

#include <stdint.h>

#include "loom.h"

typedef struct loom__id_map {
    uint64_t *keys; /* 0: empty slot; UINT64_MAX: deleted */
    void **vals;
    uint32_t cap;   /* power of two */
    uint32_t count; /* live entries */
    uint32_t used;  /* live + deleted slots */
} loom__id_map;

loom_status loom__id_map_init(loom__id_map *m, uint32_t cap);
void loom__id_map_free(loom__id_map *m);
/* Inserts or replaces; may grow (OUT_OF_MEMORY leaves the map unchanged). */
loom_status loom__id_map_put(loom__id_map *m, uint64_t id, void *val);
void *loom__id_map_get(const loom__id_map *m, uint64_t id);
/* Removes id; returns its value or NULL when absent. */
void *loom__id_map_del(loom__id_map *m, uint64_t id);
