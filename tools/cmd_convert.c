/* cmd_convert.c - `starinfer convert`: a model's flash store (issue 9), or a copy of the model
 * for llama.cpp or with input sparsity's transposed matrices. */
#include "cli.h"
#include "flash/store.h"
#include "model/gguf.h"
#include "model/gguf_write.h"
#include "model/model.h"
#include "model/pwri.h"
#include "model/transpose.h"
#include "predict/profile.h"
#include "starinfer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static void convert_usage(FILE *f)
{
    fprintf(f, "Usage: " SI_PROG " convert -m MODEL --bundle [-o STORE] [--profile PROFILE]\n"
               "       " SI_PROG " convert -m MODEL --llama-cpp -o FILE\n"
               "       " SI_PROG " convert -m MODEL --transpose -o FILE\n"
               "       " SI_PROG " convert -m MODEL --powerinfer -o FILE\n"
               "\n"
               "Write the flash store of MODEL: its FFN neurons on disk, one record per neuron\n"
               "(gate row, up row and down_t row, in the model's types, each part aligned to\n"
               "512 bytes so a record is read with O_DIRECT straight into a cache slot; the\n"
               "up biases apart, kept in memory), for `generate --dram-budget SIZE`, which keeps "
               "attention, embeddings,\n"
               "norms, predictors and hot neurons in memory and reads the other neurons from\n"
               "the store when they are predicted active.  With a profile, each layer's\n"
               "records go hottest first: neurons that fire together sit together, and the\n"
               "loader reads a run of adjacent records as one request.\n"
               "\n"
               "Options:\n"
               "  -m, --model FILE     the model (GGUF)\n"
               "  -o, --output FILE    the store to write (default: MODEL.flash, where\n"
               "                       generate looks for it)\n"
               "      --bundle         the bundled layout: a neuron's rows in one record, one\n"
               "                       read per neuron (\"LLM in a flash\", section 3.2)\n"
               "      --split          the layout without bundling, for comparisons: gate, up\n"
               "                       and down_t rows in separate tensors, a read for each\n"
               "      --profile FILE   activation profile (starinfer profile): record order\n"
               "      --llama-cpp      instead: a copy of MODEL without the tensors llama.cpp\n"
               "                       refuses (\"wrong number of tensors\"): PowerInfer's\n"
               "                       predictors (blk.N.fc1/fc2), ffn_down_t and synth's\n"
               "                       planted probabilities; the same weights, as a GGUF file\n"
               "      --transpose      instead: a copy of MODEL with input sparsity's\n"
               "                       transposed matrices (a row per input entry, quantized\n"
               "                       along the outputs: Q4_0 for Q4_0 and Q4_K, Q8_0 for\n"
               "                       the other K and 5-bit types), which let\n"
               "                       `--sparsity input` read only the weights of its\n"
               "                       non-zero inputs; about twice the file\n"
               "      --powerinfer     instead: MODEL in PowerInfer's layout, which its loader\n"
               "                       takes: the PWRI magic, the tensors PowerInfer makes\n"
               "                       (ffn_down_t alone, in Q4_0 or else F16, the types its\n"
               "                       kernel reads; no starinfer extras); MODEL needs\n"
               "                       predictors of the residual (train-predictor --input\n"
               "                       residual)\n"
               "  -h, --help           show this help\n");
}

/* The tensors starinfer and PowerInfer add to a llama.cpp model. */
static bool extra_tensor(const struct si_gguf_str *name)
{
    static const char *const tails[] = {".ffn_planted_prob", ".fc1.weight", ".fc2.weight",
                                        ".ffn_down_t.weight"};
    if (name->len < 4 || strncmp(name->data, "blk.", 4) != 0)
        return false;
    for (size_t i = 0; i < sizeof tails / sizeof tails[0]; i++) {
        const size_t n = strlen(tails[i]);
        if (name->len > n && !memcmp(name->data + name->len - n, tails[i], n))
            return true;
    }
    return false;
}

