/* test_numa.c — core/numa.h: plans, worker pinning and weight placement, with libnuma as the
 * machine has it and with libnuma forced unavailable (the fallback every mode must reach).
 *
 *   - OFF is OFF; AUTO is DISTRIBUTE on several nodes and OFF on one; an explicit mode on a
 *     machine with libnuma keeps the mode (so the pinning code runs even on one node).
 *   - A pinned worker's CPU affinity is exactly its node's CPUs (ISOLATE: the home node).
 *   - Placement applies to the whole pages of a range and leaves the memory usable.
 *   - Forced unavailable: every mode gives OFF, nothing is pinned or placed.
 *   - A CPU backend computes the same matmul bits pinned (ISOLATE) and in the fallback. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "backend/backend.h"
#include "core/numa.h"
#include "tensor/quant.h"

#if defined(LOOM_HAVE_LIBNUMA_TEST)
#include <numa.h>
#endif

static void test_plans(void **state) {
    (void)state;
    loom__numa_force_unavailable(false);
    assert_int_equal(loom__numa_plan_make(LOOM_NUMA_OFF).mode, LOOM_NUMA_OFF);
    loom__numa_plan a = loom__numa_plan_make(LOOM_NUMA_AUTO);
    assert_true(a.n_nodes >= 1);
    assert_int_equal(a.mode, a.n_nodes > 1 ? LOOM_NUMA_DISTRIBUTE : LOOM_NUMA_OFF);
    loom__numa_plan iso = loom__numa_plan_make(LOOM_NUMA_ISOLATE);
    loom__numa_plan dis = loom__numa_plan_make(LOOM_NUMA_DISTRIBUTE);
    if (loom__numa_built_in() && iso.mode != LOOM_NUMA_OFF) {
        assert_int_equal(iso.mode, LOOM_NUMA_ISOLATE);
        assert_int_equal(dis.mode, LOOM_NUMA_DISTRIBUTE);
        assert_true(iso.home_node >= 0 && iso.home_node < iso.n_nodes);
        printf("libnuma: %d node(s), home node %d\n", iso.n_nodes, iso.home_node);
    } else {
        printf("libnuma unavailable here: every mode is OFF\n");
        assert_int_equal(iso.mode, LOOM_NUMA_OFF);
        assert_int_equal(dis.mode, LOOM_NUMA_OFF);
    }
}

typedef struct pin_job {
    const loom__numa_plan *plan;
    int ith;
    bool pinned;
    cpu_set_t mask;
} pin_job;

static void *pin_thread(void *p) {
    pin_job *j = p;
    j->pinned = loom__numa_pin_worker(j->plan, j->ith);
    CPU_ZERO(&j->mask);
    (void)sched_getaffinity(0, sizeof j->mask, &j->mask);
    return NULL;
}

static pin_job run_pin(const loom__numa_plan *plan, int ith) {
    pin_job j = {.plan = plan, .ith = ith};
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, pin_thread, &j), 0);
    assert_int_equal(pthread_join(t, NULL), 0);
    return j;
}

static void test_pinning(void **state) {
    (void)state;
    loom__numa_force_unavailable(false);
    const loom_numa_mode modes[] = {LOOM_NUMA_ISOLATE, LOOM_NUMA_DISTRIBUTE};
    for (size_t m = 0; m < 2; m++) {
        const loom__numa_plan plan = loom__numa_plan_make(modes[m]);
        if (plan.mode == LOOM_NUMA_OFF) {
            skip(); /* no libnuma here: test_fallback covers this machine */
            return;
        }
        for (int ith = 1; ith <= 3; ith++) {
            pin_job j = run_pin(&plan, ith);
            assert_true(j.pinned);
#if defined(LOOM_HAVE_LIBNUMA_TEST)
            const int node = plan.mode == LOOM_NUMA_ISOLATE ? plan.home_node : ith % plan.n_nodes;
            struct bitmask *cpus = numa_allocate_cpumask();
            assert_non_null(cpus);
            assert_int_equal(numa_node_to_cpus(node, cpus), 0);
            for (unsigned c = 0; c < CPU_SETSIZE && c < cpus->size; c++)
                assert_int_equal(CPU_ISSET(c, &j.mask) != 0, numa_bitmask_isbitset(cpus, c) != 0);
            numa_free_cpumask(cpus);
#endif
        }
    }
}

