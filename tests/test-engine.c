/*
 * test-engine.c - the StarPU task-graph engine against the reference forward
 * pass: logits (max relative error) and 64 greedy tokens, in `dense` and
 * `gate` modes, on synthetic ReLU models (llama-relu, bamboo, opt; F32, F16
 * and Q4_0) and, with STARINFER_TEST_MODEL, on SmolLM2 in dense mode.
 * tests/test-engine.sh runs it under several schedulers and CPU counts.
 * This file holds the comparison (compare) and main; the synthetic and
 * hand-built models' configurations are test-engine-cases.c's.
 */
#include "graph/engine.h"
#include "graph/runtime.h"
#include "model/forward.h"
#include "model/model.h"
#include "model/pack8.h"
#include "model/quants.h"
#include "model/synth.h"
#include "model/types.h"
#include "predict/profile.h"
#include "starinfer.h"
#include "engine-test.h"
#include "test.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define N_GREEDY 64

int test_failures, test_checks; /* test.h's, for test-engine-cases.c too */

static int32_t argmax(const float *x, int32_t n)
{
    int32_t best = 0;
    for (int32_t i = 1; i < n; i++)
        if (x[i] > x[best])
            best = i;
    return best;
}

/* Expected activity for the placement: the reference's activation counts
 * over a few tokens (what `starinfer profile` collects over a corpus). */
static struct si_profile *profile_of(const struct si_model *m)
{
    const struct si_hparams *hp = &m->hp;
    struct si_profile *pr = calloc(1, sizeof *pr);
    int64_t *counts = calloc((size_t)hp->n_layer * (size_t)hp->n_ff, sizeof *counts);
    struct si_ref *r = NULL;
    char err[256];
    if (pr == NULL || counts == NULL ||
        si_ref_init(&r, m, si_ref_default_params(), err, sizeof err) != SI_OK) {
        free(pr);
        free(counts);
        return NULL;
    }
    r->neuron_counts = counts;
    for (int32_t t = 0; t < 40; t++)
        si_ref_eval(r, (t * 37 + 5) % hp->n_vocab);
    si_ref_free(r);
    *pr = (struct si_profile){.n_layer = hp->n_layer, .n_ff = hp->n_ff, .n_tokens = 40,
                              .counts = counts};
    return pr;
}

static void profile_free(struct si_profile *pr)
{
    if (pr != NULL) {
        free(pr->counts);
        free(pr->thresholds);
    }
    free(pr);
}

/* The placement: the neuron table is a permutation, every hot neuron is at
 * least as active as every cold one, the slices tile the layer. */
static void check_placement(const char *what, const struct si_engine *e, const struct si_model *m,
                            const struct si_profile *pr)
{
    const int64_t ff = m->hp.n_ff;
    uint8_t *seen = calloc((size_t)ff, 1);
    if (seen == NULL)
        return;
    for (int l = 0; l < m->hp.n_layer; l++) {
        memset(seen, 0, (size_t)ff);
        int bad = 0;
        for (int64_t p = 0; p < ff; p++) {
            int32_t id = si_engine_neuron_id(e, l, p);
            if (id < 0 || id >= ff || seen[id]++)
                bad++;
        }
        CHECK(bad == 0, "%s: layer %d: the neuron table is not a permutation", what, l);
        const int64_t nh = si_engine_n_hot(e, l);
        int64_t min_hot = INT64_MAX, max_cold = -1;
        for (int64_t p = 0; p < ff && pr != NULL; p++) {
            int64_t c = pr->counts[(size_t)l * ff + si_engine_neuron_id(e, l, p)];
            if (p < nh)
                min_hot = c < min_hot ? c : min_hot;
            else
                max_cold = c > max_cold ? c : max_cold;
        }
        if (nh > 0 && nh < ff)
            CHECK(min_hot >= max_cold, "%s: layer %d: a cold neuron (%lld) is hotter than a hot "
                  "one (%lld)", what, l, (long long)max_cold, (long long)min_hot);
        int64_t b, end, prev = 0;
        si_engine_slice_range(e, l, 0, &b, &end);
        CHECK(end - b == nh, "%s: layer %d: hot slice of %lld, %lld hot", what, l,
              (long long)(end - b), (long long)nh);
        prev = end;
        for (int32_t j = 1; j <= si_engine_n_slices(e); j++) {
            si_engine_slice_range(e, l, j, &b, &end);
            CHECK(b == prev && end >= b, "%s: layer %d: slice %d is [%lld, %lld) after %lld",
                  what, l, j, (long long)b, (long long)end, (long long)prev);
            prev = end;
        }
        CHECK(prev == ff, "%s: layer %d: slices end at %lld of %lld", what, l, (long long)prev,
              (long long)ff);
    }
    free(seen);
}

/* The reference's logit of token a above token b's, relative to the
 * largest logit. */
static double logit_gap(const float *logits, int32_t n, int32_t a, int32_t b)
{
    double scale = 0;
    for (int32_t t = 0; t < n; t++)
        scale = fmax(scale, fabs((double)logits[t]));
    return scale > 0 ? ((double)logits[a] - logits[b]) / scale : 0;
}

/* The K and V of positions [0, np) in every layer of a's cache against b's:
 * the largest |a - b| relative to the largest |b| of its layer and kind. */
static double kv_rel_err(const struct si_model *m, const struct si_ref *a, const struct si_ref *b,
                         int np)
{
    const size_t kvd = (size_t)m->hp.n_head_kv * (size_t)m->hp.head_dim;
    const size_t layer = (size_t)b->p.n_ctx * kvd, n = (size_t)np * kvd;
    double worst = 0;
    for (int l = 0; l < m->hp.n_layer; l++)
        for (int kind = 0; kind < 2; kind++) {
            const void *ca = kind ? a->vcache : a->kcache, *cb = kind ? b->vcache : b->kcache;
            double err = 0, scale = 0;
            for (size_t i = (size_t)l * layer; i < (size_t)l * layer + n; i++) {
                const double x = b->p.kv_f16 ? si_fp16_to_fp32(((const uint16_t *)ca)[i])
                                             : ((const float *)ca)[i],
                             y = b->p.kv_f16 ? si_fp16_to_fp32(((const uint16_t *)cb)[i])
                                             : ((const float *)cb)[i];
                err = fmax(err, fabs(x - y));
                scale = fmax(scale, fabs(y));
            }
            worst = fmax(worst, scale > 0 ? err / scale : err);
        }
    return worst;
}

/*
 * What converting the matrix products' inputs does on m and this prompt:
 * the logits (*logits) and cached K and V (*kv) of the reference r (which
 * converts them) against a reference with float inputs, relative as
 * rel_err and kv_rel_err (compare's tolerance for prompts).
 */
static void conversion_effect(const struct si_model *m, struct si_ref_params rp,
                              const int32_t *prompt, int np, const struct si_ref *r,
                              double *logits, double *kv)
{
    rp.act_quant = false;
    rp.predictor = false; /* as the prompt: every neuron that fires */
    struct si_ref *f = NULL;
    char err[256];
    int rc = si_ref_init(&f, m, rp, err, sizeof err);
    for (int i = 0; i < np && rc == SI_OK; i++)
        rc = si_ref_eval(f, prompt[i]);
    CHECK(rc == SI_OK, "the reference with float inputs: %s", si_status_str(rc));
    if (rc == SI_OK) {
        *logits = test_rel_err(f->logits, r->logits, m->hp.n_vocab);
        *kv = kv_rel_err(m, f, r, np);
    }
    si_ref_free(f);
}

