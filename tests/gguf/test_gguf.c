/* test_gguf.c — the GGUF reader on valid files: v2 and v3, every value type, nested arrays,
 * tensors, custom alignment, a file on disk through mmap — all read back exactly; and the typed
 * getters with their refusals. Corrupt files are tested in test_gguf_corrupt.c. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include <cmocka.h>

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "gguf/gguf.h"
#include "gguf/gguf_impl.h"
#include "gguf/gguf_writer.h"
#include "tensor/types.h"

static loom__gguf *open_ok(const tbuf *b, uint8_t **copy) {
    loom__gguf *g = NULL;
    *copy = exact_copy(b->p, b->n);
    loom_status st = loom__gguf_open_memory(*copy, b->n, &g);
    if (st != LOOM_OK) fail_msg("open failed: %s: %s", loom_status_str(st), loom_last_error());
    assert_non_null(g);
    return g;
}

/* ---- valid files ----------------------------------------------------------------------------- */

static void check_tensors(const loom__gguf *g, const layout *L, const uint8_t *base) {
    assert_int_equal(loom__gguf_n_tensors(g), N_TENSORS);
    assert_int_equal(loom__gguf_data_offset(g), L->data_start);
    assert_int_equal(L->data_start % loom__gguf_alignment(g), 0);
    for (int i = 0; i < N_TENSORS; i++) {
        const loom__gguf_tensor *t = loom__gguf_tensor_at(g, i);
        assert_non_null(t);
        assert_ptr_equal(loom__gguf_find_tensor(g, k_tensors[i].name), t);
        assert_string_equal(t->name, k_tensors[i].name);
        assert_int_equal(t->n_dims, k_tensors[i].n_dims);
        for (int d = 0; d < 4; d++)
            assert_int_equal(t->ne[d], d < (int)t->n_dims ? (int64_t)k_tensors[i].ne[d] : 1);
        assert_int_equal(t->type, k_tensors[i].type);
        assert_int_equal(t->offset, L->offsets[i]);
        assert_int_equal(t->bytes, k_tensors[i].bytes);
        assert_int_equal(t->offset % loom__gguf_alignment(g), 0);
        assert_ptr_equal(t->data, base + L->data_start + t->offset);
        const uint8_t *d = t->data;
        for (size_t k = 0; k < t->bytes; k++) assert_int_equal(d[k], tb_pattern(t->offset + k));
    }
    assert_null(loom__gguf_tensor_at(g, -1));
    assert_null(loom__gguf_tensor_at(g, N_TENSORS));
    assert_null(loom__gguf_find_tensor(g, "tok_embd.weigh"));
    assert_null(loom__gguf_find_tensor(g, "missing"));
}

static const loom__gguf_value *val(const loom__gguf *g, const char *key, loom__gguf_vtype type) {
    const loom__gguf_kv *kv = loom__gguf_find_kv(g, key);
    if (!kv) fail_msg("key %s missing", key);
    assert_true(loom__gguf_str_eq(kv->key, key));
    assert_int_equal(kv->value.type, type);
    return &kv->value;
}

