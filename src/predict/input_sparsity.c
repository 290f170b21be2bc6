/* input_sparsity.c - TEAL's thresholds: calibration and lookup (input_sparsity.h). */
#include "predict/input_sparsity.h"

#include "internal.h"
#include "predict/hist.h"
#include "starinfer.h"

#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

struct si_input_calib {
    int32_t n_layer;
    int64_t n_tokens;
    uint64_t *hist; /* (n_layer, SI_INPUT_KINDS, SI_HIST_BINS) */
};

int si_input_calib_init(struct si_input_calib **out, const struct si_model *m, char *err,
                        size_t err_size)
{
    *out = NULL;
    struct si_input_calib *c = calloc(1, sizeof *c);
    if (c != NULL) {
        c->n_layer = m->hp.n_layer;
        c->hist = calloc((size_t)c->n_layer * SI_INPUT_KINDS * SI_HIST_BINS, sizeof *c->hist);
    }
    if (c == NULL || c->hist == NULL) {
        free(c);
        return si__errf(err, err_size, SI_E_NOMEM,
                        "out of memory for %" PRId32 " x %d input histograms (%zu MiB)",
                        m->hp.n_layer, SI_INPUT_KINDS,
                        (size_t)m->hp.n_layer * SI_INPUT_KINDS * SI_HIST_BINS * 8 >> 20);
    }
    *out = c;
    return SI_OK;
}

void si_input_calib_free(struct si_input_calib *c)
{
    if (c == NULL)
        return;
    free(c->hist);
    free(c);
}

static void input_hook(void *user, int l, enum si_input_kind kind, const float *x, int64_t n)
{
    const struct si_input_calib *c = user;
    uint64_t *h = c->hist + ((size_t)l * SI_INPUT_KINDS + kind) * SI_HIST_BINS;
    for (int64_t i = 0; i < n; i++)
        h[si_hist_bin(x[i])]++;
}

int si_input_calib_collect(struct si_input_calib *c, const struct si_model *m,
                           struct si_ref_params rp, const int32_t *tokens, int64_t n, char *err,
                           size_t err_size)
{
    if (c == NULL || m == NULL || (tokens == NULL && n > 0) || n < 0)
        return si__errf(err, err_size, SI_E_INVALID, "input calibration: invalid arguments");
    if (c->n_layer != m->hp.n_layer)
        return si__errf(err, err_size, SI_E_INVALID,
                        "input calibration of %" PRId32 " layers, but the model has %" PRId32,
                        c->n_layer, m->hp.n_layer);
    for (int64_t i = 0; i < n; i++)
        if (tokens[i] < 0 || tokens[i] >= m->hp.n_vocab)
            return si__errf(err, err_size, SI_E_INVALID,
                            "token %" PRId32 " at %" PRId64 " is outside the vocabulary (%" PRId32
                            ")",
                            tokens[i], i, m->hp.n_vocab);
    if (n == 0)
        return SI_OK;
    rp.input_thresholds = NULL; /* the dense inputs */
    struct si_ffn_runner r = si_ffn_runner_ref(rp);
    r.input_hook = input_hook;
    r.input_user = c;
    const int rc = r.run(&r, m, tokens, n, NULL, NULL, err, err_size);
    if (rc == SI_OK)
        c->n_tokens += n;
    return rc;
}

int si_input_calib_apply(const struct si_input_calib *c, struct si_profile *p, double *below,
                         char *err, size_t err_size)
{
    if (c == NULL || p == NULL || c->n_layer != p->n_layer)
        return si__errf(err, err_size, SI_E_INVALID,
                        "input calibration: the profile is not the calibration's shape");
    if (c->n_tokens == 0)
        return si__errf(err, err_size, SI_E_INVALID, "input calibration: no tokens seen");
    const size_t rows = (size_t)c->n_layer * SI_INPUT_KINDS;
    float *grid = malloc(SI_INPUT_GRID_N * sizeof *grid);
    float *thr = malloc(rows * SI_INPUT_GRID_N * sizeof *thr);
    if (grid == NULL || thr == NULL) {
        free(grid);
        free(thr);
        return si__errf(err, err_size, SI_E_NOMEM, "out of memory");
    }
    for (int k = 0; k < SI_INPUT_GRID_N; k++)
        grid[k] = 0.05f * (float)(k + 1);
    for (size_t r = 0; r < rows; r++)
        for (int k = 0; k < SI_INPUT_GRID_N; k++) {
            double b = 0;
            thr[r * SI_INPUT_GRID_N + (size_t)k] =
                si_hist_pick(c->hist + r * SI_HIST_BINS, grid[k], &b);
            if (below != NULL)
                below[r * SI_INPUT_GRID_N + (size_t)k] = b;
        }
    free(p->input_grid);
    free(p->input_thresholds);
    p->input_grid = grid;
    p->input_thresholds = thr;
    p->n_input = SI_INPUT_GRID_N;
    return SI_OK;
}

