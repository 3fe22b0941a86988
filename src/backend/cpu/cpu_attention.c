/* cpu_attention.c — causal (optionally windowed, soft-capped) attention over the paged KV.
 *
 * Row r of sequence s sits at position p = pos_start[s] + (r - q_start[s]) and attends to
 * positions lo..p, lo = max(0, p-window+1) (window 0: lo = 0), reading K and V of kv head
 * h / (n_head / n_kv_heads) through the sequence's block table. Nothing past p is read, so
 * nothing past kv_len[s] either. One (row, head) is a query vector.
 *
 * Softmax is online over tiles of ATTN_TILE positions, restarted at every segment of ATTN_SEG
 * positions. Tiles and segments sit at multiples of their size in position space (not at lo,
 * not at the batch's first row): a query vector visits the tiles that meet lo..p, in order, and
 * within each attends to its own lanes only. Per tile it updates its running max m, sum l and
 * accumulator exactly as described at the top of cpu_attention_tile.c; at the end of each
 * segment after the first, that segment's state is merged into the state of the earlier ones
 * (loom__attn_state_merge); the output is acc / l. Everything is float32; F16, BF16 and FP8 K/V are
 * widened exactly. The layers of a merged pair read directions times their norms
 * (cpu_attention_tile.c, loom_backend.h).
 *
 * Work is shared out in items: a block of up to `rows` consecutive rows (split where a
 * sequence ends) and up to `heads` query heads of one kv head. An item walks the tiles its
 * rows need, widening each tile of K and V once, and advances its query vectors over it
 * ATTN_QBLOCK at a time. When there are too few items to keep the threads busy (decoding a
 * few sequences), each row's segments become items of their own ("split" items): each leaves
 * its segment's state in a shared area, and the calling thread merges them in order after the
 * run. A one-token decode deep in a context thus spreads over every thread even with fewer kv
 * heads than threads. Rows per item, heads per item, split or not, which vectors share a block
 * and which thread runs an item change nothing in a vector's arithmetic (cpu_attention_tile.c
 * says why), so a row's output is bitwise the same alone or batched, in one prefill call or in
 * chunks, and on any number of threads. Items go out through an atomic counter, latest rows
 * first: they see the most keys, and the cheap items left at the end even out the threads. */
#include "backend/cpu/cpu_attention_tile.h"
#include "backend/cpu/cpu_internal.h"

#include "core/checked.h"
#include "core/status.h"
#include "tensor/types.h"

#include <math.h>
#include <stdatomic.h>
#include <stdint.h>
#include <string.h>

/* Query vectors per item when rows are plenty: they share each widened K/V tile. */
#define ATTN_ITEM_QVECS 64

/* Floats of one split item's saved state: acc[head_dim], then m and l. */
#define ATTN_PART_FLOATS(hd) ((hd) + 2)
/* Most bytes of saved states one split run may keep (a one-token decode at 128k positions
 * with 9 heads of 64 keeps 1.2 MB). */
#define ATTN_PARTS_MAX_BYTES (64.0 * (1 << 20))
/* From this many stored floats on, the merge after a split run uses the pool. */
#define ATTN_MERGE_POOL_FLOATS ((int64_t)1 << 14)

typedef struct attn_task {
    const loom_tensor *q; /* [T, n_head*head_dim] f32 */
    loom_tensor *out;     /* [T, n_head*head_dim] f32 */
    const loom_kv_desc *kv;
    const loom_attn_params *p;
    float **scratch;    /* per thread, attn_scratch_floats(rows * heads, head_dim) */
    const char *k_pool; /* [n_blocks][block_size][n_kv_heads][head_dim] of kv_type */
    const char *v_pool;
    const char *k_scale, *v_scale; /* FP8: the pools' scales (NULL otherwise) */
    const char *merge;             /* a merged pair's merge pool (attn_kv_src) */
    int merge_role;                /* 0: not merged; 1: the pair's earlier layer; 2: later */
    int32_t group;                 /* query heads per kv head */
    int32_t heads;    /* query heads per item (the last chunk of a group may have fewer) */
    int32_t chunks;   /* items per (row block, kv head): ceil(group / heads) */
    int32_t rows;     /* rows per block */
    int64_t n_blocks; /* ceil(T / rows) */
    /* Split items (rows == 1): items per (row, kv head, chunk), one per segment of the row
     * that meets the most segments (rows meeting fewer skip the rest); 0: not split. */
    int64_t n_segs;
    float *parts;      /* split: [T][n_head][n_segs][ATTN_PART_FLOATS(head_dim)] */
    int64_t n_items;   /* n_blocks * n_kv_heads * chunks (* n_segs when split) */
    atomic_llong next; /* next unclaimed item */
} attn_task;

