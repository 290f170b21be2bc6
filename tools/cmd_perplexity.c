/*
 * cmd_perplexity.c - `starinfer perplexity`: the model's perplexity on a text,
 * computed as llama.cpp's perplexity tool computes it, by the evaluation code
 * of src/predict/eval.h in dense mode on the reference forward pass (it
 * scores every position's logits, which the public API's generation has no
 * use for).
 */
#include "cli.h"
#include "model/forward.h"
#include "model/model.h"
#include "model/tokenizer.h"
#include "predict/eval.h"
#include "starinfer.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void perplexity_usage(FILE *f)
{
    fprintf(f, "Usage: " SI_PROG " perplexity -m MODEL -f FILE [OPTIONS]\n"
               "\n"
               "Perplexity of the model on a text, computed as llama.cpp's perplexity tool\n"
               "does: the text (without one trailing newline) is cut into chunks of\n"
               "--ctx-size tokens, each evaluated from an empty cache (its first token\n"
               "replaced by BOS when the model adds one), and the tokens of the second half\n"
               "of each chunk are scored.  Prints the running value after each chunk.\n"
               "\n"
               "Options:\n"
               "  -m, --model FILE   the model (GGUF)\n"
               "  -f, --file FILE    the text\n"
               "  -c, --ctx-size N   chunk length (default 512)\n"
               "      --chunks N     score at most N chunks (default: all)\n"
               "      --kv-f32       keep the KV cache in f32 (default fp16)\n"
               "  -h, --help         show this help\n");
}

/* The running value after each chunk, as llama.cpp prints it. */
static void on_chunk(void *user, int64_t chunk, int64_t n_chunks, double ppl)
{
    (void)user, (void)n_chunks;
    printf("[%" PRId64 "] %.4f\n", chunk, ppl);
    fflush(stdout);
}

int si_cmd_perplexity(int argc, char **argv)
{
    const char *model = NULL, *file = NULL, *v;
    long long n_ctx = 512, max_chunks = -1;
    bool kv_f32 = false;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            perplexity_usage(stdout);
            return 0;
        } else if (!strcmp(a, "-m") || !strcmp(a, "--model")) {
            if ((model = si_cli_value(argc, argv, &i)) == NULL)
                return 1;
        } else if (!strcmp(a, "-f") || !strcmp(a, "--file")) {
            if ((file = si_cli_value(argc, argv, &i)) == NULL)
                return 1;
        } else if (!strcmp(a, "-c") || !strcmp(a, "--ctx-size")) {
            if ((v = si_cli_value(argc, argv, &i)) == NULL || !si_cli_int(a, v, 0, 1 << 20, &n_ctx))
                return 1;
        } else if (!strcmp(a, "--chunks")) {
            if ((v = si_cli_value(argc, argv, &i)) == NULL ||
                !si_cli_int(a, v, 1, 1 << 30, &max_chunks))
                return 1;
        } else if (!strcmp(a, "--kv-f32")) {
            kv_f32 = true;
        } else {
            return si_cli_error("perplexity: unknown option '%s' (see starinfer perplexity --help)",
                                a);
        }
    }
    if (file == NULL)
        return si_cli_error("perplexity: no text given (-f FILE)");
    if (n_ctx < 16)
        return si_cli_error("perplexity: --ctx-size must be at least 16");
    if (model == NULL)
        return si_cli_error("no model given (-m MODEL.gguf)");

    size_t len;
    char *text = si_cli_read_file(file, &len);
    if (text == NULL)
        return 1;
    /* As llama.cpp's tools read -f files: one trailing newline is dropped. */
    if (len > 0 && text[len - 1] == '\n')
        text[--len] = '\0';
    struct si_model *m = NULL;
    struct si_tokenizer *tok = NULL;
    int32_t *toks = NULL;
    int rc = 1;
    char err[600];
    if (si_cli_load_model(model, &m, &tok) != 0)
        goto out;
    int64_t n = 0;
    if ((toks = si_cli_tokenize_text(tok, text, len, file, &n)) == NULL)
        goto out;
    int64_t n_chunks = n / n_ctx;
    if (n_chunks == 0) {
        si_cli_error("%s: %" PRId64 " tokens, fewer than one chunk of %lld", file, n, n_ctx);
        goto out;
    }
    if (max_chunks > 0 && max_chunks < n_chunks)
        n_chunks = max_chunks;
    fprintf(stderr, "%s: %" PRId64 " tokens, %" PRId64 " chunk%s of %lld\n", file, n, n_chunks,
            si_cli_s(n_chunks), n_ctx);

    struct si_ref_params rp = si_ref_default_params();
    rp.n_ctx = (int32_t)n_ctx;
    rp.kv_f16 = !kv_f32;
    const struct si_eval_params ep = {
        .max_chunks = n_chunks,
        .bos = si_tokenizer_add_bos(tok) ? si_tokenizer_bos(tok) : -1,
        .progress = on_chunk,
    };
    struct si_eval_ppl res;
    if (si_eval_perplexity(m, rp, toks, n, &ep, &res, err, sizeof err) != SI_OK) {
        si_cli_error("%s", err);
        goto out;
    }
    printf("Final estimate: PPL = %.4f +/- %.5f (%" PRId64 " tokens scored, %.1f s)\n", res.ppl,
           res.ppl_err, res.n_scored, res.seconds);
    rc = 0;
out:
    si_tokenizer_free(tok);
    si_model_free(m);
    free(toks);
    free(text);
    return rc;
}
