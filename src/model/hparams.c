/* hparams.c — the hyper-parameters every decoder architecture here shares, read from
 * "<arch>.*" metadata keys with range checks (values come from an untrusted file). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "model/model.h"

loom_status loom__hparam_dim(const loom__gguf *g, const char *arch, const char *key, bool required,
                             uint32_t def, int32_t *out) {
    char full[128];
    snprintf(full, sizeof full, "%s.%s", arch, key);
    uint32_t v = 0;
    LOOM_TRY(loom__gguf_get_u32(g, full, required, def, &v));
    /* Dimensions beyond 2^24 are not a real model; refusing them keeps products in range. */
    LOOM_RETURN_IF(v > (1u << 24), LOOM_ERR_BAD_MODEL, "model: %s = %u is out of range", full, v);
    *out = (int32_t)v;
    return LOOM_OK;
}

static loom_status hparam_f32(const loom__gguf *g, const char *arch, const char *key, bool required,
                              float def, float *out) {
    char full[128];
    snprintf(full, sizeof full, "%s.%s", arch, key);
    LOOM_TRY(loom__gguf_get_f32(g, full, required, def, out));
    LOOM_RETURN_IF(!isfinite(*out), LOOM_ERR_BAD_MODEL, "model: %s is not finite", full);
    return LOOM_OK;
}

/* Linear rope scaling: freq_scale = 1 / factor. Other kinds are refused by name. */
static loom_status read_rope_scaling(const loom__gguf *g, const char *arch, float *freq_scale) {
    char key[128];
    snprintf(key, sizeof key, "%s.rope.scaling.type", arch);
    loom__gguf_str kind;
    LOOM_TRY(loom__gguf_get_str(g, key, false, &kind));
    float factor = 0.0f;
    LOOM_TRY(hparam_f32(g, arch, "rope.scaling.factor", false, 0.0f, &factor));
    *freq_scale = 1.0f;
    /* A factor whose reciprocal is not a finite positive float (1e-45 gives +inf) would load
     * and then make every position's angle inf or NaN: refused here, by name. Absent is 0. */
    LOOM_RETURN_IF(factor != 0 && !(factor > 0 && isfinite(factor) && isfinite(1.0f / factor) &&
                                    1.0f / factor > 0),
                   LOOM_ERR_BAD_MODEL,
                   "model: %s.rope.scaling.factor = %g (a finite positive value whose reciprocal "
                   "is finite and nonzero)",
                   arch, (double)factor);
    if (kind.len == 0 || loom__gguf_str_eq(kind, "none")) {
        /* Older files give only the factor; "none" with a factor means no scaling. */
        if (kind.len == 0 && factor > 0) *freq_scale = 1.0f / factor;
        return LOOM_OK;
    }
    if (loom__gguf_str_eq(kind, "linear")) {
        LOOM_RETURN_IF(!(factor > 0), LOOM_ERR_BAD_MODEL,
                       "model: linear rope scaling needs %s.rope.scaling.factor > 0", arch);
        *freq_scale = 1.0f / factor;
        return LOOM_OK;
    }
    return loom__fail(LOOM_ERR_UNSUPPORTED, "model: rope scaling type '%.*s' is not supported",
                      (int)kind.len, kind.ptr);
}

loom_status loom__model_assign_kv_groups(loom__model_config *c) {
    c->n_kv_groups = 0;
    /* Full attention first (group 0), so a model with any global layer has its largest pool
     * at index 0. */
    for (int pass = 0; pass < 2; pass++) {
        for (int32_t il = 0; il < c->n_layer; il++) {
            int32_t w = c->layers[il].window;
            if ((pass == 0) != (w == 0)) continue;
            int32_t g = 0;
            while (g < c->n_kv_groups && c->kv_group_window[g] != w) g++;
            if (g == c->n_kv_groups) {
                LOOM_RETURN_IF(g == LOOM_MAX_KV_GROUPS, LOOM_ERR_UNSUPPORTED,
                               "model: more than %d distinct attention windows",
                               LOOM_MAX_KV_GROUPS);
                c->kv_group_window[c->n_kv_groups++] = w;
            }
            c->layers[il].kv_group = g;
            c->layers[il].kv_src = il; /* its own KV (loom__model_set_kv_source) */
        }
    }
    return LOOM_OK;
}

