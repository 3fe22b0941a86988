/* threadpool.c — persistent pthread workers driven by one thread, one run at a time.
 *
 * A run publishes (fn, arg) and bumps a generation counter; each worker notices the new
 * generation, calls fn for its own ith, and decrements a pending counter; the caller runs
 * ith = 0 itself and then waits for pending to reach zero.
 *
 * Waiting, on both sides, has three phases. It spins with a pause instruction for about 50 us
 * (ops in a forward pass come microseconds apart, and a futex wake-up costs more than that);
 * then, for up to 10 ms, it yields the CPU between looks (sched_yield), staying runnable
 * without taking a CPU another task wants; then it sleeps on a condition variable so an idle
 * pool costs no CPU. Why the middle phase: on a shared machine a neighbour that runs in bursts
 * deschedules one of the run's threads for milliseconds; the others' 50 us spin then ran out,
 * they slept, and every later op of the forward paid a wake-up that itself had to wait behind
 * the neighbour. Spinning longer instead is worse when the machine is oversubscribed: a
 * spinner burns the slice the thread it waits for needs (with one always-busy neighbour on 2
 * vCPUs, a 1-3 ms pause spin fell to 3-9 tok/s from 41). Yielding keeps the thread hot and
 * gives way. bench/results/steadiness.md has the measurements (2 vCPUs, Q4_K_M, processes
 * alternated): one-sequence decode beside a neighbour busy 30% of each 50 ms went from 109 to
 * 127 tok/s, beside an always-busy one from 41 to 49, alone unchanged (171, 169). A pool run
 * once in a while (the engine's sampling pool) skips the yield phase (its wakeful time is the
 * spin's), so its idle threads leave the CPUs to the compute threads. The sleep is made
 * race-free
 * with a Dekker-style handshake on sequentially consistent atomics: a sleeper announces itself
 * (n_sleeping / caller_sleeping) under the mutex and re-checks the condition before waiting;
 * the waker changes the condition first and then looks for announced sleepers, taking the
 * mutex to signal only when there are any. With both steps seq_cst, at least one side sees
 * the other, so no wake-up is lost and the common (spinning) case never touches the mutex. */
#include "core/threadpool.h"

#include "core/alloc.h"
#include "core/status.h"
#include "core/timer.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <unistd.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define LOOM_CPU_PAUSE() _mm_pause()
#elif defined(__aarch64__)
#define LOOM_CPU_PAUSE() __asm__ __volatile__("yield")
#else
#define LOOM_CPU_PAUSE() ((void)0)
#endif

/* Call with i = 0, 1, 2, ... between looks at the awaited condition; false when it is time to
 * sleep (once wakeful_ns have passed). Pauses between looks; every 64th look reads the clock
 * and, past the spin phase, yields. The phases (threadpool.h) are timed, not counted, because
 * a pause instruction lasts from 10 to 140 cycles across x86 cores. */
static inline bool tp_keep_waiting(int64_t wakeful_ns, int i, int64_t *t0) {
    if ((i & 63) != 0) {
        LOOM_CPU_PAUSE();
        return true;
    }
    int64_t now = loom__now_ns();
    if (i == 0) {
        *t0 = now;
        return true;
    }
    int64_t waited = now - *t0;
    if (waited < LOOM__TP_SPIN_NS) return true;
    if (waited >= wakeful_ns) return false;
    sched_yield();
    return true;
}

/* More threads than this is surely a mistake (and would make the spin phase useless). */
#define LOOM_TP_MAX_THREADS 1024

typedef struct loom__tp_worker {
    loom__threadpool *tp;
    int ith;
    pthread_t thread;
} loom__tp_worker;

struct loom__threadpool {
    int n_threads;            /* including the caller */
    int64_t wakeful_ns;       /* a waiter's spin + yield time (threadpool.h); set before start */
    loom__tp_worker *workers; /* [n_threads - 1]: worker k runs ith = k + 1 */
    int n_started;            /* workers whose thread exists (for cleanup after a failed start) */

    /* Published by the caller before bumping `generation` (release); read by workers after
     * seeing it (acquire). The caller rewrites them only after `pending` reached zero. */
    loom__task_fn fn;
    void *arg;

