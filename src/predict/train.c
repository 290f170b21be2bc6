/* train.c - collecting samples and training activation predictors (train.h). */
#include "predict/train.h"

#include "internal.h"
#include "model/act.h"
#include "model/gguf.h"
#include "model/gguf_write.h"
#include "model/pwri.h"
#include "model/quants.h"
#include "model/transpose.h"
#include "model/types.h"
#include "predict/profile.h"
#include "starinfer.h"

#include <cblas.h>
#include <float.h>
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* par_for's chunk: elements of an elementwise step a thread takes at once */
#define PAR_CHUNK ((size_t)4096)

/* ------------------------------------------------------------ samples */

int si_train_samples_init(struct si_train_samples **out, int32_t n_layer, int32_t n_embd,
                          int32_t n_ff, int64_t cap, char *err, size_t err_size)
{
    *out = NULL;
    if (n_layer < 1 || n_embd < 1 || n_ff < 1 || cap < 1)
        return si__errf(err, err_size, SI_E_INVALID,
                        "training samples of %" PRId32 " layers x %" PRId32 " x %" PRId32
                        ", room %" PRId64 ": every size must be >= 1",
                        n_layer, n_embd, n_ff, cap);
    struct si_train_samples *s = calloc(1, sizeof *s);
    if (s == NULL)
        return si__errf(err, err_size, SI_E_NOMEM, "out of memory");
    s->n_layer = n_layer;
    s->n_embd = n_embd;
    s->n_ff = n_ff;
    s->cap = cap;
    s->mask_bytes = ((int64_t)n_ff + 7) / 8;
    const size_t rows = (size_t)n_layer * (size_t)cap;
    s->x = malloc(rows * (size_t)n_embd * sizeof *s->x);
    s->mask = calloc(rows, (size_t)s->mask_bytes);
    if (s->x == NULL || s->mask == NULL) {
        si_train_samples_free(s);
        return si__errf(err, err_size, SI_E_NOMEM,
                        "out of memory for %" PRId64 " training samples of %" PRId32 " layers",
                        cap, n_layer);
    }
    *out = s;
    return SI_OK;
}

void si_train_samples_free(struct si_train_samples *s)
{
    if (s == NULL)
        return;
    free(s->x);
    free(s->mask);
    free(s);
}

void si_train_samples_set(struct si_train_samples *s, int32_t l, const float *x,
                          const uint8_t *active)
{
    const size_t row = (size_t)l * (size_t)s->cap + (size_t)s->n;
    uint16_t *xs = s->x + row * (size_t)s->n_embd;
    for (int32_t i = 0; i < s->n_embd; i++)
        xs[i] = si_fp32_to_fp16(x[i]);
    uint8_t *m = s->mask + row * (size_t)s->mask_bytes;
    memset(m, 0, (size_t)s->mask_bytes);
    for (int32_t i = 0; i < s->n_ff; i++)
        if (active[i])
            m[i >> 3] |= (uint8_t)(1u << (i & 7));
}

static const char *rule_names[SI_ACTIVE_COUNT] = {"gate", "output"};

const char *si_active_rule_name(enum si_active_rule r)
{
    return r < SI_ACTIVE_COUNT ? rule_names[r] : "?";
}

int si_active_rule_parse(const char *name, enum si_active_rule *out)
{
    for (int r = 0; r < SI_ACTIVE_COUNT; r++)
        if (!strcmp(name, rule_names[r])) {
            *out = (enum si_active_rule)r;
            return SI_OK;
        }
    return SI_E_NOT_FOUND;
}

float si_active_value(const struct si_ffn_view *v, enum si_active_rule r, int64_t i)
{
    if (r == SI_ACTIVE_OUTPUT || v->g == NULL)
        return fabsf(v->h[i]);
    return fabsf(si_act_apply(v->m->hp.act, v->g[i]));
}

/* Histogram bins: the top 16 bits of |v|'s float (as the profile's). */
#define HIST_SHIFT 15
#define HIST_BINS ((size_t)1 << (31 - HIST_SHIFT))

struct si_active_calib {
    int32_t n_layer, n_ff;
    enum si_active_rule rule;
    uint64_t *hist; /* (n_layer, HIST_BINS) */
};

int si_active_calib_init(struct si_active_calib **out, const struct si_model *m,
                         enum si_active_rule r, char *err, size_t err_size)
{
    *out = NULL;
    struct si_active_calib *c = calloc(1, sizeof *c);
    if (c != NULL)
        c->hist = calloc((size_t)m->hp.n_layer * HIST_BINS, sizeof *c->hist);
    if (c == NULL || c->hist == NULL) {
        free(c);
        return si__errf(err, err_size, SI_E_NOMEM, "out of memory for %" PRId32 " histograms",
                        m->hp.n_layer);
    }
    c->n_layer = m->hp.n_layer;
    c->n_ff = m->hp.n_ff;
    c->rule = r;
    *out = c;
    return SI_OK;
}

void si_active_calib_free(struct si_active_calib *c)
{
    if (c == NULL)
        return;
    free(c->hist);
    free(c);
}

static void calib_hook(void *user, const struct si_ffn_view *v, int l)
{
    const struct si_active_calib *c = user;
    uint64_t *h = c->hist + (size_t)l * HIST_BINS;
    for (int64_t i = 0; i < c->n_ff; i++) {
        const float a = si_active_value(v, c->rule, i);
        uint32_t bits;
        memcpy(&bits, &a, sizeof bits);
        h[(bits & 0x7fffffffu) >> HIST_SHIFT]++;
    }
}

int si_active_calib_collect(struct si_active_calib *c, const struct si_model *m,
                            const struct si_ffn_runner *run, const int32_t *tokens, int64_t n,
                            char *err, size_t err_size)
{
    if (c == NULL || m == NULL || run == NULL || n < 0 || (n > 0 && tokens == NULL) ||
        c->n_layer != m->hp.n_layer || c->n_ff != m->hp.n_ff)
        return si__errf(err, err_size, SI_E_INVALID, "calibration: invalid arguments");
    for (int64_t i = 0; i < n; i++)
        if (tokens[i] < 0 || tokens[i] >= m->hp.n_vocab)
            return si__errf(err, err_size, SI_E_INVALID,
                            "token %" PRId32 " at position %" PRId64
                            " is outside the vocabulary of %" PRId32,
                            tokens[i], i, m->hp.n_vocab);
    if (n == 0)
        return SI_OK;
    return run->run(run, m, tokens, n, calib_hook, c, err, err_size);
}

int si_active_calib_thresholds(const struct si_active_calib *c, double S, float *thresholds,
                               char *err, size_t err_size)
{
    if (!(S >= 0 && S < 1))
        return si__errf(err, err_size, SI_E_INVALID, "target sparsity %g is not in [0, 1)", S);
    for (int32_t l = 0; l < c->n_layer; l++) {
        const uint64_t *h = c->hist + (size_t)l * HIST_BINS;
        uint64_t total = 0;
        for (size_t b = 0; b < HIST_BINS; b++)
            total += h[b];
        thresholds[l] = 0.0f;
        if (S <= 0 || total == 0)
            continue;
        /* The bin whose cumulative count is nearest S of the values; the
         * threshold is the largest float in it. */
        const double want = S * (double)total;
        double best_d = INFINITY;
        size_t best = 0;
        uint64_t cum = 0;
        for (size_t b = 0; b < HIST_BINS; b++) {
            cum += h[b];
            const double d = fabs((double)cum - want);
            if (d < best_d) {
                best_d = d;
                best = b;
            }
            if ((double)cum >= want)
                break;
        }
        if (best >= (size_t)(0x7f7fffffu >> HIST_SHIFT)) {
            thresholds[l] = FLT_MAX;
            continue;
        }
        const uint32_t bits = (uint32_t)((best + 1) << HIST_SHIFT) - 1u;
        memcpy(&thresholds[l], &bits, sizeof bits);
    }
    return SI_OK;
}

struct collect_hook {
    struct si_train_samples *s;
    enum si_active_rule rule;
    const float *thresholds; /* NULL: ReLU family, active = activation != 0 */
    uint8_t *active;         /* (n_ff) scratch */
};

