/* cpu_elementwise.c — the CPU's row-wise and element-wise ops: get_rows, rms_norm (parallel
 * over rows) and glu, add, scale (parallel over elements, so a single long row —
 * a decode step's FFN activation — still uses every thread).
 *
 * Every output element is computed by the same code whatever the split, so results do not
 * depend on the thread count. Small ops run on the calling thread alone: waking the pool
 * costs more than they do. The GLU activations come from cpu_vmath.h, whose vector and scalar
 * versions give the same bits, so they do not depend on where a row or a split ends either. */

/* Before any include: cpu_vmath.h's scalar code must round each operation as its vector code
 * does (GCC does not contract in ISO C mode; clang would without this). */
#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#endif

#include "backend/cpu/cpu_internal.h"
#include "backend/cpu/cpu_vec.h"
#include "backend/cpu/cpu_vmath.h"

#include "core/status.h"
#include "tensor/types.h"

#include <math.h>
#include <stdint.h>

/* Below this many output elements an op runs on the calling thread only. */
#define EW_INLINE_ELEMS 8192

static void ew_dispatch(loom__cpu_ctx *c, int64_t n_elems, loom__task_fn fn, void *arg) {
    if (n_elems < EW_INLINE_ELEMS || c->n_threads == 1)
        fn(arg, 0, 1);
    else
        loom__threadpool_run(c->tp, fn, arg);
}

/* ------------------------------------------------------------------------------------------ */
/* Element-wise: glu, add, scale                                                              */
/* ------------------------------------------------------------------------------------------ */

typedef enum ew_kind { EW_SWIGLU, EW_GEGLU_TANH, EW_ADD, EW_SCALE } ew_kind;

typedef struct ew_task {
    ew_kind kind;
    const loom_tensor *a; /* [R, C]: gate (glu), a (add), x (scale) */
    const loom_tensor *b; /* [R, C] or [1, C] (add): up (glu), b (add); unused by scale */
    loom_tensor *out;     /* [R, C]; may be the same memory as a */
    float s;              /* scale factor */
} ew_task;

/* o[c] = act(x[c]) * u[c], c in [0, n): whole vectors, then the tail one element at a time
 * (the same bits, so the split point does not matter). */
static void ew_swiglu(const float *x, const float *u, float *o, int64_t n) {
    int64_t c = 0;
#if defined(LOOM_VM_AVX512)
    for (; c + 16 <= n; c += 16)
        _mm512_storeu_ps(
            o + c, _mm512_mul_ps(loom__vm_silu16(_mm512_loadu_ps(x + c)), _mm512_loadu_ps(u + c)));
#elif defined(LOOM_VM_AVX2)
    for (; c + 8 <= n; c += 8)
        _mm256_storeu_ps(
            o + c, _mm256_mul_ps(loom__vm_silu8(_mm256_loadu_ps(x + c)), _mm256_loadu_ps(u + c)));
#endif
    for (; c < n; c++) o[c] = loom__vm_silu(x[c]) * u[c];
}

static void ew_geglu_tanh(const float *x, const float *u, float *o, int64_t n) {
    int64_t c = 0;
#if defined(LOOM_VM_AVX512)
    for (; c + 16 <= n; c += 16)
        _mm512_storeu_ps(o + c, _mm512_mul_ps(loom__vm_gelu_tanh16(_mm512_loadu_ps(x + c)),
                                              _mm512_loadu_ps(u + c)));
#elif defined(LOOM_VM_AVX2)
    for (; c + 8 <= n; c += 8)
        _mm256_storeu_ps(o + c, _mm256_mul_ps(loom__vm_gelu_tanh8(_mm256_loadu_ps(x + c)),
                                              _mm256_loadu_ps(u + c)));
#endif
    for (; c < n; c++) o[c] = loom__vm_gelu_tanh(x[c]) * u[c];
}

/* Columns [c0, c1) of row r. */
static void ew_segment(const ew_task *t, int64_t r, int64_t c0, int64_t c1) {
    const float *x = loom__cpu_row(t->a, r);
    float *o = loom__cpu_row(t->out, r);
    switch (t->kind) {
    case EW_SWIGLU: {
        const float *u = loom__cpu_row(t->b, r);
        ew_swiglu(x + c0, u + c0, o + c0, c1 - c0);
        break;
    }
    case EW_GEGLU_TANH: {
        const float *u = loom__cpu_row(t->b, r);
        ew_geglu_tanh(x + c0, u + c0, o + c0, c1 - c0);
        break;
    }
    case EW_ADD: {
        const float *y = loom__cpu_row(t->b, t->b->ne[1] == 1 ? 0 : r);
        for (int64_t c = c0; c < c1; c++) o[c] = x[c] + y[c];
        break;
    }
    case EW_SCALE:
        for (int64_t c = c0; c < c1; c++) o[c] = x[c] * t->s;
        break;
    }
}

static void ew_worker(void *p, int ith, int nth) {
    const ew_task *t = p;
    const int64_t C = t->out->ne[0];
    int64_t e, e1;
    loom__split_range(t->out->ne[1] * C, ith, nth, &e, &e1);
    while (e < e1) { /* the flat range [e, e1) as per-row column segments */
        int64_t r = e / C, c0 = e % C;
        int64_t c1 = c0 + (e1 - e) < C ? c0 + (e1 - e) : C;
        ew_segment(t, r, c0, c1);
        e += c1 - c0;
    }
}

