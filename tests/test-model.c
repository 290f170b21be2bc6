/*
 * test-model.c - loading models: hyperparameters and weights of tiny files
 * written here for each architecture, the reference forward pass on them
 * (finite, deterministic, cache-consistent), and one clear error for each way
 * a model file can be inconsistent.
 */
#include "model/forward.h"
#include "model/gguf_write.h"
#include "model/model.h"
#include "model/types.h"
#include "starinfer.h"
#include "test.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

enum { D = 16, FF = 32, NL = 2, NH = 4, NKV = 2, HD = D / NH, NV = 40, NCTX = 64 };

/* What to break in the tiny model. */
enum fault {
    FAULT_NONE,
    FAULT_NO_BLOCK_COUNT,
    FAULT_HEADS_NOT_DIVIDING,
    FAULT_KV_NOT_DIVIDING,
    FAULT_BAD_ARCH,
    FAULT_SHAPE,
    FAULT_MISSING_TENSOR,
    FAULT_VOCAB_MISMATCH,
    FAULT_BAD_ACTIVATION,
    FAULT_NEGATIVE_FF,
};

static float weights[1 << 16];
static size_t used;

/* Deterministic pseudo-random floats in [-scale, scale]. */
static const float *rnd(size_t n, float scale, unsigned seed)
{
    float *p = weights + used;
    used += n;
    if (used > sizeof weights / sizeof weights[0])
        abort();
    for (size_t i = 0; i < n; i++) {
        seed = seed * 1664525u + 1013904223u;
        p[i] = scale * ((float)(seed >> 8) / 8388608.0f - 1.0f);
    }
    return p;
}

static const float *ones(size_t n)
{
    float *p = weights + used;
    used += n;
    for (size_t i = 0; i < n; i++)
        p[i] = 1.0f;
    return p;
}

static void add(struct si_gguf_writer *w, int64_t ne0, int64_t ne1, const float *data,
                const char *fmt, ...)
{
    char name[64];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(name, sizeof name, fmt, ap);
    va_end(ap);
    int64_t ne[2] = {ne0, ne1};
    int rc = si_gguf_writer_add_tensor(w, name, SI_TYPE_F32, ne1 ? 2 : 1, ne, data);
    if (rc != SI_OK)
        abort();
}

