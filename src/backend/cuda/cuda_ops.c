/* cuda_ops.c — the CUDA backend's ops: each checks its arguments on the host (views, shapes,
 * descriptors: the same checks and messages as the CPU backend's, tensor/tensor_check.h),
 * then queues its kernels (kernels/loom_kernels.h) on the stream. Nothing here reads device
 * memory. */
#include "backend/cuda/cuda_internal.h"

#include "tensor/tensor_check.h"
#include "tensor/types.h"

#include <math.h>

static loom__k_weight weight_of(const loom_tensor *w) {
    return (loom__k_weight){.type = (uint32_t)w->type,
                            .k = w->ne[0],
                            .n = w->ne[1],
                            .stride = w->row_stride,
                            .data = w->data};
}

static loom_status check_native_weight(const char *op, const loom_tensor *w) {
    LOOM_TRY(loom__check_weight("cuda", op, "w", w));
    LOOM_RETURN_IF(!loom__cuda_weight_type_native((uint32_t)w->type), LOOM_ERR_UNSUPPORTED,
                   "%s: weight type %s is not read by the cuda kernels (weight_prepare converts "
                   "it to bf16)",
                   op, loom__type_name(w->type));
    return LOOM_OK;
}

/* ------------------------------------------------------------------------------------------ */
/* Weights                                                                                    */
/* ------------------------------------------------------------------------------------------ */

loom_status loom__cuda_get_rows_op(void *stream, const loom_tensor *table, const loom_tensor *ids,
                                   loom_tensor *out) {
    loom__cuda_stream *c = stream;
    LOOM_CHECK_ARG(c != NULL);
    LOOM_TRY(check_native_weight("get_rows", table));
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
    LOOM_TRY(loom__cuda_bind(c->dev));
    loom__k_weight w = weight_of(table);
    return loom__cuda_get_rows(c->s, &w, ids->data, ids->ne[0], out->data, out->row_stride);
}

loom_status loom__cuda_matmul_op(void *stream, const loom_tensor *w, const loom_tensor *x,
                                 loom_tensor *out) {
    loom__cuda_stream *c = stream;
    LOOM_CHECK_ARG(c != NULL);
    LOOM_TRY(check_native_weight("matmul", w));
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
    if (x->ne[1] == 0) return LOOM_OK;
    LOOM_TRY(loom__cuda_bind(c->dev));
    loom__k_weight kw = weight_of(w);
    return loom__cuda_matmul(c->s, &kw, x->data, x->row_stride, x->ne[1], out->data,
                             out->row_stride);
}

/* ------------------------------------------------------------------------------------------ */
/* Row-wise and element-wise                                                                  */
/* ------------------------------------------------------------------------------------------ */

loom_status loom__cuda_rms_norm_op(void *stream, const loom_tensor *x, const loom_tensor *w,
                                   float eps, loom_tensor *out) {
    loom__cuda_stream *c = stream;
    LOOM_CHECK_ARG(c != NULL);
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
    LOOM_TRY(loom__cuda_bind(c->dev));
    loom__k_rows r = {.n_rows = out->ne[1],
                      .n_cols = out->ne[0],
                      .x_stride = x->row_stride,
                      .out_stride = out->row_stride};
    return loom__cuda_rms_norm(c->s, &r, x->data, w ? w->data : NULL, eps, out->data);
}

loom_status loom__cuda_add_op(void *stream, const loom_tensor *a, const loom_tensor *b,
                              loom_tensor *out) {
    loom__cuda_stream *c = stream;
    LOOM_CHECK_ARG(c != NULL);
    LOOM_TRY(loom__check_f32("add", "a", a));
    LOOM_TRY(loom__check_f32("add", "b", b));
    LOOM_TRY(loom__check_f32("add", "out", out));
    LOOM_TRY(loom__check_same_shape("add", "a", a, "out", out));
    LOOM_RETURN_IF(
        b->ne[0] != a->ne[0] || (b->ne[1] != a->ne[1] && b->ne[1] != 1), LOOM_ERR_INVALID_ARG,
        "add: b is [%lld, %lld]; it must be a's shape [%lld, %lld] or one row", (long long)b->ne[1],
        (long long)b->ne[0], (long long)a->ne[1], (long long)a->ne[0]);
    LOOM_TRY(loom__cuda_bind(c->dev));
    loom__k_rows r = {.n_rows = out->ne[1],
                      .n_cols = out->ne[0],
                      .x_stride = a->row_stride,
                      .y_stride = b->ne[1] == 1 ? 0 : b->row_stride,
                      .out_stride = out->row_stride};
    return loom__cuda_add(c->s, &r, a->data, b->data, out->data);
}

loom_status loom__cuda_scale_op(void *stream, const loom_tensor *x, float s, loom_tensor *out) {
    loom__cuda_stream *c = stream;
    LOOM_CHECK_ARG(c != NULL);
    LOOM_TRY(loom__check_f32("scale", "x", x));
    LOOM_TRY(loom__check_f32("scale", "out", out));
    LOOM_TRY(loom__check_same_shape("scale", "x", x, "out", out));
    LOOM_TRY(loom__cuda_bind(c->dev));
    loom__k_rows r = {.n_rows = out->ne[1],
                      .n_cols = out->ne[0],
                      .x_stride = x->row_stride,
                      .out_stride = out->row_stride};
    return loom__cuda_scale(c->s, &r, x->data, s, out->data);
}

