/* gguf_write.c - writing GGUF files through a temporary file and a rename. */
#include "model/gguf_write.h"

#include "model/types.h"
#include "internal.h"
#include "starinfer.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the GGUF writer assumes a little-endian host"
#endif

/* The reader's limits (gguf.c): files the writer makes must pass them. */
#define MAX_KEY_LEN 65535u
#define MAX_TENSOR_NAME_LEN 255u
#define MAX_ARRAY_DEPTH 8

/* Output is buffered in blocks of this size; tensor sources fill it too. */
#define OUT_BUF_SIZE ((size_t)4 << 20)

/* One metadata entry: the value's bytes exactly as they follow the type. */
struct kv_entry {
    char *key;
    size_t key_len;
    uint32_t type;
    uint8_t *body;
    size_t body_len;
};

struct tensor_entry {
    char *name;
    size_t name_len;
    uint32_t type;
    uint32_t n_dims;
    int64_t ne[SI_GGUF_MAX_DIMS];
    int64_t rows;    /* ne[1] * ne[2] * ne[3] */
    size_t row_size; /* bytes of one row of ne[0] elements */
    size_t nbytes;
    uint64_t offset; /* from the data section start, set by the write */
    const void *data;
    si_gguf_fill_fn fill;
    void *user;
};

struct si_gguf_writer {
    bool powerinfer;
    struct kv_entry *kv;
    size_t n_kv, cap_kv;
    struct tensor_entry *tensors;
    size_t n_tensors, cap_tensors;
};

/* ------------------------------------------------------ a growable byte string */

struct bytes {
    uint8_t *p;
    size_t n, cap;
    bool oom;
};

static void bytes_put(struct bytes *b, const void *src, size_t n)
{
    if (b->oom || n == 0)
        return;
    if (n > SIZE_MAX - b->n) {
        b->oom = true;
        return;
    }
    if (b->n + n > b->cap) {
        size_t cap = b->cap ? b->cap : 64;
        while (cap < b->n + n) {
            if (cap > SIZE_MAX / 2) {
                cap = b->n + n;
                break;
            }
            cap *= 2;
        }
        uint8_t *p = realloc(b->p, cap);
        if (p == NULL) {
            b->oom = true;
            return;
        }
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->n, src, n);
    b->n += n;
}

static void bytes_u32(struct bytes *b, uint32_t v) { bytes_put(b, &v, sizeof v); }
static void bytes_u64(struct bytes *b, uint64_t v) { bytes_put(b, &v, sizeof v); }

/* ------------------------------------------------------ building the description */

struct si_gguf_writer *si_gguf_writer_init(bool powerinfer)
{
    struct si_gguf_writer *w = calloc(1, sizeof *w);
    if (w != NULL)
        w->powerinfer = powerinfer;
    return w;
}

void si_gguf_writer_free(struct si_gguf_writer *w)
{
    if (w == NULL)
        return;
    for (size_t i = 0; i < w->n_kv; i++) {
        free(w->kv[i].key);
        free(w->kv[i].body);
    }
    free(w->kv);
    for (size_t i = 0; i < w->n_tensors; i++)
        free(w->tensors[i].name);
    free(w->tensors);
    free(w);
}

static bool grow(void **arr, size_t *cap, size_t n, size_t elem)
{
    if (n < *cap)
        return true;
    size_t c = *cap ? *cap * 2 : 16;
    if (c > SIZE_MAX / elem)
        return false;
    void *p = realloc(*arr, c * elem);
    if (p == NULL)
        return false;
    *arr = p;
    *cap = c;
    return true;
}

/* Store key = (type, body); takes the body's buffer in every case. */
static int set_value(struct si_gguf_writer *w, const char *key, uint32_t type, struct bytes *body)
{
    if (body->oom) {
        free(body->p);
        return SI_E_NOMEM;
    }
    size_t len = key != NULL ? strlen(key) : 0;
    if (w == NULL || len == 0 || len > MAX_KEY_LEN) {
        free(body->p);
        return SI_E_INVALID;
    }
    for (size_t i = 0; i < w->n_kv; i++) {
        struct kv_entry *e = &w->kv[i];
        if (e->key_len == len && memcmp(e->key, key, len) == 0) {
            free(e->body);
            e->type = type;
            e->body = body->p;
            e->body_len = body->n;
            return SI_OK;
        }
    }
    char *k = malloc(len + 1);
    if (k == NULL || !grow((void **)&w->kv, &w->cap_kv, w->n_kv, sizeof *w->kv)) {
        free(k);
        free(body->p);
        return SI_E_NOMEM;
    }
    memcpy(k, key, len + 1);
    w->kv[w->n_kv++] = (struct kv_entry){
        .key = k, .key_len = len, .type = type, .body = body->p, .body_len = body->n};
    return SI_OK;
}

