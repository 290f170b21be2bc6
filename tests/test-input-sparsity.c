/*
 * test-input-sparsity.c - input sparsity (src/predict/input_sparsity.h,
 * TEAL) on a synthetic llama-silu model: the calibrated thresholds put the
 * target share of every layer's inputs at or below them (on the
 * calibration tokens, measured by an independent hook); the reference with
 * them zeroes exactly those entries (and with thresholds 0 gives the dense
 * logits bit for bit); lookups between grid points interpolate; the
 * profile keeps the table through a write and a read; malformed tables are
 * refused by the writer and the reader.
 */
#include "model/forward.h"
#include "model/gguf_write.h"
#include "model/model.h"
#include "model/synth.h"
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

#define N_TOK  200
#define WINDOW 64

static char dir[] = "/tmp/si-test-input-XXXXXX";

/* Per layer and kind: entries seen, and those at or below thr (when set). */
struct counter {
    const float *thr;
    int64_t seen[16][SI_INPUT_KINDS], below[16][SI_INPUT_KINDS], zeros[16][SI_INPUT_KINDS];
};

static void count_hook(void *user, int l, enum si_input_kind kind, const float *x, int64_t n)
{
    struct counter *c = user;
    const float t = c->thr != NULL ? c->thr[l * SI_INPUT_KINDS + kind] : 0.0f;
    for (int64_t i = 0; i < n; i++) {
        c->seen[l][kind]++;
        c->below[l][kind] += fabsf(x[i]) <= t;
        c->zeros[l][kind] += x[i] == 0.0f;
    }
}

/* Run the tokens through the reference in windows with thresholds thr
 * (NULL: dense), counting with c (may be NULL); the logits of the last
 * token into logits. */
static void run(const struct si_model *m, const int32_t *toks, const float *thr, struct counter *c,
                float *logits)
{
    struct si_ref_params rp = si_ref_default_params();
    rp.n_ctx = WINDOW;
    rp.input_thresholds = thr;
    struct si_ref *s = NULL;
    char err[256];
    if (si_ref_init(&s, m, rp, err, sizeof err) != SI_OK) {
        CHECK(0, "ref init: %s", err);
        return;
    }
    s->input_hook = c != NULL ? count_hook : NULL;
    s->input_hook_user = c;
    for (int i = 0; i < N_TOK; i++) {
        if (i % WINDOW == 0)
            si_ref_reset(s);
        CHECK(si_ref_eval(s, toks[i]) == SI_OK, "eval %d", i);
    }
    memcpy(logits, s->logits, (size_t)m->hp.n_vocab * sizeof *logits);
    si_ref_free(s);
}

static void write_bad(const char *path, const float *grid, uint64_t ng, const float *thr,
                      uint64_t nt, int32_t n_layer, int32_t n_ff)
{
    struct si_gguf_writer *w = si_gguf_writer_init(false);
    si_gguf_writer_set_u64(w, "starinfer.profile.n_tokens", 1);
    si_gguf_writer_set_u32(w, "starinfer.profile.n_layer", (uint32_t)n_layer);
    si_gguf_writer_set_u32(w, "starinfer.profile.n_ff", (uint32_t)n_ff);
    if (grid != NULL)
        si_gguf_writer_set_arr(w, "starinfer.profile.input_sparsity", SI_GGUF_FLOAT32, grid, ng);
    if (thr != NULL)
        si_gguf_writer_set_arr(w, "starinfer.profile.input_thresholds", SI_GGUF_FLOAT32, thr, nt);
    int32_t *zeros = calloc((size_t)n_ff, sizeof *zeros);
    const int64_t ne[1] = {n_ff};
    for (int32_t l = 0; l < n_layer; l++) {
        char name[64];
        snprintf(name, sizeof name, "blk.%d.ffn_act_count", (int)l);
        si_gguf_writer_add_tensor(w, name, SI_TYPE_I32, 1, ne, zeros);
    }
    char err[256];
    CHECK(si_gguf_writer_write(w, path, err, sizeof err) == SI_OK, "write %s: %s", path, err);
    si_gguf_writer_free(w);
    free(zeros);
}

