/* log.c — a process-wide log sink with a level filter. */
#include "core/log.h"

#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>

/* Zero-initialised (NULL): an explicit initializer of an _Atomic pointer is an error for some
 * compilers (clang 16). */
static _Atomic(loom_log_fn) g_log_fn;
static _Atomic(void *) g_log_user;
static _Atomic int g_log_min = LOOM_LOG_WARN;

void loom_log_set(loom_log_fn fn, loom_log_level min_level, void *user_data) {
    atomic_store(&g_log_user, user_data);
    atomic_store(&g_log_fn, fn);
    atomic_store(&g_log_min, (int)min_level);
}

void loom__log(loom_log_level level, const char *fmt, ...) {
    if ((int)level < atomic_load(&g_log_min)) return;
    char line[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    loom_log_fn fn = atomic_load(&g_log_fn);
    if (fn) {
        fn(level, line, atomic_load(&g_log_user));
        return;
    }
    static const char *names[] = {"debug", "info", "warn", "error", "none"};
    fprintf(stderr, "loom %s: %s\n", names[level <= LOOM_LOG_NONE ? level : LOOM_LOG_NONE], line);
}
