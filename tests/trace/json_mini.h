/* json_mini.h — a strict, small JSON reader for the trace tests: parses RFC 8259 text into a
 * tree (strings decoded to UTF-8 bytes, \u escapes and surrogate pairs included) so a test can
 * both prove the trace's output is valid JSON and look its fields up. Test code only. */
#pragma once

#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef enum jm_kind { JM_NULL, JM_BOOL, JM_NUM, JM_STR, JM_ARR, JM_OBJ } jm_kind;

typedef struct jm_value {
    jm_kind kind;
    bool b;
    double num;
    char *str; /* JM_STR: decoded bytes (NUL-terminated; may hold NULs: see len) */
    size_t len;
    struct jm_value *items; /* JM_ARR / JM_OBJ values */
    char **keys;            /* JM_OBJ keys */
    size_t n;
} jm_value;

typedef struct jm_parser {
    const char *p, *end;
    bool ok;
} jm_parser;

static void jm_free(jm_value *v) {
    if (!v) return;
    free(v->str);
    for (size_t i = 0; i < v->n; i++) {
        jm_free(&v->items[i]);
        if (v->keys) free(v->keys[i]);
    }
    free(v->items);
    free(v->keys);
    memset(v, 0, sizeof *v);
}

static void jm_ws(jm_parser *q) {
    while (q->p < q->end && (*q->p == ' ' || *q->p == '\t' || *q->p == '\n' || *q->p == '\r'))
        q->p++;
}

static bool jm_lit(jm_parser *q, const char *lit) {
    size_t n = strlen(lit);
    if ((size_t)(q->end - q->p) < n || memcmp(q->p, lit, n) != 0) return false;
    q->p += n;
    return true;
}

static int jm_hex4(jm_parser *q) {
    if (q->end - q->p < 4) return -1;
    int v = 0;
    for (int i = 0; i < 4; i++) {
        char c = q->p[i];
        int d = c >= '0' && c <= '9'   ? c - '0'
                : c >= 'a' && c <= 'f' ? c - 'a' + 10
                : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                       : -1;
        if (d < 0) return -1;
        v = v * 16 + d;
    }
    q->p += 4;
    return v;
}

static size_t jm_put_utf8(char *o, uint32_t cp) {
    if (cp < 0x80) return o[0] = (char)cp, 1;
    if (cp < 0x800) return o[0] = (char)(0xC0 | cp >> 6), o[1] = (char)(0x80 | (cp & 63)), 2;
    if (cp < 0x10000) {
        o[0] = (char)(0xE0 | cp >> 12), o[1] = (char)(0x80 | ((cp >> 6) & 63));
        o[2] = (char)(0x80 | (cp & 63));
        return 3;
    }
    o[0] = (char)(0xF0 | cp >> 18), o[1] = (char)(0x80 | ((cp >> 12) & 63));
    o[2] = (char)(0x80 | ((cp >> 6) & 63)), o[3] = (char)(0x80 | (cp & 63));
    return 4;
}

/* Raw bytes >= 0x80 are copied as they are; the tests check their UTF-8 validity separately. */
static bool jm_string(jm_parser *q, char **out, size_t *out_len) {
    if (q->p >= q->end || *q->p != '"') return false;
    q->p++;
    char *o = malloc((size_t)(q->end - q->p) + 1);
    size_t n = 0;
    while (q->p < q->end && *q->p != '"') {
        unsigned char c = (unsigned char)*q->p++;
        if (c < 0x20) goto bad; /* control characters must be escaped */
        if (c != '\\') {
            o[n++] = (char)c;
            continue;
        }
        if (q->p >= q->end) goto bad;
        char e = *q->p++;
        switch (e) {
        case '"':
            o[n++] = '"';
            break;
        case '\\':
            o[n++] = '\\';
            break;
        case '/':
            o[n++] = '/';
            break;
        case 'b':
            o[n++] = '\b';
            break;
        case 'f':
            o[n++] = '\f';
            break;
        case 'n':
            o[n++] = '\n';
            break;
        case 'r':
            o[n++] = '\r';
            break;
        case 't':
            o[n++] = '\t';
            break;
        case 'u': {
            int u = jm_hex4(q);
            if (u < 0) goto bad;
            uint32_t cp = (uint32_t)u;
            if (cp >= 0xD800 && cp <= 0xDBFF) {
                if (!jm_lit(q, "\\u")) goto bad;
                int lo = jm_hex4(q);
                if (lo < 0xDC00 || lo > 0xDFFF) goto bad;
                cp = 0x10000 + ((cp - 0xD800) << 10) + ((uint32_t)lo - 0xDC00);
            } else if (cp >= 0xDC00 && cp <= 0xDFFF) {
                goto bad;
            }
            n += jm_put_utf8(o + n, cp);
            break;
        }
        default:
            goto bad;
        }
    }
    if (q->p >= q->end) goto bad;
    q->p++;
    o[n] = '\0';
    *out = o;
    *out_len = n;
    return true;
bad:
    free(o);
    return false;
}

