/* policy_calib.c — loom-policy-bench on the real engine: the calibration burst (capacity, and
 * the step-cost model fitted to the burst's trace) and the confirmation runs, priority and FCFS
 * interleaved A B A B on one arrival trace so that a drift of the machine's speed falls on both
 * alike. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "policy.h"

loom_engine_params policy_engine_params(const policy_opts *o, const loom_model_info *mi) {
    loom_engine_params ep = serve_engine_params(&o->cfg, mi);
    ep.starvation_s = o->starvation_s;
    return ep;
}

/* ---- the trace's step records -------------------------------------------------------------- */

/* The integer after "key": on line (which ends at end), or false. */
static bool field(const char *line, const char *end, const char *key, long long *v) {
    char pat[32];
    snprintf(pat, sizeof pat, "\"%s\":", key);
    size_t n = strlen(pat);
    for (const char *p = line; p + n < end; p++) {
        if (memcmp(p, pat, n) != 0) continue;
        char *stop;
        *v = strtoll(p + n, &stop, 10);
        return stop != p + n;
    }
    return false;
}

typedef struct step_obs {
    long long dur_ns, n_tokens, ctx;
    bool seen;
} step_obs;

/* Fits the cost model to every step record of the trace (equal weights): the step's batch
 * tokens and duration, and as its context the positions of the tokens it sampled (the trace
 * has no record of the chunks that did not sample: prefill chunks' context is undercounted). */
static bool fit_trace(loom_trace *t, policy_calib *out) {
    size_t len = 0;
    if (loom_trace_write_buffer(t, LOOM_TRACE_JSONL, NULL, 0, &len) != LOOM_ERR_BUFFER_TOO_SMALL &&
        len == 0)
        return false;
    char *buf = malloc(len + 1);
    if (!buf || loom_trace_write_buffer(t, LOOM_TRACE_JSONL, buf, len, &len) != LOOM_OK) {
        free(buf);
        return false;
    }
    size_t cap = 1024, n_steps = 0;
    step_obs *obs = calloc(cap, sizeof *obs);
    for (const char *line = buf; obs && line < buf + len;) {
        const char *end = memchr(line, '\n', (size_t)(buf + len - line));
        if (!end) end = buf + len;
        long long step, v;
        if (field(line, end, "step", &step) && step >= 0) {
            while ((size_t)step >= cap) {
                step_obs *g = realloc(obs, 2 * cap * sizeof *obs);
                if (!g) break;
                memset(g + cap, 0, cap * sizeof *g);
                obs = g;
                cap *= 2;
            }
            if ((size_t)step < cap) {
                step_obs *s = &obs[step];
                if (strncmp(line, "{\"type\":\"step\"", 14) == 0) {
                    if (field(line, end, "dur_ns", &v)) s->dur_ns = v;
                    if (field(line, end, "n_tokens", &v)) s->n_tokens = v;
                    s->seen = true;
                    if ((size_t)step + 1 > n_steps) n_steps = (size_t)step + 1;
                } else if (strncmp(line, "{\"type\":\"token\"", 15) == 0 &&
                           field(line, end, "pos", &v)) {
                    s->ctx += v + 1;
                }
            }
        }
        line = end + 1;
    }
    free(buf);
    if (!obs) return false;
    loom__cost_model_init(&out->cost, 1e12);
    double sum = 0;
    int64_t n = 0;
    for (size_t i = 0; i < n_steps; i++) {
        if (!obs[i].seen || obs[i].n_tokens <= 0) continue;
        loom__cost_model_update(&out->cost, (double)obs[i].n_tokens, (double)obs[i].ctx,
                                (double)obs[i].dur_ns * 1e-3);
        sum += (double)obs[i].dur_ns * 1e-3;
        n++;
    }
    double se = 0;
    for (size_t i = 0; i < n_steps; i++) {
        if (!obs[i].seen || obs[i].n_tokens <= 0) continue;
        double d =
            (double)obs[i].dur_ns * 1e-3 -
            loom__cost_model_predict(&out->cost, (double)obs[i].n_tokens, (double)obs[i].ctx);
        se += d * d;
    }
    free(obs);
    out->n_steps = n;
    out->mean_step_us = n ? sum / (double)n : 0;
    out->fit_rmse_us = n ? sqrt(se / (double)n) : 0;
    return n > 0;
}

int policy_calibrate(loom_model *model, const loom_model_info *mi, const policy_opts *o,
                     policy_calib *out) {
    memset(out, 0, sizeof *out);
    loom_engine_params ep = policy_engine_params(o, mi);
    serve_workload w;
    if (!serve_workload_make(&o->cfg, mi, ep.max_ctx, 0, o->calib_requests, 0, &w)) {
        fprintf(stderr, "loom-policy-bench: out of memory\n");
        return 1;
    }
    loom_trace *t = NULL;
    if (loom_trace_create(&t) != LOOM_OK) {
        serve_workload_free(&w);
        fprintf(stderr, "loom-policy-bench: trace: %s\n", loom_last_error());
        return 1;
    }
    ep.trace = t;
    serve_run run;
    memset(&run, 0, sizeof run);
    run.label = "calibration burst";
    loom_status st = serve_run_open(model, &ep, &w, &o->cfg, &run);
    int rc = 0;
    if (st != LOOM_OK) {
        fprintf(stderr, "loom-policy-bench: calibration: %s: %s\n", loom_status_str(st),
                loom_last_error());
        rc = 1;
    } else if (!fit_trace(t, out)) {
        fprintf(stderr, "loom-policy-bench: calibration: no step records to fit\n");
        rc = 1;
    } else {
        out->capacity_real = run.wall_s > 0 ? (double)w.n / run.wall_s : 0;
        out->n_blocks = run.stats.kv_blocks_total;
    }
    serve_run_free(&run);
    loom_trace_free(t);
    serve_workload_free(&w);
    return rc;
}

