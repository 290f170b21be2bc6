/* store.c - the flash store: writing, opening, parallel direct reads (see store.h). */
#include "flash/store.h"

#include "flash/io.h"
#include "internal.h"
#include "model/gguf.h"
#include "model/gguf_write.h"
#include "model/quants.h"
#include "model/types.h"
#include "predict/profile.h"
#include "starinfer.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define MERGE_MAX (1u << 20) /* merged requests stay at most this long: the
                              * threads keep many reads outstanding */

static size_t pad(size_t n)
{
    return (n + SI_FLASH_BLOCK - 1) / SI_FLASH_BLOCK * SI_FLASH_BLOCK;
}

const char *si_flash_layout_name(enum si_flash_layout l)
{
    return l == SI_FLASH_BUNDLED ? "bundled" : l == SI_FLASH_SPLIT ? "split" : "?";
}

int si_flash_format_of(const struct si_model *m, struct si_flash_format *f, char *err,
                       size_t err_size)
{
    const struct si_hparams *hp = &m->hp;
    const struct si_layer *W = &m->w.layers[0];
    memset(f, 0, sizeof *f);
    f->n_layer = hp->n_layer;
    f->n_ff = hp->n_ff;
    f->n_embd = hp->n_embd;
    f->has_gate = hp->ffn_kind != SI_FFN_PLAIN;
    f->gu_type = W->ffn_up.type;
    f->gu_row = W->ffn_up.row_bytes;
    if (f->has_gate && W->ffn_gate.type != W->ffn_up.type)
        return si__errf(err, err_size, SI_E_UNSUPPORTED,
                        "the flash store needs ffn_gate and ffn_up of one type (%s, %s)",
                        si_type_name(W->ffn_gate.type), si_type_name(W->ffn_up.type));
    /* down_t as the engine makes it (graph/layout.c, si__layout_of) */
    if (W->ffn_down_t.data != NULL) {
        f->dt_type = W->ffn_down_t.type;
        f->dt_row = W->ffn_down_t.row_bytes;
    } else {
        const uint32_t t = W->ffn_down.type;
        f->dt_type = t == SI_TYPE_F32 || t == SI_TYPE_F16 ? t : SI_TYPE_F16;
        si_type_row_size(f->dt_type, hp->n_embd, &f->dt_row);
    }
    for (int l = 0; l < hp->n_layer; l++) {
        const struct si_layer *V = &m->w.layers[l];
        if (V->ffn_up.type != W->ffn_up.type || V->ffn_down.type != W->ffn_down.type ||
            (V->ffn_down_t.data != NULL) != (W->ffn_down_t.data != NULL) ||
            (V->ffn_up_b.data != NULL) != (W->ffn_up_b.data != NULL))
            return si__errf(err, err_size, SI_E_UNSUPPORTED,
                            "the flash store needs every layer's FFN tensors of the same types "
                            "(layer %d differs from layer 0)",
                            l);
    }
    f->has_bias = W->ffn_up_b.data != NULL;
    f->gate_part = f->has_gate ? pad(f->gu_row) : 0;
    f->up_part = pad(f->gu_row);
    f->dt_part = pad(f->dt_row);
    f->gate_off = 0;
    f->up_off = f->gate_part;
    f->dt_off = f->up_off + f->up_part;
    f->rec_bytes = f->dt_off + f->dt_part; /* each part padded: a multiple of A */
    return SI_OK;
}

uint64_t si_flash_model_hash(const struct si_model *m, const struct si_flash_format *f)
{
    uint64_t h = SI_FNV_BASIS;
    for (int l = 0; l < f->n_layer; l++) {
        const struct si_layer *W = &m->w.layers[l];
        h = si__fnv1a(h, si_file_row(&W->ffn_up, 0), f->gu_row);
        h = W->ffn_down_t.data != NULL
                ? si__fnv1a(h, si_file_row(&W->ffn_down_t, 0), f->dt_row)
                : si__fnv1a(h, si_file_row(&W->ffn_down, 0), W->ffn_down.row_bytes);
    }
    return h;
}

/* ------------------------------------------------------------ writing */

enum part { PART_REC, PART_GATE, PART_UP, PART_DT, PART_BIAS };

