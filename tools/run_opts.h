/*
 * run_opts.h - what `generate` and `chat` share: their model, context,
 * sampling and engine options, read into the public API's params structs,
 * and the statistics they print.  Both commands are users of the public API
 * (include/starinfer.h) only.
 */
#ifndef SI_TOOLS_RUN_OPTS_H
#define SI_TOOLS_RUN_OPTS_H

#include "starinfer.h"

#include <stdbool.h>
#include <stdio.h>

struct si_run_opts {
    const char *cmd; /* "generate" or "chat", for messages */
    const char *model;
    const char *prompt, *file;
    long long n_predict; /* -n */
    long long n_predict_min; /* the smallest -n accepted (chat: -1, unlimited) */
    bool ignore_eos;
    bool context_shift; /* --context-shift */
    long long n_keep;   /* --keep N */
    bool use_mmap;
    const char *predictors; /* --predictors FILE, or NULL */
    const char *trace_dir; /* --trace DIR, or NULL */
    struct si_context_params cp; /* the CLI's defaults: the reference engine */
};

/* Defaults for command `cmd`; n_predict as given. */
void si_run_opts_init(struct si_run_opts *o, const char *cmd, long long n_predict,
                      long long n_predict_min);

/* Handle argv[*i] if it is a shared option: 1 consumed, 0 not ours, -1 error
 * (already reported). */
int si_run_option(struct si_run_opts *o, int argc, char **argv, int *i);

/* After parsing: options that need the StarPU engine; 0, or 1 after an error. */
int si_run_check(const struct si_run_opts *o);

/* --trace: arm FxT before the context starts StarPU (0, or 1 after an
 * error); after the last context is freed, convert and draw the trace
 * (rc as given, or 1 when the conversion failed).  Nothing without --trace. */
int si_run_trace_begin(const struct si_run_opts *o);
int si_run_trace_finish(const struct si_run_opts *o, int rc);

/* The help text of the shared options. */
void si_run_usage(FILE *f, bool chat);

/* Log callback for si_context_params: one notice line on stderr. */
void si_run_log(void *user, const char *line);

/* The StarPU engine's lines (placement, neurons, time per task kind); nothing
 * for the reference.  The kind "merge" of decoding is shown as work inside
 * the attention and head tasks unless o asked for --merge redux. */
/* A note on stderr when a context of n_ctx tokens passes the model's
 * training context (llama.cpp warns too): it runs, past what it was trained on. */
void si_run_note_ctx(const struct si_llm *llm, int32_t n_ctx);
/* The KV cache's types and size, a position's and the context's (a line
 * on stderr, once the context is made). */
void si_run_note_kv(const struct si_llm *llm, const struct si_context_params *cp, int32_t n_ctx);

void si_run_print_engine_stats(FILE *f, const struct si_run_opts *o, const struct si_stats *st);

#endif /* SI_TOOLS_RUN_OPTS_H */
