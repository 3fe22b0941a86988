/* test_kv_sizing.c — how the engine splits its KV byte budget between the groups' pools
 * (loom__engine_kv_plan, engine_kv.c): exact counts for Gemma 3 270M's shape, one-group and
 * sliding-only models unchanged, the smallest budget that works and the error one byte below
 * it, bad shapes; then a random workload on a real KV manager whose sliding pool has exactly
 * the planned size, within the scheduler's limits (max_seqs running sequences, max_batched_
 * tokens a step), with prefix hits, copy-on-write, rollbacks, swaps and recompute: no
 * reservation may ever find the sliding pool short. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "engine/engine.h"
#include "kv/kv_test_util.h"

/* ==== the documented formula, written out again =============================================== */

static int64_t ceil_div(int64_t a, int64_t b) {
    return (a + b - 1) / b;
}
static int64_t min2(int64_t a, int64_t b) {
    return a < b ? a : b;
}

/* engine_kv.c's cap for a sliding group of a model that also has full attention. */
static int64_t expect_cap(const loom__engine_kv_shape *sh, int32_t w) {
    int64_t bs = sh->block_size, S = sh->max_seqs, T = sh->max_batched_tokens;
    int64_t table = ceil_div(sh->max_ctx, bs), span = w + 2 * bs - 3;
    int64_t held = min2((S * span + T) / bs, S * table);
    int64_t share = sh->prefix_cache ? ceil_div(S, 8) * min2(span / bs, table) : 0;
    return held + S + share;
}

/* Gemma 3 270M: 18 layers, 3 global and 15 local (window 512), one KV head of 256. */
static loom__engine_kv_shape gemma3_270m(int64_t budget, int32_t max_seqs, int32_t max_ctx) {
    const size_t block = 1 * 256 * 2 * 16; /* heads * head_dim * f16 * block_size */
    loom__engine_kv_shape sh = {
        .budget = budget,
        .n_groups = 2,
        .window = {0, 512},
        .block_bytes = {3 * 2 * block, 15 * 2 * block},
        .block_size = 16,
        .max_seqs = max_seqs,
        .max_batched_tokens = 512,
        .max_ctx = max_ctx,
        .prefix_cache = true,
    };
    return sh;
}

static void plan_ok(const loom__engine_kv_shape *sh, int32_t *n) {
    loom_status st = loom__engine_kv_plan(sh, n);
    if (st != LOOM_OK) fail_msg("plan: %s (%s)", loom_status_str(st), loom_last_error());
}

/* ==== exact counts ============================================================================ */

static void test_gemma3_counts(void **state) {
    (void)state;
    int32_t n[2];
    /* 64 MiB with the default 64 sequences: 64 windows of 512 do not fit, so both groups keep
     * the equal count they always had (64 MiB / (49152 + 245760) bytes). */
    loom__engine_kv_shape sh = gemma3_270m(64 << 20, 64, 2048);
    plan_ok(&sh, n);
    assert_int_equal(n[0], 227);
    assert_int_equal(n[1], 227);
    /* Four sequences: the local layers need at most 167 + 4 + 33 blocks, the rest goes global. */
    sh = gemma3_270m(64 << 20, 4, 2048);
    assert_int_equal(expect_cap(&sh, 512), 204);
    plan_ok(&sh, n);
    assert_int_equal(n[1], 204);
    assert_int_equal(n[0], (int32_t)(((64 << 20) - 204 * 245760) / 49152));
    assert_int_equal(n[0], 345);
    sh.prefix_cache = false; /* no share for cached prefixes */
    plan_ok(&sh, n);
    assert_int_equal(n[1], 171);
    assert_int_equal(n[0], 510);
    /* 4 GiB, the default 64 sequences, max_ctx 8192: the local pool stops at 2196 + 64 + 264. */
    sh = gemma3_270m(4LL << 30, 64, 8192);
    assert_int_equal(expect_cap(&sh, 512), 2524);
    plan_ok(&sh, n);
    assert_int_equal(n[1], 2524);
    assert_int_equal(n[0], (int32_t)(((4LL << 30) - 2524LL * 245760) / 49152));
    assert_int_equal(n[0], 74761); /* an equal split gave both 14563 */
    /* max_ctx no longer than the window: a local table is as long as a global one, and the
     * pools come out equal whatever the budget allows. */
    sh = gemma3_270m(4LL << 30, 64, 512);
    plan_ok(&sh, n);
    assert_int_equal(n[1], 64 * 32 + 64 + 8 * 32);
    assert_true(n[0] > n[1]);
}

