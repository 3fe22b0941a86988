/* engine_admit.c — admission control and per-class service figures: the step-cost model the
 * step thread fits to its own steps, the forecast of the queues it publishes after each step,
 * the decision submit takes from them (loom_engine_params.admission), loom_engine_predict_ttft,
 * and loom_engine_get_class_stats. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/abi.h"
#include "core/alloc.h"
#include "core/timer.h"
#include "engine/engine.h"

/* ------------------------------------------------------------------------------------------ */
/* Classes                                                                                    */
/* ------------------------------------------------------------------------------------------ */

loom__engine_class *loom__engine_class_locked(loom_engine *e, int32_t p) {
    for (int32_t i = 0; i < e->n_classes; i++)
        if (e->classes[i].st.priority == p) return &e->classes[i];
    if (e->n_classes == LOOM_ENGINE_MAX_CLASSES) return NULL;
    loom__engine_class *c = &e->classes[e->n_classes];
    double *ttft = loom__malloc(LOOM_ENGINE_LATENCY_WINDOW * sizeof *ttft);
    double *tpot = loom__malloc(LOOM_ENGINE_LATENCY_WINDOW * sizeof *tpot);
    if (!ttft || !tpot) { /* the class goes uncounted; serving does not depend on it */
        free(ttft);
        free(tpot);
        return NULL;
    }
    memset(c, 0, sizeof *c);
    c->st.priority = p;
    c->ttft_ring = ttft;
    c->tpot_ring = tpot;
    e->n_classes++;
    return c;
}

void loom__engine_class_ended_locked(loom_engine *e, const loom__req *r, double ttft_s,
                                     double tpot_s, int64_t tokens) {
    loom__engine_class *c = loom__engine_class_locked(e, r->class_priority);
    if (!c) return;
    c->st.ended++;
    c->st.tokens_generated += tokens;
    if (r->asked_ttft_us > 0) {
        c->st.ttft_deadlines++;
        if (ttft_s >= 0 && ttft_s * 1e6 <= (double)r->asked_ttft_us) c->st.ttft_met++;
    }
    if (ttft_s >= 0) c->ttft_ring[c->n_ttft++ % LOOM_ENGINE_LATENCY_WINDOW] = ttft_s;
    if (tpot_s >= 0) c->tpot_ring[c->n_tpot++ % LOOM_ENGINE_LATENCY_WINDOW] = tpot_s;
}

void loom__engine_admit_free(loom_engine *e) {
    for (int32_t i = 0; i < e->n_classes; i++) {
        free(e->classes[i].ttft_ring);
        free(e->classes[i].tpot_ring);
    }
    e->n_classes = 0;
    loom__sched_forecast_free(&e->fc_build);
    loom__sched_forecast_free(&e->fc_pub);
}

loom_status loom_engine_get_class_stats(loom_engine *e, int32_t priority, loom_class_stats *out) {
    loom__clear_error();
    LOOM_CHECK_ARG(e != NULL && out != NULL);
    LOOM_RETURN_IF(out->size < LOOM__ABI_END(loom_class_stats, tpot_p99_s), LOOM_ERR_INVALID_ARG,
                   "engine_get_class_stats: out->size %zu: set it to sizeof", out->size);
    double ttft[LOOM_ENGINE_LATENCY_WINDOW], tpot[LOOM_ENGINE_LATENCY_WINDOW];
    size_t n_ttft = 0, n_tpot = 0;
    loom_class_stats st;
    bool found = false;
    pthread_mutex_lock(&e->mu);
    for (int32_t i = 0; i < e->n_classes && !found; i++) {
        const loom__engine_class *c = &e->classes[i];
        if (c->st.priority != priority) continue;
        found = true;
        st = c->st;
        n_ttft =
            c->n_ttft < LOOM_ENGINE_LATENCY_WINDOW ? (size_t)c->n_ttft : LOOM_ENGINE_LATENCY_WINDOW;
        n_tpot =
            c->n_tpot < LOOM_ENGINE_LATENCY_WINDOW ? (size_t)c->n_tpot : LOOM_ENGINE_LATENCY_WINDOW;
        memcpy(ttft, c->ttft_ring, n_ttft * sizeof *ttft);
        memcpy(tpot, c->tpot_ring, n_tpot * sizeof *tpot);
    }
    pthread_mutex_unlock(&e->mu);
    LOOM_RETURN_IF(!found, LOOM_ERR_NOT_FOUND,
                   "engine_get_class_stats: no class of priority %d (none submitted, or more "
                   "than %d classes)",
                   priority, LOOM_ENGINE_MAX_CLASSES);
    st.ttft_p50_s = loom__engine_percentile(ttft, n_ttft, 0.50);
    st.ttft_p99_s = loom__engine_percentile(ttft, n_ttft, 0.99);
    st.tpot_p50_s = loom__engine_percentile(tpot, n_tpot, 0.50);
    st.tpot_p99_s = loom__engine_percentile(tpot, n_tpot, 0.99);
    st.size = sizeof st;
    return loom__abi_result_out(out, &st, sizeof st, LOOM__ABI_END(loom_class_stats, tpot_p99_s),
                                "class_stats");
}

/* ------------------------------------------------------------------------------------------ */
/* The cost model and the forecast                                                            */
/* ------------------------------------------------------------------------------------------ */

