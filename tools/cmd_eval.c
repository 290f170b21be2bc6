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
            si_cli_error("--modes: unknown mode '%.*s' (dense, gate, oracle, predictor)",
                         (int)len, s);
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

int si_cmd_eval(int argc, char **argv)
{
    const char *model = NULL, *file = NULL, *profile = NULL, *v;
    long long n_ctx = 512, max_chunks = -1;
    double threshold = 0;
    bool threshold_given = false, use_ref = false;
    bool want[M_COUNT] = {false}, modes_given = false;
    double input_list[16];
    int n_input = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            eval_usage(stdout);
            return 0;
        } else if (!strcmp(a, "-m") || !strcmp(a, "--model")) {
            if ((model = si_cli_value(argc, argv, &i)) == NULL)
                return 1;
        } else if (!strcmp(a, "-f") || !strcmp(a, "--file")) {
            if ((file = si_cli_value(argc, argv, &i)) == NULL)
                return 1;
        } else if (!strcmp(a, "--profile")) {
            if ((profile = si_cli_value(argc, argv, &i)) == NULL)
                return 1;
        } else if (!strcmp(a, "-c") || !strcmp(a, "--ctx-size")) {
            if ((v = si_cli_value(argc, argv, &i)) == NULL ||
                !si_cli_int(a, v, 16, 1 << 20, &n_ctx))
                return 1;
        } else if (!strcmp(a, "--chunks")) {
            if ((v = si_cli_value(argc, argv, &i)) == NULL ||
                !si_cli_int(a, v, 1, 1 << 30, &max_chunks))
                return 1;
        } else if (!strcmp(a, "--input-sparsity")) {
            if ((v = si_cli_value(argc, argv, &i)) == NULL ||
                !parse_input_list(v, input_list, 16, &n_input))
                return 1;
        } else if (!strcmp(a, "--threshold")) {
            if ((v = si_cli_value(argc, argv, &i)) == NULL ||
                !si_cli_float(a, v, -1e6, 1e6, &threshold))
                return 1;
            threshold_given = true;
        } else if (!strcmp(a, "--engine")) {
            if ((v = si_cli_value(argc, argv, &i)) == NULL || !si_cli_engine_opt(v, &use_ref))
                return 1;
        } else if (!strcmp(a, "--modes")) {
            if ((v = si_cli_value(argc, argv, &i)) == NULL || !parse_modes(v, want))
                return 1;
            modes_given = true;
        } else {
            return si_cli_error("eval: unknown option '%s' (see starinfer eval --help)", a);
        }
    }
    if (model == NULL)
        return si_cli_error("eval: no model given (-m MODEL.gguf)");
    if (file == NULL)
        return si_cli_error("eval: no held-out text given (-f FILE)");

    size_t len;
    char *text = si_cli_read_file(file, &len);
    if (text == NULL)
        return 1;
    /* As llama.cpp's tools read -f files: one trailing newline is dropped. */
    if (len > 0 && text[len - 1] == '\n')
        text[--len] = '\0';
    struct si_model *m = NULL;
    struct si_tokenizer *tok = NULL;
    struct si_profile *prof = NULL;
    struct si_eval_confusion *conf = NULL;
    struct si_eval_watch *watch = NULL;
    int64_t *zero_counts = NULL;
    float *stored = NULL;
    int32_t *toks = NULL;
    int rc = 1;
    char err[600];
    if (n_input > 0 && (profile == NULL || modes_given || use_ref || threshold_given)) {
        si_cli_error("eval: --input-sparsity needs --profile FILE (profile --input-sparsity) "
                     "and runs alone on the engine (no --modes, --threshold, --engine ref)");
        goto out;
    }
    if (si_cli_load_model(model, &m, &tok) != 0)
        goto out;
    const struct si_hparams *hp = &m->hp;
    if (n_input > 0) {
        int64_t nt = 0;
        if (si_profile_read(&prof, profile, m, err, sizeof err) != SI_OK) {
            si_cli_error("%s", err);
            goto out;
        }
        if ((toks = si_cli_tokenize_text(tok, text, len, file, &nt)) == NULL)
            goto out;
        if (nt < n_ctx) {
            si_cli_error("%s: %" PRId64 " tokens, fewer than one chunk of %lld (lower -c)", file,
                         nt, n_ctx);
            goto out;
        }
        tty = si_progress_wanted();
        rc = eval_input(m, model, file, prof, input_list, n_input, toks, nt, n_ctx, max_chunks,
                        si_tokenizer_add_bos(tok) ? si_tokenizer_bos(tok) : -1) != 0;
        goto out;
    }
    if (!m->has_predictor) {
        si_cli_error("%s: the model has no predictors (blk.N.fc1/fc2 tensors; make them with "
                     "starinfer train-predictor)", model);
        goto out;
    }
    if (threshold_given)
        m->predictor_threshold = (float)threshold;
    const bool relu = si_profile_relu_family(m);
    const float *thresholds = NULL;
    double target = 0;
    enum si_active_rule rule = SI_ACTIVE_GATE;
    if (profile != NULL) {
        if (si_profile_read(&prof, profile, m, err, sizeof err) != SI_OK) {
            si_cli_error("%s", err);
            goto out;
        }
        if (!relu && prof->thresholds == NULL) {
            si_cli_error("%s: the profile has no thresholds (make it with starinfer profile "
                         "--target-sparsity)", profile);
            goto out;
        }
        thresholds = prof->thresholds;
        target = prof->target_sparsity;
    } else if (!relu) {
        int r = si_eval_stored_thresholds(m, &rule, &stored, &target, err, sizeof err);
        if (r == SI_E_NOT_FOUND) {
            si_cli_error("%s: a SiLU/GELU model without stored activity thresholds: give "
                         "--profile (made with --target-sparsity)", model);
            goto out;
        }
        if (r != SI_OK) {
            si_cli_error("%s: %s", model, err);
            goto out;
        }
        thresholds = stored;
    }
    const bool bos = si_tokenizer_add_bos(tok);
    int64_t n = 0;
    if ((toks = si_cli_tokenize_text(tok, text, len, file, &n)) == NULL)
        goto out;
    if (n < n_ctx) {
        si_cli_error("%s: %" PRId64 " tokens, fewer than one chunk of %lld (lower -c)", file, n,
                     n_ctx);
        goto out;
    }
    conf = calloc((size_t)hp->n_layer, sizeof *conf);
    if (conf == NULL) {
        si_cli_error("out of memory");
        goto out;
    }
    tty = si_progress_wanted();
    const int32_t bos_tok = bos ? si_tokenizer_bos(tok) : -1;

    /* Gate mode needs CATS thresholds (the gate rule's); the oracle is gate
     * mode for the gate rule and dense for ReLU models. */
    const bool gate_ok = relu || rule == SI_ACTIVE_GATE;
    if (!modes_given) {
        want[M_DENSE] = want[M_PRED] = true;
        want[M_GATE] = gate_ok;
        want[M_ORACLE] = !relu && rule == SI_ACTIVE_OUTPUT;
    } else if (want[M_GATE] && !gate_ok) {
        si_cli_error("--modes gate: the predictors were trained on the output rule; gate mode "
                     "needs CATS thresholds (give --profile)");
        goto out;
    }
    struct si_eval_ppl res[M_COUNT] = {0};
    bool compared = false;
    /* The engine compares the predictors on a dense pass, run when not asked
     * for too (its row then left out). */
    const bool dense_asked = want[M_DENSE];
    if (!use_ref)
        want[M_DENSE] = true;
    int64_t n_chunks = n / n_ctx;
    if (max_chunks > 0 && max_chunks < n_chunks)
        n_chunks = max_chunks;
    /* Gate mode's per-layer thresholds reach the engine through a profile:
     * --profile's, or one holding the stored thresholds and no counts. */
    zero_counts = calloc((size_t)hp->n_layer * (size_t)hp->n_ff, sizeof *zero_counts);
    if (zero_counts == NULL) {
        si_cli_error("out of memory");
        goto out;
    }
    const struct si_profile gate_prof = {.n_layer = hp->n_layer,
                                         .n_ff = hp->n_ff,
                                         .counts = zero_counts,
                                         .thresholds = (float *)thresholds,
                                         .target_sparsity = (float)target};
    double gate_share = 0;
    for (int k = 0; k < M_COUNT; k++) {
        if (!want[k])
            continue;
        struct si_ref_params rp = si_ref_default_params();
        rp.n_ctx = (int32_t)n_ctx;
        if (k == M_GATE && !relu)
            rp.gate_thresholds = thresholds;
        rp.predictor = k == M_PRED;
        /* The predictors are compared with the truth on the first pass run
         * (the dense one unless left out). */
        struct si_progress pg;
        char label[48];
        snprintf(label, sizeof label, "eval %s", mode_names[k]);
        si_progress_begin(&pg, label, 0, "chunks", 1);
        struct si_eval_params ep = {.max_chunks = max_chunks,
                                    .bos = bos_tok,
                                    .rule = rule,
                                    .thresholds = thresholds,
                                    .conf = compared ? NULL : conf,
                                    .oracle = k == M_ORACLE,
                                    .progress = tty ? on_chunk : NULL,
                                    .progress_user = &pg};
        compared = true;
        if (use_ref || k == M_ORACLE) {
            if (si_eval_perplexity(m, rp, toks, n, &ep, &res[k], err, sizeof err) != SI_OK) {
                si_progress_end(&pg);
                si_cli_error("%s: %s", mode_names[k], err);
                goto out;
            }
        } else {
            struct si_engine_params eng = si_engine_default_params();
            eng.ref = rp;
            eng.ref.gate_thresholds = NULL;
            eng.ref.predictor = false;
            eng.mode = k == M_DENSE  ? SI_SPARSITY_DENSE
                       : k == M_GATE ? SI_SPARSITY_GATE
                                     : SI_SPARSITY_PREDICTOR;
            eng.n_batch = k == M_PRED ? 1 : 128; /* predictors pick per token, as decoding */
            if (k == M_GATE && !relu)
                eng.profile = prof != NULL ? prof : &gate_prof;
            if (k == M_DENSE &&
                si_eval_watch_init(&watch, m, &ep, eng.ref.act_quant, err, sizeof err) != SI_OK) {
                si_progress_end(&pg);
                si_cli_error("%s", err);
                goto out;
            }
            const struct si_cli_ppl o = {.observe = k == M_DENSE ? si_eval_watch_hook : NULL,
                                         .observe_user = watch,
                                         .progress = ep.progress,
                                         .progress_user = &pg};
            if (si_cli_engine_perplexity(m, eng, toks, n_chunks, bos_tok, &o, &res[k]) != 0) {
                si_progress_end(&pg);
                goto out;
            }
            if (k == M_DENSE)
                gate_share = si_eval_watch_active_share(watch);
            if (k == M_GATE) /* counted on the dense pass (the batches do not count) */
                res[k].ffn_computed = gate_share;
        }
        if (tty)
            fputs("\r\033[K", stderr);
        /* The pass counts the neurons with a non-zero activation: what the
         * sparse modes compute, but dense computes every neuron. */
        if (k == M_DENSE)
            res[k].ffn_computed = 1.0;
    }
    if (!dense_asked)
        res[M_DENSE] = (struct si_eval_ppl){0};

    const int64_t pp = si_eval_predictor_params(m), mp = si_eval_model_params(m);
    const struct si_eval_ppl *first = &res[0];
    for (int k = M_COUNT - 1; k >= 0; k--)
        first = res[k].n_scored ? &res[k] : first;
    printf("eval: %s on %s, %" PRId64 " tokens, %" PRId64 " chunk%s of %lld (%" PRId64
           " tokens scored)\n",
           model, file, n, first->n_chunks, si_cli_s(first->n_chunks), n_ctx, first->n_scored);
    if (relu)
        printf("active: activation != 0 (ReLU)\n");
    else
        printf("active: %s above the layer's threshold (target sparsity %.3g, %s)\n",
               rule == SI_ACTIVE_GATE ? "|act(gate . x)| (CATS)" : "|act(gate . x) * up . x|",
               target, profile ? profile : "stored in the model");
    printf("layer  width  recall  precision  pred.sparsity  true sparsity\n");
    struct si_eval_confusion all = {0};
    for (int32_t l = 0; l < hp->n_layer; l++) {
        const struct si_eval_confusion *c = &conf[l];
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
    rc = 0;
out:
    si_eval_watch_free(watch);
    free(zero_counts);
    free(conf);
    free(stored);
    free(toks);
    si_profile_free(prof);
    si_tokenizer_free(tok);
    si_model_free(m);
    free(text);
    return rc;
}