loom_status loom__cuda_glu_op(void *stream, const loom_tensor *gate, const loom_tensor *up,
                              loom_glu_kind kind, loom_tensor *out) {
    loom__cuda_stream *c = stream;
    LOOM_CHECK_ARG(c != NULL);
    LOOM_TRY(loom__check_f32("glu", "gate", gate));
    LOOM_TRY(loom__check_f32("glu", "up", up));
    LOOM_TRY(loom__check_f32("glu", "out", out));
    LOOM_TRY(loom__check_same_shape("glu", "gate", gate, "up", up));
    LOOM_TRY(loom__check_same_shape("glu", "gate", gate, "out", out));
    LOOM_RETURN_IF(kind != LOOM_GLU_SWIGLU && kind != LOOM_GLU_GEGLU_TANH, LOOM_ERR_INVALID_ARG,
                   "glu: unknown kind %d", (int)kind);
    LOOM_TRY(loom__cuda_bind(c->dev));
    loom__k_rows r = {.n_rows = out->ne[1],
                      .n_cols = out->ne[0],
                      .x_stride = gate->row_stride,
                      .y_stride = up->row_stride,
                      .out_stride = out->row_stride};
    return loom__cuda_glu(c->s, &r, gate->data, up->data, kind == LOOM_GLU_SWIGLU ? 0 : 1,
                          out->data);
}

loom_status loom__cuda_rope_op(void *stream, loom_tensor *x, const loom_tensor *pos,
                               const loom_rope_params *p) {
    loom__cuda_stream *c = stream;
    LOOM_CHECK_ARG(c != NULL);
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
    if (x->ne[1] == 0) return LOOM_OK;
    LOOM_RETURN_IF(pos->data == NULL || (uintptr_t)pos->data % 4 != 0, LOOM_ERR_INVALID_ARG,
                   "rope: pos data is NULL or misaligned");
    /* The frequency factors are a prepared weight in device memory: validated where the model
     * reads them from its file, not here. */
    LOOM_TRY(loom__cuda_bind(c->dev));
    loom__k_rope kp = {.n_rows = x->ne[1],
                       .x_stride = x->row_stride,
                       .n_head = p->n_head,
                       .head_dim = p->head_dim,
                       .n_rot = p->n_rot,
                       .neox = p->mode == LOOM_ROPE_NEOX,
                       .theta_base = p->theta_base,
                       .freq_scale = p->freq_scale,
                       .freq_factors = p->freq_factors,
                       .pos = pos->data};
    return loom__cuda_rope(c->s, &kp, x->data);
}

/* ------------------------------------------------------------------------------------------ */
/* The paged KV cache                                                                         */
/* ------------------------------------------------------------------------------------------ */

/* The descriptor is one the kernels read (F32, F16 or BF16 values, NHD, no scales) and layer
 * one of its layers; *pool_layer the layer whose pools the op uses. */
static loom_status check_kv_use(const char *op, const loom_kv_desc *kv, int32_t layer,
                                bool via_layer_src, int32_t *pool_layer) {
    LOOM_RETURN_IF(kv == NULL, LOOM_ERR_INVALID_ARG, "%s: kv descriptor is NULL", op);
    LOOM_RETURN_IF(kv->kv_type != LOOM_TYPE_F16 && kv->kv_type != LOOM_TYPE_F32 &&
                       kv->kv_type != LOOM_TYPE_BF16,
                   LOOM_ERR_UNSUPPORTED, "%s: kv type %s (cuda stores f16, bf16 and f32)", op,
                   loom__type_name(kv->kv_type));
    LOOM_RETURN_IF(kv->layout != LOOM_KV_LAYOUT_NHD || kv->scale_kind != LOOM_KV_SCALE_NONE,
                   LOOM_ERR_UNSUPPORTED, "%s: kv layout %d with scales %d (cuda: NHD, no scales)",
                   op, (int)kv->layout, (int)kv->scale_kind);
    LOOM_RETURN_IF(layer < 0 || layer >= kv->n_layers, LOOM_ERR_INVALID_ARG,
                   "%s: layer %d outside [0, %d)", op, layer, kv->n_layers);
    LOOM_RETURN_IF(!via_layer_src && kv->layer_src != NULL && kv->layer_src[layer] != layer,
                   LOOM_ERR_INVALID_ARG, "%s: layer %d reads layer %d's pools and stores none", op,
                   layer, kv->layer_src[layer]);
    *pool_layer = via_layer_src && kv->layer_src != NULL ? kv->layer_src[layer] : layer;
    return LOOM_OK;
}

