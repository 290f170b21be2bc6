/*
 * test-shared.c - contexts sharing one engine (si_context_init_shared):
 * three contexts generating at once, each on its thread, get the greedy
 * tokens each prompt gets from a context of its own, in dense and gate
 * mode, on a synthetic ReLU model (F16 and Q4_0) and, with
 * STARINFER_TEST_MODEL, on SmolLM2; and their steps did decode them
 * together (more than one context per step).  Prompts of 7, 45 and 70
 * tokens: the short one goes with the others' decoding, the long ones in
 * steps of their own between; with batches of 16 tokens they take several
 * (the last one under 8 tokens), with batches of 4 the short one too.  Then the refusals, and contexts freed in
 * any order.
 */
#include "model/pack8.h"
#include "model/synth.h"
#include "model/types.h"
#include "starinfer.h"
#include "test.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

enum { N_CTX_SHARED = 3, N_GEN = 24, N_PROMPT_MAX = 80 };

static char dir[] = "/tmp/si-test-shared-XXXXXX";

/* Prompts of 7, 45 and 70 tokens: the last two more than a step's chunk
 * (32), the last one over 64 (tiled attention, as its own batch). */
static const int prompt_len[N_CTX_SHARED] = {7, 45, 70};

static void prompt_of(int k, int32_t n_vocab, int32_t bos, int32_t *out)
{
    for (int i = 0; i < prompt_len[k]; i++)
        out[i] = i == 0 && bos >= 0 ? bos : (int32_t)((i * 37 + 11 * k + 5) % n_vocab);
}

struct job {
    struct si_context *ctx;
    pthread_barrier_t *first; /* met at the first token, or NULL */
    int32_t prompt[N_PROMPT_MAX];
    int n_prompt;
    int32_t ids[N_GEN];
    int n;
    int rc;
    char msg[512];
};

static bool collect(void *user, int32_t token, const char *text, size_t len)
{
    (void)text;
    (void)len;
    struct job *j = user;
    if (token >= 0 && j->n < N_GEN)
        j->ids[j->n++] = token;
    /* every context past its prompt before any decodes on: a tiny model's
     * whole generation could otherwise end before another thread starts */
    if (j->n == 1 && j->first != NULL)
        pthread_barrier_wait(j->first);
    return true;
}

static void *run(void *v)
{
    struct job *j = v;
    struct si_generate_params gp = si_generate_default_params();
    gp.n_predict = N_GEN;
    gp.ignore_eos = true;
    si_context_reset(j->ctx);
    j->n = 0;
    j->rc = si_generate_tokens(j->ctx, j->prompt, j->n_prompt, gp, collect, j, NULL);
    snprintf(j->msg, sizeof j->msg, "%s", si_last_error());
    return NULL;
}

static struct si_context_params params(enum si_sparsity_mode mode, int32_t n_batch,
                                        enum si_prefill_mode arith)
{
    struct si_context_params p = si_context_default_params();
    p.n_batch = n_batch;
    p.shared_arith = arith;
    p.n_ctx = 128;
    p.sparsity = mode;
    p.sampling.temp = 0.0f;
    p.caller_worker = false;
    return p;
}

/*
 * Three prompts alone, then on three shared contexts at once (twice, the
 * prompts on other contexts the second time).  Alone: with decoding's
 * arithmetic (exact), on contexts of their own; with the batched kernels'
 * (int8), on the shared contexts one at a time, every token a step of its
 * own, which is the arithmetic they are to keep beside the others.
 */
