/*
 * fuzz-gpuidx.c - fuzz target for the neuron placement's reader
 * (si_placement_read: `starinfer place`'s file and PowerInfer's .gpuidx;
 * see fuzz.h).
 *
 * Each input is read without a model and against the tiny model.  An
 * accepted placement must keep the reader's promises: every flag 0 or 1,
 * n_gpu[l] the count of layer l's flags, the metadata's strings ended.
 */
#include "fuzz.h"

#include "model/model.h"
#include "placement/placement.h"
#include "predict/profile.h"
#include "starinfer.h"

#include <stdio.h>
#include <string.h>

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    fuzz_tiny_model();
    return 0;
}

static void check(const struct si_placement *p, const struct si_model *m)
{
    if (p->n_layer < 1 || p->n_ff < 1)
        fuzz_fail("shape %d x %d", p->n_layer, p->n_ff);
    if (m != NULL && (p->n_layer != m->hp.n_layer || p->n_ff != m->hp.n_ff))
        fuzz_fail("a %d x %d placement accepted for a %d x %d model", p->n_layer, p->n_ff,
                  m->hp.n_layer, m->hp.n_ff);
    int64_t total = 0;
    for (int32_t l = 0; l < p->n_layer; l++) {
        int64_t n = 0;
        for (int32_t i = 0; i < p->n_ff; i++) {
            const uint8_t v = p->gpu[(size_t)l * (size_t)p->n_ff + (size_t)i];
            if (v > 1)
                fuzz_fail("flag %u", v);
            n += v;
        }
        if (n != p->n_gpu[l])
            fuzz_fail("layer %d: n_gpu %lld, %lld flags", l, (long long)p->n_gpu[l],
                      (long long)n);
        total += n;
    }
    if (si_placement_gpu_neurons(p) != total)
        fuzz_fail("gpu_neurons %lld, %lld flags", (long long)si_placement_gpu_neurons(p),
                  (long long)total);
    if (p->has_meta)
        fuzz_sink += strnlen(p->policy, sizeof p->policy) + strnlen(p->sparsity, sizeof p->sparsity) +
                     strnlen(p->outcome, sizeof p->outcome) + strlen(p->hw.gpu_name) +
                     (p->c_min != NULL ? (uint64_t)p->c_min[p->n_layer - 1] : 0);
    if (p->has_meta && (memchr(p->policy, 0, sizeof p->policy) == NULL ||
                        memchr(p->sparsity, 0, sizeof p->sparsity) == NULL ||
                        memchr(p->outcome, 0, sizeof p->outcome) == NULL))
        fuzz_fail("a metadata string without its end");
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *path = fuzz_file(data, size);
    struct si_model *m = fuzz_tiny_model();
    for (int with_model = 0; with_model < 2; with_model++) {
        struct si_placement *p = NULL;
        char err[256] = "";
        if (si_placement_read(&p, path, with_model ? m : NULL, err, sizeof err) != SI_OK) {
            fuzz_check_refusal(err);
            continue;
        }
        fuzz_accepted += with_model;
        check(p, with_model ? m : NULL);
        si_placement_free(p);
    }
    return 0;
}

/* Placements of the tiny model: the hottest neurons under a budget (with
 * starinfer's metadata), and PowerInfer's bare form (flags only). */
int fuzz_write_seeds(const char *dir)
{
    const struct si_model *m = fuzz_tiny_model();
    char err[256], path[4096];
    struct si_profile *prof = NULL;
    if (si_profile_init(&prof, m->hp.n_layer, m->hp.n_ff, err, sizeof err) != SI_OK)
        goto fail;
    prof->n_tokens = 1000;
    for (int64_t i = 0; i < (int64_t)m->hp.n_layer * m->hp.n_ff; i++)
        prof->counts[i] = 1000 / (1 + i % 37);
    struct si_place_params pp = si_place_default_params();
    pp.policy = SI_PLACE_HOTTEST;
    pp.vram_budget = 8192;
    pp.reserve.total = 1024;
    pp.reserve.unit_bytes = 512; /* about what gate mode puts on the GPU per neuron */
    pp.reserve.unit_neurons = 1;
    pp.reserve.any_neurons = true;
    pp.sparsity = "gate";
    struct si_placement *p = NULL;
    if (si_place(&p, prof, &pp, err, sizeof err) != SI_OK)
        goto fail;
    snprintf(path, sizeof path, "%s/tiny-hottest.gpuidx", dir);
    int rc = si_placement_write(p, path, err, sizeof err);
    p->has_meta = false;
    snprintf(path, sizeof path, "%s/tiny-bare.gpuidx", dir);
    if (rc == SI_OK)
        rc = si_placement_write(p, path, err, sizeof err);
    si_placement_free(p);
    si_profile_free(prof);
    if (rc == SI_OK)
        return 0;
fail:
    si_profile_free(prof);
    fprintf(stderr, "fuzz-gpuidx: %s\n", err);
    return -1;
}