/* One sample of layer l: the FFN input and which neurons are active (the
 * profile's rule); the last layer completes the token's sample. */
static void collect_hook(void *user, const struct si_ffn_view *v, int l)
{
    struct collect_hook *h = user;
    struct si_train_samples *s = h->s;
    if (s->n >= s->cap)
        return;
    if (h->thresholds == NULL) {
        for (int32_t i = 0; i < s->n_ff; i++)
            h->active[i] = v->h[i] != 0.0f;
    } else {
        const float t = h->thresholds[l];
        for (int32_t i = 0; i < s->n_ff; i++)
            h->active[i] = si_active_value(v, h->rule, i) > t;
    }
    si_train_samples_set(s, l, s->input == SI_PRED_RESIDUAL ? v->xr
                               : s->input == SI_PRED_LAYER  ? v->xa
                                                            : v->x,
                         h->active);
    if (l == s->n_layer - 1)
        s->n++;
}

int si_train_collect(struct si_train_samples *s, const struct si_model *m,
                     const struct si_ffn_runner *run, enum si_active_rule rule, const float *thresholds, const int32_t *tokens,
                     int64_t n, char *err, size_t err_size)
{
    if (s == NULL || m == NULL || run == NULL || n < 0 || (n > 0 && tokens == NULL))
        return si__errf(err, err_size, SI_E_INVALID, "train collect: invalid arguments");
    if (s->n_layer != m->hp.n_layer || s->n_embd != m->hp.n_embd || s->n_ff != m->hp.n_ff)
        return si__errf(err, err_size, SI_E_INVALID,
                        "samples of %" PRId32 " layers x %" PRId32 " x %" PRId32
                        ", but the model has %" PRId32 " x %" PRId32 " x %" PRId32,
                        s->n_layer, s->n_embd, s->n_ff, m->hp.n_layer, m->hp.n_embd,
                        m->hp.n_ff);
    const bool relu = si_profile_relu_family(m);
    if (!relu && thresholds == NULL)
        return si__errf(err, err_size, SI_E_INVALID,
                        "a %s model needs per-layer thresholds to tell active neurons (a "
                        "target sparsity or a profile made with one)",
                        m->hp.act == SI_ACT_GELU ? "GELU" : "SiLU");
    for (int64_t i = 0; i < n; i++)
        if (tokens[i] < 0 || tokens[i] >= m->hp.n_vocab)
            return si__errf(err, err_size, SI_E_INVALID,
                            "token %" PRId32 " at position %" PRId64
                            " is outside the vocabulary of %" PRId32,
                            tokens[i], i, m->hp.n_vocab);
    const int64_t room = s->cap - s->n, todo = n < room ? n : room;
    if (todo <= 0)
        return SI_OK;
    struct collect_hook h = {s, rule, relu ? NULL : thresholds, malloc((size_t)s->n_ff)};
    if (h.active == NULL)
        return si__errf(err, err_size, SI_E_NOMEM, "out of memory");
    const int rc = run->run(run, m, tokens, todo, collect_hook, &h, err, err_size);
    free(h.active);
    return rc;
}

/* ------------------------------------------------------------ training */

struct si_train_params si_train_default_params(void)
{
    return (struct si_train_params){
        .target_recall = 0.95,
        .rank_step = 32,
        .rank_min = 32,
        .rank_max = 0,
        .epochs = 10,
        .batch = 256,
        .lr = 2e-3f,
        .pos_weight = 1.0f,
        .holdout = 0.1,
        .cost_power = 1.0,
        .seed = 1,
    };
}

void si_train_layer_clear(struct si_train_layer *t)
{
    if (t == NULL)
        return;
    free(t->fc1);
    free(t->fc2);
    memset(t, 0, sizeof *t);
}

static uint64_t splitmix64(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* Uniform in [0, 1) from 53 random bits. */
static double uniform(uint64_t *s)
{
    return (double)(splitmix64(s) >> 11) * 0x1.0p-53;
}

static float gaussian(uint64_t *s)
{
    const double u = 1.0 - uniform(s), v = uniform(s);
    return (float)(sqrt(-2.0 * log(u)) * cos(6.283185307179586 * v));
}

/* Fisher-Yates on idx[0..n). */
static void shuffle(int64_t *idx, int64_t n, uint64_t *rng)
{
    for (int64_t i = n - 1; i > 0; i--) {
        const int64_t j = (int64_t)(splitmix64(rng) % (uint64_t)(i + 1));
        const int64_t t = idx[i];
        idx[i] = idx[j];
        idx[j] = t;
    }
}

/* A layer's samples as floats and bytes, shuffled: training rows first. */
struct layer_data {
    int64_t n_tr, n_ho;
    int32_t d, ff, layer;
    float *x;     /* (n_tr + n_ho, d) */
    uint8_t *y;   /* (n_tr + n_ho, ff) 0 or 1 */
    double p;     /* active share of the training part */
    float w_pos, w_neg;
    double x_ms;  /* mean x^2 of the training part */
    float *c;     /* (n_tr + n_ho, ff) per-pair weights (SI_TRAIN_LOSS_COST), or NULL */
};

static void layer_data_free(struct layer_data *ld)
{
    free(ld->x);
    free(ld->y);
    free(ld->c);
    memset(ld, 0, sizeof *ld);
}

/* A layer's FFN matrix (ff rows of d) as floats, or NULL (no memory). */
static float *dequantize_matrix(const struct si_tensor *t, int32_t ff, int32_t d)
{
    float *w = malloc((size_t)ff * (size_t)d * sizeof *w);
    if (w != NULL)
        for (int32_t i = 0; i < ff; i++)
            si_dequantize_row(t->type, (const char *)t->data + (size_t)i * t->row_bytes,
                              w + (size_t)i * d, d);
    return w;
}

/* SI_TRAIN_LOSS_COST's weights: the cost of the wrong decision on each pair.
 * Skipping an active neuron loses what its output contributes, computing an
 * inactive one spends what the threshold prices a neuron at: with both
 * measured as v^P (P = cost_power), a pair weighs |v^P - t^P|
 * (cost-sensitive classification reduced to weighted classification; pairs
 * at the threshold do not matter either way).  v is recomputed in floats
 * from the model's weights and x (the masks came from the forward pass,
 * whose products may round differently: such pairs lie at the threshold
 * and weigh next to nothing). */
static int cost_weights(struct layer_data *ld, const struct si_train_params *p, char *err,
                        size_t err_size)
{
    const struct si_model *m = p->model;
    const int32_t l = ld->layer, d = ld->d, ff = ld->ff;
    if (m == NULL || m->hp.n_embd != d || m->hp.n_ff != ff || l >= m->hp.n_layer)
        return si__errf(
            err, err_size, SI_E_INVALID,
            "the cost-weighted loss needs the samples' model (%" PRId32 " x %" PRId32 ")", d, ff);
    const struct si_hparams *hp = &m->hp;
    const struct si_layer *L = &m->w.layers[l];
    const bool plain = hp->ffn_kind == SI_FFN_PLAIN;
    if (!si_type_supported(L->ffn_up.type) || (!plain && !si_type_supported(L->ffn_gate.type)))
        return si__errf(err, err_size, SI_E_UNSUPPORTED,
                        "layer %" PRId32 ": the FFN's tensor type cannot be dequantized", l);
    const float t = p->thresholds != NULL ? p->thresholds[l] : 0.0f;
    if (!(t > 0.0f))
        return si__errf(err, err_size, SI_E_INVALID,
                        "layer %" PRId32 ": the cost-weighted loss prices a computed neuron at the "
                        "rule's threshold, and this layer has none (a ReLU model, or target "
                        "sparsity 0): use the balanced loss",
                        l);
    const int64_t n = ld->n_tr + ld->n_ho;
    const int64_t CH = 256;
    float *wu = dequantize_matrix(&L->ffn_up, ff, d);
    float *wg = plain ? NULL : dequantize_matrix(&L->ffn_gate, ff, d);
    float *u = malloc((size_t)CH * (size_t)ff * sizeof *u);
    float *g = plain ? NULL : malloc((size_t)CH * (size_t)ff * sizeof *g);
    float *b = NULL;
    ld->c = malloc((size_t)n * (size_t)ff * sizeof *ld->c);
    if (L->ffn_up_b.data != NULL && (b = malloc((size_t)ff * sizeof *b)) != NULL)
        si_dequantize_row(L->ffn_up_b.type, L->ffn_up_b.data, b, ff);
    if (wu == NULL || u == NULL || ld->c == NULL || (!plain && (wg == NULL || g == NULL)) ||
        (L->ffn_up_b.data != NULL && b == NULL)) {
        free(wu), free(wg), free(u), free(g), free(b);
        return si__errf(err, err_size, SI_E_NOMEM,
                        "out of memory for layer %" PRId32 "'s cost weights", l);
    }
    const double gam = p->cost_power;
    const double tt = pow((double)t, gam);
    double sum = 0;
    for (int64_t k0 = 0; k0 < n; k0 += CH) {
        const int32_t bn = (int32_t)(n - k0 < CH ? n - k0 : CH);
        const float *x = ld->x + (size_t)k0 * (size_t)d;
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, bn, ff, d, 1.0f, x, d, wu, d, 0.0f, u,
                    ff);
        if (!plain)
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, bn, ff, d, 1.0f, x, d, wg, d, 0.0f,
                        g, ff);
        for (int32_t j = 0; j < bn; j++)
            for (int32_t i = 0; i < ff; i++) {
                const size_t q = (size_t)j * (size_t)ff + (size_t)i;
                const float up = u[q] + (b != NULL ? b[i] : 0.0f);
                float v;
                if (plain) {
                    v = fabsf(si_act_apply(hp->act, up));
                } else {
                    const float a = si_act_apply(hp->act, g[q]);
                    v = fabsf(p->rule == SI_ACTIVE_GATE ? a : si_act_gated(hp->ffn_kind, a, up));
                }
                const double cw = fabs(pow((double)v, gam) - tt);
                ld->c[(size_t)(k0 + j) * (size_t)ff + (size_t)i] = (float)cw;
                if (k0 + j < ld->n_tr)
                    sum += cw;
            }
    }
    free(wu), free(wg), free(u), free(g), free(b);
    const double mean = sum / ((double)ld->n_tr * (double)ff);
    if (mean > 0) {
        const float inv = (float)(1.0 / mean);
        for (size_t q = 0; q < (size_t)n * (size_t)ff; q++)
            ld->c[q] *= inv;
    }
    return SI_OK;
}

