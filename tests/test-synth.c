/*
 * test-synth.c - synthetic models: tiny models of each architecture and
 * weight type are written, read back and checked for shapes and metadata;
 * their FFN activity, measured here from the file's weights with a plain-C
 * norm + gate (OPT: fc1 + bias) pass over every token embedding, must match
 * the requested sparsity and concentration; the same seed gives the same
 * bytes, another seed other bytes.
 */
#include "model/gguf.h"
#include "model/quants.h"
#include "model/synth.h"
#include "model/types.h"
#include "starinfer.h"
#include "test.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Tolerances of the measured activity against the targets (tiny models:
 * 256 neurons x 300 tokens per layer). */
#define TOL_SPARSITY 0.02
#define TOL_SHARE 0.04
#define MIN_CORR 0.95

static char dir[] = "/tmp/test-synth.XXXXXX";

static const char *path_of(const char *name)
{
    static char p[512];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    return p;
}

static const struct si_gguf_tensor *tensor(const struct si_gguf *g, const char *name)
{
    int64_t i = si_gguf_find_tensor(g, name);
    CHECK(i >= 0, "tensor %s missing", name);
    return i >= 0 ? &g->tensors[i] : NULL;
}

static void check_shape(const struct si_gguf *g, const char *name, uint32_t type, int64_t ne0,
                        int64_t ne1)
{
    const struct si_gguf_tensor *t = tensor(g, name);
    if (t == NULL)
        return;
    CHECK(t->type == type, "%s: type %s, %s expected", name, si_type_name(t->type),
          si_type_name(type));
    CHECK(t->ne[0] == ne0 && t->ne[1] == ne1 && t->ne[2] == 1 && t->ne[3] == 1,
          "%s: shape {%lld, %lld}, {%lld, %lld} expected", name, (long long)t->ne[0],
          (long long)t->ne[1], (long long)ne0, (long long)ne1);
    CHECK(t->n_dims == (ne1 > 1 ? 2u : 1u), "%s: %u dims", name, t->n_dims);
}

static void check_u32(const struct si_gguf *g, const char *key, uint64_t want)
{
    uint64_t v = 0;
    int rc = si_gguf_get_u64(g, key, &v);
    CHECK(rc == SI_OK && v == want, "%s = %llu (rc %d), %llu expected", key,
          (unsigned long long)v, rc, (unsigned long long)want);
}

static void check_str(const struct si_gguf *g, const char *key, const char *want)
{
    struct si_gguf_str s = {0};
    int rc = si_gguf_get_str(g, key, &s);
    CHECK(rc == SI_OK && si_gguf_str_eq(s, want), "%s = '%.*s', '%s' expected", key,
          (int)s.len, s.data ? s.data : "", want);
}

/* Row r of a tensor as floats. */
static void row_of(const struct si_gguf_tensor *t, int64_t r, float *dst)
{
    size_t rs = 0;
    si_type_row_size(t->type, t->ne[0], &rs);
    si_dequantize_row(t->type, (const uint8_t *)t->data + (size_t)r * rs, dst, t->ne[0]);
}

static int cmp_desc(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x < y) - (x > y);
}

/*
 * The layer's FFN activity over all token embeddings: sparsity, share of the
 * top hot_fraction of neurons, and the correlation of each neuron's firing
 * rate with its planted probability.  Accumulated in double.
 */
