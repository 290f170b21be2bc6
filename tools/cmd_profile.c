/* cmd_profile.c - `starinfer profile`: count FFN neuron activations over a text. */
#include "cli.h"
#include "internal.h" /* si__now */
#include "model/forward.h"
#include "model/model.h"
#include "model/tokenizer.h"
#include "predict/input_sparsity.h"
#include "predict/profile.h"
#include "starinfer.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/wait.h>
#include <unistd.h>

extern char **environ;

static void profile_usage(FILE *f)
{
    fprintf(f, "Usage: " SI_PROG " profile -m MODEL --corpus TEXT_FILE -o PROFILE [OPTIONS]\n"
               "\n"
               "Count, for every FFN neuron of every layer, how many tokens of a text corpus\n"
               "activate it, and write the counts as a GGUF profile (starinfer.profile.*\n"
               "keys, blk.N.ffn_act_count tensors).  The model runs on the StarPU engine in\n"
               "dense mode (batched prefill on every worker), or with --engine ref on the\n"
               "single-threaded reference.\n"
               "ReLU models: a neuron is active when its activation is not zero.\n"
               "SiLU/GELU models (CATS): when |act(gate . x)| is above its layer's threshold,\n"
               "the --target-sparsity quantile of |act(gate . x)| over the corpus, found by a\n"
               "first pass over the tokens; the thresholds are stored in the profile\n"
               "(starinfer.profile.gate_threshold, one per layer; 0 for ReLU models).\n"
               "The text is tokenized as a whole (BOS first when the model adds one) and\n"
               "evaluated in windows of --ctx-size tokens, each from an empty cache and, when\n"
               "the model adds BOS, with BOS in place of its first token.  Prints the tokens\n"
               "counted, each layer's mean activation rate (and threshold) and the share of\n"
               "neurons that carry 80%% of all activations.\n"
               "\n"
               "Options:\n"
               "  -m, --model FILE          the model (GGUF)\n"
               "  -f, --corpus, --file FILE the text\n"
               "  -o, --output FILE         the profile to write\n"
               "  -s, --target-sparsity S   SiLU/GELU models: share of |act(gate)| values per\n"
               "                            layer at or below the threshold, in [0, 1)\n"
               "                            (default 0.5, CATS's setting without fine-tuning)\n"
               "  -p, --plot FILE           the activation CDF (share of neurons, most active\n"
               "                            first, vs cumulative share of activations, per\n"
               "                            layer and whole model): FILE.svg, or FILE.png\n"
               "                            through rsvg-convert\n"
               "  -c, --ctx-size N          window length (default 512)\n"
               "  -n, --n-tokens N          count at most the first N tokens (default: all)\n"
               "      --engine E            starpu (default: the task-graph engine) or ref\n"
               "                            (the reference: llama.cpp's arithmetic bit for\n"
               "                            bit on AVX2, one thread)\n"
               "  -b, --batch-size N        engine: tokens per prefill batch (default 128)\n"
               "      --input-sparsity      also calibrate input sparsity (TEAL): a pass on\n"
               "                            the reference keeps, per layer and matrix input\n"
               "                            (q/k/v, output projection, gate/up, down), the\n"
               "                            magnitude below which a share S of its entries\n"
               "                            fell, for S = 0.05, 0.10, ..., 0.90\n"
               "                            (starinfer.profile.input_thresholds); runs use\n"
               "                            them with --sparsity input=S\n"
               "  -h, --help                show this help\n");
}

/* Does `name` end with `ext` (case-insensitive)? */
static bool ends_with(const char *name, const char *ext)
{
    const size_t n = strlen(name), e = strlen(ext);
    return n > e && strcasecmp(name + n - e, ext) == 0;
}

/* Convert svg to png with rsvg-convert; 0 or a one-line error printed. */
/* rsvg-convert writes a temporary name, renamed to png when it succeeded. */
static int svg_to_png(const char *svg, const char *png)
{
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s.tmp.%ld.png", png, (long)getpid());
    char *args[] = {"rsvg-convert", "-o", tmp, (char *)svg, NULL};
    pid_t pid;
    int e = posix_spawnp(&pid, "rsvg-convert", NULL, NULL, args, environ);
    if (e != 0)
        return si_cli_error("--plot: cannot run rsvg-convert: %s", strerror(e));
    int st;
    while (waitpid(pid, &st, 0) < 0)
        if (errno != EINTR) {
            unlink(tmp);
            return si_cli_error("--plot: waiting for rsvg-convert: %s", strerror(errno));
        }
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
        unlink(tmp);
        return si_cli_error("--plot: rsvg-convert failed to write %s", png);
    }
    if (rename(tmp, png) != 0) {
        e = errno;
        unlink(tmp);
        return si_cli_error("--plot: cannot rename %s to %s: %s", tmp, png, strerror(e));
    }
    return 0;
}

