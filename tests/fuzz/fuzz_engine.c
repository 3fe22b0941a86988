/* fuzz_engine.c — libFuzzer target: request validation and engine steps with fuzzed requests.
 * One small synthetic llama and two engines (preemption by recompute and by swap, a KV budget
 * small enough that preemption happens) are built once. Each input is up to four requests whose
 * every field comes from the fuzzer — NaN and infinite temperatures and penalties, negative or
 * huge top-k, empty and odd stop strings, logit bias on invalid ids, n > 1, huge max_tokens,
 * deadlines, arrivals, out-of-range prompt ids, invalid UTF-8 text — then a few steps, a
 * cancellation at a fuzzed step, and a drain. What must hold: a refused request says why; no
 * step fails as a whole; afterwards the engine is idle with its block pool whole. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/engine.h"
#include "fuzz_engine_model.h"
#include "fuzz_input.h"
#include "kv/kv_manager.h"
#include "loom.h"

enum { N_ENGINES = 2, MAX_REQS = 4, MAX_STEPS = 12, V = FUZZ_MODEL_VOCAB };

static loom_model *g_model;
static loom_engine *g_engine[N_ENGINES];

static void setup(void) {
    g_model = fuzz_engine_model("fuzz_engine");
    if (!g_model) abort();
    for (int k = 0; k < N_ENGINES; k++) {
        loom_engine_params ep = loom_engine_default_params();
        ep.kv_bytes = 96 << 10; /* a few dozen blocks: long requests preempt each other */
        ep.block_size = 8;
        ep.max_seqs = 4;
        ep.max_batched_tokens = 16;
        ep.max_ctx = 96;
        ep.preempt = k ? LOOM_PREEMPT_SWAP : LOOM_PREEMPT_RECOMPUTE;
        ep.n_sample_threads = 1;
        if (loom_engine_create(g_model, &ep, &g_engine[k]) != LOOM_OK) {
            fprintf(stderr, "fuzz_engine: setup: %s\n", loom_last_error());
            abort();
        }
    }
}

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    setup();
    return 0;
}

typedef struct fuzz_req {
    loom_request_params p;
    loom_sampler_params s;
    loom_logit_bias bias[4];
    loom_token prompt[64];
    char text[65];
    loom_token stop_tokens[3];
    char stop_mem[3][9];
    const char *stops[3];
} fuzz_req;