static void test_placement(void **state) {
    (void)state;
    loom__numa_force_unavailable(false);
    const size_t len = 1 << 20;
    uint8_t *mem = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    assert_true(mem != MAP_FAILED);
    const loom__numa_plan plan = loom__numa_plan_make(LOOM_NUMA_ISOLATE);
    const bool placed = loom__numa_place(&plan, mem + 100, len - 200); /* unaligned ends */
    assert_int_equal(placed, plan.mode != LOOM_NUMA_OFF);
    memset(mem, 0xab, len); /* the pages still work */
    assert_int_equal(mem[len - 1], 0xab);
    assert_false(loom__numa_place(&plan, mem, 10)); /* no whole page inside */
    assert_false(loom__numa_place(NULL, mem, len));
    munmap(mem, len);
}

static void test_fallback(void **state) {
    (void)state;
    loom__numa_force_unavailable(true);
    const loom_numa_mode modes[] = {LOOM_NUMA_AUTO, LOOM_NUMA_DISTRIBUTE, LOOM_NUMA_ISOLATE};
    for (size_t m = 0; m < 3; m++) {
        loom__numa_plan p = loom__numa_plan_make(modes[m]);
        assert_int_equal(p.mode, LOOM_NUMA_OFF);
        assert_int_equal(p.n_nodes, 1);
        pin_job j = run_pin(&p, 1);
        assert_false(j.pinned);
        uint8_t buf[8192];
        assert_false(loom__numa_place(&p, buf, sizeof buf));
    }
    loom__numa_force_unavailable(false);
}

/* The same matmul, pinned and in the fallback: the placement changes nothing computed. */
static void matmul_with(loom_numa_mode mode, bool unavailable, float *out) {
    loom__numa_force_unavailable(unavailable);
    loom_backend_open_params cp = {.n_threads = 3, .numa = mode};
    loom__backend_stream bs;
    loom__backend_stream *be = &bs;
    assert_int_equal(loom__backend_stream_open("cpu", &cp, &bs), LOOM_OK);
    enum { K = 256, N = 24, T = 9 };
    static float wf[N * K], x[T * K];
    static uint8_t w[N * (K / 32) * 34];
    for (int i = 0; i < N * K; i++) wf[i] = (float)((i * 37) % 101 - 50) / 400.0f;
    for (int i = 0; i < T * K; i++) x[i] = (float)((i * 53) % 89 - 44) / 30.0f;
    for (int r = 0; r < N; r++)
        assert_true(loom__quantize_row(LOOM_TYPE_Q8_0, wf + r * K, w + r * (K / 32) * 34, K));
    loom_tensor tw = loom_tensor_2d(LOOM_TYPE_Q8_0, w, K, N, (K / 32) * 34);
    loom_tensor tx = loom_tensor_2d(LOOM_TYPE_F32, x, K, T, K * sizeof(float));
    loom_tensor to = loom_tensor_2d(LOOM_TYPE_F32, out, N, T, N * sizeof(float));
    assert_int_equal(be->ops->matmul(be->ctx, &tw, &tx, &to), LOOM_OK);
    loom__backend_stream_close(&bs);
    loom__numa_force_unavailable(false);
}

static void test_backend_same_bits(void **state) {
    (void)state;
    static float a[24 * 9], b[24 * 9];
    matmul_with(LOOM_NUMA_ISOLATE, false, a);
    matmul_with(LOOM_NUMA_ISOLATE, true, b);
    assert_memory_equal(a, b, sizeof a);
    matmul_with(LOOM_NUMA_DISTRIBUTE, false, b);
    assert_memory_equal(a, b, sizeof a);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_plans),
        cmocka_unit_test(test_pinning),
        cmocka_unit_test(test_placement),
        cmocka_unit_test(test_fallback),
        cmocka_unit_test(test_backend_same_bits),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
