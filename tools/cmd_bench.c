/*
 * cmd_bench.c - `starinfer bench`: one workload (a prompt's prefill, then
 * greedy decoding) on the StarPU engine under each scheduling policy of
 * --sched, side by side.
 *
 * StarPU reads STARPU_SCHED when it starts, so every run starts StarPU with
 * the policy in the environment, builds the engine, runs and shuts StarPU
 * down again.  The runs are interleaved (repeat 1 of every policy, then
 * repeat 2, ...) so that the machine's noise spreads over all policies, and
 * the table shows medians.  Every run decodes greedily: the tokens must be
 * the same under every policy (the engine's arithmetic does not depend on
 * the schedule), which the table checks.
 */
#include "cli.h"
#include "graph/engine.h"
#include "internal.h" /* si__now */
#include "placement/hwmodel.h"
#include "graph/runtime.h"
#include "model/model.h"
#include "model/tokenizer.h"
#include "predict/input_sparsity.h"
#include "predict/profile.h"
#include "starinfer.h"

#include <starpu.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#define MAX_SCHEDS 32

static const char *default_prompt =
    "The GNU General Public License is a free, copyleft license for software and other kinds of "
    "works. The licenses for most software are designed to take away your freedom to share and "
    "change it.";

static void bench_usage(FILE *f)
{
    fprintf(f, "Usage: " SI_PROG " bench -m MODEL [--sched LIST] [OPTIONS]\n"
               "\n"
               "Run the same workload on the StarPU engine under each scheduling policy and\n"
               "print a side-by-side Markdown table: the prompt's prefill, then N greedily\n"
               "decoded tokens, repeated R times with the policies interleaved; medians.\n"
               "Under mpirun: the model across the ranks, one policy, rank 0's figures.\n"
               "\n"
               "Options:\n"
               "  -m, --model FILE        the model (GGUF)\n"
               "      --predictors FILE   a predictor file made for the model (train-predictor\n"
               "                          --predictors-only) in place of its own predictors\n"
               "      --sched LIST        comma-separated StarPU policies, e.g. eager,lws,dmda\n"
               "                          (default: STARPU_SCHED, else StarPU's default); `list`\n"
               "                          prints the policies this StarPU has\n"
               "  -p, --prompt TEXT       the prompt (default: a sentence of the GPL)\n"
               "  -f, --file FILE         read the prompt from a file\n"
               "      --prompt-tokens N   make the prompt exactly N tokens: the text's tokens\n"
               "                          (BOS once) repeated and cut, as tools/bench-llm's\n"
               "                          llama.cpp driver does\n"
               "  -n, --n-predict N       tokens to decode (default 64)\n"
               "  -r, --repeat R          runs per policy (default 3)\n"
               "  -c, --ctx-size N        context length (default: prompt + n-predict)\n"
               "      --sparsity M        dense (default), gate or predictor; input[=S],\n"
               "                          gate+input[=S], predictor+input[=S]: with input\n"
               "                          sparsity S (default 0.4; thresholds from --profile)\n"
               "      --gate-threshold T  gate mode, SiLU/GELU models\n"
               "      --profile FILE      activation profile (neuron order and GPU placement)\n"
               "      --vram-budget SIZE  GPU memory for the engine: its buffers, then the\n"
               "                          hottest FFN neurons, e.g. 512M (default 0: CPU only;\n"
               "                          an error without a CUDA worker)\n"
               "      --gpu-attention N   with --vram-budget: the attention of the first N\n"
               "                          layers on the GPU; auto (default), all, none\n"
               "      --slices N          cold FFN slices per layer (default: one per CPU worker)\n"
               "  -b, --batch-size N      prefill tokens per batch (default 128)\n"
               "      --attn-split N      attention's products in N row slices (0: automatic)\n"
               "  -ctk, --cache-type-k T  K cache type: f16 (default), q8_0 or q4_0\n"
               "  -ctv, --cache-type-v T  V cache type, likewise\n"
               "      --prefill MODE      the prompt batches' arithmetic: auto (default),\n"
               "                          exact, int8 (AVX-512 VNNI) or blas (generate --help)\n"
               "      --trace DIR         trace the first run of each policy with FxT into\n"
               "                          DIR/POLICY (paje.trace, tasks.rec, trace.png,\n"
               "                          trace-summary.md)\n"
               "      --roofline          measure the memory bandwidth first (a streaming read\n"
               "                          with as many threads as CPU workers) and show each\n"
               "                          row's effective bandwidth as a share of it\n"
               "      --json              print JSON instead of the table: every run's timings\n"
               "                          and per-token latencies, and the figures below\n"
               "  -h, --help              show this help\n"
               "\n"
               "Columns: prefill and decode tokens/s; per-token decode latency p50, p95 and\n"
               "p99 (over the decoded tokens of all runs); tasks per decoded token; how busy\n"
               "the workers were while decoding (time in tasks / (wall time x workers));\n"
               "MB of weights read per decoded token (host + GPU memory: what the tasks\n"
               "touched; a dense pass reads every weight but the embeddings) and the\n"
               "effective bandwidth, bytes x tokens/s; the engine's set-up time.  Peak RSS\n"
               "and GPU bytes follow the table.  STARPU_NCPU, STARPU_NCUDA and the other\n"
               "StarPU variables apply to every run.\n");
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* The q-quantile (0..1) of v[0..n), sorting v; nearest rank. */
static double quantile(double *v, int n, double q)
{
    if (n == 0)
        return 0.0;
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    int k = (int)(q * n + 0.999999) - 1;
    if (k < 0)
        k = 0;
    if (k >= n)
        k = n - 1;
    return v[k];
}

struct run {
    double prefill_tps, decode_tps, p50_ms, p95_ms, tasks_per_tok, busy, init_s;
    double prefill_s, decode_s;
    double bytes_per_tok;     /* weights read per decoded token, host + GPU */
    double gpu_bytes_per_tok; /* ... of which from GPU memory */
    double neurons_computed;  /* share of FFN neurons computed */
    int64_t vram_peak;        /* -1 without a CUDA worker */
    int32_t attn_gpu_layers;  /* layers whose attention ran on the GPU */
    uint64_t tokens_hash;
    unsigned ncpu, ncuda;
    double *lat; /* (n_predict) ms per decoded token */
};

static int print_policies(void)
{
    struct starpu_sched_policy **pol = starpu_sched_get_predefined_policies();
    int major, minor, release;
    starpu_get_version(&major, &minor, &release);
    printf("StarPU %d.%d.%d's scheduling policies:\n", major, minor, release);
    for (int i = 0; pol[i] != NULL; i++)
        printf("  %-32s %s\n", pol[i]->policy_name,
               pol[i]->policy_description ? pol[i]->policy_description : "");
    return 0;
}

/* One run under the policy now in STARPU_SCHED; 0 or 1 after an error
 * message. */
static int bench_once(const struct si_model *m, struct si_engine_params ep,
                      const struct si_profile *prof, const int32_t *toks, int32_t n_prompt,
                      int32_t n_predict, double *lat, struct run *out)
{
    char err[600];
    struct si_runtime rt = {0};
    struct si_engine *eng = NULL;
    int rc = 1;
    if (si_runtime_start(&rt, si_cli_caller_worker(), err, sizeof err) != SI_OK)
        return si_cli_error("%s", err);
    ep.profile = prof;
    double t0 = si__now();
    if (ep.vram_budget > 0 && si_runtime_ncuda() == 0) {
        si_cli_error("bench: --vram-budget needs a GPU, and StarPU has no CUDA worker (no CUDA "
                     "device, STARPU_NCUDA=0, or StarPU built without CUDA)");
        goto out;
    }
    if (si_engine_init(&eng, m, ep, err, sizeof err) != SI_OK) {
        si_cli_error("%s", err);
        goto out;
    }
    double t1 = si__now();
    /* The prompt's attention in the arithmetic generate gives it: a batch
     * of 64 tokens or more takes llama.cpp's tiled f32 attention (as
     * si_context_eval_batch sets it), decoding the single-query one. */
    si_engine_ref(eng)->attn_f32 = n_prompt >= 64;
    const int prc = si_engine_eval_batch(eng, toks, n_prompt);
    si_engine_ref(eng)->attn_f32 = false;
    if (prc != SI_OK) {
        if (si_engine_error(eng)[0] != '\0')
            si_cli_error("bench: evaluation of the prompt failed: %s", si_engine_error(eng));
        else
            si_cli_error("bench: evaluation of the prompt failed");
        goto out;
    }
    double t2 = si__now();
    uint64_t h = 1469598103934665603ull; /* FNV-1a over the decoded ids */
    const int32_t n_vocab = m->hp.n_vocab;
    for (int32_t i = 0; i < n_predict; i++) {
        const float *logits = si_engine_logits(eng);
        int32_t best = 0;
        for (int32_t t = 1; t < n_vocab; t++)
            if (logits[t] > logits[best])
                best = t;
        si_runtime_mpi_share(&best); /* across MPI ranks: rank 0 has the logits */
        h = (h ^ (uint64_t)(uint32_t)best) * 1099511628211ull;
        double s = si__now();
        if (si_engine_eval(eng, best) != SI_OK) {
            if (si_engine_error(eng)[0] != '\0')
                si_cli_error("bench: evaluation failed at decoded token %d: %s", i,
                             si_engine_error(eng));
            else
                si_cli_error("bench: evaluation failed at decoded token %d", i);
            goto out;
        }
        lat[i] = 1e3 * (si__now() - s);
    }
    double t3 = si__now();
    struct si_engine_stats st = si_engine_get_stats(eng);
    double busy = 0.0;
    for (int k = 0; k < SI_TASK_PREFILL_EMBED; k++)
        busy += st.task_seconds[k];
    const unsigned workers = si_runtime_ncpu() + si_runtime_ncuda();
    out->init_s = t1 - t0;
    out->prefill_tps = (double)n_prompt / (t2 - t1);
    out->decode_tps = (double)n_predict / (t3 - t2);
    out->prefill_s = t2 - t1;
    out->decode_s = t3 - t2;
    memcpy(out->lat, lat, (size_t)n_predict * sizeof *lat);
    out->p50_ms = quantile(lat, n_predict, 0.50);
    out->p95_ms = quantile(lat, n_predict, 0.95);
    out->bytes_per_tok =
        st.tokens > 0 ? (double)(st.weight_bytes_cpu + st.weight_bytes_gpu) / (double)st.tokens
                      : 0.0;
    out->gpu_bytes_per_tok = st.tokens > 0 ? (double)st.weight_bytes_gpu / (double)st.tokens : 0.0;
    out->neurons_computed =
        st.neurons_total > 0 ? (double)(st.neurons_hot + st.neurons_cold) / (double)st.neurons_total
                             : 0.0;
    out->vram_peak = st.gpu_allocated_peak;
    out->attn_gpu_layers = st.attn_gpu_layers;
    out->tasks_per_tok = st.tokens > 0 ? (double)st.tasks / (double)st.tokens : 0.0;
    out->busy = st.seconds > 0 ? busy / (st.seconds * workers) : 0.0;
    out->tokens_hash = h;
    out->ncpu = si_runtime_ncpu();
    out->ncuda = si_runtime_ncuda();
    rc = 0;
out:
    si_engine_free(eng);
    si_runtime_stop(&rt);
    return rc;
}

static double median_of(const struct run *runs, int n, size_t field)
{
    double v[64];
    for (int i = 0; i < n; i++)
        v[i] = *(const double *)((const char *)&runs[i] + field);
    return quantile(v, n, 0.5);
}

/* A JSON string: the characters JSON requires escaped, escaped. */
static void json_str(const char *str)
{
    putchar('"');
    for (const unsigned char *c = (const unsigned char *)str; *c; c++) {
        if (*c == '"' || *c == '\\')
            printf("\\%c", *c);
        else if (*c < 0x20)
            printf("\\u%04x", *c);
        else
            putchar(*c);
    }
    putchar('"');
}

/* --json: one object with every run (grouped by policy). */
static void print_json(const char *model, const struct si_engine_params *ep, const struct run *runs,
                       int n_rows, int repeat, const char *const *scheds, int n_prompt,
                       int n_predict, long rss_kib, int64_t dense_bytes, double membw)
{
    printf("{\"model\": ");
    json_str(model);
    printf(", \"mode\": \"%s\", \"n_prompt\": %d, \"n_predict\": %d, \"ncpu\": %u, "
           "\"ncuda\": %u, \"peak_rss_kib\": %ld, \"vram_peak_bytes\": %lld, "
           "\"weight_bytes_per_token\": %.0f, \"gpu_weight_bytes_per_token\": %.0f, "
           "\"dense_weight_bytes_per_token\": %lld, \"neurons_computed\": %.6f",
           si_sparsity_name(ep->mode), n_prompt, n_predict, runs[0].ncpu, runs[0].ncuda, rss_kib,
           (long long)runs[0].vram_peak, runs[0].bytes_per_tok, runs[0].gpu_bytes_per_tok,
           (long long)dense_bytes, runs[0].neurons_computed);
    printf(", \"attn_gpu_layers\": %d", (int)runs[0].attn_gpu_layers);
    if (membw > 0)
        printf(", \"membw_bytes_per_s\": %.0f", membw);
    printf(", \"policies\": [");
    for (int s = 0; s < n_rows; s++) {
        printf("%s{\"sched\": ", s ? ", " : "");
        json_str(scheds != NULL ? scheds[s] : "");
        printf(", \"runs\": [");
        for (int r = 0; r < repeat; r++) {
            const struct run *x = &runs[s * repeat + r];
            printf("%s{\"prefill_s\": %.6f, \"decode_s\": %.6f, \"init_s\": %.4f, "
                   "\"tasks_per_token\": %.1f, \"busy\": %.4f, \"weight_bytes_per_token\": "
                   "%.0f, \"tokens_hash\": \"%016llx\", \"lat_ms\": [",
                   r ? ", " : "", x->prefill_s, x->decode_s, x->init_s, x->tasks_per_tok, x->busy,
                   x->bytes_per_tok, (unsigned long long)x->tokens_hash);
            for (int i = 0; i < n_predict; i++)
                printf("%s%.4f", i ? ", " : "", x->lat[i]);
            printf("]}");
        }
        printf("]}");
    }
    printf("]}\n");
}

/* bench's options. */
struct bench_opts {
    const char *model, *prompt, *file, *profile_path, *sched_list, *trace_dir;
    const char *predictors; /* --predictors FILE */
    long long n_predict, repeat, n_ctx, prompt_tokens;
    bool json, roofline;
    float input_s; /* --sparsity ...input=S */
    enum si_kv_type type_k, type_v; /* --cache-type-k/-v */
    struct si_engine_params ep;
};

/* The options of the workload and of the table (the model, the prompt,
 * the policies, the runs): 1 consumed, 0 not one of them, -1 after an
 * error message. */
static int workload_option(struct bench_opts *o, int argc, char **argv, int *i)
{
    const char *a = argv[*i];
    if (!strcmp(a, "-m") || !strcmp(a, "--model"))
        return si_cli_opt_str(argc, argv, i, &o->model);
    if (!strcmp(a, "--predictors"))
        return si_cli_opt_str(argc, argv, i, &o->predictors);
    if (!strcmp(a, "-p") || !strcmp(a, "--prompt"))
        return si_cli_opt_str(argc, argv, i, &o->prompt);
    if (!strcmp(a, "-f") || !strcmp(a, "--file"))
        return si_cli_opt_str(argc, argv, i, &o->file);
    if (!strcmp(a, "--sched"))
        return si_cli_opt_str(argc, argv, i, &o->sched_list);
    if (!strcmp(a, "--trace"))
        return si_cli_opt_str(argc, argv, i, &o->trace_dir);
    if (!strcmp(a, "--prompt-tokens"))
        return si_cli_opt_int(argc, argv, i, 1, 1 << 20, &o->prompt_tokens);
    if (!strcmp(a, "-n") || !strcmp(a, "--n-predict"))
        return si_cli_opt_int(argc, argv, i, 1, 1 << 20, &o->n_predict);
    if (!strcmp(a, "-r") || !strcmp(a, "--repeat"))
        return si_cli_opt_int(argc, argv, i, 1, 64, &o->repeat);
    if (!strcmp(a, "-c") || !strcmp(a, "--ctx-size"))
        return si_cli_opt_int(argc, argv, i, 0, 1 << 20, &o->n_ctx);
    if (!strcmp(a, "--json"))
        o->json = true;
    else if (!strcmp(a, "--roofline"))
        o->roofline = true;
    else
        return 0;
    return 1;
}

/* The options of the engine (its mode, GPU and task sizes) into o->ep:
 * 1 consumed, 0 not one of them, -1 after an error message. */
static int engine_option(struct bench_opts *o, int argc, char **argv, int *i)
{
    const char *a = argv[*i], *v;
    struct si_engine_params *ep = &o->ep;
    if (!strcmp(a, "--profile"))
        return si_cli_opt_str(argc, argv, i, &o->profile_path);
    if (!strcmp(a, "--gate-threshold"))
        return si_cli_opt_f32(argc, argv, i, 0, 1e6, &ep->gate_threshold);
    if (!strcmp(a, "--vram-budget"))
        return si_cli_opt_size(argc, argv, i, &ep->vram_budget);
    if (!strcmp(a, "--slices"))
        return si_cli_opt_i32(argc, argv, i, 1, 256, &ep->n_slices);
    if (!strcmp(a, "-b") || !strcmp(a, "--batch-size"))
        return si_cli_opt_i32(argc, argv, i, 1, 4096, &ep->n_batch);
    if (!strcmp(a, "--attn-split"))
        return si_cli_opt_i32(argc, argv, i, 0, 256, &ep->attn_split);
    const int kv = si_cli_kv_opt(argc, argv, i, &o->type_k, &o->type_v);
    if (kv != 0)
        return kv;
    if (strcmp(a, "--sparsity") && strcmp(a, "--gpu-attention") && strcmp(a, "--prefill"))
        return 0;
    if ((v = si_cli_value(argc, argv, i)) == NULL)
        return -1;
    if (!strcmp(a, "--gpu-attention"))
        return si_cli_gpu_attention(a, v, &ep->attn_gpu) ? 1 : -1;
    if (!strcmp(a, "--prefill"))
        return si_cli_prefill(v, &ep->prefill) ? 1 : -1;
    enum si_sparsity_mode sm; /* --sparsity */
    if (!si_cli_sparsity(v, &sm, &o->input_s))
        return -1;
    ep->mode = sm == SI_SPARSE_GATE        ? SI_SPARSITY_GATE
               : sm == SI_SPARSE_PREDICTOR ? SI_SPARSITY_PREDICTOR
                                           : SI_SPARSITY_DENSE;
    return 1;
}

/* The options into o, checked together: 0 to go on, else the exit status
 * (help or --sched list: 0 printed, -1 for "exit 0"). */
static int bench_options(struct bench_opts *o, int argc, char **argv)
{
    *o = (struct bench_opts){.n_predict = 64, .repeat = 3, .ep = si_engine_default_params()};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            bench_usage(stdout);
            return -1;
        }
        int r = workload_option(o, argc, argv, &i);
        if (r == 0)
            r = engine_option(o, argc, argv, &i);
        if (r < 0)
            return 1;
        if (r == 0)
            return si_cli_error("bench: unknown option '%s' (see starinfer bench --help)", a);
    }
    if (o->sched_list != NULL && !strcmp(o->sched_list, "list"))
        return print_policies() == 0 ? -1 : 1;
    if (o->model == NULL)
        return si_cli_error("bench: no model given (-m MODEL.gguf)");
    if (o->ep.attn_gpu > 0 && o->ep.vram_budget == 0)
        return si_cli_error("bench: --gpu-attention %s needs --vram-budget (the GPU's layers "
                            "come out of its budget)",
                            o->ep.attn_gpu == INT32_MAX ? "all" : "N");
    if (o->input_s > 0.0f && o->profile_path == NULL)
        return si_cli_error("bench: --sparsity input needs --profile FILE (made by " SI_PROG
                            " profile --input-sparsity)");
    if (o->prompt != NULL && o->file != NULL)
        return si_cli_error("bench: give either -p or -f, not both");
    return 0;
}

