/* engine.c - decode steps as StarPU tasks over FFN neuron slices. */
#include "graph/engine.h"

#include "internal.h"
#include "model/act.h"
#include "model/quants.h"
#include "model/types.h"
#include "starinfer.h"

#include <math.h>
#include <starpu.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* Scratch and counters of one worker. */
struct scratch {
    float *h;  /* (n_ff) the slice's neuron activations */
    void *xq;  /* the FFN input converted for the up and gate dots */
    void *hq;  /* the activations converted for the down dots */
    double busy[SI_TASK_KIND_COUNT]; /* seconds inside task functions, by kind */
    int64_t count[SI_TASK_KIND_COUNT];
};

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

const char *si_task_kind_name(enum si_task_kind k)
{
    static const char *const names[SI_TASK_KIND_COUNT] = {"embed", "attn", "ffn_cold", "merge",
                                                          "norm+lm_head"};
    return (unsigned)k < SI_TASK_KIND_COUNT ? names[k] : "?";
}

struct si_engine {
    const struct si_model *m;
    struct si_engine_params p;
    struct si_ref *ref; /* attention, KV cache, embedding and head run on it */

    int32_t n_slices;
    int64_t chunk;     /* neurons per chunk of the down projection (si_ref_ffn_chunk) */
    int64_t n_chunks;
    int64_t *slice_c0; /* (n_slices + 1) chunk boundaries of the slices */
    float *partials;   /* (n_chunks, n_embd): each chunk's share of the FFN output */
    uint32_t *lengths; /* (n_slices) elements of partials per slice (the partition) */
    int64_t *active;   /* (n_layer, n_slices) neurons computed by each slice task */
    struct scratch *scratch; /* one per worker */
    unsigned n_workers;

    /* Task names as traces show them: "attn L3", "ffn_cold L3.1", "merge L3". */
    char (*name_attn)[24], (*name_merge)[24], (*name_ffn)[32];

    starpu_data_handle_t h_x, h_xb, h_partials, h_logits;
    starpu_data_handle_t *h_part; /* children of h_partials */

    struct si_engine_stats stats;
};

/* One task's arguments (freed by StarPU with the task). */
struct task_arg {
    struct si_engine *e;
    int l, j;
    int32_t token;
};

struct si_engine_params si_engine_default_params(void)
{
    return (struct si_engine_params){.ref = si_ref_default_params(),
                                     .mode = SI_SPARSITY_DENSE,
                                     .gate_threshold = 0.0f,
                                     .n_slices = 0};
}

/* ------------------------------------------------------------ FFN slices */

/* Bytes of n activations converted to the dot type of rows of type t. */
static size_t act_bytes(uint32_t t, int64_t n)
{
    size_t b = 0;
    si_type_row_size(si_act_type(t), n, &b);
    return b;
}

/*
 * Neurons [n0, n1) of layer l (whole chunks) on the FFN input xb: their
 * activations (zero for neurons gate mode skips) and each chunk's share of
 * the down projection into y, one row of n_embd per chunk.  Returns how many
 * neurons were computed.
 */
static int64_t ffn_slice(const struct si_engine *e, int l, const float *xb, int64_t n0, int64_t n1,
                         struct scratch *sc, float *y)
{
    const struct si_model *m = e->m;
    const struct si_hparams *hp = &m->hp;
    const struct si_layer *L = &m->w.layers[l];
    const bool q = e->p.ref.act_quant;
    const bool gate_mode = e->p.mode == SI_SPARSITY_GATE;
    const int64_t d = hp->n_embd, n = n1 - n0;

