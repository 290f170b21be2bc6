/* ffn_sparse_cuda.cu - the sparse FFN on CUDA devices: the active neurons'
 * gate/up activations, and the down projection over those neurons. */
#include "codelets/codelets_cuda.h"
#include "codelets/cuda_common.cuh"
#include "model/act.h"
#include "model/model.h"

#include <limits.h>

/* Active neurons per gate/up block: one warp each. */
#define GATE_UP_WARPS 8
/* Warps per down block; the block owns SI_CUDA_WARP output columns. */
#define DOWN_WARPS 8

/* h[k] for k = block * GATE_UP_WARPS + threadIdx.y: the warp dots neuron
 * idx[k]'s up row (and gate row) with x. */
template <int T>
static __global__ void gate_up_kernel(const uint8_t *gate, const uint8_t *up, size_t stride,
                                      int64_t n_ff, int64_t n_embd, const float *b, const float *x,
                                      const int32_t *idx, int n_idx, int kind, int act, float *h)
{
    const int lane = threadIdx.x;
    const int k = blockIdx.x * GATE_UP_WARPS + threadIdx.y;
    if (k >= n_idx) /* the whole warp leaves together */
        return;
    const int64_t i = idx[k];
    if (i < 0 || i >= n_ff) {
        if (lane == 0)
            h[k] = 0.0f;
        return;
    }
    float u = cu_warp_sum(cu_row_dot_lane<T>(up + (size_t)i * stride, x, n_embd, lane));
    if (b != NULL)
        u += b[i];
    float r;
    if (kind == SI_FFN_PLAIN) {
        r = si_act_apply((enum si_act)act, u);
    } else {
        const float g = cu_warp_sum(cu_row_dot_lane<T>(gate + (size_t)i * stride, x, n_embd, lane));
        r = si_act_gated((enum si_ffn_kind)kind, si_act_apply((enum si_act)act, g), u);
    }
    if (lane == 0)
        h[k] = r;
}

/*
 * y[c] for the SI_CUDA_WARP columns c of block blockIdx.x: lane = column,
 * warp threadIdx.y sums neurons k = y, y + DOWN_WARPS, ... in order, then
 * warp 0 adds the warps' partial sums in order: the result does not depend
 * on scheduling.  A warp reads 32 consecutive elements (one quantized block)
 * of each active row.
 */
template <int T>
static __global__ void down_kernel(const uint8_t *w, size_t stride, int64_t n_ff, int64_t n_embd,
                                   const float *h, const int32_t *idx, int n_idx, float *y)
{
    __shared__ float partial[DOWN_WARPS][SI_CUDA_WARP];
    const int lane = threadIdx.x, warp = threadIdx.y;
    const int64_t c = (int64_t)blockIdx.x * SI_CUDA_WARP + lane;
    float acc = 0.0f;
    if (c < n_embd) {
#pragma unroll 4
        for (int k = warp; k < n_idx; k += DOWN_WARPS) {
            const float hk = h[k];
            const int64_t i = idx[k];
            /* Zeros (ReLU's) are skipped, as the CPU kernel skips them. */
            if (hk != 0.0f && i >= 0 && i < n_ff)
                acc += hk * cu_row_elem<T>(w + (size_t)i * stride, c);
        }
    }
    partial[warp][lane] = acc;
    __syncthreads();
    if (warp == 0 && c < n_embd) {
        float s = 0.0f;
#pragma unroll
        for (int v = 0; v < DOWN_WARPS; v++)
            s += partial[v][lane];
        y[c] = s;
    }
}

