/* sched_fixture.h — the fixture of test_sched.c: a scheduler over the fake KV manager of
 * sched_fake.h, driven step by step (1 ms apart) by a fake engine that reports one token per
 * sampling entry, with helpers to find entries and request states. */
#pragma once

#include "sched/sched_fake.h"

/* ------------------------------------------------------------------------------------------ */
/* Fixture: a scheduler, a fake KV, and a fake engine driving steps 1 ms apart                 */
/* ------------------------------------------------------------------------------------------ */

#define STEP_US 1000

typedef struct fx {
    fake_kv kv;
    loom__sched_config cfg;
    loom__sched *s;
    loom__sched_plan plan;
    int64_t now;
} fx;

static loom__sched_config small_cfg(void) {
    loom__sched_config c = loom__sched_default_config();
    c.max_batched_tokens = 32;
    c.max_seqs = 4;
    c.promote_age_us = 0;
    return c;
}

static void fx_open(fx *f, loom__sched_config cfg, int32_t n_blocks, int32_t block_size) {
    memset(f, 0, sizeof *f);
    fake_kv_init(&f->kv, n_blocks, block_size, 100);
    f->cfg = cfg;
    loom__sched_kv_iface it = fake_iface(&f->kv);
    assert_int_equal(loom__sched_create(&cfg, &it, &f->s), LOOM_OK);
}

static void fx_close(fx *f) {
    assert_int_equal(loom__sched_validate(f->s), LOOM_OK);
    loom__sched_destroy(f->s);
    fake_kv_free(&f->kv);
}

static void add_info(fx *f, loom__sched_request_info info) {
    assert_int_equal(loom__sched_add(f->s, &info, f->now), LOOM_OK);
}

static void add_req(fx *f, uint64_t id, int32_t prio, int32_t n_prompt, int32_t max_new) {
    add_info(f, (loom__sched_request_info){.id = id,
                                           .priority = prio,
                                           .n_prompt = n_prompt,
                                           .max_new_tokens = max_new,
                                           .arrival_us = f->now});
}

/* Schedules at f->now, checks the plan's shape and carries it out on the fake KV. */
static const loom__sched_plan *plan_step(fx *f) {
    assert_int_equal(loom__sched_schedule(f->s, f->now, &f->plan), LOOM_OK);
    check_plan_shape(&f->plan, &f->cfg);
    fake_apply(&f->kv, &f->plan);
    assert_int_equal(loom__sched_validate(f->s), LOOM_OK);
    return &f->plan;
}

static bool known(fx *f, uint64_t id) {
    loom__sched_request_view v;
    return loom__sched_get(f->s, id, &v) == LOOM_OK;
}

/* Reports one token per sampling entry, finishes the ids in `fin`, frees what the scheduler
 * forgot, and advances time. */
static void done_step(fx *f, const uint64_t *fin, int n_fin) {
    loom__sched_result res[64];
    int32_t n = 0;
    for (int32_t i = 0; i < f->plan.n_entries; i++) {
        const loom__sched_entry *e = &f->plan.entries[i];
        bool finish = false;
        for (int j = 0; j < n_fin; j++) finish |= fin[j] == e->id;
        if (e->sample || finish) res[n++] = (loom__sched_result){e->id, e->sample ? 1 : 0, finish};
    }
    assert_int_equal(loom__sched_on_step_done(f->s, res, n, f->now), LOOM_OK);
    for (int32_t i = 0; i < f->plan.n_entries; i++)
        if (!known(f, f->plan.entries[i].id)) fake_release(&f->kv, f->plan.entries[i].id);
    for (int32_t i = 0; i < f->plan.n_rejected; i++) assert_false(known(f, f->plan.rejected[i]));
    assert_int_equal(loom__sched_validate(f->s), LOOM_OK);
    f->now += STEP_US;
}

static const loom__sched_plan *run_step(fx *f) {
    plan_step(f);
    done_step(f, NULL, 0);
    return &f->plan;
}

static const loom__sched_entry *entry_of(const loom__sched_plan *p, uint64_t id) {
    for (int32_t i = 0; i < p->n_entries; i++)
        if (p->entries[i].id == id) return &p->entries[i];
    return NULL;
}

static bool was_preempted(const loom__sched_plan *p, uint64_t id) {
    for (int32_t i = 0; i < p->n_preempted; i++)
        if (p->preempted[i] == id) return true;
    return false;
}

static loom__sched_request_view view_of(fx *f, uint64_t id) {
    loom__sched_request_view v;
    assert_int_equal(loom__sched_get(f->s, id, &v), LOOM_OK);
    return v;
}

/* Runs steps with max_seqs = 1 until every id in `ids` has finished; checks the admission
 * order equals `ids` (each request has max_new_tokens = 1, so it finishes in its first step
 * if its prompt fits the budget). */
static void expect_service_order(fx *f, const uint64_t *ids, int n) {
    for (int i = 0; i < n; i++) {
        const loom__sched_plan *p = run_step(f);
        assert_int_equal(p->n_entries, 1);
        assert_int_equal(p->entries[0].id, ids[i]);
        assert_false(known(f, ids[i]));
    }
}
