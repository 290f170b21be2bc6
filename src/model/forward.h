/*
 * forward.h - the plain-C reference forward pass.
 *
 * Single-threaded and written to be obviously correct: it is the oracle every
 * faster path is tested against.  One token at a time, with a KV cache; the
 * weights are used where they lie in the mapped file (each matrix-vector
 * product is a row-by-row si_vec_dot on the stored type).
 */
#ifndef SI_MODEL_FORWARD_H
#define SI_MODEL_FORWARD_H

#include "model/model.h"

#include <stdbool.h>
#include <stdint.h>

/*
 * Numerics.  By default the reference computes as llama.cpp's CPU backend
 * does, so that its outputs can be compared token for token: activations are
 * converted to each weight's dot type before a matrix-vector product
 * (act_quant: Q8_0, Q8_1, Q8_K, F16 ...), K and V are cached as fp16, and
 * attention runs as llama.cpp's flash attention (query in fp16, online
 * softmax, values accumulated in fp16; or in f32 with attn_f32 below, as
 * llama.cpp does for long batches such as prompts and perplexity chunks).  With act_quant off and
 * kv_f16 off everything is plain float with an exact softmax.
 */
struct si_ref_params {
    int32_t n_ctx;  /* KV cache length (0: the model's training context, at most 4096) */
    bool kv_f16;    /* fp16 K/V cache and llama.cpp's flash-attention arithmetic */
    /* With kv_f16: the caches' types, SI_TYPE_F16 (default), or SI_TYPE_Q8_0
     * or SI_TYPE_Q4_0 (llama.cpp's --cache-type-k/-v): rows quantized as
     * they are written, read through si_dequantize_row by the tiled
     * attention, which a quantized cache always takes (the fp16 query and
     * accumulator of llama.cpp's single-query arithmetic read fp16 only). */
    uint32_t type_k, type_v;
    bool act_quant; /* convert activations to each weight's dot type */

    /* FFN sparsity, as the engine's sparse modes compute it (all off by
     * default: the dense FFN of the file, as llama.cpp computes it). */
    bool down_t;          /* down projection from the file's ffn_down_t rows:
                           * y = sum_i h_i * down_t_i (si_vec_mad, neuron order,
                           * h in float) instead of ffn_down's dot products
                           * (always, on a file without ffn_down:
                           * si_model_down_t_only) */
    bool predictor;       /* only the neurons the file's predictor (fc1, ReLU,
                           * fc2 >= powerinfer.sparse_threshold) selects */
    float gate_threshold; /* gated SiLU/GELU FFNs: a neuron with |act(gate)| at
                           * or below it is skipped (CATS); 0: none */
    const float *gate_thresholds; /* when not NULL, (n_layer) per-layer values
                                   * instead of gate_threshold (borrowed) */

    /* Input sparsity (TEAL, Liu et al. 2024): when not NULL, (n_layer,
     * SI_INPUT_KINDS) magnitudes, borrowed; before each of layer l's
     * matrix products the entries of its input with |x| at or below
     * input_thresholds[l * SI_INPUT_KINDS + kind] become 0 (kinds below;
     * 0: none).  predict/input_sparsity.h calibrates them. */
    const float *input_thresholds;
    /* With input_thresholds: each product of an input with a positive
     * threshold reads the layer's transposed copy when it has one
     * (model.h: wq_t ... ffn_up_t, ffn_down_t; `starinfer convert
     * --transpose`): y = the sum over the input's non-zero entries, in
     * order, of x_i times row i (si_ref_matvec_t), the zeros' rows never
     * read, as the engine computes it (which products: si_ref_reads_t).
     * Off: the zeroed input goes through the file's matrices (the same
     * function up to the copies' rounding). */
    bool input_t;
};