    /* The input, converted once for the up rows and once for the gate rows. */
    void *xu = sc->xq, *xg = NULL;
    if (q)
        si_quantize_act(si_act_type(L->ffn_up.type), xb, xu, d);
    if (hp->ffn_kind != SI_FFN_PLAIN) {
        xg = xu;
        if (q && si_act_type(L->ffn_gate.type) != si_act_type(L->ffn_up.type)) {
            xg = (char *)sc->xq + act_bytes(L->ffn_up.type, d);
            si_quantize_act(si_act_type(L->ffn_gate.type), xb, xg, d);
        }
    }
#define DOT(t, i, xa)                                                                              \
    (q ? si_vec_dot_act((t)->type, (const char *)(t)->data + (size_t)(i) * (t)->row_bytes, (xa),   \
                        (t)->ne[0])                                                                \
       : si_vec_dot((t)->type, (const char *)(t)->data + (size_t)(i) * (t)->row_bytes, xb,        \
                    (t)->ne[0]))

    const float *up_b = L->ffn_up_b.data;
    int64_t computed = 0;
    for (int64_t i = n0; i < n1; i++) {
        float h;
        if (hp->ffn_kind == SI_FFN_PLAIN) {
            /* The up row is the gate: computing it is unavoidable. */
            float u = DOT(&L->ffn_up, i, xu) + (up_b != NULL ? up_b[i] : 0.0f);
            h = si_act_apply(hp->act, u);
            computed += h != 0.0f;
        } else {
            float a = si_act_apply(hp->act, DOT(&L->ffn_gate, i, xg));
            bool skip = gate_mode && (hp->act == SI_ACT_RELU ? a == 0.0f
                                                             : fabsf(a) <= e->p.gate_threshold);
            if (skip) {
                h = 0.0f;
            } else {
                float u = DOT(&L->ffn_up, i, xu);
                if (hp->ffn_kind == SI_FFN_GATED_RELU2)
                    u = si_act_apply(SI_ACT_RELU, u);
                h = a * u;
                computed += h != 0.0f;
            }
        }
        sc->h[i - n0] = h;
    }
#undef DOT

    /* The slice's columns of the down projection, chunk by chunk as the
     * reference computes them, each chunk's share into its own row of y. */
    const struct si_tensor *w = &L->ffn_down;
    const int64_t chunk = e->chunk;
    size_t xa_chunk = 0;
    si_type_row_size(si_act_type(w->type), chunk, &xa_chunk);
    if (q)
        si_quantize_act(si_act_type(w->type), sc->h, sc->hq, n);
    for (int64_t c = 0; c < n / chunk; c++) {
        const void *h_c = q ? (const void *)((const char *)sc->hq + (size_t)c * xa_chunk)
                            : (const void *)(sc->h + c * chunk);
        si_ref_down_chunk(w, chunk, n0 / chunk + c, q, h_c, y + c * d);
    }
    return computed;
}

/* ------------------------------------------------------------ codelets */

static struct scratch *my_scratch(struct si_engine *e)
{
    int w = starpu_worker_get_id_check();
    return &e->scratch[w];
}

/* Charge the time since t0 to this worker's counter of kind k. */
static void account(struct si_engine *e, enum si_task_kind k, double t0)
{
    struct scratch *sc = my_scratch(e);
    sc->busy[k] += now() - t0;
    sc->count[k]++;
}

static void embed_cpu(void *buffers[], void *cl_arg)
{
    (void)buffers;
    struct task_arg *a = cl_arg;
    double t0 = now();
    si_ref_begin(a->e->ref, a->token); /* checked before submission */
    account(a->e, SI_TASK_EMBED, t0);
}

static void attn_cpu(void *buffers[], void *cl_arg)
{
    (void)buffers; /* x and xb: the reference state's own arrays (main memory) */
    struct task_arg *a = cl_arg;
    double t0 = now();
    si_ref_attn(a->e->ref, a->l);
    account(a->e, SI_TASK_ATTN, t0);
}

