/*
 * quants_avx2.c - the AVX2+FMA+F16C table (si__quants_avx2), and its
 * dequantize, dot and mad kernels (built with -mavx2 -mfma -mf16c; without
 * those flags the table is empty).
 *
 * Each block type has a decoder that turns a block, or a part of a
 * super-block, into vectors of 8 float weights; dequantize stores them and
 * dot multiplies them into x with FMAs on four accumulators.  The block
 * layouts are described in quants_scalar.c.  The quantized-activation
 * kernels (quantize_act, dot_act), which follow llama.cpp's x86 AVX2 code
 * instead, and the attention built on them are in quants_avx2_act.c.
 *
 * Pure kernels: nothing here chooses a table or calls outside the two AVX2
 * files (quants_dispatch.c chooses).
 */
#include "model/quants_impl.h"

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)

#include "model/quants_avx2.h"

#include <immintrin.h>
#include <math.h>
#include <string.h>

/* ------------------------------------------------------ helpers */

/* The 8 bytes at p, zero- (u8x8) or sign-extended (i8x8) to 32-bit lanes. */
INLINE __m256i u8x8(const uint8_t *p)
{
    return _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)p));
}

INLINE __m256i i8x8(const uint8_t *p)
{
    return _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)p));
}

INLINE __m256 to_float(__m256i v)
{
    return _mm256_cvtepi32_ps(v);
}

INLINE float hsum4(__m256 a, __m256 b, __m256 c, __m256 d)
{
    return hsum(_mm256_add_ps(_mm256_add_ps(a, b), _mm256_add_ps(c, d)));
}

/* ------------------------------------------------------ float rows */

static void dequantize_f32(const void *src, float *dst, int64_t n)
{
    memcpy(dst, src, (size_t)n * sizeof(float));
}

static void dequantize_f16(const void *src, float *dst, int64_t n)
{
    const uint8_t *p = src;
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p + 2 * i))));
    for (; i < n; i++)
        dst[i] = half_at(p + 2 * i);
}

static void dequantize_bf16(const void *src, float *dst, int64_t n)
{
    const uint8_t *p = src;
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(dst + i, bf16x8(p + 2 * i));
    for (; i < n; i++)
        dst[i] = bf16_at(p + 2 * i);
}

/*
 * The float dots: 32 elements a step on four accumulators, then the tail
 * one element at a time.  LOAD(i) gives the 8 weights from element i.
 */
#define FLOAT_DOT(name, LOAD, AT)                                                                  \
    static float name(const void *row, const float *x, int64_t n)                                 \
    {                                                                                              \
        const uint8_t *p = row;                                                                    \
        __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;                                \
        int64_t i = 0;                                                                             \
        for (; i + 32 <= n; i += 32) {                                                             \
            a0 = _mm256_fmadd_ps(LOAD(i), _mm256_loadu_ps(x + i), a0);                             \
            a1 = _mm256_fmadd_ps(LOAD(i + 8), _mm256_loadu_ps(x + i + 8), a1);                     \
            a2 = _mm256_fmadd_ps(LOAD(i + 16), _mm256_loadu_ps(x + i + 16), a2);                   \
            a3 = _mm256_fmadd_ps(LOAD(i + 24), _mm256_loadu_ps(x + i + 24), a3);                   \
        }                                                                                          \
        for (; i + 8 <= n; i += 8)                                                                 \
            a0 = _mm256_fmadd_ps(LOAD(i), _mm256_loadu_ps(x + i), a0);                             \
        float sum = hsum4(a0, a1, a2, a3);                                                         \
        for (; i < n; i++)                                                                         \
            sum += AT(i) * x[i];                                                                   \
        return sum;                                                                                \
    }

#define F32_LOAD(i) _mm256_loadu_ps((const float *)(const void *)(p + 4 * (i)))
#define F32_AT(i) f32_at(p + 4 * (i))
#define F16_LOAD(i) _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p + 2 * (i))))
#define F16_AT(i) half_at(p + 2 * (i))
#define BF16_LOAD(i) bf16x8(p + 2 * (i))
#define BF16_AT(i) bf16_at(p + 2 * (i))

FLOAT_DOT(dot_f32, F32_LOAD, F32_AT)
FLOAT_DOT(dot_f16, F16_LOAD, F16_AT)
FLOAT_DOT(dot_bf16, BF16_LOAD, BF16_AT)

/* ------------------------------------------------------ 32-element blocks */

/*
 * Each decoder writes the 32 weights of the block at b into w[0..3], in
 * element order.
 */

INLINE void decode_q8_0(const uint8_t *b, __m256 w[4])
{
    const __m256 d = _mm256_set1_ps(half_at(b));
    w[0] = _mm256_mul_ps(to_float(i8x8(b + 2)), d);
    w[1] = _mm256_mul_ps(to_float(i8x8(b + 10)), d);
    w[2] = _mm256_mul_ps(to_float(i8x8(b + 18)), d);
    w[3] = _mm256_mul_ps(to_float(i8x8(b + 26)), d);
}

/*
 * The 32 nibbles of qs[16] as 32-bit lanes: elements 0-7, 8-15 (low nibbles
 * of qs[0..15]), then 16-23, 24-31 (their high nibbles).
 */
INLINE void nibbles(const uint8_t *qs, __m256i q[4])
{
    const __m256i low = _mm256_set1_epi32(0xf);
    __m256i v0 = u8x8(qs), v1 = u8x8(qs + 8);
    q[0] = _mm256_and_si256(v0, low);
    q[1] = _mm256_and_si256(v1, low);
    q[2] = _mm256_srli_epi32(v0, 4);
    q[3] = _mm256_srli_epi32(v1, 4);
}

