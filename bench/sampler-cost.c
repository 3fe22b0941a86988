/* loom-sampler-cost — what the whole sampler chain costs next to one decode step, on a real
 * model's logits (issue 4's target: < 3% of a decode step on the CPU backend, with entropy
 * correction and top-20 logprobs on).
 *
 *   loom-sampler-cost MODEL [-t THREADS] [-n DECODE_STEPS] [-r SAMPLER_CALLS] [-p PROMPT]
 *
 * Decodes PROMPT, then 3 warm-up and DECODE_STEPS (default 30) single tokens greedily, timing
 * each loom_session_decode call. After each step it validates the chain on that step's logits
 * (greedy gives the arg max; logprob_raw and the raw top-20 agree with a float64 log-softmax)
 * and times loom__sample_chain_run on them ceil(SAMPLER_CALLS / DECODE_STEPS) times per
 * configuration (SAMPLER_CALLS default 200): interleaving keeps the decode and sampler timings
 * under the same load on a shared machine. Prints the median and p90 per call and the median
 * as a share of the median decode step. The sampler runs on one thread, as in the engine.
 * The chain is internal (src/sample/chain.h), so this links the static library, as the
 * tests do. */
#define _POSIX_C_SOURCE 200809L

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/timer.h"
#include "loom.h"
#include "sample/chain.h"

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* q-quantile of v[0..n) (sorts v). */
static double quantile(double *v, int n, double q) {
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    int i = (int)(q * (n - 1) + 0.5);
    return v[i];
}

static void die(const char *what, loom_status st) {
    fprintf(stderr, "loom-sampler-cost: %s: %s: %s\n", what, loom_status_str(st),
            loom_last_error());
    exit(1);
}

typedef struct bench_cfg {
    const char *name;
    loom__sample_chain_config c;
} bench_cfg;

/* ---- validation against float64 ---------------------------------------------------------- */

static int validate(loom__sample_chain_ws *ws, const float *lg, int32_t nv) {
    double m = -INFINITY, s = 0;
    int32_t arg = 0;
    for (int32_t i = 0; i < nv; i++)
        if (lg[i] > m) m = lg[i], arg = i;
    for (int32_t i = 0; i < nv; i++) s += exp((double)lg[i] - m);
    double lse = m + log(s);

    loom__sample_chain_config c = loom__sample_chain_default_config();
    c.temperature = 0;
    c.n_logprobs = 20;
    loom__sample_chain_logprob top_raw[20], top_final[20];
    loom__sample_chain_result r = {.top_raw = top_raw, .top_final = top_final};
    loom_status st = loom__sample_chain_run(ws, &c, lg, NULL, 0, 0, &r);
    if (st != LOOM_OK) die("validate", st);
    int bad = 0;
    if (r.token != arg) {
        fprintf(stderr, "validate: greedy gave %d, arg max is %d\n", r.token, arg);
        bad = 1;
    }
    double want = (double)lg[arg] - lse;
    if (fabs(r.logprob_raw - want) > 1e-5 * (1 + fabs(want))) {
        fprintf(stderr, "validate: logprob_raw %.8g, float64 %.8g\n", r.logprob_raw, want);
        bad = 1;
    }
    for (int32_t i = 0; i < r.n_top_raw; i++) {
        double w = (double)lg[top_raw[i].id] - lse;
        if (fabs(top_raw[i].logprob - w) > 1e-5 * (1 + fabs(w)) ||
            (i > 0 && top_raw[i].logprob > top_raw[i - 1].logprob)) {
            fprintf(stderr, "validate: top_raw[%d] = (%d, %.8g), float64 %.8g\n", i, top_raw[i].id,
                    top_raw[i].logprob, w);
            bad = 1;
        }
    }
    return bad;
}

/* ---- main -------------------------------------------------------------------------------- */

