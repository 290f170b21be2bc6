/*
 * test-cuda-kernels.c - the raw CUDA launchers of codelets_cuda.h (matvec,
 * sparse FFN gate/up and down, RMSNorm) against plain C, without StarPU.
 *
 * For each kernel and weight type (F32, F16, Q8_0, Q4_0, Q4_1, and the K
 * super-blocks Q4_K, Q5_K, Q6_K of Q4_K_M-style files): random data,
 * quantized with si_quantize_row(), copied to the device and run on a stream
 * of its own; the reference is computed in double from the rows as
 * si_dequantize_row() decodes them.  The error of each output is normalised
 * by the sum of the magnitudes of the products that form it (for h = act(g)*u,
 * by the product of g's and u's), so cancellation does not inflate it:
 *
 *   max_k |gpu_k - ref_k| / scale_k  <=  1e-4 for F32 and F16 rows,
 *                                         1e-3 for the quantized rows.
 *
 * (Both sides decode the same blocks exactly; what differs is the order of
 * float accumulation, which costs about sqrt(n) * 2^-24.)  The down projection
 * is also run twice and must give identical bits.
 *
 * The kernels with a CPU twin of their own (LayerNorm, RoPE, fp16 attention:
 * model/kernels.h; predictor, gemm: codelets/ops.h) are compared with it, each
 * with the tolerance its comment derives.  Exits 77 (SKIP) when the CUDA
 * runtime finds no device.
 */
#include "codelets/codelets_cuda.h"
#include "codelets/ops.h"
#include "model/act.h"
#include "model/kernels.h"
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
#define TOL_QUANT 1e-3 /* quantized rows */

static const uint32_t types[] = {SI_TYPE_F32,  SI_TYPE_F16,  SI_TYPE_Q8_0, SI_TYPE_Q4_0,
                                 SI_TYPE_Q4_1, SI_TYPE_Q4_K, SI_TYPE_Q5_K, SI_TYPE_Q6_K};
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
        /* the CPU's GELU (llama.cpp's: tanh form, fp16-rounded input and
         * output), which the CUDA kernels share through model/act.h; the
         * exact formula differs from it by the fp16 steps (6.9e-4) */
        return (double)si_act_gelu((float)v);
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

/* Rows of the K types are whole super-blocks of 256. */
static bool k_type(uint32_t t)
{
    return t == SI_TYPE_Q4_K || t == SI_TYPE_Q5_K || t == SI_TYPE_Q6_K;
}

