/*
 * test-gguf.c - the GGUF reader on files built here byte by byte: every value
 * type, both versions, PowerInfer's magic, and each way a file can be corrupt.
 * With STARINFER_TEST_MODEL set, also the real SmolLM2 file.
 */
#include "model/gguf.h"
#include "model/types.h"
#include "starinfer.h"
#include "test.h"

#include <dirent.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ------------------------------------------------------ a byte builder */
struct buf {
    uint8_t *p;
    size_t n, cap;
};

static void put(struct buf *b, const void *src, size_t n)
{
    if (b->n + n > b->cap) {
        b->cap = (b->n + n) * 2 + 64;
        b->p = realloc(b->p, b->cap);
        if (b->p == NULL)
            abort();
    }
    memcpy(b->p + b->n, src, n);
    b->n += n;
}
static void put_u8(struct buf *b, uint8_t v) { put(b, &v, 1); }
static void put_u32(struct buf *b, uint32_t v) { put(b, &v, 4); }
static void put_u64(struct buf *b, uint64_t v) { put(b, &v, 8); }
static void put_str(struct buf *b, const char *s)
{
    put_u64(b, strlen(s));
    put(b, s, strlen(s));
}
static void put_key(struct buf *b, const char *key, uint32_t type)
{
    put_str(b, key);
    put_u32(b, type);
}
static void pad_to(struct buf *b, size_t align)
{
    while (b->n % align)
        put_u8(b, 0);
}

/* Offsets of interesting fields in the file made by make_valid(). */
struct layout {
    size_t version, n_tensors, n_kv, first_kv_type, alignment_value, ti_ndims, ti_ne0, ti_type,
        ti_offset, t2_offset, data;
};

/*
 * A valid file with 18 keys: every scalar type, a string, arrays of u8, string and nested
 * arrays, general.alignment = 64, two tensors (F32 [4, 2] and Q8_0 [32]).
 */
static struct buf make_valid(const char magic[4], uint32_t version, struct layout *lo)
{
    struct buf b = {0};
    put(&b, magic, 4);
    lo->version = b.n;
    put_u32(&b, version);
    lo->n_tensors = b.n;
    put_u64(&b, 2);
    lo->n_kv = b.n;
    put_u64(&b, 18);

    put_str(&b, "general.architecture");
    lo->first_kv_type = b.n;
    put_u32(&b, SI_GGUF_STRING);
    put_str(&b, "llama");
    put_key(&b, "t.u8", SI_GGUF_UINT8);
    put_u8(&b, 200);
    put_key(&b, "t.i8", SI_GGUF_INT8);
    put_u8(&b, (uint8_t)-5);
    put_key(&b, "t.u16", SI_GGUF_UINT16);
    put(&b, &(uint16_t){65000}, 2);
    put_key(&b, "t.i16", SI_GGUF_INT16);
    put(&b, &(int16_t){-300}, 2);
    put_key(&b, "t.u32", SI_GGUF_UINT32);
    put_u32(&b, 4000000000u);
    put_key(&b, "t.i32", SI_GGUF_INT32);
    put(&b, &(int32_t){-7}, 4);
    put_key(&b, "t.f32", SI_GGUF_FLOAT32);
    put(&b, &(float){1.5f}, 4);
    put_key(&b, "t.bool", SI_GGUF_BOOL);
    put_u8(&b, 1);
    put_key(&b, "t.u64", SI_GGUF_UINT64);
    put_u64(&b, UINT64_MAX);
    put_key(&b, "t.i64", SI_GGUF_INT64);
    put(&b, &(int64_t){-1}, 8);
    put_key(&b, "t.f64", SI_GGUF_FLOAT64);
    put(&b, &(double){0.25}, 8);
    put_key(&b, "t.arr_u8", SI_GGUF_ARRAY);
    put_u32(&b, SI_GGUF_UINT8);
    put_u64(&b, 3);
    put(&b, "\x01\x02\x03", 3);
    put_key(&b, "t.arr_str", SI_GGUF_ARRAY);
    put_u32(&b, SI_GGUF_STRING);
    put_u64(&b, 3);
    put_str(&b, "a");
    put_str(&b, "");
    put_str(&b, "\xc3\xa9t\xc3\xa9");
    put_key(&b, "t.arr_nested", SI_GGUF_ARRAY);
    put_u32(&b, SI_GGUF_ARRAY);
    put_u64(&b, 2);
    put_u32(&b, SI_GGUF_INT32);
    put_u64(&b, 1);
    put_u32(&b, 9);
    put_u32(&b, SI_GGUF_STRING);
    put_u64(&b, 1);
    put_str(&b, "x");
    put_key(&b, "t.arr_empty", SI_GGUF_ARRAY);
    put_u32(&b, SI_GGUF_FLOAT32);
    put_u64(&b, 0);
    put_key(&b, "t.str", SI_GGUF_STRING);
    put_str(&b, "hello");
    put_key(&b, "general.alignment", SI_GGUF_UINT32);
    lo->alignment_value = b.n;
    put_u32(&b, 64);

