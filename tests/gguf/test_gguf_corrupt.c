/* test_gguf_corrupt.c — the GGUF reader on corrupt files: every prefix of a valid file, cuts at
 * each section boundary, one deliberate corruption per checked field, and a fixed-seed mutation
 * fuzz loop. Each must fail cleanly (LOOM_ERR_BAD_MODEL, or LOOM_ERR_UNSUPPORTED where
 * documented) with a message naming the field — never crash (run it under ASan+UBSan). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include <cmocka.h>

#include <stdlib.h>
#include <string.h>

#include "gguf/gguf.h"
#include "gguf/gguf_writer.h"
#include "tensor/types.h"

/* Opens the first n bytes of p and requires status want with needle in the message; line is
 * the caller's, for the failure report. */
static void expect_fail_at(const uint8_t *p, size_t n, loom_status want, const char *needle,
                           int line) {
    uint8_t *c = exact_copy(p, n);
    loom__gguf *g = (loom__gguf *)&g; /* a sentinel that must stay untouched */
    loom__gguf *const sentinel = g;
    loom_status st = loom__gguf_open_memory(c, n, &g);
    if (st != want || !strstr(loom_last_error(), needle))
        fail_msg("line %d, %zu bytes: want %s with '%s'; got %s: '%s'", line, n,
                 loom_status_str(want), needle, loom_status_str(st), loom_last_error());
    assert_ptr_equal(g, sentinel);
    free(c);
}
#define expect_fail_n(p, n, want, needle) expect_fail_at((p), (n), (want), (needle), __LINE__)

/* Same for a whole buffer, which it frees (so each case reads: build, expect). */
#define expect_fail(b, want, needle)                                                               \
    do {                                                                                           \
        expect_fail_n((b)->p, (b)->n, (want), (needle));                                           \
        tb_free(b);                                                                                \
    } while (0)

/* A file with no kvs and one tensor, padded, followed by data_bytes of data. */
static void one_tensor(tbuf *b, const char *name, uint32_t n_dims, const uint64_t *ne,
                       uint32_t type, uint64_t offset, size_t data_bytes) {
    tb_header(b, 3, 1, 0);
    tb_tensor(b, name, n_dims, ne, type, offset);
    tb_pad(b, 32);
    tb_data(b, b->n, data_bytes);
}

/* A file with one kv whose key is "k" and value type vtype; the caller appends the value. */
static void one_kv(tbuf *b, uint32_t vtype) {
    tb_header(b, 3, 0, 1);
    tb_kv(b, "k", vtype);
}

/* ---- truncation ------------------------------------------------------------------------------ */

static void test_truncate_every_prefix(void **state) {
    (void)state;
    tbuf b = {0};
    layout L;
    build_model(&b, 3, 0, &L);
    for (size_t n = 0; n < b.n; n++) {
        uint8_t *c = exact_copy(b.p, n);
        loom__gguf *g = NULL;
        loom_status st = loom__gguf_open_memory(c, n, &g);
        const char *e = loom_last_error();
        if (st != LOOM_ERR_BAD_MODEL || strncmp(e, "gguf: ", 6) != 0 ||
            !(strstr(e, "past end of file") || strstr(e, "too small") ||
              strstr(e, "too large for the file")))
            fail_msg("prefix of %zu bytes: %s: '%s'", n, loom_status_str(st), e);
        assert_null(g);
        free(c);
    }
    tb_free(&b);
}

