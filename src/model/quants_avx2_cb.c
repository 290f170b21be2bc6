/*
 * quants_avx2_cb.c - the AVX2 block kernel of column-block products
 * (model/colblock.h, si__cb_block_fn), the portable kernel's bits.
 *
 * Per group of 64 outputs, the q rows of two inputs at a time: their low
 * and high nibbles (outputs 0..31 and 32..63) interleaved byte by byte and
 * multiplied by the two 8-bit inputs with maddubs, which adds each output's
 * two products (at most 2 x 15 x 127 in 16 bits); four such pairs add up in
 * 16-bit lanes before they widen into 32-bit sums, so the integers are
 * exact whatever the order.  The unpacks work within 128-bit lanes: a
 * 16-bit accumulator holds outputs 0..7 and 16..23 (or 8..15 and 24..31, ...),
 * which widen into the 8 sums of consecutive outputs.  The block's scales
 * then apply as in the portable code: one multiply and one fused
 * multiply-add per output (two with mins).
 *
 * Pure kernels; quants_avx2.c lists it in its table.
 */
#include "model/quants_impl.h"

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)

#include "model/quants_avx2.h"

#include <immintrin.h>

#ifndef CB_AHEAD
#define CB_AHEAD 256
#endif

void si__avx2_cb_block(bool has_min, const uint8_t *const *rows, const int8_t *xq, int na,
                       int32_t sxq, float s, const uint16_t *d, const uint16_t *m, int64_t n,
                       float *y)
{
    const __m256i low = _mm256_set1_epi8(0x0f), zero = _mm256_setzero_si256();
    const __m256 vs = _mm256_set1_ps(s), vmin = _mm256_set1_ps((float)sxq * s);
    const __m256i v8 = _mm256_set1_epi32(8 * sxq);
    for (int64_t g = 0; g < n; g += 64) {
        const size_t at = (size_t)(g / 2);
        __m256i t[8];
        for (int c = 0; c < 8; c++)
            t[c] = zero;
        for (int k = 0; k < na;) {
            __m256i a0 = zero, a1 = zero, a2 = zero, a3 = zero;
            for (int p = 0; p < 4 && k < na; p++, k += 2) {
                const bool two = k + 1 < na;
                _mm_prefetch((const char *)(rows[k] + at + CB_AHEAD), _MM_HINT_T0);
                if (two)
                    _mm_prefetch((const char *)(rows[k + 1] + at + CB_AHEAD), _MM_HINT_T0);
                const __m256i bi = _mm256_loadu_si256((const __m256i *)(rows[k] + at));
                const __m256i bj =
                    two ? _mm256_loadu_si256((const __m256i *)(rows[k + 1] + at)) : zero;
                const uint16_t pair =
                    (uint16_t)((uint8_t)xq[k] | (uint16_t)((uint8_t)(two ? xq[k + 1] : 0)) << 8);
                const __m256i xp = _mm256_set1_epi16((int16_t)pair);
                const __m256i li = _mm256_and_si256(bi, low), lj = _mm256_and_si256(bj, low);
                const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(bi, 4), low);
                const __m256i hj = _mm256_and_si256(_mm256_srli_epi16(bj, 4), low);
                a0 = _mm256_add_epi16(a0, _mm256_maddubs_epi16(_mm256_unpacklo_epi8(li, lj), xp));
                a1 = _mm256_add_epi16(a1, _mm256_maddubs_epi16(_mm256_unpackhi_epi8(li, lj), xp));
                a2 = _mm256_add_epi16(a2, _mm256_maddubs_epi16(_mm256_unpacklo_epi8(hi, hj), xp));
                a3 = _mm256_add_epi16(a3, _mm256_maddubs_epi16(_mm256_unpackhi_epi8(hi, hj), xp));
            }
            /* a0: outputs 0..7 | 16..23, a1: 8..15 | 24..31, a2 and a3 the same + 32 */
            t[0] = _mm256_add_epi32(t[0], _mm256_cvtepi16_epi32(_mm256_castsi256_si128(a0)));
            t[2] = _mm256_add_epi32(t[2], _mm256_cvtepi16_epi32(_mm256_extracti128_si256(a0, 1)));
            t[1] = _mm256_add_epi32(t[1], _mm256_cvtepi16_epi32(_mm256_castsi256_si128(a1)));
            t[3] = _mm256_add_epi32(t[3], _mm256_cvtepi16_epi32(_mm256_extracti128_si256(a1, 1)));
            t[4] = _mm256_add_epi32(t[4], _mm256_cvtepi16_epi32(_mm256_castsi256_si128(a2)));
            t[6] = _mm256_add_epi32(t[6], _mm256_cvtepi16_epi32(_mm256_extracti128_si256(a2, 1)));
            t[5] = _mm256_add_epi32(t[5], _mm256_cvtepi16_epi32(_mm256_castsi256_si128(a3)));
            t[7] = _mm256_add_epi32(t[7], _mm256_cvtepi16_epi32(_mm256_extracti128_si256(a3, 1)));
        }
        for (int c = 0; c < 8; c++) {
            float *yc = y + g + 8 * c;
            const __m256 dv = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(d + g + 8 * c)));
            __m256 acc = _mm256_loadu_ps(yc);
            if (has_min) {
                acc = _mm256_fmadd_ps(dv, _mm256_mul_ps(_mm256_cvtepi32_ps(t[c]), vs), acc);
                const __m256 mv =
                    _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(m + g + 8 * c)));
                acc = _mm256_fmadd_ps(mv, vmin, acc);
            } else {
                acc = _mm256_fmadd_ps(
                    dv, _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(t[c], v8)), vs), acc);
            }
            _mm256_storeu_ps(yc, acc);
        }
    }
}

#endif
