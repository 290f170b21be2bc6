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
 * What is packed: Q4_0, Q4_1, Q8_0 and K-quant matrices (si_pack8_type),
 * with converted activations (act_quant), whose every split into tasks falls
 * on groups of 8 rows (si__split8_ok; the attention's kv-head groups: head_dim a
 * multiple of 8); the FFN's gate, up and down in dense mode, in layers
 * without a hot slice (the GPU's slice reads the row layout); in gate mode
 * the engine's gating rows of each cold slice, in place (no copy).
 */
#include "graph/graph.h"

#include "codelets/codelets.h" /* the pack8 task */
#include "graph/runtime.h"
#include "internal.h" /* si__errf */
#include "model/gguf.h"
#include "model/pack8.h"
#include "starinfer.h"

#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

/* The most row ranges any split of a matrix makes. */
static int64_t most_parts(const struct si_engine *e)
{
    int64_t n = 1;
    const int64_t k[4] = {e->dec.na, e->down.nd, e->bat.nr, e->bat.nlh};
    for (int i = 0; i < 4; i++)
        n = k[i] > n ? k[i] : n;
    return n;
}

/* The packing to do: a matrix's copy (or gate mode's rows in place) and its
 * jobs, run as pack8 tasks on every CPU worker at once. */
struct plan {
    struct si__pack_job *jobs;
    int64_t n_jobs, cap;
    struct todo {
        struct si_tensor *t; /* NULL: in place */
        void *dst;
        bool release;
    } *todo;
    int64_t n_todo;
};

/* Jobs of about 4 MiB over groups [0, groups) of 8 rows. */
static int add_jobs(struct plan *p, struct si__pack_job proto, int64_t groups)
{
    const int64_t per = (int64_t)((4u << 20) / (8 * proto.row_bytes)) + 1;
    for (int64_t g = 0; g < groups; g += per) {
        if (p->n_jobs == p->cap) {
            const int64_t cap = p->cap > 0 ? 2 * p->cap : 64;
            struct si__pack_job *grown = realloc(p->jobs, (size_t)cap * sizeof *grown);
            if (grown == NULL)
                return SI_E_NOMEM;
            p->jobs = grown;
            p->cap = cap;
        }
        proto.g0 = g;
        proto.g1 = g + per < groups ? g + per : groups;
        proto.tmp = NULL;
        p->jobs[p->n_jobs++] = proto;
    }
    return SI_OK;
}

void *si__weights_alloc(size_t bytes)
{
    const size_t huge = (size_t)2 << 20;
    void *dst = NULL;
    if (posix_memalign(&dst, bytes >= huge ? huge : 64, bytes > 0 ? bytes : 1) != 0)
        return NULL;
#ifdef MADV_HUGEPAGE
    if (bytes >= huge)
        madvise(dst, bytes, MADV_HUGEPAGE);
#endif
    return dst;
}

/* Plans t's copy: memory of its own (kept in e->own.packed) and its jobs;
 * SI_OK, or SI_E_NOMEM.  Tensors that are not packable stay as they are. */
static int plan_copy(struct si_engine *e, struct plan *p, struct si_tensor *t, bool release)
{
    if (t->data == NULL || !si_pack8_type(t->type) || t->ne[1] < 8 ||
        !si__split8_ok(t->ne[1], most_parts(e)))
        return SI_OK;
    void *dst = si__weights_alloc(t->nbytes);
    if (dst == NULL)
        return SI_E_NOMEM;
    if (e->own.n_packed % 64 == 0) {
        void **grown = realloc(e->own.packed, ((size_t)e->own.n_packed + 64) * sizeof *grown);
        if (grown == NULL) {
            free(dst);
            return SI_E_NOMEM;
        }
        e->own.packed = grown;
    }
    e->own.packed[e->own.n_packed++] = dst;
    struct todo *grown = realloc(p->todo, ((size_t)p->n_todo + 1) * sizeof *grown);
    if (grown == NULL)
        return SI_E_NOMEM;
    p->todo = grown;
    p->todo[p->n_todo++] = (struct todo){t, dst, release};
    return add_jobs(p, (struct si__pack_job){.type = t->type,
                                             .src = t->data,
                                             .dst = dst,
                                             .row_bytes = t->row_bytes,
                                             .n = t->ne[0],
                                             .release = release},
                    t->ne[1] / 8);
}

/* Runs the jobs as tasks and waits for them (the caller may be a worker:
 * si_runtime_wait_all runs tasks meanwhile); SI_OK, SI_E_NOMEM or
 * SI_E_RUNTIME. */
static int run_jobs(struct plan *p)
{
    const size_t tmp_bytes = 64 << 10;
    int rc = SI_OK;
    for (int64_t k = 0; k < p->n_jobs && rc == SI_OK; k++) {
        struct si__pack_job *j = &p->jobs[k];
        if (j->src == j->dst) {
            const size_t gb = 8 * j->row_bytes;
            if ((j->tmp = malloc(gb > tmp_bytes ? gb : tmp_bytes)) == NULL) {
                rc = SI_E_NOMEM;
                break;
            }
        }
        struct starpu_task *task = starpu_task_create();
        task->cl = &si__cl_pack;
        task->cl_arg = j;
        if (starpu_task_submit(task) != 0) {
            task->destroy = 0;
            starpu_task_destroy(task);
            rc = SI_E_RUNTIME;
        }
    }
    if (si_runtime_wait_all() != SI_OK && rc == SI_OK)
        rc = SI_E_RUNTIME;
    for (int64_t k = 0; k < p->n_jobs; k++)
        free(p->jobs[k].tmp);
    return rc;
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
    e->own.own_w = w;
    e->w = w;
    const bool mapped = m->gguf != NULL && m->gguf->map != NULL;
    struct plan p = {0};
    int rc = SI_OK;
    /* a pipeline's rank reads only its own layers (and the last, the head) */
    for (int l = e->pipe.l0; l < e->pipe.l1 && rc == SI_OK; l++) {
        struct si_layer *L = &layers[l];
        if (hp->head_dim % 8 == 0 && !e->L[l].attn_gpu) { /* the GPU reads the row layout */
            struct si_tensor *aw[4] = {&L->wq, &L->wk, &L->wv, &L->wo};
            for (int i = 0; i < 4 && rc == SI_OK; i++)
                rc = plan_copy(e, &p, aw[i], mapped);
        }
        if (e->p.mode == SI_SPARSITY_PREDICTOR) /* the predictor's first product */
            rc = rc == SI_OK ? plan_copy(e, &p, &L->fc1, mapped) : rc;
        if (!e->lay.sparse && e->L[l].n_hot == 0) {
            struct si_tensor *fw[3] = {&L->ffn_gate, &L->ffn_up, &L->ffn_down};
            for (int i = 0; i < 3 && rc == SI_OK; i++)
                if (fw[i]->data != NULL &&
                    (i < 2 ? e->lay.chunk % 8 == 0 || e->lay.chunk == hp->n_ff : true))
                    rc = plan_copy(e, &p, fw[i], mapped);
        }
    }
    /* The LM head; when tied, the embedding keeps reading the model's rows,
     * a few per token, which come back from the file as they are read. */
    if (rc == SI_OK && e->pipe.l1 == hp->n_layer)
        rc = plan_copy(e, &p, &w->output, mapped);
    /* Gate mode's gating rows (the engine's copy, in position order): each
     * cold slice's packed in place from its start, the rows after its last
     * group as they are; the hot slice (the GPU's) keeps the row layout. */
    for (int l = e->pipe.l0; l < e->pipe.l1 && rc == SI_OK && e->lay.pre_sep; l++) {
        struct si__layer_state *S = &e->L[l];
        if (S->pre == NULL || !si_pack8_type(S->f.gu_type))
            continue;
        for (int32_t j = S->hot ? 1 : 0; j < S->nsl && rc == SI_OK; j++) {
            const int64_t n = S->s0[j + 1] - S->s0[j];
            char *first = (char *)S->pre + (size_t)S->s0[j] * S->f.gu_row;
            rc = add_jobs(&p,
                          (struct si__pack_job){.type = S->f.gu_type,
                                                .src = first,
                                                .dst = first,
                                                .row_bytes = S->f.gu_row,
                                                .n = hp->n_embd},
                          n / 8);
            S->pre_pk[j] = n / 8 * 8;
            e->stats.packed_bytes += (int64_t)(S->pre_pk[j] * (int64_t)S->f.gu_row);
        }
    }
    /* The predictor's fc2 (the engine's copy, in position order), packed in
     * place: its rows are short (the predictor's width), where the row
     * kernel spends more on each row than on its bytes. */
    for (int l = e->pipe.l0; l < e->pipe.l1 && rc == SI_OK && e->p.mode == SI_SPARSITY_PREDICTOR;
         l++) {
        struct si__layer_state *S = &e->L[l];
        const struct si_tensor *fc2 = &m->w.layers[l].fc2;
        if (S->fc2p == NULL || !si_pack8_type(fc2->type))
            continue;
        rc = add_jobs(&p,
                      (struct si__pack_job){.type = fc2->type,
                                            .src = S->fc2p,
                                            .dst = S->fc2p,
                                            .row_bytes = fc2->row_bytes,
                                            .n = fc2->ne[0]},
                      fc2->ne[1] / 8);
        S->fc2_pk = fc2->ne[1] / 8 * 8;
        e->stats.packed_bytes += (int64_t)(S->fc2_pk * (int64_t)fc2->row_bytes);
    }
    if (rc == SI_OK)
        rc = run_jobs(&p);
    for (int64_t k = 0; k < p.n_todo; k++) {
        /* the rows after the last group, then the views onto the copy */
        struct si_tensor *t = p.todo[k].t;
        const int64_t groups = t->ne[1] / 8;
        const size_t gb = 8 * t->row_bytes;
        if (rc != SI_OK)
            break; /* the engine is freed: its copies with it */
        memcpy((char *)p.todo[k].dst + (size_t)groups * gb,
               (const char *)t->data + (size_t)groups * gb, t->nbytes - (size_t)groups * gb);
        if (p.todo[k].release)
            si__drop_pages(t->data, t->nbytes); /* the pages between the jobs' */
        t->data = p.todo[k].dst;
        t->pk = groups * 8;
        e->stats.packed_bytes += (int64_t)t->nbytes;
    }
    if (rc == SI_OK) {
        e->ref->lm_head = &w->output; /* the head tasks that run the reference's end */
        e->ref->attn_w = w;           /* attn_L tasks, the reference's attention */
    }
    free(p.jobs);
    free(p.todo);
    if (rc == SI_E_NOMEM)
        return si__errf(err, err_size, rc, "out of memory for the engine's packed weights");
    if (rc != SI_OK)
        return si__errf(err, err_size, rc, "StarPU failed a task packing the weights");
    return SI_OK;
}

void si__weights_free(struct si_engine *e)
{
    for (int32_t i = 0; i < e->own.n_packed; i++)
        free(e->own.packed[i]);
    free(e->own.packed);
    if (e->own.own_w != NULL)
        free(e->own.own_w->layers);
    free(e->own.own_w);
    e->own.packed = NULL;
    e->own.own_w = NULL;
    e->own.n_packed = 0;
}
