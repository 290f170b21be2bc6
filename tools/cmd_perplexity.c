/*
 * cmd_perplexity.c - `starinfer perplexity`: the model's perplexity on a text,
 * computed as llama.cpp's perplexity tool computes it: by default through
 * the StarPU engine's batched prefill, every batch's LM head a GEMM over
 * the scored positions (si_engine_eval_batch_logits), on all the workers;
 * with --engine ref by the evaluation code of src/predict/eval.h on the
 * reference forward pass (llama.cpp's arithmetic, bit for bit on AVX2).
 */
#include "cli.h"
#include "graph/engine.h"
#include "graph/runtime.h"
#include "internal.h" /* si__now */
#include "model/forward.h"
#include "model/model.h"
#include "model/tokenizer.h"
#include "predict/eval.h"
#include "predict/input_sparsity.h"
#include "predict/profile.h"
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
               "Under mpirun the engine runs across the ranks, token by token (docs/mpi.md).\n"
               "\n"
               "Options:\n"
               "  -m, --model FILE    the model (GGUF)\n"
               "      --predictors FILE a predictor file made for the model (train-predictor\n"
               "                        --predictors-only) in place of its own predictors\n"
               "  -f, --file FILE     the text\n"
               "  -c, --ctx-size N    chunk length (default 512)\n"
               "      --chunks N      score at most N chunks (default: all)\n"
               "      --kv-f32        keep the KV cache in f32 (default fp16)\n"
               "  -ctk, --cache-type-k T  K cache type: f16 (default), q8_0 or q4_0\n"
               "  -ctv, --cache-type-v T  V cache type, likewise\n"
               "      --engine E      starpu (default: the task-graph engine, batched, on\n"
               "                      every StarPU worker) or ref (the single-threaded\n"
               "                      reference: llama.cpp's arithmetic bit for bit on AVX2)\n"
               "  -b, --batch-size N  engine: tokens per prefill batch (default 128; the\n"
               "                      logits of a batch take N x vocabulary floats)\n"
               "      --prefill MODE  engine: the batches' arithmetic: auto (default:\n"
               "                      int8 with AVX-512 VNNI, else blas), exact (the\n"
               "                      reference's, slower), int8 (its converted inputs,\n"
               "                      batched integer kernel; needs AVX-512 VNNI) or blas\n"
               "                      (float inputs, OpenBLAS); --exact-prefill: exact\n"
               "      --sparsity M    dense (default); gate or predictor: the engine's\n"
               "                      sparse FFN modes, token by token; or input[=S]:\n"
               "                      before every matrix product the entries of its\n"
               "                      input at or below the layer's threshold for\n"
               "                      target sparsity S (default\n"
               "                      0.4, up to 0.9) become 0 (TEAL); or one S per input,\n"
               "                      input=qkv:S,o:S,ffn:S,down:S (unnamed: 0); needs\n"
               "                      --profile.  Products read only the weights of the\n"
               "                      non-zero inputs where the model has transposed\n"
               "                      copies (convert --transpose); the engine then\n"
               "                      evaluates token by token (its batches are dense)\n"
               "      --profile FILE  the profile with input thresholds (starinfer profile\n"
               "                      --input-sparsity)\n"
               "  -h, --help          show this help\n");
}

/* The running value after each chunk, as llama.cpp prints it. */
static void on_chunk(void *user, int64_t chunk, int64_t n_chunks, double ppl)
{
    (void)user, (void)n_chunks;
    printf("[%" PRId64 "] %.4f\n", chunk, ppl);
    fflush(stdout);
}

/* ", rank 0 of N MPI ranks" when StarPU-MPI runs the engine across ranks */
static const char *st_ranks(void)
{
    static char s[64];
    s[0] = '\0';
    if (si_runtime_mpi_size() > 1)
        snprintf(s, sizeof s, " (rank %d of %d MPI ranks)", si_runtime_mpi_rank(),
                 si_runtime_mpi_size());
    return s;
}

/*
 * The same chunks, BOS and scored halves as si_eval_perplexity, through the
 * engine: each chunk's first ctx - 1 tokens in pieces of n_batch, the
 * logits of the scored positions returned by the batches' LM head tasks.
 */