/* dst's KV cache becomes src's (the same model and context length). */
static void copy_kv(const struct si_model *m, struct si_ref *dst, const struct si_ref *src)
{
    const size_t bytes = (size_t)m->hp.n_layer * (size_t)dst->p.n_ctx *
                         (size_t)m->hp.n_head_kv * (size_t)m->hp.head_dim *
                         (dst->p.kv_f16 ? 2 : 4);
    memcpy(dst->kcache, src->kcache, bytes);
    memcpy(dst->vcache, src->vcache, bytes);
}

/* SI_TEST_ENGINE_QUICK=1 (see main). */
bool quick_run(void)
{
    const char *q = getenv("SI_TEST_ENGINE_QUICK");
    return q != NULL && !strcmp(q, "1");
}

/* The prompt's arithmetic in a label (enum prefill). */
static const char *const pf_name[] = {"", " prefill", " prefill-float", " prefill-int8",
                                      " prefill-blas"};

/* The engine's parameters for configuration cf on m into *ep (no profile
 * yet); false where this run skips the configuration, said in a line. */
static bool config_params(const char *what, const struct si_model *m, struct config cf,
                          struct si_engine_params *ep)
{
    if (cf.twin && quick_run())
        return false; /* the GPU forms' CPU twins: in the full runs only */
    if (cf.gpu && si_runtime_ncuda() == 0) {
        printf("%s %s +hot-gpu: skipped, no CUDA worker\n", what, si_sparsity_name(cf.mode));
        return false;
    }
    *ep = si_engine_default_params();
    ep->ref.n_ctx = 96;
    /* Float weights: plain float dots.  llama.cpp's conversion of the input
     * to F16 would turn the tiny differences of summation order upstream
     * into whole F16 steps, and the comparison would measure those. */
    const uint32_t wt = m->w.layers[0].ffn_up.type;
    ep->ref.act_quant = !(wt == SI_TYPE_F32 || wt == SI_TYPE_F16);
    if ((cf.prefill == PF_INT8 || cf.prefill == PF_BLAS) && !ep->ref.act_quant) {
        printf("%s %s%s: skipped, float weights: the float prefill's (prefill-float)\n", what,
               si_sparsity_name(cf.mode), pf_name[cf.prefill]);
        return false;
    }
    if (cf.prefill == PF_INT8 && si_gemm8_missing() != NULL) {
        printf("%s %s prefill-int8: skipped, %s\n", what, si_sparsity_name(cf.mode),
               si_gemm8_missing());
        return false;
    }
    if (cf.prefill != PF_NONE) {
        ep->n_batch = 8;
        ep->prefill = cf.prefill == PF_EXACT  ? SI_PREFILL_EXACT
                      : cf.prefill == PF_INT8 ? SI_PREFILL_INT8
                      : cf.prefill == PF_BLAS ? SI_PREFILL_BLAS
                                              : SI_PREFILL_AUTO;
    }
    /* Float activations everywhere, the reference's too (with llama.cpp's
     * Q8 conversion the two differ by 2-5% of the logits on SmolLM2, that
     * conversion's own effect). */
    if (cf.prefill == PF_FLOAT)
        ep->ref.act_quant = false;
    ep->mode = cf.mode;
    ep->n_slices = cf.n_slices;
    ep->redux = cf.redux;
    ep->attn_split = cf.attn;
    ep->attn_gpu = cf.attn_gpu;
    ep->gpu_twin = cf.twin;
    return true;
}

/* The profile configuration cf asks for (a hot slice, per-layer
 * thresholds), made ep's; NULL where it asks for none or it failed (checked). */
static struct si_profile *config_profile(const char *what, const struct si_model *m,
                                         struct config cf, struct si_engine_params *ep)
{
    struct si_profile *pr = NULL;
    if (cf.hot || cf.cats) {
        pr = profile_of(m);
        CHECK(pr != NULL, "%s: profile", what);
        ep->profile = pr;
    }
    if (cf.cats && pr != NULL) {
        /* Any per-layer values: the engine must take the profile's, the
         * reference gets the same through gate_thresholds.  Not round ones:
         * an activation within an ulp or two of a threshold goes either way
         * under the slices' reordered sums, and with 0.05 (l + 1) one of
         * this run's does (a 8e-4 jump in the logits). */
        pr->thresholds = malloc((size_t)m->hp.n_layer * sizeof(float));
        CHECK(pr->thresholds != NULL, "thresholds");
        for (int l = 0; pr->thresholds != NULL && l < m->hp.n_layer; l++)
            pr->thresholds[l] = CATS_STEP * (float)(l + 1);
    }
    return pr;
}

/* A hot slice's parameters in ep: on a CPU worker or the GPU, and the
 * budget (of the FFN's weights and the attention configuration cf asks for). */
static void hot_params(const struct si_model *m, struct config cf, struct si_engine_params *ep)
{
    ep->hot_on_cpu = !cf.gpu;
    /* About a third of the FFN weights, plus the GPU's buffers and the
     * chunk of StarPU's allocator they share (the engine's reserve). */
    const struct si_hparams *hp = &m->hp;
    const struct si_layer *W = &m->w.layers[0];
    int64_t ffn = (int64_t)(W->ffn_up.nbytes + W->ffn_down.nbytes +
                            (W->ffn_gate.data != NULL ? W->ffn_gate.nbytes : 0));
    ep->vram_budget = ((int64_t)32 << 20) + hp->n_layer * ffn / 3 +
                      4 * (hp->n_embd + 2 * (int64_t)hp->n_ff) +
                      4 * (int64_t)hp->n_layer * hp->n_embd * hp->n_ff / 16 +
                      /* a prefill batch's FFN input and hot output */
                      2 * 4 * (int64_t)(ep->n_batch > 0 ? ep->n_batch : 128) * hp->n_embd;
    /* and the attention asked for: weights, fp16 caches, vectors */
    for (int l = 0; l < cf.attn_gpu && l < hp->n_layer; l++) {
        const struct si_layer *A = &m->w.layers[l];
        ep->vram_budget +=
            (int64_t)(A->wq.nbytes + A->wk.nbytes + A->wv.nbytes + A->wo.nbytes) +
            4 * (int64_t)ep->ref.n_ctx * hp->n_head_kv * hp->head_dim +
            /* StarPU's 16 KiB blocks: a part of each handle */
            ((int64_t)16 << 10) * (8 + 2 * hp->n_head_kv + (int64_t)si_runtime_ncpu());
    }
    if (cf.attn_gpu > 0) /* x, the scratch */
        ep->vram_budget += (int64_t)64 << 10;
}

