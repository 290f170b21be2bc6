/*
 * quants_avx2_attn.c - the AVX2+FMA+F16C twin of si__k_attn_tiles_portable
 * (model/attn_tiles.c): tiled attention for many queries at once.
 *
 * Per tile and kv head, the keys are converted once and transposed into
 * floats (kt[i * T + j]: element i of the tile's position j), and the
 * values converted into floats (vf[j * hd + i]); every query head of every
 * query then reads them from the cache lines they sit in.  Each query head
 * performs the portable code's operations in its order:
 *
 *   scores: 8 positions a lane each, each lane a chain of FMAs over the
 *           head's elements in order, times scale (VMULPS, the product's
 *           NaN priority the portable code's d * scale);
 *   the maximum: the portable code's scalar loop;
 *   p_t = si_act_exp(s_t - M), 8 lanes at a time with the same single
 *           operations (lanes that need its rare wide-range branch take the
 *           scalar function), each group's sum as
 *           ((p4 + p0) + (p6 + p2)) + ((p5 + p1) + (p7 + p3)), groups in double;
 *   values: acc_i = fma(v_t,i, p_t, acc_i), 8 elements of the head a
 *           register, position after position.
 *
 * Built with -mavx2 -mfma -mf16c; without those flags nothing is defined.
 */
#include "model/quants_impl.h"

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)

#include "model/act.h"
#include "model/attn_types.h"
#include "model/quants_avx2.h"
#include "model/types.h"

#include <immintrin.h>
#include <math.h>
#include <string.h>

enum { T = SI_ATTN_TILE };

/* Rows r[0..8) (8 floats each) transposed in place. */
INLINE void transpose8(__m256 r[8])
{
    const __m256 t0 = _mm256_unpacklo_ps(r[0], r[1]), t1 = _mm256_unpackhi_ps(r[0], r[1]);
    const __m256 t2 = _mm256_unpacklo_ps(r[2], r[3]), t3 = _mm256_unpackhi_ps(r[2], r[3]);
    const __m256 t4 = _mm256_unpacklo_ps(r[4], r[5]), t5 = _mm256_unpackhi_ps(r[4], r[5]);
    const __m256 t6 = _mm256_unpacklo_ps(r[6], r[7]), t7 = _mm256_unpackhi_ps(r[6], r[7]);
    const __m256 s0 = _mm256_shuffle_ps(t0, t2, 0x44), s1 = _mm256_shuffle_ps(t0, t2, 0xee);
    const __m256 s2 = _mm256_shuffle_ps(t1, t3, 0x44), s3 = _mm256_shuffle_ps(t1, t3, 0xee);
    const __m256 s4 = _mm256_shuffle_ps(t4, t6, 0x44), s5 = _mm256_shuffle_ps(t4, t6, 0xee);
    const __m256 s6 = _mm256_shuffle_ps(t5, t7, 0x44), s7 = _mm256_shuffle_ps(t5, t7, 0xee);
    r[0] = _mm256_permute2f128_ps(s0, s4, 0x20);
    r[1] = _mm256_permute2f128_ps(s1, s5, 0x20);
    r[2] = _mm256_permute2f128_ps(s2, s6, 0x20);
    r[3] = _mm256_permute2f128_ps(s3, s7, 0x20);
    r[4] = _mm256_permute2f128_ps(s0, s4, 0x31);
    r[5] = _mm256_permute2f128_ps(s1, s5, 0x31);
    r[6] = _mm256_permute2f128_ps(s2, s6, 0x31);
    r[7] = _mm256_permute2f128_ps(s3, s7, 0x31);
}

/* One kv head's side of a cache: its elements of position t at
 * base + t * row, seg bytes of type `type` (dequantize: the table's, for a
 * quantized type). */
struct kv_side {
    const char *base;
    size_t row, seg;
    uint32_t type;
    si__dequantize_fn dequantize;
};

static struct kv_side kv_side(const void *base, size_t row, uint32_t type, int g, int hd)
{
    size_t off = 0, seg = 0;
    si_type_row_size(type, (int64_t)g * hd, &off);
    si_type_row_size(type, hd, &seg);
    return (struct kv_side){(const char *)base + off, row, seg, type,
                            si__quants_avx2.type[type].dequantize};
}

/* Position t's hd elements as floats into dst. */
INLINE void side_row(const struct kv_side *s, int t, int hd, float *dst)
{
    const char *p = s->base + (size_t)t * s->row;
    if (s->type == SI_TYPE_F16) {
        const uint16_t *h = (const uint16_t *)p;
        int i = 0;
        for (; i + 8 <= hd; i += 8)
            _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(h + i))));
        for (; i < hd; i++)
            dst[i] = _cvtsh_ss(h[i]);
    } else {
        s->dequantize(p, dst, hd);
    }
}

