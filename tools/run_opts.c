/* run_opts.c - the options and statistics `generate` and `chat` share. */
#include "run_opts.h"

#include "cli.h"
#include "internal.h"

#include <stdint.h>
#include <string.h>

void si_run_opts_init(struct si_run_opts *o, const char *cmd, long long n_predict,
                      long long n_predict_min)
{
    memset(o, 0, sizeof *o);
    o->cmd = cmd;
    o->n_predict = n_predict;
    o->n_predict_min = n_predict_min;
    o->use_mmap = true;
    o->cp = si_context_default_params();
    /* The StarPU engine, as the library's default; --engine ref for the
     * single-threaded reference (the oracle the tests compare with). */
    o->cp.engine = SI_ENGINE_STARPU;
    o->cp.caller_worker = si_cli_caller_worker();
    o->cp.mpi = si_cli_mpi_size() > 1; /* started by mpirun: one model across the ranks */
    o->cp.log = si_run_log;
}

/* The options of the run itself (the model, the prompt, the context, how
 * long it generates, --trace): 1 consumed, 0 not one of them, -1 after an
 * error message. */
static int run_option(struct si_run_opts *o, int argc, char **argv, int *i)
{
    const char *a = argv[*i];
    struct si_context_params *cp = &o->cp;
    if (!strcmp(a, "-m") || !strcmp(a, "--model"))
        return si_cli_opt_str(argc, argv, i, &o->model);
    if (!strcmp(a, "-p") || !strcmp(a, "--prompt"))
        return si_cli_opt_str(argc, argv, i, &o->prompt);
    if (!strcmp(a, "-f") || !strcmp(a, "--file"))
        return si_cli_opt_str(argc, argv, i, &o->file);
    if (!strcmp(a, "--trace"))
        return si_cli_opt_str(argc, argv, i, &o->trace_dir);
    if (!strcmp(a, "--predictors"))
        return si_cli_opt_str(argc, argv, i, &o->predictors);
    if (!strcmp(a, "-c") || !strcmp(a, "--ctx-size"))
        return si_cli_opt_i32(argc, argv, i, 0, 1 << 20, &cp->n_ctx);
    if (!strcmp(a, "-n") || !strcmp(a, "--n-predict"))
        return si_cli_opt_int(argc, argv, i, o->n_predict_min, 1 << 20, &o->n_predict);
    if (!strcmp(a, "--keep"))
        return si_cli_opt_int(argc, argv, i, 0, 1 << 30, &o->n_keep);
    const int kv = si_cli_kv_opt(argc, argv, i, &cp->cache_type_k, &cp->cache_type_v);
    if (kv != 0)
        return kv;
    if (!strcmp(a, "--kv-f32"))
        cp->kv_f32 = true;
    else if (!strcmp(a, "--no-mmap"))
        o->use_mmap = false;
    else if (!strcmp(a, "--ignore-eos"))
        o->ignore_eos = true;
    else if (!strcmp(a, "--context-shift"))
        o->context_shift = true;
    else
        return 0;
    return 1;
}

/* The sampling options into o->cp.sampling: 1 consumed, 0 not one of
 * them, -1 after an error message. */
static int sampling_option(struct si_run_opts *o, int argc, char **argv, int *i)
{
    const char *a = argv[*i];
    struct si_sampling_params *sp = &o->cp.sampling;
    if (!strcmp(a, "-s") || !strcmp(a, "--seed")) {
        long long seed;
        if (si_cli_opt_int(argc, argv, i, 0, INT64_MAX, &seed) < 0)
            return -1;
        sp->seed = (uint64_t)seed;
        return 1;
    }
    if (!strcmp(a, "--temp"))
        return si_cli_opt_f32(argc, argv, i, 0, 100, &sp->temp);
    if (!strcmp(a, "--top-k"))
        return si_cli_opt_i32(argc, argv, i, 0, INT32_MAX, &sp->top_k);
    if (!strcmp(a, "--top-p"))
        return si_cli_opt_f32(argc, argv, i, 0, 1, &sp->top_p);
    if (!strcmp(a, "--min-p"))
        return si_cli_opt_f32(argc, argv, i, 0, 1, &sp->min_p);
    if (!strcmp(a, "--repeat-penalty"))
        return si_cli_opt_f32(argc, argv, i, 0.01, 100, &sp->repeat_penalty);
    if (!strcmp(a, "--repeat-last-n"))
        return si_cli_opt_i32(argc, argv, i, 0, 1 << 20, &sp->repeat_last_n);
    return 0;
}

