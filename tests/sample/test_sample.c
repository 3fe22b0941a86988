/* test_sample.c — the public sampler (loom.h): loom_sample and loom_sampler_run over the chain —
 * greedy, filters, determinism, defaults, history and penalties, per-token info, bad input. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "loom.h"

static void test_greedy_picks_arg_max(void **state) {
    (void)state;
    float lg[6] = {0.5f, -INFINITY, 3.0f, 2.9f, NAN, 3.0f};
    loom_sampler_params p = loom_sampler_default_params();
    p.temperature = 0;
    loom_token t = -1;
    assert_int_equal(loom_sample(lg, 6, &p, 0, &t), LOOM_OK);
    assert_int_equal(t, 2); /* ties go to the lower id; NaN and -inf never win */
}

static void test_top_k_1_is_greedy(void **state) {
    (void)state;
    float lg[4] = {1, 4, 2, 3};
    loom_sampler_params p = loom_sampler_default_params();
    p.top_k = 1;
    p.temperature = 5.0f;
    for (uint64_t i = 0; i < 100; i++) {
        loom_token t = -1;
        assert_int_equal(loom_sample(lg, 4, &p, i, &t), LOOM_OK);
        assert_int_equal(t, 1);
    }
}

static void test_filters_restrict_the_support(void **state) {
    (void)state;
    float lg[5] = {0.0f, 1.0f, 2.0f, 3.0f, 10.0f};
    loom_sampler_params p = loom_sampler_default_params();
    p.temperature = 100.0f; /* nearly uniform over what survives */
    p.top_p = 1.0f;
    p.top_k = 2;
    int seen[5] = {0};
    for (uint64_t i = 0; i < 2000; i++) {
        loom_token t;
        assert_int_equal(loom_sample(lg, 5, &p, i, &t), LOOM_OK);
        seen[t]++;
    }
    assert_int_equal(seen[0] + seen[1] + seen[2], 0);
    assert_true(seen[3] > 800 && seen[4] > 800);
    /* top-p acts on the tempered distribution, the one drawn from: at temperature 1 token 4
     * alone has mass > 0.99 ... */
    p.top_k = 0;
    p.top_p = 0.99f;
    p.temperature = 1.0f;
    memset(seen, 0, sizeof seen);
    for (uint64_t i = 0; i < 500; i++) {
        loom_token t;
        assert_int_equal(loom_sample(lg, 5, &p, i, &t), LOOM_OK);
        seen[t]++;
    }
    assert_int_equal(seen[4], 500);
    /* ... while at temperature 100 the same nucleus holds every token. */
    p.temperature = 100.0f;
    memset(seen, 0, sizeof seen);
    for (uint64_t i = 0; i < 2000; i++) {
        loom_token t;
        assert_int_equal(loom_sample(lg, 5, &p, i, &t), LOOM_OK);
        seen[t]++;
    }
    for (int k = 0; k < 5; k++) assert_true(seen[k] > 200);
}

static void test_temperature_matches_distribution(void **state) {
    (void)state;
    float lg[3] = {0.0f, (float)log(2.0), (float)log(4.0)}; /* p = 1/7, 2/7, 4/7 */
    loom_sampler_params p = loom_sampler_default_params();
    p.temperature = 1.0f;
    p.top_k = 0;
    p.top_p = 1.0f;
    int seen[3] = {0};
    const int n = 70000;
    for (int i = 0; i < n; i++) {
        loom_token t;
        assert_int_equal(loom_sample(lg, 3, &p, (uint64_t)i, &t), LOOM_OK);
        seen[t]++;
    }
    /* Each count within 5 standard deviations of its expectation. */
    const double want[3] = {1.0 / 7, 2.0 / 7, 4.0 / 7};
    for (int k = 0; k < 3; k++) {
        double mu = n * want[k], sd = sqrt(n * want[k] * (1 - want[k]));
        assert_true(fabs(seen[k] - mu) < 5 * sd);
    }
}

static void test_same_seed_same_draw(void **state) {
    (void)state;
    float lg[64];
    for (int i = 0; i < 64; i++) lg[i] = (float)((i * 37) % 11) * 0.3f;
    loom_sampler_params p = loom_sampler_default_params();
    p.top_k = 0;
    p.top_p = 1.0f;
    p.temperature = 1.5f;
    int differ = 0;
    for (uint64_t i = 0; i < 200; i++) {
        loom_token a, b, c;
        assert_int_equal(loom_sample(lg, 64, &p, i, &a), LOOM_OK);
        assert_int_equal(loom_sample(lg, 64, &p, i, &b), LOOM_OK);
        assert_int_equal(a, b);
        loom_sampler_params q = p;
        q.seed = p.seed + 1;
        assert_int_equal(loom_sample(lg, 64, &q, i, &c), LOOM_OK);
        differ += a != c;
    }
    assert_true(differ > 100); /* another seed gives another stream */
}

