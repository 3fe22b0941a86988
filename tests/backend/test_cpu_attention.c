/* test_cpu_attention.c — kv_store and paged attention of the CPU backend.
 *
 * Ragged batches of several sequences of different lengths (54, 97, 17, 1 ...), some with
 * history already in the cache, block sizes 1, 8 and 16, GQA 4:1 and MHA, window 0 and 5,
 * F16, BF16, F32, FP8 E4M3 and E5M2 pools (FP8 with per-(position, head) scales in pools of their
 * own), soft-capping. Block tables are random permutations of the pool, so
 * sequences' blocks interleave. Pools start poisoned with NaN, so any read of a slot that was
 * never written (past kv_len, or a block not in the table) shows up as NaN in the output.
 *
 * Checked: the pools hold exactly the converted K/V rows (FP8: each head's scale is max|x| / the
 * format's largest value and its codes those of x / scale); attention matches a double-precision
 * reference over the values as stored (dequantized) within 2e-5 (absolute; values are O(1)), and
 * for BF16 and FP8 pools it is bitwise attention over an F32 pool holding the dequantized values; a
 * sequence's rows are bitwise the same alone as in the batch, and a row computed as a one-token
 * decode step is bitwise the row of the prefill; a prefill fed in chunks (1, 5, 64, 65 ... rows,
 * the sequences of the batch at different offsets, window-released blocks marked -1) gives every
 * row bitwise as the one-call batch; 1, 2 and 3 threads bitwise; what the ops themselves refuse (a
 * cache type, layout or layer they cannot use, shapes, parameters) gives the right status — the
 * contents of a descriptor are checked once per step by loom__kv_desc_check
 * (tests/kv/test_kv_desc.c). Gemma-like shapes (head_dim 256, 4 query heads on 1 kv head, windows
 * crossing the kernel's 64-position tiles) and odd ones (head_dim 20, 40, 72; 3 heads per kv head);
 * contexts past several 256-position segments, whose decode rows spread over the threads. The
 * softmax exp is checked on its own against libm. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "backend/cpu/cpu_attention_exp.h"
#include "backend/cpu/cpu_internal.h"
#include "backend/cpu_test_util.h"
#include "kv/kv_desc.h"
#include "tensor/fp8.h"
#include "tensor/quant.h"

#define MAX_SEQS 8

/* A third backend, so a thread count that divides nothing evenly is covered too. */
static loom__backend_stream g_be3_store;
static loom__backend_stream *g_be3 = &g_be3_store;

typedef struct scen {
    int n_seqs;
    int32_t past[MAX_SEQS];  /* positions already cached before the step */
    int32_t n_new[MAX_SEQS]; /* new rows in the step */
    int32_t block_size, n_kv_heads, head_dim, n_head, window;
    float scale, softcap;
    loom_type kv_type;
    bool rotate; /* LOOM_KV_HADAMARD */
} scen;

typedef struct kvtest {
    scen sc;
    int32_t n_blocks, kv_dim, max_len;
    int32_t indptr[MAX_SEQS + 1];
    int32_t *block_ids;
    /* the history store and the step */
    int32_t hist_q[MAX_SEQS + 1], hist_pos[MAX_SEQS], hist_len[MAX_SEQS];
    int32_t step_q[MAX_SEQS + 1], step_pos[MAX_SEQS], step_len[MAX_SEQS];
    size_t elt, token_stride, block_stride, pool_bytes;
    void *k_pool[2], *v_pool[2];   /* two layers; the scenario uses layer 1 */
    void *k_scale[2], *v_scale[2]; /* FP8: [n_blocks][block_size][scale slot]; else NULL */
    size_t scale_token_stride, scale_block_stride, scale_bytes;
    int32_t layer_src[2];
    float *k_val, *v_val; /* [n_seqs][max_len][kv_dim] values as stored (rounded for f16) */
    float *k_raw, *v_raw; /* the same before rounding */
    float *q;             /* [T, n_head*head_dim] step queries */
    int64_t T, T_hist;
} kvtest;

static bool is_fp8(loom_type t) {
    return t == LOOM_TYPE_FP8_E4M3 || t == LOOM_TYPE_FP8_E5M2;
}

static void poison_pool(void *pool, size_t bytes, loom_type t) {
    if (t == LOOM_TYPE_F32) {
        poison(pool, bytes / 4);
    } else if (is_fp8(t)) {
        memset(pool, 0x7f, bytes); /* FP8 codes; the NaN scales make unwritten slots NaN */
    } else {
        uint16_t *h = pool;
        for (size_t i = 0; i < bytes / 2; i++) h[i] = t == LOOM_TYPE_BF16 ? 0x7fc0 : 0x7e00;
    }
}

/* The format's largest finite value (the scale maps each row's max|x| to it). */
static float fp8_max(loom_type t) {
    return t == LOOM_TYPE_FP8_E4M3 ? 448.0f : 57344.0f;
}

static uint8_t fp8_encode(loom_type t, float x) {
    return t == LOOM_TYPE_FP8_E4M3 ? loom__f32_to_fp8_e4m3(x) : loom__f32_to_fp8_e5m2(x);
}

static float fp8_decode(loom_type t, uint8_t c) {
    return t == LOOM_TYPE_FP8_E4M3 ? loom__fp8_e4m3_to_f32(c) : loom__fp8_e5m2_to_f32(c);
}

/* The scale of one head's row as the store must compute it. */
static float head_scale(loom_type t, const float *x, int32_t n) {
    float amax = 0;
    for (int32_t i = 0; i < n; i++) amax = fabsf(x[i]) > amax ? fabsf(x[i]) : amax;
    return amax / fp8_max(t);
}

/* raw[n_rows][kv_dim] as the pool gives it back: rounded (F16, BF16) or quantized and
 * dequantized per head (FP8: code * scale, in float). */
static void stored_values(const scen *sc, const float *raw, float *val, size_t n_rows) {
    const int32_t hd = sc->head_dim, kv_dim = sc->n_kv_heads * hd;
    for (size_t r = 0; r < n_rows; r++) {
        for (int32_t h = 0; h < sc->n_kv_heads; h++) {
            const float *x = raw + r * (size_t)kv_dim + (size_t)h * hd;
            float *y = val + r * (size_t)kv_dim + (size_t)h * hd;
            const float sc8 = is_fp8(sc->kv_type) ? head_scale(sc->kv_type, x, hd) : 0;
            for (int32_t e = 0; e < hd; e++) {
                switch (sc->kv_type) {
                case LOOM_TYPE_F16:
                    y[e] = loom__f16_to_f32(loom__f32_to_f16(x[e]));
                    break;
                case LOOM_TYPE_BF16:
                    y[e] = loom__bf16_to_f32(loom__f32_to_bf16(x[e]));
                    break;
                case LOOM_TYPE_FP8_E4M3:
                case LOOM_TYPE_FP8_E5M2:
                    y[e] = fp8_decode(sc->kv_type, fp8_encode(sc->kv_type, x[e] / sc8)) * sc8;
                    break;
                default:
                    y[e] = x[e];
                    break;
                }
            }
        }
    }
}

