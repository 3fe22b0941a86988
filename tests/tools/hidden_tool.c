/* hidden_tool — the residual stream after the first N layers, for comparisons with an
 * independent reference (tests/conformance/test_gemma3.py).
 *
 *   hidden_tool MODEL N_LAYERS OUT.f32 [q8] < tokens   (token ids separated by white space)
 *
 * Writes [n_tokens, n_embd] float32 values (little-endian, row-major) to OUT.f32, computed
 * teacher-forced from position 0 with an f32 KV cache and float32 activations — or, with "q8",
 * with the default 8-bit activations of quantized matmuls. Exit 1 with the reason on failure. */
#include <stdio.h>
#include <stdlib.h>

#include "engine/session.h"
#include "loom.h"

int main(int argc, char **argv) {
    if (argc != 4 && argc != 5) {
        fprintf(stderr, "usage: hidden_tool MODEL N_LAYERS OUT.f32 [q8] < tokens\n");
        return 2;
    }
    int n_layers = atoi(argv[2]);
    loom_token *toks = NULL;
    size_t n = 0, cap = 0;
    long v;
    while (scanf("%ld", &v) == 1) {
        if (n == cap) {
            cap = cap ? cap * 2 : 256;
            loom_token *grown = realloc(toks, cap * sizeof *toks);
            if (!grown) return 1;
            toks = grown;
        }
        toks[n++] = (loom_token)v;
    }
    loom_model *m = NULL;
    loom_session *s = NULL;
    loom_model_info info = {.size = sizeof info};
    loom_session_params sp = loom_session_default_params();
    sp.kv_f32 = true;
    sp.n_batch = (int32_t)n;
    sp.n_ctx = (int32_t)n;
    loom_model_params mp = loom_model_default_params();
    mp.f32_activations = argc == 4;
    loom_status st = loom_model_load(argv[1], &mp, &m);
    if (st == LOOM_OK) st = loom_model_get_info(m, &info);
    if (st == LOOM_OK) st = loom_session_create(m, &sp, &s);
    float *out = NULL;
    if (st == LOOM_OK) {
        out = malloc(n * (size_t)info.n_embd * sizeof *out);
        st =
            out ? loom__session_hidden(s, toks, (int32_t)n, n_layers, out) : LOOM_ERR_OUT_OF_MEMORY;
    }
    if (st == LOOM_OK) {
        FILE *f = fopen(argv[3], "wb");
        if (!f || fwrite(out, sizeof *out, n * (size_t)info.n_embd, f) != n * (size_t)info.n_embd) {
            fprintf(stderr, "hidden_tool: cannot write %s\n", argv[3]);
            st = LOOM_ERR_IO;
        }
        if (f) fclose(f);
    } else {
        fprintf(stderr, "hidden_tool: %s: %s\n", loom_status_str(st), loom_last_error());
    }
    free(out);
    free(toks);
    loom_session_free(s);
    loom_model_free(m);
    return st == LOOM_OK ? 0 : 1;
}
