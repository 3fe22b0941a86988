/* op_check.c — the argument checks of each backend op, one definition for every backend
 * (op_check.h). */
#include "tensor/op_check.h"

#include <math.h>
#include <stdint.h>

#include "core/status.h"
#include "tensor/tensor_check.h"
#include "tensor/types.h"

loom_status loom__check_get_rows(const char *backend, const loom_tensor *table,
                                 const loom_tensor *ids, const loom_tensor *out) {
    LOOM_TRY(loom__check_weight(backend, "get_rows", "table", table));
    LOOM_RETURN_IF(ids == NULL, LOOM_ERR_INVALID_ARG, "get_rows: ids is NULL");
    LOOM_RETURN_IF(ids->type != LOOM_TYPE_I32, LOOM_ERR_UNSUPPORTED,
                   "get_rows: ids must be i32, got %s", loom__type_name(ids->type));
    LOOM_RETURN_IF(ids->ne[0] < 0 || ids->ne[1] != 1, LOOM_ERR_INVALID_ARG,
                   "get_rows: ids is [%lld, %lld] but must be one row of n ids",
                   (long long)ids->ne[1], (long long)ids->ne[0]);
    LOOM_RETURN_IF(ids->ne[0] > 0 && (ids->data == NULL || (uintptr_t)ids->data % 4 != 0),
                   LOOM_ERR_INVALID_ARG, "get_rows: ids data is NULL or misaligned");
    LOOM_TRY(loom__check_f32("get_rows", "out", out));
    LOOM_RETURN_IF(out->ne[0] != table->ne[0] || out->ne[1] != ids->ne[0], LOOM_ERR_INVALID_ARG,
                   "get_rows: out is [%lld, %lld] but must be [n=%lld, D=%lld]",
                   (long long)out->ne[1], (long long)out->ne[0], (long long)ids->ne[0],
                   (long long)table->ne[0]);
    return LOOM_OK;
}

loom_status loom__check_matmul(const char *backend, const loom_tensor *w, const loom_tensor *x,
                               const loom_tensor *out) {
    LOOM_TRY(loom__check_weight(backend, "matmul", "w", w));
    LOOM_TRY(loom__check_f32("matmul", "x", x));
    LOOM_TRY(loom__check_f32("matmul", "out", out));
    LOOM_RETURN_IF(w->ne[1] < 1, LOOM_ERR_INVALID_ARG, "matmul: w has no rows");
    LOOM_RETURN_IF(x->ne[0] != w->ne[0], LOOM_ERR_INVALID_ARG,
                   "matmul: x has %lld columns but w rows have %lld (K must match)",
                   (long long)x->ne[0], (long long)w->ne[0]);
    LOOM_RETURN_IF(out->ne[0] != w->ne[1] || out->ne[1] != x->ne[1], LOOM_ERR_INVALID_ARG,
                   "matmul: out is [%lld, %lld] but must be [T=%lld, N=%lld]",
                   (long long)out->ne[1], (long long)out->ne[0], (long long)x->ne[1],
                   (long long)w->ne[1]);
    LOOM_RETURN_IF(loom__tensors_overlap(out, x) || loom__tensors_overlap(out, w),
                   LOOM_ERR_INVALID_ARG, "matmul: out overlaps an input (no in-place matmul)");
    return LOOM_OK;
}

loom_status loom__check_matmul_multi(const char *backend, int n, const loom_tensor *const *ws,
                                     const loom_tensor *x, loom_tensor *const *outs) {
    LOOM_RETURN_IF(n < 1 || n > LOOM_MATMUL_MULTI_MAX, LOOM_ERR_INVALID_ARG,
                   "matmul_multi: %d matmuls (1 .. %d)", n, LOOM_MATMUL_MULTI_MAX);
    LOOM_RETURN_IF(ws == NULL || outs == NULL, LOOM_ERR_INVALID_ARG,
                   "matmul_multi: weights or outputs are NULL");
    for (int j = 0; j < n; j++) {
        LOOM_RETURN_IF(ws[j] == NULL || outs[j] == NULL, LOOM_ERR_INVALID_ARG,
                       "matmul_multi: weight or output %d is NULL", j);
        LOOM_TRY(loom__check_matmul(backend, ws[j], x, outs[j]));
        for (int i = 0; i < n; i++)
            LOOM_RETURN_IF(i != j && loom__tensors_overlap(outs[j], ws[i]), LOOM_ERR_INVALID_ARG,
                           "matmul_multi: out %d overlaps weight %d", j, i);
        for (int i = 0; i < j; i++)
            LOOM_RETURN_IF(loom__tensors_overlap(outs[j], outs[i]), LOOM_ERR_INVALID_ARG,
                           "matmul_multi: outs %d and %d overlap", i, j);
    }
    return LOOM_OK;
}

