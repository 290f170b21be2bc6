/*
 * ffn_sparse.c - the sparse (and dense) FFN kernels of ffn_sparse.h.
 *
 * Row offsets are computed in size_t: a slice of 11008 neurons of 8 KiB
 * rows is past 2^26 bytes, and larger layers pass 2^31.
 */
#include "codelets/ffn_sparse.h"

#include "model/act.h"
#include "model/quants.h"
#include "model/types.h"

#include <assert.h>
#include <stdbool.h>
#include <string.h>

/* The row of neuron i in a matrix of rows row_bytes apart. */
static const void *row_at(const void *rows, size_t row_bytes, int64_t i)
{
    return (const char *)rows + (size_t)i * row_bytes;
}

/*
 * Rows of scattered neurons defeat the hardware prefetchers, which follow
 * sequential streams within a 4 KiB page and need a few misses in a page to
 * start one: the sparse kernels prefetch the rows of neurons further on in
 * idx, unless a neuron follows its predecessor in idx (a stream the
 * hardware already fetches; prefetching it too only slows the dense case).
 *
 * The gate and up rows of the next neuron are prefetched by
 * si_vec_dot_act2() itself, a line for each line it reads, so that they
 * arrive while the current neuron is computed: on the 8 KiB rows of F16
 * that halved the time of the gate and up part against prefetching whole
 * rows two neurons ahead, which sends 256 requests at once, more than the
 * core keeps in flight.  The down kernel (and the gate-less kind) prefetch
 * the rows of the neuron PREFETCH_AHEAD entries further in idx: a row of at
 * most a page whole, a longer one by its first PREFETCH_LINES lines in each
 * page, enough for the hardware to fetch the rest of the page.
 */
#define PREFETCH_AHEAD 2
#define PREFETCH_LINES 2
#define PAGE 4096u

/* Whether the rows of idx[k] are worth prefetching (k in range, a jump from idx[k - 1]). */
static bool scattered(const int32_t *idx, int64_t n_idx, int64_t k)
{
    return k < n_idx && idx[k] != idx[k - 1] + 1;
}

/* Prefetches the row at `row` (bytes long) as described above. */
static void prefetch_row(const void *row, size_t bytes)
{
#if defined(__GNUC__)
    const char *p = row, *end = p + bytes;
    if (bytes <= PAGE) {
        for (; p < end; p += 64)
            __builtin_prefetch(p, 0, 3);
        return;
    }
    while (p < end) {
        for (unsigned l = 0; l < PREFETCH_LINES && p + 64 * l < end; l++)
            __builtin_prefetch(p + 64 * l, 0, 3);
        p += PAGE - ((uintptr_t)p & (PAGE - 1)); /* the start of the next page */
    }
#else
    (void)row;
    (void)bytes;
#endif
}

/*
 * One neuron's activation, formed as the reference forward pass forms it;
 * next_up and next_gate (NULL: none) are the rows the caller reads next, to
 * prefetch.  The gated kinds get both dots from one si_vec_dot_act2(), the
 * same values as two si_vec_dot_act() calls.
 */
static float neuron(enum si_ffn_kind kind, enum si_act act, uint32_t type, const void *gate,
                    const void *up, const float *up_b, size_t row_bytes, int64_t n_embd,
                    const void *xa, int64_t i, const void *next_up, const void *next_gate)
{
    if (kind == SI_FFN_PLAIN) {
        float u = si_vec_dot_act(type, row_at(up, row_bytes, i), xa, n_embd);
        if (up_b != NULL)
            u += up_b[i];
        return si_act_apply(act, u);
    }
    const void *rows[2] = {row_at(up, row_bytes, i), row_at(gate, row_bytes, i)};
    const void *ahead[2] = {next_up, next_gate};
    float ug[2];
    si_vec_dot_act2(type, rows, xa, n_embd, ug, ahead);
    float u = ug[0], g = ug[1];
    if (up_b != NULL)
        u += up_b[i];
    return si_act_gated(kind, si_act_apply(act, g), u);
}

