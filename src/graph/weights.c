/*
 * weights.c - the weights the engine multiplies: the model's, with the
 * matrices it reads whole packed 8 rows at a time (model/pack8.h).
 *
 * Decoding reads every row of the attention's projections and the LM head
 * (and, in dense mode, of the FFN) once per token; packed, the CPU kernels
 * read them at about 5 times the rate of the row layout on this machine
 * (docs/measurements.md, "Packed rows"), with the same results bit for
 * bit.  A packed matrix is the engine's own copy; the file's pages of the
 * original are then released from the process (they stay in the page
 * cache, and come back only if something else reads them, such as the
 * reference), so the model is not resident twice.  With the model read
 * into memory instead of mapped (--no-mmap) the original stays: that mode
 * holds both copies.
 *
 * What is packed: Q4_0 and Q8_0 matrices (si_pack8_type), with converted
 * activations (act_quant), whose every split into tasks falls on groups of
 * 8 rows (si__split8_ok; the attention's kv-head groups: head_dim a
 * multiple of 8); the FFN's gate, up and down in dense mode, in layers
 * without a hot slice (the GPU's slice reads the row layout); in gate mode
 * the engine's gating rows of each cold slice, in place (no copy).
 */
#include "graph/graph.h"

#include "internal.h" /* si__errf */
#include "model/gguf.h"
#include "model/pack8.h"
#include "starinfer.h"

#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

/* The most row ranges any split of a matrix makes. */
static int64_t most_parts(const struct si_engine *e)
{
    int64_t n = 1;
    const int64_t k[4] = {e->na, e->nd, e->nr, e->nlh};
    for (int i = 0; i < 4; i++)
        n = k[i] > n ? k[i] : n;
    return n;
}

/* Releases the whole pages of [p, p + n) from the process (a file mapping's
 * pages: they are read again from the file if touched). */
static void release(const void *p, size_t n)
{
    const uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
    uintptr_t a = ((uintptr_t)p + page - 1) & ~(page - 1), b = ((uintptr_t)p + n) & ~(page - 1);
    if (b > a)
        madvise((void *)a, b - a, MADV_DONTNEED);
}

/* Packs t into memory of its own (kept in e->packed); SI_OK, or
 * SI_E_NOMEM.  Tensors that are not packable stay as they are. */
static int pack(struct si_engine *e, struct si_tensor *t, bool mapped)
{
    if (t->data == NULL || !si_pack8_type(t->type) || t->ne[1] < 8 ||
        !si__split8_ok(t->ne[1], most_parts(e)))
        return SI_OK;
    const int64_t groups = t->ne[1] / 8;
    const size_t bytes = t->nbytes, huge = (size_t)2 << 20;
    void *dst = NULL;
    /* 2 MiB-aligned and advised for transparent huge pages: fewer TLB misses. */
    if (posix_memalign(&dst, bytes >= huge ? huge : 64, bytes) != 0)
        return SI_E_NOMEM;
#ifdef MADV_HUGEPAGE
    if (bytes >= huge)
        madvise(dst, bytes, MADV_HUGEPAGE);
#endif
    if (e->n_packed % 64 == 0) {
        void **grown = realloc(e->packed, ((size_t)e->n_packed + 64) * sizeof *grown);
        if (grown == NULL) {
            free(dst);
            return SI_E_NOMEM;
        }
        e->packed = grown;
    }
    e->packed[e->n_packed++] = dst;
    e->stats.packed_bytes += (int64_t)bytes;
    const size_t gb = 8 * t->row_bytes;
    for (int64_t g = 0; g < groups; g++)
        si_pack8(t->type, (const char *)t->data + (size_t)g * gb, t->row_bytes, t->ne[0],
                 (char *)dst + (size_t)g * gb);
    memcpy((char *)dst + (size_t)groups * gb, (const char *)t->data + (size_t)groups * gb,
           bytes - (size_t)groups * gb); /* the rows after the last group */
    if (mapped)
        release(t->data, bytes);
    t->data = dst;
    t->pk = groups * 8;
    return SI_OK;
}

