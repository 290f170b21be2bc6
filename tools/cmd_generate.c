/*
 * cmd_generate.c - `starinfer generate` (on the plain-C reference, or the
 * StarPU engine with --engine starpu), a user of the public API, and
 * `starinfer perplexity` (on the reference's internals: it scores every
 * position's logits, which the API's generation has no use for).
 */
#include "cli.h"
#include "model/forward.h"
#include "model/model.h"
#include "model/tokenizer.h"
#include "run_opts.h"
#include "starinfer.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Options both commands share. */
struct common {
    const char *model;
    long long n_ctx;
    bool kv_f32;
};

/* Handle -m/--model, -c/--ctx-size and --kv-f32; 1: consumed, 0: not
 * ours, -1: error (already reported). */
static int common_option(struct common *c, int argc, char **argv, int *i)
{
    const char *a = argv[*i], *v;
    if (!strcmp(a, "-m") || !strcmp(a, "--model")) {
        if ((v = si_cli_value(argc, argv, i)) == NULL)
            return -1;
        c->model = v;
        return 1;
    }
    if (!strcmp(a, "-c") || !strcmp(a, "--ctx-size")) {
        if ((v = si_cli_value(argc, argv, i)) == NULL || !si_cli_int(a, v, 0, 1 << 20, &c->n_ctx))
            return -1;
        return 1;
    }
    if (!strcmp(a, "--kv-f32")) {
        c->kv_f32 = true;
        return 1;
    }
    return 0;
}

/* Load model, tokenizer and reference state; 0 or 1 after an error message. */
static int open_all(const struct common *c, int32_t n_ctx_min, struct si_model **m,
                    struct si_tokenizer **tok, struct si_ref **ref)
{
    char err[600];
    if (c->model == NULL)
        return si_cli_error("no model given (-m MODEL.gguf)");
    if (si_model_load(m, c->model, err, sizeof err) != SI_OK)
        return si_cli_error("%s", err);
    if (si_tokenizer_load(tok, (*m)->gguf, err, sizeof err) != SI_OK)
        return si_cli_error("%s: %s", c->model, err);
    struct si_ref_params rp = si_ref_default_params();
    rp.n_ctx = (int32_t)c->n_ctx;
    if (rp.n_ctx == 0)
        rp.n_ctx = n_ctx_min;
    rp.kv_f16 = !c->kv_f32;
    if (si_ref_init(ref, *m, rp, err, sizeof err) != SI_OK)
        return si_cli_error("%s", err);
    return 0;
}

static void generate_usage(FILE *f)
{
    fprintf(f, "Usage: " SI_PROG " generate -m MODEL (-p PROMPT | -f FILE) [OPTIONS]\n"
               "\n"
               "Continue a prompt, on the reference forward pass or the StarPU engine; the\n"
               "text streams to stdout, timings go to stderr.\n"
               "\n"
               "Options:\n"
               "  -m, --model FILE        the model (GGUF)\n"
               "  -p, --prompt TEXT       the prompt\n"
               "  -f, --file FILE         read the prompt from a file\n"
               "  -n, --n-predict N       tokens to generate (default 128)\n"
               "      --chat              wrap the prompt as a user turn in the chat template\n"
               "                          (starinfer chat: a whole conversation)\n"
               "      --ids               print token ids instead of text\n");
    si_run_usage(f, false);
    fprintf(f, "  -h, --help              show this help\n");
}

/* What the streaming callback of generate needs. */
struct gen_out {
    bool ids;
};

static bool print_token(void *user, int32_t token, const char *text, size_t len)
{
    const struct gen_out *o = user;
    if (o->ids) {
        if (token >= 0)
            printf(" %d", token);
    } else {
        fwrite(text, 1, len, stdout);
    }
    fflush(stdout);
    return true;
}

