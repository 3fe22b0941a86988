/* alloc.c — the allocation counter and the armed failure of a LOOM_ALLOC_FAULTS build (see
 * alloc.h). A normal build compiles nothing here: its allocators are inline forwards. */
#include "core/alloc.h"

#ifdef LOOM_ALLOC_FAULTS

#include <errno.h>
#include <stdatomic.h>

static _Atomic int64_t g_count;  /* allocations so far */
static _Atomic int64_t g_target; /* the count at which the armed failure happens; 0: none */
static _Atomic bool g_fired;

void (*_Atomic loom__alloc_fault_hook)(void);

bool loom__alloc_fault_hit(void) {
    const int64_t k = atomic_fetch_add(&g_count, 1) + 1;
    const int64_t target = atomic_load(&g_target);
    /* One allocation is the armed one: the compare-exchange lets only one thread take it. */
    int64_t want = target;
    if (target == 0 || k != target || !atomic_compare_exchange_strong(&g_target, &want, 0))
        return false;
    atomic_store(&g_fired, true);
    void (*hook)(void) = atomic_load(&loom__alloc_fault_hook);
    if (hook) hook();
    errno = ENOMEM;
    return true;
}

void loom__alloc_fault_arm(int64_t n) {
    atomic_store(&g_fired, false);
    atomic_store(&g_target, n > 0 ? atomic_load(&g_count) + n : 0);
}

int64_t loom__alloc_count(void) {
    return atomic_load(&g_count);
}

bool loom__alloc_fault_fired(void) {
    return atomic_load(&g_fired);
}

#else
/* ISO C wants a translation unit to declare something. */
typedef int loom__alloc_unused;
#endif
