/* loom-serve-bench — a seeded load generator that replays a synthetic serving workload against
 * a loom engine in one process (the main thread runs the step loop and submits requests).
 *
 *   loom-serve-bench -m MODEL [workload options] [engine options]
 *       one open-loop run at --rate (priority scheduler, or --fcfs)
 *   loom-serve-bench -m MODEL --saturation [...]
 *       measures the saturation rate with a burst of --burst requests at t = 0, then runs the
 *       workload at 70% and 95% of it (--loads), each with the priority scheduler and with
 *       FCFS, and prints the four tables side by side
 *   loom-serve-bench -m MODEL --concurrency 1,16 [...]
 *       closed loop: N requests in flight for --duration seconds; aggregate decode tokens/s
 *
 * Everything is drawn from --seed (serve_workload.c); see bench/README.md for the metrics. */
#define _POSIX_C_SOURCE 200809L

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "serve.h"

#define SERVE_MAX_LOADS 4

static void usage(FILE *f) {
    fprintf(f, "usage: loom-serve-bench -m MODEL [options]\n"
               "modes (default: one open-loop run at --rate):\n"
               "  --saturation          burst to find the saturation rate, then --loads of it,\n"
               "                        each with the priority scheduler and with FCFS\n"
               "  --sat-rate R          skip the burst: use R req/s as the saturation rate\n"
               "  --burst N             requests of the saturation burst (default 64)\n"
               "  --loads L1,L2,...     fractions of saturation to run (default 0.7,0.95)\n"
               "  --concurrency N[,M]   closed loop: N requests in flight for --duration s\n"
               "  --fcfs                single run: plain FCFS instead of the priority scheduler\n"
               "workload (all drawn from --seed):\n"
               "  --seed S              (default 1)\n"
               "  --rate R              Poisson arrivals, requests/s (default 1)\n"
               "  --duration S          arrivals during S seconds (default 60)\n"
               "  --requests N          exactly N arrivals instead of --duration\n"
               "  --prompt-len SPEC     own prompt tokens (default lognormal:64:0.5:8:256)\n"
               "  --output-len SPEC     generated tokens (default lognormal:32:0.5:4:128)\n"
               "                        SPEC: N | uniform:LO:HI | lognormal:MEDIAN:SIGMA[:LO:HI]\n"
               "  --shared-prefix-frac F  fraction starting with the shared prefix (default 0.5)\n"
               "  --prefix-len N        tokens of the shared prefix (default 128)\n"
               "  --high-frac F         fraction in the high class (default 0.3)\n"
               "  --ttft-deadline S     TTFT deadline of the high class (default 2)\n"
               "engine:\n"
               "  -t THREADS            compute threads (default: all cores)\n"
               "  --kv-mb MB            KV-cache budget (default 64)\n"
               "  --max-seqs N  --max-batched-tokens N  --block-size N   (engine defaults)\n"
               "  --max-ctx N           positions per request (default: the longest request the\n"
               "                        distributions can draw, at most the model's context)\n"
               "  --no-prefix-cache     turn the prefix cache off\n"
               "  -v                    progress lines on stderr every 5 s\n");
}

/* ---- option parsing ------------------------------------------------------------------------ */

static const char *str_arg(int argc, char **argv, int *i) {
    if (*i + 1 >= argc) {
        fprintf(stderr, "loom-serve-bench: %s needs a value\n", argv[*i]);
        exit(2);
    }
    return argv[++*i];
}

static double num_arg(int argc, char **argv, int *i, double lo, double hi) {
    const char *flag = argv[*i];
    const char *s = str_arg(argc, argv, i);
    char *end = NULL;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end || !(v >= lo && v <= hi)) {
        fprintf(stderr, "loom-serve-bench: %s: expected a number in [%g, %g], got %s\n", flag, lo,
                hi, s);
        exit(2);
    }
    return v;
}

