/* serve_report.c — metrics of loom-serve-bench runs and their tables (markdown, one column per
 * run, so results paste into bench/results/ as they are).
 *
 * Definitions:
 *   TTFT  first TOKEN event - arrival (open loop: the drawn arrival time, so the wait until the
 *         driver could submit — at most one step — is included; closed loop: submit time).
 *   TPOT  (finish - first token) / (tokens - 1), requests with at least 2 tokens.
 *   percentiles: linear interpolation between order statistics (numpy's default).
 *   deadline met: TTFT <= --ttft-deadline; a failed request counts as missed. Best-effort
 *         requests have no deadline: the row says what fraction would have met it.
 *   throughput: generated tokens (and finished requests) / (last finish - first arrival).
 *   KV utilisation: kv_blocks_used / kv_blocks_total after each step, weighted by step time.
 *   fragmentation: see serve_driver.c; exact, % of group 0's slots and % of all KV bytes. */
#define _POSIX_C_SOURCE 200809L

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "serve.h"

/* ---- small statistics ---------------------------------------------------------------------- */

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

double serve_percentile(double *v, size_t n, double p) {
    if (n == 0) return NAN;
    qsort(v, n, sizeof *v, cmp_double);
    double pos = p * (double)(n - 1);
    size_t lo = (size_t)pos;
    if (lo + 1 >= n) return v[n - 1];
    return v[lo] + (pos - (double)lo) * (v[lo + 1] - v[lo]);
}

typedef struct class_metrics {
    size_t n, n_failed, n_met, n_first;
    double ttft_p50, ttft_p99, tpot_p50, tpot_p99; /* seconds */
} class_metrics;

static class_metrics class_stats(const serve_run *r, int cls, double deadline, double *scratch) {
    const serve_workload *w = r->w;
    class_metrics m;
    memset(&m, 0, sizeof m);
    size_t n_tpot = 0;
    for (size_t i = 0; i < r->n; i++) {
        const serve_record *rec = &r->recs[i];
        if (!rec->submitted || (cls >= 0 && (int)w->reqs[i].cls != cls)) continue;
        m.n++;
        if (rec->failed) m.n_failed++;
        if (rec->first_s < 0) continue;
        double ttft = rec->first_s - rec->arrival_s;
        scratch[m.n_first++] = ttft;
        if (ttft <= deadline && !rec->failed) m.n_met++;
    }
    m.ttft_p50 = serve_percentile(scratch, m.n_first, 0.50);
    m.ttft_p99 = serve_percentile(scratch, m.n_first, 0.99);
    for (size_t i = 0; i < r->n; i++) {
        const serve_record *rec = &r->recs[i];
        if (!rec->submitted || (cls >= 0 && (int)w->reqs[i].cls != cls)) continue;
        if (rec->first_s < 0 || rec->finish_s < 0 || rec->n_tokens < 2 || rec->failed ||
            rec->reason == LOOM_FINISH_CANCELLED)
            continue;
        scratch[n_tpot++] = (rec->finish_s - rec->first_s) / (double)(rec->n_tokens - 1);
    }
    m.tpot_p50 = serve_percentile(scratch, n_tpot, 0.50);
    m.tpot_p99 = serve_percentile(scratch, n_tpot, 0.99);
    return m;
}

typedef struct kv_metrics {
    double util_mean, util_peak;   /* fraction of blocks */
    double frag_mean, frag_peak;   /* fraction of group 0's pool slots */
    double bound_mean, bound_peak; /* all groups: fraction of the KV bytes */
    double frag_of_used;           /* step-weighted: unused / allocated slots (group 0) */
    /* Steps where every running sequence was decoding: blocks used / sum of ceil(p / B) over
     * them (1 without prefix sharing if the estimate's positions are right; below 1 by what
     * shared prefix blocks save). */
    int64_t check_used, check_ideal;
    size_t check_steps;
} kv_metrics;

