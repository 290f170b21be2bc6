/*
 * model.h - a model's hyperparameters and weights, read from a GGUF file.
 *
 * The file is mapped; every weight is a view into the mapping (never copied).
 * Architectures, from general.architecture:
 *
 *   llama   RMSNorm, RoPE (adjacent pairs), GQA, FFN act(gate)*up with
 *           act = SiLU (SwiGLU, as SmolLM2) or ReLU (ReLU-LLaMA / ProSparse:
 *           starinfer.ffn_activation = "relu", or any PowerInfer "PWRI" file)
 *   bamboo  as llama with relu(gate)*relu(up)
 *   opt     LayerNorm with biases, learned positions, biases everywhere,
 *           FFN relu(up x + b) (fc1/fc2)
 *   falcon  LayerNorm, parallel attention and FFN, GELU FFN without gate,
 *           RoPE (halves), multi-query attention
 *   gemma3  RMSNorm before and after attention and FFN, QK norm, GeGLU,
 *           embeddings scaled by sqrt(n_embd), sliding-window layers with
 *           their own RoPE base, every swa_pattern-th layer global
 *
 * Hyperparameters are read from `<arch>.*` keys; a missing or inconsistent
 * key is an error naming the key.
 */
#ifndef SI_MODEL_MODEL_H
#define SI_MODEL_MODEL_H

#include "model/gguf.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum si_arch {
    SI_ARCH_LLAMA,
    SI_ARCH_BAMBOO,
    SI_ARCH_OPT,
    SI_ARCH_FALCON,
    SI_ARCH_GEMMA3,
    SI_ARCH_COUNT
};

enum si_act { SI_ACT_SILU, SI_ACT_RELU, SI_ACT_GELU };

/* How an FFN neuron's activation is formed from its rows. */
enum si_ffn_kind {
    SI_FFN_GATED,       /* act(gate . x) * (up . x) */
    SI_FFN_GATED_RELU2, /* relu(gate . x) * relu(up . x) (Bamboo) */
    SI_FFN_PLAIN,       /* act(up . x + b) (OPT, Falcon) */
};

enum si_norm_kind { SI_NORM_RMS, SI_NORM_LAYER };

enum si_rope_kind {
    SI_ROPE_NONE, /* learned positions (OPT) */
    SI_ROPE_NORM, /* rotate pairs (2i, 2i+1) */
    SI_ROPE_NEOX, /* rotate pairs (i, i + n_rot/2) */
};

struct si_hparams {
    enum si_arch arch;
    int32_t n_vocab;
    int32_t n_ctx_train; /* context length the model was trained with */
    int32_t n_embd;      /* width of the residual stream */
    int32_t n_layer;
    int32_t n_head;
    int32_t n_head_kv;
    int32_t head_dim; /* per head, for queries and keys; values use the same */
    int32_t n_ff;     /* FFN neurons per layer */
    int32_t n_rot;    /* rotated dimensions per head */
    float norm_eps;
    float rope_base;        /* RoPE frequency base (global layers) */
    float rope_base_local;  /* RoPE base of sliding-window layers (gemma3) */
    float rope_scale;       /* linear position scaling of global layers (1 = none) */
    float attn_scale;       /* multiplies q . k */
    float q_scale;          /* multiplies q before attention (gemma3; else 1) */
    float embd_scale;       /* multiplies the token embedding (gemma: sqrt(n_embd)) */
    int32_t sliding_window; /* 0: none */
    int32_t swa_pattern;    /* layer l is global when (l + 1) % swa_pattern == 0 */
    enum si_act act;
    enum si_ffn_kind ffn_kind;
    enum si_norm_kind norm_kind;
    enum si_rope_kind rope_kind;
    bool parallel_residual; /* falcon: attention and FFN both read the layer input */
    int32_t pos_offset;     /* opt: the learned position of token p is row p + 2 of
                             * position_embd (Hugging Face's OPT, and PowerInfer's);
                             * context_length counts those rows */
};

/* A tensor as stored in the file: a view into the mapping.  An engine may
 * hold its own copy of a matrix with rows packed 8 at a time
 * (model/pack8.h): pk > 0 says its first pk rows are (groups from data on;
 * pk % 8 != 0 only where the view ends inside a group), the others in the
 * row layout after them.  The model's own tensors have pk = 0. */
