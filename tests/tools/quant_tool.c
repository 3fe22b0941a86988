/* quant_tool.c — exposes loom's type table and reference (de)quantizers on raw files, so the
 * conformance tests can compare them with the `gguf` Python package.
 *
 *   quant_tool info    TYPE                     name block_elems block_bytes quantized can_deq
 *   quant_tool quant   TYPE N IN.f32 OUT.bin    float32 rows of N values -> rows of TYPE
 *   quant_tool dequant TYPE N IN.bin OUT.f32    rows of TYPE -> float32
 *   quant_tool dot     TYPE N W.bin X.f32 OUT.f32   loom__vec_dot_f32 of each row of W with X[N]
 *
 * TYPE is a numeric GGUF type id; the number of rows is the input size over the row size.
 * Exit status: 0 success, 1 loom refused the operation, 2 usage or I/O error. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tensor/quant.h"
#include "tensor/types.h"

static int usage(void) {
    fprintf(stderr, "usage: quant_tool info TYPE\n"
                    "       quant_tool quant|dequant TYPE N IN OUT\n"
                    "       quant_tool dot TYPE N W X OUT\n");
    return 2;
}

/* Reads a whole file into a malloc'd buffer (at least 1 byte allocated). */
static void *read_file(const char *path, size_t *size) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "quant_tool: open %s: %s\n", path, strerror(errno));
        return NULL;
    }
    void *buf = NULL;
    long len = -1;
    if (fseek(f, 0, SEEK_END) == 0) len = ftell(f);
    if (len >= 0 && fseek(f, 0, SEEK_SET) == 0) buf = malloc((size_t)len + 1);
    if (buf && fread(buf, 1, (size_t)len, f) != (size_t)len) {
        free(buf);
        buf = NULL;
    }
    fclose(f);
    if (!buf) fprintf(stderr, "quant_tool: cannot read %s\n", path);
    *size = (size_t)len;
    return buf;
}

static int write_file(const char *path, const void *buf, size_t size) {
    FILE *f = fopen(path, "wb");
    if (!f) {
        fprintf(stderr, "quant_tool: create %s: %s\n", path, strerror(errno));
        return 2;
    }
    int ok = fwrite(buf, 1, size, f) == size;
    ok &= fclose(f) == 0;
    if (!ok) fprintf(stderr, "quant_tool: write %s failed\n", path);
    return ok ? 0 : 2;
}

static int parse_u32(const char *s, uint32_t *out) {
    char *end;
    errno = 0;
    unsigned long v = strtoul(s, &end, 10);
    if (errno || end == s || *end || v > UINT32_MAX) return 0;
    *out = (uint32_t)v;
    return 1;
}

static int parse_i64(const char *s, int64_t *out) {
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || end == s || *end || v <= 0) return 0;
    *out = (int64_t)v;
    return 1;
}

static int cmd_info(uint32_t t) {
    const loom__type_traits *tr = loom__type_get_traits(t);
    if (!tr) {
        printf("%s\n", loom__type_name(t));
        return 1;
    }
    printf("%s %u %u %d %d\n", tr->name, tr->block_elems, tr->block_bytes, tr->quantized,
           tr->can_dequantize);
    return 0;
}

/* quant / dequant / dot over every row of the input file. */
static int cmd_rows(const char *cmd, uint32_t t, int64_t n, char **paths) {
    size_t row_bytes;
    if (!loom__type_row_bytes(t, n, &row_bytes)) {
        fprintf(stderr, "quant_tool: no row of %lld values of type %s\n", (long long)n,
                loom__type_name(t));
        return 1;
    }
    size_t f32_row = (size_t)n * sizeof(float);
    int quant = strcmp(cmd, "quant") == 0, dot = strcmp(cmd, "dot") == 0;
    size_t in_row = quant ? f32_row : row_bytes;
    size_t out_row = quant ? row_bytes : (dot ? sizeof(float) : f32_row);

    size_t in_size, x_size = 0;
    unsigned char *in = read_file(paths[0], &in_size);
    float *x = dot ? read_file(paths[1], &x_size) : NULL;
    const char *out_path = paths[dot ? 2 : 1];
    int rc = 2;
    unsigned char *out = NULL;
    if (!in || (dot && !x)) goto done;
    if (in_size == 0 || in_size % in_row != 0 || (dot && x_size != f32_row)) {
        fprintf(stderr, "quant_tool: input sizes do not fit rows of %lld values\n", (long long)n);
        goto done;
    }
    size_t rows = in_size / in_row;
    out = malloc(rows * out_row + 1);
    if (!out) goto done;
    rc = 1;
    for (size_t r = 0; r < rows; r++) {
        const void *src = in + r * in_row;
        void *dst = out + r * out_row;
        if (quant) {
            if (!loom__quantize_row(t, src, dst, n)) goto done;
        } else if (dot) {
            float v = loom__vec_dot_f32(src, t, x, n);
            memcpy(dst, &v, sizeof v);
        } else if (!loom__dequantize_row(t, src, dst, n)) {
            goto done;
        }
    }
    rc = write_file(out_path, out, rows * out_row);
done:
    if (rc == 1)
        fprintf(stderr, "quant_tool: loom refused %s of type %s\n", cmd, loom__type_name(t));
    free(in);
    free(x);
    free(out);
    return rc;
}

int main(int argc, char **argv) {
    uint32_t t;
    int64_t n;
    if (argc < 3 || !parse_u32(argv[2], &t)) return usage();
    if (strcmp(argv[1], "info") == 0 && argc == 3) return cmd_info(t);
    if (argc < 4 || !parse_i64(argv[3], &n)) return usage();
    if ((strcmp(argv[1], "quant") == 0 || strcmp(argv[1], "dequant") == 0) && argc == 6)
        return cmd_rows(argv[1], t, n, argv + 4);
    if (strcmp(argv[1], "dot") == 0 && argc == 7) return cmd_rows(argv[1], t, n, argv + 4);
    return usage();
}
