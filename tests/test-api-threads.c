/*
 * test-api-threads.c - the public API from several threads and under misuse
 * (starinfer.h, "Thread safety" and "Misuse"): two contexts on one model in
 * two threads give the tokens each gives alone, on the reference and on the
 * StarPU engine; a handle freed twice or used after its free, a model freed
 * under its contexts, a context entered by two calls at once, and an
 * evaluation after a failed one are clear statuses with a message, never a
 * crash.  Run under ThreadSanitizer by tools/tsan-api.
 */
#include "model/synth.h"
#include "model/types.h"
#include "starinfer.h"
#include "test.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char dir[] = "/tmp/si-test-api-threads-XXXXXX";

static bool contains(const char *s, const char *needle)
{
    return strstr(s, needle) != NULL;
}

static struct si_context *make(struct si_llm *llm, enum si_engine_kind engine, int32_t n_ctx)
{
    struct si_context_params p = si_context_default_params();
    p.engine = engine;
    p.n_ctx = n_ctx;
    p.sampling.temp = 0.0f;
    struct si_context *ctx = NULL;
    CHECK(si_context_init(llm, p, &ctx) == SI_OK, "context (%s): %s",
          si_engine_kind_name(engine), si_last_error());
    return ctx;
}

/* ------------------------------------------------------------ two threads */

enum { N_GEN = 24, ROUNDS = 3 };

struct run {
    struct si_llm *llm;
    enum si_engine_kind engine;
    const char *prompt;
    int32_t ids[ROUNDS][N_GEN];
    int n[ROUNDS];
    int rc;
    char msg[512];
};

struct collect {
    int32_t *ids;
    int *n;
};

static bool collect_cb(void *user, int32_t token, const char *text, size_t len)
{
    (void)text;
    (void)len;
    struct collect *c = user;
    if (token >= 0 && *c->n < N_GEN)
        c->ids[(*c->n)++] = token;
    return true;
}

/* ROUNDS greedy generations from the prompt, each from an empty cache, on a
 * context of the thread's own. */
static void *run_thread(void *v)
{
    struct run *r = v;
    struct si_context_params p = si_context_default_params();
    p.engine = r->engine;
    p.n_ctx = 64;
    p.sampling.temp = 0.0f;
    struct si_context *ctx = NULL;
    r->rc = si_context_init(r->llm, p, &ctx);
    struct si_generate_params gp = si_generate_default_params();
    gp.n_predict = N_GEN;
    gp.ignore_eos = true;
    for (int k = 0; k < ROUNDS && r->rc == SI_OK; k++) {
        si_context_reset(ctx);
        struct collect c = {r->ids[k], &r->n[k]};
        r->rc = si_generate(ctx, r->prompt, gp, collect_cb, &c, NULL);
    }
    snprintf(r->msg, sizeof r->msg, "%s", si_last_error());
    si_context_free(ctx);
    return NULL;
}

static void test_two_threads(struct si_llm *llm, enum si_engine_kind engine)
{
    struct run alone[2] = {{llm, engine, "hello there", {{0}}, {0}, 0, ""},
                           {llm, engine, "the cat sat on", {{0}}, {0}, 0, ""}};
    struct run both[2];
    memcpy(both, alone, sizeof both);
    for (int t = 0; t < 2; t++) {
        run_thread(&alone[t]);
        CHECK(alone[t].rc == SI_OK, "alone %d: %s", t, alone[t].msg);
    }
    CHECK(memcmp(alone[0].ids[0], alone[1].ids[0], sizeof alone[0].ids[0]) != 0,
          "the two prompts gave the same tokens: the comparison would not see a mix-up");
    pthread_t th[2];
    for (int t = 0; t < 2; t++)
        CHECK(pthread_create(&th[t], NULL, run_thread, &both[t]) == 0, "pthread_create");
    for (int t = 0; t < 2; t++)
        pthread_join(th[t], NULL);
    for (int t = 0; t < 2; t++) {
        CHECK(both[t].rc == SI_OK, "%s, thread %d: %s", si_engine_kind_name(engine), t,
              both[t].msg);
        for (int k = 0; k < ROUNDS; k++)
            CHECK(both[t].n[k] == N_GEN &&
                      !memcmp(both[t].ids[k], alone[t].ids[0], sizeof alone[t].ids[0]),
                  "%s, thread %d, round %d: other tokens than alone", si_engine_kind_name(engine),
                  t, k);
    }
    printf("two threads on one model (%s): %d x %d tokens each, the same as alone\n",
           si_engine_kind_name(engine), ROUNDS, N_GEN);
}

