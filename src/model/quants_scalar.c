/*
 * quants_scalar.c - the portable kernels behind quants.h: its fp16 and bf16
 * conversions (si_fp16_to_fp32 and the others), and the scalar table
 * (si__quants_scalar) of dequantize, dot, quantized-activation and mad
 * kernels for every supported type.
 *
 * These are pure kernels: they know nothing of which table runs, which
 * quants_dispatch.c chooses.  quants.c's public functions call them through
 * that choice, and call the two batch kernels below (si__dot_act_q4_k_groups,
 * si__dot_act_q6_k_tiled) directly.
 *
 * Block layouts (little-endian, "half" = IEEE binary16):
 *   Q8_0  34 bytes / 32: half d; int8 qs[32]                x = d*q
 *   Q4_0  18 bytes / 32: half d; u8 qs[16]                  x = d*(q-8)
 *   Q4_1  20 bytes / 32: half d, m; u8 qs[16]               x = d*q + m
 *   Q5_0  22 bytes / 32: half d; u8 qh[4]; u8 qs[16]        x = d*(q-16)
 *   Q5_1  24 bytes / 32: half d, m; u8 qh[4]; u8 qs[16]     x = d*q + m
 *   Q4_K 144 bytes / 256: half d, dmin; u8 sc[12]; u8 qs[128]
 *   Q5_K 176 bytes / 256: half d, dmin; u8 sc[12]; u8 qh[32]; u8 qs[128]
 *   Q6_K 210 bytes / 256: u8 ql[128]; u8 qh[64]; int8 sc[16]; half d
 * In the 32-element types, element j < 16 is the low nibble of qs[j] and
 * element j + 16 its high nibble; the 5th bit of element j is bit j of qh.
 */
#include "model/quants.h"

#include "model/act.h"
#include "model/quants_impl.h"
#include "model/types.h"

#include <math.h>
#include <string.h>

#define QK 32   /* elements per block of the 32-element types */
#define QK_K 256 /* elements per super-block of the K types */

/* ------------------------------------------------------ fp16 and bf16 */

float si_fp16_to_fp32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    uint32_t exp = (h >> 10) & 0x1f;
    uint32_t mant = h & 0x3ff;
    if (exp == 0x1f) /* infinity, or NaN with its payload kept */
        return si_act_float(sign | 0x7f800000u | mant << 13);
    if (exp == 0) { /* zero or subnormal: mant * 2^-24, exact in float */
        float v = (float)mant * 0x1p-24f;
        return sign ? -v : v;
    }
    return si_act_float(sign | (exp + 112) << 23 | mant << 13);
}

uint16_t si_fp32_to_fp16(float f)
{
    uint32_t x = si_act_bits(f);
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000);
    x &= 0x7fffffffu;
    if (x > 0x7f800000u) /* NaN: keep the top payload bits, and stay a NaN */
        return sign | 0x7e00 | (uint16_t)((x >> 13) & 0x3ff);
    if (x >= 0x477ff000u) /* 65520 and up, infinity included, round to infinity */
        return sign | 0x7c00;
    if (x >= 0x38800000u) { /* the normal range, from 2^-14 */
        uint32_t h = ((x >> 23) - 112) << 10 | (x & 0x7fffff) >> 13;
        uint32_t rest = x & 0x1fff;
        /* Round to nearest even; a carry into the exponent is still right. */
        if (rest > 0x1000 || (rest == 0x1000 && (h & 1)))
            h++;
        return sign | (uint16_t)h;
    }
    /* Subnormal halves: the value in units of 2^-24 is m * 2^(e - 126). */
    uint32_t e = x >> 23;
    if (e < 102) /* below 2^-25: rounds to zero (2^-25 itself is handled below) */
        return sign;
    uint32_t m = (x & 0x7fffff) | 0x800000;
    uint32_t shift = 126 - e; /* 14 ... 24 */
    uint32_t h = m >> shift;
    uint32_t rest = m & ((1u << shift) - 1);
    uint32_t half = 1u << (shift - 1);
    if (rest > half || (rest == half && (h & 1)))
        h++;
    return sign | (uint16_t)h;
}

float si_bf16_to_fp32(uint16_t h)
{
    return si_act_float((uint32_t)h << 16);
}

uint16_t si_fp32_to_bf16(float f)
{
    uint32_t x = si_act_bits(f);
    if ((x & 0x7fffffffu) > 0x7f800000u) /* NaN: truncate, then force a quiet NaN */
        return (uint16_t)(x >> 16) | 0x40;
    /* Round to nearest even; large finite values carry into infinity. */
    return (uint16_t)((x + 0x7fffu + ((x >> 16) & 1)) >> 16);
}

/* ------------------------------------------------------ byte access */

