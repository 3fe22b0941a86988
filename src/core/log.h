/* log.h — the library's log lines, routed to the sink set by loom_log_set. */
#pragma once

#include "core/status.h"

void loom__log(loom_log_level level, const char *fmt, ...) LOOM_PRINTF(2, 3);

#define LOOM_LOG_D(...) loom__log(LOOM_LOG_DEBUG, __VA_ARGS__)
#define LOOM_LOG_I(...) loom__log(LOOM_LOG_INFO, __VA_ARGS__)
#define LOOM_LOG_W(...) loom__log(LOOM_LOG_WARN, __VA_ARGS__)
#define LOOM_LOG_E(...) loom__log(LOOM_LOG_ERROR, __VA_ARGS__)
