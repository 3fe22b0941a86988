/* cuda_ops.c — the CUDA backend's ops: each checks its arguments on the host (views, shapes,
 * descriptors: the same checks and messages as the CPU backend's, tensor/tensor_check.h),
 * then queues its kernels (kernels/loom_kernels.h) on the stream. Nothing here reads device
 * memory. */
#include "backend/cuda/cuda_internal.h"

#include <stdlib.h>

#include "tensor/op_check.h"
#include "tensor/tensor_check.h"
#include "tensor/types.h"

/* The element-wise kernels' shape: out's rows and columns, the operands' strides (a y of one
 * row, or none, is read at stride 0: broadcast). */
static loom__k_rows rows_of(const loom_tensor *x, const loom_tensor *y, const loom_tensor *out) {
    return (loom__k_rows){.n_rows = out->ne[1],
                          .n_cols = out->ne[0],
                          .x_stride = x->row_stride,
                          .y_stride = y == NULL || y->ne[1] == 1 ? 0 : y->row_stride,
                          .out_stride = out->row_stride};
}

static loom__k_weight weight_of(const loom_tensor *w) {
    return (loom__k_weight){.type = (uint32_t)w->type,
                            .k = w->ne[0],
                            .n = w->ne[1],
                            .stride = w->row_stride,
                            .data = w->data};
}

/* After the shared checks: a type the kernels read in place. */
static loom_status check_native_weight(const char *op, const loom_tensor *w) {
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
    LOOM_TRY(loom__check_get_rows("cuda", table, ids, out));
    LOOM_TRY(check_native_weight("get_rows", table));
    LOOM_TRY(loom__cuda_launches(c));
    loom__k_weight w = weight_of(table);
    return loom__cuda_get_rows(c->s, &w, ids->data, ids->ne[0], out->data, out->row_stride);
}

/* outs[j] = x·kp[j]ᵀ for j < m weights of one type on the GEMM, its split scratch grown first
 * where the stream was not sized for the step (counted in n_grows). */
static loom_status run_gemm(loom__cuda_stream *c, int m, const loom__k_weight *const *kp,
                            const loom_tensor *x, float *const *op, const size_t *os) {
    const int64_t n_tokens = x->ne[1];
    const size_t need =
        loom__cuda_gemm_multi_work_bytes(m, kp, n_tokens, c->dev->n_sms, c->dev->tc_math);
    const size_t need16 = loom__cuda_gemm_x16_bytes(n_tokens, kp[0]->k, c->dev->tc_math);
    if (need > c->gemm_work_cap || need16 > c->gemm_x16_cap) c->n_grows++;
    LOOM_TRY(loom__cuda_regrow(c, &c->gemm_work, &c->gemm_work_cap, need));
    LOOM_TRY(loom__cuda_regrow(c, &c->gemm_x16, &c->gemm_x16_cap, need16));
    const loom__k_gemm_work work = {c->gemm_work,       c->gemm_work_cap, c->dev->n_sms,
                                    c->gemm_x16,        c->gemm_x16_cap,  c->dev->gemm_plain,
                                    c->dev->tmap_encode};
    return loom__cuda_gemm_multi(c->s, m, kp, x->data, x->row_stride, n_tokens, op, os, &work,
                                 c->dev->tc_math);
}

loom_status loom__cuda_matmul_op(void *stream, const loom_tensor *w, const loom_tensor *x,
                                 loom_tensor *out) {
    loom__cuda_stream *c = stream;
    LOOM_CHECK_ARG(c != NULL);
    LOOM_TRY(loom__check_matmul("cuda", w, x, out));
    LOOM_TRY(check_native_weight("matmul", w));
    if (x->ne[1] == 0) return LOOM_OK;
    LOOM_TRY(loom__cuda_launches(c));
    bool done = false;
    LOOM_TRY(loom__cuda_blaslt_gemm(c, w, x, out, &done));
    if (done) return LOOM_OK;
    loom__k_weight kw = weight_of(w);
    const loom__k_weight *kp = &kw;
    float *op = out->data;
    /* invariant (the default): the GEMM's one order whatever the step's size; in the fast mode
     * the GEMV for steps of 1..8 tokens */
    if (c->dev->batch_invariant || x->ne[1] > LOOM_K_GEMV_MAX_TOKENS)
        return run_gemm(c, 1, &kp, x, &op, &out->row_stride);
    return loom__cuda_gemv(c->s, &kw, x->data, x->row_stride, x->ne[1], out->data, out->row_stride);
}