static float half_at(const uint8_t *p)
{
    uint16_t h;
    memcpy(&h, p, sizeof h);
    return si_fp16_to_fp32(h);
}

static uint32_t u32_at(const uint8_t *p)
{
    uint32_t v;
    memcpy(&v, p, sizeof v);
    return v;
}

static void put_half(uint8_t *p, float f)
{
    uint16_t h = si_fp32_to_fp16(f);
    memcpy(p, &h, sizeof h);
}

/* ------------------------------------------------------ float rows */

static void dequantize_f32(const void *src, float *dst, int64_t n)
{
    memcpy(dst, src, (size_t)n * sizeof(float));
}

static void dequantize_f16(const void *src, float *dst, int64_t n)
{
    const uint8_t *p = src;
    for (int64_t i = 0; i < n; i++)
        dst[i] = half_at(p + 2 * i);
}

static void dequantize_bf16(const void *src, float *dst, int64_t n)
{
    const uint8_t *p = src;
    for (int64_t i = 0; i < n; i++) {
        uint16_t h;
        memcpy(&h, p + 2 * i, sizeof h);
        dst[i] = si_bf16_to_fp32(h);
    }
}

/*
 * The float types have no blocks; their dots still sum runs of 32 products
 * apart before adding them to the total, as the block types do.
 */
static float dot_f32(const void *row, const float *x, int64_t n)
{
    const uint8_t *p = row;
    float sum = 0.0f;
    for (int64_t i = 0; i < n; i += QK) {
        int64_t end = i + QK < n ? i + QK : n;
        float s = 0.0f;
        for (int64_t j = i; j < end; j++) {
            float w;
            memcpy(&w, p + 4 * j, sizeof w);
            s += w * x[j];
        }
        sum += s;
    }
    return sum;
}

static float dot_f16(const void *row, const float *x, int64_t n)
{
    const uint8_t *p = row;
    float sum = 0.0f;
    for (int64_t i = 0; i < n; i += QK) {
        int64_t end = i + QK < n ? i + QK : n;
        float s = 0.0f;
        for (int64_t j = i; j < end; j++)
            s += half_at(p + 2 * j) * x[j];
        sum += s;
    }
    return sum;
}

static float dot_bf16(const void *row, const float *x, int64_t n)
{
    const uint8_t *p = row;
    float sum = 0.0f;
    for (int64_t i = 0; i < n; i += QK) {
        int64_t end = i + QK < n ? i + QK : n;
        float s = 0.0f;
        for (int64_t j = i; j < end; j++) {
            uint16_t h;
            memcpy(&h, p + 2 * j, sizeof h);
            s += si_bf16_to_fp32(h) * x[j];
        }
        sum += s;
    }
    return sum;
}

/* ------------------------------------------------------ 32-element blocks */

static void dequantize_q8_0(const void *src, float *dst, int64_t n)
{
    const uint8_t *b = src;
    for (int64_t i = 0; i < n; i += QK, b += 34) {
        float d = half_at(b);
        const int8_t *qs = (const int8_t *)(b + 2);
        for (int j = 0; j < QK; j++)
            dst[i + j] = d * qs[j];
    }
}

static float dot_q8_0(const void *row, const float *x, int64_t n)
{
    const uint8_t *b = row;
    float sum = 0.0f;
    for (int64_t i = 0; i < n; i += QK, b += 34) {
        const int8_t *qs = (const int8_t *)(b + 2);
        float s = 0.0f;
        for (int j = 0; j < QK; j++)
            s += qs[j] * x[i + j];
        sum += half_at(b) * s;
    }
    return sum;
}

static void dequantize_q4_0(const void *src, float *dst, int64_t n)
{
    const uint8_t *b = src;
    for (int64_t i = 0; i < n; i += QK, b += 18) {
        float d = half_at(b);
        const uint8_t *qs = b + 2;
        for (int j = 0; j < 16; j++) {
            dst[i + j] = d * ((qs[j] & 0xf) - 8);
            dst[i + j + 16] = d * ((qs[j] >> 4) - 8);
        }
    }
}

static float dot_q4_0(const void *row, const float *x, int64_t n)
{
    const uint8_t *b = row;
    float sum = 0.0f;
    for (int64_t i = 0; i < n; i += QK, b += 18) {
        const uint8_t *qs = b + 2;
        float s = 0.0f;
        for (int j = 0; j < 16; j++)
            s += ((qs[j] & 0xf) - 8) * x[i + j] + ((qs[j] >> 4) - 8) * x[i + j + 16];
        sum += half_at(b) * s;
    }
    return sum;
}

