/* threadpool.h — persistent workers for per-token compute.
 *
 * loom__threadpool_run(tp, fn, arg) calls fn(arg, ith, nth) once for every ith in 0..nth-1
 * (the caller runs ith = 0) and returns when all calls have returned. Workers (and the
 * caller, for the workers) wait by spinning briefly, then yielding the CPU between looks, then
 * sleeping on a condition variable (threadpool.c says why), so back-to-back small ops cost
 * little and an idle pool costs no CPU once its wakeful time has passed. One run at a time:
 * the pool is driven by one thread (the engine's step thread). */
#pragma once

#include "loom.h"

#include <stdint.h>

/* The waiting phases: a pause spin of LOOM__TP_SPIN_NS, then yields until the pool's wakeful
 * time has passed since the wait began, then the sleep. LOOM__TP_WAKEFUL_NS suits a pool whose
 * runs come back to back (the ops of a forward pass); a pool run once in a while (sampling,
 * once per engine step) passes LOOM__TP_SPIN_NS, so that its idle threads do not contend with
 * the compute threads for the CPUs between its runs. */
#define LOOM__TP_SPIN_NS    (50 * 1000)
#define LOOM__TP_WAKEFUL_NS (LOOM__TP_SPIN_NS + 10 * 1000 * 1000)

typedef struct loom__threadpool loom__threadpool;

typedef void (*loom__task_fn)(void *arg, int ith, int nth);

/* n_threads >= 1 (the caller counts as one); wakeful_ns: how long a waiting thread stays awake
 * (at least LOOM__TP_SPIN_NS, at most 1 s). Errors: INVALID_ARG, OUT_OF_MEMORY, INTERNAL. */
loom_status loom__threadpool_create(int n_threads, int64_t wakeful_ns, loom__threadpool **out);

/* Joins the workers. NULL is a no-op. */
void loom__threadpool_destroy(loom__threadpool *tp);

int loom__threadpool_size(const loom__threadpool *tp);

void loom__threadpool_run(loom__threadpool *tp, loom__task_fn fn, void *arg);

/* Splits [0, n) into nth nearly equal contiguous ranges; thread ith gets [*begin, *end). */
static inline void loom__split_range(int64_t n, int ith, int nth, int64_t *begin, int64_t *end) {
    int64_t per = n / nth, rem = n % nth;
    *begin = ith * per + (ith < rem ? ith : rem);
    *end = *begin + per + (ith < rem ? 1 : 0);
}

/* Number of online cores (at least 1). */
int loom__cpu_count(void);
