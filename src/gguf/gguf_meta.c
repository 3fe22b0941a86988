/* gguf_meta.c — parsing the metadata section of a GGUF file: keys, scalar values, strings and
 * (nested) arrays, then general.alignment.
 *
 * Every element count is compared with the bytes that remain before anything is allocated, using
 * the smallest encoding an element can have, so memory stays within a small multiple of the file
 * size whatever the counts claim. Failures build their message bottom-up: the innermost step says
 * what was wrong ("string length 99 past end of file ...") and each level on the way out
 * prefixes where it was ("array item #4", "gguf: kv #3 key 'tokenizer.ggml.tokens'"). */
#include <stdlib.h>

#include "core/alloc.h"
#include "gguf/gguf_impl.h"

/* Longest prefix of a key quoted in messages (the error buffer is a few hundred bytes). */
#define KEY_QUOTE_MAX 200

static int quote_len(uint64_t len) {
    return len > KEY_QUOTE_MAX ? KEY_QUOTE_MAX : (int)len;
}

void loom__gguf_value_free(loom__gguf_value *v) {
    if (v->type != LOOM_GGUF_ARR) return;
    if (v->arr.elem_type == LOOM_GGUF_STR) {
        free((void *)v->arr.strs);
    } else if (v->arr.elem_type == LOOM_GGUF_ARR && v->arr.items) {
        loom__gguf_value *items = (loom__gguf_value *)v->arr.items;
        /* Items past the point a parse failed are still zero (type U8): nothing to free. */
        for (uint64_t i = 0; i < v->arr.n; i++) loom__gguf_value_free(&items[i]);
        free(items);
    }
    v->arr.strs = NULL;
    v->arr.items = NULL;
}

/* ---- scalars --------------------------------------------------------------------------------- */

/* A bool byte other than 0 or 1 means the file is not what it claims to be. */
static loom_status check_bools(const uint8_t *p, uint64_t n, bool in_array) {
    for (uint64_t i = 0; i < n; i++) {
        if (p[i] <= 1) continue;
        if (in_array)
            return loom__fail(LOOM_ERR_BAD_MODEL,
                              "bool array element #%" PRIu64 " has byte value %u (not 0 or 1)", i,
                              p[i]);
        return loom__fail(LOOM_ERR_BAD_MODEL, "bool has byte value %u (not 0 or 1)", p[i]);
    }
    return LOOM_OK;
}

void loom__gguf_decode_scalar(uint32_t t, const uint8_t *p, loom__gguf_value *v) {
    uint32_t bits32;
    uint64_t bits64;
    float f;
    switch (t) {
    case LOOM_GGUF_U8:
        v->u64 = p[0];
        break;
    case LOOM_GGUF_I8:
        v->i64 = (int8_t)p[0];
        break;
    case LOOM_GGUF_U16:
        v->u64 = loom__gguf_le16(p);
        break;
    case LOOM_GGUF_I16:
        v->i64 = (int16_t)loom__gguf_le16(p);
        break;
    case LOOM_GGUF_U32:
        v->u64 = loom__gguf_le32(p);
        break;
    case LOOM_GGUF_I32:
        v->i64 = (int32_t)loom__gguf_le32(p);
        break;
    case LOOM_GGUF_U64:
        v->u64 = loom__gguf_le64(p);
        break;
    case LOOM_GGUF_I64:
        v->i64 = (int64_t)loom__gguf_le64(p);
        break;
    case LOOM_GGUF_BOOL:
        v->b = p[0] != 0;
        break;
    case LOOM_GGUF_F32:
        bits32 = loom__gguf_le32(p);
        memcpy(&f, &bits32, sizeof f);
        v->f64 = f;
        break;
    case LOOM_GGUF_F64:
        bits64 = loom__gguf_le64(p);
        memcpy(&v->f64, &bits64, sizeof v->f64);
        break;
    default:
        break;
    }
}

/* ---- arrays ---------------------------------------------------------------------------------- */

/* Reads an array body (element type, count, elements) into v. depth counts the array levels,
 * this one included. */