int si_cli_engine_perplexity(const struct si_model *m, struct si_engine_params ep,
                             const int32_t *toks, int64_t n_chunks, int32_t bos,
                             const struct si_cli_ppl *o, struct si_eval_ppl *res)
{
    char err[600];
    struct si_runtime rt = {0};
    struct si_engine *e = NULL;
    float *lg = NULL;
    int32_t *chunk = NULL;
    int rc = 1;
    const int64_t ctx = ep.ref.n_ctx, first = ctx / 2, nb = ep.n_batch;
    const int32_t nv = m->hp.n_vocab;
    if (si_cli_runtime_start(&rt, ep.pipe) != 0)
        return 1;
    if (si_engine_init(&e, m, ep, err, sizeof err) != SI_OK) {
        si_cli_error("%s (--engine ref runs every model the reader loads)", err);
        goto out;
    }
    int orc = o->observe != NULL ? si_engine_observe(e, o->observe, o->observe_user) : SI_OK;
    if (orc != SI_OK) {
        si_cli_error("watching the FFNs: %s", si_status_str(orc));
        goto out;
    }
    lg = malloc((size_t)nb * (size_t)nv * sizeof(float));
    chunk = malloc((size_t)ctx * sizeof *chunk);
    if (lg == NULL || chunk == NULL) {
        si_cli_error("perplexity: out of memory for %lld logits rows", (long long)nb);
        goto out;
    }
    struct si_ppl_sum sum = {0};
    const double t0 = si__now();
    for (int64_t ch = 0; ch < n_chunks; ch++) {
        memcpy(chunk, toks + ch * ctx, (size_t)ctx * sizeof *chunk);
        if (bos >= 0)
            chunk[0] = bos;
        si_engine_reset(e);
        /* The attention keeps its fp16 kernel: llama.cpp's tiled f32 one
         * (the reference's for batches of 64 or more, si_eval_perplexity)
         * took 2.2x the attention's time on gemma3 for the same perplexity
         * to 4 digits (13.8055 on 2 chunks of GPL-3). */
        for (int64_t p = 0; p < ctx - 1; p += nb) {
            const int32_t n = (int32_t)(ctx - 1 - p < nb ? ctx - 1 - p : nb);
            const int32_t f = (int32_t)(first > p ? (first - p < n ? first - p : n) : 0);
            int erc = si_engine_eval_batch_logits(e, chunk + p, n, f, lg);
            if (erc != SI_OK) {
                si_cli_error("perplexity: evaluation failed in chunk %" PRId64 ": %s", ch + 1,
                             si_status_str(erc));
                goto out;
            }
            for (int32_t j = f; j < n; j++)
                si_ppl_add(&sum, lg + (size_t)(j - f) * (size_t)nv, nv, toks[ch * ctx + p + j + 1]);
        }
        if (o->progress != NULL)
            o->progress(o->progress_user, ch + 1, n_chunks, si_ppl_value(&sum));
    }
    si_ppl_finish(&sum, res);
    res->n_chunks = n_chunks;
    res->seconds = si__now() - t0;
    const struct si_engine_stats st = si_engine_get_stats(e);
    /* token by token (n_batch 1) the engine counts the neurons computed */
    if (st.neurons_total > 0)
        res->ffn_computed = (double)(st.neurons_hot + st.neurons_cold) / (double)st.neurons_total;
    rc = 0;
    if (!o->stats_line)
        goto out;
    /* where the time went, as generate's engine lines say it */
    /* batches' tasks, or (token by token: -b 1, input sparsity, MPI ranks)
     * the decoding ones */
    const bool batched = st.batch_tokens > st.tokens;
    const double ntok = (double)(batched ? st.batch_tokens : st.tokens > 0 ? st.tokens : 1);
    fprintf(stderr,
            "engine: %u CPU + %u CUDA workers%s, batches of %lld, per token:", si_runtime_ncpu(),
            si_runtime_ncuda(), st_ranks(), (long long)nb);
    for (int k = batched ? SI_TASK_PREFILL_EMBED : 0;
         k < (batched ? SI_TASK_KIND_COUNT : SI_TASK_PREFILL_EMBED); k++)
        if (st.task_count[k] > 0)
            fprintf(stderr, " %s %.3f ms", si_task_kind_name((enum si_task_kind)k),
                    1e3 * st.task_seconds[k] / ntok);
    fprintf(stderr, ", wall %.3f ms\n", 1e3 * res->seconds / ntok);
out:
    free(lg);
    free(chunk);
    si_engine_free(e);
    si_runtime_stop(&rt);
    return rc;
}

