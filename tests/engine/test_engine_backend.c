/* test_engine_backend.c — what the engine asks of its backend, counted through a recording
 * backend (the CPU ops table with counting wrappers, installed on a loaded model):
 *   - a copy-on-write costs one backend call (copy_batch) for all its groups and layers, and a
 *     swap-out or a swap-in of a sequence one call for all its blocks — where it used to take
 *     2 x n_layers calls per block;
 *   - each forward pass hands the backend all its KV descriptors at once (step_begin), and
 *     kv_store / attention then receive one of those very descriptors;
 *   - a stream sized for the engine's largest step (stream_create with the step shape) never
 *     grows its workspace while running steps of that size, quantized or float32 activations.
 * The tokens are checked too: the same requests on a roomy engine without preemption give the
 * same tokens as with swapping. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "backend/cpu/cpu_internal.h"
#include "engine/engine.h"
#include "model/synth_model.h"
#include "sample/chain.h"

static char g_path[2][512];

/* ---- the recording backend ------------------------------------------------------------------ */

static const loom_backend_ops *g_real;
static loom_backend_ops g_rec;
static int64_t g_copy_calls[3], g_copy_ranges[3]; /* per loom_copy_kind */
static int64_t g_steps, g_bad_kv, g_kv_ops;
static loom_step_desc g_step;

static loom_status rec_copy_batch(void *s, loom_copy_kind k, const loom_copy_range *r, size_t n) {
    g_copy_calls[k]++;
    g_copy_ranges[k] += (int64_t)n;
    return g_real->copy_batch(s, k, r, n);
}

static loom_status rec_step_begin(void *s, const loom_step_desc *d) {
    (void)s;
    g_steps++;
    g_step = *d;
    return LOOM_OK;
}

/* kv must be one of the descriptors the step began with (the same address). */
static void note_kv(const loom_kv_desc *kv) {
    g_kv_ops++;
    if (kv < g_step.kv || kv >= g_step.kv + g_step.n_kv) g_bad_kv++;
}

static loom_status rec_kv_store(void *s, const loom_tensor *k, const loom_tensor *v,
                                const loom_kv_desc *kv, int32_t layer) {
    note_kv(kv);
    return g_real->kv_store(s, k, v, kv, layer);
}

static loom_status rec_attention(void *s, const loom_tensor *q, const loom_kv_desc *kv,
                                 const loom_attn_params *p, loom_tensor *out) {
    note_kv(kv);
    return g_real->attention(s, q, kv, p, out);
}

/* A logits_summary slot for the CPU ops table (which has none: its rows are host memory
 * already): each row fetched through tensor_get and summarized, with its edits, by the host's
 * summarizer, as a device backend's kernels would, so the engine's device path runs end to
 * end. */
static int64_t g_summary_rows, g_edited_rows, g_logit_bytes;
static int64_t g_vocab;
static loom_status rec_logits_summary(void *s, const loom_tensor *logits, int32_t n_top,
                                      const loom_logit_edits *edits, loom_logit_summary *sum,
                                      loom_logit_cand *top, loom_logit_summary *raw_sum,
                                      loom_logit_cand *raw_top, float *edit_raw) {
    const int64_t V = logits->ne[0];
    float *row = malloc((size_t)V * sizeof *row), *scratch = malloc((size_t)V * sizeof *row);
    loom_status st = row && scratch ? LOOM_OK : LOOM_ERR_OUT_OF_MEMORY;
    for (int64_t r = 0; st == LOOM_OK && r < logits->ne[1]; r++) {
        st = g_real->tensor_get(s, row, (const char *)logits->data + r * logits->row_stride,
                                (size_t)V * 4);
        if (st != LOOM_OK) break;
        const loom_logit_edits *e = edits ? &edits[r] : NULL;
        loom__sample_logits_summarize_edited(
            row, (int32_t)V, n_top, e, scratch, &sum[r], top + r * n_top,
            raw_sum ? &raw_sum[r] : NULL, raw_top ? raw_top + r * n_top : NULL,
            edit_raw ? edit_raw + r * LOOM_LOGIT_SUMMARY_MAX_EDITS : NULL);
        g_summary_rows++;
        g_edited_rows += e != NULL && e->n_bias + e->n_pen > 0;
    }
    free(row);
    free(scratch);
    return st;
}

