/* cpu_internal.h — what the CPU backend's files share: the device (one per model: its
 * settings and the weights it copied), the stream (one per engine or session: its thread pool,
 * its work sharing and its scratch), argument checks that produce clear statuses, and the op
 * entry points the ops table in cpu_backend.c points at. Nothing outside src/backend/cpu
 * includes this; the rest of loom reaches the CPU backend through its ops table
 * (loom_backend.h), as it reaches any plugin. */
#pragma once

#include "loom_backend.h"

#include "core/numa.h"
#include "core/threadpool.h"
#include "core/workshare.h"
#include "tensor/op_check.h"
#include "tensor/tensor_check.h"

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>

/* One block of copied weights (a singly linked list: the arena, then any overflow). */
typedef struct loom__cpu_chunk loom__cpu_chunk;

/* The device: what every stream of one model shares. Read-only after open, but for the weight
 * chunks (weight_prepare may be called from several threads, under mu). */
typedef struct loom__cpu_dev {
    int n_threads;        /* threads of each stream, the caller included */
    bool f32_activations; /* see loom_backend_open_params */
    loom__numa_plan numa; /* where workers run and weights live (core/numa.h) */
    size_t weight_bytes;  /* the open-time hint: the first copy allocates one arena this big */
    pthread_mutex_t mu;
    loom__cpu_chunk *chunks; /* copied weights */
} loom__cpu_dev;

/* The rope op's cached cos/sin tables (cpu_rope.c). */
typedef struct loom__cpu_rope_tables loom__cpu_rope_tables;
void loom__cpu_rope_tables_free(loom__cpu_rope_tables *rt);
/* Creates the tables with room for n_pos positions of n_rot/2 frequencies each (so that steps
 * up to that size allocate nothing). Errors: OUT_OF_MEMORY. */
loom_status loom__cpu_rope_tables_create(int64_t n_pos, int n_rot, loom__cpu_rope_tables **out);
/* Bytes loom__cpu_rope_tables_create allocates for n_pos positions and n_rot. */
size_t loom__cpu_rope_tables_bytes(int64_t n_pos, int n_rot);