static void kvtest_init(kvtest *kt, const scen *sc) {
    memset(kt, 0, sizeof *kt);
    kt->sc = *sc;
    kt->kv_dim = sc->n_kv_heads * sc->head_dim;
    kt->elt = loom__kv_elt_bytes(sc->kv_type);
    kt->token_stride = (size_t)kt->kv_dim * kt->elt + 2 * kt->elt; /* padded slots */
    kt->block_stride = (size_t)sc->block_size * kt->token_stride;
    kt->scale_token_stride = (size_t)(sc->n_kv_heads + 1) * sizeof(float); /* padded too */
    kt->scale_block_stride = (size_t)sc->block_size * kt->scale_token_stride + sizeof(float);
    int32_t total_blocks = 0;
    for (int s = 0; s < sc->n_seqs; s++) {
        int32_t len = sc->past[s] + sc->n_new[s];
        kt->max_len = len > kt->max_len ? len : kt->max_len;
        int32_t nb = (len + sc->block_size - 1) / sc->block_size + (s % 2); /* odd: spare */
        kt->indptr[s + 1] = kt->indptr[s] + nb;
        total_blocks += nb;
        kt->hist_q[s + 1] = kt->hist_q[s] + sc->past[s];
        kt->hist_pos[s] = 0;
        kt->hist_len[s] = sc->past[s];
        kt->step_q[s + 1] = kt->step_q[s] + sc->n_new[s];
        kt->step_pos[s] = sc->past[s];
        kt->step_len[s] = len;
    }
    kt->T = kt->step_q[sc->n_seqs];
    kt->T_hist = kt->hist_q[sc->n_seqs];
    kt->n_blocks = total_blocks + 3; /* blocks no sequence owns stay NaN */
    /* Block ids: a random permutation of the pool. */
    int32_t *perm = malloc(sizeof(int32_t) * (size_t)kt->n_blocks);
    for (int32_t i = 0; i < kt->n_blocks; i++) perm[i] = i;
    for (int32_t i = kt->n_blocks - 1; i > 0; i--) {
        int32_t j = (int32_t)(rng_u64() % (uint64_t)(i + 1)), tmp = perm[i];
        perm[i] = perm[j];
        perm[j] = tmp;
    }
    kt->block_ids = perm; /* the first total_blocks entries are used */
    kt->pool_bytes = (size_t)kt->n_blocks * kt->block_stride;
    for (int l = 0; l < 2; l++) {
        kt->k_pool[l] = aligned_alloc(64, (kt->pool_bytes + 63) / 64 * 64);
        kt->v_pool[l] = aligned_alloc(64, (kt->pool_bytes + 63) / 64 * 64);
        poison_pool(kt->k_pool[l], kt->pool_bytes, sc->kv_type);
        poison_pool(kt->v_pool[l], kt->pool_bytes, sc->kv_type);
        kt->layer_src[l] = l;
        if (is_fp8(sc->kv_type)) {
            kt->scale_bytes = (size_t)kt->n_blocks * kt->scale_block_stride;
            kt->k_scale[l] = falloc(kt->scale_bytes / sizeof(float));
            kt->v_scale[l] = falloc(kt->scale_bytes / sizeof(float));
            poison(kt->k_scale[l], kt->scale_bytes / sizeof(float));
            poison(kt->v_scale[l], kt->scale_bytes / sizeof(float));
        }
    }
    size_t nv = (size_t)sc->n_seqs * (size_t)kt->max_len * (size_t)kt->kv_dim;
    kt->k_raw = falloc(nv);
    kt->v_raw = falloc(nv);
    kt->k_val = falloc(nv);
    kt->v_val = falloc(nv);
    fill_rand(kt->k_raw, nv, 1.0f);
    fill_rand(kt->v_raw, nv, 1.0f);
    if (sc->rotate) {
        /* The pages hold H x as stored; attention sees H (stored H x), H its own inverse. */
        for (int kv = 0; kv < 2; kv++) {
            float *tmp = falloc(nv);
            memcpy(tmp, kv ? kt->v_raw : kt->k_raw, nv * sizeof(float));
            for (size_t r = 0; r < nv / (size_t)sc->head_dim; r++)
                loom__cpu_hadamard(tmp + r * (size_t)sc->head_dim, sc->head_dim);
            float *val = kv ? kt->v_val : kt->k_val;
            stored_values(sc, tmp, val, nv / (size_t)kt->kv_dim);
            for (size_t r = 0; r < nv / (size_t)sc->head_dim; r++)
                loom__cpu_hadamard(val + r * (size_t)sc->head_dim, sc->head_dim);
            free(tmp);
        }
    } else {
        stored_values(sc, kt->k_raw, kt->k_val, nv / (size_t)kt->kv_dim);
        stored_values(sc, kt->v_raw, kt->v_val, nv / (size_t)kt->kv_dim);
    }
    size_t nq = (size_t)kt->T * (size_t)(sc->n_head * sc->head_dim);
    kt->q = falloc(nq ? nq : 1);
    fill_rand(kt->q, nq, 1.0f);
}

static void kvtest_free(kvtest *kt) {
    for (int l = 0; l < 2; l++) {
        free(kt->k_pool[l]);
        free(kt->v_pool[l]);
        free(kt->k_scale[l]);
        free(kt->v_scale[l]);
    }
    free(kt->block_ids);
    free(kt->k_raw);
    free(kt->v_raw);
    free(kt->k_val);
    free(kt->v_val);
    free(kt->q);
}

static loom_kv_desc kvtest_desc(kvtest *kt, const int32_t *q_start, const int32_t *pos_start,
                                const int32_t *kv_len) {
    loom_kv_desc d = {
        .n_seqs = kt->sc.n_seqs,
        .indptr = kt->indptr,
        .block_ids = kt->block_ids,
        .q_start = q_start,
        .pos_start = pos_start,
        .kv_len = kv_len,
        .block_size = kt->sc.block_size,
        .n_blocks = kt->n_blocks,
        .n_kv_heads = kt->sc.n_kv_heads,
        .head_dim = kt->sc.head_dim,
        .window = kt->sc.window,
        .kv_type = kt->sc.kv_type,
        .layout = LOOM_KV_LAYOUT_NHD,
        .token_stride = kt->token_stride,
        .block_stride = kt->block_stride,
        .n_layers = 2,
        .k_base = kt->k_pool,
        .v_base = kt->v_pool,
        .layer_src = NULL,
        .scale_kind = is_fp8(kt->sc.kv_type) ? LOOM_KV_SCALE_PER_TOKEN_HEAD : LOOM_KV_SCALE_NONE,
        .k_scale = is_fp8(kt->sc.kv_type) ? kt->k_scale : NULL,
        .v_scale = is_fp8(kt->sc.kv_type) ? kt->v_scale : NULL,
        .scale_token_stride = kt->scale_token_stride,
        .scale_block_stride = kt->scale_block_stride,
        .kv_flags = kt->sc.rotate ? LOOM_KV_HADAMARD : 0,
    };
    return d;
}

/* Rows [positions from, to) of every sequence, concatenated in batch order. */
static float *gather_rows(const kvtest *kt, const float *src, const int32_t *from,
                          const int32_t *count, int64_t n_rows) {
    float *out = falloc((size_t)(n_rows * kt->kv_dim) + 1);
    int64_t r = 0;
    for (int s = 0; s < kt->sc.n_seqs; s++)
        for (int32_t i = 0; i < count[s]; i++, r++)
            memcpy(out + r * kt->kv_dim,
                   src + ((size_t)s * kt->max_len + (size_t)(from[s] + i)) * kt->kv_dim,
                   sizeof(float) * (size_t)kt->kv_dim);
    return out;
}