    /* Tensor infos. */
    put_str(&b, "a.weight");
    lo->ti_ndims = b.n;
    put_u32(&b, 2);
    lo->ti_ne0 = b.n;
    put_u64(&b, 4);
    put_u64(&b, 2);
    lo->ti_type = b.n;
    put_u32(&b, SI_TYPE_F32);
    lo->ti_offset = b.n;
    put_u64(&b, 0);
    put_str(&b, "b.weight");
    put_u32(&b, 1);
    put_u64(&b, 32);
    put_u32(&b, SI_TYPE_Q8_0);
    lo->t2_offset = b.n;
    put_u64(&b, 64);

    pad_to(&b, 64);
    lo->data = b.n;
    for (int i = 0; i < 8; i++)
        put(&b, &(float){(float)i}, 4);
    pad_to(&b, 64);
    for (int i = 0; i < 34; i++)
        put_u8(&b, (uint8_t)i);
    return b;
}

static void set_u32(struct buf *b, size_t at, uint32_t v) { memcpy(b->p + at, &v, 4); }
static void set_u64(struct buf *b, size_t at, uint64_t v) { memcpy(b->p + at, &v, 8); }

/* Parse, expecting failure with `status` and a message containing `needle`. */
static void expect_error(const struct buf *b, int status, const char *needle, const char *what)
{
    struct si_gguf *g = (struct si_gguf *)1;
    char err[512] = "";
    int rc = si_gguf_parse(&g, b->p, b->n, err, sizeof err);
    CHECK(rc == status, "%s: status %d, expected %d (%s)", what, rc, status, err);
    CHECK(g == NULL, "%s: output not cleared", what);
    CHECK(strstr(err, needle) != NULL, "%s: message '%s' lacks '%s'", what, err, needle);
    CHECK(strchr(err, '\n') == NULL, "%s: message spans lines", what);
}

