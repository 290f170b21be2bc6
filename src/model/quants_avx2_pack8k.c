/*
 * quants_avx2_pack8k.c - the AVX2 kernels of the K types (Q4_K, Q6_K) on
 * groups of 8 rows packed by si_pack8 (model/pack8.h): each row's result
 * equal, bit for bit, to the AVX2 table's dot_act of that row
 * (quants_avx2_act.c).
 *
 * The packed super-block puts 4 consecutive values of the 8 rows in one
 * 32-byte load, a 4-byte lane per row, so a row's integer products stay in
 * its lane: maddubs with 4 activation bytes broadcast, then madd with the
 * row's sub-block scale (int16, twice in the lane) gives row r's scaled sum
 * of those 4 values in lane r.  The integer sums of a super-block are exact
 * whatever their order; what must match dot_act is the float arithmetic
 * after them, which these kernels do lane by lane with the same operations:
 *   Q4_K: acc = fma(isum, d * d_a, acc) and accm = fma(msum, dmin * d_a,
 *         accm) per super-block, row = acc - accm (dot_act's scalar chain,
 *         here 8 rows in the 8 lanes);
 *   Q6_K: dot_act keeps 8 float lanes per row (lane m: values 4m .. 4m+3 of
 *         every 32), so these keep 8 vectors, vector m lane r being row r's
 *         lane m, and add them at the end in hsum's order.
 * One sequential stream, prefetched PREFETCH bytes ahead, as the other
 * packed kernels (quants_avx2_pack8.c).
 *
 * Pure kernels; quants_avx2.c (decode, dequantize8) and quants_avx2_act.c
 * (the VNNI batched ones) list them in their tables.
 */
#include "model/quants_impl.h"

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)

#include "model/pack8.h"
#include "model/quants_avx2.h"

#include <immintrin.h>
#include <stdbool.h>

#define UNROLL_(n) _Pragma(#n)
#define UNROLL(n)  UNROLL_(GCC unroll n)

/* As the other packed kernels (docs/measurements.md, "Packed rows"). */
#define PREFETCH 2048

INLINE int32_t i32_at(const uint8_t *p)
{
    int32_t v;
    memcpy(&v, p, sizeof v);
    return v;
}

/* pshufb control: lane r's bytes j0 and j1 (of its 4) as two int16. */
INLINE __m256i lane_bytes16(int j0, int j1)
{
    const __m256i at = _mm256_setr_epi32(0, 0x00040004, 0x00080008, 0x000c000c, 0, 0x00040004,
                                         0x00080008, 0x000c000c);
    return _mm256_add_epi32(
        at, _mm256_set1_epi32((int)(0x80008000u | (uint32_t)j1 << 16 | (uint32_t)j0)));
}

/*
 * k_scales_mins (quants_avx2_act.c) in every lane of a packed Q4_K / Q5_K
 * super-block at w: lane r's bytes are row r's scales 0-3 (sc[0]), 4-7
 * (sc[1]), mins 0-3 (mn[0]), 4-7 (mn[1]).
 */
INLINE void k8_scales_mins(const uint8_t *w, __m256i sc[2], __m256i mn[2])
{
    const __m256i low = _mm256_set1_epi8(0xf), m3f = _mm256_set1_epi8(0x3f),
                  m03 = _mm256_set1_epi8(0x03);
    const __m256i u0 = _mm256_loadu_si256((const __m256i *)(w + 32));
    const __m256i u1 = _mm256_loadu_si256((const __m256i *)(w + 64));
    const __m256i u2 = _mm256_loadu_si256((const __m256i *)(w + 96));
    sc[0] = _mm256_and_si256(u0, m3f);
    sc[1] = _mm256_or_si256(_mm256_and_si256(u2, low),
                            _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(u0, 6), m03), 4));
    mn[0] = _mm256_and_si256(u1, m3f);
    mn[1] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(u2, 4), low),
                            _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(u1, 6), m03), 4));
}

/* Lane r: row r's sum_j min_j * (sum of sub-block j's activations), pairs
 * of sub-blocks per madd, the pair sums from the Q8_K block's 16 bsums (at
 * a + 260) as dot_act forms them. */