void si_k_ffn_act_sparse(enum si_ffn_kind kind, enum si_act act, uint32_t type, const void *gate,
                         const void *up, const float *up_b, size_t row_bytes, int64_t n_embd,
                         const void *xa, const int32_t *idx, int64_t n_idx, float *h)
{
    int64_t k = 0;
    /* Gated kinds: four neurons' up and gate rows, 8 scattered rows, in one
     * si_vec_dot_act8p pass over xa (the same bits as a dot per row), the
     * next four neurons' rows prefetched. */
    for (; kind != SI_FFN_PLAIN && k + 4 <= n_idx; k += 4) {
        const void *rows[8], *ahead[8];
        for (int r = 0; r < 4; r++) {
            assert(idx[k + r] >= 0 && "negative neuron index");
            rows[r] = row_at(up, row_bytes, idx[k + r]);
            rows[4 + r] = row_at(gate, row_bytes, idx[k + r]);
            const bool more = k + 4 + r < n_idx;
            ahead[r] = more ? row_at(up, row_bytes, idx[k + 4 + r]) : NULL;
            ahead[4 + r] = more ? row_at(gate, row_bytes, idx[k + 4 + r]) : NULL;
        }
        float v[8];
        si_vec_dot_act8p(type, rows, xa, n_embd, v, ahead);
        for (int r = 0; r < 4; r++) {
            float u = v[r];
            if (up_b != NULL)
                u += up_b[idx[k + r]];
            h[k + r] = si_act_gated(kind, si_act_apply(act, v[4 + r]), u);
        }
    }
    for (; k < n_idx; k++) {
        assert(idx[k] >= 0 && "negative neuron index");
        const void *next_up = NULL, *next_gate = NULL;
        if (kind == SI_FFN_PLAIN) {
            /* One row per neuron, read by si_vec_dot_act(): started ahead. */
            if (scattered(idx, n_idx, k + PREFETCH_AHEAD))
                prefetch_row(row_at(up, row_bytes, idx[k + PREFETCH_AHEAD]), row_bytes);
        } else if (scattered(idx, n_idx, k + 1)) {
            next_up = row_at(up, row_bytes, idx[k + 1]);
            next_gate = row_at(gate, row_bytes, idx[k + 1]);
        }
        h[k] = neuron(kind, act, type, gate, up, up_b, row_bytes, n_embd, xa, idx[k], next_up,
                      next_gate);
    }
}

void si_k_ffn_act_dense(enum si_ffn_kind kind, enum si_act act, uint32_t type, const void *gate,
                        const void *up, const float *up_b, size_t row_bytes, int64_t n_embd,
                        const void *xa, int64_t n_ff, float *h)
{
    for (int64_t i = 0; i < n_ff; i++)
        h[i] = neuron(kind, act, type, gate, up, up_b, row_bytes, n_embd, xa, i, NULL, NULL);
}

/* si_k_ffn_down_sparse on rows `stride` bytes apart of which the first
 * `span` bytes are read (the whole row, or a range of its columns). */
static void mad_rows(uint32_t type, const void *base, size_t stride, size_t span, int64_t n,
                     const float *h, const int32_t *idx, int64_t n_idx, float *y)
{
    /* The non-zero terms go four at a time through si_vec_mad4(), one pass
     * over y per four rows, in the order of idx (the same sums as one
     * si_vec_mad() per term); the last up to three go one by one. */
    const void *rows[4];
    float a[4];
    int m = 0;
    memset(y, 0, (size_t)n * sizeof *y);
    for (int64_t k = 0; k < n_idx; k++) {
        assert(idx[k] >= 0 && "negative neuron index");
        if (scattered(idx, n_idx, k + PREFETCH_AHEAD))
            prefetch_row(row_at(base, stride, idx[k + PREFETCH_AHEAD]), span);
        if (h[k] != 0.0f) {
            rows[m] = row_at(base, stride, idx[k]);
            a[m] = h[k];
            if (++m == 4) {
                si_vec_mad4(type, rows, a, y, n);
                m = 0;
            }
        }
    }
    for (int r = 0; r < m; r++)
        si_vec_mad(type, rows[r], a[r], y, n);
}

void si_k_ffn_down_sparse(uint32_t type, const void *down_t, size_t row_bytes, int64_t n_embd,
                          const float *h, const int32_t *idx, int64_t n_idx, float *y)
{
    mad_rows(type, down_t, row_bytes, row_bytes, n_embd, h, idx, n_idx, y);
}

int64_t si_k_nonzero(const float *x, int64_t n, int32_t *idx, float *v)
{
    int64_t k = 0;
    for (int64_t i = 0; i < n; i++)
        if (x[i] != 0.0f) {
            idx[k] = (int32_t)i;
            v[k++] = x[i];
        }
    return k;
}

void si_k_matvec_t(uint32_t type, const void *wt, size_t row_bytes, int64_t c0, int64_t c1,
                   const float *v, const int32_t *idx, int64_t n_idx, float *y)
{
    size_t off = 0, span = 0;
    si_type_row_size(type, c0, &off);
    si_type_row_size(type, c1 - c0, &span);
    mad_rows(type, (const char *)wt + off, row_bytes, span, c1 - c0, v, idx, n_idx, y);
}

void si_k_ffn_down_dense(uint32_t type, const void *down, size_t row_bytes, int64_t n_ff,
                         int64_t n_embd, const float *h, void *hq, float *y)
{
    si_quantize_act(si_act_type(type), h, hq, n_ff);
    for (int64_t r = 0; r < n_embd; r++)
        y[r] = si_vec_dot_act(type, row_at(down, row_bytes, r), hq, n_ff);
}

int64_t si_k_ffn_mask_from_gate(enum si_act act, const float *pre, int64_t n, float threshold,
                                int32_t *idx)
{
    int64_t count = 0;
    for (int64_t i = 0; i < n; i++) {
        if (fabsf(si_act_apply(act, pre[i])) > threshold)
            idx[count++] = (int32_t)i;
    }
    return count;
}
