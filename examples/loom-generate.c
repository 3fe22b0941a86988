/* loom-generate — stream text from a GGUF model on the command line.
 *
 *   loom-generate -m MODEL [-p PROMPT] [-n N] [-t THREADS] [-c CTX] [sampling flags]
 *                 [--logprobs N] [--chat [--system TEXT]] [--trace FILE [--trace-format F]]
 *
 * Every setting of the sampler chain has a flag (see usage()). With --logprobs N > 0, a table
 * of each generated token's log-probability, entropy and top-N alternatives goes to stderr
 * after the text.
 *
 * Without --chat the prompt is continued as plain text (and echoed first). With --chat the
 * prompt is the user's message of a one-turn conversation (after an optional system message),
 * rendered with the model's chat template (loom_chat_format), and only the reply is printed;
 * generation stops at the model's end-of-turn token.
 *
 * With --trace FILE, the per-token trace (loom_trace: each forward pass's phases, and each
 * token's logprobs and entropies) is written to FILE when generation ends: JSON Lines, or the
 * Chrome trace-event format with --trace-format chrome or a FILE ending in ".json".
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
    fprintf(f,
            "usage: loom-generate -m MODEL [-p PROMPT] [-n N] [-t THREADS] [-c CTX]\n"
            "                     [sampling flags] [--logprobs N] [--chat [--system TEXT]]\n"
            "                     [--trace FILE [--trace-format jsonl|chrome]]\n"
            "  -m MODEL    GGUF file\n"
            "  -p PROMPT   prompt text (default \"Once upon a time\"); with --chat, the user's\n"
            "              message\n"
            "  -n N        tokens to generate (default 128)\n"
            "  -t THREADS  compute threads (default: all cores)\n"
            "  --backend B cpu, or a backend plugin's name (cuda); default auto: the best\n"
            "              available (a plugin that finds a device, else the cpu)\n"
            "  --device N  the backend's device index (default 0)\n"
            "  --numa MODE auto, off, distribute or isolate: where threads run and weights live\n"
            "              on machines with several memory nodes (default auto)\n"
            "  --no-mmap   copy the weights into memory (huge pages where the OS gives them)\n"
            "              instead of mapping the file: slower to load, can decode faster\n"
            "  --weights W stored (default: the file's types) or fp8: every matrix requantized\n"
            "              at load to FP8 E4M3 with one scale per row (cpu backend)\n"
            "  -c CTX      context size (default: the model's, at most 4096)\n"
            "  --chat      wrap the prompt in the model's chat template and print only the\n"
            "              reply (stops at the end of the model's turn)\n"
            "  --system TEXT  system message for --chat\n"
            "  --trace FILE   write the per-token trace (step phases; each token's logprobs,\n"
            "              entropies, temperature) to FILE when done; examples/loom-trace-plot\n"
            "              draws a JSONL trace\n"
            "  --trace-format F  jsonl (JSON Lines, the default) or chrome (trace-event JSON\n"
            "              for Perfetto / chrome://tracing; the default for a FILE ending in\n"
            "              .json)\n"
            "sampling, in the chain's order: bias, penalties, entropy correction, temperature,\n"
            "top-k, top-p, min-p, typical-p, draw\n"
            "  --repeat-penalty R     divide a seen token's positive logit by R (default 1: off)\n"
            "  --presence-penalty P   subtract P from a seen token's logit (default 0: off)\n"
            "  --frequency-penalty F  subtract F per occurrence (default 0: off)\n"
            "  --penalty-last-n N     tokens the penalties look back over; -1 all (default 64)\n"
            "  --entropy MODE         none | exp | edt | dynatemp (default none)\n"
            "  --beta B               exp: logits * exp(-B * H) (default 0.5)\n"
            "  --edt-n N --edt-theta TH  edt: T = temp * N^(TH / H) (default 0.8, 1)\n"
            "  --dyn-min A --dyn-max B --dyn-exp K\n"
            "                         dynatemp: T = A + (B - A) * (H / ln n)^K\n"
            "                         (default 0.5, 1.5, 1)\n"
            "  --temp T               temperature, 0 = greedy (default 0.8)\n"
            "  --top-k K              keep the K most likely, 0 = off (default 40)\n"
            "  --top-p P              nucleus mass, 1 = off (default 0.95)\n"
            "  --min-p P              keep p >= P * p_max, 0 = off (default 0)\n"
            "  --typical-p P          locally typical mass, 1 = off (default 1)\n"
            "  --seed S               RNG seed (default 0x5EED)\n"
            "  --logprobs N           after the text, print each token's log-probability,\n"
            "                         entropy and top-N alternatives to stderr (default 0)\n");
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

/* Sets the sampler field of one sampling flag; false when a is not one. */
static bool sampler_flag(int argc, char **argv, int *i, loom_sampler_params *s) {
    const char *a = argv[*i];
    const struct {
        const char *flag;
        float *field;
    } floats[] = {
        {"--temp", &s->temperature},
        {"--top-p", &s->top_p},
        {"--min-p", &s->min_p},
        {"--typical-p", &s->typical_p},
        {"--repeat-penalty", &s->repeat_penalty},
        {"--presence-penalty", &s->presence_penalty},
        {"--frequency-penalty", &s->frequency_penalty},
        {"--beta", &s->exp_beta},
        {"--edt-n", &s->edt_n},
        {"--edt-theta", &s->edt_theta},
        {"--dyn-min", &s->dyn_t_min},
        {"--dyn-max", &s->dyn_t_max},
        {"--dyn-exp", &s->dyn_exponent},
    };
    for (size_t k = 0; k < sizeof floats / sizeof floats[0]; k++) {
        if (!strcmp(a, floats[k].flag)) {
            *floats[k].field = (float)num_arg(argc, argv, i);
            return true;
        }
    }
    if (!strcmp(a, "--top-k")) {
        s->top_k = (int32_t)num_arg(argc, argv, i);
    } else if (!strcmp(a, "--penalty-last-n")) {
        s->penalty_last_n = (int32_t)num_arg(argc, argv, i);
    } else if (!strcmp(a, "--seed")) {
        s->seed = (uint64_t)num_arg(argc, argv, i);
    } else if (!strcmp(a, "--logprobs")) {
        s->n_logprobs = (int32_t)num_arg(argc, argv, i);
    } else if (!strcmp(a, "--entropy")) {
        static const char *const modes[] = {"none", "exp", "edt", "dynatemp"};
        const char *v = *i + 1 < argc ? argv[*i + 1] : "";
        int m = -1;
        for (int k = 0; k < 4; k++)
            if (!strcmp(v, modes[k])) m = k;
        if (m < 0) {
            fprintf(stderr, "loom-generate: --entropy: want none, exp, edt or dynatemp, got '%s'\n",
                    v);
            exit(2);
        }
        s->entropy_mode = (loom_entropy_mode)m;
        (*i)++;
    } else {
        return false;
    }
    return true;
}

