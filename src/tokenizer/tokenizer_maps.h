/* tokenizer_maps.h — the tokenizer's lookup tables: token text -> id (open addressing over the
 * tokenizer's own text arena) and (left id, right id) -> BPE merge (rank, merged id). */
#pragma once

#include <stddef.h>
#include <stdint.h>

#include "core/hash.h"
#include "loom.h"

/* Token texts live in one arena: token i is arena[off[i] .. off[i+1]). */
typedef struct loom__textmap {
    const char *arena;
    const size_t *off;
    int32_t *slots; /* [mask+1]: token id, or -1 for an empty slot */
    size_t mask;
    loom__hash_key key; /* this table's random hash key */
} loom__textmap;

/* Sizes the table for n ids over (arena, off). LOOM_ERR_OUT_OF_MEMORY on failure. */
loom_status loom__textmap_init(loom__textmap *m, const char *arena, const size_t *off, size_t n);
void loom__textmap_free(loom__textmap *m);
/* Adds id; returns -1 when added, or the id already holding the same text (nothing added). */
int32_t loom__textmap_add(loom__textmap *m, int32_t id);
/* The id whose text is s[0..len), or -1. */
int32_t loom__textmap_find(const loom__textmap *m, const char *s, size_t len);

typedef struct loom__merge {
    int32_t rank;   /* position in tokenizer.ggml.merges: lower merges first */
    int32_t merged; /* id of the concatenated token */
} loom__merge;

typedef struct loom__pairmap {
    uint64_t *keys;    /* [mask+1]: (left << 32) | right, or UINT64_MAX for an empty slot */
    loom__merge *vals; /* [mask+1] */
    size_t mask;
    loom__hash_key key;
} loom__pairmap;

loom_status loom__pairmap_init(loom__pairmap *m, size_t n);
void loom__pairmap_free(loom__pairmap *m);
/* Adds (left, right) -> v unless the pair is already there (the first, lowest rank wins, as
 * llama.cpp keeps it). */
void loom__pairmap_add(loom__pairmap *m, int32_t left, int32_t right, loom__merge v);
/* The merge of (left, right), or NULL. */
const loom__merge *loom__pairmap_find(const loom__pairmap *m, int32_t left, int32_t right);