static int set_scalar(struct si_gguf_writer *w, const char *key, uint32_t type, const void *v)
{
    struct bytes b = {0};
    bytes_put(&b, v, si_gguf_type_size(type));
    return set_value(w, key, type, &b);
}

int si_gguf_writer_set_u8(struct si_gguf_writer *w, const char *key, uint8_t v)
{
    return set_scalar(w, key, SI_GGUF_UINT8, &v);
}

int si_gguf_writer_set_i8(struct si_gguf_writer *w, const char *key, int8_t v)
{
    return set_scalar(w, key, SI_GGUF_INT8, &v);
}

int si_gguf_writer_set_u16(struct si_gguf_writer *w, const char *key, uint16_t v)
{
    return set_scalar(w, key, SI_GGUF_UINT16, &v);
}

int si_gguf_writer_set_i16(struct si_gguf_writer *w, const char *key, int16_t v)
{
    return set_scalar(w, key, SI_GGUF_INT16, &v);
}

int si_gguf_writer_set_u32(struct si_gguf_writer *w, const char *key, uint32_t v)
{
    return set_scalar(w, key, SI_GGUF_UINT32, &v);
}

int si_gguf_writer_set_i32(struct si_gguf_writer *w, const char *key, int32_t v)
{
    return set_scalar(w, key, SI_GGUF_INT32, &v);
}

int si_gguf_writer_set_u64(struct si_gguf_writer *w, const char *key, uint64_t v)
{
    return set_scalar(w, key, SI_GGUF_UINT64, &v);
}

int si_gguf_writer_set_i64(struct si_gguf_writer *w, const char *key, int64_t v)
{
    return set_scalar(w, key, SI_GGUF_INT64, &v);
}

int si_gguf_writer_set_f32(struct si_gguf_writer *w, const char *key, float v)
{
    return set_scalar(w, key, SI_GGUF_FLOAT32, &v);
}

int si_gguf_writer_set_f64(struct si_gguf_writer *w, const char *key, double v)
{
    return set_scalar(w, key, SI_GGUF_FLOAT64, &v);
}

int si_gguf_writer_set_bool(struct si_gguf_writer *w, const char *key, bool v)
{
    uint8_t b = v ? 1 : 0;
    return set_scalar(w, key, SI_GGUF_BOOL, &b);
}

int si_gguf_writer_set_str(struct si_gguf_writer *w, const char *key, const char *v)
{
    if (v == NULL)
        return SI_E_INVALID;
    struct bytes b = {0};
    bytes_u64(&b, strlen(v));
    bytes_put(&b, v, strlen(v));
    return set_value(w, key, SI_GGUF_STRING, &b);
}

int si_gguf_writer_set_arr(struct si_gguf_writer *w, const char *key, enum si_gguf_type type,
                           const void *data, uint64_t n)
{
    size_t esz = si_gguf_type_size((uint32_t)type);
    if (esz == 0 || (data == NULL && n > 0) || n > SIZE_MAX / esz)
        return SI_E_INVALID;
    /* The reader refuses a BOOL scalar other than 0 or 1; arrays keep to it too. */
    if (type == SI_GGUF_BOOL)
        for (uint64_t i = 0; i < n; i++)
            if (((const uint8_t *)data)[i] > 1)
                return SI_E_INVALID;
    struct bytes b = {0};
    bytes_u32(&b, (uint32_t)type);
    bytes_u64(&b, n);
    bytes_put(&b, data, (size_t)n * esz);
    return set_value(w, key, SI_GGUF_ARRAY, &b);
}

int si_gguf_writer_set_arr_str(struct si_gguf_writer *w, const char *key,
                               const char *const *strs, uint64_t n)
{
    if (strs == NULL && n > 0)
        return SI_E_INVALID;
    for (uint64_t i = 0; i < n; i++)
        if (strs[i] == NULL)
            return SI_E_INVALID;
    struct bytes b = {0};
    bytes_u32(&b, SI_GGUF_STRING);
    bytes_u64(&b, n);
    for (uint64_t i = 0; i < n && !b.oom; i++) {
        size_t len = strlen(strs[i]);
        bytes_u64(&b, len);
        bytes_put(&b, strs[i], len);
    }
    return set_value(w, key, SI_GGUF_ARRAY, &b);
}