static int layer_data_init(struct layer_data *ld, const struct si_train_samples *s, int32_t l,
                           const struct si_train_params *p, char *err, size_t err_size)
{
    memset(ld, 0, sizeof *ld);
    if (l < 0 || l >= s->n_layer)
        return si__errf(err, err_size, SI_E_INVALID, "layer %" PRId32 " is not in [0, %" PRId32 ")",
                        l, s->n_layer);
    if (!(p->holdout > 0 && p->holdout < 1) || p->epochs < 1 || p->batch < 1 || !(p->lr > 0) ||
        !(p->pos_weight > 0) || (unsigned)p->loss >= SI_TRAIN_LOSS_COUNT ||
        (p->loss == SI_TRAIN_LOSS_COST && !(p->cost_power > 0 && p->cost_power <= 4)))
        return si__errf(err, err_size, SI_E_INVALID,
                        "training parameters out of range (holdout in (0, 1), epochs, batch, "
                        "lr and pos_weight > 0, a known loss, cost_power in (0, 4])");
    const int64_t n = s->n;
    int64_t n_ho = (int64_t)llround(p->holdout * (double)n);
    n_ho = n_ho < 1 ? 1 : n_ho;
    if (n - n_ho < 1)
        return si__errf(err, err_size, SI_E_INVALID,
                        "%" PRId64 " samples: too few to train and hold out (need 2 or more)", n);
    ld->n_tr = n - n_ho;
    ld->n_ho = n_ho;
    ld->d = s->n_embd;
    ld->ff = s->n_ff;
    ld->layer = l;
    ld->x = malloc((size_t)n * (size_t)ld->d * sizeof *ld->x);
    ld->y = malloc((size_t)n * (size_t)ld->ff);
    int64_t *idx = malloc((size_t)n * sizeof *idx);
    if (ld->x == NULL || ld->y == NULL || idx == NULL) {
        free(idx);
        layer_data_free(ld);
        return si__errf(err, err_size, SI_E_NOMEM, "out of memory for layer %" PRId32 "'s samples",
                        l);
    }
    for (int64_t k = 0; k < n; k++)
        idx[k] = k;
    /* The split is the seed's and the layer's: neighbouring tokens are alike,
     * so held-out samples are drawn from the whole corpus. */
    uint64_t rng = p->seed ^ (0x5851f42d4c957f2dull * (uint64_t)(l + 1));
    shuffle(idx, n, &rng);
    double pos = 0, ms = 0;
    for (int64_t k = 0; k < n; k++) {
        const uint16_t *xs = s->x + ((size_t)l * (size_t)s->cap + (size_t)idx[k]) * (size_t)ld->d;
        float *x = ld->x + (size_t)k * (size_t)ld->d;
        uint8_t *y = ld->y + (size_t)k * (size_t)ld->ff;
        for (int32_t i = 0; i < ld->d; i++) {
            x[i] = si_fp16_to_fp32(xs[i]);
            if (k < ld->n_tr)
                ms += (double)x[i] * x[i];
        }
        for (int32_t i = 0; i < ld->ff; i++) {
            y[i] = si_train_sample_active(s, l, idx[k], i);
            if (k < ld->n_tr)
                pos += y[i];
        }
    }
    free(idx);
    const double pairs = (double)ld->n_tr * (double)ld->ff;
    ld->p = pos / pairs;
    ld->x_ms = ms / ((double)ld->n_tr * (double)ld->d);
    /* Balanced: each class carries half of the loss (a class that never
     * occurs gets weight 1; it adds nothing either way). */
    const double p_c = ld->p > 0 && ld->p < 1 ? ld->p : 0.5;
    ld->w_pos = (float)(p->pos_weight * 0.5 / p_c);
    ld->w_neg = (float)(0.5 / (1.0 - p_c));
    if (p->loss == SI_TRAIN_LOSS_COST) {
        ld->w_pos = (float)p->pos_weight;
        ld->w_neg = 1.0f;
        const int rc = cost_weights(ld, p, err, err_size);
        if (rc != SI_OK) {
            layer_data_free(ld);
            return rc;
        }
    }
    return SI_OK;
}

/* Scratch for one width. */
struct work {
    int32_t r, B;
    float *w1, *w2;        /* (r, d), (ff, r) */
    float *g1, *g2;        /* gradients */
    float *m1, *v1, *m2, *v2; /* Adam moments */
    float *xb;             /* (B, d) */
    uint8_t *yb;           /* (B, ff) */
    float *cb;             /* (B, ff) the pairs' weights, with ld->c */
    float *h, *dh;         /* (B, r) */
    float *z;              /* (B, ff), then the gradient in place */
    double *sums;          /* the loss of each chunk of z (par_for) */
};

static void work_free(struct work *w)
{
    free(w->w1);
    free(w->w2);
    free(w->g1);
    free(w->g2);
    free(w->m1);
    free(w->v1);
    free(w->m2);
    free(w->v2);
    free(w->xb);
    free(w->sums);
    free(w->yb);
    free(w->cb);
    free(w->h);
    free(w->dh);
    free(w->z);
}

