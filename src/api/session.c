/* session.c — loom_session: one sequence over a model, its paged KV cache (simple block
 * allocator), its forward workspace, and its logits. */
#include <stdlib.h>
#include <string.h>

#include "core/status.h"
#include "kv/kv_pool.h"
#include "api/api_internal.h"
#include "model/forward.h"

struct loom_session {
    loom_model *model;
    loom_session_params params;
    loom__forward_ws ws;

    loom__kv_pool pool;
    loom__kv_seq seq;
    loom_buffer *kv_buf;    /* K then V pools of every layer */
    void **k_base;          /* [n_layer] */
    void **v_base;          /* [n_layer] */
    size_t token_stride, block_stride;

    int32_t *pos;           /* [n_batch] scratch positions */
    int32_t *rows;          /* [n_batch] scratch logit row indices */
    float *logits;          /* [logits_cap] host logits of the last decode */
    size_t logits_cap;      /* floats */
    int32_t n_logit_rows;   /* rows held by logits */
    int32_t first_logit_row; /* decode row index of logits row 0 */

    /* The forward pass's layer hook while loom_generate traces (NULL otherwise). */
    void (*on_layers)(void *user, int32_t first_layer, int32_t last_layer);
    void *hook_user;
    int32_t hook_every;
};

loom_session_params loom_session_default_params(void) {
    loom_session_params p;
    memset(&p, 0, sizeof p);
    p.n_ctx = 0;
    p.n_batch = 512;
    p.block_size = 16;
    p.kv_f32 = false;
    return p;
}

static loom_status alloc_kv(loom_session *s) {
    const loom_model *m = s->model;
    const loom_backend_ops *ops = m->backend->ops;
    int32_t bs = s->params.block_size;
    int32_t n_blocks = (s->params.n_ctx + bs - 1) / bs;
    size_t elt = s->params.kv_f32 ? 4 : 2;
    s->token_stride = (size_t)m->cfg.n_head_kv * (size_t)m->cfg.head_dim * elt;
    s->block_stride = s->token_stride * (size_t)bs;
    size_t layer_bytes = s->block_stride * (size_t)n_blocks;
    size_t total = layer_bytes * 2 * (size_t)m->cfg.n_layer;
    LOOM_TRY(loom__kv_pool_init(&s->pool, n_blocks));
    LOOM_TRY(ops->buffer_alloc(m->backend->ctx, total, &s->kv_buf));
    s->k_base = calloc((size_t)m->cfg.n_layer, sizeof *s->k_base);
    s->v_base = calloc((size_t)m->cfg.n_layer, sizeof *s->v_base);
    LOOM_RETURN_IF(!s->k_base || !s->v_base, LOOM_ERR_OUT_OF_MEMORY, "session: out of memory");
    char *base = ops->buffer_base(m->backend->ctx, s->kv_buf);
    for (int32_t il = 0; il < m->cfg.n_layer; il++) {
        s->k_base[il] = base + (size_t)(2 * il) * layer_bytes;
        s->v_base[il] = base + (size_t)(2 * il + 1) * layer_bytes;
    }
    return LOOM_OK;
}