static kv_metrics kv_stats(const serve_run *r) {
    kv_metrics k;
    memset(&k, 0, sizeof k);
    double tw = 0, used_w = 0;
    for (size_t i = 0; i < r->n_steps; i++) {
        const serve_step_sample *s = &r->steps[i];
        if (s->blocks_total <= 0) continue;
        double slots = (double)s->blocks_total * r->block_size;
        double u = (double)s->blocks_used / s->blocks_total;
        double f = (double)s->frag_slots / slots;
        double b = s->pool_bytes > 0 ? s->frag_bytes / s->pool_bytes : 0.0;
        k.util_mean += u * s->dt_s;
        k.frag_mean += f * s->dt_s;
        k.bound_mean += b * s->dt_s;
        if (s->blocks_used > 0) {
            k.frag_of_used +=
                (double)s->frag_slots / ((double)s->blocks_used * r->block_size) * s->dt_s;
            used_w += s->dt_s;
        }
        if (s->running > 0 && s->n_decoding == s->running) {
            k.check_used += s->blocks_used;
            k.check_ideal += s->ideal_blocks;
            k.check_steps++;
        }
        tw += s->dt_s;
        if (u > k.util_peak) k.util_peak = u;
        if (f > k.frag_peak) k.frag_peak = f;
        if (b > k.bound_peak) k.bound_peak = b;
    }
    if (tw > 0) {
        k.util_mean /= tw;
        k.frag_mean /= tw;
        k.bound_mean /= tw;
    }
    if (used_w > 0) k.frag_of_used /= used_w;
    return k;
}

/* ---- table printing ------------------------------------------------------------------------ */

#define SERVE_MAX_COLS 8
#define SERVE_CELL     48
#define SERVE_NUM      20 /* one formatted number: two and a separator fit in a cell */

typedef struct table_row {
    char label[48];
    char cell[SERVE_MAX_COLS][SERVE_CELL];
} table_row;

static void print_row(const table_row *row, size_t n) {
    printf("| %-34s |", row->label);
    for (size_t c = 0; c < n; c++) printf(" %-21s |", row->cell[c]);
    printf("\n");
}

static void print_rule(size_t n) {
    printf("|%s|", "------------------------------------");
    for (size_t c = 0; c < n; c++) printf("%s|", "-----------------------");
    printf("\n");
}

/* Formats a value or "-" for NaN, with a scale and a number of decimals (at most SERVE_NUM
 * bytes). */
static void fmt_num(char *cell, double v, double scale, int decimals) {
    if (isnan(v)) {
        snprintf(cell, SERVE_NUM, "-");
    } else {
        snprintf(cell, SERVE_NUM, "%.*f", decimals, v * scale);
    }
}

/* "a / b" with a scale and decimals; "-" for a NaN side. */
static void fmt_pair(char *cell, double a, double b, double scale, int decimals) {
    char x[SERVE_NUM], y[SERVE_NUM];
    fmt_num(x, a, scale, decimals);
    fmt_num(y, b, scale, decimals);
    snprintf(cell, SERVE_CELL, "%s / %s", x, y);
}

static void fmt_frac(char *cell, size_t num, size_t den) {
    if (den == 0) {
        snprintf(cell, SERVE_CELL, "-");
    } else {
        snprintf(cell, SERVE_CELL, "%.1f%% (%zu/%zu)", 100.0 * (double)num / (double)den, num, den);
    }
}

/* ---- open loop ----------------------------------------------------------------------------- */

/* Scratch for percentiles: as many doubles as the largest run has requests. */
static double *alloc_scratch(const serve_run *runs, size_t n) {
    size_t most = 1;
    for (size_t c = 0; c < n; c++) {
        if (runs[c].n > most) most = runs[c].n;
    }
    return malloc(most * sizeof(double));
}

