// emu_summary.cpp — kernels/logits_summary.cu's summary_kernel, compiled from that file, run on
// the emulator (512 threads a row) against the host's summarizer, loom__sample_logits_summarize
// (src/sample/summary.c): rows of 17, 100, 5000 and 262144 logits with runs of ties (at the n-th
// place too), -inf and NaN masks, -0 beside +0, logits over the whole float range, a few finite
// entries, a +inf, none finite; 1, 40, 256 and 1024 candidates. The counts, arg max, maximum and
// top lists must be the host's exactly, the float64 sums within 1e-12 of them (relative), the
// output past each row's list untouched; and every schedule of the emulator must give the same
// bits (a row's summary depends on the row alone).
#include "logits_summary.cu"

#include <stdio.h>

#include <vector>

#include "emu_cases.h"

extern "C" {
#include "sample/chain.h"
}

namespace {

uint64_t g_rs;
uint64_t rnd() {
    g_rs ^= g_rs << 13, g_rs ^= g_rs >> 7, g_rs ^= g_rs << 17;
    return g_rs;
}
double unit() {
    return (double)(rnd() >> 11) * 0x1p-53;
}
float normal() { /* Box-Muller: logits look roughly normal */
    const double u = unit() + 0x1p-60, v = unit();
    return (float)(sqrt(-2 * log(u)) * cos(6.283185307179586 * v));
}

enum row_kind {
    TIES,        // values on a grid of 1/4 (long runs of equal logits), 10% -inf, 5% NaN, +-0
    WIDE,        // random finite float bit patterns: every exponent, both signs
    FEW_FINITE,  // 3 finite entries among -inf and NaN
    ONE_FINITE,  // 1
    POS_INF,     // TIES with two +inf
    NONE_FINITE, // -inf and NaN only
    ALL_EQUAL,   // one value everywhere: the list is the lowest ids
};
const char *const kind_names[] = {"ties", "wide",        "few finite", "one finite",
                                  "+inf", "none finite", "all equal"};

void fill_row(float *x, int V, row_kind k, uint64_t seed) {
    g_rs = 0x853c49e6748fea9bull ^ (seed * 0x9e3779b97f4a7c15ull);
    for (int i = 0; i < V; i++) {
        const uint64_t r = rnd() % 100;
        float v;
        switch (k) {
        case TIES:
        case POS_INF:
            v = r < 10 ? -INFINITY : r < 15 ? NAN : roundf(normal() * 12) / 4;
            if (v == 0.0f) v = (rnd() & 1) ? -0.0f : 0.0f;
            break;
        case WIDE: {
            uint32_t u = (uint32_t)rnd();
            if ((u & 0x7f800000u) == 0x7f800000u) u ^= 0x00800000u; /* finite (TIES has masks) */
            v = __uint_as_float(u);
            break;
        }
        case ALL_EQUAL:
            v = 1.5f;
            break;
        default:
            v = r < 50 ? -INFINITY : NAN;
            break;
        }
        x[i] = v;
    }
    if (k == FEW_FINITE) x[V / 3] = 2.0f, x[V - 1] = -1.0f, x[7] = 2.0f;
    if (k == ONE_FINITE) x[V / 2] = -3.5f;
    if (k == POS_INF) x[V / 5] = INFINITY, x[V / 2] = INFINITY;
}

bool bits_equal(float a, float b) {
    return memcmp(&a, &b, sizeof a) == 0;
}

bool close(double got, double want) {
    return got == want || fabs(got - want) <= 1e-12 * fabs(want);
}

// The kernel over rows of the given kinds, once under each of the emulator's schedules; the
// first run is checked against the host, the others must give its bits. Returns the failures
// (printed).
int run_launch(int V, int n_top, const std::vector<row_kind> &kinds, bool verbose) {
    const int n_rows = (int)kinds.size();
    /* rows with a gap after each, filled with +inf: a read past the row's end would count it */
    const int stride = V + 48;
    std::vector<float> x((size_t)n_rows * stride, INFINITY);
    for (int r = 0; r < n_rows; r++)
        fill_row(&x[(size_t)r * stride], V, kinds[r], (uint64_t)r * 7919 + (uint64_t)V);
    std::vector<loom_logit_summary> sum(n_rows), sum0;
    std::vector<loom_logit_cand> top((size_t)n_rows * n_top), top0;
    for (int order = 3; order >= 0; order--) {
        memset(sum.data(), 0xa5, sum.size() * sizeof sum[0]);
        for (loom_logit_cand &t : top) t = loom_logit_cand{NAN, -7};
        summary_args a;
        a.x = x.data();
        a.x_stride = (size_t)stride * sizeof(float);
        a.n_vocab = V;
        a.n_top = n_top;
        a.sum = sum.data();
        a.top = top.data();
        loom_emu::launch_options opt;
        opt.order = (loom_emu::schedule)order;
        opt.seed = (uint64_t)V * 31 + (uint64_t)n_top;
        loom_emu::launch(
            dim3((unsigned)n_rows), dim3(SUM_THREADS), 0, [&a] { summary_kernel(a); }, opt);
        if (order == 3) {
            sum0 = sum;
            top0 = top;
        } else if (memcmp(sum.data(), sum0.data(), sum.size() * sizeof sum[0]) != 0 ||
                   memcmp(top.data(), top0.data(), top.size() * sizeof top[0]) != 0) {
            printf("FAIL logits_summary V=%d n_top=%d: schedules %d and 3 give different bits\n", V,
                   n_top, order);
            return 1;
        }
    }

    int bad = 0;
    std::vector<loom_logit_cand> want(n_top);
    for (int r = 0; r < n_rows; r++) {
        loom_logit_summary ws;
        loom__sample_logits_summarize(&x[(size_t)r * stride], V, n_top, &ws, want.data());
        const loom_logit_summary &gs = sum[r];
        const loom_logit_cand *gt = &top[(size_t)r * n_top];
        char what[320] = "";
        if (gs.n_finite != ws.n_finite || gs.n_posinf != ws.n_posinf || gs.n_top != ws.n_top)
            snprintf(what, sizeof what, "counts: finite %d (want %d), +inf %d (%d), list %d (%d)",
                     gs.n_finite, ws.n_finite, gs.n_posinf, ws.n_posinf, gs.n_top, ws.n_top);
        else if (gs.argmax != ws.argmax || !(gs.max == ws.max))
            snprintf(what, sizeof what, "argmax %d (want %d), max %.9g (%.9g)", gs.argmax,
                     ws.argmax, gs.max, ws.max);
        else if (!close(gs.sum, ws.sum) || !close(gs.entropy, ws.entropy) ||
                 !close(gs.varentropy, ws.varentropy))
            snprintf(what, sizeof what, "sums: S %.17g (%.17g), H %.17g (%.17g), V %.17g (%.17g)",
                     gs.sum, ws.sum, gs.entropy, ws.entropy, gs.varentropy, ws.varentropy);
        else {
            for (int i = 0; i < ws.n_top && !what[0]; i++)
                if (gt[i].id != want[i].id || !bits_equal(gt[i].logit, want[i].logit))
                    snprintf(what, sizeof what, "list[%d]: id %d logit %.9g (want %d, %.9g)", i,
                             gt[i].id, (double)gt[i].logit, want[i].id, (double)want[i].logit);
            for (int i = ws.n_top; i < n_top && !what[0]; i++)
                if (gt[i].id != -7)
                    snprintf(what, sizeof what, "list[%d] written past the list", i);
        }
        if (what[0]) {
            printf("FAIL logits_summary V=%d n_top=%d row %d (%s): %s\n", V, n_top, r,
                   kind_names[kinds[r]], what);
            bad++;
        }
    }
    if (verbose)
        printf("  logits_summary V=%6d n_top=%4d: %d rows, 4 schedules: %s\n", V, n_top, n_rows,
               bad ? "FAILED" : "ok");
    return bad;
}

/* The sampler's edits (edit_kernel) on rows of kind TIES (NaN among them) and WIDE, then the
 * summary of the edited rows: every logit of each edited row bit for bit the host summarizer's
 * edited copy (loom__sample_logits_summarize_edited: the chain's own arithmetic), each entry's
 * raw value, and the edited rows' summaries. A bias list with a ban, a boost, an id twice and
 * an id on a NaN; penalties over distinct ids with counts; both on a third row. */
int run_edits(bool verbose) {
    const int V = 3000, stride = V + 16, n_rows = 3, n_top = 64;
    std::vector<float> x((size_t)n_rows * stride, INFINITY);
    for (int r = 0; r < n_rows; r++)
        fill_row(&x[(size_t)r * stride], V, r == 1 ? WIDE : TIES, 977u + (uint64_t)r);
    int nan_id = 0;
    while (x[(size_t)nan_id] == x[(size_t)nan_id]) nan_id++; /* row 0's first NaN */
    const loom_logit_bias bias[5] = {
        {5, -INFINITY}, {17, 3.5f}, {17, -0.75f}, {(int32_t)nan_id, 2.0f}, {2999, 1e30f}};
    const int32_t pen_id[4] = {17, 40, 41, 2000}, pen_count[4] = {3, 1, 2, 5};
    loom_logit_edits e[n_rows] = {};
    e[0].bias = bias;
    e[0].n_bias = 4;
    e[1].n_pen = 4;
    e[1].pen_id = pen_id;
    e[1].pen_count = pen_count;
    e[1].repeat_penalty = 1.3f;
    e[1].presence_penalty = 0.4f;
    e[1].frequency_penalty = 0.3f;
    e[2] = e[1];
    e[2].bias = bias;
    e[2].n_bias = 5;
    /* the flattened form the host op packs (cuda_ops.c) */
    std::vector<int32_t> off(n_rows + 1);
    std::vector<loom__k_logit_edit> ent;
    std::vector<float> pen(3 * n_rows);
    for (int r = 0; r < n_rows; r++) {
        off[r] = (int32_t)ent.size();
        for (int j = 0; j < e[r].n_bias; j++)
            ent.push_back(loom__k_logit_edit{e[r].bias[j].id, 0, e[r].bias[j].bias});
        for (int j = 0; j < e[r].n_pen; j++)
            ent.push_back(loom__k_logit_edit{e[r].pen_id[j], e[r].pen_count[j], 0.0f});
        pen[3 * r] = e[r].repeat_penalty;
        pen[3 * r + 1] = e[r].presence_penalty;
        pen[3 * r + 2] = e[r].frequency_penalty;
    }
    off[n_rows] = (int32_t)ent.size();
    std::vector<float> edited = x, raw((size_t)n_rows * LOOM_LOGIT_SUMMARY_MAX_EDITS, NAN);
    edit_args a = {edited.data(), (size_t)stride * sizeof(float),
                   off.data(),    ent.data(),
                   pen.data(),    raw.data()};
    loom_emu::launch(
        dim3((unsigned)n_rows), dim3(32), 0, [&a] { edit_kernel(a); }, loom_emu::launch_options());
    std::vector<loom_logit_summary> sum(n_rows);
    std::vector<loom_logit_cand> top((size_t)n_rows * n_top);
    summary_args sa;
    sa.x = edited.data();
    sa.x_stride = (size_t)stride * sizeof(float);
    sa.n_vocab = V;
    sa.n_top = n_top;
    sa.sum = sum.data();
    sa.top = top.data();
    loom_emu::launch(
        dim3((unsigned)n_rows), dim3(SUM_THREADS), 0, [&sa] { summary_kernel(sa); },
        loom_emu::launch_options());
    int bad = 0;
    std::vector<float> scratch(V), want_raw(LOOM_LOGIT_SUMMARY_MAX_EDITS);
    std::vector<loom_logit_cand> wt(n_top), rwt(n_top);
    for (int r = 0; r < n_rows; r++) {
        loom_logit_summary ws, rws;
        loom__sample_logits_summarize_edited(&x[(size_t)r * stride], V, n_top, &e[r],
                                             scratch.data(), &ws, wt.data(), &rws, rwt.data(),
                                             want_raw.data());
        const float *got = &edited[(size_t)r * stride];
        for (int i = 0; i < V; i++) {
            /* the kernel leaves untouched NaN as NaN (the summary counts it as -inf); the
             * host's copy does too */
            if (!bits_equal(got[i], scratch[(size_t)i])) {
                printf("FAIL logit edits row %d: logit %d is %.9g, host %.9g\n", r, i,
                       (double)got[i], (double)scratch[(size_t)i]);
                bad++;
                break;
            }
        }
        const int m = e[r].n_bias + e[r].n_pen;
        for (int j = 0; j < m; j++)
            if (!bits_equal(raw[(size_t)r * LOOM_LOGIT_SUMMARY_MAX_EDITS + j], want_raw[j])) {
                printf("FAIL logit edits row %d: entry %d's raw value differs\n", r, j);
                bad++;
            }
        const loom_logit_summary &gs = sum[r];
        if (gs.n_finite != ws.n_finite || gs.n_posinf != ws.n_posinf || gs.argmax != ws.argmax ||
            !(gs.max == ws.max || gs.n_posinf > 0) || gs.n_top != ws.n_top ||
            (gs.n_posinf == 0 && !close(gs.sum, ws.sum)) ||
            memcmp(&top[(size_t)r * n_top], wt.data(), sizeof wt[0] * (size_t)ws.n_top) != 0) {
            printf("FAIL logit edits row %d: the edited row's summary differs\n", r);
            bad++;
        }
    }
    if (verbose)
        printf("  logit edits: %d rows (bias, penalties, both), then their summaries: %s\n", n_rows,
               bad ? "FAILED" : "ok");
    return bad;
}

} // namespace

namespace emu_summary {

int run_all(bool verbose) {
    const std::vector<row_kind> small = {TIES,    WIDE,        FEW_FINITE, ONE_FINITE,
                                         POS_INF, NONE_FINITE, ALL_EQUAL};
    const std::vector<row_kind> large = {TIES, WIDE};
    const int tops[] = {1, 40, 256, 1024};
    int bad = 0;
    for (int n_top : tops) {
        bad += run_launch(5000, n_top, small, verbose);
        bad += run_launch(100, n_top, {TIES, WIDE, ALL_EQUAL}, verbose);
        bad += run_launch(17, n_top, {TIES, FEW_FINITE, ALL_EQUAL, NONE_FINITE}, verbose);
        bad += run_launch(262144, n_top, large, verbose);
    }
    bad += run_edits(verbose);
    return bad;
}

} // namespace emu_summary