/*
 * The tile's positions [a, b) (the tile starting at t0) of one kv head:
 * its keys into kt (transposed; the tile's positions outside [a, b) 0), its
 * values into vf (positions [a, b)), kr 8 rows of scratch.  The next
 * tile's rows (up to next_end) are asked for as this one's are read: a
 * tile's rows are short and strided, which the hardware's prefetchers
 * follow poorly, and the cache streams from DRAM.
 */
static void load_tile(float *kt, float *vf, float *kr, const struct kv_side *ks,
                      const struct kv_side *vs, int hd, int t0, int a, int b, int next_end)
{
    const int a8 = (a - t0) & ~7, b8 = (b - t0 + 7) & ~7;
    if (a8 > 0 || b8 < T) /* the groups no query reads: zeros, as tile_head sums every lane */
        for (int i = 0; i < hd; i++) {
            memset(kt + (size_t)i * T, 0, (size_t)a8 * sizeof *kt);
            memset(kt + (size_t)i * T + b8, 0, (size_t)(T - b8) * sizeof *kt);
        }
    for (int j8 = a8; j8 < b8; j8 += 8) {
        const int p = t0 + j8;
        for (int t = p + T; t < p + T + 8 && t < next_end; t++) {
            for (size_t c = 0; c < ks->seg; c += 64)
                _mm_prefetch(ks->base + (size_t)t * ks->row + c, _MM_HINT_T0);
            for (size_t c = 0; c < vs->seg; c += 64)
                _mm_prefetch(vs->base + (size_t)t * vs->row + c, _MM_HINT_T0);
        }
        const bool whole = p >= a && p + 8 <= b && hd % 8 == 0;
        if (whole && ks->type == SI_TYPE_F16) {
            for (int i = 0; i < hd; i += 8) {
                __m256 r[8];
#pragma GCC unroll 8
                for (int u = 0; u < 8; u++)
                    r[u] = _mm256_cvtph_ps(_mm_loadu_si128(
                        (const __m128i *)(ks->base + (size_t)(p + u) * ks->row + 2 * (size_t)i)));
                transpose8(r);
#pragma GCC unroll 8
                for (int u = 0; u < 8; u++)
                    _mm256_storeu_ps(kt + (size_t)(i + u) * T + j8, r[u]);
            }
        } else if (whole) {
            for (int u = 0; u < 8; u++)
                side_row(ks, p + u, hd, kr + (size_t)u * hd);
            for (int i = 0; i < hd; i += 8) {
                __m256 r[8];
#pragma GCC unroll 8
                for (int u = 0; u < 8; u++)
                    r[u] = _mm256_loadu_ps(kr + (size_t)u * hd + i);
                transpose8(r);
#pragma GCC unroll 8
                for (int u = 0; u < 8; u++)
                    _mm256_storeu_ps(kt + (size_t)(i + u) * T + j8, r[u]);
            }
        } else {
            for (int u = 0; u < 8; u++) {
                const int t = p + u;
                if (t >= a && t < b)
                    side_row(ks, t, hd, kr);
                for (int i = 0; i < hd; i++)
                    kt[(size_t)i * T + j8 + u] = t >= a && t < b ? kr[i] : 0.0f;
            }
        }
    }
    for (int t = a; t < b; t++)
        side_row(vs, t, hd, vf + (size_t)(t - t0) * hd);
}

/* si_act_exp on 8 lanes: the same single operations; lanes whose n passes
 * 126 in magnitude (the function's scaled branch) are redone by it. */
