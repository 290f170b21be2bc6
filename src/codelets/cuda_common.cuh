/*
 * cuda_common.cuh - device helpers shared by the CUDA kernels: fp16 decode,
 * warp reductions, and the weight-row decoders for F32, F16, Q8_0, Q4_0,
 * Q4_1 and the K super-blocks Q4_K, Q5_K, Q6_K (GGUF block layouts, as in
 * model/quants_scalar.c):
 *
 *   Q8_0  34 bytes / 32: half d; int8 qs[32]       x = d*q
 *   Q4_0  18 bytes / 32: half d; u8 qs[16]         x = d*(q-8)
 *   Q4_1  20 bytes / 32: half d, m; u8 qs[16]      x = d*q + m
 *   Q4_K 144 bytes / 256: half d, dmin; u8 scales[12]; u8 qs[128]
 *   Q5_K 176 bytes / 256: half d, dmin; u8 scales[12]; u8 qh[32]; u8 qs[128]
 *        x = d*s_j*q - dmin*m_j for sub-block j = e / 32, (s_j, m_j) 6-bit
 *        pairs packed in scales (si__k_scale_min); element e = 64c + 32h + l
 *        is nibble h of qs[32c + l] (Q5_K: bit 2c + h of qh[l] its fifth bit)
 *   Q6_K 210 bytes / 256: u8 ql[128]; u8 qh[64]; int8 sc[16]; half d
 *        x = d*sc[e / 16]*(q-32); element e = 128k + 32g + l is nibble g / 2
 *        of ql[64k + 32(g & 1) + l] with bits 2g, 2g+1 of qh[32k + l] above
 *
 * In Q4_0 and Q4_1, element j < 16 is the low nibble of qs[j] and element
 * j + 16 its high nibble.  Rows are read with 16-bit loads (32-bit for F32):
 * a row must start at an even address (a multiple of 4 for F32), which GGUF's
 * 32-byte tensor alignment and even block sizes guarantee.
 *
 * Everything here is static and inline: the header has no symbols of its
 * own and may be included by any number of .cu files.  The decoders are
 * host code too (`__host__ __device__`; only the warp sum is device code):
 * their host twins (si__cuda_host_row_elem, si__cuda_host_row_dot in
 * matvec_cuda.cu) let tests/test-cuda-decode check them against the scalar
 * oracle on machines without a GPU.
 */
#ifndef SI_CODELETS_CUDA_COMMON_CUH
#define SI_CODELETS_CUDA_COMMON_CUH

#include "model/types.h"

#include <cuda_fp16.h>
#include <stddef.h>
#include <stdint.h>

#define SI_CUDA_WARP 32

/* The decoders: inline host and device code. */
#define SI_CU_HD __host__ __device__ __forceinline__

/* Unrolling asked of the device compiler only: the host pass of the
 * decoders (their host twins) would warn about an unknown pragma. */
#ifdef __CUDA_ARCH__
#define SI_CU_UNROLL _Pragma("unroll")
#else
#define SI_CU_UNROLL
#endif

/* Bytes per 32-element block of the quantized types. */
#define SI_CUDA_Q8_0_BYTES 34
#define SI_CUDA_Q4_0_BYTES 18
#define SI_CUDA_Q4_1_BYTES 20
/* Bytes per 256-element super-block of the K types. */
#define SI_CUDA_Q4_K_BYTES 144
#define SI_CUDA_Q5_K_BYTES 176
#define SI_CUDA_Q6_K_BYTES 210

/* The IEEE half at p (p 2-byte aligned) as a float; exact. */
static SI_CU_HD float cu_half_at(const uint8_t *p)
{
    return __half2float(__ushort_as_half(*(const uint16_t *)p));
}

