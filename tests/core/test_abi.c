/* test_abi.c — core/abi.h, what keeps loom.h's structs compatible across versions, on two
 * versions of a struct (v1; v2 = v1 plus an appended field): a library of either version
 * reads a caller of either version (the missing field keeps its default; a newer caller's
 * extra field is refused only when set), writes a result into a caller of either version
 * without touching a byte past the caller's size, and refuses sizes below the first version.
 * Then the same through the public API (an engine's parameters and statistics). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "core/abi.h"
#include "loom.h"
#include "model/synth_model.h"

typedef struct v1 {
    size_t size;
    int32_t a;
    double b;
} v1;

typedef struct v2 {
    size_t size;
    int32_t a;
    double b;
    int32_t c; /* appended in "version 2" */
} v2;

#define MIN LOOM__ABI_END(v1, b)

static void test_params_in(void **state) {
    (void)state;
    /* A v2 library, a v1 caller: a and b come from the caller, c keeps its default. */
    v2 lib = {.size = sizeof lib, .a = 1, .b = 2.0, .c = 42};
    v1 old = {.size = sizeof old, .a = 7, .b = 8.5};
    assert_int_equal(loom__abi_params_in(&lib, sizeof lib, &old, MIN, "t"), LOOM_OK);
    assert_int_equal(lib.a, 7);
    assert_true(lib.b == 8.5);
    assert_int_equal(lib.c, 42);
    assert_int_equal(lib.size, sizeof lib);
    /* A v1 library, a v2 caller that left c at its zero default: fine; one that set c: the
     * library cannot do what was asked. */
    v1 lib1 = {.size = sizeof lib1, .a = 1, .b = 2.0};
    v2 newer;
    memset(&newer, 0, sizeof newer);
    newer.size = sizeof newer, newer.a = 3, newer.b = 4.0;
    assert_int_equal(loom__abi_params_in(&lib1, sizeof lib1, &newer, MIN, "t"), LOOM_OK);
    assert_int_equal(lib1.a, 3);
    newer.c = 5;
    assert_int_equal(loom__abi_params_in(&lib1, sizeof lib1, &newer, MIN, "t"),
                     LOOM_ERR_UNSUPPORTED);
    assert_non_null(strstr(loom_last_error(), "a field of a newer loom"));
    /* Too small, and NULL (the defaults). */
    v1 tiny = {.size = sizeof(size_t) + 4};
    assert_int_equal(loom__abi_params_in(&lib, sizeof lib, &tiny, MIN, "t"), LOOM_ERR_INVALID_ARG);
    v2 keep = lib;
    assert_int_equal(loom__abi_params_in(&lib, sizeof lib, NULL, MIN, "t"), LOOM_OK);
    assert_memory_equal(&keep, &lib, sizeof lib);
}

static void test_result_out(void **state) {
    (void)state;
    v2 src = {.size = sizeof src, .a = 9, .b = 10.0, .c = 11};
    /* a v1 caller with a guard after it: nothing past its size is written */
    struct {
        v1 r;
        unsigned char guard[16];
    } old;
    memset(&old, 0xAB, sizeof old);
    old.r.size = sizeof old.r;
    assert_int_equal(loom__abi_result_out(&old.r, &src, sizeof src, MIN, "t"), LOOM_OK);
    assert_int_equal(old.r.a, 9);
    assert_true(old.r.b == 10.0);
    assert_int_equal(old.r.size, sizeof old.r);
    for (size_t i = 0; i < sizeof old.guard; i++) assert_int_equal(old.guard[i], 0xAB);
    /* a v2 caller of a v1 library: the fields it lacks stay as the caller left them */
    v1 src1 = {.size = sizeof src1, .a = 1, .b = 2.0};
    v2 newer = {.size = sizeof newer, .c = -1};
    assert_int_equal(loom__abi_result_out(&newer, &src1, sizeof src1, MIN, "t"), LOOM_OK);
    assert_int_equal(newer.a, 1);
    assert_int_equal(newer.c, -1);
    v1 unset = {0};
    assert_int_equal(loom__abi_result_out(&unset, &src, sizeof src, MIN, "t"),
                     LOOM_ERR_INVALID_ARG);
    assert_int_equal(loom__abi_result_out(NULL, &src, sizeof src, MIN, "t"), LOOM_ERR_INVALID_ARG);
}

