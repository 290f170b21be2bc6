/*
 * codelets_cuda.h - C-callable launchers of the CUDA kernels behind the
 * matvec, sparse FFN and RMSNorm operators (matvec_cuda.cu, ffn_sparse_cuda.cu).
 *
 * Each launcher queues one kernel on `stream` and returns at once: pointers
 * are device memory, results are ready once the stream has reached them.  No
 * launcher synchronises anything.  They return cudaSuccess, the error of the
 * launch (cudaGetLastError()), or cudaErrorInvalidValue for arguments they
 * refuse (nothing is queued then).  A StarPU CUDA codelet calls them with
 * pointers from the STARPU_*_GET_* accessors and starpu_cuda_get_local_stream().
 *
 * Weight matrices are `n_rows` rows of `n_cols` elements of one type, row r at
 * w + r * row_stride bytes (row_stride 0: packed rows, the row size of the
 * type).  Types: SI_TYPE_F32, F16, Q8_0, Q4_0, Q4_1 (model/types.h; block
 * layouts in cuda_common.cuh).  n_cols must be a multiple of 32 for the
 * quantized types; w and row_stride must be multiples of 4 bytes for F32 and
 * of 2 for the others.  x, y, h, b are float32 vectors; every sum is
 * accumulated in float.
 *
 * The dots take x in float32, as si_vec_dot() does; the CPU FFN kernels
 * (ffn_sparse.h) dot with activations quantized by si_quantize_act() as
 * llama.cpp does, so their h differs from these kernels' by that rounding.
 */
#ifndef SI_CODELETS_CODELETS_CUDA_H
#define SI_CODELETS_CODELETS_CUDA_H

#include <cuda_runtime_api.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* y[r] = row r . x for r < n_rows (x has n_cols elements).  One warp per row. */
cudaError_t si_cuda_matvec(uint32_t type, const void *w, size_t row_stride, int64_t n_rows,
                           int64_t n_cols, const float *x, float *y, cudaStream_t stream);

/*
 * The active neurons' activations, for k < n_idx and i = idx[k]:
 *   SI_FFN_GATED        h[k] = act(gate_i . x) * (up_i . x + b_i)
 *   SI_FFN_GATED_RELU2  h[k] = act(gate_i . x) * relu(up_i . x + b_i)
 *                       (Bamboo: called with act = SI_ACT_RELU)
 *   SI_FFN_PLAIN        h[k] = act(up_i . x + b_i)      (gate unused, may be NULL)
 * as model/forward.c computes them.  kind and act take the values of enum
 * si_ffn_kind and enum si_act (model/model.h): SiLU x / (1 + exp(-x)), ReLU,
 * GELU (tanh approximation).  gate and up share type, n_cols = n_embd and
 * row_stride; b (n_ff floats) may be NULL for no bias.  An idx[k] outside
 * [0, n_ff) gives h[k] = 0.  One warp per active neuron.
 */
cudaError_t si_cuda_ffn_gate_up(uint32_t type, const void *gate, const void *up, size_t row_stride,
                                int64_t n_ff, int64_t n_embd, const float *b, const float *x,
                                const int32_t *idx, int64_t n_idx, int kind, int act, float *h,
                                cudaStream_t stream);

/*
 * y[c] = sum over k < n_idx of h[k] * down_t[idx[k]][c], for c < n_embd,
 * down_t the down projection transposed: one row of n_embd per neuron (n_ff
 * rows).  y is overwritten (all zeros when n_idx is 0); terms with h[k] == 0
 * and indices outside [0, n_ff) are skipped; duplicates each count.  Deterministic: each block owns
 * 32 output columns and its warps sum the neurons in a fixed order, no atomics.
 */
cudaError_t si_cuda_ffn_down(uint32_t type, const void *down_t, size_t row_stride, int64_t n_ff,
                             int64_t n_embd, const float *h, const int32_t *idx, int64_t n_idx,
                             float *y, cudaStream_t stream);

/*
 * y[i] = x[i] / sqrt(sum x^2 / n + eps) * w[i] for i < n (w NULL: no weight),
 * the sum of squares accumulated in float.  y may alias x.  One block.
 */
cudaError_t si_cuda_rmsnorm(float *y, const float *x, const float *w, int64_t n, float eps,
                            cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif /* SI_CODELETS_CODELETS_CUDA_H */
