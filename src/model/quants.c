/*
 * quants.c - the public functions of quants.h: the quantizers, the type
 * helpers, and the wrappers that run the kernels of the table in use.
 *
 * The kernels themselves are in quants_scalar.c (with the fp16 and bf16
 * conversions and the block layouts) and quants_avx2.c; which table runs is
 * chosen, once, in quants_dispatch.c.  This file only calls down into those:
 * none of them calls back.
 */
#include "model/quants.h"

#include "model/quants_dispatch.h"
#include "model/quants_impl.h"
#include "model/types.h"

#include <assert.h>
#include <math.h>
#include <string.h>

#define QK 32 /* elements per block of the 32-element types */

static void put_half(uint8_t *p, float f)
{
    uint16_t h = si_fp32_to_fp16(f);
    memcpy(p, &h, sizeof h);
}

/* ------------------------------------------------------ quantizers */

/*
 * The quantizers choose each block's scale as ggml's reference quantizers
 * do, computing in float with the unrounded scale and storing it as a half.
 */

static void quantize_q8_0(const float *x, uint8_t *b, int64_t n)
{
    for (int64_t i = 0; i < n; i += QK, b += 34, x += QK) {
        float amax = 0.0f;
        for (int j = 0; j < QK; j++)
            amax = fmaxf(amax, fabsf(x[j]));
        float d = amax / 127.0f;
        float id = d != 0.0f ? 1.0f / d : 0.0f;
        put_half(b, d);
        for (int j = 0; j < QK; j++)
            b[2 + j] = (uint8_t)(int8_t)roundf(x[j] * id);
    }
}

/* The element of largest magnitude, with its sign (the first one on ties). */
static float signed_max(const float *x)
{
    float amax = 0.0f, max = 0.0f;
    for (int j = 0; j < QK; j++) {
        if (fabsf(x[j]) > amax) {
            amax = fabsf(x[j]);
            max = x[j];
        }
    }
    return max;
}

/* q = min(top, floor(v)), v >= 0: truncation, as ggml's (int8_t) cast. */
static int clamp_q(float v, int top)
{
    int q = (int)v;
    return q < top ? q : top;
}

/* Q4_0 (bits 4) and Q5_0 (bits 5): d = signed max / -8 (-16). */
static void quantize_sym(const float *x, uint8_t *b, int64_t n, int bits)
{
    size_t size = bits == 4 ? 18 : 22;
    int zero = 1 << (bits - 1), top = (1 << bits) - 1;
    float offset = (float)zero + 0.5f; /* one addition, as in ggml: x*id + 8.5f */
    for (int64_t i = 0; i < n; i += QK, b += size, x += QK) {
        float d = signed_max(x) / (float)-zero;
        float id = d != 0.0f ? 1.0f / d : 0.0f;
        put_half(b, d);
        uint8_t *qs = b + (bits == 4 ? 2 : 6);
        uint32_t qh = 0;
        for (int j = 0; j < 16; j++) {
            int lo = clamp_q(x[j] * id + offset, top);
            int hi = clamp_q(x[j + 16] * id + offset, top);
            qs[j] = (uint8_t)((lo & 0xf) | (hi & 0xf) << 4);
            qh |= (uint32_t)(lo >> 4) << j | (uint32_t)(hi >> 4) << (j + 16);
        }
        if (bits == 5)
            memcpy(b + 2, &qh, sizeof qh);
    }
}

/* Q4_1 (bits 4) and Q5_1 (bits 5): d = (max - min) / 15 (31), m = min. */
static void quantize_asym(const float *x, uint8_t *b, int64_t n, int bits)
{
    size_t size = bits == 4 ? 20 : 24;
    int top = (1 << bits) - 1;
    for (int64_t i = 0; i < n; i += QK, b += size, x += QK) {
        float min = x[0], max = x[0];
        for (int j = 1; j < QK; j++) {
            min = fminf(min, x[j]);
            max = fmaxf(max, x[j]);
        }
        float d = (max - min) / (float)top;
        float id = d != 0.0f ? 1.0f / d : 0.0f;
        put_half(b, d);
        put_half(b + 2, min);
        uint8_t *qs = b + (bits == 4 ? 4 : 8);
        uint32_t qh = 0;
        for (int j = 0; j < 16; j++) {
            int lo = clamp_q((x[j] - min) * id + 0.5f, top);
            int hi = clamp_q((x[j + 16] - min) * id + 0.5f, top);
            qs[j] = (uint8_t)((lo & 0xf) | (hi & 0xf) << 4);
            qh |= (uint32_t)(lo >> 4) << j | (uint32_t)(hi >> 4) << (j + 16);
        }
        if (bits == 5)
            memcpy(b + 4, &qh, sizeof qh);
    }
}

