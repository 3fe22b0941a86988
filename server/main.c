/* loom-server — an OpenAI-compatible HTTP server over one loom engine.
 *
 *   loom-server -m MODEL [--host H] [--port P] [--api-key KEY] [options]
 *
 * Endpoints: POST /v1/completions, POST /v1/chat/completions (streaming over SSE or not),
 * GET /v1/models, GET /health, GET /metrics (Prometheus). Every request shares the engine's
 * batches; see docs/server.md for the fields loom adds to OpenAI's. Stops on SIGINT/SIGTERM. */
#define _GNU_SOURCE

#include <errno.h>
#include <microhttpd.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "server.h"

static void usage(FILE *f) {
    fprintf(f,
            "usage: loom-server -m MODEL [options]\n"
            "  -m, --model FILE        GGUF model\n"
            "  --host H                address to listen on (default 127.0.0.1)\n"
            "  --port P                port (default 8080; 0: any free port, printed)\n"
            "  --api-key KEY           require Authorization: Bearer KEY on /v1/ (default: none;\n"
            "                          also read from LOOM_API_KEY)\n"
            "  --model-name NAME       the model's name in requests and responses (default: the\n"
            "                          file's base name)\n"
            "  -t, --threads N         compute threads (default: all cores)\n"
            "  --backend B             cpu, cuda, or auto (default)\n"
            "  --kv-bytes N            KV-cache budget in bytes (suffixes K, M, G; default: a\n"
            "                          fraction of free memory, --kv-fraction)\n"
            "  --kv-fraction F         that fraction (default 0.25)\n"
            "  --kv-type T             f16 (default), fp8 or fp8-e5m2\n"
            "  -c, --max-ctx N         positions one request may hold (default: the model's,\n"
            "                          at most 8192)\n"
            "  --max-seqs N            most sequences in one step (default 64)\n"
            "  --max-batched-tokens N  token budget of one step (default 512)\n"
            "  --max-body-bytes N      larger request bodies get 413 (default 1M)\n"
            "  --max-queued N          requests waiting for their first token beyond which new\n"
            "                          ones get 429 (default 256)\n"
            "  --max-tokens-ceiling N  a larger max_tokens gets 400 (default 4096)\n"
            "  --max-n N               a larger n gets 400 (default 16)\n"
            "  --timeout-s S           cancel a request running longer (default 600; 0: never)\n"
            "  --idle-timeout-s S      close idle keep-alive connections after S (default 120)\n");
}

static bool parse_size(const char *s, int64_t *out) {
    char *end = NULL;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || v < 0) return false;
    double mult = 1;
    if (*end == 'K' || *end == 'k')
        mult = 1024.0, end++;
    else if (*end == 'M' || *end == 'm')
        mult = 1024.0 * 1024, end++;
    else if (*end == 'G' || *end == 'g')
        mult = 1024.0 * 1024 * 1024, end++;
    if (*end) return false;
    v *= mult;
    if (v > 9e18) return false;
    *out = (int64_t)v;
    return true;
}

static bool parse_int(const char *s, long lo, long hi, int32_t *out) {
    char *end = NULL;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi) return false;
    *out = (int32_t)v;
    return true;
}

static bool parse_double(const char *s, double lo, double hi, double *out) {
    char *end = NULL;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end || !(v >= lo && v <= hi)) return false;
    *out = v;
    return true;
}

static const char *base_name(const char *path) {
    static char name[256];
    const char *b = strrchr(path, '/');
    b = b ? b + 1 : path;
    snprintf(name, sizeof name, "%s", b);
    size_t n = strlen(name);
    if (n > 5 && !strcmp(name + n - 5, ".gguf")) name[n - 5] = 0;
    return name;
}

/* Returns 0 on success, 2 on a usage error (printed). */
static int parse_args(int argc, char **argv, srv_config *cfg) {
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            exit(0);
        }
        if (i + 1 >= argc) {
            fprintf(stderr, "loom-server: %s needs a value (or is unknown)\n", a);
            return 2;
        }
        const char *v = argv[++i];
        int64_t size = 0;
        double d = 0;
        bool ok = true;
        if (!strcmp(a, "-m") || !strcmp(a, "--model"))
            cfg->model_path = v;
        else if (!strcmp(a, "--host"))
            cfg->host = v;
        else if (!strcmp(a, "--port"))
            ok = parse_int(v, 0, 65535, &cfg->port);
        else if (!strcmp(a, "--api-key"))
            cfg->api_key = v;
        else if (!strcmp(a, "--model-name"))
            cfg->model_name = v;
        else if (!strcmp(a, "-t") || !strcmp(a, "--threads"))
            ok = parse_int(v, 0, 4096, &cfg->threads);
        else if (!strcmp(a, "--backend"))
            cfg->backend = strcmp(v, "auto") ? v : NULL;
        else if (!strcmp(a, "--kv-bytes"))
            ok = parse_size(v, &cfg->kv_bytes) && cfg->kv_bytes > 0;
        else if (!strcmp(a, "--kv-fraction")) {
            ok = parse_double(v, 1e-6, 1, &d);
            cfg->kv_fraction = (float)d;
        } else if (!strcmp(a, "--kv-type")) {
            if (!strcmp(v, "f16"))
                cfg->kv_type = LOOM_KV_CACHE_F16;
            else if (!strcmp(v, "fp8"))
                cfg->kv_type = LOOM_KV_CACHE_FP8_E4M3;
            else if (!strcmp(v, "fp8-e5m2"))
                cfg->kv_type = LOOM_KV_CACHE_FP8_E5M2;
            else
                ok = false;
        } else if (!strcmp(a, "-c") || !strcmp(a, "--max-ctx"))
            ok = parse_int(v, 0, 1 << 24, &cfg->max_ctx);
        else if (!strcmp(a, "--max-seqs"))
            ok = parse_int(v, 1, 1 << 16, &cfg->max_seqs);
        else if (!strcmp(a, "--max-batched-tokens"))
            ok = parse_int(v, 1, 1 << 24, &cfg->max_batched_tokens);
        else if (!strcmp(a, "--max-body-bytes")) {
            ok = parse_size(v, &size) && size > 0;
            cfg->max_body_bytes = (size_t)size;
        } else if (!strcmp(a, "--max-queued"))
            ok = parse_int(v, 1, 1 << 24, &cfg->max_queued);
        else if (!strcmp(a, "--max-tokens-ceiling"))
            ok = parse_int(v, 1, 1 << 24, &cfg->max_tokens_ceiling);
        else if (!strcmp(a, "--max-n"))
            ok = parse_int(v, 1, 1024, &cfg->max_n);
        else if (!strcmp(a, "--timeout-s"))
            ok = parse_double(v, 0, 1e9, &cfg->timeout_s);
        else if (!strcmp(a, "--idle-timeout-s")) {
            ok = parse_double(v, 1, 86400, &d);
            cfg->connection_timeout_s = (unsigned)d;
        } else {
            fprintf(stderr, "loom-server: unknown option %s\n", a);
            usage(stderr);
            return 2;
        }
        if (!ok) {
            fprintf(stderr, "loom-server: bad value for %s: %s\n", a, v);
            return 2;
        }
    }
    if (!cfg->model_path) {
        fprintf(stderr, "loom-server: -m MODEL is required\n");
        usage(stderr);
        return 2;
    }
    if (!cfg->model_name) cfg->model_name = base_name(cfg->model_path);
    if (!cfg->api_key) {
        const char *env = getenv("LOOM_API_KEY");
        if (env && *env) cfg->api_key = env;
    }
    return 0;
}

