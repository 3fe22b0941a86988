/* trace_impl.h — the trace's storage, shared by trace.c (create, append, clear) and
 * trace_write.c (the two output formats). Every field is guarded by mu (trace_write.c formats
 * from a copy taken under it). */
#pragma once

#include <pthread.h>

#include "trace/trace.h"

typedef struct loom__trace_phase_rec {
    int64_t start_ns, end_ns;
    uint32_t name; /* index into names */
} loom__trace_phase_rec;

typedef struct loom__trace_step_rec {
    int64_t step, start_ns, end_ns;
    int32_t n_seqs, n_tokens;
    size_t first_phase; /* into phases */
    int32_t n_phases;
} loom__trace_step_rec;

typedef struct loom__trace_token_rec {
    loom_request_id request;
    int64_t step, t_ns, since_arrival_ns;
    size_t piece_off; /* into bytes */
    size_t piece_len;
    int32_t sample, pos;
    loom_token token;
    float logprob_raw, logprob_final;
    double entropy, entropy_final, varentropy, temperature;
} loom__trace_token_rec;

struct loom_trace {
    pthread_mutex_t mu;
    loom__trace_step_rec *steps;
    size_t n_steps, cap_steps;
    loom__trace_phase_rec *phases;
    size_t n_phases, cap_phases;
    loom__trace_token_rec *tokens;
    size_t n_tokens, cap_tokens;
    char *bytes; /* the token pieces, back to back */
    size_t n_bytes, cap_bytes;
    char **names; /* distinct phase names (kept across clear: a small dictionary) */
    size_t n_names, cap_names;
    uint64_t dropped;
    uint64_t clears; /* loom_trace_clear calls: records only grow between two */
};

/* The mutex of a trace reached through a const pointer (reads lock too). */
static inline pthread_mutex_t *loom__trace_mu(const loom_trace *t) {
    return (pthread_mutex_t *)&t->mu;
}
