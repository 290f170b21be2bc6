/* transpose.c - a matrix's transposed copy, written row by row (transpose.h). */
#include "model/transpose.h"

#include "internal.h"
#include "model/colblock.h"
#include "model/gguf.h"
#include "model/gguf_write.h"
#include "model/quants.h"
#include "model/types.h"
#include "starinfer.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

uint32_t si_transpose_type(uint32_t t, int64_t n)
{
    uint32_t want;
    switch (t) {
    case SI_TYPE_F32:
    case SI_TYPE_F16:
    case SI_TYPE_BF16:
    case SI_TYPE_Q8_0:
    case SI_TYPE_Q4_0:
    case SI_TYPE_Q4_1:
        want = t;
        break;
    case SI_TYPE_Q4_K:
        want = SI_TYPE_Q4_0;
        break;
    default:
        want = SI_TYPE_Q8_0;
        break;
    }
    size_t b;
    return si_type_row_size(want, n, &b) ? want : SI_TYPE_F16;
}

int si_transpose_init(struct si_transpose *f, const struct si_tensor *src, uint32_t type)
{
    f->src = src;
    f->type = type;
    f->t = NULL;
    return si_type_quantizable(type) && si_type_row_size(type, src->ne[1], &f->row_bytes)
               ? SI_OK
               : SI_E_INVALID;
}

int si_transpose_fill(void *user, int64_t row0, int64_t n_rows, void *dst)
{
    struct si_transpose *f = user;
    const struct si_tensor *s = f->src;
    const int64_t n_in = s->ne[0], n_out = s->ne[1]; /* src: n_out rows of n_in */
    if (f->t == NULL) {
        float *row = malloc((size_t)n_in * sizeof *row);
        f->t = malloc((size_t)n_in * (size_t)n_out * sizeof *f->t);
        if (row == NULL || f->t == NULL) {
            free(row);
            free(f->t);
            f->t = NULL;
            return SI_E_NOMEM;
        }
        for (int64_t o = 0; o < n_out; o++) {
            si_dequantize_row(s->type, (const char *)s->data + (size_t)o * s->row_bytes, row, n_in);
            for (int64_t i = 0; i < n_in; i++)
                f->t[(size_t)i * (size_t)n_out + (size_t)o] = row[i];
        }
        free(row);
    }
    for (int64_t r = 0; r < n_rows; r++)
        si_quantize_row(f->type, f->t + (size_t)(row0 + r) * (size_t)n_out,
                        (char *)dst + (size_t)r * f->row_bytes, n_out);
    if (row0 + n_rows >= n_in) /* done: one matrix at a time in memory */
        si_transpose_release(f);
    return SI_OK;
}

void si_transpose_release(struct si_transpose *f)
{
    free(f->t);
    f->t = NULL;
}

/* A column-block copy (model/colblock.h) while it is written: its q rows
 * (blk.N.X_t.weight) decoded an input block at a time, and the scales of
 * every block kept for blk.N.X_t.scale, written after them. */
struct cb_fill {
    const struct si_tensor *src;
    bool min;
    int64_t block;   /* the input block in q, or -1 */
    uint8_t *q;      /* (32, n_out) */
    uint16_t *scale; /* (n_in / 32, n_out or 2 n_out) */
    bool *have;      /* (n_in / 32) its row of scale is there */
};

static int cb_decode(struct cb_fill *f, int64_t b)
{
    const int64_t n_out = f->src->ne[1], n_in = f->src->ne[0];
    const size_t srow = (size_t)n_out * (f->min ? 2 : 1);
    if (f->q == NULL) {
        f->q = malloc((size_t)32 * (size_t)n_out);
        f->scale = malloc((size_t)(n_in / 32) * srow * sizeof *f->scale);
        f->have = calloc((size_t)(n_in / 32), sizeof *f->have);
        if (f->q == NULL || f->scale == NULL || f->have == NULL)
            return SI_E_NOMEM;
    }
    uint16_t *d = f->scale + (size_t)b * srow;
    si_cb_decode_block(f->src, b, f->q, d, f->min ? d + n_out : NULL);
    f->have[b] = true;
    f->block = b;
    return SI_OK;
}