static void check_values(const loom__gguf *g) {
    assert_true(loom__gguf_str_eq(val(g, "general.architecture", LOOM_GGUF_STR)->str, "llama"));
    assert_int_equal(val(g, "t.u8", LOOM_GGUF_U8)->u64, 200);
    assert_int_equal(val(g, "t.i8", LOOM_GGUF_I8)->i64, -100);
    assert_int_equal(val(g, "t.u16", LOOM_GGUF_U16)->u64, 60000);
    assert_int_equal(val(g, "t.i16", LOOM_GGUF_I16)->i64, -30000);
    assert_int_equal(val(g, "t.u32", LOOM_GGUF_U32)->u64, 4000000000u);
    assert_int_equal(val(g, "t.i32", LOOM_GGUF_I32)->i64, -2000000000);
    assert_true(val(g, "t.f32", LOOM_GGUF_F32)->f64 == 3.5);
    assert_true(val(g, "t.bool", LOOM_GGUF_BOOL)->b);
    assert_int_equal(val(g, "t.u64", LOOM_GGUF_U64)->u64, (1ull << 40) + 5);
    assert_int_equal(val(g, "t.i64", LOOM_GGUF_I64)->i64, -(1ll << 40));
    assert_true(val(g, "t.f64", LOOM_GGUF_F64)->f64 == 0.1);
    loom__gguf_str s = val(g, "t.str_nul", LOOM_GGUF_STR)->str;
    assert_int_equal(s.len, 3);
    assert_memory_equal(s.ptr, "a\0b", 3);
    assert_false(loom__gguf_str_eq(s, "a"));

    const loom__gguf_value *a = val(g, "t.arr_u8", LOOM_GGUF_ARR);
    assert_int_equal(a->arr.elem_type, LOOM_GGUF_U8);
    assert_int_equal(a->arr.n, 3);
    assert_memory_equal(a->arr.raw, "\x01\x02\xfa", 3);
    assert_int_equal(loom__gguf_arr_i64(a, 2), 250);
    assert_int_equal(loom__gguf_arr_i64(a, 3), 0); /* past the end */
    a = val(g, "t.arr_f32", LOOM_GGUF_ARR);
    assert_true(loom__gguf_arr_f32(a, 0) == 1.5f);
    assert_true(loom__gguf_arr_f32(a, 1) == -2.25f);
    assert_true(loom__gguf_arr_f32(a, 2) == 1e30f);
    assert_int_equal(loom__gguf_arr_i64(a, 1), -2);        /* truncated toward zero */
    assert_int_equal(loom__gguf_arr_i64(a, 2), INT64_MAX); /* saturated */
    a = val(g, "t.arr_str", LOOM_GGUF_ARR);
    assert_int_equal(a->arr.n, 3);
    assert_null(a->arr.raw);
    assert_true(loom__gguf_str_eq(a->arr.strs[0], "x"));
    assert_true(loom__gguf_str_eq(a->arr.strs[1], "yz"));
    assert_true(loom__gguf_str_eq(a->arr.strs[2], ""));
    assert_true(loom__gguf_arr_f32(a, 0) == 0.0f); /* not numeric */
    a = val(g, "t.arr_i64", LOOM_GGUF_ARR);
    assert_int_equal(loom__gguf_arr_i64(a, 0), -1);
    assert_int_equal(loom__gguf_arr_i64(a, 1), INT64_MAX);
    a = val(g, "t.arr_bool", LOOM_GGUF_ARR);
    assert_int_equal(loom__gguf_arr_i64(a, 0), 1);
    assert_int_equal(loom__gguf_arr_i64(a, 1), 0);

    a = val(g, "t.arr_nested", LOOM_GGUF_ARR);
    assert_int_equal(a->arr.elem_type, LOOM_GGUF_ARR);
    assert_int_equal(a->arr.n, 2);
    assert_int_equal(a->arr.items[0].type, LOOM_GGUF_ARR);
    assert_int_equal(a->arr.items[0].arr.elem_type, LOOM_GGUF_I32);
    assert_int_equal(a->arr.items[0].arr.n, 2);
    assert_int_equal(loom__gguf_arr_i64(&a->arr.items[0], 0), 1);
    assert_int_equal(loom__gguf_arr_i64(&a->arr.items[0], 1), 2);
    assert_int_equal(a->arr.items[1].arr.n, 1);
    assert_int_equal(loom__gguf_arr_i64(&a->arr.items[1], 0), -3);
    a = val(g, "t.arr_deep", LOOM_GGUF_ARR);
    const loom__gguf_value *inner = &a->arr.items[0].arr.items[0];
    assert_int_equal(inner->arr.elem_type, LOOM_GGUF_STR);
    assert_true(loom__gguf_str_eq(inner->arr.strs[0], "a"));
    assert_int_equal(a->arr.items[1].arr.elem_type, LOOM_GGUF_STR);
    assert_int_equal(a->arr.items[1].arr.n, 0);
    a = val(g, "t.arr_empty", LOOM_GGUF_ARR);
    assert_int_equal(a->arr.n, 0);
    assert_int_equal(a->arr.elem_type, LOOM_GGUF_U32);

    assert_int_equal(loom__gguf_arr_i64(val(g, "t.arr_i8", LOOM_GGUF_ARR), 0), -5);
    assert_int_equal(loom__gguf_arr_i64(val(g, "t.arr_u16", LOOM_GGUF_ARR), 0), 65535);
    assert_int_equal(loom__gguf_arr_i64(val(g, "t.arr_i16", LOOM_GGUF_ARR), 0), -32768);
    assert_int_equal(loom__gguf_arr_i64(val(g, "t.arr_u32", LOOM_GGUF_ARR), 0), UINT32_MAX);
    assert_int_equal(loom__gguf_arr_i64(val(g, "t.arr_i32", LOOM_GGUF_ARR), 0), -7);
    assert_int_equal(loom__gguf_arr_i64(val(g, "t.arr_u64", LOOM_GGUF_ARR), 0), INT64_MAX);
    assert_true(loom__gguf_arr_f32(val(g, "t.arr_u64", LOOM_GGUF_ARR), 0) ==
                18446744073709551616.0f);
    assert_true(loom__gguf_arr_f32(val(g, "t.arr_f64", LOOM_GGUF_ARR), 0) == 0.25f);
    assert_true(loom__gguf_str_eq(val(g, "t.last", LOOM_GGUF_STR)->str, "end"));
    assert_null(loom__gguf_find_kv(g, "t.missing"));
    assert_null(loom__gguf_find_kv(g, "t.u"));
}

