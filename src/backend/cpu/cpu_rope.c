/* cpu_rope.c — rotary position embedding, in place, parallel over tokens.
 *
 * For head element pair i (0 <= i < n_rot/2) the angle is
 *     theta_i = pos * freq_scale * theta_base^(-2i/n_rot)   [/ freq_factors[i] when given]
 * and the pair is rotated by it: (a, b) -> (a cos - b sin, a sin + b cos). The pair is
 * (x[2i], x[2i+1]) in NORMAL mode and (x[i], x[i + n_rot/2]) in NEOX mode; elements at and
 * beyond n_rot in each head are left alone.
 *
 * Angles, cosines and sines are computed in double and rounded to float once: positions reach
 * 10^5..10^6 and a float angle of that size has an error of several milliradians, which
 * float-only code would pass straight into q and k. The rotation itself is float. A token's
 * result depends only on its position, never on the batch. */
#include "backend/cpu/cpu_internal.h"

#include "core/alloc.h"
#include "core/checked.h"
#include "core/status.h"
#include "tensor/types.h"

#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* Largest n_rot supported (the frequency table of a call lives on the stack). */
#define ROPE_MAX_ROT 1024

/* ------------------------------------------------------------------------------------------ */
/* Tables of cosines and sines                                                                */
/* ------------------------------------------------------------------------------------------ */

/* Every layer of a step rotates q and k at the same positions with the same frequencies (or
 * with one of two sets, where layers alternate bases as Gemma 3's do), so a call keeps its
 * cos/sin table and the next calls with the same positions and frequencies reuse it instead of
 * recomputing T * n_rot/2 double cosines and sines (and n_rot/2 powers) each: 60 times per
 * token on a 30-layer model. A table is a pure function of its key, so reuse changes no bit. */
#define ROPE_TABLES 2

struct loom__cpu_rope_tables {
    struct rope_table {
        /* key: the frequencies and the positions */
        int n_rot;
        float theta_base, freq_scale;
        bool has_factors;
        float factors[ROPE_MAX_ROT / 2];
        int64_t n_pos;
        int32_t *pos; /* [n_pos] */
        /* value: [n_pos][n_rot/2] */
        float *cs, *sn;
        size_t cap, pos_cap; /* entries cs and sn hold; entries pos holds */
        uint64_t used;       /* last use, for replacement */
    } t[ROPE_TABLES];
    uint64_t clock;
};

void loom__cpu_rope_tables_free(loom__cpu_rope_tables *rt) {
    if (rt == NULL) return;
    for (int i = 0; i < ROPE_TABLES; i++) {
        free(rt->t[i].pos);
        free(rt->t[i].cs);
        free(rt->t[i].sn);
    }
    free(rt);
}

size_t loom__cpu_rope_tables_bytes(int64_t n_pos, int n_rot) {
    if (n_pos <= 0 || n_rot < 2) return 0;
    const size_t half = (size_t)(n_rot / 2);
    return ROPE_TABLES *
           ((size_t)n_pos * sizeof(int32_t) + 2 * (size_t)n_pos * half * sizeof(float));
}

loom_status loom__cpu_rope_tables_create(int64_t n_pos, int n_rot, loom__cpu_rope_tables **out) {
    loom__cpu_rope_tables *rt = loom__calloc(1, sizeof *rt);
    LOOM_RETURN_IF(rt == NULL, LOOM_ERR_OUT_OF_MEMORY, "rope: out of memory");
    const size_t half = n_rot >= 2 ? (size_t)(n_rot / 2) : 0;
    if (n_pos > 0 && half > 0 && n_rot <= ROPE_MAX_ROT) {
        size_t need;
        if (loom__mul_overflow_size((size_t)n_pos, half, &need) ||
            need > SIZE_MAX / sizeof(float)) {
            free(rt);
            return loom__fail(LOOM_ERR_INVALID_ARG, "rope: a table of %lld x %zu overflows",
                              (long long)n_pos, half);
        }
        for (int i = 0; i < ROPE_TABLES; i++) {
            struct rope_table *t = &rt->t[i];
            t->pos = loom__malloc((size_t)n_pos * sizeof(int32_t));
            t->cs = loom__malloc(need * sizeof(float));
            t->sn = loom__malloc(need * sizeof(float));
            if (t->pos == NULL || t->cs == NULL || t->sn == NULL) {
                loom__cpu_rope_tables_free(rt);
                return loom__fail(LOOM_ERR_OUT_OF_MEMORY,
                                  "rope: out of memory for tables of %lld positions",
                                  (long long)n_pos);
            }
            t->pos_cap = (size_t)n_pos;
            t->cap = need;
            /* no key yet: n_rot 0 matches nothing */
        }
    }
    *out = rt;
    return LOOM_OK;
}

