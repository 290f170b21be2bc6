/* forward.c - the reference forward pass, one token at a time. */
#include "model/forward.h"

#include "model/act.h"
#include "model/colblock.h"
#include "model/kernels.h"
#include "model/line_alloc.h"
#include "model/pack8.h"
#include "model/quants.h"
#include "model/types.h"
#include "starinfer.h"

#include <assert.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct si_ref_params si_ref_default_params(void)
{
    return (struct si_ref_params){.n_ctx = 0,
                                  .kv_f16 = true,
                                  .type_k = SI_TYPE_F16,
                                  .type_v = SI_TYPE_F16,
                                  .act_quant = true};
}

/* ------------------------------------------------------------ small kernels */

/*
 * y = W x for W stored as rows of ne[0] elements: y[r] = row_r . x.  With
 * act_quant, x is first converted to the row type's dot type (as llama.cpp
 * does), else each row is dotted with x in float.
 */
void si_ref_matvec(bool act_quant, void *xq, float *y, const struct si_tensor *w, const float *x)
{
    if (act_quant) {
        si_quantize_act(si_act_type(w->type), x, xq, w->ne[0]);
        si_ref_matvec_act(y, w, xq);
        return;
    }
    assert(w->pk == 0 && "packed rows need converted activations");
    const char *row = w->data;
    for (int64_t r = 0; r < w->ne[1]; r++, row += w->row_bytes)
        y[r] = si_vec_dot(w->type, row, x, w->ne[0]);
}

void si_ref_matvec_act(float *y, const struct si_tensor *w, const void *xq)
{
    const char *row = w->data;
    int64_t r = 0;
    for (; r < w->pk; r += 8, row += 8 * w->row_bytes) {
        if (r + 8 <= w->pk) {
            si_vec_dot_act8(w->type, row, xq, w->ne[0], y + r);
        } else {
            /* the view ends inside this group: its first rows only */
            float g[8];
            si_vec_dot_act8(w->type, row, xq, w->ne[0], g);
            memcpy(y + r, g, (size_t)(w->pk - r) * sizeof *g);
        }
    }
    row = (const char *)w->data + (size_t)w->pk * w->row_bytes;
    for (r = w->pk; r < w->ne[1]; r++, row += w->row_bytes)
        y[r] = si_vec_dot_act(w->type, row, xq, w->ne[0]);
}

void si_ref_matvec_cols(bool act_quant, void *xq, float *y, const struct si_tensor *w,
                        const float *x, int64_t c0, int64_t c1)
{
    const struct si_type_traits *tt = si_type_get(w->type);
    assert(tt != NULL && c0 % tt->block == 0 && c1 % tt->block == 0 && c0 < c1 && c1 <= w->ne[0] &&
           "a column range on the type's blocks");
    const int64_t n = c1 - c0, b0 = c0 / tt->block;
    const size_t off = (size_t)b0 * tt->size; /* in a row; 8 times that in a packed group */
    const char *row = w->data;
    if (!act_quant) {
        assert(w->pk == 0 && "packed rows need converted activations");
        for (int64_t r = 0; r < w->ne[1]; r++, row += w->row_bytes)
            y[r] = si_vec_dot(w->type, row + off, x + c0, n);
        return;
    }
    si_quantize_act(si_act_type(w->type), x + c0, xq, n);
    /* the range's bytes in the next group are 8 rows on: the kernels
     * prefetch into them (si_vec_dot_act8_next) */
    int64_t r = 0;
    for (; r < w->pk; r += 8, row += 8 * w->row_bytes) {
        float g[8];
        si_vec_dot_act8_next(w->type, row + 8 * off, xq, n, r + 8 <= w->pk ? y + r : g,
                             row + 8 * w->row_bytes + 8 * off);
        if (r + 8 > w->pk) /* the view ends inside this group: its first rows only */
            memcpy(y + r, g, (size_t)(w->pk - r) * sizeof *g);
    }
    row = (const char *)w->data + (size_t)w->pk * w->row_bytes;
    for (r = w->pk; r < w->ne[1]; r++, row += w->row_bytes)
        y[r] = si_vec_dot_act(w->type, row + off, xq, n);
}

const void *si_tensor_row(const struct si_tensor *w, int64_t r, void *buf)
{
    if (r >= w->pk)
        return si_file_row(w, r);
    const char *group = (const char *)w->data + (size_t)(r / 8) * 8 * w->row_bytes;
    si_unpack8_row(w->type, group, (int)(r % 8), w->ne[0], buf);
    return buf;
}

/* y = W x as si_ref_matvec, or as llama.cpp multiplies a token of a batch of
 * n_tok (group4: in a full group of 4) when n_tok > 1. */
static void matvec_as(const struct si_ref *s, int32_t n_tok, bool group4, float *y,
                      const struct si_tensor *w, const float *x)
{
    if (n_tok <= 1 || !s->p.act_quant || w->pk > 0) {
        /* (packed rows are of types whose batched dots are their dots) */
        si_ref_matvec(s->p.act_quant, s->xq, y, w, x);
        return;
    }
    si_quantize_act(si_act_type(w->type), x, s->xq, w->ne[0]);
    const char *row = w->data;
    for (int64_t r = 0; r < w->ne[1]; r++, row += w->row_bytes)
        y[r] = si_vec_dot_act_batch(w->type, row, s->xq, w->ne[0], n_tok, group4);
}

static void matvec(const struct si_ref *s, float *y, const struct si_tensor *w, const float *x)
{
    matvec_as(s, s->batch_n, s->batch_g4, y, w, x);
}

void si_ref_matvec_t(const struct si_tensor *wt, int64_t c0, int64_t c1, const float *x, float *y)
{
    if (wt->cb_scale != NULL) {
        si_cb_matvec(wt, c0, c1, x, y); /* the kernel in use, as for every dot here */
        return;
    }
    size_t off = 0;
    si_type_row_size(wt->type, c0, &off);
    memset(y, 0, (size_t)(c1 - c0) * sizeof *y);
    const char *row = (const char *)wt->data + off;
    for (int64_t i = 0; i < wt->ne[1]; i++, row += wt->row_bytes)
        if (x[i] != 0.0f)
            si_vec_mad(wt->type, row, x[i], y, c1 - c0);
}

float si_ref_input_threshold(const struct si_ref_params *p, int l, int kind)
{
    return p->input_thresholds != NULL ? p->input_thresholds[(size_t)l * SI_INPUT_KINDS + kind]
                                       : 0.0f;
}

