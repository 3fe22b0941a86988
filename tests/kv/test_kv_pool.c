/* test_kv_pool.c — the simple block allocator: reservation, exhaustion, release, and a random
 * property test that no block is ever held twice or lost. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "kv/kv_pool.h"

static void test_reserve_and_clear(void **state) {
    (void)state;
    loom__kv_pool pool;
    assert_int_equal(loom__kv_pool_init(&pool, 4), LOOM_OK);
    loom__kv_seq s = {0};
    assert_int_equal(loom__kv_seq_reserve(&s, &pool, 1, 16), LOOM_OK);
    assert_int_equal(s.n_blocks, 1);
    assert_int_equal(s.blocks[0], 0);
    assert_int_equal(loom__kv_seq_reserve(&s, &pool, 16, 16), LOOM_OK);
    assert_int_equal(s.n_blocks, 1);
    assert_int_equal(loom__kv_seq_reserve(&s, &pool, 17, 16), LOOM_OK);
    assert_int_equal(s.n_blocks, 2);
    assert_int_equal(pool.n_free, 2);
    /* 65 positions need 5 blocks: only 4 exist, and a failure changes nothing. */
    assert_int_equal(loom__kv_seq_reserve(&s, &pool, 65, 16), LOOM_ERR_CONTEXT_FULL);
    assert_int_equal(s.n_blocks, 2);
    assert_int_equal(pool.n_free, 2);
    loom__kv_seq_clear(&s, &pool);
    assert_int_equal(pool.n_free, 4);
    assert_int_equal(s.n_blocks, 0);
    loom__kv_seq_destroy(&s);
    loom__kv_pool_destroy(&pool);
}

static void test_bad_args(void **state) {
    (void)state;
    loom__kv_pool pool;
    assert_int_equal(loom__kv_pool_init(&pool, 0), LOOM_ERR_INVALID_ARG);
    assert_int_equal(loom__kv_pool_init(NULL, 4), LOOM_ERR_INVALID_ARG);
    assert_int_equal(loom__kv_pool_init(&pool, 2), LOOM_OK);
    loom__kv_seq s = {0};
    assert_int_equal(loom__kv_seq_reserve(&s, &pool, -1, 16), LOOM_ERR_INVALID_ARG);
    assert_int_equal(loom__kv_seq_reserve(&s, &pool, 4, 0), LOOM_ERR_INVALID_ARG);
    loom__kv_pool_destroy(&pool);
}

static void test_random_sequences_never_share_blocks(void **state) {
    (void)state;
    enum { N_BLOCKS = 64, N_SEQS = 6 };
    loom__kv_pool pool;
    assert_int_equal(loom__kv_pool_init(&pool, N_BLOCKS), LOOM_OK);
    loom__kv_seq seqs[N_SEQS];
    memset(seqs, 0, sizeof seqs);
    srand(12345);
    for (int step = 0; step < 20000; step++) {
        loom__kv_seq *s = &seqs[rand() % N_SEQS];
        if (rand() % 5 == 0) {
            loom__kv_seq_clear(s, &pool);
        } else {
            int32_t want = s->n_blocks * 8 + rand() % 40;
            loom_status st = loom__kv_seq_reserve(s, &pool, want, 8);
            assert_true(st == LOOM_OK || st == LOOM_ERR_CONTEXT_FULL);
        }
        /* Invariant: every block is free or held by exactly one sequence. */
        int owners[N_BLOCKS] = {0};
        for (int i = 0; i < pool.n_free; i++) owners[pool.free_ids[i]]++;
        for (int k = 0; k < N_SEQS; k++) {
            for (int i = 0; i < seqs[k].n_blocks; i++) owners[seqs[k].blocks[i]]++;
        }
        for (int b = 0; b < N_BLOCKS; b++) assert_int_equal(owners[b], 1);
    }
    for (int k = 0; k < N_SEQS; k++) {
        loom__kv_seq_clear(&seqs[k], &pool);
        loom__kv_seq_destroy(&seqs[k]);
    }
    assert_int_equal(pool.n_free, N_BLOCKS);
    loom__kv_pool_destroy(&pool);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_reserve_and_clear),
        cmocka_unit_test(test_bad_args),
        cmocka_unit_test(test_random_sequences_never_share_blocks),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