static void test_truncate_at_boundaries(void **state) {
    (void)state;
    tbuf b = {0};
    layout L;
    build_model(&b, 3, 0, &L);
    const uint8_t *p = b.p;
    size_t k = L.last_kv_start; /* kv "t.last" = string "end" */
    char want[128];

    expect_fail_n(p, 3, LOOM_ERR_BAD_MODEL, "gguf: header: magic: file too small (3 bytes)");
    expect_fail_n(p, 6, LOOM_ERR_BAD_MODEL, "gguf: header: version: 4 bytes at offset 4");
    expect_fail_n(p, 12, LOOM_ERR_BAD_MODEL, "gguf: header: n_tensors: 8 bytes at offset 8");
    expect_fail_n(p, 20, LOOM_ERR_BAD_MODEL, "gguf: header: n_kv: 8 bytes at offset 16");
    /* early in the kvs the counts alone no longer fit */
    expect_fail_n(p, 60, LOOM_ERR_BAD_MODEL, "too large for the file");

    snprintf(want, sizeof want, "gguf: kv #%d: key length: 8 bytes at offset %zu", (int)L.n_kv - 1,
             k);
    expect_fail_n(p, k + 4, LOOM_ERR_BAD_MODEL, want);
    snprintf(want, sizeof want, "gguf: kv #%d: key length 6 past end of file", (int)L.n_kv - 1);
    expect_fail_n(p, k + 8 + 2, LOOM_ERR_BAD_MODEL, want);
    snprintf(want, sizeof want, "gguf: kv #%d key 't.last': value type: 4 bytes", (int)L.n_kv - 1);
    expect_fail_n(p, k + 14 + 1, LOOM_ERR_BAD_MODEL, want);
    snprintf(want, sizeof want, "gguf: kv #%d key 't.last': string length: 8 bytes",
             (int)L.n_kv - 1);
    expect_fail_n(p, k + 18 + 3, LOOM_ERR_BAD_MODEL, want);
    snprintf(want, sizeof want, "gguf: kv #%d key 't.last': string length 3 past end of file",
             (int)L.n_kv - 1);
    expect_fail_n(p, k + 26 + 1, LOOM_ERR_BAD_MODEL, want);

    expect_fail_n(p, L.kvs_end + 4, LOOM_ERR_BAD_MODEL, "gguf: tensor #0: name length: 8 bytes");
    expect_fail_n(p, L.kvs_end + 8 + 15 + 2, LOOM_ERR_BAD_MODEL,
                  "gguf: tensor #0 'tok_embd.weight': n_dims: 4 bytes");
    expect_fail_n(p, L.kvs_end + 8 + 15 + 4 + 8 + 3, LOOM_ERR_BAD_MODEL,
                  "gguf: tensor #0 'tok_embd.weight': ne: 8 bytes");
    expect_fail_n(p, L.infos_end - 3, LOOM_ERR_BAD_MODEL,
                  "gguf: tensor #2 'output_norm.weight': data offset: 8 bytes");
    assert_true(L.data_start > L.infos_end);
    expect_fail_n(p, L.infos_end, LOOM_ERR_BAD_MODEL, "gguf: data section offset");
    expect_fail_n(p, L.data_start + 100, LOOM_ERR_BAD_MODEL,
                  "gguf: tensor #1 'blk.0.attn_q.weight': data offset 64 + size 136 past end of "
                  "file (data section of 100 bytes");
    expect_fail_n(p, b.n - 1, LOOM_ERR_BAD_MODEL,
                  "'output_norm.weight': data offset 224 + size 16");
    tb_free(&b);
}

/* ---- header ---------------------------------------------------------------------------------- */

static void test_bad_header(void **state) {
    (void)state;
    tbuf b = {0};
    tb_header(&b, 3, 0, 0);
    b.p[0] = 'X';
    expect_fail(&b, LOOM_ERR_BAD_MODEL, "bad magic 58 47 55 46");
    tb_header(&b, 1, 0, 0);
    expect_fail(&b, LOOM_ERR_UNSUPPORTED, "gguf: version 1 not supported");
    tb_header(&b, 4, 0, 0);
    expect_fail(&b, LOOM_ERR_UNSUPPORTED, "gguf: version 4 not supported");
    tb_header(&b, 0, 0, 0);
    expect_fail(&b, LOOM_ERR_UNSUPPORTED, "gguf: version 0 not supported");
    tb_header(&b, 0x03000000u, 0, 0);
    expect_fail(&b, LOOM_ERR_UNSUPPORTED, "big-endian");
    tb_header(&b, 3, 1ull << 60, 0);
    expect_fail(&b, LOOM_ERR_BAD_MODEL, "n_tensors 1152921504606846976 too large for the file");
    tb_header(&b, 3, 0, 1ull << 60);
    expect_fail(&b, LOOM_ERR_BAD_MODEL, "n_kv 1152921504606846976 too large for the file");
    tb_header(&b, 3, UINT64_MAX, UINT64_MAX);
    expect_fail(&b, LOOM_ERR_BAD_MODEL, "too large for the file");
    /* each count fits alone, not both together */
    tb_header(&b, 3, 1, 3);
    for (int i = 0; i < 42; i++) tb_u8(&b, 0);
    expect_fail(&b, LOOM_ERR_BAD_MODEL, "n_kv 3 and n_tensors 1 too large for the file");
    expect_fail_n((const uint8_t *)"", 0, LOOM_ERR_BAD_MODEL, "file too small (0 bytes)");
}

