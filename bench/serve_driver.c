/* serve_driver.c — the step loop of loom-serve-bench. The main thread owns the engine: it
 * submits requests (open loop: when the clock passes each arrival; closed loop: whenever fewer
 * than N are in flight), calls loom_engine_step, and records
 *   per request: submit time, first TOKEN event, FINISHED/FAILED event, tokens;
 *   per step: KV blocks used/total and sequence counts (loom_engine_get_stats), its duration,
 *     tokens generated, and internal fragmentation (KV slots allocated but unused), exactly, as
 *     the engine counts it per KV group (loom_engine_get_kv_group: slots_unused); group 0's
 *     against its pool's slots, and all groups together in bytes against all KV memory.
 * A cross-check of the block count: a request that received a TOKEN event in this step and is
 * not finished holds exactly p = n_prompt + n_generated - 1 positions (the token just sampled is
 * written by the next step), so ceil(p / B) blocks of group 0 when no prefix is shared. */
#define _POSIX_C_SOURCE 200809L

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "serve.h"

double serve_now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void sleep_until(double t_abs) {
    struct timespec ts;
    ts.tv_sec = (time_t)t_abs;
    ts.tv_nsec = (long)((t_abs - (double)ts.tv_sec) * 1e9);
    if (ts.tv_nsec >= 1000000000L) ts.tv_nsec = 999999999L;
    while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) != 0) {
    }
}

/* ---- one run's state ----------------------------------------------------------------------- */

typedef struct serve_drv {
    serve_run *run;
    const serve_workload *w;
    const serve_config *cfg;
    loom_engine *e;
    double t0;
    loom_token *prompt;     /* [max prompt] scratch for submit */
    serve_record **touched; /* [n] records that got a token in the current step */
    size_t n_touched;
    int32_t n_awaiting;  /* submitted, no token yet, not finished */
    int32_t n_in_flight; /* submitted, not finished */
    size_t n_done;
    double next_report;
} serve_drv;

static loom_status drv_init(serve_drv *d, loom_model *model, const loom_engine_params *ep,
                            const serve_workload *w, const serve_config *cfg, serve_run *run) {
    memset(d, 0, sizeof *d);
    d->run = run;
    d->w = w;
    d->cfg = cfg;
    run->w = w;
    run->n = w->n;
    run->recs = calloc(w->n ? w->n : 1, sizeof *run->recs);
    run->block_size = ep->block_size;
    run->fcfs = ep->fcfs;
    int32_t max_prompt = 1;
    for (size_t i = 0; i < w->n; i++) {
        if (w->reqs[i].n_prompt > max_prompt) max_prompt = w->reqs[i].n_prompt;
    }
    d->prompt = malloc((size_t)max_prompt * sizeof *d->prompt);
    d->touched = malloc((w->n ? w->n : 1) * sizeof *d->touched);
    if (!run->recs || !d->prompt || !d->touched) {
        fprintf(stderr, "loom-serve-bench: out of memory\n");
        return LOOM_ERR_OUT_OF_MEMORY;
    }
    for (size_t i = 0; i < w->n; i++) run->recs[i].first_s = run->recs[i].finish_s = -1;
    loom_status st = loom_engine_create(model, ep, &d->e);
    if (st != LOOM_OK) {
        fprintf(stderr, "loom-serve-bench: engine: %s: %s\n", loom_status_str(st),
                loom_last_error());
    }
    return st;
}

static void drv_free(serve_drv *d) {
    d->run->stats.size = sizeof d->run->stats;
    if (d->e) loom_engine_get_stats(d->e, &d->run->stats);
    loom_engine_destroy(d->e);
    free(d->prompt);
    free(d->touched);
}

/* A run that could not start: no records to report. */
static loom_status drv_abort(serve_drv *d, loom_status st) {
    d->run->status = st;
    d->run->n = 0;
    drv_free(d);
    return st;
}

static double drv_now(const serve_drv *d) {
    return serve_now_s() - d->t0;
}

