/*
 * fuzz-gguf.c - fuzz target for the GGUF reader (see fuzz.h).
 *
 * Each input is parsed as a GGUF image; when the reader accepts it, every
 * metadata value, array element and tensor is read back, so that a pointer or
 * size the reader got wrong shows up under AddressSanitizer.  A refusal must
 * be one line.
 */
#include "fuzz.h"

#include "../tiny-model.h"
#include "model/gguf.h"
#include "model/types.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define touch fuzz_touch
#define sink fuzz_sink

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    return 0;
}

/* The tiny model's file (the hand-made seeds are kept in the tree as they are). */
int fuzz_write_seeds(const char *dir)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/tiny-llama.gguf", dir);
    write_model(path, "llama", FAULT_NONE);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct si_gguf *g = NULL;
    char err[256];
    if (si_gguf_parse(&g, data, size, err, sizeof err) != 0) {
        fuzz_check_refusal(err);
        sink += strlen(err);
        return 0;
    }
    fuzz_accepted++;
    uint64_t h = g->version + g->alignment + g->data_offset + g->data_size;
    for (uint64_t i = 0; i < g->n_kv; i++) {
        const struct si_gguf_kv *kv = &g->kv[i];
        h += touch(kv->key.data, kv->key.len);
        h += si_gguf_find_key(g, "general.architecture") >= 0;
        if (kv->type == SI_GGUF_STRING)
            h += touch(kv->v.str.data, kv->v.str.len);
        else if (kv->type != SI_GGUF_ARRAY)
            h += kv->v.u64;
        if (kv->type != SI_GGUF_ARRAY)
            continue;
        /* Every element of arrays of scalars and strings; nested ones are opaque. */
        for (uint64_t j = 0; j < kv->arr_n; j++) {
            struct si_gguf_kv e;
            if (si_gguf_arr_elem(kv, j, &e) != 0)
                break;
            h += e.type == SI_GGUF_STRING ? touch(e.v.str.data, e.v.str.len) : e.v.u64;
        }
    }
    uint64_t u;
    double f;
    struct si_gguf_str s;
    h += si_gguf_get_u64(g, "general.alignment", &u) + si_gguf_get_f64(g, "x", &f) +
         si_gguf_get_str(g, "general.architecture", &s);
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        const struct si_gguf_tensor *t = &g->tensors[i];
        h += touch(t->name.data, t->name.len) + t->n_dims + (uint64_t)t->ne[0] + t->type +
             t->offset;
        h += (uint64_t)si_gguf_find_tensor(g, "output.weight");
        /* First and last byte of the data, which must lie inside the input. */
        if (t->nbytes > 0) {
            const uint8_t *d = t->data;
            h += d[0] + d[t->nbytes - 1];
            if (d < data || d + t->nbytes > data + size)
                __builtin_trap();
        }
    }
    sink += h;
    si_gguf_free(g);
    return 0;
}
