/* profile.c - collecting, writing and reading activation profiles (profile.h). */
#include "predict/profile.h"

#include "internal.h"
#include "model/act.h"
#include "model/gguf.h"
#include "model/gguf_write.h"
#include "model/types.h"
#include "predict/hist.h"
#include "starinfer.h"

#include <float.h>
#include <inttypes.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define KEY_N_TOKENS "starinfer.profile.n_tokens"
#define KEY_N_LAYER "starinfer.profile.n_layer"
#define KEY_N_FF "starinfer.profile.n_ff"
#define KEY_THRESHOLD "starinfer.profile.gate_threshold"
#define KEY_TARGET "starinfer.profile.target_sparsity"
#define KEY_INPUT_GRID "starinfer.profile.input_sparsity"
#define KEY_INPUT_THR "starinfer.profile.input_thresholds"

/* Histogram bins of |a| (predict/hist.h). */
#define HIST_BINS SI_HIST_BINS

int si_profile_init(struct si_profile **out, int32_t n_layer, int32_t n_ff, char *err,
                    size_t err_size)
{
    *out = NULL;
    if (n_layer < 1 || n_ff < 1)
        return si__errf(err, err_size, SI_E_INVALID,
                        "profile of %" PRId32 " layers x %" PRId32 " neurons: both must be >= 1",
                        n_layer, n_ff);
    struct si_profile *p = calloc(1, sizeof *p);
    if (p != NULL)
        p->counts = calloc((size_t)n_layer * (size_t)n_ff, sizeof *p->counts);
    if (p == NULL || p->counts == NULL) {
        free(p);
        return si__errf(err, err_size, SI_E_NOMEM,
                        "out of memory for a profile of %" PRId32 " x %" PRId32, n_layer, n_ff);
    }
    p->n_layer = n_layer;
    p->n_ff = n_ff;
    *out = p;
    return SI_OK;
}

void si_profile_free(struct si_profile *p)
{
    if (p == NULL)
        return;
    free(p->counts);
    free(p->thresholds);
    free(p->input_grid);
    free(p->input_thresholds);
    free(p);
}

bool si_profile_relu_family(const struct si_model *m)
{
    return m->hp.act == SI_ACT_RELU;
}

/* The token every window starts with, or -1: BOS when the model has one and
 * its tokenizer metadata asks for it (defaults as in model/tokenizer.c). */
int32_t si_profile_window_bos(const struct si_model *m)
{
    const struct si_gguf *g = m->gguf;
    uint32_t bos;
    if (g == NULL || si_gguf_get_u32(g, "tokenizer.ggml.bos_token_id", &bos) != SI_OK ||
        bos >= (uint32_t)m->hp.n_vocab)
        return -1;
    bool add;
    if (si_gguf_get_bool(g, "tokenizer.ggml.add_bos_token", &add) != SI_OK) {
        struct si_gguf_str model;
        add = si_gguf_get_str(g, "tokenizer.ggml.model", &model) == SI_OK &&
              si_gguf_str_eq(model, "llama");
    }
    return add ? (int32_t)bos : -1;
}

/* The checks of collect and calib_collect: every token in the vocabulary. */
static int check_tokens(const struct si_model *m, const int32_t *tokens, int64_t n, char *err,
                        size_t err_size)
{
    if (n < 0 || (n > 0 && tokens == NULL))
        return si__errf(err, err_size, SI_E_INVALID, "profile: invalid arguments");
    for (int64_t i = 0; i < n; i++)
        if (tokens[i] < 0 || tokens[i] >= m->hp.n_vocab)
            return si__errf(err, err_size, SI_E_INVALID,
                            "token %" PRId32 " at position %" PRId64
                            " is outside the vocabulary of %" PRId32,
                            tokens[i], i, m->hp.n_vocab);
    return SI_OK;
}

/* The reference's runner: tokens[0..n) in windows of rp.n_ctx (reset, BOS
 * first), the hook on every layer's FFN. */