/* The configuration's line label: what, the mode and each option. */
static void config_label(char *label, size_t size, const char *what, struct config cf)
{
    char attn_gpu[24] = "";
    if (cf.attn_gpu != 0)
        snprintf(attn_gpu, sizeof attn_gpu, " attn-gpu %d%s", cf.attn_gpu, cf.twin ? " twin" : "");
    snprintf(label, size, "%s %s%s%s%s%s%s%s", what, si_sparsity_name(cf.mode),
             cf.hot ? (cf.gpu ? " +hot-gpu" : " +hot") : "", cf.redux ? " redux" : "",
             pf_name[cf.prefill],
             cf.attn > 1    ? " attn-split"
             : cf.attn == 1 ? " attn-whole"
                            : "",
             cf.cats ? " cats" : "", attn_gpu);
}

/* Whether the engine has no CUDA attention for m (check_refused). */
static bool no_cuda_attention(const struct si_model *m)
{
    /* The CUDA attention has no falcon (parallel residual) or gemma3 (QK
     * and post norms) path: asked for by number, it is refused in a line. */
    bool no_cuda_attn = m->hp.arch == SI_ARCH_FALCON || m->hp.arch == SI_ARCH_GEMMA3;
    for (int l = 0; l < m->hp.n_layer; l++) { /* nor for the types without a CUDA matvec */
        const struct si_layer *A = &m->w.layers[l];
        const uint32_t t[4] = {A->wq.type, A->wk.type, A->wv.type, A->wo.type};
        for (int i = 0; i < 4; i++)
            no_cuda_attn |= t[i] == SI_TYPE_BF16 || t[i] == SI_TYPE_Q5_0 || t[i] == SI_TYPE_Q5_1;
    }
    return no_cuda_attn;
}

/* The engine's refusal (rc, err) of the attention on the GPU on a model
 * without a CUDA path for it: the line names why. */
static void check_refused(const char *label, const struct si_model *m, struct config cf, int rc,
                          const char *err)
{
    /* With the hot slice on a real GPU the layout refuses first when the
     * FFN's types have no CUDA kernels either (BF16, Q5_0, Q5_1 are
     * missing from both): that line names the FFN's types. */
    const uint32_t ft = m->w.layers[0].ffn_up.type;
    const bool no_cuda_ffn = ft == SI_TYPE_BF16 || ft == SI_TYPE_Q5_0 || ft == SI_TYPE_Q5_1;
    const char *why = cf.gpu && no_cuda_ffn ? "no CUDA FFN kernels" : "attention on the GPU";
    CHECK(rc == SI_E_UNSUPPORTED && strstr(err, why) != NULL,
          "%s: not refused with \"%s\" (%d: %s)", label, why, rc, err);
    printf("%-46s refused: %s\n", label, err);
}

/* A hot slice's placement: some neurons hot, not all, the attention
 * layers asked for on the GPU, all within ep's budget. */
static void check_hot(const char *label, const struct si_engine *e, const struct si_model *m,
                      struct config cf, const struct si_engine_params *ep)
{
    /* The budget holds some neurons, not all. */
    int64_t hot = 0;
    for (int l = 0; l < m->hp.n_layer; l++)
        hot += si_engine_n_hot(e, l);
    /* (with attention asked for, the budget is its bytes rounded to
     * StarPU's blocks on top: on the tiny models that may hold all) */
    CHECK(hot > 0 && (hot < (int64_t)m->hp.n_layer * m->hp.n_ff || cf.attn_gpu > 0),
          "%s: %lld hot neurons of %lld", label, (long long)hot,
          (long long)m->hp.n_layer * m->hp.n_ff);
    CHECK(si_engine_hot_bytes(e) <= ep->vram_budget, "%s: %lld hot bytes over the budget", label,
          (long long)si_engine_hot_bytes(e));
    /* The attention layers asked for, within the budget with the rest. */
    const struct si_engine_stats s0 = si_engine_get_stats(e);
    const int32_t want = cf.attn_gpu < 0 ? 0 : cf.attn_gpu;
    if (cf.attn_gpu != 0)
        CHECK(s0.attn_gpu_layers == want, "%s: %d layers' attention on the GPU, not %d", label,
              s0.attn_gpu_layers, want);
    CHECK(s0.gpu_accounted <= ep->vram_budget, "%s: %lld GPU bytes over the budget of %lld", label,
          (long long)s0.gpu_accounted, (long long)ep->vram_budget);
}

/* One comparison under way (compare): the engine and the reference, the
 * prompt, and what the stages measure. */
struct run {
    const char *label;
    const struct si_model *m;
    struct config cf;
    const struct si_engine_params *ep; /* the engine's */
    struct si_ref_params rp;           /* the reference's */
    struct si_engine *e;
    struct si_ref *r;
    int32_t prompt[21];
    int np;
    int32_t te, tr; /* the engine's and the reference's last greedy tokens */
    double worst;   /* the logits' largest relative error */
    /* the prompt's (not the reference's arithmetic): logits, cached K and
     * V, a near tie's gap, and what converting the inputs does */
    double prompt_err, kv_err, prompt_tie_gap, conv_err, conv_kv;
    double tie_gap; /* the reference's gap where the greedy tokens part */
    int same;       /* greedy tokens equal */
    int tie_at;     /* the step where they part on a near tie, or -1 */
};

/* The prompt through si_engine_eval_batch and the reference token by token
 * (configurations with a prefill): its logits, K and V and first greedy
 * token against the reference's. */
static void run_prompt(struct run *u)
{
    const int32_t nv = u->m->hp.n_vocab;
    const char *label = u->label;
    struct si_ref *r = u->r;
    CHECK(si_engine_eval_batch(u->e, u->prompt, u->np) == SI_OK, "%s: engine prefill", label);
    /* Predictor mode's prefill computes every neuron that fires (those
     * its ReLU gate passes; every neuron for other activations): the
     * predictor decides from the first decoded token on. */
    const bool pred = r->p.predictor, aq = r->p.act_quant;
    r->p.predictor = false;
    for (int i = 0; i < u->np; i++) {
        /* blas: float inputs in the batches of 8; the last one, of 5
         * tokens, is under the engine's least batch for sgemm
         * (SI__BLAS_MIN_BATCH, 8) and takes the reference's dots */
        r->p.act_quant = aq && !(u->cf.prefill == PF_BLAS && i < u->np / 8 * 8);
        CHECK(si_ref_eval(r, u->prompt[i]) == SI_OK, "%s: reference eval at %d", label, i);
    }
    r->p.predictor = pred;
    r->p.act_quant = aq;
    u->prompt_err = test_rel_err(si_engine_logits(u->e), r->logits, nv);
    u->te = argmax(si_engine_logits(u->e), nv);
    u->tr = argmax(r->logits, nv);
    if (u->cf.prefill != PF_EXACT) {
        /* The prompt's own results, its last logits and the K and V
         * it cached, are checked against the reference's below; then
         * the reference takes the engine's cache and both decode from
         * the same state, as checked as decoding without a prompt.  (A
         * cache written at the wrong place shows in the first check;
         * decoding does not carry the prompt's rounding, which every
         * later token reads again, into 64 tokens of differences.) */
        CHECK(si_engine_sync_kv(u->e) == SI_OK, "%s: the engine's KV cache", label);
        u->kv_err = kv_rel_err(u->m, si_engine_ref(u->e), r, u->np);
        if (u->ep->ref.act_quant) /* the tolerance's scale (see conversion_effect) */
            conversion_effect(u->m, u->rp, u->prompt, u->np, r, &u->conv_err, &u->conv_kv);
        copy_kv(u->m, r, si_engine_ref(u->e));
        if (u->te != u->tr) { /* a near tie (checked below): go on with the reference's */
            u->prompt_tie_gap = logit_gap(r->logits, nv, u->tr, u->te);
            u->te = u->tr;
        }
    } else {
        u->worst = u->prompt_err;
    }
    u->same += u->te == u->tr;
}