/* convert --llama-cpp: MODEL's keys and tensors but the extra ones, to out. */
static int llama_cpp_copy(const char *model, const char *out)
{
    char err[600];
    struct si_gguf *g = NULL;
    if (si_gguf_open(&g, model, err, sizeof err) != SI_OK)
        return si_cli_error("%s", err);
    if (si_gguf_find_tensor(g, "blk.0.ffn_down_t.weight") >= 0 &&
        si_gguf_find_tensor(g, "blk.0.ffn_down.weight") < 0) {
        si_gguf_free(g);
        return si_cli_error("convert: %s: its down projection is ffn_down_t alone "
                            "(PowerInfer's layout), which llama.cpp does not read",
                            model);
    }
    struct si_gguf_writer *w = si_gguf_writer_init(false);
    char **names = calloc(g->n_tensors + 1, sizeof *names);
    int rc = w != NULL && names != NULL ? si_gguf_writer_copy_kv(w, g) : SI_E_NOMEM;
    uint64_t kept = 0;
    size_t bytes = 0;
    for (uint64_t i = 0; rc == SI_OK && i < g->n_tensors; i++) {
        const struct si_gguf_tensor *t = &g->tensors[i];
        if (extra_tensor(&t->name))
            continue;
        if ((names[kept] = strndup(t->name.data, (size_t)t->name.len)) == NULL) {
            rc = SI_E_NOMEM;
            break;
        }
        rc = si_gguf_writer_add_tensor(w, names[kept++], t->type, t->n_dims, t->ne, t->data);
        bytes += t->nbytes;
    }
    if (rc == SI_OK)
        rc = si_gguf_writer_write(w, out, err, sizeof err);
    else
        snprintf(err, sizeof err, "convert: %s", si_status_str(rc));
    if (rc == SI_OK)
        printf("wrote %s: %llu of %llu tensors (%.2f GiB), without starinfer's and "
               "PowerInfer's extra tensors\n",
               out, (unsigned long long)kept, (unsigned long long)g->n_tensors,
               (double)bytes / 1073741824.0);
    for (uint64_t i = 0; names != NULL && i < kept; i++)
        free(names[i]);
    free(names);
    si_gguf_writer_free(w);
    si_gguf_free(g);
    return rc == SI_OK ? 0 : si_cli_error("%s", err);
}

/* convert --powerinfer: MODEL in PowerInfer's layout (model/pwri.h), to out. */
static int powerinfer_copy(const char *model, const char *out)
{
    char err[600];
    struct si_model *m = NULL;
    if (si_model_load(&m, model, err, sizeof err) != SI_OK)
        return si_cli_error("%s", err);
    const int rc = si_pwri_write(m, out, err, sizeof err);
    if (rc == SI_OK)
        printf("wrote %s: PowerInfer's layout (PWRI, ffn_down_t alone, its tensor set)\n", out);
    si_model_free(m);
    return rc == SI_OK ? 0 : si_cli_error("%s", err);
}

/* convert --transpose: MODEL with input sparsity's transposed copies, to out. */
static int transposed_copy(const char *model, const char *out)
{
    char err[600];
    struct si_model *m = NULL;
    if (si_model_load(&m, model, err, sizeof err) != SI_OK)
        return si_cli_error("%s", err);
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    uint64_t added = 0;
    const int rc = si_transpose_write(m, out, &added, err, sizeof err);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    if (rc == SI_OK)
        printf("wrote %s: the model and its transposed copies (%.2f GiB more) in %.1f s\n", out,
               (double)added / 1073741824.0,
               (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec));
    si_model_free(m);
    return rc == SI_OK ? 0 : si_cli_error("%s", err);
}