static void test_valid(const char magic[4], uint32_t version)
{
    struct layout lo;
    struct buf b = make_valid(magic, version, &lo);
    struct si_gguf *g = NULL;
    char err[512] = "";
    int rc = si_gguf_parse(&g, b.p, b.n, err, sizeof err);
    CHECK(rc == SI_OK, "valid %.4s v%u: %s", magic, version, err);
    if (rc != SI_OK) {
        free(b.p);
        return;
    }
    CHECK(g->version == version, "version %u", g->version);
    CHECK(g->powerinfer == (memcmp(magic, "PWRI", 4) == 0), "powerinfer flag");
    CHECK(strcmp(g->magic, magic[0] == 'P' ? "PWRI" : "GGUF") == 0, "magic %s", g->magic);
    CHECK(g->n_kv == 18 && g->n_tensors == 2, "counts %lu %lu", (unsigned long)g->n_kv,
          (unsigned long)g->n_tensors);
    CHECK(g->alignment == 64, "alignment %lu", (unsigned long)g->alignment);
    CHECK(g->data_offset == lo.data, "data offset %zu, expected %zu", g->data_offset, lo.data);

    uint64_t u;
    int64_t i;
    double f;
    bool bo;
    uint32_t u32;
    struct si_gguf_str s;
    CHECK(si_gguf_get_u64(g, "t.u8", &u) == SI_OK && u == 200, "u8");
    CHECK(si_gguf_get_i64(g, "t.i8", &i) == SI_OK && i == -5, "i8");
    CHECK(si_gguf_get_u64(g, "t.u16", &u) == SI_OK && u == 65000, "u16");
    CHECK(si_gguf_get_i64(g, "t.i16", &i) == SI_OK && i == -300, "i16");
    CHECK(si_gguf_get_u32(g, "t.u32", &u32) == SI_OK && u32 == 4000000000u, "u32");
    CHECK(si_gguf_get_i64(g, "t.i32", &i) == SI_OK && i == -7, "i32");
    CHECK(si_gguf_get_f64(g, "t.f32", &f) == SI_OK && f == 1.5, "f32");
    CHECK(si_gguf_get_bool(g, "t.bool", &bo) == SI_OK && bo, "bool");
    CHECK(si_gguf_get_u64(g, "t.u64", &u) == SI_OK && u == UINT64_MAX, "u64");
    CHECK(si_gguf_get_i64(g, "t.i64", &i) == SI_OK && i == -1, "i64");
    CHECK(si_gguf_get_f64(g, "t.f64", &f) == SI_OK && f == 0.25, "f64");
    CHECK(si_gguf_get_str(g, "t.str", &s) == SI_OK && si_gguf_str_eq(s, "hello"), "str");
    CHECK(si_gguf_get_str(g, "general.architecture", &s) == SI_OK && si_gguf_str_eq(s, "llama"),
          "architecture");
    /* Conversions that must be refused. */
    CHECK(si_gguf_get_u32(g, "t.u64", &u32) == SI_E_FORMAT, "u64 max does not fit u32");
    CHECK(si_gguf_get_u64(g, "t.i32", &u) == SI_E_FORMAT, "negative to unsigned");
    CHECK(si_gguf_get_i64(g, "t.u64", &i) == SI_E_FORMAT, "u64 max to i64");
    CHECK(si_gguf_get_f64(g, "t.str", &f) == SI_E_FORMAT, "string as float");
    CHECK(si_gguf_get_u64(g, "no.such.key", &u) == SI_E_NOT_FOUND, "missing key");

    enum si_gguf_type at;
    uint64_t an;
    CHECK(si_gguf_get_arr(g, "t.arr_u8", &at, &an) == SI_OK && at == SI_GGUF_UINT8 && an == 3,
          "u8 array");
    const struct si_gguf_kv *kv = &g->kv[si_gguf_find_key(g, "t.arr_u8")];
    struct si_gguf_kv e;
    CHECK(si_gguf_arr_elem(kv, 2, &e) == SI_OK && e.v.u64 == 3, "u8 array element");
    CHECK(si_gguf_arr_elem(kv, 3, &e) == SI_E_INVALID, "element past the end");
    kv = &g->kv[si_gguf_find_key(g, "t.arr_str")];
    CHECK(kv->arr_n == 3 && si_gguf_str_eq(kv->strs[0], "a") && kv->strs[1].len == 0 &&
              si_gguf_str_eq(kv->strs[2], "\xc3\xa9t\xc3\xa9"),
          "string array");
    CHECK(si_gguf_get_arr(g, "t.arr_nested", &at, &an) == SI_OK && at == SI_GGUF_ARRAY && an == 2,
          "nested array");
    CHECK(si_gguf_get_arr(g, "t.arr_empty", &at, &an) == SI_OK && an == 0, "empty array");

    int64_t ta = si_gguf_find_tensor(g, "a.weight"), tb = si_gguf_find_tensor(g, "b.weight");
    CHECK(ta == 0 && tb == 1 && si_gguf_find_tensor(g, "c") == -1, "find tensors");
    const struct si_gguf_tensor *t = &g->tensors[0];
    CHECK(t->n_dims == 2 && t->ne[0] == 4 && t->ne[1] == 2 && t->ne[2] == 1 && t->ne[3] == 1,
          "shape of a.weight");
    CHECK(t->type == SI_TYPE_F32 && t->nbytes == 32, "a.weight type and size");
    CHECK(((const float *)t->data)[7] == 7.0f, "a.weight data");
    t = &g->tensors[1];
    CHECK(t->type == SI_TYPE_Q8_0 && t->nbytes == 34, "b.weight: one Q8_0 block");
    CHECK(((const uint8_t *)t->data)[33] == 33, "b.weight data");
    CHECK(g->data_size == 64 + 34, "data size %zu", g->data_size);
    si_gguf_free(g);

    /* Every proper prefix of the file is refused as truncated, cleanly. */
    int prefix_ok = 0;
    for (size_t n = 0; n < b.n; n++) {
        struct si_gguf *h = NULL;
        rc = si_gguf_parse(&h, b.p, n, err, sizeof err);
        if (rc == SI_E_FORMAT && h == NULL &&
            (strstr(err, "truncated") != NULL || strstr(err, "empty") != NULL ||
             strstr(err, "corrupt header") != NULL))
            prefix_ok++;
        else
            fprintf(stderr, "prefix %zu: rc %d: %s\n", n, rc, err);
        si_gguf_free(h);
    }
    CHECK(prefix_ok == (int)b.n, "%d of %zu prefixes refused as truncated", prefix_ok, b.n);
    free(b.p);
}

