/* cpu_attention.c — causal (optionally windowed, soft-capped) attention over the paged KV.
 *
 * One work item is one row and the query heads of one kv head (or one query head, when that
 * would leave too few items to share among the threads): row r of sequence s sits at position
 * p = pos_start[s] + (r - q_start[s]) and attends to positions lo..p, lo = max(0, p-window+1)
 * (window 0: lo = 0), reading K and V of kv head h / (n_head / n_kv_heads) through the
 * sequence's block table. Nothing past p is read, so nothing past kv_len[s] either.
 *
 * Softmax is online and single-pass: positions are visited in order, in tiles of ATTN_TILE
 * starting at lo. A tile's scores (scale * q·k, then cap * tanh(score / cap) when softcap is
 * on) go to scratch; if the tile raises the running maximum m, the running sum l and the
 * accumulator are rescaled by exp(m_old - m_new) once; then each position adds
 * w = exp(score - m) to l and w * v to the accumulator. The output is acc / l. Everything is
 * float32; F16 K/V rows are widened to float first (exactly).
 *
 * The arithmetic for an item depends only on q's row, the sequence's K/V, p and lo — never on
 * the other rows or sequences in the batch, nor on which thread runs it — so a sequence's
 * output is bitwise the same alone or batched. Items are handed out through an atomic counter
 * because their costs differ (later positions see more keys). */
#include "backend/cpu/cpu_internal.h"
#include "backend/cpu/cpu_vec.h"

#include "core/status.h"
#include "tensor/types.h"

#include <math.h>
#include <stdatomic.h>
#include <stdint.h>

/* Positions whose scores are held at once (scratch) between rescalings. */
#define ATTN_TILE 64

typedef struct attn_task {
    loom_cpu_ctx *c;
    const loom_tensor *q; /* [T, n_head*head_dim] f32 */
    loom_tensor *out;     /* [T, n_head*head_dim] f32 */
    const loom_kv_desc *kv;
    const loom_attn_params *p;
    const char *k_pool; /* [n_blocks][block_size][n_kv_heads][head_dim] of kv_type */
    const char *v_pool;
    int32_t group;     /* query heads per kv head */
    int32_t share;     /* query heads per work item: group, or 1 when items would be too few */
    int64_t n_items;   /* T * n_head / share */
    atomic_llong next; /* next unclaimed item */
} attn_task;

/* K or V row of kv head kvh at position j of sequence s, as float32 (in place for F32, else
 * widened into buf). */
static const float *attn_kv_row(const attn_task *t, const char *pool, int32_t s, int64_t j,
                                int32_t kvh, float *buf) {
    const loom_kv_desc *kv = t->kv;
    const char *src = pool + loom__cpu_kv_slot(kv, s, j);
    if (kv->kv_type == LOOM_TYPE_F32) return (const float *)src + (int64_t)kvh * kv->head_dim;
    loom__cpu_f16_to_f32_row((const uint16_t *)src + (int64_t)kvh * kv->head_dim, buf,
                             kv->head_dim);
    return buf;
}

/* Up to this many query heads share one pass over their kv head's K and V rows. */
#define ATTN_MAX_SHARE 16

/* Query heads h0 .. h0+nh-1 (all of one kv head) of row r. Each head has its own running max,
 * sum, scores and accumulator and sees exactly the operations it would see alone; the heads
 * only share the widening of each K and V row, which is exact. */
