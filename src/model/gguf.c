/* gguf.c - a GGUF reader that trusts nothing in the file. */
#include "model/gguf.h"

#include "internal.h"
#include "model/types.h"
#include "starinfer.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the GGUF reader assumes a little-endian host"
#endif

#define MAX_KEY_LEN 65535u
#define MAX_TENSOR_NAME_LEN 255u
#define MAX_ARRAY_DEPTH 8

/* A cursor over the file image; every read goes through need(). */
struct reader {
    const uint8_t *p;
    size_t size;
    size_t pos;
    char *err;
    size_t err_size;
};

static int fail(struct reader *r, int status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int fail(struct reader *r, int status, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    si__verrf(r->err, r->err_size, status, fmt, ap);
    va_end(ap);
    return status;
}

/* Room for a name from the file in a message: a whole printable tensor name
 * (255 bytes), the first 290 or so of anything else. */
#define SHOWN_SIZE 300

/*
 * s[0..len) for a message: printable ASCII as is, other bytes and quotes as
 * \xNN (a name read from a corrupt file may hold anything, a terminal's
 * escape sequences included), cut with "..." when it does not fit out[cap]
 * (cap >= 4).  Returns out.
 */
static const char *shown(char *out, size_t cap, const char *s, uint64_t len)
{
    uint64_t width = 0;
    for (uint64_t i = 0; i < len; i++) {
        const unsigned char c = (unsigned char)s[i];
        width += c >= 0x20 && c < 0x7f && c != '\'' ? 1 : 4;
    }
    const size_t room = width < cap ? cap - 1 : cap - 4; /* "..." when cut */
    size_t n = 0;
    for (uint64_t i = 0; i < len; i++) {
        const unsigned char c = (unsigned char)s[i];
        const bool plain = c >= 0x20 && c < 0x7f && c != '\'';
        if (n + (plain ? 1 : 4) > room)
            break;
        n += (size_t)snprintf(out + n, cap - n, plain ? "%c" : "\\x%02x", c);
    }
    strcpy(out + n, width < cap ? "" : "...");
    return out;
}

static int need(struct reader *r, uint64_t n, const char *what)
{
    if (n > r->size - r->pos)
        return fail(r, SI_E_FORMAT,
                    "truncated file: %s needs %" PRIu64 " bytes at offset %zu, %zu left", what, n,
                    r->pos, r->size - r->pos);
    return SI_OK;
}

static int read_bytes(struct reader *r, void *dst, size_t n, const char *what)
{
    int rc = need(r, n, what);
    if (rc != SI_OK)
        return rc;
    memcpy(dst, r->p + r->pos, n);
    r->pos += n;
    return SI_OK;
}

static int read_u32(struct reader *r, uint32_t *v, const char *what)
{
    return read_bytes(r, v, sizeof *v, what);
}

static int read_u64(struct reader *r, uint64_t *v, const char *what)
{
    return read_bytes(r, v, sizeof *v, what);
}

static int read_str(struct reader *r, struct si_gguf_str *s, const char *what)
{
    int rc = read_u64(r, &s->len, what);
    if (rc != SI_OK)
        return rc;
    if ((rc = need(r, s->len, what)) != SI_OK)
        return rc;
    s->data = (const char *)r->p + r->pos;
    r->pos += (size_t)s->len;
    return SI_OK;
}

const char *si_gguf_type_name(uint32_t type)
{
    static const char *const names[SI_GGUF_TYPE_COUNT] = {
        "UINT8", "INT8", "UINT16",  "INT16", "UINT32", "INT32",  "FLOAT32",
        "BOOL",  "STRING", "ARRAY", "UINT64", "INT64", "FLOAT64",
    };
    return type < SI_GGUF_TYPE_COUNT ? names[type] : "?";
}

size_t si_gguf_type_size(uint32_t type)
{
    switch (type) {
    case SI_GGUF_UINT8:
    case SI_GGUF_INT8:
    case SI_GGUF_BOOL:
        return 1;
    case SI_GGUF_UINT16:
    case SI_GGUF_INT16:
        return 2;
    case SI_GGUF_UINT32:
    case SI_GGUF_INT32:
    case SI_GGUF_FLOAT32:
        return 4;
    case SI_GGUF_UINT64:
    case SI_GGUF_INT64:
    case SI_GGUF_FLOAT64:
        return 8;
    default:
        return 0;
    }
}

bool si_gguf_str_eq(struct si_gguf_str a, const char *s)
{
    size_t n = strlen(s);
    return a.len == n && memcmp(a.data, s, n) == 0;
}

/* Decode a scalar at p into the kv's value union. */
static void decode_scalar(struct si_gguf_kv *kv, const uint8_t *p)
{
    switch (kv->type) {
    case SI_GGUF_UINT8:
    case SI_GGUF_BOOL:
        kv->v.u64 = p[0];
        break;
    case SI_GGUF_INT8:
        kv->v.i64 = (int8_t)p[0];
        break;
    case SI_GGUF_UINT16: {
        uint16_t x;
        memcpy(&x, p, 2);
        kv->v.u64 = x;
        break;
    }
    case SI_GGUF_INT16: {
        int16_t x;
        memcpy(&x, p, 2);
        kv->v.i64 = x;
        break;
    }
    case SI_GGUF_UINT32: {
        uint32_t x;
        memcpy(&x, p, 4);
        kv->v.u64 = x;
        break;
    }
    case SI_GGUF_INT32: {
        int32_t x;
        memcpy(&x, p, 4);
        kv->v.i64 = x;
        break;
    }
    case SI_GGUF_FLOAT32: {
        float x;
        memcpy(&x, p, 4);
        kv->v.f64 = x;
        break;
    }
    case SI_GGUF_UINT64:
        memcpy(&kv->v.u64, p, 8);
        break;
    case SI_GGUF_INT64:
        memcpy(&kv->v.i64, p, 8);
        break;
    case SI_GGUF_FLOAT64:
        memcpy(&kv->v.f64, p, 8);
        break;
    default:
        break;
    }
}

/*
 * Skip over an array body (element type and count already read), checking
 * every element.  When `strs` is not NULL the strings are recorded there.
 */
static int skip_array(struct reader *r, uint32_t etype, uint64_t n, struct si_gguf_str *strs,
                      int depth)
{
    int rc;
    if (etype >= SI_GGUF_TYPE_COUNT)
        return fail(r, SI_E_FORMAT, "array of unknown value type %" PRIu32 " at offset %zu",
                    etype, r->pos);
    size_t esz = si_gguf_type_size(etype);
    if (esz != 0) {
        if (n > (r->size - r->pos) / esz)
            return fail(r, SI_E_FORMAT,
                        "truncated file: array of %" PRIu64 " %s values at offset %zu", n,
                        si_gguf_type_name(etype), r->pos);
        r->pos += (size_t)n * esz;
        return SI_OK;
    }
    if (etype == SI_GGUF_STRING) {
        for (uint64_t i = 0; i < n; i++) {
            struct si_gguf_str s;
            if ((rc = read_str(r, &s, "array string")) != SI_OK)
                return rc;
            if (strs != NULL)
                strs[i] = s;
        }
        return SI_OK;
    }
    /* Nested arrays: each element is (type, count, body). */
    if (depth >= MAX_ARRAY_DEPTH)
        return fail(r, SI_E_FORMAT, "arrays nested deeper than %d levels at offset %zu",
                    MAX_ARRAY_DEPTH, r->pos);
    for (uint64_t i = 0; i < n; i++) {
        uint32_t t;
        uint64_t m;
        if ((rc = read_u32(r, &t, "nested array type")) != SI_OK ||
            (rc = read_u64(r, &m, "nested array count")) != SI_OK ||
            (rc = skip_array(r, t, m, NULL, depth + 1)) != SI_OK)
            return rc;
    }
    return SI_OK;
}

static int read_kv(struct reader *r, struct si_gguf_kv *kv, uint64_t index)
{
    int rc;
    uint32_t type;
    if ((rc = read_str(r, &kv->key, "metadata key")) != SI_OK)
        return rc;
    if (kv->key.len == 0 || kv->key.len > MAX_KEY_LEN)
        return fail(r, SI_E_FORMAT, "metadata key #%" PRIu64 " has invalid length %" PRIu64, index,
                    kv->key.len);
    if ((rc = read_u32(r, &type, "metadata value type")) != SI_OK)
        return rc;
    char key[SHOWN_SIZE];
    shown(key, sizeof key, kv->key.data, kv->key.len);
    if (type >= SI_GGUF_TYPE_COUNT)
        return fail(r, SI_E_FORMAT, "metadata key '%s' has unknown value type %" PRIu32, key,
                    type);
    kv->type = (enum si_gguf_type)type;

    size_t esz = si_gguf_type_size(type);
    if (esz != 0) {
        if ((rc = need(r, esz, "metadata value")) != SI_OK)
            return rc;
        decode_scalar(kv, r->p + r->pos);
        r->pos += esz;
        if (type == SI_GGUF_BOOL && kv->v.u64 > 1)
            return fail(r, SI_E_FORMAT, "metadata key '%s': bool value %" PRIu64, key,
                        kv->v.u64);
        return SI_OK;
    }
    if (type == SI_GGUF_STRING)
        return read_str(r, &kv->v.str, "metadata string");

    /* An array. */
    uint32_t etype;
    if ((rc = read_u32(r, &etype, "array type")) != SI_OK ||
        (rc = read_u64(r, &kv->arr_n, "array count")) != SI_OK)
        return rc;
    if (etype >= SI_GGUF_TYPE_COUNT)
        return fail(r, SI_E_FORMAT, "metadata key '%s': array of unknown type %" PRIu32, key,
                    etype);
    kv->arr_type = (enum si_gguf_type)etype;
    kv->arr_data = r->p + r->pos;
    if (etype == SI_GGUF_STRING) {
        /* Each string takes at least its 8-byte length: bound the count by
         * what is left before allocating. */
        if (kv->arr_n > (r->size - r->pos) / 8)
            return fail(r, SI_E_FORMAT,
                        "truncated file: metadata key '%s' claims %" PRIu64 " strings", key,
                        kv->arr_n);
        kv->strs = calloc(kv->arr_n ? (size_t)kv->arr_n : 1, sizeof *kv->strs);
        if (kv->strs == NULL)
            return fail(r, SI_E_NOMEM, "out of memory reading '%s'", key);
    }
    return skip_array(r, etype, kv->arr_n, kv->strs, 1);
}

static int read_tensor_info(struct reader *r, struct si_gguf_tensor *t, uint64_t index,
                            bool powerinfer)
{
    int rc;
    if ((rc = read_str(r, &t->name, "tensor name")) != SI_OK)
        return rc;
    if (t->name.len == 0 || t->name.len > MAX_TENSOR_NAME_LEN)
        return fail(r, SI_E_FORMAT, "tensor #%" PRIu64 " has a name of invalid length %" PRIu64,
                    index, t->name.len);
    char nm[SHOWN_SIZE];
    shown(nm, sizeof nm, t->name.data, t->name.len);
    if ((rc = read_u32(r, &t->n_dims, "tensor dimension count")) != SI_OK)
        return rc;
    if (t->n_dims == 0 || t->n_dims > SI_GGUF_MAX_DIMS)
        return fail(r, SI_E_FORMAT, "tensor '%s' has %" PRIu32 " dimensions (1 to %d allowed)",
                    nm, t->n_dims, SI_GGUF_MAX_DIMS);
    int64_t nelem = 1;
    for (uint32_t d = 0; d < SI_GGUF_MAX_DIMS; d++) {
        uint64_t ne = 1;
        if (d < t->n_dims && (rc = read_u64(r, &ne, "tensor dimension")) != SI_OK)
            return rc;
        if (ne > (uint64_t)INT64_MAX || __builtin_mul_overflow(nelem, (int64_t)ne, &nelem))
            return fail(r, SI_E_FORMAT, "tensor '%s' has too many elements", nm);
        t->ne[d] = (int64_t)ne;
    }
    if ((rc = read_u32(r, &t->type, "tensor type")) != SI_OK ||
        (rc = read_u64(r, &t->offset, "tensor offset")) != SI_OK)
        return rc;
    if (powerinfer) /* its ggml's numbers (types.h) */
        t->type = si_type_from_pwri(t->type);
    const struct si_type_traits *tr = si_type_get(t->type);
    if (tr == NULL)
        return fail(r, SI_E_FORMAT, "tensor '%s' has unknown type %" PRIu32, nm, t->type);
    size_t row;
    if (!si_type_row_size(t->type, t->ne[0], &row))
        return fail(r, SI_E_FORMAT,
                    "tensor '%s': row of %" PRId64 " elements is not a whole number of %s "
                    "blocks of %" PRId64,
                    nm, t->ne[0], tr->name, tr->block);
    /* Rows on their own: with ne[0] == 0 the element count above is 0 and
     * says nothing about the product of the other dimensions. */
    int64_t rows = 1;
    for (uint32_t d = 1; d < SI_GGUF_MAX_DIMS; d++)
        if (__builtin_mul_overflow(rows, t->ne[d], &rows))
            return fail(r, SI_E_FORMAT, "tensor '%s' has too many rows", nm);
    if (row != 0 && (uint64_t)rows > SIZE_MAX / row)
        return fail(r, SI_E_FORMAT, "tensor '%s' is too large", nm);
    t->nbytes = row * (size_t)rows;
    return SI_OK;
}

/* FNV-1a over a string, for the duplicate checks. */
static uint64_t hash_str(struct si_gguf_str s)
{
    uint64_t h = 1469598103934665603u;
    for (uint64_t i = 0; i < s.len; i++)
        h = (h ^ (uint8_t)s.data[i]) * 1099511628211u;
    return h;
}

/*
 * Index of the first string equal to an earlier one, -1 when all differ, or
 * -2 when out of memory.  String i is the struct si_gguf_str at byte
 * `offset` of item i of the array `items` (items `stride` bytes apart).
 */
static int64_t find_duplicate(const void *items, size_t stride, size_t offset, uint64_t n)
{
    if (n < 2)
        return -1;
    size_t cap = 16;
    while (cap < 2 * n)
        cap *= 2;
    int64_t *slots = malloc(cap * sizeof *slots);
    if (slots == NULL)
        return -2;
    for (size_t i = 0; i < cap; i++)
        slots[i] = -1;
    int64_t dup = -1;
    for (uint64_t i = 0; i < n && dup < 0; i++) {
        const struct si_gguf_str *s =
            (const struct si_gguf_str *)((const char *)items + i * stride + offset);
        size_t h = (size_t)hash_str(*s) & (cap - 1);
        while (slots[h] >= 0) {
            const struct si_gguf_str *o =
                (const struct si_gguf_str *)((const char *)items + (size_t)slots[h] * stride +
                                             offset);
            if (o->len == s->len && memcmp(o->data, s->data, s->len) == 0) {
                dup = (int64_t)i;
                break;
            }
            h = (h + 1) & (cap - 1);
        }
        slots[h] = (int64_t)i;
    }
    free(slots);
    return dup;
}

static int parse(struct si_gguf *g, struct reader *r)
{
    int rc;
    char magic[4];
    if (r->size == 0)
        return fail(r, SI_E_FORMAT, "empty file");
    if ((rc = read_bytes(r, magic, 4, "magic")) != SI_OK)
        return rc;
    if (memcmp(magic, "GGUF", 4) == 0) {
        g->powerinfer = false;
    } else if (memcmp(magic, "PWRI", 4) == 0) {
        g->powerinfer = true;
    } else {
        char m[20];
        return fail(r, SI_E_FORMAT, "not a GGUF file (magic '%s')", shown(m, sizeof m, magic, 4));
    }
    memcpy(g->magic, magic, 4);
    g->magic[4] = '\0';

    if ((rc = read_u32(r, &g->version, "version")) != SI_OK)
        return rc;
    if (g->version == 1)
        return fail(r, SI_E_UNSUPPORTED, "GGUF version 1 is not supported (2 and 3 are)");
    if (g->version != 2 && g->version != 3) {
        if ((g->version & 0xffff) == 0)
            return fail(r, SI_E_UNSUPPORTED, "big-endian GGUF files are not supported");
        return fail(r, SI_E_UNSUPPORTED, "unsupported GGUF version %" PRIu32 " (2 and 3 are)",
                    g->version);
    }
    if ((rc = read_u64(r, &g->n_tensors, "tensor count")) != SI_OK ||
        (rc = read_u64(r, &g->n_kv, "metadata count")) != SI_OK)
        return rc;

    /* The smallest key-value takes 8 (key length) + 1 (key) + 4 (type) + 1
     * bytes and the smallest tensor info 8 + 1 + 4 + 8 + 4 + 8: counts larger
     * than the rest of the file allows are corrupt, and bounding them first
     * keeps a hostile header from asking for huge allocations. */
    const size_t left = r->size - r->pos;
    if (g->n_kv > left / 14)
        return fail(r, SI_E_FORMAT, "corrupt header: %" PRIu64 " metadata entries in %zu bytes",
                    g->n_kv, left);
    if (g->n_tensors > left / 33)
        return fail(r, SI_E_FORMAT, "corrupt header: %" PRIu64 " tensors in %zu bytes",
                    g->n_tensors, left);

    g->kv = calloc(g->n_kv ? (size_t)g->n_kv : 1, sizeof *g->kv);
    g->tensors = calloc(g->n_tensors ? (size_t)g->n_tensors : 1, sizeof *g->tensors);
    if (g->kv == NULL || g->tensors == NULL)
        return fail(r, SI_E_NOMEM, "out of memory for the file's index");

    for (uint64_t i = 0; i < g->n_kv; i++)
        if ((rc = read_kv(r, &g->kv[i], i)) != SI_OK)
            return rc;
    int64_t dup = find_duplicate(g->kv, sizeof *g->kv, offsetof(struct si_gguf_kv, key), g->n_kv);
    if (dup == -2)
        return fail(r, SI_E_NOMEM, "out of memory checking metadata keys");
    char name[SHOWN_SIZE];
    if (dup >= 0)
        return fail(r, SI_E_FORMAT, "duplicate metadata key '%s'",
                    shown(name, sizeof name, g->kv[dup].key.data, g->kv[dup].key.len));

    g->alignment = SI_GGUF_DEFAULT_ALIGNMENT;
    int64_t ia = si_gguf_find_key(g, "general.alignment");
    if (ia >= 0) {
        const struct si_gguf_kv *kv = &g->kv[ia];
        if (kv->type != SI_GGUF_UINT32)
            return fail(r, SI_E_FORMAT, "general.alignment has type %s (UINT32 expected)",
                        si_gguf_type_name(kv->type));
        if (kv->v.u64 == 0 || (kv->v.u64 & (kv->v.u64 - 1)) != 0)
            return fail(r, SI_E_FORMAT, "general.alignment %" PRIu64 " is not a power of two",
                        kv->v.u64);
        g->alignment = kv->v.u64;
    }

    for (uint64_t i = 0; i < g->n_tensors; i++)
        if ((rc = read_tensor_info(r, &g->tensors[i], i, g->powerinfer)) != SI_OK)
            return rc;
    dup = find_duplicate(g->tensors, sizeof *g->tensors, offsetof(struct si_gguf_tensor, name),
                         g->n_tensors);
    if (dup == -2)
        return fail(r, SI_E_NOMEM, "out of memory checking tensor names");
    if (dup >= 0)
        return fail(r, SI_E_FORMAT, "duplicate tensor '%s'",
                    shown(name, sizeof name, g->tensors[dup].name.data, g->tensors[dup].name.len));

    /* The data section starts at the next multiple of the alignment. */
    uint64_t pad = (g->alignment - r->pos % g->alignment) % g->alignment;
    if (g->n_tensors > 0 && pad > r->size - r->pos)
        return fail(r, SI_E_FORMAT, "truncated file: no data section after the header");
    g->data_offset = r->pos + (size_t)(pad <= r->size - r->pos ? pad : 0);
    const size_t avail = r->size - g->data_offset;
    g->data_size = 0;
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        struct si_gguf_tensor *t = &g->tensors[i];
        if (t->offset % g->alignment != 0)
            return fail(r, SI_E_FORMAT,
                        "tensor '%s' offset %" PRIu64
                        " is not a multiple of the alignment %" PRIu64,
                        shown(name, sizeof name, t->name.data, t->name.len), t->offset,
                        g->alignment);
        if (t->offset > avail || t->nbytes > avail - t->offset)
            return fail(r, SI_E_FORMAT,
                        "truncated file: tensor '%s' (%zu bytes at data offset %" PRIu64
                        ") ends past the end of the file (data section has %zu bytes)",
                        shown(name, sizeof name, t->name.data, t->name.len), t->nbytes,
                        t->offset, avail);
        t->data = r->p + g->data_offset + t->offset;
        if (t->offset + t->nbytes > g->data_size)
            g->data_size = (size_t)(t->offset + t->nbytes);
    }
    g->base = r->p;
    g->size = r->size;
    return SI_OK;
}

