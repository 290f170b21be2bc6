/*
 * test-cuda-kernels.c - the raw CUDA launchers of codelets_cuda.h (matvec,
 * sparse FFN gate/up and down, RMSNorm) against plain C, without StarPU.
 *
 * For each kernel and weight type (F32, F16, Q8_0, Q4_0, Q4_1): random data,
 * quantized with si_quantize_row(), copied to the device and run on a stream
 * of its own; the reference is computed in double from the rows as
 * si_dequantize_row() decodes them.  The error of each output is normalised
 * by the sum of the magnitudes of the products that form it (for h = act(g)*u,
 * by the product of g's and u's), so cancellation does not inflate it:
 *
 *   max_k |gpu_k - ref_k| / scale_k  <=  1e-4 for F32 and F16 rows,
 *                                         1e-3 for Q8_0, Q4_0 and Q4_1 rows.
 *
 * (Both sides decode the same blocks exactly; what differs is the order of
 * float accumulation, which costs about sqrt(n) * 2^-24.)  The down projection
 * is also run twice and must give identical bits.  Exits 77 (SKIP) when the
 * CUDA runtime finds no device.
 */
#include "codelets/codelets_cuda.h"
#include "model/model.h"
#include "model/quants.h"
#include "model/types.h"
#include "test.h"

#include <cuda_runtime_api.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define TOL_FLOAT 1e-4 /* F32, F16 rows */
#define TOL_QUANT 1e-3 /* Q8_0, Q4_0, Q4_1 rows */

static const uint32_t types[] = {SI_TYPE_F32, SI_TYPE_F16, SI_TYPE_Q8_0, SI_TYPE_Q4_0,
                                 SI_TYPE_Q4_1};
#define N_TYPES (sizeof types / sizeof types[0])

static double tolerance(uint32_t t)
{
    return t == SI_TYPE_F32 || t == SI_TYPE_F16 ? TOL_FLOAT : TOL_QUANT;
}

static uint32_t rng_state = 12345u;

/* Uniform in [-1, 1). */
static float frand(void)
{
    rng_state = rng_state * 1103515245u + 12345u;
    return (float)((rng_state >> 8) & 0xffff) / 32768.0f - 1.0f;
}

static void fill(float *v, int64_t n, float amp)
{
    for (int64_t i = 0; i < n; i++)
        v[i] = amp * frand();
}

/* A weight matrix on the host: its rows of `type` (row_stride bytes apart)
 * and the values they decode to. */
struct rows {
    uint32_t type;
    int64_t n_rows, n_cols;
    size_t stride;
    uint8_t *data; /* n_rows * stride bytes */
    float *deq;    /* n_rows * n_cols, from si_dequantize_row */
};

/* Random rows quantized to t; `pad` bytes between rows (a multiple of 4). */
static void rows_make(struct rows *m, uint32_t t, int64_t n_rows, int64_t n_cols, size_t pad)
{
    size_t bytes = 0;
    if (!si_type_row_size(t, n_cols, &bytes)) {
        fprintf(stderr, "bad row size %s x %lld\n", si_type_name(t), (long long)n_cols);
        exit(1);
    }
    m->type = t;
    m->n_rows = n_rows;
    m->n_cols = n_cols;
    m->stride = bytes + pad;
    m->data = calloc((size_t)n_rows, m->stride);
    m->deq = malloc((size_t)(n_rows * n_cols) * sizeof(float));
    float *src = malloc((size_t)n_cols * sizeof(float));
    if (m->data == NULL || m->deq == NULL || src == NULL) {
        fprintf(stderr, "out of memory\n");
        exit(1);
    }
    for (int64_t r = 0; r < n_rows; r++) {
        fill(src, n_cols, 0.5f);
        uint8_t *row = m->data + (size_t)r * m->stride;
        si_quantize_row(t, src, row, n_cols);
        si_dequantize_row(t, row, m->deq + (size_t)(r * n_cols), n_cols);
    }
    free(src);
}

static void rows_free(struct rows *m)
{
    free(m->data);
    free(m->deq);
}

/* The dot of row r with x in double into *dot, and the sum of |w_i x_i| into *mag. */
static void ref_dot(const struct rows *m, int64_t r, const float *x, double *dot, double *mag)
{
    const float *w = m->deq + (size_t)(r * m->n_cols);
    double s = 0.0, a = 0.0;
    for (int64_t i = 0; i < m->n_cols; i++) {
        s += (double)w[i] * (double)x[i];
        a += fabs((double)w[i] * (double)x[i]);
    }
    *dot = s;
    *mag = a;
}