static void dequantize_q4_1(const void *src, float *dst, int64_t n)
{
    const uint8_t *b = src;
    for (int64_t i = 0; i < n; i += QK, b += 20) {
        float d = half_at(b), m = half_at(b + 2);
        const uint8_t *qs = b + 4;
        for (int j = 0; j < 16; j++) {
            dst[i + j] = d * (qs[j] & 0xf) + m;
            dst[i + j + 16] = d * (qs[j] >> 4) + m;
        }
    }
}

/* Sum of (d*q + m) * x = d * sum(q*x) + m * sum(x), per block. */
static float dot_q4_1(const void *row, const float *x, int64_t n)
{
    const uint8_t *b = row;
    float sum = 0.0f;
    for (int64_t i = 0; i < n; i += QK, b += 20) {
        const uint8_t *qs = b + 4;
        float sq = 0.0f, sx = 0.0f;
        for (int j = 0; j < 16; j++) {
            sq += (qs[j] & 0xf) * x[i + j] + (qs[j] >> 4) * x[i + j + 16];
            sx += x[i + j] + x[i + j + 16];
        }
        sum += half_at(b) * sq + half_at(b + 2) * sx;
    }
    return sum;
}

/* The 5-bit values of a Q5_0 / Q5_1 block, 0 ... 31. */
static void q5_values(const uint8_t *qh4, const uint8_t *qs, int q[QK])
{
    uint32_t qh = u32_at(qh4);
    for (int j = 0; j < 16; j++) {
        q[j] = (qs[j] & 0xf) | ((qh >> j) & 1) << 4;
        q[j + 16] = (qs[j] >> 4) | ((qh >> (j + 16)) & 1) << 4;
    }
}

static void dequantize_q5_0(const void *src, float *dst, int64_t n)
{
    const uint8_t *b = src;
    for (int64_t i = 0; i < n; i += QK, b += 22) {
        float d = half_at(b);
        int q[QK];
        q5_values(b + 2, b + 6, q);
        for (int j = 0; j < QK; j++)
            dst[i + j] = d * (q[j] - 16);
    }
}

static float dot_q5_0(const void *row, const float *x, int64_t n)
{
    const uint8_t *b = row;
    float sum = 0.0f;
    for (int64_t i = 0; i < n; i += QK, b += 22) {
        int q[QK];
        q5_values(b + 2, b + 6, q);
        float s = 0.0f;
        for (int j = 0; j < QK; j++)
            s += (q[j] - 16) * x[i + j];
        sum += half_at(b) * s;
    }
    return sum;
}

static void dequantize_q5_1(const void *src, float *dst, int64_t n)
{
    const uint8_t *b = src;
    for (int64_t i = 0; i < n; i += QK, b += 24) {
        float d = half_at(b), m = half_at(b + 2);
        int q[QK];
        q5_values(b + 4, b + 8, q);
        for (int j = 0; j < QK; j++)
            dst[i + j] = d * q[j] + m;
    }
}

static float dot_q5_1(const void *row, const float *x, int64_t n)
{
    const uint8_t *b = row;
    float sum = 0.0f;
    for (int64_t i = 0; i < n; i += QK, b += 24) {
        int q[QK];
        q5_values(b + 4, b + 8, q);
        float sq = 0.0f, sx = 0.0f;
        for (int j = 0; j < QK; j++) {
            sq += q[j] * x[i + j];
            sx += x[i + j];
        }
        sum += half_at(b) * sq + half_at(b + 2) * sx;
    }
    return sum;
}

/* ------------------------------------------------------ K super-blocks */

/*
 * The 256 values (0 ... 31) of a Q4_K or Q5_K super-block (k_quants), and
 * with them the scale and min of each of its 8 sub-blocks of 32 (k_values).
 * qh is NULL for Q4_K.
 */
static void k_quants(const uint8_t *qh, const uint8_t *qs, int q[QK_K])
{
    for (int c = 0; c < 4; c++) {
        for (int l = 0; l < 32; l++) {
            int lo = qs[32 * c + l] & 0xf, hi = qs[32 * c + l] >> 4;
            if (qh != NULL) {
                lo |= ((qh[l] >> (2 * c)) & 1) << 4;
                hi |= ((qh[l] >> (2 * c + 1)) & 1) << 4;
            }
            q[64 * c + l] = lo;
            q[64 * c + 32 + l] = hi;
        }
    }
}

static void k_values(const uint8_t *sc, const uint8_t *qh, const uint8_t *qs, int q[QK_K],
                     float d, float dmin, float scale[8], float min[8])
{
    for (int j = 0; j < 8; j++) {
        int s, m;
        si__k_scale_min(sc, j, &s, &m);
        scale[j] = d * s;
        min[j] = dmin * m;
    }
    k_quants(qh, qs, q);
}