static void read_request(fuzz_input *in, fuzz_req *r) {
    memset(r, 0, sizeof *r);
    r->p = loom_request_default_params();
    r->s = loom_sampler_default_params();
    uint8_t shape = fz_u8(in);
    if (shape & 1) {
        size_t got;
        const char *t = fz_bytes(in, fz_u8(in) % 64, &got);
        memcpy(r->text, t, got);
        r->text[got] = '\0';
        r->p.prompt = r->text;
        r->p.parse_special = shape & 2;
        r->p.add_special = shape & 4;
    } else {
        size_t n = fz_u8(in) % 64;
        for (size_t i = 0; i < n; i++) {
            uint8_t b = fz_u8(in);
            r->prompt[i] = b < 250 ? (loom_token)(b + 3) : (loom_token)fz_i32(in); /* odd ids */
        }
        r->p.prompt_tokens = r->prompt;
        r->p.n_prompt_tokens = n;
    }
    r->s.temperature = fz_float(in);
    r->s.top_k = fz_i32(in);
    r->s.top_p = fz_float(in);
    r->s.min_p = shape & 8 ? fz_float(in) : 0.0f;
    r->s.seed = fz_u64(in);
    if (shape & 16) {
        r->s.typical_p = fz_float(in);
        r->s.repeat_penalty = fz_float(in);
        r->s.presence_penalty = fz_float(in);
        r->s.frequency_penalty = fz_float(in);
        r->s.penalty_last_n = fz_i32(in);
        r->s.entropy_mode = (loom_entropy_mode)(fz_u8(in) % 5); /* 4: invalid */
        r->s.exp_beta = fz_float(in);
        r->s.edt_n = fz_float(in);
        r->s.edt_theta = fz_float(in);
        r->s.dyn_t_min = fz_float(in);
        r->s.dyn_t_max = fz_float(in);
    }
    r->s.n_logprobs = fz_u8(in) % 24 - 2;
    size_t nb = fz_u8(in) % 5;
    for (size_t i = 0; i < nb; i++) r->bias[i] = (loom_logit_bias){fz_i32(in), fz_float(in)};
    r->s.logit_bias = nb ? r->bias : NULL;
    r->s.n_logit_bias = nb;
    r->p.sampler = &r->s;
    r->p.max_tokens = shape & 32 ? fz_i32(in) : fz_u8(in) % 20;
    r->p.n = fz_u8(in) % 5; /* 0 is invalid */
    size_t ns = fz_u8(in) % 4;
    for (size_t i = 0; i < ns; i++) {
        size_t got;
        const char *t = fz_bytes(in, fz_u8(in) % 9, &got);
        memcpy(r->stop_mem[i], t, got);
        r->stop_mem[i][got] = '\0';
        r->stops[i] = r->stop_mem[i];
    }
    r->p.stop_strings = ns ? r->stops : NULL;
    r->p.n_stop_strings = ns;
    size_t nt = fz_u8(in) % 4;
    for (size_t i = 0; i < nt; i++) r->stop_tokens[i] = fz_i32(in);
    r->p.stop_tokens = nt ? r->stop_tokens : NULL;
    r->p.n_stop_tokens = nt;
    r->p.ignore_eos = shape & 64;
    r->p.priority = fz_i32(in);
    if (shape & 128) {
        r->p.ttft_deadline_s = fz_float(in);
        r->p.tpot_deadline_s = fz_float(in);
        float a = fz_float(in);
        r->p.arrival_s = a > 0 ? loom_engine_now() - a : a; /* mostly in the past */
    }
    r->p.cache_salt = fz_u8(in) % 3;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!g_model) setup(); /* the replay driver calls no initializer */
    fuzz_input in = {data, size};
    uint8_t head = fz_u8(&in);
    loom_engine *e = g_engine[head % N_ENGINES];
    size_t n_req = (size_t)(head / N_ENGINES) % MAX_REQS + 1;
    static fuzz_req reqs[MAX_REQS];
    loom_request_id ids[MAX_REQS];
    size_t n_ok = 0;
    for (size_t i = 0; i < n_req; i++) {
        read_request(&in, &reqs[i]);
        loom_request_id id = 0;
        loom_status st = loom_engine_submit(e, &reqs[i].p, &id);
        if (st == LOOM_OK) {
            ids[n_ok++] = id;
        } else if (loom_last_error()[0] == '\0') {
            abort(); /* a refusal must say why */
        }
    }
    uint8_t cancel_at = fz_u8(&in) % (MAX_STEPS + 4);
    for (int step = 0; step < MAX_STEPS && loom_engine_has_work(e); step++) {
        if (step == cancel_at && n_ok > 0) (void)loom_engine_cancel(e, ids[0]);
        const loom_event *const *ev = NULL;
        size_t n_ev = 0;
        if (loom_engine_step(e, &ev, &n_ev) != LOOM_OK) abort(); /* requests fail, steps not */
        for (size_t k = 0; k < n_ev; k++) {
            if (ev[k]->kind == LOOM_EVENT_TOKEN && (ev[k]->token < 0 || ev[k]->token >= V)) abort();
        }
    }
    for (size_t i = 0; i < n_ok; i++) (void)loom_engine_cancel(e, ids[i]);
    for (int guard = 0; loom_engine_has_work(e); guard++) {
        const loom_event *const *ev = NULL;
        size_t n_ev = 0;
        if (guard > 8 || loom_engine_step(e, &ev, &n_ev) != LOOM_OK) abort(); /* cancel ends */
    }
    loom_engine_stats st = {.size = sizeof st};
    if (loom_engine_get_stats(e, &st) != LOOM_OK || st.running || st.waiting || st.kv_blocks_used)
        abort();
    if (loom__kv_check(e->kv) != LOOM_OK) abort();
    return 0;
}
