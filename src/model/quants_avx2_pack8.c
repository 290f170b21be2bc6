/*
 * quants_avx2_pack8.c - the AVX2 (and AVX-512 VNNI) dots of groups of 8
 * rows packed by si_pack8 (model/pack8.h), each row's result equal, bit for
 * bit, to the table's dot_act of that row (quants_avx2_act.c).
 *
 * dot_act forms a row's sum in 8 float lanes: lane k adds, block after
 * block, d_w * d_a times the integer sum of the block's values 4k .. 4k+3
 * (one fused multiply-add per block), and the lanes are added at the end.
 * These kernels keep that arithmetic for 8 rows at once: one accumulator
 * per row (Q8_0) or per lane k with row r in its lane r (Q4_0, Q4_1,
 * packed so), the 8 scales of a block converted and multiplied by d_a in one
 * step, the activation block loaded once, and one sequential stream
 * prefetched PREFETCH bytes ahead.  For Q4_0 the integer sums are
 * sum(q * a) - 8 * sum(a) per lane (q the stored 0 .. 15), exactly dot_act's
 * sum((q - 8) * a), with the -8 * sum(a) of each lane formed once per block
 * for the 8 rows.  On this machine one core reads a packed Q4_0 matrix at
 * about 13.5 GB/s against 2.6 for dot_act row by row (docs/measurements.md).
 *
 * Pure kernels; quants_avx2.c and quants_avx2_act.c list them in their tables.
 */
#include "model/quants_impl.h"

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)

#include "model/quants_avx2.h"

#include <immintrin.h>

/* The loops over registers written out, so that the vectors stay in them. */
#define UNROLL_(n) _Pragma(#n)
#define UNROLL(n) UNROLL_(GCC unroll n)

/* How far ahead of the block being read the stream is prefetched: 2 KiB
 * measured best of 0.5, 1, 2 and 4 KiB (docs/measurements.md). */
#define PREFETCH 2048

/* Lane k of the integer products of unsigned x and signed y added to acc:
 * acc + sum over bytes 4k .. 4k+3 of x * y, the pairs exact in int16 for
 * the values here (|x| <= 128, |y| <= 127, x * y pairs within 32512). */
INLINE __m256i dotu_avx2(__m256i acc, __m256i x, __m256i y)
{
    return _mm256_add_epi32(
        acc, _mm256_madd_epi16(_mm256_maddubs_epi16(x, y), _mm256_set1_epi16(1)));
}

#define VNNI __attribute__((target("avx2,fma,f16c,avx512f,avx512vl,avx512vnni")))

VNNI static inline __m256i dotu_vnni(__m256i acc, __m256i x, __m256i y)
{
    return _mm256_dpbusd_epi32(acc, x, y);
}

/* Row r's scale times the activation's, from the 8 of d, in every lane. */
#define ROW_SCALE(d, r) _mm256_permutevar8x32_ps(d, _mm256_set1_epi32(r))

/* Address p, PREFETCH bytes ahead, in a stream of ranges of span bytes
 * that leaves this one (from group to end) and goes on at next, next +
 * (next - group), ... (the *_next kernels: the same columns of the next
 * groups of rows, elsewhere in memory), so that the prefetches fetch what
 * the next calls read instead of the other columns' bytes. */
static inline const char *pf_next(const uint8_t *p, const uint8_t *group, const uint8_t *end,
                                  const uint8_t *next)
{
    if (p < end)
        return (const char *)p;
    const ptrdiff_t span = end - group, stride = next - group;
    ptrdiff_t d = p - end;
    while (d >= span) {
        d -= span;
        next += stride;
    }
    return (const char *)(next + d);
}

/* PF: the prefetch address for byte l of the block at w, PREFETCH ahead. */
#define PACK8_PROLOGUE_PF(bytes, PF)                                                               \
    const uint8_t *w = group, *a = xa;                                                             \
    __m256 acc[8];                                                                                 \
    for (int r = 0; r < 8; r++)                                                                    \
        acc[r] = _mm256_setzero_ps();                                                              \
    for (int64_t i = 0; i < n; i += 32, w += (bytes), a += 34) {                                   \
        for (int l = 0; l < (bytes); l += 64)                                                      \
            _mm_prefetch(PF, _MM_HINT_T0);                                                         \
        const __m256i y = _mm256_loadu_si256((const __m256i *)(a + 2));                            \
        const __m256 d = _mm256_mul_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)w)),       \
                                       _mm256_set1_ps(half_at(a)));

