/* model.c - hyperparameters and weight views for each architecture. */
#include "model/model.h"

#include "internal.h"
#include "model/colblock.h"
#include "model/quants.h"
#include "model/types.h"
#include "starinfer.h"

#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const arch_names[SI_ARCH_COUNT] = {
    [SI_ARCH_LLAMA] = "llama",   [SI_ARCH_BAMBOO] = "bamboo", [SI_ARCH_OPT] = "opt",
    [SI_ARCH_FALCON] = "falcon", [SI_ARCH_GEMMA3] = "gemma3",
};

const char *si_arch_name(enum si_arch arch)
{
    return (unsigned)arch < SI_ARCH_COUNT ? arch_names[arch] : "?";
}

bool si_hparams_is_swa(const struct si_hparams *hp, int32_t l)
{
    return hp->sliding_window > 0 && hp->swa_pattern > 0 && (l + 1) % hp->swa_pattern != 0;
}

/* Loading context: the file, the architecture prefix and the error sink. */
struct loader {
    struct si_gguf *g;
    const char *arch;
    char *err;
    size_t err_size;
};

static int fail(struct loader *ld, int status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int fail(struct loader *ld, int status, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    si__verrf(ld->err, ld->err_size, status, fmt, ap);
    va_end(ap);
    return status;
}

/*
 * `<arch>.<suffix>` as a positive int32, required or else `def`.  A per-layer
 * array whose values are all equal counts as that value.
 */
static int key_i32(struct loader *ld, const char *suffix, bool required, int32_t def, int32_t *out)
{
    char key[128];
    snprintf(key, sizeof key, "%s.%s", ld->arch, suffix);
    int64_t i = si_gguf_find_key(ld->g, key);
    if (i < 0) {
        if (required)
            return fail(ld, SI_E_FORMAT, "missing metadata key %s", key);
        *out = def;
        return SI_OK;
    }
    const struct si_gguf_kv *kv = &ld->g->kv[i];
    int64_t v = 0;
    if (kv->type == SI_GGUF_ARRAY) {
        if (kv->arr_n == 0)
            return fail(ld, SI_E_FORMAT, "metadata key %s is an empty array", key);
        for (uint64_t k = 0; k < kv->arr_n; k++) {
            struct si_gguf_kv e;
            int64_t x;
            if (si_gguf_arr_elem(kv, k, &e) != SI_OK || si_gguf_kv_i64(&e, &x) != SI_OK)
                return fail(ld, SI_E_FORMAT, "metadata key %s is not an integer array", key);
            if (k > 0 && x != v)
                return fail(ld, SI_E_UNSUPPORTED, "%s differs between layers (not supported)", key);
            v = x;
        }
    } else if (si_gguf_kv_i64(kv, &v) != SI_OK) {
        return fail(ld, SI_E_FORMAT, "metadata key %s is not an integer", key);
    }
    if (v <= 0 || v > INT32_MAX)
        return fail(ld, SI_E_FORMAT, "metadata key %s = %" PRId64 " is out of range", key, v);
    *out = (int32_t)v;
    return SI_OK;
}

static int key_f32(struct loader *ld, const char *suffix, bool required, float def, float *out)
{
    char key[128];
    snprintf(key, sizeof key, "%s.%s", ld->arch, suffix);
    double v;
    int rc = si_gguf_get_f64(ld->g, key, &v);
    if (rc == SI_E_NOT_FOUND) {
        if (required)
            return fail(ld, SI_E_FORMAT, "missing metadata key %s", key);
        *out = def;
        return SI_OK;
    }
    if (rc != SI_OK)
        return fail(ld, SI_E_FORMAT, "metadata key %s is not a float", key);
    if (!isfinite(v))
        return fail(ld, SI_E_FORMAT, "metadata key %s is not finite", key);
    *out = (float)v;
    return SI_OK;
}

/*
 * Find tensor `name` and check its shape against ne0, ne1 (0: 1-D tensor).
 * Optional tensors that are absent leave *t zeroed.
 */
static int tensor(struct loader *ld, struct si_tensor *t, bool required, int64_t ne0, int64_t ne1,
                  const char *fmt, ...)
{
    char name[128];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(name, sizeof name, fmt, ap);
    va_end(ap);
    memset(t, 0, sizeof *t);
    int64_t i = si_gguf_find_tensor(ld->g, name);
    if (i < 0)
        return required ? fail(ld, SI_E_FORMAT, "missing tensor %s", name) : SI_OK;
    const struct si_gguf_tensor *gt = &ld->g->tensors[i];
    int64_t want1 = ne1 == 0 ? 1 : ne1;
    if (gt->ne[0] != ne0 || gt->ne[1] != want1 || gt->ne[2] != 1 || gt->ne[3] != 1)
        return fail(ld, SI_E_FORMAT,
                    "tensor %s has shape [%" PRId64 ", %" PRId64 ", %" PRId64 ", %" PRId64
                    "], expected [%" PRId64 ", %" PRId64 "]",
                    name, gt->ne[0], gt->ne[1], gt->ne[2], gt->ne[3], ne0, want1);
    if (!si_type_supported(gt->type))
        return fail(ld, SI_E_UNSUPPORTED,
                    "tensor %s has type %s, which starinfer cannot compute with", name,
                    si_type_name(gt->type));
    t->data = gt->data;
    t->type = gt->type;
    memcpy(t->ne, gt->ne, sizeof t->ne);
    t->nbytes = gt->nbytes;
    si_type_row_size(gt->type, gt->ne[0], &t->row_bytes);
    return SI_OK;
}

/*
 * The transposed copy blk.<l>.<name> of a matrix of n_out rows of n_in
 * (optional): a row of n_out per input (tensor()), or a column-block copy
 * (model/colblock.h): its q rows as I8 {n_out / 2, n_in} beside its scales
 * blk.<l>.<name>.scale, F16 {n_out or 2 n_out, n_in / 32}.
 */
static int tcopy(struct loader *ld, struct si_tensor *t, int64_t n_out, int64_t n_in,
                 const char *name, int l)
{
    char full[128], scale[128];
    snprintf(full, sizeof full, "blk.%d.%s.weight", l, name);
    snprintf(scale, sizeof scale, "blk.%d.%s.scale", l, name);
    const int64_t i = si_gguf_find_tensor(ld->g, full);
    if (i < 0 || ld->g->tensors[i].type != SI_TYPE_I8)
        return tensor(ld, t, false, n_out, n_in, "%s", full);
    const struct si_gguf_tensor *q = &ld->g->tensors[i];
    const int64_t is = si_gguf_find_tensor(ld->g, scale);
    const struct si_gguf_tensor *sc = is >= 0 ? &ld->g->tensors[is] : NULL;
    if (q->ne[0] != n_out / 2 || q->ne[1] != n_in || q->ne[2] != 1 || n_out % SI_CB_GROUP ||
        n_in % 32 || sc == NULL || sc->type != SI_TYPE_F16 ||
        (sc->ne[0] != n_out && sc->ne[0] != 2 * n_out) || sc->ne[1] != n_in / 32 || sc->ne[2] != 1)
        return fail(ld, SI_E_FORMAT,
                    "%s is not a column-block copy of %" PRId64 " x %" PRId64
                    " (with its scales %s)",
                    full, n_out, n_in, scale);
    memset(t, 0, sizeof *t);
    t->data = q->data;
    t->type = sc->ne[0] == 2 * n_out ? SI_TYPE_Q4_1 : SI_TYPE_Q4_0;
    t->ne[0] = n_out;
    t->ne[1] = n_in;
    t->ne[2] = t->ne[3] = 1;
    t->row_bytes = (size_t)(n_out / 2);
    t->nbytes = q->nbytes + sc->nbytes;
    t->cb_scale = sc->data;
    return SI_OK;
}

/* Rows [r0, r0 + n) of matrix t, as a matrix of its own. */
static struct si_tensor rows(const struct si_tensor *t, int64_t r0, int64_t n)
{
    struct si_tensor v = *t;
    v.data = (const char *)t->data + (size_t)r0 * t->row_bytes;
    v.ne[1] = n;
    v.nbytes = (size_t)n * t->row_bytes;
    return v;
}

/*
 * Layer l's query, key and value projections: separate attn_q/k/v tensors,
 * or one fused attn_qkv (Falcon) whose rows are Q, then K, then V.
 */
static int qkv(struct loader *ld, struct si_layer *L, int l, int64_t d, int64_t qd, int64_t kvd)
{
    struct si_tensor fused;
    int rc = tensor(ld, &fused, false, d, qd + 2 * kvd, "blk.%d.attn_qkv.weight", l);
    if (rc != SI_OK)
        return rc;
    if (fused.data != NULL) {
        L->wq = rows(&fused, 0, qd);
        L->wk = rows(&fused, qd, kvd);
        L->wv = rows(&fused, qd + kvd, kvd);
        return SI_OK;
    }
    if ((rc = tensor(ld, &L->wq, true, d, qd, "blk.%d.attn_q.weight", l)) != SI_OK ||
        (rc = tensor(ld, &L->wk, true, d, kvd, "blk.%d.attn_k.weight", l)) != SI_OK)
        return rc;
    return tensor(ld, &L->wv, true, d, kvd, "blk.%d.attn_v.weight", l);
}

static int read_hparams(struct loader *ld, struct si_model *m)
{
    struct si_hparams *hp = &m->hp;
    int rc;
    if ((rc = key_i32(ld, "embedding_length", true, 0, &hp->n_embd)) != SI_OK ||
        (rc = key_i32(ld, "block_count", true, 0, &hp->n_layer)) != SI_OK ||
        (rc = key_i32(ld, "feed_forward_length", true, 0, &hp->n_ff)) != SI_OK ||
        (rc = key_i32(ld, "attention.head_count", true, 0, &hp->n_head)) != SI_OK ||
        (rc = key_i32(ld, "attention.head_count_kv", false, hp->n_head, &hp->n_head_kv)) != SI_OK ||
        (rc = key_i32(ld, "context_length", false, 2048, &hp->n_ctx_train)) != SI_OK)
        return rc;
    if (hp->n_embd % hp->n_head != 0 && si_gguf_find_key(ld->g, "gemma3.attention.key_length") < 0)
        return fail(ld, SI_E_FORMAT, "%s.embedding_length %d is not a multiple of head_count %d",
                    ld->arch, hp->n_embd, hp->n_head);
    if ((rc = key_i32(ld, "attention.key_length", false, hp->n_embd / hp->n_head, &hp->head_dim)) !=
        SI_OK)
        return rc;
    int32_t vlen;
    if ((rc = key_i32(ld, "attention.value_length", false, hp->head_dim, &vlen)) != SI_OK)
        return rc;
    if (vlen != hp->head_dim)
        return fail(ld, SI_E_UNSUPPORTED, "key length %d differs from value length %d",
                    hp->head_dim, vlen);
    if (hp->n_head % hp->n_head_kv != 0)
        return fail(ld, SI_E_FORMAT,
                    "%s.attention.head_count %d is not a multiple of head_count_kv %d", ld->arch,
                    hp->n_head, hp->n_head_kv);
    if ((rc = key_i32(ld, "rope.dimension_count", false, hp->head_dim, &hp->n_rot)) != SI_OK)
        return rc;
    if (hp->n_rot > hp->head_dim || hp->n_rot % 2 != 0)
        return fail(ld, SI_E_FORMAT, "%s.rope.dimension_count %d does not fit head size %d",
                    ld->arch, hp->n_rot, hp->head_dim);
    if ((rc = key_f32(ld, "rope.freq_base", false, 10000.0f, &hp->rope_base)) != SI_OK)
        return rc;
    hp->rope_base_local = hp->rope_base;
    float factor = 1.0f;
    if ((rc = key_f32(ld, "rope.scaling.factor", false, 1.0f, &factor)) != SI_OK)
        return rc;
    hp->rope_scale = factor > 0 ? 1.0f / factor : 1.0f;
    hp->attn_scale = 1.0f / sqrtf((float)hp->head_dim);
    hp->q_scale = 1.0f;
    hp->embd_scale = 1.0f;

    const char *eps_key = hp->norm_kind == SI_NORM_RMS ? "attention.layer_norm_rms_epsilon"
                                                       : "attention.layer_norm_epsilon";
    /* (PowerInfer's OPT files have none: it normalises with 0, as here) */
    if ((rc = key_f32(ld, eps_key, hp->arch != SI_ARCH_OPT, 0, &hp->norm_eps)) != SI_OK)
        return rc;
    if (hp->arch == SI_ARCH_OPT) {
        hp->pos_offset = 2;
        if (hp->n_ctx_train <= hp->pos_offset)
            return fail(ld, SI_E_FORMAT,
                        "opt.context_length = %d leaves no position after OPT's first 2 rows",
                        hp->n_ctx_train);
    }
    if (hp->arch == SI_ARCH_GEMMA3) {
        if ((rc = key_i32(ld, "attention.sliding_window", false, 0, &hp->sliding_window)) != SI_OK)
            return rc;
        hp->swa_pattern = 6;
        hp->rope_base_local = 10000.0f;
        hp->embd_scale = sqrtf((float)hp->n_embd);
        /* Gemma scales the query, by 1/sqrt(query_pre_attn_scalar), before
         * attention rather than the scores: the same maths, but the query is
         * rounded to fp16 after the scaling.  The scalar is the head size,
         * except for the 62-layer (27B) model, where it is n_embd / n_head. */
        const float pre = hp->n_layer == 62 ? (float)(hp->n_embd / hp->n_head)
                                            : (float)hp->head_dim;
        hp->q_scale = 1.0f / sqrtf(pre);
        hp->attn_scale = 1.0f;
    }

    /* Vocabulary size: the tokenizer's list, else the embedding's rows. */
    enum si_gguf_type t;
    uint64_t n = 0;
    int64_t it = si_gguf_find_tensor(ld->g, "token_embd.weight");
    if (it < 0)
        return fail(ld, SI_E_FORMAT, "missing tensor token_embd.weight");
    if (si_gguf_get_arr(ld->g, "tokenizer.ggml.tokens", &t, &n) == SI_OK &&
        (int64_t)n != ld->g->tensors[it].ne[1])
        return fail(ld, SI_E_FORMAT,
                    "the vocabulary has %" PRIu64 " tokens but token_embd has %" PRId64 " rows", n,
                    ld->g->tensors[it].ne[1]);
    if (ld->g->tensors[it].ne[1] <= 0 || ld->g->tensors[it].ne[1] > INT32_MAX)
        return fail(ld, SI_E_FORMAT, "token_embd.weight has an invalid row count");
    hp->n_vocab = (int32_t)ld->g->tensors[it].ne[1];
    return SI_OK;
}

/* Every layer's predictor, blk.N.fc1.weight {n_embd, r} and
 * blk.N.fc2.weight {r, n_ff}, from ld's file into m's layers. */
static int read_predictors(struct loader *ld, struct si_model *m)
{
    const int64_t d = m->hp.n_embd, ff = m->hp.n_ff;
    for (int32_t l = 0; l < m->hp.n_layer; l++) {
        struct si_layer *L = &m->w.layers[l];
        char name[64];
        snprintf(name, sizeof name, "blk.%d.fc1.weight", l);
        const int64_t it = si_gguf_find_tensor(ld->g, name);
        if (it < 0)
            return fail(ld, SI_E_FORMAT, "missing tensor %s", name);
        const int64_t r = ld->g->tensors[it].ne[1];
        int rc;
        if ((rc = tensor(ld, &L->fc1, true, d, r, "blk.%d.fc1.weight", l)) != SI_OK ||
            (rc = tensor(ld, &L->fc2, true, r, ff, "blk.%d.fc2.weight", l)) != SI_OK)
            return rc;
    }
    return SI_OK;
}

/* The predictors' keys in ld's file: powerinfer.sparse_threshold (0 when
 * absent) and SI_PREDICTOR_INPUT_KEY (the residual when absent, as in
 * PowerInfer's files). */
static int read_pred_keys(struct loader *ld, struct si_model *m)
{
    double thr = 0.0;
    si_gguf_get_f64(ld->g, "powerinfer.sparse_threshold", &thr);
    if (!isfinite(thr))
        return fail(ld, SI_E_FORMAT, "powerinfer.sparse_threshold is not finite");
    m->predictor_threshold = (float)thr;
    struct si_gguf_str pin = {0};
    const int rc = si_gguf_get_str(ld->g, SI_PREDICTOR_INPUT_KEY, &pin);
    m->pred_input = SI_PRED_RESIDUAL;
    if (rc == SI_E_NOT_FOUND)
        return SI_OK;
    if (rc != SI_OK)
        return fail(ld, SI_E_FORMAT, "%s is not a string", SI_PREDICTOR_INPUT_KEY);
    if (si_pred_input_parse(pin.data, pin.len, &m->pred_input) != SI_OK)
        return fail(ld, SI_E_FORMAT, "%s '%.*s' is not 'ffn', 'layer' or 'residual'",
                    SI_PREDICTOR_INPUT_KEY, (int)pin.len > 32 ? 32 : (int)pin.len, pin.data);
    return SI_OK;
}

static int read_weights(struct loader *ld, struct si_model *m)
{
    const struct si_hparams *hp = &m->hp;
    struct si_weights *w = &m->w;
    const int64_t d = hp->n_embd, ff = hp->n_ff, qd = (int64_t)hp->n_head * hp->head_dim,
                  kvd = (int64_t)hp->n_head_kv * hp->head_dim;
    const bool ln = hp->norm_kind == SI_NORM_LAYER;
    int rc;
    if ((rc = tensor(ld, &w->token_embd, true, d, hp->n_vocab, "token_embd.weight")) != SI_OK ||
        (rc = tensor(ld, &w->output_norm, true, d, 0, "output_norm.weight")) != SI_OK ||
        (rc = tensor(ld, &w->output_norm_b, ln, d, 0, "output_norm.bias")) != SI_OK ||
        (rc = tensor(ld, &w->output, false, d, hp->n_vocab, "output.weight")) != SI_OK)
        return rc;
    if (w->output.data == NULL)
        w->output = w->token_embd; /* tied embeddings */
    if (hp->rope_kind == SI_ROPE_NONE &&
        (rc = tensor(ld, &w->pos_embd, true, d, hp->n_ctx_train, "position_embd.weight")) != SI_OK)
        return rc;

    w->layers = calloc((size_t)hp->n_layer, sizeof *w->layers);
    if (w->layers == NULL)
        return fail(ld, SI_E_NOMEM, "out of memory");
    m->has_predictor = si_gguf_find_tensor(ld->g, "blk.0.fc1.weight") >= 0;
    for (int32_t l = 0; l < hp->n_layer; l++) {
        struct si_layer *L = &w->layers[l];
        const bool opt = hp->arch == SI_ARCH_OPT;
        if ((rc = tensor(ld, &L->attn_norm, true, d, 0, "blk.%d.attn_norm.weight", l)) != SI_OK ||
            (rc = tensor(ld, &L->attn_norm_b, ln, d, 0, "blk.%d.attn_norm.bias", l)) != SI_OK ||
            (rc = qkv(ld, L, l, d, qd, kvd)) != SI_OK ||
            (rc = tensor(ld, &L->wo, true, qd, d, "blk.%d.attn_output.weight", l)) != SI_OK ||
            (rc = tensor(ld, &L->bq, opt, qd, 0, "blk.%d.attn_q.bias", l)) != SI_OK ||
            (rc = tensor(ld, &L->bk, opt, kvd, 0, "blk.%d.attn_k.bias", l)) != SI_OK ||
            (rc = tensor(ld, &L->bv, opt, kvd, 0, "blk.%d.attn_v.bias", l)) != SI_OK ||
            (rc = tensor(ld, &L->bo, opt, d, 0, "blk.%d.attn_output.bias", l)) != SI_OK)
            return rc;
        if (hp->parallel_residual) {
            if ((rc = tensor(ld, &L->attn_norm2, false, d, 0, "blk.%d.attn_norm_2.weight", l)) !=
                    SI_OK ||
                (rc = tensor(ld, &L->attn_norm2_b, false, d, 0, "blk.%d.attn_norm_2.bias", l)) !=
                    SI_OK)
                return rc;
        } else {
            if ((rc = tensor(ld, &L->ffn_norm, true, d, 0, "blk.%d.ffn_norm.weight", l)) != SI_OK ||
                (rc = tensor(ld, &L->ffn_norm_b, ln, d, 0, "blk.%d.ffn_norm.bias", l)) != SI_OK)
                return rc;
        }
        const bool gated = hp->ffn_kind != SI_FFN_PLAIN;
        /* The down projection: ffn_down, or ffn_down_t alone (a row per
         * neuron), as PowerInfer's files hold it; every path that reads
         * ffn_down reads ffn_down_t instead then (si_model_down_t_only). */
        if ((rc = tensor(ld, &L->ffn_gate, gated, d, ff, "blk.%d.ffn_gate.weight", l)) != SI_OK ||
            (rc = tensor(ld, &L->ffn_up, true, d, ff, "blk.%d.ffn_up.weight", l)) != SI_OK ||
            (rc = tensor(ld, &L->ffn_down_t, false, d, ff, "blk.%d.ffn_down_t.weight", l)) !=
                SI_OK ||
            (rc = tensor(ld, &L->ffn_down, false, ff, d, "blk.%d.ffn_down.weight", l)) != SI_OK ||
            (rc = tensor(ld, &L->ffn_up_b, opt, ff, 0, "blk.%d.ffn_up.bias", l)) != SI_OK ||
            (rc = tensor(ld, &L->ffn_down_b, false, d, 0, "blk.%d.ffn_down.bias", l)) != SI_OK)
            return rc;
        /* (PowerInfer's OPT files name the down projection's bias after
         * ffn_down_t) */
        if (opt && L->ffn_down_b.data == NULL &&
            (rc = tensor(ld, &L->ffn_down_b, true, d, 0, "blk.%d.ffn_down%s.bias", l,
                         L->ffn_down.data != NULL ? "" : "_t")) != SI_OK)
            return rc;
        if (L->ffn_down.data == NULL && L->ffn_down_t.data == NULL)
            return fail(ld, SI_E_FORMAT,
                        "missing tensor blk.%d.ffn_down.weight (nor ffn_down_t, PowerInfer's)", l);
        if ((L->ffn_down.data == NULL) != (w->layers[0].ffn_down.data == NULL))
            return fail(ld, SI_E_FORMAT,
                        "blk.%d.ffn_down.weight: some layers have ffn_down and others only "
                        "ffn_down_t",
                        l);
        if ((rc = tcopy(ld, &L->wq_t, qd, d, "attn_q_t", l)) != SI_OK ||
            (rc = tcopy(ld, &L->wk_t, kvd, d, "attn_k_t", l)) != SI_OK ||
            (rc = tcopy(ld, &L->wv_t, kvd, d, "attn_v_t", l)) != SI_OK ||
            (rc = tcopy(ld, &L->wo_t, d, qd, "attn_output_t", l)) != SI_OK ||
            (rc = tcopy(ld, &L->ffn_gate_t, ff, d, "ffn_gate_t", l)) != SI_OK ||
            (rc = tcopy(ld, &L->ffn_up_t, ff, d, "ffn_up_t", l)) != SI_OK ||
            (rc = tcopy(ld, &L->ffn_down_c, d, ff, "ffn_down_c", l)) != SI_OK)
            return rc;
        if (hp->arch == SI_ARCH_GEMMA3) {
            if ((rc = tensor(ld, &L->q_norm, true, hp->head_dim, 0, "blk.%d.attn_q_norm.weight",
                             l)) != SI_OK ||
                (rc = tensor(ld, &L->k_norm, true, hp->head_dim, 0, "blk.%d.attn_k_norm.weight",
                             l)) != SI_OK ||
                (rc = tensor(ld, &L->attn_post_norm, true, d, 0,
                             "blk.%d.post_attention_norm.weight", l)) != SI_OK ||
                (rc = tensor(ld, &L->ffn_post_norm, true, d, 0, "blk.%d.post_ffw_norm.weight",
                             l)) != SI_OK)
                return rc;
        }
    }
    return m->has_predictor ? read_predictors(ld, m) : SI_OK;
}

/* The FFN activation: starinfer.ffn_activation when present, else the
 * architecture's own (PowerInfer llama files are ReLU-LLaMA). */
static int read_activation(struct loader *ld, struct si_model *m)
{
    struct si_gguf_str s;
    int rc = si_gguf_get_str(ld->g, "starinfer.ffn_activation", &s);
    if (rc == SI_E_NOT_FOUND)
        return SI_OK;
    if (rc != SI_OK)
        return fail(ld, SI_E_FORMAT, "starinfer.ffn_activation is not a string");
    if (si_gguf_str_eq(s, "relu"))
        m->hp.act = SI_ACT_RELU;
    else if (si_gguf_str_eq(s, "silu"))
        m->hp.act = SI_ACT_SILU;
    else if (si_gguf_str_eq(s, "gelu"))
        m->hp.act = SI_ACT_GELU;
    else
        return fail(ld, SI_E_UNSUPPORTED, "unknown starinfer.ffn_activation '%.*s'", (int)s.len,
                    s.data);
    return SI_OK;
}

/* What g holds when it is one of the other GGUF files that starinfer (or
 * PowerInfer) writes, for a message when one is given as a model; NULL when
 * it is none of them.  arch: its general.architecture, or NULL. */
static const char *not_a_model(const struct si_gguf *g, const struct si_gguf_str *arch)
{
    if (arch != NULL && si_gguf_str_eq(*arch, "starinfer.flash"))
        return "a starinfer flash store (starinfer convert)";
    if (arch != NULL && si_gguf_str_eq(*arch, "generic.gpu_index"))
        return "a GPU placement (starinfer place, or PowerInfer's GPU index)";
    if (si_gguf_find_key(g, "starinfer.profile.n_layer") >= 0)
        return "a starinfer activation profile (starinfer profile)";
    if (arch != NULL && si_gguf_str_eq(*arch, SI_PRED_FILE_ARCH))
        return "a predictor file (train-predictor --predictors-only: give it with --predictors)";
    if (si_gguf_find_key(g, "starinfer.samples.n") >= 0)
        return "starinfer's predictor training samples (train-predictor --samples)";
    return NULL;
}

int si_model_from_gguf(struct si_model **out, struct si_gguf *g, char *err, size_t err_size)
{
    *out = NULL;
    struct loader ld = {.g = g, .err = err, .err_size = err_size};
    struct si_gguf_str arch;
    const bool has_arch = si_gguf_get_str(g, "general.architecture", &arch) == SI_OK;
    const char *other = not_a_model(g, has_arch ? &arch : NULL);
    if (other != NULL)
        return fail(&ld, SI_E_FORMAT, "%s, not a model", other);
    if (!has_arch)
        return fail(&ld, SI_E_FORMAT, "missing or non-string metadata key general.architecture");
    int a = -1;
    for (int i = 0; i < SI_ARCH_COUNT; i++)
        if (si_gguf_str_eq(arch, arch_names[i]))
            a = i;
    if (a < 0)
        return fail(&ld, SI_E_UNSUPPORTED,
                    "architecture '%.*s' is not supported (llama, bamboo, opt, falcon, gemma3 are)",
                    (int)arch.len > 64 ? 64 : (int)arch.len, arch.data);
    ld.arch = arch_names[a];

    struct si_model *m = calloc(1, sizeof *m);
    if (m == NULL)
        return fail(&ld, SI_E_NOMEM, "out of memory");
    struct si_hparams *hp = &m->hp;
    hp->arch = (enum si_arch)a;
    switch (hp->arch) {
    case SI_ARCH_LLAMA:
        hp->act = g->powerinfer ? SI_ACT_RELU : SI_ACT_SILU;
        hp->ffn_kind = SI_FFN_GATED;
        hp->norm_kind = SI_NORM_RMS;
        hp->rope_kind = SI_ROPE_NORM;
        break;
    case SI_ARCH_BAMBOO:
        hp->act = SI_ACT_RELU;
        hp->ffn_kind = SI_FFN_GATED_RELU2;
        hp->norm_kind = SI_NORM_RMS;
        hp->rope_kind = SI_ROPE_NORM;
        break;
    case SI_ARCH_OPT:
        hp->act = SI_ACT_RELU;
        hp->ffn_kind = SI_FFN_PLAIN;
        hp->norm_kind = SI_NORM_LAYER;
        hp->rope_kind = SI_ROPE_NONE;
        break;
    case SI_ARCH_FALCON:
        /* PowerInfer's Falcon files are ReluFalcon's: ReLU (its FFN, sparse
         * or dense, applies ReLU to every Falcon) */
        hp->act = g->powerinfer ? SI_ACT_RELU : SI_ACT_GELU;
        hp->ffn_kind = SI_FFN_PLAIN;
        hp->norm_kind = SI_NORM_LAYER;
        hp->rope_kind = SI_ROPE_NEOX;
        hp->parallel_residual = true;
        break;
    case SI_ARCH_GEMMA3:
        hp->act = SI_ACT_GELU;
        hp->ffn_kind = SI_FFN_GATED;
        hp->norm_kind = SI_NORM_RMS;
        hp->rope_kind = SI_ROPE_NEOX;
        break;
    default:
        break;
    }
    int rc;
    if ((rc = read_activation(&ld, m)) != SI_OK || (rc = read_hparams(&ld, m)) != SI_OK ||
        (rc = read_weights(&ld, m)) != SI_OK) {
        free(m->w.layers);
        free(m);
        return rc;
    }
    m->hp.n_ctx_train -= m->hp.pos_offset; /* the positions a sequence may use */
    if ((rc = read_pred_keys(&ld, m)) != SI_OK) {
        free(m->w.layers);
        free(m);
        return rc;
    }
    m->gguf = g;
    *out = m;
    return SI_OK;
}

const char *si_pred_input_name(enum si_pred_input in)
{
    return in == SI_PRED_FFN ? "ffn" : in == SI_PRED_LAYER ? "layer" : "residual";
}

int si_pred_input_parse(const char *s, size_t n, enum si_pred_input *in)
{
    static const enum si_pred_input all[] = {SI_PRED_RESIDUAL, SI_PRED_FFN, SI_PRED_LAYER};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) {
        const char *name = si_pred_input_name(all[i]);
        if (strlen(name) == n && !memcmp(s, name, n)) {
            *in = all[i];
            return SI_OK;
        }
    }
    return SI_E_INVALID;
}

