/* test_alloc_sweep_engine.c — allocation-failure injection (issue 18, item 2), the engine at
 * work: in a LOOM_ALLOC_FAULTS build (core/alloc.h) each allocation of
 *   - submit of several requests (a text prompt with stop strings, a token prompt with n = 3,
 *     a logit bias, log-probabilities), once with one failing allocation and once "lasting";
 *   - every step of a mixed batch (prefills of several requests sharing a prefix, chunked
 *     under a small max_batched_tokens, decodes, forks, a preemption forced by a KV pool too
 *     small for all, by recompute and by swap, a trace recording, an input record), and the
 *     replay of that record (a step whose own failure makes another run reports the
 *     divergence);
 *   - bursts of 72 requests (the engine's tables grow; 48 cancellations in one step; 32
 *     requests ending in one step);
 *   - loom_engine_generate
 * fails in turn (alloc_sweep.h). A submit or cancel that fails returns OUT_OF_MEMORY with a
 * message and leaves nothing behind (made again, it runs as usual); a step fails at most the
 * requests it touched (FAILED, OUT_OF_MEMORY). Afterwards every request has ended with an
 * event, every one that did not fail produced exactly its tokens on a fault-free engine (whose
 * TOKEN events stay readable until the next step), a fresh request runs to its fault-free
 * tokens and the KV pools are whole (loom__kv_check, no block held); nothing leaks
 * (LeakSanitizer, after each phase). Each phase prints its failure points and outcomes. The
 * models compute on one thread here (the thread pools' creation is swept by
 * test_alloc_sweep.c). Built without LOOM_ALLOC_FAULTS the program exits 77 (skipped). */
#ifndef LOOM_ALLOC_FAULTS

#include <stdio.h>

int main(void) {
    printf("skipped: built without LOOM_ALLOC_FAULTS (scripts/test-alloc-faults.sh builds it)\n");
    return 77;
}

#else

#include "core/alloc_sweep.h"

/* ---- the mixed batch ----------------------------------------------------------------------- */

#define N_REQ      4
#define MAX_SAMPLE 3
#define MAX_OUT    24

typedef struct batch_inputs {
    loom_token prompt[N_REQ][24];
    loom_sampler_params sp[N_REQ];
    loom_request_params rq[N_REQ];
    loom_logit_bias bias[2];
    const char *stops[2];
} batch_inputs;

/* R0: a text prompt with stop strings; R1: a token prompt, n = 3 samples (sampled, seeded);
 * R2: R1's first 8 tokens (two blocks, shared through the prefix cache) then its own, a logit
 * bias and log-probabilities; R3: a longer prompt, higher priority, a stop token. */
static void batch_inputs_init(batch_inputs *b) {
    memset(b, 0, sizeof *b);
    for (int r = 0; r < N_REQ; r++) {
        b->sp[r] = loom_sampler_default_params();
        b->sp[r].temperature = 0.0f;
        b->rq[r] = loom_request_default_params();
        b->rq[r].sampler = &b->sp[r];
        b->rq[r].max_tokens = 16;
        b->rq[r].ignore_eos = true;
        b->rq[r].user_data = (void *)(intptr_t)(r + 1);
    }
    b->stops[0] = "w17";
    b->stops[1] = "\xe2\x96\x81w3 w";
    b->rq[0].prompt = "w1 w2 w3 w4 w5 w6 w7 w8";
    b->rq[0].stop_strings = b->stops;
    b->rq[0].n_stop_strings = 2;

    prompt_of(1, b->prompt[1], 16);
    b->rq[1].prompt_tokens = b->prompt[1];
    b->rq[1].n_prompt_tokens = 16;
    b->rq[1].n = 3;
    b->rq[1].max_tokens = 6;
    b->sp[1].temperature = 0.8f;
    b->sp[1].seed = 9;

    memcpy(b->prompt[2], b->prompt[1], 8 * sizeof(loom_token));
    prompt_of(2, b->prompt[2] + 8, 8);
    b->rq[2].prompt_tokens = b->prompt[2];
    b->rq[2].n_prompt_tokens = 16;
    b->bias[0] = (loom_logit_bias){.id = 5, .bias = 2.0f};
    b->bias[1] = (loom_logit_bias){.id = 17, .bias = -INFINITY};
    b->sp[2].logit_bias = b->bias;
    b->sp[2].n_logit_bias = 2;
    b->sp[2].n_logprobs = 3;

    prompt_of(3, b->prompt[3], 20);
    b->rq[3].prompt_tokens = b->prompt[3];
    b->rq[3].n_prompt_tokens = 20;
    b->rq[3].priority = 1;
    static const loom_token stop_tok[1] = {299};
    b->rq[3].stop_tokens = stop_tok;
    b->rq[3].n_stop_tokens = 1;
}

