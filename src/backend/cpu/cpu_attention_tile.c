/* cpu_attention_tile.c — one tile of positions: widen K and V once, then advance the online
 * softmax of up to ATTN_QBLOCK query vectors over it.
 *
 * The arithmetic of one query vector, and why it does not depend on its companions:
 *   score(j) = fma chain over d = 0 .. head_dim-1 of q[d] * k_j[d], from 0, then * scale (and
 *              the soft cap). K is stored transposed by groups of LW_N positions, so LW_N
 *              scores come out of one vector of chains; a lane is one (query, position) pair
 *              and never mixes with another lane.
 *   tile max  = max over the 8-lane groups of the tile that hold its lanes, in order, lanes it
 *              does not attend to set to -inf, then a fixed 8-lane tree.
 *   weights   w(j) = exp(score(j) - m) (cpu_attention_exp.h); masked lanes give exactly +0.
 *   l         = l * corr + (the same groups' weights summed in order, then the fixed tree),
 *              corr = exp(m_old - m_new) if the tile raised m, else 1 (x * 1 == x exactly).
 *   acc[d]    = acc[d] * corr, then acc[d] = fma(w(j), v_j[d], acc[d]) for its positions j in
 *              increasing order — positions it does not attend to are skipped, not multiplied
 *              by zero (0 * NaN, -0 + 0 would leak).
 * Per segment (ATTN_SEG positions) the state starts afresh (m = -inf, l = 0, acc = 0) and the
 * segments' states are merged in position order (loom__attn_state_merge); one segment at the
 * start of a context is exactly the single pass above.
 * Which groups, lanes and positions it touches depend only on its own lanes [ia, ib]; the
 * other vectors of a block only widen the span of scores computed (and ignored) and decide
 * whether an update goes through the unguarded loop or the guarded one — same operation.
 * Nor does the vector width: fma chains run one per lane, and the reductions (max, sum) are
 * always over 8-lane groups, so AVX-512, AVX2 and plain-C builds give the same bits. */
#include "backend/cpu/cpu_attention_tile.h"

#include "backend/cpu/cpu_attention_exp.h"
#include "backend/cpu/cpu_attention_lanes.h"
#include "backend/cpu/cpu_internal.h"
#include "tensor/types.h"

#include <math.h>
#include <stdbool.h>
#include <string.h>

/* Kernels take their block shape as constants so the accumulators stay in registers. */
#define ATTN_INLINE static inline __attribute__((always_inline))

_Static_assert(ATTN_TILE % LW_N == 0, "a tile is whole groups of the widest lanes");

/* ------------------------------------------------------------------------------------------ */
/* Loading a tile                                                                             */
/* ------------------------------------------------------------------------------------------ */

/* How a pool's elements widen to float: the kernels below take it as a constant, so each kind
 * gets its own copy of the loops. The N kinds are the pages of merged pairs: directions, each
 * row multiplied by its norm. */
typedef enum tile_kind {
    TK_F32,
    TK_F16,
    TK_BF16,
    TK_E4M3,
    TK_E5M2,
    TK_F32N,
    TK_F16N,
    TK_BF16N
} tile_kind;

static tile_kind kind_of(loom_type t, bool merged) {
    switch (t) {
    case LOOM_TYPE_F16:
        return merged ? TK_F16N : TK_F16;
    case LOOM_TYPE_BF16:
        return merged ? TK_BF16N : TK_BF16;
    case LOOM_TYPE_FP8_E4M3:
        return TK_E4M3;
    case LOOM_TYPE_FP8_E5M2:
        return TK_E5M2;
    default:
        return merged ? TK_F32N : TK_F32;
    }
}

static size_t kind_bytes(tile_kind k) {
    return k == TK_F32 || k == TK_F32N    ? sizeof(float)
           : k == TK_E4M3 || k == TK_E5M2 ? 1
                                          : sizeof(uint16_t);
}

