/*
 * attn_tiles.c - attention over the fp16 KV cache in tiles of positions
 * (model/kernels.h): llama.cpp's tiled flash-attention arithmetic for many
 * queries at once, the single-query form the reference calls, and
 * decoding's split over chunks of positions with its merge.
 *
 * The portable code here defines the bits; the AVX2 twin
 * (quants_avx2_attn.c, chosen by si__quants_attn_tiled) computes the same
 * operations in the same order per element.
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

void si_k_attn_query_start(const struct si_attn_query *a, int n_heads, int head_dim)
{
    memset(a->acc, 0, (size_t)n_heads * (size_t)head_dim * sizeof *a->acc);
    for (int h = 0; h < n_heads; h++) {
        a->M[h] = -INFINITY;
        a->S[h] = 0.0f;
    }
}

void si_k_attn_query_finish(float *out, const struct si_attn_query *a, int n_heads, int head_dim)
{
    for (int h = 0; h < n_heads; h++) {
        const float inv = a->S[h] == 0.0f ? 0.0f : 1.0f / a->S[h];
        const float *acc = a->acc + (size_t)h * head_dim;
        float *o = out + (size_t)h * head_dim;
        for (int i = 0; i < head_dim; i++)
            o[i] = acc[i] * inv;
    }
}

struct si_kv si_kv_f16(const uint16_t *k, const uint16_t *v, int n_head_kv, int head_dim)
{
    const size_t row = (size_t)n_head_kv * (size_t)head_dim * sizeof(uint16_t);
    return (struct si_kv){k, v, row, row, SI_TYPE_F16, SI_TYPE_F16};
}

size_t si_k_attn_tiles_scratch(int head_dim)
{
    /* the tile's keys transposed and its values as floats, its scores, 8
     * rows of keys as floats (AVX2) */
    return 2 * (size_t)SI_ATTN_TILE * (size_t)head_dim + SI_ATTN_TILE + 8 * (size_t)head_dim;
}

void si_k_attn_tiles(const struct si_attn_query *qs, int n_q, const struct si_kv *kv, int h0,
                     int h1, int group, int head_dim, float scale, int t_begin, int t_end,
                     float *scratch)
{
    assert(group > 0 && 0 <= h0 && h0 <= h1 && t_begin % SI_ATTN_TILE == 0);
    const si__attn_tiled_fn fast = si__quants_attn_tiled();
    if (fast != NULL)
        fast(qs, n_q, kv, h0, h1, group, head_dim, scale, t_begin, t_end, scratch);
    else
        si__k_attn_tiles_portable(qs, n_q, kv, h0, h1, group, head_dim, scale, t_begin, t_end,
                                  scratch);
}

/* Position t's elements of kv head g of a cache (base, row bytes, type) as
 * floats: fp16 converted, quantized blocks through si_dequantize_row. */
static const float *kv_row(const void *base, size_t row, uint32_t type, int t, int g, int hd,
                           float *tmp)
{
    size_t off;
    si_type_row_size(type, (int64_t)g * hd, &off);
    const char *p = (const char *)base + (size_t)t * row + off;
    if (type == SI_TYPE_F16)
        for (int i = 0; i < hd; i++)
            tmp[i] = si_fp16_to_fp32(((const uint16_t *)p)[i]);
    else
        si_dequantize_row(type, p, tmp, hd);
    return tmp;
}

/* One query head's steps over one tile: positions [lo, hi) of the tile at
 * t0, kv head g (sc: SI_ATTN_TILE floats, row: 2 head_dim). */