/* What each request produced, sample by sample. */
typedef struct batch_out {
    loom_token tok[N_REQ][MAX_SAMPLE][MAX_OUT];
    int n[N_REQ][MAX_SAMPLE];
    bool finished[N_REQ][MAX_SAMPLE];
    loom_finish_reason reason[N_REQ][MAX_SAMPLE];
    bool failed[N_REQ];
    loom_status fail_status[N_REQ];
} batch_out;

static int n_samples_of(int r) {
    return r == 1 ? 3 : 1;
}

static bool request_ended(const batch_out *o, int r) {
    if (o->failed[r]) return true;
    for (int i = 0; i < n_samples_of(r); i++)
        if (!o->finished[r][i]) return false;
    return true;
}

/* What a TOKEN event points to (its info and text, in the request's memory) is readable until
 * the next step: AddressSanitizer sees it if the request went early. */
static void check_token_event(const loom_event *e) {
    assert_non_null(e->info);
    assert_int_equal(e->info->token, e->token);
    unsigned sum = 0;
    for (size_t i = 0; i < e->text_len; i++) sum += (unsigned char)e->text[i];
    for (int32_t i = 0; i < e->info->n_top_raw; i++) sum += (unsigned)e->info->top_raw[i].id;
    (void)sum;
}

static void collect(batch_out *o, const loom_event *const *ev, size_t n_ev) {
    for (size_t k = 0; k < n_ev; k++) {
        const loom_event *e = ev[k];
        /* A replay's events carry no user_data: its requests are known by their recorded ids,
         * 1 .. N_REQ in the order of the batch (the fault-free run's). */
        const int r = e->user_data ? (int)(intptr_t)e->user_data - 1 : (int)e->id - 1;
        if (r < 0 || r >= N_REQ) continue; /* the fresh request, or another */
        if (o->failed[r]) fail_msg("request %d: an event after its FAILED event", r);
        assert_true(e->sample >= 0 && e->sample < n_samples_of(r));
        if (o->finished[r][e->sample] && e->kind != LOOM_EVENT_FAILED)
            fail_msg("request %d sample %d: an event after it finished", r, e->sample);
        switch (e->kind) {
        case LOOM_EVENT_TOKEN:
            check_token_event(e);
            assert_true(o->n[r][e->sample] < MAX_OUT);
            o->tok[r][e->sample][o->n[r][e->sample]++] = e->token;
            break;
        case LOOM_EVENT_FINISHED:
            o->finished[r][e->sample] = true;
            o->reason[r][e->sample] = e->reason;
            break;
        case LOOM_EVENT_FAILED:
            o->failed[r] = true;
            o->fail_status[r] = e->status;
            break;
        }
    }
}

/* Steps until the engine has no work (a bounded number of steps); every request of the batch
 * has ended then (batch: whether o follows the mixed batch). */
static void drain(loom_engine *e, batch_out *o, bool batch, const char *what) {
    for (int k = 0; loom_engine_has_work(e); k++) {
        if (k > 2000) fail_msg("%s: the engine never finishes its requests", what);
        const loom_event *const *ev;
        size_t n_ev;
        check_ok(loom_engine_step(e, &ev, &n_ev), what);
        collect(o, ev, n_ev);
    }
    for (int r = 0; batch && r < N_REQ; r++)
        if (!request_ended(o, r)) fail_msg("%s: request %d never ended", what, r);
}

