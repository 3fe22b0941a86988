/* test_kv_manager.c — the paged KV manager (src/kv/kv_manager.h), feature by feature: prefix
 * caching (hits, salts, the hash chain, partial blocks, whole-prompt hits, recompute
 * preemption), copy-on-write forks and rollback, sliding-window release and prefix hits, swap,
 * LRU eviction, failures that leave no trace, bad input, the descriptor arrays and the capacity
 * queries. The random property test is test_kv_manager_prop.c. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "core/hash.h"
#include "kv/kv_test_util.h"

/* ==== prefix caching ========================================================================== */

static void test_prefix_hit_same_prompt(void **state) {
    (void)state;
    loom__kv *kv = make_simple(4, 16);
    int32_t prompt[10], c0, c1, n0, n1;
    fill_tokens(prompt, 10, 100);
    int32_t a = run_prompt(kv, 0, prompt, 10, &c0);
    assert_int_equal(c0, 0);
    int32_t b = run_prompt(kv, 0, prompt, 10, &c1);
    assert_int_equal(c1, 8); /* two full blocks; the partial third one is not cached */
    const int32_t *ta = table_of(kv, a, 0, &n0), *tb = table_of(kv, b, 0, &n1);
    assert_int_equal(n0, 3);
    assert_int_equal(n1, 3);
    assert_int_equal(ta[0], tb[0]);
    assert_int_equal(ta[1], tb[1]);
    assert_int_not_equal(ta[2], tb[2]);
    loom__kv_seq_info info;
    KV_OK(loom__kv_seq_get_info(kv, b, &info));
    assert_int_equal(info.n_cached, 8);
    assert_int_equal(info.n_pos, 10);
    loom__kv_stats s = stats(kv);
    assert_int_equal(s.prefix_query_tokens, 20);
    assert_int_equal(s.prefix_hit_tokens, 8);
    assert_int_equal(s.admissions, 2);
    assert_int_equal(gstats(kv, 0).n_used, 4);
    loom__kv_destroy(kv);
}

static void test_salt_separates(void **state) {
    (void)state;
    loom__kv *kv = make_simple(4, 16);
    int32_t prompt[9], c;
    fill_tokens(prompt, 9, 7);
    (void)run_prompt(kv, 1, prompt, 9, &c);
    (void)run_prompt(kv, 2, prompt, 9, &c);
    assert_int_equal(c, 0); /* another request's salt: no hit */
    (void)run_prompt(kv, 1, prompt, 9, &c);
    assert_int_equal(c, 8);
    prompt[1] = 999; /* a different token in the first block breaks the whole chain */
    (void)run_prompt(kv, 1, prompt, 9, &c);
    assert_int_equal(c, 0);
    loom__kv_destroy(kv);

    /* Another model salt (another model): no hit either. */
    int32_t nb = 16;
    loom__kv_group_params gp = {.n_blocks = nb, .window = 0};
    loom__kv_params p = loom__kv_default_params();
    p.n_groups = 1;
    p.groups = &gp;
    p.block_size = 4;
    p.model_salt = loom__hash_bytes("model-a", 7, 0);
    KV_OK(loom__kv_create(&p, &kv));
    assert_int_not_equal(loom__hash_bytes("model-a", 7, 0), loom__hash_bytes("model-b", 7, 0));
    fill_tokens(prompt, 9, 7);
    (void)run_prompt(kv, 1, prompt, 9, &c);
    (void)run_prompt(kv, 1, prompt, 9, &c);
    assert_int_equal(c, 8);
    loom__kv_destroy(kv);
}

static void test_hash_chains_parent(void **state) {
    (void)state;
    /* A block's KV depends on everything before it: equal tokens after a different first block
     * are a different block. A = [X Y], B = [X' Z]; C = [X' Y ...] reuses only X'. */
    loom__kv *kv = make_simple(4, 16);
    int32_t a[8] = {1, 2, 3, 4, 5, 6, 7, 8}, b[8] = {9, 9, 9, 9, 0, 0, 0, 0};
    int32_t cc[9] = {9, 9, 9, 9, 5, 6, 7, 8, 1}, c;
    (void)run_prompt(kv, 0, a, 8, &c);
    (void)run_prompt(kv, 0, b, 8, &c);
    (void)run_prompt(kv, 0, cc, 9, &c);
    assert_int_equal(c, 4);
    loom__kv_destroy(kv);
}

static void test_caching_disabled(void **state) {
    (void)state;
    int32_t nb = 8;
    loom__kv_group_params gp = {.n_blocks = nb, .window = 0};
    loom__kv_params p = loom__kv_default_params();
    p.block_size = 4;
    p.n_groups = 1;
    p.groups = &gp;
    p.prefix_caching = false;
    loom__kv *kv = NULL;
    KV_OK(loom__kv_create(&p, &kv));
    int32_t prompt[8], c;
    fill_tokens(prompt, 8, 1);
    int32_t a = run_prompt(kv, 0, prompt, 8, &c);
    (void)run_prompt(kv, 0, prompt, 8, &c);
    assert_int_equal(c, 0);
    KV_OK(loom__kv_seq_free(kv, a));
    assert_int_equal(gstats(kv, 0).n_cached, 0); /* nothing is kept: all freed outright */
    assert_int_equal(gstats(kv, 0).n_free, 6);
    assert_int_equal(stats(kv).prefix_query_tokens, 16);
    CHECK(kv);
    loom__kv_destroy(kv);
}

static void test_partial_last_block_not_cached(void **state) {
    (void)state;
    loom__kv *kv = make_simple(16, 8);
    int32_t prompt[20], c;
    fill_tokens(prompt, 20, 1);
    int32_t a = run_prompt(kv, 0, prompt, 20, &c);
    KV_OK(loom__kv_seq_free(kv, a));
    CHECK(kv);
    loom__kv_group_stats g = gstats(kv, 0);
    assert_int_equal(g.n_cached, 1); /* the full block */
    assert_int_equal(g.n_free, 7);   /* the partial one was freed outright */
    assert_int_equal(g.n_used, 0);
    (void)run_prompt(kv, 0, prompt, 20, &c);
    assert_int_equal(c, 16);
    loom__kv_destroy(kv);
}

