/* data.c - the engine's data: neuron records built from the model (or the
 * flash store), and every array registered as a StarPU handle, partitioned
 * into the layer's slices (filters), and unregistered at the end. */
#include "graph/graph.h"

#include "codelets/codelets.h"
#include "graph/runtime.h"
#include "flash/tier.h"
#include "internal.h"
#include "model/quants.h"
#include "starinfer.h"

#include <stdlib.h>
#include <string.h>

/* Child C of matrix F: nx x ny elements from byte offset off, F's ld. */
static void matrix_part(const struct starpu_matrix_interface *F, struct starpu_matrix_interface *C,
                        uint32_t nx, uint32_t ny, size_t off)
{
    C->id = F->id;
    C->nx = nx;
    C->ny = ny;
    C->elemsize = F->elemsize;
    if (F->dev_handle) {
        if (F->ptr)
            C->ptr = F->ptr + off;
        C->ld = F->ld;
        C->dev_handle = F->dev_handle;
        C->offset = F->offset + off;
        C->allocsize = (size_t)C->ld * C->ny * C->elemsize;
    } else {
        C->allocsize = (size_t)C->nx * C->ny * C->elemsize;
    }
}

/* Column byte ranges of a matrix's rows: a child per range (the KV cache's kv-head groups). */
static void filter_cols(void *father, void *child, struct starpu_data_filter *f, unsigned id,
                        unsigned nparts)
{
    (void)nparts;
    const struct starpu_matrix_interface *F = father;
    struct starpu_matrix_interface *C = child;
    const size_t *cols = f->filter_arg_ptr;
    matrix_part(F, C, (uint32_t)(cols[id + 1] - cols[id]), F->ny, cols[id] * F->elemsize);
}

/* Row blocks of ffn_down (dense layout): child k holds rows [dn[k], dn[k+1]). */
static void filter_rows(void *father, void *child, struct starpu_data_filter *f, unsigned id,
                        unsigned nparts)
{
    (void)nparts;
    const struct starpu_matrix_interface *F = father;
    struct starpu_matrix_interface *C = child;
    const int64_t *dn = f->filter_arg_ptr;
    matrix_part(F, C, F->nx, (uint32_t)(dn[id + 1] - dn[id]), (size_t)dn[id] * F->ld * F->elemsize);
}

/*
 * The pages of tensor t (NULL: none) that the engine copied: dropped from
 * the file's mapping, so that they are not resident twice; what reads them
 * again gets them back from the file.  Only a tensor inside the mapping: one
 * in memory (--no-mmap, or made at load) would lose its bytes.
 */
static void drop_copied(const struct si_engine *e, const struct si_tensor *t)
{
    const struct si_gguf *g = e->m->gguf;
    if (t == NULL || t->data == NULL || g == NULL || g->map == NULL)
        return;
    const char *a = t->data, *base = (const char *)g->base;
    if (a >= base && t->nbytes <= g->size && (size_t)(a - base) <= g->size - t->nbytes)
        si__drop_pages(a, t->nbytes);
}

/*
 * Sparse layout of layer l: the records in position order.  down_t comes
 * from the file, or from ffn_down transposed: dequantized to float, stored
 * in the type chosen at init (exact for F32 and F16 files).
 */
int si__build_records(struct si_engine *e, int l, float *col, char *err, size_t err_size)
{
    const struct si_hparams *hp = &e->m->hp;
    const struct si_layer *W = &e->m->w.layers[l];
    struct si__layer_state *L = &e->L[l];
    const int64_t ff = hp->n_ff, d = hp->n_embd;
    const struct si__ffn_fmt *f = &L->f;
    const size_t rb = f->rec_bytes;
    char *rec = L->rec;
    for (int64_t p = 0; p < ff; p++) {
        const int32_t i = L->perm[p];
        char *r = rec + (size_t)p * rb;
        if (f->gate_off >= 0)
            memcpy(r + f->gate_off, si_file_row(&W->ffn_gate, i), f->gu_row);
        if (f->up_off >= 0)
            memcpy(r + f->up_off, si_file_row(&W->ffn_up, i), f->gu_row);
        if (e->lay.pre_sep)
            memcpy((char *)L->pre + (size_t)p * f->gu_row,
                   si_file_row(e->lay.has_gate ? &W->ffn_gate : &W->ffn_up, i), f->gu_row);
        L->up_b[p] = W->ffn_up_b.data != NULL ? ((const float *)W->ffn_up_b.data)[i] : 0.0f;
        if (W->ffn_down_t.data != NULL)
            memcpy(rec + (size_t)p * rb + f->dt_off, si_file_row(&W->ffn_down_t, i), f->dt_row);
    }
    if (W->ffn_down_t.data == NULL) {
        /* col holds ffn_down as (n_embd, n_ff) floats, one output per row */
        for (int64_t o = 0; o < d; o++)
            si_dequantize_row(W->ffn_down.type, si_file_row(&W->ffn_down, o), col + (size_t)o * ff,
                              ff);
        float *t = malloc((size_t)d * sizeof(float));
        if (t == NULL)
            return si__errf(err, err_size, SI_E_NOMEM, "out of memory for down_t");
        for (int64_t p = 0; p < ff; p++) {
            for (int64_t o = 0; o < d; o++)
                t[o] = col[(size_t)o * ff + L->perm[p]];
            si_quantize_row(f->dt_type, t, rec + (size_t)p * rb + f->dt_off, d);
        }
        free(t);
    }
    if (e->p.mode == SI_SPARSITY_PREDICTOR) {
        const struct si_tensor *fc2 = &W->fc2;
        for (int64_t p = 0; p < ff; p++)
            memcpy((char *)L->fc2p + (size_t)p * fc2->row_bytes, si_file_row(fc2, L->perm[p]),
                   fc2->row_bytes);
    }
    /* Copied: the mapping need not keep them (a 7B Q4_0 in gate mode was
     * resident twice, 6.3 GB for its 3.9 GB). */
    const struct si_tensor *cp[5] = {&W->ffn_gate, &W->ffn_up, &W->ffn_down_t, &W->ffn_down,
                                     e->p.mode == SI_SPARSITY_PREDICTOR ? &W->fc2 : NULL};
    for (int i = 0; i < 5; i++)
        drop_copied(e, cp[i]);
    return SI_OK;
}

