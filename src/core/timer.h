/* timer.h — a monotonic clock for load and throughput figures, and for the trace's phase
 * timestamps. */
#pragma once

#include <math.h>
#include <stdbool.h>
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

/* The longest finite duration a parameter may give (about 31.7 years): microseconds of it, and
 * sums of a few of them with the clock, stay far inside int64_t. */
#define LOOM__MAX_DURATION_S 1e9

/* A caller's duration in seconds as microseconds, where 0 and +inf both mean "none" (0 us).
 * Returns false for NaN, a negative value or a finite one above LOOM__MAX_DURATION_S (which a
 * plain cast would turn into undefined behaviour). */
static inline bool loom__duration_us(double s, int64_t *us) {
    if (s == INFINITY) {
        *us = 0;
        return true;
    }
    if (!(s >= 0 && s <= LOOM__MAX_DURATION_S)) return false;
    *us = (int64_t)(s * 1e6);
    return true;
}