/* Counts the bytes of whole logit rows the engine copies (transfers of exactly k rows). */
static loom_status rec_tensor_get(void *s, void *dst, const void *src, size_t bytes) {
    if (g_vocab > 0 && bytes % ((size_t)g_vocab * 4) == 0) g_logit_bytes += (int64_t)bytes;
    return g_real->tensor_get(s, dst, src, bytes);
}

static void reset_counts(void) {
    memset(g_copy_calls, 0, sizeof g_copy_calls);
    memset(g_copy_ranges, 0, sizeof g_copy_ranges);
    g_steps = g_bad_kv = g_kv_ops = 0;
}

static loom_model *load_recorded(const char *path, bool f32_activations) {
    loom_model_params p = loom_model_default_params();
    p.backend = "cpu";
    p.n_threads = 2;
    p.f32_activations = f32_activations;
    loom_model *m = NULL;
    if (loom_model_load(path, &p, &m) != LOOM_OK) fail_msg("load: %s", loom_last_error());
    g_real = m->backend->ops;
    g_rec = *g_real;
    g_rec.copy_batch = rec_copy_batch;
    g_rec.step_begin = rec_step_begin;
    g_rec.kv_store = rec_kv_store;
    g_rec.attention = rec_attention;
    m->backend->ops = &g_rec;
    reset_counts();
    return m;
}

static int setup(void **state) {
    (void)state;
    synth_path(g_path[0], sizeof g_path[0], "calls-llama.gguf");
    synth_path(g_path[1], sizeof g_path[1], "calls-gemma3.gguf");
    if (synth_write(g_path[0], &SYNTH_LLAMA, 31) != 0) return -1;
    if (synth_write(g_path[1], &SYNTH_GEMMA3, 32) != 0) return -1;
    return 0;
}

/* Source layers of group g (2 ranges, K and V, per layer per block moved). */
static int64_t layers_in(const loom_model *m, int32_t g) {
    int64_t n = 0;
    for (int32_t il = 0; il < m->cfg.n_layer; il++) n += m->cfg.layers[il].kv_group == g;
    return n;
}

static loom_engine *make_engine(loom_model *m, int64_t kv_bytes, loom_preempt_mode preempt) {
    loom_engine_params ep = loom_engine_default_params();
    ep.kv_bytes = kv_bytes;
    ep.block_size = 8;
    ep.max_ctx = 96;
    ep.max_batched_tokens = 24;
    ep.max_seqs = 6;
    ep.preempt = preempt;
    loom_engine *e = NULL;
    if (loom_engine_create(m, &ep, &e) != LOOM_OK) fail_msg("engine: %s", loom_last_error());
    return e;
}

static void prompt_of(int r, loom_token *p, int n) {
    for (int i = 0; i < n; i++) p[i] = (loom_token)(4 + (r * 41 + i * 19) % 280);
}

/* Runs the request to its end; its tokens into out (max_tokens of them). */
static void generate(loom_engine *e, const loom_token *prompt, int n, int max_tokens,
                     loom_token *out) {
    loom_request_params rq = loom_request_default_params();
    loom_sampler_params sp = loom_sampler_default_params();
    rq.sampler = &sp;
    rq.prompt_tokens = prompt;
    rq.n_prompt_tokens = (size_t)n;
    rq.max_tokens = max_tokens;
    rq.ignore_eos = true;
    sp.temperature = 0.0f;
    loom_generation *g = NULL;
    if (loom_engine_generate(e, &rq, NULL, NULL, &g) != LOOM_OK)
        fail_msg("generate: %s", loom_last_error());
    assert_int_equal(g->n_tokens, (size_t)max_tokens);
    if (out) memcpy(out, g->tokens, sizeof *out * (size_t)max_tokens);
    loom_generation_free(g);
}

/* ---- copy-on-write -------------------------------------------------------------------------- */

