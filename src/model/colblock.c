/* colblock.c - column-block copies and their sparse-input product (colblock.h). */
#include "model/colblock.h"

#include "model/quants.h"
#include "model/quants_dispatch.h"
#include "model/quants_impl.h"
#include "model/types.h"

#include <math.h>
#include <string.h>

bool si_cb_source_ok(uint32_t t, int64_t n_out, int64_t n_in)
{
    return (t == SI_TYPE_Q4_0 || t == SI_TYPE_Q4_1 || t == SI_TYPE_Q4_K) && n_out > 0 &&
           n_out % SI_CB_GROUP == 0 && n_in > 0 && n_in % 32 == 0;
}

bool si_cb_has_min(uint32_t t)
{
    return t != SI_TYPE_Q4_0;
}

static float half(const uint8_t *p)
{
    uint16_t h;
    memcpy(&h, p, 2);
    return si_fp16_to_fp32(h);
}

void si_cb_decode_block(const struct si_tensor *src, int64_t b, uint8_t *q, uint16_t *d,
                        uint16_t *m)
{
    const int64_t n_out = src->ne[1];
    for (int64_t o = 0; o < n_out; o++) {
        const uint8_t *row = (const uint8_t *)src->data + (size_t)o * src->row_bytes;
        const uint8_t *qs;
        if (src->type == SI_TYPE_Q4_K) {
            /* super-block b / 8, sub-block j = b % 8: 32 values of the
             * nibbles of qs[32 (j / 2) ..], low for even j, high for odd */
            const uint8_t *sb = row + (size_t)(b / 8) * 144;
            const int j = (int)(b % 8);
            int sc, mn;
            si__k_scale_min(sb + 4, j, &sc, &mn);
            d[o] = si_fp32_to_fp16(half(sb) * (float)sc);
            m[o] = si_fp32_to_fp16(-(half(sb + 2) * (float)mn));
            qs = sb + 16 + 32 * (j / 2);
            for (int k = 0; k < 32; k++)
                q[(size_t)k * (size_t)n_out + (size_t)o] = j % 2 ? qs[k] >> 4 : qs[k] & 0xf;
            continue;
        }
        /* Q4_0 (d, qs[16]) and Q4_1 (d, m, qs[16]): value k of a block in
         * the low nibble of qs[k] for k < 16, the high one of qs[k - 16] */
        const bool q41 = src->type == SI_TYPE_Q4_1;
        const uint8_t *blk = row + (size_t)b * (q41 ? 20 : 18);
        memcpy(&d[o], blk, 2);
        if (q41)
            memcpy(&m[o], blk + 2, 2);
        qs = blk + (q41 ? 4 : 2);
        for (int k = 0; k < 16; k++) {
            q[(size_t)k * (size_t)n_out + (size_t)o] = qs[k] & 0xf;
            q[(size_t)(k + 16) * (size_t)n_out + (size_t)o] = qs[k] >> 4;
        }
    }
}

void si_cb_pack_row(const uint8_t *q, int64_t n_out, uint8_t *dst)
{
    for (int64_t g = 0; g < n_out; g += SI_CB_GROUP, dst += SI_CB_GROUP / 2)
        for (int k = 0; k < SI_CB_GROUP / 2; k++)
            dst[k] = (uint8_t)(q[g + k] | q[g + SI_CB_GROUP / 2 + k] << 4);
}

/* The portable block kernel (si__cb_block_fn). */
static void cb_block_portable(bool has_min, const uint8_t *const *rows, const int8_t *xq, int na,
                              int32_t sxq, float s, const uint16_t *d, const uint16_t *m, int64_t n,
                              float *y)
{
    const float smin = (float)sxq * s;
    for (int64_t o = 0; o < n; o++) {
        const int64_t at = o / SI_CB_GROUP * (SI_CB_GROUP / 2) + o % (SI_CB_GROUP / 2);
        const int shift = o % SI_CB_GROUP < SI_CB_GROUP / 2 ? 0 : 4;
        int32_t t = 0;
        for (int k = 0; k < na; k++)
            t += (int32_t)((rows[k][at] >> shift) & 0xf) * xq[k];
        if (has_min) {
            y[o] = fmaf(si_fp16_to_fp32(d[o]), (float)t * s, y[o]);
            y[o] = fmaf(si_fp16_to_fp32(m[o]), smin, y[o]);
        } else {
            y[o] = fmaf(si_fp16_to_fp32(d[o]), (float)(t - 8 * sxq) * s, y[o]);
        }
    }
}

