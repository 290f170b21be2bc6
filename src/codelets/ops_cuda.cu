/* ops_cuda.cu - the PowerInfer predictor and the batched matrix product on
 * CUDA devices: the twins of si_k_predictor and si_k_gemm (codelets/ops.h). */
#include "codelets/codelets_cuda.h"
#include "codelets/cuda_common.cuh"
#include "model/act.h"
#include "model/model.h"

#include <limits.h>

/* Rows per block of the predictor's products: one warp each. */
#define PRED_WARPS 8
/* Threads of the single block that lists the active neurons. */
#define LIST_THREADS 1024
/* Threads per block of the dequantization into the gemm's tile. */
#define DEQUANT_THREADS 256

/* y[r] = row r . x (relu'd when asked); warp threadIdx.y of block b takes
 * row b * PRED_WARPS + y, as si_cuda_matvec does. */
template <int T>
static __global__ void rows_dot_kernel(const uint8_t *w, size_t stride, int64_t n_rows,
                                       int64_t n_cols, const float *x, float *y, bool relu)
{
    const int lane = threadIdx.x;
    const int64_t r = (int64_t)blockIdx.x * PRED_WARPS + threadIdx.y;
    if (r >= n_rows) /* the whole warp leaves together */
        return;
    const float s = cu_warp_sum(cu_row_dot_lane<T>(w + (size_t)r * stride, x, n_cols, lane));
    if (lane == 0)
        y[r] = relu ? si_act_apply(SI_ACT_RELU, s) : s;
}

template <int T>
static cudaError_t rows_dot_launch(const void *w, size_t stride, int64_t n_rows, int64_t n_cols,
                                   const float *x, float *y, bool relu, cudaStream_t stream)
{
    const int64_t blocks = (n_rows + PRED_WARPS - 1) / PRED_WARPS;
    if (blocks > INT_MAX)
        return cudaErrorInvalidValue;
    const dim3 threads(SI_CUDA_WARP, PRED_WARPS);
    rows_dot_kernel<T><<<(unsigned)blocks, threads, 0, stream>>>((const uint8_t *)w, stride,
                                                                 n_rows, n_cols, x, y, relu);
    return cudaGetLastError();
}

/* The type dispatch of rows_dot_launch (types checked by the caller). */
static cudaError_t rows_dot(uint32_t type, const void *w, size_t stride, int64_t n_rows,
                            int64_t n_cols, const float *x, float *y, bool relu,
                            cudaStream_t stream)
{
    if (n_rows == 0)
        return cudaSuccess;
    switch (type) {
    case SI_TYPE_F32:
        return rows_dot_launch<SI_TYPE_F32>(w, stride, n_rows, n_cols, x, y, relu, stream);
    case SI_TYPE_F16:
        return rows_dot_launch<SI_TYPE_F16>(w, stride, n_rows, n_cols, x, y, relu, stream);
    case SI_TYPE_Q8_0:
        return rows_dot_launch<SI_TYPE_Q8_0>(w, stride, n_rows, n_cols, x, y, relu, stream);
    case SI_TYPE_Q4_0:
        return rows_dot_launch<SI_TYPE_Q4_0>(w, stride, n_rows, n_cols, x, y, relu, stream);
    case SI_TYPE_Q4_1:
        return rows_dot_launch<SI_TYPE_Q4_1>(w, stride, n_rows, n_cols, x, y, relu, stream);
    case SI_TYPE_Q4_K:
        return rows_dot_launch<SI_TYPE_Q4_K>(w, stride, n_rows, n_cols, x, y, relu, stream);
    case SI_TYPE_Q5_K:
        return rows_dot_launch<SI_TYPE_Q5_K>(w, stride, n_rows, n_cols, x, y, relu, stream);
    case SI_TYPE_Q6_K:
        return rows_dot_launch<SI_TYPE_Q6_K>(w, stride, n_rows, n_cols, x, y, relu, stream);
    default:
        return cudaErrorInvalidValue;
    }
}

/*
 * One block lists the i < n with z[i] >= threshold in increasing order:
 * rounds of blockDim.x neurons, each thread testing one; a warp's ballot
 * ranks its lanes, the warps' counts (in shared memory) rank the warps, and
 * `base`, the same in every thread, carries the count of earlier rounds.
 * No atomics, so the list is in order and the same every run.
 */
