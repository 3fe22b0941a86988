/* test_sched.c — the scheduler's policy, one behaviour per test, against the fake KV manager in
 * sched_fake.h: token budget and chunked prefill, decodes first, priority / deadline / arrival
 * order, preemption victims and resumption, promotion, the admission watermark, rejection,
 * cancellation in every state, FCFS, prefix-cache starts, the TPOT-aware budget, and bad input.
 * The randomized simulation lives in test_sched_sim.c. */
#include "sched/sched_fixture.h"

/* ------------------------------------------------------------------------------------------ */
/* Budget, chunked prefill, decodes first                                                     */
/* ------------------------------------------------------------------------------------------ */

static void test_chunked_prefill(void **state) {
    (void)state;
    fx f;
    fx_open(&f, small_cfg(), 1000, 16);
    add_req(&f, 1, 0, 100, 3);
    static const int32_t chunks[] = {32, 32, 32, 4};
    for (int i = 0; i < 4; i++) {
        const loom__sched_plan *p = run_step(&f);
        assert_int_equal(p->n_entries, 1);
        assert_int_equal(p->entries[0].pos_start, 32 * i);
        assert_int_equal(p->entries[0].n_tokens, chunks[i]);
        assert_true(p->entries[0].is_prefill);
        assert_int_equal(p->entries[0].admitted, i == 0);
        assert_int_equal(p->entries[0].sample, i == 3); /* only the last chunk samples */
    }
    assert_int_equal(view_of(&f, 1).n_generated, 1);
    for (int i = 0; i < 2; i++) {
        const loom__sched_plan *p = run_step(&f);
        assert_int_equal(p->n_decode, 1);
        assert_int_equal(p->entries[0].pos_start, 100 + i);
        assert_false(p->entries[0].is_prefill);
    }
    assert_false(known(&f, 1)); /* max_new_tokens reached */
    loom__sched_stats st;
    loom__sched_get_stats(f.s, &st);
    assert_int_equal(st.n_prefill_tokens, 100);
    assert_int_equal(st.n_decode_tokens, 2);
    assert_int_equal(st.n_finished, 1);
    fx_close(&f);
}

static void test_decodes_continue_during_prefill(void **state) {
    (void)state;
    fx f;
    fx_open(&f, small_cfg(), 1000, 16);
    add_req(&f, 1, 0, 4, 100);
    add_req(&f, 2, 0, 4, 100);
    run_step(&f);
    add_req(&f, 3, 9, 200, 100); /* a long, important prompt must not stall the decodes */
    int32_t done = 0;
    for (int step = 0; done < 200; step++) {
        const loom__sched_plan *p = run_step(&f);
        assert_int_equal(p->n_decode, 2);
        assert_true(!p->entries[0].is_prefill && !p->entries[1].is_prefill);
        const loom__sched_entry *e = entry_of(p, 3);
        assert_non_null(e);
        assert_int_equal(e->pos_start, done);
        assert_int_equal(e->n_tokens, 200 - done < 30 ? 200 - done : 30);
        assert_true(p->n_tokens <= 32);
        done += e->n_tokens;
        assert_true(step < 7);
    }
    assert_int_equal(view_of(&f, 3).n_generated, 1);
    fx_close(&f);
}

static void test_chunk_cap(void **state) {
    (void)state;
    loom__sched_config c = small_cfg();
    c.max_prefill_chunk = 8;
    fx f;
    fx_open(&f, c, 1000, 16);
    add_req(&f, 1, 0, 20, 5);
    add_req(&f, 2, 0, 20, 5);
    const loom__sched_plan *p = run_step(&f);
    assert_int_equal(p->n_entries, 2);
    assert_int_equal(p->entries[0].n_tokens, 8);
    assert_int_equal(p->entries[1].n_tokens, 8);
    p = run_step(&f);
    assert_int_equal(p->entries[0].pos_start, 8);
    p = run_step(&f);
    assert_int_equal(p->entries[0].n_tokens, 4);
    assert_true(p->entries[0].sample);
    fx_close(&f);
}

/* ------------------------------------------------------------------------------------------ */
/* Order: priority, deadline, arrival; running requests in the same order                     */
/* ------------------------------------------------------------------------------------------ */

static void test_priority_order(void **state) {
    (void)state;
    loom__sched_config c = small_cfg();
    c.max_seqs = 1;
    fx f;
    fx_open(&f, c, 1000, 16);
    add_req(&f, 1, 0, 4, 1);
    add_req(&f, 2, 5, 4, 1);
    add_req(&f, 3, 1, 4, 1);
    /* Priority beats a deadline. */
    add_info(&f, (loom__sched_request_info){.id = 4,
                                            .priority = 0,
                                            .n_prompt = 4,
                                            .max_new_tokens = 1,
                                            .arrival_us = f.now,
                                            .ttft_us = 1});
    static const uint64_t order[] = {2, 3, 4, 1};
    expect_service_order(&f, order, 4);
    fx_close(&f);
}

static void test_deadline_order(void **state) {
    (void)state;
    loom__sched_config c = small_cfg();
    c.max_seqs = 1;
    fx f;
    fx_open(&f, c, 1000, 16);
    f.now = 100;
    add_req(&f, 1, 0, 4, 1); /* no deadline: last */
    add_info(&f,
             (loom__sched_request_info){
                 .id = 2, .n_prompt = 4, .max_new_tokens = 1, .arrival_us = 0, .ttft_us = 500000});
    add_info(&f,
             (loom__sched_request_info){
                 .id = 3, .n_prompt = 4, .max_new_tokens = 1, .arrival_us = 0, .ttft_us = 100000});
    /* Arrived later but due earlier (TTFT is relative to arrival). */
    add_info(&f,
             (loom__sched_request_info){
                 .id = 4, .n_prompt = 4, .max_new_tokens = 1, .arrival_us = 50, .ttft_us = 60000});
    static const uint64_t order[] = {4, 3, 2, 1};
    expect_service_order(&f, order, 4);
    loom__sched_stats st;
    loom__sched_get_stats(f.s, &st);
    assert_int_equal(st.n_ttft_met, 3);
    assert_int_equal(st.n_ttft_missed, 0);
    fx_close(&f);
}

