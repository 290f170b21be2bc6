/* cmd_train.c - `starinfer train-predictor`: train PowerInfer predictors in C. */
#include "cli.h"
#include "internal.h" /* si__now */
#include "progress.h"
#include "model/forward.h"
#include "model/model.h"
#include "model/tokenizer.h"
#include "model/types.h"
#include "predict/eval.h"
#include "predict/profile.h"
#include "predict/train.h"
#include "starinfer.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

void openblas_set_num_threads(int n); /* OpenBLAS's cblas.h; not every CBLAS has it */

static void train_usage(FILE *f)
{
    fprintf(f, "Usage: " SI_PROG " train-predictor -m MODEL -f CORPUS -o OUTPUT [OPTIONS]\n"
               "\n"
               "Train one activation predictor per layer (PowerInfer's layout: fc1 n_embd -> r,\n"
               "ReLU, fc2 r -> n_ff, no bias; neuron predicted active when fc2's output >= 0)\n"
               "and write the model with them as blk.N.fc1.weight {n_embd, r},\n"
               "blk.N.fc2.weight {r, n_ff} and powerinfer.sparse_threshold.\n"
               "Samples: the model run over the corpus (windows of --ctx-size; the StarPU\n"
               "engine's batched prefill, or --engine ref) keeps each layer's FFN input and\n"
               "its active neurons: activation != 0 on ReLU\n"
               "models; |act(gate . x)| above the layer's CATS threshold on SiLU/GELU ones (from\n"
               "--profile, or found by a first pass for --target-sparsity).  Training: Adam on\n"
               "the balanced (or --loss cost) binary cross-entropy in minibatches (OpenBLAS\n"
               "sgemm), 10%% of the samples held out.  Width: each layer starts from its\n"
               "active share of n_embd and shrinks or grows in multiples of --rank-step until\n"
               "the held-out recall at threshold 0 reaches --target-recall with the smallest\n"
               "width.\n"
               "\n"
               "Options:\n"
               "  -m, --model FILE          the model (GGUF)\n"
               "  -f, --corpus, --file FILE the text to collect samples from\n"
               "  -o, --output FILE         the model with predictors to write (or the\n"
               "                            predictors alone: --predictors-only)\n"
               "      --profile FILE        a profile (starinfer profile) whose CATS thresholds\n"
               "                            define active neurons on SiLU/GELU models\n"
               "  -s, --target-sparsity S   without --profile: the thresholds' target, [0, 1)\n"
               "                            (default 0.5)\n"
               "  -a, --active RULE         SiLU/GELU models: what is thresholded, gate\n"
               "                            (|act(gate . x)|, CATS, as the profile and the gate\n"
               "                            mode; default) or output (|act(gate . x) * up . x|,\n"
               "                            the neuron's output)\n"
               "  -n, --max-tokens N        samples (tokens) to collect (default 16384; the\n"
               "                            corpus and N must give at least 64)\n"
               "  -c, --ctx-size N          window length (default 512)\n"
               "  -r, --target-recall R     held-out recall to reach, (0, 1] (default 0.95)\n"
               "      --rank R              a fixed width for every layer (no search)\n"
               "      --rank-step N         widths are multiples of N (default 32)\n"
               "      --min-rank N          smallest width (default: the step)\n"
               "      --max-rank N          largest width (default: n_embd, rounded up)\n"
               "      --epochs N            passes over the samples per width (default 10)\n"
               "      --batch N             minibatch (default 256)\n"
               "      --lr F                Adam's step (default 0.002, decayed to a tenth)\n"
               "      --loss L              balanced (default: each class half of the loss)\n"
               "                            or cost (each pair weighted by what a wrong call\n"
               "                            costs, |v^P - t^P| for the rule's value v and the\n"
               "                            layer's threshold t: strong neurons count most;\n"
               "                            SiLU/GELU models, with --rank)\n"
               "      --cost-power P        P of --loss cost, (0, 4] (default 1)\n"
               "      --pos-weight F        extra weight of the active class (default 1)\n"
               "      --holdout F           share of samples held out, (0, 0.5] (default 0.1)\n"
               "      --seed N              shuffling and initialisation (default 1)\n"
               "  -t, --predictor-type T    f32, f16, q8_0, q4_0 or auto (the model's FFN type\n"
               "                            when it can be written, else f16; default auto)\n"
               "      --threshold F         powerinfer.sparse_threshold to store (default 0)\n"
               "      --predict-sparsity S  store instead the threshold at which the trained\n"
               "                            predictors skip a share S of the samples' neurons,\n"
               "                            (0, 1); with a higher --target-sparsity the\n"
               "                            predictors learn the strongest neurons and this\n"
               "                            picks how many to compute\n"
               "      --powerinfer          write PowerInfer's layout (default: when the model\n"
               "                            is PowerInfer's): the PWRI magic, the tensors it\n"
               "                            makes (ffn_down_t alone, Q4_0 or F16), predictors\n"
               "                            of the residual (--input residual, its default)\n"
               "      --down-t              add blk.N.ffn_down_t (the transposed down\n"
               "                            projection PowerInfer's sparse FFN reads)\n"
               "      --predictors-only     write the predictors alone (a predictor file, with\n"
               "                            the model's fingerprint; MB, not GB), which\n"
               "                            --predictors FILE gives the model at run time\n"
               "      --threads N           threads of OpenBLAS and of the elementwise steps\n"
               "                            (default: the online CPUs; the weights do not\n"
               "                            depend on it)\n"
               "      --engine E            what runs the model for the samples: starpu\n"
               "                            (default: the task-graph engine, dense, on every\n"
               "                            worker) or ref (the single-threaded reference)\n"
               "      --samples FILE        reuse the samples (and thresholds) kept in FILE when\n"
               "                            it exists, else collect them and keep them there\n"
               "      --input IN            what the predictors read: ffn (the FFN's input\n"
               "                            after its norm; the default but in PowerInfer's\n"
               "                            layout), layer (the attention's input after its\n"
               "                            norm: the engine then runs the predictor, and the\n"
               "                            flash tier's reads, beside the attention) or\n"
               "                            residual (the residual the FFN's norm reads, as\n"
               "                            PowerInfer feeds its predictors)\n"
               "      --lookahead           the same as --input layer\n"
               "  -h, --help                show this help\n");
}

