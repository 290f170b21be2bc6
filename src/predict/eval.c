/* eval.c - predictor quality and perplexity in the three modes (eval.h). */
#include "predict/eval.h"

#include "internal.h"
#include "model/act.h"
#include "model/quants.h"
#include "model/types.h"
#include "predict/profile.h"
#include "starinfer.h"

#include <inttypes.h>
#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

double si_eval_recall(const struct si_eval_confusion *c)
{
    return c->tp + c->fn > 0 ? (double)c->tp / (double)(c->tp + c->fn) : 1.0;
}

double si_eval_precision(const struct si_eval_confusion *c)
{
    return c->tp + c->fp > 0 ? (double)c->tp / (double)(c->tp + c->fp) : 1.0;
}

static double all_pairs(const struct si_eval_confusion *c)
{
    return (double)(c->tp + c->fp + c->fn + c->tn);
}

double si_eval_pred_sparsity(const struct si_eval_confusion *c)
{
    const double n = all_pairs(c);
    return n > 0 ? (double)(c->fn + c->tn) / n : 0.0;
}

double si_eval_true_sparsity(const struct si_eval_confusion *c)
{
    const double n = all_pairs(c);
    return n > 0 ? (double)(c->fp + c->tn) / n : 0.0;
}

static int64_t elems(const struct si_tensor *t)
{
    return t->data == NULL ? 0 : t->ne[0] * t->ne[1] * t->ne[2] * t->ne[3];
}

int64_t si_eval_predictor_params(const struct si_model *m)
{
    int64_t n = 0;
    for (int32_t l = 0; m->has_predictor && l < m->hp.n_layer; l++)
        n += elems(&m->w.layers[l].fc1) + elems(&m->w.layers[l].fc2);
    return n;
}

/* The weights the forward pass uses, each once (a tied output is the
 * embedding; ffn_down_t, a second layout of ffn_down, is not counted). */
int64_t si_eval_model_params(const struct si_model *m)
{
    const struct si_weights *w = &m->w;
    int64_t n = elems(&w->token_embd) + elems(&w->pos_embd) + elems(&w->output_norm) +
                elems(&w->output_norm_b);
    if (w->output.data != w->token_embd.data)
        n += elems(&w->output);
    for (int32_t l = 0; l < m->hp.n_layer; l++) {
        const struct si_layer *L = &w->layers[l];
        const struct si_tensor *t[] = {
            &L->attn_norm, &L->attn_norm_b, &L->attn_norm2, &L->attn_norm2_b, &L->wq, &L->wk,
            &L->wv, &L->wo, &L->bq, &L->bk, &L->bv, &L->bo, &L->q_norm, &L->k_norm,
            &L->attn_post_norm, &L->ffn_norm, &L->ffn_norm_b, &L->ffn_gate, &L->ffn_up,
            &L->ffn_down, &L->ffn_up_b, &L->ffn_down_b, &L->ffn_post_norm};
        for (size_t k = 0; k < sizeof t / sizeof t[0]; k++)
            n += elems(t[k]);
    }
    return n;
}

uint64_t si_eval_predictor_bytes(const struct si_model *m)
{
    uint64_t n = 0;
    for (int32_t l = 0; m->has_predictor && l < m->hp.n_layer; l++)
        n += m->w.layers[l].fc1.nbytes + m->w.layers[l].fc2.nbytes;
    return n;
}

int si_eval_stored_thresholds(const struct si_model *m, enum si_active_rule *rule, float **out,
                              double *target, char *err, size_t err_size)
{
    *out = NULL;
    const struct si_gguf *g = si_model_pred_gguf(m);
    const int64_t k = si_gguf_find_key(g, "starinfer.predictor.active_threshold");
    if (k < 0)
        return SI_E_NOT_FOUND;
    const struct si_gguf_kv *kv = &g->kv[k];
    if (kv->type != SI_GGUF_ARRAY || kv->arr_type != SI_GGUF_FLOAT32 ||
        kv->arr_n != (uint64_t)m->hp.n_layer)
        return si__errf(err, err_size, SI_E_FORMAT,
                        "starinfer.predictor.active_threshold must be %" PRId32 " FLOAT32 values",
                        m->hp.n_layer);
    struct si_gguf_str rs;
    char name[16] = "";
    if (si_gguf_get_str(g, "starinfer.predictor.active_rule", &rs) == SI_OK && rs.len < sizeof name)
        memcpy(name, rs.data, rs.len);
    if (si_active_rule_parse(name, rule) != SI_OK)
        return si__errf(err, err_size, SI_E_FORMAT,
                        "starinfer.predictor.active_rule missing or neither gate nor output");
    double s = 0;
    if (si_gguf_get_f64(g, "starinfer.predictor.target_sparsity", &s) != SI_OK)
        s = 0;
    float *t = malloc((size_t)m->hp.n_layer * sizeof *t);
    if (t == NULL)
        return si__errf(err, err_size, SI_E_NOMEM, "out of memory");
    for (int32_t l = 0; l < m->hp.n_layer; l++) {
        memcpy(&t[l], kv->arr_data + 4 * (size_t)l, sizeof t[l]);
        if (!(isfinite(t[l]) && t[l] >= 0)) {
            const double bad = (double)t[l];
            free(t);
            return si__errf(err, err_size, SI_E_FORMAT,
                            "starinfer.predictor.active_threshold: layer %" PRId32
                            " has %g (must be finite, >= 0)",
                            l, bad);
        }
    }
    *out = t;
    *target = s;
    return SI_OK;
}