loom_status loom__cuda_kv_store_op(void *stream, const loom_tensor *k, const loom_tensor *v,
                                   const loom_kv_desc *kv, int32_t layer) {
    loom__cuda_stream *c = stream;
    LOOM_CHECK_ARG(c != NULL);
    LOOM_TRY(loom__check_f32("kv_store", "k", k));
    LOOM_TRY(loom__check_f32("kv_store", "v", v));
    LOOM_TRY(loom__check_same_shape("kv_store", "k", k, "v", v));
    int32_t pool_layer;
    LOOM_TRY(check_kv_use("kv_store", kv, layer, false, &pool_layer));
    const int64_t n_rows = kv->q_start[kv->n_seqs];
    const int64_t kv_dim = (int64_t)kv->n_kv_heads * kv->head_dim;
    LOOM_RETURN_IF(k->ne[0] != kv_dim, LOOM_ERR_INVALID_ARG,
                   "kv_store: k rows have %lld elements but n_kv_heads*head_dim = %d*%d",
                   (long long)k->ne[0], kv->n_kv_heads, kv->head_dim);
    LOOM_RETURN_IF(k->ne[1] != n_rows, LOOM_ERR_INVALID_ARG,
                   "kv_store: k has %lld rows but the descriptor has %lld new rows",
                   (long long)k->ne[1], (long long)n_rows);
    if (n_rows == 0) return LOOM_OK;
    const loom__k_kv *dk;
    LOOM_TRY(loom__cuda_find_step_kv(c, "kv_store", kv, &dk));
    LOOM_TRY(loom__cuda_bind(c->dev));
    return loom__cuda_kv_store(c->s, dk, k->data, k->row_stride, v->data, v->row_stride,
                               kv->k_base[pool_layer], kv->v_base[pool_layer]);
}

loom_status loom__cuda_attention_op(void *stream, const loom_tensor *q, const loom_kv_desc *kv,
                                    const loom_attn_params *p, loom_tensor *out) {
    loom__cuda_stream *c = stream;
    LOOM_CHECK_ARG(c != NULL);
    LOOM_TRY(loom__check_f32("attention", "q", q));
    LOOM_TRY(loom__check_f32("attention", "out", out));
    LOOM_TRY(loom__check_same_shape("attention", "q", q, "out", out));
    LOOM_RETURN_IF(p == NULL, LOOM_ERR_INVALID_ARG, "attention: params are NULL");
    int32_t pool_layer;
    LOOM_TRY(check_kv_use("attention", kv, p->layer, true, &pool_layer));
    LOOM_RETURN_IF(p->n_head < 1 || p->n_head % kv->n_kv_heads != 0, LOOM_ERR_INVALID_ARG,
                   "attention: n_head %d is not a positive multiple of n_kv_heads %d", p->n_head,
                   kv->n_kv_heads);
    LOOM_RETURN_IF(!isfinite(p->scale), LOOM_ERR_INVALID_ARG, "attention: scale %g is not finite",
                   (double)p->scale);
    LOOM_RETURN_IF(!(p->softcap >= 0.0f) || !isfinite(p->softcap), LOOM_ERR_INVALID_ARG,
                   "attention: softcap %g must be finite and >= 0", (double)p->softcap);
    const int64_t n_rows = kv->q_start[kv->n_seqs];
    LOOM_RETURN_IF(q->ne[0] != (int64_t)p->n_head * kv->head_dim, LOOM_ERR_INVALID_ARG,
                   "attention: q rows have %lld elements but n_head*head_dim = %d*%d",
                   (long long)q->ne[0], p->n_head, kv->head_dim);
    LOOM_RETURN_IF(q->ne[1] != n_rows, LOOM_ERR_INVALID_ARG,
                   "attention: q has %lld rows but the descriptor has %lld new rows",
                   (long long)q->ne[1], (long long)n_rows);
    LOOM_RETURN_IF(loom__tensors_overlap(q, out), LOOM_ERR_INVALID_ARG,
                   "attention: out overlaps q (no in-place attention)");
    LOOM_RETURN_IF(!loom__cuda_attention_shape_ok(p->n_head, kv->n_kv_heads, kv->head_dim),
                   LOOM_ERR_UNSUPPORTED,
                   "attention: %d query heads over %d kv heads of %d elements (cuda: head_dim "
                   "<= 256, at most 16 query heads per kv head, 8 for head_dim > 128)",
                   p->n_head, kv->n_kv_heads, kv->head_dim);
    if (n_rows == 0) return LOOM_OK;
    const loom__k_kv *dk;
    LOOM_TRY(loom__cuda_find_step_kv(c, "attention", kv, &dk));
    LOOM_TRY(loom__cuda_bind(c->dev));
    const size_t need = loom__cuda_attention_work_bytes(p->n_head, kv->head_dim);
    if (need > c->attn_work_cap) c->n_grows++;
    LOOM_TRY(loom__cuda_reserve_attn(c, need));
    loom__k_attn ka = {.q = q->data,
                       .q_stride = q->row_stride,
                       .out = out->data,
                       .out_stride = out->row_stride,
                       .k_pool = kv->k_base[pool_layer],
                       .v_pool = kv->v_base[pool_layer],
                       .n_head = p->n_head,
                       .scale = p->scale,
                       .softcap = p->softcap,
                       .work = c->attn_work};
    return loom__cuda_attention(c->s, dk, &ka);
}