static void test_cow_one_call(void **state) {
    (void)state;
    for (int mi = 0; mi < 2; mi++) {
        loom_model *m = load_recorded(g_path[mi], false);
        loom_engine *e = make_engine(m, 4 << 20, LOOM_PREEMPT_RECOMPUTE);
        loom_token prompt[16], a[8], b[8];
        prompt_of(1, prompt, 16);
        generate(e, prompt, 16, 8, a);
        assert_int_equal(g_copy_calls[LOOM_COPY_DEVICE], 0);
        /* The same 16-token prompt (two whole blocks of 8) again: all but its last token come
         * from the prefix cache, so its last, cached block is copied before position 15 is
         * written — in every group at once. */
        generate(e, prompt, 16, 8, b);
        assert_memory_equal(a, b, sizeof a);
        int64_t cows = 0, ranges = 0;
        for (int32_t g = 0; g < e->n_groups; g++) {
            loom_kv_group_info gi = {.size = sizeof gi};
            assert_int_equal(loom_engine_get_kv_group(e, g, &gi), LOOM_OK);
            cows += gi.cow_copies;
            ranges += gi.cow_copies * 2 * layers_in(m, g);
        }
        assert_int_equal(cows, m->cfg.n_kv_groups); /* one block in each group */
        assert_int_equal(g_copy_calls[LOOM_COPY_DEVICE], 1);
        assert_int_equal(g_copy_ranges[LOOM_COPY_DEVICE], ranges);
        assert_int_equal(g_copy_calls[LOOM_COPY_TO_HOST] + g_copy_calls[LOOM_COPY_FROM_HOST], 0);
        loom_engine_destroy(e);
        loom_model_free(m);
    }
}

/* ---- sampling from summaries ---------------------------------------------------------------- */

/* Eight requests whose settings a summary covers or not (top-k, greedy with logprobs, entropy
 * modes; bias, penalties, top-k off): their tokens and each token's info over n_tok tokens. */
typedef struct sampled {
    loom_token tok[8][24];
    loom_token_info info[8][24];
    loom_token_logprob top[8][24][2][6];
} sampled;

static void run_mixed(loom_engine *e, sampled *out) {
    loom_request_id ids[8];
    loom_token prompts[8][20];
    static const loom_logit_bias bias[2] = {{7, 2.5f}, {11, -INFINITY}};
    for (int r = 0; r < 8; r++) {
        prompt_of(30 + r, prompts[r], 20);
        loom_request_params rq = loom_request_default_params();
        loom_sampler_params sp = loom_sampler_default_params();
        rq.sampler = &sp;
        rq.prompt_tokens = prompts[r];
        rq.n_prompt_tokens = 12 + (size_t)r;
        rq.max_tokens = 24;
        rq.ignore_eos = true;
        sp.seed = 100 + (uint64_t)r;
        sp.n_logprobs = r % 3 == 0 ? 6 : 0;
        switch (r) {
        case 0: /* the defaults: top-k 40, top-p 0.95 */
            break;
        case 1:
            sp.temperature = 0.0f;
            break;
        case 2:
            sp.top_k = 5;
            sp.min_p = 0.05f;
            sp.entropy_mode = LOOM_ENTROPY_EXP;
            break;
        case 3:
            sp.top_k = 200;
            sp.typical_p = 0.8f;
            sp.entropy_mode = LOOM_ENTROPY_DYNATEMP;
            break;
        case 4: /* bias (edits on the summary's path) */
            sp.logit_bias = bias;
            sp.n_logit_bias = 2;
            break;
        case 5: /* penalties (edits too), with logprobs */
            sp.n_logprobs = 4;
            sp.repeat_penalty = 1.3f;
            sp.frequency_penalty = 0.2f;
            break;
        case 6: /* not covered: top-k off */
            sp.top_k = 0;
            sp.top_p = 0.8f;
            break;
        default:
            sp.top_k = 40;
            sp.entropy_mode = LOOM_ENTROPY_EDT;
            break;
        }
        assert_int_equal(loom_engine_submit(e, &rq, &ids[r]), LOOM_OK);
    }
    int n[8] = {0};
    while (loom_engine_has_work(e)) {
        const loom_event *const *ev;
        size_t n_ev;
        assert_int_equal(loom_engine_step(e, &ev, &n_ev), LOOM_OK);
        for (size_t k = 0; k < n_ev; k++) {
            if (ev[k]->kind == LOOM_EVENT_FAILED) fail_msg("request failed: %s", loom_last_error());
            for (int r = 0; r < 8; r++) {
                if (ev[k]->kind != LOOM_EVENT_TOKEN || ev[k]->id != ids[r]) continue;
                const loom_token_info *in = ev[k]->info;
                int i = n[r]++;
                out->tok[r][i] = ev[k]->token;
                out->info[r][i] = *in;
                if (in->n_top_raw > 0) /* the arrays are NULL without logprobs */
                    memcpy(out->top[r][i][0], in->top_raw,
                           (size_t)in->n_top_raw * sizeof *in->top_raw);
                if (in->n_top_final > 0)
                    memcpy(out->top[r][i][1], in->top_final,
                           (size_t)in->n_top_final * sizeof *in->top_final);
                out->info[r][i].top_raw = out->info[r][i].top_final = NULL;
            }
        }
    }
    for (int r = 0; r < 8; r++) assert_int_equal(n[r], 24);
}

