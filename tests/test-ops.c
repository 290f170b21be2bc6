/*
 * test-ops.c - the CPU predictor and batched matrix product (codelets/ops.h)
 * against float64 references on random data, for every supported weight
 * type, and their refusal of bad shapes.
 *
 * Rows are random floats quantized with si_quantize_row() (random bytes with
 * small finite scales for the K-quants, which cannot be quantized here); the
 * references dot the rows as si_dequantize_row() decodes them, in double, so
 * what is measured is the kernels' float accumulation.  A sum of n products
 * accumulated in float in any order is within n * 2^-24 of the exact sum,
 * relative to the sum of the products' magnitudes: that is the tolerance,
 * with the magnitudes of the first product carried through the second for
 * the predictor.
 */
#include "codelets/ops.h"
#include "model/quants.h"
#include "model/types.h"
#include "starinfer.h"
#include "test.h"

#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static const uint32_t types[] = {SI_TYPE_F32,  SI_TYPE_F16,  SI_TYPE_BF16, SI_TYPE_Q8_0,
                                 SI_TYPE_Q4_0, SI_TYPE_Q4_1, SI_TYPE_Q5_0, SI_TYPE_Q5_1,
                                 SI_TYPE_Q4_K, SI_TYPE_Q5_K, SI_TYPE_Q6_K};
#define N_TYPES (sizeof types / sizeof types[0])

static uint64_t rng_state = 0x0b5e55edc0ffeeull;

/* splitmix64. */
static uint64_t rng(void)
{
    uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* Uniform in [-amp, amp). */
static float frand(float amp)
{
    return amp * (float)((double)(rng() >> 11) * 0x1p-52 - 1.0);
}

static void *xmalloc(size_t bytes)
{
    void *p = malloc(bytes ? bytes : 1);
    if (p == NULL) {
        fprintf(stderr, "out of memory\n");
        exit(1);
    }
    return p;
}

static void put_half(uint8_t *p, float f)
{
    const uint16_t h = si_fp32_to_fp16(f);
    memcpy(p, &h, sizeof h);
}

/* A weight matrix: n_rows rows of n_cols elements of `type`, stride bytes
 * apart, and the values they decode to. */
struct mat {
    uint32_t type;
    int64_t n_rows, n_cols;
    size_t stride;
    uint8_t *data;
    float *deq;
};

static void mat_make(struct mat *m, uint32_t t, int64_t n_rows, int64_t n_cols, size_t pad)
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
    m->data = xmalloc((size_t)n_rows * m->stride);
    m->deq = xmalloc((size_t)(n_rows * n_cols) * sizeof(float));
    memset(m->data, 0xa5, (size_t)n_rows * m->stride); /* the padding too */
    float *src = xmalloc((size_t)n_cols * sizeof(float));
    const struct si_type_traits *tr = si_type_get(t);
    for (int64_t r = 0; r < n_rows; r++) {
        uint8_t *row = m->data + (size_t)r * m->stride;
        if (si_type_quantizable(t)) {
            for (int64_t i = 0; i < n_cols; i++)
                src[i] = frand(0.5f);
            si_quantize_row(t, src, row, n_cols);
        } else {
            /* K-quants: random quants and sub-block scales, small finite
             * super-block scales (d, dmin at 0 and 2; Q6_K's d at 208). */
            for (size_t i = 0; i < bytes; i++)
                row[i] = (uint8_t)rng();
            for (int64_t b = 0; b < n_cols / tr->block; b++) {
                uint8_t *p = row + (size_t)b * tr->size;
                if (t == SI_TYPE_Q6_K) {
                    put_half(p + 208, frand(0.01f));
                } else {
                    put_half(p, frand(0.01f));
                    put_half(p + 2, frand(0.01f));
                }
            }
        }
        si_dequantize_row(t, row, m->deq + (size_t)(r * n_cols), n_cols);
    }
    free(src);
}

static void mat_free(struct mat *m)
{
    free(m->data);
    free(m->deq);
}

/* |got - ref| / scale; 0 for an exact match, infinity for NaN. */
static double norm_err(double got, double ref, double scale)
{
    const double e = fabs(got - ref);
    if (isnan(e))
        return INFINITY;
    if (e == 0.0)
        return 0.0;
    return scale > 0.0 ? e / scale : INFINITY;
}

/* ------------------------------------------------------------ gemm */