int si_input_thresholds_by_kind(const struct si_profile *p, const double S[SI_INPUT_KINDS],
                                float *out, char *err, size_t err_size)
{
    if (p == NULL || p->n_input < 1)
        return si__errf(err, err_size, SI_E_INVALID,
                        "input sparsity: the profile has no input thresholds (make one with "
                        "starinfer profile --input-sparsity)");
    const double last = p->input_grid[p->n_input - 1];
    for (int c = 0; c < SI_INPUT_KINDS; c++)
        if (!(S[c] >= 0 && S[c] <= last + 1e-6))
            return si__errf(err, err_size, SI_E_INVALID,
                            "input sparsity %g: the profile's thresholds cover 0 to %.2f", S[c],
                            last);
    for (int c = 0; c < SI_INPUT_KINDS; c++) {
        /* the grid points around S: k0 (or S = 0 below the first) and k1 */
        int32_t k1 = 0;
        while (k1 < p->n_input - 1 && p->input_grid[k1] < S[c])
            k1++;
        const double s1 = p->input_grid[k1], s0 = k1 > 0 ? p->input_grid[k1 - 1] : 0.0;
        const double w = S[c] >= s1 ? 1.0 : (S[c] - s0) / (s1 - s0);
        for (int32_t l = 0; l < p->n_layer; l++) {
            const size_t r = (size_t)l * SI_INPUT_KINDS + (size_t)c;
            const float *t = p->input_thresholds + r * (size_t)p->n_input;
            const double t0 = k1 > 0 ? t[k1 - 1] : 0.0, t1 = t[k1];
            out[r] = S[c] == 0 ? 0.0f : (float)(t0 + w * (t1 - t0));
        }
    }
    return SI_OK;
}

int si_input_thresholds_at(const struct si_profile *p, double S, float *out, char *err,
                           size_t err_size)
{
    const double all[SI_INPUT_KINDS] = {S, S, S, S};
    return si_input_thresholds_by_kind(p, all, out, err, err_size);
}

/* Elements of a tensor (0 when absent). */
static double elems(const struct si_tensor *t)
{
    return t->data != NULL ? (double)t->ne[0] * (double)t->ne[1] : 0.0;
}

double si_input_model_sparsity(const struct si_model *m, const double S[SI_INPUT_KINDS])
{
    double w[SI_INPUT_KINDS] = {0}, total = 0, skipped = 0;
    for (int32_t l = 0; l < m->hp.n_layer; l++) {
        const struct si_layer *L = &m->w.layers[l];
        w[SI_INPUT_QKV] += elems(&L->wq) + elems(&L->wk) + elems(&L->wv);
        w[SI_INPUT_O] += elems(&L->wo);
        w[SI_INPUT_FFN] += elems(&L->ffn_gate) + elems(&L->ffn_up);
        w[SI_INPUT_DOWN] += elems(L->ffn_down.data != NULL ? &L->ffn_down : &L->ffn_down_t);
    }
    for (int c = 0; c < SI_INPUT_KINDS; c++) {
        total += w[c];
        skipped += S[c] * w[c];
    }
    return total > 0 ? skipped / total : 0.0;
}

bool si_input_parse(const char *spec, double S[SI_INPUT_KINDS], char *err, size_t err_size)
{
    static const char *names[SI_INPUT_KINDS] = {"qkv", "o", "ffn", "down"};
    if (*spec == '\0') {
        for (int c = 0; c < SI_INPUT_KINDS; c++)
            S[c] = 0.4;
        return true;
    }
    if (*spec++ != '=') {
        si__errf(err, err_size, SI_E_INVALID, "input%s: expected input=S or input=KIND:S,...",
                 spec - 1);
        return false;
    }
    char *end;
    const double v = strtod(spec, &end);
    if (end != spec && *end == '\0') {
        if (!(v >= 0 && v <= 0.9)) {
            si__errf(err, err_size, SI_E_INVALID, "input=%s: S must be in [0, 0.9]", spec);
            return false;
        }
        for (int c = 0; c < SI_INPUT_KINDS; c++)
            S[c] = v;
        return true;
    }
    for (int c = 0; c < SI_INPUT_KINDS; c++)
        S[c] = 0;
    const char *q = spec;
    while (*q != '\0') {
        int c = 0;
        size_t n = 0;
        for (; c < SI_INPUT_KINDS; c++) {
            n = strlen(names[c]);
            if (!strncmp(q, names[c], n) && q[n] == ':')
                break;
        }
        if (c == SI_INPUT_KINDS) {
            si__errf(err, err_size, SI_E_INVALID,
                     "input=%s: expected KIND:S with KIND qkv, o, ffn or down", spec);
            return false;
        }
        const double x = strtod(q + n + 1, &end);
        if (end == q + n + 1 || (*end != ',' && *end != '\0') || (*end == ',' && end[1] == '\0') ||
            !(x >= 0 && x <= 0.9)) {
            si__errf(err, err_size, SI_E_INVALID, "input=%s: %s needs an S in [0, 0.9]", spec,
                     names[c]);
            return false;
        }
        S[c] = x;
        q = *end == ',' ? end + 1 : end;
    }
    return true;
}

void si_input_targets(double S, bool sparse_ffn, double out[SI_INPUT_KINDS])
{
    for (int k = 0; k < SI_INPUT_KINDS; k++)
        out[k] = sparse_ffn && (k == SI_INPUT_FFN || k == SI_INPUT_DOWN) ? 0.0 : S;
}
