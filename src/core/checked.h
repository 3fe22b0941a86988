/* checked.h — overflow-checked size arithmetic for values read from untrusted files. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Each returns true on overflow and leaves *out unspecified; false when *out holds the result. */
static inline bool loom__mul_overflow_size(size_t a, size_t b, size_t *out) {
    return __builtin_mul_overflow(a, b, out);
}
static inline bool loom__add_overflow_size(size_t a, size_t b, size_t *out) {
    return __builtin_add_overflow(a, b, out);
}
static inline bool loom__mul_overflow_u64(uint64_t a, uint64_t b, uint64_t *out) {
    return __builtin_mul_overflow(a, b, out);
}
static inline bool loom__add_overflow_u64(uint64_t a, uint64_t b, uint64_t *out) {
    return __builtin_add_overflow(a, b, out);
}

/* Rounds x up to a multiple of align (a power of two or any positive value); true on overflow. */
static inline bool loom__align_up_u64(uint64_t x, uint64_t align, uint64_t *out) {
    uint64_t rem = x % align;
    if (rem == 0) {
        *out = x;
        return false;
    }
    return __builtin_add_overflow(x, align - rem, out);
}
