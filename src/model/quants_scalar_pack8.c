/*
 * quants_scalar_pack8.c - the scalar table's kernels on groups of 8 rows
 * packed by si_pack8 (model/pack8.h): each row's dot_act and dequantize
 * of quants_scalar.c, bit for bit, read from the packed layout.  They are
 * the oracle of the vector kernels of packed groups (test-quants) and what
 * runs where the CPU has no AVX2.
 */
#include "model/pack8.h"
#include "model/quants.h"
#include "model/quants_impl.h"

#include <math.h>
#include <string.h>

#define QK   32
#define QK_K 256

static float half_at(const uint8_t *p)
{
    uint16_t h;
    memcpy(&h, p, sizeof h);
    return si_fp16_to_fp32(h);
}

/* Value j (0 .. 31) of row r of a packed Q4_0 / Q4_1 block whose quants
 * start at q (pack8.h: the row's byte j % 16 in unit (j % 16) / 4, lane r;
 * values 16 .. 31 in the high nibbles), 0 .. 15. */
static int nibble8(const uint8_t *q, int r, int j)
{
    const int b = j % 16;
    const uint8_t v = q[32 * (b / 4) + 4 * r + b % 4];
    return j < 16 ? v & 0xf : v >> 4;
}

/*
 * dot_act of each row of a group packed by si_pack8 (model/pack8.h): the
 * sums of dot_act_q8_0 and dot_act_q4_0, row by row, from the packed
 * layout (8 scales, then the quants: Q8_0 row after row, Q4_0 in units of
 * 4 bytes a row).
 */
void si__scalar_dot_act8_q8_0(const void *group, const void *xa, int64_t n, float out[8])
{
    const uint8_t *w = group, *a = xa;
    float sum[8] = {0};
    for (int64_t i = 0; i < n; i += QK, w += 8 * 34, a += 34) {
        const int8_t *qa = (const int8_t *)(a + 2);
        for (int r = 0; r < 8; r++) {
            const int8_t *qw = (const int8_t *)(w + 16 + 32 * r);
            int s = 0;
            for (int j = 0; j < QK; j++)
                s += qw[j] * qa[j];
            sum[r] += (float)s * (half_at(w + 2 * r) * half_at(a));
        }
    }
    memcpy(out, sum, sizeof sum);
}

void si__scalar_dot_act8_q4_0(const void *group, const void *xa, int64_t n, float out[8])
{
    const uint8_t *w = group, *a = xa;
    float sum[8] = {0};
    for (int64_t i = 0; i < n; i += QK, w += 8 * 18, a += 34) {
        const int8_t *qa = (const int8_t *)(a + 2);
        for (int r = 0; r < 8; r++) {
            int s = 0;
            for (int j = 0; j < QK; j++)
                s += (nibble8(w + 16, r, j) - 8) * qa[j];
            sum[r] += (float)s * (half_at(w + 2 * r) * half_at(a));
        }
    }
    memcpy(out, sum, sizeof sum);
}

void si__scalar_dot_act8_q4_1(const void *group, const void *xa, int64_t n, float out[8])
{
    const uint8_t *w = group, *a = xa;
    float sum[8] = {0};
    for (int64_t i = 0; i < n; i += QK, w += 8 * 20, a += 36) {
        const int8_t *qa = (const int8_t *)(a + 4);
        for (int r = 0; r < 8; r++) {
            int s = 0;
            for (int j = 0; j < QK; j++)
                s += nibble8(w + 32, r, j) * qa[j];
            sum[r] += (float)s * (half_at(w + 2 * r) * half_at(a)) +
                      half_at(w + 16 + 2 * r) * half_at(a + 2);
        }
    }
    memcpy(out, sum, sizeof sum);
}

/* dequantize of each row of a packed group (model/pack8.h), row r at dst + r * n. */
void si__scalar_dequantize8_q8_0(const void *group, int64_t n, float *dst)
{
    const uint8_t *g = group;
    for (int64_t i = 0; i < n; i += QK, g += 8 * 34)
        for (int r = 0; r < 8; r++) {
            const float d = half_at(g + 2 * r);
            const int8_t *q = (const int8_t *)(g + 16 + 32 * r);
            for (int j = 0; j < QK; j++)
                dst[r * n + i + j] = d * q[j];
        }
}

