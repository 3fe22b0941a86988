/* pages.c — see pages.h. */
#include "core/pages.h"

#include <unistd.h>
#if defined(__linux__)
#include <sys/mman.h>
#endif

bool loom__whole_pages(const void *addr, size_t len, uintptr_t *begin, uintptr_t *end) {
    const long page = sysconf(_SC_PAGESIZE);
    if (page <= 0 || addr == NULL) return false;
    const uintptr_t a = (uintptr_t)addr, p = (uintptr_t)page;
    *begin = (a + p - 1) / p * p;
    *end = (a + len) / p * p;
    return *end > *begin;
}

void loom__advise_huge_pages(void *addr, size_t len) {
#if defined(__linux__) && defined(MADV_HUGEPAGE)
    uintptr_t begin, end;
    if (loom__whole_pages(addr, len, &begin, &end))
        (void)madvise((void *)begin, end - begin, MADV_HUGEPAGE);
#else
    (void)addr;
    (void)len;
#endif
}