static double ref_act(int a, double v)
{
    switch (a) {
    case SI_ACT_RELU:
        return v > 0.0 ? v : 0.0;
    case SI_ACT_GELU:
        return 0.5 * v * (1.0 + tanh(0.7978845608028654 * v * (1.0 + 0.044715 * v * v)));
    case SI_ACT_SILU:
    default:
        return v / (1.0 + exp(-v));
    }
}

/* cudaMalloc + copy, exiting on failure (the device is there, so this is a bug). */
static void *dev_copy(const void *src, size_t bytes)
{
    void *p = NULL;
    cudaError_t e = cudaMalloc(&p, bytes ? bytes : 1);
    if (e == cudaSuccess && src != NULL && bytes > 0)
        e = cudaMemcpy(p, src, bytes, cudaMemcpyHostToDevice);
    if (e != cudaSuccess) {
        fprintf(stderr, "cudaMalloc/cudaMemcpy of %zu bytes: %s\n", bytes, cudaGetErrorString(e));
        exit(1);
    }
    return p;
}

static void host_copy(void *dst, const void *src, size_t bytes)
{
    cudaError_t e = cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost);
    if (e != cudaSuccess) {
        fprintf(stderr, "cudaMemcpy to host: %s\n", cudaGetErrorString(e));
        exit(1);
    }
}

/* Wait for the stream and report the launch's and the kernel's errors. */
static int finish(cudaError_t launch, cudaStream_t stream, const char *what)
{
    cudaError_t e = launch != cudaSuccess ? launch : cudaStreamSynchronize(stream);
    CHECK(e == cudaSuccess, "%s: %s", what, cudaGetErrorString(e));
    return e == cudaSuccess;
}

/* |got - ref| / scale, with an exact zero for 0/0 and NaN as infinity. */
static double norm_err(double got, double ref, double scale)
{
    double e = fabs(got - ref);
    if (isnan(e))
        return INFINITY;
    if (e == 0.0)
        return 0.0;
    return scale > 0.0 ? e / scale : INFINITY;
}

/* n_active distinct neurons out of n_ff, in random order. */
static int32_t *pick_neurons(int64_t n_ff, int64_t n_active)
{
    int32_t *all = malloc((size_t)n_ff * sizeof *all);
    for (int64_t i = 0; i < n_ff; i++)
        all[i] = (int32_t)i;
    for (int64_t i = 0; i < n_active; i++) {
        rng_state = rng_state * 1103515245u + 12345u;
        int64_t j = i + (int64_t)(rng_state >> 4) % (n_ff - i);
        int32_t t = all[i];
        all[i] = all[j];
        all[j] = t;
    }
    return all; /* the first n_active entries */
}

/* ------------------------------------------------------------ matvec */

static void test_matvec(uint32_t t, int64_t n_rows, int64_t n_cols, size_t pad, cudaStream_t stream)
{
    struct rows m;
    rows_make(&m, t, n_rows, n_cols, pad);
    float *x = malloc((size_t)n_cols * sizeof *x), *y = malloc((size_t)n_rows * sizeof *y);
    fill(x, n_cols, 1.0f);
    void *dw = dev_copy(m.data, (size_t)n_rows * m.stride);
    float *dx = dev_copy(x, (size_t)n_cols * sizeof *x),
          *dy = dev_copy(NULL, (size_t)n_rows * sizeof *y);
    char what[96];
    snprintf(what, sizeof what, "matvec %s %lldx%lld pad %zu", si_type_name(t), (long long)n_rows,
             (long long)n_cols, pad);
    size_t stride = pad ? m.stride : 0;
    if (finish(si_cuda_matvec(t, dw, stride, n_rows, n_cols, dx, dy, stream), stream, what)) {
        host_copy(y, dy, (size_t)n_rows * sizeof *y);
        double worst = 0.0, worst_cpu = 0.0;
        for (int64_t r = 0; r < n_rows; r++) {
            double ref, mag;
            ref_dot(&m, r, x, &ref, &mag);
            double e = norm_err(y[r], ref, mag);
            worst = e > worst ? e : worst;
            /* The CPU kernel, as a check on the reference itself. */
            const float cpu = si_vec_dot(t, m.data + (size_t)r * m.stride, x, n_cols);
            e = norm_err(cpu, ref, mag);
            worst_cpu = e > worst_cpu ? e : worst_cpu;
        }
        CHECK(worst <= tolerance(t), "%s: normalised error %g > %g", what, worst, tolerance(t));
        CHECK(worst_cpu <= tolerance(t), "%s: CPU si_vec_dot error %g", what, worst_cpu);
        printf("%-34s err %.2e (cpu si_vec_dot %.2e)\n", what, worst, worst_cpu);
    }
    cudaFree(dw);
    cudaFree(dx);
    cudaFree(dy);
    free(x);
    free(y);
    rows_free(&m);
}