/* ---- --logprobs: per-token details, printed after the text ------------------------------- */

typedef struct token_log {
    loom_token_info *infos;   /* [n]; top arrays point into alts */
    loom_token_logprob *alts; /* [cap * 2 * n_logprobs] */
    size_t n, cap;
    int32_t n_logprobs;
    bool out_of_memory;
} token_log;

static void on_token_info(const loom_token_info *info, void *user) {
    token_log *log = user;
    if (log->out_of_memory) return;
    size_t per = 2 * (size_t)log->n_logprobs;
    if (log->n == log->cap) {
        size_t cap = log->cap ? log->cap * 2 : 64;
        loom_token_info *infos = realloc(log->infos, cap * sizeof *infos);
        if (infos) log->infos = infos;
        loom_token_logprob *alts = realloc(log->alts, cap * per * sizeof *alts);
        if (alts) log->alts = alts;
        if (!infos || !alts) {
            log->out_of_memory = true;
            return;
        }
        log->cap = cap;
    }
    /* info's own arrays die with the call: keep copies, found by index when printing. */
    loom_token_logprob *a = log->alts + log->n * per;
    memcpy(a, info->top_raw, (size_t)info->n_top_raw * sizeof *a);
    memcpy(a + log->n_logprobs, info->top_final, (size_t)info->n_top_final * sizeof *a);
    log->infos[log->n++] = *info;
}

/* Whether s[0..n) is well-formed UTF-8 (a byte-fallback token's piece is often not). */
static bool utf8_valid(const unsigned char *s, size_t n) {
    for (size_t i = 0; i < n;) {
        size_t len = s[i] < 0x80         ? 1
                     : (s[i] >> 5) == 6  ? 2
                     : (s[i] >> 4) == 14 ? 3
                     : (s[i] >> 3) == 30 ? 4
                                         : 0;
        if (len == 0 || i + len > n) return false;
        for (size_t k = 1; k < len; k++)
            if ((s[i + k] >> 6) != 2) return false;
        i += len;
    }
    return true;
}

