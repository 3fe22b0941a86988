/* /metrics: Prometheus text format 0.0.4. Names follow vLLM's where the meaning is the same
 * (vllm:X -> loom:X), so its dashboards carry over; every series has the model_name label.
 * Gauges and the prefix-cache and preemption counters come from loom_engine_get_stats at
 * scrape time; token counts, outcomes and latency histograms are kept here as events arrive. */
#define _GNU_SOURCE

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server.h"

/* vLLM's bucket bounds (seconds), so histograms compare bucket for bucket */
static const double ttft_bounds[] = {0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1,
                                     0.25,  0.5,   0.75, 1.0,  2.5,  5.0,  7.5,  10.0,
                                     20.0,  40.0,  80.0, 160., 640., 2560.};
static const double itl_bounds[] = {0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2,  0.3,  0.4, 0.5,
                                    0.75, 1.0,   2.5,  5.0,   7.5, 10.0, 20.0, 40.0, 80.0};
static const double e2e_bounds[] = {0.3,  0.5,   0.8,  1.0,  1.5,  2.0,   2.5,
                                    5.0,  10.0,  15.0, 20.0, 30.0, 40.0,  50.0,
                                    60.0, 120.0, 240., 480., 960., 1920., 7680.};

#define COUNT(a) ((int)(sizeof(a) / sizeof((a)[0])))

void srv_metrics_init(srv_metrics *m) {
    memset(m, 0, sizeof *m);
    pthread_mutex_init(&m->mu, NULL);
    m->ttft.bounds = ttft_bounds;
    m->ttft.n_bounds = COUNT(ttft_bounds);
    m->itl.bounds = itl_bounds;
    m->itl.n_bounds = COUNT(itl_bounds);
    m->e2e.bounds = e2e_bounds;
    m->e2e.n_bounds = COUNT(e2e_bounds);
}

void srv_metrics_destroy(srv_metrics *m) {
    pthread_mutex_destroy(&m->mu);
}

void srv_histogram_observe(srv_histogram *h, double v) {
    if (!(v >= 0)) v = 0;
    int i = 0;
    while (i < h->n_bounds && v > h->bounds[i]) i++;
    h->counts[i]++;
    h->count++;
    h->sum += v;
}

/* ---- exposition ------------------------------------------------------------------------------ */

static void label_value(srv_buf *b, const char *s) {
    for (; *s; s++) {
        if (*s == '\\')
            srv_buf_puts(b, "\\\\");
        else if (*s == '"')
            srv_buf_puts(b, "\\\"");
        else if (*s == '\n')
            srv_buf_puts(b, "\\n");
        else
            srv_buf_put(b, s, 1);
    }
}

