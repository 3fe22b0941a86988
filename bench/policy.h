/* policy.h — loom-policy-bench: judging the scheduler's policies under load, where the machine's
 * drift cannot decide the comparison.
 *   policy.c         options and main;
 *   policy_calib.c   the real engine: a burst that measures capacity and whose trace fits the
 *                    step-cost model; the confirmation runs (policies interleaved A B A B);
 *   policy_sweep.c   the simulator (src/sched/sched_sim.h) over loads x seeds x policies, on
 *                    the same arrival traces, with confidence bounds; the tables.
 * The workload is loom-serve-bench's (serve_workload.c), from the same options and seeds. */
#pragma once

#include "serve.h"
#include "sched/sched_sim.h"

enum { POLICY_FCFS = 0, POLICY_PRIORITY, POLICY_REJECT_LATE, POLICY_DEGRADE, POLICY_COUNT };
extern const char *const policy_names[POLICY_COUNT];

typedef struct policy_opts {
    serve_config cfg; /* workload and engine shape (cfg.seed: the first seed) */
    int32_t n_seeds;
    double loads[8]; /* fractions of the measured capacity */
    int32_t n_loads;
    int32_t calib_requests; /* the calibration burst */
    double starvation_s;
    bool cost_given; /* --cost: no calibration run */
    double cost_base_us, cost_per_token_us, cost_per_ctx_us;
    int32_t n_blocks_given; /* with --cost: the KV pool's blocks (else the engine's) */
    bool list_misses;       /* --misses: each high-class miss of the priority policy, on stderr */
    /* --confirm: real-engine runs of one seed at one load, priority and FCFS interleaved */
    bool confirm;
    double confirm_load;
    uint64_t confirm_seed;
    int32_t confirm_requests;
    int32_t confirm_rounds; /* A B pairs */
} policy_opts;

/* What the calibration measured (or --cost gave). */
typedef struct policy_calib {
    loom__cost_model cost;
    double capacity_real; /* requests/s the engine finished in the burst (0 with --cost) */
    int32_t n_blocks;     /* the KV pool (group 0) */
    int64_t n_steps;      /* steps the fit saw */
    double fit_rmse_us, mean_step_us;
} policy_calib;

/* The engine parameters the options describe (as loom-serve-bench builds them). */
loom_engine_params policy_engine_params(const policy_opts *o, const loom_model_info *mi);

/* Runs the calibration burst on the real engine. Returns 0, or 1 with a message printed. */
int policy_calibrate(loom_model *model, const loom_model_info *mi, const policy_opts *o,
                     policy_calib *out);

/* The simulator's configuration for a policy (the engine's scheduler settings, its KV pool,
 * the fitted cost model). */
loom__sim_config policy_sim_config(const loom_engine_params *ep, const policy_calib *c, int policy);
/* The workload as the simulator's requests (out[w->n]). */
void policy_sim_requests(const policy_opts *o, const loom_engine_params *ep,
                         const serve_workload *w, loom__sim_request *out);
/* Requests/s the simulator finishes for a burst of the workload (the sweep's 100%). */
double policy_sim_capacity(const policy_opts *o, const loom_model_info *mi,
                           const loom_engine_params *ep, const policy_calib *c);

/* The sweep: prints one table per load. Returns 0, or 1 on a failure (printed). */
int policy_sweep(const policy_opts *o, const loom_model_info *mi, const loom_engine_params *ep,
                 const policy_calib *c, double capacity);

/* The confirmation on the real engine. Returns 0, or 1 on a failure (printed). */
int policy_confirm(loom_model *model, const loom_model_info *mi, const policy_opts *o,
                   const policy_calib *c);

/* One-sided 95% lower confidence bound on a success probability after k successes in n
 * trials (Clopper-Pearson: exact binomial). 0 when n is 0. */
double policy_lower_bound(int64_t k, int64_t n);