/*
 * The K super-blocks of 256 (layouts in quants_scalar.c).  Not ggml's
 * searching quantizers: round to nearest with each sub-block's range, the
 * sub-block scales (and mins) themselves quantized to 6 bits (Q6_K: 8)
 * against the super-block's half scale.  Enough for synthetic models of
 * the types downloads use; files made by llama.cpp are only read.
 */
#define QK_K 256

static float half_rounded(float f)
{
    return si_fp16_to_fp32(si_fp32_to_fp16(f));
}

static int round_clamp(float v, int lo, int hi)
{
    int q = (int)lrintf(v);
    return q < lo ? lo : q > hi ? hi : q;
}

/* Q4_K (bits 4) and Q5_K (bits 5): 8 sub-blocks of 32, x = d sc_j q - dmin m_j. */
static void quantize_k(const float *x, uint8_t *b, int64_t n, int bits)
{
    const size_t size = bits == 4 ? 144 : 176;
    const int top = (1 << bits) - 1;
    for (int64_t i = 0; i < n; i += QK_K, b += size, x += QK_K) {
        float scale[8], min[8], smax = 0.0f, mmax = 0.0f;
        for (int j = 0; j < 8; j++) {
            float lo = 0.0f, hi = x[32 * j]; /* the range, 0 within it (min >= 0) */
            for (int l = 32 * j; l < 32 * j + 32; l++) {
                lo = fminf(lo, x[l]);
                hi = fmaxf(hi, x[l]);
            }
            scale[j] = hi > lo ? (hi - lo) / (float)top : 0.0f;
            min[j] = -lo;
            smax = fmaxf(smax, scale[j]);
            mmax = fmaxf(mmax, min[j]);
        }
        const float d = half_rounded(smax / 63.0f), dmin = half_rounded(mmax / 63.0f);
        int sc[8], m[8];
        for (int j = 0; j < 8; j++) {
            sc[j] = d > 0.0f ? round_clamp(scale[j] / d, 0, 63) : 0;
            m[j] = dmin > 0.0f ? round_clamp(min[j] / dmin, 0, 63) : 0;
        }
        put_half(b, d);
        put_half(b + 2, dmin);
        uint8_t *s12 = b + 4; /* si__k_scale_min's packing, inverted */
        for (int j = 0; j < 4; j++) {
            s12[j] = (uint8_t)((sc[j] & 63) | (sc[j + 4] >> 4) << 6);
            s12[j + 4] = (uint8_t)((m[j] & 63) | (m[j + 4] >> 4) << 6);
            s12[j + 8] = (uint8_t)((sc[j + 4] & 0xf) | (m[j + 4] & 0xf) << 4);
        }
        int q[QK_K];
        for (int j = 0; j < 8; j++) {
            const float ds = d * (float)sc[j], dm = dmin * (float)m[j];
            for (int l = 32 * j; l < 32 * j + 32; l++)
                q[l] = ds > 0.0f ? round_clamp((x[l] + dm) / ds, 0, top) : 0;
        }
        uint8_t *qh = b + 16, *qs = b + (bits == 4 ? 16 : 48);
        if (bits == 5)
            memset(qh, 0, 32);
        /* value 64c + l: low nibble of qs[32c + l], 64c + 32 + l: high nibble;
         * their fifth bits: bits 2c and 2c + 1 of qh[l] */
        for (int c = 0; c < 4; c++)
            for (int l = 0; l < 32; l++) {
                const int lo = q[64 * c + l], hi = q[64 * c + 32 + l];
                qs[32 * c + l] = (uint8_t)((lo & 0xf) | (hi & 0xf) << 4);
                if (bits == 5)
                    qh[l] |= (uint8_t)((lo >> 4) << (2 * c) | (hi >> 4) << (2 * c + 1));
            }
    }
}