/* Sets bit 4 (adds 16) in the lanes of q whose bit in the 32 high bits qh is set. */
INLINE void high_bits(uint32_t qh, __m256i q[4])
{
    /* Group 0 shifts bit j (j < 8) up to bit 4 through qh << 4; groups 1-3
     * shift bit 8k + j down to bit 4. */
    const __m256i sixteen = _mm256_set1_epi32(16);
    const __m256i up = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    const __m256i down1 = _mm256_setr_epi32(4, 5, 6, 7, 8, 9, 10, 11);
    const __m256i down2 = _mm256_setr_epi32(12, 13, 14, 15, 16, 17, 18, 19);
    const __m256i down3 = _mm256_setr_epi32(20, 21, 22, 23, 24, 25, 26, 27);
    __m256i h0 = _mm256_set1_epi32((int)(qh << 4)), h = _mm256_set1_epi32((int)qh);
    q[0] = _mm256_or_si256(q[0], _mm256_and_si256(_mm256_srlv_epi32(h0, up), sixteen));
    q[1] = _mm256_or_si256(q[1], _mm256_and_si256(_mm256_srlv_epi32(h, down1), sixteen));
    q[2] = _mm256_or_si256(q[2], _mm256_and_si256(_mm256_srlv_epi32(h, down2), sixteen));
    q[3] = _mm256_or_si256(q[3], _mm256_and_si256(_mm256_srlv_epi32(h, down3), sixteen));
}

/* w = d * (q - zero): as d * q + (-zero * d), exact before the last rounding. */
INLINE void weights_sym(const __m256i q[4], float d, float zero, __m256 w[4])
{
    const __m256 vd = _mm256_set1_ps(d), vm = _mm256_set1_ps(-zero * d);
    w[0] = _mm256_fmadd_ps(to_float(q[0]), vd, vm);
    w[1] = _mm256_fmadd_ps(to_float(q[1]), vd, vm);
    w[2] = _mm256_fmadd_ps(to_float(q[2]), vd, vm);
    w[3] = _mm256_fmadd_ps(to_float(q[3]), vd, vm);
}

/* w = d * q + m. */
INLINE void weights_asym(const __m256i q[4], float d, float m, __m256 w[4])
{
    const __m256 vd = _mm256_set1_ps(d), vm = _mm256_set1_ps(m);
    w[0] = _mm256_fmadd_ps(to_float(q[0]), vd, vm);
    w[1] = _mm256_fmadd_ps(to_float(q[1]), vd, vm);
    w[2] = _mm256_fmadd_ps(to_float(q[2]), vd, vm);
    w[3] = _mm256_fmadd_ps(to_float(q[3]), vd, vm);
}

INLINE void decode_q4_0(const uint8_t *b, __m256 w[4])
{
    __m256i q[4];
    nibbles(b + 2, q);
    weights_sym(q, half_at(b), 8.0f, w);
}

INLINE void decode_q4_1(const uint8_t *b, __m256 w[4])
{
    __m256i q[4];
    nibbles(b + 4, q);
    weights_asym(q, half_at(b), half_at(b + 2), w);
}

INLINE void decode_q5_0(const uint8_t *b, __m256 w[4])
{
    __m256i q[4];
    nibbles(b + 6, q);
    high_bits(u32_at(b + 2), q);
    weights_sym(q, half_at(b), 16.0f, w);
}

INLINE void decode_q5_1(const uint8_t *b, __m256 w[4])
{
    __m256i q[4];
    nibbles(b + 8, q);
    high_bits(u32_at(b + 4), q);
    weights_asym(q, half_at(b), half_at(b + 2), w);
}

/* dequantize_<name> and dot_<name> for a 32-element block type of `size` bytes. */
#define BLOCK32_KERNELS(name, size)                                                                \
    static void dequantize_##name(const void *src, float *dst, int64_t n)                         \
    {                                                                                              \
        const uint8_t *b = src;                                                                    \
        for (int64_t i = 0; i < n; i += 32, b += (size)) {                                         \
            __m256 w[4];                                                                           \
            decode_##name(b, w);                                                                   \
            _mm256_storeu_ps(dst + i, w[0]);                                                       \
            _mm256_storeu_ps(dst + i + 8, w[1]);                                                   \
            _mm256_storeu_ps(dst + i + 16, w[2]);                                                  \
            _mm256_storeu_ps(dst + i + 24, w[3]);                                                  \
        }                                                                                          \
    }                                                                                              \
    static float dot_##name(const void *row, const float *x, int64_t n)                           \
    {                                                                                              \
        const uint8_t *b = row;                                                                    \
        __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;                                \
        for (int64_t i = 0; i < n; i += 32, b += (size)) {                                         \
            __m256 w[4];                                                                           \
            decode_##name(b, w);                                                                   \
            a0 = _mm256_fmadd_ps(w[0], _mm256_loadu_ps(x + i), a0);                                \
            a1 = _mm256_fmadd_ps(w[1], _mm256_loadu_ps(x + i + 8), a1);                            \
            a2 = _mm256_fmadd_ps(w[2], _mm256_loadu_ps(x + i + 16), a2);                           \
            a3 = _mm256_fmadd_ps(w[3], _mm256_loadu_ps(x + i + 24), a3);                           \
        }                                                                                          \
        return hsum4(a0, a1, a2, a3);                                                              \
    }

BLOCK32_KERNELS(q8_0, 34)
BLOCK32_KERNELS(q4_0, 18)
BLOCK32_KERNELS(q4_1, 20)
BLOCK32_KERNELS(q5_0, 22)
BLOCK32_KERNELS(q5_1, 24)

/* dequantize of each row of a group packed by si_pack8 (model/pack8.h),
 * row r at dst + r * n, with the arithmetic of decode_q8_0 and decode_q4_0. */
static void dequantize8_q8_0(const void *group, int64_t n, float *dst)
{
    const uint8_t *g = group;
    for (int64_t i = 0; i < n; i += 32, g += 8 * 34)
        for (int r = 0; r < 8; r++) {
            const __m256 d = _mm256_set1_ps(half_at(g + 2 * r));
            const uint8_t *q = g + 16 + 32 * r;
            for (int k = 0; k < 4; k++)
                _mm256_storeu_ps(dst + r * n + i + 8 * k,
                                 _mm256_mul_ps(to_float(i8x8(q + 8 * k)), d));
        }
}

/* Row r's 16 quant bytes of a packed Q4_0 / Q4_1 block's quants q (pack8.h:
 * 4 units of 4, unit u at 32u + 4r), in the row's order. */
INLINE void q4_row8(const uint8_t *q, int r, uint8_t qs[16])
{
    for (int u = 0; u < 4; u++)
        memcpy(qs + 4 * u, q + 32 * u + 4 * r, 4);
}

