/* test_synthetic.c — loom_model_load_synthetic: every architecture with every weight type loads
 * and runs (finite logits with a spread, neither flat nor exploding), its shape is what was
 * asked, the same seed gives the same bits and another seed other ones, a preset fills the
 * published shape, rows that are not whole blocks fall back to q8_0, and bad parameters give
 * INVALID_ARG or UNSUPPORTED with a message, never a crash. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <math.h>

#include "loom.h"

static loom_model *load(const loom_synthetic_params *sp) {
    loom_model_params mp = loom_model_default_params();
    mp.backend = "cpu";
    mp.n_threads = 2;
    loom_model *m = NULL;
    loom_status st = loom_model_load_synthetic(sp, &mp, &m);
    if (st != LOOM_OK)
        fail_msg("synthetic %s/%s: %s", sp->arch, sp->weight_type, loom_last_error());
    return m;
}

/* Logits of the last of 12 tokens into out (n_vocab floats). */
static void last_logits(loom_model *m, float *out, int32_t V) {
    loom_session *s = NULL;
    assert_int_equal(loom_session_create(m, NULL, &s), LOOM_OK);
    loom_token toks[12];
    for (int i = 0; i < 12; i++) toks[i] = (loom_token)(3 + (i * 97) % (V - 3));
    assert_int_equal(loom_session_decode(s, toks, 12, false), LOOM_OK);
    memcpy(out, loom_session_logits(s, -1), sizeof(float) * (size_t)V);
    loom_session_free(s);
}

static loom_synthetic_params small(const char *arch, const char *type) {
    loom_synthetic_params sp = loom_synthetic_default_params();
    sp.arch = arch;
    sp.n_vocab = 512;
    sp.n_embd = 256;
    sp.n_head = 4;
    sp.n_head_kv = 2;
    sp.n_ff = 512;
    sp.n_layer = 2;
    sp.n_ctx = 256;
    sp.window = strcmp(arch, "gemma3") == 0 ? 16 : 0;
    sp.weight_type = type;
    sp.seed = 7;
    return sp;
}

static void test_every_arch_and_type(void **state) {
    (void)state;
    const char *archs[] = {"llama", "qwen2", "gemma3"};
    const char *types[] = {"f32",  "f16",  "bf16", "q8_0", "q4_0", "q5_0",
                           "q4_K", "q5_K", "q6_K", "q4_1", "q3_K", "q2_K"};
    float *lg = malloc(sizeof(float) * 512);
    for (int a = 0; a < 3; a++) {
        for (size_t t = 0; t < sizeof types / sizeof types[0]; t++) {
            loom_synthetic_params sp = small(archs[a], types[t]);
            loom_model *m = load(&sp);
            loom_model_info info = {.size = sizeof info};
            assert_int_equal(loom_model_get_info(m, &info), LOOM_OK);
            assert_string_equal(info.architecture, archs[a]);
            assert_int_equal(info.n_vocab, 512);
            assert_int_equal(info.n_layer, 2);
            assert_int_equal(info.n_embd, 256);
            last_logits(m, lg, 512);
            double sum = 0, sq = 0, mx = 0;
            for (int i = 0; i < 512; i++) {
                if (!isfinite(lg[i]))
                    fail_msg("%s/%s: logit %d = %g", archs[a], types[t], i, lg[i]);
                sum += lg[i];
                sq += (double)lg[i] * lg[i];
                if (fabs(lg[i]) > mx) mx = fabs(lg[i]);
            }
            const double sd = sqrt(sq / 512 - (sum / 512) * (sum / 512));
            if (!(sd > 1e-3 && mx < 1e4))
                fail_msg("%s/%s: logits spread %g, largest %g", archs[a], types[t], sd, mx);
            loom_model_free(m);
        }
    }
    free(lg);
}

static void test_seed(void **state) {
    (void)state;
    float *a = malloc(sizeof(float) * 512), *b = malloc(sizeof(float) * 512);
    loom_synthetic_params sp = small("llama", "q4_K");
    loom_model *m = load(&sp);
    last_logits(m, a, 512);
    loom_model_free(m);
    m = load(&sp);
    last_logits(m, b, 512);
    loom_model_free(m);
    assert_memory_equal(a, b, sizeof(float) * 512);
    sp.seed = 8;
    m = load(&sp);
    last_logits(m, b, 512);
    loom_model_free(m);
    assert_true(memcmp(a, b, sizeof(float) * 512) != 0);
    free(a);
    free(b);
}