loom_status loom__check_rms_norm(const loom_tensor *x, const loom_tensor *w, float eps,
                                 const loom_tensor *out) {
    LOOM_TRY(loom__check_f32("rms_norm", "x", x));
    LOOM_TRY(loom__check_f32("rms_norm", "out", out));
    LOOM_TRY(loom__check_same_shape("rms_norm", "x", x, "out", out));
    if (w != NULL) {
        LOOM_TRY(loom__check_f32("rms_norm", "w", w));
        LOOM_RETURN_IF(w->ne[0] != x->ne[0] || w->ne[1] != 1, LOOM_ERR_INVALID_ARG,
                       "rms_norm: w is [%lld, %lld] but must be [1, %lld]", (long long)w->ne[1],
                       (long long)w->ne[0], (long long)x->ne[0]);
    }
    LOOM_RETURN_IF(!(eps >= 0.0f) || !isfinite(eps), LOOM_ERR_INVALID_ARG,
                   "rms_norm: eps %g must be finite and >= 0", (double)eps);
    return LOOM_OK;
}

loom_status loom__check_add(const loom_tensor *a, const loom_tensor *b, const loom_tensor *out) {
    LOOM_TRY(loom__check_f32("add", "a", a));
    LOOM_TRY(loom__check_f32("add", "b", b));
    LOOM_TRY(loom__check_f32("add", "out", out));
    LOOM_TRY(loom__check_same_shape("add", "a", a, "out", out));
    LOOM_RETURN_IF(
        b->ne[0] != a->ne[0] || (b->ne[1] != a->ne[1] && b->ne[1] != 1), LOOM_ERR_INVALID_ARG,
        "add: b is [%lld, %lld]; it must be a's shape [%lld, %lld] or one row", (long long)b->ne[1],
        (long long)b->ne[0], (long long)a->ne[1], (long long)a->ne[0]);
    return LOOM_OK;
}

loom_status loom__check_add_rms_norm(const loom_tensor *x, const loom_tensor *y,
                                     const loom_tensor *w, float eps, const loom_tensor *out) {
    LOOM_TRY(loom__check_f32("add_rms_norm", "x", x));
    LOOM_TRY(loom__check_f32("add_rms_norm", "y", y));
    LOOM_TRY(loom__check_same_shape("add_rms_norm", "x", x, "y", y));
    LOOM_TRY(loom__check_rms_norm(x, w, eps, out));
    LOOM_RETURN_IF(loom__tensors_overlap(out, x) || loom__tensors_overlap(out, y),
                   LOOM_ERR_INVALID_ARG, "add_rms_norm: out overlaps x or y");
    return LOOM_OK;
}

loom_status loom__check_scale(const loom_tensor *x, const loom_tensor *out) {
    LOOM_TRY(loom__check_f32("scale", "x", x));
    LOOM_TRY(loom__check_f32("scale", "out", out));
    return loom__check_same_shape("scale", "x", x, "out", out);
}

loom_status loom__check_glu(const loom_tensor *gate, const loom_tensor *up, loom_glu_kind kind,
                            const loom_tensor *out) {
    LOOM_TRY(loom__check_f32("glu", "gate", gate));
    LOOM_TRY(loom__check_f32("glu", "up", up));
    LOOM_TRY(loom__check_f32("glu", "out", out));
    LOOM_TRY(loom__check_same_shape("glu", "gate", gate, "up", up));
    LOOM_TRY(loom__check_same_shape("glu", "gate", gate, "out", out));
    LOOM_RETURN_IF(kind != LOOM_GLU_SWIGLU && kind != LOOM_GLU_GEGLU_TANH, LOOM_ERR_INVALID_ARG,
                   "glu: unknown kind %d", (int)kind);
    return LOOM_OK;
}

