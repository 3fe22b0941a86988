/* fuzz_replay.c — libFuzzer target: the engine's input record as untrusted input
 * (loom_engine_create_replay, src/engine/record.c). A small synthetic llama records one run once
 * (requests with n = 2, stop strings, sampling, deadlines, a cancellation); each input is then
 * either a whole file (when it starts with the record's magic) or a list of edits of that valid
 * record — 4 bytes each: a 16-bit offset, an operation (flip bits, set, truncate, insert) and a
 * value — so that mutations reach deep into well-formed records. The record is replayed to its
 * end. What must hold: a record is refused, or a step fails, with a status and a message; a
 * replay that runs leaves the engine's block pool whole (loom__kv_check). Records asking for
 * more than 64 MB of KV cache or contexts above 4096 are skipped: a record may ask for what
 * its machine had, and the fuzzer's memory limit is not the library's. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine/engine.h"
#include "engine/record.h"
#include "fuzz_engine_model.h"
#include "fuzz_input.h"
#include "kv/kv_manager.h"
#include "loom.h"

enum { MAX_STEPS = 400, MAX_FILE = 1 << 20 };

static loom_model *g_model;
static uint8_t *g_base; /* the recorded run's file */
static size_t g_base_n;
static char g_path[256];

static void remove_record(void) {
    if (g_path[0]) remove(g_path);
}

static void die(const char *what) {
    fprintf(stderr, "fuzz_replay: setup: %s: %s\n", what, loom_last_error());
    abort();
}

static void submit(loom_engine *e, int i, loom_request_id *id) {
    loom_token prompt[12];
    for (int k = 0; k < 12; k++) prompt[k] = (loom_token)(3 + (i * 37 + k * 11) % 300);
    loom_sampler_params sp = loom_sampler_default_params();
    sp.temperature = i % 2 ? 0.9f : 0.0f;
    sp.seed = (uint64_t)i;
    sp.n_logprobs = i % 3 == 0 ? 2 : 0;
    loom_logit_bias bias = {.id = 5, .bias = -1.0f};
    sp.logit_bias = &bias;
    sp.n_logit_bias = (size_t)(i % 2);
    loom_request_params p = loom_request_default_params();
    p.prompt_tokens = prompt;
    p.n_prompt_tokens = (size_t)(4 + i % 8);
    p.sampler = &sp;
    p.max_tokens = 6 + i % 5;
    p.n = i % 4 == 1 ? 2 : 1;
    const char *stops[] = {" w1", "x"};
    p.stop_strings = stops;
    p.n_stop_strings = (size_t)(i % 3);
    loom_token stop_tok = 300;
    p.stop_tokens = &stop_tok;
    p.n_stop_tokens = (size_t)(i % 2);
    p.priority = i % 3;
    p.ttft_deadline_s = i % 4 == 3 ? 0.5 : 0.0;
    p.cache_salt = (uint64_t)(i % 2);
    if (loom_engine_submit(e, &p, id) != LOOM_OK) die("submit");
}

static void setup(void) {
    g_model = fuzz_engine_model("fuzz_replay");
    if (!g_model) die("model");
    const char *tmp = getenv("TMPDIR");
    snprintf(g_path, sizeof g_path, "%s/loom-fuzz-replay-%d.rec", tmp && *tmp ? tmp : "/tmp",
             (int)getpid());
    atexit(remove_record);
    loom_engine_params ep = loom_engine_default_params();
    ep.kv_bytes = 64 << 10; /* a few blocks: preemption */
    ep.block_size = 8;
    ep.max_seqs = 3;
    ep.max_batched_tokens = 12;
    ep.max_ctx = 64;
    ep.starvation_s = 0.001;
    ep.max_logprobs = 2;
    ep.n_sample_threads = 1;
    ep.record_path = g_path;
    loom_engine *e = NULL;
    if (loom_engine_create(g_model, &ep, &e) != LOOM_OK) die("engine");
    loom_request_id ids[8];
    for (int t = 0, next = 0; next < 8 || loom_engine_has_work(e); t++) {
        if (next < 8 && t % 2 == 0) submit(e, next, &ids[next]), next++;
        if (t == 4) (void)loom_engine_cancel(e, ids[1]);
        const loom_event *const *ev;
        size_t n;
        if (loom_engine_step(e, &ev, &n) != LOOM_OK) die("step");
        if (t > 10000) die("the recorded run never ends");
    }
    loom_engine_destroy(e);
    FILE *f = fopen(g_path, "rb");
    if (!f) die("reading the record back");
    g_base = malloc(MAX_FILE);
    g_base_n = g_base ? fread(g_base, 1, MAX_FILE, f) : 0;
    fclose(f);
    if (g_base_n < 64) die("a record that short");
}

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    setup();
    return 0;
}

