/* model.h — a loaded model: configuration read from GGUF metadata, weight tensors prepared by
 * its backend (one loom_weight_src each, so a backend may copy, repack or use them in place),
 * and the tokenizer. Each architecture (arch_llama.c for llama and qwen2, arch_gemma3.c) reads
 * its configuration; model_weights.c binds and prepares its tensors; forward.c runs them all. */
#pragma once

#include <stdatomic.h>

#include "backend/backend.h"
#include "core/status.h"
#include "gguf/gguf.h"
#include "tokenizer/tokenizer.h"

#define LOOM_MAX_KV_GROUPS 4

typedef enum loom__arch {
    LOOM_ARCH_LLAMA = 0,
    LOOM_ARCH_QWEN2 = 1,
    LOOM_ARCH_GEMMA3 = 2,
} loom__arch;

/* What differs from layer to layer (gemma3 interleaves sliding-window and global layers). */
typedef struct loom__layer_config {
    int32_t window;        /* sliding window in positions; 0: global attention */
    int32_t kv_group;      /* KV group: layers with the same window share block tables */
    int32_t kv_src;        /* the layer whose K/V this layer reads (itself, unless it reuses an
                              earlier layer's of its group: then it computes and stores none) */
    loom_rope_params rope; /* n_head/head_dim left 0: the forward sets them per tensor */
} loom__layer_config;

/* Everything the forward pass needs to know about the network's shape. */
typedef struct loom__model_config {
    loom__arch arch;
    int32_t n_vocab;
    int32_t n_embd; /* model width D */
    int32_t n_layer;
    int32_t n_head;    /* query heads H */
    int32_t n_head_kv; /* key/value heads (H for MHA, fewer for GQA) */
    int32_t head_dim;  /* per-head width (D / H unless the file says otherwise) */
    int32_t n_ff;      /* feed-forward width F */
    int32_t n_ctx_train;
    float rms_eps;
    float embd_scale;  /* the embedding rows are multiplied by this (1, or sqrt(D) for gemma) */
    float attn_scale;  /* multiplies q·k (1/sqrt(head_dim) unless the architecture says) */
    loom_glu_kind glu; /* feed-forward activation */
    int32_t n_swa;     /* sliding window of the local layers (0: none) */
    loom__layer_config *layers; /* [n_layer], owned by the model */
    int32_t n_kv_groups;        /* distinct windows among the layers (1 or 2 here) */
    int32_t kv_group_window[LOOM_MAX_KV_GROUPS]; /* window of each group (0: full) */
} loom__model_config;

typedef struct loom__layer_weights {
    loom_tensor attn_norm;      /* F32 [D] */
    loom_tensor wq;             /* [H*hd, D] */
    loom_tensor wk;             /* [Hkv*hd, D] */
    loom_tensor wv;             /* [Hkv*hd, D] */
    loom_tensor bq, bk, bv;     /* F32 [H*hd], [Hkv*hd] biases (qwen2), or data NULL */
    loom_tensor q_norm, k_norm; /* F32 [hd] per-head RMS norms (gemma3), or data NULL */
    loom_tensor wo;             /* [D, H*hd] */
    loom_tensor post_attn_norm; /* F32 [D] norm of the attention output (gemma3), or NULL */
    loom_tensor ffn_norm;       /* F32 [D] */
    loom_tensor w_gate;         /* [F, D] */
    loom_tensor w_up;           /* [F, D] */
    loom_tensor w_down;         /* [D, F] */
    loom_tensor post_ffn_norm;  /* F32 [D] norm of the feed-forward output (gemma3), or NULL */
} loom__layer_weights;

struct loom_model {
    /* The application's reference (until loom_model_free) plus one per live session and engine:
     * the model is released with the last, in whatever order they go (a binding's garbage
     * collector may free a session after its model). */
    atomic_int refs;

    loom__gguf *gguf; /* the open file; tensors of a mapped CPU model point into it */
    void *image;      /* a synthetic model's GGUF image in memory (gguf reads it); else NULL */
    loom__tokenizer *tok;
    loom__model_config cfg;
    bool vocab_only;
    char *arch_name; /* NUL-terminated copies of metadata strings */
    char *name;
    int64_t n_params;

    loom__backend *backend; /* NULL when vocab_only */
    int32_t n_threads;      /* host threads per stream (loom_model_params, resolved): also the
                               default of an engine's sampling threads */
    int32_t device;         /* the backend's device index */
    bool use_mmap;          /* weights may be used in place of the mapped file */
    bool weights_in_place;  /* some prepared weight points into the mapped file */