/* outs[j] = x·ws[j]ᵀ: the weights of each type in one GEMM launch (q, k, v of one type; gate and
 * up), each out the bits of its own matmul. Steps the GEMM does not take (the fast mode's GEMV
 * steps) and weights cuBLASLt takes in the fast mode (FP8 rows, opted in; BF16 in BF16 math)
 * run one matmul each. */
_Static_assert(LOOM_K_GEMM_MULTI == LOOM_MATMUL_MULTI_MAX, "one launch takes a whole call");

loom_status loom__cuda_matmul_multi_op(void *stream, int n, const loom_tensor *const *ws,
                                       const loom_tensor *x, loom_tensor *const *outs) {
    loom__cuda_stream *c = stream;
    LOOM_CHECK_ARG(c != NULL);
    LOOM_TRY(loom__check_matmul_multi("cuda", n, ws, x, outs));
    for (int j = 0; j < n; j++) LOOM_TRY(check_native_weight("matmul_multi", ws[j]));
    const int64_t n_tokens = x->ne[1];
    if (n_tokens == 0) return LOOM_OK;
    bool done[LOOM_MATMUL_MULTI_MAX] = {false};
    for (int j = 0; j < n && !c->dev->batch_invariant; j++)
        if (n_tokens <= LOOM_K_GEMV_MAX_TOKENS || loom__cuda_blaslt_takes(c->dev, ws[j]->type)) {
            LOOM_TRY(loom__cuda_matmul_op(c, ws[j], x, outs[j]));
            done[j] = true;
        }
    LOOM_TRY(loom__cuda_launches(c));
    for (int j = 0; j < n; j++) {
        if (done[j]) continue;
        /* this weight and the later ones of its type */
        loom__k_weight kw[LOOM_K_GEMM_MULTI];
        const loom__k_weight *kp[LOOM_K_GEMM_MULTI];
        float *op[LOOM_K_GEMM_MULTI];
        size_t os[LOOM_K_GEMM_MULTI];
        int m = 0;
        for (int i = j; i < n; i++) {
            if (done[i] || ws[i]->type != ws[j]->type) continue;
            kw[m] = weight_of(ws[i]);
            kp[m] = &kw[m];
            op[m] = outs[i]->data;
            os[m] = outs[i]->row_stride;
            done[i] = true;
            m++;
        }
        LOOM_TRY(run_gemm(c, m, kp, x, op, os));
    }
    return LOOM_OK;
}

/* ------------------------------------------------------------------------------------------ */
/* Row-wise and element-wise                                                                  */
/* ------------------------------------------------------------------------------------------ */

loom_status loom__cuda_rms_norm_op(void *stream, const loom_tensor *x, const loom_tensor *w,
                                   float eps, loom_tensor *out) {
    loom__cuda_stream *c = stream;
    LOOM_CHECK_ARG(c != NULL);
    LOOM_TRY(loom__check_rms_norm(x, w, eps, out));
    LOOM_TRY(loom__cuda_launches(c));
    loom__k_rows r = rows_of(x, NULL, out);
    return loom__cuda_rms_norm(c->s, &r, x->data, w ? w->data : NULL, eps, out->data);
}

loom_status loom__cuda_add_rms_norm_op(void *stream, loom_tensor *x, const loom_tensor *y,
                                       const loom_tensor *w, float eps, loom_tensor *out) {
    loom__cuda_stream *c = stream;
    LOOM_CHECK_ARG(c != NULL);
    LOOM_TRY(loom__check_add_rms_norm(x, y, w, eps, out));
    LOOM_TRY(loom__cuda_launches(c));
    loom__k_rows r = rows_of(x, y, out);
    return loom__cuda_add_rms_norm(c->s, &r, x->data, y->data, w ? w->data : NULL, eps, out->data);
}

