/*
 * test-gguf-write.c - the GGUF writer, read back with the reader: every value
 * type and array type, nested arrays through copy_kv, PowerInfer's magic, the
 * alignment key, tensors of several types and shapes (given as bytes and
 * produced by a callback), and the ways a write can fail.  With
 * STARINFER_TEST_MODEL set, also a copy of the real model's metadata.
 */
#include "model/gguf.h"
#include "model/gguf_write.h"
#include "model/types.h"
#include "starinfer.h"
#include "test.h"

#include <dirent.h>
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

static char dir[] = "/tmp/test-gguf-write.XXXXXX";

static const char *path_of(const char *name)
{
    static char p[512];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    return p;
}

/* Files in the scratch directory whose name contains `part`. */
static int count_files(const char *part)
{
    int n = 0;
    DIR *d = opendir(dir);
    struct dirent *e;
    while (d != NULL && (e = readdir(d)) != NULL)
        n += strstr(e->d_name, part) != NULL;
    if (d != NULL)
        closedir(d);
    return n;
}

static struct si_gguf *reopen(const char *path)
{
    struct si_gguf *g = NULL;
    char err[512] = "";
    int rc = si_gguf_open(&g, path, err, sizeof err);
    CHECK(rc == SI_OK, "reopen %s: %s", path, err);
    return g;
}

static const struct si_gguf_kv *kv_of(const struct si_gguf *g, const char *key)
{
    int64_t i = si_gguf_find_key(g, key);
    CHECK(i >= 0, "key %s missing", key);
    return i >= 0 ? &g->kv[i] : NULL;
}

/* ------------------------------------------------------ metadata */

