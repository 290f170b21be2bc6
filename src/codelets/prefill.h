/*
 * prefill.h - what the batch tasks share (codelets/prefill*.c): the rule that
 * picks a batch's arithmetic and the products in it.  A batch is e->bat.bn tokens
 * (state.h: btok, bseq, bpos; a step of several sequences, bstep).
 */
#ifndef SI_CODELETS_PREFILL_H
#define SI_CODELETS_PREFILL_H

#include "codelets/state.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/*
 * How the batch multiplies rows of type t, from the engine's prefill mode
 * (starinfer.h's si_prefill_mode) and the batch's size, one rule for every
 * product of the batch, so that a prompt has one arithmetic whichever of
 * its matrices the engine keeps packed and however its tasks split it:
 *   SI__ARITH_REF  the reference's dots on converted inputs (row tiles):
 *                  exact prefill, batches under SI__BLAS_MIN_BATCH tokens,
 *                  and int8's types without a batched kernel;
 *   SI__ARITH_INT8 inputs converted as the reference converts them, the
 *                  batched integer kernel (qgemm; rows the engine keeps
 *                  unpacked are packed 8 at a time on the way), sums in its
 *                  order;
 *   SI__ARITH_BLAS float inputs, sgemm on dequantized rows (si_k_gemm*).
 * Without act_quant (float weights) the reference's inputs are float too.
 */
enum si__arith { SI__ARITH_REF, SI__ARITH_INT8, SI__ARITH_BLAS };

enum si__arith si__arith_of(const struct si_engine *e, uint32_t t);

/* The arithmetic of the batch's token t: si__arith_of, or the reference's
 * for a step's decoding tokens (bsplit and after; float inputs without
 * act_quant, as the reference's). */
enum si__arith si__arith_at(const struct si_engine *e, uint32_t type, int64_t t);

/* y[t][r] = row r . xa[t] for tiles of 8 rows (each tile in cache while
 * every token uses it): the reference's own dot on activations converted
 * by si_quantize_act, so each value equals the token-by-token one bit for
 * bit; the first pk rows packed 8 at a time.  xa[t] at xa + t * xa_stride. */
void si__gemm_act(uint32_t type, const char *w, size_t row_bytes, int64_t pk, int64_t n_rows,
                  int64_t n_cols, const char *xa, size_t xa_stride, int64_t n_tok, float *y,
                  int64_t ldy);

/* y[t][r] = row r of w . x[t] as a token decoded alone computes it where
 * the attention groups multiply Wo (si__wo_fused_at): each column range
 * [cb[g], cb[g + 1]) of nr in turn, as si_ref_matvec_cols does it (the
 * ranges on w's blocks), the ranges' products added in range order as the
 * FFN slices add the groups' (ffn.c): y = p_0, then y += p_g.  A tile of 8
 * rows at a time for every token and range, the rows in cache meanwhile.
 * scratch: the tokens' converted inputs (act_quant: as si__products'). */
void si__products_ranges(bool act_quant, const struct si_tensor *w, const int64_t *cb, int nr,
                         const float *x, int64_t ldx, int64_t n_tok, float *y, int64_t ldy,
                         void *scratch);

/* y[t][r] = row r of w . x[t] through the batched integer kernel
 * (si_gemm8), rows not packed packed into tile 8 at a time on the way; the
 * inputs converted into scratch stay there for the caller.  False, nothing
 * done, where w is not packed (and no tile) or the CPU has no such kernel. */
bool si__qgemm(const struct si_tensor *w, const float *x, int64_t ldx, int64_t n_tok, float *y,
               int64_t ldy, void *scratch, void *tile);

/* y[t] = W x[t] (rows of n_cols floats, y's ldy apart) for n_tok tokens in
 * one arithmetic.  scratch: for the converted inputs or si_k_gemm's tile;
 * tile: 8 of w's rows (qgemm's). */
void si__products(enum si__arith ar, const struct si_tensor *w, int64_t n_rows, const float *x,
                  int64_t n_cols, int64_t n_tok, float *y, int64_t ldy, void *scratch, void *tile);

/* The products y[t] = W x[t] for the batch's tokens tok0 .. tok0 + n_tok - 1,
 * each in its arithmetic (si__arith_at). */
void si__batch_products(const struct si_engine *e, const struct si_tensor *w, int64_t n_rows,
                        const float *x, int64_t n_cols, int64_t tok0, int64_t n_tok, float *y,
                        int64_t ldy, void *scratch, void *tile);

#endif /* SI_CODELETS_PREFILL_H */