const struct si_tensor *si_ref_down_copy(const struct si_model *m, const struct si_layer *L)
{
    /* ReLU's activations are mostly exact zeros: the rows of the few others,
     * without a block's scales for each of them (docs/measurements.md) */
    if (m->hp.act == SI_ACT_RELU && L->ffn_down_t.data != NULL)
        return &L->ffn_down_t;
    return L->ffn_down_c.data != NULL ? &L->ffn_down_c : &L->ffn_down_t;
}

bool si_ref_reads_t(const struct si_ref_params *p, const struct si_model *m, int l, int kind)
{
    if (!p->input_t || p->input_thresholds == NULL)
        return false;
    const struct si_layer *L = &m->w.layers[l];
    const bool thr = si_ref_input_threshold(p, l, kind) > 0.0f;
    switch (kind) {
    case SI_INPUT_QKV:
        return thr && L->wq_t.data != NULL && L->wk_t.data != NULL && L->wv_t.data != NULL;
    case SI_INPUT_O:
        return thr && L->wo_t.data != NULL;
    case SI_INPUT_FFN:
        return thr && L->ffn_up_t.data != NULL &&
               (m->hp.ffn_kind == SI_FFN_PLAIN || L->ffn_gate_t.data != NULL);
    case SI_INPUT_DOWN: {
        /* ReLU's own zeros: worth the copy whenever the layer is sparse */
        bool on = thr;
        for (int k = 0; !on && m->hp.act == SI_ACT_RELU && k < SI_INPUT_KINDS; k++)
            on = si_ref_input_threshold(p, l, k) > 0.0f;
        return on && si_ref_down_copy(m, L)->data != NULL;
    }
    default:
        return false;
    }
}

int64_t si_ref_predict(const struct si_tensor *fc1, const struct si_tensor *fc2, float threshold,
                       bool act_quant, void *xq, const float *x, float *r1, float *y,
                       uint8_t *active)
{
    si_ref_matvec(act_quant, xq, r1, fc1, x);
    for (int64_t i = 0; i < fc1->ne[1]; i++)
        r1[i] = r1[i] > 0.0f ? r1[i] : 0.0f;
    si_ref_matvec(act_quant, xq, y, fc2, r1);
    int64_t n = 0;
    for (int64_t i = 0; i < fc2->ne[1]; i++) {
        active[i] = y[i] >= threshold;
        n += active[i];
    }
    return n;
}

/* y += b, when the bias exists. */
static void add_bias(float *y, const struct si_tensor *b, int64_t n)
{
    if (b->data == NULL)
        return;
    const float *bv = b->data; /* norms and biases are F32 in every supported file */
    for (int64_t i = 0; i < n; i++)
        y[i] += bv[i];
}

/* y += b[off .. off + n), when the bias exists (y: that part's values). */
static void add_bias_at(float *y, const struct si_tensor *b, int64_t off, int64_t n)
{
    if (b->data == NULL)
        return;
    const float *bv = (const float *)b->data + off;
    for (int64_t i = 0; i < n; i++)
        y[i] += bv[i];
}

/* A 1-D weight as floats (F32 in files; other types dequantized into tmp). */
static const float *vec_f32(const struct si_tensor *t, float *tmp)
{
    if (t->type == SI_TYPE_F32)
        return t->data;
    si_dequantize_row(t->type, t->data, tmp, t->ne[0]);
    return tmp;
}

/* ------------------------------------------------------------ state */

/* Scratch of the tiled and the split attention (attn_tile). */
static size_t tile_floats(const struct si_hparams *hp, int n_ctx)
{
    const size_t a = si_k_attn_tiled_scratch(hp->head_dim, hp->n_head),
                 b = si_k_attn_split_scratch(hp->head_dim, hp->n_head, n_ctx);
    return a > b ? a : b;
}

