/*
 * fuzz-profile.c - fuzz target for the activation profile's reader
 * (si_profile_read, `starinfer profile`'s file; see fuzz.h).
 *
 * Each input is read twice: without a model, and against the tiny model
 * (2 layers x 32 neurons).  An accepted profile must keep the reader's
 * promises (every count in [0, n_tokens], thresholds finite and >= 0, a
 * target sparsity in [0, 1), an input sparsity table that
 * si_profile_input_check takes and whose lookups give finite thresholds);
 * a refused one gives one line.
 */
#include "fuzz.h"

#include "model/model.h"
#include "predict/input_sparsity.h"
#include "predict/profile.h"
#include "starinfer.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    fuzz_tiny_model();
    return 0;
}

static void check(const struct si_profile *p, const struct si_model *m)
{
    if (p->n_layer < 1 || p->n_ff < 1 || p->n_tokens < 0)
        fuzz_fail("shape %d x %d, %lld tokens", p->n_layer, p->n_ff, (long long)p->n_tokens);
    if (m != NULL && (p->n_layer != m->hp.n_layer || p->n_ff != m->hp.n_ff))
        fuzz_fail("a %d x %d profile accepted for a %d x %d model", p->n_layer, p->n_ff,
                  m->hp.n_layer, m->hp.n_ff);
    const size_t n = (size_t)p->n_layer * (size_t)p->n_ff;
    for (size_t i = 0; i < n; i++)
        if (p->counts[i] < 0 || p->counts[i] > p->n_tokens)
            fuzz_fail("count %lld out of [0, %lld]", (long long)p->counts[i],
                      (long long)p->n_tokens);
    if (p->thresholds != NULL) {
        for (int32_t l = 0; l < p->n_layer; l++)
            if (!isfinite(p->thresholds[l]) || p->thresholds[l] < 0)
                fuzz_fail("threshold %g", p->thresholds[l]);
        if (!(p->target_sparsity >= 0 && p->target_sparsity < 1))
            fuzz_fail("target sparsity %g", p->target_sparsity);
    }
    if (p->n_input > 0) {
        const char *why =
            si_profile_input_check(p->n_layer, p->n_input, p->input_grid, p->input_thresholds);
        if (why != NULL)
            fuzz_fail("input table accepted: %s", why);
        float *t = malloc((size_t)p->n_layer * SI_INPUT_KINDS * sizeof *t);
        char err[256];
        if (t != NULL && si_input_thresholds_at(p, 0.5 * p->input_grid[p->n_input - 1], t, err,
                                                sizeof err) == SI_OK)
            for (size_t k = 0; k < (size_t)p->n_layer * SI_INPUT_KINDS; k++)
                if (!(t[k] >= 0 && isfinite(t[k])))
                    fuzz_fail("input threshold %g", t[k]);
        free(t);
    }
    const double f = si_profile_top_fraction(p, 0.8);
    if (!(f >= 0 && f <= 1))
        fuzz_fail("top fraction %g", f);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *path = fuzz_file(data, size);
    struct si_model *m = fuzz_tiny_model();
    for (int with_model = 0; with_model < 2; with_model++) {
        struct si_profile *p = NULL;
        char err[256] = "";
        if (si_profile_read(&p, path, with_model ? m : NULL, err, sizeof err) != SI_OK) {
            fuzz_check_refusal(err);
            continue;
        }
        fuzz_accepted += with_model;
        check(p, with_model ? m : NULL);
        si_profile_free(p);
    }
    return 0;
}

/* Profiles of the tiny model's shape: counts only, with thresholds, and
 * with an input sparsity table too. */
int fuzz_write_seeds(const char *dir)
{
    const struct si_model *m = fuzz_tiny_model();
    char err[256], path[4096];
    for (int th = 0; th < 3; th++) {
        struct si_profile *p = NULL;
        if (si_profile_init(&p, m->hp.n_layer, m->hp.n_ff, err, sizeof err) != SI_OK) {
            fprintf(stderr, "fuzz-profile: %s\n", err);
            return -1;
        }
        p->n_tokens = 1000;
        for (int64_t i = 0; i < (int64_t)m->hp.n_layer * m->hp.n_ff; i++)
            p->counts[i] = 1000 / (1 + i % 37); /* a power law, roughly */
        if (th) {
            p->thresholds = calloc((size_t)p->n_layer, sizeof *p->thresholds);
            if (p->thresholds == NULL)
                return -1;
            for (int32_t l = 0; l < p->n_layer; l++)
                p->thresholds[l] = 0.01f * (float)(l + 1);
            p->target_sparsity = 0.4f;
        }
        if (th == 2) {
            const size_t rows = (size_t)p->n_layer * SI_INPUT_KINDS;
            p->n_input = 3;
            p->input_grid = malloc(3 * sizeof *p->input_grid);
            p->input_thresholds = malloc(rows * 3 * sizeof *p->input_thresholds);
            if (p->input_grid == NULL || p->input_thresholds == NULL)
                return -1;
            for (int k = 0; k < 3; k++)
                p->input_grid[k] = 0.25f * (float)(k + 1);
            for (size_t r = 0; r < rows; r++)
                for (int k = 0; k < 3; k++)
                    p->input_thresholds[r * 3 + (size_t)k] = 0.01f * (float)((r + 1) * (size_t)(k + 1));
        }
        snprintf(path, sizeof path, "%s/tiny%s.prof", dir,
                 th == 2 ? "-input" : th ? "-thresholds" : "");
        int rc = si_profile_write(p, path, err, sizeof err);
        si_profile_free(p);
        if (rc != SI_OK) {
            fprintf(stderr, "fuzz-profile: %s\n", err);
            return -1;
        }
    }
    return 0;
}