static void test_full_prompt_hit_computes_last_token(void **state) {
    (void)state;
    loom__kv *kv = make_simple(4, 8);
    int32_t prompt[8], c, seq, need[1];
    fill_tokens(prompt, 8, 40);
    int32_t a = run_prompt(kv, 0, prompt, 8, &c);
    const int32_t *ta = table_of(kv, a, 0, &c);
    int32_t a0 = ta[0], a1 = ta[1];
    KV_OK(loom__kv_seq_free(kv, a));
    /* Admission would revive both blocks and copy the last one for its last slot. */
    KV_OK(loom__kv_admit_need(kv, 0, prompt, 8, 1, need, &c));
    assert_int_equal(c, 7);
    assert_int_equal(need[0], 3);
    KV_OK(loom__kv_seq_admit(kv, 0, prompt, 8, &seq, &c));
    CHECK(kv);
    assert_int_equal(c, 7); /* all cached, yet the last token is still computed */
    int32_t n;
    const int32_t *t = table_of(kv, seq, 0, &n);
    assert_int_equal(n, 2);
    assert_int_equal(t[0], a0);
    assert_int_equal(t[1], a1);
    KV_OK(loom__kv_seq_need(kv, seq, 1, need));
    assert_int_equal(need[0], 1);
    loom__kv_copy cp[1];
    int32_t nc;
    KV_OK(loom__kv_reserve(kv, seq, 1, prompt + 7, cp, 1, &nc));
    CHECK(kv);
    assert_int_equal(nc, 1); /* the indexed block is immutable: the write goes to a copy */
    assert_int_equal(cp[0].group, 0);
    assert_int_equal(cp[0].src, a1);
    t = table_of(kv, seq, 0, &n);
    assert_int_equal(t[1], cp[0].dst);
    assert_int_equal(gstats(kv, 0).n_used, 3); /* the source is pinned until commit */
    KV_OK(loom__kv_commit(kv, seq));
    CHECK(kv);
    assert_int_equal(gstats(kv, 0).n_used, 2);
    assert_int_equal(gstats(kv, 0).n_cached, 1);
    assert_int_equal(stats(kv).cow_copies, 1);
    /* The original stays the indexed one: a third admission maps to it again. */
    int32_t s3;
    KV_OK(loom__kv_seq_admit(kv, 0, prompt, 8, &s3, &c));
    t = table_of(kv, s3, 0, &n);
    assert_int_equal(c, 7);
    assert_int_equal(t[1], a1);
    CHECK(kv);
    loom__kv_destroy(kv);

    /* Block size 1: the last block is simply recomputed, no copy. */
    kv = make_simple(1, 8);
    fill_tokens(prompt, 3, 5);
    (void)run_prompt(kv, 0, prompt, 3, &c);
    KV_OK(loom__kv_seq_admit(kv, 0, prompt, 3, &seq, &c));
    assert_int_equal(c, 2);
    assert_int_equal(step(kv, seq, prompt + 2, 1), 0);
    loom__kv_destroy(kv);
}

static void test_preempt_recompute_readmits_cheaply(void **state) {
    (void)state;
    loom__kv *kv = make_simple(4, 16);
    int32_t hist[17], c;
    fill_tokens(hist, 17, 300);
    int32_t a = run_prompt(kv, 0, hist, 10, &c);
    for (int32_t p = 10; p < 16; p++) (void)step(kv, a, hist + p, 1); /* decode to 16 */
    KV_OK(loom__kv_seq_free(kv, a)); /* preempted: recompute later */
    CHECK(kv);
    assert_int_equal(gstats(kv, 0).n_cached, 4);
    int32_t b;
    KV_OK(loom__kv_seq_admit(kv, 0, hist, 17, &b, &c)); /* prompt + generated + next input */
    assert_int_equal(c, 16);
    assert_int_equal(step(kv, b, hist + 16, 1), 0);
    loom__kv_destroy(kv);
}

/* ==== copy-on-write =========================================================================== */

static void test_fork_shares_and_copies_once(void **state) {
    (void)state;
    loom__kv *kv = make_simple(4, 16);
    int32_t prompt[6], c, n, child;
    fill_tokens(prompt, 6, 10);
    int32_t a = run_prompt(kv, 0, prompt, 6, &c);
    KV_OK(loom__kv_seq_fork(kv, a, &child));
    CHECK(kv);
    const int32_t *ta = table_of(kv, a, 0, &n), *tc = table_of(kv, child, 0, &n);
    assert_memory_equal(ta, tc, 2 * sizeof(int32_t));
    assert_int_equal(gstats(kv, 0).n_used, 2); /* shared, not copied */
    int32_t shared_last = ta[1];

    /* Both decode in one step: the first writer copies, the second writes in place. */
    int32_t tok_a = 77, tok_c = 88, nc;
    loom__kv_copy cp[1];
    KV_OK(loom__kv_reserve(kv, a, 1, &tok_a, cp, 1, &nc));
    assert_int_equal(nc, 1);
    assert_int_equal(cp[0].src, shared_last);
    KV_OK(loom__kv_reserve(kv, child, 1, &tok_c, cp, 1, &nc));
    assert_int_equal(nc, 0);
    CHECK(kv);
    KV_OK(loom__kv_commit(kv, a));
    KV_OK(loom__kv_commit(kv, child));
    CHECK(kv);
    assert_int_equal(stats(kv).cow_copies, 1);
    assert_int_equal(table_of(kv, child, 0, &n)[1], shared_last);
    assert_int_not_equal(table_of(kv, a, 0, &n)[1], shared_last);
    assert_int_equal(step(kv, a, &tok_a, 1), 0);
    assert_int_equal(step(kv, child, &tok_c, 1), 0);

    /* Forked on a block boundary: nothing shared is ever written, so no copies. */
    int32_t d;
    KV_OK(loom__kv_seq_fork(kv, a, &d));
    assert_int_equal(step(kv, a, &tok_a, 1), 0);
    assert_int_equal(step(kv, d, &tok_c, 1), 0);
    assert_int_equal(stats(kv).cow_copies, 1);
    loom__kv_destroy(kv);
}