/* Stores the history then the step's rows into layer 1 through backend be. */
static void kvtest_store(kvtest *kt, loom__backend_stream *be) {
    int32_t zero[MAX_SEQS] = {0};
    const int32_t *counts[2] = {kt->sc.past, kt->sc.n_new};
    const int32_t *from[2] = {zero, kt->sc.past};
    const int64_t rows[2] = {kt->T_hist, kt->T};
    loom_kv_desc desc[2] = {kvtest_desc(kt, kt->hist_q, kt->hist_pos, kt->hist_len),
                            kvtest_desc(kt, kt->step_q, kt->step_pos, kt->step_len)};
    for (int phase = 0; phase < 2; phase++) {
        float *k = gather_rows(kt, kt->k_raw, from[phase], counts[phase], rows[phase]);
        float *v = gather_rows(kt, kt->v_raw, from[phase], counts[phase], rows[phase]);
        loom_tensor tk =
            loom_tensor_2d(LOOM_TYPE_F32, k, kt->kv_dim, rows[phase], (size_t)kt->kv_dim * 4);
        loom_tensor tv =
            loom_tensor_2d(LOOM_TYPE_F32, v, kt->kv_dim, rows[phase], (size_t)kt->kv_dim * 4);
        assert_int_equal(be->ops->kv_store(be->ctx, &tk, &tv, &desc[phase], 1), LOOM_OK);
        free(k);
        free(v);
    }
}

/* The pools hold exactly the converted rows at every position of every sequence. */
static void kvtest_check_pools(const kvtest *kt) {
    const loom_type t = kt->sc.kv_type;
    const int32_t hd = kt->sc.head_dim;
    for (int s = 0; s < kt->sc.n_seqs; s++) {
        for (int32_t p = 0; p < kt->step_len[s]; p++) {
            int32_t blk = kt->block_ids[kt->indptr[s] + p / kt->sc.block_size];
            size_t off =
                (size_t)blk * kt->block_stride + (size_t)(p % kt->sc.block_size) * kt->token_stride;
            size_t soff = (size_t)blk * kt->scale_block_stride +
                          (size_t)(p % kt->sc.block_size) * kt->scale_token_stride;
            size_t src = ((size_t)s * kt->max_len + (size_t)p) * kt->kv_dim;
            for (int l = 0; l < 2; l++) {
                const float *raw = l == 0 ? kt->k_raw + src : kt->v_raw + src;
                const char *slot = (const char *)(l == 0 ? kt->k_pool[1] : kt->v_pool[1]) + off;
                const char *scales =
                    is_fp8(t) ? (const char *)(l == 0 ? kt->k_scale[1] : kt->v_scale[1]) + soff
                              : NULL;
                for (int32_t e = 0; e < kt->kv_dim; e++) {
                    if (t == LOOM_TYPE_F32) {
                        assert_true(same_bits((const float *)slot + e, raw + e, 1, "kv pool"));
                    } else if (is_fp8(t)) {
                        float want_scale = head_scale(t, raw + e / hd * hd, hd), got_scale;
                        memcpy(&got_scale, scales + (size_t)(e / hd) * sizeof(float), 4);
                        assert_true(same_bits(&got_scale, &want_scale, 1, "fp8 scale"));
                        assert_int_equal((uint8_t)slot[e], fp8_encode(t, raw[e] / want_scale));
                    } else {
                        uint16_t h;
                        memcpy(&h, slot + 2 * e, 2);
                        assert_int_equal(h, t == LOOM_TYPE_BF16 ? loom__f32_to_bf16(raw[e])
                                                                : loom__f32_to_f16(raw[e]));
                    }
                }
            }
        }
    }
}

/* The step's attention over an F32 copy of the pools holding the values as stored (FP8: code *
 * scale), in the same block layout: for BF16 and FP8 pools it must give out bit for bit, since
 * widening a stored element is exactly that value. */
static void check_against_f32_pools(kvtest *kt, const loom_kv_desc *d, const float *want,
                                    int64_t n_out);

static loom_status run_attention(loom__backend_stream *be, kvtest *kt, const loom_kv_desc *d,
                                 const float *q, int64_t T, float *out, int32_t layer) {
    const int64_t W = (int64_t)kt->sc.n_head * kt->sc.head_dim;
    loom_tensor tq = loom_tensor_2d(LOOM_TYPE_F32, (void *)q, W, T, (size_t)W * 4);
    loom_tensor to = loom_tensor_2d(LOOM_TYPE_F32, out, W, T, (size_t)W * 4);
    loom_attn_params p = {
        .n_head = kt->sc.n_head, .layer = layer, .scale = kt->sc.scale, .softcap = kt->sc.softcap};
    return be->ops->attention(be->ctx, &tq, d, &p, &to);
}

static void check_against_f32_pools(kvtest *kt, const loom_kv_desc *d, const float *want,
                                    int64_t n_out) {
    const size_t ts = (size_t)kt->kv_dim * sizeof(float), bs = (size_t)kt->sc.block_size * ts;
    void *k32[2] = {NULL, NULL}, *v32[2] = {NULL, NULL};
    k32[1] = falloc((size_t)kt->n_blocks * bs / sizeof(float));
    v32[1] = falloc((size_t)kt->n_blocks * bs / sizeof(float));
    poison(k32[1], (size_t)kt->n_blocks * bs / sizeof(float));
    poison(v32[1], (size_t)kt->n_blocks * bs / sizeof(float));
    k32[0] = k32[1]; /* layer 0 is not read */
    v32[0] = v32[1];
    for (int s = 0; s < kt->sc.n_seqs; s++)
        for (int32_t p = 0; p < kt->step_len[s]; p++) {
            int32_t blk = kt->block_ids[kt->indptr[s] + p / kt->sc.block_size];
            size_t off = (size_t)blk * bs + (size_t)(p % kt->sc.block_size) * ts;
            size_t src = ((size_t)s * kt->max_len + (size_t)p) * kt->kv_dim;
            memcpy((char *)k32[1] + off, kt->k_val + src, ts);
            memcpy((char *)v32[1] + off, kt->v_val + src, ts);
        }
    loom_kv_desc d32 = *d;
    d32.kv_type = LOOM_TYPE_F32;
    d32.token_stride = ts;
    d32.block_stride = bs;
    d32.k_base = k32;
    d32.v_base = v32;
    d32.scale_kind = LOOM_KV_SCALE_NONE;
    d32.k_scale = d32.v_scale = NULL;
    float *out = falloc((size_t)n_out + 1);
    poison(out, (size_t)n_out);
    assert_int_equal(run_attention(g_be[1], kt, &d32, kt->q, kt->T, out, 1), LOOM_OK);
    assert_true(same_bits(out, want, (size_t)n_out, "attention vs f32 pools of stored values"));
    free(out);
    free(k32[1]);
    free(v32[1]);
}

