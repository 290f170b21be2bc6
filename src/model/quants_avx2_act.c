/*
 * quants_avx2_act.c - the AVX2+FMA+F16C kernels that follow llama.cpp's x86
 * AVX2 code: the activation quantizers and the dots with quantized
 * activations (quantize_act, dot_act, dot_act2) of the table
 * si__quants_avx2, the table si__quants_vnni (the same dots with AVX-512
 * VNNI's integer products), and the attention's twins built on the F16
 * ones.  Built with -mavx2 -mfma -mf16c; without those flags the VNNI table
 * is empty and nothing else is defined.
 *
 * Pure kernels: the table in quants_avx2.c lists them, quants_dispatch.c
 * chooses among the tables, and nothing here calls either.
 */
#include "model/quants_impl.h"

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)

#include "model/act.h"
#include "model/quants_avx2.h"

#include <immintrin.h>
#include <math.h>
#include <string.h>

/* ------------------------------------------------------ quantized activations */

/*
 * The activation quantizers and the dots with quantized activations, in the
 * forms of llama.cpp's x86 AVX2 code so that the float results round the
 * same way: a block's integer products summed in 8 int32 lanes (lane k
 * holding elements 4k .. 4k+3 of a run of 32), converted to float and added
 * into 8 float accumulators with one FMA per block, the accumulators summed
 * at the end.  The block layouts are described in quants_scalar.c.
 */

INLINE void put_half(uint8_t *p, float f)
{
    uint16_t h = (uint16_t)_cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT);
    memcpy(p, &h, sizeof h);
}

INLINE float hmax(__m256 v)
{
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    m = _mm_max_ss(m, _mm_movehdup_ps(m));
    return _mm_cvtss_f32(m);
}

INLINE int hsum_i32(__m256i v)
{
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_unpackhi_epi64(s, s));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 1));
    return _mm_cvtsi128_si32(s);
}

/* 32 int32 lanes (a, b, c, d in element order) as 32 bytes in element order; pack is
 * the 32-to-16 and 16-to-8 bit narrowing of one flavour (saturating signed or unsigned). */
#define PACK_BYTES(packs32, packs16, a, b, c, d)                                                   \
    _mm256_permutevar8x32_epi32(packs16(packs32(a, b), packs32(c, d)),                             \
                                _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7))

INLINE __m256i abs_ps_bits(void)
{
    return _mm256_set1_epi32(0x7fffffff);
}

INLINE __m256 abs_ps(__m256 v)
{
    return _mm256_and_ps(v, _mm256_castsi256_ps(abs_ps_bits()));
}

/*
 * One Q8_0 / Q8_1 block: d = max|x| / 127, q = x * (127 / max|x|) rounded
 * half to even.  Writes qs, returns d unrounded and the sum of the quants
 * in *sum.
 */
INLINE float act_q8_block(const float *x, uint8_t *qs, int *sum)
{
    __m256 v0 = _mm256_loadu_ps(x), v1 = _mm256_loadu_ps(x + 8);
    __m256 v2 = _mm256_loadu_ps(x + 16), v3 = _mm256_loadu_ps(x + 24);
    __m256 m = _mm256_max_ps(_mm256_max_ps(abs_ps(v0), abs_ps(v1)),
                             _mm256_max_ps(abs_ps(v2), abs_ps(v3)));
    float amax = hmax(m);
    const __m256 id = _mm256_set1_ps(amax != 0.0f ? 127.0f / amax : 0.0f);
    const int mode = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
    __m256i i0 = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(v0, id), mode));
    __m256i i1 = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(v1, id), mode));
    __m256i i2 = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(v2, id), mode));
    __m256i i3 = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(v3, id), mode));
    *sum = hsum_i32(_mm256_add_epi32(_mm256_add_epi32(i0, i1), _mm256_add_epi32(i2, i3)));
    __m256i q = PACK_BYTES(_mm256_packs_epi32, _mm256_packs_epi16, i0, i1, i2, i3);
    _mm256_storeu_si256((__m256i *)qs, q);
    return amax / 127.0f;
}

void si__avx2_quantize_act_q8_0(const float *x, void *dst, int64_t n)
{
    uint8_t *b = dst;
    for (int64_t i = 0; i < n; i += 32, b += 34) {
        int sum;
        put_half(b, act_q8_block(x + i, b + 2, &sum));
    }
}

void si__avx2_quantize_act_q8_1(const float *x, void *dst, int64_t n)
{
    uint8_t *b = dst;
    for (int64_t i = 0; i < n; i += 32, b += 36) {
        int sum;
        float d = act_q8_block(x + i, b + 4, &sum);
        put_half(b, d);
        put_half(b + 2, d * (float)sum);
    }
}

/*
 * Q8_K: max is the element of largest magnitude (the first on ties),
 * q = min(127, nearest(x * -127 / max)) with ggml's rounding by adding
 * 1.5 * 2^23, stored modulo 256; d = 1 / (-127 / max).
 */