int si_gguf_parse(struct si_gguf **out, const void *buf, size_t size, char *err, size_t err_size)
{
    *out = NULL;
    struct si_gguf *g = calloc(1, sizeof *g);
    struct reader r = {.p = buf, .size = size, .pos = 0, .err = err, .err_size = err_size};
    if (g == NULL)
        return fail(&r, SI_E_NOMEM, "out of memory");
    int rc = parse(g, &r);
    if (rc != SI_OK) {
        si_gguf_free(g);
        return rc;
    }
    *out = g;
    return SI_OK;
}

int si_gguf_open(struct si_gguf **out, const char *path, char *err, size_t err_size)
{
    *out = NULL;
    char msg[512] = "";
    int rc = SI_OK;
    void *map = NULL;
    size_t size = 0;

    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        snprintf(msg, sizeof msg, "%s", strerror(errno));
        rc = errno == ENOENT ? SI_E_NOT_FOUND : SI_E_IO;
        goto done;
    }
    struct stat st;
    if (fstat(fd, &st) != 0) {
        snprintf(msg, sizeof msg, "%s", strerror(errno));
        rc = SI_E_IO;
        goto done;
    }
    if (!S_ISREG(st.st_mode)) {
        snprintf(msg, sizeof msg, "not a regular file");
        rc = SI_E_IO;
        goto done;
    }
    size = (size_t)st.st_size;
    if (size > 0) {
        map = mmap(NULL, size, PROT_READ, MAP_SHARED, fd, 0);
        if (map == MAP_FAILED) {
            map = NULL;
            snprintf(msg, sizeof msg, "cannot map file: %s", strerror(errno));
            rc = SI_E_IO;
            goto done;
        }
    }
    rc = si_gguf_parse(out, map, size, msg, sizeof msg);
    if (rc == SI_OK) {
        (*out)->map = map;
        map = NULL;
    }
