/* alloc.c — the allocation counter and the armed failure of a LOOM_ALLOC_FAULTS build (see
 * alloc.h). A normal build compiles nothing here: its allocators are inline forwards. */
#include "core/alloc.h"

#ifdef LOOM_ALLOC_FAULTS

#include <errno.h>
#include <stdatomic.h>

static _Atomic int64_t g_count;  /* allocations so far */
static _Atomic int64_t g_target; /* the count at which the armed failure happens; 0: none */
static _Atomic bool g_sticky;    /* every allocation from g_target on fails */
static _Atomic bool g_fired;

void (*_Atomic loom__alloc_fault_hook)(void);

bool loom__alloc_fault_hit(void) {
    const int64_t k = atomic_fetch_add(&g_count, 1) + 1;
    int64_t target = atomic_load(&g_target);
    if (target == 0 || k < target) return false;
    /* A single failure is taken by one allocation only: the compare-exchange disarms it. */
    if (!atomic_load(&g_sticky) &&
        (k != target || !atomic_compare_exchange_strong(&g_target, &target, 0)))
        return false;
    if (!atomic_exchange(&g_fired, true)) {
        void (*hook)(void) = atomic_load(&loom__alloc_fault_hook);
        if (hook) hook();
    }
    errno = ENOMEM;
    return true;
}

static void arm(int64_t n, bool sticky) {
    atomic_store(&g_target, 0); /* nothing fires while the new target is set */
    atomic_store(&g_fired, false);
    atomic_store(&g_sticky, sticky);
    if (n > 0) atomic_store(&g_target, atomic_load(&g_count) + n);
}

void loom__alloc_fault_arm(int64_t n) {
    arm(n, false);
}

void loom__alloc_fault_arm_sticky(int64_t n) {
    arm(n, true);
}

int64_t loom__alloc_count(void) {
    return atomic_load(&g_count);
}

bool loom__alloc_fault_fired(void) {
    return atomic_load(&g_fired);
}

#endif