/* ---- key/values ------------------------------------------------------------------------------ */

static void test_bad_kvs(void **state) {
    (void)state;
    tbuf b = {0};

    tb_header(&b, 3, 0, 1);
    tb_u64(&b, UINT64_MAX); /* key length */
    tb_u32(&b, LOOM_GGUF_U8), tb_u8(&b, 1), tb_u8(&b, 1);
    expect_fail(&b, LOOM_ERR_BAD_MODEL,
                "gguf: kv #0: key length 18446744073709551615 past end of file");
    tb_header(&b, 3, 0, 1);
    tb_strn(&b, "", 0), tb_u32(&b, LOOM_GGUF_U8), tb_u8(&b, 1), tb_u8(&b, 0);
    expect_fail(&b, LOOM_ERR_BAD_MODEL, "gguf: kv #0: empty key");
    tb_header(&b, 3, 0, 1);
    tb_strn(&b, "a\0b", 3), tb_u32(&b, LOOM_GGUF_U8), tb_u8(&b, 1);
    expect_fail(&b, LOOM_ERR_BAD_MODEL, "gguf: kv #0: key 'a' contains a NUL byte");
    {
        char *longkey = malloc(LOOM_GGUF_MAX_KEY_LEN + 1);
        assert_non_null(longkey);
        memset(longkey, 'k', LOOM_GGUF_MAX_KEY_LEN + 1);
        tb_header(&b, 3, 0, 1);
        tb_strn(&b, longkey, LOOM_GGUF_MAX_KEY_LEN + 1), tb_u32(&b, LOOM_GGUF_U8), tb_u8(&b, 1);
        expect_fail(&b, LOOM_ERR_BAD_MODEL, "key length 65536 exceeds the limit of 65535 bytes");
        free(longkey);
    }
    tb_header(&b, 3, 0, 3);
    tb_kv(&b, "general.name", LOOM_GGUF_STR), tb_str(&b, "a");
    tb_kv(&b, "x", LOOM_GGUF_U8), tb_u8(&b, 1);
    tb_kv(&b, "general.name", LOOM_GGUF_STR), tb_str(&b, "b");
    expect_fail(&b, LOOM_ERR_BAD_MODEL,
                "gguf: kv #2 key 'general.name': duplicate key (first at kv #0)");
    one_kv(&b, 99), tb_u64(&b, 0);
    expect_fail(&b, LOOM_ERR_BAD_MODEL, "gguf: kv #0 key 'k': value type 99 unknown");
    one_kv(&b, LOOM_GGUF_STR), tb_u64(&b, UINT64_MAX), tb_u32(&b, 0);
    expect_fail(&b, LOOM_ERR_BAD_MODEL,
                "gguf: kv #0 key 'k': string length 18446744073709551615 past end of file");
    one_kv(&b, LOOM_GGUF_STR), tb_u64(&b, 5), tb_put(&b, "abcd", 4);
    expect_fail(&b, LOOM_ERR_BAD_MODEL, "gguf: kv #0 key 'k': string length 5 past end of file");
    one_kv(&b, LOOM_GGUF_BOOL), tb_u8(&b, 2);
    expect_fail(&b, LOOM_ERR_BAD_MODEL, "gguf: kv #0 key 'k': bool has byte value 2");
    tb_header(&b, 3, 0, 2);
    tb_kv(&b, "a.long.key.name", LOOM_GGUF_U8), tb_u8(&b, 1);
    tb_kv(&b, "u", LOOM_GGUF_U64), tb_u32(&b, 7);
    expect_fail(&b, LOOM_ERR_BAD_MODEL, "gguf: kv #1 key 'u': uint64: 8 bytes");
}