/* Values 8k .. 8k + 7 (k < 4) of the row whose quant bytes are qs. */
INLINE __m256i q4_values8(const uint8_t qs[16], int k)
{
    const __m256i v = u8x8(qs + 8 * (k % 2));
    return k < 2 ? _mm256_and_si256(v, _mm256_set1_epi32(0xf)) : _mm256_srli_epi32(v, 4);
}

static void dequantize8_q4_0(const void *group, int64_t n, float *dst)
{
    const uint8_t *g = group;
    for (int64_t i = 0; i < n; i += 32, g += 8 * 18)
        for (int r = 0; r < 8; r++) {
            const float d = half_at(g + 2 * r);
            const __m256 vd = _mm256_set1_ps(d), vm = _mm256_set1_ps(-8.0f * d);
            uint8_t qs[16];
            q4_row8(g + 16, r, qs);
            for (int k = 0; k < 4; k++)
                _mm256_storeu_ps(dst + r * n + i + 8 * k,
                                 _mm256_fmadd_ps(to_float(q4_values8(qs, k)), vd, vm));
        }
}

static void dequantize8_q4_1(const void *group, int64_t n, float *dst)
{
    const uint8_t *g = group;
    for (int64_t i = 0; i < n; i += 32, g += 8 * 20)
        for (int r = 0; r < 8; r++) {
            const __m256 vd = _mm256_set1_ps(half_at(g + 2 * r)),
                         vm = _mm256_set1_ps(half_at(g + 16 + 2 * r));
            uint8_t qs[16];
            q4_row8(g + 32, r, qs);
            for (int k = 0; k < 4; k++)
                _mm256_storeu_ps(dst + r * n + i + 8 * k,
                                 _mm256_fmadd_ps(to_float(q4_values8(qs, k)), vd, vm));
        }
}

/* ------------------------------------------------------ K super-blocks */

/*
 * A Q4_K / Q5_K super-block as 4 chunks of 64 elements; chunk c holds
 * sub-blocks 2c (low nibbles of qs[32c..32c+31]) and 2c+1 (high nibbles).
 * Each chunk is 4 groups: group g covers elements 64c + 8g .. +7 (`lo`) and
 * 64c + 32 + 8g .. +7 (`hi`), from qs[32c + 8g .. +7].  For Q5_K, qh holds
 * qh[8g .. 8g+7] shifted right by 2c, so that bits 0 and 1 are the chunk's
 * two high bits.  The loops over groups are written out so that compilers
 * keep every vector in a register.
 */
struct k_chunk {
    __m256 s0, m0, s1, m1; /* d * scale and dmin * min of sub-blocks 2c and 2c+1 */
};

/* d * scale and dmin * min of the 8 sub-blocks of the super-block at b. */
INLINE void k_scales(const uint8_t *b, float scale[8], float min[8])
{
    float d = half_at(b), dmin = half_at(b + 2);
    for (int j = 0; j < 8; j++) {
        int s, m;
        si__k_scale_min(b + 4, j, &s, &m);
        scale[j] = d * (float)s;
        min[j] = dmin * (float)m;
    }
}

INLINE void k_chunk_init(const float *scale, const float *min, int c, struct k_chunk *k)
{
    k->s0 = _mm256_broadcast_ss(scale + 2 * c);
    k->m0 = _mm256_broadcast_ss(min + 2 * c);
    k->s1 = _mm256_broadcast_ss(scale + 2 * c + 1);
    k->m1 = _mm256_broadcast_ss(min + 2 * c + 1);
}

INLINE void k_group(const struct k_chunk *k, const uint8_t *qs, __m256i qh, int five,
                           __m256 *lo, __m256 *hi)
{
    const __m256i low = _mm256_set1_epi32(0xf), sixteen = _mm256_set1_epi32(16);
    __m256i v = u8x8(qs);
    __m256i ql = _mm256_and_si256(v, low), qu = _mm256_srli_epi32(v, 4);
    if (five) {
        ql = _mm256_or_si256(ql, _mm256_and_si256(_mm256_slli_epi32(qh, 4), sixteen));
        qu = _mm256_or_si256(qu, _mm256_and_si256(_mm256_slli_epi32(qh, 3), sixteen));
    }
    *lo = _mm256_fmsub_ps(to_float(ql), k->s0, k->m0);
    *hi = _mm256_fmsub_ps(to_float(qu), k->s1, k->m1);
}

/* Stores group g of a chunk at dst (the chunk's first element). */
INLINE void k_group_store(const struct k_chunk *k, const uint8_t *qs, __m256i qh, int five,
                                 float *dst)
{
    __m256 lo, hi;
    k_group(k, qs, qh, five, &lo, &hi);
    _mm256_storeu_ps(dst, lo);
    _mm256_storeu_ps(dst + 32, hi);
}

/* acc + the group's weights times x (x at the group's first element). */
INLINE __m256 k_group_dot(const struct k_chunk *k, const uint8_t *qs, __m256i qh, int five,
                                 const float *x, __m256 acc)
{
    __m256 lo, hi;
    k_group(k, qs, qh, five, &lo, &hi);
    acc = _mm256_fmadd_ps(lo, _mm256_loadu_ps(x), acc);
    return _mm256_fmadd_ps(hi, _mm256_loadu_ps(x + 32), acc);
}

INLINE void dequantize_k(const void *src, float *dst, int64_t n, int five)
{
    const size_t size = five ? 176 : 144;
    const uint8_t *b = src;
    for (int64_t i = 0; i < n; i += 256, b += size) {
        const uint8_t *qs = b + (five ? 48 : 16);
        float scale[8], min[8];
        k_scales(b, scale, min);
        __m256i h0 = _mm256_setzero_si256(), h1 = h0, h2 = h0, h3 = h0;
        if (five) {
            h0 = u8x8(b + 16);
            h1 = u8x8(b + 24);
            h2 = u8x8(b + 32);
            h3 = u8x8(b + 40);
        }
        for (int c = 0; c < 4; c++, qs += 32) {
            struct k_chunk k;
            k_chunk_init(scale, min, c, &k);
            float *y = dst + i + 64 * c;
            k_group_store(&k, qs, h0, five, y);
            k_group_store(&k, qs + 8, h1, five, y + 8);
            k_group_store(&k, qs + 16, h2, five, y + 16);
            k_group_store(&k, qs + 24, h3, five, y + 24);
            h0 = _mm256_srli_epi32(h0, 2);
            h1 = _mm256_srli_epi32(h1, 2);
            h2 = _mm256_srli_epi32(h2, 2);
            h3 = _mm256_srli_epi32(h3, 2);
        }
    }
}