#define PF_AHEAD              ((const char *)w + PREFETCH + l)
#define PF_NEXT               pf_next(w + PREFETCH + l, (const uint8_t *)group, end_, (const uint8_t *)next)
#define PF_NEXT_ARG           , const void *next
#define PACK8_PROLOGUE(bytes) PACK8_PROLOGUE_PF(bytes, PF_AHEAD)

#define PACK8_EPILOGUE                                                                             \
    }                                                                                              \
    for (int r = 0; r < 8; r++)                                                                    \
        out[r] = hsum(acc[r]);

/*
 * Q4_0 and Q4_1: the quants packed in units (pack8.h), so the 4 runs give
 * c[k] (k < 8), whose lane r holds row r's values 4k .. 4k+3: run u's low
 * nibbles are c[u], its high ones c[u + 4].  dot_act's lane k of a row is
 * then lane r of vector k: one accumulator per k, 4 activation bytes
 * broadcast, the rows' scales times d_a in one vector, and at the end the
 * accumulators added in hsum's order, (k + k+4), then (0 + 2) and (1 + 3),
 * then their sum: the same operations as dot_act's, lane by lane.
 */
#define Q4_UNITS(w, c)                                                                             \
    do {                                                                                           \
        const __m256i low_ = _mm256_set1_epi8(0xf);                                                \
        UNROLL(4)                                                                                  \
        for (int u_ = 0; u_ < 4; u_++) {                                                           \
            const __m256i v_ = _mm256_loadu_si256((const __m256i *)((w) + 32 * u_));               \
            (c)[u_] = _mm256_and_si256(v_, low_);                                                  \
            (c)[u_ + 4] = _mm256_and_si256(_mm256_srli_epi16(v_, 4), low_);                        \
        }                                                                                          \
    } while (0)

/* out[r] = row r's sum of its 8 lanes acc[k] lane r, in hsum's order. */
#define Q4_LANES_OUT(acc, out)                                                                     \
    do {                                                                                           \
        __m256 t_[4];                                                                              \
        UNROLL(4)                                                                                  \
        for (int k_ = 0; k_ < 4; k_++)                                                             \
            t_[k_] = _mm256_add_ps((acc)[k_], (acc)[k_ + 4]);                                      \
        _mm256_storeu_ps(out,                                                                      \
                         _mm256_add_ps(_mm256_add_ps(t_[0], t_[2]), _mm256_add_ps(t_[1], t_[3]))); \
    } while (0)

#define Q4_0_DOT8_FN(fn, DOTU, ATTR) Q4_0_DOT8_FN_PF(fn, DOTU, ATTR, , PF_AHEAD)
#define Q4_0_DOT8_FN_PF(fn, DOTU, ATTR, NEXT_ARG, PF)                                              \
    ATTR void fn(const void *group, const void *xa, int64_t n, float out[8] NEXT_ARG)              \
    {                                                                                              \
        const __m256i one = _mm256_set1_epi8(1);                                                   \
        const uint8_t *end_ = (const uint8_t *)group + n / 32 * (8 * 18);                          \
        (void)end_;                                                                                \
        PACK8_PROLOGUE_PF(8 * 18, PF)                                                              \
        /* lane k: -8 times the activations 4k .. 4k+3 */                                          \
        const __m256i n8 = _mm256_sub_epi32(                                                       \
            _mm256_setzero_si256(), _mm256_slli_epi32(DOTU(_mm256_setzero_si256(), one, y), 3));   \
        __m256i c[8];                                                                              \
        Q4_UNITS(w + 16, c);                                                                       \
        UNROLL(8)                                                                                  \
        for (int k = 0; k < 8; k++) {                                                              \
            const __m256i q = DOTU(_mm256_permutevar8x32_epi32(n8, _mm256_set1_epi32(k)), c[k],    \
                                   _mm256_set1_epi32((int)u32_at(a + 2 + 4 * k)));                 \
            acc[k] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(q), acc[k]);                            \
        }                                                                                          \
    }                                                                                              \
    Q4_LANES_OUT(acc, out);                                                                        \
    }