struct si_tensor {
    const void *data;
    uint32_t type; /* enum si_type */
    int64_t ne[4];
    size_t nbytes;
    size_t row_bytes; /* bytes of one row of ne[0] elements */
    int64_t pk;       /* rows packed by si_pack8, from the first */
    const void *cb_scale; /* a column-block copy (model/colblock.h): its scales;
                           * data its q rows, type Q4_0 or Q4_1 (with mins) */
};

/* Row i of t in the row layout (ne[0] elements, row_bytes bytes): the
 * file's tensors, and the rows past t->pk of packed ones (a packed row:
 * forward.h's si_tensor_row). */
static inline const char *si_file_row(const struct si_tensor *t, int64_t i)
{
    return (const char *)t->data + (size_t)i * t->row_bytes;
}

struct si_layer {
    struct si_tensor attn_norm, attn_norm_b;   /* [n_embd] */
    struct si_tensor attn_norm2, attn_norm2_b; /* falcon-40b style: the attention's
                                                * norm, attn_norm the FFN's */
    struct si_tensor wq, wk, wv, wo;           /* [n_embd, n_head*head_dim], ... */
    struct si_tensor bq, bk, bv, bo;           /* biases (opt) */
    struct si_tensor q_norm, k_norm;           /* [head_dim] (gemma3) */
    struct si_tensor attn_post_norm;           /* [n_embd] (gemma3) */
    struct si_tensor ffn_norm, ffn_norm_b;     /* [n_embd] */
    struct si_tensor ffn_gate, ffn_up,
        ffn_down;                          /* [n_embd, n_ff], [n_embd, n_ff], [n_ff, n_embd] */
    struct si_tensor ffn_up_b, ffn_down_b; /* [n_ff], [n_embd] */
    struct si_tensor ffn_post_norm;        /* [n_embd] (gemma3) */
    struct si_tensor fc1, fc2;             /* predictor [n_embd, r], [r, n_ff] */
    struct si_tensor ffn_down_t;           /* [n_embd, n_ff], a row per neuron */
    /* Input sparsity's transposed copies (`starinfer convert --transpose`):
     * a row per input entry, quantized along the outputs, so that a product
     * whose input is sparse reads only the rows of its non-zero entries.
     * Optional; data NULL when the file has none. */
    struct si_tensor wq_t, wk_t, wv_t;     /* [n_head*head_dim, n_embd], [kv, n_embd] x 2 */
    struct si_tensor wo_t;                 /* [n_embd, n_head*head_dim] */
    struct si_tensor ffn_gate_t, ffn_up_t; /* [n_ff, n_embd] */
    struct si_tensor ffn_down_c;           /* [n_embd, n_ff]: ffn_down's column-block
                                            * copy (ffn_down_t's rows serve the sparse
                                            * layouts' records) */
};

struct si_weights {
    struct si_tensor token_embd; /* [n_embd, n_vocab] */
    struct si_tensor pos_embd;   /* [n_embd, n_ctx] (opt) */
    struct si_tensor output_norm, output_norm_b;
    struct si_tensor output; /* [n_embd, n_vocab]; token_embd when tied */
    struct si_layer *layers; /* [n_layer] */
};

/* The key that says what the predictors read: "ffn", "layer" or
 * "residual" (enum si_pred_input). */
#define SI_PREDICTOR_INPUT_KEY "starinfer.predictor.input"

/* What a layer's predictor reads. */
enum si_pred_input {
    /* "residual", and files without the key (PowerInfer's own): the
     * residual stream the FFN's norm reads, not normalised.  PowerInfer
     * gives its sparse FFN ffn_inp (the residual after the attention) for
     * llama, bamboo and OPT, and inpL (the layer's input) for Falcon, whose
     * FFN reads the layer's input beside the attention: both are that. */
    SI_PRED_RESIDUAL,
    /* "ffn": the FFN's normalised input (what `starinfer train-predictor`
     * trains on by default) */
    SI_PRED_FFN,
    /* "layer": the layer's attention input after its norm, a lookahead
     * that lets the FFN's reads start beside the attention
     * (train-predictor --lookahead) */
    SI_PRED_LAYER,
};