/*
 * Bytes taken by an array body of n elements of etype at p (not past end), or
 * -1 when it does not fit.  The reader checked it already; this checks again
 * rather than trust a struct that a caller may have filled by hand.
 */
static int64_t array_extent(const uint8_t *p, const uint8_t *end, uint32_t etype, uint64_t n,
                            int depth)
{
    size_t left = (size_t)(end - p);
    size_t esz = si_gguf_type_size(etype);
    if (esz != 0)
        return n <= left / esz ? (int64_t)(n * esz) : -1;
    size_t pos = 0;
    if (etype == SI_GGUF_STRING) {
        for (uint64_t i = 0; i < n; i++) {
            uint64_t len;
            if (left - pos < 8)
                return -1;
            memcpy(&len, p + pos, 8);
            pos += 8;
            if (len > left - pos)
                return -1;
            pos += (size_t)len;
        }
        return (int64_t)pos;
    }
    if (etype != SI_GGUF_ARRAY || depth >= MAX_ARRAY_DEPTH)
        return -1;
    for (uint64_t i = 0; i < n; i++) {
        uint32_t t;
        uint64_t m;
        if (left - pos < 12)
            return -1;
        memcpy(&t, p + pos, 4);
        memcpy(&m, p + pos + 4, 8);
        pos += 12;
        int64_t sub = array_extent(p + pos, end, t, m, depth + 1);
        if (sub < 0)
            return -1;
        pos += (size_t)sub;
    }
    return (int64_t)pos;
}

/* The bytes of one kv's value as the file stores them after its type. */
static void encode_kv(const struct si_gguf *src, const struct si_gguf_kv *kv, struct bytes *b,
                      bool *bad)
{
    switch (kv->type) {
    case SI_GGUF_UINT8:
    case SI_GGUF_BOOL: {
        uint8_t v = (uint8_t)kv->v.u64;
        bytes_put(b, &v, 1);
        break;
    }
    case SI_GGUF_INT8: {
        int8_t v = (int8_t)kv->v.i64;
        bytes_put(b, &v, 1);
        break;
    }
    case SI_GGUF_UINT16: {
        uint16_t v = (uint16_t)kv->v.u64;
        bytes_put(b, &v, 2);
        break;
    }
    case SI_GGUF_INT16: {
        int16_t v = (int16_t)kv->v.i64;
        bytes_put(b, &v, 2);
        break;
    }
    case SI_GGUF_UINT32: {
        uint32_t v = (uint32_t)kv->v.u64;
        bytes_put(b, &v, 4);
        break;
    }
    case SI_GGUF_INT32: {
        int32_t v = (int32_t)kv->v.i64;
        bytes_put(b, &v, 4);
        break;
    }
    case SI_GGUF_FLOAT32: {
        float v = (float)kv->v.f64; /* exact: it was read from a float */
        bytes_put(b, &v, 4);
        break;
    }
    case SI_GGUF_UINT64:
        bytes_put(b, &kv->v.u64, 8);
        break;
    case SI_GGUF_INT64:
        bytes_put(b, &kv->v.i64, 8);
        break;
    case SI_GGUF_FLOAT64:
        bytes_put(b, &kv->v.f64, 8);
        break;
    case SI_GGUF_STRING:
        bytes_u64(b, kv->v.str.len);
        bytes_put(b, kv->v.str.data, (size_t)kv->v.str.len);
        break;
    case SI_GGUF_ARRAY: {
        const uint8_t *end = src->base + src->size;
        if (src->base == NULL || kv->arr_data < src->base || kv->arr_data > end) {
            *bad = true;
            return;
        }
        int64_t len = array_extent(kv->arr_data, end, kv->arr_type, kv->arr_n, 1);
        if (len < 0) {
            *bad = true;
            return;
        }
        bytes_u32(b, kv->arr_type);
        bytes_u64(b, kv->arr_n);
        bytes_put(b, kv->arr_data, (size_t)len);
        break;
    }
    default:
        *bad = true;
    }
}

