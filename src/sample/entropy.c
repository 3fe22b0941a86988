/* entropy.c — the streaming softmax statistics pass (see entropy.h).
 *
 * With m the running maximum of y = scale * x, the pass keeps
 *   S = sum e^(y_i - m),  T = sum e^(y_i - m) (y_i - m),  U = sum e^(y_i - m) (y_i - m)^2.
 * When a new maximum m' arrives, d = m - m' < 0 and r = e^d:
 *   S <- r S + 1,  T <- r (T + d S),  U <- r (U + 2 d T + d^2 S)   (the new entry adds e^0 * 0).
 * At the end, with p_i = e^(y_i - m) / S and ln p_i = (y_i - m) - ln S:
 *   H = ln S - T / S,   varentropy = Var_p[y - m] = U / S - (T / S)^2. */
#include "sample/entropy.h"

#include <math.h>

void loom__logit_stats_compute(const float *x, int32_t n, double scale, loom__logit_stats *out) {
    double m = -INFINITY, S = 0, T = 0, U = 0;
    int32_t n_finite = 0, argmax = -1;
    for (int32_t i = 0; i < n; i++) {
        if (!(x[i] > -INFINITY)) continue; /* -inf and NaN */
        double y = scale * (double)x[i];
        n_finite++;
        if (y > m) {
            if (argmax < 0) {
                S = 1, T = 0, U = 0;
            } else {
                double d = m - y, r = exp(d);
                if (r == 0) { /* the old mass is negligible: drop it (avoids 0 * inf) */
                    S = 1, T = 0, U = 0;
                } else {
                    U = r * (U + 2 * d * T + d * d * S);
                    T = r * (T + d * S);
                    S = r * S + 1;
                }
            }
            m = y;
            argmax = i;
        } else {
            double d = y - m, e = exp(d);
            if (e == 0) continue;
            S += e;
            T += e * d;
            U += e * d * d;
        }
    }
    out->max = m;
    out->sum = S;
    out->n_finite = n_finite;
    out->argmax = argmax;
    if (argmax < 0) {
        out->entropy = 0;
        out->varentropy = 0;
        return;
    }
    double mean = T / S; /* E_p[y - m] <= 0 */
    double h = log(S) - mean;
    double v = U / S - mean * mean;
    out->entropy = h > 0 ? h : 0;
    out->varentropy = v > 0 ? v : 0;
}
