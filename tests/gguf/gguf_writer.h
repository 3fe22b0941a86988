/* gguf_writer.h — a tiny GGUF writer for the test_gguf*.c programs: appends header, key/values,
 * tensor infos and data to a growable byte buffer, so tests can build valid files and then break
 * them on purpose (little-endian output, no checks: invalid files are written deliberately); and
 * the reference file both programs start from (every value type, nested arrays, three tensors). */
#pragma once

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "gguf/gguf.h"
#include "tensor/types.h"

typedef struct tbuf {
    uint8_t *p;
    size_t n, cap;
} tbuf;

static inline void tb_put(tbuf *b, const void *src, size_t n) {
    if (b->n + n > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->n + n) cap *= 2;
        uint8_t *p = realloc(b->p, cap);
        if (!p) abort(); /* test helper: no memory means the test cannot continue */
        b->p = p;
        b->cap = cap;
    }
    if (n) memcpy(b->p + b->n, src, n);
    b->n += n;
}

static inline void tb_free(tbuf *b) {
    free(b->p);
    b->p = NULL;
    b->n = b->cap = 0;
}

static inline void tb_u8(tbuf *b, uint8_t v) {
    tb_put(b, &v, 1);
}
static inline void tb_le(tbuf *b, uint64_t v, int bytes) {
    for (int i = 0; i < bytes; i++) tb_u8(b, (uint8_t)(v >> (8 * i)));
}
static inline void tb_u16(tbuf *b, uint16_t v) {
    tb_le(b, v, 2);
}
static inline void tb_u32(tbuf *b, uint32_t v) {
    tb_le(b, v, 4);
}
static inline void tb_u64(tbuf *b, uint64_t v) {
    tb_le(b, v, 8);
}
static inline void tb_f32(tbuf *b, float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    tb_u32(b, u);
}
static inline void tb_f64(tbuf *b, double d) {
    uint64_t u;
    memcpy(&u, &d, 8);
    tb_u64(b, u);
}
/* A GGUF string: u64 length then the bytes. */
static inline void tb_strn(tbuf *b, const char *s, size_t n) {
    tb_u64(b, n);
    tb_put(b, s, n);
}
static inline void tb_str(tbuf *b, const char *s) {
    tb_strn(b, s, strlen(s));
}

/* Header: magic, version, tensor count, kv count. */
static inline void tb_header(tbuf *b, uint32_t version, uint64_t n_tensors, uint64_t n_kv) {
    tb_put(b, "GGUF", 4);
    tb_u32(b, version);
    tb_u64(b, n_tensors);
    tb_u64(b, n_kv);
}

/* The start of a kv: key then value type; the caller appends the value. */
static inline void tb_kv(tbuf *b, const char *key, uint32_t vtype) {
    tb_str(b, key);
    tb_u32(b, vtype);
}

/* An array header (element type, count); the caller appends the elements. */
static inline void tb_arr(tbuf *b, uint32_t elem_type, uint64_t n) {
    tb_u32(b, elem_type);
    tb_u64(b, n);
}

/* A tensor info with n_dims dims taken from ne. */
static inline void tb_tensor(tbuf *b, const char *name, uint32_t n_dims, const uint64_t *ne,
                             uint32_t type, uint64_t offset) {
    tb_str(b, name);
    tb_u32(b, n_dims);
    for (uint32_t i = 0; i < n_dims; i++) tb_u64(b, ne[i]);
    tb_u32(b, type);
    tb_u64(b, offset);
}

/* Zero bytes up to the next multiple of align. */
static inline void tb_pad(tbuf *b, size_t align) {
    while (b->n % align) tb_u8(b, 0);
}

/* The byte every tensor-data position i holds in test files: easy to check, rarely zero. */
static inline uint8_t tb_pattern(size_t i) {
    return (uint8_t)(i * 7 + 3);
}

/* n bytes of tb_pattern, numbered from the start of the data section. */
static inline void tb_data(tbuf *b, size_t data_start, size_t n) {
    for (size_t i = 0; i < n; i++) tb_u8(b, tb_pattern(b->n - data_start));
}

