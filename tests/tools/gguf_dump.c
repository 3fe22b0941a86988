/* gguf_dump.c — prints what loom's GGUF reader sees in a file, one fact per line, for debugging
 * and for conformance tests that compare it with the gguf Python package:
 *
 *   version 3
 *   alignment 32
 *   data_offset 1504
 *   n_kv 2
 *   n_tensors 1
 *   kv general.architecture string "llama"
 *   kv tokenizer.ggml.scores array[float32] 32000
 *   tensor blk.0.attn_q.weight q4_K [4096, 4096] offset 0
 *
 * Scalars print their value (floats with enough digits to round-trip), strings quoted with
 * C-style escapes, arrays their element type and length (nested: array[array] n).
 * Exit status: 0 on success, 1 when the file cannot be read (the reason on stderr), 2 on usage. */
#include <inttypes.h>
#include <stdio.h>

#include "gguf/gguf.h"
#include "tensor/types.h"

/* Prints bytes with quotes, backslashes and non-printable bytes escaped. */
static void print_escaped(const char *p, uint64_t len) {
    for (uint64_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)p[i];
        if (c == '"' || c == '\\')
            printf("\\%c", c);
        else if (c == '\n')
            fputs("\\n", stdout);
        else if (c == '\t')
            fputs("\\t", stdout);
        else if (c < 0x20 || c == 0x7f)
            printf("\\x%02x", c);
        else
            putchar(c);
    }
}

static void print_value(const loom__gguf_value *v) {
    switch (v->type) {
    case LOOM_GGUF_U8:
    case LOOM_GGUF_U16:
    case LOOM_GGUF_U32:
    case LOOM_GGUF_U64:
        printf("%" PRIu64, v->u64);
        break;
    case LOOM_GGUF_I8:
    case LOOM_GGUF_I16:
    case LOOM_GGUF_I32:
    case LOOM_GGUF_I64:
        printf("%" PRId64, v->i64);
        break;
    case LOOM_GGUF_F32:
        printf("%.9g", v->f64);
        break;
    case LOOM_GGUF_F64:
        printf("%.17g", v->f64);
        break;
    case LOOM_GGUF_BOOL:
        fputs(v->b ? "true" : "false", stdout);
        break;
    case LOOM_GGUF_STR:
        putchar('"');
        print_escaped(v->str.ptr, v->str.len);
        putchar('"');
        break;
    case LOOM_GGUF_ARR:
        printf("%" PRIu64, v->arr.n);
        break;
    }
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: %s FILE.gguf\n", argv[0]);
        return 2;
    }
    loom__gguf *g = NULL;
    loom_status st = loom__gguf_open(argv[1], &g);
    if (st != LOOM_OK) {
        fprintf(stderr, "%s: %s: %s\n", argv[1], loom_status_str(st), loom_last_error());
        return 1;
    }
    printf("version %" PRIu32 "\n", loom__gguf_version(g));
    printf("alignment %" PRIu64 "\n", loom__gguf_alignment(g));
    printf("data_offset %" PRIu64 "\n", loom__gguf_data_offset(g));
    printf("n_kv %" PRId64 "\n", loom__gguf_n_kv(g));
    printf("n_tensors %" PRId64 "\n", loom__gguf_n_tensors(g));
    for (int64_t i = 0; i < loom__gguf_n_kv(g); i++) {
        const loom__gguf_kv *kv = loom__gguf_kv_at(g, i);
        fputs("kv ", stdout);
        print_escaped(kv->key.ptr, kv->key.len);
        if (kv->value.type == LOOM_GGUF_ARR)
            printf(" array[%s] ", loom__gguf_vtype_name(kv->value.arr.elem_type));
        else
            printf(" %s ", loom__gguf_vtype_name(kv->value.type));
        print_value(&kv->value);
        putchar('\n');
    }
    for (int64_t i = 0; i < loom__gguf_n_tensors(g); i++) {
        const loom__gguf_tensor *t = loom__gguf_tensor_at(g, i);
        printf("tensor %s %s [", t->name, loom__type_name(t->type));
        for (uint32_t d = 0; d < t->n_dims; d++) printf(d ? ", %" PRId64 : "%" PRId64, t->ne[d]);
        printf("] offset %" PRIu64 "\n", t->offset);
    }
    loom__gguf_close(g);
    return 0;
}
