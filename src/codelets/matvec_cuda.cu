/* matvec_cuda.cu - dense matrix-vector product and RMSNorm on CUDA devices. */
#include "codelets/codelets_cuda.h"
#include "codelets/cuda_common.cuh"

#include <limits.h>

/* Rows per block of the matvec: one warp each. */
#define MATVEC_WARPS 8
/* Threads of the single RMSNorm block. */
#define RMSNORM_THREADS 1024

/* y[r] = row r . x; warp threadIdx.y of block b takes row b * MATVEC_WARPS + y. */
template <int T>
static __global__ void matvec_kernel(const uint8_t *w, size_t stride, int64_t n_rows,
                                     int64_t n_cols, const float *x, float *y)
{
    const int lane = threadIdx.x;
    const int64_t r = (int64_t)blockIdx.x * MATVEC_WARPS + threadIdx.y;
    if (r >= n_rows) /* the whole warp leaves together */
        return;
    const float s = cu_warp_sum(cu_row_dot_lane<T>(w + (size_t)r * stride, x, n_cols, lane));
    if (lane == 0)
        y[r] = s;
}

template <int T>
static cudaError_t matvec_launch(const void *w, size_t stride, int64_t n_rows, int64_t n_cols,
                                 const float *x, float *y, cudaStream_t stream)
{
    const int64_t blocks = (n_rows + MATVEC_WARPS - 1) / MATVEC_WARPS;
    if (blocks > INT_MAX)
        return cudaErrorInvalidValue;
    const dim3 threads(SI_CUDA_WARP, MATVEC_WARPS);
    matvec_kernel<T><<<(unsigned)blocks, threads, 0, stream>>>((const uint8_t *)w, stride, n_rows,
                                                               n_cols, x, y);
    return cudaGetLastError();
}

extern "C" cudaError_t si_cuda_matvec(uint32_t type, const void *w, size_t row_stride,
                                      int64_t n_rows, int64_t n_cols, const float *x, float *y,
                                      cudaStream_t stream)
{
    if (n_rows < 0 || !cu_check_rows(type, w, n_cols, &row_stride) || x == NULL || y == NULL)
        return cudaErrorInvalidValue;
    if (n_rows == 0)
        return cudaSuccess;
    switch (type) {
    case SI_TYPE_F32:
        return matvec_launch<SI_TYPE_F32>(w, row_stride, n_rows, n_cols, x, y, stream);
    case SI_TYPE_F16:
        return matvec_launch<SI_TYPE_F16>(w, row_stride, n_rows, n_cols, x, y, stream);
    case SI_TYPE_Q8_0:
        return matvec_launch<SI_TYPE_Q8_0>(w, row_stride, n_rows, n_cols, x, y, stream);
    case SI_TYPE_Q4_0:
        return matvec_launch<SI_TYPE_Q4_0>(w, row_stride, n_rows, n_cols, x, y, stream);
    case SI_TYPE_Q4_1:
        return matvec_launch<SI_TYPE_Q4_1>(w, row_stride, n_rows, n_cols, x, y, stream);
    case SI_TYPE_Q4_K:
        return matvec_launch<SI_TYPE_Q4_K>(w, row_stride, n_rows, n_cols, x, y, stream);
    case SI_TYPE_Q5_K:
        return matvec_launch<SI_TYPE_Q5_K>(w, row_stride, n_rows, n_cols, x, y, stream);
    case SI_TYPE_Q6_K:
        return matvec_launch<SI_TYPE_Q6_K>(w, row_stride, n_rows, n_cols, x, y, stream);
    default:
        return cudaErrorInvalidValue;
    }
}

/*
 * One block: each thread sums the squares of its strided elements, the warps
 * reduce by shuffles, warp 0 reduces the warps' sums; then every thread scales
 * its elements.  All reads of x happen before the barrier that precedes the
 * writes, so y may alias x.
 */