/* Double-precision reference for every step row. */
static void ref_attention(const kvtest *kt, double *ref) {
    const scen *sc = &kt->sc;
    const int hd = sc->head_dim, group = sc->n_head / sc->n_kv_heads;
    double *w = malloc(sizeof(double) * (size_t)kt->max_len);
    for (int s = 0; s < sc->n_seqs; s++) {
        for (int32_t i = 0; i < sc->n_new[s]; i++) {
            int64_t r = kt->step_q[s] + i;
            int32_t p = sc->past[s] + i;
            int32_t lo = sc->window > 0 && p - sc->window + 1 > 0 ? p - sc->window + 1 : 0;
            for (int h = 0; h < sc->n_head; h++) {
                const float *q = kt->q + (r * sc->n_head + h) * hd;
                int kvh = h / group;
                double m = -INFINITY, sum = 0;
                for (int32_t j = lo; j <= p; j++) {
                    const float *k =
                        kt->k_val + ((size_t)s * kt->max_len + j) * kt->kv_dim + kvh * hd;
                    double d = 0;
                    for (int e = 0; e < hd; e++) d += (double)q[e] * k[e];
                    d *= sc->scale;
                    if (sc->softcap > 0) d = sc->softcap * tanh(d / sc->softcap);
                    w[j] = d;
                    m = d > m ? d : m;
                }
                for (int32_t j = lo; j <= p; j++) sum += (w[j] = exp(w[j] - m));
                double *o = ref + (r * sc->n_head + h) * hd;
                for (int e = 0; e < hd; e++) o[e] = 0;
                for (int32_t j = lo; j <= p; j++) {
                    const float *v =
                        kt->v_val + ((size_t)s * kt->max_len + j) * kt->kv_dim + kvh * hd;
                    for (int e = 0; e < hd; e++) o[e] += w[j] / sum * v[e];
                }
            }
        }
    }
    free(w);
}

/* The step's rows fed as a chunked prefill: each sequence s advances chunk[s] rows per call
 * (all sequences that still have rows in one batch, so they sit at different offsets), the
 * earlier rows' K/V already in the pools as a chunked prefill leaves them. With a window, the
 * block-table entries wholly before the window of a sequence's first row are released (-1), as
 * the KV manager does. Every row must be bitwise the row of the one-call batch `want`. */
static void check_chunked(kvtest *kt, const float *want, const int32_t *chunk,
                          loom__backend_stream *be) {
    const scen *sc = &kt->sc;
    const int64_t W = (int64_t)sc->n_head * sc->head_dim;
    const size_t n_ids = (size_t)kt->indptr[sc->n_seqs];
    int32_t *ids = malloc(sizeof(int32_t) * (n_ids ? n_ids : 1));
    float *q = falloc((size_t)(kt->T * W)), *out = falloc((size_t)(kt->T * W));
    int32_t done[MAX_SEQS] = {0};
    for (;;) {
        int32_t qs[MAX_SEQS + 1] = {0}, pos[MAX_SEQS], len[MAX_SEQS], n[MAX_SEQS];
        memcpy(ids, kt->block_ids, sizeof(int32_t) * n_ids);
        for (int s = 0; s < sc->n_seqs; s++) {
            int32_t left = sc->n_new[s] - done[s];
            n[s] = chunk[s] < left ? chunk[s] : left;
            pos[s] = sc->past[s] + done[s];
            len[s] = pos[s] + n[s];
            memcpy(q + (int64_t)qs[s] * W, kt->q + (kt->step_q[s] + done[s]) * W,
                   sizeof(float) * (size_t)(n[s] * W));
            qs[s + 1] = qs[s] + n[s];
            int32_t lo = pos[s] - sc->window + 1;
            for (int32_t b = 0; sc->window > 0 && n[s] > 0 && (b + 1) * sc->block_size <= lo; b++)
                ids[kt->indptr[s] + b] = -1;
        }
        const int64_t rows = qs[sc->n_seqs];
        if (rows == 0) break;
        loom_kv_desc d = kvtest_desc(kt, qs, pos, len);
        d.block_ids = ids;
        poison(out, (size_t)(rows * W));
        assert_int_equal(run_attention(be, kt, &d, q, rows, out, 1), LOOM_OK);
        for (int s = 0; s < sc->n_seqs; s++) {
            assert_true(same_bits(out + (int64_t)qs[s] * W, want + (kt->step_q[s] + done[s]) * W,
                                  (size_t)(n[s] * W), "attention chunked vs one call"));
            done[s] += n[s];
        }
    }
    free(ids);
    free(q);
    free(out);
}

/* ------------------------------------------------------------------------------------------ */
/* The scenarios                                                                              */
/* ------------------------------------------------------------------------------------------ */

static void check_scenario(const scen *sc) {
    kvtest kt;
    kvtest_init(&kt, sc);
    const int64_t W = (int64_t)sc->n_head * sc->head_dim, n_out = kt.T * W;

    kvtest_store(&kt, g_be[1]);
    if (!sc->rotate) kvtest_check_pools(&kt);
    /* The 1-thread backend stores the same bytes. */
    void *k_copy = malloc(kt.pool_bytes), *v_copy = malloc(kt.pool_bytes);
    memcpy(k_copy, kt.k_pool[1], kt.pool_bytes);
    memcpy(v_copy, kt.v_pool[1], kt.pool_bytes);
    kvtest_store(&kt, g_be[0]);
    assert_memory_equal(k_copy, kt.k_pool[1], kt.pool_bytes);
    assert_memory_equal(v_copy, kt.v_pool[1], kt.pool_bytes);
    free(k_copy);
    free(v_copy);

    loom_kv_desc d = kvtest_desc(&kt, kt.step_q, kt.step_pos, kt.step_len);
    float *out[2] = {falloc((size_t)n_out), falloc((size_t)n_out)};
    for (int b = 0; b < 2; b++) {
        poison(out[b], (size_t)n_out);
        assert_int_equal(run_attention(g_be[b], &kt, &d, kt.q, kt.T, out[b], 1), LOOM_OK);
    }
    double *ref = malloc(sizeof(double) * (size_t)(n_out ? n_out : 1));
    ref_attention(&kt, ref);
    assert_true(close_enough(out[0], ref, NULL, (size_t)n_out, 0.0, 2e-5, "attention"));
    assert_true(same_bits(out[0], out[1], (size_t)n_out, "attention threads"));
    poison(out[1], (size_t)n_out);
    assert_int_equal(run_attention(g_be3, &kt, &d, kt.q, kt.T, out[1], 1), LOOM_OK);
    assert_true(same_bits(out[0], out[1], (size_t)n_out, "attention 3 threads"));

    if (sc->kv_type != LOOM_TYPE_F32 && sc->kv_type != LOOM_TYPE_F16 && !sc->rotate)
        check_against_f32_pools(&kt, &d, out[0], n_out);

    /* Chunked prefills: one row at a time, and chunk sizes around the 64-position tiles, each
     * sequence with its own. */
    static const int32_t chunk_base[] = {1, 5, 63, 64, 65};
    for (size_t c = 0; c < sizeof chunk_base / sizeof chunk_base[0]; c++) {
        int32_t chunk[MAX_SEQS];
        for (int s = 0; s < sc->n_seqs; s++) chunk[s] = chunk_base[c] + (c ? 3 * s : 0);
        loom__backend_stream *be = c % 3 == 0 ? g_be[0] : c % 3 == 1 ? g_be[1] : g_be3;
        check_chunked(&kt, out[0], chunk, be);
    }

    /* Each sequence alone gives bitwise the rows it had in the batch. */
    float *one = falloc((size_t)n_out);
    for (int s = 0; s < sc->n_seqs; s++) {
        if (sc->n_new[s] == 0) continue;
        int32_t indptr1[2] = {0, kt.indptr[s + 1] - kt.indptr[s]};
        int32_t q1[2] = {0, sc->n_new[s]};
        loom_kv_desc d1 = d;
        d1.n_seqs = 1;
        d1.indptr = indptr1;
        d1.block_ids = kt.block_ids + kt.indptr[s];
        d1.q_start = q1;
        d1.pos_start = &kt.step_pos[s];
        d1.kv_len = &kt.step_len[s];
        poison(one, (size_t)n_out);
        const float *qs = kt.q + kt.step_q[s] * W;
        assert_int_equal(run_attention(g_be[s % 2], &kt, &d1, qs, sc->n_new[s], one, 1), LOOM_OK);
        assert_true(same_bits(one, out[0] + kt.step_q[s] * W, (size_t)(sc->n_new[s] * W),
                              "attention alone vs batched"));
        /* Rows computed as a one-token decode step equal the prefill's rows. */
        for (int32_t i = 0; i < sc->n_new[s]; i += (sc->n_new[s] + 2) / 3) {
            int32_t qd[2] = {0, 1}, pos = kt.step_pos[s] + i, len = pos + 1;
            loom_kv_desc dd = d1;
            dd.q_start = qd;
            dd.pos_start = &pos;
            dd.kv_len = &len;
            poison(one, (size_t)W);
            assert_int_equal(run_attention(g_be[1], &kt, &dd, qs + i * W, 1, one, 1), LOOM_OK);
            assert_true(same_bits(one, out[0] + (kt.step_q[s] + i) * W, (size_t)W,
                                  "attention decode vs prefill"));
        }
    }

    /* layer_src: layer 0 reading layer 1's pool gives the same result as layer 1. */
    int32_t src_map[2] = {1, 1};
    loom_kv_desc ds = d;
    ds.layer_src = src_map;
    poison(one, (size_t)n_out);
    assert_int_equal(run_attention(g_be[1], &kt, &ds, kt.q, kt.T, one, 0), LOOM_OK);
    assert_true(same_bits(one, out[0], (size_t)n_out, "attention layer_src"));

    free(one);
    free(ref);
    free(out[0]);
    free(out[1]);
    kvtest_free(&kt);
}

