/*
 * cmd_chat.c - `starinfer chat`: an interactive conversation, a user of the
 * public API.
 *
 * Each turn the whole conversation goes through the model's chat template
 * and is tokenized; the context keeps the longest prefix of those tokens it
 * already holds (si_context_reuse_prefix) and evaluates only the rest, so a
 * turn costs its own tokens, not the whole conversation again.  Reading
 * stdin line by line, it works the same on a terminal and on a pipe.
 */
#include "buf.h"
#include "cli.h"
#include "run_opts.h"
#include "starinfer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void chat_usage(FILE *f)
{
    fprintf(f, "Usage: " SI_PROG " chat -m MODEL [-p SYSTEM | -f FILE] [OPTIONS]\n"
               "\n"
               "Chat with a model: each line read from stdin is a user turn; the answer\n"
               "streams to stdout as the model's chat template frames the whole\n"
               "conversation.  The KV cache is kept across turns: only each turn's new\n"
               "tokens are evaluated.  /exit or the end of input ends the chat; a line\n"
               "ending with \\ continues on the next one.  Per-turn timings go to stderr.\n"
               "Under mpirun the model runs across the ranks; rank 0 reads stdin.\n"
               "\n"
               "Options:\n"
               "  -m, --model FILE        the model (GGUF)\n"
               "  -p, --prompt TEXT       the system message (as llama-cli's conversation\n"
               "                          mode; default: the template's own, if any)\n"
               "  -f, --file FILE         read the system message from a file\n"
               "  -n, --n-predict N       tokens per answer at most (default -1: until the\n"
               "                          end of the turn or a full context)\n");
    si_run_usage(f, true);
    fprintf(f, "  -h, --help              show this help\n");
}

/* One user turn from stdin: a line, joined with the next while it ends with
 * a backslash.  false at the end of input (with nothing read). */
static bool read_turn(struct si_buf *line)
{
    line->n = 0;
    if (line->p != NULL)
        line->p[0] = '\0';
    bool any = false;
    char chunk[1024];
    while (fgets(chunk, sizeof chunk, stdin) != NULL) {
        any = true;
        size_t n = strlen(chunk);
        bool eol = n > 0 && chunk[n - 1] == '\n';
        if (eol)
            n--;
        if (!si_buf_add(line, chunk, n))
            return false;
        if (!eol)
            continue; /* a longer line, or the last one without a newline */
        if (line->n > 0 && line->p[line->n - 1] == '\\') {
            line->p[line->n - 1] = '\n';
            continue;
        }
        return true;
    }
    return any;
}

/* The next turn: read by rank 0 (the one mpirun gives stdin) and shared
 * with the other ranks, which run the same turns (one process: read).  1: a
 * turn in line, 0: the input ended (or Ctrl-C), -1: out of memory. */
static int next_turn(struct si_context *ctx, struct si_buf *line)
{
    const int rank = si_context_mpi_rank(ctx);
    int32_t hdr[2] = {0, 0}; /* a turn?, its length */
    if (rank == 0) {
        hdr[0] = read_turn(line) && !si_cli_interrupted() && line->n < INT32_MAX;
        hdr[1] = hdr[0] ? (int32_t)line->n : 0;
    }
    if (si_context_mpi_size(ctx) < 2)
        return hdr[0];
    si_context_share(ctx, hdr, sizeof hdr);
    if (hdr[0] == 0)
        return 0;
    if (rank == 0)
        return si_context_share(ctx, line->p, (size_t)hdr[1]) == SI_OK ? 1 : -1;
    /* A rank that cannot take the line ends with an error, and mpirun the run. */
    line->n = 0;
    char *tmp = malloc((size_t)hdr[1] + 1);
    if (tmp == NULL)
        return -1;
    bool ok =
        si_context_share(ctx, tmp, (size_t)hdr[1]) == SI_OK && si_buf_add(line, tmp, (size_t)hdr[1]);
    free(tmp);
    return ok ? 1 : -1;
}

struct answer {
    struct si_buf text;
    bool oom;
};

static bool stream_text(void *user, int32_t token, const char *text, size_t len)
{
    (void)token;
    struct answer *a = user;
    fwrite(text, 1, len, stdout);
    fflush(stdout);
    if (!si_buf_add(&a->text, text, len))
        a->oom = true;
    return !a->oom && !si_cli_interrupted();
}

/* The conversation framed by the model's template and tokenized into
 * *toks (grown as needed): its token count, or -1 after an error. */