/* Every request that did not fail produced its reference tokens; a failed one failed with
 * OUT_OF_MEMORY. Returns the number of failed requests. */
static int compare_batch(const batch_out *o, const batch_out *ref, const char *what, int64_t n) {
    int n_failed = 0;
    for (int r = 0; r < N_REQ; r++) {
        if (o->failed[r]) {
            n_failed++;
            if (o->fail_status[r] != LOOM_ERR_OUT_OF_MEMORY)
                fail_msg("%s, allocation %lld failing: request %d failed with %s", what,
                         (long long)n, r, loom_status_str(o->fail_status[r]));
        }
        for (int i = 0; i < n_samples_of(r); i++) {
            if (o->failed[r] && !o->finished[r][i]) continue;
            if (o->n[r][i] != ref->n[r][i] ||
                memcmp(o->tok[r][i], ref->tok[r][i], sizeof(loom_token) * (size_t)o->n[r][i]) ||
                o->reason[r][i] != ref->reason[r][i])
                fail_msg("%s, allocation %lld failing: request %d sample %d: %d tokens "
                         "(reason %d), %d without faults (reason %d), or other tokens",
                         what, (long long)n, r, i, o->n[r][i], (int)o->reason[r][i], ref->n[r][i],
                         (int)ref->reason[r][i]);
        }
    }
    return n_failed;
}

static void submit_ok(loom_engine *e, batch_inputs *b, int r) {
    loom_request_id id;
    check_ok(loom_engine_submit(e, &b->rq[r], &id), "submit");
}

/* The step configurations: a pool of SMALL_POOL blocks cannot hold the batch at once; R3, of
 * a higher priority, comes before step LATE_STEP, when the others fill the pool, and takes
 * blocks from them (preemption). ROOMY_POOL (alloc_sweep.h) takes the whole batch at once. */
#define SMALL_POOL 20
#define LATE_STEP  6

typedef struct batch_ref {
    batch_out out;
    int n_steps;            /* steps the batch takes */
    int first_preempt_step; /* the first step after which preemptions > 0 (-1: none) */
    int64_t preemptions;
} batch_ref;

static batch_ref g_step_ref[2][2];   /* [arch][preempt mode], small pool */
static batch_out g_submit_ref[2][2]; /* [arch][preempt mode], roomy pool */

static void reference_batch(loom_model *m, int n_blocks, loom_preempt_mode pm, batch_ref *ref) {
    loom_engine *e = make_engine(m, n_blocks, pm);
    batch_inputs b;
    batch_inputs_init(&b);
    const int late = n_blocks == SMALL_POOL ? LATE_STEP : 0;
    for (int r = 0; r < N_REQ - (late > 0); r++) submit_ok(e, &b, r);
    memset(ref, 0, sizeof *ref);
    ref->first_preempt_step = -1;
    for (int k = 0; loom_engine_has_work(e) || k <= late; k++) {
        if (late && k == late) submit_ok(e, &b, N_REQ - 1);
        const loom_event *const *ev;
        size_t n_ev;
        check_ok(loom_engine_step(e, &ev, &n_ev), "reference step");
        collect(&ref->out, ev, n_ev);
        loom_engine_stats es = {.size = sizeof es};
        check_ok(loom_engine_get_stats(e, &es), "stats");
        if (ref->first_preempt_step < 0 && es.preemptions > 0) ref->first_preempt_step = k;
        ref->preemptions = es.preemptions;
        ref->n_steps = k + 1;
    }
    for (int r = 0; r < N_REQ; r++) {
        if (ref->out.failed[r])
            fail_msg("reference, %d blocks: request %d failed: %s", n_blocks, r,
                     loom_status_str(ref->out.fail_status[r]));
        assert_true(request_ended(&ref->out, r));
    }
    check_kv_whole(e, "reference");
    loom_engine_destroy(e);
}

/* ==== setup: the references of the batch, with no fault armed ================================ */