static void compare(const char *label, struct si_llm *llm, enum si_sparsity_mode mode,
                    int32_t n_batch, enum si_prefill_mode arith)
{
    const int32_t nv = si_llm_n_vocab(llm), bos = si_llm_adds_bos(llm) ? si_llm_token_bos(llm) : -1;
    struct job alone[N_CTX_SHARED];
    memset(alone, 0, sizeof alone);
    struct si_context_params p = params(mode, n_batch, arith);
    struct si_context *ctx[N_CTX_SHARED] = {NULL};
    CHECK(si_context_init(llm, p, &ctx[0]) == SI_OK, "%s: first context: %s", label,
          si_last_error());
    for (int c = 1; c < N_CTX_SHARED && ctx[0] != NULL; c++)
        CHECK(si_context_init_shared(ctx[0], &ctx[c]) == SI_OK, "%s: shared context %d: %s",
              label, c, si_last_error());
    if (ctx[N_CTX_SHARED - 1] == NULL)
        return;
    for (int k = 0; k < N_CTX_SHARED; k++) {
        struct job *j = &alone[k];
        prompt_of(k, nv, bos, j->prompt);
        j->n_prompt = prompt_len[k];
        if (arith == SI_PREFILL_EXACT) {
            CHECK(si_context_init(llm, p, &j->ctx) == SI_OK, "%s: context: %s", label,
                  si_last_error());
            if (j->ctx == NULL)
                return;
        } else {
            j->ctx = ctx[(k + 1) % N_CTX_SHARED];
        }
        run(j);
        CHECK(j->rc == SI_OK && j->n == N_GEN, "%s: alone %d: %s", label, k, j->msg);
        if (arith == SI_PREFILL_EXACT)
            si_context_free(j->ctx);
    }
    CHECK(memcmp(alone[0].ids, alone[1].ids, sizeof alone[0].ids) != 0,
          "%s: two prompts gave the same tokens: the comparison would not see a mix-up", label);
    for (int round = 0; round < 2; round++) {
        struct job both[N_CTX_SHARED];
        memset(both, 0, sizeof both);
        pthread_t th[N_CTX_SHARED];
        pthread_barrier_t first;
        pthread_barrier_init(&first, NULL, N_CTX_SHARED);
        for (int c = 0; c < N_CTX_SHARED; c++) {
            const int k = (c + round) % N_CTX_SHARED;
            memcpy(both[c].prompt, alone[k].prompt, sizeof alone[k].prompt);
            both[c].n_prompt = alone[k].n_prompt;
            both[c].ctx = ctx[c];
            both[c].first = &first;
            si_context_reset_stats(ctx[c]);
        }
        for (int c = 0; c < N_CTX_SHARED; c++)
            CHECK(pthread_create(&th[c], NULL, run, &both[c]) == 0, "pthread_create");
        for (int c = 0; c < N_CTX_SHARED; c++)
            pthread_join(th[c], NULL);
        pthread_barrier_destroy(&first);
        for (int c = 0; c < N_CTX_SHARED; c++) {
            const int k = (c + round) % N_CTX_SHARED;
            CHECK(both[c].rc == SI_OK, "%s, round %d, context %d: %s", label, round, c,
                  both[c].msg);
            int same = 0;
            while (same < N_GEN && both[c].ids[same] == alone[k].ids[same])
                same++;
            CHECK(both[c].n == N_GEN && same == N_GEN,
                  "%s, round %d, context %d (prompt %d): token %d differs from alone", label,
                  round, c, k, same);
            CHECK(si_context_n_past(ctx[c]) == prompt_len[k] + N_GEN - 1,
                  "%s: context %d holds %d tokens, not %d", label, c, si_context_n_past(ctx[c]),
                  prompt_len[k] + N_GEN - 1);
        }
        struct si_stats st;
        si_context_get_stats(ctx[0], &st);
        CHECK(st.shared_steps > 0 && st.shared_seqs > st.shared_steps,
              "%s, round %d: %lld steps for %lld sequences: the contexts were not decoded "
              "together",
              label, round, (long long)st.shared_steps, (long long)st.shared_seqs);
        printf("%-34s round %d: %d contexts x %d tokens as alone; %lld steps, %.2f contexts "
               "a step\n",
               label, round, N_CTX_SHARED, N_GEN, (long long)st.shared_steps,
               st.shared_steps > 0 ? (double)st.shared_seqs / (double)st.shared_steps : 0.0);
    }
    /* the first context goes first; the others go on, on the engine */
    si_context_free(ctx[0]);
    struct job again = {.ctx = ctx[2], .n_prompt = alone[1].n_prompt};
    memcpy(again.prompt, alone[1].prompt, sizeof again.prompt);
    run(&again);
    CHECK(again.rc == SI_OK && !memcmp(again.ids, alone[1].ids, sizeof again.ids),
          "%s: a shared context after the first's free: %s", label, again.msg);
    si_context_free(ctx[2]);
    si_context_free(ctx[1]);
}

static void refusals(struct si_llm *llm)
{
    struct si_context *first = NULL, *out = NULL;
    CHECK(si_context_init_shared(NULL, &out) == SI_E_INVALID && out == NULL, "NULL first");
    struct si_context_params p = params(SI_SPARSE_DENSE, 0, SI_PREFILL_AUTO);
    p.engine = SI_ENGINE_REF;
    CHECK(si_context_init(llm, p, &first) == SI_OK, "reference context: %s", si_last_error());
    CHECK(si_context_init_shared(first, NULL) == SI_E_INVALID, "NULL out");
    CHECK(si_context_init_shared(first, &out) == SI_E_UNSUPPORTED && out == NULL &&
              strstr(si_last_error(), "reference engine") != NULL,
          "shared on the reference: %s", si_last_error());
    si_context_free(first);
    p = params(SI_SPARSE_DENSE, 1, SI_PREFILL_AUTO);
    CHECK(si_context_init(llm, p, &first) == SI_OK, "n_batch 1 context: %s", si_last_error());
    CHECK(si_context_init_shared(first, &out) == SI_E_UNSUPPORTED && out == NULL &&
              strstr(si_last_error(), "no batches") != NULL,
          "shared without batches: %s", si_last_error());
    si_context_free(first);
    CHECK(si_context_init_shared(first, &out) == SI_E_INVALID &&
              strstr(si_last_error(), "not a live context") != NULL,
          "shared on a freed context: %s", si_last_error());
    struct si_context *none = NULL;
    p = params(SI_SPARSE_DENSE, 0, SI_PREFILL_BLAS);
    CHECK(si_context_init(llm, p, &none) == SI_E_INVALID && none == NULL &&
              strstr(si_last_error(), "shared_arith: blas is refused") != NULL,
          "shared_arith blas: %s", si_last_error());
}

