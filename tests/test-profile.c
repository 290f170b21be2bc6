/*
 * test-profile.c - activation profiles (src/predict/profile.h): collection on
 * a synthetic llama-relu model against an independent per-neuron count, the
 * planted power-law activity showing in the counts, the GGUF round trip, and
 * the inputs the reader and collector must refuse; CATS thresholds on a
 * synthetic llama-silu model (the target sparsity met, the counts against an
 * independent count and the reference's gate_threshold, stored and read
 * back, bad values refused) and on the ReLU one (all 0); the CDF picture.
 */
#include "model/act.h"
#include "model/forward.h"
#include "model/gguf.h"
#include "model/gguf_write.h"
#include "model/model.h"
#include "model/synth.h"
#include "model/tokenizer.h"
#include "model/types.h"
#include "predict/profile.h"
#include "starinfer.h"
#include "test.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define N_TOK 400
#define WINDOW 128

static char dir[] = "/tmp/si-test-profile-XXXXXX";

/* The reference's runner with parameters rp (until the next call). */
static const struct si_ffn_runner *ref_runner(struct si_ref_params rp)
{
    static struct si_ffn_runner r;
    r = si_ffn_runner_ref(rp);
    return &r;
}

static void path_in(char *buf, size_t size, const char *name)
{
    snprintf(buf, size, "%s/%s", dir, name);
}

static bool same_profile(const struct si_profile *a, const struct si_profile *b)
{
    return a->n_layer == b->n_layer && a->n_ff == b->n_ff && a->n_tokens == b->n_tokens &&
           !memcmp(a->counts, b->counts, (size_t)a->n_layer * (size_t)a->n_ff * sizeof(int64_t));
}

/* A hand-made profile file: n_tokens and one I32/F32 tensor per layer from `vals`. */
static void write_raw(const char *path, bool with_n_ff, uint64_t n_tokens, int32_t n_layer,
                      int32_t n_ff, uint32_t type, const void *vals)
{
    struct si_gguf_writer *w = si_gguf_writer_init(false);
    si_gguf_writer_set_u64(w, "starinfer.profile.n_tokens", n_tokens);
    si_gguf_writer_set_u32(w, "starinfer.profile.n_layer", (uint32_t)n_layer);
    if (with_n_ff)
        si_gguf_writer_set_u32(w, "starinfer.profile.n_ff", (uint32_t)n_ff);
    const int64_t ne[1] = {n_ff};
    for (int32_t l = 0; l < n_layer; l++) {
        char name[64];
        snprintf(name, sizeof name, "blk.%d.ffn_act_count", (int)l);
        si_gguf_writer_add_tensor(w, name, type, 1, ne, (const char *)vals + 4 * (size_t)l * n_ff);
    }
    char err[256];
    int rc = si_gguf_writer_write(w, path, err, sizeof err);
    CHECK(rc == SI_OK, "write %s: %s", path, err);
    si_gguf_writer_free(w);
}

/* Read `path` expecting status `want` and `needle` in the message. */
static void expect_read(const char *path, const struct si_model *m, int want, const char *needle)
{
    char err[512] = "";
    struct si_profile *p = NULL;
    int rc = si_profile_read(&p, path, m, err, sizeof err);
    CHECK(rc == want, "read %s: status %d (%s), expected %d", path, rc, err, want);
    CHECK(p == NULL, "read %s: a profile despite the error", path);
    CHECK(strstr(err, needle) != NULL, "read %s: message '%s' lacks '%s'", path, err, needle);
    CHECK(strchr(err, '\n') == NULL, "read %s: message on more than one line", path);
    printf("refused as expected: %s\n", err);
    si_profile_free(p);
}

/* Pearson correlation of x and y. */
static double correlation(const double *x, const double *y, int64_t n)
{
    double mx = 0, my = 0;
    for (int64_t i = 0; i < n; i++) {
        mx += x[i];
        my += y[i];
    }
    mx /= (double)n;
    my /= (double)n;
    double sxy = 0, sxx = 0, syy = 0;
    for (int64_t i = 0; i < n; i++) {
        sxy += (x[i] - mx) * (y[i] - my);
        sxx += (x[i] - mx) * (x[i] - mx);
        syy += (y[i] - my) * (y[i] - my);
    }
    return sxx > 0 && syy > 0 ? sxy / sqrt(sxx * syy) : 0.0;
}

/*
 * The independent count: the reference's steps one by one, looking at every
 * neuron's activation after each layer's FFN, in the documented windows
 * (cache reset every WINDOW tokens, BOS in place of each window's first).
 * Also checks the per-layer n_active of count_active against the same sums.
 */
static void independent_count(const struct si_model *m, struct si_ref_params rp,
                              const int32_t *toks, int64_t n, int64_t *counts)
{
    char err[256];
    struct si_tokenizer *tok = NULL;
    CHECK(si_tokenizer_load(&tok, m->gguf, err, sizeof err) == SI_OK, "tokenizer: %s", err);
    CHECK(tok != NULL && si_tokenizer_add_bos(tok) && si_tokenizer_bos(tok) >= 0,
          "the synthetic model adds BOS");
    const int32_t bos = tok != NULL ? si_tokenizer_bos(tok) : -1;
    si_tokenizer_free(tok);
    struct si_ref *s = NULL;
    CHECK(si_ref_init(&s, m, rp, err, sizeof err) == SI_OK, "ref: %s", err);
    if (s == NULL)
        return;
    s->count_active = true;
    const int32_t nl = m->hp.n_layer, ff = m->hp.n_ff;
    int64_t bad_active = 0;
    for (int64_t i = 0; i < n; i++) {
        if (i % WINDOW == 0)
            si_ref_reset(s);
        int32_t t = i % WINDOW == 0 && bos >= 0 ? bos : toks[i];
        CHECK(si_ref_begin(s, t) == SI_OK, "begin at %lld", (long long)i);
        for (int32_t l = 0; l < nl; l++) {
            si_ref_attn(s, l);
            si_ref_ffn(s, l);
            int64_t here = 0;
            for (int32_t k = 0; k < ff; k++) {
                counts[(size_t)l * ff + k] += s->hu[k] != 0.0f;
                here += s->hu[k] != 0.0f;
            }
            bad_active += here != s->n_active[l];
            si_ref_ffn_finish(s, l);
        }
        si_ref_end(s);
    }
    CHECK(bad_active == 0, "%lld (token, layer) pairs where n_active differs from the neurons",
          (long long)bad_active);
    si_ref_free(s);
}

