/* kv_plan.c — the per-engine layer map and its plan files (kv_plan.h). */
#include "engine/kv_plan.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/status.h"
#include "tensor/types.h"

/* Plan files are a few lines per layer: anything larger is not one. */
#define KV_PLAN_MAX_BYTES (1u << 20)

int32_t loom__kv_merge_rows(float retain, int32_t block_size) {
    if (!(retain > 0.0f)) return 0;
    if (retain >= 1.0f) return block_size;
    const int32_t r = (int32_t)ceilf(retain * (float)block_size);
    return r < block_size ? r : block_size;
}

void loom__kv_merge_reset(loom__kv_merge *merge, int32_t n_layer) {
    for (int32_t l = 0; l < n_layer; l++) merge->with[l] = -1;
    merge->n_pairs = 0;
    merge->retain = LOOM_KV_MERGE_RETAIN_DEFAULT;
    merge->t = LOOM_KV_MERGE_T_DEFAULT;
}

loom_status loom__kv_merge_flags(const loom__kv_merge *merge, loom_type kv_type,
                                 uint32_t *kv_flags) {
    if (merge->n_pairs == 0) return LOOM_OK;
    LOOM_RETURN_IF(kv_type != LOOM_TYPE_F16 && kv_type != LOOM_TYPE_BF16 &&
                       kv_type != LOOM_TYPE_F32,
                   LOOM_ERR_UNSUPPORTED,
                   "kv plan: merged pairs keep unit directions in F16, BF16 or F32 pages, not %s "
                   "(quantized pages would scale each row twice)",
                   loom__type_name(kv_type));
    LOOM_RETURN_IF(*kv_flags & LOOM_KV_HADAMARD, LOOM_ERR_UNSUPPORTED,
                   "kv plan: merged pairs with kv_rotate (the rotation is for quantized pages)");
    *kv_flags |= LOOM_KV_MERGED;
    return LOOM_OK;
}

/* Pairs of merge_with: each names the other, the later reads the earlier (a source), and no
 * other layer reads either. */
static loom_status check_merges(const loom_model *m, const int32_t *layer_src,
                                const int32_t *merge_with) {
    const int32_t n = m->cfg.n_layer;
    for (int32_t l = 0; l < n; l++) {
        const int32_t p = merge_with[l];
        if (p == -1) continue;
        LOOM_RETURN_IF(p < 0 || p >= n || p == l || merge_with[p] != l, LOOM_ERR_INVALID_ARG,
                       "kv plan: layer %d's merge partner %d does not name it back", l, p);
        const int32_t a = l < p ? l : p, b = l < p ? p : l;
        LOOM_RETURN_IF(layer_src[b] != a || layer_src[a] != a, LOOM_ERR_INVALID_ARG,
                       "kv plan: merged layers %d and %d: %d must read %d, which reads itself", a,
                       b, b, a);
        LOOM_RETURN_IF(m->cfg.layers[b].kv_src != b, LOOM_ERR_INVALID_ARG,
                       "kv plan: layer %d cannot be merged: the model declares it to share layer "
                       "%d's K/V, so it has no K/V of its own",
                       b, m->cfg.layers[b].kv_src);
        for (int32_t o = 0; o < n; o++)
            LOOM_RETURN_IF(o != a && o != b && (layer_src[o] == a || layer_src[o] == b),
                           LOOM_ERR_INVALID_ARG,
                           "kv plan: layer %d shares the K/V of layer %d, which is in a merged "
                           "pair",
                           o, layer_src[o]);
    }
    return LOOM_OK;
}

loom_status loom__kv_plan_check(const loom_model *m, const int32_t *layer_src,
                                const int32_t *merge_with) {
    const loom__model_config *c = &m->cfg;
    for (int32_t l = 0; l < c->n_layer; l++) {
        const int32_t s = layer_src[l];
        LOOM_RETURN_IF(s < 0 || s > l, LOOM_ERR_INVALID_ARG,
                       "kv plan: layer %d reads layer %d, which is not an earlier layer", l, s);
        if (s == l) continue;
        LOOM_RETURN_IF(layer_src[s] != s, LOOM_ERR_INVALID_ARG,
                       "kv plan: layer %d reads layer %d, which reads layer %d itself (no chains)",
                       l, s, layer_src[s]);
        LOOM_RETURN_IF(c->layers[s].kv_group != c->layers[l].kv_group, LOOM_ERR_INVALID_ARG,
                       "kv plan: layers %d and %d attend over different windows (%d and %d)", l, s,
                       c->kv_group_window[c->layers[l].kv_group],
                       c->kv_group_window[c->layers[s].kv_group]);
    }
    return merge_with ? check_merges(m, layer_src, merge_with) : LOOM_OK;
}

