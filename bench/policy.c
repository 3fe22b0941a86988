/* policy.c — loom-policy-bench: options and main (see policy.h and bench/README.md). */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "policy.h"

static void usage(void) {
    fprintf(stderr,
            "usage: loom-policy-bench -m MODEL [options]\n"
            "  workload (loom-serve-bench's): --seed N (first seed, 1) --seeds K (5) --requests N\n"
            "    (300 per seed) --prompt-len SPEC --output-len SPEC --prefix-len N\n"
            "    --shared-prefix-frac F --high-frac F --ttft-deadline S\n"
            "  engine: -t THREADS --kv-mb MB --max-seqs N --max-batched-tokens N --block-size N\n"
            "    --starvation S\n"
            "  --loads 0.7,0.95,1.2,1.5   fractions of the capacity the simulator measures\n"
            "  --calib N                  requests of the calibration burst (64)\n"
            "  --cost BASE:TOKEN:CTX      step cost in microseconds (skips the calibration; needs\n"
            "                             --blocks N, the KV pool)\n"
            "  --confirm LOAD             then run the engine at LOAD x the burst's capacity,\n"
            "                             priority and FCFS interleaved (--confirm-seed 7,\n"
            "                             --confirm-requests 300, --confirm-rounds 2)\n"
            "  --misses                   list the priority policy's high-class misses (stderr)\n");
    exit(2);
}

static int parse_list(const char *s, double *v, int cap) {
    int n = 0;
    for (const char *p = s; *p && n < cap;) {
        char *end;
        v[n] = strtod(p, &end);
        if (end == p || !(v[n] > 0)) return -1;
        n++;
        p = *end == ',' ? end + 1 : end;
        if (*end && *end != ',') return -1;
    }
    return n;
}

