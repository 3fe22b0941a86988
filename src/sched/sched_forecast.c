/* sched_forecast.c — a copy of the scheduler's queues and the time-to-first-token prediction
 * built on it (sched.h, "Forecast"). The rank keys are those of sched_plan.c's order, so a
 * prediction counts exactly the requests the plan would serve first. */
#include <limits.h>
#include <math.h>
#include <stdlib.h>

#include "core/alloc.h"
#include "core/status.h"
#include "sched/sched_internal.h"

static loom_status reserve(loom__sched_forecast *f, int32_t n) {
    if (n <= f->cap) return LOOM_OK;
    int32_t cap = f->cap > 0 ? f->cap : 64;
    while (cap < n) cap = cap > INT32_MAX / 2 ? INT32_MAX : cap * 2;
    loom__sched_brief *b = loom__realloc(f->briefs, (size_t)cap * sizeof *b);
    LOOM_RETURN_IF(!b, LOOM_ERR_OUT_OF_MEMORY, "sched: forecast of %d requests", cap);
    f->briefs = b;
    f->cap = cap;
    return LOOM_OK;
}

loom_status loom__sched_forecast_build(const loom__sched *s, int64_t now_us,
                                       loom__sched_forecast *f) {
    LOOM_CHECK_ARG(s && f);
    LOOM_TRY(reserve(f, s->n_waiting + s->n_running));
    /* The keys as the next plan will compute them (promotion aside: a request promoted at the
     * next step still ranks here as it does now). */
    loom__sched *m = (loom__sched *)s; /* set_keys writes only per-step scratch */
    loom__sched_rank_keys(m, now_us);
    f->n = 0;
    f->n_decode = 0;
    f->ctx_running = 0;
    for (int32_t q = 0; q < 2; q++) {
        const int32_t *list = q ? s->waiting : s->running;
        int32_t len = q ? s->n_waiting : s->n_running;
        for (int32_t i = 0; i < len; i++) {
            const sched_req *r = &s->reqs[list[i]];
            bool running = r->state == SCHED_RUNNING;
            int32_t left = loom__sched_total(r) - (running || r->swapped ? r->n_computed : 0);
            if (!running && !r->swapped && s->kv.cached_tokens) {
                /* What it will find in the prefix cache (keeping one token to compute). */
                int32_t hit = s->kv.cached_tokens(s->kv.ctx, r->id);
                if (hit > left - 1) hit = left - 1;
                if (hit > 0) left -= hit;
            }
            bool decode = running && r->n_generated > 0 && left == 1;
            f->briefs[f->n++] = (loom__sched_brief){
                .key_prio = r->key_prio,
                .tier = r->key_tier,
                .deadline = r->key_deadline,
                .arrival_us = r->arrival_us,
                .seq = r->seq,
                .remaining = decode ? 0 : left,
                .out_left = r->max_new_tokens - r->n_generated,
                .running = running,
                .protected_ = r->protected_until_us > now_us,
                .paced = r->tpot_us > 0,
                .n_computed = running ? r->n_computed : 0,
                .promoted = r->promoted,
                .priority = r->priority,
            };
            if (running) {
                f->n_decode += decode;
                f->ctx_running += r->n_computed;
            }
        }
    }
    f->fcfs = s->cfg.policy == LOOM_SCHED_POLICY_FCFS;
    f->defer = !f->fcfs && loom__cost_model_ready(&s->cost);
    f->max_seqs = s->cfg.max_seqs;
    f->max_batched_tokens = s->cfg.max_batched_tokens;
    f->n_running = s->n_running;
    f->now_us = now_us;
    return LOOM_OK;
}

/* Prompt tokens a new request will compute: its prompt less the expected prefix-cache hit. */
static int32_t own_work(const loom__sched_forecast *f, const loom__sched_request_info *info) {
    double frac = f->hit_frac > 0 && f->hit_frac < 1 ? f->hit_frac : 0;
    int32_t n = info->n_prompt - (int32_t)(frac * info->n_prompt);
    return n < 1 ? 1 : n;
}

/* The brief of a request added now, before it has run. */
static loom__sched_brief new_brief(const loom__sched_forecast *f,
                                   const loom__sched_request_info *info, int64_t now_us,
                                   uint64_t seq) {
    int64_t due = INT64_MAX;
    if (info->ttft_us > 0)
        due = info->arrival_us > INT64_MAX - info->ttft_us ? INT64_MAX
                                                           : info->arrival_us + info->ttft_us;
    loom__sched_brief b = {
        .key_prio = f->fcfs ? 0 : 2 * (int64_t)info->priority,
        .tier = f->fcfs || (due != INT64_MAX && due > now_us) ? 0 : 2,
        .deadline = f->fcfs ? 0 : due,
        .arrival_us = info->arrival_us,
        .seq = seq,
        .remaining = own_work(f, info),
        .out_left = info->max_new_tokens,
        .paced = info->tpot_us > 0,
    };
    return b;
}

loom_status loom__sched_forecast_add(loom__sched_forecast *f,
                                     const loom__sched_request_info *info) {
    LOOM_CHECK_ARG(f && info);
    LOOM_TRY(reserve(f, f->n + 1));
    f->briefs[f->n] = new_brief(f, info, f->now_us, UINT64_MAX - (uint64_t)(INT32_MAX - f->n));
    f->n++;
    return LOOM_OK;
}

