/* loom-kv-plan — a cross-layer KV reuse plan calibrated on a text (training-free aliasing, in
 * the spirit of KVSharer): which layers may attend over an earlier layer's keys and values
 * instead of their own.
 *
 *   loom-kv-plan -m MODEL -f TEXT -o PLAN [--tokens N] [--threshold T | --saving F]
 *                [--max-kl K [--val-tokens V]] [--adjacent] [--ctx C] [-t THREADS]
 *                [--merge [--retain R] [--merge-t W]] [--backend NAME] [--quiet]
 *
 * It runs the first N tokens of TEXT (default 1024) through one session with float32 pages,
 * reads every layer's cached K (after its norm and RoPE) and V back (loom_session_kv_read), and
 * scores each pair of a layer L and an earlier layer S of the same attention window by
 *     sim(L, S) = the mean over KV heads and positions of (cos(k_L, k_S) + cos(v_L, v_S)) / 2,
 * the two layers' vectors for one position and head compared by their angle. The attention of
 * a layer over another's cache is closest to its own when the keys point the same way (the
 * softmax sees the same ranking) and the values do too (the same mix comes out). Pairs are
 * taken greedily from the most similar: L may read S when L reads no one yet, no accepted pair
 * reads L, and S keeps its own K/V (plans have no chains). It stops at the first pair under
 * --threshold (default 0.9), or, with --saving F, once the plan saves a fraction F of the KV
 * bytes a sequence of C tokens (default 1024) holds (sliding-window layers hold at most their
 * window). --adjacent limits S to the previous layer of the same window.
 *
 * --max-kl K measures instead of trusting the similarity: every pair alone is run over the
 * first V tokens of TEXT (default 256) and scored by the mean KL divergence of the model's
 * next-token distributions with the pair against those without (the unshared model's); pairs
 * are then taken from the least costly, each kept only while the whole plan's measured KL
 * stays <= K (and, with --saving, until the saving is reached). On Gemma 3 270M the angle
 * between two layers' keys predicts little of what sharing them costs (the most similar pair
 * costs more than many dissimilar ones), which is why this mode exists; KVSharer validates its
 * pairs on the model's output in the same spirit.
 *
 * --merge plans merged pairs instead (MiniCache-style: "merge L S" lines; loom_backend.h): each
 * layer L of the model's deeper half with the previous layer S of its window, pairs disjoint,
 * ranked and taken as above. A merged pair keeps both layers' norms and each block's R most
 * different tokens unmerged (--retain R, the fraction of a block's tokens: default 0.1), and
 * interpolates the rest (--merge-t W, default 0.6, the weight of L's direction); the saving
 * counts the merge blocks against F16 pages of 16 positions (the defaults).
 *
 * The plan file (read by loom_session_params.kv_plan / loom_engine_params.kv_plan) lists each
 * pair with its similarity. Every pair and its score is printed too, unless --quiet. Whether a
 * plan keeps the model's accuracy is for a measurement to say (bench/kv-accuracy). */
#define _POSIX_C_SOURCE 200809L

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "loom.h"

typedef struct pair {
    int32_t layer, src;
    double sim, sim_k, sim_v, min_head; /* min_head: the least similar head's (K + V) / 2 */
    double kl;                          /* --max-kl: the pair alone, measured; else -1 */
} pair;

typedef struct options {
    const char *model, *text, *out, *backend;
    int32_t tokens, ctx, threads;
    double threshold, saving; /* saving < 0: by threshold */
    double max_kl;            /* < 0: by similarity only */
    int32_t val_tokens;
    int adjacent, quiet;
    int merge;              /* plan merged pairs (merge lines) rather than shares */
    double retain, merge_t; /* --merge: the plan's merge-retain and merge-t */
} options;

