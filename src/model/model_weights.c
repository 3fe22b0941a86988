/* model_weights.c — binding an architecture's weight tensors by their GGUF names, with the
 * shape each must have. Optional tensors (biases, gemma3's extra norms) are bound when the
 * architecture has them; a required one missing is LOOM_ERR_BAD_MODEL naming it. */
#include <stdio.h>
#include <stdlib.h>

#include "model/model.h"
#include "tensor/quant.h"

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
    return loom__model_tensor(m, name, ne0, ne1, required, out);
}

static loom_status bind_layer(loom_model *m, int32_t il, loom__layer_weights *w) {
    const loom__model_config *c = &m->cfg;
    arch_tensors at = tensors_of(c->arch);
    int64_t d = c->n_embd, hd = c->head_dim, f = c->n_ff;
    int64_t q_dim = (int64_t)c->n_head * hd, kv_dim = (int64_t)c->n_head_kv * hd;
    LOOM_TRY(bind(m, il, "attn_norm.weight", d, 1, true, &w->attn_norm));
    LOOM_TRY(bind(m, il, "attn_q.weight", d, q_dim, true, &w->wq));
    LOOM_TRY(bind(m, il, "attn_k.weight", d, kv_dim, true, &w->wk));
    LOOM_TRY(bind(m, il, "attn_v.weight", d, kv_dim, true, &w->wv));
    LOOM_TRY(bind(m, il, "attn_q.bias", q_dim, 1, at.qkv_bias, &w->bq));
    LOOM_TRY(bind(m, il, "attn_k.bias", kv_dim, 1, at.qkv_bias, &w->bk));
    LOOM_TRY(bind(m, il, "attn_v.bias", kv_dim, 1, at.qkv_bias, &w->bv));
    LOOM_TRY(bind(m, il, "attn_q_norm.weight", hd, 1, at.qk_norm, &w->q_norm));
    LOOM_TRY(bind(m, il, "attn_k_norm.weight", hd, 1, at.qk_norm, &w->k_norm));
    LOOM_TRY(bind(m, il, "attn_output.weight", q_dim, d, true, &w->wo));
    LOOM_TRY(bind(m, il, "post_attention_norm.weight", d, 1, at.post_norms, &w->post_attn_norm));
    LOOM_TRY(bind(m, il, "ffn_norm.weight", d, 1, true, &w->ffn_norm));
    LOOM_TRY(bind(m, il, "ffn_gate.weight", d, f, true, &w->w_gate));
    LOOM_TRY(bind(m, il, "ffn_up.weight", d, f, true, &w->w_up));
    LOOM_TRY(bind(m, il, "ffn_down.weight", f, d, true, &w->w_down));
    LOOM_TRY(bind(m, il, "post_ffw_norm.weight", d, 1, at.post_norms, &w->post_ffn_norm));
    return LOOM_OK;
}

/* llama3-style per-frequency rope divisors, applied to every layer. */
static loom_status bind_rope_factors(loom_model *m) {
    const loom__gguf_tensor *t = loom__gguf_find_tensor(m->gguf, "rope_freqs.weight");
    if (!t) return LOOM_OK;
    int32_t half = m->cfg.layers[0].rope.n_rot / 2;
    LOOM_RETURN_IF(t->ne[0] != half || t->n_dims != 1, LOOM_ERR_BAD_MODEL,
                   "model: rope_freqs.weight has %lld entries, expected %d", (long long)t->ne[0],
                   half);
    m->rope_freq_factors = malloc((size_t)half * sizeof(float));
    LOOM_RETURN_IF(!m->rope_freq_factors, LOOM_ERR_OUT_OF_MEMORY, "model: out of memory");
    LOOM_RETURN_IF(!loom__dequantize_row(t->type, t->data, m->rope_freq_factors, half),
                   LOOM_ERR_UNSUPPORTED, "model: rope_freqs.weight has type %s",
                   loom__type_name(t->type));
    for (int32_t il = 0; il < m->cfg.n_layer; il++) {
        m->cfg.layers[il].rope.freq_factors = m->rope_freq_factors;
    }
    return LOOM_OK;
}

loom_status loom__model_bind_weights(loom_model *m) {
    const loom__model_config *c = &m->cfg;
    LOOM_TRY(loom__model_tensor(m, "token_embd.weight", c->n_embd, c->n_vocab, true,
                                &m->tok_embd));
    LOOM_TRY(loom__model_tensor(m, "output_norm.weight", c->n_embd, 1, true, &m->output_norm));
    LOOM_TRY(loom__model_tensor(m, "output.weight", c->n_embd, c->n_vocab, false, &m->output));
    if (m->output.data == NULL) m->output = m->tok_embd; /* tied embeddings */
    m->layers = calloc((size_t)c->n_layer, sizeof *m->layers);
    LOOM_RETURN_IF(!m->layers, LOOM_ERR_OUT_OF_MEMORY, "model: out of memory");
    for (int32_t il = 0; il < c->n_layer; il++) LOOM_TRY(bind_layer(m, il, &m->layers[il]));
    return bind_rope_factors(m);
}