static void test_values(void)
{
    struct si_gguf_writer *w = si_gguf_writer_init(false);
    CHECK(w != NULL, "init");
    CHECK(si_gguf_writer_set_u8(w, "v.u8", 250) == SI_OK, "u8");
    CHECK(si_gguf_writer_set_i8(w, "v.i8", -100) == SI_OK, "i8");
    CHECK(si_gguf_writer_set_u16(w, "v.u16", 65000) == SI_OK, "u16");
    CHECK(si_gguf_writer_set_i16(w, "v.i16", -32000) == SI_OK, "i16");
    CHECK(si_gguf_writer_set_u32(w, "v.u32", 4000000000u) == SI_OK, "u32");
    CHECK(si_gguf_writer_set_i32(w, "v.i32", -2000000000) == SI_OK, "i32");
    CHECK(si_gguf_writer_set_u64(w, "v.u64", UINT64_MAX - 1) == SI_OK, "u64");
    CHECK(si_gguf_writer_set_i64(w, "v.i64", INT64_MIN + 1) == SI_OK, "i64");
    CHECK(si_gguf_writer_set_f32(w, "v.f32", 0.1f) == SI_OK, "f32");
    CHECK(si_gguf_writer_set_f64(w, "v.f64", 0.1) == SI_OK, "f64");
    CHECK(si_gguf_writer_set_bool(w, "v.bool", true) == SI_OK, "bool");
    CHECK(si_gguf_writer_set_str(w, "v.str", "héllo wörld") == SI_OK, "str");
    CHECK(si_gguf_writer_set_str(w, "v.empty", "") == SI_OK, "empty str");
    /* Replaced: the last value counts and the key appears once. */
    CHECK(si_gguf_writer_set_u32(w, "v.replaced", 1) == SI_OK, "first");
    CHECK(si_gguf_writer_set_str(w, "v.replaced", "second") == SI_OK, "second");

    /* Arrays of every scalar type. */
    uint8_t a_u8[] = {0, 1, 255};
    int8_t a_i8[] = {-128, 0, 127};
    uint16_t a_u16[] = {0, 65535};
    int16_t a_i16[] = {-32768, 32767, 5};
    uint32_t a_u32[] = {7, UINT32_MAX};
    int32_t a_i32[] = {INT32_MIN, -1, INT32_MAX};
    float a_f32[] = {1.5f, -0.25f, 3e38f};
    uint8_t a_bool[] = {1, 0, 1, 1};
    uint64_t a_u64[] = {UINT64_MAX, 0};
    int64_t a_i64[] = {INT64_MIN, INT64_MAX, -3};
    double a_f64[] = {1e300, -1e-300};
    struct {
        const char *key;
        enum si_gguf_type type;
        const void *data;
        uint64_t n;
        size_t esz;
    } arrs[] = {
        {"a.u8", SI_GGUF_UINT8, a_u8, 3, 1},      {"a.i8", SI_GGUF_INT8, a_i8, 3, 1},
        {"a.u16", SI_GGUF_UINT16, a_u16, 2, 2},   {"a.i16", SI_GGUF_INT16, a_i16, 3, 2},
        {"a.u32", SI_GGUF_UINT32, a_u32, 2, 4},   {"a.i32", SI_GGUF_INT32, a_i32, 3, 4},
        {"a.f32", SI_GGUF_FLOAT32, a_f32, 3, 4},  {"a.bool", SI_GGUF_BOOL, a_bool, 4, 1},
        {"a.u64", SI_GGUF_UINT64, a_u64, 2, 8},   {"a.i64", SI_GGUF_INT64, a_i64, 3, 8},
        {"a.f64", SI_GGUF_FLOAT64, a_f64, 2, 8},  {"a.none", SI_GGUF_INT32, NULL, 0, 4},
    };
    const size_t n_arrs = sizeof arrs / sizeof arrs[0];
    for (size_t i = 0; i < n_arrs; i++)
        CHECK(si_gguf_writer_set_arr(w, arrs[i].key, arrs[i].type, arrs[i].data, arrs[i].n) ==
                  SI_OK,
              "%s", arrs[i].key);
    const char *strs[] = {"a", "", "Ġthe", "<|im_end|>"};
    CHECK(si_gguf_writer_set_arr_str(w, "a.str", strs, 4) == SI_OK, "arr str");
    CHECK(si_gguf_writer_set_arr_str(w, "a.str0", NULL, 0) == SI_OK, "empty arr str");

    /* Refused: bad keys, non-scalar element types, bool bytes other than 0 and 1. */
    CHECK(si_gguf_writer_set_u32(w, "", 1) == SI_E_INVALID, "empty key");
    CHECK(si_gguf_writer_set_u32(w, NULL, 1) == SI_E_INVALID, "NULL key");
    CHECK(si_gguf_writer_set_str(w, "x", NULL) == SI_E_INVALID, "NULL string");
    CHECK(si_gguf_writer_set_arr(w, "x", SI_GGUF_STRING, strs, 1) == SI_E_INVALID, "str arr");
    CHECK(si_gguf_writer_set_arr(w, "x", SI_GGUF_ARRAY, a_u8, 1) == SI_E_INVALID, "arr arr");
    CHECK(si_gguf_writer_set_arr(w, "x", (enum si_gguf_type)99, a_u8, 1) == SI_E_INVALID, "99");
    CHECK(si_gguf_writer_set_arr(w, "x", SI_GGUF_UINT8, NULL, 2) == SI_E_INVALID, "NULL data");
    uint8_t bad_bool[] = {0, 2};
    CHECK(si_gguf_writer_set_arr(w, "x", SI_GGUF_BOOL, bad_bool, 2) == SI_E_INVALID, "bool 2");
    const char *null_str[] = {"a", NULL};
    CHECK(si_gguf_writer_set_arr_str(w, "x", null_str, 2) == SI_E_INVALID, "NULL in strs");
    char long_key[65537];
    memset(long_key, 'k', sizeof long_key - 1);
    long_key[sizeof long_key - 1] = '\0';
    CHECK(si_gguf_writer_set_u8(w, long_key, 1) == SI_E_INVALID, "key of 65536 bytes");
    long_key[65535] = '\0';
    CHECK(si_gguf_writer_set_u8(w, long_key, 1) == SI_OK, "key of 65535 bytes");

    char err[512] = "";
    int rc = si_gguf_writer_write(w, path_of("values.gguf"), err, sizeof err);
    CHECK(rc == SI_OK, "write: %s", err);
    si_gguf_writer_free(w);

    struct si_gguf *g = reopen(path_of("values.gguf"));
    if (g == NULL)
        return;
    CHECK(strcmp(g->magic, "GGUF") == 0 && g->version == 3, "magic %s version %u", g->magic,
          g->version);
    CHECK(g->n_kv == 14 + n_arrs + 2 + 1, "n_kv %llu", (unsigned long long)g->n_kv);
    CHECK(g->n_tensors == 0, "no tensors");
    const struct si_gguf_kv *kv;
    if ((kv = kv_of(g, "v.u8")))
        CHECK(kv->type == SI_GGUF_UINT8 && kv->v.u64 == 250, "u8");
    if ((kv = kv_of(g, "v.i8")))
        CHECK(kv->type == SI_GGUF_INT8 && kv->v.i64 == -100, "i8");
    if ((kv = kv_of(g, "v.u16")))
        CHECK(kv->type == SI_GGUF_UINT16 && kv->v.u64 == 65000, "u16");
    if ((kv = kv_of(g, "v.i16")))
        CHECK(kv->type == SI_GGUF_INT16 && kv->v.i64 == -32000, "i16");
    if ((kv = kv_of(g, "v.u32")))
        CHECK(kv->type == SI_GGUF_UINT32 && kv->v.u64 == 4000000000u, "u32");
    if ((kv = kv_of(g, "v.i32")))
        CHECK(kv->type == SI_GGUF_INT32 && kv->v.i64 == -2000000000, "i32");
    if ((kv = kv_of(g, "v.u64")))
        CHECK(kv->type == SI_GGUF_UINT64 && kv->v.u64 == UINT64_MAX - 1, "u64");
    if ((kv = kv_of(g, "v.i64")))
        CHECK(kv->type == SI_GGUF_INT64 && kv->v.i64 == INT64_MIN + 1, "i64");
    if ((kv = kv_of(g, "v.f32")))
        CHECK(kv->type == SI_GGUF_FLOAT32 && kv->v.f64 == (double)0.1f, "f32");
    if ((kv = kv_of(g, "v.f64")))
        CHECK(kv->type == SI_GGUF_FLOAT64 && kv->v.f64 == 0.1, "f64");
    if ((kv = kv_of(g, "v.bool")))
        CHECK(kv->type == SI_GGUF_BOOL && kv->v.u64 == 1, "bool");
    if ((kv = kv_of(g, "v.str")))
        CHECK(kv->type == SI_GGUF_STRING && si_gguf_str_eq(kv->v.str, "héllo wörld"), "str");
    if ((kv = kv_of(g, "v.empty")))
        CHECK(kv->type == SI_GGUF_STRING && kv->v.str.len == 0, "empty str");
    if ((kv = kv_of(g, "v.replaced")))
        CHECK(kv->type == SI_GGUF_STRING && si_gguf_str_eq(kv->v.str, "second"), "replaced");
    CHECK(si_gguf_find_key(g, long_key) >= 0, "long key");
    for (size_t i = 0; i < n_arrs; i++) {
        if ((kv = kv_of(g, arrs[i].key)) == NULL)
            continue;
        CHECK(kv->type == SI_GGUF_ARRAY && kv->arr_type == arrs[i].type && kv->arr_n == arrs[i].n,
              "%s: type %d/%d n %llu", arrs[i].key, kv->type, kv->arr_type,
              (unsigned long long)kv->arr_n);
        if (arrs[i].n > 0)
            CHECK(memcmp(kv->arr_data, arrs[i].data, arrs[i].n * arrs[i].esz) == 0, "%s bytes",
                  arrs[i].key);
    }
    struct si_gguf_kv e;
    if ((kv = kv_of(g, "a.i16")) && si_gguf_arr_elem(kv, 0, &e) == SI_OK)
        CHECK(e.v.i64 == -32768, "a.i16[0] = %lld", (long long)e.v.i64);
    if ((kv = kv_of(g, "a.f64")) && si_gguf_arr_elem(kv, 1, &e) == SI_OK)
        CHECK(e.v.f64 == -1e-300, "a.f64[1]");
    if ((kv = kv_of(g, "a.str"))) {
        CHECK(kv->arr_type == SI_GGUF_STRING && kv->arr_n == 4, "a.str");
        for (uint64_t i = 0; i < 4 && i < kv->arr_n; i++)
            CHECK(si_gguf_str_eq(kv->strs[i], strs[i]), "a.str[%llu]", (unsigned long long)i);
    }
    if ((kv = kv_of(g, "a.str0")))
        CHECK(kv->arr_type == SI_GGUF_STRING && kv->arr_n == 0, "a.str0");
    si_gguf_free(g);
}