static void test_top_fraction(void)
{
    struct si_profile *p = NULL;
    char err[256];
    CHECK(si_profile_init(&p, 1, 4, err, sizeof err) == SI_OK, "init: %s", err);
    if (p == NULL)
        return;
    CHECK(si_profile_top_fraction(p, 0.8) == 0.0, "no activations: 0");
    p->n_tokens = 100;
    p->counts[2] = 100;
    CHECK(si_profile_top_fraction(p, 0.8) == 0.25, "one neuron carries everything");
    for (int i = 0; i < 4; i++)
        p->counts[i] = 10;
    CHECK(si_profile_top_fraction(p, 0.75) == 0.75, "uniform: 3 of 4 for 75%% (%g)",
          si_profile_top_fraction(p, 0.75));
    CHECK(si_profile_top_fraction(p, 0.8) == 1.0, "uniform: 4 of 4 for 80%% (%g)",
          si_profile_top_fraction(p, 0.8));
    CHECK(si_profile_top_fraction(p, 1.0) == 1.0, "all of them for 100%%");
    si_profile_free(p);
    CHECK(si_profile_init(&p, 0, 4, err, sizeof err) == SI_E_INVALID && p == NULL,
          "zero layers refused");
    CHECK(si_profile_init(&p, 2, -1, err, sizeof err) == SI_E_INVALID && p == NULL,
          "negative width refused");
}

/* A profile file with thresholds from `thr` (n_thr of them) and target sparsity `target`
 * (neither key when thr is NULL; no target key when target < -1). */
static void write_thr(const char *path, const float *thr, uint64_t n_thr, double target)
{
    int32_t vals[2 * 8] = {0};
    write_raw(path, true, 10, 2, 8, SI_TYPE_I32, vals);
    struct si_gguf *g = NULL;
    char err[256];
    CHECK(si_gguf_open(&g, path, err, sizeof err) == SI_OK, "open %s: %s", path, err);
    struct si_gguf_writer *w = si_gguf_writer_init(false);
    si_gguf_writer_copy_kv(w, g);
    si_gguf_free(g);
    if (thr != NULL)
        si_gguf_writer_set_arr(w, "starinfer.profile.gate_threshold", SI_GGUF_FLOAT32, thr, n_thr);
    if (target >= -1)
        si_gguf_writer_set_f32(w, "starinfer.profile.target_sparsity", (float)target);
    const int64_t ne[1] = {8};
    si_gguf_writer_add_tensor(w, "blk.0.ffn_act_count", SI_TYPE_I32, 1, ne, vals);
    si_gguf_writer_add_tensor(w, "blk.1.ffn_act_count", SI_TYPE_I32, 1, ne, vals + 8);
    CHECK(si_gguf_writer_write(w, path, err, sizeof err) == SI_OK, "write %s: %s", path, err);
    si_gguf_writer_free(w);
}

/* Count the <polyline elements of an SVG file. */
static int count_polylines(const char *path)
{
    FILE *f = fopen(path, "r");
    if (f == NULL)
        return -1;
    int n = 0;
    char line[1 << 16];
    while (fgets(line, sizeof line, f) != NULL)
        for (const char *q = line; (q = strstr(q, "<polyline")) != NULL; q++)
            n++;
    fclose(f);
    return n;
}

#define TARGET 0.7

/* CATS thresholds for TARGET on the SiLU model m, from one pass (c into
 * p) and from two calls on the same windows (c2 into p2): the same; then
 * p's counts of toks meet the target in each layer (see test_thresholds). */
static void check_set_thresholds(const struct si_model *m, const int32_t *toks,
                                 struct si_ref_params rp, const struct si_profile_calib *c,
                                 const struct si_profile_calib *c2, struct si_profile *p,
                                 struct si_profile *p2)
{
    char err[512];
    const int32_t nl = m->hp.n_layer, ff = m->hp.n_ff;
    double below[3] = {0};
    CHECK(si_profile_set_thresholds(p, c, TARGET, below, err, sizeof err) == SI_OK,
          "set thresholds: %s", err);
    CHECK(si_profile_set_thresholds(p2, c2, TARGET, NULL, err, sizeof err) == SI_OK,
          "set thresholds: %s", err);
    CHECK(p->thresholds != NULL && p2->thresholds != NULL &&
              !memcmp(p->thresholds, p2->thresholds, (size_t)nl * sizeof(float)),
          "thresholds from one call and from two differ");
    CHECK(p->target_sparsity == (float)TARGET, "target %g", (double)p->target_sparsity);
    int rc = si_profile_collect(p, m, ref_runner(rp), toks, N_TOK, err, sizeof err);
    CHECK(rc == SI_OK, "collect with thresholds: %s", err);
    for (int32_t l = 0; l < nl; l++) {
        int64_t sum = 0;
        for (int32_t i = 0; i < ff; i++)
            sum += p->counts[(size_t)l * ff + i];
        const double rate = (double)sum / ((double)ff * N_TOK);
        printf("llama-silu layer %d: threshold %.5g for sparsity %.2f: share at or below %.4f, "
               "measured activation rate %.4f\n",
               (int)l, (double)p->thresholds[l], TARGET, below[l], rate);
        CHECK(p->thresholds[l] > 0 && isfinite(p->thresholds[l]), "threshold %g",
              (double)p->thresholds[l]);
        CHECK(fabs(rate - (1 - TARGET)) < 0.01, "layer %d: rate %.4f, target %.2f", (int)l, rate,
              1 - TARGET);
        CHECK(fabs(rate - (1 - below[l])) < 1e-12, "layer %d: rate %.6f but %.6f above the "
              "threshold in the first pass", (int)l, rate, 1 - below[l]);
    }
}