done:
    if (map != NULL)
        munmap(map, size);
    if (fd >= 0)
        close(fd);
    if (rc != SI_OK && err != NULL && err_size > 0)
        snprintf(err, err_size, "%s: %s", path, msg);
    return rc;
}

void si_gguf_free(struct si_gguf *g)
{
    if (g == NULL)
        return;
    if (g->kv != NULL)
        for (uint64_t i = 0; i < g->n_kv; i++)
            free(g->kv[i].strs);
    free(g->kv);
    free(g->tensors);
    if (g->map != NULL)
        munmap(g->map, g->size);
    free(g);
}

int64_t si_gguf_find_key(const struct si_gguf *g, const char *key)
{
    for (uint64_t i = 0; i < g->n_kv; i++)
        if (si_gguf_str_eq(g->kv[i].key, key))
            return (int64_t)i;
    return -1;
}

int64_t si_gguf_find_tensor(const struct si_gguf *g, const char *name)
{
    for (uint64_t i = 0; i < g->n_tensors; i++)
        if (si_gguf_str_eq(g->tensors[i].name, name))
            return (int64_t)i;
    return -1;
}

static const struct si_gguf_kv *get(const struct si_gguf *g, const char *key)
{
    int64_t i = si_gguf_find_key(g, key);
    return i < 0 ? NULL : &g->kv[i];
}