/* Submits request i; arrival is when it was due (open loop) or now (closed loop). */
static void drv_submit(serve_drv *d, size_t i, double arrival) {
    const serve_request *q = &d->w->reqs[i];
    serve_record *rec = &d->run->recs[i];
    serve_workload_prompt(d->w, q, d->prompt);
    loom_request_params rp = loom_request_default_params();
    rp.prompt_tokens = d->prompt;
    rp.n_prompt_tokens = (size_t)q->n_prompt;
    rp.max_tokens = q->max_tokens;
    rp.ignore_eos = true;
    loom_sampler_params sp = loom_sampler_default_params();
    sp.temperature = 0; /* greedy: sampling cost stays out of the measurement */
    rp.sampler = &sp;
    rp.priority = q->cls == SERVE_CLASS_HIGH ? 1 : 0;
    rp.ttft_deadline_s = q->cls == SERVE_CLASS_HIGH ? d->cfg->ttft_deadline_s : 0;
    rp.user_data = rec;
    loom_request_id id = 0;
    loom_status st = loom_engine_submit(d->e, &rp, &id);
    double now = drv_now(d);
    rec->arrival_s = arrival;
    rec->submit_s = now;
    rec->submitted = true;
    rec->id = id;
    double lag = now - arrival;
    d->run->sum_lag_s += lag;
    if (lag > d->run->max_lag_s) d->run->max_lag_s = lag;
    if (st != LOOM_OK) {
        fprintf(stderr, "loom-serve-bench: submit of request %zu (%d prompt tokens): %s: %s\n", i,
                q->n_prompt, loom_status_str(st), loom_last_error());
        rec->done = rec->failed = true;
        rec->status = st;
        rec->finish_s = now;
        d->n_done++;
        return;
    }
    d->n_awaiting++;
    d->n_in_flight++;
}

static void drv_event(serve_drv *d, const loom_event *ev, double now, int32_t *n_tokens) {
    serve_record *rec = ev->user_data;
    if (!rec || rec->done) return;
    switch (ev->kind) {
    case LOOM_EVENT_TOKEN:
        if (rec->n_tokens == 0) {
            rec->first_s = now;
            d->n_awaiting--;
        }
        rec->n_tokens++;
        (*n_tokens)++;
        d->touched[d->n_touched++] = rec;
        break;
    case LOOM_EVENT_FINISHED:
    case LOOM_EVENT_FAILED:
    default:
        rec->done = true;
        rec->finish_s = now;
        rec->reason = ev->reason;
        if (ev->kind != LOOM_EVENT_FINISHED) {
            rec->failed = true;
            rec->status = ev->status;
        }
        if (rec->n_tokens == 0) d->n_awaiting--;
        d->n_in_flight--;
        d->n_done++;
        break;
    }
}

static bool push_step(serve_run *run, const serve_step_sample *s) {
    if (run->n_steps == run->cap_steps) {
        size_t cap = run->cap_steps ? run->cap_steps * 2 : 1024;
        serve_step_sample *grown = realloc(run->steps, cap * sizeof *grown);
        if (!grown) return false;
        run->steps = grown;
        run->cap_steps = cap;
    }
    run->steps[run->n_steps++] = *s;
    return true;
}

/* One engine step with its bookkeeping. */
static loom_status drv_step(serve_drv *d) {
    serve_step_sample s;
    memset(&s, 0, sizeof s);
    s.prefill = d->n_awaiting > 0;
    double t_start = drv_now(d);
    const loom_event *const *evs = NULL;
    size_t n_evs = 0;
    loom_status st = loom_engine_step(d->e, &evs, &n_evs);
    double now = drv_now(d);
    if (st != LOOM_OK) {
        fprintf(stderr, "loom-serve-bench: step: %s: %s\n", loom_status_str(st), loom_last_error());
        return st;
    }
    d->n_touched = 0;
    for (size_t k = 0; k < n_evs; k++) drv_event(d, evs[k], now, &s.n_tokens);

    loom_engine_stats es = {.size = sizeof es};
    loom_engine_get_stats(d->e, &es);
    const int64_t B = d->run->block_size;
    for (size_t k = 0; k < d->n_touched; k++) {
        const serve_record *rec = d->touched[k];
        if (rec->done) continue;
        const serve_request *q = &d->w->reqs[rec - d->run->recs];
        int64_t p = (int64_t)q->n_prompt + rec->n_tokens - 1;
        s.ideal_blocks += (p + B - 1) / B;
        s.n_decoding++;
    }
    loom_kv_group_info gi = {.size = sizeof gi, .n_groups = 1};
    for (int32_t g = 0; g < gi.n_groups; g++) {
        if (loom_engine_get_kv_group(d->e, g, &gi) != LOOM_OK) break;
        if (g == 0) s.frag_slots = gi.slots_unused;
        s.frag_bytes += (double)gi.slots_unused * (double)gi.block_bytes / (double)B;
        s.pool_bytes += (double)gi.blocks_total * (double)gi.block_bytes;
    }
    s.t_s = now;
    s.dt_s = now - t_start;
    s.blocks_used = es.kv_blocks_used;
    s.blocks_total = es.kv_blocks_total;
    s.running = es.running;
    s.waiting = es.waiting;
    if (!push_step(d->run, &s)) return LOOM_ERR_OUT_OF_MEMORY;

    if (d->cfg->verbose && now >= d->next_report) {
        d->next_report = now + 5.0;
        fprintf(stderr,
                "  [%s] t %6.1f s  done %zu/%zu  in flight %d  running %d  waiting %d  "
                "blocks %d/%d  preemptions %lld\n",
                d->run->label, now, d->n_done, d->w->n, d->n_in_flight, es.running, es.waiting,
                es.kv_blocks_used, es.kv_blocks_total, (long long)es.preemptions);
    }
    return LOOM_OK;
}