static void ffn_cpu(void *buffers[], void *cl_arg)
{
    struct task_arg *a = cl_arg;
    struct si_engine *e = a->e;
    const float *xb = (const float *)STARPU_VECTOR_GET_PTR(buffers[0]);
    float *y = (float *)STARPU_VECTOR_GET_PTR(buffers[1]);
    double t0 = now();
    e->active[(size_t)a->l * e->n_slices + a->j] =
        ffn_slice(e, a->l, xb, e->slice_c0[a->j] * e->chunk, e->slice_c0[a->j + 1] * e->chunk,
                  my_scratch(e), y);
    account(e, SI_TASK_FFN, t0);
}

static void merge_cpu(void *buffers[], void *cl_arg)
{
    struct task_arg *a = cl_arg;
    struct si_engine *e = a->e;
    struct si_ref *s = e->ref;
    const struct si_layer *L = &e->m->w.layers[a->l];
    const int64_t d = e->m->hp.n_embd;
    double t0 = now();
    /* xb2 = the chunks' shares in chunk order (the reference's order). */
    bool first = true;
    for (int32_t j = 0; j < e->n_slices; j++) {
        const float *p = (const float *)STARPU_VECTOR_GET_PTR(buffers[1 + j]);
        const int64_t nc = e->slice_c0[j + 1] - e->slice_c0[j];
        for (int64_t c = 0; c < nc; c++, p += d, first = false)
            for (int64_t i = 0; i < d; i++)
                s->xb2[i] = first ? p[i] : s->xb2[i] + p[i];
    }
    if (L->ffn_down_b.data != NULL) {
        const float *b = L->ffn_down_b.data;
        for (int64_t i = 0; i < d; i++)
            s->xb2[i] += b[i];
    }
    si_ref_ffn_finish(s, a->l);
    account(e, SI_TASK_MERGE, t0);
}

static void head_cpu(void *buffers[], void *cl_arg)
{
    (void)buffers;
    struct task_arg *a = cl_arg;
    double t0 = now();
    si_ref_end(a->e->ref);
    account(a->e, SI_TASK_HEAD, t0);
}

static struct starpu_perfmodel embed_model = {.type = STARPU_HISTORY_BASED, .symbol = "si_embed_f32"};
static struct starpu_perfmodel attn_model = {.type = STARPU_HISTORY_BASED, .symbol = "si_attn_f32"};
static struct starpu_perfmodel ffn_model = {.type = STARPU_HISTORY_BASED, .symbol = "si_ffn_slice"};
static struct starpu_perfmodel merge_model = {.type = STARPU_HISTORY_BASED, .symbol = "si_merge_f32"};
static struct starpu_perfmodel head_model = {.type = STARPU_HISTORY_BASED, .symbol = "si_head_f32"};

static struct starpu_codelet cl_embed = {
    .cpu_funcs = {embed_cpu},
    .nbuffers = 1,
    .modes = {STARPU_W},
    .model = &embed_model,
    .name = "embed",
};
static struct starpu_codelet cl_attn = {
    .cpu_funcs = {attn_cpu},
    .nbuffers = 2,
    .modes = {STARPU_RW, STARPU_W},
    .model = &attn_model,
    .name = "attn",
};
static struct starpu_codelet cl_ffn = {
    .cpu_funcs = {ffn_cpu},
    .nbuffers = 2,
    .modes = {STARPU_R, STARPU_W},
    .model = &ffn_model,
    .name = "ffn_cold",
};
static struct starpu_codelet cl_merge = {
    .cpu_funcs = {merge_cpu},
    .nbuffers = STARPU_VARIABLE_NBUFFERS,
    .model = &merge_model,
    .name = "merge",
};
static struct starpu_codelet cl_head = {
    .cpu_funcs = {head_cpu},
    .nbuffers = 3,
    .modes = {STARPU_R, STARPU_RW, STARPU_W},
    .model = &head_model,
    .name = "norm+lm_head",
};

