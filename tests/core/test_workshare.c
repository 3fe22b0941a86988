/* test_workshare.c — a run's units are handed out exactly once: an owner takes its own share
 * front to back, a thread with nothing left takes the others' units from the back, a slow
 * thread's share is taken over by the others, and bad arguments are refused. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/threadpool.h"
#include "core/workshare.h"

#define MAX_TH    4
#define MAX_UNITS 5000

static void sleep_ms(int ms) {
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* ------------------------------------------------------------------------------------------ */
/* One thread: its own share in order, then nothing                                           */
/* ------------------------------------------------------------------------------------------ */

static void test_one_thread_in_order(void **state) {
    (void)state;
    loom__workshare *ws = NULL;
    assert_int_equal(loom__workshare_create(1, &ws), LOOM_OK);
    const int64_t sizes[] = {0, 1, 2, 17, 1000};
    for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
        loom__workshare_reset(ws, sizes[s]);
        loom__workshare_cursor cur = LOOM_WORKSHARE_CURSOR_INIT;
        for (int64_t u = 0; u < sizes[s]; u++)
            assert_int_equal(loom__workshare_next(ws, 0, &cur), u);
        assert_int_equal(loom__workshare_next(ws, 0, &cur), -1);
        assert_int_equal(loom__workshare_next(ws, 0, &cur), -1); /* stays empty */
    }
    loom__workshare_destroy(ws);
}

/* ------------------------------------------------------------------------------------------ */
/* Stealing order, made deterministic: thread 1 waits until thread 0 has drained everything    */
/* ------------------------------------------------------------------------------------------ */

typedef struct order_arg {
    loom__workshare *ws;
    int64_t taken0[64]; /* thread 0's units, in the order it got them */
    int n0;
    atomic_int done0;
    int64_t first1; /* what thread 1 got afterwards */
} order_arg;

static void order_task(void *p, int ith, int nth) {
    order_arg *a = p;
    (void)nth;
    loom__workshare_cursor cur = LOOM_WORKSHARE_CURSOR_INIT;
    if (ith == 0) {
        for (int64_t u; (u = loom__workshare_next(a->ws, 0, &cur)) >= 0 && a->n0 < 64;)
            a->taken0[a->n0++] = u;
        atomic_store(&a->done0, 1);
    } else {
        while (!atomic_load(&a->done0)) sleep_ms(1);
        a->first1 = loom__workshare_next(a->ws, 1, &cur);
    }
}

static void test_steal_order(void **state) {
    (void)state;
    loom__threadpool *tp = NULL;
    loom__workshare *ws = NULL;
    assert_int_equal(loom__threadpool_create(2, LOOM__TP_WAKEFUL_NS, &tp), LOOM_OK);
    assert_int_equal(loom__workshare_create(2, &ws), LOOM_OK);
    order_arg a;
    memset(&a, 0, sizeof a);
    a.ws = ws;
    loom__workshare_reset(ws, 9); /* shares [0, 5) and [5, 9) */
    loom__threadpool_run(tp, order_task, &a);
    /* Its own share front to back, then thread 1's from the back. */
    const int64_t want[] = {0, 1, 2, 3, 4, 8, 7, 6, 5};
    assert_int_equal(a.n0, 9);
    for (int i = 0; i < 9; i++) assert_int_equal(a.taken0[i], want[i]);
    assert_int_equal(a.first1, -1);
    loom__workshare_destroy(ws);
    loom__threadpool_destroy(tp);
}

/* ------------------------------------------------------------------------------------------ */
/* Many threads, one slow: every unit exactly once, the slow share finished by the others      */
/* ------------------------------------------------------------------------------------------ */

typedef struct count_arg {
    loom__workshare *ws;
    atomic_int hits[MAX_UNITS];
    atomic_int by_other; /* units of the slow thread's share taken by another thread */
    int64_t slow_begin, slow_end;
    int slow; /* this thread starts late (-1: none) */
} count_arg;

static void count_task(void *p, int ith, int nth) {
    count_arg *a = p;
    (void)nth;
    /* The slow thread starts only once another has taken a unit of its share (or after 10 s,
     * which a working share-out never needs): the others must come for it. */
    if (ith == a->slow && a->slow_end > a->slow_begin)
        for (int ms = 0; ms < 10000 && atomic_load(&a->by_other) == 0; ms++) sleep_ms(1);
    loom__workshare_cursor cur = LOOM_WORKSHARE_CURSOR_INIT;
    for (int64_t u; (u = loom__workshare_next(a->ws, ith, &cur)) >= 0;) {
        if (u >= MAX_UNITS) continue; /* counted as missing below */
        atomic_fetch_add(&a->hits[u], 1);
        if (ith != a->slow && u >= a->slow_begin && u < a->slow_end)
            atomic_fetch_add(&a->by_other, 1);
        if (u % 7 == 0) sleep_ms(0); /* let the others in */
    }
}