/* Writes a token's piece quoted, with control bytes (and every byte of a piece that is not
 * whole UTF-8) escaped, so the table stays readable. */
static void print_piece(FILE *f, const loom_model *model, loom_token tok) {
    char buf[64];
    size_t n = 0;
    loom_status st =
        loom_token_to_piece(model, tok, LOOM_DETOKENIZE_RENDER_SPECIAL, buf, sizeof buf, &n);
    if (st != LOOM_OK && st != LOOM_ERR_BUFFER_TOO_SMALL) n = 0;
    if (n > sizeof buf) n = sizeof buf;
    bool valid = utf8_valid((const unsigned char *)buf, n);
    fputc('"', f);
    for (size_t k = 0; k < n; k++) {
        unsigned char c = (unsigned char)buf[k];
        if (c == '"' || c == '\\')
            fprintf(f, "\\%c", c);
        else if (c < 0x20 || c == 0x7f || (c >= 0x80 && !valid))
            fprintf(f, "\\x%02x", c);
        else
            fputc(c, f);
    }
    fputc('"', f);
}

static void print_alternatives(FILE *f, const loom_model *model, const char *label,
                               const loom_token_logprob *alts, int32_t n) {
    fprintf(f, "        %s", label);
    for (int32_t k = 0; k < n; k++) {
        fputc(' ', f);
        print_piece(f, model, alts[k].id);
        fprintf(f, " %.3f", (double)alts[k].logprob);
    }
    fputc('\n', f);
}

