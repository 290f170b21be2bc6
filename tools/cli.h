/*
 * cli.h - what the starinfer commands share: error reporting and option values.
 *
 * Every command is `int si_cmd_<name>(int argc, char **argv)` with argv[0] the
 * command's name; it returns the process exit status: 0, or 1 after an error
 * (the program itself exits 2 only when it is given no command).
 */
#ifndef SI_TOOLS_CLI_H
#define SI_TOOLS_CLI_H

#include "graph/engine.h"
#include "graph/runtime.h"
#include "predict/profile.h" /* struct si_ffn_runner */
#include "starinfer.h"       /* enum si_sparsity_mode */

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define SI_PROG "starinfer"

/* The plural ending for n things: printf("%lld token%s", n, si_cli_s(n)). */
static inline const char *si_cli_s(long long n)
{
    return n == 1 ? "" : "s";
}

/* Print "starinfer: error: <message>" on one line of stderr; returns 1. */
int si_cli_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* The value of option argv[*i] (advancing *i), or NULL after an error
 * message when it is missing. */
const char *si_cli_value(int argc, char **argv, int *i);

/* Option argv[*i]'s value (advancing *i) into *out: as given, a whole
 * number in [min, max], a number in [min, max] or a byte size (si_cli_size),
 * each named argv[*i] in messages.  1, or -1 after an error message: the
 * answers of an option parser such as si_run_option (consumed, or an error). */
int si_cli_opt_str(int argc, char **argv, int *i, const char **out);
int si_cli_opt_int(int argc, char **argv, int *i, long long min, long long max, long long *out);
int si_cli_opt_float(int argc, char **argv, int *i, double min, double max, double *out);
int si_cli_opt_size(int argc, char **argv, int *i, int64_t *out);
/* The same into an int32_t (min and max within its range) or a float. */
int si_cli_opt_i32(int argc, char **argv, int *i, long long min, long long max, int32_t *out);
int si_cli_opt_f32(int argc, char **argv, int *i, double min, double max, float *out);
/* The same for a number in the interval from lo to hi, each end in it or
 * not (lo_in, hi_in), which the message writes as [lo, hi), (lo, hi] ... */
int si_cli_opt_range(int argc, char **argv, int *i, double lo, bool lo_in, double hi, bool hi_in,
                     double *out);

/* Ctrl-C (SIGINT) in generate and chat: after si_cli_sigint_catch() the
 * first one only sets si_cli_interrupted() (the token callback then stops
 * the generation: the answer so far stays printed, the command ends with
 * status SI_CLI_INTERRUPTED after freeing everything); a second one ends
 * the process as usual. */
#define SI_CLI_INTERRUPTED 130
void si_cli_sigint_catch(void);
bool si_cli_interrupted(void);

/* Parse a whole integer / float in [min, max] for `flag`; false after an
 * error message. */
bool si_cli_int(const char *flag, const char *s, long long min, long long max, long long *out);
bool si_cli_float(const char *flag, const char *s, double min, double max, double *out);
/* Under mpirun (its launcher's environment: OpenMPI's, or PMI's), this
 * process's rank and the number of ranks; 0 and 1 otherwise. */
int si_cli_mpi_rank(void);
int si_cli_mpi_size(void);

/* A --sparsity value: MODE (dense, gate, predictor), input[=S] (dense mode
 * with input sparsity S, 0.4 without =S) or MODE+input[=S] into *mode and
 * *input (0: none).  false after printing the error. */
bool si_cli_sparsity(const char *v, enum si_sparsity_mode *mode, float *input);

/* A --gpu-attention value for `flag`: auto (0), none (-1), all (INT32_MAX:
 * the engine takes the model's layers) or N in [1, 100000] into *out; false
 * after printing the error. */
bool si_cli_gpu_attention(const char *flag, const char *v, int32_t *out);

/* A --prefill value (auto, exact, int8, blas) into *mode; false after
 * printing the error. */
bool si_cli_prefill(const char *v, enum si_prefill_mode *mode);

/* Parse a byte size for `flag`: a number with an optional unit K, M, G, T
 * (powers of 1024; "KiB", "MB", "GiB" ... are read the same) or none for
 * bytes, e.g. 512M, 1.5G, 4096; false after an error message. */
bool si_cli_size(const char *flag, const char *s, int64_t *out);

/* Whether the CLI's thread runs one of StarPU's CPU workers while it waits
 * (si_context_params.caller_worker): yes unless STARINFER_CALLER_WORKER=0. */
bool si_cli_caller_worker(void);

/* StarPU started for a command (across MPI ranks with mpi, by StarPU-MPI),
 * its thread a worker as si_cli_caller_worker says: 0, or 1 after the
 * one-line error.  si_runtime_stop(rt) ends it. */
int si_cli_runtime_start(struct si_runtime *rt, bool mpi);

/* Read a whole file into a NUL-terminated buffer (free() it); NULL after an
 * error message. */
char *si_cli_read_file(const char *path, size_t *len);

/* si_cli_read_file with one trailing newline dropped, as llama.cpp's tools
 * read -f files. */
char *si_cli_read_text(const char *path, size_t *len);

/* The executable `prog` in a directory of PATH, as execvp looks it up (an
 * empty entry is the current folder): its path into buf, or false. */
bool si_cli_find_in_path(const char *prog, char *buf, size_t size);

struct si_model;
struct si_tokenizer;