/*
 * Flash layout of layer l: the gating rows (gate mode) and biases from the
 * model, the hot records from the store (the model's FFN matrices are not
 * read otherwise), the predictor's fc2 in position order.
 */
int si__build_flash(struct si_engine *e, int l, char *err, size_t err_size)
{
    const struct si_hparams *hp = &e->m->hp;
    const struct si_layer *W = &e->m->w.layers[l];
    struct si__layer_state *L = &e->L[l];
    const int64_t ff = hp->n_ff;
    const struct si_tensor *g = e->lay.has_gate ? &W->ffn_gate : &W->ffn_up;
    for (int64_t p = 0; p < ff; p++) {
        const int32_t i = L->perm[p];
        if (e->lay.pre_sep)
            memcpy((char *)L->pre + (size_t)p * L->f.gu_row, si_file_row(g, i), L->f.gu_row);
        L->up_b[p] = W->ffn_up_b.data != NULL ? ((const float *)W->ffn_up_b.data)[i] : 0.0f;
    }
    if (e->lay.pre_sep)
        drop_copied(e, g);
    if (si_flash_tier_read(e->fl.ft, l, L->perm, L->n_hot, L->rec) != SI_OK)
        return si__errf(err, err_size, SI_E_IO, "%s (layer %d's resident neurons)",
                        e->fl.ft->store->read_err, l);
    if (e->p.mode == SI_SPARSITY_PREDICTOR) {
        const struct si_tensor *fc2 = &W->fc2;
        for (int64_t p = 0; p < ff; p++)
            memcpy((char *)L->fc2p + (size_t)p * fc2->row_bytes, si_file_row(fc2, L->perm[p]),
                   fc2->row_bytes);
    }
    return SI_OK;
}

static void vec(starpu_data_handle_t *h, const void *p, size_t n, size_t elem)
{
    starpu_vector_data_register(h, STARPU_MAIN_RAM, (uintptr_t)p, (uint32_t)n, elem);
}

/* Partition the vector h into n children along a vector of lengths. */
static void split_n(starpu_data_handle_t h, unsigned n, uint32_t *lengths,
                    starpu_data_handle_t *children)
{
    struct starpu_data_filter f = {
        .filter_func = starpu_vector_filter_list, .nchildren = n, .filter_arg_ptr = lengths};
    starpu_data_partition_plan(h, &f, children);
    starpu_data_partition_submit(h, n, children);
}

/* Partition h into the layer's slices. */
static void split(starpu_data_handle_t h, struct si__layer_state *L, uint32_t *lengths,
                  starpu_data_handle_t *children)
{
    split_n(h, (unsigned)L->nsl, lengths, children);
}

/* Undo a partition of h into n children (if any), then unregister h. */
static void unsplit_n(starpu_data_handle_t h, unsigned n, starpu_data_handle_t *children)
{
    if (h == NULL)
        return;
    if (children != NULL && children[0] != NULL) /* (unpartitioning first if partitioned) */
        starpu_data_partition_clean(h, n, children);
    starpu_data_unregister(h);
}

static void unsplit(starpu_data_handle_t h, struct si__layer_state *L,
                    starpu_data_handle_t *children)
{
    unsplit_n(h, (unsigned)L->nsl, children);
}