static bool table_matches(const struct rope_table *t, const loom_rope_params *p, const int32_t *pos,
                          int64_t n) {
    if (t->n_pos == 0 || t->n_rot != p->n_rot || t->theta_base != p->theta_base ||
        t->freq_scale != p->freq_scale || t->has_factors != (p->freq_factors != NULL) ||
        t->n_pos != n)
        return false;
    if (p->freq_factors != NULL &&
        memcmp(t->factors, p->freq_factors, (size_t)(p->n_rot / 2) * sizeof(float)) != 0)
        return false;
    return memcmp(t->pos, pos, (size_t)n * sizeof(int32_t)) == 0;
}

typedef struct table_task {
    struct rope_table *t;
    const double *inv_freq; /* [n_rot/2] */
} table_task;

/* Angles in double, rounded to float once (see the top of the file). */
static void table_worker(void *arg, int ith, int nth) {
    const table_task *a = arg;
    struct rope_table *t = a->t;
    const int half = t->n_rot / 2;
    int64_t r0, r1;
    loom__split_range(t->n_pos, ith, nth, &r0, &r1);
    for (int64_t r = r0; r < r1; r++)
        for (int i = 0; i < half; i++) {
            const double theta = (double)t->pos[r] * a->inv_freq[i];
            t->cs[r * half + i] = (float)cos(theta);
            t->sn[r * half + i] = (float)sin(theta);
        }
}

/* The table for (p, pos[0..n)): found, or computed into the least recently used slot. */
static loom_status rope_table_get(loom__cpu_ctx *c, const loom_rope_params *p, const int32_t *pos,
                                  int64_t n, const struct rope_table **out) {
    if (c->rope == NULL) {
        LOOM_TRY(loom__cpu_rope_tables_create(0, 0, &c->rope));
        c->n_grows++;
    }
    loom__cpu_rope_tables *rt = c->rope;
    rt->clock++;
    struct rope_table *t = &rt->t[0];
    for (int i = 0; i < ROPE_TABLES; i++) {
        if (table_matches(&rt->t[i], p, pos, n)) {
            rt->t[i].used = rt->clock;
            *out = &rt->t[i];
            return LOOM_OK;
        }
        if (rt->t[i].used < t->used) t = &rt->t[i];
    }

    const int half = p->n_rot / 2;
    size_t need, bytes; /* need >= n: half >= 1 */
    LOOM_RETURN_IF(loom__mul_overflow_size((size_t)n, (size_t)half, &need) ||
                       loom__mul_overflow_size(need, sizeof(float), &bytes),
                   LOOM_ERR_INVALID_ARG, "rope: a table of %lld x %d overflows", (long long)n,
                   half);
    if ((size_t)n > t->pos_cap) {
        int32_t *np = loom__malloc((size_t)n * sizeof(int32_t));
        LOOM_RETURN_IF(np == NULL, LOOM_ERR_OUT_OF_MEMORY, "rope: out of memory for %lld positions",
                       (long long)n);
        c->n_grows++;
        free(t->pos);
        t->pos = np;
        t->pos_cap = (size_t)n;
        t->n_pos = 0; /* the key no longer matches anything */
    }
    if (need > t->cap) {
        float *ncs = loom__malloc(bytes), *nsn = loom__malloc(bytes);
        if (ncs == NULL || nsn == NULL) {
            free(ncs);
            free(nsn);
            return loom__fail(LOOM_ERR_OUT_OF_MEMORY, "rope: out of memory for a %lld x %d table",
                              (long long)n, half);
        }
        c->n_grows++;
        free(t->cs);
        free(t->sn);
        t->cs = ncs;
        t->sn = nsn;
        t->cap = need;
    }
    t->n_rot = p->n_rot;
    t->theta_base = p->theta_base;
    t->freq_scale = p->freq_scale;
    t->has_factors = p->freq_factors != NULL;
    if (t->has_factors) memcpy(t->factors, p->freq_factors, (size_t)half * sizeof(float));
    t->n_pos = n;
    memcpy(t->pos, pos, (size_t)n * sizeof(int32_t));
    t->used = rt->clock;

    double inv_freq[ROPE_MAX_ROT / 2]; /* freq_scale * base^(-2i/n_rot) / factor_i */
    for (int i = 0; i < half; i++) {
        double f = (double)p->freq_scale * pow((double)p->theta_base, -2.0 * i / p->n_rot);
        if (p->freq_factors != NULL) f /= (double)p->freq_factors[i];
        inv_freq[i] = f;
    }
    table_task task = {.t = t, .inv_freq = inv_freq};
    if (n == 1 || c->n_threads == 1)
        table_worker(&task, 0, 1);
    else
        loom__threadpool_run(c->tp, table_worker, &task);
    *out = t;
    return LOOM_OK;
}

