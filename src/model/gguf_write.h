/*
 * gguf_write.h - writing GGUF files (layout: see gguf.h).
 *
 * Build the file's description in memory (metadata and tensor infos, tensor
 * data given as pointers the caller keeps alive until si_gguf_writer_write()),
 * then write it in one pass.  Output is version 3, magic "GGUF" or "PWRI".
 *
 *   struct si_gguf_writer *w = si_gguf_writer_init(false);
 *   si_gguf_writer_set_str(w, "general.architecture", "llama");
 *   si_gguf_writer_set_u32(w, "llama.block_count", 2);
 *   int64_t ne[2] = {576, 1536};
 *   si_gguf_writer_add_tensor(w, "blk.0.ffn_up.weight", SI_TYPE_F16, 2, ne, data);
 *   int rc = si_gguf_writer_write(w, "model.gguf", err, sizeof err);
 *   si_gguf_writer_free(w);
 *
 * Setting a key twice replaces its value; adding a tensor name twice fails.
 */
#ifndef SI_MODEL_GGUF_WRITE_H
#define SI_MODEL_GGUF_WRITE_H

#include "model/gguf.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct si_gguf_writer;

/* powerinfer: write the "PWRI" magic instead of "GGUF".  NULL if out of memory. */
struct si_gguf_writer *si_gguf_writer_init(bool powerinfer);
void si_gguf_writer_free(struct si_gguf_writer *w);

/* Scalars and strings.  Each returns SI_OK or a negative si_status. */
int si_gguf_writer_set_u8(struct si_gguf_writer *w, const char *key, uint8_t v);
int si_gguf_writer_set_i8(struct si_gguf_writer *w, const char *key, int8_t v);
int si_gguf_writer_set_u16(struct si_gguf_writer *w, const char *key, uint16_t v);
int si_gguf_writer_set_i16(struct si_gguf_writer *w, const char *key, int16_t v);
int si_gguf_writer_set_u32(struct si_gguf_writer *w, const char *key, uint32_t v);
int si_gguf_writer_set_i32(struct si_gguf_writer *w, const char *key, int32_t v);
int si_gguf_writer_set_u64(struct si_gguf_writer *w, const char *key, uint64_t v);
int si_gguf_writer_set_i64(struct si_gguf_writer *w, const char *key, int64_t v);
int si_gguf_writer_set_f32(struct si_gguf_writer *w, const char *key, float v);
int si_gguf_writer_set_f64(struct si_gguf_writer *w, const char *key, double v);
int si_gguf_writer_set_bool(struct si_gguf_writer *w, const char *key, bool v);
int si_gguf_writer_set_str(struct si_gguf_writer *w, const char *key, const char *v);

/* Arrays of scalars (n elements of `type`, copied) and of strings (copied). */
int si_gguf_writer_set_arr(struct si_gguf_writer *w, const char *key, enum si_gguf_type type,
                           const void *data, uint64_t n);
int si_gguf_writer_set_arr_str(struct si_gguf_writer *w, const char *key,
                               const char *const *strs, uint64_t n);

/* Copy every key of an opened file (arrays and nested arrays included: the
 * bytes of each value are copied as they are, so nested arrays, which the
 * setters above cannot build, survive a copy).  Keys set before are replaced. */
int si_gguf_writer_copy_kv(struct si_gguf_writer *w, const struct si_gguf *src);

/*
 * A tensor of `type` (enum si_type) with n_dims dimensions ne[0..n_dims),
 * ne[0] fastest.  `data` (si_type_row_size(type, ne[0]) * rows bytes) is not
 * copied: it must stay valid until the file is written.  A PowerInfer
 * writer stores the type under PowerInfer's number (si_type_to_pwri) and
 * refuses, SI_E_UNSUPPORTED, the types that number names otherwise there.
 */
int si_gguf_writer_add_tensor(struct si_gguf_writer *w, const char *name, uint32_t type,
                              uint32_t n_dims, const int64_t *ne, const void *data);

/*
 * A tensor whose bytes are produced while the file is written, for files too
 * large to hold in memory.  The writer calls fill(user, row0, n_rows, dst)
 * with rows in increasing order, each call asking for rows [row0, row0 +
 * n_rows) of the tensor (a row is ne[0] elements; rows count over
 * ne[1..n_dims) flattened) to be stored at dst, si_type_row_size() bytes
 * each.  fill returns SI_OK, or a negative si_status that aborts the write
 * (the writer then reports "tensor NAME: ..." with the status message).  `user`
 * must stay valid until the file is written.
 */
typedef int (*si_gguf_fill_fn)(void *user, int64_t row0, int64_t n_rows, void *dst);

int si_gguf_writer_add_tensor_cb(struct si_gguf_writer *w, const char *name, uint32_t type,
                                 uint32_t n_dims, const int64_t *ne, si_gguf_fill_fn fill,
                                 void *user);

/* Write the file (alignment: general.alignment if set as UINT32, else 32).
 * Writes to a temporary name and renames, so a failed write leaves no file. */
int si_gguf_writer_write(struct si_gguf_writer *w, const char *path, char *err,
                         size_t err_size);

#endif /* SI_MODEL_GGUF_WRITE_H */