static int64_t render(struct si_llm *llm, const struct si_chat_message *msgs, size_t n_msgs,
                      bool gen_prompt, struct si_buf *conv, int32_t **toks, size_t *cap_toks)
{
    int64_t len = si_llm_chat_apply(llm, msgs, n_msgs, gen_prompt, NULL, 0);
    if (len < 0)
        return si_cli_error("%s", si_last_error()), -1;
    if ((size_t)len + 1 > conv->cap) {
        char *p = realloc(conv->p, (size_t)len + 1);
        if (p == NULL)
            return si_cli_error("out of memory"), -1;
        conv->p = p;
        conv->cap = (size_t)len + 1;
    }
    si_llm_chat_apply(llm, msgs, n_msgs, gen_prompt, conv->p, conv->cap);
    const bool bos = si_llm_adds_bos(llm);
    int64_t n = si_llm_tokenize(llm, conv->p, (size_t)len, bos, true, NULL, 0);
    if (n < 0)
        return si_cli_error("%s", si_last_error()), -1;
    if ((size_t)n > *cap_toks) {
        int32_t *t = realloc(*toks, (size_t)n * sizeof *t);
        if (t == NULL)
            return si_cli_error("out of memory"), -1;
        *toks = t;
        *cap_toks = (size_t)n;
    }
    si_llm_tokenize(llm, conv->p, (size_t)len, bos, true, *toks, (size_t)n);
    return n;
}

/*
 * --context-shift, before a turn whose conversation no longer fits: the
 * cache holds the conversation as it was (less what shifts dropped); the
 * new one lacks its oldest turns.  Both start alike (the system message);
 * after that the new one's tokens are the cache's from some offset d on.
 * The d that lines up the most tokens is shifted out (si_context_shift), so
 * that si_context_reuse_prefix keeps them instead of evaluating them again.
 * Returns the tokens dropped (0: nothing lined up).
 */
static int32_t align_cache(struct si_context *ctx, const int32_t *toks, int32_t n)
{
    const int32_t past = si_context_n_past(ctx);
    const int32_t *h = si_context_tokens(ctx);
    int32_t p = 0;
    while (p < past && p < n && h[p] == toks[p])
        p++;
    int32_t best = 0, best_len = 0;
    for (int32_t d = 1; p + d < past; d++) {
        int32_t len = 0;
        while (p + d + len < past && p + len < n && h[p + d + len] == toks[p + len])
            len++;
        if (len > best_len) {
            best = d;
            best_len = len;
        }
    }
    /* (a few tokens alike by chance are not the conversation) */
    if ((best_len < 8 && best_len < past - p - best) || si_context_shift(ctx, p, best) != SI_OK)
        return 0;
    return best;
}

/* A conversation in progress. */
struct chat {
    const struct si_run_opts *o;
    struct si_llm *llm;
    struct si_context *ctx;
    int32_t n_ctx;
    struct si_chat_message *msgs;
    size_t n_msgs, cap_msgs, system_msgs; /* system_msgs: 1 with a system message */
    int dropped_turns;                    /* --context-shift: turns dropped so far */
    int32_t *sys;                         /* the system message's tokens, n_sys */
    int64_t n_sys;
    struct si_buf conv;                   /* the framed conversation */
    int32_t *toks;                        /* its tokens */
    size_t cap_toks;
};

/* Append a message that takes content (freed with the chat); false when
 * out of memory (content freed). */
static bool add_message(struct chat *c, const char *role, char *content)
{
    if (content == NULL)
        return false;
    if (c->n_msgs + 1 > c->cap_msgs) {
        size_t cap = c->cap_msgs >= 4 ? 2 * c->cap_msgs : 8;
        struct si_chat_message *m = realloc(c->msgs, cap * sizeof *m);
        if (m == NULL) {
            free(content);
            return false;
        }
        c->msgs = m;
        c->cap_msgs = cap;
    }
    c->msgs[c->n_msgs++] = (struct si_chat_message){role, content};
    return true;
}

/*
 * The whole conversation, framed, then tokenized into c->toks; with
 * --context-shift, its oldest turns after the system message dropped until
 * it fits with room for the answer (-n, else a quarter of the context), so
 * that a shift falls between turns, where the cache lines up with the
 * conversation that remains.  Its token count, or -1 after an error.
 */
static int64_t fit_conversation(struct chat *c, int turn)
{
    const struct si_run_opts *o = c->o;
    int64_t n = render(c->llm, c->msgs, c->n_msgs, true, &c->conv, &c->toks, &c->cap_toks);
    const size_t first = c->system_msgs;
    const int64_t reserve =
        o->n_predict > 0 && o->n_predict < c->n_ctx / 2 ? o->n_predict : c->n_ctx / 4;
    while (n >= 0 && o->context_shift && n + reserve > c->n_ctx && c->n_msgs - first > 2) {
        /* the oldest question and its answer */
        free((char *)c->msgs[first].content);
        free((char *)c->msgs[first + 1].content);
        memmove(c->msgs + first, c->msgs + first + 2, (c->n_msgs - first - 2) * sizeof *c->msgs);
        c->n_msgs -= 2;
        c->dropped_turns++;
        n = render(c->llm, c->msgs, c->n_msgs, true, &c->conv, &c->toks, &c->cap_toks);
    }
    if (n >= c->n_ctx)
        return si_cli_error("chat: the conversation (%lld tokens) %s the context of %d tokens (-c)",
                            (long long)n, turn > 1 ? "no longer fits" : "does not fit", c->n_ctx),
               -1;
    return n;
}