static void check_counts(int n_threads, int64_t n, int slow) {
    loom__threadpool *tp = NULL;
    loom__workshare *ws = NULL;
    assert_int_equal(loom__threadpool_create(n_threads, LOOM__TP_WAKEFUL_NS, &tp), LOOM_OK);
    assert_int_equal(loom__workshare_create(n_threads, &ws), LOOM_OK);
    count_arg *a = calloc(1, sizeof *a);
    assert_non_null(a);
    a->ws = ws;
    a->slow = slow;
    if (slow >= 0) loom__split_range(n, slow, n_threads, &a->slow_begin, &a->slow_end);
    loom__workshare_reset(ws, n);
    loom__threadpool_run(tp, count_task, a);
    for (int64_t u = 0; u < n; u++) assert_int_equal(atomic_load(&a->hits[u]), 1);
    for (int64_t u = n; u < MAX_UNITS; u++) assert_int_equal(atomic_load(&a->hits[u]), 0);
    if (slow >= 0 && a->slow_end > a->slow_begin) assert_true(atomic_load(&a->by_other) > 0);
    free(a);
    loom__workshare_destroy(ws);
    loom__threadpool_destroy(tp);
}

static void test_each_unit_once(void **state) {
    (void)state;
    const int64_t sizes[] = {0, 1, 3, 7, 64, 1000, MAX_UNITS};
    for (int nth = 1; nth <= MAX_TH; nth++)
        for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
            check_counts(nth, sizes[s], -1);
            if (nth > 1) check_counts(nth, sizes[s], nth - 1);
            if (nth > 1) check_counts(nth, sizes[s], 0);
        }
}

/* The same object serves run after run, with any count. */
static void test_reuse(void **state) {
    (void)state;
    loom__threadpool *tp = NULL;
    loom__workshare *ws = NULL;
    assert_int_equal(loom__threadpool_create(3, LOOM__TP_WAKEFUL_NS, &tp), LOOM_OK);
    assert_int_equal(loom__workshare_create(3, &ws), LOOM_OK);
    count_arg *a = calloc(1, sizeof *a);
    assert_non_null(a);
    for (int r = 0; r < 300; r++) {
        const int64_t n = (r * 37) % 200;
        memset(a, 0, sizeof *a);
        a->ws = ws;
        a->slow = -1;
        loom__workshare_reset(ws, n);
        loom__threadpool_run(tp, count_task, a);
        for (int64_t u = 0; u < 200; u++) assert_int_equal(atomic_load(&a->hits[u]), u < n ? 1 : 0);
    }
    free(a);
    loom__workshare_destroy(ws);
    loom__threadpool_destroy(tp);
}

static void test_bad_args(void **state) {
    (void)state;
    loom__workshare *ws = (loom__workshare *)0x1;
    assert_int_equal(loom__workshare_create(0, &ws), LOOM_ERR_INVALID_ARG);
    assert_null(ws); /* cleared on failure */
    assert_int_equal(loom__workshare_create(-3, &ws), LOOM_ERR_INVALID_ARG);
    assert_int_equal(loom__workshare_create(1025, &ws), LOOM_ERR_INVALID_ARG);
    assert_int_equal(loom__workshare_create(2, NULL), LOOM_ERR_INVALID_ARG);
    loom__workshare_destroy(NULL);
    /* The largest count fits the 32-bit front and back. */
    assert_int_equal(loom__workshare_create(2, &ws), LOOM_OK);
    loom__workshare_reset(ws, LOOM_WORKSHARE_MAX_UNITS);
    loom__workshare_cursor c0 = LOOM_WORKSHARE_CURSOR_INIT, c1 = LOOM_WORKSHARE_CURSOR_INIT;
    assert_int_equal(loom__workshare_next(ws, 0, &c0), 0);
    int64_t b, e;
    loom__split_range(LOOM_WORKSHARE_MAX_UNITS, 1, 2, &b, &e);
    assert_int_equal(loom__workshare_next(ws, 1, &c1), b);
    loom__workshare_destroy(ws);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_one_thread_in_order),
        cmocka_unit_test(test_steal_order),
        cmocka_unit_test(test_each_unit_once),
        cmocka_unit_test(test_reuse),
        cmocka_unit_test(test_bad_args),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
