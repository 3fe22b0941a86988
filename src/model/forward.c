/* forward.c — the decoder forward pass of every supported architecture, written against
 * backend ops only.
 *
 * Per layer:  xn = rms_norm(x) ; q,k,v = xn·Wq,k,vᵀ (+ biases: qwen2) ;
 *             per-head rms_norm(q), rms_norm(k) (gemma3) ; rope(q,k) (the layer's base) ;
 *             store k,v in the paged cache ; att = attention(q, cache, the layer's window) ;
 *             x += [post_norm](att·Woᵀ) ;
 *             xn = rms_norm(x) ; x += [post_norm]((act(xn·Wgᵀ) * xn·Wuᵀ)·Wdᵀ)
 * A layer that reuses an earlier layer's K/V (the descriptor's layer_src[il] != il: the
 * model's declared sharing or the engine's plan) computes only q and attends over the source's
 * pages; the later layer of a merged pair (LOOM_KV_MERGED) computes and stores its K/V, which
 * kv_store merges into its partner's pages. The embedding rows are scaled by embd_scale (sqrt(D)
 * for gemma3), then the final norm and the output projection for the rows that want logits only, a
 * few rows at a time so the logits buffer stays small even for a 262k vocabulary. */
#include "model/forward.h"

#include <math.h>
#include <string.h>

/* Most bytes of logits held in backend memory at once: 32 rows of Gemma 3's 262,144-token
 * vocabulary. Each chunk of rows streams the whole output matrix (170 MB for Gemma 3 270M)
 * once, so chunks must not be small: at 8 MiB, 16 sequences decoding together took two passes
 * of 8 rows each, and the matmul's token lanes (16 wide) ran half empty. */
#define LOOM_LOGITS_BUDGET (32u << 20)
/* Fewest rows per chunk whatever the vocabulary: one full group of token lanes
 * (tensor/qgemm.h). */
#define LOOM_LOGITS_MIN_ROWS 16

/* Views a [rows, cols] F32 (or I32) slice of the workspace buffer at *offset, 64-byte aligned. */
static loom_tensor carve(char *base, size_t *offset, loom_type type, int64_t cols, int64_t rows) {
    size_t row = (size_t)cols * 4;
    loom_tensor t = loom_tensor_2d(type, base ? base + *offset : NULL, cols, rows, row);
    *offset += (row * (size_t)rows + 63) & ~(size_t)63;
    return t;
}

static size_t layout_ws(const loom_model *m, char *base, loom__exec *ws) {
    const loom__model_config *c = &m->cfg;
    int64_t t = ws->n_batch, d = c->n_embd, q = (int64_t)c->n_head * c->head_dim;
    int64_t kv = (int64_t)c->n_head_kv * c->head_dim, f = c->n_ff, r = ws->n_logit_rows;
    size_t off = 0;
    ws->x = carve(base, &off, LOOM_TYPE_F32, d, t);
    ws->xn = carve(base, &off, LOOM_TYPE_F32, d, t);
    ws->q = carve(base, &off, LOOM_TYPE_F32, q, t);
    ws->k = carve(base, &off, LOOM_TYPE_F32, kv, t);
    ws->v = carve(base, &off, LOOM_TYPE_F32, kv, t);
    ws->att = carve(base, &off, LOOM_TYPE_F32, q, t);
    ws->proj = carve(base, &off, LOOM_TYPE_F32, d, t);
    ws->gate = carve(base, &off, LOOM_TYPE_F32, f, t);
    ws->up = carve(base, &off, LOOM_TYPE_F32, f, t);
    ws->ids = carve(base, &off, LOOM_TYPE_I32, t, 1);
    ws->pos = carve(base, &off, LOOM_TYPE_I32, t, 1);
    ws->out_ids = carve(base, &off, LOOM_TYPE_I32, r, 1);
    ws->sel = carve(base, &off, LOOM_TYPE_F32, d, r);
    ws->logits = carve(base, &off, LOOM_TYPE_F32, c->n_vocab, r);
    return off;
}

/* Rows of logits per output matmul for steps of n_batch tokens. */
static int32_t logit_rows_for(const loom_model *m, int32_t n_batch) {
    int64_t rows = LOOM_LOGITS_BUDGET / ((int64_t)m->cfg.n_vocab * 4);
    if (rows < LOOM_LOGITS_MIN_ROWS) rows = LOOM_LOGITS_MIN_ROWS;
    return (int32_t)(rows > n_batch ? n_batch : rows);
}