    atomic_uint generation; /* bumped once per run (and once at shutdown) */
    atomic_int pending;     /* workers that have not finished the current run */
    atomic_bool stop;       /* set before the shutdown bump */

    pthread_mutex_t mutex;
    pthread_cond_t work_cond; /* workers sleep here for a new generation */
    pthread_cond_t done_cond; /* the caller sleeps here for pending == 0 */
    atomic_int n_sleeping;    /* workers announced on work_cond */
    atomic_bool caller_sleeping;
};

/* ------------------------------------------------------------------------------------------ */
/* Worker side                                                                                */
/* ------------------------------------------------------------------------------------------ */

/* Returns the first generation different from seen. */
static unsigned tp_wait_for_work(loom__threadpool *tp, unsigned seen) {
    int64_t t0 = 0;
    for (int i = 0; tp_keep_waiting(tp->wakeful_ns, i, &t0); i++) {
        unsigned g = atomic_load_explicit(&tp->generation, memory_order_acquire);
        if (g != seen) return g;
    }
    pthread_mutex_lock(&tp->mutex);
    atomic_fetch_add(&tp->n_sleeping, 1); /* seq_cst: pairs with the caller's bump + check */
    unsigned g;
    while ((g = atomic_load(&tp->generation)) == seen)
        pthread_cond_wait(&tp->work_cond, &tp->mutex);
    atomic_fetch_sub(&tp->n_sleeping, 1);
    pthread_mutex_unlock(&tp->mutex);
    return g;
}

static void tp_signal_done(loom__threadpool *tp) {
    /* seq_cst decrement, then the check: pairs with the caller's announce + re-check. */
    if (atomic_fetch_sub(&tp->pending, 1) != 1) return;
    if (atomic_load(&tp->caller_sleeping)) {
        pthread_mutex_lock(&tp->mutex);
        pthread_cond_signal(&tp->done_cond);
        pthread_mutex_unlock(&tp->mutex);
    }
}

static void *tp_worker_main(void *p) {
    loom__tp_worker *w = p;
    loom__threadpool *tp = w->tp;
    unsigned seen = 0; /* the pool starts at generation 0 */
    for (;;) {
        seen = tp_wait_for_work(tp, seen);
        if (atomic_load_explicit(&tp->stop, memory_order_acquire)) break;
        tp->fn(tp->arg, w->ith, tp->n_threads);
        tp_signal_done(tp);
    }
    return NULL;
}

/* ------------------------------------------------------------------------------------------ */
/* Caller side                                                                                */
/* ------------------------------------------------------------------------------------------ */

/* Bumps the generation and wakes sleeping workers (only if some announced themselves). */
static void tp_publish(loom__threadpool *tp) {
    atomic_fetch_add(&tp->generation, 1); /* seq_cst: pairs with the workers' announce */
    if (atomic_load(&tp->n_sleeping) > 0) {
        pthread_mutex_lock(&tp->mutex);
        pthread_cond_broadcast(&tp->work_cond);
        pthread_mutex_unlock(&tp->mutex);
    }
}

static void tp_wait_done(loom__threadpool *tp) {
    int64_t t0 = 0;
    for (int i = 0; tp_keep_waiting(tp->wakeful_ns, i, &t0); i++)
        if (atomic_load_explicit(&tp->pending, memory_order_acquire) == 0) return;
    pthread_mutex_lock(&tp->mutex);
    atomic_store(&tp->caller_sleeping, true);
    while (atomic_load(&tp->pending) != 0) pthread_cond_wait(&tp->done_cond, &tp->mutex);
    atomic_store(&tp->caller_sleeping, false);
    pthread_mutex_unlock(&tp->mutex);
}

void loom__threadpool_run(loom__threadpool *tp, loom__task_fn fn, void *arg) {
    if (tp->n_threads == 1) {
        fn(arg, 0, 1);
        return;
    }
    tp->fn = fn;
    tp->arg = arg;
    atomic_store_explicit(&tp->pending, tp->n_threads - 1, memory_order_relaxed);
    tp_publish(tp); /* the seq_cst bump also releases fn, arg and pending */
    fn(arg, 0, tp->n_threads);
    tp_wait_done(tp);
}

int loom__threadpool_size(const loom__threadpool *tp) {
    return tp ? tp->n_threads : 0;
}

