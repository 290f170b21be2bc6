/* tiny-model.c - tiny GGUF models of every architecture (see tiny-model.h). */
#include "tiny-model.h"

#include "model/gguf_write.h"
#include "model/types.h"
#include "starinfer.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

void write_model(const char *path, const char *arch, enum fault fault)
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
    if (fault == FAULT_BAD_PREDICTOR_INPUT)
        si_gguf_writer_set_str(w, "starinfer.predictor.input", "attention");
    if (fault == FAULT_PREDICTOR_INPUT_TYPE)
        si_gguf_writer_set_u32(w, "starinfer.predictor.input", 1);
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
    if (rc != SI_OK) { /* a test setup failure, not a finding */
        fprintf(stderr, "write %s: %s\n", path, err);
        abort();
    }
    si_gguf_writer_free(w);
}

