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
    fprintf(f,
            "Usage: " SI_PROG " train-predictor -m MODEL -f CORPUS -o OUTPUT [OPTIONS]\n"
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
            "  -o, --output FILE         the model with predictors to write\n"
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
    return in == SI_PRED_LAYER  ? "attention's"
           : in == SI_PRED_FFN ? "FFN's"
                               : "FFN's residual";
}

int si_cmd_train(int argc, char **argv)
{
    const char *model = NULL, *file = NULL, *output = NULL, *profile = NULL, *v;
    const char *samples_file = NULL;
    enum si_active_rule rule = SI_ACTIVE_GATE;
    long long max_tokens = 16384, n_ctx = 512, rank = 0, step = 32, min_rank = 0, max_rank = 0;
    long long epochs = 10, batch = 256, seed = 1, threads = 0;
    double target = 0.5, recall = 0.95, lr = 2e-3, pos_weight = 1, holdout = 0.1, thr = 0;
    bool target_given = false, powerinfer = false, auto_type = true, down_t = false, use_ref = false;
    bool thr_given = false, input_given = false;
    enum si_pred_input input = SI_PRED_FFN;
    double predict_sparsity = 0;
    enum si_train_loss loss = SI_TRAIN_LOSS_BALANCED;
    double cost_power = 1.0;
    bool cost_power_given = false;
    uint32_t type = SI_TYPE_F16;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
#define VALUE()                                                                                    \
    if ((v = si_cli_value(argc, argv, &i)) == NULL)                                                \
    return 1
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            train_usage(stdout);
            return 0;
        } else if (!strcmp(a, "-m") || !strcmp(a, "--model")) {
            VALUE();
            model = v;
        } else if (!strcmp(a, "-f") || !strcmp(a, "--file") || !strcmp(a, "--corpus")) {
            VALUE();
            file = v;
        } else if (!strcmp(a, "-o") || !strcmp(a, "--output")) {
            VALUE();
            output = v;
        } else if (!strcmp(a, "--profile")) {
            VALUE();
            profile = v;
        } else if (!strcmp(a, "-s") || !strcmp(a, "--target-sparsity")) {
            VALUE();
            if (!si_cli_float(a, v, -HUGE_VAL, HUGE_VAL, &target))
                return 1;
            if (!(target >= 0 && target < 1))
                return si_cli_error("%s: %g is out of range [0, 1)", a, target);
            target_given = true;
        } else if (!strcmp(a, "-n") || !strcmp(a, "--max-tokens")) {
            VALUE();
            if (!si_cli_int(a, v, MIN_TOKENS, 1 << 24, &max_tokens))
                return 1;
        } else if (!strcmp(a, "-c") || !strcmp(a, "--ctx-size")) {
            VALUE();
            if (!si_cli_int(a, v, 1, 1 << 20, &n_ctx))
                return 1;
        } else if (!strcmp(a, "-r") || !strcmp(a, "--target-recall")) {
            VALUE();
            if (!si_cli_float(a, v, -HUGE_VAL, HUGE_VAL, &recall))
                return 1;
            if (!(recall > 0 && recall <= 1))
                return si_cli_error("%s: %g is out of range (0, 1]", a, recall);
        } else if (!strcmp(a, "--rank")) {
            VALUE();
            if (!si_cli_int(a, v, 1, 1 << 16, &rank))
                return 1;
        } else if (!strcmp(a, "--rank-step")) {
            VALUE();
            if (!si_cli_int(a, v, 1, 1 << 16, &step))
                return 1;
        } else if (!strcmp(a, "--min-rank")) {
            VALUE();
            if (!si_cli_int(a, v, 1, 1 << 16, &min_rank))
                return 1;
        } else if (!strcmp(a, "--max-rank")) {
            VALUE();
            if (!si_cli_int(a, v, 1, 1 << 16, &max_rank))
                return 1;
        } else if (!strcmp(a, "--epochs")) {
            VALUE();
            if (!si_cli_int(a, v, 1, 100000, &epochs))
                return 1;
        } else if (!strcmp(a, "--batch")) {
            VALUE();
            if (!si_cli_int(a, v, 1, 1 << 16, &batch))
                return 1;
        } else if (!strcmp(a, "--lr")) {
            VALUE();
            if (!si_cli_float(a, v, 1e-7, 1, &lr))
                return 1;
        } else if (!strcmp(a, "--pos-weight")) {
            VALUE();
            if (!si_cli_float(a, v, 1e-3, 1e3, &pos_weight))
                return 1;
        } else if (!strcmp(a, "--holdout")) {
            VALUE();
            if (!si_cli_float(a, v, -HUGE_VAL, HUGE_VAL, &holdout))
                return 1;
            if (!(holdout > 0 && holdout <= 0.5))
                return si_cli_error("%s: %g is out of range (0, 0.5]", a, holdout);
        } else if (!strcmp(a, "--seed")) {
            VALUE();
            if (!si_cli_int(a, v, 0, INT64_MAX, &seed))
                return 1;
        } else if (!strcmp(a, "-t") || !strcmp(a, "--predictor-type")) {
            VALUE();
            if (!parse_type(v, &type, &auto_type))
                return si_cli_error("%s: unknown type '%s' (f32, f16, q8_0, q4_0 or auto)", a, v);
        } else if (!strcmp(a, "--threshold")) {
            VALUE();
            if (!si_cli_float(a, v, -1e6, 1e6, &thr))
                return 1;
            thr_given = true;
        } else if (!strcmp(a, "--predict-sparsity")) {
            VALUE();
            if (!si_cli_float(a, v, -1e6, 1e6, &predict_sparsity))
                return 1;
            if (!(predict_sparsity > 0 && predict_sparsity < 1))
                return si_cli_error("%s: %s is not in (0, 1)", a, v);
        } else if (!strcmp(a, "-a") || !strcmp(a, "--active")) {
            VALUE();
            if (si_active_rule_parse(v, &rule) != SI_OK)
                return si_cli_error("%s: '%s' is neither gate nor output", a, v);
        } else if (!strcmp(a, "--loss")) {
            VALUE();
            if (!strcmp(v, "balanced"))
                loss = SI_TRAIN_LOSS_BALANCED;
            else if (!strcmp(v, "cost"))
                loss = SI_TRAIN_LOSS_COST;
            else
                return si_cli_error("%s: '%s' is neither balanced nor cost", a, v);
        } else if (!strcmp(a, "--cost-power")) {
            VALUE();
            if (!si_cli_float(a, v, -HUGE_VAL, HUGE_VAL, &cost_power))
                return 1;
            if (!(cost_power > 0 && cost_power <= 4))
                return si_cli_error("%s: %g is out of range (0, 4]", a, cost_power);
            cost_power_given = true;
        } else if (!strcmp(a, "--samples")) {
            VALUE();
            samples_file = v;
        } else if (!strcmp(a, "--lookahead")) {
            input = SI_PRED_LAYER;
            input_given = true;
        } else if (!strcmp(a, "--input")) {
            VALUE();
            if (si_pred_input_parse(v, strlen(v), &input) != SI_OK)
                return si_cli_error("%s: '%s' is not ffn, layer or residual", a, v);
            input_given = true;
        } else if (!strcmp(a, "--engine")) {
            VALUE();
            if (!si_cli_engine_opt(v, &use_ref))
                return 1;
        } else if (!strcmp(a, "--powerinfer")) {
            powerinfer = true;
        } else if (!strcmp(a, "--down-t")) {
            down_t = true;
        } else if (!strcmp(a, "--threads")) {
            VALUE();
            if (!si_cli_int(a, v, 1, 1024, &threads))
                return 1;
        } else {
            return si_cli_error(
                "train-predictor: unknown option '%s' (see starinfer train-predictor --help)", a);
        }
