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

#include "core/status.h"
#include "tensor/types.h"

#include <math.h>
#include <stdint.h>

/* Largest n_rot supported (per-call tables live on the stack). */
#define ROPE_MAX_ROT 1024

typedef struct rope_task {
    loom_tensor *x;     /* [T, n_head*head_dim] f32, rotated in place */
    const int32_t *pos; /* [T] */
    const loom_rope_params *p;
} rope_task;

static void rope_worker(void *arg, int ith, int nth) {
    const rope_task *t = arg;
    const loom_rope_params *p = t->p;
    const int half = p->n_rot / 2;
    double inv_freq[ROPE_MAX_ROT / 2]; /* freq_scale * base^(-2i/n_rot) / factor_i */
    float cs[ROPE_MAX_ROT / 2], sn[ROPE_MAX_ROT / 2];
    for (int i = 0; i < half; i++) {
        double f = (double)p->freq_scale * pow((double)p->theta_base, -2.0 * i / p->n_rot);
        if (p->freq_factors != NULL) f /= (double)p->freq_factors[i];
        inv_freq[i] = f;
    }

    int64_t r0, r1;
    loom__split_range(t->x->ne[1], ith, nth, &r0, &r1);
    for (int64_t r = r0; r < r1; r++) {
        for (int i = 0; i < half; i++) {
            double theta = (double)t->pos[r] * inv_freq[i];
            cs[i] = (float)cos(theta);
            sn[i] = (float)sin(theta);
        }
        float *row = loom__cpu_row(t->x, r);
        for (int h = 0; h < p->n_head; h++) {
            float *x = row + (int64_t)h * p->head_dim;
            /* NORMAL pairs neighbours; NEOX pairs the two halves of the rotated part. */
            const int stride = p->mode == LOOM_ROPE_NORMAL ? 2 : 1;
            const int offset = p->mode == LOOM_ROPE_NORMAL ? 1 : half;
            for (int i = 0; i < half; i++) {
                float *a = x + i * stride, *b = a + offset;
                float x0 = *a, x1 = *b;
                *a = x0 * cs[i] - x1 * sn[i];
                *b = x0 * sn[i] + x1 * cs[i];
            }
        }
    }
}

static loom_status rope_check_params(const loom_tensor *x, const loom_rope_params *p) {
    LOOM_RETURN_IF(p == NULL, LOOM_ERR_INVALID_ARG, "rope: params are NULL");
    LOOM_RETURN_IF(p->mode != LOOM_ROPE_NORMAL && p->mode != LOOM_ROPE_NEOX, LOOM_ERR_INVALID_ARG,
                   "rope: unknown mode %d", (int)p->mode);
    LOOM_RETURN_IF(p->n_head < 1 || p->head_dim < 1, LOOM_ERR_INVALID_ARG,
                   "rope: n_head %d and head_dim %d must be >= 1", p->n_head, p->head_dim);
    LOOM_RETURN_IF(p->n_rot < 2 || p->n_rot % 2 != 0 || p->n_rot > p->head_dim,
                   LOOM_ERR_INVALID_ARG, "rope: n_rot %d must be even and in [2, head_dim=%d]",
                   p->n_rot, p->head_dim);
    LOOM_RETURN_IF(p->n_rot > ROPE_MAX_ROT, LOOM_ERR_UNSUPPORTED,
                   "rope: n_rot %d exceeds the cpu backend's %d", p->n_rot, ROPE_MAX_ROT);
    LOOM_RETURN_IF((int64_t)p->n_head * p->head_dim != x->ne[0], LOOM_ERR_INVALID_ARG,
                   "rope: x rows have %lld elements but n_head*head_dim = %d*%d",
                   (long long)x->ne[0], p->n_head, p->head_dim);
    LOOM_RETURN_IF(!(p->theta_base > 0.0f) || !isfinite(p->theta_base), LOOM_ERR_INVALID_ARG,
                   "rope: theta_base %g must be finite and > 0", (double)p->theta_base);
    LOOM_RETURN_IF(!isfinite(p->freq_scale), LOOM_ERR_INVALID_ARG,
                   "rope: freq_scale %g is not finite", (double)p->freq_scale);
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
    loom_cpu_ctx *c = ctx;
    LOOM_TRY(loom__cpu_check_f32("rope", "x", x));
    LOOM_TRY(rope_check_params(x, p));
    LOOM_RETURN_IF(pos == NULL, LOOM_ERR_INVALID_ARG, "rope: pos is NULL");
    LOOM_RETURN_IF(pos->type != LOOM_TYPE_I32, LOOM_ERR_UNSUPPORTED,
                   "rope: pos must be i32, got %s", loom_type_name(pos->type));
    LOOM_RETURN_IF(pos->ne[0] != x->ne[1] || pos->ne[1] != 1, LOOM_ERR_INVALID_ARG,
                   "rope: pos is [%lld, %lld] but must be one row of T=%lld positions",
                   (long long)pos->ne[1], (long long)pos->ne[0], (long long)x->ne[1]);
    if (x->ne[1] == 0) return LOOM_OK;
    LOOM_RETURN_IF(pos->data == NULL || (uintptr_t)pos->data % 4 != 0, LOOM_ERR_INVALID_ARG,
                   "rope: pos data is NULL or misaligned");

    rope_task t = {.x = x, .pos = pos->data, .p = p};
    if (x->ne[1] == 1 || c->n_threads == 1)
        rope_worker(&t, 0, 1); /* one token: not worth waking the pool */
    else
        loom__threadpool_run(c->tp, rope_worker, &t);
    return LOOM_OK;
}
