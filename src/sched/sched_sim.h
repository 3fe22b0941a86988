/* sched_sim.h — a serving simulator: the real scheduler (sched.h) driven over an arrival trace
 * by a model of the engine, with virtual time. Each step's plan is carried out on a model of
 * the KV pool (ceil(positions / block_size) blocks per sequence, no prefix sharing; preemption
 * frees or swaps a sequence's blocks) and lasts what a step-cost model (cost_model.h) says for
 * its tokens and context (the positions computed, so cached prefix tokens cost nothing);
 * every sampled entry yields one token and a request finishes after
 * exactly its n_output tokens.
 *
 * What it is for: judging a scheduling policy on an arrival trace independent of the machine's
 * speed (two policies simulated on one trace against one cost model see exactly the same
 * conditions, where two runs on a shared machine do not), testing the policy against
 * adversarial traces with exact expected orders, and checking admission control's predictions
 * against what then happens. The cost model comes from the engine's own steps (fitted from its
 * trace by the serving benchmark) or is given.
 *
 * Pure and deterministic: the same inputs give the same outcomes on every machine. Threads: no
 * shared state. Memory: allocates per run, frees before returning. */
#pragma once

#include "sched/sched.h"

typedef struct loom__sim_request {
    int32_t priority;
    int32_t n_prompt; /* >= 1 */
    int32_t n_output; /* tokens it generates, >= 1 */
    int64_t arrival_us;
    int64_t ttft_us;  /* deadline relative to arrival; 0 = none */
    int64_t tpot_us;  /* 0 = none */
    int32_t n_cached; /* leading prompt tokens the prefix cache holds whenever it is admitted
                         (a shared system prompt); its blocks are still counted as its own */
} loom__sim_request;

typedef struct loom__sim_outcome {
    int64_t first_token_us;    /* -1: never (rejected) */
    int64_t finish_us;         /* -1: never */
    int64_t predicted_ttft_us; /* the forecast at arrival (-1: none made) */
    int32_t n_preempted;       /* times it was preempted */
    bool rejected;             /* by admission control, or too big for the KV pool */
    bool degraded;             /* admitted as best-effort by LOOM_ADMIT_DEGRADE */
} loom__sim_outcome;

typedef struct loom__sim_config {
    loom__sched_config sched;
    int32_t n_blocks, block_size; /* the KV pool */
    loom__cost_model cost;        /* each step's time (copied; not updated) */
    loom_admission_policy admission;
} loom__sim_config;

typedef struct loom__sim_stats {
    int64_t steps;
    int64_t end_us;  /* when the last request finished */
    int64_t busy_us; /* time inside steps */
    int64_t preemptions, promotions;
} loom__sim_stats;

/* Simulates the trace (requests in any order; request i is the scheduler's id i + 1) and writes
 * out[i] for each. stats may be NULL. Errors: INVALID_ARG (NULL, a bad request or config, a
 * cost model with no fit), OUT_OF_MEMORY, INTERNAL (the scheduler made no progress with work
 * left: a policy bug, not an input error). */
loom_status loom__sim_run(const loom__sim_config *cfg, const loom__sim_request *reqs, int32_t n,
                          loom__sim_outcome *out, loom__sim_stats *stats);
