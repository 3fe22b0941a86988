/* summary.c — the host's summarizer of a row of logits (chain.h): the statistics of the chain's
 * own pass (entropy.c, so a summary made here gives bit for bit what the run over the row
 * gives) and the n_top best finite entries through the chain's k-best heap. What a device's
 * logits_summary is checked against, and what the engine uses where a backend has none. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "sample/chain_internal.h"

void loom__sample_logits_summarize(const float *x, int32_t n, int32_t n_top,
                                   loom_logit_summary *sum, loom_logit_cand *top) {
    int32_t n_posinf = 0, first_posinf = -1;
    for (int32_t i = 0; i < n; i++)
        if (x[i] == INFINITY && n_posinf++ == 0) first_posinf = i;
    loom__logit_stats st;
    if (n_posinf == 0) {
        loom__logit_stats_compute(x, n, 1.0, &st);
    } else { /* the chain refuses such a row; only the counts and the list are meaningful */
        st = (loom__logit_stats){.max = INFINITY, .argmax = first_posinf};
    }
    /* the k-best heap over the finite entries (the chain's order: larger first, then lower id) */
    loom__chain_cand h[LOOM_LOGIT_SUMMARY_MAX_TOP];
    if (n_top > LOOM_LOGIT_SUMMARY_MAX_TOP) n_top = LOOM_LOGIT_SUMMARY_MAX_TOP;
    int32_t held = 0, n_finite = 0;
    for (int32_t i = 0; i < n; i++) {
        if (!(x[i] > -INFINITY && x[i] < INFINITY)) continue;
        n_finite++;
        if (held == n_top && x[i] < h[0].x) continue;
        loom__chain_heap_offer(h, &held, n_top, (loom__chain_cand){x[i], i});
    }
    qsort(h, (size_t)held, sizeof *h, loom__chain_cand_cmp);
    for (int32_t i = 0; i < held; i++) top[i] = (loom_logit_cand){h[i].x, h[i].id};
    *sum = (loom_logit_summary){.max = st.max,
                                .sum = st.sum,
                                .entropy = st.entropy,
                                .varentropy = st.varentropy,
                                .n_finite = n_finite,
                                .argmax = st.argmax,
                                .n_posinf = n_posinf,
                                .n_top = held};
}

void loom__sample_logits_summarize_edited(const float *x, int32_t n, int32_t n_top,
                                          const loom_logit_edits *e, float *scratch,
                                          loom_logit_summary *sum, loom_logit_cand *top,
                                          loom_logit_summary *raw_sum, loom_logit_cand *raw_top,
                                          float *edit_raw) {
    if (e == NULL || e->n_bias + e->n_pen == 0) {
        loom__sample_logits_summarize(x, n, n_top, sum, top);
        return;
    }
    loom__sample_logits_summarize(x, n, n_top, raw_sum, raw_top);
    memcpy(scratch, x, (size_t)n * sizeof *scratch);
    /* the chain's steps 1-2 on the touched logits (a NaN as the -inf the chain's copy makes
     * of it), in its order and arithmetic (chain_prepare.c); an edit giving NaN (inf - inf:
     * an overflowing bias or penalty) leaves +inf, which the chain refuses as it refuses the
     * NaN */
    loom__sample_chain_config c = {.repeat_penalty = e->repeat_penalty,
                                   .presence_penalty = e->presence_penalty,
                                   .frequency_penalty = e->frequency_penalty};
    for (int32_t j = 0; j < e->n_bias + e->n_pen; j++) {
        const loom_token t = j < e->n_bias ? e->bias[j].id : e->pen_id[j - e->n_bias];
        if (scratch[t] != scratch[t]) scratch[t] = -INFINITY;
        edit_raw[j] = x[t] != x[t] ? -INFINITY : x[t];
        scratch[t] = j < e->n_bias
                         ? loom__chain_bias(scratch[t], e->bias[j].bias)
                         : loom__chain_penalize(scratch[t], e->pen_count[j - e->n_bias], &c);
        if (scratch[t] != scratch[t]) scratch[t] = INFINITY;
    }
    loom__sample_logits_summarize(scratch, n, n_top, sum, top);
}