static void test_valid_v3(void **state) {
    (void)state;
    tbuf b = {0};
    layout L;
    uint8_t *copy;
    build_model(&b, 3, 0, &L);
    loom__gguf *g = open_ok(&b, &copy);
    assert_int_equal(loom__gguf_version(g), 3);
    assert_int_equal(loom__gguf_alignment(g), 32);
    assert_int_equal(loom__gguf_file_size(g), b.n);
    assert_int_equal(loom__gguf_n_kv(g), L.n_kv);
    /* kv_at follows file order; find_kv agrees with it */
    for (int64_t i = 0; i < L.n_kv; i++) {
        const loom__gguf_kv *kv = loom__gguf_kv_at(g, i);
        assert_non_null(kv);
        char key[64];
        snprintf(key, sizeof key, "%.*s", (int)kv->key.len, kv->key.ptr);
        assert_ptr_equal(loom__gguf_find_kv(g, key), kv);
    }
    assert_null(loom__gguf_kv_at(g, L.n_kv));
    assert_null(loom__gguf_kv_at(g, -1));
    assert_true(loom__gguf_str_eq(loom__gguf_kv_at(g, 0)->key, "general.architecture"));
    check_values(g);
    check_tensors(g, &L, copy);
    loom__gguf_close(g);
    loom__gguf_close(NULL);
    free(copy);
    tb_free(&b);
}

static void test_valid_v2(void **state) {
    (void)state;
    tbuf b = {0};
    layout L;
    uint8_t *copy;
    build_model(&b, 2, 0, &L);
    loom__gguf *g = open_ok(&b, &copy);
    assert_int_equal(loom__gguf_version(g), 2);
    check_values(g);
    check_tensors(g, &L, copy);
    loom__gguf_close(g);
    free(copy);
    tb_free(&b);
}