/* A bench: its policies, model, prompt and runs (freed by bench_free). */
struct bench {
    struct bench_opts *o;
    char *list; /* --sched's (or STARPU_SCHED's) policies, scheds[0..n_sched) */
    const char *scheds[MAX_SCHEDS];
    int n_sched, n_rows; /* n_rows: n_sched, or 1 for StarPU's default policy */
    bool mpi;
    char *saved; /* STARPU_SCHED as it was, restored at the end */
    struct si_model *m;
    struct si_tokenizer *tok;
    struct si_profile *prof;
    float *input_thr;
    char *text;
    int32_t *toks;
    int64_t n_prompt;
    double *lat, *all_lat;
    struct run *runs;         /* n_rows x repeat */
    struct si_runtime rt_mpi; /* under mpirun: StarPU for every run */
    double membw;             /* --roofline: bytes/s */
};

/* The policies, checked against StarPU's list before anything runs, and
 * what mpirun allows of them; 0, or 1 after an error message. */
static int bench_scheds(struct bench *b)
{
    const struct bench_opts *o = b->o;
    b->list = strdup(o->sched_list != NULL            ? o->sched_list
                     : getenv("STARPU_SCHED") != NULL ? getenv("STARPU_SCHED")
                                                      : "");
    if (b->list == NULL)
        return si_cli_error("out of memory");
    for (char *save = NULL, *t = strtok_r(b->list, ",", &save); t != NULL;
         t = strtok_r(NULL, ",", &save)) {
        if (b->n_sched == MAX_SCHEDS)
            return si_cli_error("--sched: more than %d policies", MAX_SCHEDS);
        if (!si_runtime_sched_known(t))
            return si_cli_error("--sched: StarPU has no scheduling policy '%s' (starinfer bench "
                                "--sched list shows them)",
                                t);
        b->scheds[b->n_sched++] = t;
    }
    b->n_rows = b->n_sched > 0 ? b->n_sched : 1;
    /* Under mpirun: the model across the ranks (a pipeline of layers).  MPI
     * starts once a process, so StarPU runs once for every run: one policy. */
    b->mpi = si_cli_mpi_size() > 1;
    b->o->ep.pipe = b->mpi;
    if (b->mpi && (b->n_sched > 1 || o->trace_dir != NULL))
        return si_cli_error("bench: across MPI ranks StarPU starts once: %s",
                            b->n_sched > 1 ? "one --sched policy" : "no --trace");
    return 0;
}