static int64_t unused(loom__kv *kv, int32_t g) {
    int64_t u = -1;
    KV_OK(loom__kv_unused_slots(kv, g, &u));
    return u;
}

/* Internal fragmentation counted by hand: blocks of 4 slots. */
static void test_unused_slots(void **state) {
    (void)state;
    loom__kv *kv = make_simple(4, 16);
    assert_int_equal(unused(kv, 0), 0);
    int32_t prompt[6], c, child;
    fill_tokens(prompt, 6, 10);
    int32_t a = run_prompt(kv, 0, prompt, 6, &c);
    assert_int_equal(unused(kv, 0), 2); /* 6 positions in 2 blocks */
    KV_OK(loom__kv_seq_fork(kv, a, &child));
    assert_int_equal(unused(kv, 0), 2); /* the shared blocks count once */
    /* a decodes first: its last block is copied (the source stays pinned until commit) */
    int32_t tok = 77, nc;
    loom__kv_copy cp[1];
    KV_OK(loom__kv_reserve(kv, a, 1, &tok, cp, 1, &nc));
    assert_int_equal(nc, 1);
    /* a's copy carries its 2 computed positions (the reserved slot is not computed yet) and
     * the pinned source, still child's, keeps its 2 unused slots */
    assert_int_equal(unused(kv, 0), 2 + 2);
    KV_OK(loom__kv_commit(kv, a));
    assert_int_equal(unused(kv, 0), 2 + 1); /* child's block 6/8, a's copy 7/8 */
    assert_int_equal(step(kv, a, &tok, 1), 0);
    assert_int_equal(unused(kv, 0), 2); /* a fills its block: 8/8 */
    assert_int_equal(step(kv, a, &tok, 1), 0);
    assert_int_equal(unused(kv, 0), 2 + 3); /* a's third block holds 1 of 4 */
    KV_OK(loom__kv_seq_free(kv, child));
    assert_int_equal(unused(kv, 0), 3); /* the cached full block is not owned */
    int64_t u;
    assert_int_equal(loom__kv_unused_slots(kv, 1, &u), LOOM_ERR_INVALID_ARG);
    assert_int_equal(loom__kv_unused_slots(kv, -1, &u), LOOM_ERR_INVALID_ARG);
    assert_int_equal(loom__kv_unused_slots(kv, 0, NULL), LOOM_ERR_INVALID_ARG);
    assert_int_equal(loom__kv_unused_slots(NULL, 0, &u), LOOM_ERR_INVALID_ARG);
    loom__kv_destroy(kv);

    /* A sliding group (window 4, blocks of 2) no longer owns what left the window. */
    const int32_t nb[2] = {16, 16}, win[2] = {0, 4};
    kv = make_kv(2, 2, nb, win, 4, 64);
    int32_t p9[9];
    fill_tokens(p9, 9, 1);
    (void)run_prompt(kv, 0, p9, 9, NULL);
    assert_int_equal(unused(kv, 0), 1); /* 9 positions in 5 blocks */
    /* the next query (position 9) sees 6..9: blocks 3 and 4 are held */
    assert_int_equal(gstats(kv, 1).n_used, 2);
    assert_int_equal(unused(kv, 1), 1);
    loom__kv_destroy(kv);
}

static void test_rollback_undoes_cow_and_blocks(void **state) {
    (void)state;
    loom__kv *kv = make_simple(4, 16);
    int32_t prompt[6], c, n, child, nc;
    fill_tokens(prompt, 6, 10);
    int32_t a = run_prompt(kv, 0, prompt, 6, &c);
    KV_OK(loom__kv_seq_fork(kv, a, &child));
    int32_t before[2];
    memcpy(before, table_of(kv, a, 0, &n), sizeof before);
    loom__kv_group_stats g0 = gstats(kv, 0);
    int32_t toks[7] = {1, 2, 3, 4, 5, 6, 7};
    loom__kv_copy cp[1];
    KV_OK(loom__kv_reserve(kv, a, 7, toks, cp, 1, &nc)); /* a copy plus two new blocks */
    assert_int_equal(nc, 1);
    assert_int_equal(gstats(kv, 0).n_used, 5);
    CHECK(kv);
    KV_OK(loom__kv_rollback(kv, a));
    CHECK(kv);
    const int32_t *t = table_of(kv, a, 0, &n);
    assert_int_equal(n, 2);
    assert_memory_equal(t, before, sizeof before);
    loom__kv_group_stats g1 = gstats(kv, 0);
    assert_int_equal(g1.n_used, g0.n_used);
    assert_int_equal(g1.cow_copies, 0);
    loom__kv_seq_info info;
    KV_OK(loom__kv_seq_get_info(kv, a, &info));
    assert_int_equal(info.n_pos, 6);
    assert_false(info.reserved);
    /* Freeing a reserved sequence rolls it back first. */
    KV_OK(loom__kv_reserve(kv, child, 7, toks, cp, 1, &nc));
    KV_OK(loom__kv_seq_free(kv, child));
    CHECK(kv);
    assert_int_equal(gstats(kv, 0).n_used, 2);
    loom__kv_destroy(kv);
}