int si_model_load(struct si_model **out, const char *path, char *err, size_t err_size)
{
    *out = NULL;
    struct si_gguf *g = NULL;
    int rc = si_gguf_open(&g, path, err, err_size);
    if (rc != SI_OK)
        return rc;
    char msg[512];
    rc = si_model_from_gguf(out, g, msg, sizeof msg);
    if (rc != SI_OK) {
        snprintf(err, err_size, "%s: %s", path, msg);
        si_gguf_free(g);
    }
    return rc;
}

void si_model_free(struct si_model *m)
{
    if (m == NULL)
        return;
    free(m->w.layers);
    si_gguf_free(m->gguf);
    si_gguf_free(m->pred_gguf);
    free(m);
}

uint64_t si_model_ffn_hash(const struct si_model *m)
{
    uint64_t h = SI_FNV_BASIS;
    for (int32_t l = 0; l < m->hp.n_layer; l++) {
        const struct si_layer *W = &m->w.layers[l];
        const struct si_tensor *down = W->ffn_down.data != NULL ? &W->ffn_down : &W->ffn_down_t;
        h = si__fnv1a(h, si_file_row(&W->ffn_up, 0), W->ffn_up.row_bytes);
        h = si__fnv1a(h, si_file_row(&W->ffn_up, W->ffn_up.ne[1] - 1), W->ffn_up.row_bytes);
        if (W->ffn_gate.data != NULL)
            h = si__fnv1a(h, si_file_row(&W->ffn_gate, 0), W->ffn_gate.row_bytes);
        h = si__fnv1a(h, si_file_row(down, 0), down->row_bytes);
    }
    return h;
}

