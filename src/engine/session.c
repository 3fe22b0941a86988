/* session.c — loom_session: one sequence over a model, run on the engine's machinery: the KV
 * manager (one sequence, no prefix cache) and the KV storage with its one descriptor builder
 * (kv_storage.h), an execution context of its own (forward.h), and its logits.
 *
 * A decode call reserves all its tokens in the manager at once, runs them in chunks of at most
 * n_batch (each chunk's descriptor covers its part of the reservation), and commits once at
 * the end; a failure rolls the reservation back, so the session is exactly as it was before
 * the call. */
#include <stdlib.h>
#include <string.h>

#include "engine/session.h"
#include "core/abi.h"
#include "core/alloc.h"
#include "core/status.h"
#include "engine/kv_plan.h"
#include "engine/kv_storage.h"
#include "kv/kv_desc.h"
#include "kv/kv_manager.h"
#include "model/forward.h"
#include "tensor/fp16.h"
#include "tensor/fp8.h"

struct loom_session {
    loom_model *model;
    loom_session_params params;
    loom_type kv_type; /* the pages' element type, from params.kv_type / kv_f32 */
    loom__exec exec;
    loom__kv *kv;
    loom__kv_storage store;
    int32_t seq; /* the manager's sequence; -1 before the first decode and after a reset */

    int32_t *pos;            /* [n_batch] scratch positions */
    int32_t *rows;           /* [n_batch] scratch logit row indices */
    float *logits;           /* [logits_cap] host logits of the last decode */
    size_t logits_cap;       /* floats */
    int32_t n_logit_rows;    /* rows held by logits */
    int32_t first_logit_row; /* decode row index of logits row 0 */

    /* The forward pass's layer hook while loom_generate traces (NULL otherwise). */
    void (*on_layers)(void *user, int32_t first_layer, int32_t last_layer);
    void *hook_user;
    int32_t hook_every;
};

void loom_session_params_init(loom_session_params *out, size_t size) {
    loom_session_params p;
    loom__abi_init(&p, sizeof p);
    p.n_ctx = 0;
    p.n_batch = 512;
    p.block_size = 16;
    p.kv_f32 = false;
    p.kv_type = LOOM_KV_CACHE_F16;
    p.kv_rotate = false;
    p.kv_plan = NULL;
    loom__abi_defaults_out(out, size, &p, sizeof p);
}

/* kv_f32 is kv_type F32 by its older name; beside another kv_type it is a contradiction. */
static loom_status kv_type_of(const loom_session_params *p, loom_type *out) {
    LOOM_RETURN_IF(p->kv_f32 && p->kv_type != LOOM_KV_CACHE_F16 && p->kv_type != LOOM_KV_CACHE_F32,
                   LOOM_ERR_INVALID_ARG, "session: kv_f32 with kv_type %d", (int)p->kv_type);
    if (p->kv_f32) {
        *out = LOOM_TYPE_F32;
        return LOOM_OK;
    }
    return loom__kv_cache_type_resolve(p->kv_type, out);
}

/* The manager and the pools: every group holds a whole context (ceil(n_ctx / block_size)
 * blocks), so a reservation never waits for a sliding window's releases. layer_src and merge:
 * the plan (kv_plan.h), copied by the storage. */
static loom_status create_kv(loom_session *s, const int32_t *layer_src, const loom__kv_merge *merge,
                             uint32_t kv_flags) {
    const loom_model *m = s->model;
    const int32_t bs = s->params.block_size, n_groups = m->cfg.n_kv_groups;
    const int32_t n_blocks = (s->params.n_ctx + bs - 1) / bs;
    loom__kv_group_params groups[LOOM_MAX_KV_GROUPS];
    int32_t group_blocks[LOOM_MAX_KV_GROUPS];
    for (int32_t g = 0; g < n_groups; g++) {
        groups[g].n_blocks = group_blocks[g] = n_blocks;
        groups[g].window = m->cfg.kv_group_window[g];
    }
    loom__kv_params kp = loom__kv_default_params();
    kp.block_size = bs;
    kp.n_groups = n_groups;
    kp.groups = groups;
    kp.max_seqs = 1;
    kp.max_seq_len = s->params.n_ctx;
    kp.prefix_caching = false;
    kp.watermark = 0.0f;
    LOOM_TRY(loom__kv_create(&kp, &s->kv));
    loom__kv_storage_params sp = {
        .kv_type = s->kv_type,
        .kv_flags = kv_flags,
        .block_size = bs,
        .group_blocks = group_blocks,
        .max_seqs = 1,
        .block_cap = loom__kv_desc_block_cap(s->kv, 1),
        .max_copy_blocks = 0, /* one sequence, never shared: no copy-on-write, no swap */
        .layer_src = layer_src,
        .merge = merge,
    };
    return loom__kv_storage_create(m, &sp, &s->store);
}