/* The options of the engine and its memory tiers (the GPU, the flash
 * tier) that take a number or a file: 1 consumed, 0 not one of them, -1
 * after an error message. */
static int engine_option(struct si_run_opts *o, int argc, char **argv, int *i)
{
    const char *a = argv[*i];
    struct si_context_params *cp = &o->cp;
    if (!strcmp(a, "--vram-budget"))
        return si_cli_opt_size(argc, argv, i, &cp->vram_budget);
    if (!strcmp(a, "--dram-budget"))
        return si_cli_opt_size(argc, argv, i, &cp->dram_budget);
    if (!strcmp(a, "--flash-store"))
        return si_cli_opt_str(argc, argv, i, &cp->flash_store);
    if (!strcmp(a, "--flash-pin"))
        return si_cli_opt_f32(argc, argv, i, 0, 1, &cp->flash_pin);
    if (!strcmp(a, "--profile"))
        return si_cli_opt_str(argc, argv, i, &cp->profile_path);
    if (!strcmp(a, "--placement"))
        return si_cli_opt_str(argc, argv, i, &cp->placement_path);
    if (!strcmp(a, "-b") || !strcmp(a, "--batch-size"))
        return si_cli_opt_i32(argc, argv, i, 1, 4096, &cp->n_batch);
    if (!strcmp(a, "--attn-split"))
        return si_cli_opt_i32(argc, argv, i, 0, 256, &cp->attn_split);
    if (!strcmp(a, "--gate-threshold"))
        return si_cli_opt_f32(argc, argv, i, 0, 1e6, &cp->gate_threshold);
    if (!strcmp(a, "--slices"))
        return si_cli_opt_i32(argc, argv, i, 1, 256, &cp->n_slices);
    if (!strcmp(a, "--flash-window")) {
        long long k;
        if (si_cli_opt_int(argc, argv, i, 0, 1000000, &k) < 0)
            return -1;
        cp->flash_window = k == 0 ? -1 : (int32_t)k; /* the API's 0 is "default" */
        return 1;
    }
    return 0;
}

/* The options of the engine that take a word (which engine, its mode, the
 * GPU's attention, the arithmetic of batches, the merge): 1 consumed, 0 not
 * one of them, -1 after an error message. */
static int engine_mode_option(struct si_run_opts *o, int argc, char **argv, int *i)
{
    const char *a = argv[*i], *v;
    struct si_context_params *cp = &o->cp;
    if (!strcmp(a, "--exact-prefill")) { /* the name it had before --prefill */
        cp->prefill = SI_PREFILL_EXACT;
        return 1;
    }
    if (strcmp(a, "--engine") && strcmp(a, "--sparsity") && strcmp(a, "--gpu-attention") &&
        strcmp(a, "--prefill") && strcmp(a, "--merge"))
        return 0;
    if ((v = si_cli_value(argc, argv, i)) == NULL)
        return -1;
    bool ok = true, ref;
    if (!strcmp(a, "--engine")) {
        if ((ok = si_cli_engine_opt(v, &ref)))
            cp->engine = ref ? SI_ENGINE_REF : SI_ENGINE_STARPU;
    } else if (!strcmp(a, "--sparsity")) {
        ok = si_cli_sparsity(v, &cp->sparsity, &cp->input_sparsity);
    } else if (!strcmp(a, "--gpu-attention")) {
        ok = si_cli_gpu_attention(a, v, &cp->gpu_attention);
    } else if (!strcmp(a, "--prefill")) {
        ok = si_cli_prefill(v, &cp->prefill);
    } else if (strcmp(v, "task") != 0 && strcmp(v, "redux") != 0) { /* --merge */
        ok = si_cli_error("--merge: '%s' is neither task nor redux", v) == 0;
    } else {
        cp->redux = !strcmp(v, "redux");
    }
    return ok ? 1 : -1;
}