loom_status loom__cuda_norm_add_rms_norm_op(void *stream, loom_tensor *x, const loom_tensor *y,
                                            const loom_tensor *w_y, const loom_tensor *w, float eps,
                                            loom_tensor *out) {
    loom__cuda_stream *c = stream;
    LOOM_CHECK_ARG(c != NULL);
    LOOM_TRY(loom__check_add_rms_norm(x, y, w, eps, out));
    LOOM_RETURN_IF(w_y == NULL, LOOM_ERR_INVALID_ARG, "norm_add_rms_norm: w_y is NULL");
    LOOM_TRY(loom__check_rms_norm(y, w_y, eps, y));
    /* every block reads y and the weights while others write x and out */
    LOOM_RETURN_IF(
        loom__tensors_overlap(x, y) || loom__tensors_overlap(w_y, x) ||
            loom__tensors_overlap(w_y, y) || loom__tensors_overlap(w_y, out) ||
            (w != NULL && (loom__tensors_overlap(w, x) || loom__tensors_overlap(w, out))),
        LOOM_ERR_INVALID_ARG,
        "norm_add_rms_norm: x overlaps y, or a norm's weights overlap x, y or out");
    if (c->dev->unfused) { /* LOOM_CUDA_FUSE=0: the two launches (y normed in place) */
        LOOM_TRY(loom__cuda_rms_norm_op(c, y, w_y, eps, (loom_tensor *)y));
        return loom__cuda_add_rms_norm_op(c, x, y, w, eps, out);
    }
    LOOM_TRY(loom__cuda_launches(c));
    loom__k_rows r = rows_of(x, y, out);
    return loom__cuda_norm_add_rms_norm(c->s, &r, x->data, y->data, w_y->data, w ? w->data : NULL,
                                        eps, out->data);
}

loom_status loom__cuda_add_op(void *stream, const loom_tensor *a, const loom_tensor *b,
                              loom_tensor *out) {
    loom__cuda_stream *c = stream;
    LOOM_CHECK_ARG(c != NULL);
    LOOM_TRY(loom__check_add(a, b, out));
    LOOM_TRY(loom__cuda_launches(c));
    loom__k_rows r = rows_of(a, b, out);
    return loom__cuda_add(c->s, &r, a->data, b->data, out->data);
}

loom_status loom__cuda_scale_op(void *stream, const loom_tensor *x, float s, loom_tensor *out) {
    loom__cuda_stream *c = stream;
    LOOM_CHECK_ARG(c != NULL);
    LOOM_TRY(loom__check_scale(x, out));
    LOOM_TRY(loom__cuda_launches(c));
    loom__k_rows r = rows_of(x, NULL, out);
    return loom__cuda_scale(c->s, &r, x->data, s, out->data);
}

loom_status loom__cuda_glu_op(void *stream, const loom_tensor *gate, const loom_tensor *up,
                              loom_glu_kind kind, loom_tensor *out) {
    loom__cuda_stream *c = stream;
    LOOM_CHECK_ARG(c != NULL);
    LOOM_TRY(loom__check_glu(gate, up, kind, out));
    LOOM_TRY(loom__cuda_launches(c));
    loom__k_rows r = rows_of(gate, up, out);
    return loom__cuda_glu(c->s, &r, gate->data, up->data, kind == LOOM_GLU_SWIGLU ? 0 : 1,
                          out->data);
}

/* rope's parameters as the kernels take them, for x's rows. */
static loom__k_rope rope_of(const loom_tensor *x, const loom_tensor *pos,
                            const loom_rope_params *p) {
    return (loom__k_rope){.n_rows = x->ne[1],
                          .x_stride = x->row_stride,
                          .n_head = p->n_head,
                          .head_dim = p->head_dim,
                          .n_rot = p->n_rot,
                          .neox = p->mode == LOOM_ROPE_NEOX,
                          .theta_base = p->theta_base,
                          .freq_scale = p->freq_scale,
                          .freq_factors = p->freq_factors,
                          .pos = pos->data};
}

loom_status loom__cuda_rope_op(void *stream, loom_tensor *x, const loom_tensor *pos,
                               const loom_rope_params *p) {
    loom__cuda_stream *c = stream;
    LOOM_CHECK_ARG(c != NULL);
    LOOM_TRY(loom__check_rope(x, pos, p));
    if (x->ne[1] == 0) return LOOM_OK;
    /* The frequency factors are a prepared weight in device memory: validated where the model
     * reads them from its file, not here. */
    LOOM_TRY(loom__cuda_launches(c));
    const loom__k_rope kp = rope_of(x, pos, p);
    return loom__cuda_rope(c->s, &kp, x->data);
}

/* ------------------------------------------------------------------------------------------ */
/* The paged KV cache                                                                         */
/* ------------------------------------------------------------------------------------------ */

