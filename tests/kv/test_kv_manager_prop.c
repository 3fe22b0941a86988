/* test_kv_manager_prop.c — a property test of the paged KV manager: thousands of random
 * operations (admissions from shared prefixes, batched steps with commit or rollback, forks,
 * frees with or without a pending reservation, recompute preemption, swap out/in, eviction under
 * pressure, sliding-window progress) against a simulated KV store, with loom__kv_check and a
 * read-back of every sequence's visible KV after each one, on four pool shapes. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "kv/kv_test_util.h"

/* ==== property test ============================================================================
 * A simulated engine: store[g][block * bs + slot] holds the token whose KV was written there.
 * (Its KV depends on the whole prefix, so the store holds a fingerprint of the tokens up to
 * that position.) Every operation goes through the manager and mirrors the data movement it asks
 * for (copies, writes, swap copies); afterwards loom__kv_check must pass and every resident
 * sequence must read its own tokens at every position its next query can see. A wrong prefix hit, a
 * missed copy-on-write, a block reused while still readable, or a scrambled swap shows up as a
 * wrong token. */

enum { P_MAX_SEQS = 10, P_MAX_LEN = 96, P_VOCAB = 1000, P_PREFIXES = 4 };

typedef struct psim_seq {
    bool used;
    bool swapped;
    int32_t id;
    int32_t n_known; /* tokens known: the prompt, then each sampled token as it is fed */
    int32_t toks[P_MAX_LEN];
    int32_t *host; /* swapped-out contents [n_held * bs] */
    int32_t host_blocks[64];
    int32_t host_offs[5];
} psim_seq;

typedef struct psim {
    loom__kv *kv;
    int32_t bs, n_groups, max_len;
    int32_t window[4], n_blocks[4];
    int32_t *store[4];
    psim_seq seqs[P_MAX_SEQS];
    int32_t prefixes[P_PREFIXES][P_MAX_LEN];
    uint64_t rng;
} psim;

static uint32_t prand(psim *sm, uint32_t n) {
    sm->rng ^= sm->rng << 13;
    sm->rng ^= sm->rng >> 7;
    sm->rng ^= sm->rng << 17;
    return (uint32_t)(sm->rng >> 11) % n;
}

/* What the KV of position p depends on: every token up to p (the store holds this, not the
 * bare token, so a block reused under a different prefix reads wrong). */
static int32_t fingerprint(const int32_t *toks, int32_t p) {
    uint32_t h = 2166136261u;
    for (int32_t i = 0; i <= p; i++) h = (h ^ (uint32_t)toks[i]) * 16777619u;
    return (int32_t)(h & 0x7fffffff);
}

/* loom__kv_unused_slots against a recount from the public tables: with no step pending, every
 * owned block is in some resident table, filled to the furthest computed position any of them
 * has in it. */
static void psim_verify_unused(psim *sm) {
    for (int32_t g = 0; g < sm->n_groups; g++) {
        int32_t *fill = malloc((size_t)sm->n_blocks[g] * sizeof *fill);
        assert_non_null(fill);
        for (int32_t b = 0; b < sm->n_blocks[g]; b++) fill[b] = -1;
        for (int32_t k = 0; k < P_MAX_SEQS; k++) {
            psim_seq *q = &sm->seqs[k];
            if (!q->used || q->swapped) continue;
            loom__kv_seq_info info;
            KV_OK(loom__kv_seq_get_info(sm->kv, q->id, &info));
            int32_t n;
            const int32_t *t = table_of(sm->kv, q->id, g, &n);
            for (int32_t i = 0; i < n; i++) {
                if (t[i] < 0) continue;
                int32_t f = info.n_pos - i * sm->bs;
                f = f < 0 ? 0 : f > sm->bs ? sm->bs : f;
                if (f > fill[t[i]]) fill[t[i]] = f;
            }
        }
        int64_t want = 0;
        int32_t owned = 0;
        for (int32_t b = 0; b < sm->n_blocks[g]; b++)
            if (fill[b] >= 0) want += sm->bs - fill[b], owned++;
        assert_int_equal(owned, gstats(sm->kv, g).n_used);
        int64_t got = -1;
        KV_OK(loom__kv_unused_slots(sm->kv, g, &got));
        if (got != want)
            fail_msg("group %d: %lld unused slots, recount %lld", g, (long long)got,
                     (long long)want);
        free(fill);
    }
}