void si__avx2_quantize_act_q8_k(const float *x, void *dst, int64_t n)
{
    const __m256 magic = _mm256_set1_ps(12582912.0f);
    const __m256i mant = _mm256_set1_epi32(0x7fffff), bias = _mm256_set1_epi32(0x400000);
    const __m256i top = _mm256_set1_epi32(127), byte = _mm256_set1_epi32(0xff);
    uint8_t *b = dst;
    for (int64_t i = 0; i < n; i += 256, b += 292, x += 256) {
        __m256 m = _mm256_setzero_ps();
        for (int k = 0; k < 256; k += 8)
            m = _mm256_max_ps(m, abs_ps(_mm256_loadu_ps(x + k)));
        float amax = hmax(m);
        if (amax == 0.0f) {
            memset(b, 0, 292);
            continue;
        }
        int first = 0;
        const __m256 vamax = _mm256_set1_ps(amax);
        for (int k = 0; k < 256; k += 8) {
            int hit = _mm256_movemask_ps(_mm256_cmp_ps(abs_ps(_mm256_loadu_ps(x + k)), vamax,
                                                       _CMP_EQ_OQ));
            if (hit != 0) {
                first = k + __builtin_ctz((unsigned)hit);
                break;
            }
        }
        float iscale = -127.0f / x[first];
        const __m256 vs = _mm256_set1_ps(iscale);
        int16_t bsums[16];
        for (int g = 0; g < 8; g++) {
            __m256i q[4];
            for (int k = 0; k < 4; k++) {
                __m256 v =
                    _mm256_add_ps(_mm256_mul_ps(vs, _mm256_loadu_ps(x + 32 * g + 8 * k)), magic);
                __m256i r = _mm256_sub_epi32(_mm256_and_si256(_mm256_castps_si256(v), mant), bias);
                q[k] = _mm256_min_epi32(r, top);
            }
            /* The stored values are the low bytes; the bsums add them as int8. */
            __m256i s0 = _mm256_add_epi32(_mm256_srai_epi32(_mm256_slli_epi32(q[0], 24), 24),
                                          _mm256_srai_epi32(_mm256_slli_epi32(q[1], 24), 24));
            __m256i s1 = _mm256_add_epi32(_mm256_srai_epi32(_mm256_slli_epi32(q[2], 24), 24),
                                          _mm256_srai_epi32(_mm256_slli_epi32(q[3], 24), 24));
            bsums[2 * g] = (int16_t)hsum_i32(s0);
            bsums[2 * g + 1] = (int16_t)hsum_i32(s1);
            __m256i bytes = PACK_BYTES(_mm256_packus_epi32, _mm256_packus_epi16,
                                       _mm256_and_si256(q[0], byte), _mm256_and_si256(q[1], byte),
                                       _mm256_and_si256(q[2], byte), _mm256_and_si256(q[3], byte));
            _mm256_storeu_si256((__m256i *)(b + 4 + 32 * g), bytes);
        }
        float d = 1.0f / iscale;
        memcpy(b, &d, sizeof d);
        memcpy(b + 260, bsums, sizeof bsums);
    }
}

void si__avx2_quantize_act_f32(const float *x, void *dst, int64_t n)
{
    memcpy(dst, x, (size_t)n * sizeof(float));
}

void si__avx2_quantize_act_f16(const float *x, void *dst, int64_t n)
{
    uint8_t *b = dst;
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(b + 2 * i),
                         _mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT));
    for (; i < n; i++)
        put_half(b + 2 * i, x[i]);
}

/* bfloat16 of 8 floats, rounded to nearest even; NaNs truncated and made quiet. */
INLINE __m128i bf16_from8(__m256 v)
{
    __m256i x = _mm256_castps_si256(v);
    __m256i odd = _mm256_and_si256(_mm256_srli_epi32(x, 16), _mm256_set1_epi32(1));
    __m256i r = _mm256_srli_epi32(
        _mm256_add_epi32(x, _mm256_add_epi32(_mm256_set1_epi32(0x7fff), odd)), 16);
    __m256i nan =
        _mm256_cmpgt_epi32(_mm256_and_si256(x, abs_ps_bits()), _mm256_set1_epi32(0x7f800000));
    __m256i quiet = _mm256_or_si256(_mm256_srli_epi32(x, 16), _mm256_set1_epi32(0x40));
    r = _mm256_blendv_epi8(r, quiet, nan);
    return _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1));
}

INLINE uint16_t bf16_from1(float f)
{
    return (uint16_t)_mm_extract_epi16(bf16_from8(_mm256_set1_ps(f)), 0);
}

void si__avx2_quantize_act_bf16(const float *x, void *dst, int64_t n)
{
    uint8_t *b = dst;
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(b + 2 * i), bf16_from8(_mm256_loadu_ps(x + i)));
    for (; i < n; i++) {
        uint16_t h = bf16_from1(x[i]);
        memcpy(b + 2 * i, &h, sizeof h);
    }
}

/*
 * The float dots: four accumulators over runs of 32, reduced as ggml
 * reduces them, the tail one element at a time.  F32 sums in float, F16 and
 * BF16 add the reduced sum and the tail in double.  ggml writes BF16's step
 * as a multiply and an add, which GCC (ggml's usual compiler) contracts to
 * the FMA written here.
 */

/* (a0 + a2) + (a1 + a3), then its two halves, then pairwise (ggml's F32 reduce). */
INLINE float reduce_pairwise(__m256 a0, __m256 a1, __m256 a2, __m256 a3)
{
    __m256 a = _mm256_add_ps(_mm256_add_ps(a0, a2), _mm256_add_ps(a1, a3));
    __m128 t = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    t = _mm_hadd_ps(t, t);
    return _mm_cvtss_f32(_mm_hadd_ps(t, t));
}

#define ACT_DOT_LOOP(LOAD)                                                                         \
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;                                    \
    int64_t i = 0;                                                                                 \
    for (; i + 32 <= n; i += 32) {                                                                 \
        a0 = _mm256_fmadd_ps(LOAD(w, i), LOAD(a, i), a0);                                          \
        a1 = _mm256_fmadd_ps(LOAD(w, i + 8), LOAD(a, i + 8), a1);                                  \
        a2 = _mm256_fmadd_ps(LOAD(w, i + 16), LOAD(a, i + 16), a2);                                \
        a3 = _mm256_fmadd_ps(LOAD(w, i + 24), LOAD(a, i + 24), a3);                                \
    }

#define F32_AT8(p, i) _mm256_loadu_ps((const float *)(const void *)((p) + 4 * (i)))
#define F16_AT8(p, i) _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((p) + 2 * (i))))
#define BF16_AT8(p, i) bf16x8((p) + 2 * (i))