static void put(uint8_t *b, size_t *n, const void *src, size_t k)
{
    memcpy(b + *n, src, k);
    *n += k;
}
static void put32(uint8_t *b, size_t *n, uint32_t v) { put(b, n, &v, 4); }
static void put64(uint8_t *b, size_t *n, uint64_t v) { put(b, n, &v, 8); }

/* A file with nested arrays, built by hand: [[1, 2, 3] (u8), ["hi", ""], [[-1] (i32)]]. */
static void test_nested_copy(void)
{
    uint8_t b[256];
    size_t n = 0;
    put(b, &n, "GGUF", 4);
    put32(b, &n, 3);
    put64(b, &n, 0);
    put64(b, &n, 2);
    put64(b, &n, 6);
    put(b, &n, "nested", 6);
    put32(b, &n, SI_GGUF_ARRAY);
    put32(b, &n, SI_GGUF_ARRAY);
    put64(b, &n, 3);
    put32(b, &n, SI_GGUF_UINT8);
    put64(b, &n, 3);
    put(b, &n, "\x01\x02\x03", 3);
    put32(b, &n, SI_GGUF_STRING);
    put64(b, &n, 2);
    put64(b, &n, 2);
    put(b, &n, "hi", 2);
    put64(b, &n, 0);
    put32(b, &n, SI_GGUF_ARRAY);
    put64(b, &n, 1);
    put32(b, &n, SI_GGUF_INT32);
    put64(b, &n, 1);
    put32(b, &n, 0xffffffffu);
    const size_t nested_start = 4 + 4 + 8 + 8 + 8 + 6 + 4;
    const size_t nested_end = n;
    put64(b, &n, 5);
    put(b, &n, "after", 5);
    put32(b, &n, SI_GGUF_UINT16);
    put(b, &n, "\x34\x12", 2);
    struct si_gguf *src = NULL;
    char err[512] = "";
    int rc = si_gguf_parse(&src, b, n, err, sizeof err);
    CHECK(rc == SI_OK, "parse the hand-made file: %s", err);
    if (rc != SI_OK)
        return;

    struct si_gguf_writer *w = si_gguf_writer_init(false);
    CHECK(si_gguf_writer_set_u32(w, "after", 7) == SI_OK, "set before the copy");
    CHECK(si_gguf_writer_copy_kv(w, src) == SI_OK, "copy_kv");
    rc = si_gguf_writer_write(w, path_of("nested.gguf"), err, sizeof err);
    CHECK(rc == SI_OK, "write: %s", err);
    si_gguf_writer_free(w);

    struct si_gguf *g = reopen(path_of("nested.gguf"));
    if (g != NULL) {
        CHECK(g->n_kv == 2, "n_kv %llu", (unsigned long long)g->n_kv);
        const struct si_gguf_kv *kv = kv_of(g, "nested");
        if (kv != NULL) {
            CHECK(kv->type == SI_GGUF_ARRAY && kv->arr_type == SI_GGUF_ARRAY && kv->arr_n == 3,
                  "nested header");
            /* The whole value, byte for byte. */
            const uint8_t *val = kv->arr_data - 12;
            CHECK(memcmp(val, b + nested_start, nested_end - nested_start) == 0, "nested bytes");
        }
        uint64_t v = 0;
        CHECK(si_gguf_get_u64(g, "after", &v) == SI_OK && v == 0x1234,
              "copy replaces the earlier value: %llu", (unsigned long long)v);
        si_gguf_free(g);
    }
    si_gguf_free(src);
}

