/* test_backend_plugin.c — the plugin boundary, through loom_model_load as an application uses it:
 *   - the CPU backend loaded as a plugin (libloom-cpuplugin.so) gives the built-in backend's
 *     bits: logits of a session, tokens of an engine, on a llama and a gemma3 model;
 *   - every way a plugin can be wrong gives its status and a message naming it, never a crash:
 *     no such file (the message lists where it looked), a file that is not a library, no entry
 *     point, an entry point that refuses the ABI, a table of another ABI version, a table
 *     without a required slot, a plugin whose device is missing (its own message arrives
 *     through the host callbacks), a malformed name;
 *   - AUTO passes over a "cuda" plugin that finds no device, logs why, and runs on the CPU;
 *     with no plugin at all it runs on the CPU too.
 * $LOOM_BACKEND_PATH (set by CTest) names the build folder (the cpuplugin) and the fake plugins'
 * folder; the "cuda" fake lives in a folder of its own, added only for the AUTO case. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "loom.h"
#include "model/synth_model.h"

static char g_llama[512], g_gemma[512];

static int setup(void **state) {
    (void)state;
    synth_path(g_llama, sizeof g_llama, "plugin-llama.gguf");
    synth_path(g_gemma, sizeof g_gemma, "plugin-gemma3.gguf");
    if (synth_write(g_llama, &SYNTH_LLAMA, 11) != 0) return -1;
    if (synth_write(g_gemma, &SYNTH_GEMMA3, 12) != 0) return -1;
    return 0;
}

static loom_model *load(const char *path, const char *backend) {
    loom_model_params p = loom_model_default_params();
    p.backend = backend;
    p.n_threads = 2;
    loom_model *m = NULL;
    loom_status st = loom_model_load(path, &p, &m);
    if (st != LOOM_OK)
        fail_msg("load %s on %s: %s", path, backend ? backend : "auto", loom_last_error());
    return m;
}

/* Logits of a 40-token sequence and of 6 decodes after it, into out [46 * V]. */
static void session_logits(loom_model *m, float *out, int32_t V) {
    loom_session *s = NULL;
    assert_int_equal(loom_session_create(m, NULL, &s), LOOM_OK);
    loom_token toks[46];
    for (int i = 0; i < 46; i++) toks[i] = (loom_token)(3 + (i * 37) % (V - 3));
    assert_int_equal(loom_session_decode(s, toks, 40, true), LOOM_OK);
    memcpy(out, loom_session_logits(s, 0), sizeof(float) * 40 * (size_t)V);
    for (int i = 40; i < 46; i++) {
        assert_int_equal(loom_session_decode(s, toks + i, 1, false), LOOM_OK);
        memcpy(out + (size_t)i * V, loom_session_logits(s, -1), sizeof(float) * (size_t)V);
    }
    loom_session_free(s);
}

/* Tokens of four requests run together, greedy and sampled, into out[4][24]. */
static void engine_tokens(loom_model *m, loom_token out[4][24]) {
    loom_engine_params ep = loom_engine_default_params();
    ep.kv_bytes = 4 << 20;
    ep.max_ctx = 128;
    ep.max_batched_tokens = 32;
    ep.max_seqs = 8;
    loom_engine *e = NULL;
    if (loom_engine_create(m, &ep, &e) != LOOM_OK) fail_msg("engine: %s", loom_last_error());
    loom_request_id ids[4];
    loom_token prompt[4][20];
    for (int r = 0; r < 4; r++) {
        for (int i = 0; i < 20; i++) prompt[r][i] = (loom_token)(5 + (r * 31 + i * 17) % 250);
        loom_request_params rq = loom_request_default_params();
        loom_sampler_params sp = loom_sampler_default_params();
        rq.sampler = &sp;
        rq.prompt_tokens = prompt[r];
        rq.n_prompt_tokens = 8 + 4 * (size_t)r;
        rq.max_tokens = 24;
        rq.ignore_eos = true;
        sp.temperature = r % 2 ? 0.8f : 0.0f;
        sp.seed = 100 + (uint64_t)r;
        assert_int_equal(loom_engine_submit(e, &rq, &ids[r]), LOOM_OK);
    }
    int n[4] = {0};
    while (loom_engine_has_work(e)) {
        const loom_event *const *ev;
        size_t n_ev;
        assert_int_equal(loom_engine_step(e, &ev, &n_ev), LOOM_OK);
        for (size_t k = 0; k < n_ev; k++)
            for (int r = 0; r < 4; r++)
                if (ev[k]->kind == LOOM_EVENT_TOKEN && ev[k]->id == ids[r] && n[r] < 24)
                    out[r][n[r]++] = ev[k]->token;
    }
    for (int r = 0; r < 4; r++) assert_int_equal(n[r], 24);
    loom_engine_destroy(e);
}

