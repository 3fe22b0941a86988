/* policy_sweep.c — loom-policy-bench's simulation: every policy on the same arrival traces
 * (loads x seeds) against one step-cost model, so a comparison is one of policies, not of
 * moments of a shared machine; per class: TTFT attainment with an exact one-sided 95% bound,
 * TTFT percentiles, goodput, preemptions, and for admission control whether the requests it
 * refused are the ones that would have missed. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "policy.h"

const char *const policy_names[POLICY_COUNT] = {"fcfs", "priority", "priority+reject_late",
                                                "priority+degrade"};

/* ---- statistics ---------------------------------------------------------------------------- */

/* P(X >= k) for X ~ Binomial(n, p). */
static double tail_ge(int64_t k, int64_t n, double p) {
    if (k <= 0) return 1;
    if (p <= 0) return 0;
    if (p >= 1) return 1;
    double below = 0, lp = log(p), lq = log1p(-p);
    for (int64_t i = 0; i < k; i++)
        below += exp(lgamma((double)n + 1) - lgamma((double)i + 1) - lgamma((double)(n - i) + 1) +
                     (double)i * lp + (double)(n - i) * lq);
    return 1 - below;
}

double policy_lower_bound(int64_t k, int64_t n) {
    if (n <= 0 || k <= 0) return 0;
    /* The p at which k or more successes become 5% likely: P(X >= k) grows with p. */
    double lo = 0, hi = (double)k / (double)n;
    for (int it = 0; it < 60; it++) {
        double mid = 0.5 * (lo + hi);
        if (tail_ge(k, n, mid) < 0.05)
            lo = mid;
        else
            hi = mid;
    }
    return lo;
}

/* ---- the simulator's inputs ---------------------------------------------------------------- */

loom__sim_config policy_sim_config(const loom_engine_params *ep, const policy_calib *c,
                                   int policy) {
    loom__sim_config sc;
    memset(&sc, 0, sizeof sc);
    /* The scheduler as the engine configures it (engine_create.c). */
    sc.sched = loom__sched_default_config();
    sc.sched.policy = policy == POLICY_FCFS ? LOOM_SCHED_POLICY_FCFS : LOOM_SCHED_POLICY_PRIORITY;
    sc.sched.max_batched_tokens = ep->max_batched_tokens;
    sc.sched.max_seqs = ep->max_seqs;
    sc.sched.watermark_blocks = (int32_t)(ep->watermark * (float)c->n_blocks + 0.999f);
    sc.sched.preempt_mode =
        ep->preempt == LOOM_PREEMPT_SWAP ? LOOM_SCHED_PREEMPT_SWAP : LOOM_SCHED_PREEMPT_RECOMPUTE;
    sc.sched.promote_age_us =
        ep->starvation_s > 0 && isfinite(ep->starvation_s) ? (int64_t)(ep->starvation_s * 1e6) : 0;
    sc.sched.protect_us = LOOM_SCHED_ENGINE_PROTECT_US;
    sc.n_blocks = c->n_blocks;
    sc.block_size = ep->block_size;
    sc.cost = c->cost;
    sc.admission = policy == POLICY_REJECT_LATE ? LOOM_ADMIT_REJECT_LATE
                   : policy == POLICY_DEGRADE   ? LOOM_ADMIT_DEGRADE
                                                : LOOM_ADMIT_ALL;
    return sc;
}

void policy_sim_requests(const policy_opts *o, const loom_engine_params *ep,
                         const serve_workload *w, loom__sim_request *out) {
    /* What the prefix cache holds of a shared prompt: its full blocks. */
    int32_t cached = ep->prefix_cache ? w->n_prefix / ep->block_size * ep->block_size : 0;
    for (size_t i = 0; i < w->n; i++) {
        const serve_request *q = &w->reqs[i];
        bool high = q->cls == SERVE_CLASS_HIGH;
        int32_t n_cached = q->shared ? cached : 0;
        if (n_cached >= q->n_prompt) n_cached = q->n_prompt - 1;
        out[i] = (loom__sim_request){
            .priority = high ? 1 : 0,
            .n_prompt = q->n_prompt,
            .n_output = q->max_tokens,
            .arrival_us = (int64_t)llround(q->arrival_s * 1e6),
            .ttft_us = high ? (int64_t)llround(o->cfg.ttft_deadline_s * 1e6) : 0,
            .n_cached = n_cached,
        };
    }
}

