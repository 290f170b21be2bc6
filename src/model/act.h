/*
 * act.h - the FFN activation functions, shared by the reference forward pass,
 * the CPU FFN kernels and the CUDA ones so that all round alike.
 */
#ifndef SI_MODEL_ACT_H
#define SI_MODEL_ACT_H

#include "model/model.h"

#include <math.h>
#include <stdint.h>
#include <string.h>

/* Host code, and CUDA device code too when nvcc compiles the includer. */
#ifdef __CUDACC__
#define SI_ACT_FN static inline __host__ __device__
#else
#define SI_ACT_FN static inline
#endif

SI_ACT_FN uint32_t si_act_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

SI_ACT_FN float si_act_float(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/*
 * e^x in float as llama.cpp's CPU backend computes it inside its vectorised
 * SiLU (AVX2/FMA and the other SIMD builds), so that SiLU rounds alike:
 *
 *   n = round(x / ln 2), formed by adding 1.5 * 2^23 to x * log2(e) in one
 *       fused multiply-add (the sum's low mantissa bits are n);
 *   r = x - n ln 2, with ln 2 split in a high and a low part, two FMAs;
 *   e^r - 1 ~ r (c1 + r c2 + r^2 c3 + r^3 c4 + r^4 c5), a degree-5
 *       minimax polynomial evaluated as ((c5 r + c4) r^2 + (c3 r + c2)) r^2
 *       + c1 r with FMAs;
 *   e^x = 2^n + 2^n (e^r - 1), 2^n made by shifting n into the exponent
 *       field.  When |n| > 126, 2^n would not be a normal float: it is
 *       applied as two factors (2^127 or 2^-125 times the rest), and when
 *       |n| > 192 the result is the square of the first (inf or 0).
 *
 * Every step is a single IEEE float operation (fmaf fused), so the result is
 * the same bits on any IEEE machine.  Maximum error about 1.5 ulp.
 */
SI_ACT_FN float si_act_exp(float x)
{
    const float shift = 0x1.8p23f, log2e = 0x1.715476p+0f;
    const float ln2_hi = 0x1.62e4p-1f, ln2_lo = 0x1.7f7d1cp-20f;
    const float c1 = 0x1.ffffecp-1f, c2 = 0x1.fffdb6p-2f, c3 = 0x1.555e66p-3f,
                c4 = 0x1.573e2ep-5f, c5 = 0x1.0e4020p-7f;
    const float z = fmaf(x, log2e, shift);
    const float n = z - shift;
    const float r = fmaf(-n, ln2_lo, fmaf(-n, ln2_hi, x));
    const uint32_t e = si_act_bits(z) << 23;
    const float r2 = r * r;
    const float p = fmaf(fmaf(fmaf(c5, r, c4), r2, fmaf(c3, r, c2)), r2, c1 * r);
    if (!(fabsf(n) > 126.0f)) {
        const float k = si_act_float(e + si_act_bits(1.0f)); /* 2^n */
        return fmaf(k, p, k);
    }
    /* 2^n = s1 * s2: s1 = 2^127 for n > 0, 2^-125 for n <= 0. */
    const uint32_t g = n <= 0.0f ? 0x82000000u : 0u;
    const float s1 = si_act_float(g + 0x7f000000u), s2 = si_act_float(e - g);
    if (fabsf(n) > 192.0f)
        return s1 * s1;
    return fmaf(s2, p, s2) * s1;
}

/* sc[0..n) = e^(sc[i] - m) for n a multiple of 8, and their sum as
 * llama.cpp's tiled flash attention adds it: each group of 8 in float as
 * ((p4 + p0) + (p6 + p2)) + ((p5 + p1) + (p7 + p3)), the groups in double. */
SI_ACT_FN double si_act_exp_sum8(float *sc, int n, float m)
{
    double sum = 0.0;
    for (int g = 0; g < n; g += 8) {
        float p[8];
        for (int u = 0; u < 8; u++)
            p[u] = sc[g + u] = si_act_exp(sc[g + u] - m);
        sum += (double)(((p[4] + p[0]) + (p[6] + p[2])) + ((p[5] + p[1]) + (p[7] + p[3])));
    }
    return sum;
}

/* x rounded to the nearest fp16 value (ties to even), as a float. */
SI_ACT_FN float si_act_f16_round(float x)
{
    const uint32_t u = si_act_bits(x), sign = u & 0x80000000u;
    uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u) /* NaN */
        return x;
    if (a < 0x38800000u) /* below 2^-14: an fp16 subnormal, a multiple of 2^-24 */
        return copysignf(rintf(fabsf(x) * 0x1p24f) * 0x1p-24f, x);
    a += 0xfffu + ((a >> 13) & 1u); /* 10 mantissa bits, ties to even */
    a &= ~0x1fffu;
    if (a >= 0x47800000u) /* past 65504: infinity */
        a = 0x7f800000u;
    return si_act_float(sign | a);
}

/*
 * GELU's tanh approximation 0.5 x (1 + tanh(sqrt(2/pi) x (1 + 0.044715 x^2)))
 * as llama.cpp's CPU backend computes it, from a table of fp16 values: 0 for
 * x <= -10, x for x >= 10, else with v = x rounded to fp16, the fp16
 * rounding of (0.5 v) (1 + tanhf((sqrt(2/pi) v) fmaf(0.044715 v, v, 1))).
 */
SI_ACT_FN float si_act_gelu(float x)
{
    if (x <= -10.0f)
        return 0.0f;
    if (x >= 10.0f)
        return x;
    const float v = si_act_f16_round(x);
    const float t = tanhf(0.7978845608028654f * v * fmaf(0.044715f * v, v, 1.0f));
    return si_act_f16_round(0.5f * v * (1.0f + t));
}

/*
 * act(x): SiLU x / (1 + e^-x) with si_act_exp, ReLU max(x, 0), or GELU
 * (si_act_gelu).  Each rounds as llama.cpp's CPU backend does.
 */
SI_ACT_FN float si_act_apply(enum si_act a, float x)
{
    switch (a) {
    case SI_ACT_RELU:
        return x > 0.0f ? x : 0.0f;
    case SI_ACT_GELU:
        return si_act_gelu(x);
    case SI_ACT_SILU:
    default:
        return x / (1.0f + si_act_exp(-x));
    }
}

/*
 * A gated FFN neuron's output from its activated gate a = act(gate . x) and
 * its up projection u (bias added): a * u, with u through ReLU first on
 * Bamboo's relu(gate) * relu(up) FFN (SI_FFN_GATED_RELU2).  One definition
 * for the reference, the engine's CPU and CUDA kernels and the trainer.
 */
SI_ACT_FN float si_act_gated(enum si_ffn_kind kind, float a, float u)
{
    return a * (kind == SI_FFN_GATED_RELU2 ? si_act_apply(SI_ACT_RELU, u) : u);
}

#endif /* SI_MODEL_ACT_H */