loom_status loom_session_create(loom_model *model, const loom_session_params *params,
                                loom_session **out) {
    loom__clear_error();
    LOOM_CHECK_ARG(model != NULL && out != NULL);
    LOOM_RETURN_IF(model->vocab_only, LOOM_ERR_INVALID_ARG,
                   "session: the model was loaded with vocab_only");
    loom_session_params p = loom_session_default_params();
    LOOM_TRY(loom__abi_params_in(&p, sizeof p, params, LOOM__ABI_END(loom_session_params, kv_f32),
                                 "session_params"));
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
    loom_type kv_type;
    LOOM_TRY(kv_type_of(&p, &kv_type));
    uint32_t kv_flags = p.kv_rotate ? LOOM_KV_HADAMARD : 0;
    /* The layer map and merged pairs of the plan: the storage keeps its own copy. */
    const size_t n_layer = (size_t)model->cfg.n_layer;
    int32_t *layer_src = loom__malloc(n_layer * sizeof *layer_src);
    loom__kv_merge merge = {.with = loom__malloc(n_layer * sizeof *merge.with)};
    loom_status st = layer_src && merge.with
                         ? loom__kv_plan_load(model, p.kv_plan, layer_src, &merge)
                         : loom__fail(LOOM_ERR_OUT_OF_MEMORY, "session: out of memory");
    if (st == LOOM_OK) st = loom__kv_merge_flags(&merge, kv_type, &kv_flags);
    if (st == LOOM_OK && (kv_type != LOOM_TYPE_F16 || kv_flags))
        st = loom__model_check_support(model, kv_type, kv_flags);
    if (st != LOOM_OK) {
        free(layer_src);
        free(merge.with);
        return st;
    }

    loom_session *s = loom__calloc(1, sizeof *s);
    if (!s) {
        free(layer_src);
        free(merge.with);
        return loom__fail(LOOM_ERR_OUT_OF_MEMORY, "session: out of memory");
    }
    s->model = model;
    loom__model_retain(model);
    s->params = p;
    s->kv_type = kv_type;
    s->seq = -1;
    loom__exec_shape es = {
        .max_tokens = p.n_batch,
        .max_seqs = 1,
        .max_ctx = p.n_ctx,
        .block_size = p.block_size,
        .kv_type = kv_type,
        .kv_flags = kv_flags,
    };
    st = loom__exec_create(model, &es, &s->exec);
    if (st == LOOM_OK) st = create_kv(s, layer_src, &merge, kv_flags);
    free(layer_src);
    free(merge.with);
    s->params.kv_plan = NULL; /* the caller's string: not kept */
    if (st == LOOM_OK) {
        s->pos = loom__malloc((size_t)p.n_batch * sizeof *s->pos);
        s->rows = loom__malloc((size_t)p.n_batch * sizeof *s->rows);
        s->logits_cap = (size_t)model->cfg.n_vocab;
        s->logits = loom__malloc(s->logits_cap * sizeof *s->logits);
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
    loom__kv_destroy(s->kv);
    loom__kv_storage_destroy(&s->store);
    loom__exec_destroy(s->model, &s->exec);
    free(s->pos);
    free(s->rows);
    free(s->logits);
    loom__model_release(s->model);
    free(s);
}

void loom_session_reset(loom_session *s) {
    if (!s) return;
    if (s->seq >= 0) (void)loom__kv_seq_free(s->kv, s->seq);
    s->seq = -1;
    s->n_logit_rows = 0;
}

int32_t loom_session_n_past(const loom_session *s) {
    if (!s || s->seq < 0) return 0;
    loom__kv_seq_info info;
    return loom__kv_seq_get_info(s->kv, s->seq, &info) == LOOM_OK ? info.n_pos : 0;
}

/* One row of a page's values (n_kv_heads * head_dim elements) widened to float32; scales: the
 * row's per-head scales (FP8) or NULL. */
static void widen_row(loom_type type, const char *row, const float *scales, int32_t n_heads,
                      int32_t head_dim, float *out) {
    const int64_t n = (int64_t)n_heads * head_dim;
    for (int64_t i = 0; i < n; i++) {
        float x = 0.0f;
        switch (type) {
        case LOOM_TYPE_F32:
            memcpy(&x, row + 4 * i, 4);
            break;
        case LOOM_TYPE_F16:
        case LOOM_TYPE_BF16: {
            uint16_t h;
            memcpy(&h, row + 2 * i, 2);
            x = type == LOOM_TYPE_F16 ? loom__f16_to_f32(h) : loom__bf16_to_f32(h);
            break;
        }
        case LOOM_TYPE_FP8_E4M3:
        case LOOM_TYPE_FP8_E5M2: {
            const uint8_t b = (uint8_t)row[i];
            x = (type == LOOM_TYPE_FP8_E4M3 ? loom__fp8_e4m3_to_f32(b) : loom__fp8_e5m2_to_f32(b)) *
                scales[i / head_dim];
            break;
        }
        default:
            break;
        }
        out[i] = x;
    }
}

/* What kv_read fetched of one block: its pages (K then V, block_stride bytes each) and, for a
 * layer of a merged pair, its merge block. */
typedef struct kv_read_block {
    char *page[2];
    char *merge;
} kv_read_block;

/* Slot `slot` of head row set out[n_head_kv * head_dim] as attention reads it: the stored row
 * (FP8 times its scales), or for a merged pair's layer (role 1 earlier, 2 later) the direction
 * (the later layer's retained row where the token kept one) times the layer's norms. */
static void read_slot(const loom__kv_storage *st, const kv_read_block *b, int kv_i, int role,
                      int32_t slot, int32_t n_heads, int32_t head_dim, float *out) {
    const int32_t bs = st->block_size;
    const char *row = b->page[kv_i] + st->token_stride * (size_t)slot;
    const float *scales = st->scale_kind != LOOM_KV_SCALE_NONE
                              ? (const float *)(b->page[kv_i] + st->token_stride * (size_t)bs +
                                                st->scale_token_stride * (size_t)slot)
                              : NULL;
    if (role == 0) {
        widen_row(st->kv_type, row, scales, n_heads, head_dim, out);
        return;
    }
    int32_t r;
    memcpy(&r, b->merge + loom_kv_merge_state_at(bs, n_heads) + (size_t)slot * sizeof r, sizeof r);
    if (role == 2 && r >= 0 && r < st->merge_retain)
        row = b->merge + loom_kv_merge_rows_at(bs, n_heads) +
              ((size_t)r * 2 + (size_t)kv_i) * (size_t)n_heads * (size_t)head_dim *
                  loom__kv_elt_bytes(st->kv_type);
    widen_row(st->kv_type, row, NULL, n_heads, head_dim, out);
    for (int32_t h = 0; h < n_heads; h++) {
        float norm;
        memcpy(&norm,
               b->merge +
                   (((size_t)slot * n_heads + h) * 4 + (size_t)(role == 2 ? 2 : 0) + (size_t)kv_i) *
                       sizeof(float),
               sizeof norm);
        for (int32_t d = 0; d < head_dim; d++) out[(size_t)h * head_dim + d] *= norm;
    }
}

loom_status loom_session_kv_read(loom_session *s, int32_t layer, int32_t pos, int32_t n, float *k,
                                 float *v) {
    loom__clear_error();
    LOOM_CHECK_ARG(s != NULL && (k != NULL || v != NULL));
    const loom__model_config *c = &s->model->cfg;
    LOOM_RETURN_IF(layer < 0 || layer >= c->n_layer, LOOM_ERR_INVALID_ARG,
                   "session_kv_read: layer %d (the model has %d)", layer, c->n_layer);
    const int32_t n_past = loom_session_n_past(s);
    LOOM_RETURN_IF(pos < 0 || n < 0 || pos > n_past - n, LOOM_ERR_INVALID_ARG,
                   "session_kv_read: positions %d .. %d of %d held", pos, pos + n, n_past);
    if (n == 0) return LOOM_OK;
    const loom__kv_storage *st = &s->store;
    const int32_t src = st->layer_src[layer], g = c->layers[layer].kv_group;
    const int32_t with = st->merge_with ? st->merge_with[layer] : -1;
    const int role = with < 0 ? 0 : with > layer ? 1 : 2;
    const int32_t *table = NULL, bs = st->block_size;
    int32_t n_table = 0;
    LOOM_TRY(loom__kv_seq_table(s->kv, s->seq, g, &table, &n_table));
    const size_t merge_bytes = role ? st->merge_block_stride : 0;
    char *buf = loom__malloc(2 * st->block_stride + merge_bytes);
    LOOM_RETURN_IF(!buf, LOOM_ERR_OUT_OF_MEMORY, "session_kv_read: out of memory");
    const kv_read_block blk = {{buf, buf + st->block_stride}, buf + 2 * st->block_stride};
    const loom_backend_ops *ops = s->model->backend->ops;
    const size_t row_floats = (size_t)c->n_head_kv * (size_t)c->head_dim;
    loom_status status = LOOM_OK;
    for (int32_t p = pos; p < pos + n && status == LOOM_OK;) {
        const int32_t b = p / bs, end = (b + 1) * bs < pos + n ? (b + 1) * bs : pos + n;
        const int32_t id = b < n_table ? table[b] : LOOM_KV_NO_BLOCK;
        if (id == LOOM_KV_NO_BLOCK) {
            status = loom__fail(LOOM_ERR_INVALID_ARG,
                                "session_kv_read: layer %d no longer holds position %d (its "
                                "window is %d)",
                                layer, p, c->kv_group_window[g]);
            break;
        }
        for (int kv_i = 0; kv_i < 2 && status == LOOM_OK; kv_i++)
            status = ops->tensor_get(s->exec.stream, blk.page[kv_i],
                                     (const char *)(kv_i == 0 ? st->k_base : st->v_base)[src] +
                                         (size_t)id * st->block_stride,
                                     st->block_stride);
        if (status == LOOM_OK && role)
            status = ops->tensor_get(s->exec.stream, blk.merge,
                                     (const char *)st->merge_base[layer] +
                                         (size_t)id * st->merge_block_stride,
                                     merge_bytes);
        for (; status == LOOM_OK && p < end; p++)
            for (int kv_i = 0; kv_i < 2; kv_i++) {
                float *out = kv_i == 0 ? k : v;
                if (out != NULL)
                    read_slot(st, &blk, kv_i, role, p % bs, c->n_head_kv, c->head_dim,
                              out + (size_t)(p - pos) * row_floats);
            }
    }
    free(buf);
    return status;
}

/* Which logits a chunk keeps. */
typedef enum { WANT_NONE, WANT_LAST, WANT_ALL } logits_want;

/* Runs rows [done, done + n) of the pending reservation, which started at position p0. */
static loom_status decode_chunk(loom_session *s, const loom_token *tokens, int32_t p0, int32_t done,
                                int32_t n, logits_want want, float *logits_out,
                                int32_t stop_after) {
    for (int32_t i = 0; i < n; i++) {
        s->pos[i] = p0 + done + i;
        s->rows[i] = i;
    }
    loom_kv_desc kv[LOOM_MAX_KV_GROUPS];
    LOOM_TRY(loom__kv_storage_descs(&s->store, s->kv, 1, &s->seq, &n, &done, kv));
    loom__batch b = {
        .tokens = tokens,
        .pos = s->pos,
        .n_tokens = n,
        .logit_rows = want == WANT_ALL ? s->rows : s->rows + (n - 1),
        .n_logits = want == WANT_ALL    ? n
                    : want == WANT_LAST ? 1
                                        : 0,
        .stop_after = stop_after,
        .hidden = stop_after > 0 ? logits_out : NULL,
        .on_layers = s->on_layers,
        .hook_user = s->hook_user,
        .hook_every = s->hook_every,
    };
    return loom__model_forward(s->model, &s->exec, &b, kv, logits_out);
}

/* Reserves n positions after what the sequence holds (admitting it on the first decode). */
static loom_status reserve(loom_session *s, const loom_token *tokens, int32_t n, int32_t *p0) {
    if (s->seq < 0) {
        int32_t cached = 0;
        LOOM_TRY(loom__kv_seq_admit(s->kv, 0, tokens, n, &s->seq, &cached));
    }
    *p0 = loom_session_n_past(s);
    int32_t n_copies = 0;
    loom__kv_copy copies[LOOM_MAX_KV_GROUPS];
    loom_status st =
        loom__kv_reserve(s->kv, s->seq, n, tokens, copies, LOOM_MAX_KV_GROUPS, &n_copies);
    if (st == LOOM_OK && n_copies > 0) {
        /* Never with one unshared sequence and no prefix cache. */
        (void)loom__kv_rollback(s->kv, s->seq);
        st = loom__fail(LOOM_ERR_INTERNAL, "session: a copy-on-write on an unshared sequence");
    }
    if (st != LOOM_OK && *p0 == 0) loom_session_reset(s);
    return st;
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
    const int32_t n_past = loom_session_n_past(s);
    LOOM_RETURN_IF((int64_t)n_past + n > s->params.n_ctx, LOOM_ERR_CONTEXT_FULL,
                   "decode: %d positions held + %d new exceed n_ctx %d", n_past, n,
                   s->params.n_ctx);

    size_t rows = all_logits ? (size_t)n : 1;
    if (rows * (size_t)n_vocab > s->logits_cap) {
        float *grown = loom__realloc(s->logits, rows * (size_t)n_vocab * sizeof *grown);
        LOOM_RETURN_IF(!grown, LOOM_ERR_OUT_OF_MEMORY, "decode: cannot hold %zu logit rows", rows);
        s->logits = grown;
        s->logits_cap = rows * (size_t)n_vocab;
    }
    s->n_logit_rows = 0;
    int32_t p0 = 0;
    LOOM_TRY(reserve(s, tokens, n, &p0));
    loom_status st = LOOM_OK;
    for (int32_t done = 0; done < n && st == LOOM_OK; done += s->params.n_batch) {
        int32_t c = n - done < s->params.n_batch ? n - done : s->params.n_batch;
        logits_want want = all_logits ? WANT_ALL : done + c == n ? WANT_LAST : WANT_NONE;
        float *dst = all_logits ? s->logits + (size_t)done * n_vocab : s->logits;
        st = decode_chunk(s, tokens + done, p0, done, c, want, dst, 0);
    }
    if (st != LOOM_OK) {
        /* Back to the state before this call. */
        (void)loom__kv_rollback(s->kv, s->seq);
        if (p0 == 0) loom_session_reset(s);
        return st;
    }
    LOOM_TRY(loom__kv_commit(s->kv, s->seq));
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

const loom_model *loom__session_model(const loom_session *s) {
    return s->model;
}

int32_t loom__session_n_ctx(const loom_session *s) {
    return s->params.n_ctx;
}

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
    int32_t p0 = 0;
    LOOM_TRY(reserve(s, tokens, n, &p0));
    loom_status st = decode_chunk(s, tokens, p0, 0, n, WANT_NONE, out, n_layers);
    loom_session_reset(s); /* the cache holds only some layers: never continue from it */
    return st;
}