int si_cmd_convert(int argc, char **argv)
{
    const char *model = NULL, *out = NULL, *profile = NULL;
    int layout = -1;
    bool llama = false, transpose = false, pwri = false;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            convert_usage(stdout);
            return 0;
        } else if (!strcmp(a, "-m") || !strcmp(a, "--model")) {
            if ((model = si_cli_value(argc, argv, &i)) == NULL)
                return 1;
        } else if (!strcmp(a, "-o") || !strcmp(a, "--output")) {
            if ((out = si_cli_value(argc, argv, &i)) == NULL)
                return 1;
        } else if (!strcmp(a, "--profile")) {
            if ((profile = si_cli_value(argc, argv, &i)) == NULL)
                return 1;
        } else if (!strcmp(a, "--bundle") || !strcmp(a, "--split")) {
            const int l = !strcmp(a, "--bundle") ? SI_FLASH_BUNDLED : SI_FLASH_SPLIT;
            if (layout >= 0 && layout != l)
                return si_cli_error("convert: --bundle and --split exclude each other");
            layout = l;
        } else if (!strcmp(a, "--llama-cpp")) {
            llama = true;
        } else if (!strcmp(a, "--transpose")) {
            transpose = true;
        } else if (!strcmp(a, "--powerinfer")) {
            pwri = true;
        } else {
            return si_cli_error("convert: unknown option '%s' (see " SI_PROG " convert --help)",
                                a);
        }
    }
    if (model == NULL)
        return si_cli_error("convert: no model (-m FILE)");
    if (llama + transpose + pwri > 1)
        return si_cli_error("convert: --llama-cpp, --transpose and --powerinfer exclude each other");
    /* the copies of the model: each writes a model, not a flash store */
    const char *copy = pwri ? "--powerinfer" : transpose ? "--transpose" : llama ? "--llama-cpp" : NULL;
    if (copy != NULL) {
        if (layout >= 0 || profile != NULL)
            return si_cli_error("convert: %s writes a model, not a flash store: without --bundle, "
                                "--split or --profile",
                                copy);
        if (out == NULL)
            return si_cli_error("convert: %s needs -o FILE", copy);
        return pwri        ? powerinfer_copy(model, out)
               : transpose ? transposed_copy(model, out)
                           : llama_cpp_copy(model, out);
    }
    if (layout < 0)
        return si_cli_error("convert: say --bundle (the flash store), --split (the layout "
                            "without bundling), --llama-cpp (a copy llama.cpp loads), "
                            "--powerinfer (a copy PowerInfer loads) or --transpose (a copy for "
                            "--sparsity input)");
    char err[600];
    struct si_model *m = NULL;
    if (si_model_load(&m, model, err, sizeof err) != SI_OK)
        return si_cli_error("%s", err);
    struct si_profile *pr = NULL;
    if (profile != NULL && si_profile_read(&pr, profile, m, err, sizeof err) != SI_OK) {
        si_model_free(m);
        return si_cli_error("%s", err);
    }
    char *def = NULL;
    if (out == NULL) {
        const size_t n = strlen(model) + 8;
        if ((def = malloc(n)) == NULL) {
            si_profile_free(pr);
            si_model_free(m);
            return si_cli_error("out of memory");
        }
        snprintf(def, n, "%s.flash", model);
        out = def;
    }
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    struct si_flash_format f;
    int rc = si_flash_format_of(m, &f, err, sizeof err);
    if (rc == SI_OK)
        rc = si_flash_store_write(m, pr, (enum si_flash_layout)layout, out, err, sizeof err);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    if (rc == SI_OK) {
        const double s = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
        const double bytes = (double)f.rec_bytes * f.n_ff * f.n_layer;
        printf("wrote %s: %s layout, %d layers x %d neurons, records of %zu bytes (gate %zu, "
               "up %zu, down_t %zu%s), %.2f GiB of records, order %s, in %.1f s\n",
               out, si_flash_layout_name((enum si_flash_layout)layout), f.n_layer, f.n_ff,
               f.rec_bytes, f.has_gate ? f.gu_row : (size_t)0, f.gu_row, f.dt_row,
               f.has_bias ? "; up biases apart" : "", bytes / 1073741824.0,
               pr != NULL ? "by profile (hottest first)" : "the model's", s);
    }
    free(def);
    si_profile_free(pr);
    si_model_free(m);
    return rc == SI_OK ? 0 : si_cli_error("%s", err);
}
