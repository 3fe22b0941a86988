/* cpu_stream.c — the CPU backend's streams: an execution context per engine or session, with
 * its own thread pool, work sharing and scratch (so two engines on one model compute at the
 * same time without sharing anything mutable), sized at creation for the largest step it will
 * run; and the stream's data movements, which for the CPU are memcpy.
 *
 * Every op runs synchronously on the calling thread plus the stream's workers, so results are
 * visible when the op returns and synchronize() has nothing to wait for. */
#include "backend/cpu/cpu_internal.h"

#include "core/alloc.h"
#include "core/checked.h"
#include "core/status.h"

#include <stdlib.h>
#include <string.h>

#define LOOM_CPU_ALIGN 64

/* Smallest per-thread scratch (floats), whatever the shape: a 4-row matmul group for K up to
 * 16384, and far more than attention, rope or norm need for any head size loom runs. */
#define LOOM_CPU_SCRATCH_MIN (4 * 16384)

static void *aligned_bytes(size_t bytes) {
    size_t rounded;
    if (bytes == 0) bytes = 1;
    if (loom__add_overflow_size(bytes, LOOM_CPU_ALIGN - 1, &rounded)) return NULL;
    rounded -= rounded % LOOM_CPU_ALIGN; /* aligned_alloc wants a multiple of the alignment */
    return loom__aligned_alloc(LOOM_CPU_ALIGN, rounded);
}

/* ------------------------------------------------------------------------------------------ */
/* Scratch                                                                                    */
/* ------------------------------------------------------------------------------------------ */

loom_status loom__cpu_reserve_scratch(loom__cpu_ctx *c, size_t n_floats) {
    if (n_floats <= c->scratch_cap) return LOOM_OK;
    size_t bytes;
    LOOM_RETURN_IF(loom__mul_overflow_size(n_floats, sizeof(float), &bytes), LOOM_ERR_INVALID_ARG,
                   "cpu: scratch of %zu floats overflows", n_floats);
    /* Allocate every new buffer before freeing any old one, so failure leaves c unchanged. */
    float **fresh = loom__calloc((size_t)c->n_threads, sizeof *fresh);
    LOOM_RETURN_IF(fresh == NULL, LOOM_ERR_OUT_OF_MEMORY, "cpu: out of memory for scratch");
    for (int i = 0; i < c->n_threads; i++) {
        fresh[i] = aligned_bytes(bytes);
        if (fresh[i] == NULL) {
            for (int j = 0; j < i; j++) free(fresh[j]);
            free(fresh);
            return loom__fail(LOOM_ERR_OUT_OF_MEMORY,
                              "cpu: out of memory for %d x %zu bytes of scratch", c->n_threads,
                              bytes);
        }
    }
    if (c->scratch != NULL)
        for (int i = 0; i < c->n_threads; i++) free(c->scratch[i]);
    if (c->ready) c->n_grows++;
    free(c->scratch);
    c->scratch = fresh;
    c->scratch_cap = n_floats;
    return LOOM_OK;
}

/* Grows one shared area (*area, *cap bytes) to n_bytes; what names it in the error. */
static loom_status reserve_area(loom__cpu_ctx *c, void **area, size_t *cap, size_t n_bytes,
                                const char *what) {
    if (n_bytes <= *cap && *area != NULL) return LOOM_OK;
    void *fresh = aligned_bytes(n_bytes);
    LOOM_RETURN_IF(fresh == NULL, LOOM_ERR_OUT_OF_MEMORY, "cpu: out of memory for %zu bytes of %s",
                   n_bytes, what);
    if (c->ready) c->n_grows++;
    free(*area);
    *area = fresh;
    *cap = n_bytes;
    return LOOM_OK;
}

loom_status loom__cpu_reserve_act(loom__cpu_ctx *c, size_t n_bytes) {
    return reserve_area(c, &c->act, &c->act_cap, n_bytes, "activation scratch");
}

loom_status loom__cpu_reserve_attn_parts(loom__cpu_ctx *c, size_t n_bytes) {
    return reserve_area(c, &c->attn_parts, &c->attn_parts_cap, n_bytes, "attention segment states");
}

/* ------------------------------------------------------------------------------------------ */
/* Sizing                                                                                     */
/* ------------------------------------------------------------------------------------------ */

static size_t max_size(size_t a, size_t b) {
    return a > b ? a : b;
}

