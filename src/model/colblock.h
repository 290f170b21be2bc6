/*
 * colblock.h - column-block copies: a matrix stored by its columns, so
 * that a product whose input is sparse reads only the columns of its
 * non-zero entries, with the weights of the file's own 4-bit blocks (no
 * second rounding).
 *
 * W (n_out rows of n_in, Q4_0, Q4_1 or Q4_K blocks of 32 along each row)
 * is w[o][i] = d[b][o] * q[i][o] (+ m[b][o]) for the input block b = i / 32,
 * q in 0..15 (Q4_0: d * (q - 8)).  The copy keeps, per input i, a row of
 * the n_out 4-bit q (a group of 64 outputs in 32 bytes: byte k holds
 * output k in its low nibble and output 32 + k in its high one), and per
 * input block b a row of the n_out scales d (fp16), then for the kinds with
 * a min the n_out mins m.  Q4_0 and Q4_1 blocks are copied exactly; a
 * Q4_K sub-block's scale d * sc and min -dmin * m are rounded to fp16 once.
 *
 * In a GGUF file the copy of blk.N.X.weight is two tensors: blk.N.X_t.weight
 * (I8, {n_out / 2, n_in}: the rows of q) and blk.N.X_t.scale (F16,
 * {n_out, n_in / 32}, or {2 n_out, n_in / 32} with mins).  In memory it is
 * a struct si_tensor with cb_scale set (model.h).
 *
 * The product: per input block, the input's entries there converted to
 * 8-bit integers with the block's scale s = max |x| / 127 (as llama.cpp
 * converts activations, Q8_0), the integer sums T[o] = sum of q[i][o] *
 * xq[i] over the block's non-zero entries exact, then y[o] += d[b][o] *
 * (s * (T[o] - 8 sum xq)) (Q4_0), or y[o] += d[b][o] * (s * T[o]) and
 * y[o] += m[b][o] * (s * sum xq), each a fused multiply-add, block after
 * block: the AVX2 kernel and the portable one give the same bits.
 */
#ifndef SI_MODEL_COLBLOCK_H
#define SI_MODEL_COLBLOCK_H

#include "model/model.h"

#include <stdbool.h>
#include <stdint.h>

#define SI_CB_GROUP 64 /* outputs per group of a q row; column ranges fall on it */

/* Whether a tensor of type t with n_out rows of n_in gets a column-block copy. */
bool si_cb_source_ok(uint32_t t, int64_t n_out, int64_t n_in);

/* Whether the copy of a tensor of type t keeps mins (Q4_1, Q4_K). */
bool si_cb_has_min(uint32_t t);

/*
 * Input block b of src (si_cb_source_ok): q[k * n_out + o] = the 4-bit
 * value of w[o][32 b + k] for k < 32, d[o] and (with mins) m[o] its
 * scale and min, fp16.
 */
void si_cb_decode_block(const struct si_tensor *src, int64_t b, uint8_t *q, uint16_t *d,
                        uint16_t *m);

/* One q row in the copy's layout: the n_out values q[0 .. n_out) (0..15)
 * into n_out / 2 bytes at dst. */
void si_cb_pack_row(const uint8_t *q, int64_t n_out, uint8_t *dst);

/*
 * y[0 .. c1 - c0) = columns [c0, c1) of the product of the copy wt with
 * x (wt->ne[1] entries, its zeros skipped; c0, c1 multiples of
 * SI_CB_GROUP), with the kernel in use (AVX2 where the CPU has it).
 * Returns the input blocks that had a non-zero entry.
 */
int64_t si_cb_matvec(const struct si_tensor *wt, int64_t c0, int64_t c1, const float *x, float *y);

/* The same with the portable kernel: the oracle of the tests (the same bits). */
int64_t si_cb_matvec_portable(const struct si_tensor *wt, int64_t c0, int64_t c1, const float *x,
                              float *y);

#endif /* SI_MODEL_COLBLOCK_H */
