/*
 * ffn_sparse.h - the FFN of one layer slice for a subset of its neurons
 * (PowerInfer's sparse FFN), as pure CPU kernels; no StarPU here.
 *
 * A slice holds n_ff neurons of one layer.  Neuron i owns row i of gate and
 * up (n_embd elements each, row_bytes apart, both of type `type`) and row i
 * of down_t, the transposed down projection (n_embd elements, one row per
 * neuron).  A task computes the neurons listed in idx:
 *
 *   xa = si_quantize_act(si_act_type(type), x)        once per token
 *   h  = si_k_ffn_act_sparse(..., xa, idx)           act(gate . x) * (up . x)
 *   y  = si_k_ffn_down_sparse(..., h, idx)           sum_k h[k] * down_t[idx[k]]
 *
 * and the partial outputs y of the slices are added afterwards.  The gate
 * and up dots are those of the reference forward pass's si_vec_dot_act()
 * calls, both of a neuron from one si_vec_dot_act2() (the same values bit
 * for bit, which also prefetches the next neuron's rows), so h matches the
 * reference bit for bit; the down part adds rows (si_vec_mad) instead of
 * dotting down's rows with quantized h, which changes only the rounding.
 *
 * idx: any order, duplicates allowed (each entry is its own term), every
 * entry in [0, n_ff) of the slice (not checked beyond an assert that it is
 * not negative); n_idx = 0 is allowed.  The dense kernels compute every
 * neuron and serve as the baseline.  All kernels are thread-safe and
 * allocate nothing.
 */
#ifndef SI_CODELETS_FFN_SPARSE_H
#define SI_CODELETS_FFN_SPARSE_H

#include "model/model.h"

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/*
 * For k < n_idx, neuron i = idx[k] of the slice: h[k] = act(g) * u for
 * SI_FFN_GATED, act(g) * relu(u) for SI_FFN_GATED_RELU2 (Bamboo, act = ReLU:
 * relu(g) * relu(u)), act(u) for SI_FFN_PLAIN (gate unused, may be NULL),
 * where g = gate_i . x and u = up_i . x + up_b[i] (up_b may be NULL: no
 * bias; the reference adds it whatever the kind).  Rows are row_bytes
 * apart, type `type`, n_embd elements; xa is x already converted with
 * si_quantize_act(si_act_type(type), x, ...), so the dots are those of
 * si_vec_dot_act() as in the reference (through si_vec_dot_act2() for the
 * gated kinds, equal bit for bit) and h equals its values exactly.
 */
void si_k_ffn_act_sparse(enum si_ffn_kind kind, enum si_act act, uint32_t type, const void *gate,
                         const void *up, const float *up_b, size_t row_bytes, int64_t n_embd,
                         const void *xa, const int32_t *idx, int64_t n_idx, float *h);

/* The same for all n_ff neurons, h[i] for neuron i: equal, bit for bit, to
 * si_k_ffn_act_sparse() with idx = 0, 1, ..., n_ff - 1. */
void si_k_ffn_act_dense(enum si_ffn_kind kind, enum si_act act, uint32_t type, const void *gate,
                        const void *up, const float *up_b, size_t row_bytes, int64_t n_embd,
                        const void *xa, int64_t n_ff, float *h);

/*
 * y[0..n_embd) = sum over k < n_idx of h[k] * down_t row idx[k] (down_t: one
 * row of n_embd elements per neuron, row_bytes apart, type `type`), added in
 * the order of idx with si_vec_mad() (four terms at a time through
 * si_vec_mad4(), the same sums bit for bit).  y is overwritten, not accumulated, so
 * each task writes its own partial output.  Terms with h[k] == 0 (ReLU's
 * zeros) are skipped, which changes nothing unless the row holds an
 * infinity or a NaN.
 */
void si_k_ffn_down_sparse(uint32_t type, const void *down_t, size_t row_bytes, int64_t n_embd,
                          const float *h, const int32_t *idx, int64_t n_idx, float *y);

/* Input sparsity: idx[0..k) and v[0..k) = the positions and values of the
 * non-zero entries of x[0..n), in order; returns k. */
int64_t si_k_nonzero(const float *x, int64_t n, int32_t *idx, float *v);

/*
 * y[0 .. c1 - c0) = columns [c0, c1) of the product of a matrix with a
 * sparse input, from the matrix's transposed copy wt (a row of outputs per
 * input entry, row_bytes apart, type `type`; c0 and c1 on its blocks): the
 * sum over k < n_idx of v[k] times the columns of row idx[k], in order
 * (si_k_nonzero's lists), as si_k_ffn_down_sparse adds them, and the same
 * bits as si_ref_matvec_t.  Only the rows' columns in range are read.
 */
void si_k_matvec_t(uint32_t type, const void *wt, size_t row_bytes, int64_t c0, int64_t c1,
                   const float *v, const int32_t *idx, int64_t n_idx, float *y);

/*
 * The dense down projection, as the reference computes it: down in GGUF
 * layout (n_embd rows of n_ff elements, row_bytes apart, type `type`),
 * h[0..n_ff) converted once into hq (si_type_row_size(si_act_type(type),
 * n_ff) bytes of scratch), then y[r] = si_vec_dot_act(down row r, hq).
 */
void si_k_ffn_down_dense(uint32_t type, const void *down, size_t row_bytes, int64_t n_ff,
                         int64_t n_embd, const float *h, void *hq, float *y);

/*
 * The active neurons of a slice from the pre-activations pre[0..n) of the
 * input that gates them (gate . x for the gated kinds, up . x + b for
 * SI_FFN_PLAIN): writes to idx, in increasing order, every i with
 * |act(pre[i])| > threshold (NaN never passes), and returns their count
 * (idx needs room for n).  With ReLU and threshold 0 this is exactly the
 * neurons whose activation is not zero (pre > 0); for SiLU and GELU a small
 * positive threshold drops the near-zero ones.
 */
int64_t si_k_ffn_mask_from_gate(enum si_act act, const float *pre, int64_t n, float threshold,
                                int32_t *idx);

#ifdef __cplusplus
}
#endif

#endif /* SI_CODELETS_FFN_SPARSE_H */
