/*
 * test-input-engine.c - input sparsity (TEAL) as the engine computes it:
 * the transposed copies (model/transpose.h: each entry where the exact
 * transpose puts it, within the copy's rounding), the sparse-input kernel
 * si_k_matvec_t against the reference's si_ref_matvec_t (the same bits, on
 * whole rows and on column ranges) and against float arithmetic, and the
 * StarPU engine against the reference on synthetic models written with
 * their copies (`convert --transpose`): the same logits bit for bit token
 * by token with input sparsity (products split over the workers, the FFN
 * in slices, the down projection in blocks), the dense logits at S = 0,
 * fewer weight bytes read, and the sparse modes' refusal of FFN thresholds.
 */
#include "codelets/ffn_sparse.h"
#include "graph/engine.h"
#include "graph/runtime.h"
#include "model/colblock.h"
#include "model/forward.h"
#include "model/model.h"
#include "model/quants.h"
#include "model/synth.h"
#include "model/transpose.h"
#include "model/types.h"
#include "predict/input_sparsity.h"
#include "predict/profile.h"
#include "starinfer.h"
#include "test.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define N_TOK 24

static char dir[] = "/tmp/si-test-input-engine-XXXXXX";

static uint64_t rng = 0x9e3779b97f4a7c15u;

static float frand(void)
{
    rng = rng * 6364136223846793005u + 1442695040888963407u;
    return (float)((double)(rng >> 40) / (double)(1u << 24)) * 2.0f - 1.0f;
}

/* The largest difference between y[0 .. c1 - c0) and rows [c0, c1) of W x
 * in double (W: rows of n_in floats at w); *mag the largest of those. */
static double product_err(const float *w, int n_in, const float *x, int64_t c0, int64_t c1,
                          const float *y, double *mag)
{
    double err = 0;
    *mag = 0;
    for (int64_t o = c0; o < c1; o++) {
        double s = 0;
        for (int i = 0; i < n_in; i++)
            s += (double)w[o * n_in + i] * x[i];
        err = fmax(err, fabs(s - y[o - c0]));
        *mag = fmax(*mag, fabs(s));
    }
    return err;
}

/* The kernel and the reference on a transposed copy of type t of a random
 * (n_out, n_in) matrix, with a third of the inputs zero. */
static void kernel_case(uint32_t t)
{
    enum { N_IN = 96, N_OUT = 128 };
    float *w = malloc(N_IN * N_OUT * sizeof *w); /* row-major: N_OUT rows of N_IN */
    for (int i = 0; i < N_IN * N_OUT; i++)
        w[i] = frand();
    struct si_tensor src = {.data = w, .type = SI_TYPE_F32, .ne = {N_IN, N_OUT, 1, 1}};
    src.row_bytes = N_IN * sizeof(float);
    src.nbytes = (size_t)N_OUT * src.row_bytes;
    struct si_transpose f;
    CHECK(si_transpose_init(&f, &src, t) == SI_OK, "%s: init", si_type_name(t));
    char *wt = malloc((size_t)N_IN * f.row_bytes);
    CHECK(si_transpose_fill(&f, 0, N_IN / 2, wt) == SI_OK &&
              si_transpose_fill(&f, N_IN / 2, N_IN - N_IN / 2, wt + (N_IN / 2) * f.row_bytes) ==
                  SI_OK,
          "%s: fill", si_type_name(t));
    CHECK(f.t == NULL, "%s: the copy's floats kept after the last row", si_type_name(t));
    struct si_tensor tt = {.data = wt, .type = t, .ne = {N_OUT, N_IN, 1, 1}};
    tt.row_bytes = f.row_bytes;
    /* the copy holds w's transpose, within the type's rounding */
    float row[N_OUT];
    double worst = 0;
    for (int i = 0; i < N_IN; i++) {
        si_dequantize_row(t, wt + (size_t)i * f.row_bytes, row, N_OUT);
        for (int o = 0; o < N_OUT; o++)
            worst = fmax(worst, fabs(row[o] - w[o * N_IN + i]));
    }
    const double tol = t == SI_TYPE_F32    ? 0
                       : t == SI_TYPE_F16  ? 1e-3
                       : t == SI_TYPE_Q8_0 ? 1e-2
                                           : 0.15;
    CHECK(worst <= tol, "%s: the copy is %g off the transpose", si_type_name(t), worst);

    float x[N_IN], v[N_IN];
    int32_t idx[N_IN];
    for (int i = 0; i < N_IN; i++)
        x[i] = i % 3 == 1 ? 0.0f : frand();
    const int64_t nz = si_k_nonzero(x, N_IN, idx, v);
    CHECK(nz == N_IN - N_IN / 3, "%s: %lld non-zero inputs", si_type_name(t), (long long)nz);
    const int64_t ranges[3][2] = {{0, N_OUT}, {32, 96}, {96, 128}};
    for (int r = 0; r < 3; r++) {
        const int64_t c0 = ranges[r][0], c1 = ranges[r][1];
        float yk[N_OUT], yr[N_OUT];
        si_k_matvec_t(t, wt, f.row_bytes, c0, c1, v, idx, nz, yk);
        si_ref_matvec_t(&tt, c0, c1, x, yr);
        CHECK(memcmp(yk, yr, (size_t)(c1 - c0) * sizeof *yk) == 0,
              "%s: kernel and reference differ on columns [%lld, %lld)", si_type_name(t),
              (long long)c0, (long long)c1);
        /* and the product itself, in double from w */
        double mag;
        const double err = product_err(w, N_IN, x, c0, c1, yk, &mag);
        CHECK(err <= (t == SI_TYPE_F32    ? 1e-4
                      : t == SI_TYPE_F16  ? 1e-2
                      : t == SI_TYPE_Q8_0 ? 0.03
                                          : 0.12) *
                         mag,
              "%s: columns [%lld, %lld) %g off W x (largest %g)", si_type_name(t), (long long)c0,
              (long long)c1, err, mag);
    }
    free(wt);
    free(w);
}

