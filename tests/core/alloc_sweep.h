/* alloc_sweep.h — the harness of the allocation-failure sweeps (test_alloc_sweep.c: model
 * load, engine creation, sessions, the tokenizer, traces; test_alloc_sweep_engine.c: submit,
 * engine steps, bursts, loom_engine_generate), for a LOOM_ALLOC_FAULTS build (core/alloc.h).
 * A sweep runs one piece of work for every N = 1, 2, ... with the N-th allocation from its start
 * made to fail (or, "lasting", every allocation from the N-th on), until a run completes with
 * no failure fired: every allocation point is swept, none skipped. Here: the failure modes,
 * the outcome counts each phase prints, the leak check after each phase (LeakSanitizer), and
 * the fixtures: two small synthetic models (llama, gemma3; tests/model/synth_model.h), their
 * fingerprints (logits of a short decode), engines with small KV pools, and a fresh request
 * every usable engine must run to the same tokens. SWEEP_STACKS=1 prints the stack of each
 * allocation made to fail. */
#pragma once

#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "core/alloc.h"
#include "engine/engine.h"
#include "model/synth_model.h"

#if defined(__SANITIZE_ADDRESS__)
#define SWEEP_LSAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define SWEEP_LSAN 1
#endif
#endif
#ifdef SWEEP_LSAN
#include <sanitizer/common_interface_defs.h>
#include <sanitizer/lsan_interface.h>
#endif

/* A run that keeps firing past this many points has an allocation count that never ends. */
#define MAX_POINTS 200000

/* ==== failure modes =========================================================================== */

/* The sweeps of single calls run twice: with one failing allocation (the N-th), then with a
 * lasting failure (the N-th and every one after it, so the cleanup after the first failure
 * meets failures too). The sweeps of whole runs (steps, bursts) make one fail only: their
 * runs retry what failed, which a lasting failure would fail again. */
static bool g_lasting;

static inline void arm(int64_t n) {
    if (g_lasting)
        loom__alloc_fault_arm_sticky(n);
    else
        loom__alloc_fault_arm(n);
}

/* ==== outcomes ================================================================================ */

typedef struct tally {
    int64_t points;   /* failure points swept (runs in which the armed failure fired) */
    int64_t failed;   /* the operation returned OUT_OF_MEMORY, cleanly */
    int64_t absorbed; /* the operation succeeded anyway (a fallback, a dropped trace record) */
    int64_t step_err; /* steps: a step returned an error status */
    int64_t req_fail; /* steps: a request failed (FAILED event), the others went on */
} tally;

static inline void report(const char *phase, const tally *t) {
    char name[96];
    snprintf(name, sizeof name, "%s%s", phase, g_lasting ? " (lasting)" : "");
    printf("sweep %-44s %6lld failure points: %lld failed cleanly, %lld absorbed", name,
           (long long)t->points, (long long)t->failed, (long long)t->absorbed);
    if (t->step_err || t->req_fail)
        printf(", %lld step errors, %lld requests failed", (long long)t->step_err,
               (long long)t->req_fail);
    printf("\n");
    fflush(stdout);
}

/* Leaks are looked for after each phase, so a report names the phase that leaked. */
static inline void leak_check(const char *phase) {
#ifdef SWEEP_LSAN
    if (__lsan_do_recoverable_leak_check() != 0)
        fail_msg("%s: memory leaked (LeakSanitizer's report above)", phase);
#else
    (void)phase;
#endif
}

/* A failed operation: OUT_OF_MEMORY, with a message. */
static inline void expect_oom(loom_status st, const char *what, int64_t n) {
    if (st != LOOM_ERR_OUT_OF_MEMORY)
        fail_msg("%s, allocation %lld failing: %s (%s), wanted OUT_OF_MEMORY", what, (long long)n,
                 loom_status_str(st), loom_last_error());
    if (loom_last_error()[0] == '\0')
        fail_msg("%s, allocation %lld failing: OUT_OF_MEMORY without a message", what,
                 (long long)n);
}

static inline void check_ok(loom_status st, const char *what) {
    if (st != LOOM_OK) fail_msg("%s: %s (%s)", what, loom_status_str(st), loom_last_error());
}

/* ==== fixtures ================================================================================ */