float si__avx2_dot_act_f32(const void *row, const void *xa, int64_t n)
{
    const uint8_t *w = row, *a = xa;
    ACT_DOT_LOOP(F32_AT8)
    float sum = reduce_pairwise(a0, a1, a2, a3);
    for (; i < n; i++)
        sum = fmaf(f32_at(w + 4 * i), f32_at(a + 4 * i), sum);
    return sum;
}

float si__avx2_dot_act_f16(const void *row, const void *xa, int64_t n)
{
    const uint8_t *w = row, *a = xa;
    ACT_DOT_LOOP(F16_AT8)
    double sum = reduce_pairwise(a0, a1, a2, a3);
    for (; i < n; i++)
        sum += (double)(half_at(w + 2 * i) * half_at(a + 2 * i));
    return (float)sum;
}

/*
 * dot_act2: two rows against the same activations, each row's FMAs, reduce
 * and tail exactly those of its dot_act.  The rows ahead, when given, are
 * prefetched as the rows are read, a line of each (32 F16 elements) a step:
 * the next neuron's rows then arrive a row's worth of reading ahead, which
 * keeps about as many lines in flight as the hardware prefetchers do on one
 * sequential stream.  Without rows ahead (the dense case, whose sequential
 * rows the hardware fetches) the loop is compiled without the prefetches.
 */
INLINE void dot_act2_f16_loop(const uint8_t *w, const uint8_t *v, const uint8_t *a, int64_t n,
                              float out[2], const char *pw, const char *pv, bool prefetch)
{
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    __m256 b0 = a0, b1 = a0, b2 = a0, b3 = a0;
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        if (prefetch) {
            _mm_prefetch(pw + 2 * i, _MM_HINT_T0);
            _mm_prefetch(pv + 2 * i, _MM_HINT_T0);
        }
        const __m256 x0 = F16_AT8(a, i), x1 = F16_AT8(a, i + 8);
        const __m256 x2 = F16_AT8(a, i + 16), x3 = F16_AT8(a, i + 24);
        a0 = _mm256_fmadd_ps(F16_AT8(w, i), x0, a0);
        b0 = _mm256_fmadd_ps(F16_AT8(v, i), x0, b0);
        a1 = _mm256_fmadd_ps(F16_AT8(w, i + 8), x1, a1);
        b1 = _mm256_fmadd_ps(F16_AT8(v, i + 8), x1, b1);
        a2 = _mm256_fmadd_ps(F16_AT8(w, i + 16), x2, a2);
        b2 = _mm256_fmadd_ps(F16_AT8(v, i + 16), x2, b2);
        a3 = _mm256_fmadd_ps(F16_AT8(w, i + 24), x3, a3);
        b3 = _mm256_fmadd_ps(F16_AT8(v, i + 24), x3, b3);
    }
    double s0 = reduce_pairwise(a0, a1, a2, a3), s1 = reduce_pairwise(b0, b1, b2, b3);
    for (; i < n; i++) {
        const float x = half_at(a + 2 * i);
        s0 += (double)(half_at(w + 2 * i) * x);
        s1 += (double)(half_at(v + 2 * i) * x);
    }
    out[0] = (float)s0;
    out[1] = (float)s1;
}

void si__avx2_dot_act2_f16(const void *const rows[2], const void *xa, int64_t n, float out[2],
                           const void *const ahead[2])
{
    /* A missing row ahead is replaced by the row being read (its lines are
     * being loaded anyway). */
    const void *pw = ahead != NULL && ahead[0] != NULL ? ahead[0] : rows[0];
    const void *pv = ahead != NULL && ahead[1] != NULL ? ahead[1] : rows[1];
    if (pw != rows[0] || pv != rows[1])
        dot_act2_f16_loop(rows[0], rows[1], xa, n, out, pw, pv, true);
    else
        dot_act2_f16_loop(rows[0], rows[1], xa, n, out, NULL, NULL, false);
}

float si__avx2_dot_act_bf16(const void *row, const void *xa, int64_t n)
{
    const uint8_t *w = row, *a = xa;
    ACT_DOT_LOOP(BF16_AT8)
    double sum = hsum(_mm256_add_ps(_mm256_add_ps(a0, a2), _mm256_add_ps(a1, a3)));
    for (; i < n; i++)
        sum += (double)(bf16_at(w + 2 * i) * bf16_at(a + 2 * i));
    return (float)sum;
}

/* Lane k: sum of x[j] * y[j] over bytes j = 4k .. 4k+3, x and y signed (y > -128). */
INLINE __m256i dot_i8(__m256i x, __m256i y)
{
    __m256i p = _mm256_maddubs_epi16(_mm256_sign_epi8(x, x), _mm256_sign_epi8(y, x));
    return _mm256_madd_epi16(p, _mm256_set1_epi16(1));
}

/* The same with x unsigned and small (x * y pairs fit in int16). */
INLINE __m256i dot_u8(__m256i x, __m256i y)
{
    return _mm256_madd_epi16(_mm256_maddubs_epi16(x, y), _mm256_set1_epi16(1));
}

/* The 32 nibbles of qs[16] as bytes in element order: low nibbles, then high ones. */
INLINE __m256i nibble_bytes(const uint8_t *qs)
{
    __m128i t = _mm_loadu_si128((const __m128i *)qs);
    __m256i v = _mm256_inserti128_si256(_mm256_castsi128_si256(t), _mm_srli_epi16(t, 4), 1);
    return _mm256_and_si256(v, _mm256_set1_epi8(0xf));
}

/* Byte j is 0xff where bit j of the 32 bits at qh is set, else 0. */
INLINE __m256i bit_bytes(const uint8_t *qh)
{
    /* Each 128-bit half picks its two bytes of qh (every dword holds all four). */
    const __m256i pick = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1,
                                          2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
    const __m256i bit = _mm256_set1_epi64x(0x8040201008040201);
    __m256i v = _mm256_shuffle_epi8(_mm256_set1_epi32((int)u32_at(qh)), pick);
    return _mm256_cmpeq_epi8(_mm256_and_si256(v, bit), bit);
}