/* ---- open loop ----------------------------------------------------------------------------- */

loom_status serve_run_open(loom_model *model, const loom_engine_params *ep, const serve_workload *w,
                           const serve_config *cfg, serve_run *run) {
    serve_drv d;
    loom_status st = drv_init(&d, model, ep, w, cfg, run);
    if (st != LOOM_OK) return drv_abort(&d, st);
    size_t next = 0;
    d.t0 = serve_now_s();
    while (st == LOOM_OK && d.n_done < w->n) {
        double now = drv_now(&d);
        while (next < w->n && w->reqs[next].arrival_s <= now) {
            drv_submit(&d, next, w->reqs[next].arrival_s);
            next++;
        }
        if (d.n_in_flight == 0) {
            if (next < w->n) sleep_until(d.t0 + w->reqs[next].arrival_s);
            continue;
        }
        st = drv_step(&d);
    }
    /* Wall time: first arrival to last finish. */
    double last = 0;
    for (size_t i = 0; i < w->n; i++) {
        if (run->recs[i].finish_s > last) last = run->recs[i].finish_s;
    }
    run->wall_s = last - (w->n ? w->reqs[0].arrival_s : 0);
    run->status = st;
    drv_free(&d);
    return st;
}

/* ---- closed loop --------------------------------------------------------------------------- */

loom_status serve_run_closed(loom_model *model, const loom_engine_params *ep,
                             const serve_workload *w, const serve_config *cfg, int32_t concurrency,
                             double duration_s, serve_run *run) {
    serve_drv d;
    loom_status st = drv_init(&d, model, ep, w, cfg, run);
    run->concurrency = concurrency;
    if (st != LOOM_OK) return drv_abort(&d, st);
    size_t next = 0;
    d.t0 = serve_now_s();
    double now = 0;
    while (st == LOOM_OK) {
        while (d.n_in_flight < concurrency && next < w->n) {
            drv_submit(&d, next, drv_now(&d));
            next++;
        }
        if (d.n_in_flight == 0) break; /* the workload ran out */
        st = drv_step(&d);
        now = drv_now(&d);
        if (now >= duration_s) break;
    }
    run->wall_s = now;
    /* The window ends here; cancel what is in flight and step until the engine has freed it
     * (those steps are not part of the measurement). */
    size_t n_steps_window = run->n_steps;
    for (size_t i = 0; st == LOOM_OK && i < next; i++) {
        serve_record *rec = &run->recs[i];
        if (rec->done) continue;
        loom_status cs = loom_engine_cancel(d.e, rec->id);
        if (cs != LOOM_OK) {
            fprintf(stderr, "loom-serve-bench: cancel of request %zu: %s: %s\n", i,
                    loom_status_str(cs), loom_last_error());
            run->n_cancel_bad++;
        }
        run->n_cancelled++;
    }
    for (int k = 0; st == LOOM_OK && d.n_in_flight > 0 && k < 1000; k++) st = drv_step(&d);
    for (size_t i = 0; i < next; i++) {
        const serve_record *rec = &run->recs[i];
        if (rec->done && rec->finish_s > now && rec->reason != LOOM_FINISH_CANCELLED &&
            !rec->failed)
            run->n_cancel_bad++;
    }
    if (d.n_in_flight > 0) run->n_cancel_bad += d.n_in_flight;
    run->n_steps = n_steps_window;
    run->status = st;
    drv_free(&d);
    return st;
}

void serve_run_free(serve_run *run) {
    free(run->recs);
    free(run->steps);
    run->recs = NULL;
    run->steps = NULL;
}