/* The merge block of position j's block. */
static const char *tile_merge_block(const attn_kv_src *src, int64_t j) {
    const loom_kv_desc *kv = src->kv;
    const int32_t block = kv->block_ids[kv->indptr[src->seq] + j / kv->block_size];
    return src->merge + (size_t)block * kv->merge_block_stride;
}

/* Start of the K or V row of position j: in pool, or for the later layer of a merged pair its
 * retained row where the token kept one. */
static const char *tile_row(const attn_kv_src *src, const char *pool, int64_t j) {
    const loom_kv_desc *kv = src->kv;
    const size_t elt = kind_bytes(kind_of(kv->kv_type, false));
    const size_t head = (size_t)src->kvh * kv->head_dim * elt;
    if (src->merge_role == 2) {
        const char *mb = tile_merge_block(src, j);
        int32_t r;
        memcpy(&r,
               mb + loom_kv_merge_state_at(kv->block_size, kv->n_kv_heads) +
                   (size_t)(j % kv->block_size) * sizeof r,
               sizeof r);
        if (r >= 0 && r < kv->merge_retain) {
            const size_t row = (size_t)kv->n_kv_heads * kv->head_dim * elt;
            return mb + loom_kv_merge_rows_at(kv->block_size, kv->n_kv_heads) +
                   ((size_t)r * 2 + (pool == src->v_pool)) * row + head;
        }
    }
    return pool + loom__cpu_kv_slot(kv, src->seq, j) + head;
}

/* What a row's widened elements are multiplied by: FP8 its scale (E4M3's times 2^8, see
 * lv_fp8_half_bits); a merged pair's direction the layer's norm; 1 for the others, whose loads
 * are exact already (and never multiplied). */
static float tile_scale(const attn_kv_src *src, bool is_v, int64_t j, tile_kind k) {
    const loom_kv_desc *kv = src->kv;
    float s;
    if (k == TK_F32N || k == TK_F16N || k == TK_BF16N) {
        const int which = (src->merge_role == 2 ? 2 : 0) + is_v;
        memcpy(&s,
               tile_merge_block(src, j) +
                   (((size_t)(j % kv->block_size) * kv->n_kv_heads + (size_t)src->kvh) * 4 +
                    (size_t)which) *
                       sizeof(float),
               sizeof s);
        return s;
    }
    if (k != TK_E4M3 && k != TK_E5M2) return 1.0f;
    const int32_t block = kv->block_ids[kv->indptr[src->seq] + j / kv->block_size];
    memcpy(&s,
           (is_v ? src->v_scale : src->k_scale) + (size_t)block * kv->scale_block_stride +
               (size_t)(j % kv->block_size) * kv->scale_token_stride +
               (size_t)src->kvh * sizeof(float),
           sizeof s);
    return k == TK_E4M3 ? s * 256.0f : s;
}

ATTN_INLINE lv8 tile_load8(const char *row, int64_t d, tile_kind k, float scale) {
    if (row == NULL) return lv_zero();
    switch (k) {
    case TK_F16:
        return lv_load_f16((const uint16_t *)row + d);
    case TK_BF16:
        return lv_load_bf16((const uint16_t *)row + d);
    case TK_E4M3:
        return lv_mul(lv_load_fp8((const uint8_t *)row + d, true), lv_set1(scale));
    case TK_E5M2:
        return lv_mul(lv_load_fp8((const uint8_t *)row + d, false), lv_set1(scale));
    case TK_F16N:
        return lv_mul(lv_load_f16((const uint16_t *)row + d), lv_set1(scale));
    case TK_BF16N:
        return lv_mul(lv_load_bf16((const uint16_t *)row + d), lv_set1(scale));
    case TK_F32N:
        return lv_mul(lv_load((const float *)row + d), lv_set1(scale));
    default:
        return lv_load((const float *)row + d);
    }
}

