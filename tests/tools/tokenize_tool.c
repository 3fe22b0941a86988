/* tokenize_tool.c — drives loom's tokenizer on a GGUF file for
 * tests/conformance/test_tokenizer.py, through loom__gguf_open + loom__tokenizer_load (so it works
 * for any architecture's file, vocab only). One request per stdin line, one answer per stdout
 * line; byte strings travel as hex ("-" for empty) so any byte can pass:
 *   T <flags> <hex text>    tokenize           -> "OK <id> <id> ..."
 *   D <flags> <id,id,...|-> detokenize         -> "OK <hex>"
 *   P <flags> <id>          token_to_piece     -> "OK <hex>"
 *   I                       facts              -> "OK <n_vocab> <bos> <eos>"
 *   E <id>                  is_eog, is_control -> "OK <0|1> <0|1>"
 * A failure answers "ERR <status description> <message>"; a file that does not load answers
 * that instead of "READY" and exits 1. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "loom.h"
#include "gguf/gguf.h"
#include "tokenizer/tokenizer.h"

static int hexval(int c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* Decodes hex in place; returns the byte count, or -1 on a malformed string. */
static long unhex(char *s) {
    if (strcmp(s, "-") == 0) return 0;
    size_t n = strlen(s);
    if (n % 2) return -1;
    for (size_t i = 0; i < n / 2; i++) {
        int hi = hexval(s[2 * i]), lo = hexval(s[2 * i + 1]);
        if (hi < 0 || lo < 0) return -1;
        s[i] = (char)(hi * 16 + lo);
    }
    return (long)(n / 2);
}

static void print_hex(const char *p, size_t n) {
    printf("OK ");
    if (n == 0) printf("-");
    for (size_t i = 0; i < n; i++) printf("%02x", (unsigned char)p[i]);
    printf("\n");
}

static void print_err(loom_status st) {
    printf("ERR %s %s\n", loom_status_str(st), loom_last_error());
}

static void do_tokenize(const loom__tokenizer *t, unsigned flags, char *arg) {
    long n = unhex(arg);
    if (n < 0) {
        printf("ERR bad-request hex\n");
        return;
    }
    size_t need = 0;
    loom_status st = loom__tokenizer_encode(t, arg, (size_t)n, flags, NULL, 0, &need);
    if (st != LOOM_OK && st != LOOM_ERR_BUFFER_TOO_SMALL) {
        print_err(st);
        return;
    }
    loom_token *ids = malloc((need ? need : 1) * sizeof *ids);
    if (!ids) abort();
    st = loom__tokenizer_encode(t, arg, (size_t)n, flags, ids, need, &need);
    if (st != LOOM_OK) {
        print_err(st);
    } else {
        printf("OK");
        for (size_t i = 0; i < need; i++) printf(" %d", (int)ids[i]);
        printf("\n");
    }
    free(ids);
}

static void do_detokenize(const loom__tokenizer *t, unsigned flags, char *arg) {
    size_t n = 0, cap = 16;
    loom_token *ids = malloc(cap * sizeof *ids);
    if (!ids) abort();
    if (strcmp(arg, "-") != 0) {
        for (char *tok = strtok(arg, ","); tok; tok = strtok(NULL, ",")) {
            if (n == cap) {
                cap *= 2;
                ids = realloc(ids, cap * sizeof *ids);
                if (!ids) abort();
            }
            ids[n++] = (loom_token)strtol(tok, NULL, 10);
        }
    }
    size_t need = 0;
    loom_status st = loom__tokenizer_decode(t, ids, n, flags, NULL, 0, &need);
    if (st != LOOM_OK && st != LOOM_ERR_BUFFER_TOO_SMALL) {
        print_err(st);
        free(ids);
        return;
    }
    char *out = malloc(need ? need : 1);
    if (!out) abort();
    st = loom__tokenizer_decode(t, ids, n, flags, out, need, &need);
    if (st != LOOM_OK) {
        print_err(st);
    } else {
        print_hex(out, need);
    }
    free(out);
    free(ids);
}

static void do_piece(const loom__tokenizer *t, unsigned flags, const char *arg) {
    char buf[4096];
    size_t n = 0;
    loom_status st =
        loom__tokenizer_piece(t, (loom_token)strtol(arg, NULL, 10), flags, buf, sizeof buf, &n);
    if (st != LOOM_OK) {
        print_err(st);
    } else {
        print_hex(buf, n);
    }
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: %s MODEL.gguf < requests\n", argv[0]);
        return 2;
    }
    loom__gguf *g = NULL;
    loom__tokenizer *t = NULL;
    loom_status st = loom__gguf_open(argv[1], &g);
    if (st == LOOM_OK) st = loom__tokenizer_load(g, &t);
    if (st != LOOM_OK) {
        /* the load failure is an answer too: the test checks bad files this way */
        print_err(st);
        loom__gguf_close(g);
        return 1;
    }
    printf("READY\n");
    fflush(stdout);

    char *line = NULL;
    size_t line_cap = 0;
    ssize_t got;
    while ((got = getline(&line, &line_cap, stdin)) > 0) {
        if (line[got - 1] == '\n') line[got - 1] = '\0';
        char *save = NULL;
        char *cmd = strtok_r(line, " ", &save);
        if (!cmd) continue;
        if (strcmp(cmd, "I") == 0) {
            printf("OK %d %d %d\n", (int)loom__tokenizer_n_vocab(t), (int)loom__tokenizer_bos(t),
                   (int)loom__tokenizer_eos(t));
        } else if (strcmp(cmd, "E") == 0) {
            char *a = strtok_r(NULL, " ", &save);
            loom_token id = a ? (loom_token)strtol(a, NULL, 10) : -1;
            printf("OK %d %d\n", loom__tokenizer_is_eog(t, id), loom__tokenizer_is_control(t, id));
        } else {
            char *f = strtok_r(NULL, " ", &save);
            char *a = strtok_r(NULL, " ", &save);
            if (!f || !a) {
                printf("ERR bad-request %s\n", cmd);
            } else if (strcmp(cmd, "T") == 0) {
                do_tokenize(t, (unsigned)strtoul(f, NULL, 10), a);
            } else if (strcmp(cmd, "D") == 0) {
                do_detokenize(t, (unsigned)strtoul(f, NULL, 10), a);
            } else if (strcmp(cmd, "P") == 0) {
                do_piece(t, (unsigned)strtoul(f, NULL, 10), a);
            } else {
                printf("ERR bad-request %s\n", cmd);
            }
        }
        fflush(stdout);
    }
    free(line);
    loom__tokenizer_free(t);
    loom__gguf_close(g);
    return 0;
}