/* From the FFN hook: the predictors against the truth, and the oracle. */
struct si_eval_watch {
    enum si_active_rule rule;
    const float *thresholds; /* NULL: activation != 0 */
    struct si_eval_confusion *conf;
    bool oracle;
    bool act_quant; /* the predictor's arithmetic (si_ref_params.act_quant) */
    int64_t n_active, n_seen;
    void *xq;
    float *r1, *y;
    uint8_t *pred, *act;
};

void si_eval_watch_hook(void *user, const struct si_ffn_view *v, int l)
{
    struct si_eval_watch *h = user;
    const struct si_model *m = v->m;
    const int64_t ff = m->hp.n_ff;
    int64_t n = 0;
    for (int64_t i = 0; i < ff; i++) {
        h->act[i] = h->thresholds == NULL ? v->h[i] != 0.0f
                                          : si_active_value(v, h->rule, i) > h->thresholds[l];
        n += h->act[i];
    }
    h->n_active += n;
    h->n_seen += ff;
    if (h->conf != NULL) {
        const struct si_layer *L = &m->w.layers[l];
        si_ref_predict(&L->fc1, &L->fc2, m->predictor_threshold, h->act_quant, h->xq,
                       si_ref_pred_in(m, v->xr, v->x, v->xa), h->r1, h->y, h->pred);
        struct si_eval_confusion *c = &h->conf[l];
        for (int64_t i = 0; i < ff; i++) {
            const bool p = h->pred[i], a = h->act[i];
            c->tp += p && a;
            c->fp += p && !a;
            c->fn += !p && a;
            c->tn += !p && !a;
        }
    }
    /* The hook runs after the activation and before the down projection
     * (forward.h): zeroing h here skips those neurons exactly as the
     * sparse modes do. */
    if (h->oracle)
        for (int64_t i = 0; i < ff; i++)
            if (!h->act[i])
                v->h[i] = 0.0f;
}

int si_eval_watch_init(struct si_eval_watch **out, const struct si_model *m,
                       const struct si_eval_params *ep, bool act_quant, char *err,
                       size_t err_size)
{
    *out = NULL;
    if (ep->conf != NULL && !m->has_predictor)
        return si__errf(err, err_size, SI_E_INVALID,
                        "the model has no predictor (blk.N.fc1/fc2) tensors");
    if (ep->thresholds == NULL && !si_profile_relu_family(m) && (ep->conf != NULL || ep->oracle))
        return si__errf(err, err_size, SI_E_INVALID,
                        "telling active neurons of a SiLU/GELU model needs its thresholds");
    struct si_eval_watch *h = calloc(1, sizeof *h);
    if (h == NULL)
        return si__errf(err, err_size, SI_E_NOMEM, "out of memory");
    *h = (struct si_eval_watch){.rule = ep->rule,
                                .thresholds = si_profile_relu_family(m) ? NULL : ep->thresholds,
                                .conf = ep->conf,
                                .oracle = ep->oracle,
                                .act_quant = act_quant};
    int64_t rank = 0;
    size_t xq = 0, b;
    for (int32_t l = 0; m->has_predictor && l < m->hp.n_layer; l++) {
        const struct si_layer *L = &m->w.layers[l];
        rank = L->fc1.ne[1] > rank ? L->fc1.ne[1] : rank;
        if (si_type_row_size(si_act_type(L->fc1.type), L->fc1.ne[0], &b) && b > xq)
            xq = b;
        if (si_type_row_size(si_act_type(L->fc2.type), L->fc2.ne[0], &b) && b > xq)
            xq = b;
    }
    h->xq = malloc(xq > 0 ? xq : 1);
    h->r1 = malloc((size_t)(rank > 0 ? rank : 1) * sizeof(float));
    h->y = malloc((size_t)m->hp.n_ff * sizeof(float));
    h->pred = malloc((size_t)m->hp.n_ff);
    h->act = malloc((size_t)m->hp.n_ff);
    if (h->xq == NULL || h->r1 == NULL || h->y == NULL || h->pred == NULL || h->act == NULL) {
        si_eval_watch_free(h);
        return si__errf(err, err_size, SI_E_NOMEM, "out of memory");
    }
    *out = h;
    return SI_OK;
}

double si_eval_watch_active_share(const struct si_eval_watch *h)
{
    return h->n_seen > 0 ? (double)h->n_active / (double)h->n_seen : 0.0;
}

void si_eval_watch_free(struct si_eval_watch *h)
{
    if (h == NULL)
        return;
    free(h->xq);
    free(h->r1);
    free(h->y);
    free(h->pred);
    free(h->act);
    free(h);
}

