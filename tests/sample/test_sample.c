/* test_sample.c — the minimal sampler: greedy, filters, determinism, and bad input. */
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
    /* top-p on the temperature-1 distribution: token 4 alone has mass > 0.99. */
    p.top_k = 0;
    p.top_p = 0.99f;
    memset(seen, 0, sizeof seen);
    for (uint64_t i = 0; i < 500; i++) {
        loom_token t;
        assert_int_equal(loom_sample(lg, 5, &p, i, &t), LOOM_OK);
        seen[t]++;
    }
    assert_int_equal(seen[4], 500);
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

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_greedy_picks_arg_max),
        cmocka_unit_test(test_top_k_1_is_greedy),
        cmocka_unit_test(test_filters_restrict_the_support),
        cmocka_unit_test(test_temperature_matches_distribution),
        cmocka_unit_test(test_same_seed_same_draw),
        cmocka_unit_test(test_bad_input),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