void loom__engine_after_step(loom_engine *e, int32_t n_tokens, int64_t n_ctx, int64_t step_us) {
    loom__cost_model_update(&e->cost, n_tokens, (double)n_ctx, (double)step_us);
    loom__sched_set_cost(e->sched, &e->cost);
    /* Built outside the lock (a pass over the queues), published by swapping buffers. When
     * memory for it runs short the previous forecast stays: a little stale, never wrong in
     * kind. */
    bool fresh = loom__sched_forecast_build(e->sched, loom__engine_us_of(e, loom__now_ns()),
                                            &e->fc_build) == LOOM_OK;
    /* A new prompt is expected to hit the prefix cache as recent prompts have (only this
     * thread writes these counters). */
    const loom_engine_stats *st = &e->stats;
    e->fc_build.hit_frac = st->prefix_query_tokens > 0
                               ? (double)st->prefix_hit_tokens / (double)st->prefix_query_tokens
                               : 0;
    pthread_mutex_lock(&e->mu);
    if (fresh) {
        loom__sched_forecast t = e->fc_pub;
        e->fc_pub = e->fc_build;
        e->fc_build = t;
    }
    e->cost_pub = e->cost;
    e->stats.step_base_s = e->cost.base_us * 1e-6;
    e->stats.step_per_token_s = e->cost.per_token_us * 1e-6;
    e->stats.step_per_ctx_s = e->cost.per_ctx_us * 1e-6;
    pthread_mutex_unlock(&e->mu);
}

/* Under mu: the forecast for info now. -1 before the first step. */
static int64_t predict_locked(loom_engine *e, const loom__sched_request_info *info) {
    return loom__sched_forecast_ttft(&e->fc_pub, &e->cost_pub, info,
                                     loom__engine_us_of(e, loom__now_ns()));
}

loom_status loom__engine_admit(loom_engine *e, loom__req *r, loom_request_params *p) {
    loom_admission_policy policy = e->params.admission;
    if (policy == LOOM_ADMIT_ALL || r->ttft_us <= 0) return LOOM_OK; /* nothing to decide */
    pthread_mutex_lock(&e->mu);
    loom__sched_request_info info = loom__engine_sched_info(e, r, 0);
    int64_t predicted = predict_locked(e, &info);
    bool degraded = false;
    bool admit = loom__admission_decide(policy, predicted, &info, &degraded);
    loom__engine_class *c = loom__engine_class_locked(e, r->class_priority);
    if (!admit) {
        e->stats.rejected++;
        if (c) c->st.rejected++;
    } else if (degraded) {
        e->stats.degraded++;
        if (c) c->st.degraded++;
    }
    pthread_mutex_unlock(&e->mu);
    LOOM_RETURN_IF(!admit, LOOM_ERR_OVERLOADED,
                   "submit: predicted time to first token %.3f s is later than the deadline "
                   "%.3f s (admission LOOM_ADMIT_REJECT_LATE)",
                   (double)predicted * 1e-6, (double)r->ttft_us * 1e-6);
    if (degraded) {
        r->priority = info.priority;
        r->ttft_us = r->tpot_us = 0;
        p->priority = info.priority;
        p->ttft_deadline_s = 0;
        p->tpot_deadline_s = 0;
    }
    return LOOM_OK;
}

void loom__engine_admitted_locked(loom_engine *e, const loom__req *r) {
    loom__engine_class *c = loom__engine_class_locked(e, r->class_priority);
    if (c) c->st.admitted++;
    loom__sched_request_info info = loom__engine_sched_info(e, r, 0);
    /* For later predictions until the next step rebuilds the forecast; without memory for it
     * they count one request fewer. */
    for (int32_t i = 0; i < r->n_samples; i++) (void)loom__sched_forecast_add(&e->fc_pub, &info);
}

loom_status loom_engine_predict_ttft(loom_engine *e, const loom_request_params *req,
                                     double *ttft_s) {
    loom__clear_error();
    LOOM_CHECK_ARG(e != NULL && req != NULL && ttft_s != NULL);
    LOOM_RETURN_IF(e->rp != NULL, LOOM_ERR_INVALID_ARG,
                   "predict_ttft: a replay engine takes no requests");
    loom_request_params params;
    loom_sampler_params sampler;
    LOOM_TRY(loom__request_params_in(req, &params, &sampler));
    LOOM_RETURN_IF(!isfinite(params.arrival_s) || params.arrival_s < 0, LOOM_ERR_INVALID_ARG,
                   "predict_ttft: arrival_s %g must be finite and >= 0 (0: now)", params.arrival_s);
    loom__req *r = NULL;
    LOOM_TRY(loom__req_create(e->model, &params, e->max_ctx, e->max_piece, &r));
    int64_t now_ns = loom__now_ns();
    int64_t a = params.arrival_s > 0 ? (int64_t)llround(params.arrival_s * 1e9) : now_ns;
    r->arrival_ns = a < now_ns ? a : now_ns;
    pthread_mutex_lock(&e->mu);
    loom__sched_request_info info = loom__engine_sched_info(e, r, 0);
    int64_t us = predict_locked(e, &info);
    pthread_mutex_unlock(&e->mu);
    loom__req_free(r);
    *ttft_s = us < 0 ? -1.0 : (double)us * 1e-6;
    return LOOM_OK;
}
