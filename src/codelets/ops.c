/*
 * ops.c - the predictor and batched matrix product kernels of ops.h.
 *
 * Row offsets are size_t: large weight matrices pass 2^31 bytes.
 */
#include "codelets/ops.h"

#include "model/act.h"
#include "model/model.h"
#include "model/pack8.h"
#include "model/quants.h"
#include "model/types.h"
#include "starinfer.h"

#include <cblas.h>
#include <limits.h>
#include <stdbool.h>

/*
 * Whether n_rows rows of n_cols elements of type t, row_bytes apart from w,
 * are a matrix the kernels can read: t supported, n_cols > 0 a whole number of
 * blocks, row_bytes at least a row (0: packed, set here).
 */
static bool check_rows(uint32_t t, const void *w, int64_t n_rows, int64_t n_cols,
                       size_t *row_bytes)
{
    size_t bytes = 0;
    if (!si_type_supported(t) || w == NULL || n_rows < 0 || n_cols <= 0 ||
        !si_type_row_size(t, n_cols, &bytes))
        return false;
    if (*row_bytes == 0)
        *row_bytes = bytes;
    return *row_bytes >= bytes;
}

static const void *row_at(const void *rows, size_t row_bytes, int64_t i)
{
    return (const char *)rows + (size_t)i * row_bytes;
}

int64_t si_k_predictor(uint32_t fc1_type, const void *fc1, size_t fc1_row_bytes,
                       uint32_t fc2_type, const void *fc2, size_t fc2_row_bytes, int64_t n_embd,
                       int64_t r, int64_t n_ff, const float *x, float threshold, float *hid,
                       float *z, int32_t *idx)
{
    /* Neuron indices are int32 (as everywhere in the sparse FFN). */
    if (!check_rows(fc1_type, fc1, r, n_embd, &fc1_row_bytes) ||
        !check_rows(fc2_type, fc2, n_ff, r, &fc2_row_bytes) || n_ff > INT32_MAX || x == NULL ||
        hid == NULL || idx == NULL)
        return SI_E_INVALID;
    for (int64_t j = 0; j < r; j++)
        hid[j] = si_act_apply(SI_ACT_RELU,
                              si_vec_dot(fc1_type, row_at(fc1, fc1_row_bytes, j), x, n_embd));
    int64_t count = 0;
    for (int64_t i = 0; i < n_ff; i++) {
        const float zi = si_vec_dot(fc2_type, row_at(fc2, fc2_row_bytes, i), hid, r);
        if (z != NULL)
            z[i] = zi;
        if (zi >= threshold)
            idx[count++] = (int32_t)i;
    }
    return count;
}

size_t si_k_gemm_scratch_size(uint32_t type, int64_t n_cols)
{
    if (type == SI_TYPE_F32 || n_cols <= 0)
        return 0;
    return (size_t)SI_K_GEMM_TILE_ROWS * (size_t)n_cols * sizeof(float);
}

/* si_k_gemm's tiles: rows [0, pk) packed 8 at a time (pk may end inside
 * a group), the rest in the row layout. */
static int gemm_tiles(uint32_t type, const void *w, size_t row_bytes, int64_t pk, int64_t n_rows,
                      int64_t n_cols, const float *x, int64_t ldx, int64_t n_tok, float *y,
                      int64_t ldy, void *scratch)
{
    float *tile = scratch;
    for (int64_t r0 = 0; r0 < n_rows; r0 += SI_K_GEMM_TILE_ROWS) {
        const int64_t nr =
            n_rows - r0 < SI_K_GEMM_TILE_ROWS ? n_rows - r0 : SI_K_GEMM_TILE_ROWS;
        int64_t i = 0;
        for (; i < nr && r0 + i < pk; i += 8) /* groups: at multiples of 8 of the tile */
            si_dequantize8(type, row_at(w, row_bytes, r0 + i), n_cols, tile + (size_t)i * n_cols);
        if (r0 + i > pk) /* past a group that ends the packed rows, or none here */
            i = pk > r0 ? pk - r0 : 0;
        for (; i < nr; i++)
            si_dequantize_row(type, row_at(w, row_bytes, r0 + i), tile + (size_t)i * n_cols,
                              n_cols);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)n_tok, (int)nr, (int)n_cols,
                    1.0f, x, (int)ldx, tile, (int)n_cols, 0.0f, y + r0, (int)ldy);
    }
    return SI_OK;
}

int si_k_gemm(uint32_t type, const void *w, size_t row_bytes, int64_t n_rows, int64_t n_cols,
              const float *x, int64_t ldx, int64_t n_tok, float *y, int64_t ldy, void *scratch)
{
    if (!check_rows(type, w, n_rows, n_cols, &row_bytes) || n_tok < 0 || x == NULL ||
        y == NULL || ldx < n_cols || ldy < n_rows)
        return SI_E_INVALID;
    /* The BLAS takes int dimensions and strides. */
    if (n_rows > INT_MAX || n_cols > INT_MAX || n_tok > INT_MAX || ldx > INT_MAX ||
        ldy > INT_MAX)
        return SI_E_INVALID;
    const bool f32 = type == SI_TYPE_F32;
    if (f32 ? row_bytes % sizeof(float) != 0 || (uintptr_t)w % sizeof(float) != 0
            : scratch == NULL)
        return SI_E_INVALID;
    if (n_rows == 0 || n_tok == 0)
        return SI_OK;

    /* Row-major Y (n_tok x n_rows) = X (n_tok x n_cols) . W^T, W's rows being
     * the rows of the stored (or dequantized) matrix. */
    if (f32) {
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)n_tok, (int)n_rows, (int)n_cols,
                    1.0f, x, (int)ldx, (const float *)w, (int)(row_bytes / sizeof(float)), 0.0f, y,
                    (int)ldy);
        return SI_OK;
    }
    return gemm_tiles(type, w, row_bytes, 0, n_rows, n_cols, x, ldx, n_tok, y, ldy, scratch);
}

int si_k_gemm_tensor(const struct si_tensor *w, const float *x, int64_t ldx, int64_t n_tok,
                     float *y, int64_t ldy, void *scratch)
{
    if (w->pk == 0)
        return si_k_gemm(w->type, w->data, w->row_bytes, w->ne[1], w->ne[0], x, ldx, n_tok, y,
                         ldy, scratch);
    if (!si_pack8_type(w->type) || w->pk > w->ne[1] || n_tok < 0 || x == NULL || y == NULL ||
        scratch == NULL || ldx < w->ne[0] || ldy < w->ne[1] || w->ne[1] > INT_MAX ||
        w->ne[0] > INT_MAX || n_tok > INT_MAX || ldx > INT_MAX || ldy > INT_MAX)
        return SI_E_INVALID;
    if (n_tok == 0)
        return SI_OK;
    return gemm_tiles(w->type, w->data, w->row_bytes, w->pk, w->ne[1], w->ne[0], x, ldx, n_tok, y,
                      ldy, scratch);
}