/* The inputs input sparsity thresholds, one each per layer. */
enum si_input_kind {
    SI_INPUT_QKV,  /* the attention's normalised input: q, k, v */
    SI_INPUT_O,    /* the attention's output: the output projection */
    SI_INPUT_FFN,  /* the FFN's normalised input: gate and up (and the predictor) */
    SI_INPUT_DOWN, /* the FFN's activations: down (after gate mode and the predictor) */
    SI_INPUT_KINDS
};

/* Called with every input before input sparsity applies: layer l, its kind,
 * the n values (the calibration of predict/input_sparsity.h looks here). */
typedef void (*si_input_hook)(void *user, int l, enum si_input_kind kind, const float *x,
                              int64_t n);

struct si_ref_params si_ref_default_params(void);

/*
 * One token's FFN of one layer as the FFN hooks see it (the reference's
 * ffn_hook; the engine's observer, graph/engine.h): x, its input after the
 * norm (n_embd); g, the gate products gate . x before the activation (n_ff;
 * NULL for plain FFNs); h, the activations act(g) * (up . x), or act(up . x)
 * for plain FFNs (n_ff), before any sparsity applies; xa, the layer's
 * attention input after its norm (n_embd: what a lookahead predictor reads,
 * model.h), or NULL where the runner does not keep it; xr (below).
 */
struct si_ffn_view {
    const struct si_model *m;
    const float *x;
    const float *g;
    float *h;
    const float *xa;
    const float *xr; /* the residual the FFN's norm read (PowerInfer's predictor
                      * input: model.h's SI_PRED_RESIDUAL), or NULL where the
                      * runner does not keep it */
};

/* What layer's predictor reads (m->pred_input), of: xr the residual the
 * FFN's norm reads, x the FFN's normalised input, xa the attention's. */
static inline const float *si_ref_pred_in(const struct si_model *m, const float *xr,
                                          const float *x, const float *xa)
{
    return m->pred_input == SI_PRED_RESIDUAL ? xr : m->pred_input == SI_PRED_LAYER ? xa : x;
}
typedef void (*si_ffn_hook)(void *user, const struct si_ffn_view *v, int l);

struct si_ref {
    const struct si_model *m;
    struct si_ref_params p;
    int32_t n_past; /* tokens already in the cache */

    /* Activations of the current token. */
    float *x;              /* (n_embd) residual stream */
    float *xb;             /* (n_embd) normed input of a block */
    float *xb2;            /* (n_embd) block output */
    float *q;              /* (n_head * head_dim) */
    float *k, *v;          /* (n_head_kv * head_dim) */
    float *att;            /* (n_head * head_dim) attention output */
    float *score;          /* (n_head, n_ctx) attention scores, then weights */
    float *krow;           /* (n_head_kv * head_dim) one cached K or V row as f32 */
    void *xq;              /* activations converted for si_vec_dot_act */
    uint16_t *q16, *vkq16; /* (head_dim) fp16 query and value accumulator: one
                            * allocation of 2 * head_dim, vkq16 = q16 + head_dim */
    float *hg, *hu;        /* (n_ff) gate and up activations */
    uint8_t *mask;         /* (n_ff) the predictor's selection */
    float *r1;             /* (predictor rank) its hidden layer */
    float *logits;         /* (n_vocab) */
    float *xb3;            /* (n_embd) falcon: the attention output beside the FFN's */
    float *xa;             /* (n_embd) the attention's normalised input, kept for a
                            * lookahead predictor (model.h) and the FFN hook */
    float *tmp;            /* (2 * max(n_embd, head_dim)) 1-D weights converted to f32 */
    float *attn_tile;      /* the tiled and the split attention's scratch (kv_f16) */

    /* KV cache: (n_layer, n_ctx, n_head_kv * head_dim), fp16 or f32. */
    void *kcache, *vcache;

