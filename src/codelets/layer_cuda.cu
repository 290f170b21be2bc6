/* layer_cuda.cu - LayerNorm, RoPE and single-query fp16 attention on CUDA
 * devices: the twins of si_k_layernorm, si_k_rope and si_k_attn_f16
 * (model/kernels.h). */
#include "codelets/codelets_cuda.h"
#include "codelets/cuda_common.cuh"
#include "model/model.h"

#include <limits.h>
#include <math.h>

/* Threads of the single LayerNorm block. */
#define LAYERNORM_THREADS 1024
/* Threads per RoPE block (one block per head and token, a thread per pair). */
#define ROPE_THREADS 64
/* Positions whose scores an attention block computes before walking them. */
#define ATTN_CHUNK 256

/*
 * Sum of v over the block (blockDim.x a multiple of the warp, at most 1024);
 * every thread gets it.  The warps reduce by shuffles, warp 0 reduces their
 * sums in a fixed order, so the result does not depend on scheduling.
 * Reusable back to back: a thread reaches the next call's write of partial
 * only after the barrier that follows warp 0's reads.
 */
static __device__ float block_sum(float v, float *partial, float *result)
{
    const int lane = threadIdx.x % SI_CUDA_WARP, warp = threadIdx.x / SI_CUDA_WARP;
    v = cu_warp_sum(v);
    if (lane == 0)
        partial[warp] = v;
    __syncthreads();
    if (warp == 0) {
        float s = lane < (int)(blockDim.x / SI_CUDA_WARP) ? partial[lane] : 0.0f;
        s = cu_warp_sum(s);
        if (lane == 0)
            *result = s;
    }
    __syncthreads();
    return *result;
}

/*
 * One block: the mean, then the variance of x - mean (two passes, as the
 * CPU twin, which keeps cancellation out of the variance), in float; then
 * every thread writes its own strided elements.  All reads of x precede the
 * barriers of the second sum, and each thread writes only the elements it
 * read, so y may alias x.
 */
static __global__ void layernorm_kernel(float *y, const float *x, const float *w, const float *b,
                                        int64_t n, float eps)
{
    __shared__ float partial[LAYERNORM_THREADS / SI_CUDA_WARP];
    __shared__ float result;
    const int tid = threadIdx.x;
    float s = 0.0f;
    for (int64_t i = tid; i < n; i += blockDim.x)
        s += x[i];
    const float mean = block_sum(s, partial, &result) / (float)n;
    float v = 0.0f;
    for (int64_t i = tid; i < n; i += blockDim.x)
        v += (x[i] - mean) * (x[i] - mean);
    const float scale = 1.0f / sqrtf(block_sum(v, partial, &result) / (float)n + eps);
    for (int64_t i = tid; i < n; i += blockDim.x) {
        const float t = w != NULL ? (x[i] - mean) * scale * w[i] : (x[i] - mean) * scale;
        y[i] = t + (b != NULL ? b[i] : 0.0f);
    }
}

extern "C" cudaError_t si_cuda_layernorm(float *y, const float *x, const float *w, const float *b,
                                         int64_t n, float eps, cudaStream_t stream)
{
    if (n < 0 || y == NULL || x == NULL)
        return cudaErrorInvalidValue;
    if (n == 0)
        return cudaSuccess;
    layernorm_kernel<<<1, LAYERNORM_THREADS, 0, stream>>>(y, x, w, b, n, eps);
    return cudaGetLastError();
}

/*
 * Block blockIdx.x = head + n_heads * token; thread i rotates pair i (and
 * i + blockDim.x, ...).  The angle is formed as the CPU twin forms it:
 * (float)pos, then i multiplications by theta_scale (computed once on the
 * host with the same powf), times scale, so both rotate by the same float
 * angle and differ only in the last bits of cosf and sinf.
 */
static __global__ void rope_kernel(float *x, int n_heads, int head_dim, int n_rot, int neox,
                                   int pos0, float theta_scale, float scale)
{
    const int h = blockIdx.x % n_heads, tok = blockIdx.x / n_heads;
    float *v = x + ((size_t)tok * n_heads + h) * (size_t)head_dim;
    const int half = n_rot / 2;
    for (int i = threadIdx.x; i < half; i += blockDim.x) {
        float theta = (float)(pos0 + tok);
        for (int j = 0; j < i; j++)
            theta *= theta_scale;
        float s, c;
        sincosf(__fmul_rn(scale, theta), &s, &c);
        const int a = neox ? i : 2 * i;
        const int b = neox ? i + half : 2 * i + 1;
        const float x0 = v[a], x1 = v[b];
        /* Rounded as the twin rounds (the same fused multiply-adds). */
        v[a] = __fmaf_rn(x0, c, -__fmul_rn(x1, s));
        v[b] = __fmaf_rn(x0, s, __fmul_rn(x1, c));
    }
}