/* dot_act_<name> of a 32-element block type with Q8_0; QUANTS(w): its 32 quants, signed bytes. */
#define Q8_0_DOT(name, size, QUANTS) Q8_0_DOT_FN(si__avx2_dot_act_##name, size, QUANTS, dot_i8, )
#define Q8_0_DOT_FN(fn, size, QUANTS, dot_i8, ATTR)                                                \
    ATTR float fn(const void *row, const void *xa, int64_t n)                                      \
    {                                                                                              \
        const uint8_t *w = row, *a = xa;                                                           \
        __m256 acc = _mm256_setzero_ps();                                                          \
        for (int64_t i = 0; i < n; i += 32, w += (size), a += 34) {                                \
            __m256 d = _mm256_set1_ps(half_at(w) * half_at(a));                                    \
            __m256i q = dot_i8(QUANTS(w), _mm256_loadu_si256((const __m256i *)(a + 2)));           \
            acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(q), acc);                                  \
        }                                                                                          \
        return hsum(acc);                                                                          \
    }

/*
 * dot_act2_<name>: two rows, each block's activations loaded once; each
 * row's sum is formed as its dot_act forms it.  The rows ahead (or, without
 * them, the current rows) are prefetched at the end of each block, which
 * touches every line since a block is at most 64 bytes.
 */
#define Q8_0_DOT2(name, size, QUANTS) Q8_0_DOT2_FN(si__avx2_dot_act2_##name, size, QUANTS, dot_i8, )
#define Q8_0_DOT2_FN(fn, size, QUANTS, dot_i8, ATTR)                                               \
    ATTR void fn(const void *const rows[2], const void *xa, int64_t n, float out[2],               \
                        const void *const ahead[2])                                                \
    {                                                                                              \
        const uint8_t *w = rows[0], *v = rows[1], *a = xa;                                         \
        const char *pw = ahead != NULL && ahead[0] != NULL ? ahead[0] : rows[0];                   \
        const char *pv = ahead != NULL && ahead[1] != NULL ? ahead[1] : rows[1];                   \
        __m256 acc0 = _mm256_setzero_ps(), acc1 = acc0;                                            \
        for (int64_t i = 0; i < n; i += 32, w += (size), v += (size), a += 34) {                   \
            const int64_t end = (i / 32 + 1) * (size) - 1;                                         \
            _mm_prefetch(pw + end, _MM_HINT_T0);                                                   \
            _mm_prefetch(pv + end, _MM_HINT_T0);                                                   \
            const __m256i x = _mm256_loadu_si256((const __m256i *)(a + 2));                        \
            const float da = half_at(a);                                                           \
            __m256 d = _mm256_set1_ps(half_at(w) * da);                                            \
            acc0 = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(dot_i8(QUANTS(w), x)), acc0);             \
            d = _mm256_set1_ps(half_at(v) * da);                                                   \
            acc1 = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(dot_i8(QUANTS(v), x)), acc1);             \
        }                                                                                          \
        out[0] = hsum(acc0);                                                                       \
        out[1] = hsum(acc1);                                                                       \
    }

/* Q4_0: q - 8; Q5_0: the nibble with bit 4 set, minus 16 (0xf0 where the bit is clear). */
#define Q8_0_QUANTS(w) _mm256_loadu_si256((const __m256i *)((w) + 2))
#define Q4_0_QUANTS(w) _mm256_sub_epi8(nibble_bytes((w) + 2), _mm256_set1_epi8(8))
#define Q5_0_QUANTS(w)                                                                             \
    _mm256_or_si256(nibble_bytes((w) + 6),                                                         \
                    _mm256_andnot_si256(bit_bytes((w) + 2), _mm256_set1_epi8((char)0xf0)))

Q8_0_DOT(q8_0, 34, Q8_0_QUANTS)
Q8_0_DOT(q4_0, 18, Q4_0_QUANTS)
Q8_0_DOT(q5_0, 22, Q5_0_QUANTS)
Q8_0_DOT2(q8_0, 34, Q8_0_QUANTS)
Q8_0_DOT2(q4_0, 18, Q4_0_QUANTS)
Q8_0_DOT2(q5_0, 22, Q5_0_QUANTS)

/*
 * dot_act_<name> for a block type with a min, dotted with Q8_1: the m * s
 * terms summed apart in float (fused, as compilers contract ggml's
 * `summs += m * s`) and added at the end.
 */
#define Q8_1_DOT(name, size, QUANTS) Q8_1_DOT_FN(si__avx2_dot_act_##name, size, QUANTS, dot_u8, )
#define Q8_1_DOT_FN(fn, size, QUANTS, dot_u8, ATTR)                                                \
    ATTR float fn(const void *row, const void *xa, int64_t n)                                      \
    {                                                                                              \
        const uint8_t *w = row, *a = xa;                                                           \
        __m256 acc = _mm256_setzero_ps();                                                          \
        float summs = 0.0f;                                                                        \
        for (int64_t i = 0; i < n; i += 32, w += (size), a += 36) {                                \
            summs = fmaf(half_at(w + 2), half_at(a + 2), summs);                                   \
            __m256 d = _mm256_set1_ps(half_at(w) * half_at(a));                                    \
            __m256i q = dot_u8(QUANTS(w), _mm256_loadu_si256((const __m256i *)(a + 4)));           \
            acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(q), acc);                                  \
        }                                                                                          \
        return hsum(acc) + summs;                                                                  \
    }

#define Q4_1_QUANTS(w) nibble_bytes((w) + 4)
#define Q5_1_QUANTS(w)                                                                             \
    _mm256_or_si256(nibble_bytes((w) + 8),                                                         \
                    _mm256_and_si256(bit_bytes((w) + 4), _mm256_set1_epi8(0x10)))