int32_t loom__kv_plan_sources(const loom_model *m, const int32_t *layer_src) {
    int32_t n = 0;
    for (int32_t l = 0; l < m->cfg.n_layer; l++) n += layer_src[l] == l;
    return n;
}

/* One decimal integer field starting at *p (after blanks); advances *p past it. */
static bool read_int(const char **p, long *out) {
    const char *s = *p;
    while (*s == ' ' || *s == '\t') s++;
    if ((*s < '0' || *s > '9') && *s != '-' && *s != '+') return false;
    char *end = NULL;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (end == s || errno == ERANGE || (*end != '\0' && *end != ' ' && *end != '\t')) return false;
    *p = end;
    *out = v;
    return true;
}

/* The word starting at *p (after blanks) into word[cap]; false when it is longer. */
static bool read_word(const char **p, char *word, size_t cap) {
    const char *s = *p;
    while (*s == ' ' || *s == '\t') s++;
    size_t n = 0;
    while (s[n] != '\0' && s[n] != ' ' && s[n] != '\t') n++;
    if (n >= cap) return false;
    memcpy(word, s, n);
    word[n] = '\0';
    *p = s + n;
    return true;
}

static bool at_end(const char *p) {
    while (*p == ' ' || *p == '\t' || *p == '\r') p++;
    return *p == '\0';
}

/* One number field starting at *p (after blanks), in [0, 1]. */
static bool read_fraction(const char **p, float *out) {
    const char *s = *p;
    while (*s == ' ' || *s == '\t') s++;
    if ((*s < '0' || *s > '9') && *s != '.') return false;
    char *end = NULL;
    errno = 0;
    const double v = strtod(s, &end);
    if (end == s || errno == ERANGE || (*end != '\0' && *end != ' ' && *end != '\t')) return false;
    if (!(v >= 0.0 && v <= 1.0)) return false;
    *p = end;
    *out = (float)v;
    return true;
}

/* 'share a b' and 'merge a b': the two layers, a later than b, a not named before. */
static loom_status read_pair(const loom_model *m, const char **p, const char *what,
                             const char *name, int lineno, const uint8_t *named, long *a, long *b) {
    const int32_t n_layer = m->cfg.n_layer;
    LOOM_RETURN_IF(!read_int(p, a) || !read_int(p, b) || !at_end(*p), LOOM_ERR_INVALID_ARG,
                   "kv plan %s:%d: expected '%s <layer> <source>'", name, lineno, what);
    LOOM_RETURN_IF(*a < 0 || *a >= n_layer, LOOM_ERR_INVALID_ARG,
                   "kv plan %s:%d: layer %ld: the model has layers 0 .. %d", name, lineno, *a,
                   n_layer - 1);
    LOOM_RETURN_IF(*b < 0 || *b >= n_layer, LOOM_ERR_INVALID_ARG,
                   "kv plan %s:%d: source layer %ld: the model has layers 0 .. %d", name, lineno,
                   *b, n_layer - 1);
    LOOM_RETURN_IF(*a == *b, LOOM_ERR_INVALID_ARG, "kv plan %s:%d: layer %ld is paired with itself",
                   name, lineno, *a);
    LOOM_RETURN_IF(*b > *a, LOOM_ERR_INVALID_ARG,
                   "kv plan %s:%d: layer %ld would read a later layer (%ld): a layer can "
                   "only read the K/V of an earlier one",
                   name, lineno, *a, *b);
    LOOM_RETURN_IF(named[*a], LOOM_ERR_INVALID_ARG,
                   "kv plan %s:%d: layer %ld is named a second time", name, lineno, *a);
    return LOOM_OK;
}