void si__scalar_dequantize8_q4_0(const void *group, int64_t n, float *dst)
{
    const uint8_t *g = group;
    for (int64_t i = 0; i < n; i += QK, g += 8 * 18)
        for (int r = 0; r < 8; r++) {
            const float d = half_at(g + 2 * r);
            for (int j = 0; j < QK; j++)
                dst[r * n + i + j] = d * (nibble8(g + 16, r, j) - 8);
        }
}

void si__scalar_dequantize8_q4_1(const void *group, int64_t n, float *dst)
{
    const uint8_t *g = group;
    for (int64_t i = 0; i < n; i += QK, g += 8 * 20)
        for (int r = 0; r < 8; r++) {
            const float d = half_at(g + 2 * r), m = half_at(g + 16 + 2 * r);
            for (int j = 0; j < QK; j++)
                dst[r * n + i + j] = d * nibble8(g + 32, r, j) + m;
        }
}

/*
 * The K types: super-block after super-block, row r's block copied out of
 * the packed one (si__unpack8_block) and taken through the scalar dot_act's
 * own step, so each row's float sums are formed exactly as dot_act forms
 * them.
 */
void si__scalar_dot_act8_q4_k(const void *group, const void *xa, int64_t n, float out[8])
{
    const uint8_t *g = group, *a = xa;
    float acc[8] = {0}, accm[8] = {0};
    uint8_t blk[144];
    for (int64_t i = 0; i < n; i += QK_K, g += 8 * 144, a += 292)
        for (int r = 0; r < 8; r++) {
            si__unpack8_block(SI_TYPE_Q4_K, g, r, blk);
            si__q4_k_block(blk, a, 8, &acc[r], &accm[r]);
        }
    for (int r = 0; r < 8; r++)
        out[r] = acc[r] - accm[r];
}

void si__scalar_dot_act8_q5_k(const void *group, const void *xa, int64_t n, float out[8])
{
    const uint8_t *g = group, *a = xa;
    float sum[8] = {0};
    uint8_t blk[176];
    for (int64_t i = 0; i < n; i += QK_K, g += 8 * 176, a += 292)
        for (int r = 0; r < 8; r++) {
            si__unpack8_block(SI_TYPE_Q5_K, g, r, blk);
            sum[r] += si__q5_k_block(blk, a);
        }
    memcpy(out, sum, sizeof sum);
}

void si__scalar_dot_act8_q6_k(const void *group, const void *xa, int64_t n, float out[8])
{
    const uint8_t *g = group, *a = xa;
    float sum[8] = {0};
    uint8_t blk[210];
    for (int64_t i = 0; i < n; i += QK_K, g += 8 * 210, a += 292) {
        float da;
        memcpy(&da, a, sizeof da);
        for (int r = 0; r < 8; r++) {
            si__unpack8_block(SI_TYPE_Q6_K, g, r, blk);
            sum[r] += da * half_at(blk + 208) * (float)si__q6_k_isum(blk, a);
        }
    }
    memcpy(out, sum, sizeof sum);
}

void si__scalar_dequantize8_q4_k(const void *group, int64_t n, float *dst)
{
    si__dequantize8_k(SI_TYPE_Q4_K, si__quants_scalar.type[SI_TYPE_Q4_K].dequantize, group, n, dst);
}

void si__scalar_dequantize8_q5_k(const void *group, int64_t n, float *dst)
{
    si__dequantize8_k(SI_TYPE_Q5_K, si__quants_scalar.type[SI_TYPE_Q5_K].dequantize, group, n, dst);
}

void si__scalar_dequantize8_q6_k(const void *group, int64_t n, float *dst)
{
    si__dequantize8_k(SI_TYPE_Q6_K, si__quants_scalar.type[SI_TYPE_Q6_K].dequantize, group, n, dst);
}