#ifndef CB_HEAD
#define CB_HEAD 256
#endif
#ifndef CB_HINT
#define CB_HINT 2
#endif

/* One input block's entries as the kernels take them. */
struct cb_in {
    const uint8_t *rows[32];
    int8_t xq[32];
    int na;
    int32_t sxq;
    float s;
};

/* Input block b of x into in (its rows from column c0 on); false when it
 * has no entry that converts to a non-zero integer. */
static bool cb_gather(const struct si_tensor *wt, int64_t b, int64_t c0, const float *x,
                      struct cb_in *in)
{
    const float *xb = x + b * 32;
    float amax = 0.0f;
    for (int k = 0; k < 32; k++)
        amax = fmaxf(amax, fabsf(xb[k]));
    in->na = 0;
    in->sxq = 0;
    if (amax == 0.0f)
        return false;
    const float id = 127.0f / amax;
    in->s = amax / 127.0f;
    for (int k = 0; k < 32; k++) {
        const int v = (int)lrintf(xb[k] * id);
        if (v == 0)
            continue;
        in->rows[in->na] =
            (const uint8_t *)wt->data + (size_t)(b * 32 + k) * wt->row_bytes + (size_t)(c0 / 2);
        in->xq[in->na++] = (int8_t)v;
        in->sxq += v;
    }
    return in->na > 0;
}

static int64_t cb_matvec(si__cb_block_fn block, const struct si_tensor *wt, int64_t c0, int64_t c1,
                         const float *x, float *y)
{
    const int64_t n_out = wt->ne[0], n_blocks = wt->ne[1] / 32, n = c1 - c0;
    const bool has_min = wt->type != SI_TYPE_Q4_0;
    const size_t srow = (size_t)n_out * (has_min ? 2 : 1); /* fp16 per input block */
    const uint16_t *sc = wt->cb_scale;
    memset(y, 0, (size_t)n * sizeof *y);
    /* Each block's rows are read a range at a time, too short for the
     * hardware to see the streams start: the next block's first lines are
     * asked for while this one is computed. */
    struct cb_in in[2];
    int cur = 0;
    int64_t b = 0, used = 0;
    while (b < n_blocks && !cb_gather(wt, b, c0, x, &in[cur]))
        b++;
    const size_t head = (size_t)(n / 2 < CB_HEAD ? n / 2 : CB_HEAD);
    while (b < n_blocks) {
        int64_t nb = b + 1;
        while (nb < n_blocks && !cb_gather(wt, nb, c0, x, &in[1 - cur]))
            nb++;
        if (nb < n_blocks)
            for (int k = 0; k < in[1 - cur].na; k++)
                for (size_t o = 0; o < head; o += 64)
                    __builtin_prefetch(in[1 - cur].rows[k] + o, 0, CB_HINT);
        const struct cb_in *e = &in[cur];
        const uint16_t *d = sc + (size_t)b * srow + (size_t)c0;
        block(has_min, e->rows, e->xq, e->na, e->sxq, e->s, d, has_min ? d + n_out : NULL, n, y);
        used++;
        b = nb;
        cur = 1 - cur;
    }
    return used;
}

int64_t si_cb_matvec_portable(const struct si_tensor *wt, int64_t c0, int64_t c1, const float *x,
                              float *y)
{
    return cb_matvec(cb_block_portable, wt, c0, c1, x, y);
}

int64_t si_cb_matvec(const struct si_tensor *wt, int64_t c0, int64_t c1, const float *x, float *y)
{
    const si__cb_block_fn k = si__quants_active()->cb_block;
    return cb_matvec(k != NULL ? k : cb_block_portable, wt, c0, c1, x, y);
}