/* A column-block copy (model/colblock.h) of a random (n_out, n_in) matrix
 * of type t: the AVX2 kernel (where this CPU runs it) and the portable one
 * give the same bits, on whole rows and on ranges of groups, and the
 * product of the file's own weights within the input's 8-bit rounding. */
static void colblock_case(uint32_t t)
{
    enum { N_IN = 512, N_OUT = 192 };
    size_t rb;
    si_type_row_size(t, N_IN, &rb);
    float *w = malloc(N_IN * N_OUT * sizeof *w), *row = malloc(N_IN * sizeof *row);
    char *src = malloc(N_OUT * rb);
    for (int o = 0; o < N_OUT; o++) {
        for (int i = 0; i < N_IN; i++)
            row[i] = frand() * (1.0f + (float)(o % 7));
        si_quantize_row(t, row, src + (size_t)o * rb, N_IN);
        si_dequantize_row(t, src + (size_t)o * rb, w + (size_t)o * N_IN, N_IN);
    }
    struct si_tensor st = {.data = src, .type = t, .ne = {N_IN, N_OUT, 1, 1}, .row_bytes = rb};
    CHECK(si_cb_source_ok(t, N_OUT, N_IN), "%s: no column-block copy", si_type_name(t));
    const bool min = si_cb_has_min(t);
    const size_t srow = N_OUT * (min ? 2 : 1);
    uint8_t *q = malloc(32 * N_OUT), *rows = malloc((size_t)N_IN * N_OUT / 2);
    uint16_t *sc = malloc((N_IN / 32) * srow * sizeof *sc);
    for (int b = 0; b < N_IN / 32; b++) {
        si_cb_decode_block(&st, b, q, sc + (size_t)b * srow,
                           min ? sc + (size_t)b * srow + N_OUT : NULL);
        for (int k = 0; k < 32; k++)
            si_cb_pack_row(q + (size_t)k * N_OUT, N_OUT, rows + (size_t)(b * 32 + k) * (N_OUT / 2));
    }
    struct si_tensor ct = {.data = rows,
                           .type = min ? SI_TYPE_Q4_1 : SI_TYPE_Q4_0,
                           .ne = {N_OUT, N_IN, 1, 1},
                           .row_bytes = N_OUT / 2,
                           .cb_scale = sc};
    /* the copy's values are the file's (Q4_K: scales rounded to fp16 once) */
    float x[N_IN];
    for (int i = 0; i < N_IN; i++)
        x[i] = i % 5 < 2 ? 0.0f : frand();
    for (int i = 64; i < 96; i++) /* a block with no input at all */
        x[i] = 0.0f;
    for (int i = 96; i < 128; i++) /* one with all 32 (16 pairs, two rounds of 8) */
        x[i] = frand() + (i % 2 ? 2.0f : -2.0f);
    for (int i = 128; i < 160; i++) /* one with a single input (an odd pair) */
        x[i] = i == 140 ? -1.5f : 0.0f;
    const int64_t ranges[3][2] = {{0, N_OUT}, {64, 128}, {128, 192}};
    for (int r = 0; r < 3; r++) {
        const int64_t c0 = ranges[r][0], c1 = ranges[r][1];
        float yk[N_OUT], yp[N_OUT];
        const int64_t used = si_cb_matvec(&ct, c0, c1, x, yk);
        CHECK(si_cb_matvec_portable(&ct, c0, c1, x, yp) == used && used == N_IN / 32 - 1,
              "%s: %lld input blocks used", si_type_name(t), (long long)used);
        CHECK(memcmp(yk, yp, (size_t)(c1 - c0) * sizeof *yk) == 0,
              "%s: kernels differ on columns [%lld, %lld)", si_type_name(t), (long long)c0,
              (long long)c1);
        double mag;
        const double err = product_err(w, N_IN, x, c0, c1, yk, &mag);
        CHECK(err <= 0.02 * mag, "%s: columns [%lld, %lld) %g off W x (largest %g)",
              si_type_name(t), (long long)c0, (long long)c1, err, mag);
        if (r == 0)
            printf("column-block %s: %g off W x (largest %g), kernels equal\n", si_type_name(t),
                   err, mag);
    }
    free(w);
    free(row);
    free(src);
    free(q);
    free(rows);
    free(sc);
}

