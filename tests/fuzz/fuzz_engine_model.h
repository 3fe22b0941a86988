/* fuzz_engine_model.h — the model the engine-level fuzz targets (fuzz_engine, fuzz_replay) run
 * on: a one-layer synthetic llama built in memory (F32, 320 tokens, 32 wide), on one CPU
 * thread, with the library's log lines below ERROR dropped (a fuzzer's refused inputs would
 * flood it). Returns NULL, printing why, when it cannot be built. */
#pragma once

#include <stdio.h>

#include "loom.h"

enum { FUZZ_MODEL_VOCAB = 320 };

static void fuzz_quiet_log(loom_log_level level, const char *msg, void *user) {
    (void)level;
    (void)msg;
    (void)user;
}

static inline loom_model *fuzz_engine_model(const char *target) {
    loom_log_set(fuzz_quiet_log, LOOM_LOG_ERROR, NULL);
    loom_synthetic_params sp = loom_synthetic_default_params();
    sp.arch = "llama";
    sp.n_vocab = FUZZ_MODEL_VOCAB;
    sp.n_embd = 32;
    sp.n_head = 2;
    sp.n_head_kv = 1;
    sp.n_ff = 64;
    sp.n_layer = 1;
    sp.n_ctx = 128;
    sp.weight_type = "f32";
    loom_model_params mp = loom_model_default_params();
    mp.backend = "cpu";
    mp.n_threads = 1;
    loom_model *m = NULL;
    if (loom_model_load_synthetic(&sp, &mp, &m) != LOOM_OK) {
        fprintf(stderr, "%s: setup: %s\n", target, loom_last_error());
        return NULL;
    }
    return m;
}