static void test_arrival_order(void **state) {
    (void)state;
    loom__sched_config c = small_cfg();
    c.max_seqs = 1;
    fx f;
    fx_open(&f, c, 1000, 16);
    f.now = 100;
    static const int64_t arrival[] = {30, 10, 20};
    for (int i = 0; i < 3; i++)
        add_info(&f, (loom__sched_request_info){.id = (uint64_t)i + 1,
                                                .n_prompt = 4,
                                                .max_new_tokens = 1,
                                                .arrival_us = arrival[i]});
    static const uint64_t order[] = {2, 3, 1};
    expect_service_order(&f, order, 3);
    fx_close(&f);
}

/* The budget goes to running prefills in order of importance: the least important absorbs
 * the shortfall. */
static void test_running_order(void **state) {
    (void)state;
    loom__sched_config c = small_cfg();
    c.max_batched_tokens = 24;
    c.max_prefill_chunk = 8;
    fx f;
    fx_open(&f, c, 1000, 16);
    add_req(&f, 9, 0, 1, 100);
    run_step(&f);
    add_req(&f, 1, 0, 50, 1);
    add_info(
        &f,
        (loom__sched_request_info){
            .id = 2, .n_prompt = 50, .max_new_tokens = 1, .arrival_us = f.now, .ttft_us = 100000});
    add_req(&f, 3, 1, 50, 1);
    for (int step = 0; step < 2; step++) {
        const loom__sched_plan *p = run_step(&f);
        assert_int_equal(p->n_entries, 4);
        assert_int_equal(p->entries[0].id, 9); /* the decode */
        assert_int_equal(p->entries[1].id, 3);
        assert_int_equal(p->entries[2].id, 2);
        assert_int_equal(p->entries[3].id, 1);
        assert_int_equal(p->entries[3].n_tokens, 7);
        assert_int_equal(p->entries[3].admitted, step == 0);
    }
    fx_close(&f);
}

/* ------------------------------------------------------------------------------------------ */
/* Preemption                                                                                 */
/* ------------------------------------------------------------------------------------------ */

/* Three 7-token prompts fill 6 blocks of 4; the third decode (position 8) needs new blocks. */
static void fill_for_preemption(fx *f, loom__sched_preempt_mode mode) {
    loom__sched_config c = small_cfg();
    c.preempt_mode = mode;
    fx_open(f, c, 6, 4);
    add_req(f, 1, 1, 7, 100);
    f->now += 1;
    add_req(f, 2, 0, 7, 100);
    f->now += 1;
    add_req(f, 3, 0, 7, 100);
    assert_int_equal(run_step(f)->n_entries, 3); /* prefill */
    assert_int_equal(run_step(f)->n_decode, 3);  /* position 7: no new block */
    assert_int_equal(f->kv.used, 6);
}

static void test_preempt_victim_and_resume_recompute(void **state) {
    (void)state;
    fx f;
    fill_for_preemption(&f, LOOM_SCHED_PREEMPT_RECOMPUTE);
    const loom__sched_plan *p = plan_step(&f);
    /* 1 needs a block: the victim is the lowest priority, latest arrival: 3. Then 2 takes the
     * block 3 left over. */
    assert_int_equal(p->n_preempted, 1);
    assert_int_equal(p->preempted[0], 3);
    assert_int_equal(p->preempt_mode, LOOM_SCHED_PREEMPT_RECOMPUTE);
    assert_int_equal(p->n_decode, 2);
    assert_null(entry_of(p, 3));
    done_step(&f, NULL, 0);
    loom__sched_request_view v = view_of(&f, 3);
    assert_int_equal(v.state, LOOM_SCHED_STATE_PREEMPTED);
    assert_int_equal(v.n_generated, 2); /* produced tokens are kept */
    assert_int_equal(v.n_computed, 0);
    /* Once 1 and 2 finish, 3 re-prefills prompt + generated tokens and samples its 3rd. */
    static const uint64_t fin[] = {1, 2};
    plan_step(&f);
    done_step(&f, fin, 2);
    p = run_step(&f);
    const loom__sched_entry *e = entry_of(p, 3);
    assert_non_null(e);
    assert_true(e->admitted && e->is_prefill && e->sample && !e->swap_in);
    assert_int_equal(e->pos_start, 0);
    assert_int_equal(e->n_tokens, 9);
    v = view_of(&f, 3);
    assert_int_equal(v.state, LOOM_SCHED_STATE_RUNNING);
    assert_int_equal(v.n_generated, 3);
    assert_int_equal(v.n_computed, 9);
    loom__sched_stats st;
    loom__sched_get_stats(f.s, &st);
    assert_int_equal(st.n_preemptions, 1);
    fx_close(&f);
}