/* The descriptor holds an element type the kernels read (F32, F16, BF16, or FP8 with
 * per-(position, head) scales); the rest of its use is checked as every backend checks it. */
static loom_status check_kv_use(const char *op, const loom_kv_desc *kv, int32_t layer,
                                bool via_layer_src, int32_t *pool_layer) {
    LOOM_RETURN_IF(kv == NULL, LOOM_ERR_INVALID_ARG, "%s: kv descriptor is NULL", op);
    const bool fp8 = kv->kv_type == LOOM_TYPE_FP8_E4M3 || kv->kv_type == LOOM_TYPE_FP8_E5M2;
    LOOM_RETURN_IF(kv->kv_type != LOOM_TYPE_F16 && kv->kv_type != LOOM_TYPE_F32 &&
                       kv->kv_type != LOOM_TYPE_BF16 && !fp8,
                   LOOM_ERR_UNSUPPORTED,
                   "%s: kv type %s (cuda stores f16, bf16, f32, fp8_e4m3 and fp8_e5m2)", op,
                   loom__type_name(kv->kv_type));
    LOOM_RETURN_IF(fp8 && kv->scale_kind != LOOM_KV_SCALE_PER_TOKEN_HEAD, LOOM_ERR_UNSUPPORTED,
                   "%s: fp8 pages with scale kind %d (cuda: one scale per position and head)", op,
                   (int)kv->scale_kind);
    LOOM_RETURN_IF(kv->kv_flags != 0 && (kv->kv_flags != LOOM_KV_MERGED || fp8),
                   LOOM_ERR_UNSUPPORTED,
                   "%s: kv_flags %#x over %s pages (cuda: no Hadamard rotation yet; merged pairs "
                   "over f16, bf16 and f32 pages)",
                   op, (unsigned)kv->kv_flags, loom__type_name(kv->kv_type));
    return loom__check_kv_use("cuda", op, kv, layer, via_layer_src, pool_layer);
}

/* The merge pool of a layer in a merged pair, as the kernels take it; base NULL for a layer in
 * no pair. */
static loom__k_merge merge_of(const loom_kv_desc *kv, int32_t layer) {
    loom__k_merge m = {0};
    const int32_t partner = loom_kv_merge_partner(kv, layer);
    if (partner < 0) return m;
    m.base = kv->merge_base[layer];
    m.block_stride = kv->merge_block_stride;
    m.dist_at = loom_kv_merge_dist_at(kv->block_size, kv->n_kv_heads);
    m.state_at = loom_kv_merge_state_at(kv->block_size, kv->n_kv_heads);
    m.rows_at = loom_kv_merge_rows_at(kv->block_size, kv->n_kv_heads);
    m.retain = kv->merge_retain;
    m.t = kv->merge_t;
    m.later = partner < layer;
    return m;
}

loom_status loom__cuda_kv_store_op(void *stream, const loom_tensor *k, const loom_tensor *v,
                                   const loom_kv_desc *kv, int32_t layer) {
    loom__cuda_stream *c = stream;
    LOOM_CHECK_ARG(c != NULL);
    int32_t pool_layer;
    LOOM_TRY(check_kv_use("kv_store", kv, layer, false, &pool_layer));
    int64_t n_rows;
    LOOM_TRY(loom__check_kv_store(k, v, kv, &n_rows));
    if (n_rows == 0) return LOOM_OK;
    const loom__k_kv *dk;
    LOOM_TRY(loom__cuda_find_step_kv(c, "kv_store", kv, &dk));
    LOOM_TRY(loom__cuda_launches(c));
    const loom__k_merge m = merge_of(kv, layer);
    if (m.base != NULL)
        return loom__cuda_kv_store_merged(c->s, dk, k->data, k->row_stride, v->data, v->row_stride,
                                          kv->k_base[pool_layer], kv->v_base[pool_layer], &m);
    return loom__cuda_kv_store(c->s, dk, k->data, k->row_stride, v->data, v->row_stride,
                               kv->k_base[pool_layer], kv->v_base[pool_layer],
                               kv->k_scale ? kv->k_scale[pool_layer] : NULL,
                               kv->v_scale ? kv->v_scale[pool_layer] : NULL);
}

/* x [T, H*head_dim] seen as one row per head [T*H, head_dim], the per-head norms' rows (x's
 * rows must be contiguous). */