void serve_report_open(const serve_config *cfg, const serve_run *runs, size_t n) {
    if (n > SERVE_MAX_COLS) n = SERVE_MAX_COLS;
    double *scratch = alloc_scratch(runs, n);
    if (!scratch) return;
    table_row row;
    memset(&row, 0, sizeof row);
    snprintf(row.label, sizeof row.label, "metric");
    for (size_t c = 0; c < n; c++) snprintf(row.cell[c], SERVE_CELL, "%s", runs[c].label);
    print_row(&row, n);
    print_rule(n);

    class_metrics hi[SERVE_MAX_COLS], be[SERVE_MAX_COLS], all[SERVE_MAX_COLS];
    kv_metrics kv[SERVE_MAX_COLS];
    for (size_t c = 0; c < n; c++) {
        hi[c] = class_stats(&runs[c], SERVE_CLASS_HIGH, cfg->ttft_deadline_s, scratch);
        be[c] = class_stats(&runs[c], SERVE_CLASS_BEST_EFFORT, cfg->ttft_deadline_s, scratch);
        all[c] = class_stats(&runs[c], -1, cfg->ttft_deadline_s, scratch);
        kv[c] = kv_stats(&runs[c]);
    }
#define ROW(lbl, ...)                                                                              \
    do {                                                                                           \
        snprintf(row.label, sizeof row.label, "%s", lbl);                                          \
        for (size_t c = 0; c < n; c++) {                                                           \
            const serve_run *r = &runs[c];                                                         \
            (void)r;                                                                               \
            __VA_ARGS__;                                                                           \
        }                                                                                          \
        print_row(&row, n);                                                                        \
    } while (0)
#define CELL row.cell[c]
    ROW("offered rate (req/s)", fmt_num(CELL, r->rate, 1, 3));
    ROW("requests (high / best-effort)",
        snprintf(CELL, SERVE_CELL, "%zu (%zu / %zu)", all[c].n, hi[c].n, be[c].n));
    ROW("failed", snprintf(CELL, SERVE_CELL, "%zu", all[c].n_failed));
    ROW("wall time (s)", fmt_num(CELL, r->wall_s, 1, 1));
    int64_t tok[SERVE_MAX_COLS];
    for (size_t c = 0; c < n; c++) {
        tok[c] = 0;
        for (size_t i = 0; i < runs[c].n; i++) tok[c] += runs[c].recs[i].n_tokens;
    }
    ROW("throughput (generated tok/s)", fmt_num(CELL, (double)tok[c] / r->wall_s, 1, 2));
    ROW("throughput (finished req/s)",
        fmt_num(CELL, (double)(all[c].n - all[c].n_failed) / r->wall_s, 1, 3));
    ROW("TTFT p50 high (s)", fmt_num(CELL, hi[c].ttft_p50, 1, 3));
    ROW("TTFT p99 high (s)", fmt_num(CELL, hi[c].ttft_p99, 1, 3));
    ROW("TTFT p50 best-effort (s)", fmt_num(CELL, be[c].ttft_p50, 1, 3));
    ROW("TTFT p99 best-effort (s)", fmt_num(CELL, be[c].ttft_p99, 1, 3));
    ROW("TPOT p50 high (ms)", fmt_num(CELL, hi[c].tpot_p50, 1e3, 1));
    ROW("TPOT p99 high (ms)", fmt_num(CELL, hi[c].tpot_p99, 1e3, 1));
    ROW("TPOT p50 best-effort (ms)", fmt_num(CELL, be[c].tpot_p50, 1e3, 1));
    ROW("TPOT p99 best-effort (ms)", fmt_num(CELL, be[c].tpot_p99, 1e3, 1));
    char lbl[48];
    snprintf(lbl, sizeof lbl, "TTFT <= %.2g s, high", cfg->ttft_deadline_s);
    ROW(lbl, fmt_frac(CELL, hi[c].n_met, hi[c].n));
    snprintf(lbl, sizeof lbl, "TTFT <= %.2g s, best-effort (would)", cfg->ttft_deadline_s);
    ROW(lbl, fmt_frac(CELL, be[c].n_met, be[c].n));
    ROW("KV utilisation mean / peak (%)",
        snprintf(CELL, SERVE_CELL, "%.1f / %.1f", 100 * kv[c].util_mean, 100 * kv[c].util_peak));
    ROW("KV int. frag. mean / peak (% pool)",
        snprintf(CELL, SERVE_CELL, "%.2f / %.2f", 100 * kv[c].frag_mean, 100 * kv[c].frag_peak));
    ROW("  all groups, % of KV bytes",
        snprintf(CELL, SERVE_CELL, "%.2f / %.2f", 100 * kv[c].bound_mean, 100 * kv[c].bound_peak));
    ROW("  % of allocated slots", fmt_num(CELL, kv[c].frag_of_used, 100, 2));
    ROW("  blocks used / sum ceil(p/B)", {
        if (kv[c].check_ideal > 0) {
            snprintf(CELL, SERVE_CELL, "%.3f (%zu steps)",
                     (double)kv[c].check_used / (double)kv[c].check_ideal, kv[c].check_steps);
        } else {
            snprintf(CELL, SERVE_CELL, "-");
        }
    });
    ROW("prefix cache hits (tokens)",
        fmt_frac(CELL, (size_t)r->stats.prefix_hit_tokens, (size_t)r->stats.prefix_query_tokens));
    ROW("preemptions", snprintf(CELL, SERVE_CELL, "%lld", (long long)r->stats.preemptions));
    ROW("steps / mean step (ms)", {
        double busy = 0;
        for (size_t k = 0; k < r->n_steps; k++) busy += r->steps[k].dt_s;
        snprintf(CELL, SERVE_CELL, "%zu / %.1f", r->n_steps,
                 r->n_steps ? 1e3 * busy / (double)r->n_steps : 0.0);
    });
    ROW("submit lag mean / max (ms)",
        snprintf(CELL, SERVE_CELL, "%.1f / %.1f",
                 all[c].n ? 1e3 * r->sum_lag_s / (double)all[c].n : 0.0, 1e3 * r->max_lag_s));
#undef CELL
#undef ROW

    /* Consistency: what the engine counted against what the driver saw. */
    for (size_t c = 0; c < n; c++) {
        const serve_run *r = &runs[c];
        size_t short_reqs = 0;
        for (size_t i = 0; i < r->n; i++) {
            if (r->recs[i].submitted && !r->recs[i].failed &&
                r->recs[i].n_tokens != r->w->reqs[i].max_tokens)
                short_reqs++;
        }
        bool ok = r->stats.tokens_generated == tok[c] &&
                  r->stats.requests_finished == (int64_t)(all[c].n) &&
                  r->stats.kv_blocks_used == 0 && short_reqs == 0 && r->status == LOOM_OK;
        if (!ok) {
            printf("\nWARNING [%s]: engine tokens_generated %lld vs %lld seen; "
                   "requests_finished %lld vs %zu; kv_blocks_used at the end %d; "
                   "%zu requests with a token count other than drawn; run status %s\n",
                   r->label, (long long)r->stats.tokens_generated, (long long)tok[c],
                   (long long)r->stats.requests_finished, all[c].n, r->stats.kv_blocks_used,
                   short_reqs, loom_status_str(r->status));
        }
    }
    free(scratch);
}

