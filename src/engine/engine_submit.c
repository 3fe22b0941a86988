/* engine_submit.c — the engine's thread-safe surface: submit and cancel go through an inbox
 * under a mutex that the step drains; stats are a snapshot under the same mutex. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/abi.h"
#include "core/alloc.h"
#include "core/timer.h"
#include "engine/engine.h"

/* Appends x to a growable array of pointers-or-ids (element size sz). */
static bool push(void **arr, size_t *n, size_t *cap, const void *x, size_t sz) {
    if (*n == *cap) {
        size_t c = *cap ? *cap * 2 : 16;
        void *grown = loom__realloc(*arr, c * sz);
        if (!grown) return false;
        *arr = grown;
        *cap = c;
    }
    memcpy((char *)*arr + *n * sz, x, sz);
    (*n)++;
    return true;
}

double loom_engine_now(void) {
    return (double)loom__now_ns() * 1e-9;
}

loom_status loom_engine_submit(loom_engine *e, const loom_request_params *req,
                               loom_request_id *out_id) {
    loom__clear_error();
    LOOM_CHECK_ARG(e != NULL && req != NULL && out_id != NULL);
    LOOM_RETURN_IF(e->rp != NULL, LOOM_ERR_INVALID_ARG,
                   "submit: a replay engine takes its requests from its record");
    loom_request_params params, *p = &params;
    loom_sampler_params sampler;
    LOOM_TRY(loom__request_params_in(req, p, &sampler));
    /* The arrival: the caller's (validated against the clock now), else the submit time. */
    int64_t now_ns = loom__now_ns(), arrival_ns = now_ns;
    if (p->arrival_s != 0) {
        LOOM_RETURN_IF(!isfinite(p->arrival_s) || p->arrival_s < 0, LOOM_ERR_INVALID_ARG,
                       "submit: arrival_s %g must be finite and >= 0 (0: at submit)", p->arrival_s);
        double now_s = (double)now_ns * 1e-9;
        LOOM_RETURN_IF(p->arrival_s > now_s + LOOM_ENGINE_ARRIVAL_SLACK_S, LOOM_ERR_INVALID_ARG,
                       "submit: arrival_s %.6f is %.6f s after now (%.6f s on "
                       "loom_engine_now()'s clock); at most %g s is allowed",
                       p->arrival_s, p->arrival_s - now_s, now_s, LOOM_ENGINE_ARRIVAL_SLACK_S);
        int64_t a = (int64_t)llround(p->arrival_s * 1e9);
        arrival_ns = a < now_ns ? a : now_ns; /* within the slack: taken as the submit time */
    }
    return loom__engine_enqueue(e, p, arrival_ns, 0, out_id);
}

