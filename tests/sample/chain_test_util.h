/* chain_test_util.h — what the sampler chain's tests share: a seeded xorshift64* generator
 * (uniform and gaussian draws) and a chain workspace in aligned memory, freed by the next
 * make_ws or by free_ws. Each test sets its own seed (rng_state). Include after cmocka.h. */
#pragma once

#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include "sample/chain.h"

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;

static double frand(void) {
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return (double)((rng_state * 2685821657736338717ull) >> 11) / 9007199254740992.0;
}

static double gauss(void) {
    double u = frand(), v = frand();
    return sqrt(-2 * log(u + 1e-300)) * cos(6.283185307179586 * v);
}

static void *ws_mem;

static loom__sample_chain_ws *make_ws(int32_t n_vocab) {
    size_t sz = loom__sample_chain_workspace_size(n_vocab);
    free(ws_mem);
    ws_mem = aligned_alloc(16, (sz + 15) / 16 * 16);
    assert_non_null(ws_mem);
    loom__sample_chain_ws *ws = NULL;
    assert_int_equal(loom__sample_chain_workspace_init(ws_mem, sz, n_vocab, &ws), LOOM_OK);
    return ws;
}

static void free_ws(void) {
    free(ws_mem);
    ws_mem = NULL;
}
