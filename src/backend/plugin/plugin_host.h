/* plugin_host.h — what a backend plugin built from loom's own sources (the test-only
 * libloom-cpuplugin.so; a CUDA plugin later) links instead of libloom's error and log code:
 * loom__fail, loom__error_prefix, loom__clear_error and loom__log (core/status.h, core/log.h)
 * keep the plugin's own thread-local message and hand every message and log line to the host
 * (loom_backend.h's loom_backend_host), so they reach loom_last_error() and loom_log_set's sink
 * in the application's libloom. Compiled into plugins only (cmake: LOOM_PLUGIN_HOST_SOURCES). */
#pragma once

#include "loom_backend.h"

/* Keeps host for the plugin's lifetime (call it first in the entry point). */
void loom__plugin_set_host(const loom_backend_host *host);