/* Q8_0: signed times signed, as dot_act: |x| times y with x's sign. */
#define Q8_0_DOT8_FN(fn, DOTU, ATTR) Q8_0_DOT8_FN_PF(fn, DOTU, ATTR, , PF_AHEAD)
#define Q8_0_DOT8_FN_PF(fn, DOTU, ATTR, NEXT_ARG, PF)                                              \
    ATTR void fn(const void *group, const void *xa, int64_t n, float out[8] NEXT_ARG)              \
    {                                                                                              \
        const uint8_t *end_ = (const uint8_t *)group + n / 32 * (8 * 34);                          \
        (void)end_;                                                                                \
        PACK8_PROLOGUE_PF(8 * 34, PF)                                                              \
        for (int r = 0; r < 8; r++) {                                                              \
            const __m256i x = _mm256_loadu_si256((const __m256i *)(w + 16 + 32 * r));              \
            const __m256i q =                                                                      \
                DOTU(_mm256_setzero_si256(), _mm256_sign_epi8(x, x), _mm256_sign_epi8(y, x));      \
            acc[r] = _mm256_fmadd_ps(ROW_SCALE(d, r), _mm256_cvtepi32_ps(q), acc[r]);              \
        }                                                                                          \
        PACK8_EPILOGUE                                                                             \
    }

/* Q4_1 against Q8_1: the quants as Q4_0's (no -8), and per row the
 * products of the mins with the activation block's sum chained in one fused
 * multiply-add per block (dot_act's summs), lane r for row r, added at the
 * end. */
#define Q4_1_DOT8_FN(fn, DOTU, ATTR)                                                               \
    ATTR void fn(const void *group, const void *xa, int64_t n, float out[8])                       \
    {                                                                                              \
        const uint8_t *w = group, *a = xa;                                                         \
        __m256 acc[8], summs = _mm256_setzero_ps();                                                \
        for (int k = 0; k < 8; k++)                                                                \
            acc[k] = _mm256_setzero_ps();                                                          \
        for (int64_t i = 0; i < n; i += 32, w += 8 * 20, a += 36) {                                \
            for (int l = 0; l < 8 * 20; l += 64)                                                   \
                _mm_prefetch((const char *)w + PREFETCH + l, _MM_HINT_T0);                         \
            const __m256 d = _mm256_mul_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)w)),   \
                                           _mm256_set1_ps(half_at(a)));                            \
            summs = _mm256_fmadd_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(w + 16))),   \
                                    _mm256_set1_ps(half_at(a + 2)), summs);                        \
            __m256i c[8];                                                                          \
            Q4_UNITS(w + 32, c);                                                                   \
            UNROLL(8)                                                                              \
            for (int k = 0; k < 8; k++) {                                                          \
                const __m256i q = DOTU(_mm256_setzero_si256(), c[k],                               \
                                       _mm256_set1_epi32((int)u32_at(a + 4 + 4 * k)));             \
                acc[k] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(q), acc[k]);                        \
            }                                                                                      \
        }                                                                                          \
        float s[8], m[8];                                                                          \
        Q4_LANES_OUT(acc, s);                                                                      \
        _mm256_storeu_ps(m, summs);                                                                \
        for (int r = 0; r < 8; r++)                                                                \
            out[r] = s[r] + m[r];                                                                  \
    }

/*
 * The batched products (si__gemm8_fn), AVX-512 VNNI on 256-bit registers
 * (32 of them): per block, the 8 rows' 32 quants as unsigned bytes in 8
 * registers c[k] whose lane r holds row r's values 4k .. 4k+3 (Q4_0 and
 * Q4_1 are packed so, Q8_0's rows are transposed); then for each of TILE tokens one chain of 8
 * dpbusd, each with 4 activation bytes broadcast, gives the 8 rows' integer sums in the 8 lanes,
 * started at the offset that makes the unsigned quants signed again (Q4_0: -8 sum(a), Q8_0 stored +
 * 128: -128 sum(a)).  One multiply-add per token and block turns them into float (and one more adds
 * Q4_1's mins). Q8_0's transposition is paid once per block for TILE tokens.
 */
enum { GEMM_TILE = 8 };