    /* Attention arithmetic for the next evaluations: false is llama.cpp's
     * flash attention for one query (fp16 query, fp16 value accumulator);
     * true is its tiled path for batches of 64 queries or more (f32 query
     * and accumulator over the fp16 cache, si_k_attn_f16_tiled).  Without
     * kv_f16 attention is always f32 with an exact softmax. */
    bool attn_f32;

    /* Matrix products for the next evaluations, as llama.cpp multiplies
     * the token: one of batch_n tokens multiplied at once (0 or 1: alone),
     * in a full group of 4 of them when batch_g4 (si_vec_dot_act_batch: on
     * AVX2 that changes Q4_K's and Q6_K's sums).  The last layer's FFN and
     * the LM head: llama.cpp runs them on the tokens whose logits it returns
     * only, the token one of batch_out_n of those (0 or 1: alone; for a
     * prompt, the last token alone), batch_out_g4 as batch_g4 among them.
     * si_ref_eval_batch sets these. */
    int32_t batch_n, batch_out_n;
    bool batch_g4, batch_out_g4;

    /* The LM head's rows si_ref_end multiplies: the model's output, or an
     * engine's own copy of it (packed 8 rows at a time: the same values). */
    const struct si_tensor *lm_head;
    /* Likewise the attention's projections si_ref_attn multiplies: the
     * model's (NULL), or an engine's own copy of the weights. */
    const struct si_weights *attn_w;

    /* Per layer, the FFN neurons active for the last token (activation != 0),
     * counted when count_active is set: (n_layer). */
    bool count_active;
    int64_t *n_active;

    /* When not NULL, (n_layer, n_ff) counters: each evaluation adds 1 for
     * every FFN neuron whose activation is not zero (the profiler). */
    int64_t *neuron_counts;

    /* When not NULL, called by every layer's FFN right after its activation,
     * before any sparsity (gate_threshold, predictor) applies, with
     * ffn_hook_user, the FFN's view (si_ffn_view; h is s->hu: a hook may zero
     * neurons, which the down projection then skips) and the layer.  The
     * profiler's CATS thresholds (predict/profile.h) look here. */
    si_ffn_hook ffn_hook;
    void *ffn_hook_user;

    /* When not NULL, called with each matrix product's input (si_input_hook). */
    si_input_hook input_hook;
    void *input_hook_user;
};

/* Allocate the state; SI_OK or a negative si_status with one line in err
 * (SI_E_INVALID for down_t or predictor on a file without those tensors). */
int si_ref_init(struct si_ref **out, const struct si_model *m, struct si_ref_params p, char *err,
                size_t err_size);
void si_ref_free(struct si_ref *s);

/* Forget the cache (start a new sequence). */
void si_ref_reset(struct si_ref *s);
/*
 * Context shift: the cache's positions [n_keep, n_keep + n_discard)
 * dropped, the later ones moved down by n_discard, their keys rotated back
 * by n_discard positions (RoPE's rotation by -n_discard, in f32, stored
 * again in the cache's type: fp16 rounds once more), n_past reduced.
 * SI_E_INVALID: n_discard < 1 or past n_past; SI_E_UNSUPPORTED: learned
 * positions (OPT: the position is in the input, not in K); SI_E_NOMEM.
 */
int si_ref_kv_shift(struct si_ref *s, int32_t n_keep, int32_t n_discard);
/* Its parts: the checks (its statuses but SI_E_NOMEM), and layer l's rows
 * (row: scratch of n_head_kv * head_dim floats; n_past unchanged). */
int si_ref_kv_shift_check(const struct si_ref *s, int32_t n_keep, int32_t n_discard);
void si_ref_kv_shift_layer(struct si_ref *s, int l, int32_t n_keep, int32_t n_discard,
                           float *row);

/* Evaluate `token` at position n_past; logits in s->logits.  SI_E_INVALID
 * for a token outside the vocabulary, SI_E_BUDGET when the cache is full. */
int si_ref_eval(struct si_ref *s, int32_t token);