static void head(srv_buf *b, const char *name, const char *type, const char *help) {
    srv_buf_printf(b, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

static void sample(srv_buf *b, const char *name, const char *model, const char *extra, double v) {
    srv_buf_printf(b, "%s{model_name=\"", name);
    label_value(b, model);
    srv_buf_printf(b, "\"%s%s} %.17g\n", extra && *extra ? "," : "", extra ? extra : "", v);
}

static void gauge(srv_buf *b, const char *name, const char *help, const char *model, double v) {
    head(b, name, "gauge", help);
    sample(b, name, model, NULL, v);
}

static void counter(srv_buf *b, const char *name, const char *help, const char *model, double v) {
    head(b, name, "counter", help);
    sample(b, name, model, NULL, v);
}

static void histogram(srv_buf *b, const char *name, const char *help, const char *model,
                      const srv_histogram *h) {
    char series[160], le[64];
    head(b, name, "histogram", help);
    snprintf(series, sizeof series, "%s_bucket", name);
    uint64_t cum = 0;
    for (int i = 0; i <= h->n_bounds; i++) {
        cum += h->counts[i];
        if (i < h->n_bounds)
            snprintf(le, sizeof le, "le=\"%g\"", h->bounds[i]);
        else
            snprintf(le, sizeof le, "le=\"+Inf\"");
        sample(b, series, model, le, (double)cum);
    }
    snprintf(series, sizeof series, "%s_sum", name);
    sample(b, series, model, NULL, h->sum);
    snprintf(series, sizeof series, "%s_count", name);
    sample(b, series, model, NULL, (double)h->count);
}

char *srv_metrics_text(srv *s, size_t *len) {
    loom_engine_stats st = {.size = sizeof st};
    if (loom_engine_get_stats(s->engine, &st) != LOOM_OK) memset(&st, 0, sizeof st);
    srv_metrics m;
    pthread_mutex_lock(&s->metrics.mu);
    m = s->metrics;
    pthread_mutex_unlock(&s->metrics.mu);
    const char *model = s->cfg.model_name;
    srv_buf b = {0};
    gauge(&b, "loom:num_requests_running", "Requests with KV cache in use (in the batch).", model,
          st.running);
    gauge(&b, "loom:num_requests_waiting", "Requests queued or preempted, waiting to run.", model,
          st.waiting);
    gauge(&b, "loom:kv_cache_usage_perc",
          "Fraction of the full-attention KV blocks held by requests (1 = full).", model,
          st.kv_blocks_total ? (double)st.kv_blocks_used / st.kv_blocks_total : 0.0);
    gauge(&b, "loom:kv_cache_blocks_total", "KV blocks in the full-attention pool.", model,
          st.kv_blocks_total);
    gauge(&b, "loom:kv_cache_blocks_used", "KV blocks held by requests.", model, st.kv_blocks_used);
    counter(&b, "loom:prefix_cache_queries_total", "Prompt tokens looked up in the prefix cache.",
            model, (double)st.prefix_query_tokens);
    counter(&b, "loom:prefix_cache_hits_total", "Prompt tokens found in the prefix cache.", model,
            (double)st.prefix_hit_tokens);
    counter(&b, "loom:num_preemptions_total", "Requests preempted to free KV blocks.", model,
            (double)st.preemptions);
    counter(&b, "loom:engine_steps_total", "Engine steps run.", model, (double)st.steps);
    counter(&b, "loom:prompt_tokens_total", "Prompt tokens of the requests submitted.", model,
            (double)m.prompt_tokens);
    counter(&b, "loom:generation_tokens_total", "Tokens generated.", model,
            (double)m.generation_tokens);
    head(&b, "loom:request_success_total", "counter",
         "Finished samples by finish reason (abort: cancelled; error: failed by the engine).");
    static const char *const reasons[SRV_OUTCOME_COUNT] = {"stop", "length", "abort", "error"};
    for (int i = 0; i < SRV_OUTCOME_COUNT; i++) {
        char lab[64];
        snprintf(lab, sizeof lab, "finished_reason=\"%s\"", reasons[i]);
        sample(&b, "loom:request_success_total", model, lab, (double)m.outcomes[i]);
    }
    counter(&b, "loom:num_requests_cancelled_total",
            "Requests cancelled because their client disconnected.", model, (double)m.disconnects);
    counter(&b, "loom:num_requests_timed_out_total",
            "Requests cancelled because they ran past --timeout-s.", model, (double)m.timeouts);
    head(&b, "loom:num_requests_rejected_total", "counter",
         "Requests answered 429: the queue was full, or the engine predicted a missed deadline.");
    sample(&b, "loom:num_requests_rejected_total", model, "reason=\"queue_full\"",
           (double)m.rejected_queue_full);
    sample(&b, "loom:num_requests_rejected_total", model, "reason=\"overloaded\"",
           (double)m.rejected_overloaded);
    head(&b, "loom:http_errors_total", "counter", "HTTP error responses by class.");
    sample(&b, "loom:http_errors_total", model, "class=\"4xx\"", (double)m.http_4xx);
    sample(&b, "loom:http_errors_total", model, "class=\"5xx\"", (double)m.http_5xx);
    histogram(&b, "loom:time_to_first_token_seconds",
              "Time from a request's arrival to its first token.", model, &m.ttft);
    histogram(&b, "loom:inter_token_latency_seconds",
              "Time between consecutive tokens of one sample.", model, &m.itl);
    histogram(&b, "loom:e2e_request_latency_seconds",
              "Time from a request's arrival to the end of each of its samples.", model, &m.e2e);
    if (b.failed) {
        srv_buf_free(&b);
        return NULL;
    }
    *len = b.len;
    return b.data;
}
