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

/* profile's options. */
struct profile_opts {
    const char *model, *file, *output, *plot;
    long long n_ctx, max_tokens, n_batch;
    double target;
    bool target_given, use_ref, batch_given, input;
};

/* The options into o, checked together: 0 to go on, else the exit status
 * (help: 0 printed, -1 for "exit 0"). */
static int profile_options(struct profile_opts *o, int argc, char **argv)
{
    *o = (struct profile_opts){.n_ctx = 512, .max_tokens = -1, .n_batch = 128, .target = 0.5};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        int r;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            profile_usage(stdout);
            return -1;
        } else if (!strcmp(a, "-m") || !strcmp(a, "--model")) {
            r = si_cli_opt_str(argc, argv, &i, &o->model);
        } else if (!strcmp(a, "-f") || !strcmp(a, "--file") || !strcmp(a, "--corpus")) {
            r = si_cli_opt_str(argc, argv, &i, &o->file);
        } else if (!strcmp(a, "-o") || !strcmp(a, "--output")) {
            r = si_cli_opt_str(argc, argv, &i, &o->output);
        } else if (!strcmp(a, "-s") || !strcmp(a, "--target-sparsity")) {
            r = si_cli_opt_range(argc, argv, &i, 0, true, 1, false, &o->target);
            o->target_given = true;
        } else if (!strcmp(a, "-p") || !strcmp(a, "--plot")) {
            r = si_cli_opt_str(argc, argv, &i, &o->plot);
        } else if (!strcmp(a, "-c") || !strcmp(a, "--ctx-size")) {
            r = si_cli_opt_int(argc, argv, &i, 1, 1 << 20, &o->n_ctx);
        } else if (!strcmp(a, "-n") || !strcmp(a, "--n-tokens")) {
            r = si_cli_opt_int(argc, argv, &i, 1, INT64_MAX, &o->max_tokens);
        } else if (!strcmp(a, "--engine")) {
            r = (v = si_cli_value(argc, argv, &i)) != NULL && si_cli_engine_opt(v, &o->use_ref)
                    ? 1
                    : -1;
        } else if (!strcmp(a, "--input-sparsity")) {
            r = 1;
            o->input = true;
        } else if (!strcmp(a, "-b") || !strcmp(a, "--batch-size")) {
            r = si_cli_opt_int(argc, argv, &i, 2, 4096, &o->n_batch);
            o->batch_given = true;
        } else {
            return si_cli_error("profile: unknown option '%s' (see starinfer profile --help)", a);
        }
        if (r < 0)
            return 1;
    }
    if (o->model == NULL)
        return si_cli_error("profile: no model given (-m MODEL.gguf)");
    if (o->file == NULL)
        return si_cli_error("profile: no text given (-f FILE)");
    if (o->output == NULL)
        return si_cli_error("profile: no output given (-o PROFILE.gguf)");
    if (o->use_ref && o->batch_given)
        return si_cli_error("profile: --batch-size is the engine's: it needs --engine starpu");
    if (o->plot != NULL && !ends_with(o->plot, ".svg") && !ends_with(o->plot, ".png"))
        return si_cli_error("--plot: '%s' names neither an .svg nor a .png file", o->plot);
    char rsvg[4096];
    if (o->plot != NULL && ends_with(o->plot, ".png") &&
        !si_cli_find_in_path("rsvg-convert", rsvg, sizeof rsvg))
        return si_cli_error("--plot: rsvg-convert (librsvg) is not on PATH; it makes the PNG "
                            "(name the plot .svg to write the SVG only)");
    return 0;
}

/* A profiling run: the model, the corpus's tokens, the counts and the
 * calibrations (freed by profiling_free). */
struct profiling {
    const struct profile_opts *o;
    char *text;
    size_t len;
    struct si_model *m;
    struct si_tokenizer *tok;
    int32_t *toks;
    int64_t n; /* the tokens counted */
    bool relu;
    struct si_profile *prof;
    struct si_profile_calib *calib;
    struct si_input_calib *icalib;
    double *below; /* --input-sparsity: the share measured below each threshold */
    struct si_cli_runner cr;
    double secs, isecs; /* the counting passes; the input sparsity one */
};

/* The corpus's tokens (at most -n of them), the model and an empty
 * profile; 0, or 1 after an error message. */
static int profiling_load(struct profiling *p)
{
    const struct profile_opts *o = p->o;
    char err[600];
    if ((p->text = si_cli_read_file(o->file, &p->len)) == NULL ||
        si_cli_load_model(o->model, NULL, &p->m, &p->tok) != 0 ||
        (p->toks = si_cli_tokenize_text(p->tok, p->text, p->len, o->file, &p->n)) == NULL)
        return 1;
    if (o->max_tokens > 0 && o->max_tokens < p->n)
        p->n = o->max_tokens;
    if (si_profile_init(&p->prof, p->m->hp.n_layer, p->m->hp.n_ff, err, sizeof err) != SI_OK)
        return si_cli_error("%s", err);
    return 0;
}