/* ---- arrays ---------------------------------------------------------------------------------- */

/* depth levels of arrays, each holding one array, the innermost holding one uint8. */
static void nested(tbuf *b, int depth) {
    one_kv(b, LOOM_GGUF_ARR);
    for (int d = 1; d < depth; d++) tb_arr(b, LOOM_GGUF_ARR, 1);
    tb_arr(b, LOOM_GGUF_U8, 1), tb_u8(b, 9);
}

static void test_bad_arrays(void **state) {
    (void)state;
    tbuf b = {0};

    one_kv(&b, LOOM_GGUF_ARR), tb_arr(&b, LOOM_GGUF_U32, 1ull << 62), tb_u32(&b, 1);
    expect_fail(&b, LOOM_ERR_BAD_MODEL,
                "gguf: kv #0 key 'k': array count 4611686018427387904 of uint32 (4 bytes each) "
                "past end of file");
    one_kv(&b, LOOM_GGUF_ARR), tb_arr(&b, LOOM_GGUF_U64, 3), tb_u64(&b, 1), tb_u64(&b, 2);
    expect_fail(&b, LOOM_ERR_BAD_MODEL, "array count 3 of uint64 (8 bytes each) past end");
    one_kv(&b, LOOM_GGUF_ARR), tb_arr(&b, LOOM_GGUF_STR, UINT64_MAX), tb_str(&b, "a");
    expect_fail(&b, LOOM_ERR_BAD_MODEL, "array count 18446744073709551615 of string past end");
    one_kv(&b, LOOM_GGUF_ARR), tb_arr(&b, LOOM_GGUF_ARR, 1ull << 40), tb_arr(&b, LOOM_GGUF_U8, 0);
    expect_fail(&b, LOOM_ERR_BAD_MODEL, "array count 1099511627776 of array past end");
    one_kv(&b, LOOM_GGUF_ARR), tb_arr(&b, 13, 1), tb_u64(&b, 0);
    expect_fail(&b, LOOM_ERR_BAD_MODEL, "gguf: kv #0 key 'k': array element type 13 unknown");
    /* an unknown element type one level down names the item */
    one_kv(&b, LOOM_GGUF_ARR), tb_arr(&b, LOOM_GGUF_ARR, 2), tb_arr(&b, LOOM_GGUF_U8, 0);
    tb_arr(&b, 200, 0);
    expect_fail(&b, LOOM_ERR_BAD_MODEL,
                "gguf: kv #0 key 'k': array item #1: array element type 200 unknown");
    one_kv(&b, LOOM_GGUF_ARR), tb_arr(&b, LOOM_GGUF_STR, 3), tb_str(&b, "ab");
    tb_u64(&b, 1000), tb_put(&b, "cdefghijklmnopqrstuvwxyz", 24);
    expect_fail(&b, LOOM_ERR_BAD_MODEL,
                "gguf: kv #0 key 'k': array item #1: string length 1000 past end of file");
    one_kv(&b, LOOM_GGUF_ARR), tb_arr(&b, LOOM_GGUF_BOOL, 3), tb_put(&b, "\x01\x00\x07", 3);
    expect_fail(&b, LOOM_ERR_BAD_MODEL, "bool array element #2 has byte value 7");

    /* the nesting limit: exactly LOOM_GGUF_MAX_DEPTH levels parse, one more does not */
    nested(&b, LOOM_GGUF_MAX_DEPTH);
    {
        uint8_t *c = exact_copy(b.p, b.n);
        loom__gguf *g = NULL;
        assert_int_equal(loom__gguf_open_memory(c, b.n, &g), LOOM_OK);
        const loom__gguf_value *v = &loom__gguf_find_kv(g, "k")->value;
        for (int d = 1; d < LOOM_GGUF_MAX_DEPTH; d++) v = &v->arr.items[0];
        assert_int_equal(v->arr.elem_type, LOOM_GGUF_U8);
        assert_int_equal(loom__gguf_arr_i64(v, 0), 9);
        loom__gguf_close(g);
        free(c);
        tb_free(&b);
    }
    nested(&b, LOOM_GGUF_MAX_DEPTH + 1);
    expect_fail(&b, LOOM_ERR_BAD_MODEL, "arrays nested deeper than 8 levels");
    nested(&b, 1000);
    expect_fail(&b, LOOM_ERR_BAD_MODEL, "arrays nested deeper than 8 levels");
}