static loom_status heads_of(const char *name, const loom_tensor *x, int32_t head_dim,
                            loom_tensor *out) {
    LOOM_RETURN_IF(x->row_stride != (size_t)x->ne[0] * 4, LOOM_ERR_INVALID_ARG,
                   "norm_rope_store: %s's rows are %zu bytes apart; normed per head, they must "
                   "be contiguous (%lld bytes)",
                   name, x->row_stride, (long long)x->ne[0] * 4);
    *out = *x;
    out->ne[1] = x->ne[1] * (x->ne[0] / head_dim);
    out->ne[0] = head_dim;
    out->row_stride = (size_t)head_dim * 4;
    return LOOM_OK;
}

loom_status loom__cuda_norm_rope_store_op(void *stream, loom_tensor *q, loom_tensor *k,
                                          const loom_tensor *v, const loom_tensor *q_norm,
                                          const loom_tensor *k_norm, float eps,
                                          const loom_tensor *pos, const loom_rope_params *p,
                                          const loom_kv_desc *kv, int32_t layer) {
    loom__cuda_stream *c = stream;
    LOOM_CHECK_ARG(c != NULL);
    LOOM_RETURN_IF(q == NULL || k == NULL || p == NULL, LOOM_ERR_INVALID_ARG,
                   "norm_rope_store: q, k or the rope parameters are NULL");
    int32_t pool_layer;
    LOOM_TRY(check_kv_use("norm_rope_store", kv, layer, false, &pool_layer));
    int64_t n_rows;
    LOOM_TRY(loom__check_kv_store(k, v, kv, &n_rows));
    loom_rope_params pk = *p;
    pk.n_head = kv->n_kv_heads;
    LOOM_TRY(loom__check_rope(q, pos, p));
    LOOM_TRY(loom__check_rope(k, pos, &pk));
    LOOM_RETURN_IF(q->ne[1] != n_rows, LOOM_ERR_INVALID_ARG,
                   "norm_rope_store: q has %lld rows, the step's k and v %lld", (long long)q->ne[1],
                   (long long)n_rows);
    LOOM_RETURN_IF(loom__tensors_overlap(q, k) || loom__tensors_overlap(q, v) ||
                       loom__tensors_overlap(k, v),
                   LOOM_ERR_INVALID_ARG, "norm_rope_store: q, k and v overlap");
    /* one launch writes q and k while other blocks still read the norms and positions */
    const loom_tensor *read[] = {q_norm, k_norm, pos};
    for (int i = 0; i < 3; i++)
        LOOM_RETURN_IF(read[i] != NULL &&
                           (loom__tensors_overlap(read[i], q) || loom__tensors_overlap(read[i], k)),
                       LOOM_ERR_INVALID_ARG,
                       "norm_rope_store: q or k overlaps the norms' weights or the positions");
    loom_tensor qh, kh;
    if (q_norm != NULL) {
        LOOM_TRY(heads_of("q", q, p->head_dim, &qh));
        LOOM_TRY(loom__check_rms_norm(&qh, q_norm, eps, &qh));
    }
    if (k_norm != NULL) {
        LOOM_TRY(heads_of("k", k, p->head_dim, &kh));
        LOOM_TRY(loom__check_rms_norm(&kh, k_norm, eps, &kh));
    }
    if (n_rows == 0) return LOOM_OK;
    /* One launch where the kernel takes the shape (LOOM_CUDA_FUSE=0: never, for
     * check.sh's comparison); else the separate ops, with their bits either way. */
    if (c->dev->unfused || p->n_head % kv->n_kv_heads != 0 || kv->n_kv_heads > 65535 ||
        p->n_rot > 2 * LOOM_K_QK_MAX_FREQS) {
        if (q_norm != NULL) LOOM_TRY(loom__cuda_rms_norm_op(c, &qh, q_norm, eps, &qh));
        if (k_norm != NULL) LOOM_TRY(loom__cuda_rms_norm_op(c, &kh, k_norm, eps, &kh));
        LOOM_TRY(loom__cuda_rope_op(c, q, pos, p));
        LOOM_TRY(loom__cuda_rope_op(c, k, pos, &pk));
        return loom__cuda_kv_store_op(c, k, v, kv, layer);
    }
    const loom__k_kv *dk;
    LOOM_TRY(loom__cuda_find_step_kv(c, "norm_rope_store", kv, &dk));
    LOOM_TRY(loom__cuda_launches(c));
    /* FP8 pages (a scale per row and head, a block-wide maximum) and merged pairs keep
     * kv_store's own kernels, after this launch. */
    const bool store_here = (kv->kv_type == LOOM_TYPE_F32 || kv->kv_type == LOOM_TYPE_F16 ||
                             kv->kv_type == LOOM_TYPE_BF16) &&
                            merge_of(kv, layer).base == NULL;
    const loom__k_qk a = {.rope = rope_of(q, pos, p),
                          .n_kv_heads = kv->n_kv_heads,
                          .q = q->data,
                          .k = k->data,
                          .q_stride = q->row_stride,
                          .k_stride = k->row_stride,
                          .v = v->data,
                          .v_stride = v->row_stride,
                          .q_norm = q_norm ? q_norm->data : NULL,
                          .k_norm = k_norm ? k_norm->data : NULL,
                          .eps = eps};
    LOOM_TRY(loom__cuda_norm_rope_store(c->s, &a, store_here ? dk : NULL, kv->k_base[pool_layer],
                                        kv->v_base[pool_layer]));
    return store_here ? LOOM_OK : loom__cuda_kv_store_op(c, k, v, kv, layer);
}