/* ------------------------------------------------------ tensors */

struct spec {
    const char *name;
    uint32_t type;
    uint32_t n_dims;
    int64_t ne[4];
};

static const struct spec specs[] = {
    {"f32.vec", SI_TYPE_F32, 1, {7, 1, 1, 1}},
    {"f16.mat", SI_TYPE_F16, 2, {5, 3, 1, 1}},
    {"q8_0.mat", SI_TYPE_Q8_0, 2, {64, 3, 1, 1}},
    {"q4_0.3d", SI_TYPE_Q4_0, 3, {32, 2, 2, 1}},
    {"q4_1.4d", SI_TYPE_Q4_1, 4, {32, 1, 1, 3}},
    {"q4_k.mat", SI_TYPE_Q4_K, 2, {256, 2, 1, 1}},
    {"i32.vec", SI_TYPE_I32, 1, {4, 1, 1, 1}},
    {"f32.empty", SI_TYPE_F32, 2, {0, 3, 1, 1}},
    {"bf16.mat", SI_TYPE_BF16, 2, {3, 3, 1, 1}},
};
#define N_SPECS (sizeof specs / sizeof specs[0])

static size_t spec_bytes(const struct spec *s)
{
    size_t row = 0;
    si_type_row_size(s->type, s->ne[0], &row);
    return row * (size_t)(s->ne[1] * s->ne[2] * s->ne[3]);
}

static void fill_random(uint8_t *p, size_t n, uint32_t seed)
{
    for (size_t i = 0; i < n; i++) {
        seed = seed * 1664525u + 1013904223u;
        p[i] = (uint8_t)(seed >> 24);
    }
}