/* ---- confirmation -------------------------------------------------------------------------- */

/* High-class requests of a real run that met their deadline, and how many there were. */
static void real_attainment(const serve_run *run, double deadline_s, int64_t *met, int64_t *n) {
    *met = *n = 0;
    for (size_t i = 0; i < run->n; i++) {
        if (run->w->reqs[i].cls != SERVE_CLASS_HIGH) continue;
        (*n)++;
        const serve_record *r = &run->recs[i];
        if (!r->failed && r->first_s >= 0 && r->first_s - r->arrival_s <= deadline_s) (*met)++;
    }
}

int policy_confirm(loom_model *model, const loom_model_info *mi, const policy_opts *o,
                   const policy_calib *c) {
    if (c->capacity_real <= 0) {
        fprintf(stderr, "loom-policy-bench: --confirm needs the calibration burst (not --cost)\n");
        return 1;
    }
    loom_engine_params ep = policy_engine_params(o, mi);
    serve_config cfg = o->cfg;
    cfg.seed = o->confirm_seed;
    double rate = o->confirm_load * c->capacity_real;
    serve_workload w;
    if (!serve_workload_make(&cfg, mi, ep.max_ctx, rate, o->confirm_requests, 0, &w)) return 1;
    int32_t n_runs = 2 * o->confirm_rounds;
    serve_run *runs = calloc((size_t)n_runs, sizeof *runs);
    char(*labels)[40] = calloc((size_t)n_runs, sizeof *labels);
    loom__sim_request *sr = malloc(w.n * sizeof *sr);
    loom__sim_outcome *so = malloc(w.n * sizeof *so);
    if (!runs || !labels || !sr || !so) return 1;
    printf("\n## Confirmation on the engine: seed %llu, %d requests at %.3f req/s (%.0f%% of the "
           "burst's %.3f req/s), priority and FCFS interleaved\n\n",
           (unsigned long long)cfg.seed, o->confirm_requests, rate, 100 * o->confirm_load,
           c->capacity_real);
    int rc = 0;
    for (int32_t k = 0; k < n_runs && rc == 0; k++) {
        bool fcfs = k % 2 == 1;
        loom_engine_params p = ep;
        p.fcfs = fcfs;
        snprintf(labels[k], sizeof labels[k], "%s #%d", fcfs ? "fcfs" : "priority", k / 2 + 1);
        runs[k].label = labels[k];
        runs[k].rate = rate;
        runs[k].fcfs = fcfs;
        fprintf(stderr, "loom-policy-bench: confirmation run %d/%d (%s)\n", k + 1, n_runs,
                labels[k]);
        if (serve_run_open(model, &p, &w, &cfg, &runs[k]) != LOOM_OK) rc = 1;
    }
    if (rc == 0) {
        serve_report_open(&cfg, runs, (size_t)n_runs);
        printf("\n| run | high-class TTFT met (engine) | one-sided 95%% bound | simulator, same "
               "trace | mean step |\n|---|---|---|---|---|\n");
        policy_sim_requests(o, &ep, &w, sr);
        for (int32_t k = 0; k < n_runs; k++) {
            int64_t met, n;
            real_attainment(&runs[k], cfg.ttft_deadline_s, &met, &n);
            loom__sim_config sc = policy_sim_config(&ep, c, k % 2 ? POLICY_FCFS : POLICY_PRIORITY);
            int64_t smet = 0, sn = 0;
            if (loom__sim_run(&sc, sr, (int32_t)w.n, so, NULL) == LOOM_OK) {
                for (size_t i = 0; i < w.n; i++) {
                    if (sr[i].ttft_us == 0) continue;
                    sn++;
                    smet += so[i].first_token_us >= 0 &&
                            so[i].first_token_us - sr[i].arrival_us <= sr[i].ttft_us;
                }
            }
            double mean_step =
                runs[k].stats.steps > 0 ? runs[k].stats.busy_s / (double)runs[k].stats.steps : 0;
            printf("| %s | %lld/%lld (%.1f%%) | >= %.1f%% | %lld/%lld (%.1f%%) | %.1f ms |\n",
                   labels[k], (long long)met, (long long)n, n ? 100.0 * (double)met / (double)n : 0,
                   100 * policy_lower_bound(met, n), (long long)smet, (long long)sn,
                   sn ? 100.0 * (double)smet / (double)sn : 0, 1e3 * mean_step);
        }
    }
    for (int32_t k = 0; k < n_runs; k++) serve_run_free(&runs[k]);
    free(runs);
    free(labels);
    free(sr);
    free(so);
    serve_workload_free(&w);
    return rc;
}