loom_status loom_session_create(loom_model *model, const loom_session_params *params,
                                loom_session **out) {
    loom__clear_error();
    LOOM_CHECK_ARG(model != NULL && out != NULL);
    LOOM_RETURN_IF(model->vocab_only, LOOM_ERR_INVALID_ARG,
                   "session: the model was loaded with vocab_only");
    loom_session_params p = params ? *params : loom_session_default_params();
    if (p.n_ctx == 0) p.n_ctx = model->cfg.n_ctx_train < 4096 ? model->cfg.n_ctx_train : 4096;
    if (p.n_batch == 0) p.n_batch = 512;
    if (p.block_size == 0) p.block_size = 16;
    LOOM_RETURN_IF(p.n_ctx < 1 || p.n_ctx > (1 << 24), LOOM_ERR_INVALID_ARG,
                   "session: n_ctx %d out of range", p.n_ctx);
    LOOM_RETURN_IF(p.n_batch < 1 || p.n_batch > 65536, LOOM_ERR_INVALID_ARG,
                   "session: n_batch %d out of range", p.n_batch);
    LOOM_RETURN_IF(p.block_size < 1 || p.block_size > 4096, LOOM_ERR_INVALID_ARG,
                   "session: block_size %d out of range", p.block_size);
    if (p.n_batch > p.n_ctx) p.n_batch = p.n_ctx;

    loom_session *s = calloc(1, sizeof *s);
    LOOM_RETURN_IF(!s, LOOM_ERR_OUT_OF_MEMORY, "session: out of memory");
    s->model = model;
    s->params = p;
    loom_status st = alloc_kv(s);
    if (st == LOOM_OK) st = loom__forward_ws_create(model, p.n_batch, &s->ws);
    if (st == LOOM_OK) {
        s->pos = malloc((size_t)p.n_batch * sizeof *s->pos);
        s->rows = malloc((size_t)p.n_batch * sizeof *s->rows);
        s->logits_cap = (size_t)model->cfg.n_vocab;
        s->logits = malloc(s->logits_cap * sizeof *s->logits);
        if (!s->pos || !s->rows || !s->logits) {
            st = loom__fail(LOOM_ERR_OUT_OF_MEMORY, "session: out of memory");
        }
    }
    if (st != LOOM_OK) {
        loom_session_free(s);
        return st;
    }
    *out = s;
    return LOOM_OK;
}

void loom_session_free(loom_session *s) {
    if (!s) return;
    const loom_model *m = s->model;
    loom__forward_ws_destroy(m, &s->ws);
    if (s->kv_buf) m->backend->ops->buffer_free(m->backend->ctx, s->kv_buf);
    loom__kv_seq_destroy(&s->seq);
    loom__kv_pool_destroy(&s->pool);
    free(s->k_base);
    free(s->v_base);
    free(s->pos);
    free(s->rows);
    free(s->logits);
    free(s);
}

void loom_session_reset(loom_session *s) {
    if (!s) return;
    loom__kv_seq_clear(&s->seq, &s->pool);
    s->n_logit_rows = 0;
}

int32_t loom_session_n_past(const loom_session *s) { return s ? s->seq.n_pos : 0; }

/* Runs one chunk of at most n_batch tokens of the single sequence. */
typedef enum { WANT_NONE, WANT_LAST, WANT_ALL } logits_want;

static loom_status decode_chunk(loom_session *s, const loom_token *tokens, int32_t n,
                                logits_want want, float *logits_out, int32_t stop_after) {
    int32_t p0 = s->seq.n_pos;
    LOOM_TRY(loom__kv_seq_reserve(&s->seq, &s->pool, p0 + n, s->params.block_size));
    for (int32_t i = 0; i < n; i++) {
        s->pos[i] = p0 + i;
        s->rows[i] = i;
    }
    int32_t indptr[2] = {0, s->seq.n_blocks};
    int32_t q_start[2] = {0, n};
    int32_t kv_len = p0 + n;
    const loom_model *m = s->model;
    loom_kv_desc kv = {
        .n_seqs = 1,
        .indptr = indptr,
        .block_ids = s->seq.blocks,
        .q_start = q_start,
        .pos_start = &p0,
        .kv_len = &kv_len,
        .block_size = s->params.block_size,
        .n_blocks = s->pool.n_blocks,
        .n_kv_heads = m->cfg.n_head_kv,
        .head_dim = m->cfg.head_dim,
        .kv_type = s->params.kv_f32 ? LOOM_TYPE_F32 : LOOM_TYPE_F16,
        .token_stride = s->token_stride,
        .block_stride = s->block_stride,
        .n_layers = m->cfg.n_layer,
        .k_base = s->k_base,
        .v_base = s->v_base,
        .layer_src = NULL,
    };
    loom__batch b = {
        .tokens = tokens,
        .pos = s->pos,
        .n_tokens = n,
        .logit_rows = want == WANT_ALL ? s->rows : s->rows + (n - 1),
        .n_logits = want == WANT_ALL ? n : want == WANT_LAST ? 1 : 0,
        .stop_after = stop_after,
        .hidden = stop_after > 0 ? logits_out : NULL,
        .on_layers = s->on_layers,
        .hook_user = s->hook_user,
        .hook_every = s->hook_every,
    };
    /* The simple allocator gives every layer the same blocks: one table serves every group. */
    loom_kv_desc kvs[LOOM_MAX_KV_GROUPS];
    for (int32_t g = 0; g < m->cfg.n_kv_groups; g++) kvs[g] = kv;
    LOOM_TRY(loom__model_forward(m, &s->ws, &b, kvs, logits_out));
    s->seq.n_pos = p0 + n;
    return LOOM_OK;
}

