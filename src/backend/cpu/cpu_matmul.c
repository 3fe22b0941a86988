/* cpu_matmul.c — out[T, N] = x[T, K] · w[N, K]^T for weights of any dequantizable type.
 *
 * Three arithmetics:
 *
 *   - Quantized activations (the default; tensor/qdot.h). The T activation rows are first
 *     rounded, once per call, to the weight type's activation format (q8_0, q8_1, q8_K, f16 or
 *     bf16) into the context's shared activation area (rows split over the threads). Then each
 *     thread takes groups of RB weight rows and dots every row of its group, in place, with
 *     every token's rounded row: integer block dot products, the arithmetic llama.cpp uses.
 *
 *   - Float32 activations (c->f32_activations, and F32 weights always). A thread turns a
 *     group's rows into float32 once (F32 rows are used in place; others are dequantized into
 *     its scratch) and dots them with the float32 tokens: closest to exact arithmetic.
 *
 *   - FP8 weight rows (LOOM_TYPE_FP8_E4M3_ROWS), always with float32 activations: each output
 *     is the dot of the row's units (E4M3 values * 2^-8) with the token, times the row's scale
 *     * 256 (cpu_fp8.h). For a few tokens the dot reads the codes in place (one byte per
 *     weight from memory, the decode-step case); for more, a thread widens a group's rows
 *     into its scratch once and reuses them for every token. Both give the same bits.
 *
 * Every way the N output columns (weight rows) are cut into groups of RB rows, the groups are
 * shared out over the threads (core/workshare.h: each thread streams its own contiguous share,
 * then helps finish the others'), and a thread walks all T tokens for one group before the
 * next, so each weight row is read from memory once per call, not once per token — what makes
 * prompt processing fast — while a token's row stays in L1 across the RB dots that use it.
 *
 * Batch invariance: out[t, o] is always the same function of (row o, x[t]) — loom__cpu_dot on
 * the dequantized row, loom__vec_dot_q on the row and x[t] rounded by a per-row quantizer, or
 * (FP8 rows) loom__cpu_dot on the row's units times its scale —
 * so it has the same bits whatever T, the grouping, the thread count, or which thread took a
 * group. */
#include "backend/cpu/cpu_fp8.h"
#include "backend/cpu/cpu_internal.h"
#include "backend/cpu/cpu_vec.h"

#include "core/checked.h"
#include "core/status.h"
#include "tensor/qdot.h"
#include "tensor/qgemm.h"
#include "tensor/quant.h"

#include <stdbool.h>
#include <string.h>

/* Rows per group on the float path: as many as keep RB*K floats within MM_GROUP_FLOATS (about
 * 256 KiB, an L2's share), between 1 and MM_MAX_RB. On the quantized path: as many encoded
 * rows as fit in MMQ_GROUP_BYTES, between 1 and MM_MAX_RB. */
#define MM_GROUP_FLOATS 65536
#define MMQ_GROUP_BYTES 65536
#define MM_MAX_RB       16

/* Rounded activation rows start on 64-byte boundaries. */
#define MMQ_ROW_ALIGN 64

/* Shares out n units for the next run (core/workshare.h). */
static loom_status mm_share(loom__cpu_ctx *c, int64_t n) {
    LOOM_RETURN_IF(n > LOOM_WORKSHARE_MAX_UNITS, LOOM_ERR_INVALID_ARG,
                   "matmul: %lld work units (groups of rows x blocks of tokens) exceed %lld",
                   (long long)n, (long long)LOOM_WORKSHARE_MAX_UNITS);
    loom__workshare_reset(c->share, n);
    return LOOM_OK;
}

/* The matmuls of one call: n weights (all of one type) against the same x; their units are
 * numbered weight after weight, and one run covers them all. */
typedef struct mm_set {
    int n;
    const loom_tensor *w[LOOM_MATMUL_MULTI_MAX]; /* [N_j, K] */
    loom_tensor *out[LOOM_MATMUL_MULTI_MAX];     /* [T, N_j] */
    int64_t unit_end[LOOM_MATMUL_MULTI_MAX];     /* units of weights 0 .. j end here */
} mm_set;

/* Numbers the units of every weight (ceil(N_j / rb) groups of rows, times units_per_row_group
 * blocks of tokens each) and shares them out. */
