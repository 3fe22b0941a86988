/* tokenizer_heap.h — the priority queue of candidate merges shared by the SentencePiece and BPE
 * encoders: a binary min-heap ordered by (key, left), so ties go to the leftmost pair. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include "core/alloc.h"
#include "core/status.h"

typedef struct loom__merge_cand {
    double key;   /* SPM: -score (best score first); BPE: merge rank */
    int32_t left; /* symbol indices of the pair */
    int32_t right;
    int32_t merged; /* token id of the concatenation */
    uint32_t llen;  /* the symbols' byte lengths when queued: a pair whose symbols have */
    uint32_t rlen;  /*   changed since is stale and skipped */
} loom__merge_cand;

typedef struct loom__merge_heap {
    loom__merge_cand *v; /* [cap], grown on demand; the owner frees it */
    size_t n, cap;
} loom__merge_heap;

static inline bool loom__cand_before(const loom__merge_cand *a, const loom__merge_cand *b) {
    return a->key < b->key || (a->key == b->key && a->left < b->left);
}

static inline loom_status loom__heap_push(loom__merge_heap *h, loom__merge_cand c) {
    if (h->n == h->cap) {
        /* Stale candidates stay queued until popped, so the queue can outgrow the symbol
         * count (never beyond 3 entries per symbol: n-1 first pairs, two per merge). */
        size_t cap = h->cap ? 2 * h->cap : 64;
        loom__merge_cand *v = loom__realloc(h->v, cap * sizeof *v);
        LOOM_RETURN_IF(!v, LOOM_ERR_OUT_OF_MEMORY, "tokenize: out of memory (%zu candidates)", cap);
        h->v = v;
        h->cap = cap;
    }
    size_t i = h->n++;
    while (i > 0) {
        size_t parent = (i - 1) / 2;
        if (!loom__cand_before(&c, &h->v[parent])) break;
        h->v[i] = h->v[parent];
        i = parent;
    }
    h->v[i] = c;
    return LOOM_OK;
}

/* Removes and returns the first candidate; the heap must not be empty. */
static inline loom__merge_cand loom__heap_pop(loom__merge_heap *h) {
    loom__merge_cand top = h->v[0];
    loom__merge_cand last = h->v[--h->n];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= h->n) break;
        if (c + 1 < h->n && loom__cand_before(&h->v[c + 1], &h->v[c])) c++;
        if (!loom__cand_before(&h->v[c], &last)) break;
        h->v[i] = h->v[c];
        i = c;
    }
    if (h->n > 0) h->v[i] = last;
    return top;
}