static int work_init(struct work *w, const struct layer_data *ld, int32_t r, int32_t B)
{
    memset(w, 0, sizeof *w);
    w->r = r;
    w->B = B;
    const size_t n1 = (size_t)r * (size_t)ld->d, n2 = (size_t)ld->ff * (size_t)r;
    w->w1 = malloc(n1 * sizeof(float));
    w->w2 = malloc(n2 * sizeof(float));
    w->g1 = malloc(n1 * sizeof(float));
    w->g2 = malloc(n2 * sizeof(float));
    w->m1 = calloc(n1, sizeof(float));
    w->v1 = calloc(n1, sizeof(float));
    w->m2 = calloc(n2, sizeof(float));
    w->v2 = calloc(n2, sizeof(float));
    w->xb = malloc((size_t)B * (size_t)ld->d * sizeof(float));
    w->yb = malloc((size_t)B * (size_t)ld->ff);
    if (ld->c != NULL && (w->cb = malloc((size_t)B * (size_t)ld->ff * sizeof(float))) == NULL) {
        work_free(w);
        return SI_E_NOMEM;
    }
    w->h = malloc((size_t)B * (size_t)r * sizeof(float));
    w->dh = malloc((size_t)B * (size_t)r * sizeof(float));
    w->z = malloc((size_t)B * (size_t)ld->ff * sizeof(float));
    w->sums = malloc(((size_t)B * (size_t)ld->ff / PAR_CHUNK + 1) * sizeof(double));
    if (!w->w1 || !w->w2 || !w->g1 || !w->g2 || !w->m1 || !w->v1 || !w->m2 || !w->v2 || !w->xb ||
        !w->yb || !w->h || !w->dh || !w->z || !w->sums) {
        work_free(w);
        return SI_E_NOMEM;
    }
    return SI_OK;
}

/* h = relu(x w1^T), z = h w2^T for b rows of x. */
static void forward(struct work *w, const struct layer_data *ld, const float *x, int32_t b)
{
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, b, w->r, ld->d, 1.0f, x, ld->d, w->w1,
                ld->d, 0.0f, w->h, w->r);
    for (size_t k = 0; k < (size_t)b * (size_t)w->r; k++)
        w->h[k] = w->h[k] > 0.0f ? w->h[k] : 0.0f;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, b, ld->ff, w->r, 1.0f, w->h, w->r, w->w2,
                w->r, 0.0f, w->z, ld->ff);
}

/* Weighted binary cross-entropy of logit z against y (stable form). */
static inline double bce(float z, uint8_t y, float wp, float wn)
{
    const float l = (z > 0 ? z : 0) - (y ? z : 0) + log1pf(expf(-fabsf(z)));
    return (double)((y ? wp : wn) * l);
}

/* ------------------------------------------- elementwise steps in parallel */

/* The elementwise steps of a minibatch (the loss's gradient over b x ff
 * pairs, Adam over the weights) in fixed chunks of PAR_CHUNK elements,
 * chunk c on thread c % T: what each element gets, and each chunk's partial
 * sum, do not depend on T.  One thread below 2 chunks' work. */
struct par {
    void (*fn)(void *ctx, size_t c, size_t i0, size_t i1);
    void *ctx;
    size_t n, chunks;
    int32_t t, nt;
};

static void *par_run(void *arg)
{
    const struct par *p = arg;
    for (size_t c = (size_t)p->t; c < p->chunks; c += (size_t)p->nt) {
        const size_t i0 = c * PAR_CHUNK, i1 = i0 + PAR_CHUNK < p->n ? i0 + PAR_CHUNK : p->n;
        p->fn(p->ctx, c, i0, i1);
    }
    return NULL;
}

static void par_for(int32_t threads, size_t n, void (*fn)(void *, size_t, size_t, size_t),
                    void *ctx)
{
    enum { MAX_T = 64 };
    const size_t chunks = (n + PAR_CHUNK - 1) / PAR_CHUNK;
    if (threads < 1)
        threads = (int32_t)sysconf(_SC_NPROCESSORS_ONLN);
    int32_t nt = threads < 1 ? 1 : threads > MAX_T ? MAX_T : threads;
    if ((size_t)nt > chunks)
        nt = chunks > 0 ? (int32_t)chunks : 1;
    struct par p[MAX_T];
    pthread_t th[MAX_T];
    bool started[MAX_T] = {false};
    for (int32_t t = 0; t < nt; t++)
        p[t] = (struct par){fn, ctx, n, chunks, t, nt};
    for (int32_t t = 1; t < nt; t++)
        started[t] = pthread_create(&th[t], NULL, par_run, &p[t]) == 0;
    par_run(&p[0]);
    for (int32_t t = 1; t < nt; t++) {
        if (started[t])
            pthread_join(th[t], NULL);
        else
            par_run(&p[t]); /* no thread: this one does its chunks */
    }
}

/* Held-out quality at threshold 0. */
static void quality(struct work *w, const struct layer_data *ld, struct si_train_quality *q)
{
    int64_t tp = 0, fp = 0, fn = 0;
    double loss = 0;
    const int64_t n0 = ld->n_tr, n = ld->n_tr + ld->n_ho;
    for (int64_t k = n0; k < n; k += w->B) {
        const int32_t b = (int32_t)(n - k < w->B ? n - k : w->B);
        forward(w, ld, ld->x + (size_t)k * (size_t)ld->d, b);
        const uint8_t *y = ld->y + (size_t)k * (size_t)ld->ff;
        for (size_t e = 0; e < (size_t)b * (size_t)ld->ff; e++) {
            const bool pred = w->z[e] >= 0.0f;
            tp += pred && y[e];
            fp += pred && !y[e];
            fn += !pred && y[e];
            loss += bce(w->z[e], y[e], ld->w_pos, ld->w_neg) *
                    (ld->c != NULL ? ld->c[(size_t)k * (size_t)ld->ff + e] : 1.0f);
        }
    }
    const double pairs = (double)ld->n_ho * (double)ld->ff;
    q->recall = tp + fn > 0 ? (double)tp / (double)(tp + fn) : 1.0;
    q->precision = tp + fp > 0 ? (double)tp / (double)(tp + fp) : 1.0;
    q->pred_sparsity = 1.0 - (double)(tp + fp) / pairs;
    q->loss = loss / pairs;
}

struct adam_step {
    float *wt, *m, *v;
    const float *g;
    float lr, c1, c2;
};

static void adam_chunk(void *ctx, size_t c, size_t i0, size_t i1)
{
    (void)c;
    const struct adam_step *a = ctx;
    const float b1 = 0.9f, b2 = 0.999f, eps = 1e-8f;
    for (size_t k = i0; k < i1; k++) {
        a->m[k] = b1 * a->m[k] + (1 - b1) * a->g[k];
        a->v[k] = b2 * a->v[k] + (1 - b2) * a->g[k] * a->g[k];
        a->wt[k] -= a->lr * (a->m[k] / a->c1) / (sqrtf(a->v[k] / a->c2) + eps);
    }
}

static void adam(int32_t threads, float *wt, const float *g, float *m, float *v, size_t n,
                 float lr, float c1, float c2)
{
    struct adam_step a = {wt, m, v, g, lr, c1, c2};
    par_for(threads, n, adam_chunk, &a);
}

/* The loss's gradient in place of the logits z (of the batch's mean over
 * samples of the summed losses); with sums, each chunk's loss. */
struct grad_step {
    float *z;
    const uint8_t *y;
    const float *cb; /* NULL: every pair weighs 1 */
    float wp, wn, inv_b;
    double *sums;    /* per chunk, or NULL */
};

static void grad_chunk(void *ctx, size_t c, size_t i0, size_t i1)
{
    const struct grad_step *g = ctx;
    double loss = 0;
    for (size_t q = i0; q < i1; q++) {
        const float z = g->z[q];
        const uint8_t y = g->y[q];
        const float w = (g->cb != NULL ? g->cb[q] : 1.0f) * (y ? g->wp : g->wn);
        const float e = expf(-fabsf(z)); /* one exp for the sigmoid and the loss */
        const float sg = z >= 0 ? 1.0f / (1.0f + e) : e / (1.0f + e);
        if (g->sums != NULL)
            loss += (double)(w * ((z > 0 ? z : 0) - (y ? z : 0) + log1pf(e)));
        g->z[q] = w * (sg - (float)y) * g->inv_b;
    }
    if (g->sums != NULL)
        g->sums[c] = loss;
}