/* Q6_K: 16 sub-blocks of 16, x = d sc_j q, q in -32 .. 31, sc_j an int8. */
static void quantize_q6_k(const float *x, uint8_t *b, int64_t n)
{
    for (int64_t i = 0; i < n; i += QK_K, b += 210, x += QK_K) {
        float scale[16], amax = 0.0f;
        for (int j = 0; j < 16; j++) {
            float m = 0.0f;
            for (int l = 16 * j; l < 16 * j + 16; l++)
                m = fmaxf(m, fabsf(x[l]));
            scale[j] = m / 31.0f;
            amax = fmaxf(amax, scale[j]);
        }
        const float d = half_rounded(amax / 127.0f);
        int8_t *sc = (int8_t *)(b + 192);
        int q[QK_K];
        for (int j = 0; j < 16; j++) {
            sc[j] = (int8_t)(d > 0.0f ? round_clamp(scale[j] / d, 0, 127) : 0);
            const float ds = d * (float)sc[j];
            for (int l = 16 * j; l < 16 * j + 16; l++)
                q[l] = (ds > 0.0f ? round_clamp(x[l] / ds, -32, 31) : 0) + 32;
        }
        put_half(b + 208, d);
        /* the inverse of quants_scalar.c's q6_k_values */
        for (int h = 0; h < 2; h++) {
            uint8_t *ql = b + 64 * h, *qh = b + 128 + 32 * h;
            const int *y = q + 128 * h;
            for (int l = 0; l < 32; l++) {
                ql[l] = (uint8_t)((y[l] & 0xf) | (y[l + 64] & 0xf) << 4);
                ql[l + 32] = (uint8_t)((y[l + 32] & 0xf) | (y[l + 96] & 0xf) << 4);
                qh[l] = (uint8_t)((y[l] >> 4) | (y[l + 32] >> 4) << 2 | (y[l + 64] >> 4) << 4 |
                                  (y[l + 96] >> 4) << 6);
            }
        }
    }
}

size_t si_quantize_row(uint32_t t, const float *src, void *dst, int64_t n)
{
    size_t bytes;
    if (!si_type_quantizable(t) || !si_type_row_size(t, n, &bytes))
        return 0;
    uint8_t *b = dst;
    switch (t) {
    case SI_TYPE_F32:
        memcpy(dst, src, bytes);
        break;
    case SI_TYPE_F16:
        for (int64_t i = 0; i < n; i++)
            put_half(b + 2 * i, src[i]);
        break;
    case SI_TYPE_BF16:
        for (int64_t i = 0; i < n; i++) {
            uint16_t h = si_fp32_to_bf16(src[i]);
            memcpy(b + 2 * i, &h, sizeof h);
        }
        break;
    case SI_TYPE_Q8_0:
        quantize_q8_0(src, b, n);
        break;
    case SI_TYPE_Q4_0:
        quantize_sym(src, b, n, 4);
        break;
    case SI_TYPE_Q5_0:
        quantize_sym(src, b, n, 5);
        break;
    case SI_TYPE_Q4_1:
        quantize_asym(src, b, n, 4);
        break;
    case SI_TYPE_Q5_1:
        quantize_asym(src, b, n, 5);
        break;
    case SI_TYPE_Q4_K:
        quantize_k(src, b, n, 4);
        break;
    case SI_TYPE_Q5_K:
        quantize_k(src, b, n, 5);
        break;
    case SI_TYPE_Q6_K:
        quantize_q6_k(src, b, n);
        break;
    }
    return bytes;
}

/* ------------------------------------------------------ types */

const char *si_quants_kernels(void)
{
    return si__quants_active()->name;
}

bool si_type_supported(uint32_t t)
{
    return t < SI_TYPE_COUNT && si__quants_scalar.type[t].dot != NULL;
}

bool si_type_quantizable(uint32_t t)
{
    switch (t) {
    case SI_TYPE_F32:
    case SI_TYPE_F16:
    case SI_TYPE_BF16:
    case SI_TYPE_Q8_0:
    case SI_TYPE_Q4_0:
    case SI_TYPE_Q4_1:
    case SI_TYPE_Q5_0:
    case SI_TYPE_Q5_1:
    case SI_TYPE_Q4_K:
    case SI_TYPE_Q5_K:
    case SI_TYPE_Q6_K:
        return true;
    default:
        return false;
    }
}

/* ------------------------------------------------------ the kernels in use */

/* The kernels of type t in the table in use, after checking (in debug
 * builds) the row length. */
static const struct si__quants_kernels *kernels(uint32_t t, int64_t n)
{
    const struct si__quants_table *active = si__quants_active();
    assert(n >= 0 && n % si_type_get(t)->block == 0 && "row length not a multiple of the block");
    (void)n;
    return &active->type[t];
}

