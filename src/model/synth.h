/*
 * synth.h - synthetic models: GGUF files of any shape and type with random
 * weights and planted FFN activity, reproducible from a seed.
 *
 * Architectures: "llama" with ReLU (relu(gate) * up) or SiLU (SwiGLU) FFN,
 * "bamboo" (relu(gate) * relu(up), LLaMA's tensor names) and "opt"
 * (LayerNorm with biases, learned positions, fc1 -> ReLU -> fc2, no gate).
 * The file carries a GPT-2 byte-level tokenizer (256 byte tokens, BOS, EOS,
 * merged letter pairs, "<unused_N>" padding) so the model loader accepts it.
 *
 * Planted activity: FFN neuron i of every layer fires (its ReLU input is
 * positive) with its own probability p_i.  The p_i follow a capped power law
 * p(t) = min(p_max, A t^-alpha) over the neurons' ranks t, with A and alpha
 * solved so that the mean of p_i is 1 - sparsity and the top hot_fraction of
 * neurons carry hot_share of all activations; each layer shuffles the ranks.
 * How: the first B dimensions of the residual stream (B = the weight type's
 * block size, so quantization keeps them exact) are a constant "bias
 * channel": every token embedding holds 1.0 there and no layer writes there
 * (those rows of attn_output and ffn_down are zero).  Gate row i is a random
 * u_i, zero on the channel, plus c_i / B on each channel dimension, where
 * c_i = |u_i| * Phi^-1(p_i) (|u_i| measured on the quantized row): the norm
 * only rescales x, so gate_i . x > 0 exactly when u_i . x > -c_i, which for
 * embeddings of unit variance happens with probability p_i.  OPT has no
 * channel (LayerNorm would remove it): its fc1 bias is c_i, with |u_i|
 * taken about the row's mean.  Bamboo plants its up rows the same way with
 * p = SI_SYNTH_BAMBOO_UP_P and its gate rows with p_i / SI_SYNTH_BAMBOO_UP_P.
 * Attention and FFN outputs are small (their sum over all layers adds about
 * 8% to the residual's variance), so the probabilities hold, approximately,
 * deeper in the model on real token sequences too.
 *
 * The planted probabilities are stored as F32 tensors blk.N.ffn_planted_prob
 * {n_ff}, or, in PowerInfer's layout (powerinfer: the tensors PowerInfer
 * makes and no other, ffn_down_t without ffn_down), as the key
 * SI_SYNTH_PLANTED_KEY; starinfer.synth.* keys record the seed and the
 * targets.
 */
#ifndef SI_MODEL_SYNTH_H
#define SI_MODEL_SYNTH_H

#include "model/gguf.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum si_synth_arch {
    SI_SYNTH_LLAMA_RELU,
    SI_SYNTH_LLAMA_SILU,
    SI_SYNTH_BAMBOO,
    SI_SYNTH_OPT,
    SI_SYNTH_ARCH_COUNT
};

/* Bamboo's up rows are positive with this probability. */
#define SI_SYNTH_BAMBOO_UP_P 0.98
/* No neuron fires with a higher probability than this. */
#define SI_SYNTH_P_MAX 0.99

/* Called now and then while writing with the data bytes made so far. */
typedef void (*si_synth_progress_fn)(void *user, uint64_t done, uint64_t total);

struct si_synth_params {
    enum si_synth_arch arch;
    uint32_t type; /* enum si_type of the big matrices: any si_type_quantizable() */
    bool mix_m;    /* with Q4_K or Q5_K: the "_M" mix of llama.cpp's Q4_K_M and
                    * Q5_K_M files: attn_v and ffn_down in Q6_K in the first and
                    * last eighth of the layers and every third layer between
                    * (si_synth_more_bits), the output in Q6_K */
    int64_t n_embd, n_ff, n_layer, n_head, n_head_kv, n_vocab, n_ctx;
    double sparsity;     /* mean fraction of FFN neurons that stay inactive (0.9) */
    double hot_fraction; /* the most active hot_fraction of neurons (0.2) ... */
    double hot_share;    /* ... carry this share of all activations (0.8) */
    uint64_t seed;
    int64_t predictor_rank; /* > 0: blk.N.fc1/fc2 predictor and ffn_down_t tensors */
    bool powerinfer;        /* "PWRI" magic and PowerInfer's tensor set: ffn_down_t
                             * alone (Q4_0, else F16: what PowerInfer's kernel
                             * reads), no ffn_planted_prob; needs predictor_rank */
    si_synth_progress_fn progress;
    void *progress_user;
};