static bool jm_value_parse(jm_parser *q, jm_value *v, int depth);

static bool jm_number(jm_parser *q, jm_value *v) {
    const char *s = q->p;
    if (q->p < q->end && *q->p == '-') q->p++;
    if (q->p >= q->end) return false;
    if (*q->p == '0')
        q->p++;
    else if (*q->p >= '1' && *q->p <= '9')
        while (q->p < q->end && *q->p >= '0' && *q->p <= '9') q->p++;
    else
        return false;
    if (q->p < q->end && *q->p == '.') {
        q->p++;
        if (q->p >= q->end || *q->p < '0' || *q->p > '9') return false;
        while (q->p < q->end && *q->p >= '0' && *q->p <= '9') q->p++;
    }
    if (q->p < q->end && (*q->p == 'e' || *q->p == 'E')) {
        q->p++;
        if (q->p < q->end && (*q->p == '+' || *q->p == '-')) q->p++;
        if (q->p >= q->end || *q->p < '0' || *q->p > '9') return false;
        while (q->p < q->end && *q->p >= '0' && *q->p <= '9') q->p++;
    }
    char buf[64];
    size_t len = (size_t)(q->p - s);
    if (len >= sizeof buf) return false;
    memcpy(buf, s, len);
    buf[len] = '\0';
    v->kind = JM_NUM;
    v->num = strtod(buf, NULL);
    return true;
}

static bool jm_push(jm_value *v, size_t *cap) {
    if (v->n < *cap) return true;
    *cap = *cap ? *cap * 2 : 8;
    v->items = realloc(v->items, *cap * sizeof *v->items);
    if (v->kind == JM_OBJ) v->keys = realloc(v->keys, *cap * sizeof *v->keys);
    return v->items != NULL;
}

static bool jm_value_parse(jm_parser *q, jm_value *v, int depth) {
    memset(v, 0, sizeof *v);
    if (depth > 64) return false;
    jm_ws(q);
    if (q->p >= q->end) return false;
    char c = *q->p;
    if (c == 'n') return v->kind = JM_NULL, jm_lit(q, "null");
    if (c == 't') return v->kind = JM_BOOL, v->b = true, jm_lit(q, "true");
    if (c == 'f') return v->kind = JM_BOOL, jm_lit(q, "false");
    if (c == '"') return v->kind = JM_STR, jm_string(q, &v->str, &v->len);
    if (c == '[' || c == '{') {
        bool obj = c == '{';
        size_t cap = 0;
        v->kind = obj ? JM_OBJ : JM_ARR;
        q->p++;
        jm_ws(q);
        if (q->p < q->end && *q->p == (obj ? '}' : ']')) return q->p++, true;
        for (;;) {
            if (!jm_push(v, &cap)) return false;
            jm_ws(q);
            if (obj) {
                size_t kl;
                if (!jm_string(q, &v->keys[v->n], &kl)) return false;
                jm_ws(q);
                if (!jm_lit(q, ":")) {
                    free(v->keys[v->n]);
                    return false;
                }
            }
            if (!jm_value_parse(q, &v->items[v->n], depth + 1)) {
                v->n++;
                return false;
            }
            v->n++;
            jm_ws(q);
            if (jm_lit(q, ",")) continue;
            return jm_lit(q, obj ? "}" : "]");
        }
    }
    return jm_number(q, v);
}

/* Parses text[0..n) as exactly one JSON value; false (and *v freed) on any error. */
static bool jm_parse(const char *text, size_t n, jm_value *v) {
    jm_parser q = {text, text + n, true};
    bool ok = jm_value_parse(&q, v, 0);
    jm_ws(&q);
    if (!ok || q.p != q.end) {
        jm_free(v);
        return false;
    }
    return true;
}

/* The member named key of an object, or NULL. */
static const jm_value *jm_get(const jm_value *v, const char *key) {
    if (!v || v->kind != JM_OBJ) return NULL;
    for (size_t i = 0; i < v->n; i++)
        if (strcmp(v->keys[i], key) == 0) return &v->items[i];
    return NULL;
}

static double jm_num(const jm_value *v, const char *key) {
    const jm_value *m = jm_get(v, key);
    return m && m->kind == JM_NUM ? m->num : NAN;
}

static const char *jm_str(const jm_value *v, const char *key) {
    const jm_value *m = jm_get(v, key);
    return m && m->kind == JM_STR ? m->str : NULL;
}
