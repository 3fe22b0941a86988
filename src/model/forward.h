/* forward.h — one forward pass of a model over a ragged batch of tokens, and the workspace it
 * runs in (sized once, so a step allocates nothing). */
#pragma once

#include "model/model.h"

/* Activation buffers in backend memory for up to n_batch tokens. */
typedef struct loom__forward_ws {
    loom_buffer *buf;
    int32_t n_batch;
    int32_t n_logit_rows; /* rows of logits computed per output matmul (bounds its buffer) */
    loom_tensor x;        /* [T, D] residual stream */
    loom_tensor xn;       /* [T, D] normed */
    loom_tensor q;        /* [T, H*hd] */
    loom_tensor k;        /* [T, Hkv*hd] */
    loom_tensor v;        /* [T, Hkv*hd] */
    loom_tensor att;      /* [T, H*hd] attention output */
    loom_tensor proj;     /* [T, D] attention / FFN projection */
    loom_tensor gate;     /* [T, F] */
    loom_tensor up;       /* [T, F] */
    loom_tensor ids;      /* I32 [T] token ids */
    loom_tensor pos;      /* I32 [T] positions */
    loom_tensor out_ids;  /* I32 [n_logit_rows] rows that get logits */
    loom_tensor sel;      /* [n_logit_rows, D] gathered rows */
    loom_tensor logits;   /* [n_logit_rows, V] */
} loom__forward_ws;

/* The tokens of one step: rows in the order the kv descriptor's q_start describes. */
typedef struct loom__batch {
    const loom_token *tokens;  /* [n_tokens] ids, checked < n_vocab by the caller */
    const int32_t *pos;        /* [n_tokens] positions */
    int32_t n_tokens;
    const int32_t *logit_rows; /* [n_logits] rows whose logits are wanted, ascending */
    int32_t n_logits;
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

loom_status loom__forward_ws_create(const loom_model *m, int32_t n_batch, loom__forward_ws *ws);
void loom__forward_ws_destroy(const loom_model *m, loom__forward_ws *ws);

/* Runs the model over batch, storing K/V through kv[g] for the layers of KV group g
 * (kv has cfg.n_kv_groups descriptors: the same batch, each group's own block tables), and
 * writes n_logits rows of n_vocab logits to the host array logits. */
loom_status loom__model_forward(const loom_model *m, loom__forward_ws *ws, const loom__batch *b,
                                const loom_kv_desc *kv, float *logits);