int si_ref_init(struct si_ref **out, const struct si_model *m, struct si_ref_params p, char *err,
                size_t err_size)
{
    *out = NULL;
    const struct si_hparams *hp = &m->hp;
    if (p.n_ctx <= 0)
        p.n_ctx = hp->n_ctx_train < 4096 ? hp->n_ctx_train : 4096;
    if (p.n_ctx > hp->n_ctx_train && hp->rope_kind == SI_ROPE_NONE) {
        snprintf(err, err_size, "context %d is longer than the model's %d learned positions",
                 p.n_ctx, hp->n_ctx_train);
        return SI_E_INVALID;
    }
    if ((int64_t)p.n_ctx > (int64_t)SI_ATTN_MAX_CHUNKS * SI_ATTN_CHUNK) {
        snprintf(err, err_size, "context %d is longer than the %d positions attention supports",
                 p.n_ctx, SI_ATTN_MAX_CHUNKS * SI_ATTN_CHUNK);
        return SI_E_INVALID;
    }
    for (int i = 0; i < 2 && p.kv_f16; i++) {
        const uint32_t t = i ? p.type_v : p.type_k;
        if (t != SI_TYPE_F16 && t != SI_TYPE_Q8_0 && t != SI_TYPE_Q4_0) {
            snprintf(err, err_size, "%s cache type %s: f16, q8_0 or q4_0 only", i ? "V" : "K",
                     si_type_name(t));
            return SI_E_INVALID;
        }
        if (t != SI_TYPE_F16 && hp->head_dim % 32 != 0) {
            snprintf(err, err_size,
                     "a %s %s cache needs a head size that is a multiple of 32 (the model's is "
                     "%d)",
                     si_type_name(t), i ? "V" : "K", hp->head_dim);
            return SI_E_INVALID;
        }
    }
    if (p.down_t && m->w.layers[0].ffn_down_t.data == NULL) {
        snprintf(err, err_size, "the model has no ffn_down_t tensors");
        return SI_E_INVALID;
    }
    if (p.predictor && !m->has_predictor) {
        snprintf(err, err_size, "the model has no predictor (blk.N.fc1/fc2) tensors");
        return SI_E_INVALID;
    }
    struct si_ref *s = calloc(1, sizeof *s);
    if (s == NULL)
        goto oom;
    s->m = m;
    s->lm_head = &m->w.output;
    s->p = p;
    const size_t d = (size_t)hp->n_embd, qd = (size_t)hp->n_head * hp->head_dim,
                 kvd = (size_t)hp->n_head_kv * hp->head_dim, ff = (size_t)hp->n_ff;
    s->x = calloc(d, sizeof(float));
    s->xb = calloc(d > qd ? d : qd, sizeof(float));
    s->xb2 = calloc(d, sizeof(float));
    s->q = calloc(qd, sizeof(float));
    s->k = calloc(kvd, sizeof(float));
    s->v = calloc(kvd, sizeof(float));
    s->att = calloc(qd, sizeof(float));
    s->score = calloc((size_t)hp->n_head * (size_t)p.n_ctx, sizeof(float));
    size_t widest = d > qd ? d : qd, rank = 0;
    widest = widest > ff ? widest : ff;
    for (int l = 0; m->has_predictor && l < hp->n_layer; l++)
        rank = (size_t)m->w.layers[l].fc1.ne[1] > rank ? (size_t)m->w.layers[l].fc1.ne[1] : rank;
    widest = widest > rank ? widest : rank;
    s->r1 = calloc(rank + 1, sizeof(float));
    s->krow = calloc(kvd, sizeof(float));
    s->xq = malloc(4 * widest + 512); /* F32 is the widest dot type: 4 bytes a value */
    /* si_k_attn_f16's scratch: the fp16 query, then the value accumulator. */
    s->q16 = calloc(2 * (size_t)hp->head_dim, sizeof(uint16_t));
    s->vkq16 = s->q16 != NULL ? s->q16 + hp->head_dim : NULL;
    s->hg = calloc(ff, sizeof(float));
    s->hu = calloc(ff, sizeof(float));
    s->mask = calloc(ff, 1);
    s->logits = calloc((size_t)hp->n_vocab, sizeof(float));
    s->n_active = calloc((size_t)hp->n_layer, sizeof(int64_t));
    s->xb3 = calloc(d, sizeof(float));
    s->xa = calloc(d, sizeof(float));
    s->tmp = calloc(2 * (d > (size_t)hp->head_dim ? d : (size_t)hp->head_dim), sizeof(float));
    s->attn_tile = si_line_alloc(tile_floats(hp, p.n_ctx) * sizeof(float));
    const size_t cache = (size_t)hp->n_layer * (size_t)p.n_ctx;
    s->kcache = calloc(cache, si_ref_kv_row_bytes(&p, hp, false));
    s->vcache = calloc(cache, si_ref_kv_row_bytes(&p, hp, true));
    if (!s->x || !s->xb || !s->xb2 || !s->q || !s->k || !s->v || !s->att || !s->score || !s->krow ||
        !s->xq || !s->q16 || !s->vkq16 || !s->hg || !s->hu || !s->mask || !s->r1 || !s->logits ||
        !s->n_active || !s->xb3 || !s->xa || !s->tmp || !s->attn_tile || !s->kcache || !s->vcache)
        goto oom;
    *out = s;
    return SI_OK;
oom:
    si_ref_free(s);
    snprintf(err, err_size, "out of memory for a context of %d tokens", p.n_ctx);
    return SI_E_NOMEM;
}

void si_ref_free(struct si_ref *s)
{
    if (s == NULL)
        return;
    free(s->x);
    free(s->xb);
    free(s->xb2);
    free(s->q);
    free(s->k);
    free(s->v);
    free(s->att);
    free(s->score);
    free(s->krow);
    free(s->xq);
    free(s->q16);
    free(s->hg);
    free(s->hu);
    free(s->mask);
    free(s->r1);
    free(s->logits);
    free(s->n_active);
    free(s->xb3);
    free(s->xa);
    free(s->tmp);
    free(s->attn_tile);
    free(s->kcache);
    free(s->vcache);
    free(s);
}

void si_ref_reset(struct si_ref *s)
{
    s->n_past = 0;
}

/* Row t of layer l's K (v false) or V cache as floats in dst (kvd of them). */
static void cache_row(const struct si_ref *s, bool v, int l, int t, float *dst, size_t kvd);
static void cache_put(const struct si_ref *s, bool v, int l, int pos, const float *src, size_t kvd,
                      size_t c0, size_t c1);

int si_ref_kv_shift_check(const struct si_ref *s, int32_t n_keep, int32_t n_discard)
{
    const struct si_hparams *hp = &s->m->hp;
    if (n_keep < 0 || n_discard < 1 || (int64_t)n_keep + n_discard > s->n_past)
        return SI_E_INVALID;
    if (hp->rope_kind == SI_ROPE_NONE && s->m->w.pos_embd.data != NULL)
        return SI_E_UNSUPPORTED; /* learned positions: added to the input, not to K */
    return SI_OK;
}

void si_ref_kv_shift_layer(struct si_ref *s, int l, int32_t n_keep, int32_t n_discard,
                           float *row)
{
    const struct si_hparams *hp = &s->m->hp;
    const size_t kvd = (size_t)hp->n_head_kv * (size_t)hp->head_dim;
    const bool local = si_hparams_is_swa(hp, l);
    const float base = local ? hp->rope_base_local : hp->rope_base;
    const float scale = local ? 1.0f : hp->rope_scale;
    for (int32_t p = n_keep + n_discard; p < s->n_past; p++) {
        /* K: rotated by -n_discard positions (RoPE's rotations compose:
         * RoPE(p) then RoPE(-d) is RoPE(p - d)), then stored again */
        cache_row(s, false, l, p, row, kvd);
        si_k_rope(row, hp->n_head_kv, hp->head_dim, hp->n_rot, hp->rope_kind, -n_discard, base,
                  scale);
        cache_put(s, false, l, p - n_discard, row, kvd, 0, kvd);
        cache_row(s, true, l, p, row, kvd);
        cache_put(s, true, l, p - n_discard, row, kvd, 0, kvd);
    }
}

int si_ref_kv_shift(struct si_ref *s, int32_t n_keep, int32_t n_discard)
{
    int rc = si_ref_kv_shift_check(s, n_keep, n_discard);
    if (rc != SI_OK)
        return rc;
    float *row = malloc((size_t)s->m->hp.n_head_kv * (size_t)s->m->hp.head_dim * sizeof *row);
    if (row == NULL)
        return SI_E_NOMEM;
    for (int l = 0; l < s->m->hp.n_layer; l++)
        si_ref_kv_shift_layer(s, l, n_keep, n_discard, row);
    free(row);
    s->n_past -= n_discard;
    return SI_OK;
}

uint32_t si_ref_kv_type(const struct si_ref_params *p, bool v)
{
    return !p->kv_f16 ? SI_TYPE_F32 : v ? p->type_v : p->type_k;
}

