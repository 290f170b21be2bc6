/*
 * test-act.c - the activation functions of model/act.h against their
 * definitions:
 *
 *   - si_act_f16_round equals the software fp32 -> fp16 -> fp32 conversion
 *     (quants.h) on every float whose low byte is one of a few patterns (so
 *     every fp16 rounding case: ties, carries, subnormals, overflow) and on
 *     random ones; NaN stays NaN;
 *   - si_act_exp within 2 ulp of exp() in double over its whole range, the
 *     results that are fp32 subnormals within 2 of their ulps, overflow to
 *     infinity above 88.73, zero below -104, exact 1 at 0, NaN for NaN;
 *   - SiLU x / (1 + e^-x) within 4.5 ulp of its double value on [-80, 90]
 *     (below -88.7, 1 + e^-x overflows and SiLU gives -0, as llama.cpp's);
 *   - GELU: 0 at or below -10, x at or above 10, and in between a value of
 *     fp16 precision that depends only on x rounded to fp16, within an fp16
 *     ulp of the double tanh approximation at that rounded input (plus the
 *     float formula's error where 1 + tanh cancels).
 */
#include "model/act.h"
#include "model/quants.h"
#include "test.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

static uint64_t rng_state = 0x616374ull;

/* splitmix64. */
static uint64_t rng(void)
{
    uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* The float ulp at |v| (subnormal spacing below the normal range). */
static double ulp_of(double v)
{
    v = fabs(v);
    if (v < 0x1p-126)
        return 0x1p-149;
    int e;
    frexp(v, &e); /* v = m 2^e, 0.5 <= m < 1 */
    return ldexp(1.0, e - 24);
}

static void test_f16_round(void)
{
    const uint32_t low[] = {0x00, 0x01, 0x80, 0xff, 0x7f};
    long bad = 0, n = 0;
    for (size_t l = 0; l < sizeof low / sizeof low[0]; l++) {
        for (uint64_t top = 0; top < (1u << 24); top++, n++) {
            const float x = si_act_float((uint32_t)(top << 8) | low[l]);
            const float want = si_fp16_to_fp32(si_fp32_to_fp16(x)), got = si_act_f16_round(x);
            if (isnan(want) ? !isnan(got) : memcmp(&want, &got, sizeof got) != 0)
                if (bad++ < 5)
                    fprintf(stderr, "f16 round %g: %g, want %g\n", (double)x, (double)got,
                            (double)want);
        }
    }
    for (int i = 0; i < 1000000; i++, n++) {
        const float x = si_act_float((uint32_t)rng());
        const float want = si_fp16_to_fp32(si_fp32_to_fp16(x)), got = si_act_f16_round(x);
        if (isnan(want) ? !isnan(got) : memcmp(&want, &got, sizeof got) != 0)
            bad++;
    }
    CHECK(bad == 0, "si_act_f16_round: %ld of %ld floats differ from the fp16 conversion", bad, n);
}

/* |got - want| in ulps of want (inf: one is infinite and the other not). */
static double ulp_err(double got, double want)
{
    if (isinf(want) || isinf(got))
        return got == want ? 0 : INFINITY;
    return fabs(got - want) / ulp_of(want);
}

static void test_exp(void)
{
    double worst = 0;
    long n = 0, bad = 0;
    /* Every float in [-104, 89] is too many: a dense random sample, plus
     * the neighbourhoods of the range reduction's boundaries. */
    for (int i = 0; i < 4000000; i++, n++) {
        const float x = -104.0f + 193.0f * (float)((double)(rng() >> 11) * 0x1p-53);
        double want = exp((double)x);
        if (want > 0x1.fffffep127)
            want = INFINITY;
        const double got = si_act_exp(x), err = ulp_err(got, want);
        worst = err > worst ? err : worst;
        if (!(err <= 2.0) && bad++ < 5)
            fprintf(stderr, "exp(%a) = %a, want %a (%.2f ulp)\n", (double)x, got, want, err);
    }
    for (int k = -150; k <= 128; k++) { /* x near k ln 2: n = k or k - 1 */
        float x = (float)(k * 0.6931471805599453);
        for (int d = 0; d < 4; d++, n++, x = nextafterf(x, INFINITY)) {
            double want = exp((double)x);
            if (want > 0x1.fffffep127)
                want = INFINITY;
            const double got = si_act_exp(x), err = ulp_err(got, want);
            worst = err > worst ? err : worst;
            if (!(err <= 2.0) && bad++ < 5)
                fprintf(stderr, "exp(%a) = %a, want %a (%.2f ulp)\n", (double)x, got, want,
                        err);
        }
    }
    CHECK(bad == 0, "si_act_exp: %ld of %ld arguments more than 2 ulp off", bad, n);
    CHECK(si_act_exp(0.0f) == 1.0f && si_act_exp(-0.0f) == 1.0f, "exp(0) is not 1");
    CHECK(isinf(si_act_exp(89.0f)) && isinf(si_act_exp(INFINITY)), "exp(89) and exp(inf) not inf");
    CHECK(si_act_exp(-105.0f) == 0.0f && si_act_exp(-INFINITY) == 0.0f,
          "exp(-105) and exp(-inf) not 0");
    CHECK(isnan(si_act_exp(NAN)), "exp(NaN) is not NaN");
    printf("si_act_exp: %ld arguments, worst %.3f ulp\n", n, worst);
}

static void test_silu(void)
{
    double worst = 0;
    long bad = 0;
    for (int i = 0; i < 1000000; i++) {
        const float x = -80.0f + 170.0f * (float)((double)(rng() >> 11) * 0x1p-53);
        const double want = (double)x / (1.0 + exp(-(double)x));
        const double got = si_act_apply(SI_ACT_SILU, x), err = ulp_err(got, want);
        worst = err > worst ? err : worst;
        if (!(err <= 4.5) && bad++ < 5)
            fprintf(stderr, "silu(%a) = %a, want %a (%.2f ulp)\n", (double)x, got, want, err);
    }
    CHECK(bad == 0, "SiLU: %ld arguments more than 4.5 ulp off", bad);
    printf("SiLU: worst %.3f ulp\n", worst);
}

static void test_gelu(void)
{
    int bad = 0;
    for (uint32_t h = 0; h < 65536; h++) {
        const float x = si_fp16_to_fp32((uint16_t)h);
        if (isnan(x) || x <= -10.0f || x >= 10.0f)
            continue;
        const double v = x;
        const double t = tanh(0.7978845608028654 * v * (1.0 + 0.044715 * v * v));
        const double want = 0.5 * v * (1.0 + t);
        const float got = si_act_apply(SI_ACT_GELU, x);
        /* an fp16 value, within one fp16 ulp of the exact one, plus the
         * float formula's error where 1 + tanh cancels (x < 0): 4 float
         * ulps of 1 times 0.5 |x| */
        const double fulp = fabs(want) < 0x1p-14 ? 0x1p-24 : ulp_of(want) * 0x1p13;
        const double tol = fulp + 0.5 * fabs(v) * 0x1p-21;
        if (si_act_f16_round(got) != got || !(fabs(got - want) <= tol))
            if (bad++ < 5)
                fprintf(stderr, "gelu(%a) = %a, want %a\n", (double)x, (double)got, want);
    }
    CHECK(bad == 0, "GELU: %d of the fp16 inputs off", bad);
    bad = 0;
    for (int i = 0; i < 1000000; i++) {
        const float x = -12.0f + 24.0f * (float)((double)(rng() >> 11) * 0x1p-53);
        const float r = si_act_f16_round(x);
        if (x > -10.0f && x < 10.0f && fabsf(r) >= 10.0f)
            continue; /* rounds to +-10: the table's value there, not the branch's */
        const float got = si_act_apply(SI_ACT_GELU, x);
        const float want = x <= -10.0f ? 0.0f : x >= 10.0f ? x : si_act_apply(SI_ACT_GELU, r);
        if (memcmp(&got, &want, sizeof got) != 0 && bad++ < 5)
            fprintf(stderr, "gelu(%a) = %a, want %a\n", (double)x, (double)got, (double)want);
    }
    CHECK(bad == 0, "GELU: %d values not those of the fp16-rounded input", bad);
    CHECK(si_act_apply(SI_ACT_GELU, -10.0f) == 0.0f && si_act_apply(SI_ACT_GELU, 10.0f) == 10.0f,
          "GELU at +-10");
}

/* si_act_gated: a * u, u through ReLU only on the relu(gate) * relu(up) FFN. */
static void test_gated(void)
{
    CHECK(si_act_gated(SI_FFN_GATED, 1.5f, -2.0f) == -3.0f, "gated: 1.5 x -2 is not -3");
    CHECK(si_act_gated(SI_FFN_GATED, -0.25f, 4.0f) == -1.0f, "gated: -0.25 x 4 is not -1");
    CHECK(si_act_gated(SI_FFN_GATED_RELU2, 1.5f, -2.0f) == 0.0f, "relu2: a negative up is not 0");
    CHECK(si_act_gated(SI_FFN_GATED_RELU2, 1.5f, 2.0f) == 3.0f, "relu2: 1.5 x 2 is not 3");
}

int main(void)
{
    test_f16_round();
    test_exp();
    test_silu();
    test_gelu();
    test_gated();
    return test_result();
}
