/* cmd_synth.c - `starinfer synth`: write a synthetic model with planted neuron activity. */
#include "cli.h"
#include "progress.h"

#include "model/gguf.h"
#include "model/synth.h"
#include "model/types.h"
#include "starinfer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

/* Measuring costs n_embd * n_ff multiply-adds per sample and layer; keep the
 * default measurement of big models to a few seconds. */
#define MEASURE_BUDGET 16e9

static void synth_usage(FILE *f)
{
    fprintf(f,
            "Usage: " SI_PROG " synth -o FILE [OPTIONS]\n"
            "\n"
            "Write a GGUF model with random weights (reproducible from the seed) whose FFN\n"
            "neurons fire with planted power-law probabilities, then measure the activity.\n"
            "\n"
            "Options:\n"
            "  -o, --output FILE   the model file to write\n"
            "      --arch A        llama-relu (default), llama-silu, bamboo, opt\n"
            "      --preset P      tiny (default; opt-* presets imply --arch opt), 7b, 13b,\n"
            "                      opt-6.7b, opt-13b\n"
            "      --type T        big matrices: f32 (default), f16, bf16, q8_0, q4_0,\n"
            "                      q4_1, q5_0, q5_1, q4_k, q5_k, q6_k; or q4_k_m, q5_k_m:\n"
            "                      llama.cpp's mixes (attn_v and ffn_down in q6_k in some\n"
            "                      layers, the output in q6_k)\n"
            "      --n-embd N      override the preset's dimensions (likewise --n-ff,\n"
            "                      --n-layer, --n-head, --n-head-kv, --n-vocab, --n-ctx)\n"
            "      --sparsity S    mean fraction of inactive FFN neurons (default 0.9)\n"
            "      --hot-share F:S the most active fraction F of neurons carries the share S\n"
            "                      of activations (default 0.2:0.8)\n"
            "      --seed N        random seed (default 1)\n"
            "      --predictor R   add PowerInfer predictors of rank R (blk.N.fc1/fc2) and\n"
            "                      ffn_down_t\n"
            "      --powerinfer    write the PowerInfer magic \"PWRI\"\n"
            "      --measure N     measure the activity on N random token embeddings\n"
            "                      (default: 256, fewer for big models; 0: do not measure)\n"
            "  -h, --help          show this help\n");
}

/* Progress on a terminal: bytes written, shown in GiB. */
static void progress(void *user, uint64_t done, uint64_t total)
{
    struct si_progress *pg = user;
    if (pg->total != (int64_t)total)
        si_progress_begin(pg, "synth", (int64_t)total, "GiB", 1073741824.0);
    si_progress_update(pg, (int64_t)done);
}

/* A --type: a type, or a K type's "_M" mix (q4_k_m, q5_k_m). */
static bool parse_type(const char *s, struct si_synth_params *p)
{
    static const struct {
        const char *name;
        uint32_t type;
        bool mix_m;
    } types[] = {
        {"f32", SI_TYPE_F32, false},   {"f16", SI_TYPE_F16, false},   {"bf16", SI_TYPE_BF16, false},
        {"q8_0", SI_TYPE_Q8_0, false}, {"q4_0", SI_TYPE_Q4_0, false}, {"q4_1", SI_TYPE_Q4_1, false},
        {"q5_0", SI_TYPE_Q5_0, false}, {"q5_1", SI_TYPE_Q5_1, false}, {"q4_k", SI_TYPE_Q4_K, false},
        {"q5_k", SI_TYPE_Q5_K, false}, {"q6_k", SI_TYPE_Q6_K, false}, {"q4_k_m", SI_TYPE_Q4_K, true},
        {"q5_k_m", SI_TYPE_Q5_K, true}};
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++)
        if (strcasecmp(s, types[i].name) == 0) {
            p->type = types[i].type;
            p->mix_m = types[i].mix_m;
            return true;
        }
    return false;
}

/* "F:S", or "S" alone with the default fraction. */
static bool parse_hot(const char *s, double *fraction, double *share)
{
    char buf[64];
    if (strlen(s) >= sizeof buf)
        return si_cli_error("--hot-share: '%s' is not F:S", s), false;
    snprintf(buf, sizeof buf, "%s", s);
    char *colon = strchr(buf, ':');
    if (colon != NULL) {
        *colon = '\0';
        if (!si_cli_float("--hot-share", buf, 0.0, 1.0, fraction))
            return false;
        s = colon + 1;
        return si_cli_float("--hot-share", s, 0.0, 1.0, share);
    }
    return si_cli_float("--hot-share", buf, 0.0, 1.0, share);
}