static void test_preempt_swap_resume(void **state) {
    (void)state;
    fx f;
    fill_for_preemption(&f, LOOM_SCHED_PREEMPT_SWAP);
    const loom__sched_plan *p = plan_step(&f);
    assert_int_equal(p->n_preempted, 1);
    assert_int_equal(p->preempted[0], 3);
    assert_int_equal(f.kv.seqs[3].swapped, 2);
    done_step(&f, NULL, 0);
    loom__sched_request_view v = view_of(&f, 3);
    assert_true(v.swapped);
    assert_int_equal(v.n_computed, 8);
    assert_int_equal(v.n_generated, 2);
    static const uint64_t fin[] = {1, 2};
    plan_step(&f);
    done_step(&f, fin, 2);
    p = run_step(&f);
    const loom__sched_entry *e = entry_of(p, 3);
    assert_non_null(e);
    assert_true(e->admitted && e->swap_in && !e->is_prefill && e->sample);
    assert_int_equal(e->pos_start, 8);
    assert_int_equal(e->n_tokens, 1);
    v = view_of(&f, 3);
    assert_false(v.swapped);
    assert_int_equal(v.n_generated, 3);
    fx_close(&f);
}

/* Blocks planned for one entry are gone for the next: with one free block, the second decode
 * that needs one must preempt (the fake engine fails the test if a plan overcommits). */
static void test_blocks_accounted_within_step(void **state) {
    (void)state;
    fx f;
    fx_open(&f, small_cfg(), 7, 4);
    for (uint64_t id = 1; id <= 3; id++) {
        add_req(&f, id, 0, 7, 100);
        f.now += 1;
    }
    run_step(&f);
    run_step(&f);
    assert_int_equal(f.kv.used, 6);
    const loom__sched_plan *p = plan_step(&f);
    assert_int_equal(p->n_decode, 2);
    assert_int_equal(p->n_preempted, 1);
    assert_int_equal(p->preempted[0], 3);
    assert_int_equal(f.kv.used, 6); /* 2 + 1 for each of 1 and 2 */
    done_step(&f, NULL, 0);
    fx_close(&f);
}

static void test_never_preempt_for_lower(void **state) {
    (void)state;
    loom__sched_config c = small_cfg();
    c.max_seqs = 2;
    fx f;
    fx_open(&f, c, 4, 4);
    add_req(&f, 1, 5, 5, 100); /* decodes positions 5..7 without a new block */
    add_req(&f, 2, 0, 7, 100); /* position 8 (third step) needs one */
    run_step(&f);
    run_step(&f);
    const loom__sched_plan *p = run_step(&f);
    assert_int_equal(p->n_preempted, 0); /* 2 is stuck rather than preempting 1 */
    assert_int_equal(p->n_entries, 1);
    assert_int_equal(p->entries[0].id, 1);
    assert_int_equal(view_of(&f, 2).state, LOOM_SCHED_STATE_RUNNING);
    fx_close(&f);

    /* Waiting requests of equal or lower priority never preempt; higher ones do. */
    c.max_seqs = 1;
    fx_open(&f, c, 1000, 16);
    add_req(&f, 1, 3, 4, 100);
    run_step(&f);
    add_req(&f, 2, 3, 4, 100);
    add_req(&f, 3, 1, 4, 100);
    for (int i = 0; i < 3; i++) {
        p = run_step(&f);
        assert_int_equal(p->n_preempted, 0);
        assert_int_equal(p->entries[0].id, 1);
    }
    add_req(&f, 4, 7, 4, 100);
    p = run_step(&f);
    assert_int_equal(p->n_preempted, 1);
    assert_int_equal(p->preempted[0], 1);
    assert_int_equal(p->entries[0].id, 4);
    assert_int_equal(view_of(&f, 1).n_generated, 4);
    fx_close(&f);
}

/* ------------------------------------------------------------------------------------------ */
/* Promotion, watermark, rejection                                                            */
/* ------------------------------------------------------------------------------------------ */

static void run_promotion(bool promote) {
    loom__sched_config c = small_cfg();
    c.max_seqs = 1;
    c.promote_age_us = promote ? 10 * STEP_US : 0;
    fx f;
    fx_open(&f, c, 1000, 16);
    add_req(&f, 1, 0, 4, 1);
    add_req(&f, 2, 9, 4, 1000); /* holds the only slot */
    int served_at = -1;
    for (int step = 0; step < 30 && served_at < 0; step++) {
        add_req(&f, 10 + (uint64_t)step, 9, 4, 1); /* and a stream of important requests */
        const loom__sched_plan *p = run_step(&f);
        if (entry_of(p, 1)) {
            served_at = step;
            assert_true(was_preempted(p, 2)); /* promoted ranks above every priority */
        } else if (promote && step >= 10) {
            fail_msg("not served after promotion");
        }
    }
    if (!promote) {
        assert_int_equal(served_at, -1);
        assert_false(view_of(&f, 1).promoted);
    } else {
        assert_int_equal(served_at, 10); /* waited 10 steps at the start of step 10 */
        loom__sched_stats st;
        loom__sched_get_stats(f.s, &st);
        assert_true(st.n_promotions >= 1);
    }
    fx_close(&f);
}

static void test_promotion(void **state) {
    (void)state;
    run_promotion(false);
    run_promotion(true);
}

static void test_promoted_view(void **state) {
    (void)state;
    loom__sched_config c = small_cfg();
    c.max_seqs = 1;
    c.promote_age_us = 5 * STEP_US;
    fx f;
    fx_open(&f, c, 1000, 16);
    add_req(&f, 1, 9, 4, 1000);
    add_req(&f, 2, -3, 4, 1000);
    for (int i = 0; i < 5; i++) run_step(&f);
    assert_false(view_of(&f, 2).promoted);
    run_step(&f);
    loom__sched_request_view v = view_of(&f, 2);
    assert_true(v.promoted);
    assert_true(v.effective_priority == LOOM_SCHED_PROMOTED_PRIORITY);
    assert_int_equal(v.state, LOOM_SCHED_STATE_RUNNING);
    /* Sticky: 1 (preempted, not yet promoted) cannot take the slot back. */
    for (int i = 0; i < 3; i++) assert_int_equal(run_step(&f)->entries[0].id, 2);
    fx_close(&f);
}

