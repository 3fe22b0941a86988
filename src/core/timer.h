/* timer.h — a monotonic clock for load and throughput figures, and for the trace's phase
 * timestamps. */
#pragma once

#include <stdint.h>
#include <time.h>

static inline double loom__now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

/* Nanoseconds of the same clock as an integer: phase boundaries are differences of these, so
 * adjacent phases share an exact endpoint and their durations add up to the step's. */
static inline int64_t loom__now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + (int64_t)ts.tv_nsec;
}