int si__weights_pack(struct si_engine *e, char *err, size_t err_size)
{
    const struct si_model *m = e->m;
    const struct si_hparams *hp = &m->hp;
    e->w = &m->w;
    if (!e->p.ref.act_quant || getenv("SI_NO_PACK") != NULL)
        return SI_OK;
    struct si_weights *w = malloc(sizeof *w);
    struct si_layer *layers = malloc((size_t)hp->n_layer * sizeof *layers);
    if (w == NULL || layers == NULL) {
        free(w);
        free(layers);
        return si__errf(err, err_size, SI_E_NOMEM, "out of memory for the engine's weights");
    }
    *w = m->w;
    memcpy(layers, m->w.layers, (size_t)hp->n_layer * sizeof *layers);
    w->layers = layers;
    e->own_w = w;
    e->w = w;
    const bool mapped = m->gguf != NULL && m->gguf->map != NULL;
    int rc = SI_OK;
    for (int l = 0; l < hp->n_layer && rc == SI_OK; l++) {
        struct si_layer *L = &layers[l];
        if (hp->head_dim % 8 == 0) {
            struct si_tensor *aw[4] = {&L->wq, &L->wk, &L->wv, &L->wo};
            for (int i = 0; i < 4 && rc == SI_OK; i++)
                rc = pack(e, aw[i], mapped);
        }
        if (!e->sparse && e->L[l].n_hot == 0) {
            struct si_tensor *fw[3] = {&L->ffn_gate, &L->ffn_up, &L->ffn_down};
            for (int i = 0; i < 3 && rc == SI_OK; i++)
                if (fw[i]->data != NULL && (i < 2 ? e->chunk % 8 == 0 || e->chunk == hp->n_ff
                                                  : true))
                    rc = pack(e, fw[i], mapped);
        }
    }
    /* Gate mode's gating rows (the engine's copy, in position order): each
     * cold slice's packed in place from its start, the rows after its last
     * group as they are; the hot slice (the GPU's) keeps the row layout. */
    for (int l = 0; l < hp->n_layer && rc == SI_OK && e->pre_sep; l++) {
        struct si__layer_state *S = &e->L[l];
        if (S->pre == NULL || !si_pack8_type(S->f.gu_type))
            continue;
        const size_t gb = 8 * S->f.gu_row;
        char *tmp = malloc(gb);
        if (tmp == NULL) {
            rc = SI_E_NOMEM;
            break;
        }
        for (int32_t j = S->hot ? 1 : 0; j < S->nsl; j++) {
            const int64_t n = S->s0[j + 1] - S->s0[j];
            char *first = (char *)S->pre + (size_t)S->s0[j] * S->f.gu_row;
            for (int64_t g = 0; g < n / 8; g++) {
                si_pack8(S->f.gu_type, first + (size_t)g * gb, S->f.gu_row, hp->n_embd, tmp);
                memcpy(first + (size_t)g * gb, tmp, gb);
            }
            S->pre_pk[j] = n / 8 * 8;
            e->stats.packed_bytes += (int64_t)(S->pre_pk[j] * (int64_t)S->f.gu_row);
        }
        free(tmp);
    }
    /* The LM head (the embedding table too when tied: the embedding keeps
     * reading the model's rows, a few per token). */
    if (rc == SI_OK)
        rc = pack(e, &w->output, mapped && w->output.data != m->w.token_embd.data);
    if (rc != SI_OK)
        return si__errf(err, err_size, rc, "out of memory for the engine's packed weights");
    return SI_OK;
}

void si__weights_free(struct si_engine *e)
{
    for (int32_t i = 0; i < e->n_packed; i++)
        free(e->packed[i]);
    free(e->packed);
    if (e->own_w != NULL)
        free(e->own_w->layers);
    free(e->own_w);
    e->packed = NULL;
    e->own_w = NULL;
    e->n_packed = 0;
}