/* c[k] lane r = x[r] lane k: an 8 x 8 transposition of 32-bit lanes. */
VNNI static inline void transpose8(const __m256i x[8], __m256i c[8])
{
    __m256i t[8], u[8];
    UNROLL(4)
    for (int i = 0; i < 4; i++) {
        t[2 * i] = _mm256_unpacklo_epi32(x[2 * i], x[2 * i + 1]);
        t[2 * i + 1] = _mm256_unpackhi_epi32(x[2 * i], x[2 * i + 1]);
    }
    UNROLL(2)
    for (int h = 0; h < 2; h++) { /* rows 0-3, then 4-7 */
        u[4 * h + 0] = _mm256_unpacklo_epi64(t[4 * h], t[4 * h + 2]);
        u[4 * h + 1] = _mm256_unpackhi_epi64(t[4 * h], t[4 * h + 2]);
        u[4 * h + 2] = _mm256_unpacklo_epi64(t[4 * h + 1], t[4 * h + 3]);
        u[4 * h + 3] = _mm256_unpackhi_epi64(t[4 * h + 1], t[4 * h + 3]);
    }
    UNROLL(4)
    for (int k = 0; k < 4; k++) {
        c[k] = _mm256_permute2x128_si256(u[k], u[4 + k], 0x20);
        c[4 + k] = _mm256_permute2x128_si256(u[k], u[4 + k], 0x31);
    }
}

/*
 * The shared body: KIND 0 Q4_0 (activations Q8_0, 34 bytes a block), 1
 * Q4_1 (Q8_1, 36), 2 Q8_0 (Q8_0); the tokens [t0, t0 + T), those past
 * n_tok repeating the last one and not stored.  A token's sums depend on
 * its own activations only, so that every tile size gives it the same
 * bits: the full tiles take GEMM_TILE tokens, the rest the smallest tile
 * that holds it (a step of a few tokens pays for those, not for 8).
 */
#define GEMM8_TILE_FN(fn, KIND)                                                                    \
    VNNI static inline __attribute__((always_inline)) void fn(                                     \
        const int T, const void *group, int64_t n, const void *xa, size_t xa_stride,               \
        const int32_t *asum, int64_t t0, int64_t n_tok, float *y, size_t ldy)                      \
    {                                                                                              \
        const int64_t nb = n / 32;                                                                 \
        const size_t bb = KIND == 0 ? 144 : KIND == 1 ? 160 : 272, ab = KIND == 1 ? 36 : 34;       \
        const int qo = KIND == 2 ? 16 : KIND == 1 ? 32 : 16; /* the quants' offset in a block */   \
        const int aq = KIND == 1 ? 4 : 2;                    /* the activations' */                \
        const __m256i flip = _mm256_set1_epi8((char)0x80);                                         \
        const uint8_t *at[GEMM_TILE];                                                              \
        const int32_t *st[GEMM_TILE];                                                              \
        for (int t = 0; t < T; t++) {                                                              \
            const int64_t tok = t0 + t < n_tok ? t0 + t : n_tok - 1;                               \
            at[t] = (const uint8_t *)xa + (size_t)tok * xa_stride;                                 \
            st[t] = asum != NULL ? asum + tok * nb : NULL;                                         \
        }                                                                                          \
        __m256 acc[GEMM_TILE];                                                                     \
        UNROLL(8)                                                                                  \
        for (int t = 0; t < T; t++)                                                                \
            acc[t] = _mm256_setzero_ps();                                                          \
        const uint8_t *w = group;                                                                  \
        for (int64_t b = 0; b < nb; b++, w += bb) {                                                \
            for (size_t l = 0; l < bb; l += 64)                                                    \
                _mm_prefetch((const char *)w + GEMM_PREFETCH + l, _MM_HINT_T0);                    \
            __m256i x[8], c[8];                                                                    \
            if (KIND == 2) {                                                                       \
                UNROLL(8)                                                                          \
                for (int r = 0; r < 8; r++)                                                        \
                    x[r] = _mm256_xor_si256(                                                       \
                        _mm256_loadu_si256((const __m256i *)(w + qo + 32 * r)), flip);             \
                transpose8(x, c);                                                                  \
            } else {                                                                               \
                Q4_UNITS(w + qo, x);                                                               \
                UNROLL(8)                                                                          \
                for (int k = 0; k < 8; k++)                                                        \
                    c[k] = x[k];                                                                   \
                /* kept in registers for a full tile (GCC otherwise reloads                        \
                 * and unpacks them per token: 130 GMAC/s against 170) */                          \
                UNROLL(8)                                                                          \
                for (int k = 0; k < 8 && T == GEMM_TILE; k++)                                      \
                    __asm__("" : "+v"(c[k]));                                                      \
            }                                                                                      \
            const __m256 d8 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)w));                \
            const __m256 m8 = KIND == 1                                                            \
                                  ? _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(w + 16)))    \
                                  : _mm256_setzero_ps();                                           \
            UNROLL(8)                                                                              \
            for (int t = 0; t < T; t++) {                                                          \
                const uint8_t *a = at[t] + (size_t)b * ab;                                         \
                __m256i s = KIND == 1 ? _mm256_setzero_si256()                                     \
                                      : _mm256_set1_epi32((KIND == 0 ? -8 : -128) * st[t][b]);     \
                UNROLL(8)                                                                          \
                for (int k = 0; k < 8; k++)                                                        \
                    s = _mm256_dpbusd_epi32(s, c[k],                                               \
                                            _mm256_set1_epi32((int)u32_at(a + aq + 4 * k)));       \
                acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s),                                    \
                                         _mm256_mul_ps(d8, _mm256_set1_ps(half_at(a))), acc[t]);   \
                if (KIND == 1)                                                                     \
                    acc[t] = _mm256_fmadd_ps(m8, _mm256_set1_ps(half_at(a + 2)), acc[t]);          \
            }                                                                                      \
        }                                                                                          \
        for (int t = 0; t < T && t0 + t < n_tok; t++)                                              \
            _mm256_storeu_ps(y + (size_t)(t0 + t) * ldy, acc[t]);                                  \
    }

