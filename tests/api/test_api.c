/* test_api.c — the public API's contracts that need no model: versions, status strings, the
 * thread-local last error, and argument validation of every entry point. */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "loom.h"

static void test_version(void **state) {
    (void)state;
    char want[32];
    snprintf(want, sizeof want, "%d.%d.%d", LOOM_VERSION_MAJOR, LOOM_VERSION_MINOR,
             LOOM_VERSION_PATCH);
    assert_string_equal(loom_version(), want);
    assert_int_equal(loom_version_number(), LOOM_VERSION_NUMBER);
}

static void test_status_strings(void **state) {
    (void)state;
    assert_string_equal(loom_status_str(LOOM_OK), "success");
    assert_string_equal(loom_status_str(LOOM_ERR_BAD_MODEL), "malformed model file");
    assert_string_equal(loom_status_str((loom_status)12345), "unknown status");
    /* Values are part of the ABI. */
    assert_int_equal(LOOM_ERR_INVALID_ARG, 1);
    assert_int_equal(LOOM_ERR_UNSUPPORTED, 5);
    assert_int_equal(LOOM_ERR_INTERNAL, 10);
}

static void *fail_in_thread(void *arg) {
    (void)arg;
    loom_model *m = NULL;
    loom_status st = loom_model_load("/nonexistent/other-thread.gguf", NULL, &m);
    return (void *)(intptr_t)(st == LOOM_ERR_IO && strstr(loom_last_error(), "other-thread"));
}

static void test_last_error_is_thread_local(void **state) {
    (void)state;
    loom_model *m = NULL;
    assert_int_equal(loom_model_load("/nonexistent/main-thread.gguf", NULL, &m), LOOM_ERR_IO);
    assert_null(m);
    assert_non_null(strstr(loom_last_error(), "main-thread"));
    pthread_t th;
    void *ok = NULL;
    assert_int_equal(pthread_create(&th, NULL, fail_in_thread, NULL), 0);
    assert_int_equal(pthread_join(th, &ok), 0);
    assert_true((intptr_t)ok);
    /* The other thread's failure did not touch this thread's message. */
    assert_non_null(strstr(loom_last_error(), "main-thread"));
}

static void test_model_load_bad_args(void **state) {
    (void)state;
    loom_model *m = NULL;
    assert_int_equal(loom_model_load(NULL, NULL, &m), LOOM_ERR_INVALID_ARG);
    assert_int_equal(loom_model_load("x.gguf", NULL, NULL), LOOM_ERR_INVALID_ARG);
    loom_model_params p = loom_model_default_params();
    p.n_threads = 1 << 20;
    assert_int_equal(loom_model_load("x.gguf", &p, &m), LOOM_ERR_INVALID_ARG);
    assert_null(m);
    /* A directory is not a model file. */
    assert_int_not_equal(loom_model_load("/", NULL, &m), LOOM_OK);
    assert_null(m);
    loom_model_free(NULL);
}

static void test_null_handles(void **state) {
    (void)state;
    loom_session *s = NULL;
    assert_int_equal(loom_session_create(NULL, NULL, &s), LOOM_ERR_INVALID_ARG);
    assert_null(s);
    loom_session_free(NULL);
    loom_session_reset(NULL);
    assert_int_equal(loom_session_n_past(NULL), 0);
    assert_null(loom_session_logits(NULL, -1));
    size_t n = 99;
    assert_int_equal(loom_tokenize(NULL, "a", 1, 0, NULL, 0, &n), LOOM_ERR_INVALID_ARG);
    assert_int_equal(loom_detokenize(NULL, NULL, 0, 0, NULL, 0, &n), LOOM_ERR_INVALID_ARG);
    loom_token t = 1;
    assert_int_equal(loom_session_decode(NULL, &t, 1, false), LOOM_ERR_INVALID_ARG);
    assert_int_equal(loom_generate(NULL, "x", NULL, NULL, NULL, NULL), LOOM_ERR_INVALID_ARG);
    loom_model_info info = {.size = sizeof info};
    assert_int_equal(loom_model_get_info(NULL, &info), LOOM_ERR_INVALID_ARG);
}

static void test_default_params(void **state) {
    (void)state;
    loom_model_params mp = loom_model_default_params();
    assert_true(mp.use_mmap);
    assert_false(mp.vocab_only);
    loom_session_params sp = loom_session_default_params();
    assert_int_equal(sp.block_size, 16);
    assert_int_equal(sp.n_batch, 512);
    loom_generate_params gp = loom_generate_default_params();
    assert_int_equal(gp.n_predict, 128);
    assert_true(gp.stop_at_eos);
}

/* The engine's public surface that needs no model: defaults of the newer fields, argument
 * checks, and the clock arrival_s is given in. */
static void test_engine_without_model(void **state) {
    (void)state;
    loom_engine_params ep = loom_engine_default_params();
    assert_null(ep.trace);
    loom_generate_params gp = loom_generate_default_params();
    assert_null(gp.trace);
    loom_request_params rp = loom_request_default_params();
    assert_true(rp.arrival_s == 0.0);
    loom_generation *g = NULL;
    assert_int_equal(loom_engine_generate(NULL, &rp, NULL, NULL, &g), LOOM_ERR_INVALID_ARG);
    assert_null(g);
    loom_generation_free(NULL);
    loom_engine_stats st = {.size = sizeof st};
    assert_int_equal(loom_engine_get_stats(NULL, &st), LOOM_ERR_INVALID_ARG);
    /* loom_engine_now is CLOCK_MONOTONIC in seconds, and never goes back. */
    double a = loom_engine_now();
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    double mono = (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
    double b = loom_engine_now();
    assert_true(a > 0 && a <= mono + 1e-6 && mono <= b + 1e-6 && a <= b);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_version),
        cmocka_unit_test(test_status_strings),
        cmocka_unit_test(test_last_error_is_thread_local),
        cmocka_unit_test(test_model_load_bad_args),
        cmocka_unit_test(test_null_handles),
        cmocka_unit_test(test_default_params),
        cmocka_unit_test(test_engine_without_model),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