/* A synthetic model of arch and type with its transposed copies, loaded. */
static struct si_model *model_with_copies(const char *arch, uint32_t type, char *path, size_t n)
{
    char plain[160], err[512];
    snprintf(plain, sizeof plain, "%s/%s-%s.gguf", dir, arch, si_type_name(type));
    snprintf(path, n, "%s/%s-%s-t.gguf", dir, arch, si_type_name(type));
    struct si_synth_params sp = si_synth_default_params();
    si_synth_preset("tiny", &sp);
    CHECK(si_synth_arch_parse(arch, &sp.arch) == SI_OK, "arch %s", arch);
    if (!strcmp(arch, "opt"))
        sp.n_head_kv = sp.n_head; /* OPT has no grouped-query attention */
    sp.type = type;
    sp.seed = 5;
    struct si_model *src = NULL, *m = NULL;
    if (si_synth_write(&sp, plain, err, sizeof err) != SI_OK ||
        si_model_load(&src, plain, err, sizeof err) != SI_OK) {
        CHECK(0, "%s: %s", plain, err);
        return NULL;
    }
    uint64_t added = 0;
    const int rc = si_transpose_write(src, path, &added, err, sizeof err);
    CHECK(rc == SI_OK && added > 0, "transpose %s: %s", plain, err);
    si_model_free(src);
    unlink(plain);
    if (rc != SI_OK || si_model_load(&m, path, err, sizeof err) != SI_OK) {
        CHECK(0, "load %s: %s", path, err);
        return NULL;
    }
    const struct si_layer *L = &m->w.layers[m->hp.n_layer - 1];
    CHECK(L->wq_t.data && L->wk_t.data && L->wv_t.data && L->wo_t.data && L->ffn_up_t.data &&
              L->ffn_down_t.data && (m->hp.ffn_kind == SI_FFN_PLAIN || L->ffn_gate_t.data != NULL),
          "%s: copies missing", path);
    return m;
}