/* Compute threads of the models (and sampling threads of the engines): 2 where creating their
 * pools is swept, 1 where whole runs are (thread pools that spin while waiting make a sweep of
 * thousands of runs several times slower on a busy machine, and their creation is swept
 * elsewhere). */
static int g_threads = 2;
static char g_path[2][512]; /* llama, gemma3 */
static const char *const g_arch[2] = {"llama", "gemma3"};
static loom_model *g_model[2];

static inline loom_model_params model_params(bool mmap) {
    loom_model_params p = loom_model_default_params();
    p.backend = "cpu";
    p.n_threads = g_threads;
    p.use_mmap = mmap;
    return p;
}

static inline void prompt_of(int r, loom_token *p, int n) {
    for (int i = 0; i < n; i++) p[i] = (loom_token)(4 + (r * 41 + i * 19) % 280);
}

/* ---- a model's fingerprint: the logits of a short decode ------------------------------------- */

#define FP_TOKENS 5
static float g_fp[2][512]; /* [arch][n_vocab] */

static inline void fingerprint(loom_model *m, float *out) {
    loom_session_params sp = loom_session_default_params();
    sp.n_ctx = 32;
    sp.block_size = 4;
    loom_session *s = NULL;
    check_ok(loom_session_create(m, &sp, &s), "fingerprint session");
    loom_token t[FP_TOKENS];
    prompt_of(7, t, FP_TOKENS);
    check_ok(loom_session_decode(s, t, FP_TOKENS, false), "fingerprint decode");
    memcpy(out, loom_session_logits(s, -1), (size_t)m->cfg.n_vocab * sizeof *out);
    loom_session_free(s);
}

static inline void check_fingerprint(loom_model *m, int arch, const char *what) {
    float fp[512];
    fingerprint(m, fp);
    if (memcmp(fp, g_fp[arch], (size_t)m->cfg.n_vocab * sizeof *fp) != 0)
        fail_msg("%s: the model computes other logits than a fault-free one", what);
}

/* ---- engines ------------------------------------------------------------------------------- */

#define BS         4
#define MAX_CTX    48
#define ROOMY_POOL 40 /* blocks: room for every request of a batch at once */

/* Bytes for n_blocks blocks in every KV group (the full-attention pool gets at least that). */
static inline int64_t kv_budget(const loom_model *m, int n_blocks) {
    int64_t b = 0;
    for (int32_t g = 0; g < m->cfg.n_kv_groups; g++)
        b += (int64_t)loom__kv_storage_block_bytes(m, NULL, NULL, LOOM_TYPE_F16, BS, g);
    return b * n_blocks;
}

static inline loom_engine_params engine_params(const loom_model *m, int n_blocks,
                                               loom_preempt_mode pm) {
    loom_engine_params ep = loom_engine_default_params();
    ep.kv_bytes = kv_budget(m, n_blocks);
    ep.block_size = BS;
    ep.max_ctx = MAX_CTX;
    ep.max_batched_tokens = 12; /* prompts are prefilled in chunks */
    ep.max_seqs = 4;
    ep.preempt = pm;
    ep.n_sample_threads = g_threads; /* with 2, a sampling pool too */
    ep.max_logprobs = 4;
    return ep;
}

static inline loom_engine *make_engine_traced(loom_model *m, int n_blocks, loom_preempt_mode pm,
                                              loom_trace *trace) {
    loom_engine_params ep = engine_params(m, n_blocks, pm);
    ep.trace = trace;
    loom_engine *e = NULL;
    check_ok(loom_engine_create(m, &ep, &e), "engine");
    return e;
}

static inline loom_engine *make_engine(loom_model *m, int n_blocks, loom_preempt_mode pm) {
    loom_engine_params ep = engine_params(m, n_blocks, pm);
    loom_engine *e = NULL;
    check_ok(loom_engine_create(m, &ep, &e), "engine");
    return e;
}

