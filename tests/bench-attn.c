/*
 * bench-attn.c - si_k_attn_f16's portable code against its AVX2 twin, one
 * core, over a few head layouts and cache lengths (`make bench-attn`).
 *
 * The portable code calls the dispatched F16 dot (AVX2 here), which is what
 * si_k_attn_f16 ran before it had a twin.  Each line checks that both give
 * the same bits and prints microseconds per call (one layer, one token).
 */
#include "model/kernels.h"
#include "model/quants.h"
#include "model/quants_dispatch.h"
#include "model/quants_impl.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static uint64_t rng_state = 42;

static float uniform(void)
{
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    return (float)(rng_state >> 40) * 0x1p-24f * 2.0f - 1.0f;
}

/* Microseconds per call of fn, the best of 5 runs of enough calls. */
static double time_it(si__attn_f16_fn fn, float *out, const float *q, const uint16_t *k,
                      const uint16_t *v, int n_kv, int n_head, int n_head_kv, int hd,
                      uint16_t *scratch)
{
    double best = INFINITY;
    int reps = 1;
    for (;;) {
        double t = now();
        for (int r = 0; r < reps; r++)
            fn(out, q, k, v, 0, n_kv, 0, n_head, n_head, n_head_kv, hd, 0.1f, scratch);
        t = now() - t;
        if (t > 0.05)
            break;
        reps *= 2;
    }
    for (int run = 0; run < 5; run++) {
        double t = now();
        for (int r = 0; r < reps; r++)
            fn(out, q, k, v, 0, n_kv, 0, n_head, n_head, n_head_kv, hd, 0.1f, scratch);
        t = (now() - t) / reps;
        best = t < best ? t : best;
    }
    return best * 1e6;
}

int main(void)
{
    static const int cfg[][4] = {
        /* n_head, n_head_kv, head_dim, n_kv */
        {16, 16, 128, 50},  {16, 16, 128, 512}, {16, 16, 128, 2048}, {32, 8, 128, 50},
        {32, 8, 128, 1024}, {8, 4, 256, 50},    {8, 4, 256, 1024},   {16, 16, 64, 50},
        {16, 16, 64, 1024},
    };
    const si__attn_f16_fn fast = si__quants_active()->attn_f16;
    if (fast == NULL) {
        printf("no AVX2 attention in use (SI_NO_SIMD, or no AVX2+FMA+F16C): nothing to compare\n");
        return 0;
    }
    printf("%6s %6s %5s %6s %12s %12s %8s\n", "heads", "kv", "hd", "n_kv", "portable us",
           "avx2 us", "speedup");
    for (size_t c = 0; c < sizeof cfg / sizeof cfg[0]; c++) {
        const int nh = cfg[c][0], nkv = cfg[c][1], hd = cfg[c][2], n = cfg[c][3];
        const size_t nq = (size_t)nh * hd, nc = (size_t)n * nkv * hd;
        float *q = malloc(nq * sizeof *q), *a = malloc(nq * sizeof *a), *b = malloc(nq * sizeof *b);
        uint16_t *k = malloc(nc * sizeof *k), *v = malloc(nc * sizeof *v);
        uint16_t *s = malloc(2 * (size_t)hd * sizeof *s);
        for (size_t i = 0; i < nq; i++)
            q[i] = uniform() * 3.0f;
        for (size_t i = 0; i < nc; i++) {
            k[i] = si_fp32_to_fp16(uniform());
            v[i] = si_fp32_to_fp16(uniform() * 2.0f);
        }
        const double tp = time_it(si__k_attn_f16_portable, a, q, k, v, n, nh, nkv, hd, s);
        const double tf = time_it(fast, b, q, k, v, n, nh, nkv, hd, s);
        printf("%6d %6d %5d %6d %12.1f %12.1f %7.1fx%s\n", nh, nkv, hd, n, tp, tf, tp / tf,
               memcmp(a, b, nq * sizeof *a) == 0 ? "" : "  RESULTS DIFFER");
        free(q);
        free(a);
        free(b);
        free(k);
        free(v);
        free(s);
    }
    return 0;
}