/* One layer's tensors as the writer asks for their rows. */
struct layer_src {
    const struct si_model *m;
    const struct si_flash_format *f;
    int l;
    enum part part;
    const int32_t *order; /* (n_ff) row -> neuron */
    float **col;          /* shared: the layer's down projection as floats, or NULL */
    int *col_layer;       /* which layer col holds */
    float *tmp;           /* (n_embd) */
};

/* Models without ffn_down_t: layer l's ffn_down as (n_embd, n_ff) floats. */
static int load_col(struct layer_src *s)
{
    if (*s->col_layer == s->l)
        return SI_OK;
    const struct si_tensor *dn = &s->m->w.layers[s->l].ffn_down;
    const int64_t d = s->f->n_embd, ff = s->f->n_ff;
    if (*s->col == NULL && (*s->col = malloc((size_t)d * (size_t)ff * sizeof(float))) == NULL)
        return SI_E_NOMEM;
    for (int64_t o = 0; o < d; o++)
        si_dequantize_row(dn->type, si_file_row(dn, o), *s->col + (size_t)o * ff, ff);
    *s->col_layer = s->l;
    return SI_OK;
}

/* The down_t row of neuron i, as si__build_records (graph/data.c) makes it. */
static int down_t_row(struct layer_src *s, int32_t i, void *dst)
{
    const struct si_layer *W = &s->m->w.layers[s->l];
    if (W->ffn_down_t.data != NULL) {
        memcpy(dst, si_file_row(&W->ffn_down_t, i), s->f->dt_row);
        return SI_OK;
    }
    int rc = load_col(s);
    if (rc != SI_OK)
        return rc;
    const int64_t d = s->f->n_embd, ff = s->f->n_ff;
    for (int64_t o = 0; o < d; o++)
        s->tmp[o] = (*s->col)[(size_t)o * ff + i];
    si_quantize_row(s->f->dt_type, s->tmp, dst, d);
    return SI_OK;
}

static int fill(void *user, int64_t row0, int64_t n_rows, void *dst)
{
    struct layer_src *s = user;
    const struct si_flash_format *f = s->f;
    const struct si_layer *W = &s->m->w.layers[s->l];
    char *out = dst;
    if (s->part == PART_BIAS) { /* one row: the layer's biases in the store's order */
        const float *b = W->ffn_up_b.data;
        for (int64_t r = 0; r < n_rows * f->n_ff; r++)
            ((float *)dst)[r] = b[s->order[r]];
        return SI_OK;
    }
    for (int64_t r = row0; r < row0 + n_rows; r++) {
        const int32_t i = s->order[r];
        int rc = SI_OK;
        switch (s->part) {
        case PART_REC:
            memset(out, 0, f->rec_bytes);
            if (f->has_gate)
                memcpy(out + f->gate_off, si_file_row(&W->ffn_gate, i), f->gu_row);
            memcpy(out + f->up_off, si_file_row(&W->ffn_up, i), f->gu_row);
            rc = down_t_row(s, i, out + f->dt_off);
            out += f->rec_bytes;
            break;
        case PART_GATE:
        case PART_UP:
            memset(out, 0, f->up_part);
            memcpy(out, si_file_row(s->part == PART_GATE ? &W->ffn_gate : &W->ffn_up, i),
                   f->gu_row);
            out += f->up_part;
            break;
        case PART_DT:
            memset(out, 0, f->dt_part);
            rc = down_t_row(s, i, out);
            out += f->dt_part;
            break;
        case PART_BIAS:
            break;
        }
        if (rc != SI_OK)
            return rc;
    }
    return SI_OK;
}

struct by_count {
    int64_t count;
    int32_t i;
};

static int cmp_count(const void *pa, const void *pb)
{
    const struct by_count *a = pa, *b = pb;
    if (a->count != b->count)
        return a->count > b->count ? -1 : 1;
    return a->i - b->i;
}

