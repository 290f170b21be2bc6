/* synth.c - synthetic models with planted FFN activity (see synth.h). */
#include "model/synth.h"

#include "model/gguf_write.h"
#include "model/quants.h"
#include "model/types.h"
#include "internal.h"
#include "starinfer.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define N_BYTE_TOKENS 256
#define BOS_ID 256
#define EOS_ID 257
#define N_FIXED_TOKENS 258

/* Token types of llama.cpp's vocabulary (a file format fact). */
#define TOKEN_NORMAL 1
#define TOKEN_CONTROL 3
#define TOKEN_UNUSED 5

/* ------------------------------------------------------ random numbers */

/*
 * Every weight is a pure function of (tensor key, element index): the
 * splitmix64 finaliser of key + (index + 1) * golden ratio.  So any row, or
 * any element (ffn_down_t reads ffn_down's elements transposed), can be made
 * in any order, and the same seed always gives the same bytes.
 */
#define GOLDEN 0x9e3779b97f4a7c15u

static uint64_t mix64(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9u;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebu;
    return z ^ (z >> 31);
}

/* Uniform in [-1, 1), 24 bits. */
static float uni(uint64_t key, uint64_t index)
{
    int64_t v = (int64_t)mix64(key + (index + 1) * GOLDEN);
    return (float)(v >> 40) * (1.0f / 8388608.0f);
}

/* The key of a tensor: the seed mixed with its name. */
static uint64_t tensor_key(uint64_t seed, const char *name)
{
    uint64_t h = 1469598103934665603u;
    for (const char *c = name; *c; c++)
        h = (h ^ (uint8_t)*c) * 1099511628211u;
    return mix64(seed ^ mix64(h));
}

/* Standard normal quantile, by bisection on the CDF (p in (0, 1)). */
static double normal_quantile(double p)
{
    double lo = -12.0, hi = 12.0;
    for (int i = 0; i < 100; i++) {
        double mid = 0.5 * (lo + hi);
        if (0.5 * erfc(-mid / sqrt(2.0)) < p)
            lo = mid;
        else
            hi = mid;
    }
    return 0.5 * (lo + hi);
}

/* ------------------------------------------------------ parameters */

static const char *const arch_names[SI_SYNTH_ARCH_COUNT] = {
    [SI_SYNTH_LLAMA_RELU] = "llama-relu",
    [SI_SYNTH_LLAMA_SILU] = "llama-silu",
    [SI_SYNTH_BAMBOO] = "bamboo",
    [SI_SYNTH_OPT] = "opt",
};

const char *si_synth_arch_name(enum si_synth_arch arch)
{
    return (unsigned)arch < SI_SYNTH_ARCH_COUNT ? arch_names[arch] : "?";
}

int si_synth_arch_parse(const char *name, enum si_synth_arch *out)
{
    for (int a = 0; a < SI_SYNTH_ARCH_COUNT; a++)
        if (strcmp(name, arch_names[a]) == 0) {
            *out = (enum si_synth_arch)a;
            return SI_OK;
        }
    return SI_E_NOT_FOUND;
}

struct preset {
    const char *name;
    int64_t n_embd, n_ff, n_layer, n_head, n_head_kv, n_vocab, n_ctx;
};

static const struct preset presets[] = {
    {"tiny", 64, 256, 2, 4, 2, 300, 256},
    {"7b", 4096, 11008, 32, 32, 32, 32000, 2048},
    {"13b", 5120, 13824, 40, 40, 40, 32000, 2048},
    {"opt-6.7b", 4096, 16384, 32, 32, 32, 50272, 2048},
    {"opt-13b", 5120, 20480, 40, 40, 40, 50272, 2048},
};

int si_synth_preset(const char *name, struct si_synth_params *p)
{
    for (size_t i = 0; i < sizeof presets / sizeof presets[0]; i++) {
        const struct preset *s = &presets[i];
        if (strcmp(name, s->name) != 0)
            continue;
        p->n_embd = s->n_embd;
        p->n_ff = s->n_ff;
        p->n_layer = s->n_layer;
        p->n_head = s->n_head;
        p->n_head_kv = s->n_head_kv;
        p->n_vocab = s->n_vocab;
        p->n_ctx = s->n_ctx;
        return SI_OK;
    }
    return SI_E_NOT_FOUND;
}

struct si_synth_params si_synth_default_params(void)
{
    struct si_synth_params p = {
        .arch = SI_SYNTH_LLAMA_RELU,
        .type = SI_TYPE_F32,
        .sparsity = 0.9,
        .hot_fraction = 0.2,
        .hot_share = 0.8,
        .seed = 1,
    };
    si_synth_preset("tiny", &p);
    return p;
}

/* Width of the constant channel: a whole block, so quantization keeps it exact. */
static int64_t channel_width(const struct si_synth_params *p)
{
    if (p->arch == SI_SYNTH_OPT)
        return 0;
    const struct si_type_traits *tr = si_type_get(p->type);
    return tr != NULL ? tr->block : 1;
}

bool si_synth_more_bits(int64_t l, int64_t n)
{
    return l < n / 8 || l >= 7 * n / 8 || (l - n / 8) % 3 == 2;
}

const char *si_synth_type_name(const struct si_synth_params *p)
{
    if (p->mix_m)
        return p->type == SI_TYPE_Q4_K ? "Q4_K_M" : p->type == SI_TYPE_Q5_K ? "Q5_K_M" : "?_M";
    return si_type_name(p->type);
}

/* attn_v and ffn_down (and ffn_down_t) of layer l. */
static uint32_t more_bits_type(const struct si_synth_params *p, int64_t l)
{
    return p->mix_m && si_synth_more_bits(l, p->n_layer) ? SI_TYPE_Q6_K : p->type;
}

/* ffn_down_t's type in layer l: ffn_down's; in PowerInfer's layout Q4_0 or
 * F16, the two its sparse down kernel reads (it takes any other as F16). */
static uint32_t down_t_type(const struct si_synth_params *p, int64_t l)
{
    const uint32_t t = more_bits_type(p, l);
    return !p->powerinfer || t == SI_TYPE_Q4_0 ? t : SI_TYPE_F16;
}

/* Predictor tensors: F32 in F32 models, F16 otherwise. */
static uint32_t predictor_type(const struct si_synth_params *p)
{
    return p->type == SI_TYPE_F32 ? SI_TYPE_F32 : SI_TYPE_F16;
}