/* Train at width r from a seeded start; the result into out. */
static int fit(const struct layer_data *ld, int32_t r, const struct si_train_params *p,
               struct si_train_layer *out, char *err, size_t err_size)
{
    const double t0 = si__now();
    const int32_t B = p->batch < ld->n_tr ? p->batch : (int32_t)ld->n_tr;
    struct work w;
    if (work_init(&w, ld, r, B) != SI_OK)
        return si__errf(err, err_size, SI_E_NOMEM, "out of memory training layer %" PRId32
                        " at width %" PRId32, ld->layer, r);
    int64_t *idx = malloc((size_t)ld->n_tr * sizeof *idx);
    if (idx == NULL) {
        work_free(&w);
        return si__errf(err, err_size, SI_E_NOMEM, "out of memory");
    }
    const int32_t d = ld->d, ff = ld->ff;
    /* He initialisation scaled to x's RMS: fc1's outputs start with variance
     * 2, fc2's with variance about 1. */
    uint64_t rng = p->seed * 0x2545f4914f6cdd1dull + (uint64_t)ld->layer * 7919u + (uint64_t)r;
    const float s1 = (float)sqrt(2.0 / ((double)d * (ld->x_ms > 0 ? ld->x_ms : 1.0)));
    const float s2 = (float)sqrt(1.0 / (double)r);
    for (size_t k = 0; k < (size_t)r * (size_t)d; k++)
        w.w1[k] = s1 * gaussian(&rng);
    for (size_t k = 0; k < (size_t)ff * (size_t)r; k++)
        w.w2[k] = s2 * gaussian(&rng);

    memset(out, 0, sizeof *out);
    out->rank = r;
    out->active_share = ld->p;
    quality(&w, ld, &out->before);

    for (int64_t k = 0; k < ld->n_tr; k++)
        idx[k] = k;
    const int64_t steps_per_epoch = (ld->n_tr + B - 1) / B;
    const int64_t total = steps_per_epoch * p->epochs;
    int64_t t = 0;
    double c1p = 1, c2p = 1; /* beta1^t, beta2^t */
    for (int32_t e = 0; e < p->epochs; e++) {
        shuffle(idx, ld->n_tr, &rng);
        const bool last = e == p->epochs - 1;
        double loss = 0;
        for (int64_t k0 = 0; k0 < ld->n_tr; k0 += B) {
            const int32_t b = (int32_t)(ld->n_tr - k0 < B ? ld->n_tr - k0 : B);
            for (int32_t j = 0; j < b; j++) {
                const int64_t k = idx[k0 + j];
                memcpy(w.xb + (size_t)j * d, ld->x + (size_t)k * d, (size_t)d * sizeof(float));
                memcpy(w.yb + (size_t)j * ff, ld->y + (size_t)k * ff, (size_t)ff);
                if (ld->c != NULL)
                    memcpy(w.cb + (size_t)j * ff, ld->c + (size_t)k * ff,
                           (size_t)ff * sizeof(float));
            }
            forward(&w, ld, w.xb, b);
            /* dL/dz of the batch's mean (over samples) of the summed losses. */
            const size_t pairs = (size_t)b * (size_t)ff;
            struct grad_step gs = {w.z,      w.yb,     ld->c != NULL ? w.cb : NULL,
                                   ld->w_pos, ld->w_neg, 1.0f / (float)b,
                                   last ? w.sums : NULL};
            par_for(p->threads, pairs, grad_chunk, &gs);
            for (size_t c = 0; last && c < (pairs + PAR_CHUNK - 1) / PAR_CHUNK; c++)
                loss += w.sums[c];
            /* g2 = dz^T h; dh = dz w2, masked by relu; g1 = dh^T x. */
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, ff, r, b, 1.0f, w.z, ff, w.h, r,
                        0.0f, w.g2, r);
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, b, r, ff, 1.0f, w.z, ff, w.w2,
                        r, 0.0f, w.dh, r);
            for (size_t q = 0; q < (size_t)b * (size_t)r; q++)
                if (!(w.h[q] > 0.0f))
                    w.dh[q] = 0.0f;
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, r, d, b, 1.0f, w.dh, r, w.xb, d,
                        0.0f, w.g1, d);
            /* Adam, its step decayed linearly to a tenth over the run. */
            t++;
            c1p *= 0.9;
            c2p *= 0.999;
            const float lr = p->lr * (float)(1.0 - 0.9 * (double)(t - 1) / (double)total);
            adam(p->threads, w.w1, w.g1, w.m1, w.v1, (size_t)r * d, lr, (float)(1 - c1p),
                 (float)(1 - c2p));
            adam(p->threads, w.w2, w.g2, w.m2, w.v2, (size_t)ff * r, lr, (float)(1 - c1p),
                 (float)(1 - c2p));
        }
        if (last)
            out->train_loss = loss / ((double)ld->n_tr * (double)ff);
        if (p->progress != NULL)
            p->progress(p->progress_user, ld->layer, r, e + 1, p->epochs);
    }
    quality(&w, ld, &out->after);
    /* Keep the weights: hand them over instead of copying. */
    out->fc1 = w.w1;
    out->fc2 = w.w2;
    w.w1 = w.w2 = NULL;
    work_free(&w);
    free(idx);
    out->n_trials = 1;
    out->seconds = si__now() - t0;
    return SI_OK;
}

int si_train_fit(const struct si_train_samples *s, int32_t l, int32_t rank,
                 const struct si_train_params *p, struct si_train_layer *out, char *err,
                 size_t err_size)
{
    memset(out, 0, sizeof *out);
    if (rank < 1)
        return si__errf(err, err_size, SI_E_INVALID, "predictor width %" PRId32 " is below 1",
                        rank);
    struct layer_data ld;
    int rc = layer_data_init(&ld, s, l, p, err, err_size);
    if (rc != SI_OK)
        return rc;
    rc = fit(&ld, rank, p, out, err, err_size);
    layer_data_free(&ld);
    return rc;
}

int si_train_adaptive(const struct si_train_samples *s, int32_t l, const struct si_train_params *p,
                      struct si_train_layer *out, char *err, size_t err_size)
{
    memset(out, 0, sizeof *out);
    const int32_t step = p->rank_step;
    if (step < 1 || p->rank_min < 1 || p->rank_max < 0 || !(p->target_recall > 0) ||
        p->target_recall > 1)
        return si__errf(err, err_size, SI_E_INVALID,
                        "adaptive width: rank step and minimum must be >= 1, the target recall "
                        "in (0, 1]");
    if (p->loss == SI_TRAIN_LOSS_COST)
        return si__errf(err, err_size, SI_E_INVALID,
                        "adaptive width: its test, recall at threshold 0, means nothing under the "
                        "cost-weighted loss (it does not balance the classes): give a width");
    const int32_t k_min = (p->rank_min + step - 1) / step;
    const int32_t k_max = p->rank_max > 0 ? p->rank_max / step : (s->n_embd + step - 1) / step;
    if (k_max < k_min || k_max < 1)
        return si__errf(err, err_size, SI_E_INVALID,
                        "adaptive width: no multiple of %" PRId32 " in [%" PRId32 ", %" PRId32 "]",
                        step, p->rank_min, p->rank_max > 0 ? p->rank_max : s->n_embd);
    struct layer_data ld;
    int rc = layer_data_init(&ld, s, l, p, err, err_size);
    if (rc != SI_OK)
        return rc;
    const double t0 = si__now();
    /* Start from the layer's activity: a sparser layer starts narrower. */
    int32_t k0 = (int32_t)ceil(ld.p * (double)s->n_embd / (double)step);
    k0 = k0 < k_min ? k_min : k0 > k_max ? k_max : k0;
    struct si_train_layer pass = {0}, fail = {0}, cur;
    int32_t k_pass = 0, k_fail = 0, trials = 0;
    int32_t lo = k_min - 1, hi = -1; /* lo: fails (or below the range); hi: passes */
    int32_t k = k0;
    for (;;) {
        if ((rc = fit(&ld, k * step, p, &cur, err, err_size)) != SI_OK)
            goto out;
        trials++;
        const bool ok = cur.after.recall >= p->target_recall;
        if (ok) {
            hi = k;
            if (k_pass == 0 || k < k_pass) {
                si_train_layer_clear(&pass);
                pass = cur;
                k_pass = k;
            } else {
                si_train_layer_clear(&cur);
            }
        } else {
            lo = k > lo ? k : lo;
            if (k > k_fail) {
                si_train_layer_clear(&fail);
                fail = cur;
                k_fail = k;
            } else {
                si_train_layer_clear(&cur);
            }
        }
        if (hi < 0) { /* grow until a width passes or the widest fails */
            if (k >= k_max)
                break;
            k = 2 * k < k_max ? 2 * k : k_max;
            continue;
        }
        if (hi - lo <= 1)
            break;
        k = lo + (hi - lo) / 2;
    }
    if (k_pass > 0) {
        *out = pass;
        pass = (struct si_train_layer){0};
    } else {
        *out = fail;
        fail = (struct si_train_layer){0};
    }
    out->n_trials = trials;
    out->seconds = si__now() - t0;
out:
    si_train_layer_clear(&pass);
    si_train_layer_clear(&fail);
    layer_data_free(&ld);
    return rc;
}

