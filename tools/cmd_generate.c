/*
 * cmd_generate.c - `starinfer generate` (on the plain-C reference, or the
 * StarPU engine with --engine starpu) and `starinfer perplexity` (reference).
 */
#include "cli.h"
#include "graph/engine.h"
#include "placement/placement.h"
#include "predict/profile.h"
#include "graph/runtime.h"
#include "model/forward.h"
#include "model/model.h"
#include "model/sampler.h"
#include "model/tokenizer.h"
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
               "  -c, --ctx-size N        context length (default: prompt + n-predict)\n"
               "  -s, --seed N            random seed (default 0)\n"
               "      --temp T            temperature; 0 is greedy (default 0.8)\n"
               "      --top-k K           keep the K most likely tokens; 0: off (default 40)\n"
               "      --top-p P           nucleus sampling; 1: off (default 0.95)\n"
               "      --min-p P           drop tokens below P x the best; 0: off (default 0.05)\n"
               "      --repeat-penalty R  penalise recent tokens; 1: off (default 1.0)\n"
               "      --repeat-last-n N   how many recent tokens (default 64)\n"
               "      --chat              wrap the prompt as a user turn in the chat template\n"
               "      --ignore-eos        do not stop at end-of-generation tokens\n"
               "      --ids               print token ids instead of text\n"
               "      --kv-f32            keep the KV cache in f32 (default fp16)\n"
               "      --engine E          ref (default: the single-threaded reference) or\n"
               "                          starpu (the task graph on StarPU's workers)\n"
               "      --sparsity M        dense (default); gate: skip FFN neurons whose gate\n"
               "                          activation is zero (ReLU) or below --gate-threshold;\n"
               "                          predictor: the neurons the model's predictor picks\n"
               "      --gate-threshold T  gate mode, SiLU/GELU models (default 0: the profile's\n"
               "                          per-layer thresholds when it has them)\n"
               "      --slices N          cold FFN slices per layer (default: one per CPU worker)\n"
               "      --vram-budget SIZE  bytes of FFN neurons for the GPU's hot slices, e.g.\n"
               "                          512M (default 0: none; ignored without a CUDA worker)\n"
               "      --profile FILE      activation profile (starinfer profile): the hottest\n"
               "                          neurons go to the GPU, the rest are balanced over\n"
               "                          the CPU slices (gate and predictor modes)\n"
               "      --placement FILE    the GPU's neurons (starinfer place, or PowerInfer's\n"
               "                          GPU index); its budget unless --vram-budget\n"
               "  -b, --batch-size N      engine: prompt tokens per prefill batch of GEMM tasks\n"
               "                          (default 32; 1: token by token like generation)\n"
               "      --attn-split N      engine: attention's products in N row slices (0:\n"
               "                          one per CPU worker when the weights are large\n"
               "                          enough, the default; 1: one task per layer)\n"
               "      --exact-prefill     engine: prefill with the reference's arithmetic (bit\n"
               "                          for bit token by token; default: OpenBLAS sgemm on\n"
               "                          float activations, faster, rounded differently)\n"
               "      --merge M           task (default: a merge task adds the slices' partial\n"
               "                          outputs) or redux (StarPU's STARPU_REDUX; CPU only)\n"
               "  -h, --help              show this help\n");
}