static void print_token_log(FILE *f, const loom_model *model, const token_log *log) {
    fprintf(f, "\nper token: logprob under the model / under the distribution drawn from; "
               "entropy (nats) seen by the correction / of the distribution drawn from; "
               "varentropy; effective temperature; candidates\n");
    size_t per = 2 * (size_t)log->n_logprobs;
    for (size_t t = 0; t < log->n; t++) {
        const loom_token_info *in = &log->infos[t];
        const loom_token_logprob *a = log->alts + t * per;
        fprintf(f, "%4zu %7d ", t, in->token);
        print_piece(f, model, in->token);
        fprintf(f, "  logprob %.4f / %.4f  H %.3f / %.3f  VH %.3f  T %.3f  n %d\n",
                (double)in->logprob_raw, (double)in->logprob_final, in->entropy, in->entropy_final,
                in->varentropy, in->temperature, in->n_candidates);
        print_alternatives(f, model, "model:", a, in->n_top_raw);
        print_alternatives(f, model, "drawn:", a + log->n_logprobs, in->n_top_final);
    }
    if (log->out_of_memory) fprintf(f, "(out of memory: the rest of the tokens are missing)\n");
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
    const char *trace_path = NULL;
    const char *trace_format = NULL;
    loom_model_params mp = loom_model_default_params();
    loom_session_params sp = loom_session_default_params();
    loom_generate_params gp = loom_generate_default_params();
    loom_sampler_params sampler = loom_sampler_default_params();
    gp.sampler = &sampler;

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
        } else if (!strcmp(a, "--trace") && i + 1 < argc) {
            trace_path = argv[++i];
        } else if (!strcmp(a, "--trace-format") && i + 1 < argc) {
            trace_format = argv[++i];
            if (strcmp(trace_format, "jsonl") != 0 && strcmp(trace_format, "chrome") != 0) {
                fprintf(stderr, "loom-generate: --trace-format: want jsonl or chrome, got '%s'\n",
                        trace_format);
                return 2;
            }
        } else if (!strcmp(a, "-n")) {
            gp.n_predict = (int32_t)num_arg(argc, argv, &i);
        } else if (!strcmp(a, "-t")) {
            mp.n_threads = (int)num_arg(argc, argv, &i);
        } else if (!strcmp(a, "--no-mmap")) {
            mp.use_mmap = false;
        } else if (!strcmp(a, "--weights") && i + 1 < argc) {
            const char *w = argv[++i];
            if (!strcmp(w, "stored"))
                mp.weights = LOOM_WEIGHTS_AS_STORED;
            else if (!strcmp(w, "fp8"))
                mp.weights = LOOM_WEIGHTS_FP8_E4M3;
            else {
                fprintf(stderr, "loom-generate: --weights: want stored or fp8, got '%s'\n", w);
                return 2;
            }
        } else if (!strcmp(a, "--backend") && i + 1 < argc) {
            mp.backend = argv[++i];
        } else if (!strcmp(a, "--device")) {
            mp.device = (int32_t)num_arg(argc, argv, &i);
        } else if (!strcmp(a, "--numa") && i + 1 < argc) {
            const char *mode = argv[++i];
            if (!strcmp(mode, "auto"))
                mp.numa = LOOM_NUMA_AUTO;
            else if (!strcmp(mode, "off"))
                mp.numa = LOOM_NUMA_OFF;
            else if (!strcmp(mode, "distribute"))
                mp.numa = LOOM_NUMA_DISTRIBUTE;
            else if (!strcmp(mode, "isolate"))
                mp.numa = LOOM_NUMA_ISOLATE;
            else {
                fprintf(stderr, "loom-generate: --numa: want auto, off, distribute or isolate\n");
                return 2;
            }
        } else if (!strcmp(a, "-c")) {
            sp.n_ctx = (int32_t)num_arg(argc, argv, &i);
        } else if (sampler_flag(argc, argv, &i, &sampler)) {
            continue;
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
    if (trace_format && !trace_path) {
        fprintf(stderr, "loom-generate: --trace-format needs --trace\n");
        return 2;
    }
    /* The format: as asked, else by the file's extension (".json": Chrome), else JSON Lines. */
    loom_trace_format tfmt = LOOM_TRACE_JSONL;
    if (trace_format) {
        tfmt = strcmp(trace_format, "chrome") == 0 ? LOOM_TRACE_CHROME : LOOM_TRACE_JSONL;
    } else if (trace_path) {
        size_t len = strlen(trace_path);
        if (len >= 5 && strcmp(trace_path + len - 5, ".json") == 0) tfmt = LOOM_TRACE_CHROME;
    }
    loom_trace *trace = NULL;
    if (trace_path) {
        loom_status tst = loom_trace_create(&trace);
        if (tst != LOOM_OK) {
            fprintf(stderr, "loom-generate: --trace: %s: %s\n", loom_status_str(tst),
                    loom_last_error());
            return 1;
        }
        gp.trace = trace;
    }

    double t0 = now_ms();
    loom_model *model = NULL;
    loom_status st = loom_model_load(model_path, &mp, &model);
    if (st != LOOM_OK) {
        fprintf(stderr, "loom-generate: %s: %s\n", loom_status_str(st), loom_last_error());
        loom_trace_free(trace);
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
            loom_trace_free(trace);
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
        loom_trace_free(trace);
        return 1;
    }

    token_log log = {.n_logprobs = sampler.n_logprobs};
    if (sampler.n_logprobs > 0) {
        gp.on_token_info = on_token_info;
        gp.token_info_user_data = &log;
    }
    if (!chat) fputs(prompt, stdout);
    loom_generate_stats stats = {.size = sizeof stats};
    st = loom_generate(session, chat ? text : prompt, &gp, on_piece, NULL, &stats);
    free(text);
    fputc('\n', stdout);
    fflush(stdout);
    if (log.n > 0) print_token_log(stderr, model, &log);
    free(log.infos);
    free(log.alts);
    int rc = 0;
    if (st != LOOM_OK) {
        fprintf(stderr, "loom-generate: %s: %s\n", loom_status_str(st), loom_last_error());
        rc = 1;
    }
    if (trace) {
        /* Written even after a failure: the steps that ran may show why. */
        loom_trace_info ti = {.size = sizeof ti};
        loom_status tst = loom_trace_write(trace, trace_path, tfmt);
        if (tst == LOOM_OK) tst = loom_trace_get_info(trace, &ti);
        if (tst != LOOM_OK) {
            fprintf(stderr, "loom-generate: --trace: %s: %s\n", loom_status_str(tst),
                    loom_last_error());
            rc = 1;
        } else {
            fprintf(stderr, "trace: %zu steps, %zu tokens -> %s (%s)\n", ti.n_steps, ti.n_tokens,
                    trace_path, tfmt == LOOM_TRACE_CHROME ? "chrome" : "jsonl");
        }
        loom_trace_free(trace);
    }
    loom_model_info info = {.size = sizeof info};
    if (loom_model_get_info(model, &info) == LOOM_OK)
        fprintf(stderr, "\nload: %.1f ms (cpu kernels: %s; weights %.1f MiB)\n", load_ms,
                info.cpu_kernels, (double)info.weight_bytes / 1048576.0);
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