int si_run_option(struct si_run_opts *o, int argc, char **argv, int *i)
{
    int r = run_option(o, argc, argv, i);
    if (r == 0)
        r = sampling_option(o, argc, argv, i);
    if (r == 0)
        r = engine_option(o, argc, argv, i);
    if (r == 0)
        r = engine_mode_option(o, argc, argv, i);
    return r;
}

int si_run_check(const struct si_run_opts *o)
{
    const struct si_context_params *cp = &o->cp;
    /* The reference has none of the engine's options: name the first given. */
    const struct si__engine_option *eo =
        cp->engine == SI_ENGINE_REF ? si__engine_only_option(cp) : NULL;
    if (eo != NULL)
        return si_cli_error("%s: %s needs --engine starpu%s%s%s", o->cmd, eo->flag,
                            eo->part != NULL ? " (" : "", eo->part != NULL ? eo->part : "",
                            eo->part != NULL ? ")" : "");
    if (cp->input_sparsity > 0.0f && cp->profile_path == NULL)
        return si_cli_error("%s: --sparsity input needs --profile FILE (made by " SI_PROG
                            " profile --input-sparsity)",
                            o->cmd);
    if (cp->engine == SI_ENGINE_REF && o->trace_dir != NULL)
        return si_cli_error("%s: --trace records StarPU's tasks: it needs --engine starpu", o->cmd);
    /* The trace's prerequisites before anything is loaded. */
    if (o->trace_dir != NULL && si_trace_check(o->trace_dir) != 0)
        return 1;
    return 0;
}

int si_run_trace_begin(const struct si_run_opts *o)
{
    return o->trace_dir != NULL ? si_trace_begin(o->trace_dir) : 0;
}

int si_run_trace_finish(const struct si_run_opts *o, int rc)
{
    if (o->trace_dir == NULL || rc != 0)
        return rc;
    return si_trace_finish(o->trace_dir, false) != 0 ? 1 : rc;
}