static void test_corrupt(void)
{
    struct layout lo;
    struct buf b;
#define CASE(status, needle, what, edit)                                                           \
    do {                                                                                           \
        b = make_valid("GGUF", 3, &lo);                                                            \
        edit;                                                                                      \
        expect_error(&b, status, needle, what);                                                    \
        free(b.p);                                                                                 \
    } while (0)

    CASE(SI_E_FORMAT, "not a GGUF file (magic 'GGML')", "bad magic", memcpy(b.p, "GGML", 4));
    CASE(SI_E_FORMAT, "\\x00", "binary magic", memset(b.p, 0, 4));
    /* Names from the file are shown escaped: no raw control bytes in a message. */
    CASE(SI_E_FORMAT, "metadata key 'gen\\x1bral.architecture' has unknown value type 13",
         "escaped key", (b.p[lo.first_kv_type - 17] = 0x1b, set_u32(&b, lo.first_kv_type, 13)));
    CASE(SI_E_FORMAT, "tensor 'a\\x0aweight' has 0 dimensions", "escaped tensor name",
         (memcpy(memmem(b.p, b.n, "a.weight", 8), "a\nweight", 8), set_u32(&b, lo.ti_ndims, 0)));
    CASE(SI_E_UNSUPPORTED, "version 1", "version 1", set_u32(&b, lo.version, 1));
    CASE(SI_E_UNSUPPORTED, "version 4", "version 4", set_u32(&b, lo.version, 4));
    CASE(SI_E_UNSUPPORTED, "big-endian", "big-endian", set_u32(&b, lo.version, 3u << 24));
    CASE(SI_E_FORMAT, "metadata entries", "huge n_kv", set_u64(&b, lo.n_kv, UINT64_MAX / 2));
    CASE(SI_E_FORMAT, "tensors in", "huge n_tensors", set_u64(&b, lo.n_tensors, 1ull << 40));
    CASE(SI_E_FORMAT, "unknown value type 13", "unknown kv type",
         set_u32(&b, lo.first_kv_type, 13));
    CASE(SI_E_FORMAT, "truncated", "string longer than the file",
         set_u64(&b, lo.first_kv_type + 4, UINT64_MAX - 3));
    CASE(SI_E_FORMAT, "invalid length 0", "empty key", set_u64(&b, 24, 0));
    CASE(SI_E_FORMAT, "duplicate metadata key 't.u8'", "duplicate key",
         memcpy(memmem(b.p, b.n, "t.i8", 4), "t.u8", 4));
    CASE(SI_E_FORMAT, "duplicate tensor 'a.weight'", "duplicate tensor",
         memcpy(memmem(b.p, b.n, "b.weight", 8), "a.weight", 8));
    CASE(SI_E_FORMAT, "not a power of two", "alignment 48", set_u32(&b, lo.alignment_value, 48));
    CASE(SI_E_FORMAT, "not a power of two", "alignment 0", set_u32(&b, lo.alignment_value, 0));
    CASE(SI_E_FORMAT, "general.alignment has type INT32", "alignment type",
         set_u32(&b, lo.alignment_value - 4, SI_GGUF_INT32));
    CASE(SI_E_FORMAT, "0 dimensions", "0 dims", set_u32(&b, lo.ti_ndims, 0));
    CASE(SI_E_FORMAT, "5 dimensions", "5 dims", set_u32(&b, lo.ti_ndims, 5));
    CASE(SI_E_FORMAT, "unknown type 4", "removed tensor type", set_u32(&b, lo.ti_type, 4));
    CASE(SI_E_FORMAT, "unknown type 99", "unknown tensor type", set_u32(&b, lo.ti_type, 99));
    CASE(SI_E_FORMAT, "not a whole number of Q4_0 blocks of 32", "partial block",
         set_u32(&b, lo.ti_type, SI_TYPE_Q4_0));
    CASE(SI_E_FORMAT, "too many elements", "element overflow",
         (set_u64(&b, lo.ti_ne0, 1ull << 62), set_u64(&b, lo.ti_ne0 + 8, 4)));
    CASE(SI_E_FORMAT, "too many elements", "dimension above INT64_MAX",
         set_u64(&b, lo.ti_ne0, 1ull << 63));
    CASE(SI_E_FORMAT, "not a multiple of the alignment", "misaligned offset",
         set_u64(&b, lo.ti_offset, 4));
    CASE(SI_E_FORMAT, "ends past the end of the file", "tensor beyond EOF",
         set_u64(&b, lo.t2_offset, 128));
    CASE(SI_E_FORMAT, "ends past the end of the file", "offset near UINT64_MAX",
         set_u64(&b, lo.t2_offset, UINT64_MAX - 63));
    CASE(SI_E_FORMAT, "bool value 2", "bool 2",
         (b.p[(uint8_t *)memmem(b.p, b.n, "t.bool", 6) - b.p + 6 + 4] = 2));
#undef CASE

    /* A long key of control bytes: escaped and cut short with "...". */
    char key[201];
    memset(key, 1, 200);
    key[200] = '\0';
    b = (struct buf){0};
    put(&b, "GGUF", 4);
    put_u32(&b, 3);
    put_u64(&b, 0);
    put_u64(&b, 1);
    put_key(&b, key, 13);
    put_u64(&b, 0);
    expect_error(&b, SI_E_FORMAT, "metadata key '\\x01\\x01", "long key");
    expect_error(&b, SI_E_FORMAT, "\\x01...' has unknown value type 13", "long key cut");
    free(b.p);

    /* Nested arrays deeper than the limit. */
    b = (struct buf){0};
    put(&b, "GGUF", 4);
    put_u32(&b, 3);
    put_u64(&b, 0);
    put_u64(&b, 1);
    put_key(&b, "deep", SI_GGUF_ARRAY);
    for (int d = 0; d < 12; d++) {
        put_u32(&b, SI_GGUF_ARRAY);
        put_u64(&b, 1);
    }
    put_u32(&b, SI_GGUF_UINT8);
    put_u64(&b, 0);
    expect_error(&b, SI_E_FORMAT, "nested deeper", "deep nesting");
    free(b.p);

    /* An array of strings whose count exceeds what the file could hold. */
    b = (struct buf){0};
    put(&b, "GGUF", 4);
    put_u32(&b, 3);
    put_u64(&b, 0);
    put_u64(&b, 1);
    put_key(&b, "tokens", SI_GGUF_ARRAY);
    put_u32(&b, SI_GGUF_STRING);
    put_u64(&b, 1ull << 61);
    expect_error(&b, SI_E_FORMAT, "claims", "huge string array");
    free(b.p);

    b = (struct buf){0};
    expect_error(&b, SI_E_FORMAT, "empty file", "empty");
}