size_t si_ref_kv_row_bytes(const struct si_ref_params *p, const struct si_hparams *hp, bool v)
{
    const int64_t kvd = (int64_t)hp->n_head_kv * hp->head_dim;
    size_t b = (size_t)kvd * sizeof(uint16_t);
    si_type_row_size(si_ref_kv_type(p, v), kvd, &b); /* other types: refused by si_ref_init */
    return b;
}

struct si_kv si_ref_kv(const struct si_ref *s, int l)
{
    const size_t kr = si_ref_kv_row_bytes(&s->p, &s->m->hp, false),
                 vr = si_ref_kv_row_bytes(&s->p, &s->m->hp, true),
                 n = (size_t)l * (size_t)s->p.n_ctx;
    return (struct si_kv){(const char *)s->kcache + n * kr,
                          (const char *)s->vcache + n * vr,
                          kr,
                          vr,
                          s->p.type_k,
                          s->p.type_v};
}

/* Row pos of layer l's K or V cache (and its type) at *row. */
static char *cache_at(const struct si_ref *s, bool v, int l, int pos, uint32_t *type)
{
    const size_t rb = si_ref_kv_row_bytes(&s->p, &s->m->hp, v);
    *type = si_ref_kv_type(&s->p, v);
    return (char *)(v ? s->vcache : s->kcache) +
           ((size_t)l * (size_t)s->p.n_ctx + (size_t)pos) * rb;
}

/* Store row `pos` of layer l's K or V cache from src (kvd floats): its
 * elements [c0, c1) (whole blocks of a quantized type: kv heads are). */
static void cache_put(const struct si_ref *s, bool v, int l, int pos, const float *src, size_t kvd,
                      size_t c0, size_t c1)
{
    (void)kvd;
    uint32_t t;
    char *row = cache_at(s, v, l, pos, &t);
    if (t == SI_TYPE_F32) {
        memcpy((float *)row + c0, src + c0, (c1 - c0) * sizeof(float));
    } else if (t == SI_TYPE_F16) { /* (the kernels' conversion: si_fp32_to_fp16's bits) */
        si_quantize_act(SI_TYPE_F16, src + c0, (uint16_t *)row + c0, (int64_t)(c1 - c0));
    } else {
        size_t off = 0;
        si_type_row_size(t, (int64_t)c0, &off);
        si_quantize_row(t, src + c0, row + off, (int64_t)(c1 - c0));
    }
}

/* Normalise x into y with the block's norm weights (RMS or Layer). */
static void norm(const struct si_hparams *hp, float *y, const float *x, const struct si_tensor *w,
                 const struct si_tensor *b, float *tmp)
{
    const float *wv = vec_f32(w, tmp);
    if (hp->norm_kind == SI_NORM_RMS) {
        si_k_rmsnorm(y, x, wv, hp->n_embd, hp->norm_eps);
    } else {
        const float *bv = b->data != NULL ? vec_f32(b, tmp + hp->n_embd) : NULL;
        si_k_layernorm(y, x, wv, bv, hp->n_embd, hp->norm_eps);
    }
}

/* First cached position layer l attends to from `pos` (sliding windows). */
static int attention_start(const struct si_hparams *hp, int l, int pos)
{
    if (si_hparams_is_swa(hp, l) && pos >= hp->sliding_window)
        return pos - hp->sliding_window + 1;
    return 0;
}

/*
 * Attention with the fp16 cache, in llama.cpp's flash-attention arithmetic
 * for one query (si_k_attn_f16: fp16 query and value accumulator, online
 * softmax) over the positions the layer's window allows.
 */
static void attention_f16(const struct si_ref *s, int l, int pos, int h0, int h1,
                          const float *q, float *att, uint16_t *q16)
{
    const struct si_hparams *hp = &s->m->hp;
    const size_t base = (size_t)l * (size_t)s->p.n_ctx * (size_t)hp->n_head_kv * hp->head_dim;
    si_k_attn_f16_heads(att, q, (const uint16_t *)s->kcache + base,
                        (const uint16_t *)s->vcache + base, attention_start(hp, l, pos), pos + 1,
                        h0, h1, hp->n_head, hp->n_head_kv, hp->head_dim, hp->attn_scale, q16);
}

/* The same attention in llama.cpp's tiled flash-attention arithmetic, the
 * path it takes for batches of 64 queries or more (si_k_attn_f16_tiled's
 * steps, over the cache's type). */
static void attention_tiled(const struct si_ref *s, int l, int pos, int h0, int h1,
                            const float *q, float *att, float *tile)
{
    const struct si_hparams *hp = &s->m->hp;
    const struct si_kv kv = si_ref_kv(s, l);
    si_k_attn_tiled(att, q, &kv, attention_start(hp, l, pos), pos + 1, h0, h1, hp->n_head,
                    hp->n_head_kv, hp->head_dim, hp->attn_scale, tile);
}

/* Decoding's attention over SI_ATTN_SPLIT_MIN positions or more: split in
 * chunks of positions, merged (si_k_attn_split), as the engine's tasks
 * compute it. */
static void attention_split(const struct si_ref *s, int l, int pos, int h0, int h1, const float *q,
                            float *att, float *tile)
{
    const struct si_hparams *hp = &s->m->hp;
    const struct si_kv kv = si_ref_kv(s, l);
    si_k_attn_split(att, q, &kv, attention_start(hp, l, pos), pos + 1, h0, h1, hp->n_head,
                    hp->n_head_kv, hp->head_dim, hp->attn_scale, tile);
}

/* Row t of layer l's K or V cache as floats in dst (kvd of them). */
static void cache_row(const struct si_ref *s, bool v, int l, int t, float *dst, size_t kvd)
{
    uint32_t type;
    const char *row = cache_at(s, v, l, t, &type);
    if (type == SI_TYPE_F32)
        memcpy(dst, row, kvd * sizeof(float));
    else
        si_dequantize_row(type, row, dst, (int64_t)kvd);
}

/*
 * Attention in f32 over an f32 cache (kv_f16 off): scores of
 * every head against each cached position, an exact softmax per head, then
 * the weighted sum of the values.  Cached rows are converted once for all
 * heads.
 */
