/* arch_gemma3.c — the Gemma 3 configuration.
 *
 * From the metadata: widths, heads, head_dim (key_length), rms eps, the global rope base
 * (rope.freq_base) and linear rope scaling, the sliding window, and — when the file has them —
 * the local rope base (rope.freq_base_swa) and the layer pattern
 * (attention.sliding_window_pattern: a per-layer bool array, or a period).
 * From the published architecture, where the file is silent: the NeoX rope layout; local
 * layers use rope base 10000 and no scaling; five local layers then one global (layer il is
 * global iff (il + 1) % 6 == 0); embeddings scaled by sqrt(n_embd); GELU-tanh gated FFN;
 * queries scaled by 1/sqrt(query_pre_attn_scalar), which is head_dim for the released sizes
 * (the 27B's d_model / n_head is head_dim... set by key when present). */
#include <math.h>
#include <stdio.h>

#include "model/model.h"

#define GEMMA3_LOCAL_ROPE_BASE 10000.0f
#define GEMMA3_PATTERN_PERIOD  6

/* Marks which layers are local (sliding window) from the metadata or the published pattern. */
static loom_status read_layer_pattern(const loom__gguf *g, loom__model_config *c) {
    const loom__gguf_kv *kv = loom__gguf_find_kv(g, "gemma3.attention.sliding_window_pattern");
    if (kv && kv->value.type == LOOM_GGUF_ARR) {
        const loom__gguf_value *a = &kv->value;
        LOOM_RETURN_IF(a->arr.elem_type != LOOM_GGUF_BOOL || a->arr.n != (uint64_t)c->n_layer,
                       LOOM_ERR_BAD_MODEL,
                       "model: gemma3.attention.sliding_window_pattern must be %d bools",
                       c->n_layer);
        for (int32_t il = 0; il < c->n_layer; il++) {
            c->layers[il].window = loom__gguf_arr_i64(a, (uint64_t)il) ? c->n_swa : 0;
        }
        return LOOM_OK;
    }
    int32_t period = GEMMA3_PATTERN_PERIOD;
    if (kv) {
        LOOM_TRY(loom__hparam_dim(g, "gemma3", "attention.sliding_window_pattern", false,
                                  GEMMA3_PATTERN_PERIOD, &period));
        LOOM_RETURN_IF(period < 1, LOOM_ERR_BAD_MODEL,
                       "model: gemma3.attention.sliding_window_pattern must be >= 1");
    }
    for (int32_t il = 0; il < c->n_layer; il++) {
        c->layers[il].window = (il + 1) % period == 0 ? 0 : c->n_swa;
    }
    return LOOM_OK;
}

loom_status loom__gemma3_read_config(const loom__gguf *g, loom__model_config *c) {
    LOOM_TRY(loom__hparams_common(g, "gemma3", c));
    LOOM_TRY(loom__hparam_dim(g, "gemma3", "attention.sliding_window", true, 0, &c->n_swa));
    LOOM_RETURN_IF(c->n_swa < 1, LOOM_ERR_BAD_MODEL,
                   "model: gemma3.attention.sliding_window must be positive");
    float local_base = GEMMA3_LOCAL_ROPE_BASE;
    LOOM_TRY(loom__gguf_get_f32(g, "gemma3.rope.freq_base_swa", false, GEMMA3_LOCAL_ROPE_BASE,
                                &local_base));
    LOOM_RETURN_IF(!(local_base > 0) || !isfinite(local_base), LOOM_ERR_BAD_MODEL,
                   "model: gemma3.rope.freq_base_swa must be positive");
    int32_t pre_attn_scalar = c->head_dim;
    LOOM_TRY(loom__hparam_dim(g, "gemma3", "attention.query_pre_attn_scalar", false,
                              (uint32_t)c->head_dim, &pre_attn_scalar));
    LOOM_RETURN_IF(pre_attn_scalar < 1, LOOM_ERR_BAD_MODEL,
                   "model: gemma3.attention.query_pre_attn_scalar must be positive");
    LOOM_TRY(read_layer_pattern(g, c));

    c->embd_scale = sqrtf((float)c->n_embd);
    c->attn_scale = 1.0f / sqrtf((float)pre_attn_scalar);
    c->glu = LOOM_GLU_GEGLU_TANH;
    for (int32_t il = 0; il < c->n_layer; il++) {
        loom_rope_params *r = &c->layers[il].rope;
        r->mode = LOOM_ROPE_NEOX;
        if (c->layers[il].window > 0) {
            r->theta_base = local_base;
            r->freq_scale = 1.0f;
        }
    }
    return LOOM_OK;
}