/* ------------------------------------------------------------ gate/up */

static const char *act_name(int a)
{
    return a == SI_ACT_RELU ? "relu" : a == SI_ACT_GELU ? "gelu" : "silu";
}

static const char *kind_name(int k)
{
    return k == SI_FFN_PLAIN ? "plain" : k == SI_FFN_GATED_RELU2 ? "gated-relu2" : "gated";
}

static void test_gate_up(uint32_t t, int kind, int act, bool bias, cudaStream_t stream)
{
    const int64_t n_embd = 1024 + 96, n_ff = 2816, n_idx = 941;
    struct rows gate, up;
    rows_make(&up, t, n_ff, n_embd, 0);
    const bool gated = kind != SI_FFN_PLAIN;
    if (gated)
        rows_make(&gate, t, n_ff, n_embd, 0);
    float *x = malloc((size_t)n_embd * sizeof *x), *b = malloc((size_t)n_ff * sizeof *b);
    float *h = malloc((size_t)n_idx * sizeof *h);
    fill(x, n_embd, 1.0f);
    fill(b, n_ff, 2.0f);
    int32_t *idx = pick_neurons(n_ff, n_idx);
    idx[n_idx - 1] = (int32_t)n_ff; /* out of range: h = 0 */

    void *dup = dev_copy(up.data, (size_t)n_ff * up.stride);
    void *dgate = gated ? dev_copy(gate.data, (size_t)n_ff * gate.stride) : NULL;
    float *dx = dev_copy(x, (size_t)n_embd * sizeof *x);
    float *db = bias ? dev_copy(b, (size_t)n_ff * sizeof *b) : NULL;
    int32_t *didx = dev_copy(idx, (size_t)n_idx * sizeof *idx);
    float *dh = dev_copy(NULL, (size_t)n_idx * sizeof *h);
    char what[96];
    snprintf(what, sizeof what, "gate_up %s %s %s%s", si_type_name(t), kind_name(kind),
             act_name(act), bias ? " +b" : "");
    cudaError_t e = si_cuda_ffn_gate_up(t, dgate, dup, 0, n_ff, n_embd, db, dx, didx, n_idx, kind,
                                        act, dh, stream);
    if (finish(e, stream, what)) {
        host_copy(h, dh, (size_t)n_idx * sizeof *h);
        double worst = 0.0;
        for (int64_t k = 0; k < n_idx - 1; k++) {
            const int64_t i = idx[k];
            double u, su, g = 0.0, sg = 0.0, ref, scale;
            ref_dot(&up, i, x, &u, &su);
            if (bias) {
                u += b[i];
                su += fabs(b[i]);
            }
            if (gated) {
                ref_dot(&gate, i, x, &g, &sg);
                if (kind == SI_FFN_GATED_RELU2)
                    u = u > 0.0 ? u : 0.0;
                ref = ref_act(act, g) * u;
                scale = sg * su;
            } else {
                ref = ref_act(act, u);
                scale = su;
            }
            double err = norm_err(h[k], ref, scale);
            worst = err > worst ? err : worst;
        }
        CHECK(h[n_idx - 1] == 0.0f, "%s: out-of-range neuron gave %g", what, h[n_idx - 1]);
        CHECK(worst <= tolerance(t), "%s: normalised error %g > %g", what, worst, tolerance(t));
        printf("%-34s err %.2e\n", what, worst);
    }
    cudaFree(dup);
    cudaFree(dgate);
    cudaFree(dx);
    cudaFree(db);
    cudaFree(didx);
    cudaFree(dh);
    free(x);
    free(b);
    free(h);
    free(idx);
    rows_free(&up);
    if (gated)
        rows_free(&gate);
}

/* ------------------------------------------------------------ down */