Q8_1_DOT(q4_1, 20, Q4_1_QUANTS)
Q8_1_DOT(q5_1, 24, Q5_1_QUANTS)

/*
 * The same kernels with AVX-512 VNNI's dpbusd (on 256-bit registers, VL)
 * for the integer part: it adds the four u8 x s8 products of each lane into
 * int32 at once where AVX2 needs maddubs (pairs into int16) then madd (pairs
 * of those into int32).  No pair sum can saturate in int16 (|u8 x s8| <=
 * 128 x 127, two of them 32512), so both give the same integers, and the
 * float steps are unchanged: the same bits, in about two thirds of the
 * integer instructions.  Chosen at run time by quants_dispatch.c
 * (si__quants_vnni_usable).
 */
#define VNNI __attribute__((target("avx2,fma,f16c,avx512f,avx512vl,avx512vnni")))

VNNI static inline __m256i dot_i8_vnni(__m256i x, __m256i y)
{
    return _mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_sign_epi8(x, x),
                               _mm256_sign_epi8(y, x));
}

VNNI static inline __m256i dot_u8_vnni(__m256i x, __m256i y)
{
    return _mm256_dpbusd_epi32(_mm256_setzero_si256(), x, y);
}

Q8_0_DOT_FN(dot_act_vnni_q8_0, 34, Q8_0_QUANTS, dot_i8_vnni, VNNI static)
Q8_0_DOT_FN(dot_act_vnni_q4_0, 18, Q4_0_QUANTS, dot_i8_vnni, VNNI static)
Q8_0_DOT_FN(dot_act_vnni_q5_0, 22, Q5_0_QUANTS, dot_i8_vnni, VNNI static)
Q8_0_DOT2_FN(dot_act2_vnni_q8_0, 34, Q8_0_QUANTS, dot_i8_vnni, VNNI static)
Q8_0_DOT2_FN(dot_act2_vnni_q4_0, 18, Q4_0_QUANTS, dot_i8_vnni, VNNI static)
Q8_0_DOT2_FN(dot_act2_vnni_q5_0, 22, Q5_0_QUANTS, dot_i8_vnni, VNNI static)
Q8_1_DOT_FN(dot_act_vnni_q4_1, 20, Q4_1_QUANTS, dot_u8_vnni, VNNI static)
Q8_1_DOT_FN(dot_act_vnni_q5_1, 24, Q5_1_QUANTS, dot_u8_vnni, VNNI static)

/*
 * mad4 on 512-bit registers (with AVX-512, which VNNI's CPUs have): a block's
 * 32 values of y in two registers across the four rows, each row's quants
 * widened 16 at a time; per value the AVX2 kernel's operations in its order,
 * s = fma(q, a[r] d_r, s) for r = 0..3 (q - 8 for Q4_0, exact in float), so
 * the same bits with half the instructions.  The sparse down projection's
 * kernel (si_k_ffn_down_sparse), which decoding's FFN spends half its time
 * in at 90% sparsity.
 */
VNNI static void mad4_avx512_q4_0(const void *const rows[4], const float a[4], float *y, int64_t n)
{
    /* q - 8 as a float by a permutation of this table, which reads the low
     * 4 bits of each index: the byte's low nibble, then (shifted) its high
     * one; the same floats as converting q - 8 */
    const __m512 tab = _mm512_setr_ps(-8, -7, -6, -5, -4, -3, -2, -1, 0, 1, 2, 3, 4, 5, 6, 7);
    const uint8_t *b[4] = {rows[0], rows[1], rows[2], rows[3]};
    for (int64_t i = 0; i < n; i += 32) {
        __m512 s0 = _mm512_loadu_ps(y + i), s1 = _mm512_loadu_ps(y + i + 16);
        for (int r = 0; r < 4; r++) {
            const __m512 c = _mm512_set1_ps(a[r] * half_at(b[r]));
            const __m512i v = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(b[r] + 2)));
            s0 = _mm512_fmadd_ps(_mm512_permutexvar_ps(v, tab), c, s0);
            s1 = _mm512_fmadd_ps(_mm512_permutexvar_ps(_mm512_srli_epi32(v, 4), tab), c, s1);
            b[r] += 18;
        }
        _mm512_storeu_ps(y + i, s0);
        _mm512_storeu_ps(y + i + 16, s1);
    }
}

VNNI static void mad4_avx512_q8_0(const void *const rows[4], const float a[4], float *y, int64_t n)
{
    const uint8_t *b[4] = {rows[0], rows[1], rows[2], rows[3]};
    for (int64_t i = 0; i < n; i += 32) {
        __m512 s0 = _mm512_loadu_ps(y + i), s1 = _mm512_loadu_ps(y + i + 16);
        for (int r = 0; r < 4; r++) {
            const __m512 c = _mm512_set1_ps(a[r] * half_at(b[r]));
            const __m512i q0 = _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(b[r] + 2)));
            const __m512i q1 =
                _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(b[r] + 18)));
            s0 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(q0), c, s0);
            s1 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(q1), c, s1);
            b[r] += 34;
        }
        _mm512_storeu_ps(y + i, s0);
        _mm512_storeu_ps(y + i + 16, s1);
    }
}