/*
 * Evaluate tokens[0..n) at the next positions with the arithmetic of
 * llama.cpp's CPU backend decoding them in one batch (one llama_decode of n
 * tokens, n at most its n_ubatch) that returns the last token's logits:
 * attn_f32 when n >= 64, batch_n = n, batch_g4 for the tokens in full
 * groups of 4 (i < n - n % 4), batch_out_n 1.  The fields are cleared
 * afterwards.  Logits of
 * the last token in s->logits; errors as si_ref_eval's (the tokens before
 * the failing one stay in the cache).
 */
int si_ref_eval_batch(struct si_ref *s, const int32_t *tokens, int32_t n);

/*
 * The steps of si_ref_eval, for engines that run them as tasks and replace
 * the FFN with their own:
 *   si_ref_begin(s, token)   x = embedding (checks token and cache room)
 *   per layer l:
 *     si_ref_attn(s, l)      attention; x += its output (Falcon: kept in xb3);
 *                            xb = the FFN's normalised input
 *     si_ref_ffn(s, l)       xb2 = FFN(xb), dense: each output of the down
 *                            projection one dot over all the neurons (or an
 *                            engine's own sum)
 *     si_ref_ffn_finish(s, l) post-FFN norm if any; x += xb2 (+ xb3)
 *   si_ref_end(s)            logits; the token joins the cache (n_past + 1)
 */
int si_ref_begin(struct si_ref *s, int32_t token);
/* si_ref_begin for position pos instead of n_past (a batch's token). */
int si_ref_begin_at(struct si_ref *s, int32_t token, int32_t pos);
/* si_ref_begin_at into x instead of s->x (an engine's buffer). */
int si_ref_begin_into(const struct si_ref *s, int32_t token, int32_t pos, float *x);
void si_ref_attn(struct si_ref *s, int l);
/* si_ref_attn on an engine's buffers instead of s->x, s->xb and s->xb3 (the
 * others, s's scratch). */
void si_ref_attn_into(struct si_ref *s, int l, float *x, float *xb, float *xb3);
/*
 * si_ref_attn in steps, for engines that split its products into tasks:
 *   si_ref_attn_input(s, l, x, y, tmp)  y = the normalised input of layer
 *                                    l's attention for the residual x (s->x
 *                                    in si_ref_attn; tmp: scratch of
 *                                    2 * max(n_embd, head_dim) floats)
 *   q, k, v = Wq y, Wk y, Wv y       (si_ref_matvec, any split of the rows)
 *   si_ref_attn_core(s, l)           biases, QK norm, RoPE, cache, attention
 *                                    of q, k, v into att
 *   xb2 = Wo att                     (likewise)
 *   si_ref_attn_finish(s, l)         bias, post-norm, residual, the FFN's
 *                                    normalised input in xb (as si_ref_attn)
 */
void si_ref_attn_input(const struct si_ref *s, int l, const float *x, float *y, float *tmp);
void si_ref_attn_core(struct si_ref *s, int l);
void si_ref_attn_finish(struct si_ref *s, int l);
/*
 * si_ref_attn_core for the kv heads [g0, g1) and their query heads alone,
 * for engines that split attention by heads: q (n_head * head_dim), k and v
 * (n_head_kv * head_dim) are laid out whole, and only those heads' parts are
 * read and changed: biases, QK norm and RoPE in place, the rows into the
 * cache (those columns of position n_past), their attention into the same
 * heads' part of att.  Every head gets the bits si_ref_attn_core gives it,
 * so calls on disjoint ranges may run at the same time (with their own
 * buffers and scratch: si_ref_attn_scratch_floats() floats).
 */
void si_ref_attn_group(const struct si_ref *s, int l, int g0, int g1, float *q, float *k,
                       float *v, float *att, float *scratch);
