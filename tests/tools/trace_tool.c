/* trace_tool — writes a per-token trace in both formats for tests/conformance/test_trace.py
 * (and for trying examples/loom-trace-plot), until the engine records traces itself.
 *
 *   trace_tool OUT_PREFIX                      synthetic: 3 requests (one with 2 samples) over
 *                                              40 steps, busy-work phases with real timings,
 *                                              awkward text pieces, an entropy spike
 *   trace_tool OUT_PREFIX MODEL [N] [PROMPT]   real: decodes PROMPT with MODEL (2 threads) and
 *                                              samples N tokens (default 24) with the sampler
 *                                              chain (EDT entropy correction), one step each
 *
 * Writes OUT_PREFIX.jsonl (LOOM_TRACE_JSONL) and OUT_PREFIX.json (LOOM_TRACE_CHROME) through
 * the public writer. Exit 1 with the reason on failure. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/timer.h"
#include "loom.h"
#include "sample/chain.h"
#include "trace/trace.h"

static volatile double busy_sink;

/* Spends roughly n * 2 ns so phases have durations of different sizes. */
static void busy(int n) {
    double a = 0;
    for (int i = 0; i < n; i++) a += sqrt((double)i);
    busy_sink += a;
}

static int fail(const char *what, loom_status st) {
    fprintf(stderr, "trace_tool: %s: %s: %s\n", what, loom_status_str(st), loom_last_error());
    return 1;
}

static int write_both(const loom_trace *t, const char *prefix) {
    char path[4096];
    snprintf(path, sizeof path, "%s.jsonl", prefix);
    loom_status st = loom_trace_write(t, path, LOOM_TRACE_JSONL);
    if (st != LOOM_OK) return fail("write jsonl", st);
    snprintf(path, sizeof path, "%s.json", prefix);
    st = loom_trace_write(t, path, LOOM_TRACE_CHROME);
    if (st != LOOM_OK) return fail("write chrome", st);
    return 0;
}

/* ---- synthetic ------------------------------------------------------------------------- */

static int synthetic(loom_trace *t) {
    static const char *pieces[] = {
        "The",  " loom",       " \"weaves\"",      "\\",  "\n", "\xe2\x82",
        "\xac", "caf\xc3\xa9", "\xf0\x9f\xa7\xb5", "\x01"};
    static const char *groups[] = {"forward.layers 0-5", "forward.layers 6-11",
                                   "forward.layers 12-17"};
    const int n_pieces = (int)(sizeof pieces / sizeof pieces[0]);
    /* streams: request 1, request 2 (samples 0 and 1, from step 5), request 3 (from step 12) */
    const loom_request_id reqs[] = {1, 2, 2, 3};
    const int32_t samples[] = {0, 0, 1, 0};
    const int first_step[] = {0, 5, 5, 12};
    const int64_t arrival = loom__now_ns();
    loom__trace_timer tm;
    for (int step = 0; step < 40; step++) {
        loom__trace_step_begin(&tm, step, loom__now_ns());
        busy(2000);
        loom__trace_step_phase(&tm, "schedule", loom__now_ns());
        for (int g = 0; g < 3; g++) {
            busy(20000 + 5000 * g);
            loom__trace_step_phase(&tm, groups[g], loom__now_ns());
        }
        busy(15000);
        loom__trace_step_phase(&tm, "logits", loom__now_ns());
        int n_seqs = 0;
        for (int s = 0; s < 4; s++) {
            if (step < first_step[s]) continue;
            n_seqs++;
            int i = step - first_step[s];
            busy(1000);
            /* a smooth entropy curve with a spike at i == 17 (where the plot should mark) */
            double h = 1.0 + 0.5 * sin(0.4 * i + (double)s) + (i == 17 ? 3.0 : 0.0);
            double hf = 0.6 * h;
            float lp = (float)(i == 17 ? -4.0 : -0.1 - 0.05 * (i % 5));
            const char *piece = pieces[(i + s) % n_pieces];
            int64_t now = loom__now_ns();
            loom__trace_token k = {
                .request = reqs[s],
                .sample = samples[s],
                .step = step,
                .pos = 8 + i,
                .token = 100 + (i + s) % n_pieces,
                .piece = piece,
                .piece_len = strlen(piece),
                .logprob_raw = lp - 0.2f,
                .logprob_final = lp,
                .entropy = h,
                .entropy_final = hf,
                .varentropy = 0.5 * h,
                .temperature = 0.8,
                .t_ns = now,
                .since_arrival_ns = now - arrival,
            };
            loom_status st = loom__trace_add_token(t, &k);
            if (st != LOOM_OK) return fail("add token", st);
        }
        loom__trace_step_phase(&tm, "sample", loom__now_ns());
        busy(500);
        loom_status st = loom__trace_step_end(t, &tm, "events", loom__now_ns(), n_seqs, n_seqs);
        if (st != LOOM_OK) return fail("add step", st);
    }
    return 0;
}

