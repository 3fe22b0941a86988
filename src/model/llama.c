/* llama.c — the llama architecture's configuration and weights (Llama 2/3, SmolLM, TinyLlama,
 * Mistral without sliding window): GQA or MHA, tied or separate output, RoPE base and linear
 * scaling from metadata, llama3 frequency factors when the file carries rope_freqs.weight. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/model.h"
#include "tensor/quant.h"

static loom_status get_dim(const loom_gguf *g, const char *key, bool required, uint32_t def,
                           int32_t *out) {
    uint32_t v = 0;
    LOOM_TRY(loom_gguf_get_u32(g, key, required, def, &v));
    /* Dimensions beyond 2^24 are not a real model; refusing them keeps products in range. */
    LOOM_RETURN_IF(v > (1u << 24), LOOM_ERR_BAD_MODEL, "model: %s = %u is out of range", key, v);
    *out = (int32_t)v;
    return LOOM_OK;
}

loom_status loom__llama_read_config(const loom_gguf *g, loom_model_config *c) {
    memset(c, 0, sizeof *c);
    c->arch = LOOM_ARCH_LLAMA;
    LOOM_TRY(get_dim(g, "llama.context_length", true, 0, &c->n_ctx_train));
    LOOM_TRY(get_dim(g, "llama.embedding_length", true, 0, &c->n_embd));
    LOOM_TRY(get_dim(g, "llama.block_count", true, 0, &c->n_layer));
    LOOM_TRY(get_dim(g, "llama.feed_forward_length", true, 0, &c->n_ff));
    LOOM_TRY(get_dim(g, "llama.attention.head_count", true, 0, &c->n_head));
    LOOM_TRY(get_dim(g, "llama.attention.head_count_kv", false, (uint32_t)c->n_head,
                     &c->n_head_kv));
    LOOM_TRY(get_dim(g, "llama.vocab_size", false, 0, &c->n_vocab));
    LOOM_RETURN_IF(c->n_embd <= 0 || c->n_layer <= 0 || c->n_head <= 0 || c->n_ff <= 0 ||
                       c->n_ctx_train <= 0,
                   LOOM_ERR_BAD_MODEL, "model: llama dimensions must be positive");
    LOOM_RETURN_IF(c->n_head_kv <= 0 || c->n_head % c->n_head_kv != 0, LOOM_ERR_BAD_MODEL,
                   "model: llama.attention.head_count %d is not a multiple of head_count_kv %d",
                   c->n_head, c->n_head_kv);
    int32_t hd_default = c->n_embd / c->n_head;
    LOOM_TRY(get_dim(g, "llama.attention.key_length", false, (uint32_t)hd_default, &c->head_dim));
    int32_t v_dim = 0;
    LOOM_TRY(get_dim(g, "llama.attention.value_length", false, (uint32_t)c->head_dim, &v_dim));
    LOOM_RETURN_IF(c->head_dim <= 0 || v_dim != c->head_dim, LOOM_ERR_UNSUPPORTED,
                   "model: key_length %d and value_length %d must be equal and positive",
                   c->head_dim, v_dim);
    LOOM_TRY(loom_gguf_get_f32(g, "llama.attention.layer_norm_rms_epsilon", true, 0,
                               &c->rms_eps));
    LOOM_RETURN_IF(!(c->rms_eps > 0) || !isfinite(c->rms_eps), LOOM_ERR_BAD_MODEL,
                   "model: llama.attention.layer_norm_rms_epsilon must be positive");

    loom_rope_params *r = &c->rope;
    r->mode = LOOM_ROPE_NORMAL;
    LOOM_TRY(loom_gguf_get_f32(g, "llama.rope.freq_base", false, 10000.0f, &r->theta_base));
    LOOM_TRY(get_dim(g, "llama.rope.dimension_count", false, (uint32_t)c->head_dim, &r->n_rot));
    LOOM_RETURN_IF(r->n_rot <= 0 || r->n_rot > c->head_dim || r->n_rot % 2 != 0,
                   LOOM_ERR_BAD_MODEL, "model: llama.rope.dimension_count %d is invalid",
                   r->n_rot);
    LOOM_RETURN_IF(!(r->theta_base > 0) || !isfinite(r->theta_base), LOOM_ERR_BAD_MODEL,
                   "model: llama.rope.freq_base must be positive");
    r->freq_scale = 1.0f;
    loom_gguf_str scaling;
    LOOM_TRY(loom_gguf_get_str(g, "llama.rope.scaling.type", false, &scaling));
    float factor = 0.0f;
    LOOM_TRY(loom_gguf_get_f32(g, "llama.rope.scaling.factor", false, 0.0f, &factor));
    if (scaling.len == 0 || loom_gguf_str_eq(scaling, "none")) {
        /* Older files give only the factor; "none" with a factor means no scaling. */
        if (scaling.len == 0 && factor > 0) r->freq_scale = 1.0f / factor;
    } else if (loom_gguf_str_eq(scaling, "linear")) {
        LOOM_RETURN_IF(!(factor > 0), LOOM_ERR_BAD_MODEL,
                       "model: linear rope scaling needs llama.rope.scaling.factor > 0");
        r->freq_scale = 1.0f / factor;
    } else {
        return loom__fail(LOOM_ERR_UNSUPPORTED, "model: rope scaling type '%.*s' is not supported",
                          (int)scaling.len, scaling.ptr);
    }
    return LOOM_OK;
}