    loom_weight_format weights;  /* the form the matrices are handed to the backend in */
    int64_t weight_bytes_stored; /* bytes of the weights as the file has them (vectors as F32) */
    int64_t weight_bytes;        /* bytes handed to the backend (after any FP8 conversion) */
    struct loom__threadpool *load_pool; /* the FP8 conversion's threads, during the load only */
    loom_tensor rope_freqs; /* F32 [n_rot/2] llama3 rope divisors (prepared), or data NULL */

    loom_tensor tok_embd;        /* [V, D] */
    loom_tensor output_norm;     /* F32 [D] */
    loom_tensor output;          /* [V, D]; the embedding table when tied */
    loom__layer_weights *layers; /* [n_layer] */
};

/* A session or engine over the model takes a reference at create and drops it at free. Any
 * thread. */
void loom__model_retain(loom_model *model);
void loom__model_release(loom_model *model);

/* ---- shared by the architecture files (hparams.c) ---- */

/* Reads "<arch>.<key>" as a dimension (a non-negative count below 2^24). */
loom_status loom__hparam_dim(const loom__gguf *g, const char *arch, const char *key, bool required,
                             uint32_t def, int32_t *out);

/* Reads the hyper-parameters every decoder here shares: context, widths, heads, head_dim,
 * rms eps, rope base / dimension / linear scaling (into every layer's rope, normal mode) and
 * the vocabulary size. Allocates cfg->layers. */
loom_status loom__hparams_common(const loom__gguf *g, const char *arch, loom__model_config *cfg);

/* ---- per architecture ---- */
loom_status loom__llama_read_config(const loom__gguf *g, const char *arch, loom__model_config *cfg);
loom_status loom__gemma3_read_config(const loom__gguf *g, loom__model_config *cfg);

/* Groups the layers by window into KV groups (full-attention layers first). */
loom_status loom__model_assign_kv_groups(loom__model_config *cfg);

/* Declared cross-layer sharing, for models trained to share KV (Gemma 3n's convention):
 * <arch>.attention.shared_kv_layers = N makes each of the last N layers read the K/V of the
 * last layer before them with the same attention window. After assign_kv_groups. Errors:
 * BAD_MODEL (N >= n_layer, a shared layer whose window no earlier layer has). */
loom_status loom__model_read_kv_sharing(const loom__gguf *g, const char *arch,
                                        loom__model_config *cfg);

/* Binds every weight tensor of the configured architecture (shapes checked against cfg). */
loom_status loom__model_bind_weights(loom_model *model);

/* model_load.c, shared with model_synthetic.c: a new model (one reference, all else zero); the
 * caller's loom_model_params read and checked into *p; and the rest of a load once m->gguf is
 * open (configuration, tokenizer, backend, weights). */
loom_model *loom__model_new(void);
loom_status loom__model_params_in(const loom_model_params *params, loom_model_params *p);
loom_status loom__model_load_gguf(loom_model *m, const loom_model_params *p);

/* Finds tensor name with the given shape (ne0 = row length, ne1 = rows; ne1 = 1 for vectors,
 * which are converted to F32; matrices to FP8 rows when model->weights says so) and has the
 * backend prepare it for `use`; *out is the view the ops receive. required=false: absent ->
 * *out zeroed, LOOM_OK. */
loom_status loom__model_tensor(loom_model *model, const char *name, int64_t ne0, int64_t ne1,
                               bool required, loom_weight_use use, loom_tensor *out);

/* Checks that the model's backend runs every op the forward pass needs with this model's
 * weights and shapes, attention over KV pages of kv_type among them. Errors: UNSUPPORTED,
 * naming the op and the variant. */
loom_status loom__model_check_support(const loom_model *model, loom_type kv_type,
                                      uint32_t kv_flags);

/* Makes layer `layer` read the K/V of the earlier layer `src` of the same KV group (cross-layer
 * reuse: it then computes and stores none, and engines and sessions created afterwards
 * allocate no pool for it); src == layer undoes it. Before any engine or session is created
 * on the model. Errors: INVALID_ARG (a layer out of range, src > layer, another group, src
 * itself reusing another layer). */
loom_status loom__model_set_kv_source(loom_model *model, int32_t layer, int32_t src);