static void activity(const struct si_gguf *g, enum si_synth_arch arch, int64_t layer,
                     double hot_fraction, double *sparsity, double *share, double *corr)
{
    char name[96];
    const bool opt = arch == SI_SYNTH_OPT;
    const struct si_gguf_tensor *emb = tensor(g, "token_embd.weight");
    snprintf(name, sizeof name, "blk.%lld.ffn_norm.weight", (long long)layer);
    const struct si_gguf_tensor *nw = tensor(g, name);
    snprintf(name, sizeof name, "blk.%lld.%s.weight", (long long)layer,
             opt ? "ffn_up" : "ffn_gate");
    const struct si_gguf_tensor *gate = tensor(g, name);
    snprintf(name, sizeof name, "blk.%lld.ffn_up.weight", (long long)layer);
    const struct si_gguf_tensor *up = arch == SI_SYNTH_BAMBOO ? tensor(g, name) : NULL;
    snprintf(name, sizeof name, "blk.%lld.ffn_up.bias", (long long)layer);
    const struct si_gguf_tensor *bias = opt ? tensor(g, name) : NULL;
    snprintf(name, sizeof name, "blk.%lld.ffn_norm.bias", (long long)layer);
    const struct si_gguf_tensor *nb = opt ? tensor(g, name) : NULL;
    const int64_t ff = gate != NULL ? gate->ne[1] : 0;
    /* the tensor, or PowerInfer's layout's key */
    float *pp = malloc((size_t)(ff > 0 ? ff : 1) * sizeof *pp);
    if (!emb || !nw || !gate || !pp || !si_synth_planted(g, layer, ff, pp) ||
        (opt && (!bias || !nb)) || (arch == SI_SYNTH_BAMBOO && !up)) {
        *sparsity = *share = *corr = -1;
        free(pp);
        return;
    }
    const int64_t d = emb->ne[0], n = emb->ne[1];
    float *x = malloc((size_t)(n * d) * sizeof *x), *w = malloc((size_t)d * sizeof *w);
    float *wb = malloc((size_t)d * sizeof *wb), *gr = malloc((size_t)d * sizeof *gr);
    float *ur = malloc((size_t)d * sizeof *ur), *b = malloc((size_t)ff * sizeof *b);
    double *rate = malloc((size_t)ff * sizeof *rate);
    row_of(nw, 0, w);
    if (opt) {
        row_of(nb, 0, wb);
        row_of(bias, 0, b);
    }
    /* RMSNorm (OPT: LayerNorm) of every embedding row, eps 1e-5. */
    for (int64_t k = 0; k < n; k++) {
        float *xk = x + k * d;
        row_of(emb, k, xk);
        double mean = 0, ss = 0;
        for (int64_t j = 0; opt && j < d; j++)
            mean += xk[j] / (double)d;
        for (int64_t j = 0; j < d; j++)
            ss += (xk[j] - mean) * (xk[j] - mean);
        double inv = 1.0 / sqrt(ss / (double)d + 1e-5);
        for (int64_t j = 0; j < d; j++)
            xk[j] = (float)((xk[j] - mean) * inv * w[j] + (opt ? wb[j] : 0.0));
    }
    double fired = 0;
    for (int64_t i = 0; i < ff; i++) {
        row_of(gate, i, gr);
        if (up != NULL)
            row_of(up, i, ur);
        int64_t c = 0;
        for (int64_t k = 0; k < n; k++) {
            double s = opt ? b[i] : 0.0, su = 0;
            for (int64_t j = 0; j < d; j++)
                s += (double)gr[j] * x[k * d + j];
            for (int64_t j = 0; up != NULL && j < d; j++)
                su += (double)ur[j] * x[k * d + j];
            c += s > 0 && (up == NULL || su > 0);
        }
        rate[i] = (double)c / (double)n;
        fired += (double)c;
    }
    double mx = 0, my = 0, sxy = 0, sxx = 0, syy = 0;
    for (int64_t i = 0; i < ff; i++) {
        mx += rate[i] / (double)ff;
        my += pp[i] / (double)ff;
    }
    for (int64_t i = 0; i < ff; i++) {
        sxy += (rate[i] - mx) * (pp[i] - my);
        sxx += (rate[i] - mx) * (rate[i] - mx);
        syy += (pp[i] - my) * (pp[i] - my);
    }
    *corr = sxy / sqrt(sxx * syy);
    qsort(rate, (size_t)ff, sizeof *rate, cmp_desc);
    double top = 0;
    for (int64_t i = 0; i < (int64_t)llround(hot_fraction * (double)ff); i++)
        top += rate[i] * (double)n;
    *sparsity = 1.0 - fired / ((double)n * (double)ff);
    *share = top / fired;
    free(pp);
    free(x);
    free(w);
    free(wb);
    free(gr);
    free(ur);
    free(b);
    free(rate);
}