static void test_one_group_and_sliding_only(void **state) {
    (void)state;
    int32_t n[3];
    /* One full-attention group (llama): budget / block bytes, as before. */
    loom__engine_kv_shape sh = {.budget = 10000000,
                                .n_groups = 1,
                                .window = {0},
                                .block_bytes = {65536},
                                .block_size = 16,
                                .max_seqs = 8,
                                .max_batched_tokens = 64,
                                .max_ctx = 256,
                                .prefix_cache = true};
    plan_ok(&sh, n);
    assert_int_equal(n[0], 10000000 / 65536);
    /* Only sliding groups: the scheduler's group is a sliding one, and every group keeps the
     * equal count. */
    sh.window[0] = 16;
    plan_ok(&sh, n);
    assert_int_equal(n[0], 10000000 / 65536);
    sh.n_groups = 2;
    sh.window[1] = 64;
    sh.block_bytes[1] = 3 * 65536;
    plan_ok(&sh, n);
    assert_int_equal(n[0], 10000000 / (4 * 65536));
    assert_int_equal(n[1], n[0]);
    /* Two full groups and a sliding one: the full groups always share one count. */
    sh = (loom__engine_kv_shape){.budget = 1 << 30,
                                 .n_groups = 3,
                                 .window = {0, 0, 32},
                                 .block_bytes = {4096, 8192, 40960},
                                 .block_size = 16,
                                 .max_seqs = 8,
                                 .max_batched_tokens = 64,
                                 .max_ctx = 1024};
    plan_ok(&sh, n);
    assert_int_equal(n[0], n[1]);
    assert_int_equal(n[2], expect_cap(&sh, 32));
    assert_int_equal(n[0], (int32_t)(((1 << 30) - n[2] * 40960LL) / (4096 + 8192)));
}

/* The smallest budget: group 0 gets the blocks of one request of max_ctx, the sliding group
 * as many or its cap. One byte less fails, naming the group and what it needs. */
static void test_smallest_budget(void **state) {
    (void)state;
    int32_t n[2];
    loom__engine_kv_shape sh = gemma3_270m(0, 4, 2048);
    const int64_t need = 2048 / 16 + 1;
    sh.budget = need * 49152 + min2(expect_cap(&sh, 512), need) * 245760;
    plan_ok(&sh, n);
    assert_int_equal(n[0], need);
    assert_int_equal(n[1], 129); /* the cap (204) is above what one request can use */
    sh.budget--;
    assert_int_equal(loom__engine_kv_plan(&sh, n), LOOM_ERR_OUT_OF_MEMORY);
    assert_non_null(strstr(loom_last_error(), "group 0"));
    assert_non_null(strstr(loom_last_error(), "needs 129"));
    /* Nothing at all. */
    sh.budget = 0;
    assert_int_equal(loom__engine_kv_plan(&sh, n), LOOM_ERR_OUT_OF_MEMORY);
}

static void test_bad_shapes(void **state) {
    (void)state;
    int32_t n[LOOM_MAX_KV_GROUPS];
    loom__engine_kv_shape ok = gemma3_270m(64 << 20, 4, 2048), sh = ok;
    assert_int_equal(loom__engine_kv_plan(NULL, n), LOOM_ERR_INVALID_ARG);
    assert_int_equal(loom__engine_kv_plan(&sh, NULL), LOOM_ERR_INVALID_ARG);
    sh.n_groups = 0;
    assert_int_equal(loom__engine_kv_plan(&sh, n), LOOM_ERR_INVALID_ARG);
    sh = ok;
    sh.n_groups = LOOM_MAX_KV_GROUPS + 1;
    assert_int_equal(loom__engine_kv_plan(&sh, n), LOOM_ERR_INVALID_ARG);
    sh = ok;
    sh.block_bytes[1] = 0;
    assert_int_equal(loom__engine_kv_plan(&sh, n), LOOM_ERR_INVALID_ARG);
    sh = ok;
    sh.window[1] = -1;
    assert_int_equal(loom__engine_kv_plan(&sh, n), LOOM_ERR_INVALID_ARG);
    sh = ok;
    sh.budget = -1;
    assert_int_equal(loom__engine_kv_plan(&sh, n), LOOM_ERR_INVALID_ARG);
}

/* ==== the sliding pool under load ============================================================= */