static void test_bad_input(void **state) {
    (void)state;
    float lg[3] = {1, 2, 3};
    loom_sampler_params p = loom_sampler_default_params();
    loom_token t;
    assert_int_equal(loom_sample(NULL, 3, &p, 0, &t), LOOM_ERR_INVALID_ARG);
    assert_int_equal(loom_sample(lg, 0, &p, 0, &t), LOOM_ERR_INVALID_ARG);
    assert_int_equal(loom_sample(lg, 3, NULL, 0, &t), LOOM_ERR_INVALID_ARG);
    p.temperature = -1.0f;
    assert_int_equal(loom_sample(lg, 3, &p, 0, &t), LOOM_ERR_INVALID_ARG);
    assert_non_null(strstr(loom_last_error(), "temperature"));
    p.temperature = NAN;
    assert_int_equal(loom_sample(lg, 3, &p, 0, &t), LOOM_ERR_INVALID_ARG);
    p = loom_sampler_default_params();
    p.top_p = 0.0f;
    assert_int_equal(loom_sample(lg, 3, &p, 0, &t), LOOM_ERR_INVALID_ARG);
    p.top_p = 1.5f;
    assert_int_equal(loom_sample(lg, 3, &p, 0, &t), LOOM_ERR_INVALID_ARG);
    p = loom_sampler_default_params();
    float none[2] = {-INFINITY, NAN};
    assert_int_equal(loom_sample(none, 2, &p, 0, &t), LOOM_ERR_BAD_INPUT);
}

static void test_defaults_switch_new_steps_off(void **state) {
    (void)state;
    loom_sampler_params p = loom_sampler_default_params();
    assert_true(p.temperature == 0.8f && p.top_k == 40 && p.top_p == 0.95f);
    assert_true(p.seed == 0x5EED);
    assert_true(p.min_p == 0 && p.typical_p == 1 && p.logit_bias == NULL && p.n_logit_bias == 0);
    assert_true(p.repeat_penalty == 1 && p.presence_penalty == 0 && p.frequency_penalty == 0);
    assert_int_equal(p.penalty_last_n, 64);
    assert_int_equal(p.entropy_mode, LOOM_ENTROPY_NONE);
    assert_int_equal(p.n_logprobs, 0);
}

static void test_sampler_matches_loom_sample(void **state) {
    (void)state;
    float lg[64];
    for (int i = 0; i < 64; i++) lg[i] = (float)sin(i * 0.7) * 3.0f;
    loom_sampler *s = NULL;
    assert_int_equal(loom_sampler_create(64, &s), LOOM_OK);
    loom_sampler_params p = loom_sampler_default_params();
    p.entropy_mode = LOOM_ENTROPY_EDT;
    p.min_p = 0.05f;
    for (uint64_t i = 0; i < 200; i++) {
        loom_token a = -1;
        loom_token_info info = {.size = sizeof info};
        assert_int_equal(loom_sample(lg, 64, &p, i, &a), LOOM_OK);
        assert_int_equal(loom_sampler_run(s, lg, &p, NULL, 0, i, &info), LOOM_OK);
        assert_int_equal(a, info.token);
        assert_true(info.n_top_raw == 0 && info.n_top_final == 0);
    }
    loom_sampler_free(s);
    loom_sampler_free(NULL);
}