/* ---- alignment ------------------------------------------------------------------------------- */

static void test_bad_alignment(void **state) {
    (void)state;
    tbuf b = {0};
    tb_header(&b, 3, 0, 1), tb_kv(&b, "general.alignment", LOOM_GGUF_U32), tb_u32(&b, 0);
    expect_fail(&b, LOOM_ERR_BAD_MODEL, "'general.alignment' = 0 is not a nonzero power of two");
    tb_header(&b, 3, 0, 1), tb_kv(&b, "general.alignment", LOOM_GGUF_U32), tb_u32(&b, 48);
    expect_fail(&b, LOOM_ERR_BAD_MODEL, "'general.alignment' = 48 is not a nonzero power of two");
    tb_header(&b, 3, 0, 1), tb_kv(&b, "general.alignment", LOOM_GGUF_STR), tb_str(&b, "32");
    expect_fail(&b, LOOM_ERR_BAD_MODEL, "'general.alignment' has type string, expected uint32");
    tb_header(&b, 3, 0, 1), tb_kv(&b, "general.alignment", LOOM_GGUF_U64), tb_u64(&b, 32);
    expect_fail(&b, LOOM_ERR_BAD_MODEL, "'general.alignment' has type uint64, expected uint32");

    /* offset 32 is fine under the default alignment, not under 64 */
    uint64_t ne[1] = {8};
    tb_header(&b, 3, 1, 1), tb_kv(&b, "general.alignment", LOOM_GGUF_U32), tb_u32(&b, 64);
    tb_tensor(&b, "w", 1, ne, LOOM_TYPE_F32, 32);
    tb_pad(&b, 64);
    tb_data(&b, b.n, 64);
    expect_fail(&b, LOOM_ERR_BAD_MODEL,
                "gguf: tensor #0 'w': data offset 32 is not a multiple of the alignment 64");
}

/* ---- tensor infos ---------------------------------------------------------------------------- */