/* Create and submit a task on codelet cl with handles h[0..n); -errno or 0. */
static int submit(struct si_engine *e, struct starpu_codelet *cl, const char *name, int l, int j,
                  int32_t token, starpu_data_handle_t *h, enum starpu_data_access_mode *modes,
                  int n)
{
    struct task_arg *a = malloc(sizeof *a);
    if (a == NULL)
        return -ENOMEM;
    *a = (struct task_arg){.e = e, .l = l, .j = j, .token = token};
    struct starpu_task *t = starpu_task_create();
    t->cl = cl;
    t->cl_arg = a;
    t->cl_arg_size = sizeof *a;
    t->cl_arg_free = 1;
    t->name = name;
    t->nbuffers = n;
    if (n > STARPU_NMAXBUFS) {
        t->dyn_handles = malloc((size_t)n * sizeof *t->dyn_handles);
        t->dyn_modes = malloc((size_t)n * sizeof *t->dyn_modes);
        if (t->dyn_handles == NULL || t->dyn_modes == NULL) {
            free(t->dyn_handles);
            free(t->dyn_modes);
            t->dyn_handles = NULL;
            t->dyn_modes = NULL;
            starpu_task_destroy(t);
            return -ENOMEM;
        }
        memcpy(t->dyn_handles, h, (size_t)n * sizeof *h);
        memcpy(t->dyn_modes, modes, (size_t)n * sizeof *modes);
    } else {
        for (int i = 0; i < n; i++) {
            t->handles[i] = h[i];
            t->modes[i] = modes[i];
        }
    }
    int rc = starpu_task_submit(t);
    if (rc != 0) {
        t->destroy = 0;
        starpu_task_destroy(t);
        return rc;
    }
    e->stats.tasks++;
    return 0;
}

/* ------------------------------------------------------------ engine */