/* Register layer l's handles and partition them into its slices. */
static void register_layer(struct si_engine *e, int l)
{
    const struct si_hparams *hp = &e->m->hp;
    const struct si_layer *W = &e->w->layers[l];
    struct si__layer_state *L = &e->L[l];
    struct si_ref *s = e->ref;
    const size_t rb[2] = {si_ref_kv_row_bytes(&s->p, hp, false),
                          si_ref_kv_row_bytes(&s->p, hp, true)};
    const struct si_tensor *aw[4] = {&W->wq, &W->wk, &W->wv, &W->wo};
    for (int i = 0; i < 4; i++)
        vec(&L->h_w[i], aw[i]->data, aw[i]->nbytes, 1);
    if (e->dec.ng > 1) {
        /* Each attention task writes its kv heads' columns of the cache: the
         * layer's cache as a matrix (a row per position, in bytes), a child
         * per group of columns (K's bounds, then V's: their types may
         * differ; a quantized kv head is whole blocks). */
        for (int i = 0; i < 2; i++)
            for (int32_t g = 0; g <= e->dec.ng; g++) {
                size_t b = 0;
                si_type_row_size(si_ref_kv_type(&s->p, i), e->dec.a_g[g] * hp->head_dim, &b);
                L->kv_cols[(size_t)i * ((size_t)e->dec.ng + 1) + (size_t)g] = b;
            }
        starpu_data_handle_t *hc[2] = {&L->h_k, &L->h_v}, *cc[2] = {L->h_k_c, L->h_v_c};
        const char *base[2] = {s->kcache, s->vcache};
        for (int i = 0; i < 2; i++) {
            struct starpu_data_filter f = {.filter_func = filter_cols,
                                           .nchildren = (unsigned)e->dec.ng,
                                           .filter_arg_ptr =
                                               L->kv_cols + (size_t)i * ((size_t)e->dec.ng + 1)};
            starpu_matrix_data_register(
                hc[i], STARPU_MAIN_RAM,
                (uintptr_t)(base[i] + (size_t)l * (size_t)s->p.n_ctx * rb[i]), (uint32_t)rb[i],
                (uint32_t)rb[i], (uint32_t)s->p.n_ctx, 1);
            starpu_data_partition_plan(*hc[i], &f, cc[i]);
            starpu_data_partition_submit(*hc[i], (unsigned)e->dec.ng, cc[i]);
        }
    } else {
        vec(&L->h_k, (char *)s->kcache + (size_t)l * (size_t)s->p.n_ctx * rb[0],
            (size_t)s->p.n_ctx * rb[0], 1);
        vec(&L->h_v, (char *)s->vcache + (size_t)l * (size_t)s->p.n_ctx * rb[1],
            (size_t)s->p.n_ctx * rb[1], 1);
    }

    const int64_t ff = hp->n_ff;
    if (!e->lay.sparse) {
        if (e->lay.has_gate) {
            vec(&L->h_gate, W->ffn_gate.data, (size_t)ff, L->f.gu_row);
            split(L->h_gate, L, L->len_n, L->h_gate_c);
        }
        vec(&L->h_up, W->ffn_up.data, (size_t)ff, L->f.gu_row);
        split(L->h_up, L, L->len_n, L->h_up_c);
        const struct si_tensor *dn = &W->ffn_down;
        starpu_matrix_data_register(&L->h_down, STARPU_MAIN_RAM, (uintptr_t)dn->data,
                                    (uint32_t)dn->row_bytes, (uint32_t)dn->row_bytes,
                                    (uint32_t)hp->n_embd, 1);
        struct starpu_data_filter f = {.filter_func = filter_rows,
                                       .nchildren = (unsigned)e->down.nd,
                                       .filter_arg_ptr = e->down.dn};
        starpu_data_partition_plan(L->h_down, &f, L->h_down_c);
        starpu_data_partition_submit(L->h_down, (unsigned)e->down.nd, L->h_down_c);
        vec(&L->h_upb, W->ffn_up_b.data != NULL ? W->ffn_up_b.data : e->lay.zeros, (size_t)ff,
            sizeof(float));
    } else {
        if (e->lay.pre_sep) {
            vec(&L->h_gate, L->pre, (size_t)ff, L->f.gu_row);
            split(L->h_gate, L, L->len_n, L->h_gate_c);
        }
        if (e->fl.on) {
            /* the hot records alone (slot 0), the cold ones in the cache */
            if (L->hot)
                vec(&L->h_rec_c[0], L->rec, (size_t)L->n_hot, L->f.rec_bytes);
            const struct si_flash_cache *fc = &e->fl.ft->L[l].fc;
            vec(&L->h_cache, fc->mat, fc->cap > 0 ? (size_t)fc->cap : 1, L->f.rec_bytes);
        } else {
            vec(&L->h_rec, L->rec, (size_t)ff, L->f.rec_bytes);
            split(L->h_rec, L, L->len_n, L->h_rec_c);
        }
        vec(&L->h_upb, L->up_b, (size_t)ff, sizeof(float));
    }
    split(L->h_upb, L, L->len_n, L->h_upb_c);
    if (e->p.mode == SI_SPARSITY_PREDICTOR) {
        vec(&L->h_fc1, W->fc1.data, W->fc1.nbytes, 1);
        vec(&L->h_fc2, L->fc2p, W->fc2.nbytes, 1);
    }
    if (L->idx != NULL) { /* predictor mode, and gate mode's flash masks */
        vec(&L->h_idx, L->idx, (size_t)ff, sizeof(int32_t));
        split(L->h_idx, L, L->len_n, L->h_idx_c);
    }
    if (L->gact != NULL) { /* gate mode's flash masks: act(gate) of the neurons that pass */
        vec(&L->h_gact, L->gact, (size_t)ff, sizeof(float));
        split(L->h_gact, L, L->len_n, L->h_gact_c);
    }
    size_t part = 0;
    for (int32_t j = 0; j < L->nsl; j++)
        part += L->len_p[j];
    vec(&L->h_part, L->part, part, sizeof(float));
    split(L->h_part, L, L->len_p, L->h_part_c);
    if (e->p.redux) {
        vec(&L->h_y, L->y, (size_t)hp->n_embd, sizeof(float));
        starpu_data_set_reduction_methods(L->h_y, &si__cl_sum, &si__cl_zero);
    }

    /* Attention on the GPU (attn_gpu.c): its vectors as one buffer; its
     * weights and those go there once and stay. */
    if (L->attn_gpu) {
        vec(&L->h_aux, L->aux, (size_t)L->aux_n, sizeof(float));
        if (e->gpu.cuda_hot && e->gpu.cuda_node >= 0) {
            for (int i = 0; i < 4; i++)
                starpu_data_prefetch_on_node(L->h_w[i], (unsigned)e->gpu.cuda_node, 1);
            starpu_data_prefetch_on_node(L->h_aux, (unsigned)e->gpu.cuda_node, 1);
        }
    }

    /* The hot slice's weights go to the GPU once and stay there. */
    if (L->hot && e->gpu.cuda_hot && e->gpu.cuda_node >= 0) {
        starpu_data_handle_t hot[3] = {e->lay.sparse ? L->h_rec_c[0] : L->h_up_c[0], L->h_upb_c[0],
                                       L->h_gate != NULL ? L->h_gate_c[0] : NULL};
        for (int i = 0; i < 3; i++)
            if (hot[i] != NULL)
                starpu_data_prefetch_on_node(hot[i], (unsigned)e->gpu.cuda_node, 1);
    }
}