#define GEMM8_FN(fn, KIND)                                                                         \
    GEMM8_TILE_FN(fn##_tile, KIND)                                                                 \
    VNNI void fn(const void *group, int64_t n, const void *xa, size_t xa_stride,                   \
                 const int32_t *asum, int64_t n_tok, float *y, size_t ldy)                         \
    {                                                                                              \
        int64_t t0 = 0;                                                                            \
        for (; n_tok - t0 > 4; t0 += GEMM_TILE)                                                    \
            fn##_tile(GEMM_TILE, group, n, xa, xa_stride, asum, t0, n_tok, y, ldy);               \
        const int64_t left = n_tok - t0;                                                           \
        if (left > 2)                                                                              \
            fn##_tile(4, group, n, xa, xa_stride, asum, t0, n_tok, y, ldy);                       \
        else if (left == 2)                                                                        \
            fn##_tile(2, group, n, xa, xa_stride, asum, t0, n_tok, y, ldy);                       \
        else if (left == 1)                                                                        \
            fn##_tile(1, group, n, xa, xa_stride, asum, t0, n_tok, y, ldy);                       \
    }

GEMM8_FN(si__vnni_gemm8_q4_0, 0)
GEMM8_FN(si__vnni_gemm8_q4_1, 1)
GEMM8_FN(si__vnni_gemm8_q8_0, 2)

/*
 * dot_act of 8 rows at any addresses (si__dot_act8p_fn): each row's sum in
 * dot_act's lanes and order, the activation block (and for Q4_0 its -8
 * sum(a) per lane: PREP) loaded once for the 8 rows; SIZE the block's
 * bytes, ROW_DOT(DOTU, w) the 8 int32 lanes of the block at w dotted with y.
 */
#define ROWS8_FN(fn, SIZE, PREP, ROW_DOT, DOTU, ATTR)                                             \
    ATTR void fn(const void *const rows[8], const void *xa, int64_t n, float out[8],               \
                 const void *const ahead[8])                                                       \
    {                                                                                              \
        const uint8_t *a = xa;                                                                     \
        __m256 acc[8];                                                                             \
        UNROLL(8)                                                                                  \
        for (int r = 0; r < 8; r++)                                                                \
            acc[r] = _mm256_setzero_ps();                                                          \
        for (int64_t i = 0, o = 0; i < n; i += 32, o += (SIZE), a += 34) {                         \
            const __m256i y = _mm256_loadu_si256((const __m256i *)(a + 2));                        \
            PREP(DOTU);                                                                            \
            const float da = half_at(a);                                                           \
            UNROLL(8)                                                                              \
            for (int r = 0; r < 8; r++) {                                                          \
                const uint8_t *w = (const uint8_t *)rows[r] + o;                                   \
                if (ahead != NULL && ahead[r] != NULL)                                             \
                    _mm_prefetch((const char *)ahead[r] + o, _MM_HINT_T0);                        \
                acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(half_at(w) * da),                          \
                                         _mm256_cvtepi32_ps(ROW_DOT(DOTU, w)), acc[r]);            \
            }                                                                                      \
        }                                                                                          \
        UNROLL(8)                                                                                  \
        for (int r = 0; r < 8; r++)                                                                \
            out[r] = hsum(acc[r]);                                                                 \
    }