/* A predictor file's shape key `k` as an int32 (0 when absent or invalid). */
static int32_t pred_file_dim(const struct si_gguf *g, const char *k)
{
    uint64_t v = 0;
    return si_gguf_get_u64(g, k, &v) == SI_OK && v <= INT32_MAX ? (int32_t)v : 0;
}

/* Whether g is a predictor file made for m: SI_OK, or the reason in ld. */
static int pred_file_check(struct loader *ld, const struct si_model *m)
{
    struct si_gguf_str arch = {0, ""};
    if (si_gguf_get_str(ld->g, "general.architecture", &arch) != SI_OK ||
        !si_gguf_str_eq(arch, SI_PRED_FILE_ARCH))
        return fail(ld, SI_E_FORMAT,
                    "not a predictor file (general.architecture '%.*s', not '%s': "
                    "train-predictor --predictors-only writes one)",
                    (int)(arch.len > 32 ? 32 : arch.len), arch.data, SI_PRED_FILE_ARCH);
    const int32_t nl = pred_file_dim(ld->g, SI_PRED_FILE_KEY("n_layer")),
                  d = pred_file_dim(ld->g, SI_PRED_FILE_KEY("n_embd")),
                  ff = pred_file_dim(ld->g, SI_PRED_FILE_KEY("n_ff"));
    const struct si_hparams *hp = &m->hp;
    if (nl != hp->n_layer || d != hp->n_embd || ff != hp->n_ff)
        return fail(ld, SI_E_FORMAT,
                    "predictors for a model of %" PRId32 " layers, %" PRId32 " wide, %" PRId32
                    " neurons, not this one's %" PRId32 ", %" PRId32 ", %" PRId32,
                    nl, d, ff, hp->n_layer, hp->n_embd, hp->n_ff);
    uint64_t h = 0;
    if (si_gguf_get_u64(ld->g, SI_PRED_FILE_KEY("model_hash"), &h) != SI_OK)
        return fail(ld, SI_E_FORMAT, "missing key %s", SI_PRED_FILE_KEY("model_hash"));
    const uint64_t mine = si_model_ffn_hash(m);
    if (h != mine)
        return fail(ld, SI_E_FORMAT,
                    "predictors trained on another model's weights (its FFN fingerprint "
                    "%016" PRIx64 ", this model's %016" PRIx64 ")",
                    h, mine);
    return SI_OK;
}