static bool is_unsigned(enum si_gguf_type t)
{
    return t == SI_GGUF_UINT8 || t == SI_GGUF_UINT16 || t == SI_GGUF_UINT32 || t == SI_GGUF_UINT64;
}

static bool is_signed(enum si_gguf_type t)
{
    return t == SI_GGUF_INT8 || t == SI_GGUF_INT16 || t == SI_GGUF_INT32 || t == SI_GGUF_INT64;
}

int si_gguf_get_u64(const struct si_gguf *g, const char *key, uint64_t *out)
{
    const struct si_gguf_kv *kv = get(g, key);
    if (kv == NULL)
        return SI_E_NOT_FOUND;
    if (is_unsigned(kv->type)) {
        *out = kv->v.u64;
        return SI_OK;
    }
    if (is_signed(kv->type) && kv->v.i64 >= 0) {
        *out = (uint64_t)kv->v.i64;
        return SI_OK;
    }
    return SI_E_FORMAT;
}

int si_gguf_get_u32(const struct si_gguf *g, const char *key, uint32_t *out)
{
    uint64_t v;
    int rc = si_gguf_get_u64(g, key, &v);
    if (rc != SI_OK)
        return rc;
    if (v > UINT32_MAX)
        return SI_E_FORMAT;
    *out = (uint32_t)v;
    return SI_OK;
}