static void usage(void) {
    fprintf(stderr, "usage: loom-kv-plan -m MODEL -f TEXT -o PLAN [--tokens N] [--threshold T | "
                    "--saving F]\n"
                    "                    [--max-kl K [--val-tokens V]] [--adjacent] [--ctx C] "
                    "[-t THREADS]\n"
                    "                    [--merge [--retain R] [--merge-t W]] [--backend NAME] "
                    "[--quiet]\n");
}

static char *read_file(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "loom-kv-plan: %s: %s\n", path, strerror(errno));
        return NULL;
    }
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    while (buf) {
        n += fread(buf + n, 1, cap - n, f);
        if (n < cap) break;
        char *grown = realloc(buf, cap *= 2);
        if (!grown) free(buf);
        buf = grown;
    }
    fclose(f);
    if (!buf) fprintf(stderr, "loom-kv-plan: %s: out of memory\n", path);
    *len = n;
    return buf;
}

static int parse_number(const char *s, double lo, double hi, double *out) {
    char *end = NULL;
    errno = 0;
    double v = strtod(s, &end);
    if (end == s || *end != '\0' || errno == ERANGE || !(v >= lo && v <= hi)) return 0;
    *out = v;
    return 1;
}

static int parse_args(int argc, char **argv, options *o) {
    *o = (options){.tokens = 1024,
                   .ctx = 1024,
                   .threads = 0,
                   .threshold = 0.9,
                   .saving = -1,
                   .max_kl = -1,
                   .val_tokens = 256,
                   .retain = 0.1,
                   .merge_t = 0.6};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        double x;
        if (strcmp(a, "--adjacent") == 0) {
            o->adjacent = 1;
        } else if (strcmp(a, "--quiet") == 0) {
            o->quiet = 1;
        } else if (strcmp(a, "--merge") == 0) {
            o->merge = 1;
        } else if (v == NULL) {
            fprintf(stderr, "loom-kv-plan: %s needs a value\n", a);
            return 0;
        } else if (strcmp(a, "-m") == 0) {
            o->model = argv[++i];
        } else if (strcmp(a, "-f") == 0) {
            o->text = argv[++i];
        } else if (strcmp(a, "-o") == 0) {
            o->out = argv[++i];
        } else if (strcmp(a, "--backend") == 0) {
            o->backend = argv[++i];
        } else if (strcmp(a, "--tokens") == 0 && parse_number(v, 2, 1 << 20, &x)) {
            o->tokens = (int32_t)x, i++;
        } else if (strcmp(a, "--ctx") == 0 && parse_number(v, 1, 1 << 24, &x)) {
            o->ctx = (int32_t)x, i++;
        } else if (strcmp(a, "-t") == 0 && parse_number(v, 0, 1024, &x)) {
            o->threads = (int32_t)x, i++;
        } else if (strcmp(a, "--threshold") == 0 && parse_number(v, -1, 1, &x)) {
            o->threshold = x, i++;
        } else if (strcmp(a, "--saving") == 0 && parse_number(v, 0, 1, &x)) {
            o->saving = x, i++;
        } else if (strcmp(a, "--max-kl") == 0 && parse_number(v, 0, 1e9, &x)) {
            o->max_kl = x, i++;
        } else if (strcmp(a, "--val-tokens") == 0 && parse_number(v, 2, 1 << 16, &x)) {
            o->val_tokens = (int32_t)x, i++;
        } else if (strcmp(a, "--retain") == 0 && parse_number(v, 0, 1, &x)) {
            o->retain = x, i++;
        } else if (strcmp(a, "--merge-t") == 0 && parse_number(v, 0, 1, &x)) {
            o->merge_t = x, i++;
        } else {
            fprintf(stderr, "loom-kv-plan: bad argument %s %s\n", a, v);
            return 0;
        }
    }
    if (!o->model || !o->text || !o->out) {
        usage();
        return 0;
    }
    return 1;
}

/* Mean over rows of the cosine of a[r] and b[r] (rows of d floats); per head h of n_heads:
 * rows r = t * n_heads + h. out[h] gets head h's mean. */
