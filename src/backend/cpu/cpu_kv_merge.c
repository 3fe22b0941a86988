/* cpu_kv_merge.c — kv_store for the layers of merged pairs (loom_backend.h, LOOM_KV_MERGED).
 *
 * The earlier layer A of a pair stores each head row x as its direction x / ||x|| in its own
 * pools and ||x|| in the pair's merge block, row by row in parallel, like any store. The later
 * layer B stores its norms, then decides for each new position whether its token stays
 * unmerged: the block keeps its merge_retain most distant tokens (distance: the largest angle,
 * over heads, K and V, between A's stored direction and B's), B's direction in a retained row;
 * every other token's A row becomes the interpolated direction, which both layers then read
 * back scaled by their own norms. A token's decision reads the earlier slots of its block, so
 * B's store walks each sequence's positions in order; runs of positions in different blocks
 * are independent and go to different threads (the result does not depend on which).
 *
 * Why the most distant tokens are the ones kept: a merged token is restored as ||x|| e, whose
 * error ||x|| |e - x/||x||| grows with the angle between the token's two directions; keeping
 * the tokens of largest angle keeps the largest errors out. (MiniCache's text retains the
 * tokens of large angular distance for the same reason.) */
#include "backend/cpu/cpu_internal.h"

#include "core/status.h"
#include "tensor/fp16.h"
#include "tensor/kv_merge.h"
#include "tensor/types.h"

#include <math.h>
#include <stdint.h>
#include <string.h>

typedef struct merge_task {
    const loom_tensor *k, *v; /* [T, n_kv_heads*head_dim] f32 */
    const loom_kv_desc *kv;
    char *pool[2]; /* the pair's pools (A's): K, V */
    char *base;    /* the pair's merge pool */
    bool later;    /* storing layer B (else A) */
    float *const *scratch;
} merge_task;

/* Bytes of one element of the pages merged pairs use (F32, F16, BF16). */
static size_t elt_bytes(loom_type t) {
    return t == LOOM_TYPE_F32 ? 4 : 2;
}

static float widen(loom_type t, const char *p, int64_t i) {
    uint16_t h;
    switch (t) {
    case LOOM_TYPE_F32: {
        float x;
        memcpy(&x, p + 4 * i, 4);
        return x;
    }
    case LOOM_TYPE_BF16:
        memcpy(&h, p + 2 * i, 2);
        return loom__bf16_to_f32(h);
    default:
        memcpy(&h, p + 2 * i, 2);
        return loom__f16_to_f32(h);
    }
}

static double dot(const float *a, const float *b, int64_t n) {
    double s = 0.0;
    for (int64_t i = 0; i < n; i++) s += (double)a[i] * (double)b[i];
    return s;
}

/* dir = x / ||x|| (zeros for a zero row, NaN for a row with a NaN) and ||x||. */
static float to_direction(const float *x, float *dir, int64_t n) {
    const float norm = (float)sqrt(dot(x, x, n));
    for (int64_t i = 0; i < n; i++) dir[i] = norm == 0.0f ? 0.0f : x[i] / norm;
    return norm;
}

/* ---- one block's bookkeeping ------------------------------------------------------------- */

typedef struct merge_block {
    const loom_kv_desc *kv;
    char *base;       /* the block's merge block */
    char *page[2];    /* A's K and V rows of slot 0 of the block */
    float *norm;      /* [S][H][4] */
    float *dist;      /* [S] */
    int32_t *state;   /* [S] */
    char *rows;       /* [R][2][H][hd] */
    size_t row_bytes; /* one token's row of all heads */
} merge_block;

static merge_block block_at(const merge_task *t, int32_t s, int64_t p) {
    const loom_kv_desc *kv = t->kv;
    const int32_t id = kv->block_ids[kv->indptr[s] + p / kv->block_size];
    const int32_t S = kv->block_size, H = kv->n_kv_heads;
    merge_block b = {.kv = kv};
    b.base = t->base + (size_t)id * kv->merge_block_stride;
    b.page[0] = t->pool[0] + (size_t)id * kv->block_stride;
    b.page[1] = t->pool[1] + (size_t)id * kv->block_stride;
    b.norm = (float *)b.base;
    b.dist = (float *)(b.base + loom_kv_merge_dist_at(S, H));
    b.state = (int32_t *)(b.base + loom_kv_merge_state_at(S, H));
    b.rows = b.base + loom_kv_merge_rows_at(S, H);
    b.row_bytes = (size_t)H * (size_t)kv->head_dim * elt_bytes(kv->kv_type);
    return b;
}

/* A's stored row (kv_i 0: K, 1: V) of slot t, and retained row r's. */
static char *a_row(const merge_block *b, int kv_i, int32_t t) {
    return b->page[kv_i] + (size_t)t * b->kv->token_stride;
}
static char *kept_row(const merge_block *b, int kv_i, int32_t r) {
    return b->rows + ((size_t)r * 2 + (size_t)kv_i) * b->row_bytes;
}