static void test_watermark(void **state) {
    (void)state;
    loom__sched_config c = small_cfg();
    c.watermark_blocks = 3;
    fx f;
    fx_open(&f, c, 10, 4);
    add_req(&f, 1, 0, 16, 100); /* 4 blocks: alone, so the watermark is waived */
    assert_non_null(entry_of(run_step(&f), 1));
    add_req(&f, 2, 0, 16, 100); /* 4 + watermark 3 > 6 free */
    add_req(&f, 3, 0, 4, 100);  /* would fit, but does not overtake 2 */
    for (int i = 0; i < 3; i++) assert_int_equal(run_step(&f)->n_entries, 1);
    loom__sched_stats st;
    loom__sched_get_stats(f.s, &st);
    assert_int_equal(st.n_waiting, 2);
    static const uint64_t fin[] = {1};
    plan_step(&f);
    done_step(&f, fin, 1);
    const loom__sched_plan *p = run_step(&f);
    assert_non_null(entry_of(p, 2)); /* alone now: admitted */
    assert_non_null(entry_of(p, 3)); /* 1 block + 3 watermark <= 6 free */
    fx_close(&f);
}

/* Admission counts the blocks a running prefill will still need, so a newcomer cannot take
 * them and force a preemption halfway through the prompt. */
static void test_prefill_promise(void **state) {
    (void)state;
    loom__sched_config c = small_cfg();
    c.max_prefill_chunk = 4;
    fx f;
    fx_open(&f, c, 10, 4);
    add_req(&f, 1, 0, 24, 100); /* 6 blocks, 4 tokens a step */
    add_req(&f, 2, 0, 20, 100); /* 5 blocks: fits the 9 free, not beside 1's remaining 5 */
    for (int i = 0; i < 6; i++) {
        const loom__sched_plan *p = run_step(&f);
        assert_int_equal(p->n_entries, 1);
        assert_int_equal(p->entries[0].id, 1);
        assert_int_equal(p->entries[0].pos_start, 4 * i);
        assert_int_equal(p->n_preempted, 0);
    }
    assert_int_equal(view_of(&f, 2).state, LOOM_SCHED_STATE_WAITING);
    fx_close(&f);
}

static void test_reject_too_big(void **state) {
    (void)state;
    fx f;
    fx_open(&f, small_cfg(), 4, 4);
    add_req(&f, 1, 0, 17, 10); /* 5 blocks of 4 > 4 */
    add_req(&f, 2, 0, 15, 10); /* fits; then outgrows the cache at position 16 */
    const loom__sched_plan *p = run_step(&f);
    assert_int_equal(p->n_rejected, 1);
    assert_int_equal(p->rejected[0], 1);
    assert_non_null(entry_of(p, 2));
    assert_false(known(&f, 1));
    assert_int_equal(run_step(&f)->n_decode, 1); /* position 15 */
    p = run_step(&f);
    assert_int_equal(p->n_entries, 0);
    assert_int_equal(p->n_rejected, 1);
    assert_int_equal(p->rejected[0], 2);
    assert_int_equal(f.kv.used, 0);
    loom__sched_stats st;
    loom__sched_get_stats(f.s, &st);
    assert_int_equal(st.n_rejected, 2);
    fx_close(&f);
}

/* ------------------------------------------------------------------------------------------ */
/* Cancellation                                                                               */
/* ------------------------------------------------------------------------------------------ */

/* Cancels id, checks what it held and that it left no trace: unknown, in no later plan, and
 * its id free to reuse. */
static void cancel_and_check(fx *f, uint64_t id, loom__sched_holds expect) {
    loom__sched_holds h;
    assert_int_equal(loom__sched_cancel(f->s, id, &h), LOOM_OK);
    assert_int_equal(h, expect);
    fake_release(&f->kv, id);
    assert_false(known(f, id));
    assert_int_equal(loom__sched_validate(f->s), LOOM_OK);
    assert_int_equal(loom__sched_cancel(f->s, id, NULL), LOOM_ERR_INVALID_ARG);
}

static void expect_gone(fx *f, uint64_t id) {
    for (int i = 0; i < 3; i++) {
        const loom__sched_plan *p = run_step(f);
        assert_null(entry_of(p, id));
        assert_false(was_preempted(p, id));
    }
    add_req(f, id, 0, 4, 1); /* the id is free again */
    assert_non_null(entry_of(run_step(f), id));
}

