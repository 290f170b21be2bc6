/*
 * test-quants.c - tensor row conversions against float64 references written
 * here from the formats' definitions, never from the library's code:
 *   - all 65536 halves and bfloat16s to float, and float to half / bfloat16
 *     (round to nearest even) on edge values and random floats;
 *   - dequantize, dot and mad (y += a * row) of every supported type,
 *     scalar and AVX2 kernels both (AVX2 when this CPU has it), on random
 *     rows of several lengths;
 *   - the quantizers: the scale each block gets, each value's rounding, and
 *     the error bound |x - dequantize(quantize(x))|;
 *   - the quantized-activation path: si_quantize_act's bytes against a
 *     converter written here from llama.cpp's rules (ties to even included),
 *     and si_vec_dot_act against the float64 dot of the dequantized row and
 *     activations, scalar and AVX2 kernels both (for Q4_K also the same bits
 *     from both: exact integer sums, then the same fused float steps), and
 *     si_vec_dot_act_batch (llama.cpp's batch kernels) likewise.
 *
 * Tolerances: dequantize within 1e-6 of the magnitude of the terms that make
 * the value (|d*q| + |m|; the kernels round once, so this is loose); dot
 * within 1e-5 of the sum of |terms|, with quantized activations too; mad
 * within 1e-6 of |y| + |a| * (the value's terms), a few float roundings.
 */
#include "codelets/prefill.h"
#include "model/act.h"
#include "model/forward.h"
#include "model/pack8.h"
#include "model/quants.h"
#include "model/quants_dispatch.h"
#include "model/quants_impl.h"
#include "model/types.h"
#include "test.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define DEQUANT_TOL 1e-6
#define DOT_TOL 1e-5
#define MAD_TOL 1e-6

/* ------------------------------------------------------ random numbers */

/* Whether the public functions run the table named impl ("avx2+vnni" is
 * the AVX2 table with some of its dots in VNNI, the same bits). */
static bool in_use(const char *impl)
{
    const char *active = si_quants_impl();
    return strcmp(impl, active) == 0 || (!strcmp(impl, "avx2") && !strcmp(active, "avx2+vnni"));
}

static uint64_t rng_state = 0x5eed5eed1234ull;

