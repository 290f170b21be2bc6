/* pwri.c - PowerInfer's layout written from a starinfer model (pwri.h). */
#include "model/pwri.h"

#include "internal.h"
#include "model/gguf_write.h"
#include "model/quants.h"
#include "model/transpose.h"
#include "model/types.h"
#include "starinfer.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Whether the n bytes at s end with tail. */
static bool ends_with(const char *s, size_t n, const char *tail)
{
    const size_t k = strlen(tail);
    return n >= k && !memcmp(s + n - k, tail, k);
}

bool si_pwri_name(const char *name, size_t n, char *out, size_t out_size)
{
    /* starinfer's own: the planted probabilities, the transposed copies of
     * input sparsity (attn_q_t ... ffn_up_t, and their column-block forms'
     * scales), ffn_down's column-block copy, and ffn_down itself */
    static const char *const dropped[] = {".ffn_planted_prob", ".ffn_down.weight",
                                          "_t.scale", ".ffn_down_c.weight",
                                          ".ffn_down_c.scale"};
    for (size_t i = 0; i < sizeof dropped / sizeof dropped[0]; i++)
        if (ends_with(name, n, dropped[i]))
            return false;
    if (ends_with(name, n, "_t.weight") && !ends_with(name, n, ".ffn_down_t.weight"))
        return false;
    /* OPT's (and any) down bias is named after ffn_down_t there */
    const bool bias = ends_with(name, n, ".ffn_down.bias");
    const size_t base = bias ? n - strlen(".ffn_down.bias") : n;
    const int w = snprintf(out, out_size, "%.*s%s", (int)base, name, bias ? ".ffn_down_t.bias" : "");
    return w > 0 && (size_t)w < out_size;
}

uint32_t si_pwri_down_t_type(uint32_t t)
{
    return t == SI_TYPE_Q4_0 ? SI_TYPE_Q4_0 : SI_TYPE_F16;
}

int si_pwri_down_init(struct si_pwri_down *d, const struct si_model *m, int l)
{
    const struct si_layer *L = &m->w.layers[l];
    memset(d, 0, sizeof *d);
    if (L->ffn_down_t.data != NULL) {
        d->dt = &L->ffn_down_t;
        d->type = si_pwri_down_t_type(d->dt->type);
    } else {
        d->dn = &L->ffn_down;
        d->type = si_pwri_down_t_type(d->dn->type);
    }
    size_t rb;
    return si_type_row_size(d->type, m->hp.n_embd, &rb) ? SI_OK : SI_E_INVALID;
}

int si_pwri_down_fill(void *user, int64_t row0, int64_t n_rows, void *dst)
{
    struct si_pwri_down *d = user;
    const int64_t ne0 = d->dt != NULL ? d->dt->ne[0] : d->dn->ne[1]; /* n_embd */
    const int64_t n_ff = d->dt != NULL ? d->dt->ne[1] : d->dn->ne[0];
    size_t rb = 0;
    si_type_row_size(d->type, ne0, &rb);
    if (d->dt != NULL && d->dt->type == d->type) { /* as they are */
        memcpy(dst, (const char *)d->dt->data + (size_t)row0 * d->dt->row_bytes,
               (size_t)n_rows * rb);
        return SI_OK;
    }
    if (d->dt == NULL && d->t == NULL) { /* ffn_down's columns, once */
        struct si_transpose f;
        if (si_transpose_init(&f, d->dn, SI_TYPE_F32) != SI_OK)
            return SI_E_INVALID;
        d->t = malloc((size_t)n_ff * (size_t)ne0 * sizeof *d->t);
        if (d->t == NULL)
            return SI_E_NOMEM;
        const int rc = si_transpose_fill(&f, 0, n_ff, d->t);
        si_transpose_release(&f);
        if (rc != SI_OK)
            return rc;
    }
    if (d->dt != NULL && d->row == NULL && (d->row = malloc((size_t)ne0 * sizeof *d->row)) == NULL)
        return SI_E_NOMEM;
    for (int64_t r = row0; r < row0 + n_rows; r++) {
        const float *src = d->t != NULL ? d->t + (size_t)r * (size_t)ne0 : d->row;
        if (d->dt != NULL)
            si_dequantize_row(d->dt->type, (const char *)d->dt->data + (size_t)r * d->dt->row_bytes,
                              d->row, ne0);
        si_quantize_row(d->type, src, (char *)dst + (size_t)(r - row0) * rb, ne0);
    }
    if (row0 + n_rows >= n_ff) /* done: one layer at a time in memory */
        si_pwri_down_release(d);
    return SI_OK;
}