/* Only the kernels that differ from the AVX2 table's. */
const struct si__quants_table si__quants_vnni = {
    .name = "avx2+vnni",
    .compiled = true,
    .type =
        {
            [SI_TYPE_Q8_0] = {.dot_act = dot_act_vnni_q8_0,
                              .mad4 = mad4_avx512_q8_0,
                              .dot_act2 = dot_act2_vnni_q8_0,
                              .dot_act8 = si__vnni_dot_act8_q8_0,
                              .gemm8 = si__vnni_gemm8_q8_0,
                              .dot_act8p = si__vnni_dot_act8p_q8_0,
                              .dot_act8_next = si__vnni_dot_act8_next_q8_0},
            [SI_TYPE_Q4_0] = {.dot_act = dot_act_vnni_q4_0,
                              .mad4 = mad4_avx512_q4_0,
                              .dot_act2 = dot_act2_vnni_q4_0,
                              .dot_act8 = si__vnni_dot_act8_q4_0,
                              .gemm8 = si__vnni_gemm8_q4_0,
                              .dot_act8p = si__vnni_dot_act8p_q4_0,
                              .dot_act8_next = si__vnni_dot_act8_next_q4_0},
            [SI_TYPE_Q5_0] = {.dot_act = dot_act_vnni_q5_0, .dot_act2 = dot_act2_vnni_q5_0},
            [SI_TYPE_Q4_1] = {.dot_act = dot_act_vnni_q4_1,
                              .dot_act8 = si__vnni_dot_act8_q4_1,
                              .gemm8 = si__vnni_gemm8_q4_1},
            [SI_TYPE_Q5_1] = {.dot_act = dot_act_vnni_q5_1},
            [SI_TYPE_Q4_K] = {.gemm8 = si__vnni_gemm8_q4_k},
            [SI_TYPE_Q5_K] = {.gemm8 = si__vnni_gemm8_q5_k},
            [SI_TYPE_Q6_K] = {.gemm8 = si__vnni_gemm8_q6_k},
        },
};

/*
 * The 8 scales then the 8 mins (6 bits each) of a Q4_K / Q5_K super-block
 * from its 12 packed bytes: scale j < 4 is sc[j] & 63 and min j < 4 is
 * sc[j + 4] & 63; for j >= 4 the low 4 bits come from sc[j + 4] (low nibble
 * for the scale, high for the min) and the top 2 from bits 6-7 of sc[j - 4]
 * (scale) or sc[j] (min).
 */
INLINE void k_scales_mins(const uint8_t *sc, uint8_t out[16])
{
    uint32_t u0 = u32_at(sc), u1 = u32_at(sc + 4), u2 = u32_at(sc + 8);
    uint32_t v[4] = {
        u0 & 0x3f3f3f3fu,
        (u2 & 0x0f0f0f0fu) | ((u0 >> 6) & 0x03030303u) << 4,
        u1 & 0x3f3f3f3fu,
        ((u2 >> 4) & 0x0f0f0f0fu) | ((u1 >> 6) & 0x03030303u) << 4,
    };
    memcpy(out, v, sizeof v);
}

/* Lane k (0-3): min_2k * q8 sum of sub-block 2k + the same for 2k + 1, from the Q8_K bsums. */
INLINE __m128i k_min_products(const uint8_t sm[16], const uint8_t *bsums)
{
    __m128i mins = _mm_cvtepu8_epi16(_mm_loadl_epi64((const __m128i *)(sm + 8)));
    __m128i sums = _mm_hadd_epi16(_mm_loadu_si128((const __m128i *)bsums),
                                  _mm_loadu_si128((const __m128i *)(bsums + 16)));
    return _mm_madd_epi16(mins, sums);
}

/*
 * The int32 lanes of sum_j(scale_j * q_w * q_a) over a Q4_K / Q5_K
 * super-block: chunk c of 64 elements is sub-blocks 2c (low nibbles of
 * qs[32c .. 32c+31], 5th bit = bit 2c of qh[l]) and 2c+1 (high nibbles,
 * bit 2c+1).
 */
INLINE __m256i k_sums(const uint8_t *qs, const uint8_t *qh, const int8_t *qa, const uint8_t sm[16])
{
    const __m256i low = _mm256_set1_epi8(0xf), bit4 = _mm256_set1_epi8(0x10);
    __m256i hb = qh != NULL ? _mm256_loadu_si256((const __m256i *)qh) : _mm256_setzero_si256();
    __m256i sumi = _mm256_setzero_si256();
    for (int c = 0; c < 4; c++) {
        __m256i bits = _mm256_loadu_si256((const __m256i *)(qs + 32 * c));
        __m256i lo = _mm256_and_si256(bits, low);
        __m256i hi = _mm256_and_si256(_mm256_srli_epi16(bits, 4), low);
        if (qh != NULL) {
            lo = _mm256_or_si256(lo, _mm256_and_si256(_mm256_slli_epi16(hb, 4), bit4));
            hi = _mm256_or_si256(hi, _mm256_and_si256(_mm256_slli_epi16(hb, 3), bit4));
            hb = _mm256_srli_epi16(hb, 2);
        }
        __m256i p0 = _mm256_madd_epi16(
            _mm256_maddubs_epi16(lo, _mm256_loadu_si256((const __m256i *)(qa + 64 * c))),
            _mm256_set1_epi16(sm[2 * c]));
        __m256i p1 = _mm256_madd_epi16(
            _mm256_maddubs_epi16(hi, _mm256_loadu_si256((const __m256i *)(qa + 64 * c + 32))),
            _mm256_set1_epi16(sm[2 * c + 1]));
        sumi = _mm256_add_epi32(sumi, _mm256_add_epi32(p0, p1));
    }
    return sumi;
}

/*
 * Q4_K as llama.cpp's AVX2 build computes Q4_K matrices whose row count is a
 * multiple of 8, which it repacks 8 rows at a time: per super-block the
 * exact integers isum = sum_j(scale_j * q_w . q_a) and msum = sum_j(min_j *
 * sum(q_a)), then two float sums, acc = fma(isum, d * d_a, acc) and accm =
 * fma(msum, dmin * d_a, accm), and the row is acc - accm.
 */