/* splitmix64. */
static uint64_t rng(void)
{
    uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static double uniform(double lo, double hi)
{
    return lo + (hi - lo) * (double)(rng() >> 11) * 0x1p-53;
}

static uint16_t get16(const uint8_t *p)
{
    return (uint16_t)(p[0] | p[1] << 8);
}

static void put16(uint8_t *p, uint16_t v)
{
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
}

/* ------------------------------------------------------ element formats */

/* A half's value: sign, 5-bit exponent (bias 15), 10-bit fraction. */
static double ref_half(uint16_t h)
{
    int e = (h >> 10) & 31, m = h & 1023;
    double v;
    if (e == 31)
        v = m ? NAN : INFINITY;
    else if (e == 0)
        v = ldexp(m, -24);
    else
        v = ldexp(1024 + m, e - 25);
    return (h & 0x8000) ? -v : v;
}

/* A bfloat16's value: sign, 8-bit exponent (bias 127), 7-bit fraction. */
static double ref_bf16(uint16_t h)
{
    int e = (h >> 7) & 255, m = h & 127;
    double v;
    if (e == 255)
        v = m ? NAN : INFINITY;
    else if (e == 0)
        v = ldexp(m, -133);
    else
        v = ldexp(128 + m, e - 134);
    return (h & 0x8000) ? -v : v;
}

/*
 * The 16-bit pattern nearest to f, ties to the even pattern, by binary
 * search over the positive patterns 0 .. inf_bits, whose values grow with
 * the bits.  The infinity pattern stands for `past`, the value one step
 * after the largest finite one, so rounding up to it overflows.
 */
static uint16_t ref_round(float f, double (*value)(uint16_t), uint16_t inf_bits, double past)
{
    uint16_t sign = (si_act_bits(f) >> 31) ? 0x8000 : 0;
    double a = fabs((double)f);
    if (a >= past)
        return sign | inf_bits;
    uint16_t lo = 0, hi = inf_bits; /* value(lo) <= a < value(hi) */
    while (hi - lo > 1) {
        uint16_t mid = (uint16_t)((lo + hi) / 2);
        if (value(mid) <= a)
            lo = mid;
        else
            hi = mid;
    }
    double vhi = hi == inf_bits ? past : value(hi);
    double dlo = a - value(lo), dhi = vhi - a;
    uint16_t r = dlo < dhi ? lo : dhi < dlo ? hi : (lo & 1) ? hi : lo;
    return sign | r;
}

static uint16_t ref_to_half(float f)
{
    return ref_round(f, ref_half, 0x7c00, 65536.0);
}

static uint16_t ref_to_bf16(float f)
{
    return ref_round(f, ref_bf16, 0x7f80, ldexp(1, 128));
}

static bool same_value(double a, double b)
{
    if (isnan(a) || isnan(b))
        return isnan(a) && isnan(b);
    return a == b && signbit(a) == signbit(b);
}

static void test_conversions(void)
{
    int bad16 = 0, badbf = 0, badtrip = 0;
    for (uint32_t h = 0; h < 65536; h++) {
        float f = si_fp16_to_fp32((uint16_t)h);
        bad16 += !same_value(f, ref_half((uint16_t)h));
        float g = si_bf16_to_fp32((uint16_t)h);
        badbf += !same_value(g, ref_bf16((uint16_t)h));
        /* Every finite value and infinity converts back to itself; NaNs stay NaN. */
        if (isnan(f))
            badtrip += !isnan(si_fp16_to_fp32(si_fp32_to_fp16(f)));
        else
            badtrip += si_fp32_to_fp16(f) != h;
        if (isnan(g))
            badtrip += !isnan(si_bf16_to_fp32(si_fp32_to_bf16(g)));
        else
            badtrip += si_fp32_to_bf16(g) != h;
    }
    CHECK(bad16 == 0, "%d halves convert wrongly", bad16);
    CHECK(badbf == 0, "%d bfloat16s convert wrongly", badbf);
    CHECK(badtrip == 0, "%d patterns do not convert back", badtrip);

    /* The kernels' row conversion (si_quantize_act F16: F16C where there is
     * one; the KV cache's writes take it) = si_fp32_to_fp16, bit for bit,
     * over one float bit pattern in 4,099 and every pattern near the
     * specials (NaNs with their payloads, infinities, the overflow and
     * subnormal thresholds), rows of 37 (8 lanes and a scalar tail). */
    {
        enum { ROW = 37 };
        float row[ROW];
        uint16_t got[ROW];
        int badrow = 0, k = 0;
        static const uint32_t near[] = {0x7f800000u, 0x7fc00000u, 0x477ff000u,
                                        0x33000000u, 0x38800000u, 0x00000000u};
        const uint64_t spread = 0x100000000u / 4099 + 1;
        for (uint64_t x = 0; x < spread + 6 * 8192; x++) {
            uint32_t b;
            if (x < spread) {
                b = (uint32_t)(x * 4099);
            } else { /* 2,048 patterns on each side of each special, both signs */
                const uint64_t j = x - spread;
                b = (near[j / 8192] + (uint32_t)(j % 4096) - 2048u) ^
                    (j / 4096 % 2 ? 0x80000000u : 0);
            }
            memcpy(&row[k++], &b, sizeof b);
            if (k < ROW)
                continue;
            si_quantize_act(SI_TYPE_F16, row, got, ROW);
            for (int i = 0; i < ROW; i++)
                badrow += got[i] != si_fp32_to_fp16(row[i]);
            k = 0;
        }
        CHECK(badrow == 0, "%d floats convert otherwise by row than one by one", badrow);
    }

    /* Edge values: ties, subnormals, the overflow threshold. */
    const float edges[] = {
        0.0f, -0.0f, 1.0f, -1.0f, 65504.0f, 65519.99f, 65520.0f, -65520.0f, 65536.0f, 1e10f,
        0x1p-24f,                 /* smallest subnormal half */
        0x1p-25f,                 /* tie between 0 and 2^-24: 0 */
        0x1.000002p-25f,          /* just above the tie: 2^-24 */
        0x1.8p-24f,               /* tie between 1 and 2 * 2^-24: 2 */
        0x1.4p-23f,               /* 2.5 * 2^-24: tie, rounds to 2 */
        0x1p-14f,                 /* smallest normal half */
        0x1p-14f - 0x1p-25f,      /* tie between 1023 * 2^-24 and 2^-14: 2^-14 */
        0x1.ffcp-15f,             /* the largest subnormal half */
        1.0f + 0x1p-11f,          /* tie: 1 */
        1.0f + 0x3p-11f,          /* tie: 1 + 2^-9 */
        1.0f + 0x1p-8f,           /* bfloat16 tie: 1 */
        1.0f + 0x3p-8f,           /* bfloat16 tie: 1 + 2^-6 */
        0x1.fep127f,              /* bfloat16's largest finite */
        0x1.ff0002p127f,          /* above bfloat16's largest finite + half a step: inf */
        0x1.fefffep127f,          /* just below that: largest finite */
        3.4028235e38f,            /* FLT_MAX */
        1e-45f, 0x1p-126f, 0x1.8p-140f, 0x1.01p-133f, 0x1p-134f, 0x1.8p-134f,
        2.5f, 3.5f, 0.1f, 1.0f / 3.0f, 1e-8f, -1e-8f, 6e-5f, 6.1e-5f,
        INFINITY, -INFINITY,
    };
    for (size_t i = 0; i < sizeof edges / sizeof edges[0]; i++) {
        float f = edges[i];
        uint16_t h = si_fp32_to_fp16(f), rh = ref_to_half(f);
        CHECK(h == rh, "fp32 %a -> fp16 0x%04x, want 0x%04x", (double)f, h, rh);
        uint16_t b = si_fp32_to_bf16(f), rb = ref_to_bf16(f);
        CHECK(b == rb, "fp32 %a -> bf16 0x%04x, want 0x%04x", (double)f, b, rb);
        h = si_fp32_to_fp16(-f), rh = ref_to_half(-f);
        CHECK(h == rh, "fp32 %a -> fp16 0x%04x, want 0x%04x", (double)-f, h, rh);
        b = si_fp32_to_bf16(-f), rb = ref_to_bf16(-f);
        CHECK(b == rb, "fp32 %a -> bf16 0x%04x, want 0x%04x", (double)-f, b, rb);
    }
    CHECK(isnan(si_fp16_to_fp32(si_fp32_to_fp16(NAN))), "NaN -> fp16 is not NaN");
    CHECK(isnan(si_bf16_to_fp32(si_fp32_to_bf16(NAN))), "NaN -> bf16 is not NaN");
    /* A NaN whose payload sits only in the low bits must not become infinity. */
    CHECK(isnan(si_fp16_to_fp32(si_fp32_to_fp16(si_act_float(0x7f800001u)))), "low NaN -> fp16");
    CHECK(isnan(si_bf16_to_fp32(si_fp32_to_bf16(si_act_float(0xff800001u)))), "low NaN -> bf16");

    /* Random floats: any bit pattern, and ones in the half's range. */
    int bad = 0;
    for (int i = 0; i < 200000; i++) {
        uint32_t u = (uint32_t)rng();
        if (i & 1) /* exponent 100 ... 143: around the half's range */
            u = (u & 0x807fffffu) | (uint32_t)(100 + (u >> 8) % 44) << 23;
        float f = si_act_float(u);
        if (isnan(f))
            continue;
        bad += si_fp32_to_fp16(f) != ref_to_half(f);
        bad += si_fp32_to_bf16(f) != ref_to_bf16(f);
    }
    CHECK(bad == 0, "%d random floats round wrongly", bad);
}

/* ------------------------------------------------------ block layouts */

/* Scale and min of sub-block j from the 12 packed bytes of a Q4_K / Q5_K block. */
static void ref_k_scale(const uint8_t *sc, int j, int *scale, int *min)
{
    if (j < 4) {
        *scale = sc[j] & 63;
        *min = sc[j + 4] & 63;
    } else {
        *scale = (sc[j + 4] & 15) | (sc[j - 4] >> 6) << 4;
        *min = (sc[j + 4] >> 4) | (sc[j] >> 6) << 4;
    }
}

/*
 * The n values of a row of type t in double, and in mag[i] the size of the
 * terms that make value i (|d*q| + |m|), the scale of its rounding error.
 */
static void ref_dequantize(uint32_t t, const uint8_t *row, int64_t n, double *y, double *mag)
{
    const struct si_type_traits *tr = si_type_get(t);
    for (int64_t i = 0; i < n; i += tr->block) {
        const uint8_t *b = row + (size_t)(i / tr->block) * tr->size;
        double *o = y + i, *g = mag + i;
        switch (t) {
        case SI_TYPE_F32: {
            float f;
            memcpy(&f, b, 4);
            o[0] = f;
            g[0] = fabs(f);
            break;
        }
        case SI_TYPE_F16:
            o[0] = ref_half(get16(b));
            g[0] = fabs(o[0]);
            break;
        case SI_TYPE_BF16:
            o[0] = ref_bf16(get16(b));
            g[0] = fabs(o[0]);
            break;
        case SI_TYPE_Q8_0:
            for (int j = 0; j < 32; j++) {
                o[j] = ref_half(get16(b)) * (int8_t)b[2 + j];
                g[j] = fabs(o[j]);
            }
            break;
        case SI_TYPE_Q4_0:
        case SI_TYPE_Q4_1:
        case SI_TYPE_Q5_0:
        case SI_TYPE_Q5_1: {
            bool five = t == SI_TYPE_Q5_0 || t == SI_TYPE_Q5_1;
            bool has_m = t == SI_TYPE_Q4_1 || t == SI_TYPE_Q5_1;
            double d = ref_half(get16(b)), m = has_m ? ref_half(get16(b + 2)) : 0;
            const uint8_t *qh = b + (has_m ? 4 : 2);
            const uint8_t *qs = qh + (five ? 4 : 0);
            uint32_t hb = five ? (uint32_t)qh[0] | (uint32_t)qh[1] << 8 | (uint32_t)qh[2] << 16 |
                                     (uint32_t)qh[3] << 24
                               : 0;
            for (int j = 0; j < 32; j++) {
                int q = j < 16 ? qs[j] & 15 : qs[j - 16] >> 4;
                q += (int)((hb >> j) & 1) * 16;
                if (!has_m)
                    q -= five ? 16 : 8;
                o[j] = d * q + m;
                g[j] = fabs(d * q) + fabs(m);
            }
            break;
        }
        case SI_TYPE_Q4_K:
        case SI_TYPE_Q5_K: {
            bool five = t == SI_TYPE_Q5_K;
            double d = ref_half(get16(b)), dmin = ref_half(get16(b + 2));
            const uint8_t *sc = b + 4, *qh = b + 16, *qs = b + (five ? 48 : 16);
            for (int c = 0; c < 4; c++) {
                for (int half = 0; half < 2; half++) {
                    int s, m;
                    ref_k_scale(sc, 2 * c + half, &s, &m);
                    for (int l = 0; l < 32; l++) {
                        int q = half ? qs[32 * c + l] >> 4 : qs[32 * c + l] & 15;
                        if (five && (qh[l] >> (2 * c + half)) & 1)
                            q += 16;
                        int e = 64 * c + 32 * half + l;
                        o[e] = d * s * q - dmin * m;
                        g[e] = fabs(d * s * q) + fabs(dmin * m);
                    }
                }
            }
            break;
        }
        case SI_TYPE_Q6_K: {
            double d = ref_half(get16(b + 208));
            for (int h = 0; h < 2; h++) {
                const uint8_t *ql = b + 64 * h, *qh = b + 128 + 32 * h;
                const int8_t *sc = (const int8_t *)(b + 192) + 8 * h;
                for (int l = 0; l < 32; l++) {
                    int s = l / 16;
                    int q[4] = {(ql[l] & 15) | (qh[l] & 3) << 4,
                                (ql[l + 32] & 15) | ((qh[l] >> 2) & 3) << 4,
                                (ql[l] >> 4) | ((qh[l] >> 4) & 3) << 4,
                                (ql[l + 32] >> 4) | ((qh[l] >> 6) & 3) << 4};
                    for (int k = 0; k < 4; k++) {
                        int e = 128 * h + l + 32 * k;
                        o[e] = d * sc[s + 2 * k] * (q[k] - 32);
                        g[e] = fabs(o[e]);
                    }
                }
            }
            break;
        }
        default:
            abort();
        }
    }
}

/* A random half of magnitude 2^-10 ... 1, either sign: a block's scale. */
static uint16_t small_half(void)
{
    uint64_t r = rng();
    return (uint16_t)((r & 0x8000) | (5 + (r >> 16) % 10) << 10 | (r >> 32 & 0x3ff));
}

/*
 * A random row of n elements of type t: random bytes, with every scale field
 * set to a small finite half; float types get finite random values.
 */
static void random_row(uint32_t t, uint8_t *row, int64_t n)
{
    size_t bytes;
    if (!si_type_row_size(t, n, &bytes))
        abort();
    for (size_t i = 0; i < bytes; i++)
        row[i] = (uint8_t)rng();
    const struct si_type_traits *tr = si_type_get(t);
    for (int64_t i = 0; i < n / tr->block; i++) {
        uint8_t *b = row + (size_t)i * tr->size;
        switch (t) {
        case SI_TYPE_F32: {
            float f = (float)uniform(-4, 4);
            if (rng() % 8 == 0)
                f *= 1e-30f;
            memcpy(b, &f, 4);
            break;
        }
        case SI_TYPE_F16: /* any finite half, subnormals included */
            if (((get16(b) >> 10) & 31) == 31)
                put16(b, get16(b) & 0x83ff);
            break;
        case SI_TYPE_BF16: { /* exponent 100 ... 150, or zero and subnormal */
            uint16_t h = get16(b);
            int e = rng() % 16 == 0 ? 0 : 100 + (int)(rng() % 51);
            put16(b, (uint16_t)((h & 0x807f) | e << 7));
            break;
        }
        case SI_TYPE_Q8_0:
        case SI_TYPE_Q4_0:
        case SI_TYPE_Q5_0:
            put16(b, small_half());
            break;
        case SI_TYPE_Q4_1:
        case SI_TYPE_Q5_1:
        case SI_TYPE_Q4_K:
        case SI_TYPE_Q5_K:
            put16(b, small_half());
            put16(b + 2, small_half());
            break;
        case SI_TYPE_Q6_K:
            put16(b + 208, small_half());
            break;
        }
    }
}

static const uint32_t supported[] = {
    SI_TYPE_F32,  SI_TYPE_F16,  SI_TYPE_BF16, SI_TYPE_Q8_0, SI_TYPE_Q4_0, SI_TYPE_Q4_1,
    SI_TYPE_Q5_0, SI_TYPE_Q5_1, SI_TYPE_Q4_K, SI_TYPE_Q5_K, SI_TYPE_Q6_K,
};
#define N_SUPPORTED (sizeof supported / sizeof supported[0])

/* ------------------------------------------------------ dequantize and dot */

/*
 * One row of type t and length n, starting `skew` bytes past an aligned
 * address, through every table in `tables`; the public functions must agree
 * bit for bit with the table si_quants_impl() names.
 */
static void check_row(uint32_t t, int64_t n, size_t skew, const struct si__quants_table **tables,
                      int n_tables)
{
    size_t bytes;
    if (!si_type_row_size(t, n, &bytes))
        abort();
    uint8_t *buf = malloc(bytes + 64);
    float *x = malloc((size_t)n * sizeof *x), *y = malloc((size_t)n * sizeof *y);
    double *ref = malloc((size_t)n * sizeof *ref), *mag = malloc((size_t)n * sizeof *mag);
    if (buf == NULL || x == NULL || y == NULL || ref == NULL || mag == NULL)
        abort();
    uint8_t *row = buf + skew;
    random_row(t, row, n);
    for (int64_t i = 0; i < n; i++)
        x[i] = (float)uniform(-1, 1);
    ref_dequantize(t, row, n, ref, mag);
    double dot_ref = 0, dot_abs = 0;
    for (int64_t i = 0; i < n; i++) {
        dot_ref += ref[i] * x[i];
        dot_abs += mag[i] * fabs(x[i]);
    }

    for (int k = 0; k < n_tables; k++) {
        const struct si__quants_kernels *kern = &tables[k]->type[t];
        const char *impl = tables[k]->name, *name = si_type_name(t);
        if (kern->dequantize == NULL || kern->dot == NULL) {
            CHECK(false, "%s %s: no kernels", impl, name);
            continue;
        }
        kern->dequantize(row, y, n);
        int64_t bad = 0, first = -1;
        for (int64_t i = 0; i < n; i++) {
            if (!(fabs(y[i] - ref[i]) <= DEQUANT_TOL * mag[i])) {
                if (bad++ == 0)
                    first = i;
            }
        }
        CHECK(bad == 0, "%s %s n=%lld: %lld values wrong, first [%lld] = %.9g, want %.9g", impl,
              name, (long long)n, (long long)bad, (long long)first, first >= 0 ? y[first] : 0.0,
              first >= 0 ? ref[first] : 0.0);

        float dot = kern->dot(row, x, n);
        double err = fabs(dot - dot_ref);
        CHECK(err <= DOT_TOL * dot_abs + 1e-30, "%s %s n=%lld: dot %.9g, want %.9g (err %.3g of %.3g)",
              impl, name, (long long)n, dot, dot_ref, err, dot_abs);

        /* mad: y = x + a * row, against x + a * ref in double. */
        const float a = (float)uniform(-2, 2);
        int64_t bad_mad = 0, first_mad = -1;
        if (kern->mad == NULL) {
            CHECK(false, "%s %s: no mad", impl, name);
        } else {
            memcpy(y, x, (size_t)n * sizeof *y);
            kern->mad(row, a, y, n);
            for (int64_t i = 0; i < n; i++) {
                double want = x[i] + (double)a * ref[i];
                double bound = MAD_TOL * (fabs(x[i]) + fabs(a) * mag[i]) + 1e-30;
                if (!(fabs(y[i] - want) <= bound) && bad_mad++ == 0)
                    first_mad = i;
            }
        }
        CHECK(bad_mad == 0, "%s %s n=%lld: mad: %lld values wrong, first [%lld] = %.9g, want %.9g",
              impl, name, (long long)n, (long long)bad_mad, (long long)first_mad,
              first_mad >= 0 ? y[first_mad] : 0.0,
              first_mad >= 0 ? x[first_mad] + (double)a * ref[first_mad] : 0.0);

        if (in_use(impl)) {
            float *z = malloc((size_t)n * sizeof *z);
            if (z == NULL)
                abort();
            si_dequantize_row(t, row, z, n);
            kern->dequantize(row, y, n);
            CHECK(memcmp(y, z, (size_t)n * sizeof *z) == 0, "%s: si_dequantize_row differs", name);
            float d2 = si_vec_dot(t, row, x, n);
            CHECK(memcmp(&dot, &d2, sizeof dot) == 0, "%s: si_vec_dot differs", name);
            if (kern->mad != NULL) {
                memcpy(y, x, (size_t)n * sizeof *y);
                kern->mad(row, a, y, n);
                memcpy(z, x, (size_t)n * sizeof *z);
                si_vec_mad(t, row, a, z, n);
                CHECK(memcmp(y, z, (size_t)n * sizeof *z) == 0, "%s: si_vec_mad differs", name);
            }
            free(z);
        }
    }
    free(buf);
    free(x);
    free(y);
    free(ref);
    free(mag);
}

static void test_kernels(void)
{
    const struct si__quants_table *tables[2] = {&si__quants_scalar, &si__quants_avx2};
    int n_tables = si__quants_avx2_usable() ? 2 : 1;
    printf("kernels: scalar%s; public functions use %s\n",
           n_tables == 2 ? " and avx2" : " (no avx2 on this build or CPU)", si_quants_impl());

    const char *no_simd = getenv("SI_NO_SIMD"), *no_vnni = getenv("SI_NO_VNNI");
    bool forced = no_simd != NULL && no_simd[0] != '\0' && strcmp(no_simd, "0") != 0;
    bool vnni = si__quants_vnni_usable() &&
                !(no_vnni != NULL && no_vnni[0] != '\0' && strcmp(no_vnni, "0") != 0);
    CHECK(strcmp(si_quants_impl(), n_tables == 2 && !forced ? (vnni ? "avx2+vnni" : "avx2")
                                                            : "scalar") == 0,
          "si_quants_impl() = %s", si_quants_impl());

    for (size_t i = 0; i < N_SUPPORTED; i++) {
        uint32_t t = supported[i];
        CHECK(si_type_supported(t), "%s not supported", si_type_name(t));
        int64_t block = si_type_get(t)->block;
        if (block == 1) {
            const int64_t lens[] = {1, 3, 8, 17, 31, 32, 33, 100, 4096, 4099};
            for (size_t j = 0; j < sizeof lens / sizeof lens[0]; j++)
                check_row(t, lens[j], j % 4, tables, n_tables);
        } else {
            const int64_t lens[] = {block, 3 * block, 4096, 4096 + block};
            for (size_t j = 0; j < sizeof lens / sizeof lens[0]; j++)
                check_row(t, lens[j], j % 2 ? 1 : 0, tables, n_tables);
            /* Many rows of one block each: scales and bytes in many combinations. */
            for (int r = 0; r < 200; r++)
                check_row(t, block, 0, tables, n_tables);
        }
    }
    const uint32_t unsupported[] = {SI_TYPE_Q8_1, SI_TYPE_Q2_K, SI_TYPE_Q3_K, SI_TYPE_IQ4_NL,
                                    SI_TYPE_I8, 5, 99};
    for (size_t i = 0; i < sizeof unsupported / sizeof unsupported[0]; i++)
        CHECK(!si_type_supported(unsupported[i]), "type %u supported", unsupported[i]);
}

/* ------------------------------------------------------ quantizers */

/* A 32-element block of test data in one of 9 shapes. */
static void fill_block(float *x, int shape)
{
    /* Shapes 0-4 and 7-8: uniform in [lo, hi]; 5: zeros; 6: a constant. */
    static const double lo[9] = {-1, -1e-3, -100, 5, -3, 0, 0.25, -0.1, -0.4};
    static const double hi[9] = {1, 1e-3, 100, 6, -2, 0, 0.25, 0.1, 0.4};
    shape %= 9;
    for (int j = 0; j < 32; j++)
        x[j] = (float)uniform(lo[shape], hi[shape]);
    if (shape == 7) /* one outlier, either sign */
        x[rng() % 32] = (rng() & 1) ? 3.0f : -3.0f;
    if (shape == 8) { /* the largest magnitudes tie: the first one's sign wins */
        float s = (rng() & 1) ? 0.5f : -0.5f;
        x[3] = s;
        x[20] = -s;
    }
}

/*
 * Checks the block quantized from x at b: its scale (and min) chosen as
 * ggml's reference quantizers choose them, each value rounded as they round,
 * and the dequantized error within half a step (a whole one where the top
 * value was clamped) plus the error of storing d and m as halves.
 */
static void check_quantized_block(uint32_t t, const float *x, const uint8_t *b)
{
    const char *name = si_type_name(t);
    bool asym = t == SI_TYPE_Q4_1 || t == SI_TYPE_Q5_1;
    int top = t == SI_TYPE_Q8_0 ? 127 : (t == SI_TYPE_Q4_0 || t == SI_TYPE_Q4_1) ? 15 : 31;

    /* The scale the reference quantizer picks, in float as it computes it. */
    float d, m = 0.0f, amax = 0.0f, smax = 0.0f, min = x[0], max = x[0];
    for (int j = 0; j < 32; j++) {
        if (fabsf(x[j]) > amax) {
            amax = fabsf(x[j]);
            smax = x[j];
        }
        min = x[j] < min ? x[j] : min;
        max = x[j] > max ? x[j] : max;
    }
    if (t == SI_TYPE_Q8_0)
        d = amax / 127.0f;
    else if (asym)
        d = (max - min) / (float)top, m = min;
    else
        d = smax / (t == SI_TYPE_Q4_0 ? -8.0f : -16.0f);
    float id = d != 0.0f ? 1.0f / d : 0.0f;
    CHECK(get16(b) == si_fp32_to_fp16(d), "%s: d = 0x%04x, want 0x%04x (%g)", name, get16(b),
          si_fp32_to_fp16(d), (double)d);
    if (asym)
        CHECK(get16(b + 2) == si_fp32_to_fp16(m), "%s: m = 0x%04x, want 0x%04x (%g)", name,
              get16(b + 2), si_fp32_to_fp16(m), (double)m);

    double y[32], mag[32];
    ref_dequantize(t, b, 32, y, mag);
    double dh = ref_half(get16(b)), mh = asym ? ref_half(get16(b + 2)) : 0.0;
    int zero = t == SI_TYPE_Q4_0 ? 8 : t == SI_TYPE_Q5_0 ? 16 : 0;
    for (int j = 0; j < 32; j++) {
        /* The value the reference quantizer stores, and whether it was clamped. */
        int want;
        bool clamped = false;
        if (t == SI_TYPE_Q8_0) {
            want = (int)roundf(x[j] * id);
        } else {
            float v = asym ? (x[j] - min) * id + 0.5f : x[j] * id + ((float)zero + 0.5f);
            want = (int)v;
            clamped = want > top;
            want = clamped ? top : want;
        }
        /* The stored value, read back from the dequantized one: q = (y - m) / d + zero. */
        int got = dh != 0.0 ? (int)lround((y[j] - mh) / dh) + zero : want;
        CHECK(got == want, "%s: x[%d] = %.9g stored as %d, want %d", name, j, (double)x[j], got,
              want);
        double bound = (clamped ? 1.0 : 0.5) * fabs(d) * (1 + 1e-5) +
                       abs(want - zero) * fabs(d - dh) + fabs(m - mh) + 1e-30;
        CHECK(fabs(x[j] - y[j]) <= bound, "%s: |x - dq(q(x))| = %.3g > %.3g at %d", name,
              fabs(x[j] - y[j]), bound, j);
    }
}

static void test_quantize(void)
{
    const uint32_t types[] = {SI_TYPE_Q8_0, SI_TYPE_Q4_0, SI_TYPE_Q4_1, SI_TYPE_Q5_0,
                              SI_TYPE_Q5_1};
    enum { N = 32 * 64 };
    float x[N];
    uint8_t row[N / 32 * 34];
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++) {
        uint32_t t = types[i];
        CHECK(si_type_quantizable(t), "%s not quantizable", si_type_name(t));
        const struct si_type_traits *tr = si_type_get(t);
        for (int rep = 0; rep < 8; rep++) {
            for (int k = 0; k < N / 32; k++)
                fill_block(x + 32 * k, k + rep);
            size_t bytes = si_quantize_row(t, x, row, N);
            CHECK(bytes == (size_t)N / 32 * tr->size, "%s: %zu bytes", si_type_name(t), bytes);
            for (int k = 0; k < N / 32; k++)
                check_quantized_block(t, x + 32 * k, row + (size_t)k * tr->size);
        }
    }

    /* The float types: element by element, the conversions tested above. */
    float f[37];
    uint8_t out[37 * 4];
    for (int j = 0; j < 37; j++)
        f[j] = (float)uniform(-70000, 70000) * (j % 3 ? 1.0f : 1e-6f);
    CHECK(si_quantize_row(SI_TYPE_F32, f, out, 37) == 37 * 4, "F32 bytes");
    CHECK(memcmp(out, f, sizeof f) == 0, "F32 quantize is not a copy");
    CHECK(si_quantize_row(SI_TYPE_F16, f, out, 37) == 37 * 2, "F16 bytes");
    for (int j = 0; j < 37; j++)
        CHECK(get16(out + 2 * j) == ref_to_half(f[j]), "F16 quantize at %d", j);
    CHECK(si_quantize_row(SI_TYPE_BF16, f, out, 37) == 37 * 2, "BF16 bytes");
    for (int j = 0; j < 37; j++)
        CHECK(get16(out + 2 * j) == ref_to_bf16(f[j]), "BF16 quantize at %d", j);

    /* What cannot be written. */
    CHECK(!si_type_quantizable(SI_TYPE_Q2_K), "Q2_K quantizable");
    CHECK(!si_type_quantizable(SI_TYPE_IQ4_NL), "IQ4_NL quantizable");
    CHECK(si_quantize_row(SI_TYPE_Q2_K, x, row, 256) == 0, "Q2_K quantized");
    CHECK(si_quantize_row(SI_TYPE_Q4_K, x, row, 255) == 0, "Q4_K row of 255 quantized");
    CHECK(si_quantize_row(SI_TYPE_Q8_0, x, row, 31) == 0, "Q8_0 row of 31 quantized");
    CHECK(si_quantize_row(99, x, row, 32) == 0, "type 99 quantized");
}

