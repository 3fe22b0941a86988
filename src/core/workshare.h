/* workshare.h — the units of one thread-pool run, shared out so that a slow thread does not
 * hold the others up.
 *
 * Units 0 .. n-1 are first cut into one contiguous share per thread (loom__split_range's cut).
 * A thread takes its own share's units from the front, in order, so its reads stream through
 * memory as a static split's do; once its share is empty it takes units from the back of the
 * others' shares, one at a time, until none is left anywhere. Every unit is handed out exactly
 * once.
 *
 * Why: on shared machines a thread's core often runs slower for a while (another tenant on its
 * sibling hyperthread, a preemption). With a static split every parallel op then waits for
 * that thread; here the others finish its share. In-process alternation on the CPU matmul of a
 * 16-sequence decode step (F16 weights, 2 threads): the time between the two threads' finishes
 * fell from 12-22% of the matmul time to 1.8%, and the matmul time by 8-18%.
 *
 * Which thread computes a unit must never change what the unit computes (every user here
 * writes results that depend only on the unit's index), so results are the same bits whatever
 * the timing.
 *
 * Thread-safety: loom__workshare_reset is called by the thread that drives the pool, outside a
 * run; loom__workshare_next by the run's threads, each with its own ith and cursor. The pool's
 * start of run orders the reset before every next. */
#pragma once

#include "loom.h"

#include <stdint.h>

typedef struct loom__workshare loom__workshare;

/* Most units one run can share out (a share's front and back are 32-bit). */
#define LOOM_WORKSHARE_MAX_UNITS ((int64_t)UINT32_MAX)

/* For runs of n_threads threads (1 .. 1024). Errors: INVALID_ARG, OUT_OF_MEMORY. */
loom_status loom__workshare_create(int n_threads, loom__workshare **out);

/* NULL is a no-op. */
void loom__workshare_destroy(loom__workshare *ws);

/* Starts sharing out n units (0 <= n <= LOOM_WORKSHARE_MAX_UNITS; the caller checks). */
void loom__workshare_reset(loom__workshare *ws, int64_t n);

/* A thread's place in the shares: which share it is draining, and the units it has claimed
 * from its own share but not yet returned. Start each run at LOOM_WORKSHARE_CURSOR_INIT. */
typedef struct loom__workshare_cursor {
    int k; /* 0: its own share, from the front; k > 0: share (ith + k) % n, from the back */
    int64_t lo, hi; /* claimed units lo .. hi-1 not yet returned */
} loom__workshare_cursor;
#define LOOM_WORKSHARE_CURSOR_INIT ((loom__workshare_cursor){0, 0, 0})

/* Claims more units for thread ith (loom__workshare_next's slow path). */
int64_t loom__workshare_claim(loom__workshare *ws, int ith, loom__workshare_cursor *cur);

/* The next unit for thread ith (0 <= ith < n_threads), or -1 when every unit has been handed
 * out. An owner claims its own units a few at a time (a quarter of what is left of its share,
 * at most 8): a claim is a locked instruction, which waits for the loads before it to
 * complete. */
static inline int64_t loom__workshare_next(loom__workshare *ws, int ith,
                                           loom__workshare_cursor *cur) {
    if (cur->lo < cur->hi) return cur->lo++;
    return loom__workshare_claim(ws, ith, cur);
}
