/* cmd_profile.c - `starinfer profile`: count FFN neuron activations over a text. */
#include "cli.h"
#include "model/forward.h"
#include "model/model.h"
#include "model/tokenizer.h"
#include "predict/profile.h"
#include "starinfer.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void profile_usage(FILE *f)
{
    fprintf(f, "Usage: " SI_PROG " profile -m MODEL -f TEXT_FILE -o PROFILE [OPTIONS]\n"
               "\n"
               "Count, for every FFN neuron of every layer, how many tokens of a text activate\n"
               "it (activation not zero), on the reference forward pass, and write the counts\n"
               "as a GGUF profile (starinfer.profile.* keys, blk.N.ffn_act_count tensors).\n"
               "The text is tokenized as a whole (BOS first when the model adds one) and\n"
               "evaluated in windows of --ctx-size tokens, each from an empty cache and, when\n"
               "the model adds BOS, with BOS in place of its first token.  Prints the tokens\n"
               "counted, each layer's mean activation rate and the share of neurons that\n"
               "carry 80%% of all activations.\n"
               "\n"
               "Options:\n"
               "  -m, --model FILE     the model (GGUF)\n"
               "  -f, --file FILE      the text\n"
               "  -o, --output FILE    the profile to write\n"
               "  -c, --ctx-size N     window length (default 512)\n"
               "  -n, --n-tokens N     count at most the first N tokens (default: all)\n"
               "  -h, --help           show this help\n");
}

int si_cmd_profile(int argc, char **argv)
{
    const char *model = NULL, *file = NULL, *output = NULL, *v;
    long long n_ctx = 512, max_tokens = -1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            profile_usage(stdout);
            return 0;
        } else if (!strcmp(a, "-m") || !strcmp(a, "--model")) {
            if ((model = si_cli_value(argc, argv, &i)) == NULL)
                return 1;
        } else if (!strcmp(a, "-f") || !strcmp(a, "--file")) {
            if ((file = si_cli_value(argc, argv, &i)) == NULL)
                return 1;
        } else if (!strcmp(a, "-o") || !strcmp(a, "--output")) {
            if ((output = si_cli_value(argc, argv, &i)) == NULL)
                return 1;
        } else if (!strcmp(a, "-c") || !strcmp(a, "--ctx-size")) {
            if ((v = si_cli_value(argc, argv, &i)) == NULL || !si_cli_int(a, v, 1, 1 << 20, &n_ctx))
                return 1;
        } else if (!strcmp(a, "-n") || !strcmp(a, "--n-tokens")) {
            if ((v = si_cli_value(argc, argv, &i)) == NULL ||
                !si_cli_int(a, v, 1, INT64_MAX, &max_tokens))
                return 1;
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

    size_t len;
    char *text = si_cli_read_file(file, &len);
    if (text == NULL)
        return 1;
    struct si_model *m = NULL;
    struct si_tokenizer *tok = NULL;
    struct si_profile *prof = NULL;
    int32_t *toks = NULL;
    int rc = 1;
    char err[600];
    if (si_model_load(&m, model, err, sizeof err) != SI_OK) {
        si_cli_error("%s", err);
        goto out;
    }
    if (si_tokenizer_load(&tok, m->gguf, err, sizeof err) != SI_OK) {
        si_cli_error("%s: %s", model, err);
        goto out;
    }
    const bool bos = si_tokenizer_add_bos(tok);
    int64_t n = si_tokenize(tok, text, len, bos, false, NULL, 0);
    if (n < 0) {
        si_cli_error("cannot tokenize %s: %s", file, si_status_str((int)n));
        goto out;
    }
    if (n == 0) {
        si_cli_error("%s: no tokens to profile", file);
        goto out;
    }
    toks = malloc((size_t)n * sizeof *toks);
    if (toks == NULL) {
        si_cli_error("out of memory");
        goto out;
    }
    si_tokenize(tok, text, len, bos, false, toks, (size_t)n);
    if (max_tokens > 0 && max_tokens < n)
        n = max_tokens;
    if (si_profile_init(&prof, m->hp.n_layer, m->hp.n_ff, err, sizeof err) != SI_OK) {
        si_cli_error("%s", err);
        goto out;
    }

    /* Window by window (each call starts a fresh window), to show progress. */
    struct si_ref_params rp = si_ref_default_params();
    rp.n_ctx = (int32_t)n_ctx;
    const int64_t n_windows = (n + n_ctx - 1) / n_ctx;
    const bool tty = isatty(STDERR_FILENO);
    double t0 = now();
    for (int64_t w = 0; w < n_windows; w++) {
        const int64_t start = w * n_ctx, len_w = n - start < n_ctx ? n - start : n_ctx;
        if (si_profile_collect(prof, m, rp, toks + start, len_w, err, sizeof err) != SI_OK) {
            si_cli_error("%s", err);
            goto out;
        }
        if (tty)
            fprintf(stderr, "\rprofile: window %lld/%lld", (long long)w + 1, (long long)n_windows);
    }
    const double secs = now() - t0;
    if (tty)
        fputc('\n', stderr);
    if (si_profile_write(prof, output, err, sizeof err) != SI_OK) {
        si_cli_error("%s", err);
        goto out;
    }

    printf("profile: %" PRId64 " tokens in %lld windows of %lld (%.1f s, %.1f tokens/s), %" PRId32
           " layers x %" PRId32 " neurons -> %s\n",
           prof->n_tokens, (long long)n_windows, n_ctx, secs,
           secs > 0 ? (double)prof->n_tokens / secs : 0.0, prof->n_layer, prof->n_ff, output);
    double all = 0;
    for (int32_t l = 0; l < prof->n_layer; l++) {
        double sum = 0;
        for (int32_t i = 0; i < prof->n_ff; i++)
            sum += (double)prof->counts[(size_t)l * (size_t)prof->n_ff + (size_t)i];
        all += sum;
        printf("layer %3" PRId32 ": mean activation rate %.4f\n", l,
               sum / ((double)prof->n_ff * (double)prof->n_tokens));
    }
    const double top = si_profile_top_fraction(prof, 0.8);
    if (top < 0) {
        si_cli_error("out of memory");
        goto out;
    }
    printf("all layers: mean activation rate %.4f (sparsity %.4f); %.1f%% of the neurons carry "
           "80%% of the activations\n",
           all / ((double)prof->n_layer * (double)prof->n_ff * (double)prof->n_tokens),
           1.0 - all / ((double)prof->n_layer * (double)prof->n_ff * (double)prof->n_tokens),
           100.0 * top);
    rc = 0;
out:
    si_profile_free(prof);
    si_tokenizer_free(tok);
    si_model_free(m);
    free(toks);
    free(text);
    return rc;
}
