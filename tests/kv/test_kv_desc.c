/* test_kv_desc.c — loom__kv_desc_check, the one check of a step's paged-KV descriptor that
 * backends then trust: a sound descriptor passes (also with released entries before a window,
 * reusing layers without pools, an empty step); each kind of damage gives its status and a
 * message naming the field: structure (INVALID_ARG), unknown types, layouts and scale kinds
 * (UNSUPPORTED), positions and block ids (BAD_INPUT). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "kv/kv_desc.h"
#include "loom.h"

/* Two sequences: s0 computes 5 new rows from position 0, s1 3 rows from position 9 (block 4:
 * s0 holds blocks 7, 2; s1 holds 0, 5, 3). Three layers, the last reusing layer 1. */
typedef struct fixture {
    int32_t indptr[3], block_ids[5], q_start[3], pos_start[2], kv_len[2], layer_src[3];
    uint16_t pools[6][8 * 4 * 2 * 4]; /* [layer K/V][n_blocks * block_size * heads * dim] */
    void *k_base[3], *v_base[3];
    float scales[6][8 * 4 * 2];
    void *k_scale[3], *v_scale[3];
    loom_kv_desc d;
} fixture;

static void fixture_init(fixture *f) {
    memset(f, 0, sizeof *f);
    const int32_t indptr[3] = {0, 2, 5}, ids[5] = {7, 2, 0, 5, 3}, q[3] = {0, 5, 8};
    memcpy(f->indptr, indptr, sizeof indptr);
    memcpy(f->block_ids, ids, sizeof ids);
    memcpy(f->q_start, q, sizeof q);
    f->pos_start[0] = 0, f->pos_start[1] = 9;
    f->kv_len[0] = 5, f->kv_len[1] = 12;
    f->layer_src[0] = 0, f->layer_src[1] = 1, f->layer_src[2] = 1;
    for (int l = 0; l < 2; l++) {
        f->k_base[l] = f->pools[2 * l];
        f->v_base[l] = f->pools[2 * l + 1];
        f->k_scale[l] = f->scales[2 * l];
        f->v_scale[l] = f->scales[2 * l + 1];
    }
    f->d = (loom_kv_desc){
        .n_seqs = 2,
        .indptr = f->indptr,
        .block_ids = f->block_ids,
        .q_start = f->q_start,
        .pos_start = f->pos_start,
        .kv_len = f->kv_len,
        .block_size = 4,
        .n_blocks = 8,
        .n_kv_heads = 2,
        .head_dim = 4,
        .window = 0,
        .kv_type = LOOM_TYPE_F16,
        .layout = LOOM_KV_LAYOUT_NHD,
        .token_stride = 2 * 4 * 2,
        .block_stride = 4 * 2 * 4 * 2,
        .n_layers = 3,
        .k_base = f->k_base,
        .v_base = f->v_base,
        .layer_src = f->layer_src,
        .scale_kind = LOOM_KV_SCALE_NONE,
    };
}

/* The check of d for 8 rows fails with status, and the message holds `what`. */
static void expect(const loom_kv_desc *d, loom_status status, const char *what) {
    assert_int_equal(loom__kv_desc_check(d, 8), status);
    if (strstr(loom_last_error(), what) == NULL)
        fail_msg("message '%s' lacks '%s'", loom_last_error(), what);
}