int si_cmd_generate(int argc, char **argv)
{
    struct si_run_opts o;
    si_run_opts_init(&o, "generate", 128, 0);
    bool chat = false, ids = false;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        int r = si_run_option(&o, argc, argv, &i);
        if (r < 0)
            return 1;
        if (r > 0)
            continue;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            generate_usage(stdout);
            return 0;
        } else if (!strcmp(a, "--chat")) {
            chat = true;
        } else if (!strcmp(a, "--ids")) {
            ids = true;
        } else {
            return si_cli_error("generate: unknown option '%s' (see starinfer generate --help)", a);
        }
    }
    if (o.prompt == NULL && o.file == NULL)
        return si_cli_error("generate: no prompt given (-p TEXT or -f FILE)");
    if (o.prompt != NULL && o.file != NULL)
        return si_cli_error("generate: give either -p or -f, not both");
    if (si_run_check(&o) != 0)
        return 1;

    char *text = NULL;
    size_t text_len = 0;
    if (o.file != NULL) {
        if ((text = si_cli_read_file(o.file, &text_len)) == NULL)
            return 1;
    } else {
        text = strdup(o.prompt);
        text_len = strlen(o.prompt);
    }

    struct si_llm *llm = NULL;
    struct si_context *ctx = NULL;
    int32_t *toks = NULL;
    int rc = 1;
    if (o.model == NULL) {
        si_cli_error("generate: no model given (-m MODEL.gguf)");
        goto out;
    }
    struct si_llm_params lp = si_llm_default_params();
    lp.use_mmap = o.use_mmap;
    if (si_llm_load(o.model, lp, &llm) != SI_OK) {
        si_cli_error("%s", si_last_error());
        goto out;
    }
    if (chat) {
        struct si_chat_message msg = {"user", text};
        int64_t need = si_llm_chat_apply(llm, &msg, 1, true, NULL, 0);
        char *wrapped = need >= 0 ? malloc((size_t)need + 1) : NULL;
        if (need < 0 || wrapped == NULL) {
            si_cli_error("%s: %s", o.model, need < 0 ? si_last_error() : "out of memory");
            goto out;
        }
        si_llm_chat_apply(llm, &msg, 1, true, wrapped, (size_t)need + 1);
        free(text);
        text = wrapped;
        text_len = (size_t)need;
    }
    const bool bos = si_llm_adds_bos(llm);
    int64_t n_prompt = si_llm_tokenize(llm, text, text_len, bos, true, NULL, 0);
    if (n_prompt < 0) {
        si_cli_error("%s", si_last_error());
        goto out;
    }
    if (n_prompt == 0) {
        si_cli_error("generate: the prompt is empty");
        goto out;
    }
    toks = malloc((size_t)n_prompt * sizeof *toks);
    if (toks == NULL) {
        si_cli_error("out of memory");
        goto out;
    }
    si_llm_tokenize(llm, text, text_len, bos, true, toks, (size_t)n_prompt);
    if (o.cp.n_ctx == 0)
        o.cp.n_ctx = (int32_t)(n_prompt + o.n_predict);
    if (n_prompt + o.n_predict > o.cp.n_ctx) {
        si_cli_error("generate: prompt (%lld tokens) + n-predict (%lld) exceed the context of %d",
                     (long long)n_prompt, o.n_predict, o.cp.n_ctx);
        goto out;
    }
    if (si_run_trace_begin(&o) != 0)
        goto out;
    if (si_context_init(llm, o.cp, &ctx) != SI_OK) {
        si_cli_error("%s", si_last_error());
        goto out;
    }

    if (ids) {
        printf("prompt_ids:");
        for (int64_t i = 0; i < n_prompt; i++)
            printf(" %d", toks[i]);
        printf("\nids:");
    } else {
        fwrite(text, 1, text_len, stdout);
    }
    fflush(stdout);

    struct si_generate_params gp = si_generate_default_params();
    gp.n_predict = (int32_t)o.n_predict;
    gp.ignore_eos = o.ignore_eos;
    struct gen_out go = {ids};
    struct si_generate_result res;
    if (si_generate_tokens(ctx, toks, (int32_t)n_prompt, gp, print_token, &go, &res) != SI_OK) {
        printf("\n");
        fflush(stdout);
        si_cli_error("%s", si_last_error());
        goto out;
    }
    printf("\n");
    fflush(stdout);
    fprintf(stderr,
            "prompt: %lld tokens in %.2f s (%.2f tokens/s); generated: %lld tokens in %.2f s (%.2f "
            "tokens/s)\n",
            (long long)res.n_prompt, res.prompt_seconds,
            res.prompt_seconds > 0 ? (double)res.n_prompt / res.prompt_seconds : 0.0,
            (long long)res.n_generated, res.generate_seconds,
            res.n_generated > 0 ? (double)res.n_generated / res.generate_seconds : 0.0);
    struct si_stats st;
    si_context_get_stats(ctx, &st);
    si_run_print_engine_stats(stderr, &st);
    rc = 0;
out:
    si_context_free(ctx); /* StarPU stops with the last context: the trace is written */
    rc = si_run_trace_finish(&o, rc);
    si_llm_free(llm);
    free(toks);
    free(text);
    return rc;
}

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

