/* numa.c — see numa.h. libnuma when the build found it (LOOM_HAVE_LIBNUMA), the OFF plan
 * otherwise. */
#include "core/numa.h"

#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <unistd.h>

#include "core/log.h"
#include "core/pages.h"

#if defined(LOOM_HAVE_LIBNUMA)
#include <numa.h>
#endif

static atomic_bool force_unavailable;

void loom__numa_force_unavailable(bool on) {
    atomic_store(&force_unavailable, on);
}

bool loom__numa_built_in(void) {
#if defined(LOOM_HAVE_LIBNUMA)
    return true;
#else
    return false;
#endif
}

static loom__numa_plan plan_off(void) {
    loom__numa_plan p = {.mode = LOOM_NUMA_OFF, .n_nodes = 1, .home_node = 0};
    return p;
}

loom__numa_plan loom__numa_plan_make(loom_numa_mode requested) {
    if (requested == LOOM_NUMA_OFF) return plan_off();
    const char *why = NULL;
#if defined(LOOM_HAVE_LIBNUMA)
    if (atomic_load(&force_unavailable))
        why = "disabled for a test";
    else if (numa_available() < 0)
        why = "libnuma reports NUMA unavailable";
#else
    why = "built without libnuma";
#endif
    if (why) {
        if (requested != LOOM_NUMA_AUTO) LOOM_LOG_I("numa: %s; threads run unpinned", why);
        return plan_off();
    }
#if defined(LOOM_HAVE_LIBNUMA)
    loom__numa_plan p = plan_off();
    p.n_nodes = numa_num_configured_nodes();
    if (p.n_nodes < 1) p.n_nodes = 1;
    if (requested == LOOM_NUMA_AUTO) {
        if (p.n_nodes == 1) return p; /* one node: nothing to gain, leave the scheduler alone */
        requested = LOOM_NUMA_DISTRIBUTE;
    }
    const int cpu = sched_getcpu();
    const int node = cpu >= 0 ? numa_node_of_cpu(cpu) : -1;
    p.home_node = node >= 0 ? node : 0;
    p.mode = requested;
    return p;
#else
    return plan_off();
#endif
}

bool loom__numa_pin_worker(const loom__numa_plan *plan, int ith) {
#if defined(LOOM_HAVE_LIBNUMA)
    if (!plan || plan->mode == LOOM_NUMA_OFF) return false;
    const int node = plan->mode == LOOM_NUMA_ISOLATE ? plan->home_node : ith % plan->n_nodes;
    struct bitmask *cpus = numa_allocate_cpumask();
    if (!cpus) return false;
    bool ok = numa_node_to_cpus(node, cpus) == 0 && numa_sched_setaffinity(0, cpus) == 0;
    numa_free_cpumask(cpus);
    if (!ok) LOOM_LOG_I("numa: could not pin worker %d to node %d; it runs unpinned", ith, node);
    return ok;
#else
    (void)plan;
    (void)ith;
    return false;
#endif
}

bool loom__numa_place(const loom__numa_plan *plan, void *addr, size_t len) {
#if defined(LOOM_HAVE_LIBNUMA)
    if (!plan || plan->mode == LOOM_NUMA_OFF || !addr || len == 0) return false;
    uintptr_t begin, end;
    if (!loom__whole_pages(addr, len, &begin, &end)) return false;
    if (plan->mode == LOOM_NUMA_DISTRIBUTE)
        numa_interleave_memory((void *)begin, end - begin, numa_all_nodes_ptr);
    else
        numa_tonode_memory((void *)begin, end - begin, plan->home_node);
    return true;
#else
    (void)plan;
    (void)addr;
    (void)len;
    return false;
#endif
}