/* perplexity's options. */
struct ppl_opts {
    const char *model, *file, *profile;
    const char *predictors; /* --predictors FILE */
    long long n_ctx, max_chunks, n_batch;
    bool kv_f32, use_ref, batch_given;
    enum si_kv_type type_k, type_v; /* --cache-type-k/-v */
    enum si_prefill_mode prefill;
    const char *prefill_flag; /* the option that set it */
    bool input;               /* --sparsity input[=...] */
    enum si_sparsity mode;    /* --sparsity gate|predictor: the engine's */
    double input_s[SI_INPUT_KINDS];
    bool mpi; /* under mpirun: the engine across the ranks */
};

/* A --sparsity value into o; false after an error message. */
static bool parse_sparsity(struct ppl_opts *o, const char *v)
{
    char perr[256];
    if (!strcmp(v, "dense") || !strcmp(v, "gate") || !strcmp(v, "predictor")) {
        o->input = false;
        o->mode = !strcmp(v, "gate")        ? SI_SPARSITY_GATE
                  : !strcmp(v, "predictor") ? SI_SPARSITY_PREDICTOR
                                            : SI_SPARSITY_DENSE;
    } else if (!strncmp(v, "input", 5)) {
        o->mode = SI_SPARSITY_DENSE;
        if (!si_input_parse(v + 5, o->input_s, perr, sizeof perr))
            return si_cli_error("perplexity: --sparsity %s", perr) == 0;
        o->input = true;
    } else {
        return si_cli_error(
                   "perplexity: --sparsity: '%s' is not dense, gate, predictor or input[=S]", v) ==
               0;
    }
    return true;
}

/* The options into o: 0 to go on, else the exit status (help: 0 printed,
 * -1 for "exit 0"). */
static int ppl_options(struct ppl_opts *o, int argc, char **argv)
{
    *o = (struct ppl_opts){.n_ctx = 512,
                           .max_chunks = -1,
                           .n_batch = 128,
                           .prefill = SI_PREFILL_AUTO,
                           .mode = SI_SPARSITY_DENSE};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        int r = 1;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            perplexity_usage(stdout);
            return -1;
        } else if (!strcmp(a, "-m") || !strcmp(a, "--model")) {
            r = si_cli_opt_str(argc, argv, &i, &o->model);
        } else if (!strcmp(a, "--predictors")) {
            r = si_cli_opt_str(argc, argv, &i, &o->predictors);
        } else if (!strcmp(a, "-f") || !strcmp(a, "--file")) {
            r = si_cli_opt_str(argc, argv, &i, &o->file);
        } else if (!strcmp(a, "--profile")) {
            r = si_cli_opt_str(argc, argv, &i, &o->profile);
        } else if (!strcmp(a, "-c") || !strcmp(a, "--ctx-size")) {
            r = si_cli_opt_int(argc, argv, &i, 0, 1 << 20, &o->n_ctx);
        } else if (!strcmp(a, "--chunks")) {
            r = si_cli_opt_int(argc, argv, &i, 1, 1 << 30, &o->max_chunks);
        } else if (!strcmp(a, "--kv-f32")) {
            o->kv_f32 = true;
        } else if ((r = si_cli_kv_opt(argc, argv, &i, &o->type_k, &o->type_v)) != 0) {
        } else if (!strcmp(a, "--engine")) {
            r = (v = si_cli_value(argc, argv, &i)) != NULL && si_cli_engine_opt(v, &o->use_ref)
                    ? 1
                    : -1;
        } else if (!strcmp(a, "-b") || !strcmp(a, "--batch-size")) {
            r = si_cli_opt_int(argc, argv, &i, 1, 4096, &o->n_batch);
            o->batch_given = true;
        } else if (!strcmp(a, "--prefill")) {
            r = (v = si_cli_value(argc, argv, &i)) != NULL && si_cli_prefill(v, &o->prefill) ? 1
                                                                                             : -1;
            o->prefill_flag = "--prefill";
        } else if (!strcmp(a, "--exact-prefill")) { /* the name it had before --prefill */
            o->prefill = SI_PREFILL_EXACT;
            o->prefill_flag = "--exact-prefill";
        } else if (!strcmp(a, "--sparsity")) {
            r = (v = si_cli_value(argc, argv, &i)) != NULL && parse_sparsity(o, v) ? 1 : -1;
        } else {
            return si_cli_error("perplexity: unknown option '%s' (see starinfer perplexity --help)",
                                a);
        }
        if (r < 0)
            return 1;
    }
    return 0;
}