static void parse_args(int argc, char **argv, policy_opts *o) {
    memset(o, 0, sizeof *o);
    serve_config *c = &o->cfg;
    c->n_threads = 0;
    c->seed = 1;
    c->n_requests = 300;
    serve_dist_parse("lognormal:96:0.5:16:256", &c->prompt_len);
    serve_dist_parse("lognormal:24:0.5:4:96", &c->output_len);
    c->shared_prefix_frac = 0.5;
    c->prefix_len = 64;
    c->high_frac = 0.3;
    c->ttft_deadline_s = 2.0;
    c->kv_bytes = 32ll << 20;
    c->max_seqs = 16;
    c->max_batched_tokens = 64;
    o->n_seeds = 5;
    o->n_loads = parse_list("0.7,0.95,1.2,1.5", o->loads, 8);
    o->calib_requests = 64;
    o->starvation_s = 30;
    o->confirm_seed = 7;
    o->confirm_requests = 300;
    o->confirm_rounds = 2;
    enum {
        O_SEED = 256,
        O_SEEDS,
        O_REQUESTS,
        O_PROMPT,
        O_OUTPUT,
        O_PREFIX,
        O_SHARED,
        O_HIGH,
        O_DEADLINE,
        O_KV,
        O_SEQS,
        O_TOKENS,
        O_BLOCK,
        O_STARVE,
        O_LOADS,
        O_CALIB,
        O_COST,
        O_BLOCKS,
        O_CONFIRM,
        O_CSEED,
        O_CREQ,
        O_CROUNDS,
        O_MISSES
    };
    static const struct option longs[] = {{"seed", 1, 0, O_SEED},
                                          {"seeds", 1, 0, O_SEEDS},
                                          {"requests", 1, 0, O_REQUESTS},
                                          {"prompt-len", 1, 0, O_PROMPT},
                                          {"output-len", 1, 0, O_OUTPUT},
                                          {"prefix-len", 1, 0, O_PREFIX},
                                          {"shared-prefix-frac", 1, 0, O_SHARED},
                                          {"high-frac", 1, 0, O_HIGH},
                                          {"ttft-deadline", 1, 0, O_DEADLINE},
                                          {"kv-mb", 1, 0, O_KV},
                                          {"max-seqs", 1, 0, O_SEQS},
                                          {"max-batched-tokens", 1, 0, O_TOKENS},
                                          {"block-size", 1, 0, O_BLOCK},
                                          {"starvation", 1, 0, O_STARVE},
                                          {"loads", 1, 0, O_LOADS},
                                          {"calib", 1, 0, O_CALIB},
                                          {"cost", 1, 0, O_COST},
                                          {"blocks", 1, 0, O_BLOCKS},
                                          {"confirm", 1, 0, O_CONFIRM},
                                          {"confirm-seed", 1, 0, O_CSEED},
                                          {"confirm-requests", 1, 0, O_CREQ},
                                          {"confirm-rounds", 1, 0, O_CROUNDS},
                                          {"misses", 0, 0, O_MISSES},
                                          {0, 0, 0, 0}};
    int ch;
    while ((ch = getopt_long(argc, argv, "m:t:h", longs, NULL)) != -1) {
        switch (ch) {
        case 'm':
            c->model_path = optarg;
            break;
        case 't':
            c->n_threads = atoi(optarg);
            break;
        case O_SEED:
            c->seed = strtoull(optarg, NULL, 10);
            break;
        case O_SEEDS:
            o->n_seeds = atoi(optarg);
            break;
        case O_REQUESTS:
            c->n_requests = atoi(optarg);
            break;
        case O_PROMPT:
            if (!serve_dist_parse(optarg, &c->prompt_len)) usage();
            break;
        case O_OUTPUT:
            if (!serve_dist_parse(optarg, &c->output_len)) usage();
            break;
        case O_PREFIX:
            c->prefix_len = atoi(optarg);
            break;
        case O_SHARED:
            c->shared_prefix_frac = atof(optarg);
            break;
        case O_HIGH:
            c->high_frac = atof(optarg);
            break;
        case O_DEADLINE:
            c->ttft_deadline_s = atof(optarg);
            break;
        case O_KV:
            c->kv_bytes = (int64_t)(atof(optarg) * (1 << 20));
            break;
        case O_SEQS:
            c->max_seqs = atoi(optarg);
            break;
        case O_TOKENS:
            c->max_batched_tokens = atoi(optarg);
            break;
        case O_BLOCK:
            c->block_size = atoi(optarg);
            break;
        case O_STARVE:
            o->starvation_s = atof(optarg);
            break;
        case O_LOADS:
            if ((o->n_loads = parse_list(optarg, o->loads, 8)) < 1) usage();
            break;
        case O_CALIB:
            o->calib_requests = atoi(optarg);
            break;
        case O_COST:
            if (sscanf(optarg, "%lf:%lf:%lf", &o->cost_base_us, &o->cost_per_token_us,
                       &o->cost_per_ctx_us) != 3)
                usage();
            o->cost_given = true;
            break;
        case O_BLOCKS:
            o->n_blocks_given = atoi(optarg);
            break;
        case O_CONFIRM:
            o->confirm = true;
            o->confirm_load = atof(optarg);
            break;
        case O_CSEED:
            o->confirm_seed = strtoull(optarg, NULL, 10);
            break;
        case O_CREQ:
            o->confirm_requests = atoi(optarg);
            break;
        case O_CROUNDS:
            o->confirm_rounds = atoi(optarg);
            break;
        case O_MISSES:
            o->list_misses = true;
            break;
        default:
            usage();
        }
    }
    if (!c->model_path || o->n_seeds < 1 || c->n_requests < 1 || o->calib_requests < 1 ||
        (o->cost_given && o->n_blocks_given < 1) || (o->confirm && !(o->confirm_load > 0)) ||
        o->confirm_rounds < 1 || o->confirm_requests < 1)
        usage();
}