static double p_max_of(const struct si_synth_params *p)
{
    return p->arch == SI_SYNTH_BAMBOO ? SI_SYNTH_P_MAX * SI_SYNTH_BAMBOO_UP_P : SI_SYNTH_P_MAX;
}

int si_synth_check(const struct si_synth_params *p, char *err, size_t err_size)
{
    const int E = SI_E_INVALID;
    if ((unsigned)p->arch >= SI_SYNTH_ARCH_COUNT)
        return si__errf(err, err_size, E, "unknown architecture %d", (int)p->arch);
    if (p->type >= SI_TYPE_COUNT || !si_type_quantizable(p->type))
        return si__errf(err, err_size, E,
                        "type %s cannot be written (f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, "
                        "q4_k, q5_k, q6_k can)",
                        si_type_name(p->type));
    if (p->mix_m && p->type != SI_TYPE_Q4_K && p->type != SI_TYPE_Q5_K)
        return si__errf(err, err_size, E, "the _M mix is for q4_k and q5_k, not %s",
                        si_type_name(p->type));
    const int64_t block = si_type_get(p->type)->block;
    const int64_t big = (int64_t)1 << 20;
    if (p->n_embd < 1 || p->n_embd > big || p->n_ff < 1 || p->n_ff > big || p->n_layer < 1 ||
        p->n_layer > 10000 || p->n_vocab < 1 || p->n_vocab > (int64_t)1 << 24 || p->n_ctx < 1 ||
        p->n_ctx > big || p->n_head < 1 || p->n_head_kv < 1 || p->predictor_rank < 0 ||
        p->predictor_rank > big)
        return si__errf(err, err_size, E, "a dimension is out of range");
    if (p->powerinfer && p->predictor_rank < 1)
        return si__errf(err, err_size, E,
                        "PowerInfer's layout needs the predictors and ffn_down_t (--predictor R)");
    if (p->n_embd % block != 0)
        return si__errf(err, err_size, E, "n-embd %lld is not a multiple of the %s block size %lld",
                    (long long)p->n_embd, si_type_name(p->type), (long long)block);
    if (p->n_ff % block != 0)
        return si__errf(err, err_size, E, "n-ff %lld is not a multiple of the %s block size %lld",
                    (long long)p->n_ff, si_type_name(p->type), (long long)block);
    if (p->arch != SI_SYNTH_OPT && p->n_embd < 2 * channel_width(p))
        return si__errf(err, err_size, E, "n-embd %lld is too small: %s needs at least %lld",
                    (long long)p->n_embd, si_type_name(p->type), (long long)(2 * block));
    if (p->n_embd % p->n_head != 0)
        return si__errf(err, err_size, E, "n-embd %lld is not a multiple of n-head %lld",
                    (long long)p->n_embd, (long long)p->n_head);
    if (p->arch != SI_SYNTH_OPT && (p->n_embd / p->n_head) % 2 != 0)
        return si__errf(err, err_size, E, "the head size %lld is odd (RoPE needs pairs)",
                    (long long)(p->n_embd / p->n_head));
    if (p->n_head_kv > p->n_head || p->n_head % p->n_head_kv != 0)
        return si__errf(err, err_size, E, "n-head %lld is not a multiple of n-head-kv %lld",
                    (long long)p->n_head, (long long)p->n_head_kv);
    if (p->arch == SI_SYNTH_OPT && p->n_head_kv != p->n_head)
        return si__errf(err, err_size, E, "opt has no grouped-query attention (n-head-kv %lld != "
                    "n-head %lld)", (long long)p->n_head_kv, (long long)p->n_head);
    if (p->n_vocab < N_FIXED_TOKENS)
        return si__errf(err, err_size, E, "n-vocab %lld is below %d (256 bytes, BOS, EOS)",
                    (long long)p->n_vocab, N_FIXED_TOKENS);
    if (!(p->sparsity > 0.0 && p->sparsity < 1.0) || 1.0 - p->sparsity > p_max_of(p))
        return si__errf(err, err_size, E, "sparsity %g is out of range (%g, 1)", p->sparsity,
                    1.0 - p_max_of(p));
    if (!(p->hot_fraction > 0.0 && p->hot_fraction < 1.0))
        return si__errf(err, err_size, E, "hot fraction %g is not in (0, 1)", p->hot_fraction);
    if (!(p->hot_share > p->hot_fraction && p->hot_share < 1.0))
        return si__errf(err, err_size, E, "hot share %g is not in (hot fraction %g, 1)",
                    p->hot_share, p->hot_fraction);
    return SI_OK;
}

/* ------------------------------------------------------ the power law */

struct law {
    int64_t n, k_hot;
    double p_max;
    const double *lt; /* log of each rank's position t */
    double *pw;       /* t^-alpha for the alpha at hand */
};

static double law_mean(const struct law *l, double a)
{
    double s = 0;
    for (int64_t k = 0; k < l->n; k++)
        s += fmin(l->p_max, a * l->pw[k]);
    return s / (double)l->n;
}

/* For one alpha: the A with the wanted mean, and the top share it gives. */
static double law_share(struct law *l, double alpha, double mean, double *a_out)
{
    for (int64_t k = 0; k < l->n; k++)
        l->pw[k] = exp(-alpha * l->lt[k]);
    double lo = 0.0, hi = l->p_max;
    for (int i = 0; i < 64; i++) {
        double mid = 0.5 * (lo + hi);
        if (law_mean(l, mid) < mean)
            lo = mid;
        else
            hi = mid;
    }
    double a = 0.5 * (lo + hi), top = 0, all = 0;
    for (int64_t k = 0; k < l->n; k++) {
        double v = fmin(l->p_max, a * l->pw[k]);
        all += v;
        if (k < l->k_hot)
            top += v;
    }
    *a_out = a;
    return all > 0 ? top / all : 0;
}