static void test_alignment_64(void **state) {
    (void)state;
    tbuf b = {0};
    layout L;
    uint8_t *copy;
    build_model(&b, 3, 64, &L);
    assert_int_equal(L.offsets[1], 64);
    assert_int_equal(L.offsets[2], 256); /* 64 + 136 rounded up to 64, not to 32 */
    loom__gguf *g = open_ok(&b, &copy);
    assert_int_equal(loom__gguf_alignment(g), 64);
    assert_int_equal(loom__gguf_data_offset(g) % 64, 0);
    check_tensors(g, &L, copy);
    loom__gguf_close(g);
    free(copy);
    tb_free(&b);
}

/* Many tensors: every one is found through the hash index. */
static void test_many_tensors(void **state) {
    (void)state;
    enum { N = 2000 };
    tbuf b = {0};
    uint8_t *copy;
    uint64_t ne[1] = {8};
    char name[32];
    tb_header(&b, 3, N, 0);
    for (int i = 0; i < N; i++) {
        snprintf(name, sizeof name, "blk.%d.w", i);
        tb_tensor(&b, name, 1, ne, LOOM_TYPE_F32, (uint64_t)i * 32);
    }
    tb_pad(&b, 32);
    size_t data_start = b.n;
    tb_data(&b, data_start, (size_t)N * 32);
    loom__gguf *g = open_ok(&b, &copy);
    for (int i = 0; i < N; i++) {
        snprintf(name, sizeof name, "blk.%d.w", i);
        const loom__gguf_tensor *t = loom__gguf_find_tensor(g, name);
        assert_non_null(t);
        assert_ptr_equal(t, loom__gguf_tensor_at(g, i));
        assert_ptr_equal(t->data, copy + data_start + (size_t)i * 32);
    }
    loom__gguf_close(g);
    free(copy);
    tb_free(&b);
}

/* A zero-length dim is an empty tensor: legal, size 0. No kvs and no tensors is legal too. */
static void test_edge_shapes(void **state) {
    (void)state;
    tbuf b = {0};
    uint8_t *copy;
    uint64_t ne[2] = {0, 5};
    tb_header(&b, 3, 1, 0);
    tb_tensor(&b, "empty", 2, ne, LOOM_TYPE_Q8_0, 0);
    tb_pad(&b, 32);
    loom__gguf *g = open_ok(&b, &copy);
    assert_int_equal(loom__gguf_tensor_at(g, 0)->bytes, 0);
    assert_int_equal(loom__gguf_tensor_at(g, 0)->ne[1], 5);
    loom__gguf_close(g);
    free(copy);
    tb_free(&b);

    tb_header(&b, 3, 0, 0);
    g = open_ok(&b, &copy);
    assert_int_equal(loom__gguf_n_kv(g), 0);
    assert_int_equal(loom__gguf_n_tensors(g), 0);
    assert_null(loom__gguf_find_kv(g, "general.architecture"));
    loom__gguf_close(g);
    free(copy);
    tb_free(&b);
}

/* ---- files on disk --------------------------------------------------------------------------- */