static void expect_refused(const char *path, const struct si_model *m, const char *needle)
{
    struct si_profile *p = NULL;
    char err[512] = "";
    const int rc = si_profile_read(&p, path, m, err, sizeof err);
    CHECK(rc == SI_E_FORMAT && p == NULL && strstr(err, needle) != NULL && !strchr(err, '\n'),
          "%s: rc %d, '%s' (want '%s')", path, rc, err, needle);
    si_profile_free(p);
}

/* Calibration on m's tokens toks (into *c, the table into p): every grid
 * point's share met on the same tokens. */
static void calibrate(const struct si_model *m, const int32_t *toks, struct si_input_calib **c,
                      struct si_profile **p)
{
    char err[512];
    const int32_t nl = m->hp.n_layer;
    /* Calibration: every grid point's share met on the same tokens. */
    CHECK(si_input_calib_init(c, m, err, sizeof err) == SI_OK, "calib init: %s", err);
    struct si_ref_params rp = si_ref_default_params();
    rp.n_ctx = WINDOW;
    for (int w = 0; w < N_TOK; w += WINDOW) {
        const int len = N_TOK - w < WINDOW ? N_TOK - w : WINDOW;
        CHECK(si_input_calib_collect(*c, m, rp, toks + w, len, err, sizeof err) == SI_OK,
              "collect: %s", err);
    }
    CHECK(si_profile_init(p, nl, m->hp.n_ff, err, sizeof err) == SI_OK, "profile: %s", err);
    const size_t cells = (size_t)nl * SI_INPUT_KINDS * SI_INPUT_GRID_N;
    double *below = malloc(cells * sizeof *below);
    CHECK(si_input_calib_apply(*c, *p, below, err, sizeof err) == SI_OK, "apply: %s", err);
    CHECK((*p)->n_input == SI_INPUT_GRID_N && fabsf((*p)->input_grid[7] - 0.40f) < 1e-6f,
          "grid of %d, point 7 %g", (*p)->n_input, (double)(*p)->input_grid[7]);
    double worst = 0;
    for (size_t k = 0; k < cells; k++)
        worst = fmax(worst, fabs(below[k] - (*p)->input_grid[k % SI_INPUT_GRID_N]));
    printf("calibration: %d tokens, every layer's measured share within %.4f of its grid point\n",
           N_TOK, worst);
    CHECK(worst < 0.02, "a measured share is %.4f off its grid point", worst);
    free(below);
}

/* p's thresholds at S = 0.4 (into thr), applied to m's tokens toks: the
 * hook (which sees each input before the zeroing) finds that share at or
 * below them on every layer and input; the logits move; S = 0 is dense
 * to the bit. */
