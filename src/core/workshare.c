/* workshare.c — per-thread shares of a run's units, drained from the front by their owner and
 * from the back by the others (workshare.h).
 *
 * A share is one 64-bit atomic holding its front (low 32 bits) and back (high 32 bits): the
 * units not yet handed out are [front, back). Taking units is one compare-and-swap that moves
 * front up (the owner, a few units) or back down (a thief, one unit), so an owner and a thief
 * can never both get a unit. Near the end of a share the owner's claims shrink to one unit, so
 * what it holds back from thieves is never much. Each share has its own cache line: an owner's
 * claims touch only its own line until a thief arrives.
 * Relaxed ordering is enough: a claim publishes nothing but the claim itself, and the pool's
 * start and end of run order everything the units read and write. */
#include "core/workshare.h"

#include "core/alloc.h"
#include "core/status.h"
#include "core/threadpool.h"

#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>

typedef struct share {
    _Alignas(64) atomic_uint_fast64_t range; /* back << 32 | front */
} share;

struct loom__workshare {
    int n_threads;
    share *shares; /* [n_threads] */
};

static uint64_t pack(uint64_t front, uint64_t back) {
    return back << 32 | front;
}

loom_status loom__workshare_create(int n_threads, loom__workshare **out) {
    LOOM_CHECK_ARG(out != NULL);
    *out = NULL;
    LOOM_RETURN_IF(n_threads < 1 || n_threads > 1024, LOOM_ERR_INVALID_ARG,
                   "workshare: %d threads (1 .. 1024)", n_threads);
    loom__workshare *ws = loom__calloc(1, sizeof *ws);
    LOOM_RETURN_IF(ws == NULL, LOOM_ERR_OUT_OF_MEMORY, "workshare: out of memory");
    ws->shares = loom__aligned_alloc(_Alignof(share), (size_t)n_threads * sizeof(share));
    if (ws->shares == NULL) {
        free(ws);
        return loom__fail(LOOM_ERR_OUT_OF_MEMORY, "workshare: out of memory for %d shares",
                          n_threads);
    }
    ws->n_threads = n_threads;
    for (int i = 0; i < n_threads; i++) atomic_init(&ws->shares[i].range, 0);
    *out = ws;
    return LOOM_OK;
}

void loom__workshare_destroy(loom__workshare *ws) {
    if (ws == NULL) return;
    free(ws->shares);
    free(ws);
}

void loom__workshare_reset(loom__workshare *ws, int64_t n) {
    for (int i = 0; i < ws->n_threads; i++) {
        int64_t b, e;
        loom__split_range(n, i, ws->n_threads, &b, &e);
        atomic_store_explicit(&ws->shares[i].range, pack((uint64_t)b, (uint64_t)e),
                              memory_order_relaxed);
    }
}

/* Most units an owner claims at once. */
#define OWNER_CHUNK_MAX 8

/* Units of share s: from its front, a quarter of what is left (1 .. OWNER_CHUNK_MAX) into
 * [*lo, *hi); from its back, one. False when the share is empty. */
static bool take(share *s, bool front, int64_t *lo, int64_t *hi) {
    uint64_t r = atomic_load_explicit(&s->range, memory_order_relaxed);
    for (;;) {
        const uint64_t f = r & 0xFFFFFFFFu, b = r >> 32;
        if (f >= b) return false;
        uint64_t n = 1;
        if (front) {
            n = (b - f) / 4;
            n = n < 1 ? 1 : n > OWNER_CHUNK_MAX ? OWNER_CHUNK_MAX : n;
        }
        const uint64_t next = front ? pack(f + n, b) : pack(f, b - 1);
        if (atomic_compare_exchange_weak_explicit(&s->range, &r, next, memory_order_relaxed,
                                                  memory_order_relaxed)) {
            *lo = (int64_t)(front ? f : b - 1);
            *hi = *lo + (int64_t)n;
            return true;
        }
    }
}

int64_t loom__workshare_claim(loom__workshare *ws, int ith, loom__workshare_cursor *cur) {
    const int n = ws->n_threads;
    for (; cur->k < n; cur->k++) {
        const int victim = ith + cur->k < n ? ith + cur->k : ith + cur->k - n;
        if (take(&ws->shares[victim], cur->k == 0, &cur->lo, &cur->hi)) return cur->lo++;
    }
    return -1;
}