int si_gguf_kv_i64(const struct si_gguf_kv *kv, int64_t *out)
{
    if (is_signed(kv->type)) {
        *out = kv->v.i64;
        return SI_OK;
    }
    if (is_unsigned(kv->type) && kv->v.u64 <= (uint64_t)INT64_MAX) {
        *out = (int64_t)kv->v.u64;
        return SI_OK;
    }
    return SI_E_FORMAT;
}

int si_gguf_get_i64(const struct si_gguf *g, const char *key, int64_t *out)
{
    const struct si_gguf_kv *kv = get(g, key);
    return kv == NULL ? SI_E_NOT_FOUND : si_gguf_kv_i64(kv, out);
}

int si_gguf_get_f64(const struct si_gguf *g, const char *key, double *out)
{
    const struct si_gguf_kv *kv = get(g, key);
    if (kv == NULL)
        return SI_E_NOT_FOUND;
    if (kv->type != SI_GGUF_FLOAT32 && kv->type != SI_GGUF_FLOAT64)
        return SI_E_FORMAT;
    *out = kv->v.f64;
    return SI_OK;
}

int si_gguf_get_bool(const struct si_gguf *g, const char *key, bool *out)
{
    const struct si_gguf_kv *kv = get(g, key);
    if (kv == NULL)
        return SI_E_NOT_FOUND;
    if (kv->type != SI_GGUF_BOOL)
        return SI_E_FORMAT;
    *out = kv->v.u64 != 0;
    return SI_OK;
}