int si_gguf_writer_copy_kv(struct si_gguf_writer *w, const struct si_gguf *src)
{
    if (w == NULL || src == NULL)
        return SI_E_INVALID;
    for (uint64_t i = 0; i < src->n_kv; i++) {
        const struct si_gguf_kv *kv = &src->kv[i];
        if (kv->key.len == 0 || kv->key.len > MAX_KEY_LEN)
            return SI_E_INVALID;
        char *key = malloc((size_t)kv->key.len + 1);
        if (key == NULL)
            return SI_E_NOMEM;
        memcpy(key, kv->key.data, (size_t)kv->key.len);
        key[kv->key.len] = '\0';
        struct bytes b = {0};
        bool bad = false;
        encode_kv(src, kv, &b, &bad);
        int rc;
        if (bad || strlen(key) != kv->key.len) { /* a NUL inside the key cannot be copied */
            free(b.p);
            rc = SI_E_INVALID;
        } else {
            rc = set_value(w, key, kv->type, &b);
        }
        free(key);
        if (rc != SI_OK)
            return rc;
    }
    return SI_OK;
}

static int add_tensor(struct si_gguf_writer *w, const char *name, uint32_t type, uint32_t n_dims,
                      const int64_t *ne, const void *data, si_gguf_fill_fn fill, void *user)
{
    if (w == NULL || name == NULL || ne == NULL)
        return SI_E_INVALID;
    size_t len = strlen(name);
    if (len == 0 || len > MAX_TENSOR_NAME_LEN || n_dims == 0 || n_dims > SI_GGUF_MAX_DIMS)
        return SI_E_INVALID;
    if (w->powerinfer && si_type_to_pwri(type) == UINT32_MAX)
        return SI_E_UNSUPPORTED; /* a number PowerInfer reads as another type */
    struct tensor_entry t = {.type = type, .n_dims = n_dims, .data = data, .fill = fill,
                             .user = user};
    t.rows = 1;
    for (uint32_t d = 0; d < SI_GGUF_MAX_DIMS; d++) {
        t.ne[d] = d < n_dims ? ne[d] : 1;
        if (t.ne[d] < 0)
            return SI_E_INVALID;
        if (d > 0 && __builtin_mul_overflow(t.rows, t.ne[d], &t.rows))
            return SI_E_INVALID;
    }
    /* Unknown type, or a row that is no whole number of blocks. */
    if (!si_type_row_size(type, t.ne[0], &t.row_size))
        return SI_E_INVALID;
    if (__builtin_mul_overflow(t.row_size, (size_t)t.rows, &t.nbytes))
        return SI_E_INVALID;
    /* The reader also multiplies all four dimensions into an int64_t. */
    int64_t nelem = t.ne[0];
    if (__builtin_mul_overflow(nelem, t.rows, &nelem))
        return SI_E_INVALID;
    if (t.nbytes > 0 && data == NULL && fill == NULL)
        return SI_E_INVALID;
    for (size_t i = 0; i < w->n_tensors; i++)
        if (w->tensors[i].name_len == len && memcmp(w->tensors[i].name, name, len) == 0)
            return SI_E_INVALID;
    t.name = malloc(len + 1);
    if (t.name == NULL ||
        !grow((void **)&w->tensors, &w->cap_tensors, w->n_tensors, sizeof *w->tensors)) {
        free(t.name);
        return SI_E_NOMEM;
    }
    memcpy(t.name, name, len + 1);
    t.name_len = len;
    w->tensors[w->n_tensors++] = t;
    return SI_OK;
}

int si_gguf_writer_add_tensor(struct si_gguf_writer *w, const char *name, uint32_t type,
                              uint32_t n_dims, const int64_t *ne, const void *data)
{
    return add_tensor(w, name, type, n_dims, ne, data, NULL, NULL);
}

int si_gguf_writer_add_tensor_cb(struct si_gguf_writer *w, const char *name, uint32_t type,
                                 uint32_t n_dims, const int64_t *ne, si_gguf_fill_fn fill,
                                 void *user)
{
    if (fill == NULL)
        return SI_E_INVALID;
    return add_tensor(w, name, type, n_dims, ne, NULL, fill, user);
}

/* ------------------------------------------------------ writing */

struct out {
    int fd;
    uint8_t *buf;
    size_t n;
    int err_no; /* the first write error, 0 while none */
};