/* ---- the reference file ---------------------------------------------------------------------- */

typedef struct ref_tensor {
    const char *name;
    uint32_t n_dims;
    uint64_t ne[4];
    uint32_t type;
    size_t bytes;
} ref_tensor;

static const ref_tensor k_tensors[] = {
    {"tok_embd.weight", 2, {4, 3}, LOOM_TYPE_F32, 48},
    {"blk.0.attn_q.weight", 2, {64, 2}, LOOM_TYPE_Q8_0, 136}, /* 2 blocks of 34 bytes per row */
    {"output_norm.weight", 1, {8}, LOOM_TYPE_F16, 16},
};
#define N_TENSORS 3

/* Where the sections of the reference file start and end. */
typedef struct layout {
    size_t last_kv_start, kvs_end, infos_end, data_start;
    uint64_t offsets[N_TENSORS];
    int64_t n_kv;
} layout;

/* Appends the kvs of the reference file to kv and returns how many. */
static inline int64_t put_kvs(tbuf *kv, uint32_t alignment, size_t *last_kv_start) {
    int64_t n = 0;
    tb_kv(kv, "general.architecture", LOOM_GGUF_STR), tb_str(kv, "llama"), n++;
    if (alignment) tb_kv(kv, "general.alignment", LOOM_GGUF_U32), tb_u32(kv, alignment), n++;
    tb_kv(kv, "t.u8", LOOM_GGUF_U8), tb_u8(kv, 200), n++;
    tb_kv(kv, "t.i8", LOOM_GGUF_I8), tb_u8(kv, (uint8_t)-100), n++;
    tb_kv(kv, "t.u16", LOOM_GGUF_U16), tb_u16(kv, 60000), n++;
    tb_kv(kv, "t.i16", LOOM_GGUF_I16), tb_u16(kv, (uint16_t)-30000), n++;
    tb_kv(kv, "t.u32", LOOM_GGUF_U32), tb_u32(kv, 4000000000u), n++;
    tb_kv(kv, "t.i32", LOOM_GGUF_I32), tb_u32(kv, (uint32_t)-2000000000), n++;
    tb_kv(kv, "t.f32", LOOM_GGUF_F32), tb_f32(kv, 3.5f), n++;
    tb_kv(kv, "t.bool", LOOM_GGUF_BOOL), tb_u8(kv, 1), n++;
    tb_kv(kv, "t.u64", LOOM_GGUF_U64), tb_u64(kv, (1ull << 40) + 5), n++;
    tb_kv(kv, "t.i64", LOOM_GGUF_I64), tb_u64(kv, (uint64_t) - (1ll << 40)), n++;
    tb_kv(kv, "t.f64", LOOM_GGUF_F64), tb_f64(kv, 0.1), n++;
    tb_kv(kv, "t.str_nul", LOOM_GGUF_STR), tb_strn(kv, "a\0b", 3), n++;
    tb_kv(kv, "t.arr_u8", LOOM_GGUF_ARR), tb_arr(kv, LOOM_GGUF_U8, 3), n++;
    tb_u8(kv, 1), tb_u8(kv, 2), tb_u8(kv, 250);
    tb_kv(kv, "t.arr_f32", LOOM_GGUF_ARR), tb_arr(kv, LOOM_GGUF_F32, 3), n++;
    tb_f32(kv, 1.5f), tb_f32(kv, -2.25f), tb_f32(kv, 1e30f);
    tb_kv(kv, "t.arr_str", LOOM_GGUF_ARR), tb_arr(kv, LOOM_GGUF_STR, 3), n++;
    tb_str(kv, "x"), tb_str(kv, "yz"), tb_str(kv, "");
    tb_kv(kv, "t.arr_i64", LOOM_GGUF_ARR), tb_arr(kv, LOOM_GGUF_I64, 2), n++;
    tb_u64(kv, (uint64_t)-1), tb_u64(kv, INT64_MAX);
    tb_kv(kv, "t.arr_bool", LOOM_GGUF_ARR), tb_arr(kv, LOOM_GGUF_BOOL, 2), n++;
    tb_u8(kv, 1), tb_u8(kv, 0);
    /* [[1, 2], [-3]] as int32 */
    tb_kv(kv, "t.arr_nested", LOOM_GGUF_ARR), tb_arr(kv, LOOM_GGUF_ARR, 2), n++;
    tb_arr(kv, LOOM_GGUF_I32, 2), tb_u32(kv, 1), tb_u32(kv, 2);
    tb_arr(kv, LOOM_GGUF_I32, 1), tb_u32(kv, (uint32_t)-3);
    /* [[["a"]], []]: three levels, the empty one of strings */
    tb_kv(kv, "t.arr_deep", LOOM_GGUF_ARR), tb_arr(kv, LOOM_GGUF_ARR, 2), n++;
    tb_arr(kv, LOOM_GGUF_ARR, 1), tb_arr(kv, LOOM_GGUF_STR, 1), tb_str(kv, "a");
    tb_arr(kv, LOOM_GGUF_STR, 0);
    tb_kv(kv, "t.arr_empty", LOOM_GGUF_ARR), tb_arr(kv, LOOM_GGUF_U32, 0), n++;
    tb_kv(kv, "t.arr_i8", LOOM_GGUF_ARR), tb_arr(kv, LOOM_GGUF_I8, 1), tb_u8(kv, (uint8_t)-5), n++;
    tb_kv(kv, "t.arr_u16", LOOM_GGUF_ARR), tb_arr(kv, LOOM_GGUF_U16, 1), tb_u16(kv, 65535), n++;
    tb_kv(kv, "t.arr_i16", LOOM_GGUF_ARR), tb_arr(kv, LOOM_GGUF_I16, 1), tb_u16(kv, 0x8000), n++;
    tb_kv(kv, "t.arr_u32", LOOM_GGUF_ARR), tb_arr(kv, LOOM_GGUF_U32, 1), tb_u32(kv, UINT32_MAX),
        n++;
    tb_kv(kv, "t.arr_i32", LOOM_GGUF_ARR), tb_arr(kv, LOOM_GGUF_I32, 1), tb_u32(kv, (uint32_t)-7),
        n++;
    tb_kv(kv, "t.arr_u64", LOOM_GGUF_ARR), tb_arr(kv, LOOM_GGUF_U64, 1), tb_u64(kv, UINT64_MAX),
        n++;
    tb_kv(kv, "t.arr_f64", LOOM_GGUF_ARR), tb_arr(kv, LOOM_GGUF_F64, 1), tb_f64(kv, 0.25), n++;
    *last_kv_start = kv->n;
    tb_kv(kv, "t.last", LOOM_GGUF_STR), tb_str(kv, "end"), n++;
    return n;
}