/* The header's little-endian integer of `bytes` at off, or 0 past the end. */
static uint64_t field(const uint8_t *b, size_t n, size_t off, int bytes) {
    uint64_t v = 0;
    for (int i = bytes - 1; i >= 0; i--)
        v = v << 8 | (off + (size_t)i < n ? b[off + (size_t)i] : 0);
    return v;
}

/* Whether the header asks for more memory than a fuzzing run may spend (record.c's layout:
 * magic, version, arch, 8 shape fields, the backend name, then kv_bytes ... max_ctx). */
static bool too_big(const uint8_t *b, size_t n) {
    size_t name = (size_t)field(b, n, 48, 4);
    if (name > 64) return false; /* refused by the reader */
    size_t at = 52 + name;
    int64_t kv_bytes = (int64_t)field(b, n, at, 8);
    int32_t max_ctx = (int32_t)field(b, n, at + 20, 4);
    return kv_bytes > (64 << 20) || max_ctx > 4096;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!g_model) setup();
    static uint8_t *buf;
    if (!buf && !(buf = malloc(MAX_FILE + 4096))) return 0;
    size_t n;
    if (size >= 8 && memcmp(data, LOOM__RECORD_MAGIC, 8) == 0) {
        n = size < MAX_FILE ? size : MAX_FILE;
        memcpy(buf, data, n);
    } else {
        memcpy(buf, g_base, g_base_n);
        n = g_base_n;
        fuzz_input in = {data, size};
        while (in.n >= 4) {
            size_t off = (size_t)(fz_u8(&in) | fz_u8(&in) << 8);
            uint8_t op = fz_u8(&in), v = fz_u8(&in);
            if (n == 0) break;
            off %= n;
            switch (op % 4) {
            case 0:
                buf[off] ^= (uint8_t)(1u << (v % 8));
                break;
            case 1:
                buf[off] = v;
                break;
            case 2:
                n = off;
                break;
            default:
                if (n < MAX_FILE + 4096) {
                    memmove(buf + off + 1, buf + off, n - off);
                    buf[off] = v;
                    n++;
                }
            }
        }
    }
    if (too_big(buf, n)) return 0;
    FILE *f = fopen(g_path, "wb");
    if (!f) return 0;
    size_t wrote = fwrite(buf, 1, n, f);
    fclose(f);
    if (wrote != n) return 0;

    loom_engine *e = NULL;
    loom_status st = loom_engine_create_replay(g_model, g_path, NULL, &e);
    if (st != LOOM_OK) {
        if (!*loom_last_error()) abort(); /* a refusal names its reason */
        return 0;
    }
    for (int k = 0; k < MAX_STEPS && loom_engine_has_work(e); k++) {
        const loom_event *const *ev;
        size_t n_ev;
        st = loom_engine_step(e, &ev, &n_ev);
        if (st != LOOM_OK) {
            if (!*loom_last_error()) abort();
            break;
        }
    }
    if (st == LOOM_OK && loom__kv_check(e->kv) != LOOM_OK) {
        fprintf(stderr, "fuzz_replay: the block pool is not whole: %s\n", loom_last_error());
        abort();
    }
    loom_engine_destroy(e);
    return 0;
}
