/* kvshare_tool — a model run with cross-layer KV reuse set on the model itself (the internal
 * loom__model_set_kv_source, as declared sharing sets it at load), for test_kv_reuse.py; the
 * public per-engine knob, kv_plan, is test_kv_plan.py's.
 *
 *   kvshare_tool MODEL MAP OUT.f32 < tokens      (MAP: "2:1,3:1" — layer 2 and layer 3 read
 *                                                  layer 1's K/V; "-": none)
 *
 * Writes the logits of every position, [n_tokens, n_vocab] float32, computed teacher-forced
 * from position 0 by a session (f32 KV cache, float32 activations), to OUT.f32, then prints:
 *   group G layers N block_bytes B      for every KV group of an engine on the model
 *   session TOKENS...                   8 greedy tokens after the prompt, from the session
 *   engine TOKENS...                    the same through the engine
 * Exit 1 with the reason on failure. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "loom.h"
#include "model/model.h"

static int argmax(const float *x, int32_t n) {
    int best = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[best]) best = i;
    return best;
}

static loom_status apply_map(loom_model *m, const char *map) {
    if (strcmp(map, "-") == 0) return LOOM_OK;
    const char *p = map;
    while (*p) {
        char *end;
        long layer = strtol(p, &end, 10);
        if (*end != ':') return LOOM_ERR_INVALID_ARG;
        long src = strtol(end + 1, &end, 10);
        LOOM_TRY(loom__model_set_kv_source(m, (int32_t)layer, (int32_t)src));
        p = *end == ',' ? end + 1 : end;
        if (*end != ',' && *end != '\0') return LOOM_ERR_INVALID_ARG;
    }
    return LOOM_OK;
}

static loom_status run(int argc, char **argv) {
    (void)argc;
    loom_token toks[512];
    size_t n = 0;
    long v;
    while (n < 500 && scanf("%ld", &v) == 1) toks[n++] = (loom_token)v;
    loom_model_params mp = loom_model_default_params();
    mp.backend = "cpu";
    mp.f32_activations = true;
    mp.n_threads = 2;
    loom_model *m = NULL;
    LOOM_TRY(loom_model_load(argv[1], &mp, &m));
    loom_status st = apply_map(m, argv[2]);
    loom_session *s = NULL;
    loom_engine *e = NULL;
    loom_session_params sesp = loom_session_default_params();
    sesp.kv_f32 = true;
    sesp.n_ctx = 256;
    if (st == LOOM_OK) st = loom_session_create(m, &sesp, &s);
    const int32_t V = m->cfg.n_vocab;
    if (st == LOOM_OK) st = loom_session_decode(s, toks, (int32_t)n, true);
    if (st == LOOM_OK) {
        FILE *f = fopen(argv[3], "wb");
        const float *lg = loom_session_logits(s, 0);
        if (!f || fwrite(lg, sizeof *lg, n * (size_t)V, f) != n * (size_t)V) st = LOOM_ERR_IO;
        if (f) fclose(f);
    }
    loom_token gen[8];
    if (st == LOOM_OK) {
        const float *lg = loom_session_logits(s, (int32_t)n - 1);
        for (int i = 0; i < 8 && st == LOOM_OK; i++) {
            gen[i] = argmax(lg, V);
            st = loom_session_decode(s, &gen[i], 1, false);
            lg = loom_session_logits(s, -1);
        }
    }
    loom_engine_params ep = loom_engine_default_params();
    ep.kv_bytes = 1 << 20;
    ep.max_ctx = 256;
    if (st == LOOM_OK) st = loom_engine_create(m, &ep, &e);
    for (int32_t g = 0; st == LOOM_OK; g++) {
        loom_kv_group_info gi = {.size = sizeof gi};
        st = loom_engine_get_kv_group(e, g, &gi);
        if (st != LOOM_OK) break;
        printf("group %d layers %d block_bytes %lld\n", g, gi.n_layers, (long long)gi.block_bytes);
        if (g + 1 == gi.n_groups) break;
    }
    loom_generation *out = NULL;
    if (st == LOOM_OK) {
        loom_request_params rq = loom_request_default_params();
        loom_sampler_params sp = loom_sampler_default_params();
        rq.sampler = &sp;
        rq.prompt_tokens = toks;
        rq.n_prompt_tokens = n;
        rq.max_tokens = 8;
        rq.ignore_eos = true;
        sp.temperature = 0.0f;
        st = loom_engine_generate(e, &rq, NULL, NULL, &out);
    }
    if (st == LOOM_OK) {
        printf("session");
        for (int i = 0; i < 8; i++) printf(" %d", gen[i]);
        printf("\nengine");
        for (size_t i = 0; i < out->n_tokens; i++) printf(" %d", out->tokens[i]);
        printf("\n");
    }
    loom_generation_free(out);
    loom_engine_destroy(e);
    loom_session_free(s);
    loom_model_free(m);
    return st;
}

int main(int argc, char **argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: kvshare_tool MODEL MAP OUT.f32 < tokens\n");
        return 2;
    }
    loom_status st = run(argc, argv);
    if (st != LOOM_OK) {
        fprintf(stderr, "kvshare_tool: %s: %s\n", loom_status_str(st), loom_last_error());
        return 1;
    }
    return 0;
}