static int setup(void **state) {
    (void)state;
    if (sweep_setup("sweep-engine", 1) != 0) return -1; /* one thread: see alloc_sweep.h */
    for (int a = 0; a < 2; a++) {
        for (int pm = 0; pm < 2; pm++) {
            batch_ref roomy;
            reference_batch(g_model[a], ROOMY_POOL, (loom_preempt_mode)pm, &roomy);
            g_submit_ref[a][pm] = roomy.out;
            reference_batch(g_model[a], SMALL_POOL, (loom_preempt_mode)pm, &g_step_ref[a][pm]);
            /* Preemption changes no token. */
            for (int r = 0; r < N_REQ; r++)
                for (int i = 0; i < n_samples_of(r); i++) {
                    assert_int_equal(roomy.out.n[r][i], g_step_ref[a][pm].out.n[r][i]);
                    assert_memory_equal(roomy.out.tok[r][i], g_step_ref[a][pm].out.tok[r][i],
                                        sizeof(loom_token) * (size_t)roomy.out.n[r][i]);
                }
            const batch_ref *sr = &g_step_ref[a][pm];
            printf("%s, %s: the batch takes %d steps on %d blocks, %lld preemptions (the "
                   "first in step %d)\n",
                   g_arch[a], pm ? "swap" : "recompute", sr->n_steps, SMALL_POOL,
                   (long long)sr->preemptions, sr->first_preempt_step);
            /* The sweep must see a preemption. */
            assert_true(sr->preemptions > 0);
        }
    }
    return 0;
}

/* ==== phase: submit =========================================================================== */

static void sweep_all_submit_once(void) {
    for (int a = 0; a < 2; a++) {
        for (int pm = 0; pm < 2; pm++) {
            char phase[64];
            snprintf(phase, sizeof phase, "submit %s %s", g_arch[a], pm ? "swap" : "recompute");
            tally t = {0};
            for (int64_t n = 1;; n++) {
                assert_true(n < MAX_POINTS);
                loom_engine *e = make_engine(g_model[a], ROOMY_POOL, (loom_preempt_mode)pm);
                batch_inputs b;
                batch_inputs_init(&b);
                int r = 0;
                loom_status st = LOOM_OK;
                arm(n);
                for (; r < N_REQ; r++) {
                    loom_request_id id = 0;
                    st = loom_engine_submit(e, &b.rq[r], &id);
                    if (st != LOOM_OK) break;
                }
                const bool fired = loom__alloc_fault_fired();
                loom__alloc_fault_arm(0);
                if (fired) {
                    t.points++;
                    if (st == LOOM_OK) {
                        t.absorbed++;
                    } else {
                        expect_oom(st, phase, n);
                        t.failed++;
                    }
                } else {
                    check_ok(st, phase);
                }
                /* A failed submit left nothing behind: submitted again, it runs as usual. */
                for (; r < N_REQ; r++) submit_ok(e, &b, r);
                batch_out o;
                memset(&o, 0, sizeof o);
                drain(e, &o, true, phase);
                if (compare_batch(&o, &g_submit_ref[a][pm], phase, n) != 0)
                    fail_msg("%s: a request failed after its submit succeeded", phase);
                check_engine_usable(e, a, phase);
                loom_engine_destroy(e);
                if (!fired) break;
            }
            report(phase, &t);
            leak_check(phase);
        }
    }
}

static void test_submit(void **state) {
    (void)state;
    for (int lasting = 0; lasting < 2; lasting++) {
        g_lasting = lasting;
        sweep_all_submit_once();
    }
    g_lasting = false;
}

/* ==== phase: the steps of a mixed batch ====================================================== */

/* The record of a fault-free run replayed with each allocation failing in turn (the reader's,
 * the engine's creation, the replayed submits and steps): a clean status at create or at a
 * step, nothing leaked; without a failure, the recorded run's tokens. */