int si_engine_init(struct si_engine **out, const struct si_model *m, struct si_engine_params p,
                   char *err, size_t err_size)
{
    *out = NULL;
    if (!starpu_is_initialized())
        return si__errf(err, err_size, SI_E_RUNTIME, "StarPU is not started");
    const struct si_hparams *hp = &m->hp;
    const unsigned ncpu = starpu_worker_get_count_by_type(STARPU_CPU_WORKER);
    if (ncpu == 0)
        return si__errf(err, err_size, SI_E_NO_DEVICE,
                        "the engine needs a CPU worker (STARPU_NCPU is 0)");

    /* Slices are whole chunks of the down projection (whole quantization
     * blocks), whose shares the merge adds in the reference's order. */
    const int64_t chunk = si_ref_ffn_chunk(m), n_chunks = hp->n_ff / chunk;
    int32_t ns = p.n_slices > 0 ? p.n_slices : (int32_t)ncpu; /* see docs/measurements.md */
    if (ns > n_chunks)
        ns = (int32_t)n_chunks;
    if (ns > 256)
        ns = 256;

    struct si_engine *e = calloc(1, sizeof *e);
    if (e == NULL)
        return si__errf(err, err_size, SI_E_NOMEM, "out of memory");
    e->m = m;
    e->p = p;
    e->n_slices = ns;
    e->chunk = chunk;
    e->n_chunks = n_chunks;
    int rc = si_ref_init(&e->ref, m, p.ref, err, err_size);
    if (rc != SI_OK) {
        free(e);
        return rc;
    }
    const size_t d = (size_t)hp->n_embd;
    e->slice_c0 = calloc((size_t)ns + 1, sizeof *e->slice_c0);
    e->partials = calloc((size_t)n_chunks * d, sizeof(float));
    uint32_t *lengths = e->lengths = calloc((size_t)ns, sizeof *lengths);
    e->active = calloc((size_t)hp->n_layer * (size_t)ns, sizeof *e->active);
    e->h_part = calloc((size_t)ns, sizeof *e->h_part);
    e->n_workers = starpu_worker_get_count();
    e->scratch = calloc(e->n_workers, sizeof *e->scratch);
    e->name_attn = calloc((size_t)hp->n_layer, sizeof *e->name_attn);
    e->name_merge = calloc((size_t)hp->n_layer, sizeof *e->name_merge);
    e->name_ffn = calloc((size_t)hp->n_layer * (size_t)ns, sizeof *e->name_ffn);
    if (!e->slice_c0 || !e->partials || !e->active || !e->h_part || !e->scratch || !lengths ||
        !e->name_attn || !e->name_merge || !e->name_ffn)
        goto oom;
    for (int l = 0; l < hp->n_layer; l++) {
        snprintf(e->name_attn[l], sizeof e->name_attn[l], "attn L%d", l);
        snprintf(e->name_merge[l], sizeof e->name_merge[l], "merge L%d", l);
        for (int32_t j = 0; j < ns; j++)
            snprintf(e->name_ffn[(size_t)l * ns + j], sizeof e->name_ffn[0], "ffn_cold L%d.%d", l, j);
    }
    for (int32_t j = 0; j <= ns; j++)
        e->slice_c0[j] = (int64_t)j * n_chunks / ns;
    for (int32_t j = 0; j < ns; j++)
        lengths[j] = (uint32_t)((e->slice_c0[j + 1] - e->slice_c0[j]) * (int64_t)d);
    const size_t widest = (size_t)(hp->n_ff > hp->n_embd ? hp->n_ff : hp->n_embd);
    for (unsigned w = 0; w < e->n_workers; w++) {
        e->scratch[w].h = malloc((size_t)hp->n_ff * sizeof(float));
        e->scratch[w].xq = malloc(8 * widest + 1024); /* two conversions of the input */
        e->scratch[w].hq = malloc(4 * widest + 512);
        if (!e->scratch[w].h || !e->scratch[w].xq || !e->scratch[w].hq)
            goto oom;
    }

    struct si_ref *s = e->ref;
    starpu_vector_data_register(&e->h_x, STARPU_MAIN_RAM, (uintptr_t)s->x, d, sizeof(float));
    starpu_vector_data_register(&e->h_xb, STARPU_MAIN_RAM, (uintptr_t)s->xb, d, sizeof(float));
    starpu_vector_data_register(&e->h_logits, STARPU_MAIN_RAM, (uintptr_t)s->logits,
                                (uint32_t)hp->n_vocab, sizeof(float));
    starpu_vector_data_register(&e->h_partials, STARPU_MAIN_RAM, (uintptr_t)e->partials,
                                (uint32_t)((size_t)n_chunks * d), sizeof(float));
    starpu_data_set_name(e->h_x, "x");
    starpu_data_set_name(e->h_xb, "ffn_in");
    starpu_data_set_name(e->h_logits, "logits");
    /* Each slice's chunks are one child of the partial outputs. */
    struct starpu_data_filter f = {.filter_func = starpu_vector_filter_list,
                                   .nchildren = (unsigned)ns,
                                   .filter_arg_ptr = lengths};
    starpu_data_partition_plan(e->h_partials, &f, e->h_part);
    starpu_data_partition_submit(e->h_partials, (unsigned)ns, e->h_part);
    *out = e;
    return SI_OK;
oom:
    si_engine_free(e);
    return si__errf(err, err_size, SI_E_NOMEM, "out of memory for the engine");
}

void si_engine_free(struct si_engine *e)
{
    if (e == NULL)
        return;
    if (e->h_x != NULL) {
        starpu_task_wait_for_all();
        starpu_data_unpartition_submit(e->h_partials, (unsigned)e->n_slices, e->h_part,
                                       STARPU_MAIN_RAM);
        starpu_data_partition_clean(e->h_partials, (unsigned)e->n_slices, e->h_part);
        starpu_data_unregister(e->h_partials);
        starpu_data_unregister(e->h_x);
        starpu_data_unregister(e->h_xb);
        starpu_data_unregister(e->h_logits);
    }
    if (e->scratch != NULL)
        for (unsigned w = 0; w < e->n_workers; w++) {
            free(e->scratch[w].h);
            free(e->scratch[w].xq);
            free(e->scratch[w].hq);
        }
    free(e->scratch);
    free(e->h_part);
    free(e->active);
    free(e->partials);
    free(e->slice_c0);
    free(e->lengths);
    free(e->name_attn);
    free(e->name_merge);
    free(e->name_ffn);
    si_ref_free(e->ref);
    free(e);
}