static void psim_verify(psim *sm) {
    CHECK(sm->kv);
    psim_verify_unused(sm);
    for (int32_t k = 0; k < P_MAX_SEQS; k++) {
        psim_seq *q = &sm->seqs[k];
        if (!q->used || q->swapped) continue;
        loom__kv_seq_info info;
        KV_OK(loom__kv_seq_get_info(sm->kv, q->id, &info));
        for (int32_t g = 0; g < sm->n_groups; g++) {
            int32_t n;
            const int32_t *t = table_of(sm->kv, q->id, g, &n);
            int32_t lo = sm->window[g] > 0 ? info.n_pos - sm->window[g] + 1 : 0;
            for (int32_t p = lo > 0 ? lo : 0; p < info.n_pos; p++) {
                int32_t b = t[p / sm->bs];
                if (b < 0) fail_msg("seq %d group %d: position %d has no block", q->id, g, p);
                int32_t got = sm->store[g][b * sm->bs + p % sm->bs];
                if (got != fingerprint(q->toks, p))
                    fail_msg("seq %d group %d position %d (block %d): KV of another prefix", q->id,
                             g, p, b);
            }
        }
    }
}

static psim_seq *psim_pick(psim *sm, bool resident_only) {
    int32_t cand[P_MAX_SEQS], n = 0;
    for (int32_t k = 0; k < P_MAX_SEQS; k++)
        if (sm->seqs[k].used && !(resident_only && sm->seqs[k].swapped)) cand[n++] = k;
    return n ? &sm->seqs[cand[prand(sm, (uint32_t)n)]] : NULL;
}

static psim_seq *psim_slot(psim *sm) {
    for (int32_t k = 0; k < P_MAX_SEQS; k++)
        if (!sm->seqs[k].used) return &sm->seqs[k];
    return NULL;
}

static void psim_drop(psim_seq *q) {
    free(q->host);
    memset(q, 0, sizeof *q);
}

/* Admits toks[0 .. n) as a new sequence, checking admit_need's prediction against the change. */
static void psim_admit(psim *sm, const int32_t *toks, int32_t n, uint64_t salt) {
    psim_seq *q = psim_slot(sm);
    if (!q) return;
    int32_t need[4], predicted, used0[4], cached;
    KV_OK(loom__kv_admit_need(sm->kv, salt, toks, n, 0, need, &predicted));
    for (int32_t g = 0; g < sm->n_groups; g++) used0[g] = gstats(sm->kv, g).n_used;
    loom_status st = loom__kv_seq_admit(sm->kv, salt, toks, n, &q->id, &cached);
    if (st == LOOM_ERR_CONTEXT_FULL) return;
    KV_OK(st);
    assert_int_equal(cached, predicted);
    assert_true(cached < n);
    for (int32_t g = 0; g < sm->n_groups; g++)
        assert_int_equal(gstats(sm->kv, g).n_used - used0[g], need[g]);
    q->used = true;
    q->n_known = n;
    memcpy(q->toks, toks, (size_t)n * sizeof *toks);
}

/* One engine step over a random batch: reserve each, run all copies, write all new tokens,
 * then commit or roll back each. */
static void psim_step(psim *sm) {
    psim_seq *batch[4];
    int32_t n_new[4], n_batch = 0;
    loom__kv_copy copies[16];
    int32_t n_copies = 0;
    for (int32_t tries = 0; tries < 4; tries++) {
        psim_seq *q = psim_pick(sm, true);
        if (!q) break;
        loom__kv_seq_info info;
        KV_OK(loom__kv_seq_get_info(sm->kv, q->id, &info));
        if (info.reserved) continue; /* already in this batch */
        int32_t rest = q->n_known - info.n_pos, n;
        if (rest > 0)
            n = 1 + (int32_t)prand(sm, (uint32_t)(rest < 12 ? rest : 12));
        else
            n = 1 + (prand(sm, 8) == 0 ? (int32_t)prand(sm, 3) : 0); /* decode (or draft) */
        if (info.n_pos + n > sm->max_len) n = sm->max_len - info.n_pos;
        if (n == 0) continue;
        while (q->n_known < info.n_pos + n) q->toks[q->n_known++] = (int32_t)prand(sm, P_VOCAB);
        int32_t need[4], used0[4], nc;
        KV_OK(loom__kv_seq_need(sm->kv, q->id, n, need));
        for (int32_t g = 0; g < sm->n_groups; g++) used0[g] = gstats(sm->kv, g).n_used;
        loom_status st =
            loom__kv_reserve(sm->kv, q->id, n, q->toks + info.n_pos, copies + n_copies, 4, &nc);
        if (st == LOOM_ERR_CONTEXT_FULL) {
            assert_false(loom__kv_fits(sm->kv, need, false)); /* the query agreed */
            for (int32_t g = 0; g < sm->n_groups; g++)
                assert_int_equal(gstats(sm->kv, g).n_used, used0[g]);
            continue;
        }
        KV_OK(st);
        for (int32_t g = 0; g < sm->n_groups; g++)
            assert_int_equal(gstats(sm->kv, g).n_used - used0[g], need[g]);
        n_copies += nc;
        batch[n_batch] = q;
        n_new[n_batch++] = n;
    }
    CHECK(sm->kv);
    for (int32_t c = 0; c < n_copies; c++) { /* before the forward, in order */
        const loom__kv_copy *cp = &copies[c];
        memcpy(sm->store[cp->group] + cp->dst * sm->bs, sm->store[cp->group] + cp->src * sm->bs,
               (size_t)sm->bs * sizeof(int32_t));
    }
    for (int32_t i = 0; i < n_batch; i++) { /* the forward writes the new positions */
        loom__kv_seq_info info;
        KV_OK(loom__kv_seq_get_info(sm->kv, batch[i]->id, &info));
        for (int32_t g = 0; g < sm->n_groups; g++) {
            int32_t n;
            const int32_t *t = table_of(sm->kv, batch[i]->id, g, &n);
            for (int32_t p = info.n_pos; p < info.n_pos + n_new[i]; p++)
                sm->store[g][t[p / sm->bs] * sm->bs + p % sm->bs] = fingerprint(batch[i]->toks, p);
        }
    }
    for (int32_t i = 0; i < n_batch; i++) {
        if (prand(sm, 10) == 0)
            KV_OK(loom__kv_rollback(sm->kv, batch[i]->id));
        else
            KV_OK(loom__kv_commit(sm->kv, batch[i]->id));
    }
}

