/*
 * quants_avx2.h - what the files of the AVX2 kernels share: the byte and
 * vector helpers they use, and the kernels of quants_avx2_act.c,
 * quants_avx2_pack8.c and quants_avx2_pack8k.c that the tables
 * (quants_avx2.c, quants_avx2_act.c) list.
 *
 * For those two files only, which libstarinfer_avx2.la builds with
 * -mavx2 -mfma -mf16c: include it where __AVX2__, __FMA__ and __F16C__ are
 * defined.  The kernels' arguments are those of the typedefs in
 * quants_impl.h.
 */
#ifndef SI_MODEL_QUANTS_AVX2_H
#define SI_MODEL_QUANTS_AVX2_H

#if !defined(__AVX2__) || !defined(__FMA__) || !defined(__F16C__)
#error "quants_avx2.h is for the files built with -mavx2 -mfma -mf16c"
#endif

#include "model/act.h"

#include <immintrin.h>
#include <stdint.h>
#include <string.h>

/* The helpers must inline for their vectors to stay in registers. */
#if defined(__GNUC__)
#define INLINE static inline __attribute__((always_inline))
#else
#define INLINE static inline
#endif

/* ------------------------------------------------------ helpers */

/* a * b, NaN priority a, b (as GCC compiles the portable code's a * b:
 * the attention's products of an accumulator and a factor). */
INLINE __m256 mul_ab(__m256 a, __m256 b)
{
#if defined(__GNUC__)
    __m256 r;
    __asm__("vmulps %2, %1, %0" : "=x"(r) : "x"(a), "xm"(b));
    return r;
#else
    return _mm256_mul_ps(a, b);
#endif
}

INLINE float half_at(const uint8_t *p)
{
    uint16_t h;
    memcpy(&h, p, sizeof h);
    return _cvtsh_ss(h);
}

INLINE float bf16_at(const uint8_t *p)
{
    uint16_t h;
    memcpy(&h, p, sizeof h);
    return si_act_float((uint32_t)h << 16);
}

INLINE float f32_at(const uint8_t *p)
{
    float f;
    memcpy(&f, p, sizeof f);
    return f;
}

INLINE uint32_t u32_at(const uint8_t *p)
{
    uint32_t v;
    memcpy(&v, p, sizeof v);
    return v;
}

/* The 8 bfloat16 values at p as floats. */
INLINE __m256 bf16x8(const uint8_t *p)
{
    __m256i v = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
}

INLINE float hsum(__m256 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/*
 * Q6_K's 6-bit values (0 .. 63) of 4 runs of 32 bytes from 64 ql bytes (two
 * loads) and 32 qh bytes: q[0] the low nibbles of ql0 with qh's bits 0-1,
 * q[1] those of ql1 with bits 2-3, q[2] ql0's high nibbles with bits 4-5,
 * q[3] ql1's with bits 6-7; byte for byte, so rows packed 4 bytes a lane
 * (pack8.h) decode the same way.
 */
INLINE void q6_k_values(__m256i ql0, __m256i ql1, __m256i qh, __m256i q[4])
{
    const __m256i low = _mm256_set1_epi8(0xf), two = _mm256_set1_epi8(0x30);
    q[0] = _mm256_or_si256(_mm256_and_si256(ql0, low),
                           _mm256_and_si256(_mm256_slli_epi16(qh, 4), two));
    q[1] = _mm256_or_si256(_mm256_and_si256(ql1, low),
                           _mm256_and_si256(_mm256_slli_epi16(qh, 2), two));
    q[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql0, 4), low),
                           _mm256_and_si256(qh, two));
    q[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql1, 4), low),
                           _mm256_and_si256(_mm256_srli_epi16(qh, 2), two));
}

/* ------------------------------------------------------ quants_avx2_act.c */