/* Adds (type, k, rows) to the distinct shapes, keeping the most rows of each. */
static void add_matmul(loom_matmul_shape *ms, int32_t *n, const loom_tensor *w, int32_t rows) {
    if (w->data == NULL) return;
    for (int32_t i = 0; i < *n; i++) {
        if (ms[i].type == w->type && ms[i].k == w->ne[0]) {
            if (ms[i].max_rows < rows) ms[i].max_rows = rows;
            if (ms[i].n < w->ne[1]) ms[i].n = w->ne[1];
            return;
        }
    }
    if (*n == LOOM_MAX_MATMUL_SHAPES) return; /* more is never seen; a stream grows if need be */
    ms[(*n)++] =
        (loom_matmul_shape){.type = w->type, .k = w->ne[0], .n = w->ne[1], .max_rows = rows};
}

void loom__model_step_shape(const loom_model *m, const loom__exec_shape *es, int32_t n_logit_rows,
                            loom_matmul_shape *matmuls, loom_step_shape *out) {
    const loom__model_config *c = &m->cfg;
    int32_t n = 0, t = es->max_tokens;
    for (int32_t il = 0; il < c->n_layer; il++) {
        const loom__layer_weights *w = &m->layers[il];
        add_matmul(matmuls, &n, &w->wq, t);
        add_matmul(matmuls, &n, &w->wk, t);
        add_matmul(matmuls, &n, &w->wv, t);
        add_matmul(matmuls, &n, &w->wo, t);
        add_matmul(matmuls, &n, &w->w_gate, t);
        add_matmul(matmuls, &n, &w->w_up, t);
        add_matmul(matmuls, &n, &w->w_down, t);
    }
    add_matmul(matmuls, &n, &m->output, n_logit_rows);
    *out = (loom_step_shape){
        .max_tokens = t,
        .max_seqs = es->max_seqs,
        .max_ctx = es->max_ctx,
        .block_size = es->block_size,
        .n_head = c->n_head,
        .n_kv_heads = c->n_head_kv,
        .head_dim = c->head_dim,
        .n_rot = c->layers[0].rope.n_rot,
        .kv_type = es->kv_type,
        .kv_flags = es->kv_flags,
        .n_matmuls = n,
        .matmuls = matmuls,
    };
}

loom_status loom__exec_create(const loom_model *m, const loom__exec_shape *es, loom__exec *ex) {
    LOOM_CHECK_ARG(m && es && ex && es->max_tokens > 0);
    memset(ex, 0, sizeof *ex);
    const loom__backend *be = m->backend;
    ex->ops = be->ops;
    ex->n_batch = es->max_tokens;
    ex->n_logit_rows = logit_rows_for(m, es->max_tokens);
    loom_matmul_shape matmuls[LOOM_MAX_MATMUL_SHAPES];
    loom_step_shape shape;
    loom__model_step_shape(m, es, ex->n_logit_rows, matmuls, &shape);
    if (be->ops->workspace_size != NULL)
        LOOM_TRY(be->ops->workspace_size(be->dev, &shape, &ex->workspace_bytes));
    LOOM_TRY(be->ops->stream_create(be->dev, &shape, &ex->stream));
    size_t bytes = layout_ws(m, NULL, ex);
    loom_status st = be->ops->buffer_alloc(be->dev, bytes, &ex->buf);
    if (st != LOOM_OK) {
        loom__exec_destroy(m, ex);
        return st;
    }
    layout_ws(m, be->ops->buffer_base(be->dev, ex->buf), ex);
    return LOOM_OK;
}

void loom__exec_destroy(const loom_model *m, loom__exec *ex) {
    if (!ex) return;
    if (ex->buf) m->backend->ops->buffer_free(m->backend->dev, ex->buf);
    if (ex->stream) m->backend->ops->stream_destroy(ex->stream);
    memset(ex, 0, sizeof *ex);
}

/* The first n rows of a workspace tensor. */
static loom_tensor rows_of(const loom_tensor *t, int64_t n) {
    loom_tensor v = *t;
    v.ne[1] = n;
    return v;
}

/* The same memory seen as one row per head: [T, H*hd] -> [T*H, hd] (for per-head norms). */
static loom_tensor per_head(const loom_tensor *t, int64_t head_dim) {
    loom_tensor v = *t;
    v.ne[1] = t->ne[1] * (t->ne[0] / head_dim);
    v.ne[0] = head_dim;
    v.row_stride = (size_t)head_dim * 4;
    return v;
}