static void cb_release(struct cb_fill *f)
{
    free(f->q);
    free(f->scale);
    free(f->have);
    f->q = NULL;
    f->scale = NULL;
    f->have = NULL;
}

/* si_gguf_fill_fn of the q rows: row i is input i's. */
static int cb_fill_rows(void *user, int64_t row0, int64_t n_rows, void *dst)
{
    struct cb_fill *f = user;
    const int64_t n_out = f->src->ne[1];
    for (int64_t r = row0; r < row0 + n_rows; r++) {
        int rc;
        if (f->q == NULL || f->block != r / 32)
            if ((rc = cb_decode(f, r / 32)) != SI_OK)
                return rc;
        si_cb_pack_row(f->q + (size_t)(r % 32) * (size_t)n_out, n_out,
                       (uint8_t *)dst + (size_t)(r - row0) * (size_t)(n_out / 2));
    }
    return SI_OK;
}

/* si_gguf_fill_fn of the scales: row b is input block b's. */
static int cb_fill_scales(void *user, int64_t row0, int64_t n_rows, void *dst)
{
    struct cb_fill *f = user;
    const size_t srow = (size_t)f->src->ne[1] * (f->min ? 2 : 1);
    for (int64_t b = row0; b < row0 + n_rows; b++) {
        int rc;
        if ((f->have == NULL || !f->have[b]) && (rc = cb_decode(f, b)) != SI_OK)
            return rc;
        memcpy((uint16_t *)dst + (size_t)(b - row0) * srow, f->scale + (size_t)b * srow,
               srow * sizeof *f->scale);
    }
    if (row0 + n_rows >= f->src->ne[0] / 32)
        cb_release(f);
    return SI_OK;
}

/* The copies a layer gets: the source tensor and the copy's name. */
struct copy_of {
    const struct si_tensor *src;
    const char *name; /* with %d for the layer */
};

/* Whether name (len bytes) is one of the copies this writes. */
static bool is_copy(const char *name, size_t len)
{
    static const char *const tails[] = {
        ".attn_q_t.weight",   ".attn_k_t.weight",     ".attn_v_t.weight",  ".attn_output_t.weight",
        ".ffn_gate_t.weight", ".ffn_up_t.weight",     ".attn_q_t.scale",   ".attn_k_t.scale",
        ".attn_v_t.scale",    ".attn_output_t.scale", ".ffn_gate_t.scale", ".ffn_up_t.scale",
        ".ffn_down_c.weight", ".ffn_down_c.scale"};
    for (size_t i = 0; i < sizeof tails / sizeof tails[0]; i++) {
        const size_t n = strlen(tails[i]);
        if (len > n && !memcmp(name + len - n, tails[i], n))
            return true;
    }
    return false;
}