/* The file's keys (g, written from p): the architecture's, the
 * activation, the shapes, the norms' epsilon, the rope's. */
static void check_metadata(const struct si_gguf *g, const struct si_synth_params *p,
                           const char *file)
{
    const bool opt = p->arch == SI_SYNTH_OPT;
    const char *arch = opt ? "opt" : p->arch == SI_SYNTH_BAMBOO ? "bamboo" : "llama";
    const int64_t d = p->n_embd, ff = p->n_ff;
    char key[128];

    CHECK(g->powerinfer == p->powerinfer, "%s: magic %s", file, g->magic);
    check_str(g, "general.architecture", arch);
    check_str(g, "starinfer.ffn_activation", p->arch == SI_SYNTH_LLAMA_SILU ? "silu" : "relu");
    snprintf(key, sizeof key, "%s.embedding_length", arch);
    check_u32(g, key, (uint64_t)d);
    snprintf(key, sizeof key, "%s.feed_forward_length", arch);
    check_u32(g, key, (uint64_t)ff);
    snprintf(key, sizeof key, "%s.block_count", arch);
    check_u32(g, key, (uint64_t)p->n_layer);
    snprintf(key, sizeof key, "%s.context_length", arch);
    check_u32(g, key, (uint64_t)p->n_ctx + (opt ? 2 : 0)); /* OPT: positions from row 2 */
    snprintf(key, sizeof key, "%s.attention.head_count", arch);
    check_u32(g, key, (uint64_t)p->n_head);
    double eps = 0;
    snprintf(key, sizeof key, "%s.attention.layer_norm%s_epsilon", arch, opt ? "" : "_rms");
    CHECK(si_gguf_get_f64(g, key, &eps) == SI_OK && fabs(eps - 1e-5) < 1e-9, "%s", key);
    if (!opt) {
        snprintf(key, sizeof key, "%s.attention.head_count_kv", arch);
        check_u32(g, key, (uint64_t)p->n_head_kv);
        snprintf(key, sizeof key, "%s.rope.dimension_count", arch);
        check_u32(g, key, (uint64_t)(d / p->n_head));
        double base = 0;
        snprintf(key, sizeof key, "%s.rope.freq_base", arch);
        CHECK(si_gguf_get_f64(g, key, &base) == SI_OK && base == 10000.0, "%s", key);
    }
}

/* The tokenizer (g, written from p): byte tokens in GPT-2's alphabet,
 * specials, types. */