/*
 * The K super-blocks: rows quantized and read back (si_dequantize_row, the
 * scalar oracle's layout) stay within what their grids allow.  Each
 * sub-block's values x lie in [lo, hi]; its grid is d sc q - dmin m for
 * q = 0 .. top (Q6_K: d sc q, q = -32 .. 31), with d and dmin halves and
 * sc, m small integers rounded from the sub-block's own scale and min.  A
 * value is at most half a grid step from the grid where the grid covers
 * it, and beyond that by at most how much the rounded scale and min miss
 * the sub-block's range.  Sub-blocks of very different amplitudes (2^j)
 * catch a scale or min packed into the wrong bits: those decode at another
 * magnitude.
 */
static void test_quantize_k(void)
{
    const uint32_t types[] = {SI_TYPE_Q4_K, SI_TYPE_Q5_K, SI_TYPE_Q6_K};
    enum { N = 256 * 4 };
    static float x[N], y[N];
    static uint8_t row[N / 256 * 210];
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++) {
        const uint32_t t = types[i];
        const bool six = t == SI_TYPE_Q6_K;
        const int sub = six ? 16 : 32, top = t == SI_TYPE_Q4_K ? 15 : 31;
        CHECK(si_type_quantizable(t), "%s not quantizable", si_type_name(t));
        for (int rep = 0; rep < 6; rep++) {
            for (int k = 0; k < N; k++) {
                const double amp = ldexp(1.0, (k % 256) / sub % 8 - 4);
                x[k] = rep == 0   ? (float)uniform(-amp, amp)
                       : rep == 1 ? (float)uniform(0, amp)           /* all positive */
                       : rep == 2 ? (float)uniform(-amp, -0.5 * amp) /* all negative */
                       : rep == 3 ? 0.0f
                       : rep == 4 ? (float)uniform(-1, 1) * (k % 97 == 0 ? 40.0f : 1.0f)
                                  : (float)(k % 7) * 0.25f - 0.5f;
            }
            size_t bytes = si_quantize_row(t, x, row, N);
            CHECK(bytes == (size_t)N / 256 * si_type_get(t)->size, "%s: %zu bytes",
                  si_type_name(t), bytes);
            si_dequantize_row(t, row, y, N);
            double worst = 0, sq = 0;
            for (int b = 0; b < N / 256; b++) {
                const uint8_t *blk = row + (size_t)b * si_type_get(t)->size;
                const double d = ref_half(get16(blk + (six ? 208 : 0)));
                const double dmin = six ? 0 : ref_half(get16(blk + 2));
                for (int j = 0; j < 256 / sub; j++) {
                    const float *xs = x + 256 * b + sub * j, *ys = y + 256 * b + sub * j;
                    double lo = six ? 0 : fmin(0, xs[0]), hi = xs[0], amax = 0;
                    for (int l = 0; l < sub; l++) {
                        lo = fmin(lo, xs[l]);
                        hi = fmax(hi, xs[l]);
                        amax = fmax(amax, fabs(xs[l]));
                    }
                    /* the sub-block's exact grid, and the one stored */
                    const double scale = six ? amax / 31 : (hi - lo) / top, min = -lo;
                    int sc = 0, m = 0;
                    if (!six)
                        ref_k_scale(blk + 4, j, &sc, &m);
                    const double ds = six ? d * (int8_t)blk[192 + j] : d * sc, dm = dmin * m;
                    const double bound = 0.5 * ds + fabs(min - dm) +
                                         (six ? 32 : top) * fabs(scale - ds) +
                                         1e-6 * (fabs(hi) + fabs(lo) + amax) + 1e-30;
                    for (int l = 0; l < sub; l++) {
                        const double e = fabs((double)xs[l] - (double)ys[l]);
                        worst = fmax(worst, e / bound);
                        sq += e * e;
                        if (e > bound) {
                            CHECK(false, "%s rep %d: block %d sub %d: |x - dq(q(x))| = %.3g > %.3g",
                                  si_type_name(t), rep, b, j, e, bound);
                            break;
                        }
                    }
                }
            }
            if (rep == 3)
                CHECK(sq == 0, "%s: zeros do not read back as zeros", si_type_name(t));
            if (rep == 0) {
                /* uniform data: the error is about a grid step / sqrt(12), not more */
                double rms = sqrt(sq / N), step = 1.0 / 16 * 2 / top; /* the smallest amplitude's */
                CHECK(rms < 40 * step, "%s: rms error %.3g", si_type_name(t), rms);
            }
        }
    }
}