static void dequantize_k(const void *src, float *dst, int64_t n, bool five)
{
    size_t size = five ? 176 : 144;
    const uint8_t *b = src;
    for (int64_t i = 0; i < n; i += QK_K, b += size) {
        int q[QK_K];
        float scale[8], min[8];
        k_values(b + 4, five ? b + 16 : NULL, five ? b + 48 : b + 16, q, half_at(b),
                 half_at(b + 2), scale, min);
        for (int j = 0; j < QK_K; j++)
            dst[i + j] = scale[j / 32] * q[j] - min[j / 32];
    }
}

/* Per sub-block: scale * sum(q*x) - min * sum(x). */
static float dot_k(const void *row, const float *x, int64_t n, bool five)
{
    size_t size = five ? 176 : 144;
    const uint8_t *b = row;
    float sum = 0.0f;
    for (int64_t i = 0; i < n; i += QK_K, b += size) {
        int q[QK_K];
        float scale[8], min[8];
        k_values(b + 4, five ? b + 16 : NULL, five ? b + 48 : b + 16, q, half_at(b),
                 half_at(b + 2), scale, min);
        float s = 0.0f;
        for (int j = 0; j < 8; j++) {
            float sq = 0.0f, sx = 0.0f;
            for (int l = 32 * j; l < 32 * j + 32; l++) {
                sq += q[l] * x[i + l];
                sx += x[i + l];
            }
            s += scale[j] * sq - min[j] * sx;
        }
        sum += s;
    }
    return sum;
}

static void dequantize_q4_k(const void *src, float *dst, int64_t n)
{
    dequantize_k(src, dst, n, false);
}

static float dot_q4_k(const void *row, const float *x, int64_t n)
{
    return dot_k(row, x, n, false);
}

static void dequantize_q5_k(const void *src, float *dst, int64_t n)
{
    dequantize_k(src, dst, n, true);
}

static float dot_q5_k(const void *row, const float *x, int64_t n)
{
    return dot_k(row, x, n, true);
}

/*
 * The 256 signed values (-32 ... 31) of a Q6_K super-block; element e uses
 * scale sc[e / 16].
 */
static void q6_k_values(const uint8_t *b, int q[QK_K])
{
    for (int h = 0; h < 2; h++) {
        const uint8_t *ql = b + 64 * h, *qh = b + 128 + 32 * h;
        int *y = q + 128 * h;
        for (int l = 0; l < 32; l++) {
            y[l] = ((ql[l] & 0xf) | (qh[l] & 3) << 4) - 32;
            y[l + 32] = ((ql[l + 32] & 0xf) | ((qh[l] >> 2) & 3) << 4) - 32;
            y[l + 64] = ((ql[l] >> 4) | ((qh[l] >> 4) & 3) << 4) - 32;
            y[l + 96] = ((ql[l + 32] >> 4) | ((qh[l] >> 6) & 3) << 4) - 32;
        }
    }
}

static void dequantize_q6_k(const void *src, float *dst, int64_t n)
{
    const uint8_t *b = src;
    for (int64_t i = 0; i < n; i += QK_K, b += 210) {
        const int8_t *sc = (const int8_t *)(b + 192);
        float d = half_at(b + 208);
        int q[QK_K];
        q6_k_values(b, q);
        for (int j = 0; j < QK_K; j++)
            dst[i + j] = d * sc[j / 16] * q[j];
    }
}

static float dot_q6_k(const void *row, const float *x, int64_t n)
{
    const uint8_t *b = row;
    float sum = 0.0f;
    for (int64_t i = 0; i < n; i += QK_K, b += 210) {
        const int8_t *sc = (const int8_t *)(b + 192);
        int q[QK_K];
        q6_k_values(b, q);
        float s = 0.0f;
        for (int j = 0; j < 16; j++) {
            float sq = 0.0f;
            for (int l = 16 * j; l < 16 * j + 16; l++)
                sq += q[l] * x[i + l];
            s += sc[j] * sq;
        }
        sum += half_at(b + 208) * s;
    }
    return sum;
}

/* ------------------------------------------------------ quantized activations */

/*
 * The activation types (llama.cpp's vec_dot_types), written as llama.cpp's
 * x86 CPU backend writes them, and the dots of each weight type with its
 * activation type in the forms ggml uses: integer sums per block, scaled
 * and summed in float.
 *   Q8_1  36 bytes / 32: half d, s; int8 qs[32]            s = d * sum(qs)
 *   Q8_K 292 bytes / 256: float d; int8 qs[256]; int16 bsums[16]
 */

/*
 * v rounded to the nearest integer, ties to even (the default rounding
 * mode), then narrowed to int8 as AVX2's cvtps_epi32 and saturating packs
 * narrow it: NaN and values out of int32's range give -128.
 */