INLINE __m256i k8_min_sums(const __m256i mn[2], const uint8_t *a)
{
    const __m128i bs = _mm_hadd_epi16(_mm_loadu_si128((const __m128i *)(a + 260)),
                                      _mm_loadu_si128((const __m128i *)(a + 276)));
    int32_t pairs[4];
    _mm_storeu_si128((__m128i *)pairs, bs);
    __m256i msum = _mm256_setzero_si256();
    UNROLL(4)
    for (int p = 0; p < 4; p++)
        msum = _mm256_add_epi32(
            msum, _mm256_madd_epi16(
                      _mm256_shuffle_epi8(mn[p / 2], lane_bytes16(2 * (p % 2), 2 * (p % 2) + 1)),
                      _mm256_set1_epi32(pairs[p])));
    return msum;
}

/*
 * Q4_K.  Packed super-block: d[8], dmin[8], the scale bytes 0-3, 4-7, 8-11
 * of the 8 rows (32 bytes each), then unit u = 8c + k of the quants at 128
 * + 32u: bytes 4k .. 4k+3 of chunk c (values 64c + 4k .. of sub-block 2c
 * in the low nibbles, of sub-block 2c + 1 in the high ones).
 */
void si__avx2_dot_act8_q4_k(const void *group, const void *xa, int64_t n, float out[8])
{
    const uint8_t *w = group, *a = xa;
    const __m256i low = _mm256_set1_epi8(0xf);
    __m256 acc = _mm256_setzero_ps(), accm = _mm256_setzero_ps();
    for (int64_t i = 0; i < n; i += 256, w += 8 * 144, a += 292) {
        for (int l = 0; l < 8 * 144; l += 64)
            _mm_prefetch((const char *)w + PREFETCH + l, _MM_HINT_T0);
        const __m256 da = _mm256_set1_ps(f32_at(a));
        const __m256 dd = _mm256_mul_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)w)), da);
        const __m256 dm =
            _mm256_mul_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(w + 16))), da);
        __m256i sc[2], mn[2];
        k8_scales_mins(w, sc, mn);
        const __m256i msum = k8_min_sums(mn, a);
        /* isum: per chunk, the two sub-blocks' products summed in int16
         * (8 units of at most 2 * 15 * 128 each: within 30720), then times
         * the rows' scales into int32 */
        const uint8_t *q = w + 128, *qa = a + 4;
        __m256i isum = _mm256_setzero_si256();
        UNROLL(4)
        for (int c = 0; c < 4; c++) {
            __m256i slo = _mm256_setzero_si256(), shi = _mm256_setzero_si256();
            UNROLL(8)
            for (int k = 0; k < 8; k++) {
                const __m256i v = _mm256_loadu_si256((const __m256i *)(q + 256 * c + 32 * k));
                const __m256i ylo = _mm256_set1_epi32(i32_at(qa + 64 * c + 4 * k));
                const __m256i yhi = _mm256_set1_epi32(i32_at(qa + 64 * c + 32 + 4 * k));
                slo = _mm256_add_epi16(slo, _mm256_maddubs_epi16(_mm256_and_si256(v, low), ylo));
                shi = _mm256_add_epi16(
                    shi, _mm256_maddubs_epi16(_mm256_and_si256(_mm256_srli_epi16(v, 4), low), yhi));
            }
            const int j = 2 * c; /* sub-blocks j (low nibbles) and j + 1 */
            const __m256i s0 = _mm256_shuffle_epi8(sc[j / 4], lane_bytes16(j % 4, j % 4));
            const __m256i s1 = _mm256_shuffle_epi8(sc[j / 4], lane_bytes16(j % 4 + 1, j % 4 + 1));
            isum = _mm256_add_epi32(
                isum, _mm256_add_epi32(_mm256_madd_epi16(slo, s0), _mm256_madd_epi16(shi, s1)));
        }
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), dd, acc);
        accm = _mm256_fmadd_ps(_mm256_cvtepi32_ps(msum), dm, accm);
    }
    _mm256_storeu_ps(out, _mm256_sub_ps(acc, accm));
}

/* The scale (or min) j of each row of a Q4_K / Q5_K packed super-block as
 * an int16 twice in its lane, from k_scales_mins' vectors sc (or mn). */
INLINE __m256i row_scale16(const __m256i v[2], int j)
{
    return _mm256_shuffle_epi8(v[j / 4], lane_bytes16(j % 4, j % 4));
}

