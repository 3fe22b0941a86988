/* cpu_attention_tile.h — the kernels of CPU attention for one tile of positions: widening a
 * tile of K and V to float once, and advancing the online softmax of a few query vectors over
 * it (cpu_attention_tile.c). The driver, cpu_attention.c, decides which rows and heads share a
 * tile.
 *
 * A tile is ATTN_TILE consecutive positions starting at a multiple of ATTN_TILE; lane i of the
 * tile is position j0 + i. Tiles are aligned in position space, not to any row or batch, so a
 * query row meets the same tiles whatever else is computed with it. */
#pragma once

#include "loom_backend.h"

#include <stdint.h>

#define ATTN_TILE   64 /* positions per tile; a multiple of 16 (the widest lanes) */
#define ATTN_QBLOCK 8  /* query vectors advanced together (they share the K and V loads) */
/* Positions per segment: a query vector's softmax runs separately over each segment it meets
 * (segments start at multiples of ATTN_SEG in position space, like the tiles), and the
 * segments' states are then merged in order. So the segments of one vector may be computed on
 * different threads (long-context decode) and give the same bits as one thread walking them. */
#define ATTN_SEG (4 * ATTN_TILE)

/* Where one sequence's K and V rows of one kv head live. */
typedef struct attn_kv_src {
    const loom_kv_desc *kv;
    const char *k_pool, *v_pool;   /* the layer's pools: [n_blocks][block_size][n_kv][hd] */
    const char *k_scale, *v_scale; /* FP8: the pools' per-(position, head) scales; else NULL */
    int32_t seq, kvh;
    /* A layer of a merged pair (loom_backend.h): its pair's merge pool, and 1 for the earlier
     * layer, 2 for the later (rows are directions, read times the layer's norms; the later
     * layer reads a retained row where its token has one); merge_role 0: not merged. */
    const char *merge;
    int merge_role;
} attn_kv_src;

/* One tile of K and V as float32, positions j0 + [ia, ib] loaded (the rest of the tile is
 * neither read from the pool nor used). */
typedef struct attn_kv_tile {
    int64_t j0;
    int ia, ib;
    float *kt;   /* [ATTN_TILE / LW_N][head_dim][LW_N]: K transposed by groups of positions */
    float *vbuf; /* [ATTN_TILE][head_dim]: widened V rows (pools other than F32) */
    const float *v[ATTN_TILE]; /* V row of lane i: into the pool (F32) or vbuf (others) */
} attn_kv_tile;

/* Softmax state of one query vector (one row, one head): running max m, running sum l, and
 * acc[head_dim], the running sum of weight * V. */
typedef struct attn_qvec {
    const float *q; /* [head_dim] */
    float *acc;     /* [head_dim] */
    float m, l;
    int ia, ib; /* lanes of the current tile it attends to; ia > ib: none */
} attn_qvec;

/* Scratch floats for the tile (kt and vbuf) and for one block's scores. */
static inline int64_t loom__attn_tile_floats(int64_t head_dim) {
    return 2 * ATTN_TILE * head_dim + ATTN_QBLOCK * ATTN_TILE;
}

/* Fills t (whose kt and vbuf point at scratch) with positions j0 + [ia, ib] of src. */
void loom__attn_tile_load(attn_kv_tile *t, const attn_kv_src *src, int64_t j0, int ia, int ib);

/* Asks for the K and V rows of positions j0 + [ia, ib] of src to be brought into L2 (hints
 * only: nothing is read or written), so that loading that tile next does not wait for memory
 * row by row. */
void loom__attn_tile_prefetch(const attn_kv_src *src, int64_t j0, int ia, int ib);

/* Packs the q rows of n <= ATTN_QBLOCK vectors as qt[head_dim][ATTN_QBLOCK] (zero past n):
 * the score kernel then broadcasts every query's element d from one place. */
void loom__attn_pack_q(const attn_qvec *qv, int n, int64_t head_dim, float *qt);

/* Advances n <= ATTN_QBLOCK query vectors (their q packed in qt) over tile t: each one's
 * scores for its lanes [ia, ib] (scale * q.k, soft-capped when softcap > 0), then its m, l
 * and acc. scores: [ATTN_QBLOCK][ATTN_TILE] scratch. */
void loom__attn_tile_advance(const attn_kv_tile *t, int64_t head_dim, float scale, float softcap,
                             attn_qvec *qv, int n, const float *qt, float *scores);

/* Merges the softmax state of the positions after a segment boundary (mb, lb, accb) into the
 * state of the positions before it (*m, *l, acc), in place: with M = max(m, mb),
 * l = l e^(m-M) + lb e^(mb-M) and acc = acc e^(m-M) + accb e^(mb-M) (one of the two factors
 * is 1; a state with m = -inf holds no positions and is the identity). Every segment of a
 * vector goes through this one function in position order, whichever thread computed it. */
void loom__attn_state_merge(float *m, float *l, float *acc, float mb, float lb, const float *accb,
                            int64_t head_dim);