static void test_files(void)
{
    struct si_gguf *g = (struct si_gguf *)1;
    char err[512] = "";
    int rc = si_gguf_open(&g, "/nonexistent/model.gguf", err, sizeof err);
    CHECK(rc == SI_E_NOT_FOUND && g == NULL, "missing file: %d", rc);
    CHECK(strstr(err, "/nonexistent/model.gguf: No such file") != NULL, "message '%s'", err);
    rc = si_gguf_open(&g, "/", err, sizeof err);
    CHECK(rc == SI_E_IO && strstr(err, "not a regular file") != NULL, "directory: %s", err);

    /* A valid file on disk, mapped. */
    struct layout lo;
    struct buf b = make_valid("PWRI", 2, &lo);
    char path[] = "/tmp/si-test-gguf-XXXXXX";
    int fd = mkstemp(path);
    CHECK(fd >= 0, "mkstemp");
    if (fd >= 0) {
        CHECK(write(fd, b.p, b.n) == (ssize_t)b.n, "write");
        close(fd);
        rc = si_gguf_open(&g, path, err, sizeof err);
        CHECK(rc == SI_OK && g->powerinfer && g->map != NULL, "mapped PWRI file: %s", err);
        if (rc == SI_OK)
            CHECK(((const float *)g->tensors[0].data)[3] == 3.0f, "mapped data");
        si_gguf_free(g);
        /* Truncated on disk: the path leads the message. */
        CHECK(truncate(path, (off_t)(b.n - 1)) == 0, "truncate");
        rc = si_gguf_open(&g, path, err, sizeof err);
        CHECK(rc == SI_E_FORMAT && strncmp(err, path, strlen(path)) == 0 &&
                  strstr(err, "truncated") != NULL,
              "truncated file: %s", err);
        CHECK(truncate(path, 0) == 0, "truncate to 0");
        rc = si_gguf_open(&g, path, err, sizeof err);
        CHECK(rc == SI_E_FORMAT && strstr(err, "empty file") != NULL, "empty file: %s", err);
        unlink(path);
    }
    free(b.p);
    si_gguf_free(NULL);
}