/* The tokens a context shift keeps: --keep, else the system message's where
 * they start the conversation (n tokens in c->toks), else the BOS. */
static int32_t keep_of(const struct chat *c, int64_t n)
{
    if (c->o->n_keep > 0)
        return (int32_t)(c->o->n_keep < n ? c->o->n_keep : n);
    if (c->sys != NULL && c->n_sys <= n && !memcmp(c->sys, c->toks, (size_t)c->n_sys * sizeof *c->sys))
        return (int32_t)c->n_sys;
    return 0;
}

/* Turn `turn`'s answer to the conversation of n tokens in c->toks: the
 * cache lined up, the answer streamed and recorded, its line on stderr.
 * 0, 1 when interrupted, -1 after an error. */
static int answer(struct chat *c, int turn, int64_t n)
{
    const struct si_run_opts *o = c->o;
    const int32_t shifted = o->context_shift ? align_cache(c->ctx, c->toks, (int32_t)n) : 0;
    int32_t reused = si_context_reuse_prefix(c->ctx, c->toks, (int32_t)n);
    if (reused < 0)
        return si_cli_error("%s", si_last_error()), -1;
    struct si_generate_params gp = si_generate_default_params();
    gp.ignore_eos = o->ignore_eos;
    const int64_t room = o->context_shift ? INT32_MAX : c->n_ctx - n;
    gp.n_predict = (int32_t)(o->n_predict < 0 || o->n_predict > room ? room : o->n_predict);
    gp.context_shift = o->context_shift;
    gp.n_keep = keep_of(c, n);
    struct answer ans = {{0}, false};
    struct si_generate_result res;
    si_context_reset_stats(c->ctx);
    int g = si_generate_tokens(c->ctx, c->toks + reused, (int32_t)n - reused, gp, stream_text,
                               &ans, &res);
    printf("\n");
    fflush(stdout);
    if (si_cli_interrupted()) {
        free(ans.text.p);
        return 1;
    }
    if (g != SI_OK || ans.oom) {
        free(ans.text.p);
        return si_cli_error("%s", ans.oom ? "out of memory" : si_last_error()), -1;
    }
    if (!add_message(c, "assistant", ans.text.p != NULL ? ans.text.p : strdup("")))
        return si_cli_error("out of memory"), -1;
    char shift[160] = "";
    if (shifted > 0 || res.n_shifted > 0 || c->dropped_turns > 0)
        snprintf(shift, sizeof shift,
                 "; context shift: %d turn%s dropped so far, %d token%s shifted out before "
                 "the turn, %d during the answer",
                 c->dropped_turns, si_cli_s(c->dropped_turns), shifted, si_cli_s(shifted),
                 res.n_shifted);
    fprintf(stderr,
            "chat: turn %d: %d token%s reused from the cache, %d evaluated in %.2f s; "
            "answer: %d token%s in %.2f s (%.2f tokens/s)%s%s\n",
            turn, reused, si_cli_s(reused), res.n_prompt, res.prompt_seconds, res.n_generated,
            si_cli_s(res.n_generated), res.generate_seconds,
            res.n_generated > 0 ? (double)res.n_generated / res.generate_seconds : 0.0,
            res.stop == SI_STOP_CONTEXT || (res.stop == SI_STOP_LENGTH && gp.n_predict == room)
                ? "; the context is full"
            : res.stop == SI_STOP_LENGTH ? "; cut at -n"
                                         : "",
            shift);
    struct si_stats st;
    si_context_get_stats(c->ctx, &st);
    si_run_print_engine_stats(stderr, o, &st);
    return 0;
}

/* The options into o: 0 to go on, else the exit status (help: 0 printed,
 * -1 for "exit 0"). */
static int chat_options(struct si_run_opts *o, int argc, char **argv)
{
    si_run_opts_init(o, "chat", -1, -1);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        int r = si_run_option(o, argc, argv, &i);
        if (r < 0)
            return 1;
        if (r > 0)
            continue;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            chat_usage(stdout);
            return -1;
        }
        return si_cli_error("chat: unknown option '%s' (see starinfer chat --help)", a);
    }
    if (o->prompt != NULL && o->file != NULL)
        return si_cli_error("chat: give either -p or -f, not both");
    if (o->model == NULL)
        return si_cli_error("chat: no model given (-m MODEL.gguf)");
    return si_run_check(o) != 0 ? 1 : 0;
}

