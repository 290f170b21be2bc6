/*
 * quants_avx2_cb.c - the AVX2 block kernel of column-block products
 * (model/colblock.h, si__cb_block_fn), the portable kernel's bits.
 *
 * Per group of 64 outputs, the q rows of two inputs at a time: their bytes
 * interleaved (one unpack for 16 bytes of each), then split into nibbles
 * within each 16-bit lane (the low nibbles of both: outputs 0..31; shifted
 * by 4, the high ones: outputs 32..63) and multiplied by the two 8-bit
 * inputs with maddubs, which adds each output's two products (at most 2 x
 * 15 x 127 in 16 bits); eight such pairs add up in 16-bit lanes before they
 * widen into 32-bit sums, so the integers are exact whatever the order.
 * The unpacks work within 128-bit lanes: a 16-bit accumulator holds outputs
 * 0..7 and 16..23 (or 8..15 and 24..31, ...), which widen into the 8 sums of
 * consecutive outputs.  The block's scales then apply as in the portable
 * code: one multiply and one fused multiply-add per output (two with mins).
 *
 * Measured (a 2048 x 1024 copy in L2, S = 0.4, one thread of the 2-core
 * EPYC VM): 22.7 GB/s of the copy against 14.5 for the first version
 * (two unpacks more a pair, four pairs a widening, its accumulators spilled
 * to the stack), and 24 for the dense packed rows' kernel.
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

/* a's 16-bit sums of 16 outputs into two accumulators of 8 32-bit ones */
#define WIDEN(t_lo, t_hi, a)                                                                       \
    do {                                                                                           \
        t_lo = _mm256_add_epi32(t_lo, _mm256_cvtepi16_epi32(_mm256_castsi256_si128(a)));           \
        t_hi = _mm256_add_epi32(t_hi, _mm256_cvtepi16_epi32(_mm256_extracti128_si256(a, 1)));      \
    } while (0)

/* y[0..8) += the block's scales d times s times the sums t (minus 8 sxq),
 * plus the mins m times s sxq */
static inline __attribute__((always_inline)) void scale8(bool has_min, __m256i t, const uint16_t *d,
                                                         const uint16_t *m, __m256 vs, __m256 vmin,
                                                         __m256i v8, float *y)
{
    const __m256 dv = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)d));
    __m256 acc = _mm256_loadu_ps(y);
    if (has_min) {
        acc = _mm256_fmadd_ps(dv, _mm256_mul_ps(_mm256_cvtepi32_ps(t), vs), acc);
        acc = _mm256_fmadd_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)m)), vmin, acc);
    } else {
        acc = _mm256_fmadd_ps(dv, _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(t, v8)), vs),
                              acc);
    }
    _mm256_storeu_ps(y, acc);
}

static inline __attribute__((always_inline)) void cb_block(bool has_min, const uint8_t *const *rows,
                                                           const int8_t *xq, int na, int32_t sxq,
                                                           float s, const uint16_t *d,
                                                           const uint16_t *m, int64_t n, float *y)
{
    const __m256i low = _mm256_set1_epi8(0x0f), zero = _mm256_setzero_si256();
    const __m256 vs = _mm256_set1_ps(s), vmin = _mm256_set1_ps((float)sxq * s);
    const __m256i v8 = _mm256_set1_epi32(8 * sxq);
    /* the pairs of inputs: their rows and 8-bit values (an odd last input
     * paired with itself times 0) */
    const int np = (na + 1) / 2;
    const uint8_t *ri[16], *rj[16];
    int16_t xp[16];
    for (int p = 0; p < np; p++) {
        const int k = 2 * p;
        const bool two = k + 1 < na;
        ri[p] = rows[k];
        rj[p] = two ? rows[k + 1] : rows[k];
        xp[p] = (int16_t)(uint16_t)((uint8_t)xq[k] | (uint16_t)(uint8_t)(two ? xq[k + 1] : 0) << 8);
    }
    for (int64_t g = 0; g < n; g += 64) {
        const size_t at = (size_t)(g / 2);
        const bool ahead = (at & 63) == 0; /* one prefetch a cache line */
        __m256i t0 = zero, t1 = zero, t2 = zero, t3 = zero, t4 = zero, t5 = zero, t6 = zero,
                t7 = zero;
        for (int p0 = 0; p0 < np; p0 += 8) {
            /* at most 8 pairs in 16 bits: 8 x 2 x 15 x 127 < 32768 */
            __m256i a0 = zero, a1 = zero, a2 = zero, a3 = zero;
            const int pe = p0 + 8 < np ? p0 + 8 : np;
            for (int p = p0; p < pe; p++) {
                if (ahead) {
                    _mm_prefetch((const char *)(ri[p] + at + CB_AHEAD), _MM_HINT_T1);
                    _mm_prefetch((const char *)(rj[p] + at + CB_AHEAD), _MM_HINT_T1);
                }
                const __m256i x = _mm256_set1_epi16(xp[p]);
                const __m256i bi = _mm256_loadu_si256((const __m256i *)(ri[p] + at));
                const __m256i bj = _mm256_loadu_si256((const __m256i *)(rj[p] + at));
                const __m256i ul = _mm256_unpacklo_epi8(bi, bj), uh = _mm256_unpackhi_epi8(bi, bj);
                const __m256i hl = _mm256_srli_epi16(ul, 4), hh = _mm256_srli_epi16(uh, 4);
                a0 = _mm256_add_epi16(a0, _mm256_maddubs_epi16(_mm256_and_si256(ul, low), x));
                a1 = _mm256_add_epi16(a1, _mm256_maddubs_epi16(_mm256_and_si256(uh, low), x));
                a2 = _mm256_add_epi16(a2, _mm256_maddubs_epi16(_mm256_and_si256(hl, low), x));
                a3 = _mm256_add_epi16(a3, _mm256_maddubs_epi16(_mm256_and_si256(hh, low), x));
            }
            /* a0: outputs 0..7 | 16..23, a1: 8..15 | 24..31, a2 and a3 the same + 32 */
            WIDEN(t0, t2, a0);
            WIDEN(t1, t3, a1);
            WIDEN(t4, t6, a2);
            WIDEN(t5, t7, a3);
        }
        scale8(has_min, t0, d + g, m + g, vs, vmin, v8, y + g);
        scale8(has_min, t1, d + g + 8, m + g + 8, vs, vmin, v8, y + g + 8);
        scale8(has_min, t2, d + g + 16, m + g + 16, vs, vmin, v8, y + g + 16);
        scale8(has_min, t3, d + g + 24, m + g + 24, vs, vmin, v8, y + g + 24);
        scale8(has_min, t4, d + g + 32, m + g + 32, vs, vmin, v8, y + g + 32);
        scale8(has_min, t5, d + g + 40, m + g + 40, vs, vmin, v8, y + g + 40);
        scale8(has_min, t6, d + g + 48, m + g + 48, vs, vmin, v8, y + g + 48);
        scale8(has_min, t7, d + g + 56, m + g + 56, vs, vmin, v8, y + g + 56);
    }
}

void si__avx2_cb_block(bool has_min, const uint8_t *const *rows, const int8_t *xq, int na,
                       int32_t sxq, float s, const uint16_t *d, const uint16_t *m, int64_t n,
                       float *y)
{
    /* one copy of the code for each kind, so that the accumulators stay in
     * registers (m unused without mins) */
    if (has_min)
        cb_block(true, rows, xq, na, sxq, s, d, m, n, y);
    else
        cb_block(false, rows, xq, na, sxq, s, d, d, n, y);
}

#endif
