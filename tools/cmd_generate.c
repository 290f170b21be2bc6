/*
 * cmd_generate.c - `starinfer generate` (on the plain-C reference, or the
 * StarPU engine with --engine starpu), a user of the public API only.
 */
#include "cli.h"
#include "run_opts.h"
#include "starinfer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
    return !si_cli_interrupted();
}

/* A generation: the options, the prompt, the model and its context. */
struct gen {
    struct si_run_opts o;
    bool chat, ids; /* --chat, --ids */
    char *text;     /* the prompt (--chat: framed by the template) */
    size_t text_len;
    struct si_llm *llm;
    struct si_context *ctx;
    int32_t *toks; /* the prompt's tokens, n_prompt */
    int64_t n_prompt;
};

/* The options into g->o, g->chat and g->ids: 0 to go on, else the exit
 * status (help: 0 printed, -1 for "exit 0"). */
static int generate_options(struct gen *g, int argc, char **argv)
{
    si_run_opts_init(&g->o, "generate", 128, 0);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        int r = si_run_option(&g->o, argc, argv, &i);
        if (r < 0)
            return 1;
        if (r > 0)
            continue;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            generate_usage(stdout);
            return -1;
        } else if (!strcmp(a, "--chat")) {
            g->chat = true;
        } else if (!strcmp(a, "--ids")) {
            g->ids = true;
        } else {
            return si_cli_error("generate: unknown option '%s' (see starinfer generate --help)", a);
        }
    }
    if (g->o.prompt == NULL && g->o.file == NULL)
        return si_cli_error("generate: no prompt given (-p TEXT or -f FILE)");
    if (g->o.prompt != NULL && g->o.file != NULL)
        return si_cli_error("generate: give either -p or -f, not both");
    return si_run_check(&g->o) != 0 ? 1 : 0;
}

/* The model, and with --chat the prompt framed as a user turn by its chat
 * template; 0, or 1 after an error message. */
static int gen_load(struct gen *g)
{
    struct si_llm_params lp = si_llm_default_params();
    lp.use_mmap = g->o.use_mmap;
    lp.predictors = g->o.predictors;
    if (si_llm_load(g->o.model, lp, &g->llm) != SI_OK)
        return si_cli_error("%s", si_last_error());
    if (!g->chat)
        return 0;
    struct si_chat_message msg = {"user", g->text};
    int64_t need = si_llm_chat_apply(g->llm, &msg, 1, true, NULL, 0);
    char *wrapped = need >= 0 ? malloc((size_t)need + 1) : NULL;
    if (need < 0 || wrapped == NULL)
        return si_cli_error("%s: %s", g->o.model, need < 0 ? si_last_error() : "out of memory");
    si_llm_chat_apply(g->llm, &msg, 1, true, wrapped, (size_t)need + 1);
    free(g->text);
    g->text = wrapped;
    g->text_len = (size_t)need;
    return 0;
}

/* The prompt's tokens, the context (-c, else prompt + -n) checked to hold
 * them and what is generated; 0, or 1 after an error message. */
static int gen_tokenize(struct gen *g)
{
    struct si_run_opts *o = &g->o;
    const bool bos = si_llm_adds_bos(g->llm);
    const int64_t n = si_llm_tokenize(g->llm, g->text, g->text_len, bos, true, NULL, 0);
    if (n < 0)
        return si_cli_error("%s", si_last_error());
    if (n == 0)
        return si_cli_error("generate: the prompt is empty");
    if ((g->toks = malloc((size_t)n * sizeof *g->toks)) == NULL)
        return si_cli_error("out of memory");
    si_llm_tokenize(g->llm, g->text, g->text_len, bos, true, g->toks, (size_t)n);
    g->n_prompt = n;
    if (o->cp.n_ctx == 0)
        o->cp.n_ctx = (int32_t)(n + o->n_predict);
    if (o->context_shift && n >= o->cp.n_ctx)
        return si_cli_error("generate: the prompt (%lld tokens) does not fit the context of %d, "
                            "even with --context-shift (it shifts generated tokens, not the "
                            "prompt)",
                            (long long)n, o->cp.n_ctx);
    if (!o->context_shift && n + o->n_predict > o->cp.n_ctx)
        return si_cli_error("generate: prompt (%lld tokens) + n-predict (%lld) exceed the context "
                            "of %d",
                            (long long)n, o->n_predict, o->cp.n_ctx);
    return 0;
}