/* p's counts with thresholds against an independent count on the SiLU
 * model m (|act(gate . x)| of each neuron after each FFN), and layer 0's
 * against the reference's own gate_threshold. */
static void check_threshold_counts(const struct si_model *m, const int32_t *toks,
                                   struct si_ref_params rp, const struct si_profile *p)
{
    char err[512];
    const int32_t nl = m->hp.n_layer, ff = m->hp.n_ff;
    const size_t total = (size_t)nl * (size_t)ff;
    /* The independent count: |act(gate . x)| of each neuron after each FFN. */
    int64_t *ind = calloc(total, sizeof *ind);
    int64_t layer0 = 0, layer0_ref = 0;
    struct si_ref *s = NULL, *sg = NULL;
    struct si_ref_params rg = rp;
    rg.gate_threshold = p->thresholds[0]; /* the reference's own CATS rule, on layer 0 */
    CHECK(si_ref_init(&s, m, rp, err, sizeof err) == SI_OK, "ref: %s", err);
    CHECK(si_ref_init(&sg, m, rg, err, sizeof err) == SI_OK, "ref: %s", err);
    struct si_tokenizer *tok = NULL;
    CHECK(si_tokenizer_load(&tok, m->gguf, err, sizeof err) == SI_OK, "tokenizer: %s", err);
    const int32_t bos = tok != NULL ? si_tokenizer_bos(tok) : -1;
    si_tokenizer_free(tok);
    if (s != NULL && sg != NULL) {
        sg->count_active = true;
        for (int64_t i = 0; i < N_TOK; i++) {
            if (i % WINDOW == 0) {
                si_ref_reset(s);
                si_ref_reset(sg);
            }
            const int32_t t = i % WINDOW == 0 ? bos : toks[i];
            CHECK(si_ref_begin(s, t) == SI_OK, "begin");
            for (int32_t l = 0; l < nl; l++) {
                si_ref_attn(s, l);
                si_ref_ffn(s, l);
                for (int32_t k = 0; k < ff; k++) {
                    const bool on = fabsf(si_act_apply(SI_ACT_SILU, s->hg[k])) > p->thresholds[l];
                    ind[(size_t)l * ff + k] += on;
                    layer0 += l == 0 && on;
                }
                si_ref_ffn_finish(s, l);
            }
            si_ref_end(s);
            CHECK(si_ref_eval(sg, t) == SI_OK, "eval");
            layer0_ref += sg->n_active[0];
        }
    }
    si_ref_free(s);
    si_ref_free(sg);
    int64_t diff = 0;
    for (size_t k = 0; k < total; k++)
        diff += ind[k] != p->counts[k];
    CHECK(diff == 0, "%lld neurons counted differently from the independent count",
          (long long)diff);
    CHECK(layer0 == layer0_ref, "layer 0: %lld active by the threshold, %lld by the reference's "
          "gate_threshold", (long long)layer0, (long long)layer0_ref);
    free(ind);
}

/* p2's thresholds on held-out tokens of the SiLU model m: an estimate,
 * the target within 0.05. */
static void check_held_out(const struct si_model *m, struct si_ref_params rp, struct si_profile *p2)
{
    char err[512];
    const int32_t nl = m->hp.n_layer, ff = m->hp.n_ff;
    /* Held-out tokens: the thresholds are an estimate there. */
    int32_t other[N_TOK];
    uint64_t x = 12345;
    for (int i = 0; i < N_TOK; i++) {
        x = x * 6364136223846793005u + 1442695040888963407u;
        other[i] = (int32_t)((x >> 33) % (uint64_t)m->hp.n_vocab);
    }
    CHECK(si_profile_collect(p2, m, ref_runner(rp), other, N_TOK, err, sizeof err) == SI_OK, "collect: %s",
          err);
    for (int32_t l = 0; l < nl; l++) {
        int64_t sum = 0;
        for (int32_t i = 0; i < ff; i++)
            sum += p2->counts[(size_t)l * ff + i];
        const double rate = (double)sum / ((double)ff * N_TOK);
        printf("llama-silu layer %d: held-out activation rate %.4f\n", (int)l, rate);
        CHECK(fabs(rate - (1 - TARGET)) < 0.05, "layer %d: held-out rate %.4f", (int)l, rate);
    }
}

/* set_thresholds refuses a profile that has counted (p), a target of 1
 * and NaN; a target of 0 gives thresholds 0 (calibration c, shape nl x ff). */
