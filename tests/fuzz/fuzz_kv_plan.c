/* fuzz_kv_plan.c — libFuzzer target: cross-layer KV plan files (engine/kv_plan.h). The input is
 * a plan's text, read for an 8-layer synthetic Gemma 3 (layer 5 global, the rest a sliding
 * window), so every rule has something to refuse: layers the model lacks, a layer paired with
 * itself or a later one, chains, mixed windows, a layer named twice, the header, the counts,
 * merged pairs (a layer in two pairs, a pair another layer reads, merge-retain and merge-t out
 * of [0, 1]). What must hold: a refusal says why (a message), and a map that is accepted passes
 * the whole-map check, leaves every source layer reading itself, and every merged pair two
 * layers that name each other, the later reading the earlier, which no other layer reads. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "engine/kv_plan.h"
#include "fuzz_engine_model.h"

enum { FUZZ_PLAN_MAX = 4096, FUZZ_PLAN_LAYERS = 8 };

static loom_model *plan_model(void) {
    static loom_model *m = NULL;
    if (m != NULL) return m;
    loom_log_set(fuzz_quiet_log, LOOM_LOG_ERROR, NULL);
    loom_synthetic_params sp = loom_synthetic_default_params();
    sp.arch = "gemma3";
    sp.n_vocab = FUZZ_MODEL_VOCAB;
    sp.n_embd = 32;
    sp.n_head = 2;
    sp.n_head_kv = 1;
    sp.head_dim = 16;
    sp.n_ff = 64;
    sp.n_layer = FUZZ_PLAN_LAYERS;
    sp.n_ctx = 128;
    sp.window = 16;
    sp.weight_type = "f32";
    loom_model_params mp = loom_model_default_params();
    mp.backend = "cpu";
    mp.n_threads = 1;
    if (loom_model_load_synthetic(&sp, &mp, &m) != LOOM_OK) {
        fprintf(stderr, "fuzz_kv_plan: setup: %s\n", loom_last_error());
        abort();
    }
    return m;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static char text[FUZZ_PLAN_MAX + 1];
    const size_t n = size < FUZZ_PLAN_MAX ? size : FUZZ_PLAN_MAX;
    memcpy(text, data, n);
    text[n] = '\0'; /* a NUL inside ends the text early, as a C string does */
    loom_model *m = plan_model();
    int32_t map[FUZZ_PLAN_LAYERS], with[FUZZ_PLAN_LAYERS];
    loom__kv_merge merge = {.with = with};
    loom__clear_error();
    loom_status st = loom__kv_plan_parse(m, text, "fuzz", map, &merge);
    if (st != LOOM_OK) {
        if (loom_last_error()[0] == '\0') abort();
        return 0;
    }
    if (loom__kv_plan_check(m, map, with) != LOOM_OK) abort();
    if (!(merge.retain >= 0.0f && merge.retain <= 1.0f && merge.t >= 0.0f && merge.t <= 1.0f))
        abort();
    int32_t paired = 0;
    for (int32_t l = 0; l < FUZZ_PLAN_LAYERS; l++) {
        if (map[l] < 0 || map[l] > l) abort();
        if (map[l] != l && map[map[l]] != map[l]) abort();
        if ((loom_model_layer_window(m, l) == 0) != (loom_model_layer_window(m, map[l]) == 0))
            abort();
        /* A pair: partners name each other, the later reads the earlier, nobody else reads
         * either. */
        if (with[l] == -1) continue;
        paired++;
        if (with[l] < 0 || with[l] >= FUZZ_PLAN_LAYERS || with[with[l]] != l) abort();
        const int32_t a = l < with[l] ? l : with[l], b = l + with[l] - a;
        if (map[a] != a || map[b] != a) abort();
        for (int32_t o = 0; o < FUZZ_PLAN_LAYERS; o++)
            if (o != b && map[o] == a && o != a) abort();
    }
    if (paired != 2 * merge.n_pairs) abort();
    return 0;
}