double policy_sim_capacity(const policy_opts *o, const loom_model_info *mi,
                           const loom_engine_params *ep, const policy_calib *c) {
    serve_workload w;
    if (!serve_workload_make(&o->cfg, mi, ep->max_ctx, 0, o->calib_requests, 0, &w)) return 0;
    loom__sim_request *r = malloc(w.n * sizeof *r);
    loom__sim_outcome *out = malloc(w.n * sizeof *out);
    double cap = 0;
    loom__sim_stats st;
    loom__sim_config sc = policy_sim_config(ep, c, POLICY_PRIORITY);
    if (r && out) {
        policy_sim_requests(o, ep, &w, r);
        if (loom__sim_run(&sc, r, (int32_t)w.n, out, &st) == LOOM_OK && st.end_us > 0)
            cap = (double)w.n / ((double)st.end_us * 1e-6);
    }
    free(r);
    free(out);
    serve_workload_free(&w);
    return cap;
}

/* ---- the sweep ----------------------------------------------------------------------------- */

typedef struct agg {
    int64_t hi_n, hi_met, hi_rejected, hi_degraded, hi_admitted_missed;
    int64_t be_n;
    double *ttft_hi, *ttft_be; /* [all requests of all seeds] */
    size_t n_ttft_hi, n_ttft_be;
    double good_tokens, span_s, end_s;
    int64_t preemptions, promotions;
    /* admission control against the priority policy on the same trace */
    int64_t rej_would_miss, rej_total, miss_under_all;
    double pred_abs_err_s; /* |predicted - simulated| TTFT over admitted high requests */
    int64_t n_pred;
    int64_t hi_infeasible; /* high requests that miss their deadline even alone */
} agg;

static void add_run(agg *a, const loom__sim_request *r, const loom__sim_outcome *out, size_t n,
                    const loom__sim_stats *st, const loom__sim_outcome *under_all) {
    double t0 = n ? (double)r[0].arrival_us : 0;
    for (size_t i = 0; i < n; i++) {
        const loom__sim_outcome *o = &out[i];
        double ttft = o->first_token_us >= 0 ? (double)(o->first_token_us - r[i].arrival_us) : -1;
        if (r[i].arrival_us < t0) t0 = (double)r[i].arrival_us;
        if (r[i].ttft_us > 0) {
            a->hi_n++;
            bool met = ttft >= 0 && ttft <= (double)r[i].ttft_us;
            a->hi_met += met;
            a->hi_rejected += o->rejected;
            a->hi_degraded += o->degraded;
            if (!o->rejected && !met) a->hi_admitted_missed++;
            if (ttft >= 0) a->ttft_hi[a->n_ttft_hi++] = ttft * 1e-6;
            if (met) a->good_tokens += r[i].n_output;
            if (under_all) {
                const loom__sim_outcome *u = &under_all[i];
                bool miss_all = !(u->first_token_us >= 0 &&
                                  u->first_token_us - r[i].arrival_us <= r[i].ttft_us);
                a->miss_under_all += miss_all;
                if (o->rejected) {
                    a->rej_total++;
                    a->rej_would_miss += miss_all;
                }
            }
            if (!o->rejected && o->predicted_ttft_us >= 0 && ttft >= 0) {
                a->pred_abs_err_s += fabs((double)o->predicted_ttft_us - ttft) * 1e-6;
                a->n_pred++;
            }
        } else {
            a->be_n++;
            if (ttft >= 0) a->ttft_be[a->n_ttft_be++] = ttft * 1e-6;
            if (o->finish_us >= 0) a->good_tokens += r[i].n_output;
        }
    }
    a->span_s += ((double)st->end_us - t0) * 1e-6;
    a->preemptions += st->preemptions;
    a->promotions += st->promotions;
}