static void check_applied(const struct si_model *m, const int32_t *toks, const struct si_profile *p,
                          float *thr)
{
    char err[512];
    const int32_t nl = m->hp.n_layer;
    /* The thresholds at S = 0.4, applied: the hook (which sees each input
     * before the zeroing) finds that share at or below them, on every
     * layer and input; the logits move; S = 0 is dense to the bit. */
    float *dense = malloc((size_t)m->hp.n_vocab * sizeof *dense);
    float *sparse = malloc((size_t)m->hp.n_vocab * sizeof *sparse);
    float *zero = malloc((size_t)m->hp.n_vocab * sizeof *zero);
    CHECK(si_input_thresholds_at(p, 0.4, thr, err, sizeof err) == SI_OK, "at 0.4: %s", err);
    struct counter *cn = calloc(1, sizeof *cn);
    cn->thr = thr;
    run(m, toks, NULL, cn, dense);
    double off = 0;
    for (int32_t l = 0; l < nl; l++)
        for (int k = 0; k < SI_INPUT_KINDS; k++)
            off = fmax(off, fabs((double)cn->below[l][k] / (double)cn->seen[l][k] - 0.4));
    CHECK(off < 0.02, "share at or below the S = 0.4 thresholds %.4f off", off);
    struct counter *cs = calloc(1, sizeof *cs);
    run(m, toks, thr, cs, sparse);
    /* the inputs after the first layer's change with the zeroing; the hook
     * of layer 0's q/k/v sees the same input in both runs */
    CHECK(cs->seen[0][SI_INPUT_QKV] == cn->seen[0][SI_INPUT_QKV] &&
              cs->zeros[0][SI_INPUT_QKV] == cn->zeros[0][SI_INPUT_QKV],
          "layer 0's first input differs");
    CHECK(memcmp(dense, sparse, (size_t)m->hp.n_vocab * sizeof *dense) != 0,
          "S = 0.4 left the logits as they were");
    float *thr0 = calloc((size_t)nl * SI_INPUT_KINDS, sizeof *thr0);
    CHECK(si_input_thresholds_at(p, 0.0, thr0, err, sizeof err) == SI_OK, "at 0: %s", err);
    bool all0 = true;
    for (int32_t k = 0; k < nl * SI_INPUT_KINDS; k++)
        all0 = all0 && thr0[k] == 0.0f;
    CHECK(all0, "S = 0 gives thresholds other than 0");
    run(m, toks, thr0, NULL, zero);
    CHECK(memcmp(dense, zero, (size_t)m->hp.n_vocab * sizeof *dense) == 0,
          "S = 0 changed the logits");
    free(thr0);
    free(dense);
    free(sparse);
    free(zero);
    free(cn);
    free(cs);
}

/* Between p's grid points the thresholds are linear (thr: those at 0.40);
 * out of range and missing tables refused. */
static void check_between(const struct si_model *m, const struct si_profile *p, const float *thr)
{
    char err[512];
    const int32_t nl = m->hp.n_layer;
    /* Between grid points: linear; out of range and missing tables refused. */
    float *mid = malloc((size_t)nl * SI_INPUT_KINDS * sizeof *mid);
    CHECK(si_input_thresholds_at(p, 0.425, mid, err, sizeof err) == SI_OK, "at 0.425: %s", err);
    float *a45 = malloc((size_t)nl * SI_INPUT_KINDS * sizeof *a45);
    si_input_thresholds_at(p, 0.45, a45, err, sizeof err);
    double lin = 0;
    for (int32_t k = 0; k < nl * SI_INPUT_KINDS; k++)
        lin = fmax(lin, fabs(mid[k] - 0.5 * ((double)thr[k] + a45[k])) /
                            fmax(1e-30, fabs((double)a45[k])));
    CHECK(lin < 1e-5, "S = 0.425 is not halfway between 0.40 and 0.45 (%g)", lin);
    err[0] = '\0';
    CHECK(si_input_thresholds_at(p, 0.95, mid, err, sizeof err) == SI_E_INVALID &&
              strstr(err, "0 to 0.90") != NULL,
          "S = 0.95: '%s'", err);
    struct si_profile *plain = NULL;
    si_profile_init(&plain, nl, m->hp.n_ff, err, sizeof err);
    err[0] = '\0';
    CHECK(si_input_thresholds_at(plain, 0.4, mid, err, sizeof err) == SI_E_INVALID &&
              strstr(err, "--input-sparsity") != NULL,
          "no table: '%s'", err);
    si_profile_free(plain);
    free(mid);
    free(a45);
}

/* One S per kind: the kinds apart; the model-wide share by weights; the
 * specs --sparsity input takes and refuses. */