/* The model, --profile and --sparsity input's thresholds into the engine's
 * parameters; 0, or 1 after an error message. */
static int bench_load(struct bench *b)
{
    const struct bench_opts *o = b->o;
    struct si_engine_params *ep = &b->o->ep;
    char err[600];
    if (si_cli_load_model(o->model, o->predictors, &b->m, &b->tok) != 0)
        return 1;
    if (o->profile_path != NULL &&
        si_profile_read(&b->prof, o->profile_path, b->m, err, sizeof err) != SI_OK)
        return si_cli_error("%s", err);
    if (o->input_s <= 0.0f)
        return 0;
    /* As the library sets it up: the FFN's inputs keep the sparse modes' own. */
    double S[SI_INPUT_KINDS];
    si_input_targets(o->input_s, ep->mode != SI_SPARSITY_DENSE, S);
    if ((b->input_thr = malloc((size_t)b->m->hp.n_layer * SI_INPUT_KINDS * sizeof *b->input_thr)) ==
        NULL)
        return si_cli_error("out of memory");
    if (si_input_thresholds_by_kind(b->prof, S, b->input_thr, err, sizeof err) != SI_OK)
        return si_cli_error("%s: %s", o->profile_path, err);
    ep->ref.input_thresholds = b->input_thr;
    ep->ref.input_t = true;
    fprintf(stderr, "bench: input sparsity %.2f (%.1f%% of the layers' weights skipped)%s\n",
            (double)o->input_s, 100.0 * si_input_model_sparsity(b->m, S),
            b->m->w.layers[0].wq_t.data != NULL ? ""
                                                : "; the model has no transposed copies: every "
                                                  "weight is still read");
    return 0;
}