int si_synth_profile(int64_t n, double sparsity, double hot_fraction, double hot_share,
                     double p_max, float *p, char *err, size_t err_size)
{
    const double mean = 1.0 - sparsity;
    if (n < 1 || !(mean > 0 && mean <= p_max) || !(hot_fraction > 0 && hot_fraction < 1))
        return si__errf(err, err_size, SI_E_INVALID, "bad activity targets");
    double *lt = malloc((size_t)n * sizeof *lt);
    double *pw = malloc((size_t)n * sizeof *pw);
    if (lt == NULL || pw == NULL) {
        free(lt);
        free(pw);
        return si__errf(err, err_size, SI_E_NOMEM, "out of memory");
    }
    for (int64_t k = 0; k < n; k++)
        lt[k] = log(((double)k + 0.5) / (double)n);
    int64_t k_hot = (int64_t)llround(hot_fraction * (double)n);
    struct law l = {.n = n, .k_hot = k_hot < 1 ? 1 : k_hot, .p_max = p_max, .lt = lt, .pw = pw};

    /* The share grows with alpha: bisect between a flat and a very steep law. */
    double a, lo = 0.0, hi = 30.0;
    double s_lo = law_share(&l, lo, mean, &a), s_hi = law_share(&l, hi, mean, &a);
    int rc = SI_OK;
    if (hot_share < s_lo - 1e-9 || hot_share > s_hi + 1e-9) {
        rc = si__errf(err, err_size, SI_E_INVALID,
                  "cannot plant a hot share of %g in the top %g of %lld neurons with mean "
                  "activity %g: reachable shares are %.3f to %.3f",
                  hot_share, hot_fraction, (long long)n, mean, s_lo, s_hi);
    } else {
        for (int i = 0; i < 64; i++) {
            double mid = 0.5 * (lo + hi);
            if (law_share(&l, mid, mean, &a) < hot_share)
                lo = mid;
            else
                hi = mid;
        }
        law_share(&l, 0.5 * (lo + hi), mean, &a);
        for (int64_t k = 0; k < n; k++)
            p[k] = (float)fmin(p_max, a * pw[k]);
    }
    free(lt);
    free(pw);
    return rc;
}

/* ------------------------------------------------------ the tokenizer */

/* GPT-2's byte alphabet: printable bytes stand for themselves, the other 68
 * take the code points from U+0100 on, in byte order.  UTF-8 into out. */
static void byte_token(int b, char out[4])
{
    int cp;
    if ((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255)) {
        cp = b;
    } else {
        int k = 0;
        for (int c = 0; c < b; c++)
            k += !((c >= 33 && c <= 126) || (c >= 161 && c <= 172) || (c >= 174 && c <= 255));
        cp = 256 + k;
    }
    if (cp < 0x80) {
        out[0] = (char)cp;
        out[1] = '\0';
    } else {
        out[0] = (char)(0xc0 | (cp >> 6));
        out[1] = (char)(0x80 | (cp & 0x3f));
        out[2] = '\0';
    }
}

/*
 * Vocabulary: ids 0..255 the bytes, 256 BOS "<s>", 257 EOS "</s>", then
 * merged tokens while the vocabulary has room ("Ġx" for each letter x,
 * then "xy" for each letter pair, then "Ġxy" = "Ġx" + "y"), then
 * "<unused_N>".  Each merged token comes with its merge, in rank order.
 */
static int set_tokenizer(struct si_gguf_writer *w, int64_t n_vocab)
{
    const int64_t n_merge_max = 26 + 26 * 26 + 26 * 26;
    int64_t n_merges = n_vocab - N_FIXED_TOKENS;
    if (n_merges > n_merge_max)
        n_merges = n_merge_max;
    char **tokens = calloc((size_t)n_vocab, sizeof *tokens);
    char **merges = calloc((size_t)(n_merges > 0 ? n_merges : 1), sizeof *merges);
    int32_t *types = malloc((size_t)n_vocab * sizeof *types);
    int rc = SI_E_NOMEM;
    if (tokens == NULL || merges == NULL || types == NULL)
        goto done;
    const char *sp = "\xc4\xa0"; /* "Ġ", the space byte's character */
    for (int64_t i = 0; i < n_vocab; i++) {
        char tok[32], merge[32];
        merge[0] = '\0';
        types[i] = TOKEN_NORMAL;
        if (i < N_BYTE_TOKENS) {
            byte_token((int)i, tok);
        } else if (i == BOS_ID || i == EOS_ID) {
            snprintf(tok, sizeof tok, "%s", i == BOS_ID ? "<s>" : "</s>");
            types[i] = TOKEN_CONTROL;
        } else if (i - N_FIXED_TOKENS < n_merges) {
            int64_t m = i - N_FIXED_TOKENS;
            if (m < 26) {
                snprintf(tok, sizeof tok, "%s%c", sp, (char)('a' + m));
                snprintf(merge, sizeof merge, "%s %c", sp, (char)('a' + m));
            } else if (m < 26 + 676) {
                char x = (char)('a' + (m - 26) / 26), y = (char)('a' + (m - 26) % 26);
                snprintf(tok, sizeof tok, "%c%c", x, y);
                snprintf(merge, sizeof merge, "%c %c", x, y);
            } else {
                char x = (char)('a' + (m - 702) / 26), y = (char)('a' + (m - 702) % 26);
                snprintf(tok, sizeof tok, "%s%c%c", sp, x, y);
                snprintf(merge, sizeof merge, "%s%c %c", sp, x, y);
            }
        } else {
            snprintf(tok, sizeof tok, "<unused_%lld>", (long long)(i - N_FIXED_TOKENS - n_merges));
            types[i] = TOKEN_UNUSED;
        }
        if ((tokens[i] = strdup(tok)) == NULL)
            goto done;
        if (merge[0] != '\0' && (merges[i - N_FIXED_TOKENS] = strdup(merge)) == NULL)
            goto done;
    }
    if ((rc = si_gguf_writer_set_str(w, "tokenizer.ggml.model", "gpt2")) != SI_OK ||
        (rc = si_gguf_writer_set_str(w, "tokenizer.ggml.pre", "default")) != SI_OK ||
        (rc = si_gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", (const char *const *)tokens,
                                         (uint64_t)n_vocab)) != SI_OK ||
        (rc = si_gguf_writer_set_arr(w, "tokenizer.ggml.token_type", SI_GGUF_INT32, types,
                                     (uint64_t)n_vocab)) != SI_OK ||
        (rc = si_gguf_writer_set_arr_str(w, "tokenizer.ggml.merges", (const char *const *)merges,
                                         (uint64_t)(n_merges > 0 ? n_merges : 0))) != SI_OK ||
        (rc = si_gguf_writer_set_u32(w, "tokenizer.ggml.bos_token_id", BOS_ID)) != SI_OK ||
        (rc = si_gguf_writer_set_u32(w, "tokenizer.ggml.eos_token_id", EOS_ID)) != SI_OK ||
        (rc = si_gguf_writer_set_bool(w, "tokenizer.ggml.add_bos_token", true)) != SI_OK)
        goto done;
    rc = SI_OK;