/*
 * The GPU memory of every handle the engine lets onto the CUDA node, as
 * StarPU's allocator takes it (si__gpu_bytes): what ffn_cuda's task
 * (codelets/ffn.c) reads and writes (see submit_ffn in decode.c), for the
 * layers with a hot slice; with hot_on_cpu the same handles as if there
 * were a GPU.  si__gpu_planned (layout.c) counts the same handles from a
 * plan, before they exist.
 */
int64_t si__gpu_accounted(const struct si_engine *e)
{
    struct si__gpu_bytes g = {0, 0};
    bool any = false;
    for (int l = 0; l < e->m->hp.n_layer; l++) {
        const struct si__layer_state *L = &e->L[l];
        if (!L->hot)
            continue;
        any = true;
        const starpu_data_handle_t h[] = {
            L->h_gate_c[0] != NULL && L->h_gate != NULL ? L->h_gate_c[0] : NULL,
            !e->lay.sparse ? L->h_up_c[0] : NULL,
            e->lay.sparse ? L->h_rec_c[0] : NULL,
            L->h_upb_c[0],
            e->p.mode == SI_SPARSITY_PREDICTOR ? L->h_idx_c[0] : NULL,
            L->h_part_c[0]};
        for (size_t i = 0; i < sizeof h / sizeof h[0]; i++)
            if (h[i] != NULL)
                si__gpu_bytes_add(&g, (int64_t)starpu_data_get_size(h[i]));
    }
    if (any) {
        const starpu_data_handle_t s[] = {e->dec.h_ffn_in, e->dec.h_iota, e->dec.h_hscratch};
        for (size_t i = 0; i < sizeof s / sizeof s[0]; i++)
            si__gpu_bytes_add(&g, (int64_t)starpu_data_get_size(s[i]));
        if (e->lay.sparse && e->bat.n_batch > 1) { /* a batch's, for bffn_cuda (prefill.c) */
            si__gpu_bytes_add(&g, (int64_t)starpu_data_get_size(e->bat.h_bffn_in));
            si__gpu_bytes_add(&g, (int64_t)starpu_data_get_size(e->bat.h_bpart[0]));
        }
    }
    /* The GPU layers' attention task (decode.c's submit_attention): x, the
     * carried partial outputs, ffn_in, the caches, the weights, aux, the
     * scratch. */
    for (int l = 0; l < e->gpu.n_attn_gpu; l++) {
        const struct si__layer_state *L = &e->L[l];
        for (int i = 0; i < 4; i++)
            si__gpu_bytes_add(&g, (int64_t)starpu_data_get_size(L->h_w[i]));
        for (int32_t j = 0; j < (e->dec.ng > 1 ? e->dec.ng : 1); j++) {
            si__gpu_bytes_add(&g,
                              (int64_t)starpu_data_get_size(e->dec.ng > 1 ? L->h_k_c[j] : L->h_k));
            si__gpu_bytes_add(&g,
                              (int64_t)starpu_data_get_size(e->dec.ng > 1 ? L->h_v_c[j] : L->h_v));
        }
        si__gpu_bytes_add(&g, (int64_t)starpu_data_get_size(L->h_aux));
        for (int32_t j = 0; l > 0 && e->lay.sparse && !e->p.redux && j < e->L[l - 1].nsl; j++)
            if (!(j == 0 && e->L[l - 1].hot)) /* the hot one is counted above */
                si__gpu_bytes_add(&g, (int64_t)starpu_data_get_size(e->L[l - 1].h_part_c[j]));
    }
    if (e->gpu.n_attn_gpu > 0) {
        si__gpu_bytes_add(&g, (int64_t)starpu_data_get_size(e->dec.h_x));
        si__gpu_bytes_add(&g, (int64_t)starpu_data_get_size(e->gpu.h_ascratch));
        if (!any)
            si__gpu_bytes_add(&g, (int64_t)starpu_data_get_size(e->dec.h_ffn_in));
        for (int32_t k = 0; !e->lay.sparse && k < e->down.nd; k++)
            si__gpu_bytes_add(&g, (int64_t)starpu_data_get_size(e->down.h_dout[k]));
    }
    return si__gpu_bytes_total(&g);
}