static void tile_head(const float *qh, float *acc, float *M, float *S, const struct si_kv *kv,
                      int g, int hd, float scale, int t0, int lo, int hi, float *sc, float *row)
{
    enum { T = SI_ATTN_TILE };
    float m = -INFINITY;
    for (int j = 0; j < T; j++) {
        const int t = t0 + j;
        float s = -INFINITY;
        if (t >= lo && t < hi) {
            const float *kt = kv_row(kv->k, kv->k_row, kv->k_type, t, g, hd, row);
            float d = 0.0f;
            for (int i = 0; i < hd; i++)
                d = fmaf(kt[i], qh[i], d);
            s = d * scale;
        }
        sc[j] = s;
        m = m > s ? m : s;
    }
    if (m == -INFINITY)
        return;
    const float Mnew = fmaxf(*M, m);
    if (Mnew > *M) {
        const float ms = expf(*M - Mnew);
        for (int i = 0; i < hd; i++)
            acc[i] *= ms;
        *S *= ms;
    }
    *M = Mnew;
    *S = (float)((double)*S + si_act_exp_sum8(sc, T, Mnew));
    for (int t = lo; t < hi; t++) {
        const float *vt = kv_row(kv->v, kv->v_row, kv->v_type, t, g, hd, row);
        const float pt = sc[t - t0];
        for (int i = 0; i < hd; i++)
            acc[i] = fmaf(vt[i], pt, acc[i]);
    }
}

void si__k_attn_tiles_portable(const struct si_attn_query *qs, int n_q, const struct si_kv *kv,
                               int h0, int h1, int group, int head_dim, float scale, int t_begin,
                               int t_end, float *scratch)
{
    enum { T = SI_ATTN_TILE };
    const int hd = head_dim;
    float *sc = scratch + 2 * (size_t)T * (size_t)hd, *row = scratch;
    for (int t0 = t_begin; t0 < t_end; t0 += T) {
        const int te = t_end < t0 + T ? t_end : t0 + T;
        for (int r = 0; r < n_q; r++) {
            const struct si_attn_query *a = &qs[r];
            const int lo = a->lo > t0 ? a->lo : t0, hi = a->hi < te ? a->hi : te;
            if (lo >= hi)
                continue; /* nothing of this tile is attended */
            for (int h = h0; h < h1; h++) {
                const size_t o = (size_t)(h - h0) * hd;
                tile_head(a->q + o, a->acc + o, &a->M[h - h0], &a->S[h - h0], kv, h / group, hd,
                          scale, t0, lo, hi, sc, row);
            }
        }
    }
}

size_t si_k_attn_tiled_scratch(int head_dim, int n_head)
{
    return si_k_attn_tiles_scratch(head_dim) + 2 * (size_t)n_head;
}

void si_k_attn_tiled(float *out, const float *q, const struct si_kv *kv, int first, int n_kv,
                     int h0, int h1, int n_head, int n_head_kv, int head_dim, float scale,
                     float *scratch)
{
    assert(n_head_kv > 0 && n_head % n_head_kv == 0 && 0 <= h0 && h0 <= h1 && h1 <= n_head);
    const size_t o = (size_t)h0 * (size_t)head_dim;
    float *M = scratch + si_k_attn_tiles_scratch(head_dim), *S = M + n_head;
    const struct si_attn_query a = {q + o, out + o, M, S, first, n_kv};
    si_k_attn_query_start(&a, h1 - h0, head_dim);
    si_k_attn_tiles(&a, 1, kv, h0, h1, n_head / n_head_kv, head_dim, scale, 0, n_kv, scratch);
    si_k_attn_query_finish(out + o, &a, h1 - h0, head_dim);
}

void si_k_attn_f16_tiled(float *out, const float *q, const uint16_t *k, const uint16_t *v,
                         int first, int n_kv, int h0, int h1, int n_head, int n_head_kv,
                         int head_dim, float scale, float *scratch)
{
    const struct si_kv kv = si_kv_f16(k, v, n_head_kv, head_dim);
    si_k_attn_tiled(out, q, &kv, first, n_kv, h0, h1, n_head, n_head_kv, head_dim, scale, scratch);
}

/* ------------------------------------------------------ split over positions */

