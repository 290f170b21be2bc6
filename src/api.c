/*
 * api.c - the public API of include/starinfer.h over the model layer, the
 * reference forward pass and the StarPU engine.
 *
 * Everything here is a thin layer: checking arguments, keeping the state a
 * caller should not have to (the tokens in the cache, the sampler, the
 * StarPU instance shared by contexts, statistics) and turning the internal
 * functions' err buffers into si_last_error().
 */
#include "starinfer.h"

#include "flash/io.h"
#include "flash/store.h"
#include "graph/engine.h"
#include "graph/runtime.h"
#include "internal.h"
#include "model/forward.h"
#include "model/gguf.h"
#include "model/line_alloc.h"
#include "model/model.h"
#include "model/pack8.h"
#include "model/sampler.h"
#include "model/tokenizer.h"
#include "model/types.h"
#include "placement/placement.h"
#include "predict/input_sparsity.h"
#include "predict/profile.h"
#include "shared.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

_Static_assert(SI_TASK_KIND_COUNT <= SI_MAX_TASK_KINDS, "struct si_stats has too few task kinds");

/* ------------------------------------------------------------------ errors */

static _Thread_local char last_err[640];

const char *si_last_error(void)
{
    return last_err;
}

/* Record the calling thread's failure and return its status. */
__attribute__((format(printf, 2, 3))) static int fail(int status, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(last_err, sizeof last_err, fmt, ap);
    va_end(ap);
    return status;
}

static double mib(int64_t bytes)
{
    return (double)bytes / (1024.0 * 1024.0);
}

/* ------------------------------------------------------------------ models */

struct si_llm {
    struct si_model *m;
    struct si_tokenizer *tok;
    void *buf;  /* the file's bytes when not mapped (the model's tensors point here) */
    char *name; /* general.name, NUL-terminated ("" when absent) */
    char *path; /* as given to si_llm_load (the flash store's default is next to it) */
    atomic_int n_contexts; /* live contexts made from it */
};

struct si_llm_params si_llm_default_params(void)
{
    return (struct si_llm_params){.use_mmap = true};
}

/* The whole file at `path` in allocated memory, aligned for the kernels'
 * vector loads; the messages are si_gguf_open's. */
static int read_file(const char *path, void **out, size_t *size, char *err, size_t err_size)
{
    *out = NULL;
    *size = 0;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return si__errf(err, err_size, errno == ENOENT ? SI_E_NOT_FOUND : SI_E_IO, "%s: %s",
                        path, strerror(errno));
    struct stat st;
    int rc = SI_OK;
    if (fstat(fd, &st) != 0) {
        rc = si__errf(err, err_size, SI_E_IO, "%s: %s", path, strerror(errno));
    } else if (!S_ISREG(st.st_mode)) {
        rc = si__errf(err, err_size, SI_E_IO, "%s: not a regular file", path);
    } else if (st.st_size > 0) {
        const size_t n = (size_t)st.st_size;
        char *buf = si_line_alloc(n);
        if (buf == NULL) {
            rc = si__errf(err, err_size, SI_E_NOMEM, "%s: out of memory reading %zu bytes", path,
                          n);
        } else {
            size_t got = 0;
            while (got < n) {
                ssize_t r = read(fd, buf + got, n - got);
                if (r < 0 && errno == EINTR)
                    continue;
                if (r <= 0) {
                    rc = si__errf(err, err_size, SI_E_IO, "%s: %s", path,
                                  r < 0 ? strerror(errno) : "file shrank while being read");
                    break;
                }
                got += (size_t)r;
            }
            if (rc == SI_OK) {
                *out = buf;
                *size = n;
            } else {
                free(buf);
            }
        }
    }
    close(fd);
    return rc;
}

static void llm_destroy(struct si_llm *llm);

int si_llm_load(const char *path, struct si_llm_params params, struct si_llm **out)
{
    if (out != NULL)
        *out = NULL;
    if (path == NULL || out == NULL)
        return fail(SI_E_INVALID, "si_llm_load: NULL %s", path == NULL ? "path" : "out");
    char err[600];
    struct si_llm *llm = calloc(1, sizeof *llm);
    if (llm == NULL)
        return fail(SI_E_NOMEM, "out of memory");
    int rc;
    if (params.use_mmap) {
        rc = si_model_load(&llm->m, path, err, sizeof err);
    } else {
        size_t size;
        struct si_gguf *g = NULL;
        rc = read_file(path, &llm->buf, &size, err, sizeof err);
        char msg[400];
        if (rc == SI_OK && (rc = si_gguf_parse(&g, llm->buf, size, msg, sizeof msg)) != SI_OK)
            snprintf(err, sizeof err, "%.150s: %s", path, msg);
        if (rc == SI_OK && (rc = si_model_from_gguf(&llm->m, g, msg, sizeof msg)) != SI_OK) {
            snprintf(err, sizeof err, "%.150s: %s", path, msg);
            si_gguf_free(g);
        }
    }
    if (rc == SI_OK && params.predictors != NULL)
        rc = si_model_attach_predictors(llm->m, params.predictors, err, sizeof err);
    if (rc == SI_OK) {
        char msg[400];
        if ((rc = si_tokenizer_load(&llm->tok, llm->m->gguf, msg, sizeof msg)) != SI_OK)
            snprintf(err, sizeof err, "%.150s: %s", path, msg);
    }
    if (rc == SI_OK) {
        struct si_gguf_str s = {0, ""};
        si_gguf_get_str(llm->m->gguf, "general.name", &s);
        llm->name = strndup(s.data, (size_t)s.len);
        llm->path = strdup(path);
        if (llm->name == NULL || llm->path == NULL) {
            rc = SI_E_NOMEM;
            snprintf(err, sizeof err, "out of memory");
        }
    }
    if (rc == SI_OK && !si__live_add(llm, SI__LIVE_LLM)) {
        rc = SI_E_NOMEM;
        snprintf(err, sizeof err, "out of memory");
    }
    if (rc != SI_OK) {
        llm_destroy(llm);
        return fail(rc, "%s", err);
    }
    *out = llm;
    return SI_OK;
}

void si_llm_free(struct si_llm *llm)
{
    if (llm == NULL)
        return;
    if (!si__live_has(llm, SI__LIVE_LLM)) {
        fail(SI_E_INVALID, "si_llm_free: not a live model (freed already, or not made by "
                           "si_llm_load): nothing freed");
        return;
    }
    const int users = atomic_load(&llm->n_contexts);
    if (users > 0) {
        fail(SI_E_INVALID, "si_llm_free: %d context%s made from the model %s still live: free "
                           "them first (the model is kept)",
             users, users == 1 ? "" : "s", users == 1 ? "is" : "are");
        return;
    }
    si__live_remove(llm, SI__LIVE_LLM);
    llm_destroy(llm);
}

static void llm_destroy(struct si_llm *llm)
{
    if (llm == NULL)
        return;
    si_tokenizer_free(llm->tok);
    si_model_free(llm->m);
    free(llm->buf); /* after the model: its tensors point into it */
    free(llm->name);
    free(llm->path);
    free(llm);
}

const char *si_llm_arch(const struct si_llm *llm)
{
    return si_arch_name(llm->m->hp.arch);
}

const char *si_llm_name(const struct si_llm *llm)
{
    return llm->name;
}

static const uint32_t kv_types[SI_KV_TYPE_COUNT] = {SI_TYPE_F16, SI_TYPE_Q8_0, SI_TYPE_Q4_0};
static const char *const kv_names[SI_KV_TYPE_COUNT] = {"f16", "q8_0", "q4_0"};

const char *si_kv_type_name(enum si_kv_type t)
{
    return (unsigned)t < SI_KV_TYPE_COUNT ? kv_names[t] : "?";
}

int si_kv_type_parse(const char *name, enum si_kv_type *t)
{
    for (int i = 0; name != NULL && i < SI_KV_TYPE_COUNT; i++)
        if (!strcmp(name, kv_names[i])) {
            *t = (enum si_kv_type)i;
            return SI_OK;
        }
    return SI_E_INVALID;
}

uint32_t si__kv_type_of(int kv_type)
{
    return kv_types[(unsigned)kv_type < SI_KV_TYPE_COUNT ? kv_type : SI_KV_F16];
}

/* The reference's cache parameters for p. */
static void kv_params(const struct si_context_params *p, struct si_ref_params *rp)
{
    rp->kv_f16 = !p->kv_f32;
    rp->type_k = kv_types[p->cache_type_k];
    rp->type_v = kv_types[p->cache_type_v];
}

int64_t si_llm_kv_bytes_per_token(const struct si_llm *llm, const struct si_context_params *p)
{
    if (llm == NULL || p == NULL || (unsigned)p->cache_type_k >= SI_KV_TYPE_COUNT ||
        (unsigned)p->cache_type_v >= SI_KV_TYPE_COUNT)
        return SI_E_INVALID;
    struct si_ref_params rp = si_ref_default_params();
    kv_params(p, &rp);
    const struct si_hparams *hp = &llm->m->hp;
    return (int64_t)hp->n_layer *
           (int64_t)(si_ref_kv_row_bytes(&rp, hp, false) + si_ref_kv_row_bytes(&rp, hp, true));
}

/*
 * The context a context gets without n_ctx: the model's trained length, at
 * most as many positions as keep its KV cache (with p's types) within
 * SI__DEFAULT_KV_BYTES, in steps of 256, but never below min(trained,
 * 4096): SmolLM2 gets its 8,192, a 7B of 4,096 its 4,096, a model trained
 * on 131,072 with 128 KiB a position 8,192.
 */