/* ------------------------------------------------------------ threshold */

enum { THR_BINS = 128 * 256, THR_LO = -64 };

int si_train_threshold_for_sparsity(const struct si_train_samples *s,
                                    const struct si_train_layer *layers, double S, float *T,
                                    double *got, char *err, size_t err_size)
{
    if (s == NULL || layers == NULL || !(S >= 0 && S < 1) || s->n < 1)
        return si__errf(err, err_size, SI_E_INVALID,
                        "predictor threshold: the sparsity must be in [0, 1) and samples given");
    const int32_t d = s->n_embd, ff = s->n_ff, B = 256;
    int32_t rmax = 0;
    for (int32_t l = 0; l < s->n_layer; l++) {
        if (layers[l].fc1 == NULL || layers[l].fc2 == NULL || layers[l].rank < 1)
            return si__errf(err, err_size, SI_E_INVALID,
                            "predictor threshold: layer %" PRId32 " has no predictor", l);
        rmax = layers[l].rank > rmax ? layers[l].rank : rmax;
    }
    /* Counts per bin; the bins below and above the range are the first
     * and the last. */
    uint64_t *hist = calloc(THR_BINS + 2, sizeof *hist);
    float *x = malloc((size_t)B * (size_t)d * sizeof *x);
    float *h = malloc((size_t)B * (size_t)rmax * sizeof *h);
    float *z = malloc((size_t)B * (size_t)ff * sizeof *z);
    if (hist == NULL || x == NULL || h == NULL || z == NULL) {
        free(hist);
        free(x);
        free(h);
        free(z);
        return si__errf(err, err_size, SI_E_NOMEM, "out of memory");
    }
    for (int32_t l = 0; l < s->n_layer; l++) {
        const struct si_train_layer *L = &layers[l];
        for (int64_t k0 = 0; k0 < s->n; k0 += B) {
            const int32_t b = (int32_t)(s->n - k0 < B ? s->n - k0 : B);
            const uint16_t *xs = s->x + ((size_t)l * (size_t)s->cap + (size_t)k0) * (size_t)d;
            for (size_t e = 0; e < (size_t)b * (size_t)d; e++)
                x[e] = si_fp16_to_fp32(xs[e]);
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, b, L->rank, d, 1.0f, x, d, L->fc1,
                        d, 0.0f, h, L->rank);
            for (size_t e = 0; e < (size_t)b * (size_t)L->rank; e++)
                h[e] = h[e] > 0.0f ? h[e] : 0.0f;
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, b, ff, L->rank, 1.0f, h, L->rank,
                        L->fc2, L->rank, 0.0f, z, ff);
            for (size_t e = 0; e < (size_t)b * (size_t)ff; e++) {
                /* Bin j + 1 holds [THR_LO + j / 256, THR_LO + (j + 1) / 256). */
                const double f = floor(((double)z[e] - THR_LO) * 256.0);
                const int64_t j = f < 0 ? -1 : f >= THR_BINS ? THR_BINS : (int64_t)f;
                hist[j + 1]++;
            }
        }
    }
    const double pairs = (double)s->n_layer * (double)s->n * (double)ff;
    /* The smallest bin edge below which a share >= S lies. */
    double below = 0;
    int64_t j = 0;
    while (j < THR_BINS + 1 && below + (double)hist[j] <= S * pairs)
        below += (double)hist[j++];
    /* Edge j: values below it are in bins 0 .. j - 1. */
    if (j == 0) { /* more than S below the range: no edge fits, compute all */
        *T = -FLT_MAX;
    } else {
        *T = (float)(THR_LO + (double)(j - 1) / 256.0);
    }
    *got = below / pairs;
    free(hist);
    free(x);
    free(h);
    free(z);
    return SI_OK;
}

/* ------------------------------------------------------------ writing */

uint32_t si_train_auto_type(const struct si_model *m, int32_t rank_step)
{
    const uint32_t t = m->w.layers[0].ffn_up.type;
    const struct si_type_traits *tt = si_type_get(t);
    if (si_type_quantizable(t) && tt != NULL && m->hp.n_embd % tt->block == 0 &&
        rank_step % tt->block == 0)
        return t;
    return SI_TYPE_F16;
}

/* Is `name` blk.N.fc1.weight or blk.N.fc2.weight? */
static bool is_predictor_tensor(struct si_gguf_str name)
{
    char buf[96];
    if (name.len >= sizeof buf)
        return false;
    memcpy(buf, name.data, name.len);
    buf[name.len] = '\0';
    unsigned l;
    char which[4], rest[16];
    return sscanf(buf, "blk.%u.%3[fc12].%15s", &l, which, rest) == 3 &&
           (!strcmp(which, "fc1") || !strcmp(which, "fc2")) && !strcmp(rest, "weight");
}

/* rows x n floats into a new buffer of type t (NULL if out of memory). */
static void *quantize(uint32_t t, const float *src, int64_t rows, int64_t n, size_t row_bytes)
{
    char *dst = malloc((size_t)rows * row_bytes);
    for (int64_t k = 0; dst != NULL && k < rows; k++)
        si_quantize_row(t, src + (size_t)k * (size_t)n, dst + (size_t)k * row_bytes, n);
    return dst;
}

/* A predictor file's own keys (model.h): its architecture, the model's
 * name, shape and fingerprint. */
static int pred_file_keys(struct si_gguf_writer *w, const struct si_model *m)
{
    struct si_gguf_str name = {0, ""};
    si_gguf_get_str(m->gguf, "general.name", &name);
    char buf[256];
    snprintf(buf, sizeof buf, "%.*s", (int)(name.len < 200 ? name.len : 200), name.data);
    int rc;
    if ((rc = si_gguf_writer_set_str(w, "general.architecture", SI_PRED_FILE_ARCH)) != SI_OK ||
        (name.len > 0 &&
         (rc = si_gguf_writer_set_str(w, SI_PRED_FILE_KEY("model_name"), buf)) != SI_OK) ||
        (rc = si_gguf_writer_set_u32(w, SI_PRED_FILE_KEY("n_layer"), (uint32_t)m->hp.n_layer)) !=
            SI_OK ||
        (rc = si_gguf_writer_set_u32(w, SI_PRED_FILE_KEY("n_embd"), (uint32_t)m->hp.n_embd)) !=
            SI_OK ||
        (rc = si_gguf_writer_set_u32(w, SI_PRED_FILE_KEY("n_ff"), (uint32_t)m->hp.n_ff)) != SI_OK)
        return rc;
    return si_gguf_writer_set_u64(w, SI_PRED_FILE_KEY("model_hash"), si_model_ffn_hash(m));
}

