/* test_threadpool.c — the thread pool calls every ith exactly once per run, runs complete
 * before loom__threadpool_run returns, and create/destroy handle bad arguments. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <stdatomic.h>
#include <string.h>
#include <time.h>

#include "core/threadpool.h"

#define MAX_TH 8

/* ------------------------------------------------------------------------------------------ */
/* Every ith exactly once                                                                     */
/* ------------------------------------------------------------------------------------------ */

typedef struct count_arg {
    atomic_int calls[MAX_TH]; /* per ith, this run */
    atomic_int bad_nth;       /* calls that saw a wrong nth or ith */
    int expect_nth;
} count_arg;

static void count_task(void *p, int ith, int nth) {
    count_arg *a = p;
    if (nth != a->expect_nth || ith < 0 || ith >= nth || ith >= MAX_TH) {
        atomic_fetch_add(&a->bad_nth, 1);
        return;
    }
    atomic_fetch_add(&a->calls[ith], 1);
}

static void check_runs(int n_threads, int n_runs) {
    loom__threadpool *tp = NULL;
    assert_int_equal(loom__threadpool_create(n_threads, LOOM__TP_WAKEFUL_NS, &tp), LOOM_OK);
    assert_non_null(tp);
    assert_int_equal(loom__threadpool_size(tp), n_threads);
    count_arg a;
    for (int r = 0; r < n_runs; r++) {
        memset(&a, 0, sizeof a);
        a.expect_nth = n_threads;
        loom__threadpool_run(tp, count_task, &a);
        /* Plain reads after run returned: every call must have completed already. */
        for (int i = 0; i < MAX_TH; i++)
            assert_int_equal(atomic_load(&a.calls[i]), i < n_threads ? 1 : 0);
        assert_int_equal(atomic_load(&a.bad_nth), 0);
    }
    loom__threadpool_destroy(tp);
}

static void test_each_ith_once(void **state) {
    (void)state;
    for (int n = 1; n <= 4; n++) check_runs(n, 3000);
}

/* ------------------------------------------------------------------------------------------ */
/* Results are correct (a parallel sum over split ranges)                                     */
/* ------------------------------------------------------------------------------------------ */

typedef struct sum_arg {
    const int32_t *v;
    int64_t n;
    int64_t partial[MAX_TH]; /* each thread writes only its own slot */
} sum_arg;

static void sum_task(void *p, int ith, int nth) {
    sum_arg *a = p;
    int64_t b, e;
    loom__split_range(a->n, ith, nth, &b, &e);
    int64_t s = 0;
    for (int64_t i = b; i < e; i++) s += a->v[i];
    a->partial[ith] = s;
}

static void test_results(void **state) {
    (void)state;
    enum { N = 10007 };
    static int32_t v[N];
    int64_t expect = 0;
    for (int i = 0; i < N; i++) {
        v[i] = (i * 7919) % 1000 - 500;
        expect += v[i];
    }
    for (int n = 1; n <= 4; n++) {
        loom__threadpool *tp = NULL;
        assert_int_equal(loom__threadpool_create(n, LOOM__TP_WAKEFUL_NS, &tp), LOOM_OK);
        for (int r = 0; r < 2000; r++) {
            sum_arg a = {.v = v, .n = N - (r % 50)};
            int64_t want = expect;
            for (int64_t i = a.n; i < N; i++) want -= v[i];
            loom__threadpool_run(tp, sum_task, &a);
            int64_t got = 0;
            for (int i = 0; i < n; i++) got += a.partial[i];
            assert_int_equal(got, want);
        }
        loom__threadpool_destroy(tp);
    }
}

/* Runs separated by pauses long enough that the workers go to sleep on the condvar, so the
 * wake-up path (not only the spin path) is exercised. */
static void test_sleep_wake(void **state) {
    (void)state;
    /* A compute pool (awake for 10 ms) and a pool that sleeps after its spin (sampling). */
    const int64_t wakeful[2] = {LOOM__TP_WAKEFUL_NS, LOOM__TP_SPIN_NS};
    for (int w = 0; w < 2; w++) {
        loom__threadpool *tp = NULL;
        assert_int_equal(loom__threadpool_create(3, wakeful[w], &tp), LOOM_OK);
        count_arg a;
        for (int r = 0; r < 20; r++) {
            struct timespec ts = {0, (long)wakeful[w] + 2 * 1000 * 1000};
            nanosleep(&ts, NULL);
            memset(&a, 0, sizeof a);
            a.expect_nth = 3;
            loom__threadpool_run(tp, count_task, &a);
            for (int i = 0; i < 3; i++) assert_int_equal(atomic_load(&a.calls[i]), 1);
        }
        loom__threadpool_destroy(tp);
    }
}