/* ---- a real model ---------------------------------------------------------------------- */

static int real(loom_trace *t, const char *model_path, int n_gen, const char *prompt) {
    int rc = 1;
    loom_model *m = NULL;
    loom_session *s = NULL;
    void *mem = NULL;
    loom_token *toks = NULL;
    loom_model_params mp = loom_model_default_params();
    mp.n_threads = 2;
    loom_status st = loom_model_load(model_path, &mp, &m);
    if (st != LOOM_OK) return fail("load", st);
    loom_model_info info = {.size = sizeof info};
    loom_model_get_info(m, &info);
    st = loom_session_create(m, NULL, &s);
    if (st != LOOM_OK) {
        rc = fail("session", st);
        goto out;
    }
    size_t n_prompt = 0;
    (void)loom_tokenize(m, prompt, strlen(prompt), LOOM_TOKENIZE_ADD_SPECIAL, NULL, 0, &n_prompt);
    toks = malloc((n_prompt + 1) * sizeof *toks);
    if (!toks) goto out;
    st = loom_tokenize(m, prompt, strlen(prompt), LOOM_TOKENIZE_ADD_SPECIAL, toks, n_prompt,
                       &n_prompt);
    if (st != LOOM_OK) {
        rc = fail("tokenize", st);
        goto out;
    }
    size_t ws_size = loom__sample_chain_workspace_size(info.n_vocab);
    mem = aligned_alloc(16, (ws_size + 15) / 16 * 16);
    loom__sample_chain_ws *ws = NULL;
    if (!mem || loom__sample_chain_workspace_init(mem, ws_size, info.n_vocab, &ws) != LOOM_OK)
        goto out;
    loom__sample_chain_config cfg = loom__sample_chain_default_config();
    cfg.entropy_mode = LOOM_ENTROPY_EDT;
    cfg.seed = 42;
    const int64_t arrival = loom__now_ns();
    loom__trace_timer tm;
    loom_token next = 0;
    for (int step = 0; step < n_gen; step++) {
        loom__trace_step_begin(&tm, step, loom__now_ns());
        loom__trace_step_phase(&tm, "schedule", loom__now_ns());
        const loom_token *in = step == 0 ? toks : &next;
        int32_t n_in = step == 0 ? (int32_t)n_prompt : 1;
        int32_t pos = loom_session_n_past(s) + n_in - 1;
        st = loom_session_decode(s, in, n_in, false);
        if (st != LOOM_OK) {
            rc = fail("decode", st);
            goto out;
        }
        loom__trace_step_phase(&tm, "forward", loom__now_ns());
        const float *logits = loom_session_logits(s, -1);
        loom__sample_chain_result res = {0};
        st = loom__sample_chain_run(ws, &cfg, logits, NULL, 0, (uint64_t)pos + 1, &res);
        if (st != LOOM_OK) {
            rc = fail("sample", st);
            goto out;
        }
        loom__trace_step_phase(&tm, "sample", loom__now_ns());
        next = res.token;
        char piece[256];
        size_t n_piece = 0;
        if (loom_token_to_piece(m, next, 0, piece, sizeof piece, &n_piece) != LOOM_OK) n_piece = 0;
        int64_t now = loom__now_ns();
        loom__trace_token k = {
            .request = 1,
            .step = step,
            .pos = pos + 1,
            .token = next,
            .piece = piece,
            .piece_len = n_piece,
            .logprob_raw = res.logprob_raw,
            .logprob_final = res.logprob_final,
            .entropy = res.entropy,
            .entropy_final = res.entropy_final,
            .varentropy = res.varentropy,
            .temperature = res.temperature,
            .t_ns = now,
            .since_arrival_ns = now - arrival,
        };
        (void)loom__trace_add_token(t, &k);
        st = loom__trace_step_end(t, &tm, "events", loom__now_ns(), 1, n_in);
        if (st != LOOM_OK) {
            rc = fail("add step", st);
            goto out;
        }
        if (next == info.eos) break;
    }
    rc = 0;
out:
    free(mem);
    free(toks);
    loom_session_free(s);
    loom_model_free(m);
    return rc;
}

int main(int argc, char **argv) {
    if (argc < 2 || argc > 5) {
        fprintf(stderr, "usage: trace_tool OUT_PREFIX [MODEL [N] [PROMPT]]\n");
        return 2;
    }
    loom_trace *t = NULL;
    loom_status st = loom_trace_create(&t);
    if (st != LOOM_OK) return fail("create", st);
    int rc = argc == 2 ? synthetic(t)
                       : real(t, argv[2], argc > 3 ? atoi(argv[3]) : 24,
                              argc > 4 ? argv[4] : "The weaver sat at the loom and");
    if (rc == 0) rc = write_both(t, argv[1]);
    loom_trace_free(t);
    return rc;
}
