/* embed.c — the smallest complete program over libloom: load a model, submit two requests to
 * one engine, and stream both one token at a time as the engine batches them together.
 *
 *   cc embed.c $(pkg-config --cflags --libs loom) -o embed && ./embed MODEL.gguf
 *
 * Each line of output is "[request] text"; the two requests share every step's batch. */
#include <loom.h>

#include <stdio.h>

static int fail(const char *what, loom_status s) {
    fprintf(stderr, "embed: %s: %s: %s\n", what, loom_status_str(s), loom_last_error());
    return 1;
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: %s MODEL.gguf\n", argv[0]);
        return 2;
    }
    loom_model *model = NULL;
    loom_status s = loom_model_load(argv[1], NULL, &model); /* NULL: default parameters */
    if (s != LOOM_OK) return fail("load", s);

    loom_engine_params ep = loom_engine_default_params();
    ep.kv_bytes = 64 << 20; /* 64 MiB of KV cache: plenty for two requests of up to */
    ep.max_ctx = 1024;      /* 1,024 positions each */
    loom_engine *engine = NULL;
    s = loom_engine_create(model, &ep, &engine);
    if (s != LOOM_OK) {
        loom_model_free(model);
        return fail("engine", s);
    }

    const char *prompts[2] = {"The capital of France is", "Water boils at"};
    for (int i = 0; i < 2; i++) {
        loom_request_params rp = loom_request_default_params(); /* default sampling, seeded */
        rp.prompt = prompts[i];
        rp.max_tokens = 16;
        loom_request_id id;
        s = loom_engine_submit(engine, &rp, &id);
        if (s != LOOM_OK) break;
        printf("[%llu] %s\n", (unsigned long long)id, prompts[i]);
    }

    /* Step until both are done; every step returns the tokens it produced. */
    while (s == LOOM_OK && loom_engine_has_work(engine)) {
        const loom_event *const *events;
        size_t n;
        s = loom_engine_step(engine, &events, &n);
        for (size_t i = 0; s == LOOM_OK && i < n; i++) {
            const loom_event *e = events[i];
            if (e->kind == LOOM_EVENT_TOKEN)
                printf("[%llu] %.*s\n", (unsigned long long)e->id, (int)e->text_len, e->text);
            else if (e->kind == LOOM_EVENT_FINISHED)
                printf("[%llu] (finished)\n", (unsigned long long)e->id);
            else if (e->kind == LOOM_EVENT_FAILED)
                s = e->status;
        }
    }
    int rc = s == LOOM_OK ? 0 : fail("generate", s);
    loom_engine_destroy(engine);
    loom_model_free(model);
    return rc;
}
