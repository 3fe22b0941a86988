/* cost_model.h — the step-cost model: an engine step's time as a linear function of the tokens
 * it computes and the context they attend to, fitted online from the engine's own steps.
 *
 *     step_us ≈ base_us + per_token_us * n_tokens + per_ctx_us * n_ctx
 *
 * n_tokens is the step's batch (prefill chunk tokens plus one per decode); n_ctx the sum, over
 * the batch's sequences, of the positions they hold after the step (what attention reads).
 * Weights dominate a step's time on small batches (base), the matmuls grow with tokens, and
 * attention with context.
 *
 * The fit is least squares with exponential forgetting (each new step weighs 1, one
 * `half_life` steps older weighs 1/2), so a machine whose speed drifts — a shared VM, a GPU
 * clocking down — is tracked within a few dozen steps. The scheduler uses it to predict
 * time-to-first-token for admission control; benchmarks use it to simulate policies on the
 * same arrival trace independent of machine drift. Coefficients are never negative: a
 * negative least-squares coefficient (collinear inputs, noise) is dropped and the rest refitted.
 *
 * Pure: no clock, no allocation. Threads: one writer; copy it (it is a plain struct) to read
 * it elsewhere. */
#pragma once

#include <stdbool.h>
#include <stdint.h>

typedef struct loom__cost_model {
    double half_life; /* steps; > 0 */
    /* weighted sums over observations x = (1, tokens, ctx), y = microseconds */
    double sxx[3][3];
    double sxy[3];
    int64_t n_obs;
    /* the fit (valid once n_obs > 0) */
    double base_us, per_token_us, per_ctx_us;
} loom__cost_model;

/* An empty model forgetting with the given half-life in steps (<= 0: 256). */
void loom__cost_model_init(loom__cost_model *m, double half_life);

/* A model with fixed coefficients (no observations needed; updates refit it). */
void loom__cost_model_set(loom__cost_model *m, double base_us, double per_token_us,
                          double per_ctx_us);

/* Adds one step's observation and refits. Non-finite or negative inputs are ignored. */
void loom__cost_model_update(loom__cost_model *m, double n_tokens, double n_ctx, double step_us);

/* Predicted microseconds of a step (0 while the model has no fit). */
double loom__cost_model_predict(const loom__cost_model *m, double n_tokens, double n_ctx);

/* Whether the model has a fit (observations, or coefficients set). */
bool loom__cost_model_ready(const loom__cost_model *m);
