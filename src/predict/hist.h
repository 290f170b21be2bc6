/*
 * hist.h - histograms of magnitudes in log-spaced bins, and the threshold
 * at a quantile of them: what the profiler's CATS thresholds
 * (predict/profile.h) and the input sparsity thresholds
 * (predict/input_sparsity.h) are picked from.
 *
 * A bin is the top 16 bits of |v|'s float bit pattern (its exponent and 8
 * mantissa bits: bins 2^-8 = 0.4% wide relatively, with every float, zeros,
 * subnormals, infinities and NaNs in some bin), so a histogram is
 * SI_HIST_BINS uint64 counts (512 KiB) whatever the range.
 */
#ifndef SI_PREDICT_HIST_H
#define SI_PREDICT_HIST_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#define SI_HIST_SHIFT 15
#define SI_HIST_BINS ((size_t)1 << (31 - SI_HIST_SHIFT))

/* The bin of |v|. */
static inline size_t si_hist_bin(float v)
{
    uint32_t bits;
    memcpy(&bits, &v, sizeof bits);
    return (bits & 0x7fffffffu) >> SI_HIST_SHIFT;
}

/*
 * The threshold whose share of counted values at or below it is nearest S
 * (in [0, 1)): the largest float of the bin whose cumulative count is
 * nearest S * total (FLT_MAX past the finite floats; 0 for S <= 0 or an
 * empty histogram).  The share at or below it goes to *below.
 */
float si_hist_pick(const uint64_t *h, double S, double *below);

#endif /* SI_PREDICT_HIST_H */