static void test_cancel_waiting_and_running(void **state) {
    (void)state;
    fx f;
    fx_open(&f, small_cfg(), 1000, 16);
    add_req(&f, 1, 0, 4, 100);
    cancel_and_check(&f, 1, LOOM_SCHED_HOLDS_NOTHING);
    expect_gone(&f, 1);

    add_req(&f, 2, 0, 100, 100); /* mid-prefill, cancelled between steps */
    run_step(&f);
    cancel_and_check(&f, 2, LOOM_SCHED_HOLDS_KV);
    expect_gone(&f, 2);

    add_req(&f, 3, 0, 4, 100); /* mid-decode */
    run_step(&f);
    run_step(&f);
    cancel_and_check(&f, 3, LOOM_SCHED_HOLDS_KV);
    expect_gone(&f, 3);

    /* Mid-plan: after schedule, before on_step_done; its result is ignored, even once its id
     * is reused by a new request. */
    add_req(&f, 4, 0, 20, 100);
    add_req(&f, 5, 0, 4, 100);
    plan_step(&f);
    assert_non_null(entry_of(&f.plan, 4));
    cancel_and_check(&f, 4, LOOM_SCHED_HOLDS_KV);
    add_req(&f, 4, 0, 8, 100);
    loom__sched_result res[2] = {{4, 0, false}, {5, 1, false}};
    assert_int_equal(loom__sched_on_step_done(f.s, res, 2, f.now), LOOM_OK);
    assert_int_equal(view_of(&f, 5).n_generated, 1);
    assert_int_equal(view_of(&f, 4).state, LOOM_SCHED_STATE_WAITING);
    assert_int_equal(view_of(&f, 4).n_computed, 0);
    f.now += STEP_US;
    cancel_and_check(&f, 4, LOOM_SCHED_HOLDS_NOTHING);
    expect_gone(&f, 4);

    loom__sched_stats st;
    loom__sched_get_stats(f.s, &st);
    assert_int_equal(st.n_cancelled, 5);
    fx_close(&f);
}

static void test_cancel_preempted(void **state) {
    (void)state;
    for (int mode = 0; mode < 2; mode++) {
        fx f;
        fill_for_preemption(&f, (loom__sched_preempt_mode)mode);
        plan_step(&f);
        assert_true(was_preempted(&f.plan, 3));
        done_step(&f, NULL, 0);
        assert_int_equal(view_of(&f, 3).state, LOOM_SCHED_STATE_PREEMPTED);
        cancel_and_check(&f, 3,
                         mode == LOOM_SCHED_PREEMPT_SWAP ? LOOM_SCHED_HOLDS_SWAP
                                                         : LOOM_SCHED_HOLDS_NOTHING);
        static const uint64_t fin[] = {1, 2};
        plan_step(&f);
        done_step(&f, fin, 2);
        assert_int_equal(f.kv.used, 0);
        expect_gone(&f, 3);
        fx_close(&f);
    }
}

/* ------------------------------------------------------------------------------------------ */
/* FCFS, prefix-cache starts, the TPOT-aware budget                                           */
/* ------------------------------------------------------------------------------------------ */

static void test_fcfs(void **state) {
    (void)state;
    loom__sched_config c = small_cfg();
    c.max_seqs = 1;
    c.policy = LOOM_SCHED_POLICY_FCFS;
    c.promote_age_us = 1; /* ignored */
    fx f;
    fx_open(&f, c, 1000, 16);
    f.now = 10;
    add_info(&f, (loom__sched_request_info){
                     .id = 1, .priority = 0, .n_prompt = 4, .max_new_tokens = 1, .arrival_us = 1});
    add_info(&f, (loom__sched_request_info){
                     .id = 2, .priority = 9, .n_prompt = 4, .max_new_tokens = 1, .arrival_us = 2});
    add_info(&f, (loom__sched_request_info){.id = 3,
                                            .priority = 5,
                                            .n_prompt = 4,
                                            .max_new_tokens = 1,
                                            .arrival_us = 3,
                                            .ttft_us = 1});
    static const uint64_t order[] = {1, 2, 3};
    expect_service_order(&f, order, 3);
    add_req(&f, 4, 0, 4, 100);
    run_step(&f);
    add_req(&f, 5, 99, 4, 1); /* no preemption in favour of a priority */
    const loom__sched_plan *p = run_step(&f);
    assert_int_equal(p->n_preempted, 0);
    assert_int_equal(p->entries[0].id, 4);
    fx_close(&f);
}

static void test_cached_prefix(void **state) {
    (void)state;
    fx f;
    fx_open(&f, small_cfg(), 1000, 4);
    f.kv.seqs[1].cached = 8;
    f.kv.seqs[2].cached = 20; /* the whole prompt: one token is still computed */
    add_req(&f, 1, 0, 20, 5);
    add_req(&f, 2, 0, 20, 5);
    const loom__sched_plan *p = run_step(&f);
    assert_int_equal(entry_of(p, 1)->pos_start, 8);
    assert_int_equal(entry_of(p, 1)->n_tokens, 12);
    assert_int_equal(entry_of(p, 2)->pos_start, 19);
    assert_int_equal(entry_of(p, 2)->n_tokens, 1);
    assert_true(entry_of(p, 2)->sample && entry_of(p, 2)->is_prefill);
    assert_int_equal(view_of(&f, 1).n_computed, 20);
    fx_close(&f);
}

static void test_tpot_budget(void **state) {
    (void)state;
    loom__sched_config c = small_cfg();
    c.max_batched_tokens = 4096;
    c.step_base_us = 1000;
    c.step_per_token_us = 10;
    fx f;
    fx_open(&f, c, 100000, 16);
    add_info(&f,
             (loom__sched_request_info){
                 .id = 1, .n_prompt = 1, .max_new_tokens = 1000, .arrival_us = 0, .tpot_us = 3000});
    run_step(&f); /* first token at t = 0 */
    add_req(&f, 2, 0, 10000, 10);
    /* t = 1000; token 2 due at 3000: 2000 us of slack = 1000 base + 100 tokens. */
    const loom__sched_plan *p = run_step(&f);
    assert_int_equal(p->n_tokens, 100);
    assert_int_equal(entry_of(p, 2)->n_tokens, 99);
    /* A decode already too late to save does not throttle prefills. */
    f.now += 100 * STEP_US;
    p = run_step(&f);
    assert_int_equal(p->n_tokens, 4096);
    fx_close(&f);
}

