/* cmd_info.c - `starinfer info`: a model file's summary and StarPU's workers. */
#include "config.h"

#include "cli.h"
#include "graph/runtime.h"
#include "model/gguf.h"
#include "model/model.h"
#include "model/types.h"
#include "placement/placement.h"
#include "starinfer.h"

#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PROG SI_PROG

static void info_usage(FILE *f)
{
    fprintf(f, "Usage: " PROG " info [-m] MODEL [OPTIONS]\n"
               "\n"
               "Summarise a GGUF (or PowerInfer PWRI) model file: format, architecture,\n"
               "hyperparameters, tokenizer, tensor types; then the StarPU workers.\n"
               "\n"
               "Options:\n"
               "  -m, --model FILE      the model file (or give it as the only argument)\n"
               "      --kv              list every metadata key and value\n"
               "      --tensors         list every tensor (name, type, shape, bytes)\n"
               "      --placement FILE  summarise a placement (starinfer place, or PowerInfer's\n"
               "                        GPU index) checked against the model\n"
               "      --no-workers      do not start StarPU\n"
               "  -h, --help            show this help\n");
}

static void print_size(FILE *f, double bytes)
{
    const char *unit[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    int u = 0;
    while (bytes >= 1024.0 && u < 4) {
        bytes /= 1024.0;
        u++;
    }
    fprintf(f, u == 0 ? "%.0f %s" : "%.2f %s", bytes, unit[u]);
}

/* A string, with control characters escaped and long ones cut at `max`. */
static void print_str(FILE *f, struct si_gguf_str s, size_t max)
{
    fputc('"', f);
    for (uint64_t i = 0; i < s.len && i < max; i++) {
        unsigned char c = (unsigned char)s.data[i];
        if (c == '\n')
            fputs("\\n", f);
        else if (c == '"' || c == '\\')
            fprintf(f, "\\%c", c);
        else if (c < 0x20 || c == 0x7f)
            fprintf(f, "\\x%02x", c);
        else
            fputc(c, f);
    }
    fputs(s.len > max ? "\"..." : "\"", f);
}

static void print_value(FILE *f, const struct si_gguf_kv *kv, size_t max_items)
{
    switch (kv->type) {
    case SI_GGUF_STRING:
        print_str(f, kv->v.str, 120);
        break;
    case SI_GGUF_ARRAY: {
        fprintf(f, "[%s x %" PRIu64 "]", si_gguf_type_name(kv->arr_type), kv->arr_n);
        for (uint64_t i = 0; i < kv->arr_n && i < max_items; i++) {
            struct si_gguf_kv elem;
            if (si_gguf_arr_elem(kv, i, &elem) != SI_OK)
                break; /* nested arrays are not shown */
            fputs(i ? ", " : " ", f);
            print_value(f, &elem, max_items);
        }
        if (kv->arr_n > max_items && kv->arr_type != SI_GGUF_ARRAY)
            fputs(", ...", f);
        break;
    }
    case SI_GGUF_FLOAT32:
    case SI_GGUF_FLOAT64:
        fprintf(f, "%g", kv->v.f64);
        break;
    case SI_GGUF_BOOL:
        fprintf(f, "%s", kv->v.u64 ? "true" : "false");
        break;
    case SI_GGUF_INT8:
    case SI_GGUF_INT16:
    case SI_GGUF_INT32:
    case SI_GGUF_INT64:
        fprintf(f, "%" PRId64, kv->v.i64);
        break;
    default:
        fprintf(f, "%" PRIu64, kv->v.u64);
    }
}

static void print_key_line(FILE *f, const struct si_gguf *g, const char *label, const char *key)
{
    int64_t i = si_gguf_find_key(g, key);
    if (i < 0)
        return;
    fprintf(f, "%-13s: ", label);
    print_value(f, &g->kv[i], 4);
    fputc('\n', f);
}

static int cmp_i64(const void *a, const void *b)
{
    const int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

/* A placement file, its shape checked against the model; 0 or 1 after an error. */
static int load_placement(const char *model, const char *path, struct si_placement **p)
{
    char err[600];
    struct si_model *m = NULL;
    if (si_model_load(&m, model, err, sizeof err) != SI_OK)
        return si_cli_error("%s", err);
    int rc = si_placement_read(p, path, m, err, sizeof err);
    si_model_free(m);
    return rc != SI_OK ? si_cli_error("%s", err) : 0;
}

/* The placement's summary (frees it). */
static int print_placement(FILE *f, const char *path, struct si_placement *p)
{
    int64_t *n = malloc((size_t)p->n_layer * sizeof *n);
    if (n == NULL) {
        si_placement_free(p);
        return si_cli_error("out of memory");
    }
    const int64_t total = si_placement_gpu_neurons(p);
    int32_t layers = 0;
    for (int32_t l = 0; l < p->n_layer; l++) {
        n[l] = p->n_gpu[l];
        layers += n[l] > 0;
    }
    qsort(n, (size_t)p->n_layer, sizeof *n, cmp_i64);
    fprintf(f,
            "placement    : %s: %" PRId64 " of %" PRId64
            " FFN neurons on the GPU (%.2f%%), in %" PRId32 " of %" PRId32 " layers\n",
            path, total, (int64_t)p->n_layer * p->n_ff,
            100.0 * (double)total / ((double)p->n_layer * (double)p->n_ff), layers, p->n_layer);
    fprintf(f,
            "  GPU neurons per layer: min %" PRId64 ", median %" PRId64 ", max %" PRId64
            "; VRAM capacity ",
            n[0], n[p->n_layer / 2], n[p->n_layer - 1]);
    print_size(f, (double)p->vram_capacity);
    if (p->has_meta)
        fprintf(f, "; %s placement (%s), %s mode, objective %.4g, gap %.3g", p->policy, p->outcome,
                p->sparsity, p->objective, p->gap);
    else
        fprintf(f, "; a PowerInfer GPU index (no starinfer keys)");
    fputc('\n', f);
    free(n);
    si_placement_free(p);
    return 0;
}

/* info's options. */
struct info_opts {
    const char *model, *placement;
    bool show_kv, show_tensors, workers;
};

/* The options into o: 0 to go on, else the exit status (help: 0 printed,
 * -1 for "exit 0"). */
static int info_options(struct info_opts *o, int argc, char **argv)
{
    *o = (struct info_opts){.workers = true};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            info_usage(stdout);
            return -1;
        } else if (!strcmp(a, "-m") || !strcmp(a, "--model")) {
            if (++i >= argc)
                return si_cli_error("%s needs a file name", a);
            o->model = argv[i];
        } else if (!strncmp(a, "--model=", 8)) {
            o->model = a + 8;
        } else if (!strcmp(a, "--kv")) {
            o->show_kv = true;
        } else if (!strcmp(a, "--tensors")) {
            o->show_tensors = true;
        } else if (!strcmp(a, "--placement")) {
            if (si_cli_opt_str(argc, argv, &i, &o->placement) < 0)
                return 1;
        } else if (!strcmp(a, "--no-workers")) {
            o->workers = false;
        } else if (a[0] == '-' && a[1] != '\0') {
            return si_cli_error("info: unknown option '%s' (see starinfer info --help)", a);
        } else if (o->model == NULL) {
            o->model = a;
        } else {
            return si_cli_error("info: unexpected argument '%s' (one model file only)", a);
        }
    }
    if (o->model == NULL)
        return si_cli_error("info: no model given (starinfer info -m MODEL.gguf)");
    return 0;
}