int si_gguf_get_str(const struct si_gguf *g, const char *key, struct si_gguf_str *out)
{
    const struct si_gguf_kv *kv = get(g, key);
    if (kv == NULL)
        return SI_E_NOT_FOUND;
    if (kv->type != SI_GGUF_STRING)
        return SI_E_FORMAT;
    *out = kv->v.str;
    return SI_OK;
}

int si_gguf_get_arr(const struct si_gguf *g, const char *key, enum si_gguf_type *type,
                    uint64_t *n)
{
    const struct si_gguf_kv *kv = get(g, key);
    if (kv == NULL)
        return SI_E_NOT_FOUND;
    if (kv->type != SI_GGUF_ARRAY)
        return SI_E_FORMAT;
    *type = kv->arr_type;
    *n = kv->arr_n;
    return SI_OK;
}

int si_gguf_arr_elem(const struct si_gguf_kv *kv, uint64_t i, struct si_gguf_kv *elem)
{
    if (kv->type != SI_GGUF_ARRAY || i >= kv->arr_n)
        return SI_E_INVALID;
    memset(elem, 0, sizeof *elem);
    elem->key = kv->key;
    elem->type = kv->arr_type;
    if (kv->arr_type == SI_GGUF_STRING) {
        elem->v.str = kv->strs[i];
        return SI_OK;
    }
    size_t esz = si_gguf_type_size(kv->arr_type);
    if (esz == 0)
        return SI_E_INVALID;
    decode_scalar(elem, kv->arr_data + i * esz);
    return SI_OK;
}
