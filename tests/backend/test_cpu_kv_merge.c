/* test_cpu_kv_merge.c — the CPU kv_store of merged layer pairs (loom_backend.h, LOOM_KV_MERGED)
 * on a hand-built descriptor: one block of 4 positions, one KV head of 4 elements, F32 pages,
 * layers 0 (the pair's earlier) and 1 (its later), 2 tokens of the block kept unmerged.
 *
 * The earlier layer stores e0 at every position; the later layer stores cos(d pi) e0 +
 * sin(d pi) e1 (norm 3), so the distance of position p is exactly d_p. With distances 0.1, 0.5,
 * 0.3, 0.9 stored one step each, the block keeps 0 and 1 (rows 0, 1), then 2 displaces 0 (row 0),
 * then 3 displaces 2 (row 0): states -1 1 -1 0, and the displaced tokens' earlier-layer rows
 * are the interpolated directions. Then position 3 is stored a second time (as the last block
 * of a cached prompt is recomputed): the earlier slots hold one kept token (1, in row 1), and
 * the newcomer must take row 0, not row 1 — a second store once took the row count (1) as the
 * free row and overwrote token 1's direction. */
#include "backend/cpu_test_util.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include "kv/kv_desc.h"

enum { S = 4, H = 1, HD = 4, R = 2 };
static const double PI = 3.14159265358979323846;

typedef struct merge_fixture {
    loom_buffer *buf;
    char *base;
    void *k_base[2], *v_base[2], *merge_base[2];
    int32_t layer_src[2], merge_with[2];
    int32_t indptr[2], block_ids[1], q_start[2], pos_start[1], kv_len[1];
    size_t merge_stride;
} merge_fixture;

static void fixture_init(merge_fixture *f, const loom__backend_stream *b) {
    memset(f, 0, sizeof *f);
    const size_t page = S * H * HD * sizeof(float);
    f->merge_stride =
        (loom_kv_merge_rows_at(S, H) + (size_t)R * 2 * H * HD * sizeof(float) + 15) & ~(size_t)15;
    assert_int_equal(b->ops->buffer_alloc(b->dev, 2 * page + f->merge_stride, &f->buf), LOOM_OK);
    f->base = b->ops->buffer_base(b->dev, f->buf);
    memset(f->base, 0x7f, 2 * page + f->merge_stride); /* stale bytes a store must not read */
    f->k_base[0] = f->base;
    f->v_base[0] = f->base + page;
    f->merge_base[0] = f->merge_base[1] = f->base + 2 * page;
    f->layer_src[0] = f->layer_src[1] = 0;
    f->merge_with[0] = 1;
    f->merge_with[1] = 0;
    f->indptr[1] = 1;
}

static loom_kv_desc desc_at(merge_fixture *f, int32_t pos) {
    f->q_start[1] = 1;
    f->pos_start[0] = pos;
    f->kv_len[0] = pos + 1;
    return (loom_kv_desc){.n_seqs = 1,
                          .indptr = f->indptr,
                          .block_ids = f->block_ids,
                          .q_start = f->q_start,
                          .pos_start = f->pos_start,
                          .kv_len = f->kv_len,
                          .block_size = S,
                          .n_blocks = 1,
                          .n_kv_heads = H,
                          .head_dim = HD,
                          .window = 0,
                          .kv_type = LOOM_TYPE_F32,
                          .layout = LOOM_KV_LAYOUT_NHD,
                          .token_stride = H * HD * sizeof(float),
                          .block_stride = S * H * HD * sizeof(float),
                          .n_layers = 2,
                          .k_base = f->k_base,
                          .v_base = f->v_base,
                          .layer_src = f->layer_src,
                          .scale_kind = LOOM_KV_SCALE_NONE,
                          .kv_flags = LOOM_KV_MERGED,
                          .merge_with = f->merge_with,
                          .merge_base = f->merge_base,
                          .merge_block_stride = f->merge_stride,
                          .merge_retain = R,
                          .merge_t = 0.6f};
}

/* Stores position pos in both layers: e0 (earlier), 3 (cos(d pi) e0 + sin(d pi) e1) (later). */
static void store(const loom__backend_stream *b, merge_fixture *f, int32_t pos, double d) {
    loom_kv_desc kv = desc_at(f, pos);
    assert_int_equal(loom__kv_desc_check(&kv, 1), LOOM_OK);
    float a[HD] = {1, 0, 0, 0}, x[HD] = {0};
    x[0] = (float)(3 * cos(d * PI));
    x[1] = (float)(3 * sin(d * PI));
    loom_tensor ta = loom_tensor_2d(LOOM_TYPE_F32, a, HD, 1, sizeof a);
    loom_tensor tx = loom_tensor_2d(LOOM_TYPE_F32, x, HD, 1, sizeof x);
    assert_int_equal(b->ops->kv_store(b->ctx, &ta, &ta, &kv, 0), LOOM_OK);
    assert_int_equal(b->ops->kv_store(b->ctx, &tx, &tx, &kv, 1), LOOM_OK);
}