/* The passes over the corpus, window by window (each call starts a fresh
 * window), to show progress: first the thresholds' pass (SiLU/GELU
 * models), then the counting one; 0, or 1 after an error message. */
static int profiling_count(struct profiling *p)
{
    const struct profile_opts *o = p->o;
    char err[600];
    if (si_cli_runner_start(&p->cr, p->m, o->use_ref, (int32_t)o->n_ctx, (int32_t)o->n_batch) != 0)
        return 1;
    p->relu = si_profile_relu_family(p->m);
    if (si_profile_calib_init(&p->calib, p->m, err, sizeof err) != SI_OK)
        return si_cli_error("%s", err);
    double t0 = si__now();
    struct pass ps = {.c = {.calib = p->calib, .m = p->m, .run = &p->cr.r}, .prof = p->prof};
    if ((!p->relu && si_cli_windows("profile 1/2 thresholds", p->toks, p->n, o->n_ctx,
                                    si_cli_calib_pass, &ps.c, err, sizeof err) != 0) ||
        si_profile_set_thresholds(p->prof, p->calib, o->target, NULL, err, sizeof err) != SI_OK ||
        si_cli_windows(p->relu ? "profile counting" : "profile 2/2 counting", p->toks, p->n,
                       o->n_ctx, count_pass, &ps, err, sizeof err) != 0)
        return si_cli_error("%s", err);
    si_cli_runner_stop(&p->cr);
    p->secs = si__now() - t0;
    return 0;
}

/* --input-sparsity: the reference's inputs, window by window, calibrated
 * into the profile's input thresholds; 0, or 1 after an error message. */
static int profiling_input(struct profiling *p)
{
    const struct profile_opts *o = p->o;
    char err[600];
    struct si_ref_params rp = si_ref_default_params();
    rp.n_ctx = (int32_t)o->n_ctx;
    const size_t cells = (size_t)p->m->hp.n_layer * SI_INPUT_KINDS * SI_INPUT_GRID_N;
    if (si_input_calib_init(&p->icalib, p->m, err, sizeof err) != SI_OK)
        return si_cli_error("%s", err);
    if ((p->below = malloc(cells * sizeof *p->below)) == NULL)
        return si_cli_error("out of memory");
    const double t1 = si__now();
    struct pass ps = {.c = {.m = p->m}, .input = p->icalib, .rp = rp};
    if (si_cli_windows("profile: input sparsity (reference)", p->toks, p->n, o->n_ctx, input_pass,
                       &ps, err, sizeof err) != 0 ||
        si_input_calib_apply(p->icalib, p->prof, p->below, err, sizeof err) != SI_OK)
        return si_cli_error("%s", err);
    p->isecs = si__now() - t1;
    return 0;
}

/* The counts' summary: the passes, the rule, each layer's activation rate
 * (and threshold), all layers'; 0, or 1 after an error message. */
static int print_counts(const struct profiling *p)
{
    const struct profile_opts *o = p->o;
    const struct si_profile *prof = p->prof;
    const int64_t n_windows = (p->n + o->n_ctx - 1) / o->n_ctx;
    const int passes = p->relu ? 1 : 2;
    printf("profile: %" PRId64 " token%s in %lld window%s of %lld (%d pass%s on the %s, %.1f s, "
           "%.1f tokens/s a pass), %" PRId32 " layers x %" PRId32 " neurons -> %s\n",
           prof->n_tokens, si_cli_s(prof->n_tokens), (long long)n_windows, si_cli_s(n_windows),
           o->n_ctx, passes, passes > 1 ? "es" : "", o->use_ref ? "reference" : "engine", p->secs,
           p->secs > 0 ? (double)passes * (double)prof->n_tokens / p->secs : 0.0, prof->n_layer,
           prof->n_ff, o->output);
    if (p->relu)
        printf("ReLU model: active = activation != 0 (thresholds 0%s)\n",
               o->target_given ? "; --target-sparsity does not apply" : "");
    else
        printf("%s model: active = |act(gate . x)| above the layer's threshold, the %.3g "
               "quantile of |act(gate . x)| over the corpus (CATS)\n",
               p->m->hp.act == SI_ACT_GELU ? "GELU" : "SiLU", o->target);
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
        if (!p->relu)
            printf(" (threshold %.4g)", t);
        putchar('\n');
    }
    const double top = si_profile_top_fraction(prof, 0.8);
    if (top < 0)
        return si_cli_error("out of memory");
    const double rate = all / ((double)prof->n_layer * (double)prof->n_ff * (double)prof->n_tokens);
    printf("all layers: mean activation rate %.4f (sparsity %.4f); %.1f%% of the neurons carry "
           "80%% of the activations\n",
           rate, 1.0 - rate, 100.0 * top);
    if (!p->relu)
        printf("thresholds: %.4g to %.4g over the layers (target sparsity %.3g)\n", tmin, tmax,
               o->target);
    return 0;
}