static void check_set_refusals(struct si_profile_calib *c, struct si_profile *p,
                               struct si_profile *p2, int32_t nl, int32_t ff)
{
    char err[512];
    /* Refusals of set_thresholds; S = 0 gives 0. */
    CHECK(si_profile_set_thresholds(p, c, 0.5, NULL, err, sizeof err) == SI_E_INVALID &&
              strstr(err, "already counted") != NULL,
          "thresholds after counting: %s", err);
    CHECK(si_profile_set_thresholds(p2, c, 1.0, NULL, err, sizeof err) == SI_E_INVALID &&
              strstr(err, "not in [0, 1)") != NULL,
          "target 1: %s", err);
    struct si_profile *z = NULL;
    CHECK(si_profile_init(&z, nl, ff, err, sizeof err) == SI_OK, "init: %s", err);
    if (z != NULL) {
        CHECK(si_profile_set_thresholds(z, c, 0.0, NULL, err, sizeof err) == SI_OK &&
                  z->thresholds[0] == 0 && z->thresholds[2] == 0,
              "target 0: thresholds 0: %s", err);
        CHECK(si_profile_set_thresholds(z, c, NAN, NULL, err, sizeof err) == SI_E_INVALID,
              "target NaN");
    }
    si_profile_free(z);
}

/* p with thresholds written (silu.prof) and read back with its keys, and
 * its CDF picture (cdf.svg); the picture into a missing folder refused. */
static void check_threshold_files(const struct si_model *m, const struct si_profile *p)
{
    char path[128], err[512];
    const int32_t nl = m->hp.n_layer;
    /* Round trip, with the keys. */
    path_in(path, sizeof path, "silu.prof");
    CHECK(si_profile_write(p, path, err, sizeof err) == SI_OK, "write: %s", err);
    struct si_profile *r = NULL;
    CHECK(si_profile_read(&r, path, m, err, sizeof err) == SI_OK && r != NULL, "read: %s", err);
    if (r != NULL) {
        CHECK(same_profile(p, r) && r->thresholds != NULL &&
                  !memcmp(r->thresholds, p->thresholds, (size_t)nl * sizeof(float)) &&
                  r->target_sparsity == p->target_sparsity,
              "thresholds read back");
    }
    si_profile_free(r);
    r = NULL;
    struct si_gguf *g = NULL;
    CHECK(si_gguf_open(&g, path, err, sizeof err) == SI_OK, "open: %s", err);
    if (g != NULL) {
        enum si_gguf_type t;
        uint64_t n = 0;
        CHECK(si_gguf_get_arr(g, "starinfer.profile.gate_threshold", &t, &n) == SI_OK &&
                  t == SI_GGUF_FLOAT32 && n == (uint64_t)nl,
              "gate_threshold is FLOAT32[n_layer]");
        si_gguf_free(g);
    }

    /* The picture: one polyline per layer and one for the whole model. */
    path_in(path, sizeof path, "cdf.svg");
    CHECK(si_profile_write_svg(p, path, "tiny llama-silu\nsecond line & <escaped>", err,
                               sizeof err) == SI_OK,
          "svg: %s", err);
    CHECK(count_polylines(path) == nl + 1, "%d polylines, expected %d", count_polylines(path),
          (int)nl + 1);
    path_in(path, sizeof path, "no/such/dir.svg");
    CHECK(si_profile_write_svg(p, path, "x", err, sizeof err) == SI_E_NOT_FOUND,
          "svg into a missing directory: %s", err);
}

/* Bad thresholds (p's made so, into bad.prof): refused by the writer and
 * the reader; good ones read. */
static void check_bad_thresholds(struct si_profile *p)
{
    char path[128], err[512];
    /* Bad thresholds: refused by the writer and the reader. */
    p->thresholds[1] = -0.5f;
    path_in(path, sizeof path, "bad.prof");
    CHECK(si_profile_write(p, path, err, sizeof err) == SI_E_INVALID &&
              strstr(err, "threshold -0.5 of layer 1") != NULL,
          "write of a negative threshold: %s", err);
    p->thresholds[1] = NAN;
    CHECK(si_profile_write(p, path, err, sizeof err) == SI_E_INVALID, "write of a NaN threshold");
    float thr[2] = {0.25f, -1.0f};
    write_thr(path, thr, 2, 0.5);
    expect_read(path, NULL, SI_E_FORMAT, "threshold -1 of layer 1 is not finite and >= 0");
    thr[1] = NAN;
    write_thr(path, thr, 2, 0.5);
    expect_read(path, NULL, SI_E_FORMAT, "of layer 1 is not finite and >= 0");
    thr[1] = INFINITY;
    write_thr(path, thr, 2, 0.5);
    expect_read(path, NULL, SI_E_FORMAT, "threshold inf of layer 1");
    thr[1] = 0.5f;
    write_thr(path, thr, 1, 0.5);
    expect_read(path, NULL, SI_E_FORMAT, "must be an array of 2 FLOAT32");
    write_thr(path, thr, 2, 1.5);
    expect_read(path, NULL, SI_E_FORMAT, "target_sparsity must be a number in [0, 1)");
    write_thr(path, thr, 2, -5);
    expect_read(path, NULL, SI_E_FORMAT, "gate_threshold without starinfer.profile.target_sparsity");
    write_thr(path, NULL, 0, 0.5);
    expect_read(path, NULL, SI_E_FORMAT, "target_sparsity without starinfer.profile.gate_threshold");
    write_thr(path, thr, 2, 0.5);
    struct si_profile *r = NULL;
    CHECK(si_profile_read(&r, path, NULL, err, sizeof err) == SI_OK && r != NULL &&
              r->thresholds[0] == 0.25f && r->thresholds[1] == 0.5f && r->target_sparsity == 0.5f,
          "good thresholds read: %s", err);
    si_profile_free(r);
}

/* The ReLU model relu_m: thresholds 0 (no first pass needed), the same
 * counts as without (relu_counts); a threshold refused. */