/* si_ref_attn_group in three parts, each for the token at position pos (its
 * cache row, whatever n_past says), for a batch whose tokens' steps may
 * then run in any order and at the same time: prepare (biases, QK norm,
 * RoPE of q, k, v in place: no shared state touched), cache (k and v into
 * the cache's row pos, those kv heads' columns), then attend (q, prepared,
 * against the cache's rows up to pos, into att) once every position up to
 * pos is cached.  The same bits as si_ref_attn_group. */
void si_ref_attn_group_prepare_at(const struct si_ref *s, int l, int pos, int g0, int g1,
                                  float *q, float *k, float *v, float *scratch);
void si_ref_attn_group_cache_at(const struct si_ref *s, int l, int pos, int g0, int g1,
                                const float *k, const float *v);
void si_ref_attn_group_attend_at(const struct si_ref *s, int l, int pos, int g0, int g1,
                                 const float *q, float *att, float *scratch);
size_t si_ref_attn_scratch_floats(const struct si_ref *s);
/* The type of the K (v false) or V cache (SI_TYPE_F32 without kv_f16), the
 * bytes of one position's row in a layer's cache, and layer l's caches as
 * the tiled kernels read them (kv_f16). */
uint32_t si_ref_kv_type(const struct si_ref_params *p, bool v);
size_t si_ref_kv_row_bytes(const struct si_ref_params *p, const struct si_hparams *hp, bool v);
struct si_kv si_ref_kv(const struct si_ref *s, int l);
/* si_ref_attn_group_attend_at for n tokens of this sequence at positions
 * pos[0..n): token r's query row at q + r * q_ld (head h at + h *
 * head_dim), its output at att + r * att_ld, the query heads of kv heads
 * [g0, g1) only (from the first at 0).  Each token's bits are
 * si_ref_attn_group_attend_at's; in the tiled arithmetic (attn_f32) up to
 * SI_REF_ROWS tokens share each tile of the cache (si_k_attn_tiles). */
#define SI_REF_ROWS 64
void si_ref_attn_group_attend_rows(const struct si_ref *s, int l, const int32_t *pos, int n, int g0,
                                   int g1, const float *q, size_t q_ld, float *att, size_t att_ld,
                                   float *scratch);
/* si_ref_attn_finish on given buffers: o (the attention's projection, Wo
 * att) gets its bias and post-norm in place; x_out = the residual after
 * attention (x + o, or x for Falcon's parallel residual, whose o goes to
 * xb3); xb = the FFN's normalised input.  x_out may be x. */
void si_ref_attn_finish_into(const struct si_ref *s, int l, const float *x, float *o,
                             float *x_out, float *xb, float *xb3, float *tmp);
/* si_ref_ffn_finish on given buffers: xb2 (the FFN output) gets the post-FFN
 * norm in place if any; x_out = x + (xb2 (+ xb3 with a parallel residual)).
 * x_out may be x. */
void si_ref_ffn_finish_into(const struct si_ref *s, int l, const float *x, float *xb2,
                            const float *xb3, float *x_out, float *tmp);
/* y = W x (W's rows of ne[0] elements), as every matrix-vector product of the
 * reference: with act_quant, x is converted into xq (room for
 * si_type_row_size(si_act_type(W type), ne[0]) bytes) first.  Rows packed 8
 * at a time (w->pk, act_quant only) give the same values, read faster. */
void si_ref_matvec(bool act_quant, void *xq, float *y, const struct si_tensor *w, const float *x);
/* y[0 .. c1 - c0) = columns [c0, c1) of W x from W's transposed copy wt
 * (model.h: a row of ne[0] outputs per input entry, ne[1] of them): the sum
 * over i < ne[1] with x[i] != 0, in order, of x[i] times row i's columns
 * (si_vec_mad); or, for a column-block copy (wt->cb_scale), its product
 * (model/colblock.h).  c0 and c1 fall on wt's blocks
 * (SI_CB_GROUP outputs for a column-block copy). */