/*
 * Q5_K.  Packed super-block: as Q4_K's, with the qh units (8 of 4 bytes)
 * at 128 before the quant units at 384.  dot_act keeps 8 float lanes (lane
 * m: values 4m .. 4m+3 of every 32) and a float sum of the mins' terms, so
 * these keep 8 vectors, vector m lane r being row r's lane m, and one for
 * the mins, added at the end in dot_act's order.  The 5th bit of value
 * 64c + l is bit 2c of qh[l], of value 64c + 32 + l bit 2c + 1.
 */
void si__avx2_dot_act8_q5_k(const void *group, const void *xa, int64_t n, float out[8])
{
    const uint8_t *w = group, *a = xa;
    const __m256i low = _mm256_set1_epi8(0xf), bit4 = _mm256_set1_epi8(0x10);
    __m256 acc[8], summs = _mm256_setzero_ps();
    UNROLL(8)
    for (int m = 0; m < 8; m++)
        acc[m] = _mm256_setzero_ps();
    for (int64_t i = 0; i < n; i += 256, w += 8 * 176, a += 292) {
        for (int l = 0; l < 8 * 176; l += 64)
            _mm_prefetch((const char *)w + PREFETCH + l, _MM_HINT_T0);
        const float da = f32_at(a);
        const __m256 dd =
            _mm256_mul_ps(_mm256_set1_ps(da), _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)w)));
        const __m256 dm = _mm256_mul_ps(
            _mm256_set1_ps(-da), _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(w + 16))));
        __m256i sc[2], mn[2];
        k8_scales_mins(w, sc, mn);
        const __m256i msum = k8_min_sums(mn, a);
        /* dot_act: summs = fma(-d_a * dmin, msum, summs) */
        summs = _mm256_fmadd_ps(dm, _mm256_cvtepi32_ps(msum), summs);
        __m256i scp[8];
        UNROLL(8)
        for (int j = 0; j < 8; j++)
            scp[j] = row_scale16(sc, j);
        const uint8_t *qa = a + 4;
        UNROLL(8)
        for (int m = 0; m < 8; m++) {
            const __m256i qh = _mm256_loadu_si256((const __m256i *)(w + 128 + 32 * m));
            __m256i sumi = _mm256_setzero_si256();
            UNROLL(4)
            for (int c = 0; c < 4; c++) {
                const __m256i v = _mm256_loadu_si256((const __m256i *)(w + 384 + 32 * (8 * c + m)));
                const __m256i hb = _mm256_srli_epi16(qh, 2 * c);
                const __m256i lo = _mm256_or_si256(
                    _mm256_and_si256(v, low), _mm256_and_si256(_mm256_slli_epi16(hb, 4), bit4));
                const __m256i hi =
                    _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(v, 4), low),
                                    _mm256_and_si256(_mm256_slli_epi16(hb, 3), bit4));
                const __m256i ylo = _mm256_set1_epi32(i32_at(qa + 64 * c + 4 * m));
                const __m256i yhi = _mm256_set1_epi32(i32_at(qa + 64 * c + 32 + 4 * m));
                sumi = _mm256_add_epi32(
                    sumi, _mm256_add_epi32(
                              _mm256_madd_epi16(_mm256_maddubs_epi16(lo, ylo), scp[2 * c]),
                              _mm256_madd_epi16(_mm256_maddubs_epi16(hi, yhi), scp[2 * c + 1])));
            }
            acc[m] = _mm256_fmadd_ps(dd, _mm256_cvtepi32_ps(sumi), acc[m]);
        }
    }
    __m256 t[4];
    UNROLL(4)
    for (int m = 0; m < 4; m++)
        t[m] = _mm256_add_ps(acc[m], acc[m + 4]);
    _mm256_storeu_ps(
        out,
        _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(t[0], t[2]), _mm256_add_ps(t[1], t[3])), summs));
}

/*
 * Q6_K.  Packed super-block: d[8], scale s of row r at 16 + 8s + r, ql
 * unit u at 144 + 32u, qh unit u at 1168 + 32u.  For half h and lane m
 * the ql units 16h + m and 16h + 8 + m and the qh unit 8h + m give the
 * values 128h + 32k + 4m .. +3 (k = 0 .. 3) of the 8 rows, as dot_act
 * forms its q[k] from ql0, ql1 and qh: q6_k8_values.
 */
