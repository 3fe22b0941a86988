/* sched_fake.h — a fake KV manager and a fake engine for the scheduler tests.
 *
 * The fake KV holds, per request id, the blocks its sequence uses on the "device" and on the
 * "host" (after a SWAP preemption). Needs are plain arithmetic: ceil(positions / block_size)
 * minus what the request holds, so a prefix-cache hit is copied rather than shared (simple, and
 * conservative for the scheduler). The fake engine carries out a plan exactly as the engine
 * will — preemptions, rejections, then the entries' reservations — and fails the test if a
 * reservation does not fit: the scheduler's block accounting must make every plan feasible. */
#pragma once

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <stdlib.h>
#include <string.h>

#include "sched/sched.h"

typedef struct fake_seq {
    int32_t held;    /* device blocks */
    int32_t swapped; /* host blocks (after SWAP preemption) */
    int32_t cached;  /* what cached_tokens answers */
} fake_seq;

typedef struct fake_kv {
    int32_t n_blocks, block_size;
    int32_t used;   /* device blocks held by all sequences */
    fake_seq *seqs; /* [cap] indexed by request id */
    uint64_t cap;
    int64_t n_calls; /* queries answered (the scheduler asks, never tells) */
} fake_kv;

static inline fake_seq *fake_seq_of(fake_kv *kv, uint64_t id) {
    assert_true(id < kv->cap);
    return &kv->seqs[id];
}

static inline int32_t fake_blocks_for(const fake_kv *kv, int64_t positions) {
    return (int32_t)((positions + kv->block_size - 1) / kv->block_size);
}

static inline int32_t fake_blocks_free(void *ctx) {
    fake_kv *kv = ctx;
    kv->n_calls++;
    return kv->n_blocks - kv->used;
}

static inline int32_t fake_blocks_needed(void *ctx, uint64_t id, int32_t n_computed,
                                         int32_t n_new) {
    fake_kv *kv = ctx;
    kv->n_calls++;
    assert_true(n_computed >= 0 && n_new >= 0);
    int32_t need = fake_blocks_for(kv, (int64_t)n_computed + n_new) - fake_seq_of(kv, id)->held;
    return need > 0 ? need : 0;
}

static inline int32_t fake_blocks_reclaimable(void *ctx, uint64_t id) {
    fake_kv *kv = ctx;
    kv->n_calls++;
    return fake_seq_of(kv, id)->held;
}

static inline int32_t fake_cached_tokens(void *ctx, uint64_t id) {
    fake_kv *kv = ctx;
    return fake_seq_of(kv, id)->cached;
}

static inline void fake_kv_init(fake_kv *kv, int32_t n_blocks, int32_t block_size,
                                uint64_t max_id) {
    memset(kv, 0, sizeof *kv);
    kv->n_blocks = n_blocks;
    kv->block_size = block_size;
    kv->cap = max_id + 1;
    kv->seqs = calloc(kv->cap, sizeof *kv->seqs);
    assert_non_null(kv->seqs);
}

static inline void fake_kv_free(fake_kv *kv) {
    free(kv->seqs);
}

static inline loom__sched_kv_iface fake_iface(fake_kv *kv) {
    loom__sched_kv_iface it = {
        .ctx = kv,
        .blocks_free = fake_blocks_free,
        .blocks_needed = fake_blocks_needed,
        .blocks_reclaimable = fake_blocks_reclaimable,
        .cached_tokens = fake_cached_tokens,
    };
    return it;
}

/* The engine frees everything a finished, cancelled or rejected request holds. */
static inline void fake_release(fake_kv *kv, uint64_t id) {
    fake_seq *q = fake_seq_of(kv, id);
    kv->used -= q->held;
    q->held = 0;
    q->swapped = 0;
}

/* Carries out a plan's preemptions, rejections and reservations. */
static inline void fake_apply(fake_kv *kv, const loom__sched_plan *p) {
    for (int32_t i = 0; i < p->n_preempted; i++) {
        fake_seq *q = fake_seq_of(kv, p->preempted[i]);
        assert_true(q->held > 0 || q->swapped == 0);
        kv->used -= q->held;
        if (p->preempt_mode == LOOM_SCHED_PREEMPT_SWAP) q->swapped = q->held;
        q->held = 0;
    }
    for (int32_t i = 0; i < p->n_rejected; i++) fake_release(kv, p->rejected[i]);
    for (int32_t i = 0; i < p->n_entries; i++) {
        const loom__sched_entry *e = &p->entries[i];
        fake_seq *q = fake_seq_of(kv, e->id);
        if (e->admitted && !e->swap_in) assert_int_equal(q->held, 0);
        if (e->swap_in) {
            assert_true(e->admitted);
            q->swapped = 0;
        }
        int32_t want = fake_blocks_for(kv, (int64_t)e->pos_start + e->n_tokens);
        if (want > q->held) {
            kv->used += want - q->held;
            q->held = want;
        }
        /* The heart of it: the scheduler never plans more blocks than exist. */
        assert_true(kv->used <= kv->n_blocks);
    }
}

/* Checks what every plan promises: budget, sequence limit, decodes of running requests first,
 * sane entries, no id twice. */
static inline void check_plan_shape(const loom__sched_plan *p, const loom__sched_config *cfg) {
    assert_true(p->n_entries >= 0 && p->n_entries <= cfg->max_seqs);
    assert_true(p->n_preempted >= 0 && p->n_preempted <= cfg->max_seqs);
    int32_t sum = 0, n_decode = 0;
    bool seen_other = false;
    for (int32_t i = 0; i < p->n_entries; i++) {
        const loom__sched_entry *e = &p->entries[i];
        assert_true(e->n_tokens >= 1 && e->pos_start >= 0);
        if (!e->is_prefill) {
            assert_int_equal(e->n_tokens, 1);
            assert_true(e->sample);
            n_decode++;
        }
        bool running_decode = !e->is_prefill && !e->admitted;
        if (running_decode)
            assert_false(seen_other);
        else
            seen_other = true;
        if (cfg->max_prefill_chunk > 0) assert_true(e->n_tokens <= cfg->max_prefill_chunk);
        for (int32_t j = 0; j < i; j++) assert_true(p->entries[j].id != e->id);
        sum += e->n_tokens;
    }
    assert_int_equal(sum, p->n_tokens);
    assert_int_equal(n_decode, p->n_decode);
    assert_true(p->n_tokens <= cfg->max_batched_tokens);
}