#define SI__DEFAULT_KV_BYTES ((int64_t)1 << 30)

static int32_t default_ctx(const struct si_llm *llm, const struct si_context_params *p)
{
    const int32_t train = llm->m->hp.n_ctx_train > 0 ? llm->m->hp.n_ctx_train : 4096;
    const int32_t floor = train < 4096 ? train : 4096;
    const int64_t per = si_llm_kv_bytes_per_token(llm, p);
    if (per <= 0 || (int64_t)train * per <= SI__DEFAULT_KV_BYTES)
        return train;
    const int32_t fit = (int32_t)(SI__DEFAULT_KV_BYTES / per / 256 * 256);
    return fit > floor ? fit : floor;
}

int32_t si_llm_n_ctx_train(const struct si_llm *llm)
{
    return llm->m->hp.n_ctx_train;
}

int32_t si_llm_n_vocab(const struct si_llm *llm)
{
    return llm->m->hp.n_vocab;
}

int32_t si_llm_n_embd(const struct si_llm *llm)
{
    return llm->m->hp.n_embd;
}

int32_t si_llm_n_layer(const struct si_llm *llm)
{
    return llm->m->hp.n_layer;
}

int32_t si_llm_n_head(const struct si_llm *llm)
{
    return llm->m->hp.n_head;
}

int32_t si_llm_n_ff(const struct si_llm *llm)
{
    return llm->m->hp.n_ff;
}

bool si_llm_has_predictor(const struct si_llm *llm)
{
    return llm->m->has_predictor;
}

int64_t si_llm_weight_bytes(const struct si_llm *llm)
{
    return (int64_t)llm->m->gguf->data_size;
}

int64_t si_llm_meta_str(const struct si_llm *llm, const char *key, char *buf, size_t cap)
{
    if (llm == NULL || key == NULL || (buf == NULL && cap > 0))
        return fail(SI_E_INVALID, "si_llm_meta_str: NULL argument");
    struct si_gguf_str s;
    int rc = si_gguf_get_str(llm->m->gguf, key, &s);
    if (rc != SI_OK)
        return fail(rc, "%s: %s", key,
                    rc == SI_E_NOT_FOUND ? "no such metadata key" : "not a string");
    if (cap > 0) {
        size_t n = s.len < cap - 1 ? (size_t)s.len : cap - 1;
        memcpy(buf, s.data, n);
        buf[n] = '\0';
    }
    return (int64_t)s.len;
}

/* ------------------------------------------------------------------ tokens */

int32_t si_llm_token_bos(const struct si_llm *llm)
{
    return si_tokenizer_bos(llm->tok);
}

int32_t si_llm_token_eos(const struct si_llm *llm)
{
    return si_tokenizer_eos(llm->tok);
}

bool si_llm_token_is_eog(const struct si_llm *llm, int32_t token)
{
    return si_tokenizer_is_eog(llm->tok, token);
}

bool si_llm_adds_bos(const struct si_llm *llm)
{
    return si_tokenizer_add_bos(llm->tok);
}

int64_t si_llm_tokenize(const struct si_llm *llm, const char *text, size_t len, bool add_bos,
                        bool parse_special, int32_t *ids, size_t cap)
{
    if (llm == NULL || (text == NULL && len > 0) || (ids == NULL && cap > 0))
        return fail(SI_E_INVALID, "si_llm_tokenize: NULL argument");
    int64_t n = si_tokenize(llm->tok, text != NULL ? text : "", len, add_bos, parse_special, ids,
                            cap);
    if (n < 0)
        return fail((int)n, "cannot tokenize the text: %s", si_status_str((int)n));
    return n;
}

int64_t si_llm_token_to_piece(const struct si_llm *llm, int32_t token, bool special, char *buf,
                              size_t cap)
{
    if (llm == NULL || (buf == NULL && cap > 0))
        return fail(SI_E_INVALID, "si_llm_token_to_piece: NULL argument");
    int64_t n = si_token_to_piece(llm->tok, token, special, buf, cap);
    if (n < 0)
        return fail((int)n, "token %d is outside the vocabulary (%d tokens)", token,
                    llm->m->hp.n_vocab);
    return n;
}

int64_t si_llm_detokenize(const struct si_llm *llm, const int32_t *ids, size_t n, bool special,
                          char *buf, size_t cap)
{
    if (llm == NULL || (ids == NULL && n > 0) || (buf == NULL && cap > 0))
        return fail(SI_E_INVALID, "si_llm_detokenize: NULL argument");
    int64_t total = 0;
    for (size_t i = 0; i < n; i++) {
        /* Each piece straight into what room is left (it reports its whole length). */
        size_t room = (int64_t)cap > total ? cap - (size_t)total : 0;
        int64_t len = si_token_to_piece(llm->tok, ids[i], special, room ? buf + total : NULL, room);
        if (len < 0)
            return fail((int)len, "token %d (at %zu) is outside the vocabulary (%d tokens)",
                        ids[i], i, llm->m->hp.n_vocab);
        total += len;
    }
    if (total < (int64_t)cap)
        buf[total] = '\0';
    else if (cap > 0)
        buf[cap - 1] = '\0';
    return total;
}

int64_t si_llm_chat_apply(const struct si_llm *llm, const struct si_chat_message *msgs, size_t n,
                          bool add_assistant, char *buf, size_t cap)
{
    if (llm == NULL || (msgs == NULL && n > 0) || (buf == NULL && cap > 0))
        return fail(SI_E_INVALID, "si_llm_chat_apply: NULL argument");
    struct si_chat_msg *m = malloc((n > 0 ? n : 1) * sizeof *m);
    if (m == NULL)
        return fail(SI_E_NOMEM, "out of memory");
    for (size_t i = 0; i < n; i++) {
        if (msgs[i].role == NULL || msgs[i].content == NULL) {
            free(m);
            return fail(SI_E_INVALID, "chat message %zu has no %s", i,
                        msgs[i].role == NULL ? "role" : "content");
        }
        m[i] = (struct si_chat_msg){msgs[i].role, msgs[i].content};
    }
    int64_t len = si_chat_format(llm->m->gguf, m, n, add_assistant, buf, cap);
    free(m);
    if (len == SI_E_UNSUPPORTED)
        return fail((int)len, "the model's chat template is not supported");
    if (len < 0)
        return fail((int)len, "cannot apply the chat template: %s", si_status_str((int)len));
    if (len < (int64_t)cap)
        buf[len] = '\0';
    return len;
}

/* ---------------------------------------------------------------- StarPU */

/*
 * One StarPU instance per process, shared by the StarPU contexts: the first
 * starts it (or adopts the host's), the last one stops it when it was ours
 * (si_runtime_stop() never stops an adopted instance).
 */
static pthread_mutex_t rt_lock = PTHREAD_MUTEX_INITIALIZER;
static struct si_runtime rt;
static int rt_users;

static int runtime_acquire(bool caller_worker, bool mpi, char *err, size_t err_size)
{
    pthread_mutex_lock(&rt_lock);
    int rc = SI_OK;
    if (rt_users == 0 && !si_runtime_set_mpi(mpi))
        rc = si__errf(err, err_size, SI_E_UNSUPPORTED, "%s", SI_RUNTIME_NO_MPI);
    else if (rt_users == 0)
        rc = si_runtime_start(&rt, caller_worker, err, err_size);
    else if (mpi != si_runtime_mpi())
        rc = si__errf(err, err_size, SI_E_INVALID, "StarPU already runs %s MPI for another context",
                      mpi ? "without" : "with");
    if (rc == SI_OK)
        rt_users++;
    pthread_mutex_unlock(&rt_lock);
    return rc;
}

static void runtime_release(void)
{
    pthread_mutex_lock(&rt_lock);
    if (rt_users > 0 && --rt_users == 0)
        si_runtime_stop(&rt);
    pthread_mutex_unlock(&rt_lock);
}

/* ---------------------------------------------------------------- contexts */

struct si_context {
    struct si_llm *llm;
    struct si_context_params p;
    struct si_ref *ref;     /* the reference state (the engine's own with the engine) */
    struct si_engine *eng;  /* NULL on the reference engine */
    struct si__group *grp;  /* contexts sharing eng (si_context_init_shared), or NULL */
    bool engaged;           /* in a generation, counted in grp's engaged */
    struct si_flash_store *fs; /* the flash tier's store, or NULL */
    bool holds_runtime;     /* counted in rt_users */
    atomic_bool busy;       /* a call that changes it is running (one thread at a time) */
    struct si_sampler *smp;
    int32_t n_ctx;
    int32_t *hist;          /* (n_ctx) the tokens in the cache, n_past of them */
    float *input_thr;       /* (n_layer, SI_INPUT_KINDS) input sparsity's thresholds, or NULL */
    bool have_logits;

    /* Statistics since the last reset. */
    int64_t prefill_tokens, decode_tokens;
    double prefill_seconds, decode_seconds;
    int64_t ref_tokens;           /* evaluated by the reference */
    int64_t ref_active;           /* FFN neurons active for them, summed over layers */
    struct si_engine_stats base;  /* the engine's totals at the last reset */
};

const char *si_engine_kind_name(enum si_engine_kind e)
{
    switch (e) {
    case SI_ENGINE_REF: return "ref";
    case SI_ENGINE_STARPU: return "starpu";
    default: return "?";
    }
}

const char *si_sparsity_mode_name(enum si_sparsity_mode m)
{
    switch (m) {
    case SI_SPARSE_DENSE: return "dense";
    case SI_SPARSE_GATE: return "gate";
    case SI_SPARSE_PREDICTOR: return "predictor";
    default: return "?";
    }
}