/* ------------------------------------------------------ quantized activations */

/* v rounded to the nearest integer, ties to the even one. */
static double ref_round_even(double v)
{
    double f = floor(v), r = v - f;
    return r > 0.5 || (r == 0.5 && fmod(f, 2.0) != 0.0) ? f + 1 : f;
}

/* The vec_dot_type of weight type t, as quants.h lists them. */
static uint32_t ref_act_type(uint32_t t)
{
    switch (t) {
    case SI_TYPE_Q4_0:
    case SI_TYPE_Q5_0:
    case SI_TYPE_Q8_0:
        return SI_TYPE_Q8_0;
    case SI_TYPE_Q4_1:
    case SI_TYPE_Q5_1:
        return SI_TYPE_Q8_1;
    case SI_TYPE_Q4_K:
    case SI_TYPE_Q5_K:
    case SI_TYPE_Q6_K:
        return SI_TYPE_Q8_K;
    default:
        return t;
    }
}

/*
 * n activations as type at, from llama.cpp's rules: Q8_0 / Q8_1 blocks of
 * 32 with amax = max|x|, d = amax / 127, id = 127 / amax (0 when amax is 0),
 * q = x * id rounded half to even, d stored as a half, and for Q8_1
 * s = half(d * sum q) with d unrounded; Q8_K super-blocks of 256 with max the
 * first element of largest magnitude, iscale = -127 / max,
 * q = min(127, x * iscale rounded half to even), d = 1 / iscale (all zero
 * when max is 0) and bsums[j] = sum of q[16j .. 16j+15]; halves and
 * bfloat16s rounded to nearest even; floats copied.
 */
static void ref_quantize_act(uint32_t at, const float *x, uint8_t *out, int64_t n)
{
    switch (at) {
    case SI_TYPE_F32:
        memcpy(out, x, (size_t)n * sizeof *x);
        break;
    case SI_TYPE_F16:
        for (int64_t i = 0; i < n; i++)
            put16(out + 2 * i, ref_to_half(x[i]));
        break;
    case SI_TYPE_BF16:
        for (int64_t i = 0; i < n; i++)
            put16(out + 2 * i, ref_to_bf16(x[i]));
        break;
    case SI_TYPE_Q8_0:
    case SI_TYPE_Q8_1: {
        bool has_s = at == SI_TYPE_Q8_1;
        for (int64_t i = 0; i < n; i += 32) {
            uint8_t *b = out + (size_t)(i / 32) * (has_s ? 36 : 34), *qs = b + (has_s ? 4 : 2);
            float amax = 0.0f;
            for (int j = 0; j < 32; j++)
                amax = fabsf(x[i + j]) > amax ? fabsf(x[i + j]) : amax;
            float d = amax / 127.0f, id = amax != 0.0f ? 127.0f / amax : 0.0f;
            int sum = 0;
            for (int j = 0; j < 32; j++) {
                float v = x[i + j] * id;
                int q = (int)ref_round_even(v);
                qs[j] = (uint8_t)(q & 0xff);
                sum += q;
            }
            put16(b, ref_to_half(d));
            if (has_s)
                put16(b + 2, ref_to_half(d * (float)sum));
        }
        break;
    }
    case SI_TYPE_Q8_K:
        for (int64_t i = 0; i < n; i += 256) {
            uint8_t *b = out + (size_t)(i / 256) * 292;
            float amax = 0.0f, max = 0.0f, d = 0.0f;
            for (int j = 0; j < 256; j++) {
                if (fabsf(x[i + j]) > amax) {
                    amax = fabsf(x[i + j]);
                    max = x[i + j];
                }
            }
            int q[256] = {0};
            if (amax != 0.0f) {
                float iscale = -127.0f / max;
                for (int j = 0; j < 256; j++) {
                    float v = iscale * x[i + j];
                    q[j] = (int)ref_round_even(v);
                    q[j] = q[j] > 127 ? 127 : q[j];
                }
                d = 1.0f / iscale;
            }
            memcpy(b, &d, 4);
            for (int j = 0; j < 256; j++)
                b[4 + j] = (uint8_t)(q[j] & 0xff);
            for (int j = 0; j < 16; j++) {
                int sum = 0;
                for (int l = 0; l < 16; l++)
                    sum += q[16 * j + l];
                put16(b + 260 + 2 * j, (uint16_t)(int16_t)sum);
            }
        }
        break;
    default:
        abort();
    }
}

