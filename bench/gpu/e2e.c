/* e2e.c — loom-gpu-e2e: end-to-end prefill and decode tokens/s of whole synthetic models
 * (loom_model_load_synthetic: Gemma-3-270M and Llama-3-8B shapes) on a backend, for
 * bench/gpu/check.sh. Public API only.
 *
 *   prefill: one 512-token prompt, and one of 2,048 tokens, through a session in one call each
 *            (tokens / time of the call);
 *   decode:  B requests with 16-token prompts generating 64 tokens each through an engine
 *            (greedy, EOS ignored): B * 64 / the time of the whole run, prefill included
 *            (16-token prompts make it a small share).
 * One JSON object per line, with the environment's LOOM_CUDA_BATCH_INVARIANT,
 * LOOM_CUDA_GRAPHS and LOOM_CUDA_MATH. Usage: loom-gpu-e2e [--backend B] [--quick] [--only
 * PRESET:TYPE] */
#define _POSIX_C_SOURCE 199309L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "loom.h"

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* A JSON line begun and not yet ended. */
static int g_line_open;

/* Ends a JSON line a failure cut short (check.sh skips it), so the next run's starts on its own. */
static int fail(const char *what) {
    if (g_line_open) printf("\n");
    fprintf(stderr, "loom-gpu-e2e: %s: %s\n", what, loom_last_error());
    return 1;
}

/* n prompt tokens in one forward call (n_batch n). */
static double prefill(loom_model *m, int32_t V, int n) {
    loom_session *s = NULL;
    loom_session_params sp = loom_session_default_params();
    sp.n_ctx = n + 64;
    sp.n_batch = n;
    if (loom_session_create(m, &sp, &s) != LOOM_OK) return -1;
    loom_token *t = malloc(sizeof *t * (size_t)n);
    for (int i = 0; i < n; i++) t[i] = (loom_token)(3 + (i * 7919) % (V - 3));
    /* once to warm up (first launches, workspace), then timed */
    if (loom_session_decode(s, t, 16, false) != LOOM_OK) return -1;
    loom_session_reset(s);
    double t0 = now_s();
    loom_status st = loom_session_decode(s, t, n, false);
    double dt = now_s() - t0;
    free(t);
    loom_session_free(s);
    return st == LOOM_OK ? n / dt : -1;
}

static double decode(loom_model *m, int32_t V, int batch, int n_new) {
    loom_engine_params ep = loom_engine_default_params();
    ep.max_seqs = batch;
    ep.max_ctx = 256;
    ep.max_batched_tokens = batch * 16 > 512 ? batch * 16 : 512;
    loom_engine *e = NULL;
    if (loom_engine_create(m, &ep, &e) != LOOM_OK) return -1;
    loom_token prompt[16];
    double t0 = 0;
    for (int round = 0; round < 2; round++) { /* round 0 warms up */
        t0 = now_s();
        for (int r = 0; r < batch; r++) {
            for (int i = 0; i < 16; i++) prompt[i] = (loom_token)(3 + (r * 131 + i * 17) % (V - 3));
            loom_request_params rq = loom_request_default_params();
            rq.prompt_tokens = prompt;
            rq.n_prompt_tokens = 16;
            rq.max_tokens = round == 0 ? 4 : n_new;
            rq.ignore_eos = true;
            loom_request_id id;
            if (loom_engine_submit(e, &rq, &id) != LOOM_OK) return -1;
        }
        while (loom_engine_has_work(e)) {
            const loom_event *const *ev;
            size_t n_ev;
            if (loom_engine_step(e, &ev, &n_ev) != LOOM_OK) return -1;
        }
    }
    double dt = now_s() - t0;
    loom_engine_destroy(e);
    return (double)batch * n_new / dt;
}

int main(int argc, char **argv) {
    const char *backend = "cuda", *only = NULL;
    int quick = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--backend") && i + 1 < argc) backend = argv[++i];
        if (!strcmp(argv[i], "--quick")) quick = 1;
        if (!strcmp(argv[i], "--only") && i + 1 < argc) only = argv[++i];
    }
    const char *inv = getenv("LOOM_CUDA_BATCH_INVARIANT"), *graphs = getenv("LOOM_CUDA_GRAPHS");
    const char *math = getenv("LOOM_CUDA_MATH"), *wgmma = getenv("LOOM_CUDA_WGMMA");
    const char *fuse = getenv("LOOM_CUDA_FUSE");
    /* "bf16+wgmma": asked for; the device logs whether it took it (check.sh's test row too) */
    const char *math_name = math == NULL || strcmp(math, "bf16") != 0 ? "f32"
                            : wgmma != NULL && !strcmp(wgmma, "1")    ? "bf16+wgmma"
                                                                      : "bf16";
    const char *presets[] = {"gemma3-270m", "llama3-8b"};
    const char *types[] = {"bf16", "q8_0", "q4_K"};
    const int batches[] = {1, 16, 64};
    for (int p = 0; p < 2; p++) {
        for (int t = 0; t < 3; t++) {
            char name[64];
            snprintf(name, sizeof name, "%s:%s", presets[p], types[t]);
            if (only != NULL && strcmp(only, name) != 0) continue;
            loom_synthetic_params sp = loom_synthetic_default_params();
            sp.preset = presets[p];
            sp.weight_type = types[t];
            if (quick) sp.n_layer = 2;
            loom_model_params mp = loom_model_default_params();
            mp.backend = backend;
            loom_model *m = NULL;
            double t0 = now_s();
            if (loom_model_load_synthetic(&sp, &mp, &m) != LOOM_OK) return fail(presets[p]);
            const double load_s = now_s() - t0;
            loom_model_info info = {.size = sizeof info};
            loom_model_get_info(m, &info);
            double pf = prefill(m, info.n_vocab, 512);
            double pf2k = quick ? 0 : prefill(m, info.n_vocab, 2048);
            if (pf < 0 || pf2k < 0) return fail("prefill");
            printf(
                "{\"model\":\"%s\",\"type\":\"%s\",\"backend\":\"%s\",\"invariant\":%s,"
                "\"graphs\":%s,\"fused\":%s,\"math\":\"%s\",\"load_s\":%.1f,"
                "\"prefill_512_tps\":%.1f,\"prefill_2048_tps\":%.1f",
                presets[p], types[t], backend, inv != NULL && !strcmp(inv, "0") ? "false" : "true",
                graphs != NULL && !strcmp(graphs, "1") ? "true" : "false",
                fuse != NULL && !strcmp(fuse, "0") ? "false" : "true", math_name, load_s, pf, pf2k);
            g_line_open = 1;
            for (int b = 0; b < 3; b++) {
                double d = decode(m, info.n_vocab, batches[b], 64);
                if (d < 0) return fail("decode");
                printf(",\"decode_b%d_tps\":%.1f", batches[b], d);
            }
            printf("}\n");
            g_line_open = 0;
            fflush(stdout);
            loom_model_free(m);
        }
    }
    return 0;
}