/* The real model: facts from its published description. */
static void test_real_model(void)
{
    const char *path = getenv("STARINFER_TEST_MODEL");
    if (path == NULL || access(path, R_OK) != 0) {
        printf("note: STARINFER_TEST_MODEL not set or unreadable; real-model checks not run\n");
        return;
    }
    struct si_gguf *g = NULL;
    char err[512];
    int rc = si_gguf_open(&g, path, err, sizeof err);
    CHECK(rc == SI_OK, "%s", err);
    if (rc != SI_OK)
        return;
    struct si_gguf_str s;
    uint32_t v;
    CHECK(si_gguf_get_str(g, "general.architecture", &s) == SI_OK && si_gguf_str_eq(s, "llama"),
          "architecture");
    CHECK(si_gguf_get_u32(g, "llama.block_count", &v) == SI_OK && v == 30, "30 layers");
    CHECK(si_gguf_get_u32(g, "llama.embedding_length", &v) == SI_OK && v == 576, "d_model");
    CHECK(si_gguf_get_u32(g, "llama.feed_forward_length", &v) == SI_OK && v == 1536, "n_ff");
    CHECK(si_gguf_get_u32(g, "llama.attention.head_count", &v) == SI_OK && v == 9, "heads");
    CHECK(si_gguf_get_u32(g, "llama.attention.head_count_kv", &v) == SI_OK && v == 3, "kv heads");
    CHECK(si_gguf_get_str(g, "tokenizer.ggml.model", &s) == SI_OK && si_gguf_str_eq(s, "gpt2"),
          "tokenizer");
    enum si_gguf_type t;
    uint64_t n;
    CHECK(si_gguf_get_arr(g, "tokenizer.ggml.tokens", &t, &n) == SI_OK && t == SI_GGUF_STRING &&
              n == 49152,
          "vocabulary");
    int64_t q = si_gguf_find_tensor(g, "blk.0.ffn_gate.weight");
    CHECK(q >= 0, "blk.0.ffn_gate.weight present");
    if (q >= 0)
        CHECK(g->tensors[q].ne[0] == 576 && g->tensors[q].ne[1] == 1536, "ffn_gate shape");
    CHECK(g->data_offset + g->data_size == g->size, "tensor data ends at the end of the file");
    si_gguf_free(g);
}

/* Every file of the GGUF fuzzing corpus (tests/fuzz/corpus/gguf) parses or is refused
 * with a message: the libFuzzer run's seeds, replayed in every test run. */
static void test_corpus(void)
{
    const char *srcdir = getenv("srcdir");
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/tests/fuzz/corpus/gguf", srcdir != NULL ? srcdir : ".");
    DIR *d = opendir(dir);
    CHECK(d != NULL, "cannot open %s", dir);
    if (d == NULL)
        return;
    int n = 0, ok = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.')
            continue;
        char path[2048], err[512] = "";
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        struct si_gguf *g = NULL;
        int rc = si_gguf_open(&g, path, err, sizeof err);
        CHECK(rc == SI_OK || (g == NULL && err[0] != '\0'), "%s: status %d without a message", path, rc);
        ok += rc == SI_OK;
        n++;
        si_gguf_free(g);
    }
    closedir(d);
    CHECK(n > 0, "empty corpus in %s", dir);
    printf("corpus: %d files, %d valid\n", n, ok);
}

int main(void)
{
    test_valid("GGUF", 3);
    test_valid("GGUF", 2);
    test_valid("PWRI", 3);
    test_corrupt();
    test_files();
    test_corpus();
    test_real_model();
    return test_result();
}
