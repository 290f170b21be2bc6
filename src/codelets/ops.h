/*
 * ops.h - the PowerInfer activation predictor and the batched matrix
 * product (prefill) as pure CPU kernels; no StarPU here.  They are the CPU
 * twins of si_cuda_predictor() and si_cuda_gemm() (codelets_cuda.h).
 *
 * Weights are GGUF row layout: a matrix of n_rows rows of n_cols elements of
 * one type, row r at w + r * row_bytes (row_bytes 0: packed rows, the row
 * size of the type).  Types: every type si_type_supported() accepts (F32,
 * F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K); n_cols must be
 * a whole number of the type's blocks.  Shapes are checked: a kernel refuses
 * (SI_E_INVALID, nothing written) what it cannot compute, and computes
 * nothing else.  Thread-safe; they allocate nothing.
 */
#ifndef SI_CODELETS_OPS_H
#define SI_CODELETS_OPS_H

#include <stddef.h>
#include <stdint.h>

struct si_tensor; /* model/model.h */

#ifdef __cplusplus
extern "C" {
#endif

/*
 * The predictor of one layer: which FFN neurons will be active for input x
 * (n_embd floats).
 *
 *   hid = relu(fc1 x)   fc1: r rows of n_embd elements (GGUF ne {n_embd, r})
 *   z   = fc2 hid       fc2: n_ff rows of r elements   (GGUF ne {r, n_ff})
 *
 * writes to idx, in increasing order, every neuron i < n_ff with
 * z[i] >= threshold (NaN never passes) and returns their count (idx needs
 * room for n_ff), or SI_E_INVALID for a bad shape, type or stride.  Both
 * products are si_vec_dot() rows with float activations (no bias), as the
 * CUDA twin computes them.  hid: scratch of r floats (left holding relu(fc1 x));
 * z: n_ff floats receiving fc2's output, or NULL.
 */
int64_t si_k_predictor(uint32_t fc1_type, const void *fc1, size_t fc1_row_bytes,
                       uint32_t fc2_type, const void *fc2, size_t fc2_row_bytes, int64_t n_embd,
                       int64_t r, int64_t n_ff, const float *x, float threshold, float *hid,
                       float *z, int32_t *idx);

/*
 * Rows of the f32 tile si_k_gemm() dequantizes at a time; its scratch holds
 * SI_K_GEMM_TILE_ROWS * n_cols floats.
 */
#define SI_K_GEMM_TILE_ROWS 64

/* Bytes of scratch si_k_gemm() needs for a weight of type t with n_cols
 * columns: 0 for F32 (used where it lies), else a tile of f32 rows. */
size_t si_k_gemm_scratch_size(uint32_t type, int64_t n_cols);

/*
 * y[t][r] = row r of w . x[t] for t < n_tok, r < n_rows: the product of a
 * weight matrix (n_rows x n_cols, type `type`) with a batch of n_tok f32
 * vectors (token t at x + t * ldx floats, n_cols of them), into y (token t
 * at y + t * ldy floats, n_rows of them; ldx >= n_cols, ldy >= n_rows).
 * F32 rows go straight to cblas_sgemm (row_bytes a multiple of 4); the
 * other types are dequantized SI_K_GEMM_TILE_ROWS rows at a time into
 * scratch (si_k_gemm_scratch_size() bytes; may be NULL for F32) with
 * si_dequantize_row(), then multiplied by cblas_sgemm, so y matches a loop of
 * si_vec_dot() up to float rounding.  SI_OK, or SI_E_INVALID for a bad shape,
 * type or stride.  The BLAS's own threads are whatever the process set
 * (openblas_set_num_threads); a task-parallel caller wants one.
 */
int si_k_gemm(uint32_t type, const void *w, size_t row_bytes, int64_t n_rows, int64_t n_cols,
              const float *x, int64_t ldx, int64_t n_tok, float *y, int64_t ldy, void *scratch);

/* si_k_gemm on the rows of w (ne[1] rows of ne[0] values), packed ones
 * (w->pk, model/pack8.h) included: the same values. */
int si_k_gemm_tensor(const struct si_tensor *w, const float *x, int64_t ldx, int64_t n_tok,
                     float *y, int64_t ldy, void *scratch);

#ifdef __cplusplus
}
#endif

#endif /* SI_CODELETS_OPS_H */
