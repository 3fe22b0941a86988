/* pages.h — host memory advice that works on whole pages: which pages lie inside a range
 * (mbind, madvise and the like take page-aligned ranges), and asking for huge pages. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* The whole pages inside [addr, addr + len): [*begin, *end). False when there are none (or
 * the page size is unknown). */
bool loom__whole_pages(const void *addr, size_t len, uintptr_t *begin, uintptr_t *end);

/* Asks the OS to back the whole pages of [addr, addr + len) with huge pages (Linux transparent
 * huge pages, when THP is "always" or "madvise"); call it before anything touches them. A
 * hint: elsewhere, or if refused, the memory stays as it is. */
void loom__advise_huge_pages(void *addr, size_t len);