/* The longest TPOT deadline (1e9 s) over many tokens: the due time of a late token saturates
 * instead of overflowing (1e15 us x 10,000 tokens > INT64_MAX: undefined behaviour, which UBSan
 * reported before the bookkeeping saturated as the planner does). */
static void test_tpot_huge_deadline(void **state) {
    (void)state;
    loom__sched_config c = small_cfg();
    fx f;
    fx_open(&f, c, 100000, 16);
    add_info(&f, (loom__sched_request_info){.id = 1,
                                            .n_prompt = 1,
                                            .max_new_tokens = 12000,
                                            .arrival_us = 0,
                                            .tpot_us = 1000000000000000ll});
    for (int k = 0; k < 10000; k++) run_step(&f);
    loom__sched_stats st;
    loom__sched_get_stats(f.s, &st);
    assert_true(st.n_tpot_met >= 9999);
    assert_int_equal(st.n_tpot_missed, 0);
    fx_close(&f);
}

/* ------------------------------------------------------------------------------------------ */
/* Bad input                                                                                  */
/* ------------------------------------------------------------------------------------------ */

/* ------------------------------------------------------------------------------------------ */
/* Overload: deadlines still reachable first, bounded promotion, no thrashing, deferral        */
/* ------------------------------------------------------------------------------------------ */

/* Within a priority, a request that can still meet its deadline goes before one that has
 * missed its own (earliest-deadline-first would serve the overdue one and make both late),
 * and a missed one before one that never had a deadline. */
static void test_reachable_before_missed(void **state) {
    (void)state;
    loom__sched_config c = small_cfg();
    c.max_seqs = 1;
    fx f;
    fx_open(&f, c, 1000, 16);
    f.now = 10 * STEP_US;
    add_req(&f, 1, 0, 4, 1);                         /* no deadline */
    add_info(&f, (loom__sched_request_info){.id = 2, /* due at 5 ms: missed already */
                                            .n_prompt = 4,
                                            .max_new_tokens = 1,
                                            .arrival_us = 0,
                                            .ttft_us = 5 * STEP_US});
    add_info(&f, (loom__sched_request_info){.id = 3, /* due at 1 s */
                                            .n_prompt = 4,
                                            .max_new_tokens = 1,
                                            .arrival_us = f.now,
                                            .ttft_us = 1000 * STEP_US});
    add_info(&f, (loom__sched_request_info){.id = 4, /* due at 3 ms: missed, before 2 */
                                            .n_prompt = 4,
                                            .max_new_tokens = 1,
                                            .arrival_us = 0,
                                            .ttft_us = 3 * STEP_US});
    /* The reachable one, then the missed ones by due time, then the one without a deadline. */
    static const uint64_t want[] = {3, 4, 2, 1};
    expect_service_order(&f, want, 4);
    loom__sched_stats st;
    loom__sched_get_stats(f.s, &st);
    assert_int_equal(st.n_ttft_met, 1);
    assert_int_equal(st.n_ttft_missed, 2);
    fx_close(&f);
}

/* A promoted best-effort request outranks other best-effort work but not a class with
 * deadlines: with a stream of high-priority requests that carry deadlines it waits; once the
 * stream stops it runs before the best-effort requests that arrived after it. */
static void test_promotion_bounded_by_deadlines(void **state) {
    (void)state;
    loom__sched_config c = small_cfg();
    c.max_seqs = 1;
    c.promote_age_us = 5 * STEP_US;
    fx f;
    fx_open(&f, c, 1000, 16);
    add_req(&f, 1, 0, 4, 1); /* best-effort: promoted after 5 steps */
    uint64_t next = 20;
    for (int step = 0; step < 12; step++) {
        add_info(&f, (loom__sched_request_info){.id = next++,
                                                .priority = 1,
                                                .n_prompt = 4,
                                                .max_new_tokens = 1,
                                                .arrival_us = f.now,
                                                .ttft_us = 1000 * STEP_US});
        const loom__sched_plan *p = run_step(&f);
        assert_int_equal(p->n_entries, 1);
        assert_int_equal(p->entries[0].id, next - 1); /* the high one, every step */
    }
    assert_true(view_of(&f, 1).promoted);
    add_req(&f, 2, 0, 4, 1); /* a later best-effort request */
    add_req(&f, 3, 5, 4, 1); /* and a more important one without a deadline */
    /* Promotion lifts 1 above every priority below the lowest with a deadline (none is left
     * waiting, so: above everything), FIFO before 3's priority 5. */
    static const uint64_t want[] = {1, 3, 2};
    expect_service_order(&f, want, 3);
    fx_close(&f);
}

/* A request preempted twice is no victim again for protect_us after its admission. Two
 * requests share 3 blocks of 4 positions; the one of lower priority is preempted each time the
 * other needs its block, until it has been preempted twice: then it keeps its blocks and the
 * more important one waits (stuck) rather than preempt it a third time. */