static void check_relu_thresholds(const struct si_model *relu_m, const int32_t *toks,
                                  struct si_ref_params rp, const int64_t *relu_counts)
{
    char err[512];
    /* The ReLU model: thresholds 0 (no first pass needed), the same counts. */
    struct si_profile_calib *cr = NULL;
    struct si_profile *pr = NULL;
    CHECK(si_profile_calib_init(&cr, relu_m, err, sizeof err) == SI_OK, "calib: %s", err);
    CHECK(si_profile_init(&pr, relu_m->hp.n_layer, relu_m->hp.n_ff, err, sizeof err) == SI_OK,
          "init: %s", err);
    if (cr != NULL && pr != NULL) {
        CHECK(si_profile_calib_collect(cr, relu_m, ref_runner(rp), toks, N_TOK, err, sizeof err) == SI_OK,
              "calib: %s", err);
        CHECK(si_profile_set_thresholds(pr, cr, TARGET, NULL, err, sizeof err) == SI_OK,
              "set: %s", err);
        int nonzero = 0;
        for (int32_t l = 0; l < relu_m->hp.n_layer; l++)
            nonzero += pr->thresholds[l] != 0.0f;
        CHECK(nonzero == 0, "ReLU model: %d thresholds not 0", nonzero);
        CHECK(si_profile_collect(pr, relu_m, ref_runner(rp), toks, N_TOK, err, sizeof err) == SI_OK,
              "collect: %s", err);
        CHECK(!memcmp(pr->counts, relu_counts,
                      (size_t)relu_m->hp.n_layer * relu_m->hp.n_ff * sizeof(int64_t)),
              "ReLU model: counts with thresholds 0 differ from activation != 0");
        pr->thresholds[0] = 0.1f;
        CHECK(si_profile_collect(pr, relu_m, ref_runner(rp), toks, 1, err, sizeof err) == SI_E_INVALID &&
                  strstr(err, "ReLU model") != NULL,
              "a ReLU model with a threshold: %s", err);
    }
    si_profile_free(pr);
    si_profile_calib_free(cr);
}

/*
 * CATS thresholds.  On the same tokens the counting pass sees exactly the
 * values the thresholds were taken from, so each layer's measured rate is
 * 1 - (the share at or below its threshold), and that share is the target
 * up to half the mass of one histogram bin (2^-8 wide relatively): below
 * 1% unless |a| has more than 2% of its mass within 0.4% of the quantile,
 * which a continuous distribution over 200k values does not.  Hence a
 * tolerance of 0.01.  On other tokens (held out) the quantile is estimated,
 * so 0.05 there.
 */
static void test_thresholds(const struct si_model *relu_m, const int32_t *toks,
                            const int64_t *relu_counts)
{
    char model_path[128], path[128], err[512];
    path_in(model_path, sizeof model_path, "silu.gguf");
    struct si_synth_params sp = si_synth_default_params();
    si_synth_preset("tiny", &sp);
    sp.arch = SI_SYNTH_LLAMA_SILU;
    sp.type = SI_TYPE_F32;
    sp.n_layer = 3;
    sp.n_ff = 512;
    sp.seed = 11;
    int rc = si_synth_write(&sp, model_path, err, sizeof err);
    CHECK(rc == SI_OK, "synth llama-silu: %s", err);
    struct si_model *m = NULL;
    if (rc == SI_OK)
        CHECK(si_model_load(&m, model_path, err, sizeof err) == SI_OK, "load: %s", err);
    if (m == NULL)
        return;
    CHECK(!si_profile_relu_family(m) && si_profile_relu_family(relu_m), "ReLU family");
    const int32_t nl = m->hp.n_layer, ff = m->hp.n_ff;
    struct si_ref_params rp = si_ref_default_params();
    rp.n_ctx = WINDOW;

    /* Thresholds from one pass, and from two calls on the same windows. */
    struct si_profile_calib *c = NULL, *c2 = NULL;
    CHECK(si_profile_calib_init(&c, m, err, sizeof err) == SI_OK, "calib init: %s", err);
    CHECK(si_profile_calib_init(&c2, m, err, sizeof err) == SI_OK, "calib init: %s", err);
    if (c == NULL || c2 == NULL) {
        si_profile_calib_free(c);
        si_profile_calib_free(c2);
        si_model_free(m);
        return;
    }
    CHECK(si_profile_calib_collect(c, m, ref_runner(rp), toks, N_TOK, err, sizeof err) == SI_OK,
          "calib collect: %s", err);
    CHECK(si_profile_calib_collect(c2, m, ref_runner(rp), toks, WINDOW, err, sizeof err) == SI_OK &&
              si_profile_calib_collect(c2, m, ref_runner(rp), toks + WINDOW, N_TOK - WINDOW, err,
                                       sizeof err) == SI_OK,
          "calib collect in two: %s", err);
    CHECK(si_profile_calib_tokens(c) == N_TOK && si_profile_calib_tokens(c2) == N_TOK,
          "calib tokens %lld %lld", (long long)si_profile_calib_tokens(c),
          (long long)si_profile_calib_tokens(c2));
    struct si_profile *p = NULL, *p2 = NULL;
    CHECK(si_profile_init(&p, nl, ff, err, sizeof err) == SI_OK, "init: %s", err);
    CHECK(si_profile_init(&p2, nl, ff, err, sizeof err) == SI_OK, "init: %s", err);
    check_set_thresholds(m, toks, rp, c, c2, p, p2);
    check_threshold_counts(m, toks, rp, p);
    check_held_out(m, rp, p2);
    check_set_refusals(c, p, p2, nl, ff);
    check_threshold_files(m, p);
    check_bad_thresholds(p);
    check_relu_thresholds(relu_m, toks, rp, relu_counts);

    si_profile_free(p);
    si_profile_free(p2);
    si_profile_calib_free(c);
    si_profile_calib_free(c2);
    si_model_free(m);
    const char *names[] = {"silu.gguf", "silu.prof", "cdf.svg", "bad.prof"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        path_in(path, sizeof path, names[i]);
        unlink(path);
    }
}