static int64_t attn_lo(const loom_kv_desc *kv, int64_t pos) {
    return kv->window > 0 && pos - kv->window + 1 > 0 ? pos - kv->window + 1 : 0;
}

static int64_t attn_pos_of_row(const loom_kv_desc *kv, int32_t s, int64_t r) {
    return (int64_t)kv->pos_start[s] + (r - kv->q_start[s]);
}

/* Per-thread scratch of a run of n query vectors: the tile, then acc [n][hd], then q packed
 * by blocks of ATTN_QBLOCK ([hd][ATTN_QBLOCK] each), then a second acc [n][hd] for the
 * segment in progress. */
static int64_t attn_scratch_floats(int64_t n, int64_t hd) {
    const int64_t n_packed = (n + ATTN_QBLOCK - 1) / ATTN_QBLOCK * ATTN_QBLOCK;
    return loom__attn_tile_floats(hd) + (2 * n + n_packed) * hd;
}

/* Vector k = (row r0 + k / nh, head h0 + k % nh): its q row, a zero accumulator, m = -inf,
 * l = 0; and the packed copies of q the score kernel reads. */
static void attn_qvecs_init(const attn_task *t, attn_qvec *qv, int n, int64_t r0, int32_t h0,
                            int32_t nh, float *acc, float *qt) {
    const int64_t hd = t->kv->head_dim;
    for (int k = 0; k < n; k++) {
        const int64_t r = r0 + k / nh, h = h0 + k % nh;
        qv[k] = (attn_qvec){.q = (const float *)loom__cpu_row(t->q, r) + h * hd,
                            .acc = acc + (size_t)k * (size_t)hd,
                            .m = -INFINITY,
                            .l = 0.0f};
    }
    memset(acc, 0, sizeof(float) * (size_t)n * (size_t)hd);
    for (int k = 0; k < n; k += ATTN_QBLOCK)
        loom__attn_pack_q(qv + k, n - k < ATTN_QBLOCK ? n - k : ATTN_QBLOCK, hd, qt + k * hd);
}

/* Each vector's lanes of the tile at j0: its positions lo..pos there (ia > ib: none). */
static void attn_qvecs_lanes(const loom_kv_desc *kv, attn_qvec *qv, int n, int32_t nh, int64_t pos0,
                             int64_t j0) {
    for (int k = 0; k < n; k++) {
        const int64_t pos = pos0 + k / nh, a = attn_lo(kv, pos) - j0, b = pos - j0;
        qv[k].ia = a > 0 ? (a < ATTN_TILE ? (int)a : ATTN_TILE) : 0;
        qv[k].ib = b < ATTN_TILE - 1 ? (b < 0 ? -1 : (int)b) : ATTN_TILE - 1;
    }
}

/* o = acc / l (a vector whose every score was -inf, l == 0, gives zeros rather than 0/0: l is
 * at least 1 after any position, whose maximum contributes exp(0)). */
static void attn_write(float *o, const float *acc, float l, int64_t hd) {
    const float inv = l > 0.0f ? 1.0f / l : 0.0f;
    for (int64_t d = 0; d < hd; d++) o[d] = acc[d] * inv;
}