static void test_bad_tensors(void **state) {
    (void)state;
    tbuf b = {0};
    const char *q = "blk.0.attn_q.weight";
    uint64_t ne[5] = {64, 2, 1, 1, 1};

    one_tensor(&b, q, 2, ne, LOOM_TYPE_F32, 512, 600);
    expect_fail(&b, LOOM_ERR_BAD_MODEL,
                "gguf: tensor #0 'blk.0.attn_q.weight': data offset 512 + size 512 past end of "
                "file (data section of 600 bytes");
    one_tensor(&b, q, 2, ne, LOOM_TYPE_F32, UINT64_MAX - 31, 600);
    expect_fail(&b, LOOM_ERR_BAD_MODEL, "data offset 18446744073709551584 + size 512 overflows");
    one_tensor(&b, q, 2, ne, LOOM_TYPE_F32, 16, 600);
    expect_fail(&b, LOOM_ERR_BAD_MODEL,
                "'blk.0.attn_q.weight': data offset 16 is not a multiple of the alignment 32");
    one_tensor(&b, q, 2, ne, 37, 0, 600);
    expect_fail(&b, LOOM_ERR_UNSUPPORTED, "gguf: tensor #0 'blk.0.attn_q.weight': type id 37");
    one_tensor(&b, q, 2, ne, 4, 0, 600); /* an id the format retired */
    expect_fail(&b, LOOM_ERR_UNSUPPORTED, "type id 4 unknown");
    one_tensor(&b, q, 0, ne, LOOM_TYPE_F32, 0, 600);
    expect_fail(&b, LOOM_ERR_BAD_MODEL, "'blk.0.attn_q.weight': n_dims 0 out of range 1..4");
    one_tensor(&b, q, 5, ne, LOOM_TYPE_F32, 0, 600);
    expect_fail(&b, LOOM_ERR_BAD_MODEL, "'blk.0.attn_q.weight': n_dims 5 out of range 1..4");
    {
        uint64_t neg[2] = {64, 1ull << 63};
        one_tensor(&b, q, 2, neg, LOOM_TYPE_F32, 0, 600);
        expect_fail(&b, LOOM_ERR_BAD_MODEL, "ne[1] = 9223372036854775808 is negative");
    }
    {
        uint64_t big[4] = {1ull << 32, 1ull << 32, 1, 1};
        one_tensor(&b, q, 4, big, LOOM_TYPE_F32, 0, 600);
        expect_fail(&b, LOOM_ERR_BAD_MODEL, "element count overflows int64");
        /* zero dims do not hide an overflow of the others */
        uint64_t zero[4] = {0, 1ull << 32, 1ull << 32, 4};
        one_tensor(&b, q, 4, zero, LOOM_TYPE_F32, 0, 600);
        expect_fail(&b, LOOM_ERR_BAD_MODEL, "element count overflows int64");
    }
    {
        uint64_t wide[1] = {1ull << 62}; /* fits int64 as a count, not as f32 bytes */
        one_tensor(&b, q, 1, wide, LOOM_TYPE_F32, 0, 600);
        expect_fail(&b, LOOM_ERR_BAD_MODEL, "byte size overflows");
        uint64_t rows[2] = {1ull << 31, 1ull << 31};
        one_tensor(&b, q, 2, rows, LOOM_TYPE_F32, 0, 600);
        expect_fail(&b, LOOM_ERR_BAD_MODEL, "rows of 8589934592 bytes: byte size overflows");
    }
    {
        uint64_t odd[2] = {48, 2};
        one_tensor(&b, q, 2, odd, LOOM_TYPE_Q8_0, 0, 600);
        expect_fail(&b, LOOM_ERR_BAD_MODEL, "ne[0] = 48 is not a multiple of the");
    }
    tb_header(&b, 3, 2, 0);
    tb_tensor(&b, q, 1, ne, LOOM_TYPE_F32, 0);
    tb_tensor(&b, q, 1, ne, LOOM_TYPE_F32, 256);
    tb_pad(&b, 32), tb_data(&b, b.n, 512);
    expect_fail(&b, LOOM_ERR_BAD_MODEL,
                "gguf: tensor #1 'blk.0.attn_q.weight': duplicate name (first at tensor #0)");
    one_tensor(&b, "", 1, ne, LOOM_TYPE_F32, 0, 600);
    expect_fail(&b, LOOM_ERR_BAD_MODEL, "gguf: tensor #0: empty name");
    tb_header(&b, 3, 1, 0);
    tb_strn(&b, "bad\0name", 8), tb_u32(&b, 1), tb_u64(&b, 8), tb_u32(&b, 0), tb_u64(&b, 0);
    tb_pad(&b, 32), tb_data(&b, b.n, 32);
    expect_fail(&b, LOOM_ERR_BAD_MODEL, "gguf: tensor #0: name contains a NUL byte");
    /* the file ends before the padding that starts the data section */
    tb_header(&b, 3, 1, 0);
    tb_tensor(&b, q, 1, ne, LOOM_TYPE_F32, 0);
    expect_fail(&b, LOOM_ERR_BAD_MODEL, "gguf: data section offset 96 (alignment 32) past end");
}

/* ---- fuzz ------------------------------------------------------------------------------------ */

static uint64_t rng = 0x243f6a8885a308d3ull;
static uint64_t rnd(void) { /* xorshift64*: fixed seed, reproducible */
    rng ^= rng >> 12;
    rng ^= rng << 25;
    rng ^= rng >> 27;
    return rng * 0x2545f4914f6cdd1dull;
}

