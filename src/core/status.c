/* status.c — loom_status_str, and the thread-local last-error message. */
#include "core/status.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#define LOOM_ERROR_CAP 512

static _Thread_local char tls_error[LOOM_ERROR_CAP];

const char *loom_status_str(loom_status status) {
    switch (status) {
#define LOOM__STATUS_CASE(name, value, desc)                                                       \
    case LOOM_##name:                                                                              \
        return desc;
        LOOM_STATUS_MAP(LOOM__STATUS_CASE)
#undef LOOM__STATUS_CASE
    }
    return "unknown status";
}

const char *loom_last_error(void) {
    return tls_error;
}

void loom__clear_error(void) {
    tls_error[0] = '\0';
}

loom_status loom__fail(loom_status status, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(tls_error, sizeof tls_error, fmt, ap);
    va_end(ap);
    return status;
}

void loom__error_prefix(const char *fmt, ...) {
    char prefix[LOOM_ERROR_CAP];
    char old[LOOM_ERROR_CAP];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    memcpy(old, tls_error, sizeof old);
    /* Assemble by hand: the message is cut at the buffer's end on purpose. */
    size_t n = strlen(prefix);
    if (n > sizeof tls_error - 3) n = sizeof tls_error - 3;
    memcpy(tls_error, prefix, n);
    memcpy(tls_error + n, ": ", 2);
    size_t room = sizeof tls_error - n - 3, m = strlen(old);
    if (m > room) m = room;
    memcpy(tls_error + n + 2, old, m);
    tls_error[n + 2 + m] = '\0';
}