static void test_gemm(uint32_t t, int64_t n_rows, int64_t n_cols, int64_t n_tok, size_t pad,
                      int64_t x_gap, int64_t y_gap)
{
    struct mat m;
    mat_make(&m, t, n_rows, n_cols, pad);
    const int64_t ldx = n_cols + x_gap, ldy = n_rows + y_gap;
    float *x = xmalloc((size_t)(n_tok * ldx) * sizeof *x);
    float *y = xmalloc((size_t)(n_tok * ldy) * sizeof *y);
    for (int64_t i = 0; i < n_tok * ldx; i++)
        x[i] = frand(1.0f);
    /* NaN where y is written (it must be overwritten, not read), a sentinel
     * in the gaps between tokens (they must be left alone). */
    for (int64_t i = 0; i < n_tok * ldy; i++)
        y[i] = i % ldy < n_rows ? NAN : 1234.5f;
    const size_t sbytes = si_k_gemm_scratch_size(t, n_cols);
    void *scratch = sbytes ? xmalloc(sbytes) : NULL;
    char what[96];
    snprintf(what, sizeof what, "gemm %s %lldx%lld n_tok %lld pad %zu", si_type_name(t),
             (long long)n_rows, (long long)n_cols, (long long)n_tok, pad);
    const int rc = si_k_gemm(t, m.data, pad ? m.stride : 0, n_rows, n_cols, x, ldx, n_tok, y, ldy,
                             scratch);
    CHECK(rc == SI_OK, "%s: returned %d", what, rc);
    /* n * 2^-24, the bound of any float summation order (relative to the
     * sum of |products|); the dequantized values are exact on both sides. */
    const double tol = (double)(n_cols + 1) * 0x1p-24;
    double worst = 0.0, worst_dot = 0.0;
    int bad_gap = 0;
    for (int64_t tk = 0; tk < n_tok; tk++) {
        const float *xt = x + (size_t)(tk * ldx);
        for (int64_t r = 0; r < n_rows; r++) {
            const float *w = m.deq + (size_t)(r * n_cols);
            double ref = 0.0, mag = 0.0;
            for (int64_t i = 0; i < n_cols; i++) {
                ref += (double)w[i] * (double)xt[i];
                mag += fabs((double)w[i] * (double)xt[i]);
            }
            const float got = y[tk * ldy + r];
            double e = norm_err(got, ref, mag);
            worst = e > worst ? e : worst;
            /* Against the loop of si_vec_dot() it replaces: both within tol. */
            const float dot = si_vec_dot(t, m.data + (size_t)r * m.stride, xt, n_cols);
            e = norm_err(got, dot, mag);
            worst_dot = e > worst_dot ? e : worst_dot;
        }
        for (int64_t r = n_rows; r < ldy; r++)
            bad_gap += y[tk * ldy + r] != 1234.5f;
    }
    CHECK(worst <= tol, "%s: normalised error %g > %g", what, worst, tol);
    CHECK(worst_dot <= 2 * tol, "%s: differs from si_vec_dot by %g > %g", what, worst_dot,
          2 * tol);
    CHECK(bad_gap == 0, "%s: %d values written between tokens", what, bad_gap);
    printf("%-44s err %.2e (vs si_vec_dot %.2e, tol %.1e)\n", what, worst, worst_dot, tol);
    free(scratch);
    free(x);
    free(y);
    mat_free(&m);
}

