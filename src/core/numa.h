/* numa.h — where compute threads run and where weights live on machines with several memory
 * nodes (libnuma), and the plain behaviour everywhere else.
 *
 * A plan is made once per CPU backend from the requested loom_numa_mode (loom.h):
 *   AUTO        DISTRIBUTE on a machine with more than one node, OFF otherwise;
 *   DISTRIBUTE  worker k runs on the CPUs of node k % n_nodes and weight pages are interleaved
 *               over all nodes, so every node's memory controller serves its share;
 *   ISOLATE     every worker runs on the CPUs of the node the creating thread runs on, and the
 *               weights are bound to that node;
 *   OFF         no pinning, no placement.
 * Where libnuma is missing (built without it), reports itself unavailable, or fails a call, the
 * plan falls back to OFF and the same code runs unpinned; the reason is logged once at INFO.
 * The calling thread (a backend's thread 0) is never pinned: it belongs to the application.
 *
 * Weight placement is best effort: pages of a file mapping that are already in the page cache
 * stay where they are (drop caches before loading to let the policy apply); copies made by the
 * backend are placed before they are first written. Thread-safe: plans are plain values. */
#pragma once

#include <stdbool.h>
#include <stddef.h>

#include "loom.h"

typedef struct loom__numa_plan {
    loom_numa_mode mode; /* effective: DISTRIBUTE, ISOLATE or OFF (never AUTO) */
    int n_nodes;         /* nodes libnuma reports (1 when unavailable) */
    int home_node;       /* ISOLATE: the creating thread's node */
} loom__numa_plan;

/* The plan for `requested` on this machine (see above). Never fails: problems give OFF. */
loom__numa_plan loom__numa_plan_make(loom_numa_mode requested);

/* Pins the calling thread, worker ith (>= 1) of a pool, per the plan. Returns true if the
 * thread's CPU affinity was set, false for OFF plans or when the system refused (logged). */
bool loom__numa_pin_worker(const loom__numa_plan *plan, int ith);

/* Applies the plan's memory policy to the whole pages inside [addr, addr + len). Returns true
 * if a policy was applied. */
bool loom__numa_place(const loom__numa_plan *plan, void *addr, size_t len);

/* For tests: behave as if libnuma were unavailable (true) or as detected (false). */
void loom__numa_force_unavailable(bool on);

/* Whether the library was built with libnuma. */
bool loom__numa_built_in(void);