static int round_to_i8(float v)
{
    v = rintf(v);
    if (!(v >= -2147483648.0f && v < 2147483648.0f))
        return -128;
    return v > 127.0f ? 127 : v < -128.0f ? -128 : (int)v;
}

/*
 * One Q8_0 / Q8_1 block: d = max|x| / 127, q = x * (127 / max|x|) rounded
 * half to even.  Writes qs, returns d unrounded and the sum of qs in *sum.
 */
static float act_q8_block(const float *x, uint8_t *qs, int *sum)
{
    float amax = 0.0f;
    for (int j = 0; j < QK; j++)
        amax = fmaxf(amax, fabsf(x[j]));
    float id = amax != 0.0f ? 127.0f / amax : 0.0f;
    int s = 0;
    for (int j = 0; j < QK; j++) {
        int q = round_to_i8(x[j] * id);
        qs[j] = (uint8_t)q;
        s += q;
    }
    *sum = s;
    return amax / 127.0f;
}

static void quantize_act_q8_0(const float *x, void *dst, int64_t n)
{
    uint8_t *b = dst;
    for (int64_t i = 0; i < n; i += QK, b += 34) {
        int sum;
        put_half(b, act_q8_block(x + i, b + 2, &sum));
    }
}

static void quantize_act_q8_1(const float *x, void *dst, int64_t n)
{
    uint8_t *b = dst;
    for (int64_t i = 0; i < n; i += QK, b += 36) {
        int sum;
        float d = act_q8_block(x + i, b + 4, &sum);
        put_half(b, d);
        put_half(b + 2, d * (float)sum);
    }
}

/* v rounded half to even by adding 1.5 * 2^23 (ggml's nearest_int; exact for |v| < 2^22). */
static int nearest_int(float v)
{
    uint32_t u = si_act_bits(v + 12582912.0f);
    return (int)(u & 0x7fffff) - 0x400000;
}

/*
 * Q8_K: max is the element of largest magnitude (the first on ties),
 * q = min(127, nearest(x * -127 / max)), d = 1 / (-127 / max); an all-zero
 * super-block gets d = 0 and zero quants.
 */
static void quantize_act_q8_k(const float *x, void *dst, int64_t n)
{
    uint8_t *b = dst;
    for (int64_t i = 0; i < n; i += QK_K, b += 292, x += QK_K) {
        float amax = 0.0f, max = 0.0f, d = 0.0f;
        for (int j = 0; j < QK_K; j++) {
            if (fabsf(x[j]) > amax) {
                amax = fabsf(x[j]);
                max = x[j];
            }
        }
        int16_t bsums[QK_K / 16] = {0};
        uint8_t *qs = b + 4;
        if (amax == 0.0f) {
            memset(qs, 0, QK_K);
        } else {
            float iscale = -127.0f / max;
            for (int j = 0; j < QK_K; j++) {
                int q = nearest_int(iscale * x[j]);
                qs[j] = (uint8_t)(q < 127 ? q : 127); /* modulo 256, as ggml's int8 store */
            }
            for (int j = 0; j < QK_K / 16; j++) {
                int s = 0;
                for (int l = 0; l < 16; l++)
                    s += (int8_t)qs[16 * j + l];
                bsums[j] = (int16_t)s;
            }
            d = 1.0f / iscale;
        }
        memcpy(b, &d, sizeof d);
        memcpy(b + 4 + QK_K, bsums, sizeof bsums);
    }
}

static void quantize_act_f32(const float *x, void *dst, int64_t n)
{
    memcpy(dst, x, (size_t)n * sizeof(float));
}

static void quantize_act_f16(const float *x, void *dst, int64_t n)
{
    uint8_t *b = dst;
    for (int64_t i = 0; i < n; i++)
        put_half(b + 2 * i, x[i]);
}

static void quantize_act_bf16(const float *x, void *dst, int64_t n)
{
    uint8_t *b = dst;
    for (int64_t i = 0; i < n; i++) {
        uint16_t h = si_fp32_to_bf16(x[i]);
        memcpy(b + 2 * i, &h, sizeof h);
    }
}

/* The float dots sum float products in double, as ggml's portable code does. */
static float dot_act_f32(const void *row, const void *xa, int64_t n)
{
    const uint8_t *w = row, *a = xa;
    double sum = 0.0;
    for (int64_t i = 0; i < n; i++) {
        float u, v;
        memcpy(&u, w + 4 * i, sizeof u);
        memcpy(&v, a + 4 * i, sizeof v);
        sum += (double)(u * v);
    }
    return (float)sum;
}

static float dot_act_f16(const void *row, const void *xa, int64_t n)
{
    const uint8_t *w = row, *a = xa;
    double sum = 0.0;
    for (int64_t i = 0; i < n; i++)
        sum += (double)(half_at(w + 2 * i) * half_at(a + 2 * i));
    return (float)sum;
}

