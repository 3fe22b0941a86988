/* hash.h — the one 64-bit mixing function behind every hash of the library: the open-addressing
 * tables (tokenizer maps, request and scheduler indexes), the prefix cache's chained block
 * hashes, and the sampler's counter-based RNG.
 *
 * loom__hash_mix64 is splitmix64's finalizer (a published constant set): a bijection on 64-bit
 * words in which every input bit reaches every output bit, so the low bits index a table well
 * (sequential ids do not cluster) and distinct inputs stay distinct. */
#pragma once

#include <stddef.h>
#include <stdint.h>

static inline uint64_t loom__hash_mix64(uint64_t x) {
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

/* A 64-bit hash of data[0 .. n), seeded: 8-byte words in host byte order mixed in one at a
 * time (a table key or a salt, not a portable digest). */
uint64_t loom__hash_bytes(const void *data, size_t n, uint64_t seed);