/* ----------------------------------------------------------------- misuse */

static void test_freed_handles(struct si_llm *llm, const char *model_path)
{
    struct si_context *ctx = make(llm, SI_ENGINE_REF, 16);
    si_context_free(ctx);
    CHECK(!strcmp(si_last_error(), "") || !contains(si_last_error(), "si_context_free"),
          "a good free left a message: %s", si_last_error());
    si_context_free(ctx); /* twice: refused, nothing freed */
    CHECK(contains(si_last_error(), "si_context_free: not a live context"), "double free: %s",
          si_last_error());
    CHECK(si_context_eval(ctx, 1) == SI_E_INVALID &&
              contains(si_last_error(), "si_context_eval: not a live context"),
          "eval after free: %s", si_last_error());
    CHECK(si_context_n_past(ctx) == SI_E_INVALID && si_context_tokens(ctx) == NULL &&
              si_context_logits(ctx) == NULL && si_context_llm(ctx) == NULL,
          "queries after free");
    struct si_stats st;
    memset(&st, 0x55, sizeof st);
    si_context_get_stats(ctx, &st);
    CHECK(st.decode_tokens == 0 && contains(si_last_error(), "si_context_get_stats"),
          "stats after free");
    CHECK(si_generate(ctx, "x", si_generate_default_params(), NULL, NULL, NULL) == SI_E_INVALID,
          "generate after free");
    /* Not a handle at all. */
    int junk[64] = {0};
    CHECK(si_context_eval((struct si_context *)junk, 1) == SI_E_INVALID &&
              contains(si_last_error(), "not a live context"),
          "a pointer that is not a context: %s", si_last_error());
    si_context_free((struct si_context *)junk);
    si_llm_free((struct si_llm *)junk);
    CHECK(contains(si_last_error(), "si_llm_free: not a live model"), "junk model: %s",
          si_last_error());

    /* A model freed under its context: refused, the context keeps working. */
    struct si_llm *m2 = NULL;
    CHECK(si_llm_load(model_path, si_llm_default_params(), &m2) == SI_OK, "load: %s",
          si_last_error());
    if (m2 == NULL)
        return;
    struct si_context *c2 = make(m2, SI_ENGINE_REF, 16);
    si_llm_free(m2);
    CHECK(contains(si_last_error(), "1 context made from the model is still live"),
          "model freed under its context: %s", si_last_error());
    CHECK(c2 != NULL && si_context_eval(c2, 1) == SI_OK && si_llm_n_vocab(m2) > 0,
          "the context after the refused free: %s", si_last_error());
    si_context_free(c2);
    si_llm_free(m2);
    si_llm_free(m2); /* twice */
    CHECK(contains(si_last_error(), "si_llm_free: not a live model"), "model freed twice: %s",
          si_last_error());
    struct si_context *c3 = NULL;
    CHECK(si_context_init(m2, si_context_default_params(), &c3) == SI_E_INVALID && c3 == NULL &&
              contains(si_last_error(), "not a live model"),
          "a context of a freed model: %s", si_last_error());
}

/* A call into the context from its own generation's callback: refused (the
 * context is in use), and the generation goes on unharmed. */
struct reenter {
    struct si_context *ctx;
    int rc_eval, rc_free, calls;
    char msg[512];
};

static bool reenter_cb(void *user, int32_t token, const char *text, size_t len)
{
    (void)token;
    (void)text;
    (void)len;
    struct reenter *r = user;
    if (r->calls++ == 1) {
        r->rc_eval = si_context_eval(r->ctx, 1);
        snprintf(r->msg, sizeof r->msg, "%s", si_last_error());
        si_context_free(r->ctx); /* refused too: the generation holds it */
        r->rc_free = contains(si_last_error(), "si_context_free: the context is in use") ? 0 : -1;
    }
    return true;
}