int si_engine_eval(struct si_engine *e, int32_t token)
{
    const struct si_hparams *hp = &e->m->hp;
    if (token < 0 || token >= hp->n_vocab)
        return SI_E_INVALID;
    if (e->ref->n_past >= e->ref->p.n_ctx)
        return SI_E_BUDGET;
    const double t0 = now();

    const int32_t ns = e->n_slices;
    starpu_data_handle_t h[1 + 256];
    enum starpu_data_access_mode md[1 + 256];
    int rc = 0;

    h[0] = e->h_x;
    md[0] = STARPU_W;
    rc = submit(e, &cl_embed, "embed", -1, -1, token, h, md, 1);
    for (int l = 0; l < hp->n_layer && rc == 0; l++) {
        h[0] = e->h_x;
        h[1] = e->h_xb;
        md[0] = STARPU_RW;
        md[1] = STARPU_W;
        rc = submit(e, &cl_attn, e->name_attn[l], l, -1, token, h, md, 2);
        for (int32_t j = 0; j < ns && rc == 0; j++) {
            h[0] = e->h_xb;
            h[1] = e->h_part[j];
            md[0] = STARPU_R;
            md[1] = STARPU_W;
            rc = submit(e, &cl_ffn, e->name_ffn[(size_t)l * ns + j], l, j, token, h, md, 2);
        }
        if (rc != 0)
            break;
        h[0] = e->h_x;
        md[0] = STARPU_RW;
        for (int32_t j = 0; j < ns; j++) {
            h[1 + j] = e->h_part[j];
            md[1 + j] = STARPU_R;
        }
        rc = submit(e, &cl_merge, e->name_merge[l], l, -1, token, h, md, 1 + ns);
    }
    if (rc == 0) {
        h[0] = e->h_x;
        h[1] = e->h_xb;
        h[2] = e->h_logits;
        md[0] = STARPU_R;
        md[1] = STARPU_RW;
        md[2] = STARPU_W;
        rc = submit(e, &cl_head, "norm+lm_head", -1, -1, token, h, md, 3);
    }
    /* Wait for this token's tasks: the logits are ready when readable. */
    starpu_data_acquire(e->h_logits, STARPU_R);
    starpu_data_release(e->h_logits);
    if (rc != 0) {
        starpu_task_wait_for_all();
        return SI_E_RUNTIME;
    }

    e->stats.tokens++;
    e->stats.seconds += now() - t0;
    for (size_t i = 0; i < (size_t)hp->n_layer * (size_t)ns; i++)
        e->stats.neurons_active += e->active[i];
    e->stats.neurons_total += (int64_t)hp->n_layer * hp->n_ff;
    return SI_OK;
}

const float *si_engine_logits(const struct si_engine *e)
{
    return e->ref->logits;
}

void si_engine_reset(struct si_engine *e)
{
    si_ref_reset(e->ref);
}

struct si_ref *si_engine_ref(struct si_engine *e)
{
    return e->ref;
}

struct si_engine_stats si_engine_get_stats(const struct si_engine *e)
{
    struct si_engine_stats st = e->stats;
    for (unsigned w = 0; w < e->n_workers; w++)
        for (int k = 0; k < SI_TASK_KIND_COUNT; k++) {
            st.task_seconds[k] += e->scratch[w].busy[k];
            st.task_count[k] += e->scratch[w].count[k];
        }
    return st;
}

int32_t si_engine_n_slices(const struct si_engine *e)
{
    return e->n_slices;
}
