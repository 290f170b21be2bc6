/*
 * gguf.h - reading GGUF files (and PowerInfer's "PWRI" variant).
 *
 * Byte layout (little-endian), versions 2 and 3:
 *
 *   magic      4 bytes   "GGUF" (PowerInfer model files: "PWRI")
 *   version    u32       2 or 3
 *   n_tensors  u64
 *   n_kv       u64
 *   kv[n_kv]             key: string, type: u32, value (see below)
 *   ti[n_tensors]        name: string, n_dims: u32 (1..4), ne: u64[n_dims],
 *                        type: u32, offset: u64 (from the data section start)
 *   padding              to a multiple of `general.alignment` (default 32)
 *   data                 tensor data; each tensor at its offset, aligned
 *
 *   string  = u64 length, then that many bytes (UTF-8, no terminating NUL)
 *   value   = scalar of its type, a string, or an array:
 *             element type: u32, count: u64, elements (arrays may nest)
 *
 * The whole file is mapped read-only; strings and tensor data point into the
 * mapping.  Every count, offset and size is checked before use, so a truncated
 * or corrupt file is refused with one message naming the problem.
 */
#ifndef SI_MODEL_GGUF_H
#define SI_MODEL_GGUF_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum si_gguf_type {
    SI_GGUF_UINT8 = 0,
    SI_GGUF_INT8 = 1,
    SI_GGUF_UINT16 = 2,
    SI_GGUF_INT16 = 3,
    SI_GGUF_UINT32 = 4,
    SI_GGUF_INT32 = 5,
    SI_GGUF_FLOAT32 = 6,
    SI_GGUF_BOOL = 7,
    SI_GGUF_STRING = 8,
    SI_GGUF_ARRAY = 9,
    SI_GGUF_UINT64 = 10,
    SI_GGUF_INT64 = 11,
    SI_GGUF_FLOAT64 = 12,
    SI_GGUF_TYPE_COUNT
};

#define SI_GGUF_MAX_DIMS 4
#define SI_GGUF_DEFAULT_ALIGNMENT 32

/* A string inside the mapped file: not NUL-terminated. */
struct si_gguf_str {
    uint64_t len;
    const char *data;
};

struct si_gguf_kv {
    struct si_gguf_str key;
    enum si_gguf_type type;
    union {
        uint64_t u64; /* UINT8..UINT64 and BOOL, zero-extended */
        int64_t i64;  /* INT8..INT64, sign-extended */
        double f64;   /* FLOAT32, FLOAT64 */
        struct si_gguf_str str;
    } v;
    /* Arrays: element type, count and the first element's bytes in the file.
     * Arrays of strings also get `strs`, one entry per element. */
    enum si_gguf_type arr_type;
    uint64_t arr_n;
    const uint8_t *arr_data;
    struct si_gguf_str *strs;
};

struct si_gguf_tensor {
    struct si_gguf_str name;
    uint32_t n_dims;
    int64_t ne[SI_GGUF_MAX_DIMS]; /* elements per dimension, ne[0] fastest; unused = 1 */
    uint32_t type;                /* enum si_type */
    uint64_t offset;              /* bytes from the start of the data section */
    size_t nbytes;
    const void *data; /* inside the mapping */
};

struct si_gguf {
    char magic[5];   /* "GGUF" or "PWRI" */
    bool powerinfer; /* magic "PWRI" */
    uint32_t version;
    uint64_t n_kv;
    struct si_gguf_kv *kv;
    uint64_t n_tensors;
    struct si_gguf_tensor *tensors;
    uint64_t alignment;
    size_t data_offset; /* where the data section starts in the file */
    size_t data_size;   /* bytes from data_offset to the end of the last tensor */
    const uint8_t *base;
    size_t size;
    void *map; /* NULL when reading a caller's buffer */
};

/*
 * Map and parse the file at `path`.  On success *out owns the mapping and the
 * result is SI_OK; on failure *out is NULL, a negative si_status is returned
 * and `err` (if not NULL) receives one line saying what is wrong.
 */
int si_gguf_open(struct si_gguf **out, const char *path, char *err, size_t err_size);

/* Parse a GGUF image in memory (the caller keeps `buf` alive); as above. */
int si_gguf_parse(struct si_gguf **out, const void *buf, size_t size, char *err, size_t err_size);

void si_gguf_free(struct si_gguf *g);

/* Index of the key or tensor called `name`, or -1. */
int64_t si_gguf_find_key(const struct si_gguf *g, const char *key);
int64_t si_gguf_find_tensor(const struct si_gguf *g, const char *name);

/*
 * Typed getters.  Integers of any GGUF integer type convert when the value
 * fits the requested type; floats convert from FLOAT32 or FLOAT64.  Each
 * returns SI_OK, SI_E_NOT_FOUND (no such key) or SI_E_FORMAT (wrong type or
 * out of range).
 */
int si_gguf_get_u64(const struct si_gguf *g, const char *key, uint64_t *out);
int si_gguf_get_u32(const struct si_gguf *g, const char *key, uint32_t *out);
int si_gguf_get_i64(const struct si_gguf *g, const char *key, int64_t *out);
/* The same conversion to int64 for a kv already found (or an array element). */
int si_gguf_kv_i64(const struct si_gguf_kv *kv, int64_t *out);
int si_gguf_get_f64(const struct si_gguf *g, const char *key, double *out);
int si_gguf_get_bool(const struct si_gguf *g, const char *key, bool *out);
int si_gguf_get_str(const struct si_gguf *g, const char *key, struct si_gguf_str *out);
/* An array's element type and count. */
int si_gguf_get_arr(const struct si_gguf *g, const char *key, enum si_gguf_type *type,
                    uint64_t *n);

/*
 * Element i of an array of scalars or strings, as a scalar kv (its key is the
 * array's).  SI_E_INVALID when kv is no such array or i is out of range.
 */
int si_gguf_arr_elem(const struct si_gguf_kv *kv, uint64_t i, struct si_gguf_kv *elem);

/* "UINT32", "STRING", ... or "?" */
const char *si_gguf_type_name(uint32_t type);
/* Size of a scalar of this type, 0 for STRING, ARRAY and unknown types. */
size_t si_gguf_type_size(uint32_t type);

/* True when the string equals the NUL-terminated `s`. */
bool si_gguf_str_eq(struct si_gguf_str a, const char *s);

#endif /* SI_MODEL_GGUF_H */
