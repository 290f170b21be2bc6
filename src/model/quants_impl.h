/*
 * quants_impl.h - the kernels behind quants.h, one table per implementation.
 *
 * The kernel files define the tables and know nothing of which one runs:
 * quants_scalar.c the scalar table, quants_avx2.c the AVX2+FMA+F16C one and
 * quants_avx2_act.c the VNNI one (with the AVX2 table's quantized-activation
 * and attention kernels).  quants_dispatch.c (quants_dispatch.h) chooses,
 * once, the table that quants.c's public functions and kernels.c's attention
 * use.  Tests call the tables directly to check every implementation on the
 * same machine.
 *
 * Every kernel takes a row of n elements, n a multiple of the type's block
 * size; rows may start at any byte address.
 */
#ifndef SI_MODEL_QUANTS_IMPL_H
#define SI_MODEL_QUANTS_IMPL_H

#include "model/types.h"

#include <stdbool.h>
#include <stdint.h>

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the quantized block layouts assume a little-endian host"
#endif

/* Scale and min of sub-block j of a Q4_K / Q5_K super-block: 6 bits each,
 * packed in the block's 12 scale bytes `sc`. */
static inline void si__k_scale_min(const uint8_t *sc, int j, int *scale, int *min)
{
    if (j < 4) {
        *scale = sc[j] & 63;
        *min = sc[j + 4] & 63;
    } else {
        *scale = (sc[j + 4] & 0xf) | (sc[j - 4] >> 6) << 4;
        *min = (sc[j + 4] >> 4) | (sc[j] >> 6) << 4;
    }
}

/* dst[0..n) = the n values of the row at src. */
typedef void (*si__dequantize_fn)(const void *src, float *dst, int64_t n);

/* Sum over i < n of row[i] * x[i], accumulated in float. */
typedef float (*si__dot_fn)(const void *row, const float *x, int64_t n);

/* Converts n activations x to the table entry's type at dst. */
typedef void (*si__quantize_act_fn)(const float *x, void *dst, int64_t n);

/* Dot of a row with activations converted by the quantize_act of its si_act_type(). */
typedef float (*si__dot_act_fn)(const void *row, const void *xa, int64_t n);

/* y[0..n) += a * row[0..n) (the row's values as dequantize gives them, up to rounding). */
typedef void (*si__mad_fn)(const void *row, float a, float *y, int64_t n);

/* The four mads y += a[r] * rows[r], r = 0..3 in that order, in one pass over y:
 * equal, bit for bit, to the table's mad called four times. */
typedef void (*si__mad4_fn)(const void *const rows[4], const float a[4], float *y, int64_t n);

/*
 * out[r] = the table's dot_act(rows[r], xa, n), bit for bit, r = 0, 1, in
 * one pass that reads xa once for both rows.  Where ahead[r] is not NULL it
 * is a row of the same type and length that the caller reads next: the
 * kernel prefetches it, a cache line for each line of rows[r] it reads.
 */
typedef void (*si__dot_act2_fn)(const void *const rows[2], const void *xa, int64_t n, float out[2],
                                const void *const ahead[2]);

/*
 * out[r] = the table's dot_act(row r, xa, n), bit for bit, r = 0 .. 7, for
 * the 8 rows of a group packed by si_pack8() (model/pack8.h): the 8 rows'
 * scales and quants of a block side by side, read as one stream.
 */
typedef void (*si__dot_act8_fn)(const void *group, const void *xa, int64_t n, float out[8]);
/* The same where the next call's group of rows is not right after this
 * range (a range of columns, si_vec_dot_act8_next): the prefetches run on
 * into next's bytes instead of past the range's end.  The same results. */
typedef void (*si__dot_act8_next_fn)(const void *group, const void *xa, int64_t n, float out[8],
                                     const void *next);

/* The 8 rows of a packed group as floats, row r at dst + r * n: the values
 * of the table's dequantize. */
typedef void (*si__dequantize8_fn)(const void *group, int64_t n, float *dst);