static loom_status mm_set_share(loom__cpu_ctx *c, mm_set *s, int64_t units_per_row_group,
                                int64_t rb) {
    int64_t total = 0;
    for (int j = 0; j < s->n; j++) {
        total += (s->w[j]->ne[1] + rb - 1) / rb * units_per_row_group;
        s->unit_end[j] = total;
    }
    return mm_share(c, total);
}

/* Which weight unit u belongs to, and its number among that weight's units. */
static int mm_set_find(const mm_set *s, int64_t u, int64_t *local) {
    int j = 0;
    while (u >= s->unit_end[j]) j++;
    *local = j == 0 ? u : u - s->unit_end[j - 1];
    return j;
}

/* ------------------------------------------------------------------------------------------ */
/* Float32 activations                                                                        */
/* ------------------------------------------------------------------------------------------ */

typedef struct mm_task {
    loom__cpu_ctx *c;
    const loom_tensor *w; /* [N, K] any dequantizable type */
    const loom_tensor *x; /* [T, K] f32 */
    loom_tensor *out;     /* [T, N] f32 */
    int64_t rb;           /* rows per group */
} mm_task;

static int64_t mm_rows_per_group(int64_t K) {
    int64_t rb = MM_GROUP_FLOATS / K;
    if (rb < 1) rb = 1;
    if (rb > MM_MAX_RB) rb = MM_MAX_RB;
    return rb;
}

/* Row o of w as float32: in place for F32, else converted into dst (K floats). */
static const float *mm_row_f32(const loom_tensor *w, int64_t o, float *dst) {
    const void *src = loom__cpu_row(w, o);
    if (w->type == LOOM_TYPE_F32) return src;
    /* The type and K were validated before any worker runs (op_check.c); were they not, the row
     * reads as zeros rather than the library aborting. */
    if (!loom__cpu_row_to_f32(w->type, src, dst, w->ne[0]))
        memset(dst, 0, (size_t)w->ne[0] * sizeof *dst);
    return dst;
}

static void mm_worker(void *p, int ith, int nth) {
    (void)nth;
    const mm_task *a = p;
    const int64_t K = a->w->ne[0], N = a->w->ne[1], T = a->x->ne[1], rb = a->rb;
    float *scratch = a->c->scratch[ith];
    loom__workshare_cursor cur = LOOM_WORKSHARE_CURSOR_INIT;

    const float *rows[MM_MAX_RB];
    for (int64_t g; (g = loom__workshare_next(a->c->share, ith, &cur)) >= 0;) {
        const int64_t o0 = g * rb;
        const int64_t nr = N - o0 < rb ? N - o0 : rb;
        for (int64_t r = 0; r < nr; r++) rows[r] = mm_row_f32(a->w, o0 + r, scratch + r * K);
        for (int64_t t = 0; t < T; t++) {
            const float *xt = loom__cpu_row(a->x, t);
            float *ot = (float *)loom__cpu_row(a->out, t) + o0;
            for (int64_t r = 0; r < nr; r++) ot[r] = loom__cpu_dot(rows[r], xt, K);
        }
    }
}

/* ------------------------------------------------------------------------------------------ */
/* FP8 weight rows                                                                            */
/* ------------------------------------------------------------------------------------------ */

/* Up to this many tokens a row's codes are read in place once per token; beyond, widened once
 * per group of rows into the thread's scratch. */
#define MM8_IN_PLACE_TOKENS 3

typedef struct mm8_task {
    loom__cpu_ctx *c;
    const mm_set *set;    /* weights [N_j, K] FP8_E4M3_ROWS, outs [T, N_j] */
    const loom_tensor *x; /* [T, K] f32 */
    int64_t rb;           /* rows per group */
    bool in_place;        /* codes read in place (else widened into scratch) */
} mm8_task;

/* The group's nr widened rows (units, K floats each; s: their scales * 256) against every
 * token, in blocks of rows and tokens where the instruction set has them. */