static void head_cosines(const float *a, const float *b, int32_t n_pos, int32_t n_heads, int32_t d,
                         double *out) {
    for (int32_t h = 0; h < n_heads; h++) {
        double sum = 0;
        for (int32_t t = 0; t < n_pos; t++) {
            const float *x = a + ((size_t)t * n_heads + h) * d,
                        *y = b + ((size_t)t * n_heads + h) * d;
            double xy = 0, xx = 0, yy = 0;
            for (int32_t i = 0; i < d; i++) {
                xy += (double)x[i] * y[i];
                xx += (double)x[i] * x[i];
                yy += (double)y[i] * y[i];
            }
            /* Two zero vectors point nowhere: count them as the same (nothing lost). */
            sum += xx > 0 && yy > 0 ? xy / sqrt(xx * yy) : (xx == yy ? 1.0 : 0.0);
        }
        out[h] = sum / n_pos;
    }
}

static int by_similarity(const void *pa, const void *pb) {
    const pair *a = pa, *b = pb;
    if (a->sim != b->sim) return a->sim < b->sim ? 1 : -1;
    return a->layer != b->layer ? a->layer - b->layer : a->src - b->src;
}

typedef struct calib {
    int32_t n_layer, n_heads, head_dim, n_tok;
    int32_t *window, *first; /* per layer: its window; the first position it still holds */
    float **k, **v;          /* per layer: [n_tok - first][n_heads][head_dim] */
} calib;

static loom_status read_layers(loom_model *m, const loom_token *toks, int32_t n, calib *c) {
    loom_session_params sp = loom_session_default_params();
    sp.n_ctx = n;
    sp.n_batch = n < 512 ? n : 512;
    sp.block_size = 16;
    sp.kv_type = LOOM_KV_CACHE_F32;
    loom_session *s = NULL;
    loom_status st = loom_session_create(m, &sp, &s);
    if (st != LOOM_OK) return st;
    st = loom_session_decode(s, toks, n, false);
    const size_t row = (size_t)c->n_heads * (size_t)c->head_dim;
    for (int32_t l = 0; st == LOOM_OK && l < c->n_layer; l++) {
        const int32_t w = c->window[l];
        /* A sliding-window layer has released the blocks wholly before its window. */
        c->first[l] = w > 0 && n > w ? ((n - w) / sp.block_size + 1) * sp.block_size : 0;
        if (c->first[l] >= n) c->first[l] = n - 1;
        const size_t rows = (size_t)(n - c->first[l]);
        c->k[l] = malloc(rows * row * sizeof(float));
        c->v[l] = malloc(rows * row * sizeof(float));
        if (!c->k[l] || !c->v[l]) {
            st = LOOM_ERR_OUT_OF_MEMORY;
            break;
        }
        st = loom_session_kv_read(s, l, c->first[l], (int32_t)rows, c->k[l], c->v[l]);
    }
    loom_session_free(s);
    return st;
}