/* The n vectors of rows starting at position pos0 over the tiles that meet positions [a, b]
 * (within one segment), each tile of sequence src->seq widened once; K/V rows up to position
 * pf_last are asked for one tile ahead. */
static void attn_tiles(const attn_task *t, const attn_kv_src *src, attn_kv_tile *tile,
                       attn_qvec *qv, int n, int32_t nh, int64_t pos0, int64_t a, int64_t b,
                       int64_t pf_last, const float *qt, float *scores) {
    const int64_t hd = t->kv->head_dim;
    for (int64_t j0 = a / ATTN_TILE * ATTN_TILE; j0 <= b; j0 += ATTN_TILE) {
        const int64_t ia = a > j0 ? a - j0 : 0;
        const int64_t ib = b - j0 < ATTN_TILE - 1 ? b - j0 : ATTN_TILE - 1;
        loom__attn_tile_load(tile, src, j0, (int)ia, (int)ib);
        /* The next tile's rows are asked for while this one's arithmetic runs: one-token
         * decode reads each K/V row once per step from memory, row by row, and otherwise waits
         * for every one (Q8_0 decode after a 1536-token prompt: 50-56 -> 64-67 tok/s,
         * alternated runs; 512-token prompts unchanged). */
        if (j0 + ATTN_TILE <= pf_last)
            loom__attn_tile_prefetch(src, j0 + ATTN_TILE, 0,
                                     (int)(pf_last - j0 - ATTN_TILE < ATTN_TILE - 1
                                               ? pf_last - j0 - ATTN_TILE
                                               : ATTN_TILE - 1));
        attn_qvecs_lanes(t->kv, qv, n, nh, pos0, j0);
        for (int k = 0; k < n; k += ATTN_QBLOCK)
            loom__attn_tile_advance(tile, hd, t->p->scale, t->p->softcap, qv + k,
                                    n - k < ATTN_QBLOCK ? n - k : ATTN_QBLOCK, qt + k * hd, scores);
    }
}

/* Rows r0 .. r1-1 (all of sequence s) and query heads h0 .. h0+nh-1 of kv head kvh: the
 * tiles from the first row's lo to the last row's position, segment by segment, each segment
 * after the first run into acc_seg from a fresh state and then merged into acc. */
static void attn_run(const attn_task *t, int32_t s, int64_t r0, int64_t r1, int32_t kvh, int32_t h0,
                     int32_t nh, float *scratch) {
    const loom_kv_desc *kv = t->kv;
    const int64_t hd = kv->head_dim, pos0 = attn_pos_of_row(kv, s, r0);
    const int64_t pos_last = pos0 + (r1 - r0) - 1, lo_first = attn_lo(t->kv, pos0);
    const int n = (int)((r1 - r0) * nh),
              n_packed = (n + ATTN_QBLOCK - 1) / ATTN_QBLOCK * ATTN_QBLOCK;
    attn_kv_tile tile = {.kt = scratch, .vbuf = scratch + ATTN_TILE * hd};
    float *scores = scratch + 2 * ATTN_TILE * hd; /* [ATTN_QBLOCK][ATTN_TILE] */
    float *acc = scratch + loom__attn_tile_floats(hd), *qt = acc + (size_t)n * (size_t)hd;
    float *acc_seg = qt + (size_t)n_packed * (size_t)hd;
    attn_qvec qv[ATTN_ITEM_QVECS];
    float m_prev[ATTN_ITEM_QVECS], l_prev[ATTN_ITEM_QVECS];
    attn_qvecs_init(t, qv, n, r0, h0, nh, acc, qt);
    const attn_kv_src src = {kv, t->k_pool, t->v_pool, t->k_scale,   t->v_scale,
                             s,  kvh,       t->merge,  t->merge_role};
    for (int64_t seg = lo_first / ATTN_SEG * ATTN_SEG; seg <= pos_last; seg += ATTN_SEG) {
        const int64_t a = lo_first > seg ? lo_first : seg;
        const int64_t b = pos_last < seg + ATTN_SEG - 1 ? pos_last : seg + ATTN_SEG - 1;
        const bool first = a == lo_first;
        if (!first) { /* a fresh state for this segment */
            for (int k = 0; k < n; k++) {
                m_prev[k] = qv[k].m;
                l_prev[k] = qv[k].l;
                qv[k] = (attn_qvec){.q = qv[k].q,
                                    .acc = acc_seg + (size_t)k * (size_t)hd,
                                    .m = -INFINITY,
                                    .l = 0.0f};
            }
            memset(acc_seg, 0, sizeof(float) * (size_t)n * (size_t)hd);
        }
        attn_tiles(t, &src, &tile, qv, n, nh, pos0, a, b, pos_last, qt, scores);
        if (!first) {
            for (int k = 0; k < n; k++) {
                float *main_acc = acc + (size_t)k * (size_t)hd;
                loom__attn_state_merge(&m_prev[k], &l_prev[k], main_acc, qv[k].m, qv[k].l,
                                       qv[k].acc, hd);
                qv[k].acc = main_acc;
                qv[k].m = m_prev[k];
                qv[k].l = l_prev[k];
            }
        }
    }
    for (int k = 0; k < n; k++) {
        const int64_t r = r0 + k / nh, h = h0 + k % nh;
        attn_write((float *)loom__cpu_row(t->out, r) + h * hd, qv[k].acc, qv[k].l, hd);
    }
}