/* Greedy decoding (after the prompt, token by token without a prefill)
 * side by side, the logits compared at every step, up to a near tie. */
static void run_greedy(struct run *u)
{
    /* Where the engine's logits may differ from the reference's (the
     * tolerances below: the GPU's float activations, or slices' sums
     * reordered and then converted to Q8 in the sparse modes), a near tie
     * of the reference's two best tokens may go the other way.  That ends
     * the comparison (the two would decode different texts from there),
     * and the check below holds the reference's gap between the two to
     * the logits' tolerance: a tie wider than that fails, and where the
     * tolerance is 0 (the same bits) no tie is accepted. */
    const int32_t nv = u->m->hp.n_vocab;
    const int np = u->np;
    for (int i = u->cf.prefill ? np + 1 : 0; i < np + N_GREEDY; i++) {
        int32_t in_e = i < np ? u->prompt[i] : u->te, in_r = i < np ? u->prompt[i] : u->tr;
        CHECK(si_engine_eval(u->e, in_e) == SI_OK, "%s: engine eval at %d", u->label, i);
        CHECK(si_ref_eval(u->r, in_r) == SI_OK, "%s: reference eval at %d", u->label, i);
        if (in_e == in_r)
            u->worst = fmax(u->worst, test_rel_err(si_engine_logits(u->e), u->r->logits, nv));
        u->te = argmax(si_engine_logits(u->e), nv);
        u->tr = argmax(u->r->logits, nv);
        if (i >= np && u->te != u->tr && in_e == in_r) {
            u->tie_at = i - np;
            u->tie_gap = logit_gap(u->r->logits, nv, u->tr, u->te);
            break;
        }
        if (i >= np)
            u->same += u->te == u->tr;
    }
}

/* The run's lines: the attention on the GPU, the logits' error, greedy
 * tokens and neurons computed, a near tie. */
static void report(const struct run *u, const struct si_engine_stats *st)
{
    const int64_t active = st->neurons_hot + st->neurons_cold;
    if (st->attn_gpu_layers > 0)
        printf("%-46s the attention of %d layer(s) on the GPU%s\n", u->label, st->attn_gpu_layers,
               u->cf.gpu ? "" : " (run by a CPU worker)");
    printf("%-46s %2d slices, logits max rel err %.2e, %d/%d greedy equal, %4.1f%% of neurons "
           "computed (%4.1f%% of them hot), %lld tasks\n",
           u->label, si_engine_n_slices(u->e), u->worst, u->same, N_GREEDY,
           100.0 * (double)active / (double)st->neurons_total,
           active > 0 ? 100.0 * (double)st->neurons_hot / (double)active : 0.0,
           (long long)st->tasks);
    if (u->tie_at >= 0)
        printf("%-46s greedy tokens part at step %d on a near tie (reference's gap %.2e of the "
               "largest logit)\n",
               u->label, u->tie_at, u->tie_gap);
}

/* The logits' tolerance tol raised where configuration cf's arithmetic
 * differs from the reference's. */
static double decode_tolerance(struct config cf, const struct si_engine_params *ep,
                               const struct si_engine_stats *st, bool wo_fused, double tol)
{
    /* Quantized weights in the sparse modes: the partial sums are added in
     * another order than the reference's, and llama.cpp's conversion of
     * every layer's input to Q8 turns those last-bit differences into whole
     * quantization steps now and then; the greedy tokens agree but for a near
     * tie (above).  Where the attention groups multiply Wo in partial
     * products too (wo_fused), a layer has two such reordered sums ahead of
     * its conversions (the attention's output, then the FFN's), so twice the
     * bound. */
    const double reordered = wo_fused ? 2e-2 : 1e-2;
    if (ep->ref.act_quant && cf.mode != SI_SPARSITY_DENSE && tol > 0 && tol < reordered)
        tol = reordered; /* (tol 0 asks for the same bits: one slice, the reference's order) */
    /* Thresholds: a neuron whose |act(gate)| is within an ulp or two of its
     * layer's threshold goes either way once the slices have reordered the
     * previous layers' sums, a jump of its whole contribution (tiny gemma3
     * with a hot slice: 2.2e-4). */
    if (cf.cats && tol > 0 && tol < 1e-3)
        tol = 1e-3;
    /* The GPU's hot slice dots float activations where the CPU converts
     * them (act_quant) for quantized weights. */
    if ((cf.gpu || cf.twin) && ep->ref.act_quant && tol < 5e-2)
        tol = 5e-2;
    /* With the attention's products in float too, the FFN's input moves by
     * more, and in the sparse modes a neuron near the predictor's (or the
     * gate's) threshold goes the other way with its whole contribution:
     * 5.25e-2 measured (llama-relu Q8_0, predictor, 2 layers' attention). */
    if ((cf.gpu || cf.twin) && ep->ref.act_quant && st->attn_gpu_layers > 0 &&
        cf.mode != SI_SPARSITY_DENSE && tol < 8e-2)
        tol = 8e-2;
    return tol;
}

/* The prompt's logits and K and V (a prefill in another arithmetic than
 * the reference's) within what its rounding can do. */
static void check_prompt(const struct run *u)
{
    /* The prompt in another arithmetic than the reference's (int8:
     * the same converted inputs, sums in another order; blas and
     * float: float inputs, sgemm's order), checked by what its
     * rounding can do:
     * - without conversions (float activations on both sides), only
     *   the order of the sums differs, by far less than half an fp16
     *   step (2^-11 of a value): each cached K and V lands on the
     *   reference's fp16 value or the next one (2^-10 of the layer's
     *   largest at most), and the deeper layers' inputs carry those
     *   steps through the attention once more: 2^-9, the logits too;
     * - with inputs converted to Q8 (Q8_1, Q8_K) in the products the
     *   prompt shares with the reference (int8's all, the last batch
     *   of blas's, under the least batch for sgemm), a last-bit
     *   difference rounds an element one step (1/127 of its block's
     *   largest) the other way now and then, and from there every
     *   later conversion rounds values that differ by more than
     *   last bits: the two prompts end up rounded independently of
     *   each other, whose difference is about sqrt(2) times what one
     *   rounding does.  What one does on this model and prompt is
     *   measured: the reference as it computed the prompt (inputs
     *   converted where the engine's were) against the reference with
     *   float ones throughout (conv_err, conv_kv).  The bound
     *   is twice that (sqrt(2) and the spread of a maximum over
     *   every logit or cached value); a misplaced cache row or a
     *   wrong position differs by the values themselves. */
    const double floor = 1.0 / 512, ptol = fmax(floor, 2 * u->conv_err),
                 kvtol = fmax(floor, 2 * u->conv_kv);
    printf("%-46s the prompt: logits max rel err %.2e, K and V %.2e (the conversion's own "
           "%.2e, %.2e)\n",
           u->label, u->prompt_err, u->kv_err, u->conv_err, u->conv_kv);
    CHECK(u->prompt_err <= ptol && u->prompt_tie_gap <= ptol,
          "%s: the prompt's logits differ by %.3g, a tie's gap %.3g (tolerance %.2g)", u->label,
          u->prompt_err, u->prompt_tie_gap, ptol);
    CHECK(u->kv_err <= kvtol, "%s: the prompt's K and V differ by %.3g (tolerance %.2g)", u->label,
          u->kv_err, kvtol);
}