/* p's counts of m against the independent count ref, neuron by neuron,
 * and the mean activation rate against the planted sparsity. */
static void check_counts(const struct si_model *m, const struct si_profile *p, const int64_t *ref,
                         double sparsity)
{
    const size_t total = (size_t)m->hp.n_layer * (size_t)m->hp.n_ff;
    int64_t diff = 0, sum = 0, max = 0;
    for (size_t k = 0; k < total; k++) {
        diff += p->counts[k] != ref[k];
        sum += p->counts[k];
        max = p->counts[k] > max ? p->counts[k] : max;
    }
    CHECK(diff == 0, "%lld neurons counted differently from the independent count",
          (long long)diff);
    CHECK(max <= N_TOK, "a count above n_tokens: %lld", (long long)max);
    const double rate = (double)sum / ((double)total * N_TOK);
    printf("collected %d tokens: mean activation rate %.4f (planted %.2f), max count %lld\n", N_TOK,
           rate, 1 - sparsity, (long long)max);
    CHECK(rate > 0.05 && rate < 0.15, "mean activation rate %.4f, planted 0.1", rate);
}

/* The planted activity shows in p's counts of m: per layer, counts
 * correlate with the planted probabilities, the planted top 20% fire far
 * more often than the rest, and about 20% of the neurons carry 80% of the
 * activations. */
static void check_planted(const struct si_model *m, const struct si_profile *p)
{
    const int32_t nl = m->hp.n_layer, ff = m->hp.n_ff;
    /* The planted activity shows: per layer, counts correlate with the
     * planted probabilities, and the planted top 20% fire far more often
     * than the rest. */
    double *rates = malloc((size_t)ff * sizeof *rates), *planted = malloc((size_t)ff * sizeof *planted);
    for (int32_t l = 0; l < nl; l++) {
        char name[64];
        snprintf(name, sizeof name, "blk.%d.ffn_planted_prob", (int)l);
        int64_t ti = si_gguf_find_tensor(m->gguf, name);
        CHECK(ti >= 0 && m->gguf->tensors[ti].type == SI_TYPE_F32 &&
                  m->gguf->tensors[ti].ne[0] == ff,
              "%s in the synthetic model", name);
        if (ti < 0)
            continue;
        const float *pp = m->gguf->tensors[ti].data;
        for (int32_t i = 0; i < ff; i++) {
            rates[i] = (double)p->counts[(size_t)l * ff + i] / N_TOK;
            planted[i] = pp[i];
        }
        const double r = correlation(rates, planted, ff);
        /* Mean rate of the neurons planted above / below the 80th percentile. */
        double *sorted = malloc((size_t)ff * sizeof *sorted);
        memcpy(sorted, planted, (size_t)ff * sizeof *sorted);
        for (int32_t i = 1; i < ff; i++) /* insertion sort, ascending */
            for (int32_t j = i; j > 0 && sorted[j - 1] > sorted[j]; j--) {
                double t = sorted[j];
                sorted[j] = sorted[j - 1];
                sorted[j - 1] = t;
            }
        const double cut = sorted[(size_t)(0.8 * ff)];
        double hot = 0, cold = 0;
        int64_t n_hot = 0, n_cold = 0;
        for (int32_t i = 0; i < ff; i++) {
            if (planted[i] >= cut) {
                hot += rates[i];
                n_hot++;
            } else {
                cold += rates[i];
                n_cold++;
            }
        }
        hot /= (double)n_hot;
        cold /= (double)n_cold;
        printf("layer %d: correlation with the planted probabilities %.3f; mean rate of the "
               "planted top 20%% %.4f, of the rest %.4f\n",
               (int)l, r, hot, cold);
        CHECK(r > 0.7, "layer %d: correlation %.3f with the planted probabilities", (int)l, r);
        CHECK(hot > 4 * cold, "layer %d: planted hot neurons %.4f vs the rest %.4f", (int)l, hot,
              cold);
        free(sorted);
    }
    free(rates);
    free(planted);
    const double top = si_profile_top_fraction(p, 0.8);
    printf("%.1f%% of the neurons carry 80%% of the activations (planted: 20%%)\n", 100 * top);
    CHECK(top > 0.1 && top < 0.3, "top fraction %.3f, planted 0.2", top);
}

/* Collecting toks again into p adds (twice ref), nothing adds nothing;
 * collect's refusals leave the profile unchanged.  Returns the narrower
 * profile the refusals used (n_ff / 2; NULL if it failed), for the reader's. */
static struct si_profile *check_collect_again(const struct si_model *m, const int32_t *toks,
                                              struct si_ref_params rp, struct si_profile *p,
                                              const int64_t *ref)
{
    char err[512];
    const int32_t nl = m->hp.n_layer, ff = m->hp.n_ff;
    const size_t total = (size_t)nl * (size_t)ff;
    /* Collecting again adds. */
    int rc = si_profile_collect(p, m, ref_runner(rp), toks, N_TOK, err, sizeof err);
    CHECK(rc == SI_OK, "second collect: %s", err);
    CHECK(p->n_tokens == 2 * N_TOK, "n_tokens after two collects: %lld", (long long)p->n_tokens);
    int64_t diff = 0;
    for (size_t k = 0; k < total; k++)
        diff += p->counts[k] != 2 * ref[k];
    CHECK(diff == 0, "%lld neurons not doubled by a second collect", (long long)diff);
    /* Nothing to do, nothing added. */
    CHECK(si_profile_collect(p, m, ref_runner(rp), NULL, 0, err, sizeof err) == SI_OK, "empty collect: %s",
          err);
    CHECK(p->n_tokens == 2 * N_TOK, "an empty collect counts nothing");

    /* Collect's refusals, leaving p unchanged. */
    int32_t bad_toks[3] = {1, m->hp.n_vocab, 2};
    err[0] = '\0';
    rc = si_profile_collect(p, m, ref_runner(rp), bad_toks, 3, err, sizeof err);
    CHECK(rc == SI_E_INVALID && strstr(err, "position 1") != NULL, "token outside vocabulary: %d %s",
          rc, err);
    struct si_profile *q = NULL;
    CHECK(si_profile_init(&q, nl, ff / 2, err, sizeof err) == SI_OK, "init: %s", err);
    if (q != NULL) {
        err[0] = '\0';
        rc = si_profile_collect(q, m, ref_runner(rp), toks, 10, err, sizeof err);
        CHECK(rc == SI_E_INVALID && strstr(err, "256") != NULL && strstr(err, "512") != NULL,
              "shape mismatch in collect: %d %s", rc, err);
        CHECK(q->n_tokens == 0, "a failed collect counts nothing");
    }
    CHECK(p->n_tokens == 2 * N_TOK, "a failed collect leaves the profile unchanged");
    return q;
}