int si_k_attn_chunks(int first, int n_kv, int *c0)
{
    if (first < 0)
        first = 0;
    *c0 = first / SI_ATTN_CHUNK;
    if (first >= n_kv)
        return 0;
    return (n_kv - 1) / SI_ATTN_CHUNK - *c0 + 1;
}

size_t si_k_attn_part_floats(int n_heads, int head_dim)
{
    return (size_t)n_heads * ((size_t)head_dim + 2);
}

void si_k_attn_chunk(float *part, const float *q, const struct si_kv *kv, int first, int n_kv,
                     int c, int h0, int h1, int group, int head_dim, float scale, float *scratch)
{
    const int nh = h1 - h0, c_lo = c * SI_ATTN_CHUNK, c_hi = c_lo + SI_ATTN_CHUNK;
    const struct si_attn_query a = {
        q,         part + 2 * (size_t)nh,       part,
        part + nh, first > c_lo ? first : c_lo, n_kv < c_hi ? n_kv : c_hi};
    si_k_attn_query_start(&a, nh, head_dim);
    si_k_attn_tiles(&a, 1, kv, h0, h1, group, head_dim, scale, c_lo, a.hi, scratch);
}

void si_k_attn_merge(float *out, const float *const *parts, int n_parts, int n_heads, int head_dim)
{
    const size_t hd = (size_t)head_dim;
    for (int h = 0; h < n_heads; h++) {
        float Mx = -INFINITY, S = 0.0f;
        for (int c = 0; c < n_parts; c++)
            if (parts[c][n_heads + h] != 0.0f)
                Mx = fmaxf(Mx, parts[c][h]);
        float *o = out + (size_t)h * hd;
        memset(o, 0, hd * sizeof *o);
        for (int c = 0; c < n_parts; c++) {
            const float Sc = parts[c][n_heads + h];
            if (Sc == 0.0f)
                continue;
            const float w = expf(parts[c][h] - Mx);
            const float *acc = parts[c] + 2 * (size_t)n_heads + (size_t)h * hd;
            S = S + Sc * w;
            for (size_t i = 0; i < hd; i++)
                o[i] = o[i] + acc[i] * w;
        }
        const float inv = S == 0.0f ? 0.0f : 1.0f / S;
        for (size_t i = 0; i < hd; i++)
            o[i] = o[i] * inv;
    }
}

size_t si_k_attn_split_scratch(int head_dim, int n_head, int n_ctx)
{
    const size_t n_chunks = (size_t)n_ctx / SI_ATTN_CHUNK + 1;
    return si_k_attn_tiles_scratch(head_dim) + n_chunks * si_k_attn_part_floats(n_head, head_dim);
}

void si_k_attn_split(float *out, const float *q, const struct si_kv *kv, int first, int n_kv,
                     int h0, int h1, int n_head, int n_head_kv, int head_dim, float scale,
                     float *scratch)
{
    assert(n_head_kv > 0 && n_head % n_head_kv == 0 && 0 <= h0 && h0 <= h1 && h1 <= n_head);
    enum { MAX_PARTS = SI_ATTN_MAX_CHUNKS };
    const int nh = h1 - h0;
    const size_t o = (size_t)h0 * (size_t)head_dim, pf = si_k_attn_part_floats(nh, head_dim);
    float *parts = scratch + si_k_attn_tiles_scratch(head_dim);
    int c0;
    const int n = si_k_attn_chunks(first, n_kv, &c0);
    const float *p[MAX_PARTS];
    for (int c = 0; c < n; c++) {
        float *part = parts + (size_t)c * pf;
        si_k_attn_chunk(part, q + o, kv, first, n_kv, c0 + c, h0, h1, n_head / n_head_kv, head_dim,
                        scale, scratch);
    }
    assert(n <= MAX_PARTS); /* the contexts si_ref_init accepts */
    for (int c = 0; c < n; c++)
        p[c] = parts + (size_t)c * pf;
    si_k_attn_merge(out + o, p, n, nh, head_dim);
}
