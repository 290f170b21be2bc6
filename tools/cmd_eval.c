/* cmd_eval.c - `starinfer eval`: predictor quality and perplexity per sparsity mode. */
#include "cli.h"
#include "progress.h"
#include "model/forward.h"
#include "model/model.h"
#include "model/tokenizer.h"
#include "predict/eval.h"
#include "predict/input_sparsity.h"
#include "predict/profile.h"
#include "starinfer.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void eval_usage(FILE *f)
{
    fprintf(f, "Usage: " SI_PROG " eval -m MODEL_WITH_PREDICTORS -f HELDOUT_TEXT [OPTIONS]\n"
               "\n"
               "Evaluate a model's activation predictors (blk.N.fc1/fc2) on a text: per layer\n"
               "recall, precision and predicted sparsity (share of neurons skipped) against\n"
               "the neurons really active on the dense pass, the predictors' size as a share\n"
               "of the model's parameters, and the perplexity (as `starinfer perplexity`\n"
               "computes it) in the modes\n"
               "  dense      every FFN neuron\n"
               "  gate       SiLU/GELU: neurons with |act(gate . x)| at or below the layer's\n"
               "             CATS threshold skipped; ReLU: zeros skipped (exact)\n"
               "  oracle     exactly the active neurons (the best a predictor can do; run\n"
               "             for the output rule: for the gate rule it is gate mode)\n"
               "  predictor  only the neurons the predictors pick\n"
               "Active (the truth): activation != 0 on ReLU models; on SiLU/GELU ones the rule\n"
               "and thresholds train-predictor stored in the model (|act(gate . x)| or the\n"
               "neuron's output |h|), or |act(gate . x)| above the CATS thresholds of\n"
               "--profile.\n"
               "The modes run on the StarPU engine (dense and gate in batches, predictor\n"
               "token by token as it decodes; the predictors are compared on a dense pass,\n"
               "run even when --modes leaves dense out, and gate mode's neurons computed are\n"
               "counted there), the oracle on the reference; --engine ref runs every mode on\n"
               "the reference.\n"
               "\n"
               "Options:\n"
               "  -m, --model FILE      the model with predictors (starinfer train-predictor)\n"
               "      --predictors FILE a predictor file made for the model (train-predictor\n"
               "                        --predictors-only) in place of its own predictors\n"
               "  -f, --file FILE       the held-out text (not the training corpus)\n"
               "      --profile FILE    a profile whose CATS thresholds define active neurons\n"
               "  -c, --ctx-size N      perplexity chunk length (default 512)\n"
               "      --chunks N        at most N chunks (default: all)\n"
               "      --modes LIST      comma-separated subset of dense,gate,oracle,predictor\n"
               "                        (default: those that apply)\n"
               "      --threshold T     predict with this threshold instead of the model's\n"
               "                        powerinfer.sparse_threshold (lower: more neurons)\n"
               "      --engine E        starpu (default) or ref (the single-threaded\n"
               "                        reference: llama.cpp's arithmetic bit for bit on AVX2)\n"
               "      --input-sparsity LIST\n"
               "                        instead: training-free input sparsity (TEAL) at each\n"
               "                        target S of the comma-separated LIST (e.g.\n"
               "                        0,0.25,0.4,0.5; thresholds from --profile, made by\n"
               "                        `profile --input-sparsity`), the model needing no\n"
               "                        predictors: perplexity and tokens/s on the engine,\n"
               "                        token by token as it decodes (dense mode; the\n"
               "                        products read the transposed copies `convert\n"
               "                        --transpose` adds, where the model has them)\n"
               "  -h, --help            show this help\n");
}

static bool tty;

static void on_chunk(void *user, int64_t chunk, int64_t n_chunks, double ppl)
{
    (void)ppl;
    struct si_progress *pg = user;
    if (pg->total != n_chunks) {
        char label[48];
        snprintf(label, sizeof label, "%s", pg->label);
        si_progress_begin(pg, label, n_chunks, "chunks", 1);
    }
    si_progress_update(pg, chunk);
}

enum { M_DENSE, M_GATE, M_ORACLE, M_PRED, M_COUNT };
static const char *mode_names[M_COUNT] = {"dense", "gate", "oracle", "predictor"};