/*
 * A batch's products with a packed group: y[t * ldy + r] = row r . token t
 * for r < 8, t < n_tok, token t's activations at xa + t * xa_stride
 * (converted by quantize_act), asum[t * (n / 32) + b] the integer sum of
 * the quants of its block b (Q8_0 activations; NULL for Q8_1, whose blocks
 * carry their sum).  Sums formed per block, in float per block: the values
 * of dot_act up to the order of the float additions.
 */
typedef void (*si__gemm8_fn)(const void *group, int64_t n, const void *xa, size_t xa_stride,
                             const int32_t *asum, int64_t n_tok, float *y, size_t ldy);

/*
 * out[r] = the table's dot_act(rows[r], xa, n), bit for bit, r = 0 .. 7, for
 * 8 rows anywhere (a sparse FFN's active neurons), the activation block
 * loaded once for the 8; ahead[r] (NULL: none) a row read next, prefetched
 * a line for each line of rows[r] read.
 */
typedef void (*si__dot_act8p_fn)(const void *const rows[8], const void *xa, int64_t n,
                                 float out[8], const void *const ahead[8]);

struct si__quants_kernels {
    si__dequantize_fn dequantize; /* NULL when the type is not supported */
    si__dot_fn dot;               /* NULL when the type is not supported */
    /* Writes activations of this type (Q8_0, Q8_1, Q8_K, F16, BF16, F32); NULL for others. */
    si__quantize_act_fn quantize_act;
    si__dot_act_fn dot_act; /* NULL when the type is not supported */
    si__mad_fn mad;         /* NULL when the type is not supported */
    si__mad4_fn mad4;       /* NULL: mad four times */
    si__dot_act2_fn dot_act2; /* NULL: dot_act twice */
    si__dot_act8_fn dot_act8; /* packed groups; NULL where si_pack8 does not pack the type */
    si__dequantize8_fn dequantize8; /* likewise */
    si__gemm8_fn gemm8;             /* NULL: no batched kernel (the caller dequantizes) */
    si__dot_act8p_fn dot_act8p;     /* NULL: dot_act row by row */
    si__dot_act8_next_fn dot_act8_next; /* NULL: dot_act8 */
};

/*
 * si_k_attn_f16_heads (model/kernels.h), same arguments, equal to its portable
 * code (si__k_attn_f16_portable) bit for bit when this table's F16 dot_act
 * and quantize_act are the ones in use.
 */
typedef void (*si__attn_f16_fn)(float *out, const float *q, const uint16_t *k, const uint16_t *v,
                                int first, int n_kv, int h0, int h1, int n_head, int n_head_kv,
                                int head_dim, float scale, uint16_t *scratch);

/*
 * si_k_attn_tiles (model/kernels.h), same arguments; its portable code
 * and the AVX2 twin give the same bits (fused multiply-adds and si_act_exp
 * in the same order per element).
 */
struct si_attn_query;
struct si_kv;
typedef void (*si__attn_tiled_fn)(const struct si_attn_query *qs, int n_q, const struct si_kv *kv,
                                  int h0, int h1, int group, int head_dim, float scale, int t_begin,
                                  int t_end, float *scratch);

/*
 * One input block of a column-block product (model/colblock.h) over n
 * outputs (a multiple of SI_CB_GROUP): the na rows of q at rows[k] (at the
 * range's first group) times the 8-bit entries xq[k], summed exactly, then
 * into y[0 .. n) with the block's scales d and, when has_min, mins m (fp16,
 * at the range's first output), s the block's input scale and sxq the sum
 * of xq.  Every implementation gives the portable one's bits.
 */
typedef void (*si__cb_block_fn)(bool has_min, const uint8_t *const *rows, const int8_t *xq, int na,
                                int32_t sxq, float s, const uint16_t *d, const uint16_t *m,
                                int64_t n, float *y);