static void attention_f32(const struct si_ref *s, int l, int pos, int h0, int h1,
                          const float *q_all, float *att, float *score, float *row)
{
    const struct si_hparams *hp = &s->m->hp;
    const int hd = hp->head_dim, group = hp->n_head / hp->n_head_kv;
    const size_t kvd = (size_t)hp->n_head_kv * hd, n_ctx = (size_t)s->p.n_ctx;
    const int first = attention_start(hp, l, pos);
    for (int t = first; t <= pos; t++) {
        cache_row(s, false, l, t, row, kvd);
        for (int h = h0; h < h1; h++) {
            const float *q = q_all + (size_t)h * hd, *k = row + (size_t)(h / group) * hd;
            float dot = 0.0f;
            for (int i = 0; i < hd; i++)
                dot += q[i] * k[i];
            score[(size_t)h * n_ctx + (size_t)t] = dot * hp->attn_scale;
        }
    }
    for (int h = h0; h < h1; h++) {
        float *sc = score + (size_t)h * n_ctx;
        float maxv = -INFINITY;
        for (int t = first; t <= pos; t++)
            maxv = sc[t] > maxv ? sc[t] : maxv;
        double sum = 0.0;
        for (int t = first; t <= pos; t++) {
            sc[t] = expf(sc[t] - maxv);
            sum += sc[t];
        }
        for (int t = first; t <= pos; t++)
            sc[t] = (float)(sc[t] / sum);
    }
    memset(att + (size_t)h0 * hd, 0, (size_t)(h1 - h0) * hd * sizeof(float));
    for (int t = first; t <= pos; t++) {
        cache_row(s, true, l, t, row, kvd);
        for (int h = h0; h < h1; h++) {
            const float a = score[(size_t)h * n_ctx + (size_t)t];
            const float *v = row + (size_t)(h / group) * hd;
            float *out = att + (size_t)h * hd;
            for (int i = 0; i < hd; i++)
                out[i] += a * v[i];
        }
    }
}

/* The FFN of layer l on xb into xb2; counts active neurons when asked. */
/* The input x (n values) of layer l's products of `kind`: shown to the
 * input hook, then its entries at or below the layer's input sparsity
 * threshold (in magnitude) set to 0. */
static void sparsify(const struct si_ref *s, int l, enum si_input_kind kind, float *x, int64_t n)
{
    if (s->input_hook != NULL)
        s->input_hook(s->input_hook_user, l, kind, x, n);
    if (s->p.input_thresholds == NULL)
        return;
    const float t = s->p.input_thresholds[(size_t)l * SI_INPUT_KINDS + kind];
    if (t > 0.0f)
        for (int64_t i = 0; i < n; i++)
            if (fabsf(x[i]) <= t)
                x[i] = 0.0f;
}

static void ffn(struct si_ref *s, const struct si_layer *L, int l)
{
    const struct si_hparams *hp = &s->m->hp;
    const int64_t ff = hp->n_ff;
    /* the batch's products; the last layer's, on the tokens with outputs */
    const bool last = l == hp->n_layer - 1;
    const int32_t n_tok = last ? s->batch_out_n : s->batch_n;
    const bool g4 = last ? s->batch_out_g4 : s->batch_g4;
    sparsify(s, l, SI_INPUT_FFN, s->xb, hp->n_embd);
    const bool ffn_t = si_ref_reads_t(&s->p, s->m, l, SI_INPUT_FFN);
    if (ffn_t)
        si_ref_matvec_t(&L->ffn_up_t, 0, ff, s->xb, s->hu);
    else
        matvec_as(s, n_tok, g4, s->hu, &L->ffn_up, s->xb);
    add_bias(s->hu, &L->ffn_up_b, ff);
    if (hp->ffn_kind == SI_FFN_PLAIN) {
        for (int64_t i = 0; i < ff; i++)
            s->hu[i] = si_act_apply(hp->act, s->hu[i]);
    } else {
        if (ffn_t)
            si_ref_matvec_t(&L->ffn_gate_t, 0, ff, s->xb, s->hg);
        else
            matvec_as(s, n_tok, g4, s->hg, &L->ffn_gate, s->xb);
        for (int64_t i = 0; i < ff; i++)
            s->hu[i] = si_act_gated(hp->ffn_kind, si_act_apply(hp->act, s->hg[i]), s->hu[i]);
    }
    if (s->ffn_hook != NULL) {
        const struct si_ffn_view v = {s->m, s->xb, hp->ffn_kind == SI_FFN_PLAIN ? NULL : s->hg,
                                      s->hu, s->xa, s->x};
        s->ffn_hook(s->ffn_hook_user, &v, l);
    }
    const float thr = s->p.gate_thresholds != NULL ? s->p.gate_thresholds[l] : s->p.gate_threshold;
    if (thr > 0.0f && hp->ffn_kind != SI_FFN_PLAIN && hp->act != SI_ACT_RELU)
        for (int64_t i = 0; i < ff; i++)
            if (!(fabsf(si_act_apply(hp->act, s->hg[i])) > thr))
                s->hu[i] = 0.0f;
    if (s->p.predictor) {
        /* hg is free now: it takes fc2's output */
        si_ref_predict(&L->fc1, &L->fc2, s->m->predictor_threshold, s->p.act_quant, s->xq,
                       si_ref_pred_in(s->m, s->x, s->xb, s->xa), s->r1, s->hg, s->mask);
        for (int64_t i = 0; i < ff; i++)
            if (!s->mask[i])
                s->hu[i] = 0.0f;
    }
    sparsify(s, l, SI_INPUT_DOWN, s->hu, ff);
    if (s->count_active) {
        int64_t n = 0;
        for (int64_t i = 0; i < ff; i++)
            n += s->hu[i] != 0.0f;
        s->n_active[l] = n;
    }
    if (s->neuron_counts != NULL) {
        int64_t *c = s->neuron_counts + (size_t)l * (size_t)ff;
        for (int64_t i = 0; i < ff; i++)
            c[i] += s->hu[i] != 0.0f;
    }
    if (!s->p.down_t && si_ref_reads_t(&s->p, s->m, l, SI_INPUT_DOWN)) {
        si_ref_matvec_t(si_ref_down_copy(s->m, L), 0, hp->n_embd, s->hu, s->xb2);
        add_bias(s->xb2, &L->ffn_down_b, hp->n_embd);
        return;
    }
    if (s->p.down_t || si_model_down_t_only(s->m)) {
        /* Neuron by neuron, skipping the zeros (as the sparse kernels do). */
        const struct si_tensor *w = &L->ffn_down_t;
        memset(s->xb2, 0, (size_t)hp->n_embd * sizeof(float));
        for (int64_t i = 0; i < ff; i++)
            if (s->hu[i] != 0.0f)
                si_vec_mad(w->type, (const char *)w->data + (size_t)i * w->row_bytes, s->hu[i],
                           s->xb2, hp->n_embd);
        add_bias(s->xb2, &L->ffn_down_b, hp->n_embd);
        return;
    }
    /* The down projection: one dot per output over all the neurons, as
     * llama.cpp computes it (the order of its sum is part of the result). */
    matvec_as(s, n_tok, g4, s->xb2, &L->ffn_down, s->hu);
    add_bias(s->xb2, &L->ffn_down_b, hp->n_embd);
}