/* After decoding: the thresholds the engine took, the neurons it computed,
 * a token outside the vocabulary refused, a token after reset. */
static void check_engine_after(const struct run *u, const struct si_engine_stats *st)
{
    const char *label = u->label;
    struct si_engine *e = u->e;
    const int64_t active = st->neurons_hot + st->neurons_cold;
    if (u->cf.cats && e != NULL)
        for (int l = 0; l < u->m->hp.n_layer; l++)
            CHECK(si_engine_gate_threshold(e, l) == CATS_STEP * (float)(l + 1),
                  "%s: layer %d threshold %g", label, l, si_engine_gate_threshold(e, l));
    /* (the GPU's hot slices are counted whole: it does not count its active
     * neurons, nor does its CPU twin) */
    if (u->cf.mode == SI_SPARSITY_GATE && u->m->hp.act == SI_ACT_RELU && !u->cf.gpu && !u->cf.twin)
        CHECK(active < st->neurons_total / 2, "%s: gate mode computed %lld of %lld", label,
              (long long)active, (long long)st->neurons_total);
    if (u->cf.cats)
        CHECK(active < st->neurons_total, "%s: the thresholds skipped nothing", label);
    if (u->cf.hot)
        CHECK(st->neurons_hot > 0, "%s: no neuron computed in the hot slice", label);
    /* A token outside the vocabulary is refused without running anything. */
    CHECK(si_engine_eval(e, u->m->hp.n_vocab) == SI_E_INVALID, "%s: bad token accepted", label);
    si_engine_reset(e);
    CHECK(si_engine_eval(e, 1) == SI_OK, "%s: eval after reset", label);
}

/*
 * Prompt, then greedy decoding for N_GREEDY tokens with the engine and the
 * reference side by side (each on its own tokens), comparing logits at every
 * step.  The reference computes what the mode asks for: down_t rows,
 * predictor selection (see si_ref_params).
 */
void compare(const char *what, const struct si_model *m, struct config cf, double tol)
{
    struct si_engine_params ep;
    if (!config_params(what, m, cf, &ep))
        return;
    char err[512], label[160];
    struct si_profile *pr = config_profile(what, m, cf, &ep);
    if (cf.hot && pr != NULL)
        hot_params(m, cf, &ep);
    config_label(label, sizeof label, what, cf);
    struct si_ref_params rp = ep.ref;
    rp.down_t = cf.mode != SI_SPARSITY_DENSE && m->w.layers[0].ffn_down_t.data != NULL;
    rp.predictor = cf.mode == SI_SPARSITY_PREDICTOR;
    if (cf.cats && pr != NULL)
        rp.gate_thresholds = pr->thresholds;
    struct si_engine *e = NULL;
    int rc = si_engine_init(&e, m, ep, err, sizeof err);
    if (cf.attn_gpu > 0 && no_cuda_attention(m)) {
        check_refused(label, m, cf, rc, err);
        si_engine_free(e);
        profile_free(pr);
        return;
    }
    CHECK(rc == SI_OK, "%s: engine: %s", label, err);
    struct si_ref *r = NULL;
    rc = si_ref_init(&r, m, rp, err, sizeof err);
    CHECK(rc == SI_OK, "%s: reference: %s", label, err);
    if (e == NULL || r == NULL) {
        si_engine_free(e);
        si_ref_free(r);
        profile_free(pr);
        return;
    }
    if (cf.hot)
        check_hot(label, e, m, cf, &ep);
    check_placement(label, e, m, cf.mode == SI_SPARSITY_DENSE ? NULL : pr);
    struct run u = {.label = label,
                    .m = m,
                    .cf = cf,
                    .ep = &ep,
                    .rp = rp,
                    .e = e,
                    .r = r,
                    .np = cf.prefill ? 21 : 5, /* prefill: batches of 8, 8 and 5 */
                    .tie_at = -1};
    for (int i = 0; i < u.np; i++)
        u.prompt[i] = i == 0 ? 1 : (int32_t)((i * 53 + 17) % m->hp.n_vocab);
    if (cf.prefill)
        run_prompt(&u);
    run_greedy(&u);
    struct si_engine_stats st = si_engine_get_stats(e);
    report(&u, &st);
    tol = decode_tolerance(cf, &ep, &st, si_engine_wo_fused(e), tol);
    CHECK(u.worst <= tol, "%s: logits differ by %.3g (tolerance %.1g)", label, u.worst, tol);
    if (cf.prefill != PF_NONE && cf.prefill != PF_EXACT)
        check_prompt(&u);
    if (u.tie_at >= 0)
        CHECK(u.same == u.tie_at && u.tie_gap <= tol,
              "%s: greedy tokens part at step %d, gap %.3g (tolerance %.1g)", label, u.tie_at,
              u.tie_gap, tol);
    else
        CHECK(u.same == N_GREEDY, "%s: %d of %d greedy tokens equal", label, u.same, N_GREEDY);
    check_engine_after(&u, &st);
    si_engine_free(e);
    si_ref_free(r);
    profile_free(pr);
}

/* The synthetic model p, written to a temporary file (its name into path,
 * at least 32 bytes) and loaded; NULL (the failure checked, the file gone)
 * when either step fails.  The caller frees the model and unlinks path. */
struct si_model *synth_model(const struct si_synth_params *p, const char *what, char *path)
{
    strcpy(path, "/tmp/si-test-engine-XXXXXX");
    int fd = mkstemp(path);
    CHECK(fd >= 0, "mkstemp");
    if (fd < 0)
        return NULL;
    close(fd);
    char err[512];
    struct si_model *m = NULL;
    int rc = si_synth_write(p, path, err, sizeof err);
    CHECK(rc == SI_OK, "synth %s: %s", what, err);
    if (rc == SI_OK) {
        rc = si_model_load(&m, path, err, sizeof err);
        CHECK(rc == SI_OK, "load %s: %s", what, err);
    }
    if (rc != SI_OK)
        unlink(path);
    return m;
}

/*
 * si_engine_eval_batch_logits: the logits of every position from `first` on
 * (what perplexity scores), against the reference's token by token, with
 * batches of 8 (batches with and without scored tokens, one cut inside a
 * batch), token by token (n_batch 1), and exact prefill; then the errors.
 */
