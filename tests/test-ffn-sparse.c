/*
 * test-ffn-sparse.c - the sparse FFN kernels (codelets/ffn_sparse.h) on
 * random layer slices of F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0 and Q5_1
 * weights, for every FFN kind and activation:
 *   - dense h equals, bit for bit, h formed as the reference forward pass
 *     forms it (si_vec_dot_act, then model/act.h's activation);
 *   - sparse h for idx sets that are empty, one neuron, all in order, a
 *     random unsorted subset, and a subset with duplicates: h[k] equals
 *     dense h[idx[k]] bit for bit, and a float64 reference from the
 *     dequantized rows and activations within the dots' tolerance;
 *   - sparse y against the float64 sum of h[k] * down_t row idx[k]
 *     (duplicates count once per entry; y is overwritten, not added to);
 *   - mask extraction against its definition, and ReLU's mask reproducing
 *     the all-neuron y bit for bit;
 *   - the down part by rows (axpy) against the reference's matvec with
 *     quantized h: both against float64, the relative errors printed.
 *
 * Tolerances: h within 1e-5 of the dots' sums of |terms| carried through
 * the activation (slope <= 1.13) plus 1e-6 of |h|, and for GELU its two
 * fp16 roundings (of the input and of the value, llama.cpp's table): 2^-11
 * of |gelu| + 1.13 |x|; y within 1e-5 of the sum of |h[k]| * (|w| + |the
 * block's min|).
 */
#include "codelets/ffn_sparse.h"
#include "model/act.h"
#include "model/quants.h"
#include "model/types.h"
#include "test.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define N_EMBD 256
#define N_FF 96
#define DOT_TOL 1e-5

static uint64_t rng_state = 0x0ff5ba75e1234ull;