loom_status loom__engine_enqueue(loom_engine *e, const loom_request_params *p, int64_t arrival_ns,
                                 loom_request_id id, loom_request_id *out_id) {
    LOOM_RETURN_IF(p->n > LOOM_ENGINE_MAX_N - 1, LOOM_ERR_INVALID_ARG, "submit: n = %d (1..%d)",
                   p->n, LOOM_ENGINE_MAX_N - 1);
    LOOM_RETURN_IF(p->sampler->n_logprobs > e->params.max_logprobs, LOOM_ERR_INVALID_ARG,
                   "submit: n_logprobs %d is above this engine's limit of %d (raise "
                   "loom_engine_params.max_logprobs)",
                   p->sampler->n_logprobs, e->params.max_logprobs);
    loom__req *r = NULL;
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
            r->samples[i].swap_slots = loom__malloc((size_t)e->swap_list_cap * sizeof(int32_t));
            if (!r->samples[i].swap_slots) {
                loom__req_free(r);
                return loom__fail(LOOM_ERR_OUT_OF_MEMORY, "submit: out of memory");
            }
        }
    }
    for (int32_t i = 0; i < r->n_samples; i++) r->samples[i].kv_seq = -1;
    r->arrival_ns = arrival_ns;
    /* Admission control, on a copy of the parameters: a degraded request is recorded as the
     * engine will serve it. A replayed request was admitted when it was recorded. */
    loom_request_params admitted = *p;
    if (id == 0) {
        loom_status as = loom__engine_admit(e, r, &admitted);
        if (as != LOOM_OK) {
            loom__req_free(r);
            return as;
        }
        p = &admitted;
    }
    if (e->rec) {
        loom_status rs = loom__engine_record_request(e, p, r);
        if (rs != LOOM_OK) {
            loom__req_free(r);
            return rs;
        }
    }

    pthread_mutex_lock(&e->mu);
    loom_status st = LOOM_OK;
    if (id == 0) {
        r->id = e->next_id++;
    } else if (id >= e->next_id) { /* a replayed request keeps its recorded id */
        r->id = id;
        e->next_id = id + 1;
    } else {
        st = loom__fail(LOOM_ERR_BAD_INPUT, "replay: request id %llu after id %llu (ids only grow)",
                        (unsigned long long)id, (unsigned long long)(e->next_id - 1));
    }
    /* The step that takes the request writes its record, so the file follows the order the
     * engine saw; the id is known only now. */
    if (st == LOOM_OK && r->record) loom__engine_record_set_id(r);
    if (st == LOOM_OK) st = loom__id_map_put(&e->live, r->id, r);
    if (st == LOOM_OK &&
        !push((void **)&e->inbox.reqs, &e->inbox.n_reqs, &e->inbox.cap_reqs, &r, sizeof r)) {
        loom__id_map_del(&e->live, r->id);
        st = loom__fail(LOOM_ERR_OUT_OF_MEMORY, "submit: out of memory");
    }
    /* Read while the lock is held: once it is released, a step on another thread may take the
     * request, finish it and free it before this thread reads it again (seen by TSan in
     * test_soak: a submit of a one-token request racing the step that freed it). */
    loom_request_id new_id = r->id;
    if (st == LOOM_OK) {
        loom__engine_admitted_locked(e, r);
        pthread_cond_broadcast(&e->cv);
    }
    pthread_mutex_unlock(&e->mu);
    if (st != LOOM_OK) {
        loom__req_free(r);
        return st;
    }
    *out_id = new_id;
    return LOOM_OK;
}