struct si__quants_table {
    const char *name; /* "scalar", "avx2" or "avx2+vnni" */
    bool compiled;    /* false when the build left this implementation out */
    struct si__quants_kernels type[SI_TYPE_COUNT]; /* indexed by enum si_type */
    si__attn_f16_fn attn_f16; /* NULL: si__k_attn_f16_portable */
    si__attn_tiled_fn attn_tiled; /* NULL: si__k_attn_tiles_portable */
    si__cb_block_fn cb_block;     /* NULL: the portable code of colblock.c */
};

/* The portable implementation: every supported type (quants_scalar.c). */
extern const struct si__quants_table si__quants_scalar;

/* The AVX2+FMA+F16C implementation (quants_avx2.c); all NULL unless
 * compiled with those. */
extern const struct si__quants_table si__quants_avx2;

/* The AVX2 kernels whose integer dot products use AVX-512 VNNI (the same
 * bits, fewer instructions; quants_avx2_act.c): only dot_act and dot_act2 of
 * the 32-element block types; NULL elsewhere. */
extern const struct si__quants_table si__quants_vnni;

/*
 * The two kernels of si_vec_dot_act_batch that no table holds, scalar code
 * (quants_scalar.c) whatever table is in use.  Q4_K dotted with
 * Q8_K activations, its exact integer sums turned into float sums per
 * `group` sub-blocks: 8, the scalar table's dot_act; 2, llama.cpp's AVX2
 * GEMM for a token in a full group of 4.  Q6_K as llama.cpp's tiled GEMM
 * forms it for batches of 8 tokens or more.
 */
float si__dot_act_q4_k_groups(const void *row, const void *xa, int64_t n, int group);
float si__dot_act_q6_k_tiled(const void *row, const void *xa, int64_t n);

/* The scalar steps behind them and the scalar dot_act, for the scalar
 * kernels of packed groups (quants_scalar_pack8.c): one Q4_K super-block's
 * terms added to acc and accm as si__dot_act_q4_k_groups adds them; the
 * term one Q5_K super-block adds to the scalar dot_act's sum; a Q6_K
 * super-block's exact integer sum of scale_j * (q_w . q_a) (q_w - 32: the
 * stored values minus their offset) with the Q8_K super-block at xa. */
void si__q4_k_block(const void *block, const void *xa, int group, float *acc, float *accm);
float si__q5_k_block(const void *block, const void *xa);
int si__q6_k_isum(const void *block, const void *xa);

/* dequantize8 of a K type (model/pack8.h) through a table's dequantize of
 * each row's super-block, copied out of the group (pack8.c): the values
 * that dequantize gives, row r at dst + r * n. */
void si__dequantize8_k(uint32_t t, si__dequantize_fn dequantize, const void *group, int64_t n,
                       float *dst);

/* The scalar table's kernels of packed groups (quants_scalar_pack8.c). */
void si__scalar_dot_act8_q8_0(const void *group, const void *xa, int64_t n, float out[8]);
void si__scalar_dot_act8_q4_0(const void *group, const void *xa, int64_t n, float out[8]);
void si__scalar_dot_act8_q4_1(const void *group, const void *xa, int64_t n, float out[8]);
void si__scalar_dot_act8_q4_k(const void *group, const void *xa, int64_t n, float out[8]);
void si__scalar_dot_act8_q5_k(const void *group, const void *xa, int64_t n, float out[8]);
void si__scalar_dot_act8_q6_k(const void *group, const void *xa, int64_t n, float out[8]);
void si__scalar_dequantize8_q8_0(const void *group, int64_t n, float *dst);
void si__scalar_dequantize8_q4_0(const void *group, int64_t n, float *dst);
void si__scalar_dequantize8_q4_1(const void *group, int64_t n, float *dst);
void si__scalar_dequantize8_q4_k(const void *group, int64_t n, float *dst);
void si__scalar_dequantize8_q5_k(const void *group, int64_t n, float *dst);
void si__scalar_dequantize8_q6_k(const void *group, int64_t n, float *dst);

#endif /* SI_MODEL_QUANTS_IMPL_H */