/* The fewest tokens (samples per layer) worth training on: with the default
 * 10% held out, 6 samples judge each width; fewer would write predictors
 * trained on next to nothing. */
#define MIN_TOKENS 64

static bool tty;
static double bar_t0;
static struct si_progress pg;

struct train_progress {
    int32_t n_layer;
};

static void on_epoch(void *user, int32_t layer, int32_t rank, int32_t epoch, int32_t epochs)
{
    const struct train_progress *tp = user;
    char what[48];
    snprintf(what, sizeof what, "train layer %" PRId32 "/%" PRId32 " r %" PRId32, layer + 1,
             tp->n_layer, rank);
    if (strcmp(what, pg.label) != 0 || pg.total != epochs)
        si_progress_begin(&pg, what, epochs, "epochs", 1);
    si_progress_update(&pg, epoch);
}

static bool parse_type(const char *s, uint32_t *t, bool *aut)
{
    *aut = false;
    if (!strcasecmp(s, "auto"))
        *aut = true;
    else if (!strcasecmp(s, "f32"))
        *t = SI_TYPE_F32;
    else if (!strcasecmp(s, "f16"))
        *t = SI_TYPE_F16;
    else if (!strcasecmp(s, "q8_0"))
        *t = SI_TYPE_Q8_0;
    else if (!strcasecmp(s, "q4_0"))
        *t = SI_TYPE_Q4_0;
    else
        return false;
    return true;
}

/* The passes over the corpus, window by window (si_cli_windows). */
struct pass {
    struct si_cli_corpus c; /* the model, its runner, the thresholds' pass */
    struct si_active_calib *active;
    struct si_train_samples *samples;
    enum si_active_rule rule;
    const float *thresholds;
};

static int active_pass(void *u, const int32_t *t, int64_t n, char *err, size_t es)
{
    const struct pass *p = u;
    return si_active_calib_collect(p->active, p->c.m, p->c.run, t, n, err, es);
}

static int sample_pass(void *u, const int32_t *t, int64_t n, char *err, size_t es)
{
    const struct pass *p = u;
    return si_train_collect(p->samples, p->c.m, p->c.run, p->rule, p->thresholds, t, n, err, es);
}

/* The input a predictor reads, in words. */
static const char *input_what(enum si_pred_input in)
{
    return in == SI_PRED_LAYER ? "attention's" : in == SI_PRED_FFN ? "FFN's" : "FFN's residual";
}

/* train-predictor's options (target, rule, input and type as the run
 * settles them: from the samples kept, the profile or the model). */