/* outs[i] = x·ws[i]ᵀ (+ biases[i] where given) for the n projections of one activation: one
 * backend op where the backend fuses them (x prepared once, one parallel run), else n. */
static loom_status linear_n(const loom_backend_ops *ops, void *ctx, int n,
                            const loom_tensor *const *ws, const loom_tensor *const *biases,
                            const loom_tensor *x, loom_tensor *const *outs) {
    if (ops->matmul_multi != NULL)
        LOOM_TRY(ops->matmul_multi(ctx, n, ws, x, outs));
    else
        for (int i = 0; i < n; i++) LOOM_TRY(ops->matmul(ctx, ws[i], x, outs[i]));
    for (int i = 0; biases != NULL && i < n; i++)
        if (biases[i]->data) LOOM_TRY(ops->add(ctx, outs[i], biases[i], outs[i]));
    return LOOM_OK;
}

/* x += y (y normed first where y_norm is given: Gemma's post-norms), then xn = rms_norm(x) *
 * w_next where a norm follows (w_next NULL: none): one op where the backend fuses them
 * (norm_add_rms_norm, add_rms_norm), else two or three; y may be overwritten. */
static loom_status add_then_norm(const loom_backend_ops *ops, void *ctx, loom_tensor *x,
                                 loom_tensor *y, const loom_tensor *y_norm,
                                 const loom_tensor *w_next, float eps, loom_tensor *xn) {
    if (y_norm != NULL && w_next != NULL && ops->norm_add_rms_norm != NULL)
        return ops->norm_add_rms_norm(ctx, x, y, y_norm, w_next, eps, xn);
    if (y_norm != NULL) LOOM_TRY(ops->rms_norm(ctx, y, y_norm, eps, y));
    if (w_next == NULL) return ops->add(ctx, x, y, x);
    if (ops->add_rms_norm != NULL) return ops->add_rms_norm(ctx, x, y, w_next, eps, xn);
    LOOM_TRY(ops->add(ctx, x, y, x));
    return ops->rms_norm(ctx, x, w_next, eps, xn);
}

/* xn_ready: the previous layer's last op left rms_norm(x, attn_norm) in xn already. Ends with
 * x += attention and xn = the FFN's norm of it. */
static loom_status attention_block(const loom_model *m, loom__exec *ws, int32_t il, int64_t n,
                                   const loom_kv_desc *kv, bool xn_ready) {
    const loom_backend_ops *ops = ws->ops;
    void *ctx = ws->stream;
    const loom__model_config *c = &m->cfg;
    const loom__layer_config *lc = &c->layers[il];
    const loom__layer_weights *w = &m->layers[il];
    /* A layer reusing an earlier layer's K/V computes only q. The map is the descriptor's (the
     * engine's or session's plan), not the model's: engines on one model may share
     * differently. */
    const loom_kv_desc *kvg = &kv[lc->kv_group];
    /* The later layer of a merged pair reads its partner's pools but computes and stores its
     * K/V (kv_store merges them into the pair's pages; loom_backend.h). */
    const bool own_kv =
        kvg->layer_src == NULL || kvg->layer_src[il] == il || loom_kv_merge_partner(kvg, il) >= 0;
    loom_tensor x = rows_of(&ws->x, n), xn = rows_of(&ws->xn, n);
    loom_tensor q = rows_of(&ws->q, n), k = rows_of(&ws->k, n), v = rows_of(&ws->v, n);
    loom_tensor att = rows_of(&ws->att, n), proj = rows_of(&ws->proj, n);
    loom_tensor pos = ws->pos;
    pos.ne[0] = n;

    if (!xn_ready) LOOM_TRY(ops->rms_norm(ctx, &x, &w->attn_norm, c->rms_eps, &xn));
    {
        const loom_tensor *wts[3] = {&w->wq, &w->wk, &w->wv}, *bs[3] = {&w->bq, &w->bk, &w->bv};
        loom_tensor *outs[3] = {&q, &k, &v};
        LOOM_TRY(linear_n(ops, ctx, own_kv ? 3 : 1, wts, bs, &xn, outs));
    }
    loom_rope_params rp = lc->rope;
    rp.head_dim = c->head_dim;
    rp.n_head = c->n_head;
    if (own_kv && ops->norm_rope_store != NULL) {
        const bool normed = w->q_norm.data != NULL;
        LOOM_TRY(ops->norm_rope_store(ctx, &q, &k, &v, normed ? &w->q_norm : NULL,
                                      normed ? &w->k_norm : NULL, c->rms_eps, &pos, &rp, kvg, il));
    } else {
        if (w->q_norm.data) {
            loom_tensor qh = per_head(&q, c->head_dim);
            LOOM_TRY(ops->rms_norm(ctx, &qh, &w->q_norm, c->rms_eps, &qh));
            if (own_kv) {
                loom_tensor kh = per_head(&k, c->head_dim);
                LOOM_TRY(ops->rms_norm(ctx, &kh, &w->k_norm, c->rms_eps, &kh));
            }
        }
        LOOM_TRY(ops->rope(ctx, &q, &pos, &rp));
        if (own_kv) {
            rp.n_head = c->n_head_kv;
            LOOM_TRY(ops->rope(ctx, &k, &pos, &rp));
            LOOM_TRY(ops->kv_store(ctx, &k, &v, kvg, il));
        }
    }

    loom_attn_params ap = {
        .n_head = c->n_head,
        .layer = il,
        .scale = c->attn_scale,
        .softcap = 0.0f,
    };
    LOOM_TRY(ops->attention(ctx, &q, kvg, &ap, &att));
    LOOM_TRY(ops->matmul(ctx, &w->wo, &att, &proj));
    return add_then_norm(ops, ctx, &x, &proj, w->post_attn_norm.data ? &w->post_attn_norm : NULL,
                         &w->ffn_norm, c->rms_eps, &xn);
}