int si_ref_begin(struct si_ref *s, int32_t token)
{
    return si_ref_begin_at(s, token, s->n_past);
}

int si_ref_begin_into(const struct si_ref *s, int32_t token, int32_t pos, float *x)
{
    const struct si_model *m = s->m;
    const struct si_hparams *hp = &m->hp;
    if (token < 0 || token >= hp->n_vocab)
        return SI_E_INVALID;
    if (pos < 0 || pos >= s->p.n_ctx)
        return SI_E_BUDGET;
    const int64_t d = hp->n_embd;

    /* Token embedding (scaled for gemma), plus learned position (opt). */
    const struct si_tensor *te = &m->w.token_embd;
    si_dequantize_row(te->type, (const char *)te->data + (size_t)token * te->row_bytes, x, d);
    for (int64_t i = 0; i < d; i++)
        x[i] *= hp->embd_scale;
    if (m->w.pos_embd.data != NULL) {
        const struct si_tensor *pe = &m->w.pos_embd;
        const size_t row = (size_t)pos + (size_t)hp->pos_offset;
        si_dequantize_row(pe->type, (const char *)pe->data + row * pe->row_bytes, s->tmp, d);
        for (int64_t i = 0; i < d; i++)
            x[i] += s->tmp[i];
    }
    return SI_OK;
}

int si_ref_begin_at(struct si_ref *s, int32_t token, int32_t pos)
{
    return si_ref_begin_into(s, token, pos, s->x);
}

void si_ref_attn_input(const struct si_ref *s, int l, const float *x, float *y, float *tmp)
{
    const struct si_layer *L = &s->m->w.layers[l];
    /* Falcon-40B's two norms (llama.cpp's and PowerInfer's naming): the
     * attention's is attn_norm_2, the FFN's attn_norm */
    if (L->attn_norm2.data != NULL)
        norm(&s->m->hp, y, x, &L->attn_norm2, &L->attn_norm2_b, tmp);
    else
        norm(&s->m->hp, y, x, &L->attn_norm, &L->attn_norm_b, tmp);
}

size_t si_ref_attn_scratch_floats(const struct si_ref *s)
{
    const struct si_hparams *hp = &s->m->hp;
    const size_t d = (size_t)hp->n_embd, hd = (size_t)hp->head_dim;
    return 2 * (d > hd ? d : hd) + (size_t)hp->n_head * (size_t)s->p.n_ctx +
           (size_t)hp->n_head_kv * hd + hd + tile_floats(hp, s->p.n_ctx) +
           (2 * SI_REF_ROWS + hd) * (size_t)hp->n_head + 2 * 15; /* attn_scratch's alignment */
}

static void attend(const struct si_ref *s, int l, int pos, int h0, int h1, const float *q,
                   float *att, float *score, float *krow, uint16_t *q16, float *tile);

/* si_ref_attn_group with its scratch in pieces (tmp: 2 max(n_embd,
 * head_dim) floats; score: n_head n_ctx; krow: n_head_kv head_dim; q16:
 * 2 head_dim; tile: tile_floats); att NULL: only q and k
 * prepared (biases, QK norm, RoPE), neither cached nor attended. */
static void attn_group(const struct si_ref *s, int l, int pos, int g0, int g1, float *q, float *k,
                       float *v, float *att, float *tmp, float *score, float *krow,
                       uint16_t *q16, float *tile)
{
    const struct si_model *m = s->m;
    const struct si_hparams *hp = &m->hp;
    const struct si_layer *L = &m->w.layers[l];
    const int hd = hp->head_dim, group = hp->n_head / hp->n_head_kv;
    const int h0 = g0 * group, h1 = g1 * group;
    const size_t kvd = (size_t)hp->n_head_kv * hd;
    float *qg = q + (size_t)h0 * hd, *kg = k + (size_t)g0 * hd, *vg = v + (size_t)g0 * hd;

    /* Biases, QK norm, RoPE, cache, attend: every step head by head. */
    add_bias_at(qg, &L->bq, (int64_t)h0 * hd, (int64_t)(h1 - h0) * hd);
    add_bias_at(kg, &L->bk, (int64_t)g0 * hd, (int64_t)(g1 - g0) * hd);
    add_bias_at(vg, &L->bv, (int64_t)g0 * hd, (int64_t)(g1 - g0) * hd);
    if (L->q_norm.data != NULL) {
        const float *qn = vec_f32(&L->q_norm, tmp);
        const float *kn = vec_f32(&L->k_norm, tmp + hd);
        for (int h = h0; h < h1; h++)
            si_k_rmsnorm(q + (size_t)h * hd, q + (size_t)h * hd, qn, hd, hp->norm_eps);
        for (int h = g0; h < g1; h++)
            si_k_rmsnorm(k + (size_t)h * hd, k + (size_t)h * hd, kn, hd, hp->norm_eps);
    }
    if (hp->rope_kind != SI_ROPE_NONE) {
        const bool local = si_hparams_is_swa(hp, l);
        const float base = local ? hp->rope_base_local : hp->rope_base;
        const float scale = local ? 1.0f : hp->rope_scale;
        si_k_rope(qg, h1 - h0, hd, hp->n_rot, hp->rope_kind, pos, base, scale);
        si_k_rope(kg, g1 - g0, hd, hp->n_rot, hp->rope_kind, pos, base, scale);
    }
    if (hp->q_scale != 1.0f)
        for (int64_t i = 0; i < (int64_t)(h1 - h0) * hd; i++)
            qg[i] *= hp->q_scale;
    if (att == NULL)
        return;
    cache_put(s, false, l, pos, k, kvd, (size_t)g0 * hd, (size_t)g1 * hd);
    cache_put(s, true, l, pos, v, kvd, (size_t)g0 * hd, (size_t)g1 * hd);
    attend(s, l, pos, h0, h1, q, att, score, krow, q16, tile);
}