static void unregister_layer(struct si_engine *e, int l)
{
    struct si__layer_state *L = &e->L[l];
    if (L->h_aux != NULL)
        starpu_data_unregister(L->h_aux);
    for (int i = 0; i < 4; i++)
        if (L->h_w[i] != NULL)
            starpu_data_unregister(L->h_w[i]);
    starpu_data_handle_t *kv[2] = {&L->h_k, &L->h_v}, *kv_c[2] = {L->h_k_c, L->h_v_c};
    for (int i = 0; i < 2; i++) {
        if (*kv[i] == NULL)
            continue;
        if (kv_c[i] != NULL && kv_c[i][0] != NULL) {
            starpu_data_unpartition_submit(*kv[i], (unsigned)e->dec.ng, kv_c[i], STARPU_MAIN_RAM);
            starpu_data_partition_clean(*kv[i], (unsigned)e->dec.ng, kv_c[i]);
        }
        starpu_data_unregister(*kv[i]);
    }
    unsplit(L->h_gate, L, L->h_gate_c);
    unsplit(L->h_up, L, L->h_up_c);
    unsplit_n(L->h_down, (unsigned)e->down.nd, L->h_down_c);
    if (e->fl.on && L->h_rec_c != NULL && L->h_rec_c[0] != NULL) {
        starpu_data_unregister(L->h_rec_c[0]); /* registered alone, not a child */
        L->h_rec_c[0] = NULL;
    }
    if (L->h_cache != NULL)
        starpu_data_unregister(L->h_cache);
    unsplit(L->h_rec, L, L->h_rec_c);
    unsplit(L->h_upb, L, L->h_upb_c);
    unsplit(L->h_idx, L, L->h_idx_c);
    unsplit(L->h_gact, L, L->h_gact_c);
    unsplit(L->h_part, L, L->h_part_c);
    unsplit(L->h_fc1, L, NULL);
    unsplit(L->h_fc2, L, NULL);
    unsplit(L->h_y, L, NULL);
}

/* The logits rows of a batch at p (rows x n_vocab floats): a handle per
 * slice of the vocabulary, its columns [lh[j], lh[j+1]) of every row
 * (si_engine_eval_batch_logits).  Separate registrations, not a partition:
 * undoing one waits inside StarPU, which the CLI's thread, worker 0, must
 * not do. */
/* Layer l's K and V cache handles into h (2 ng at most): a partitioned
 * cache's children, its parent not being accessible while they are.
 * Returns how many. */
static int layer_kv_handles(const struct si_engine *e, int l, starpu_data_handle_t *h)
{
    const struct si__layer_state *L = &e->L[l];
    starpu_data_handle_t const *kv[2] = {&L->h_k, &L->h_v}, *kv_c[2] = {L->h_k_c, L->h_v_c};
    int n = 0;
    for (int i = 0; i < 2; i++) {
        const bool parts = kv_c[i] != NULL && kv_c[i][0] != NULL;
        for (int32_t g = 0; g < (parts ? e->dec.ng : 1); g++)
            h[n++] = parts ? kv_c[i][g] : *kv[i];
    }
    return n;
}

int si_engine_sync_kv(struct si_engine *e)
{
    for (int l = e->pipe.l0; l < e->pipe.l1; l++) {
        starpu_data_handle_t h[2 * SI__MAX_SLICES];
        const int n = layer_kv_handles(e, l, h);
        for (int k = 0; k < n; k++) {
            if (si_runtime_acquire(h[k], STARPU_R) != SI_OK)
                return SI_E_RUNTIME;
            starpu_data_release(h[k]);
        }
    }
    return SI_OK;
}