INLINE __m256 exp8(__m256 x)
{
    const __m256 shift = _mm256_set1_ps(0x1.8p23f), log2e = _mm256_set1_ps(0x1.715476p+0f);
    const __m256 ln2_hi = _mm256_set1_ps(0x1.62e4p-1f), ln2_lo = _mm256_set1_ps(0x1.7f7d1cp-20f);
    const __m256 c1 = _mm256_set1_ps(0x1.ffffecp-1f), c2 = _mm256_set1_ps(0x1.fffdb6p-2f),
                 c3 = _mm256_set1_ps(0x1.555e66p-3f), c4 = _mm256_set1_ps(0x1.573e2ep-5f),
                 c5 = _mm256_set1_ps(0x1.0e4020p-7f);
    const __m256 z = _mm256_fmadd_ps(x, log2e, shift);
    const __m256 n = _mm256_sub_ps(z, shift);
    const __m256 r = _mm256_fnmadd_ps(n, ln2_lo, _mm256_fnmadd_ps(n, ln2_hi, x));
    const __m256i e = _mm256_slli_epi32(_mm256_castps_si256(z), 23);
    const __m256 r2 = _mm256_mul_ps(r, r);
    const __m256 p =
        _mm256_fmadd_ps(_mm256_fmadd_ps(_mm256_fmadd_ps(c5, r, c4), r2, _mm256_fmadd_ps(c3, r, c2)),
                        r2, _mm256_mul_ps(c1, r));
    const __m256 kk = _mm256_castsi256_ps(_mm256_add_epi32(e, _mm256_set1_epi32(0x3f800000)));
    __m256 y = _mm256_fmadd_ps(kk, p, kk);
    const __m256 absn = _mm256_andnot_ps(_mm256_set1_ps(-0.0f), n);
    const int wide = _mm256_movemask_ps(_mm256_cmp_ps(absn, _mm256_set1_ps(126.0f), _CMP_GT_OQ));
    if (wide != 0) {
        float xs[8], ys[8];
        _mm256_storeu_ps(xs, x);
        _mm256_storeu_ps(ys, y);
        for (int u = 0; u < 8; u++)
            if (wide >> u & 1)
                ys[u] = si_act_exp(xs[u]);
        y = _mm256_loadu_ps(ys);
    }
    return y;
}

/* si_act_exp_sum8 over the 8-position groups [g0, g1) of sc (the others,
 * all -inf, would add e^-inf = 0 to the sum and are left as they are). */
INLINE double exp_sum8(float *sc, int g0, int g1, float m)
{
    const __m256 vm = _mm256_set1_ps(m);
    double sum = 0.0;
    for (int g = g0; g < g1; g++) {
        const __m256 p = exp8(_mm256_sub_ps(_mm256_loadu_ps(sc + 8 * g), vm));
        _mm256_storeu_ps(sc + 8 * g, p);
        /* (p4 + p0, p5 + p1, p6 + p2, p7 + p3), then the pairs 0 + 2, 1 + 3 */
        const __m128 s4 = _mm_add_ps(_mm256_extractf128_ps(p, 1), _mm256_castps256_ps128(p));
        const __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
        sum += (double)_mm_cvtss_f32(_mm_add_ss(s2, _mm_shuffle_ps(s2, s2, 1)));
    }
    return sum;
}

/* acc[0 .. 8 NR) through positions [lo, hi) of the tile at t0. */
#define VALUES(NR)                                                                                 \
    do {                                                                                           \
        __m256 r[NR];                                                                              \
        _Pragma("GCC unroll 8") for (int u = 0; u < (NR); u++) r[u] =                              \
            _mm256_loadu_ps(acc + i + 8 * u);                                                      \
        for (int t = lo; t < hi; t++) {                                                            \
            const __m256 p = _mm256_set1_ps(sc[t - t0]);                                           \
            const float *vt = vf + (size_t)(t - t0) * hd + i;                                      \
            _Pragma("GCC unroll 8") for (int u = 0; u < (NR); u++) r[u] =                          \
                _mm256_fmadd_ps(_mm256_loadu_ps(vt + 8 * u), p, r[u]);                             \
        }                                                                                          \
        _Pragma("GCC unroll 8") for (int u = 0; u < (NR); u++)                                     \
            _mm256_storeu_ps(acc + i + 8 * u, r[u]);                                               \
    } while (0)

/* One query head over positions [lo, hi) of the tile at t0, its keys and
 * values in kt and vf. */
