/* abi.h — loom.h's parameter and result structs across versions ("ABI across versions" in
 * loom.h): each begins with `size_t size`, the caller's sizeof; these copy the part both sides
 * know. */
#pragma once

#include <stddef.h>

#include "loom.h"

/* A caller's parameter struct into dst, which holds the library's defaults (own bytes, its
 * size field included): the caller's first min(caller size, own) bytes replace them, and
 * dst->size becomes own. caller NULL keeps the defaults. min: the smallest size the struct
 * ever had (the end of its first version's last field). what names it in messages.
 * Errors: INVALID_ARG (a size below min), UNSUPPORTED (a caller built against a newer header
 * set a field past own: a non-zero byte there). */
loom_status loom__abi_params_in(void *dst, size_t own, const void *caller, size_t min,
                                const char *what);

/* A result the library filled (src, own bytes) into the caller's struct, whose size field says
 * how many bytes it has: the first min(that, own) are written, and its size stays. Errors:
 * INVALID_ARG (NULL, a size below min). */
loom_status loom__abi_result_out(void *caller, const void *src, size_t own, size_t min,
                                 const char *what);

/* Zeroes p[0 .. size) and sets its size field. */
void loom__abi_init(void *p, size_t size);

/* *_params_init: the library's defaults (own bytes) into the caller's p[0 .. size): zeroed,
 * then the common prefix copied, and p's size field set to size. p NULL or size too small to
 * hold the size field: nothing is written. */
void loom__abi_defaults_out(void *p, size_t size, const void *defaults, size_t own);

/* The end of a struct's field: the smallest size a struct holding it can have. */
#define LOOM__ABI_END(type, field) (offsetof(type, field) + sizeof(((type *)0)->field))