/* Sum of v over the 32 lanes of a full warp; every lane gets the sum. */
static __device__ __forceinline__ float cu_warp_sum(float v)
{
#pragma unroll
    for (int o = SI_CUDA_WARP / 2; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

/*
 * This lane's share of row . x for a row of n elements of type T; the warp's
 * 32 shares summed (cu_warp_sum) give the dot.  F32 and F16 lanes take
 * elements lane, lane + 32, ...; the quantized types are cut into 8-element
 * "units" (a quarter of a block), lane taking units lane, lane + 32, ..., so
 * that a warp reads 8 consecutive blocks at a time.
 */
template <int T>
static SI_CU_HD float cu_row_dot_lane(const uint8_t *row, const float *x, int64_t n, int lane);

template <>
SI_CU_HD float cu_row_dot_lane<SI_TYPE_F32>(const uint8_t *row, const float *x, int64_t n, int lane)
{
    const float *w = (const float *)row;
    float s0 = 0.0f, s1 = 0.0f;
    int64_t i = lane;
    for (; i + SI_CUDA_WARP < n; i += 2 * SI_CUDA_WARP) {
        s0 += w[i] * x[i];
        s1 += w[i + SI_CUDA_WARP] * x[i + SI_CUDA_WARP];
    }
    if (i < n)
        s0 += w[i] * x[i];
    return s0 + s1;
}

template <>
SI_CU_HD float cu_row_dot_lane<SI_TYPE_F16>(const uint8_t *row, const float *x, int64_t n, int lane)
{
    const uint16_t *w = (const uint16_t *)row;
    float s0 = 0.0f, s1 = 0.0f;
    int64_t i = lane;
    for (; i + SI_CUDA_WARP < n; i += 2 * SI_CUDA_WARP) {
        s0 += __half2float(__ushort_as_half(w[i])) * x[i];
        s1 += __half2float(__ushort_as_half(w[i + SI_CUDA_WARP])) * x[i + SI_CUDA_WARP];
    }
    if (i < n)
        s0 += __half2float(__ushort_as_half(w[i])) * x[i];
    return s0 + s1;
}

template <>
SI_CU_HD float cu_row_dot_lane<SI_TYPE_Q8_0>(const uint8_t *row, const float *x, int64_t n,
                                             int lane)
{
    const int64_t units = n / 8;
    float s = 0.0f;
    for (int64_t u = lane; u < units; u += SI_CUDA_WARP) {
        const int64_t b = u >> 2;
        const int q = (int)(u & 3);
        const uint8_t *p = row + b * SI_CUDA_Q8_0_BYTES;
        const uint16_t *qs = (const uint16_t *)(p + 2 + 8 * q);
        const float *xs = x + b * 32 + 8 * q;
        float t = 0.0f;
        SI_CU_UNROLL
        for (int j = 0; j < 4; j++) {
            const uint16_t v = qs[j];
            t += (float)(int8_t)(v & 0xff) * xs[2 * j] + (float)(int8_t)(v >> 8) * xs[2 * j + 1];
        }
        s += cu_half_at(p) * t;
    }
    return s;
}

template <>
SI_CU_HD float cu_row_dot_lane<SI_TYPE_Q4_0>(const uint8_t *row, const float *x, int64_t n,
                                             int lane)
{
    const int64_t units = n / 8;
    float s = 0.0f;
    for (int64_t u = lane; u < units; u += SI_CUDA_WARP) {
        const int64_t b = u >> 2;
        const int q = (int)(u & 3);
        const uint8_t *p = row + b * SI_CUDA_Q4_0_BYTES;
        const uint16_t *qs = (const uint16_t *)(p + 2 + 4 * q);
        const float *lo = x + b * 32 + 4 * q; /* elements 4q .. 4q+3 */
        const float *hi = lo + 16;            /* elements 16+4q .. 16+4q+3 */
        float t = 0.0f;
        SI_CU_UNROLL
        for (int j = 0; j < 2; j++) {
            const uint16_t v = qs[j];
            t += (float)((int)(v & 0xf) - 8) * lo[2 * j] +
                 (float)((int)((v >> 4) & 0xf) - 8) * hi[2 * j] +
                 (float)((int)((v >> 8) & 0xf) - 8) * lo[2 * j + 1] +
                 (float)((int)(v >> 12) - 8) * hi[2 * j + 1];
        }
        s += cu_half_at(p) * t;
    }
    return s;
}

template <>
SI_CU_HD float cu_row_dot_lane<SI_TYPE_Q4_1>(const uint8_t *row, const float *x, int64_t n,
                                             int lane)
{
    const int64_t units = n / 8;
    float s = 0.0f;
    for (int64_t u = lane; u < units; u += SI_CUDA_WARP) {
        const int64_t b = u >> 2;
        const int q = (int)(u & 3);
        const uint8_t *p = row + b * SI_CUDA_Q4_1_BYTES;
        const uint16_t *qs = (const uint16_t *)(p + 4 + 4 * q);
        const float *lo = x + b * 32 + 4 * q;
        const float *hi = lo + 16;
        float t = 0.0f, sx = 0.0f;
        SI_CU_UNROLL
        for (int j = 0; j < 2; j++) {
            const uint16_t v = qs[j];
            t += (float)(v & 0xf) * lo[2 * j] + (float)((v >> 4) & 0xf) * hi[2 * j] +
                 (float)((v >> 8) & 0xf) * lo[2 * j + 1] + (float)(v >> 12) * hi[2 * j + 1];
            sx += lo[2 * j] + hi[2 * j] + lo[2 * j + 1] + hi[2 * j + 1];
        }
        /* sum (d*q + m) * x = d * sum q*x + m * sum x */
        s += cu_half_at(p) * t + cu_half_at(p + 2) * sx;
    }
    return s;
}

/* Sub-block j's 6-bit scale and min of a Q4_K/Q5_K super-block's scales. */
static SI_CU_HD void cu_k_scale_min(const uint8_t *sc, int j, int *s, int *m)
{
    if (j < 4) {
        *s = sc[j] & 63;
        *m = sc[j + 4] & 63;
    } else {
        *s = (sc[j + 4] & 0xf) | (sc[j - 4] >> 6) << 4;
        *m = (sc[j + 4] >> 4) | (sc[j] >> 6) << 4;
    }
}

/* The quant (0 .. 31) of element e of a Q4_K (qh NULL) or Q5_K super-block. */
static SI_CU_HD int cu_k_quant(const uint8_t *qs, const uint8_t *qh, int e)
{
    const int c = e >> 6, h = (e >> 5) & 1, l = e & 31;
    const uint8_t v = qs[32 * c + l];
    int q = h ? v >> 4 : v & 0xf;
    if (qh != NULL)
        q |= ((qh[l] >> (2 * c + h)) & 1) << 4;
    return q;
}

/* The signed quant (-32 .. 31) of element e of a Q6_K super-block. */
static SI_CU_HD int cu_q6_k_quant(const uint8_t *p, int e)
{
    const int k = e >> 7, g = (e >> 5) & 3, l = e & 31;
    const uint8_t v = p[64 * k + 32 * (g & 1) + l];
    const int lo = g >= 2 ? v >> 4 : v & 0xf;
    return (lo | ((p[128 + 32 * k + l] >> (2 * g)) & 3) << 4) - 32;
}

/* Q4_K and Q5_K: a unit's 8 elements lie in one sub-block of 32, so
 * d*s_j * sum(q*x) - dmin*m_j * sum(x); a warp covers one super-block. */
template <int FIVE>
static SI_CU_HD float cu_k_dot_lane(const uint8_t *row, const float *x, int64_t n, int lane)
{
    const size_t size = FIVE ? SI_CUDA_Q5_K_BYTES : SI_CUDA_Q4_K_BYTES;
    const int64_t units = n / 8;
    float s = 0.0f;
    for (int64_t u = lane; u < units; u += SI_CUDA_WARP) {
        const int64_t b = u >> 5;
        const int e0 = (int)(u & 31) * 8;
        const uint8_t *p = row + b * size;
        const uint8_t *qh = FIVE ? p + 16 : NULL, *qs = FIVE ? p + 48 : p + 16;
        int sc, m;
        cu_k_scale_min(p + 4, e0 >> 5, &sc, &m);
        const float *xs = x + b * 256 + e0;
        float t = 0.0f, sx = 0.0f;
        SI_CU_UNROLL
        for (int k = 0; k < 8; k++) {
            t += (float)cu_k_quant(qs, qh, e0 + k) * xs[k];
            sx += xs[k];
        }
        s += cu_half_at(p) * (float)sc * t - cu_half_at(p + 2) * (float)m * sx;
    }
    return s;
}

template <>
SI_CU_HD float cu_row_dot_lane<SI_TYPE_Q4_K>(const uint8_t *row, const float *x, int64_t n,
                                             int lane)
{
    return cu_k_dot_lane<0>(row, x, n, lane);
}

template <>
SI_CU_HD float cu_row_dot_lane<SI_TYPE_Q5_K>(const uint8_t *row, const float *x, int64_t n,
                                             int lane)
{
    return cu_k_dot_lane<1>(row, x, n, lane);
}

/* Q6_K: a unit's 8 elements share one scale of 16. */
template <>
SI_CU_HD float cu_row_dot_lane<SI_TYPE_Q6_K>(const uint8_t *row, const float *x, int64_t n,
                                             int lane)
{
    const int64_t units = n / 8;
    float s = 0.0f;
    for (int64_t u = lane; u < units; u += SI_CUDA_WARP) {
        const int64_t b = u >> 5;
        const int e0 = (int)(u & 31) * 8;
        const uint8_t *p = row + b * SI_CUDA_Q6_K_BYTES;
        const float *xs = x + b * 256 + e0;
        float t = 0.0f;
        SI_CU_UNROLL
        for (int k = 0; k < 8; k++)
            t += (float)cu_q6_k_quant(p, e0 + k) * xs[k];
        s += cu_half_at(p + 208) * (float)(int8_t)p[192 + (e0 >> 4)] * t;
    }
    return s;
}

/* Element j of a row of type T (for the column-wise down projection). */
template <int T> static SI_CU_HD float cu_row_elem(const uint8_t *row, int64_t j);

template <> SI_CU_HD float cu_row_elem<SI_TYPE_F32>(const uint8_t *row, int64_t j)
{
    return ((const float *)row)[j];
}

template <> SI_CU_HD float cu_row_elem<SI_TYPE_F16>(const uint8_t *row, int64_t j)
{
    return __half2float(__ushort_as_half(((const uint16_t *)row)[j]));
}

template <> SI_CU_HD float cu_row_elem<SI_TYPE_Q8_0>(const uint8_t *row, int64_t j)
{
    const uint8_t *p = row + (j >> 5) * SI_CUDA_Q8_0_BYTES;
    return cu_half_at(p) * (float)(int8_t)p[2 + (j & 31)];
}

template <> SI_CU_HD float cu_row_elem<SI_TYPE_Q4_0>(const uint8_t *row, int64_t j)
{
    const uint8_t *p = row + (j >> 5) * SI_CUDA_Q4_0_BYTES;
    const int e = (int)(j & 31);
    const uint8_t v = p[2 + (e & 15)];
    const int q = e < 16 ? (v & 0xf) : (v >> 4);
    return cu_half_at(p) * (float)(q - 8);
}

template <> SI_CU_HD float cu_row_elem<SI_TYPE_Q4_1>(const uint8_t *row, int64_t j)
{
    const uint8_t *p = row + (j >> 5) * SI_CUDA_Q4_1_BYTES;
    const int e = (int)(j & 31);
    const uint8_t v = p[4 + (e & 15)];
    const int q = e < 16 ? (v & 0xf) : (v >> 4);
    return cu_half_at(p) * (float)q + cu_half_at(p + 2);
}

template <> SI_CU_HD float cu_row_elem<SI_TYPE_Q4_K>(const uint8_t *row, int64_t j)
{
    const uint8_t *p = row + (j >> 8) * SI_CUDA_Q4_K_BYTES;
    const int e = (int)(j & 255);
    int sc, m;
    cu_k_scale_min(p + 4, e >> 5, &sc, &m);
    return cu_half_at(p) * (float)sc * (float)cu_k_quant(p + 16, NULL, e) -
           cu_half_at(p + 2) * (float)m;
}

template <> SI_CU_HD float cu_row_elem<SI_TYPE_Q5_K>(const uint8_t *row, int64_t j)
{
    const uint8_t *p = row + (j >> 8) * SI_CUDA_Q5_K_BYTES;
    const int e = (int)(j & 255);
    int sc, m;
    cu_k_scale_min(p + 4, e >> 5, &sc, &m);
    return cu_half_at(p) * (float)sc * (float)cu_k_quant(p + 48, p + 16, e) -
           cu_half_at(p + 2) * (float)m;
}

template <> SI_CU_HD float cu_row_elem<SI_TYPE_Q6_K>(const uint8_t *row, int64_t j)
{
    const uint8_t *p = row + (j >> 8) * SI_CUDA_Q6_K_BYTES;
    const int e = (int)(j & 255);
    return cu_half_at(p + 208) * (float)(int8_t)p[192 + (e >> 4)] * (float)cu_q6_k_quant(p, e);
}

/*
 * Bytes of a row of n elements of type t, and the alignment its loads need;
 * 0 when t is not one of the eight types or n is not a whole number of blocks.
 */
static inline size_t cu_row_bytes(uint32_t t, int64_t n, size_t *align)
{
    if (n < 0)
        return 0;
    switch (t) {
    case SI_TYPE_F32:
        *align = 4;
        return (size_t)n * 4;
    case SI_TYPE_F16:
        *align = 2;
        return (size_t)n * 2;
    case SI_TYPE_Q8_0:
        *align = 2;
        return n % 32 ? 0 : (size_t)(n / 32) * SI_CUDA_Q8_0_BYTES;
    case SI_TYPE_Q4_0:
        *align = 2;
        return n % 32 ? 0 : (size_t)(n / 32) * SI_CUDA_Q4_0_BYTES;
    case SI_TYPE_Q4_1:
        *align = 2;
        return n % 32 ? 0 : (size_t)(n / 32) * SI_CUDA_Q4_1_BYTES;
    case SI_TYPE_Q4_K:
        *align = 2;
        return n % 256 ? 0 : (size_t)(n / 256) * SI_CUDA_Q4_K_BYTES;
    case SI_TYPE_Q5_K:
        *align = 2;
        return n % 256 ? 0 : (size_t)(n / 256) * SI_CUDA_Q5_K_BYTES;
    case SI_TYPE_Q6_K:
        *align = 2;
        return n % 256 ? 0 : (size_t)(n / 256) * SI_CUDA_Q6_K_BYTES;
    default:
        return 0;
    }
}

/*
 * Check a weight matrix's description for the launchers: type supported,
 * n_cols a whole number of blocks, w and the row stride aligned, the stride
 * at least a row.  *stride is set to the row size when it is 0 (packed rows).
 */
static inline bool cu_check_rows(uint32_t t, const void *w, int64_t n_cols, size_t *stride)
{
    size_t align = 1;
    const size_t bytes = cu_row_bytes(t, n_cols, &align);
    if (bytes == 0 || w == NULL)
        return false;
    if (*stride == 0)
        *stride = bytes;
    return *stride >= bytes && *stride % align == 0 && (uintptr_t)w % align == 0;
}

#endif /* SI_CODELETS_CUDA_COMMON_CUH */
