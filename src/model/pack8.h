/*
 * pack8.h - weight rows packed 8 at a time, for matrix-vector products at
 * the memory's speed.
 *
 * A matrix's rows, in the GGUF row layout, are dotted one at a time: each
 * block costs a scale conversion and the activation's block is loaded again
 * for every row, so one core multiplies Q4_0 at about 2.6 GB/s while it can
 * read 13 (docs/measurements.md, "Packed rows").  Packed, a group of 8
 * consecutive rows keeps, block after block, the 8 rows' scales side by
 * side and then their quants, so that a kernel converts 8 scales at once,
 * loads each activation block once for 8 rows and reads one sequential
 * stream.  A group takes exactly the bytes of its 8 rows; a packed matrix
 * is a sequence of groups, so rows [8g, 8g + 8) are the 8 row sizes at
 * byte 8g * row_bytes, as before packing.
 *
 * Per block of 32 values (b = 0, 1, ...; q[r][j] value j of row r's block
 * in element order):
 *   Q4_0: 8 scales (f16, row 0 first), then the 16 quant bytes of each
 *         row (as stored: byte j holds values j and j + 16 in its low and
 *         high nibbles) as 4 units of 4: unit u of row r at 16 + 32u + 4r,
 *         144 bytes;
 *   Q4_1: 8 scales, 8 mins (f16), then the quants as Q4_0's, 160 bytes;
 *   Q8_0: 8 scales, then the 8 rows' 32 quants one row after the other,
 *         272 bytes.
 * Per super-block of 256 values of the K types, each row's bytes moved
 * whole in units, unit u of rows 0 .. 7 side by side:
 *   Q4_K: the 8 d (f16), the 8 dmin, then the 12 scale bytes as 3 units
 *         of 4 (unit u: bytes 32 + 32u + 4r of the packed block for row
 *         r), then the 128 quant bytes as 32 units of 4 (unit u at 128 +
 *         32u + 4r: the row's qs[4u .. 4u + 3], values 4k .. 4k + 3 of two
 *         sub-blocks in their low and high nibbles), 1152 bytes;
 *   Q5_K: as Q4_K, the 32 qh bytes as 8 units of 4 (at 128 + 32u + 4r:
 *         the row's qh[4u .. 4u + 3]) before the quants (at 384 + 32u +
 *         4r), 1408 bytes;
 *   Q6_K: the 8 d, the 16 scales as 16 units of 1 (scale s of row r at 16
 *         + 8s + r), the 128 ql bytes as 32 units of 4 (at 144 + 32u + 4r),
 *         the 64 qh bytes as 16 units of 4 (at 1168 + 32u + 4r), 1680
 *         bytes.
 * So a 32-byte load holds 4 consecutive values of the 8 rows, a lane of 4
 * bytes per row (Q4_0 and Q4_1: values 4u .. 4u + 3 in the low nibbles,
 * 16 + 4u .. 16 + 4u + 3 in the high ones): a kernel keeps each row in a
 * lane of its vectors, and a batched kernel needs no transposition.
 * Other types are not packed (si_pack8_type() false).
 *
 * si_vec_dot_act8() gives each row's si_vec_dot_act(), bit for bit, with
 * whatever kernel table is in use; the engine packs at load the matrices
 * it multiplies whole (graph/weights.c) and the results do not change.
 */
#ifndef SI_MODEL_PACK8_H
#define SI_MODEL_PACK8_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Bytes of one packed block of 8 rows of type t (0: t is not packed). */
size_t si_pack8_block_bytes(uint32_t t);

/* Whether si_pack8 packs rows of type t (Q4_0, Q4_1, Q8_0, Q4_K, Q5_K, Q6_K). */
static inline bool si_pack8_type(uint32_t t)
{
    return si_pack8_block_bytes(t) != 0;
}

/*
 * Packs the 8 rows at rows, rows + row_bytes, ... (n values each, type t,
 * si_pack8_type(t); row_bytes at least one row's size: rows may be apart,
 * as in neuron records) into dst: 8 rows' bytes, not overlapping rows.
 */
void si_pack8(uint32_t t, const void *rows, size_t row_bytes, int64_t n, void *dst);

/* Row r (0 .. 7) of the packed group at group, back in the row layout at
 * row (row_bytes bytes). */
void si_unpack8_row(uint32_t t, const void *group, int r, int64_t n, void *row);

/* The K types (Q4_K, Q5_K, Q6_K): super-block b of row r from the packed
 * super-block at group_block (group + b * si_pack8_block_bytes(t)), at
 * block (one row's super-block bytes).  For the scalar kernels. */
void si__unpack8_block(uint32_t t, const void *group_block, int r, void *block);

/* The 8 rows of the packed group as floats, row r at dst + r * n, the
 * values si_dequantize_row() gives. */
void si_dequantize8(uint32_t t, const void *group, int64_t n, float *dst);

/*
 * out[r] = si_vec_dot_act(t, row r of group, xa, n) for r = 0 .. 7, bit for
 * bit; xa converted by si_quantize_act(si_act_type(t), ...).
 */
void si_vec_dot_act8(uint32_t t, const void *group, const void *xa, int64_t n, float out[8]);

/* si_vec_dot_act8 over a range of a group's columns (group: the range's
 * first block; n its values) when the next call reads the same range of
 * another group, at next: the kernels' prefetches run on into next's
 * bytes instead of the columns after the range.  The same results. */
void si_vec_dot_act8_next(uint32_t t, const void *group, const void *xa, int64_t n, float out[8],
                          const void *next);

/*
 * A batch against a packed group, where the kernels in use have a batched
 * kernel for t (si_gemm8_available; AVX-512 VNNI): y[i * ldy + r] = row r
 * . token i for r < 8 and i < n_tok, the tokens converted by
 * si_quantize_act(si_act_type(t), ...) at xa + i * xa_stride, asum from
 * si_act_block_sums (n_tok x n / 32).  The values of si_vec_dot_act up to
 * the order of the float additions (per block instead of per lane).
 */
bool si_gemm8_available(uint32_t t);
/* Why the kernels in use have no batched kernels (si_gemm8_available false
 * for every type): NULL where they have them (AVX-512 VNNI usable, neither
 * SI_NO_VNNI nor SI_NO_SIMD set), else the reason, as "this CPU has no
 * AVX-512 VNNI" or "SI_NO_VNNI is set". */
const char *si_gemm8_missing(void);
void si_gemm8(uint32_t t, const void *group, int64_t n, const void *xa, size_t xa_stride,
              const int32_t *asum, int64_t n_tok, float *y, size_t ldy);

/* sums[b] = the sum of the 32 quants of block b of n activations converted
 * to Q8_0 at xa (other activation types: nothing to do). */
void si_act_block_sums(uint32_t at, const void *xa, int64_t n, int32_t *sums);

#endif /* SI_MODEL_PACK8_H */