int si_flash_store_write(const struct si_model *m, const struct si_profile *pr,
                         enum si_flash_layout layout, const char *path, char *err,
                         size_t err_size)
{
    struct si_flash_format f;
    int rc = si_flash_format_of(m, &f, err, err_size);
    if (rc != SI_OK)
        return rc;
    if ((unsigned)layout >= SI_FLASH_LAYOUT_COUNT)
        return si__errf(err, err_size, SI_E_INVALID, "unknown flash layout %d", (int)layout);
    if (pr != NULL && (pr->n_layer != f.n_layer || pr->n_ff != f.n_ff))
        return si__errf(err, err_size, SI_E_INVALID,
                        "profile is for %d layers of %d neurons, the model has %d of %d",
                        pr->n_layer, pr->n_ff, f.n_layer, f.n_ff);
    const size_t L = (size_t)f.n_layer, ff = (size_t)f.n_ff;
    int32_t *order = malloc(L * ff * sizeof *order);
    struct by_count *bc = malloc(ff * sizeof *bc);
    struct layer_src *src = calloc(L * 5, sizeof *src);
    float *tmp = malloc((size_t)f.n_embd * sizeof *tmp);
    float *col = NULL;
    int col_layer = -1;
    struct si_gguf_writer *w = si_gguf_writer_init(false);
    if (!order || !bc || !src || !tmp || !w) {
        rc = si__errf(err, err_size, SI_E_NOMEM, "out of memory for the flash store");
        goto done;
    }
    for (size_t l = 0; l < L; l++) {
        for (size_t i = 0; i < ff; i++)
            bc[i] = (struct by_count){pr != NULL ? pr->counts[l * ff + i] : 0, (int32_t)i};
        if (pr != NULL)
            qsort(bc, ff, sizeof *bc, cmp_count);
        for (size_t i = 0; i < ff; i++)
            order[l * ff + i] = bc[i].i;
    }
#define SET(call)                                                                                  \
    do {                                                                                           \
        if (rc == SI_OK && (rc = (call)) != SI_OK)                                                 \
            si__errf(err, err_size, rc, "%s: cannot describe the flash store", path);              \
    } while (0)
    SET(si_gguf_writer_set_str(w, "general.architecture", SI_FLASH_ARCH));
    SET(si_gguf_writer_set_u32(w, "general.alignment", 4096));
    SET(si_gguf_writer_set_u32(w, "flash.version", SI_FLASH_VERSION));
    SET(si_gguf_writer_set_str(w, "flash.layout", si_flash_layout_name(layout)));
    SET(si_gguf_writer_set_str(w, "flash.order", pr != NULL ? "profile" : "file"));
    SET(si_gguf_writer_set_u32(w, "flash.block_align", SI_FLASH_BLOCK));
    SET(si_gguf_writer_set_u32(w, "flash.n_layer", (uint32_t)f.n_layer));
    SET(si_gguf_writer_set_u32(w, "flash.n_ff", (uint32_t)f.n_ff));
    SET(si_gguf_writer_set_u32(w, "flash.n_embd", (uint32_t)f.n_embd));
    SET(si_gguf_writer_set_u32(w, "flash.gu_type", f.gu_type));
    SET(si_gguf_writer_set_u32(w, "flash.dt_type", f.dt_type));
    SET(si_gguf_writer_set_bool(w, "flash.has_gate", f.has_gate));
    SET(si_gguf_writer_set_bool(w, "flash.has_bias", f.has_bias));
    SET(si_gguf_writer_set_u64(w, "flash.rec_bytes", f.rec_bytes));
    SET(si_gguf_writer_set_u64(w, "flash.gate_off", f.gate_off));
    SET(si_gguf_writer_set_u64(w, "flash.up_off", f.up_off));
    SET(si_gguf_writer_set_u64(w, "flash.dt_off", f.dt_off));
    SET(si_gguf_writer_set_u64(w, "flash.model_bytes", (uint64_t)m->gguf->data_size));
    SET(si_gguf_writer_set_u64(w, "flash.model_hash", si_flash_model_hash(m, &f)));
    for (size_t l = 0; l < L && rc == SI_OK; l++) {
        char name[64];
        const int64_t ne_o[1] = {(int64_t)ff};
        snprintf(name, sizeof name, "blk.%zu.flash_order", l);
        SET(si_gguf_writer_add_tensor(w, name, SI_TYPE_I32, 1, ne_o, order + l * ff));
        static const char *const names[] = {"flash_rec", "flash_gate", "flash_up",
                                            "flash_down_t", "flash_bias"};
        for (int p = PART_REC; p <= PART_BIAS; p++) {
            if (p == PART_BIAS ? !f.has_bias
                               : (layout == SI_FLASH_BUNDLED) != (p == PART_REC) ||
                                     (p == PART_GATE && !f.has_gate))
                continue;
            struct layer_src *s = &src[l * 5 + (size_t)p];
            *s = (struct layer_src){.m = m, .f = &f, .l = (int)l, .part = (enum part)p,
                                    .order = order + l * ff, .col = &col,
                                    .col_layer = &col_layer, .tmp = tmp};
            const size_t bytes = p == PART_REC ? f.rec_bytes : p == PART_DT ? f.dt_part
                                                                           : f.up_part;
            const int64_t ne[2] = {(int64_t)bytes, (int64_t)ff};
            snprintf(name, sizeof name, "blk.%zu.%s", l, names[p]);
            if (p == PART_BIAS)
                SET(si_gguf_writer_add_tensor_cb(w, name, SI_TYPE_F32, 1, ne + 1, fill, s));
            else
                SET(si_gguf_writer_add_tensor_cb(w, name, SI_TYPE_I8, 2, ne, fill, s));
        }
    }
#undef SET
    if (rc == SI_OK)
        rc = si_gguf_writer_write(w, path, err, err_size);
done:
    si_gguf_writer_free(w);
    free(order);
    free(bc);
    free(src);
    free(tmp);
    free(col);
    return rc;
}