INLINE float dot_k(const void *row, const float *x, int64_t n, int five)
{
    const size_t size = five ? 176 : 144;
    const uint8_t *b = row;
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    for (int64_t i = 0; i < n; i += 256, b += size) {
        const uint8_t *qs = b + (five ? 48 : 16);
        float scale[8], min[8];
        k_scales(b, scale, min);
        __m256i h0 = _mm256_setzero_si256(), h1 = h0, h2 = h0, h3 = h0;
        if (five) {
            h0 = u8x8(b + 16);
            h1 = u8x8(b + 24);
            h2 = u8x8(b + 32);
            h3 = u8x8(b + 40);
        }
        for (int c = 0; c < 4; c++, qs += 32) {
            struct k_chunk k;
            k_chunk_init(scale, min, c, &k);
            const float *xs = x + i + 64 * c;
            a0 = k_group_dot(&k, qs, h0, five, xs, a0);
            a1 = k_group_dot(&k, qs + 8, h1, five, xs + 8, a1);
            a2 = k_group_dot(&k, qs + 16, h2, five, xs + 16, a2);
            a3 = k_group_dot(&k, qs + 24, h3, five, xs + 24, a3);
            h0 = _mm256_srli_epi32(h0, 2);
            h1 = _mm256_srli_epi32(h1, 2);
            h2 = _mm256_srli_epi32(h2, 2);
            h3 = _mm256_srli_epi32(h3, 2);
        }
    }
    return hsum4(a0, a1, a2, a3);
}

static void dequantize_q4_k(const void *src, float *dst, int64_t n)
{
    dequantize_k(src, dst, n, 0);
}

static float dot_q4_k(const void *row, const float *x, int64_t n)
{
    return dot_k(row, x, n, 0);
}

static void dequantize_q5_k(const void *src, float *dst, int64_t n)
{
    dequantize_k(src, dst, n, 1);
}

static float dot_q5_k(const void *row, const float *x, int64_t n)
{
    return dot_k(row, x, n, 1);
}

/*
 * Q6_K: for half h and group g (l = 8g .. 8g+7), the weights of elements
 * 128h + l + {0, 32, 64, 96} into w[0..3]; they use scales
 * sc[8h + g/2 + {0, 2, 4, 6}], given here already multiplied by d.
 */
INLINE void decode_q6_k_group(const uint8_t *b, const float *scale, int h, int g, __m256 w[4])
{
    const __m256i low = _mm256_set1_epi32(0xf), two_bits = _mm256_set1_epi32(0x30);
    const __m256i bias = _mm256_set1_epi32(32);
    const uint8_t *ql = b + 64 * h + 8 * g, *qhp = b + 128 + 32 * h + 8 * g;
    const float *s = scale + 8 * h + g / 2;
    __m256i a = u8x8(ql), c = u8x8(ql + 32), qh = u8x8(qhp);
    __m256i q0 = _mm256_or_si256(_mm256_and_si256(a, low),
                                 _mm256_and_si256(_mm256_slli_epi32(qh, 4), two_bits));
    __m256i q1 = _mm256_or_si256(_mm256_and_si256(c, low),
                                 _mm256_and_si256(_mm256_slli_epi32(qh, 2), two_bits));
    __m256i q2 = _mm256_or_si256(_mm256_srli_epi32(a, 4), _mm256_and_si256(qh, two_bits));
    __m256i q3 = _mm256_or_si256(_mm256_srli_epi32(c, 4),
                                 _mm256_and_si256(_mm256_srli_epi32(qh, 2), two_bits));
    w[0] = _mm256_mul_ps(to_float(_mm256_sub_epi32(q0, bias)), _mm256_broadcast_ss(s));
    w[1] = _mm256_mul_ps(to_float(_mm256_sub_epi32(q1, bias)), _mm256_broadcast_ss(s + 2));
    w[2] = _mm256_mul_ps(to_float(_mm256_sub_epi32(q2, bias)), _mm256_broadcast_ss(s + 4));
    w[3] = _mm256_mul_ps(to_float(_mm256_sub_epi32(q3, bias)), _mm256_broadcast_ss(s + 6));
}

/* d * sc[j] for the 16 scales of the Q6_K super-block at b. */
INLINE void q6_k_scales(const uint8_t *b, float scale[16])
{
    float d = half_at(b + 208);
    const int8_t *sc = (const int8_t *)(b + 192);
    for (int j = 0; j < 16; j++)
        scale[j] = d * (float)sc[j];
}

static void dequantize_q6_k(const void *src, float *dst, int64_t n)
{
    const uint8_t *b = src;
    for (int64_t i = 0; i < n; i += 256, b += 210) {
        float scale[16];
        q6_k_scales(b, scale);
        for (int h = 0; h < 2; h++) {
            for (int g = 0; g < 4; g++) {
                __m256 w[4];
                decode_q6_k_group(b, scale, h, g, w);
                float *y = dst + i + 128 * h + 8 * g;
                _mm256_storeu_ps(y, w[0]);
                _mm256_storeu_ps(y + 32, w[1]);
                _mm256_storeu_ps(y + 64, w[2]);
                _mm256_storeu_ps(y + 96, w[3]);
            }
        }
    }
}

static float dot_q6_k(const void *row, const float *x, int64_t n)
{
    const uint8_t *b = row;
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    for (int64_t i = 0; i < n; i += 256, b += 210) {
        float scale[16];
        q6_k_scales(b, scale);
        for (int h = 0; h < 2; h++) {
            for (int g = 0; g < 4; g++) {
                __m256 w[4];
                decode_q6_k_group(b, scale, h, g, w);
                const float *xs = x + i + 128 * h + 8 * g;
                a0 = _mm256_fmadd_ps(w[0], _mm256_loadu_ps(xs), a0);
                a1 = _mm256_fmadd_ps(w[1], _mm256_loadu_ps(xs + 32), a1);
                a2 = _mm256_fmadd_ps(w[2], _mm256_loadu_ps(xs + 64), a2);
                a3 = _mm256_fmadd_ps(w[3], _mm256_loadu_ps(xs + 96), a3);
            }
        }
    }
    return hsum4(a0, a1, a2, a3);
}