static void sweep_replay(int a, const char *rec, const batch_ref *ref) {
    char phase[64];
    snprintf(phase, sizeof phase, "replay of %d steps %s", ref->n_steps, g_arch[a]);
    tally t = {0};
    for (int64_t n = 1;; n++) {
        assert_true(n < MAX_POINTS);
        batch_out o;
        memset(&o, 0, sizeof o);
        bool failed = false, diverged = false;
        loom__alloc_fault_arm(n);
        loom_engine *e = NULL;
        loom_status st = loom_engine_create_replay(g_model[a], rec, NULL, &e);
        if (st != LOOM_OK) {
            expect_oom(st, phase, n);
            failed = true;
        }
        for (int k = 0; e && !failed && !diverged && loom_engine_has_work(e); k++) {
            if (k > 2000) fail_msg("%s: the replay never ends", phase);
            const loom_event *const *ev;
            size_t n_ev;
            st = loom_engine_step(e, &ev, &n_ev);
            /* A failure the step absorbed (a request FAILED for memory) makes another run than
             * the recorded one: the replay says so at that step's end, and stops there. */
            if (st == LOOM_ERR_INTERNAL && strstr(loom_last_error(), "diverged from the record")) {
                diverged = true;
            } else if (st != LOOM_OK) {
                expect_oom(st, phase, n);
                failed = true;
            }
            collect(&o, ev, n_ev);
        }
        const bool fired = loom__alloc_fault_fired();
        loom__alloc_fault_arm(0);
        if (fired) {
            t.points++;
            t.failed += failed;
            t.step_err += diverged;
            if (!failed && !diverged) {
                t.req_fail += compare_batch(&o, &ref->out, phase, n);
                t.absorbed++;
            }
        } else {
            assert_false(failed || diverged);
            assert_int_equal(compare_batch(&o, &ref->out, phase, n), 0);
        }
        loom_engine_destroy(e);
        if (!fired) break;
    }
    report(phase, &t);
    leak_check(phase);
}

/* The failure armed from the first step on, through every step to the end of the batch: the
 * N-th allocation of the whole run fails (the prefills, the decodes, the forks, the first
 * preemptions and retirements: the allocations of every step, not only the first few). */
static void test_steps(void **state) {
    (void)state;
    for (int a = 0; a < 2; a++) {
        for (int pm = 0; pm < 2; pm++) {
            const batch_ref *ref = &g_step_ref[a][pm];
            /* With swap, a trace records every step too (its appends drop a record when
             * memory is short, never the step). */
            const bool traced = pm == LOOM_PREEMPT_SWAP;
            /* With recompute the engine records its inputs instead (record.h: the encoding at
             * submit, the clock list), and the record of the run without a failure is then
             * replayed under the same sweep (sweep_replay). */
            char rec[512];
            synth_path(rec, sizeof rec, "sweep-steps.rec");
            char phase[64];
            snprintf(phase, sizeof phase, "%d steps %s %s%s", ref->n_steps, g_arch[a],
                     pm ? "swap" : "recompute", traced ? " traced" : " recorded");
            tally t = {0};
            for (int64_t n = 1;; n++) {
                assert_true(n < MAX_POINTS);
                loom_trace *trace = NULL;
                if (traced) check_ok(loom_trace_create(&trace), "trace");
                loom_engine_params ep =
                    engine_params(g_model[a], SMALL_POOL, (loom_preempt_mode)pm);
                ep.trace = trace;
                if (!traced) ep.record_path = rec;
                loom_engine *e = NULL;
                check_ok(loom_engine_create(g_model[a], &ep, &e), "engine");
                batch_inputs b;
                batch_inputs_init(&b);
                for (int r = 0; r < N_REQ - 1; r++) submit_ok(e, &b, r);
                batch_out o;
                memset(&o, 0, sizeof o);
                bool step_failed = false, submit_failed = false;
                loom__alloc_fault_arm(n);
                for (int k = 0; loom_engine_has_work(e) || k <= LATE_STEP; k++) {
                    if (k > 2000) fail_msg("%s: the engine never finishes its requests", phase);
                    if (k == LATE_STEP) {
                        /* The late request's submit may take the failure: then it is
                         * submitted again (the failure fires once). */
                        loom_request_id id;
                        loom_status st = loom_engine_submit(e, &b.rq[N_REQ - 1], &id);
                        if (st != LOOM_OK) {
                            expect_oom(st, phase, n);
                            submit_failed = true;
                            submit_ok(e, &b, N_REQ - 1);
                        }
                    }
                    const loom_event *const *ev;
                    size_t n_ev;
                    loom_status st = loom_engine_step(e, &ev, &n_ev);
                    if (st != LOOM_OK) {
                        expect_oom(st, phase, n);
                        step_failed = true;
                    }
                    collect(&o, ev, n_ev);
                }
                const bool fired = loom__alloc_fault_fired();
                loom__alloc_fault_arm(0);
                for (int r = 0; r < N_REQ; r++)
                    if (!request_ended(&o, r)) fail_msg("%s: request %d never ended", phase, r);
                int n_failed = compare_batch(&o, &ref->out, phase, n);
                if (fired) {
                    t.points++;
                    t.failed += submit_failed;
                    t.step_err += step_failed;
                    t.req_fail += n_failed;
                    if (!submit_failed && !step_failed && n_failed == 0) t.absorbed++;
                } else {
                    assert_false(step_failed || submit_failed);
                    assert_int_equal(n_failed, 0);
                }
                if (trace) {
                    loom_trace_info ti = {.size = sizeof ti};
                    check_ok(loom_trace_get_info(trace, &ti), "trace info");
                    assert_true(ti.n_dropped <= (fired ? 1u : 0u));
                    assert_true(ti.n_steps > 0 && ti.n_tokens > 0);
                }
                check_engine_usable(e, a, phase);
                loom_engine_destroy(e);
                loom_trace_free(trace);
                if (!fired) break;
            }
            report(phase, &t);
            leak_check(phase);
            if (!traced) sweep_replay(a, rec, ref);
        }
    }
}