static void test_open_file(void **state) {
    (void)state;
    const char *dir = getenv("LOOM_TEST_TMP");
    char path[512];
    snprintf(path, sizeof path, "%s/gguf_test_XXXXXX", dir && *dir ? dir : "/tmp");
    int fd = mkstemp(path);
    if (fd < 0) fail_msg("mkstemp %s: %s", path, strerror(errno));
    tbuf b = {0};
    layout L;
    build_model(&b, 3, 0, &L);
    assert_int_equal(write(fd, b.p, b.n), (ssize_t)b.n);
    close(fd);

    loom__gguf *g = NULL;
    assert_int_equal(loom__gguf_open(path, &g), LOOM_OK);
    assert_int_equal(loom__gguf_file_size(g), b.n);
    check_values(g);
    const loom__gguf_tensor *t = loom__gguf_tensor_at(g, 0);
    const uint8_t *d = t->data;
    assert_int_equal(d[0], tb_pattern(0));
    assert_memory_equal(t->data, b.p + L.data_start, t->bytes);
    loom__gguf_close(g);

    /* a truncated file on disk fails the same way as in memory */
    assert_int_equal(truncate(path, (off_t)(b.n - 1)), 0);
    g = NULL;
    assert_int_equal(loom__gguf_open(path, &g), LOOM_ERR_BAD_MODEL);
    assert_non_null(strstr(loom_last_error(), "past end of file"));
    assert_null(g);
    assert_int_equal(truncate(path, 0), 0);
    assert_int_equal(loom__gguf_open(path, &g), LOOM_ERR_BAD_MODEL);
    assert_non_null(strstr(loom_last_error(), "file too small"));
    unlink(path);
    tb_free(&b);

    assert_int_equal(loom__gguf_open("/nonexistent/dir/model.gguf", &g), LOOM_ERR_IO);
    assert_non_null(strstr(loom_last_error(), "No such file"));
    assert_non_null(strstr(loom_last_error(), "/nonexistent/dir/model.gguf"));
    assert_int_equal(loom__gguf_open(dir && *dir ? dir : "/tmp", &g), LOOM_ERR_IO);
    assert_non_null(strstr(loom_last_error(), "not a regular file"));
    assert_null(g);

    /* A FIFO with no writer is refused at once (issue 18, bug 6: open() used to wait for a
     * writer forever); SIGALRM ends the test if it hangs. */
    snprintf(path, sizeof path, "%s/gguf_fifo_%d", dir && *dir ? dir : "/tmp", (int)getpid());
    unlink(path);
    assert_int_equal(mkfifo(path, 0600), 0);
    alarm(20);
    assert_int_equal(loom__gguf_open(path, &g), LOOM_ERR_IO);
    alarm(0);
    assert_non_null(strstr(loom_last_error(), "not a regular file"));
    assert_null(g);
    unlink(path);
    assert_int_equal(loom__gguf_open(NULL, &g), LOOM_ERR_INVALID_ARG);
    assert_int_equal(loom__gguf_open_memory(NULL, 10, &g), LOOM_ERR_INVALID_ARG);
    assert_int_equal(loom__gguf_open_memory("GGUF", 4, NULL), LOOM_ERR_INVALID_ARG);
}

/* ---- typed getters --------------------------------------------------------------------------- */

/* Requires status want from a getter call with needle in the message. */
#define EXPECT_STATUS(call, want, needle)                                                          \
    do {                                                                                           \
        loom_status st_ = (call);                                                                  \
        if (st_ != (want) || !strstr(loom_last_error(), (needle)))                                 \
            fail_msg("%s: want %s with '%s'; got %s: '%s'", #call, loom_status_str(want),          \
                     (needle), loom_status_str(st_), loom_last_error());                           \
    } while (0)