/* Parses "a,b,c" into out[0..cap); returns the count. */
static int list_arg(int argc, char **argv, int *i, double *out, int cap, double lo, double hi) {
    const char *flag = argv[*i];
    const char *s = str_arg(argc, argv, i);
    int n = 0;
    while (*s) {
        char *end = NULL;
        double v = strtod(s, &end);
        if (end == s || n == cap || !(v >= lo && v <= hi) || (*end && *end != ',')) {
            fprintf(stderr, "loom-serve-bench: %s: bad list %s (at most %d values in [%g, %g])\n",
                    flag, argv[*i], cap, lo, hi);
            exit(2);
        }
        out[n++] = v;
        s = *end ? end + 1 : end;
    }
    return n;
}

static void dist_arg(int argc, char **argv, int *i, serve_dist *out) {
    const char *flag = argv[*i];
    const char *s = str_arg(argc, argv, i);
    if (!serve_dist_parse(s, out)) {
        fprintf(stderr,
                "loom-serve-bench: %s: bad length spec %s (N, uniform:LO:HI or "
                "lognormal:MEDIAN:SIGMA[:LO:HI])\n",
                flag, s);
        exit(2);
    }
}

typedef struct serve_opts {
    serve_config cfg;
    double sat_rate;
    double loads[SERVE_MAX_LOADS];
    int n_loads;
    bool fcfs;
} serve_opts;

static void parse_args(int argc, char **argv, serve_opts *o) {
    serve_config *c = &o->cfg;
    memset(o, 0, sizeof *o);
    c->seed = 1;
    c->rate = 1.0;
    c->duration_s = 60;
    serve_dist_parse("lognormal:64:0.5:8:256", &c->prompt_len);
    serve_dist_parse("lognormal:32:0.5:4:128", &c->output_len);
    c->shared_prefix_frac = 0.5;
    c->prefix_len = 128;
    c->high_frac = 0.3;
    c->ttft_deadline_s = 2.0;
    c->kv_bytes = (int64_t)64 << 20;
    c->burst = 64;
    o->loads[0] = 0.70;
    o->loads[1] = 0.95;
    o->n_loads = 2;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            exit(0);
        } else if (!strcmp(a, "-m")) {
            c->model_path = str_arg(argc, argv, &i);
        } else if (!strcmp(a, "-t")) {
            c->n_threads = (int)num_arg(argc, argv, &i, 0, 1024);
        } else if (!strcmp(a, "--seed")) {
            c->seed = (uint64_t)num_arg(argc, argv, &i, 0, 9007199254740992.0);
        } else if (!strcmp(a, "--rate")) {
            c->rate = num_arg(argc, argv, &i, 1e-6, 1e6);
        } else if (!strcmp(a, "--duration")) {
            c->duration_s = num_arg(argc, argv, &i, 0.01, 1e6);
        } else if (!strcmp(a, "--requests")) {
            c->n_requests = (int32_t)num_arg(argc, argv, &i, 1, 1e6);
        } else if (!strcmp(a, "--prompt-len")) {
            dist_arg(argc, argv, &i, &c->prompt_len);
        } else if (!strcmp(a, "--output-len")) {
            dist_arg(argc, argv, &i, &c->output_len);
        } else if (!strcmp(a, "--shared-prefix-frac")) {
            c->shared_prefix_frac = num_arg(argc, argv, &i, 0, 1);
        } else if (!strcmp(a, "--prefix-len")) {
            c->prefix_len = (int32_t)num_arg(argc, argv, &i, 0, 1 << 20);
        } else if (!strcmp(a, "--high-frac")) {
            c->high_frac = num_arg(argc, argv, &i, 0, 1);
        } else if (!strcmp(a, "--ttft-deadline")) {
            c->ttft_deadline_s = num_arg(argc, argv, &i, 1e-3, 1e6);
        } else if (!strcmp(a, "--kv-mb")) {
            c->kv_bytes = (int64_t)(num_arg(argc, argv, &i, 0, 1 << 24) * (1 << 20));
        } else if (!strcmp(a, "--max-seqs")) {
            c->max_seqs = (int32_t)num_arg(argc, argv, &i, 1, 4096);
        } else if (!strcmp(a, "--max-batched-tokens")) {
            c->max_batched_tokens = (int32_t)num_arg(argc, argv, &i, 1, 65536);
        } else if (!strcmp(a, "--block-size")) {
            c->block_size = (int32_t)num_arg(argc, argv, &i, 1, 1024);
        } else if (!strcmp(a, "--max-ctx")) {
            c->max_ctx = (int32_t)num_arg(argc, argv, &i, 1, 1 << 20);
        } else if (!strcmp(a, "--no-prefix-cache")) {
            c->no_prefix_cache = true;
        } else if (!strcmp(a, "--saturation")) {
            c->saturation = true;
        } else if (!strcmp(a, "--sat-rate")) {
            o->sat_rate = num_arg(argc, argv, &i, 1e-6, 1e6);
            c->saturation = true;
        } else if (!strcmp(a, "--burst")) {
            c->burst = (int32_t)num_arg(argc, argv, &i, 1, 1e6);
        } else if (!strcmp(a, "--loads")) {
            o->n_loads = list_arg(argc, argv, &i, o->loads, SERVE_MAX_LOADS, 0.01, 10);
        } else if (!strcmp(a, "--concurrency")) {
            double v[8];
            c->n_concurrency = list_arg(argc, argv, &i, v, 8, 1, 4096);
            for (int k = 0; k < c->n_concurrency; k++) c->concurrency[k] = (int32_t)v[k];
        } else if (!strcmp(a, "--fcfs")) {
            o->fcfs = true;
        } else if (!strcmp(a, "-v") || !strcmp(a, "--verbose")) {
            c->verbose = true;
        } else {
            fprintf(stderr, "loom-serve-bench: unknown option %s\n", a);
            usage(stderr);
            exit(2);
        }
    }
    if (!c->model_path) {
        fprintf(stderr, "loom-serve-bench: -m MODEL is required\n");
        usage(stderr);
        exit(2);
    }
    if (c->saturation && c->n_concurrency > 0) {
        fprintf(stderr, "loom-serve-bench: --saturation and --concurrency are separate modes\n");
        exit(2);
    }
}