/* Neighbouring floats, or within 1e-12 (a log-probability near 0 carries its normalizer's
 * float64 rounding). */
static bool near(float a, float b) {
    return nextafterf(a, b) == b || fabs((double)a - (double)b) <= 1e-12;
}

/* The same requests sampled from whole rows, from summaries made on the host
 * (LOOM_SAMPLE_FROM=summary, the CPU's own path), and from a backend's logits_summary (the
 * slot above): every token and every field of its info bit for bit, but for the raw
 * log-probabilities of the requests with bias or penalties (summed over the raw row rather
 * than corrected from the edited one: within one float ulp or 1e-12); with the slot, whole rows
 * crossed only for the request a summary does not cover (top-k off). */
static void test_sample_from_summaries(void **state) {
    (void)state;
    static sampled runs[3];
    int64_t bytes[3] = {0}, summarized[3] = {0}, edited[3] = {0};
    for (int mode = 0; mode < 3; mode++) {
        loom_model *m = load_recorded(g_path[1], false);
        g_vocab = m->cfg.n_vocab;
        g_rec.tensor_get = rec_tensor_get;
        if (mode == 2) g_rec.logits_summary = rec_logits_summary;
        setenv("LOOM_SAMPLE_FROM", mode == 0 ? "rows" : "summary", 1);
        loom_engine *e = make_engine(m, 16 << 20, LOOM_PREEMPT_RECOMPUTE);
        g_logit_bytes = g_summary_rows = g_edited_rows = 0;
        run_mixed(e, &runs[mode]);
        bytes[mode] = g_logit_bytes;
        summarized[mode] = g_summary_rows;
        edited[mode] = g_edited_rows;
        loom_engine_destroy(e);
        loom_model_free(m);
        unsetenv("LOOM_SAMPLE_FROM");
        g_vocab = 0;
    }
    for (int mode = 1; mode < 3; mode++)
        for (int r = 0; r < 8; r++)
            for (int i = 0; i < 24; i++) {
                const loom_token_info *a = &runs[mode].info[r][i], *b = &runs[0].info[r][i];
                if (runs[mode].tok[r][i] != runs[0].tok[r][i])
                    fail_msg("mode %d request %d token %d: %d, from rows %d", mode, r, i,
                             runs[mode].tok[r][i], runs[0].tok[r][i]);
                const bool edits = r == 4 || r == 5; /* bias; penalties */
                if (!(a->logprob_raw == b->logprob_raw ||
                      (edits && near(a->logprob_raw, b->logprob_raw))))
                    fail_msg("mode %d request %d token %d: raw logprob %.9g, from rows %.9g", mode,
                             r, i, (double)a->logprob_raw, (double)b->logprob_raw);
                if (a->token != b->token || a->n_candidates != b->n_candidates ||
                    a->n_top_raw != b->n_top_raw || a->n_top_final != b->n_top_final ||
                    memcmp(&a->logprob_final, &b->logprob_final, sizeof a->logprob_final) != 0 ||
                    memcmp(&a->entropy, &b->entropy, sizeof a->entropy) != 0 ||
                    memcmp(&a->varentropy, &b->varentropy, sizeof a->varentropy) != 0 ||
                    memcmp(&a->entropy_final, &b->entropy_final, sizeof a->entropy_final) != 0 ||
                    memcmp(&a->temperature, &b->temperature, sizeof a->temperature) != 0 ||
                    memcmp(runs[mode].top[r][i][1], runs[0].top[r][i][1],
                           sizeof runs[0].top[r][i][1]) != 0)
                    fail_msg("mode %d request %d token %d: token info differs", mode, r, i);
                for (int k = 0; k < a->n_top_raw; k++) {
                    const loom_token_logprob *x = &runs[mode].top[r][i][0][k],
                                             *y = &runs[0].top[r][i][0][k];
                    if (x->id != y->id ||
                        !(x->logprob == y->logprob || (edits && near(x->logprob, y->logprob))))
                        fail_msg("mode %d request %d token %d: top_raw %d differs", mode, r, i, k);
                }
            }
    assert_int_equal(summarized[0], 0);
    assert_int_equal(summarized[1], 0);
    /* 8 x 24 whole rows; with the slot only the uncovered request's 24 (the slot sees each
     * chunk of rows whole, the two requests with edits' rows edited) */
    const int64_t row_bytes = bytes[0] / (8 * 24);
    assert_int_equal(bytes[0], 8 * 24 * row_bytes);
    assert_int_equal(bytes[1], bytes[0]);
    assert_int_equal(bytes[2], 1 * 24 * row_bytes);
    assert_int_equal(summarized[2], 8 * 24);
    assert_int_equal(edited[2], 2 * 24);
}