static void mm8_units_group(const mm8_task *a, const float *units, const float *s,
                            const loom_tensor *out, int64_t o0, int64_t nr) {
    const int64_t K = a->x->ne[0], T = a->x->ne[1];
#if defined(LOOM_CPU_FP8_IN_PLACE)
    enum { NR = LOOM_CPU_FP8_BLOCK_NR, NT = LOOM_CPU_FP8_BLOCK_NT };
    for (int64_t t = 0; t < T;) {
        const int64_t nt = T - t >= NT ? NT : 1;
        const float *xs[NT];
        for (int64_t q = 0; q < nt; q++) xs[q] = loom__cpu_row(a->x, t + q);
        for (int64_t r = 0; r < nr;) {
            const int64_t n_r = nr - r >= NR ? NR : 1;
            const float *us[NR];
            for (int64_t q = 0; q < n_r; q++) us[q] = units + (r + q) * K;
            float d[NR * NT];
            if (n_r == NR && nt == NT)
                loom__cpu_fp8_units_block(us, xs, K, d);
            else if (n_r == NR)
                loom__cpu_fp8_units_block_t1(us, xs, K, d);
            else if (nt == NT)
                loom__cpu_fp8_units_block_r1(us, xs, K, d);
            else
                loom__cpu_fp8_units_block_1(us, xs, K, d);
            for (int64_t q = 0; q < n_r; q++)
                for (int64_t v = 0; v < nt; v++)
                    ((float *)loom__cpu_row(out, t + v))[o0 + r + q] = d[q * nt + v] * s[r + q];
            r += n_r;
        }
        t += nt;
    }
#else
    for (int64_t t = 0; t < T; t++) {
        const float *xt = loom__cpu_row(a->x, t);
        float *ot = (float *)loom__cpu_row(out, t) + o0;
        for (int64_t r = 0; r < nr; r++) ot[r] = loom__cpu_dot(units + r * K, xt, K) * s[r];
    }
#endif
}

#if defined(LOOM_CPU_FP8_IN_PLACE)
/* The group's nr rows of w from o0 on against every token, the codes read in place:
 * LOOM_CPU_FP8_NR rows at a time (their chains overlap), the rest one by one. */
static void mm8_in_place_group(const mm8_task *a, const loom_tensor *w, const loom_tensor *out,
                               int64_t o0, int64_t nr) {
    const int64_t K = a->x->ne[0], T = a->x->ne[1];
    for (int64_t r = 0; r < nr;) {
        const int64_t n_at = nr - r >= LOOM_CPU_FP8_NR ? LOOM_CPU_FP8_NR : 1;
        const uint8_t *codes[LOOM_CPU_FP8_NR];
        for (int64_t q = 0; q < n_at; q++) codes[q] = loom__cpu_row(w, o0 + r + q);
        for (int64_t t = 0; t < T; t++) {
            float *ot = (float *)loom__cpu_row(out, t) + o0 + r;
            const float *xt = loom__cpu_row(a->x, t);
            float dots[LOOM_CPU_FP8_NR];
            if (n_at == LOOM_CPU_FP8_NR)
                loom__cpu_fp8_dot_rows(codes, xt, K, dots);
            else
                dots[0] = loom__cpu_fp8_dot(codes[0], xt, K);
            /* each scale read after its row, whose last line the dot brought in */
            for (int64_t q = 0; q < n_at; q++)
                ot[q] = dots[q] * loom__fp8_rows_scale256(codes[q], K);
        }
        r += n_at;
    }
}
#endif

static void mm8_worker(void *p, int ith, int nth) {
    (void)nth;
    const mm8_task *a = p;
    const int64_t K = a->x->ne[0], rb = a->rb;
    float *units = a->c->scratch[ith];
    loom__workshare_cursor cur = LOOM_WORKSHARE_CURSOR_INIT;
    for (int64_t u; (u = loom__workshare_next(a->c->share, ith, &cur)) >= 0;) {
        int64_t g;
        const int j = mm_set_find(a->set, u, &g);
        const loom_tensor *w = a->set->w[j], *out = a->set->out[j];
        const int64_t o0 = g * rb, N = w->ne[1];
        const int64_t nr = N - o0 < rb ? N - o0 : rb;
#if defined(LOOM_CPU_FP8_IN_PLACE)
        if (a->in_place) {
            mm8_in_place_group(a, w, out, o0, nr);
            continue;
        }
#endif
        float s[MM_MAX_RB];
        for (int64_t r = 0; r < nr; r++) {
            loom__cpu_fp8_units(loom__cpu_row(w, o0 + r), units + r * K, K);
            s[r] = loom__fp8_rows_scale256(loom__cpu_row(w, o0 + r), K);
        }
        mm8_units_group(a, units, s, out, o0, nr);
    }
}

/* ------------------------------------------------------------------------------------------ */
/* Quantized activations                                                                      */
/* ------------------------------------------------------------------------------------------ */