template <int T>
static cudaError_t gate_up_launch(const void *gate, const void *up, size_t stride, int64_t n_ff,
                                  int64_t n_embd, const float *b, const float *x,
                                  const int32_t *idx, int n_idx, int kind, int act, float *h,
                                  cudaStream_t stream)
{
    const unsigned blocks = (unsigned)((n_idx + GATE_UP_WARPS - 1) / GATE_UP_WARPS);
    const dim3 threads(SI_CUDA_WARP, GATE_UP_WARPS);
    gate_up_kernel<T><<<blocks, threads, 0, stream>>>((const uint8_t *)gate, (const uint8_t *)up,
                                                      stride, n_ff, n_embd, b, x, idx, n_idx, kind,
                                                      act, h);
    return cudaGetLastError();
}

template <int T>
static cudaError_t down_launch(const void *w, size_t stride, int64_t n_ff, int64_t n_embd,
                               const float *h, const int32_t *idx, int n_idx, float *y,
                               cudaStream_t stream)
{
    const int64_t blocks = (n_embd + SI_CUDA_WARP - 1) / SI_CUDA_WARP;
    if (blocks > INT_MAX)
        return cudaErrorInvalidValue;
    const dim3 threads(SI_CUDA_WARP, DOWN_WARPS);
    down_kernel<T><<<(unsigned)blocks, threads, 0, stream>>>((const uint8_t *)w, stride, n_ff,
                                                             n_embd, h, idx, n_idx, y);
    return cudaGetLastError();
}

extern "C" cudaError_t si_cuda_ffn_gate_up(uint32_t type, const void *gate, const void *up,
                                           size_t row_stride, int64_t n_ff, int64_t n_embd,
                                           const float *b, const float *x, const int32_t *idx,
                                           int64_t n_idx, int kind, int act, float *h,
                                           cudaStream_t stream)
{
    if (kind != SI_FFN_GATED && kind != SI_FFN_GATED_RELU2 && kind != SI_FFN_PLAIN)
        return cudaErrorInvalidValue;
    if (act != SI_ACT_SILU && act != SI_ACT_RELU && act != SI_ACT_GELU)
        return cudaErrorInvalidValue;
    size_t gate_stride = row_stride;
    if (kind != SI_FFN_PLAIN && !cu_check_rows(type, gate, n_embd, &gate_stride))
        return cudaErrorInvalidValue;
    if (!cu_check_rows(type, up, n_embd, &row_stride) || n_ff < 0 || n_idx < 0 || n_idx > INT_MAX ||
        x == NULL || (n_idx > 0 && (idx == NULL || h == NULL)))
        return cudaErrorInvalidValue;
    if (n_idx == 0)
        return cudaSuccess;
    const int n = (int)n_idx;
    switch (type) {
    case SI_TYPE_F32:
        return gate_up_launch<SI_TYPE_F32>(gate, up, row_stride, n_ff, n_embd, b, x, idx, n, kind,
                                           act, h, stream);
    case SI_TYPE_F16:
        return gate_up_launch<SI_TYPE_F16>(gate, up, row_stride, n_ff, n_embd, b, x, idx, n, kind,
                                           act, h, stream);
    case SI_TYPE_Q8_0:
        return gate_up_launch<SI_TYPE_Q8_0>(gate, up, row_stride, n_ff, n_embd, b, x, idx, n, kind,
                                            act, h, stream);
    case SI_TYPE_Q4_0:
        return gate_up_launch<SI_TYPE_Q4_0>(gate, up, row_stride, n_ff, n_embd, b, x, idx, n, kind,
                                            act, h, stream);
    case SI_TYPE_Q4_1:
        return gate_up_launch<SI_TYPE_Q4_1>(gate, up, row_stride, n_ff, n_embd, b, x, idx, n, kind,
                                            act, h, stream);
    case SI_TYPE_Q4_K:
        return gate_up_launch<SI_TYPE_Q4_K>(gate, up, row_stride, n_ff, n_embd, b, x, idx, n, kind,
                                            act, h, stream);
    case SI_TYPE_Q5_K:
        return gate_up_launch<SI_TYPE_Q5_K>(gate, up, row_stride, n_ff, n_embd, b, x, idx, n, kind,
                                            act, h, stream);
    case SI_TYPE_Q6_K:
        return gate_up_launch<SI_TYPE_Q6_K>(gate, up, row_stride, n_ff, n_embd, b, x, idx, n, kind,
                                            act, h, stream);
    default:
        return cudaErrorInvalidValue;
    }
}