/* Parse --modes into want[M_COUNT]. */
static bool parse_modes(const char *s, bool want[M_COUNT])
{
    for (int i = 0; i < M_COUNT; i++)
        want[i] = false;
    while (*s) {
        const char *e = strchr(s, ',');
        const size_t len = e ? (size_t)(e - s) : strlen(s);
        int k = -1;
        for (int i = 0; i < M_COUNT; i++)
            if (strlen(mode_names[i]) == len && !strncmp(s, mode_names[i], len))
                k = i;
        if (k < 0) {
            si_cli_error("--modes: unknown mode '%.*s' (dense, gate, oracle, predictor)", (int)len,
                         s);
            return false;
        }
        want[k] = true;
        s += len + (e != NULL);
    }
    for (int i = 0; i < M_COUNT; i++)
        if (want[i])
            return true;
    si_cli_error("--modes: no mode given");
    return false;
}

/* --input-sparsity: the perplexity and decode speed of model m (dense mode,
 * token by token) at each target S of list, thresholds from prof. */
static int eval_input(const struct si_model *m, const char *model, const char *file,
                      const struct si_profile *prof, const double *list, int n_list,
                      const int32_t *toks, int64_t n, long long n_ctx, long long max_chunks,
                      int32_t bos)
{
    const int32_t nl = m->hp.n_layer;
    int64_t n_chunks = n / n_ctx;
    if (max_chunks > 0 && max_chunks < n_chunks)
        n_chunks = max_chunks;
    float *thr = malloc((size_t)nl * SI_INPUT_KINDS * sizeof *thr);
    struct si_eval_ppl *res = calloc((size_t)n_list, sizeof *res);
    if (thr == NULL || res == NULL) {
        free(thr);
        free(res);
        return si_cli_error("out of memory");
    }
    char err[600];
    int rc = 0;
    for (int k = 0; k < n_list && rc == 0; k++) {
        double S[SI_INPUT_KINDS];
        si_input_targets(list[k], false, S);
        struct si_engine_params ep = si_engine_default_params();
        ep.ref.n_ctx = (int32_t)n_ctx;
        ep.n_batch = 1; /* as it decodes: the batches are dense */
        if (list[k] > 0) {
            if (si_input_thresholds_by_kind(prof, S, thr, err, sizeof err) != SI_OK) {
                rc = si_cli_error("input sparsity %g: %s", list[k], err);
                break;
            }
            ep.ref.input_thresholds = thr;
            ep.ref.input_t = true;
        }
        struct si_progress pg;
        char label[48];
        snprintf(label, sizeof label, "eval input %.2f", list[k]);
        si_progress_begin(&pg, label, 0, "chunks", 1);
        const struct si_cli_ppl o = {.progress = tty ? on_chunk : NULL, .progress_user = &pg};
        rc = si_cli_engine_perplexity(m, ep, toks, n_chunks, bos, &o, &res[k]);
        si_progress_end(&pg);
        if (tty)
            fputs("\r\033[K", stderr);
    }
    if (rc == 0) {
        const struct si_layer *L = &m->w.layers[0];
        printf("eval: %s on %s, %" PRId64 " tokens, %" PRId64 " chunk%s of %lld (%" PRId64
               " tokens scored), token by token on the engine, dense mode\n",
               model, file, n, res[0].n_chunks, si_cli_s(res[0].n_chunks), n_ctx, res[0].n_scored);
        printf("input sparsity: thresholds from the profile; %s\n",
               L->wq_t.data != NULL || L->ffn_up_t.data != NULL
                   ? "the products read the model's transposed copies"
                   : "the model has no transposed copies (convert --transpose): every weight "
                     "is read");
        printf("S     weights skipped  perplexity            vs first  tokens/s\n");
        for (int k = 0; k < n_list; k++) {
            double S[SI_INPUT_KINDS];
            si_input_targets(list[k], false, S);
            const double evaluated = (double)res[k].n_chunks * (double)(n_ctx - 1);
            printf("%.2f  %14.1f%%  %9.4f +/- %7.4f  %+7.2f%%  %8.2f\n", list[k],
                   100.0 * si_input_model_sparsity(m, S), res[k].ppl, res[k].ppl_err,
                   100.0 * (res[k].ppl / res[0].ppl - 1.0),
                   res[k].seconds > 0 ? evaluated / res[k].seconds : 0.0);
        }
    }
    free(thr);
    free(res);
    return rc;
}