static int ref_run(const struct si_ffn_runner *r, const struct si_model *m, const int32_t *tokens,
                   int64_t n, si_ffn_hook hook, void *user, char *err, size_t err_size)
{
    struct si_ref *s = NULL;
    int rc = si_ref_init(&s, m, r->rp, err, err_size);
    if (rc != SI_OK)
        return rc;
    s->ffn_hook = hook;
    s->ffn_hook_user = user;
    s->input_hook = r->input_hook;
    s->input_hook_user = r->input_user;
    const int64_t window = s->p.n_ctx;
    const int32_t bos = si_profile_window_bos(m);
    for (int64_t i = 0; i < n && rc == SI_OK; i++) {
        const int64_t j = i % window;
        if (j == 0)
            si_ref_reset(s);
        const int32_t t = j == 0 && bos >= 0 ? bos : tokens[i];
        rc = si_ref_eval(s, t);
        if (rc != SI_OK)
            rc = si__errf(err, err_size, rc, "evaluation of token %" PRId32 " at position %" PRId64
                          " failed: %s", t, i, si_status_str(rc));
    }
    si_ref_free(s);
    return rc;
}

struct si_ffn_runner si_ffn_runner_ref(struct si_ref_params rp)
{
    return (struct si_ffn_runner){.run = ref_run, .rp = rp};
}

/* The activation a of neuron i in the FFN hook (see si_ffn_view). */
static inline float hook_act(const struct si_ffn_view *v, int64_t i)
{
    return v->g == NULL ? v->h[i] : si_act_apply(v->m->hp.act, v->g[i]);
}

struct count_hook {
    const float *thresholds;
    int64_t *counts;
};

/* Count the neurons with |a| above their layer's threshold, or (no
 * thresholds: ReLU models) with an activation other than 0. */
static void count_hook(void *user, const struct si_ffn_view *v, int l)
{
    const struct count_hook *h = user;
    const int64_t ff = v->m->hp.n_ff;
    int64_t *c = h->counts + (size_t)l * (size_t)ff;
    if (h->thresholds == NULL) {
        for (int64_t i = 0; i < ff; i++)
            c[i] += v->h[i] != 0.0f;
        return;
    }
    const float t = h->thresholds[l];
    for (int64_t i = 0; i < ff; i++)
        c[i] += fabsf(hook_act(v, i)) > t;
}

int si_profile_collect(struct si_profile *p, const struct si_model *m,
                       const struct si_ffn_runner *run, const int32_t *tokens, int64_t n,
                       char *err, size_t err_size)
{
    if (p == NULL || m == NULL || run == NULL)
        return si__errf(err, err_size, SI_E_INVALID, "profile collect: invalid arguments");
    if (p->n_layer != m->hp.n_layer || p->n_ff != m->hp.n_ff)
        return si__errf(err, err_size, SI_E_INVALID,
                        "profile of %" PRId32 " layers x %" PRId32
                        " neurons, but the model has %" PRId32 " x %" PRId32,
                        p->n_layer, p->n_ff, m->hp.n_layer, m->hp.n_ff);
    if (n > INT64_MAX - p->n_tokens)
        return si__errf(err, err_size, SI_E_INVALID, "profile collect: token count overflows");
    int rc = check_tokens(m, tokens, n, err, err_size);
    if (rc != SI_OK)
        return rc;
    const bool relu = si_profile_relu_family(m);
    for (int32_t l = 0; relu && p->thresholds != NULL && l < p->n_layer; l++)
        if (p->thresholds[l] != 0.0f)
            return si__errf(err, err_size, SI_E_INVALID,
                            "threshold %g of layer %" PRId32 " on a ReLU model (must be 0)",
                            (double)p->thresholds[l], l);
    if (n == 0)
        return SI_OK;

    const size_t total = (size_t)p->n_layer * (size_t)p->n_ff;
    /* Counted apart and added at the end, so that a failure leaves p as it was. */
    int64_t *counts = calloc(total, sizeof(int64_t));
    if (counts == NULL)
        return si__errf(err, err_size, SI_E_NOMEM, "out of memory for the profile counters");
    struct count_hook hook = {relu ? NULL : p->thresholds, counts};
    rc = run->run(run, m, tokens, n, count_hook, &hook, err, err_size);
    if (rc == SI_OK) {
        for (size_t k = 0; k < total; k++)
            p->counts[k] += counts[k];
        p->n_tokens += n;
    }
    free(counts);
    return rc;
}

struct si_profile_calib {
    int32_t n_layer, n_ff;
    bool relu;
    int64_t n_tokens;
    uint64_t *hist; /* (n_layer, HIST_BINS); NULL for ReLU-family models */
};