int si_engine_kv_shift(struct si_engine *e, struct si_ref *seq, int32_t n_keep,
                       int32_t n_discard)
{
    if (e->pipe.nranks > 1)
        return SI_E_UNSUPPORTED; /* each rank holds its layers' caches */
    if (seq != e->ref) /* a sequence's cache is reached through ref's handles by
                        * the steps, which are over (the caller's group lock) */
        return si_ref_kv_shift(seq, n_keep, n_discard);
    int rc = si_ref_kv_shift_check(seq, n_keep, n_discard);
    if (rc != SI_OK)
        return rc;
    const struct si_hparams *hp = &e->m->hp;
    float *row = malloc((size_t)hp->n_head_kv * (size_t)hp->head_dim * sizeof *row);
    if (row == NULL)
        return SI_E_NOMEM;
    /* layer by layer: its K and V in main memory for writing (the GPU's
     * copies of a layer whose attention runs there come back, and are
     * dropped), its rows moved, released */
    for (int l = 0; l < hp->n_layer && rc == SI_OK; l++) {
        starpu_data_handle_t h[2 * SI__MAX_SLICES];
        const int n = layer_kv_handles(e, l, h);
        int n_held = 0;
        while (n_held < n && si_runtime_acquire(h[n_held], STARPU_RW) == SI_OK)
            n_held++;
        if (n_held < n)
            rc = SI_E_RUNTIME;
        else
            si_ref_kv_shift_layer(seq, l, n_keep, n_discard, row);
        for (int k = 0; k < n_held; k++)
            starpu_data_release(h[k]);
    }
    free(row);
    if (rc == SI_OK)
        seq->n_past -= n_discard;
    return rc;
}

void si__register_batch_logits(struct si_engine *e, float *p, int32_t rows)
{
    const uint32_t nv = (uint32_t)e->m->hp.n_vocab;
    for (int32_t j = 0; j < e->bat.nlh; j++)
        starpu_matrix_data_register(
            &e->bat.h_blog_c[j], STARPU_MAIN_RAM, (uintptr_t)(p + e->bat.lh[j]), nv,
            (uint32_t)(e->bat.lh[j + 1] - e->bat.lh[j]), (uint32_t)rows, sizeof(float));
}

/* Wait for the tasks writing the handles of si__register_batch_logits (the
 * calling thread running tasks if it is worker 0), then unregister them. */
void si__unregister_batch_logits(struct si_engine *e)
{
    for (int32_t j = 0; j < e->bat.nlh; j++) {
        if (e->bat.h_blog_c[j] == NULL)
            continue;
        si_runtime_acquire(e->bat.h_blog_c[j], STARPU_R);
        starpu_data_release(e->bat.h_blog_c[j]);
        starpu_data_unregister(e->bat.h_blog_c[j]);
        e->bat.h_blog_c[j] = NULL;
    }
}

/* ------------------------------------------------------------ engine */

/* Turn off StarPU's implicit dependencies (sequential consistency) on the
 * handles that tasks only read: the weights.  Nothing writes them once
 * packed, so they need none, and StarPU built with FxT (as install-deps
 * builds it) keeps, for each handle, the job id of every finished task that
 * read it until a task writes it (its "ghost" readers, for the trace's
 * dependencies): 16 bytes malloc'ed per reading task, forever, on a handle
 * that is only read; about 15 KiB a token on SmolLM2 (tools/soak).  After
 * the partitions' tasks, which write the children. */
static void read_only(starpu_data_handle_t h)
{
    if (h != NULL)
        starpu_data_set_sequential_consistency_flag(h, 0);
}

/* h's children when it is partitioned, else h. */
static void read_only_n(starpu_data_handle_t h, starpu_data_handle_t *c, int32_t n)
{
    if (h == NULL)
        return;
    if (c != NULL && c[0] != NULL)
        for (int32_t j = 0; j < n; j++)
            read_only(c[j]);
    else
        read_only(h);
}

static void read_only_weights(struct si_engine *e)
{
    si_runtime_wait_all(); /* the partition tasks */
    for (int l = 0; l < e->m->hp.n_layer; l++) {
        struct si__layer_state *L = &e->L[l];
        for (int i = 0; i < 4; i++)
            read_only(L->h_w[i]);
        read_only_n(L->h_gate, L->h_gate_c, L->nsl);
        read_only_n(L->h_up, L->h_up_c, L->nsl);
        read_only_n(L->h_down, L->h_down_c, e->down.nd);
        read_only_n(L->h_upb, L->h_upb_c, L->nsl);
        if (!e->fl.on)
            read_only_n(L->h_rec, L->h_rec_c, L->nsl);
        else if (L->h_rec_c != NULL)
            read_only(L->h_rec_c[0]); /* the resident hot records, registered alone */
        read_only(L->h_fc1);
        read_only(L->h_fc2);
    }
    read_only(e->dec.h_out);
    read_only(e->dec.h_iota);
}

/* Register the engine-wide handles (activations, logits, the LM head, the
 * attention split's and the batches' buffers) and every layer's. */