static void test_cow_after_diverged_rollback(void **state) {
    (void)state;
    /* Sharers of a partial block end up with different fills when one commits and the other
     * rolls back. Then the fuller one's copy-on-write pins the block, and the other must copy
     * too: writing in place would overwrite a slot the fuller one gets back on rollback. */
    loom__kv *kv = make_simple(4, 16);
    int32_t prompt[6], c, n, child, nc, tok = 5;
    fill_tokens(prompt, 6, 10);
    int32_t a = run_prompt(kv, 0, prompt, 6, &c); /* fill 2 in entry 1 */
    KV_OK(loom__kv_seq_fork(kv, a, &child));
    int32_t shared = table_of(kv, a, 0, &n)[1];
    loom__kv_copy cp[1];
    KV_OK(loom__kv_reserve(kv, child, 1, &tok, cp, 1, &nc));
    assert_int_equal(nc, 1);
    KV_OK(loom__kv_reserve(kv, a, 1, &tok, cp, 1, &nc));
    assert_int_equal(nc, 0);             /* equal fills: in place */
    KV_OK(loom__kv_commit(kv, a));       /* a: fill 3, slot 2 is its own */
    KV_OK(loom__kv_rollback(kv, child)); /* child: back on the block, fill 2 */
    CHECK(kv);
    assert_int_equal(table_of(kv, child, 0, &n)[1], shared);
    KV_OK(loom__kv_reserve(kv, a, 1, &tok, cp, 1, &nc));
    assert_int_equal(nc, 1);
    KV_OK(loom__kv_reserve(kv, child, 1, &tok, cp, 1, &nc));
    assert_int_equal(nc, 1); /* slot 2 must survive a's rollback */
    CHECK(kv);
    KV_OK(loom__kv_rollback(kv, a));
    KV_OK(loom__kv_commit(kv, child));
    CHECK(kv);
    assert_int_equal(table_of(kv, a, 0, &n)[1], shared);
    assert_int_not_equal(table_of(kv, child, 0, &n)[1], shared);
    loom__kv_destroy(kv);
}

/* ==== sliding window ========================================================================== */

static void test_sliding_window_release(void **state) {
    (void)state;
    const int32_t bs = 4, w = 6;
    int32_t nb[2] = {32, 32}, win[2] = {0, w};
    loom__kv *kv = make_kv(bs, 2, nb, win, 4, 128);
    int32_t toks[48], seq, c;
    fill_tokens(toks, 48, 500);
    KV_OK(loom__kv_seq_admit(kv, 0, toks, 1, &seq, &c));
    int64_t released = 0;
    for (int32_t p = 0; p < 48; p++) {
        (void)step(kv, seq, toks + p, 1);
        int32_t n_pos = p + 1, n;
        const int32_t *t = table_of(kv, seq, 1, &n);
        int32_t held = 0;
        for (int32_t i = 0; i < n; i++) {
            /* Entry i is needed iff its last position is visible to the next query (at
             * n_pos, seeing n_pos - w + 1 ..); later queries see only later positions. */
            int32_t last = (i + 1) * bs - 1;
            bool needed = last >= n_pos - w + 1;
            assert_int_equal(t[i] != LOOM_KV_NO_BLOCK, needed);
            held += needed;
            if (!needed) released++;
        }
        loom__kv_group_stats g = gstats(kv, 1);
        assert_int_equal(g.n_used, held);
        assert_int_equal(g.window_releases, n - held);
        assert_int_equal(gstats(kv, 0).n_used, n); /* the full group keeps everything */
    }
    assert_true(released > 0);
    assert_int_equal(stats(kv).window_releases, gstats(kv, 1).window_releases);
    KV_OK(loom__kv_seq_free(kv, seq));
    CHECK(kv);
    loom__kv_destroy(kv);
}

static void test_sliding_window_prefix_hit(void **state) {
    (void)state;
    /* Window group pool of 3 blocks: the blocks that left the window get evicted while the
     * sequence runs, so only prefixes ending near its end can hit in that group. */
    const int32_t bs = 4;
    int32_t nb[2] = {16, 3}, win[2] = {0, 4};
    loom__kv *kv = make_kv(bs, 2, nb, win, 4, 64);
    int32_t toks[25], seq, c;
    fill_tokens(toks, 25, 900);
    KV_OK(loom__kv_seq_admit(kv, 0, toks, 24, &seq, &c));
    for (int32_t p = 0; p < 24; p += 4) (void)step(kv, seq, toks + p, 4);
    assert_true(gstats(kv, 1).evictions > 0);
    KV_OK(loom__kv_seq_free(kv, seq));
    int32_t n, need[2];
    /* 25 tokens: the 24 cached are reused; the window group needs only entry 5. */
    KV_OK(loom__kv_admit_need(kv, 0, toks, 25, 0, need, &c));
    assert_int_equal(c, 24);
    KV_OK(loom__kv_seq_admit(kv, 0, toks, 25, &seq, &c));
    CHECK(kv);
    assert_int_equal(c, 24);
    const int32_t *t = table_of(kv, seq, 1, &n);
    assert_int_equal(n, 6);
    for (int32_t i = 0; i < 5; i++) assert_int_equal(t[i], LOOM_KV_NO_BLOCK);
    assert_true(t[5] >= 0);
    assert_int_equal(step(kv, seq, toks + 24, 1), 0);
    KV_OK(loom__kv_seq_free(kv, seq));
    /* 13 tokens: the full group has 3 blocks, but the window group lost what the query at 12
     * (or 8, or 4) would read: no hit at all. */
    KV_OK(loom__kv_seq_admit(kv, 0, toks, 13, &seq, &c));
    assert_int_equal(c, 0);
    KV_OK(loom__kv_seq_free(kv, seq));
    /* 21 tokens: entry 4 (positions 16..19) is still cached: reuse 20. */
    KV_OK(loom__kv_seq_admit(kv, 0, toks, 21, &seq, &c));
    assert_int_equal(c, 20);
    CHECK(kv);
    loom__kv_destroy(kv);
}

/* ==== swap ==================================================================================== */