static void check_tokenizer(const struct si_gguf *g, const struct si_synth_params *p)
{
    /* The tokenizer: byte tokens in GPT-2's alphabet, specials, types. */
    check_str(g, "tokenizer.ggml.model", "gpt2");
    check_str(g, "tokenizer.ggml.pre", "default");
    check_u32(g, "tokenizer.ggml.bos_token_id", 256);
    check_u32(g, "tokenizer.ggml.eos_token_id", 257);
    int64_t it = si_gguf_find_key(g, "tokenizer.ggml.tokens");
    int64_t ity = si_gguf_find_key(g, "tokenizer.ggml.token_type");
    int64_t im = si_gguf_find_key(g, "tokenizer.ggml.merges");
    CHECK(it >= 0 && ity >= 0 && im >= 0, "tokenizer arrays");
    if (it >= 0 && ity >= 0 && im >= 0) {
        const struct si_gguf_kv *tk = &g->kv[it], *ty = &g->kv[ity], *mg = &g->kv[im];
        CHECK(tk->arr_type == SI_GGUF_STRING && tk->arr_n == (uint64_t)p->n_vocab, "tokens");
        CHECK(ty->arr_type == SI_GGUF_INT32 && ty->arr_n == (uint64_t)p->n_vocab, "token types");
        if (tk->arr_n == (uint64_t)p->n_vocab && p->n_vocab >= 300) {
            CHECK(si_gguf_str_eq(tk->strs['A'], "A"), "byte 'A'");
            CHECK(si_gguf_str_eq(tk->strs[' '], "\xc4\xa0"), "byte ' ' is U+0120");
            CHECK(si_gguf_str_eq(tk->strs[0], "\xc4\x80"), "byte 0 is U+0100");
            CHECK(si_gguf_str_eq(tk->strs[173], "\xc5\x83"), "byte 173 is U+0143");
            CHECK(si_gguf_str_eq(tk->strs[256], "<s>") && si_gguf_str_eq(tk->strs[257], "</s>"),
                  "BOS, EOS");
            CHECK(si_gguf_str_eq(tk->strs[258], "\xc4\xa0" "a"), "first merged token");
            CHECK(mg->arr_n == (uint64_t)(p->n_vocab - 258) &&
                      si_gguf_str_eq(mg->strs[0], "\xc4\xa0 a"),
                  "merges");
            int32_t tt[4];
            memcpy(&tt[0], ty->arr_data + 4 * 65, 4);
            memcpy(&tt[1], ty->arr_data + 4 * 256, 4);
            memcpy(&tt[2], ty->arr_data + 4 * 257, 4);
            memcpy(&tt[3], ty->arr_data + 4 * 258, 4);
            CHECK(tt[0] == 1 && tt[1] == 3 && tt[2] == 3 && tt[3] == 1, "token types");
        }
    }
}

/* Layer l's tensors (g, written from p): shapes and types, those of the
 * other architectures or layout absent, the predictor's. */
static void check_layer_shapes(const struct si_gguf *g, const struct si_synth_params *p, int64_t l)
{
    const bool opt = p->arch == SI_SYNTH_OPT;
    const int64_t d = p->n_embd, ff = p->n_ff, kv = opt ? d : d / p->n_head * p->n_head_kv;
    const uint32_t t = p->type, f32 = SI_TYPE_F32;
    char name[128];
    struct {
        const char *suffix;
        uint32_t type;
        int64_t ne0, ne1;
        bool opt_only, llama_only;
    } shapes[] = {
        {"attn_norm.weight", f32, d, 1, false, false},
        {"attn_norm.bias", f32, d, 1, true, false},
        {"attn_q.weight", t, d, d, false, false},
        {"attn_k.weight", t, d, kv, false, false},
        {"attn_v.weight", t, d, kv, false, false},
        {"attn_q.bias", f32, d, 1, true, false},
        {"attn_k.bias", f32, d, 1, true, false},
        {"attn_v.bias", f32, d, 1, true, false},
        {"attn_output.weight", t, d, d, false, false},
        {"attn_output.bias", f32, d, 1, true, false},
        {"ffn_norm.weight", f32, d, 1, false, false},
        {"ffn_norm.bias", f32, d, 1, true, false},
        {"ffn_gate.weight", t, d, ff, false, true},
        {"ffn_up.weight", t, d, ff, false, false},
        {"ffn_up.bias", f32, ff, 1, true, false},
        {"ffn_down.weight", t, ff, d, false, false},
        {"ffn_down.bias", f32, d, 1, true, false},
        {"ffn_planted_prob", f32, ff, 1, false, false},
    };
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
        snprintf(name, sizeof name, "blk.%lld.%s", (long long)l, shapes[i].suffix);
        /* PowerInfer's layout: only the tensors PowerInfer makes */
        const bool starinfer_only = !strcmp(shapes[i].suffix, "ffn_down.weight") ||
                                    !strcmp(shapes[i].suffix, "ffn_down.bias") ||
                                    !strcmp(shapes[i].suffix, "ffn_planted_prob");
        if ((shapes[i].opt_only && !opt) || (shapes[i].llama_only && opt) ||
            (p->powerinfer && starinfer_only))
            CHECK(si_gguf_find_tensor(g, name) < 0, "%s should not exist", name);
        else
            check_shape(g, name, shapes[i].type, shapes[i].ne0, shapes[i].ne1);
    }
    if (p->powerinfer && opt) { /* its down bias, named as PowerInfer names it */
        snprintf(name, sizeof name, "blk.%lld.ffn_down_t.bias", (long long)l);
        check_shape(g, name, f32, d, 1);
    }
    if (p->predictor_rank > 0) {
        uint32_t pt = t == SI_TYPE_F32 ? f32 : SI_TYPE_F16;
        snprintf(name, sizeof name, "blk.%lld.fc1.weight", (long long)l);
        check_shape(g, name, pt, d, p->predictor_rank);
        snprintf(name, sizeof name, "blk.%lld.fc2.weight", (long long)l);
        check_shape(g, name, pt, p->predictor_rank, ff);
        snprintf(name, sizeof name, "blk.%lld.ffn_down_t.weight", (long long)l);
        /* PowerInfer's sparse kernel reads Q4_0 or F16 (any other as F16) */
        check_shape(g, name, p->powerinfer && t != SI_TYPE_Q4_0 ? SI_TYPE_F16 : t, d, ff);
    }
}