void batch_logits(const char *what, const struct si_model *m, double tol)
{
    enum { N = 21, FIRST = 5 };
    const int32_t nv = m->hp.n_vocab;
    int32_t toks[N];
    for (int i = 0; i < N; i++)
        toks[i] = i == 0 ? 1 : (int32_t)((i * 53 + 17) % nv);
    float *want = malloc((size_t)N * (size_t)nv * sizeof(float));
    float *got = malloc((size_t)(N - FIRST) * (size_t)nv * sizeof(float));
    struct si_ref *r = NULL;
    char err[512];
    struct si_ref_params rp = si_ref_default_params();
    rp.n_ctx = 64;
    rp.act_quant = false; /* sgemm's float activations, as the batches' */
    CHECK(want != NULL && got != NULL, "memory");
    if (want == NULL || got == NULL || si_ref_init(&r, m, rp, err, sizeof err) != SI_OK) {
        CHECK(false, "%s: reference", what);
        free(want);
        free(got);
        return;
    }
    for (int i = 0; i < N; i++) {
        si_ref_eval(r, toks[i]);
        memcpy(want + (size_t)i * (size_t)nv, r->logits, (size_t)nv * sizeof(float));
    }
    si_ref_free(r);
    const struct {
        int32_t n_batch;
        bool exact;
        double tol;
    } runs[] = {{8, false, tol}, {1, false, 1e-5}, {8, true, 1e-5}};
    for (size_t k = 0; k < sizeof runs / sizeof runs[0]; k++) {
        struct si_engine_params ep = si_engine_default_params();
        ep.ref = rp;
        ep.ref.act_quant = runs[k].exact; /* exact prefill: the reference's converted inputs */
        ep.n_batch = runs[k].n_batch;
        ep.prefill = runs[k].exact ? SI_PREFILL_EXACT : SI_PREFILL_AUTO;
        struct si_engine *e = NULL;
        if (si_engine_init(&e, m, ep, err, sizeof err) != SI_OK) {
            CHECK(false, "%s: engine: %s", what, err);
            continue;
        }
        if (runs[k].exact) { /* the reference again, with converted inputs */
            rp.act_quant = true;
            if (si_ref_init(&r, m, rp, err, sizeof err) == SI_OK) {
                for (int i = 0; i < N; i++) {
                    si_ref_eval(r, toks[i]);
                    memcpy(want + (size_t)i * (size_t)nv, r->logits, (size_t)nv * sizeof(float));
                }
                si_ref_free(r);
            }
            rp.act_quant = false;
        }
        memset(got, 0, (size_t)(N - FIRST) * (size_t)nv * sizeof(float));
        int rc = si_engine_eval_batch_logits(e, toks, N, FIRST, got);
        CHECK(rc == SI_OK, "%s: batch logits: %s", what, si_status_str(rc));
        double worst = 0;
        for (int i = FIRST; i < N; i++)
            worst = fmax(worst, test_rel_err(got + (size_t)(i - FIRST) * (size_t)nv,
                                             want + (size_t)i * (size_t)nv, nv));
        printf("%-46s n_batch %d%s: logits of %d positions, max rel err %.2e\n", what,
               runs[k].n_batch, runs[k].exact ? " exact" : "", N - FIRST, worst);
        CHECK(worst <= runs[k].tol, "%s n_batch %d: batch logits differ by %.3g (tolerance %.1g)",
              what, runs[k].n_batch, worst, runs[k].tol);
        CHECK(test_rel_err(si_engine_logits(e), want + (size_t)(N - 1) * (size_t)nv, nv) <=
                  runs[k].tol,
              "%s: si_engine_logits is not the last token's", what);
        /* the positions carry on: one more token matches the reference's next */
        si_engine_reset(e);
        CHECK(si_engine_eval_batch_logits(e, toks, N, N, got) == SI_OK, "%s: no rows", what);
        CHECK(si_engine_eval_batch_logits(e, toks, 2, 0, got) == SI_E_BUDGET ||
                  si_engine_eval_batch_logits(e, toks, 2, 0, got) == SI_OK,
              "%s: after no rows", what);
        si_engine_reset(e);
        CHECK(si_engine_eval_batch_logits(e, toks, N, N + 1, got) == SI_E_INVALID,
              "%s: first past n accepted", what);
        CHECK(si_engine_eval_batch_logits(e, toks, N, 0, NULL) == SI_E_INVALID,
              "%s: no buffer accepted", what);
        si_engine_free(e);
    }
    free(want);
    free(got);
}

/* Every view an FFN hook is given, in order: layer, x, g (or none), h. */
struct views {
    const struct si_model *m;
    int64_t n, cap;
    int32_t *layer;
    bool *has_g;
    float *x, *g, *h, *xa;
};

static void keep_view(void *user, const struct si_ffn_view *v, int l)
{
    struct views *k = user;
    const size_t d = (size_t)k->m->hp.n_embd, ff = (size_t)k->m->hp.n_ff;
    if (k->n >= k->cap || v->m != k->m)
        return;
    const size_t i = (size_t)k->n++;
    k->layer[i] = l;
    k->has_g[i] = v->g != NULL;
    memcpy(k->x + i * d, v->x, d * sizeof(float));
    if (v->xa != NULL)
        memcpy(k->xa + i * d, v->xa, d * sizeof(float));
    else /* a NaN row: the comparison fails */
        for (size_t j = 0; j < d; j++)
            k->xa[i * d + j] = NAN;
    if (v->g != NULL)
        memcpy(k->g + i * ff, v->g, ff * sizeof(float));
    memcpy(k->h + i * ff, v->h, ff * sizeof(float));
}

static bool views_init(struct views *k, const struct si_model *m, int64_t cap)
{
    const size_t d = (size_t)m->hp.n_embd, ff = (size_t)m->hp.n_ff;
    *k = (struct views){.m = m, .cap = cap};
    k->layer = malloc((size_t)cap * sizeof *k->layer);
    k->has_g = malloc((size_t)cap * sizeof *k->has_g);
    k->x = malloc((size_t)cap * d * sizeof(float));
    k->xa = malloc((size_t)cap * d * sizeof(float));
    k->g = calloc((size_t)cap * ff, sizeof(float));
    k->h = malloc((size_t)cap * ff * sizeof(float));
    return k->layer && k->has_g && k->x && k->xa && k->g && k->h;
}

static void views_free(struct views *k)
{
    free(k->layer);
    free(k->has_g);
    free(k->x);
    free(k->xa);
    free(k->g);
    free(k->h);
}

/* The largest differences between the views of a and b (b's order
 * assumed), each relative to b's largest value: x, g, h, xa in err[0..4). */
static void views_err(const struct views *a, const struct views *b, double err[4])
{
    const size_t d = (size_t)b->m->hp.n_embd, ff = (size_t)b->m->hp.n_ff;
    double e[4] = {0}, sc[4] = {0};
    for (int64_t i = 0; i < a->n && i < b->n; i++) {
        for (size_t k = 0; k < d; k++) {
            e[0] = fmax(e[0], fabs((double)a->x[i * d + k] - b->x[i * d + k]));
            sc[0] = fmax(sc[0], fabs((double)b->x[i * d + k]));
            /* fmax drops a NaN: a missing xa counts as an infinite error */
            const double da = fabs((double)a->xa[i * d + k] - b->xa[i * d + k]);
            e[3] = isnan(da) ? INFINITY : fmax(e[3], da);
            sc[3] = fmax(sc[3], fabs((double)b->xa[i * d + k]));
        }
        for (size_t k = 0; k < ff; k++) {
            e[1] = fmax(e[1], fabs((double)a->g[i * ff + k] - b->g[i * ff + k]));
            sc[1] = fmax(sc[1], fabs((double)b->g[i * ff + k]));
            e[2] = fmax(e[2], fabs((double)a->h[i * ff + k] - b->h[i * ff + k]));
            sc[2] = fmax(sc[2], fabs((double)b->h[i * ff + k]));
        }
    }
    for (int q = 0; q < 4; q++)
        err[q] = sc[q] > 0 ? e[q] / sc[q] : e[q];
}