static void psim_swap_out(psim *sm, psim_seq *q) {
    loom__kv_seq_info info;
    KV_OK(loom__kv_seq_get_info(sm->kv, q->id, &info));
    KV_OK(loom__kv_swap_out(sm->kv, q->id, q->host_blocks, 64, q->host_offs));
    q->host = malloc((size_t)(info.n_held ? info.n_held : 1) * (size_t)sm->bs * sizeof(int32_t));
    assert_non_null(q->host);
    for (int32_t g = 0; g < sm->n_groups; g++)
        for (int32_t j = q->host_offs[g]; j < q->host_offs[g + 1]; j++)
            memcpy(q->host + j * sm->bs, sm->store[g] + q->host_blocks[j] * sm->bs,
                   (size_t)sm->bs * sizeof(int32_t));
    q->swapped = true;
}

static void psim_swap_in(psim *sm, psim_seq *q) {
    loom_status st = loom__kv_swap_in(sm->kv, q->id, q->host_blocks, 64, q->host_offs);
    if (st == LOOM_ERR_CONTEXT_FULL) return;
    KV_OK(st);
    for (int32_t g = 0; g < sm->n_groups; g++)
        for (int32_t j = q->host_offs[g]; j < q->host_offs[g + 1]; j++)
            memcpy(sm->store[g] + q->host_blocks[j] * sm->bs, q->host + j * sm->bs,
                   (size_t)sm->bs * sizeof(int32_t));
    free(q->host);
    q->host = NULL;
    q->swapped = false;
}

static void psim_op(psim *sm) {
    uint32_t r = prand(sm, 100);
    psim_seq *q;
    if (r < 18) { /* admit a prompt from a shared prefix plus a private tail */
        int32_t toks[P_MAX_LEN];
        int32_t n_pre = 1 + (int32_t)prand(sm, 40), n_tail = (int32_t)prand(sm, 6);
        if (n_pre + n_tail > sm->max_len) n_pre = sm->max_len - n_tail;
        memcpy(toks, sm->prefixes[prand(sm, P_PREFIXES)], (size_t)n_pre * sizeof *toks);
        for (int32_t i = 0; i < n_tail; i++) toks[n_pre + i] = (int32_t)prand(sm, P_VOCAB);
        psim_admit(sm, toks, n_pre + n_tail, prand(sm, 4) == 0 ? 7 : 0);
    } else if (r < 70) {
        psim_step(sm);
    } else if (r < 76 && (q = psim_pick(sm, true)) != NULL) { /* fork (parallel sampling) */
        psim_seq *c = psim_slot(sm);
        if (!c) return;
        loom_status st = loom__kv_seq_fork(sm->kv, q->id, &c->id);
        if (st == LOOM_ERR_CONTEXT_FULL) return;
        KV_OK(st);
        int32_t id = c->id;
        *c = *q;
        c->id = id;
        c->host = NULL;
    } else if (r < 82 && (q = psim_pick(sm, false)) != NULL) { /* finish */
        if (!q->swapped && prand(sm, 3) == 0) {                /* with a reservation pending */
            loom__kv_copy cp[4];
            int32_t nc, zero = 0;
            (void)loom__kv_reserve(sm->kv, q->id, 0, &zero, cp, 4, &nc);
        }
        KV_OK(loom__kv_seq_free(sm->kv, q->id));
        psim_drop(q);
    } else if (r < 88 && (q = psim_pick(sm, true)) != NULL) { /* preempt by recompute */
        int32_t toks[P_MAX_LEN], n = q->n_known;
        memcpy(toks, q->toks, (size_t)n * sizeof *toks);
        KV_OK(loom__kv_seq_free(sm->kv, q->id));
        psim_drop(q);
        psim_admit(sm, toks, n, 0);
    } else if (r < 94 && (q = psim_pick(sm, true)) != NULL) {
        psim_swap_out(sm, q);
    } else if ((q = psim_pick(sm, false)) != NULL && q->swapped) {
        psim_swap_in(sm, q);
    }
}