static void test_sound(void **state) {
    (void)state;
    fixture f;
    fixture_init(&f);
    assert_int_equal(loom__kv_desc_check(&f.d, 8), LOOM_OK);
    /* F32 pages need 4-byte strides; no layer_src: every layer its own (layer 2 needs pools) */
    loom_kv_desc d = f.d;
    d.kv_type = LOOM_TYPE_F32;
    d.token_stride *= 2;
    d.block_stride *= 2;
    assert_int_equal(loom__kv_desc_check(&d, 8), LOOM_OK);
    d = f.d;
    d.layer_src = NULL;
    expect(&d, LOOM_ERR_INVALID_ARG, "layer 2 has no K/V pool");
    f.k_base[2] = f.pools[4];
    f.v_base[2] = f.pools[5];
    assert_int_equal(loom__kv_desc_check(&d, 8), LOOM_OK);
    /* A window releases the entries before the first new row's reach: s1 at 9 with window 3
     * reads back to 7, block 1, so entry 0 may be released. */
    d = f.d;
    d.window = 3;
    f.block_ids[2] = LOOM_KV_NO_BLOCK;
    assert_int_equal(loom__kv_desc_check(&d, 8), LOOM_OK);
    d.window = 4; /* reads back to 6: still block 1 */
    assert_int_equal(loom__kv_desc_check(&d, 8), LOOM_OK);
    d.window = 11; /* back to position 0: block 0 is needed */
    expect(&d, LOOM_ERR_BAD_INPUT, "table entry 0");
    f.block_ids[2] = 0;
    /* FP8 pages with per-head scales: the check knows them (backends decide if they run). */
    d = f.d;
    d.kv_type = LOOM_TYPE_FP8_E4M3;
    d.token_stride = 2 * 4;
    d.block_stride = 4 * 2 * 4;
    d.scale_kind = LOOM_KV_SCALE_PER_HEAD;
    d.k_scale = f.k_scale;
    d.v_scale = f.v_scale;
    assert_int_equal(loom__kv_desc_check(&d, 8), LOOM_OK);
    d.scale_kind = LOOM_KV_SCALE_PER_TOKEN_HEAD;
    d.scale_token_stride = 2 * sizeof(float);
    d.scale_block_stride = 4 * 2 * sizeof(float);
    assert_int_equal(loom__kv_desc_check(&d, 8), LOOM_OK);
    d.scale_block_stride = 4;
    expect(&d, LOOM_ERR_INVALID_ARG, "scale strides");
    d = f.d;
    d.scale_kind = LOOM_KV_SCALE_PER_HEAD; /* no scale arrays */
    expect(&d, LOOM_ERR_INVALID_ARG, "no K/V scales");
    /* An empty step. */
    int32_t zq[3] = {0, 0, 0}, pos[2] = {4, 0}, len[2] = {4, 0};
    d = f.d;
    d.q_start = zq;
    d.pos_start = pos;
    d.kv_len = len;
    assert_int_equal(loom__kv_desc_check(&d, 0), LOOM_OK);
}

static void test_structure(void **state) {
    (void)state;
    fixture f;
    fixture_init(&f);
    loom_kv_desc d;
    expect(NULL, LOOM_ERR_INVALID_ARG, "NULL");
    d = f.d, d.n_seqs = -1;
    expect(&d, LOOM_ERR_INVALID_ARG, "n_seqs");
    d = f.d, d.block_size = 0;
    expect(&d, LOOM_ERR_INVALID_ARG, "block_size");
    d = f.d, d.n_layers = 0;
    expect(&d, LOOM_ERR_INVALID_ARG, "n_layers");
    d = f.d, d.window = -1;
    expect(&d, LOOM_ERR_INVALID_ARG, "window");
    d = f.d, d.token_stride = 8;
    expect(&d, LOOM_ERR_INVALID_ARG, "token_stride");
    d = f.d, d.token_stride = 17;
    expect(&d, LOOM_ERR_INVALID_ARG, "token_stride");
    d = f.d, d.block_stride = 60;
    expect(&d, LOOM_ERR_INVALID_ARG, "block_stride");
    d = f.d, d.n_blocks = INT32_MAX, d.block_stride = SIZE_MAX / 4 * 2;
    expect(&d, LOOM_ERR_INVALID_ARG, "overflows");
    d = f.d, d.k_base = NULL;
    expect(&d, LOOM_ERR_INVALID_ARG, "pool bases");
    d = f.d, f.k_base[1] = NULL;
    expect(&d, LOOM_ERR_INVALID_ARG, "layer 1 has no K/V pool");
    f.k_base[1] = (char *)f.pools[2] + 1;
    expect(&d, LOOM_ERR_INVALID_ARG, "element-aligned");
    f.k_base[1] = f.pools[2];
    int32_t src[3] = {0, 1, 5};
    d = f.d, d.layer_src = src;
    expect(&d, LOOM_ERR_INVALID_ARG, "layer_src[2] = 5");
    int32_t chain[3] = {0, 0, 1}; /* layer 2 reads layer 1, which reads layer 0 */
    d.layer_src = chain;
    expect(&d, LOOM_ERR_INVALID_ARG, "a source reads its own");
    d = f.d, d.indptr = NULL;
    expect(&d, LOOM_ERR_INVALID_ARG, "missing");
    d = f.d, d.kv_len = NULL;
    expect(&d, LOOM_ERR_INVALID_ARG, "missing");
    int32_t q0[3] = {1, 5, 8};
    d = f.d, d.q_start = q0;
    expect(&d, LOOM_ERR_INVALID_ARG, "q_start[0]");
    int32_t qdown[3] = {0, 5, 4};
    d = f.d, d.q_start = qdown;
    expect(&d, LOOM_ERR_INVALID_ARG, "decreases");
    int32_t idown[3] = {0, 3, 2};
    d = f.d, d.indptr = idown;
    expect(&d, LOOM_ERR_INVALID_ARG, "decreases");
    d = f.d;
    assert_int_equal(loom__kv_desc_check(&d, 7), LOOM_ERR_INVALID_ARG); /* the step has 7 rows */
    assert_non_null(strstr(loom_last_error(), "8 new rows"));
    d = f.d, d.block_ids = NULL;
    expect(&d, LOOM_ERR_INVALID_ARG, "block_ids");
}

