/* cpu_internal.h — what the CPU backend's files share: the context (thread pool and per-thread
 * scratch), argument checks that produce clear statuses, and the op entry points the ops table
 * in cpu_backend.c points at. Nothing outside src/backend/cpu includes this. */
#pragma once

#include "backend/backend.h"
#include "core/numa.h"
#include "core/threadpool.h"
#include "core/workshare.h"

#include <stdbool.h>
#include <stddef.h>

/* The rope op's cached cos/sin tables (cpu_rope.c). */
typedef struct loom__cpu_rope_tables loom__cpu_rope_tables;
void loom__cpu_rope_tables_free(loom__cpu_rope_tables *rt);

typedef struct loom__cpu_ctx {
    loom__threadpool *tp;
    int n_threads;
    bool f32_activations; /* see loom__cpu_params */
    loom__numa_plan numa; /* where the workers run (core/numa.h) */
    /* Shares out a parallel op's units among the threads (core/workshare.h); reset by the op
     * before each run, so one op at a time, like the pool. */
    loom__workshare *share;
    /* [n_threads] per-thread scratch, scratch_cap floats each, 64-byte aligned. Ops reserve
     * what they need on entry (single-threaded, before dispatch), so growth happens once, the
     * first time a larger shape is seen, never inside a parallel region. */
    float **scratch;
    size_t scratch_cap;
    /* One area shared by all threads, act_cap bytes, 64-byte aligned: the matmul's activation
     * rows rounded to the weight's activation format (tensor/qdot.h), written once per call
     * before the dot products read them. Reserved like scratch, outside parallel regions. */
    void *act;
    size_t act_cap;
    /* Attention's split items leave their segments' softmax states here for the calling
     * thread to merge (cpu_attention.c): attn_parts_cap bytes, reserved like act. */
    void *attn_parts;
    size_t attn_parts_cap;
    /* The rope op's last cos/sin tables, made on first use (cpu_rope.c). */
    loom__cpu_rope_tables *rope;
} loom__cpu_ctx;

/* Makes every thread's scratch hold at least n_floats. Errors: OUT_OF_MEMORY (the old scratch
 * stays valid). */
loom_status loom__cpu_reserve_scratch(loom__cpu_ctx *c, size_t n_floats);

/* Makes the shared activation area hold at least n_bytes. Errors: OUT_OF_MEMORY (the old area
 * stays valid). */
loom_status loom__cpu_reserve_act(loom__cpu_ctx *c, size_t n_bytes);

/* Makes attention's area of segment states hold at least n_bytes. Errors: OUT_OF_MEMORY (the
 * old area stays valid). */
loom_status loom__cpu_reserve_attn_parts(loom__cpu_ctx *c, size_t n_bytes);

/* ------------------------------------------------------------------------------------------ */
/* Argument checks (cpu_check.c). Each names the op and the argument in its message.          */
/* ------------------------------------------------------------------------------------------ */

/* t is non-NULL, of F32 type, ne[0] >= 1, ne[1] >= 0, rows float-aligned and not overlapping
 * (row_stride >= ne[0] * 4), data non-NULL when there is any row. */
loom_status loom__cpu_check_f32(const char *op, const char *name, const loom_tensor *t);

/* A table whose rows are of a dequantizable type: ne[0] a whole number of blocks, rows at
 * least one encoded row apart. */
loom_status loom__cpu_check_weight(const char *op, const char *name, const loom_tensor *t);

/* a and b have the same ne[0] and ne[1]. */
loom_status loom__cpu_check_same_shape(const char *op, const char *name_a, const loom_tensor *a,
                                       const char *name_b, const loom_tensor *b);

/* The byte ranges the two tensors span intersect (used to reject in-place use where an op
 * reads inputs after writing outputs). */
bool loom__cpu_tensors_overlap(const loom_tensor *a, const loom_tensor *b);

/* Address of row r of t. */
static inline void *loom__cpu_row(const loom_tensor *t, int64_t r) {
    return (char *)t->data + (size_t)r * t->row_stride;
}