enum { SIM_MAX_SEQS = 16, SIM_MAX_CTX = 512, SIM_PREFIXES = 3, SIM_SWAPPED = 8 };

typedef struct sim_seq {
    bool live, swapped;
    int32_t id, n_known, n_pos;
    int32_t toks[SIM_MAX_CTX];
} sim_seq;

typedef struct sim {
    loom__kv *kv;
    loom__engine_kv_shape sh;
    int32_t n_resident;
    sim_seq seqs[SIM_MAX_SEQS + SIM_SWAPPED];
    int32_t prefixes[SIM_PREFIXES][SIM_MAX_CTX];
    uint64_t rng;
    int64_t n_reserves, n_copies, peak_sliding;
} sim;

static uint32_t rnd(sim *s, uint32_t n) {
    s->rng ^= s->rng << 13;
    s->rng ^= s->rng >> 7;
    s->rng ^= s->rng << 17;
    return (uint32_t)(s->rng >> 11) % n;
}

/* Admits a new sequence: a shared prefix (sometimes a whole number of blocks, so that a repeat
 * is a whole-prompt hit that copies on write) and a random tail. */
static void sim_admit(sim *s, sim_seq *q) {
    const int32_t bs = s->sh.block_size, max = s->sh.max_ctx / 2;
    const int32_t *prefix = s->prefixes[rnd(s, SIM_PREFIXES)];
    int32_t n = 1 + (int32_t)rnd(s, (uint32_t)max);
    if (rnd(s, 2)) n = n / bs * bs > 0 ? n / bs * bs : bs;
    int32_t shared = rnd(s, 4) ? n : (int32_t)rnd(s, (uint32_t)n);
    for (int32_t i = 0; i < n; i++)
        q->toks[i] = i < shared ? prefix[i] : 1000 + (int32_t)rnd(s, 500);
    int32_t cached = 0;
    KV_OK(loom__kv_seq_admit(s->kv, 0, q->toks, n, &q->id, &cached));
    q->live = true;
    q->swapped = false;
    q->n_known = n;
    q->n_pos = cached;
    s->n_resident++;
}

/* Recompute preemption: free, then re-admitted with what it knows. */
static void sim_recompute(sim *s, sim_seq *q) {
    KV_OK(loom__kv_seq_free(s->kv, q->id));
    int32_t cached = 0;
    KV_OK(loom__kv_seq_admit(s->kv, 0, q->toks, q->n_known, &q->id, &cached));
    q->n_pos = cached;
}

static void sim_swap(sim *s, sim_seq *q, bool out) {
    int32_t blocks[2 * SIM_MAX_CTX], offsets[3];
    if (out) {
        KV_OK(loom__kv_swap_out(s->kv, q->id, blocks, 2 * SIM_MAX_CTX, offsets));
        s->n_resident--;
    } else {
        KV_OK(loom__kv_swap_in(s->kv, q->id, blocks, 2 * SIM_MAX_CTX, offsets));
        s->n_resident++;
    }
    q->swapped = out;
}

/* Life-cycle changes between steps, keeping at most max_seqs sequences resident. */
static void sim_churn(sim *s) {
    const int32_t n_slots = SIM_MAX_SEQS + SIM_SWAPPED;
    for (int32_t k = 0; k < n_slots; k++) {
        sim_seq *q = &s->seqs[k];
        uint32_t r = rnd(s, 100);
        if (q->live && !q->swapped && (r < 2 || q->n_known >= s->sh.max_ctx - 1)) {
            KV_OK(loom__kv_seq_free(s->kv, q->id));
            q->live = false;
            s->n_resident--;
        } else if (q->live && !q->swapped && r < 4) {
            sim_recompute(s, q);
        } else if (q->live && !q->swapped && r < 6) {
            sim_swap(s, q, true);
        } else if (q->live && q->swapped && r < 30 && s->n_resident < s->sh.max_seqs) {
            sim_swap(s, q, false);
        } else if (!q->live && r < 30 && s->n_resident < s->sh.max_seqs) {
            sim_admit(s, q);
        }
        CHECK(s->kv);
    }
}

/* One step: the resident sequences in random order, each a chunk of what it has left to
 * compute (a decode appends a sampled token first), all within max_batched_tokens. Every
 * reservation must succeed: the full pool is big enough by construction, the sliding one by
 * the plan. */