/* ------------------------------------------------------ mad (y += a * row) */

/*
 * y += a * row, 8 lanes at a time.  Where a block has one scale d (Q8_0,
 * Q4_0, Q4_1), a is folded into it first: y += (a*d) * q (+ a*m), one FMA
 * per 8 elements; the K types fold a into their sub-block scales and mins;
 * the others multiply the decoded weights by a in the FMA with y.
 */
#define FLOAT_MAD(name, LOAD, AT)                                                                  \
    static void name(const void *row, float a, float *y, int64_t n)                               \
    {                                                                                              \
        const uint8_t *p = row;                                                                    \
        const __m256 va = _mm256_set1_ps(a);                                                       \
        int64_t i = 0;                                                                             \
        for (; i + 32 <= n; i += 32) {                                                             \
            _mm256_storeu_ps(y + i, _mm256_fmadd_ps(LOAD(i), va, _mm256_loadu_ps(y + i)));         \
            _mm256_storeu_ps(y + i + 8,                                                            \
                             _mm256_fmadd_ps(LOAD(i + 8), va, _mm256_loadu_ps(y + i + 8)));        \
            _mm256_storeu_ps(y + i + 16,                                                           \
                             _mm256_fmadd_ps(LOAD(i + 16), va, _mm256_loadu_ps(y + i + 16)));      \
            _mm256_storeu_ps(y + i + 24,                                                           \
                             _mm256_fmadd_ps(LOAD(i + 24), va, _mm256_loadu_ps(y + i + 24)));      \
        }                                                                                          \
        for (; i + 8 <= n; i += 8)                                                                 \
            _mm256_storeu_ps(y + i, _mm256_fmadd_ps(LOAD(i), va, _mm256_loadu_ps(y + i)));         \
        for (; i < n; i++)                                                                         \
            y[i] = fmaf(AT(i), a, y[i]);                                                           \
    }

FLOAT_MAD(mad_f32, F32_LOAD, F32_AT)
FLOAT_MAD(mad_f16, F16_LOAD, F16_AT)
FLOAT_MAD(mad_bf16, BF16_LOAD, BF16_AT)

/* y[0..31] = q[k] * s + (y + m), the four groups of a 32-element block. */
INLINE void mad_block32(const __m256i q[4], float s, float m, float *y)
{
    const __m256 vs = _mm256_set1_ps(s), vm = _mm256_set1_ps(m);
    for (int k = 0; k < 4; k++) {
        __m256 acc = _mm256_loadu_ps(y + 8 * k);
        if (m != 0.0f)
            acc = _mm256_add_ps(acc, vm);
        _mm256_storeu_ps(y + 8 * k, _mm256_fmadd_ps(to_float(q[k]), vs, acc));
    }
}

static void mad_q8_0(const void *row, float a, float *y, int64_t n)
{
    const uint8_t *b = row;
    for (int64_t i = 0; i < n; i += 32, b += 34) {
        __m256i q[4] = {i8x8(b + 2), i8x8(b + 10), i8x8(b + 18), i8x8(b + 26)};
        mad_block32(q, a * half_at(b), 0.0f, y + i);
    }
}

static void mad_q4_0(const void *row, float a, float *y, int64_t n)
{
    const __m256i eight = _mm256_set1_epi32(8);
    const uint8_t *b = row;
    for (int64_t i = 0; i < n; i += 32, b += 18) {
        __m256i q[4];
        nibbles(b + 2, q);
        for (int k = 0; k < 4; k++)
            q[k] = _mm256_sub_epi32(q[k], eight);
        mad_block32(q, a * half_at(b), 0.0f, y + i);
    }
}

static void mad_q4_1(const void *row, float a, float *y, int64_t n)
{
    const uint8_t *b = row;
    for (int64_t i = 0; i < n; i += 32, b += 20) {
        __m256i q[4];
        nibbles(b + 4, q);
        mad_block32(q, a * half_at(b), a * half_at(b + 2), y + i);
    }
}

/*
 * mad4: the four mads y += a[r] * rows[r] (r = 0..3, in order) in one pass
 * over y, each 8 lanes of y kept in a register across the four rows; every
 * lane sees the same FMAs (and adds, for Q4_1's mins) in the same order as
 * four calls of the single-row mad, so the result is the same bit for bit.
 */
#define FLOAT_MAD4(name, LOAD, AT)                                                                 \
    static void name(const void *const rows[4], const float a[4], float *y, int64_t n)            \
    {                                                                                              \
        const uint8_t *p0 = rows[0], *p1 = rows[1], *p2 = rows[2], *p3 = rows[3];                  \
        const __m256 v0 = _mm256_set1_ps(a[0]), v1 = _mm256_set1_ps(a[1]);                         \
        const __m256 v2 = _mm256_set1_ps(a[2]), v3 = _mm256_set1_ps(a[3]);                         \
        int64_t i = 0;                                                                             \
        for (; i + 16 <= n; i += 16) {                                                             \
            __m256 s0 = _mm256_loadu_ps(y + i), s1 = _mm256_loadu_ps(y + i + 8);                   \
            s0 = _mm256_fmadd_ps(LOAD(p0, i), v0, s0);                                             \
            s1 = _mm256_fmadd_ps(LOAD(p0, i + 8), v0, s1);                                         \
            s0 = _mm256_fmadd_ps(LOAD(p1, i), v1, s0);                                             \
            s1 = _mm256_fmadd_ps(LOAD(p1, i + 8), v1, s1);                                         \
            s0 = _mm256_fmadd_ps(LOAD(p2, i), v2, s0);                                             \
            s1 = _mm256_fmadd_ps(LOAD(p2, i + 8), v2, s1);                                         \
            s0 = _mm256_fmadd_ps(LOAD(p3, i), v3, s0);                                             \
            s1 = _mm256_fmadd_ps(LOAD(p3, i + 8), v3, s1);                                         \
            _mm256_storeu_ps(y + i, s0);                                                           \
            _mm256_storeu_ps(y + i + 8, s1);                                                       \
        }                                                                                          \
        for (; i + 8 <= n; i += 8) {                                                               \
            __m256 s0 = _mm256_loadu_ps(y + i);                                                    \
            s0 = _mm256_fmadd_ps(LOAD(p0, i), v0, s0);                                             \
            s0 = _mm256_fmadd_ps(LOAD(p1, i), v1, s0);                                             \
            s0 = _mm256_fmadd_ps(LOAD(p2, i), v2, s0);                                             \
            s0 = _mm256_fmadd_ps(LOAD(p3, i), v3, s0);                                             \
            _mm256_storeu_ps(y + i, s0);                                                           \
        }                                                                                          \
        for (; i < n; i++) {                                                                       \
            float s = y[i];                                                                        \
            s = fmaf(AT(p0, i), a[0], s);                                                          \
            s = fmaf(AT(p1, i), a[1], s);                                                          \
            s = fmaf(AT(p2, i), a[2], s);                                                          \
            s = fmaf(AT(p3, i), a[3], s);                                                          \
            y[i] = s;                                                                              \
        }                                                                                          \
    }

