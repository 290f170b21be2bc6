/*
 * pack8.c - the packed layout of pack8.h: packing, unpacking, and the
 * wrapper that runs the packed dot of the kernel table in use.
 */
#include "model/pack8.h"

#include "model/quants.h"
#include "model/quants_dispatch.h"
#include "model/quants_impl.h"
#include "model/types.h"

#include <assert.h>
#include <string.h>

#define QK 32
#define QK_K 256

/*
 * The K types' packed super-block (pack8.h): runs of units, each run the
 * unit u of rows 0 .. 7 one after the other for u < count, the unit `unit`
 * bytes at `at` + u * unit of the row's super-block.
 */
struct k_run {
    uint8_t at, unit, count;
};
static const struct k_run q4_k_runs[] = {{0, 2, 1}, {2, 2, 1}, {4, 4, 3}, {16, 4, 32}};
static const struct k_run q5_k_runs[] = {{0, 2, 1}, {2, 2, 1}, {4, 4, 3}, {16, 4, 8}, {48, 4, 32}};
static const struct k_run q6_k_runs[] = {{208, 2, 1}, {192, 1, 16}, {0, 4, 32}, {128, 4, 16}};

static const struct k_run *k_runs(uint32_t t, int *n_runs)
{
    *n_runs = t == SI_TYPE_Q5_K ? 5 : 4;
    return t == SI_TYPE_Q4_K ? q4_k_runs : t == SI_TYPE_Q5_K ? q5_k_runs : q6_k_runs;
}

size_t si_pack8_block_bytes(uint32_t t)
{
    switch (t) {
    case SI_TYPE_Q4_0:
        return 8 * 18;
    case SI_TYPE_Q4_1:
        return 8 * 20;
    case SI_TYPE_Q8_0:
        return 8 * 34;
    case SI_TYPE_Q4_K:
        return 8 * 144;
    case SI_TYPE_Q5_K:
        return 8 * 176;
    case SI_TYPE_Q6_K:
        return 8 * 210;
    default:
        return 0;
    }
}

static bool k_type(uint32_t t)
{
    return t == SI_TYPE_Q4_K || t == SI_TYPE_Q5_K || t == SI_TYPE_Q6_K;
}

/* Moves one super-block between row r's layout (blk) and the packed one
 * (g): to the group where `pack`, else back to the row. */
static void k_block(uint32_t t, uint8_t *g, uint8_t *blk, int r, bool pack)
{
    int n_runs;
    const struct k_run *run = k_runs(t, &n_runs);
    for (int i = 0; i < n_runs; i++) {
        for (int u = 0; u < run[i].count; u++) {
            uint8_t *row = blk + run[i].at + u * run[i].unit;
            uint8_t *packed = g + ((size_t)u * 8 + (size_t)r) * run[i].unit;
            uint8_t *to = pack ? packed : row;
            const uint8_t *from = pack ? row : packed;
            switch (run[i].unit) { /* sizes the compiler knows: moves, not calls */
            case 4:
                memcpy(to, from, 4);
                break;
            case 2:
                memcpy(to, from, 2);
                break;
            default:
                *to = *from;
            }
        }
        g += 8 * (size_t)run[i].count * run[i].unit;
    }
}

void si__unpack8_block(uint32_t t, const void *group_block, int r, void *block)
{
    assert(k_type(t) && r >= 0 && r < 8);
    k_block(t, (uint8_t *)group_block, block, r, false);
}

void si__dequantize8_k(uint32_t t, si__dequantize_fn dequantize, const void *group, int64_t n,
                       float *dst)
{
    const size_t bb = si_pack8_block_bytes(t);
    const uint8_t *g = group;
    uint8_t blk[210]; /* the largest K super-block, Q6_K's */
    for (int64_t i = 0; i < n; i += QK_K, g += bb)
        for (int r = 0; r < 8; r++) {
            si__unpack8_block(t, g, r, blk);
            dequantize(blk, dst + r * n + i, QK_K);
        }
}

/* The K types: every super-block's runs. */
static void k_pack(uint32_t t, const uint8_t *src, size_t row_bytes, int64_t n, uint8_t *o)
{
    const size_t bb = si_pack8_block_bytes(t), rb = bb / 8;
    for (int64_t b = 0; b < n / QK_K; b++, o += bb)
        for (int r = 0; r < 8; r++)
            k_block(t, o, (uint8_t *)src + (size_t)r * row_bytes + (size_t)b * rb, r, true);
}