struct train_opts {
    const char *model, *file, *output, *profile, *samples_file;
    enum si_active_rule rule;
    enum si_pred_input input;
    enum si_train_loss loss;
    uint32_t type;
    long long max_tokens, n_ctx, rank, step, min_rank, max_rank;
    long long epochs, batch, seed, threads;
    double target, recall, lr, pos_weight, holdout, thr, predict_sparsity, cost_power;
    bool target_given, thr_given, input_given, cost_power_given;
    bool powerinfer, auto_type, down_t, use_ref;
    bool predictors_only; /* --predictors-only: a predictor file, not the model */
};

/* The options of the samples (the files, what runs over which tokens, what
 * is active): 1 consumed, 0 not one of them, -1 after an error message. */
static int sample_option(struct train_opts *o, int argc, char **argv, int *i)
{
    const char *a = argv[*i], *v;
    if (!strcmp(a, "-m") || !strcmp(a, "--model"))
        return si_cli_opt_str(argc, argv, i, &o->model);
    if (!strcmp(a, "-f") || !strcmp(a, "--file") || !strcmp(a, "--corpus"))
        return si_cli_opt_str(argc, argv, i, &o->file);
    if (!strcmp(a, "-o") || !strcmp(a, "--output"))
        return si_cli_opt_str(argc, argv, i, &o->output);
    if (!strcmp(a, "--profile"))
        return si_cli_opt_str(argc, argv, i, &o->profile);
    if (!strcmp(a, "--samples"))
        return si_cli_opt_str(argc, argv, i, &o->samples_file);
    if (!strcmp(a, "-n") || !strcmp(a, "--max-tokens"))
        return si_cli_opt_int(argc, argv, i, MIN_TOKENS, 1 << 24, &o->max_tokens);
    if (!strcmp(a, "-c") || !strcmp(a, "--ctx-size"))
        return si_cli_opt_int(argc, argv, i, 1, 1 << 20, &o->n_ctx);
    if (!strcmp(a, "-s") || !strcmp(a, "--target-sparsity")) {
        o->target_given = true;
        return si_cli_opt_range(argc, argv, i, 0, true, 1, false, &o->target);
    }
    if (!strcmp(a, "--lookahead")) {
        o->input = SI_PRED_LAYER;
        o->input_given = true;
        return 1;
    }
    if (strcmp(a, "-a") && strcmp(a, "--active") && strcmp(a, "--input") && strcmp(a, "--engine"))
        return 0;
    if ((v = si_cli_value(argc, argv, i)) == NULL)
        return -1;
    if (!strcmp(a, "--engine"))
        return si_cli_engine_opt(v, &o->use_ref) ? 1 : -1;
    if (!strcmp(a, "--input")) {
        o->input_given = true;
        if (si_pred_input_parse(v, strlen(v), &o->input) != SI_OK)
            return si_cli_error("%s: '%s' is not ffn, layer or residual", a, v), -1;
        return 1;
    }
    /* -a, --active */
    if (si_active_rule_parse(v, &o->rule) != SI_OK)
        return si_cli_error("%s: '%s' is neither gate nor output", a, v), -1;
    return 1;
}

/* The options of the training (the widths, Adam, the loss, the threads):
 * 1 consumed, 0 not one of them, -1 after an error message. */
static int fit_option(struct train_opts *o, int argc, char **argv, int *i)
{
    const char *a = argv[*i], *v;
    if (!strcmp(a, "-r") || !strcmp(a, "--target-recall"))
        return si_cli_opt_range(argc, argv, i, 0, false, 1, true, &o->recall);
    if (!strcmp(a, "--rank"))
        return si_cli_opt_int(argc, argv, i, 1, 1 << 16, &o->rank);
    if (!strcmp(a, "--rank-step"))
        return si_cli_opt_int(argc, argv, i, 1, 1 << 16, &o->step);
    if (!strcmp(a, "--min-rank"))
        return si_cli_opt_int(argc, argv, i, 1, 1 << 16, &o->min_rank);
    if (!strcmp(a, "--max-rank"))
        return si_cli_opt_int(argc, argv, i, 1, 1 << 16, &o->max_rank);
    if (!strcmp(a, "--epochs"))
        return si_cli_opt_int(argc, argv, i, 1, 100000, &o->epochs);
    if (!strcmp(a, "--batch"))
        return si_cli_opt_int(argc, argv, i, 1, 1 << 16, &o->batch);
    if (!strcmp(a, "--lr"))
        return si_cli_opt_float(argc, argv, i, 1e-7, 1, &o->lr);
    if (!strcmp(a, "--pos-weight"))
        return si_cli_opt_float(argc, argv, i, 1e-3, 1e3, &o->pos_weight);
    if (!strcmp(a, "--holdout"))
        return si_cli_opt_range(argc, argv, i, 0, false, 0.5, true, &o->holdout);
    if (!strcmp(a, "--seed"))
        return si_cli_opt_int(argc, argv, i, 0, INT64_MAX, &o->seed);
    if (!strcmp(a, "--threads"))
        return si_cli_opt_int(argc, argv, i, 1, 1024, &o->threads);
    if (!strcmp(a, "--cost-power")) {
        o->cost_power_given = true;
        return si_cli_opt_range(argc, argv, i, 0, false, 4, true, &o->cost_power);
    }
    if (strcmp(a, "--loss"))
        return 0;
    if ((v = si_cli_value(argc, argv, i)) == NULL)
        return -1;
    if (!strcmp(v, "balanced"))
        o->loss = SI_TRAIN_LOSS_BALANCED;
    else if (!strcmp(v, "cost"))
        o->loss = SI_TRAIN_LOSS_COST;
    else
        return si_cli_error("%s: '%s' is neither balanced nor cost", a, v), -1;
    return 1;
}

