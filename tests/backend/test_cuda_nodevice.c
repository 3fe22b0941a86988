/* test_cuda_nodevice.c — the real CUDA plugin (libloom-cuda.so) on a machine without a GPU or
 * driver, as CI runs it: libloom still loads and runs, `backend = "cuda"` fails with
 * LOOM_ERR_NO_DEVICE and a message saying what is missing, and AUTO passes over the plugin (the
 * log says why) and runs on the CPU. Where the plugin finds a device this test has nothing to
 * check and exits 77 (skipped); test_cuda_ops runs there instead. Built only where the CUDA
 * backend is (LOOM_CUDA). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "backend/backend.h"
#include "loom.h"
#include "model/synth_model.h"

static char g_llama[512];
static char g_log[8192];

static void collect(loom_log_level level, const char *message, void *user) {
    (void)level;
    (void)user;
    size_t n = strlen(g_log);
    snprintf(g_log + n, sizeof g_log - n, "%s\n", message);
}

static void test_named_cuda_is_no_device(void **state) {
    (void)state;
    loom_model_params p = loom_model_default_params();
    p.backend = "cuda";
    loom_model *m = NULL;
    assert_int_equal(loom_model_load(g_llama, &p, &m), LOOM_ERR_NO_DEVICE);
    assert_null(m);
    const char *msg = loom_last_error();
    printf("backend cuda: %s\n", msg);
    /* the plugin was found and opened: the message comes from it, with CUDA's reason */
    assert_non_null(strstr(msg, "libloom-cuda.so"));
    assert_non_null(strstr(msg, "cuda: no usable CUDA device"));
    assert_non_null(strstr(msg, "cuda"));
    /* a device index beyond any count is refused the same way, never a crash */
    p.device = 7;
    assert_int_equal(loom_model_load(g_llama, &p, &m), LOOM_ERR_NO_DEVICE);
}

static void test_auto_runs_on_cpu(void **state) {
    (void)state;
    g_log[0] = '\0';
    loom_log_set(collect, LOOM_LOG_INFO, NULL);
    loom_model_params p = loom_model_default_params();
    p.n_threads = 2;
    loom_model *m = NULL;
    loom_status st = loom_model_load(g_llama, &p, &m);
    loom_log_set(NULL, LOOM_LOG_WARN, NULL);
    assert_int_equal(st, LOOM_OK);
    loom_model_info info = {.size = sizeof info};
    assert_int_equal(loom_model_get_info(m, &info), LOOM_OK);
    assert_string_equal(info.backend, "cpu");
    if (!strstr(g_log, "cuda: no usable CUDA device"))
        fail_msg("AUTO's log does not say why cuda was passed over:\n%s", g_log);
    assert_non_null(strstr(g_log, "backend auto: using the cpu"));
    /* and the model runs */
    loom_session *s = NULL;
    assert_int_equal(loom_session_create(m, NULL, &s), LOOM_OK);
    loom_token toks[4] = {3, 5, 7, 9};
    assert_int_equal(loom_session_decode(s, toks, 4, false), LOOM_OK);
    assert_non_null(loom_session_logits(s, -1));
    loom_session_free(s);
    loom_model_free(m);
}

int main(void) {
#if !defined(LOOM_TEST_CUDA_BUILT)
    printf("SKIP: the CUDA backend is not built (LOOM_CUDA=OFF or no nvcc)\n");
    return 77;
#endif
    loom_backend_open_params op = {.device = 0, .n_threads = 1};
    loom__backend *be = NULL;
    loom_status st = loom__backend_open("cuda", &op, &be);
    if (st == LOOM_OK) {
        printf("SKIP: a CUDA device is present (%s): test_cuda_ops checks it\n", be->path);
        loom__backend_close(be);
        return 77;
    }
    if (st != LOOM_ERR_NO_DEVICE) {
        fprintf(stderr, "opening the cuda plugin: status %d: %s\n", (int)st, loom_last_error());
        return 1;
    }
    synth_path(g_llama, sizeof g_llama, "cuda-nodevice-llama.gguf");
    if (synth_write(g_llama, &SYNTH_LLAMA, 21) != 0) return 1;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_named_cuda_is_no_device),
        cmocka_unit_test(test_auto_runs_on_cpu),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