static void same_bits_as_builtin(const char *path) {
    loom_model *a = load(path, "cpu"), *b = load(path, "cpuplugin");
    loom_model_info ia = {.size = sizeof ia}, ib = {.size = sizeof ib};
    assert_int_equal(loom_model_get_info(a, &ia), LOOM_OK);
    assert_int_equal(loom_model_get_info(b, &ib), LOOM_OK);
    assert_string_equal(ia.backend, "cpu");
    assert_string_equal(ib.backend, "cpu"); /* the plugin's table is the CPU backend's */
    assert_string_equal(ia.backend_path, "");
    const char *tail = "/libloom-cpuplugin.so";
    assert_true(strlen(ib.backend_path) > strlen(tail));
    assert_string_equal(ib.backend_path + strlen(ib.backend_path) - strlen(tail), tail);
    const int32_t V = ia.n_vocab;
    float *la = malloc(sizeof(float) * 46 * (size_t)V),
          *lb = malloc(sizeof(float) * 46 * (size_t)V);
    assert_non_null(la);
    assert_non_null(lb);
    session_logits(a, la, V);
    session_logits(b, lb, V);
    assert_memory_equal(la, lb, sizeof(float) * 46 * (size_t)V);
    loom_token ta[4][24], tb[4][24];
    engine_tokens(a, ta);
    engine_tokens(b, tb);
    assert_memory_equal(ta, tb, sizeof ta);
    /* Not vacuous: positions give different logits, requests different tokens. */
    assert_memory_not_equal(la, la + V, sizeof(float) * (size_t)V);
    assert_memory_not_equal(ta[0], ta[1], sizeof ta[0]);
    assert_memory_not_equal(ta[0], ta[2], sizeof ta[0]);
    free(la);
    free(lb);
    loom_model_free(a);
    loom_model_free(b);
}

static void test_cpu_plugin_bits(void **state) {
    (void)state;
    same_bits_as_builtin(g_llama);
    same_bits_as_builtin(g_gemma);
}

/* Loading on backend must fail with status, and the message must hold every `what`. */
static void expect_fails(const char *backend, loom_status status, const char *what1,
                         const char *what2) {
    loom_model_params p = loom_model_default_params();
    p.backend = backend;
    loom_model *m = NULL;
    loom_status st = loom_model_load(g_llama, &p, &m);
    if (st != status)
        fail_msg("backend %s: status %d (%s), want %d", backend, (int)st, loom_last_error(),
                 (int)status);
    assert_null(m);
    const char *msg = loom_last_error();
    if (what1 && !strstr(msg, what1)) fail_msg("backend %s: '%s' lacks '%s'", backend, msg, what1);
    if (what2 && !strstr(msg, what2)) fail_msg("backend %s: '%s' lacks '%s'", backend, msg, what2);
}