void si_run_usage(FILE *f, bool chat)
{
    fprintf(f,
            "  -c, --ctx-size N        context length (default: %s)\n"
            "  -s, --seed N            random seed (default 0)\n"
            "      --temp T            temperature; 0 is greedy (default 0.8)\n"
            "      --top-k K           keep the K most likely tokens; 0: off (default 40)\n"
            "      --top-p P           nucleus sampling; 1: off (default 0.95)\n"
            "      --min-p P           drop tokens below P x the best; 0: off (default 0.05)\n"
            "      --repeat-penalty R  penalise recent tokens; 1: off (default 1.0)\n"
            "      --repeat-last-n N   how many recent tokens (default 64)\n"
            "      --ignore-eos        do not stop at end-of-generation tokens\n"
            "      --context-shift     when the context is full, drop half of the tokens\n"
            "                          after the first --keep and go on (their keys rotated\n"
            "                          to their new positions, as llama.cpp does; default:\n"
            "                          stop)%s\n"
            "      --keep N            tokens a context shift keeps at the start (default:\n"
            "                          %s)\n"
            "      --kv-f32            keep the KV cache in f32 (default fp16)\n"
            "  -ctk, --cache-type-k T  K cache type: f16 (default), q8_0 or q4_0, as\n"
            "                          llama.cpp's; quantized caches take the tiled\n"
            "                          attention (docs/attention.md)\n"
            "  -ctv, --cache-type-v T  V cache type, likewise\n"
            "      --no-mmap           read the model into memory instead of mapping it\n"
            "      --predictors FILE   a predictor file (train-predictor\n"
            "                          --predictors-only) made for this model, in place\n"
            "                          of its own predictors (--sparsity predictor)\n"
            "      --engine E          starpu (default: the task graph on StarPU's\n"
            "                          workers) or ref (the single-threaded reference)\n"
            "      --sparsity M        dense (default); gate: skip FFN neurons whose gate\n"
            "                          activation is zero (ReLU) or below --gate-threshold;\n"
            "                          predictor: the neurons the model's predictor picks;\n"
            "                          input[=S]: zero the share S (default 0.4) of each\n"
            "                          product's inputs smallest in magnitude and skip\n"
            "                          their weights (needs --profile from `profile\n"
            "                          --input-sparsity`, and the model's transposed\n"
            "                          copies from `convert --transpose` for the speed);\n"
            "                          gate+input[=S], predictor+input[=S]: both, input\n"
            "                          sparsity then on the attention's products\n"
            "      --gate-threshold T  gate mode, SiLU/GELU models (default 0: the profile's\n"
            "                          per-layer thresholds when it has them)\n"
            "      --slices N          cold FFN slices per layer (default: one per CPU worker)\n"
            "      --vram-budget SIZE  GPU memory for the engine: its buffers, then the\n"
            "                          hottest FFN neurons, e.g. 512M (default 0: CPU only;\n"
            "                          an error without a CUDA worker)\n"
            "      --gpu-attention N   with --vram-budget: the attention (weights and KV\n"
            "                          cache) of the first N layers on the GPU; auto (the\n"
            "                          default): as many layers as keep more bytes off\n"
            "                          the CPU than the hottest neurons would; all; none\n"
            "      --dram-budget SIZE  host memory the model may keep resident (default 0:\n"
            "                          unlimited).  Below its tensor data and KV cache the\n"
            "                          flash tier reads cold FFN neurons from the flash\n"
            "                          store (starinfer convert --bundle; --engine starpu,\n"
            "                          gate or predictor mode)\n"
            "      --flash-store FILE  the flash store (default: MODEL.flash); given, the\n"
            "                          flash tier is used whatever the budget\n"
            "      --flash-window K    keep the neurons active in the last K tokens cached\n"
            "                          (default 5; 0: read every active neuron each token)\n"
            "      --flash-pin F       keep a share F (0..1) of each layer's flash cache for\n"
            "                          its hottest neurons by --profile, never evicted (the\n"
            "                          window gets the rest; default 0: the window only)\n"
            "      --profile FILE      activation profile (starinfer profile): the hottest\n"
            "                          neurons go to the GPU, the rest are balanced over\n"
            "                          the CPU slices (gate and predictor modes)\n"
            "      --placement FILE    the GPU's neurons (starinfer place, or PowerInfer's\n"
            "                          GPU index); its budget unless --vram-budget\n"
            "  -b, --batch-size N      engine: prompt tokens per prefill batch of GEMM tasks\n"
            "                          (default 128; 1: token by token like generation)\n"
            "      --attn-split N      engine: attention's products in N row slices (0:\n"
            "                          one per CPU worker when the weights are large\n"
            "                          enough, the default; 1: one task per layer)\n"
            "      --prefill MODE      engine: the prompt batches' arithmetic: auto (the\n"
            "                          default: int8 with AVX-512 VNNI, else blas), exact\n"
            "                          (the reference's, bit for bit token by token),\n"
            "                          int8 (the reference's Q8 inputs, batched integer\n"
            "                          kernel, sums in its order; needs AVX-512 VNNI) or\n"
            "                          blas (float inputs, OpenBLAS sgemm); --exact-prefill\n"
            "                          is --prefill exact\n"
            "      --merge M           task (default: the next layer's attention tasks add\n"
            "                          the FFN slices' partial outputs) or redux (StarPU's\n"
            "                          STARPU_REDUX and a merge task per layer; CPU only)\n"
            "      --trace DIR         engine: record the run with StarPU's FxT into DIR,\n"
            "                          convert it (paje.trace for ViTE, tasks.rec ... for\n"
            "                          StarVZ) and draw DIR/trace.png: the workers' tasks\n"
            "                          by kind, the ready tasks, a per-kind summary\n",
            chat ? "the model's\n                          training context, cut to keep the KV "
                   "cache\n                          within 1 GiB (not below 4096)"
                 : "prompt + n-predict",
            chat ? "; chat: the oldest\n                          turns after the system message "
                   "go first"
                 : "",
            chat ? "the system message's" : "the BOS");
}