static void test_attention_f32_gqa(void **state) {
    (void)state;
    scen sc = {.n_seqs = 4,
               .past = {0, 30, 0, 96},
               .n_new = {54, 1, 17, 1},
               .block_size = 16,
               .n_kv_heads = 2,
               .head_dim = 40,
               .n_head = 8,
               .window = 0,
               .scale = 0.158113883f,
               .kv_type = LOOM_TYPE_F32};
    check_scenario(&sc);
}

static void test_attention_f16_mha_window(void **state) {
    (void)state;
    scen sc = {.n_seqs = 3,
               .past = {0, 50, 3},
               .n_new = {17, 3, 0},
               .block_size = 1,
               .n_kv_heads = 3,
               .head_dim = 16,
               .n_head = 3,
               .window = 5,
               .scale = 0.25f,
               .kv_type = LOOM_TYPE_F16};
    check_scenario(&sc);
}

static void test_attention_f16_gqa_softcap(void **state) {
    (void)state;
    scen sc = {.n_seqs = 3,
               .past = {10, 0, 90},
               .n_new = {3, 54, 7},
               .block_size = 8,
               .n_kv_heads = 1,
               .head_dim = 64,
               .n_head = 4,
               .window = 0,
               .scale = 1.0f,
               .softcap = 2.5f,
               .kv_type = LOOM_TYPE_F16};
    check_scenario(&sc);
}

static void test_attention_f32_window_long(void **state) {
    (void)state;
    scen sc = {.n_seqs = 2,
               .past = {0, 0},
               .n_new = {97, 1},
               .block_size = 8,
               .n_kv_heads = 2,
               .head_dim = 32,
               .n_head = 2,
               .window = 5,
               .scale = 0.5f,
               .kv_type = LOOM_TYPE_F32};
    check_scenario(&sc);
    scen big = {.n_seqs = 1,
                .past = {200},
                .n_new = {97},
                .block_size = 16,
                .n_kv_heads = 2,
                .head_dim = 128,
                .n_head = 8,
                .window = 0,
                .scale = 0.088388f,
                .kv_type = LOOM_TYPE_F16};
    check_scenario(&big);
}

/* Gemma 3 270M's attention shape: head_dim 256, 4 query heads on one kv head, F16 cache;
 * prompts longer than a 64-position tile, one with history, a decode row beside them. */
static void test_attention_gemma_prefill(void **state) {
    (void)state;
    scen sc = {.n_seqs = 3,
               .past = {0, 70, 5},
               .n_new = {150, 1, 66},
               .block_size = 16,
               .n_kv_heads = 1,
               .head_dim = 256,
               .n_head = 4,
               .window = 0,
               .scale = 0.0625f,
               .kv_type = LOOM_TYPE_F16};
    check_scenario(&sc);
}

/* The same with a sliding window that does not line up with the tiles (70), F32 cache. */
static void test_attention_gemma_window_f32(void **state) {
    (void)state;
    scen sc = {.n_seqs = 2,
               .past = {30, 0},
               .n_new = {140, 9},
               .block_size = 8,
               .n_kv_heads = 1,
               .head_dim = 256,
               .n_head = 4,
               .window = 70,
               .scale = 0.0625f,
               .kv_type = LOOM_TYPE_F32};
    check_scenario(&sc);
}

/* Soft-capped and windowed, F16, with a head_dim (72) that is not a whole number of vectors
 * and 3 query heads per kv head, so a block of query vectors spans rows. */
static void test_attention_softcap_window_f16(void **state) {
    (void)state;
    scen sc = {.n_seqs = 3,
               .past = {0, 64, 11},
               .n_new = {97, 2, 54},
               .block_size = 16,
               .n_kv_heads = 2,
               .head_dim = 72,
               .n_head = 6,
               .window = 33,
               .scale = 0.4f,
               .softcap = 3.0f,
               .kv_type = LOOM_TYPE_F16};
    check_scenario(&sc);
}

/* The stored types beside F16 and F32: Gemma's shape (head_dim 256, 4:1, a window across
 * tiles) in E4M3, GQA with soft-capping and a window in E5M2 and BF16, and a head_dim of 20
 * (scalar tails) with block size 1 in E4M3. */
static void test_attention_quantized_pools(void **state) {
    (void)state;
    scen g = {.n_seqs = 3,
              .past = {0, 100, 7},
              .n_new = {80, 1, 41},
              .block_size = 16,
              .n_kv_heads = 1,
              .head_dim = 256,
              .n_head = 4,
              .window = 70,
              .scale = 0.0625f,
              .kv_type = LOOM_TYPE_FP8_E4M3};
    check_scenario(&g);
    g.window = 0;
    g.kv_type = LOOM_TYPE_BF16;
    check_scenario(&g);
    scen c = {.n_seqs = 3,
              .past = {0, 64, 11},
              .n_new = {97, 2, 54},
              .block_size = 8,
              .n_kv_heads = 2,
              .head_dim = 72,
              .n_head = 6,
              .window = 33,
              .scale = 0.4f,
              .softcap = 3.0f,
              .kv_type = LOOM_TYPE_FP8_E5M2};
    check_scenario(&c);
    c.kv_type = LOOM_TYPE_BF16;
    check_scenario(&c);
    scen t = {.n_seqs = 2,
              .past = {60, 0},
              .n_new = {71, 9},
              .block_size = 1,
              .n_kv_heads = 1,
              .head_dim = 20,
              .n_head = 2,
              .window = 0,
              .scale = 0.5f,
              .kv_type = LOOM_TYPE_FP8_E4M3};
    check_scenario(&t);
}