typedef struct mmq_task {
    loom__workshare *share;      /* the groups of rows */
    const mm_set *set;           /* weights [N_j, K] of a type with an activation format, outs */
    const loom_tensor *x;        /* [T, K] f32 */
    loom__quantize_act_fn quant; /* f32 row -> activation format */
    loom__vec_dot_q_fn dot;      /* weight row . activation row */
    uint8_t *act;                /* [T] rounded rows, act_stride bytes apart */
    size_t act_stride;
    int64_t rb; /* weight rows per group */
} mmq_task;

/* Rounds this thread's share of the T activation rows. */
static void mmq_quant_worker(void *p, int ith, int nth) {
    const mmq_task *a = p;
    int64_t t0, t1;
    loom__split_range(a->x->ne[1], ith, nth, &t0, &t1);
    for (int64_t t = t0; t < t1; t++)
        a->quant(loom__cpu_row(a->x, t), a->act + (size_t)t * a->act_stride, a->x->ne[0]);
}

static void mmq_worker(void *p, int ith, int nth) {
    (void)nth;
    const mmq_task *a = p;
    const int64_t K = a->x->ne[0], T = a->x->ne[1], rb = a->rb;
    loom__workshare_cursor cur = LOOM_WORKSHARE_CURSOR_INIT;

    for (int64_t u; (u = loom__workshare_next(a->share, ith, &cur)) >= 0;) {
        int64_t g;
        const int j = mm_set_find(a->set, u, &g);
        const loom_tensor *w = a->set->w[j], *out = a->set->out[j];
        const int64_t o0 = g * rb, N = w->ne[1];
        const int64_t nr = N - o0 < rb ? N - o0 : rb;
        for (int64_t t = 0; t < T; t++) {
            const void *xt = a->act + (size_t)t * a->act_stride;
            float *ot = (float *)loom__cpu_row(out, t) + o0;
            for (int64_t r = 0; r < nr; r++) ot[r] = a->dot(loom__cpu_row(w, o0 + r), xt, K);
        }
    }
}

/* ---- tile kernels (tensor/qgemm.h): per-pair tiles, or token lanes for many tokens --------- */

/* Tokens per per-pair tile call: their prepared rows stay in L1 while a group of weight rows
 * passes. */
#define MMT_TOKENS 16
/* Bytes of prepared tokens that a block of them may take (half an L2), where the kernels
 * prepare their weights: a block of tokens meets every group of rows before the next block. */
#define MMT_BLOCK_BYTES (1u << 20)
/* From this many tokens on, token lanes beat the per-pair tile kernels (a partly filled group
 * costs as much as a full one). */
#define MML_MIN_TOKENS 5

typedef struct mmt_task {
    const mm_set *set; /* weights [N_j, K] of one type, outs [T, N_j] */
    const loom_tensor *x;
    loom__cpu_ctx *c;
    const loom__qgemm_kernels *k;   /* per-pair tiles, or (k NULL) */
    bool prepared;                  /* k's tile_prepared, rows prepared in each thread's scratch */
    const loom__qgemm_lanes *lanes; /* token lanes */
    loom__quantize_act_fn quant;
    uint8_t *xp;       /* prepared units: [T] token rows (tiles) or [ceil(T / width)] groups */
    size_t x_stride;   /* bytes between prepared units */
    size_t act_stride; /* rounded activation rows in a thread's scratch (lanes) */
    int64_t step;      /* tokens per kernel call: MMT_TOKENS, or the lane width */
    int64_t rb;        /* weight rows per group */
    int64_t t_block;   /* where prepared: tokens per block of them (a multiple of step) */
} mmt_task;

/* Tokens per prepared unit: 1 row for the tiles, a group of `width` for the lanes. */
static int64_t mmt_unit(const mmt_task *a) {
    return a->lanes ? a->lanes->width : 1;
}

/* Rounds this thread's share of the prepared units' tokens (into its scratch) and prepares
 * them. */
static void mmt_prepare_worker(void *p, int ith, int nth) {
    const mmt_task *a = p;
    const int64_t T = a->x->ne[1], K = a->x->ne[0], U = mmt_unit(a);
    int64_t u0, u1;
    loom__split_range((T + U - 1) / U, ith, nth, &u0, &u1);
    uint8_t *tmp = (uint8_t *)a->c->scratch[ith];
    for (int64_t u = u0; u < u1; u++) {
        const int64_t t0 = u * U;
        const int n = (int)(T - t0 < U ? T - t0 : U);
        for (int j = 0; j < n; j++)
            a->quant(loom__cpu_row(a->x, t0 + j), tmp + (size_t)j * a->act_stride, K);
        uint8_t *dst = a->xp + (size_t)u * a->x_stride;
        if (a->lanes)
            a->lanes->prepare_x8(tmp, a->act_stride, n, dst, K);
        else
            a->k->prepare_x(tmp, dst, K);
    }
}