int si_profile_calib_init(struct si_profile_calib **out, const struct si_model *m, char *err,
                          size_t err_size)
{
    *out = NULL;
    struct si_profile_calib *c = calloc(1, sizeof *c);
    if (c == NULL)
        return si__errf(err, err_size, SI_E_NOMEM, "out of memory");
    c->n_layer = m->hp.n_layer;
    c->n_ff = m->hp.n_ff;
    c->relu = si_profile_relu_family(m);
    if (!c->relu) {
        c->hist = calloc((size_t)c->n_layer * HIST_BINS, sizeof *c->hist);
        if (c->hist == NULL) {
            free(c);
            return si__errf(err, err_size, SI_E_NOMEM,
                            "out of memory for %" PRId32 " activation histograms", m->hp.n_layer);
        }
    }
    *out = c;
    return SI_OK;
}

void si_profile_calib_free(struct si_profile_calib *c)
{
    if (c == NULL)
        return;
    free(c->hist);
    free(c);
}

int64_t si_profile_calib_tokens(const struct si_profile_calib *c)
{
    return c->n_tokens;
}

/* Add every |a| of layer l to its histogram. */
static void hist_hook(void *user, const struct si_ffn_view *v, int l)
{
    const struct si_profile_calib *c = user;
    uint64_t *h = c->hist + (size_t)l * HIST_BINS;
    for (int64_t i = 0; i < c->n_ff; i++) {
        h[si_hist_bin(hook_act(v, i))]++;
    }
}

int si_profile_calib_collect(struct si_profile_calib *c, const struct si_model *m,
                             const struct si_ffn_runner *run, const int32_t *tokens, int64_t n,
                             char *err, size_t err_size)
{
    if (c == NULL || m == NULL || run == NULL)
        return si__errf(err, err_size, SI_E_INVALID, "profile calibration: invalid arguments");
    if (c->n_layer != m->hp.n_layer || c->n_ff != m->hp.n_ff)
        return si__errf(err, err_size, SI_E_INVALID,
                        "calibration of %" PRId32 " layers x %" PRId32
                        " neurons, but the model has %" PRId32 " x %" PRId32,
                        c->n_layer, c->n_ff, m->hp.n_layer, m->hp.n_ff);
    int rc = check_tokens(m, tokens, n, err, err_size);
    if (rc != SI_OK || n == 0)
        return rc;
    if (c->relu) { /* thresholds 0: nothing to measure */
        c->n_tokens += n;
        return SI_OK;
    }
    rc = run->run(run, m, tokens, n, hist_hook, c, err, err_size);
    if (rc == SI_OK)
        c->n_tokens += n;
    return rc;
}

int si_profile_set_thresholds(struct si_profile *p, const struct si_profile_calib *c, double S,
                              double *below_share, char *err, size_t err_size)
{
    if (p == NULL || c == NULL || !(S >= 0 && S < 1))
        return si__errf(err, err_size, SI_E_INVALID,
                        "target sparsity %g is not in [0, 1)", S);
    if (p->n_layer != c->n_layer || p->n_ff != c->n_ff)
        return si__errf(err, err_size, SI_E_INVALID,
                        "profile of %" PRId32 " layers x %" PRId32
                        " neurons, but the calibration has %" PRId32 " x %" PRId32,
                        p->n_layer, p->n_ff, c->n_layer, c->n_ff);
    if (p->n_tokens != 0)
        return si__errf(err, err_size, SI_E_INVALID,
                        "thresholds for a profile that already counted %" PRId64 " tokens",
                        p->n_tokens);
    float *t = calloc((size_t)p->n_layer, sizeof *t);
    if (t == NULL)
        return si__errf(err, err_size, SI_E_NOMEM, "out of memory");
    for (int32_t l = 0; l < p->n_layer; l++) {
        double below = 0;
        if (!c->relu)
            t[l] = si_hist_pick(c->hist + (size_t)l * HIST_BINS, S, &below);
        if (below_share != NULL)
            below_share[l] = below;
    }
    free(p->thresholds);
    p->thresholds = t;
    p->target_sparsity = (float)S;
    return SI_OK;
}