done:
    if (tokens != NULL)
        for (int64_t i = 0; i < n_vocab; i++)
            free(tokens[i]);
    if (merges != NULL)
        for (int64_t i = 0; i < n_merges; i++)
            free(merges[i]);
    free(tokens);
    free(merges);
    free(types);
    return rc;
}

/* ------------------------------------------------------ tensor sources */

enum kind {
    K_ONES,      /* norm weights */
    K_ZEROS,     /* norm biases, output biases */
    K_RANDOM,    /* uniform, amplitude amp */
    K_EMBED,     /* token embeddings: 1.0 on the channel, unit variance elsewhere */
    K_NO_CHAN,   /* random, rows (output dimensions) on the channel zero */
    K_DOWN_T,    /* ffn_down transposed: row i = column i of K_NO_CHAN ffn_down */
    K_PLANTED,   /* gate / up rows: random off the channel, c_i / B on it */
    K_FC1_BIAS,  /* OPT's planted fc1 bias */
    K_PROB,      /* the planted probabilities */
};

struct synth;

struct source {
    struct synth *s;
    enum kind kind;
    uint32_t type;
    int64_t ne0;     /* row length */
    int64_t layer;
    uint64_t key;    /* element stream (K_DOWN_T: ffn_down's, K_FC1_BIAS: ffn_up's) */
    float amp;       /* uniform amplitude */
    const float *z;  /* K_PLANTED, K_FC1_BIAS: the normal quantile of each row's p */
    float z_const;   /* K_PLANTED without z: one quantile for all rows */
};

struct synth {
    const struct si_synth_params *p;
    int64_t chan;        /* constant channel width, 0 for OPT */
    float *prob;         /* [n_layer][n_ff] the planted firing probabilities */
    float *gate_z;       /* [n_layer][n_ff] quantiles the gate (OPT: fc1) rows use */
    float *row, *tmp;    /* scratch rows of max_ne0 floats */
    float *out;          /* scratch row for one-row outputs */
    uint8_t *qrow;       /* scratch quantized row */
    struct source *src;
    size_t n_src, cap_src;
    uint64_t done, total;
    double last_report;
};

/* Row r of a random matrix with `chan` zeroed leading elements. */
static void random_row(float *row, int64_t n, uint64_t key, int64_t r, float amp, int64_t chan)
{
    uint64_t base = (uint64_t)r * (uint64_t)n;
    for (int64_t j = 0; j < n; j++)
        row[j] = j < chan ? 0.0f : amp * uni(key, base + (uint64_t)j);
}

/* Norm of a quantized row's values from element `from` (about their mean if centred). */
static double quantized_norm(uint32_t type, const float *row, int64_t n, int64_t from,
                             bool centred, uint8_t *q, float *tmp)
{
    si_quantize_row(type, row, q, n);
    si_dequantize_row(type, q, tmp, n);
    double mean = 0, s = 0;
    if (centred) {
        for (int64_t j = from; j < n; j++)
            mean += tmp[j];
        mean /= (double)(n - from);
    }
    for (int64_t j = from; j < n; j++)
        s += ((double)tmp[j] - mean) * ((double)tmp[j] - mean);
    return sqrt(s);
}

static void make_row(struct source *c, int64_t r, void *dst)
{
    struct synth *s = c->s;
    const struct si_synth_params *p = s->p;
    const int64_t n = c->ne0;
    float *row = s->row;
    switch (c->kind) {
    case K_ONES:
    case K_ZEROS:
        for (int64_t j = 0; j < n; j++)
            row[j] = c->kind == K_ONES ? 1.0f : 0.0f;
        break;
    case K_RANDOM:
        random_row(row, n, c->key, r, c->amp, 0);
        break;
    case K_EMBED:
        random_row(row, n, c->key, r, c->amp, 0);
        for (int64_t j = 0; j < s->chan; j++)
            row[j] = 1.0f;
        break;
    case K_NO_CHAN:
        if (r < s->chan)
            memset(row, 0, (size_t)n * sizeof *row);
        else
            random_row(row, n, c->key, r, c->amp, 0);
        break;
    case K_DOWN_T:
        /* Element j of neuron r is ffn_down's element (row j, column r). */
        for (int64_t j = 0; j < n; j++)
            row[j] = j < s->chan ? 0.0f
                                 : c->amp * uni(c->key, (uint64_t)j * (uint64_t)p->n_ff +
                                                            (uint64_t)r);
        break;
    case K_PLANTED: {
        random_row(row, n, c->key, r, c->amp, s->chan);
        double norm = quantized_norm(c->type, row, n, s->chan, false, dst, s->tmp);
        double z = c->z != NULL ? c->z[r] : c->z_const;
        for (int64_t j = 0; j < s->chan; j++)
            row[j] = (float)(norm * z / (double)s->chan);
        /* Only the channel's block changes: quantize it over the first block. */
        si_quantize_row(c->type, row, dst, s->chan);
        return;
    }
    case K_FC1_BIAS:
        /* One row of n_ff biases, each from its fc1 row (n_embd long). */
        for (int64_t i = 0; i < n; i++) {
            random_row(s->tmp, p->n_embd, c->key, i, c->amp, 0);
            double norm =
                quantized_norm(p->type, s->tmp, p->n_embd, 0, true, s->qrow, s->out);
            row[i] = (float)(norm * c->z[i]);
        }
        break;
    case K_PROB:
        memcpy(row, s->prob + c->layer * p->n_ff, (size_t)n * sizeof *row);
        break;
    }
    si_quantize_row(c->type, row, dst, n);
}

static int fill(void *user, int64_t row0, int64_t n_rows, void *dst)
{
    struct source *c = user;
    struct synth *s = c->s;
    size_t row_size = 0;
    si_type_row_size(c->type, c->ne0, &row_size);
    for (int64_t r = 0; r < n_rows; r++)
        make_row(c, row0 + r, (uint8_t *)dst + (size_t)r * row_size);
    s->done += (uint64_t)n_rows * row_size;
    if (s->p->progress != NULL) {
        double t = si__now();
        if (t - s->last_report >= 0.25 || s->done == s->total) {
            s->last_report = t;
            s->p->progress(s->p->progress_user, s->done, s->total);
        }
    }
    return SI_OK;
}