/* p written to prof_path and read back, with and without the model m;
 * the file's keys and tensors. */
static void check_round_trip(const struct si_model *m, const struct si_profile *p,
                             const char *prof_path)
{
    char err[512];
    const int32_t nl = m->hp.n_layer, ff = m->hp.n_ff;
    /* Round trip, with and without the model. */
    int rc = si_profile_write(p, prof_path, err, sizeof err);
    CHECK(rc == SI_OK, "write: %s", err);
    struct si_profile *r = NULL;
    rc = si_profile_read(&r, prof_path, m, err, sizeof err);
    CHECK(rc == SI_OK && r != NULL && same_profile(p, r), "read back with the model: %s", err);
    si_profile_free(r);
    r = NULL;
    rc = si_profile_read(&r, prof_path, NULL, err, sizeof err);
    CHECK(rc == SI_OK && r != NULL && same_profile(p, r), "read back without a model: %s", err);
    si_profile_free(r);
    r = NULL;
    struct si_gguf *g = NULL;
    CHECK(si_gguf_open(&g, prof_path, err, sizeof err) == SI_OK, "open: %s", err);
    if (g != NULL) {
        uint64_t v = 0;
        CHECK(si_gguf_find_key(g, "general.architecture") < 0, "architecture-independent");
        int64_t i = si_gguf_find_key(g, "starinfer.profile.n_tokens");
        CHECK(i >= 0 && g->kv[i].type == SI_GGUF_UINT64, "n_tokens is UINT64");
        i = si_gguf_find_key(g, "starinfer.profile.n_ff");
        CHECK(i >= 0 && g->kv[i].type == SI_GGUF_UINT32 && si_gguf_get_u64(g, "starinfer.profile.n_ff", &v) == SI_OK && v == (uint64_t)ff,
              "n_ff is UINT32");
        i = si_gguf_find_tensor(g, "blk.2.ffn_act_count");
        CHECK(i >= 0 && g->tensors[i].type == SI_TYPE_I32 && g->tensors[i].n_dims == 1,
              "blk.2.ffn_act_count is I32 {n_ff}");
        CHECK(g->n_tensors == (uint64_t)nl, "%llu tensors", (unsigned long long)g->n_tensors);
        si_gguf_free(g);
    }
}

/* The reader's refusals: a missing file, a model file (model_path), the
 * narrow profile q against m (and the writer's of bad counts), the
 * profile file prof_path cut short. */
static void check_read_refusals(const struct si_model *m, struct si_profile *q,
                                const char *model_path, const char *prof_path)
{
    char path[128], err[512];
    /* The reader's refusals. */
    path_in(path, sizeof path, "missing.gguf");
    expect_read(path, NULL, SI_E_NOT_FOUND, "No such file");
    expect_read(model_path, NULL, SI_E_FORMAT, "missing key starinfer.profile.");
    if (q != NULL) {
        q->n_tokens = 5;
        q->counts[3] = 5;
        path_in(path, sizeof path, "narrow.gguf");
        CHECK(si_profile_write(q, path, err, sizeof err) == SI_OK, "write: %s", err);
        expect_read(path, m, SI_E_INVALID, "3 layers x 256 neurons, but the model has 3 x 512");
        q->counts[3] = 6;
        err[0] = '\0';
        CHECK(si_profile_write(q, path, err, sizeof err) == SI_E_INVALID, "write with a count "
              "above n_tokens: %s", err);
        q->counts[3] = -1;
        CHECK(si_profile_write(q, path, err, sizeof err) == SI_E_INVALID, "write with a negative "
              "count: %s", err);
    }
    /* Truncated: the counts' data cut short. */
    {
        FILE *f = fopen(prof_path, "rb");
        path_in(path, sizeof path, "cut.gguf");
        FILE *o = fopen(path, "wb");
        char buf[1024];
        size_t n = f != NULL ? fread(buf, 1, sizeof buf, f) : 0;
        if (o != NULL)
            fwrite(buf, 1, n, o);
        if (f != NULL)
            fclose(f);
        if (o != NULL)
            fclose(o);
        expect_read(path, m, SI_E_FORMAT, "cut.gguf: ");
    }
}

/* The reader's refusals of hand-written files (raw.gguf): counts out of
 * range or not whole, a missing key, a wrong type, a layer's tensor of the
 * wrong shape or missing; F32 counts of whole numbers read. */
