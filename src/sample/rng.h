/* rng.h — a counter-based random number generator: the value drawn depends only on
 * (seed, counter), never on what was drawn before, the thread, or the batch. */
#pragma once

#include <stdint.h>

#include "core/hash.h"

/* Two rounds of the 64-bit mix (core/hash.h) over seed and counter; the second decorrelates
 * neighbouring counters under the same seed. */
static inline uint64_t loom__rng_u64(uint64_t seed, uint64_t counter) {
    uint64_t z = loom__hash_mix64(seed ^ (counter * 0x9E3779B97F4A7C15ull + 0x632BE59BD9B4E019ull));
    return loom__hash_mix64(z + 0x9E3779B97F4A7C15ull);
}

/* Uniform double in [0, 1) with 53 random bits. */
static inline double loom__rng_uniform(uint64_t seed, uint64_t counter) {
    return (double)(loom__rng_u64(seed, counter) >> 11) * (1.0 / 9007199254740992.0);
}