/* Layer l's FFN activity (g, written from p) against p's targets, and the
 * library's own measurement against this one. */
static void check_layer_activity(const struct si_gguf *g, const struct si_synth_params *p,
                                 int64_t l, const char *file)
{
    char err[512] = "";
    double sp, sh, corr;
    activity(g, p->arch, l, p->hot_fraction, &sp, &sh, &corr);
    CHECK(fabs(sp - p->sparsity) < TOL_SPARSITY, "%s layer %lld: sparsity %.3f, %.3f wanted", file,
          (long long)l, sp, p->sparsity);
    CHECK(fabs(sh - p->hot_share) < TOL_SHARE, "%s layer %lld: hot share %.3f, %.3f wanted", file,
          (long long)l, sh, p->hot_share);
    CHECK(corr > MIN_CORR, "%s layer %lld: correlation with planted p %.3f", file, (long long)l,
          corr);
    /* The library's own measurement agrees with this one. */
    struct si_synth_stats st;
    int rc = si_synth_measure(g, l, p->n_vocab, 0, p->hot_fraction, &st, err, sizeof err);
    CHECK(rc == SI_OK && fabs(st.sparsity - sp) < 1e-3 && fabs(st.hot_share - sh) < 2e-3,
          "%s layer %lld: si_synth_measure %.4f %.4f vs %.4f %.4f (%s)", file, (long long)l,
          st.sparsity, st.hot_share, sp, sh, err);
}

/* The bias channel (g, written from p, not OPT): embeddings hold 1 there,
 * no layer writes there. */
static void check_bias_channel(const struct si_gguf *g, const struct si_synth_params *p,
                               const char *file)
{
    const int64_t d = p->n_embd, ff = p->n_ff;
    int64_t chan = si_type_get(p->type)->block;
    float *row = malloc((size_t)(d > ff ? d : ff) * sizeof *row);
    const struct si_gguf_tensor *emb = tensor(g, "token_embd.weight");
    const struct si_gguf_tensor *ao = tensor(g, "blk.0.attn_output.weight");
    /* the down projection: ffn_down's first rows, or (PowerInfer's
     * layout) the first values of every ffn_down_t row */
    const struct si_gguf_tensor *dn =
        tensor(g, p->powerinfer ? "blk.0.ffn_down_t.weight" : "blk.0.ffn_down.weight");
    bool ok = emb && ao && dn;
    for (int64_t r = 0; ok && r < 5; r++) {
        row_of(emb, r, row);
        for (int64_t j = 0; j < chan; j++)
            ok = ok && fabsf(row[j] - 1.0f) < 1e-3f;
    }
    for (int64_t r = 0; ok && r < chan; r++) {
        row_of(ao, r, row);
        for (int64_t j = 0; j < d; j++)
            ok = ok && row[j] == 0.0f;
        if (p->powerinfer)
            continue;
        row_of(dn, r, row);
        for (int64_t j = 0; j < ff; j++)
            ok = ok && row[j] == 0.0f;
    }
    for (int64_t i = 0; ok && p->powerinfer && i < ff; i++) {
        row_of(dn, i, row);
        for (int64_t j = 0; j < chan; j++)
            ok = ok && row[j] == 0.0f;
    }
    CHECK(ok, "%s: bias channel", file);
    free(row);
}