/* The prompt's tokens (--prompt-tokens: its tokens after BOS repeated, cut
 * at N), the context that holds them and the runs' arrays; 0, or 1 after
 * an error message. */
static int bench_prompt(struct bench *b)
{
    const struct bench_opts *o = b->o;
    size_t len;
    if (o->file != NULL) {
        if ((b->text = si_cli_read_file(o->file, &len)) == NULL)
            return 1;
    } else {
        b->text = strdup(o->prompt != NULL ? o->prompt : default_prompt);
        len = b->text != NULL ? strlen(b->text) : 0;
    }
    const bool bos = si_tokenizer_add_bos(b->tok);
    const int64_t n_text =
        b->text != NULL ? si_tokenize(b->tok, b->text, len, bos, true, NULL, 0) : -1;
    if (n_text <= 0 || (o->prompt_tokens > 0 && n_text <= (bos ? 1 : 0)))
        return si_cli_error("bench: the prompt is empty or cannot be tokenized");
    const int64_t n_prompt = b->n_prompt = o->prompt_tokens > 0 ? o->prompt_tokens : n_text;
    const long long n_predict = o->n_predict, repeat = o->repeat;
    struct si_engine_params *ep = &b->o->ep;
    ep->ref.n_ctx = o->n_ctx > 0 ? (int32_t)o->n_ctx : (int32_t)(n_prompt + n_predict);
    ep->ref.type_k = si__kv_type_of(o->type_k);
    ep->ref.type_v = si__kv_type_of(o->type_v);
    if (n_prompt + n_predict > ep->ref.n_ctx)
        return si_cli_error("bench: prompt (%lld tokens) + n-predict (%lld) exceed the context of "
                            "%d",
                            (long long)n_prompt, n_predict, ep->ref.n_ctx);
    if (o->trace_dir != NULL && si_trace_check(o->trace_dir) != 0)
        return 1;
    b->toks = malloc((size_t)(n_prompt > n_text ? n_prompt : n_text) * sizeof *b->toks);
    b->lat = malloc((size_t)(n_predict * repeat * b->n_rows) * sizeof *b->lat);
    b->runs = calloc((size_t)(b->n_rows * repeat), sizeof *b->runs);
    b->all_lat = malloc((size_t)(n_predict * repeat * b->n_rows) * sizeof *b->all_lat);
    if (b->toks == NULL || b->lat == NULL || b->runs == NULL || b->all_lat == NULL)
        return si_cli_error("out of memory");
    for (int i = 0; i < b->n_rows * repeat; i++)
        b->runs[i].lat = b->all_lat + (size_t)i * (size_t)n_predict;
    si_tokenize(b->tok, b->text, len, bos, true, b->toks, (size_t)n_text);
    const int64_t head = bos ? 1 : 0;
    for (int64_t i = n_text; i < n_prompt; i++)
        b->toks[i] = b->toks[head + (i - n_text) % (n_text - head)];
    return 0;
}