/* A callback source: row r holds bytes (r * 37 + k) for each byte k. */
struct rows_src {
    size_t row_size;
    int64_t fail_at; /* fail when asked for this row; -1 never */
    int64_t calls;
};

static int fill_rows(void *user, int64_t row0, int64_t n_rows, void *dst)
{
    struct rows_src *s = user;
    s->calls++;
    for (int64_t r = row0; r < row0 + n_rows; r++) {
        if (r == s->fail_at)
            return SI_E_NOMEM;
        for (size_t k = 0; k < s->row_size; k++)
            ((uint8_t *)dst)[(size_t)(r - row0) * s->row_size + k] = (uint8_t)(r * 37 + (int64_t)k);
    }
    return SI_OK;
}

/* The type number stored in the tensor info of `tensor` (a 1- or 2-D
 * tensor), found in the file's bytes without the reader: UINT32_MAX when
 * not found. */
static uint32_t stored_type(const char *path, const char *tensor)
{
    FILE *f = fopen(path, "rb");
    static uint8_t b[1 << 16];
    const size_t n = f != NULL ? fread(b, 1, sizeof b, f) : 0;
    if (f != NULL)
        fclose(f);
    const size_t len = strlen(tensor);
    for (size_t i = 8; i + len + 4 + 16 + 4 <= n; i++) {
        uint64_t l;
        memcpy(&l, b + i - 8, 8);
        if (l != len || memcmp(b + i, tensor, len) != 0)
            continue;
        uint32_t nd, t;
        memcpy(&nd, b + i + len, 4);
        if (nd < 1 || nd > 2 || i + len + 4 + 8 * nd + 4 > n)
            return UINT32_MAX;
        memcpy(&t, b + i + len + 4 + 8 * nd, 4);
        return t;
    }
    return UINT32_MAX;
}

static void test_tensors(bool powerinfer, uint32_t alignment)
{
    uint8_t *data[N_SPECS];
    struct si_gguf_writer *w = si_gguf_writer_init(powerinfer);
    si_gguf_writer_set_str(w, "general.architecture", "llama");
    if (alignment != 0)
        si_gguf_writer_set_u32(w, "general.alignment", alignment);
    for (size_t i = 0; i < N_SPECS; i++) {
        size_t nb = spec_bytes(&specs[i]);
        data[i] = malloc(nb ? nb : 1);
        fill_random(data[i], nb, (uint32_t)i + 1);
        int rc = si_gguf_writer_add_tensor(w, specs[i].name, specs[i].type, specs[i].n_dims,
                                           specs[i].ne, data[i]);
        CHECK(rc == SI_OK, "add %s: %d", specs[i].name, rc);
    }
    /* A callback tensor of 3000 rows of 4096 bytes (more than the write buffer). */
    struct rows_src src = {.row_size = 4096, .fail_at = -1};
    int64_t ne_cb[2] = {4096, 3000};
    CHECK(si_gguf_writer_add_tensor_cb(w, "cb.mat", SI_TYPE_I8, 2, ne_cb, fill_rows, &src) == SI_OK,
          "add cb");

    char name[64], err[512] = "";
    snprintf(name, sizeof name, "tensors-%d-%u.gguf", powerinfer, alignment);
    int rc = si_gguf_writer_write(w, path_of(name), err, sizeof err);
    CHECK(rc == SI_OK, "write %s: %s", name, err);
    CHECK(src.calls >= 2, "the source was asked in chunks (%lld calls)", (long long)src.calls);
    si_gguf_writer_free(w);

    struct si_gguf *g = reopen(path_of(name));
    if (g != NULL) {
        uint64_t align = alignment ? alignment : 32;
        CHECK(strcmp(g->magic, powerinfer ? "PWRI" : "GGUF") == 0 && g->powerinfer == powerinfer,
              "magic %s", g->magic);
        CHECK(g->alignment == align, "alignment %llu", (unsigned long long)g->alignment);
        CHECK(g->data_offset % align == 0, "data offset %zu", g->data_offset);
        CHECK(g->n_tensors == N_SPECS + 1, "n_tensors %llu", (unsigned long long)g->n_tensors);
        for (size_t i = 0; i < N_SPECS; i++) {
            int64_t k = si_gguf_find_tensor(g, specs[i].name);
            CHECK(k == (int64_t)i, "%s at %lld", specs[i].name, (long long)k);
            if (k < 0)
                continue;
            const struct si_gguf_tensor *t = &g->tensors[k];
            CHECK(t->type == specs[i].type && t->n_dims == specs[i].n_dims, "%s type/dims",
                  specs[i].name);
            CHECK(memcmp(t->ne, specs[i].ne, sizeof t->ne) == 0, "%s shape", specs[i].name);
            CHECK(t->offset % align == 0, "%s offset %llu", specs[i].name,
                  (unsigned long long)t->offset);
            CHECK(t->nbytes == spec_bytes(&specs[i]), "%s nbytes", specs[i].name);
            CHECK(t->nbytes == 0 || memcmp(t->data, data[i], t->nbytes) == 0, "%s bytes",
                  specs[i].name);
        }
        /* The type numbers as stored: a PWRI file numbers I8 and I32 as
         * PowerInfer's ggml does (16, 18), a GGUF file as today's (24, 26). */
        CHECK(stored_type(path_of(name), "i32.vec") == (powerinfer ? 18u : 26u) &&
                  stored_type(path_of(name), "cb.mat") == (powerinfer ? 16u : 24u) &&
                  stored_type(path_of(name), "q4_k.mat") == SI_TYPE_Q4_K,
              "%s: stored type numbers %u %u %u", name, stored_type(path_of(name), "i32.vec"),
              stored_type(path_of(name), "cb.mat"), stored_type(path_of(name), "q4_k.mat"));
        int64_t k = si_gguf_find_tensor(g, "cb.mat");
        if (k >= 0) {
            const uint8_t *d = g->tensors[k].data;
            bool same = g->tensors[k].nbytes == 4096u * 3000u;
            for (int64_t r = 0; r < 3000 && same; r++)
                for (size_t c = 0; c < 4096 && same; c++)
                    same = d[r * 4096 + (int64_t)c] == (uint8_t)(r * 37 + (int64_t)c);
            CHECK(same, "callback tensor bytes");
        }
        si_gguf_free(g);
    }
    for (size_t i = 0; i < N_SPECS; i++)
        free(data[i]);
}

