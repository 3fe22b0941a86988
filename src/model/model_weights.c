/* model_weights.c — binding an architecture's weight tensors by their GGUF names, with the
 * shape each must have, each prepared by the backend (loom__model_tensor). Optional tensors
 * (biases, gemma3's extra norms) are bound when the architecture has them; a required one
 * missing is LOOM_ERR_BAD_MODEL naming it. Then what the backend must support for them, and the
 * cross-layer KV sources. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "core/alloc.h"
#include "model/model.h"
#include "tensor/quant.h"
#include "tensor/types.h"

typedef struct arch_tensors {
    bool qkv_bias;   /* qwen2 */
    bool qk_norm;    /* gemma3 */
    bool post_norms; /* gemma3: post_attention_norm, post_ffw_norm */
} arch_tensors;

static arch_tensors tensors_of(loom__arch a) {
    arch_tensors t = {false, false, false};
    if (a == LOOM_ARCH_QWEN2) t.qkv_bias = true;
    if (a == LOOM_ARCH_GEMMA3) t.qk_norm = t.post_norms = true;
    return t;
}

static loom_status bind(loom_model *m, int32_t il, const char *suffix, int64_t ne0, int64_t ne1,
                        bool required, loom_tensor *out) {
    char name[96];
    snprintf(name, sizeof name, "blk.%d.%s", il, suffix);
    return loom__model_tensor(m, name, ne0, ne1, required, LOOM_WEIGHT_MATMUL, out);
}

static loom_status bind_layer(loom_model *m, int32_t il, loom__layer_weights *w) {
    const loom__model_config *c = &m->cfg;
    arch_tensors at = tensors_of(c->arch);
    int64_t d = c->n_embd, hd = c->head_dim, f = c->n_ff;
    int64_t q_dim = (int64_t)c->n_head * hd, kv_dim = (int64_t)c->n_head_kv * hd;
    LOOM_TRY(bind(m, il, "attn_norm.weight", d, 1, true, &w->attn_norm));
    LOOM_TRY(bind(m, il, "attn_q.weight", d, q_dim, true, &w->wq));
    /* A layer the model declares to read another's K/V may come without K/V weights. */
    const bool own_kv = c->layers[il].kv_src == il;
    LOOM_TRY(bind(m, il, "attn_k.weight", d, kv_dim, own_kv, &w->wk));
    LOOM_TRY(bind(m, il, "attn_v.weight", d, kv_dim, own_kv, &w->wv));
    LOOM_TRY(bind(m, il, "attn_q.bias", q_dim, 1, at.qkv_bias, &w->bq));
    LOOM_TRY(bind(m, il, "attn_k.bias", kv_dim, 1, at.qkv_bias && own_kv, &w->bk));
    LOOM_TRY(bind(m, il, "attn_v.bias", kv_dim, 1, at.qkv_bias && own_kv, &w->bv));
    LOOM_TRY(bind(m, il, "attn_q_norm.weight", hd, 1, at.qk_norm, &w->q_norm));
    LOOM_TRY(bind(m, il, "attn_k_norm.weight", hd, 1, at.qk_norm && own_kv, &w->k_norm));
    LOOM_TRY(bind(m, il, "attn_output.weight", q_dim, d, true, &w->wo));
    LOOM_TRY(bind(m, il, "post_attention_norm.weight", d, 1, at.post_norms, &w->post_attn_norm));
    LOOM_TRY(bind(m, il, "ffn_norm.weight", d, 1, true, &w->ffn_norm));
    LOOM_TRY(bind(m, il, "ffn_gate.weight", d, f, true, &w->w_gate));
    LOOM_TRY(bind(m, il, "ffn_up.weight", d, f, true, &w->w_up));
    LOOM_TRY(bind(m, il, "ffn_down.weight", f, d, true, &w->w_down));
    LOOM_TRY(bind(m, il, "post_ffw_norm.weight", d, 1, at.post_norms, &w->post_ffn_norm));
    return LOOM_OK;
}

/* llama3-style per-frequency rope divisors, applied to every layer: prepared like any weight,
 * so the rope op finds them in backend memory. */
