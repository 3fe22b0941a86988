/* alloc.h — the one place libloom takes heap memory from (issue 18, item 2).
 *
 * Every allocation of src/ (but the CUDA plugin's host code, built by nvcc into a library of
 * its own) goes through these: loom__malloc, loom__calloc, loom__realloc, loom__aligned_alloc
 * and loom__free behave exactly as their libc namesakes (errno ENOMEM on failure; free() and
 * loom__free are interchangeable). tests/core/check_alloc_routing.sh fails the build's tests
 * when a direct libc allocator call creeps back in.
 *
 * In a normal build they are static inline forwards: nothing is counted, the call compiles to
 * the libc call itself. Built with -DLOOM_ALLOC_FAULTS (CMake option LOOM_ALLOC_FAULTS, tests
 * only) each allocation is counted, and a test can make the N-th allocation from now fail, as
 * sqlite's and zstd's tests do, to prove that every failure point returns a clean status,
 * leaks nothing and leaves its object usable (tests/core/test_alloc_sweep.c). */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#ifdef LOOM_ALLOC_FAULTS

/* Counts one allocation and says whether it is the one armed to fail (then errno is ENOMEM). */
bool loom__alloc_fault_hit(void);

/* Arms a single failure: the n-th allocation from now (1 = the very next) returns NULL with
 * errno ENOMEM; the ones after it succeed again. n <= 0 disarms. Thread-safe (the count is
 * atomic: the failing allocation may be on any thread). */
void loom__alloc_fault_arm(int64_t n);

/* Arms a lasting failure: every allocation from the n-th from now on fails, until the next
 * arm (n <= 0 disarms), so the cleanup after a first failure meets failures too. */
void loom__alloc_fault_arm_sticky(int64_t n);

/* Allocations counted since the process started (successful or failed). */
int64_t loom__alloc_count(void);

/* Whether the armed failure has happened since the last loom__alloc_fault_arm. */
bool loom__alloc_fault_fired(void);

/* Called (on the allocating thread) when the armed failure fires (a lasting one: the first
 * time), NULL for nothing: a test can print the stack to see which allocation it was. */
extern void (*_Atomic loom__alloc_fault_hook)(void);

static inline void *loom__malloc(size_t n) {
    return loom__alloc_fault_hit() ? NULL : malloc(n);
}
static inline void *loom__calloc(size_t count, size_t n) {
    return loom__alloc_fault_hit() ? NULL : calloc(count, n);
}
/* Fails as realloc fails: NULL, and p untouched (still the caller's to free). */
static inline void *loom__realloc(void *p, size_t n) {
    return loom__alloc_fault_hit() ? NULL : realloc(p, n);
}
static inline void *loom__aligned_alloc(size_t align, size_t n) {
    return loom__alloc_fault_hit() ? NULL : aligned_alloc(align, n);
}

#else /* a normal build: the libc calls themselves */

static inline void *loom__malloc(size_t n) {
    return malloc(n);
}
static inline void *loom__calloc(size_t count, size_t n) {
    return calloc(count, n);
}
static inline void *loom__realloc(void *p, size_t n) {
    return realloc(p, n);
}
static inline void *loom__aligned_alloc(size_t align, size_t n) {
    return aligned_alloc(align, n);
}

#endif

static inline void loom__free(void *p) {
    free(p);
}