/* ---- header -------------------------------------------------------------------------------- */

static void print_loadavg(const char *when) {
    FILE *f = fopen("/proc/loadavg", "r");
    char buf[128] = "";
    if (f) {
        if (!fgets(buf, sizeof buf, f)) buf[0] = 0;
        fclose(f);
    }
    buf[strcspn(buf, "\n")] = 0;
    printf("load average %s: %s\n", when, buf[0] ? buf : "(unknown)");
}

static void print_header(int argc, char **argv, const serve_config *c, const loom_model_info *mi,
                         const loom_engine_params *ep, const serve_workload *w) {
    printf("command:");
    for (int i = 0; i < argc; i++) printf(" %s", argv[i]);
    char threads[16] = "all cores";
    if (c->n_threads > 0) snprintf(threads, sizeof threads, "%d", c->n_threads);
    printf("\nloom %s; model %s (%s, %lld params, vocab %d); threads %s\n", loom_version(),
           mi->name[0] ? mi->name : c->model_path, mi->architecture, (long long)mi->n_params,
           mi->n_vocab, threads);
    char pl[64], ol[64];
    serve_dist_format(&c->prompt_len, pl, sizeof pl);
    serve_dist_format(&c->output_len, ol, sizeof ol);
    printf("workload: seed %llu; prompt %s (+%d BOS, +%d shared prefix for %.0f%%); output %s; "
           "high class %.0f%% (priority 1, TTFT deadline %.3g s); best-effort priority 0\n",
           (unsigned long long)c->seed, pl, w->n_head, c->prefix_len, 100 * c->shared_prefix_frac,
           ol, 100 * c->high_frac, c->ttft_deadline_s);
    printf("engine: kv %.1f MiB, block %d, max_seqs %d, max_batched_tokens %d, max_ctx %d, "
           "prefix cache %s\n",
           (double)ep->kv_bytes / (1 << 20), ep->block_size, ep->max_seqs, ep->max_batched_tokens,
           ep->max_ctx, ep->prefix_cache ? "on" : "off");
    if (w->n_clamped) printf("note: %d requests shortened to fit max_ctx\n", w->n_clamped);
}

