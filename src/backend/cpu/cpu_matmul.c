/* cpu_matmul.c — out[T, N] = x[T, K] · w[N, K]^T for weights of any dequantizable type.
 *
 * Work split: the N output columns (weight rows) are cut into groups of RB rows and the
 * groups are split over the threads. A thread turns a group's rows into float32 once (F32
 * rows are used in place; others are dequantized into its scratch) and then walks all T
 * tokens, so each weight row is read from memory once per call, not once per token — what
 * makes prompt processing fast — while x[t] stays in L1 across the RB dots that use it.
 *
 * Batch invariance: out[t, o] is always loom__cpu_dot(row_o, x[t], K) on the same float32
 * row (dequantization is per row, independent of T), so it has the same bits whatever T, the
 * grouping, or the thread count. A later SIMD int8 path must keep that property on its own. */
#include "backend/cpu/cpu_internal.h"
#include "backend/cpu/cpu_vec.h"

#include "core/status.h"
#include "tensor/quant.h"

#include <assert.h>
#include <stdbool.h>

/* Rows per group: as many as keep RB*K floats within MM_GROUP_FLOATS (about 256 KiB, an L2's
 * share), between 1 and MM_MAX_RB. */
#define MM_GROUP_FLOATS 65536
#define MM_MAX_RB       16

typedef struct mm_task {
    loom_cpu_ctx *c;
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
    bool ok = loom__cpu_row_to_f32(w->type, src, dst, w->ne[0]);
    assert(ok && "type and K were validated"); /* internal invariant */
    (void)ok;
    return dst;
}

static void mm_worker(void *p, int ith, int nth) {
    const mm_task *a = p;
    const int64_t K = a->w->ne[0], N = a->w->ne[1], T = a->x->ne[1], rb = a->rb;
    float *scratch = a->c->scratch[ith];
    int64_t g0, g1;
    loom__split_range((N + rb - 1) / rb, ith, nth, &g0, &g1);

    const float *rows[MM_MAX_RB];
    for (int64_t g = g0; g < g1; g++) {
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

loom_status loom__cpu_matmul(void *ctx, const loom_tensor *w, const loom_tensor *x,
                             loom_tensor *out) {
    loom_cpu_ctx *c = ctx;
    LOOM_TRY(loom__cpu_check_weight("matmul", "w", w));
    LOOM_TRY(loom__cpu_check_f32("matmul", "x", x));
    LOOM_TRY(loom__cpu_check_f32("matmul", "out", out));
    LOOM_RETURN_IF(w->ne[1] < 1, LOOM_ERR_INVALID_ARG, "matmul: w has no rows");
    LOOM_RETURN_IF(x->ne[0] != w->ne[0], LOOM_ERR_INVALID_ARG,
                   "matmul: x has %lld columns but w rows have %lld (K must match)",
                   (long long)x->ne[0], (long long)w->ne[0]);
    LOOM_RETURN_IF(out->ne[0] != w->ne[1] || out->ne[1] != x->ne[1], LOOM_ERR_INVALID_ARG,
                   "matmul: out is [%lld, %lld] but must be [T=%lld, N=%lld]",
                   (long long)out->ne[1], (long long)out->ne[0], (long long)x->ne[1],
                   (long long)w->ne[1]);
    LOOM_RETURN_IF(loom__cpu_tensors_overlap(out, x) || loom__cpu_tensors_overlap(out, w),
                   LOOM_ERR_INVALID_ARG, "matmul: out overlaps an input (no in-place matmul)");
    if (x->ne[1] == 0) return LOOM_OK;

    mm_task task = {.c = c, .w = w, .x = x, .out = out, .rb = mm_rows_per_group(w->ne[0])};
    if (w->type != LOOM_TYPE_F32)
        LOOM_TRY(loom__cpu_reserve_scratch(c, (size_t)(task.rb * w->ne[0])));
    loom__threadpool_run(c->tp, mm_worker, &task);
    return LOOM_OK;
}
