/*
 * pipe.c - one model across StarPU-MPI ranks: a pipeline of layer ranges.
 *
 * Rank r computes layers [l0, l1) of every token, the ranges chosen by the
 * weights' bytes (si_engine_pipe_range), and only those layers' weights
 * are read or packed there.  Per token, each rank submits its part of the
 * usual graph (graph/decode.c): rank 0 the embedding, the others a receive
 * of the residual x from rank r - 1 (starpu_mpi_irecv_detached on the x
 * handle: the first layer's tasks wait for it as for any writer); every
 * rank but the last a residual task that adds its last layer's FFN output
 * into x, then a send of x to rank r + 1; the last rank the LM head and a
 * send of the logits to rank 0, which receives them.  StarPU-MPI moves the
 * data and orders it with the tasks; nothing else crosses the ranks (the
 * library broadcasts the sampled token, api.c).
 */
#include "graph/graph.h"

#include "internal.h"
#include "starinfer.h"

#ifdef SI_USE_MPI
#include <starpu_mpi.h>
#endif

/* The message tags: the residual between neighbours, the logits to rank 0. */
enum { TAG_X = 1, TAG_LOGITS = 2 };

static int64_t layer_bytes(const struct si_layer *L)
{
    const struct si_tensor *t[] = {&L->wq,       &L->wk,     &L->wv, &L->wo,
                                   &L->ffn_gate, &L->ffn_up,
                                   L->ffn_down.data != NULL ? &L->ffn_down : &L->ffn_down_t};
    int64_t b = 0;
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++)
        b += t[i]->data != NULL ? (int64_t)t[i]->nbytes : 0;
    return b;
}

int si_engine_pipe_range(const struct si_model *m, int rank, int nranks, int32_t *l0, int32_t *l1)
{
    const int32_t n = m->hp.n_layer;
    if (nranks < 1 || rank < 0 || rank >= nranks || nranks > n)
        return SI_E_INVALID;
    /* The LM head weighs on the last rank like its layers. */
    int64_t total = (int64_t)m->w.output.nbytes;
    for (int32_t l = 0; l < n; l++)
        total += layer_bytes(&m->w.layers[l]);
    /* boundary k (1 <= k < nranks): the first layer whose bytes before it
     * reach k / nranks of the total, at least one layer a rank */
    int32_t b[2];
    for (int side = 0; side < 2; side++) {
        const int k = rank + side;
        if (k == 0 || k == nranks) {
            b[side] = k == 0 ? 0 : n;
            continue;
        }
        int64_t cum = 0;
        int32_t l = 0;
        while (l < n && cum < total / nranks * k)
            cum += layer_bytes(&m->w.layers[l++]);
        if (l < k)
            l = k;
        if (l > n - (nranks - k))
            l = n - (nranks - k);
        b[side] = l;
    }
    *l0 = b[0];
    *l1 = b[1];
    return SI_OK;
}

#ifdef SI_USE_MPI
int si__pipe_recv_x(struct si_engine *e)
{
    return starpu_mpi_irecv_detached(e->dec.h_x, e->pipe.rank - 1, TAG_X, MPI_COMM_WORLD, NULL,
                                     NULL) == 0
               ? SI_OK
               : SI_E_RUNTIME;
}

int si__pipe_send_x(struct si_engine *e)
{
    return starpu_mpi_isend_detached(e->dec.h_x, e->pipe.rank + 1, TAG_X, MPI_COMM_WORLD, NULL,
                                     NULL) == 0
               ? SI_OK
               : SI_E_RUNTIME;
}

int si__pipe_logits(struct si_engine *e)
{
    const int last = e->pipe.nranks - 1;
    if (last == 0)
        return SI_OK;
    int rc = 0;
    if (e->pipe.rank == last)
        rc = starpu_mpi_isend_detached(e->dec.h_logits, 0, TAG_LOGITS, MPI_COMM_WORLD, NULL, NULL);
    else if (e->pipe.rank == 0)
        rc = starpu_mpi_irecv_detached(e->dec.h_logits, last, TAG_LOGITS, MPI_COMM_WORLD, NULL,
                                       NULL);
    return rc == 0 ? SI_OK : SI_E_RUNTIME;
}
#else
int si__pipe_recv_x(struct si_engine *e)
{
    (void)e;
    return SI_E_UNSUPPORTED;
}

int si__pipe_send_x(struct si_engine *e)
{
    (void)e;
    return SI_E_UNSUPPORTED;
}

int si__pipe_logits(struct si_engine *e)
{
    (void)e;
    return e->pipe.nranks > 1 ? SI_E_UNSUPPORTED : SI_OK;
}
#endif