static void print_table(double load, double hi_share, agg *a) {
    printf("\n### %.0f%% of capacity (the high class alone: %.0f%%)\n\n", 100 * load,
           100 * load * hi_share);
    printf("high-class requests that miss their deadline even alone on an idle engine: %lld of "
           "%lld\n\n",
           (long long)a[0].hi_infeasible, (long long)a[0].hi_n);
    printf("| policy | high TTFT met | one-sided 95%% bound | admitted high missed | rejected "
           "| degraded | high TTFT p50 / p99 | best-effort TTFT p50 / p99 | goodput tok/s | "
           "preemptions | promotions | rejected that would miss | mean abs TTFT prediction "
           "error |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
    for (int p = 0; p < POLICY_COUNT; p++) {
        agg *x = &a[p];
        double hp50 = serve_percentile(x->ttft_hi, x->n_ttft_hi, 0.5),
               hp99 = serve_percentile(x->ttft_hi, x->n_ttft_hi, 0.99);
        double bp50 = serve_percentile(x->ttft_be, x->n_ttft_be, 0.5),
               bp99 = serve_percentile(x->ttft_be, x->n_ttft_be, 0.99);
        char rej[48] = "—", err[32] = "—";
        if (p == POLICY_REJECT_LATE)
            snprintf(rej, sizeof rej, "%lld/%lld (of %lld missing under admit_all)",
                     (long long)x->rej_would_miss, (long long)x->rej_total,
                     (long long)x->miss_under_all);
        if (x->n_pred) snprintf(err, sizeof err, "%.2f s", x->pred_abs_err_s / (double)x->n_pred);
        printf("| %s | %lld/%lld (%.1f%%) | >= %.1f%% | %lld | %lld | %lld | %.2f / %.2f s | "
               "%.2f / %.2f s | %.1f | %lld | %lld | %s | %s |\n",
               policy_names[p], (long long)x->hi_met, (long long)x->hi_n,
               x->hi_n ? 100.0 * (double)x->hi_met / (double)x->hi_n : 0,
               100 * policy_lower_bound(x->hi_met, x->hi_n), (long long)x->hi_admitted_missed,
               (long long)x->hi_rejected, (long long)x->hi_degraded, hp50, hp99, bp50, bp99,
               x->span_s > 0 ? x->good_tokens / x->span_s : 0, (long long)x->preemptions,
               (long long)x->promotions, rej, err);
    }
}

/* High-class requests that miss their deadline even alone on an idle engine (a long prompt
 * the machine cannot compute in time): no policy can save them. */
static int64_t count_infeasible(const loom_engine_params *ep, const policy_calib *c,
                                const loom__sim_request *r, size_t n) {
    loom__sim_config sc = policy_sim_config(ep, c, POLICY_PRIORITY);
    int64_t k = 0;
    for (size_t i = 0; i < n; i++) {
        if (r[i].ttft_us == 0) continue;
        loom__sim_request one = r[i];
        one.arrival_us = 0;
        loom__sim_outcome out;
        if (loom__sim_run(&sc, &one, 1, &out, NULL) == LOOM_OK && out.first_token_us > one.ttft_us)
            k++;
    }
    return k;
}

/* The high class's share of the work (computed prompt tokens plus output tokens). */
static double high_share(const loom__sim_request *r, size_t n) {
    double hi = 0, all = 0;
    for (size_t i = 0; i < n; i++) {
        double work = r[i].n_prompt - r[i].n_cached + r[i].n_output;
        all += work;
        if (r[i].ttft_us > 0) hi += work;
    }
    return all > 0 ? hi / all : 0;
}

int policy_sweep(const policy_opts *o, const loom_model_info *mi, const loom_engine_params *ep,
                 const policy_calib *c, double capacity) {
    size_t max_n = (size_t)o->cfg.n_requests;
    loom__sim_request *r = malloc(max_n * sizeof *r);
    loom__sim_outcome *out[POLICY_COUNT];
    agg a[POLICY_COUNT];
    bool ok = r != NULL;
    for (int p = 0; p < POLICY_COUNT; p++) {
        out[p] = malloc(max_n * sizeof *out[p]);
        memset(&a[p], 0, sizeof a[p]);
        a[p].ttft_hi = malloc(max_n * (size_t)o->n_seeds * sizeof(double));
        a[p].ttft_be = malloc(max_n * (size_t)o->n_seeds * sizeof(double));
        ok = ok && out[p] && a[p].ttft_hi && a[p].ttft_be;
    }
    int rc = ok ? 0 : 1;
    for (int32_t l = 0; l < o->n_loads && rc == 0; l++) {
        double rate = o->loads[l] * capacity, share = 0;
        for (int p = 0; p < POLICY_COUNT; p++) {
            a[p].n_ttft_hi = a[p].n_ttft_be = 0;
            double *h = a[p].ttft_hi, *b = a[p].ttft_be;
            memset(&a[p], 0, sizeof a[p]);
            a[p].ttft_hi = h;
            a[p].ttft_be = b;
        }
        for (int32_t s = 0; s < o->n_seeds && rc == 0; s++) {
            serve_config cfg = o->cfg;
            cfg.seed = o->cfg.seed + (uint64_t)s;
            serve_workload w;
            if (!serve_workload_make(&cfg, mi, ep->max_ctx, rate, o->cfg.n_requests, 0, &w)) {
                rc = 1;
                break;
            }
            policy_sim_requests(o, ep, &w, r);
            share += high_share(r, w.n) / o->n_seeds;
            int64_t infeasible = count_infeasible(ep, c, r, w.n);
            for (int p = 0; p < POLICY_COUNT; p++) a[p].hi_infeasible += infeasible;
            for (int p = 0; p < POLICY_COUNT && rc == 0; p++) {
                loom__sim_config sc = policy_sim_config(ep, c, p);
                loom__sim_stats st;
                loom_status ss = loom__sim_run(&sc, r, (int32_t)w.n, out[p], &st);
                if (ss != LOOM_OK) {
                    fprintf(stderr,
                            "loom-policy-bench: simulation (%s, load %.2f, seed %llu): %s\n",
                            policy_names[p], o->loads[l], (unsigned long long)cfg.seed,
                            loom_last_error());
                    rc = 1;
                    break;
                }
                if (o->list_misses && p == POLICY_PRIORITY)
                    for (size_t i = 0; i < w.n; i++)
                        if (r[i].ttft_us > 0 &&
                            (out[p][i].first_token_us < 0 ||
                             out[p][i].first_token_us - r[i].arrival_us > r[i].ttft_us))
                            fprintf(
                                stderr,
                                "missed (priority): load %.2f seed %llu req %zu arr %.2f ttft %.2f "
                                "prompt %d cached %d preempted %d predicted %.2f\n",
                                o->loads[l], (unsigned long long)cfg.seed, i,
                                r[i].arrival_us * 1e-6,
                                (out[p][i].first_token_us - r[i].arrival_us) * 1e-6, r[i].n_prompt,
                                r[i].n_cached, out[p][i].n_preempted,
                                out[p][i].predicted_ttft_us * 1e-6);
                add_run(&a[p], r, out[p], w.n, &st,
                        p == POLICY_REJECT_LATE ? out[POLICY_PRIORITY] : NULL);
            }
            serve_workload_free(&w);
        }
        if (rc == 0) print_table(o->loads[l], share, a);
    }
    free(r);
    for (int p = 0; p < POLICY_COUNT; p++) {
        free(out[p]);
        free(a[p].ttft_hi);
        free(a[p].ttft_be);
    }
    if (!ok) fprintf(stderr, "loom-policy-bench: out of memory\n");
    return rc;
}