static const int32_t *states(const merge_fixture *f) {
    return (const int32_t *)((const char *)f->merge_base[0] + loom_kv_merge_state_at(S, H));
}

/* Retained row r's K direction. */
static const float *kept_k(const merge_fixture *f, int32_t r) {
    return (const float *)((const char *)f->merge_base[0] + loom_kv_merge_rows_at(S, H)) +
           (size_t)r * 2 * H * HD;
}

static void test_keep_displace_and_restore(void **state) {
    (void)state;
    for (int bi = 0; bi < 2; bi++) {
        const loom__backend_stream *b = g_be[bi];
        merge_fixture f;
        fixture_init(&f, b);
        const double d[S] = {0.1, 0.5, 0.3, 0.9};
        for (int32_t p = 0; p < S; p++) store(b, &f, p, d[p]);
        const int32_t *st = states(&f);
        assert_int_equal(st[0], -1);
        assert_int_equal(st[1], 1);
        assert_int_equal(st[2], -1);
        assert_int_equal(st[3], 0);
        /* Kept tokens keep their own direction; displaced ones were merged: the earlier layer's
         * row of position 0 is slerp(e0, dir_0, 0.6), at angle 0.6 * 0.1 pi from e0. */
        assert_true(fabsf(kept_k(&f, 1)[0] - (float)cos(0.5 * PI)) < 1e-6f);
        assert_true(fabsf(kept_k(&f, 1)[1] - (float)sin(0.5 * PI)) < 1e-6f);
        assert_true(fabsf(kept_k(&f, 0)[1] - (float)sin(0.9 * PI)) < 1e-6f);
        const float *a0 = (const float *)f.k_base[0];
        assert_true(fabsf(a0[0] - (float)cos(0.06 * PI)) < 1e-6f);
        assert_true(fabsf(a0[1] - (float)sin(0.06 * PI)) < 1e-6f);
        /* The later layer's norm of every position is 3, the earlier's 1. */
        const float *norm = (const float *)f.merge_base[0];
        for (int32_t p = 0; p < S; p++) {
            assert_true(fabsf(norm[p * 4 + 0] - 1.0f) < 1e-6f);
            assert_true(fabsf(norm[p * 4 + 2] - 3.0f) < 1e-6f);
        }
        /* Position 3 stored again: one kept token before it (1, row 1): the newcomer takes
         * row 0 and token 1 keeps its direction. */
        store(b, &f, 3, 0.9);
        assert_int_equal(st[1], 1);
        assert_int_equal(st[3], 0);
        assert_true(fabsf(kept_k(&f, 1)[1] - 1.0f) < 1e-6f);
        assert_true(fabsf(kept_k(&f, 0)[1] - (float)sin(0.9 * PI)) < 1e-6f);
        b->ops->buffer_free(b->dev, f.buf);
    }
}

/* Bad descriptors of merged pairs are refused by the step's check: a third layer reading the
 * pair's pages, a pair whose later layer does not read the earlier, merge_retain past the
 * block, merge_t outside [0, 1], FP8 pages. */
static void test_bad_descriptors(void **state) {
    (void)state;
    merge_fixture f;
    fixture_init(&f, g_be[0]);
    loom_kv_desc kv = desc_at(&f, 0);
    assert_int_equal(loom__kv_desc_check(&kv, 1), LOOM_OK);
    kv.merge_retain = S + 1;
    assert_int_equal(loom__kv_desc_check(&kv, 1), LOOM_ERR_INVALID_ARG);
    kv = desc_at(&f, 0);
    kv.merge_t = 1.5f;
    assert_int_equal(loom__kv_desc_check(&kv, 1), LOOM_ERR_INVALID_ARG);
    kv = desc_at(&f, 0);
    f.layer_src[1] = 1;
    assert_int_equal(loom__kv_desc_check(&kv, 1), LOOM_ERR_INVALID_ARG);
    f.layer_src[1] = 0;
    kv.kv_type = LOOM_TYPE_FP8_E4M3;
    kv.scale_kind = LOOM_KV_SCALE_PER_TOKEN_HEAD;
    assert_int_not_equal(loom__kv_desc_check(&kv, 1), LOOM_OK);
    /* A third layer reading the pair's earlier layer. */
    int32_t src3[3] = {0, 0, 0}, with3[3] = {1, 0, -1};
    void *k3[3] = {f.k_base[0], NULL, NULL}, *v3[3] = {f.v_base[0], NULL, NULL};
    void *m3[3] = {f.merge_base[0], f.merge_base[0], NULL};
    kv = desc_at(&f, 0);
    kv.n_layers = 3;
    kv.layer_src = src3;
    kv.merge_with = with3;
    kv.k_base = k3;
    kv.v_base = v3;
    kv.merge_base = m3;
    assert_int_equal(loom__kv_desc_check(&kv, 1), LOOM_ERR_INVALID_ARG);
    g_be[0]->ops->buffer_free(g_be[0]->dev, f.buf);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_keep_displace_and_restore),
        cmocka_unit_test(test_bad_descriptors),
    };
    return cmocka_run_group_tests(tests, cpu_group_setup, cpu_group_teardown);
}
