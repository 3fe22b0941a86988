/* chain.h — the full per-request sampler chain (internal; loom_sampler_params of loom.h maps
 * onto it through sample/sample.h): logit bias, repetition / presence / frequency penalties,
 * entropy-based logit correction, temperature, top-k, top-p, min-p, typical-p, and a draw from
 * the counter-based RNG, with log-probabilities before and after processing. Caller-owned
 * workspace, no malloc per call.
 *
 * ORDER (fixed):
 *   1. logit bias          x_i += bias_i (sparse list; a bias of -inf bans a token)
 *   2. penalties           over the last `penalty_last_n` history tokens, for each seen token
 *                          with count c: repetition (x > 0 ? x / r : x * r), then
 *                          x -= presence (once) + c * frequency (OpenAI / llama.cpp semantics)
 *   3. entropy correction  H = entropy of softmax(x) after 1-2 (full vocabulary); the mode
 *                          yields one multiplicative scale s on the logits (see below)
 *   4. temperature         folded into s (EXP: s = e^(-beta H) / T; NONE: s = 1 / T;
 *                          EDT and DYNATEMP compute T themselves and s = 1 / T)
 *   5. top-k  6. top-p  7. min-p  8. typical-p   on p = softmax(s * x), each on the candidates
 *                          left by the previous step (renormalized)
 *   9. draw                u = uniform(seed, draw_index), inverse CDF over the survivors
 * The filters act on the corrected, tempered distribution (so top-p and min-p mean "of what we
 * actually sample from"); top-k is unaffected by the order since s > 0 keeps the ranking.
 * temperature == 0 means greedy (arg max after steps 1-2, ties to the lower id) in every mode.
 *
 * ENTROPY CORRECTION MODES (H in nats, of the distribution after steps 1-2):
 *   NONE      s = 1 / temperature.
 *   EXP       logits * exp(-beta H) at temperature T: s = exp(-beta H) / temperature; beta >= 0.
 *   EDT       (Zhang et al. 2024, entropy-based dynamic temperature) T = T0 * N^(theta / H),
 *             T0 = temperature, N = edt_n in (0, 1] (default 0.8), theta >= 0. Floor: H is
 *             replaced by max(H, edt_h_min) (default 1e-3 nats) so H -> 0 gives a tiny but
 *             positive T instead of 0 / 0; if T still underflows to 0 the step is greedy (its
 *             limit). Since N <= 1, T <= T0 always.
 *   DYNATEMP  T = dyn_t_min + (dyn_t_max - dyn_t_min) * (H / ln n)^dyn_exponent, n the number of
 *             finite candidates after steps 1-2 (H / ln n clamped to [0, 1]; n <= 1 gives
 *             dyn_t_min); T == 0 gives greedy. temperature only switches greedy on (== 0).
 *
 * COST (bench/sampler-cost.c; < 1% of a Gemma 3 270M decode step with top-k): copying the
 * logits records each 64-token block's maximum and counts the finite ones; one vectorized pass
 * (exponentials eight or four at a time, sample/vexp.h) then gives normalizer, entropy and
 * varentropy, and also the raw logits' normalizer when bias or penalties edited a few entries
 * (only those are summed again). Top-k and the raw top-n logprobs use k- and n-entry heaps
 * that skip blocks whose maximum cannot enter. With top-k off, top-p buckets the weights of
 * the whole vocabulary in one more pass and sorts only the bucket where the mass reaches
 * top_p (no sort of the vocabulary). Typical-p sorts the candidates left by the earlier
 * filters (all finite tokens if none is on).
 *
 * DETERMINISM: the draw uses loom__rng_uniform(seed, draw_index) only; the draw walks the
 * candidates in a fixed order — best first (logit, then id) after top-k; after top-p without
 * top-k, the nucleus's tokens in id order then its edge bucket best first; id order after
 * min-p alone — so a result never depends on batch, thread or schedule. Sums are taken in a
 * fixed order of vector lanes: an AVX-512 build and an AVX2 build may differ in the last bits
 * (and so, rarely, in a draw that lands on a boundary); a given build never does. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "loom.h"
#include "loom_backend.h"

/* loom_entropy_mode and loom_logit_bias are the public ones (loom.h). */

#define LOOM_SAMPLE_CHAIN_DEFAULT_LOGPROBS_MAX 20 /* what the engine allows without asking */

