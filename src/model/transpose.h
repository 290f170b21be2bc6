/*
 * transpose.h - a matrix's transposed copy, written row by row while a GGUF
 * file is written (gguf_write.h's fill callbacks).
 *
 * A product y = W x whose input x is sparse reads only the rows of the
 * transposed W^T that its non-zero entries select: y = sum over x_i != 0 of
 * x_i * W^T row i (si_vec_mad).  ffn_down_t is such a copy of ffn_down;
 * input sparsity (`starinfer convert --transpose`) adds the attention's and
 * the FFN's gate and up.  The copy is quantized along the outputs, so its
 * values differ from the source's by one more rounding where the type is
 * quantized.
 */
#ifndef SI_MODEL_TRANSPOSE_H
#define SI_MODEL_TRANSPOSE_H

#include "model/model.h"

#include <stddef.h>
#include <stdint.h>

/*
 * The type of the transposed copy of a tensor of type t whose transposed
 * rows are n long: t itself where it has a fast mad kernel (F32, F16, BF16,
 * Q8_0, Q4_0, Q4_1) and n fits its blocks; Q4_0 for Q4_K (the same 4.5
 * bits per weight); Q8_0 for the other quantized types; F16 when n is not
 * a multiple of 32.
 */
uint32_t si_transpose_type(uint32_t t, int64_t n);

/* One tensor's copy while it is written: src {ne0, ne1} becomes {ne1, ne0}
 * of `type`; the whole transposed matrix is held in floats (ne0 x ne1) from
 * the first row asked until the last is written. */
struct si_transpose {
    const struct si_tensor *src;
    uint32_t type;
    size_t row_bytes; /* of a transposed row (src->ne[1] elements) */
    float *t;
};

/* f for src as type (si_type_row_size must accept type and src->ne[1]):
 * SI_OK, or SI_E_INVALID. */
int si_transpose_init(struct si_transpose *f, const struct si_tensor *src, uint32_t type);

/* si_gguf_fill_fn: rows [row0, row0 + n_rows) of the copy at dst; SI_OK or
 * SI_E_NOMEM. */
int si_transpose_fill(void *user, int64_t row0, int64_t n_rows, void *dst);

/* Free what a write stopped half-way left (nothing after the last row). */
void si_transpose_release(struct si_transpose *f);

/*
 * Write model m to path with input sparsity's transposed copies (model.h):
 * the file's keys and tensors as they are, then per layer attn_q_t,
 * attn_k_t, attn_v_t, attn_output_t, ffn_gate_t (gated FFNs), ffn_up_t,
 * and ffn_down_t when the file has none: column-block copies
 * (model/colblock.h) of the Q4_0, Q4_1 and Q4_K matrices whose shapes allow
 * it, the others transposed as si_transpose_type() says; ffn_down_t (rows
 * of the sparse layouts' neuron records) is always the latter, and a
 * Q4_0, Q4_1 or Q4_K ffn_down also gets a column-block copy, ffn_down_c.
 * Copies the file already has are written anew.  *added_bytes (may be
 * NULL): the copies' bytes.  SI_OK, or a negative si_status with one line
 * in err (nothing written: the writer renames a finished file into place).
 */
int si_transpose_write(const struct si_model *m, const char *path, uint64_t *added_bytes, char *err,
                       size_t err_size);

#endif /* SI_MODEL_TRANSPOSE_H */