int si_profile_write(const struct si_profile *p, const char *path, char *err, size_t err_size)
{
    if (p == NULL || p->counts == NULL || p->n_layer < 1 || p->n_ff < 1 || p->n_tokens < 0)
        return si__errf(err, err_size, SI_E_INVALID, "%s: invalid profile", path);
    const size_t total = (size_t)p->n_layer * (size_t)p->n_ff;
    for (size_t k = 0; k < total; k++)
        if (p->counts[k] < 0 || p->counts[k] > p->n_tokens || p->counts[k] > INT32_MAX)
            return si__errf(err, err_size, SI_E_INVALID,
                            "%s: count %" PRId64 " of layer %zu neuron %zu is not in [0, %" PRId64
                            "] or does not fit I32",
                            path, p->counts[k], k / (size_t)p->n_ff, k % (size_t)p->n_ff,
                            p->n_tokens);
    int32_t *data = malloc(total * sizeof *data);
    struct si_gguf_writer *w = si_gguf_writer_init(false);
    int rc = SI_OK;
    if (data == NULL || w == NULL) {
        rc = si__errf(err, err_size, SI_E_NOMEM, "%s: out of memory", path);
        goto out;
    }
    for (size_t k = 0; k < total; k++)
        data[k] = (int32_t)p->counts[k];
    if ((rc = si_gguf_writer_set_u64(w, KEY_N_TOKENS, (uint64_t)p->n_tokens)) != SI_OK ||
        (rc = si_gguf_writer_set_u32(w, KEY_N_LAYER, (uint32_t)p->n_layer)) != SI_OK ||
        (rc = si_gguf_writer_set_u32(w, KEY_N_FF, (uint32_t)p->n_ff)) != SI_OK) {
        rc = si__errf(err, err_size, rc, "%s: %s", path, si_status_str(rc));
        goto out;
    }
    if (p->thresholds != NULL) {
        for (int32_t l = 0; l < p->n_layer; l++)
            if (!(isfinite(p->thresholds[l]) && p->thresholds[l] >= 0)) {
                rc = si__errf(err, err_size, SI_E_INVALID,
                              "%s: threshold %g of layer %" PRId32 " is not finite and >= 0",
                              path, (double)p->thresholds[l], l);
                goto out;
            }
        if (!(p->target_sparsity >= 0 && p->target_sparsity < 1)) {
            rc = si__errf(err, err_size, SI_E_INVALID, "%s: target sparsity %g is not in [0, 1)",
                          path, (double)p->target_sparsity);
            goto out;
        }
        if ((rc = si_gguf_writer_set_arr(w, KEY_THRESHOLD, SI_GGUF_FLOAT32, p->thresholds,
                                         (uint64_t)p->n_layer)) != SI_OK ||
            (rc = si_gguf_writer_set_f32(w, KEY_TARGET, p->target_sparsity)) != SI_OK) {
            rc = si__errf(err, err_size, rc, "%s: %s", path, si_status_str(rc));
            goto out;
        }
    }
    if (p->n_input > 0) {
        const char *why = si_profile_input_check(p->n_layer, p->n_input, p->input_grid,
                                                 p->input_thresholds);
        if (why != NULL) {
            rc = si__errf(err, err_size, SI_E_INVALID, "%s: input sparsity: %s", path, why);
            goto out;
        }
        if ((rc = si_gguf_writer_set_arr(w, KEY_INPUT_GRID, SI_GGUF_FLOAT32, p->input_grid,
                                         (uint64_t)p->n_input)) != SI_OK ||
            (rc = si_gguf_writer_set_arr(w, KEY_INPUT_THR, SI_GGUF_FLOAT32, p->input_thresholds,
                                         (uint64_t)p->n_layer * SI_INPUT_KINDS *
                                             (uint64_t)p->n_input)) != SI_OK) {
            rc = si__errf(err, err_size, rc, "%s: %s", path, si_status_str(rc));
            goto out;
        }
    }
    const int64_t ne[1] = {p->n_ff};
    for (int32_t l = 0; l < p->n_layer; l++) {
        char name[64];
        snprintf(name, sizeof name, "blk.%" PRId32 ".ffn_act_count", l);
        rc = si_gguf_writer_add_tensor(w, name, SI_TYPE_I32, 1, ne,
                                       data + (size_t)l * (size_t)p->n_ff);
        if (rc != SI_OK) {
            rc = si__errf(err, err_size, rc, "%s: tensor %s: %s", path, name, si_status_str(rc));
            goto out;
        }
    }
    rc = si_gguf_writer_write(w, path, err, err_size);
out:
    si_gguf_writer_free(w);
    free(data);
    return rc;
}