static __global__ void list_kernel(const float *z, int64_t n, float threshold, int32_t *idx,
                                   int32_t *count)
{
    __shared__ int warp_count[LIST_THREADS / SI_CUDA_WARP];
    const int tid = threadIdx.x, lane = tid % SI_CUDA_WARP, warp = tid / SI_CUDA_WARP;
    const int n_warps = blockDim.x / SI_CUDA_WARP;
    int64_t base = 0;
    for (int64_t i0 = 0; i0 < n; i0 += blockDim.x) {
        const int64_t i = i0 + tid;
        const bool pass = i < n && z[i] >= threshold; /* NaN fails */
        const unsigned ballot = __ballot_sync(0xffffffffu, pass);
        if (lane == 0)
            warp_count[warp] = __popc(ballot);
        __syncthreads();
        int64_t before = __popc(ballot & ((1u << lane) - 1u)), total = 0;
        for (int w = 0; w < n_warps; w++) {
            before += w < warp ? warp_count[w] : 0;
            total += warp_count[w];
        }
        if (pass)
            idx[base + before] = (int32_t)i;
        base += total;
        __syncthreads(); /* warp_count is rewritten next round */
    }
    if (tid == 0)
        *count = (int32_t)base;
}

extern "C" cudaError_t si_cuda_predictor(uint32_t fc1_type, const void *fc1, size_t fc1_stride,
                                         uint32_t fc2_type, const void *fc2, size_t fc2_stride,
                                         int64_t n_embd, int64_t r, int64_t n_ff, const float *x,
                                         float threshold, float *hid, float *z, int32_t *idx,
                                         int32_t *count, cudaStream_t stream)
{
    if (!cu_check_rows(fc1_type, fc1, n_embd, &fc1_stride) ||
        !cu_check_rows(fc2_type, fc2, r, &fc2_stride) || n_embd <= 0 || r <= 0 || n_ff < 0 ||
        n_ff > INT32_MAX || x == NULL || hid == NULL || z == NULL || idx == NULL ||
        count == NULL)
        return cudaErrorInvalidValue;
    cudaError_t e = rows_dot(fc1_type, fc1, fc1_stride, r, n_embd, x, hid, true, stream);
    if (e == cudaSuccess)
        e = rows_dot(fc2_type, fc2, fc2_stride, n_ff, r, hid, z, false, stream);
    if (e != cudaSuccess)
        return e;
    list_kernel<<<1, LIST_THREADS, 0, stream>>>(z, n_ff, threshold, idx, count);
    return cudaGetLastError();
}

/* out[i][c] = element c of row r0 + i, for the rows of the tile (packed,
 * n_cols floats a row), decoded as si_dequantize_row decodes them. */
template <int T>
static __global__ void dequant_kernel(const uint8_t *w, size_t stride, int64_t n_rows,
                                      int64_t n_cols, float *out)
{
    const int64_t total = n_rows * n_cols;
    for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < total;
         e += (int64_t)gridDim.x * blockDim.x) {
        const int64_t r = e / n_cols, c = e - r * n_cols;
        out[e] = cu_row_elem<T>(w + (size_t)r * stride, c);
    }
}

static cudaError_t dequant(uint32_t type, const void *w, size_t stride, int64_t n_rows,
                          int64_t n_cols, float *out, cudaStream_t stream)
{
    int64_t blocks = (n_rows * n_cols + DEQUANT_THREADS - 1) / DEQUANT_THREADS;
    blocks = blocks > 4096 ? 4096 : blocks; /* the loop strides over the rest */
    const uint8_t *p = (const uint8_t *)w;
    switch (type) {
    case SI_TYPE_F16:
        dequant_kernel<SI_TYPE_F16><<<(unsigned)blocks, DEQUANT_THREADS, 0, stream>>>(
            p, stride, n_rows, n_cols, out);
        break;
    case SI_TYPE_Q8_0:
        dequant_kernel<SI_TYPE_Q8_0><<<(unsigned)blocks, DEQUANT_THREADS, 0, stream>>>(
            p, stride, n_rows, n_cols, out);
        break;
    case SI_TYPE_Q4_0:
        dequant_kernel<SI_TYPE_Q4_0><<<(unsigned)blocks, DEQUANT_THREADS, 0, stream>>>(
            p, stride, n_rows, n_cols, out);
        break;
    case SI_TYPE_Q4_1:
        dequant_kernel<SI_TYPE_Q4_1><<<(unsigned)blocks, DEQUANT_THREADS, 0, stream>>>(
            p, stride, n_rows, n_cols, out);
        break;
    case SI_TYPE_Q4_K:
        dequant_kernel<SI_TYPE_Q4_K><<<(unsigned)blocks, DEQUANT_THREADS, 0, stream>>>(
            p, stride, n_rows, n_cols, out);
        break;
    case SI_TYPE_Q5_K:
        dequant_kernel<SI_TYPE_Q5_K><<<(unsigned)blocks, DEQUANT_THREADS, 0, stream>>>(
            p, stride, n_rows, n_cols, out);
        break;
    case SI_TYPE_Q6_K:
        dequant_kernel<SI_TYPE_Q6_K><<<(unsigned)blocks, DEQUANT_THREADS, 0, stream>>>(
            p, stride, n_rows, n_cols, out);
        break;
    default:
        return cudaErrorInvalidValue;
    }
    return cudaGetLastError();
}