/* --roofline: the memory bandwidth of a streaming read with as many
 * threads as CPU workers into b->membw; 0, or 1 after an error message. */
static int bench_roofline(struct bench *b)
{
    const char *nc = getenv("STARPU_NCPU");
    long threads = nc != NULL ? strtol(nc, NULL, 10) : 0;
    if (threads <= 0)
        threads = sysconf(_SC_NPROCESSORS_ONLN);
    fprintf(stderr, "bench: measuring the memory bandwidth with %ld threads\n", threads);
    b->membw = si_hwmodel_probe_cpu((int32_t)threads, 0, 0.5);
    if (b->membw <= 0)
        return si_cli_error("bench: out of memory for the bandwidth probe");
    return 0;
}

/* Every run: repeat r of each policy in turn (the first traced with
 * --trace), StarPU started once for them all under mpirun; 0, or 1 after
 * an error message. */
static int bench_runs(struct bench *b)
{
    const struct bench_opts *o = b->o;
    if (b->mpi) {
        if (b->n_sched > 0)
            setenv("STARPU_SCHED", b->scheds[0], 1);
        if (si_cli_runtime_start(&b->rt_mpi, true) != 0)
            return 1;
        int32_t l0 = 0, l1 = 0;
        si_engine_pipe_range(b->m, 0, si_runtime_mpi_size(), &l0, &l1);
        fprintf(stderr,
                "bench: across %d MPI ranks (a pipeline of layers, token by token); the "
                "figures are rank 0's, which computes layers %d-%d of %d (its MB/token too)\n",
                si_runtime_mpi_size(), l0, l1 - 1, b->m->hp.n_layer);
    }
    for (int r = 0; r < o->repeat; r++)
        for (int s = 0; s < b->n_rows; s++) {
            const char *sched = b->n_sched > 0 ? b->scheds[s] : NULL;
            if (sched != NULL)
                setenv("STARPU_SCHED", sched, 1);
            fprintf(stderr, "bench: run %d/%lld, %s\n", r + 1, o->repeat,
                    sched != NULL ? sched : "StarPU's default policy");
            char tdir[4200];
            const bool tracing = o->trace_dir != NULL && r == 0;
            if (tracing) {
                snprintf(tdir, sizeof tdir, "%s/%s", o->trace_dir,
                         sched != NULL ? sched : "default");
                if (si_trace_begin(tdir) != 0)
                    return 1;
            }
            int brc = bench_once(b->m, o->ep, b->prof, b->toks, (int32_t)b->n_prompt,
                                 (int32_t)o->n_predict, b->lat, &b->runs[s * o->repeat + r]);
            if (tracing) {
                unsetenv("STARPU_FXT_TRACE");
                unsetenv("STARPU_FXT_PREFIX");
            }
            if (brc != 0 || (tracing && si_trace_finish(tdir, s + 1 < b->n_rows) != 0))
                return 1;
        }
    si_runtime_stop(&b->rt_mpi); /* StarPU and MPI */
    return 0;
}