/* Write a tiny model of architecture `arch` to path, with one fault. */
static void write_model(const char *path, const char *arch, enum fault fault)
{
    used = 0;
    struct si_gguf_writer *w = si_gguf_writer_init(false);
    const bool opt = !strcmp(arch, "opt"), gemma = !strcmp(arch, "gemma3"),
               falcon = !strcmp(arch, "falcon"), ln = opt || falcon;
    const char *a = fault == FAULT_BAD_ARCH ? "gpt-17" : arch;
    char key[96];
    si_gguf_writer_set_str(w, "general.architecture", a);
#define KEY(suffix) (snprintf(key, sizeof key, "%s.%s", a, suffix), key)
    si_gguf_writer_set_u32(w, KEY("context_length"), NCTX);
    si_gguf_writer_set_u32(w, KEY("embedding_length"), D);
    if (fault != FAULT_NO_BLOCK_COUNT)
        si_gguf_writer_set_u32(w, KEY("block_count"), NL);
    if (fault == FAULT_NEGATIVE_FF)
        si_gguf_writer_set_i32(w, KEY("feed_forward_length"), -5);
    else
        si_gguf_writer_set_u32(w, KEY("feed_forward_length"), FF);
    si_gguf_writer_set_u32(w, KEY("attention.head_count"), fault == FAULT_HEADS_NOT_DIVIDING ? 3 : NH);
    si_gguf_writer_set_u32(w, KEY("attention.head_count_kv"),
                           fault == FAULT_KV_NOT_DIVIDING ? 3 : (opt ? NH : NKV));
    si_gguf_writer_set_f32(w, ln ? KEY("attention.layer_norm_epsilon")
                                  : KEY("attention.layer_norm_rms_epsilon"),
                           1e-5f);
    if (gemma)
        si_gguf_writer_set_u32(w, KEY("attention.sliding_window"), 4);
    if (fault == FAULT_BAD_ACTIVATION)
        si_gguf_writer_set_str(w, "starinfer.ffn_activation", "swish-9000");
#undef KEY
    const int nv = fault == FAULT_VOCAB_MISMATCH ? NV + 1 : NV;
    const char *toks[NV + 1];
    char buf[NV + 1][8];
    for (int i = 0; i < nv; i++) {
        snprintf(buf[i], sizeof buf[i], "t%d", i);
        toks[i] = buf[i];
    }
    si_gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", toks, (uint64_t)nv);

    const int kvd = (opt ? NH : NKV) * HD;
    add(w, D, NV, rnd((size_t)D * NV, 1.0f, 1), "token_embd.weight");
    if (opt)
        add(w, D, NCTX, rnd((size_t)D * NCTX, 0.1f, 2), "position_embd.weight");
    add(w, D, 0, ones(D), "output_norm.weight");
    if (ln)
        add(w, D, 0, rnd(D, 0.1f, 3), "output_norm.bias");
    add(w, D, NV, rnd((size_t)D * NV, 0.3f, 4), "output.weight");
    for (int l = 0; l < NL; l++) {
        unsigned s = 100u * (unsigned)l;
        add(w, D, 0, ones(D), "blk.%d.attn_norm.weight", l);
        if (falcon) {
            /* Fused projections: rows of Q, then K, then V. */
            add(w, D, D + 2 * kvd, rnd((size_t)D * (D + 2 * kvd), 0.3f, s + 1),
                "blk.%d.attn_qkv.weight", l);
            add(w, D, 0, rnd(D, 0.1f, s + 8), "blk.%d.attn_norm.bias", l);
        } else {
            add(w, D, fault == FAULT_SHAPE && l == 1 ? D + 1 : D,
                rnd((size_t)D * (D + 1), 0.3f, s + 1), "blk.%d.attn_q.weight", l);
            add(w, D, kvd, rnd((size_t)D * kvd, 0.3f, s + 2), "blk.%d.attn_k.weight", l);
            add(w, D, kvd, rnd((size_t)D * kvd, 0.3f, s + 3), "blk.%d.attn_v.weight", l);
        }
        add(w, D, D, rnd((size_t)D * D, 0.3f, s + 4), "blk.%d.attn_output.weight", l);
        if (!falcon)
            add(w, D, 0, ones(D), "blk.%d.ffn_norm.weight", l);
        if (!(fault == FAULT_MISSING_TENSOR && l == 1))
            add(w, D, FF, rnd((size_t)D * FF, 0.3f, s + 5), "blk.%d.ffn_up.weight", l);
        add(w, FF, D, rnd((size_t)D * FF, 0.3f, s + 6), "blk.%d.ffn_down.weight", l);
        if (!ln)
            add(w, D, FF, rnd((size_t)D * FF, 0.3f, s + 7), "blk.%d.ffn_gate.weight", l);
        if (opt) {
            add(w, D, 0, rnd(D, 0.1f, s + 8), "blk.%d.attn_norm.bias", l);
            add(w, D, 0, rnd(D, 0.1f, s + 9), "blk.%d.ffn_norm.bias", l);
            add(w, D, 0, rnd(D, 0.1f, s + 10), "blk.%d.attn_q.bias", l);
            add(w, kvd, 0, rnd(kvd, 0.1f, s + 11), "blk.%d.attn_k.bias", l);
            add(w, kvd, 0, rnd(kvd, 0.1f, s + 12), "blk.%d.attn_v.bias", l);
            add(w, D, 0, rnd(D, 0.1f, s + 13), "blk.%d.attn_output.bias", l);
            add(w, FF, 0, rnd(FF, 0.1f, s + 14), "blk.%d.ffn_up.bias", l);
            add(w, D, 0, rnd(D, 0.1f, s + 15), "blk.%d.ffn_down.bias", l);
        }
        if (gemma) {
            add(w, HD, 0, ones(HD), "blk.%d.attn_q_norm.weight", l);
            add(w, HD, 0, ones(HD), "blk.%d.attn_k_norm.weight", l);
            add(w, D, 0, ones(D), "blk.%d.post_attention_norm.weight", l);
            add(w, D, 0, ones(D), "blk.%d.post_ffw_norm.weight", l);
        }
    }
    char err[256];
    int rc = si_gguf_writer_write(w, path, err, sizeof err);
    CHECK(rc == SI_OK, "write %s: %s", path, err);
    si_gguf_writer_free(w);
}

static void expect_load_error(const char *path, const char *arch, enum fault fault,
                              const char *needle)
{
    write_model(path, arch, fault);
    struct si_model *m = (struct si_model *)1;
    char err[512] = "";
    int rc = si_model_load(&m, path, err, sizeof err);
    CHECK(rc < 0 && m == NULL, "fault %d: loaded anyway", fault);
    CHECK(strstr(err, needle) != NULL, "fault %d: message '%s' lacks '%s'", fault, err, needle);
    CHECK(strncmp(err, path, strlen(path)) == 0, "message names the file: %s", err);
    si_model_free(m == (struct si_model *)1 ? NULL : m);
}