static void test_down(uint32_t t, int64_t n_embd, int64_t n_idx, cudaStream_t stream)
{
    const int64_t n_ff = 2816;
    struct rows d;
    rows_make(&d, t, n_ff, n_embd, 0);
    float *h = malloc((size_t)(n_idx ? n_idx : 1) * sizeof *h);
    float *y = malloc((size_t)n_embd * sizeof *y), *y2 = malloc((size_t)n_embd * sizeof *y2);
    fill(h, n_idx, 3.0f);
    int32_t *idx = pick_neurons(n_ff, n_idx);
    if (n_idx >= 8) {
        idx[3] = idx[5]; /* a duplicate: each entry is its own term */
        h[2] = 0.0f;     /* a ReLU zero, skipped */
    }
    void *dd = dev_copy(d.data, (size_t)n_ff * d.stride);
    float *dh = dev_copy(h, (size_t)n_idx * sizeof *h);
    int32_t *didx = dev_copy(idx, (size_t)n_idx * sizeof *idx);
    float *dy = dev_copy(NULL, (size_t)n_embd * sizeof *y);
    /* Garbage in y first: the kernel must overwrite, not accumulate. */
    cudaMemset(dy, 0x7f, (size_t)n_embd * sizeof *y);
    char what[96];
    snprintf(what, sizeof what, "down %s n_embd %lld n_idx %lld", si_type_name(t),
             (long long)n_embd, (long long)n_idx);
    if (finish(si_cuda_ffn_down(t, dd, 0, n_ff, n_embd, dh, didx, n_idx, dy, stream), stream,
               what)) {
        host_copy(y, dy, (size_t)n_embd * sizeof *y);
        double worst = 0.0;
        for (int64_t c = 0; c < n_embd; c++) {
            double ref = 0.0, mag = 0.0;
            for (int64_t k = 0; k < n_idx; k++) {
                const double p = (double)h[k] * (double)d.deq[(size_t)(idx[k] * n_embd + c)];
                ref += p;
                mag += fabs(p);
            }
            double e = norm_err(y[c], ref, mag);
            worst = e > worst ? e : worst;
        }
        CHECK(worst <= tolerance(t), "%s: normalised error %g > %g", what, worst, tolerance(t));
        /* Run again: the same bits. */
        if (finish(si_cuda_ffn_down(t, dd, 0, n_ff, n_embd, dh, didx, n_idx, dy, stream), stream,
                   what)) {
            host_copy(y2, dy, (size_t)n_embd * sizeof *y2);
            CHECK(memcmp(y, y2, (size_t)n_embd * sizeof *y) == 0, "%s: not deterministic", what);
        }
        printf("%-34s err %.2e\n", what, worst);
    }
    cudaFree(dd);
    cudaFree(dh);
    cudaFree(didx);
    cudaFree(dy);
    free(h);
    free(y);
    free(y2);
    free(idx);
    rows_free(&d);
}

/* ------------------------------------------------------------ rmsnorm */

static void test_rmsnorm(int64_t n, bool with_w, bool in_place, cudaStream_t stream)
{
    const float eps = 1e-6f;
    float *x = malloc((size_t)n * sizeof *x), *w = malloc((size_t)n * sizeof *w);
    float *y = malloc((size_t)n * sizeof *y);
    fill(x, n, 4.0f);
    fill(w, n, 1.5f);
    float *dx = dev_copy(x, (size_t)n * sizeof *x), *dw = dev_copy(w, (size_t)n * sizeof *w);
    float *dy = in_place ? dx : dev_copy(NULL, (size_t)n * sizeof *y);
    char what[96];
    snprintf(what, sizeof what, "rmsnorm n %lld%s%s", (long long)n, with_w ? " w" : "",
             in_place ? " in place" : "");
    if (finish(si_cuda_rmsnorm(dy, dx, with_w ? dw : NULL, n, eps, stream), stream, what)) {
        host_copy(y, dy, (size_t)n * sizeof *y);
        double ss = 0.0;
        for (int64_t i = 0; i < n; i++)
            ss += (double)x[i] * (double)x[i];
        const double scale = 1.0 / sqrt(ss / (double)n + (double)eps);
        double worst = 0.0;
        for (int64_t i = 0; i < n; i++) {
            const double ref = (double)x[i] * scale * (with_w ? (double)w[i] : 1.0);
            double e = norm_err(y[i], ref, fabs(ref));
            worst = e > worst ? e : worst;
        }
        CHECK(worst <= TOL_FLOAT, "%s: relative error %g > %g", what, worst, TOL_FLOAT);
        printf("%-34s err %.2e\n", what, worst);
    }
    cudaFree(dx);
    cudaFree(dw);
    if (!in_place)
        cudaFree(dy);
    free(x);
    free(w);
    free(y);
}

/* ------------------------------------------------------------ refusals */

