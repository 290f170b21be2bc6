/* hist.c - the quantile of a magnitude histogram (hist.h). */
#include "predict/hist.h"

#include <float.h>
#include <math.h>

float si_hist_pick(const uint64_t *h, double S, double *below)
{
    uint64_t total = 0;
    for (size_t b = 0; b < SI_HIST_BINS; b++)
        total += h[b];
    *below = 0;
    if (S <= 0 || total == 0)
        return 0.0f;
    const double want = S * (double)total;
    double best_d = INFINITY;
    size_t best = 0;
    uint64_t cum = 0, best_cum = 0;
    for (size_t b = 0; b < SI_HIST_BINS; b++) {
        cum += h[b];
        const double d = fabs((double)cum - want);
        if (d < best_d) {
            best_d = d;
            best = b;
            best_cum = cum;
        }
        if ((double)cum >= want)
            break;
    }
    *below = (double)best_cum / (double)total;
    /* Bins above 0x7f7fffff >> SI_HIST_SHIFT hold infinities and NaNs. */
    if (best >= (size_t)(0x7f7fffffu >> SI_HIST_SHIFT))
        return FLT_MAX;
    const uint32_t bits = (uint32_t)((best + 1) << SI_HIST_SHIFT) - 1u;
    float t;
    memcpy(&t, &bits, sizeof t);
    return t;
}