/* The prompt (or its ids) echoed, the generation streamed to stdout and
 * its figures to stderr; 0, SI_CLI_INTERRUPTED, or 1 after an error
 * message. */
static int gen_run(struct gen *g)
{
    const struct si_run_opts *o = &g->o;
    if (g->ids) {
        printf("prompt_ids:");
        for (int64_t i = 0; i < g->n_prompt; i++)
            printf(" %d", g->toks[i]);
        printf("\nids:");
    } else {
        fwrite(g->text, 1, g->text_len, stdout);
    }
    fflush(stdout);
    struct si_generate_params gp = si_generate_default_params();
    gp.n_predict = (int32_t)o->n_predict;
    gp.ignore_eos = o->ignore_eos;
    gp.context_shift = o->context_shift;
    gp.n_keep = (int32_t)(o->n_keep < g->n_prompt ? o->n_keep : g->n_prompt);
    struct gen_out go = {g->ids};
    struct si_generate_result res;
    si_cli_sigint_catch();
    const int rc =
        si_generate_tokens(g->ctx, g->toks, (int32_t)g->n_prompt, gp, print_token, &go, &res);
    printf("\n");
    fflush(stdout);
    if (si_cli_interrupted()) {
        si_cli_error("generate: interrupted after %lld generated token%s",
                     (long long)res.n_generated, si_cli_s(res.n_generated));
        return SI_CLI_INTERRUPTED;
    }
    if (rc != SI_OK)
        return si_cli_error("%s", si_last_error());
    char shifted[96] = "";
    if (res.n_shifted > 0)
        snprintf(shifted, sizeof shifted, "; context shifts dropped %d token%s", res.n_shifted,
                 si_cli_s(res.n_shifted));
    fprintf(stderr,
            "prompt: %lld token%s in %.2f s (%.2f tokens/s); generated: %lld token%s in %.2f s "
            "(%.2f tokens/s)%s\n",
            (long long)res.n_prompt, si_cli_s(res.n_prompt), res.prompt_seconds,
            res.prompt_seconds > 0 ? (double)res.n_prompt / res.prompt_seconds : 0.0,
            (long long)res.n_generated, si_cli_s(res.n_generated), res.generate_seconds,
            res.n_generated > 0 ? (double)res.n_generated / res.generate_seconds : 0.0, shifted);
    struct si_stats st;
    si_context_get_stats(g->ctx, &st);
    si_run_print_engine_stats(stderr, o, &st);
    return 0;
}

int si_cmd_generate(int argc, char **argv)
{
    struct gen g = {0};
    int rc = generate_options(&g, argc, argv);
    if (rc != 0)
        return rc < 0 ? 0 : rc;
    if (g.o.file != NULL) {
        if ((g.text = si_cli_read_file(g.o.file, &g.text_len)) == NULL)
            return 1;
    } else {
        g.text = strdup(g.o.prompt);
        g.text_len = strlen(g.o.prompt);
    }
    rc = 1;
    if (g.o.model == NULL) {
        si_cli_error("generate: no model given (-m MODEL.gguf)");
        goto out;
    }
    if (gen_load(&g) != 0 || gen_tokenize(&g) != 0 || si_run_trace_begin(&g.o) != 0)
        goto out;
    si_run_note_ctx(g.llm, g.o.cp.n_ctx);
    if (si_context_init(g.llm, g.o.cp, &g.ctx) != SI_OK) {
        si_cli_error("%s", si_last_error());
        goto out;
    }
    si_run_note_kv(g.llm, &g.o.cp, si_context_n_ctx(g.ctx));
    rc = gen_run(&g);
out:
    si_context_free(g.ctx); /* StarPU stops with the last context: the trace is written */
    rc = si_run_trace_finish(&g.o, rc);
    si_llm_free(g.llm);
    free(g.toks);
    free(g.text);
    return rc;
}