static void test_protect_after_two_preemptions(void **state) {
    (void)state;
    loom__sched_config c = small_cfg();
    c.max_seqs = 2;
    c.protect_us = 1000 * STEP_US;
    fx f;
    fx_open(&f, c, 4, 4);
    int max_preempted = 0;
    for (int round = 0; round < 3; round++) {
        /* A waiting request of strictly higher priority preempts 1 to get a slot (max_seqs 2
         * with a filler of priority 9 holding the other slot). */
        if (round == 0) {
            add_req(&f, 9, 9, 1, 1000);
            add_req(&f, 1, 0, 1, 1000);
            run_step(&f);
            run_step(&f);
        }
        add_req(&f, 10 + (uint64_t)round, 5, 1, 2);
        const loom__sched_plan *p = run_step(&f);
        int n = was_preempted(p, 1) ? 1 : 0;
        if (round < 2) {
            assert_int_equal(n, 1);
        } else {
            assert_int_equal(n, 0); /* protected: preempted twice already */
            assert_null(entry_of(p, 12));
        }
        max_preempted += n;
        /* Let the high one finish and 1 come back. */
        for (int k = 0; k < 3 && known(&f, 10 + (uint64_t)round) && round < 2; k++) run_step(&f);
        for (int k = 0; k < 3 && view_of(&f, 1).state != LOOM_SCHED_STATE_RUNNING; k++)
            run_step(&f);
    }
    assert_int_equal(max_preempted, 2);
    fx_close(&f);
}

/* Deferral: with a step-cost model, a high-priority prompt that would miss its TTFT deadline
 * with every best-effort decode in each step, but makes it without them, runs alone; the
 * decodes wait (keeping their KV), and resume as soon as it can make it with them. */
static void test_defer_decodes_for_urgent_prompt(void **state) {
    (void)state;
    loom__sched_config c = small_cfg();
    c.max_seqs = 8;
    c.max_batched_tokens = 16;
    fx f;
    fx_open(&f, c, 1000, 16);
    loom__cost_model cm;
    loom__cost_model_init(&cm, 100);
    loom__cost_model_set(&cm, 1000, 100, 0); /* 1 ms + 0.1 ms per token */
    loom__sched_set_cost(f.s, &cm);
    for (uint64_t id = 1; id <= 6; id++) add_req(&f, id, 0, 2, 1000);
    run_step(&f); /* prefills */
    run_step(&f); /* six decodes */
    assert_int_equal(f.plan.n_decode, 6);
    /* 40 tokens to compute within 4.5 ms: at 10 tokens a step (6 decodes) 4 steps of 2.6 ms
     * = 10.4 ms, too late; at 16 a step, 3 steps of 2.6 ms = 7.8 ms, also too late: no
     * deferral. With 9 ms: deferring saves it. */
    add_info(&f, (loom__sched_request_info){.id = 20,
                                            .priority = 1,
                                            .n_prompt = 40,
                                            .max_new_tokens = 2,
                                            .arrival_us = f.now,
                                            .ttft_us = 4500});
    const loom__sched_plan *p = run_step(&f);
    assert_int_equal(p->n_decode, 6); /* hopeless either way: decodes keep running */
    loom__sched_holds h;
    assert_int_equal(loom__sched_cancel(f.s, 20, &h), LOOM_OK);
    fake_release(&f.kv, 20);
    add_info(&f, (loom__sched_request_info){.id = 21,
                                            .priority = 1,
                                            .n_prompt = 40,
                                            .max_new_tokens = 2,
                                            .arrival_us = f.now,
                                            .ttft_us = 9000});
    /* First step: 16 tokens, no decode (40 left at 10 a step would take 10.4 ms > 9 ms). */
    p = run_step(&f);
    assert_int_equal(p->n_decode, 0);
    assert_int_equal(entry_of(p, 21)->n_tokens, 16);
    /* Then 24 left with the decodes: 3 steps of 2.6 ms = 7.8 ms, within the 8 ms left: the
     * decodes resume at once (deferral lasts only while it is what saves the deadline). */
    p = run_step(&f);
    assert_int_equal(p->n_decode, 6);
    assert_int_equal(entry_of(p, 21)->n_tokens, 10);
    while (view_of(&f, 21).n_generated == 0) run_step(&f);
    loom__sched_stats st;
    loom__sched_get_stats(f.s, &st);
    assert_int_equal(st.n_deferred, 6);
    assert_int_equal(st.n_ttft_met, 1);
    fx_close(&f);
}

static void test_bad_config(void **state) {
    (void)state;
    fake_kv kv;
    fake_kv_init(&kv, 10, 4, 10);
    loom__sched_kv_iface it = fake_iface(&kv);
    loom__sched *s = NULL;
    loom__sched_config c = small_cfg();
    assert_int_equal(loom__sched_create(NULL, &it, &s), LOOM_ERR_INVALID_ARG);
    assert_int_equal(loom__sched_create(&c, NULL, &s), LOOM_ERR_INVALID_ARG);
    assert_int_equal(loom__sched_create(&c, &it, NULL), LOOM_ERR_INVALID_ARG);
    loom__sched_config bad[7];
    for (int i = 0; i < 7; i++) bad[i] = c;
    bad[0].max_batched_tokens = 0; /* zero budget */
    bad[1].max_seqs = 0;
    bad[2].max_batched_tokens = c.max_seqs - 1;
    bad[3].watermark_blocks = -1;
    bad[4].policy = (loom__sched_policy)7;
    bad[5].preempt_mode = (loom__sched_preempt_mode)7;
    bad[6].promote_age_us = -1;
    for (int i = 0; i < 7; i++) {
        assert_int_equal(loom__sched_create(&bad[i], &it, &s), LOOM_ERR_INVALID_ARG);
        assert_null(s);
    }
    it.blocks_needed = NULL;
    assert_int_equal(loom__sched_create(&c, &it, &s), LOOM_ERR_INVALID_ARG);
    assert_null(s);
    loom__sched_destroy(NULL);
    fake_kv_free(&kv);
}