loom_status loom__cuda_attention_op(void *stream, const loom_tensor *q, const loom_kv_desc *kv,
                                    const loom_attn_params *p, loom_tensor *out) {
    loom__cuda_stream *c = stream;
    LOOM_CHECK_ARG(c != NULL);
    int64_t n_rows;
    LOOM_TRY(loom__check_attention(q, kv, p, out, &n_rows));
    int32_t pool_layer;
    LOOM_TRY(check_kv_use("attention", kv, p->layer, true, &pool_layer));
    LOOM_RETURN_IF(!loom__cuda_attention_shape_ok(p->n_head, kv->n_kv_heads, kv->head_dim),
                   LOOM_ERR_UNSUPPORTED,
                   "attention: %d query heads over %d kv heads of %d elements (cuda: head_dim "
                   "<= 256, at most 16 query heads per kv head, 8 for head_dim > 128)",
                   p->n_head, kv->n_kv_heads, kv->head_dim);
    if (n_rows == 0) return LOOM_OK;
    const loom__k_kv *dk;
    LOOM_TRY(loom__cuda_find_step_kv(c, "attention", kv, &dk));
    LOOM_TRY(loom__cuda_launches(c));
    const size_t need = loom__cuda_attention_work_bytes(p->n_head, kv->head_dim);
    if (need > c->attn_work_cap) c->n_grows++;
    LOOM_TRY(loom__cuda_reserve_attn(c, need));
    loom__k_attn ka = {.q = q->data,
                       .q_stride = q->row_stride,
                       .out = out->data,
                       .out_stride = out->row_stride,
                       .k_pool = kv->k_base[pool_layer],
                       .v_pool = kv->v_base[pool_layer],
                       .k_scale = kv->k_scale ? kv->k_scale[pool_layer] : NULL,
                       .v_scale = kv->v_scale ? kv->v_scale[pool_layer] : NULL,
                       .n_head = p->n_head,
                       .scale = p->scale,
                       .softcap = p->softcap,
                       .work = c->attn_work,
                       .merge = merge_of(kv, p->layer),
                       .invariant = c->dev->batch_invariant,
                       .n_sms = c->dev->n_sms,
                       .smem_optin = c->dev->smem_optin,
                       .math = c->dev->tc_math,
                       .tile_regs = c->dev->attn_tile_regs};
    const size_t tiled = loom__cuda_attention_tiled_work_bytes(dk, &ka);
    if (tiled > c->tiled_work_cap) c->n_grows++;
    LOOM_TRY(loom__cuda_regrow(c, &c->tiled_work, &c->tiled_work_cap, tiled));
    ka.tiled_work = c->tiled_work;
    ka.tiled_work_bytes = c->tiled_work_cap;
    return loom__cuda_attention(c->s, dk, &ka);
}

/* ------------------------------------------------------------------------------------------ */
/* Sampling                                                                                   */
/* ------------------------------------------------------------------------------------------ */

/* The rows' edits flattened for the device (loom__k_logit_edit), after checking them: row
 * offsets, entries and penalty parameters, packed into one host area (ints, then entries, then
 * floats). Returns the entries' count; 0: no row has any. */
