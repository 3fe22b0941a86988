/* kv_includes_sched.c — a deliberate layering violation, compiled only by test_layering: the KV
 * manager may not include the scheduler (ARCHITECTURE.md: kv and sched never include each
 * other). Built with the kv layer's include path, this file must fail to compile. */
#include "kv/kv_manager.h"
#include "sched/sched.h"

int loom__layering_probe(void);
int loom__layering_probe(void) {
    return 0;
}
