/* forward.h — one forward pass of a model over a ragged batch of tokens, and the execution
 * context it runs in: a backend stream of its own and activation buffers sized once for the
 * largest step, so that a step allocates nothing and two engines (or sessions) on one model
 * compute at the same time without sharing anything mutable. */
#pragma once

#include "model/model.h"

/* Most distinct matmul shapes a model's forward runs (loom_step_shape.matmuls). */
#define LOOM_MAX_MATMUL_SHAPES 32

/* What an execution context must hold: the largest step it will run. */
typedef struct loom__exec_shape {
    int32_t max_tokens; /* tokens of one step */
    int32_t max_seqs;   /* sequences in one step */
    int32_t max_ctx;    /* positions one sequence may hold */
    int32_t block_size; /* positions per KV block */
    loom_type kv_type;  /* the KV pages' element type */
    uint32_t kv_flags;  /* the descriptors' kv_flags (LOOM_KV_HADAMARD) */
} loom__exec_shape;

/* An engine's or session's execution context: its stream and its activation buffers in backend
 * memory for up to n_batch tokens. Used by one thread at a time. */
typedef struct loom__exec {
    const loom_backend_ops *ops;
    void *stream;
    loom_buffer *buf;
    int32_t n_batch;
    int32_t n_logit_rows;   /* rows of logits computed per output matmul (bounds its buffer) */
    size_t workspace_bytes; /* what the backend said the stream's workspace takes */
    loom_tensor x;          /* [T, D] residual stream */
    loom_tensor xn;         /* [T, D] normed */
    loom_tensor q;          /* [T, H*hd] */
    loom_tensor k;          /* [T, Hkv*hd] */
    loom_tensor v;          /* [T, Hkv*hd] */
    loom_tensor att;        /* [T, H*hd] attention output */
    loom_tensor proj;       /* [T, D] attention / FFN projection */
    loom_tensor gate;       /* [T, F] */
    loom_tensor up;         /* [T, F] */
    loom_tensor ids;        /* I32 [T] token ids */
    loom_tensor pos;        /* I32 [T] positions */
    loom_tensor out_ids;    /* I32 [n_logit_rows] rows that get logits */
    loom_tensor sel;        /* [n_logit_rows, D] gathered rows */
    loom_tensor logits;     /* [n_logit_rows, V] */
} loom__exec;

/* The tokens of one step: rows in the order the kv descriptor's q_start describes. */
typedef struct loom__batch {
    const loom_token *tokens; /* [n_tokens] ids, checked < n_vocab by the caller */
    const int32_t *pos;       /* [n_tokens] positions */
    int32_t n_tokens;
    const int32_t *logit_rows; /* [n_logits] rows whose logits are wanted, ascending */
    int32_t n_logits;
    /* Sampling from summaries (loom_backend.h, logits_summary; the backend must have the
     * slot): where summary_only is non-NULL, wanted row j with summary_only[j] set gets
     * summary[j] and its n_top best entries at top[j * n_top] instead of its logits (row j of
     * the logits array is left alone); the other rows are copied as usual. NULL: every row is
     * copied. */
    const uint8_t *summary_only;
    loom_logit_summary *summary;
    loom_logit_cand *top;
    int32_t n_top;
    /* With summary_only: each wanted row's edits (bias, penalties; none for the rows copied
     * whole), and where they are, what the slot reports of the row before them (raw_summary[j],
     * raw_top[j * n_top], edit_raw[j * LOOM_LOGIT_SUMMARY_MAX_EDITS]). */
    const loom_logit_edits *edits;
    loom_logit_summary *raw_summary;
    loom_logit_cand *raw_top;
    float *edit_raw;
    /* For layer-by-layer checks against a reference: when stop_after > 0, only the first
     * stop_after layers run and the residual stream [n_tokens, D] is copied to the host array
     * hidden instead of computing logits. 0 in normal use. */
    int32_t stop_after;
    float *hidden;
    /* Optional progress hook, for tracing: when on_layers is non-NULL, the pass synchronizes
     * the backend (so the work is really done, also on an asynchronous backend) and calls
     * on_layers(hook_user, first, last) after layers first..last, every hook_every layers and
     * after the last layer run; the output projection comes after the last call. NULL in
     * normal use, where it costs one pointer test per layer. Never changes what is computed. */
    void (*on_layers)(void *hook_user, int32_t first_layer, int32_t last_layer);
    void *hook_user;
    int32_t hook_every; /* >= 1 when on_layers is set */
} loom__batch;

/* The loom_step_shape of an execution context of the model (matmuls[LOOM_MAX_MATMUL_SHAPES]
 * receives its distinct matmul shapes; the shape points into it). */
void loom__model_step_shape(const loom_model *m, const loom__exec_shape *es, int32_t n_logit_rows,
                            loom_matmul_shape *matmuls, loom_step_shape *out);

/* Creates the stream and the buffers for steps up to es. Errors: those of the backend's
 * stream_create and buffer_alloc. */
loom_status loom__exec_create(const loom_model *m, const loom__exec_shape *es, loom__exec *ex);
void loom__exec_destroy(const loom_model *m, loom__exec *ex);

/* Runs the model over batch on ex's stream: hands the backend the step's descriptors
 * (step_begin), stores K/V through kv[g] for the layers of KV group g (kv has cfg.n_kv_groups
 * descriptors, the same batch, each group's own block tables, all checked by the caller), and
 * writes n_logits rows of n_vocab logits to the host array logits. */
loom_status loom__model_forward(const loom_model *m, loom__exec *ex, const loom__batch *b,
                                const loom_kv_desc *kv, float *logits);