/* splitmix64. */
static uint64_t rng(void)
{
    uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static double uniform(double lo, double hi)
{
    return lo + (hi - lo) * (double)(rng() >> 11) * 0x1p-53;
}

static void *xmalloc(size_t bytes)
{
    void *p = malloc(bytes != 0 ? bytes : 1);
    if (p == NULL)
        abort();
    return p;
}

/* The reference forward pass's activation (forward.c's, from model/act.h). */
static float ref_act(enum si_act a, float x)
{
    return si_act_apply(a, x);
}

static double act64(enum si_act a, double x)
{
    switch (a) {
    case SI_ACT_RELU:
        return x > 0 ? x : 0;
    case SI_ACT_GELU:
        return 0.5 * x * (1 + tanh(0.7978845608028654 * x * (1 + 0.044715 * x * x)));
    case SI_ACT_SILU:
    default:
        return x / (1 + exp(-x));
    }
}

/* ------------------------------------------------------ slices */

struct slice {
    uint32_t type;
    size_t row_bytes;
    uint8_t *gate, *up, *down_t; /* [N_FF] rows of N_EMBD */
    double *g64, *u64, *d64;     /* the same dequantized, [N_FF][N_EMBD] */
    double *dmag;                /* |d64| + |the block's min|: the size of its terms */
    float *up_b;                 /* [N_FF] */
};

/* Rows of random floats quantized to t, and their values back in double. */
static void random_rows(uint32_t t, int64_t rows, int64_t n, uint8_t **q, double **v,
                        size_t *row_bytes)
{
    if (!si_type_row_size(t, n, row_bytes))
        abort();
    *q = xmalloc((size_t)rows * *row_bytes);
    *v = xmalloc((size_t)rows * (size_t)n * sizeof **v);
    float *f = xmalloc((size_t)n * sizeof *f);
    for (int64_t r = 0; r < rows; r++) {
        for (int64_t i = 0; i < n; i++)
            f[i] = (float)uniform(-0.2, 0.2);
        uint8_t *row = *q + (size_t)r * *row_bytes;
        si_quantize_row(t, f, row, n);
        si_dequantize_row(t, row, f, n);
        for (int64_t i = 0; i < n; i++)
            (*v)[r * n + i] = f[i];
    }
    free(f);
}

static void slice_init(struct slice *s, uint32_t t)
{
    s->type = t;
    random_rows(t, N_FF, N_EMBD, &s->gate, &s->g64, &s->row_bytes);
    random_rows(t, N_FF, N_EMBD, &s->up, &s->u64, &s->row_bytes);
    random_rows(t, N_FF, N_EMBD, &s->down_t, &s->d64, &s->row_bytes);
    s->dmag = xmalloc((size_t)N_FF * N_EMBD * sizeof *s->dmag);
    for (int i = 0; i < N_FF; i++) {
        for (int j = 0; j < N_EMBD; j++) {
            double m = 0;
            if (t == SI_TYPE_Q4_1 || t == SI_TYPE_Q5_1) {
                const uint8_t *b = s->down_t + (size_t)i * s->row_bytes + (size_t)(j / 32) *
                                                                             si_type_get(t)->size;
                uint16_t h;
                memcpy(&h, b + 2, sizeof h);
                m = fabs(si_fp16_to_fp32(h));
            }
            s->dmag[i * N_EMBD + j] = fabs(s->d64[i * N_EMBD + j]) + m;
        }
    }
    s->up_b = xmalloc(N_FF * sizeof *s->up_b);
    for (int i = 0; i < N_FF; i++)
        s->up_b[i] = (float)uniform(-0.5, 0.5);
}

static void slice_free(struct slice *s)
{
    free(s->gate);
    free(s->up);
    free(s->down_t);
    free(s->g64);
    free(s->u64);
    free(s->d64);
    free(s->dmag);
    free(s->up_b);
}

static double half_at(const uint8_t *p)
{
    uint16_t h;
    memcpy(&h, p, sizeof h);
    return si_fp16_to_fp32(h);
}

/* The values of n activations converted to type at (F32, F16, BF16, Q8_0, Q8_1). */
static void act_values(uint32_t at, const uint8_t *xa, int64_t n, double *v)
{
    for (int64_t i = 0; i < n; i++) {
        switch (at) {
        case SI_TYPE_F32: {
            float f;
            memcpy(&f, xa + 4 * i, sizeof f);
            v[i] = f;
            break;
        }
        case SI_TYPE_F16:
            v[i] = half_at(xa + 2 * i);
            break;
        case SI_TYPE_BF16: {
            uint16_t h;
            memcpy(&h, xa + 2 * i, sizeof h);
            v[i] = si_bf16_to_fp32(h);
            break;
        }
        case SI_TYPE_Q8_0: {
            const uint8_t *b = xa + (size_t)(i / 32) * 34;
            v[i] = half_at(b) * (int8_t)b[2 + i % 32];
            break;
        }
        case SI_TYPE_Q8_1: {
            const uint8_t *b = xa + (size_t)(i / 32) * 36;
            v[i] = half_at(b) * (int8_t)b[4 + i % 32];
            break;
        }
        default:
            abort();
        }
    }
}

/*
 * Q4_1 and Q5_1 rows dot Q8_1 activations as d_w * d_a * sum(q_w * q_a) +
 * m_w * s_a per block, s_a = d_a * sum(q_a) stored as a half: the dot of
 * the dequantized values plus m_w * (s_a - sum of the block's values).
 */
static double q8_1_correction(uint32_t t, const uint8_t *row, const uint8_t *xa, const double *xv)
{
    if (t != SI_TYPE_Q4_1 && t != SI_TYPE_Q5_1)
        return 0;
    const size_t size = si_type_get(t)->size;
    double c = 0;
    for (int b = 0; b < N_EMBD / 32; b++) {
        double sum = 0;
        for (int j = 0; j < 32; j++)
            sum += xv[32 * b + j];
        c += half_at(row + (size_t)b * size + 2) * (half_at(xa + (size_t)b * 36 + 2) - sum);
    }
    return c;
}

/* ------------------------------------------------------ act */

struct ffn_case {
    enum si_ffn_kind kind;
    enum si_act act;
    bool bias;
};

static const struct ffn_case cases[] = {
    {SI_FFN_GATED, SI_ACT_SILU, false},       {SI_FFN_GATED, SI_ACT_RELU, false},
    {SI_FFN_GATED, SI_ACT_GELU, true},        {SI_FFN_GATED_RELU2, SI_ACT_RELU, false},
    {SI_FFN_PLAIN, SI_ACT_RELU, true},        {SI_FFN_PLAIN, SI_ACT_GELU, true},
    {SI_FFN_PLAIN, SI_ACT_SILU, false},
};
#define N_CASES (sizeof cases / sizeof cases[0])

/* h of neuron i as forward.c's ffn() forms it. */
static float reference_h(const struct slice *s, const struct ffn_case *c, const void *xa, int i)
{
    float hu = si_vec_dot_act(s->type, s->up + (size_t)i * s->row_bytes, xa, N_EMBD);
    if (c->bias)
        hu += s->up_b[i];
    if (c->kind == SI_FFN_PLAIN)
        return ref_act(c->act, hu);
    float hg = si_vec_dot_act(s->type, s->gate + (size_t)i * s->row_bytes, xa, N_EMBD);
    float up = c->kind == SI_FFN_GATED_RELU2 ? ref_act(SI_ACT_RELU, hu) : hu;
    return ref_act(c->act, hg) * up;
}

/* h of neuron i in float64 from the dequantized rows and activations; *bound its tolerance. */
static double h64(const struct slice *s, const struct ffn_case *c, const uint8_t *xa,
                  const double *xv, int i, double *bound)
{
    double g = q8_1_correction(s->type, s->gate + (size_t)i * s->row_bytes, xa, xv), ga = fabs(g);
    double u = (c->bias ? s->up_b[i] : 0) +
               q8_1_correction(s->type, s->up + (size_t)i * s->row_bytes, xa, xv);
    double ua = fabs(u);
    for (int j = 0; j < N_EMBD; j++) {
        g += s->g64[(size_t)i * N_EMBD + j] * xv[j];
        ga += fabs(s->g64[(size_t)i * N_EMBD + j] * xv[j]);
        u += s->u64[(size_t)i * N_EMBD + j] * xv[j];
        ua += fabs(s->u64[(size_t)i * N_EMBD + j] * xv[j]);
    }
    double eg = DOT_TOL * ga, eu = DOT_TOL * ua, h;
    if (c->kind == SI_FFN_PLAIN) {
        h = act64(c->act, u);
        *bound = 1.2 * eu;
        if (c->act == SI_ACT_GELU)
            *bound += 0x1p-11 * (fabs(h) + 1.13 * fabs(u));
    } else {
        double up = c->kind == SI_FFN_GATED_RELU2 ? act64(SI_ACT_RELU, u) : u;
        double ag = act64(c->act, g);
        h = ag * up;
        double ea = 1.2 * eg; /* the activation's error from the gate dot's */
        if (c->act == SI_ACT_GELU)
            ea += 0x1p-11 * (fabs(ag) + 1.13 * fabs(g)); /* its fp16 roundings */
        *bound = ea * (fabs(up) + eu) + (fabs(ag) + ea) * eu;
    }
    *bound += 1e-6 * fabs(h) + 1e-30;
    return h;
}

/* The idx sets: name, count, entries. */
static int64_t make_idx(int which, int32_t *idx, const char **name)
{
    switch (which) {
    case 0:
        *name = "empty";
        return 0;
    case 1:
        *name = "one";
        idx[0] = (int32_t)(rng() % N_FF);
        return 1;
    case 2:
        *name = "all";
        for (int i = 0; i < N_FF; i++)
            idx[i] = i;
        return N_FF;
    case 3: { /* a random third of the neurons, in random order */
        *name = "unsorted";
        int32_t perm[N_FF];
        for (int i = 0; i < N_FF; i++)
            perm[i] = i;
        for (int i = N_FF - 1; i > 0; i--) {
            int j = (int)(rng() % (uint64_t)(i + 1));
            int32_t t = perm[i];
            perm[i] = perm[j];
            perm[j] = t;
        }
        memcpy(idx, perm, N_FF / 3 * sizeof *idx);
        return N_FF / 3;
    }
    default: /* 2 * N_FF entries drawn with replacement: many duplicates */
        *name = "duplicates";
        for (int i = 0; i < 2 * N_FF; i++)
            idx[i] = (int32_t)(rng() % N_FF);
        return 2 * N_FF;
    }
}

static void check_slice(const struct slice *s, const struct ffn_case *c)
{
    const char *tn = si_type_name(s->type);
    const uint32_t at = si_act_type(s->type);
    size_t xa_bytes;
    if (!si_type_row_size(at, N_EMBD, &xa_bytes))
        abort();
    float x[N_EMBD];
    for (int j = 0; j < N_EMBD; j++)
        x[j] = (float)uniform(-1, 1);
    uint8_t *xa = xmalloc(xa_bytes);
    si_quantize_act(at, x, xa, N_EMBD);
    double xv[N_EMBD];
    act_values(at, xa, N_EMBD, xv);
    const float *b = c->bias ? s->up_b : NULL;
    const void *gate = c->kind == SI_FFN_PLAIN ? NULL : s->gate;

    /* Dense: the reference's values exactly. */
    float dense[N_FF];
    si_k_ffn_act_dense(c->kind, c->act, s->type, gate, s->up, b, s->row_bytes, N_EMBD, xa, N_FF,
                       dense);
    int bad = 0;
    for (int i = 0; i < N_FF; i++) {
        float r = reference_h(s, c, xa, i);
        bad += memcmp(&r, &dense[i], sizeof r) != 0;
    }
    CHECK(bad == 0, "%s kind %d act %d: %d dense h differ from the reference's", tn, c->kind,
          c->act, bad);

    int32_t idx[2 * N_FF];
    float h[2 * N_FF + 1], y[N_EMBD]; /* h[n_idx] must stay untouched */
    for (int which = 0; which < 5; which++) {
        const char *name;
        int64_t n = make_idx(which, idx, &name);
        for (int k = 0; k < 2 * N_FF + 1; k++)
            h[k] = NAN;
        si_k_ffn_act_sparse(c->kind, c->act, s->type, gate, s->up, b, s->row_bytes, N_EMBD, xa,
                            idx, n, h);
        int bad_exact = 0, bad_ref = 0;
        for (int64_t k = 0; k < n; k++) {
            bad_exact += memcmp(&h[k], &dense[idx[k]], sizeof h[k]) != 0;
            double bound, want = h64(s, c, xa, xv, idx[k], &bound);
            if (!(fabs(h[k] - want) <= bound)) {
                if (bad_ref++ == 0)
                    fprintf(stderr, "h[%lld] = %.9g, want %.9g +- %.3g\n", (long long)k, h[k],
                            want, bound);
            }
        }
        CHECK(bad_exact == 0, "%s kind %d act %d %s: %d sparse h differ from dense", tn, c->kind,
              c->act, name, bad_exact);
        CHECK(bad_ref == 0, "%s kind %d act %d %s: %d h off the float64 reference", tn, c->kind,
              c->act, name, bad_ref);
        CHECK(isnan(h[n]), "%s %s: h written past n_idx", tn, name);

        /* Down: y = sum of h[k] * down_t[idx[k]], overwriting y. */
        for (int j = 0; j < N_EMBD; j++)
            y[j] = NAN;
        si_k_ffn_down_sparse(s->type, s->down_t, s->row_bytes, N_EMBD, h, idx, n, y);
        int bad_y = 0;
        for (int j = 0; j < N_EMBD; j++) {
            double want = 0, mag = 0;
            for (int64_t k = 0; k < n; k++) {
                want += (double)h[k] * s->d64[(size_t)idx[k] * N_EMBD + j];
                mag += fabs(h[k]) * s->dmag[(size_t)idx[k] * N_EMBD + j];
            }
            if (!(fabs(y[j] - want) <= DOT_TOL * mag + 1e-30)) {
                if (bad_y++ == 0)
                    fprintf(stderr, "y[%d] = %.9g, want %.9g (of %.3g)\n", j, y[j], want, mag);
            }
        }
        CHECK(bad_y == 0, "%s kind %d act %d %s: %d y off the float64 reference", tn, c->kind,
              c->act, name, bad_y);
    }

    /* ReLU: the mask from the gate (or up) pre-activations drops only zeros of h. */
    if (c->act == SI_ACT_RELU) {
        float pre[N_FF];
        for (int i = 0; i < N_FF; i++) {
            const uint8_t *row = (c->kind == SI_FFN_PLAIN ? s->up : s->gate) + (size_t)i * s->row_bytes;
            pre[i] = si_vec_dot_act(s->type, row, xa, N_EMBD);
            if (c->kind == SI_FFN_PLAIN && b != NULL)
                pre[i] += b[i];
        }
        int32_t mask[N_FF];
        int64_t n = si_k_ffn_mask_from_gate(SI_ACT_RELU, pre, N_FF, 0.0f, mask);
        int dropped = 0;
        for (int i = 0, k = 0; i < N_FF; i++) {
            if (k < n && mask[k] == i)
                k++;
            else
                dropped += dense[i] != 0.0f;
        }
        CHECK(dropped == 0, "%s kind %d: the ReLU mask drops %d active neurons", tn, c->kind,
              dropped);
        float hm[N_FF], ym[N_EMBD], yall[N_EMBD];
        int32_t all[N_FF];
        for (int i = 0; i < N_FF; i++)
            all[i] = i;
        si_k_ffn_act_sparse(c->kind, c->act, s->type, gate, s->up, b, s->row_bytes, N_EMBD, xa,
                            mask, n, hm);
        si_k_ffn_down_sparse(s->type, s->down_t, s->row_bytes, N_EMBD, hm, mask, n, ym);
        si_k_ffn_down_sparse(s->type, s->down_t, s->row_bytes, N_EMBD, dense, all, N_FF, yall);
        CHECK(memcmp(ym, yall, sizeof ym) == 0, "%s kind %d: masked y differs from all-neuron y",
              tn, c->kind);
    }
    free(xa);
}

/* ------------------------------------------------------ mask */

static void test_mask(void)
{
    float pre[200];
    for (int i = 0; i < 200; i++)
        pre[i] = (float)uniform(-4, 4);
    pre[3] = 0.0f;
    pre[4] = -0.0f;
    pre[5] = NAN;
    pre[6] = 1e-30f;
    int32_t idx[200];
    const enum si_act acts[] = {SI_ACT_RELU, SI_ACT_SILU, SI_ACT_GELU};
    const float thresholds[] = {0.0f, 0.05f, 0.5f};
    for (int a = 0; a < 3; a++) {
        for (int t = 0; t < 3; t++) {
            for (int k = 0; k < 200; k++)
                idx[k] = -1;
            int64_t n = si_k_ffn_mask_from_gate(acts[a], pre, 200, thresholds[t], idx);
            int64_t k = 0;
            int bad = 0;
            for (int i = 0; i < 200; i++) {
                if (fabsf(ref_act(acts[a], pre[i])) > thresholds[t])
                    bad += k >= n || idx[k++] != i;
            }
            CHECK(bad == 0 && k == n, "mask act %d threshold %g: %d wrong, %lld of %lld", a,
                  (double)thresholds[t], bad, (long long)k, (long long)n);
            CHECK(n == 200 || idx[n] == -1, "mask wrote past its count");
        }
    }
    /* ReLU, threshold 0: exactly pre > 0 (not zero, not NaN, 1e-30 included). */
    int64_t n = si_k_ffn_mask_from_gate(SI_ACT_RELU, pre, 200, 0.0f, idx);
    int64_t want = 0;
    for (int i = 0; i < 200; i++)
        want += pre[i] > 0.0f;
    CHECK(n == want, "ReLU mask: %lld, want %lld", (long long)n, (long long)want);
    CHECK(si_k_ffn_mask_from_gate(SI_ACT_SILU, pre, 0, 0.0f, idx) == 0, "empty mask");
}

/* ------------------------------------------------------ down: rows vs matvec */

/*
 * The down projection two ways on the same float matrix: by rows of down_t
 * (si_k_ffn_down_sparse, all neurons) and as the reference's matvec on
 * down in GGUF layout with h converted (si_k_ffn_down_dense); each against
 * float64 on its own dequantized weights (Q4_0 quantizes the two layouts'
 * blocks differently), and against each other.  Prints the relative errors.
 */
static void test_down_numerics(uint32_t t, int64_t n_embd, int64_t n_ff)
{
    float *wf = xmalloc((size_t)(n_ff * n_embd) * sizeof *wf); /* [n_ff][n_embd] */
    float *col = xmalloc((size_t)n_ff * sizeof *col);
    for (int64_t i = 0; i < n_ff * n_embd; i++)
        wf[i] = (float)uniform(-0.05, 0.05);
    size_t rb_t, rb;
    if (!si_type_row_size(t, n_embd, &rb_t) || !si_type_row_size(t, n_ff, &rb))
        abort();
    uint8_t *down_t = xmalloc((size_t)n_ff * rb_t), *down = xmalloc((size_t)n_embd * rb);
    for (int64_t i = 0; i < n_ff; i++)
        si_quantize_row(t, wf + i * n_embd, down_t + (size_t)i * rb_t, n_embd);
    for (int64_t r = 0; r < n_embd; r++) {
        for (int64_t i = 0; i < n_ff; i++)
            col[i] = wf[i * n_embd + r];
        si_quantize_row(t, col, down + (size_t)r * rb, n_ff);
    }
    float *h = xmalloc((size_t)n_ff * sizeof *h);
    for (int64_t i = 0; i < n_ff; i++)
        h[i] = (float)uniform(-1, 1);
    int32_t *idx = xmalloc((size_t)n_ff * sizeof *idx);
    for (int64_t i = 0; i < n_ff; i++)
        idx[i] = (int32_t)i;
    float *y_rows = xmalloc((size_t)n_embd * sizeof *y_rows);
    float *y_mv = xmalloc((size_t)n_embd * sizeof *y_mv);
    void *hq = xmalloc(4 * (size_t)n_ff + 512);
    si_k_ffn_down_sparse(t, down_t, rb_t, n_embd, h, idx, n_ff, y_rows);
    si_k_ffn_down_dense(t, down, rb, n_ff, n_embd, h, hq, y_mv);

    /* float64 references on each layout's dequantized weights. */
    double e_rows = 0, e_mv = 0, e_ab = 0, n_rows = 0, n_mv = 0;
    float *w = xmalloc((size_t)(n_ff > n_embd ? n_ff : n_embd) * sizeof *w);
    double *ref_rows = calloc((size_t)n_embd, sizeof *ref_rows);
    if (ref_rows == NULL)
        abort();
    for (int64_t i = 0; i < n_ff; i++) {
        si_dequantize_row(t, down_t + (size_t)i * rb_t, w, n_embd);
        for (int64_t r = 0; r < n_embd; r++)
            ref_rows[r] += (double)h[i] * w[r];
    }
    for (int64_t r = 0; r < n_embd; r++) {
        si_dequantize_row(t, down + (size_t)r * rb, w, n_ff);
        double ref_mv = 0;
        for (int64_t i = 0; i < n_ff; i++)
            ref_mv += (double)h[i] * w[i];
        e_rows += (y_rows[r] - ref_rows[r]) * (y_rows[r] - ref_rows[r]);
        n_rows += ref_rows[r] * ref_rows[r];
        e_mv += (y_mv[r] - ref_mv) * (y_mv[r] - ref_mv);
        n_mv += ref_mv * ref_mv;
        e_ab += (double)(y_rows[r] - y_mv[r]) * (y_rows[r] - y_mv[r]);
    }
    double rel_rows = sqrt(e_rows / n_rows), rel_mv = sqrt(e_mv / n_mv),
           rel_ab = sqrt(e_ab / n_mv);
    printf("down %s %lldx%lld: relative L2 error vs float64: rows (axpy) %.2e, matvec with %s h "
           "%.2e; axpy vs matvec %.2e\n",
           si_type_name(t), (long long)n_embd, (long long)n_ff, rel_rows,
           si_type_name(si_act_type(t)), rel_mv, rel_ab);
    CHECK(rel_rows <= 1e-6, "%s: down by rows off by %.3g", si_type_name(t), rel_rows);
    CHECK(rel_mv <= (t == SI_TYPE_F32 ? 1e-6 : 1e-2), "%s: down matvec off by %.3g",
          si_type_name(t), rel_mv);
    free(wf);
    free(col);
    free(down_t);
    free(down);
    free(h);
    free(idx);
    free(y_rows);
    free(y_mv);
    free(hq);
    free(w);
    free(ref_rows);
}

int main(void)
{
    printf("quants: %s\n", si_quants_impl());
    const uint32_t types[] = {SI_TYPE_F32,  SI_TYPE_F16,  SI_TYPE_BF16, SI_TYPE_Q8_0,
                              SI_TYPE_Q4_0, SI_TYPE_Q4_1, SI_TYPE_Q5_0, SI_TYPE_Q5_1};
    for (size_t t = 0; t < sizeof types / sizeof types[0]; t++) {
        struct slice s;
        slice_init(&s, types[t]);
        for (size_t c = 0; c < N_CASES; c++)
            check_slice(&s, &cases[c]);
        slice_free(&s);
    }
    test_mask();
    test_down_numerics(SI_TYPE_F32, 1024, 2752);
    test_down_numerics(SI_TYPE_F16, 1024, 2752);
    test_down_numerics(SI_TYPE_Q4_0, 1024, 2752);
    return test_result();
}