static float dot_act_bf16(const void *row, const void *xa, int64_t n)
{
    const uint8_t *w = row, *a = xa;
    double sum = 0.0;
    for (int64_t i = 0; i < n; i++) {
        uint16_t u, v;
        memcpy(&u, w + 2 * i, sizeof u);
        memcpy(&v, a + 2 * i, sizeof v);
        sum += (double)(si_bf16_to_fp32(u) * si_bf16_to_fp32(v));
    }
    return (float)sum;
}

static float dot_act_q8_0(const void *row, const void *xa, int64_t n)
{
    const uint8_t *w = row, *a = xa;
    float sum = 0.0f;
    for (int64_t i = 0; i < n; i += QK, w += 34, a += 34) {
        const int8_t *qw = (const int8_t *)(w + 2), *qa = (const int8_t *)(a + 2);
        int s = 0;
        for (int j = 0; j < QK; j++)
            s += qw[j] * qa[j];
        sum += (float)s * (half_at(w) * half_at(a));
    }
    return sum;
}

static float dot_act_q4_0(const void *row, const void *xa, int64_t n)
{
    const uint8_t *w = row, *a = xa;
    float sum = 0.0f;
    for (int64_t i = 0; i < n; i += QK, w += 18, a += 34) {
        const uint8_t *qs = w + 2;
        const int8_t *qa = (const int8_t *)(a + 2);
        int s = 0;
        for (int j = 0; j < 16; j++)
            s += ((qs[j] & 0xf) - 8) * qa[j] + ((qs[j] >> 4) - 8) * qa[j + 16];
        sum += (float)s * (half_at(w) * half_at(a));
    }
    return sum;
}

static float dot_act_q5_0(const void *row, const void *xa, int64_t n)
{
    const uint8_t *w = row, *a = xa;
    float sum = 0.0f;
    for (int64_t i = 0; i < n; i += QK, w += 22, a += 34) {
        const int8_t *qa = (const int8_t *)(a + 2);
        int q[QK], s = 0;
        q5_values(w + 2, w + 6, q);
        for (int j = 0; j < QK; j++)
            s += (q[j] - 16) * qa[j];
        sum += (float)s * (half_at(w) * half_at(a));
    }
    return sum;
}

/* Per block: d_w * d_a * sum(q_w * q_a) + m_w * s_a, s_a = d_a * sum(q_a). */
static float dot_act_q4_1(const void *row, const void *xa, int64_t n)
{
    const uint8_t *w = row, *a = xa;
    float sum = 0.0f;
    for (int64_t i = 0; i < n; i += QK, w += 20, a += 36) {
        const uint8_t *qs = w + 4;
        const int8_t *qa = (const int8_t *)(a + 4);
        int s = 0;
        for (int j = 0; j < 16; j++)
            s += (qs[j] & 0xf) * qa[j] + (qs[j] >> 4) * qa[j + 16];
        sum += (float)s * (half_at(w) * half_at(a)) + half_at(w + 2) * half_at(a + 2);
    }
    return sum;
}

static float dot_act_q5_1(const void *row, const void *xa, int64_t n)
{
    const uint8_t *w = row, *a = xa;
    float sum = 0.0f;
    for (int64_t i = 0; i < n; i += QK, w += 24, a += 36) {
        const int8_t *qa = (const int8_t *)(a + 4);
        int q[QK], s = 0;
        q5_values(w + 4, w + 8, q);
        for (int j = 0; j < QK; j++)
            s += q[j] * qa[j];
        sum += (float)s * (half_at(w) * half_at(a)) + half_at(w + 2) * half_at(a + 2);
    }
    return sum;
}

/* The d and the 16 bsums of the Q8_K super-block at a. */
static float q8_k_header(const uint8_t *a, int16_t bsums[QK_K / 16])
{
    float d;
    memcpy(&d, a, sizeof d);
    memcpy(bsums, a + 4 + QK_K, QK_K / 16 * sizeof *bsums);
    return d;
}

/*
 * Per super-block: d_a * d * sum_j(scale_j * sum(q_w * q_a)) minus
 * d_a * dmin * sum_j(min_j * sum(q_a)), the sums of q_a from the bsums.
 */
/* The exact integers of sub-blocks [j0, j1) of a Q4_K / Q5_K super-block
 * (scale bytes sc, values q) with a Q8_K one (quants qa, bsums): isum = sum
 * of scale_j * (q_w . q_a), msum = sum of min_j * sum(q_a). */
