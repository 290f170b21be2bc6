/*
 * kernels.h - the reference forward pass's small kernels (norms, RoPE,
 * attention over the fp16 KV cache) as pure functions.
 *
 * model/forward.c computes with these, so they are the oracle's own
 * arithmetic; the engine's CPU tasks call them to get the same bits, and the
 * CUDA kernels of codelets/codelets_cuda.h are tested against them (their
 * "CPU twins").  They allocate nothing, touch no global state and are
 * thread-safe; every buffer is the caller's.
 */
#ifndef SI_MODEL_KERNELS_H
#define SI_MODEL_KERNELS_H

#include "model/attn_types.h"
#include "model/model.h"

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/*
 * y[i] = x[i] * scale * w[i] for i < n, scale = 1 / sqrt(mean(x^2) + eps),
 * the sum of squares (each square rounded to float) accumulated in double.
 * w NULL: no weight.  y may alias x.
 */
void si_k_rmsnorm(float *y, const float *x, const float *w, int64_t n, float eps);

/*
 * y[i] = (x[i] - mean) * scale * w[i] + b[i], scale = 1 / sqrt(var + eps),
 * mean and variance accumulated in double and rounded to float.  w NULL: no
 * weight; b NULL: no bias.  y may alias x.
 */
void si_k_layernorm(float *y, const float *x, const float *w, const float *b, int64_t n,
                    float eps);

/*
 * Rotate, in place, the first n_rot dimensions of each of the n_heads heads
 * of x (heads of head_dim floats, one after the other) to position pos:
 * the pairs (2i, 2i+1) for SI_ROPE_NORM, (i, i + n_rot/2) for SI_ROPE_NEOX,
 * i < n_rot/2, by the angle theta_i = scale * pos * base^(-2i/n_rot), as
 * llama.cpp's CPU backend rounds it: pos * base^(-2i/n_rot) is formed by
 * repeated multiplication in float, t_0 = (float)pos and t_{i+1} = t_i *
 * powf(base, -2.0f / n_rot), then theta_i = scale * t_i; the pair (x0, x1)
 * becomes (fmaf(x0, c, -(x1 s)), fmaf(x0, s, x1 c)) with c = cosf(theta_i),
 * s = sinf(theta_i) (the multiply-adds its compiler fuses).  A twin that
 * forms the angles the same way gets the same angles.  SI_ROPE_NONE changes
 * nothing.
 */
void si_k_rope(float *x, int n_heads, int head_dim, int n_rot, enum si_rope_kind kind, int pos,
               float base, float scale);

/*
 * Attention of one query over a layer's fp16 KV cache, in llama.cpp's
 * flash-attention arithmetic for a single query:
 *
 *   q        n_head * head_dim floats (head h at q + h * head_dim)
 *   k, v     the layer's caches, as model/forward.c stores them: position t
 *            at k + t * n_head_kv * head_dim, kv head j at + j * head_dim,
 *            fp16 bits
 *   first, n_kv  the positions attended: first <= t < n_kv (first > 0 for a
 *            sliding window); none when first >= n_kv (out is then zero)
 *   scale    multiplies each q . k
 *   out      n_head * head_dim floats
 *   scratch  2 * head_dim uint16_t
 *
 * Query head h reads kv head h / (n_head / n_head_kv) (GQA; n_head must be
 * a multiple of n_head_kv).  Per head the query is rounded to fp16; each
 * score s_t = si_vec_dot_act(F16, k_t, q16) * scale; an online softmax keeps
 * the running maximum M and sum S, and the value accumulator is an fp16
 * vector: when s_t > M it is first scaled by ms = exp(M_old - s_t) and
 * rounded, then acc = fp16(fmaf(v_t, vs, acc)) with vs = exp(s_t - M) (1 when
 * s_t set the maximum), S = S * ms + vs.  out = acc / S.
 */
void si_k_attn_f16(float *out, const float *q, const uint16_t *k, const uint16_t *v, int first,
                   int n_kv, int n_head, int n_head_kv, int head_dim, float scale,
                   uint16_t *scratch);

/* The same for query heads [h0, h1) only (q, k, v, out laid out as above,
 * whole): out of the other heads is left alone.  Each head's result is the
 * bits si_k_attn_f16 gives it. */
void si_k_attn_f16_heads(float *out, const float *q, const uint16_t *k, const uint16_t *v,
                         int first, int n_kv, int h0, int h1, int n_head, int n_head_kv,
                         int head_dim, float scale, uint16_t *scratch);

/*
 * The same attention as llama.cpp's tiled flash attention computes it (its
 * path for batches of 64 queries or more: prompts, perplexity chunks), query
 * heads [h0, h1) only (out's other heads untouched), the other arguments as
 * si_k_attn_f16's but for scratch, si_k_attn_tiled_scratch() floats.
 * Positions go in tiles of 64 from position 0; per head, for each tile
 * holding a position of [first, n_kv):
 *
 *   s_t = (q . k_t) * scale, the dot a chain of fmaf over the head's
 *         elements in order from 0, q in float, k_t converted from fp16
 *         (-inf for the tile's other positions);
 *   m = the tile's largest s_t; when it raises the running maximum M, the
 *         accumulator and the sum S are first multiplied by expf(M_old - M);
 *   p_t = e^(s_t - M) by si_act_exp (model/act.h); S = (float)((double)S +
 *         the tile's sum), the sum in double over groups of 8 positions, each
 *         group in float as ((p0 + p4) + (p2 + p6)) + ((p1 + p5) + (p3 + p7));
 *   acc_i = fmaf(v_t,i, p_t, acc_i) over the tile's positions in order;
 *
 * out = acc * (1 / S) (0 when S is 0).  Positions outside [first, n_kv) are
 * never read.  It runs si_k_attn_tiles on one query.
 */
