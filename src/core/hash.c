/* hash.c — loom__hash_bytes (hash.h). */
#include "core/hash.h"

#include <string.h>

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