/* The Hadamard rotation (LOOM_KV_HADAMARD): over F32 pages, attention equals the unrotated
 * float64 reference within float32 rounding (the reference never rotates anything); over FP8
 * and F16 pages it equals the reference over the values the rotated pages give back. Head
 * dims 64, 128 (1/sqrt(d) inexact) and 256; the transform itself against its definition. */
static void test_attention_hadamard(void **state) {
    (void)state;
    scen a = {.n_seqs = 3,
              .past = {0, 40, 5},
              .n_new = {70, 1, 33},
              .block_size = 16,
              .n_kv_heads = 2,
              .head_dim = 128,
              .n_head = 4,
              .window = 0,
              .scale = 0.088388f,
              .kv_type = LOOM_TYPE_F32,
              .rotate = true};
    check_scenario(&a);
    a.kv_type = LOOM_TYPE_FP8_E4M3;
    check_scenario(&a);
    a.head_dim = 64;
    a.window = 20;
    a.softcap = 2.0f;
    a.kv_type = LOOM_TYPE_F16;
    check_scenario(&a);
    scen g = {.n_seqs = 2,
              .past = {0, 90},
              .n_new = {66, 1},
              .block_size = 16,
              .n_kv_heads = 1,
              .head_dim = 256,
              .n_head = 4,
              .scale = 0.0625f,
              .kv_type = LOOM_TYPE_FP8_E5M2,
              .rotate = true};
    check_scenario(&g);
    /* H x against the matrix definition, in double: H[i][j] = (-1)^popcount(i & j) / sqrt(n). */
    enum { N = 64 };
    float x[N];
    double want[N];
    fill_rand(x, N, 1.0f);
    for (int i = 0; i < N; i++) {
        want[i] = 0;
        for (int j = 0; j < N; j++) want[i] += (__builtin_popcount(i & j) & 1 ? -1.0 : 1.0) * x[j];
        want[i] /= 8.0;
    }
    loom__cpu_hadamard(x, N);
    assert_true(close_enough(x, want, NULL, N, 0.0, 1e-6, "hadamard"));
    /* A head_dim that is not a power of two is refused by the step's check. */
    kvtest kt;
    scen b = a;
    b.head_dim = 40;
    b.rotate = false;
    kvtest_init(&kt, &b);
    loom_kv_desc d = kvtest_desc(&kt, kt.step_q, kt.step_pos, kt.step_len);
    d.kv_flags = LOOM_KV_HADAMARD;
    assert_int_equal(loom__kv_desc_check(&d, kt.T), LOOM_ERR_INVALID_ARG);
    d.kv_flags = 4; /* no such flag */
    assert_int_equal(loom__kv_desc_check(&d, kt.T), LOOM_ERR_UNSUPPORTED);
    d.kv_flags = LOOM_KV_MERGED; /* merged pairs without their arrays */
    assert_int_equal(loom__kv_desc_check(&d, kt.T), LOOM_ERR_INVALID_ARG);
    kvtest_free(&kt);
}

/* A row of zeros stores scale 0 and reads back zeros; a row holding a NaN stores a NaN scale,
 * so attention over it is NaN rather than a made-up finite value; rows of huge values (1e30)
 * keep their relative precision (no saturation: the scale absorbs the magnitude). */
static void test_fp8_store_edges(void **state) {
    (void)state;
    enum { HD = 16, BS = 4 };
    uint8_t pool[2][BS * HD];
    float scales[2][BS];
    int32_t indptr[2] = {0, 1}, ids[1] = {0}, q_start[2] = {0, 3}, pos[1] = {0}, len[1] = {3};
    void *kb[1] = {pool[0]}, *vb[1] = {pool[1]}, *ks[1] = {scales[0]}, *vs[1] = {scales[1]};
    loom_kv_desc d = {.n_seqs = 1,
                      .indptr = indptr,
                      .block_ids = ids,
                      .q_start = q_start,
                      .pos_start = pos,
                      .kv_len = len,
                      .block_size = BS,
                      .n_blocks = 1,
                      .n_kv_heads = 1,
                      .head_dim = HD,
                      .kv_type = LOOM_TYPE_FP8_E4M3,
                      .layout = LOOM_KV_LAYOUT_NHD,
                      .token_stride = HD,
                      .block_stride = BS * HD,
                      .n_layers = 1,
                      .k_base = kb,
                      .v_base = vb,
                      .scale_kind = LOOM_KV_SCALE_PER_TOKEN_HEAD,
                      .k_scale = ks,
                      .v_scale = vs,
                      .scale_token_stride = sizeof(float),
                      .scale_block_stride = BS * sizeof(float)};
    float rows[3][HD];
    for (int e = 0; e < HD; e++) {
        rows[0][e] = 0.0f;
        rows[1][e] = 1e30f * (float)(e - 7);
        rows[2][e] = e == 5 ? NAN : 1.0f;
    }
    assert_int_equal(loom__kv_desc_check(&d, 3), LOOM_OK);
    loom_tensor k = loom_tensor_2d(LOOM_TYPE_F32, rows, HD, 3, sizeof rows[0]);
    assert_int_equal(g_be[0]->ops->kv_store(g_be[0]->ctx, &k, &k, &d, 0), LOOM_OK);
    assert_true(scales[0][0] == 0.0f);
    for (int e = 0; e < HD; e++) assert_int_equal(pool[0][e], 0);
    assert_true(scales[0][1] == 8e30f / 448.0f);
    for (int e = 0; e < HD; e++) {
        const float back = loom__fp8_e4m3_to_f32(pool[0][HD + e]) * scales[0][1];
        assert_true(fabsf(back - rows[1][e]) <= fabsf(rows[1][e]) / 16.0f); /* 3 mantissa bits */
    }
    assert_true(isnan(scales[0][2]));
    /* Attention of one query at position 2 reads the NaN row: NaN out. */
    float q[HD], out[HD];
    for (int e = 0; e < HD; e++) q[e] = 0.1f;
    int32_t q1[2] = {0, 1}, pos2[1] = {2};
    d.q_start = q1;
    d.pos_start = pos2;
    loom_tensor tq = loom_tensor_2d(LOOM_TYPE_F32, q, HD, 1, sizeof q);
    loom_tensor to = loom_tensor_2d(LOOM_TYPE_F32, out, HD, 1, sizeof out);
    loom_attn_params ap = {.n_head = 1, .layer = 0, .scale = 0.25f};
    assert_int_equal(g_be[0]->ops->attention(g_be[0]->ctx, &tq, &d, &ap, &to), LOOM_OK);
    assert_true(isnan(out[0]));
    /* FP8 pages without scales are refused by the step's check; scales per head are not what
     * the CPU reads (UNSUPPORTED at the op). */
    loom_kv_desc bad = d;
    bad.scale_kind = LOOM_KV_SCALE_NONE;
    assert_int_equal(loom__kv_desc_check(&bad, 1), LOOM_ERR_INVALID_ARG);
    bad.scale_kind = LOOM_KV_SCALE_PER_HEAD;
    assert_int_equal(g_be[0]->ops->attention(g_be[0]->ctx, &tq, &bad, &ap, &to),
                     LOOM_ERR_UNSUPPORTED);
}