/* ---- swap ----------------------------------------------------------------------------------- */

static void run_batch(loom_engine *e, int n_req, loom_token out[][40]) {
    loom_request_id ids[8];
    loom_token prompts[8][40];
    for (int r = 0; r < n_req; r++) {
        prompt_of(10 + r, prompts[r], 40);
        loom_request_params rq = loom_request_default_params();
        loom_sampler_params sp = loom_sampler_default_params();
        rq.sampler = &sp;
        rq.prompt_tokens = prompts[r];
        rq.n_prompt_tokens = 30 + (size_t)r;
        rq.max_tokens = 40;
        rq.ignore_eos = true;
        sp.temperature = r % 2 ? 0.9f : 0.0f;
        sp.seed = 3 + (uint64_t)r;
        assert_int_equal(loom_engine_submit(e, &rq, &ids[r]), LOOM_OK);
    }
    int n[8] = {0};
    while (loom_engine_has_work(e)) {
        const loom_event *const *ev;
        size_t n_ev;
        assert_int_equal(loom_engine_step(e, &ev, &n_ev), LOOM_OK);
        for (size_t k = 0; k < n_ev; k++) {
            assert_int_not_equal(ev[k]->kind, LOOM_EVENT_FAILED);
            for (int r = 0; r < n_req; r++)
                if (ev[k]->kind == LOOM_EVENT_TOKEN && ev[k]->id == ids[r])
                    out[r][n[r]++] = ev[k]->token;
        }
    }
    for (int r = 0; r < n_req; r++) assert_int_equal(n[r], 40);
}