void si_ppl_add(struct si_ppl_sum *s, const float *lg, int32_t nv, int32_t next)
{
    /* -log softmax(logits)[next], with the max subtracted. */
    float mx = lg[0];
    for (int32_t k = 1; k < nv; k++)
        mx = lg[k] > mx ? lg[k] : mx;
    double sum = 0;
    for (int32_t k = 0; k < nv; k++)
        sum += exp((double)(lg[k] - mx));
    const double l = log(sum) - (double)(lg[next] - mx);
    s->nll += l;
    s->nll2 += l * l;
    s->count++;
}

double si_ppl_value(const struct si_ppl_sum *s)
{
    return s->count > 0 ? exp(s->nll / (double)s->count) : 1.0;
}

void si_ppl_finish(const struct si_ppl_sum *s, struct si_eval_ppl *out)
{
    const double count = (double)(s->count > 0 ? s->count : 1);
    const double mean = s->nll / count;
    const double var = s->count > 1 ? (s->nll2 / count - mean * mean) / (count - 1) : 0;
    out->ppl = exp(mean);
    out->ppl_err = out->ppl * sqrt(var > 0 ? var : 0);
    out->n_scored = s->count;
}

int si_eval_perplexity(const struct si_model *m, struct si_ref_params rp, const int32_t *tokens,
                       int64_t n, const struct si_eval_params *ep, struct si_eval_ppl *out,
                       char *err, size_t err_size)
{
    memset(out, 0, sizeof *out);
    if (m == NULL || ep == NULL || n < 0 || (n > 0 && tokens == NULL) || rp.n_ctx < 16)
        return si__errf(err, err_size, SI_E_INVALID,
                        "perplexity: invalid arguments (the chunk must be 16 tokens or more)");
    const int64_t ctx = rp.n_ctx;
    int64_t n_chunks = n / ctx;
    if (n_chunks == 0)
        return si__errf(err, err_size, SI_E_INVALID,
                        "%" PRId64 " tokens, fewer than one chunk of %" PRId64, n, ctx);
    if (ep->max_chunks > 0 && ep->max_chunks < n_chunks)
        n_chunks = ep->max_chunks;
    struct si_eval_confusion *conf = ep->conf;
    const int32_t bos = ep->bos;
    for (int64_t i = 0; i < n_chunks * ctx; i++)
        if (tokens[i] < 0 || tokens[i] >= m->hp.n_vocab)
            return si__errf(err, err_size, SI_E_INVALID,
                            "token %" PRId32 " at position %" PRId64
                            " is outside the vocabulary of %" PRId32,
                            tokens[i], i, m->hp.n_vocab);
    struct si_eval_watch *h = NULL;
    int rc = SI_OK;
    if (conf != NULL || ep->oracle) {
        rc = si_eval_watch_init(&h, m, ep, rp.act_quant, err, err_size);
        if (rc != SI_OK)
            return rc;
    }
    struct si_ref *s = NULL;
    rc = si_ref_init(&s, m, rp, err, err_size);
    if (rc != SI_OK) {
        si_eval_watch_free(h);
        return rc;
    }
    if (h != NULL) {
        s->ffn_hook = si_eval_watch_hook;
        s->ffn_hook_user = h;
    }
    s->count_active = true;

    const int32_t nv = m->hp.n_vocab;
    const int64_t first = ctx / 2;
    double active = 0, evaluated = 0;
    struct si_ppl_sum sum = {0};
    const double t0 = si__now();
    for (int64_t ch = 0; ch < n_chunks; ch++) {
        const int32_t *chunk = tokens + ch * ctx;
        si_ref_reset(s);
        /* llama.cpp evaluates a chunk as one batch (its tiled attention from
         * 64 tokens on, its batch products) with the logits of the scored
         * half, positions first .. ctx - 1. */
        s->attn_f32 = ctx >= 64;
        s->batch_n = (int32_t)ctx;
        const int64_t n_out = ctx - first;
        for (int64_t j = 0; j < ctx - 1; j++) {
            const int32_t t = j == 0 && bos >= 0 ? bos : chunk[j];
            s->batch_g4 = j < ctx - ctx % 4;
            s->batch_out_n = j >= first ? (int32_t)n_out : 1;
            s->batch_out_g4 = j >= first && j - first < n_out - n_out % 4;
            if ((rc = si_ref_eval(s, t)) != SI_OK) {
                rc = si__errf(err, err_size, rc, "evaluation failed in chunk %" PRId64 ": %s", ch,
                              si_status_str(rc));
                goto out;
            }
            for (int32_t l = 0; l < m->hp.n_layer; l++)
                active += (double)s->n_active[l];
            evaluated += (double)m->hp.n_layer * (double)m->hp.n_ff;
            if (j < first)
                continue;
            si_ppl_add(&sum, s->logits, nv, chunk[j + 1]);
        }
        if (ep->progress != NULL)
            ep->progress(ep->progress_user, ch + 1, n_chunks, si_ppl_value(&sum));
    }
    si_ppl_finish(&sum, out);
    out->n_chunks = n_chunks;
    out->ffn_computed = evaluated > 0 ? active / evaluated : 0;
    out->seconds = si__now() - t0;
out:
    si_eval_watch_free(h);
    si_ref_free(s);
    return rc;
}