static void check_by_kind(const struct si_model *m, const struct si_profile *p)
{
    char err[512];
    const int32_t nl = m->hp.n_layer;
    /* One S per kind: the kinds apart; the model-wide share by weights;
     * the specs --sparsity input takes and refuses. */
    const double by[SI_INPUT_KINDS] = {0.5, 0.0, 0.25, 0.4};
    float *tk = malloc((size_t)nl * SI_INPUT_KINDS * sizeof *tk);
    float *tq = malloc((size_t)nl * SI_INPUT_KINDS * sizeof *tq);
    CHECK(si_input_thresholds_by_kind(p, by, tk, err, sizeof err) == SI_OK, "by kind: %s", err);
    bool kinds_ok = true;
    for (int k = 0; k < SI_INPUT_KINDS; k++) {
        si_input_thresholds_at(p, by[k], tq, err, sizeof err);
        for (int32_t l = 0; l < nl; l++)
            kinds_ok = kinds_ok && tk[l * SI_INPUT_KINDS + k] == tq[l * SI_INPUT_KINDS + k];
    }
    CHECK(kinds_ok, "per-kind thresholds differ from the uniform ones of the same S");
    free(tk);
    free(tq);
    const double half[SI_INPUT_KINDS] = {0.5, 0.5, 0.5, 0.5};
    const double ffn_only[SI_INPUT_KINDS] = {0, 0, 1, 0};
    const double d = m->hp.n_embd, f = m->hp.n_ff, kv = (double)m->hp.n_head_kv * m->hp.head_dim;
    const double want_ffn = 2 * d * f / (2 * d * d + 2 * d * kv + 3 * d * f);
    CHECK(fabs(si_input_model_sparsity(m, half) - 0.5) < 1e-12 &&
              fabs(si_input_model_sparsity(m, ffn_only) - want_ffn) < 1e-9,
          "model sparsity %g (0.5), %g (%g)", si_input_model_sparsity(m, half),
          si_input_model_sparsity(m, ffn_only), want_ffn);
    double S[SI_INPUT_KINDS];
    CHECK(si_input_parse("", S, err, sizeof err) && S[0] == 0.4 && S[3] == 0.4, "input");
    CHECK(si_input_parse("=0.3", S, err, sizeof err) && S[1] == 0.3 && S[2] == 0.3, "input=0.3");
    CHECK(si_input_parse("=ffn:0.2,qkv:0.5", S, err, sizeof err) && S[SI_INPUT_QKV] == 0.5 &&
              S[SI_INPUT_O] == 0 && S[SI_INPUT_FFN] == 0.2 && S[SI_INPUT_DOWN] == 0,
          "input=ffn:0.2,qkv:0.5: %s", err);
    const char *bad[] = {"x", "=0.95", "=-0.1", "=ffn:", "=ffn:0.2,", "=gate:0.2", "=ffn:0.2x",
                         "=ffn0.2"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        err[0] = '\0';
        CHECK(!si_input_parse(bad[i], S, err, sizeof err) && err[0] != '\0',
              "input%s accepted", bad[i]);
    }
}

/* The profile p keeps the table through a write (prof_path) and a read;
 * malformed tables (into bad_path) are refused by the writer and the
 * reader. */