extern "C" cudaError_t si_cuda_ffn_down(uint32_t type, const void *down_t, size_t row_stride,
                                        int64_t n_ff, int64_t n_embd, const float *h,
                                        const int32_t *idx, int64_t n_idx, float *y,
                                        cudaStream_t stream)
{
    if (!cu_check_rows(type, down_t, n_embd, &row_stride) || n_ff < 0 || n_idx < 0 ||
        n_idx > INT_MAX || y == NULL || (n_idx > 0 && (idx == NULL || h == NULL)))
        return cudaErrorInvalidValue;
    const int n = (int)n_idx;
    switch (type) {
    case SI_TYPE_F32:
        return down_launch<SI_TYPE_F32>(down_t, row_stride, n_ff, n_embd, h, idx, n, y, stream);
    case SI_TYPE_F16:
        return down_launch<SI_TYPE_F16>(down_t, row_stride, n_ff, n_embd, h, idx, n, y, stream);
    case SI_TYPE_Q8_0:
        return down_launch<SI_TYPE_Q8_0>(down_t, row_stride, n_ff, n_embd, h, idx, n, y, stream);
    case SI_TYPE_Q4_0:
        return down_launch<SI_TYPE_Q4_0>(down_t, row_stride, n_ff, n_embd, h, idx, n, y, stream);
    case SI_TYPE_Q4_1:
        return down_launch<SI_TYPE_Q4_1>(down_t, row_stride, n_ff, n_embd, h, idx, n, y, stream);
    case SI_TYPE_Q4_K:
        return down_launch<SI_TYPE_Q4_K>(down_t, row_stride, n_ff, n_embd, h, idx, n, y, stream);
    case SI_TYPE_Q5_K:
        return down_launch<SI_TYPE_Q5_K>(down_t, row_stride, n_ff, n_embd, h, idx, n, y, stream);
    case SI_TYPE_Q6_K:
        return down_launch<SI_TYPE_Q6_K>(down_t, row_stride, n_ff, n_embd, h, idx, n, y, stream);
    default:
        return cudaErrorInvalidValue;
    }
}

/* h[i] from g[i] and u[i] as gate_up_kernel combines its two dots. */
static __global__ void combine_kernel(const float *g, const float *u, const float *b, int64_t n,
                                      int kind, int act, float *h)
{
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n)
        return;
    float v = u[i];
    if (b != NULL)
        v += b[i];
    float r;
    if (kind == SI_FFN_PLAIN) {
        r = si_act_apply((enum si_act)act, v);
    } else {
        r = si_act_gated((enum si_ffn_kind)kind, si_act_apply((enum si_act)act, g[i]), v);
    }
    h[i] = r;
}

extern "C" cudaError_t si_cuda_ffn_combine(const float *g, const float *u, const float *b,
                                           int64_t n, int kind, int act, float *h,
                                           cudaStream_t stream)
{
    if (kind != SI_FFN_GATED && kind != SI_FFN_GATED_RELU2 && kind != SI_FFN_PLAIN)
        return cudaErrorInvalidValue;
    if (act != SI_ACT_SILU && act != SI_ACT_RELU && act != SI_ACT_GELU)
        return cudaErrorInvalidValue;
    if (n < 0 || u == NULL || h == NULL || (kind != SI_FFN_PLAIN && g == NULL))
        return cudaErrorInvalidValue;
    if (n == 0)
        return cudaSuccess;
    const int threads = 256;
    combine_kernel<<<(unsigned)((n + threads - 1) / threads), threads, 0, stream>>>(g, u, b, n, kind,
                                                                                    act, h);
    return cudaGetLastError();
}