#define F32_LOADP(p, i) _mm256_loadu_ps((const float *)(const void *)((p) + 4 * (i)))
#define F32_ATP(p, i) f32_at((p) + 4 * (i))
#define F16_LOADP(p, i) _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((p) + 2 * (i))))
#define F16_ATP(p, i) half_at((p) + 2 * (i))
#define BF16_LOADP(p, i) bf16x8((p) + 2 * (i))
#define BF16_ATP(p, i) bf16_at((p) + 2 * (i))

FLOAT_MAD4(mad4_f32, F32_LOADP, F32_ATP)
FLOAT_MAD4(mad4_f16, F16_LOADP, F16_ATP)
FLOAT_MAD4(mad4_bf16, BF16_LOADP, BF16_ATP)

/* s[k] = q[k] * sc + (s[k] + m) (the add only when m != 0), as mad_block32 does to y. */
INLINE void mad_acc32(const __m256i q[4], float sc, float m, __m256 s[4])
{
    const __m256 vs = _mm256_set1_ps(sc);
    if (m != 0.0f) {
        const __m256 vm = _mm256_set1_ps(m);
        s[0] = _mm256_add_ps(s[0], vm);
        s[1] = _mm256_add_ps(s[1], vm);
        s[2] = _mm256_add_ps(s[2], vm);
        s[3] = _mm256_add_ps(s[3], vm);
    }
    s[0] = _mm256_fmadd_ps(to_float(q[0]), vs, s[0]);
    s[1] = _mm256_fmadd_ps(to_float(q[1]), vs, s[1]);
    s[2] = _mm256_fmadd_ps(to_float(q[2]), vs, s[2]);
    s[3] = _mm256_fmadd_ps(to_float(q[3]), vs, s[3]);
}

INLINE void load32(const float *y, __m256 s[4])
{
    s[0] = _mm256_loadu_ps(y);
    s[1] = _mm256_loadu_ps(y + 8);
    s[2] = _mm256_loadu_ps(y + 16);
    s[3] = _mm256_loadu_ps(y + 24);
}

INLINE void store32(float *y, const __m256 s[4])
{
    _mm256_storeu_ps(y, s[0]);
    _mm256_storeu_ps(y + 8, s[1]);
    _mm256_storeu_ps(y + 16, s[2]);
    _mm256_storeu_ps(y + 24, s[3]);
}

/* The quants of a Q8_0 block at b. */
INLINE void quants_q8_0(const uint8_t *b, __m256i q[4])
{
    q[0] = i8x8(b + 2);
    q[1] = i8x8(b + 10);
    q[2] = i8x8(b + 18);
    q[3] = i8x8(b + 26);
}

/* The quants of a Q4_0 block at b, minus 8. */
INLINE void quants_q4_0(const uint8_t *b, __m256i q[4])
{
    const __m256i eight = _mm256_set1_epi32(8);
    nibbles(b + 2, q);
    q[0] = _mm256_sub_epi32(q[0], eight);
    q[1] = _mm256_sub_epi32(q[1], eight);
    q[2] = _mm256_sub_epi32(q[2], eight);
    q[3] = _mm256_sub_epi32(q[3], eight);
}

static void mad4_q8_0(const void *const rows[4], const float a[4], float *y, int64_t n)
{
    const uint8_t *b0 = rows[0], *b1 = rows[1], *b2 = rows[2], *b3 = rows[3];
    for (int64_t i = 0; i < n; i += 32, b0 += 34, b1 += 34, b2 += 34, b3 += 34) {
        __m256 s[4];
        __m256i q[4];
        load32(y + i, s);
        quants_q8_0(b0, q);
        mad_acc32(q, a[0] * half_at(b0), 0.0f, s);
        quants_q8_0(b1, q);
        mad_acc32(q, a[1] * half_at(b1), 0.0f, s);
        quants_q8_0(b2, q);
        mad_acc32(q, a[2] * half_at(b2), 0.0f, s);
        quants_q8_0(b3, q);
        mad_acc32(q, a[3] * half_at(b3), 0.0f, s);
        store32(y + i, s);
    }
}

static void mad4_q4_0(const void *const rows[4], const float a[4], float *y, int64_t n)
{
    const uint8_t *b0 = rows[0], *b1 = rows[1], *b2 = rows[2], *b3 = rows[3];
    for (int64_t i = 0; i < n; i += 32, b0 += 18, b1 += 18, b2 += 18, b3 += 18) {
        __m256 s[4];
        __m256i q[4];
        load32(y + i, s);
        quants_q4_0(b0, q);
        mad_acc32(q, a[0] * half_at(b0), 0.0f, s);
        quants_q4_0(b1, q);
        mad_acc32(q, a[1] * half_at(b1), 0.0f, s);
        quants_q4_0(b2, q);
        mad_acc32(q, a[2] * half_at(b2), 0.0f, s);
        quants_q4_0(b3, q);
        mad_acc32(q, a[3] * half_at(b3), 0.0f, s);
        store32(y + i, s);
    }
}