extern "C" cudaError_t si_cuda_rope(float *x, int64_t n_tok, int n_heads, int head_dim, int n_rot,
                                    int kind, int pos0, float base, float scale,
                                    cudaStream_t stream)
{
    if (kind != SI_ROPE_NONE && kind != SI_ROPE_NORM && kind != SI_ROPE_NEOX)
        return cudaErrorInvalidValue;
    if (x == NULL || n_tok < 0 || n_heads < 0 || head_dim <= 0 || n_rot < 0 || n_rot % 2 != 0 ||
        n_rot > head_dim || pos0 < 0 || n_tok > (int64_t)INT_MAX - pos0)
        return cudaErrorInvalidValue;
    const int64_t blocks = n_tok * n_heads;
    if (blocks > INT_MAX)
        return cudaErrorInvalidValue;
    if (kind == SI_ROPE_NONE || blocks == 0 || n_rot == 0)
        return cudaSuccess;
    const float theta_scale = powf(base, -2.0f / (float)n_rot);
    rope_kernel<<<(unsigned)blocks, ROPE_THREADS, 0, stream>>>(
        x, n_heads, head_dim, n_rot, kind == SI_ROPE_NEOX, pos0, theta_scale, scale);
    return cudaGetLastError();
}

/*
 * One block per query head.  The query, rounded to fp16, waits in shared
 * memory.  Positions are taken ATTN_CHUNK at a time: first the block's warps
 * compute the chunk's scores (a warp per position, fp16 K times the fp16
 * query summed in float), then thread i < head_dim walks the chunk in order
 * with the CPU twin's online softmax for value dimension i: every thread
 * keeps the same M and S (same inputs, same operations), and its own fp16
 * accumulator (held in a float, rounded to fp16 at each step as the twin
 * rounds it).  S and the scaled score are formed with __fmul_rn/__fadd_rn so
 * that no multiply-add is fused where the twin rounds twice.
 */
static __global__ void attn_f16_kernel(float *out, const float *q, const uint16_t *k,
                                       const uint16_t *v, int first, int n_kv, int group,
                                       int n_head_kv, int head_dim, float scale)
{
    __shared__ float qs[SI_CUDA_ATTN_MAX_HEAD_DIM];
    __shared__ float sc[ATTN_CHUNK];
    const int h = blockIdx.x, tid = threadIdx.x;
    const int lane = tid % SI_CUDA_WARP, warp = tid / SI_CUDA_WARP;
    const int n_warps = blockDim.x / SI_CUDA_WARP;
    const size_t kvd = (size_t)n_head_kv * head_dim, koff = (size_t)(h / group) * head_dim;
    for (int i = tid; i < head_dim; i += blockDim.x)
        qs[i] = __half2float(__float2half_rn(q[(size_t)h * head_dim + i]));
    float acc = 0.0f, M = -INFINITY, S = 0.0f;
    for (int t0 = first; t0 < n_kv; t0 += ATTN_CHUNK) {
        const int nc = n_kv - t0 < ATTN_CHUNK ? n_kv - t0 : ATTN_CHUNK;
        __syncthreads(); /* qs written; the previous chunk's scores read */
        for (int c = warp; c < nc; c += n_warps) {
            const uint16_t *kt = k + (size_t)(t0 + c) * kvd + koff;
            float d = 0.0f;
            for (int i = lane; i < head_dim; i += SI_CUDA_WARP)
                d += __half2float(__ushort_as_half(kt[i])) * qs[i];
            d = cu_warp_sum(d);
            if (lane == 0)
                sc[c] = __fmul_rn(d, scale);
        }
        __syncthreads();
        if (tid < head_dim) {
            const uint16_t *vt = v + (size_t)t0 * kvd + koff + tid;
            for (int c = 0; c < nc; c++, vt += kvd) {
                const float s = sc[c];
                float ms = 1.0f, vs = 1.0f;
                if (s > M) {
                    const float m_old = M;
                    M = s;
                    ms = expf(m_old - M);
                    acc = __half2float(__float2half_rn(__fmul_rn(acc, ms)));
                } else {
                    vs = expf(s - M);
                }
                acc = __half2float(__float2half_rn(fmaf(__half2float(__ushort_as_half(*vt)), vs, acc)));
                S = __fadd_rn(__fmul_rn(S, ms), vs);
            }
        }
    }
    if (tid < head_dim)
        out[(size_t)h * head_dim + tid] = __fmul_rn(acc, S == 0.0f ? 0.0f : 1.0f / S);
}

