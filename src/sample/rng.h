/* rng.h — a counter-based random number generator: the value drawn depends only on
 * (seed, counter), never on what was drawn before, the thread, or the batch. */
#pragma once

#include <stdint.h>

/* A 64-bit mix (the splitmix64 finalizer, a published constant set) of seed and counter. */
static inline uint64_t loom__rng_u64(uint64_t seed, uint64_t counter) {
    uint64_t z = seed ^ (counter * 0x9E3779B97F4A7C15ull + 0x632BE59BD9B4E019ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    /* A second round decorrelates neighbouring counters under the same seed. */
    z += 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* Uniform double in [0, 1) with 53 random bits. */
static inline double loom__rng_uniform(uint64_t seed, uint64_t counter) {
    return (double)(loom__rng_u64(seed, counter) >> 11) * (1.0 / 9007199254740992.0);
}
