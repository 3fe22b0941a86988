/* fuzz_model.c — libFuzzer target: loom_model_load on arbitrary bytes (through a memory file,
 * so the real path-based loader runs: open, checks, mmap, GGUF, hyper-parameters, tokenizer,
 * weights). A model that loads is then used the way an application would: chat template,
 * tokenize and detokenize, a short decode. Every failure must come with a message. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#include "loom.h"

static void use(loom_model *m) {
    const char *name = NULL;
    (void)loom_chat_template_name(m, &name);
    static const char text[] = "Hello <s> world \xe4\xb8\xad </s>!";
    loom_token toks[64];
    size_t n = 0;
    for (unsigned flags = 0; flags < 4; flags++) {
        if (loom_tokenize(m, text, sizeof text - 1, flags, toks, 64, &n) != LOOM_OK) continue;
        char out[512];
        size_t n_out = 0;
        (void)loom_detokenize(m, toks, n, LOOM_DETOKENIZE_RENDER_SPECIAL, out, sizeof out, &n_out);
    }
    loom_session_params sp = loom_session_default_params();
    sp.n_ctx = 8;
    loom_session *s = NULL;
    if (loom_session_create(m, &sp, &s) != LOOM_OK) return;
    loom_token t[3] = {0, 1, 2};
    (void)loom_session_decode(s, t, 3, false);
    loom_session_free(s);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    int fd = memfd_create("fuzz-model", MFD_CLOEXEC);
    if (fd < 0) return 0;
    size_t done = 0;
    while (done < size) {
        ssize_t w = write(fd, data + done, size - done);
        if (w <= 0) break;
        done += (size_t)w;
    }
    char path[64];
    snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
    loom_model_params p = loom_model_default_params();
    p.backend = "cpu";
    p.n_threads = 1;
    p.vocab_only = size > 0 && (data[size - 1] & 1); /* both paths, by the last byte */
    loom_model *m = NULL;
    loom_status st = loom_model_load(path, &p, &m);
    close(fd);
    if (st != LOOM_OK) {
        if (m != NULL || loom_last_error()[0] == '\0') abort();
        return 0;
    }
    use(m);
    loom_model_free(m);
    return 0;
}
