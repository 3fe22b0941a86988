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
}

loom_status loom__engine_record_open(loom_engine *e) {
    loom__record_header h;
    fill_header(e, &h);
    LOOM_TRY(loom__recorder_open(e->params.record_path, &h, &e->rec));
    e->params.record_path = NULL; /* the caller's string: not kept */
    return LOOM_OK;
}

loom_status loom__engine_record_request(loom_engine *e, const loom_request_params *p,
                                        loom__req *r) {
    loom__rec_buf b = {.ok = true};
    loom__record_encode_request(&b, r->id, r->arrival_ns - e->t0_ns, p, r->prompt, r->n_prompt);
    if (!b.ok) {
        loom__rec_free(&b);
        return loom__fail(LOOM_ERR_OUT_OF_MEMORY, "submit: out of memory for the input record");
    }
    r->record = b.p;
    r->n_record = b.n;
    return LOOM_OK;
}

/* ---- replaying ----------------------------------------------------------------------------- */

loom_status loom__engine_replay_begin(loom_engine *e) {
    loom__replayer *rp = e->rp;
    loom_status st = loom__replayer_next_step(rp);
    for (size_t i = 0; st == LOOM_OK && i < rp->n_reqs; i++) {
        loom__record_request *q = &rp->reqs[i];
        /* Set here, not when decoded: the array of requests may have moved since (it grows as
         * the step's records are read), and with it the sampler settings inside each entry. */
        q->params.sampler = &q->sampler;
        loom_request_id id;
        st = loom__engine_enqueue(e, &q->params, e->t0_ns + q->arrival_ns, q->id, &id);
        if (st != LOOM_OK) {
            char why[512];
            snprintf(why, sizeof why, "%s", loom_last_error());
            st = loom__fail(st, "replay: step %lld: the recorded request %llu is refused: %s",
                            (long long)rp->step, (unsigned long long)q->id, why);
        }
    }
    pthread_mutex_lock(&e->mu);
    for (size_t i = 0; st == LOOM_OK && i < rp->n_cancels; i++) {
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
        in->cancels[in->n_cancels++] = rp->cancels[i];
    }
    e->rp_more = st == LOOM_OK && loom__replayer_more(rp);
    pthread_mutex_unlock(&e->mu);
    return st;
}

loom_status loom__engine_replay_end(loom_engine *e) {
    const loom__replayer *rp = e->rp;
    LOOM_RETURN_IF(rp->has_end && rp->next_clock != rp->n_clocks, LOOM_ERR_INTERNAL,
                   "replay: step %lld diverged from the record: its scheduler read the clock %u "
                   "times, the recorded run %u times (another library version, model or "
                   "backend?)",
                   (long long)rp->step, rp->next_clock, rp->n_clocks);
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
        st = loom_engine_create(model, &p, &e);
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