/*
 * The engine's FFN observation (si_engine_ffn_runner: what profile,
 * train-predictor and eval run on) against the reference's hook: the same
 * calls in the same order (token by token, layer 0 first), over windows
 * (one cut short) of several batches each, x, g and h close to the
 * reference's, and profiles that agree; then the refusals (sparse modes,
 * no batches).  pf: the batches' arithmetic, PF_EXACT (the same bits, but
 * on a file without ffn_down: see below),
 * PF_INT8 or PF_BLAS (within twice what converting the inputs does, as
 * compare's prompts: see there).
 */
static void observe(const char *what, const struct si_model *m, enum prefill pf)
{
    enum { N = 150, WINDOW = 64 };
    const int32_t nl = m->hp.n_layer;
    const size_t ff = (size_t)m->hp.n_ff;
    int32_t toks[N];
    for (int i = 0; i < N; i++)
        toks[i] = (i * 29 + 3) % m->hp.n_vocab;
    char err[512], label[160];
    snprintf(label, sizeof label, "%s observed (prefill %s)", what,
             pf == PF_EXACT ? "exact" : pf == PF_INT8 ? "int8" : "blas");
    if (pf == PF_INT8 && si_gemm8_missing() != NULL) {
        printf("%s: skipped, %s\n", label, si_gemm8_missing());
        return;
    }
    struct views ref, eng, flt;
    if (!views_init(&ref, m, (int64_t)N * nl) || !views_init(&eng, m, (int64_t)N * nl) ||
        !views_init(&flt, m, (int64_t)N * nl)) {
        CHECK(false, "%s: out of memory", label);
        views_free(&ref);
        views_free(&eng);
        views_free(&flt);
        return;
    }
    struct si_ref_params rp = si_ref_default_params();
    rp.n_ctx = WINDOW;
    const struct si_ffn_runner rr = si_ffn_runner_ref(rp);
    CHECK(rr.run(&rr, m, toks, N, keep_view, &ref, err, sizeof err) == SI_OK, "%s: ref: %s",
          label, err);
    /* what converting the inputs does here: the tolerance's scale; exact
     * prefill gives the same bits but on the neuron records of a file
     * without ffn_down, whose slices add their parts in another order */
    double tol[4] = {0}, conv[4] = {0};
    if (pf != PF_EXACT || si_model_down_t_only(m)) {
        struct si_ref_params fp = rp;
        fp.act_quant = false;
        const struct si_ffn_runner fr = si_ffn_runner_ref(fp);
        CHECK(fr.run(&fr, m, toks, N, keep_view, &flt, err, sizeof err) == SI_OK,
              "%s: float ref: %s", label, err);
        views_err(&flt, &ref, conv);
        for (int q = 0; q < 4; q++)
            tol[q] = fmax(1.0 / 512, 2 * conv[q]);
    }
    struct si_engine_params ep = si_engine_default_params();
    ep.ref = rp;
    ep.n_batch = 16;
    ep.prefill = pf == PF_EXACT ? SI_PREFILL_EXACT
                 : pf == PF_INT8 ? SI_PREFILL_INT8
                                 : SI_PREFILL_BLAS;
    struct si_engine *e = NULL;
    int rc = si_engine_init(&e, m, ep, err, sizeof err);
    CHECK(rc == SI_OK, "%s: init: %s", label, err);
    if (rc == SI_OK) {
        const struct si_ffn_runner er = si_engine_ffn_runner(e);
        rc = er.run(&er, m, toks, N, keep_view, &eng, err, sizeof err);
        CHECK(rc == SI_OK, "%s: engine: %s", label, err);
        CHECK(eng.n == ref.n && ref.n == (int64_t)N * nl, "%s: %lld views, the reference %lld",
              label, (long long)eng.n, (long long)ref.n);
        int order = 0;
        for (int64_t i = 0; i < eng.n && i < ref.n; i++)
            order += eng.layer[i] != (int32_t)(i % nl) || ref.layer[i] != (int32_t)(i % nl) ||
                     eng.has_g[i] != ref.has_g[i] ||
                     eng.has_g[i] != (m->hp.ffn_kind != SI_FFN_PLAIN);
        double ve[4];
        views_err(&eng, &ref, ve);
        CHECK(order == 0, "%s: %d views out of order or with the wrong gate", label, order);
        CHECK(ve[0] <= tol[0] && ve[1] <= tol[1] && ve[2] <= tol[2] && ve[3] <= tol[3],
              "%s: max error x %.3g, g %.3g, h %.3g, xa %.3g (tolerance %.2g, %.2g, %.2g, %.2g)",
              label, ve[0], ve[1], ve[2], ve[3], tol[0], tol[1], tol[2], tol[3]);
        printf("%s: %lld views in order, max error x %.2g g %.2g h %.2g xa %.2g (relative; the "
               "conversion's own %.2g %.2g %.2g %.2g)\n",
               label, (long long)eng.n, ve[0], ve[1], ve[2], ve[3], conv[0], conv[1], conv[2],
               conv[3]);

        /* A profile through each runner: counts that agree. */
        struct si_profile *pe = NULL, *pr = NULL;
        if (si_profile_init(&pe, nl, (int32_t)ff, err, sizeof err) == SI_OK &&
            si_profile_init(&pr, nl, (int32_t)ff, err, sizeof err) == SI_OK) {
            CHECK(si_profile_collect(pe, m, &er, toks, N, err, sizeof err) == SI_OK &&
                      si_profile_collect(pr, m, &rr, toks, N, err, sizeof err) == SI_OK,
                  "%s: profile: %s", label, err);
            int64_t diff = 0, total = 0;
            for (size_t k = 0; k < (size_t)nl * ff; k++) {
                diff += llabs(pe->counts[k] - pr->counts[k]);
                total += pr->counts[k];
            }
            CHECK(pe->n_tokens == N && total > 0 && (double)diff <= 0.01 * (double)total + 2,
                  "%s: profile counts differ by %lld of %lld", label, (long long)diff,
                  (long long)total);
        }
        si_profile_free(pe);
        si_profile_free(pr);
        si_engine_free(e);
        e = NULL;
    }
    /* Refusals: a sparse mode, token by token. */
    ep.mode = SI_SPARSITY_GATE;
    if (si_engine_init(&e, m, ep, err, sizeof err) == SI_OK) {
        const struct si_ffn_runner er = si_engine_ffn_runner(e);
        err[0] = '\0';
        CHECK(er.run(&er, m, toks, 8, keep_view, &eng, err, sizeof err) == SI_E_INVALID &&
                  strstr(err, "dense mode") != NULL,
              "%s: gate mode observed: '%s'", label, err);
        si_engine_free(e);
        e = NULL;
    }
    ep.mode = SI_SPARSITY_DENSE;
    ep.n_batch = 1;
    if (si_engine_init(&e, m, ep, err, sizeof err) == SI_OK) {
        CHECK(si_engine_observe(e, keep_view, &eng) == SI_E_INVALID,
              "%s: observed without batches", label);
        si_engine_free(e);
    }
    views_free(&ref);
    views_free(&eng);
    views_free(&flt);
}