static loom_status parse_array(loom__gguf_reader *r, loom__gguf_value *v, int depth) {
    uint32_t et;
    uint64_t n;
    LOOM_RETURN_IF(depth > LOOM_GGUF_MAX_DEPTH, LOOM_ERR_BAD_MODEL,
                   "arrays nested deeper than %d levels", LOOM_GGUF_MAX_DEPTH);
    LOOM_TRY(loom__gguf_read_u32(r, "array element type", &et));
    LOOM_TRY(loom__gguf_read_u64(r, "array count", &n));
    LOOM_RETURN_IF(et > LOOM_GGUF_F64, LOOM_ERR_BAD_MODEL, "array element type %" PRIu32 " unknown",
                   et);
    v->type = LOOM_GGUF_ARR;
    v->arr.elem_type = (loom__gguf_vtype)et;
    v->arr.n = n;
    v->arr.raw = NULL;
    v->arr.strs = NULL;
    v->arr.items = NULL;

    uint64_t left = loom__gguf_remaining(r);
    uint64_t esize = loom__gguf_vtype_size(et);
    if (esize > 0) {
        const uint8_t *p;
        LOOM_RETURN_IF(n > left / esize, LOOM_ERR_BAD_MODEL,
                       "array count %" PRIu64 " of %s (%" PRIu64 " bytes each) past end of file "
                       "(at offset %zu, %" PRIu64 " bytes remain)",
                       n, loom__gguf_vtype_name(et), esize, r->pos, left);
        LOOM_TRY(loom__gguf_take(r, n * esize, "array data", &p));
        if (et == LOOM_GGUF_BOOL) LOOM_TRY(check_bools(p, n, true));
        v->arr.raw = p;
        return LOOM_OK;
    }

    uint64_t min_elem = et == LOOM_GGUF_STR ? LOOM__GGUF_MIN_STR_BYTES : LOOM__GGUF_MIN_ARR_BYTES;
    LOOM_RETURN_IF(n > left / min_elem, LOOM_ERR_BAD_MODEL,
                   "array count %" PRIu64 " of %s past end of file (each needs at least %" PRIu64
                   " bytes, %" PRIu64 " remain)",
                   n, loom__gguf_vtype_name(et), min_elem, left);
    if (n == 0) return LOOM_OK;
    if (et == LOOM_GGUF_STR) {
        loom__gguf_str *strs = loom__calloc((size_t)n, sizeof *strs);
        LOOM_RETURN_IF(!strs, LOOM_ERR_OUT_OF_MEMORY, "out of memory for %" PRIu64 " strings", n);
        v->arr.strs = strs; /* owned by v from here on, also on failure */
        for (uint64_t i = 0; i < n; i++) {
            loom_status st = loom__gguf_read_str(r, "string", &strs[i]);
            if (st != LOOM_OK) {
                loom__error_prefix("array item #%" PRIu64, i);
                return st;
            }
        }
        return LOOM_OK;
    }
    LOOM_RETURN_IF(depth + 1 > LOOM_GGUF_MAX_DEPTH, LOOM_ERR_BAD_MODEL,
                   "arrays nested deeper than %d levels", LOOM_GGUF_MAX_DEPTH);
    loom__gguf_value *items = loom__calloc((size_t)n, sizeof *items);
    LOOM_RETURN_IF(!items, LOOM_ERR_OUT_OF_MEMORY, "out of memory for %" PRIu64 " arrays", n);
    v->arr.items = items;
    for (uint64_t i = 0; i < n; i++) {
        loom_status st = parse_array(r, &items[i], depth + 1);
        if (st != LOOM_OK) {
            loom__error_prefix("array item #%" PRIu64, i);
            return st;
        }
    }
    return LOOM_OK;
}

/* ---- values and kvs -------------------------------------------------------------------------- */

static loom_status parse_value(loom__gguf_reader *r, uint32_t type, loom__gguf_value *v) {
    LOOM_RETURN_IF(type > LOOM_GGUF_F64, LOOM_ERR_BAD_MODEL, "value type %" PRIu32 " unknown",
                   type);
    if (type == LOOM_GGUF_STR) {
        v->type = LOOM_GGUF_STR;
        return loom__gguf_read_str(r, "string", &v->str);
    }
    if (type == LOOM_GGUF_ARR) return parse_array(r, v, 1);
    const uint8_t *p;
    LOOM_TRY(loom__gguf_take(r, loom__gguf_vtype_size(type), loom__gguf_vtype_name(type), &p));
    if (type == LOOM_GGUF_BOOL) LOOM_TRY(check_bools(p, 1, false));
    v->type = (loom__gguf_vtype)type;
    loom__gguf_decode_scalar(type, p, v);
    return LOOM_OK;
}

