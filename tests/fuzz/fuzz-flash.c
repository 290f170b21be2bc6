/*
 * fuzz-flash.c - fuzz target for the flash store's reader
 * (si_flash_store_open, `starinfer convert --bundle`'s file; see fuzz.h).
 *
 * Each input is opened as a store of the tiny model; an accepted one is
 * then read whole, every neuron of every layer through si_flash_plan and
 * si_flash_read, as the flash tier does: a read past the file's end must be
 * SI_E_IO, never memory outside the destination.
 */
#include "fuzz.h"

#include "flash/store.h"
#include "model/model.h"
#include "predict/profile.h"
#include "starinfer.h"

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

static void read_all(struct si_flash_store *s)
{
    const struct si_flash_format *f = &s->f;
    const size_t ff = (size_t)f->n_ff;
    char *mem = aligned_alloc(SI_FLASH_BLOCK, ff * f->rec_bytes);
    char **rec = malloc(ff * sizeof *rec);
    int32_t *ids = malloc(ff * sizeof *ids);
    struct si_flash_req *req = malloc(ff * 3 * sizeof *req);
    if (!mem || !rec || !ids || !req)
        fuzz_fail("out of memory");
    for (size_t i = 0; i < ff; i++) {
        rec[i] = mem + i * f->rec_bytes;
        ids[i] = (int32_t)i;
    }
    for (int l = 0; l < f->n_layer; l++) {
        memset(mem, 0, ff * f->rec_bytes);
        const int64_t n = si_flash_plan(s, l, ids, (int64_t)ff, rec, req);
        if (n < 0 || n > (int64_t)ff * 3)
            fuzz_fail("layer %d: %lld requests for %zu neurons", l, (long long)n, ff);
        for (int64_t k = 0; k < n; k++)
            if ((char *)req[k].dst < mem || (char *)req[k].dst + req[k].len > mem + ff * f->rec_bytes)
                fuzz_fail("layer %d: request %lld lands outside the records", l, (long long)k);
        const int rc = si_flash_read(s, req, n);
        if (rc != SI_OK && rc != SI_E_IO)
            fuzz_fail("si_flash_read: %d", rc);
        fuzz_sink += fuzz_touch(mem, ff * f->rec_bytes);
    }
    free(req);
    free(ids);
    free(rec);
    free(mem);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *path = fuzz_file(data, size);
    struct si_flash_store *s = NULL;
    char err[256] = "";
    if (si_flash_store_open(&s, path, fuzz_tiny_model(), 1, err, sizeof err) != SI_OK) {
        fuzz_check_refusal(err);
        return 0;
    }
    fuzz_accepted++;
    read_all(s);
    si_flash_store_free(s);
    return 0;
}

/* The tiny model's store in both layouts, in file order and in a profile's. */
int fuzz_write_seeds(const char *dir)
{
    const struct si_model *m = fuzz_tiny_model();
    char err[256] = "", path[4096];
    struct si_profile *prof = NULL;
    if (si_profile_init(&prof, m->hp.n_layer, m->hp.n_ff, err, sizeof err) != SI_OK)
        goto fail;
    prof->n_tokens = 100;
    for (int64_t i = 0; i < (int64_t)m->hp.n_layer * m->hp.n_ff; i++)
        prof->counts[i] = (i * 7) % 101;
    static const struct {
        enum si_flash_layout layout;
        bool profile;
        const char *name;
    } kinds[] = {{SI_FLASH_BUNDLED, false, "tiny-bundled.flash"},
                 {SI_FLASH_SPLIT, false, "tiny-split.flash"},
                 {SI_FLASH_BUNDLED, true, "tiny-bundled-profile.flash"}};
    for (size_t k = 0; k < sizeof kinds / sizeof kinds[0]; k++) {
        snprintf(path, sizeof path, "%s/%s", dir, kinds[k].name);
        if (si_flash_store_write(m, kinds[k].profile ? prof : NULL, kinds[k].layout, path, err,
                                 sizeof err) != SI_OK)
            goto fail;
    }
    si_profile_free(prof);
    return 0;
fail:
    si_profile_free(prof);
    fprintf(stderr, "fuzz-flash: %s\n", err);
    return -1;
}