/* Rows o0 .. o0 + nr - 1 (w, w_stride apart) against tokens t0 .. t1 - 1, a->step at a time,
 * into out; wp: this thread's scratch where a->prepared (the first call fills it). */
static void mmt_group(const mmt_task *a, const void *w, size_t w_stride, loom_tensor *out, void *wp,
                      int64_t o0, int nr, int64_t t0, int64_t t1) {
    const int64_t K = a->x->ne[0], U = mmt_unit(a);
    const size_t out_stride = out->row_stride / sizeof(float);
    for (int64_t t = t0; t < t1; t += a->step) {
        const int nt = (int)(t1 - t < a->step ? t1 - t : a->step);
        float *o = (float *)loom__cpu_row(out, t) + o0;
        const uint8_t *xt = a->xp + (size_t)(t / U) * a->x_stride;
        if (a->lanes)
            a->lanes->tile8(w, w_stride, nr, xt, nt, K, o, out_stride);
        else if (a->prepared)
            a->k->tile_prepared(w, w_stride, nr, wp, t == t0, xt, a->x_stride, nt, K, o,
                                out_stride);
        else
            a->k->tile(w, w_stride, nr, xt, a->x_stride, nt, K, o, out_stride);
    }
}

/* Tokens per block: where prepared, a->t_block (whose prepared rows stay in L2 while a
 * thread's groups pass; each group is prepared once per block, into the thread's scratch);
 * in place, one block of all tokens. */
static int64_t mmt_t_block(const mmt_task *a) {
    return a->prepared ? a->t_block : a->x->ne[1];
}

/* Units: (block of tokens, group of rows) pairs, blocks outer, so that a thread's share walks
 * the groups in order for one block of tokens before the next. */
static void mmt_worker(void *p, int ith, int nth) {
    (void)nth;
    const mmt_task *a = p;
    const int64_t T = a->x->ne[1], rb = a->rb, t_block = mmt_t_block(a);
    loom__workshare_cursor cur = LOOM_WORKSHARE_CURSOR_INIT;
    for (int64_t u; (u = loom__workshare_next(a->c->share, ith, &cur)) >= 0;) {
        int64_t v;
        const int j = mm_set_find(a->set, u, &v);
        const loom_tensor *w = a->set->w[j];
        const int64_t N = w->ne[1], n_groups = (N + rb - 1) / rb;
        const int64_t tb = v / n_groups * t_block, o0 = v % n_groups * rb;
        const int64_t tb1 = T - tb < t_block ? T : tb + t_block;
        mmt_group(a, loom__cpu_row(w, o0), w->row_stride, a->set->out[j], a->c->scratch[ith], o0,
                  (int)(N - o0 < rb ? N - o0 : rb), tb, tb1);
    }
}

/* ------------------------------------------------------------------------------------------ */
/* Plans: a matmul's path and memory, from (weight type, K, T) alone                          */
/* ------------------------------------------------------------------------------------------ */

/* Everything about one matmul that depends only on the weight type, K and T: the arithmetic
 * path, its grouping, and the scratch and activation memory it reserves. The runs below take
 * it, and loom__cpu_matmul_need (the stream's workspace query) reports its memory, so the two
 * cannot disagree. */
typedef enum mm_path {
    MM_PATH_F32,   /* float32 activations (mm_worker) */
    MM_PATH_FP8,   /* FP8 weight rows, float32 activations (mm8_worker) */
    MM_PATH_ROWS,  /* rounded activations, one weight row against one token (mmq_worker) */
    MM_PATH_TILES, /* rounded activations through the tile kernels or token lanes */
} mm_path;