void si_pwri_down_release(struct si_pwri_down *d)
{
    free(d->t);
    free(d->row);
    d->t = NULL;
    d->row = NULL;
}

int si_pwri_write(const struct si_model *m, const char *path, char *err, size_t err_size)
{
    const struct si_hparams *hp = &m->hp;
    const struct si_gguf *g = m->gguf;
    if (hp->arch != SI_ARCH_LLAMA && hp->arch != SI_ARCH_BAMBOO && hp->arch != SI_ARCH_FALCON &&
        hp->arch != SI_ARCH_OPT)
        return si__errf(err, err_size, SI_E_UNSUPPORTED,
                        "%s: PowerInfer runs llama, bamboo, falcon and opt, not %s", path,
                        si_arch_name(hp->arch));
    if (!m->has_predictor)
        return si__errf(err, err_size, SI_E_INVALID,
                        "%s: PowerInfer's layout needs predictors (blk.N.fc1/fc2: starinfer "
                        "train-predictor --input residual)",
                        path);
    if (m->pred_input != SI_PRED_RESIDUAL)
        return si__errf(err, err_size, SI_E_INVALID,
                        "%s: the predictors read the %s (%s '%s'), and PowerInfer gives them the "
                        "residual the FFN's norm reads: train them with --input residual",
                        path,
                        m->pred_input == SI_PRED_LAYER ? "attention's input" : "FFN's input",
                        SI_PREDICTOR_INPUT_KEY, si_pred_input_name(m->pred_input));
    struct si_gguf_writer *w = si_gguf_writer_init(true);
    struct si_pwri_down *down = calloc((size_t)hp->n_layer, sizeof *down);
    int rc = w != NULL && down != NULL ? SI_OK : SI_E_NOMEM;
    if (rc == SI_OK)
        rc = si_gguf_writer_copy_kv(w, g);
    /* PowerInfer's llama and falcon are ReLU's; our reader takes a PWRI file
     * for those unless told */
    const bool relu_default = hp->arch == SI_ARCH_LLAMA || hp->arch == SI_ARCH_FALCON;
    if (rc == SI_OK && relu_default && hp->act != SI_ACT_RELU)
        rc = si_gguf_writer_set_str(w, "starinfer.ffn_activation",
                                    hp->act == SI_ACT_GELU ? "gelu" : "silu");
    for (uint64_t i = 0; rc == SI_OK && i < g->n_tensors; i++) {
        const struct si_gguf_tensor *t = &g->tensors[i];
        char name[256];
        if (ends_with(t->name.data, t->name.len, ".ffn_down_t.weight") ||
            !si_pwri_name(t->name.data, t->name.len, name, sizeof name))
            continue; /* ffn_down_t below, each in a type PowerInfer reads */
        rc = si_gguf_writer_add_tensor(w, name, t->type, t->n_dims, t->ne, t->data);
    }
    for (int32_t l = 0; rc == SI_OK && l < hp->n_layer; l++) {
        if ((rc = si_pwri_down_init(&down[l], m, l)) != SI_OK)
            break;
        char name[64];
        snprintf(name, sizeof name, "blk.%" PRId32 ".ffn_down_t.weight", l);
        const int64_t ne[2] = {hp->n_embd, hp->n_ff};
        rc = si_gguf_writer_add_tensor_cb(w, name, down[l].type, 2, ne, si_pwri_down_fill,
                                          &down[l]);
    }
    if (rc == SI_OK)
        rc = si_gguf_writer_write(w, path, err, err_size);
    else
        si__errf(err, err_size, rc, "%s: %s", path, si_status_str(rc));
    for (int32_t l = 0; down != NULL && l < hp->n_layer; l++)
        si_pwri_down_release(&down[l]);
    free(down);
    si_gguf_writer_free(w);
    return rc;
}
