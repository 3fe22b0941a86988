/* serve.h — shared declarations of loom-serve-bench, a seeded load generator that replays a
 * synthetic serving workload against a loom engine in one process:
 *   serve.c          options, modes (one run, --saturation, --concurrency), main;
 *   serve_workload.c the seeded workload: arrivals, lengths, shared prefix, classes, prompts;
 *   serve_driver.c   the step loop: open-loop (arrival times) and closed-loop (N in flight)
 *                    drivers recording per-request times and per-step KV occupancy;
 *   serve_report.c   metrics (percentiles, attainment, utilisation) and the tables. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "loom.h"

/* ---- length distributions ------------------------------------------------------------------ */

typedef enum serve_dist_kind {
    SERVE_DIST_FIXED = 0,     /* always lo */
    SERVE_DIST_UNIFORM = 1,   /* integer uniform in [lo, hi] */
    SERVE_DIST_LOGNORMAL = 2, /* exp(N(ln median, sigma)), rounded, clamped to [lo, hi] */
} serve_dist_kind;

typedef struct serve_dist {
    serve_dist_kind kind;
    double median, sigma; /* LOGNORMAL */
    int32_t lo, hi;       /* bounds of every kind (FIXED: lo == hi) */
} serve_dist;

/* Parses "N", "fixed:N", "uniform:LO:HI" or "lognormal:MEDIAN:SIGMA[:LO:HI]" (default bounds
 * 1 .. 8 * MEDIAN). Returns false on a malformed spec. */
bool serve_dist_parse(const char *spec, serve_dist *out);
/* Writes the spec back in canonical form ("lognormal:64:0.5:8:256"). */
void serve_dist_format(const serve_dist *d, char *buf, size_t cap);

/* ---- configuration ------------------------------------------------------------------------- */

typedef struct serve_config {
    const char *model_path;
    int n_threads;
    uint64_t seed;
    /* Workload. */
    double rate;        /* requests/s of the Poisson arrivals (single open-loop run) */
    double duration_s;  /* arrivals until this time (when n_requests is 0) */
    int32_t n_requests; /* exactly this many arrivals (0: use duration_s) */
    serve_dist prompt_len;
    serve_dist output_len;
    double shared_prefix_frac; /* fraction of requests that start with the shared prefix */
    int32_t prefix_len;        /* tokens of the shared "system prompt" */
    double high_frac;          /* fraction of requests in the high class */
    double ttft_deadline_s;    /* the high class's TTFT deadline */
    /* Engine. */
    int64_t kv_bytes;
    int32_t max_seqs, max_batched_tokens, block_size, max_ctx;
    bool no_prefix_cache;
    /* Modes. */
    bool saturation;
    int32_t burst;          /* --saturation: requests of the burst at t = 0 */
    int32_t concurrency[8]; /* --concurrency N[,M...]: closed-loop levels */
    int32_t n_concurrency;
    bool verbose;
} serve_config;

/* ---- workload ------------------------------------------------------------------------------ */

typedef enum serve_class {
    SERVE_CLASS_BEST_EFFORT = 0, /* priority 0, no deadline */
    SERVE_CLASS_HIGH = 1,        /* priority 1, TTFT deadline */
} serve_class;

typedef struct serve_request {
    double arrival_s;   /* since the start of the run */
    int32_t n_prompt;   /* total prompt tokens: BOS? + shared prefix? + own tokens */
    int32_t n_own;      /* tokens after the shared prefix (or after BOS) */
    int32_t max_tokens; /* generated tokens (ignore_eos: exactly this many) */
    bool shared;        /* starts with the shared prefix */
    serve_class cls;
    uint64_t token_seed; /* seeds its own prompt tokens */
} serve_request;

typedef struct serve_workload {
    serve_request *reqs; /* [n], by arrival time */
    size_t n;
    loom_token *prefix; /* [n_prefix]: BOS (when the model has one) + the shared prefix */
    int32_t n_prefix;
    int32_t n_head; /* 1 when every prompt starts with BOS, else 0 */
    int32_t n_vocab;
    int32_t n_clamped; /* requests shortened to fit max_ctx */
} serve_workload;

/* Draws the workload from cfg->seed. rate <= 0 means a burst: every arrival at t = 0. n > 0
 * gives exactly n requests, otherwise arrivals until duration_s. The same seed gives the same
 * requests at any rate (gaps scale as 1/rate). Returns false on out of memory. */