static loom_status bind_layer(loom_model *m, int32_t il, loom_layer_weights *w) {
    const loom_model_config *c = &m->cfg;
    int64_t d = c->n_embd, q_dim = (int64_t)c->n_head * c->head_dim;
    int64_t kv_dim = (int64_t)c->n_head_kv * c->head_dim, f = c->n_ff;
    char name[96];
#define BIND(field, suffix, ne0, ne1)                                                              \
    do {                                                                                           \
        snprintf(name, sizeof name, "blk.%d.%s.weight", il, suffix);                               \
        LOOM_TRY(loom__model_tensor(m, name, ne0, ne1, true, &w->field));                          \
    } while (0)
    BIND(attn_norm, "attn_norm", d, 1);
    BIND(wq, "attn_q", d, q_dim);
    BIND(wk, "attn_k", d, kv_dim);
    BIND(wv, "attn_v", d, kv_dim);
    BIND(wo, "attn_output", q_dim, d);
    BIND(ffn_norm, "ffn_norm", d, 1);
    BIND(w_gate, "ffn_gate", d, f);
    BIND(w_up, "ffn_up", d, f);
    BIND(w_down, "ffn_down", f, d);
#undef BIND
    return LOOM_OK;
}

static loom_status bind_rope_factors(loom_model *m) {
    const loom_gguf_tensor *t = loom_gguf_find_tensor(m->gguf, "rope_freqs.weight");
    if (!t) return LOOM_OK;
    int32_t half = m->cfg.rope.n_rot / 2;
    LOOM_RETURN_IF(t->ne[0] != half || t->n_dims != 1, LOOM_ERR_BAD_MODEL,
                   "model: rope_freqs.weight has %lld entries, expected %d", (long long)t->ne[0],
                   half);
    m->rope_freq_factors = malloc((size_t)half * sizeof(float));
    LOOM_RETURN_IF(!m->rope_freq_factors, LOOM_ERR_OUT_OF_MEMORY, "model: out of memory");
    LOOM_RETURN_IF(!loom_dequantize_row(t->type, t->data, m->rope_freq_factors, half),
                   LOOM_ERR_UNSUPPORTED, "model: rope_freqs.weight has type %s",
                   loom_type_name(t->type));
    m->cfg.rope.freq_factors = m->rope_freq_factors;
    return LOOM_OK;
}

loom_status loom__llama_bind_weights(loom_model *m) {
    const loom_model_config *c = &m->cfg;
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