static bool write_all(struct out *o, const uint8_t *p, size_t n)
{
    while (n > 0 && o->err_no == 0) {
        ssize_t k = write(o->fd, p, n > ((size_t)1 << 30) ? (size_t)1 << 30 : n);
        if (k < 0) {
            if (errno == EINTR)
                continue;
            o->err_no = errno;
        } else if (k == 0) {
            o->err_no = ENOSPC;
        } else {
            p += k;
            n -= (size_t)k;
        }
    }
    return o->err_no == 0;
}

static bool out_flush(struct out *o)
{
    bool ok = write_all(o, o->buf, o->n);
    o->n = 0;
    return ok;
}

static bool out_put(struct out *o, const void *src, size_t n)
{
    if (o->err_no != 0)
        return false;
    if (n > OUT_BUF_SIZE - o->n) {
        if (!out_flush(o))
            return false;
        if (n >= OUT_BUF_SIZE)
            return write_all(o, src, n);
    }
    memcpy(o->buf + o->n, src, n);
    o->n += n;
    return true;
}

static bool out_zeros(struct out *o, size_t n)
{
    static const uint8_t zeros[64];
    while (n > 0) {
        size_t k = n < sizeof zeros ? n : sizeof zeros;
        if (!out_put(o, zeros, k))
            return false;
        n -= k;
    }
    return true;
}

static bool out_str(struct out *o, const char *s, size_t len)
{
    uint64_t n = len;
    return out_put(o, &n, 8) && out_put(o, s, len);
}

/* The alignment the file will declare; SI_E_INVALID for a value the reader refuses. */
static int alignment_of(const struct si_gguf_writer *w, uint64_t *align)
{
    *align = SI_GGUF_DEFAULT_ALIGNMENT;
    for (size_t i = 0; i < w->n_kv; i++) {
        const struct kv_entry *e = &w->kv[i];
        if (e->key_len != 17 || memcmp(e->key, "general.alignment", 17) != 0)
            continue;
        if (e->type != SI_GGUF_UINT32)
            return SI_E_INVALID;
        uint32_t v;
        memcpy(&v, e->body, 4);
        if (v == 0 || (v & (v - 1)) != 0)
            return SI_E_INVALID;
        *align = v;
    }
    return SI_OK;
}

/* Tensor data: the caller's bytes, or rows from its source a buffer at a time. */
static int write_tensor_data(struct out *o, const struct tensor_entry *t, int *fill_rc)
{
    if (t->fill == NULL)
        return out_put(o, t->data, t->nbytes) ? SI_OK : SI_E_IO;
    int64_t chunk = t->row_size > 0 ? (int64_t)(OUT_BUF_SIZE / t->row_size) : t->rows;
    for (int64_t r = 0; r < t->rows;) {
        if (t->row_size > OUT_BUF_SIZE) {
            /* A row larger than the buffer: give the source a buffer of its own. */
            uint8_t *row = malloc(t->row_size);
            if (row == NULL)
                return *fill_rc = SI_E_NOMEM;
            int rc = t->fill(t->user, r, 1, row);
            bool ok = rc == SI_OK && out_put(o, row, t->row_size);
            free(row);
            if (rc != SI_OK)
                return *fill_rc = rc;
            if (!ok)
                return SI_E_IO;
            r++;
            continue;
        }
        int64_t n = t->rows - r < chunk ? t->rows - r : chunk;
        size_t bytes = (size_t)n * t->row_size;
        if (bytes > OUT_BUF_SIZE - o->n && !out_flush(o))
            return SI_E_IO;
        int rc = t->fill(t->user, r, n, o->buf + o->n);
        if (rc != SI_OK)
            return *fill_rc = rc;
        o->n += bytes;
        r += n;
    }
    return SI_OK;
}

/* Create a new file next to `path` for writing; its name goes to tmp. */
static int create_temp(const char *path, char *tmp, size_t tmp_size)
{
    static unsigned counter;
    for (int attempt = 0; attempt < 100; attempt++) {
        unsigned salt = (unsigned)time(NULL) ^ (counter++ * 2654435761u);
        int len = snprintf(tmp, tmp_size, "%s.tmp.%ld.%08x", path, (long)getpid(), salt);
        if (len < 0 || (size_t)len >= tmp_size) {
            errno = ENAMETOOLONG;
            return -1;
        }
        int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
        if (fd >= 0 || errno != EEXIST)
            return fd;
    }
    return -1;
}