/* ------------------------------------------------------ failures */

static void test_bad_tensors(void)
{
    static float f[64];
    struct si_gguf_writer *w = si_gguf_writer_init(false);
    int64_t ne[5] = {32, 2, 1, 1, 1};
    CHECK(si_gguf_writer_add_tensor(w, "a", SI_TYPE_F32, 1, ne, f) == SI_OK, "first a");
    CHECK(si_gguf_writer_add_tensor(w, "a", SI_TYPE_F32, 1, ne, f) == SI_E_INVALID, "duplicate");
    CHECK(si_gguf_writer_add_tensor(w, "b", SI_TYPE_F32, 0, ne, f) == SI_E_INVALID, "0 dims");
    CHECK(si_gguf_writer_add_tensor(w, "b", SI_TYPE_F32, 5, ne, f) == SI_E_INVALID, "5 dims");
    int64_t odd[1] = {33};
    CHECK(si_gguf_writer_add_tensor(w, "b", SI_TYPE_Q4_0, 1, odd, f) == SI_E_INVALID,
          "row of 33 in Q4_0");
    CHECK(si_gguf_writer_add_tensor(w, "b", SI_TYPE_Q4_K, 1, ne, f) == SI_E_INVALID,
          "row of 32 in Q4_K");
    int64_t neg[2] = {4, -1};
    CHECK(si_gguf_writer_add_tensor(w, "b", SI_TYPE_F32, 2, neg, f) == SI_E_INVALID, "negative");
    int64_t huge[4] = {INT64_MAX / 2, 4, 1, 1};
    CHECK(si_gguf_writer_add_tensor(w, "b", SI_TYPE_F32, 2, huge, f) == SI_E_INVALID, "overflow");
    CHECK(si_gguf_writer_add_tensor(w, "b", 4, 1, ne, f) == SI_E_INVALID, "type 4 (no type)");
    CHECK(si_gguf_writer_add_tensor(w, "b", 999, 1, ne, f) == SI_E_INVALID, "type 999");
    CHECK(si_gguf_writer_add_tensor(w, "b", SI_TYPE_F32, 1, ne, NULL) == SI_E_INVALID, "no data");
    CHECK(si_gguf_writer_add_tensor(w, "", SI_TYPE_F32, 1, ne, f) == SI_E_INVALID, "empty name");
    CHECK(si_gguf_writer_add_tensor(w, NULL, SI_TYPE_F32, 1, ne, f) == SI_E_INVALID, "NULL name");
    CHECK(si_gguf_writer_add_tensor_cb(w, "b", SI_TYPE_F32, 1, ne, NULL, NULL) == SI_E_INVALID,
          "NULL fill");
    char name[257];
    memset(name, 'n', 256);
    name[256] = '\0';
    CHECK(si_gguf_writer_add_tensor(w, name, SI_TYPE_F32, 1, ne, f) == SI_E_INVALID, "name 256");
    name[255] = '\0';
    CHECK(si_gguf_writer_add_tensor(w, name, SI_TYPE_F32, 1, ne, f) == SI_OK, "name 255");
    CHECK(si_gguf_writer_add_tensor(NULL, "c", SI_TYPE_F32, 1, ne, f) == SI_E_INVALID, "NULL w");
    /* PowerInfer's numbers 16 to 18 are its I8, I16, I32: a PWRI file
     * cannot hold IQ2_XXS, IQ2_XS or IQ3_XXS */
    struct si_gguf_writer *pw = si_gguf_writer_init(true);
    int64_t ne256[1] = {256};
    static uint8_t iq[98];
    CHECK(si_gguf_writer_add_tensor(pw, "iq", SI_TYPE_IQ3_XXS, 1, ne256, iq) ==
              SI_E_UNSUPPORTED &&
              si_gguf_writer_add_tensor(pw, "iq", SI_TYPE_IQ2_XXS, 1, ne256, iq) ==
                  SI_E_UNSUPPORTED &&
              si_gguf_writer_add_tensor(pw, "iq", SI_TYPE_IQ4_NL, 1, (int64_t[1]){32}, iq) ==
                  SI_OK,
          "PWRI writer: IQ3_XXS and IQ2_XXS refused, IQ4_NL taken");
    si_gguf_writer_free(pw);

    /* Alignments the reader would refuse. */
    char err[512] = "";
    si_gguf_writer_set_u32(w, "general.alignment", 48);
    CHECK(si_gguf_writer_write(w, path_of("align48.gguf"), err, sizeof err) == SI_E_INVALID,
          "alignment 48");
    si_gguf_writer_set_u64(w, "general.alignment", 64);
    CHECK(si_gguf_writer_write(w, path_of("align-u64.gguf"), err, sizeof err) == SI_E_INVALID,
          "alignment as u64");
    CHECK(strstr(err, "general.alignment") != NULL, "message: %s", err);
    CHECK(count_files("align") == 0, "nothing written");
    si_gguf_writer_free(w);
    si_gguf_writer_free(NULL);
}