/* Bytes of a tensor; the sizes were checked by si_synth_check. */
static uint64_t tensor_bytes(uint32_t type, int64_t ne0, int64_t ne1)
{
    size_t row = 0;
    si_type_row_size(type, ne0, &row);
    return (uint64_t)row * (uint64_t)ne1;
}

/* Each tensor of the model, in file order, for both counting and writing. */
typedef int (*tensor_fn)(void *ctx, const char *name, enum kind kind, uint32_t type,
                         int64_t ne0, int64_t ne1, int64_t layer, float amp);

static int for_each_tensor(const struct si_synth_params *p, tensor_fn fn, void *ctx)
{
    const bool opt = p->arch == SI_SYNTH_OPT;
    const int64_t d = p->n_embd, ff = p->n_ff;
    const int64_t kv = opt ? d : d / p->n_head * p->n_head_kv;
    const uint32_t t = p->type, f32 = SI_TYPE_F32, pt = predictor_type(p);
    /* Residual writes are small: all layers together add ~8% to its variance. */
    const float r = 0.2f / sqrtf((float)p->n_layer);
    const float s3 = sqrtf(3.0f);
    const float a_in = s3 / sqrtf((float)d);
    const float a_out = s3 * r / sqrtf((float)d);
    const float a_down = s3 * r / sqrtf((float)ff * (float)(1.0 - p->sparsity));
    char name[96];
    int rc;
#define T(kind, type, ne0, ne1, layer, amp)                                                        \
    do {                                                                                           \
        if ((rc = fn(ctx, name, kind, type, ne0, ne1, layer, amp)) != SI_OK)                       \
            return rc;                                                                             \
    } while (0)
#define NAME(...) snprintf(name, sizeof name, __VA_ARGS__)

    NAME("token_embd.weight");
    T(K_EMBED, t, d, p->n_vocab, -1, s3);
    if (opt) {
        /* OPT's positions are rows 2 on (Hugging Face's, and PowerInfer's) */
        NAME("position_embd.weight");
        T(K_RANDOM, f32, d, p->n_ctx + 2, -1, 0.1f * s3);
    }
    for (int64_t l = 0; l < p->n_layer; l++) {
        long long L = (long long)l;
        NAME("blk.%lld.attn_norm.weight", L);
        T(K_ONES, f32, d, 1, l, 0);
        if (opt) {
            NAME("blk.%lld.attn_norm.bias", L);
            T(K_ZEROS, f32, d, 1, l, 0);
        }
        const char *qkv[3] = {"q", "k", "v"};
        for (int i = 0; i < 3; i++) {
            NAME("blk.%lld.attn_%s.weight", L, qkv[i]);
            T(K_RANDOM, i == 2 ? more_bits_type(p, l) : t, d, i == 0 ? d : kv, l, a_in);
            if (opt) {
                NAME("blk.%lld.attn_%s.bias", L, qkv[i]);
                T(K_RANDOM, f32, i == 0 ? d : kv, 1, l, 0.02f * s3);
            }
        }
        NAME("blk.%lld.attn_output.weight", L);
        T(K_NO_CHAN, t, d, d, l, a_out);
        if (opt) {
            NAME("blk.%lld.attn_output.bias", L);
            T(K_ZEROS, f32, d, 1, l, 0);
        }
        NAME("blk.%lld.ffn_norm.weight", L);
        T(K_ONES, f32, d, 1, l, 0);
        if (opt) {
            NAME("blk.%lld.ffn_norm.bias", L);
            T(K_ZEROS, f32, d, 1, l, 0);
            NAME("blk.%lld.ffn_up.weight", L);
            T(K_RANDOM, t, d, ff, l, a_in);
            NAME("blk.%lld.ffn_up.bias", L);
            T(K_FC1_BIAS, f32, ff, 1, l, a_in);
        } else {
            NAME("blk.%lld.ffn_gate.weight", L);
            T(K_PLANTED, t, d, ff, l, a_in);
            NAME("blk.%lld.ffn_up.weight", L);
            T(p->arch == SI_SYNTH_BAMBOO ? K_PLANTED : K_RANDOM, t, d, ff, l, a_in);
        }
        /* PowerInfer's layout: the tensors it makes, no more (its loader
         * refuses any other): ffn_down_t alone, the planted probabilities
         * in a key (si_synth_write) */
        if (!p->powerinfer) {
            NAME("blk.%lld.ffn_down.weight", L);
            T(K_NO_CHAN, more_bits_type(p, l), ff, d, l, a_down);
        }
        if (opt) { /* PowerInfer names it after ffn_down_t */
            NAME("blk.%lld.ffn_down%s.bias", L, p->powerinfer ? "_t" : "");
            T(K_ZEROS, f32, d, 1, l, 0);
        }
        if (!p->powerinfer) {
            NAME("blk.%lld.ffn_planted_prob", L);
            T(K_PROB, f32, ff, 1, l, 0);
        }
        if (p->predictor_rank > 0) {
            NAME("blk.%lld.fc1.weight", L);
            T(K_RANDOM, pt, d, p->predictor_rank, l, a_in);
            NAME("blk.%lld.fc2.weight", L);
            T(K_RANDOM, pt, p->predictor_rank, ff, l, s3 / sqrtf((float)p->predictor_rank));
            NAME("blk.%lld.ffn_down_t.weight", L);
            T(K_DOWN_T, down_t_type(p, l), d, ff, l, a_down);
        }
    }
    NAME("output_norm.weight");
    T(K_ONES, f32, d, 1, -1, 0);
    if (opt) {
        NAME("output_norm.bias");
        T(K_ZEROS, f32, d, 1, -1, 0);
    }
    NAME("output.weight");
    T(K_RANDOM, p->mix_m ? SI_TYPE_Q6_K : t, d, p->n_vocab, -1, a_in);
#undef T
#undef NAME
    return SI_OK;
}

static int count_tensor(void *ctx, const char *name, enum kind kind, uint32_t type, int64_t ne0,
                        int64_t ne1, int64_t layer, float amp)
{
    (void)name, (void)kind, (void)layer, (void)amp;
    *(uint64_t *)ctx += tensor_bytes(type, ne0, ne1);
    return SI_OK;
}

uint64_t si_synth_data_bytes(const struct si_synth_params *p)
{
    uint64_t total = 0;
    for_each_tensor(p, count_tensor, &total);
    return total;
}

struct add_ctx {
    struct synth *s;
    struct si_gguf_writer *w;
};