int si_train_write(const struct si_model *m, const struct si_train_layer *layers,
                   const struct si_train_write_params *wp, const char *path, char *err,
                   size_t err_size)
{
    const struct si_hparams *hp = &m->hp;
    const struct si_gguf *g = m->gguf;
    if (g == NULL || layers == NULL || wp == NULL)
        return si__errf(err, err_size, SI_E_INVALID, "%s: invalid arguments", path);
    if (!si_type_quantizable(wp->type))
        return si__errf(err, err_size, SI_E_INVALID, "%s: predictors cannot be written as %s",
                        path, si_type_name(wp->type));
    size_t b1, b2;
    if (!si_type_row_size(wp->type, hp->n_embd, &b1))
        return si__errf(err, err_size, SI_E_INVALID,
                        "%s: n_embd %" PRId32 " is not a multiple of %s's block", path, hp->n_embd,
                        si_type_name(wp->type));
    /* PowerInfer's layout (model/pwri.h): its tensor set, ffn_down_t in a
     * type it reads, predictors of the residual (what it gives them) */
    const bool only = wp->predictors_only;
    if (only && (wp->powerinfer || wp->down_t))
        return si__errf(err, err_size, SI_E_INVALID,
                        "%s: a predictor file holds no weights (%s needs the whole model)", path,
                        wp->powerinfer ? "PowerInfer's layout" : "ffn_down_t");
    const bool pwri = !only && (wp->powerinfer || g->powerinfer);
    if (pwri && wp->input != SI_PRED_RESIDUAL)
        return si__errf(err, err_size, SI_E_INVALID,
                        "%s: PowerInfer's layout: PowerInfer gives the predictors the residual "
                        "the FFN's norm reads, not the %s input (--input residual)",
                        path, si_pred_input_name(wp->input));
    struct si_gguf_writer *w = si_gguf_writer_init(pwri);
    void **bufs = calloc(2 * (size_t)hp->n_layer, sizeof *bufs);
    const bool add_dt = !pwri && wp->down_t && m->w.layers[0].ffn_down_t.data == NULL;
    struct si_transpose *dt = add_dt ? calloc((size_t)hp->n_layer, sizeof *dt) : NULL;
    struct si_pwri_down *pd = pwri ? calloc((size_t)hp->n_layer, sizeof *pd) : NULL;
    int rc = SI_OK;
    if (w == NULL || bufs == NULL || (add_dt && dt == NULL) || (pwri && pd == NULL)) {
        rc = si__errf(err, err_size, SI_E_NOMEM, "%s: out of memory", path);
        goto out;
    }
    if ((rc = only ? pred_file_keys(w, m) : si_gguf_writer_copy_kv(w, g)) != SI_OK ||
        (rc = si_gguf_writer_set_f32(w, "powerinfer.sparse_threshold", wp->threshold)) != SI_OK ||
        (rc = si_gguf_writer_set_str(w, SI_PREDICTOR_INPUT_KEY, si_pred_input_name(wp->input))) !=
            SI_OK ||
        (wp->n_samples > 0 && (rc = si_gguf_writer_set_u64(w, "starinfer.predictor.n_samples",
                                                           (uint64_t)wp->n_samples)) != SI_OK))
        goto fail;
    if (wp->thresholds != NULL &&
        ((rc = si_gguf_writer_set_str(w, "starinfer.predictor.active_rule",
                                      si_active_rule_name(wp->rule))) != SI_OK ||
         (rc = si_gguf_writer_set_arr(w, "starinfer.predictor.active_threshold", SI_GGUF_FLOAT32,
                                      wp->thresholds, (uint64_t)hp->n_layer)) != SI_OK ||
         (rc = si_gguf_writer_set_f32(w, "starinfer.predictor.target_sparsity",
                                      (float)wp->target_sparsity)) != SI_OK))
        goto fail;
    /* Our reader takes a PWRI llama or falcon file for ReLU unless told. */
    if (pwri && (hp->arch == SI_ARCH_LLAMA || hp->arch == SI_ARCH_FALCON) && hp->act != SI_ACT_RELU &&
        (rc = si_gguf_writer_set_str(w, "starinfer.ffn_activation",
                                     hp->act == SI_ACT_GELU ? "gelu" : "silu")) != SI_OK)
        goto fail;
    for (uint64_t i = 0; i < (only ? 0 : g->n_tensors); i++) {
        const struct si_gguf_tensor *t = &g->tensors[i];
        if (is_predictor_tensor(t->name))
            continue;
        char name[256];
        if (t->name.len >= sizeof name) {
            rc = si__errf(err, err_size, SI_E_FORMAT, "%s: a tensor name of %" PRIu64
                          " bytes is too long to copy", path, t->name.len);
            goto out;
        }
        memcpy(name, t->name.data, t->name.len);
        name[t->name.len] = '\0';
        /* (PowerInfer's: ffn_down_t written below, in a type it reads) */
        if (pwri && (strstr(name, ".ffn_down_t.weight") != NULL ||
                     !si_pwri_name(t->name.data, t->name.len, name, sizeof name)))
            continue;
        if ((rc = si_gguf_writer_add_tensor(w, name, t->type, t->n_dims, t->ne, t->data)) != SI_OK)
            goto fail;
    }
    for (int32_t l = 0; l < hp->n_layer; l++) {
        const struct si_train_layer *L = &layers[l];
        if (L->fc1 == NULL || L->fc2 == NULL || !si_type_row_size(wp->type, L->rank, &b2)) {
            rc = si__errf(err, err_size, SI_E_INVALID,
                          "%s: layer %" PRId32 "'s predictor (width %" PRId32
                          ") is missing or its width is not a multiple of %s's block",
                          path, l, L->rank, si_type_name(wp->type));
            goto out;
        }
        bufs[2 * l] = quantize(wp->type, L->fc1, L->rank, hp->n_embd, b1);
        bufs[2 * l + 1] = quantize(wp->type, L->fc2, hp->n_ff, L->rank, b2);
        if (bufs[2 * l] == NULL || bufs[2 * l + 1] == NULL) {
            rc = si__errf(err, err_size, SI_E_NOMEM, "%s: out of memory", path);
            goto out;
        }
        char n1[64], n2[64];
        snprintf(n1, sizeof n1, "blk.%" PRId32 ".fc1.weight", l);
        snprintf(n2, sizeof n2, "blk.%" PRId32 ".fc2.weight", l);
        const int64_t ne1[2] = {hp->n_embd, L->rank}, ne2[2] = {L->rank, hp->n_ff};
        if ((rc = si_gguf_writer_add_tensor(w, n1, wp->type, 2, ne1, bufs[2 * l])) != SI_OK ||
            (rc = si_gguf_writer_add_tensor(w, n2, wp->type, 2, ne2, bufs[2 * l + 1])) != SI_OK)
            goto fail;
        if (pwri) {
            char nd[64];
            snprintf(nd, sizeof nd, "blk.%" PRId32 ".ffn_down_t.weight", l);
            const int64_t ned[2] = {hp->n_embd, hp->n_ff};
            if ((rc = si_pwri_down_init(&pd[l], m, l)) != SI_OK ||
                (rc = si_gguf_writer_add_tensor_cb(w, nd, pd[l].type, 2, ned, si_pwri_down_fill,
                                                   &pd[l])) != SI_OK)
                goto fail;
        } else if (add_dt) {
            const struct si_tensor *down = &m->w.layers[l].ffn_down;
            const struct si_type_traits *dtt = si_type_get(down->type);
            struct si_transpose *f = &dt[l];
            si_transpose_init(f, down,
                              si_type_quantizable(down->type) && hp->n_embd % dtt->block == 0
                                  ? down->type
                                  : SI_TYPE_F16);
            char nd[64];
            snprintf(nd, sizeof nd, "blk.%" PRId32 ".ffn_down_t.weight", l);
            const int64_t ned[2] = {hp->n_embd, hp->n_ff};
            if ((rc = si_gguf_writer_add_tensor_cb(w, nd, f->type, 2, ned, si_transpose_fill, f)) !=
                SI_OK)
                goto fail;
        }
    }
    rc = si_gguf_writer_write(w, path, err, err_size);
    goto out;
fail:
    rc = si__errf(err, err_size, rc, "%s: %s", path, si_status_str(rc));
out:
    for (int32_t k = 0; bufs != NULL && k < 2 * hp->n_layer; k++)
        free(bufs[k]);
    free(bufs);
    for (int32_t l = 0; dt != NULL && l < hp->n_layer; l++)
        si_transpose_release(&dt[l]);
    free(dt);
    for (int32_t l = 0; pd != NULL && l < hp->n_layer; l++)
        si_pwri_down_release(&pd[l]);
    free(pd);
    si_gguf_writer_free(w);
    return rc;
}

/* ------------------------------------------------------------ sample files */

#define SK_N "starinfer.samples.n"
#define SK_LAYER "starinfer.samples.n_layer"
#define SK_EMBD "starinfer.samples.n_embd"
#define SK_FF "starinfer.samples.n_ff"
#define SK_RULE "starinfer.samples.active_rule"
#define SK_THR "starinfer.samples.active_threshold"
#define SK_TARGET "starinfer.samples.target_sparsity"
#define SK_INPUT  "starinfer.samples.input" /* si_pred_input_name's; absent: ffn */