/* A stream: the execution context every op runs in. Used by one thread at a time. */
typedef struct loom__cpu_ctx {
    const loom__cpu_dev *dev;
    loom__threadpool *tp;
    int n_threads;
    bool f32_activations; /* the device's */
    /* Shares out a parallel op's units among the threads (core/workshare.h); reset by the op
     * before each run, so one op at a time, like the pool. */
    loom__workshare *share;
    /* [n_threads] per-thread scratch, scratch_cap floats each, 64-byte aligned. Sized at
     * stream_create for the largest step (loom__cpu_workspace_plan), so steps of that shape
     * allocate nothing; ops reserve what they need on entry (single-threaded, before
     * dispatch) and grow it only for a larger shape, never inside a parallel region. */
    float **scratch;
    size_t scratch_cap;
    /* One area shared by all threads, act_cap bytes, 64-byte aligned: the matmul's activation
     * rows rounded to the weight's activation format (tensor/qdot.h), written once per call
     * before the dot products read them. Reserved like scratch. */
    void *act;
    size_t act_cap;
    /* Attention's split items leave their segments' softmax states here for the calling
     * thread to merge (cpu_attention.c): attn_parts_cap bytes, reserved like act. */
    void *attn_parts;
    size_t attn_parts_cap;
    /* The rope op's last cos/sin tables (cpu_rope.c). */
    loom__cpu_rope_tables *rope;
    /* Times an op had to allocate after stream_create (a step larger than the stream was sized
     * for, or a sizing bug): 0 in normal use; tests read it. */
    int64_t n_grows;
    bool ready; /* stream_create has finished */
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

/* What a stream needs for steps up to a shape (cpu_workspace.c): the largest per-thread
 * scratch, activation area and attention state area any op of such a step reserves, computed
 * by the same sizing functions the ops use. */
typedef struct loom__cpu_workspace {
    size_t scratch_floats; /* per thread */
    size_t act_bytes;
    size_t attn_parts_bytes;
    int64_t rope_positions; /* positions the rope tables are made for */
    int rope_rot;
} loom__cpu_workspace;

loom_status loom__cpu_workspace_plan(int n_threads, bool f32_activations,
                                     const loom_step_shape *shape, loom__cpu_workspace *out);

/* The sizing functions behind it, shared with the ops (cpu_matmul.c, cpu_attention.c). */
/* Scratch floats per thread and activation bytes one matmul of x [T, K] over weights of type
 * w_type (any N) reserves. Errors: as the matmul would give for that shape. */
loom_status loom__cpu_matmul_need(bool f32_activations, loom_type w_type, int64_t K, int64_t T,
                                  size_t *scratch_floats, size_t *act_bytes);
/* The largest per-thread scratch (floats) and state area (bytes) attention can reserve for
 * T rows of n_head heads (head_dim hd) over sequences of up to max_ctx positions. */
void loom__cpu_attention_need(int n_threads, int64_t T, int32_t n_head, int32_t hd, int32_t max_ctx,
                              size_t *scratch_floats, size_t *parts_bytes);

/* ------------------------------------------------------------------------------------------ */
/* Device (cpu_device.c) and stream (cpu_stream.c) slots of the ops table                     */
/* ------------------------------------------------------------------------------------------ */

loom_status loom__cpu_open(const loom_backend_open_params *p, void **dev);
void loom__cpu_close(void *dev);
loom_status loom__cpu_memory_info(void *dev, size_t *free_bytes, size_t *total_bytes);
loom_status loom__cpu_buffer_alloc(void *dev, size_t bytes, loom_buffer **out);
void loom__cpu_buffer_free(void *dev, loom_buffer *buf);
void *loom__cpu_buffer_base(void *dev, loom_buffer *buf);
loom_status loom__cpu_host_alloc(void *dev, size_t bytes, void **out);
void loom__cpu_host_free(void *dev, void *ptr);
loom_status loom__cpu_weight_prepare(void *dev, const loom_weight_src *src, loom_tensor *out);
loom_status loom__cpu_workspace_size(void *dev, const loom_step_shape *shape, size_t *bytes);
loom_status loom__cpu_stream_create(void *dev, const loom_step_shape *shape, void **stream);
void loom__cpu_stream_destroy(void *stream);
loom_status loom__cpu_tensor_set(void *stream, void *dst, const void *src, size_t bytes);
loom_status loom__cpu_tensor_get(void *stream, void *dst, const void *src, size_t bytes);
loom_status loom__cpu_copy_batch(void *stream, loom_copy_kind kind, const loom_copy_range *r,
                                 size_t n);
loom_status loom__cpu_synchronize(void *stream);

/* The ops table (cpu_backend.c): what libloom registers as its built-in "cpu" backend, and what
 * the test-only plugin libloom-cpuplugin.so returns from its entry point. */
const loom_backend_ops *loom__cpu_backend_ops(void);

/* ------------------------------------------------------------------------------------------ */
/* Argument checks (cpu_check.c). Each names the op and the argument in its message.          */
/* ------------------------------------------------------------------------------------------ */

/* Largest head_dim the CPU rotates (LOOM_KV_HADAMARD). */
#define LOOM_CPU_HADAMARD_MAX 4096

/* x[0..n) <- H x, the orthonormal Walsh-Hadamard transform, in place; n a power of two
 * (cpu_hadamard.c). */
void loom__cpu_hadamard(float *x, int32_t n);

/* The KV element types the CPU stores and reads. */
static inline bool loom__cpu_kv_type_ok(loom_type t) {
    return t == LOOM_TYPE_F16 || t == LOOM_TYPE_BF16 || t == LOOM_TYPE_F32 ||
           t == LOOM_TYPE_FP8_E4M3 || t == LOOM_TYPE_FP8_E5M2;
}

/* The descriptor is one the CPU stores and reads (loom__cpu_kv_type_ok, NHD, FP8 with scales
 * per position and head, no scales otherwise) and
 * `layer` is one of its layers; *pool_layer = the layer whose pools the op uses (layer itself
 * for kv_store, layer_src[layer] for attention when via_layer_src). The rest of the
 * descriptor was checked by libloom for the step (kv/kv_desc.h). */
loom_status loom__cpu_check_kv_use(const char *op, const loom_kv_desc *kv, int32_t layer,
                                   bool via_layer_src, int32_t *pool_layer);

/* Address of row r of t. */
static inline void *loom__cpu_row(const loom_tensor *t, int64_t r) {
    return (char *)t->data + (size_t)r * t->row_stride;
}

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

/* cpu_rope.c */
loom_status loom__cpu_rope(void *ctx, loom_tensor *x, const loom_tensor *pos,
                           const loom_rope_params *p);

/* cpu_kv.c */
loom_status loom__cpu_kv_store(void *ctx, const loom_tensor *k, const loom_tensor *v,
                               const loom_kv_desc *kv, int32_t layer);

/* Writes n floats of one token's row (every head) into a page row of kv->kv_type at dst: F32
 * copied, F16/BF16 rounded to nearest even, FP8 with each head's scale into scales (cpu_kv.c). */
void loom__cpu_kv_put_row(const loom_kv_desc *kv, const float *src, char *dst, char *scales,
                          int64_t n);

/* cpu_kv_merge.c: kv_store for a layer of a merged pair (loom__cpu_merge_role not NONE), n_rows
 * new rows; pool_layer the pair's earlier layer. Errors: UNSUPPORTED (pages other than F16,
 * BF16, F32), OUT_OF_MEMORY (scratch). */
loom_status loom__cpu_kv_store_merged(loom__cpu_ctx *c, const loom_tensor *k, const loom_tensor *v,
                                      const loom_kv_desc *kv, int32_t layer, int32_t pool_layer,
                                      int64_t n_rows);
/* Scratch floats per thread the merged store needs. */
size_t loom__cpu_kv_merge_scratch(int32_t n_kv_heads, int32_t head_dim);

/* A layer's part in a merged pair: none, the earlier layer (owns the pools) or the later. */
typedef enum { LOOM_CPU_MERGE_NONE, LOOM_CPU_MERGE_A, LOOM_CPU_MERGE_B } loom__cpu_merge_role_t;
static inline loom__cpu_merge_role_t loom__cpu_merge_role(const loom_kv_desc *kv, int32_t layer) {
    const int32_t partner = loom_kv_merge_partner(kv, layer);
    return partner < 0       ? LOOM_CPU_MERGE_NONE
           : partner > layer ? LOOM_CPU_MERGE_A
                             : LOOM_CPU_MERGE_B;
}

/* cpu_attention.c */
loom_status loom__cpu_attention(void *ctx, const loom_tensor *q, const loom_kv_desc *kv,
                                const loom_attn_params *p, loom_tensor *out);

/* The sequence whose new rows include row r: the s with q_start[s] <= r < q_start[s+1]
 * (binary search; kv checked, 0 <= r < q_start[n_seqs], empty sequences skipped). */
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

/* Byte offset in a layer's pool of position p of sequence s (kv checked, p covered). */
static inline size_t loom__cpu_kv_slot(const loom_kv_desc *kv, int32_t s, int64_t p) {
    int32_t block = kv->block_ids[kv->indptr[s] + p / kv->block_size];
    return (size_t)block * kv->block_stride + (size_t)(p % kv->block_size) * kv->token_stride;
}

/* Byte offset of position p's scales (PER_TOKEN_HEAD) in a layer's scale pool. */
static inline size_t loom__cpu_kv_scale_slot(const loom_kv_desc *kv, int32_t s, int64_t p) {
    int32_t block = kv->block_ids[kv->indptr[s] + p / kv->block_size];
    return (size_t)block * kv->scale_block_stride +
           (size_t)(p % kv->block_size) * kv->scale_token_stride;
}