/* The options of the file written (the predictors' type and threshold, the
 * layout): 1 consumed, 0 not one of them, -1 after an error message. */
static int write_option(struct train_opts *o, int argc, char **argv, int *i)
{
    const char *a = argv[*i], *v;
    if (!strcmp(a, "--powerinfer")) {
        o->powerinfer = true;
        return 1;
    }
    if (!strcmp(a, "--down-t")) {
        o->down_t = true;
        return 1;
    }
    if (!strcmp(a, "--predictors-only")) {
        o->predictors_only = true;
        return 1;
    }
    if (!strcmp(a, "--threshold")) {
        o->thr_given = true;
        return si_cli_opt_float(argc, argv, i, -1e6, 1e6, &o->thr);
    }
    if (strcmp(a, "-t") && strcmp(a, "--predictor-type") && strcmp(a, "--predict-sparsity"))
        return 0;
    if ((v = si_cli_value(argc, argv, i)) == NULL)
        return -1;
    if (strcmp(a, "--predict-sparsity")) { /* -t, --predictor-type */
        if (!parse_type(v, &o->type, &o->auto_type))
            return si_cli_error("%s: unknown type '%s' (f32, f16, q8_0, q4_0 or auto)", a, v), -1;
        return 1;
    }
    if (!si_cli_float(a, v, -1e6, 1e6, &o->predict_sparsity))
        return -1;
    if (!(o->predict_sparsity > 0 && o->predict_sparsity < 1))
        return si_cli_error("%s: %s is not in (0, 1)", a, v), -1;
    return 1;
}

/* The options into o, checked together: 0 to go on, else the exit status
 * (help: 0 printed, -1 for "exit 0"). */
static int train_options(struct train_opts *o, int argc, char **argv)
{
    *o = (struct train_opts){.rule = SI_ACTIVE_GATE,
                             .input = SI_PRED_FFN,
                             .loss = SI_TRAIN_LOSS_BALANCED,
                             .type = SI_TYPE_F16,
                             .max_tokens = 16384,
                             .n_ctx = 512,
                             .step = 32,
                             .epochs = 10,
                             .batch = 256,
                             .seed = 1,
                             .target = 0.5,
                             .recall = 0.95,
                             .lr = 2e-3,
                             .pos_weight = 1,
                             .holdout = 0.1,
                             .cost_power = 1.0,
                             .auto_type = true};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            train_usage(stdout);
            return -1;
        }
        int r = sample_option(o, argc, argv, &i);
        if (r == 0)
            r = fit_option(o, argc, argv, &i);
        if (r == 0)
            r = write_option(o, argc, argv, &i);
        if (r < 0)
            return 1;
        if (r == 0)
            return si_cli_error(
                "train-predictor: unknown option '%s' (see starinfer train-predictor --help)", a);
    }
    if (o->model == NULL)
        return si_cli_error("train-predictor: no model given (-m MODEL.gguf)");
    if (o->file == NULL)
        return si_cli_error("train-predictor: no corpus given (-f FILE)");
    if (o->output == NULL)
        return si_cli_error("train-predictor: no output given (-o MODEL_OUT.gguf)");
    if (o->profile != NULL && o->target_given)
        return si_cli_error("train-predictor: give --profile or --target-sparsity, not both");
    if (o->profile != NULL && o->rule != SI_ACTIVE_GATE)
        return si_cli_error("train-predictor: --profile holds gate thresholds; --active output "
                            "finds its own (--target-sparsity)");
    if (o->cost_power_given && o->loss != SI_TRAIN_LOSS_COST)
        return si_cli_error("train-predictor: --cost-power weights --loss cost only");
    if (o->predictors_only && (o->powerinfer || o->down_t))
        return si_cli_error("train-predictor: --predictors-only writes no weights; %s needs the "
                            "whole model",
                            o->powerinfer ? "--powerinfer" : "--down-t");
    if (o->thr_given && o->predict_sparsity > 0)
        return si_cli_error("train-predictor: give --threshold or --predict-sparsity, not both");
    if (o->loss == SI_TRAIN_LOSS_COST && o->rank == 0)
        return si_cli_error("train-predictor: --loss cost needs --rank R (the adaptive width tests "
                            "recall at threshold 0, which the unbalanced loss makes meaningless)");
    if (o->min_rank == 0)
        o->min_rank = o->step;
    if (o->max_rank > 0 && o->max_rank < o->min_rank)
        return si_cli_error("--max-rank %lld is below --min-rank %lld", o->max_rank, o->min_rank);
    return 0;
}