/* The activations' values in double; for Q8_1 also each block's s in s[i / 32]. */
static void ref_act_values(uint32_t at, const uint8_t *xa, int64_t n, double *y, double *s)
{
    for (int64_t i = 0; i < n; i++) {
        switch (at) {
        case SI_TYPE_F32: {
            float f;
            memcpy(&f, xa + 4 * i, 4);
            y[i] = f;
            break;
        }
        case SI_TYPE_F16:
            y[i] = ref_half(get16(xa + 2 * i));
            break;
        case SI_TYPE_BF16:
            y[i] = ref_bf16(get16(xa + 2 * i));
            break;
        case SI_TYPE_Q8_0: {
            const uint8_t *b = xa + (size_t)(i / 32) * 34;
            y[i] = ref_half(get16(b)) * (int8_t)b[2 + i % 32];
            break;
        }
        case SI_TYPE_Q8_1: {
            const uint8_t *b = xa + (size_t)(i / 32) * 36;
            y[i] = ref_half(get16(b)) * (int8_t)b[4 + i % 32];
            s[i / 32] = ref_half(get16(b + 2));
            break;
        }
        case SI_TYPE_Q8_K: {
            const uint8_t *b = xa + (size_t)(i / 256) * 292;
            float d;
            memcpy(&d, b, 4);
            y[i] = (double)d * (int8_t)b[4 + i % 256];
            break;
        }
        default:
            abort();
        }
    }
}

/*
 * Test activations for a row of n: blocks of 32 in shapes meant to catch
 * rounding slips.  Shapes 0-2: uniform at different scales; 3: zeros;
 * 4-6: exact ties x * 127 / max|x| = k + 1/2 (max|x| = 127, 63.5 and
 * 127/1024, of either sign); 7: the largest magnitudes tie with opposite
 * signs; 8: half and bfloat16 rounding ties; 9: one nonzero value.
 */
static void fill_acts(float *x, int64_t n)
{
    static const float tie_amax[3] = {127.0f, 63.5f, 127.0f / 1024.0f};
    for (int64_t i = 0; i < n; i += 32) {
        int len = n - i < 32 ? (int)(n - i) : 32, shape = (int)(rng() % 10);
        float *b = x + i;
        for (int j = 0; j < len; j++)
            b[j] = (float)uniform(-1, 1);
        switch (shape) {
        case 1:
            for (int j = 0; j < len; j++)
                b[j] *= 1e-3f;
            break;
        case 2:
            for (int j = 0; j < len; j++)
                b[j] *= 300.0f;
            break;
        case 3:
            for (int j = 0; j < len; j++)
                b[j] = (j & 1) ? -0.0f : 0.0f;
            break;
        case 4:
        case 5:
        case 6: {
            /* x = (k + 1/2) * amax / 127 exactly, |k + 1/2| < 127; one element at +-amax. */
            float amax = tie_amax[shape - 4];
            for (int j = 0; j < len; j++)
                b[j] = ((float)((int)(rng() % 253) - 126) + 0.5f) * (amax / 127.0f);
            b[rng() % (unsigned)len] = (rng() & 1) ? amax : -amax;
            break;
        }
        case 7:
            if (len > 20) {
                float v = (rng() & 1) ? 2.0f : -2.0f;
                b[3] = v;
                b[20] = -v;
            }
            break;
        case 8: {
            static const float ties[] = {1.0f + 0x1p-11f, 1.0f + 0x3p-11f, 0x1p-25f, 0x1.8p-24f,
                                         1.0f + 0x1p-8f,  1.0f + 0x3p-8f,  2.5f,     -0.5f};
            for (int j = 0; j < len; j++)
                b[j] = (rng() & 1) ? ties[rng() % 8] : -ties[rng() % 8];
            break;
        }
        case 9:
            for (int j = 0; j < len; j++)
                b[j] = 0.0f;
            b[rng() % (unsigned)len] = (float)uniform(-5, 5);
            break;
        }
    }
    /* Q8_K super-blocks whose largest magnitude is +-127 exactly make ties too. */
    for (int64_t i = 0; i + 256 <= n; i += 256) {
        if (rng() % 3 == 0) {
            for (int j = 0; j < 256; j++)
                x[i + j] = (float)((int)(rng() % 253) - 126) + 0.5f;
            x[i + rng() % 256] = (rng() & 1) ? 127.0f : -127.0f;
        }
    }
}

static const uint32_t act_types[] = {SI_TYPE_Q8_0, SI_TYPE_Q8_1, SI_TYPE_Q8_K,
                                     SI_TYPE_F16,  SI_TYPE_BF16, SI_TYPE_F32};

/* The act_type converter of every table against ref_quantize_act, on n activations. */
static void check_quantize_act(uint32_t at, int64_t n, size_t skew,
                               const struct si__quants_table **tables, int n_tables)
{
    size_t bytes;
    if (!si_type_row_size(at, n, &bytes))
        abort();
    float *x = malloc((size_t)n * sizeof *x);
    uint8_t *want = malloc(bytes), *buf = malloc(bytes + 64);
    if (x == NULL || want == NULL || buf == NULL)
        abort();
    fill_acts(x, n);
    ref_quantize_act(at, x, want, n);
    uint8_t *got = buf + skew;
    for (int k = 0; k < n_tables; k++) {
        const char *impl = tables[k]->name, *name = si_type_name(at);
        si__quantize_act_fn quantize = tables[k]->type[at].quantize_act;
        if (quantize == NULL) {
            CHECK(false, "%s %s: no quantize_act", impl, name);
            continue;
        }
        memset(buf, 0xa5, bytes + 64);
        quantize(x, got, n);
        size_t first = bytes;
        for (size_t i = 0; i < bytes && first == bytes; i++)
            first = got[i] != want[i] ? i : bytes;
        CHECK(first == bytes, "%s %s n=%lld: byte %zu is 0x%02x, want 0x%02x", impl, name,
              (long long)n, first, first < bytes ? got[first] : 0, first < bytes ? want[first] : 0);
        CHECK(got[bytes] == 0xa5, "%s %s n=%lld: wrote past the row", impl, name, (long long)n);

        /* The Q8_1 s and Q8_K bsums read back against the quants they sum. */
        if (at == SI_TYPE_Q8_1) {
            for (int64_t b = 0; b < n / 32; b++) {
                const uint8_t *p = got + 36 * b;
                int sum = 0;
                for (int j = 0; j < 32; j++)
                    sum += (int8_t)p[4 + j];
                double d = ref_half(get16(p)), s = ref_half(get16(p + 2));
                /* s = half(d' * sum), d = half(d'): each within half a step of a half
                 * (2^-11 relative, or 2^-25 among the subnormals). */
                double err = fabs(s - d * sum);
                double bound = (fabs(d) * 0x1p-11 + 0x1p-25) * abs(sum) +
                               fabs(d * sum) * 0x1p-11 + 0x1p-25;
                CHECK(err <= bound, "%s Q8_1 block %lld: s = %g, d * sum = %g", impl, (long long)b,
                      s, d * sum);
            }
        }
        if (at == SI_TYPE_Q8_K) {
            for (int64_t b = 0; b < n / 256; b++) {
                const uint8_t *p = got + 292 * b;
                for (int j = 0; j < 16; j++) {
                    int sum = 0;
                    for (int l = 0; l < 16; l++)
                        sum += (int8_t)p[4 + 16 * j + l];
                    CHECK((int16_t)get16(p + 260 + 2 * j) == sum,
                          "%s Q8_K block %lld: bsums[%d] = %d, want %d", impl, (long long)b, j,
                          (int16_t)get16(p + 260 + 2 * j), sum);
                }
            }
        }
        if (in_use(impl)) {
            memset(buf, 0x5a, bytes + 64);
            si_quantize_act(at, x, got, n);
            CHECK(memcmp(got, want, bytes) == 0, "%s: si_quantize_act differs", name);
        }
    }
    free(x);
    free(want);
    free(buf);
}

/*
 * A row of type t and length n dotted with converted activations, through
 * every table, against the float64 dot of the dequantized row and
 * activations.  For Q8_1 the block's m * s term uses the stored s, as the
 * kernels do (s is d * sum(q) rounded to a half).
 */
static void check_dot_act(uint32_t t, int64_t n, size_t skew,
                          const struct si__quants_table **tables, int n_tables)
{
    uint32_t at = si_act_type(t);
    const char *name = si_type_name(t);
    size_t rbytes, abytes;
    if (!si_type_row_size(t, n, &rbytes) || !si_type_row_size(at, n, &abytes))
        abort();
    uint8_t *rbuf = malloc(rbytes + 64), *abuf = malloc(abytes + 64);
    float *x = malloc((size_t)n * sizeof *x);
    double *w = malloc((size_t)n * sizeof *w), *mag = malloc((size_t)n * sizeof *mag);
    double *y = malloc((size_t)n * sizeof *y), *s = malloc((size_t)(n / 32 + 1) * sizeof *s);
    if (rbuf == NULL || abuf == NULL || x == NULL || w == NULL || mag == NULL || y == NULL ||
        s == NULL)
        abort();
    uint8_t *row = rbuf + skew, *xa = abuf + (skew ^ 1);
    random_row(t, row, n);
    fill_acts(x, n);
    ref_quantize_act(at, x, xa, n);
    ref_dequantize(t, row, n, w, mag);
    ref_act_values(at, xa, n, y, s);
    double want = 0, abs_sum = 0;
    for (int64_t i = 0; i < n; i++) {
        want += w[i] * y[i];
        abs_sum += mag[i] * fabs(y[i]);
    }
    if (at == SI_TYPE_Q8_1) {
        /* Replace m * sum(y) by m * s per block. */
        size_t size = si_type_get(t)->size;
        for (int64_t b = 0; b < n / 32; b++) {
            double m = ref_half(get16(row + (size_t)b * size + 2)), ysum = 0;
            for (int j = 0; j < 32; j++)
                ysum += y[32 * b + j];
            want += m * (s[b] - ysum);
            abs_sum += fabs(m * s[b]);
        }
    }

    float got[2] = {0, 0};
    for (int k = 0; k < n_tables; k++) {
        const char *impl = tables[k]->name;
        si__dot_act_fn dot = tables[k]->type[t].dot_act;
        if (dot == NULL) {
            CHECK(false, "%s %s: no dot_act", impl, name);
            continue;
        }
        got[k] = dot(row, xa, n);
        double err = fabs(got[k] - want);
        CHECK(err <= DOT_TOL * abs_sum + 1e-30,
              "%s %s n=%lld: dot_act %.9g, want %.9g (err %.3g of %.3g)", impl, name, (long long)n,
              got[k], want, err, abs_sum);
        if (in_use(impl)) {
            float pub = si_vec_dot_act(t, row, xa, n);
            CHECK(memcmp(&pub, &got[k], sizeof pub) == 0, "%s: si_vec_dot_act differs", name);
        }
    }
    if (n_tables == 2)
        CHECK(fabs(got[0] - got[1]) <= DOT_TOL * abs_sum + 1e-30,
              "%s n=%lld: scalar %.9g and avx2 %.9g differ", name, (long long)n, got[0], got[1]);
    /* llama.cpp's batch kernels: within the same bound; alone, the plain dot. */
    for (int g = 0; g < 2; g++) {
        const float b = si_vec_dot_act_batch(t, row, xa, n, 8, g == 1);
        CHECK(fabs(b - want) <= DOT_TOL * abs_sum + 1e-30,
              "%s n=%lld: batch dot (group %d) %.9g, want %.9g", name, (long long)n, g,
              (double)b, want);
    }
    const float alone = si_vec_dot_act_batch(t, row, xa, n, 1, false),
                plain = si_vec_dot_act(t, row, xa, n);
    CHECK(memcmp(&alone, &plain, sizeof alone) == 0, "%s: a batch of one is not the plain dot",
          name);
    /* Q4_K: exact integers and the same fused float steps in both. */
    if (n_tables == 2 && t == SI_TYPE_Q4_K)
        CHECK(memcmp(&got[0], &got[1], sizeof got[0]) == 0,
              "Q4_K n=%lld: scalar %a and avx2 %a not the same bits", (long long)n,
              (double)got[0], (double)got[1]);
    free(rbuf);
    free(abuf);
    free(x);
    free(w);
    free(mag);
    free(y);
    free(s);
}