int si_gguf_writer_write(struct si_gguf_writer *w, const char *path, char *err, size_t err_size)
{
    if (w == NULL || path == NULL || path[0] == '\0')
        return si__errf(err, err_size, SI_E_INVALID, "no writer or no path");
    uint64_t align;
    if (alignment_of(w, &align) != SI_OK)
        return si__errf(err, err_size, SI_E_INVALID,
                    "%s: general.alignment must be a UINT32 power of two", path);

    /* Where each tensor goes: aligned offsets from the data section start. */
    uint64_t data_size = 0;
    for (size_t i = 0; i < w->n_tensors; i++) {
        struct tensor_entry *t = &w->tensors[i];
        t->offset = data_size;
        uint64_t padded = t->nbytes + (align - t->nbytes % align) % align;
        if (padded < t->nbytes || __builtin_add_overflow(data_size, padded, &data_size))
            return si__errf(err, err_size, SI_E_INVALID, "%s: tensor data too large", path);
    }

    size_t plen = strlen(path);
    char *tmp = malloc(plen + 64);
    uint8_t *buf = malloc(OUT_BUF_SIZE);
    if (tmp == NULL || buf == NULL) {
        free(tmp);
        free(buf);
        return si__errf(err, err_size, SI_E_NOMEM, "%s: out of memory", path);
    }
    int rc = SI_OK;
    struct out o = {.fd = create_temp(path, tmp, plen + 64), .buf = buf};
    if (o.fd < 0) {
        rc = si__errf(err, err_size, SI_E_IO, "cannot create '%s' (as '%s'): %s", path, tmp,
                  strerror(errno));
        free(tmp);
        free(buf);
        return rc;
    }

    /* Header: magic, version, counts, metadata, tensor infos, padding. */
    uint32_t version = 3;
    uint64_t n_tensors = w->n_tensors, n_kv = w->n_kv;
    out_put(&o, w->powerinfer ? "PWRI" : "GGUF", 4);
    out_put(&o, &version, 4);
    out_put(&o, &n_tensors, 8);
    out_put(&o, &n_kv, 8);
    uint64_t header = 24;
    for (size_t i = 0; i < w->n_kv; i++) {
        const struct kv_entry *e = &w->kv[i];
        out_str(&o, e->key, e->key_len);
        out_put(&o, &e->type, 4);
        out_put(&o, e->body, e->body_len);
        header += 8 + e->key_len + 4 + e->body_len;
    }
    for (size_t i = 0; i < w->n_tensors; i++) {
        const struct tensor_entry *t = &w->tensors[i];
        out_str(&o, t->name, t->name_len);
        out_put(&o, &t->n_dims, 4);
        out_put(&o, t->ne, 8 * (size_t)t->n_dims);
        const uint32_t type = w->powerinfer ? si_type_to_pwri(t->type) : t->type;
        out_put(&o, &type, 4);
        out_put(&o, &t->offset, 8);
        header += 8 + t->name_len + 4 + 8 * (uint64_t)t->n_dims + 4 + 8;
    }
    out_zeros(&o, (size_t)((align - header % align) % align));

    /* Data: each tensor, then zeros up to the next multiple of the alignment. */
    int fill_rc = SI_OK;
    for (size_t i = 0; i < w->n_tensors && o.err_no == 0; i++) {
        const struct tensor_entry *t = &w->tensors[i];
        if (write_tensor_data(&o, t, &fill_rc) != SI_OK) {
            if (fill_rc != SI_OK) {
                rc = si__errf(err, err_size, fill_rc, "%s: tensor '%s': %s", path, t->name,
                          si_status_str(fill_rc));
                break;
            }
        }
        out_zeros(&o, (size_t)((align - t->nbytes % align) % align));
    }
    if (rc == SI_OK)
        out_flush(&o);
    if (rc == SI_OK && o.err_no == 0 && fsync(o.fd) != 0)
        o.err_no = errno;
    if (rc == SI_OK && o.err_no != 0)
        rc = si__errf(err, err_size, SI_E_IO, "writing '%s' failed: %s", path, strerror(o.err_no));
    if (close(o.fd) != 0 && rc == SI_OK)
        rc = si__errf(err, err_size, SI_E_IO, "writing '%s' failed: %s", path, strerror(errno));
    if (rc == SI_OK && rename(tmp, path) != 0)
        rc = si__errf(err, err_size, SI_E_IO, "cannot rename '%s' to '%s': %s", tmp, path,
                  strerror(errno));
    if (rc != SI_OK)
        unlink(tmp);
    free(tmp);
    free(buf);
    return rc;
}