static void test_gemm_refusals(void)
{
    static float buf[4096], x[1024], y[1024], scratch[SI_K_GEMM_TILE_ROWS * 256];
    y[0] = 7.0f;
    /* (type, rows, cols, row_bytes, ldx, n_tok, ldy, scratch) */
    CHECK(si_k_gemm(SI_TYPE_Q2_K, buf, 0, 2, 256, x, 256, 1, y, 2, scratch) == SI_E_INVALID,
          "unsupported Q2_K accepted");
    CHECK(si_k_gemm(SI_TYPE_COUNT + 3, buf, 0, 2, 256, x, 256, 1, y, 2, scratch) == SI_E_INVALID,
          "unknown type accepted");
    CHECK(si_k_gemm(SI_TYPE_Q4_0, buf, 0, 2, 48, x, 48, 1, y, 2, scratch) == SI_E_INVALID,
          "Q4_0 row of 48 accepted");
    CHECK(si_k_gemm(SI_TYPE_Q4_K, buf, 0, 2, 128, x, 128, 1, y, 2, scratch) == SI_E_INVALID,
          "Q4_K row of 128 accepted");
    CHECK(si_k_gemm(SI_TYPE_Q8_0, buf, 30, 2, 32, x, 32, 1, y, 2, scratch) == SI_E_INVALID,
          "row stride below the row size accepted");
    CHECK(si_k_gemm(SI_TYPE_F32, buf, 0, 2, 8, x, 7, 1, y, 2, NULL) == SI_E_INVALID,
          "ldx < n_cols accepted");
    CHECK(si_k_gemm(SI_TYPE_F32, buf, 0, 3, 8, x, 8, 2, y, 2, NULL) == SI_E_INVALID,
          "ldy < n_rows accepted");
    CHECK(si_k_gemm(SI_TYPE_F32, buf, 34, 2, 8, x, 8, 1, y, 2, NULL) == SI_E_INVALID,
          "F32 stride not a multiple of 4 accepted");
    CHECK(si_k_gemm(SI_TYPE_F32, (char *)buf + 2, 0, 2, 8, x, 8, 1, y, 2, NULL) == SI_E_INVALID,
          "misaligned F32 rows accepted");
    CHECK(si_k_gemm(SI_TYPE_Q4_0, buf, 0, 2, 32, x, 32, 1, y, 2, NULL) == SI_E_INVALID,
          "Q4_0 without scratch accepted");
    CHECK(si_k_gemm(SI_TYPE_F32, buf, 0, 2, 8, x, 8, -1, y, 2, NULL) == SI_E_INVALID,
          "negative n_tok accepted");
    CHECK(si_k_gemm(SI_TYPE_F32, buf, 0, -2, 8, x, 8, 1, y, 2, NULL) == SI_E_INVALID,
          "negative n_rows accepted");
    CHECK(si_k_gemm(SI_TYPE_F32, buf, 0, 2, 0, x, 8, 1, y, 2, NULL) == SI_E_INVALID,
          "zero n_cols accepted");
    CHECK(si_k_gemm(SI_TYPE_F32, NULL, 0, 2, 8, x, 8, 1, y, 2, NULL) == SI_E_INVALID,
          "NULL weights accepted");
    CHECK(si_k_gemm(SI_TYPE_F32, buf, 0, 2, 8, NULL, 8, 1, y, 2, NULL) == SI_E_INVALID,
          "NULL x accepted");
    CHECK(y[0] == 7.0f, "a refused gemm wrote y");
    CHECK(si_k_gemm(SI_TYPE_F32, buf, 0, 2, 8, x, 8, 0, y, 2, NULL) == SI_OK, "n_tok 0 refused");
    CHECK(si_k_gemm(SI_TYPE_Q4_0, buf, 0, 0, 32, x, 32, 1, y, 0, scratch) == SI_OK,
          "n_rows 0 refused");
    CHECK(y[0] == 7.0f, "an empty gemm wrote y");
    CHECK(si_k_gemm_scratch_size(SI_TYPE_F32, 4096) == 0, "F32 needs scratch");
    CHECK(si_k_gemm_scratch_size(SI_TYPE_Q4_K, 256) == SI_K_GEMM_TILE_ROWS * 256 * sizeof(float),
          "Q4_K scratch size");
}

/* ------------------------------------------------------------ predictor */