/* ------------------------------------------------------------------------------------------ */
/* Rotation                                                                                   */
/* ------------------------------------------------------------------------------------------ */

typedef struct rope_task {
    loom_tensor *x;                 /* [T, n_head*head_dim] f32, rotated in place */
    const struct rope_table *table; /* the T positions' cosines and sines */
    const loom_rope_params *p;
} rope_task;

static void rope_worker(void *arg, int ith, int nth) {
    const rope_task *t = arg;
    const loom_rope_params *p = t->p;
    const int half = p->n_rot / 2;
    /* NORMAL pairs neighbours; NEOX pairs the two halves of the rotated part. */
    const int stride = p->mode == LOOM_ROPE_NORMAL ? 2 : 1;
    const int offset = p->mode == LOOM_ROPE_NORMAL ? 1 : half;
    int64_t r0, r1;
    loom__split_range(t->x->ne[1], ith, nth, &r0, &r1);
    for (int64_t r = r0; r < r1; r++) {
        const float *cs = t->table->cs + r * half, *sn = t->table->sn + r * half;
        float *row = loom__cpu_row(t->x, r);
        for (int h = 0; h < p->n_head; h++) {
            float *x = row + (int64_t)h * p->head_dim;
            for (int i = 0; i < half; i++) {
                float *a = x + i * stride, *b = a + offset;
                float x0 = *a, x1 = *b;
                *a = x0 * cs[i] - x1 * sn[i];
                *b = x0 * sn[i] + x1 * cs[i];
            }
        }
    }
}

/* The CPU's own part of rope's checks: its table size, and the frequency factors' values
 * (host memory here). The rest is tensor/op_check.c's. */
static loom_status rope_check_params(const loom_tensor *x, const loom_tensor *pos,
                                     const loom_rope_params *p) {
    LOOM_TRY(loom__check_rope(x, pos, p));
    LOOM_RETURN_IF(p->n_rot > ROPE_MAX_ROT, LOOM_ERR_UNSUPPORTED,
                   "rope: n_rot %d exceeds the cpu backend's %d", p->n_rot, ROPE_MAX_ROT);
    if (p->freq_factors != NULL)
        for (int i = 0; i < p->n_rot / 2; i++)
            LOOM_RETURN_IF(!(p->freq_factors[i] > 0.0f) || !isfinite(p->freq_factors[i]),
                           LOOM_ERR_INVALID_ARG,
                           "rope: freq_factors[%d] = %g must be finite and > 0", i,
                           (double)p->freq_factors[i]);
    return LOOM_OK;
}

loom_status loom__cpu_rope(void *ctx, loom_tensor *x, const loom_tensor *pos,
                           const loom_rope_params *p) {
    loom__cpu_ctx *c = ctx;
    LOOM_TRY(rope_check_params(x, pos, p));
    if (x->ne[1] == 0) return LOOM_OK;

    const struct rope_table *table = NULL;
    LOOM_TRY(rope_table_get(c, p, pos->data, x->ne[1], &table));
    rope_task t = {.x = x, .table = table, .p = p};
    if (x->ne[1] == 1 || c->n_threads == 1)
        rope_worker(&t, 0, 1); /* one token: not worth waking the pool */
    else
        loom__threadpool_run(c->tp, rope_worker, &t);
    return LOOM_OK;
}
