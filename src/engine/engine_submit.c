/* engine_submit.c — the engine's thread-safe surface: submit and cancel go through an inbox
 * under a mutex that the step drains; stats are a snapshot under the same mutex. */
#include <stdlib.h>
#include <string.h>

#include "engine/engine.h"

/* Appends x to a growable array of pointers-or-ids (element size sz). */
static bool push(void **arr, size_t *n, size_t *cap, const void *x, size_t sz) {
    if (*n == *cap) {
        size_t c = *cap ? *cap * 2 : 16;
        void *grown = realloc(*arr, c * sz);
        if (!grown) return false;
        *arr = grown;
        *cap = c;
    }
    memcpy((char *)*arr + *n * sz, x, sz);
    (*n)++;
    return true;
}

loom_status loom_engine_submit(loom_engine *e, const loom_request_params *p,
                               loom_request_id *out_id) {
    loom__clear_error();
    LOOM_CHECK_ARG(e != NULL && p != NULL && out_id != NULL);
    LOOM_RETURN_IF(p->n > LOOM_ENGINE_MAX_N - 1, LOOM_ERR_INVALID_ARG, "submit: n = %d (1..%d)",
                   p->n, LOOM_ENGINE_MAX_N - 1);
    LOOM_RETURN_IF(p->sampler.n_logprobs > e->params.max_logprobs, LOOM_ERR_INVALID_ARG,
                   "submit: n_logprobs %d is above this engine's limit of %d (raise "
                   "loom_engine_params.max_logprobs)",
                   p->sampler.n_logprobs, e->params.max_logprobs);
    loom_req *r = NULL;
    LOOM_TRY(loom__req_create(e->model, p, e->max_ctx, e->max_piece, &r));
    /* A prompt the whole KV pool cannot hold is refused now rather than failed later. */
    int64_t blocks = ((int64_t)r->n_prompt + e->params.block_size) / e->params.block_size;
    if (blocks > e->n_blocks) {
        loom__req_free(r);
        return loom__fail(LOOM_ERR_CONTEXT_FULL,
                          "submit: the prompt needs %lld KV blocks; the cache has %d",
                          (long long)blocks, e->n_blocks);
    }
    if (e->params.preempt == LOOM_PREEMPT_SWAP) {
        for (int32_t i = 0; i < r->n_samples; i++) {
            r->samples[i].swap_slots = malloc((size_t)e->swap_list_cap * sizeof(int32_t));
            if (!r->samples[i].swap_slots) {
                loom__req_free(r);
                return loom__fail(LOOM_ERR_OUT_OF_MEMORY, "submit: out of memory");
            }
        }
    }
    for (int32_t i = 0; i < r->n_samples; i++) r->samples[i].kv_seq = -1;
    r->t_submit = (double)loom__engine_now_us(e) * 1e-6;

    pthread_mutex_lock(&e->mu);
    r->id = e->next_id++;
    loom_status st = loom__id_map_put(&e->live, r->id, r);
    if (st == LOOM_OK && !push((void **)&e->inbox.reqs, &e->inbox.n_reqs, &e->inbox.cap_reqs, &r,
                               sizeof r)) {
        loom__id_map_del(&e->live, r->id);
        st = loom__fail(LOOM_ERR_OUT_OF_MEMORY, "submit: out of memory");
    }
    if (st == LOOM_OK) pthread_cond_broadcast(&e->cv);
    pthread_mutex_unlock(&e->mu);
    if (st != LOOM_OK) {
        loom__req_free(r);
        return st;
    }
    *out_id = r->id;
    return LOOM_OK;
}

loom_status loom_engine_cancel(loom_engine *e, loom_request_id id) {
    loom__clear_error();
    LOOM_CHECK_ARG(e != NULL);
    pthread_mutex_lock(&e->mu);
    loom_status st = LOOM_OK;
    if (!loom__id_map_get(&e->live, id)) {
        st = loom__fail(LOOM_ERR_NOT_FOUND, "cancel: no request %llu is pending",
                        (unsigned long long)id);
    } else if (!push((void **)&e->inbox.cancels, &e->inbox.n_cancels, &e->inbox.cap_cancels, &id,
                     sizeof id)) {
        st = loom__fail(LOOM_ERR_OUT_OF_MEMORY, "cancel: out of memory");
    } else {
        pthread_cond_broadcast(&e->cv);
    }
    pthread_mutex_unlock(&e->mu);
    return st;
}

bool loom_engine_has_work(loom_engine *e) {
    if (!e) return false;
    pthread_mutex_lock(&e->mu);
    bool work = e->live.count > 0 || e->inbox.n_cancels > 0;
    pthread_mutex_unlock(&e->mu);
    return work;
}

loom_status loom_engine_get_stats(loom_engine *e, loom_engine_stats *out) {
    loom__clear_error();
    LOOM_CHECK_ARG(e != NULL && out != NULL);
    pthread_mutex_lock(&e->mu);
    *out = e->stats;
    pthread_mutex_unlock(&e->mu);
    return LOOM_OK;
}

loom_status loom_engine_step(loom_engine *e, const loom_event **events, size_t *n_events) {
    loom__clear_error();
    LOOM_CHECK_ARG(e != NULL && events != NULL && n_events != NULL);
    LOOM_RETURN_IF(e->has_thread, LOOM_ERR_BUSY,
                   "engine: background mode steps on its own thread");
    loom_status st = loom__engine_step(e);
    *events = e->events;
    *n_events = e->n_events;
    return st;
}
