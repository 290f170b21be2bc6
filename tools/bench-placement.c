/*
 * bench-placement.c - how long the placement ILP takes on a LLaMA-70B-shaped
 * instance: 80 layers x 28672 FFN neurons (35,840 batches of 64), neurons of
 * a Q4_0 70B model as the engine stores them, synthetic power-law activation
 * frequencies, C_l from a hardware model with two values of T_sync, GPU
 * capacities from 2% to 70% of the FFN bytes.  Exits 1 if a solve stops at
 * its time limit.  `make bench-placement`; the paper's figure is about 10 s.
 *
 *   bench-placement [--layers N] [--ff N] [--time-limit S] [--no-cuts]
 */
#include "placement/ilp.h"
#include "starinfer.h"

#include <inttypes.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* xorshift64*: reproducible counts without libc's rand */
static uint64_t rng = 0x9E3779B97F4A7C15ull;
static double uniform(void)
{
    rng ^= rng >> 12;
    rng ^= rng << 25;
    rng ^= rng >> 27;
    return (double)((rng * 2685821657736338717ull) >> 11) * 0x1.0p-53;
}

int main(int argc, char **argv)
{
    int32_t n_layer = 80, n_ff = 28672;
    double limit = 60.0;
    bool cuts = true;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--layers") && i + 1 < argc)
            n_layer = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--ff") && i + 1 < argc)
            n_ff = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--time-limit") && i + 1 < argc)
            limit = atof(argv[++i]);
        else if (!strcmp(argv[i], "--no-cuts"))
            cuts = false;
        else {
            fprintf(stderr, "usage: bench-placement [--layers N] [--ff N] [--time-limit S] "
                            "[--no-cuts]\n");
            return 2;
        }
    }
    if (n_layer < 1 || n_ff < 1 || !(limit > 0)) {
        fprintf(stderr, "bench-placement: bad sizes or time limit\n");
        return 2;
    }
    const size_t n = (size_t)n_layer * (size_t)n_ff;
    double *impact = malloc(n * sizeof *impact);
    int64_t *bytes = malloc((size_t)n_layer * sizeof *bytes);
    int64_t *cmin = malloc((size_t)n_layer * sizeof *cmin);
    int32_t *perm = malloc((size_t)n_ff * sizeof *perm);
    if (!impact || !bytes || !cmin || !perm) {
        fprintf(stderr, "bench-placement: out of memory\n");
        return 1;
    }
    /* Frequencies p(t) = min(0.99, A t^-alpha) over ranks t, alpha varying
     * by layer around 0.8 (a few percent of neurons fire for most tokens,
     * most rarely), shuffled ranks, rounded to counts of 10,000 tokens as a
     * profile would give them (so many neurons tie). */
    const double tokens = 10000;
    for (int32_t l = 0; l < n_layer; l++) {
        const double alpha = 0.6 + 0.4 * (double)l / (double)n_layer;
        for (int32_t i = 0; i < n_ff; i++)
            perm[i] = i;
        for (int32_t i = n_ff - 1; i > 0; i--) {
            int32_t j = (int32_t)(uniform() * (i + 1)), t = perm[i];
            perm[i] = perm[j];
            perm[j] = t;
        }
        for (int32_t t = 0; t < n_ff; t++) {
            double p = fmin(0.99, 0.9 * pow((double)(t + 1), -alpha));
            double c = floor(p * tokens * (0.9 + 0.2 * uniform()) + 0.5);
            impact[(size_t)l * n_ff + perm[t]] = fmin(c, tokens) / tokens;
        }
    }
    /* A Q4_0 neuron of LLaMA-70B (d = 8192): gate, up and down_t rows of
     * 8192 / 32 blocks of 18 bytes, plus bias and index (the engine's unit). */
    const int64_t nb = (int64_t)8192 / 32 * 18 * 3 + 8;
    /* C_l for 50 GB/s CPU, 1.5 TB/s GPU: T_sync / (M/B_cpu - M/B_gpu).  T_sync
     * 30 us (C_l = 113 neurons, under two batches: every layer gets GPU
     * neurons and the ILP's choice is near the greedy one), then 1 ms (C_l =
     * 3,775: at small capacities only some layers can have GPU neurons, the
     * per-layer binaries decide which). */
    const double tcpu = (double)nb / 50e9, tgpu = (double)nb / 1.5e12;
    const int64_t total = (int64_t)n * nb;
    const struct {
        double tsync, share;
    } runs[] = {{30e-6, 0.10}, {30e-6, 0.40}, {30e-6, 0.70},
                {1e-3, 0.02}, {1e-3, 0.05}, {1e-3, 0.10}};
    int worst = 0;
    for (size_t k = 0; k < sizeof runs / sizeof runs[0]; k++) {
        for (int32_t l = 0; l < n_layer; l++) {
            bytes[l] = nb;
            cmin[l] = (int64_t)ceil(runs[k].tsync / (tcpu - tgpu));
        }
        if (k == 0 || runs[k].tsync != runs[k - 1].tsync)
            printf("instance: %d layers x %d neurons, %" PRId64 " batches of 64, %.2f GB of FFN "
                   "neurons, T_sync %.0f us: C_l = %" PRId64 " neurons, chain cuts %s\n",
                   n_layer, n_ff, ((int64_t)n_ff + 63) / 64 * n_layer, (double)total / 1e9,
                   runs[k].tsync * 1e6, cmin[0], cuts ? "on" : "off");
        struct si_ilp_problem p = si_ilp_default_problem();
        p.n_layer = n_layer;
        p.n_ff = n_ff;
        p.impact = impact;
        p.neuron_bytes = bytes;
        p.c_min = cmin;
        p.capacity = (int64_t)(runs[k].share * (double)total);
        p.time_limit = limit;
        p.chain_cuts = cuts;
        struct si_ilp_result r;
        char err[256];
        int rc = si_ilp_solve(&p, &r, err, sizeof err);
        if (rc != SI_OK) {
            fprintf(stderr, "bench-placement: %s\n", err);
            return 1;
        }
        int64_t on = 0;
        for (int32_t l = 0; l < n_layer; l++)
            on += r.n_gpu[l] > 0;
        printf("  capacity %2.0f%% (%.2f GB): %s in %.2f s, %" PRId64 " rows, %" PRId64
               " nodes; objective %.3f (greedy %.3f), bound %.3f, gap %.2e; %.2f GB on the GPU "
               "in %" PRId64 " of %d layers\n",
               100 * runs[k].share, (double)p.capacity / 1e9, si_ilp_outcome_name(r.outcome),
               r.seconds, r.n_rows, r.nodes, r.objective, r.greedy_objective, r.bound, r.gap,
               (double)r.gpu_bytes / 1e9, on, n_layer);
        worst |= r.outcome != SI_ILP_OPTIMAL;
        si_ilp_result_free(&r);
    }
    free(impact);
    free(bytes);
    free(cmin);
    free(perm);
    return worst;
}