float si__avx2_dot_act_q4_k(const void *row, const void *xa, int64_t n)
{
    const uint8_t *w = row, *a = xa;
    float acc = 0.0f, accm = 0.0f;
    for (int64_t i = 0; i < n; i += 256, w += 144, a += 292) {
        const float da = f32_at(a);
        uint8_t sm[16];
        k_scales_mins(w + 4, sm);
        __m128i mp = k_min_products(sm, a + 260);
        mp = _mm_add_epi32(mp, _mm_unpackhi_epi64(mp, mp));
        mp = _mm_add_epi32(mp, _mm_shuffle_epi32(mp, 1));
        const int isum = hsum_i32(k_sums(w + 16, NULL, (const int8_t *)(a + 4), sm));
        acc = fmaf((float)isum, half_at(w) * da, acc);
        accm = fmaf((float)_mm_cvtsi128_si32(mp), half_at(w + 2) * da, accm);
    }
    return acc - accm;
}

/* Q5_K: the min terms as one integer per super-block, FMA'd into a float sum. */
float si__avx2_dot_act_q5_k(const void *row, const void *xa, int64_t n)
{
    const uint8_t *w = row, *a = xa;
    __m256 acc = _mm256_setzero_ps();
    float summs = 0.0f;
    for (int64_t i = 0; i < n; i += 256, w += 176, a += 292) {
        float da = f32_at(a);
        uint8_t sm[16];
        k_scales_mins(w + 4, sm);
        __m128i p = k_min_products(sm, a + 260);
        p = _mm_add_epi32(p, _mm_unpackhi_epi64(p, p));
        p = _mm_add_epi32(p, _mm_shuffle_epi32(p, 1));
        summs = fmaf(-da * half_at(w + 2), (float)_mm_cvtsi128_si32(p), summs);
        __m256i sumi = k_sums(w + 48, w + 16, (const int8_t *)(a + 4), sm);
        acc = _mm256_fmadd_ps(_mm256_set1_ps(da * half_at(w)), _mm256_cvtepi32_ps(sumi), acc);
    }
    return hsum(acc) + summs;
}

/*
 * Q6_K, with llama.cpp's AVX2 lanes: per 32-element chunk, maddubs(q, a)
 * with q unsigned (0 ... 63), multiplied by the chunk's two scales (16
 * elements each) and summed in int32 lanes (lane m: elements 4m ... 4m+3 of
 * each chunk); the offset 32 comes off afterwards, lane m losing
 * 32 * (bsum_2m * scale_2m + bsum_2m+1 * scale_2m+1).  The lanes are then
 * converted, FMA'd with d_a * d per super-block, and summed.
 */
float si__avx2_dot_act_q6_k(const void *row, const void *xa, int64_t n)
{
    const uint8_t *w = row, *a = xa;
    __m256 acc = _mm256_setzero_ps();
    for (int64_t i = 0; i < n; i += 256, w += 210, a += 292) {
        const int8_t *sc = (const int8_t *)(w + 192), *qa = (const int8_t *)(a + 4);
        const __m256i bsums = _mm256_loadu_si256((const __m256i *)(a + 260));
        const __m256i sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)sc));
        const __m256i offset = _mm256_slli_epi32(_mm256_madd_epi16(bsums, sc16), 5);
        __m256i sumi = _mm256_setzero_si256();
        for (int h = 0; h < 2; h++) {
            __m256i ql0 = _mm256_loadu_si256((const __m256i *)(w + 64 * h));
            __m256i ql1 = _mm256_loadu_si256((const __m256i *)(w + 64 * h + 32));
            __m256i qh = _mm256_loadu_si256((const __m256i *)(w + 128 + 32 * h));
            __m256i q[4];
            q6_k_values(ql0, ql1, qh, q);
            for (int k = 0; k < 4; k++) {
                __m256i y = _mm256_loadu_si256((const __m256i *)(qa + 128 * h + 32 * k));
                __m256i p = _mm256_maddubs_epi16(q[k], y);
                const int8_t *s = sc + 8 * h + 2 * k;
                __m256i scale = _mm256_inserti128_si256(
                    _mm256_castsi128_si256(_mm_set1_epi16(s[0])), _mm_set1_epi16(s[1]), 1);
                sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(scale, p));
            }
        }
        sumi = _mm256_sub_epi32(sumi, offset);
        acc = _mm256_fmadd_ps(_mm256_set1_ps(f32_at(a) * half_at(w + 208)),
                              _mm256_cvtepi32_ps(sumi), acc);
    }
    return hsum(acc);
}

/* ------------------------------------------------------ attention */

/*
 * si_k_attn_f16 (model/kernels.h) with these kernels: the operations of
 * si__k_attn_f16_portable, element for element and in the same order, so
 * that the results are the same bits.
 *
 * What may differ is only the order between independent operations.  The
 * scores of a block of positions (this file's si__avx2_dot_act_f16, the
 * dot the portable code calls when this table is in use) and the softmax's
 * scalar steps come first, then each run of value elements goes through
 * every position of the block in registers.  Each element's chain of
 * roundings is unchanged: acc = fp16(fp32(acc) * ms) when a position
 * raises the maximum, then acc = fp16(fma(fp32(v_t), vs, fp32(acc))).  F16C's
 * conversions (VCVTPS2PH with round to nearest even) equal si_fp16_to_fp32
 * and si_fp32_to_fp16 on every value but the signalling NaN halves, which
 * F16C quiets and which the fp16 writers never produce (and which the FMA
 * quiets anyway; tests/test-kernels.c checks the conversions).  The FMA
 * is written as VFMADD213PS v = vs * v + acc so that, should two NaNs meet,
 * the one that propagates is the one glibc's fmaf propagates (x, then y,
 * then z: v's, then vs's, then acc's), and the output's fp32(acc) * inv as
 * VMULPS with acc first, as GCC compiles the portable code's product (acc's
 * NaN wins over inv's, which is NaN whenever acc is).  The other products
 * and sums meet at most one NaN, but for scale * a NaN score when scale is
 * itself a NaN.  The sums S = fmaf(S, ms, vs) are one fused rounding, as in
 * the portable code (and llama.cpp, whose compiler contracts them).
 */