void si_pack8(uint32_t t, const void *rows, size_t row_bytes, int64_t n, void *dst)
{
    const size_t bb = si_pack8_block_bytes(t), rb = bb / 8;
    assert(bb != 0 && n % QK == 0);
    if (k_type(t)) {
        assert(n % QK_K == 0);
        k_pack(t, rows, row_bytes, n, dst);
        return;
    }
    const uint8_t *src = rows;
    uint8_t *o = dst;
    const int hb = t == SI_TYPE_Q4_1 ? 4 : 2; /* the block's scale (and min) bytes */
    for (int64_t b = 0; b < n / QK; b++, o += bb) {
        for (int r = 0; r < 8; r++) {
            const uint8_t *blk = src + (size_t)r * row_bytes + (size_t)b * rb;
            memcpy(o + 2 * r, blk, 2);
            if (hb == 4)
                memcpy(o + 16 + 2 * r, blk + 2, 2);
        }
        uint8_t *qo = o + 8 * hb;
        for (int r = 0; r < 8; r++) {
            const uint8_t *qs = src + (size_t)r * row_bytes + (size_t)b * rb + hb;
            if (t == SI_TYPE_Q8_0) {
                memcpy(qo + 32 * r, qs, 32);
                continue;
            }
            /* the row's 16 quant bytes as 4 units of 4: unit u at run u,
             * bytes 4r .. 4r + 3 */
            for (int u = 0; u < 4; u++)
                memcpy(qo + 32 * u + 4 * r, qs + 4 * u, 4);
        }
    }
}

void si_unpack8_row(uint32_t t, const void *group, int r, int64_t n, void *row)
{
    const size_t bb = si_pack8_block_bytes(t), rb = bb / 8;
    assert(bb != 0 && n % QK == 0 && r >= 0 && r < 8);
    const uint8_t *g = group;
    uint8_t *o = row;
    if (k_type(t)) {
        for (int64_t b = 0; b < n / QK_K; b++, g += bb, o += rb)
            si__unpack8_block(t, g, r, o);
        return;
    }
    const int hb = t == SI_TYPE_Q4_1 ? 4 : 2;
    for (int64_t b = 0; b < n / QK; b++, g += bb, o += rb) {
        memcpy(o, g + 2 * r, 2);
        if (hb == 4)
            memcpy(o + 2, g + 16 + 2 * r, 2);
        const uint8_t *qg = g + 8 * hb;
        if (t == SI_TYPE_Q8_0) {
            memcpy(o + 2, qg + 32 * r, 32);
            continue;
        }
        for (int u = 0; u < 4; u++)
            memcpy(o + hb + 4 * u, qg + 32 * u + 4 * r, 4);
    }
}

void si_dequantize8(uint32_t t, const void *group, int64_t n, float *dst)
{
    const struct si__quants_kernels *k = &si__quants_active()->type[t];
    assert(si_pack8_type(t) && n % QK == 0 && k->dequantize8 != NULL);
    k->dequantize8(group, n, dst);
}

void si_vec_dot_act8(uint32_t t, const void *group, const void *xa, int64_t n, float out[8])
{
    /* Every table has a packed kernel for every packed type (the scalar
     * one in quants_scalar.c; test-quants checks them all). */
    const struct si__quants_kernels *k = &si__quants_active()->type[t];
    assert(si_pack8_type(t) && n % QK == 0 && k->dot_act8 != NULL);
    k->dot_act8(group, xa, n, out);
}

void si_vec_dot_act8_next(uint32_t t, const void *group, const void *xa, int64_t n, float out[8],
                          const void *next)
{
    const struct si__quants_kernels *k = &si__quants_active()->type[t];
    assert(si_pack8_type(t) && n % QK == 0 && k->dot_act8 != NULL);
    if (k->dot_act8_next != NULL)
        k->dot_act8_next(group, xa, n, out, next);
    else
        k->dot_act8(group, xa, n, out);
}

bool si_gemm8_available(uint32_t t)
{
    return si_pack8_type(t) && si__quants_active()->type[t].gemm8 != NULL;
}

const char *si_gemm8_missing(void)
{
    return si__quants_vnni_missing();
}

void si_gemm8(uint32_t t, const void *group, int64_t n, const void *xa, size_t xa_stride,
              const int32_t *asum, int64_t n_tok, float *y, size_t ldy)
{
    const struct si__quants_kernels *k = &si__quants_active()->type[t];
    assert(k->gemm8 != NULL && n % QK == 0);
    k->gemm8(group, n, xa, xa_stride, t == SI_TYPE_Q4_1 ? NULL : asum, n_tok, y, ldy);
}

void si_act_block_sums(uint32_t at, const void *xa, int64_t n, int32_t *sums)
{
    if (at != SI_TYPE_Q8_0)
        return;
    const uint8_t *a = xa;
    for (int64_t b = 0; b < n / QK; b++, a += 34) {
        int32_t s = 0;
        for (int j = 0; j < QK; j++)
            s += (int8_t)a[2 + j];
        sums[b] = s;
    }
}