/* The table's row of policy `sched` over its runs rs[0..repeat): medians,
 * and latency quantiles over every decoded token of the runs. */
static void print_row(const struct bench *b, const char *sched, const struct run *rs, bool same)
{
    const struct bench_opts *o = b->o;
    const int repeat = (int)o->repeat;
    int nl = 0;
    for (int r = 0; r < repeat; r++)
        for (int64_t i = 0; i < o->n_predict; i++)
            b->lat[nl++] = rs[r].lat[i];
    const double p50 = quantile(b->lat, nl, 0.50), p95 = quantile(b->lat, nl, 0.95),
                 p99 = quantile(b->lat, nl, 0.99);
    const double tps = median_of(rs, repeat, offsetof(struct run, decode_tps));
    const double bpt = median_of(rs, repeat, offsetof(struct run, bytes_per_tok));
    char share[32] = "";
    if (o->roofline)
        snprintf(share, sizeof share, " (%.0f%%)", 100.0 * bpt * tps / b->membw);
    printf("| %s | %.1f | %.1f | %.2f | %.2f | %.2f | %.1f | %.0f%% | %.1f | %.2f%s | %.2f | "
           "%s |\n",
           sched, median_of(rs, repeat, offsetof(struct run, prefill_tps)), tps, p50, p95, p99,
           median_of(rs, repeat, offsetof(struct run, tasks_per_tok)),
           100.0 * median_of(rs, repeat, offsetof(struct run, busy)), bpt / 1e6, bpt * tps / 1e9,
           share, median_of(rs, repeat, offsetof(struct run, init_s)), same ? "yes" : "NO");
}