static void test_predictor(uint32_t t1, uint32_t t2, int64_t n_embd, int64_t r, int64_t n_ff,
                           size_t pad)
{
    struct mat fc1, fc2;
    mat_make(&fc1, t1, r, n_embd, pad);
    mat_make(&fc2, t2, n_ff, r, pad);
    float *x = xmalloc((size_t)n_embd * sizeof *x), *hid = xmalloc((size_t)r * sizeof *hid);
    float *z = xmalloc((size_t)n_ff * sizeof *z);
    int32_t *idx = xmalloc((size_t)n_ff * sizeof *idx), *idx2 = xmalloc((size_t)n_ff * sizeof *idx2);
    for (int64_t i = 0; i < n_embd; i++)
        x[i] = frand(1.0f);

    /* The reference, with each value's magnitude (sum of |terms|, the
     * first product's magnitudes carried through the second). */
    double *h_ref = xmalloc((size_t)r * sizeof *h_ref), *h_mag = xmalloc((size_t)r * sizeof *h_mag);
    double *z_ref = xmalloc((size_t)n_ff * sizeof *z_ref),
           *z_mag = xmalloc((size_t)n_ff * sizeof *z_mag);
    for (int64_t j = 0; j < r; j++) {
        double s = 0.0, a = 0.0;
        for (int64_t i = 0; i < n_embd; i++) {
            const double p = (double)fc1.deq[(size_t)(j * n_embd + i)] * (double)x[i];
            s += p;
            a += fabs(p);
        }
        h_ref[j] = s > 0.0 ? s : 0.0;
        h_mag[j] = a;
    }
    for (int64_t i = 0; i < n_ff; i++) {
        double s = 0.0, a = 0.0;
        for (int64_t j = 0; j < r; j++) {
            const double w = fc2.deq[(size_t)(i * r + j)];
            s += w * h_ref[j];
            a += fabs(w) * h_mag[j];
        }
        z_ref[i] = s;
        z_mag[i] = a;
    }
    /* Two thresholds: about half the neurons, and a few. */
    double zmax = 0.0;
    for (int64_t i = 0; i < n_ff; i++)
        zmax = z_ref[i] > zmax ? z_ref[i] : zmax;
    const float thresholds[] = {0.0f, (float)(0.7 * zmax)};
    const double tol = (double)(n_embd + r + 2) * 0x1p-24;

    for (size_t ti = 0; ti < 2; ti++) {
        const float thr = thresholds[ti];
        char what[96];
        snprintf(what, sizeof what, "predictor %s/%s %lld-%lld-%lld thr %.3g", si_type_name(t1),
                 si_type_name(t2), (long long)n_embd, (long long)r, (long long)n_ff, thr);
        const int64_t n = si_k_predictor(t1, fc1.data, pad ? fc1.stride : 0, t2, fc2.data,
                                         pad ? fc2.stride : 0, n_embd, r, n_ff, x, thr, hid, z,
                                         idx);
        CHECK(n >= 0 && n <= n_ff, "%s: returned %lld", what, (long long)n);
        if (n < 0 || n > n_ff)
            continue;
        double worst_h = 0.0, worst_z = 0.0;
        for (int64_t j = 0; j < r; j++) {
            const double e = norm_err(hid[j], h_ref[j], h_mag[j]);
            worst_h = e > worst_h ? e : worst_h;
            CHECK(hid[j] >= 0.0f, "%s: hid[%lld] = %g after ReLU", what, (long long)j, hid[j]);
        }
        for (int64_t i = 0; i < n_ff; i++) {
            const double e = norm_err(z[i], z_ref[i], z_mag[i]);
            worst_z = e > worst_z ? e : worst_z;
        }
        CHECK(worst_h <= tol, "%s: fc1 error %g > %g", what, worst_h, tol);
        CHECK(worst_z <= tol, "%s: fc2 error %g > %g", what, worst_z, tol);
        /* idx: exactly the i with z[i] >= thr, increasing; against the
         * reference, disagreements only within the tolerance of thr. */
        int64_t k = 0, wrong = 0, unsure = 0;
        for (int64_t i = 0; i < n_ff; i++) {
            const bool in = k < n && idx[k] == i;
            k += in;
            wrong += in != (z[i] >= thr);
            if (in != (z_ref[i] >= thr) && fabs(z_ref[i] - thr) > tol * z_mag[i])
                unsure++;
        }
        CHECK(k == n, "%s: idx not increasing or out of range", what);
        CHECK(wrong == 0, "%s: %lld neurons on the wrong side of z >= thr", what, (long long)wrong);
        CHECK(unsure == 0, "%s: %lld neurons disagree with the reference", what, (long long)unsure);
        /* Without z: the same list. */
        const int64_t n2 = si_k_predictor(t1, fc1.data, pad ? fc1.stride : 0, t2, fc2.data,
                                          pad ? fc2.stride : 0, n_embd, r, n_ff, x, thr, hid,
                                          NULL, idx2);
        CHECK(n2 == n && memcmp(idx, idx2, (size_t)n * sizeof *idx) == 0,
              "%s: a different list without z", what);
        printf("%-44s %5lld active, err fc1 %.2e fc2 %.2e (tol %.1e)\n", what, (long long)n,
               worst_h, worst_z, tol);
    }
    free(x);
    free(hid);
    free(z);
    free(idx);
    free(idx2);
    free(h_ref);
    free(h_mag);
    free(z_ref);
    free(z_mag);
    mat_free(&fc1);
    mat_free(&fc2);
}