static void sim_step(sim *s) {
    const int32_t n_slots = SIM_MAX_SEQS + SIM_SWAPPED;
    int32_t order[SIM_MAX_SEQS + SIM_SWAPPED], n = 0, budget = s->sh.max_batched_tokens;
    int32_t batch[SIM_MAX_SEQS + SIM_SWAPPED], n_batch = 0;
    for (int32_t k = 0; k < n_slots; k++)
        if (s->seqs[k].live && !s->seqs[k].swapped) order[n++] = k;
    for (int32_t i = n - 1; i > 0; i--) {
        int32_t j = (int32_t)rnd(s, (uint32_t)i + 1), t = order[i];
        order[i] = order[j];
        order[j] = t;
    }
    for (int32_t i = 0; i < n && budget > 0; i++) {
        sim_seq *q = &s->seqs[order[i]];
        if (rnd(s, 8) == 0) continue; /* not scheduled this step */
        if (q->n_pos == q->n_known) q->toks[q->n_known++] = 2000 + (int32_t)rnd(s, 500);
        int32_t left = q->n_known - q->n_pos;
        int32_t c = rnd(s, 3) ? left : 1 + (int32_t)rnd(s, (uint32_t)left);
        if (c > budget) c = budget;
        loom__kv_copy copies[4];
        int32_t n_copies = 0;
        loom_status st =
            loom__kv_reserve(s->kv, q->id, c, q->toks + q->n_pos, copies, 4, &n_copies);
        if (st != LOOM_OK)
            fail_msg("reserve of %d tokens at %d: %s (%s)", c, q->n_pos, loom_status_str(st),
                     loom_last_error());
        s->n_reserves++;
        s->n_copies += n_copies;
        budget -= c;
        batch[n_batch++] = order[i];
    }
    loom__kv_group_stats gs = gstats(s->kv, 1);
    if (gs.n_used > s->peak_sliding) s->peak_sliding = gs.n_used;
    CHECK(s->kv);
    for (int32_t b = 0; b < n_batch; b++) {
        sim_seq *q = &s->seqs[batch[b]];
        loom__kv_seq_info info;
        KV_OK(loom__kv_seq_get_info(s->kv, q->id, &info));
        if (rnd(s, 20) == 0) {
            KV_OK(loom__kv_rollback(s->kv, q->id));
        } else {
            KV_OK(loom__kv_commit(s->kv, q->id));
            q->n_pos += info.n_reserved;
        }
    }
    CHECK(s->kv);
}

static void run_sim(int32_t bs, int32_t window, int32_t max_seqs, int32_t tokens, int32_t max_ctx,
                    int32_t n_steps, uint64_t seed) {
    sim *s = calloc(1, sizeof *s);
    assert_non_null(s);
    s->rng = seed;
    /* The sliding pool as planned without the prefix-cache share (which is for hits, not for
     * safety), with the budget large enough for the cap to bind. */
    s->sh = (loom__engine_kv_shape){.budget = 1LL << 40,
                                    .n_groups = 2,
                                    .window = {0, window},
                                    .block_bytes = {1024, 4096},
                                    .block_size = bs,
                                    .max_seqs = max_seqs,
                                    .max_batched_tokens = tokens,
                                    .max_ctx = max_ctx,
                                    .prefix_cache = false};
    int32_t planned[2];
    plan_ok(&s->sh, planned);
    assert_int_equal(planned[1], expect_cap(&s->sh, window));
    int32_t pools[2] = {max_seqs * (int32_t)(ceil_div(max_ctx, bs) + 1), planned[1]};
    int32_t windows[2] = {0, window};
    s->kv = make_kv(bs, 2, pools, windows, SIM_MAX_SEQS + SIM_SWAPPED, max_ctx);
    for (int32_t p = 0; p < SIM_PREFIXES; p++)
        for (int32_t i = 0; i < SIM_MAX_CTX; i++) s->prefixes[p][i] = 3 + (int32_t)rnd(s, 900);
    for (int32_t t = 0; t < n_steps; t++) {
        sim_churn(s);
        sim_step(s);
    }
    loom__kv_stats ks = stats(s->kv);
    printf("bs %d, window %d, %d seqs, %d tokens a step: %lld reservations, %lld copies, "
           "%lld window releases, prefix hits %lld/%lld; sliding pool %d, peak %lld\n",
           bs, window, max_seqs, tokens, (long long)s->n_reserves, (long long)s->n_copies,
           (long long)ks.window_releases, (long long)ks.prefix_hit_tokens,
           (long long)ks.prefix_query_tokens, planned[1], (long long)s->peak_sliding);
    if (bs > 1) assert_true(s->n_copies > 0); /* one-token blocks are never partly filled */
    if (window < max_ctx - 1) assert_true(ks.window_releases > 0);
    assert_true(3 * s->peak_sliding > planned[1]); /* the workload did press on the pool */
    loom__kv_destroy(s->kv);
    free(s);
}