static void test_swap_one_call(void **state) {
    (void)state;
    for (int mi = 0; mi < 2; mi++) {
        loom_model *m = load_recorded(g_path[mi], false);
        /* Room for about two of the four 70-position requests in group 0. */
        const size_t pos_bytes =
            loom__kv_storage_block_bytes(m, NULL, NULL, LOOM_TYPE_F16, 8, 0) / 8;
        loom_engine *e =
            make_engine(m, (int64_t)(pos_bytes * 2 * 80 * m->cfg.n_kv_groups), LOOM_PREEMPT_SWAP);
        loom_token swapped[4][40], roomy[4][40];
        run_batch(e, 4, swapped);
        loom__kv_stats ks;
        assert_int_equal(loom__kv_get_stats(e->kv, &ks), LOOM_OK);
        assert_true(ks.swap_outs > 0);
        assert_int_equal(g_copy_calls[LOOM_COPY_TO_HOST], ks.swap_outs);
        assert_int_equal(g_copy_calls[LOOM_COPY_FROM_HOST], ks.swap_ins);
        int64_t out_ranges = 0, in_ranges = 0;
        for (int32_t g = 0; g < e->n_groups; g++) {
            loom__kv_group_stats gs;
            assert_int_equal(loom__kv_get_group_stats(e->kv, g, &gs), LOOM_OK);
            out_ranges += gs.swapped_out * 2 * layers_in(m, g);
            in_ranges += gs.swapped_in * 2 * layers_in(m, g);
        }
        assert_int_equal(g_copy_ranges[LOOM_COPY_TO_HOST], out_ranges);
        assert_int_equal(g_copy_ranges[LOOM_COPY_FROM_HOST], in_ranges);
        printf("%s: %lld swap-outs, %lld swap-ins, %lld and %lld ranges, one call each\n",
               m->cfg.arch == LOOM_ARCH_GEMMA3 ? "gemma3" : "llama", (long long)ks.swap_outs,
               (long long)ks.swap_ins, (long long)out_ranges, (long long)in_ranges);
        loom_engine_destroy(e);
        /* The same requests with room for all: the same tokens. */
        e = make_engine(m, 16 << 20, LOOM_PREEMPT_SWAP);
        run_batch(e, 4, roomy);
        assert_memory_equal(swapped, roomy, sizeof swapped);
        loom_engine_destroy(e);
        loom_model_free(m);
    }
}

/* ---- one step, one hand-over of the descriptors -------------------------------------------- */

static void test_step_begin(void **state) {
    (void)state;
    loom_model *m = load_recorded(g_path[1], false);
    loom_engine *e = make_engine(m, 4 << 20, LOOM_PREEMPT_RECOMPUTE);
    loom_token out[4][40];
    run_batch(e, 4, out);
    loom_engine_stats st = {.size = sizeof st};
    assert_int_equal(loom_engine_get_stats(e, &st), LOOM_OK);
    assert_true(g_steps > 0);
    assert_int_equal(g_steps, st.steps); /* one per step that ran a batch */
    assert_int_equal(g_step.n_kv, m->cfg.n_kv_groups);
    /* every layer stores and attends once per step (no layer reuses another's K/V here) */
    assert_int_equal(g_kv_ops, g_steps * 2 * m->cfg.n_layer);
    assert_int_equal(g_bad_kv, 0);
    loom_engine_destroy(e);
    loom_model_free(m);
}

/* ---- a stream sized once ------------------------------------------------------------------- */

static void test_workspace_sized_once(void **state) {
    (void)state;
    for (int f32 = 0; f32 < 2; f32++) {
        for (int mi = 0; mi < 2; mi++) {
            loom_model *m = load_recorded(g_path[mi], f32);
            loom_engine *e = make_engine(m, 4 << 20, LOOM_PREEMPT_RECOMPUTE);
            assert_true(e->exec.workspace_bytes > 0);
            /* A full step of prompt (24 tokens), then six sequences decoding at once. */
            loom_token out[6][40];
            run_batch(e, 6, out);
            const loom__cpu_ctx *c = e->exec.stream;
            assert_int_equal(c->n_grows, 0);
            loom_engine_destroy(e);
            loom_model_free(m);
        }
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cow_one_call),
        cmocka_unit_test(test_swap_one_call),
        cmocka_unit_test(test_step_begin),
        cmocka_unit_test(test_workspace_sized_once),
        cmocka_unit_test(test_sample_from_summaries),
    };
    return cmocka_run_group_tests(tests, setup, NULL);
}
