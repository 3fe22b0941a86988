/* engine_replay.c — deterministic replay: recording an engine's inputs (params.record_path) and
 * an engine that runs them again (loom_engine_create_replay). The record's format and what it
 * holds are in record.h; here is where the engine meets it: the scheduler's clock, the step's
 * boundaries, the submit path. */
#include <stdio.h>
#include <string.h>

#include "core/abi.h"
#include "core/alloc.h"
#include "core/timer.h"
#include "engine/engine.h"

int64_t loom__engine_now_us(loom_engine *e) {
    int64_t us;
    if (e->rp) {
        (void)loom__replayer_clock(e->rp, &us); /* a count that differs fails the step's end */
        return us;
    }
    us = loom__engine_us_of(e, loom__now_ns());
    if (e->rec) loom__recorder_clock(e->rec, us);
    return us;
}

/* ---- recording ----------------------------------------------------------------------------- */

static void fill_header(const loom_engine *e, loom__record_header *h) {
    const loom__model_config *c = &e->model->cfg;
    memset(h, 0, sizeof *h);
    h->arch = (uint32_t)c->arch;
    h->n_vocab = c->n_vocab;
    h->n_embd = c->n_embd;
    h->n_layer = c->n_layer;
    h->n_head = c->n_head;
    h->n_head_kv = c->n_head_kv;
    h->head_dim = c->head_dim;
    h->n_ff = c->n_ff;
    h->n_ctx_train = c->n_ctx_train;
    memcpy(h->backend, e->model->backend->name, sizeof h->backend - 1);
    h->params = e->params;
    h->params.kv_bytes = e->kv_budget;
    h->params.max_ctx = e->max_ctx;
    h->has_layer_src = c->n_layer <= LOOM__RECORD_MAX_LAYERS;
    for (int32_t l = 0; h->has_layer_src && l < c->n_layer; l++) h->layer_src[l] = e->layer_src[l];
    h->n_merge_pairs = h->has_layer_src ? e->merge.n_pairs : 0;
    for (int32_t l = 0; h->n_merge_pairs > 0 && l < c->n_layer; l++)
        h->merge_with[l] = e->merge.with[l];
    h->merge_retain = e->merge.retain;
    h->merge_t = e->merge.t;
}

loom_status loom__engine_record_open(loom_engine *e) {
    loom__record_header h;
    fill_header(e, &h);
    /* A map the record cannot hold would replay as the model's own: refuse rather than record
     * a run that cannot be replayed. */
    bool own_map = e->merge.n_pairs == 0;
    for (int32_t l = 0; own_map && l < e->model->cfg.n_layer; l++)
        own_map = e->layer_src[l] == e->model->cfg.layers[l].kv_src;
    LOOM_RETURN_IF(!h.has_layer_src && !own_map, LOOM_ERR_UNSUPPORTED,
                   "engine: record_path with a kv_plan on a model of %d layers (records hold the "
                   "layer map of at most %d)",
                   e->model->cfg.n_layer, LOOM__RECORD_MAX_LAYERS);
    LOOM_TRY(loom__recorder_open(e->params.record_path, &h, &e->rec));
    e->params.record_path = NULL; /* the caller's string: not kept */
    return LOOM_OK;
}

loom_status loom__engine_record_request(loom_engine *e, const loom_request_params *p,
                                        loom__req *r) {
    loom__rec_buf b = {.ok = true};
    /* Before the inbox lock, so a long prompt's encoding holds up no one: the id is 0 here and
     * patched in under the lock (loom__engine_record_set_id). */
    loom__record_encode_request(&b, 0, r->arrival_ns - e->t0_ns, p, r->prompt, r->n_prompt);
    if (!b.ok) {
        loom__rec_free(&b);
        return loom__fail(LOOM_ERR_OUT_OF_MEMORY, "submit: out of memory for the input record");
    }
    r->record = b.p;
    r->n_record = b.n;
    return LOOM_OK;
}

void loom__engine_record_set_id(loom__req *r) {
    for (int i = 0; i < 8; i++) r->record[1 + i] = (uint8_t)(r->id >> (8 * i)); /* after 'R' */
}

/* ---- the step's events, as the record's 'S' digests them ---------------------------------- */

static uint64_t mix_bytes(uint64_t h, const void *p, size_t n) {
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 0x100000001b3ull; /* FNV-1a */
    return h;
}