/* MHA with head_dims of 40 and 20 (scalar tails everywhere), F32 and F16. */
static void test_attention_odd_head_dims(void **state) {
    (void)state;
    scen a = {.n_seqs = 2,
              .past = {0, 3},
              .n_new = {130, 17},
              .block_size = 8,
              .n_kv_heads = 2,
              .head_dim = 40,
              .n_head = 2,
              .window = 0,
              .scale = 0.3f,
              .kv_type = LOOM_TYPE_F32};
    check_scenario(&a);
    scen b = {.n_seqs = 1,
              .past = {60},
              .n_new = {71},
              .block_size = 1,
              .n_kv_heads = 1,
              .head_dim = 20,
              .n_head = 1,
              .window = 65,
              .scale = 0.5f,
              .softcap = 1.5f,
              .kv_type = LOOM_TYPE_F16};
    check_scenario(&b);
}

/* Deep contexts: rows that meet several ATTN_SEG-position segments (cpu_attention.c merges
 * the segments' softmax states in order). Decode rows and short chunks have too few items for
 * the threads, so they run as split items, one per segment, merged by the calling thread; the
 * batch runs whole rows per item. check_scenario then holds those bitwise equal to each other,
 * to the 1-thread run and to the chunked prefills, and close to the double reference. */
static void test_attention_segments(void **state) {
    (void)state;
    scen sc = {.n_seqs = 4,
               .past = {600, 300, 0, 1000},
               .n_new = {2, 1, 70, 1},
               .block_size = 16,
               .n_kv_heads = 2,
               .head_dim = 64,
               .n_head = 6,
               .window = 0,
               .scale = 0.125f,
               .kv_type = LOOM_TYPE_F16};
    check_scenario(&sc);
}

/* The same with a window (300) whose start crosses segment boundaries inside a block of rows
 * (a row whose window starts past the block's first segment has nothing there: its first
 * merge takes the next segment as it is), a long prefill beside a decode row, F32 pools and
 * Gemma's head shape. */
static void test_attention_segments_window(void **state) {
    (void)state;
    scen sc = {.n_seqs = 3,
               .past = {700, 0, 511},
               .n_new = {3, 530, 1},
               .block_size = 8,
               .n_kv_heads = 1,
               .head_dim = 256,
               .n_head = 4,
               .window = 300,
               .scale = 0.0625f,
               .kv_type = LOOM_TYPE_F32};
    check_scenario(&sc);
}

/* Two decode rows 2500-3000 positions deep: 10-12 segments each, enough saved state that the
 * merge after the split run goes through the pool (cpu_attention.c's ATTN_MERGE_POOL_FLOATS),
 * on 2 and 3 threads, against the 1-thread run that has no split at all. */
static void test_attention_segments_deep(void **state) {
    (void)state;
    scen sc = {.n_seqs = 2,
               .past = {3000, 2500},
               .n_new = {1, 1},
               .block_size = 16,
               .n_kv_heads = 2,
               .head_dim = 128,
               .n_head = 8,
               .window = 0,
               .scale = 0.088388f,
               .kv_type = LOOM_TYPE_F16};
    check_scenario(&sc);
}

/* The softmax exp: within 2 ulp of exp over [-87, 0], exact at 0, +0 below -87 and at -inf,
 * NaN kept. (This test is compiled without -march=native, so it runs the plain-C lanes; the
 * AVX2 lanes compute the same operations.) */
static void test_attention_exp(void **state) {
    (void)state;
    double worst = 0;
    for (int i = 0; i <= 200000; i++) {
        float x = -87.0f * (float)i / 200000.0f;
        double want = exp((double)x), got = lv_exp1(x);
        double ulp = ldexp(1.0, ilogb(want) - 23);
        double err = fabs(got - want) / ulp;
        worst = err > worst ? err : worst;
    }
    assert_true(worst <= 2.0);
    assert_true(lv_exp1(0.0f) == 1.0f);
    const float zero_at[] = {-87.5f, -100.0f, -1e30f, -INFINITY};
    for (size_t i = 0; i < sizeof zero_at / sizeof zero_at[0]; i++) {
        float z = lv_exp1(zero_at[i]);
        assert_true(z == 0.0f && !signbit(z));
    }
    assert_true(isnan(lv_exp1(NAN)));
}

/* With window 5, a decode row at position 20 reads positions 16..20 only: slots before that
 * are overwritten with NaN and the output stays finite and correct. */
static void test_attention_window_reads(void **state) {
    (void)state;
    scen sc = {.n_seqs = 1,
               .past = {20},
               .n_new = {1},
               .block_size = 8,
               .n_kv_heads = 1,
               .head_dim = 8,
               .n_head = 2,
               .window = 5,
               .scale = 0.3f,
               .kv_type = LOOM_TYPE_F32};
    kvtest kt;
    kvtest_init(&kt, &sc);
    kvtest_store(&kt, g_be[0]);
    for (int32_t p = 0; p < 16; p++) {
        int32_t blk = kt.block_ids[kt.indptr[0] + p / 8];
        float *slot = (float *)((char *)kt.k_pool[1] + (size_t)blk * kt.block_stride +
                                (size_t)(p % 8) * kt.token_stride);
        poison(slot, (size_t)kt.kv_dim);
    }
    loom_kv_desc d = kvtest_desc(&kt, kt.step_q, kt.step_pos, kt.step_len);
    float out[16];
    double ref[16];
    poison(out, 16);
    assert_int_equal(run_attention(g_be[1], &kt, &d, kt.q, 1, out, 1), LOOM_OK);
    ref_attention(&kt, ref);
    assert_true(close_enough(out, ref, NULL, 16, 0.0, 2e-5, "windowed attention"));
    kvtest_free(&kt);
}

/* ------------------------------------------------------------------------------------------ */
/* Bad input                                                                                  */
/* ------------------------------------------------------------------------------------------ */