ATTN_INLINE float tile_load1(const char *row, int64_t d, tile_kind k, float scale) {
    if (row == NULL) return 0.0f;
    switch (k) {
    case TK_F16:
        return loom__f16_to_f32(((const uint16_t *)row)[d]);
    case TK_BF16:
        return loom__bf16_to_f32(((const uint16_t *)row)[d]);
    case TK_E4M3:
    case TK_E5M2:
        return loom__f16_to_f32(lv_fp8_half_bits(((const uint8_t *)row)[d], k == TK_E4M3)) * scale;
    case TK_F16N:
        return loom__f16_to_f32(((const uint16_t *)row)[d]) * scale;
    case TK_BF16N:
        return loom__bf16_to_f32(((const uint16_t *)row)[d]) * scale;
    case TK_F32N:
        return ((const float *)row)[d] * scale;
    default:
        return ((const float *)row)[d];
    }
}

/* K of lanes 8h .. 8h+7 into kt[d][..] (kt: one group of LW_N positions, [hd][LW_N]), by 8x8
 * transposes; lanes outside [ia, ib] are zero. */
ATTN_INLINE void tile_load_k8(const attn_kv_tile *t, const attn_kv_src *src, int lane0, float *kt,
                              tile_kind k) {
    const int64_t hd = src->kv->head_dim;
    const char *row[LV_N];
    float scale[LV_N];
    for (int i = 0; i < LV_N; i++) {
        const int lane = lane0 + i;
        const bool in = lane >= t->ia && lane <= t->ib;
        row[i] = in ? tile_row(src, src->k_pool, t->j0 + lane) : NULL;
        scale[i] = in ? tile_scale(src, false, t->j0 + lane, k) : 0.0f;
    }
    int64_t d = 0;
    for (; d + LV_N <= hd; d += LV_N) {
        lv8 r[LV_N];
        for (int i = 0; i < LV_N; i++) r[i] = tile_load8(row[i], d, k, scale[i]);
        lv_transpose8(r); /* r[i] = element d+i of the eight rows */
        for (int i = 0; i < LV_N; i++) lv_store(kt + (size_t)(d + i) * LW_N, r[i]);
    }
    for (; d < hd; d++)
        for (int i = 0; i < LV_N; i++)
            kt[(size_t)d * LW_N + i] = tile_load1(row[i], d, k, scale[i]);
}

/* K group g (lanes g*LW_N .. +LW_N-1) into kt[g][d][lane]. */
ATTN_INLINE void tile_load_k_group(attn_kv_tile *t, const attn_kv_src *src, int g, tile_kind k) {
    float *dst = t->kt + (size_t)g * (size_t)src->kv->head_dim * LW_N;
    for (int h = 0; h < LW_N / LV_N; h++)
        tile_load_k8(t, src, g * LW_N + h * LV_N, dst + h * LV_N, k);
}

ATTN_INLINE void tile_load_v(attn_kv_tile *t, const attn_kv_src *src, tile_kind k) {
    const int64_t hd = src->kv->head_dim;
    for (int i = t->ia; i <= t->ib; i++) {
        const char *row = tile_row(src, src->v_pool, t->j0 + i);
        if (k == TK_F32) {
            t->v[i] = (const float *)row; /* read in place */
            continue;
        }
        const float scale = tile_scale(src, true, t->j0 + i, k);
        float *dst = t->vbuf + (size_t)i * (size_t)hd;
        int64_t d = 0;
        for (; d + LV_N <= hd; d += LV_N) lv_store(dst + d, tile_load8(row, d, k, scale));
        for (; d < hd; d++) dst[d] = tile_load1(row, d, k, scale);
        t->v[i] = dst;
    }
}

/* One tile of one kind: K group by group, then V. */
ATTN_INLINE void tile_load_kind(attn_kv_tile *t, const attn_kv_src *src, tile_kind k) {
    for (int g = t->ia / LW_N; g <= t->ib / LW_N; g++) tile_load_k_group(t, src, g, k);
    tile_load_v(t, src, k);
}

