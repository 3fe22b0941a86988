/* qdot_tool.c — exposes loom's activation quantizers and integer-activation dot products
 * (tensor/qdot.h) on raw files, so tests/conformance/test_qdot_ggml.py can compare them with
 * llama.cpp's own (ggml's quantize_row_q8_* and ggml_vec_dot_*).
 *
 *   qdot_tool quant ACT N IN.f32 OUT.bin          float32 rows of N values -> rows of ACT
 *   qdot_tool dot   WTYPE N W.bin XQ.bin OUT.f32  loom__vec_dot_q of row r of W with row r of XQ
 *
 * ACT and WTYPE are numeric GGUF type ids; XQ rows are in loom__vec_dot_type(WTYPE)'s format.
 * The number of rows is the input size over the row size.
 * Exit status: 0 success, 1 loom refused the operation, 2 usage or I/O error. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tensor/qdot.h"
#include "tensor/types.h"

static int usage(void) {
    fprintf(stderr, "usage: qdot_tool quant ACT N IN.f32 OUT.bin\n"
                    "       qdot_tool dot WTYPE N W.bin XQ.bin OUT.f32\n");
    return 2;
}

/* Reads a whole file into a malloc'd buffer (at least 1 byte allocated, 64-byte aligned so
 * q8_K rows keep their float alignment). */
static void *read_file(const char *path, size_t *size) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "qdot_tool: open %s: %s\n", path, strerror(errno));
        return NULL;
    }
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    size_t cap = ((size_t)(len > 0 ? len : 1) + 63) / 64 * 64;
    void *buf = len >= 0 ? aligned_alloc(64, cap) : NULL;
    if (!buf || fread(buf, 1, (size_t)len, f) != (size_t)len) {
        fprintf(stderr, "qdot_tool: read %s failed\n", path);
        free(buf);
        fclose(f);
        return NULL;
    }
    fclose(f);
    *size = (size_t)len;
    return buf;
}

static int write_file(const char *path, const void *data, size_t size) {
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(data, 1, size, f) != size) {
        fprintf(stderr, "qdot_tool: write %s failed\n", path);
        if (f) fclose(f);
        return 2;
    }
    fclose(f);
    return 0;
}

static int cmd_quant(uint32_t act, int64_t n, const char *in, const char *out) {
    size_t in_bytes, row_bytes;
    if (!loom__type_row_bytes(act, n, &row_bytes)) return 1;
    float *x = read_file(in, &in_bytes);
    if (!x) return 2;
    size_t rows = in_bytes / ((size_t)n * sizeof(float));
    unsigned char *q = malloc(rows * row_bytes + 64);
    int rc = q ? 0 : 2;
    for (size_t r = 0; rc == 0 && r < rows; r++)
        if (!loom__quantize_activations(act, x + r * (size_t)n, q + r * row_bytes, n)) rc = 1;
    if (rc == 0) rc = write_file(out, q, rows * row_bytes);
    free(x);
    free(q);
    return rc;
}

static int cmd_dot(uint32_t wt, int64_t n, const char *wpath, const char *xpath, const char *out) {
    uint32_t act;
    size_t w_row, x_row, w_bytes, x_bytes;
    if (!loom__vec_dot_type(wt, &act) || !loom__type_row_bytes(wt, n, &w_row) ||
        !loom__type_row_bytes(act, n, &x_row))
        return 1;
    unsigned char *w = read_file(wpath, &w_bytes);
    unsigned char *x = read_file(xpath, &x_bytes);
    size_t rows = w && x ? w_bytes / w_row : 0;
    float *res = malloc(rows * sizeof(float) + 1);
    int rc = w && x && res && x_bytes / x_row >= rows ? 0 : 2;
    for (size_t r = 0; rc == 0 && r < rows; r++) /* x rows stay 4-byte aligned (q8_K) */
        res[r] = loom__vec_dot_q(wt, w + r * w_row, x + r * x_row, n);
    if (rc == 0) rc = write_file(out, res, rows * sizeof(float));
    free(w);
    free(x);
    free(res);
    return rc;
}

int main(int argc, char **argv) {
    if (argc < 2) return usage();
    if (strcmp(argv[1], "quant") == 0 && argc == 6)
        return cmd_quant((uint32_t)atoi(argv[2]), atoll(argv[3]), argv[4], argv[5]);
    if (strcmp(argv[1], "dot") == 0 && argc == 7)
        return cmd_dot((uint32_t)atoi(argv[2]), atoll(argv[3]), argv[4], argv[5], argv[6]);
    return usage();
}