/* Reads every byte a parsed value points at, so ASan flags any view outside the image. */
static unsigned walk_value(const loom__gguf_value *v) {
    unsigned sum = 0;
    if (v->type == LOOM_GGUF_STR) return v->str.len ? (unsigned char)v->str.ptr[v->str.len - 1] : 0;
    if (v->type != LOOM_GGUF_ARR) return 0;
    for (uint64_t i = 0; i < v->arr.n; i++) {
        if (v->arr.elem_type == LOOM_GGUF_STR) {
            loom__gguf_str s = v->arr.strs[i];
            if (s.len) sum += (unsigned char)s.ptr[0] + (unsigned char)s.ptr[s.len - 1];
        } else if (v->arr.elem_type == LOOM_GGUF_ARR) {
            sum += walk_value(&v->arr.items[i]);
        } else {
            sum += (unsigned)loom__gguf_arr_i64(v, i) + (unsigned)loom__gguf_arr_f32(v, i);
        }
    }
    return sum;
}

static void test_fuzz(void **state) {
    (void)state;
    tbuf b = {0};
    layout L;
    build_model(&b, 3, 0, &L);
    int n_ok = 0, n_bad = 0;
    for (int iter = 0; iter < 4000; iter++) {
        size_t n = b.n;
        uint8_t *c = exact_copy(b.p, n);
        if (iter % 4 == 3) {
            /* a valid header followed by noise */
            n = 24 + rnd() % 512;
            free(c);
            c = malloc(n);
            assert_non_null(c);
            memcpy(c, b.p, 24);
            c[16] = (uint8_t)(rnd() % 8); /* a few kvs */
            memset(c + 17, 0, 7);
            for (size_t i = 24; i < n; i++) c[i] = (uint8_t)(rnd() % 16 == 0 ? rnd() : rnd() % 14);
        } else {
            int n_mut = 1 + (int)(rnd() % 4);
            for (int m = 0; m < n_mut; m++) {
                size_t pos = rnd() % L.data_start; /* the metadata, where the parser looks */
                switch (rnd() % 4) {
                case 0:
                    c[pos] = (uint8_t)rnd();
                    break;
                case 1:
                    c[pos] ^= (uint8_t)(1u << (rnd() % 8));
                    break;
                case 2:
                    c[pos] = 0xff;
                    break;
                default:
                    if (pos + 8 <= n) memset(c + pos, rnd() % 2 ? 0xff : 0x00, 8);
                    break;
                }
            }
            if (rnd() % 8 == 0) n = rnd() % n;
        }
        loom__gguf *g = NULL;
        loom_status st = loom__gguf_open_memory(c, n, &g);
        if (st == LOOM_OK) {
            n_ok++;
            unsigned sum = 0;
            for (int64_t i = 0; i < loom__gguf_n_kv(g); i++)
                sum += walk_value(&loom__gguf_kv_at(g, i)->value);
            for (int64_t i = 0; i < loom__gguf_n_tensors(g); i++) {
                const loom__gguf_tensor *t = loom__gguf_tensor_at(g, i);
                assert_ptr_equal(loom__gguf_find_tensor(g, t->name), t);
                assert_true((const uint8_t *)t->data + t->bytes <= c + n);
                if (t->bytes) sum += ((const uint8_t *)t->data)[t->bytes - 1];
            }
            (void)sum;
            loom__gguf_close(g);
        } else {
            n_bad++;
            if (!(st == LOOM_ERR_BAD_MODEL || st == LOOM_ERR_UNSUPPORTED) ||
                strncmp(loom_last_error(), "gguf: ", 6) != 0)
                fail_msg("iteration %d: %s: '%s'", iter, loom_status_str(st), loom_last_error());
            assert_null(g);
        }
        free(c);
    }
    print_message("fuzz: %d opened, %d refused\n", n_ok, n_bad);
    assert_true(n_ok > 100 && n_bad > 1000); /* both paths were exercised */
    tb_free(&b);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_truncate_every_prefix),
        cmocka_unit_test(test_truncate_at_boundaries),
        cmocka_unit_test(test_bad_header),
        cmocka_unit_test(test_bad_kvs),
        cmocka_unit_test(test_bad_arrays),
        cmocka_unit_test(test_bad_alignment),
        cmocka_unit_test(test_bad_tensors),
        cmocka_unit_test(test_fuzz),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