/* Whether layer l of n gets Q6_K attn_v and ffn_down in the "_M" mix. */
bool si_synth_more_bits(int64_t l, int64_t n);

/* The big matrices' types as a name: "F32", ..., "Q4_K_M". */
const char *si_synth_type_name(const struct si_synth_params *p);

/* The "tiny" preset, llama-relu, F32, seed 1, sparsity 0.9, 0.2:0.8. */
struct si_synth_params si_synth_default_params(void);

/*
 * Set the dimensions of a preset ("tiny", "7b", "13b", "opt-6.7b",
 * "opt-13b"); other fields are kept.  SI_OK or SI_E_NOT_FOUND.
 */
int si_synth_preset(const char *name, struct si_synth_params *p);

/* "llama-relu", "llama-silu", "bamboo", "opt"; and back (SI_E_NOT_FOUND). */
const char *si_synth_arch_name(enum si_synth_arch arch);
int si_synth_arch_parse(const char *name, enum si_synth_arch *out);

/* SI_OK, or SI_E_INVALID with one line in err saying which value is wrong. */
int si_synth_check(const struct si_synth_params *p, char *err, size_t err_size);

/*
 * The planted probabilities in decreasing order (p[0..n) before any
 * shuffling): mean 1 - sparsity, the first round(hot_fraction * n) carrying
 * hot_share of the sum, none above p_max.  SI_E_INVALID when no such profile
 * exists.
 */
int si_synth_profile(int64_t n, double sparsity, double hot_fraction, double hot_share,
                     double p_max, float *p, char *err, size_t err_size);

/* Data bytes the file will hold (all tensors, without padding). */
uint64_t si_synth_data_bytes(const struct si_synth_params *p);

/* Write the model to path (streaming, tensor by tensor); SI_OK or an error in err. */
int si_synth_write(const struct si_synth_params *p, const char *path, char *err, size_t err_size);

/* Activation statistics of one layer's FFN input. */
struct si_synth_stats {
    double sparsity;  /* fraction of (neuron, token) pairs that did not fire */
    double hot_share; /* share of firings carried by the most active hot_fraction */
    double corr;      /* correlation of firing rates with the planted p_i (0 if absent) */
    int64_t n_samples;
};

/*
 * Measure layer `layer` of an opened synthetic (or any llama/bamboo/opt)
 * model: n_samples token embeddings (all rows in order when n_samples is at
 * least the vocabulary, else random rows drawn with `seed`) go through the
 * layer's FFN norm and the gate (OPT: fc1 with its bias; bamboo: gate and up),
 * counting the positive pre-activations.
 */
/* The key of PowerInfer-layout files' planted probabilities: FLOAT32
 * (n_layer x n_ff), layer by layer. */
#define SI_SYNTH_PLANTED_KEY "starinfer.synth.planted_prob"

/* Layer `layer`'s planted probabilities (n_ff floats) of an opened synthetic
 * model into out: its blk.N.ffn_planted_prob, or its part of
 * SI_SYNTH_PLANTED_KEY; false when the file has neither (or of another
 * shape). */
bool si_synth_planted(const struct si_gguf *g, int64_t layer, int64_t n_ff, float *out);

int si_synth_measure(const struct si_gguf *g, int64_t layer, int64_t n_samples, uint64_t seed,
                     double hot_fraction, struct si_synth_stats *out, char *err,
                     size_t err_size);

#endif /* SI_MODEL_SYNTH_H */