static void test_bad_input(void **state) {
    (void)state;
    fx f;
    fx_open(&f, small_cfg(), 1000, 16);
    f.now = 1000;
    add_req(&f, 1, 0, 4, 10);
    loom__sched_request_info dup = {
        .id = 1, .n_prompt = 4, .max_new_tokens = 1, .arrival_us = f.now};
    assert_int_equal(loom__sched_add(f.s, &dup, f.now), LOOM_ERR_INVALID_ARG);
    loom__sched_request_info bad = dup;
    bad.id = 2;
    bad.n_prompt = 0;
    assert_int_equal(loom__sched_add(f.s, &bad, f.now), LOOM_ERR_INVALID_ARG);
    bad.n_prompt = 4;
    bad.max_new_tokens = 0;
    assert_int_equal(loom__sched_add(f.s, &bad, f.now), LOOM_ERR_INVALID_ARG);
    bad.max_new_tokens = 1;
    bad.arrival_us = f.now + 1;
    assert_int_equal(loom__sched_add(f.s, &bad, f.now), LOOM_ERR_INVALID_ARG);
    bad.arrival_us = f.now;
    bad.ttft_us = -5;
    assert_int_equal(loom__sched_add(f.s, &bad, f.now), LOOM_ERR_INVALID_ARG);
    bad.ttft_us = 0;
    bad.arrival_us = f.now - 1;
    assert_int_equal(loom__sched_add(f.s, &bad, f.now - 1), LOOM_ERR_INVALID_ARG); /* time */
    assert_int_equal(loom__sched_add(f.s, NULL, f.now), LOOM_ERR_INVALID_ARG);
    loom__sched_request_view v;
    assert_int_equal(loom__sched_get(f.s, 99, &v), LOOM_ERR_INVALID_ARG);
    assert_int_equal(loom__sched_cancel(f.s, 99, NULL), LOOM_ERR_INVALID_ARG);
    loom__sched_result r1 = {1, 1, false};
    assert_int_equal(loom__sched_on_step_done(f.s, &r1, 1, f.now), LOOM_ERR_INVALID_ARG);
    assert_int_equal(loom__sched_on_step_done(f.s, NULL, 1, f.now), LOOM_ERR_INVALID_ARG);
    assert_int_equal(loom__sched_on_step_done(f.s, NULL, 0, f.now), LOOM_OK); /* no plan: no-op */
    assert_int_equal(loom__sched_schedule(f.s, f.now - 1, &f.plan), LOOM_ERR_INVALID_ARG);

    plan_step(&f); /* 1 samples this step */
    assert_int_equal(loom__sched_schedule(f.s, f.now, &f.plan), LOOM_ERR_INVALID_ARG);
    loom__sched_result bad_res[][2] = {
        {{99, 0, false}, {1, 1, false}}, /* not in the plan */
        {{1, 1, false}, {1, 1, false}},  /* twice */
        {{1, 0, false}, {1, 0, false}},  /* sampled nothing, not finished (2nd ignored) */
        {{1, -1, false}, {1, 0, false}}, /* negative */
    };
    int32_t bad_n[] = {2, 2, 1, 1};
    for (int i = 0; i < 4; i++)
        assert_int_equal(loom__sched_on_step_done(f.s, bad_res[i], bad_n[i], f.now),
                         LOOM_ERR_INVALID_ARG);
    assert_int_equal(loom__sched_on_step_done(f.s, NULL, 0, f.now), LOOM_ERR_INVALID_ARG);
    assert_int_equal(view_of(&f, 1).n_computed, 0); /* nothing was committed */
    done_step(&f, NULL, 0);
    assert_int_equal(view_of(&f, 1).n_computed, 4);
    assert_int_equal(view_of(&f, 1).n_generated, 1);

    /* Tokens from an entry that does not sample. */
    add_req(&f, 2, 0, 100, 10);
    plan_step(&f);
    loom__sched_result r2[2] = {{1, 1, false}, {2, 1, false}};
    assert_int_equal(loom__sched_on_step_done(f.s, r2, 2, f.now), LOOM_ERR_INVALID_ARG);
    done_step(&f, NULL, 0);
    fx_close(&f);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_chunked_prefill),
        cmocka_unit_test(test_decodes_continue_during_prefill),
        cmocka_unit_test(test_chunk_cap),
        cmocka_unit_test(test_priority_order),
        cmocka_unit_test(test_deadline_order),
        cmocka_unit_test(test_arrival_order),
        cmocka_unit_test(test_running_order),
        cmocka_unit_test(test_preempt_victim_and_resume_recompute),
        cmocka_unit_test(test_preempt_swap_resume),
        cmocka_unit_test(test_blocks_accounted_within_step),
        cmocka_unit_test(test_never_preempt_for_lower),
        cmocka_unit_test(test_promotion),
        cmocka_unit_test(test_promoted_view),
        cmocka_unit_test(test_watermark),
        cmocka_unit_test(test_prefill_promise),
        cmocka_unit_test(test_reject_too_big),
        cmocka_unit_test(test_cancel_waiting_and_running),
        cmocka_unit_test(test_cancel_preempted),
        cmocka_unit_test(test_fcfs),
        cmocka_unit_test(test_cached_prefix),
        cmocka_unit_test(test_tpot_budget),
        cmocka_unit_test(test_tpot_huge_deadline),
        cmocka_unit_test(test_reachable_before_missed),
        cmocka_unit_test(test_promotion_bounded_by_deadlines),
        cmocka_unit_test(test_protect_after_two_preemptions),
        cmocka_unit_test(test_defer_decodes_for_urgent_prompt),
        cmocka_unit_test(test_bad_config),
        cmocka_unit_test(test_bad_input),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