/* Q4_0: -8 sum(a) per lane once per block, then each row's unsigned quants
 * (its 16 bytes as 32 nibbles in element order) from that start. */
#define Q4_0_PREP(DOTU)                                                                            \
    const __m256i n8 = _mm256_sub_epi32(                                                           \
        _mm256_setzero_si256(),                                                                    \
        _mm256_slli_epi32(DOTU(_mm256_setzero_si256(), _mm256_set1_epi8(1), y), 3))
#define Q4_0_ROW_DOT(DOTU, w)                                                                      \
    DOTU(n8,                                                                                       \
         _mm256_and_si256(                                                                         \
             _mm256_inserti128_si256(                                                              \
                 _mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)((w) + 2))),              \
                 _mm_srli_epi16(_mm_loadu_si128((const __m128i *)((w) + 2)), 4), 1),               \
             _mm256_set1_epi8(0xf)),                                                               \
         y)
/* Q8_0: signed times signed, as dot_act: |x| times y with x's sign. */
#define Q8_0_PREP(DOTU) (void)0
#define Q8_0_ROW_DOT(DOTU, w)                                                                      \
    DOTU(_mm256_setzero_si256(),                                                                   \
         _mm256_sign_epi8(_mm256_loadu_si256((const __m256i *)((w) + 2)),                         \
                          _mm256_loadu_si256((const __m256i *)((w) + 2))),                        \
         _mm256_sign_epi8(y, _mm256_loadu_si256((const __m256i *)((w) + 2))))

ROWS8_FN(si__avx2_dot_act8p_q4_0, 18, Q4_0_PREP, Q4_0_ROW_DOT, dotu_avx2, )
ROWS8_FN(si__avx2_dot_act8p_q8_0, 34, Q8_0_PREP, Q8_0_ROW_DOT, dotu_avx2, )
ROWS8_FN(si__vnni_dot_act8p_q4_0, 18, Q4_0_PREP, Q4_0_ROW_DOT, dotu_vnni, VNNI)
ROWS8_FN(si__vnni_dot_act8p_q8_0, 34, Q8_0_PREP, Q8_0_ROW_DOT, dotu_vnni, VNNI)


Q4_0_DOT8_FN(si__avx2_dot_act8_q4_0, dotu_avx2, )
Q4_1_DOT8_FN(si__avx2_dot_act8_q4_1, dotu_avx2, )
Q4_1_DOT8_FN(si__vnni_dot_act8_q4_1, dotu_vnni, VNNI)
Q8_0_DOT8_FN(si__avx2_dot_act8_q8_0, dotu_avx2, )
Q4_0_DOT8_FN(si__vnni_dot_act8_q4_0, dotu_vnni, VNNI)
Q8_0_DOT8_FN(si__vnni_dot_act8_q8_0, dotu_vnni, VNNI)
/* The same, prefetching across to the next group's range (si__dot_act8_next_fn). */
Q4_0_DOT8_FN_PF(si__avx2_dot_act8_next_q4_0, dotu_avx2, , PF_NEXT_ARG, PF_NEXT)
Q8_0_DOT8_FN_PF(si__avx2_dot_act8_next_q8_0, dotu_avx2, , PF_NEXT_ARG, PF_NEXT)
Q4_0_DOT8_FN_PF(si__vnni_dot_act8_next_q4_0, dotu_vnni, VNNI, PF_NEXT_ARG, PF_NEXT)
Q8_0_DOT8_FN_PF(si__vnni_dot_act8_next_q8_0, dotu_vnni, VNNI, PF_NEXT_ARG, PF_NEXT)

#endif