loom_status loom__check_rope(const loom_tensor *x, const loom_tensor *pos,
                             const loom_rope_params *p) {
    LOOM_TRY(loom__check_f32("rope", "x", x));
    LOOM_RETURN_IF(p == NULL, LOOM_ERR_INVALID_ARG, "rope: params are NULL");
    LOOM_RETURN_IF(p->mode != LOOM_ROPE_NORMAL && p->mode != LOOM_ROPE_NEOX, LOOM_ERR_INVALID_ARG,
                   "rope: unknown mode %d", (int)p->mode);
    LOOM_RETURN_IF(p->n_head < 1 || p->head_dim < 1, LOOM_ERR_INVALID_ARG,
                   "rope: n_head %d and head_dim %d must be >= 1", p->n_head, p->head_dim);
    LOOM_RETURN_IF(p->n_rot < 2 || p->n_rot % 2 != 0 || p->n_rot > p->head_dim,
                   LOOM_ERR_INVALID_ARG, "rope: n_rot %d must be even and in [2, head_dim=%d]",
                   p->n_rot, p->head_dim);
    LOOM_RETURN_IF((int64_t)p->n_head * p->head_dim != x->ne[0], LOOM_ERR_INVALID_ARG,
                   "rope: x rows have %lld elements but n_head*head_dim = %d*%d",
                   (long long)x->ne[0], p->n_head, p->head_dim);
    LOOM_RETURN_IF(!(p->theta_base > 0.0f) || !isfinite(p->theta_base), LOOM_ERR_INVALID_ARG,
                   "rope: theta_base %g must be finite and > 0", (double)p->theta_base);
    LOOM_RETURN_IF(!isfinite(p->freq_scale), LOOM_ERR_INVALID_ARG,
                   "rope: freq_scale %g is not finite", (double)p->freq_scale);
    LOOM_RETURN_IF(pos == NULL, LOOM_ERR_INVALID_ARG, "rope: pos is NULL");
    LOOM_RETURN_IF(pos->type != LOOM_TYPE_I32, LOOM_ERR_UNSUPPORTED,
                   "rope: pos must be i32, got %s", loom__type_name(pos->type));
    LOOM_RETURN_IF(pos->ne[0] != x->ne[1] || pos->ne[1] != 1, LOOM_ERR_INVALID_ARG,
                   "rope: pos is [%lld, %lld] but must be one row of T=%lld positions",
                   (long long)pos->ne[1], (long long)pos->ne[0], (long long)x->ne[1]);
    LOOM_RETURN_IF(x->ne[1] > 0 && (pos->data == NULL || (uintptr_t)pos->data % 4 != 0),
                   LOOM_ERR_INVALID_ARG, "rope: pos data is NULL or misaligned");
    return LOOM_OK;
}

loom_status loom__check_kv_use(const char *backend, const char *op, const loom_kv_desc *kv,
                               int32_t layer, bool via_layer_src, int32_t *pool_layer) {
    LOOM_RETURN_IF(kv == NULL, LOOM_ERR_INVALID_ARG, "%s: kv descriptor is NULL", op);
    LOOM_RETURN_IF(kv->layout != LOOM_KV_LAYOUT_NHD ||
                       kv->scale_kind != loom__kv_scale_kind_of(kv->kv_type),
                   LOOM_ERR_UNSUPPORTED,
                   "%s: kv layout %d with scales %d (%s: NHD, scales per position and head for "
                   "FP8, none otherwise)",
                   op, (int)kv->layout, (int)kv->scale_kind, backend);
    LOOM_RETURN_IF(layer < 0 || layer >= kv->n_layers, LOOM_ERR_INVALID_ARG,
                   "%s: layer %d outside [0, %d)", op, layer, kv->n_layers);
    LOOM_RETURN_IF((kv->kv_flags & ~(LOOM_KV_HADAMARD | LOOM_KV_MERGED)) != 0, LOOM_ERR_UNSUPPORTED,
                   "%s: kv_flags %#x (%s)", op, (unsigned)kv->kv_flags, backend);
    /* kv_store writes only the layers that own pools (a reusing layer stores nothing), and the
     * later layer of a merged pair, which stores into its pair's pools. */
    const int32_t partner = loom_kv_merge_partner(kv, layer);
    const bool merged_b = partner >= 0 && partner < layer;
    LOOM_RETURN_IF(!via_layer_src && !merged_b && kv->layer_src != NULL &&
                       kv->layer_src[layer] != layer,
                   LOOM_ERR_INVALID_ARG, "%s: layer %d reads layer %d's pools and stores none", op,
                   layer, kv->layer_src[layer]);
    *pool_layer =
        (via_layer_src || merged_b) && kv->layer_src != NULL ? kv->layer_src[layer] : layer;
    return LOOM_OK;
}

