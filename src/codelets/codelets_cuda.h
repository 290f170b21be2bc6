/*
 * codelets_cuda.h - C-callable launchers of the CUDA kernels behind the
 * operators of the task graph: matvec, sparse FFN and RMSNorm (matvec_cuda.cu,
 * ffn_sparse_cuda.cu), LayerNorm, RoPE and fp16 attention (layer_cuda.cu),
 * the predictor and the batched matrix product (ops_cuda.cu).  Each has a
 * CPU twin (model/kernels.h, codelets/ffn_sparse.h, codelets/ops.h) that
 * tests/test-cuda-kernels.c compares it with.
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
 * type).  Types: SI_TYPE_F32, F16, Q8_0, Q4_0, Q4_1, Q4_K, Q5_K, Q6_K
 * (model/types.h; block layouts in cuda_common.cuh).  n_cols must be a
 * multiple of 32 for the quantized types (256 for the K types); w and
 * row_stride must be multiples of 4 bytes for F32 and of 2 for the others.
 * x, y, h, b are float32 vectors; every sum is accumulated in float.
 *
 * The dots take x in float32, as si_vec_dot() does; the CPU FFN kernels
 * (ffn_sparse.h) dot with activations quantized by si_quantize_act() as
 * llama.cpp does, so their h differs from these kernels' by that rounding.
 */
#ifndef SI_CODELETS_CODELETS_CUDA_H
#define SI_CODELETS_CODELETS_CUDA_H

#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/*
 * Host twins of the kernels' row decoders (host memory, run on the CPU; no
 * device needed), for tests/test-cuda-decode: a row's n elements as the
 * kernels read them, and row . x as a warp sums it.  0, or -1 for a type,
 * n or alignment the kernels refuse.
 */
int si__cuda_host_row_elems(uint32_t type, const void *row, int64_t n, float *out);
int si__cuda_host_row_dot(uint32_t type, const void *row, const float *x, int64_t n, float *out);

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
 * h[i] = act(g[i]) * (u[i] + b[i]) (GATED), act(g[i]) * relu(u[i] + b[i])
 * (GATED_RELU2) or act(u[i] + b[i]) (PLAIN: g unused, may be NULL) for
 * i < n: the activations from gating and up products computed apart (their
 * rows have different strides).  b may be NULL; h may alias u.
 */
cudaError_t si_cuda_ffn_combine(const float *g, const float *u, const float *b, int64_t n, int kind,
                                int act, float *h, cudaStream_t stream);

/*
 * y[i] = x[i] / sqrt(sum x^2 / n + eps) * w[i] for i < n (w NULL: no weight),
 * the sum of squares accumulated in float.  y may alias x.  One block.
 */
cudaError_t si_cuda_rmsnorm(float *y, const float *x, const float *w, int64_t n, float eps,
                            cudaStream_t stream);

/*
 * LayerNorm, si_k_layernorm's twin: y[i] = (x[i] - mean) * scale * w[i] + b[i]
 * for i < n, scale = 1 / sqrt(var + eps), mean and variance (of x - mean)
 * accumulated in float (the twin: double).  w NULL: no weight; b NULL: no
 * bias.  y may alias x.  One block.
 */
cudaError_t si_cuda_layernorm(float *y, const float *x, const float *w, const float *b, int64_t n,
                              float eps, cudaStream_t stream);

/*
 * RoPE, si_k_rope's twin, for n_tok tokens: token t's n_heads heads of
 * head_dim floats at x + t * n_heads * head_dim, rotated in place to
 * position pos0 + t.  kind: enum si_rope_kind (SI_ROPE_NONE queues nothing);
 * n_rot even, at most head_dim.  The angles are the twin's own floats
 * (powf(base, -2 / n_rot) taken on the host, then the same multiplications);
 * only cosf and sinf differ in their last bits.  A block per head and token.
 */
cudaError_t si_cuda_rope(float *x, int64_t n_tok, int n_heads, int head_dim, int n_rot, int kind,
                         int pos0, float base, float scale, cudaStream_t stream);

/* The largest head_dim si_cuda_attn_f16 takes (a thread per dimension). */
#define SI_CUDA_ATTN_MAX_HEAD_DIM 1024