uint64_t loom__engine_events_digest(const loom_engine *e) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < e->n_events; i++) {
        const loom_event *ev = &e->events[i];
        const int64_t f[] = {ev->kind,   (int64_t)ev->id, ev->sample,        ev->token,
                             ev->reason, ev->status,      ev->cached_tokens, (int64_t)ev->text_len};
        h = mix_bytes(h, f, sizeof f);
        h = mix_bytes(h, ev->text, ev->text_len);
        if (ev->info) {
            h = mix_bytes(h, &ev->info->logprob_raw, sizeof ev->info->logprob_raw);
            h = mix_bytes(h, &ev->info->logprob_final, sizeof ev->info->logprob_final);
        }
    }
    return h;
}

/* ---- replaying ----------------------------------------------------------------------------- */

/* A failed step ends the replay: what follows in the file belongs to a run this one no longer
 * is (or to a step read halfway). Every later step returns the same status and message. */
loom_status loom__engine_replay_fail(loom_engine *e, loom_status st) {
    loom__replayer *rp = e->rp;
    if (rp->failed == LOOM_OK) {
        rp->failed = st;
        snprintf(rp->why, sizeof rp->why, "%s", loom_last_error());
    }
    pthread_mutex_lock(&e->mu);
    e->rp_more = false;
    pthread_mutex_unlock(&e->mu);
    return st;
}

static loom_status enqueue_recorded(loom_engine *e, loom__record_request *q) {
    const loom__replayer *rp = e->rp;
    /* Set here, not when decoded: the array of requests may have moved since (it grows as the
     * step's records are read), and with it the sampler settings inside each entry. */
    q->params.sampler = &q->sampler;
    /* A live arrival is at or before its submit, so before the step's first clock reading. */
    LOOM_RETURN_IF(rp->has_end && rp->n_clocks > 0 && q->arrival_ns / 1000 > rp->clocks[0],
                   LOOM_ERR_BAD_INPUT,
                   "replay: step %lld: request %llu arrives at %lld us, after the step's first "
                   "clock reading %lld us",
                   (long long)rp->step, (unsigned long long)q->id,
                   (long long)(q->arrival_ns / 1000), (long long)rp->clocks[0]);
    loom_request_id id;
    loom_status st = loom__engine_enqueue(e, &q->params, e->t0_ns + q->arrival_ns, q->id, &id);
    if (st != LOOM_OK) {
        char why[512];
        snprintf(why, sizeof why, "%s", loom_last_error());
        st = loom__fail(st, "replay: step %lld: the recorded request %llu is refused: %s",
                        (long long)rp->step, (unsigned long long)q->id, why);
    }
    return st;
}

loom_status loom__engine_replay_begin(loom_engine *e) {
    loom__replayer *rp = e->rp;
    loom_status st = loom__replayer_next_step(rp);
    for (size_t i = 0; st == LOOM_OK && i < rp->n_reqs; i++) st = enqueue_recorded(e, &rp->reqs[i]);
    pthread_mutex_lock(&e->mu);
    for (size_t i = 0; st == LOOM_OK && i < rp->n_cancels; i++) {
        const loom_request_id id = rp->cancels[i];
        /* A live cancellation names an id submit had given out. */
        if (id == 0 || id >= e->next_id) {
            st = loom__fail(LOOM_ERR_BAD_INPUT,
                            "replay: step %lld cancels request %llu, which was never submitted",
                            (long long)rp->step, (unsigned long long)id);
            break;
        }
        loom__engine_inbox *in = &e->inbox;
        if (in->n_cancels == in->cap_cancels) {
            size_t c = in->cap_cancels ? in->cap_cancels * 2 : 16;
            loom_request_id *grown = loom__realloc(in->cancels, c * sizeof *grown);
            if (!grown) {
                st = loom__fail(LOOM_ERR_OUT_OF_MEMORY, "replay: out of memory");
                break;
            }
            in->cancels = grown;
            in->cap_cancels = c;
        }
        in->cancels[in->n_cancels++] = id;
    }
    e->rp_more = st == LOOM_OK && loom__replayer_more(rp);
    pthread_mutex_unlock(&e->mu);
    return st;
}