/* "S,S,..." into list (at most max); false after an error message. */
static bool parse_input_list(const char *v, double *list, int max, int *n)
{
    *n = 0;
    char buf[256];
    snprintf(buf, sizeof buf, "%s", v);
    for (char *save = NULL, *t = strtok_r(buf, ",", &save); t != NULL;
         t = strtok_r(NULL, ",", &save)) {
        if (*n == max)
            return si_cli_error("--input-sparsity: more than %d values", max) == 0;
        if (!si_cli_float("--input-sparsity", t, 0.0, 0.9, &list[(*n)++]))
            return false;
    }
    if (*n == 0)
        return si_cli_error("--input-sparsity: no value given") == 0;
    return true;
}

/* eval's options. */
struct eval_opts {
    const char *model, *file, *profile;
    const char *predictors; /* --predictors FILE */
    long long n_ctx, max_chunks;
    double threshold;
    bool threshold_given, use_ref, modes_given;
    bool want[M_COUNT];    /* --modes */
    double input_list[16]; /* --input-sparsity, n_input values */
    int n_input;
};

/* The options into o: 0 to go on, else the exit status (help: 0 printed,
 * -1 for "exit 0"). */
static int eval_options(struct eval_opts *o, int argc, char **argv)
{
    *o = (struct eval_opts){.n_ctx = 512, .max_chunks = -1};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = NULL;
        int r = 0;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            eval_usage(stdout);
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
            r = si_cli_opt_int(argc, argv, &i, 16, 1 << 20, &o->n_ctx);
        } else if (!strcmp(a, "--chunks")) {
            r = si_cli_opt_int(argc, argv, &i, 1, 1 << 30, &o->max_chunks);
        } else if (!strcmp(a, "--threshold")) {
            r = si_cli_opt_float(argc, argv, &i, -1e6, 1e6, &o->threshold);
            o->threshold_given = true;
        } else if (!strcmp(a, "--input-sparsity")) {
            r = (v = si_cli_value(argc, argv, &i)) != NULL &&
                        parse_input_list(v, o->input_list, 16, &o->n_input)
                    ? 1
                    : -1;
        } else if (!strcmp(a, "--engine")) {
            r = (v = si_cli_value(argc, argv, &i)) != NULL && si_cli_engine_opt(v, &o->use_ref)
                    ? 1
                    : -1;
        } else if (!strcmp(a, "--modes")) {
            r = (v = si_cli_value(argc, argv, &i)) != NULL && parse_modes(v, o->want) ? 1 : -1;
            o->modes_given = true;
        } else {
            return si_cli_error("eval: unknown option '%s' (see starinfer eval --help)", a);
        }
        if (r < 0)
            return 1;
    }
    if (o->model == NULL)
        return si_cli_error("eval: no model given (-m MODEL.gguf)");
    if (o->file == NULL)
        return si_cli_error("eval: no held-out text given (-f FILE)");
    return 0;
}

/* An evaluation: the model, the truth's rule and thresholds, the text's
 * tokens and each mode's results (freed by eval_free). */
struct eval {
    struct eval_opts *o;
    char *text;
    size_t len;
    struct si_model *m;
    struct si_tokenizer *tok;
    struct si_profile *prof;
    bool relu;
    enum si_active_rule rule;
    const float *thresholds; /* the rule's, per layer (NULL: ReLU without --profile) */
    float *stored;           /* ... when stored in the model */
    double target;
    int32_t *toks;
    int64_t n;
    int32_t bos_tok;                /* -1: none */
    struct si_eval_confusion *conf; /* per layer, the predictors against the truth */
    struct si_eval_watch *watch;
    int64_t *zero_counts;
    struct si_eval_ppl res[M_COUNT];
};

/* The text's tokens into e->toks (e->n of them, at least a chunk); 0, or 1
 * after an error message. */
static int eval_tokens(struct eval *e)
{
    const struct eval_opts *o = e->o;
    if ((e->toks = si_cli_tokenize_text(e->tok, e->text, e->len, o->file, &e->n)) == NULL)
        return 1;
    if (e->n < o->n_ctx)
        return si_cli_error("%s: %" PRId64 " tokens, fewer than one chunk of %lld (lower -c)",
                            o->file, e->n, o->n_ctx);
    return 0;
}

/* --input-sparsity: eval_input with --profile's thresholds; 0, or 1 after
 * an error message. */