typedef struct mm_plan {
    mm_path path;
    int64_t rb;    /* weight rows per group */
    bool in_place; /* FP8: codes read in place */
    /* ROWS and TILES */
    uint32_t act_type; /* the activation format */
    size_t act_row;    /* bytes of one rounded activation row */
    size_t act_stride; /* ROWS: rounded rows in the activation area; TILES: in a thread's
                          scratch while preparing */
    /* TILES: one of k (per-pair tiles) and lanes is non-NULL */
    const loom__qgemm_kernels *k;
    const loom__qgemm_lanes *lanes;
    bool prepared;   /* k's tile_prepared, rows prepared in each thread's scratch */
    size_t x_stride; /* bytes between prepared units */
    int64_t step;    /* tokens per kernel call */
    int64_t n_units; /* prepared units */
    int64_t t_block; /* where prepared: tokens per block of them */
    /* memory */
    size_t scratch_floats; /* per thread */
    size_t act_bytes;
} mm_plan;

static int64_t mmq_rows_per_group(size_t w_row) {
    int64_t rb = (int64_t)(MMQ_GROUP_BYTES / (w_row ? w_row : 1));
    if (rb < 1) rb = 1;
    if (rb > MM_MAX_RB) rb = MM_MAX_RB;
    return rb;
}

static loom_status mm_plan_tiles(mm_plan *pl, int64_t K, int64_t T, size_t w_row) {
    const loom__qgemm_kernels *k = pl->k;
    const loom__qgemm_lanes *lanes = pl->lanes;
    pl->path = MM_PATH_TILES;
    pl->prepared = !lanes && k->tile_prepared && T >= k->prepare_min_tokens(K);
    pl->x_stride = lanes ? lanes->x8_bytes(K) : k->x_row_bytes(K);
    pl->act_stride = (pl->act_row + MMQ_ROW_ALIGN - 1) / MMQ_ROW_ALIGN * MMQ_ROW_ALIGN;
    pl->step = lanes ? lanes->width : pl->prepared ? k->prepared_tokens_per_call : MMT_TOKENS;
    const int64_t U = lanes ? lanes->width : 1; /* tokens per prepared unit (mmt_unit) */
    pl->n_units = (T + U - 1) / U;
    LOOM_RETURN_IF(loom__mul_overflow_size(pl->x_stride, (size_t)pl->n_units, &pl->act_bytes),
                   LOOM_ERR_INVALID_ARG, "matmul: %lld prepared activation rows overflow",
                   (long long)T);
    pl->rb = mmq_rows_per_group(w_row);
    /* Scratch holds one unit's rounded activation rows while preparing, then a group of
     * prepared weight rows where the kernels prepare them. */
    size_t scratch_bytes = (size_t)U * pl->act_stride;
    if (pl->prepared) {
        const size_t group = (size_t)pl->rb * k->w_row_bytes(K);
        if (group > scratch_bytes) scratch_bytes = group;
        pl->t_block = pl->step * (int64_t)(MMT_BLOCK_BYTES / ((size_t)pl->step * pl->x_stride));
        if (pl->t_block < pl->step) pl->t_block = pl->step;
    }
    pl->scratch_floats = (scratch_bytes + sizeof(float) - 1) / sizeof(float);
    return LOOM_OK;
}

/* The plan of a matmul of x [T, K] (T >= 1) over weights of type w_type. */
static loom_status mm_plan_make(bool f32_activations, loom_type w_type, int64_t K, int64_t T,
                                mm_plan *pl) {
    memset(pl, 0, sizeof *pl);
    if (w_type == LOOM_TYPE_FP8_E4M3_ROWS) {
        pl->path = MM_PATH_FP8;
        pl->rb = mm_rows_per_group(K);
#if defined(LOOM_CPU_FP8_IN_PLACE)
        pl->in_place = T <= MM8_IN_PLACE_TOKENS;
#endif
        if (!pl->in_place) pl->scratch_floats = (size_t)(pl->rb * K);
        return LOOM_OK;
    }
    if (f32_activations || w_type == LOOM_TYPE_F32) {
        pl->path = MM_PATH_F32;
        pl->rb = mm_rows_per_group(K);
        if (w_type != LOOM_TYPE_F32) pl->scratch_floats = (size_t)(pl->rb * K);
        return LOOM_OK;
    }
    size_t w_row;
    LOOM_RETURN_IF(!loom__vec_dot_type(w_type, &pl->act_type), LOOM_ERR_UNSUPPORTED,
                   "matmul: no activation format for weights of type %s", loom__type_name(w_type));
    /* K is a whole number of w's blocks, hence of the activation format's (32 or 256, or 1). */
    LOOM_RETURN_IF(!loom__type_row_bytes(pl->act_type, K, &pl->act_row) ||
                       !loom__type_row_bytes(w_type, K, &w_row),
                   LOOM_ERR_INVALID_ARG, "matmul: K = %lld is not a whole number of %s blocks",
                   (long long)K, loom__type_name(pl->act_type));
    pl->lanes = loom__qgemm_lanes_get(w_type);
    if (pl->lanes && T >= MML_MIN_TOKENS) return mm_plan_tiles(pl, K, T, w_row);
    pl->lanes = NULL;
    pl->k = loom__qgemm_get(w_type);
    if (pl->k && T >= pl->k->min_tokens) return mm_plan_tiles(pl, K, T, w_row);
    pl->k = NULL;

    pl->path = MM_PATH_ROWS;
    bool overflow = loom__add_overflow_size(pl->act_row, MMQ_ROW_ALIGN - 1, &pl->act_stride);
    pl->act_stride -= pl->act_stride % MMQ_ROW_ALIGN;
    overflow = overflow || loom__mul_overflow_size(pl->act_stride, (size_t)T, &pl->act_bytes);
    LOOM_RETURN_IF(overflow, LOOM_ERR_INVALID_ARG, "matmul: %lld rounded activation rows overflow",
                   (long long)T);
    pl->rb = mmq_rows_per_group(w_row);
    return LOOM_OK;
}