/* Load, run a few tokens twice, check finiteness and repeatability. */
static void check_arch(const char *path, const char *arch)
{
    write_model(path, arch, FAULT_NONE);
    struct si_model *m = NULL;
    char err[512];
    int rc = si_model_load(&m, path, err, sizeof err);
    CHECK(rc == SI_OK, "%s: %s", arch, err);
    if (rc != SI_OK)
        return;
    CHECK(m->hp.n_layer == NL && m->hp.n_embd == D && m->hp.n_ff == FF && m->hp.n_vocab == NV,
          "%s: hyperparameters", arch);
    CHECK(m->hp.head_dim == HD, "%s: head size %d", arch, m->hp.head_dim);
    CHECK(!strcmp(si_arch_name(m->hp.arch), arch), "%s: arch name", arch);

    struct si_ref *r = NULL;
    struct si_ref_params p = si_ref_default_params();
    p.n_ctx = 8;
    CHECK(si_ref_init(&r, m, p, err, sizeof err) == SI_OK, "%s: init %s", arch, err);
    if (r == NULL) {
        si_model_free(m);
        return;
    }
    const int32_t seq[6] = {3, 17, 5, 39, 0, 22};
    float first[6][NV];
    for (int pass = 0; pass < 2; pass++) {
        si_ref_reset(r);
        for (int t = 0; t < 6; t++) {
            CHECK(si_ref_eval(r, seq[t]) == SI_OK, "%s: eval", arch);
            int finite = 1;
            for (int k = 0; k < NV; k++)
                finite &= isfinite(r->logits[k]);
            CHECK(finite, "%s: non-finite logits at %d", arch, t);
            if (pass == 0)
                memcpy(first[t], r->logits, sizeof first[t]);
            else
                CHECK(memcmp(first[t], r->logits, sizeof first[t]) == 0,
                      "%s: position %d differs between runs", arch, t);
        }
    }
    /* Different histories give different logits (attention reads the cache). */
    si_ref_reset(r);
    si_ref_eval(r, 9);
    si_ref_eval(r, seq[1]);
    CHECK(memcmp(first[1], r->logits, sizeof first[1]) != 0, "%s: the cache has no effect", arch);
    CHECK(si_ref_eval(r, NV) == SI_E_INVALID, "%s: token outside the vocabulary", arch);
    CHECK(si_ref_eval(r, -1) == SI_E_INVALID, "%s: negative token", arch);
    for (int t = 2; t < 8; t++)
        si_ref_eval(r, 1);
    CHECK(si_ref_eval(r, 1) == SI_E_BUDGET, "%s: full cache", arch);
    si_ref_free(r);
    si_model_free(m);
}

int main(void)
{
    char path[] = "/tmp/si-test-model-XXXXXX";
    int fd = mkstemp(path);
    CHECK(fd >= 0, "mkstemp");
    close(fd);

    check_arch(path, "llama");
    check_arch(path, "bamboo");
    check_arch(path, "opt");
    check_arch(path, "gemma3");
    check_arch(path, "falcon");

    expect_load_error(path, "llama", FAULT_NO_BLOCK_COUNT, "missing metadata key llama.block_count");
    expect_load_error(path, "llama", FAULT_HEADS_NOT_DIVIDING, "not a multiple of head_count 3");
    expect_load_error(path, "llama", FAULT_KV_NOT_DIVIDING, "not a multiple of head_count_kv 3");
    expect_load_error(path, "llama", FAULT_BAD_ARCH, "architecture 'gpt-17' is not supported");
    expect_load_error(path, "llama", FAULT_SHAPE, "tensor blk.1.attn_q.weight has shape [16, 17");
    expect_load_error(path, "llama", FAULT_MISSING_TENSOR, "missing tensor blk.1.ffn_up.weight");
    expect_load_error(path, "llama", FAULT_VOCAB_MISMATCH, "the vocabulary has 41 tokens");
    expect_load_error(path, "llama", FAULT_BAD_ACTIVATION, "unknown starinfer.ffn_activation");
    expect_load_error(path, "opt", FAULT_NEGATIVE_FF, "opt.feed_forward_length = -5 is out of range");
    unlink(path);
    si_model_free(NULL);
    return test_result();
}