static void mad4_q4_1(const void *const rows[4], const float a[4], float *y, int64_t n)
{
    const uint8_t *b0 = rows[0], *b1 = rows[1], *b2 = rows[2], *b3 = rows[3];
    for (int64_t i = 0; i < n; i += 32, b0 += 20, b1 += 20, b2 += 20, b3 += 20) {
        __m256 s[4];
        __m256i q[4];
        load32(y + i, s);
        nibbles(b0 + 4, q);
        mad_acc32(q, a[0] * half_at(b0), a[0] * half_at(b0 + 2), s);
        nibbles(b1 + 4, q);
        mad_acc32(q, a[1] * half_at(b1), a[1] * half_at(b1 + 2), s);
        nibbles(b2 + 4, q);
        mad_acc32(q, a[2] * half_at(b2), a[2] * half_at(b2 + 2), s);
        nibbles(b3 + 4, q);
        mad_acc32(q, a[3] * half_at(b3), a[3] * half_at(b3 + 2), s);
        store32(y + i, s);
    }
}

/* Q5_0, Q5_1: the decoded weights times a, added to y. */
#define DECODED_MAD(name, size)                                                                    \
    static void mad_##name(const void *row, float a, float *y, int64_t n)                         \
    {                                                                                              \
        const __m256 va = _mm256_set1_ps(a);                                                       \
        const uint8_t *b = row;                                                                    \
        for (int64_t i = 0; i < n; i += 32, b += (size)) {                                         \
            __m256 w[4];                                                                           \
            decode_##name(b, w);                                                                   \
            for (int k = 0; k < 4; k++)                                                            \
                _mm256_storeu_ps(y + i + 8 * k,                                                    \
                                 _mm256_fmadd_ps(w[k], va, _mm256_loadu_ps(y + i + 8 * k)));       \
        }                                                                                          \
    }

DECODED_MAD(q5_0, 22)
DECODED_MAD(q5_1, 24)

/* Adds group g of a chunk to y (the chunk's first element); k's scales already hold a. */
INLINE void k_group_add(const struct k_chunk *k, const uint8_t *qs, __m256i qh, int five, float *y)
{
    __m256 lo, hi;
    k_group(k, qs, qh, five, &lo, &hi);
    _mm256_storeu_ps(y, _mm256_add_ps(_mm256_loadu_ps(y), lo));
    _mm256_storeu_ps(y + 32, _mm256_add_ps(_mm256_loadu_ps(y + 32), hi));
}

INLINE void mad_k(const void *row, float a, float *y, int64_t n, int five)
{
    const size_t size = five ? 176 : 144;
    const uint8_t *b = row;
    for (int64_t i = 0; i < n; i += 256, b += size) {
        const uint8_t *qs = b + (five ? 48 : 16);
        float scale[8], min[8];
        k_scales(b, scale, min);
        for (int j = 0; j < 8; j++) {
            scale[j] *= a;
            min[j] *= a;
        }
        __m256i h0 = _mm256_setzero_si256(), h1 = h0, h2 = h0, h3 = h0;
        if (five) {
            h0 = u8x8(b + 16);
            h1 = u8x8(b + 24);
            h2 = u8x8(b + 32);
            h3 = u8x8(b + 40);
        }
        for (int c = 0; c < 4; c++, qs += 32) {
            struct k_chunk k;
            k_chunk_init(scale, min, c, &k);
            float *yc = y + i + 64 * c;
            k_group_add(&k, qs, h0, five, yc);
            k_group_add(&k, qs + 8, h1, five, yc + 8);
            k_group_add(&k, qs + 16, h2, five, yc + 16);
            k_group_add(&k, qs + 24, h3, five, yc + 24);
            h0 = _mm256_srli_epi32(h0, 2);
            h1 = _mm256_srli_epi32(h1, 2);
            h2 = _mm256_srli_epi32(h2, 2);
            h3 = _mm256_srli_epi32(h3, 2);
        }
    }
}

static void mad_q4_k(const void *row, float a, float *y, int64_t n)
{
    mad_k(row, a, y, n, 0);
}

static void mad_q5_k(const void *row, float a, float *y, int64_t n)
{
    mad_k(row, a, y, n, 1);
}

static void mad_q6_k(const void *row, float a, float *y, int64_t n)
{
    const uint8_t *b = row;
    for (int64_t i = 0; i < n; i += 256, b += 210) {
        float scale[16];
        q6_k_scales(b, scale);
        for (int j = 0; j < 16; j++)
            scale[j] *= a;
        for (int h = 0; h < 2; h++) {
            for (int g = 0; g < 4; g++) {
                __m256 w[4];
                decode_q6_k_group(b, scale, h, g, w);
                float *yg = y + i + 128 * h + 8 * g;
                for (int k = 0; k < 4; k++)
                    _mm256_storeu_ps(yg + 32 * k, _mm256_add_ps(_mm256_loadu_ps(yg + 32 * k), w[k]));
            }
        }
    }
}

/*
 * Four rows at once (si__mad4_fn): per group of y, one load and one store
 * for the four rows' terms, each row's terms formed as mad_k forms them and
 * added in row order, so the same bits as four mad_k calls.
 */
INLINE void mad4_k(const void *const rows[4], const float a[4], float *y, int64_t n, int five)
{
    const size_t size = five ? 176 : 144;
    for (int64_t i = 0, o = 0; i < n; i += 256, o += (int64_t)size) {
        const uint8_t *b[4], *qs[4];
        float scale[4][8], min[4][8];
        __m256i h[4][4];
        for (int r = 0; r < 4; r++) {
            b[r] = (const uint8_t *)rows[r] + o;
            qs[r] = b[r] + (five ? 48 : 16);
            k_scales(b[r], scale[r], min[r]);
            for (int j = 0; j < 8; j++) {
                scale[r][j] *= a[r];
                min[r][j] *= a[r];
            }
            for (int g = 0; g < 4; g++)
                h[r][g] = five ? u8x8(b[r] + 16 + 8 * g) : _mm256_setzero_si256();
        }
        for (int c = 0; c < 4; c++) {
            struct k_chunk k[4];
            for (int r = 0; r < 4; r++)
                k_chunk_init(scale[r], min[r], c, &k[r]);
            float *yc = y + i + 64 * c;
            for (int g = 0; g < 4; g++) {
                __m256 ylo = _mm256_loadu_ps(yc + 8 * g), yhi = _mm256_loadu_ps(yc + 8 * g + 32);
                for (int r = 0; r < 4; r++) {
                    __m256 lo, hi;
                    k_group(&k[r], qs[r] + 32 * c + 8 * g, h[r][g], five, &lo, &hi);
                    ylo = _mm256_add_ps(ylo, lo);
                    yhi = _mm256_add_ps(yhi, hi);
                }
                _mm256_storeu_ps(yc + 8 * g, ylo);
                _mm256_storeu_ps(yc + 8 * g + 32, yhi);
            }
            if (five)
                for (int r = 0; r < 4; r++)
                    for (int g = 0; g < 4; g++)
                        h[r][g] = _mm256_srli_epi32(h[r][g], 2);
        }
    }
}