INLINE void q6_k8_values(const uint8_t *w, int h, int m, __m256i q[4])
{
    q6_k_values(_mm256_loadu_si256((const __m256i *)(w + 144 + 32 * (16 * h + m))),
                _mm256_loadu_si256((const __m256i *)(w + 144 + 32 * (16 * h + 8 + m))),
                _mm256_loadu_si256((const __m256i *)(w + 1168 + 32 * (8 * h + m))), q);
}

/* Lane r: row r's scales 2m and 2m + 1 of the packed Q6_K super-block at w,
 * as two int16 (madd'ed with the bsums of those two 16-value groups). */
INLINE __m256i q6_k8_scale_pair(const uint8_t *w, int m)
{
    return _mm256_cvtepi8_epi16(
        _mm_unpacklo_epi8(_mm_loadl_epi64((const __m128i *)(w + 16 + 16 * m)),
                          _mm_loadl_epi64((const __m128i *)(w + 24 + 16 * m))));
}

void si__avx2_dot_act8_q6_k(const void *group, const void *xa, int64_t n, float out[8])
{
    const uint8_t *w = group, *a = xa;
    __m256 acc[8];
    UNROLL(8)
    for (int m = 0; m < 8; m++)
        acc[m] = _mm256_setzero_ps();
    for (int64_t i = 0; i < n; i += 256, w += 8 * 210, a += 292) {
        for (int l = 0; l < 8 * 210; l += 64)
            _mm_prefetch((const char *)w + PREFETCH + l, _MM_HINT_T0);
        const __m256 dd = _mm256_mul_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)w)),
                                        _mm256_set1_ps(f32_at(a)));
        /* scale s of each row as an int16 twice in its lane */
        __m256i scp[16];
        UNROLL(16)
        for (int s = 0; s < 16; s++) {
            const __m256i v =
                _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(w + 16 + 8 * s)));
            scp[s] = _mm256_or_si256(_mm256_and_si256(v, _mm256_set1_epi32(0xffff)),
                                     _mm256_slli_epi32(v, 16));
        }
        const uint8_t *qa = a + 4;
        UNROLL(8)
        for (int m = 0; m < 8; m++) {
            /* the offset 32 of the stored values, as dot_act takes it off
             * lane m: 32 * (bsum_2m * sc_2m + bsum_2m+1 * sc_2m+1) */
            const __m256i pair = q6_k8_scale_pair(w, m);
            __m256i sumi = _mm256_sub_epi32(
                _mm256_setzero_si256(),
                _mm256_slli_epi32(
                    _mm256_madd_epi16(pair, _mm256_set1_epi32(i32_at(a + 260 + 4 * m))), 5));
            UNROLL(2)
            for (int h = 0; h < 2; h++) {
                __m256i q[4];
                q6_k8_values(w, h, m, q);
                UNROLL(4)
                for (int k = 0; k < 4; k++) {
                    const __m256i y = _mm256_set1_epi32(i32_at(qa + 128 * h + 32 * k + 4 * m));
                    sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(scp[8 * h + 2 * k + (m >= 4)],
                                                                    _mm256_maddubs_epi16(q[k], y)));
                }
            }
            acc[m] = _mm256_fmadd_ps(dd, _mm256_cvtepi32_ps(sumi), acc[m]);
        }
    }
    /* hsum's order: (m + m+4), then (0 + 2) and (1 + 3), then their sum */
    __m256 t[4];
    UNROLL(4)
    for (int m = 0; m < 4; m++)
        t[m] = _mm256_add_ps(acc[m], acc[m + 4]);
    _mm256_storeu_ps(out, _mm256_add_ps(_mm256_add_ps(t[0], t[2]), _mm256_add_ps(t[1], t[3])));
}