void si_k_attn_f16_tiled(float *out, const float *q, const uint16_t *k, const uint16_t *v,
                         int first, int n_kv, int h0, int h1, int n_head, int n_head_kv,
                         int head_dim, float scale, float *scratch);

/* The same over a cache of any type (struct si_kv, model/attn_types.h). */
void si_k_attn_tiled(float *out, const float *q, const struct si_kv *kv, int first, int n_kv,
                     int h0, int h1, int n_head, int n_head_kv, int head_dim, float scale,
                     float *scratch);

/* Floats of scratch si_k_attn_f16_tiled and si_k_attn_tiled need. */
size_t si_k_attn_tiled_scratch(int head_dim, int n_head);

/* The tiled kernels' data, struct si_kv (a layer's caches) and struct
 * si_attn_query (one query's state), and SI_ATTN_TILE: model/attn_types.h.
 * An fp16 cache of n_head_kv kv heads (si_k_attn_f16's layout): */
struct si_kv si_kv_f16(const uint16_t *k, const uint16_t *v, int n_head_kv, int head_dim);

void si_k_attn_query_start(const struct si_attn_query *a, int n_heads, int head_dim);
void si_k_attn_query_finish(float *out, const struct si_attn_query *a, int n_heads, int head_dim);

/*
 * The tiles of positions [t_begin, t_end) (t_begin a multiple of 64) of
 * si_k_attn_f16_tiled's arithmetic, for n_q queries at once: each query's
 * heads [h0, h1) take each tile holding a position of its [lo, hi) (and of
 * [t_begin, t_end)) in order, exactly as si_k_attn_f16_tiled's steps, so a
 * query's bits do not depend on the others.  The keys and values are read
 * once per tile for all the queries (kv: struct si_kv); query head h
 * reads kv head h / group.  scratch: si_k_attn_tiles_scratch(head_dim)
 * floats.
 */
void si_k_attn_tiles(const struct si_attn_query *qs, int n_q, const struct si_kv *kv, int h0,
                     int h1, int group, int head_dim, float scale, int t_begin, int t_end,
                     float *scratch);
size_t si_k_attn_tiles_scratch(int head_dim);

/* si_k_attn_tiles's portable code; its AVX2 twin gives the same bits. */
void si__k_attn_tiles_portable(const struct si_attn_query *qs, int n_q, const struct si_kv *kv,
                               int h0, int h1, int group, int head_dim, float scale, int t_begin,
                               int t_end, float *scratch);

/*
 * Decoding's attention over a long context, split over positions
 * (flash-decoding): used for one query over n attended positions when
 * n >= SI_ATTN_SPLIT_MIN.  The positions go in chunks of SI_ATTN_CHUNK from
 * position 0 (chunk c: [c * SI_ATTN_CHUNK, (c + 1) * SI_ATTN_CHUNK) within
 * [first, n_kv)), whatever the number of workers, so the bits depend on
 * the positions alone.  Each chunk is si_k_attn_tiles's arithmetic from a
 * fresh start, its partial result for heads [h0, h1) (nh of them) being
 * their maxima M[nh], sums S[nh] and accumulators acc[nh * head_dim] (not
 * divided), in that order.
 * The merge takes the chunks in order: M* = the largest M (chunks with
 * S = 0 skipped), w_c = expf(M_c - M*), S* = S* + S_c * w_c and acc*_i =
 * acc*_i + acc_c,i * w_c from 0 (each product and sum rounded: the build
 * contracts nothing under -std=c11), then out = acc* * (1 / S*) (0 when S*
 * is 0).
 */
#define SI_ATTN_CHUNK     256
#define SI_ATTN_SPLIT_MIN 512
/* The most chunks a context may have (si_ref_init refuses longer ones). */
#define SI_ATTN_MAX_CHUNKS 1024

/* The chunks of [first, n_kv): the first one's index in *c0, their count
 * returned (0 when first >= n_kv). */
int si_k_attn_chunks(int first, int n_kv, int *c0);
/* Floats of one chunk's partial result for n_heads heads. */
size_t si_k_attn_part_floats(int n_heads, int head_dim);
/* Chunk c's partial result into part, q holding heads [h0, h1) (scratch:
 * si_k_attn_tiles_scratch). */
void si_k_attn_chunk(float *part, const float *q, const struct si_kv *kv, int first, int n_kv,
                     int c, int h0, int h1, int group, int head_dim, float scale, float *scratch);
/* The chunks' partial results (of n_heads heads each, in chunk order)
 * merged into out, n_heads * head_dim floats. */
void si_k_attn_merge(float *out, const float *const *parts, int n_parts, int n_heads, int head_dim);
/* The whole: every chunk (scratch: si_k_attn_split_scratch floats for
 * n_kv positions at most), then the merge; q and out as
 * si_k_attn_f16_heads's. */
void si_k_attn_split(float *out, const float *q, const struct si_kv *kv, int first, int n_kv,
                     int h0, int h1, int n_head, int n_head_kv, int head_dim, float scale,
                     float *scratch);
size_t si_k_attn_split_scratch(int head_dim, int n_head, int n_ctx);

/*
 * si_k_attn_f16's portable code, which it runs with the scalar kernels
 * (SI_NO_SIMD=1, or no AVX2); with the AVX2 ones it runs their twin instead,
 * equal bit for bit (tests/test-kernels.c checks that the two agree).
 */
void si__k_attn_f16_portable(float *out, const float *q, const uint16_t *k, const uint16_t *v,
                             int first, int n_kv, int h0, int h1, int n_head, int n_head_kv,
                             int head_dim, float scale, uint16_t *scratch);

#ifdef __cplusplus
}
#endif

#endif /* SI_MODEL_KERNELS_H */