static void mad4_q4_k(const void *const rows[4], const float a[4], float *y, int64_t n)
{
    mad4_k(rows, a, y, n, 0);
}

static void mad4_q5_k(const void *const rows[4], const float a[4], float *y, int64_t n)
{
    mad4_k(rows, a, y, n, 1);
}

/* Q6_K's four rows: per group, mad_q6_k's terms of each row added in turn. */
static void mad4_q6_k(const void *const rows[4], const float a[4], float *y, int64_t n)
{
    for (int64_t i = 0, o = 0; i < n; i += 256, o += 210) {
        float scale[4][16];
        const uint8_t *b[4];
        for (int r = 0; r < 4; r++) {
            b[r] = (const uint8_t *)rows[r] + o;
            q6_k_scales(b[r], scale[r]);
            for (int j = 0; j < 16; j++)
                scale[r][j] *= a[r];
        }
        for (int hh = 0; hh < 2; hh++)
            for (int g = 0; g < 4; g++) {
                float *yg = y + i + 128 * hh + 8 * g;
                __m256 acc[4];
                for (int k = 0; k < 4; k++)
                    acc[k] = _mm256_loadu_ps(yg + 32 * k);
                for (int r = 0; r < 4; r++) {
                    __m256 w[4];
                    decode_q6_k_group(b[r], scale[r], hh, g, w);
                    for (int k = 0; k < 4; k++)
                        acc[k] = _mm256_add_ps(acc[k], w[k]);
                }
                for (int k = 0; k < 4; k++)
                    _mm256_storeu_ps(yg + 32 * k, acc[k]);
            }
    }
}

const struct si__quants_table si__quants_avx2 =
    {
        .name = "avx2",
        .compiled = true,
        .type =
            {
                [SI_TYPE_F32] = {dequantize_f32, dot_f32, si__avx2_quantize_act_f32,
                                 si__avx2_dot_act_f32, mad_f32, mad4_f32},
                [SI_TYPE_F16] = {dequantize_f16, dot_f16, si__avx2_quantize_act_f16,
                                 si__avx2_dot_act_f16, mad_f16, mad4_f16, si__avx2_dot_act2_f16},
                [SI_TYPE_BF16] = {dequantize_bf16, dot_bf16, si__avx2_quantize_act_bf16,
                                  si__avx2_dot_act_bf16, mad_bf16, mad4_bf16},
                [SI_TYPE_Q8_0] = {dequantize_q8_0, dot_q8_0, si__avx2_quantize_act_q8_0,
                                  si__avx2_dot_act_q8_0, mad_q8_0, mad4_q8_0,
                                  si__avx2_dot_act2_q8_0, si__avx2_dot_act8_q8_0, dequantize8_q8_0,
                                  NULL, si__avx2_dot_act8p_q8_0, si__avx2_dot_act8_next_q8_0},
                [SI_TYPE_Q8_1] = {NULL, NULL, si__avx2_quantize_act_q8_1, NULL},
                [SI_TYPE_Q8_K] = {NULL, NULL, si__avx2_quantize_act_q8_k, NULL},
                [SI_TYPE_Q4_0] = {dequantize_q4_0, dot_q4_0, NULL, si__avx2_dot_act_q4_0, mad_q4_0,
                                  mad4_q4_0, si__avx2_dot_act2_q4_0, si__avx2_dot_act8_q4_0,
                                  dequantize8_q4_0, NULL, si__avx2_dot_act8p_q4_0,
                                  si__avx2_dot_act8_next_q4_0},
                [SI_TYPE_Q4_1] = {dequantize_q4_1, dot_q4_1, NULL, si__avx2_dot_act_q4_1, mad_q4_1,
                                  mad4_q4_1, NULL, si__avx2_dot_act8_q4_1, dequantize8_q4_1},
                [SI_TYPE_Q5_0] = {dequantize_q5_0, dot_q5_0, NULL, si__avx2_dot_act_q5_0, mad_q5_0,
                                  NULL, si__avx2_dot_act2_q5_0},
                [SI_TYPE_Q5_1] = {dequantize_q5_1, dot_q5_1, NULL, si__avx2_dot_act_q5_1, mad_q5_1},
                [SI_TYPE_Q4_K] = {dequantize_q4_k, dot_q4_k, NULL, si__avx2_dot_act_q4_k, mad_q4_k,
                                  .mad4 = mad4_q4_k, .dot_act8 = si__avx2_dot_act8_q4_k,
                                  .dequantize8 = si__avx2_dequantize8_q4_k},
                [SI_TYPE_Q5_K] = {dequantize_q5_k, dot_q5_k, NULL, si__avx2_dot_act_q5_k, mad_q5_k,
                                  .mad4 = mad4_q5_k, .dot_act8 = si__avx2_dot_act8_q5_k,
                                  .dequantize8 = si__avx2_dequantize8_q5_k},
                [SI_TYPE_Q6_K] = {dequantize_q6_k, dot_q6_k, NULL, si__avx2_dot_act_q6_k, mad_q6_k,
                                  .mad4 = mad4_q6_k, .dot_act8 = si__avx2_dot_act8_q6_k,
                                  .dequantize8 = si__avx2_dequantize8_q6_k},
            },
        .attn_f16 = si__avx2_attn_f16,
        .attn_tiled = si__avx2_attn_tiles,
        .cb_block = si__avx2_cb_block,
};

#else /* no AVX2, FMA and F16C at compile time */

const struct si__quants_table si__quants_avx2 = {.name = "avx2", .compiled = false};

#endif