/*
 * The batched products (si__gemm8_fn) of the K types, AVX-512 VNNI on
 * 256-bit registers (32 of them): the weights' unpacking (nibbles, 2-bit
 * fields, scales) paid once per super-block for a tile of tokens, then per
 * token one dpbusd per 4 values of the 8 rows, the sums of each sub-block
 * scaled by the rows' scales (mullo) into one exact int32 sum per row.  The
 * float part is dot_act8's: Q4_K's results are dot_act's bit for bit; Q6_K's
 * one float sum per row instead of 8 lanes changes the order of the float
 * additions (within si_gemm8's contract).  Tokens past n_tok in the last
 * tile repeat the last one and are not stored.
 */
#define VNNI __attribute__((target("avx2,fma,f16c,avx512f,avx512vl,avx512vnni")))

/* pshufb control: lane r's byte j (of its 4) as an int32. */
VNNI static inline __m256i lane_byte32(int j)
{
    const __m256i at = _mm256_setr_epi32(0, 4, 8, 12, 0, 4, 8, 12);
    return _mm256_add_epi32(at, _mm256_set1_epi32((int)(0x80808000u | (uint32_t)j)));
}

enum { Q4K_TILE = 8, Q6K_TILE = 4 };

/* Q4_K, or Q5_K where `five` (its qh units before the quants, and its
 * float steps: acc + fma(-d_a * dmin, msum, summs)). */
VNNI static inline __attribute__((always_inline)) void gemm8_k_tile(
    bool five, const int T, const void *group, int64_t n, const void *xa, size_t xa_stride,
    int64_t t0, int64_t n_tok, float *y, size_t ldy)
{
    const size_t bb = five ? 8 * 176 : 8 * 144;
    const __m256i bit4 = _mm256_set1_epi8(0x10);
    const __m256i low = _mm256_set1_epi8(0xf);
    {
        const uint8_t *at[Q4K_TILE];
        for (int t = 0; t < T; t++)
            at[t] = (const uint8_t *)xa + (size_t)(t0 + t < n_tok ? t0 + t : n_tok - 1) * xa_stride;
        __m256 acc[Q4K_TILE], accm[Q4K_TILE];
        UNROLL(8)
        for (int t = 0; t < T; t++)
            acc[t] = accm[t] = _mm256_setzero_ps();
        const uint8_t *w = group;
        for (int64_t o = 0; o < n / 256 * 292; o += 292, w += bb) {
            for (size_t l = 0; l < bb; l += 64)
                _mm_prefetch((const char *)w + GEMM_PREFETCH + l, _MM_HINT_T0);
            const __m256 d8 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)w));
            const __m256 m8 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(w + 16)));
            __m256i sc[2], mn[2];
            k8_scales_mins(w, sc, mn);
            __m256i isum[Q4K_TILE];
            UNROLL(8)
            for (int t = 0; t < T; t++)
                isum[t] = _mm256_setzero_si256();
            const uint8_t *q = w + (five ? 384 : 128);
            for (int c = 0; c < 4; c++) {
                __m256i slo[Q4K_TILE], shi[Q4K_TILE];
                UNROLL(8)
                for (int t = 0; t < T; t++)
                    slo[t] = shi[t] = _mm256_setzero_si256();
                UNROLL(8)
                for (int k = 0; k < 8; k++) {
                    const __m256i v = _mm256_loadu_si256((const __m256i *)(q + 256 * c + 32 * k));
                    __m256i lo = _mm256_and_si256(v, low);
                    __m256i hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), low);
                    if (five) { /* qh unit k, bits 2c and 2c + 1 */
                        const __m256i hb = _mm256_srli_epi16(
                            _mm256_loadu_si256((const __m256i *)(w + 128 + 32 * k)), 2 * c);
                        lo = _mm256_or_si256(lo, _mm256_and_si256(_mm256_slli_epi16(hb, 4), bit4));
                        hi = _mm256_or_si256(hi, _mm256_and_si256(_mm256_slli_epi16(hb, 3), bit4));
                    }
                    UNROLL(8)
                    for (int t = 0; t < T; t++) {
                        const uint8_t *qa = at[t] + o + 4 + 64 * c + 4 * k;
                        slo[t] = _mm256_dpbusd_epi32(slo[t], lo, _mm256_set1_epi32(i32_at(qa)));
                        shi[t] =
                            _mm256_dpbusd_epi32(shi[t], hi, _mm256_set1_epi32(i32_at(qa + 32)));
                    }
                }
                const int j = 2 * c;
                const __m256i s0 = _mm256_shuffle_epi8(sc[j / 4], lane_byte32(j % 4));
                const __m256i s1 = _mm256_shuffle_epi8(sc[j / 4], lane_byte32(j % 4 + 1));
                UNROLL(8)
                for (int t = 0; t < T; t++)
                    isum[t] =
                        _mm256_add_epi32(isum[t], _mm256_add_epi32(_mm256_mullo_epi32(slo[t], s0),
                                                                   _mm256_mullo_epi32(shi[t], s1)));
            }
            UNROLL(8)
            for (int t = 0; t < T; t++) {
                const uint8_t *a = at[t] + o;
                const __m256i msum = k8_min_sums(mn, a);
                const __m256 da = _mm256_set1_ps(f32_at(a));
                acc[t] =
                    _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[t]), _mm256_mul_ps(d8, da), acc[t]);
                if (five)
                    accm[t] = _mm256_fmadd_ps(_mm256_mul_ps(_mm256_set1_ps(-f32_at(a)), m8),
                                              _mm256_cvtepi32_ps(msum), accm[t]);
                else
                    accm[t] =
                        _mm256_fmadd_ps(_mm256_cvtepi32_ps(msum), _mm256_mul_ps(m8, da), accm[t]);
            }
        }
        for (int t = 0; t < T && t0 + t < n_tok; t++)
            _mm256_storeu_ps(y + (size_t)(t0 + t) * ldy, five ? _mm256_add_ps(acc[t], accm[t])
                                                              : _mm256_sub_ps(acc[t], accm[t]));
    }
}