static int eval_input_sparsity(struct eval *e)
{
    const struct eval_opts *o = e->o;
    char err[600];
    if (si_profile_read(&e->prof, o->profile, e->m, err, sizeof err) != SI_OK)
        return si_cli_error("%s", err);
    if (eval_tokens(e) != 0)
        return 1;
    tty = si_progress_wanted();
    return eval_input(e->m, o->model, o->file, e->prof, o->input_list, o->n_input, e->toks, e->n,
                      o->n_ctx, o->max_chunks,
                      si_tokenizer_add_bos(e->tok) ? si_tokenizer_bos(e->tok) : -1) != 0;
}

/* The truth: the rule and thresholds of the active neurons (--profile's,
 * else those stored in the model; none on ReLU models), after --threshold
 * set the predictors'; 0, or 1 after an error message. */
static int eval_truth(struct eval *e)
{
    const struct eval_opts *o = e->o;
    char err[600];
    if (!e->m->has_predictor)
        return si_cli_error("%s: the model has no predictors (blk.N.fc1/fc2 tensors; make them "
                            "with starinfer train-predictor)",
                            o->model);
    if (o->threshold_given)
        e->m->predictor_threshold = (float)o->threshold;
    e->relu = si_profile_relu_family(e->m);
    e->rule = SI_ACTIVE_GATE;
    if (o->profile != NULL) {
        if (si_profile_read(&e->prof, o->profile, e->m, err, sizeof err) != SI_OK)
            return si_cli_error("%s", err);
        if (!e->relu && e->prof->thresholds == NULL)
            return si_cli_error("%s: the profile has no thresholds (make it with starinfer "
                                "profile --target-sparsity)",
                                o->profile);
        e->thresholds = e->prof->thresholds;
        e->target = e->prof->target_sparsity;
    } else if (!e->relu) {
        int r = si_eval_stored_thresholds(e->m, &e->rule, &e->stored, &e->target, err, sizeof err);
        if (r == SI_E_NOT_FOUND)
            return si_cli_error("%s: a SiLU/GELU model without stored activity thresholds: give "
                                "--profile (made with --target-sparsity)",
                                o->model);
        if (r != SI_OK)
            return si_cli_error("%s: %s", o->model, err);
        e->thresholds = e->stored;
    }
    return 0;
}

/* The modes to run: --modes, else those that apply.  Gate mode needs CATS
 * thresholds (the gate rule's); the oracle is gate mode for the gate rule
 * and dense for ReLU models.  0, or 1 after an error message. */
static int eval_modes(struct eval *e)
{
    struct eval_opts *o = e->o;
    const bool gate_ok = e->relu || e->rule == SI_ACTIVE_GATE;
    if (!o->modes_given) {
        o->want[M_DENSE] = o->want[M_PRED] = true;
        o->want[M_GATE] = gate_ok;
        o->want[M_ORACLE] = !e->relu && e->rule == SI_ACTIVE_OUTPUT;
    } else if (o->want[M_GATE] && !gate_ok) {
        return si_cli_error("--modes gate: the predictors were trained on the output rule; gate "
                            "mode needs CATS thresholds (give --profile)");
    }
    return 0;
}

/* Mode k's perplexity on the StarPU engine (ep: the pass's parameters, rp
 * the reference's), the dense pass watching the predictors, in n_chunks
 * chunks; gate mode's thresholds from gate_prof without --profile.  0, or
 * 1 after an error message. */
static int engine_pass(struct eval *e, int k, struct si_ref_params rp,
                       const struct si_eval_params *ep, const struct si_profile *gate_prof,
                       int64_t n_chunks, double *gate_share)
{
    char err[600];
    struct si_engine_params eng = si_engine_default_params();
    eng.ref = rp;
    eng.ref.gate_thresholds = NULL;
    eng.ref.predictor = false;
    eng.mode = k == M_DENSE  ? SI_SPARSITY_DENSE
               : k == M_GATE ? SI_SPARSITY_GATE
                             : SI_SPARSITY_PREDICTOR;
    eng.n_batch = k == M_PRED ? 1 : 128; /* predictors pick per token, as decoding */
    if (k == M_GATE && !e->relu)
        eng.profile = e->prof != NULL ? e->prof : gate_prof;
    if (k == M_DENSE &&
        si_eval_watch_init(&e->watch, e->m, ep, eng.ref.act_quant, err, sizeof err) != SI_OK) {
        si_progress_end(ep->progress_user);
        return si_cli_error("%s", err);
    }
    const struct si_cli_ppl o = {.observe = k == M_DENSE ? si_eval_watch_hook : NULL,
                                 .observe_user = e->watch,
                                 .progress = ep->progress,
                                 .progress_user = ep->progress_user};
    if (si_cli_engine_perplexity(e->m, eng, e->toks, n_chunks, e->bos_tok, &o, &e->res[k]) != 0) {
        si_progress_end(ep->progress_user);
        return 1;
    }
    if (k == M_DENSE)
        *gate_share = si_eval_watch_active_share(e->watch);
    if (k == M_GATE) /* counted on the dense pass (the batches do not count) */
        e->res[k].ffn_computed = *gate_share;
    return 0;
}