/*
 * Attention of one query over a layer's fp16 KV cache, si_k_attn_f16's twin
 * with the same arguments (q, out: n_head * head_dim floats; k, v: fp16
 * bits, position t at + t * n_head_kv * head_dim, kv head j at + j *
 * head_dim; positions first <= t < n_kv; query head h reads kv head
 * h / (n_head / n_head_kv)) and the same arithmetic: fp16 query, online
 * softmax, fp16 value accumulator rounded at every step.  Only the scores'
 * float summation order and expf's last bits differ, which can turn an
 * fp16 rounding of the accumulator the other way now and then.  A block per
 * query head; no scratch.
 */
cudaError_t si_cuda_attn_f16(float *out, const float *q, const uint16_t *k, const uint16_t *v,
                             int first, int n_kv, int n_head, int n_head_kv, int head_dim,
                             float scale, cudaStream_t stream);

/* y[i] = a[i] + b[i] for i < n (b NULL: y = a); y may alias a or b. */
cudaError_t si_cuda_add(float *y, const float *a, const float *b, int64_t n, cudaStream_t stream);

/* The most partial outputs si_cuda_residual adds (kernel parameters). */
#define SI_CUDA_MAX_PARTS 320

/*
 * A layer's input residual from the one before, as the engine's merge
 * computes it on the CPU (codelets/merge.c): s = parts[0][i] + parts[1][i]
 * + ... in that order, then + bias[i] (bias NULL: none), then x[i] = x[i] +
 * s, for i < n.  parts: a host array of n_parts (1 to SI_CUDA_MAX_PARTS)
 * device pointers.  Every sum is rounded as the CPU rounds it: the same
 * bits.
 */
cudaError_t si_cuda_residual(float *x, const float *const *parts, int n_parts, const float *bias,
                             int64_t n, cudaStream_t stream);

/* dst[i] = src[i] rounded to fp16 (to nearest even, as si_fp32_to_fp16),
 * for i < n: a position's keys or values into an fp16 cache. */
cudaError_t si_cuda_to_f16(uint16_t *dst, const float *src, int64_t n, cudaStream_t stream);

/*
 * The predictor, si_k_predictor's twin: hid = relu(fc1 x) (fc1: r rows of
 * n_embd elements), z = fc2 hid (fc2: n_ff rows of r elements), then idx =
 * the i with z[i] >= threshold in increasing order and *count their number
 * (one int32 on the device).  hid (r floats) is scratch, z (n_ff floats)
 * receives fc2's output, idx needs room for n_ff.  fc1 and fc2 may differ in
 * type; r must be a whole number of blocks of fc2's type.  Three kernels: a
 * warp per row for each product, then one block lists the neurons without
 * atomics (the same list every run).
 */
cudaError_t si_cuda_predictor(uint32_t fc1_type, const void *fc1, size_t fc1_stride,
                              uint32_t fc2_type, const void *fc2, size_t fc2_stride, int64_t n_embd,
                              int64_t r, int64_t n_ff, const float *x, float threshold, float *hid,
                              float *z, int32_t *idx, int32_t *count, cudaStream_t stream);

/*
 * The batched matrix product, si_k_gemm's twin: y[t][r] = row r of w . x[t]
 * for t < n_tok (token t at x + t * ldx and y + t * ldy floats).  F32 rows go
 * to cublasSgemm where they lie (row_stride a multiple of 4); F16, Q8_0,
 * Q4_0 and Q4_1 rows are decoded into an f32 tile in scratch (as many rows
 * as scratch_bytes holds, n_cols floats each) and multiplied by cublasSgemm,
 * tile after tile on `stream`: the decoding is exact, so only the float
 * summation order differs from the twin.  handle's stream is set to
 * `stream` and its pointer mode to host; cuBLAS errors come back as
 * cudaErrorInvalidValue, cudaErrorMemoryAllocation,
 * cudaErrorInitializationError or cudaErrorUnknown.
 */
cudaError_t si_cuda_gemm(cublasHandle_t handle, uint32_t type, const void *w, size_t row_stride,
                         int64_t n_rows, int64_t n_cols, const float *x, int64_t ldx, int64_t n_tok,
                         float *y, int64_t ldy, float *scratch, size_t scratch_bytes,
                         cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif /* SI_CODELETS_CODELETS_CUDA_H */