static loom_status check_tokens(const loom_session *s, const loom_token *tokens, int32_t n) {
    const int32_t n_vocab = s->model->cfg.n_vocab;
    for (int32_t i = 0; i < n; i++) {
        LOOM_RETURN_IF(tokens[i] < 0 || tokens[i] >= n_vocab, LOOM_ERR_BAD_INPUT,
                       "decode: token %d at index %d is out of range [0, %d)", tokens[i], i,
                       n_vocab);
    }
    return LOOM_OK;
}

loom_status loom_session_decode(loom_session *s, const loom_token *tokens, int32_t n,
                                bool all_logits) {
    loom__clear_error();
    LOOM_CHECK_ARG(s != NULL && tokens != NULL && n > 0);
    LOOM_TRY(check_tokens(s, tokens, n));
    const int32_t n_vocab = s->model->cfg.n_vocab;
    LOOM_RETURN_IF((int64_t)s->seq.n_pos + n > s->params.n_ctx, LOOM_ERR_CONTEXT_FULL,
                   "decode: %d positions held + %d new exceed n_ctx %d", s->seq.n_pos, n,
                   s->params.n_ctx);

    size_t rows = all_logits ? (size_t)n : 1;
    if (rows * (size_t)n_vocab > s->logits_cap) {
        float *grown = realloc(s->logits, rows * (size_t)n_vocab * sizeof *grown);
        LOOM_RETURN_IF(!grown, LOOM_ERR_OUT_OF_MEMORY, "decode: cannot hold %zu logit rows",
                       rows);
        s->logits = grown;
        s->logits_cap = rows * (size_t)n_vocab;
    }
    s->n_logit_rows = 0;
    int32_t start_pos = s->seq.n_pos;
    for (int32_t done = 0; done < n; done += s->params.n_batch) {
        int32_t c = n - done < s->params.n_batch ? n - done : s->params.n_batch;
        logits_want want = all_logits ? WANT_ALL : done + c == n ? WANT_LAST : WANT_NONE;
        float *dst = all_logits ? s->logits + (size_t)done * n_vocab : s->logits;
        loom_status st = decode_chunk(s, tokens + done, c, want, dst, 0);
        if (st != LOOM_OK) {
            /* Roll back to the state before this call: positions are only committed per chunk,
             * so forget the chunks this call added. */
            s->seq.n_pos = start_pos;
            return st;
        }
    }
    s->n_logit_rows = (int32_t)rows;
    s->first_logit_row = all_logits ? 0 : n - 1;
    return LOOM_OK;
}

const float *loom_session_logits(const loom_session *s, int32_t i) {
    if (!s || s->n_logit_rows == 0) return NULL;
    int32_t last = s->first_logit_row + s->n_logit_rows - 1;
    if (i == -1) i = last;
    if (i < s->first_logit_row || i > last) return NULL;
    return s->logits + (size_t)(i - s->first_logit_row) * (size_t)s->model->cfg.n_vocab;
}

const loom_model *loom__session_model(const loom_session *s) { return s->model; }

int32_t loom__session_n_ctx(const loom_session *s) { return s->params.n_ctx; }

void loom__session_set_layer_hook(loom_session *s,
                                  void (*on_layers)(void *user, int32_t first, int32_t last),
                                  void *user, int32_t every) {
    s->on_layers = on_layers;
    s->hook_user = user;
    s->hook_every = every;
}

loom_status loom__session_hidden(loom_session *s, const loom_token *tokens, int32_t n,
                                 int32_t n_layers, float *out) {
    loom__clear_error();
    LOOM_CHECK_ARG(s && tokens && out && n > 0 && n <= s->params.n_batch);
    LOOM_CHECK_ARG(n_layers > 0 && n_layers <= s->model->cfg.n_layer);
    LOOM_TRY(check_tokens(s, tokens, n));
    loom_session_reset(s);
    loom_status st = decode_chunk(s, tokens, n, WANT_NONE, out, n_layers);
    loom_session_reset(s); /* the cache holds only some layers: never continue from it */
    return st;
}