/* Starts from xn = the FFN's norm of x (attention_block's last op); ends with x += the FFN and,
 * where w_next is given (the next layer's attention norm, or the output norm), xn = its norm
 * of x. */
static loom_status ffn_block(const loom_model *m, loom__exec *ws, int32_t il, int64_t n,
                             const loom_tensor *w_next) {
    const loom_backend_ops *ops = ws->ops;
    void *ctx = ws->stream;
    const loom__model_config *c = &m->cfg;
    const loom__layer_weights *w = &m->layers[il];
    loom_tensor x = rows_of(&ws->x, n), xn = rows_of(&ws->xn, n), proj = rows_of(&ws->proj, n);
    loom_tensor gate = rows_of(&ws->gate, n), up = rows_of(&ws->up, n);

    {
        const loom_tensor *wts[2] = {&w->w_gate, &w->w_up};
        loom_tensor *outs[2] = {&gate, &up};
        LOOM_TRY(linear_n(ops, ctx, 2, wts, NULL, &xn, outs));
    }
    LOOM_TRY(ops->glu(ctx, &gate, &up, c->glu, &gate));
    LOOM_TRY(ops->matmul(ctx, &w->w_down, &gate, &proj));
    return add_then_norm(ops, ctx, &x, &proj, w->post_ffn_norm.data ? &w->post_ffn_norm : NULL,
                         w_next, c->rms_eps, &xn);
}

static loom_status layer_forward(const loom_model *m, loom__exec *ws, int32_t il, int64_t n,
                                 const loom_kv_desc *kv, const loom_tensor *w_next) {
    LOOM_TRY(attention_block(m, ws, il, n, kv, il > 0));
    return ffn_block(m, ws, il, n, w_next);
}

/* Wanted rows done .. done + r - 1, computed into out: to the host whole, or (rows marked
 * summary_only) as summaries, the whole rows between them copied a run at a time. */
static loom_status copy_logits(const loom_backend_ops *ops, void *ctx, const loom__batch *b,
                               const loom_tensor *out, int32_t done, int32_t r, int64_t V,
                               float *logits) {
    bool any = false;
    for (int32_t j = 0; b->summary_only && j < r; j++) any |= b->summary_only[done + j] != 0;
    if (!any)
        return ops->tensor_get(ctx, logits + (size_t)done * V, out->data,
                               (size_t)r * (size_t)V * 4);
    LOOM_RETURN_IF(ops->logits_summary == NULL, LOOM_ERR_INVALID_ARG,
                   "forward: summaries asked of backend %s, which has no logits_summary",
                   ops->name);
    const size_t at = (size_t)done * (size_t)b->n_top;
    LOOM_TRY(ops->logits_summary(ctx, out, b->n_top, b->edits ? b->edits + done : NULL,
                                 b->summary + done, b->top + at, b->raw_summary + done,
                                 b->raw_top + at,
                                 b->edit_raw + (size_t)done * LOOM_LOGIT_SUMMARY_MAX_EDITS));
    for (int32_t j = 0; j < r;) {
        if (b->summary_only[done + j]) {
            j++;
            continue;
        }
        int32_t e = j;
        while (e < r && !b->summary_only[done + e]) e++;
        LOOM_TRY(ops->tensor_get(ctx, logits + (size_t)(done + j) * V,
                                 (const char *)out->data + (size_t)j * out->row_stride,
                                 (size_t)(e - j) * (size_t)V * 4));
        j = e;
    }
    return LOOM_OK;
}