static void test_gate_up(uint32_t t, int kind, int act, bool bias, cudaStream_t stream)
{
    const int64_t n_embd = k_type(t) ? 1280 : 1024 + 96, n_ff = 2816, n_idx = 941;
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

/* ------------------------------------------------------------ layernorm */

/*
 * Against si_k_layernorm.  The twin sums in double, the kernel in float
 * (a short strided sum per thread, then a tree over 1024 threads: about
 * log2(n) + n / 1024 roundings), so the mean is off by at most ~20 * 2^-24
 * of mean(|x|) and the scale by as little; the output is compared relative
 * to (|x_i| + mean(|x|)) * scale * |w_i| + |b_i|, and 1e-5 leaves a margin
 * of about 50 over that bound.
 */
#define TOL_LAYERNORM 1e-5

static void test_layernorm(int64_t n, bool with_w, bool with_b, bool in_place, cudaStream_t stream)
{
    const float eps = 1e-5f;
    float *x = malloc((size_t)n * sizeof *x), *w = malloc((size_t)n * sizeof *w);
    float *b = malloc((size_t)n * sizeof *b), *y = malloc((size_t)n * sizeof *y);
    float *ref = malloc((size_t)n * sizeof *ref);
    fill(x, n, 4.0f);
    for (int64_t i = 0; i < n; i++)
        x[i] += 3.0f; /* a mean well away from zero */
    fill(w, n, 1.5f);
    fill(b, n, 0.5f);
    float *dx = dev_copy(x, (size_t)n * sizeof *x), *dw = dev_copy(w, (size_t)n * sizeof *w);
    float *db = dev_copy(b, (size_t)n * sizeof *b);
    float *dy = in_place ? dx : dev_copy(NULL, (size_t)n * sizeof *y);
    char what[96];
    snprintf(what, sizeof what, "layernorm n %lld%s%s%s", (long long)n, with_w ? " w" : "",
             with_b ? " b" : "", in_place ? " in place" : "");
    if (finish(si_cuda_layernorm(dy, dx, with_w ? dw : NULL, with_b ? db : NULL, n, eps, stream),
               stream, what)) {
        host_copy(y, dy, (size_t)n * sizeof *y);
        si_k_layernorm(ref, x, with_w ? w : NULL, with_b ? b : NULL, n, eps);
        double mean_abs = 0.0, sum = 0.0, var = 0.0;
        for (int64_t i = 0; i < n; i++) {
            mean_abs += fabs((double)x[i]) / (double)n;
            sum += x[i];
        }
        for (int64_t i = 0; i < n; i++)
            var += ((double)x[i] - sum / (double)n) * ((double)x[i] - sum / (double)n);
        const double scale = 1.0 / sqrt(var / (double)n + (double)eps);
        double worst = 0.0;
        for (int64_t i = 0; i < n; i++) {
            const double mag = (fabs((double)x[i]) + mean_abs) * scale *
                                   (with_w ? fabs((double)w[i]) : 1.0) +
                               (with_b ? fabs((double)b[i]) : 0.0);
            const double e = norm_err(y[i], ref[i], mag);
            worst = e > worst ? e : worst;
        }
        CHECK(worst <= TOL_LAYERNORM, "%s: error %g > %g", what, worst, TOL_LAYERNORM);
        printf("%-34s err %.2e\n", what, worst);
    }
    cudaFree(dx);
    cudaFree(dw);
    cudaFree(db);
    if (!in_place)
        cudaFree(dy);
    free(x);
    free(w);
    free(b);
    free(y);
    free(ref);
}

/* ------------------------------------------------------------ rope */

/*
 * Against si_k_rope, token by token.  Both rotate by the same float angles
 * (the kernel forms them with the twin's own operations) and round the
 * products alike; only cosf and sinf differ, by at most 2 ulp on the device
 * and 1 in glibc, so each output is within about 4 * 2^-24 * (|x0| + |x1|)
 * of the twin's: 1e-6 of (|x0| + |x1|).  Dimensions past n_rot must come back
 * untouched, and position 0 (angle 0) exactly.
 */
#define TOL_ROPE 1e-6

static void test_rope(int kind, int n_heads, int head_dim, int n_rot, int pos0, int64_t n_tok,
                      float base, float scale, cudaStream_t stream)
{
    const int64_t per_tok = (int64_t)n_heads * head_dim, n = n_tok * per_tok;
    float *x = malloc((size_t)n * sizeof *x), *y = malloc((size_t)n * sizeof *y);
    float *ref = malloc((size_t)n * sizeof *ref);
    fill(x, n, 2.0f);
    memcpy(ref, x, (size_t)n * sizeof *x);
    for (int64_t t = 0; t < n_tok; t++)
        si_k_rope(ref + t * per_tok, n_heads, head_dim, n_rot, (enum si_rope_kind)kind,
                  pos0 + (int)t, base, scale);
    float *dx = dev_copy(x, (size_t)n * sizeof *x);
    char what[96];
    snprintf(what, sizeof what, "rope %s hd %d rot %d pos %d+%lld",
             kind == SI_ROPE_NEOX ? "neox" : kind == SI_ROPE_NORM ? "norm" : "none", head_dim,
             n_rot, pos0, (long long)n_tok);
    if (finish(si_cuda_rope(dx, n_tok, n_heads, head_dim, n_rot, kind, pos0, base, scale, stream),
               stream, what)) {
        host_copy(y, dx, (size_t)n * sizeof *y);
        double worst = 0.0;
        int64_t changed = 0, inexact0 = 0;
        for (int64_t t = 0; t < n_tok; t++) {
            for (int h = 0; h < n_heads; h++) {
                const int64_t o = t * per_tok + (int64_t)h * head_dim;
                for (int d = 0; d < head_dim; d++) {
                    const int64_t i = o + d;
                    const bool rotated = kind != SI_ROPE_NONE && d < n_rot;
                    if (!rotated) {
                        changed += memcmp(&y[i], &x[i], sizeof *y) != 0;
                        continue;
                    }
                    if (pos0 + t == 0)
                        inexact0 += memcmp(&y[i], &x[i], sizeof *y) != 0;
                    /* The pair partner of dimension d. */
                    const int half = n_rot / 2;
                    const int p = kind == SI_ROPE_NEOX ? (d < half ? d + half : d - half) : d ^ 1;
                    const double mag = fabs((double)x[i]) + fabs((double)x[o + p]);
                    const double e = norm_err(y[i], ref[i], mag);
                    worst = e > worst ? e : worst;
                }
            }
        }
        CHECK(worst <= TOL_ROPE, "%s: error %g > %g", what, worst, TOL_ROPE);
        CHECK(changed == 0, "%s: %lld dimensions past n_rot changed", what, (long long)changed);
        CHECK(inexact0 == 0, "%s: %lld values moved at position 0", what, (long long)inexact0);
        printf("%-34s err %.2e\n", what, worst);
    }
    cudaFree(dx);
    free(x);
    free(y);
    free(ref);
}

/* ------------------------------------------------------------ attention */

/*
 * Against si_k_attn_f16.  Both round the query and every step of the value
 * accumulator to fp16 in the same order; they differ only in the scores'
 * float summation order and in expf's last bits, which make an accumulator
 * rounding go the other way now and then (rarely: the float difference is
 * ~2^-20 of a half ulp).  Each such flip moves the output by at most one
 * fp16 ulp of S * max|v| divided by S, 2^-10 * max|v|, and later steps do not
 * amplify it.  Tolerance: 4e-3 * max|v| over the attended positions of the
 * kv head (4 flips); a wrong head, position or scaling is off by O(max|v|).
 * One attended position must give v itself, exactly, and an empty window
 * zeros; a second run must give the same bits.
 */
#define TOL_ATTN 4e-3

static void test_attn(int n_head, int n_head_kv, int head_dim, int first, int n_kv,
                      cudaStream_t stream)
{
    const int64_t kvd = (int64_t)n_head_kv * head_dim, qd = (int64_t)n_head * head_dim;
    const int64_t n_pos = n_kv > 0 ? n_kv : 1; /* cache rows allocated */
    float *q = malloc((size_t)qd * sizeof *q), *tmp = malloc((size_t)(n_pos * kvd) * sizeof *tmp);
    uint16_t *k = malloc((size_t)(n_pos * kvd) * sizeof *k), *v = malloc((size_t)(n_pos * kvd) * sizeof *v);
    float *out = malloc((size_t)qd * sizeof *out), *out2 = malloc((size_t)qd * sizeof *out2);
    float *ref = malloc((size_t)qd * sizeof *ref);
    uint16_t *scratch = malloc(2 * (size_t)head_dim * sizeof *scratch);
    fill(q, qd, 2.0f);
    fill(tmp, n_pos * kvd, 2.0f);
    si_quantize_row(SI_TYPE_F16, tmp, k, n_pos * kvd);
    fill(tmp, n_pos * kvd, 1.0f);
    si_quantize_row(SI_TYPE_F16, tmp, v, n_pos * kvd);
    const float scale = 1.0f / sqrtf((float)head_dim);
    si_k_attn_f16(ref, q, k, v, first, n_kv, n_head, n_head_kv, head_dim, scale, scratch);

    float *dq = dev_copy(q, (size_t)qd * sizeof *q), *dout = dev_copy(NULL, (size_t)qd * sizeof *out);
    uint16_t *dk = dev_copy(k, (size_t)(n_pos * kvd) * sizeof *k);
    uint16_t *dv = dev_copy(v, (size_t)(n_pos * kvd) * sizeof *v);
    cudaMemset(dout, 0x7f, (size_t)qd * sizeof *out); /* overwritten, not read */
    char what[96];
    snprintf(what, sizeof what, "attn_f16 %d/%d heads hd %d t %d..%d", n_head, n_head_kv,
             head_dim, first, n_kv);
    if (finish(si_cuda_attn_f16(dout, dq, dk, dv, first, n_kv, n_head, n_head_kv, head_dim, scale,
                                stream),
               stream, what)) {
        host_copy(out, dout, (size_t)qd * sizeof *out);
        const int group = n_head / n_head_kv, n_att = n_kv - first;
        double worst = 0.0;
        int64_t inexact = 0;
        for (int h = 0; h < n_head; h++) {
            for (int i = 0; i < head_dim; i++) {
                const int64_t o = (int64_t)h * head_dim + i, c = (int64_t)(h / group) * head_dim + i;
                double vmax = 0.0;
                for (int t = first; t < n_kv; t++) {
                    const double a = fabs((double)si_fp16_to_fp32(v[t * kvd + c]));
                    vmax = a > vmax ? a : vmax;
                }
                if (n_att <= 1) { /* nothing to average: exact */
                    inexact += memcmp(&out[o], &ref[o], sizeof *out) != 0;
                    continue;
                }
                const double e = norm_err(out[o], ref[o], vmax);
                worst = e > worst ? e : worst;
            }
        }
        CHECK(worst <= TOL_ATTN, "%s: error %g > %g", what, worst, TOL_ATTN);
        CHECK(inexact == 0, "%s: %lld outputs differ with %d positions", what, (long long)inexact,
              n_att);
        if (finish(si_cuda_attn_f16(dout, dq, dk, dv, first, n_kv, n_head, n_head_kv, head_dim,
                                    scale, stream),
                   stream, what)) {
            host_copy(out2, dout, (size_t)qd * sizeof *out2);
            CHECK(memcmp(out, out2, (size_t)qd * sizeof *out) == 0, "%s: not deterministic", what);
        }
        printf("%-34s err %.2e\n", what, worst);
    }
    cudaFree(dq);
    cudaFree(dout);
    cudaFree(dk);
    cudaFree(dv);
    free(q);
    free(tmp);
    free(k);
    free(v);
    free(out);
    free(out2);
    free(ref);
    free(scratch);
}

/* ------------------------------------------------------------ predictor */

/*
 * Against si_k_predictor with fc1 and fc2 of type t.  Both decode the same
 * blocks exactly and sum in float in different orders; z is compared
 * relative to the sum over j of |fc2_ij| * (sum over k of |fc1_jk x_k|), with
 * the tolerance of the type as for matvec.  The device list must be exactly
 * the i with the device's z[i] >= threshold, increasing; against the twin's
 * list, neurons may differ only where the twin's z is within that tolerance
 * of the threshold.
 */
static void test_predictor(uint32_t t, int64_t n_embd, int64_t r, int64_t n_ff, float threshold,
                           cudaStream_t stream)
{
    struct rows fc1, fc2;
    rows_make(&fc1, t, r, n_embd, 0);
    rows_make(&fc2, t, n_ff, r, 0);
    float *x = malloc((size_t)n_embd * sizeof *x), *hid = malloc((size_t)r * sizeof *hid);
    float *z = malloc((size_t)n_ff * sizeof *z), *zc = malloc((size_t)n_ff * sizeof *zc);
    double *mag1 = malloc((size_t)r * sizeof *mag1);
    int32_t *idx = malloc((size_t)(n_ff + 1) * sizeof *idx),
            *idxc = malloc((size_t)(n_ff + 1) * sizeof *idxc);
    fill(x, n_embd, 1.0f);
    const int64_t nc = si_k_predictor(t, fc1.data, 0, t, fc2.data, 0, n_embd, r, n_ff, x,
                                      threshold, hid, zc, idxc);
    for (int64_t j = 0; j < r; j++) {
        double dot;
        ref_dot(&fc1, j, x, &dot, &mag1[j]);
    }
    void *d1 = dev_copy(fc1.data, (size_t)r * fc1.stride), *d2 = dev_copy(fc2.data, (size_t)n_ff * fc2.stride);
    float *dx = dev_copy(x, (size_t)n_embd * sizeof *x), *dh = dev_copy(NULL, (size_t)r * sizeof *hid);
    float *dz = dev_copy(NULL, (size_t)n_ff * sizeof *z);
    int32_t *didx = dev_copy(NULL, (size_t)(n_ff + 1) * sizeof *idx), *dcount = dev_copy(NULL, sizeof(int32_t));
    char what[96];
    snprintf(what, sizeof what, "predictor %s %lld-%lld-%lld thr %g", si_type_name(t),
             (long long)n_embd, (long long)r, (long long)n_ff, threshold);
    cudaError_t e = si_cuda_predictor(t, d1, 0, t, d2, 0, n_embd, r, n_ff, dx, threshold, dh, dz,
                                      didx, dcount, stream);
    if (finish(e, stream, what)) {
        int32_t count = -1;
        host_copy(&count, dcount, sizeof count);
        host_copy(z, dz, (size_t)n_ff * sizeof *z);
        CHECK(count >= 0 && count <= n_ff, "%s: count %d", what, count);
        if (count < 0 || count > n_ff)
            count = 0;
        host_copy(idx, didx, (size_t)count * sizeof *idx);
        double worst = 0.0;
        int64_t k = 0, wrong = 0, unsure = 0;
        for (int64_t i = 0; i < n_ff; i++) {
            double mag = 0.0;
            for (int64_t j = 0; j < r; j++)
                mag += fabs((double)fc2.deq[(size_t)(i * r + j)]) * mag1[j];
            const double err = norm_err(z[i], zc[i], mag);
            worst = err > worst ? err : worst;
            const bool in = k < count && idx[k] == i;
            k += in;
            wrong += in != (z[i] >= threshold);
            if (in != (zc[i] >= threshold) && fabs((double)zc[i] - threshold) > tolerance(t) * mag)
                unsure++;
        }
        CHECK(worst <= tolerance(t), "%s: z error %g > %g", what, worst, tolerance(t));
        CHECK(k == count, "%s: list not increasing or out of range", what);
        CHECK(wrong == 0, "%s: %lld neurons listed against the device's own z", what,
              (long long)wrong);
        CHECK(unsure == 0, "%s: %lld neurons disagree with the CPU twin", what, (long long)unsure);
        printf("%-34s err %.2e, %d active (cpu %lld)\n", what, worst, count, (long long)nc);
    }
    cudaFree(d1);
    cudaFree(d2);
    cudaFree(dx);
    cudaFree(dh);
    cudaFree(dz);
    cudaFree(didx);
    cudaFree(dcount);
    free(x);
    free(hid);
    free(z);
    free(zc);
    free(mag1);
    free(idx);
    free(idxc);
    rows_free(&fc1);
    rows_free(&fc2);
}

/* ------------------------------------------------------------ gemm */

/*
 * Against si_k_gemm (OpenBLAS on the same decoded values): only the float
 * summation orders differ, so TOL_FLOAT relative to the sum of |w x| for
 * every type (n * 2^-24 is 6e-5 for the 1024 columns here, and both sums
 * are blocked, far below).  A scratch of 100 rows makes 3 tiles and a
 * partial one; y's gaps between tokens must stay untouched.
 */
static void test_gemm(cublasHandle_t handle, uint32_t t, int64_t n_rows, int64_t n_cols,
                      int64_t n_tok, size_t pad, cudaStream_t stream)
{
    struct rows m;
    rows_make(&m, t, n_rows, n_cols, pad);
    const int64_t ldx = n_cols + 3, ldy = n_rows + 5;
    float *x = malloc((size_t)(n_tok * ldx) * sizeof *x), *y = malloc((size_t)(n_tok * ldy) * sizeof *y);
    float *yc = malloc((size_t)(n_tok * ldy) * sizeof *yc);
    fill(x, n_tok * ldx, 1.0f);
    for (int64_t i = 0; i < n_tok * ldy; i++)
        y[i] = i % ldy < n_rows ? NAN : 1234.5f;
    void *cscratch = malloc(si_k_gemm_scratch_size(t, n_cols) + 1);
    const int rc = si_k_gemm(t, m.data, pad ? m.stride : 0, n_rows, n_cols, x, ldx, n_tok, yc, ldy,
                             cscratch);
    CHECK(rc == 0, "si_k_gemm returned %d", rc);
    const size_t sbytes = (size_t)(100 * n_cols) * sizeof(float);
    void *dw = dev_copy(m.data, (size_t)n_rows * m.stride);
    float *dx = dev_copy(x, (size_t)(n_tok * ldx) * sizeof *x);
    float *dy = dev_copy(y, (size_t)(n_tok * ldy) * sizeof *y);
    float *ds = t == SI_TYPE_F32 ? NULL : dev_copy(NULL, sbytes);
    char what[96];
    snprintf(what, sizeof what, "gemm %s %lldx%lld n_tok %lld pad %zu", si_type_name(t),
             (long long)n_rows, (long long)n_cols, (long long)n_tok, pad);
    cudaError_t e = si_cuda_gemm(handle, t, dw, pad ? m.stride : 0, n_rows, n_cols, dx, ldx, n_tok,
                                 dy, ldy, ds, ds ? sbytes : 0, stream);
    if (finish(e, stream, what)) {
        host_copy(y, dy, (size_t)(n_tok * ldy) * sizeof *y);
        double worst = 0.0;
        int64_t gap = 0;
        for (int64_t tk = 0; tk < n_tok; tk++) {
            for (int64_t r = 0; r < n_rows; r++) {
                double dot, mag;
                ref_dot(&m, r, x + tk * ldx, &dot, &mag);
                const double err = norm_err(y[tk * ldy + r], yc[tk * ldy + r], mag);
                worst = err > worst ? err : worst;
            }
            for (int64_t r = n_rows; r < ldy; r++)
                gap += y[tk * ldy + r] != 1234.5f;
        }
        CHECK(worst <= TOL_FLOAT, "%s: error %g > %g", what, worst, TOL_FLOAT);
        CHECK(gap == 0, "%s: %lld values written between tokens", what, (long long)gap);
        printf("%-34s err %.2e\n", what, worst);
    }
    cudaFree(dw);
    cudaFree(dx);
    cudaFree(dy);
    cudaFree(ds);
    free(x);
    free(y);
    free(yc);
    free(cscratch);
    rows_free(&m);
}

/* ------------------------------------------------------------ refusals */

static void test_refusals(cublasHandle_t handle, cudaStream_t stream)
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
    CHECK(si_cuda_ffn_down(SI_TYPE_Q5_0, d, 0, 4, 256, d, di, 1, d, stream) ==
              cudaErrorInvalidValue,
          "Q5_0 down accepted (no CUDA decoder)");
    CHECK(si_cuda_matvec(SI_TYPE_Q4_K, d, 0, 4, 128, d, d, stream) == cudaErrorInvalidValue,
          "Q4_K row of half a super-block accepted");
    CHECK(si_cuda_rmsnorm(d, d, NULL, 0, 1e-6f, stream) == cudaSuccess, "empty rmsnorm refused");
    CHECK(si_cuda_layernorm(NULL, d, NULL, NULL, 8, 1e-5f, stream) == cudaErrorInvalidValue,
          "layernorm without y accepted");
    CHECK(si_cuda_rope(d, 1, 2, 64, 63, SI_ROPE_NORM, 0, 1e4f, 1.0f, stream) ==
              cudaErrorInvalidValue,
          "odd n_rot accepted");
    CHECK(si_cuda_rope(d, 1, 2, 32, 64, SI_ROPE_NEOX, 0, 1e4f, 1.0f, stream) ==
              cudaErrorInvalidValue,
          "n_rot past head_dim accepted");
    CHECK(si_cuda_rope(d, 1, 2, 64, 64, 7, 0, 1e4f, 1.0f, stream) == cudaErrorInvalidValue,
          "unknown rope kind accepted");
    CHECK(si_cuda_rope(d, 1, 2, 64, 64, SI_ROPE_NONE, 0, 1e4f, 1.0f, stream) == cudaSuccess,
          "rope NONE refused");
    CHECK(si_cuda_attn_f16(d, d, (uint16_t *)d, (uint16_t *)d, 0, 4, 6, 4, 64, 0.125f, stream) ==
              cudaErrorInvalidValue,
          "6 heads over 4 kv heads accepted");
    CHECK(si_cuda_attn_f16(d, d, (uint16_t *)d, (uint16_t *)d, 0, 1, 1, 1,
                           SI_CUDA_ATTN_MAX_HEAD_DIM + 32, 0.125f, stream) == cudaErrorInvalidValue,
          "head_dim past the maximum accepted");
    CHECK(si_cuda_predictor(SI_TYPE_Q5_0, d, 0, SI_TYPE_F32, d, 0, 256, 32, 4, d, 0.0f, d, d, di,
                            di, stream) == cudaErrorInvalidValue,
          "Q5_0 predictor accepted");
    CHECK(si_cuda_predictor(SI_TYPE_F32, d, 0, SI_TYPE_Q8_0, d, 0, 32, 48, 4, d, 0.0f, d, d, di,
                            di, stream) == cudaErrorInvalidValue,
          "Q8_0 fc2 rows of 48 accepted");
    CHECK(si_cuda_gemm(NULL, SI_TYPE_F32, d, 0, 4, 8, d, 8, 1, d, 4, NULL, 0, stream) ==
              cudaErrorInvalidValue,
          "gemm without a handle accepted");
    CHECK(si_cuda_gemm(handle, SI_TYPE_Q5_0, d, 0, 2, 256, d, 256, 1, d, 2, d, 4096, stream) ==
              cudaErrorInvalidValue,
          "Q5_0 gemm accepted");
    CHECK(si_cuda_gemm(handle, SI_TYPE_Q4_0, d, 0, 2, 32, d, 32, 1, d, 2, NULL, 0, stream) ==
              cudaErrorInvalidValue,
          "Q4_0 gemm without scratch accepted");
    CHECK(si_cuda_gemm(handle, SI_TYPE_Q8_0, d, 0, 2, 1024, d, 1024, 1, d, 2, d, 4095, stream) ==
              cudaErrorInvalidValue,
          "gemm scratch below one row accepted"); /* one row of 1024 floats: 4096 bytes */
    CHECK(si_cuda_gemm(handle, SI_TYPE_F32, d, 0, 4, 8, d, 8, 2, d, 3, NULL, 0, stream) ==
              cudaErrorInvalidValue,
          "gemm ldy < n_rows accepted");
    CHECK(cudaStreamSynchronize(stream) == cudaSuccess, "stream after refusals");
    cudaFree(d);
    cudaFree(di);
}