int si_model_attach_predictors(struct si_model *m, const char *path, char *err, size_t err_size)
{
    struct si_gguf *g = NULL;
    int rc = si_gguf_open(&g, path, err, err_size);
    if (rc != SI_OK)
        return rc;
    char msg[400];
    struct loader ld = {.g = g, .arch = SI_PRED_FILE_ARCH, .err = msg, .err_size = sizeof msg};
    /* read into a copy of the layers: m is left as it was on any failure */
    struct si_model tmp = *m;
    tmp.w.layers = malloc((size_t)m->hp.n_layer * sizeof *tmp.w.layers);
    if (tmp.w.layers == NULL) {
        rc = fail(&ld, SI_E_NOMEM, "out of memory");
    } else {
        memcpy(tmp.w.layers, m->w.layers, (size_t)m->hp.n_layer * sizeof *tmp.w.layers);
        if ((rc = pred_file_check(&ld, m)) == SI_OK && (rc = read_predictors(&ld, &tmp)) == SI_OK)
            rc = read_pred_keys(&ld, &tmp);
    }
    if (rc != SI_OK) {
        snprintf(err, err_size, "%s: %s", path, msg);
        free(tmp.w.layers);
        si_gguf_free(g);
        return rc;
    }
    for (int32_t l = 0; l < m->hp.n_layer; l++) {
        m->w.layers[l].fc1 = tmp.w.layers[l].fc1;
        m->w.layers[l].fc2 = tmp.w.layers[l].fc2;
    }
    free(tmp.w.layers);
    m->predictor_threshold = tmp.predictor_threshold;
    m->pred_input = tmp.pred_input;
    m->has_predictor = true;
    si_gguf_free(m->pred_gguf);
    m->pred_gguf = g;
    return SI_OK;
}