/* Widens a stored row of every head into out [H*hd]. */
static void widen_row(const merge_block *b, const char *row, float *out) {
    const int64_t n = (int64_t)b->kv->n_kv_heads * b->kv->head_dim;
    for (int64_t i = 0; i < n; i++) out[i] = widen(b->kv->kv_type, row, i);
}

/* A's row of slot t (K and V) becomes the interpolation of a (A's directions) and bdir (B's),
 * head by head: da, db are [2][H*hd]; tmp [H*hd]. */
static void merge_into_a(const merge_block *b, int32_t t, const float *da, const float *db,
                         float *tmp) {
    const loom_kv_desc *kv = b->kv;
    const int64_t hd = kv->head_dim, n = (int64_t)kv->n_kv_heads * hd;
    for (int kv_i = 0; kv_i < 2; kv_i++) {
        const float *a = da + kv_i * n, *d = db + kv_i * n;
        for (int32_t h = 0; h < kv->n_kv_heads; h++) {
            const float *ah = a + h * hd, *bh = d + h * hd;
            float ca, cb;
            loom__merge_slerp(dot(ah, bh, hd), dot(ah, ah, hd), dot(bh, bh, hd), kv->merge_t, &ca,
                              &cb);
            for (int64_t i = 0; i < hd; i++) tmp[h * hd + i] = fmaf(ca, ah[i], cb * bh[i]);
        }
        loom__cpu_kv_put_row(kv, tmp, a_row(b, kv_i, t), NULL, n);
    }
}

/* The kept slot a newcomer would displace: the least distant among slots [0, t) holding a
 * retained row (an equal distance keeps the earlier slot, so the latest of the least goes);
 * -1 when fewer than R are kept, and *free_row then the lowest row none of them holds. (Not
 * simply the number kept: a slot stored a second time — the last block of a cached prompt,
 * a rolled-back step — finds the earlier slots as its first store's displacements left them.) */
static int32_t kept_victim(const merge_block *b, int32_t t, int32_t *free_row) {
    const int32_t R = b->kv->merge_retain;
    uint64_t used[LOOM_KV_MERGE_MAX_RETAIN / 64] = {0};
    int32_t n_kept = 0, victim = -1;
    for (int32_t j = 0; j < t; j++) {
        const int32_t r = b->state[j];
        if (r < 0 || r >= R || (used[r / 64] >> (r % 64) & 1)) continue; /* merged, or a dup */
        used[r / 64] |= (uint64_t)1 << (r % 64);
        n_kept++;
        if (victim < 0 || b->dist[j] <= b->dist[victim]) victim = j;
    }
    if (n_kept < R) {
        *free_row = 0;
        while (used[*free_row / 64] >> (*free_row % 64) & 1) (*free_row)++;
        return -1;
    }
    return victim;
}

/* ---- the stores -------------------------------------------------------------------------- */

/* Layer A: row r's directions into A's pools and its norms into slots [h][0..1]. */
static void store_a_row(const merge_task *t, int64_t r, float *tmp) {
    const loom_kv_desc *kv = t->kv;
    const int32_t s = loom__cpu_seq_of_row(kv, r);
    const int64_t p = (int64_t)kv->pos_start[s] + (r - kv->q_start[s]);
    const int32_t slot = (int32_t)(p % kv->block_size);
    const merge_block b = block_at(t, s, p);
    const int64_t hd = kv->head_dim, n = (int64_t)kv->n_kv_heads * hd;
    for (int kv_i = 0; kv_i < 2; kv_i++) {
        const float *x = loom__cpu_row(kv_i == 0 ? t->k : t->v, r);
        for (int32_t h = 0; h < kv->n_kv_heads; h++)
            b.norm[((size_t)slot * kv->n_kv_heads + h) * 4 + kv_i] =
                to_direction(x + h * hd, tmp + h * hd, hd);
        loom__cpu_kv_put_row(kv, tmp, a_row(&b, kv_i, slot), NULL, n);
    }
}

/* Layer B: row r (every earlier position of its block already stored). scratch: 9 rows of
 * H*hd floats. */