void loom__attn_tile_load(attn_kv_tile *t, const attn_kv_src *src, int64_t j0, int ia, int ib) {
    t->j0 = j0;
    t->ia = ia;
    t->ib = ib;
    switch (kind_of(src->kv->kv_type, src->merge_role != 0)) {
    case TK_F16:
        tile_load_kind(t, src, TK_F16);
        break;
    case TK_F16N:
        tile_load_kind(t, src, TK_F16N);
        break;
    case TK_BF16N:
        tile_load_kind(t, src, TK_BF16N);
        break;
    case TK_F32N:
        tile_load_kind(t, src, TK_F32N);
        break;
    case TK_BF16:
        tile_load_kind(t, src, TK_BF16);
        break;
    case TK_E4M3:
        tile_load_kind(t, src, TK_E4M3);
        break;
    case TK_E5M2:
        tile_load_kind(t, src, TK_E5M2);
        break;
    default:
        tile_load_kind(t, src, TK_F32);
        break;
    }
}

void loom__attn_tile_prefetch(const attn_kv_src *src, int64_t j0, int ia, int ib) {
    const loom_kv_desc *kv = src->kv;
    const size_t row = (size_t)kv->head_dim * kind_bytes(kind_of(kv->kv_type, false));
    for (int i = ia; i <= ib; i++) {
        const uintptr_t k = (uintptr_t)tile_row(src, src->k_pool, j0 + i);
        const uintptr_t v = (uintptr_t)tile_row(src, src->v_pool, j0 + i);
        for (uintptr_t off = 0; off < row + (k & 63); off += 64)
            __builtin_prefetch((const char *)((k & ~(uintptr_t)63) + off), 0, 2);
        for (uintptr_t off = 0; off < row + (v & 63); off += 64)
            __builtin_prefetch((const char *)((v & ~(uintptr_t)63) + off), 0, 2);
    }
}

/* ------------------------------------------------------------------------------------------ */
/* Scores                                                                                     */
/* ------------------------------------------------------------------------------------------ */

/* Queries per register block: every one of a block's K (or V) loads feeds this many fmas. */
#define REG_Q (LW_REGS >= 32 ? 8 : 4)
_Static_assert(REG_Q <= ATTN_QBLOCK, "a register block lies within an advance block");

/* Vectors per pass across positions (QK) or head_dim (PV) for nq queries: nq of them per
 * vector in accumulators, plus the loads and a broadcast, must fit the registers. */
#define REG_SPAN(nq) ((nq)*4 + 6 <= LW_REGS ? 4 : (nq)*2 + 4 <= LW_REGS ? 2 : 1)

/* Raw dot products of nq queries with the positions of groups g .. g+ng-1 (LW_N positions
 * each): nq * ng vectors of independent fma chains. */
ATTN_INLINE void qk_kernel(int nq, int ng, const float *kt, int64_t hd, const float *qt, float *s,
                           int g) {
    lw acc[REG_Q][4];
    for (int k = 0; k < nq; k++)
        for (int x = 0; x < ng; x++) acc[k][x] = lw_set1(0.0f);
    const float *k0 = kt + (size_t)g * (size_t)hd * LW_N;
    for (int64_t d = 0; d < hd; d++) {
        lw kk[4];
        for (int x = 0; x < ng; x++)
            kk[x] = lw_load(k0 + ((size_t)x * (size_t)hd + (size_t)d) * LW_N);
        for (int k = 0; k < nq; k++) {
            const lw qb = lw_set1(qt[d * ATTN_QBLOCK + k]);
            for (int x = 0; x < ng; x++) acc[k][x] = lw_fma(qb, kk[x], acc[k][x]);
        }
    }
    for (int k = 0; k < nq; k++)
        for (int x = 0; x < ng; x++) lw_store(s + k * ATTN_TILE + (g + x) * LW_N, acc[k][x]);
}