static __global__ void rmsnorm_kernel(float *y, const float *x, const float *w, int64_t n,
                                      float eps)
{
    __shared__ float partial[RMSNORM_THREADS / SI_CUDA_WARP];
    __shared__ float scale;
    const int tid = threadIdx.x, lane = tid % SI_CUDA_WARP, warp = tid / SI_CUDA_WARP;
    float ss = 0.0f;
    for (int64_t i = tid; i < n; i += blockDim.x)
        ss += x[i] * x[i];
    ss = cu_warp_sum(ss);
    if (lane == 0)
        partial[warp] = ss;
    __syncthreads();
    if (warp == 0) {
        float v = lane < (int)(blockDim.x / SI_CUDA_WARP) ? partial[lane] : 0.0f;
        v = cu_warp_sum(v);
        if (lane == 0)
            scale = 1.0f / sqrtf(v / (float)n + eps);
    }
    __syncthreads();
    const float s = scale;
    for (int64_t i = tid; i < n; i += blockDim.x)
        y[i] = w != NULL ? x[i] * s * w[i] : x[i] * s;
}

extern "C" cudaError_t si_cuda_rmsnorm(float *y, const float *x, const float *w, int64_t n,
                                       float eps, cudaStream_t stream)
{
    if (n < 0 || y == NULL || x == NULL)
        return cudaErrorInvalidValue;
    if (n == 0)
        return cudaSuccess;
    rmsnorm_kernel<<<1, RMSNORM_THREADS, 0, stream>>>(y, x, w, n, eps);
    return cudaGetLastError();
}

/*
 * Host twins of the decoders (cuda_common.cuh), for tests/test-cuda-decode
 * on machines without a GPU: the same functions, run on the CPU, the
 * warp's sum of the 32 lane shares done in cu_warp_sum's order (lane l
 * adds lane l ^ o's value, o = 16, 8, ..., 1).  A GPU may still round its
 * products differently (nvcc contracts multiply-adds into FMAs).
 */
template <int T> static float host_dot(const uint8_t *row, const float *x, int64_t n)
{
    float v[SI_CUDA_WARP], w[SI_CUDA_WARP];
    for (int l = 0; l < SI_CUDA_WARP; l++)
        v[l] = cu_row_dot_lane<T>(row, x, n, l);
    for (int o = SI_CUDA_WARP / 2; o > 0; o >>= 1) {
        for (int l = 0; l < SI_CUDA_WARP; l++)
            w[l] = v[l] + v[l ^ o];
        for (int l = 0; l < SI_CUDA_WARP; l++)
            v[l] = w[l];
    }
    return v[0];
}

/* Type T's host twin: the n elements into elems, or row . x into *dot. */
template <int T>
static void host_row(const uint8_t *row, const float *x, int64_t n, float *elems, float *dot)
{
    if (elems != NULL)
        for (int64_t j = 0; j < n; j++)
            elems[j] = cu_row_elem<T>(row, j);
    else
        *dot = host_dot<T>(row, x, n);
}

/* The twin of row's type, after the launchers' checks; 0, or -1. */
static int host_twin(uint32_t type, const void *row, const float *x, int64_t n, float *elems,
                     float *dot)
{
    size_t stride = 0;
    if (!cu_check_rows(type, row, n, &stride))
        return -1;
    const uint8_t *r = (const uint8_t *)row;
    switch (type) {
    case SI_TYPE_F32:
        host_row<SI_TYPE_F32>(r, x, n, elems, dot);
        return 0;
    case SI_TYPE_F16:
        host_row<SI_TYPE_F16>(r, x, n, elems, dot);
        return 0;
    case SI_TYPE_Q8_0:
        host_row<SI_TYPE_Q8_0>(r, x, n, elems, dot);
        return 0;
    case SI_TYPE_Q4_0:
        host_row<SI_TYPE_Q4_0>(r, x, n, elems, dot);
        return 0;
    case SI_TYPE_Q4_1:
        host_row<SI_TYPE_Q4_1>(r, x, n, elems, dot);
        return 0;
    case SI_TYPE_Q4_K:
        host_row<SI_TYPE_Q4_K>(r, x, n, elems, dot);
        return 0;
    case SI_TYPE_Q5_K:
        host_row<SI_TYPE_Q5_K>(r, x, n, elems, dot);
        return 0;
    case SI_TYPE_Q6_K:
        host_row<SI_TYPE_Q6_K>(r, x, n, elems, dot);
        return 0;
    default:
        return -1;
    }
}

extern "C" int si__cuda_host_row_dot(uint32_t type, const void *row, const float *x, int64_t n,
                                     float *out)
{
    return x == NULL || out == NULL ? -1 : host_twin(type, row, x, n, NULL, out);
}

extern "C" int si__cuda_host_row_elems(uint32_t type, const void *row, int64_t n, float *out)
{
    return out == NULL ? -1 : host_twin(type, row, NULL, n, out, NULL);
}
