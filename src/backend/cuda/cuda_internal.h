/* cuda_internal.h — what the CUDA backend's host files share: the device (one per model: the
 * GPU it opened, the weights it uploaded), the stream (one per engine or session: its CUDA
 * stream, the step's descriptors in device memory, attention's workspace), the CUDA error
 * check, and the entry points the ops table in cuda_backend.c points at. The kernels are
 * reached through kernels/loom_kernels.h only. Compiled into libloom-cuda.so, never into
 * libloom. */
#pragma once

#include "loom_backend.h"

#include <cuda_runtime_api.h>
#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>

#include "loom_kernels.h"
#include "core/status.h"

/* A CUDA runtime call's failure as a status: OUT_OF_MEMORY for an allocation CUDA refused,
 * BACKEND for anything else, the call and CUDA's message in the text. */
loom_status loom__cuda_status(cudaError_t e, const char *call);

#define LOOM_CU_TRY(call)                                                                          \
    do {                                                                                           \
        cudaError_t loom__ce = (call);                                                             \
        if (loom__ce != cudaSuccess) return loom__cuda_status(loom__ce, #call);                    \
    } while (0)

/* One block of uploaded weights (a singly linked list: the arena, then any overflow). */
typedef struct loom__cuda_chunk loom__cuda_chunk;
/* cuBLASLt, opened at run time for the fast mode's library GEMMs (cuda_blaslt_gemm.c). */
typedef struct loom__cuda_blaslt loom__cuda_blaslt;

typedef struct loom__cuda_dev {
    int device; /* CUDA device ordinal */
    int cc_major, cc_minor, n_sms;
    int smem_optin; /* the most shared memory a block may opt in to (bytes) */
    char name[256];
    size_t weight_bytes; /* the open-time hint: the first upload allocates one arena this big */
    pthread_mutex_t mu;  /* guards chunks and converted_logged (weight_prepare may run on any
                            thread) */
    loom__cuda_chunk *chunks;
    uint64_t converted_logged; /* bit t: type t's "dequantized to bf16" line was logged */
    /* cuBLASLt, where the fast mode runs some matmuls on it (LOOM_CUDA_FP8_GEMM=1: FP8 rows;
     * LOOM_CUDA_MATH=bf16: BF16 weights); NULL: off */
    loom__cuda_blaslt *blaslt;
    /* Batch invariance (the default; LOOM_CUDA_BATCH_INVARIANT=0 turns it off): every matmul on
     * the tensor-core GEMM's one order of additions and every attention row of a layer on one
     * kernel (the tiled one where it runs the layer), so a token's bits never depend on its
     * step's size or its sequence's cut into steps. Off: the GEMV for steps of 1..8 tokens and
     * the tiled kernel for long prefills only (each regime invariant within itself only). */
    bool batch_invariant;
    /* LOOM_CUDA_GRAPHS=1: a step's kernel launches replayed as CUDA graphs (cuda_graph.c). */
    bool graphs;
    /* LOOM_CUDA_MATH: the tensor-core kernels' operands, LOOM_K_MATH_F32 (the default, float32
     * accuracy) or LOOM_K_MATH_BF16 (=bf16: 16-bit operands, the peers' arithmetic). */
    int math;
    /* The tensor-core GEMM's and tiled attention's: math, or LOOM_K_MATH_BF16_WGMMA where
     * LOOM_CUDA_WGMMA=1 asks for Hopper's warpgroup MMA in BF16 math and the device runs it
     * (loom__cuda_wgmma_probe). */
    int tc_math;
    /* LOOM_CUDA_ATTN_ASYNC=0: the wgmma attention never warp-specialised, its tiles through
     * registers (loom__k_attn's tile_regs), for check.sh's comparison. */
    bool attn_tile_regs;
    /* LOOM_CUDA_GEMM_WS=0: the wgmma GEMM never warp-specialised (loom__k_gemm_work's
     * gemm_plain), for check.sh's comparison. */
    bool gemm_plain;
    /* LOOM_CUDA_FUSE=0: norm_rope_store as its five separate ops (rms_norm twice, rope twice,
     * kv_store) and norm_add_rms_norm as its two (rms_norm, add_rms_norm), for check.sh's
     * comparison; otherwise one launch each. */
    bool unfused;
    /* The driver's tensor-map encoder for the warp-specialised wgmma GEMM's TMA copies (NULL:
     * not on wgmma, LOOM_CUDA_GEMM_TMA=0, or a driver without it: cp.async copies). */
    loom__k_tmap_encode_fn tmap_encode;
} loom__cuda_dev;

/* Most descriptors (KV groups) one step hands over. */
#define LOOM_CUDA_MAX_KV 8

/* One KV group's descriptor of the current step, in device memory. */
typedef struct loom__cuda_step_kv {
    const loom_kv_desc *host; /* the descriptor libloom handed to step_begin */
    loom__k_kv dev;           /* the kernels' view (device arrays inside meta_dev) */
} loom__cuda_step_kv;

/* Executable graphs a stream keeps (cuda_graph.c). */
#define LOOM_CUDA_GRAPH_SLOTS 4

typedef struct loom__cuda_graph_slot {
    cudaGraphExec_t exec; /* NULL: empty */
    size_t n_nodes;       /* of the graph it was made from */
    uint64_t used;        /* the stream's graph_clock when last launched */
} loom__cuda_graph_slot;

typedef struct loom__cuda_stream {
    loom__cuda_dev *dev;
    cudaStream_t s;
    /* Step descriptors: packed on the host into pinned meta_host, then one upload to meta_dev;
     * meta_done marks the upload finished, so the next step does not overwrite meta_host while
     * a copy still reads it. */
    int32_t *meta_host, *meta_dev;
    size_t meta_cap; /* int32s in each */
    cudaEvent_t meta_done;
    bool meta_pending;
    int32_t n_kv;
    loom__cuda_step_kv kv[LOOM_CUDA_MAX_KV];
    /* Attention's split-KV partials (loom__cuda_attention_work_bytes). */
    void *attn_work;
    size_t attn_work_cap;
    /* The tiled attention's segment states (loom__cuda_attention_tiled_work_bytes). */
    void *tiled_work;
    size_t tiled_work_cap;
    /* The GEMM's K-split segment sums (loom__cuda_gemm_multi_work_bytes). */
    void *gemm_work;
    size_t gemm_work_cap;
    /* The wgmma GEMM's activations in BF16 (loom__cuda_gemm_x16_bytes). */
    void *gemm_x16;
    size_t gemm_x16_cap;
    /* The FP8 GEMM's quantized activations, their scales and cuBLASLt's workspace. */
    void *blaslt_work; /* cuBLASLt's activations and workspace */
    size_t blaslt_work_cap;
    bool blaslt_refused[2]; /* cuBLASLt declined an FP8 / BF16 step once (logged once each) */
    /* logits_summary's results in device memory before they cross to the host. */
    void *summary_work;
    size_t summary_work_cap;
    /* The rows' edits packed on the host before they cross (malloc'd). */
    void *edit_host;
    size_t edit_host_cap;
    int64_t n_grows; /* allocations after stream_create (a stream made without a shape) */
    /* Graphs (dev->graphs): capturing between loom__cuda_launches and loom__cuda_flush;
     * graph_off after a failure. */
    bool capturing, graph_off;
    loom__cuda_graph_slot graphs[LOOM_CUDA_GRAPH_SLOTS];
    uint64_t graph_clock;
    int64_t n_graph_updates, n_graph_instantiations;
} loom__cuda_stream;

/* Makes the stream's device current on the calling thread (CUDA's current device is per
 * thread; streams of one model may be driven from any thread). */
loom_status loom__cuda_bind(const loom__cuda_dev *d);

/* ---- graphs (cuda_graph.c) ---- */
/* Before an op queues kernels: makes the device current and, with graphs on, starts capturing
 * the stream if it is not already. */
loom_status loom__cuda_launches(loom__cuda_stream *c);
/* Before anything that is not a kernel launch on the stream (a copy, a synchronization, an
 * allocation, the next step): ends a capture and launches it as a graph. A no-op otherwise. */
loom_status loom__cuda_flush(loom__cuda_stream *c);
/* The stream's graphs (stream_destroy). */
void loom__cuda_graphs_free(loom__cuda_stream *c);

/* ---- device (cuda_device.c) ---- */
loom_status loom__cuda_open(const loom_backend_open_params *p, void **dev);
void loom__cuda_close(void *dev);
loom_status loom__cuda_memory_info(void *dev, size_t *free_bytes, size_t *total_bytes);
loom_status loom__cuda_buffer_alloc(void *dev, size_t bytes, loom_buffer **out);
void loom__cuda_buffer_free(void *dev, loom_buffer *buf);
void *loom__cuda_buffer_base(void *dev, loom_buffer *buf);
loom_status loom__cuda_host_alloc(void *dev, size_t bytes, void **out);
void loom__cuda_host_free(void *dev, void *ptr);
loom_status loom__cuda_weight_prepare(void *dev, const loom_weight_src *src, loom_tensor *out);

/* ---- streams (cuda_stream.c) ---- */
loom_status loom__cuda_workspace_size(void *dev, const loom_step_shape *shape, size_t *bytes);
loom_status loom__cuda_stream_create(void *dev, const loom_step_shape *shape, void **stream);
void loom__cuda_stream_destroy(void *stream);
loom_status loom__cuda_tensor_set(void *stream, void *dst, const void *src, size_t bytes);
loom_status loom__cuda_tensor_get(void *stream, void *dst, const void *src, size_t bytes);
loom_status loom__cuda_copy_batch(void *stream, loom_copy_kind kind, const loom_copy_range *ranges,
                                  size_t n);
loom_status loom__cuda_synchronize(void *stream);
loom_status loom__cuda_step_begin(void *stream, const loom_step_desc *step);
/* The device view of one of the current step's descriptors (the address libloom passed to
 * step_begin). Errors: INVALID_ARG for a descriptor that is not the step's. */
loom_status loom__cuda_find_step_kv(loom__cuda_stream *c, const char *op, const loom_kv_desc *kv,
                                    const loom__k_kv **out);
/* Makes the device area *area (*cap bytes; NULL, 0 at first) hold at least bytes: a new
 * allocation, the old one freed once the stream's queued work is done. */
loom_status loom__cuda_regrow(loom__cuda_stream *c, void **area, size_t *cap, size_t bytes);
/* Makes attention's workspace hold at least bytes. */
loom_status loom__cuda_reserve_attn(loom__cuda_stream *c, size_t bytes);

/* ---- cuBLASLt's GEMMs of the fast mode (cuda_blaslt_gemm.c) ---- */
/* Opens cuBLASLt (called in the fast mode only, after d->math is set) where LOOM_CUDA_FP8_GEMM=1
 * and the device has FP8 tensor cores, or d->math is LOOM_K_MATH_BF16 (else, or where cuBLASLt
 * cannot be loaded, logs why and leaves d->blaslt NULL); never fails the device. */
void loom__cuda_blaslt_open(loom__cuda_dev *d);
void loom__cuda_blaslt_close(loom__cuda_dev *d);
/* out = x w^T through cuBLASLt for the weights it takes (FP8 rows, opted in; BF16 in BF16
 * math) in steps of more than 8 tokens: *done tells whether it ran (false: the caller runs
 * loom's kernels). Errors: the launches', cuBLASLt's (BACKEND). */
loom_status loom__cuda_blaslt_gemm(loom__cuda_stream *c, const loom_tensor *w, const loom_tensor *x,
                                   loom_tensor *out, bool *done);
/* Whether cuBLASLt is open for weights of this type (their steps of more than 8 tokens go to
 * it, so they leave matmul_multi's one launch). */
bool loom__cuda_blaslt_takes(const loom__cuda_dev *d, loom_type type);

/* ---- ops (cuda_ops.c) ---- */
loom_status loom__cuda_get_rows_op(void *stream, const loom_tensor *table, const loom_tensor *ids,
                                   loom_tensor *out);
loom_status loom__cuda_matmul_multi_op(void *stream, int n, const loom_tensor *const *ws,
                                       const loom_tensor *x, loom_tensor *const *outs);
loom_status loom__cuda_matmul_op(void *stream, const loom_tensor *w, const loom_tensor *x,
                                 loom_tensor *out);
loom_status loom__cuda_rms_norm_op(void *stream, const loom_tensor *x, const loom_tensor *w,
                                   float eps, loom_tensor *out);
loom_status loom__cuda_rope_op(void *stream, loom_tensor *x, const loom_tensor *pos,
                               const loom_rope_params *p);
loom_status loom__cuda_kv_store_op(void *stream, const loom_tensor *k, const loom_tensor *v,
                                   const loom_kv_desc *kv, int32_t layer);
loom_status loom__cuda_norm_rope_store_op(void *stream, loom_tensor *q, loom_tensor *k,
                                          const loom_tensor *v, const loom_tensor *q_norm,
                                          const loom_tensor *k_norm, float eps,
                                          const loom_tensor *pos, const loom_rope_params *p,
                                          const loom_kv_desc *kv, int32_t layer);
loom_status loom__cuda_attention_op(void *stream, const loom_tensor *q, const loom_kv_desc *kv,
                                    const loom_attn_params *p, loom_tensor *out);
loom_status loom__cuda_logits_summary_op(void *stream, const loom_tensor *logits, int32_t n_top,
                                         const loom_logit_edits *edits, loom_logit_summary *sum,
                                         loom_logit_cand *top, loom_logit_summary *raw_sum,
                                         loom_logit_cand *raw_top, float *edit_raw);
loom_status loom__cuda_glu_op(void *stream, const loom_tensor *gate, const loom_tensor *up,
                              loom_glu_kind kind, loom_tensor *out);
loom_status loom__cuda_norm_add_rms_norm_op(void *stream, loom_tensor *x, const loom_tensor *y,
                                            const loom_tensor *w_y, const loom_tensor *w, float eps,
                                            loom_tensor *out);
loom_status loom__cuda_add_rms_norm_op(void *stream, loom_tensor *x, const loom_tensor *y,
                                       const loom_tensor *w, float eps, loom_tensor *out);
loom_status loom__cuda_add_op(void *stream, const loom_tensor *a, const loom_tensor *b,
                              loom_tensor *out);
loom_status loom__cuda_scale_op(void *stream, const loom_tensor *x, float s, loom_tensor *out);