static void store_b_row(const merge_task *t, int64_t r, float *scratch) {
    const loom_kv_desc *kv = t->kv;
    const int32_t s = loom__cpu_seq_of_row(kv, r);
    const int64_t p = (int64_t)kv->pos_start[s] + (r - kv->q_start[s]);
    const int32_t slot = (int32_t)(p % kv->block_size), H = kv->n_kv_heads;
    const merge_block b = block_at(t, s, p);
    const int64_t hd = kv->head_dim, n = (int64_t)H * hd;
    float *db = scratch, *da = db + 2 * n, *va = da + 2 * n, *vb = va + 2 * n, *tmp = vb + 2 * n;
    float d = 0.0f;
    for (int kv_i = 0; kv_i < 2; kv_i++) {
        const float *x = loom__cpu_row(kv_i == 0 ? t->k : t->v, r);
        widen_row(&b, a_row(&b, kv_i, slot), da + kv_i * n);
        for (int32_t h = 0; h < H; h++) {
            const float *ah = da + kv_i * n + h * hd;
            float *bh = db + kv_i * n + h * hd;
            b.norm[((size_t)slot * H + h) * 4 + 2 + kv_i] = to_direction(x + h * hd, bh, hd);
            const float dh = loom__merge_dist(dot(ah, bh, hd), dot(ah, ah, hd), dot(bh, bh, hd));
            d = dh > d ? dh : d;
        }
    }
    b.dist[slot] = d;

    int32_t row = -1;
    if (kv->merge_retain > 0) {
        const int32_t victim = kept_victim(&b, slot, &row);
        if (victim >= 0 && d > b.dist[victim]) { /* the newcomer takes the victim's row */
            row = b.state[victim];
            for (int kv_i = 0; kv_i < 2; kv_i++) {
                widen_row(&b, a_row(&b, kv_i, victim), va + kv_i * n);
                widen_row(&b, kept_row(&b, kv_i, row), vb + kv_i * n);
            }
            merge_into_a(&b, victim, va, vb, tmp);
            b.state[victim] = -1;
        }
    }
    if (row >= 0) {
        for (int kv_i = 0; kv_i < 2; kv_i++)
            loom__cpu_kv_put_row(kv, db + kv_i * n, kept_row(&b, kv_i, row), NULL, n);
        b.state[slot] = row;
    } else {
        merge_into_a(&b, slot, da, db, tmp);
        b.state[slot] = -1;
    }
}

/* Whether row r starts a run: its sequence's first new row, or a position at a block's start. */
static bool run_start(const loom_kv_desc *kv, int64_t r) {
    const int32_t s = loom__cpu_seq_of_row(kv, r);
    const int64_t p = (int64_t)kv->pos_start[s] + (r - kv->q_start[s]);
    return r == kv->q_start[s] || p % kv->block_size == 0;
}

/* Thread ith of nth: the runs that start in its share of the rows, each walked to its end. */
static void merge_worker(void *arg, int ith, int nth) {
    const merge_task *t = arg;
    const loom_kv_desc *kv = t->kv;
    const int64_t n_rows = kv->q_start[kv->n_seqs];
    int64_t r0, r1;
    loom__split_range(n_rows, ith, nth, &r0, &r1);
    float *scratch = t->scratch[ith];
    if (!t->later) {
        for (int64_t r = r0; r < r1; r++) store_a_row(t, r, scratch);
        return;
    }
    int64_t r = r0;
    while (r < r1 && !run_start(kv, r)) r++;
    while (r < r1) {
        do store_b_row(t, r++, scratch);
        while (r < n_rows && !run_start(kv, r));
    }
}

size_t loom__cpu_kv_merge_scratch(int32_t n_kv_heads, int32_t head_dim) {
    return 9 * (size_t)n_kv_heads * (size_t)head_dim;
}

loom_status loom__cpu_kv_store_merged(loom__cpu_ctx *c, const loom_tensor *k, const loom_tensor *v,
                                      const loom_kv_desc *kv, int32_t layer, int32_t pool_layer,
                                      int64_t n_rows) {
    LOOM_RETURN_IF(kv->kv_type != LOOM_TYPE_F16 && kv->kv_type != LOOM_TYPE_BF16 &&
                       kv->kv_type != LOOM_TYPE_F32,
                   LOOM_ERR_UNSUPPORTED,
                   "kv_store: merged pairs over %s pages (cpu: f16, bf16, f32)",
                   loom__type_name(kv->kv_type));
    LOOM_TRY(
        loom__cpu_reserve_scratch(c, loom__cpu_kv_merge_scratch(kv->n_kv_heads, kv->head_dim)));
    merge_task t = {.k = k,
                    .v = v,
                    .kv = kv,
                    .pool = {kv->k_base[pool_layer], kv->v_base[pool_layer]},
                    .base = kv->merge_base[layer],
                    .later = loom__cpu_merge_role(kv, layer) == LOOM_CPU_MERGE_B,
                    .scratch = c->scratch};
    const int64_t elems = n_rows * kv->n_kv_heads * kv->head_dim;
    if (elems < 16384 || c->n_threads == 1)
        merge_worker(&t, 0, 1);
    else
        loom__threadpool_run(c->tp, merge_worker, &t);
    return LOOM_OK;
}