const char *si_prefill_mode_name(enum si_prefill_mode m)
{
    switch (m) {
    case SI_PREFILL_AUTO: return "auto";
    case SI_PREFILL_EXACT: return "exact";
    case SI_PREFILL_INT8: return "int8";
    case SI_PREFILL_BLAS: return "blas";
    default: return "?";
    }
}

struct si_sampling_params si_sampling_default_params(void)
{
    struct si_sampler_params d = si_sampler_default_params();
    return (struct si_sampling_params){.temp = d.temp,
                                       .top_k = d.top_k,
                                       .top_p = d.top_p,
                                       .min_p = d.min_p,
                                       .repeat_penalty = d.repeat_penalty,
                                       .repeat_last_n = d.repeat_last_n,
                                       .seed = d.seed};
}

struct si_context_params si_context_default_params(void)
{
    return (struct si_context_params){.n_ctx = 0,
                                      .engine = SI_ENGINE_STARPU,
                                      .sparsity = SI_SPARSE_DENSE,
                                      .sampling = si_sampling_default_params()};
}

static int check_sampling(const struct si_sampling_params *s)
{
    if (!(s->temp >= 0.0f) || !isfinite(s->temp))
        return fail(SI_E_INVALID, "sampling.temp: %g must be finite and >= 0", (double)s->temp);
    if (s->top_k < 0)
        return fail(SI_E_INVALID, "sampling.top_k: %d is negative", s->top_k);
    if (!(s->top_p >= 0.0f && s->top_p <= 1.0f))
        return fail(SI_E_INVALID, "sampling.top_p: %g is outside [0, 1]", (double)s->top_p);
    if (!(s->min_p >= 0.0f && s->min_p <= 1.0f))
        return fail(SI_E_INVALID, "sampling.min_p: %g is outside [0, 1]", (double)s->min_p);
    if (!(s->repeat_penalty > 0.0f) || !isfinite(s->repeat_penalty))
        return fail(SI_E_INVALID, "sampling.repeat_penalty: %g must be finite and > 0",
                    (double)s->repeat_penalty);
    if (s->repeat_last_n < 0)
        return fail(SI_E_INVALID, "sampling.repeat_last_n: %d is negative", s->repeat_last_n);
    return SI_OK;
}

static struct si_sampler *make_sampler(const struct si_sampling_params *s, int32_t n_vocab)
{
    struct si_sampler_params sp = {.temp = s->temp,
                                   .top_k = s->top_k,
                                   .top_p = s->top_p,
                                   .min_p = s->min_p,
                                   .repeat_penalty = s->repeat_penalty,
                                   .repeat_last_n = s->repeat_last_n,
                                   .seed = s->seed};
    return si_sampler_init(sp, n_vocab);
}

/* The sampler's history becomes the cache's last repeat_last_n tokens. */
static void resync_sampler(struct si_context *ctx)
{
    si_sampler_reset(ctx->smp);
    int32_t n = ctx->ref->n_past, w = ctx->p.sampling.repeat_last_n;
    for (int32_t i = n > w ? n - w : 0; i < n; i++)
        si_sampler_accept(ctx->smp, ctx->hist[i]);
}

static int check_params(const struct si_context_params *p)
{
    if ((unsigned)p->engine >= SI_ENGINE_COUNT)
        return fail(SI_E_INVALID, "engine: %d is not a known engine", (int)p->engine);
    if ((unsigned)p->sparsity >= SI_SPARSE_COUNT)
        return fail(SI_E_INVALID, "sparsity: %d is not a known mode", (int)p->sparsity);
    if ((unsigned)p->prefill >= SI_PREFILL_COUNT)
        return fail(SI_E_INVALID, "prefill: %d is not a known mode", (int)p->prefill);
    if ((unsigned)p->shared_arith >= SI_PREFILL_COUNT || p->shared_arith == SI_PREFILL_BLAS)
        return fail(SI_E_INVALID, "shared_arith: %s (exact, int8 or auto: steps through sgemm "
                                  "would sum a token differently beside other tokens)",
                    p->shared_arith == SI_PREFILL_BLAS ? "blas is refused" : "not a known mode");
    if (p->shared_arith == SI_PREFILL_INT8 && si_gemm8_missing() != NULL)
        return fail(SI_E_UNSUPPORTED, "shared_arith int8: %s", si_gemm8_missing());
    if (p->n_ctx < 0)
        return fail(SI_E_INVALID, "n_ctx: %d is negative", p->n_ctx);
    if ((unsigned)p->cache_type_k >= SI_KV_TYPE_COUNT ||
        (unsigned)p->cache_type_v >= SI_KV_TYPE_COUNT)
        return fail(SI_E_INVALID, "cache_type_k/v: %d/%d is not a known KV cache type",
                    (int)p->cache_type_k, (int)p->cache_type_v);
    if (p->kv_f32 && (p->cache_type_k != SI_KV_F16 || p->cache_type_v != SI_KV_F16))
        return fail(SI_E_INVALID, "kv_f32 with a %s/%s cache: an f32 cache has no other type",
                    si_kv_type_name(p->cache_type_k), si_kv_type_name(p->cache_type_v));
    if (!(p->gate_threshold >= 0.0f) || !isfinite(p->gate_threshold))
        return fail(SI_E_INVALID, "gate_threshold: %g must be finite and >= 0",
                    (double)p->gate_threshold);
    if (p->vram_budget < 0)
        return fail(SI_E_INVALID, "vram_budget: %lld is negative", (long long)p->vram_budget);
    if (p->dram_budget < 0)
        return fail(SI_E_INVALID, "dram_budget: %lld is negative", (long long)p->dram_budget);
    if (p->n_batch < 0 || p->n_batch > 4096)
        return fail(SI_E_INVALID, "n_batch: %d is outside [0, 4096]", p->n_batch);
    if (p->n_slices < 0 || p->n_slices > 256)
        return fail(SI_E_INVALID, "n_slices: %d is outside [0, 256]", p->n_slices);
    if (p->gpu_attention < -1)
        return fail(SI_E_INVALID, "gpu_attention: %d is below -1", p->gpu_attention);
    if (p->gpu_attention > 0 && p->vram_budget == 0 && p->placement_path == NULL)
        return fail(SI_E_INVALID, "gpu_attention: the GPU's layers need a VRAM budget "
                                  "(vram_budget, or a placement's)");
    if (p->attn_split < 0 || p->attn_split > 256)
        return fail(SI_E_INVALID, "attn_split: %d is outside [0, 256]", p->attn_split);
    if (!(p->input_sparsity >= 0.0f && p->input_sparsity <= 0.9f))
        return fail(SI_E_INVALID, "input_sparsity: %g is outside [0, 0.9]",
                    (double)p->input_sparsity);
    if (p->input_sparsity > 0.0f && p->profile_path == NULL)
        return fail(SI_E_INVALID, "input_sparsity needs a profile with input sparsity thresholds "
                                  "(profile_path; starinfer profile --input-sparsity)");
    if (p->flash_window < -1 || p->flash_window > 1000000)
        return fail(SI_E_INVALID, "flash_window: %d is outside [-1, 1000000]", p->flash_window);
    if (!(p->flash_pin >= 0.0f && p->flash_pin <= 1.0f))
        return fail(SI_E_INVALID, "flash_pin: %g is outside [0, 1]", (double)p->flash_pin);
    if (p->flash_pin > 0.0f && p->profile_path == NULL)
        return fail(SI_E_INVALID, "flash_pin keeps the hottest neurons by the profile: it needs "
                                  "profile_path (--profile)");
    const struct si__engine_option *eo =
        p->engine == SI_ENGINE_REF ? si__engine_only_option(p) : NULL;
    if (eo != NULL)
        return fail(SI_E_INVALID, "%s needs the StarPU engine (engine SI_ENGINE_STARPU)",
                    eo->field);
    return check_sampling(&p->sampling);
}

const struct si__engine_option *si__engine_only_option(const struct si_context_params *p)
{
    static const struct si__engine_option opt[] = {
        {"sparsity gate or predictor", "--sparsity", NULL},
        {"vram_budget", "--vram-budget", NULL},
        {"gpu_attention", "--gpu-attention", NULL},
        {"profile_path", "--profile", NULL},
        {"placement_path", "--placement", NULL},
        {"prefill", "--prefill", NULL},
        {"shared_arith", "--batch-arith", NULL},
        {"redux", "--merge redux", NULL},
        {"flash_store", "--flash-store", "the flash tier"},
        {"flash_window", "--flash-window", "the flash tier"},
        {"flash_pin", "--flash-pin", "the flash tier"},
        {"mpi", "mpirun", "running across MPI ranks"},
    };
    const bool set[] = {
        p->sparsity != SI_SPARSE_DENSE,
        p->vram_budget > 0,
        p->gpu_attention > 0,
        p->profile_path != NULL && p->input_sparsity == 0.0f,
        p->placement_path != NULL,
        p->prefill != SI_PREFILL_AUTO,
        p->shared_arith != SI_PREFILL_AUTO,
        p->redux,
        p->flash_store != NULL,
        p->flash_window != 0,
        p->flash_pin > 0.0f,
        p->mpi,
    };
    _Static_assert(sizeof set / sizeof set[0] == sizeof opt / sizeof opt[0], "one flag an option");
    for (size_t i = 0; i < sizeof opt / sizeof opt[0]; i++)
        if (set[i])
            return &opt[i];
    return NULL;
}