static int add_tensor(void *ctx, const char *name, enum kind kind, uint32_t type, int64_t ne0,
                      int64_t ne1, int64_t layer, float amp)
{
    struct add_ctx *a = ctx;
    struct synth *s = a->s;
    const struct si_synth_params *p = s->p;
    if (s->n_src == s->cap_src)
        return SI_E_INVALID; /* counted wrong: a bug */
    struct source *c = &s->src[s->n_src++];
    *c = (struct source){.s = s, .kind = kind, .type = type, .ne0 = ne0, .layer = layer,
                         .key = tensor_key(p->seed, name), .amp = amp};
    if (kind == K_DOWN_T || kind == K_FC1_BIAS) {
        /* Same elements as ffn_down / ffn_up of this layer. */
        char other[96];
        snprintf(other, sizeof other, "blk.%lld.%s.weight", (long long)layer,
                 kind == K_DOWN_T ? "ffn_down" : "ffn_up");
        c->key = tensor_key(p->seed, other);
    }
    if (kind == K_FC1_BIAS || (kind == K_PLANTED && strstr(name, "ffn_gate") != NULL))
        c->z = s->gate_z + layer * p->n_ff;
    else if (kind == K_PLANTED)
        c->z_const = (float)normal_quantile(SI_SYNTH_BAMBOO_UP_P);
    int64_t ne[2] = {ne0, ne1};
    return si_gguf_writer_add_tensor_cb(a->w, name, type, ne1 > 1 ? 2 : 1, ne, fill, c);
}

static int count_sources(void *ctx, const char *name, enum kind kind, uint32_t type, int64_t ne0,
                         int64_t ne1, int64_t layer, float amp)
{
    (void)name, (void)kind, (void)type, (void)ne0, (void)ne1, (void)layer, (void)amp;
    (*(size_t *)ctx)++;
    return SI_OK;
}

/* Per-layer planted probabilities: the profile, shuffled per layer. */
static int plant(struct synth *s, char *err, size_t err_size)
{
    const struct si_synth_params *p = s->p;
    const int64_t ff = p->n_ff;
    float *profile = malloc((size_t)ff * sizeof *profile);
    if (profile == NULL)
        return si__errf(err, err_size, SI_E_NOMEM, "out of memory");
    int rc = si_synth_profile(ff, p->sparsity, p->hot_fraction, p->hot_share, p_max_of(p),
                              profile, err, err_size);
    if (rc != SI_OK) {
        free(profile);
        return rc;
    }
    /* Quantiles of the profile's distinct values, computed once. */
    float *z = malloc((size_t)ff * sizeof *z);
    if (z == NULL) {
        free(profile);
        return si__errf(err, err_size, SI_E_NOMEM, "out of memory");
    }
    const double q = p->arch == SI_SYNTH_BAMBOO ? SI_SYNTH_BAMBOO_UP_P : 1.0;
    for (int64_t k = 0; k < ff; k++)
        z[k] = k > 0 && profile[k] == profile[k - 1] ? z[k - 1]
                                                      : (float)normal_quantile(profile[k] / q);
    int64_t *perm = malloc((size_t)ff * sizeof *perm);
    if (perm == NULL) {
        free(profile);
        free(z);
        return si__errf(err, err_size, SI_E_NOMEM, "out of memory");
    }
    for (int64_t l = 0; l < p->n_layer; l++) {
        uint64_t key = tensor_key(p->seed ^ (uint64_t)l, "planted permutation");
        for (int64_t i = 0; i < ff; i++)
            perm[i] = i;
        for (int64_t i = ff - 1; i > 0; i--) {
            int64_t j = (int64_t)(mix64(key + (uint64_t)i * GOLDEN) % (uint64_t)(i + 1));
            int64_t t = perm[i];
            perm[i] = perm[j];
            perm[j] = t;
        }
        for (int64_t i = 0; i < ff; i++) {
            s->prob[l * ff + i] = profile[perm[i]];
            s->gate_z[l * ff + i] = z[perm[i]];
        }
    }
    free(profile);
    free(z);
    free(perm);
    return SI_OK;
}

static int set_metadata(struct si_gguf_writer *w, const struct si_synth_params *p, int64_t chan)
{
    const bool opt = p->arch == SI_SYNTH_OPT;
    const char *arch = opt ? "opt" : p->arch == SI_SYNTH_BAMBOO ? "bamboo" : "llama";
    char key[128], name[128];
    int rc = SI_OK;
#define KEY(suffix) (snprintf(key, sizeof key, "%s.%s", arch, suffix), key)
#define SET(call)                                                                                  \
    do {                                                                                           \
        if ((rc = (call)) != SI_OK)                                                                \
            return rc;                                                                             \
    } while (0)
    snprintf(name, sizeof name, "starinfer synthetic %s d%lld ff%lld L%lld %s",
             si_synth_arch_name(p->arch), (long long)p->n_embd, (long long)p->n_ff,
             (long long)p->n_layer, si_synth_type_name(p));
    SET(si_gguf_writer_set_str(w, "general.architecture", arch));
    SET(si_gguf_writer_set_str(w, "general.name", name));
    SET(si_gguf_writer_set_u32(w, KEY("context_length"),
                               (uint32_t)(p->n_ctx + (p->arch == SI_SYNTH_OPT ? 2 : 0))));
    SET(si_gguf_writer_set_u32(w, KEY("embedding_length"), (uint32_t)p->n_embd));
    SET(si_gguf_writer_set_u32(w, KEY("block_count"), (uint32_t)p->n_layer));
    SET(si_gguf_writer_set_u32(w, KEY("feed_forward_length"), (uint32_t)p->n_ff));
    SET(si_gguf_writer_set_u32(w, KEY("attention.head_count"), (uint32_t)p->n_head));
    if (opt) {
        SET(si_gguf_writer_set_f32(w, KEY("attention.layer_norm_epsilon"), 1e-5f));
    } else {
        SET(si_gguf_writer_set_u32(w, KEY("attention.head_count_kv"), (uint32_t)p->n_head_kv));
        SET(si_gguf_writer_set_f32(w, KEY("attention.layer_norm_rms_epsilon"), 1e-5f));
        SET(si_gguf_writer_set_f32(w, KEY("rope.freq_base"), 10000.0f));
        SET(si_gguf_writer_set_u32(w, KEY("rope.dimension_count"),
                                   (uint32_t)(p->n_embd / p->n_head)));
    }
    SET(si_gguf_writer_set_str(w, "starinfer.ffn_activation",
                               p->arch == SI_SYNTH_LLAMA_SILU ? "silu" : "relu"));
    SET(si_gguf_writer_set_u64(w, "starinfer.synth.seed", p->seed));
    SET(si_gguf_writer_set_f32(w, "starinfer.synth.sparsity", (float)p->sparsity));
    SET(si_gguf_writer_set_f32(w, "starinfer.synth.hot_fraction", (float)p->hot_fraction));
    SET(si_gguf_writer_set_f32(w, "starinfer.synth.hot_share", (float)p->hot_share));
    SET(si_gguf_writer_set_u32(w, "starinfer.synth.bias_channel", (uint32_t)chan));
    if (p->predictor_rank > 0)
        SET(si_gguf_writer_set_f32(w, "powerinfer.sparse_threshold", 0.0f));
#undef KEY
#undef SET
    return set_tokenizer(w, p->n_vocab);
}