/* The attention proper of query heads [h0, h1) at position pos, their q
 * ready (attn_group's first part done for every position up to pos). */
static void attend(const struct si_ref *s, int l, int pos, int h0, int h1, const float *q,
                   float *att, float *score, float *krow, uint16_t *q16, float *tile)
{
    const bool f16 = s->p.type_k == SI_TYPE_F16 && s->p.type_v == SI_TYPE_F16;
    if (s->p.kv_f16 && !s->attn_f32 &&
        pos + 1 - attention_start(&s->m->hp, l, pos) >= SI_ATTN_SPLIT_MIN)
        attention_split(s, l, pos, h0, h1, q, att, tile);
    else if (s->p.kv_f16 && !s->attn_f32 && f16)
        attention_f16(s, l, pos, h0, h1, q, att, q16);
    else if (s->p.kv_f16)
        attention_tiled(s, l, pos, h0, h1, q, att, tile);
    else
        attention_f32(s, l, pos, h0, h1, q, att, score, krow);
}


/* scratch's pieces, as si_ref_attn_scratch_floats counts them */
struct attn_scratch {
    float *tmp, *score, *krow, *tile;
    uint16_t *q16;
    float *ms; /* si_ref_attn_group_attend_rows: M and S of SI_REF_ROWS queries, then a row */
};

/* p moved up to the next 64-byte boundary (at most 15 floats on). */
static float *align_line(float *p)
{
    return (float *)(((uintptr_t)p + 63) & ~(uintptr_t)63);
}

static struct attn_scratch attn_scratch(const struct si_ref *s, float *scratch)
{
    const struct si_hparams *hp = &s->m->hp;
    const size_t d = (size_t)hp->n_embd, hd = (size_t)hp->head_dim;
    struct attn_scratch a;
    a.tmp = scratch;
    a.score = a.tmp + 2 * (d > hd ? d : hd);
    a.krow = a.score + (size_t)hp->n_head * (size_t)s->p.n_ctx;
    a.q16 = (uint16_t *)(a.krow + (size_t)hp->n_head_kv * hd);
    /* past q16's 2 hd halves; the tile and M, S on cache lines of their own */
    a.tile = align_line(a.krow + (size_t)hp->n_head_kv * hd + hd);
    a.ms = align_line(a.tile + tile_floats(hp, s->p.n_ctx));
    return a;
}

void si_ref_attn_group_prepare_at(const struct si_ref *s, int l, int pos, int g0, int g1,
                                  float *q, float *k, float *v, float *scratch)
{
    struct attn_scratch a = attn_scratch(s, scratch);
    attn_group(s, l, pos, g0, g1, q, k, v, NULL, a.tmp, a.score, a.krow, a.q16, a.tile);
}

void si_ref_attn_group_cache_at(const struct si_ref *s, int l, int pos, int g0, int g1,
                                const float *k, const float *v)
{
    const size_t hd = (size_t)s->m->hp.head_dim, kvd = (size_t)s->m->hp.n_head_kv * hd;
    cache_put(s, false, l, pos, k, kvd, (size_t)g0 * hd, (size_t)g1 * hd);
    cache_put(s, true, l, pos, v, kvd, (size_t)g0 * hd, (size_t)g1 * hd);
}

void si_ref_attn_group_attend_at(const struct si_ref *s, int l, int pos, int g0, int g1,
                                 const float *q, float *att, float *scratch)
{
    const int group = s->m->hp.n_head / s->m->hp.n_head_kv;
    struct attn_scratch a = attn_scratch(s, scratch);
    attend(s, l, pos, g0 * group, g1 * group, q, att, a.score, a.krow, a.q16, a.tile);
}

void si_ref_attn_group_attend_rows(const struct si_ref *s, int l, const int32_t *pos, int n, int g0,
                                   int g1, const float *q, size_t q_ld, float *att, size_t att_ld,
                                   float *scratch)
{
    const struct si_hparams *hp = &s->m->hp;
    const int hd = hp->head_dim, group = hp->n_head / hp->n_head_kv;
    const int h0 = g0 * group, h1 = g1 * group, nh = h1 - h0;
    struct attn_scratch a = attn_scratch(s, scratch);
    if (!s->p.kv_f16 || !s->attn_f32) { /* a token at a time, through a whole row */
        float *row = a.ms + 2 * SI_REF_ROWS * (size_t)hp->n_head;
        for (int r = 0; r < n; r++) {
            attend(s, l, pos[r], h0, h1, q + (size_t)r * q_ld, row, a.score, a.krow, a.q16, a.tile);
            memcpy(att + (size_t)r * att_ld, row + (size_t)h0 * hd, (size_t)nh * hd * sizeof *row);
        }
        return;
    }
    /* the tiled attention, SI_REF_ROWS queries sharing each tile */
    const struct si_kv kv = si_ref_kv(s, l);
    for (int r0 = 0; r0 < n; r0 += SI_REF_ROWS) {
        const int nr = n - r0 < SI_REF_ROWS ? n - r0 : SI_REF_ROWS;
        struct si_attn_query qs[SI_REF_ROWS];
        int lo = INT32_MAX, hi = 0;
        for (int r = 0; r < nr; r++) {
            const int p = pos[r0 + r];
            qs[r] = (struct si_attn_query){q + (size_t)(r0 + r) * q_ld + (size_t)h0 * hd,
                                           att + (size_t)(r0 + r) * att_ld,
                                           a.ms + (size_t)r * nh,
                                           a.ms + (size_t)(SI_REF_ROWS + r) * nh,
                                           attention_start(hp, l, p),
                                           p + 1};
            si_k_attn_query_start(&qs[r], nh, hd);
            lo = qs[r].lo < lo ? qs[r].lo : lo;
            hi = qs[r].hi > hi ? qs[r].hi : hi;
        }
        si_k_attn_tiles(qs, nr, &kv, h0, h1, group, hd, hp->attn_scale,
                        lo / SI_ATTN_TILE * SI_ATTN_TILE, hi, a.tile);
        for (int r = 0; r < nr; r++)
            si_k_attn_query_finish(qs[r].acc, &qs[r], nh, hd);
    }
}

void si_ref_attn_group(const struct si_ref *s, int l, int g0, int g1, float *q, float *k,
                       float *v, float *att, float *scratch)
{
    struct attn_scratch a = attn_scratch(s, scratch);
    attn_group(s, l, s->n_past, g0, g1, q, k, v, att, a.tmp, a.score, a.krow, a.q16, a.tile);
}