ATTN_INLINE void qk_groups(int nq, const float *kt, int64_t hd, const float *q, float *s, int g0,
                           int g1) {
    int g = g0;
    if (REG_SPAN(nq) >= 4)
        for (; g + 3 <= g1; g += 4) qk_kernel(nq, 4, kt, hd, q, s, g);
    if (REG_SPAN(nq) >= 2)
        for (; g + 1 <= g1; g += 2) qk_kernel(nq, 2, kt, hd, q, s, g);
    for (; g <= g1; g++) qk_kernel(nq, 1, kt, hd, q, s, g);
}

/* Scores of n queries (q packed as loom__attn_pack_q leaves them; scores[k][...]) for groups
 * g0 .. g1, REG_Q queries at a time. */
static void qk_run(int n, const float *kt, int64_t hd, const float *q, float *s, int g0, int g1) {
    for (int k = 0; k < n; k += REG_Q) {
        const float *qk = q + k;
        float *sk = s + k * ATTN_TILE;
        switch (n - k < REG_Q ? n - k : REG_Q) {
        case 1:
            qk_groups(1, kt, hd, qk, sk, g0, g1);
            break;
        case 2:
            qk_groups(2, kt, hd, qk, sk, g0, g1);
            break;
        case 3:
            qk_groups(3, kt, hd, qk, sk, g0, g1);
            break;
#if REG_Q > 4
        case 4:
            qk_groups(4, kt, hd, qk, sk, g0, g1);
            break;
        case 5:
            qk_groups(5, kt, hd, qk, sk, g0, g1);
            break;
        case 6:
            qk_groups(6, kt, hd, qk, sk, g0, g1);
            break;
        case 7:
            qk_groups(7, kt, hd, qk, sk, g0, g1);
            break;
#endif
        default:
            qk_groups(REG_Q, kt, hd, qk, sk, g0, g1);
            break;
        }
    }
}

/* ------------------------------------------------------------------------------------------ */
/* Softmax over the tile                                                                      */
/* ------------------------------------------------------------------------------------------ */

/* Turns v's raw scores s[ia..ib] into weights (in place) and updates v->m and v->l. Returns
 * the factor acc must be scaled by, and false (with nothing changed) when every score is -inf:
 * then the tile adds nothing. */
static bool softmax_tile(attn_qvec *v, float *s, float scale, float softcap, float *corr) {
    const int a = v->ia, b = v->ib, g0 = a / LV_N, g1 = b / LV_N;
    if (softcap > 0.0f)
        for (int i = a; i <= b; i++) s[i] = softcap * tanhf(s[i] * scale / softcap);
    lv8 mx = lv_set1(-INFINITY);
    for (int g = g0; g <= g1; g++) {
        lv8 x = lv_load(s + g * LV_N);
        if (!(softcap > 0.0f)) x = lv_mul(x, lv_set1(scale));
        x = lv_keep_range(x, a - g * LV_N, b - g * LV_N, -INFINITY);
        lv_store(s + g * LV_N, x);
        mx = lv_max(mx, x);
    }
    const float tile_max = lv_hmax(mx);
    if (tile_max == -INFINITY) return false;
    *corr = 1.0f;
    if (tile_max > v->m) {
        *corr = lv_exp1(v->m - tile_max); /* 0 on the first tile (m = -inf) */
        v->m = tile_max;
    }
    const lv8 m = lv_set1(v->m);
    lv8 sum = lv_zero();
    for (int g = g0; g <= g1; g++) {
        lv8 w = lv_exp(lv_sub(lv_load(s + g * LV_N), m));
        lv_store(s + g * LV_N, w);
        sum = lv_add(sum, w);
    }
    v->l = v->l * *corr + lv_hsum(sum);
    return true;
}

/* ------------------------------------------------------------------------------------------ */
/* Weighted sum of V                                                                          */
/* ------------------------------------------------------------------------------------------ */

