/* backend.h — the backend vtable: the only way model code computes.
 *
 * A backend owns memory (buffers) and runs operations on tensors that live in that memory.
 * The model code builds a forward pass out of the ops below and never touches a backend's
 * internals, so a CUDA backend slots in beside the CPU one.
 *
 * Rules every backend follows and every caller may rely on:
 *   - Tensor data lives in backend buffers (device memory for a device backend). The host reads
 *     or writes it only through tensor_set / tensor_get (explicit copies).
 *   - Operations may run asynchronously and in order: they are queued, and their results are
 *     visible to the host only after synchronize(). tensor_get synchronizes first.
 *   - An op fails with a status (unsupported type, bad shape); it never aborts.
 *   - supports(op, type) says whether an op accepts a weight/storage type, so the engine can
 *     route the op elsewhere. Ops whose `(optional)` slot is NULL are treated as unsupported.
 *
 * Tensor shapes: a loom_tensor is a 2-D view: ne[1] rows of ne[0] elements, rows row_stride
 * bytes apart (a per-head view of a [T, H*hd] activation is the same memory seen as
 * [T*H, hd]). Activations are always F32; weights may be any type supports() accepts. */
#pragma once

#include "loom.h"
#include "tensor/kv_desc.h"
#include "tensor/types.h"

#define LOOM_BACKEND_ABI_VERSION 2 /* 2: matmul_multi */

/* Most matmuls one matmul_multi call takes. */
#define LOOM_MATMUL_MULTI_MAX 4

typedef struct loom_buffer loom_buffer; /* opaque, backend-defined */

typedef struct loom_tensor {
    loom_type type;
    int64_t ne[2];     /* ne[0]: elements per row, ne[1]: rows */
    size_t row_stride; /* bytes between consecutive rows */
    void *data;        /* address in the backend's memory space */
} loom_tensor;

typedef enum loom_op {
    LOOM_OP_GET_ROWS,
    LOOM_OP_MATMUL,
    LOOM_OP_RMS_NORM,
    LOOM_OP_ROPE,
    LOOM_OP_KV_STORE,
    LOOM_OP_ATTENTION,
    LOOM_OP_GLU,
    LOOM_OP_ADD,
    LOOM_OP_SCALE,
    LOOM_OP_SOFTMAX,
    LOOM_OP_COUNT_,
} loom_op;

typedef enum loom_rope_mode {
    LOOM_ROPE_NORMAL = 0, /* rotates adjacent pairs (x[2i], x[2i+1]) — llama */
    LOOM_ROPE_NEOX = 1,   /* rotates halves (x[i], x[i + n_rot/2]) — qwen2, gemma3, neox */
} loom_rope_mode;

typedef struct loom_rope_params {
    loom_rope_mode mode;
    int32_t n_head;     /* heads in the row */
    int32_t head_dim;   /* elements per head */
    int32_t n_rot;      /* rotated elements per head (<= head_dim, even) */
    float theta_base;   /* frequency base (10000, 500000, ...) */
    float freq_scale;   /* linear position scaling: angle uses pos * freq_scale (1: none) */
    const float *freq_factors; /* [n_rot/2] per-frequency divisors (llama3 scaling) or NULL */
} loom_rope_params;

typedef enum loom_glu_kind {
    LOOM_GLU_SWIGLU = 0,    /* silu(gate) * up */
    LOOM_GLU_GEGLU_TANH = 1 /* gelu_tanh(gate) * up */
} loom_glu_kind;

typedef struct loom_attn_params {
    int32_t n_head;    /* query heads */
    int32_t layer;     /* which layer's pool (through kv->layer_src) */
    float scale;       /* applied to q·k (usually 1/sqrt(head_dim)) */
    int32_t window;    /* sliding window in positions; 0: unlimited */
    float softcap;     /* logit soft-capping: cap * tanh(s / cap); 0: off */
} loom_attn_params;

