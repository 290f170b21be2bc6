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
    if (o.context_shift && n_prompt >= o.cp.n_ctx) {
        si_cli_error("generate: the prompt (%lld tokens) does not fit the context of %d, even "
                     "with --context-shift (it shifts generated tokens, not the prompt)",
                     (long long)n_prompt, o.cp.n_ctx);
        goto out;
    }
    if (!o.context_shift && n_prompt + o.n_predict > o.cp.n_ctx) {
        si_cli_error("generate: prompt (%lld tokens) + n-predict (%lld) exceed the context of %d",
                     (long long)n_prompt, o.n_predict, o.cp.n_ctx);
        goto out;
    }
    if (si_run_trace_begin(&o) != 0)
        goto out;
    si_run_note_ctx(llm, o.cp.n_ctx);
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
    gp.context_shift = o.context_shift;
    gp.n_keep = (int32_t)(o.n_keep < n_prompt ? o.n_keep : n_prompt);
    struct gen_out go = {ids};
    struct si_generate_result res;
    si_cli_sigint_catch();
    const int g = si_generate_tokens(ctx, toks, (int32_t)n_prompt, gp, print_token, &go, &res);
    printf("\n");
    fflush(stdout);
    if (si_cli_interrupted()) {
        si_cli_error("generate: interrupted after %lld generated token%s", (long long)res.n_generated,
                     si_cli_s(res.n_generated));
        rc = SI_CLI_INTERRUPTED;
        goto out;
    }
    if (g != SI_OK) {
        si_cli_error("%s", si_last_error());
        goto out;
    }
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
    si_context_get_stats(ctx, &st);
    si_run_print_engine_stats(stderr, &o, &st);
    rc = 0;
out:
    si_context_free(ctx); /* StarPU stops with the last context: the trace is written */
    rc = si_run_trace_finish(&o, rc);
    si_llm_free(llm);
    free(toks);
    free(text);
    return rc;
}