/* A train-predictor run: what it loaded, collected and trained (freed by
 * train_free). */
struct train {
    struct train_opts *o;
    char *text;
    size_t len;
    struct si_model *m;
    struct si_tokenizer *tok;
    int32_t *toks;
    int64_t n; /* the tokens the samples come from */
    bool relu;
    bool reuse; /* the samples read from --samples FILE */
    struct si_cli_runner cr;
    struct si_profile *prof;
    struct si_profile_calib *calib;
    struct si_active_calib *ocalib;
    float *own_thr, *kept_thr;
    const float *thresholds; /* the active rule's, per layer (NULL: ReLU) */
    struct si_train_samples *samples;
    struct train_progress progress;
    struct si_train_layer *layers;
    double t_start, t_calib, t_collect, t_train;
};

/* The corpus and the model: the predictors' type settled and checked, the
 * text tokenized (at most -n tokens kept), the predictors' input settled;
 * 0, or 1 after an error message. */
static int train_load(struct train *t)
{
    struct train_opts *o = t->o;
    if ((t->text = si_cli_read_file(o->file, &t->len)) == NULL ||
        si_cli_load_model(o->model, NULL, &t->m, &t->tok) != 0)
        return 1;
    const struct si_hparams *hp = &t->m->hp;
    if (o->auto_type)
        o->type = si_train_auto_type(t->m, (int32_t)o->step);
    const struct si_type_traits *tt = si_type_get(o->type);
    if (hp->n_embd % tt->block != 0)
        return si_cli_error("--predictor-type %s: n_embd %" PRId32
                            " is not a multiple of its block %" PRId64,
                            si_type_name(o->type), hp->n_embd, tt->block);
    const long long width = o->rank > 0 ? o->rank : o->step;
    if (width % tt->block != 0)
        return si_cli_error("--predictor-type %s stores widths in blocks of %" PRId64 ": %s %lld "
                            "is not a multiple (use --rank-step 32 or a float type)",
                            si_type_name(o->type), tt->block,
                            o->rank > 0 ? "--rank" : "--rank-step", width);
    if ((t->toks = si_cli_tokenize_text(t->tok, t->text, t->len, o->file, &t->n)) == NULL)
        return 1;
    if (t->n < MIN_TOKENS)
        return si_cli_error("%s: %" PRId64 " tokens, too few to train predictors on (at least %d)",
                            o->file, t->n, MIN_TOKENS);
    if (t->n > o->max_tokens)
        t->n = o->max_tokens;
    /* PowerInfer's layout: its predictors read the residual */
    if ((o->powerinfer || (t->m->gguf->powerinfer && !o->predictors_only)) &&
        o->input != SI_PRED_RESIDUAL) {
        if (o->input_given)
            return si_cli_error(
                "%s: PowerInfer gives the predictors the residual the FFN's norm reads: --input "
                "%s does not go in a PowerInfer file (--input residual)",
                o->powerinfer ? "--powerinfer" : o->model, si_pred_input_name(o->input));
        o->input = SI_PRED_RESIDUAL;
    }
    t->relu = si_profile_relu_family(t->m);
    if (t->relu && o->loss == SI_TRAIN_LOSS_COST)
        return si_cli_error("%s: --loss cost prices a neuron at its layer's threshold, and a "
                            "ReLU-family model's rule (activation != 0) has none: use --loss "
                            "balanced",
                            o->model);
    return 0;
}

