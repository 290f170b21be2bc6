/*
 * kernels.c - the reference forward pass's small kernels (kernels.h).
 *
 * The order of every floating-point operation here is part of the contract:
 * the reference's outputs are compared bit for bit with the engine's and
 * token for token with llama.cpp's, so a change of order is a change of
 * results.
 */
#include "model/kernels.h"

#include "model/act.h"
#include "model/quants.h"
#include "model/quants_dispatch.h"
#include "model/quants_impl.h"
#include "model/types.h"

#include <assert.h>
#include <math.h>
#include <string.h>

void si_k_rmsnorm(float *y, const float *x, const float *w, int64_t n, float eps)
{
    double ss = 0.0;
    for (int64_t i = 0; i < n; i++)
        ss += (double)(x[i] * x[i]);
    const float scale = 1.0f / sqrtf((float)(ss / (double)n) + eps);
    for (int64_t i = 0; i < n; i++)
        y[i] = w != NULL ? x[i] * scale * w[i] : x[i] * scale;
}

void si_k_layernorm(float *y, const float *x, const float *w, const float *b, int64_t n,
                    float eps)
{
    double sum = 0.0;
    for (int64_t i = 0; i < n; i++)
        sum += x[i];
    const float mean = (float)(sum / (double)n);
    double var = 0.0;
    for (int64_t i = 0; i < n; i++)
        var += (double)((x[i] - mean) * (x[i] - mean));
    const float scale = 1.0f / sqrtf((float)(var / (double)n) + eps);
    for (int64_t i = 0; i < n; i++) {
        const float t = w != NULL ? (x[i] - mean) * scale * w[i] : (x[i] - mean) * scale;
        y[i] = t + (b != NULL ? b[i] : 0.0f);
    }
}

void si_k_rope(float *x, int n_heads, int head_dim, int n_rot, enum si_rope_kind kind, int pos,
               float base, float scale)
{
    if (kind == SI_ROPE_NONE)
        return;
    const float theta_scale = powf(base, -2.0f / (float)n_rot);
    for (int h = 0; h < n_heads; h++) {
        float *v = x + (size_t)h * head_dim;
        float theta = (float)pos;
        for (int i = 0; i < n_rot / 2; i++) {
            const float angle = scale * theta;
            const float c = cosf(angle), s = sinf(angle);
            const int a = kind == SI_ROPE_NEOX ? i : 2 * i;
            const int b = kind == SI_ROPE_NEOX ? i + n_rot / 2 : 2 * i + 1;
            const float x0 = v[a], x1 = v[b];
            v[a] = fmaf(x0, c, -(x1 * s));
            v[b] = fmaf(x0, s, x1 * c);
            theta *= theta_scale;
        }
    }
}

/*
 * The AVX2 twin (quants_avx2_act.c) computes the same operations in the
 * same order per element, with F16C conversions; it is used exactly when
 * the AVX2 F16 dot is, since it inlines that dot.  It comes from the table
 * in use (si__quants_active, quants_dispatch.h), the tiled attention's twin
 * from si__quants_attn_tiled; neither calls back into this file.
 */
void si_k_attn_f16(float *out, const float *q, const uint16_t *k, const uint16_t *v, int first,
                   int n_kv, int n_head, int n_head_kv, int head_dim, float scale,
                   uint16_t *scratch)
{
    si_k_attn_f16_heads(out, q, k, v, first, n_kv, 0, n_head, n_head, n_head_kv, head_dim, scale,
                        scratch);
}

void si_k_attn_f16_heads(float *out, const float *q, const uint16_t *k, const uint16_t *v,
                         int first, int n_kv, int h0, int h1, int n_head, int n_head_kv,
                         int head_dim, float scale, uint16_t *scratch)
{
    assert(n_head_kv > 0 && n_head % n_head_kv == 0);
    assert(0 <= h0 && h0 <= h1 && h1 <= n_head);
    const si__attn_f16_fn fast = si__quants_active()->attn_f16;
    if (fast != NULL)
        fast(out, q, k, v, first, n_kv, h0, h1, n_head, n_head_kv, head_dim, scale, scratch);
    else
        si__k_attn_f16_portable(out, q, k, v, first, n_kv, h0, h1, n_head, n_head_kv, head_dim,
                                scale, scratch);
}

void si__k_attn_f16_portable(float *out, const float *q, const uint16_t *k, const uint16_t *v,
                             int first, int n_kv, int h0, int h1, int n_head, int n_head_kv,
                             int head_dim, float scale, uint16_t *scratch)
{
    assert(n_head_kv > 0 && n_head % n_head_kv == 0);
    const int hd = head_dim, group = n_head / n_head_kv;
    const size_t kvd = (size_t)n_head_kv * hd;
    uint16_t *q16 = scratch, *acc = scratch + hd;
    for (int h = h0; h < h1; h++) {
        const size_t koff = (size_t)(h / group) * hd;
        si_quantize_act(SI_TYPE_F16, q + (size_t)h * hd, q16, hd);
        memset(acc, 0, (size_t)hd * sizeof *acc);
        float M = -INFINITY, S = 0.0f;
        for (int t = first; t < n_kv; t++) {
            const float sc = si_vec_dot_act(SI_TYPE_F16, k + (size_t)t * kvd + koff, q16, hd) * scale;
            const uint16_t *vt = v + (size_t)t * kvd + koff;
            float ms = 1.0f, vs = 1.0f;
            if (sc > M) {
                const float Mold = M;
                M = sc;
                ms = expf(Mold - M);
                for (int i = 0; i < hd; i++)
                    acc[i] = si_fp32_to_fp16(si_fp16_to_fp32(acc[i]) * ms);
            } else {
                vs = expf(sc - M);
            }
            for (int i = 0; i < hd; i++)
                acc[i] = si_fp32_to_fp16(fmaf(si_fp16_to_fp32(vt[i]), vs, si_fp16_to_fp32(acc[i])));
            S = fmaf(S, ms, vs);
        }
        float *o = out + (size_t)h * hd;
        const float inv = S == 0.0f ? 0.0f : 1.0f / S;
        for (int i = 0; i < hd; i++)
            o[i] = si_fp16_to_fp32(acc[i]) * inv;
    }
}
