/*
 * quants.h - converting, dequantizing and dotting tensor rows.
 *
 * Supported types (si_type_supported): F32, F16, BF16, Q8_0, Q4_0, Q4_1,
 * Q5_0, Q5_1, Q4_K, Q5_K, Q6_K.  Block layouts are GGUF's (ggml's): a row of
 * n elements is n / block blocks (n must be a multiple of the block size).
 *
 * Each operation has a scalar implementation and an AVX2+FMA one, chosen once
 * at run time from the CPU's features (set SI_NO_SIMD=1 in the environment to
 * force the scalar code).  All functions are thread-safe.
 */
#ifndef SI_MODEL_QUANTS_H
#define SI_MODEL_QUANTS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* IEEE half and bfloat16 conversions (round to nearest even). */
float si_fp16_to_fp32(uint16_t h);
uint16_t si_fp32_to_fp16(float f);
float si_bf16_to_fp32(uint16_t h);
uint16_t si_fp32_to_bf16(float f);

/* The CPU kernels in use, chosen once from the CPU and the environment
 * (SI_NO_SIMD, SI_NO_VNNI): "scalar", "avx2" or "avx2+vnni". */
const char *si_quants_kernels(void);

/* True when dequantize and dot are implemented for type t. */
bool si_type_supported(uint32_t t);
/* True when si_quantize_row() can write type t. */
bool si_type_quantizable(uint32_t t);

/* dst[0..n) = the n values of the row at src of type t. */
void si_dequantize_row(uint32_t t, const void *src, float *dst, int64_t n);

/* Sum over i < n of row[i] * x[i], row of type t, accumulated in float. */
float si_vec_dot(uint32_t t, const void *row, const float *x, int64_t n);

/*
 * Write n floats as a row of type t at dst (si_type_row_size() bytes);
 * returns the bytes written.  Quantizable types: F32, F16, BF16, Q8_0, Q4_0,
 * Q4_1, Q5_0, Q5_1 (round to nearest with the block's scale chosen as ggml's
 * reference quantizers choose it), Q4_K, Q5_K, Q6_K (round to nearest with
 * each sub-block's range; not ggml's searching quantizers, whose files are
 * read as they are).
 */
size_t si_quantize_row(uint32_t t, const float *src, void *dst, int64_t n);

/*
 * The quantized-activation path, as llama.cpp's CPU backend computes a
 * matrix-vector product: the activation vector is converted once to the
 * weight type's "vec_dot_type", then each row is dotted with it using
 * integer (or half) products.  The results differ from si_vec_dot()'s by the
 * activations' rounding.
 *
 * Activation layouts: Q8_0 34 bytes / 32: half d; int8 qs[32]; Q8_1 36 bytes
 * / 32: half d, s (= d * sum of qs); int8 qs[32]; Q8_K 292 bytes / 256:
 * float d; int8 qs[256]; int16 bsums[16] (sums of 16 qs each).
 */

/*
 * The type activations are converted to before a dot with a row of type t
 * (llama.cpp's vec_dot_type): Q8_0 for Q4_0, Q5_0, Q8_0; Q8_1 for Q4_1,
 * Q5_1; Q8_K for Q4_K, Q5_K, Q6_K; F16 for F16; BF16 for BF16; F32 for F32.
 * SI_TYPE_COUNT when t is not supported.
 */
uint32_t si_act_type(uint32_t t);

/*
 * Convert n activations to type at (one of the above) at dst
 * (si_type_row_size(at, n) bytes), as llama.cpp's CPU backend does: per
 * block, d = max|x| / 127 and q = x * 127 / max|x| rounded half to even for
 * Q8_0 and Q8_1; d = max / -127 and q = min(127, x * -127 / max) for Q8_K
 * (max the element of largest magnitude); round to nearest even for F16 and
 * BF16; a copy for F32.
 */
void si_quantize_act(uint32_t at, const float *x, void *dst, int64_t n);

/* Dot of a row of type t with activations converted by si_quantize_act(si_act_type(t), ...). */
float si_vec_dot_act(uint32_t t, const void *row, const void *xa, int64_t n);

/*
 * si_vec_dot_act as llama.cpp's CPU backend computes it for one of n_tok
 * tokens multiplied by the same matrix at once (a batch; 1: alone), group4
 * telling whether the token is in a full group of 4 of them.  Where
 * llama.cpp's AVX2 build takes another kernel than its matrix-vector one:
 *   Q4_K (matrices repacked 8 rows at a time): in a full group of 4, its
 *        GEMM applies the scales per 64 elements instead of per 256;
 *   Q6_K from 8 tokens on: its tiled GEMM, one float step per super-block,
 *        acc = fma(d * isum, d_a, acc).
 * Other types, and these otherwise: si_vec_dot_act.
 */
float si_vec_dot_act_batch(uint32_t t, const void *row, const void *xa, int64_t n, int32_t n_tok,
                           bool group4);
/*
 * out[r] = si_vec_dot_act(t, rows[r], xa, n) for r = 0, 1, bit for bit (a
 * neuron's gate and up dots), in one pass over xa where the type has a fused
 * kernel (AVX2: F16, Q8_0, Q4_0, Q5_0).  ahead[r], when not NULL, is the row
 * of n elements of type t that the caller reads after rows[r]: the kernel
 * prefetches it while it reads rows[r] (a cache line for each line read;
 * without a fused kernel, the whole row before the dot), so that rows at
 * scattered addresses, which the hardware prefetchers cannot predict, come
 * from memory while the current ones are being multiplied.  ahead only
 * changes timing.
 */
void si_vec_dot_act2(uint32_t t, const void *const rows[2], const void *xa, int64_t n, float out[2],
                     const void *const ahead[2]);

/*
 * out[r] = si_vec_dot_act(t, rows[r], xa, n) for r = 0 .. 7, bit for bit,
 * rows anywhere (a sparse FFN's active neurons): one pass over xa for the 8
 * where the type has a kernel (AVX2, VNNI: Q4_0, Q8_0), else row by row;
 * ahead as for si_vec_dot_act2 (NULL, or 8 rows, entries may be NULL).
 */
void si_vec_dot_act8p(uint32_t t, const void *const rows[8], const void *xa, int64_t n,
                      float out[8], const void *const ahead[8]);

/*
 * y[0..n) += a * row[0..n) for a row of type t (F32, F16, BF16, Q8_0, Q4_0,
 * Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K): the "axpy" that adds one neuron's
 * down-projection row to the output.  The row's values are rounded as
 * si_dequantize_row() rounds them or fused into the product (within a few
 * float roundings of y + a * value); y is not read past n.
 */
void si_vec_mad(uint32_t t, const void *row, float a, float *y, int64_t n);

/*
 * si_vec_mad(t, rows[r], a[r], y, n) for r = 0, 1, 2, 3 in that order, with
 * the same result bit for bit, but in one pass over y where the type has a
 * fused kernel (AVX2: F32, F16, BF16, Q8_0, Q4_0, Q4_1), which keeps y in
 * registers instead of loading and storing it once per row.
 */
void si_vec_mad4(uint32_t t, const void *const rows[4], const float a[4], float *y, int64_t n);

/* Which implementation runs: "avx2" or "scalar". */
const char *si_quants_impl(void);

#endif /* SI_MODEL_QUANTS_H */
