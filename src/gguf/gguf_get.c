/* gguf_get.c — typed access to GGUF metadata: getters that check presence, type and range and
 * name the key when they refuse, and readers for elements of numeric arrays. */
#include <float.h>
#include <math.h>

#include "gguf/gguf_impl.h"

#define KEY_QUOTE_MAX 200

const char *loom__gguf_vtype_name(uint32_t t) {
    static const char *const names[] = {
        "uint8", "int8",   "uint16", "int16",  "uint32", "int32",   "float32",
        "bool",  "string", "array",  "uint64", "int64",  "float64",
    };
    return t < sizeof names / sizeof names[0] ? names[t] : "unknown";
}

bool loom__gguf_str_eq(loom__gguf_str s, const char *cstr) {
    size_t n = strlen(cstr);
    return s.len == n && (n == 0 || memcmp(s.ptr, cstr, n) == 0);
}

/* ---- getters --------------------------------------------------------------------------------- */

static bool is_unsigned(loom__gguf_vtype t) {
    return t == LOOM_GGUF_U8 || t == LOOM_GGUF_U16 || t == LOOM_GGUF_U32 || t == LOOM_GGUF_U64;
}
static bool is_signed(loom__gguf_vtype t) {
    return t == LOOM_GGUF_I8 || t == LOOM_GGUF_I16 || t == LOOM_GGUF_I32 || t == LOOM_GGUF_I64;
}

/* Looks key up: *kv = NULL and LOOM_OK when absent and optional. */
static loom_status lookup(const loom__gguf *g, const char *key, bool required,
                          const loom__gguf_kv **kv) {
    LOOM_CHECK_ARG(g != NULL && key != NULL);
    *kv = loom__gguf_find_kv(g, key);
    LOOM_RETURN_IF(!*kv && required, LOOM_ERR_BAD_MODEL, "gguf: required key '%.*s' missing",
                   KEY_QUOTE_MAX, key);
    return LOOM_OK;
}

static loom_status wrong_type(const char *key, loom__gguf_vtype found, const char *expected) {
    return loom__fail(LOOM_ERR_BAD_MODEL, "gguf: key '%.*s' has type %s, expected %s",
                      KEY_QUOTE_MAX, key, loom__gguf_vtype_name(found), expected);
}

/* The integer value of kv as a (sign, magnitude-ish) pair that covers both int64 and uint64:
 * exactly one of *neg (value < 0, in *i) or !*neg (value >= 0, in *u) holds. */
static loom_status integer_of(const char *key, const loom__gguf_kv *kv, bool *neg, int64_t *i,
                              uint64_t *u) {
    loom__gguf_vtype t = kv->value.type;
    if (is_unsigned(t)) {
        *neg = false;
        *u = kv->value.u64;
        return LOOM_OK;
    }
    if (is_signed(t)) {
        *i = kv->value.i64;
        *neg = *i < 0;
        if (!*neg) *u = (uint64_t)*i;
        return LOOM_OK;
    }
    return wrong_type(key, t, "an integer");
}

loom_status loom__gguf_get_u32(const loom__gguf *g, const char *key, bool required, uint32_t def,
                               uint32_t *out) {
    const loom__gguf_kv *kv = NULL;
    bool neg = false;
    int64_t i = 0;
    uint64_t u = 0;
    LOOM_TRY(lookup(g, key, required, &kv));
    if (!kv) {
        *out = def;
        return LOOM_OK;
    }
    LOOM_TRY(integer_of(key, kv, &neg, &i, &u));
    LOOM_RETURN_IF(neg, LOOM_ERR_BAD_MODEL,
                   "gguf: key '%.*s': value %" PRId64 " (%s) out of range for uint32",
                   KEY_QUOTE_MAX, key, i, loom__gguf_vtype_name(kv->value.type));
    LOOM_RETURN_IF(u > UINT32_MAX, LOOM_ERR_BAD_MODEL,
                   "gguf: key '%.*s': value %" PRIu64 " (%s) out of range for uint32",
                   KEY_QUOTE_MAX, key, u, loom__gguf_vtype_name(kv->value.type));
    *out = (uint32_t)u;
    return LOOM_OK;
}

loom_status loom__gguf_get_i64(const loom__gguf *g, const char *key, bool required, int64_t def,
                               int64_t *out) {
    const loom__gguf_kv *kv = NULL;
    bool neg = false;
    int64_t i = 0;
    uint64_t u = 0;
    LOOM_TRY(lookup(g, key, required, &kv));
    if (!kv) {
        *out = def;
        return LOOM_OK;
    }
    LOOM_TRY(integer_of(key, kv, &neg, &i, &u));
    if (neg) {
        *out = i;
        return LOOM_OK;
    }
    LOOM_RETURN_IF(u > (uint64_t)INT64_MAX, LOOM_ERR_BAD_MODEL,
                   "gguf: key '%.*s': value %" PRIu64 " (%s) out of range for int64", KEY_QUOTE_MAX,
                   key, u, loom__gguf_vtype_name(kv->value.type));
    *out = (int64_t)u;
    return LOOM_OK;
}

