/*
 * store.h - the flash store: a model's FFN neurons on disk, one record per
 * neuron, read on demand (`starinfer convert --bundle` writes it).
 *
 * The file is GGUF (general.architecture "starinfer.flash", general.alignment
 * 4096), so `starinfer info` reads it.  Keys (flash.*): the record format's
 * version (SI_FLASH_VERSION), the model's shape (n_layer, n_ff, n_embd), the
 * types of the gate/up rows and of the down_t rows, has_gate, has_bias, the
 * layout, the block alignment A of records and rows (512), the in-memory
 * record (rec_bytes, gate_off, up_off, dt_off) and the model's fingerprint
 * (model_bytes: its tensor data size, model_hash: FNV-1a over each layer's
 * first up row and down_t row), checked when a model opens the store.
 *
 * A neuron's record: gate row (models with a gate), up row, down_t row (the
 * down projection's column, transposed, in the type the engine uses: the
 * file's ffn_down_t, or ffn_down transposed, exact for F32/F16 and rounded
 * to F16 for quantized types), each part starting at a multiple of A, the
 * record padded to a multiple of A: a record can be read with O_DIRECT
 * straight into a cache slot.  The up biases (models with one) are not in
 * the records but in blk.N.flash_bias (F32 {n_ff}), kept in memory: 4 bytes
 * a neuron would cost a whole block A per read (OPT-6.7B's F16 record is
 * 16 KiB without it, 16.5 KiB with it; on our VM's disk 16 KiB reads on
 * 4 KiB pages ran at 38.8-44.5 k requests/s, 16.5 KiB ones at 31.9-37.1 k:
 * docs/flash.md).
 *
 * Layouts.
 *  - bundled: per layer a tensor blk.N.flash_rec (I8, {rec_bytes, n_ff}):
 *    the records, in the store's order; one read per neuron.
 *  - split (the baseline without bundling): per layer blk.N.flash_gate,
 *    blk.N.flash_up, blk.N.flash_down_t (I8, each part's padded bytes per
 *    row): two or three reads per neuron, into the parts of the same
 *    in-memory record.
 * Order: blk.N.flash_order (I32 {n_ff}): row r of the layer's tensors holds
 * neuron order[r] (file ids).  Co-activated neurons sit close: with a
 * profile, by activation count, hottest first (hot neurons fire together),
 * so a token's active neurons cluster in few runs of adjacent records that
 * the loader reads as one.
 */
#ifndef SI_FLASH_STORE_H
#define SI_FLASH_STORE_H

#include "model/model.h"

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/stat.h>

#define SI_FLASH_ARCH "starinfer.flash"
#define SI_FLASH_BLOCK 512 /* record and row alignment (O_DIRECT's logical block) */
#define SI_FLASH_VERSION 2   /* 2: biases apart from the records (1: unnamed, inside) */

enum si_flash_layout { SI_FLASH_BUNDLED, SI_FLASH_SPLIT, SI_FLASH_LAYOUT_COUNT };

/* "bundled", "split" */
const char *si_flash_layout_name(enum si_flash_layout l);

struct si_profile;

/* The record layout of model m (types, offsets, rec_bytes). */
struct si_flash_format {
    int32_t n_layer, n_ff, n_embd;
    uint32_t gu_type, dt_type;
    bool has_gate, has_bias;
    size_t gu_row, dt_row;             /* bytes of the rows */
    size_t gate_off, up_off, dt_off;   /* in a record (gate_off: has_gate) */
    size_t rec_bytes;                  /* a multiple of SI_FLASH_BLOCK */
    size_t gate_part, up_part, dt_part; /* each part's padded bytes */
};

/* The format of model m's store; SI_OK or SI_E_UNSUPPORTED (err says why). */
int si_flash_format_of(const struct si_model *m, struct si_flash_format *f, char *err,
                       size_t err_size);

/* The model's fingerprint (see above). */
uint64_t si_flash_model_hash(const struct si_model *m, const struct si_flash_format *f);

/*
 * Write model m's store to path: layout, neuron order from the profile
 * (may be NULL: file order).  Streams one layer at a time (for models
 * without ffn_down_t: the layer's down projection transposed in memory).
 * SI_OK or an error with err filled.
 */
int si_flash_store_write(const struct si_model *m, const struct si_profile *pr,
                         enum si_flash_layout layout, const char *path, char *err,
                         size_t err_size);

struct si_flash_io;

/* One read: len bytes at file offset off into dst. */
struct si_flash_req {
    uint64_t off;
    size_t len;
    void *dst;
};

/* An open store. */
struct si_flash_store {
    struct si_flash_format f;
    enum si_flash_layout layout;
    int fd;           /* O_DIRECT when direct */
    bool direct;      /* page cache bypassed */
    char why[160];    /* when not direct: why */
    char *path;
    struct stat st;   /* the file when opened: a change during the run is an error */
    char read_err[512]; /* the last failed si_flash_read's one line */
    int32_t *order;   /* (n_layer, n_ff) row -> neuron id */
    int32_t *row_of;  /* (n_layer, n_ff) neuron id -> row */
    uint64_t *base;   /* (n_layer, 4) file offsets of the layer's tensors:
                       * bundled [0] = records; split [0] gate, [1] up, [2] down_t */
    float *bias;      /* has_bias: (n_layer, n_ff) the up biases, by neuron id */
    uint64_t file_bytes;
    struct si_flash_io *io; /* io_uring or pread threads (flash/io.h) */
    pthread_mutex_t read_lock; /* one si_flash_read at a time (its check of the file) */
    bool read_lock_made;
};

/*
 * Open the store at path for model m, read through io_uring or n_io reader
 * threads (0: 16) (flash/io.h),
 * checking it belongs to m.  O_DIRECT when the file system takes it (a test
 * read decides); else buffered reads, with direct false and why filled.
 * SI_OK, SI_E_NOT_FOUND, SI_E_FORMAT (not a store, or another model's),
 * SI_E_IO, SI_E_NOMEM.
 */
int si_flash_store_open(struct si_flash_store **out, const char *path, const struct si_model *m,
                        int n_io, char *err, size_t err_size);
void si_flash_store_free(struct si_flash_store *s);

/*
 * The requests that read neurons ids[0..n) of layer l into rec[k] (the
 * in-memory records, aligned to SI_FLASH_BLOCK); neurons whose rows follow
 * each other in the file and whose destinations follow each other in
 * memory (rec[k + 1] == rec[k] + rec_bytes) merge into one request.  req
 * needs room for n * 3 entries.  Returns the number of requests.
 */
int64_t si_flash_plan(const struct si_flash_store *s, int l, const int32_t *ids, int64_t n,
                      char *const *rec, struct si_flash_req *req);

/* Neuron id's up bias in layer l (0 for a model without biases). */
static inline float si_flash_bias(const struct si_flash_store *s, int l, int32_t id)
{
    return s->bias != NULL ? s->bias[(size_t)l * (size_t)s->f.n_ff + (size_t)id] : 0.0f;
}

/* Read the requests with the store's threads (parallel preads); SI_OK or
 * SI_E_IO, with s->read_err naming the file and what happened: a read
 * error, a read past the end (the store was truncated), or the file changed
 * since it was opened (size or modification time: written over or cut
 * while the run reads it; a store replaced by a rename is not seen, the run
 * keeps reading the file it opened).  Thread-safe (calls are serialised). */
int si_flash_read(struct si_flash_store *s, const struct si_flash_req *req, int64_t n);

#endif /* SI_FLASH_STORE_H */