/* A u32 key as a size in [1, INT32_MAX]. */
static int read_dim(const struct si_gguf *g, const char *path, const char *key, int32_t *out,
                    char *err, size_t err_size)
{
    uint32_t v;
    int rc = si_gguf_get_u32(g, key, &v);
    if (rc == SI_E_NOT_FOUND)
        return si__errf(err, err_size, SI_E_FORMAT, "%s: missing key %s (not a profile?)", path,
                        key);
    if (rc != SI_OK || v < 1 || v > INT32_MAX)
        return si__errf(err, err_size, SI_E_FORMAT,
                        "%s: %s must be an integer in [1, %d]", path, key, INT32_MAX);
    *out = (int32_t)v;
    return SI_OK;
}

/* The optional thresholds and target sparsity (both or neither). */
static int read_thresholds(const struct si_gguf *g, const char *path, struct si_profile *p,
                           char *err, size_t err_size)
{
    const int64_t ki = si_gguf_find_key(g, KEY_THRESHOLD), ks = si_gguf_find_key(g, KEY_TARGET);
    if (ki < 0 && ks < 0)
        return SI_OK;
    if (ki < 0 || ks < 0)
        return si__errf(err, err_size, SI_E_FORMAT, "%s: %s without %s", path,
                        ki < 0 ? KEY_TARGET : KEY_THRESHOLD, ki < 0 ? KEY_THRESHOLD : KEY_TARGET);
    const struct si_gguf_kv *kv = &g->kv[ki];
    if (kv->type != SI_GGUF_ARRAY || kv->arr_type != SI_GGUF_FLOAT32 ||
        kv->arr_n != (uint64_t)p->n_layer)
        return si__errf(err, err_size, SI_E_FORMAT,
                        "%s: %s must be an array of %" PRId32 " FLOAT32 (one per layer)", path,
                        KEY_THRESHOLD, p->n_layer);
    const struct si_gguf_kv *sv = &g->kv[ks];
    if ((sv->type != SI_GGUF_FLOAT32 && sv->type != SI_GGUF_FLOAT64) ||
        !(sv->v.f64 >= 0 && sv->v.f64 < 1))
        return si__errf(err, err_size, SI_E_FORMAT, "%s: %s must be a number in [0, 1)", path,
                        KEY_TARGET);
    p->thresholds = malloc((size_t)p->n_layer * sizeof *p->thresholds);
    if (p->thresholds == NULL)
        return si__errf(err, err_size, SI_E_NOMEM, "%s: out of memory", path);
    for (int32_t l = 0; l < p->n_layer; l++) {
        float t;
        memcpy(&t, kv->arr_data + 4 * (size_t)l, sizeof t);
        if (!(isfinite(t) && t >= 0))
            return si__errf(err, err_size, SI_E_FORMAT,
                            "%s: %s: threshold %g of layer %" PRId32 " is not finite and >= 0",
                            path, KEY_THRESHOLD, (double)t, l);
        p->thresholds[l] = t;
    }
    p->target_sparsity = (float)sv->v.f64;
    return SI_OK;
}

const char *si_profile_input_check(int32_t n_layer, int32_t n_input, const float *grid,
                                   const float *thr)
{
    if (n_input < 1 || grid == NULL || thr == NULL)
        return "no grid";
    for (int32_t k = 0; k < n_input; k++)
        if (!(grid[k] > 0 && grid[k] < 1) || (k > 0 && !(grid[k] > grid[k - 1])))
            return "the target sparsities are not increasing in (0, 1)";
    for (size_t r = 0; r < (size_t)n_layer * SI_INPUT_KINDS; r++)
        for (int32_t k = 0; k < n_input; k++) {
            const float t = thr[r * (size_t)n_input + (size_t)k];
            if (!(isfinite(t) && t >= 0))
                return "a threshold is not finite and >= 0";
            if (k > 0 && t < thr[r * (size_t)n_input + (size_t)k - 1])
                return "a layer's thresholds decrease as the sparsity grows";
        }
    return NULL;
}