static void check_raw_refusals(void)
{
    char path[128], err[512];
    int32_t *vals = calloc((size_t)2 * 8, sizeof *vals);
    path_in(path, sizeof path, "raw.gguf");
    vals[5] = 11;
    write_raw(path, true, 10, 2, 8, SI_TYPE_I32, vals);
    expect_read(path, NULL, SI_E_FORMAT, "count 11 of neuron 5 is not a whole number in [0, n_tokens = 10]");
    vals[5] = 0;
    vals[8 + 2] = -3;
    write_raw(path, true, 10, 2, 8, SI_TYPE_I32, vals);
    expect_read(path, NULL, SI_E_FORMAT, "blk.1.ffn_act_count: count -3 of neuron 2");
    vals[10] = 0;
    write_raw(path, false, 10, 2, 8, SI_TYPE_I32, vals);
    expect_read(path, NULL, SI_E_FORMAT, "missing key starinfer.profile.n_ff");
    write_raw(path, true, 10, 2, 8, SI_TYPE_F16, vals);
    expect_read(path, NULL, SI_E_FORMAT, "is F16, expected I32 or F32");
    float fv[16] = {0};
    fv[3] = 2.5f;
    write_raw(path, true, 10, 2, 8, SI_TYPE_F32, fv);
    expect_read(path, NULL, SI_E_FORMAT, "count 2.5 of neuron 3");
    fv[3] = 7.0f;
    write_raw(path, true, 10, 2, 8, SI_TYPE_F32, fv);
    struct si_profile *r = NULL;
    int rc = si_profile_read(&r, path, NULL, err, sizeof err);
    CHECK(rc == SI_OK && r != NULL && r->counts[3] == 7 && r->n_tokens == 10 && r->n_layer == 2 &&
              r->n_ff == 8,
          "F32 counts of whole numbers are read: %s", err);
    si_profile_free(r);
    /* A layer's tensor of the wrong shape, then missing (the file says 3 layers). */
    for (int missing = 0; missing < 2; missing++) {
        struct si_gguf_writer *w = si_gguf_writer_init(false);
        si_gguf_writer_set_u64(w, "starinfer.profile.n_tokens", 10);
        si_gguf_writer_set_u32(w, "starinfer.profile.n_layer", 3);
        si_gguf_writer_set_u32(w, "starinfer.profile.n_ff", 8);
        const int64_t ne[1] = {8}, ne2[2] = {4, 2};
        si_gguf_writer_add_tensor(w, "blk.0.ffn_act_count", SI_TYPE_I32, 1, ne, vals);
        si_gguf_writer_add_tensor(w, "blk.1.ffn_act_count", SI_TYPE_I32, missing ? 1 : 2,
                                  missing ? ne : ne2, vals);
        CHECK(si_gguf_writer_write(w, path, err, sizeof err) == SI_OK, "write: %s", err);
        si_gguf_writer_free(w);
        expect_read(path, NULL, SI_E_FORMAT,
                    missing ? "missing tensor blk.2.ffn_act_count"
                            : "tensor blk.1.ffn_act_count has 2 dimensions [4, 2, ...], expected [8]");
    }
    free(vals);
}

int main(void)
{
    if (mkdtemp(dir) == NULL) {
        perror("mkdtemp");
        return 1;
    }
    test_top_fraction();

    char model_path[128], prof_path[128], path[128], err[512];
    path_in(model_path, sizeof model_path, "model.gguf");
    struct si_synth_params sp = si_synth_default_params();
    si_synth_preset("tiny", &sp);
    sp.arch = SI_SYNTH_LLAMA_RELU;
    sp.type = SI_TYPE_F32;
    sp.n_layer = 3;
    sp.n_ff = 512;
    sp.seed = 7;
    int rc = si_synth_write(&sp, model_path, err, sizeof err);
    CHECK(rc == SI_OK, "synth: %s", err);
    struct si_model *m = NULL;
    if (rc == SI_OK)
        CHECK(si_model_load(&m, model_path, err, sizeof err) == SI_OK, "load: %s", err);
    if (m == NULL) {
        unlink(model_path);
        rmdir(dir);
        return test_result();
    }
    const int32_t nl = m->hp.n_layer, ff = m->hp.n_ff;
    const size_t total = (size_t)nl * (size_t)ff;

    /* Pseudo-random tokens. */
    int32_t toks[N_TOK];
    uint64_t x = 0x9e3779b97f4a7c15u;
    for (int i = 0; i < N_TOK; i++) {
        x = x * 6364136223846793005u + 1442695040888963407u;
        toks[i] = (int32_t)((x >> 33) % (uint64_t)m->hp.n_vocab);
    }

    struct si_ref_params rp = si_ref_default_params();
    rp.n_ctx = WINDOW;
    struct si_profile *p = NULL;
    CHECK(si_profile_init(&p, nl, ff, err, sizeof err) == SI_OK, "init: %s", err);
    rc = si_profile_collect(p, m, ref_runner(rp), toks, N_TOK, err, sizeof err);
    CHECK(rc == SI_OK, "collect: %s", err);
    CHECK(p->n_tokens == N_TOK, "n_tokens %lld", (long long)p->n_tokens);

    /* Against the independent count, neuron by neuron. */
    int64_t *ref = calloc(total, sizeof *ref);
    independent_count(m, rp, toks, N_TOK, ref);
    check_counts(m, p, ref, sp.sparsity);
    check_planted(m, p);
    struct si_profile *q = check_collect_again(m, toks, rp, p, ref);
    path_in(prof_path, sizeof prof_path, "profile.gguf");
    check_round_trip(m, p, prof_path);
    check_read_refusals(m, q, model_path, prof_path);
    check_raw_refusals();

    test_thresholds(m, toks, ref);

    si_profile_free(q);
    si_profile_free(p);
    free(ref);
    si_model_free(m);
    const char *names[] = {"model.gguf", "profile.gguf", "narrow.gguf", "cut.gguf", "raw.gguf"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        path_in(path, sizeof path, names[i]);
        unlink(path);
    }
    rmdir(dir);
    return test_result();
}
