/* hash.c — loom__hash_bytes and the keyed SipHash (hash.h). SipHash written from its paper
 * ("SipHash: a fast short-input PRF", Aumasson and Bernstein, 2012). */
#include "core/hash.h"

#include <stdatomic.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

uint64_t loom__hash_bytes(const void *data, size_t n, uint64_t seed) {
    const unsigned char *p = data;
    uint64_t h = loom__hash_mix64(seed ^ 0x8a5cd789635d2dffull ^ (uint64_t)n);
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t w;
        memcpy(&w, p + i, 8);
        h = loom__hash_mix64(h ^ (w * 0x9e3779b97f4a7c15ull));
    }
    uint64_t tail = 0;
    for (size_t k = 0; i + k < n; k++) tail |= (uint64_t)p[i + k] << (8 * k);
    return loom__hash_mix64(h ^ tail ^ 0x2545f4914f6cdd1dull);
}

static inline uint64_t rotl64(uint64_t x, int b) {
    return (x << b) | (x >> (64 - b));
}

#define SIP_ROUND(v0, v1, v2, v3)                                                                  \
    do {                                                                                           \
        v0 += v1;                                                                                  \
        v1 = rotl64(v1, 13) ^ v0;                                                                  \
        v0 = rotl64(v0, 32);                                                                       \
        v2 += v3;                                                                                  \
        v3 = rotl64(v3, 16) ^ v2;                                                                  \
        v0 += v3;                                                                                  \
        v3 = rotl64(v3, 21) ^ v0;                                                                  \
        v2 += v1;                                                                                  \
        v1 = rotl64(v1, 17) ^ v2;                                                                  \
        v2 = rotl64(v2, 32);                                                                       \
    } while (0)

uint64_t loom__siphash(const void *data, size_t n, const loom__hash_key *key, int c, int d) {
    const unsigned char *p = data;
    uint64_t v0 = key->k0 ^ 0x736f6d6570736575ull, v1 = key->k1 ^ 0x646f72616e646f6dull;
    uint64_t v2 = key->k0 ^ 0x6c7967656e657261ull, v3 = key->k1 ^ 0x7465646279746573ull;
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t m = 0;
        for (int k = 0; k < 8; k++) m |= (uint64_t)p[i + k] << (8 * k); /* little-endian */
        v3 ^= m;
        for (int r = 0; r < c; r++) SIP_ROUND(v0, v1, v2, v3);
        v0 ^= m;
    }
    uint64_t b = (uint64_t)(n & 0xff) << 56;
    for (size_t k = 0; i + k < n; k++) b |= (uint64_t)p[i + k] << (8 * k);
    v3 ^= b;
    for (int r = 0; r < c; r++) SIP_ROUND(v0, v1, v2, v3);
    v0 ^= b;
    v2 ^= 0xff;
    for (int r = 0; r < d; r++) SIP_ROUND(v0, v1, v2, v3);
    return v0 ^ v1 ^ v2 ^ v3;
}

loom__hash_key loom__hash_key_random(void) {
    loom__hash_key k;
    if (getrandom(&k, sizeof k, GRND_NONBLOCK) == (ssize_t)sizeof k) return k;
    static _Atomic uint64_t counter;
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    uint64_t x = (uint64_t)ts.tv_nsec ^ ((uint64_t)ts.tv_sec << 30) ^ (uint64_t)(uintptr_t)&k;
    x ^= atomic_fetch_add(&counter, 1) * 0x9e3779b97f4a7c15ull;
    k.k0 = loom__hash_mix64(x);
    k.k1 = loom__hash_mix64(k.k0 ^ 0x5851f42d4c957f2dull);
    return k;
}