static loom_status ew_run(loom__cpu_ctx *c, ew_task *t) {
    if (t->out->ne[1] == 0) return LOOM_OK;
    ew_dispatch(c, t->out->ne[0] * t->out->ne[1], ew_worker, t);
    return LOOM_OK;
}

loom_status loom__cpu_glu(void *ctx, const loom_tensor *gate, const loom_tensor *up,
                          loom_glu_kind kind, loom_tensor *out) {
    LOOM_TRY(loom__check_glu(gate, up, kind, out));
    ew_task t = {.kind = kind == LOOM_GLU_SWIGLU ? EW_SWIGLU : EW_GEGLU_TANH,
                 .a = gate,
                 .b = up,
                 .out = out};
    return ew_run(ctx, &t);
}

loom_status loom__cpu_add(void *ctx, const loom_tensor *a, const loom_tensor *b, loom_tensor *out) {
    LOOM_TRY(loom__check_add(a, b, out));
    ew_task t = {.kind = EW_ADD, .a = a, .b = b, .out = out};
    return ew_run(ctx, &t);
}

loom_status loom__cpu_scale(void *ctx, const loom_tensor *x, float s, loom_tensor *out) {
    LOOM_TRY(loom__check_scale(x, out));
    ew_task t = {.kind = EW_SCALE, .a = x, .out = out, .s = s};
    return ew_run(ctx, &t);
}

/* ------------------------------------------------------------------------------------------ */
/* Row-wise: rms_norm, get_rows                                                               */
/* ------------------------------------------------------------------------------------------ */

typedef enum row_kind { ROW_RMS_NORM, ROW_GET_ROWS } row_kind;

typedef struct row_task {
    row_kind kind;
    const loom_tensor *x; /* [R, D] f32 input, or the table [V, D] (get_rows) */
    const loom_tensor *w; /* [1, D] f32 norm weight, or NULL */
    const int32_t *ids;   /* [R] validated row ids (get_rows) */
    loom_tensor *out;     /* [R, D] f32 */
    float eps;
} row_task;

/* out = x / sqrt(mean(x^2) + eps) * w. The whole row is read before any write, so out may be
 * the same row as x. */
static void row_rms_norm(const row_task *t, int64_t r) {
    const int64_t D = t->x->ne[0];
    const float *x = loom__cpu_row(t->x, r);
    float *o = loom__cpu_row(t->out, r);
    float ms = loom__cpu_dot(x, x, D) / (float)D;
    float inv = 1.0f / sqrtf(ms + t->eps);
    if (t->w != NULL) {
        const float *w = t->w->data;
        for (int64_t i = 0; i < D; i++) o[i] = x[i] * inv * w[i];
    } else {
        for (int64_t i = 0; i < D; i++) o[i] = x[i] * inv;
    }
}

static void row_worker(void *p, int ith, int nth) {
    const row_task *t = p;
    int64_t r0, r1;
    loom__split_range(t->out->ne[1], ith, nth, &r0, &r1);
    for (int64_t r = r0; r < r1; r++) {
        switch (t->kind) {
        case ROW_RMS_NORM:
            row_rms_norm(t, r);
            break;
        case ROW_GET_ROWS:
            /* type and width validated; the row is written whole */
            (void)loom__cpu_row_to_f32(t->x->type, loom__cpu_row(t->x, t->ids[r]),
                                       loom__cpu_row(t->out, r), t->x->ne[0]);
            break;
        }
    }
}

static loom_status row_run(loom__cpu_ctx *c, row_task *t) {
    if (t->out->ne[1] == 0) return LOOM_OK;
    ew_dispatch(c, t->out->ne[0] * t->out->ne[1], row_worker, t);
    return LOOM_OK;
}

loom_status loom__cpu_rms_norm(void *ctx, const loom_tensor *x, const loom_tensor *w, float eps,
                               loom_tensor *out) {
    LOOM_TRY(loom__check_rms_norm(x, w, eps, out));
    row_task t = {.kind = ROW_RMS_NORM, .x = x, .w = w, .out = out, .eps = eps};
    return row_run(ctx, &t);
}

loom_status loom__cpu_get_rows(void *ctx, const loom_tensor *table, const loom_tensor *ids,
                               loom_tensor *out) {
    LOOM_TRY(loom__check_get_rows("cpu", table, ids, out));
    const int32_t *id = ids->data;
    /* Every id is checked before anything is written. */
    for (int64_t i = 0; i < ids->ne[0]; i++)
        LOOM_RETURN_IF(id[i] < 0 || id[i] >= table->ne[1], LOOM_ERR_BAD_INPUT,
                       "get_rows: ids[%lld] = %d outside the table's %lld rows", (long long)i,
                       id[i], (long long)table->ne[1]);
    row_task t = {.kind = ROW_GET_ROWS, .x = table, .ids = id, .out = out};
    return row_run(ctx, &t);
}