void si_run_log(void *user, const char *line)
{
    (void)user;
    fprintf(stderr, "%s\n", line);
}

void si_run_print_engine_stats(FILE *f, const struct si_run_opts *o, const struct si_stats *st)
{
    if (st->engine != SI_ENGINE_STARPU)
        return;
    const double total = (double)(st->neurons_total ? st->neurons_total : 1);
    const int64_t active = st->neurons_gpu + st->neurons_cpu;
    fprintf(f,
            "engine: StarPU, %u CPU + %u CUDA workers, %d cold FFN slice%s per layer, %s "
            "mode, %.1f MiB of FFN neurons hot: %.1f%% of FFN neurons computed (GPU %.1f%%, "
            "CPU %.1f%%; neuron load on the GPU %.1f%%)\n",
            st->n_cpu_workers, st->n_cuda_workers, st->n_slices, si_cli_s(st->n_slices),
            si_sparsity_mode_name(st->sparsity), (double)st->hot_bytes / 1048576.0,
            100.0 * (double)active / total, 100.0 * (double)st->neurons_gpu / total,
            100.0 * (double)st->neurons_cpu / total, 100.0 * st->gpu_share);
    if (st->n_cuda_workers > 0 && st->neurons_gpu > 0 && st->sparsity != SI_SPARSE_DENSE)
        fprintf(f, "engine: the GPU's hot slices are counted whole (the GPU does not count its "
                   "active neurons)\n");
    if (st->packed_bytes > 0)
        fprintf(f, "engine: %.1f MiB of weights packed 8 rows at a time\n",
                (double)st->packed_bytes / 1048576.0);
    if (st->gpu_attention_layers > 0)
        fprintf(f, "engine: the attention of %d layer%s on the GPU (its weights and KV cache)\n",
                (int)st->gpu_attention_layers, si_cli_s(st->gpu_attention_layers));
    if (st->gpu_budget > 0)
        fprintf(f,
                "engine: GPU bytes: budget %lld, engine handles %lld, allocated by StarPU "
                "(peak) %lld\n",
                (long long)st->gpu_budget, (long long)st->gpu_accounted,
                (long long)st->gpu_allocated_peak);
    /* Decoding, then prefill: time in tasks summed over workers, the wall
     * time, and how busy the workers were (the rest is scheduling,
     * submission and waiting). */
    const unsigned workers = st->n_cpu_workers + st->n_cuda_workers;
    for (int pass = 0; pass < 2; pass++) {
        const bool batch = pass == 1;
        const double n = (double)(batch ? st->batch_tokens : st->step_tokens);
        const double wall = batch ? st->batch_seconds : st->step_seconds;
        if (n == 0)
            continue;
        double busy = 0.0;
        if (batch)
            fprintf(f, "engine: prefill (%s arithmetic), per token:",
                    si_prefill_mode_name(st->prefill));
        else
            fprintf(f, "engine: decoding, per token:");
        for (int k = 0; k < st->n_task_kinds; k++) {
            if (st->tasks[k].batch != batch)
                continue;
            busy += st->tasks[k].seconds;
            /* Decoding has no merge task but with --merge redux: the next
             * layer's attention tasks (and the head) merge a layer's FFN
             * output, and the engine counts that time apart. */
            const bool inside = !batch && !o->cp.redux && !strcmp(st->tasks[k].name, "merge");
            fprintf(f, " %s%s %.3f ms,", st->tasks[k].name,
                    inside ? " (inside attn and head tasks)" : "", 1e3 * st->tasks[k].seconds / n);
        }
        fprintf(f, " wall %.3f ms, %.1f tasks", 1e3 * wall / n,
                (double)(batch ? st->batch_tasks : st->step_tasks) / n);
        if (!batch)
            fprintf(f, " submitted in %.3f ms (%.3f ms of CPU)", 1e3 * st->step_submit_seconds / n,
                    1e3 * st->step_submit_cpu_seconds / n);
        fprintf(f, "; workers busy %.0f%% of the wall time\n",
                wall > 0 ? 100.0 * busy / (wall * workers) : 0.0);
    }
    if (st->flash) {
        /* "LLM in a flash", Table 3's breakdown: per token evaluated one by
         * one (prefill runs token by token with the flash tier). */
        const double n = (double)(st->step_tokens > 0 ? st->step_tokens : 1);
        double compute = 0.0;
        for (int k = 0; k < st->n_task_kinds; k++)
            if (!st->tasks[k].batch && strcmp(st->tasks[k].name, "load") != 0)
                compute += st->tasks[k].seconds;
        const int64_t cold = st->flash_loads + st->flash_hits;
        fprintf(f,
                "flash: resident %.1f MiB + caches %.1f MiB (%lld neurons per layer), window "
                "%d, %s\n",
                (double)st->dram_resident / 1048576.0, (double)st->flash_cache_bytes / 1048576.0,
                (long long)st->flash_cache_records, st->flash_window,
                st->flash_direct ? "direct I/O (page cache bypassed)" : "buffered I/O");
        fprintf(f,
                "flash: per token: read %.3f MiB in %.1f requests (%.1f neurons; %.1f%% of the "
                "active cold neurons were cached), I/O %.3f ms (%.1f MiB/s), cache management "
                "%.3f ms, compute %.3f ms (tasks other than load)\n",
                (double)st->flash_bytes / 1048576.0 / n, (double)st->flash_reads / n,
                (double)st->flash_loads / n,
                cold > 0 ? 100.0 * (double)st->flash_hits / (double)cold : 0.0,
                1e3 * st->flash_io_seconds / n,
                st->flash_io_seconds > 0
                    ? (double)st->flash_bytes / 1048576.0 / st->flash_io_seconds
                    : 0.0,
                1e3 * st->flash_manage_seconds / n, 1e3 * compute / n);
    }
}

void si_run_note_kv(const struct si_llm *llm, const struct si_context_params *cp, int32_t n_ctx)
{
    const int64_t per = si_llm_kv_bytes_per_token(llm, cp);
    if (per > 0)
        fprintf(stderr, "KV cache: %s K, %s V, %.1f KiB a position, %.1f MiB for %d positions\n",
                cp->kv_f32 ? "f32" : si_kv_type_name(cp->cache_type_k),
                cp->kv_f32 ? "f32" : si_kv_type_name(cp->cache_type_v), (double)per / 1024.0,
                (double)per * n_ctx / 1048576.0, n_ctx);
}

void si_run_note_ctx(const struct si_llm *llm, int32_t n_ctx)
{
    const int32_t train = si_llm_n_ctx_train(llm);
    if (train > 0 && n_ctx > train)
        fprintf(stderr,
                "note: a context of %d tokens is past the %d the model was trained on: what "
                "comes after position %d may lose coherence\n",
                n_ctx, train, train);
}