/* A cuBLAS status as the launchers' cudaError_t. */
static cudaError_t from_cublas(cublasStatus_t s)
{
    switch (s) {
    case CUBLAS_STATUS_SUCCESS:
        return cudaSuccess;
    case CUBLAS_STATUS_INVALID_VALUE:
        return cudaErrorInvalidValue;
    case CUBLAS_STATUS_ALLOC_FAILED:
        return cudaErrorMemoryAllocation;
    case CUBLAS_STATUS_NOT_INITIALIZED:
        return cudaErrorInitializationError;
    default:
        return cudaErrorUnknown;
    }
}

/*
 * cuBLAS is column-major: the row-major y (n_tok x n_rows, ldy) is the
 * column-major Y' (n_rows x n_tok), x likewise X' (n_cols x n_tok), and the
 * row-major weight rows are the columns of a column-major n_cols x n_rows
 * matrix, so Y' = op_T(W') X', m = rows, n = tokens, k = columns.
 */
static cudaError_t sgemm_rows(cublasHandle_t handle, const float *w, int64_t ldw, int64_t n_rows,
                              int64_t n_cols, const float *x, int64_t ldx, int64_t n_tok,
                              float *y, int64_t ldy)
{
    const float one = 1.0f, zero = 0.0f;
    return from_cublas(cublasSgemm(handle, CUBLAS_OP_T, CUBLAS_OP_N, (int)n_rows, (int)n_tok,
                                   (int)n_cols, &one, w, (int)ldw, x, (int)ldx, &zero, y,
                                   (int)ldy));
}

extern "C" cudaError_t si_cuda_gemm(cublasHandle_t handle, uint32_t type, const void *w,
                                    size_t row_stride, int64_t n_rows, int64_t n_cols,
                                    const float *x, int64_t ldx, int64_t n_tok, float *y,
                                    int64_t ldy, float *scratch, size_t scratch_bytes,
                                    cudaStream_t stream)
{
    if (handle == NULL || !cu_check_rows(type, w, n_cols, &row_stride) || n_cols <= 0 ||
        n_rows < 0 || n_tok < 0 || x == NULL || y == NULL || ldx < n_cols || ldy < n_rows)
        return cudaErrorInvalidValue;
    /* cuBLAS takes int dimensions and leading dimensions. */
    if (n_rows > INT_MAX || n_cols > INT_MAX || n_tok > INT_MAX || ldx > INT_MAX ||
        ldy > INT_MAX || row_stride / 4 > INT_MAX)
        return cudaErrorInvalidValue;
    const bool f32 = type == SI_TYPE_F32;
    const int64_t tile = f32 ? n_rows : (int64_t)(scratch_bytes / ((size_t)n_cols * sizeof(float)));
    if (!f32 && (scratch == NULL || tile < 1 || (uintptr_t)scratch % sizeof(float) != 0))
        return cudaErrorInvalidValue;
    if (n_rows == 0 || n_tok == 0)
        return cudaSuccess;
    cudaError_t e = from_cublas(cublasSetStream(handle, stream));
    if (e == cudaSuccess)
        e = from_cublas(cublasSetPointerMode(handle, CUBLAS_POINTER_MODE_HOST));
    if (e != cudaSuccess)
        return e;
    if (f32) /* cu_check_rows: 4-byte aligned rows, so the stride is whole floats */
        return sgemm_rows(handle, (const float *)w, (int64_t)(row_stride / sizeof(float)), n_rows,
                          n_cols, x, ldx, n_tok, y, ldy);
    /* Tile by tile on the one stream: the next dequantization into the
     * scratch starts after the previous product has read it. */
    for (int64_t r0 = 0; r0 < n_rows && e == cudaSuccess; r0 += tile) {
        const int64_t nr = n_rows - r0 < tile ? n_rows - r0 : tile;
        e = dequant(type, (const uint8_t *)w + (size_t)r0 * row_stride, row_stride, nr, n_cols,
                    scratch, stream);
        if (e == cudaSuccess)
            e = sgemm_rows(handle, scratch, n_cols, nr, n_cols, x, ldx, n_tok, y + r0, ldy);
    }
    return e;
}