/* Every mode's perplexity into e->res, the predictors compared with the
 * truth on the first pass run: the dense one, run on the engine even when
 * not asked for (its row then left out).  0, or 1 after an error message. */
static int eval_passes(struct eval *e)
{
    const struct eval_opts *o = e->o;
    const struct si_hparams *hp = &e->m->hp;
    char err[600];
    bool want[M_COUNT], compared = false;
    memcpy(want, o->want, sizeof want);
    if (!o->use_ref)
        want[M_DENSE] = true;
    int64_t n_chunks = e->n / o->n_ctx;
    if (o->max_chunks > 0 && o->max_chunks < n_chunks)
        n_chunks = o->max_chunks;
    /* Gate mode's per-layer thresholds reach the engine through a profile:
     * --profile's, or one holding the stored thresholds and no counts. */
    e->zero_counts = calloc((size_t)hp->n_layer * (size_t)hp->n_ff, sizeof *e->zero_counts);
    if (e->zero_counts == NULL)
        return si_cli_error("out of memory");
    const struct si_profile gate_prof = {.n_layer = hp->n_layer,
                                         .n_ff = hp->n_ff,
                                         .counts = e->zero_counts,
                                         .thresholds = (float *)e->thresholds,
                                         .target_sparsity = (float)e->target};
    double gate_share = 0;
    for (int k = 0; k < M_COUNT; k++) {
        if (!want[k])
            continue;
        struct si_ref_params rp = si_ref_default_params();
        rp.n_ctx = (int32_t)o->n_ctx;
        if (k == M_GATE && !e->relu)
            rp.gate_thresholds = e->thresholds;
        rp.predictor = k == M_PRED;
        struct si_progress pg;
        char label[48];
        snprintf(label, sizeof label, "eval %s", mode_names[k]);
        si_progress_begin(&pg, label, 0, "chunks", 1);
        struct si_eval_params ep = {.max_chunks = o->max_chunks,
                                    .bos = e->bos_tok,
                                    .rule = e->rule,
                                    .thresholds = e->thresholds,
                                    .conf = compared ? NULL : e->conf,
                                    .oracle = k == M_ORACLE,
                                    .progress = tty ? on_chunk : NULL,
                                    .progress_user = &pg};
        compared = true;
        if (o->use_ref || k == M_ORACLE) {
            if (si_eval_perplexity(e->m, rp, e->toks, e->n, &ep, &e->res[k], err, sizeof err) !=
                SI_OK) {
                si_progress_end(&pg);
                return si_cli_error("%s: %s", mode_names[k], err);
            }
        } else if (engine_pass(e, k, rp, &ep, &gate_prof, n_chunks, &gate_share) != 0) {
            return 1;
        }
        if (tty)
            fputs("\r\033[K", stderr);
        /* The pass counts the neurons with a non-zero activation: what the
         * sparse modes compute, but dense computes every neuron. */
        if (k == M_DENSE)
            e->res[k].ffn_computed = 1.0;
    }
    if (!o->want[M_DENSE])
        e->res[M_DENSE] = (struct si_eval_ppl){0};
    return 0;
}

/* The predictors against the truth: a line a layer, all of them, and their
 * size. */