/* The worst case the held part of the cap describes, built on purpose: every sequence's first
 * visible position is the last slot of a block and its step starts a new block. Window 32,
 * block 16: a sequence at position 46 (mod 16: 14) computing 3 tokens holds 4 blocks, computing
 * 19 holds 5; eight of them with 56 tokens in all hold floor((8 * 61 + 56) / 16) = 34. Then
 * the copy-on-write allowance, which the engine needs when many whole-prompt hits start at
 * once. */
static void test_bound_reached(void **state) {
    (void)state;
    loom__engine_kv_shape sh = {.budget = 1LL << 40,
                                .n_groups = 2,
                                .window = {0, 32},
                                .block_bytes = {1024, 4096},
                                .block_size = 16,
                                .max_seqs = 8,
                                .max_batched_tokens = 56,
                                .max_ctx = 256};
    int32_t planned[2];
    plan_ok(&sh, planned);
    assert_int_equal(planned[1], 34 + 8);
    int32_t pools[2] = {200, planned[1]}, windows[2] = {0, 32}, seqs[8], toks[128];
    loom__kv *kv = make_kv(16, 2, pools, windows, 8, 256);
    for (int32_t k = 0; k < 8; k++) {
        for (int32_t i = 0; i < 128; i++) toks[i] = 100 * k + i;
        int32_t P = 46 + 16 * (k % 3);
        seqs[k] = run_prompt(kv, 0, toks, P, NULL);
    }
    for (int32_t k = 0; k < 8; k++) {
        loom__kv_copy c[4];
        int32_t nc = 0, n = k < 2 ? 19 : 3;
        for (int32_t i = 0; i < n; i++) toks[i] = 5000 + i;
        KV_OK(loom__kv_reserve(kv, seqs[k], n, toks, c, 4, &nc));
    }
    assert_int_equal(gstats(kv, 1).n_used, 34);
    CHECK(kv);
    loom__kv_destroy(kv);

    /* Copy-on-write on top: eight whole-prompt hits (64 tokens: 63 reused, the last block
     * copied) computing 2 tokens each hold 3 blocks and pin their copy's source, 4 apiece. */
    kv = make_kv(16, 2, pools, windows, 8, 256);
    for (int32_t k = 0; k < 8; k++) {
        for (int32_t i = 0; i < 64; i++) toks[i] = 100 * k + i;
        KV_OK(loom__kv_seq_free(kv, run_prompt(kv, 0, toks, 64, NULL)));
    }
    for (int32_t k = 0; k < 8; k++) {
        for (int32_t i = 0; i < 64; i++) toks[i] = 100 * k + i;
        int32_t cached = 0;
        KV_OK(loom__kv_seq_admit(kv, 0, toks, 64, &seqs[k], &cached));
        assert_int_equal(cached, 63);
    }
    for (int32_t k = 0; k < 8; k++) {
        loom__kv_copy c[4];
        int32_t nc = 0;
        toks[64] = 7;
        KV_OK(loom__kv_reserve(kv, seqs[k], 2, toks + 63, c, 4, &nc));
        assert_int_equal(nc, 2); /* both groups copy */
    }
    assert_int_equal(gstats(kv, 1).n_used, 8 * (3 + 1));
    CHECK(kv);
    loom__kv_destroy(kv);
}

static void test_sliding_pool_never_short(void **state) {
    (void)state;
    run_sim(16, 32, 8, 64, 256, 3000, 0x9e3779b97f4a7c15ULL);
    run_sim(4, 10, 6, 20, 128, 3000, 12345);
    run_sim(1, 5, 4, 8, 64, 3000, 777);
    run_sim(8, 100, 16, 40, 512, 2000, 4242);
    run_sim(16, 512, 3, 48, 512, 1000, 99); /* window as long as the context */
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gemma3_counts),   cmocka_unit_test(test_one_group_and_sliding_only),
        cmocka_unit_test(test_smallest_budget), cmocka_unit_test(test_bad_shapes),
        cmocka_unit_test(test_bound_reached),   cmocka_unit_test(test_sliding_pool_never_short),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