/* ==== phase: a burst of requests, half of them cancelled ===================================== */

/* More requests than the engine's tables start with (the id maps rebuild, the scheduler and
 * the inbox grow) and, in one step, more cancellations than the event array holds (it grows).
 * Armed from the first submit to the end of the run. A submit or cancel that takes the failure
 * is made again; every request must end: FINISHED with its fault-free tokens or CANCELLED, or
 * FAILED with OUT_OF_MEMORY. */
#define N_BURST    72

typedef struct burst_state {
    loom_request_id id[N_BURST];
    loom_token tok[N_BURST][2][2]; /* [request][sample][token] */
    int n[N_BURST][2];
    int n_req; /* requests of the run */
    bool fork; /* request 0 has n = 2 */
    bool ended[N_BURST], failed[N_BURST], cancelled[N_BURST];
    bool one_done; /* request 0 of a fork run: one sample finished */
} burst_state;

static void burst_prompt(int r, loom_token *p) {
    p[0] = (loom_token)(4 + (r * 7) % 250);
    p[1] = (loom_token)(4 + (r * 13 + 5) % 250);
    p[2] = (loom_token)(4 + (r * 29 + 1) % 250);
}

static void burst_events(burst_state *b, const loom_event *const *ev, size_t n_ev) {
    for (size_t k = 0; k < n_ev; k++) {
        const int r = (int)(intptr_t)ev[k]->user_data - 1;
        assert_true(r >= 0 && r < N_BURST);
        if (b->ended[r]) fail_msg("burst request %d: an event after its end", r);
        if (ev[k]->kind == LOOM_EVENT_TOKEN) {
            check_token_event(ev[k]);
            const int i = ev[k]->sample;
            assert_true(i >= 0 && i < (r == 0 && b->fork ? 2 : 1) && b->n[r][i] < 2);
            b->tok[r][i][b->n[r][i]++] = ev[k]->token;
        } else if (ev[k]->kind == LOOM_EVENT_FINISHED && b->fork && r == 0 && !b->cancelled[r] &&
                   ev[k]->reason != LOOM_FINISH_CANCELLED && !b->one_done) {
            b->one_done = true; /* the first of its two samples */
        } else {
            b->ended[r] = true;
            b->failed[r] = ev[k]->kind == LOOM_EVENT_FAILED;
            if (b->failed[r] && ev[k]->status != LOOM_ERR_OUT_OF_MEMORY)
                fail_msg("burst request %d failed with %s", r, loom_status_str(ev[k]->status));
            b->cancelled[r] =
                ev[k]->kind == LOOM_EVENT_FINISHED && ev[k]->reason == LOOM_FINISH_CANCELLED;
        }
    }
}