int si_cmd_perplexity(int argc, char **argv)
{
    struct common c = {.n_ctx = 512};
    const char *file = NULL, *v;
    long long max_chunks = -1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        int r = common_option(&c, argc, argv, &i);
        if (r < 0)
            return 1;
        if (r > 0)
            continue;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            perplexity_usage(stdout);
            return 0;
        } else if (!strcmp(a, "-f") || !strcmp(a, "--file")) {
            if ((file = si_cli_value(argc, argv, &i)) == NULL)
                return 1;
        } else if (!strcmp(a, "--chunks")) {
            if ((v = si_cli_value(argc, argv, &i)) == NULL ||
                !si_cli_int(a, v, 1, 1 << 30, &max_chunks))
                return 1;
        } else {
            return si_cli_error("perplexity: unknown option '%s' (see starinfer perplexity --help)",
                                a);
        }
    }
    if (file == NULL)
        return si_cli_error("perplexity: no text given (-f FILE)");
    if (c.n_ctx < 16)
        return si_cli_error("perplexity: --ctx-size must be at least 16");

    size_t len;
    char *text = si_cli_read_file(file, &len);
    if (text == NULL)
        return 1;
    /* As llama.cpp's tools read -f files: one trailing newline is dropped. */
    if (len > 0 && text[len - 1] == '\n')
        text[--len] = '\0';
    struct si_model *m = NULL;
    struct si_tokenizer *tok = NULL;
    struct si_ref *ref = NULL;
    int32_t *toks = NULL;
    int rc = open_all(&c, (int32_t)c.n_ctx, &m, &tok, &ref);
    if (rc != 0)
        goto out;
    rc = 1;
    const bool bos = si_tokenizer_add_bos(tok);
    int64_t n = si_tokenize(tok, text, len, bos, false, NULL, 0);
    if (n < 0) {
        si_cli_error("cannot tokenize %s: %s", file, si_status_str((int)n));
        goto out;
    }
    toks = malloc((size_t)(n > 0 ? n : 1) * sizeof *toks);
    if (toks == NULL) {
        si_cli_error("out of memory");
        goto out;
    }
    si_tokenize(tok, text, len, bos, false, toks, (size_t)n);
    const int64_t ctx = c.n_ctx;
    int64_t n_chunks = n / ctx;
    if (n_chunks == 0) {
        si_cli_error("%s: %lld tokens, fewer than one chunk of %lld", file, (long long)n,
                     (long long)ctx);
        goto out;
    }
    if (max_chunks > 0 && max_chunks < n_chunks)
        n_chunks = max_chunks;
    fprintf(stderr, "%s: %lld tokens, %lld chunks of %lld\n", file, (long long)n,
            (long long)n_chunks, (long long)ctx);

    const int32_t nv = m->hp.n_vocab;
    const int64_t first = ctx / 2;
    double nll = 0.0, nll2 = 0.0;
    int64_t count = 0;
    double t0 = now();
    for (int64_t ch = 0; ch < n_chunks; ch++) {
        const int32_t *chunk = toks + ch * ctx;
        si_ref_reset(ref);
        /* llama.cpp evaluates a chunk as one batch: f32 attention (its tiled path). */
        ref->attn_f32 = ctx >= 64;
        for (int64_t j = 0; j < ctx - 1; j++) {
            int32_t t = (j == 0 && bos) ? si_tokenizer_bos(tok) : chunk[j];
            if (si_ref_eval(ref, t) != SI_OK) {
                si_cli_error("evaluation failed in chunk %lld", (long long)ch);
                goto out;
            }
            if (j < first)
                continue;
            /* -log softmax(logits)[next], with the max subtracted. */
            const float *lg = ref->logits;
            float mx = lg[0];
            for (int32_t k = 1; k < nv; k++)
                mx = lg[k] > mx ? lg[k] : mx;
            double sum = 0.0;
            for (int32_t k = 0; k < nv; k++)
                sum += exp((double)(lg[k] - mx));
            const double l = log(sum) - (double)(lg[chunk[j + 1]] - mx);
            nll += l;
            nll2 += l * l;
            count++;
        }
        printf("[%lld] %.4f\n", (long long)ch + 1, exp(nll / (double)count));
        fflush(stdout);
    }
    const double mean = nll / (double)count, ppl = exp(mean);
    const double var = count > 1 ? (nll2 / (double)count - mean * mean) / (double)(count - 1) : 0.0;
    printf("Final estimate: PPL = %.4f +/- %.5f (%lld tokens scored, %.1f s)\n", ppl,
           ppl * sqrt(var > 0 ? var : 0), (long long)count, now() - t0);
    rc = 0;
out:
    si_ref_free(ref);
    si_tokenizer_free(tok);
    si_model_free(m);
    free(toks);
    free(text);
    return rc;
}