int si_train_samples_write(const struct si_train_samples *s, enum si_active_rule rule,
                           const float *thresholds, double target_sparsity, const char *path,
                           char *err, size_t err_size)
{
    if (s == NULL || s->n < 1)
        return si__errf(err, err_size, SI_E_INVALID, "%s: no samples to write", path);
    struct si_gguf_writer *w = si_gguf_writer_init(false);
    if (w == NULL)
        return si__errf(err, err_size, SI_E_NOMEM, "%s: out of memory", path);
    int rc;
    if ((rc = si_gguf_writer_set_u64(w, SK_N, (uint64_t)s->n)) != SI_OK ||
        (rc = si_gguf_writer_set_u32(w, SK_LAYER, (uint32_t)s->n_layer)) != SI_OK ||
        (rc = si_gguf_writer_set_u32(w, SK_EMBD, (uint32_t)s->n_embd)) != SI_OK ||
        (rc = si_gguf_writer_set_u32(w, SK_FF, (uint32_t)s->n_ff)) != SI_OK ||
        (rc = si_gguf_writer_set_str(w, SK_INPUT, si_pred_input_name(s->input))) != SI_OK ||
        (thresholds != NULL &&
         ((rc = si_gguf_writer_set_str(w, SK_RULE, si_active_rule_name(rule))) != SI_OK ||
          (rc = si_gguf_writer_set_arr(w, SK_THR, SI_GGUF_FLOAT32, thresholds,
                                       (uint64_t)s->n_layer)) != SI_OK ||
          (rc = si_gguf_writer_set_f32(w, SK_TARGET, (float)target_sparsity)) != SI_OK)))
        goto fail;
    for (int32_t l = 0; l < s->n_layer; l++) {
        char name[64];
        const int64_t nx[2] = {s->n_embd, s->n}, nm[2] = {s->mask_bytes, s->n};
        snprintf(name, sizeof name, "blk.%" PRId32 ".samples_x", l);
        if ((rc = si_gguf_writer_add_tensor(w, name, SI_TYPE_F16, 2, nx,
                                            s->x + (size_t)l * (size_t)s->cap *
                                                       (size_t)s->n_embd)) != SI_OK)
            goto fail;
        snprintf(name, sizeof name, "blk.%" PRId32 ".samples_mask", l);
        if ((rc = si_gguf_writer_add_tensor(w, name, SI_TYPE_I8, 2, nm,
                                            s->mask + (size_t)l * (size_t)s->cap *
                                                          (size_t)s->mask_bytes)) != SI_OK)
            goto fail;
    }
    rc = si_gguf_writer_write(w, path, err, err_size);
    si_gguf_writer_free(w);
    return rc;
fail:
    si_gguf_writer_free(w);
    return si__errf(err, err_size, rc, "%s: %s", path, si_status_str(rc));
}

int si_train_samples_read(struct si_train_samples **out, enum si_active_rule *rule,
                          float **thresholds, double *target_sparsity, const char *path,
                          const struct si_model *m, char *err, size_t err_size)
{
    *out = NULL;
    *rule = SI_ACTIVE_GATE;
    *thresholds = NULL;
    *target_sparsity = 0;
    struct si_gguf *g = NULL;
    struct si_train_samples *s = NULL;
    float *thr = NULL;
    int rc = si_gguf_open(&g, path, err, err_size);
    if (rc != SI_OK)
        return rc;
    uint64_t n = 0;
    uint32_t nl = 0, ne = 0, nf = 0;
    if (si_gguf_get_u64(g, SK_N, &n) != SI_OK || si_gguf_get_u32(g, SK_LAYER, &nl) != SI_OK ||
        si_gguf_get_u32(g, SK_EMBD, &ne) != SI_OK || si_gguf_get_u32(g, SK_FF, &nf) != SI_OK ||
        n < 1 || n > INT32_MAX || nl < 1 || nl > INT32_MAX || ne < 1 || ne > INT32_MAX ||
        nf < 1 || nf > INT32_MAX) {
        rc = si__errf(err, err_size, SI_E_FORMAT,
                      "%s: not a samples file (starinfer.samples.* keys missing or out of range)",
                      path);
        goto out;
    }
    if (m != NULL && ((int32_t)nl != m->hp.n_layer || (int32_t)ne != m->hp.n_embd ||
                      (int32_t)nf != m->hp.n_ff)) {
        rc = si__errf(err, err_size, SI_E_INVALID,
                      "%s: samples of %" PRIu32 " layers x %" PRIu32 " x %" PRIu32
                      ", but the model has %" PRId32 " x %" PRId32 " x %" PRId32,
                      path, nl, ne, nf, m->hp.n_layer, m->hp.n_embd, m->hp.n_ff);
        goto out;
    }
    if ((rc = si_train_samples_init(&s, (int32_t)nl, (int32_t)ne, (int32_t)nf, (int64_t)n, err,
                                    err_size)) != SI_OK)
        goto out;
    for (int32_t l = 0; l < s->n_layer; l++) {
        for (int which = 0; which < 2; which++) {
            char name[64];
            snprintf(name, sizeof name, "blk.%" PRId32 ".%s", l,
                     which ? "samples_mask" : "samples_x");
            const int64_t ti = si_gguf_find_tensor(g, name);
            const int64_t ne0 = which ? s->mask_bytes : s->n_embd;
            const uint32_t type = which ? SI_TYPE_I8 : SI_TYPE_F16;
            const struct si_gguf_tensor *t = ti >= 0 ? &g->tensors[ti] : NULL;
            if (t == NULL || t->type != type || t->n_dims != 2 || t->ne[0] != ne0 ||
                t->ne[1] != (int64_t)n) {
                rc = si__errf(err, err_size, SI_E_FORMAT,
                              "%s: tensor %s missing or not %s {%" PRId64 ", %" PRIu64 "}", path,
                              name, si_type_name(type), ne0, n);
                goto out;
            }
            void *dst = which ? (void *)(s->mask + (size_t)l * (size_t)n * (size_t)ne0)
                              : (void *)(s->x + (size_t)l * (size_t)n * (size_t)ne0);
            memcpy(dst, t->data, t->nbytes);
        }
    }
    s->n = (int64_t)n;
    struct si_gguf_str input = {0};
    const int ri = si_gguf_get_str(g, SK_INPUT, &input);
    s->input = SI_PRED_FFN;
    if (ri != SI_E_NOT_FOUND &&
        (ri != SI_OK || si_pred_input_parse(input.data, input.len, &s->input) != SI_OK)) {
        rc = si__errf(err, err_size, SI_E_FORMAT, "%s: %s not ffn, layer or residual", path,
                      SK_INPUT);
        goto out;
    }
    const int64_t k = si_gguf_find_key(g, SK_THR);
    if (k >= 0) {
        const struct si_gguf_kv *kv = &g->kv[k];
        if (kv->type != SI_GGUF_ARRAY || kv->arr_type != SI_GGUF_FLOAT32 || kv->arr_n != nl) {
            rc = si__errf(err, err_size, SI_E_FORMAT, "%s: %s must be %" PRIu32 " FLOAT32",
                          path, SK_THR, nl);
            goto out;
        }
        thr = malloc((size_t)nl * sizeof *thr);
        if (thr == NULL) {
            rc = si__errf(err, err_size, SI_E_NOMEM, "out of memory");
            goto out;
        }
        memcpy(thr, kv->arr_data, (size_t)nl * sizeof *thr);
        si_gguf_get_f64(g, SK_TARGET, target_sparsity);
        struct si_gguf_str rs;
        char name[16] = "";
        if (si_gguf_get_str(g, SK_RULE, &rs) == SI_OK && rs.len < sizeof name)
            memcpy(name, rs.data, rs.len);
        if (si_active_rule_parse(name, rule) != SI_OK) {
            rc = si__errf(err, err_size, SI_E_FORMAT, "%s: %s missing or not gate/output", path,
                          SK_RULE);
            goto out;
        }
    }
    *out = s;
    *thresholds = thr;
    s = NULL;
    thr = NULL;
out:
    free(thr);
    si_train_samples_free(s);
    si_gguf_free(g);
    return rc;
}