/* ------------------------------------------------------------------------------------------ */
/* Lifetime                                                                                   */
/* ------------------------------------------------------------------------------------------ */

static void tp_free(loom__threadpool *tp) {
    pthread_cond_destroy(&tp->done_cond);
    pthread_cond_destroy(&tp->work_cond);
    pthread_mutex_destroy(&tp->mutex);
    free(tp->workers);
    free(tp);
}

/* Stops and joins the started workers. */
static void tp_shutdown(loom__threadpool *tp) {
    atomic_store_explicit(&tp->stop, true, memory_order_release);
    tp_publish(tp);
    for (int k = 0; k < tp->n_started; k++) pthread_join(tp->workers[k].thread, NULL);
    tp->n_started = 0;
}

loom_status loom__threadpool_create(int n_threads, int64_t wakeful_ns, loom__threadpool **out) {
    LOOM_CHECK_ARG(out != NULL);
    LOOM_RETURN_IF(n_threads < 1 || n_threads > LOOM_TP_MAX_THREADS, LOOM_ERR_INVALID_ARG,
                   "threadpool: n_threads %d outside [1, %d]", n_threads, LOOM_TP_MAX_THREADS);
    LOOM_RETURN_IF(wakeful_ns < LOOM__TP_SPIN_NS || wakeful_ns > 1000000000, LOOM_ERR_INVALID_ARG,
                   "threadpool: wakeful time %lld ns outside [%d, 1e9]", (long long)wakeful_ns,
                   LOOM__TP_SPIN_NS);

    loom__threadpool *tp = loom__calloc(1, sizeof *tp);
    LOOM_RETURN_IF(tp == NULL, LOOM_ERR_OUT_OF_MEMORY, "threadpool: out of memory");
    tp->n_threads = n_threads;
    tp->wakeful_ns = wakeful_ns;
    atomic_init(&tp->generation, 0);
    atomic_init(&tp->pending, 0);
    atomic_init(&tp->stop, false);
    atomic_init(&tp->n_sleeping, 0);
    atomic_init(&tp->caller_sleeping, false);
    if (pthread_mutex_init(&tp->mutex, NULL) != 0) {
        free(tp);
        return loom__fail(LOOM_ERR_INTERNAL, "threadpool: pthread_mutex_init failed");
    }
    if (pthread_cond_init(&tp->work_cond, NULL) != 0) {
        pthread_mutex_destroy(&tp->mutex);
        free(tp);
        return loom__fail(LOOM_ERR_INTERNAL, "threadpool: pthread_cond_init failed");
    }
    if (pthread_cond_init(&tp->done_cond, NULL) != 0) {
        pthread_cond_destroy(&tp->work_cond);
        pthread_mutex_destroy(&tp->mutex);
        free(tp);
        return loom__fail(LOOM_ERR_INTERNAL, "threadpool: pthread_cond_init failed");
    }

    if (n_threads > 1) {
        tp->workers = loom__calloc((size_t)(n_threads - 1), sizeof *tp->workers);
        if (tp->workers == NULL) {
            tp_free(tp);
            return loom__fail(LOOM_ERR_OUT_OF_MEMORY, "threadpool: out of memory");
        }
    }
    for (int k = 0; k < n_threads - 1; k++) {
        loom__tp_worker *w = &tp->workers[k];
        w->tp = tp;
        w->ith = k + 1;
        int rc = pthread_create(&w->thread, NULL, tp_worker_main, w);
        if (rc != 0) {
            tp_shutdown(tp);
            tp_free(tp);
            return loom__fail(LOOM_ERR_INTERNAL,
                              "threadpool: pthread_create failed (%d) for "
                              "thread %d of %d",
                              rc, k + 1, n_threads);
        }
        tp->n_started++;
    }
    *out = tp;
    return LOOM_OK;
}

void loom__threadpool_destroy(loom__threadpool *tp) {
    if (tp == NULL) return;
    tp_shutdown(tp);
    tp_free(tp);
}

int loom__cpu_count(void) {
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    if (n < 1) return 1;
    if (n > LOOM_TP_MAX_THREADS) return LOOM_TP_MAX_THREADS;
    return (int)n;
}