/* ------------------------------------------------------------ reading */

int si_flash_read(struct si_flash_store *s, const struct si_flash_req *req, int64_t n)
{
    if (n <= 0)
        return SI_OK;
    pthread_mutex_lock(&s->read_lock);
    const int e = si_flash_io_read(s->io, req, n);
    /* What was read is the store's only while the file is the one opened. */
    struct stat now;
    int rc = SI_OK;
    if (fstat(s->fd, &now) != 0)
        rc = si__errf(s->read_err, sizeof s->read_err, SI_E_IO, "%s: %s", s->path,
                      strerror(errno));
    else if (now.st_size != s->st.st_size || now.st_mtim.tv_sec != s->st.st_mtim.tv_sec ||
             now.st_mtim.tv_nsec != s->st.st_mtim.tv_nsec)
        rc = si__errf(s->read_err, sizeof s->read_err, SI_E_IO,
                      "%s: the flash store changed while the run read it (%lld bytes when "
                      "opened, %lld now): stopped, its records cannot be trusted",
                      s->path, (long long)s->st.st_size, (long long)now.st_size);
    else if (e != 0)
        rc = si__errf(s->read_err, sizeof s->read_err, SI_E_IO, "%s: reading the flash store: %s",
                      s->path, e == EIO ? "input/output error, or a record past its end"
                                        : strerror(e));
    pthread_mutex_unlock(&s->read_lock);
    return rc;
}

/* ------------------------------------------------------------ opening */

void si_flash_store_free(struct si_flash_store *s)
{
    if (s == NULL)
        return;
    si_flash_io_free(s->io);
    if (s->read_lock_made)
        pthread_mutex_destroy(&s->read_lock);
    if (s->fd >= 0)
        close(s->fd);
    free(s->path);
    free(s->order);
    free(s->row_of);
    free(s->base);
    free(s->bias);
    free(s);
}

/* A u64 key, or SI_E_FORMAT naming it. */
static int key_u64(const struct si_gguf *g, const char *path, const char *key, uint64_t *v,
                   char *err, size_t err_size)
{
    if (si_gguf_get_u64(g, key, v) != SI_OK)
        return si__errf(err, err_size, SI_E_FORMAT, "%s: flash store without a valid %s", path,
                        key);
    return SI_OK;
}

/* Tensor `name` of the store: its file offset, checked against type and bytes. */
static int tensor_at(const struct si_gguf *g, const char *path, const char *name, uint32_t type,
                     size_t bytes, uint64_t *off, const void **data, char *err, size_t err_size)
{
    int64_t k = si_gguf_find_tensor(g, name);
    if (k < 0 || g->tensors[k].type != type || g->tensors[k].nbytes != bytes)
        return si__errf(err, err_size, SI_E_FORMAT, "%s: flash store tensor %s is %s", path,
                        name, k < 0 ? "missing" : "of the wrong type or size");
    *off = (uint64_t)g->data_offset + g->tensors[k].offset;
    if (data != NULL)
        *data = g->tensors[k].data;
    return SI_OK;
}