/* Builds the reference file: every value type, three tensors, the data section ending exactly
 * with the last tensor (so every shorter prefix is truncated). alignment 0: no alignment key. */
static inline void build_model(tbuf *b, uint32_t version, uint32_t alignment, layout *L) {
    tbuf kv = {0};
    size_t align = alignment ? alignment : 32;
    L->n_kv = put_kvs(&kv, alignment, &L->last_kv_start);
    tb_header(b, version, N_TENSORS, (uint64_t)L->n_kv);
    L->last_kv_start += b->n;
    tb_put(b, kv.p, kv.n);
    tb_free(&kv);
    L->kvs_end = b->n;
    uint64_t off = 0;
    for (int i = 0; i < N_TENSORS; i++) {
        off = (off + align - 1) / align * align;
        L->offsets[i] = off;
        tb_tensor(b, k_tensors[i].name, k_tensors[i].n_dims, k_tensors[i].ne, k_tensors[i].type,
                  off);
        off += k_tensors[i].bytes;
    }
    L->infos_end = b->n;
    tb_pad(b, align);
    L->data_start = b->n;
    tb_data(b, L->data_start, (size_t)off);
}

/* An exactly-sized heap copy, so ASan sees any read past the end. */
static inline uint8_t *exact_copy(const uint8_t *p, size_t n) {
    uint8_t *c = malloc(n ? n : 1);
    if (!c) abort();
    if (n) memcpy(c, p, n);
    return c;
}