static loom_status pack_edits(loom__cuda_stream *c, const loom_logit_edits *edits, int64_t n,
                              int64_t V, size_t *bytes, int64_t *n_ent) {
    int64_t total = 0;
    for (int64_t r = 0; r < n; r++) {
        const loom_logit_edits *e = &edits[r];
        const int64_t m = (int64_t)e->n_bias + e->n_pen;
        LOOM_RETURN_IF(e->n_bias < 0 || e->n_pen < 0 || m > LOOM_LOGIT_SUMMARY_MAX_EDITS ||
                           (e->n_bias > 0 && e->bias == NULL) ||
                           (e->n_pen > 0 && (e->pen_id == NULL || e->pen_count == NULL)),
                       LOOM_ERR_INVALID_ARG,
                       "logits_summary: row %lld's edits (%d bias, %d penalty entries; at most "
                       "%d together, with their arrays)",
                       (long long)r, e->n_bias, e->n_pen, LOOM_LOGIT_SUMMARY_MAX_EDITS);
        for (int32_t j = 0; j < e->n_bias; j++)
            LOOM_RETURN_IF(e->bias[j].id < 0 || e->bias[j].id >= V, LOOM_ERR_INVALID_ARG,
                           "logits_summary: row %lld bias %d names token %d of %lld", (long long)r,
                           j, e->bias[j].id, (long long)V);
        for (int32_t j = 0; j < e->n_pen; j++)
            LOOM_RETURN_IF(e->pen_id[j] < 0 || e->pen_id[j] >= V || e->pen_count[j] < 1,
                           LOOM_ERR_INVALID_ARG,
                           "logits_summary: row %lld penalty %d: token %d (of %lld), count %d",
                           (long long)r, j, e->pen_id[j], (long long)V, e->pen_count[j]);
        total += m;
    }
    *n_ent = total;
    if (total == 0) return LOOM_OK;
    *bytes = (size_t)(n + 1) * 4 + (size_t)total * sizeof(loom__k_logit_edit) + (size_t)n * 12;
    if (*bytes > c->edit_host_cap) {
        void *p = realloc(c->edit_host, *bytes);
        LOOM_RETURN_IF(p == NULL, LOOM_ERR_OUT_OF_MEMORY,
                       "logits_summary: out of host memory for %zu bytes of edits", *bytes);
        c->edit_host = p;
        c->edit_host_cap = *bytes;
    }
    int32_t *off = c->edit_host;
    loom__k_logit_edit *ent = (loom__k_logit_edit *)(off + n + 1);
    float *pen = (float *)(ent + total);
    int32_t at = 0;
    for (int64_t r = 0; r < n; r++) {
        const loom_logit_edits *e = &edits[r];
        off[r] = at;
        for (int32_t j = 0; j < e->n_bias; j++)
            ent[at++] = (loom__k_logit_edit){e->bias[j].id, 0, e->bias[j].bias};
        for (int32_t j = 0; j < e->n_pen; j++)
            ent[at++] = (loom__k_logit_edit){e->pen_id[j], e->pen_count[j], 0.0f};
        pen[3 * r] = e->repeat_penalty;
        pen[3 * r + 1] = e->presence_penalty;
        pen[3 * r + 2] = e->frequency_penalty;
    }
    off[n] = at;
    return LOOM_OK;
}