static void test_act(void)
{
    const struct si__quants_table *tables[2] = {&si__quants_scalar, &si__quants_avx2};
    int n_tables = si__quants_avx2_usable() ? 2 : 1;

    for (size_t i = 0; i < N_SUPPORTED; i++) {
        uint32_t t = supported[i];
        CHECK(si_act_type(t) == ref_act_type(t), "si_act_type(%s) = %u", si_type_name(t),
              si_act_type(t));
    }
    CHECK(si_act_type(SI_TYPE_Q8_1) == SI_TYPE_COUNT, "si_act_type(Q8_1)");
    CHECK(si_act_type(SI_TYPE_Q2_K) == SI_TYPE_COUNT, "si_act_type(Q2_K)");
    CHECK(si_act_type(99) == SI_TYPE_COUNT, "si_act_type(99)");

    for (size_t i = 0; i < sizeof act_types / sizeof act_types[0]; i++) {
        uint32_t at = act_types[i];
        int64_t block = si_type_get(at)->block;
        if (block == 1) {
            const int64_t lens[] = {1, 3, 8, 17, 31, 32, 33, 100, 4096, 4099};
            for (size_t j = 0; j < sizeof lens / sizeof lens[0]; j++)
                check_quantize_act(at, lens[j], j % 4, tables, n_tables);
        } else {
            const int64_t lens[] = {block, 3 * block, 4096, 4096 + block};
            for (size_t j = 0; j < sizeof lens / sizeof lens[0]; j++)
                check_quantize_act(at, lens[j], j % 2, tables, n_tables);
            for (int r = 0; r < 300; r++)
                check_quantize_act(at, block, 0, tables, n_tables);
        }
    }

    for (size_t i = 0; i < N_SUPPORTED; i++) {
        uint32_t t = supported[i];
        int64_t block = si_type_get(si_act_type(t))->block;
        if (block < si_type_get(t)->block)
            block = si_type_get(t)->block;
        if (block == 1) {
            const int64_t lens[] = {1, 3, 8, 17, 31, 32, 33, 100, 4096, 4099};
            for (size_t j = 0; j < sizeof lens / sizeof lens[0]; j++)
                check_dot_act(t, lens[j], j % 4, tables, n_tables);
        } else {
            const int64_t lens[] = {block, 3 * block, 4096, 4096 + block};
            for (size_t j = 0; j < sizeof lens / sizeof lens[0]; j++)
                check_dot_act(t, lens[j], j % 2, tables, n_tables);
            for (int r = 0; r < 200; r++)
                check_dot_act(t, block, 0, tables, n_tables);
        }
    }
}

/* si_vec_mad4 must equal four si_vec_mad calls in order, bit for bit. */
static void test_mad4(void)
{
    static const uint32_t types[] = {SI_TYPE_F32,  SI_TYPE_F16,  SI_TYPE_BF16, SI_TYPE_Q8_0,
                                     SI_TYPE_Q4_0, SI_TYPE_Q4_1, SI_TYPE_Q5_0, SI_TYPE_Q4_K,
                                     SI_TYPE_Q5_K, SI_TYPE_Q6_K};
    for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++) {
        const uint32_t t = types[ti];
        const int64_t n = 1024;
        size_t rb = 0;
        si_type_row_size(t, n, &rb);
        uint8_t *buf = malloc(4 * rb);
        float *y1 = malloc(n * sizeof *y1), *y4 = malloc(n * sizeof *y4);
        const void *rows[4];
        const float a[4] = {0.75f, -1.5f, 0.0f, 3.25f};
        for (int k = 0; k < 4; k++) {
            random_row(t, buf + k * rb, n);
            rows[k] = buf + k * rb;
        }
        for (int64_t i = 0; i < n; i++)
            y1[i] = y4[i] = (float)(i % 7) - 3.0f;
        for (int k = 0; k < 4; k++)
            si_vec_mad(t, rows[k], a[k], y1, n);
        si_vec_mad4(t, rows, a, y4, n);
        CHECK(memcmp(y1, y4, n * sizeof *y1) == 0, "%s: mad4 differs from four mads",
              si_type_name(t));
        free(buf);
        free(y1);
        free(y4);
    }
}

/*
 * dot_act2 of each table (where it has one) and si_vec_dot_act2 must equal
 * two dot_act calls bit for bit, with and without rows ahead to prefetch,
 * on rows at odd addresses too.
 */
static void check_dot_act2(uint32_t t, int64_t n, size_t skew,
                           const struct si__quants_table *const *tables, int n_tables)
{
    const char *name = si_type_name(t);
    const uint32_t at = si_act_type(t);
    size_t rb = 0, ab = 0;
    si_type_row_size(t, n, &rb);
    si_type_row_size(at, n, &ab);
    uint8_t *buf = malloc(4 * rb + skew), *xa = malloc(ab + skew);
    float *x = malloc((size_t)n * sizeof *x);
    const void *rows[2], *ahead[2];
    /* Rows of similar values (quantized from uniform floats where the type
     * can be): any change in the order of the float sums then shows. */
    for (int k = 0; k < 4; k++) {
        uint8_t *row = buf + skew + (size_t)k * rb;
        if (si_type_quantizable(t)) {
            for (int64_t i = 0; i < n; i++)
                x[i] = (float)uniform(-1, 1);
            si_quantize_row(t, x, row, n);
        } else {
            random_row(t, row, n);
        }
    }
    rows[0] = buf + skew;
    rows[1] = buf + skew + rb;
    ahead[0] = buf + skew + 2 * rb;
    ahead[1] = buf + skew + 3 * rb;
    for (int64_t i = 0; i < n; i++)
        x[i] = (float)uniform(-2, 2);
    si_quantize_act(at, x, xa + skew, n);
    const void *const one_ahead[2] = {ahead[0], NULL};
    const void *const *aheads[] = {NULL, ahead, one_ahead};

    for (int k = 0; k < n_tables; k++) {
        const struct si__quants_kernels *kern = &tables[k]->type[t];
        if (kern->dot_act2 == NULL)
            continue;
        const float want[2] = {kern->dot_act(rows[0], xa + skew, n),
                               kern->dot_act(rows[1], xa + skew, n)};
        for (size_t j = 0; j < sizeof aheads / sizeof aheads[0]; j++) {
            float got[2] = {0, 0};
            kern->dot_act2(rows, xa + skew, n, got, aheads[j]);
            CHECK(memcmp(got, want, sizeof got) == 0,
                  "%s %s n=%lld ahead %zu: dot_act2 %.9g %.9g, dot_act %.9g %.9g",
                  tables[k]->name, name, (long long)n, j, got[0], got[1], want[0], want[1]);
        }
    }
    const float want[2] = {si_vec_dot_act(t, rows[0], xa + skew, n),
                           si_vec_dot_act(t, rows[1], xa + skew, n)};
    for (size_t j = 0; j < sizeof aheads / sizeof aheads[0]; j++) {
        float got[2] = {0, 0};
        si_vec_dot_act2(t, rows, xa + skew, n, got, aheads[j]);
        CHECK(memcmp(got, want, sizeof got) == 0, "%s n=%lld ahead %zu: si_vec_dot_act2 differs",
              name, (long long)n, j);
    }
    free(buf);
    free(xa);
    free(x);
}

/*
 * The VNNI kernels (where this CPU has them) give the AVX2 kernels' bits:
 * dot_act and dot_act2 on rows of random quants and scales, all-extreme
 * quants (-127/127 activations against the widest weights), odd addresses.
 */
static void test_vnni(void)
{
    if (!si__quants_vnni_usable()) {
        printf("vnni: not on this CPU or build; its kernels not compared\n");
        return;
    }
    int compared = 0;
    for (size_t i = 0; i < N_SUPPORTED; i++) {
        const uint32_t t = supported[i], at = si_act_type(t);
        const struct si__quants_kernels *v = &si__quants_vnni.type[t], *a = &si__quants_avx2.type[t];
        if (v->dot_act == NULL && v->dot_act2 == NULL)
            continue;
        const int64_t lens[] = {32, 96, 576, 4096, 256, 768, 11008};
        for (size_t j = 0; j < sizeof lens / sizeof lens[0]; j++) {
            const int64_t n = lens[j];
            if (n % si_type_get(t)->block != 0)
                continue;
            size_t rb = 0, ab = 0;
            si_type_row_size(t, n, &rb);
            si_type_row_size(at, n, &ab);
            uint8_t *buf = malloc(2 * rb + 1), *xa = malloc(ab + 1);
            float *x = malloc((size_t)n * sizeof *x);
            for (int round = 0; round < 20; round++) {
                const bool extreme = round % 4 == 3;
                for (int r = 0; r < 2; r++) {
                    random_row(t, buf + 1 + (size_t)r * rb, n);
                    if (extreme && si_type_quantizable(t)) {
                        for (int64_t k = 0; k < n; k++)
                            x[k] = (k + r) % 2 ? 1.0f : -1.0f;
                        si_quantize_row(t, x, buf + 1 + (size_t)r * rb, n);
                    }
                }
                for (int64_t k = 0; k < n; k++)
                    x[k] = extreme ? ((k % 3) ? 4.0f : -4.0f) : (float)uniform(-2, 2);
                si_quantize_act(at, x, xa + 1, n);
                const void *rows[2] = {buf + 1, buf + 1 + rb};
                if (v->dot_act != NULL) {
                    const float fv = v->dot_act(rows[0], xa + 1, n),
                                fa = a->dot_act(rows[0], xa + 1, n);
                    CHECK(memcmp(&fv, &fa, sizeof fv) == 0, "%s n=%lld: vnni dot %a, avx2 %a",
                          si_type_name(t), (long long)n, (double)fv, (double)fa);
                    compared++;
                }
                if (v->dot_act2 != NULL) {
                    float ov[2], oa[2];
                    v->dot_act2(rows, xa + 1, n, ov, NULL);
                    a->dot_act2(rows, xa + 1, n, oa, NULL);
                    CHECK(memcmp(ov, oa, sizeof ov) == 0, "%s n=%lld: vnni dot_act2 differs",
                          si_type_name(t), (long long)n);
                }
            }
            free(buf);
            free(xa);
            free(x);
        }
    }
    printf("vnni: %d dots equal to the avx2 kernels' bits\n", compared);
}

