/* timer.h — a monotonic clock for load and throughput figures. */
#pragma once

#include <stdint.h>
#include <time.h>

static inline double loom__now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}