static void attn_heads(const attn_task *t, int64_t r, int32_t h0, int32_t nh, float *scratch) {
    const loom_kv_desc *kv = t->kv;
    const loom_attn_params *p = t->p;
    const int64_t hd = kv->head_dim;
    const int32_t kvh = h0 / t->group;
    const int32_t s = loom__cpu_seq_of_row(kv, r);
    const int64_t pos = (int64_t)kv->pos_start[s] + (r - kv->q_start[s]);
    const int64_t lo = p->window > 0 && pos - p->window + 1 > 0 ? pos - p->window + 1 : 0;

    float *kbuf = scratch;  /* [hd] widened K row */
    float *vbuf = kbuf + hd; /* [hd] widened V row */
    float *base = vbuf + hd; /* per head: scores [ATTN_TILE], then acc [hd] */
    float m[ATTN_MAX_SHARE], l[ATTN_MAX_SHARE];
    const float *q[ATTN_MAX_SHARE];
    for (int32_t g = 0; g < nh; g++) {
        float *acc = base + (size_t)g * (ATTN_TILE + hd) + ATTN_TILE;
        for (int64_t d = 0; d < hd; d++) acc[d] = 0.0f;
        m[g] = -INFINITY;
        l[g] = 0.0f;
        q[g] = (const float *)loom__cpu_row(t->q, r) + (int64_t)(h0 + g) * hd;
    }
    for (int64_t j0 = lo; j0 <= pos; j0 += ATTN_TILE) {
        const int64_t n = pos + 1 - j0 < ATTN_TILE ? pos + 1 - j0 : ATTN_TILE;
        for (int64_t j = 0; j < n; j++) {
            const float *k = attn_kv_row(t, t->k_pool, s, j0 + j, kvh, kbuf);
            for (int32_t g = 0; g < nh; g++) {
                float sc = loom__cpu_dot(q[g], k, hd) * p->scale;
                if (p->softcap > 0.0f) sc = p->softcap * tanhf(sc / p->softcap);
                base[(size_t)g * (ATTN_TILE + hd) + j] = sc;
            }
        }
        bool any = false, skip[ATTN_MAX_SHARE];
        for (int32_t g = 0; g < nh; g++) {
            float *scores = base + (size_t)g * (ATTN_TILE + hd), *acc = scores + ATTN_TILE;
            float tile_max = -INFINITY;
            for (int64_t j = 0; j < n; j++) tile_max = scores[j] > tile_max ? scores[j] : tile_max;
            skip[g] = tile_max == -INFINITY; /* every weight in this head's tile is 0 */
            if (skip[g]) continue;
            any = true;
            if (tile_max > m[g]) {
                float corr = expf(m[g] - tile_max); /* 0 on the first tile (m = -inf) */
                l[g] *= corr;
                loom__cpu_vscale(acc, corr, hd);
                m[g] = tile_max;
            }
        }
        if (!any) continue;
        for (int64_t j = 0; j < n; j++) {
            const float *v = attn_kv_row(t, t->v_pool, s, j0 + j, kvh, vbuf);
            for (int32_t g = 0; g < nh; g++) {
                float *scores = base + (size_t)g * (ATTN_TILE + hd), *acc = scores + ATTN_TILE;
                if (skip[g]) continue;
                float w = expf(scores[j] - m[g]);
                l[g] += w;
                loom__cpu_axpy(acc, w, v, hd);
            }
        }
    }
    for (int32_t g = 0; g < nh; g++) {
        const float *acc = base + (size_t)g * (ATTN_TILE + hd) + ATTN_TILE;
        float *o = (float *)loom__cpu_row(t->out, r) + (int64_t)(h0 + g) * hd;
        /* l >= 1 after any tile (the maximum contributes exp(0)); l == 0 only if every score
         * was -inf, and then the output is zero rather than 0/0. */
        const float inv = l[g] > 0.0f ? 1.0f / l[g] : 0.0f;
        for (int64_t d = 0; d < hd; d++) o[d] = acc[d] * inv;
    }
}

static void attn_worker(void *arg, int ith, int nth) {
    (void)nth;
    attn_task *t = arg;
    float *scratch = t->c->scratch[ith];
    for (;;) {
        int64_t item = atomic_fetch_add_explicit(&t->next, 1, memory_order_relaxed);
        if (item >= t->n_items) break;
        /* item = (row, group of share heads) */
        const int64_t per_row = t->p->n_head / t->share;
        const int64_t r = item / per_row;
        attn_heads(t, r, (int32_t)(item % per_row) * t->share, t->share, scratch);
    }
}