void si_ref_matvec_t(const struct si_tensor *wt, int64_t c0, int64_t c1, const float *x, float *y);
/* The input sparsity threshold of layer l's products of kind (an enum
 * si_input_kind) under p: 0 for none. */
float si_ref_input_threshold(const struct si_ref_params *p, int l, int kind);
/* Whether layer l's products of kind (an enum si_input_kind) read the
 * transposed copies under p (si_ref_params.input_t): q, k, v when the
 * layer has the three copies, the output projection wo_t, gate and up
 * ffn_up_t and (gated kinds) ffn_gate_t, each when its input's threshold
 * is positive; down si_ref_down_copy() when its threshold is positive or, on ReLU
 * models (whose activations are mostly 0 already), when any of the layer's
 * is: at thresholds all 0 every product is the dense one.  The engine
 * follows the same rule. */
bool si_ref_reads_t(const struct si_ref_params *p, const struct si_model *m, int l, int kind);
/* The copy of layer L of m's down projection that input sparsity reads:
 * on ReLU models, whose activations are mostly exact zeros, ffn_down_t's
 * neuron rows where the file has them; else the column-block copy
 * ffn_down_c where it has one; else ffn_down_t. */
const struct si_tensor *si_ref_down_copy(const struct si_model *m, const struct si_layer *L);
/* y[r] = row r of w dotted with xq (converted as above) for r < ne[1],
 * packed groups through si_vec_dot_act8. */
void si_ref_matvec_act(float *y, const struct si_tensor *w, const void *xq);
/* y[r] = columns [c0, c1) of row r of w dotted with x[c0 .. c1) for r <
 * ne[1]: a partial product over some of W's inputs (the engine's attention
 * groups, each over its heads' columns of Wo).  c0 and c1 fall on the
 * type's blocks, so the converted activations (act_quant, into xq) are
 * x's own blocks and each row's part is si_vec_dot_act's over that range
 * (packed groups: si_vec_dot_act8's, the same bits). */
void si_ref_matvec_cols(bool act_quant, void *xq, float *y, const struct si_tensor *w,
                        const float *x, int64_t c0, int64_t c1);
/* Row r of w in the row layout: a pointer into w, or, for a packed row,
 * the row unpacked into buf (w->row_bytes bytes). */
const void *si_tensor_row(const struct si_tensor *w, int64_t r, void *buf);
/* A predictor (PowerInfer's fc1, ReLU, fc2) on the FFN input x:
 * active[i] = 1 for the neurons whose fc2 output reaches threshold, else 0
 * (fc2's rows: n_ff, in whatever order fc2's rows are).  r1 (rank floats)
 * and y (n_ff floats) are scratch, xq as for si_ref_matvec.  Returns how
 * many it selects. */
int64_t si_ref_predict(const struct si_tensor *fc1, const struct si_tensor *fc2, float threshold,
                       bool act_quant, void *xq, const float *x, float *r1, float *y,
                       uint8_t *active);
/* si_ref_eval's other steps: si_ref_ffn, layer l's FFN of xb into xb2 (with
 * the FFN hook and the sparse modes); si_ref_ffn_finish, the post-FFN norm
 * and residual into x (si_ref_ffn_finish_into on s's buffers); si_ref_end,
 * the output norm and the logits, then n_past + 1. */
void si_ref_ffn(struct si_ref *s, int l);
void si_ref_ffn_finish(struct si_ref *s, int l);
void si_ref_end(struct si_ref *s);
/* si_ref_end from x into logits, xn (n_embd floats) its normalised input. */
void si_ref_end_into(struct si_ref *s, const float *x, float *xn, float *logits);
/* si_ref_end's first step: y = the output norm of x (s->x there; tmp as for
 * si_ref_attn_input); then logits = output . y, and n_past + 1. */
void si_ref_head_input(const struct si_ref *s, const float *x, float *y, float *tmp);

#endif /* SI_MODEL_FORWARD_H */