/* The passes over the corpus, window by window (si_cli_windows). */
struct pass {
    struct si_cli_corpus c; /* the model, its runner, the thresholds' pass */
    struct si_profile *prof;
    struct si_input_calib *input;
    struct si_ref_params rp;
};

static int count_pass(void *u, const int32_t *t, int64_t n, char *err, size_t es)
{
    const struct pass *p = u;
    return si_profile_collect(p->prof, p->c.m, p->c.run, t, n, err, es);
}

static int input_pass(void *u, const int32_t *t, int64_t n, char *err, size_t es)
{
    const struct pass *p = u;
    return si_input_calib_collect(p->input, p->c.m, p->rp, t, n, err, es);
}

int si_cmd_profile(int argc, char **argv)
{
    const char *model = NULL, *file = NULL, *output = NULL, *plot = NULL, *v;
    long long n_ctx = 512, max_tokens = -1, n_batch = 128;
    double target = 0.5;
    bool target_given = false, use_ref = false, batch_given = false, input = false;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            profile_usage(stdout);
            return 0;
        } else if (!strcmp(a, "-m") || !strcmp(a, "--model")) {
            if ((model = si_cli_value(argc, argv, &i)) == NULL)
                return 1;
        } else if (!strcmp(a, "-f") || !strcmp(a, "--file") || !strcmp(a, "--corpus")) {
            if ((file = si_cli_value(argc, argv, &i)) == NULL)
                return 1;
        } else if (!strcmp(a, "-o") || !strcmp(a, "--output")) {
            if ((output = si_cli_value(argc, argv, &i)) == NULL)
                return 1;
        } else if (!strcmp(a, "-s") || !strcmp(a, "--target-sparsity")) {
            if ((v = si_cli_value(argc, argv, &i)) == NULL ||
                !si_cli_float(a, v, -HUGE_VAL, HUGE_VAL, &target))
                return 1;
            if (!(target >= 0.0 && target < 1.0))
                return si_cli_error("%s: %g is out of range [0, 1)", a, target);
            target_given = true;
        } else if (!strcmp(a, "-p") || !strcmp(a, "--plot")) {
            if ((plot = si_cli_value(argc, argv, &i)) == NULL)
                return 1;
        } else if (!strcmp(a, "-c") || !strcmp(a, "--ctx-size")) {
            if ((v = si_cli_value(argc, argv, &i)) == NULL || !si_cli_int(a, v, 1, 1 << 20, &n_ctx))
                return 1;
        } else if (!strcmp(a, "-n") || !strcmp(a, "--n-tokens")) {
            if ((v = si_cli_value(argc, argv, &i)) == NULL ||
                !si_cli_int(a, v, 1, INT64_MAX, &max_tokens))
                return 1;
        } else if (!strcmp(a, "--engine")) {
            if ((v = si_cli_value(argc, argv, &i)) == NULL || !si_cli_engine_opt(v, &use_ref))
                return 1;
        } else if (!strcmp(a, "--input-sparsity")) {
            input = true;
        } else if (!strcmp(a, "-b") || !strcmp(a, "--batch-size")) {
            if ((v = si_cli_value(argc, argv, &i)) == NULL || !si_cli_int(a, v, 2, 4096, &n_batch))
                return 1;
            batch_given = true;
        } else {
            return si_cli_error("profile: unknown option '%s' (see starinfer profile --help)", a);
        }
    }
    if (model == NULL)
        return si_cli_error("profile: no model given (-m MODEL.gguf)");
    if (file == NULL)
        return si_cli_error("profile: no text given (-f FILE)");
    if (output == NULL)
        return si_cli_error("profile: no output given (-o PROFILE.gguf)");
    if (use_ref && batch_given)
        return si_cli_error("profile: --batch-size is the engine's: it needs --engine starpu");
    if (plot != NULL && !ends_with(plot, ".svg") && !ends_with(plot, ".png"))
        return si_cli_error("--plot: '%s' names neither an .svg nor a .png file", plot);
    char rsvg[4096];
    if (plot != NULL && ends_with(plot, ".png") && !si_cli_find_in_path("rsvg-convert", rsvg, sizeof rsvg))
        return si_cli_error("--plot: rsvg-convert (librsvg) is not on PATH; it makes the PNG "
                            "(name the plot .svg to write the SVG only)");

    size_t len;
    char *text = si_cli_read_file(file, &len);
    if (text == NULL)
        return 1;
    struct si_model *m = NULL;
    struct si_tokenizer *tok = NULL;
    struct si_profile *prof = NULL;
    struct si_profile_calib *calib = NULL;
    struct si_input_calib *icalib = NULL;
    double *below = NULL;
    struct si_cli_runner cr = {0};
    int32_t *toks = NULL;
    int rc = 1;
    char err[600];
    if (si_cli_load_model(model, &m, &tok) != 0)
        goto out;
    int64_t n = 0;
    if ((toks = si_cli_tokenize_text(tok, text, len, file, &n)) == NULL)
        goto out;
    if (max_tokens > 0 && max_tokens < n)
        n = max_tokens;
    if (si_profile_init(&prof, m->hp.n_layer, m->hp.n_ff, err, sizeof err) != SI_OK) {
        si_cli_error("%s", err);
        goto out;
    }

    /* Window by window (each call starts a fresh window), to show progress:
     * first the thresholds' pass (SiLU/GELU models), then the counting one. */
    if (si_cli_runner_start(&cr, m, use_ref, (int32_t)n_ctx, (int32_t)n_batch) != 0)
        goto out;
    const int64_t n_windows = (n + n_ctx - 1) / n_ctx;
    const bool relu = si_profile_relu_family(m);
    const int passes = relu ? 1 : 2;
    if (si_profile_calib_init(&calib, m, err, sizeof err) != SI_OK) {
        si_cli_error("%s", err);
        goto out;
    }
    double t0 = si__now();
    struct pass ps = {.c = {.calib = calib, .m = m, .run = &cr.r}, .prof = prof};
    if ((!relu && si_cli_windows("profile 1/2 thresholds", toks, n, n_ctx, si_cli_calib_pass,
                                 &ps.c, err, sizeof err) != 0) ||
        si_profile_set_thresholds(prof, calib, target, NULL, err, sizeof err) != SI_OK ||
        si_cli_windows(passes == 2 ? "profile 2/2 counting" : "profile counting", toks, n, n_ctx,
                       count_pass, &ps, err, sizeof err) != 0) {
        si_cli_error("%s", err);
        goto out;
    }
    si_cli_runner_stop(&cr);
    const double secs = si__now() - t0;
    double isecs = 0;
    if (input) {
        /* input sparsity: the reference's inputs, window by window */
        struct si_ref_params rp = si_ref_default_params();
        rp.n_ctx = (int32_t)n_ctx;
        const size_t cells = (size_t)m->hp.n_layer * SI_INPUT_KINDS * SI_INPUT_GRID_N;
        if (si_input_calib_init(&icalib, m, err, sizeof err) != SI_OK) {
            si_cli_error("%s", err);
            goto out;
        }
        if ((below = malloc(cells * sizeof *below)) == NULL) {
            si_cli_error("out of memory");
            goto out;
        }
        const double t1 = si__now();
        ps.input = icalib;
        ps.rp = rp;
        if (si_cli_windows("profile: input sparsity (reference)", toks, n, n_ctx, input_pass, &ps,
                           err, sizeof err) != 0 ||
            si_input_calib_apply(icalib, prof, below, err, sizeof err) != SI_OK) {
            si_cli_error("%s", err);
            goto out;
        }
        isecs = si__now() - t1;
    }
    if (si_profile_write(prof, output, err, sizeof err) != SI_OK) {
        si_cli_error("%s", err);
        goto out;
    }

    printf("profile: %" PRId64 " token%s in %lld window%s of %lld (%d pass%s on the %s, %.1f s, "
           "%.1f tokens/s a pass), %" PRId32 " layers x %" PRId32 " neurons -> %s\n",
           prof->n_tokens, si_cli_s(prof->n_tokens), (long long)n_windows,
           si_cli_s(n_windows), n_ctx, passes, passes > 1 ? "es" : "",
           use_ref ? "reference" : "engine", secs,
           secs > 0 ? (double)passes * (double)prof->n_tokens / secs : 0.0, prof->n_layer,
           prof->n_ff, output);
    if (relu)
        printf("ReLU model: active = activation != 0 (thresholds 0%s)\n",
               target_given ? "; --target-sparsity does not apply" : "");
    else
        printf("%s model: active = |act(gate . x)| above the layer's threshold, the %.3g "
               "quantile of |act(gate . x)| over the corpus (CATS)\n",
               m->hp.act == SI_ACT_GELU ? "GELU" : "SiLU", target);
    double all = 0, tmin = INFINITY, tmax = 0;
    for (int32_t l = 0; l < prof->n_layer; l++) {
        double sum = 0;
        for (int32_t i = 0; i < prof->n_ff; i++)
            sum += (double)prof->counts[(size_t)l * (size_t)prof->n_ff + (size_t)i];
        all += sum;
        const double t = prof->thresholds[l];
        tmin = t < tmin ? t : tmin;
        tmax = t > tmax ? t : tmax;
        printf("layer %3" PRId32 ": mean activation rate %.4f", l,
               sum / ((double)prof->n_ff * (double)prof->n_tokens));
        if (!relu)
            printf(" (threshold %.4g)", t);
        putchar('\n');
    }
    const double top = si_profile_top_fraction(prof, 0.8);
    if (top < 0) {
        si_cli_error("out of memory");
        goto out;
    }
    const double rate = all / ((double)prof->n_layer * (double)prof->n_ff * (double)prof->n_tokens);
    printf("all layers: mean activation rate %.4f (sparsity %.4f); %.1f%% of the neurons carry "
           "80%% of the activations\n",
           rate, 1.0 - rate, 100.0 * top);
    if (!relu)
        printf("thresholds: %.4g to %.4g over the layers (target sparsity %.3g)\n", tmin, tmax,
               target);

    if (input) {
        /* per input kind, over the layers: the thresholds at S = 0.25, 0.40
         * and 0.50 (grid points 4, 7, 9) and the share measured below them */
        static const char *kinds[SI_INPUT_KINDS] = {"q/k/v", "output projection", "gate/up",
                                                    "down"};
        static const int at[3] = {4, 7, 9};
        printf("input sparsity: %" PRId64 " tokens on the reference (%.1f s); thresholds of "
               "S = 0.25 / 0.40 / 0.50, smallest to largest over the layers:\n",
               prof->n_tokens, isecs);
        for (int c = 0; c < SI_INPUT_KINDS; c++) {
            printf("  %-18s", kinds[c]);
            for (int q = 0; q < 3; q++) {
                double lo = INFINITY, hi = 0, bmin = 1, bmax = 0;
                for (int32_t l = 0; l < prof->n_layer; l++) {
                    const size_t k = ((size_t)l * SI_INPUT_KINDS + (size_t)c) * SI_INPUT_GRID_N +
                                     (size_t)at[q];
                    const double t = prof->input_thresholds[k];
                    lo = t < lo ? t : lo;
                    hi = t > hi ? t : hi;
                    bmin = below[k] < bmin ? below[k] : bmin;
                    bmax = below[k] > bmax ? below[k] : bmax;
                }
                printf("%s %.3g-%.3g (%.3f-%.3f below)", q ? " /" : "", lo, hi, bmin, bmax);
            }
            putchar('\n');
        }
    }

    if (plot != NULL) {
        const char *base = strrchr(model, '/') != NULL ? strrchr(model, '/') + 1 : model;
        char title[512];
        if (relu)
            snprintf(title, sizeof title,
                     "%s\nactivation CDF, %" PRId64 " tokens; active: activation != 0 (ReLU)", base,
                     prof->n_tokens);
        else
            snprintf(title, sizeof title,
                     "%s\nactivation CDF, %" PRId64
                     " tokens; active: |act(gate)| > CATS threshold (sparsity %.2g)",
                     base, prof->n_tokens, target);
        const bool png = ends_with(plot, ".png");
        char svg[4096];
        snprintf(svg, sizeof svg, "%s%s", plot, png ? ".tmp.svg" : "");
        if (si_profile_write_svg(prof, svg, title, err, sizeof err) != SI_OK) {
            si_cli_error("%s", err);
            goto out;
        }
        if (png) {
            const int bad = svg_to_png(svg, plot);
            unlink(svg);
            if (bad)
                goto out;
        }
        printf("plot: %s\n", plot);
    }
    rc = 0;
out:
    si_cli_runner_stop(&cr);
    si_profile_free(prof);
    si_profile_calib_free(calib);
    si_input_calib_free(icalib);
    free(below);
    si_tokenizer_free(tok);
    si_model_free(m);
    free(toks);
    free(text);
    return rc;
}
