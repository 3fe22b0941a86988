/* test_alloc_sweep.c — allocation-failure injection (issue 18, item 2), the calls that build
 * objects: in a LOOM_ALLOC_FAULTS build (core/alloc.h) each allocation of
 *   - model load (GGUF parsing, tokenizer build, weight preparation; llama and gemma3, mapped
 *     and copied weights), and a synthetic quantized model built in memory;
 *   - engine creation (execution context and workspace, KV pools in backend memory, swap areas,
 *     scheduler, sampler workspaces and threads; preemption by recompute and by swap);
 *   - writing a trace, a session (create, decode, loom_generate), tokenizing, detokenizing,
 *     chat rendering and tokenizing, and the sampler
 * fails in turn (alloc_sweep.h), once with one failing allocation and once with every one
 * from it on failing ("lasting", so cleanup paths meet failures too). Each call must return
 * OUT_OF_MEMORY with a message or absorb the failure (then its result is checked); nothing may
 * leak (LeakSanitizer, after each phase); an object whose creation failed is gone, and one
 * that was made works: a model computes a fault-free model's logits, an engine runs a fresh
 * request to a fault-free engine's tokens with its KV pools whole afterwards, a session
 * generates what it generates without faults. Each phase prints its failure points and their
 * outcomes. The engine at work (submit, steps, bursts): test_alloc_sweep_engine.c. Built
 * without LOOM_ALLOC_FAULTS the program exits 77 (skipped). */
#ifndef LOOM_ALLOC_FAULTS

#include <stdio.h>

int main(void) {
    printf("skipped: built without LOOM_ALLOC_FAULTS (scripts/test-alloc-faults.sh builds it)\n");
    return 77;
}

#else

#include "core/alloc_sweep.h"

/* ==== phase: model load ======================================================================= */

static void sweep_load(const char *phase, int arch, bool mmap) {
    tally t = {0};
    loom_model_params p = model_params(mmap);
    for (int64_t n = 1;; n++) {
        assert_true(n < MAX_POINTS);
        loom_model *m = NULL;
        arm(n);
        loom_status st = loom_model_load(g_path[arch], &p, &m);
        const bool fired = loom__alloc_fault_fired();
        loom__alloc_fault_arm(0);
        if (!fired) {
            check_ok(st, phase);
            check_fingerprint(m, arch, phase);
            loom_model_free(m);
            break;
        }
        t.points++;
        if (st == LOOM_OK) {
            t.absorbed++;
            check_fingerprint(m, arch, phase);
            loom_model_free(m);
        } else {
            expect_oom(st, phase, n);
            assert_null(m);
            t.failed++;
        }
    }
    report(phase, &t);
    leak_check(phase);
}

static void sweep_all_load_once(void) {
    sweep_load("load llama (mapped)", 0, true);
    sweep_load("load gemma3 (mapped)", 1, true);
    sweep_load("load llama (weights copied)", 0, false);
}

static void test_load(void **state) {
    (void)state;
    for (int lasting = 0; lasting < 2; lasting++) {
        g_lasting = lasting;
        sweep_all_load_once();
    }
    g_lasting = false;
}

/* A synthetic q4_K model built in memory: the synthetic writer and quantized weights. */
static void sweep_all_load_synthetic_once(void) {
    const char *phase = "load synthetic llama q4_K";
    tally t = {0};
    loom_synthetic_params sp = loom_synthetic_default_params();
    sp.arch = "llama";
    sp.n_vocab = 300;
    sp.n_embd = 256;
    sp.n_head = 4;
    sp.n_head_kv = 2;
    sp.n_ff = 256;
    sp.n_layer = 2;
    sp.n_ctx = 128;
    sp.weight_type = "q4_K";
    loom_model_params p = model_params(true);
    for (int64_t n = 1;; n++) {
        assert_true(n < MAX_POINTS);
        loom_model *m = NULL;
        arm(n);
        loom_status st = loom_model_load_synthetic(&sp, &p, &m);
        const bool fired = loom__alloc_fault_fired();
        loom__alloc_fault_arm(0);
        if (!fired) {
            check_ok(st, phase);
            loom_model_free(m);
            break;
        }
        t.points++;
        if (st == LOOM_OK) {
            t.absorbed++;
            loom_model_free(m);
        } else {
            expect_oom(st, phase, n);
            assert_null(m);
            t.failed++;
        }
    }
    report(phase, &t);
    leak_check(phase);
}

static void test_load_synthetic(void **state) {
    (void)state;
    for (int lasting = 0; lasting < 2; lasting++) {
        g_lasting = lasting;
        sweep_all_load_synthetic_once();
    }
    g_lasting = false;
}

/* ==== phase: engine creation ================================================================== */