/* Reads and checks kv #i's key; the message carries no prefix yet. */
static loom_status parse_key(loom__gguf_reader *r, loom__gguf_str *key) {
    LOOM_TRY(loom__gguf_read_str(r, "key", key));
    LOOM_RETURN_IF(key->len == 0, LOOM_ERR_BAD_MODEL, "empty key");
    LOOM_RETURN_IF(key->len > LOOM_GGUF_MAX_KEY_LEN, LOOM_ERR_BAD_MODEL,
                   "key length %" PRIu64 " exceeds the limit of %u bytes", key->len,
                   LOOM_GGUF_MAX_KEY_LEN);
    LOOM_RETURN_IF(memchr(key->ptr, 0, (size_t)key->len) != NULL, LOOM_ERR_BAD_MODEL,
                   "key '%.*s' contains a NUL byte", quote_len(key->len), key->ptr);
    return LOOM_OK;
}

static loom_status parse_kv(loom__gguf *g, loom__gguf_reader *r, int64_t i) {
    loom__gguf_kv *kv = &g->kvs[i];
    uint32_t type;
    loom_status st = parse_key(r, &kv->key);
    if (st != LOOM_OK) {
        loom__error_prefix("gguf: kv #%" PRId64, i);
        return st;
    }
    int64_t first = loom__gguf_index_insert(&g->kv_index, kv->key.ptr, kv->key.len, i);
    LOOM_RETURN_IF(first >= 0, LOOM_ERR_BAD_MODEL,
                   "gguf: kv #%" PRId64 " key '%.*s': duplicate key "
                   "(first at kv #%" PRId64 ")",
                   i, quote_len(kv->key.len), kv->key.ptr, first);
    st = loom__gguf_read_u32(r, "value type", &type);
    if (st == LOOM_OK) st = parse_value(r, type, &kv->value);
    if (st != LOOM_OK)
        loom__error_prefix("gguf: kv #%" PRId64 " key '%.*s'", i, quote_len(kv->key.len),
                           kv->key.ptr);
    return st;
}

/* general.alignment: a uint32, nonzero power of two (the format's rule); default 32. */
static loom_status apply_alignment(loom__gguf *g) {
    g->alignment = LOOM_GGUF_DEFAULT_ALIGNMENT;
    const loom__gguf_kv *kv = loom__gguf_find_kv(g, "general.alignment");
    if (!kv) return LOOM_OK;
    LOOM_RETURN_IF(kv->value.type != LOOM_GGUF_U32, LOOM_ERR_BAD_MODEL,
                   "gguf: key 'general.alignment' has type %s, expected uint32",
                   loom__gguf_vtype_name(kv->value.type));
    uint64_t a = kv->value.u64;
    LOOM_RETURN_IF(a == 0 || (a & (a - 1)) != 0, LOOM_ERR_BAD_MODEL,
                   "gguf: key 'general.alignment' = %" PRIu64 " is not a nonzero power of two", a);
    g->alignment = a;
    return LOOM_OK;
}

loom_status loom__gguf_parse_kvs(loom__gguf *g, loom__gguf_reader *r, int64_t n_kv) {
    LOOM_TRY(loom__gguf_index_init(&g->kv_index, n_kv));
    if (n_kv > 0) {
        g->kvs = loom__calloc((size_t)n_kv, sizeof *g->kvs);
        LOOM_RETURN_IF(!g->kvs, LOOM_ERR_OUT_OF_MEMORY, "gguf: out of memory for %" PRId64 " kvs",
                       n_kv);
    }
    g->n_kv = n_kv; /* zeroed records free as nothing if parsing stops early */
    for (int64_t i = 0; i < n_kv; i++) LOOM_TRY(parse_kv(g, r, i));
    return apply_alignment(g);
}