loom_status loom__gguf_get_f32(const loom__gguf *g, const char *key, bool required, float def,
                               float *out) {
    const loom__gguf_kv *kv = NULL;
    LOOM_TRY(lookup(g, key, required, &kv));
    if (!kv) {
        *out = def;
        return LOOM_OK;
    }
    loom__gguf_vtype t = kv->value.type;
    if (is_unsigned(t)) {
        *out = (float)kv->value.u64;
        return LOOM_OK;
    }
    if (is_signed(t)) {
        *out = (float)kv->value.i64;
        return LOOM_OK;
    }
    if (t != LOOM_GGUF_F32 && t != LOOM_GGUF_F64) return wrong_type(key, t, "a float");
    double d = kv->value.f64;
    /* Infinities and NaN pass through as they are; only finite values too big for float fail. */
    LOOM_RETURN_IF(isfinite(d) && fabs(d) > FLT_MAX, LOOM_ERR_BAD_MODEL,
                   "gguf: key '%.*s': value %g (%s) out of range for float32", KEY_QUOTE_MAX, key,
                   d, loom__gguf_vtype_name(t));
    *out = (float)d;
    return LOOM_OK;
}

loom_status loom__gguf_get_bool(const loom__gguf *g, const char *key, bool required, bool def,
                                bool *out) {
    const loom__gguf_kv *kv = NULL;
    LOOM_TRY(lookup(g, key, required, &kv));
    if (!kv) {
        *out = def;
        return LOOM_OK;
    }
    if (kv->value.type != LOOM_GGUF_BOOL) return wrong_type(key, kv->value.type, "bool");
    *out = kv->value.b;
    return LOOM_OK;
}

loom_status loom__gguf_get_str(const loom__gguf *g, const char *key, bool required,
                               loom__gguf_str *out) {
    const loom__gguf_kv *kv = NULL;
    LOOM_TRY(lookup(g, key, required, &kv));
    if (!kv) {
        out->ptr = "";
        out->len = 0;
        return LOOM_OK;
    }
    if (kv->value.type != LOOM_GGUF_STR) return wrong_type(key, kv->value.type, "string");
    *out = kv->value.str;
    return LOOM_OK;
}

loom_status loom__gguf_get_arr(const loom__gguf *g, const char *key, loom__gguf_vtype elem_type,
                               bool required, const loom__gguf_value **out) {
    const loom__gguf_kv *kv = NULL;
    LOOM_TRY(lookup(g, key, required, &kv));
    if (!kv) {
        *out = NULL;
        return LOOM_OK;
    }
    if (kv->value.type != LOOM_GGUF_ARR) return wrong_type(key, kv->value.type, "array");
    LOOM_RETURN_IF(kv->value.arr.elem_type != elem_type, LOOM_ERR_BAD_MODEL,
                   "gguf: key '%.*s' is an array of %s, expected an array of %s", KEY_QUOTE_MAX,
                   key, loom__gguf_vtype_name(kv->value.arr.elem_type),
                   loom__gguf_vtype_name(elem_type));
    *out = &kv->value;
    return LOOM_OK;
}

/* ---- array elements -------------------------------------------------------------------------- */

/* Decodes element i of a fixed-size numeric array as a value of its element type. Returns false
 * when there is no such element. */
static bool element(const loom__gguf_value *arr, uint64_t i, loom__gguf_value *v) {
    if (!arr || arr->type != LOOM_GGUF_ARR || i >= arr->arr.n || !arr->arr.raw) return false;
    uint64_t esize = loom__gguf_vtype_size(arr->arr.elem_type);
    if (esize == 0) return false;
    const uint8_t *p = (const uint8_t *)arr->arr.raw + i * esize;
    v->type = arr->arr.elem_type;
    loom__gguf_decode_scalar(v->type, p, v);
    if (v->type == LOOM_GGUF_BOOL) { /* read as an integer 0/1 by the numeric accessors */
        bool b = v->b;
        v->u64 = b;
        v->type = LOOM_GGUF_U8;
    }
    return true;
}

float loom__gguf_arr_f32(const loom__gguf_value *arr, uint64_t i) {
    loom__gguf_value v;
    if (!element(arr, i, &v)) return 0.0f;
    if (is_unsigned(v.type)) return (float)v.u64;
    if (is_signed(v.type)) return (float)v.i64;
    return (float)v.f64;
}

int64_t loom__gguf_arr_i64(const loom__gguf_value *arr, uint64_t i) {
    loom__gguf_value v;
    if (!element(arr, i, &v)) return 0;
    if (is_unsigned(v.type)) return v.u64 > (uint64_t)INT64_MAX ? INT64_MAX : (int64_t)v.u64;
    if (is_signed(v.type)) return v.i64;
    /* Float to integer is undefined outside the range: saturate first (2^63 is exact). */
    if (isnan(v.f64)) return 0;
    if (v.f64 >= 9223372036854775808.0) return INT64_MAX;
    if (v.f64 <= -9223372036854775808.0) return INT64_MIN;
    return (int64_t)v.f64;
}