/* PowerInfer's layout (g, written from p): ffn_down_t is the GGUF
 * layout's, in the type PowerInfer reads (Q4_0 the same bytes; F16 the
 * values rounded). */
static void check_pwri_down_t(const struct si_gguf *g, const struct si_synth_params *p,
                              const char *file)
{
    char err[512] = "";
    const int64_t d = p->n_embd, ff = p->n_ff;
    struct si_synth_params q = *p;
    q.powerinfer = false;
    struct si_gguf *h = NULL;
    CHECK(si_synth_write(&q, path_of("pwri-twin.gguf"), err, sizeof err) == SI_OK &&
              si_gguf_open(&h, path_of("pwri-twin.gguf"), err, sizeof err) == SI_OK,
          "%s: the GGUF layout's twin: %s", file, err);
    const struct si_gguf_tensor *a = h != NULL ? tensor(h, "blk.1.ffn_down_t.weight") : NULL,
                                *b = tensor(g, "blk.1.ffn_down_t.weight");
    bool same = a != NULL && b != NULL;
    float *ra = malloc((size_t)d * sizeof *ra), *rb = malloc((size_t)d * sizeof *rb);
    for (int64_t i = 0; same && ra && rb && i < ff; i++) {
        row_of(a, i, ra);
        row_of(b, i, rb);
        for (int64_t j = 0; j < d; j++)
            same = same &&
                   rb[j] == (b->type == a->type ? ra[j] : si_fp16_to_fp32(si_fp32_to_fp16(ra[j])));
    }
    CHECK(same, "%s: ffn_down_t is not the GGUF layout's in %s", file,
          b != NULL ? si_type_name(b->type) : "?");
    free(ra);
    free(rb);
    si_gguf_free(h);
    unlink(path_of("pwri-twin.gguf"));
}

/* Write, read back, check shapes, metadata and activity. */
static void check_model(struct si_synth_params p, const char *file)
{
    char err[512] = "";
    int rc = si_synth_write(&p, path_of(file), err, sizeof err);
    CHECK(rc == SI_OK, "%s: %s", file, err);
    struct si_gguf *g = NULL;
    if (rc != SI_OK || si_gguf_open(&g, path_of(file), err, sizeof err) != SI_OK) {
        CHECK(false, "%s: cannot open: %s", file, err);
        return;
    }
    const bool opt = p.arch == SI_SYNTH_OPT;
    const int64_t d = p.n_embd, ff = p.n_ff;
    const uint32_t t = p.type, f32 = SI_TYPE_F32;

    check_metadata(g, &p, file);
    check_tokenizer(g, &p);

    /* Shapes and types. */
    check_shape(g, "token_embd.weight", t, d, p.n_vocab);
    check_shape(g, "output_norm.weight", f32, d, 1);
    check_shape(g, "output.weight", t, d, p.n_vocab);
    if (opt) {
        check_shape(g, "position_embd.weight", f32, d, p.n_ctx + 2);
        check_shape(g, "output_norm.bias", f32, d, 1);
    }
    for (int64_t l = 0; l < p.n_layer; l++) {
        check_layer_shapes(g, &p, l);
        check_layer_activity(g, &p, l, file);
    }

    /* The bias channel: embeddings hold 1 there, no layer writes there. */
    if (!opt)
        check_bias_channel(g, &p, file);
    /* ffn_down_t is ffn_down transposed (exactly so in F32). */
    if (p.predictor_rank > 0 && t == SI_TYPE_F32 && !p.powerinfer) {
        const struct si_gguf_tensor *dn = tensor(g, "blk.1.ffn_down.weight");
        const struct si_gguf_tensor *dt = tensor(g, "blk.1.ffn_down_t.weight");
        if (dn && dt) {
            const float *a = dn->data, *b = dt->data;
            bool same = true;
            for (int64_t i = 0; i < ff && same; i++)
                for (int64_t j = 0; j < d && same; j++)
                    same = a[j * ff + i] == b[i * d + j];
            CHECK(same, "%s: ffn_down_t is ffn_down transposed", file);
        }
    }
    /* PowerInfer's layout: ffn_down_t is the GGUF layout's, in the type
     * PowerInfer reads (Q4_0 the same bytes; F16 the values rounded). */
    if (p.powerinfer)
        check_pwri_down_t(g, &p, file);
    si_gguf_free(g);
}