static void test_reentry(struct si_llm *llm)
{
    struct si_context *ctx = make(llm, SI_ENGINE_REF, 64);
    if (ctx == NULL)
        return;
    struct si_generate_params gp = si_generate_default_params();
    gp.n_predict = 6;
    gp.ignore_eos = true;
    struct reenter r = {ctx, 0, 0, 0, ""};
    struct si_generate_result res;
    const int rc = si_generate(ctx, "hello", gp, reenter_cb, &r, &res);
    CHECK(r.rc_eval == SI_E_INVALID && contains(r.msg, "si_context_eval: the context is in use"),
          "eval from the callback: %d, %s", r.rc_eval, r.msg);
    CHECK(r.rc_free == 0, "free from the callback was not refused: %s", si_last_error());
    CHECK(rc == SI_OK && res.n_generated == 6, "the generation after the refusals: %s",
          si_last_error());
    CHECK(si_context_eval(ctx, 1) == SI_OK, "eval after the generation: %s", si_last_error());
    si_context_free(ctx);
}

/* Evaluations after failed ones: a bad token, a full context.  The context
 * goes on as if the failed call had not happened. */
static void test_after_errors(struct si_llm *llm)
{
    struct si_context *a = make(llm, SI_ENGINE_REF, 4), *b = make(llm, SI_ENGINE_REF, 4);
    if (a == NULL || b == NULL) {
        si_context_free(a);
        si_context_free(b);
        return;
    }
    const int32_t nv = si_llm_n_vocab(llm);
    CHECK(si_context_eval(a, 1) == SI_OK, "eval");
    CHECK(si_context_eval(a, nv) == SI_E_INVALID && contains(si_last_error(), "vocabulary"),
          "bad token: %s", si_last_error());
    int32_t bad[] = {2, -1};
    CHECK(si_context_eval_batch(a, bad, 2) == SI_E_INVALID, "bad batch");
    CHECK(si_context_n_past(a) == 1, "n_past after the failures: %d", si_context_n_past(a));
    int32_t t[] = {1, 2, 3, 4};
    CHECK(si_context_eval_batch(a, t + 1, 3) == SI_OK, "eval after the failures: %s",
          si_last_error());
    CHECK(si_context_eval_batch(b, t, 4) == SI_OK, "the same tokens on a fresh context");
    CHECK(!memcmp(si_context_logits(a), si_context_logits(b), (size_t)nv * sizeof(float)),
          "the failed calls changed the logits");
    CHECK(si_context_eval(a, 5) == SI_E_BUDGET && contains(si_last_error(), "is full"),
          "full: %s", si_last_error());
    CHECK(si_context_rewind(a, 3) == SI_OK && si_context_eval(a, 4) == SI_OK,
          "eval after rewinding a full context: %s", si_last_error());
    CHECK(!memcmp(si_context_logits(a), si_context_logits(b), (size_t)nv * sizeof(float)),
          "the re-evaluated last position");
    si_context_free(a);
    si_context_free(b);
}

int main(void)
{
    if (mkdtemp(dir) == NULL) {
        perror("mkdtemp");
        return 1;
    }
    char model_path[256], err[512];
    snprintf(model_path, sizeof model_path, "%s/tiny.gguf", dir);
    struct si_synth_params sp = si_synth_default_params();
    si_synth_preset("tiny", &sp);
    sp.arch = SI_SYNTH_LLAMA_RELU;
    sp.type = SI_TYPE_F16;
    sp.seed = 5;
    int rc = si_synth_write(&sp, model_path, err, sizeof err);
    CHECK(rc == SI_OK, "synth: %s", err);
    struct si_llm *llm = NULL;
    if (rc == SI_OK)
        CHECK(si_llm_load(model_path, si_llm_default_params(), &llm) == SI_OK, "load: %s",
              si_last_error());
    if (llm != NULL) {
        test_freed_handles(llm, model_path);
        test_reentry(llm);
        test_after_errors(llm);
        test_two_threads(llm, SI_ENGINE_REF);
        test_two_threads(llm, SI_ENGINE_STARPU);
        si_llm_free(llm);
    }
    unlink(model_path);
    rmdir(dir);
    return test_result();
}