static void k_sub_sums(const uint8_t *sc, const int *q, const int8_t *qa, const int16_t *bsums,
                       int j0, int j1, int *isum, int *msum)
{
    *isum = *msum = 0;
    for (int j = j0; j < j1; j++) {
        int scale, min, s = 0;
        si__k_scale_min(sc, j, &scale, &min);
        for (int l = 32 * j; l < 32 * j + 32; l++)
            s += q[l] * qa[l];
        *isum += scale * s;
        *msum += min * (bsums[2 * j] + bsums[2 * j + 1]);
    }
}

float si__q5_k_block(const void *block, const void *xa)
{
    const uint8_t *w = block, *a = xa;
    int16_t bsums[QK_K / 16];
    float da = q8_k_header(a, bsums);
    const int8_t *qa = (const int8_t *)(a + 4);
    int q[QK_K];
    k_quants(w + 16, w + 48, q);
    int isum, msum;
    k_sub_sums(w + 4, q, qa, bsums, 0, 8, &isum, &msum);
    return da * half_at(w) * (float)isum - da * half_at(w + 2) * (float)msum;
}

/*
 * Q4_K, per super-block: the exact integers isum_c = sum over sub-blocks j
 * in group c of scale_j * (q_w . q_a) and msum_c = sum of min_j * sum(q_a),
 * then two float sums acc += isum_c * (d * d_a) and accm += msum_c * (dmin
 * * d_a), each a fused multiply-add, and the row is acc - accm.  With
 * `group` 8 sub-blocks (one group per super-block) this is how llama.cpp's
 * AVX2 build multiplies a matrix by one vector (its Q4_K matrices repacked 8
 * rows at a time); with `group` 2 how its GEMM multiplies them by the
 * tokens of a batch.  The integers are exact, so every implementation gets
 * the same bits.
 */
void si__q4_k_block(const void *block, const void *xa, int group, float *acc, float *accm)
{
    const uint8_t *w = block, *a = xa;
    int16_t bsums[QK_K / 16];
    const float da = q8_k_header(a, bsums);
    const int8_t *qa = (const int8_t *)(a + 4);
    int q[QK_K];
    k_quants(NULL, w + 16, q);
    const float dd = half_at(w) * da, dm = half_at(w + 2) * da;
    for (int j0 = 0; j0 < 8; j0 += group) {
        int isum, msum;
        k_sub_sums(w + 4, q, qa, bsums, j0, j0 + group, &isum, &msum);
        *acc = fmaf((float)isum, dd, *acc);
        *accm = fmaf((float)msum, dm, *accm);
    }
}

float si__dot_act_q4_k_groups(const void *row, const void *xa, int64_t n, int group)
{
    const uint8_t *w = row, *a = xa;
    float acc = 0.0f, accm = 0.0f;
    for (int64_t i = 0; i < n; i += QK_K, w += 144, a += 292)
        si__q4_k_block(w, a, group, &acc, &accm);
    return acc - accm;
}

static float dot_act_q4_k(const void *row, const void *xa, int64_t n)
{
    return si__dot_act_q4_k_groups(row, xa, n, 8);
}

static float dot_act_q5_k(const void *row, const void *xa, int64_t n)
{
    const uint8_t *w = row, *a = xa;
    float sum = 0.0f;
    for (int64_t i = 0; i < n; i += QK_K, w += 176, a += 292)
        sum += si__q5_k_block(w, a);
    return sum;
}

/* A Q6_K super-block's exact integer dot with a Q8_K one: sum over its 16
 * sub-blocks of scale_j * (q_w . q_a). */
int si__q6_k_isum(const void *block, const void *xa)
{
    const uint8_t *w = block, *a = xa;
    const int8_t *qa = (const int8_t *)(a + 4), *sc = (const int8_t *)(w + 192);
    int q[QK_K], isum = 0;
    q6_k_values(w, q);
    for (int j = 0; j < 16; j++) {
        int s = 0;
        for (int l = 16 * j; l < 16 * j + 16; l++)
            s += q[l] * qa[l];
        isum += sc[j] * s;
    }
    return isum;
}

/* Per super-block: d_a * d * sum_j(sc_j * sum((q_w - 32) * q_a)), 16 sub-blocks of 16. */
static float dot_act_q6_k(const void *row, const void *xa, int64_t n)
{
    const uint8_t *w = row, *a = xa;
    float sum = 0.0f;
    for (int64_t i = 0; i < n; i += QK_K, w += 210, a += 292) {
        int16_t bsums[QK_K / 16];
        float da = q8_k_header(a, bsums);
        sum += da * half_at(w + 208) * (float)si__q6_k_isum(w, a);
    }
    return sum;
}

/*
 * Q6_K as llama.cpp's tiled GEMM computes it (batches of 8 tokens or more):
 * per super-block the exact integer isum = sum_j scale_j * (q_w . q_a) over
 * its 16 sub-blocks, then acc = fma(d * isum, d_a, acc), d * isum rounded.
 */