/* Every allowed pair (L, S) with its scores, into *out (malloc'd), *n_out of them. */
static int score_pairs(const calib *c, int adjacent, int merge, pair **out, int32_t *n_out) {
    const int32_t L = c->n_layer, H = c->n_heads, d = c->head_dim;
    pair *pairs = malloc((size_t)L * (size_t)L * sizeof *pairs);
    double *ck = malloc((size_t)H * sizeof *ck), *cv = malloc((size_t)H * sizeof *cv);
    if (!pairs || !ck || !cv) {
        free(pairs), free(ck), free(cv);
        return 0;
    }
    int32_t n = 0;
    for (int32_t l = 1; l < L; l++) {
        for (int32_t s = l - 1; s >= 0; s--) {
            if (c->window[s] != c->window[l]) continue;
            if (merge && s < L / 2) break; /* merged pairs: the deeper half, adjacent */
            /* The positions both hold (the same window: the same first). */
            const int32_t first = c->first[l] > c->first[s] ? c->first[l] : c->first[s];
            const size_t row = (size_t)H * (size_t)d;
            const int32_t n_pos = c->n_tok - first;
            head_cosines(c->k[l] + (size_t)(first - c->first[l]) * row,
                         c->k[s] + (size_t)(first - c->first[s]) * row, n_pos, H, d, ck);
            head_cosines(c->v[l] + (size_t)(first - c->first[l]) * row,
                         c->v[s] + (size_t)(first - c->first[s]) * row, n_pos, H, d, cv);
            pair p = {.layer = l, .src = s, .min_head = INFINITY, .kl = -1};
            for (int32_t h = 0; h < H; h++) {
                p.sim_k += ck[h] / H;
                p.sim_v += cv[h] / H;
                const double both = (ck[h] + cv[h]) / 2;
                if (both < p.min_head) p.min_head = both;
            }
            p.sim = (p.sim_k + p.sim_v) / 2;
            pairs[n++] = p;
            if (adjacent || merge) break; /* only the nearest earlier layer of the window */
        }
    }
    free(ck), free(cv);
    qsort(pairs, (size_t)n, sizeof *pairs, by_similarity);
    *out = pairs;
    *n_out = n;
    return 1;
}

/* The unshared model's next-token log-probabilities over the validation tokens, and where the
 * candidate plans are written for the sessions that measure them. */
typedef struct validation {
    const options *o;
    loom_model *m;
    const loom_token *toks;
    int32_t n, n_vocab, n_layer;
    float *base; /* [n][n_vocab] log-probabilities without sharing */
    char *plan_path;
} validation;

static double log_sum_exp(const float *x, int32_t n) {
    float mx = -INFINITY;
    for (int32_t i = 0; i < n; i++) mx = x[i] > mx ? x[i] : mx;
    double sum = 0;
    for (int32_t i = 0; i < n; i++) sum += exp((double)x[i] - mx);
    return log(sum) + mx;
}

/* The directive of a pair, and the merge settings' lines (none for shares). */
static const char *pair_word(const options *o) {
    return o->merge ? "merge" : "share";
}
static void merge_settings(FILE *f, const options *o) {
    if (o->merge) fprintf(f, "merge-retain %g\nmerge-t %g\n", o->retain, o->merge_t);
}

static int write_plan_lines(FILE *f, const options *o, const int32_t *src, int32_t n_layer) {
    fprintf(f, "loom-kv-plan 1\nlayers %d\n", n_layer);
    merge_settings(f, o);
    for (int32_t l = 0; l < n_layer; l++)
        if (src[l] != l) fprintf(f, "%s %d %d\n", pair_word(o), l, src[l]);
    return fclose(f) == 0;
}

/* Runs the validation tokens with layer map src (NULL: unshared); with val->base set, *kl gets
 * the mean KL(unshared || src) per position, else the unshared log-probabilities are kept. */
static loom_status run_plan(validation *val, const int32_t *src, double *kl) {
    loom_session_params sp = loom_session_default_params();
    sp.n_ctx = val->n;
    sp.n_batch = val->n < 512 ? val->n : 512;
    if (src != NULL) {
        FILE *f = fopen(val->plan_path, "w");
        if (!f || !write_plan_lines(f, val->o, src, val->n_layer)) {
            fprintf(stderr, "loom-kv-plan: %s: cannot write\n", val->plan_path);
            return LOOM_ERR_IO;
        }
        sp.kv_plan = val->plan_path;
    }
    loom_session *s = NULL;
    loom_status st = loom_session_create(val->m, &sp, &s);
    if (st == LOOM_OK) st = loom_session_decode(s, val->toks, val->n, true);
    double sum = 0;
    const int32_t V = val->n_vocab;
    for (int32_t t = 0; st == LOOM_OK && t < val->n; t++) {
        const float *x = loom_session_logits(s, t);
        const double lse = log_sum_exp(x, V);
        float *base = val->base + (size_t)t * (size_t)V;
        if (src == NULL) {
            for (int32_t i = 0; i < V; i++) base[i] = (float)(x[i] - lse);
            continue;
        }
        double d = 0;
        for (int32_t i = 0; i < V; i++) {
            const double lp = base[i];
            d += exp(lp) * (lp - ((double)x[i] - lse));
        }
        sum += d;
    }
    loom_session_free(s);
    if (kl) *kl = sum / val->n;
    return st;
}