static void test_getters(void **state) {
    (void)state;
    tbuf b = {0};
    layout L;
    uint8_t *copy;
    build_model(&b, 3, 0, &L);
    loom__gguf *g = open_ok(&b, &copy);
    uint32_t u32 = 7;
    int64_t i64 = 7;
    float f = 7;
    bool flag = false;
    loom__gguf_str s;
    const loom__gguf_value *arr;

    /* integers: any integer type whose value fits */
    assert_int_equal(loom__gguf_get_u32(g, "t.u8", true, 0, &u32), LOOM_OK);
    assert_int_equal(u32, 200);
    assert_int_equal(loom__gguf_get_u32(g, "t.u32", true, 0, &u32), LOOM_OK);
    assert_int_equal(u32, 4000000000u);
    assert_int_equal(loom__gguf_get_i64(g, "t.i16", true, 0, &i64), LOOM_OK);
    assert_int_equal(i64, -30000);
    assert_int_equal(loom__gguf_get_i64(g, "t.u64", true, 0, &i64), LOOM_OK);
    assert_int_equal(i64, (1ll << 40) + 5);
    assert_int_equal(loom__gguf_get_i64(g, "t.i64", true, 0, &i64), LOOM_OK);
    assert_int_equal(i64, -(1ll << 40));
    u32 = 9;
    EXPECT_STATUS(loom__gguf_get_u32(g, "t.u64", true, 0, &u32), LOOM_ERR_BAD_MODEL,
                  "key 't.u64': value 1099511627781 (uint64) out of range for uint32");
    EXPECT_STATUS(loom__gguf_get_u32(g, "t.i8", true, 0, &u32), LOOM_ERR_BAD_MODEL,
                  "key 't.i8': value -100 (int8) out of range for uint32");
    assert_int_equal(u32, 9); /* untouched on failure */
    EXPECT_STATUS(loom__gguf_get_u32(g, "t.f32", true, 0, &u32), LOOM_ERR_BAD_MODEL,
                  "key 't.f32' has type float32, expected an integer");
    EXPECT_STATUS(loom__gguf_get_i64(g, "general.architecture", true, 0, &i64), LOOM_ERR_BAD_MODEL,
                  "key 'general.architecture' has type string, expected an integer");
    EXPECT_STATUS(loom__gguf_get_u32(g, "t.bool", true, 0, &u32), LOOM_ERR_BAD_MODEL,
                  "has type bool");

    /* absent: default when optional, an error naming the key when required */
    assert_int_equal(loom__gguf_get_u32(g, "t.nope", false, 42, &u32), LOOM_OK);
    assert_int_equal(u32, 42);
    assert_int_equal(loom__gguf_get_i64(g, "t.nope", false, -4, &i64), LOOM_OK);
    assert_int_equal(i64, -4);
    EXPECT_STATUS(loom__gguf_get_u32(g, "llama.block_count", true, 0, &u32), LOOM_ERR_BAD_MODEL,
                  "required key 'llama.block_count' missing");
    EXPECT_STATUS(loom__gguf_get_arr(g, "tokenizer.ggml.tokens", LOOM_GGUF_STR, true, &arr),
                  LOOM_ERR_BAD_MODEL, "required key 'tokenizer.ggml.tokens' missing");

    /* floats: F32, F64 and integers */
    assert_int_equal(loom__gguf_get_f32(g, "t.f32", true, 0, &f), LOOM_OK);
    assert_true(f == 3.5f);
    assert_int_equal(loom__gguf_get_f32(g, "t.f64", true, 0, &f), LOOM_OK);
    assert_true(f == 0.1f);
    assert_int_equal(loom__gguf_get_f32(g, "t.i8", true, 0, &f), LOOM_OK);
    assert_true(f == -100.0f);
    assert_int_equal(loom__gguf_get_f32(g, "t.nope", false, 0.5f, &f), LOOM_OK);
    assert_true(f == 0.5f);
    EXPECT_STATUS(loom__gguf_get_f32(g, "t.arr_f32", true, 0, &f), LOOM_ERR_BAD_MODEL,
                  "key 't.arr_f32' has type array, expected a float");

    /* bool and string */
    assert_int_equal(loom__gguf_get_bool(g, "t.bool", true, false, &flag), LOOM_OK);
    assert_true(flag);
    assert_int_equal(loom__gguf_get_bool(g, "t.nope", false, false, &flag), LOOM_OK);
    assert_false(flag);
    EXPECT_STATUS(loom__gguf_get_bool(g, "t.u8", true, false, &flag), LOOM_ERR_BAD_MODEL,
                  "key 't.u8' has type uint8, expected bool");
    assert_int_equal(loom__gguf_get_str(g, "general.architecture", true, &s), LOOM_OK);
    assert_true(loom__gguf_str_eq(s, "llama"));
    assert_int_equal(loom__gguf_get_str(g, "general.name", false, &s), LOOM_OK);
    assert_int_equal(s.len, 0);
    assert_non_null(s.ptr);
    EXPECT_STATUS(loom__gguf_get_str(g, "t.u32", true, &s), LOOM_ERR_BAD_MODEL,
                  "key 't.u32' has type uint32, expected string");

    /* arrays: the element type must match */
    assert_int_equal(loom__gguf_get_arr(g, "t.arr_str", LOOM_GGUF_STR, true, &arr), LOOM_OK);
    assert_int_equal(arr->arr.n, 3);
    assert_int_equal(loom__gguf_get_arr(g, "t.nope", LOOM_GGUF_STR, false, &arr), LOOM_OK);
    assert_null(arr);
    EXPECT_STATUS(loom__gguf_get_arr(g, "t.arr_f32", LOOM_GGUF_I32, true, &arr), LOOM_ERR_BAD_MODEL,
                  "key 't.arr_f32' is an array of float32, expected an array "
                  "of int32");
    EXPECT_STATUS(loom__gguf_get_arr(g, "t.u8", LOOM_GGUF_U8, true, &arr), LOOM_ERR_BAD_MODEL,
                  "key 't.u8' has type uint8, expected array");

    assert_int_equal(loom__gguf_get_u32(NULL, "x", true, 0, &u32), LOOM_ERR_INVALID_ARG);
    assert_string_equal(loom__gguf_vtype_name(LOOM_GGUF_F64), "float64");
    assert_string_equal(loom__gguf_vtype_name(13), "unknown");
    assert_true(loom__gguf_arr_f32(NULL, 0) == 0.0f);
    assert_int_equal(loom__gguf_arr_i64(NULL, 0), 0);
    loom__gguf_close(g);
    free(copy);
    tb_free(&b);
}