/* ---- modes --------------------------------------------------------------------------------- */

static int mode_single(loom_model *model, const serve_opts *o, const loom_model_info *mi,
                       loom_engine_params ep, int argc, char **argv) {
    const serve_config *c = &o->cfg;
    serve_workload w;
    if (!serve_workload_make(c, mi, ep.max_ctx, c->rate, c->n_requests, c->duration_s, &w)) {
        fprintf(stderr, "loom-serve-bench: out of memory\n");
        return 1;
    }
    print_header(argc, argv, c, mi, &ep, &w);
    print_loadavg("at start");
    ep.fcfs = o->fcfs;
    serve_run run;
    memset(&run, 0, sizeof run);
    char label[32];
    snprintf(label, sizeof label, "%s @ %.3g/s", o->fcfs ? "fcfs" : "priority", c->rate);
    run.label = label;
    run.rate = c->rate;
    serve_run_open(model, &ep, &w, c, &run);
    printf("kv pool: %d blocks of %d tokens\n\n", run.stats.kv_blocks_total, ep.block_size);
    serve_report_open(c, &run, 1);
    print_loadavg("at end");
    int rc = run.status == LOOM_OK ? 0 : 1;
    serve_run_free(&run);
    serve_workload_free(&w);
    return rc;
}

static int mode_saturation(loom_model *model, const serve_opts *o, const loom_model_info *mi,
                           loom_engine_params ep, int argc, char **argv) {
    const serve_config *c = &o->cfg;
    serve_workload w;
    if (!serve_workload_make(c, mi, ep.max_ctx, 0, c->burst, 0, &w)) return 1;
    print_header(argc, argv, c, mi, &ep, &w);
    print_loadavg("at start");
    double sat = o->sat_rate;
    if (sat <= 0) {
        serve_run burst;
        memset(&burst, 0, sizeof burst);
        burst.label = "burst";
        loom_status st = serve_run_open(model, &ep, &w, c, &burst);
        int64_t tok = 0;
        size_t n_ok = 0;
        for (size_t i = 0; i < burst.n; i++) {
            tok += burst.recs[i].n_tokens;
            n_ok += burst.recs[i].done && !burst.recs[i].failed;
        }
        sat = burst.wall_s > 0 ? (double)n_ok / burst.wall_s : 0;
        printf("saturation: burst of %d requests at t = 0 (priority scheduler) finished in "
               "%.1f s: %.3f req/s, %.2f generated tok/s; %lld preemptions; kv pool %d blocks\n",
               c->burst, burst.wall_s, sat, (double)tok / burst.wall_s,
               (long long)burst.stats.preemptions, burst.stats.kv_blocks_total);
        serve_run_free(&burst);
        if (st != LOOM_OK || !(sat > 0)) {
            fprintf(stderr, "loom-serve-bench: no saturation rate measured\n");
            serve_workload_free(&w);
            return 1;
        }
    } else {
        printf("saturation: %.3f req/s given with --sat-rate\n", sat);
    }
    serve_workload_free(&w);

    serve_run runs[2 * SERVE_MAX_LOADS];
    char labels[2 * SERVE_MAX_LOADS][32];
    memset(runs, 0, sizeof runs);
    serve_workload ws[SERVE_MAX_LOADS];
    memset(ws, 0, sizeof ws);
    int rc = 0;
    for (int l = 0; l < o->n_loads; l++) {
        double rate = o->loads[l] * sat;
        if (!serve_workload_make(c, mi, ep.max_ctx, rate, c->n_requests, c->duration_s, &ws[l])) {
            rc = 1;
            break;
        }
        for (int f = 0; f < 2; f++) {
            serve_run *r = &runs[2 * l + f];
            snprintf(labels[2 * l + f], sizeof labels[0], "%s @ %.0f%%", f ? "fcfs" : "priority",
                     100 * o->loads[l]);
            r->label = labels[2 * l + f];
            r->rate = rate;
            loom_engine_params p = ep;
            p.fcfs = f == 1;
            fprintf(stderr, "loom-serve-bench: %s (%.3f req/s, %zu requests)...\n", r->label, rate,
                    ws[l].n);
            if (serve_run_open(model, &p, &ws[l], c, r) != LOOM_OK) rc = 1;
        }
    }
    printf("\n");
    for (int l = 0; l < o->n_loads && ws[l].reqs; l++) {
        printf("load %.0f%%: %.3f req/s offered, %zu requests%s\n", 100 * o->loads[l],
               o->loads[l] * sat, ws[l].n,
               ws[l].n_clamped ? " (some shortened to fit max_ctx)" : "");
    }
    printf("kv pool: %d blocks of %d tokens\n\n", runs[0].stats.kv_blocks_total, ep.block_size);
    serve_report_open(c, runs, (size_t)(2 * o->n_loads));
    printf("\n");
    print_loadavg("at end");
    for (int k = 0; k < 2 * o->n_loads; k++) serve_run_free(&runs[k]);
    for (int l = 0; l < o->n_loads; l++) serve_workload_free(&ws[l]);
    return rc;
}