/* Per-layer thresholds at S from a calibration on toks. */
static float *thresholds(const struct si_model *m, const int32_t *toks, double S)
{
    char err[512];
    struct si_input_calib *c = NULL;
    struct si_profile *p = NULL;
    float *thr = malloc((size_t)m->hp.n_layer * SI_INPUT_KINDS * sizeof *thr);
    struct si_ref_params rp = si_ref_default_params();
    rp.n_ctx = 64;
    CHECK(si_input_calib_init(&c, m, err, sizeof err) == SI_OK &&
              si_input_calib_collect(c, m, rp, toks, N_TOK, err, sizeof err) == SI_OK &&
              si_profile_init(&p, m->hp.n_layer, m->hp.n_ff, err, sizeof err) == SI_OK &&
              si_input_calib_apply(c, p, NULL, err, sizeof err) == SI_OK &&
              si_input_thresholds_at(p, S, thr, err, sizeof err) == SI_OK,
          "thresholds: %s", err);
    si_input_calib_free(c);
    si_profile_free(p);
    return thr;
}

/* Logits of every token of toks into out (N_TOK x n_vocab): the reference
 * with rp, or the engine with ep (ep.ref = rp). */
static void run_ref(const struct si_model *m, struct si_ref_params rp, const int32_t *toks,
                    float *out)
{
    struct si_ref *s = NULL;
    char err[512];
    if (si_ref_init(&s, m, rp, err, sizeof err) != SI_OK) {
        CHECK(0, "ref: %s", err);
        return;
    }
    for (int i = 0; i < N_TOK; i++) {
        CHECK(si_ref_eval(s, toks[i]) == SI_OK, "ref eval %d", i);
        memcpy(out + (size_t)i * m->hp.n_vocab, s->logits, (size_t)m->hp.n_vocab * sizeof *out);
    }
    si_ref_free(s);
}

static int run_engine(const struct si_model *m, struct si_engine_params ep, const int32_t *toks,
                      float *out, int64_t *bytes, char *err, size_t err_size)
{
    struct si_engine *e = NULL;
    int rc = si_engine_init(&e, m, ep, err, err_size);
    if (rc != SI_OK)
        return rc;
    for (int i = 0; i < N_TOK && rc == SI_OK; i++) {
        rc = si_engine_eval(e, toks[i]);
        memcpy(out + (size_t)i * m->hp.n_vocab, si_engine_logits(e),
               (size_t)m->hp.n_vocab * sizeof *out);
    }
    const struct si_engine_stats st = si_engine_get_stats(e);
    *bytes = st.weight_bytes_cpu;
    si_engine_free(e);
    return rc;
}