static void sweep_all_engine_create_once(void) {
    for (int a = 0; a < 2; a++) {
        for (int pm = 0; pm < 2; pm++) {
            char phase[64];
            snprintf(phase, sizeof phase, "engine_create %s %s", g_arch[a],
                     pm ? "swap" : "recompute");
            tally t = {0};
            loom_engine_params ep = engine_params(g_model[a], ROOMY_POOL, (loom_preempt_mode)pm);
            for (int64_t n = 1;; n++) {
                assert_true(n < MAX_POINTS);
                loom_engine *e = NULL;
                arm(n);
                loom_status st = loom_engine_create(g_model[a], &ep, &e);
                const bool fired = loom__alloc_fault_fired();
                loom__alloc_fault_arm(0);
                if (fired) t.points++;
                if (st == LOOM_OK) {
                    t.absorbed += fired;
                    check_engine_usable(e, a, phase);
                    loom_engine_destroy(e);
                } else {
                    assert_true(fired);
                    expect_oom(st, phase, n);
                    assert_null(e);
                    t.failed++;
                }
                if (!fired) break;
            }
            report(phase, &t);
            leak_check(phase);
        }
    }
}

static void test_engine_create(void **state) {
    (void)state;
    for (int lasting = 0; lasting < 2; lasting++) {
        g_lasting = lasting;
        sweep_all_engine_create_once();
    }
    g_lasting = false;
}

/* ==== phase: writing a trace ================================================================== */

static void sweep_all_trace_write_once(void) {
    loom_trace *trace = NULL;
    check_ok(loom_trace_create(&trace), "trace");
    loom_engine *e = make_engine_traced(g_model[1], ROOMY_POOL, LOOM_PREEMPT_RECOMPUTE, trace);
    loom_token out[F_TOKENS];
    run_fresh(e, out);
    loom_engine_destroy(e);
    static char buf[1 << 20];
    for (int fmt = 0; fmt < 2; fmt++) {
        const char *phase = fmt ? "trace write (chrome)" : "trace write (jsonl)";
        tally t = {0};
        for (int64_t n = 1;; n++) {
            assert_true(n < MAX_POINTS);
            size_t len = 0;
            arm(n);
            loom_status st =
                loom_trace_write_buffer(trace, (loom_trace_format)fmt, buf, sizeof buf, &len);
            const bool fired = loom__alloc_fault_fired();
            loom__alloc_fault_arm(0);
            t.points += fired;
            if (st == LOOM_OK) {
                t.absorbed += fired;
                assert_true(len > 0 && buf[0] == '{');
            } else {
                assert_true(fired);
                expect_oom(st, phase, n);
                t.failed++;
            }
            if (!fired) break;
        }
        report(phase, &t);
    }
    loom_trace_free(trace);
    leak_check("trace write");
}

static void test_trace_write(void **state) {
    (void)state;
    for (int lasting = 0; lasting < 2; lasting++) {
        g_lasting = lasting;
        sweep_all_trace_write_once();
    }
    g_lasting = false;
}

/* ==== phase: sessions and loom_generate ======================================================= */

static loom_token g_gen_ref[2][F_TOKENS]; /* loom_generate's tokens per arch */
static int g_gen_ref_n[2];

static bool collect_piece(const char *piece, size_t len, loom_token tok, void *user) {
    (void)piece;
    (void)len;
    int *n = user;
    n[0]++;
    if (n[0] <= F_TOKENS) n[n[0]] = tok;
    return true;
}

static loom_status run_generate(loom_session *s, int *got) {
    loom_generate_params gp = loom_generate_default_params();
    loom_sampler_params sp = loom_sampler_default_params();
    sp.temperature = 0.0f;
    sp.n_logprobs = 2;
    gp.sampler = &sp;
    gp.n_predict = F_TOKENS;
    gp.stop_at_eos = false;
    memset(got, 0, sizeof(int) * (F_TOKENS + 1));
    return loom_generate(s, "w4 w9 w2", &gp, collect_piece, got, NULL);
}

static void sweep_all_session_once(void) {
    for (int a = 0; a < 2; a++) {
        char phase[64];
        snprintf(phase, sizeof phase, "session + generate %s", g_arch[a]);
        loom_session_params sp = loom_session_default_params();
        sp.n_ctx = 40;
        sp.n_batch = 8; /* the prompt runs in chunks */
        sp.block_size = BS;
        /* The reference: no fault. */
        {
            loom_session *s = NULL;
            check_ok(loom_session_create(g_model[a], &sp, &s), "session");
            int got[F_TOKENS + 1];
            check_ok(run_generate(s, got), "generate");
            g_gen_ref_n[a] = got[0];
            for (int i = 0; i < got[0] && i < F_TOKENS; i++) g_gen_ref[a][i] = got[i + 1];
            loom_session_free(s);
        }
        tally t = {0};
        loom_token toks[12];
        prompt_of(8, toks, 12);
        for (int64_t n = 1;; n++) {
            assert_true(n < MAX_POINTS);
            loom_session *s = NULL;
            int got[F_TOKENS + 1];
            arm(n);
            loom_status st = loom_session_create(g_model[a], &sp, &s);
            const bool create_failed = st != LOOM_OK;
            if (st == LOOM_OK) st = loom_session_decode(s, toks, 12, true);
            if (st == LOOM_OK) st = run_generate(s, got);
            const bool fired = loom__alloc_fault_fired();
            loom__alloc_fault_arm(0);
            t.points += fired;
            if (st == LOOM_OK) {
                t.absorbed += fired;
            } else {
                assert_true(fired);
                expect_oom(st, phase, n);
                t.failed++;
            }
            if (create_failed) {
                assert_null(s);
            } else {
                /* The session is still usable: generating again gives the reference. */
                check_ok(run_generate(s, got), phase);
                assert_int_equal(got[0], g_gen_ref_n[a]);
                for (int i = 0; i < got[0] && i < F_TOKENS; i++)
                    assert_int_equal(got[i + 1], g_gen_ref[a][i]);
                loom_session_free(s);
            }
            if (!fired) break;
        }
        report(phase, &t);
        leak_check(phase);
    }
}