static void test_defaults_out(void **state) {
    (void)state;
    v2 defaults = {.size = sizeof defaults, .a = 5, .b = 6.0, .c = 7};
    struct {
        v1 p;
        unsigned char guard[8];
    } old;
    memset(&old, 0xCD, sizeof old);
    loom__abi_defaults_out(&old.p, sizeof old.p, &defaults, sizeof defaults);
    assert_int_equal(old.p.size, sizeof old.p);
    assert_int_equal(old.p.a, 5);
    for (size_t i = 0; i < sizeof old.guard; i++) assert_int_equal(old.guard[i], 0xCD);
    /* a newer caller's extra bytes are zeroed: its new fields read as "not set" */
    unsigned char big[sizeof(v2) + 16];
    memset(big, 0xEE, sizeof big);
    loom__abi_defaults_out(big, sizeof big, &defaults, sizeof defaults);
    for (size_t i = sizeof(v2); i < sizeof big; i++) assert_int_equal(big[i], 0);
}

/* The public API: a caller compiled against a newer header (a longer struct) with its extra
 * bytes unset works; with them set it is refused; a result struct longer than the library's
 * gets the library's part and keeps the rest. */
static void test_public_api(void **state) {
    (void)state;
    char path[512];
    synth_path(path, sizeof path, "abi-llama.gguf");
    assert_int_equal(synth_write(path, &SYNTH_LLAMA, 41), 0);
    struct {
        loom_model_params p;
        unsigned char future[24];
    } mp;
    memset(&mp, 0, sizeof mp);
    loom_model_params_init(&mp.p, sizeof mp); /* as a newer header's sizeof would */
    assert_int_equal(mp.p.size, sizeof mp);
    assert_true(mp.p.use_mmap);
    mp.p.backend = "cpu";
    mp.p.n_threads = 1;
    loom_model *m = NULL;
    assert_int_equal(loom_model_load(path, &mp.p, &m), LOOM_OK);
    loom_model_free(m);
    mp.future[3] = 1;
    m = NULL;
    assert_int_equal(loom_model_load(path, &mp.p, &m), LOOM_ERR_UNSUPPORTED);
    assert_null(m);
    mp.future[3] = 0;
    mp.p.size = 4; /* smaller than loom_model_params ever was */
    assert_int_equal(loom_model_load(path, &mp.p, &m), LOOM_ERR_INVALID_ARG);
    mp.p.size = sizeof mp;
    assert_int_equal(loom_model_load(path, &mp.p, &m), LOOM_OK);

    loom_engine_params ep = loom_engine_default_params();
    ep.kv_bytes = 1 << 20;
    ep.max_ctx = 64;
    ep.max_seqs = 4;
    ep.max_batched_tokens = 16;
    loom_engine *e = NULL;
    assert_int_equal(loom_engine_create(m, &ep, &e), LOOM_OK);
    struct {
        loom_engine_stats st;
        unsigned char future[16];
    } big;
    memset(&big, 0x5A, sizeof big);
    big.st.size = sizeof big;
    assert_int_equal(loom_engine_get_stats(e, &big.st), LOOM_OK);
    assert_int_equal(big.st.size, sizeof big);
    assert_int_equal(big.st.kv_blocks_total, big.st.kv_blocks_free); /* filled */
    for (size_t i = 0; i < sizeof big.future; i++) assert_int_equal(big.future[i], 0x5A);
    loom_engine_stats unset = {0};
    assert_int_equal(loom_engine_get_stats(e, &unset), LOOM_ERR_INVALID_ARG);
    assert_non_null(strstr(loom_last_error(), "sizeof"));
    /* A request whose sampler settings are given, and one without (the defaults). */
    loom_token prompt[4] = {5, 6, 7, 8};
    loom_request_params rq = loom_request_default_params();
    rq.prompt_tokens = prompt;
    rq.n_prompt_tokens = 4;
    rq.max_tokens = 2;
    loom_request_id id = 0;
    assert_int_equal(loom_engine_submit(e, &rq, &id), LOOM_OK);
    loom_sampler_params sp = loom_sampler_default_params();
    sp.top_p = 1.5f;
    rq.sampler = &sp;
    assert_int_equal(loom_engine_submit(e, &rq, &id), LOOM_ERR_INVALID_ARG);
    assert_non_null(strstr(loom_last_error(), "top_p"));
    sp.top_p = 0.9f;
    sp.size = 3;
    assert_int_equal(loom_engine_submit(e, &rq, &id), LOOM_ERR_INVALID_ARG);
    loom_engine_destroy(e);
    loom_model_free(m);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_params_in),
        cmocka_unit_test(test_result_out),
        cmocka_unit_test(test_defaults_out),
        cmocka_unit_test(test_public_api),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