/* si_cuda_ffn_combine against act() in double: element-wise, so only the
 * float rounding of act and the product separates them. */
static void test_combine(int kind, int act, bool bias, cudaStream_t stream)
{
    const int64_t n = 3001;
    float *g = malloc((size_t)n * sizeof *g), *u = malloc((size_t)n * sizeof *u),
          *b = malloc((size_t)n * sizeof *b), *h = malloc((size_t)n * sizeof *h);
    fill(g, n, 4.0f);
    fill(u, n, 4.0f);
    fill(b, n, 1.0f);
    float *dg = dev_copy(g, (size_t)n * sizeof *g), *du = dev_copy(u, (size_t)n * sizeof *u),
          *db = dev_copy(b, (size_t)n * sizeof *b), *dh = dev_copy(h, (size_t)n * sizeof *h);
    cudaError_t e = si_cuda_ffn_combine(kind == SI_FFN_PLAIN ? NULL : dg, du, bias ? db : NULL, n,
                                        kind, act, dh, stream);
    if (finish(e, stream, "combine")) {
        host_copy(h, dh, (size_t)n * sizeof *h);
        double worst = 0;
        for (int64_t i = 0; i < n; i++) {
            double v = (double)u[i] + (bias ? (double)b[i] : 0.0), r;
            if (kind == SI_FFN_PLAIN) {
                r = ref_act(act, v);
            } else {
                if (kind == SI_FFN_GATED_RELU2)
                    v = v > 0 ? v : 0;
                r = ref_act(act, g[i]) * v;
            }
            worst = fmax(worst, norm_err(h[i], r, fabs(r) + 1.0));
        }
        CHECK(worst <= 1e-5, "combine %s %s: error %.3g", kind_name(kind), act_name(act), worst);
    }
    cudaFree(dg);
    cudaFree(du);
    cudaFree(db);
    cudaFree(dh);
    free(g);
    free(u);
    free(b);
    free(h);
}