static void check_table_files(const struct si_model *m, struct si_profile *p, const char *prof_path,
                              const char *bad_path)
{
    char err[512];
    const int32_t nl = m->hp.n_layer;
    const size_t cells = (size_t)nl * SI_INPUT_KINDS * SI_INPUT_GRID_N;
    /* The profile keeps the table. */
    CHECK(si_profile_write(p, prof_path, err, sizeof err) == SI_OK, "write: %s", err);
    struct si_profile *back = NULL;
    CHECK(si_profile_read(&back, prof_path, m, err, sizeof err) == SI_OK, "read: %s", err);
    if (back != NULL)
        CHECK(back->n_input == p->n_input &&
                  !memcmp(back->input_grid, p->input_grid, SI_INPUT_GRID_N * sizeof(float)) &&
                  !memcmp(back->input_thresholds, p->input_thresholds, cells * sizeof(float)),
              "the table changed through the file");
    si_profile_free(back);

    /* Malformed tables: the writer and the reader refuse them. */
    const float keep = p->input_thresholds[5];
    p->input_thresholds[5] = p->input_thresholds[4] * 0.5f - 1.0f; /* decreasing (and < 0) */
    CHECK(si_profile_write(p, bad_path, err, sizeof err) == SI_E_INVALID &&
              access(bad_path, F_OK) != 0,
          "a bad table written: '%s'", err);
    p->input_thresholds[5] = keep;
    const int32_t ff = m->hp.n_ff;
    const uint64_t nt = (uint64_t)nl * SI_INPUT_KINDS * SI_INPUT_GRID_N;
    write_bad(bad_path, p->input_grid, SI_INPUT_GRID_N, NULL, 0, nl, ff);
    expect_refused(bad_path, m, "without");
    write_bad(bad_path, p->input_grid, SI_INPUT_GRID_N, p->input_thresholds, nt - 1, nl, ff);
    expect_refused(bad_path, m, "must be an array of");
    float *g2 = malloc(SI_INPUT_GRID_N * sizeof *g2);
    memcpy(g2, p->input_grid, SI_INPUT_GRID_N * sizeof *g2);
    g2[3] = g2[2];
    write_bad(bad_path, g2, SI_INPUT_GRID_N, p->input_thresholds, nt, nl, ff);
    expect_refused(bad_path, m, "not increasing");
    float *t2 = malloc(nt * sizeof *t2);
    memcpy(t2, p->input_thresholds, nt * sizeof *t2);
    t2[1] = NAN;
    write_bad(bad_path, p->input_grid, SI_INPUT_GRID_N, t2, nt, nl, ff);
    expect_refused(bad_path, m, "not finite");
    memcpy(t2, p->input_thresholds, nt * sizeof *t2);
    t2[2] = t2[1] * 0.5f;
    if (t2[1] > 0) {
        write_bad(bad_path, p->input_grid, SI_INPUT_GRID_N, t2, nt, nl, ff);
        expect_refused(bad_path, m, "decrease");
    }
    unlink(bad_path);
    free(g2);
    free(t2);
}

int main(void)
{
    if (mkdtemp(dir) == NULL) {
        perror("mkdtemp");
        return 1;
    }
    char model_path[128], prof_path[128], bad_path[128], err[512];
    snprintf(model_path, sizeof model_path, "%s/model.gguf", dir);
    snprintf(prof_path, sizeof prof_path, "%s/p.gguf", dir);
    snprintf(bad_path, sizeof bad_path, "%s/bad.gguf", dir);
    struct si_synth_params sp = si_synth_default_params();
    si_synth_preset("tiny", &sp);
    sp.arch = SI_SYNTH_LLAMA_SILU;
    sp.type = SI_TYPE_F32;
    sp.n_layer = 3;
    sp.seed = 11;
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
    const int32_t nl = m->hp.n_layer;
    int32_t toks[N_TOK];
    uint64_t x = 0x2545f4914f6cdd1du;
    for (int i = 0; i < N_TOK; i++) {
        x = x * 6364136223846793005u + 1442695040888963407u;
        toks[i] = (int32_t)((x >> 33) % (uint64_t)m->hp.n_vocab);
    }

    struct si_input_calib *c = NULL;
    struct si_profile *p = NULL;
    calibrate(m, toks, &c, &p);
    float *thr = malloc((size_t)nl * SI_INPUT_KINDS * sizeof *thr);
    check_applied(m, toks, p, thr);
    check_between(m, p, thr);
    check_by_kind(m, p);
    check_table_files(m, p, prof_path, bad_path);

    free(thr);
    si_profile_free(p);
    si_input_calib_free(c);
    si_model_free(m);
    unlink(prof_path);
    unlink(model_path);
    rmdir(dir);
    return test_result();
}