/* --samples FILE when it exists: the samples kept there (with the rule, the
 * thresholds and the target sparsity), checked against this run; 0, or 1
 * after an error message. */
static int train_reuse(struct train *t)
{
    struct train_opts *o = t->o;
    char err[600];
    bar_t0 = si__now();
    if (si_train_samples_read(&t->samples, &o->rule, &t->kept_thr, &o->target, o->samples_file,
                              t->m, err, sizeof err) != SI_OK)
        return si_cli_error("%s", err);
    if (!t->relu && t->kept_thr == NULL)
        return si_cli_error("%s: samples of a SiLU/GELU model without their thresholds",
                            o->samples_file);
    if (t->samples->input != o->input)
        return si_cli_error("%s: samples of the %s input, but this run trains on the %s (--input "
                            "%s)",
                            o->samples_file, input_what(t->samples->input), input_what(o->input),
                            si_pred_input_name(o->input));
    t->thresholds = t->relu ? NULL : t->kept_thr;
    printf("train-predictor: %s, %" PRId64 " samples per layer read from %s (%.1f s)\n", o->model,
           t->samples->n, o->samples_file, si__now() - bar_t0);
    return 0;
}

/* The active rule's thresholds on SiLU/GELU models (ReLU ones have none):
 * --profile's, else the --target-sparsity quantiles of a first pass over
 * the corpus through ps (the output rule's, or CATS's); 0, or 1 after an
 * error message. */
static int train_thresholds(struct train *t, struct pass *ps)
{
    struct train_opts *o = t->o;
    const struct si_hparams *hp = &t->m->hp;
    char err[600];
    if (t->relu)
        return 0;
    if (o->profile != NULL) {
        if (si_profile_read(&t->prof, o->profile, t->m, err, sizeof err) != SI_OK)
            return si_cli_error("%s", err);
        if (t->prof->thresholds == NULL)
            return si_cli_error("%s: the profile has no thresholds (make it with starinfer "
                                "profile --target-sparsity)",
                                o->profile);
        o->target = t->prof->target_sparsity;
    } else if (o->rule == SI_ACTIVE_OUTPUT) {
        t->own_thr = malloc((size_t)hp->n_layer * sizeof *t->own_thr);
        if (t->own_thr == NULL)
            return si_cli_error("out of memory");
        if (si_active_calib_init(&t->ocalib, t->m, o->rule, err, sizeof err) != SI_OK)
            return si_cli_error("%s", err);
        bar_t0 = si__now();
        ps->active = t->ocalib;
        if (si_cli_windows("train-predictor thresholds", t->toks, t->n, o->n_ctx, active_pass, ps,
                           err, sizeof err) != 0 ||
            si_active_calib_thresholds(t->ocalib, o->target, t->own_thr, err, sizeof err) != SI_OK)
            return si_cli_error("%s", err);
        t->t_calib = si__now() - bar_t0;
    } else {
        if (si_profile_init(&t->prof, hp->n_layer, hp->n_ff, err, sizeof err) != SI_OK ||
            si_profile_calib_init(&t->calib, t->m, err, sizeof err) != SI_OK)
            return si_cli_error("%s", err);
        bar_t0 = si__now();
        ps->c.calib = t->calib;
        if (si_cli_windows("train-predictor thresholds", t->toks, t->n, o->n_ctx, si_cli_calib_pass,
                           &ps->c, err, sizeof err) != 0 ||
            si_profile_set_thresholds(t->prof, t->calib, o->target, NULL, err, sizeof err) != SI_OK)
            return si_cli_error("%s", err);
        t->t_calib = si__now() - bar_t0;
    }
    t->thresholds = t->own_thr != NULL ? t->own_thr : t->prof->thresholds;
    return 0;
}

/* The samples: the model run over the corpus (the thresholds' pass first),
 * the runner stopped after it (its cores go to training) and the samples
 * kept in --samples FILE when given; 0, or 1 after an error message. */