static void test_sampler_history_and_info(void **state) {
    (void)state;
    float lg[6] = {3.0f, 2.5f, 1.0f, 0.5f, -1.0f, -INFINITY};
    loom_sampler *s = NULL;
    assert_int_equal(loom_sampler_create(6, &s), LOOM_OK);
    loom_sampler_params p = loom_sampler_default_params();
    p.temperature = 0;
    loom_token_info info = {.size = sizeof info};
    /* Greedy: a point mass, and the model's own log-probability of the arg max. */
    assert_int_equal(loom_sampler_run(s, lg, &p, NULL, 0, 0, &info), LOOM_OK);
    assert_int_equal(info.token, 0);
    assert_true(info.logprob_final == 0 && info.n_candidates == 1 && info.temperature == 0);
    double z = 0;
    for (int i = 0; i < 5; i++) z += exp(lg[i]);
    assert_true(fabs(info.logprob_raw - (3.0 - log(z))) < 1e-6);
    assert_true(info.entropy > 0 && info.varentropy > 0);
    /* A presence penalty over the history moves greedy off the tokens seen. */
    const loom_token hist[3] = {4, 0, 1};
    p.presence_penalty = 5.0f;
    assert_int_equal(loom_sampler_run(s, lg, &p, hist, 3, 0, &info), LOOM_OK);
    assert_int_equal(info.token, 2);
    p.penalty_last_n = 1; /* only token 1 is in the window */
    assert_int_equal(loom_sampler_run(s, lg, &p, hist, 3, 0, &info), LOOM_OK);
    assert_int_equal(info.token, 0);
    /* Logit bias bans token 0; logprobs grow from 2 to 5 entries (the arrays are regrown). */
    loom_logit_bias ban = {0, -INFINITY};
    p = loom_sampler_default_params();
    p.top_k = 0, p.top_p = 1.0f, p.temperature = 1.0f;
    p.logit_bias = &ban, p.n_logit_bias = 1;
    for (int32_t n = 2; n <= 6; n += 3) {
        p.n_logprobs = n;
        assert_int_equal(loom_sampler_run(s, lg, &p, NULL, 0, 7, &info), LOOM_OK);
        assert_true(info.token != 0);
        assert_int_equal(info.n_top_raw, n < 5 ? n : 5); /* 5 finite logits */
        assert_int_equal(info.n_top_final, n < 4 ? n : 4);
        assert_int_equal(info.top_raw[0].id, 0); /* raw: before the bias */
        assert_int_equal(info.top_final[0].id, 1);
        assert_true(fabs(info.top_raw[0].logprob - (3.0 - log(z))) < 1e-6);
    }
    loom_sampler_free(s);
}

static void test_sampler_bad_input(void **state) {
    (void)state;
    float lg[4] = {1, 2, 3, 4};
    loom_sampler *s = NULL;
    assert_int_equal(loom_sampler_create(0, &s), LOOM_ERR_INVALID_ARG);
    assert_int_equal(loom_sampler_create(4, NULL), LOOM_ERR_INVALID_ARG);
    assert_int_equal(loom_sampler_create(4, &s), LOOM_OK);
    loom_token_info info = {.size = sizeof info};
    loom_sampler_params p = loom_sampler_default_params();
    loom_logit_bias bad = {4, 1.0f};
    p.logit_bias = &bad, p.n_logit_bias = 1;
    assert_int_equal(loom_sampler_run(s, lg, &p, NULL, 0, 0, &info), LOOM_ERR_INVALID_ARG);
    assert_non_null(strstr(loom_last_error(), "logit bias"));
    p.logit_bias = NULL;
    assert_int_equal(loom_sampler_run(s, lg, &p, NULL, 0, 0, &info), LOOM_ERR_INVALID_ARG);
    p = loom_sampler_default_params();
    p.frequency_penalty = NAN;
    assert_int_equal(loom_sampler_run(s, lg, &p, NULL, 0, 0, &info), LOOM_ERR_INVALID_ARG);
    assert_non_null(strstr(loom_last_error(), "frequency_penalty"));
    p = loom_sampler_default_params();
    p.n_logprobs = 5; /* more than the vocabulary */
    assert_int_equal(loom_sampler_run(s, lg, &p, NULL, 0, 0, &info), LOOM_ERR_INVALID_ARG);
    p = loom_sampler_default_params();
    const loom_token hist[2] = {1, 9};
    assert_int_equal(loom_sampler_run(s, lg, &p, hist, 2, 0, &info), LOOM_ERR_BAD_INPUT);
    assert_int_equal(loom_sampler_run(s, lg, &p, NULL, 2, 0, &info), LOOM_ERR_INVALID_ARG);
    assert_int_equal(loom_sampler_run(s, NULL, &p, NULL, 0, 0, &info), LOOM_ERR_INVALID_ARG);
    float pinf[4] = {0, INFINITY, 0, 0};
    assert_int_equal(loom_sampler_run(s, pinf, &p, NULL, 0, 0, &info), LOOM_ERR_BAD_INPUT);
    loom_sampler_free(s);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_greedy_picks_arg_max),
        cmocka_unit_test(test_top_k_1_is_greedy),
        cmocka_unit_test(test_filters_restrict_the_support),
        cmocka_unit_test(test_temperature_matches_distribution),
        cmocka_unit_test(test_same_seed_same_draw),
        cmocka_unit_test(test_bad_input),
        cmocka_unit_test(test_defaults_switch_new_steps_off),
        cmocka_unit_test(test_sampler_matches_loom_sample),
        cmocka_unit_test(test_sampler_history_and_info),
        cmocka_unit_test(test_sampler_bad_input),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