static loom_status bind_rope_factors(loom_model *m) {
    const loom__gguf_tensor *t = loom__gguf_find_tensor(m->gguf, "rope_freqs.weight");
    if (!t) return LOOM_OK;
    int32_t half = m->cfg.layers[0].rope.n_rot / 2;
    LOOM_RETURN_IF(t->ne[0] != half || t->n_dims != 1, LOOM_ERR_BAD_MODEL,
                   "model: rope_freqs.weight has %lld entries, expected %d", (long long)t->ne[0],
                   half);
    /* They divide the frequencies: a zero, negative, infinite or NaN factor would load and then
     * make that dimension's angle inf or NaN at every position. Checked in the file's bytes,
     * before the backend holds them (perhaps in device memory). */
    float *f = loom__malloc((size_t)half * sizeof *f);
    LOOM_RETURN_IF(!f, LOOM_ERR_OUT_OF_MEMORY, "model: out of memory");
    bool decoded = loom__dequantize_row(t->type, t->data, f, half);
    int32_t bad = -1;
    for (int32_t i = 0; decoded && i < half && bad < 0; i++) {
        if (!(f[i] > 0 && isfinite(f[i]))) bad = i;
    }
    float bad_value = bad >= 0 ? f[bad] : 0.0f;
    free(f);
    LOOM_RETURN_IF(!decoded, LOOM_ERR_BAD_MODEL, "model: rope_freqs.weight has type %s",
                   loom__type_name(t->type));
    LOOM_RETURN_IF(bad >= 0, LOOM_ERR_BAD_MODEL,
                   "model: rope_freqs.weight[%d] = %g (factors must be finite and positive)", bad,
                   (double)bad_value);
    LOOM_TRY(loom__model_tensor(m, "rope_freqs.weight", half, 1, true, LOOM_WEIGHT_VECTOR,
                                &m->rope_freqs));
    for (int32_t il = 0; il < m->cfg.n_layer; il++) {
        m->cfg.layers[il].rope.freq_factors = m->rope_freqs.data;
    }
    return LOOM_OK;
}

loom_status loom__model_bind_weights(loom_model *m) {
    const loom__model_config *c = &m->cfg;
    /* A tied embedding is the output projection's weight too: prepared once, for both. */
    const bool tied = loom__gguf_find_tensor(m->gguf, "output.weight") == NULL;
    LOOM_TRY(loom__model_tensor(m, "token_embd.weight", c->n_embd, c->n_vocab, true,
                                tied ? LOOM_WEIGHT_TIED : LOOM_WEIGHT_GET_ROWS, &m->tok_embd));
    LOOM_TRY(loom__model_tensor(m, "output_norm.weight", c->n_embd, 1, true, LOOM_WEIGHT_VECTOR,
                                &m->output_norm));
    LOOM_TRY(loom__model_tensor(m, "output.weight", c->n_embd, c->n_vocab, false,
                                LOOM_WEIGHT_MATMUL, &m->output));
    if (m->output.data == NULL) m->output = m->tok_embd; /* tied embeddings */
    m->layers = loom__calloc((size_t)c->n_layer, sizeof *m->layers);
    LOOM_RETURN_IF(!m->layers, LOOM_ERR_OUT_OF_MEMORY, "model: out of memory");
    for (int32_t il = 0; il < c->n_layer; il++) LOOM_TRY(bind_layer(m, il, &m->layers[il]));
    return bind_rope_factors(m);
}

/* ---- what the backend must run ------------------------------------------------------------- */

static loom_status need_op(const loom_model *m, const loom_op_desc *op, const char *what) {
    LOOM_RETURN_IF(!loom__backend_supports(m->backend, op), LOOM_ERR_UNSUPPORTED,
                   "model: backend %s does not run %s", m->backend->name, what);
    return LOOM_OK;
}

static loom_status need_weight(const loom_model *m, const loom_tensor *w, loom_op op,
                               const char *name) {
    if (w->data == NULL) return LOOM_OK;
    loom_op_desc d = {.op = op, .type = w->type};
    char what[128];
    snprintf(what, sizeof what, "%s over %s weights (%s)",
             op == LOOM_OP_MATMUL ? "matmul" : "get_rows", loom__type_name(w->type), name);
    return need_op(m, &d, what);
}

