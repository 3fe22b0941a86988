/* loom-generate — stream text from a GGUF model on the command line.
 *
 *   loom-generate -m MODEL [-p PROMPT] [-n N] [-t THREADS] [--temp T] [--top-k K] [--top-p P]
 *                 [--seed S] [-c CTX] [--chat [--system TEXT]]
 *
 * Without --chat the prompt is continued as plain text (and echoed first). With --chat the
 * prompt is the user's message of a one-turn conversation (after an optional system message),
 * rendered with the model's chat template (loom_chat_format), and only the reply is printed;
 * generation stops at the model's end-of-turn token.
 *
 * Prints load time, prompt tokens/s and generation tokens/s on stderr when done. */
#define _POSIX_C_SOURCE 200809L

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "loom.h"

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

static void usage(FILE *f) {
    fprintf(f, "usage: loom-generate -m MODEL [-p PROMPT] [-n N] [-t THREADS] [-c CTX]\n"
               "                     [--temp T] [--top-k K] [--top-p P] [--seed S]\n"
               "                     [--chat [--system TEXT]]\n"
               "  -m MODEL    GGUF file\n"
               "  -p PROMPT   prompt text (default \"Once upon a time\"); with --chat, the user's\n"
               "              message\n"
               "  -n N        tokens to generate (default 128)\n"
               "  -t THREADS  compute threads (default: all cores)\n"
               "  --numa MODE auto, off, distribute or isolate: where threads run and weights live\n"
               "              on machines with several memory nodes (default auto)\n"
               "  -c CTX      context size (default: the model's, at most 4096)\n"
               "  --temp T    temperature, 0 = greedy (default 0.8)\n"
               "  --top-k K   (default 40)   --top-p P (default 0.95)   --seed S (default 0x5EED)\n"
               "  --chat      wrap the prompt in the model's chat template and print only the\n"
               "              reply (stops at the end of the model's turn)\n"
               "  --system TEXT  system message for --chat\n");
}

static bool on_piece(const char *piece, size_t len, loom_token token, void *user) {
    (void)token;
    (void)user;
    fwrite(piece, 1, len, stdout);
    fflush(stdout);
    return true;
}

/* Parses a number argument or exits with a message naming the flag. */
static double num_arg(int argc, char **argv, int *i) {
    if (*i + 1 >= argc) {
        fprintf(stderr, "loom-generate: %s needs a value\n", argv[*i]);
        exit(2);
    }
    char *end = NULL;
    errno = 0;
    double v = strtod(argv[*i + 1], &end);
    if (errno || end == argv[*i + 1] || *end) {
        fprintf(stderr, "loom-generate: %s: not a number: %s\n", argv[*i], argv[*i + 1]);
        exit(2);
    }
    (*i)++;
    return v;
}

/* Renders [system,] user=prompt with the model's chat template, the assistant's turn opened,
 * into a malloc'd NUL-terminated string. */
static loom_status chat_prompt(const loom_model *model, const char *system, const char *prompt,
                               char **out) {
    loom_chat_message msgs[2];
    size_t n = 0;
    if (system) msgs[n++] = (loom_chat_message){.role = "system", .content = system};
    msgs[n++] = (loom_chat_message){.role = "user", .content = prompt};
    size_t len = 0;
    loom_status st = loom_chat_format(model, msgs, n, true, NULL, 0, &len);
    if (st != LOOM_OK && st != LOOM_ERR_BUFFER_TOO_SMALL) return st;
    char *text = malloc(len + 1);
    if (!text) return LOOM_ERR_OUT_OF_MEMORY;
    st = loom_chat_format(model, msgs, n, true, text, len, &len);
    if (st != LOOM_OK) {
        free(text);
        return st;
    }
    text[len] = '\0';
    *out = text;
    return LOOM_OK;
}