float si__dot_act_q6_k_tiled(const void *row, const void *xa, int64_t n)
{
    const uint8_t *w = row, *a = xa;
    float acc = 0.0f;
    for (int64_t i = 0; i < n; i += QK_K, w += 210, a += 292) {
        int16_t bsums[QK_K / 16];
        const float da = q8_k_header(a, bsums);
        acc = fmaf(half_at(w + 208) * (float)si__q6_k_isum(w, a), da, acc);
    }
    return acc;
}

/* ------------------------------------------------------ mad (y += a * row) */

/*
 * The scalar mads dequantize one block (a run of up to 32 values for the
 * float types) into a local buffer, then add a times each value to y: the
 * value rounded as dequantize rounds it, then the product, then the sum.
 */
static void mad_blocks(si__dequantize_fn dequantize, int64_t block, size_t size, const void *row,
                       float a, float *y, int64_t n)
{
    const uint8_t *b = row;
    float w[QK_K];
    for (int64_t i = 0; i < n; i += block, b += size) {
        int64_t m = n - i < block ? n - i : block;
        dequantize(b, w, m);
        for (int64_t j = 0; j < m; j++)
            y[i + j] += a * w[j];
    }
}

#define MAD(name, block, size)                                                                     \
    static void mad_##name(const void *row, float a, float *y, int64_t n)                         \
    {                                                                                              \
        mad_blocks(dequantize_##name, (block), (size), row, a, y, n);                              \
    }

MAD(f32, QK, 4 * QK)
MAD(f16, QK, 2 * QK)
MAD(bf16, QK, 2 * QK)
MAD(q8_0, QK, 34)
MAD(q4_0, QK, 18)
MAD(q4_1, QK, 20)
MAD(q5_0, QK, 22)
MAD(q5_1, QK, 24)
MAD(q4_k, QK_K, 144)
MAD(q5_k, QK_K, 176)
MAD(q6_k, QK_K, 210)

const struct si__quants_table si__quants_scalar = {
    .name = "scalar",
    .compiled = true,
    .type =
        {
            [SI_TYPE_F32] = {dequantize_f32, dot_f32, quantize_act_f32, dot_act_f32, mad_f32},
            [SI_TYPE_F16] = {dequantize_f16, dot_f16, quantize_act_f16, dot_act_f16, mad_f16},
            [SI_TYPE_BF16] = {dequantize_bf16, dot_bf16, quantize_act_bf16, dot_act_bf16, mad_bf16},
            [SI_TYPE_Q8_0] = {dequantize_q8_0, dot_q8_0, quantize_act_q8_0, dot_act_q8_0, mad_q8_0,
                              .dot_act8 = si__scalar_dot_act8_q8_0,
                              .dequantize8 = si__scalar_dequantize8_q8_0},
            [SI_TYPE_Q8_1] = {NULL, NULL, quantize_act_q8_1, NULL},
            [SI_TYPE_Q8_K] = {NULL, NULL, quantize_act_q8_k, NULL},
            [SI_TYPE_Q4_0] = {dequantize_q4_0, dot_q4_0, NULL, dot_act_q4_0, mad_q4_0,
                              .dot_act8 = si__scalar_dot_act8_q4_0,
                              .dequantize8 = si__scalar_dequantize8_q4_0},
            [SI_TYPE_Q4_1] = {dequantize_q4_1, dot_q4_1, NULL, dot_act_q4_1, mad_q4_1,
                              .dot_act8 = si__scalar_dot_act8_q4_1,
                              .dequantize8 = si__scalar_dequantize8_q4_1},
            [SI_TYPE_Q5_0] = {dequantize_q5_0, dot_q5_0, NULL, dot_act_q5_0, mad_q5_0},
            [SI_TYPE_Q5_1] = {dequantize_q5_1, dot_q5_1, NULL, dot_act_q5_1, mad_q5_1},
            [SI_TYPE_Q4_K] = {dequantize_q4_k, dot_q4_k, NULL, dot_act_q4_k, mad_q4_k,
                              .dot_act8 = si__scalar_dot_act8_q4_k,
                              .dequantize8 = si__scalar_dequantize8_q4_k},
            [SI_TYPE_Q5_K] = {dequantize_q5_k, dot_q5_k, NULL, dot_act_q5_k, mad_q5_k,
                              .dot_act8 = si__scalar_dot_act8_q5_k,
                              .dequantize8 = si__scalar_dequantize8_q5_k},
            [SI_TYPE_Q6_K] = {dequantize_q6_k, dot_q6_k, NULL, dot_act_q6_k, mad_q6_k,
                              .dot_act8 = si__scalar_dot_act8_q6_k,
                              .dequantize8 = si__scalar_dequantize8_q6_k},
        },
};