/* si_cuda_residual, si_cuda_add and si_cuda_to_f16 against the CPU's own
 * sums and conversion: the same operations in the same order, so the same
 * bits. */
static void test_elementwise(int n_parts, bool bias, cudaStream_t stream)
{
    const int64_t n = 5003;
    const size_t fb = (size_t)n * sizeof(float);
    float *x = malloc(fb), *b = malloc(fb), *want = malloc(fb), *got = malloc(fb);
    float **parts = malloc((size_t)n_parts * sizeof *parts);
    const float **dparts = malloc((size_t)n_parts * sizeof *dparts);
    fill(x, n, 3.0f);
    fill(b, n, 0.5f);
    for (int j = 0; j < n_parts; j++) {
        parts[j] = malloc(fb);
        fill(parts[j], n, 2.0f);
        dparts[j] = dev_copy(parts[j], fb);
    }
    for (int64_t i = 0; i < n; i++) {
        float s = parts[0][i];
        for (int j = 1; j < n_parts; j++)
            s += parts[j][i];
        if (bias)
            s += b[i];
        want[i] = x[i] + s;
    }
    float *dx = dev_copy(x, fb), *db = dev_copy(b, fb);
    char what[64];
    snprintf(what, sizeof what, "residual of %d parts%s", n_parts, bias ? " and a bias" : "");
    if (finish(si_cuda_residual(dx, dparts, n_parts, bias ? db : NULL, n, stream), stream, what)) {
        host_copy(got, dx, fb);
        CHECK(memcmp(got, want, fb) == 0, "%s: not the CPU's bits", what);
    }
    /* y = a + b, in place too, then fp16 */
    for (int64_t i = 0; i < n; i++)
        want[i] = x[i] + b[i];
    float *da = dev_copy(x, fb);
    if (finish(si_cuda_add(da, da, db, n, stream), stream, "add in place")) {
        host_copy(got, da, fb);
        CHECK(memcmp(got, want, fb) == 0, "add: not the CPU's bits");
    }
    uint16_t *h = malloc((size_t)n * 2), *hw = malloc((size_t)n * 2);
    uint16_t *dh = dev_copy(NULL, (size_t)n * 2);
    want[0] = 65520.0f; /* rounds to infinity */
    want[1] = 1e-8f;    /* a subnormal half */
    want[2] = -0.0f;
    float *dw = dev_copy(want, fb);
    if (finish(si_cuda_to_f16(dh, dw, n, stream), stream, "to_f16")) {
        host_copy(h, dh, (size_t)n * 2);
        for (int64_t i = 0; i < n; i++)
            hw[i] = si_fp32_to_fp16(want[i]);
        CHECK(memcmp(h, hw, (size_t)n * 2) == 0, "to_f16: not si_fp32_to_fp16's bits");
    }
    CHECK(si_cuda_residual(dx, dparts, 0, NULL, n, stream) == cudaErrorInvalidValue,
          "residual of no parts accepted");
    CHECK(si_cuda_residual(dx, dparts, SI_CUDA_MAX_PARTS + 1, NULL, n, stream) ==
              cudaErrorInvalidValue,
          "residual of too many parts accepted");
    for (int j = 0; j < n_parts; j++) {
        cudaFree((void *)dparts[j]);
        free(parts[j]);
    }
    cudaFree(dx);
    cudaFree(db);
    cudaFree(da);
    cudaFree(dh);
    cudaFree(dw);
    free(parts);
    free(dparts);
    free(x);
    free(b);
    free(want);
    free(got);
    free(h);
    free(hw);
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
        const bool q = t != SI_TYPE_F32 && t != SI_TYPE_F16, k = k_type(t);
        test_matvec(t, 777, 4096, 0, stream);
        test_matvec(t, 33, k ? 256 : q ? 32 : 1, 0, stream); /* rows shorter than a warp's reach */
        test_matvec(t, 100, k ? 1280 : q ? 1056 : 1001, 12, stream); /* padded, odd length */

        test_gate_up(t, SI_FFN_GATED, SI_ACT_SILU, false, stream);
        test_gate_up(t, SI_FFN_GATED, SI_ACT_GELU, false, stream);
        test_gate_up(t, SI_FFN_GATED, SI_ACT_RELU, true, stream);
        test_gate_up(t, SI_FFN_GATED_RELU2, SI_ACT_RELU, false, stream);
        test_gate_up(t, SI_FFN_PLAIN, SI_ACT_RELU, true, stream);
        test_gate_up(t, SI_FFN_PLAIN, SI_ACT_GELU, true, stream);

        test_down(t, k ? 1280 : 1024 + 96, 941, stream);
        test_down(t, q ? 4096 : 1001, 2816, stream);
        test_down(t, k ? 256 : 64, 0, stream);
    }
    test_combine(SI_FFN_GATED, SI_ACT_SILU, false, stream);
    test_combine(SI_FFN_GATED, SI_ACT_GELU, true, stream);
    test_combine(SI_FFN_GATED_RELU2, SI_ACT_RELU, true, stream);
    test_combine(SI_FFN_PLAIN, SI_ACT_RELU, true, stream);
    test_rmsnorm(4096, true, false, stream);
    test_rmsnorm(1001, true, true, stream);
    test_rmsnorm(5, false, false, stream);
    test_layernorm(4096, true, true, false, stream);
    test_layernorm(1001, true, false, true, stream);
    test_layernorm(576, true, true, true, stream);
    test_layernorm(5, false, false, false, stream);

    test_rope(SI_ROPE_NORM, 9, 64, 64, 0, 3, 10000.0f, 1.0f, stream); /* SmolLM2 */
    test_rope(SI_ROPE_NORM, 3, 64, 64, 4000, 2, 10000.0f, 1.0f, stream);
    test_rope(SI_ROPE_NEOX, 4, 256, 256, 123, 2, 1e6f, 0.125f, stream); /* gemma3 global */
    test_rope(SI_ROPE_NEOX, 4, 256, 256, 2047, 1, 1e4f, 1.0f, stream);  /* gemma3 local */
    test_rope(SI_ROPE_NEOX, 2, 128, 64, 7, 5, 10000.0f, 1.0f, stream);  /* partial rotation */
    test_rope(SI_ROPE_NONE, 2, 64, 64, 7, 1, 10000.0f, 1.0f, stream);

    test_elementwise(1, false, stream);
    test_elementwise(7, true, stream);
    test_elementwise(SI_CUDA_MAX_PARTS, true, stream);

    test_attn(9, 3, 64, 0, 700, stream); /* SmolLM2's GQA */
    test_attn(4, 1, 256, 300, 812, stream); /* gemma3, a sliding window */
    test_attn(2, 1, 80, 0, 257, stream);    /* head_dim not a multiple of the warp */
    test_attn(8, 8, 128, 0, 1, stream);     /* the first token: v itself */
    test_attn(3, 3, 64, 10, 11, stream);    /* one position in the window */
    test_attn(2, 1, 80, 5, 5, stream);      /* an empty window: zeros */

    cublasHandle_t handle;
    cublasStatus_t cs = cublasCreate(&handle);
    if (cs != CUBLAS_STATUS_SUCCESS) {
        fprintf(stderr, "cublasCreate: status %d\n", (int)cs);
        return 1;
    }
    for (size_t ti = 0; ti < N_TYPES; ti++) {
        const uint32_t t = types[ti];
        test_gemm(handle, t, 300, 1024, 9, 0, stream);
        test_gemm(handle, t, 300, 1024, 1, 16, stream);
        if (k_type(t)) /* predictors are written in F32, F16, Q8_0 or Q4_0 */
            continue;
        test_predictor(t, 576, 256, 1636, 0.0f, stream);
        test_predictor(t, 576, 256, 1636, 20.0f, stream);
        test_gemm(handle, t, 5, 64, 70, 0, stream);
    }
    test_refusals(handle, stream);

    cublasDestroy(handle);
    cudaStreamDestroy(stream);
    return test_result();
}