/* Validates a paged-KV descriptor for op at layer `layer`: array pointers, monotone offsets,
 * supported kv_type, strides, the pools of the layer the op touches (layer itself for
 * kv_store, layer_src[layer] when via_layer_src, as attention reads), every block id the op touches
 * in [0, n_blocks) — read_window < 0: the new rows' entries only (kv_store); 0: every entry up
 * to the last new row; w > 0: from the window of the first new row (released sliding-window
 * entries before it may be negative), block tables long enough for every new row's
 * position, kv_len covering those positions. Sets *n_rows to q_start[n_seqs] and *pool_layer
 * to the layer whose pools the op uses.
 * Errors: INVALID_ARG (structure), UNSUPPORTED (kv_type), BAD_INPUT (ids/positions). */
loom_status loom__cpu_check_kv_desc(const char *op, const loom_kv_desc *kv, int32_t layer,
                                    bool via_layer_src, int32_t read_window, int64_t *n_rows,
                                    int32_t *pool_layer);

/* ------------------------------------------------------------------------------------------ */
/* Ops (one file per family)                                                                  */
/* ------------------------------------------------------------------------------------------ */

/* cpu_matmul.c */
loom_status loom__cpu_matmul(void *ctx, const loom_tensor *w, const loom_tensor *x,
                             loom_tensor *out);
loom_status loom__cpu_matmul_multi(void *ctx, int n, const loom_tensor *const *ws,
                                   const loom_tensor *x, loom_tensor *const *outs);

/* cpu_elementwise.c */
loom_status loom__cpu_get_rows(void *ctx, const loom_tensor *table, const loom_tensor *ids,
                               loom_tensor *out);
loom_status loom__cpu_rms_norm(void *ctx, const loom_tensor *x, const loom_tensor *w, float eps,
                               loom_tensor *out);
loom_status loom__cpu_glu(void *ctx, const loom_tensor *gate, const loom_tensor *up,
                          loom_glu_kind kind, loom_tensor *out);
loom_status loom__cpu_add(void *ctx, const loom_tensor *a, const loom_tensor *b, loom_tensor *out);
loom_status loom__cpu_scale(void *ctx, const loom_tensor *x, float s, loom_tensor *out);
loom_status loom__cpu_softmax(void *ctx, const loom_tensor *x, loom_tensor *out);

/* cpu_rope.c */
loom_status loom__cpu_rope(void *ctx, loom_tensor *x, const loom_tensor *pos,
                           const loom_rope_params *p);

/* cpu_kv.c */
loom_status loom__cpu_kv_store(void *ctx, const loom_tensor *k, const loom_tensor *v,
                               const loom_kv_desc *kv, int32_t layer);

/* cpu_attention.c */
loom_status loom__cpu_attention(void *ctx, const loom_tensor *q, const loom_kv_desc *kv,
                                const loom_attn_params *p, loom_tensor *out);

/* The sequence whose new rows include row r: the s with q_start[s] <= r < q_start[s+1]
 * (binary search; kv validated, 0 <= r < q_start[n_seqs], empty sequences skipped). */
static inline int32_t loom__cpu_seq_of_row(const loom_kv_desc *kv, int64_t r) {
    int32_t lo = 0, hi = kv->n_seqs - 1;
    while (lo < hi) { /* invariant: the answer is in [lo, hi] */
        int32_t mid = lo + (hi - lo + 1) / 2;
        if (kv->q_start[mid] <= r)
            lo = mid;
        else
            hi = mid - 1;
    }
    return lo;
}

/* Byte offset in a layer's pool of position p of sequence s (kv validated, p covered). */
static inline size_t loom__cpu_kv_slot(const loom_kv_desc *kv, int32_t s, int64_t p) {
    int32_t block = kv->block_ids[kv->indptr[s] + p / kv->block_size];
    return (size_t)block * kv->block_stride + (size_t)(p % kv->block_size) * kv->token_stride;
}
