/* kv_test_util.h — helpers shared by the KV manager's test programs (test_kv_manager.c and
 * test_kv_manager_prop.c): status assertions that print the last error, manager construction,
 * one-step reserve+commit, and stats/table accessors. Include after <cmocka.h>. */
#pragma once

#include <stdint.h>
#include <string.h>

#include "kv/kv_manager.h"

#define KV_OK(expr)                                                                                \
    do {                                                                                           \
        loom_status st_ = (expr);                                                                  \
        if (st_ != LOOM_OK)                                                                        \
            fail_msg("%s: %s (%s)", #expr, loom_status_str(st_), loom_last_error());               \
    } while (0)
#define CHECK(kv) KV_OK(loom__kv_check(kv))

static inline loom__kv *make_kv(int32_t bs, int32_t n_groups, const int32_t *n_blocks,
                                const int32_t *windows, int32_t max_seqs, int32_t max_len) {
    loom__kv_group_params gp[4];
    for (int32_t g = 0; g < n_groups; g++)
        gp[g] =
            (loom__kv_group_params){.n_blocks = n_blocks[g], .window = windows ? windows[g] : 0};
    loom__kv_params p = loom__kv_default_params();
    p.block_size = bs;
    p.n_groups = n_groups;
    p.groups = gp;
    p.max_seqs = max_seqs;
    p.max_seq_len = max_len;
    loom__kv *kv = NULL;
    KV_OK(loom__kv_create(&p, &kv));
    CHECK(kv);
    return kv;
}

static inline loom__kv *make_simple(int32_t bs, int32_t n_blocks) {
    return make_kv(bs, 1, &n_blocks, NULL, 8, 256);
}

static inline void fill_tokens(int32_t *t, int32_t n, int32_t base) {
    for (int32_t i = 0; i < n; i++) t[i] = base + i;
}

/* Reserves and commits tokens[0 .. n) on seq; returns the number of copies the reserve asked for.
 */
static inline int32_t step(loom__kv *kv, int32_t seq, const int32_t *tokens, int32_t n) {
    loom__kv_copy c[4];
    int32_t nc = -1;
    KV_OK(loom__kv_reserve(kv, seq, n, tokens, c, 4, &nc));
    CHECK(kv);
    KV_OK(loom__kv_commit(kv, seq));
    CHECK(kv);
    return nc;
}

/* Admits prompt and computes its uncached rest in one step. */
static inline int32_t run_prompt(loom__kv *kv, uint64_t salt, const int32_t *prompt, int32_t n,
                                 int32_t *n_cached) {
    int32_t seq = -1, cached = -1;
    KV_OK(loom__kv_seq_admit(kv, salt, prompt, n, &seq, &cached));
    CHECK(kv);
    assert_true(cached >= 0 && cached < n);
    (void)step(kv, seq, prompt + cached, n - cached);
    if (n_cached) *n_cached = cached;
    return seq;
}

static inline const int32_t *table_of(const loom__kv *kv, int32_t seq, int32_t g, int32_t *n) {
    const int32_t *t = NULL;
    KV_OK(loom__kv_seq_table(kv, seq, g, &t, n));
    return t;
}

static inline loom__kv_group_stats gstats(const loom__kv *kv, int32_t g) {
    loom__kv_group_stats s;
    KV_OK(loom__kv_get_group_stats(kv, g, &s));
    return s;
}

static inline loom__kv_stats stats(const loom__kv *kv) {
    loom__kv_stats s;
    KV_OK(loom__kv_get_stats(kv, &s));
    return s;
}