typedef struct loom__sample_chain_config {
    /* 1. bias */
    const loom_logit_bias *bias; /* n_bias entries, borrowed; duplicates add up */
    int32_t n_bias;
    /* 2. penalties */
    int32_t penalty_last_n;  /* window of previous tokens: 0 off, -1 whole history; default 64 */
    float repeat_penalty;    /* > 0; 1 off (default) */
    float presence_penalty;  /* finite; 0 off (default) */
    float frequency_penalty; /* finite; 0 off (default) */
    /* 3. entropy correction */
    loom_entropy_mode entropy_mode; /* default NONE */
    float exp_beta;                 /* EXP: beta >= 0; default 0.5 */
    float edt_n;                    /* EDT: N in (0, 1]; default 0.8 */
    float edt_theta;                /* EDT: theta >= 0; default 1.0 */
    float edt_h_min;                /* EDT: entropy floor > 0 (nats); default 1e-3 */
    float dyn_t_min, dyn_t_max;     /* DYNATEMP: 0 <= t_min <= t_max; default 0.5, 1.5 */
    float dyn_exponent;             /* DYNATEMP: kappa >= 0; default 1 */
    /* 4-8. temperature and filters */
    float temperature; /* >= 0, finite; 0 greedy; default 0.8 */
    int32_t top_k;     /* <= 0 off; default 40 */
    float top_p;       /* (0, 1]; 1 off; default 0.95 */
    float min_p;       /* [0, 1]; 0 off (default) */
    float typical_p;   /* (0, 1]; 1 off (default) */
    /* 9. draw */
    uint64_t seed; /* default 0x5EED */
    /* outputs */
    int32_t n_logprobs; /* top-n alternatives to report, [0, n_vocab]; default 0 */
} loom__sample_chain_config;

/* The public pair, so result arrays can be handed out as loom_token_info's top arrays. */
typedef loom_token_logprob loom__sample_chain_logprob;

/* What one step produced. top_raw / top_final are caller-owned arrays of at least
 * cfg->n_logprobs entries (may be NULL when n_logprobs == 0); the rest is filled by the call.
 * "raw" = log softmax of the logits as given (the model's distribution); "final" = the
 * distribution actually drawn from (after every step; renormalized over the survivors; a greedy
 * step is a point mass). */
typedef struct loom__sample_chain_result {
    loom_token token;
    float logprob_raw;
    float logprob_final;
    loom__sample_chain_logprob *top_raw;   /* [n_logprobs] in: buffer; out: best first */
    loom__sample_chain_logprob *top_final; /* [n_logprobs] in: buffer; out: best first */
    int32_t n_top_raw;    /* entries written to top_raw (min(n_logprobs, finite raw tokens)) */
    int32_t n_top_final;  /* entries written to top_final (min(n_logprobs, survivors)) */
    double entropy;       /* H of softmax after bias and penalties (what the correction sees) */
    double varentropy;    /* its varentropy, nats^2 */
    double entropy_final; /* H of the final distribution */
    double temperature;   /* effective temperature 1 / s (0 when greedy) */
    int32_t n_candidates; /* size of the final support */
} loom__sample_chain_result;

/* The documented defaults (matching loom_sampler_default_params for the shared fields). */
loom__sample_chain_config loom__sample_chain_default_config(void);

/* Checks cfg for a vocabulary of n_vocab tokens (call at submit time). Errors:
 * LOOM_ERR_INVALID_ARG with a message naming the field (negative or non-finite temperature,
 * top_p outside (0, 1], min_p outside [0, 1], typical_p outside (0, 1], a bias id out of range
 * or a +inf/NaN bias, repeat_penalty <= 0, non-finite presence/frequency, penalty_last_n < -1,
 * negative beta/theta/exponent, edt_n outside (0, 1], edt_h_min <= 0, a bad dynatemp range,
 * an unknown mode, n_logprobs outside [0, n_vocab]). Thread-safe. */
loom_status loom__sample_chain_validate(const loom__sample_chain_config *cfg, int32_t n_vocab);

typedef struct loom__sample_chain_ws loom__sample_chain_ws;

/* Bytes of workspace for n_vocab tokens (0 when n_vocab <= 0 or the size overflows). */
size_t loom__sample_chain_workspace_size(int32_t n_vocab);

/* Lays a workspace out in caller memory mem[0..size) (16-byte aligned, size from
 * loom__sample_chain_workspace_size); *out points into mem and stays valid as long as mem.
 * Nothing to free. One workspace serves one thread at a time.
 * Errors: LOOM_ERR_INVALID_ARG (NULL, misaligned, n_vocab <= 0), LOOM_ERR_BUFFER_TOO_SMALL. */
loom_status loom__sample_chain_workspace_init(void *mem, size_t size, int32_t n_vocab,
                                              loom__sample_chain_ws **out);

/* Runs the chain on logits[0..n_vocab) (n_vocab fixed by the workspace; logits not modified)
 * with the request's previous tokens history[0..n_history) (oldest first; the penalty window
 * is its tail), drawing with (cfg->seed, draw_index). Validates cfg. No allocation.
 * Errors: LOOM_ERR_INVALID_ARG (NULL, bad cfg, NULL result buffers with n_logprobs > 0),
 *   LOOM_ERR_BAD_INPUT (a history id out of range, a +inf logit after bias/penalties, or no
 *   finite logit left; NaN logits are treated as -inf). */