/* The model, its context and the system message (owned by the chat from
 * here on, freed on failure too); false after an error. */
static bool chat_start(struct chat *c, struct si_run_opts *o, char *system)
{
    struct si_llm_params lp = si_llm_default_params();
    lp.use_mmap = o->use_mmap;
    lp.predictors = o->predictors;
    if (si_llm_load(o->model, lp, &c->llm) != SI_OK) {
        free(system);
        return si_cli_error("%s", si_last_error()), false;
    }
    /* The template must be one the library knows before anything runs. */
    struct si_chat_message probe = {"user", "hi"};
    if (si_llm_chat_apply(c->llm, &probe, 1, true, NULL, 0) < 0) {
        free(system);
        return si_cli_error("%s: %s", o->model, si_last_error()), false;
    }
    if (si_run_trace_begin(o) != 0) {
        free(system);
        return false;
    }
    si_run_note_ctx(c->llm, o->cp.n_ctx);
    if (si_context_init(c->llm, o->cp, &c->ctx) != SI_OK) {
        free(system);
        return si_cli_error("%s", si_last_error()), false;
    }
    c->n_ctx = si_context_n_ctx(c->ctx);
    si_run_note_kv(c->llm, &o->cp, c->n_ctx);
    if (system == NULL)
        return true;
    if (!add_message(c, "system", system))
        return si_cli_error("out of memory"), false;
    c->system_msgs = 1;
    /* --context-shift keeps the system message's tokens where they start
     * every conversation (--keep says otherwise), else the BOS */
    c->n_sys = render(c->llm, c->msgs, 1, false, &c->conv, &c->toks, &c->cap_toks);
    if (c->n_sys < 0)
        return false;
    if (c->n_sys > 0 && (c->sys = malloc((size_t)c->n_sys * sizeof *c->sys)) == NULL)
        return si_cli_error("out of memory"), false;
    if (c->sys != NULL)
        memcpy(c->sys, c->toks, (size_t)c->n_sys * sizeof *c->sys);
    return true;
}

int si_cmd_chat(int argc, char **argv)
{
    struct si_run_opts o;
    int rc = chat_options(&o, argc, argv);
    if (rc != 0)
        return rc < 0 ? 0 : rc;
    char *system = NULL;
    if (o.file != NULL) {
        size_t len;
        if ((system = si_cli_read_file(o.file, &len)) == NULL)
            return 1;
        if (len > 0 && system[len - 1] == '\n')
            system[len - 1] = '\0';
    } else if (o.prompt != NULL && (system = strdup(o.prompt)) == NULL) {
        return si_cli_error("out of memory");
    }
    struct chat c = {.o = &o};
    struct si_buf line = {0};
    const bool tty = isatty(STDIN_FILENO) && isatty(STDOUT_FILENO);
    rc = 1;
    if (!chat_start(&c, &o, system))
        goto out;
    if (tty)
        fprintf(stderr,
                "chat with %s (%s); /exit, Ctrl-D or Ctrl-C ends, a line ending with \\ goes on\n",
                si_llm_name(c.llm)[0] ? si_llm_name(c.llm) : o.model, si_llm_arch(c.llm));
    si_cli_sigint_catch();
    for (int turn = 1;; turn++) {
        if (tty) {
            printf("> ");
            fflush(stdout);
        }
        int got = next_turn(c.ctx, &line);
        if (got < 0) {
            si_cli_error("out of memory");
            goto out;
        }
        if (got == 0) {
            if (tty)
                printf("\n");
            break;
        }
        if (line.n == 0 || strspn(line.p, " \t\r\n") == line.n) {
            turn--;
            continue;
        }
        if (!strcmp(line.p, "/exit") || !strcmp(line.p, "/quit"))
            break;
        if (!add_message(&c, "user", strdup(line.p))) {
            si_cli_error("out of memory");
            goto out;
        }
        int64_t n = fit_conversation(&c, turn);
        if (n < 0)
            goto out;
        int a = answer(&c, turn, n);
        if (a < 0)
            goto out;
        if (a > 0)
            break;
    }
    rc = 0;
    if (si_cli_interrupted()) {
        si_cli_error("chat: interrupted");
        rc = SI_CLI_INTERRUPTED;
    }
out:
    free(c.sys);
    for (size_t i = 0; i < c.n_msgs; i++)
        free((char *)c.msgs[i].content);
    free(c.msgs);
    free(line.p);
    free(c.conv.p);
    free(c.toks);
    si_context_free(c.ctx); /* StarPU stops with the last context: the trace is written */
    rc = si_run_trace_finish(&o, rc);
    si_llm_free(c.llm);
    return rc;
}