/* Full tiles of Q4K_TILE tokens, the rest in the smallest tile that holds
 * it (a token's bits are the same in any tile). */
VNNI static inline __attribute__((always_inline)) void gemm8_k(bool five, const void *group,
                                                               int64_t n, const void *xa,
                                                               size_t xa_stride, int64_t n_tok,
                                                               float *y, size_t ldy)
{
    int64_t t0 = 0;
    for (; n_tok - t0 > 4; t0 += Q4K_TILE)
        gemm8_k_tile(five, Q4K_TILE, group, n, xa, xa_stride, t0, n_tok, y, ldy);
    const int64_t left = n_tok - t0;
    if (left > 2)
        gemm8_k_tile(five, 4, group, n, xa, xa_stride, t0, n_tok, y, ldy);
    else if (left == 2)
        gemm8_k_tile(five, 2, group, n, xa, xa_stride, t0, n_tok, y, ldy);
    else if (left == 1)
        gemm8_k_tile(five, 1, group, n, xa, xa_stride, t0, n_tok, y, ldy);
}

VNNI void si__vnni_gemm8_q4_k(const void *group, int64_t n, const void *xa, size_t xa_stride,
                              const int32_t *asum, int64_t n_tok, float *y, size_t ldy)
{
    (void)asum;
    gemm8_k(false, group, n, xa, xa_stride, n_tok, y, ldy);
}

VNNI void si__vnni_gemm8_q5_k(const void *group, int64_t n, const void *xa, size_t xa_stride,
                              const int32_t *asum, int64_t n_tok, float *y, size_t ldy)
{
    (void)asum;
    gemm8_k(true, group, n, xa, xa_stride, n_tok, y, ldy);
}