static void test_swap_roundtrip(void **state) {
    (void)state;
    const int32_t bs = 4;
    int32_t nb[2] = {16, 16}, win[2] = {0, 5};
    loom__kv *kv = make_kv(bs, 2, nb, win, 4, 64);
    int32_t toks[30], c, n;
    fill_tokens(toks, 30, 60);
    int32_t a = run_prompt(kv, 0, toks, 22, &c);
    /* Give every block a tag, as device memory would hold data. */
    int32_t tag[2][16], before[2][8], shape[2][8];
    for (int32_t g = 0; g < 2; g++) {
        for (int32_t b = 0; b < 16; b++) tag[g][b] = 1000 * g + b;
        const int32_t *t = table_of(kv, a, g, &n);
        assert_int_equal(n, 6);
        for (int32_t i = 0; i < n; i++) {
            shape[g][i] = t[i] >= 0;
            before[g][i] = t[i] >= 0 ? tag[g][t[i]] : -1;
        }
    }
    loom__kv_seq_info info;
    KV_OK(loom__kv_seq_get_info(kv, a, &info));
    int32_t held = info.n_held, blocks[16], offs[3], host[16];
    assert_int_equal(loom__kv_swap_out(kv, a, blocks, held - 1, offs), LOOM_ERR_BUFFER_TOO_SMALL);
    KV_OK(loom__kv_swap_out(kv, a, blocks, 16, offs));
    CHECK(kv);
    assert_int_equal(offs[2], held);
    for (int32_t g = 0; g < 2; g++)
        for (int32_t j = offs[g]; j < offs[g + 1]; j++) host[j] = tag[g][blocks[j]];
    assert_int_equal(gstats(kv, 0).n_used + gstats(kv, 1).n_used, 0);
    assert_int_equal(stats(kv).n_swapped, 1);
    int32_t nc;
    loom__kv_copy cp[2];
    assert_int_equal(loom__kv_reserve(kv, a, 1, toks, cp, 2, &nc), LOOM_ERR_INVALID_ARG);
    int32_t need[2];
    KV_OK(loom__kv_seq_need(kv, a, 0, need));
    assert_int_equal(need[0] + need[1], held);

    /* Another sequence takes blocks meanwhile (some of a's old ones, probably). */
    int32_t other[12];
    fill_tokens(other, 12, 7000);
    int32_t b = run_prompt(kv, 0, other, 12, &c);
    KV_OK(loom__kv_swap_in(kv, a, blocks, 16, offs));
    CHECK(kv);
    for (int32_t g = 0; g < 2; g++)
        for (int32_t j = offs[g]; j < offs[g + 1]; j++) tag[g][blocks[j]] = host[j];
    KV_OK(loom__kv_seq_get_info(kv, a, &info));
    assert_int_equal(info.n_pos, 22);
    assert_false(info.swapped);
    for (int32_t g = 0; g < 2; g++) {
        const int32_t *t = table_of(kv, a, g, &n);
        assert_int_equal(n, 6);
        for (int32_t i = 0; i < n; i++) {
            assert_int_equal(t[i] >= 0, shape[g][i]);
            if (t[i] >= 0) assert_int_equal(tag[g][t[i]], before[g][i]);
        }
    }
    loom__kv_stats s = stats(kv);
    assert_int_equal(s.swap_outs, 1);
    assert_int_equal(s.swap_ins, 1);
    assert_int_equal(gstats(kv, 0).swapped_in + gstats(kv, 1).swapped_in, held);
    /* Decoding resumes, and the next commit offers the restored blocks to the cache again. */
    assert_int_equal(step(kv, a, toks + 22, 1), 0);
    KV_OK(loom__kv_seq_free(kv, a));
    KV_OK(loom__kv_seq_free(kv, b));
    KV_OK(loom__kv_seq_admit(kv, 0, toks, 23, &a, &c));
    assert_int_equal(c, 20);
    CHECK(kv);
    loom__kv_destroy(kv);
}

/* ==== eviction ================================================================================ */

static void test_eviction_is_lru(void **state) {
    (void)state;
    loom__kv *kv = make_simple(4, 4);
    int32_t pa[9], pb[8], pc[8], c, n, s;
    fill_tokens(pa, 9, 100);
    fill_tokens(pb, 8, 200);
    fill_tokens(pc, 8, 300);
    int32_t a = run_prompt(kv, 0, pa, 8, &c); /* blocks 0, 1 */
    assert_int_equal(table_of(kv, a, 0, &n)[0], 0);
    KV_OK(loom__kv_seq_free(kv, a));
    int32_t b = run_prompt(kv, 0, pb, 8, &c); /* blocks 2, 3 (free blocks before evicting) */
    assert_int_equal(table_of(kv, b, 0, &n)[0], 2);
    assert_int_equal(gstats(kv, 0).evictions, 0);
    KV_OK(loom__kv_seq_free(kv, b)); /* LRU: 1 0 3 2 */
    /* A hit revives a's blocks; released again they become the most recent: LRU 3 2 1 0. */
    KV_OK(loom__kv_seq_admit(kv, 0, pa, 9, &s, &c));
    assert_int_equal(c, 8);
    KV_OK(loom__kv_seq_free(kv, s));
    CHECK(kv);
    KV_OK(loom__kv_seq_admit(kv, 0, pc, 8, &s, &c));
    assert_int_equal(c, 0);
    (void)step(kv, s, pc, 4);
    assert_int_equal(table_of(kv, s, 0, &n)[0], 3); /* b's tail went first */
    (void)step(kv, s, pc + 4, 4);
    assert_int_equal(table_of(kv, s, 0, &n)[1], 2); /* then b's head */
    assert_int_equal(gstats(kv, 0).evictions, 2);
    assert_int_equal(stats(kv).evictions, 2);
    KV_OK(loom__kv_seq_free(kv, s));
    KV_OK(loom__kv_seq_admit(kv, 0, pb, 8, &s, &c));
    assert_int_equal(c, 0);
    KV_OK(loom__kv_seq_free(kv, s));
    KV_OK(loom__kv_seq_admit(kv, 0, pa, 8, &s, &c));
    assert_int_equal(c, 7);
    assert_int_equal(table_of(kv, s, 0, &n)[0], 0);
    CHECK(kv);
    loom__kv_destroy(kv);
}

/* ==== failures leave no trace ================================================================= */

typedef struct snapshot {
    loom__kv_stats s;
    loom__kv_group_stats g;
    loom__kv_seq_info info[4];
    int32_t table[4][16];
} snapshot;

static void snap(const loom__kv *kv, const int32_t *seqs, int32_t n_seqs, snapshot *out) {
    memset(out, 0, sizeof *out);
    out->s = stats(kv);
    out->g = gstats(kv, 0);
    for (int32_t i = 0; i < n_seqs; i++) {
        int32_t n;
        KV_OK(loom__kv_seq_get_info(kv, seqs[i], &out->info[i]));
        const int32_t *t = table_of(kv, seqs[i], 0, &n);
        memcpy(out->table[i], t, (size_t)n * sizeof *t);
    }
}