loom_status loom__engine_replay_end(loom_engine *e) {
    const loom__replayer *rp = e->rp;
    if (!rp->has_end) return LOOM_OK; /* a crashed run's last step: nothing to compare */
    LOOM_RETURN_IF(rp->next_clock != rp->n_clocks, LOOM_ERR_INTERNAL,
                   "replay: step %lld diverged from the record: its scheduler read the clock %u "
                   "times, the recorded run %u times (memory ran short in this step, or the "
                   "library, model or backend is not the recorded one)",
                   (long long)rp->step, rp->next_clock, rp->n_clocks);
    LOOM_RETURN_IF(loom__engine_events_digest(e) != rp->digest, LOOM_ERR_INTERNAL,
                   "replay: step %lld diverged from the record: its %zu events differ from the "
                   "recorded run's (another backend, device or model of the same shape, or a "
                   "kernel that is not deterministic)",
                   (long long)rp->step, e->n_events);
    return LOOM_OK;
}

/* The recorded model, as far as the record can tell: shape and backend. */
static loom_status check_model(const loom_model *m, const loom__record_header *h) {
    const loom__model_config *c = &m->cfg;
    const struct {
        const char *name;
        int64_t recorded, here;
    } f[] = {
        {"arch", h->arch, c->arch},
        {"n_vocab", h->n_vocab, c->n_vocab},
        {"n_embd", h->n_embd, c->n_embd},
        {"n_layer", h->n_layer, c->n_layer},
        {"n_head", h->n_head, c->n_head},
        {"n_head_kv", h->n_head_kv, c->n_head_kv},
        {"head_dim", h->head_dim, c->head_dim},
        {"n_ff", h->n_ff, c->n_ff},
        {"n_ctx_train", h->n_ctx_train, c->n_ctx_train},
    };
    for (size_t i = 0; i < sizeof f / sizeof *f; i++) {
        LOOM_RETURN_IF(f[i].recorded != f[i].here, LOOM_ERR_BAD_INPUT,
                       "replay: the record was made with a model of %s %lld; this one has %lld",
                       f[i].name, (long long)f[i].recorded, (long long)f[i].here);
    }
    LOOM_RETURN_IF(strcmp(h->backend, m->backend->name) != 0, LOOM_ERR_BAD_INPUT,
                   "replay: the record was made on backend '%s'; this model runs on '%s'",
                   h->backend, m->backend->name);
    return LOOM_OK;
}

loom_status loom_engine_create_replay(loom_model *model, const char *path,
                                      const loom_engine_params *params, loom_engine **out) {
    loom__clear_error();
    LOOM_CHECK_ARG(model != NULL && path != NULL && out != NULL);
    loom_engine_params user = loom_engine_default_params();
    LOOM_TRY(loom__abi_params_in(&user, sizeof user, params,
                                 LOOM__ABI_END(loom_engine_params, n_sample_threads),
                                 "engine_params"));
    LOOM_RETURN_IF(user.on_event != NULL, LOOM_ERR_INVALID_ARG,
                   "replay: a replay engine is stepped by its caller (on_event must be NULL)");
    LOOM_RETURN_IF(user.record_path != NULL, LOOM_ERR_INVALID_ARG,
                   "replay: a replay engine does not record (record_path must be NULL)");
    loom__record_header h;
    loom__replayer *rp = NULL;
    LOOM_TRY(loom__replayer_open(path, &h, &rp));
    loom_status st = check_model(model, &h);
    loom_engine *e = NULL;
    if (st == LOOM_OK) {
        loom_engine_params p = h.params;
        p.trace = user.trace;
        p.n_sample_threads = user.n_sample_threads;
        const loom__kv_merge merge = {.with = h.merge_with,
                                      .n_pairs = h.n_merge_pairs,
                                      .retain = h.merge_retain,
                                      .t = h.merge_t};
        st = loom__engine_create(model, &p, h.has_layer_src ? h.layer_src : NULL,
                                 h.n_merge_pairs > 0 ? &merge : NULL, &e);
        if (st != LOOM_OK) {
            char why[512];
            snprintf(why, sizeof why, "%s", loom_last_error());
            st = loom__fail(st, "replay: the record's engine parameters: %s", why);
        }
    }
    if (st != LOOM_OK) {
        loom__replayer_close(rp);
        return st;
    }
    e->rp = rp;
    e->rp_more = loom__replayer_more(rp);
    *out = e;
    return LOOM_OK;
}