loom_status loom__cuda_logits_summary_op(void *stream, const loom_tensor *logits, int32_t n_top,
                                         const loom_logit_edits *edits, loom_logit_summary *sum,
                                         loom_logit_cand *top, loom_logit_summary *raw_sum,
                                         loom_logit_cand *raw_top, float *edit_raw) {
    loom__cuda_stream *c = stream;
    LOOM_CHECK_ARG(c != NULL && logits != NULL && sum != NULL && top != NULL);
    LOOM_RETURN_IF(
        logits->type != LOOM_TYPE_F32 || logits->ne[0] < 1 || logits->ne[0] > INT32_MAX ||
            logits->ne[1] < 0 || (logits->ne[1] > 0 && logits->data == NULL) ||
            (logits->ne[1] > 1 && logits->row_stride < (size_t)logits->ne[0] * 4),
        LOOM_ERR_INVALID_ARG,
        "logits_summary: logits must be F32 rows of 1 .. 2^31 - 1 values (got %s, "
        "%lld x %lld)",
        loom__type_name(logits->type), (long long)logits->ne[0], (long long)logits->ne[1]);
    LOOM_RETURN_IF(n_top < 1 || n_top > LOOM_LOGIT_SUMMARY_MAX_TOP, LOOM_ERR_INVALID_ARG,
                   "logits_summary: n_top %d (1 .. %d)", n_top, LOOM_LOGIT_SUMMARY_MAX_TOP);
    const int64_t n = logits->ne[1], V = logits->ne[0];
    if (n == 0) return LOOM_OK;
    int64_t n_ent = 0;
    size_t edit_bytes = 0;
    if (edits != NULL) {
        LOOM_TRY(pack_edits(c, edits, n, V, &edit_bytes, &n_ent));
        LOOM_RETURN_IF(n_ent > 0 && (raw_sum == NULL || raw_top == NULL || edit_raw == NULL),
                       LOOM_ERR_INVALID_ARG,
                       "logits_summary: edited rows need raw_sum, raw_top and edit_raw");
    }
    LOOM_TRY(loom__cuda_flush(c)); /* its kernels and copies run uncaptured */
    LOOM_TRY(loom__cuda_bind(c->dev));
    /* the device area: the summaries, then (with edits) the raw rows' summaries, the raw values
     * of the edited logits, and the packed edits */
    const size_t one = loom__cuda_logits_summary_bytes(n, n_top);
    const size_t raw_vals = (size_t)n * LOOM_LOGIT_SUMMARY_MAX_EDITS * 4;
    const size_t bytes = n_ent > 0 ? 2 * one + raw_vals + edit_bytes : one;
    if (bytes > c->summary_work_cap) c->n_grows++;
    LOOM_TRY(loom__cuda_regrow(c, &c->summary_work, &c->summary_work_cap, bytes));
    char *work = c->summary_work;
    const size_t sum_bytes = (size_t)n * sizeof *sum, top_bytes = (size_t)n * n_top * sizeof *top;
    if (n_ent > 0) {
        char *raw_area = work + one, *vals = raw_area + one, *packed = vals + raw_vals;
        LOOM_CU_TRY(
            cudaMemcpyAsync(packed, c->edit_host, edit_bytes, cudaMemcpyHostToDevice, c->s));
        const int32_t *off = (const int32_t *)packed;
        const loom__k_logit_edit *ent = (const loom__k_logit_edit *)(off + n + 1);
        const float *pen = (const float *)(ent + n_ent);
        LOOM_TRY(loom__cuda_logits_summary(c->s, logits->data, logits->row_stride, n, (int32_t)V,
                                           n_top, raw_area));
        LOOM_TRY(loom__cuda_logits_edit(c->s, logits->data, logits->row_stride, n, off, ent, pen,
                                        (float *)vals));
        LOOM_CU_TRY(cudaMemcpyAsync(raw_sum, raw_area, sum_bytes, cudaMemcpyDeviceToHost, c->s));
        LOOM_CU_TRY(cudaMemcpyAsync(raw_top, raw_area + sum_bytes, top_bytes,
                                    cudaMemcpyDeviceToHost, c->s));
        /* the raw values, in one copy from the first edited row to the end of the last one's
         * entries (a copy to pageable memory waits: one, not one a row) */
        int64_t first = -1, last = -1;
        for (int64_t r = 0; r < n; r++)
            if (edits[r].n_bias + edits[r].n_pen > 0) {
                if (first < 0) first = r;
                last = r;
            }
        const size_t at = (size_t)first * LOOM_LOGIT_SUMMARY_MAX_EDITS;
        const size_t end = (size_t)last * LOOM_LOGIT_SUMMARY_MAX_EDITS +
                           (size_t)edits[last].n_bias + (size_t)edits[last].n_pen;
        LOOM_CU_TRY(cudaMemcpyAsync(edit_raw + at, vals + at * 4, (end - at) * 4,
                                    cudaMemcpyDeviceToHost, c->s));
    }
    LOOM_TRY(loom__cuda_logits_summary(c->s, logits->data, logits->row_stride, n, (int32_t)V, n_top,
                                       work));
    LOOM_CU_TRY(cudaMemcpyAsync(sum, work, sum_bytes, cudaMemcpyDeviceToHost, c->s));
    LOOM_CU_TRY(cudaMemcpyAsync(top, work + sum_bytes, top_bytes, cudaMemcpyDeviceToHost, c->s));
    LOOM_CU_TRY(cudaStreamSynchronize(c->s));
    return LOOM_OK;
}