loom_status loom__cpu_workspace_plan(int n_threads, bool f32_activations, const loom_step_shape *sh,
                                     loom__cpu_workspace *out) {
    memset(out, 0, sizeof *out);
    out->scratch_floats = LOOM_CPU_SCRATCH_MIN;
    if (sh == NULL) return LOOM_OK;
    LOOM_RETURN_IF(sh->max_tokens < 0 || sh->n_matmuls < 0 ||
                       (sh->n_matmuls > 0 && sh->matmuls == NULL),
                   LOOM_ERR_INVALID_ARG, "cpu: step shape of %d tokens, %d matmuls", sh->max_tokens,
                   sh->n_matmuls);
    /* Each matmul's need depends on its row count through the kernels' thresholds (one row,
     * token lanes, tiles, prepared tiles), not monotonically: take the largest over every
     * count up to the most (a few arithmetic operations each). */
    for (int32_t i = 0; i < sh->n_matmuls; i++) {
        const loom_matmul_shape *m = &sh->matmuls[i];
        for (int64_t t = 1; t <= m->max_rows; t++) {
            size_t scratch = 0, act = 0;
            LOOM_TRY(loom__cpu_matmul_need(f32_activations, m->type, m->k, t, &scratch, &act));
            out->scratch_floats = max_size(out->scratch_floats, scratch);
            out->act_bytes = max_size(out->act_bytes, act);
        }
    }
    if (sh->head_dim > 0 && sh->n_head > 0 && sh->max_tokens > 0) {
        size_t scratch = 0, parts = 0;
        loom__cpu_attention_need(n_threads, sh->max_tokens, sh->n_head, sh->head_dim, sh->max_ctx,
                                 &scratch, &parts);
        out->scratch_floats = max_size(out->scratch_floats, scratch);
        out->attn_parts_bytes = parts;
        if (sh->kv_flags & LOOM_KV_MERGED)
            out->scratch_floats = max_size(
                out->scratch_floats, loom__cpu_kv_merge_scratch(sh->n_kv_heads, sh->head_dim));
        if (sh->kv_flags & LOOM_KV_HADAMARD) /* attention's rotated queries, in act */
            out->act_bytes = max_size(out->act_bytes, (size_t)sh->max_tokens * (size_t)sh->n_head *
                                                          (size_t)sh->head_dim * sizeof(float));
    }
    if (sh->n_rot > 0) {
        out->rope_positions = sh->max_tokens;
        out->rope_rot = sh->n_rot;
    }
    return LOOM_OK;
}

loom_status loom__cpu_workspace_size(void *dev, const loom_step_shape *shape, size_t *bytes) {
    const loom__cpu_dev *d = dev;
    LOOM_CHECK_ARG(d != NULL && bytes != NULL);
    loom__cpu_workspace w;
    LOOM_TRY(loom__cpu_workspace_plan(d->n_threads, d->f32_activations, shape, &w));
    *bytes = w.scratch_floats * sizeof(float) * (size_t)d->n_threads + w.act_bytes +
             w.attn_parts_bytes + loom__cpu_rope_tables_bytes(w.rope_positions, w.rope_rot);
    return LOOM_OK;
}

/* ------------------------------------------------------------------------------------------ */
/* Create and destroy                                                                         */
/* ------------------------------------------------------------------------------------------ */

void loom__cpu_stream_destroy(void *stream) {
    loom__cpu_ctx *c = stream;
    if (c == NULL) return;
    loom__threadpool_destroy(c->tp);
    loom__workshare_destroy(c->share);
    loom__cpu_rope_tables_free(c->rope);
    if (c->scratch != NULL)
        for (int i = 0; i < c->n_threads; i++) free(c->scratch[i]);
    free(c->scratch);
    free(c->act);
    free(c->attn_parts);
    free(c);
}

/* Each worker pins itself (thread 0, the caller, is the application's and stays as it is). */
static void pin_worker(void *arg, int ith, int nth) {
    const loom__cpu_ctx *c = arg;
    (void)nth;
    if (ith > 0) (void)loom__numa_pin_worker(&c->dev->numa, ith);
}