static void test_out_of_blocks_changes_nothing(void **state) {
    (void)state;
    loom__kv *kv = make_simple(4, 4);
    int32_t pa[10], pb[5], c, b, child, nc;
    fill_tokens(pa, 10, 1);
    fill_tokens(pb, 5, 50);
    int32_t a = run_prompt(kv, 0, pa, 10, &c); /* 3 of 4 blocks */
    KV_OK(loom__kv_seq_admit(kv, 0, pb, 5, &b, &c));
    KV_OK(loom__kv_seq_fork(kv, a, &child));
    int32_t seqs[3] = {a, b, child};
    snapshot s0, s1;
    snap(kv, seqs, 3, &s0);
    loom__kv_copy cp[1];
    assert_int_equal(loom__kv_reserve(kv, b, 5, pb, cp, 1, &nc), LOOM_ERR_CONTEXT_FULL);
    assert_true(strlen(loom_last_error()) > 0);
    snap(kv, seqs, 3, &s1);
    assert_memory_equal(&s0, &s1, sizeof s0);
    CHECK(kv);
    /* The child's write needs a copy: no room for it in copies[] -> nothing happens either. */
    assert_int_equal(loom__kv_reserve(kv, child, 1, pa, cp, 0, &nc), LOOM_ERR_BUFFER_TOO_SMALL);
    snap(kv, seqs, 3, &s1);
    assert_memory_equal(&s0, &s1, sizeof s0);
    /* Past max_seq_len. */
    assert_int_equal(loom__kv_reserve(kv, a, 247, pa, cp, 1, &nc), LOOM_ERR_CONTEXT_FULL);
    KV_OK(loom__kv_reserve(kv, child, 1, pa, cp, 1, &nc)); /* the last free block: the copy */
    assert_int_equal(nc, 1);
    KV_OK(loom__kv_commit(kv, child));
    /* Now nothing is left: the parent's own append fails, untouched. */
    snap(kv, seqs, 3, &s0);
    assert_int_equal(loom__kv_reserve(kv, a, 3, pa, cp, 1, &nc), LOOM_ERR_CONTEXT_FULL);
    snap(kv, seqs, 3, &s1);
    assert_memory_equal(&s0, &s1, sizeof s0);
    /* A swap-in that does not fit fails untouched too. */
    int32_t blocks[8], offs[2];
    KV_OK(loom__kv_swap_out(kv, child, blocks, 8, offs)); /* frees only the child's copy */
    KV_OK(loom__kv_reserve(kv, b, 4, pb, cp, 1, &nc));    /* takes it */
    KV_OK(loom__kv_commit(kv, b));
    snap(kv, seqs, 3, &s0);
    assert_int_equal(loom__kv_swap_in(kv, child, blocks, 8, offs), LOOM_ERR_CONTEXT_FULL);
    snap(kv, seqs, 3, &s1);
    assert_memory_equal(&s0, &s1, sizeof s0);
    CHECK(kv);
    /* Sequence slots run out too. */
    loom__kv_destroy(kv);
    int32_t one = 4;
    kv = make_kv(4, 1, &one, NULL, 1, 64);
    KV_OK(loom__kv_seq_admit(kv, 0, pa, 3, &a, &c));
    assert_int_equal(loom__kv_seq_admit(kv, 0, pa, 3, &b, &c), LOOM_ERR_CONTEXT_FULL);
    assert_int_equal(loom__kv_seq_fork(kv, a, &b), LOOM_ERR_CONTEXT_FULL);
    CHECK(kv);
    loom__kv_destroy(kv);
}