/* Row r's segments: first (absolute segment number) and how many. */
static int64_t attn_row_segs(const attn_task *t, int64_t r, int64_t *first) {
    const int32_t s = loom__cpu_seq_of_row(t->kv, r);
    const int64_t pos = attn_pos_of_row(t->kv, s, r);
    *first = attn_lo(t->kv, pos) / ATTN_SEG;
    return pos / ATTN_SEG - *first + 1;
}

static float *attn_part(const attn_task *t, int64_t r, int32_t h, int64_t si) {
    const int64_t hd = t->kv->head_dim;
    return t->parts + ((r * t->p->n_head + h) * t->n_segs + si) * ATTN_PART_FLOATS(hd);
}

/* A split item: segment si of row r for query heads h0 .. h0+nh-1 of kv head kvh, its state
 * left in the parts area. */
static void attn_run_part(const attn_task *t, int64_t r, int32_t kvh, int32_t h0, int32_t nh,
                          int64_t si, float *scratch) {
    const loom_kv_desc *kv = t->kv;
    int64_t seg0;
    if (si >= attn_row_segs(t, r, &seg0)) return; /* this row meets fewer segments */
    const int32_t s = loom__cpu_seq_of_row(kv, r);
    const int64_t hd = kv->head_dim, pos = attn_pos_of_row(kv, s, r), lo = attn_lo(t->kv, pos);
    const int64_t seg = (seg0 + si) * ATTN_SEG;
    const int64_t a = lo > seg ? lo : seg, b = pos < seg + ATTN_SEG - 1 ? pos : seg + ATTN_SEG - 1;
    attn_kv_tile tile = {.kt = scratch, .vbuf = scratch + ATTN_TILE * hd};
    float *scores = scratch + 2 * ATTN_TILE * hd;
    float *acc = scratch + loom__attn_tile_floats(hd), *qt = acc + (size_t)nh * (size_t)hd;
    attn_qvec qv[ATTN_ITEM_QVECS];
    attn_qvecs_init(t, qv, nh, r, h0, nh, acc, qt);
    const attn_kv_src src = {kv, t->k_pool, t->v_pool, t->k_scale,   t->v_scale,
                             s,  kvh,       t->merge,  t->merge_role};
    attn_tiles(t, &src, &tile, qv, nh, nh, pos, a, b, b, qt, scores);
    for (int k = 0; k < nh; k++) {
        float *part = attn_part(t, r, h0 + k, si);
        memcpy(part, qv[k].acc, sizeof(float) * (size_t)hd);
        part[hd] = qv[k].m;
        part[hd + 1] = qv[k].l;
    }
}

