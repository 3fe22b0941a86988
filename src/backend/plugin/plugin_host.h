/* plugin_host.h — what a backend plugin built from loom's own sources (the test-only
 * libloom-cpuplugin.so; a CUDA plugin later) links instead of libloom's public error and log
 * code (core/status.c, core/log.c): the messages core/error.c records and the lines loom__log
 * writes are handed to the host (loom_backend.h's loom_backend_host), so they reach
 * loom_last_error() and loom_log_set's sink in the application's libloom. Compiled into
 * plugins only. */
#pragma once

#include "loom_backend.h"

/* Keeps host for the plugin's lifetime (call it first in the entry point). */
void loom__plugin_set_host(const loom_backend_host *host);

/* What every plugin's loom_backend_entry does: keeps host, refuses a host of another ABI
 * version (UNSUPPORTED, naming `what` and both versions) and hands out table. */
loom_status loom__plugin_entry(uint32_t abi_version, const loom_backend_host *host,
                               const loom_backend_ops *table, const char *what,
                               const loom_backend_ops **ops);