bool serve_workload_make(const serve_config *cfg, const loom_model_info *info, int32_t max_ctx,
                         double rate, int32_t n, double duration_s, serve_workload *out);
void serve_workload_free(serve_workload *w);
/* Writes request r's prompt (n_prompt tokens) into out. */
void serve_workload_prompt(const serve_workload *w, const serve_request *r, loom_token *out);
/* The engine parameters the configuration asks for (engine defaults otherwise; max_ctx: the
 * longest request it can draw, within the model's context). */
loom_engine_params serve_engine_params(const serve_config *c, const loom_model_info *mi);
/* The longest prompt + output the configuration can draw (for max_ctx). */
int32_t serve_workload_max_len(const serve_config *cfg, int32_t n_head);

/* ---- driver -------------------------------------------------------------------------------- */

typedef struct serve_record {
    double arrival_s; /* open loop: the drawn arrival; closed loop: the submit time */
    double submit_s;  /* when loom_engine_submit returned (run clock) */
    double first_s;   /* first TOKEN event; < 0 until then */
    double finish_s;  /* FINISHED or FAILED event; < 0 until then */
    int32_t n_tokens; /* TOKEN events */
    loom_request_id id;
    bool submitted, done, failed;
    loom_finish_reason reason;
    loom_status status;
} serve_record;

typedef struct serve_step_sample {
    double t_s, dt_s; /* end of the step (run clock), its duration */
    int32_t blocks_used, blocks_total, running, waiting;
    int32_t n_decoding;   /* sequences that got a token this step and hold KV after it */
    int64_t frag_slots;   /* group 0's slots_unused (loom_kv_group_info): exact */
    double frag_bytes;    /* every group's unused slots, in bytes of KV memory */
    double pool_bytes;    /* every group's pool, in bytes */
    int64_t ideal_blocks; /* sum of ceil(p / block_size) over those decoding sequences */
    int32_t n_tokens;     /* tokens generated in the step */
    bool prefill;         /* some in-flight request had no token yet */
} serve_step_sample;

typedef struct serve_run {
    const char *label;
    const serve_workload *w; /* the requests the run replayed */
    double rate;             /* offered requests/s (0: burst or closed loop) */
    int32_t concurrency;     /* closed loop: requests in flight (0: open loop) */
    bool fcfs;
    serve_record *recs; /* [n], parallel to the workload's requests */
    size_t n;
    serve_step_sample *steps;
    size_t n_steps, cap_steps;
    double wall_s; /* first arrival .. last finish (closed loop: the measured window) */
    double max_lag_s, sum_lag_s; /* arrival -> submit delay */
    loom_engine_stats stats;     /* at the end */
    int32_t block_size;
    loom_status status;   /* a failing loom_engine_step stops the run */
    int32_t n_cancelled;  /* closed loop: in flight at the end of the window, cancelled */
    int32_t n_cancel_bad; /* of which did not finish as LOOM_FINISH_CANCELLED */
} serve_run;

/* Open loop: submits each request when the clock passes its arrival, steps the engine until all
 * have finished. Creates and destroys its own engine. Returns the first failure of create or
 * step (the run's records stay valid up to there). */
loom_status serve_run_open(loom_model *model, const loom_engine_params *ep, const serve_workload *w,
                           const serve_config *cfg, serve_run *run);
/* Closed loop: keeps `concurrency` requests in flight (drawn in order from w, which must hold
 * enough), for duration_s seconds, then cancels what is left. */
loom_status serve_run_closed(loom_model *model, const loom_engine_params *ep,
                             const serve_workload *w, const serve_config *cfg, int32_t concurrency,
                             double duration_s, serve_run *run);
void serve_run_free(serve_run *run);

/* ---- report -------------------------------------------------------------------------------- */

/* Prints the open-loop metrics of runs[0..n) side by side as a markdown table. */
void serve_report_open(const serve_config *cfg, const serve_run *runs, size_t n);
/* Prints the closed-loop metrics of runs[0..n) side by side. */
void serve_report_closed(const serve_run *runs, size_t n);

/* Percentile p in [0, 1] of v[0..n) (sorted in place), interpolating linearly between order
 * statistics (numpy's default); NAN when n is 0. */
double serve_percentile(double *v, size_t n, double p);

/* Seconds on CLOCK_MONOTONIC. */
double serve_now_s(void);