typedef struct loom_backend_ops {
    uint32_t abi_version; /* LOOM_BACKEND_ABI_VERSION */
    const char *name;     /* "cpu", "cuda" */

    void (*destroy)(void *ctx);

    /* Whether op accepts tensors of type (the weight type for MATMUL/GET_ROWS, the cache type
     * for KV_STORE/ATTENTION, F32 for the others). */
    bool (*supports)(void *ctx, loom_op op, loom_type type);

    /* ---- memory ---- */
    loom_status (*buffer_alloc)(void *ctx, size_t bytes, loom_buffer **out);
    /* (optional) Wraps host memory the caller keeps alive (a mapped file) without copying;
     * NULL or an error means the caller must alloc + tensor_set instead. */
    loom_status (*buffer_wrap_host)(void *ctx, void *host, size_t bytes, loom_buffer **out);
    void (*buffer_free)(void *ctx, loom_buffer *buf);
    void *(*buffer_base)(void *ctx, loom_buffer *buf); /* address of byte 0 (backend space) */
    /* host -> backend: bytes at dst (backend address) from src (host). */
    loom_status (*tensor_set)(void *ctx, void *dst, const void *src, size_t bytes);
    /* backend -> host; waits for queued work first. */
    loom_status (*tensor_get)(void *ctx, void *dst, const void *src, size_t bytes);
    /* backend -> backend (KV block copies for copy-on-write); queued like an op. The ranges
     * must not overlap. */
    loom_status (*copy)(void *ctx, void *dst, const void *src, size_t bytes);
    loom_status (*synchronize)(void *ctx);

    /* ---- operations (all outputs F32 unless said otherwise) ---- */
    /* out[i, :] = dequant(table[ids[i], :]); ids I32 [n] with ne[0] = n, out [n, D]. */
    loom_status (*get_rows)(void *ctx, const loom_tensor *table, const loom_tensor *ids,
                            loom_tensor *out);
    /* out[t, o] = sum_k x[t, k] * w[o, k]; w [N, K] any supported type, x [T, K], out [T, N].
     * The sum for one output element is computed in an order that does not depend on T. */
    loom_status (*matmul)(void *ctx, const loom_tensor *w, const loom_tensor *x,
                          loom_tensor *out);
    /* out[r, :] = x[r, :] / sqrt(mean(x[r, :]^2) + eps) * (w ? w[:] : 1); w F32 [D] (ne[1]=1). */
    loom_status (*rms_norm)(void *ctx, const loom_tensor *x, const loom_tensor *w, float eps,
                            loom_tensor *out);
    /* In place on x [T, n_head*head_dim]; pos I32 [T] positions. */
    loom_status (*rope)(void *ctx, loom_tensor *x, const loom_tensor *pos,
                        const loom_rope_params *p);
    /* Writes k, v [T, n_kv_heads*head_dim] (rows in the batch order kv describes) into layer's
     * pool at each row's position, converting to kv->kv_type. */
    loom_status (*kv_store)(void *ctx, const loom_tensor *k, const loom_tensor *v,
                            const loom_kv_desc *kv, int32_t layer);
    /* out [T, n_head*head_dim] = softmax(scale * q k^T (+ causal/window mask)) v, per head,
     * with GQA (query head h reads kv head h / (n_head / n_kv_heads)). */
    loom_status (*attention)(void *ctx, const loom_tensor *q, const loom_kv_desc *kv,
                             const loom_attn_params *p, loom_tensor *out);
    /* out = act(gate) * up, elementwise, [T, F]. */
    loom_status (*glu)(void *ctx, const loom_tensor *gate, const loom_tensor *up,
                       loom_glu_kind kind, loom_tensor *out);
    /* out = a + b; b has a's shape, or one row (broadcast over a's rows). out may alias a. */
    loom_status (*add)(void *ctx, const loom_tensor *a, const loom_tensor *b, loom_tensor *out);
    /* out = x * s. out may alias x. */
    loom_status (*scale)(void *ctx, const loom_tensor *x, float s, loom_tensor *out);
    /* out[r, :] = softmax(x[r, :]); -inf entries give 0. out may alias x. */
    loom_status (*softmax)(void *ctx, const loom_tensor *x, loom_tensor *out);

    /* (optional) outs[i] = x·ws[i]ᵀ for i < n, 1 <= n <= LOOM_MATMUL_MULTI_MAX: several
     * matmuls of one activation (q, k and v; gate and up) in one op, so a backend can prepare
     * x once and run them as one parallel pass. Each outs[i] has the bits matmul(ws[i], x,
     * outs[i]) would give; the outs must not overlap x, any w or each other. NULL: the caller
     * makes the n matmul calls. */
    loom_status (*matmul_multi)(void *ctx, int n, const loom_tensor *const *ws,
                                const loom_tensor *x, loom_tensor *const *outs);

    /* ---- host work between ops (optional: both NULL or both set) ---- */
    /* How many threads host_parallel runs fn on (>= 1). */
    int (*host_threads)(void *ctx);
    /* Calls fn(arg, ith, nth) for every ith in [0, nth), nth = host_threads(ctx), and returns
     * when all have returned: host-side work between ops (the engine samples its rows this
     * way) on the threads a CPU backend computes with, which are idle then. Must be called
     * from the thread that submits the ops, with no op running. */
    void (*host_parallel)(void *ctx, void (*fn)(void *arg, int ith, int nth), void *arg);
} loom_backend_ops;

typedef struct loom__backend {
    const loom_backend_ops *ops;
    void *ctx;
} loom__backend;

typedef struct loom__cpu_params {
    int n_threads; /* compute threads, the caller included; <= 0: all online cores */
    /* Matmuls over quantized or F16 weights keep activations in float32 (closest to exact
     * arithmetic) instead of rounding them per block to the weight type's activation format
     * (8-bit Q8_0/Q8_K, or F16) and using integer dot products — faster, and the arithmetic
     * llama.cpp uses. Default false. */
    bool f32_activations;
    loom_numa_mode numa; /* worker placement (core/numa.h); default (0) LOOM_NUMA_AUTO */
} loom__cpu_params;

/* A CPU backend with params p (NULL: all cores, 8-bit activations). */
loom_status loom__backend_cpu_create(const loom__cpu_params *p, loom__backend **out);

/* Checks the ABI version and that every required slot is set, then wraps (ops, ctx) into a
 * backend handle that owns ctx. Errors: INVALID_ARG, UNSUPPORTED (ABI mismatch). */
loom_status loom__backend_register(const loom_backend_ops *ops, void *ctx, loom__backend **out);

/* Destroys the backend and its context. NULL is a no-op. */
void loom__backend_destroy(loom__backend *be);

/* Whether be runs op on type (false when the slot is NULL). */
bool loom__backend_supports(const loom__backend *be, loom_op op, loom_type type);

/* Helpers to make tensor views. */
static inline loom_tensor loom_tensor_2d(loom_type type, void *data, int64_t ne0, int64_t ne1,
                                         size_t row_stride) {
    loom_tensor t = {type, {ne0, ne1}, row_stride, data};
    return t;
}