static void test_refusals(cudaStream_t stream)
{
    float *d = dev_copy(NULL, 4096);
    int32_t *di = dev_copy(NULL, 64);
    CHECK(si_cuda_matvec(SI_TYPE_Q5_0, d, 0, 4, 32, d, d, stream) == cudaErrorInvalidValue,
          "Q5_0 matvec accepted");
    CHECK(si_cuda_matvec(SI_TYPE_Q8_0, d, 0, 4, 48, d, d, stream) == cudaErrorInvalidValue,
          "Q8_0 row of 48 accepted");
    CHECK(si_cuda_matvec(SI_TYPE_F32, (char *)d + 2, 0, 4, 8, d, d, stream) ==
              cudaErrorInvalidValue,
          "misaligned F32 rows accepted");
    CHECK(si_cuda_matvec(SI_TYPE_F16, d, 6, 4, 8, d, d, stream) == cudaErrorInvalidValue,
          "row stride below the row size accepted");
    CHECK(si_cuda_ffn_gate_up(SI_TYPE_F32, NULL, d, 0, 4, 8, NULL, d, di, 1, SI_FFN_GATED,
                              SI_ACT_SILU, d, stream) == cudaErrorInvalidValue,
          "gated FFN without gate accepted");
    CHECK(si_cuda_ffn_gate_up(SI_TYPE_F32, d, d, 0, 4, 8, NULL, d, di, 1, 99, SI_ACT_SILU, d,
                              stream) == cudaErrorInvalidValue,
          "unknown FFN kind accepted");
    CHECK(si_cuda_ffn_down(SI_TYPE_Q4_K, d, 0, 4, 256, d, di, 1, d, stream) ==
              cudaErrorInvalidValue,
          "Q4_K down accepted");
    CHECK(si_cuda_rmsnorm(d, d, NULL, 0, 1e-6f, stream) == cudaSuccess, "empty rmsnorm refused");
    CHECK(cudaStreamSynchronize(stream) == cudaSuccess, "stream after refusals");
    cudaFree(d);
    cudaFree(di);
}

int main(void)
{
    int n_dev = 0;
    cudaError_t e = cudaGetDeviceCount(&n_dev);
    if (e != cudaSuccess || n_dev == 0) {
        if (e != cudaSuccess)
            fprintf(stderr, "cudaGetDeviceCount: %s\n", cudaGetErrorString(e));
        test_skip("no CUDA device");
    }
    struct cudaDeviceProp prop;
    if (cudaGetDeviceProperties(&prop, 0) == cudaSuccess)
        printf("device 0: %s (sm_%d%d)\n", prop.name, prop.major, prop.minor);
    cudaStream_t stream;
    e = cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
    if (e != cudaSuccess) {
        fprintf(stderr, "cudaStreamCreate: %s\n", cudaGetErrorString(e));
        return 1;
    }
    printf("CPU quants: %s; tolerances %g (F32, F16), %g (quantized)\n", si_quants_impl(),
           TOL_FLOAT, TOL_QUANT);

    for (size_t ti = 0; ti < N_TYPES; ti++) {
        const uint32_t t = types[ti];
        const bool q = t != SI_TYPE_F32 && t != SI_TYPE_F16;
        test_matvec(t, 777, 4096, 0, stream);
        test_matvec(t, 33, q ? 32 : 1, 0, stream);        /* rows shorter than a warp's reach */
        test_matvec(t, 100, q ? 1056 : 1001, 12, stream); /* padded rows, odd length */

        test_gate_up(t, SI_FFN_GATED, SI_ACT_SILU, false, stream);
        test_gate_up(t, SI_FFN_GATED, SI_ACT_GELU, false, stream);
        test_gate_up(t, SI_FFN_GATED, SI_ACT_RELU, true, stream);
        test_gate_up(t, SI_FFN_GATED_RELU2, SI_ACT_RELU, false, stream);
        test_gate_up(t, SI_FFN_PLAIN, SI_ACT_RELU, true, stream);
        test_gate_up(t, SI_FFN_PLAIN, SI_ACT_GELU, true, stream);

        test_down(t, 1024 + 96, 941, stream);
        test_down(t, q ? 4096 : 1001, 2816, stream);
        test_down(t, 64, 0, stream);
    }
    test_rmsnorm(4096, true, false, stream);
    test_rmsnorm(1001, true, true, stream);
    test_rmsnorm(5, false, false, stream);
    test_refusals(stream);

    cudaStreamDestroy(stream);
    return test_result();
}