static void run_property(uint64_t seed, int32_t bs, int32_t n_groups, const int32_t *n_blocks,
                         const int32_t *windows, int32_t max_len, int32_t n_ops) {
    psim *sm = calloc(1, sizeof *sm);
    assert_non_null(sm);
    sm->rng = seed;
    sm->bs = bs;
    sm->n_groups = n_groups;
    sm->max_len = max_len;
    sm->kv = make_kv(bs, n_groups, n_blocks, windows, P_MAX_SEQS - 2, max_len);
    for (int32_t g = 0; g < n_groups; g++) {
        sm->window[g] = windows[g];
        sm->n_blocks[g] = n_blocks[g];
        sm->store[g] = malloc((size_t)n_blocks[g] * (size_t)bs * sizeof(int32_t));
        for (int32_t i = 0; i < n_blocks[g] * bs; i++) sm->store[g][i] = -7; /* poison */
    }
    for (int32_t k = 0; k < P_PREFIXES; k++)
        for (int32_t i = 0; i < P_MAX_LEN; i++) sm->prefixes[k][i] = (int32_t)prand(sm, P_VOCAB);
    for (int32_t op = 0; op < n_ops; op++) {
        psim_op(sm);
        psim_verify(sm);
    }
    loom__kv_stats s = stats(sm->kv);
    int64_t releases = 0;
    for (int32_t g = 0; g < n_groups; g++) releases += gstats(sm->kv, g).window_releases;
    printf("    bs %d, %d groups: %lld admissions, %lld/%lld hit tokens, %lld evictions, %lld "
           "copies, %lld swaps, %lld window releases\n",
           bs, n_groups, (long long)s.admissions, (long long)s.prefix_hit_tokens,
           (long long)s.prefix_query_tokens, (long long)s.evictions, (long long)s.cow_copies,
           (long long)s.swap_outs, (long long)releases);
    /* Every feature was exercised. */
    assert_true(s.prefix_hit_tokens > 0 && s.evictions > 0);
    if (bs > 1) assert_true(s.cow_copies > 0); /* blocks of 1 token are never partly full */
    assert_true(s.swap_outs > 0 && s.swap_ins > 0);
    bool any_window = false;
    for (int32_t g = 0; g < n_groups; g++) any_window |= windows[g] > 0;
    if (any_window) assert_true(releases > 0);
    /* Freeing everything returns every block: free or cached, nothing used. */
    for (int32_t k = 0; k < P_MAX_SEQS; k++) {
        if (!sm->seqs[k].used) continue;
        KV_OK(loom__kv_seq_free(sm->kv, sm->seqs[k].id));
        psim_drop(&sm->seqs[k]);
    }
    CHECK(sm->kv);
    for (int32_t g = 0; g < n_groups; g++) {
        loom__kv_group_stats gs = gstats(sm->kv, g);
        assert_int_equal(gs.n_used, 0);
        assert_int_equal(gs.n_free + gs.n_cached, n_blocks[g]);
        free(sm->store[g]);
    }
    assert_int_equal(stats(sm->kv).n_seqs, 0);
    loom__kv_destroy(sm->kv);
    free(sm);
}

static void test_property_random_operations(void **state) {
    (void)state;
    const int32_t nb_a[2] = {40, 24}, win_a[2] = {0, 7};
    run_property(0x9e3779b97f4a7c15ULL, 4, 2, nb_a, win_a, 64, 3000);
    const int32_t nb_b[2] = {48, 30}, win_b[2] = {0, 3};
    run_property(0x1234567887654321ULL, 1, 2, nb_b, win_b, 40, 3000);
    const int32_t nb_c[1] = {14}, win_c[1] = {0};
    run_property(0xdeadbeefcafef00dULL, 16, 1, nb_c, win_c, 96, 3000);
    const int32_t nb_d[3] = {30, 20, 26}, win_d[3] = {5, 0, 9};
    run_property(0x0f0f0f0f12345678ULL, 3, 3, nb_d, win_d, 60, 3000);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_property_random_operations),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