/* One run of n_req requests; cancel: whether requests 1, 2, 4, 5, ... are cancelled before the
 * second step; fork: request 0 has n = 2. Returns whether a submit, cancel or step reported an
 * error (each made good at once). */
static bool burst_run(loom_engine *e, int n_req, bool cancel, bool fork, burst_state *b) {
    bool err = false;
    memset(b, 0, sizeof *b);
    b->n_req = n_req;
    b->fork = fork;
    loom_token prompt[N_BURST][3];
    for (int r = 0; r < n_req; r++) {
        burst_prompt(r, prompt[r]);
        loom_sampler_params sp = loom_sampler_default_params();
        sp.temperature = 0.0f;
        loom_request_params rq = loom_request_default_params();
        rq.prompt_tokens = prompt[r];
        rq.n_prompt_tokens = 3;
        rq.max_tokens = 2;
        rq.ignore_eos = true;
        rq.sampler = &sp;
        rq.n = fork && r == 0 ? 2 : 1;
        rq.user_data = (void *)(intptr_t)(r + 1);
        loom_status st = loom_engine_submit(e, &rq, &b->id[r]);
        if (st != LOOM_OK) {
            expect_oom(st, "burst submit", -1);
            err = true;
            check_ok(loom_engine_submit(e, &rq, &b->id[r]), "burst submit again");
        }
    }
    for (int k = 0; loom_engine_has_work(e); k++) {
        if (k > 2000) fail_msg("burst: the engine never finishes its requests");
        if (cancel && k == 1) {
            for (int r = 0; r < n_req; r++) {
                if (r % 3 == 0 || b->ended[r]) continue;
                loom_status st = loom_engine_cancel(e, b->id[r]);
                if (st == LOOM_ERR_OUT_OF_MEMORY) {
                    err = true;
                    st = loom_engine_cancel(e, b->id[r]);
                }
                if (st != LOOM_OK && st != LOOM_ERR_NOT_FOUND) check_ok(st, "burst cancel");
            }
        }
        const loom_event *const *ev;
        size_t n_ev;
        loom_status st = loom_engine_step(e, &ev, &n_ev);
        if (st != LOOM_OK) {
            expect_oom(st, "burst step", -1);
            err = true;
        }
        burst_events(b, ev, n_ev);
    }
    for (int r = 0; r < n_req; r++)
        if (!b->ended[r]) fail_msg("burst: request %d never ended", r);
    return err;
}

static loom_engine *make_burst_engine(loom_model *m, int32_t max_seqs) {
    loom_engine_params ep = engine_params(m, ROOMY_POOL, LOOM_PREEMPT_RECOMPUTE);
    ep.max_seqs = max_seqs;
    ep.max_batched_tokens = 3 * max_seqs;
    loom_engine *e = NULL;
    check_ok(loom_engine_create(m, &ep, &e), "burst engine");
    return e;
}

/* Three runs: 4 sequences a step with 48 cancellations in one step (more events than the array
 * starts with); 32 sequences a step, so 32 requests end in the same step (their TOKEN events
 * point into them until the next step, however many retire at once); 64 requests, the first
 * with n = 2, so starting its second sample makes the scheduler's 65th entry and grows its
 * tables (64 to start with) — that growth failing used to retire the request twice, and free
 * it twice. */