void si_ref_attn_core(struct si_ref *s, int l)
{
    attn_group(s, l, s->n_past, 0, s->m->hp.n_head_kv, s->q, s->k, s->v, s->att, s->tmp,
               s->score, s->krow, s->q16, s->attn_tile);
}

void si_ref_attn_finish_into(const struct si_ref *s, int l, const float *x, float *o,
                             float *x_out, float *xb, float *xb3, float *tmp)
{
    const struct si_model *m = s->m;
    const struct si_hparams *hp = &m->hp;
    const struct si_layer *L = &m->w.layers[l];
    const int64_t d = hp->n_embd;
    add_bias(o, &L->bo, d);
    if (L->attn_post_norm.data != NULL)
        si_k_rmsnorm(o, o, vec_f32(&L->attn_post_norm, tmp), d, hp->norm_eps);

    if (hp->parallel_residual) {
        /* Falcon: the FFN reads the layer input too, through attn_norm
         * (the attention's own is attn_norm_2 where there is one); the
         * attention output waits in xb3 for the residual. */
        memcpy(xb3, o, (size_t)d * sizeof(float));
        if (x_out != x)
            memcpy(x_out, x, (size_t)d * sizeof(float));
        norm(hp, xb, x, &L->attn_norm, &L->attn_norm_b, tmp);
        return;
    }
    for (int64_t i = 0; i < d; i++)
        x_out[i] = x[i] + o[i];
    norm(hp, xb, x_out, &L->ffn_norm, &L->ffn_norm_b, tmp);
}

void si_ref_attn_finish(struct si_ref *s, int l)
{
    si_ref_attn_finish_into(s, l, s->x, s->xb2, s->x, s->xb, s->xb3, s->tmp);
}

void si_ref_attn_into(struct si_ref *s, int l, float *x, float *xb, float *xb3)
{
    const struct si_layer *L = &(s->attn_w != NULL ? s->attn_w : &s->m->w)->layers[l];
    /* Attention: norm, q k v, QK norm, RoPE, cache, attend, project. */
    si_ref_attn_input(s, l, x, xb, s->tmp);
    const struct si_hparams *hp = &s->m->hp;
    if ((s->p.predictor && s->m->pred_input == SI_PRED_LAYER) || s->ffn_hook != NULL)
        memcpy(s->xa, xb, (size_t)hp->n_embd * sizeof(float));
    sparsify(s, l, SI_INPUT_QKV, xb, hp->n_embd);
    if (si_ref_reads_t(&s->p, s->m, l, SI_INPUT_QKV)) {
        si_ref_matvec_t(&L->wq_t, 0, L->wq_t.ne[0], xb, s->q);
        si_ref_matvec_t(&L->wk_t, 0, L->wk_t.ne[0], xb, s->k);
        si_ref_matvec_t(&L->wv_t, 0, L->wv_t.ne[0], xb, s->v);
    } else {
        matvec(s, s->q, &L->wq, xb);
        matvec(s, s->k, &L->wk, xb);
        matvec(s, s->v, &L->wv, xb);
    }
    si_ref_attn_core(s, l);
    sparsify(s, l, SI_INPUT_O, s->att, (int64_t)hp->n_head * hp->head_dim);
    if (si_ref_reads_t(&s->p, s->m, l, SI_INPUT_O))
        si_ref_matvec_t(&L->wo_t, 0, L->wo_t.ne[0], s->att, s->xb2);
    else
        matvec(s, s->xb2, &L->wo, s->att);
    si_ref_attn_finish_into(s, l, x, s->xb2, x, xb, xb3, s->tmp);
}

void si_ref_attn(struct si_ref *s, int l)
{
    si_ref_attn_into(s, l, s->x, s->xb, s->xb3);
}

void si_ref_ffn(struct si_ref *s, int l)
{
    ffn(s, &s->m->w.layers[l], l);
}

void si_ref_ffn_finish_into(const struct si_ref *s, int l, const float *x, float *xb2,
                            const float *xb3, float *x_out, float *tmp)
{
    const struct si_hparams *hp = &s->m->hp;
    const struct si_layer *L = &s->m->w.layers[l];
    const int64_t d = hp->n_embd;
    if (L->ffn_post_norm.data != NULL)
        si_k_rmsnorm(xb2, xb2, vec_f32(&L->ffn_post_norm, tmp), d, hp->norm_eps);
    for (int64_t i = 0; i < d; i++)
        x_out[i] = x[i] + (xb2[i] + (hp->parallel_residual ? xb3[i] : 0.0f));
}

void si_ref_ffn_finish(struct si_ref *s, int l)
{
    si_ref_ffn_finish_into(s, l, s->x, s->xb2, s->xb3, s->x, s->tmp);
}

void si_ref_head_input(const struct si_ref *s, const float *x, float *y, float *tmp)
{
    const struct si_model *m = s->m;
    norm(&m->hp, y, x, &m->w.output_norm, &m->w.output_norm_b, tmp);
}

void si_ref_end_into(struct si_ref *s, const float *x, float *xn, float *logits)
{
    si_ref_head_input(s, x, xn, s->tmp);
    matvec_as(s, s->batch_out_n, s->batch_out_g4, logits, s->lm_head, xn);
    s->n_past++;
}

void si_ref_end(struct si_ref *s)
{
    si_ref_end_into(s, s->x, s->xb, s->logits);
}

int si_ref_eval(struct si_ref *s, int32_t token)
{
    int rc = si_ref_begin(s, token);
    if (rc != SI_OK)
        return rc;
    for (int l = 0; l < s->m->hp.n_layer; l++) {
        si_ref_attn(s, l);
        si_ref_ffn(s, l);
        si_ref_ffn_finish(s, l);
    }
    si_ref_end(s);
    return SI_OK;
}

int si_ref_eval_batch(struct si_ref *s, const int32_t *tokens, int32_t n)
{
    int rc = SI_OK;
    s->attn_f32 = n >= 64;
    s->batch_n = n;
    s->batch_out_n = 1;
    s->batch_out_g4 = false;
    for (int32_t i = 0; i < n && rc == SI_OK; i++) {
        s->batch_g4 = i < n - n % 4;
        rc = si_ref_eval(s, tokens[i]);
    }
    s->attn_f32 = s->batch_g4 = false;
    s->batch_n = s->batch_out_n = 0;
    return rc;
}