/* observe() on synthetic SwiGLU (SiLU), ReLU Q4_0 and OPT (plain) models,
 * and on ReLU Q4_0 in PowerInfer's layout (no ffn_down: dense mode runs on
 * the neuron records, which keep their neurons in another order). */
static void observe_models(void)
{
    static const struct {
        const char *arch;
        uint32_t type;
        bool powerinfer;
    } cases[] = {{"llama-silu", SI_TYPE_F32, false},
                 {"llama-relu", SI_TYPE_Q4_0, false},
                 {"opt", SI_TYPE_F16, false},
                 {"llama-relu", SI_TYPE_Q4_0, true}};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        struct si_synth_params p = si_synth_default_params();
        si_synth_preset("tiny", &p);
        si_synth_arch_parse(cases[c].arch, &p.arch);
        p.type = cases[c].type;
        p.n_layer = 3;
        p.n_ff = 1024;
        p.seed = 5;
        if (p.arch == SI_SYNTH_OPT)
            p.n_head_kv = p.n_head;
        p.powerinfer = cases[c].powerinfer;
        p.predictor_rank = p.powerinfer ? 32 : 0;
        char path[32], what[96];
        snprintf(what, sizeof what, "%s %s %s", p.powerinfer ? "PowerInfer-layout" : "synthetic",
                 cases[c].arch, si_type_name(p.type));
        struct si_model *m = synth_model(&p, what, path);
        if (m == NULL)
            continue;
        observe(what, m, PF_EXACT);
        observe(what, m, PF_INT8);
        observe(what, m, PF_BLAS);
        si_model_free(m);
        unlink(path);
    }
}

int main(void)
{
    struct si_runtime rt;
    char err[256];
    /* SI_TEST_CALLER_WORKER=1: this thread is StarPU's CPU worker 0. */
    const char *cw = getenv("SI_TEST_CALLER_WORKER");
    const bool caller = cw != NULL && !strcmp(cw, "1");
    if (si_runtime_start(&rt, caller, err, sizeof err) != SI_OK) {
        fprintf(stderr, "%s\n", err);
        return 1;
    }
    printf("StarPU: %u CPU workers%s, scheduler %s\n", si_runtime_ncpu(),
           si_runtime_is_caller_worker() ? " (worker 0 is this thread)" : "",
           getenv("STARPU_SCHED") != NULL ? getenv("STARPU_SCHED") : "(default)");
    CHECK(si_runtime_is_caller_worker() == caller, "caller worker %d", caller);
    /* Float weights: the slices' partial sums only reorder additions. */
    synthetic("llama-relu", SI_TYPE_F32, 1024, 0, 1e-4);
    synthetic("bamboo", SI_TYPE_F16, 1024, 0, 1e-4);
    synthetic("opt", SI_TYPE_F32, 1024, 0, 1e-4);
    /* SiLU: gate mode with the profile's per-layer (CATS) thresholds. */
    synthetic("llama-silu", SI_TYPE_F32, 1024, 0, 1e-4);
    /* Quantized weights: the same blocks, so the same bound holds. */
    synthetic("llama-relu", SI_TYPE_Q4_0, 1024, 0, 1e-4);
    /* More slices than a task's fixed buffer slots: the merge task's
     * handles go through StarPU's dynamic buffer arrays. */
    synthetic("llama-relu", SI_TYPE_Q4_0, 4096, 12, 1e-4);
    powerinfer_layout("llama-relu", SI_TYPE_Q4_0);
    powerinfer_layout("bamboo", SI_TYPE_F16);
    powerinfer_layout("opt", SI_TYPE_F32);
    attn_auto();

    /* SI_TEST_ENGINE_QUICK=1 (test-engine.sh, for most of its scheduler and
     * worker configurations): without the sweep of types and gemma3 (and
     * compare() skips the GPU forms' CPU twins). */
    const bool quick = quick_run();
    if (!quick)
        synthetic_types();
    else
        printf("note: SI_TEST_ENGINE_QUICK=1: the sweep of types, gemma3, the GPU forms' CPU "
               "twins and SmolLM2 but for one configuration skipped here\n");

    /* Hand-built tiny models of the architectures synth does not make
     * (norms, biases, QK norm, sandwich norms, sliding windows, Falcon's
     * parallel residual), F32: every decode graph the engine builds
     * (attention whole or by kv-head group, redux merging, prefill). */
    tiny_models();
    observe_models();

    const char *path = getenv("STARINFER_TEST_MODEL");
    if (path != NULL && *path != '\0' && access(path, R_OK) == 0) {
        struct si_model *m = NULL;
        if (si_model_load(&m, path, err, sizeof err) == SI_OK) {
            /* The quick runs vary the scheduling, which the synthetic
             * models cover; of the real model, one configuration (a hot
             * and a cold slice), as its cases are most of a run's time. */
            compare("SmolLM2-135M Q4_1", m, (struct config){.mode = SI_SPARSITY_DENSE, .hot = true},
                    1e-4);
            if (!quick) {
                compare("SmolLM2-135M Q4_1", m, (struct config){.mode = SI_SPARSITY_DENSE}, 1e-4);
                compare("SmolLM2-135M Q4_1", m,
                        (struct config){.mode = SI_SPARSITY_DENSE, .hot = true, .gpu = true}, 1e-4);
                compare("SmolLM2-135M Q4_1", m,
                        (struct config){.mode = SI_SPARSITY_DENSE, .prefill = PF_EXACT}, 1e-4);
                compare("SmolLM2-135M Q4_1", m,
                        (struct config){.mode = SI_SPARSITY_DENSE, .prefill = PF_FLOAT}, 1e-4);
            }
            si_model_free(m);
        } else {
            CHECK(false, "%s", err);
        }
    } else {
        printf("note: STARINFER_TEST_MODEL not set; SmolLM2 not compared\n");
    }
    /* gemma3-270m Q4_K_M: types mixed across layers (ffn_down Q6_K or Q4_K). */
    path = getenv("STARINFER_GEMMA_MODEL");
    if (quick) {
        /* said above */
    } else if (path != NULL && *path != '\0' && access(path, R_OK) == 0) {
        struct si_model *m = NULL;
        if (si_model_load(&m, path, err, sizeof err) == SI_OK) {
            compare("gemma3-270m Q4_K_M", m, (struct config){.mode = SI_SPARSITY_DENSE}, 1e-4);
            compare("gemma3-270m Q4_K_M", m,
                    (struct config){.mode = SI_SPARSITY_DENSE, .prefill = PF_EXACT}, 1e-4);
            /* float activations on both sides, sums in other orders (sgemm's
             * blocks against the reference's dots), which gemma3's sandwich
             * norms amplify: 3.3e-3 measured */
            batch_logits("gemma3-270m Q4_K_M", m, 6e-3);
            si_model_free(m);
        } else {
            CHECK(false, "%s", err);
        }
    } else {
        printf("note: STARINFER_GEMMA_MODEL not set; gemma3 not compared\n");
    }
    si_runtime_stop(&rt);
    return test_result();
}