static void sweep_burst(const char *phase, int n_req, int32_t max_seqs, bool cancel, bool fork) {
    loom_model *m = g_model[0];
    burst_state ref, b;
    {
        loom_engine *e = make_burst_engine(m, max_seqs);
        assert_false(burst_run(e, n_req, false, fork, &ref));
        for (int r = 0; r < n_req; r++) assert_true(ref.ended[r] && !ref.failed[r]);
        check_engine_usable(e, 0, "burst reference");
        loom_engine_destroy(e);
    }
    tally t = {0};
    for (int64_t n = 1;; n++) {
        assert_true(n < MAX_POINTS);
        loom_engine *e = make_burst_engine(m, max_seqs);
        loom__alloc_fault_arm(n);
        const bool err = burst_run(e, n_req, cancel, fork, &b);
        const bool fired = loom__alloc_fault_fired();
        loom__alloc_fault_arm(0);
        int n_failed = 0, n_cancelled = 0;
        for (int r = 0; r < n_req; r++) {
            n_failed += b.failed[r];
            n_cancelled += b.cancelled[r];
            if (b.failed[r] || b.cancelled[r]) continue;
            if (memcmp(b.n[r], ref.n[r], sizeof b.n[r]) != 0 ||
                memcmp(b.tok[r], ref.tok[r], sizeof b.tok[r]) != 0)
                fail_msg("%s, allocation %lld failing: request %d: other tokens", phase,
                         (long long)n, r);
        }
        if (!fired) {
            assert_false(err);
            assert_int_equal(n_failed, 0);
            /* More cancellations in one step than the event array has room for beside the
             * batch's own (16: engine_create.c), so it grows. */
            if (cancel) assert_true(n_cancelled > 16);
        } else {
            t.points++;
            t.failed += err;
            t.req_fail += n_failed;
            if (!err && n_failed == 0) t.absorbed++;
        }
        check_engine_usable(e, 0, phase);
        loom_engine_destroy(e);
        if (!fired) break;
    }
    report(phase, &t);
    leak_check(phase);
}

static void test_burst(void **state) {
    (void)state;
    sweep_burst("burst of 72, 4 a step, 48 cancelled", N_BURST, 4, true, false);
    sweep_burst("burst of 72, 32 a step", N_BURST, 32, false, false);
    sweep_burst("burst of 64, a fork the 65th", 64, 64, false, true);
}

/* ==== phase: loom_engine_generate ============================================================= */

static void sweep_all_engine_generate_once(void) {
    for (int a = 0; a < 2; a++) {
        char phase[64];
        snprintf(phase, sizeof phase, "engine_generate %s", g_arch[a]);
        tally t = {0};
        loom_engine *e = make_engine(g_model[a], ROOMY_POOL, LOOM_PREEMPT_RECOMPUTE);
        for (int64_t n = 1;; n++) {
            assert_true(n < MAX_POINTS);
            loom_token prompt[14];
            loom_sampler_params sp;
            loom_request_params rq;
            fresh_request(prompt, &sp, &rq);
            loom_generation *g = NULL;
            arm(n);
            loom_status st = loom_engine_generate(e, &rq, NULL, NULL, &g);
            const bool fired = loom__alloc_fault_fired();
            loom__alloc_fault_arm(0);
            if (st == LOOM_OK) {
                t.absorbed += fired;
                assert_int_equal(g->n_tokens, F_TOKENS);
                assert_memory_equal(g->tokens, g_fresh_ref[a], sizeof g_fresh_ref[a]);
                loom_generation_free(g);
            } else {
                assert_true(fired);
                expect_oom(st, phase, n);
                assert_null(g);
                t.failed++;
                /* The request was cancelled: it ends at the next steps. */
                batch_out o;
                memset(&o, 0, sizeof o);
                drain(e, &o, false, phase);
            }
            t.points += fired;
            check_engine_usable(e, a, phase);
            if (!fired) break;
        }
        loom_engine_destroy(e);
        report(phase, &t);
        leak_check(phase);
    }
}

static void test_engine_generate(void **state) {
    (void)state;
    for (int lasting = 0; lasting < 2; lasting++) {
        g_lasting = lasting;
        sweep_all_engine_generate_once();
    }
    g_lasting = false;
}

int main(void) {
    /* SWEEP_ONLY=test_load: one phase (a cmocka filter pattern). */
    if (getenv("SWEEP_ONLY")) cmocka_set_test_filter(getenv("SWEEP_ONLY"));
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_submit),
        cmocka_unit_test(test_steps),
        cmocka_unit_test(test_burst),
        cmocka_unit_test(test_engine_generate),
    };
    return cmocka_run_group_tests(tests, setup, sweep_teardown);
}

#endif /* LOOM_ALLOC_FAULTS */