/* Load the model at path (with the predictor file `predictors` in place of
 * its own predictors, when not NULL) and, when tok is not NULL, its
 * tokenizer; 0, or 1 after an error message (nothing then left to free). */
int si_cli_load_model(const char *path, const char *predictors, struct si_model **m,
                      struct si_tokenizer **tok);

/* Tokenize text[0..len) read from `path` (named in messages), BOS first when
 * the model adds one, parsing no special tokens (a corpus is plain text): a
 * new array (free() it) of *n >= 1 tokens, or NULL after an error message. */
int32_t *si_cli_tokenize_text(const struct si_tokenizer *tok, const char *text, size_t len,
                              const char *path, int64_t *n);

/*
 * The passes over a corpus of profile, train-predictor and eval (r, for
 * predict/profile.h's collectors): the StarPU engine in dense mode, its
 * batched prefill of n_batch tokens on every worker, in windows of n_ctx
 * tokens; or, use_ref, the single-threaded reference.  start: 0, or 1
 * after an error message (nothing then left to stop); stop frees the
 * engine and stops StarPU.
 */
struct si_cli_runner {
    struct si_ffn_runner r;
    struct si_runtime rt;
    struct si_engine *e;
};
int si_cli_runner_start(struct si_cli_runner *cr, const struct si_model *m, bool use_ref,
                        int32_t n_ctx, int32_t n_batch);
void si_cli_runner_stop(struct si_cli_runner *cr);

/*
 * One pass over a corpus: fn(user, toks + start, len) for each window of
 * n_ctx tokens in turn, with a progress bar titled `title` (tokens).  0, or
 * the first failing call's status, the bar ended and fn's message in err.
 */
typedef int (*si_cli_window_fn)(void *user, const int32_t *toks, int64_t n, char *err,
                                size_t err_size);
int si_cli_windows(const char *title, const int32_t *toks, int64_t n, int64_t n_ctx,
                   si_cli_window_fn fn, void *user, char *err, size_t err_size);

/* The pass both profile and train-predictor make for SiLU/GELU thresholds:
 * si_profile_calib_collect over each window (user: a struct si_cli_corpus). */
struct si_cli_corpus {
    struct si_profile_calib *calib;
    const struct si_model *m;
    const struct si_ffn_runner *run;
};
int si_cli_calib_pass(void *user, const int32_t *toks, int64_t n, char *err, size_t err_size);

/* The --engine option of those commands: "starpu" (false) or "ref" (true
 * into *use_ref); false after an error message. */
bool si_cli_engine_opt(const char *v, bool *use_ref);

/* -ctk/--cache-type-k and -ctv/--cache-type-v at argv[*i]: f16, q8_0 or
 * q4_0 into *k or *v; 1 consumed, 0 not one of them, -1 after an error
 * message. */
int si_cli_kv_opt(int argc, char **argv, int *i, enum si_kv_type *k, enum si_kv_type *v);

/*
 * Perplexity through the engine with parameters ep (ep.ref.n_ctx the chunk),
 * as `starinfer perplexity` computes it (tools/cmd_perplexity.c): n_chunks
 * chunks of toks, each from a reset engine with BOS (when >= 0) first, the
 * first n_ctx - 1 tokens in batches of ep.n_batch whose LM head gives the
 * scored half's logits.  With observe (dense mode), the engine observes the
 * FFNs (si_engine_observe).  res->ffn_computed: the engine's count of the
 * neurons computed, when it counts them (token by token, ep.n_batch 1).
 * StarPU started and stopped here.  0, or 1 after an error message.
 */
struct si_cli_ppl {
    si_ffn_hook observe;
    void *observe_user;
    void (*progress)(void *user, int64_t chunk, int64_t n_chunks, double ppl);
    void *progress_user;
    bool stats_line; /* print where the time went per token */
};
struct si_eval_ppl;
int si_cli_engine_perplexity(const struct si_model *m, struct si_engine_params ep,
                             const int32_t *toks, int64_t n_chunks, int32_t bos,
                             const struct si_cli_ppl *o, struct si_eval_ppl *res);

/* --trace DIR: si_trace_begin() before StarPU starts (checks that StarPU has
 * FxT and that the converters are installed, creates DIR, sets StarPU's FxT
 * variables); si_trace_finish() after StarPU shut down (converts the trace,
 * renders DIR/trace.png, says how to open it; another_run: StarPU will be
 * started again with tracing in this process).  The raw FxT files are kept
 * as DIR/prof_file_*.run.  0, or 1 after an error message. */
int si_trace_begin(const char *dir);
/* What si_trace_begin() checks, and DIR created, without arming StarPU. */
int si_trace_check(const char *dir);
int si_trace_finish(const char *dir, bool another_run);

int si_cmd_info(int argc, char **argv);
int si_cmd_generate(int argc, char **argv);
int si_cmd_chat(int argc, char **argv);
int si_cmd_perplexity(int argc, char **argv);
int si_cmd_synth(int argc, char **argv);
int si_cmd_profile(int argc, char **argv);
int si_cmd_bench(int argc, char **argv);
int si_cmd_train(int argc, char **argv);
int si_cmd_eval(int argc, char **argv);
int si_cmd_serve(int argc, char **argv);
int si_cmd_place(int argc, char **argv);
int si_cmd_convert(int argc, char **argv);

#endif /* SI_TOOLS_CLI_H */