static bool same_file(const char *name_a, const char *name_b)
{
    char a[512];
    snprintf(a, sizeof a, "%s", path_of(name_a));
    FILE *fa = fopen(a, "rb"), *fb = fopen(path_of(name_b), "rb");
    bool same = fa && fb;
    while (same) {
        int ca = fgetc(fa), cb = fgetc(fb);
        same = ca == cb;
        if (ca == EOF)
            break;
    }
    if (fa)
        fclose(fa);
    if (fb)
        fclose(fb);
    return same;
}

static void test_profile(void)
{
    float p[1000];
    char err[256] = "";
    CHECK(si_synth_profile(1000, 0.9, 0.2, 0.8, 0.99, p, err, sizeof err) == SI_OK, "%s", err);
    double all = 0, top = 0;
    for (int i = 0; i < 1000; i++) {
        all += p[i];
        top += i < 200 ? p[i] : 0;
        CHECK(p[i] > 0 && p[i] <= 0.99f && (i == 0 || p[i] <= p[i - 1]), "p[%d] = %g", i, p[i]);
    }
    CHECK(fabs(all / 1000 - 0.1) < 1e-4, "mean %g", all / 1000);
    CHECK(fabs(top / all - 0.8) < 1e-3, "share %g", top / all);
    /* Impossible: 50% active on average, the top 20% carrying 90%. */
    CHECK(si_synth_profile(1000, 0.5, 0.2, 0.9, 0.99, p, err, sizeof err) == SI_E_INVALID,
          "infeasible profile");
    CHECK(strstr(err, "reachable") != NULL, "message: %s", err);
}

static void test_bad_params(void)
{
    char err[256];
    struct si_synth_params p = si_synth_default_params();
    CHECK(si_synth_check(&p, err, sizeof err) == SI_OK, "defaults: %s", err);
    struct si_synth_params q = p;
    q.type = SI_TYPE_Q4_0;
    q.n_embd = 80;
    q.n_head = 4;
    CHECK(si_synth_check(&q, err, sizeof err) == SI_E_INVALID && strstr(err, "block"), "%s", err);
    q = p;
    q.type = SI_TYPE_Q4_K;
    CHECK(si_synth_check(&q, err, sizeof err) == SI_E_INVALID, "Q4_K");
    q = p;
    q.n_vocab = 100;
    CHECK(si_synth_check(&q, err, sizeof err) == SI_E_INVALID, "vocab 100");
    q = p;
    q.sparsity = 1.0;
    CHECK(si_synth_check(&q, err, sizeof err) == SI_E_INVALID, "sparsity 1");
    q = p;
    q.hot_share = 0.1;
    CHECK(si_synth_check(&q, err, sizeof err) == SI_E_INVALID, "share below the fraction");
    q = p;
    q.n_head = 5;
    CHECK(si_synth_check(&q, err, sizeof err) == SI_E_INVALID, "64 / 5 heads");
    q = p;
    q.n_head_kv = 3;
    CHECK(si_synth_check(&q, err, sizeof err) == SI_E_INVALID, "4 / 3 kv heads");
    q = p;
    q.arch = SI_SYNTH_OPT;
    CHECK(si_synth_check(&q, err, sizeof err) == SI_E_INVALID, "opt with GQA");
    q = p;
    q.sparsity = 0.5;
    q.hot_share = 0.95;
    CHECK(si_synth_write(&q, path_of("infeasible.gguf"), err, sizeof err) == SI_E_INVALID,
          "infeasible write");
    CHECK(access(path_of("infeasible.gguf"), F_OK) != 0, "no file left");
    CHECK(si_synth_write(&p, "/nonexistent-dir/m.gguf", err, sizeof err) == SI_E_IO, "%s", err);
    enum si_synth_arch a;
    CHECK(si_synth_arch_parse("bamboo", &a) == SI_OK && a == SI_SYNTH_BAMBOO, "parse");
    CHECK(si_synth_arch_parse("gpt", &a) == SI_E_NOT_FOUND, "parse gpt");
    CHECK(si_synth_preset("70b", &q) == SI_E_NOT_FOUND, "preset 70b");
    CHECK(si_synth_preset("7b", &q) == SI_OK && q.n_embd == 4096 && q.n_ff == 11008 &&
              q.n_layer == 32 && q.n_vocab == 32000,
          "preset 7b");
}