/* The query vectors of one PV pass (at most REG_Q of them): only those with a weight in the
 * tile. */
typedef struct pv_set {
    int n;
    float *acc[ATTN_QBLOCK];
    const float *w[ATTN_QBLOCK]; /* [ATTN_TILE] weights */
    float corr[ATTN_QBLOCK];
    int ia[ATTN_QBLOCK], ib[ATTN_QBLOCK];
} pv_set;

/* One position j of V into the accumulators; guarded: only the vectors whose range holds j. */
ATTN_INLINE void pv_step(int nq, int nd, bool guarded, lw a[REG_Q][4], const attn_kv_tile *t,
                         const pv_set *p, int64_t d, int j) {
    lw vv[4];
    for (int x = 0; x < nd; x++) vv[x] = lw_load(t->v[j] + d + x * LW_N);
    for (int k = 0; k < nq; k++) {
        if (guarded && (j < p->ia[k] || j > p->ib[k])) continue;
        const lw w = lw_set1(p->w[k][j]);
        for (int x = 0; x < nd; x++) a[k][x] = lw_fma(w, vv[x], a[k][x]);
    }
}

/* acc[k][d .. d + LW_N*nd) of nq vectors over the tile: the positions every vector attends to
 * take the unguarded loop; the few at the ends where only some do are guarded. */
ATTN_INLINE void pv_kernel(int nq, int nd, const attn_kv_tile *t, const pv_set *p, int64_t d) {
    lw a[REG_Q][4];
    int jmin = p->ia[0], jmax = p->ib[0], clo = p->ia[0], chi = p->ib[0];
    for (int k = 0; k < nq; k++) {
        const lw c = lw_set1(p->corr[k]);
        for (int x = 0; x < nd; x++) a[k][x] = lw_mul(lw_load(p->acc[k] + d + x * LW_N), c);
        jmin = p->ia[k] < jmin ? p->ia[k] : jmin;
        clo = p->ia[k] > clo ? p->ia[k] : clo;
        jmax = p->ib[k] > jmax ? p->ib[k] : jmax;
        chi = p->ib[k] < chi ? p->ib[k] : chi;
    }
    if (clo > chi) { /* no position common to all */
        for (int j = jmin; j <= jmax; j++) pv_step(nq, nd, true, a, t, p, d, j);
    } else {
        for (int j = jmin; j < clo; j++) pv_step(nq, nd, true, a, t, p, d, j);
        for (int j = clo; j <= chi; j++) pv_step(nq, nd, false, a, t, p, d, j);
        for (int j = chi + 1; j <= jmax; j++) pv_step(nq, nd, true, a, t, p, d, j);
    }
    for (int k = 0; k < nq; k++)
        for (int x = 0; x < nd; x++) lw_store(p->acc[k] + d + x * LW_N, a[k][x]);
}

/* The same for one element d (past the last whole vector). */
static void pv_scalar(const attn_kv_tile *t, const pv_set *p, int64_t d) {
    for (int k = 0; k < p->n; k++) {
        float a = p->acc[k][d] * p->corr[k];
        for (int j = p->ia[k]; j <= p->ib[k]; j++) a = fmaf(p->w[k][j], t->v[j][d], a);
        p->acc[k][d] = a;
    }
}

ATTN_INLINE void pv_all(int nq, const attn_kv_tile *t, const pv_set *p, int64_t hd) {
    const int nd = REG_SPAN(nq);
    int64_t d = 0;
    if (nd >= 4)
        for (; d + 4 * LW_N <= hd; d += 4 * LW_N) pv_kernel(nq, 4, t, p, d);
    if (nd >= 2)
        for (; d + 2 * LW_N <= hd; d += 2 * LW_N) pv_kernel(nq, 2, t, p, d);
    for (; d + LW_N <= hd; d += LW_N) pv_kernel(nq, 1, t, p, d);
    for (; d < hd; d++) pv_scalar(t, p, d);
}