/* After a split run: the segments of vectors v0 .. v1-1 (vector v = row v / n_head, head
 * v % n_head) merged in order, as attn_run merges them, and written out. */
static void attn_merge_parts(const attn_task *t, int64_t v0, int64_t v1) {
    const int64_t hd = t->kv->head_dim, n_head = t->p->n_head;
    for (int64_t v = v0; v < v1; v++) {
        const int64_t r = v / n_head;
        const int32_t h = (int32_t)(v % n_head);
        int64_t seg0;
        const int64_t n_segs = attn_row_segs(t, r, &seg0);
        float *state = attn_part(t, r, h, 0);
        for (int64_t si = 1; si < n_segs; si++) {
            const float *part = attn_part(t, r, h, si);
            loom__attn_state_merge(&state[hd], &state[hd + 1], state, part[hd], part[hd + 1], part,
                                   hd);
        }
        attn_write((float *)loom__cpu_row(t->out, r) + h * hd, state, state[hd + 1], hd);
    }
}

static void attn_merge_worker(void *arg, int ith, int nth) {
    const attn_task *t = arg;
    int64_t v0, v1;
    loom__split_range(t->kv->q_start[t->kv->n_seqs] * t->p->n_head, ith, nth, &v0, &v1);
    attn_merge_parts(t, v0, v1);
}

/* Item -> (row block, kv head, head chunk[, segment]); row blocks from the last one back. */
static void attn_item(const attn_task *t, int64_t item, float *scratch) {
    const loom_kv_desc *kv = t->kv;
    const int64_t si = t->n_segs > 0 ? item % t->n_segs : 0;
    if (t->n_segs > 0) item /= t->n_segs;
    const int64_t per_block = (int64_t)kv->n_kv_heads * t->chunks;
    const int64_t b = t->n_blocks - 1 - item / per_block, rest = item % per_block;
    const int32_t kvh = (int32_t)(rest / t->chunks);
    const int32_t h0 = kvh * t->group + (int32_t)(rest % t->chunks) * t->heads;
    const int32_t h_end = (kvh + 1) * t->group;
    const int32_t nh = h_end - h0 < t->heads ? h_end - h0 : t->heads;
    if (t->n_segs > 0) { /* rows == 1 */
        attn_run_part(t, b, kvh, h0, nh, si, scratch);
        return;
    }
    const int64_t n_rows = kv->q_start[kv->n_seqs];
    int64_t r = b * t->rows;
    const int64_t r_end = r + t->rows < n_rows ? r + t->rows : n_rows;
    while (r < r_end) { /* a block may straddle sequences: one run per sequence */
        const int32_t s = loom__cpu_seq_of_row(kv, r);
        const int64_t end = kv->q_start[s + 1] < r_end ? kv->q_start[s + 1] : r_end;
        attn_run(t, s, r, end, kvh, h0, nh, scratch);
        r = end;
    }
}

static void attn_worker(void *arg, int ith, int nth) {
    (void)nth;
    attn_task *t = arg;
    for (;;) {
        int64_t item = atomic_fetch_add_explicit(&t->next, 1, memory_order_relaxed);
        if (item >= t->n_items) break;
        attn_item(t, item, t->scratch[ith]);
    }
}

static void attn_count(attn_task *t, int64_t n_rows, int32_t n_kv_heads) {
    t->chunks = (t->group + t->heads - 1) / t->heads;
    t->n_blocks = (n_rows + t->rows - 1) / t->rows;
    t->n_items = t->n_blocks * n_kv_heads * t->chunks * (t->n_segs > 0 ? t->n_segs : 1);
}

/* Rows and heads per item: ATTN_ITEM_QVECS vectors each; fewer rows while that leaves the
 * threads under four items each (items differ in cost); then, at one row per item and still
 * short of that, one item per segment where rows meet several; then fewer heads while some
 * thread would have none (each item widens its K/V tiles again, so heads are split only as far
 * as needed). Any choice gives the same bits. */