static void test_bad_plugins(void **state) {
    (void)state;
    expect_fails("nonexistent", LOOM_ERR_NO_DEVICE, "no plugin libloom-nonexistent.so",
                 "LOOM_BACKEND_PATH");
    expect_fails("notalib", LOOM_ERR_NO_DEVICE, "cannot load", "libloom-notalib.so");
    expect_fails("noentry", LOOM_ERR_BACKEND, "exports no loom_backend_entry",
                 "libloom-noentry.so");
    expect_fails("refuse", LOOM_ERR_UNSUPPORTED, "refused to start", "built for backend ABI 99");
    expect_fails("oldabi", LOOM_ERR_UNSUPPORTED, "ABI version 2", "libloom-oldabi.so");
    expect_fails("noslot", LOOM_ERR_BACKEND, "'attention'", "libloom-noslot.so");
    expect_fails("nodevice", LOOM_ERR_NO_DEVICE, "no driver (libfakedriver.so.1",
                 "libloom-nodevice.so");
    expect_fails("../cpu", LOOM_ERR_INVALID_ARG, "backend name", NULL);
    expect_fails("Cuda", LOOM_ERR_INVALID_ARG, "backend name", NULL);
    loom_model_params p = loom_model_default_params();
    p.backend = "cpu";
    p.device = 3;
    loom_model *m = NULL;
    assert_int_equal(loom_model_load(g_llama, &p, &m), LOOM_ERR_NO_DEVICE);
    assert_non_null(strstr(loom_last_error(), "device 3"));
    /* The same refusal from inside a plugin: its message crosses through the host's set_error. */
    p.backend = "cpuplugin";
    assert_int_equal(loom_model_load(NULL, &p, &m), LOOM_ERR_INVALID_ARG); /* another message */
    assert_null(strstr(loom_last_error(), "device 3"));
    assert_int_equal(loom_model_load(g_llama, &p, &m), LOOM_ERR_NO_DEVICE);
    assert_non_null(strstr(loom_last_error(), "cpu: device 3 does not exist"));
    p.backend = "cpu";
    p.device = -1;
    assert_int_equal(loom_model_load(g_llama, &p, &m), LOOM_ERR_INVALID_ARG);
    assert_null(m);
}

/* AUTO's log lines. */
static char g_log[4096];
static void collect(loom_log_level level, const char *message, void *user) {
    (void)level;
    (void)user;
    size_t n = strlen(g_log);
    snprintf(g_log + n, sizeof g_log - n, "%s\n", message);
}

static void auto_runs_on_cpu(const char *backend_path, const char *want_log) {
    const char *old = getenv("LOOM_BACKEND_PATH");
    char saved[2048];
    snprintf(saved, sizeof saved, "%s", old ? old : "");
    assert_int_equal(setenv("LOOM_BACKEND_PATH", backend_path, 1), 0);
    g_log[0] = '\0';
    loom_log_set(collect, LOOM_LOG_INFO, NULL);
    loom_model *m = load(g_llama, NULL);
    loom_log_set(NULL, LOOM_LOG_WARN, NULL);
    loom_model_info info = {.size = sizeof info};
    assert_int_equal(loom_model_get_info(m, &info), LOOM_OK);
    assert_string_equal(info.backend, "cpu");
    assert_int_equal(info.device, 0);
    if (!strstr(g_log, want_log)) fail_msg("AUTO's log lacks '%s':\n%s", want_log, g_log);
    assert_non_null(strstr(g_log, "backend auto: using the cpu"));
    loom_model_free(m);
    if (old)
        setenv("LOOM_BACKEND_PATH", saved, 1);
    else
        unsetenv("LOOM_BACKEND_PATH");
}

static void test_auto_falls_back(void **state) {
    (void)state;
    const char *fake_cuda = getenv("LOOM_TEST_FAKE_CUDA_DIR");
    assert_non_null(fake_cuda);
    /* A cuda plugin that loads but finds no device: passed over, with the plugin's reason. */
    auto_runs_on_cpu(fake_cuda, "no driver (libfakedriver.so.1 is not installed)");
    /* No cuda plugin anywhere. */
    auto_runs_on_cpu("/nonexistent-dir", "no plugin libloom-cuda.so");
    /* Named explicitly, the same plugin is an error. */
    assert_int_equal(setenv("LOOM_BACKEND_PATH", fake_cuda, 1), 0);
    loom_model_params p = loom_model_default_params();
    p.backend = "cuda";
    loom_model *m = NULL;
    assert_int_equal(loom_model_load(g_llama, &p, &m), LOOM_ERR_NO_DEVICE);
    assert_non_null(strstr(loom_last_error(), "no driver"));
    p.backend = "auto";
    assert_int_equal(loom_model_load(g_llama, &p, &m), LOOM_OK);
    loom_model_free(m);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cpu_plugin_bits),
        cmocka_unit_test(test_bad_plugins),
        cmocka_unit_test(test_auto_falls_back),
    };
    return cmocka_run_group_tests(tests, setup, NULL);
}