loom_status loom__model_check_support(const loom_model *m, loom_type kv_type, uint32_t kv_flags) {
    const loom__model_config *c = &m->cfg;
    LOOM_TRY(need_weight(m, &m->tok_embd, LOOM_OP_GET_ROWS, "token_embd.weight"));
    LOOM_TRY(need_weight(m, &m->output, LOOM_OP_MATMUL, "the output projection"));
    for (int32_t il = 0; il < c->n_layer; il++) {
        const loom__layer_weights *w = &m->layers[il];
        const loom_tensor *mats[] = {&w->wq,     &w->wk,   &w->wv,    &w->wo,
                                     &w->w_gate, &w->w_up, &w->w_down};
        for (size_t k = 0; k < sizeof mats / sizeof *mats; k++)
            LOOM_TRY(need_weight(m, mats[k], LOOM_OP_MATMUL, "a layer's projection"));
    }
    const loom_op op_f32[] = {LOOM_OP_RMS_NORM, LOOM_OP_ROPE, LOOM_OP_GLU, LOOM_OP_ADD,
                              LOOM_OP_SCALE};
    const char *names[] = {"rms_norm", "rope", "glu", "add", "scale"};
    for (size_t k = 0; k < sizeof op_f32 / sizeof *op_f32; k++) {
        loom_op_desc d = {.op = op_f32[k], .type = LOOM_TYPE_F32};
        LOOM_TRY(need_op(m, &d, names[k]));
    }
    for (int32_t g = 0; g < c->n_kv_groups; g++) {
        for (int k = 0; k < 2; k++) {
            loom_op_desc d = {.op = k ? LOOM_OP_ATTENTION : LOOM_OP_KV_STORE,
                              .type = kv_type,
                              .head_dim = c->head_dim,
                              .n_head = c->n_head,
                              .n_kv_heads = c->n_head_kv,
                              .window = c->kv_group_window[g],
                              .softcap = 0.0f,
                              .layout = LOOM_KV_LAYOUT_NHD,
                              .scale_kind = loom__kv_scale_kind_of(kv_type),
                              .kv_flags = kv_flags};
            char what[160];
            snprintf(what, sizeof what,
                     "%s over %s KV pages%s%s with head_dim %d, %d/%d heads, window %d",
                     k ? "attention" : "kv_store", loom__type_name(kv_type),
                     kv_flags & LOOM_KV_HADAMARD ? " rotated by a Hadamard transform" : "",
                     kv_flags & LOOM_KV_MERGED ? " with merged layer pairs" : "", c->head_dim,
                     c->n_head, c->n_head_kv, c->kv_group_window[g]);
            LOOM_TRY(need_op(m, &d, what));
        }
    }
    return LOOM_OK;
}

/* ---- cross-layer KV reuse ------------------------------------------------------------------ */

loom_status loom__model_set_kv_source(loom_model *m, int32_t layer, int32_t src) {
    LOOM_CHECK_ARG(m != NULL && !m->vocab_only);
    loom__model_config *c = &m->cfg;
    LOOM_RETURN_IF(layer < 0 || layer >= c->n_layer || src < 0 || src > layer, LOOM_ERR_INVALID_ARG,
                   "model: layer %d cannot read layer %d's KV (an earlier layer of %d)", layer, src,
                   c->n_layer);
    LOOM_RETURN_IF(c->layers[src].kv_group != c->layers[layer].kv_group, LOOM_ERR_INVALID_ARG,
                   "model: layers %d and %d have different attention windows", layer, src);
    LOOM_RETURN_IF(src != layer && c->layers[src].kv_src != src, LOOM_ERR_INVALID_ARG,
                   "model: layer %d reuses layer %d's KV itself", src, c->layers[src].kv_src);
    for (int32_t l = layer + 1; l < c->n_layer && src != layer; l++)
        LOOM_RETURN_IF(c->layers[l].kv_src == layer, LOOM_ERR_INVALID_ARG,
                       "model: layer %d is the KV source of layer %d, so it cannot read another's",
                       layer, l);
    c->layers[layer].kv_src = src;
    return LOOM_OK;
}

int32_t loom_model_layer_window(const loom_model *m, int32_t layer) {
    if (m == NULL || layer < 0 || layer >= m->cfg.n_layer) return -1;
    return m->cfg.kv_group_window[m->cfg.layers[layer].kv_group];
}