void si__register_engine(struct si_engine *e)
{
    const struct si_model *m = e->m;
    const struct si_hparams *hp = &m->hp;
    const size_t d = (size_t)hp->n_embd;
    const int32_t ns = e->lay.n_slices;
    struct si_ref *s = e->ref;
    vec(&e->dec.h_x, s->x, d, sizeof(float));
    vec(&e->dec.h_ffn_in, s->xb, d, sizeof(float));
    if (hp->parallel_residual) { /* the attention output beside the FFN's */
        vec(&e->dec.h_xb3, s->xb3, d, sizeof(float));
        starpu_data_set_name(e->dec.h_xb3, "attn_out");
    }
    vec(&e->dec.h_logits, s->logits, (size_t)hp->n_vocab, sizeof(float));
    vec(&e->dec.h_out, e->w->output.data, e->w->output.nbytes, 1);
    vec(&e->dec.h_iota, e->lay.iota, (size_t)hp->n_ff, sizeof(int32_t));
    starpu_vector_data_register(&e->dec.h_hscratch, -1, 0, 2 * (uint32_t)hp->n_ff, sizeof(float));
    if (e->gpu.n_attn_gpu > 0)
        starpu_vector_data_register(&e->gpu.h_ascratch, -1, 0,
                                    (uint32_t)si__attn_gpu_scratch_floats(m), sizeof(float));
    starpu_data_set_name(e->dec.h_x, "x");
    starpu_data_set_name(e->dec.h_ffn_in, "ffn_in");
    starpu_data_set_name(e->dec.h_logits, "logits");
    for (int l = 0; l < hp->n_layer; l++)
        register_layer(e, l);
    if (e->fl.on)
        vec(&e->fl.h_spill, e->fl.ft->region, (size_t)e->fl.ft->spill_cap, e->fl.ft->rec_bytes);
    if (e->dec.na > 1) {
        for (int32_t j = 0; j < e->dec.na; j++)
            vec(&e->dec.h_part[j], e->dec.part[j], e->dec.part_cap, sizeof(float));
        /* Wo's slices write the children; between their tasks and the
         * readers' the engine joins them (attn.c's join_o) */
        vec(&e->dec.h_o_all, e->dec.o_all, d, sizeof(float));
        split_n(e->dec.h_o_all, (unsigned)e->dec.na, e->dec.o_len, e->dec.h_o);
        if (e->lay.fuse_wo) { /* the groups' partial products, joined likewise */
            vec(&e->dec.h_opart, e->dec.opart, (size_t)e->dec.ng * d, sizeof(float));
            split_n(e->dec.h_opart, (unsigned)e->dec.ng, e->dec.opart_len, e->dec.h_opart_c);
        }
        vec(&e->dec.h_x2, e->dec.x2, d, sizeof(float));
        vec(&e->dec.h_att, s->att, (size_t)hp->n_head * (size_t)hp->head_dim, sizeof(float));
        if (e->dec.ng > 1)
            split_n(e->dec.h_att, (unsigned)e->dec.ng, e->dec.att_len, e->dec.h_att_c);
        /* The LM head's row slices write children of the logits; the
         * partition is undone before anyone reads them (see eval). */
        for (int32_t j = 0; j < e->dec.na; j++)
            e->dec.head_len[j] = (uint32_t)(e->dec.a_h[j + 1] - e->dec.a_h[j]);
        struct starpu_data_filter f = {.filter_func = starpu_vector_filter_list,
                                       .nchildren = (unsigned)e->dec.na,
                                       .filter_arg_ptr = e->dec.head_len};
        starpu_data_partition_plan(e->dec.h_logits, &f, e->dec.h_logits_c);
    }
    if (e->down.nd > 0) { /* the down blocks write the children (merge.c joins them) */
        vec(&e->down.h_dout_all, e->down.dout_all, d, sizeof(float));
        split_n(e->down.h_dout_all, (unsigned)e->down.nd, e->down.dout_len, e->down.h_dout);
    }
    for (int32_t k = 0; k < e->down.nd; k++) {
        const size_t no = (size_t)(e->down.dn[k + 1] - e->down.dn[k]);
        if (e->bat.n_batch > 1)
            vec(&e->down.h_bdout[k], e->down.bdout[k], (size_t)e->bat.n_batch * no, sizeof(float));
    }
    const size_t qkv = (size_t)(hp->n_head + 2 * hp->n_head_kv) * (size_t)hp->head_dim;
    for (int32_t j = 0; j < e->bat.nr && e->bat.n_batch > 1; j++)
        vec(&e->bat.h_bqkv[j], e->bat.bqkv[j], (size_t)e->bat.n_batch * qkv, sizeof(float));
    for (int32_t j = 0; j < e->bat.nc * e->bat.nr && e->bat.n_batch > 1; j++)
        vec(&e->bat.h_batt[j], e->bat.batt[j],
            (size_t)e->bat.n_batch * (size_t)si__chunk_len(e, j / e->bat.nr), sizeof(float));
    for (int32_t j = 0; j < e->bat.nr && e->bat.n_batch > 1; j++)
        vec(&e->bat.h_bo[j], e->bat.bo[j],
            (size_t)e->bat.n_batch * (size_t)(e->bat.bo_c[j + 1] - e->bat.bo_c[j] > 0
                                                  ? e->bat.bo_c[j + 1] - e->bat.bo_c[j]
                                                  : 1),
            sizeof(float));
    if (e->bat.n_batch > 1) {
        const size_t bd = (size_t)e->bat.n_batch * d;
        vec(&e->bat.h_bx, e->bat.bx, bd, sizeof(float));
        vec(&e->bat.h_bffn_in, e->bat.bffn_in, bd, sizeof(float));
        vec(&e->bat.h_bxb3, e->bat.bxb3, bd, sizeof(float));
        for (int32_t j = 0; j <= ns; j++)
            vec(&e->bat.h_bpart[j], e->bat.bpart[j],
                e->lay.sparse ? bd * (size_t)e->bat.brows[j]
                              : (size_t)e->bat.n_batch *
                                    (size_t)(e->bat.bwidth[j] > 0 ? e->bat.bwidth[j] : 1),
                sizeof(float));
        starpu_data_set_name(e->bat.h_bx, "x_batch");
        starpu_data_set_name(e->bat.h_bffn_in, "ffn_in_batch");
    }
    read_only_weights(e);
}