/* The KV pools are whole and nothing holds a block (every request has ended). */
static inline void check_kv_whole(loom_engine *e, const char *what) {
    loom_status st = loom__kv_check(e->kv);
    if (st != LOOM_OK) fail_msg("%s: KV manager: %s", what, loom_last_error());
    for (int32_t g = 0; g < e->n_groups; g++) {
        loom__kv_group_stats gs;
        check_ok(loom__kv_get_group_stats(e->kv, g, &gs), "kv group stats");
        if (gs.n_used != 0 || gs.n_used + gs.n_cached + gs.n_free != gs.n_blocks)
            fail_msg("%s: KV group %d: %d used, %d cached, %d free of %d blocks", what, g,
                     gs.n_used, gs.n_cached, gs.n_free, gs.n_blocks);
    }
    loom_engine_stats es = {.size = sizeof es};
    check_ok(loom_engine_get_stats(e, &es), "stats");
    if (es.running != 0 || es.waiting != 0)
        fail_msg("%s: %d running, %d waiting after every request ended", what, es.running,
                 es.waiting);
}

/* ---- the fresh request: a request every engine must run to the same tokens ------------------ */

#define F_TOKENS 8
static loom_token g_fresh_ref[2][F_TOKENS];

static inline void fresh_request(loom_token *prompt, loom_sampler_params *sp,
                                 loom_request_params *rq) {
    prompt_of(5, prompt, 14);
    *sp = loom_sampler_default_params();
    sp->temperature = 0.0f;
    *rq = loom_request_default_params();
    rq->prompt_tokens = prompt;
    rq->n_prompt_tokens = 14;
    rq->max_tokens = F_TOKENS;
    rq->ignore_eos = true;
    rq->sampler = sp;
}

static inline void run_fresh(loom_engine *e, loom_token *out) {
    loom_token prompt[14];
    loom_sampler_params sp;
    loom_request_params rq;
    fresh_request(prompt, &sp, &rq);
    loom_generation *g = NULL;
    check_ok(loom_engine_generate(e, &rq, NULL, NULL, &g), "fresh request");
    assert_int_equal(g->n_tokens, F_TOKENS);
    memcpy(out, g->tokens, sizeof *out * F_TOKENS);
    loom_generation_free(g);
}

/* After a fault: the engine runs a fresh request to the reference tokens, its pools whole. */
static inline void check_engine_usable(loom_engine *e, int arch, const char *what) {
    loom_token t[F_TOKENS];
    run_fresh(e, t);
    if (memcmp(t, g_fresh_ref[arch], sizeof t) != 0)
        fail_msg("%s: a fresh request after the fault gives other tokens", what);
    check_kv_whole(e, what);
}

/* ==== setup: the models and their references, with no fault armed ============================ */

#ifdef SWEEP_LSAN
/* SWEEP_STACKS=1: the stack of every allocation made to fail, to see where a point lies. */
static inline void print_fault_stack(void) {
    printf("---- allocation %lld fails:\n", (long long)loom__alloc_count());
    fflush(stdout);
    __sanitizer_print_stack_trace();
}
#endif

/* Writes the two models (files named after tag, so programs may run at once), loads them with
 * n_threads compute threads, and takes their fingerprints and fresh-request tokens. 0 on
 * success. */
static inline int sweep_setup(const char *tag, int n_threads) {
    g_threads = n_threads;
    loom__alloc_fault_arm(0);
#ifdef SWEEP_LSAN
    if (getenv("SWEEP_STACKS")) loom__alloc_fault_hook = print_fault_stack;
#endif
    for (int a = 0; a < 2; a++) {
        char name[64];
        snprintf(name, sizeof name, "%s-%s.gguf", tag, g_arch[a]);
        synth_path(g_path[a], sizeof g_path[a], name);
        if (synth_write(g_path[a], a ? &SYNTH_GEMMA3 : &SYNTH_LLAMA, 41 + (uint64_t)a) != 0)
            return -1;
        loom_model_params p = model_params(true);
        if (loom_model_load(g_path[a], &p, &g_model[a]) != LOOM_OK) return -1;
        fingerprint(g_model[a], g_fp[a]);
        loom_engine *e = make_engine(g_model[a], ROOMY_POOL, LOOM_PREEMPT_RECOMPUTE);
        run_fresh(e, g_fresh_ref[a]);
        loom_engine_destroy(e);
    }
    return 0;
}

static inline int sweep_teardown(void **state) {
    (void)state;
    for (int a = 0; a < 2; a++) loom_model_free(g_model[a]);
    return 0;
}