loom_status loom__cpu_matmul_need(bool f32_activations, loom_type w_type, int64_t K, int64_t T,
                                  size_t *scratch_floats, size_t *act_bytes) {
    mm_plan pl;
    LOOM_TRY(mm_plan_make(f32_activations, w_type, K, T, &pl));
    *scratch_floats = pl.scratch_floats;
    *act_bytes = pl.act_bytes;
    return LOOM_OK;
}

/* ------------------------------------------------------------------------------------------ */
/* Runs                                                                                       */
/* ------------------------------------------------------------------------------------------ */

static loom_status mm_run_f32(loom__cpu_ctx *c, const loom_tensor *w, const loom_tensor *x,
                              loom_tensor *out, const mm_plan *pl) {
    mm_task task = {.c = c, .w = w, .x = x, .out = out, .rb = pl->rb};
    if (pl->scratch_floats > 0) LOOM_TRY(loom__cpu_reserve_scratch(c, pl->scratch_floats));
    LOOM_TRY(mm_share(c, (w->ne[1] + task.rb - 1) / task.rb));
    loom__threadpool_run(c->tp, mm_worker, &task);
    return LOOM_OK;
}

static loom_status mm_run_fp8(loom__cpu_ctx *c, mm_set *set, const loom_tensor *x,
                              const mm_plan *pl) {
    mm8_task task = {.c = c, .set = set, .x = x, .rb = pl->rb, .in_place = pl->in_place};
    if (pl->scratch_floats > 0) LOOM_TRY(loom__cpu_reserve_scratch(c, pl->scratch_floats));
    LOOM_TRY(mm_set_share(c, set, 1, pl->rb));
    loom__threadpool_run(c->tp, mm8_worker, &task);
    return LOOM_OK;
}

static loom_status mm_run_tiles(loom__cpu_ctx *c, mm_set *set, const loom_tensor *x,
                                const mm_plan *pl) {
    const int64_t T = x->ne[1];
    mmt_task task = {.set = set,
                     .x = x,
                     .c = c,
                     .k = pl->lanes ? NULL : pl->k,
                     .prepared = pl->prepared,
                     .lanes = pl->lanes,
                     .quant = loom__quantize_activations_get(pl->act_type),
                     .x_stride = pl->x_stride,
                     .act_stride = pl->act_stride,
                     .step = pl->step,
                     .rb = pl->rb,
                     .t_block = pl->t_block};
    LOOM_RETURN_IF(!task.quant, LOOM_ERR_INTERNAL, "cpu: matmul: no quantizer for format %d",
                   (int)pl->act_type);
    LOOM_TRY(loom__cpu_reserve_act(c, pl->act_bytes));
    task.xp = c->act;
    LOOM_TRY(loom__cpu_reserve_scratch(c, pl->scratch_floats));
    if (pl->n_units == 1)
        mmt_prepare_worker(&task, 0, 1); /* one unit: not worth waking the pool */
    else
        loom__threadpool_run(c->tp, mmt_prepare_worker, &task);
    const int64_t t_block = mmt_t_block(&task);
    LOOM_TRY(mm_set_share(c, set, (T + t_block - 1) / t_block, task.rb));
    loom__threadpool_run(c->tp, mmt_worker, &task);
    return LOOM_OK;
}