/* The options checked together, the batch settled (token by token: input
 * sparsity on the engine, the sparse modes, MPI ranks); 0, or 1 after an
 * error message. */
static int ppl_check(struct ppl_opts *o)
{
    if (o->file == NULL)
        return si_cli_error("perplexity: no text given (-f FILE)");
    if (o->n_ctx < 16)
        return si_cli_error("perplexity: --ctx-size must be at least 16");
    if (o->model == NULL)
        return si_cli_error("no model given (-m MODEL.gguf)");
    if (o->use_ref && (o->batch_given || o->prefill_flag != NULL))
        return si_cli_error("perplexity: %s is the engine's: it needs --engine starpu",
                            o->batch_given ? "--batch-size" : o->prefill_flag);
    if (o->input && o->profile == NULL)
        return si_cli_error("perplexity: --sparsity input needs --profile FILE (made by "
                            "starinfer profile --input-sparsity)");
    const bool batched = o->batch_given && o->n_batch > 1;
    if (o->input && !o->use_ref && batched)
        return si_cli_error("perplexity: --sparsity input evaluates token by token on the "
                            "engine (prompt batches are dense): -b 1, or --engine ref");
    /* gate and predictor modes: the engine's decoding, token by token (its
     * prompt batches compute every neuron) */
    const bool sparse = o->mode != SI_SPARSITY_DENSE;
    const char *mode = o->mode == SI_SPARSITY_GATE ? "gate" : "predictor";
    if (sparse && o->use_ref)
        return si_cli_error("perplexity: --sparsity %s is the engine's: leave out --engine ref",
                            mode);
    if (sparse && batched)
        return si_cli_error("perplexity: --sparsity %s evaluates token by token (prompt batches "
                            "compute every neuron): -b 1, or leave -b out",
                            mode);
    /* Under mpirun: the engine across the ranks, a pipeline that passes one
     * token's residual at a time. */
    o->mpi = si_cli_mpi_size() > 1;
    if (o->mpi && o->use_ref)
        return si_cli_error("perplexity: --engine ref runs in one process, not across MPI ranks");
    if (o->mpi && batched)
        return si_cli_error("perplexity: across MPI ranks the engine evaluates token by token: "
                            "-b 1, or leave -b out");
    if ((o->input && !o->use_ref) || sparse || o->mpi)
        o->n_batch = 1;
    if (!o->input && o->profile != NULL)
        return si_cli_error("perplexity: --profile is for --sparsity input");
    return 0;
}

/* A perplexity run: the model, the text's tokens and --sparsity input's
 * thresholds. */
struct ppl {
    const struct ppl_opts *o;
    char *text;
    size_t len;
    struct si_model *m;
    struct si_tokenizer *tok;
    struct si_profile *prof;
    float *input_thr;
    int32_t *toks;
    int64_t n, n_chunks;
};

/* --sparsity input: each layer's thresholds for the targets S from
 * --profile; 0, or 1 after an error message. */
static int ppl_input(struct ppl *p)
{
    const struct ppl_opts *o = p->o;
    char err[600];
    if (si_profile_read(&p->prof, o->profile, p->m, err, sizeof err) != SI_OK)
        return si_cli_error("%s", err);
    p->input_thr = malloc((size_t)p->m->hp.n_layer * SI_INPUT_KINDS * sizeof *p->input_thr);
    if (p->input_thr == NULL)
        return si_cli_error("out of memory");
    if (si_input_thresholds_by_kind(p->prof, o->input_s, p->input_thr, err, sizeof err) != SI_OK)
        return si_cli_error("%s: %s", o->profile, err);
    return 0;
}

/* The text's tokens and the chunks scored (at most --chunks), said on
 * stderr; 0, or 1 after an error message. */