loom_status loom_engine_cancel(loom_engine *e, loom_request_id id) {
    loom__clear_error();
    LOOM_CHECK_ARG(e != NULL);
    LOOM_RETURN_IF(e->rp != NULL, LOOM_ERR_INVALID_ARG,
                   "cancel: a replay engine takes its cancellations from its record");
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
    /* A replay's work is its record: requests still running where the recording ended stay. */
    bool work = e->rp ? e->rp_more : e->live.count > 0 || e->inbox.n_cancels > 0;
    pthread_mutex_unlock(&e->mu);
    return work;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

double loom__engine_percentile(double *v, size_t n, double q) {
    if (n == 0) return 0;
    qsort(v, n, sizeof *v, cmp_double);
    size_t rank = (size_t)ceil(q * (double)n); /* 1-based */
    if (rank < 1) rank = 1;
    if (rank > n) rank = n;
    return v[rank - 1];
}

loom_status loom_engine_get_kv_group(loom_engine *e, int32_t group, loom_kv_group_info *out) {
    loom__clear_error();
    LOOM_CHECK_ARG(e != NULL && out != NULL);
    LOOM_RETURN_IF(group < 0 || group >= e->n_groups, LOOM_ERR_INVALID_ARG,
                   "engine: KV group %d outside [0, %d)", group, e->n_groups);
    pthread_mutex_lock(&e->mu);
    loom_kv_group_info gi = e->kv_groups[group];
    pthread_mutex_unlock(&e->mu);
    gi.size = sizeof gi;
    return loom__abi_result_out(out, &gi, sizeof gi, LOOM__ABI_END(loom_kv_group_info, cow_copies),
                                "kv_group_info");
}

loom_status loom_engine_get_stats(loom_engine *e, loom_engine_stats *out) {
    loom__clear_error();
    LOOM_CHECK_ARG(e != NULL && out != NULL);
    LOOM_RETURN_IF(out->size < LOOM__ABI_END(loom_engine_stats, tokens_per_s_recent),
                   LOOM_ERR_INVALID_ARG, "engine_get_stats: out->size %zu: set it to sizeof",
                   out->size);
    /* Copies under the lock, sorting outside it: a step never waits for the percentiles. */
    double ttft[LOOM_ENGINE_LATENCY_WINDOW], tpot[LOOM_ENGINE_LATENCY_WINDOW]; /* 16 KiB */
    pthread_mutex_lock(&e->mu);
    loom_engine_stats st = e->stats;
    double ttft_sum = e->ttft_sum_s, tpot_sum = e->tpot_sum_s;
    size_t n_ttft = st.ttft_count < LOOM_ENGINE_LATENCY_WINDOW ? (size_t)st.ttft_count
                                                               : LOOM_ENGINE_LATENCY_WINDOW;
    size_t n_tpot = st.tpot_count < LOOM_ENGINE_LATENCY_WINDOW ? (size_t)st.tpot_count
                                                               : LOOM_ENGINE_LATENCY_WINDOW;
    memcpy(ttft, e->ttft_ring, n_ttft * sizeof *ttft);
    memcpy(tpot, e->tpot_ring, n_tpot * sizeof *tpot);
    int64_t busy_ns = e->busy_ns, recent_tokens = 0, recent_ns = 0;
    int64_t n_recent = e->n_rate < LOOM_ENGINE_RATE_WINDOW ? e->n_rate : LOOM_ENGINE_RATE_WINDOW;
    for (int64_t k = 0; k < n_recent; k++) {
        recent_tokens += e->rate_tokens[k];
        recent_ns += e->rate_ns[k];
    }
    pthread_mutex_unlock(&e->mu);

    st.ttft_mean_s = st.ttft_count > 0 ? ttft_sum / (double)st.ttft_count : 0;
    st.ttft_p50_s = loom__engine_percentile(ttft, n_ttft, 0.50);
    st.ttft_p99_s = loom__engine_percentile(ttft, n_ttft, 0.99);
    st.tpot_mean_s = st.tpot_count > 0 ? tpot_sum / (double)st.tpot_count : 0;
    st.tpot_p50_s = loom__engine_percentile(tpot, n_tpot, 0.50);
    st.tpot_p99_s = loom__engine_percentile(tpot, n_tpot, 0.99);
    st.busy_s = (double)busy_ns * 1e-9;
    st.tokens_per_s = busy_ns > 0 ? (double)st.tokens_generated / st.busy_s : 0;
    st.tokens_per_s_recent = recent_ns > 0 ? (double)recent_tokens / ((double)recent_ns * 1e-9) : 0;
    st.size = sizeof st;
    return loom__abi_result_out(
        out, &st, sizeof st, LOOM__ABI_END(loom_engine_stats, tokens_per_s_recent), "engine_stats");
}

loom_status loom_engine_step(loom_engine *e, const loom_event *const **events, size_t *n_events) {
    loom__clear_error();
    LOOM_CHECK_ARG(e != NULL && events != NULL && n_events != NULL);
    LOOM_RETURN_IF(e->has_thread, LOOM_ERR_BUSY, "engine: background mode steps on its own thread");
    loom_status st = loom__engine_step(e);
    /* The caller sees pointers (loom_event may grow): one per event, in an array that grows
     * with the events (engine_step.c), so handing them out cannot fail once the step ran. */
    for (size_t i = 0; i < e->n_events; i++) e->event_ptrs[i] = &e->events[i];
    *events = e->event_ptrs;
    *n_events = e->n_events;
    return st;
}