/* ---- hash flooding (issue 18, bug 2) ---------------------------------------------------------
 * The attacker's side: FNV-1a's low k bits depend only on the low k bits of its state, so two
 * 3-byte blocks that take one state to the same low bits can be chosen independently at each
 * of 16 stages (a Joux multicollision): 65,536 distinct 48-byte names with one FNV-1a slot in a
 * table of 2^17. The index used to hash names with FNV-1a; it must spread them now. */
enum { FLOOD_STAGES = 16, FLOOD_NAMES = 1 << FLOOD_STAGES, FLOOD_LEN = 3 * FLOOD_STAGES };
#define FLOOD_MASK ((1u << 17) - 1)

static uint64_t fnv1a_step(uint64_t h, unsigned char c) {
    return (h ^ c) * 0x100000001b3ull;
}

/* blocks[stage][choice] = three bytes; returns the names' common FNV-1a hash & FLOOD_MASK. */
static uint32_t flood_blocks(unsigned char blocks[FLOOD_STAGES][2][3]) {
    uint64_t h = 0xcbf29ce484222325ull;
    static int32_t seen[FLOOD_MASK + 1];
    for (int st = 0; st < FLOOD_STAGES; st++) {
        memset(seen, 0xFF, sizeof seen);
        bool found = false;
        for (int32_t abc = 0; abc < 58 * 58 * 58 && !found; abc++) {
            unsigned char t[3] = {(unsigned char)('A' + abc / (58 * 58)),
                                  (unsigned char)('A' + abc / 58 % 58),
                                  (unsigned char)('A' + abc % 58)};
            uint64_t next = fnv1a_step(fnv1a_step(fnv1a_step(h, t[0]), t[1]), t[2]);
            uint32_t low = (uint32_t)next & FLOOD_MASK;
            if (seen[low] < 0) {
                seen[low] = abc;
                continue;
            }
            int32_t o = seen[low];
            blocks[st][0][0] = (unsigned char)('A' + o / (58 * 58));
            blocks[st][0][1] = (unsigned char)('A' + o / 58 % 58);
            blocks[st][0][2] = (unsigned char)('A' + o % 58);
            memcpy(blocks[st][1], t, 3);
            h = next;
            found = true;
        }
        assert_true(found);
    }
    return (uint32_t)h & FLOOD_MASK;
}