extern "C" cudaError_t si_cuda_attn_f16(float *out, const float *q, const uint16_t *k,
                                        const uint16_t *v, int first, int n_kv, int n_head,
                                        int n_head_kv, int head_dim, float scale,
                                        cudaStream_t stream)
{
    if (out == NULL || q == NULL || k == NULL || v == NULL || first < 0 || n_kv < 0 ||
        n_head < 0 || n_head_kv <= 0 || n_head % n_head_kv != 0 || head_dim <= 0 ||
        head_dim > SI_CUDA_ATTN_MAX_HEAD_DIM || (uintptr_t)k % 2 != 0 || (uintptr_t)v % 2 != 0)
        return cudaErrorInvalidValue;
    if (n_head == 0)
        return cudaSuccess;
    /* A thread per value dimension, and at least 4 warps for the scores. */
    int threads = (head_dim + SI_CUDA_WARP - 1) / SI_CUDA_WARP * SI_CUDA_WARP;
    threads = threads < 4 * SI_CUDA_WARP ? 4 * SI_CUDA_WARP : threads;
    attn_f16_kernel<<<(unsigned)n_head, threads, 0, stream>>>(
        out, q, k, v, first, n_kv, n_head / n_head_kv, n_head_kv, head_dim, scale);
    return cudaGetLastError();
}

/* Threads per block of the element-wise kernels below. */
#define ELEM_THREADS 256

static unsigned elem_blocks(int64_t n)
{
    const int64_t b = (n + ELEM_THREADS - 1) / ELEM_THREADS;
    return (unsigned)(b < 65535 ? b : 65535);
}

static __global__ void add_kernel(float *y, const float *a, const float *b, int64_t n)
{
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x)
        y[i] = b != NULL ? __fadd_rn(a[i], b[i]) : a[i];
}

extern "C" cudaError_t si_cuda_add(float *y, const float *a, const float *b, int64_t n,
                                   cudaStream_t stream)
{
    if (n < 0 || y == NULL || a == NULL)
        return cudaErrorInvalidValue;
    if (n == 0 || (b == NULL && y == a))
        return cudaSuccess;
    add_kernel<<<elem_blocks(n), ELEM_THREADS, 0, stream>>>(y, a, b, n);
    return cudaGetLastError();
}

/* The parts' device pointers, passed by value (kernel parameters). */
struct residual_parts {
    const float *p[SI_CUDA_MAX_PARTS];
};

static __global__ void residual_kernel(float *x, struct residual_parts parts, int n_parts,
                                       const float *bias, int64_t n)
{
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x) {
        float s = parts.p[0][i];
        for (int j = 1; j < n_parts; j++)
            s = __fadd_rn(s, parts.p[j][i]);
        if (bias != NULL)
            s = __fadd_rn(s, bias[i]);
        x[i] = __fadd_rn(x[i], __fadd_rn(s, 0.0f));
    }
}

extern "C" cudaError_t si_cuda_residual(float *x, const float *const *parts, int n_parts,
                                        const float *bias, int64_t n, cudaStream_t stream)
{
    if (n < 0 || x == NULL || n_parts < 1 || n_parts > SI_CUDA_MAX_PARTS || parts == NULL)
        return cudaErrorInvalidValue;
    struct residual_parts p;
    for (int j = 0; j < n_parts; j++) {
        if (parts[j] == NULL)
            return cudaErrorInvalidValue;
        p.p[j] = parts[j];
    }
    if (n == 0)
        return cudaSuccess;
    residual_kernel<<<elem_blocks(n), ELEM_THREADS, 0, stream>>>(x, p, n_parts, bias, n);
    return cudaGetLastError();
}

static __global__ void to_f16_kernel(uint16_t *dst, const float *src, int64_t n)
{
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x)
        dst[i] = __half_as_ushort(__float2half_rn(src[i]));
}

extern "C" cudaError_t si_cuda_to_f16(uint16_t *dst, const float *src, int64_t n,
                                      cudaStream_t stream)
{
    if (n < 0 || dst == NULL || src == NULL || (uintptr_t)dst % 2 != 0)
        return cudaErrorInvalidValue;
    if (n == 0)
        return cudaSuccess;
    to_f16_kernel<<<elem_blocks(n), ELEM_THREADS, 0, stream>>>(dst, src, n);
    return cudaGetLastError();
}