int si_synth_write(const struct si_synth_params *p, const char *path, char *err, size_t err_size)
{
    int rc = si_synth_check(p, err, err_size);
    if (rc != SI_OK)
        return rc;
    struct synth s = {.p = p, .chan = channel_width(p), .last_report = si__now()};
    const int64_t max_ne0 = p->n_embd > p->n_ff ? (p->n_embd > p->predictor_rank ? p->n_embd
                                                                                  : p->predictor_rank)
                                                : (p->n_ff > p->predictor_rank ? p->n_ff
                                                                               : p->predictor_rank);
    size_t qmax = 0;
    si_type_row_size(SI_TYPE_F32, max_ne0, &qmax);
    for_each_tensor(p, count_sources, &s.cap_src);
    s.total = si_synth_data_bytes(p);
    s.prob = malloc((size_t)(p->n_layer * p->n_ff) * sizeof *s.prob);
    s.gate_z = malloc((size_t)(p->n_layer * p->n_ff) * sizeof *s.gate_z);
    s.row = malloc((size_t)max_ne0 * sizeof *s.row);
    s.tmp = malloc((size_t)max_ne0 * sizeof *s.tmp);
    s.out = malloc((size_t)max_ne0 * sizeof *s.out);
    s.qrow = malloc(qmax);
    s.src = calloc(s.cap_src, sizeof *s.src);
    struct si_gguf_writer *w = si_gguf_writer_init(p->powerinfer);
    if (s.prob == NULL || s.gate_z == NULL || s.row == NULL || s.tmp == NULL || s.out == NULL ||
        s.qrow == NULL || s.src == NULL || w == NULL) {
        rc = si__errf(err, err_size, SI_E_NOMEM, "out of memory");
        goto done;
    }
    if ((rc = plant(&s, err, err_size)) != SI_OK)
        goto done;
    if ((rc = set_metadata(w, p, s.chan)) != SI_OK ||
        (p->powerinfer &&
         (rc = si_gguf_writer_set_arr(w, SI_SYNTH_PLANTED_KEY, SI_GGUF_FLOAT32, s.prob,
                                      (uint64_t)(p->n_layer * p->n_ff))) != SI_OK)) {
        si__errf(err, err_size, rc, "cannot set the metadata: %s", si_status_str(rc));
        goto done;
    }
    struct add_ctx a = {.s = &s, .w = w};
    if ((rc = for_each_tensor(p, add_tensor, &a)) != SI_OK) {
        si__errf(err, err_size, rc, "cannot describe the tensors: %s", si_status_str(rc));
        goto done;
    }
    rc = si_gguf_writer_write(w, path, err, err_size);
done:
    si_gguf_writer_free(w);
    free(s.prob);
    free(s.gate_z);
    free(s.row);
    free(s.tmp);
    free(s.out);
    free(s.qrow);
    free(s.src);
    return rc;
}

/* ------------------------------------------------------ measuring */

bool si_synth_planted(const struct si_gguf *g, int64_t layer, int64_t n_ff, float *out)
{
    char name[96];
    snprintf(name, sizeof name, "blk.%lld.ffn_planted_prob", (long long)layer);
    const int64_t i = si_gguf_find_tensor(g, name);
    const void *src = NULL;
    if (i >= 0) {
        const struct si_gguf_tensor *t = &g->tensors[i];
        if (t->type == SI_TYPE_F32 && t->ne[0] == n_ff && t->ne[1] == 1)
            src = t->data;
    } else {
        /* (a key's values lie where the strings before them end: copied,
         * never read in place) */
        const int64_t k = si_gguf_find_key(g, SI_SYNTH_PLANTED_KEY);
        const struct si_gguf_kv *kv = k >= 0 ? &g->kv[k] : NULL;
        if (kv != NULL && n_ff > 0 && kv->type == SI_GGUF_ARRAY &&
            kv->arr_type == SI_GGUF_FLOAT32 && kv->arr_n % (uint64_t)n_ff == 0 &&
            (uint64_t)layer < kv->arr_n / (uint64_t)n_ff)
            src = kv->arr_data + (size_t)layer * (size_t)n_ff * sizeof(float);
    }
    if (src != NULL)
        memcpy(out, src, (size_t)n_ff * sizeof(float));
    return src != NULL;
}

static const struct si_gguf_tensor *find(const struct si_gguf *g, const char *fmt, int64_t layer)
{
    char name[96];
    snprintf(name, sizeof name, fmt, (long long)layer);
    int64_t i = si_gguf_find_tensor(g, name);
    return i < 0 ? NULL : &g->tensors[i];
}

/* Row r of a tensor as floats (false when its type cannot be read). */
static bool read_row(const struct si_gguf_tensor *t, int64_t r, float *dst)
{
    size_t row = 0;
    if (!si_type_supported(t->type) || !si_type_row_size(t->type, t->ne[0], &row))
        return false;
    si_dequantize_row(t->type, (const uint8_t *)t->data + (size_t)r * row, dst, t->ne[0]);
    return true;
}

static int cmp_desc(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x < y) - (x > y);
}

