/* chain_select.c — the sampler chain's partial selection (k-best heaps, a radix sort of
 * candidates) and the vector helpers of its sweeps over the vocabulary. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "sample/chain_internal.h"
#include "sample/vexp.h"

/* ---- partial selection ------------------------------------------------------------------ */

/* Higher logit first; equal logits: lower id first (a total order). */
int loom__chain_cand_cmp(const void *a, const void *b) {
    const loom__chain_cand *p = a, *q = b;
    if (p->x != q->x) return p->x > q->x ? -1 : 1;
    return (p->id > q->id) - (p->id < q->id);
}

static bool cand_worse(const loom__chain_cand *a, const loom__chain_cand *b) {
    return loom__chain_cand_cmp(a, b) > 0;
}

/* A heap whose root is the worst of the k best seen so far. */
void loom__chain_heap_offer(loom__chain_cand *h, int32_t *held, int32_t k, loom__chain_cand v) {
    int32_t i;
    if (*held < k) {
        i = (*held)++;
        while (i > 0 && cand_worse(&v, &h[(i - 1) / 2])) {
            h[i] = h[(i - 1) / 2];
            i = (i - 1) / 2;
        }
        h[i] = v;
        return;
    }
    if (!cand_worse(&h[0], &v)) return;
    i = 0;
    for (;;) {
        int32_t l = 2 * i + 1, r = l + 1, m = -1;
        const loom__chain_cand *worst = &v;
        if (l < k && cand_worse(&h[l], worst)) m = l, worst = &h[l];
        if (r < k && cand_worse(&h[r], worst)) m = r;
        if (m < 0) break;
        h[i] = h[m];
        i = m;
    }
    h[i] = v;
}

/* ---- vocabulary sweeps ------------------------------------------------------------------ */
/* A 262,144-token vocabulary makes every per-token operation count: the copy of the logits
 * records each block's maximum, so later sweeps skip blocks that cannot matter, and
 * exponentials are taken a vector at a time (vexp.h). */

/* Largest finite entry of x[0..n) (-inf when none), n <= CHAIN_BLOCK. */
float loom__chain_block_max(const float *x, int32_t n) {
    float r = -INFINITY;
    int32_t i = 0;
    if (n == CHAIN_BLOCK) {
        loom__v8f m = {-INFINITY, -INFINITY, -INFINITY, -INFINITY,
                       -INFINITY, -INFINITY, -INFINITY, -INFINITY};
        for (; i < CHAIN_BLOCK; i += 8) {
            loom__v8f v;
            memcpy(&v, x + i, sizeof v);
            loom__v8i gt = v > m; /* false for NaN */
            m = (loom__v8f)(((loom__v8i)v & gt) | ((loom__v8i)m & ~gt));
        }
        for (int j = 0; j < 8; j++) r = m[j] > r ? m[j] : r;
    }
    for (; i < n; i++) r = x[i] > r ? x[i] : r;
    return r;
}

/* w[j] = e^(s (xs[j] - xmax)) for j < 8 where xs[j] is finite, else 0 (xmax >= every xs[j]). */
static inline void exp8_shifted(const float *xs, double s, double xmax, double *w) {
    for (int h = 0; h < 8; h += LOOM__VL) {
        loom__vf v;
        memcpy(&v, xs + h, sizeof v);
        const loom__vd d = (__builtin_convertvector(v, loom__vd) - xmax) * s; /* -inf stays */
        loom__vd dz, e;
        loom__vl keep;
        loom__vexp_split(&d, &dz, &keep);
        loom__vexp(&e, &dz, &keep);
        memcpy(w + h, &e, sizeof e);
    }
}

/* w[i] = e^(s (cd[i].x - xmax)) for the candidates cd[0..n) (all finite). */
void loom__chain_exp_cands(const loom__chain_cand *cd, int32_t n, double s, double xmax,
                           double *w) {
    int32_t i = 0;
    for (; i + 8 <= n; i += 8) {
        float xs[8];
        for (int j = 0; j < 8; j++) xs[j] = cd[i + j].x;
        exp8_shifted(xs, s, xmax, w + i);
    }
    if (i < n) {
        float xs[8] = {-INFINITY, -INFINITY, -INFINITY, -INFINITY,
                       -INFINITY, -INFINITY, -INFINITY, -INFINITY};
        double e[8];
        for (int32_t j = 0; j < n - i; j++) xs[j] = cd[i + j].x;
        exp8_shifted(xs, s, xmax, e);
        memcpy(w + i, e, (size_t)(n - i) * sizeof *w);
    }
}

/* The k best finite entries of x[0..n) into h, best first; returns how many. bmax holds the
 * maximum of each block of x. Once the heap is full, a block whose maximum does not beat the
 * heap's worst is skipped: its entries could only tie it with a higher id, which ranks lower. */
int32_t loom__chain_select_best(const float *x, const float *bmax, int32_t n, int32_t k,
                                loom__chain_cand *h) {
    int32_t held = 0;
    for (int32_t b = 0; b < n; b += CHAIN_BLOCK) {
        int32_t e = n - b < CHAIN_BLOCK ? n : b + CHAIN_BLOCK;
        if (held == k && !(bmax[b / CHAIN_BLOCK] > h[0].x)) continue;
        for (int32_t i = b; i < e; i++) {
            if (!(x[i] > -INFINITY) || (held == k && x[i] < h[0].x)) continue;
            loom__chain_heap_offer(h, &held, k, (loom__chain_cand){x[i], i});
        }
    }
    qsort(h, (size_t)held, sizeof *h, loom__chain_cand_cmp);
    return held;
}

/* Sorts cd[0..n), which must arrive in increasing id order, best first (loom__chain_cand_cmp's
 * order): a stable LSD radix sort on loom__chain_desc_key, so equal logits keep lower ids first.
 * tmp holds n entries. Small sets go to qsort. */
void loom__chain_sort_cands(loom__chain_cand *cd, int32_t n, loom__chain_cand *tmp) {
    if (n < 256) {
        qsort(cd, (size_t)n, sizeof *cd, loom__chain_cand_cmp);
        return;
    }
    loom__chain_cand *src = cd, *dst = tmp;
    for (int shift = 0; shift < 32; shift += 8) { /* four passes: the result ends in cd */
        size_t count[257] = {0};
        for (int32_t i = 0; i < n; i++)
            count[(loom__chain_desc_key(src[i].x) >> shift & 0xFF) + 1]++;
        for (int j = 0; j < 256; j++) count[j + 1] += count[j];
        for (int32_t i = 0; i < n; i++)
            dst[count[loom__chain_desc_key(src[i].x) >> shift & 0xFF]++] = src[i];
        loom__chain_cand *t = src;
        src = dst;
        dst = t;
    }
}

int loom__chain_key_cmp(const void *a, const void *b) {
    const loom__chain_key *p = a, *q = b;
    if (p->key != q->key) return p->key < q->key ? -1 : 1;
    if (p->x != q->x) return p->x > q->x ? -1 : 1;
    return (p->id > q->id) - (p->id < q->id);
}