static void tile_head(const float *qh, float *acc, float *M, float *S, const float *kt,
                      const float *vf, int hd, float scale, int t0, int lo, int hi, float *sc)
{
    const int g0 = (lo - t0) / 8, g1 = (hi - t0 + 7) / 8;
    /* every lane of the tile (a fixed count keeps the sums in registers);
     * those outside [g0, g1) are dropped */
    __m256 d[T / 8];
#pragma GCC unroll 8
    for (int j = 0; j < T / 8; j++)
        d[j] = _mm256_setzero_ps();
    for (int i = 0; i < hd; i++) {
        const __m256 qi = _mm256_set1_ps(qh[i]);
        const float *row = kt + (size_t)i * T;
#pragma GCC unroll 8
        for (int j = 0; j < T / 8; j++)
            d[j] = _mm256_fmadd_ps(_mm256_loadu_ps(row + 8 * j), qi, d[j]);
    }
    const __m256 vscale = _mm256_set1_ps(scale);
#pragma GCC unroll 8
    for (int j = 0; j < T / 8; j++)
        _mm256_storeu_ps(sc + 8 * j,
                         j >= g0 && j < g1 ? mul_ab(d[j], vscale) : _mm256_set1_ps(-INFINITY));
    for (int j = 8 * g0; j < lo - t0; j++)
        sc[j] = -INFINITY;
    for (int j = hi - t0; j < 8 * g1; j++)
        sc[j] = -INFINITY;
    /* The largest score: the portable code's chain m = m > s ? m : s over
     * the tile, whose value without NaNs is the maximum in any order. */
    __m256 vm = _mm256_set1_ps(-INFINITY), nan = _mm256_setzero_ps();
    for (int j = g0; j < g1; j++) {
        const __m256 s = _mm256_loadu_ps(sc + 8 * j);
        vm = _mm256_max_ps(vm, s);
        nan = _mm256_or_ps(nan, _mm256_cmp_ps(s, s, _CMP_UNORD_Q));
    }
    float m;
    if (_mm256_movemask_ps(nan) == 0) {
        __m128 h = _mm_max_ps(_mm256_castps256_ps128(vm), _mm256_extractf128_ps(vm, 1));
        h = _mm_max_ps(h, _mm_movehl_ps(h, h));
        m = _mm_cvtss_f32(_mm_max_ss(h, _mm_shuffle_ps(h, h, 1)));
    } else {
        m = -INFINITY;
        for (int j = 0; j < T; j++)
            m = m > sc[j] ? m : sc[j];
    }
    if (m == -INFINITY)
        return;
    const float Mnew = fmaxf(*M, m);
    if (Mnew > *M) {
        const float ms = expf(*M - Mnew);
        int i = 0;
        for (; i + 8 <= hd; i += 8)
            _mm256_storeu_ps(acc + i, mul_ab(_mm256_loadu_ps(acc + i), _mm256_set1_ps(ms)));
        for (; i < hd; i++)
            acc[i] *= ms;
        *S *= ms;
    }
    *M = Mnew;
    *S = (float)((double)*S + exp_sum8(sc, g0, g1, Mnew));
    int i = 0;
    for (; i + 64 <= hd; i += 64)
        VALUES(8);
    for (; i + 8 <= hd; i += 8)
        VALUES(1);
    for (; i < hd; i++)
        for (int t = lo; t < hi; t++)
            acc[i] = fmaf(vf[(size_t)(t - t0) * hd + i], sc[t - t0], acc[i]);
}

void si__avx2_attn_tiles(const struct si_attn_query *qs, int n_q, const struct si_kv *kv, int h0,
                         int h1, int group, int head_dim, float scale, int t_begin, int t_end,
                         float *scratch)
{
    const int hd = head_dim;
    float *kt = scratch, *vf = kt + (size_t)T * hd, *sc = vf + (size_t)T * hd, *kr = sc + T;
    for (int t0 = t_begin; t0 < t_end; t0 += T) {
        const int te = t_end < t0 + T ? t_end : t0 + T;
        int a = te, b = t0; /* the positions some query attends */
        for (int r = 0; r < n_q; r++) {
            const int lo = qs[r].lo > t0 ? qs[r].lo : t0, hi = qs[r].hi < te ? qs[r].hi : te;
            if (lo < hi) {
                a = lo < a ? lo : a;
                b = hi > b ? hi : b;
            }
        }
        if (a >= b)
            continue;
        for (int g = h0 / group; g * group < h1; g++) {
            const struct kv_side ks = kv_side(kv->k, kv->k_row, kv->k_type, g, hd),
                                 vs = kv_side(kv->v, kv->v_row, kv->v_type, g, hd);
            load_tile(kt, vf, kr, &ks, &vs, hd, t0, a, b, t_end < te + T ? t_end : te + T);
            const int ha = g * group > h0 ? g * group : h0;
            const int hb = (g + 1) * group < h1 ? (g + 1) * group : h1;
            for (int r = 0; r < n_q; r++) {
                const struct si_attn_query *q = &qs[r];
                const int lo = q->lo > t0 ? q->lo : t0, hi = q->hi < te ? q->hi : te;
                if (lo >= hi)
                    continue;
                for (int h = ha; h < hb; h++) {
                    const size_t o = (size_t)(h - h0) * (size_t)hd;
                    tile_head(q->q + o, q->acc + o, &q->M[h - h0], &q->S[h - h0], kt, vf, hd, scale,
                              t0, lo, hi, sc);
                }
            }
        }
    }
}

#endif