int si_synth_measure(const struct si_gguf *g, int64_t layer, int64_t n_samples, uint64_t seed,
                     double hot_fraction, struct si_synth_stats *out, char *err, size_t err_size)
{
    struct si_gguf_str arch;
    if (si_gguf_get_str(g, "general.architecture", &arch) != SI_OK)
        return si__errf(err, err_size, SI_E_FORMAT, "no general.architecture");
    const bool opt = si_gguf_str_eq(arch, "opt"), bamboo = si_gguf_str_eq(arch, "bamboo");
    const struct si_gguf_tensor *emb = find(g, "token_embd.weight", 0);
    const struct si_gguf_tensor *nw = find(g, "blk.%lld.ffn_norm.weight", layer);
    const struct si_gguf_tensor *nb = opt ? find(g, "blk.%lld.ffn_norm.bias", layer) : NULL;
    const struct si_gguf_tensor *gate =
        find(g, opt ? "blk.%lld.ffn_up.weight" : "blk.%lld.ffn_gate.weight", layer);
    const struct si_gguf_tensor *up = bamboo ? find(g, "blk.%lld.ffn_up.weight", layer) : NULL;
    const struct si_gguf_tensor *bias = opt ? find(g, "blk.%lld.ffn_up.bias", layer) : NULL;
    if (emb == NULL || nw == NULL || gate == NULL || (opt && (nb == NULL || bias == NULL)) ||
        (bamboo && up == NULL))
        return si__errf(err, err_size, SI_E_FORMAT, "layer %lld: FFN input tensors missing",
                    (long long)layer);
    const int64_t d = emb->ne[0], n_vocab = emb->ne[1], ff = gate->ne[1];
    if (nw->ne[0] != d || gate->ne[0] != d || (up && (up->ne[0] != d || up->ne[1] != ff)) ||
        (bias && bias->ne[0] != ff) || (nb && nb->ne[0] != d) || n_samples < 1)
        return si__errf(err, err_size, SI_E_FORMAT, "layer %lld: FFN shapes disagree",
                    (long long)layer);
    double eps = 1e-5;
    char key[96];
    struct si_gguf_str a0 = arch;
    snprintf(key, sizeof key, "%.*s.attention.layer_norm%s_epsilon", (int)a0.len, a0.data,
             opt ? "" : "_rms");
    si_gguf_get_f64(g, key, &eps);

    const bool all = n_samples >= n_vocab;
    const int64_t n = all ? n_vocab : n_samples;
    float *x = malloc((size_t)(n * d) * sizeof *x);
    float *w = malloc((size_t)d * sizeof *w);
    float *wb = malloc((size_t)d * sizeof *wb);
    float *wu = malloc((size_t)d * sizeof *wu);
    float *b = malloc((size_t)ff * sizeof *b);
    int64_t *count = calloc((size_t)ff, sizeof *count);
    int rc = SI_OK;
    if (x == NULL || w == NULL || wb == NULL || wu == NULL || b == NULL || count == NULL) {
        rc = si__errf(err, err_size, SI_E_NOMEM, "out of memory");
        goto done;
    }
    if (!read_row(nw, 0, w) || (nb && !read_row(nb, 0, wb)) || (bias && !read_row(bias, 0, b))) {
        rc = si__errf(err, err_size, SI_E_UNSUPPORTED, "unsupported tensor type");
        goto done;
    }
    /* The FFN input of each sample: the norm of a token embedding. */
    for (int64_t k = 0; k < n; k++) {
        int64_t id = all ? k : (int64_t)(mix64(seed + (uint64_t)k * GOLDEN) % (uint64_t)n_vocab);
        float *xk = x + k * d;
        if (!read_row(emb, id, xk)) {
            rc = si__errf(err, err_size, SI_E_UNSUPPORTED, "unsupported embedding type");
            goto done;
        }
        double mean = 0, ss = 0;
        if (opt) {
            for (int64_t j = 0; j < d; j++)
                mean += xk[j];
            mean /= (double)d;
        }
        for (int64_t j = 0; j < d; j++)
            ss += (xk[j] - mean) * (xk[j] - mean);
        double scale = 1.0 / sqrt(ss / (double)d + eps);
        for (int64_t j = 0; j < d; j++)
            xk[j] = (float)((xk[j] - mean) * scale * w[j] + (opt ? wb[j] : 0.0f));
    }
    for (int64_t i = 0; i < ff; i++) {
        if (!read_row(gate, i, wu) || (up && !read_row(up, i, wb))) {
            rc = si__errf(err, err_size, SI_E_UNSUPPORTED, "unsupported weight type");
            goto done;
        }
        for (int64_t k = 0; k < n; k++) {
            const float *xk = x + k * d;
            float s0 = 0, s1 = 0, s2 = 0, s3 = 0;
            int64_t j = 0;
            for (; j + 4 <= d; j += 4) {
                s0 += wu[j] * xk[j];
                s1 += wu[j + 1] * xk[j + 1];
                s2 += wu[j + 2] * xk[j + 2];
                s3 += wu[j + 3] * xk[j + 3];
            }
            for (; j < d; j++)
                s0 += wu[j] * xk[j];
            float pre = s0 + s1 + s2 + s3 + (opt ? b[i] : 0.0f);
            bool fires = pre > 0;
            if (fires && up != NULL) {
                float u = 0;
                for (j = 0; j < d; j++)
                    u += wb[j] * xk[j];
                fires = u > 0;
            }
            count[i] += fires;
        }
    }
    /* Correlation with the planted probabilities, when the file has them. */
    double corr = 0;
    float *pp = malloc((size_t)ff * sizeof *pp);
    if (pp != NULL && si_synth_planted(g, layer, ff, pp)) {
        double mx = 0, my = 0, sxy = 0, sxx = 0, syy = 0;
        for (int64_t i = 0; i < ff; i++) {
            mx += (double)count[i] / (double)n;
            my += pp[i];
        }
        mx /= (double)ff;
        my /= (double)ff;
        for (int64_t i = 0; i < ff; i++) {
            double dx = (double)count[i] / (double)n - mx, dy = pp[i] - my;
            sxy += dx * dy;
            sxx += dx * dx;
            syy += dy * dy;
        }
        corr = sxx > 0 && syy > 0 ? sxy / sqrt(sxx * syy) : 0;
    }
    free(pp);
    int64_t total = 0, top = 0, k_hot = (int64_t)llround(hot_fraction * (double)ff);
    for (int64_t i = 0; i < ff; i++)
        total += count[i];
    qsort(count, (size_t)ff, sizeof *count, cmp_desc);
    for (int64_t i = 0; i < k_hot && i < ff; i++)
        top += count[i];
    out->sparsity = 1.0 - (double)total / ((double)n * (double)ff);
    out->hot_share = total > 0 ? (double)top / (double)total : 0;
    out->corr = corr;
    out->n_samples = n;
done:
    free(x);
    free(w);
    free(wb);
    free(wu);
    free(b);
    free(count);
    return rc;
}