/* --input-sparsity's summary: per input kind, over the layers, the
 * thresholds at S = 0.25, 0.40 and 0.50 (grid points 4, 7, 9) and the share
 * measured below them. */
static void print_input(const struct profiling *p)
{
    static const char *kinds[SI_INPUT_KINDS] = {"q/k/v", "output projection", "gate/up", "down"};
    static const int at[3] = {4, 7, 9};
    const struct si_profile *prof = p->prof;
    printf("input sparsity: %" PRId64 " tokens on the reference (%.1f s); thresholds of "
           "S = 0.25 / 0.40 / 0.50, smallest to largest over the layers:\n",
           prof->n_tokens, p->isecs);
    for (int c = 0; c < SI_INPUT_KINDS; c++) {
        printf("  %-18s", kinds[c]);
        for (int q = 0; q < 3; q++) {
            double lo = INFINITY, hi = 0, bmin = 1, bmax = 0;
            for (int32_t l = 0; l < prof->n_layer; l++) {
                const size_t k =
                    ((size_t)l * SI_INPUT_KINDS + (size_t)c) * SI_INPUT_GRID_N + (size_t)at[q];
                const double t = prof->input_thresholds[k];
                lo = t < lo ? t : lo;
                hi = t > hi ? t : hi;
                bmin = p->below[k] < bmin ? p->below[k] : bmin;
                bmax = p->below[k] > bmax ? p->below[k] : bmax;
            }
            printf("%s %.3g-%.3g (%.3f-%.3f below)", q ? " /" : "", lo, hi, bmin, bmax);
        }
        putchar('\n');
    }
}

/* --plot: the activation CDF as an SVG, converted to PNG when the name
 * asks for one; 0, or 1 after an error message. */
static int write_plot(const struct profiling *p)
{
    const struct profile_opts *o = p->o;
    const char *base = strrchr(o->model, '/') != NULL ? strrchr(o->model, '/') + 1 : o->model;
    char title[512], err[600];
    if (p->relu)
        snprintf(title, sizeof title,
                 "%s\nactivation CDF, %" PRId64 " tokens; active: activation != 0 (ReLU)", base,
                 p->prof->n_tokens);
    else
        snprintf(title, sizeof title,
                 "%s\nactivation CDF, %" PRId64
                 " tokens; active: |act(gate)| > CATS threshold (sparsity %.2g)",
                 base, p->prof->n_tokens, o->target);
    const bool png = ends_with(o->plot, ".png");
    char svg[4096];
    snprintf(svg, sizeof svg, "%s%s", o->plot, png ? ".tmp.svg" : "");
    if (si_profile_write_svg(p->prof, svg, title, err, sizeof err) != SI_OK)
        return si_cli_error("%s", err);
    if (png) {
        const int bad = svg_to_png(svg, o->plot);
        unlink(svg);
        if (bad)
            return 1;
    }
    printf("plot: %s\n", o->plot);
    return 0;
}

/* Everything the run holds, the runner stopped. */
static void profiling_free(struct profiling *p)
{
    si_cli_runner_stop(&p->cr);
    si_profile_free(p->prof);
    si_profile_calib_free(p->calib);
    si_input_calib_free(p->icalib);
    free(p->below);
    si_tokenizer_free(p->tok);
    si_model_free(p->m);
    free(p->toks);
    free(p->text);
}

int si_cmd_profile(int argc, char **argv)
{
    struct profile_opts o;
    int rc = profile_options(&o, argc, argv);
    if (rc != 0)
        return rc < 0 ? 0 : rc;
    struct profiling p = {.o = &o};
    char err[600];
    rc = 1;
    if (profiling_load(&p) != 0 || profiling_count(&p) != 0 ||
        (o.input && profiling_input(&p) != 0))
        goto out;
    if (si_profile_write(p.prof, o.output, err, sizeof err) != SI_OK) {
        si_cli_error("%s", err);
        goto out;
    }
    if (print_counts(&p) != 0)
        goto out;
    if (o.input)
        print_input(&p);
    if (o.plot != NULL && write_plot(&p) != 0)
        goto out;
    rc = 0;
out:
    profiling_free(&p);
    return rc;
}