void si_dequantize_row(uint32_t t, const void *src, float *dst, int64_t n)
{
    if (!si_type_supported(t)) {
        assert(!"unsupported tensor type");
        return;
    }
    kernels(t, n)->dequantize(src, dst, n);
}

float si_vec_dot(uint32_t t, const void *row, const float *x, int64_t n)
{
    if (!si_type_supported(t)) {
        assert(!"unsupported tensor type");
        return 0.0f;
    }
    return kernels(t, n)->dot(row, x, n);
}

uint32_t si_act_type(uint32_t t)
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
    case SI_TYPE_F16:
    case SI_TYPE_BF16:
    case SI_TYPE_F32:
        return t;
    default:
        return SI_TYPE_COUNT;
    }
}

void si_quantize_act(uint32_t at, const float *x, void *dst, int64_t n)
{
    if (at >= SI_TYPE_COUNT || si__quants_scalar.type[at].quantize_act == NULL) {
        assert(!"not an activation type");
        return;
    }
    kernels(at, n)->quantize_act(x, dst, n);
}

float si_vec_dot_act(uint32_t t, const void *row, const void *xa, int64_t n)
{
    if (!si_type_supported(t)) {
        assert(!"unsupported tensor type");
        return 0.0f;
    }
    return kernels(t, n)->dot_act(row, xa, n);
}

float si_vec_dot_act_batch(uint32_t t, const void *row, const void *xa, int64_t n, int32_t n_tok,
                           bool group4)
{
    if (t == SI_TYPE_Q4_K && group4)
        return si__dot_act_q4_k_groups(row, xa, n, 2);
    if (t == SI_TYPE_Q6_K && n_tok >= 8)
        return si__dot_act_q6_k_tiled(row, xa, n);
    return si_vec_dot_act(t, row, xa, n);
}

void si_vec_dot_act8p(uint32_t t, const void *const rows[8], const void *xa, int64_t n,
                      float out[8], const void *const ahead[8])
{
    if (!si_type_supported(t)) {
        assert(!"unsupported tensor type");
        memset(out, 0, 8 * sizeof *out);
        return;
    }
    const struct si__quants_kernels *k = kernels(t, n);
    if (k->dot_act8p != NULL) {
        k->dot_act8p(rows, xa, n, out, ahead);
        return;
    }
    for (int r = 0; r < 8; r += 2) {
        const void *const two[2] = {rows[r], rows[r + 1]};
        const void *const next[2] = {ahead != NULL ? ahead[r] : NULL,
                                     ahead != NULL ? ahead[r + 1] : NULL};
        si_vec_dot_act2(t, two, xa, n, out + r, next);
    }
}

void si_vec_dot_act2(uint32_t t, const void *const rows[2], const void *xa, int64_t n, float out[2],
                     const void *const ahead[2])
{
    if (!si_type_supported(t)) {
        assert(!"unsupported tensor type");
        out[0] = out[1] = 0.0f;
        return;
    }
    const struct si__quants_kernels *k = kernels(t, n);
    if (k->dot_act2 != NULL) {
        k->dot_act2(rows, xa, n, out, ahead);
        return;
    }
    size_t bytes = 0;
    si_type_row_size(t, n, &bytes);
    for (int r = 0; r < 2; r++) {
#if defined(__GNUC__)
        /* All of the next row at once: the fused kernels spread these over
         * their loop instead, which keeps fewer requests waiting. */
        if (ahead != NULL && ahead[r] != NULL) {
            for (size_t o = 0; o < bytes; o += 64)
                __builtin_prefetch((const char *)ahead[r] + o, 0, 3);
        }
#endif
        out[r] = k->dot_act(rows[r], xa, n);
    }
}

void si_vec_mad(uint32_t t, const void *row, float a, float *y, int64_t n)
{
    if (!si_type_supported(t)) {
        assert(!"unsupported tensor type");
        return;
    }
    kernels(t, n)->mad(row, a, y, n);
}

void si_vec_mad4(uint32_t t, const void *const rows[4], const float a[4], float *y, int64_t n)
{
    if (!si_type_supported(t)) {
        assert(!"unsupported tensor type");
        return;
    }
    const struct si__quants_kernels *k = kernels(t, n);
    if (k->mad4 != NULL) {
        k->mad4(rows, a, y, n);
        return;
    }
    for (int r = 0; r < 4; r++)
        k->mad(rows[r], a[r], y, n);
}

const char *si_quants_impl(void)
{
    return si__quants_active()->name;
}