loom_status loom__check_kv_store(const loom_tensor *k, const loom_tensor *v, const loom_kv_desc *kv,
                                 int64_t *n_rows) {
    LOOM_TRY(loom__check_f32("kv_store", "k", k));
    LOOM_TRY(loom__check_f32("kv_store", "v", v));
    LOOM_TRY(loom__check_same_shape("kv_store", "k", k, "v", v));
    LOOM_RETURN_IF(kv == NULL, LOOM_ERR_INVALID_ARG, "kv_store: kv descriptor is NULL");
    *n_rows = kv->q_start[kv->n_seqs];
    const int64_t kv_dim = (int64_t)kv->n_kv_heads * kv->head_dim;
    LOOM_RETURN_IF(k->ne[0] != kv_dim, LOOM_ERR_INVALID_ARG,
                   "kv_store: k rows have %lld elements but n_kv_heads*head_dim = %d*%d",
                   (long long)k->ne[0], kv->n_kv_heads, kv->head_dim);
    LOOM_RETURN_IF(k->ne[1] != *n_rows, LOOM_ERR_INVALID_ARG,
                   "kv_store: k has %lld rows but the descriptor has %lld new rows",
                   (long long)k->ne[1], (long long)*n_rows);
    return LOOM_OK;
}

loom_status loom__check_attention(const loom_tensor *q, const loom_kv_desc *kv,
                                  const loom_attn_params *p, const loom_tensor *out,
                                  int64_t *n_rows) {
    LOOM_TRY(loom__check_f32("attention", "q", q));
    LOOM_TRY(loom__check_f32("attention", "out", out));
    LOOM_TRY(loom__check_same_shape("attention", "q", q, "out", out));
    LOOM_RETURN_IF(p == NULL, LOOM_ERR_INVALID_ARG, "attention: params are NULL");
    LOOM_RETURN_IF(kv == NULL, LOOM_ERR_INVALID_ARG, "attention: kv descriptor is NULL");
    LOOM_RETURN_IF(kv->n_kv_heads < 1 || p->n_head < 1 || p->n_head % kv->n_kv_heads != 0,
                   LOOM_ERR_INVALID_ARG,
                   "attention: n_head %d is not a positive multiple of n_kv_heads %d", p->n_head,
                   kv->n_kv_heads);
    LOOM_RETURN_IF(!isfinite(p->scale), LOOM_ERR_INVALID_ARG, "attention: scale %g is not finite",
                   (double)p->scale);
    LOOM_RETURN_IF(!(p->softcap >= 0.0f) || !isfinite(p->softcap), LOOM_ERR_INVALID_ARG,
                   "attention: softcap %g must be finite and >= 0", (double)p->softcap);
    *n_rows = kv->q_start[kv->n_seqs];
    LOOM_RETURN_IF(q->ne[0] != (int64_t)p->n_head * kv->head_dim, LOOM_ERR_INVALID_ARG,
                   "attention: q rows have %lld elements but n_head*head_dim = %d*%d",
                   (long long)q->ne[0], p->n_head, kv->head_dim);
    LOOM_RETURN_IF(q->ne[1] != *n_rows, LOOM_ERR_INVALID_ARG,
                   "attention: q has %lld rows but the descriptor has %lld new rows",
                   (long long)q->ne[1], (long long)*n_rows);
    LOOM_RETURN_IF(loom__tensors_overlap(q, out), LOOM_ERR_INVALID_ARG,
                   "attention: out overlaps q (no in-place attention)");
    return LOOM_OK;
}