static void flood_name(unsigned char blocks[FLOOD_STAGES][2][3], uint32_t k, char *out) {
    for (int st = 0; st < FLOOD_STAGES; st++) memcpy(out + 3 * st, blocks[st][(k >> st) & 1], 3);
}

static void test_index_resists_flooding(void **state) {
    (void)state;
    unsigned char blocks[FLOOD_STAGES][2][3];
    uint32_t slot = flood_blocks(blocks);
    char *names = malloc((size_t)FLOOD_NAMES * FLOOD_LEN);
    assert_non_null(names);
    for (uint32_t k = 0; k < FLOOD_NAMES; k++) {
        char *n = names + (size_t)k * FLOOD_LEN;
        flood_name(blocks, k, n);
        uint64_t h = 0xcbf29ce484222325ull; /* the attack is real: every name has one slot */
        for (int i = 0; i < FLOOD_LEN; i++) h = fnv1a_step(h, (unsigned char)n[i]);
        assert_int_equal((uint32_t)h & FLOOD_MASK, slot);
    }
    loom__gguf_index ix;
    assert_int_equal(loom__gguf_index_init(&ix, FLOOD_NAMES), LOOM_OK);
    assert_int_equal(ix.mask, FLOOD_MASK);
    for (uint32_t k = 0; k < FLOOD_NAMES; k++) {
        assert_int_equal(loom__gguf_index_insert(&ix, names + (size_t)k * FLOOD_LEN, FLOOD_LEN, k),
                         -1);
    }
    /* Each entry's distance from its home slot (the hash the slot keeps): under the keyed hash
     * a half-full table averages about one and a half probes; one shared slot would average
     * 32,768. */
    uint64_t total = 0;
    for (uint64_t i = 0; i <= ix.mask; i++) {
        if (ix.slots[i].idx >= 0) total += (i - (ix.slots[i].hash & ix.mask)) & ix.mask;
    }
    assert_true(total < 4ull * FLOOD_NAMES);
    for (uint32_t k = 0; k < FLOOD_NAMES; k += 97) {
        assert_int_equal(loom__gguf_index_find(&ix, names + (size_t)k * FLOOD_LEN, FLOOD_LEN), k);
        assert_int_equal(loom__gguf_index_insert(&ix, names + (size_t)k * FLOOD_LEN, FLOOD_LEN, 0),
                         k); /* duplicates are still found */
    }
    loom__gguf_index_free(&ix);

    /* The same names as a file's keys: it parses, and every key is found. */
    tbuf b = {0};
    tb_header(&b, 3, 0, FLOOD_NAMES);
    for (uint32_t k = 0; k < FLOOD_NAMES; k++) {
        tb_strn(&b, names + (size_t)k * FLOOD_LEN, FLOOD_LEN);
        tb_u32(&b, LOOM_GGUF_U32);
        tb_u32(&b, k);
    }
    loom__gguf *g = NULL;
    assert_int_equal(loom__gguf_open_memory(b.p, b.n, &g), LOOM_OK);
    char key[FLOOD_LEN + 1];
    for (uint32_t k = 0; k < FLOOD_NAMES; k += 1009) {
        memcpy(key, names + (size_t)k * FLOOD_LEN, FLOOD_LEN);
        key[FLOOD_LEN] = '\0';
        uint32_t v = 0;
        assert_int_equal(loom__gguf_get_u32(g, key, true, 0, &v), LOOM_OK);
        assert_int_equal(v, k);
    }
    loom__gguf_close(g);
    tb_free(&b);
    free(names);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_valid_v3),     cmocka_unit_test(test_valid_v2),
        cmocka_unit_test(test_alignment_64), cmocka_unit_test(test_many_tensors),
        cmocka_unit_test(test_edge_shapes),  cmocka_unit_test(test_open_file),
        cmocka_unit_test(test_getters),      cmocka_unit_test(test_index_resists_flooding),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