static loom_status attn_check_params(const loom_attn_params *p, const loom_kv_desc *kv) {
    LOOM_RETURN_IF(p == NULL, LOOM_ERR_INVALID_ARG, "attention: params are NULL");
    LOOM_RETURN_IF(p->n_head < 1 || p->n_head % kv->n_kv_heads != 0, LOOM_ERR_INVALID_ARG,
                   "attention: n_head %d is not a positive multiple of n_kv_heads %d", p->n_head,
                   kv->n_kv_heads);
    LOOM_RETURN_IF(!isfinite(p->scale), LOOM_ERR_INVALID_ARG, "attention: scale %g is not finite",
                   (double)p->scale);
    LOOM_RETURN_IF(p->window < 0, LOOM_ERR_INVALID_ARG, "attention: window %d is negative",
                   p->window);
    LOOM_RETURN_IF(!(p->softcap >= 0.0f) || !isfinite(p->softcap), LOOM_ERR_INVALID_ARG,
                   "attention: softcap %g must be finite and >= 0", (double)p->softcap);
    return LOOM_OK;
}

loom_status loom__cpu_attention(void *ctx, const loom_tensor *q, const loom_kv_desc *kv,
                                const loom_attn_params *p, loom_tensor *out) {
    loom_cpu_ctx *c = ctx;
    LOOM_TRY(loom__cpu_check_f32("attention", "q", q));
    LOOM_TRY(loom__cpu_check_f32("attention", "out", out));
    LOOM_TRY(loom__cpu_check_same_shape("attention", "q", q, "out", out));
    LOOM_RETURN_IF(p == NULL, LOOM_ERR_INVALID_ARG, "attention: params are NULL");
    int64_t n_rows;
    int32_t pool_layer;
    LOOM_TRY(loom__cpu_check_kv_desc("attention", kv, p->layer, true, p->window, &n_rows,
                                     &pool_layer));
    LOOM_TRY(attn_check_params(p, kv));
    LOOM_RETURN_IF(q->ne[0] != (int64_t)p->n_head * kv->head_dim, LOOM_ERR_INVALID_ARG,
                   "attention: q rows have %lld elements but n_head*head_dim = %d*%d",
                   (long long)q->ne[0], p->n_head, kv->head_dim);
    LOOM_RETURN_IF(q->ne[1] != n_rows, LOOM_ERR_INVALID_ARG,
                   "attention: q has %lld rows but the descriptor has %lld new rows",
                   (long long)q->ne[1], (long long)n_rows);
    LOOM_RETURN_IF(loom__cpu_tensors_overlap(q, out), LOOM_ERR_INVALID_ARG,
                   "attention: out overlaps q (no in-place attention)");
    if (n_rows == 0) return LOOM_OK;
    const int32_t group = p->n_head / kv->n_kv_heads;
    /* Heads of one kv head share its K/V rows when that still leaves every thread a few items
     * (a decode step of one sequence keeps one item per head). Same bits either way. */
    int32_t share = group;
    if (share > ATTN_MAX_SHARE || n_rows * kv->n_kv_heads < 4 * (int64_t)c->n_threads) share = 1;
    LOOM_TRY(loom__cpu_reserve_scratch(
        c, 2 * (size_t)kv->head_dim + (size_t)share * (ATTN_TILE + (size_t)kv->head_dim)));

    attn_task t = {.c = c,
                   .q = q,
                   .out = out,
                   .kv = kv,
                   .p = p,
                   .k_pool = kv->k_base[pool_layer],
                   .v_pool = kv->v_base[pool_layer],
                   .group = group,
                   .share = share,
                   .n_items = n_rows * p->n_head / share};
    atomic_init(&t.next, 0);
    loom__threadpool_run(c->tp, attn_worker, &t);
    return LOOM_OK;
}