/* The store's kind: its architecture, its format's version, its layout
 * (into s->layout); SI_E_FORMAT naming what is wrong. */
static int check_kind(const struct si_gguf *g, const char *path, struct si_flash_store *s,
                      char *err, size_t err_size)
{
    struct si_gguf_str arch = {0, ""}, lay = {0, ""};
    si_gguf_get_str(g, "general.architecture", &arch);
    if (!si_gguf_str_eq(arch, SI_FLASH_ARCH))
        return si__errf(err, err_size, SI_E_FORMAT, "%s: not a flash store (architecture '%.*s')",
                        path, (int)arch.len, arch.data);
    /* Version 1 (no key) kept each up bias inside the record. */
    uint32_t version = 1;
    si_gguf_get_u32(g, "flash.version", &version);
    if (version != SI_FLASH_VERSION)
        return si__errf(err, err_size, SI_E_FORMAT,
                        "%s: flash store format %u, this starinfer reads format %d: write it "
                        "again with `starinfer convert --bundle`",
                        path, version, SI_FLASH_VERSION);
    si_gguf_get_str(g, "flash.layout", &lay);
    s->layout = si_gguf_str_eq(lay, "bundled") ? SI_FLASH_BUNDLED
                : si_gguf_str_eq(lay, "split") ? SI_FLASH_SPLIT
                                               : SI_FLASH_LAYOUT_COUNT;
    if (s->layout == SI_FLASH_LAYOUT_COUNT)
        return si__errf(err, err_size, SI_E_FORMAT, "%s: unknown flash.layout '%.*s'", path,
                        (int)lay.len, lay.data);
    return SI_OK;
}

/* Every key that fixes the record, and flash.has_bias, against what model
 * m makes (its format f); SI_E_FORMAT naming the first that differs. */
static int check_model_keys(const struct si_gguf *g, const char *path, const struct si_model *m,
                            const struct si_flash_format *f, char *err, size_t err_size)
{
    int rc;
    /* Every key that fixes the record must match what this model makes. */
    const char *keys[] = {"flash.block_align", "flash.n_layer",     "flash.n_ff",
                          "flash.n_embd",      "flash.gu_type",     "flash.dt_type",
                          "flash.rec_bytes",   "flash.gate_off",    "flash.up_off",
                          "flash.dt_off",      "flash.model_bytes", "flash.model_hash"};
    const uint64_t want[] = {SI_FLASH_BLOCK,
                             (uint64_t)f->n_layer,
                             (uint64_t)f->n_ff,
                             (uint64_t)f->n_embd,
                             f->gu_type,
                             f->dt_type,
                             f->rec_bytes,
                             f->gate_off,
                             f->up_off,
                             f->dt_off,
                             (uint64_t)m->gguf->data_size,
                             si_flash_model_hash(m, f)};
    for (size_t k = 0; k < sizeof keys / sizeof keys[0]; k++) {
        uint64_t v;
        if ((rc = key_u64(g, path, keys[k], &v, err, err_size)) != SI_OK)
            return rc;
        if (v != want[k])
            return si__errf(err, err_size, SI_E_FORMAT,
                            "%s: the flash store was written for another model (%s is %llu, "
                            "this model needs %llu): convert it again",
                            path, keys[k], (unsigned long long)v, (unsigned long long)want[k]);
    }
    bool has_bias;
    if (si_gguf_get_bool(g, "flash.has_bias", &has_bias) != SI_OK || has_bias != f->has_bias)
        return si__errf(err, err_size, SI_E_FORMAT,
                        "%s: the flash store was written for another model (flash.has_bias is "
                        "not %s): convert it again",
                        path, f->has_bias ? "true" : "false");
    return SI_OK;
}

/* Layer l's part of s's tables: its rows' order (a permutation of its
 * neurons) and row_of, its tensors' file offsets (aligned), its up biases
 * by neuron id; SI_E_FORMAT naming what is wrong. */