/* The activation quantizers (si__quantize_act_fn). */
void si__avx2_quantize_act_f32(const float *x, void *dst, int64_t n);
void si__avx2_quantize_act_f16(const float *x, void *dst, int64_t n);
void si__avx2_quantize_act_bf16(const float *x, void *dst, int64_t n);
void si__avx2_quantize_act_q8_0(const float *x, void *dst, int64_t n);
void si__avx2_quantize_act_q8_1(const float *x, void *dst, int64_t n);
void si__avx2_quantize_act_q8_k(const float *x, void *dst, int64_t n);

/* The dots with quantized activations (si__dot_act_fn). */
float si__avx2_dot_act_f32(const void *row, const void *xa, int64_t n);
float si__avx2_dot_act_f16(const void *row, const void *xa, int64_t n);
float si__avx2_dot_act_bf16(const void *row, const void *xa, int64_t n);
float si__avx2_dot_act_q8_0(const void *row, const void *xa, int64_t n);
float si__avx2_dot_act_q4_0(const void *row, const void *xa, int64_t n);
float si__avx2_dot_act_q4_1(const void *row, const void *xa, int64_t n);
float si__avx2_dot_act_q5_0(const void *row, const void *xa, int64_t n);
float si__avx2_dot_act_q5_1(const void *row, const void *xa, int64_t n);
float si__avx2_dot_act_q4_k(const void *row, const void *xa, int64_t n);
float si__avx2_dot_act_q5_k(const void *row, const void *xa, int64_t n);
float si__avx2_dot_act_q6_k(const void *row, const void *xa, int64_t n);

/* Two rows against the same activations (si__dot_act2_fn). */
void si__avx2_dot_act2_f16(const void *const rows[2], const void *xa, int64_t n, float out[2],
                           const void *const ahead[2]);
void si__avx2_dot_act2_q8_0(const void *const rows[2], const void *xa, int64_t n, float out[2],
                            const void *const ahead[2]);
void si__avx2_dot_act2_q4_0(const void *const rows[2], const void *xa, int64_t n, float out[2],
                            const void *const ahead[2]);
void si__avx2_dot_act2_q5_0(const void *const rows[2], const void *xa, int64_t n, float out[2],
                            const void *const ahead[2]);

/* Groups of 8 packed rows (si__dot_act8_fn; quants_avx2_pack8.c): AVX2,
 * and the same with AVX-512 VNNI's integer products (the VNNI table). */
void si__avx2_dot_act8_q4_0(const void *group, const void *xa, int64_t n, float out[8]);
void si__avx2_dot_act8_q4_1(const void *group, const void *xa, int64_t n, float out[8]);
void si__avx2_dot_act8_q8_0(const void *group, const void *xa, int64_t n, float out[8]);
/* ... prefetching on into the next group's range (si__dot_act8_next_fn). */
void si__avx2_dot_act8_next_q4_0(const void *group, const void *xa, int64_t n, float out[8],
                                 const void *next);
void si__avx2_dot_act8_next_q8_0(const void *group, const void *xa, int64_t n, float out[8],
                                 const void *next);
void si__vnni_dot_act8_q4_1(const void *group, const void *xa, int64_t n, float out[8]);

/* The K types' packed groups (quants_avx2_pack8k.c). */
void si__avx2_dot_act8_q4_k(const void *group, const void *xa, int64_t n, float out[8]);
void si__avx2_dot_act8_q5_k(const void *group, const void *xa, int64_t n, float out[8]);
void si__avx2_dot_act8_q6_k(const void *group, const void *xa, int64_t n, float out[8]);
void si__avx2_dequantize8_q4_k(const void *group, int64_t n, float *dst);
void si__avx2_dequantize8_q5_k(const void *group, int64_t n, float *dst);
void si__avx2_dequantize8_q6_k(const void *group, int64_t n, float *dst);
void si__vnni_gemm8_q4_k(const void *group, int64_t n, const void *xa, size_t xa_stride,
                         const int32_t *asum, int64_t n_tok, float *y, size_t ldy);