static int mode_concurrency(loom_model *model, const serve_opts *o, const loom_model_info *mi,
                            loom_engine_params ep, int argc, char **argv) {
    const serve_config *c = &o->cfg;
    serve_workload w;
    /* Requests are taken in order; far more than a window can use. */
    if (!serve_workload_make(c, mi, ep.max_ctx, 0, 4096, 0, &w)) return 1;
    print_header(argc, argv, c, mi, &ep, &w);
    print_loadavg("at start");
    serve_run runs[8];
    char labels[8][32];
    memset(runs, 0, sizeof runs);
    int rc = 0;
    for (int k = 0; k < c->n_concurrency; k++) {
        snprintf(labels[k], sizeof labels[0], "%d in flight", c->concurrency[k]);
        runs[k].label = labels[k];
        fprintf(stderr, "loom-serve-bench: %s for %.0f s...\n", runs[k].label, c->duration_s);
        if (serve_run_closed(model, &ep, &w, c, c->concurrency[k], c->duration_s, &runs[k]) !=
            LOOM_OK)
            rc = 1;
    }
    printf("closed loop, %.0f s per level; kv pool %d blocks\n\n", c->duration_s,
           runs[0].stats.kv_blocks_total);
    serve_report_closed(runs, (size_t)c->n_concurrency);
    printf("\n");
    print_loadavg("at end");
    for (int k = 0; k < c->n_concurrency; k++) serve_run_free(&runs[k]);
    serve_workload_free(&w);
    return rc;
}

int main(int argc, char **argv) {
    serve_opts o;
    parse_args(argc, argv, &o);
    serve_config *c = &o.cfg;

    loom_model_params mp = loom_model_default_params();
    mp.n_threads = c->n_threads;
    loom_model *model = NULL;
    loom_status st = loom_model_load(c->model_path, &mp, &model);
    if (st != LOOM_OK) {
        fprintf(stderr, "loom-serve-bench: %s: %s: %s\n", c->model_path, loom_status_str(st),
                loom_last_error());
        return 1;
    }
    loom_model_info mi = {.size = sizeof mi};
    loom_model_get_info(model, &mi);

    loom_engine_params ep = serve_engine_params(c, &mi);

    int rc;
    if (c->n_concurrency > 0) {
        rc = mode_concurrency(model, &o, &mi, ep, argc, argv);
    } else if (c->saturation) {
        rc = mode_saturation(model, &o, &mi, ep, argc, argv);
    } else {
        rc = mode_single(model, &o, &mi, ep, argc, argv);
    }
    loom_model_free(model);
    return rc;
}