/* The set's weights are all of one type (so of one activation format and one path). */
static loom_status mm_run_quant(loom__cpu_ctx *c, mm_set *set, const loom_tensor *x,
                                const mm_plan *pl) {
    if (pl->path == MM_PATH_TILES) return mm_run_tiles(c, set, x, pl);
    const int64_t T = x->ne[1];
    LOOM_TRY(loom__cpu_reserve_act(c, pl->act_bytes));
    mmq_task task = {.share = c->share,
                     .set = set,
                     .x = x,
                     .quant = loom__quantize_activations_get(pl->act_type),
                     .dot = loom__vec_dot_q_get(set->w[0]->type),
                     .act = c->act,
                     .act_stride = pl->act_stride,
                     .rb = pl->rb};
    LOOM_RETURN_IF(!task.quant || !task.dot, LOOM_ERR_INTERNAL,
                   "cpu: matmul: no kernels for weight type %s", loom__type_name(set->w[0]->type));
    if (T == 1)
        mmq_quant_worker(&task, 0, 1); /* one row: not worth waking the pool */
    else
        loom__threadpool_run(c->tp, mmq_quant_worker, &task);
    LOOM_TRY(mm_set_share(c, set, 1, pl->rb));
    loom__threadpool_run(c->tp, mmq_worker, &task);
    return LOOM_OK;
}

/* ------------------------------------------------------------------------------------------ */
/* Entry                                                                                      */
/* ------------------------------------------------------------------------------------------ */

/* The checks every matmul's arguments pass. */
static loom_status mm_check(const loom_tensor *w, const loom_tensor *x, const loom_tensor *out) {
    return loom__check_matmul("cpu", w, x, out);
}

loom_status loom__cpu_matmul(void *ctx, const loom_tensor *w, const loom_tensor *x,
                             loom_tensor *out) {
    loom__cpu_ctx *c = ctx;
    LOOM_TRY(mm_check(w, x, out));
    if (x->ne[1] == 0) return LOOM_OK;

    mm_plan pl;
    LOOM_TRY(mm_plan_make(c->f32_activations, w->type, w->ne[0], x->ne[1], &pl));
    if (pl.path == MM_PATH_F32) return mm_run_f32(c, w, x, out, &pl);
    mm_set set = {.n = 1, .w = {w}, .out = {out}};
    if (pl.path == MM_PATH_FP8) return mm_run_fp8(c, &set, x, &pl);
    return mm_run_quant(c, &set, x, &pl);
}

/* Weights of one type run as one set: x rounded and prepared once, one parallel run over all
 * their groups (FP8 rows too: one run). Mixed types (a Q4_K_M file's Q6_K v beside Q4_K q and
 * k) and float32 activations fall back to one matmul each. Every out gets the bits of its own
 * matmul either way: the arithmetic per (row, token) is the same whichever set the row's group is
 * in. */
loom_status loom__cpu_matmul_multi(void *ctx, int n, const loom_tensor *const *ws,
                                   const loom_tensor *x, loom_tensor *const *outs) {
    loom__cpu_ctx *c = ctx;
    LOOM_TRY(loom__check_matmul_multi("cpu", n, ws, x, outs));
    bool same_type = true;
    for (int j = 0; j < n; j++) same_type = same_type && ws[j]->type == ws[0]->type;
    if (x->ne[1] == 0) return LOOM_OK;

    const bool fp8 = same_type && ws[0]->type == LOOM_TYPE_FP8_E4M3_ROWS;
    if (n == 1 || !same_type || (!fp8 && (c->f32_activations || ws[0]->type == LOOM_TYPE_F32))) {
        for (int j = 0; j < n; j++) LOOM_TRY(loom__cpu_matmul(ctx, ws[j], x, outs[j]));
        return LOOM_OK;
    }
    mm_plan pl;
    LOOM_TRY(mm_plan_make(false, ws[0]->type, x->ne[0], x->ne[1], &pl));
    mm_set set = {.n = n};
    for (int j = 0; j < n; j++) {
        set.w[j] = ws[j];
        set.out[j] = outs[j];
    }
    if (pl.path == MM_PATH_FP8) return mm_run_fp8(c, &set, x, &pl);
    return mm_run_quant(c, &set, x, &pl);
}