loom_status loom__sample_chain_run(loom__sample_chain_ws *ws, const loom__sample_chain_config *cfg,
                                   const float *logits, const loom_token *history,
                                   int32_t n_history, uint64_t draw_index,
                                   loom__sample_chain_result *out);

/* ---- sampling from a row's summary (loom_backend.h: logits_summary) ---------------------- */
/* A device backend can summarize a row of logits — its maximum, normalizer, entropy,
 * varentropy, finite count and arg max, and its n_top best entries — so that only a few KB
 * cross to the host instead of the row (1 MiB for a 262,144-token vocabulary). Bias and
 * penalties are applied there too (loom_logit_edits, in the chain's arithmetic), the row
 * summarized before and after them. The run below gives the run over the whole row's results,
 * token and every field, for the settings a summary covers; the statistics' last bits are the
 * summarizer's (a device sums in its own order), and with edits the raw normalizer is summed
 * over the raw row rather than corrected from the edited one. */

/* Whether the settings can be sampled from a summary with n_top candidates: n_logprobs <=
 * n_top, at most LOOM_LOGIT_SUMMARY_MAX_EDITS bias entries, and either greedy (temperature 0)
 * or top-k on with k <= n_top (top-p, min-p and typical-p then act on the k candidates). Top-k
 * off with a temperature walks the whole vocabulary (top-p's nucleus, min-p's survivors in id
 * order), so it needs the row; so does a penalty window with more distinct tokens than
 * loom__sample_chain_edits takes (it says so per step). */
bool loom__sample_chain_summary_ok(const loom__sample_chain_config *c, int32_t n_top);

/* The edits the chain would make for cfg with the request's previous tokens history[0..n_history)
 * (oldest first; the penalty window is its tail, as in loom__sample_chain_run): cfg's bias
 * list, and, where a penalty is on, each distinct token of the window with its count, into
 * pen_id / pen_count (caller arrays of LOOM_LOGIT_SUMMARY_MAX_EDITS entries). Returns false
 * where the edits do not fit LOOM_LOGIT_SUMMARY_MAX_EDITS (the row is then copied whole);
 * history ids must be in range (the caller's, as for the run). */
bool loom__sample_chain_edits(const loom__sample_chain_config *cfg, const loom_token *history,
                              int32_t n_history, int32_t *pen_id, int32_t *pen_count,
                              loom_logit_edits *out);

/* A row as its summary gives it: sum and top (the row after its edits, or the row where there
 * are none); with edits (bias or penalty entries), raw_sum and raw_top the row as it came and
 * edit_raw the raw value of each edited token (bias entries, then penalty entries). */
typedef struct loom__row_summary {
    const loom_logit_summary *sum;
    const loom_logit_cand *top;
    const loom_logit_edits *edits; /* NULL or no entries: none */
    const loom_logit_summary *raw_sum;
    const loom_logit_cand *raw_top;
    const float *edit_raw;
} loom__row_summary;

/* loom__sample_chain_run over a row known by its summary rs, whose edits must be those
 * loom__sample_chain_edits gives for cfg and the request's history. Where fewer finite logits
 * than top-k remain the chain walks the whole vocabulary: the list then holds every finite
 * logit, and the row is rebuilt from it into row (n_vocab floats of scratch) and run. Errors:
 * INVALID_ARG (NULL, bad cfg, settings the summary does not cover), BAD_INPUT (a +inf logit,
 * before or after the edits; no finite logit). */
loom_status loom__sample_chain_run_summary(loom__sample_chain_ws *ws,
                                           const loom__sample_chain_config *cfg,
                                           const loom__row_summary *rs, uint64_t draw_index,
                                           float *row, loom__sample_chain_result *out);

/* The host's summarizer, what logits_summary computes (the reference for backends, and the
 * engine's where the backend has none): x[0..n) into *sum and top[0..min(n_top, finite)),
 * best first; 1 <= n_top <= LOOM_LOGIT_SUMMARY_MAX_TOP. The statistics are the chain's own,
 * bit for bit. */
void loom__sample_logits_summarize(const float *x, int32_t n, int32_t n_top,
                                   loom_logit_summary *sum, loom_logit_cand *top);

/* The same with edits (NULL or none: as above, raw_* untouched): x summarized into raw_sum /
 * raw_top, copied into scratch (n floats), edited there as logits_summary edits it (edit_raw
 * receiving the raw values), and the copy summarized into sum / top. */
void loom__sample_logits_summarize_edited(const float *x, int32_t n, int32_t n_top,
                                          const loom_logit_edits *edits, float *scratch,
                                          loom_logit_summary *sum, loom_logit_cand *top,
                                          loom_logit_summary *raw_sum, loom_logit_cand *raw_top,
                                          float *edit_raw);