static int read_layer(const struct si_gguf *g, const char *path, struct si_flash_store *s, size_t l,
                      char *err, size_t err_size)
{
    const struct si_flash_format *f = &s->f;
    const size_t ff = (size_t)f->n_ff;
    int rc;
    char name[64];
    uint64_t off;
    const void *data;
    snprintf(name, sizeof name, "blk.%zu.flash_order", l);
    if ((rc = tensor_at(g, path, name, SI_TYPE_I32, ff * 4, &off, &data, err, err_size)))
        return rc;
    memcpy(s->order + l * ff, data, ff * sizeof(int32_t));
    for (size_t i = 0; i < ff; i++)
        s->row_of[l * ff + i] = -1;
    for (size_t r = 0; r < ff; r++) {
        const int32_t i = s->order[l * ff + r];
        if (i < 0 || (size_t)i >= ff || s->row_of[l * ff + (size_t)i] >= 0)
            return si__errf(err, err_size, SI_E_FORMAT,
                            "%s: %s is not a permutation of the layer's neurons", path, name);
        s->row_of[l * ff + (size_t)i] = (int32_t)r;
    }
    if (s->layout == SI_FLASH_BUNDLED) {
        snprintf(name, sizeof name, "blk.%zu.flash_rec", l);
        if ((rc = tensor_at(g, path, name, SI_TYPE_I8, ff * f->rec_bytes, &s->base[l * 4], NULL,
                            err, err_size)))
            return rc;
    } else {
        static const char *const parts[] = {"flash_gate", "flash_up", "flash_down_t"};
        const size_t bytes[] = {f->gate_part, f->up_part, f->dt_part};
        for (int p = f->has_gate ? 0 : 1; p < 3; p++) {
            snprintf(name, sizeof name, "blk.%zu.%s", l, parts[p]);
            if ((rc = tensor_at(g, path, name, SI_TYPE_I8, ff * bytes[p], &s->base[l * 4 + p], NULL,
                                err, err_size)))
                return rc;
        }
    }
    if (f->has_bias) {
        snprintf(name, sizeof name, "blk.%zu.flash_bias", l);
        if ((rc = tensor_at(g, path, name, SI_TYPE_F32, ff * 4, &off, &data, err, err_size)))
            return rc;
        /* kept by neuron id: the tier takes a loaded neuron's bias by id */
        for (size_t r = 0; r < ff; r++)
            s->bias[l * ff + (size_t)s->order[l * ff + r]] = ((const float *)data)[r];
    }
    if (s->base[l * 4] % SI_FLASH_BLOCK || s->base[l * 4 + 1] % SI_FLASH_BLOCK ||
        s->base[l * 4 + 2] % SI_FLASH_BLOCK)
        return si__errf(err, err_size, SI_E_FORMAT, "%s: layer %zu's records are not aligned", path,
                        l);
    return SI_OK;
}

/* The store's file at path opened for reading into s->fd: with O_DIRECT
 * when a test read of one record passes (s->direct; else s->why says why
 * not), else buffered; still the size it had when mapped.  SI_E_IO or
 * SI_OK (s->fd left for si_flash_store_free either way). */
static int open_file(struct si_flash_store *s, const char *path, char *err, size_t err_size)
{
    const struct si_flash_format *f = &s->f;
    /* Direct I/O when the file system takes it: a test read of one record. */
    s->fd = open(path, O_RDONLY | O_CLOEXEC | O_DIRECT);
    if (s->fd >= 0) {
        void *buf = aligned_alloc(4096, (f->rec_bytes + 4095) / 4096 * 4096);
        struct si_flash_req r = {.off = s->base[0],
                                 .len = s->layout == SI_FLASH_BUNDLED ? f->rec_bytes : f->up_part,
                                 .dst = buf};
        if (s->layout == SI_FLASH_SPLIT)
            r.off = s->base[1];
        int e = buf != NULL ? si_flash_io_pread(s->fd, &r) : ENOMEM;
        free(buf);
        if (e == 0) {
            s->direct = true;
        } else {
            snprintf(s->why, sizeof s->why, "O_DIRECT read failed: %s", strerror(e));
            close(s->fd);
            s->fd = -1;
        }
    } else {
        snprintf(s->why, sizeof s->why, "O_DIRECT open failed: %s", strerror(errno));
    }
    if (s->fd < 0 && (s->fd = open(path, O_RDONLY | O_CLOEXEC)) < 0)
        return si__errf(err, err_size, SI_E_IO, "%s: %s", path, strerror(errno));
    if (fstat(s->fd, &s->st) != 0 || (uint64_t)s->st.st_size != s->file_bytes)
        return si__errf(err, err_size, SI_E_IO, "%s: the file changed while it was opened", path);
    return SI_OK;
}