static void engine_case(const char *arch, uint32_t type)
{
    char path[200], err[512];
    struct si_model *m = model_with_copies(arch, type, path, sizeof path);
    if (m == NULL)
        return;
    const size_t nv = (size_t)m->hp.n_vocab;
    int32_t toks[N_TOK];
    for (int i = 0; i < N_TOK; i++)
        toks[i] = (int32_t)((unsigned)(i * 37 + 11) % (unsigned)m->hp.n_vocab);
    float *thr = thresholds(m, toks, 0.4);
    float *thr0 = calloc((size_t)m->hp.n_layer * SI_INPUT_KINDS, sizeof *thr0);
    float *ref = malloc(N_TOK * nv * sizeof *ref), *eng = malloc(N_TOK * nv * sizeof *eng);
    float *dense = malloc(N_TOK * nv * sizeof *dense);
    struct si_ref_params rp = si_ref_default_params();
    rp.n_ctx = 64;
    run_ref(m, rp, toks, dense);
    rp.input_thresholds = thr;
    rp.input_t = true;
    run_ref(m, rp, toks, ref);
    CHECK(memcmp(ref, dense, N_TOK * nv * sizeof *ref) != 0, "%s %s: S = 0.4 changed nothing", arch,
          si_type_name(type));

    /* every split the engine makes: attention by kv heads and Wo's rows,
     * FFN slices, down blocks */
    struct si_engine_params ep = si_engine_default_params();
    ep.ref = rp;
    ep.attn_split = 2;
    ep.n_slices = 2;
    int64_t b_sparse = 0, b_dense = 0;
    int rc = run_engine(m, ep, toks, eng, &b_sparse, err, sizeof err);
    CHECK(rc == SI_OK, "%s %s: engine: %s", arch, si_type_name(type), err);
    size_t diff = 0;
    for (size_t k = 0; k < N_TOK * nv; k++)
        diff += ref[k] != eng[k];
    CHECK(rc != SI_OK || diff == 0, "%s %s: %zu of %zu logits differ from the reference's", arch,
          si_type_name(type), diff, N_TOK * nv);
    /* one attention task per layer: si_ref_attn on the engine's reference */
    ep.attn_split = 1;
    rc = run_engine(m, ep, toks, eng, &b_sparse, err, sizeof err);
    CHECK(rc == SI_OK && memcmp(ref, eng, N_TOK * nv * sizeof *ref) == 0,
          "%s %s: one attention task: %s", arch, si_type_name(type), rc == SI_OK ? "differs" : err);

    /* S = 0: the dense logits, and more bytes read than at 0.4 */
    ep.ref.input_thresholds = thr0;
    rc = run_engine(m, ep, toks, eng, &b_dense, err, sizeof err);
    CHECK(rc == SI_OK && memcmp(dense, eng, N_TOK * nv * sizeof *eng) == 0,
          "%s %s: S = 0 is not dense: %s", arch, si_type_name(type), rc == SI_OK ? "differs" : err);
    printf("%s %s: engine = reference with input sparsity 0.4 (%d tokens); weights read %.1f KB "
           "per token against %.1f KB at S = 0\n",
           arch, si_type_name(type), N_TOK, b_sparse / 1e3 / N_TOK, b_dense / 1e3 / N_TOK);
    CHECK(b_sparse < b_dense, "%s %s: %lld bytes read at 0.4, %lld at 0", arch, si_type_name(type),
          (long long)b_sparse, (long long)b_dense);

    /* gate mode: the FFN's inputs keep the gate's sparsity */
    ep.ref.input_thresholds = thr;
    ep.mode = SI_SPARSITY_GATE;
    err[0] = '\0';
    rc = run_engine(m, ep, toks, eng, &b_sparse, err, sizeof err);
    CHECK(rc == SI_E_INVALID && strstr(err, "needs dense mode") != NULL,
          "%s %s: gate mode with FFN thresholds: rc %d '%s'", arch, si_type_name(type), rc, err);
    for (int l = 0; l < m->hp.n_layer; l++)
        thr[l * SI_INPUT_KINDS + SI_INPUT_FFN] = thr[l * SI_INPUT_KINDS + SI_INPUT_DOWN] = 0.0f;
    rc = run_engine(m, ep, toks, eng, &b_sparse, err, sizeof err);
    CHECK(rc == SI_OK, "%s %s: gate mode with attention thresholds: %s", arch, si_type_name(type),
          err);

    free(thr);
    free(thr0);
    free(ref);
    free(eng);
    free(dense);
    si_model_free(m);
    unlink(path);
}

int main(void)
{
    const uint32_t types[] = {SI_TYPE_F32, SI_TYPE_F16, SI_TYPE_Q8_0, SI_TYPE_Q4_0, SI_TYPE_Q4_1};
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++)
        kernel_case(types[i]);
    colblock_case(SI_TYPE_Q4_0);
    colblock_case(SI_TYPE_Q4_1);
    colblock_case(SI_TYPE_Q4_K);
    CHECK(si_transpose_type(SI_TYPE_Q4_K, 4096) == SI_TYPE_Q4_0 &&
              si_transpose_type(SI_TYPE_Q6_K, 4096) == SI_TYPE_Q8_0 &&
              si_transpose_type(SI_TYPE_Q4_0, 4096) == SI_TYPE_Q4_0 &&
              si_transpose_type(SI_TYPE_Q4_0, 100) == SI_TYPE_F16,
          "si_transpose_type");

    if (mkdtemp(dir) == NULL) {
        perror("mkdtemp");
        return 1;
    }
    struct si_runtime rt;
    char err[256];
    if (si_runtime_start(&rt, false, err, sizeof err) != SI_OK) {
        fprintf(stderr, "%s\n", err);
        return 1;
    }
    engine_case("llama-silu", SI_TYPE_F32);
    engine_case("llama-silu", SI_TYPE_Q4_0);
    engine_case("llama-relu", SI_TYPE_Q4_1);
    engine_case("opt", SI_TYPE_F16);
    si_runtime_stop(&rt);
    rmdir(dir);
    return test_result();
}