int main(int argc, char **argv) {
    const char *model_path = NULL;
    const char *prompt = "Once upon a time";
    const char *system = NULL;
    bool chat = false;
    loom_model_params mp = loom_model_default_params();
    loom_session_params sp = loom_session_default_params();
    loom_generate_params gp = loom_generate_default_params();

    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(a, "-m") && i + 1 < argc) {
            model_path = argv[++i];
        } else if (!strcmp(a, "-p") && i + 1 < argc) {
            prompt = argv[++i];
        } else if (!strcmp(a, "--chat")) {
            chat = true;
        } else if (!strcmp(a, "--system") && i + 1 < argc) {
            system = argv[++i];
        } else if (!strcmp(a, "-n")) {
            gp.n_predict = (int32_t)num_arg(argc, argv, &i);
        } else if (!strcmp(a, "-t")) {
            mp.n_threads = (int)num_arg(argc, argv, &i);
        } else if (!strcmp(a, "--numa") && i + 1 < argc) {
            const char *mode = argv[++i];
            if (!strcmp(mode, "auto")) mp.numa = LOOM_NUMA_AUTO;
            else if (!strcmp(mode, "off")) mp.numa = LOOM_NUMA_OFF;
            else if (!strcmp(mode, "distribute")) mp.numa = LOOM_NUMA_DISTRIBUTE;
            else if (!strcmp(mode, "isolate")) mp.numa = LOOM_NUMA_ISOLATE;
            else {
                fprintf(stderr, "loom-generate: --numa: want auto, off, distribute or isolate\n");
                return 2;
            }
        } else if (!strcmp(a, "-c")) {
            sp.n_ctx = (int32_t)num_arg(argc, argv, &i);
        } else if (!strcmp(a, "--temp")) {
            gp.sampler.temperature = (float)num_arg(argc, argv, &i);
        } else if (!strcmp(a, "--top-k")) {
            gp.sampler.top_k = (int32_t)num_arg(argc, argv, &i);
        } else if (!strcmp(a, "--top-p")) {
            gp.sampler.top_p = (float)num_arg(argc, argv, &i);
        } else if (!strcmp(a, "--seed")) {
            gp.sampler.seed = (uint64_t)num_arg(argc, argv, &i);
        } else {
            fprintf(stderr, "loom-generate: unknown or incomplete argument: %s\n", a);
            usage(stderr);
            return 2;
        }
    }
    if (!model_path) {
        usage(stderr);
        return 2;
    }
    if (system && !chat) {
        fprintf(stderr, "loom-generate: --system needs --chat\n");
        return 2;
    }

    double t0 = now_ms();
    loom_model *model = NULL;
    loom_status st = loom_model_load(model_path, &mp, &model);
    if (st != LOOM_OK) {
        fprintf(stderr, "loom-generate: %s: %s\n", loom_status_str(st), loom_last_error());
        return 1;
    }
    double load_ms = now_ms() - t0;
    char *text = NULL; /* the rendered conversation (--chat) */
    if (chat) {
        st = chat_prompt(model, system, prompt, &text);
        if (st != LOOM_OK) {
            fprintf(stderr, "loom-generate: --chat: %s: %s\n", loom_status_str(st),
                    loom_last_error());
            loom_model_free(model);
            return 1;
        }
        /* The template's control tokens ("<start_of_turn>") must become their ids; BOS is
         * added by tokenization (the rendered text never holds it). */
        gp.add_special = true;
        gp.parse_special = true;
        gp.stop_at_eos = true;
    }
    loom_session *session = NULL;
    st = loom_session_create(model, &sp, &session);
    if (st != LOOM_OK) {
        fprintf(stderr, "loom-generate: %s: %s\n", loom_status_str(st), loom_last_error());
        free(text);
        loom_model_free(model);
        return 1;
    }

    if (!chat) fputs(prompt, stdout);
    loom_generate_stats stats = {0};
    st = loom_generate(session, chat ? text : prompt, &gp, on_piece, NULL, &stats);
    free(text);
    fputc('\n', stdout);
    int rc = 0;
    if (st != LOOM_OK) {
        fprintf(stderr, "loom-generate: %s: %s\n", loom_status_str(st), loom_last_error());
        rc = 1;
    }
    loom_model_info info;
    if (loom_model_get_info(model, &info) == LOOM_OK)
        fprintf(stderr, "\nload: %.1f ms (cpu kernels: %s)\n", load_ms, info.cpu_kernels);
    else
        fprintf(stderr, "\nload: %.1f ms\n", load_ms);
    fprintf(stderr, "prompt: %d tokens in %.1f ms (%.1f tok/s)\n", stats.n_prompt, stats.prompt_ms,
            stats.prompt_ms > 0 ? stats.n_prompt * 1e3 / stats.prompt_ms : 0.0);
    fprintf(stderr, "generate: %d tokens in %.1f ms (%.1f tok/s)\n", stats.n_generated,
            stats.generate_ms,
            stats.generate_ms > 0 ? stats.n_generated * 1e3 / stats.generate_ms : 0.0);
    loom_session_free(session);
    loom_model_free(model);
    return rc;
}