VNNI static inline __attribute__((always_inline)) void gemm8_q6_k_tile(
    const int T, const void *group, int64_t n, const void *xa, size_t xa_stride, int64_t t0,
    int64_t n_tok, float *y, size_t ldy)
{
    {
        const uint8_t *at[Q6K_TILE];
        for (int t = 0; t < T; t++)
            at[t] = (const uint8_t *)xa + (size_t)(t0 + t < n_tok ? t0 + t : n_tok - 1) * xa_stride;
        __m256 acc[Q6K_TILE];
        UNROLL(4)
        for (int t = 0; t < T; t++)
            acc[t] = _mm256_setzero_ps();
        const uint8_t *w = group;
        for (int64_t o = 0; o < n / 256 * 292; o += 292, w += 8 * 210) {
            for (int l = 0; l < 8 * 210; l += 64)
                _mm_prefetch((const char *)w + GEMM_PREFETCH + l, _MM_HINT_T0);
            const __m256 d8 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)w));
            __m256i isum[Q6K_TILE];
            /* the offset 32 of the stored values: -32 sum_s sc_s * bsum_s */
            UNROLL(4)
            for (int t = 0; t < T; t++)
                isum[t] = _mm256_setzero_si256();
            UNROLL(8)
            for (int m = 0; m < 8; m++) {
                const __m256i pair = q6_k8_scale_pair(w, m);
                UNROLL(4)
                for (int t = 0; t < T; t++)
                    isum[t] = _mm256_add_epi32(
                        isum[t], _mm256_madd_epi16(
                                     pair, _mm256_set1_epi32(i32_at(at[t] + o + 260 + 4 * m))));
            }
            UNROLL(4)
            for (int t = 0; t < T; t++)
                isum[t] = _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_slli_epi32(isum[t], 5));
            for (int h = 0; h < 2; h++)
                for (int half = 0; half < 2; half++) { /* lanes m 0-3, then 4-7: one scale per k */
                    __m256i s[Q6K_TILE][4];
                    UNROLL(4)
                    for (int t = 0; t < T; t++)
                        s[t][0] = s[t][1] = s[t][2] = s[t][3] = _mm256_setzero_si256();
                    UNROLL(4)
                    for (int mm = 0; mm < 4; mm++) {
                        const int m = 4 * half + mm;
                        __m256i qv[4];
                        q6_k8_values(w, h, m, qv);
                        UNROLL(4)
                        for (int t = 0; t < T; t++) {
                            const uint8_t *qa = at[t] + o + 4 + 128 * h + 4 * m;
                            UNROLL(4)
                            for (int k = 0; k < 4; k++)
                                s[t][k] = _mm256_dpbusd_epi32(
                                    s[t][k], qv[k], _mm256_set1_epi32(i32_at(qa + 32 * k)));
                        }
                    }
                    UNROLL(4)
                    for (int k = 0; k < 4; k++) {
                        const int si = 8 * h + 2 * k + half;
                        const __m256i sc = _mm256_cvtepi8_epi32(
                            _mm_loadl_epi64((const __m128i *)(w + 16 + 8 * si)));
                        UNROLL(4)
                        for (int t = 0; t < T; t++)
                            isum[t] = _mm256_add_epi32(isum[t], _mm256_mullo_epi32(s[t][k], sc));
                    }
                }
            UNROLL(4)
            for (int t = 0; t < T; t++)
                acc[t] =
                    _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[t]),
                                    _mm256_mul_ps(d8, _mm256_set1_ps(f32_at(at[t] + o))), acc[t]);
        }
        for (int t = 0; t < T && t0 + t < n_tok; t++)
            _mm256_storeu_ps(y + (size_t)(t0 + t) * ldy, acc[t]);
    }
}

VNNI void si__vnni_gemm8_q6_k(const void *group, int64_t n, const void *xa, size_t xa_stride,
                              const int32_t *asum, int64_t n_tok, float *y, size_t ldy)
{
    (void)asum;
    int64_t t0 = 0;
    for (; n_tok - t0 > 2; t0 += Q6K_TILE)
        gemm8_q6_k_tile(Q6K_TILE, group, n, xa, xa_stride, t0, n_tok, y, ldy);
    if (n_tok - t0 == 2)
        gemm8_q6_k_tile(2, group, n, xa, xa_stride, t0, n_tok, y, ldy);
    else if (n_tok - t0 == 1)
        gemm8_q6_k_tile(1, group, n, xa, xa_stride, t0, n_tok, y, ldy);
}

void si__avx2_dequantize8_q4_k(const void *group, int64_t n, float *dst)
{
    si__dequantize8_k(SI_TYPE_Q4_K, si__quants_avx2.type[SI_TYPE_Q4_K].dequantize, group, n, dst);
}

void si__avx2_dequantize8_q5_k(const void *group, int64_t n, float *dst)
{
    si__dequantize8_k(SI_TYPE_Q5_K, si__quants_avx2.type[SI_TYPE_Q5_K].dequantize, group, n, dst);
}

void si__avx2_dequantize8_q6_k(const void *group, int64_t n, float *dst)
{
    si__dequantize8_k(SI_TYPE_Q6_K, si__quants_avx2.type[SI_TYPE_Q6_K].dequantize, group, n, dst);
}

#endif