static void pv_run(const attn_kv_tile *t, const pv_set *p, int64_t hd) {
    switch (p->n) {
    case 0:
        break;
    case 1:
        pv_all(1, t, p, hd);
        break;
    case 2:
        pv_all(2, t, p, hd);
        break;
    case 3:
        pv_all(3, t, p, hd);
        break;
#if REG_Q > 4
    case 4:
        pv_all(4, t, p, hd);
        break;
    case 5:
        pv_all(5, t, p, hd);
        break;
    case 6:
        pv_all(6, t, p, hd);
        break;
    case 7:
        pv_all(7, t, p, hd);
        break;
#endif
    default:
        pv_all(REG_Q, t, p, hd);
        break;
    }
}

/* ------------------------------------------------------------------------------------------ */
/* A block of query vectors over one tile                                                     */
/* ------------------------------------------------------------------------------------------ */

void loom__attn_pack_q(const attn_qvec *qv, int n, int64_t hd, float *qt) {
    _Static_assert(ATTN_QBLOCK == LV_N, "q is packed by 8x8 transposes");
    int64_t d = 0;
    for (; d + LV_N <= hd; d += LV_N) {
        lv8 r[LV_N];
        for (int k = 0; k < LV_N; k++) r[k] = k < n ? lv_load(qv[k].q + d) : lv_zero();
        lv_transpose8(r); /* r[i] = element d+i of the eight queries */
        for (int i = 0; i < LV_N; i++) lv_store(qt + (d + i) * ATTN_QBLOCK, r[i]);
    }
    for (; d < hd; d++)
        for (int k = 0; k < ATTN_QBLOCK; k++) qt[d * ATTN_QBLOCK + k] = k < n ? qv[k].q[d] : 0.0f;
}

void loom__attn_tile_advance(const attn_kv_tile *t, int64_t hd, float scale, float softcap,
                             attn_qvec *qv, int n, const float *qt, float *scores) {
    int lo = ATTN_TILE, hi = -1;
    for (int k = 0; k < n; k++) {
        if (qv[k].ia > qv[k].ib) continue;
        lo = qv[k].ia < lo ? qv[k].ia : lo;
        hi = qv[k].ib > hi ? qv[k].ib : hi;
    }
    if (hi < 0) return;
    /* Scores for the union of the ranges; each vector then reads only its own lanes. */
    qk_run(n, t->kt, hd, qt, scores, lo / LW_N, hi / LW_N);
    pv_set p = {.n = 0};
    for (int k = 0; k < n; k++) {
        float *s = scores + k * ATTN_TILE;
        if (qv[k].ia > qv[k].ib || !softmax_tile(&qv[k], s, scale, softcap, &p.corr[p.n])) continue;
        p.acc[p.n] = qv[k].acc;
        p.w[p.n] = s;
        p.ia[p.n] = qv[k].ia;
        p.ib[p.n] = qv[k].ib;
        if (++p.n == REG_Q) {
            pv_run(t, &p, hd);
            p.n = 0;
        }
    }
    pv_run(t, &p, hd);
}

void loom__attn_state_merge(float *m, float *l, float *acc, float mb, float lb, const float *accb,
                            int64_t hd) {
    if (mb == -INFINITY) return; /* the later positions added nothing */
    if (*m == -INFINITY) {       /* nor did the earlier ones */
        *m = mb;
        *l = lb;
        for (int64_t d = 0; d < hd; d++) acc[d] = accb[d];
        return;
    }
    float ca = 1.0f, cb = 1.0f;
    if (mb > *m) {
        ca = lv_exp1(*m - mb);
        *m = mb;
    } else {
        cb = lv_exp1(mb - *m);
    }
    /* Explicit fmas: the rounding is fixed here, not left to the compiler's contraction. */
    *l = fmaf(lb, cb, *l * ca);
    for (int64_t d = 0; d < hd; d++) acc[d] = fmaf(accb[d], cb, acc[d] * ca);
}