static void test_predictor_refusals(void)
{
    static float w[8192], x[256], hid[256];
    static int32_t idx[256];
    idx[0] = -5;
    CHECK(si_k_predictor(SI_TYPE_Q4_0, w, 0, SI_TYPE_F32, w, 0, 48, 32, 16, x, 0.0f, hid, NULL,
                         idx) == SI_E_INVALID,
          "fc1 row of 48 Q4_0 accepted");
    CHECK(si_k_predictor(SI_TYPE_F32, w, 0, SI_TYPE_Q8_0, w, 0, 64, 48, 16, x, 0.0f, hid, NULL,
                         idx) == SI_E_INVALID,
          "fc2 row of 48 Q8_0 accepted");
    CHECK(si_k_predictor(SI_TYPE_F32, w, 100, SI_TYPE_F32, w, 0, 64, 32, 16, x, 0.0f, hid, NULL,
                         idx) == SI_E_INVALID,
          "fc1 stride below its row accepted");
    CHECK(si_k_predictor(SI_TYPE_Q2_K, w, 0, SI_TYPE_F32, w, 0, 256, 32, 16, x, 0.0f, hid, NULL,
                         idx) == SI_E_INVALID,
          "unsupported fc1 type accepted");
    CHECK(si_k_predictor(SI_TYPE_F32, w, 0, SI_TYPE_F32, w, 0, 64, 0, 16, x, 0.0f, hid, NULL,
                         idx) == SI_E_INVALID,
          "r = 0 accepted");
    CHECK(si_k_predictor(SI_TYPE_F32, w, 0, SI_TYPE_F32, w, 0, 64, 32, -1, x, 0.0f, hid, NULL,
                         idx) == SI_E_INVALID,
          "negative n_ff accepted");
    CHECK(si_k_predictor(SI_TYPE_F32, w, 0, SI_TYPE_F32, w, 0, 64, 32, (int64_t)INT32_MAX + 1, x,
                         0.0f, hid, NULL, idx) == SI_E_INVALID,
          "n_ff past int32 accepted");
    CHECK(si_k_predictor(SI_TYPE_F32, w, 0, SI_TYPE_F32, w, 0, 64, 32, 16, x, 0.0f, NULL, NULL,
                         idx) == SI_E_INVALID,
          "NULL hid accepted");
    CHECK(si_k_predictor(SI_TYPE_F32, w, 0, SI_TYPE_F32, NULL, 0, 64, 32, 16, x, 0.0f, hid, NULL,
                         idx) == SI_E_INVALID,
          "NULL fc2 accepted");
    CHECK(idx[0] == -5, "a refused predictor wrote idx");
    CHECK(si_k_predictor(SI_TYPE_F32, w, 0, SI_TYPE_F32, w, 0, 64, 32, 0, x, 0.0f, hid, NULL,
                         idx) == 0,
          "n_ff = 0 not an empty list");
    /* All-zero weights: z = 0 for every neuron, which passes threshold 0. */
    CHECK(si_k_predictor(SI_TYPE_F32, w, 0, SI_TYPE_F32, w, 0, 64, 32, 16, x, 0.0f, hid, NULL,
                         idx) == 16 && idx[15] == 15,
          "z = 0 does not pass threshold 0");
}

int main(void)
{
    printf("CPU quants: %s\n", si_quants_impl());
    for (size_t ti = 0; ti < N_TYPES; ti++) {
        const uint32_t t = types[ti];
        const int64_t bs = si_type_get(t)->block;
        const int64_t cols = bs == 256 ? 512 : 320;
        test_gemm(t, 150, cols, 7, 0, 5, 3);  /* a partial tile, gaps in x and y */
        test_gemm(t, 64, cols, 1, 16, 0, 0); /* one token, padded rows */
        test_gemm(t, 3, bs == 256 ? 256 : 32, 70, 0, 0, 0); /* more tokens than rows */
        test_predictor(t, t, cols, 256, 1000, 0);
    }
    /* Mixed types and padded rows, as a converted PowerInfer file may hold. */
    test_predictor(SI_TYPE_Q8_0, SI_TYPE_F16, 576, 128, 1536, 8);
    test_predictor(SI_TYPE_Q4_1, SI_TYPE_F32, 576, 96, 1536, 0);
    test_gemm_refusals();
    test_predictor_refusals();
    return test_result();
}