static void test_kv_bad(void **state) {
    (void)state;
    loom__backend_stream *be = g_be[1];
    scen sc = {.n_seqs = 2,
               .past = {0, 0},
               .n_new = {5, 9},
               .block_size = 4,
               .n_kv_heads = 2,
               .head_dim = 8,
               .n_head = 4,
               .window = 0,
               .scale = 0.3f,
               .kv_type = LOOM_TYPE_F16};
    kvtest kt;
    kvtest_init(&kt, &sc);
    loom_kv_desc d = kvtest_desc(&kt, kt.step_q, kt.step_pos, kt.step_len);
    float *k = falloc((size_t)(kt.T * kt.kv_dim)), *v = falloc((size_t)(kt.T * kt.kv_dim));
    fill_rand(k, (size_t)(kt.T * kt.kv_dim), 1.0f);
    fill_rand(v, (size_t)(kt.T * kt.kv_dim), 1.0f);
    loom_tensor tk = loom_tensor_2d(LOOM_TYPE_F32, k, kt.kv_dim, kt.T, (size_t)kt.kv_dim * 4);
    loom_tensor tv = loom_tensor_2d(LOOM_TYPE_F32, v, kt.kv_dim, kt.T, (size_t)kt.kv_dim * 4);
    const int64_t W = (int64_t)sc.n_head * sc.head_dim;
    float *out = falloc((size_t)(kt.T * W));
    void *pool_copy = malloc(kt.pool_bytes);
    memcpy(pool_copy, kt.k_pool[1], kt.pool_bytes);

    /* The descriptor is sound (the step's check passes) and both ops run on it. */
    assert_int_equal(loom__kv_desc_check(&d, kt.T), LOOM_OK);
    assert_int_equal(be->ops->kv_store(be->ctx, &tk, &tv, &d, 1), LOOM_OK);
    assert_int_equal(run_attention(be, &kt, &d, kt.q, kt.T, out, 1), LOOM_OK);
    memcpy(pool_copy, kt.k_pool[1], kt.pool_bytes);

    /* What the CPU does not store: another element type, layout or scales. Nothing written. */
    loom_kv_desc bad = d;
    const loom_type other_types[] = {LOOM_TYPE_Q8_0, LOOM_TYPE_I16, LOOM_TYPE_F64};
    for (size_t i = 0; i < sizeof other_types / sizeof *other_types; i++) {
        bad = d;
        bad.kv_type = other_types[i];
        assert_int_equal(be->ops->kv_store(be->ctx, &tk, &tv, &bad, 1), LOOM_ERR_UNSUPPORTED);
        assert_non_null(strstr(loom_last_error(), "kv type"));
        assert_int_equal(run_attention(be, &kt, &bad, kt.q, kt.T, out, 1), LOOM_ERR_UNSUPPORTED);
    }
    /* FP8 pages need their scales. */
    bad = d;
    bad.kv_type = LOOM_TYPE_FP8_E4M3;
    assert_int_equal(be->ops->kv_store(be->ctx, &tk, &tv, &bad, 1), LOOM_ERR_UNSUPPORTED);
    assert_non_null(strstr(loom_last_error(), "scales"));
    assert_int_equal(run_attention(be, &kt, &bad, kt.q, kt.T, out, 1), LOOM_ERR_UNSUPPORTED);
    bad = d;
    bad.scale_kind = LOOM_KV_SCALE_PER_HEAD;
    assert_int_equal(be->ops->kv_store(be->ctx, &tk, &tv, &bad, 1), LOOM_ERR_UNSUPPORTED);
    assert_int_equal(run_attention(be, &kt, &bad, kt.q, kt.T, out, 1), LOOM_ERR_UNSUPPORTED);
    assert_memory_equal(pool_copy, kt.k_pool[1], kt.pool_bytes);
    /* Layer out of range. */
    assert_int_equal(be->ops->kv_store(be->ctx, &tk, &tv, &d, 2), LOOM_ERR_INVALID_ARG);
    assert_int_equal(run_attention(be, &kt, &d, kt.q, kt.T, out, -1), LOOM_ERR_INVALID_ARG);
    /* A layer reading another layer's pools stores nothing of its own. */
    int32_t reuse[2] = {0, 0};
    bad = d;
    bad.layer_src = reuse;
    assert_int_equal(be->ops->kv_store(be->ctx, &tk, &tv, &bad, 1), LOOM_ERR_INVALID_ARG);
    assert_non_null(strstr(loom_last_error(), "stores none"));
    assert_memory_equal(pool_copy, kt.k_pool[1], kt.pool_bytes);
    /* Shapes: rows, widths. */
    loom_tensor tb = tk;
    tb.ne[1] = kt.T - 1;
    loom_tensor tvb = tv;
    tvb.ne[1] = kt.T - 1;
    assert_int_equal(be->ops->kv_store(be->ctx, &tb, &tvb, &d, 1), LOOM_ERR_INVALID_ARG);
    tb = tk;
    tb.ne[0] = kt.kv_dim - 1;
    tvb = tv;
    tvb.ne[0] = kt.kv_dim - 1;
    assert_int_equal(be->ops->kv_store(be->ctx, &tb, &tvb, &d, 1), LOOM_ERR_INVALID_ARG);
    assert_int_equal(be->ops->kv_store(be->ctx, &tk, &tb, &d, 1), LOOM_ERR_INVALID_ARG);
    assert_int_equal(be->ops->kv_store(be->ctx, &tk, &tv, NULL, 1), LOOM_ERR_INVALID_ARG);
    assert_memory_equal(pool_copy, kt.k_pool[1], kt.pool_bytes);

    /* Attention parameters. */
    loom_tensor tq = loom_tensor_2d(LOOM_TYPE_F32, kt.q, W, kt.T, (size_t)W * 4);
    loom_tensor to = loom_tensor_2d(LOOM_TYPE_F32, out, W, kt.T, (size_t)W * 4);
    loom_attn_params p = {.n_head = 4, .layer = 1, .scale = 0.3f};
    assert_int_equal(be->ops->attention(be->ctx, &tq, &d, &p, &to), LOOM_OK);
    loom_attn_params pb = p;
    pb.n_head = 3; /* not a multiple of n_kv_heads = 2 */
    assert_int_equal(be->ops->attention(be->ctx, &tq, &d, &pb, &to), LOOM_ERR_INVALID_ARG);
    pb = p;
    pb.softcap = -1.0f;
    assert_int_equal(be->ops->attention(be->ctx, &tq, &d, &pb, &to), LOOM_ERR_INVALID_ARG);
    assert_int_equal(be->ops->attention(be->ctx, &tq, &d, NULL, &to), LOOM_ERR_INVALID_ARG);
    pb = p;
    pb.n_head = 2; /* q rows are 4 heads wide */
    assert_int_equal(be->ops->attention(be->ctx, &tq, &d, &pb, &to), LOOM_ERR_INVALID_ARG);
    loom_tensor tqb = tq;
    tqb.ne[1] = kt.T - 1;
    loom_tensor tob = to;
    tob.ne[1] = kt.T - 1;
    assert_int_equal(be->ops->attention(be->ctx, &tqb, &d, &p, &tob), LOOM_ERR_INVALID_ARG);
    assert_int_equal(be->ops->attention(be->ctx, &tq, &d, &p, &tq), LOOM_ERR_INVALID_ARG);
    assert_non_null(strstr(loom_last_error(), "attention"));

    /* An empty step is fine. */
    int32_t zq[3] = {0, 0, 0};
    loom_kv_desc empty = d;
    empty.q_start = zq;
    loom_tensor t0 = tk, tv0 = tv, tq0 = tq, to0 = to;
    t0.ne[1] = tv0.ne[1] = tq0.ne[1] = to0.ne[1] = 0;
    assert_int_equal(be->ops->kv_store(be->ctx, &t0, &tv0, &empty, 1), LOOM_OK);
    assert_int_equal(be->ops->attention(be->ctx, &tq0, &empty, &p, &to0), LOOM_OK);

    free(pool_copy);
    free(out);
    free(k);
    free(v);
    kvtest_free(&kt);
}

static int group_setup(void **state) {
    if (cpu_group_setup(state) != 0) return -1;
    return cpu_stream_open(g_be3, 3, true);
}

static int group_teardown(void **state) {
    loom__backend_stream_close(g_be3);
    return cpu_group_teardown(state);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_attention_f32_gqa),
        cmocka_unit_test(test_attention_f16_mha_window),
        cmocka_unit_test(test_attention_f16_gqa_softcap),
        cmocka_unit_test(test_attention_f32_window_long),
        cmocka_unit_test(test_attention_gemma_prefill),
        cmocka_unit_test(test_attention_gemma_window_f32),
        cmocka_unit_test(test_attention_softcap_window_f16),
        cmocka_unit_test(test_attention_quantized_pools),
        cmocka_unit_test(test_fp8_store_edges),
        cmocka_unit_test(test_attention_hadamard),
        cmocka_unit_test(test_attention_odd_head_dims),
        cmocka_unit_test(test_attention_segments),
        cmocka_unit_test(test_attention_segments_window),
        cmocka_unit_test(test_attention_segments_deep),
        cmocka_unit_test(test_attention_window_reads),
        cmocka_unit_test(test_attention_exp),
        cmocka_unit_test(test_kv_bad),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