/* Logits for the wanted rows, n_logit_rows at a time, from xn = the final norm of x (the last
 * layer's last op). */
static loom_status output_forward(const loom_model *m, loom__exec *ws, const loom__batch *b,
                                  float *logits) {
    const loom_backend_ops *ops = ws->ops;
    void *ctx = ws->stream;
    int64_t V = m->cfg.n_vocab;
    loom_tensor xn = rows_of(&ws->xn, b->n_tokens);
    for (int32_t done = 0; done < b->n_logits; done += ws->n_logit_rows) {
        int32_t r = b->n_logits - done < ws->n_logit_rows ? b->n_logits - done : ws->n_logit_rows;
        loom_tensor ids = ws->out_ids, sel = rows_of(&ws->sel, r);
        loom_tensor out = rows_of(&ws->logits, r);
        ids.ne[0] = r;
        LOOM_TRY(ops->tensor_set(ctx, ids.data, b->logit_rows + done, (size_t)r * 4));
        LOOM_TRY(ops->get_rows(ctx, &xn, &ids, &sel));
        LOOM_TRY(ops->matmul(ctx, &m->output, &sel, &out));
        LOOM_TRY(copy_logits(ops, ctx, b, &out, done, r, V, logits));
    }
    return LOOM_OK;
}

loom_status loom__model_forward(const loom_model *m, loom__exec *ws, const loom__batch *b,
                                const loom_kv_desc *kv, float *logits) {
    LOOM_CHECK_ARG(m && ws && b && kv);
    LOOM_CHECK_ARG(b->n_tokens > 0 && b->n_tokens <= ws->n_batch);
    LOOM_CHECK_ARG(b->n_logits >= 0 && (b->n_logits == 0 || logits));
    const loom_backend_ops *ops = ws->ops;
    void *ctx = ws->stream;
    int64_t n = b->n_tokens;
    if (ops->step_begin != NULL) {
        loom_step_desc step = {.n_tokens = b->n_tokens, .n_kv = m->cfg.n_kv_groups, .kv = kv};
        LOOM_TRY(ops->step_begin(ctx, &step));
    }

    loom_tensor ids = ws->ids, x = rows_of(&ws->x, n);
    ids.ne[0] = n;
    LOOM_TRY(ops->tensor_set(ctx, ids.data, b->tokens, (size_t)n * 4));
    LOOM_TRY(ops->tensor_set(ctx, ws->pos.data, b->pos, (size_t)n * 4));
    LOOM_TRY(ops->get_rows(ctx, &m->tok_embd, &ids, &x));
    if (m->cfg.embd_scale != 1.0f) LOOM_TRY(ops->scale(ctx, &x, m->cfg.embd_scale, &x));
    int32_t n_layer = m->cfg.n_layer;
    if (b->stop_after > 0) {
        LOOM_CHECK_ARG(b->hidden != NULL && b->stop_after <= n_layer);
        n_layer = b->stop_after;
    }
    LOOM_CHECK_ARG(!b->on_layers || b->hook_every >= 1);
    /* Each layer's last op leaves the next norm's output in xn: the next layer's attention
     * norm, after the last the output norm where logits follow (none where the pass stops
     * early for the hidden state, or wants no logits). */
    const bool want_output = b->stop_after <= 0 && b->n_logits > 0;
    for (int32_t il = 0; il < n_layer; il++) {
        const loom_tensor *w_next = il + 1 < n_layer ? &m->layers[il + 1].attn_norm
                                    : want_output    ? &m->output_norm
                                                     : NULL;
        loom_status st = layer_forward(m, ws, il, n, kv, w_next);
        if (st != LOOM_OK) {
            loom__error_prefix("layer %d", il);
            return st;
        }
        if (b->on_layers && ((il + 1) % b->hook_every == 0 || il + 1 == n_layer)) {
            LOOM_TRY(ops->synchronize(ctx));
            b->on_layers(b->hook_user, il - il % b->hook_every, il);
        }
    }
    if (b->stop_after > 0) {
        return ops->tensor_get(ctx, b->hidden, x.data, (size_t)n * (size_t)m->cfg.n_embd * 4);
    }
    if (b->n_logits == 0) return ops->synchronize(ctx);
    return output_forward(m, ws, b, logits);
}