loom_status loom__cpu_stream_create(void *dev, const loom_step_shape *shape, void **out) {
    const loom__cpu_dev *d = dev;
    LOOM_CHECK_ARG(d != NULL && out != NULL);
    loom__cpu_workspace w;
    LOOM_TRY(loom__cpu_workspace_plan(d->n_threads, d->f32_activations, shape, &w));

    loom__cpu_ctx *c = loom__calloc(1, sizeof *c);
    LOOM_RETURN_IF(c == NULL, LOOM_ERR_OUT_OF_MEMORY, "cpu: out of memory");
    c->dev = d;
    c->n_threads = d->n_threads;
    c->f32_activations = d->f32_activations;
    loom_status st;
    LOOM_TRY_GOTO(st, loom__threadpool_create(c->n_threads, LOOM__TP_WAKEFUL_NS, &c->tp), fail);
    LOOM_TRY_GOTO(st, loom__workshare_create(c->n_threads, &c->share), fail);
    if (d->numa.mode != LOOM_NUMA_OFF) loom__threadpool_run(c->tp, pin_worker, c);
    LOOM_TRY_GOTO(st, loom__cpu_reserve_scratch(c, w.scratch_floats), fail);
    if (w.act_bytes > 0) LOOM_TRY_GOTO(st, loom__cpu_reserve_act(c, w.act_bytes), fail);
    if (w.attn_parts_bytes > 0)
        LOOM_TRY_GOTO(st, loom__cpu_reserve_attn_parts(c, w.attn_parts_bytes), fail);
    if (w.rope_positions > 0)
        LOOM_TRY_GOTO(st, loom__cpu_rope_tables_create(w.rope_positions, w.rope_rot, &c->rope),
                      fail);
    c->ready = true; /* from here on, an allocation by an op is a growth */
    *out = c;
    return LOOM_OK;
fail:
    loom__cpu_stream_destroy(c);
    return st;
}

/* ------------------------------------------------------------------------------------------ */
/* Data movement                                                                              */
/* ------------------------------------------------------------------------------------------ */

loom_status loom__cpu_tensor_set(void *stream, void *dst, const void *src, size_t bytes) {
    (void)stream;
    if (bytes == 0) return LOOM_OK;
    LOOM_RETURN_IF(dst == NULL || src == NULL, LOOM_ERR_INVALID_ARG,
                   "cpu: tensor_set of %zu bytes with a NULL pointer", bytes);
    memcpy(dst, src, bytes);
    return LOOM_OK;
}

loom_status loom__cpu_tensor_get(void *stream, void *dst, const void *src, size_t bytes) {
    (void)stream;
    if (bytes == 0) return LOOM_OK;
    LOOM_RETURN_IF(dst == NULL || src == NULL, LOOM_ERR_INVALID_ARG,
                   "cpu: tensor_get of %zu bytes with a NULL pointer", bytes);
    memcpy(dst, src, bytes);
    return LOOM_OK;
}

static bool ranges_overlap(const char *a, size_t na, const char *b, size_t nb) {
    return a < b + nb && b < a + na;
}

loom_status loom__cpu_copy_batch(void *stream, loom_copy_kind kind, const loom_copy_range *r,
                                 size_t n) {
    (void)stream;
    LOOM_RETURN_IF(kind != LOOM_COPY_DEVICE && kind != LOOM_COPY_TO_HOST &&
                       kind != LOOM_COPY_FROM_HOST,
                   LOOM_ERR_INVALID_ARG, "cpu: copy_batch of unknown kind %d", (int)kind);
    LOOM_RETURN_IF(n > 0 && r == NULL, LOOM_ERR_INVALID_ARG, "cpu: copy_batch ranges are NULL");
    /* Validate every range before copying any, so a bad batch changes nothing. */
    for (size_t i = 0; i < n; i++) {
        if (r[i].bytes == 0) continue;
        LOOM_RETURN_IF(r[i].dst == NULL || r[i].src == NULL, LOOM_ERR_INVALID_ARG,
                       "cpu: copy_batch range %zu of %zu bytes has a NULL pointer", i, r[i].bytes);
        LOOM_RETURN_IF(ranges_overlap(r[i].dst, r[i].bytes, r[i].src, r[i].bytes),
                       LOOM_ERR_INVALID_ARG,
                       "cpu: copy_batch range %zu: source and destination overlap", i);
    }
    for (size_t i = 0; i < n; i++)
        if (r[i].bytes > 0) memcpy(r[i].dst, r[i].src, r[i].bytes);
    return LOOM_OK;
}

loom_status loom__cpu_synchronize(void *stream) {
    (void)stream; /* ops are synchronous */
    return LOOM_OK;
}