static void test_bad_input(void **state) {
    (void)state;
    loom__kv_params p = loom__kv_default_params();
    loom__kv *kv = NULL;
    assert_int_equal(loom__kv_create(&p, &kv), LOOM_ERR_INVALID_ARG); /* no groups */
    loom__kv_group_params gp = {.n_blocks = 0, .window = 0};
    p.n_groups = 1;
    p.groups = &gp;
    assert_int_equal(loom__kv_create(&p, &kv), LOOM_ERR_INVALID_ARG);
    gp.n_blocks = 8;
    gp.window = -1;
    assert_int_equal(loom__kv_create(&p, &kv), LOOM_ERR_INVALID_ARG);
    gp.window = 0;
    p.block_size = 0;
    assert_int_equal(loom__kv_create(&p, &kv), LOOM_ERR_INVALID_ARG);
    p.block_size = 4;
    p.watermark = 1.5f;
    assert_int_equal(loom__kv_create(&p, &kv), LOOM_ERR_INVALID_ARG);
    p.watermark = 0.0f;
    assert_int_equal(loom__kv_create(NULL, &kv), LOOM_ERR_INVALID_ARG);
    assert_null(kv);
    loom__kv_destroy(NULL);

    kv = make_simple(4, 8);
    int32_t toks[8] = {1, 2, 3, 4, 5, 6, 7, 8}, seq, c, nc, need[1], offs[2], blocks[4], n;
    loom__kv_copy cp[1];
    loom__kv_seq_info info;
    const int32_t *t;
    assert_int_equal(loom__kv_seq_admit(kv, 0, toks, 0, &seq, &c), LOOM_ERR_INVALID_ARG);
    assert_int_equal(loom__kv_seq_admit(kv, 0, NULL, 3, &seq, &c), LOOM_ERR_INVALID_ARG);
    assert_int_equal(loom__kv_seq_admit(kv, 0, toks, 257, &seq, &c), LOOM_ERR_CONTEXT_FULL);
    KV_OK(loom__kv_seq_admit(kv, 0, toks, 8, &seq, &c));
    const int32_t bad_ids[] = {-1, 8, 1000, 3};
    for (size_t i = 0; i < sizeof bad_ids / sizeof *bad_ids; i++) {
        int32_t id = bad_ids[i];
        assert_int_equal(loom__kv_reserve(kv, id, 1, toks, cp, 1, &nc), LOOM_ERR_INVALID_ARG);
        assert_int_equal(loom__kv_commit(kv, id), LOOM_ERR_INVALID_ARG);
        assert_int_equal(loom__kv_rollback(kv, id), LOOM_ERR_INVALID_ARG);
        assert_int_equal(loom__kv_seq_free(kv, id), LOOM_ERR_INVALID_ARG);
        assert_int_equal(loom__kv_seq_fork(kv, id, &c), LOOM_ERR_INVALID_ARG);
        assert_int_equal(loom__kv_swap_out(kv, id, blocks, 4, offs), LOOM_ERR_INVALID_ARG);
        assert_int_equal(loom__kv_swap_in(kv, id, blocks, 4, offs), LOOM_ERR_INVALID_ARG);
        assert_int_equal(loom__kv_seq_need(kv, id, 1, need), LOOM_ERR_INVALID_ARG);
        assert_int_equal(loom__kv_seq_get_info(kv, id, &info), LOOM_ERR_INVALID_ARG);
        assert_int_equal(loom__kv_seq_table(kv, id, 0, &t, &n), LOOM_ERR_INVALID_ARG);
        assert_int_equal(loom__kv_fill_desc(kv, 0, 1, &id, NULL, offs, blocks, 4, NULL, NULL, NULL),
                         LOOM_ERR_INVALID_ARG);
    }
    assert_int_equal(loom__kv_reserve(kv, seq, -1, toks, cp, 1, &nc), LOOM_ERR_INVALID_ARG);
    assert_int_equal(loom__kv_reserve(kv, seq, 2, NULL, cp, 1, &nc), LOOM_ERR_INVALID_ARG);
    assert_int_equal(loom__kv_reserve(kv, seq, 1, toks, NULL, 1, &nc), LOOM_ERR_INVALID_ARG);
    assert_int_equal(loom__kv_commit(kv, seq), LOOM_ERR_INVALID_ARG); /* nothing reserved */
    assert_int_equal(loom__kv_rollback(kv, seq), LOOM_ERR_INVALID_ARG);
    assert_int_equal(loom__kv_seq_need(kv, seq, -2, need), LOOM_ERR_INVALID_ARG);
    assert_int_equal(loom__kv_seq_table(kv, seq, 1, &t, &n), LOOM_ERR_INVALID_ARG);
    assert_int_equal(loom__kv_get_group_stats(kv, -1, &(loom__kv_group_stats){0}),
                     LOOM_ERR_INVALID_ARG);
    assert_int_equal(loom__kv_get_stats(kv, NULL), LOOM_ERR_INVALID_ARG);
    assert_int_equal(loom__kv_blocks_available(kv, 1), -1);
    KV_OK(loom__kv_reserve(kv, seq, 0, NULL, NULL, 0, &nc)); /* an empty reservation is fine */
    /* Wrong states: reserved twice, fork / swap / need while reserved, swap of a resident. */
    assert_int_equal(loom__kv_reserve(kv, seq, 1, toks, cp, 1, &nc), LOOM_ERR_INVALID_ARG);
    assert_int_equal(loom__kv_seq_fork(kv, seq, &c), LOOM_ERR_INVALID_ARG);
    assert_int_equal(loom__kv_swap_out(kv, seq, blocks, 4, offs), LOOM_ERR_INVALID_ARG);
    assert_int_equal(loom__kv_seq_need(kv, seq, 1, need), LOOM_ERR_INVALID_ARG);
    int32_t one = 1;
    assert_int_equal(loom__kv_fill_desc(kv, 0, 1, &seq, &one, offs, blocks, 4, NULL, NULL, NULL),
                     LOOM_ERR_INVALID_ARG); /* the batch says 1 new token, 0 are reserved */
    KV_OK(loom__kv_commit(kv, seq));
    assert_int_equal(loom__kv_swap_in(kv, seq, blocks, 4, offs), LOOM_ERR_INVALID_ARG);
    KV_OK(loom__kv_swap_out(kv, seq, blocks, 4, offs));
    assert_int_equal(loom__kv_swap_out(kv, seq, blocks, 4, offs), LOOM_ERR_INVALID_ARG);
    assert_int_equal(loom__kv_seq_fork(kv, seq, &c), LOOM_ERR_INVALID_ARG);
    assert_int_equal(loom__kv_reserve(kv, seq, 1, toks, cp, 1, &nc), LOOM_ERR_INVALID_ARG);
    assert_int_equal(loom__kv_fill_desc(kv, 0, 1, &seq, NULL, offs, blocks, 4, NULL, NULL, NULL),
                     LOOM_ERR_INVALID_ARG);
    KV_OK(loom__kv_seq_free(kv, seq)); /* a swapped-out sequence can be freed */
    assert_int_equal(loom__kv_seq_free(kv, seq), LOOM_ERR_INVALID_ARG);
    CHECK(kv);
    assert_int_equal(gstats(kv, 0).n_used, 0);
    loom__kv_destroy(kv);
}

/* ==== descriptor and capacity ================================================================ */