static void test_dot_act2(void)
{
    const struct si__quants_table *tables[2] = {&si__quants_scalar, &si__quants_avx2};
    int n_tables = si__quants_avx2_usable() ? 2 : 1;
    for (size_t i = 0; i < N_SUPPORTED; i++) {
        uint32_t t = supported[i];
        int64_t block = si_type_get(si_act_type(t))->block;
        if (block < si_type_get(t)->block)
            block = si_type_get(t)->block;
        const int64_t lens[] = {block, 3 * block, 4096, 4096 + block, 4096 + 8 * block};
        for (size_t j = 0; j < sizeof lens / sizeof lens[0]; j++)
            check_dot_act2(t, lens[j], j % 2, tables, n_tables);
    }
}

/* One round of test_pack8: eight rows of n values of type t (rb bytes
 * each), packed, and an input row in the activations' type at (ab bytes),
 * each at an odd address; the kernel tables this CPU runs. */
struct pack8_round {
    uint32_t t, at;
    int64_t n;
    size_t rb, ab;
    const uint8_t *rows, *pk, *xa;
    bool extreme; /* quants at the ends of their range */
    const struct si__quants_table *const *tables;
    const bool *usable;
};

/* Each table's packed dot (dot_act8) against its dot_act of the unpacked
 * rows, bit for bit; the number of dots compared. */
static int check_packed_dots(const struct pack8_round *q)
{
    const uint32_t t = q->t;
    const int64_t n = q->n;
    int compared = 0;
    for (int k = 0; k < 3; k++) {
        const struct si__quants_kernels *kern = &q->tables[k]->type[t];
        if (!q->usable[k] || (k == 2 && kern->dot_act == NULL && kern->dot_act8 == NULL))
            continue; /* VNNI's overlay keeps the AVX2 kernels of this type */
        CHECK(kern->dot_act8 != NULL, "%s %s: no packed dot", q->tables[k]->name, si_type_name(t));
        if (kern->dot_act8 == NULL)
            continue;
        /* VNNI's table holds only its own kernels: its rows'
         * dot is the AVX2 table's (the same bits). */
        si__dot_act_fn dot =
            kern->dot_act != NULL ? kern->dot_act : si__quants_avx2.type[t].dot_act;
        float got[8];
        kern->dot_act8(q->pk, q->xa, n, got);
        for (int r = 0; r < 8; r++) {
            const float want = dot(q->rows + (size_t)r * q->rb, q->xa, n);
            CHECK(memcmp(&got[r], &want, sizeof want) == 0,
                  "%s %s n=%lld row %d: packed %a, dot_act %a", q->tables[k]->name, si_type_name(t),
                  (long long)n, r, (double)got[r], (double)want);
            compared++;
        }
        if (kern->dot_act8_next == NULL)
            continue;
        /* The variant that prefetches into another group (si_vec_dot_act8_next),
         * over the whole row and over a range of its blocks (the second
         * half, and the blocks after the first): dot_act8's bits on the same
         * range.  next: this group itself, the test's only one. */
        const int64_t nb = n / 32, firsts[3] = {0, nb / 2, 1};
        for (int f = 0; f < 3; f++) {
            const int64_t b0 = firsts[f], len = (nb - b0) * 32;
            if (len <= 0)
                continue;
            const uint8_t *g0 = q->pk + (size_t)b0 * si_pack8_block_bytes(t);
            const uint8_t *a0 = q->xa + (size_t)b0 * (q->ab / (size_t)nb);
            float plain[8], next[8];
            kern->dot_act8(g0, a0, len, plain);
            kern->dot_act8_next(g0, a0, len, next, q->pk);
            CHECK(memcmp(plain, next, sizeof plain) == 0,
                  "%s %s n=%lld from block %lld: dot_act8_next differs from dot_act8",
                  q->tables[k]->name, si_type_name(t), (long long)n, (long long)b0);
            compared += 8;
        }
    }
    return compared;
}

/* Each table's dequantize8 of the packed rows against its dequantize of
 * each row, bit for bit. */
static void check_dequantize8(const struct pack8_round *q)
{
    const uint32_t t = q->t;
    const int64_t n = q->n;
    for (int k = 0; k < 3; k++) {
        const struct si__quants_kernels *kern = &q->tables[k]->type[t];
        if (!q->usable[k] || k == 2)
            continue; /* VNNI's table has no dequantizers */
        float *d8 = malloc(8 * (size_t)n * sizeof *d8), *d1 = malloc((size_t)n * 4);
        kern->dequantize8(q->pk, n, d8);
        for (int r = 0; r < 8; r++) {
            kern->dequantize(q->rows + (size_t)r * q->rb, d1, n);
            CHECK(memcmp(d8 + (size_t)r * n, d1, (size_t)n * 4) == 0,
                  "%s %s n=%lld row %d: dequantize8 differs", q->tables[k]->name, si_type_name(t),
                  (long long)n, r);
        }
        free(d8);
        free(d1);
    }
}

/* si_gemm8 of the packed rows by 11 tokens (the first extreme in the
 * extreme rounds): each token's bits whatever tokens share its call, and
 * within the float sums' reordering of dot_act; the number compared. */
static int check_gemm8(const struct pack8_round *q)
{
    const uint32_t t = q->t, at = q->at;
    const int64_t n = q->n;
    const size_t ab = q->ab, rb = q->rb;
    const bool extreme = q->extreme;
    int compared = 0;
    enum { NT = 11 };
    /* 11 tokens (the first extreme in the extreme rounds):
     * tiles of 4 and 8 and their ends */
    size_t xs = ab;
    uint8_t *xs3 = malloc(NT * ab);
    int32_t *sums = malloc(NT * (size_t)(n / 32) * sizeof *sums);
    float *xt = malloc(NT * (size_t)n * sizeof *xt), *wr = malloc((size_t)n * 4);
    float y3[NT * 8];
    for (int tk = 0; tk < NT; tk++) {
        for (int64_t k = 0; k < n; k++)
            xt[tk * n + k] = tk == 0 && extreme ? ((k % 3) ? 4.0f : -4.0f) : (float)uniform(-2, 2);
        si_quantize_act(at, xt + tk * n, xs3 + tk * xs, n);
        si_act_block_sums(at, xs3 + tk * xs, n, sums + tk * (n / 32));
    }
    si_gemm8(t, q->pk, n, xs3, xs, sums, NT, y3, 8);
    /* each token's bits whatever tokens share its call
     * (tiles of 8, 4, 2, 1): a batch's token equals itself
     * in any other batch */
    for (int s0 = 0; s0 < NT; s0 += 3)
        for (int m = 1; s0 + m <= NT; m++) {
            float ym[NT * 8];
            si_gemm8(t, q->pk, n, xs3 + (size_t)s0 * xs, xs, sums + (size_t)s0 * (size_t)(n / 32),
                     m, ym, 8);
            CHECK(memcmp(ym, y3 + s0 * 8, (size_t)m * 8 * sizeof *ym) == 0,
                  "%s n=%lld: gemm8 of tokens %d..%d alone differs from them "
                  "in the batch of %d",
                  si_type_name(t), (long long)n, s0, s0 + m - 1, NT);
        }
    for (int r = 0; r < 8; r++) {
        si_dequantize_row(t, q->rows + (size_t)r * rb, wr, n);
        float wmax = 0.0f;
        for (int64_t k = 0; k < n; k++)
            wmax = fmaxf(wmax, fabsf(wr[k]));
        for (int tk = 0; tk < NT; tk++) {
            const float want = si_vec_dot_act(t, q->rows + (size_t)r * rb, xs3 + tk * xs, n);
            /* The float sums differ in order: within a
             * millionth of the size of the terms summed
             * (a min's term is at most the largest weight),
             * for the K types' mins cancel in the end.
             * Q4_K's batched kernel keeps dot_act's float
             * steps: exact. */
            double mag = 0;
            for (int64_t k = 0; k < n; k++)
                mag += fabs((double)xt[tk * n + k]) * (fabsf(wr[k]) + wmax);
            const float tol = t == SI_TYPE_Q4_K
                                  ? 0.0f
                                  : 1e-5f * (fabsf(want) + (float)n * 0.01f) + 1e-6f * (float)mag;
            CHECK(fabsf(y3[tk * 8 + r] - want) <= tol,
                  "%s n=%lld token %d row %d: gemm8 %.9g, dot_act %.9g", si_type_name(t),
                  (long long)n, tk, r, (double)y3[tk * 8 + r], (double)want);
            compared++;
        }
    }
    free(xs3);
    free(sums);
    free(xt);
    free(wr);
    return compared;
}

/* The same rows by pointers, in another order (dot_act8p, with lookahead
 * pointers for some): each table's against its dot_act, and
 * si_vec_dot_act8p's against si_vec_dot_act; the number compared. */
static int check_dot_act8p(const struct pack8_round *q)
{
    const uint32_t t = q->t;
    const int64_t n = q->n;
    int compared = 0;
    const void *rp[8], *ah[8];
    for (int r = 0; r < 8; r++) {
        rp[r] = q->rows + (size_t)((r * 3) % 8) * q->rb;
        ah[r] = r % 2 ? q->rows + (size_t)r * q->rb : NULL;
    }
    for (int k = 0; k < 3; k++) {
        const struct si__quants_kernels *kern = &q->tables[k]->type[t];
        if (!q->usable[k] || kern->dot_act8p == NULL)
            continue;
        si__dot_act_fn dot =
            kern->dot_act != NULL ? kern->dot_act : si__quants_avx2.type[t].dot_act;
        float o[8];
        kern->dot_act8p(rp, q->xa, n, o, ah);
        for (int r = 0; r < 8; r++) {
            const float want = dot(rp[r], q->xa, n);
            CHECK(memcmp(&o[r], &want, sizeof want) == 0,
                  "%s %s n=%lld row %d: dot_act8p %a, dot_act %a", q->tables[k]->name,
                  si_type_name(t), (long long)n, r, (double)o[r], (double)want);
            compared++;
        }
    }
    float o[8];
    si_vec_dot_act8p(t, rp, q->xa, n, o, NULL);
    for (int r = 0; r < 8; r++) {
        const float want = si_vec_dot_act(t, rp[r], q->xa, n);
        CHECK(memcmp(&o[r], &want, sizeof want) == 0, "%s n=%lld row %d: si_vec_dot_act8p differs",
              si_type_name(t), (long long)n, r);
    }
    return compared;
}