__attribute__((format(printf, 2, 3))) static void note(const struct si_context_params *p,
                                                        const char *fmt, ...)
{
    if (p->log == NULL)
        return;
    char line[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    p->log(p->log_user, line);
}

/*
 * Whether the flash tier serves the FFN: asked for (a store named), or
 * needed, when the file's tensor data and the KV cache exceed the DRAM
 * budget.  It runs in the StarPU engine's gate and predictor modes only.
 * SI_OK with *flash set, or SI_E_BUDGET.
 */
static int check_dram(const struct si_llm *llm, const struct si_context_params *p, int32_t n_ctx,
                      bool *flash)
{
    *flash = p->flash_store != NULL;
    if (p->dram_budget == 0)
        return SI_OK;
    const int64_t weights = (int64_t)llm->m->gguf->data_size;
    const int64_t kv = si_llm_kv_bytes_per_token(llm, p) * n_ctx;
    if (weights + kv <= p->dram_budget)
        return SI_OK;
    if (p->engine != SI_ENGINE_STARPU || p->sparsity == SI_SPARSE_DENSE)
        return fail(SI_E_BUDGET,
                    "DRAM budget of %.1f MiB is below the %.1f MiB the model keeps resident "
                    "(tensor data %.1f MiB, KV cache %.1f MiB for %d tokens); the flash tier, "
                    "which reads cold FFN neurons from disk, needs %s",
                    mib(p->dram_budget), mib(weights + kv), mib(weights), mib(kv), n_ctx,
                    p->engine != SI_ENGINE_STARPU
                        ? "the StarPU engine in gate or predictor mode"
                        : "gate or predictor mode (the engine is in dense mode)");
    *flash = true;
    return SI_OK;
}

static void context_destroy(struct si_context *ctx);

/*
 * Input sparsity at p->input_sparsity into rp: the thresholds from the
 * profile (kept in ctx), and the transposed copies where the model has
 * them.  In gate and predictor modes the FFN's inputs keep the mode's own
 * sparsity.
 */
static int input_sparsity(struct si_context *ctx, const struct si_context_params *p,
                          struct si_ref_params *rp, char *err, size_t err_size)
{
    const struct si_model *m = ctx->llm->m;
    struct si_profile *prof = NULL;
    int rc = si_profile_read(&prof, p->profile_path, m, err, err_size);
    if (rc != SI_OK)
        return rc;
    double S[SI_INPUT_KINDS];
    const bool sparse_ffn = p->engine == SI_ENGINE_STARPU && p->sparsity != SI_SPARSE_DENSE;
    si_input_targets(p->input_sparsity, sparse_ffn, S);
    ctx->input_thr = malloc((size_t)m->hp.n_layer * SI_INPUT_KINDS * sizeof *ctx->input_thr);
    if (ctx->input_thr == NULL)
        rc = si__errf(err, err_size, SI_E_NOMEM, "out of memory");
    else /* err names the range, or the profile's missing thresholds */
        rc = si_input_thresholds_by_kind(prof, S, ctx->input_thr, err, err_size);
    si_profile_free(prof);
    if (rc != SI_OK)
        return rc;
    const struct si_layer *L = &m->w.layers[0];
    const bool t = L->wq_t.data != NULL || L->wo_t.data != NULL || L->ffn_up_t.data != NULL;
    rp->input_thresholds = ctx->input_thr;
    rp->input_t = true;
    note(p, "input sparsity %.2f on %s (%.1f%% of the layers' weights skipped)%s",
         (double)p->input_sparsity,
         sparse_ffn ? "the attention's products (the FFN keeps the mode's sparsity)"
                    : "every product",
         100.0 * si_input_model_sparsity(m, S),
         t ? ""
           : "; the model has no transposed copies (starinfer convert --transpose): every "
             "weight is still read");
    return SI_OK;
}

/* The engine's parameters for the context's p, the reference's rp (no
 * flash store, profile or placement yet). */
static struct si_engine_params engine_params(const struct si_context_params *p,
                                             struct si_ref_params rp)
{
    struct si_engine_params ep = si_engine_default_params();
    ep.ref = rp;
    ep.mode = p->sparsity == SI_SPARSE_GATE        ? SI_SPARSITY_GATE
              : p->sparsity == SI_SPARSE_PREDICTOR ? SI_SPARSITY_PREDICTOR
                                                   : SI_SPARSITY_DENSE;
    ep.gate_threshold = p->gate_threshold;
    ep.n_slices = p->n_slices;
    ep.vram_budget = p->vram_budget;
    ep.redux = p->redux;
    ep.prefill = p->prefill;
    ep.step_int8 = p->shared_arith == SI_PREFILL_INT8 ||
                   (p->shared_arith == SI_PREFILL_AUTO && si_gemm8_missing() == NULL);
    ep.attn_split = p->attn_split;
    ep.attn_gpu = p->gpu_attention;
    ep.pipe = p->mpi;
    if (p->n_batch > 0)
        ep.n_batch = p->n_batch;
    return ep;
}

/* The flash tier: the store (p's, or the model's path with .flash) opened
 * into ctx->fs, and the tier's parameters in ep. */
static int open_flash(struct si_context *ctx, const struct si_context_params *p,
                      struct si_engine_params *ep, char *err, size_t err_size)
{
    const struct si_llm *llm = ctx->llm;
    char path[4096];
    if (p->flash_store != NULL)
        snprintf(path, sizeof path, "%s", p->flash_store);
    else
        snprintf(path, sizeof path, "%s.flash", llm->path);
    int rc = si_flash_store_open(&ctx->fs, path, llm->m, 0, err, err_size);
    if (rc != SI_OK)
        return rc;
    ep->flash = ctx->fs;
    ep->dram_budget = p->dram_budget;
    ep->flash_window = p->flash_window == 0 ? 5 : p->flash_window < 0 ? 0 : p->flash_window;
    ep->flash_pin = p->flash_pin;
    ep->model_in_memory = llm->buf != NULL;
    return SI_OK;
}

/* The VRAM budget (ep's, or the placement plc's capacity) against what the
 * engine keeps on the GPU besides FFN neurons: arithmetic on the model,
 * checked before any device is.  SI_E_BUDGET when below. */
static int check_vram(const struct si_model *m, const struct si_engine_params *ep,
                      const struct si_placement *plc, char *err, size_t err_size)
{
    struct si_gpu_reserve rs;
    int rc = si_engine_gpu_reserve(m, ep, &rs, err, err_size);
    if (rc != SI_OK)
        return rc;
    const int64_t vram = ep->vram_budget > 0               ? ep->vram_budget
                         : plc->vram_capacity <= INT64_MAX ? (int64_t)plc->vram_capacity
                                                           : 0;
    if (vram < rs.total) {
        snprintf(err, err_size,
                 "VRAM budget of %lld bytes (%.2f MiB) is below the %lld bytes "
                 "(%.2f MiB) the engine keeps on the GPU besides FFN neurons",
                 (long long)vram, mib(vram), (long long)rs.total, mib(rs.total));
        return SI_E_BUDGET;
    }
    return SI_OK;
}

/* The notes on the engine ctx->eng made with ep: its flash tier, its gate
 * thresholds from the profile prof. */
static void note_engine(const struct si_context *ctx, const struct si_context_params *p,
                        const struct si_engine_params *ep, const struct si_profile *prof)
{
    const struct si_model *m = ctx->llm->m;
    if (ctx->fs != NULL) {
        const struct si_engine_stats es = si_engine_get_stats(ctx->eng);
        char pinned[96] = "";
        if (es.flash_pinned > 0)
            snprintf(pinned, sizeof pinned,
                     "; %lld records pinned to the hottest neurons (%.0f%% of each cache)",
                     (long long)es.flash_pinned, 100.0 * ep->flash_pin);
        note(p,
             "flash tier: %s store, %s, %s, %s; resident %.1f MiB, caches %.1f MiB "
             "(%lld records per layer of %d), window %d tokens%s",
             si_flash_layout_name(ctx->fs->layout), ctx->fs->direct ? "direct I/O" : ctx->fs->why,
             si_flash_io_name(ctx->fs->io),
             !es.flash_overlap ? "reads inside the load tasks (STARINFER_FLASH_OVERLAP=0)"
             : ep->mode == SI_SPARSITY_PREDICTOR && m->pred_input == SI_PRED_LAYER
                 ? "reads beside compute and the attention (lookahead predictors)"
                 : "reads beside compute",
             mib(es.dram_resident), mib(es.flash_cache_bytes), (long long)es.flash_cache_records,
             m->hp.n_ff, ep->flash_window, pinned);
    }
    if (ep->mode == SI_SPARSITY_GATE && ep->gate_threshold == 0.0f && prof != NULL &&
        prof->thresholds != NULL && m->hp.act != SI_ACT_RELU) {
        float lo = INFINITY, hi = 0.0f;
        for (int l = 0; l < m->hp.n_layer; l++) {
            lo = fminf(lo, si_engine_gate_threshold(ctx->eng, l));
            hi = fmaxf(hi, si_engine_gate_threshold(ctx->eng, l));
        }
        note(p,
             "engine: gate thresholds from the profile (target sparsity %.2f): %.4g to %.4g "
             "over the layers",
             (double)prof->target_sparsity, (double)lo, (double)hi);
    }
}

/*
 * The StarPU engine of ctx for p (ctx->eng, ctx->ref, ctx->base), its
 * reference's parameters rp, the flash tier when flash (ctx->fs): the
 * profile and placement read for its init only, the VRAM budget checked
 * before any device is, the runtime held (ctx->holds_runtime).  On an
 * error err says why, and what ctx holds is context_destroy's.
 */
static int engine_context(struct si_context *ctx, const struct si_context_params *p,
                          struct si_ref_params rp, bool flash, char *err, size_t err_size)
{
    const struct si_model *m = ctx->llm->m;
    struct si_profile *prof = NULL;
    struct si_placement *plc = NULL;
    struct si_engine_params ep = engine_params(p, rp);
    int rc;
    if (flash && (rc = open_flash(ctx, p, &ep, err, err_size)) != SI_OK)
        goto fail;
    if (p->profile_path != NULL) {
        if ((rc = si_profile_read(&prof, p->profile_path, m, err, err_size)) != SI_OK)
            goto fail;
        ep.profile = prof;
    }
    if (p->placement_path != NULL) {
        if ((rc = si_placement_read(&plc, p->placement_path, m, err, err_size)) != SI_OK)
            goto fail;
        ep.placement = plc;
    }
    if ((ep.vram_budget > 0 || plc != NULL) &&
        (rc = check_vram(m, &ep, plc, err, err_size)) != SI_OK)
        goto fail;
    if ((rc = runtime_acquire(p->caller_worker, p->mpi, err, err_size)) != SI_OK)
        goto fail;
    ctx->holds_runtime = true;
    if ((ep.vram_budget > 0 || plc != NULL) && si_runtime_ncuda() == 0) {
        rc = SI_E_NO_DEVICE;
        snprintf(err, err_size,
                 "%s needs a GPU, and StarPU has no CUDA worker (no CUDA device, "
                 "STARPU_NCUDA=0, or StarPU built without CUDA); leave it out to run "
                 "on the CPU",
                 ep.vram_budget > 0 ? "a VRAM budget" : "a placement");
        goto fail;
    }
    if (prof != NULL && ep.mode == SI_SPARSITY_DENSE && p->input_sparsity == 0.0f)
        note(p, "engine: dense mode computes every neuron: the profile does not change the "
                "placement");
    if ((rc = si_engine_init(&ctx->eng, m, ep, err, err_size)) != SI_OK)
        goto fail;
    note_engine(ctx, p, &ep, prof);
    si_profile_free(prof); /* the engine needs them during init only */
    si_placement_free(plc);
    ctx->ref = si_engine_ref(ctx->eng);
    ctx->base = si_engine_get_stats(ctx->eng);
    return SI_OK;
fail:
    si_profile_free(prof);
    si_placement_free(plc);
    return rc;
}

int si_context_init(struct si_llm *llm, struct si_context_params p, struct si_context **out)
{
    if (out != NULL)
        *out = NULL;
    if (llm == NULL || out == NULL)
        return fail(SI_E_INVALID, "si_context_init: NULL %s", llm == NULL ? "model" : "out");
    if (!si__live_has(llm, SI__LIVE_LLM))
        return fail(SI_E_INVALID, "si_context_init: not a live model (freed already, or not "
                                  "made by si_llm_load)");
    int rc = check_params(&p);
    if (rc != SI_OK)
        return rc;
    const struct si_model *m = llm->m;
    const int32_t n_ctx = p.n_ctx > 0 ? p.n_ctx : default_ctx(llm, &p);
    bool flash;
    if ((rc = check_dram(llm, &p, n_ctx, &flash)) != SI_OK)
        return rc;
    if (!flash && (p.flash_window != 0 || p.flash_pin > 0.0f))
        return fail(SI_E_INVALID,
                    "the flash %s is the flash tier's: it needs a flash store "
                    "(--flash-store) or a DRAM budget below what the model keeps resident, in gate "
                    "or predictor mode",
                    p.flash_window != 0 ? "window (--flash-window)" : "pinning (--flash-pin)");

    struct si_context *ctx = calloc(1, sizeof *ctx);
    if (ctx == NULL)
        return fail(SI_E_NOMEM, "out of memory");
    ctx->llm = llm;
    ctx->p = p;
    ctx->p.profile_path = NULL; /* read here only; the caller's strings may go */
    ctx->p.placement_path = NULL;
    ctx->p.flash_store = NULL;
    ctx->n_ctx = n_ctx;
    char err[600];
    struct si_ref_params rp = si_ref_default_params();
    rp.n_ctx = n_ctx;
    kv_params(&p, &rp);
    if (p.input_sparsity > 0.0f && (rc = input_sparsity(ctx, &p, &rp, err, sizeof err)) != SI_OK)
        goto fail_err;
    if (p.engine == SI_ENGINE_REF) {
        if ((rc = si_ref_init(&ctx->ref, m, rp, err, sizeof err)) != SI_OK)
            goto fail_err;
        ctx->ref->count_active = true; /* for the stats, as the engine counts */
    } else if ((rc = engine_context(ctx, &p, rp, flash, err, sizeof err)) != SI_OK) {
        goto fail_err;
    }
    ctx->hist = malloc((size_t)n_ctx * sizeof *ctx->hist);
    ctx->smp = make_sampler(&p.sampling, m->hp.n_vocab);
    if (ctx->hist == NULL || ctx->smp == NULL || !si__live_add(ctx, SI__LIVE_CONTEXT)) {
        context_destroy(ctx);
        return fail(SI_E_NOMEM, "out of memory");
    }
    atomic_fetch_add(&llm->n_contexts, 1);
    *out = ctx;
    return SI_OK;
fail_err:
    context_destroy(ctx);
    return fail(rc, "%s", err);
}

/* ctx is a live context (else the failure is recorded): the calls that read it. */
static bool ctx_ok(const struct si_context *ctx, const char *fn)
{
    if (ctx == NULL) {
        fail(SI_E_INVALID, "%s: NULL context", fn);
        return false;
    }
    if (!si__live_has(ctx, SI__LIVE_CONTEXT)) {
        fail(SI_E_INVALID, "%s: not a live context (freed already, or not made by "
                           "si_context_init)", fn);
        return false;
    }
    return true;
}

/* ctx is a live context and now this thread's, until leave(): the calls that
 * change it.  A second thread is refused rather than let in. */
static int enter(struct si_context *ctx, const char *fn)
{
    if (!ctx_ok(ctx, fn))
        return SI_E_INVALID;
    if (atomic_exchange(&ctx->busy, true))
        return fail(SI_E_INVALID, "%s: the context is in use by another call (a context is "
                                  "used by one thread at a time)", fn);
    return SI_OK;
}

static void leave(struct si_context *ctx)
{
    atomic_store(&ctx->busy, false);
}

static int context_init_shared(struct si_context *first, struct si_context **out)
{
    if (first->eng == NULL)
        return fail(SI_E_UNSUPPORTED, "si_context_init_shared: the reference engine has no "
                                      "engine to share (engine SI_ENGINE_STARPU does)");
    if (first->p.caller_worker)
        return fail(SI_E_INVALID, "si_context_init_shared: the first context was made with "
                                  "caller_worker, which lets only its thread evaluate; shared "
                                  "contexts evaluate on their own threads");
    if (first->p.mpi)
        return fail(SI_E_UNSUPPORTED, "si_context_init_shared: not across MPI ranks");
    if (si_engine_n_batch(first->eng) <= 1)
        return fail(SI_E_UNSUPPORTED,
                    "si_context_init_shared: the engine takes no batches (n_batch 1, or the "
                    "flash tier), and shared contexts are decoded as one");
    char err[256];
    int rc = runtime_acquire(false, false, err, sizeof err);
    if (rc != SI_OK)
        return fail(rc, "%s", err);
    struct si_context *ctx = calloc(1, sizeof *ctx);
    if (ctx == NULL) {
        runtime_release();
        return fail(SI_E_NOMEM, "out of memory");
    }
    ctx->holds_runtime = true;
    ctx->llm = first->llm;
    ctx->p = first->p;
    ctx->n_ctx = first->n_ctx;
    if (first->grp == NULL) {
        /* the engine (and the thresholds it borrows) now the group's */
        if ((first->grp = si__group_new(first->eng, first->input_thr)) == NULL) {
            context_destroy(ctx);
            return fail(SI_E_NOMEM, "out of memory");
        }
        first->input_thr = NULL;
    }
    si__group_hold(first->grp);
    ctx->grp = first->grp;
    ctx->eng = first->eng;
    si__group_lock(ctx->grp);
    ctx->ref = si_engine_seq_new(ctx->eng);
    ctx->base = si_engine_get_stats(ctx->eng);
    si__group_unlock(ctx->grp);
    ctx->hist = malloc((size_t)ctx->n_ctx * sizeof *ctx->hist);
    ctx->smp = make_sampler(&ctx->p.sampling, ctx->llm->m->hp.n_vocab);
    if (ctx->ref == NULL || ctx->hist == NULL || ctx->smp == NULL ||
        !si__live_add(ctx, SI__LIVE_CONTEXT)) {
        context_destroy(ctx);
        return fail(SI_E_NOMEM, "out of memory (a shared context's KV cache: %.1f MiB)",
                    mib(si_engine_seq_bytes(first->eng)));
    }
    atomic_fetch_add(&ctx->llm->n_contexts, 1);
    *out = ctx;
    return SI_OK;
}

int si_context_init_shared(struct si_context *first, struct si_context **out)
{
    if (out == NULL)
        return fail(SI_E_INVALID, "si_context_init_shared: NULL out");
    *out = NULL;
    int rc = enter(first, "si_context_init_shared");
    if (rc != SI_OK)
        return rc;
    rc = context_init_shared(first, out);
    leave(first);
    return rc;
}

void si_context_free(struct si_context *ctx)
{
    if (ctx == NULL)
        return;
    if (enter(ctx, "si_context_free") != SI_OK)
        return; /* freed already, or in use: nothing freed */
    si__live_remove(ctx, SI__LIVE_CONTEXT);
    atomic_fetch_sub(&ctx->llm->n_contexts, 1);
    context_destroy(ctx);
}

static void context_destroy(struct si_context *ctx)
{
    if (ctx == NULL)
        return;
    if (ctx->grp != NULL) {
        /* the engine goes with the group's last context */
        si__group_lock(ctx->grp);
        si_engine_seq_free(ctx->eng, ctx->ref); /* nothing for the engine's own */
        si__group_unlock(ctx->grp);
        si__group_drop(ctx->grp);
    } else if (ctx->eng != NULL) {
        si_engine_free(ctx->eng);
    } else {
        si_ref_free(ctx->ref);
    }
    si_flash_store_free(ctx->fs); /* after the engine, which reads it */
    if (ctx->holds_runtime)
        runtime_release();
    si_sampler_free(ctx->smp);
    free(ctx->hist);
    free(ctx->input_thr); /* after the engine or reference, which borrow it */
    free(ctx);
}

const struct si_llm *si_context_llm(const struct si_context *ctx)
{
    return ctx_ok(ctx, "si_context_llm") ? ctx->llm : NULL;
}

int32_t si_context_n_ctx(const struct si_context *ctx)
{
    return ctx_ok(ctx, "si_context_n_ctx") ? ctx->n_ctx : SI_E_INVALID;
}

int32_t si_context_n_past(const struct si_context *ctx)
{
    return ctx_ok(ctx, "si_context_n_past") ? ctx->ref->n_past : SI_E_INVALID;
}

const int32_t *si_context_tokens(const struct si_context *ctx)
{
    return ctx_ok(ctx, "si_context_tokens") ? ctx->hist : NULL;
}

int si_context_mpi_rank(const struct si_context *ctx)
{
    return ctx != NULL && ctx->p.mpi ? si_runtime_mpi_rank() : 0;
}

int si_context_mpi_size(const struct si_context *ctx)
{
    return ctx != NULL && ctx->p.mpi ? si_runtime_mpi_size() : 1;
}

int si_context_share(struct si_context *ctx, void *buf, size_t size)
{
    int rc = enter(ctx, "si_context_share");
    if (rc != SI_OK)
        return rc;
    if (buf == NULL && size > 0)
        rc = fail(SI_E_INVALID, "si_context_share: NULL buffer");
    else if (ctx->p.mpi)
        si_runtime_mpi_share_bytes(buf, size);
    leave(ctx);
    return rc;
}

/* A clear message for an evaluation's status. */
static int eval_failed(const struct si_context *ctx, int rc, const char *what)
{
    if (ctx->eng != NULL && si_engine_error(ctx->eng)[0] != '\0')
        return fail(rc, "%s: %s", what, si_engine_error(ctx->eng));
    if (rc == SI_E_BUDGET)
        return fail(rc, "%s: the context of %d tokens is full", what, ctx->n_ctx);
    if (ctx->eng != NULL && si_runtime_has_caller_worker() && !si_runtime_is_caller_worker())
        return fail(rc, "%s: StarPU runs a CPU worker on the thread that created the first "
                        "context (caller_worker): evaluate on that thread",
                    what);
    return fail(rc, "%s failed: %s", what, si_status_str(rc));
}

static int check_token(const struct si_context *ctx, int32_t token)
{
    const int32_t nv = ctx->llm->m->hp.n_vocab;
    if (token < 0 || token >= nv)
        return fail(SI_E_INVALID, "token %d is outside the vocabulary (%d tokens)", token, nv);
    return SI_OK;
}

/* One token through the engine or the reference, recorded in the history. */
static int eval_one(struct si_context *ctx, int32_t token)
{
    const int32_t pos = ctx->ref->n_past;
    int32_t done = 0;
    int rc = ctx->grp != NULL ? si__group_eval(ctx->grp, ctx->ref, &token, 1, false, ctx->engaged,
                                               &done)
             : ctx->eng != NULL ? si_engine_eval(ctx->eng, token)
                                : si_ref_eval(ctx->ref, token);
    if (rc != SI_OK)
        return rc;
    ctx->hist[pos] = token;
    if (ctx->eng == NULL) {
        ctx->ref_tokens++;
        for (int l = 0; l < ctx->llm->m->hp.n_layer; l++)
            ctx->ref_active += ctx->ref->n_active[l];
    }
    return SI_OK;
}

static int context_eval(struct si_context *ctx, int32_t token)
{
    int rc = check_token(ctx, token);
    if (rc != SI_OK)
        return rc;
    if (ctx->ref->n_past >= ctx->n_ctx)
        return fail(SI_E_BUDGET, "the context of %d tokens is full", ctx->n_ctx);
    const double t0 = si__now();
    rc = eval_one(ctx, token);
    ctx->have_logits = rc == SI_OK;
    if (rc != SI_OK)
        return eval_failed(ctx, rc, "evaluation");
    ctx->decode_seconds += si__now() - t0;
    ctx->decode_tokens++;
    return SI_OK;
}

int si_context_eval(struct si_context *ctx, int32_t token)
{
    int rc = enter(ctx, "si_context_eval");
    if (rc != SI_OK)
        return rc;
    rc = context_eval(ctx, token);
    leave(ctx);
    return rc;
}

static int context_eval_batch(struct si_context *ctx, const int32_t *tokens, int32_t n)
{
    if (tokens == NULL || n < 1)
        return fail(SI_E_INVALID, "si_context_eval_batch: %s",
                    tokens == NULL ? "NULL tokens" : "no tokens");
    for (int32_t i = 0; i < n; i++) {
        int rc = check_token(ctx, tokens[i]);
        if (rc != SI_OK)
            return rc;
    }
    const int32_t start = ctx->ref->n_past;
    if ((int64_t)start + n > ctx->n_ctx)
        return fail(SI_E_BUDGET, "%d tokens do not fit the context: %d of its %d positions are "
                                 "used", n, start, ctx->n_ctx);
    const double t0 = si__now();
    int rc = SI_OK;
    /* Batches of 64 tokens or more take llama.cpp's tiled f32 attention
     * (a shared context's: in the group's steps, which set it) */
    if (ctx->grp == NULL)
        ctx->ref->attn_f32 = n >= 64;
    if (ctx->grp != NULL) {
        int32_t done = 0;
        rc = si__group_eval(ctx->grp, ctx->ref, tokens, n, n >= 64, ctx->engaged, &done);
        memcpy(ctx->hist + start, tokens, (size_t)done * sizeof *tokens);
    } else if (ctx->eng != NULL && ctx->p.n_batch != 1) {
        rc = si_engine_eval_batch(ctx->eng, tokens, n);
        /* What went in (all of it unless StarPU failed half-way). */
        int32_t done = ctx->ref->n_past - start;
        memcpy(ctx->hist + start, tokens, (size_t)(done > 0 ? done : 0) * sizeof *tokens);
    } else {
        /* The reference: llama.cpp's arithmetic for a batch of n tokens
         * with the last one's logits (as si_ref_eval_batch). */
        ctx->ref->batch_n = n;
        for (int32_t i = 0; i < n && rc == SI_OK; i++) {
            ctx->ref->batch_g4 = i < n - n % 4;
            rc = eval_one(ctx, tokens[i]);
        }
        ctx->ref->batch_n = 0;
        ctx->ref->batch_g4 = false;
    }
    if (ctx->grp == NULL)
        ctx->ref->attn_f32 = false;
    ctx->have_logits = rc == SI_OK;
    if (rc != SI_OK)
        return eval_failed(ctx, rc, "evaluation of the batch");
    ctx->prefill_seconds += si__now() - t0;
    ctx->prefill_tokens += n;
    return SI_OK;
}

int si_context_eval_batch(struct si_context *ctx, const int32_t *tokens, int32_t n)
{
    int rc = enter(ctx, "si_context_eval_batch");
    if (rc != SI_OK)
        return rc;
    rc = context_eval_batch(ctx, tokens, n);
    leave(ctx);
    return rc;
}

const float *si_context_logits(const struct si_context *ctx)
{
    if (!ctx_ok(ctx, "si_context_logits") || !ctx->have_logits)
        return NULL;
    return ctx->eng != NULL && ctx->grp == NULL ? si_engine_logits(ctx->eng) : ctx->ref->logits;
}

void si_context_reset(struct si_context *ctx)
{
    if (enter(ctx, "si_context_reset") != SI_OK)
        return;
    if (ctx->grp != NULL) {
        si__group_lock(ctx->grp);
        if (ctx->ref == si_engine_ref(ctx->eng))
            si_engine_reset(ctx->eng);
        else
            ctx->ref->n_past = 0;
        si__group_unlock(ctx->grp);
    } else if (ctx->eng != NULL) {
        si_engine_reset(ctx->eng);
    } else {
        si_ref_reset(ctx->ref);
    }
    ctx->have_logits = false;
    si_sampler_reset(ctx->smp);
    leave(ctx);
}

static int context_rewind(struct si_context *ctx, int32_t n_keep)
{
    if (n_keep < 0 || n_keep > ctx->ref->n_past)
        return fail(SI_E_INVALID, "rewind to %d: the cache holds %d tokens", n_keep,
                    ctx->ref->n_past);
    /* The cache's rows past n_past are never read: moving n_past back is the
     * whole truncation (it is what si_ref_reset does, for 0), the engine's
     * included, which keeps its position in its reference state. */
    if (n_keep < ctx->ref->n_past)
        ctx->have_logits = false;
    if (ctx->grp != NULL)
        si__group_lock(ctx->grp);
    ctx->ref->n_past = n_keep;
    if (ctx->grp != NULL)
        si__group_unlock(ctx->grp);
    resync_sampler(ctx);
    return SI_OK;
}

int si_context_rewind(struct si_context *ctx, int32_t n_keep)
{
    int rc = enter(ctx, "si_context_rewind");
    if (rc != SI_OK)
        return rc;
    rc = context_rewind(ctx, n_keep);
    leave(ctx);
    return rc;
}

int32_t si_context_reuse_prefix(struct si_context *ctx, const int32_t *tokens, int32_t n)
{
    int rc = enter(ctx, "si_context_reuse_prefix");
    if (rc != SI_OK)
        return rc;
    if ((tokens == NULL && n > 0) || n < 0) {
        leave(ctx);
        return fail(SI_E_INVALID, "si_context_reuse_prefix: %s",
                    n < 0 ? "negative count" : "NULL tokens");
    }
    int32_t k = 0;
    const int32_t past = ctx->ref->n_past;
    while (k < past && k < n - 1 && ctx->hist[k] == tokens[k])
        k++;
    rc = context_rewind(ctx, k);
    leave(ctx);
    return rc != SI_OK ? rc : k;
}

static int context_shift(struct si_context *ctx, int32_t n_keep, int32_t n_discard)
{
    const int32_t past = ctx->ref->n_past;
    if (n_keep < 0 || n_discard < 1 || (int64_t)n_keep + n_discard > past)
        return fail(SI_E_INVALID, "context shift: keep %d and drop %d of the %d tokens in the "
                                  "cache: %s",
                    n_keep, n_discard, past,
                    n_keep < 0 ? "a negative keep" : n_discard < 1 ? "nothing to drop"
                                                                   : "more than it holds");
    if (ctx->p.mpi)
        return fail(SI_E_UNSUPPORTED, "context shift: not across MPI ranks");
    int rc;
    if (ctx->grp != NULL)
        si__group_lock(ctx->grp);
    rc = ctx->eng != NULL ? si_engine_kv_shift(ctx->eng, ctx->ref, n_keep, n_discard)
                          : si_ref_kv_shift(ctx->ref, n_keep, n_discard);
    if (ctx->grp != NULL)
        si__group_unlock(ctx->grp);
    if (rc == SI_E_UNSUPPORTED)
        return fail(rc, "context shift: the model's positions are learned embeddings added to "
                        "its input (no RoPE), which moving the cache cannot change");
    if (rc != SI_OK)
        return fail(rc, "context shift failed: %s", si_status_str(rc));
    memmove(ctx->hist + n_keep, ctx->hist + n_keep + n_discard,
            (size_t)(past - n_keep - n_discard) * sizeof *ctx->hist);
    resync_sampler(ctx);
    return SI_OK;
}

int si_context_shift(struct si_context *ctx, int32_t n_keep, int32_t n_discard)
{
    int rc = enter(ctx, "si_context_shift");
    if (rc != SI_OK)
        return rc;
    rc = context_shift(ctx, n_keep, n_discard);
    leave(ctx);
    return rc;
}

/* The next token from logits: drawn by the sampler, or across MPI ranks
 * (p.mpi) drawn on rank 0, which has the logits, and shared with every rank. */
static int32_t sample(struct si_context *ctx, const float *logits)
{
    int32_t t = !ctx->p.mpi || si_runtime_mpi_rank() == 0 ? si_sampler_sample(ctx->smp, logits) : 0;
    if (ctx->p.mpi)
        si_runtime_mpi_share(&t);
    return t;
}

int si_context_sample(struct si_context *ctx, int32_t *token)
{
    int rc = enter(ctx, "si_context_sample");
    if (rc != SI_OK)
        return rc;
    const float *logits = si_context_logits(ctx);
    if (token == NULL)
        rc = fail(SI_E_INVALID, "si_context_sample: NULL argument");
    else if (logits == NULL)
        rc = fail(SI_E_INVALID, "no logits to sample from: evaluate a token first");
    else
        *token = sample(ctx, logits);
    leave(ctx);
    return rc;
}

int si_context_accept(struct si_context *ctx, int32_t token)
{
    int rc = enter(ctx, "si_context_accept");
    if (rc != SI_OK)
        return rc;
    if ((rc = check_token(ctx, token)) == SI_OK)
        si_sampler_accept(ctx->smp, token);
    leave(ctx);
    return rc;
}

static int context_set_sampling(struct si_context *ctx, struct si_sampling_params p)
{
    int rc = check_sampling(&p);
    if (rc != SI_OK)
        return rc;
    struct si_sampler *s = make_sampler(&p, ctx->llm->m->hp.n_vocab);
    if (s == NULL)
        return fail(SI_E_NOMEM, "out of memory");
    si_sampler_free(ctx->smp);
    ctx->smp = s;
    ctx->p.sampling = p;
    resync_sampler(ctx);
    return SI_OK;
}

int si_context_set_sampling(struct si_context *ctx, struct si_sampling_params p)
{
    int rc = enter(ctx, "si_context_set_sampling");
    if (rc != SI_OK)
        return rc;
    rc = context_set_sampling(ctx, p);
    leave(ctx);
    return rc;
}

/* -------------------------------------------------------------- generation */

struct si_generate_params si_generate_default_params(void)
{
    return (struct si_generate_params){.n_predict = 128, .parse_special = true};
}

/*
 * How many of buf[0..n) form whole UTF-8 characters: a lead byte near the
 * end whose sequence runs past n is held back (at most 3 bytes).  Bytes that
 * are not UTF-8 at all pass through.
 */
static size_t utf8_whole(const char *buf, size_t n)
{
    for (size_t back = 1; back <= 4 && back <= n; back++) {
        const unsigned char c = (unsigned char)buf[n - back];
        if ((c & 0xC0) == 0x80)
            continue; /* a continuation byte: look further back */
        const size_t want = (c & 0xE0) == 0xC0   ? 2
                            : (c & 0xF0) == 0xE0 ? 3
                            : (c & 0xF8) == 0xF0 ? 4
                                                 : 1;
        return want > back ? n - back : n;
    }
    return n;
}

static int generate_run(struct si_context *ctx, const int32_t *tokens, int32_t n,
                        struct si_generate_params gp, si_token_fn cb, void *user,
                        struct si_generate_result *res)
{
    struct si_generate_result r = {.stop = SI_STOP_LENGTH};
    if (res != NULL)
        *res = r;
    if (n < 0 || (tokens == NULL && n > 0))
        return fail(SI_E_INVALID, "si_generate: %s", n < 0 ? "negative count" : "NULL tokens");
    if (gp.n_predict < 0)
        return fail(SI_E_INVALID, "n_predict: %d is negative", gp.n_predict);
    if (gp.n_keep < 0)
        return fail(SI_E_INVALID, "n_keep: %d is negative", gp.n_keep);
    if (n == 0 && !ctx->have_logits)
        return fail(SI_E_INVALID, "the prompt is empty and nothing was evaluated before it");
    if ((int64_t)ctx->ref->n_past + n > ctx->n_ctx)
        return fail(SI_E_BUDGET, "the prompt of %d tokens does not fit the context: %d of its %d "
                                 "positions are used", n, ctx->ref->n_past, ctx->n_ctx);
    const double t0 = si__now();
    int rc = SI_OK;
    if (n > 0 && (rc = context_eval_batch(ctx, tokens, n)) != SI_OK)
        return rc;
    for (int32_t i = 0; i < n; i++)
        si_sampler_accept(ctx->smp, tokens[i]);
    const double t1 = si__now();
    r.n_prompt = n;
    r.prompt_seconds = t1 - t0;

    const struct si_llm *llm = ctx->llm;
    char small[256], *piece = small;
    size_t piece_cap = sizeof small;
    char text[sizeof small + 4]; /* pending bytes + a piece, when it fits */
    char pend[4];
    size_t n_pend = 0;
    for (;;) {
        if (r.n_generated >= gp.n_predict) {
            r.stop = SI_STOP_LENGTH;
            break;
        }
        int32_t next = sample(ctx, si_context_logits(ctx));
        if (!gp.ignore_eos && si_tokenizer_is_eog(llm->tok, next)) {
            r.stop = SI_STOP_EOG;
            break;
        }
        int64_t len = si_token_to_piece(llm->tok, next, false, piece, piece_cap);
        if (len > (int64_t)piece_cap) { /* a long piece: room for it */
            char *big = malloc((size_t)len + sizeof pend);
            if (big == NULL) {
                rc = fail(SI_E_NOMEM, "out of memory");
                break;
            }
            if (piece != small)
                free(piece);
            piece = big;
            piece_cap = (size_t)len;
            len = si_token_to_piece(llm->tok, next, false, piece, piece_cap);
        }
        if (len < 0)
            len = 0;
        /* The pending bytes, then the piece: in text[] or, for long pieces,
         * in piece's own buffer (which has room for them in front). */
        char *all = text;
        if ((size_t)len + n_pend > sizeof text) {
            memmove(piece + n_pend, piece, (size_t)len);
            all = piece;
        } else {
            memcpy(text + n_pend, piece, (size_t)len);
        }
        memcpy(all, pend, n_pend);
        const size_t total = n_pend + (size_t)len, whole = utf8_whole(all, total);
        r.n_generated++;
        bool go_on = cb == NULL || cb(user, next, all, whole);
        if (ctx->p.mpi) { /* rank 0's answer, on every rank */
            int32_t g = go_on;
            si_runtime_mpi_share(&g);
            go_on = g != 0;
        }
        n_pend = total - whole;
        memcpy(pend, all + whole, n_pend);
        if (!go_on) {
            r.stop = SI_STOP_CALLBACK;
            break;
        }
        si_sampler_accept(ctx->smp, next);
        if (r.n_generated >= gp.n_predict) {
            /* Nothing needs the last token's logits. */
            r.stop = SI_STOP_LENGTH;
            break;
        }
        if (ctx->ref->n_past >= ctx->n_ctx) {
            /* keep n_keep tokens (the BOS at least), drop half of the rest */
            const bool bos = si_llm_adds_bos(ctx->llm) && ctx->hist[0] == si_llm_token_bos(ctx->llm);
            const int32_t keep = gp.n_keep > (bos ? 1 : 0) ? gp.n_keep : (bos ? 1 : 0);
            const int32_t drop = (ctx->ref->n_past - keep) / 2;
            if (!gp.context_shift || drop < 1) {
                r.stop = SI_STOP_CONTEXT;
                break;
            }
            if ((rc = context_shift(ctx, keep, drop)) != SI_OK)
                break;
            r.n_shifted += drop;
        }
        if ((rc = context_eval(ctx, next)) != SI_OK)
            break;
    }
    if (n_pend > 0 && cb != NULL)
        cb(user, -1, pend, n_pend);
    if (piece != small)
        free(piece);
    r.generate_seconds = si__now() - t1;
    if (res != NULL)
        *res = r;
    return rc;
}

/* generate_run, its context engaged in its group's steps while it runs:
 * they wait for its next token (shared.c). */
static int generate_tokens(struct si_context *ctx, const int32_t *tokens, int32_t n,
                           struct si_generate_params gp, si_token_fn cb, void *user,
                           struct si_generate_result *res)
{
    if (ctx->grp == NULL)
        return generate_run(ctx, tokens, n, gp, cb, user, res);
    ctx->engaged = true;
    si__group_engage(ctx->grp, 1);
    int rc = generate_run(ctx, tokens, n, gp, cb, user, res);
    si__group_engage(ctx->grp, -1);
    ctx->engaged = false;
    return rc;
}

int si_generate_tokens(struct si_context *ctx, const int32_t *tokens, int32_t n,
                       struct si_generate_params gp, si_token_fn cb, void *user,
                       struct si_generate_result *res)
{
    if (res != NULL)
        *res = (struct si_generate_result){.stop = SI_STOP_LENGTH};
    int rc = enter(ctx, "si_generate_tokens");
    if (rc != SI_OK)
        return rc;
    rc = generate_tokens(ctx, tokens, n, gp, cb, user, res);
    leave(ctx);
    return rc;
}

static int generate(struct si_context *ctx, const char *prompt, struct si_generate_params gp,
                    si_token_fn cb, void *user, struct si_generate_result *res)
{
    if (prompt == NULL)
        return fail(SI_E_INVALID, "si_generate: NULL prompt");
    const struct si_llm *llm = ctx->llm;
    const size_t len = strlen(prompt);
    const bool bos = ctx->ref->n_past == 0 && si_tokenizer_add_bos(llm->tok);
    int64_t n = si_tokenize(llm->tok, prompt, len, bos, gp.parse_special, NULL, 0);
    if (n < 0)
        return fail((int)n, "cannot tokenize the prompt: %s", si_status_str((int)n));
    if (n > ctx->n_ctx)
        return fail(SI_E_BUDGET, "the prompt of %lld tokens does not fit the context of %d",
                    (long long)n, ctx->n_ctx);
    int32_t *toks = malloc((size_t)(n > 0 ? n : 1) * sizeof *toks);
    if (toks == NULL)
        return fail(SI_E_NOMEM, "out of memory");
    si_tokenize(llm->tok, prompt, len, bos, gp.parse_special, toks, (size_t)n);
    int rc = generate_tokens(ctx, toks, (int32_t)n, gp, cb, user, res);
    free(toks);
    return rc;
}

int si_generate(struct si_context *ctx, const char *prompt, struct si_generate_params gp,
                si_token_fn cb, void *user, struct si_generate_result *res)
{
    if (res != NULL)
        *res = (struct si_generate_result){.stop = SI_STOP_LENGTH};
    int rc = enter(ctx, "si_generate");
    if (rc != SI_OK)
        return rc;
    rc = generate(ctx, prompt, gp, cb, user, res);
    leave(ctx);
    return rc;
}

/* ------------------------------------------------------------------- stats */

void si_context_get_stats(const struct si_context *ctx, struct si_stats *out)
{
    if (out != NULL)
        memset(out, 0, sizeof *out);
    if (!ctx_ok(ctx, "si_context_get_stats") || out == NULL)
        return;
    struct si_stats s;
    memset(&s, 0, sizeof s);
    s.engine = ctx->p.engine;
    s.sparsity = ctx->p.sparsity;
    s.prefill_tokens = ctx->prefill_tokens;
    s.prefill_seconds = ctx->prefill_seconds;
    s.prefill_tokens_per_s =
        ctx->prefill_seconds > 0 ? (double)ctx->prefill_tokens / ctx->prefill_seconds : 0.0;
    s.decode_tokens = ctx->decode_tokens;
    s.decode_seconds = ctx->decode_seconds;
    s.decode_tokens_per_s =
        ctx->decode_seconds > 0 ? (double)ctx->decode_tokens / ctx->decode_seconds : 0.0;
    if (ctx->eng == NULL) {
        /* The reference: every token, on the CPU. */
        const struct si_hparams *hp = &ctx->llm->m->hp;
        s.neurons_total = ctx->ref_tokens * hp->n_layer * hp->n_ff;
        s.neurons_cpu = ctx->ref_active;
    } else {
        if (ctx->grp != NULL)
            si__group_lock(ctx->grp);
        const struct si_engine_stats e = si_engine_get_stats(ctx->eng), *b = &ctx->base;
        if (ctx->grp != NULL)
            si__group_unlock(ctx->grp);
        s.neurons_total = e.neurons_total - b->neurons_total;
        s.neurons_gpu = e.neurons_hot - b->neurons_hot;
        s.neurons_cpu = e.neurons_cold - b->neurons_cold;
        s.n_cpu_workers = si_runtime_ncpu();
        s.n_cuda_workers = si_runtime_ncuda();
        s.n_slices = si_engine_n_slices(ctx->eng);
        s.hot_bytes = si_engine_hot_bytes(ctx->eng);
        s.gpu_attention_layers = e.attn_gpu_layers;
        s.gpu_budget = e.gpu_budget;
        s.gpu_accounted = e.gpu_accounted;
        s.gpu_allocated_peak = e.gpu_allocated_peak;
        s.packed_bytes = e.packed_bytes;
        s.step_tokens = e.tokens - b->tokens;
        s.step_seconds = e.seconds - b->seconds;
        s.step_tasks = e.tasks - b->tasks;
        s.step_submit_seconds = e.submit_seconds - b->submit_seconds;
        s.step_submit_cpu_seconds = e.submit_cpu_seconds - b->submit_cpu_seconds;
        s.batch_tokens = e.batch_tokens - b->batch_tokens;
        s.batch_seconds = e.batch_seconds - b->batch_seconds;
        s.batch_tasks = e.batch_tasks - b->batch_tasks;
        s.shared_steps = e.steps - b->steps;
        s.shared_tokens = e.step_tokens - b->step_tokens;
        s.shared_seqs = e.step_seqs - b->step_seqs;
        s.shared_seconds = e.step_seconds - b->step_seconds;
        s.prefill = si_engine_prefill(ctx->eng);
        if (ctx->fs != NULL) {
            s.flash = true;
            s.flash_direct = ctx->fs->direct;
            s.flash_window = ctx->p.flash_window == 0 ? 5 : ctx->p.flash_window < 0
                                                                ? 0 : ctx->p.flash_window;
            s.dram_resident = e.dram_resident;
            s.flash_cache_bytes = e.flash_cache_bytes;
            s.flash_cache_records = e.flash_cache_records;
            s.flash_loads = e.flash_loads - b->flash_loads;
            s.flash_hits = e.flash_hits - b->flash_hits;
            s.flash_bytes = e.flash_bytes - b->flash_bytes;
            s.flash_reads = e.flash_reads - b->flash_reads;
            s.flash_io_seconds = e.flash_io_seconds - b->flash_io_seconds;
            s.flash_manage_seconds = e.flash_manage_seconds - b->flash_manage_seconds;
        }
        s.n_task_kinds = SI_TASK_KIND_COUNT;
        for (int k = 0; k < SI_TASK_KIND_COUNT; k++)
            s.tasks[k] = (struct si_task_stat){
                .name = si_task_kind_name((enum si_task_kind)k),
                .batch = k >= SI_TASK_PREFILL_EMBED,
                .count = e.task_count[k] - b->task_count[k],
                .seconds = e.task_seconds[k] - b->task_seconds[k],
            };
    }
    const int64_t computed = s.neurons_gpu + s.neurons_cpu;
    s.gpu_share = computed > 0 ? (double)s.neurons_gpu / (double)computed : 0.0;
    *out = s;
}

void si_context_reset_stats(struct si_context *ctx)
{
    if (enter(ctx, "si_context_reset_stats") != SI_OK)
        return;
    ctx->prefill_tokens = ctx->decode_tokens = ctx->ref_tokens = ctx->ref_active = 0;
    ctx->prefill_seconds = ctx->decode_seconds = 0.0;
    if (ctx->eng != NULL) {
        if (ctx->grp != NULL)
            si__group_lock(ctx->grp);
        ctx->base = si_engine_get_stats(ctx->eng);
        if (ctx->grp != NULL)
            si__group_unlock(ctx->grp);
    }
    leave(ctx);
}