int si_transpose_write(const struct si_model *m, const char *path, uint64_t *added_bytes, char *err,
                       size_t err_size)
{
    const struct si_hparams *hp = &m->hp;
    const struct si_gguf *g = m->gguf;
    enum { PER_LAYER = 8 };
    const size_t n_fill = (size_t)hp->n_layer * PER_LAYER;
    struct si_transpose *fill = calloc(n_fill, sizeof *fill);
    struct cb_fill *cbf = calloc(n_fill, sizeof *cbf);
    struct si_gguf_writer *w = si_gguf_writer_init(g->powerinfer);
    uint64_t added = 0;
    int rc = fill != NULL && cbf != NULL && w != NULL ? si_gguf_writer_copy_kv(w, g) : SI_E_NOMEM;
    char name[256];
    for (uint64_t i = 0; rc == SI_OK && i < g->n_tensors; i++) {
        const struct si_gguf_tensor *t = &g->tensors[i];
        if (t->name.len >= sizeof name) {
            rc = SI_E_FORMAT;
            break;
        }
        if (is_copy(t->name.data, (size_t)t->name.len))
            continue;
        memcpy(name, t->name.data, (size_t)t->name.len);
        name[t->name.len] = '\0';
        rc = si_gguf_writer_add_tensor(w, name, t->type, t->n_dims, t->ne, t->data);
    }
    for (int l = 0; rc == SI_OK && l < hp->n_layer; l++) {
        const struct si_layer *L = &m->w.layers[l];
        const struct copy_of c[PER_LAYER] = {
            {&L->wq, "blk.%d.attn_q_t.weight"},
            {&L->wk, "blk.%d.attn_k_t.weight"},
            {&L->wv, "blk.%d.attn_v_t.weight"},
            {&L->wo, "blk.%d.attn_output_t.weight"},
            {hp->ffn_kind != SI_FFN_PLAIN ? &L->ffn_gate : NULL, "blk.%d.ffn_gate_t.weight"},
            {&L->ffn_up, "blk.%d.ffn_up_t.weight"},
            {L->ffn_down_t.data == NULL ? &L->ffn_down : NULL, "blk.%d.ffn_down_t.weight"},
            {&L->ffn_down, "blk.%d.ffn_down_c.weight"},
        };
        for (int k = 0; rc == SI_OK && k < PER_LAYER; k++) {
            if (c[k].src == NULL || c[k].src->data == NULL)
                continue;
            const struct si_tensor *src = c[k].src;
            snprintf(name, sizeof name, c[k].name, l);
            const bool down_c = k == PER_LAYER - 1; /* a column-block copy or none */
            if (down_c && !si_cb_source_ok(src->type, src->ne[1], src->ne[0]))
                continue;
            if (k != PER_LAYER - 2 && si_cb_source_ok(src->type, src->ne[1], src->ne[0])) {
                /* the file's own 4-bit blocks, by columns */
                struct cb_fill *f = &cbf[(size_t)l * PER_LAYER + (size_t)k];
                f->src = src;
                f->min = si_cb_has_min(src->type);
                f->block = -1;
                const int64_t neq[2] = {src->ne[1] / 2, src->ne[0]},
                              nes[2] = {src->ne[1] * (f->min ? 2 : 1), src->ne[0] / 32};
                if ((rc = si_gguf_writer_add_tensor_cb(w, name, SI_TYPE_I8, 2, neq, cb_fill_rows,
                                                       f)) != SI_OK)
                    break;
                char sname[256];
                snprintf(sname, sizeof sname, "%.*s.scale", (int)(strlen(name) - 7), name);
                rc = si_gguf_writer_add_tensor_cb(w, sname, SI_TYPE_F16, 2, nes, cb_fill_scales, f);
                added += (uint64_t)(neq[0] * neq[1]) + 2 * (uint64_t)(nes[0] * nes[1]);
                continue;
            }
            struct si_transpose *f = &fill[(size_t)l * PER_LAYER + (size_t)k];
            const int64_t ne[2] = {c[k].src->ne[1], c[k].src->ne[0]};
            if ((rc = si_transpose_init(f, c[k].src, si_transpose_type(c[k].src->type, ne[0]))) !=
                SI_OK)
                break;
            rc = si_gguf_writer_add_tensor_cb(w, name, f->type, 2, ne, si_transpose_fill, f);
            added += (uint64_t)f->row_bytes * (uint64_t)ne[1];
        }
    }
    if (rc == SI_OK)
        rc = si_gguf_writer_write(w, path, err, err_size);
    else
        si__errf(err, err_size, rc, "%s: %s", path, si_status_str(rc));
    for (size_t i = 0; fill != NULL && i < n_fill; i++)
        si_transpose_release(&fill[i]);
    for (size_t i = 0; cbf != NULL && i < n_fill; i++)
        cb_release(&cbf[i]);
    free(fill);
    free(cbf);
    si_gguf_writer_free(w);
    if (rc == SI_OK && added_bytes != NULL)
        *added_bytes = added;
    return rc;
}