#define ATTN_BLOCK 64 /* positions whose scores are formed before the value pass */

/* fp16(x) as a float: round to nearest even and back. */
INLINE __m256 round_f16(__m256 x)
{
    return _mm256_cvtph_ps(_mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT));
}

/* v * w + a, one rounding, NaN priority v, w, a (glibc's fmaf(v, w, a)). */
INLINE __m256 fma_vwa(__m256 v, __m256 w, __m256 a)
{
#if defined(__GNUC__)
    __asm__("vfmadd213ps %2, %1, %0" : "+x"(v) : "x"(w), "xm"(a));
    return v;
#else
    return _mm256_fmadd_ps(v, w, a);
#endif
}

INLINE float fma_vwa1(float v, float w, float a)
{
#if defined(__GNUC__)
    __asm__("vfmadd213ss %2, %1, %0" : "+x"(v) : "x"(w), "xm"(a));
    return v;
#else
    return fmaf(v, w, a);
#endif
}

INLINE float mul_ab1(float a, float b)
{
#if defined(__GNUC__)
    float r;
    __asm__("vmulss %2, %1, %0" : "=x"(r) : "x"(a), "xm"(b));
    return r;
#else
    return a * b;
#endif
}

/* Values (acc, element i on) of NR * 8 elements through the block's positions. */
#define ATTN_VALUES(NR)                                                                            \
    do {                                                                                           \
        __m256 r[NR];                                                                              \
        for (int u = 0; u < (NR); u++)                                                             \
            r[u] = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(acc + i + 8 * u)));           \
        for (int j = 0; j < nb; j++) {                                                             \
            const uint16_t *vt = vb + (size_t)j * kvd + i;                                         \
            if (up[j]) {                                                                           \
                const __m256 m = _mm256_set1_ps(ms[j]);                                            \
                for (int u = 0; u < (NR); u++)                                                     \
                    r[u] = round_f16(_mm256_mul_ps(r[u], m));                                      \
            }                                                                                      \
            const __m256 w = _mm256_set1_ps(vs[j]);                                                \
            for (int u = 0; u < (NR); u++)                                                         \
                r[u] = round_f16(fma_vwa(                                                          \
                    _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(vt + 8 * u))), w, r[u]));    \
        }                                                                                          \
        for (int u = 0; u < (NR); u++)                                                             \
            _mm_storeu_si128((__m128i *)(acc + i + 8 * u),                                         \
                             _mm256_cvtps_ph(r[u], _MM_FROUND_TO_NEAREST_INT));                    \
    } while (0)

void si__avx2_attn_f16(float *out, const float *q, const uint16_t *k, const uint16_t *v,
                       int first, int n_kv, int h0, int h1, int n_head, int n_head_kv,
                       int head_dim, float scale, uint16_t *scratch)
{
    const int hd = head_dim, group = n_head / n_head_kv;
    const size_t kvd = (size_t)n_head_kv * hd;
    uint16_t *q16 = scratch, *acc = scratch + hd;
    float ms[ATTN_BLOCK], vs[ATTN_BLOCK];
    bool up[ATTN_BLOCK];
    for (int h = h0; h < h1; h++) {
        const size_t koff = (size_t)(h / group) * hd;
        si__avx2_quantize_act_f16(q + (size_t)h * hd, q16, hd);
        memset(acc, 0, (size_t)hd * sizeof *acc);
        float M = -INFINITY, S = 0.0f;
        for (int t0 = first; t0 < n_kv; t0 += ATTN_BLOCK) {
            const int nb = n_kv - t0 < ATTN_BLOCK ? n_kv - t0 : ATTN_BLOCK;
            for (int j = 0; j < nb; j++) {
                const float sc =
                    si__avx2_dot_act_f16(k + (size_t)(t0 + j) * kvd + koff, q16, hd) * scale;
                ms[j] = 1.0f;
                vs[j] = 1.0f;
                up[j] = sc > M;
                if (up[j]) {
                    const float Mold = M;
                    M = sc;
                    ms[j] = expf(Mold - M);
                } else {
                    vs[j] = expf(sc - M);
                }
                S = fmaf(S, ms[j], vs[j]);
            }
            const uint16_t *vb = v + (size_t)t0 * kvd + koff;
            int i = 0;
            for (; i + 128 <= hd; i += 128)
                ATTN_VALUES(16);
            for (; i + 64 <= hd; i += 64)
                ATTN_VALUES(8);
            for (; i + 32 <= hd; i += 32)
                ATTN_VALUES(4);
            for (; i + 8 <= hd; i += 8)
                ATTN_VALUES(1);
            for (; i < hd; i++) {
                float a = _cvtsh_ss(acc[i]);
                for (int j = 0; j < nb; j++) {
                    if (up[j])
                        a = _cvtsh_ss(_cvtss_sh(a * ms[j], _MM_FROUND_TO_NEAREST_INT));
                    a = _cvtsh_ss(_cvtss_sh(fma_vwa1(_cvtsh_ss(vb[(size_t)j * kvd + i]), vs[j], a),
                                            _MM_FROUND_TO_NEAREST_INT));
                }
                acc[i] = (uint16_t)_cvtss_sh(a, _MM_FROUND_TO_NEAREST_INT);
            }
        }
        float *o = out + (size_t)h * hd;
        const float inv = S == 0.0f ? 0.0f : 1.0f / S;
        const __m256 vinv = _mm256_set1_ps(inv);
        int i = 0;
        for (; i + 8 <= hd; i += 8)
            _mm256_storeu_ps(
                o + i, mul_ab(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(acc + i))), vinv));
        for (; i < hd; i++)
            o[i] = mul_ab1(_cvtsh_ss(acc[i]), inv);
    }
}

#else /* no AVX2, FMA and F16C at compile time */

const struct si__quants_table si__quants_vnni = {.name = "avx2+vnni", .compiled = false};

#endif