loom_status loom__model_read_kv_sharing(const loom__gguf *g, const char *arch,
                                        loom__model_config *c) {
    int32_t n_shared = 0;
    LOOM_TRY(loom__hparam_dim(g, arch, "attention.shared_kv_layers", false, 0, &n_shared));
    if (n_shared == 0) return LOOM_OK;
    LOOM_RETURN_IF(n_shared >= c->n_layer, LOOM_ERR_BAD_MODEL,
                   "model: %s.attention.shared_kv_layers = %d of %d layers leaves none to share",
                   arch, n_shared, c->n_layer);
    const int32_t first_shared = c->n_layer - n_shared;
    for (int32_t il = first_shared; il < c->n_layer; il++) {
        int32_t src = first_shared - 1;
        while (src >= 0 && c->layers[src].kv_group != c->layers[il].kv_group) src--;
        LOOM_RETURN_IF(src < 0, LOOM_ERR_BAD_MODEL,
                       "model: layer %d shares KV (%s.attention.shared_kv_layers = %d) but no "
                       "earlier layer has its attention window",
                       il, arch, n_shared);
        c->layers[il].kv_src = src;
    }
    return LOOM_OK;
}

loom_status loom__hparams_common(const loom__gguf *g, const char *arch, loom__model_config *c) {
    LOOM_TRY(loom__hparam_dim(g, arch, "context_length", true, 0, &c->n_ctx_train));
    LOOM_TRY(loom__hparam_dim(g, arch, "embedding_length", true, 0, &c->n_embd));
    LOOM_TRY(loom__hparam_dim(g, arch, "block_count", true, 0, &c->n_layer));
    LOOM_TRY(loom__hparam_dim(g, arch, "feed_forward_length", true, 0, &c->n_ff));
    LOOM_TRY(loom__hparam_dim(g, arch, "attention.head_count", true, 0, &c->n_head));
    LOOM_TRY(loom__hparam_dim(g, arch, "attention.head_count_kv", false, (uint32_t)c->n_head,
                              &c->n_head_kv));
    LOOM_TRY(loom__hparam_dim(g, arch, "vocab_size", false, 0, &c->n_vocab));
    LOOM_RETURN_IF(c->n_embd <= 0 || c->n_layer <= 0 || c->n_head <= 0 || c->n_ff <= 0 ||
                       c->n_ctx_train <= 0,
                   LOOM_ERR_BAD_MODEL, "model: %s dimensions must be positive", arch);
    LOOM_RETURN_IF(c->n_layer > 4096, LOOM_ERR_BAD_MODEL, "model: %s.block_count %d too large",
                   arch, c->n_layer);
    LOOM_RETURN_IF(c->n_head_kv <= 0 || c->n_head % c->n_head_kv != 0, LOOM_ERR_BAD_MODEL,
                   "model: %s.attention.head_count %d is not a multiple of head_count_kv %d", arch,
                   c->n_head, c->n_head_kv);
    LOOM_TRY(loom__hparam_dim(g, arch, "attention.key_length", false,
                              (uint32_t)(c->n_embd / c->n_head), &c->head_dim));
    int32_t v_dim = 0;
    LOOM_TRY(
        loom__hparam_dim(g, arch, "attention.value_length", false, (uint32_t)c->head_dim, &v_dim));
    LOOM_RETURN_IF(c->head_dim <= 0 || v_dim != c->head_dim, LOOM_ERR_UNSUPPORTED,
                   "model: key_length %d and value_length %d must be equal and positive",
                   c->head_dim, v_dim);
    LOOM_TRY(hparam_f32(g, arch, "attention.layer_norm_rms_epsilon", true, 0, &c->rms_eps));
    LOOM_RETURN_IF(!(c->rms_eps > 0), LOOM_ERR_BAD_MODEL,
                   "model: %s.attention.layer_norm_rms_epsilon must be positive", arch);

    loom_rope_params r;
    memset(&r, 0, sizeof r);
    r.mode = LOOM_ROPE_NORMAL;
    LOOM_TRY(hparam_f32(g, arch, "rope.freq_base", false, 10000.0f, &r.theta_base));
    LOOM_TRY(
        loom__hparam_dim(g, arch, "rope.dimension_count", false, (uint32_t)c->head_dim, &r.n_rot));
    LOOM_RETURN_IF(r.n_rot <= 0 || r.n_rot > c->head_dim || r.n_rot % 2 != 0, LOOM_ERR_BAD_MODEL,
                   "model: %s.rope.dimension_count %d is invalid", arch, r.n_rot);
    LOOM_RETURN_IF(!(r.theta_base > 0 && isfinite(r.theta_base)), LOOM_ERR_BAD_MODEL,
                   "model: %s.rope.freq_base must be positive and finite", arch);
    LOOM_TRY(read_rope_scaling(g, arch, &r.freq_scale));

    c->embd_scale = 1.0f;
    c->attn_scale = 1.0f / sqrtf((float)c->head_dim);
    c->glu = LOOM_GLU_SWIGLU;
    c->layers = loom__calloc((size_t)c->n_layer, sizeof *c->layers);
    LOOM_RETURN_IF(!c->layers, LOOM_ERR_OUT_OF_MEMORY, "model: out of memory");
    for (int32_t il = 0; il < c->n_layer; il++) c->layers[il].rope = r;
    return LOOM_OK;
}