static int train_collect(struct train *t)
{
    struct train_opts *o = t->o;
    const struct si_hparams *hp = &t->m->hp;
    char err[600];
    if (si_cli_runner_start(&t->cr, t->m, o->use_ref, (int32_t)o->n_ctx, 128) != 0)
        return 1;
    struct pass ps = {.c = {.m = t->m, .run = &t->cr.r}};
    if (train_thresholds(t, &ps) != 0)
        return 1;
    if (si_train_samples_init(&t->samples, hp->n_layer, hp->n_embd, hp->n_ff, t->n, err,
                              sizeof err) != SI_OK)
        return si_cli_error("%s", err);
    t->samples->input = o->input;
    bar_t0 = si__now();
    ps.samples = t->samples;
    ps.rule = o->rule;
    ps.thresholds = t->thresholds;
    if (si_cli_windows("train-predictor samples", t->toks, t->n, o->n_ctx, sample_pass, &ps, err,
                       sizeof err) != 0)
        return si_cli_error("%s", err);
    t->t_collect = si__now() - bar_t0;
    si_cli_runner_stop(&t->cr); /* the workers' cores go to training */
    if (o->samples_file != NULL &&
        si_train_samples_write(t->samples, o->rule, t->thresholds, o->target, o->samples_file, err,
                               sizeof err) != SI_OK)
        return si_cli_error("%s", err);
    return 0;
}

/* What the training starts from: how the samples were collected (unless
 * read), the active rule, the loss. */
static void print_samples(const struct train *t)
{
    const struct train_opts *o = t->o;
    if (!t->reuse) {
        printf("train-predictor: %s, %" PRId64 " tokens of %s in windows of %lld: %.1f s to "
               "collect on the %s (%.1f tokens/s)",
               o->model, t->samples->n, o->file, o->n_ctx, t->t_collect,
               o->use_ref ? "reference" : "engine",
               t->t_collect > 0 ? (double)t->samples->n / t->t_collect : 0.0);
        if (!t->relu)
            printf(", %.1f s for the thresholds", t->t_calib);
        putchar('\n');
    }
    if (t->relu)
        printf("ReLU model: active = activation != 0\n");
    else
        printf("%s model: active = %s above the layer's threshold (target sparsity %.3g%s)\n",
               t->m->hp.act == SI_ACT_GELU ? "GELU" : "SiLU",
               o->rule == SI_ACTIVE_GATE ? "|act(gate . x)| (CATS)" : "|act(gate . x) * up . x|",
               o->target,
               t->reuse     ? ", kept with the samples"
               : o->profile ? ", from the profile"
                            : "");
    if (o->loss == SI_TRAIN_LOSS_COST)
        printf("loss: cross-entropy, each pair weighted by |v^%g - t^%g| (v the rule's value, "
               "t the layer's threshold)\n",
               o->cost_power, o->cost_power);
    else
        printf("loss: balanced cross-entropy (each class half of it)\n");
    fflush(stdout);
}

/* The training's parameters from the options (OpenBLAS's threads set too). */
static struct si_train_params train_params(struct train *t)
{
    const struct train_opts *o = t->o;
    openblas_set_num_threads(o->threads > 0 ? (int)o->threads : (int)sysconf(_SC_NPROCESSORS_ONLN));
    struct si_train_params tp = si_train_default_params();
    tp.threads = o->threads > 0 ? (int32_t)o->threads : (int32_t)sysconf(_SC_NPROCESSORS_ONLN);
    tp.target_recall = o->recall;
    tp.rank_step = (int32_t)o->step;
    tp.rank_min = (int32_t)o->min_rank;
    tp.rank_max = (int32_t)o->max_rank;
    tp.epochs = (int32_t)o->epochs;
    tp.batch = (int32_t)o->batch;
    tp.lr = (float)o->lr;
    tp.pos_weight = (float)o->pos_weight;
    tp.holdout = o->holdout;
    tp.seed = (uint64_t)o->seed;
    tp.loss = o->loss;
    tp.cost_power = o->cost_power;
    tp.model = t->m;
    tp.rule = o->rule;
    tp.thresholds = t->thresholds;
    t->progress = (struct train_progress){t->m->hp.n_layer};
    if (tty) {
        tp.progress = on_epoch;
        tp.progress_user = &t->progress;
    }
    return tp;
}

/* Each layer's predictor trained (--rank, else the adaptive width), a line
 * a layer; the predictors' parameters and the layers below the target
 * recall into *params and *below.  0, or 1 after an error message. */
