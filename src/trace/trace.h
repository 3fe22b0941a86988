/* trace.h — the producers' side of the per-token trace (the public loom_trace handle is in
 * loom.h): the engine appends one STEP record per engine step and one TOKEN record per sampled
 * token; trace_write.c turns them into JSON Lines or Chrome trace-event JSON.
 *
 * Timing a step: a loom__trace_timer lives in the engine (no allocation, no lock). The step
 * thread calls
 *     loom__trace_step_begin(&tm, step, loom__now_ns());
 *     ... schedule ...          loom__trace_step_phase(&tm, "schedule", loom__now_ns());
 *     ... layers 0-5 ...        loom__trace_step_phase(&tm, "forward.layers 0-5", loom__now_ns());
 *     ... lm head ...           loom__trace_step_phase(&tm, "logits", loom__now_ns());
 *     ... sample ...            loom__trace_step_phase(&tm, "sample", loom__now_ns());
 *     ... events ...            loom__trace_step_end(trace, &tm, "events", loom__now_ns(),
 *                                                    n_seqs, n_tokens);
 * Each phase runs from the previous mark to the one given, the first from the step's start, and
 * the step ends where its last phase ends: the phases tile the step exactly, so their durations
 * add up to the step's by construction. A phase name is borrowed until step_end (use string
 * literals or strings the engine keeps for its lifetime); the trace copies each distinct name
 * once. A step may have at most LOOM__TRACE_MAX_PHASES phases; later marks extend the last
 * one, which is then renamed "other".
 *
 * Failure policy: an append never fails the engine step. When memory runs out the record is
 * not stored, the trace's dropped counter grows (reported by loom_trace_get_info and in the
 * written files' metadata) and LOOM_ERR_OUT_OF_MEMORY is returned for the caller to ignore.
 * Appends take the trace's mutex, so they may run while another thread writes or clears. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "loom.h"

#define LOOM__TRACE_MAX_PHASES 32

typedef struct loom__trace_phase {
    const char *name; /* borrowed until the step is appended; non-empty */
    int64_t start_ns; /* monotonic clock (loom__now_ns) */
    int64_t end_ns;   /* >= start_ns */
} loom__trace_phase;

typedef struct loom__trace_step {
    int64_t step;     /* the engine's step index */
    int64_t start_ns; /* == phases[0].start_ns */
    int64_t end_ns;   /* == phases[n_phases - 1].end_ns */
    int32_t n_seqs;   /* sequences in the step's batch */
    int32_t n_tokens; /* tokens in the step's forward pass (prefill chunks and decodes) */
    const loom__trace_phase *phases; /* [n_phases], contiguous: phases[i].start_ns ==
                                        phases[i - 1].end_ns */
    int32_t n_phases;                /* 1 .. LOOM__TRACE_MAX_PHASES */
} loom__trace_step;

typedef struct loom__trace_token {
    loom_request_id request;
    int32_t sample; /* which of the request's n samples */
    int64_t step;   /* the step that produced it */
    int32_t pos;    /* the token's position in its sequence */
    loom_token token;
    const char *piece; /* the token's text piece, piece_len raw bytes (any bytes; copied) */
    size_t piece_len;
    float logprob_raw;        /* log p of the token under the model's distribution */
    float logprob_final;      /* log p under the distribution it was drawn from */
    double entropy;           /* nats, of the distribution the entropy correction sees (after
                                 logit bias and penalties, before correction and temperature) */
    double entropy_final;     /* nats, of the distribution drawn from (after correction,
                                 temperature and filters) */
    double varentropy;        /* nats^2, of the same distribution as entropy */
    double temperature;       /* effective temperature (0: greedy) */
    int64_t t_ns;             /* when it was sampled (monotonic clock) */
    int64_t since_arrival_ns; /* t_ns minus the request's submit time */
} loom__trace_token;

/* Appends a step record (phases are copied). Errors: INVALID_ARG (NULL, no phases, more than
 * LOOM__TRACE_MAX_PHASES, an empty name, phases that do not tile [start_ns, end_ns]; nothing
 * is stored and nothing counted), OUT_OF_MEMORY (dropped; counted). */
loom_status loom__trace_add_step(loom_trace *t, const loom__trace_step *step);

/* Appends a token record (the piece is copied). Errors: INVALID_ARG (NULL, piece NULL with a
 * nonzero length), OUT_OF_MEMORY (dropped; counted). */
loom_status loom__trace_add_token(loom_trace *t, const loom__trace_token *tok);

/* ---- step timer -------------------------------------------------------------------------- */

typedef struct loom__trace_timer {
    int64_t step;
    int64_t start_ns;
    int64_t mark_ns; /* end of the last phase (the start of the next) */
    int32_t n_phases;
    loom__trace_phase phases[LOOM__TRACE_MAX_PHASES];
} loom__trace_timer;

/* Starts timing step `step` at now_ns. */
void loom__trace_step_begin(loom__trace_timer *tm, int64_t step, int64_t now_ns);

/* Closes the phase `name` that ran from the previous mark to now_ns (a now_ns before the mark
 * is taken as the mark: a phase never has negative length). */
void loom__trace_step_phase(loom__trace_timer *tm, const char *name, int64_t now_ns);

/* Closes the last phase (`name`, ending at now_ns) and appends the step to t. t may be NULL
 * (tracing off): then it only closes the phase and returns LOOM_OK. Errors: those of
 * loom__trace_add_step. */
loom_status loom__trace_step_end(loom_trace *t, loom__trace_timer *tm, const char *name,
                                 int64_t now_ns, int32_t n_seqs, int32_t n_tokens);

/* ---- forward-pass layer groups ------------------------------------------------------------ */

/* A forward pass reports its layers in at most this many groups, so a step shows a handful of
 * phases ("forward.layers 0-4", ...) whatever the depth of the model. */
#define LOOM__TRACE_LAYER_GROUPS 4

/* The group size and phase names of a model's layers: groups of `every` = ceil(n_layer / 4)
 * layers (the last may be shorter), named "forward.layers FIRST-LAST". Kept by the producer
 * for its lifetime, so the names can be borrowed by the step timer. */
typedef struct loom__trace_layers {
    int32_t every;
    int32_t n_groups;
    char names[LOOM__TRACE_LAYER_GROUPS][48];
} loom__trace_layers;

void loom__trace_layers_init(loom__trace_layers *ln, int32_t n_layer);

/* What a forward pass's on_layers hook needs to close a phase per group of layers. */
typedef struct loom__trace_layer_hook {
    loom__trace_timer *tm;
    const loom__trace_layers *layers;
} loom__trace_layer_hook;

/* The on_layers hook of loom__batch (model/forward.h): closes the phase named after the group
 * that ends at last_layer, at the current time. user is a loom__trace_layer_hook. */
void loom__trace_on_layers(void *user, int32_t first_layer, int32_t last_layer);