int main(int argc, char **argv) {
    policy_opts o;
    parse_args(argc, argv, &o);
    loom_model_params mp = loom_model_default_params();
    mp.n_threads = o.cfg.n_threads;
    loom_model *model = NULL;
    if (loom_model_load(o.cfg.model_path, &mp, &model) != LOOM_OK) {
        fprintf(stderr, "loom-policy-bench: %s: %s\n", o.cfg.model_path, loom_last_error());
        return 1;
    }
    loom_model_info mi = {.size = sizeof mi};
    loom_model_get_info(model, &mi);
    loom_engine_params ep = policy_engine_params(&o, &mi);

    printf("command:");
    for (int i = 0; i < argc; i++) printf(" %s", argv[i]);
    char pl[64], ol[64];
    serve_dist_format(&o.cfg.prompt_len, pl, sizeof pl);
    serve_dist_format(&o.cfg.output_len, ol, sizeof ol);
    printf("\nloom %s; model %s (%s); workload: seeds %llu..%llu, %d requests each; prompt %s "
           "(+%d shared prefix for %.0f%%); output %s; high class %.0f%% (priority 1, TTFT "
           "deadline %.3g s)\nengine: kv %.1f MiB, block %d, max_seqs %d, max_batched_tokens %d, "
           "max_ctx %d, starvation %.3g s\n",
           loom_version(), mi.name[0] ? mi.name : o.cfg.model_path, mi.architecture,
           (unsigned long long)o.cfg.seed,
           (unsigned long long)(o.cfg.seed + (uint64_t)o.n_seeds - 1), o.cfg.n_requests, pl,
           o.cfg.prefix_len, 100 * o.cfg.shared_prefix_frac, ol, 100 * o.cfg.high_frac,
           o.cfg.ttft_deadline_s, (double)ep.kv_bytes / (1 << 20), ep.block_size, ep.max_seqs,
           ep.max_batched_tokens, ep.max_ctx, ep.starvation_s);

    policy_calib cal;
    int rc = 0;
    if (o.cost_given) {
        memset(&cal, 0, sizeof cal);
        loom__cost_model_init(&cal.cost, 1e12);
        loom__cost_model_set(&cal.cost, o.cost_base_us, o.cost_per_token_us, o.cost_per_ctx_us);
        cal.n_blocks = o.n_blocks_given;
        printf("step cost (given): %.1f us + %.2f us/token + %.4f us/context position; KV pool "
               "%d blocks\n",
               cal.cost.base_us, cal.cost.per_token_us, cal.cost.per_ctx_us, cal.n_blocks);
    } else {
        rc = policy_calibrate(model, &mi, &o, &cal);
        if (rc == 0)
            printf("calibration: a burst of %d requests on the engine: %.3f req/s; its %lld steps "
                   "fit %.1f us + %.2f us/token + %.4f us/context position (mean step %.1f ms, "
                   "rmse %.1f ms); KV pool %d blocks\n",
                   o.calib_requests, cal.capacity_real, (long long)cal.n_steps, cal.cost.base_us,
                   cal.cost.per_token_us, cal.cost.per_ctx_us, cal.mean_step_us * 1e-3,
                   cal.fit_rmse_us * 1e-3, cal.n_blocks);
    }
    if (rc == 0) {
        double cap = policy_sim_capacity(&o, &mi, &ep, &cal);
        printf("capacity (the simulator, the same burst): %.3f req/s%s\n", cap,
               cal.capacity_real > 0 ? "" : " (no engine run to compare)");
        if (cal.capacity_real > 0)
            printf("simulator / engine capacity: %.3f\n", cap / cal.capacity_real);
        if (!(cap > 0)) {
            fprintf(stderr, "loom-policy-bench: the simulator measured no capacity\n");
            rc = 1;
        } else {
            printf("\n## Simulation: every policy on the same traces (%d seeds x %d requests per "
                   "load)\n",
                   o.n_seeds, o.cfg.n_requests);
            rc = policy_sweep(&o, &mi, &ep, &cal, cap);
        }
    }
    if (rc == 0 && o.confirm) rc = policy_confirm(model, &mi, &o, &cal);
    loom_model_free(model);
    return rc;
}