static int ppl_chunks(struct ppl *p)
{
    const struct ppl_opts *o = p->o;
    if ((p->toks = si_cli_tokenize_text(p->tok, p->text, p->len, o->file, &p->n)) == NULL)
        return 1;
    p->n_chunks = p->n / o->n_ctx;
    if (p->n_chunks == 0)
        return si_cli_error("%s: %" PRId64 " tokens, fewer than one chunk of %lld", o->file, p->n,
                            o->n_ctx);
    if (o->max_chunks > 0 && o->max_chunks < p->n_chunks)
        p->n_chunks = o->max_chunks;
    fprintf(stderr, "%s: %" PRId64 " tokens, %" PRId64 " chunk%s of %lld\n", o->file, p->n,
            p->n_chunks, si_cli_s(p->n_chunks), o->n_ctx);
    return 0;
}

/* The perplexity into *res, on the engine or the reference (input
 * sparsity's settings said on stderr); 0, or 1 after an error message. */
static int ppl_run(const struct ppl *p, struct si_eval_ppl *res)
{
    const struct ppl_opts *o = p->o;
    char err[600];
    struct si_ref_params rp = si_ref_default_params();
    rp.n_ctx = (int32_t)o->n_ctx;
    rp.kv_f16 = !o->kv_f32;
    rp.type_k = si__kv_type_of(o->type_k);
    rp.type_v = si__kv_type_of(o->type_v);
    if (o->input) {
        const double *S = o->input_s;
        rp.input_thresholds = p->input_thr;
        rp.input_t = true; /* the transposed copies, where the model has them */
        fprintf(stderr,
                "input sparsity: q/k/v %.2f, output projection %.2f, gate/up %.2f, down %.2f "
                "(%.1f%% of the layers' weights skipped); thresholds from %s; %s\n",
                S[SI_INPUT_QKV], S[SI_INPUT_O], S[SI_INPUT_FFN], S[SI_INPUT_DOWN],
                100.0 * si_input_model_sparsity(p->m, S), o->profile,
                p->m->w.layers[0].wq_t.data != NULL
                    ? "the products read the transposed copies"
                    : "the model has no transposed copies (starinfer convert --transpose)");
    }
    const struct si_eval_params ep = {
        .max_chunks = p->n_chunks,
        .bos = si_tokenizer_add_bos(p->tok) ? si_tokenizer_bos(p->tok) : -1,
        .progress = on_chunk,
    };
    if (!o->use_ref) {
        struct si_engine_params eng = si_engine_default_params();
        eng.ref = rp;
        eng.n_batch = (int32_t)o->n_batch;
        eng.prefill = o->prefill;
        eng.pipe = o->mpi;
        eng.mode = o->mode;
        const struct si_cli_ppl co = {.progress = on_chunk, .stats_line = true};
        return si_cli_engine_perplexity(p->m, eng, p->toks, p->n_chunks, ep.bos, &co, res) != 0;
    }
    if (si_eval_perplexity(p->m, rp, p->toks, p->n, &ep, res, err, sizeof err) != SI_OK)
        return si_cli_error("%s", err);
    return 0;
}

int si_cmd_perplexity(int argc, char **argv)
{
    struct ppl_opts o;
    int rc = ppl_options(&o, argc, argv);
    if (rc != 0)
        return rc < 0 ? 0 : rc;
    if (ppl_check(&o) != 0)
        return 1;
    struct ppl p = {.o = &o};
    if ((p.text = si_cli_read_text(o.file, &p.len)) == NULL)
        return 1;
    struct si_eval_ppl res;
    rc = 1;
    if (si_cli_load_model(o.model, o.predictors, &p.m, &p.tok) == 0 &&
        (!o.input || ppl_input(&p) == 0) && ppl_chunks(&p) == 0 && ppl_run(&p, &res) == 0) {
        printf("Final estimate: PPL = %.4f +/- %.5f (%" PRId64 " tokens scored, %.1f s)\n", res.ppl,
               res.ppl_err, res.n_scored, res.seconds);
        rc = 0;
    }
    si_profile_free(p.prof);
    free(p.input_thr);
    si_tokenizer_free(p.tok);
    si_model_free(p.m);
    free(p.toks);
    free(p.text);
    return rc;
}