static void test_fill_desc(void **state) {
    (void)state;
    const int32_t bs = 4;
    int32_t nb[2] = {32, 32}, win[2] = {0, 4};
    loom__kv *kv = make_kv(bs, 2, nb, win, 4, 64);
    int32_t toks[16], a, b, c, nc;
    fill_tokens(toks, 16, 1);
    a = run_prompt(kv, 0, toks, 10, &c);
    KV_OK(loom__kv_seq_admit(kv, 5, toks, 5, &b, &c));
    loom__kv_copy cp[2];
    KV_OK(loom__kv_reserve(kv, a, 3, toks + 10, cp, 2, &nc));
    KV_OK(loom__kv_reserve(kv, b, 5, toks, cp, 2, &nc));
    assert_int_equal(loom__kv_desc_block_cap(kv, 2), 2 * 16);
    int32_t seqs[2] = {a, b}, n_new[2] = {3, 5}, indptr[3], ids[32], q[3], pos[2], len[2];
    assert_int_equal(loom__kv_fill_desc(kv, 0, 2, seqs, n_new, indptr, ids, 5, q, pos, len),
                     LOOM_ERR_BUFFER_TOO_SMALL);
    for (int32_t g = 0; g < 2; g++) {
        KV_OK(loom__kv_fill_desc(kv, g, 2, seqs, n_new, indptr, ids, 32, q, pos, len));
        assert_int_equal(indptr[0], 0);
        assert_int_equal(indptr[1], 4); /* ceil(13 / 4) */
        assert_int_equal(indptr[2], 6); /* + ceil(5 / 4) */
        assert_int_equal(q[1], 3);
        assert_int_equal(q[2], 8);
        assert_int_equal(pos[0], 10);
        assert_int_equal(pos[1], 0);
        assert_int_equal(len[0], 13);
        assert_int_equal(len[1], 5);
        int32_t n;
        const int32_t *ta = table_of(kv, a, g, &n);
        assert_memory_equal(ids, ta, 4 * sizeof(int32_t));
        const int32_t *tb = table_of(kv, b, g, &n);
        assert_memory_equal(ids + 4, tb, 2 * sizeof(int32_t));
    }
    /* In the window group, entry 0 of a left the window at n_pos 10: (0+1)*4 <= 10 - 4 + 1. */
    assert_int_equal(ids[0], LOOM_KV_NO_BLOCK);
    /* Without n_new, the reservations are taken as they are; NULL side arrays are fine. */
    KV_OK(loom__kv_fill_desc(kv, 0, 2, seqs, NULL, indptr, ids, 32, NULL, NULL, NULL));
    assert_int_equal(indptr[2], 6);
    KV_OK(loom__kv_fill_desc(kv, 0, 0, NULL, NULL, indptr, NULL, 0, q, NULL, NULL));
    assert_int_equal(indptr[0], 0);
    KV_OK(loom__kv_commit(kv, a));
    KV_OK(loom__kv_rollback(kv, b));
    CHECK(kv);
    loom__kv_destroy(kv);
}

static void test_capacity_queries(void **state) {
    (void)state;
    int32_t nb[2] = {100, 40}, win[2] = {0, 8};
    loom__kv_group_params gp[2] = {{nb[0], win[0]}, {nb[1], win[1]}};
    loom__kv_params p = loom__kv_default_params();
    p.block_size = 4;
    p.n_groups = 2;
    p.groups = gp;
    p.watermark = 0.05f;
    loom__kv *kv = NULL;
    KV_OK(loom__kv_create(&p, &kv));
    assert_int_equal(loom__kv_n_groups(kv), 2);
    assert_int_equal(loom__kv_block_size(kv), 4);
    assert_int_equal(gstats(kv, 0).watermark, 5);
    assert_int_equal(gstats(kv, 1).watermark, 2);
    int32_t need[2] = {95, 38};
    assert_true(loom__kv_fits(kv, need, true));
    need[0] = 96;
    assert_false(loom__kv_fits(kv, need, true));
    assert_true(loom__kv_fits(kv, need, false));
    need[1] = 41;
    assert_false(loom__kv_fits(kv, need, false));

    int32_t toks[64], seq, c;
    fill_tokens(toks, 64, 3);
    KV_OK(loom__kv_admit_need(kv, 0, toks, 30, 12, need, &c));
    assert_int_equal(c, 0);
    assert_int_equal(need[0], 3);
    assert_int_equal(need[1], 3); /* the step's queries read all 12: no release before commit */
    KV_OK(loom__kv_seq_admit(kv, 0, toks, 30, &seq, &c));
    KV_OK(loom__kv_seq_need(kv, seq, 12, need));
    assert_int_equal(need[0], 3);
    assert_int_equal(need[1], 3);
    assert_int_equal(loom__kv_seq_need(kv, seq, 5000, need), LOOM_ERR_CONTEXT_FULL);
    (void)step(kv, seq, toks, 12);
    assert_int_equal(loom__kv_blocks_available(kv, 0), 97);
    assert_int_equal(loom__kv_blocks_available(kv, 1), 38); /* entry 0 left the window */
    (void)step(kv, seq, toks + 12, 18);
    KV_OK(loom__kv_seq_free(kv, seq));
    /* A prompt sharing the first 28 tokens: 7 blocks revived (window group: only the two
     * the query at 28 reads), then 2 more for 5 new tokens. */
    assert_int_equal(loom__kv_blocks_available(kv, 0), 100);
    KV_OK(loom__kv_admit_need(kv, 0, toks, 33, 100, need, &c));
    assert_int_equal(c, 28);
    assert_int_equal(need[0], 7 + 2);
    assert_int_equal(need[1], 2 + 2);
    KV_OK(loom__kv_seq_admit(kv, 0, toks, 33, &seq, &c));
    assert_int_equal(c, 28);
    assert_int_equal(100 - loom__kv_blocks_available(kv, 0), 7);
    assert_int_equal(40 - loom__kv_blocks_available(kv, 1), 2);
    CHECK(kv);
    loom__kv_destroy(kv);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_prefix_hit_same_prompt),
        cmocka_unit_test(test_salt_separates),
        cmocka_unit_test(test_hash_chains_parent),
        cmocka_unit_test(test_caching_disabled),
        cmocka_unit_test(test_partial_last_block_not_cached),
        cmocka_unit_test(test_full_prompt_hit_computes_last_token),
        cmocka_unit_test(test_preempt_recompute_readmits_cheaply),
        cmocka_unit_test(test_fork_shares_and_copies_once),
        cmocka_unit_test(test_unused_slots),
        cmocka_unit_test(test_rollback_undoes_cow_and_blocks),
        cmocka_unit_test(test_cow_after_diverged_rollback),
        cmocka_unit_test(test_sliding_window_release),
        cmocka_unit_test(test_sliding_window_prefix_hit),
        cmocka_unit_test(test_swap_roundtrip),
        cmocka_unit_test(test_eviction_is_lru),
        cmocka_unit_test(test_out_of_blocks_changes_nothing),
        cmocka_unit_test(test_bad_input),
        cmocka_unit_test(test_fill_desc),
        cmocka_unit_test(test_capacity_queries),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