int main(void)
{
    if (mkdtemp(dir) == NULL)
        test_skip("cannot make a scratch directory");
    test_profile();
    test_bad_params();

    const uint32_t types[] = {SI_TYPE_F32, SI_TYPE_F16, SI_TYPE_Q8_0, SI_TYPE_Q4_0, SI_TYPE_Q4_1};
    for (int a = 0; a < SI_SYNTH_ARCH_COUNT; a++)
        for (size_t k = 0; k < sizeof types / sizeof types[0]; k++) {
            struct si_synth_params p = si_synth_default_params();
            p.arch = (enum si_synth_arch)a;
            if (p.arch == SI_SYNTH_OPT)
                p.n_head_kv = p.n_head;
            p.type = types[k];
            char file[64];
            snprintf(file, sizeof file, "%s-%s.gguf", si_synth_arch_name(p.arch),
                     si_type_name(p.type));
            check_model(p, file);
            unlink(path_of(file));
        }

    /* Other targets, PowerInfer layout, another shape. */
    struct si_synth_params p = si_synth_default_params();
    p.sparsity = 0.7;
    p.hot_fraction = 0.3;
    p.hot_share = 0.7;
    p.predictor_rank = 16;
    p.powerinfer = true;
    check_model(p, "pwri-f32.gguf");
    p.type = SI_TYPE_Q4_0;
    p.arch = SI_SYNTH_BAMBOO;
    p.n_embd = 128;
    p.n_ff = 320;
    p.n_layer = 3;
    p.n_head = 2;
    p.n_head_kv = 1;
    p.n_vocab = 400;
    check_model(p, "pwri-q4_0.gguf");
    p.arch = SI_SYNTH_OPT;
    p.n_head_kv = p.n_head;
    check_model(p, "pwri-opt.gguf");

    /* Same seed, same bytes; another seed, other bytes. */
    struct si_synth_params r = si_synth_default_params();
    r.type = SI_TYPE_Q4_0;
    char err[256] = "";
    CHECK(si_synth_write(&r, path_of("s1a.gguf"), err, sizeof err) == SI_OK, "%s", err);
    CHECK(si_synth_write(&r, path_of("s1b.gguf"), err, sizeof err) == SI_OK, "%s", err);
    r.seed = 2;
    CHECK(si_synth_write(&r, path_of("s2.gguf"), err, sizeof err) == SI_OK, "%s", err);
    CHECK(same_file("s1a.gguf", "s1b.gguf"), "same seed, same bytes");
    CHECK(!same_file("s1a.gguf", "s2.gguf"), "other seed, other bytes");

    const char *left[] = {"pwri-f32.gguf", "pwri-q4_0.gguf", "pwri-opt.gguf", "s1a.gguf", "s1b.gguf",
                          "s2.gguf"};
    for (size_t i = 0; i < sizeof left / sizeof left[0]; i++)
        unlink(path_of(left[i]));
    CHECK(rmdir(dir) == 0, "scratch directory empty at the end");
    return test_result();
}