/* The file, its format and the architecture's keys: name, file type, and
 * every scalar key under the architecture's prefix (the hyperparameters). */
static void print_file(FILE *f, const struct si_gguf *g, const char *model)
{
    fprintf(f, "file         : %s (", model);
    print_size(f, (double)g->size);
    fprintf(f, ")\n");
    fprintf(f,
            "format       : %s v%" PRIu32 "%s, alignment %" PRIu64 ", %" PRIu64
            " metadata keys, %" PRIu64 " tensors\n",
            g->magic, g->version, g->powerinfer ? " (PowerInfer)" : "", g->alignment, g->n_kv,
            g->n_tensors);
    print_key_line(f, g, "architecture", "general.architecture");
    print_key_line(f, g, "name", "general.name");
    print_key_line(f, g, "file type", "general.file_type");
    struct si_gguf_str arch;
    if (si_gguf_get_str(g, "general.architecture", &arch) != SI_OK)
        return;
    for (uint64_t i = 0; i < g->n_kv; i++) {
        const struct si_gguf_kv *kv = &g->kv[i];
        if (kv->key.len > arch.len + 1 && !memcmp(kv->key.data, arch.data, arch.len) &&
            kv->key.data[arch.len] == '.') {
            fprintf(f, "  %-36.*s = ", (int)(kv->key.len - arch.len - 1),
                    kv->key.data + arch.len + 1);
            print_value(f, kv, 4);
            fputc('\n', f);
        }
    }
}

/* The tokenizer's line: its model, vocabulary, pre-tokenizer, BOS and EOS,
 * chat template; nothing without one. */