#undef VALUE
    }
    if (model == NULL)
        return si_cli_error("train-predictor: no model given (-m MODEL.gguf)");
    if (file == NULL)
        return si_cli_error("train-predictor: no corpus given (-f FILE)");
    if (output == NULL)
        return si_cli_error("train-predictor: no output given (-o MODEL_OUT.gguf)");
    if (profile != NULL && target_given)
        return si_cli_error("train-predictor: give --profile or --target-sparsity, not both");
    if (profile != NULL && rule != SI_ACTIVE_GATE)
        return si_cli_error("train-predictor: --profile holds gate thresholds; --active output "
                            "finds its own (--target-sparsity)");
    if (cost_power_given && loss != SI_TRAIN_LOSS_COST)
        return si_cli_error("train-predictor: --cost-power weights --loss cost only");
    if (thr_given && predict_sparsity > 0)
        return si_cli_error("train-predictor: give --threshold or --predict-sparsity, not both");
    if (loss == SI_TRAIN_LOSS_COST && rank == 0)
        return si_cli_error("train-predictor: --loss cost needs --rank R (the adaptive width tests "
                            "recall at threshold 0, which the unbalanced loss makes meaningless)");
    if (min_rank == 0)
        min_rank = step;
    if (max_rank > 0 && max_rank < min_rank)
        return si_cli_error("--max-rank %lld is below --min-rank %lld", max_rank, min_rank);

    size_t len;
    char *text = si_cli_read_file(file, &len);
    if (text == NULL)
        return 1;
    struct si_model *m = NULL;
    struct si_tokenizer *tok = NULL;
    struct si_profile *prof = NULL;
    struct si_profile_calib *calib = NULL;
    struct si_active_calib *ocalib = NULL;
    float *own_thr = NULL;
    struct si_train_samples *samples = NULL;
    struct si_train_layer *layers = NULL;
    struct si_cli_runner cr = {0};
    int32_t *toks = NULL;
    float *kept_thr = NULL;
    int rc = 1;
    char err[600];
    if (si_cli_load_model(model, &m, &tok) != 0)
        goto out;
    const struct si_hparams *hp = &m->hp;
    if (auto_type)
        type = si_train_auto_type(m, (int32_t)step);
    const struct si_type_traits *tt = si_type_get(type);
    if (hp->n_embd % tt->block != 0) {
        si_cli_error("--predictor-type %s: n_embd %" PRId32
                     " is not a multiple of its block %" PRId64,
                     si_type_name(type), hp->n_embd, tt->block);
        goto out;
    }
    if ((rank > 0 ? rank : step) % tt->block != 0) {
        si_cli_error("--predictor-type %s stores widths in blocks of %" PRId64 ": %s %lld is not a "
                     "multiple (use --rank-step 32 or a float type)",
                     si_type_name(type), tt->block, rank > 0 ? "--rank" : "--rank-step",
                     rank > 0 ? rank : step);
        goto out;
    }
    int64_t n = 0;
    if ((toks = si_cli_tokenize_text(tok, text, len, file, &n)) == NULL)
        goto out;
    if (n < MIN_TOKENS) {
        si_cli_error("%s: %" PRId64 " tokens, too few to train predictors on (at least %d)",
                     file, n, MIN_TOKENS);
        goto out;
    }
    if (n > max_tokens)
        n = max_tokens;

    /* PowerInfer's layout: its predictors read the residual */
    if ((powerinfer || m->gguf->powerinfer) && input != SI_PRED_RESIDUAL) {
        if (input_given) {
            si_cli_error("%s: PowerInfer gives the predictors the residual the FFN's norm reads: "
                         "--input %s does not go in a PowerInfer file (--input residual)",
                         powerinfer ? "--powerinfer" : model, si_pred_input_name(input));
            goto out;
        }
        input = SI_PRED_RESIDUAL;
    }
    const bool relu = si_profile_relu_family(m);
    if (relu && loss == SI_TRAIN_LOSS_COST) {
        si_cli_error("%s: --loss cost prices a neuron at its layer's threshold, and a ReLU-family "
                     "model's rule (activation != 0) has none: use --loss balanced",
                     model);
        goto out;
    }
    tty = si_progress_wanted();
    const double t_start = si__now();

    const float *thresholds = NULL;
    double t_calib = 0, t_collect = 0;
    const bool reuse = samples_file != NULL && access(samples_file, F_OK) == 0;
    if (reuse) {
        bar_t0 = si__now();
        if (si_train_samples_read(&samples, &rule, &kept_thr, &target, samples_file, m, err,
                                  sizeof err) != SI_OK) {
            si_cli_error("%s", err);
            goto out;
        }
        if (!relu && kept_thr == NULL) {
            si_cli_error("%s: samples of a SiLU/GELU model without their thresholds",
                         samples_file);
            goto out;
        }
        if (samples->input != input) {
            si_cli_error("%s: samples of the %s input, but this run trains on the %s (--input %s)",
                         samples_file, input_what(samples->input), input_what(input),
                         si_pred_input_name(input));
            goto out;
        }
        thresholds = relu ? NULL : kept_thr;
        printf("train-predictor: %s, %" PRId64 " samples per layer read from %s (%.1f s)\n",
               model, samples->n, samples_file, si__now() - bar_t0);
    } else {
        if (si_cli_runner_start(&cr, m, use_ref, (int32_t)n_ctx, 128) != 0)
            goto out;
        struct pass ps = {.c = {.m = m, .run = &cr.r}};
        /* The active rule: thresholds from the profile, or a first pass. */
        if (!relu && profile != NULL) {
            if (si_profile_read(&prof, profile, m, err, sizeof err) != SI_OK) {
                si_cli_error("%s", err);
                goto out;
            }
            if (prof->thresholds == NULL) {
                si_cli_error("%s: the profile has no thresholds (make it with starinfer profile "
                             "--target-sparsity)", profile);
                goto out;
            }
            target = prof->target_sparsity;
        } else if (!relu && rule == SI_ACTIVE_OUTPUT) {
            own_thr = malloc((size_t)hp->n_layer * sizeof *own_thr);
            if (own_thr == NULL) {
                si_cli_error("out of memory");
                goto out;
            }
            if (si_active_calib_init(&ocalib, m, rule, err, sizeof err) != SI_OK) {
                si_cli_error("%s", err);
                goto out;
            }
            bar_t0 = si__now();
            ps.active = ocalib;
            if (si_cli_windows("train-predictor thresholds", toks, n, n_ctx, active_pass, &ps, err,
                               sizeof err) != 0 ||
                si_active_calib_thresholds(ocalib, target, own_thr, err, sizeof err) != SI_OK) {
                si_cli_error("%s", err);
                goto out;
            }
            t_calib = si__now() - bar_t0;
        } else if (!relu) {
            if (si_profile_init(&prof, hp->n_layer, hp->n_ff, err, sizeof err) != SI_OK ||
                si_profile_calib_init(&calib, m, err, sizeof err) != SI_OK) {
                si_cli_error("%s", err);
                goto out;
            }
            bar_t0 = si__now();
            ps.c.calib = calib;
            if (si_cli_windows("train-predictor thresholds", toks, n, n_ctx, si_cli_calib_pass,
                               &ps.c, err, sizeof err) != 0 ||
                si_profile_set_thresholds(prof, calib, target, NULL, err, sizeof err) != SI_OK) {
                si_cli_error("%s", err);
                goto out;
            }
            t_calib = si__now() - bar_t0;
        }
        thresholds = relu ? NULL : own_thr != NULL ? own_thr : prof->thresholds;

        /* Samples. */
        if (si_train_samples_init(&samples, hp->n_layer, hp->n_embd, hp->n_ff, n, err,
                                  sizeof err) != SI_OK) {
            si_cli_error("%s", err);
            goto out;
        }
        samples->input = input;
        bar_t0 = si__now();
        ps.samples = samples;
        ps.rule = rule;
        ps.thresholds = thresholds;
        if (si_cli_windows("train-predictor samples", toks, n, n_ctx, sample_pass, &ps, err,
                           sizeof err) != 0) {
            si_cli_error("%s", err);
            goto out;
        }

        t_collect = si__now() - bar_t0;
        si_cli_runner_stop(&cr); /* the workers' cores go to training */
        if (samples_file != NULL &&
            si_train_samples_write(samples, rule, thresholds, target, samples_file, err,
                                   sizeof err) != SI_OK) {
            si_cli_error("%s", err);
            goto out;
        }
    }
    if (!reuse) {
        printf("train-predictor: %s, %" PRId64 " tokens of %s in windows of %lld: %.1f s to "
               "collect on the %s (%.1f tokens/s)",
               model, samples->n, file, n_ctx, t_collect, use_ref ? "reference" : "engine",
               t_collect > 0 ? (double)samples->n / t_collect : 0.0);
        if (!relu)
            printf(", %.1f s for the thresholds", t_calib);
        putchar('\n');
    }
    if (relu)
        printf("ReLU model: active = activation != 0\n");
    else
        printf("%s model: active = %s above the layer's threshold (target sparsity %.3g%s)\n",
               hp->act == SI_ACT_GELU ? "GELU" : "SiLU",
               rule == SI_ACTIVE_GATE ? "|act(gate . x)| (CATS)" : "|act(gate . x) * up . x|",
               target,
               reuse ? ", kept with the samples" : profile ? ", from the profile" : "");
    if (loss == SI_TRAIN_LOSS_COST)
        printf("loss: cross-entropy, each pair weighted by |v^%g - t^%g| (v the rule's value, "
               "t the layer's threshold)\n",
               cost_power, cost_power);
    else
        printf("loss: balanced cross-entropy (each class half of it)\n");
    fflush(stdout);

    /* Training. */
    openblas_set_num_threads(threads > 0 ? (int)threads : (int)sysconf(_SC_NPROCESSORS_ONLN));
    struct si_train_params tp = si_train_default_params();
    tp.threads = threads > 0 ? (int32_t)threads : (int32_t)sysconf(_SC_NPROCESSORS_ONLN);
    tp.target_recall = recall;
    tp.rank_step = (int32_t)step;
    tp.rank_min = (int32_t)min_rank;
    tp.rank_max = (int32_t)max_rank;
    tp.epochs = (int32_t)epochs;
    tp.batch = (int32_t)batch;
    tp.lr = (float)lr;
    tp.pos_weight = (float)pos_weight;
    tp.holdout = holdout;
    tp.seed = (uint64_t)seed;
    tp.loss = loss;
    tp.cost_power = cost_power;
    tp.model = m;
    tp.rule = rule;
    tp.thresholds = thresholds;
    struct train_progress progress = {hp->n_layer};
    if (tty) {
        tp.progress = on_epoch;
        tp.progress_user = &progress;
    }
    layers = calloc((size_t)hp->n_layer, sizeof *layers);
    if (layers == NULL) {
        si_cli_error("out of memory");
        goto out;
    }
    const double t_train0 = si__now();
    int64_t pred_params = 0;
    int32_t below = 0;
    printf("layer  active  width trials  recall  precision  pred.sparsity  loss (init -> "
           "held-out, train)  seconds\n");
    for (int32_t l = 0; l < hp->n_layer; l++) {
        struct si_train_layer *L = &layers[l];
        int r = rank > 0 ? si_train_fit(samples, l, (int32_t)rank, &tp, L, err, sizeof err)
                         : si_train_adaptive(samples, l, &tp, L, err, sizeof err);
        if (tty)
            fputs("\r\033[K", stderr);
        if (r != SI_OK) {
            si_cli_error("layer %" PRId32 ": %s", l, err);
            goto out;
        }
        pred_params += (int64_t)L->rank * (hp->n_embd + hp->n_ff);
        below += L->after.recall < recall;
        printf("%5" PRId32 "  %6.4f  %5" PRId32 "  %6" PRId32 "  %6.4f  %9.4f  %13.4f  %.4f -> "
               "%.4f, %.4f  %7.1f\n",
               l, L->active_share, L->rank, L->n_trials, L->after.recall, L->after.precision,
               L->after.pred_sparsity, L->before.loss, L->after.loss, L->train_loss, L->seconds);
        fflush(stdout);
    }
    const double t_train = si__now() - t_train0;
    if (predict_sparsity > 0) {
        double got = 0;
        float T = 0;
        if (si_train_threshold_for_sparsity(samples, layers, predict_sparsity, &T, &got, err,
                                            sizeof err) != SI_OK) {
            si_cli_error("%s", err);
            goto out;
        }
        thr = T;
        printf("threshold %g: the predictors skip %.4f of the samples' neurons (asked %.3g)\n",
               (double)T, got, predict_sparsity);
    }

    struct si_train_write_params wp = {
        .type = type,
        .threshold = (float)thr,
        .powerinfer = powerinfer,
        .down_t = down_t || powerinfer,
        .rule = rule,
        .thresholds = thresholds,
        .target_sparsity = relu ? 0.0 : target,
        .n_samples = samples->n,
        .input = input,
    };
    if (si_train_write(m, layers, &wp, output, err, sizeof err) != SI_OK) {
        si_cli_error("%s", err);
        goto out;
    }
    printf("predictors: %" PRId64 " parameters, %.2f%% of the model's %" PRId64 " (%s); %" PRId32
           " of %" PRId32 " layers below the target recall %.3g\n",
           pred_params, 100.0 * (double)pred_params / (double)si_eval_model_params(m),
           si_eval_model_params(m),
           si_type_name(type), below, hp->n_layer, recall);
    printf("time: %.1f s training (%.1f s a layer), %.1f s in all -> %s\n", t_train,
           t_train / hp->n_layer, si__now() - t_start, output);
    rc = 0;
out:
    si_cli_runner_stop(&cr);
    for (int32_t l = 0; layers != NULL && l < m->hp.n_layer; l++)
        si_train_layer_clear(&layers[l]);
    free(layers);
    free(kept_thr);
    si_train_samples_free(samples);
    si_profile_free(prof);
    si_profile_calib_free(calib);
    si_active_calib_free(ocalib);
    free(own_thr);
    si_tokenizer_free(tok);
    si_model_free(m);
    free(toks);
    free(text);
    return rc;
}