/* One directive (comment and newline removed). *seen_header: the format line came. */
static loom_status parse_line(const loom_model *m, char *line, const char *name, int lineno,
                              bool *seen_header, int32_t *layer_src, loom__kv_merge *merge,
                              uint8_t *named) {
    char *hash = strchr(line, '#');
    if (hash) *hash = '\0';
    size_t len = strlen(line);
    while (len > 0 && (line[len - 1] == '\r' || line[len - 1] == ' ' || line[len - 1] == '\t'))
        line[--len] = '\0';
    const char *p = line;
    char word[32];
    LOOM_RETURN_IF(
        !read_word(&p, word, sizeof word), LOOM_ERR_INVALID_ARG,
        "kv plan %s:%d: unknown directive (expected loom-kv-plan, layers, share or merge)", name,
        lineno);
    if (word[0] == '\0') return LOOM_OK; /* blank or comment */
    const int32_t n_layer = m->cfg.n_layer;
    long a = 0, b = 0;
    if (strcmp(word, "loom-kv-plan") == 0) {
        LOOM_RETURN_IF(*seen_header, LOOM_ERR_INVALID_ARG,
                       "kv plan %s:%d: a second loom-kv-plan line", name, lineno);
        LOOM_RETURN_IF(!read_int(&p, &a) || !at_end(p), LOOM_ERR_INVALID_ARG,
                       "kv plan %s:%d: expected 'loom-kv-plan <version>'", name, lineno);
        LOOM_RETURN_IF(a != 1, LOOM_ERR_UNSUPPORTED,
                       "kv plan %s:%d: format version %ld (this loom reads version 1)", name,
                       lineno, a);
        *seen_header = true;
        return LOOM_OK;
    }
    LOOM_RETURN_IF(!*seen_header, LOOM_ERR_INVALID_ARG,
                   "kv plan %s:%d: not a plan file (its first directive must be "
                   "'loom-kv-plan 1')",
                   name, lineno);
    if (strcmp(word, "layers") == 0) {
        LOOM_RETURN_IF(!read_int(&p, &a) || !at_end(p), LOOM_ERR_INVALID_ARG,
                       "kv plan %s:%d: expected 'layers <count>'", name, lineno);
        LOOM_RETURN_IF(a != n_layer, LOOM_ERR_INVALID_ARG,
                       "kv plan %s:%d: made for a model of %ld layers; this one has %d", name,
                       lineno, a, n_layer);
        return LOOM_OK;
    }
    if (strcmp(word, "share") == 0) {
        LOOM_TRY(read_pair(m, &p, "share", name, lineno, named, &a, &b));
        named[a] = 1;
        layer_src[a] = (int32_t)b;
        return LOOM_OK;
    }
    if (strcmp(word, "merge") == 0) {
        LOOM_TRY(read_pair(m, &p, "merge", name, lineno, named, &a, &b));
        LOOM_RETURN_IF(merge->with[b] != -1 || merge->with[a] != -1, LOOM_ERR_INVALID_ARG,
                       "kv plan %s:%d: layer %ld is already in a merged pair", name, lineno,
                       merge->with[b] != -1 ? b : a);
        named[a] = 1;
        layer_src[a] = (int32_t)b;
        merge->with[a] = (int32_t)b;
        merge->with[b] = (int32_t)a;
        merge->n_pairs++;
        return LOOM_OK;
    }
    if (strcmp(word, "merge-retain") == 0 || strcmp(word, "merge-t") == 0) {
        float v = 0.0f;
        LOOM_RETURN_IF(!read_fraction(&p, &v) || !at_end(p), LOOM_ERR_INVALID_ARG,
                       "kv plan %s:%d: expected '%s <number in [0, 1]>'", name, lineno, word);
        if (strcmp(word, "merge-retain") == 0)
            merge->retain = v;
        else
            merge->t = v;
        return LOOM_OK;
    }
    return loom__fail(LOOM_ERR_INVALID_ARG,
                      "kv plan %s:%d: unknown directive '%s' (expected loom-kv-plan, layers, "
                      "share, merge, merge-retain or merge-t)",
                      name, lineno, word);
}