static void attn_plan(attn_task *t, int64_t n_rows, int32_t n_kv_heads, int n_threads) {
    t->heads = t->group < ATTN_ITEM_QVECS ? t->group : ATTN_ITEM_QVECS;
    t->rows = ATTN_ITEM_QVECS / t->heads;
    t->n_segs = 0;
    attn_count(t, n_rows, n_kv_heads);
    while (t->rows > 1 && t->n_items < 4 * (int64_t)n_threads) {
        t->rows = (t->rows + 1) / 2;
        attn_count(t, n_rows, n_kv_heads);
    }
    if (t->rows == 1 && n_threads > 1 && t->n_items < 4 * (int64_t)n_threads) {
        int64_t most = 1, seg0;
        for (int64_t r = 0; r < n_rows; r++) {
            const int64_t n = attn_row_segs(t, r, &seg0);
            most = n > most ? n : most;
        }
        /* Every segment's state is kept until the merge: not past ATTN_PARTS_MAX_BYTES (the
         * whole-row items give the same bits). */
        const double bytes = (double)n_rows * t->p->n_head * (double)most *
                             ATTN_PART_FLOATS((double)t->kv->head_dim) * sizeof(float);
        if (most > 1 && bytes <= ATTN_PARTS_MAX_BYTES) {
            t->n_segs = most;
            attn_count(t, n_rows, n_kv_heads);
        }
    }
    while (t->heads > 1 && t->n_items < n_threads) {
        t->heads = (t->heads + 1) / 2;
        attn_count(t, n_rows, n_kv_heads);
    }
}

void loom__cpu_attention_need(int n_threads, int64_t T, int32_t n_head, int32_t hd, int32_t max_ctx,
                              size_t *scratch_floats, size_t *parts_bytes) {
    /* An item holds at most ATTN_ITEM_QVECS query vectors (attn_plan: rows * heads). */
    *scratch_floats = (size_t)attn_scratch_floats(ATTN_ITEM_QVECS, hd);
    *parts_bytes = 0;
    if (n_threads <= 1 || T < 1 || max_ctx < 1) return;
    /* attn_plan splits only runs of fewer than 4 * n_threads rows (one item per row and kv
     * head then), whose rows meet at most (max_ctx - 1) / ATTN_SEG + 1 segments, and only
     * while the states fit ATTN_PARTS_MAX_BYTES. */
    const int64_t rows = T < 4 * (int64_t)n_threads - 1 ? T : 4 * (int64_t)n_threads - 1;
    const double segs = (double)((max_ctx - 1) / ATTN_SEG + 1);
    const double bytes =
        (double)rows * n_head * segs * ATTN_PART_FLOATS((double)hd) * sizeof(float);
    *parts_bytes = (size_t)(bytes < ATTN_PARTS_MAX_BYTES ? bytes : ATTN_PARTS_MAX_BYTES);
}