static struct si_llm *synth(const char *name, uint32_t type)
{
    char path[256], err[512];
    snprintf(path, sizeof path, "%s/%s.gguf", dir, name);
    struct si_synth_params sp = si_synth_default_params();
    si_synth_preset("tiny", &sp);
    sp.arch = SI_SYNTH_LLAMA_RELU;
    sp.type = type;
    sp.seed = 11;
    int rc = si_synth_write(&sp, path, err, sizeof err);
    CHECK(rc == SI_OK, "synth: %s", err);
    struct si_llm *llm = NULL;
    if (rc == SI_OK)
        CHECK(si_llm_load(path, si_llm_default_params(), &llm) == SI_OK, "load: %s",
              si_last_error());
    unlink(path);
    return llm;
}

int main(void)
{
    if (mkdtemp(dir) == NULL) {
        perror("mkdtemp");
        return 1;
    }
    const uint32_t types[2] = {SI_TYPE_F16, SI_TYPE_Q4_0};
    const char *int8 = si_gemm8_missing(); /* NULL: the int8 steps run here */
    if (int8 != NULL)
        printf("note: the int8 steps not compared: %s\n", int8);
    for (int t = 0; t < 2; t++) {
        struct si_llm *llm = synth(t == 0 ? "f16" : "q4_0", types[t]);
        if (llm == NULL)
            continue;
        char label[64];
        snprintf(label, sizeof label, "tiny llama-relu %s dense", t == 0 ? "F16" : "Q4_0");
        compare(label, llm, SI_SPARSE_DENSE, 0, SI_PREFILL_EXACT);
        snprintf(label, sizeof label, "tiny llama-relu %s gate", t == 0 ? "F16" : "Q4_0");
        compare(label, llm, SI_SPARSE_GATE, 0, SI_PREFILL_EXACT);
        if (t == 0) {
            refusals(llm);
        } else {
            /* prompts in several batches, the last under 8 tokens (70 =
             * 4 x 16 + 6: the reference's arithmetic, as decoding) */
            compare("tiny llama-relu Q4_0 dense, n_batch 16", llm, SI_SPARSE_DENSE, 16,
                    SI_PREFILL_EXACT);
            compare("tiny llama-relu Q4_0 gate, n_batch 16", llm, SI_SPARSE_GATE, 16,
                    SI_PREFILL_EXACT);
            /* a batch shorter than a short prompt: the 7-token one in pieces */
            compare("tiny llama-relu Q4_0 dense, n_batch 4", llm, SI_SPARSE_DENSE, 4,
                    SI_PREFILL_EXACT);
            if (int8 == NULL) {
                compare("tiny llama-relu Q4_0 dense, int8", llm, SI_SPARSE_DENSE, 0,
                        SI_PREFILL_INT8);
                compare("tiny llama-relu Q4_0 gate, int8", llm, SI_SPARSE_GATE, 0,
                        SI_PREFILL_INT8);
                compare("tiny llama-relu Q4_0 dense, int8, n_batch 16", llm, SI_SPARSE_DENSE, 16,
                        SI_PREFILL_INT8);
            }
        }
        si_llm_free(llm);
    }
    const char *path = getenv("STARINFER_TEST_MODEL");
    struct si_llm *llm = NULL;
    if (path != NULL && si_llm_load(path, si_llm_default_params(), &llm) == SI_OK) {
        /* Under the sanitizers (make check-short's SI_SAN_FLAGS) one
         * configuration: the others' paths are the synthetic models' too,
         * and SmolLM2 takes a minute there instead of seconds. */
        const char *san = getenv("SI_SAN_FLAGS");
        const bool all = san == NULL || san[0] == '\0';
        compare("SmolLM2-135M Q4_1 dense", llm, SI_SPARSE_DENSE, 0, SI_PREFILL_EXACT);
        if (!all)
            printf("note: under the sanitizers SmolLM2 in dense mode only\n");
        if (all)
            compare("SmolLM2-135M Q4_1 gate", llm, SI_SPARSE_GATE, 0, SI_PREFILL_EXACT);
        if (all)
            compare("SmolLM2-135M Q4_1 dense, n_batch 16", llm, SI_SPARSE_DENSE, 16,
                    SI_PREFILL_EXACT);
        if (all && int8 == NULL) {
            compare("SmolLM2-135M Q4_1 dense, int8", llm, SI_SPARSE_DENSE, 0, SI_PREFILL_INT8);
            compare("SmolLM2-135M Q4_1 gate, int8", llm, SI_SPARSE_GATE, 0, SI_PREFILL_INT8);
        }
        si_llm_free(llm);
    } else {
        printf("note: STARINFER_TEST_MODEL not set or not loadable; SmolLM2 not compared\n");
    }
    rmdir(dir);
    return test_result();
}