/* The optional input sparsity grid and thresholds (both or neither). */
static int read_input(const struct si_gguf *g, const char *path, struct si_profile *p, char *err,
                      size_t err_size)
{
    const int64_t kg = si_gguf_find_key(g, KEY_INPUT_GRID), kt = si_gguf_find_key(g, KEY_INPUT_THR);
    if (kg < 0 && kt < 0)
        return SI_OK;
    if (kg < 0 || kt < 0)
        return si__errf(err, err_size, SI_E_FORMAT, "%s: %s without %s", path,
                        kg < 0 ? KEY_INPUT_THR : KEY_INPUT_GRID, kg < 0 ? KEY_INPUT_GRID : KEY_INPUT_THR);
    const struct si_gguf_kv *gv = &g->kv[kg], *tv = &g->kv[kt];
    if (gv->type != SI_GGUF_ARRAY || gv->arr_type != SI_GGUF_FLOAT32 || gv->arr_n < 1 ||
        gv->arr_n > 1024)
        return si__errf(err, err_size, SI_E_FORMAT, "%s: %s must be an array of 1 to 1024 FLOAT32",
                        path, KEY_INPUT_GRID);
    const uint64_t k = gv->arr_n, want = (uint64_t)p->n_layer * SI_INPUT_KINDS * k;
    if (tv->type != SI_GGUF_ARRAY || tv->arr_type != SI_GGUF_FLOAT32 || tv->arr_n != want)
        return si__errf(err, err_size, SI_E_FORMAT,
                        "%s: %s must be an array of %" PRIu64 " FLOAT32 (layers x %d inputs x %" PRIu64
                        " sparsities)",
                        path, KEY_INPUT_THR, want, SI_INPUT_KINDS, k);
    p->input_grid = malloc(k * sizeof *p->input_grid);
    p->input_thresholds = malloc(want * sizeof *p->input_thresholds);
    if (p->input_grid == NULL || p->input_thresholds == NULL)
        return si__errf(err, err_size, SI_E_NOMEM, "%s: out of memory", path);
    memcpy(p->input_grid, gv->arr_data, k * sizeof *p->input_grid);
    memcpy(p->input_thresholds, tv->arr_data, want * sizeof *p->input_thresholds);
    p->n_input = (int32_t)k;
    const char *why =
        si_profile_input_check(p->n_layer, p->n_input, p->input_grid, p->input_thresholds);
    if (why != NULL)
        return si__errf(err, err_size, SI_E_FORMAT, "%s: input sparsity: %s", path, why);
    return SI_OK;
}