int si_cmd_generate(int argc, char **argv)
{
    struct common c = {0};
    const char *prompt = NULL, *file = NULL, *v;
    long long n_predict = 128, seed = 0, ll;
    double d;
    /* The reference stays the default until the engine is faster than it
     * (it is bit-identical, and slower for now: see the README). */
    bool chat = false, ignore_eos = false, ids = false, use_engine = false;
    const char *profile_path = NULL, *placement_path = NULL;
    struct si_placement *placement = NULL;
    long long n_batch = 32;
    struct si_profile *prof = NULL;
    struct si_sampler_params sp = si_sampler_default_params();
    struct si_engine_params ep = si_engine_default_params();
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        int r = common_option(&c, argc, argv, &i);
        if (r < 0)
            return 1;
        if (r > 0)
            continue;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            generate_usage(stdout);
            return 0;
        } else if (!strcmp(a, "-p") || !strcmp(a, "--prompt")) {
            if ((prompt = si_cli_value(argc, argv, &i)) == NULL)
                return 1;
        } else if (!strcmp(a, "-f") || !strcmp(a, "--file")) {
            if ((file = si_cli_value(argc, argv, &i)) == NULL)
                return 1;
        } else if (!strcmp(a, "-n") || !strcmp(a, "--n-predict")) {
            if ((v = si_cli_value(argc, argv, &i)) == NULL ||
                !si_cli_int(a, v, 0, 1 << 20, &n_predict))
                return 1;
        } else if (!strcmp(a, "-s") || !strcmp(a, "--seed")) {
            if ((v = si_cli_value(argc, argv, &i)) == NULL ||
                !si_cli_int(a, v, 0, INT64_MAX, &seed))
                return 1;
        } else if (!strcmp(a, "--temp")) {
            if ((v = si_cli_value(argc, argv, &i)) == NULL || !si_cli_float(a, v, 0, 100, &d))
                return 1;
            sp.temp = (float)d;
        } else if (!strcmp(a, "--top-k")) {
            if ((v = si_cli_value(argc, argv, &i)) == NULL || !si_cli_int(a, v, 0, INT32_MAX, &ll))
                return 1;
            sp.top_k = (int32_t)ll;
        } else if (!strcmp(a, "--top-p")) {
            if ((v = si_cli_value(argc, argv, &i)) == NULL || !si_cli_float(a, v, 0, 1, &d))
                return 1;
            sp.top_p = (float)d;
        } else if (!strcmp(a, "--min-p")) {
            if ((v = si_cli_value(argc, argv, &i)) == NULL || !si_cli_float(a, v, 0, 1, &d))
                return 1;
            sp.min_p = (float)d;
        } else if (!strcmp(a, "--repeat-penalty")) {
            if ((v = si_cli_value(argc, argv, &i)) == NULL || !si_cli_float(a, v, 0.01, 100, &d))
                return 1;
            sp.repeat_penalty = (float)d;
        } else if (!strcmp(a, "--repeat-last-n")) {
            if ((v = si_cli_value(argc, argv, &i)) == NULL || !si_cli_int(a, v, 0, 1 << 20, &ll))
                return 1;
            sp.repeat_last_n = (int32_t)ll;
        } else if (!strcmp(a, "--engine")) {
            if ((v = si_cli_value(argc, argv, &i)) == NULL)
                return 1;
            if (strcmp(v, "starpu") != 0 && strcmp(v, "ref") != 0)
                return si_cli_error("--engine: '%s' is neither starpu nor ref", v);
            use_engine = !strcmp(v, "starpu");
        } else if (!strcmp(a, "--sparsity")) {
            if ((v = si_cli_value(argc, argv, &i)) == NULL)
                return 1;
            if (!strcmp(v, "dense"))
                ep.mode = SI_SPARSITY_DENSE;
            else if (!strcmp(v, "gate"))
                ep.mode = SI_SPARSITY_GATE;
            else if (!strcmp(v, "predictor"))
                ep.mode = SI_SPARSITY_PREDICTOR;
            else
                return si_cli_error("--sparsity: '%s' is not dense, gate or predictor", v);
        } else if (!strcmp(a, "--vram-budget")) {
            if ((v = si_cli_value(argc, argv, &i)) == NULL || !si_cli_size(a, v, &ep.vram_budget))
                return 1;
        } else if (!strcmp(a, "--placement")) {
            if ((placement_path = si_cli_value(argc, argv, &i)) == NULL)
                return 1;
        } else if (!strcmp(a, "--profile")) {
            if ((profile_path = si_cli_value(argc, argv, &i)) == NULL)
                return 1;
        } else if (!strcmp(a, "-b") || !strcmp(a, "--batch-size")) {
            if ((v = si_cli_value(argc, argv, &i)) == NULL || !si_cli_int(a, v, 1, 4096, &n_batch))
                return 1;
            ep.n_batch = (int32_t)n_batch;
        } else if (!strcmp(a, "--attn-split")) {
            if ((v = si_cli_value(argc, argv, &i)) == NULL || !si_cli_int(a, v, 0, 256, &ll))
                return 1;
            ep.attn_split = (int32_t)ll;
        } else if (!strcmp(a, "--exact-prefill")) {
            ep.exact_prefill = true;
        } else if (!strcmp(a, "--merge")) {
            if ((v = si_cli_value(argc, argv, &i)) == NULL)
                return 1;
            if (strcmp(v, "task") != 0 && strcmp(v, "redux") != 0)
                return si_cli_error("--merge: '%s' is neither task nor redux", v);
            ep.redux = !strcmp(v, "redux");
        } else if (!strcmp(a, "--gate-threshold")) {
            if ((v = si_cli_value(argc, argv, &i)) == NULL || !si_cli_float(a, v, 0, 1e6, &d))
                return 1;
            ep.gate_threshold = (float)d;
        } else if (!strcmp(a, "--slices")) {
            if ((v = si_cli_value(argc, argv, &i)) == NULL || !si_cli_int(a, v, 1, 256, &ll))
                return 1;
            ep.n_slices = (int32_t)ll;
        } else if (!strcmp(a, "--chat")) {
            chat = true;
        } else if (!strcmp(a, "--ignore-eos")) {
            ignore_eos = true;
        } else if (!strcmp(a, "--ids")) {
            ids = true;
        } else {
            return si_cli_error("generate: unknown option '%s' (see starinfer generate --help)", a);
        }
    }
    if (prompt == NULL && file == NULL)
        return si_cli_error("generate: no prompt given (-p TEXT or -f FILE)");
    if (prompt != NULL && file != NULL)
        return si_cli_error("generate: give either -p or -f, not both");
    if (!use_engine && (ep.mode != SI_SPARSITY_DENSE || ep.vram_budget > 0 || ep.redux ||
                        profile_path != NULL || ep.exact_prefill))
        return si_cli_error("generate: --sparsity, --vram-budget, --profile, --merge and --exact-prefill need "
                            "--engine starpu");
    if (!use_engine && placement_path != NULL)
        return si_cli_error("generate: --placement needs --engine starpu");
    sp.seed = (uint64_t)seed;

    char *text = NULL;
    size_t text_len = 0;
    if (file != NULL) {
        if ((text = si_cli_read_file(file, &text_len)) == NULL)
            return 1;
    } else {
        text = strdup(prompt);
        text_len = strlen(prompt);
    }

    struct si_model *m = NULL;
    struct si_tokenizer *tok = NULL;
    struct si_ref *ref = NULL;
    struct si_engine *eng = NULL;
    struct si_runtime rt = {0};
    struct si_sampler *smp = NULL;
    int32_t *toks = NULL;
    char *wrapped = NULL;
    int rc = 1;
    char err[600];
    if (c.model == NULL) {
        si_cli_error("generate: no model given (-m MODEL.gguf)");
        goto out;
    }
    if (si_model_load(&m, c.model, err, sizeof err) != SI_OK) {
        si_cli_error("%s", err);
        goto out;
    }
    if (si_tokenizer_load(&tok, m->gguf, err, sizeof err) != SI_OK) {
        si_cli_error("%s: %s", c.model, err);
        goto out;
    }
    if (chat) {
        struct si_chat_msg msg = {"user", text};
        int64_t need = si_chat_format(m->gguf, &msg, 1, true, NULL, 0);
        if (need < 0) {
            si_cli_error("%s: the model's chat template is not supported", c.model);
            goto out;
        }
        wrapped = malloc((size_t)need + 1);
        if (wrapped == NULL) {
            si_cli_error("out of memory");
            goto out;
        }
        si_chat_format(m->gguf, &msg, 1, true, wrapped, (size_t)need + 1);
        free(text);
        text = wrapped;
        wrapped = NULL;
        text_len = (size_t)need;
    }
    int64_t n_prompt = si_tokenize(tok, text, text_len, si_tokenizer_add_bos(tok), true, NULL, 0);
    if (n_prompt < 0) {
        si_cli_error("cannot tokenize the prompt: %s", si_status_str((int)n_prompt));
        goto out;
    }
    if (n_prompt == 0) {
        si_cli_error("generate: the prompt is empty");
        goto out;
    }
    toks = malloc(((size_t)n_prompt + (size_t)n_predict + 1) * sizeof *toks);
    if (toks == NULL) {
        si_cli_error("out of memory");
        goto out;
    }
    si_tokenize(tok, text, text_len, si_tokenizer_add_bos(tok), true, toks, (size_t)n_prompt);

    struct si_ref_params rp = si_ref_default_params();
    rp.n_ctx = c.n_ctx > 0 ? (int32_t)c.n_ctx : (int32_t)(n_prompt + n_predict);
    rp.kv_f16 = !c.kv_f32;
    if (n_prompt + n_predict > rp.n_ctx) {
        si_cli_error("generate: prompt (%lld tokens) + n-predict (%lld) exceed the context of %d",
                     (long long)n_prompt, n_predict, rp.n_ctx);
        goto out;
    }
    if (use_engine) {
        if (si_runtime_start(&rt, err, sizeof err) != SI_OK) {
            si_cli_error("%s", err);
            goto out;
        }
        ep.ref = rp;
        if (profile_path != NULL) {
            if (si_profile_read(&prof, profile_path, m, err, sizeof err) != SI_OK) {
                si_cli_error("%s", err);
                goto out;
            }
            ep.profile = prof;
        }
        if (placement_path != NULL) {
            if (si_placement_read(&placement, placement_path, m, err, sizeof err) != SI_OK) {
                si_cli_error("%s", err);
                goto out;
            }
            ep.placement = placement;
        }
        if (prof != NULL && ep.mode == SI_SPARSITY_DENSE)
            fprintf(stderr, "engine: dense mode computes every neuron: the profile does not "
                            "change the placement\n");
        if ((ep.vram_budget > 0 || placement != NULL) && si_runtime_ncuda() == 0)
            fprintf(stderr, "engine: no CUDA worker: --vram-budget/--placement ignored, every FFN neuron "
                            "runs on the CPU workers\n");
        if (si_engine_init(&eng, m, ep, err, sizeof err) != SI_OK) {
            si_cli_error("%s", err);
            goto out;
        }
        if (ep.mode == SI_SPARSITY_GATE && ep.gate_threshold == 0.0f && prof != NULL &&
            prof->thresholds != NULL && m->hp.act != SI_ACT_RELU) {
            float lo = INFINITY, hi = 0.0f;
            for (int l = 0; l < m->hp.n_layer; l++) {
                lo = fminf(lo, si_engine_gate_threshold(eng, l));
                hi = fmaxf(hi, si_engine_gate_threshold(eng, l));
            }
            fprintf(stderr, "engine: gate thresholds from the profile (target sparsity %.2f): "
                            "%.4g to %.4g over the layers\n",
                    (double)prof->target_sparsity, (double)lo, (double)hi);
        }
        ref = si_engine_ref(eng);
    } else if (si_ref_init(&ref, m, rp, err, sizeof err) != SI_OK) {
        si_cli_error("%s", err);
        goto out;
    }
    smp = si_sampler_init(sp, m->hp.n_vocab);
    if (smp == NULL) {
        si_cli_error("out of memory");
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

    double t0 = now();
    /* Prompts of 64 tokens or more are one batch in llama.cpp: f32 attention. */
    ref->attn_f32 = n_prompt >= 64;
    if (eng != NULL && n_batch != 1) {
        /* The engine's prefill: batches of GEMM tasks. */
        if (si_engine_eval_batch(eng, toks, (int32_t)n_prompt) != SI_OK) {
            si_cli_error("evaluation of the prompt failed");
            goto out;
        }
        for (int64_t i = 0; i < n_prompt; i++)
            si_sampler_accept(smp, toks[i]);
    }
    for (int64_t i = 0; (eng == NULL || n_batch == 1) && i < n_prompt; i++) {
        if ((eng != NULL ? si_engine_eval(eng, toks[i]) : si_ref_eval(ref, toks[i])) != SI_OK) {
            si_cli_error("evaluation failed at prompt token %lld", (long long)i);
            goto out;
        }
        si_sampler_accept(smp, toks[i]);
    }
    double t1 = now();
    ref->attn_f32 = false;
    int64_t n_gen = 0;
    char piece[256];
    for (; n_gen < n_predict; n_gen++) {
        int32_t next = si_sampler_sample(smp, ref->logits);
        if (!ignore_eos && si_tokenizer_is_eog(tok, next))
            break;
        if (ids) {
            printf(" %d", next);
        } else {
            int64_t len = si_token_to_piece(tok, next, false, piece, sizeof piece);
            if (len > 0)
                fwrite(piece, 1,
                       (size_t)(len < (int64_t)sizeof piece ? len : (int64_t)sizeof piece), stdout);
        }
        fflush(stdout);
        si_sampler_accept(smp, next);
        if (n_gen + 1 < n_predict &&
            (eng != NULL ? si_engine_eval(eng, next) : si_ref_eval(ref, next)) != SI_OK) {
            si_cli_error("evaluation failed at generated token %lld", (long long)n_gen);
            goto out;
        }
    }
    double t2 = now();
    printf("\n");
    fflush(stdout);
    fprintf(stderr,
            "prompt: %lld tokens in %.2f s (%.2f tokens/s); generated: %lld tokens in %.2f s (%.2f "
            "tokens/s)\n",
            (long long)n_prompt, t1 - t0, (double)n_prompt / (t1 - t0), (long long)n_gen, t2 - t1,
            n_gen > 0 ? (double)n_gen / (t2 - t1) : 0.0);
    if (eng != NULL) {
        struct si_engine_stats st = si_engine_get_stats(eng);
        const double total = (double)(st.neurons_total ? st.neurons_total : 1);
        const int64_t active = st.neurons_hot + st.neurons_cold;
        fprintf(stderr,
                "engine: StarPU, %u CPU + %u CUDA workers, %d cold FFN slices per layer, %s "
                "mode, %.1f MiB of FFN neurons hot: %.1f%% of FFN neurons computed (GPU %.1f%%, "
                "CPU %.1f%%; neuron load on the GPU %.1f%%)\n",
                si_runtime_ncpu(), si_runtime_ncuda(), si_engine_n_slices(eng),
                si_sparsity_name(ep.mode), (double)si_engine_hot_bytes(eng) / 1048576.0,
                100.0 * (double)active / total, 100.0 * (double)st.neurons_hot / total,
                100.0 * (double)st.neurons_cold / total,
                active > 0 ? 100.0 * (double)st.neurons_hot / (double)active : 0.0);
        if (st.gpu_budget > 0)
            fprintf(stderr, "engine: GPU bytes: budget %lld, engine handles %lld, allocated "
                            "by StarPU (peak) %lld\n",
                    (long long)st.gpu_budget, (long long)st.gpu_accounted,
                    (long long)st.gpu_allocated_peak);
        /* Decoding, then prefill: time in tasks summed over workers, the
         * wall time, and how busy the workers were (the rest is
         * scheduling, submission and waiting). */
        const unsigned workers = si_runtime_ncpu() + si_runtime_ncuda();
        for (int pass = 0; pass < 2; pass++) {
            const int k0 = pass == 0 ? 0 : SI_TASK_PREFILL_EMBED;
            const int k1 = pass == 0 ? SI_TASK_PREFILL_EMBED : SI_TASK_KIND_COUNT;
            const double n = (double)(pass == 0 ? st.tokens : st.batch_tokens);
            const double wall = pass == 0 ? st.seconds : st.batch_seconds;
            if (n == 0)
                continue;
            double busy = 0.0;
            fprintf(stderr, "engine: %s, per token:", pass == 0 ? "decoding" : "prefill");
            for (int k = k0; k < k1; k++) {
                busy += st.task_seconds[k];
                fprintf(stderr, " %s %.3f ms,", si_task_kind_name((enum si_task_kind)k),
                        1e3 * st.task_seconds[k] / n);
            }
            fprintf(stderr, " wall %.3f ms, %.1f tasks; workers busy %.0f%% of the wall time\n",
                    1e3 * wall / n, (double)(pass == 0 ? st.tasks : st.batch_tasks) / n,
                    wall > 0 ? 100.0 * busy / (wall * workers) : 0.0);
        }
    }
    rc = 0;
out:
    si_sampler_free(smp);
    if (eng != NULL)
        si_engine_free(eng);
    else
        si_ref_free(ref);
    si_runtime_stop(&rt);
    si_profile_free(prof);
    si_placement_free(placement);
    si_tokenizer_free(tok);
    si_model_free(m);
    free(toks);
    free(text);
    free(wrapped);
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