static void print_tokenizer(FILE *f, const struct si_gguf *g)
{
    struct si_gguf_str tok;
    if (si_gguf_get_str(g, "tokenizer.ggml.model", &tok) != SI_OK)
        return;
    enum si_gguf_type t;
    uint64_t n_vocab = 0;
    si_gguf_get_arr(g, "tokenizer.ggml.tokens", &t, &n_vocab);
    fprintf(f, "tokenizer    : %.*s, %" PRIu64 " tokens", (int)tok.len, tok.data, n_vocab);
    struct si_gguf_str pre;
    if (si_gguf_get_str(g, "tokenizer.ggml.pre", &pre) == SI_OK)
        fprintf(f, ", pre-tokenizer %.*s", (int)pre.len, pre.data);
    uint32_t id;
    if (si_gguf_get_u32(g, "tokenizer.ggml.bos_token_id", &id) == SI_OK)
        fprintf(f, ", bos %" PRIu32, id);
    if (si_gguf_get_u32(g, "tokenizer.ggml.eos_token_id", &id) == SI_OK)
        fprintf(f, ", eos %" PRIu32, id);
    fprintf(f, "%s\n",
            si_gguf_find_key(g, "tokenizer.chat_template") >= 0 ? ", chat template" : "");
}

/* The parameters and the tensor types: count and bytes of each. */
static void print_types(FILE *f, const struct si_gguf *g)
{
    uint64_t count[SI_TYPE_COUNT] = {0};
    double bytes[SI_TYPE_COUNT] = {0};
    double params = 0;
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        const struct si_gguf_tensor *t = &g->tensors[i];
        count[t->type]++;
        bytes[t->type] += (double)t->nbytes;
        params += (double)t->ne[0] * (double)t->ne[1] * (double)t->ne[2] * (double)t->ne[3];
    }
    fprintf(f, "parameters   : %.1f M, tensor data ", params / 1e6);
    print_size(f, (double)g->data_size);
    fprintf(f, " (%.2f bits per weight)\n", params > 0 ? 8.0 * (double)g->data_size / params : 0.0);
    fprintf(f, "tensor types :");
    for (int t = 0; t < SI_TYPE_COUNT; t++) {
        if (count[t] == 0)
            continue;
        fprintf(f, " %s x%" PRIu64 " (", si_type_name((uint32_t)t), count[t]);
        print_size(f, bytes[t]);
        fputc(')', f);
    }
    fputc('\n', f);
}

/* --kv and --tensors: every metadata key and value; every tensor's name,
 * type, shape, bytes and offset. */
static void print_lists(FILE *f, const struct si_gguf *g, bool show_kv, bool show_tensors)
{
    if (show_kv) {
        fprintf(f, "\nmetadata:\n");
        for (uint64_t i = 0; i < g->n_kv; i++) {
            const struct si_gguf_kv *kv = &g->kv[i];
            fprintf(f, "  %-40.*s %-8s ", (int)kv->key.len, kv->key.data,
                    si_gguf_type_name(kv->type));
            print_value(f, kv, 8);
            fputc('\n', f);
        }
    }
    if (show_tensors) {
        fprintf(f, "\ntensors:\n");
        for (uint64_t i = 0; i < g->n_tensors; i++) {
            const struct si_gguf_tensor *t = &g->tensors[i];
            fprintf(f, "  %-32.*s %-5s [", (int)t->name.len, t->name.data, si_type_name(t->type));
            for (uint32_t d = 0; d < t->n_dims; d++)
                fprintf(f, d ? ", %" PRId64 : "%" PRId64, t->ne[d]);
            fprintf(f, "] %zu bytes at %" PRIu64 "\n", t->nbytes, t->offset);
        }
    }
}

int si_cmd_info(int argc, char **argv)
{
    struct info_opts o;
    int rc = info_options(&o, argc, argv);
    if (rc != 0)
        return rc < 0 ? 0 : rc;
    char err[600];
    struct si_gguf *g = NULL;
    if (si_gguf_open(&g, o.model, err, sizeof err) != SI_OK)
        return si_cli_error("%s", err);
    /* The placement is checked before anything is printed. */
    struct si_placement *pl = NULL;
    if (o.placement != NULL && load_placement(o.model, o.placement, &pl) != 0) {
        si_gguf_free(g);
        return 1;
    }
    FILE *f = stdout;
    print_file(f, g, o.model);
    print_tokenizer(f, g);
    print_types(f, g);
    if (pl != NULL && print_placement(f, o.placement, pl) != 0) {
        si_gguf_free(g);
        return 1;
    }
    print_lists(f, g, o.show_kv, o.show_tensors);
    si_gguf_free(g);
    if (o.workers) {
        struct si_runtime rt;
        if (si_runtime_start(&rt, false, err, sizeof err) != SI_OK)
            return si_cli_error("%s", err);
        si_runtime_describe(f);
        si_runtime_stop(&rt);
    }
    return 0;
}