int main(int argc, char **argv) {
    const char *model_path = NULL;
    const char *prompt = "The history of weaving begins in the Neolithic, when people first "
                         "twisted plant fibres into thread and";
    int n_threads = 2, n_steps = 30, n_calls = 200;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-t") && i + 1 < argc)
            n_threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "-n") && i + 1 < argc)
            n_steps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "-r") && i + 1 < argc)
            n_calls = atoi(argv[++i]);
        else if (!strcmp(argv[i], "-p") && i + 1 < argc)
            prompt = argv[++i];
        else if (argv[i][0] != '-' && !model_path)
            model_path = argv[i];
        else {
            fprintf(stderr, "usage: loom-sampler-cost MODEL [-t THREADS] [-n DECODE_STEPS] "
                            "[-r SAMPLER_CALLS] [-p PROMPT]\n");
            return 2;
        }
    }
    if (!model_path || n_threads < 1 || n_steps < 1 || n_calls < 1) {
        fprintf(stderr, "loom-sampler-cost: a model path and positive counts are needed\n");
        return 2;
    }

    loom_model_params mp = loom_model_default_params();
    mp.n_threads = n_threads;
    loom_model *m = NULL;
    loom_status st = loom_model_load(model_path, &mp, &m);
    if (st != LOOM_OK) die("load", st);
    loom_model_info info = {.size = sizeof info};
    loom_model_get_info(m, &info);
    const int32_t nv = info.n_vocab;
    loom_session *s = NULL;
    st = loom_session_create(m, NULL, &s);
    if (st != LOOM_OK) die("session", st);

    loom_token toks[512];
    size_t n_prompt = 0;
    st = loom_tokenize(m, prompt, strlen(prompt), LOOM_TOKENIZE_ADD_SPECIAL, toks, 512, &n_prompt);
    if (st != LOOM_OK) die("tokenize", st);
    st = loom_session_decode(s, toks, (int32_t)n_prompt, false);
    if (st != LOOM_OK) die("prompt", st);

    /* The chain's workspace and configurations. */
    size_t ws_size = loom__sample_chain_workspace_size(nv);
    void *ws_mem = aligned_alloc(16, (ws_size + 15) / 16 * 16);
    loom__sample_chain_ws *ws = NULL;
    if (!ws_mem) return 1;
    st = loom__sample_chain_workspace_init(ws_mem, ws_size, nv, &ws);
    if (st != LOOM_OK) die("workspace", st);
    /* A penalty window of real history: the prompt's tokens. */
    loom__sample_chain_config base = loom__sample_chain_default_config();
    base.n_logprobs = 20;
    base.repeat_penalty = 1.1f;
    base.penalty_last_n = 64;
    bench_cfg cfgs[8];
    int n_cfg = 0;
    cfgs[n_cfg] = (bench_cfg){"EXP, top-k 40, top-p 0.95", base};
    cfgs[n_cfg++].c.entropy_mode = LOOM_ENTROPY_EXP;
    cfgs[n_cfg] = (bench_cfg){"EDT, top-k 40, top-p 0.95", base};
    cfgs[n_cfg++].c.entropy_mode = LOOM_ENTROPY_EDT;
    cfgs[n_cfg] = (bench_cfg){"EXP, top-k off, top-p 0.95", base};
    cfgs[n_cfg].c.entropy_mode = LOOM_ENTROPY_EXP;
    cfgs[n_cfg++].c.top_k = 0;
    cfgs[n_cfg] = (bench_cfg){"EDT, top-k off, top-p 0.95", base};
    cfgs[n_cfg].c.entropy_mode = LOOM_ENTROPY_EDT;
    cfgs[n_cfg++].c.top_k = 0;
    cfgs[n_cfg] = (bench_cfg){"EDT, top-k off, top-p 0.95, min-p 0.05, typical 0.9", base};
    cfgs[n_cfg].c.entropy_mode = LOOM_ENTROPY_EDT;
    cfgs[n_cfg].c.top_k = 0;
    cfgs[n_cfg].c.min_p = 0.05f;
    cfgs[n_cfg++].c.typical_p = 0.9f;
    cfgs[n_cfg] = (bench_cfg){"EDT, top-k 40, top-p 0.95, no penalty", base};
    cfgs[n_cfg].c.entropy_mode = LOOM_ENTROPY_EDT;
    cfgs[n_cfg++].c.repeat_penalty = 1.0f;
    cfgs[n_cfg] = (bench_cfg){"greedy (temperature 0)", base};
    cfgs[n_cfg++].c.temperature = 0;

    /* 1-3. Decode steps (greedy), each followed by the chain on its logits: validation, then
     * reps calls per configuration, so that the decode and the sampler timings see the same
     * load on a shared machine. */
    const int warm = 3, reps = (n_calls + n_steps - 1) / n_steps;
    double *t_dec = malloc((size_t)n_steps * sizeof *t_dec);
    double *t_smp = malloc((size_t)n_cfg * (size_t)n_steps * (size_t)reps * sizeof *t_smp);
    if (!t_dec || !t_smp) return 1;
    loom__sample_chain_logprob top_raw[20], top_final[20];
    const float *lg = loom_session_logits(s, -1);
    for (int k = -warm; k < n_steps; k++) {
        loom_token next = 0;
        for (int32_t i = 1; i < nv; i++)
            if (lg[i] > lg[next]) next = i;
        double t0 = loom__now_ms();
        st = loom_session_decode(s, &next, 1, false);
        double t1 = loom__now_ms();
        if (st != LOOM_OK) die("decode", st);
        lg = loom_session_logits(s, -1);
        if (validate(ws, lg, nv)) {
            fprintf(stderr, "loom-sampler-cost: validation failed; no timings\n");
            return 1;
        }
        if (k < 0) continue;
        t_dec[k] = t1 - t0;
        for (int ci = 0; ci < n_cfg; ci++) {
            for (int r = 0; r < reps; r++) {
                loom__sample_chain_result res = {.top_raw = top_raw, .top_final = top_final};
                double a = loom__now_ms();
                st = loom__sample_chain_run(ws, &cfgs[ci].c, lg, toks, (int32_t)n_prompt,
                                            (uint64_t)(k * reps + r), &res);
                double b = loom__now_ms();
                if (st != LOOM_OK) die(cfgs[ci].name, st);
                t_smp[((size_t)ci * (size_t)n_steps + (size_t)k) * (size_t)reps + (size_t)r] =
                    (b - a) * 1e3;
            }
        }
    }
    double dec_med = quantile(t_dec, n_steps, 0.5), dec_p90 = quantile(t_dec, n_steps, 0.9);

    printf("loom-sampler-cost: %s (%s, vocabulary %d), %d threads\n", model_path, info.architecture,
           nv, n_threads);
    printf("decode step (1 token, median of %d): %.3f ms (p90 %.3f ms)\n", n_steps, dec_med,
           dec_p90);
    printf("validation against float64 on %d logit vectors: ok\n", n_steps + warm);
    printf("sampler: 20 raw + 20 final logprobs, repetition penalty 1.1 over the prompt (%zu "
           "tokens) unless noted; %d calls each, interleaved with the decode steps\n\n",
           n_prompt, n_steps * reps);
    printf("%-54s %10s %10s %9s\n", "sampler chain configuration", "median us", "p90 us",
           "of step");
    for (int ci = 0; ci < n_cfg; ci++) {
        double *t = t_smp + (size_t)ci * (size_t)n_steps * (size_t)reps;
        int nt = n_steps * reps;
        double med = quantile(t, nt, 0.5), p90 = quantile(t, nt, 0.9);
        printf("%-54s %10.1f %10.1f %8.2f%%\n", cfgs[ci].name, med, p90,
               100.0 * med / (dec_med * 1e3));
    }
    free(t_smp);
    free(ws_mem);
    free(t_dec);
    loom_session_free(s);
    loom_model_free(m);
    return 0;
}