loom_status loom__cpu_attention(void *ctx, const loom_tensor *q, const loom_kv_desc *kv,
                                const loom_attn_params *p, loom_tensor *out) {
    loom__cpu_ctx *c = ctx;
    int64_t n_rows;
    LOOM_TRY(loom__check_attention(q, kv, p, out, &n_rows));
    int32_t pool_layer;
    LOOM_TRY(loom__cpu_check_kv_use("attention", kv, p->layer, true, &pool_layer));
    if (n_rows == 0) return LOOM_OK;
    loom_tensor q_rot;
    if (kv->kv_flags & LOOM_KV_HADAMARD) {
        /* The pages hold H k and H v: attend with H q (q.k unchanged), then rotate the output
         * back (it is H times the weighted sum of v). */
        LOOM_RETURN_IF(kv->head_dim > LOOM_CPU_HADAMARD_MAX, LOOM_ERR_UNSUPPORTED,
                       "attention: the cpu rotates head dims up to %d, not %d",
                       LOOM_CPU_HADAMARD_MAX, kv->head_dim);
        const int64_t W = (int64_t)p->n_head * kv->head_dim;
        LOOM_TRY(loom__cpu_reserve_act(c, (size_t)(n_rows * W) * sizeof(float)));
        q_rot = loom_tensor_2d(LOOM_TYPE_F32, c->act, W, n_rows, (size_t)W * sizeof(float));
        for (int64_t r = 0; r < n_rows; r++) {
            float *row = loom__cpu_row(&q_rot, r);
            memcpy(row, loom__cpu_row(q, r), (size_t)W * sizeof(float));
            for (int32_t h = 0; h < p->n_head; h++)
                loom__cpu_hadamard(row + (size_t)h * kv->head_dim, kv->head_dim);
        }
        q = &q_rot;
    }

    attn_task t = {.q = q,
                   .out = out,
                   .kv = kv,
                   .p = p,
                   .k_pool = kv->k_base[pool_layer],
                   .v_pool = kv->v_base[pool_layer],
                   .k_scale = kv->k_scale ? kv->k_scale[pool_layer] : NULL,
                   .v_scale = kv->v_scale ? kv->v_scale[pool_layer] : NULL,
                   .group = p->n_head / kv->n_kv_heads};
    switch (loom__cpu_merge_role(kv, p->layer)) {
    case LOOM_CPU_MERGE_A:
    case LOOM_CPU_MERGE_B:
        LOOM_RETURN_IF(kv->kv_type != LOOM_TYPE_F16 && kv->kv_type != LOOM_TYPE_BF16 &&
                           kv->kv_type != LOOM_TYPE_F32,
                       LOOM_ERR_UNSUPPORTED,
                       "attention: merged pairs over %s pages (cpu: f16, bf16, f32)",
                       loom__type_name(kv->kv_type));
        t.merge = kv->merge_base[p->layer];
        t.merge_role = loom__cpu_merge_role(kv, p->layer) == LOOM_CPU_MERGE_A ? 1 : 2;
        break;
    case LOOM_CPU_MERGE_NONE:
        break;
    }
    attn_plan(&t, n_rows, kv->n_kv_heads, c->n_threads);
    LOOM_TRY(loom__cpu_reserve_scratch(
        c, (size_t)attn_scratch_floats((int64_t)t.rows * t.heads, kv->head_dim)));
    t.scratch = c->scratch;
    if (t.n_segs > 0) {
        size_t n_parts, n_floats;
        LOOM_RETURN_IF(loom__mul_overflow_size((size_t)n_rows * (size_t)p->n_head, (size_t)t.n_segs,
                                               &n_parts) ||
                           loom__mul_overflow_size(n_parts, ATTN_PART_FLOATS((size_t)kv->head_dim),
                                                   &n_floats) ||
                           n_floats > SIZE_MAX / sizeof(float),
                       LOOM_ERR_INVALID_ARG, "attention: %lld segments of %lld rows overflow",
                       (long long)t.n_segs, (long long)n_rows);
        LOOM_TRY(loom__cpu_reserve_attn_parts(c, n_floats * sizeof(float)));
        t.parts = c->attn_parts;
    }
    atomic_init(&t.next, 0);
    loom__threadpool_run(c->tp, attn_worker, &t);
    if (t.n_segs > 0) {
        /* Merging is a few operations per stored float: worth the pool only when there are
         * many (a long context on many threads). */
        const int64_t n_vecs = n_rows * p->n_head;
        if (n_vecs * t.n_segs * kv->head_dim >= ATTN_MERGE_POOL_FLOATS)
            loom__threadpool_run(c->tp, attn_merge_worker, &t);
        else
            attn_merge_parts(&t, 0, n_vecs);
    }
    if (kv->kv_flags & LOOM_KV_HADAMARD)
        for (int64_t r = 0; r < n_rows; r++)
            for (int32_t h = 0; h < p->n_head; h++)
                loom__cpu_hadamard((float *)loom__cpu_row(out, r) + (size_t)h * kv->head_dim,
                                   kv->head_dim);
    return LOOM_OK;
}