int main(int argc, char **argv) {
    static srv s; /* shared with every thread; lives until exit */
    srv_config *cfg = &s.cfg;
    cfg->host = "127.0.0.1";
    cfg->port = 8080;
    cfg->max_body_bytes = 1u << 20;
    cfg->max_queued = 256;
    cfg->max_tokens_ceiling = 4096;
    cfg->max_n = 16;
    cfg->timeout_s = 600;
    cfg->connection_timeout_s = 120;
    cfg->kv_type = LOOM_KV_CACHE_F16;
    int rc = parse_args(argc, argv, cfg);
    if (rc) return rc;

    /* Signals are taken by sigwait below: block them before any thread starts */
    sigset_t stop_signals;
    sigemptyset(&stop_signals);
    sigaddset(&stop_signals, SIGINT);
    sigaddset(&stop_signals, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &stop_signals, NULL);
    signal(SIGPIPE, SIG_IGN);

    srv_metrics_init(&s.metrics);
    atomic_init(&s.n_waiting, 0);
    atomic_init(&s.stopping, false);
    atomic_init(&s.next_id, 1);
    s.started_s = (double)time(NULL);
    s.id_salt = ((uint64_t)time(NULL) << 20) ^ (uint64_t)(loom_engine_now() * 1e9);

    loom_model_params mp;
    loom_model_params_init(&mp, sizeof mp);
    mp.n_threads = cfg->threads;
    mp.backend = cfg->backend;
    loom_status st = loom_model_load(cfg->model_path, &mp, &s.model);
    if (st != LOOM_OK) {
        fprintf(stderr, "loom-server: %s: %s\n", loom_status_str(st), loom_last_error());
        return 1;
    }
    loom_model_info info = {.size = sizeof info};
    loom_model_get_info(s.model, &info);
    s.n_vocab = info.n_vocab;

    loom_engine_params ep = loom_engine_default_params();
    ep.on_event = srv_on_event;
    ep.on_event_user_data = &s;
    if (cfg->kv_bytes) ep.kv_bytes = cfg->kv_bytes;
    if (cfg->kv_fraction > 0) ep.kv_fraction = cfg->kv_fraction;
    if (cfg->max_ctx) ep.max_ctx = cfg->max_ctx;
    if (cfg->max_seqs) ep.max_seqs = cfg->max_seqs;
    if (cfg->max_batched_tokens) ep.max_batched_tokens = cfg->max_batched_tokens;
    ep.kv_type = cfg->kv_type;
    s.max_logprobs = ep.max_logprobs;
    s.max_ctx = ep.max_ctx > 0 ? ep.max_ctx : (info.n_ctx_train < 8192 ? info.n_ctx_train : 8192);
    st = loom_engine_create(s.model, &ep, &s.engine);
    if (st != LOOM_OK) {
        fprintf(stderr, "loom-server: %s: %s\n", loom_status_str(st), loom_last_error());
        loom_model_free(s.model);
        return 1;
    }

    int port = 0;
    struct MHD_Daemon *d = srv_http_start(&s, &port);
    if (!d) {
        loom_engine_destroy(s.engine);
        loom_model_free(s.model);
        return 1;
    }
    printf("loom-server: serving %s as '%s' (max context %d, %s backend)\n", cfg->model_path,
           cfg->model_name, s.max_ctx, info.backend ? info.backend : "?");
    printf("loom-server: listening on http://%s:%d\n", cfg->host, port);
    fflush(stdout);

    int sig = 0;
    sigwait(&stop_signals, &sig);
    printf("loom-server: %s: stopping\n", sig == SIGINT ? "SIGINT" : "SIGTERM");
    fflush(stdout);
    atomic_store(&s.stopping, true);
    MHD_stop_daemon(d); /* waits for the connection threads: they see `stopping` and end */
    loom_engine_destroy(s.engine);
    loom_model_free(s.model);
    srv_metrics_destroy(&s.metrics);
    return 0;
}