static void test_unsupported(void **state) {
    (void)state;
    fixture f;
    fixture_init(&f);
    loom_kv_desc d;
    d = f.d, d.kv_type = LOOM_TYPE_Q8_0;
    expect(&d, LOOM_ERR_UNSUPPORTED, "not a KV element type");
    d = f.d, d.kv_type = (loom_type)0x1ff;
    expect(&d, LOOM_ERR_UNSUPPORTED, "not a KV element type");
    d = f.d, d.layout = (loom_kv_layout)3;
    expect(&d, LOOM_ERR_UNSUPPORTED, "layout");
    d = f.d, d.scale_kind = (loom_kv_scale_kind)9;
    d.k_scale = f.k_scale, d.v_scale = f.v_scale;
    expect(&d, LOOM_ERR_UNSUPPORTED, "scale kind");
}

static void test_positions(void **state) {
    (void)state;
    fixture f;
    fixture_init(&f);
    loom_kv_desc d = f.d;
    /* a block id past the pool, or negative, inside what the step touches */
    const int32_t bad_ids[] = {8, -1, INT32_MAX};
    for (size_t i = 0; i < sizeof bad_ids / sizeof *bad_ids; i++) {
        f.block_ids[4] = bad_ids[i];
        expect(&d, LOOM_ERR_BAD_INPUT, "block id");
        assert_non_null(strstr(loom_last_error(), "sequence 1"));
    }
    f.block_ids[4] = 3;
    /* a table too short for the last new row (s1's position 11 needs entry 2) */
    int32_t short_indptr[3] = {0, 2, 4};
    d = f.d, d.indptr = short_indptr;
    expect(&d, LOOM_ERR_BAD_INPUT, "needs block 2");
    /* kv_len must be pos_start + new rows */
    int32_t len[2] = {5, 11};
    d = f.d, d.kv_len = len;
    expect(&d, LOOM_ERR_BAD_INPUT, "kv_len 11");
    int32_t pos[2] = {-1, 9}, len2[2] = {4, 12};
    d = f.d, d.pos_start = pos, d.kv_len = len2;
    expect(&d, LOOM_ERR_BAD_INPUT, "pos_start -1");
    assert_int_equal(loom__kv_desc_check(&f.d, 8), LOOM_OK); /* the fixture is unharmed */
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sound),
        cmocka_unit_test(test_structure),
        cmocka_unit_test(test_unsupported),
        cmocka_unit_test(test_positions),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