static void test_bad_writes(void)
{
    static float f[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    char err[512] = "";
    int64_t ne[1] = {8};
    struct si_gguf_writer *w = si_gguf_writer_init(false);
    si_gguf_writer_add_tensor(w, "t", SI_TYPE_F32, 1, ne, f);

    /* Unwritable places. */
    int rc = si_gguf_writer_write(w, "/nonexistent-dir/x.gguf", err, sizeof err);
    CHECK(rc == SI_E_IO && strstr(err, "/nonexistent-dir/x.gguf") != NULL, "%d: %s", rc, err);
    rc = si_gguf_writer_write(w, "/proc/self/x.gguf", err, sizeof err);
    CHECK(rc == SI_E_IO && err[0] != '\0', "/proc: %d: %s", rc, err);
    CHECK(si_gguf_writer_write(w, "", err, sizeof err) == SI_E_INVALID, "empty path");
    /* A directory in the way of the rename. */
    char sub[300];
    snprintf(sub, sizeof sub, "%s/adir", dir);
    CHECK(mkdir(sub, 0700) == 0, "mkdir");
    rc = si_gguf_writer_write(w, sub, err, sizeof err);
    CHECK(rc == SI_E_IO && strstr(err, "rename") != NULL, "rename onto a directory: %s", err);
    rmdir(sub);

    /* A source that fails: error names the tensor, the old file stays. */
    CHECK(si_gguf_writer_write(w, path_of("keep.gguf"), err, sizeof err) == SI_OK, "%s", err);
    struct rows_src src = {.row_size = 64, .fail_at = 5};
    int64_t ne_cb[2] = {16, 10};
    si_gguf_writer_add_tensor_cb(w, "failing", SI_TYPE_F32, 2, ne_cb, fill_rows, &src);
    rc = si_gguf_writer_write(w, path_of("keep.gguf"), err, sizeof err);
    CHECK(rc == SI_E_NOMEM && strstr(err, "failing") != NULL, "failing source: %d %s", rc, err);
    struct si_gguf *g = reopen(path_of("keep.gguf"));
    if (g != NULL) {
        CHECK(g->n_tensors == 1, "the old file is intact");
        si_gguf_free(g);
    }
    si_gguf_writer_free(w);

    /* Disk full, as a file size limit: the write fails cleanly, no file is left. */
    w = si_gguf_writer_init(false);
    static uint8_t big[1 << 20];
    int64_t ne_big[1] = {1 << 20};
    si_gguf_writer_add_tensor(w, "big", SI_TYPE_I8, 1, ne_big, big);
    struct rlimit old;
    getrlimit(RLIMIT_FSIZE, &old);
    struct rlimit lim = {.rlim_cur = 100000, .rlim_max = old.rlim_max};
    void (*old_handler)(int) = signal(SIGXFSZ, SIG_IGN);
    CHECK(setrlimit(RLIMIT_FSIZE, &lim) == 0, "setrlimit");
    rc = si_gguf_writer_write(w, path_of("full.gguf"), err, sizeof err);
    setrlimit(RLIMIT_FSIZE, &old);
    signal(SIGXFSZ, old_handler);
    CHECK(rc == SI_E_IO && strstr(err, "failed") != NULL, "file too large: %d %s", rc, err);
    CHECK(count_files("full.gguf") == 0, "no file and no temporary file left");
    si_gguf_writer_free(w);
    CHECK(count_files(".tmp.") == 0, "no temporary files left at all");
}

/* ------------------------------------------------------ the real model */

static void test_real_model(void)
{
    const char *path = getenv("STARINFER_TEST_MODEL");
    if (path == NULL || path[0] == '\0') {
        printf("STARINFER_TEST_MODEL not set: skipping the copy of a real model's metadata\n");
        return;
    }
    struct si_gguf *src = reopen(path);
    if (src == NULL)
        return;
    struct si_gguf_writer *w = si_gguf_writer_init(src->powerinfer);
    CHECK(si_gguf_writer_copy_kv(w, src) == SI_OK, "copy_kv");
    char err[512] = "";
    int rc = si_gguf_writer_write(w, path_of("real-kv.gguf"), err, sizeof err);
    CHECK(rc == SI_OK, "write: %s", err);
    si_gguf_writer_free(w);
    struct si_gguf *g = reopen(path_of("real-kv.gguf"));
    if (g != NULL) {
        CHECK(g->n_kv == src->n_kv && g->n_kv == 33, "n_kv %llu (source %llu)",
              (unsigned long long)g->n_kv, (unsigned long long)src->n_kv);
        for (uint64_t i = 0; i < src->n_kv && i < g->n_kv; i++) {
            const struct si_gguf_kv *a = &src->kv[i], *b = &g->kv[i];
            bool same = a->key.len == b->key.len &&
                        memcmp(a->key.data, b->key.data, a->key.len) == 0 && a->type == b->type;
            if (same && a->type == SI_GGUF_STRING)
                same = a->v.str.len == b->v.str.len &&
                       memcmp(a->v.str.data, b->v.str.data, a->v.str.len) == 0;
            else if (same && a->type == SI_GGUF_ARRAY) {
                same = a->arr_type == b->arr_type && a->arr_n == b->arr_n;
                size_t esz = si_gguf_type_size(a->arr_type);
                if (same && esz != 0)
                    same = memcmp(a->arr_data, b->arr_data, (size_t)a->arr_n * esz) == 0;
                for (uint64_t k = 0; same && a->arr_type == SI_GGUF_STRING && k < a->arr_n; k++)
                    same = a->strs[k].len == b->strs[k].len &&
                           memcmp(a->strs[k].data, b->strs[k].data, a->strs[k].len) == 0;
            } else if (same) {
                same = memcmp(&a->v, &b->v, sizeof a->v.u64) == 0;
            }
            CHECK(same, "key #%llu '%.*s' differs", (unsigned long long)i, (int)a->key.len,
                  a->key.data);
        }
        si_gguf_free(g);
    }
    si_gguf_free(src);
}

int main(void)
{
    if (mkdtemp(dir) == NULL)
        test_skip("cannot make a scratch directory");
    test_values();
    test_nested_copy();
    test_tensors(false, 0);
    test_tensors(true, 64);
    test_tensors(false, 4096);
    test_tensors(false, 1);
    test_bad_tensors();
    test_bad_writes();
    test_real_model();

    /* Clean up the scratch directory. */
    DIR *d = opendir(dir);
    struct dirent *e;
    while (d != NULL && (e = readdir(d)) != NULL)
        if (e->d_name[0] != '.')
            unlink(path_of(e->d_name));
    if (d != NULL)
        closedir(d);
    rmdir(dir);
    return test_result();
}