static int by_kl(const void *pa, const void *pb) {
    const pair *a = pa, *b = pb;
    if (a->kl != b->kl) return a->kl < b->kl ? -1 : 1;
    return by_similarity(pa, pb);
}

/* Bytes one layer's KV takes for a sequence of ctx tokens, up to the common factor. */
static double layer_weight(int32_t window, int32_t ctx) {
    return window > 0 && window < ctx ? window : ctx;
}

static int run(const options *o) {
    loom_model_params mp = loom_model_default_params();
    mp.n_threads = o->threads;
    mp.backend = o->backend;
    loom_model *m = NULL;
    loom_status st = loom_model_load(o->model, &mp, &m);
    if (st != LOOM_OK) {
        fprintf(stderr, "loom-kv-plan: %s\n", loom_last_error());
        return 1;
    }
    loom_model_info info = {.size = sizeof info};
    loom_model_get_info(m, &info);
    size_t len = 0, n_tok = 0;
    char *text = read_file(o->text, &len);
    loom_token *toks = NULL;
    int rc = 1;
    calib c = {.n_layer = info.n_layer, .n_heads = info.n_head_kv, .head_dim = info.head_dim};
    c.window = calloc((size_t)c.n_layer, sizeof *c.window);
    c.first = calloc((size_t)c.n_layer, sizeof *c.first);
    c.k = calloc((size_t)c.n_layer, sizeof *c.k);
    c.v = calloc((size_t)c.n_layer, sizeof *c.v);
    pair *pairs = NULL;
    int32_t n_pairs = 0, n_order = 0;
    FILE *f = NULL;
    int32_t *src = NULL;   /* the plan: the layer each layer reads */
    char *is_read = NULL;  /* is_read[l]: an accepted pair reads layer l */
    int32_t *order = NULL; /* the accepted pairs in the order taken, and the plan's saving and
                              KL after each */
    double *after_saved = NULL, *after_kl = NULL;
    if (!text || !c.window || !c.first || !c.k || !c.v) goto done;
    for (int32_t l = 0; l < c.n_layer; l++) c.window[l] = loom_model_layer_window(m, l);
    st = loom_tokenize(m, text, len, LOOM_TOKENIZE_ADD_SPECIAL, NULL, 0, &n_tok);
    if (st == LOOM_OK || st == LOOM_ERR_BUFFER_TOO_SMALL) {
        toks = malloc((n_tok ? n_tok : 1) * sizeof *toks);
        st = toks ? loom_tokenize(m, text, len, LOOM_TOKENIZE_ADD_SPECIAL, toks, n_tok, &n_tok)
                  : LOOM_ERR_OUT_OF_MEMORY;
    }
    if (st != LOOM_OK) {
        fprintf(stderr, "loom-kv-plan: tokenize %s: %s\n", o->text, loom_last_error());
        goto done;
    }
    if (n_tok < 2) {
        fprintf(stderr, "loom-kv-plan: %s has fewer than 2 tokens\n", o->text);
        goto done;
    }
    c.n_tok = n_tok < (size_t)o->tokens ? (int32_t)n_tok : o->tokens;
    st = read_layers(m, toks, c.n_tok, &c);
    if (st != LOOM_OK) {
        fprintf(stderr, "loom-kv-plan: calibration run: %s\n", loom_last_error());
        goto done;
    }
    if (!score_pairs(&c, o->adjacent, o->merge, &pairs, &n_pairs)) {
        fprintf(stderr, "loom-kv-plan: out of memory\n");
        goto done;
    }

    /* Greedy choice, most similar first. */
    src = malloc((size_t)c.n_layer * sizeof *src);
    is_read = calloc((size_t)c.n_layer, 1);
    order = malloc((size_t)c.n_layer * sizeof *order);
    after_saved = malloc((size_t)c.n_layer * sizeof *after_saved);
    after_kl = malloc((size_t)c.n_layer * sizeof *after_kl);
    if (!src || !is_read || !order || !after_saved || !after_kl) goto done;
    double total = 0, saved = 0, plan_kl = 0;
    for (int32_t l = 0; l < c.n_layer; l++) {
        src[l] = l;
        total += layer_weight(c.window[l], o->ctx);
    }
    validation val = {.o = o, .m = m, .toks = toks, .n_vocab = info.n_vocab, .n_layer = c.n_layer};
    /* What one pair saves of its later layer's bytes: all of them (shared), or all but the
     * merge blocks (merged; F16 pages of 16 positions: loom_backend.h's layout). */
    double pair_saves = 1.0;
    if (o->merge) {
        const double S = 16, H = c.n_heads, page = 2 * S * H * c.head_dim * 2;
        const double R = ceil(o->retain * S);
        pair_saves = 1.0 - (S * H * 16 + S * 8 + R * 2 * H * c.head_dim * 2) / page;
    }
    if (o->max_kl >= 0) {
        val.n = c.n_tok < o->val_tokens ? c.n_tok : o->val_tokens;
        val.base = malloc((size_t)val.n * (size_t)info.n_vocab * sizeof *val.base);
        val.plan_path = malloc(strlen(o->out) + 8);
        if (!val.base || !val.plan_path) {
            fprintf(stderr, "loom-kv-plan: out of memory for the validation logits\n");
            st = LOOM_ERR_OUT_OF_MEMORY;
        } else {
            sprintf(val.plan_path, "%s.trial", o->out);
            st = run_plan(&val, NULL, NULL);
        }
        for (int32_t i = 0; st == LOOM_OK && i < n_pairs; i++) {
            src[pairs[i].layer] = pairs[i].src;
            st = run_plan(&val, src, &pairs[i].kl);
            src[pairs[i].layer] = pairs[i].layer;
            if (!o->quiet && ((i + 1) % 10 == 0 || i + 1 == n_pairs))
                fprintf(stderr, "measured %d / %d pairs\n", i + 1, n_pairs);
        }
        if (st != LOOM_OK) {
            fprintf(stderr, "loom-kv-plan: validation run: %s\n", loom_last_error());
            free(val.base), free(val.plan_path);
            goto done;
        }
        qsort(pairs, (size_t)n_pairs, sizeof *pairs, by_kl);
    }
    for (int32_t i = 0; i < n_pairs; i++) {
        const pair *p = &pairs[i];
        if (o->saving >= 0 && saved >= o->saving * total) break;
        if (o->saving < 0 && o->max_kl < 0 && p->sim < o->threshold) break;
        if (src[p->layer] != p->layer || is_read[p->layer] || src[p->src] != p->src ||
            (o->merge && is_read[p->src]))
            continue; /* a merged pair's layers are in no other pair */
        src[p->layer] = p->src;
        if (o->max_kl >= 0) {
            double kl = 0;
            st = run_plan(&val, src, &kl);
            if (st != LOOM_OK || kl > o->max_kl) {
                src[p->layer] = p->layer;
                if (st != LOOM_OK) break;
                continue;
            }
            plan_kl = kl;
        }
        is_read[p->src] = 1;
        saved += pair_saves * layer_weight(c.window[p->layer], o->ctx);
        order[n_order] = i;
        after_saved[n_order] = saved / total;
        after_kl[n_order++] = plan_kl;
    }
    if (val.plan_path) remove(val.plan_path);
    free(val.base), free(val.plan_path);
    if (st != LOOM_OK) {
        fprintf(stderr, "loom-kv-plan: validation run: %s\n", loom_last_error());
        goto done;
    }

    f = fopen(o->out, "w");
    if (!f) {
        fprintf(stderr, "loom-kv-plan: %s: %s\n", o->out, strerror(errno));
        goto done;
    }
    fprintf(f, "loom-kv-plan 1\n");
    fprintf(f, "# made by loom-kv-plan from %d tokens of %s\n", c.n_tok, o->text);
    fprintf(f, "# similarity: mean over KV heads and positions of (cos K + cos V) / 2\n");
    if (o->saving >= 0)
        fprintf(f, "# target: save %.1f%% of the KV bytes at %d tokens\n", 100 * o->saving, o->ctx);
    else if (o->max_kl < 0)
        fprintf(f, "# threshold: similarity >= %.4f\n", o->threshold);
    if (o->max_kl >= 0)
        fprintf(f,
                "# validated: mean KL to the unshared model over %d tokens <= %g; this plan's: "
                "%.5f\n",
                val.n, o->max_kl, plan_kl);
    if (o->merge)
        fprintf(f,
                "# merged pairs: the deeper half's adjacent same-window layers; %.0f%% of each "
                "block's tokens kept unmerged, slerp weight %.2f\n",
                100 * o->retain, o->merge_t);
    fprintf(f, "# saves %.1f%% of the KV bytes of a %d-token sequence\n", 100 * saved / total,
            o->ctx);
    fprintf(f, "layers %d\n", c.n_layer);
    merge_settings(f, o);
    fprintf(f, "# in the order taken: each line's plan is it and the lines above it\n");
    for (int32_t j = 0; j < n_order; j++) {
        const pair *p = &pairs[order[j]];
        fprintf(f, "%s %d %d   # similarity %.4f (K %.4f, V %.4f; least head %.4f)", pair_word(o),
                p->layer, p->src, p->sim, p->sim_k, p->sim_v, p->min_head);
        if (p->kl >= 0) fprintf(f, "; KL alone %.5f, so far %.5f", p->kl, after_kl[j]);
        fprintf(f, "; saves %.1f%% so far\n", 100 * after_saved[j]);
    }
    rc = fclose(f) == 0 ? 0 : 1;
    f = NULL;
    if (rc) fprintf(stderr, "loom-kv-plan: %s: write error\n", o->out);
    if (!o->quiet) {
        printf("%-6s %-6s %8s %8s %8s %10s %10s\n", "layer", "reads", "sim", "sim_k", "sim_v",
               "least_head", "kl_alone");
        for (int32_t i = 0; i < n_pairs; i++)
            printf("%-6d %-6d %8.4f %8.4f %8.4f %10.4f %10.5f%s\n", pairs[i].layer, pairs[i].src,
                   pairs[i].sim, pairs[i].sim_k, pairs[i].sim_v, pairs[i].min_head, pairs[i].kl,
                   src[pairs[i].layer] == pairs[i].src ? "  planned" : "");
    }
    printf("plan %s: %d tokens, saves %.1f%% of the KV bytes at %d tokens\n", o->out, c.n_tok,
           100 * saved / total, o->ctx);

done:
    free(src), free(is_read), free(order), free(after_saved), free(after_kl);
    if (f) fclose(f);
    for (int32_t l = 0; c.k && l < c.n_layer; l++) free(c.k[l]);
    for (int32_t l = 0; c.v && l < c.n_layer; l++) free(c.v[l]);
    free(c.k), free(c.v), free(c.window), free(c.first);
    free(pairs);
    free(toks);
    free(text);
    loom_model_free(m);
    return rc;
}

int main(int argc, char **argv) {
    options o;
    if (!parse_args(argc, argv, &o)) return 2;
    return run(&o);
}