int si_profile_read(struct si_profile **out, const char *path, const struct si_model *m,
                    char *err, size_t err_size)
{
    *out = NULL;
    struct si_gguf *g = NULL;
    struct si_profile *p = NULL;
    int rc = si_gguf_open(&g, path, err, err_size);
    if (rc != SI_OK)
        return rc;
    int32_t n_layer = 0, n_ff = 0;
    uint64_t n_tokens = 0;
    if ((rc = read_dim(g, path, KEY_N_LAYER, &n_layer, err, err_size)) != SI_OK ||
        (rc = read_dim(g, path, KEY_N_FF, &n_ff, err, err_size)) != SI_OK)
        goto out;
    rc = si_gguf_get_u64(g, KEY_N_TOKENS, &n_tokens);
    if (rc == SI_E_NOT_FOUND) {
        rc = si__errf(err, err_size, SI_E_FORMAT, "%s: missing key %s (not a profile?)", path,
                      KEY_N_TOKENS);
        goto out;
    }
    if (rc != SI_OK || n_tokens > INT64_MAX) {
        rc = si__errf(err, err_size, SI_E_FORMAT, "%s: %s must be an integer in [0, 2^63)", path,
                      KEY_N_TOKENS);
        goto out;
    }
    if (m != NULL && (n_layer != m->hp.n_layer || n_ff != m->hp.n_ff)) {
        rc = si__errf(err, err_size, SI_E_INVALID,
                      "%s: profile of %" PRId32 " layers x %" PRId32
                      " neurons, but the model has %" PRId32 " x %" PRId32,
                      path, n_layer, n_ff, m->hp.n_layer, m->hp.n_ff);
        goto out;
    }
    /* Pass 0 checks every layer's tensor, pass 1 reads the counts: nothing
     * is allocated for a shape the file does not hold. */
    for (int pass = 0; pass < 2; pass++) {
        if (pass == 1) {
            /* Every count is 4 bytes of the file's tensor data (tensors may
             * share their bytes): found by tools/fuzz profile, a 600-byte file
             * that asked for 167 GB of counts. */
            if ((uint64_t)n_layer * (uint64_t)n_ff * 4 > g->data_size) {
                rc = si__errf(err, err_size, SI_E_FORMAT,
                              "%s: %" PRId32 " layers x %" PRId32
                              " neurons of counts do not fit in the file's %zu"
                              " bytes of tensor data",
                              path, n_layer, n_ff, g->data_size);
                goto out;
            }
            if ((rc = si_profile_init(&p, n_layer, n_ff, err, err_size)) != SI_OK)
                goto out;
            p->n_tokens = (int64_t)n_tokens;
        }
        for (int32_t l = 0; l < n_layer; l++) {
            char name[64];
            snprintf(name, sizeof name, "blk.%" PRId32 ".ffn_act_count", l);
            int64_t ti = si_gguf_find_tensor(g, name);
            if (ti < 0) {
                rc = si__errf(err, err_size, SI_E_FORMAT, "%s: missing tensor %s", path, name);
                goto out;
            }
            const struct si_gguf_tensor *t = &g->tensors[ti];
            if (t->n_dims != 1 || t->ne[0] != n_ff) {
                rc = si__errf(err, err_size, SI_E_FORMAT,
                              "%s: tensor %s has %" PRIu32 " dimensions [%" PRId64 ", %" PRId64
                              ", ...], expected [%" PRId32 "]",
                              path, name, t->n_dims, t->ne[0], t->ne[1], n_ff);
                goto out;
            }
            if (t->type != SI_TYPE_I32 && t->type != SI_TYPE_F32) {
                rc =
                    si__errf(err, err_size, SI_E_FORMAT, "%s: tensor %s is %s, expected I32 or F32",
                             path, name, si_type_name(t->type));
                goto out;
            }
            if (pass == 0)
                continue;
            int64_t *c = p->counts + (size_t)l * (size_t)n_ff;
            const unsigned char *d = t->data;
            for (int32_t i = 0; i < n_ff; i++) {
                double v;
                if (t->type == SI_TYPE_I32) {
                    int32_t x;
                    memcpy(&x, d + 4 * (size_t)i, 4);
                    v = x;
                } else {
                    float x;
                    memcpy(&x, d + 4 * (size_t)i, 4);
                    v = x;
                }
                if (!(v >= 0 && v <= (double)p->n_tokens && v == floor(v))) {
                    rc = si__errf(err, err_size, SI_E_FORMAT,
                                  "%s: tensor %s: count %g of neuron %" PRId32
                                  " is not a whole number in [0, n_tokens = %" PRId64 "]",
                                  path, name, v, i, p->n_tokens);
                    goto out;
                }
                c[i] = (int64_t)v;
            }
        }
    }
    if ((rc = read_thresholds(g, path, p, err, err_size)) != SI_OK ||
        (rc = read_input(g, path, p, err, err_size)) != SI_OK)
        goto out;
    *out = p;
    p = NULL;
out:
    si_profile_free(p);
    si_gguf_free(g);
    return rc;
}

static int cmp_desc(const void *a, const void *b)
{
    const int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x < y) - (x > y);
}

double si_profile_top_fraction(const struct si_profile *p, double share)
{
    const size_t total = (size_t)p->n_layer * (size_t)p->n_ff;
    int64_t *c = malloc(total * sizeof *c);
    if (c == NULL)
        return -1;
    memcpy(c, p->counts, total * sizeof *c);
    qsort(c, total, sizeof *c, cmp_desc);
    double sum = 0;
    for (size_t k = 0; k < total; k++)
        sum += (double)c[k];
    size_t k = 0;
    if (sum > 0) {
        const double want = share * sum;
        double acc = 0;
        while (k < total && acc < want)
            acc += (double)c[k++];
    }
    free(c);
    return (double)k / (double)total;
}