static double seconds(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int measure(const char *path, const struct si_synth_params *p, long long n_measure)
{
    struct si_gguf *g = NULL;
    char err[512] = "";
    if (si_gguf_open(&g, path, err, sizeof err) != SI_OK)
        return si_cli_error("%s", err);
    /* All layers of small models; the first, middle and last of deeper ones. */
    int64_t layers[3] = {0, p->n_layer / 2, p->n_layer - 1};
    int n_layers = p->n_layer <= 3 ? (int)p->n_layer : 3;
    if (p->n_layer <= 3)
        for (int i = 0; i < n_layers; i++)
            layers[i] = i;
    int64_t n = n_measure;
    if (n < 0) {
        double per_sample = (double)p->n_embd * (double)p->n_ff * n_layers;
        n = (int64_t)(MEASURE_BUDGET / per_sample);
        n = n > 256 ? 256 : n < 32 ? 32 : n;
    }
    double t0 = seconds(), sum_sp = 0, sum_hs = 0;
    int rc = 0;
    printf("planted: sparsity %.3f, top %.0f%% of neurons carry %.1f%% of activations\n",
           p->sparsity, 100.0 * p->hot_fraction, 100.0 * p->hot_share);
    for (int i = 0; i < n_layers; i++) {
        struct si_synth_stats st;
        if (si_synth_measure(g, layers[i], n, p->seed, p->hot_fraction, &st, err, sizeof err) !=
            SI_OK) {
            rc = si_cli_error("measuring %s: %s", path, err);
            break;
        }
        printf("layer %3lld: sparsity %.3f, top %.0f%% carry %.1f%%, correlation with planted "
               "p %.3f (%lld tokens)\n",
               (long long)layers[i], st.sparsity, 100.0 * p->hot_fraction, 100.0 * st.hot_share,
               st.corr, (long long)st.n_samples);
        sum_sp += st.sparsity;
        sum_hs += st.hot_share;
    }
    if (rc == 0)
        printf("measured: sparsity %.3f, top %.0f%% carry %.1f%% (mean of %d layers, %.1f s)\n",
               sum_sp / n_layers, 100.0 * p->hot_fraction, 100.0 * sum_hs / n_layers, n_layers,
               seconds() - t0);
    si_gguf_free(g);
    return rc;
}

int si_cmd_synth(int argc, char **argv)
{
    struct si_synth_params p = si_synth_default_params();
    const char *out = NULL, *preset = NULL;
    bool arch_given = false;
    long long n_measure = -1;
    struct {
        const char *flag;
        int64_t *dst;
        long long min;
    } dims[] = {
        {"--n-embd", &p.n_embd, 1},   {"--n-ff", &p.n_ff, 1},     {"--n-layer", &p.n_layer, 1},
        {"--n-head", &p.n_head, 1},   {"--n-head-kv", &p.n_head_kv, 1},
        {"--n-vocab", &p.n_vocab, 1}, {"--n-ctx", &p.n_ctx, 1},
    };
    const size_t n_dims = sizeof dims / sizeof dims[0];
    long long dim_value[sizeof dims / sizeof dims[0]];
    bool dim_given[sizeof dims / sizeof dims[0]] = {false};

    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        long long n;
        double x;
        if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
            synth_usage(stdout);
            return 0;
        }
        if (strcmp(a, "--powerinfer") == 0) {
            p.powerinfer = true;
            continue;
        }
        bool known = false;
        for (size_t k = 0; k < n_dims && !known; k++) {
            if (strcmp(a, dims[k].flag) != 0)
                continue;
            known = true;
            if ((v = si_cli_value(argc, argv, &i)) == NULL ||
                !si_cli_int(a, v, dims[k].min, 1 << 24, &dim_value[k]))
                return 1;
            dim_given[k] = true;
        }
        if (known)
            continue;
        if (a[0] != '-')
            return si_cli_error("unexpected argument '%s' (see " SI_PROG " synth --help)", a);
        static const char *const valued[] = {"-o", "--output", "--arch", "--preset", "--type",
                                             "--sparsity", "--hot-share", "--seed", "--predictor",
                                             "--measure"};
        bool takes_value = false;
        for (size_t k = 0; k < sizeof valued / sizeof valued[0]; k++)
            takes_value |= strcmp(a, valued[k]) == 0;
        if (!takes_value)
            return si_cli_error("synth: unknown option '%s' (see " SI_PROG " synth --help)", a);
        if ((v = si_cli_value(argc, argv, &i)) == NULL)
            return 1;
        if (strcmp(a, "-o") == 0 || strcmp(a, "--output") == 0) {
            out = v;
        } else if (strcmp(a, "--arch") == 0) {
            if (si_synth_arch_parse(v, &p.arch) != SI_OK)
                return si_cli_error("--arch: unknown architecture '%s' (llama-relu, llama-silu, "
                                    "bamboo, opt)", v);
            arch_given = true;
        } else if (strcmp(a, "--preset") == 0) {
            struct si_synth_params probe = p;
            if (si_synth_preset(v, &probe) != SI_OK)
                return si_cli_error("--preset: unknown preset '%s' (tiny, 7b, 13b, opt-6.7b, "
                                    "opt-13b)", v);
            preset = v;
        } else if (strcmp(a, "--type") == 0) {
            if (!parse_type(v, &p))
                return si_cli_error("--type: unknown type '%s' (f32, f16, bf16, q8_0, q4_0, q4_1, "
                                    "q5_0, q5_1, q4_k, q5_k, q6_k, q4_k_m, q5_k_m)",
                                    v);
        } else if (strcmp(a, "--sparsity") == 0) {
            if (!si_cli_float(a, v, 0.0, 1.0, &x))
                return 1;
            p.sparsity = x;
        } else if (strcmp(a, "--hot-share") == 0) {
            if (!parse_hot(v, &p.hot_fraction, &p.hot_share))
                return 1;
        } else if (strcmp(a, "--seed") == 0) {
            if (!si_cli_int(a, v, 0, 0x7fffffffffffffffLL, &n))
                return 1;
            p.seed = (uint64_t)n;
        } else if (strcmp(a, "--predictor") == 0) {
            if (!si_cli_int(a, v, 1, 1 << 20, &n))
                return 1;
            p.predictor_rank = n;
        } else if (strcmp(a, "--measure") == 0) {
            if (!si_cli_int(a, v, 0, 1 << 20, &n_measure))
                return 1;
        }
    }
    if (out == NULL)
        return si_cli_error("synth: no output file (use -o FILE)");
    /* The preset first, then the dimensions given one by one. */
    if (preset != NULL) {
        si_synth_preset(preset, &p);
        if (!arch_given && strncmp(preset, "opt-", 4) == 0)
            p.arch = SI_SYNTH_OPT;
    }
    for (size_t k = 0; k < n_dims; k++)
        if (dim_given[k])
            *dims[k].dst = dim_value[k];
    /* OPT has no grouped-query attention: its KV heads follow --n-head. */
    if (p.arch == SI_SYNTH_OPT && !dim_given[4])
        p.n_head_kv = p.n_head;

    char err[512] = "";
    if (si_synth_check(&p, err, sizeof err) != SI_OK)
        return si_cli_error("%s", err);
    struct si_progress pg = {0};
    if (si_progress_wanted() && si_synth_data_bytes(&p) >= ((uint64_t)64 << 20)) {
        p.progress = progress;
        p.progress_user = &pg;
    }

    double t0 = seconds();
    int rc = si_synth_write(&p, out, err, sizeof err);
    si_progress_end(&pg);
    if (rc != SI_OK)
        return si_cli_error("%s", err);
    double dt = seconds() - t0;
    double bytes = (double)si_synth_data_bytes(&p);
    printf("wrote %s: %s, %s, d %lld, ff %lld, %lld layers, %lld heads (%lld kv), vocab %lld, "
           "%.2f GiB of tensors in %.1f s (%.0f MiB/s)\n",
           out, si_synth_arch_name(p.arch), si_synth_type_name(&p), (long long)p.n_embd,
           (long long)p.n_ff, (long long)p.n_layer, (long long)p.n_head, (long long)p.n_head_kv,
           (long long)p.n_vocab, bytes / 1073741824.0, dt, bytes / 1048576.0 / (dt > 0 ? dt : 1));
    if (n_measure == 0)
        return 0;
    return measure(out, &p, n_measure);
}