static void test_session(void **state) {
    (void)state;
    for (int lasting = 0; lasting < 2; lasting++) {
        g_lasting = lasting;
        sweep_all_session_once();
    }
    g_lasting = false;
}

/* ==== phase: tokenizer, chat template, sampler ================================================ */

typedef struct text_work {
    loom_token tok[64];
    size_t n_tok;
    char detok[256];
    size_t n_detok;
    char chat[512];
    size_t n_chat;
    loom_token chat_tok[256];
    size_t n_chat_tok;
    loom_token sampled, run_token;
    float run_lp;
} text_work;

/* Every call that can allocate, stopping at the first failure. */
static loom_status text_calls(const loom_model *m, const float *logits, text_work *w) {
    static const char text[] = "<s>w1 w2 w3 \xc3\xa9\xe2\x82\xac w10 w300 abc";
    LOOM_TRY(loom_tokenize(m, text, sizeof text - 1,
                           LOOM_TOKENIZE_ADD_SPECIAL | LOOM_TOKENIZE_PARSE_SPECIAL, w->tok, 64,
                           &w->n_tok));
    LOOM_TRY(loom_detokenize(m, w->tok, w->n_tok, LOOM_DETOKENIZE_RENDER_SPECIAL, w->detok,
                             sizeof w->detok, &w->n_detok));
    const loom_chat_message msgs[3] = {
        {"system", "Be brief."}, {"user", "w1 w2?"}, {"assistant", "w3."}};
    loom_status st = loom_chat_format(m, msgs, 3, true, w->chat, sizeof w->chat, &w->n_chat);
    if (st != LOOM_OK && st != LOOM_ERR_UNSUPPORTED) return st;
    st = loom_chat_tokenize(m, msgs, 3, true, w->chat_tok, 256, &w->n_chat_tok);
    if (st != LOOM_OK && st != LOOM_ERR_UNSUPPORTED) return st;
    loom_sampler_params sp = loom_sampler_default_params();
    sp.seed = 3;
    LOOM_TRY(loom_sample(logits, m->cfg.n_vocab, &sp, 11, &w->sampled));
    loom_sampler *s = NULL;
    LOOM_TRY(loom_sampler_create(m->cfg.n_vocab, &s));
    sp.n_logprobs = 5;
    loom_token_info info = {.size = sizeof info};
    st = loom_sampler_run(s, logits, &sp, w->tok, w->n_tok, 12, &info);
    w->run_token = info.token;
    w->run_lp = info.logprob_raw;
    loom_sampler_free(s);
    return st;
}

static void sweep_all_text_once(void) {
    for (int a = 0; a < 2; a++) {
        char phase[64];
        snprintf(phase, sizeof phase, "tokenize, chat, sampler %s", g_arch[a]);
        text_work ref, w;
        memset(&ref, 0, sizeof ref);
        check_ok(text_calls(g_model[a], g_fp[a], &ref), "text calls");
        tally t = {0};
        for (int64_t n = 1;; n++) {
            assert_true(n < MAX_POINTS);
            memset(&w, 0, sizeof w);
            arm(n);
            loom_status st = text_calls(g_model[a], g_fp[a], &w);
            const bool fired = loom__alloc_fault_fired();
            loom__alloc_fault_arm(0);
            t.points += fired;
            if (st == LOOM_OK) {
                t.absorbed += fired;
                assert_memory_equal(&w, &ref, sizeof w);
            } else {
                assert_true(fired);
                expect_oom(st, phase, n);
                t.failed++;
            }
            if (!fired) break;
        }
        report(phase, &t);
        leak_check(phase);
    }
}

static void test_text(void **state) {
    (void)state;
    for (int lasting = 0; lasting < 2; lasting++) {
        g_lasting = lasting;
        sweep_all_text_once();
    }
    g_lasting = false;
}

static int setup(void **state) {
    (void)state;
    return sweep_setup("sweep", 2); /* thread pools are created and swept too */
}

int main(void) {
    /* SWEEP_ONLY=test_load: one phase (a cmocka filter pattern). */
    if (getenv("SWEEP_ONLY")) cmocka_set_test_filter(getenv("SWEEP_ONLY"));
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_load),          cmocka_unit_test(test_load_synthetic),
        cmocka_unit_test(test_engine_create), cmocka_unit_test(test_trace_write),
        cmocka_unit_test(test_session),       cmocka_unit_test(test_text),
    };
    return cmocka_run_group_tests(tests, setup, sweep_teardown);
}

#endif /* LOOM_ALLOC_FAULTS */