/* Undo si__register_engine, once every task has finished. */
void si__unregister_engine(struct si_engine *e)
{
    for (int l = 0; l < e->m->hp.n_layer; l++)
        unregister_layer(e, l);
    starpu_data_unregister(e->dec.h_x);
    starpu_data_unregister(e->dec.h_ffn_in);
    if (e->dec.head_len != NULL) /* the plan exists from init on */
        starpu_data_partition_clean(e->dec.h_logits, (unsigned)e->dec.na, e->dec.h_logits_c);
    starpu_data_unregister(e->dec.h_logits);
    starpu_data_unregister(e->dec.h_out);
    starpu_data_unregister(e->dec.h_iota);
    starpu_data_unregister(e->dec.h_hscratch);
    if (e->gpu.h_ascratch != NULL)
        starpu_data_unregister(e->gpu.h_ascratch);
    if (e->fl.h_spill != NULL)
        starpu_data_unregister(e->fl.h_spill);
    if (e->dec.h_xb3 != NULL)
        starpu_data_unregister(e->dec.h_xb3);
    if (e->dec.h_att != NULL) {
        for (int32_t j = 0; j < e->dec.na; j++)
            starpu_data_unregister(e->dec.h_part[j]);
        starpu_data_partition_clean(e->dec.h_o_all, (unsigned)e->dec.na, e->dec.h_o);
        starpu_data_unregister(e->dec.h_o_all);
        if (e->dec.h_opart != NULL) {
            starpu_data_partition_clean(e->dec.h_opart, (unsigned)e->dec.ng, e->dec.h_opart_c);
            starpu_data_unregister(e->dec.h_opart);
        }
        if (e->dec.ng > 1) {
            starpu_data_unpartition_submit(e->dec.h_att, (unsigned)e->dec.ng, e->dec.h_att_c,
                                           STARPU_MAIN_RAM);
            starpu_data_partition_clean(e->dec.h_att, (unsigned)e->dec.ng, e->dec.h_att_c);
        }
        starpu_data_unregister(e->dec.h_att);
        starpu_data_unregister(e->dec.h_x2);
    }
    for (int32_t j = 0; e->bat.h_batt != NULL && j < e->bat.nc * e->bat.nr; j++)
        if (e->bat.h_batt[j] != NULL)
            starpu_data_unregister(e->bat.h_batt[j]);
    for (int32_t j = 0; e->bat.h_bqkv != NULL && j < e->bat.nr; j++)
        if (e->bat.h_bqkv[j] != NULL)
            starpu_data_unregister(e->bat.h_bqkv[j]);
    for (int32_t j = 0; e->bat.h_bo != NULL && j < e->bat.nr; j++)
        if (e->bat.h_bo[j] != NULL)
            starpu_data_unregister(e->bat.h_bo[j]);
    if (e->bat.h_bx != NULL) {
        starpu_data_unregister(e->bat.h_bx);
        starpu_data_unregister(e->bat.h_bffn_in);
        starpu_data_unregister(e->bat.h_bxb3);
        for (int32_t j = 0; j <= e->lay.n_slices; j++)
            starpu_data_unregister(e->bat.h_bpart[j]);
    }
    if (e->down.h_dout_all != NULL) {
        starpu_data_partition_clean(e->down.h_dout_all, (unsigned)e->down.nd, e->down.h_dout);
        starpu_data_unregister(e->down.h_dout_all);
    }
    for (int32_t k = 0; k < e->down.nd; k++) {
        if (e->down.h_bdout[k] != NULL)
            starpu_data_unregister(e->down.h_bdout[k]);
    }
}