int64_t si_model_token_bytes(const struct si_model *m, int64_t *ffn)
{
    return si_model_range_bytes(m, 0, m->hp.n_layer, true, true, ffn);
}

int64_t si_model_range_bytes(const struct si_model *m, int32_t l0, int32_t l1, bool first,
                             bool last, int64_t *ffn)
{
    int64_t total = 0, f = 0;
    for (int32_t l = l0; l < l1; l++) {
        const struct si_layer *L = &m->w.layers[l];
        const struct si_tensor *other[] = {
            &L->attn_norm, &L->attn_norm_b, &L->attn_norm2, &L->attn_norm2_b, &L->wq, &L->wk,
            &L->wv,        &L->wo,          &L->bq,         &L->bk,           &L->bv, &L->bo,
            &L->q_norm,    &L->k_norm,      &L->attn_post_norm, &L->ffn_norm, &L->ffn_norm_b,
            &L->ffn_post_norm};
        /* (the down projection: ffn_down, or ffn_down_t where it is alone) */
        const struct si_tensor *ffn_t[] = {&L->ffn_gate, &L->ffn_up,
                                           L->ffn_down.data != NULL ? &L->ffn_down
                                                                    : &L->ffn_down_t,
                                           &L->ffn_up_b, &L->ffn_down_b};
        for (size_t i = 0; i < sizeof other / sizeof *other; i++)
            total += other[i]->data != NULL ? (int64_t)other[i]->nbytes : 0;
        for (size_t i = 0; i < sizeof ffn_t / sizeof *ffn_t; i++)
            f += ffn_t[i]->data != NULL ? (int64_t)ffn_t[i]->nbytes : 0;
    }
    const struct si_weights *w = &m->w;
    if (first) {
        total += (int64_t)w->token_embd.row_bytes;
        total += w->pos_embd.data != NULL ? (int64_t)w->pos_embd.row_bytes : 0;
    }
    if (last) {
        total += (int64_t)w->output.nbytes;
        total += w->output_norm.data != NULL ? (int64_t)w->output_norm.nbytes : 0;
        total += w->output_norm_b.data != NULL ? (int64_t)w->output_norm_b.nbytes : 0;
    }
    if (ffn != NULL)
        *ffn = f;
    return total + f;
}