/* ---- closed loop --------------------------------------------------------------------------- */

void serve_report_closed(const serve_run *runs, size_t n) {
    if (n > SERVE_MAX_COLS) n = SERVE_MAX_COLS;
    double *scratch = alloc_scratch(runs, n);
    if (!scratch) return;
    table_row row;
    memset(&row, 0, sizeof row);
    snprintf(row.label, sizeof row.label, "metric");
    for (size_t c = 0; c < n; c++) snprintf(row.cell[c], SERVE_CELL, "%s", runs[c].label);
    print_row(&row, n);
    print_rule(n);
    double agg[SERVE_MAX_COLS], dec[SERVE_MAX_COLS], dec_ms[SERVE_MAX_COLS], seqs[SERVE_MAX_COLS];
    int64_t tok[SERVE_MAX_COLS], dec_steps[SERVE_MAX_COLS];
    size_t started[SERVE_MAX_COLS], finished[SERVE_MAX_COLS];
    class_metrics all[SERVE_MAX_COLS];
    for (size_t c = 0; c < n; c++) {
        const serve_run *r = &runs[c];
        double dec_t = 0, seq_w = 0, busy = 0;
        int64_t dec_tok = 0;
        tok[c] = dec_steps[c] = 0;
        for (size_t k = 0; k < r->n_steps; k++) {
            const serve_step_sample *s = &r->steps[k];
            tok[c] += s->n_tokens;
            busy += s->dt_s;
            seq_w += s->running * s->dt_s;
            if (!s->prefill) {
                dec_t += s->dt_s;
                dec_tok += s->n_tokens;
                dec_steps[c]++;
            }
        }
        agg[c] = r->wall_s > 0 ? (double)tok[c] / r->wall_s : NAN;
        dec[c] = dec_t > 0 ? (double)dec_tok / dec_t : NAN;
        dec_ms[c] = dec_steps[c] ? 1e3 * dec_t / (double)dec_steps[c] : NAN;
        seqs[c] = busy > 0 ? seq_w / busy : NAN;
        started[c] = finished[c] = 0;
        for (size_t i = 0; i < r->n; i++) {
            if (!r->recs[i].submitted) continue;
            started[c]++;
            if (r->recs[i].done && r->recs[i].finish_s <= r->wall_s && !r->recs[i].failed)
                finished[c]++;
        }
        all[c] = class_stats(r, -1, INFINITY, scratch);
    }
#define CELL row.cell[c]
#define ROW(lbl, ...)                                                                              \
    do {                                                                                           \
        snprintf(row.label, sizeof row.label, "%s", lbl);                                          \
        for (size_t c = 0; c < n; c++) {                                                           \
            const serve_run *r = &runs[c];                                                         \
            (void)r;                                                                               \
            __VA_ARGS__;                                                                           \
        }                                                                                          \
        print_row(&row, n);                                                                        \
    } while (0)
    ROW("requests in flight", snprintf(CELL, SERVE_CELL, "%d", r->concurrency));
    ROW("window (s)", fmt_num(CELL, r->wall_s, 1, 1));
    ROW("requests started / finished",
        snprintf(CELL, SERVE_CELL, "%zu / %zu", started[c], finished[c]));
    ROW("generated tokens", snprintf(CELL, SERVE_CELL, "%lld", (long long)tok[c]));
    ROW("aggregate tok/s (all steps)", fmt_num(CELL, agg[c], 1, 2));
    ROW("  vs first column", fmt_num(CELL, agg[c] / agg[0], 1, 2));
    ROW("decode tok/s (decode-only steps)", fmt_num(CELL, dec[c], 1, 2));
    ROW("  vs first column", fmt_num(CELL, dec[c] / dec[0], 1, 2));
    ROW("decode-only steps / mean (ms)", {
        char ms[SERVE_NUM];
        fmt_num(ms, dec_ms[c], 1, 1);
        snprintf(CELL, SERVE_CELL, "%lld / %s", (long long)dec_steps[c], ms);
    });
    ROW("mean running sequences", fmt_num(CELL, seqs[c], 1, 2));
    ROW("TTFT p50 / p99 (s)", fmt_pair(CELL, all[c].ttft_p50, all[c].ttft_p99, 1, 3));
    ROW("TPOT p50 / p99 (ms), finished ones",
        fmt_pair(CELL, all[c].tpot_p50, all[c].tpot_p99, 1e3, 1));
    ROW("prefix cache hits (tokens)",
        fmt_frac(CELL, (size_t)r->stats.prefix_hit_tokens, (size_t)r->stats.prefix_query_tokens));
    ROW("preemptions", snprintf(CELL, SERVE_CELL, "%lld", (long long)r->stats.preemptions));
    ROW("cancelled at the end (bad)",
        snprintf(CELL, SERVE_CELL, "%d (%d)", r->n_cancelled, r->n_cancel_bad));
#undef CELL
#undef ROW
    for (size_t c = 0; c < n; c++) {
        const serve_run *r = &runs[c];
        if (r->stats.kv_blocks_used != 0 || r->n_cancel_bad != 0 || r->status != LOOM_OK) {
            printf("\nWARNING [%s]: kv_blocks_used at the end %d; %d cancellations went wrong; "
                   "run status %s\n",
                   r->label, r->stats.kv_blocks_used, r->n_cancel_bad, loom_status_str(r->status));
        }
    }
    free(scratch);
}