int si_flash_store_open(struct si_flash_store **out, const char *path, const struct si_model *m,
                        int n_io, char *err, size_t err_size)
{
    *out = NULL;
    struct si_flash_format f;
    int rc = si_flash_format_of(m, &f, err, err_size);
    if (rc != SI_OK)
        return rc;
    struct si_gguf *g = NULL;
    if ((rc = si_gguf_open(&g, path, err, err_size)) != SI_OK) {
        if (rc == SI_E_NOT_FOUND)
            si__errf(err, err_size, rc,
                     "%s: no flash store (write it with `starinfer convert --bundle`)", path);
        return rc;
    }
    struct si_flash_store *s = calloc(1, sizeof *s);
    if (s == NULL) {
        si_gguf_free(g);
        return si__errf(err, err_size, SI_E_NOMEM, "out of memory");
    }
    s->fd = -1;
    s->f = f;
    s->file_bytes = g->size;
    if ((rc = check_kind(g, path, s, err, err_size)) != SI_OK ||
        (rc = check_model_keys(g, path, m, &f, err, err_size)) != SI_OK)
        goto fail;
    const size_t L = (size_t)f.n_layer, ff = (size_t)f.n_ff;
    s->order = malloc(L * ff * sizeof *s->order);
    s->row_of = malloc(L * ff * sizeof *s->row_of);
    s->base = calloc(L * 4, sizeof *s->base);
    if (f.has_bias)
        s->bias = malloc(L * ff * sizeof *s->bias);
    if (!s->order || !s->row_of || !s->base || (f.has_bias && !s->bias)) {
        rc = si__errf(err, err_size, SI_E_NOMEM, "out of memory for the flash store");
        goto fail;
    }
    for (size_t l = 0; l < L; l++)
        if ((rc = read_layer(g, path, s, l, err, err_size)) != SI_OK)
            goto fail;
    si_gguf_free(g); /* the mapping is done with: records are read with pread */
    g = NULL;

    if ((rc = open_file(s, path, err, err_size)) != SI_OK)
        goto fail;
    if ((s->path = strdup(path)) == NULL) {
        rc = si__errf(err, err_size, SI_E_NOMEM, "out of memory");
        goto fail;
    }
    if ((rc = si_flash_io_init(&s->io, s->fd, 0, n_io, err, err_size)) != SI_OK)
        goto fail;
    pthread_mutex_init(&s->read_lock, NULL);
    s->read_lock_made = true;
    *out = s;
    return SI_OK;
fail:
    si_gguf_free(g);
    si_flash_store_free(s);
    return rc;
}

int64_t si_flash_plan(const struct si_flash_store *s, int l, const int32_t *ids, int64_t n,
                      char *const *rec, struct si_flash_req *req)
{
    const struct si_flash_format *f = &s->f;
    const size_t ff = (size_t)f->n_ff;
    const int32_t *row_of = s->row_of + (size_t)l * ff;
    const uint64_t *base = s->base + (size_t)l * 4;
    int64_t nr = 0;
    if (s->layout == SI_FLASH_BUNDLED) {
        for (int64_t k = 0; k < n; k++) {
            const uint64_t off = base[0] + (uint64_t)row_of[ids[k]] * f->rec_bytes;
            struct si_flash_req *p = nr > 0 ? &req[nr - 1] : NULL;
            if (p != NULL && p->off + p->len == off && (char *)p->dst + p->len == rec[k] &&
                p->len + f->rec_bytes <= MERGE_MAX) {
                p->len += f->rec_bytes;
                continue;
            }
            req[nr++] = (struct si_flash_req){off, f->rec_bytes, rec[k]};
        }
        return nr;
    }
    for (int64_t k = 0; k < n; k++) {
        const uint64_t r = (uint64_t)row_of[ids[k]];
        if (f->has_gate)
            req[nr++] = (struct si_flash_req){base[0] + r * f->gate_part, f->gate_part,
                                              rec[k] + f->gate_off};
        req[nr++] = (struct si_flash_req){base[1] + r * f->up_part, f->up_part, rec[k] + f->up_off};
        req[nr++] = (struct si_flash_req){base[2] + r * f->dt_part, f->dt_part, rec[k] + f->dt_off};
    }
    return nr;
}