static void print_layers(const struct eval *e)
{
    const struct si_model *m = e->m;
    const int64_t pp = si_eval_predictor_params(m), mp = si_eval_model_params(m);
    printf("layer  width  recall  precision  pred.sparsity  true sparsity\n");
    struct si_eval_confusion all = {0};
    for (int32_t l = 0; l < m->hp.n_layer; l++) {
        const struct si_eval_confusion *c = &e->conf[l];
        all.tp += c->tp;
        all.fp += c->fp;
        all.fn += c->fn;
        all.tn += c->tn;
        printf("%5" PRId32 "  %5" PRId64 "  %6.4f  %9.4f  %13.4f  %13.4f\n", l,
               m->w.layers[l].fc1.ne[1], si_eval_recall(c), si_eval_precision(c),
               si_eval_pred_sparsity(c), si_eval_true_sparsity(c));
    }
    printf("  all         %6.4f  %9.4f  %13.4f  %13.4f\n", si_eval_recall(&all),
           si_eval_precision(&all), si_eval_pred_sparsity(&all), si_eval_true_sparsity(&all));
    printf("predictors: %" PRId64 " parameters, %.2f%% of the model's %" PRId64 " (%.2f MiB, "
           "threshold %g)\n",
           pp, 100.0 * (double)pp / (double)mp, mp, (double)si_eval_predictor_bytes(m) / 1048576.0,
           (double)m->predictor_threshold);
}

/* The report: what was evaluated, the predictors' table and each mode's
 * perplexity. */
static void eval_report(const struct eval *e)
{
    const struct eval_opts *o = e->o;
    const struct si_eval_ppl *res = e->res, *first = &res[0];
    for (int k = M_COUNT - 1; k >= 0; k--)
        first = res[k].n_scored ? &res[k] : first;
    printf("eval: %s on %s, %" PRId64 " tokens, %" PRId64 " chunk%s of %lld (%" PRId64
           " tokens scored)\n",
           o->model, o->file, e->n, first->n_chunks, si_cli_s(first->n_chunks), o->n_ctx,
           first->n_scored);
    if (e->relu)
        printf("active: activation != 0 (ReLU)\n");
    else
        printf("active: %s above the layer's threshold (target sparsity %.3g, %s)\n",
               e->rule == SI_ACTIVE_GATE ? "|act(gate . x)| (CATS)" : "|act(gate . x) * up . x|",
               e->target, o->profile ? o->profile : "stored in the model");
    print_layers(e);
    printf("mode       perplexity            vs dense  FFN neurons computed  seconds\n");
    for (int k = 0; k < M_COUNT; k++) {
        if (res[k].n_scored == 0)
            continue;
        printf("%-9s  %9.4f +/- %7.4f", mode_names[k], res[k].ppl, res[k].ppl_err);
        if (res[0].n_scored > 0)
            printf("  %+7.2f%%", 100.0 * (res[k].ppl / res[0].ppl - 1.0));
        else
            printf("  %8s", "-");
        printf("  %20.4f  %7.1f\n", res[k].ffn_computed, res[k].seconds);
    }
}

/* Everything the evaluation holds. */
static void eval_free(struct eval *e)
{
    si_eval_watch_free(e->watch);
    free(e->zero_counts);
    free(e->conf);
    free(e->stored);
    free(e->toks);
    si_profile_free(e->prof);
    si_tokenizer_free(e->tok);
    si_model_free(e->m);
    free(e->text);
}

int si_cmd_eval(int argc, char **argv)
{
    struct eval_opts o;
    int rc = eval_options(&o, argc, argv);
    if (rc != 0)
        return rc < 0 ? 0 : rc;
    struct eval e = {.o = &o};
    if ((e.text = si_cli_read_text(o.file, &e.len)) == NULL)
        return 1;
    rc = 1;
    if (o.n_input > 0 && (o.profile == NULL || o.modes_given || o.use_ref || o.threshold_given)) {
        si_cli_error("eval: --input-sparsity needs --profile FILE (profile --input-sparsity) "
                     "and runs alone on the engine (no --modes, --threshold, --engine ref)");
        goto out;
    }
    if (si_cli_load_model(o.model, o.predictors, &e.m, &e.tok) != 0)
        goto out;
    if (o.n_input > 0) {
        rc = eval_input_sparsity(&e);
        goto out;
    }
    if (eval_truth(&e) != 0 || eval_tokens(&e) != 0)
        goto out;
    if ((e.conf = calloc((size_t)e.m->hp.n_layer, sizeof *e.conf)) == NULL) {
        si_cli_error("out of memory");
        goto out;
    }
    tty = si_progress_wanted();
    e.bos_tok = si_tokenizer_add_bos(e.tok) ? si_tokenizer_bos(e.tok) : -1;
    if (eval_modes(&e) != 0 || eval_passes(&e) != 0)
        goto out;
    eval_report(&e);
    rc = 0;
out:
    eval_free(&e);
    return rc;
}