static int cmp3(int64_t a, int64_t b) {
    return (a > b) - (a < b);
}

/* Does a rank before b (sched_plan.c's key order)? */
static bool ranks_before(const loom__sched_brief *a, const loom__sched_brief *b) {
    int c = cmp3(b->key_prio, a->key_prio);
    if (!c) c = cmp3(a->tier, b->tier);
    if (!c) c = cmp3(a->deadline, b->deadline);
    if (!c) c = cmp3(a->arrival_us, b->arrival_us);
    if (!c) c = (a->seq > b->seq) - (a->seq < b->seq);
    return c < 0;
}

/* Microseconds from now to the first token, with `decode` decodes in each step holding `ctx`
 * positions (see loom__sched_forecast_ttft). */
static double predict_us(const loom__sched_forecast *f, const loom__cost_model *cm,
                         const loom__sched_request_info *info, double work, int32_t waiting_ahead,
                         int32_t preemptible, int32_t n_run_kept, double out_kept, double decode,
                         double ctx) {
    double per_step = f->max_batched_tokens - decode;
    if (per_step < 1) per_step = 1;
    double steps = ceil(work / per_step);
    /* Sequence slots: those free, those of preemptible requests; beyond them, wait for running
     * requests to finish — n_run_kept of them finishing over their mean remaining output. */
    int32_t free_slots = f->max_seqs - f->n_running + preemptible;
    int32_t short_by = waiting_ahead + 1 - free_slots;
    if (short_by > 0 && n_run_kept > 0) {
        double mean_out = out_kept / n_run_kept;
        double slot_steps = ceil((double)short_by * mean_out / n_run_kept);
        double own = ceil(own_work(f, info) / per_step);
        if (slot_steps + own > steps) steps = slot_steps + own;
    }
    double step_fixed = loom__cost_model_predict(cm, 0, ctx);
    return steps * step_fixed + cm->per_token_us * (work + steps * decode);
}

int64_t loom__sched_forecast_ttft(const loom__sched_forecast *f, const loom__cost_model *cm,
                                  const loom__sched_request_info *info, int64_t now_us) {
    if (!f || !cm || !info || !loom__cost_model_ready(cm)) return -1;
    loom__sched_brief me = new_brief(f, info, now_us, UINT64_MAX);
    double work = me.remaining; /* prefill tokens computed before its first token */
    int32_t waiting_ahead = 0, preemptible = 0, n_run_kept = 0;
    double out_kept = 0;
    for (int32_t i = 0; i < f->n; i++) {
        loom__sched_brief bb = f->briefs[i];
        const loom__sched_brief *b = &bb;
        /* A promoted request ranks below every class with a deadline (sched_plan.c): with this
         * request among them, below its priority too. */
        if (bb.promoted && (info->ttft_us > 0 || info->tpot_us > 0) && !f->fcfs) {
            int64_t bound = 2 * (int64_t)info->priority - 1, own = 2 * (int64_t)bb.priority;
            if (bound < bb.key_prio) bb.key_prio = own > bound ? own : bound;
        }
        if (ranks_before(b, &me)) {
            work += b->remaining;
            if (!b->running) waiting_ahead++;
        } else if (b->running && !f->fcfs && b->key_prio < me.key_prio && !b->protected_) {
            preemptible++; /* it would give its slot up for this request */
            continue;
        }
        if (b->running) {
            n_run_kept++;
            out_kept += b->out_left;
        }
    }
    /* Decodes in each step: all of them, or (deferral) those the scheduler keeps for it. */
    double decode_all = f->n_decode, decode_kept = 0, ctx_kept = 0;
    for (int32_t i = 0; i < f->n; i++) {
        const loom__sched_brief *b = &f->briefs[i];
        if (!b->running || b->remaining > 0) continue;
        if (b->paced || b->key_prio >= me.key_prio) { /* what the scheduler never defers */
            decode_kept++;
            ctx_kept += b->n_computed + 1;
        }
    }
    double us = predict_us(f, cm, info, work, waiting_ahead, preemptible, n_run_kept, out_kept,
                           decode_all, (double)f->ctx_running);
    double slack = (double)(info->arrival_us + info->ttft_us - now_us);
    if (f->defer && info->ttft_us > 0 && decode_kept < decode_all && us > slack) {
        double deferred = predict_us(f, cm, info, work, waiting_ahead, preemptible, n_run_kept,
                                     out_kept, decode_kept, ctx_kept);
        if (deferred <= slack) us = deferred;
    }
    double waited = (double)(now_us - info->arrival_us);
    double total = waited + us;
    return total >= 9e18 ? INT64_MAX : (int64_t)total;
}

bool loom__admission_decide(loom_admission_policy policy, int64_t predicted_us,
                            loom__sched_request_info *info, bool *degraded) {
    *degraded = false;
    if (policy == LOOM_ADMIT_ALL || info->ttft_us <= 0 || predicted_us < 0 ||
        predicted_us <= info->ttft_us)
        return true;
    if (policy == LOOM_ADMIT_REJECT_LATE) return false;
    info->ttft_us = 0;
    info->tpot_us = 0;
    if (info->priority > 0) info->priority = 0;
    *degraded = true;
    return true;
}

void loom__sched_forecast_free(loom__sched_forecast *f) {
    if (!f) return;
    free(f->briefs);
    f->briefs = NULL;
    f->n = f->cap = 0;
}