/* The lines after the table: weights read, neurons computed, peak RSS (KiB
 * rss_kib), the GPU's figures, the roofline's bandwidth. */
static void print_totals(const struct bench *b, long rss_kib, int64_t dense_bytes)
{
    const struct run *r0 = &b->runs[0];
    printf("\nweights read per decoded token: %.1f MB (a dense pass: %.1f MB); FFN neurons "
           "computed: %.1f%%; peak RSS %.1f MiB",
           r0->bytes_per_tok / 1e6, (double)dense_bytes / 1e6, 100.0 * r0->neurons_computed,
           (double)rss_kib / 1024.0);
    if (r0->vram_peak >= 0)
        printf("; GPU: %.1f MiB allocated at most, %.1f MB read per token, the attention of "
               "%d layers%s",
               (double)r0->vram_peak / 1048576.0, r0->gpu_bytes_per_tok / 1e6,
               (int)r0->attn_gpu_layers,
               b->o->ep.mode != SI_SPARSITY_DENSE && r0->gpu_bytes_per_tok > 0
                   ? " (the GPU's hot slices counted whole: the GPU does not count its "
                     "active neurons)"
                   : "");
    if (b->o->roofline)
        printf("; memory bandwidth %.2f GB/s (streaming read)", b->membw / 1e9);
    printf("\n");
}