static int train_layers(struct train *t, int64_t *params, int32_t *below)
{
    const struct train_opts *o = t->o;
    const struct si_hparams *hp = &t->m->hp;
    const struct si_train_params tp = train_params(t);
    char err[600];
    t->layers = calloc((size_t)hp->n_layer, sizeof *t->layers);
    if (t->layers == NULL)
        return si_cli_error("out of memory");
    const double t0 = si__now();
    printf("layer  active  width trials  recall  precision  pred.sparsity  loss (init -> "
           "held-out, train)  seconds\n");
    for (int32_t l = 0; l < hp->n_layer; l++) {
        struct si_train_layer *L = &t->layers[l];
        int r = o->rank > 0 ? si_train_fit(t->samples, l, (int32_t)o->rank, &tp, L, err, sizeof err)
                            : si_train_adaptive(t->samples, l, &tp, L, err, sizeof err);
        if (tty)
            fputs("\r\033[K", stderr);
        if (r != SI_OK)
            return si_cli_error("layer %" PRId32 ": %s", l, err);
        *params += (int64_t)L->rank * (hp->n_embd + hp->n_ff);
        *below += L->after.recall < o->recall;
        printf("%5" PRId32 "  %6.4f  %5" PRId32 "  %6" PRId32 "  %6.4f  %9.4f  %13.4f  %.4f -> "
               "%.4f, %.4f  %7.1f\n",
               l, L->active_share, L->rank, L->n_trials, L->after.recall, L->after.precision,
               L->after.pred_sparsity, L->before.loss, L->after.loss, L->train_loss, L->seconds);
        fflush(stdout);
    }
    t->t_train = si__now() - t0;
    return 0;
}

/* The model with the predictors written to -o (the stored threshold from
 * --predict-sparsity when given), and the run's summary; 0, or 1 after an
 * error message. */
static int train_write(struct train *t, int64_t pred_params, int32_t below)
{
    struct train_opts *o = t->o;
    const struct si_hparams *hp = &t->m->hp;
    char err[600];
    if (o->predict_sparsity > 0) {
        double got = 0;
        float T = 0;
        if (si_train_threshold_for_sparsity(t->samples, t->layers, o->predict_sparsity, &T, &got,
                                            err, sizeof err) != SI_OK)
            return si_cli_error("%s", err);
        o->thr = T;
        printf("threshold %g: the predictors skip %.4f of the samples' neurons (asked %.3g)\n",
               (double)T, got, o->predict_sparsity);
    }
    struct si_train_write_params wp = {
        .type = o->type,
        .threshold = (float)o->thr,
        .powerinfer = o->powerinfer,
        .down_t = o->down_t || o->powerinfer,
        .rule = o->rule,
        .thresholds = t->thresholds,
        .target_sparsity = t->relu ? 0.0 : o->target,
        .n_samples = t->samples->n,
        .input = o->input,
        .predictors_only = o->predictors_only,
    };
    if (si_train_write(t->m, t->layers, &wp, o->output, err, sizeof err) != SI_OK)
        return si_cli_error("%s", err);
    printf("predictors: %" PRId64 " parameters, %.2f%% of the model's %" PRId64 " (%s); %" PRId32
           " of %" PRId32 " layers below the target recall %.3g\n",
           pred_params, 100.0 * (double)pred_params / (double)si_eval_model_params(t->m),
           si_eval_model_params(t->m), si_type_name(o->type), below, hp->n_layer, o->recall);
    printf("time: %.1f s training (%.1f s a layer), %.1f s in all -> %s\n", t->t_train,
           t->t_train / hp->n_layer, si__now() - t->t_start, o->output);
    return 0;
}

/* Everything the run holds, the runner stopped. */
static void train_free(struct train *t)
{
    si_cli_runner_stop(&t->cr);
    for (int32_t l = 0; t->layers != NULL && l < t->m->hp.n_layer; l++)
        si_train_layer_clear(&t->layers[l]);
    free(t->layers);
    free(t->kept_thr);
    si_train_samples_free(t->samples);
    si_profile_free(t->prof);
    si_profile_calib_free(t->calib);
    si_active_calib_free(t->ocalib);
    free(t->own_thr);
    si_tokenizer_free(t->tok);
    si_model_free(t->m);
    free(t->toks);
    free(t->text);
}

int si_cmd_train(int argc, char **argv)
{
    struct train_opts o;
    int rc = train_options(&o, argc, argv);
    if (rc != 0)
        return rc < 0 ? 0 : rc;
    struct train t = {.o = &o};
    int64_t pred_params = 0;
    int32_t below = 0;
    rc = 1;
    if (train_load(&t) != 0)
        goto out;
    tty = si_progress_wanted();
    t.t_start = si__now();
    t.reuse = o.samples_file != NULL && access(o.samples_file, F_OK) == 0;
    if ((t.reuse ? train_reuse(&t) : train_collect(&t)) != 0)
        goto out;
    print_samples(&t);
    if (train_layers(&t, &pred_params, &below) != 0 || train_write(&t, pred_params, below) != 0)
        goto out;
    rc = 0;
out:
    train_free(&t);
    return rc;
}