struct si_model {
    struct si_gguf *gguf;
    struct si_gguf *pred_gguf; /* a predictor file's (si_model_attach_predictors), or NULL */
    struct si_hparams hp;
    struct si_weights w;
    float predictor_threshold; /* powerinfer.sparse_threshold, 0 by default */
    bool has_predictor;
    enum si_pred_input pred_input; /* SI_PREDICTOR_INPUT_KEY's; SI_PRED_LAYER: a
                                    * lookahead, the predictors can run beside
                                    * the attention */
};

/* Map and check the model at `path`; SI_OK or a negative si_status with one
 * line in err. */
int si_model_load(struct si_model **out, const char *path, char *err, size_t err_size);

/* The same on an already opened file; on success the model owns `g`. */
int si_model_from_gguf(struct si_model **out, struct si_gguf *g, char *err, size_t err_size);

void si_model_free(struct si_model *m);

/*
 * Predictor files: a model's predictors apart from it (`starinfer
 * train-predictor --predictors-only`), so that they can be trained, kept
 * and moved without the model's weights.  GGUF, general.architecture
 * SI_PRED_FILE_ARCH, the model's shape (SI_PRED_FILE_KEY "n_layer",
 * "n_embd", "n_ff") and fingerprint ("model_hash", si_model_ffn_hash), the
 * predictors' keys as in a model (powerinfer.sparse_threshold,
 * SI_PREDICTOR_INPUT_KEY, starinfer.predictor.*) and blk.N.fc1.weight /
 * blk.N.fc2.weight.
 */
#define SI_PRED_FILE_ARCH   "starinfer.predictors"
#define SI_PRED_FILE_KEY(k) "starinfer.predictors." k

/* FNV-1a over every layer's first and last ffn_up rows, first ffn_gate row
 * and first down row (ffn_down, or ffn_down_t alone): the weights
 * predictors are trained on. */
uint64_t si_model_ffn_hash(const struct si_model *m);

/* Map the predictor file at `path` and take its predictors and their keys
 * in place of m's own (m keeps the file open: m->pred_gguf).  Refused
 * (m unchanged) when it is no predictor file or was made for another
 * model.  SI_OK or a negative si_status with one line in err. */
int si_model_attach_predictors(struct si_model *m, const char *path, char *err, size_t err_size);

/* The file that holds m's predictors' keys: the predictor file, else the model's. */
static inline const struct si_gguf *si_model_pred_gguf(const struct si_model *m)
{
    return m->pred_gguf != NULL ? m->pred_gguf : m->gguf;
}

/*
 * Bytes of weights a dense forward pass reads for one decoded token: every
 * tensor of every layer but the predictor (fc1, fc2) and ffn_down_t (unless
 * it is the only down projection: si_model_down_t_only), the
 * output norm and matrix, and one row of the token (and position)
 * embeddings.  *ffn (when not NULL) gets the FFN's part of it: ffn_gate,
 * ffn_up, ffn_down and their biases.  KV cache reads are not weights and
 * are not counted.
 */
int64_t si_model_token_bytes(const struct si_model *m, int64_t *ffn);
/* The same for layers [l0, l1), with the embedding row (first) and the
 * output norm and LM head (last): a pipeline rank's share. */
int64_t si_model_range_bytes(const struct si_model *m, int32_t l0, int32_t l1, bool first,
                             bool last, int64_t *ffn);

/* "residual", "ffn", "layer" (SI_PREDICTOR_INPUT_KEY's values); and back
 * from the n bytes at s (SI_OK, or SI_E_INVALID for another value). */
const char *si_pred_input_name(enum si_pred_input in);
int si_pred_input_parse(const char *s, size_t n, enum si_pred_input *in);

/* Whether m's down projection is ffn_down_t alone (PowerInfer's layout: a
 * row per neuron, no ffn_down): the reference and the engine then compute
 * y = sum_i h_i * down_t_i in every mode (the reference's down_t). */
static inline bool si_model_down_t_only(const struct si_model *m)
{
    return m->w.layers[0].ffn_down.data == NULL;
}

/* Name of an architecture ("llama", ...) */
const char *si_arch_name(enum si_arch arch);

/* Whether layer l uses the sliding window. */
bool si_hparams_is_swa(const struct si_hparams *hp, int32_t l);

#endif /* SI_MODEL_MODEL_H */