static void test_preset_and_fallback(void **state) {
    (void)state;
    loom_synthetic_params sp = loom_synthetic_default_params();
    sp.preset = "smollm2-135m";
    sp.n_layer = 2; /* a field set keeps its value: two of the preset's layers */
    sp.weight_type = "q8_0";
    loom_model *m = load(&sp);
    loom_model_info info = {.size = sizeof info};
    assert_int_equal(loom_model_get_info(m, &info), LOOM_OK);
    assert_string_equal(info.architecture, "llama");
    assert_int_equal(info.n_vocab, 49152);
    assert_int_equal(info.n_embd, 576);
    assert_int_equal(info.n_layer, 2);
    loom_model_free(m);
    /* q4_K rows need 256 values: 576 is not whole blocks, so those matrices are q8_0 */
    sp.weight_type = "q4_K";
    m = load(&sp);
    float *lg = malloc(sizeof(float) * 49152);
    last_logits(m, lg, 49152);
    for (int i = 0; i < 49152; i++) assert_true(isfinite(lg[i]));
    free(lg);
    loom_model_free(m);
}

static void expect_bad(loom_synthetic_params sp, loom_status want, const char *text) {
    loom_model *m = (loom_model *)0x1;
    loom_status st = loom_model_load_synthetic(&sp, NULL, &m);
    if (st != want) fail_msg("status %d, want %d: %s", (int)st, (int)want, loom_last_error());
    if (text && !strstr(loom_last_error(), text))
        fail_msg("message '%s' lacks '%s'", loom_last_error(), text);
    assert_ptr_equal(m, (loom_model *)0x1); /* untouched */
}

static void test_bad_params(void **state) {
    (void)state;
    loom_model *m = NULL;
    assert_int_equal(loom_model_load_synthetic(NULL, NULL, &m), LOOM_ERR_INVALID_ARG);
    loom_synthetic_params sp = small("llama", "f16");
    assert_int_equal(loom_model_load_synthetic(&sp, NULL, NULL), LOOM_ERR_INVALID_ARG);
    loom_synthetic_params b = sp;
    b.preset = "llama-9000";
    expect_bad(b, LOOM_ERR_INVALID_ARG, "unknown preset");
    b = sp;
    b.arch = "mamba";
    expect_bad(b, LOOM_ERR_INVALID_ARG, "arch 'mamba'");
    b = sp;
    b.arch = NULL;
    expect_bad(b, LOOM_ERR_INVALID_ARG, "no arch");
    b = sp;
    b.n_head_kv = 3;
    expect_bad(b, LOOM_ERR_INVALID_ARG, "not a multiple");
    b = sp;
    b.n_layer = 0;
    expect_bad(b, LOOM_ERR_INVALID_ARG, "positive");
    b = sp;
    b.n_vocab = -5;
    expect_bad(b, LOOM_ERR_INVALID_ARG, "positive");
    b = sp;
    b.weight_type = "q9_9";
    expect_bad(b, LOOM_ERR_UNSUPPORTED, "unknown weight type");
    b = sp;
    b.weight_type = "q8_K";
    expect_bad(b, LOOM_ERR_UNSUPPORTED, "not a weight format");
    b = sp;
    b.n_embd = 1 << 20;
    b.n_vocab = 1 << 21;
    expect_bad(b, LOOM_ERR_INVALID_ARG, "2^40");
    b = sp;
    b.size = 4; /* smaller than the struct ever was */
    expect_bad(b, LOOM_ERR_INVALID_ARG, NULL);
    /* model params are checked as loom_model_load checks them */
    loom_model_params mp = loom_model_default_params();
    mp.device = -1;
    assert_int_equal(loom_model_load_synthetic(&sp, &mp, &m), LOOM_ERR_INVALID_ARG);
    mp = loom_model_default_params();
    mp.backend = "no-such-backend";
    assert_int_equal(loom_model_load_synthetic(&sp, &mp, &m), LOOM_ERR_NO_DEVICE);
}

/* loom_generate with n_predict = INT32_MAX holds only what the context allows (issue 18, bug 5:
 * the buffer was n_prompt + n_predict ids, 8 GB, allocated up front) and ends with LOOM_OK
 * when the context is full, having sampled n_ctx - n_prompt + 1 tokens. */
static void test_generate_huge_n_predict(void **state) {
    (void)state;
    loom_synthetic_params sp = small("llama", "f32");
    loom_model *m = load(&sp);
    loom_session_params spar = loom_session_default_params();
    spar.n_ctx = 24;
    loom_session *s = NULL;
    assert_int_equal(loom_session_create(m, &spar, &s), LOOM_OK);
    loom_generate_params gp = loom_generate_default_params();
    gp.n_predict = INT32_MAX;
    gp.stop_at_eos = false;
    loom_generate_stats st = {.size = sizeof st};
    assert_int_equal(loom_generate(s, "a b c", &gp, NULL, NULL, &st), LOOM_OK);
    assert_true(st.n_prompt > 0 && st.n_prompt < 24);
    assert_int_equal(st.n_generated, 24 - st.n_prompt + 1);
    loom_session_free(s);
    loom_model_free(m);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_arch_and_type),     cmocka_unit_test(test_seed),
        cmocka_unit_test(test_preset_and_fallback),     cmocka_unit_test(test_bad_params),
        cmocka_unit_test(test_generate_huge_n_predict),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
