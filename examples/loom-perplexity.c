/* loom-perplexity — perplexity of a model over a text file, in windows.
 *
 *   loom-perplexity -m MODEL -f FILE [-c CTX] [-t THREADS] [--chunks N] [--backend NAME]
 *                   [--weights stored|fp8]
 *
 * --weights fp8 requantizes every matrix at load to FP8 E4M3 rows (loom_model_params.weights),
 * for measuring what that costs in perplexity.
 *
 * Convention (the same as llama.cpp's perplexity tool, so the numbers compare directly): the
 * whole file is tokenized once (with BOS when the model adds one); it is cut into
 * floor(n_tokens / CTX) windows of CTX tokens with stride CTX; each window is evaluated from an
 * empty cache with its first token replaced by BOS, and only the second half is scored: the
 * tokens at positions CTX/2 + 1 .. CTX - 1 of the window, each predicted from the logits of the
 * position before it. The running perplexity exp(mean NLL) is printed after every window. */
#define _POSIX_C_SOURCE 200809L

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "loom.h"

/* Rows of logits held at once while scoring (bounds memory for a 262k vocabulary). */
#define SCORE_ROWS 32

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

static char *read_file(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "loom-perplexity: %s: %s\n", path, strerror(errno));
        return NULL;
    }
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    while (buf) {
        n += fread(buf + n, 1, cap - n, f);
        if (n < cap) break;
        char *grown = realloc(buf, cap *= 2);
        if (!grown) free(buf);
        buf = grown;
    }
    fclose(f);
    *len = n;
    return buf;
}

/* -log softmax(logits)[target], in double. */
static double nll(const float *logits, int32_t n_vocab, loom_token target) {
    double mx = -INFINITY, sum = 0;
    for (int32_t i = 0; i < n_vocab; i++) mx = logits[i] > mx ? logits[i] : mx;
    for (int32_t i = 0; i < n_vocab; i++) sum += exp((double)logits[i] - mx);
    return log(sum) + mx - (double)logits[target];
}

static void fail(loom_status st) {
    fprintf(stderr, "loom-perplexity: %s: %s\n", loom_status_str(st), loom_last_error());
}

int main(int argc, char **argv) {
    const char *model_path = NULL, *file = NULL;
    int32_t n_ctx = 512, max_chunks = -1;
    loom_model_params mp = loom_model_default_params();
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-m") && i + 1 < argc)
            model_path = argv[++i];
        else if (!strcmp(argv[i], "-f") && i + 1 < argc)
            file = argv[++i];
        else if (!strcmp(argv[i], "-c") && i + 1 < argc)
            n_ctx = atoi(argv[++i]);
        else if (!strcmp(argv[i], "-t") && i + 1 < argc)
            mp.n_threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--backend") && i + 1 < argc)
            mp.backend = argv[++i];
        else if (!strcmp(argv[i], "--chunks") && i + 1 < argc)
            max_chunks = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--weights") && i + 1 < argc && !strcmp(argv[i + 1], "fp8")) {
            mp.weights = LOOM_WEIGHTS_FP8_E4M3; /* every matrix requantized to FP8 E4M3 rows */
            i++;
        } else if (!strcmp(argv[i], "--weights") && i + 1 < argc &&
                   !strcmp(argv[i + 1], "stored")) {
            mp.weights = LOOM_WEIGHTS_AS_STORED;
            i++;
        } else {
            fprintf(stderr, "usage: loom-perplexity -m MODEL -f FILE [-c CTX] [-t THREADS] "
                            "[--chunks N] [--backend NAME] [--weights stored|fp8]\n");
            return 2;
        }
    }
    if (!model_path || !file || n_ctx < 4) {
        fprintf(stderr, "loom-perplexity: -m MODEL and -f FILE are required, CTX >= 4\n");
        return 2;
    }
    size_t len = 0;
    char *text = read_file(file, &len);
    if (!text) return 1;

    loom_model *m = NULL;
    loom_session *s = NULL;
    loom_model_info info = {.size = sizeof info};
    loom_token *toks = NULL;
    size_t n_tok = 0;
    int rc = 1;
    loom_status st = loom_model_load(model_path, &mp, &m);
    if (st == LOOM_OK) st = loom_model_get_info(m, &info);
    if (st == LOOM_OK) {
        st = loom_tokenize(m, text, len, LOOM_TOKENIZE_ADD_SPECIAL, NULL, 0, &n_tok);
        if (st == LOOM_ERR_BUFFER_TOO_SMALL || st == LOOM_OK) {
            toks = malloc((n_tok ? n_tok : 1) * sizeof *toks);
            st = toks ? loom_tokenize(m, text, len, LOOM_TOKENIZE_ADD_SPECIAL, toks, n_tok, &n_tok)
                      : LOOM_ERR_OUT_OF_MEMORY;
        }
    }
    loom_session_params sp = loom_session_default_params();
    sp.n_ctx = n_ctx;
    if (st == LOOM_OK) st = loom_session_create(m, &sp, &s);
    if (st != LOOM_OK) {
        fail(st);
        goto done;
    }
    int64_t n_chunks = (int64_t)n_tok / n_ctx;
    if (max_chunks >= 0 && n_chunks > max_chunks) n_chunks = max_chunks;
    if (n_chunks < 1) {
        fprintf(stderr, "loom-perplexity: %zu tokens: need at least %d (one window)\n", n_tok,
                n_ctx);
        goto done;
    }
    fprintf(stderr, "%zu tokens, %lld windows of %d, scoring the second half of each\n", n_tok,
            (long long)n_chunks, n_ctx);
    const int32_t first = n_ctx / 2;
    double sum_nll = 0, t0 = now_ms();
    int64_t count = 0;
    loom_token *win = malloc((size_t)n_ctx * sizeof *win);
    if (!win) goto done;
    for (int64_t c = 0; c < n_chunks && st == LOOM_OK; c++) {
        memcpy(win, toks + c * n_ctx, (size_t)n_ctx * sizeof *win);
        if (info.bos >= 0) win[0] = info.bos;
        loom_session_reset(s);
        st = loom_session_decode(s, win, first, false);
        /* Rows first .. n_ctx-2 predict tokens first+1 .. n_ctx-1; run them SCORE_ROWS at a
         * time with every row's logits kept. */
        for (int32_t p = first; p < n_ctx - 1 && st == LOOM_OK; p += SCORE_ROWS) {
            int32_t rows = n_ctx - 1 - p < SCORE_ROWS ? n_ctx - 1 - p : SCORE_ROWS;
            st = loom_session_decode(s, win + p, rows, true);
            for (int32_t r = 0; r < rows && st == LOOM_OK; r++) {
                sum_nll += nll(loom_session_logits(s, r), info.n_vocab, win[p + r + 1]);
                count++;
            }
        }
        if (st == LOOM_OK) {
            printf("[%lld]%.4f,", (long long)c + 1, exp(sum_nll / (double)count));
            fflush(stdout);
        }
    }
    free(win);
    if (st != LOOM_OK) {
        fail(st);
        goto done;
    }
    double ppl = exp(sum_nll / (double)count);
    printf("\nfinal estimate: PPL = %.4f over %lld scored tokens\n", ppl, (long long)count);
    fprintf(stderr, "%.1f s\n", (now_ms() - t0) / 1e3);
    rc = 0;
done:
    free(toks);
    free(text);
    loom_session_free(s);
    loom_model_free(m);
    return rc;
}