void si__vnni_gemm8_q5_k(const void *group, int64_t n, const void *xa, size_t xa_stride,
                         const int32_t *asum, int64_t n_tok, float *y, size_t ldy);
void si__vnni_gemm8_q6_k(const void *group, int64_t n, const void *xa, size_t xa_stride,
                         const int32_t *asum, int64_t n_tok, float *y, size_t ldy);

/* 8 rows at any addresses (si__dot_act8p_fn; quants_avx2_pack8.c). */
void si__avx2_dot_act8p_q4_0(const void *const rows[8], const void *xa, int64_t n, float out[8],
                             const void *const ahead[8]);
void si__avx2_dot_act8p_q8_0(const void *const rows[8], const void *xa, int64_t n, float out[8],
                             const void *const ahead[8]);
void si__vnni_dot_act8p_q4_0(const void *const rows[8], const void *xa, int64_t n, float out[8],
                             const void *const ahead[8]);
void si__vnni_dot_act8p_q8_0(const void *const rows[8], const void *xa, int64_t n, float out[8],
                             const void *const ahead[8]);

/* How far ahead of the block being read a batch's stream of groups is
 * prefetched, in bytes.  The hardware's prefetchers alone left a tile of 4
 * tokens reading a 75 MB matrix of 16,384 columns from DRAM at 55 GMAC/s a
 * core, against 122 with this (and 123 with the matrix in L3); 8 tokens 85
 * -> 149.  2,048 bytes (the row kernels' distance) gave 99 and 143, 4,096
 * 121 and 150, 16,384 as 8,192 (docs/measurements.md).  The batched
 * kernels of every type take it (quants_avx2_pack8.c, quants_avx2_pack8k.c). */
#define GEMM_PREFETCH 8192

/* Batches against packed groups (si__gemm8_fn; quants_avx2_pack8.c), VNNI only. */
void si__vnni_gemm8_q4_0(const void *group, int64_t n, const void *xa, size_t xa_stride,
                         const int32_t *asum, int64_t n_tok, float *y, size_t ldy);
void si__vnni_gemm8_q4_1(const void *group, int64_t n, const void *xa, size_t xa_stride,
                         const int32_t *asum, int64_t n_tok, float *y, size_t ldy);
void si__vnni_gemm8_q8_0(const void *group, int64_t n, const void *xa, size_t xa_stride,
                         const int32_t *asum, int64_t n_tok, float *y, size_t ldy);
void si__vnni_dot_act8_q4_0(const void *group, const void *xa, int64_t n, float out[8]);
void si__vnni_dot_act8_q8_0(const void *group, const void *xa, int64_t n, float out[8]);
void si__vnni_dot_act8_next_q4_0(const void *group, const void *xa, int64_t n, float out[8],
                                 const void *next);
void si__vnni_dot_act8_next_q8_0(const void *group, const void *xa, int64_t n, float out[8],
                                 const void *next);

/* The attention's twins (si__attn_f16_fn and si__attn_tiled_fn). */
void si__avx2_attn_f16(float *out, const float *q, const uint16_t *k, const uint16_t *v,
                       int first, int n_kv, int h0, int h1, int n_head, int n_head_kv,
                       int head_dim, float scale, uint16_t *scratch);
/* The column-block products' block kernel (si__cb_block_fn; quants_avx2_cb.c). */
void si__avx2_cb_block(bool has_min, const uint8_t *const *rows, const int8_t *xq, int na,
                       int32_t sxq, float s, const uint16_t *d, const uint16_t *m, int64_t n,
                       float *y);
/* quants_avx2_attn.c */
void si__avx2_attn_tiles(const struct si_attn_query *qs, int n_q, const struct si_kv *kv, int h0,
                         int h1, int group, int head_dim, float scale, int t_begin, int t_end,
                         float *scratch);

#endif /* SI_MODEL_QUANTS_AVX2_H */