/*
 * Packed groups (model/pack8.h): for every table this CPU runs (and VNNI's),
 * each row's packed dot equals that table's dot_act of the unpacked row bit
 * for bit; unpacking gives back the rows byte for byte; extreme values
 * (all quants at the ends of their range) and odd addresses included.
 */
static void test_pack8(void)
{
    const struct si__quants_table *tables[3] = {&si__quants_scalar, &si__quants_avx2,
                                                &si__quants_vnni};
    const bool usable[3] = {true, si__quants_avx2_usable(), si__quants_vnni_usable()};
    const uint32_t types[] = {SI_TYPE_Q4_0, SI_TYPE_Q4_1, SI_TYPE_Q8_0, SI_TYPE_Q4_K,
                              SI_TYPE_Q5_K, SI_TYPE_Q6_K};
    int compared = 0;
    for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++) {
        const uint32_t t = types[ti], at = si_act_type(t);
        CHECK(si_pack8_type(t) && si_pack8_block_bytes(t) == 8 * si_type_get(t)->size,
              "%s: packed block size", si_type_name(t));
        const int64_t lens[] = {32, 96, 576, 4096, 256, 768, 11008};
        for (size_t j = 0; j < sizeof lens / sizeof lens[0]; j++) {
            const int64_t n = lens[j];
            if (n % si_type_get(t)->block != 0)
                continue;
            size_t rb = 0, ab = 0;
            si_type_row_size(t, n, &rb);
            si_type_row_size(at, n, &ab);
            uint8_t *rows = malloc(8 * rb + 1), *pk = malloc(8 * rb + 1), *back = malloc(rb);
            uint8_t *xa = malloc(ab + 1);
            float *x = malloc((size_t)n * sizeof *x);
            for (int round = 0; round < 8; round++) {
                const bool extreme = round % 4 == 3;
                for (int r = 0; r < 8; r++) {
                    for (int64_t k = 0; k < n; k++)
                        x[k] = extreme ? ((k + r) % 2 ? 1.0f : -1.0f) : (float)uniform(-1, 1);
                    si_quantize_row(t, x, rows + 1 + (size_t)r * rb, n);
                }
                for (int64_t k = 0; k < n; k++)
                    x[k] = extreme ? ((k % 3) ? 4.0f : -4.0f) : (float)uniform(-2, 2);
                si_quantize_act(at, x, xa + 1, n);
                si_pack8(t, rows + 1, rb, n, pk + 1);
                for (int r = 0; r < 8; r++) {
                    si_unpack8_row(t, pk + 1, r, n, back);
                    CHECK(memcmp(back, rows + 1 + (size_t)r * rb, rb) == 0,
                          "%s n=%lld: row %d unpacked differs", si_type_name(t), (long long)n, r);
                }
                const struct pack8_round q = {.t = t,
                                              .at = at,
                                              .n = n,
                                              .rb = rb,
                                              .ab = ab,
                                              .rows = rows + 1,
                                              .pk = pk + 1,
                                              .xa = xa + 1,
                                              .extreme = extreme,
                                              .tables = tables,
                                              .usable = usable};
                compared += check_packed_dots(&q);
                check_dequantize8(&q);
                if (si_gemm8_available(t))
                    compared += check_gemm8(&q);
                compared += check_dot_act8p(&q);
                float got[8];
                si_vec_dot_act8(t, pk + 1, xa + 1, n, got);
                for (int r = 0; r < 8; r++) {
                    const float want = si_vec_dot_act(t, rows + 1 + (size_t)r * rb, xa + 1, n);
                    CHECK(memcmp(&got[r], &want, sizeof want) == 0,
                          "%s n=%lld row %d: si_vec_dot_act8 differs", si_type_name(t),
                          (long long)n, r);
                }
            }
            free(rows);
            free(pk);
            free(back);
            free(xa);
            free(x);
        }
    }
    CHECK(!si_pack8_type(SI_TYPE_F16) && !si_pack8_type(SI_TYPE_Q5_0), "unpacked types");
    printf("pack8: %d packed dots equal to their rows' dot_act\n", compared);
}

/*
 * si_ref_matvec_cols (model/forward.h): a product over a range of W's
 * columns, as the engine's attention groups take Wo.  On a matrix of
 * Q4_0, Q8_0 and Q4_K rows (packed groups, then unpacked rows: pk 40 of
 * 44): packed and unpacked give the same bits; the whole range gives
 * si_ref_matvec's; and the ranges of a split add up to the whole product
 * within float addition's error, 2 (blocks + 2) u sum |w x| a row (u =
 * 2^-24: the partial sums' roundings and the two added).
 */
static void test_matvec_cols(void)
{
    const uint32_t types[] = {SI_TYPE_Q4_0, SI_TYPE_Q8_0, SI_TYPE_Q4_K};
    for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++) {
        const uint32_t t = types[ti];
        const int64_t n = 1024, rows = 44, blk = si_type_get(t)->block;
        size_t rb = 0;
        si_type_row_size(t, n, &rb);
        uint8_t *plain = malloc((size_t)rows * rb), *pk = malloc((size_t)rows * rb);
        float *x = malloc((size_t)n * sizeof *x), *wr = malloc((size_t)n * sizeof *wr);
        float *y = malloc((size_t)rows * sizeof *y), *yp = malloc((size_t)rows * sizeof *yp),
              *yu = malloc((size_t)rows * sizeof *yu), *ys = calloc((size_t)rows, sizeof *ys);
        void *xq = malloc(2 * (size_t)n + 1024);
        for (int64_t r = 0; r < rows; r++) {
            for (int64_t k = 0; k < n; k++)
                wr[k] = (float)uniform(-1, 1);
            si_quantize_row(t, wr, plain + (size_t)r * rb, n);
        }
        memcpy(pk, plain, (size_t)rows * rb);
        for (int64_t g = 0; g + 8 <= 40; g += 8)
            si_pack8(t, plain + (size_t)g * rb, rb, n, pk + (size_t)g * rb);
        for (int64_t k = 0; k < n; k++)
            x[k] = (float)uniform(-2, 2);
        struct si_tensor wp = {.data = pk,
                               .type = t,
                               .ne = {n, rows, 1, 1},
                               .nbytes = (size_t)rows * rb,
                               .row_bytes = rb,
                               .pk = 40};
        struct si_tensor wu = wp;
        wu.data = plain;
        wu.pk = 0;
        si_ref_matvec(true, xq, y, &wp, x);
        si_ref_matvec_cols(true, xq, yp, &wp, x, 0, n);
        CHECK(memcmp(y, yp, (size_t)rows * sizeof *y) == 0,
              "%s: all columns differ from the product", si_type_name(t));
        const int64_t cut[] = {0, blk, n / 2, n - blk, n};
        for (int p = 0; p + 1 < 5; p++) {
            si_ref_matvec_cols(true, xq, yp, &wp, x, cut[p], cut[p + 1]);
            si_ref_matvec_cols(true, xq, yu, &wu, x, cut[p], cut[p + 1]);
            CHECK(memcmp(yp, yu, (size_t)rows * sizeof *yp) == 0,
                  "%s columns [%lld, %lld): packed and unpacked differ", si_type_name(t),
                  (long long)cut[p], (long long)cut[p + 1]);
            for (int64_t r = 0; r < rows; r++)
                ys[r] += yp[r];
        }
        /* si__products_ranges (codelets/prefill.h), a step's decoding
         * tokens' Wo: each token the ranges' products added in order, bit
         * for bit, packed or not; three tokens, the third x reversed */
        enum { NT = 3 };
        float *xs = malloc((size_t)NT * (size_t)n * sizeof *xs),
              *yr = malloc((size_t)NT * (size_t)rows * sizeof *yr);
        char *scr = malloc((size_t)NT * (2 * (size_t)n + 1024));
        for (int tk = 0; tk < NT; tk++)
            for (int64_t k = 0; k < n; k++)
                xs[tk * n + k] = tk == 2 ? x[n - 1 - k] : tk == 1 ? -0.5f * x[k] : x[k];
        for (int v = 0; v < 2; v++) {
            const struct si_tensor *w = v == 0 ? &wp : &wu;
            si__products_ranges(true, w, cut, 4, xs, n, NT, yr, rows, scr);
            int bad = 0;
            for (int tk = 0; tk < NT; tk++) {
                float acc[44];
                for (int p = 0; p + 1 < 5; p++) {
                    si_ref_matvec_cols(true, xq, yu, w, xs + tk * n, cut[p], cut[p + 1]);
                    for (int64_t r = 0; r < rows; r++)
                        acc[r] = p == 0 ? yu[r] : acc[r] + yu[r];
                }
                bad += memcmp(acc, yr + tk * rows, (size_t)rows * sizeof *acc) != 0;
            }
            CHECK(bad == 0,
                  "%s %s: products_ranges differs from the ranges added in order on %d tokens",
                  si_type_name(t), v == 0 ? "packed" : "unpacked", bad);
        }
        free(xs);
        free(yr);
        free(scr);
        for (int64_t r = 0; r < rows; r++) {
            si_dequantize_row(t, plain + (size_t)r * rb, wr, n);
            double mag = 0;
            for (int64_t k = 0; k < n; k++)
                mag += fabs((double)wr[k] * (double)x[k]);
            const double bound = 2.0 * (double)(n / blk + 2) * 0x1p-24 * mag;
            CHECK(fabs((double)ys[r] - (double)y[r]) <= bound,
                  "%s row %lld: the ranges add up to %g, the product %g (bound %g)",
                  si_type_name(t), (long long)r, (double)ys[r], (double)y[r], bound);
        }
        free(plain);
        free(pk);
        free(x);
        free(wr);
        free(y);
        free(yp);
        free(yu);
        free(ys);
        free(xq);
    }
    printf("matvec_cols: column ranges of Q4_0, Q8_0, Q4_K rows checked, and products_ranges\n");
}

int main(void)
{
    test_conversions();
    test_kernels();
    test_quantize();
    test_quantize_k();
    test_act();
    test_mad4();
    test_dot_act2();
    test_vnni();
    test_matvec_cols();
    test_pack8();
    return test_result();
}