static loom_status parse(const loom_model *m, const char *text, const char *name,
                         int32_t *layer_src, loom__kv_merge *merge, uint8_t *named, char *line) {
    bool seen_header = false;
    int lineno = 0;
    const char *p = text;
    while (*p != '\0') {
        const char *nl = strchr(p, '\n');
        const size_t len = nl ? (size_t)(nl - p) : strlen(p);
        lineno++;
        LOOM_RETURN_IF(len >= LOOM_KV_PLAN_MAX_LINE, LOOM_ERR_INVALID_ARG,
                       "kv plan %s:%d: a line of more than %d bytes", name, lineno,
                       LOOM_KV_PLAN_MAX_LINE - 1);
        memcpy(line, p, len);
        line[len] = '\0';
        LOOM_TRY(parse_line(m, line, name, lineno, &seen_header, layer_src, merge, named));
        p += len;
        if (*p == '\n') p++;
    }
    LOOM_RETURN_IF(!seen_header, LOOM_ERR_INVALID_ARG,
                   "kv plan %s: empty (a plan starts with 'loom-kv-plan 1')", name);
    loom_status s = loom__kv_plan_check(m, layer_src, merge->with);
    if (s != LOOM_OK) loom__error_prefix("%s", name);
    return s;
}

/* The model's own map, no pairs, the defaults. */
static void plan_reset(const loom_model *m, int32_t *layer_src, loom__kv_merge *merge) {
    for (int32_t l = 0; l < m->cfg.n_layer; l++) layer_src[l] = m->cfg.layers[l].kv_src;
    loom__kv_merge_reset(merge, m->cfg.n_layer);
}

loom_status loom__kv_plan_parse(const loom_model *m, const char *text, const char *name,
                                int32_t *layer_src, loom__kv_merge *merge) {
    LOOM_CHECK_ARG(m != NULL && text != NULL && layer_src != NULL && merge != NULL &&
                   merge->with != NULL);
    const loom__model_config *c = &m->cfg;
    plan_reset(m, layer_src, merge);
    uint8_t *named = loom__calloc((size_t)c->n_layer, 1);
    char *line = loom__malloc(LOOM_KV_PLAN_MAX_LINE);
    loom_status s = named && line
                        ? parse(m, text, name ? name : "(text)", layer_src, merge, named, line)
                        : loom__fail(LOOM_ERR_OUT_OF_MEMORY, "kv plan: out of memory");
    free(named);
    free(line);
    return s;
}

loom_status loom__kv_plan_load(const loom_model *m, const char *path, int32_t *layer_src,
                               loom__kv_merge *merge) {
    LOOM_CHECK_ARG(m != NULL && layer_src != NULL && merge != NULL && merge->with != NULL);
    if (path == NULL || path[0] == '\0') {
        plan_reset(m, layer_src, merge);
        return loom__kv_plan_check(m, layer_src, merge->with);
    }
    FILE *f = fopen(path, "rb");
    LOOM_RETURN_IF(f == NULL, LOOM_ERR_IO, "kv plan %s: %s", path, strerror(errno));
    char *text = loom__malloc(KV_PLAN_MAX_BYTES + 1);
    if (text == NULL) {
        fclose(f);
        return loom__fail(LOOM_ERR_OUT_OF_MEMORY, "kv plan %s: out of memory", path);
    }
    const size_t n = fread(text, 1, KV_PLAN_MAX_BYTES + 1, f);
    const bool failed = ferror(f) != 0;
    fclose(f);
    loom_status s = LOOM_OK;
    if (failed) {
        s = loom__fail(LOOM_ERR_IO, "kv plan %s: read error", path);
    } else if (n > KV_PLAN_MAX_BYTES) {
        s = loom__fail(LOOM_ERR_INVALID_ARG, "kv plan %s: larger than %u bytes: not a plan file",
                       path, KV_PLAN_MAX_BYTES);
    } else {
        text[n] = '\0';
        s = memchr(text, '\0', n) != NULL
                ? loom__fail(LOOM_ERR_INVALID_ARG, "kv plan %s: a NUL byte: not a text file", path)
                : loom__kv_plan_parse(m, text, path, layer_src, merge);
    }
    free(text);
    return s;
}