/* A slow task on one worker makes the caller wait past its spin and yield phases (the done
 * condvar). */
static void slow_task(void *p, int ith, int nth) {
    count_task(p, ith, nth);
    if (ith == nth - 1) {
        struct timespec ts = {0, LOOM__TP_WAKEFUL_NS + 2 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
}

static void test_caller_waits(void **state) {
    (void)state;
    loom__threadpool *tp = NULL;
    assert_int_equal(loom__threadpool_create(2, LOOM__TP_WAKEFUL_NS, &tp), LOOM_OK);
    count_arg a;
    for (int r = 0; r < 10; r++) {
        memset(&a, 0, sizeof a);
        a.expect_nth = 2;
        loom__threadpool_run(tp, slow_task, &a);
        assert_int_equal(atomic_load(&a.calls[0]), 1);
        assert_int_equal(atomic_load(&a.calls[1]), 1);
    }
    loom__threadpool_destroy(tp);
}

/* ------------------------------------------------------------------------------------------ */
/* Bad arguments, lifetime                                                                    */
/* ------------------------------------------------------------------------------------------ */

static void test_bad_args(void **state) {
    (void)state;
    loom__threadpool *tp = NULL;
    assert_int_equal(loom__threadpool_create(0, LOOM__TP_WAKEFUL_NS, &tp), LOOM_ERR_INVALID_ARG);
    assert_null(tp);
    assert_int_equal(loom__threadpool_create(-3, LOOM__TP_WAKEFUL_NS, &tp), LOOM_ERR_INVALID_ARG);
    assert_null(tp);
    assert_int_equal(loom__threadpool_create(1 << 20, LOOM__TP_WAKEFUL_NS, &tp),
                     LOOM_ERR_INVALID_ARG);
    assert_null(tp);
    assert_int_equal(loom__threadpool_create(2, LOOM__TP_WAKEFUL_NS, NULL), LOOM_ERR_INVALID_ARG);
    assert_int_equal(loom__threadpool_create(2, LOOM__TP_SPIN_NS - 1, &tp), LOOM_ERR_INVALID_ARG);
    assert_null(tp);
    assert_int_equal(loom__threadpool_create(2, 2000000000, &tp), LOOM_ERR_INVALID_ARG);
    assert_null(tp);
    assert_true(strlen(loom_last_error()) > 0);
    loom__threadpool_destroy(NULL);
    assert_int_equal(loom__threadpool_size(NULL), 0);
}

static void test_create_destroy_many(void **state) {
    (void)state;
    for (int r = 0; r < 200; r++) {
        loom__threadpool *tp = NULL;
        assert_int_equal(loom__threadpool_create(1 + r % 4, LOOM__TP_WAKEFUL_NS, &tp), LOOM_OK);
        if (r % 2 == 0) { /* half the pools never run anything */
            count_arg a;
            memset(&a, 0, sizeof a);
            a.expect_nth = 1 + r % 4;
            loom__threadpool_run(tp, count_task, &a);
        }
        loom__threadpool_destroy(tp);
    }
}

static void test_cpu_count_split(void **state) {
    (void)state;
    assert_true(loom__cpu_count() >= 1);
    /* The split covers [0, n) exactly, in order, with sizes differing by at most one. */
    for (int64_t n = 0; n < 40; n++) {
        for (int nth = 1; nth <= 7; nth++) {
            int64_t next = 0, lo = INT64_MAX, hi = 0;
            for (int ith = 0; ith < nth; ith++) {
                int64_t b, e;
                loom__split_range(n, ith, nth, &b, &e);
                assert_int_equal(b, next);
                assert_true(e >= b);
                next = e;
                if (e - b < lo) lo = e - b;
                if (e - b > hi) hi = e - b;
            }
            assert_int_equal(next, n);
            assert_true(hi - lo <= 1);
        }
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_each_ith_once),   cmocka_unit_test(test_results),
        cmocka_unit_test(test_sleep_wake),      cmocka_unit_test(test_caller_waits),
        cmocka_unit_test(test_bad_args),        cmocka_unit_test(test_create_destroy_many),
        cmocka_unit_test(test_cpu_count_split),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
