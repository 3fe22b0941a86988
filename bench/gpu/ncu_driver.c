/* ncu_driver.c — loom-gpu-ncu: the workload bench/gpu/ncu.sh profiles with Nsight Compute. A
 * synthetic Llama-3-8B-shaped model (Q4_K weights, 2 layers: every kernel of a layer, fewer
 * repeats) on CUDA; after a warm-up, one region runs between cudaProfilerStart and
 * cudaProfilerStop, which ncu --profile-from-start off profiles alone:
 *   decode:  one engine step of 16 sequences decoding at 1,000 positions of context;
 *   prefill: one 2,048-token prompt in one call.
 * Usage: loom-gpu-ncu decode|prefill */
#include <cuda_profiler_api.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "loom.h"

static int fail(const char *what) {
    fprintf(stderr, "loom-gpu-ncu: %s: %s\n", what, loom_last_error());
    return 1;
}

static int run_prefill(loom_model *m, int32_t V) {
    enum { N = 2048 };
    static loom_token t[N];
    for (int i = 0; i < N; i++) t[i] = (loom_token)(3 + (i * 7919) % (V - 3));
    loom_session_params sp = loom_session_default_params();
    sp.n_ctx = N + 64;
    sp.n_batch = N;
    loom_session *s = NULL;
    if (loom_session_create(m, &sp, &s) != LOOM_OK) return fail("session");
    if (loom_session_decode(s, t, 64, false) != LOOM_OK) return fail("warm-up");
    loom_session_reset(s);
    (void)cudaProfilerStart();
    const loom_status st = loom_session_decode(s, t, N, false);
    (void)cudaProfilerStop();
    loom_session_free(s);
    return st == LOOM_OK ? 0 : fail("prefill");
}

static int run_decode(loom_model *m, int32_t V) {
    enum { B = 16, PROMPT = 1000 };
    static loom_token prompt[PROMPT];
    loom_engine_params ep = loom_engine_default_params();
    ep.max_seqs = B;
    ep.max_ctx = PROMPT + 64;
    ep.max_batched_tokens = 2048;
    loom_engine *e = NULL;
    if (loom_engine_create(m, &ep, &e) != LOOM_OK) return fail("engine");
    for (int r = 0; r < B; r++) {
        for (int i = 0; i < PROMPT; i++) prompt[i] = (loom_token)(3 + (r * 131 + i * 17) % (V - 3));
        loom_request_params rq = loom_request_default_params();
        rq.prompt_tokens = prompt;
        rq.n_prompt_tokens = PROMPT;
        rq.max_tokens = 16;
        rq.ignore_eos = true;
        loom_request_id id;
        if (loom_engine_submit(e, &rq, &id) != LOOM_OK) return fail("submit");
    }
    /* the prompts' steps and a few decode steps as warm-up, then one decode step profiled */
    int steps = 0, status = 0;
    while (loom_engine_has_work(e) && status == 0) {
        const loom_event *const *ev;
        size_t n_ev;
        const int profiled = ++steps == 12; /* past the prompts (8 steps of 2,048 rows) */
        if (profiled) (void)cudaProfilerStart();
        if (loom_engine_step(e, &ev, &n_ev) != LOOM_OK) status = fail("step");
        if (profiled) (void)cudaProfilerStop();
    }
    loom_engine_destroy(e);
    if (status == 0 && steps < 12) {
        fprintf(stderr, "loom-gpu-ncu: only %d steps: none profiled\n", steps);
        return 1;
    }
    return status;
}

int main(int argc, char **argv) {
    if (argc != 2 || (strcmp(argv[1], "decode") != 0 && strcmp(argv[1], "prefill") != 0)) {
        fprintf(stderr, "usage: loom-gpu-ncu decode|prefill\n");
        return 2;
    }
    loom_synthetic_params sp = loom_synthetic_default_params();
    sp.preset = "llama3-8b";
    sp.weight_type = "q4_K";
    sp.n_layer = 2;
    loom_model_params mp = loom_model_default_params();
    mp.backend = "cuda";
    loom_model *m = NULL;
    if (loom_model_load_synthetic(&sp, &mp, &m) != LOOM_OK) return fail("load");
    loom_model_info info = {.size = sizeof info};
    loom_model_get_info(m, &info);
    const int rc =
        strcmp(argv[1], "decode") == 0 ? run_decode(m, info.n_vocab) : run_prefill(m, info.n_vocab);
    loom_model_free(m);
    return rc;
}