/* The runs' table (or --json), a row per policy; 0, or 1 after the error
 * that the decoded tokens differ between runs. */
static int bench_report(const struct bench *b)
{
    const struct bench_opts *o = b->o;
    const int repeat = (int)o->repeat;
    const struct run *runs = b->runs;
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    const int64_t dense_bytes = si_model_token_bytes(b->m, NULL);
    if (o->json)
        print_json(o->model, &o->ep, runs, b->n_rows, repeat, b->n_sched > 0 ? b->scheds : NULL,
                   (int)b->n_prompt, (int)o->n_predict, (long)ru.ru_maxrss, dense_bytes, b->membw);
    else
        printf("model: %s; %s mode; prompt %lld token%s, %lld decoded; %s%lld run%s; "
               "%u CPU + %u CUDA workers\n\n"
               "| scheduler | prefill tok/s | decode tok/s | decode p50 ms | p95 ms | p99 ms | "
               "tasks/token | workers busy | MB/token | GB/s%s | set-up s | same tokens |\n"
               "|---|---|---|---|---|---|---|---|---|---|---|---|\n",
               o->model, si_sparsity_name(o->ep.mode), (long long)b->n_prompt,
               si_cli_s(b->n_prompt), o->n_predict, repeat > 1 ? "median of " : "", o->repeat,
               si_cli_s(repeat), runs[0].ncpu, runs[0].ncuda, o->roofline ? " (of roofline)" : "");
    bool all_same = true;
    for (int s = 0; s < b->n_rows; s++) {
        const struct run *rs = &runs[s * repeat];
        bool same = true;
        for (int r = 0; r < repeat; r++)
            same = same && rs[r].tokens_hash == runs[0].tokens_hash;
        all_same = all_same && same;
        if (!o->json)
            print_row(b, b->n_sched > 0 ? b->scheds[s] : "(default)", rs, same);
    }
    if (!o->json)
        print_totals(b, (long)ru.ru_maxrss, dense_bytes);
    if (!all_same)
        return si_cli_error("bench: the decoded tokens differ between runs: the engine's result "
                            "depends on the schedule");
    return 0;
}

/* Everything the bench holds, StarPU stopped and STARPU_SCHED as it was. */
static void bench_free(struct bench *b)
{
    si_runtime_stop(&b->rt_mpi);
    if (b->saved != NULL)
        setenv("STARPU_SCHED", b->saved, 1);
    else
        unsetenv("STARPU_SCHED");
    free(b->saved);
    free(b->list);
    free(b->runs);
    free(b->all_lat);
    free(b->lat);
    free(b->toks);
    free(b->text);
    si_profile_free(b->prof);
    free(b->input_thr);
    si_tokenizer_free(b->tok);
    si_model_free(b->m);
}

int si_cmd_bench(int argc, char **argv)
{
    struct bench_opts o;
    int rc = bench_options(&o, argc, argv);
    if (rc != 0)
        return rc < 0 ? 0 : rc;
    struct bench b = {.o = &o};
    if (bench_scheds(&b) != 0) {
        free(b.list);
        return 1;
    }
    const char *saved_sched = getenv("STARPU_SCHED");
    b.saved = saved_sched != NULL ? strdup(saved_sched) : NULL;
    rc = 1;
    if (bench_load(&b) == 0 && bench_prompt(&b) == 0 && (!o.roofline || bench_roofline(&b) == 0) &&
        bench_runs(&b) == 0 && bench_report(&b) == 0)
        rc = 0;
    bench_free(&b);
    return rc;
}
