/*
 * test-api.c - the public API (include/starinfer.h) on tiny synthetic models:
 * load errors with their status and message, metadata, tokenize/detokenize,
 * the chat template, greedy generation against the reference's own greedy
 * tokens (computed here from the internals, independently of the API) on
 * both engines, the streaming callback (whole UTF-8 characters, stopping),
 * stats, KV rewind and prefix reuse, bad parameters, the DRAM budget, the
 * FFN pages gate mode copies leaving the file mapping, and
 * the library starting StarPU with the first context and stopping it with
 * the last.
 */
#include "starinfer.h"

#include "model/forward.h"
#include "model/model.h"
#include "model/synth.h"
#include "model/tokenizer.h"
#include "model/types.h"
#include "predict/train.h"
#include "test.h"

#include <math.h>
#include <pthread.h>
#include <starpu.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char dir[] = "/tmp/si-test-api-XXXXXX";

static void path_in(char *out, size_t n, const char *name)
{
    snprintf(out, n, "%s/%s", dir, name);
}

static bool contains(const char *s, const char *needle)
{
    return s != NULL && strstr(s, needle) != NULL;
}

/* ------------------------------------------------------------ load errors */

static void write_bytes(const char *path, const void *p, size_t n)
{
    FILE *f = fopen(path, "wb");
    if (f == NULL)
        return;
    fwrite(p, 1, n, f);
    fclose(f);
}

static void test_load_errors(const char *model_path)
{
    char path[256];
    for (int mm = 0; mm < 2; mm++) {
        struct si_llm_params lp = si_llm_default_params();
        lp.use_mmap = mm == 0;
        struct si_llm *llm = (struct si_llm *)&lp; /* must be set to NULL on failure */

        path_in(path, sizeof path, "missing.gguf");
        int rc = si_llm_load(path, lp, &llm);
        CHECK(rc == SI_E_NOT_FOUND, "missing file (mmap %d): %d", !mm, rc);
        CHECK(llm == NULL, "out not cleared on failure");
        CHECK(contains(si_last_error(), "missing.gguf: No such file or directory"),
              "missing file message: %s", si_last_error());

        path_in(path, sizeof path, "text.gguf");
        write_bytes(path, "hello world, not a model", 24);
        rc = si_llm_load(path, lp, &llm);
        CHECK(rc == SI_E_FORMAT, "text file (mmap %d): %d", !mm, rc);
        CHECK(contains(si_last_error(), "text.gguf: not a GGUF file (magic 'hell')"),
              "bad magic message: %s", si_last_error());

        path_in(path, sizeof path, "empty.gguf");
        write_bytes(path, "", 0);
        rc = si_llm_load(path, lp, &llm);
        CHECK(rc < 0 && contains(si_last_error(), "empty.gguf: ") &&
                  contains(si_last_error(), "empty file"),
              "empty file (mmap %d): %d %s", !mm, rc, si_last_error());

        /* A real model cut short: the header claims more than the file holds. */
        FILE *f = fopen(model_path, "rb");
        char head[3000];
        size_t got = f != NULL ? fread(head, 1, sizeof head, f) : 0;
        if (f != NULL)
            fclose(f);
        path_in(path, sizeof path, "cut.gguf");
        write_bytes(path, head, got);
        rc = si_llm_load(path, lp, &llm);
        CHECK(rc == SI_E_FORMAT && contains(si_last_error(), "cut.gguf: truncated file"),
              "truncated file (mmap %d): %d %s", !mm, rc, si_last_error());

        rc = si_llm_load(dir, lp, &llm);
        CHECK(rc == SI_E_IO && contains(si_last_error(), "not a regular file"),
              "a folder (mmap %d): %d %s", !mm, rc, si_last_error());
    }
    struct si_llm *llm = NULL;
    CHECK(si_llm_load(NULL, si_llm_default_params(), &llm) == SI_E_INVALID, "NULL path");
    CHECK(si_llm_load(model_path, si_llm_default_params(), NULL) == SI_E_INVALID, "NULL out");
    si_llm_free(NULL);
    si_context_free(NULL);
}

/* ------------------------------------------------------- predictor files */

/* n values in [-0.5, 0.5) from the LCG state *s (nothing when p is NULL). */
static void fill_uniform(float *p, int64_t n, uint64_t *s)
{
    for (int64_t i = 0; p != NULL && i < n; i++)
        p[i] = (float)((*s = *s * 6364136223846793005ull + 1) >> 40) / 16777216.0f - 0.5f;
}

/*
 * si_llm_params.predictors: a predictor file (random predictors of width 32
 * written as train-predictor --predictors-only writes them) gives the
 * tiny model, which has none, its predictors, mapped or read; files that are
 * no predictor file for it are refused with their reason and no model.
 */
static void test_predictor_file(const char *model_path)
{
    char err[512], pred[256], path[256];
    struct si_model *m = NULL;
    CHECK(si_model_load(&m, model_path, err, sizeof err) == SI_OK, "internal load: %s", err);
    if (m == NULL)
        return;
    const int32_t nl = m->hp.n_layer, d = m->hp.n_embd, ff = m->hp.n_ff, r = 32;
    struct si_train_layer *layers = calloc((size_t)nl, sizeof *layers);
    uint64_t s = 1;
    for (int32_t l = 0; layers != NULL && l < nl; l++) {
        layers[l].rank = r;
        layers[l].fc1 = malloc((size_t)r * (size_t)d * sizeof(float));
        layers[l].fc2 = malloc((size_t)ff * (size_t)r * sizeof(float));
        fill_uniform(layers[l].fc1, (int64_t)r * d, &s);
        fill_uniform(layers[l].fc2, (int64_t)ff * r, &s);
    }
    path_in(pred, sizeof pred, "tiny.pred");
    struct si_train_write_params wp = {
        .type = SI_TYPE_F16, .threshold = 0.25f, .input = SI_PRED_FFN, .predictors_only = true};
    CHECK(layers != NULL && si_train_write(m, layers, &wp, pred, err, sizeof err) == SI_OK,
          "write a predictor file: %s", err);
    for (int32_t l = 0; layers != NULL && l < nl; l++)
        si_train_layer_clear(&layers[l]);
    free(layers);
    si_model_free(m);

    for (int mm = 0; mm < 2; mm++) {
        struct si_llm_params lp = si_llm_default_params();
        lp.use_mmap = mm == 0;
        struct si_llm *llm = NULL;
        CHECK(si_llm_load(model_path, lp, &llm) == SI_OK && !si_llm_has_predictor(llm),
              "the tiny model has no predictors of its own");
        si_llm_free(llm);
        llm = NULL;
        lp.predictors = pred;
        CHECK(si_llm_load(model_path, lp, &llm) == SI_OK, "load with a predictor file: %s",
              si_last_error());
        if (llm == NULL)
            continue;
        CHECK(si_llm_has_predictor(llm), "the predictor file's predictors");
        struct si_context_params cp = si_context_default_params();
        cp.engine = SI_ENGINE_STARPU;
        cp.sparsity = SI_SPARSE_PREDICTOR;
        struct si_context *ctx = NULL;
        CHECK(si_context_init(llm, cp, &ctx) == SI_OK,
              "predictor mode on the file's predictors: %s", si_last_error());
        const int32_t tok = 3;
        CHECK(ctx == NULL || si_context_eval(ctx, tok) == SI_OK, "a token in predictor mode: %s",
              si_last_error());
        si_context_free(ctx);
        si_llm_free(llm);
    }
    struct si_llm_params lp = si_llm_default_params();
    struct si_llm *llm = (struct si_llm *)&lp; /* must be set to NULL on failure */
    lp.predictors = model_path;
    CHECK(si_llm_load(model_path, lp, &llm) == SI_E_FORMAT && llm == NULL &&
              contains(si_last_error(), "tiny.gguf: not a predictor file"),
          "a model as the predictor file: %s", si_last_error());
    path_in(path, sizeof path, "missing.pred");
    lp.predictors = path;
    CHECK(si_llm_load(model_path, lp, &llm) == SI_E_NOT_FOUND && llm == NULL &&
              contains(si_last_error(), "missing.pred: No such file or directory"),
          "a missing predictor file: %s", si_last_error());
    lp.predictors = pred;
    CHECK(si_llm_load(pred, lp, &llm) == SI_E_FORMAT &&
              contains(si_last_error(), "a predictor file (train-predictor --predictors-only"),
          "the predictor file as a model: %s", si_last_error());
    unlink(pred);
}

/* -------------------------------------------------------- the reference */

/* Greedy tokens from the internals: reference state, prompt, argmax (lowest
 * id on ties, as the sampler's greedy rule). */
static int ref_greedy(const char *model_path, const int32_t *prompt, int n_prompt, int n_gen,
                      int32_t *out)
{
    char err[512];
    struct si_model *m = NULL;
    struct si_ref *ref = NULL;
    if (si_model_load(&m, model_path, err, sizeof err) != SI_OK)
        return -1;
    struct si_ref_params rp = si_ref_default_params();
    rp.n_ctx = 128;
    if (si_ref_init(&ref, m, rp, err, sizeof err) != SI_OK) {
        si_model_free(m);
        return -1;
    }
    int rc = 0;
    for (int i = 0; i < n_prompt && rc == 0; i++)
        rc = si_ref_eval(ref, prompt[i]) == SI_OK ? 0 : -1;
    for (int g = 0; g < n_gen && rc == 0; g++) {
        int32_t best = 0;
        for (int32_t v = 1; v < m->hp.n_vocab; v++)
            if (ref->logits[v] > ref->logits[best])
                best = v;
        out[g] = best;
        if (g + 1 < n_gen)
            rc = si_ref_eval(ref, best) == SI_OK ? 0 : -1;
    }
    si_ref_free(ref);
    si_model_free(m);
    return rc;
}

/* ------------------------------------------------------------- callbacks */

struct collect {
    int32_t ids[256];
    int n;
    char text[4096];
    size_t len;
    int stop_after; /* 0: never */
    int calls;
    bool split_char; /* a chunk ended inside a UTF-8 character */
    bool tail;       /* the token -1 call came */
};

/* Whether s[0..n) ends inside a UTF-8 character (an independent check). */
static bool ends_inside_char(const char *s, size_t n)
{
    size_t i = n;
    size_t cont = 0;
    while (i > 0 && ((unsigned char)s[i - 1] & 0xC0) == 0x80 && cont < 4) {
        i--;
        cont++;
    }
    if (i == 0)
        return false;
    const unsigned char c = (unsigned char)s[i - 1];
    size_t need = c >= 0xF0 && c < 0xF8   ? 3
                  : c >= 0xE0 && c < 0xF0 ? 2
                  : c >= 0xC0 && c < 0xE0 ? 1
                                          : 0;
    return need > cont;
}

static bool collect_cb(void *user, int32_t token, const char *text, size_t len)
{
    struct collect *c = user;
    c->calls++;
    if (token < 0) {
        c->tail = true;
    } else {
        if (c->n < 256)
            c->ids[c->n++] = token;
        if (ends_inside_char(text, len))
            c->split_char = true;
    }
    if (c->len + len < sizeof c->text) {
        memcpy(c->text + c->len, text, len);
        c->len += len;
    }
    return c->stop_after == 0 || c->calls < c->stop_after;
}

/* ----------------------------------------------------------- the tests */

static void test_model_queries(struct si_llm *llm)
{
    CHECK(!strcmp(si_llm_arch(llm), "llama"), "arch %s", si_llm_arch(llm));
    CHECK(si_llm_n_layer(llm) == 2 && si_llm_n_ff(llm) == 256, "shape %d x %d",
          si_llm_n_layer(llm), si_llm_n_ff(llm));
    CHECK(si_llm_n_vocab(llm) > 256, "vocab %d", si_llm_n_vocab(llm));
    CHECK(si_llm_n_ctx_train(llm) > 0 && si_llm_n_embd(llm) > 0 && si_llm_n_head(llm) > 0,
          "hyperparameters");
    CHECK(si_llm_weight_bytes(llm) > 0, "weight bytes");
    CHECK(si_llm_name(llm) != NULL, "name never NULL");
    char buf[64];
    int64_t n = si_llm_meta_str(llm, "general.architecture", buf, sizeof buf);
    CHECK(n == 5 && !strcmp(buf, "llama"), "meta_str: %lld %s", (long long)n, buf);
    CHECK(si_llm_meta_str(llm, "no.such.key", buf, sizeof buf) == SI_E_NOT_FOUND, "missing key");
    CHECK(contains(si_last_error(), "no.such.key"), "missing key message: %s", si_last_error());
    CHECK(si_llm_meta_str(llm, "general.architecture", buf, 3) == 5 && !strcmp(buf, "ll"),
          "meta_str truncated: %s", buf);
}

static void test_tokens(struct si_llm *llm)
{
    const char *text = "The quick brown fox, caf\xc3\xa9 \xe2\x82\xac 12!";
    int32_t ids[128];
    int64_t n = si_llm_tokenize(llm, text, strlen(text), false, false, ids, 128);
    CHECK(n > 0 && n < 128, "tokenize: %lld", (long long)n);
    int64_t counted = si_llm_tokenize(llm, text, strlen(text), false, false, NULL, 0);
    CHECK(counted == n, "counting: %lld vs %lld", (long long)counted, (long long)n);
    char back[256];
    int64_t len = si_llm_detokenize(llm, ids, (size_t)n, false, back, sizeof back);
    CHECK(len == (int64_t)strlen(text) && !strcmp(back, text), "round trip: '%s'", back);
    /* Too small a buffer: the whole length, a NUL-terminated part. */
    len = si_llm_detokenize(llm, ids, (size_t)n, false, back, 5);
    CHECK(len == (int64_t)strlen(text) && strlen(back) == 4, "short buffer: %lld '%s'",
          (long long)len, back);
    /* BOS first when asked (the synthetic model has one). */
    int32_t bos = si_llm_token_bos(llm);
    int64_t nb = si_llm_tokenize(llm, text, strlen(text), true, false, ids, 128);
    CHECK(bos >= 0 && nb == n + 1 && ids[0] == bos, "add_bos: %lld tokens, first %d, bos %d",
          (long long)nb, ids[0], bos);
    CHECK(si_llm_token_is_eog(llm, si_llm_token_eos(llm)), "EOS is end of generation");
    int32_t bad = si_llm_n_vocab(llm);
    CHECK(si_llm_detokenize(llm, &bad, 1, false, back, sizeof back) == SI_E_INVALID &&
              contains(si_last_error(), "outside the vocabulary"),
          "bad id: %s", si_last_error());
    CHECK(si_llm_token_to_piece(llm, 'A', false, back, sizeof back) == 1 && back[0] == 'A',
          "piece of a byte token");

    struct si_chat_message msgs[] = {{"system", "Be brief."}, {"user", "Hi?"}};
    char chat[512];
    int64_t cl = si_llm_chat_apply(llm, msgs, 2, true, chat, sizeof chat);
    CHECK(cl > 0 && (size_t)cl == strlen(chat), "chat length %lld", (long long)cl);
    CHECK(contains(chat, "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi?") &&
              contains(chat, "<|im_start|>assistant\n"),
          "chatml: %s", chat);
    CHECK(si_llm_chat_apply(llm, msgs, 2, true, NULL, 0) == cl, "chat length query");
    struct si_chat_message bad_msg = {NULL, "x"};
    CHECK(si_llm_chat_apply(llm, &bad_msg, 1, true, chat, sizeof chat) == SI_E_INVALID,
          "message without role");
}

static void test_bad_params(struct si_llm *llm)
{
    struct si_context *ctx = NULL;
    struct bad_case {
        const char *needle;
        struct si_context_params p;
    } cases[24];
    int n = 0;
    struct si_context_params p = si_context_default_params();
    p.n_ctx = -1;
    cases[n++] = (struct bad_case){"n_ctx", p};
    p = si_context_default_params();
    p.engine = SI_ENGINE_REF;
    p.sparsity = SI_SPARSE_GATE;
    cases[n++] = (struct bad_case){"needs the StarPU engine", p};
    p = si_context_default_params();
    p.sampling.temp = -1.0f;
    cases[n++] = (struct bad_case){"sampling.temp", p};
    p = si_context_default_params();
    p.sampling.top_p = 2.0f;
    cases[n++] = (struct bad_case){"sampling.top_p", p};
    p = si_context_default_params();
    p.engine = (enum si_engine_kind)7;
    cases[n++] = (struct bad_case){"engine", p};
    p = si_context_default_params();
    p.n_batch = 5000;
    cases[n++] = (struct bad_case){"n_batch", p};
    p = si_context_default_params();
    p.gate_threshold = NAN;
    cases[n++] = (struct bad_case){"gate_threshold", p};
    p = si_context_default_params();
    p.vram_budget = -5;
    cases[n++] = (struct bad_case){"vram_budget", p};
    p = si_context_default_params();
    p.gpu_attention = -2;
    cases[n++] = (struct bad_case){"gpu_attention: -2 is below -1", p};
    p = si_context_default_params();
    p.gpu_attention = 4;
    cases[n++] = (struct bad_case){"gpu_attention: the GPU's layers need a VRAM budget", p};
    /* The flash tier's options are the StarPU engine's too (the CLI checks
     * the same table). */
    p = si_context_default_params();
    p.engine = SI_ENGINE_REF;
    p.flash_window = 3;
    cases[n++] = (struct bad_case){"flash_window needs the StarPU engine", p};
    p = si_context_default_params();
    p.flash_pin = 1.5f;
    cases[n++] = (struct bad_case){"flash_pin: 1.5 is outside [0, 1]", p};
    p = si_context_default_params();
    p.flash_pin = 0.5f;
    cases[n++] = (struct bad_case){"flash_pin keeps the hottest neurons by the profile", p};
    /* Input sparsity: a target in [0, 0.9], and its thresholds' profile. */
    p = si_context_default_params();
    p.input_sparsity = 0.95f;
    p.profile_path = "x.prof";
    cases[n++] = (struct bad_case){"input_sparsity: 0.95 is outside [0, 0.9]", p};
    p = si_context_default_params();
    p.input_sparsity = 0.4f;
    cases[n++] = (struct bad_case){"input_sparsity needs a profile", p};
    for (int i = 0; i < n; i++) {
        ctx = (struct si_context *)&p;
        int rc = si_context_init(llm, cases[i].p, &ctx);
        CHECK(rc == SI_E_INVALID && ctx == NULL, "case %d (%s): %d", i, cases[i].needle, rc);
        CHECK(contains(si_last_error(), cases[i].needle), "case %d: message '%s' lacks '%s'", i,
              si_last_error(), cases[i].needle);
    }
    CHECK(si_context_init(NULL, si_context_default_params(), &ctx) == SI_E_INVALID, "NULL llm");
    /* Predictor mode on a model without predictor tensors: the engine says so. */
    p = si_context_default_params();
    p.sparsity = SI_SPARSE_PREDICTOR;
    CHECK(si_context_init(llm, p, &ctx) == SI_E_INVALID && ctx == NULL &&
              contains(si_last_error(), "predictor"),
          "predictor without tensors: %s", si_last_error());
    CHECK(!starpu_is_initialized(), "a failed context left StarPU running");
}

static void test_dram_budget(struct si_llm *llm, const struct si_hparams *hp)
{
    struct si_context_params p = si_context_default_params();
    p.engine = SI_ENGINE_REF;
    p.n_ctx = 64;
    p.dram_budget = 4096;
    struct si_context *ctx = NULL;
    int rc = si_context_init(llm, p, &ctx);
    CHECK(rc == SI_E_BUDGET && ctx == NULL, "small DRAM budget: %d", rc);
    CHECK(contains(si_last_error(), "flash tier") &&
              contains(si_last_error(), "needs the StarPU engine in gate or predictor mode"),
          "DRAM budget message: %s", si_last_error());
    /* Exactly the tensor data plus the KV cache (K and V, 64 rows, fp16). */
    const int64_t kv = 2LL * hp->n_layer * 64 * hp->n_head_kv * hp->head_dim * 2;
    p.dram_budget = si_llm_weight_bytes(llm) + kv;
    rc = si_context_init(llm, p, &ctx);
    CHECK(rc == SI_OK, "a DRAM budget that fits: %s", si_last_error());
    si_context_free(ctx);
    p.dram_budget -= 1;
    CHECK(si_context_init(llm, p, &ctx) == SI_E_BUDGET, "one byte short of the budget");
}

/*
 * VRAM budgets: one below what the engine keeps on the GPU besides FFN
 * neurons is SI_E_BUDGET before StarPU starts; a budget without a CUDA
 * worker (STARPU_NCUDA=0 here, whatever the machine has) is SI_E_NO_DEVICE;
 * a missing placement file is SI_E_NOT_FOUND.  None leaves StarPU running.
 */
static void test_vram_budget(struct si_llm *llm)
{
    struct si_context_params p = si_context_default_params();
    p.n_ctx = 64;
    p.sparsity = SI_SPARSE_GATE;
    p.vram_budget = 100;
    struct si_context *ctx = NULL;
    int rc = si_context_init(llm, p, &ctx);
    CHECK(rc == SI_E_BUDGET && ctx == NULL && contains(si_last_error(), "VRAM budget of 100 bytes") &&
              contains(si_last_error(), "besides FFN neurons"),
          "VRAM budget under the reserve: %d %s", rc, si_last_error());
    CHECK(!starpu_is_initialized(), "a refused VRAM budget started StarPU");
    const char *old = getenv("STARPU_NCUDA");
    char *saved = old != NULL ? strdup(old) : NULL;
    setenv("STARPU_NCUDA", "0", 1);
    p.vram_budget = 64 << 20; /* above the reserve (StarPU's 32 MiB chunk) */
    rc = si_context_init(llm, p, &ctx);
    CHECK(rc == SI_E_NO_DEVICE && ctx == NULL && contains(si_last_error(), "no CUDA worker"),
          "VRAM budget without a CUDA worker: %d %s", rc, si_last_error());
    CHECK(!starpu_is_initialized(), "a context refused for want of a GPU left StarPU running");
    if (saved != NULL)
        setenv("STARPU_NCUDA", saved, 1);
    else
        unsetenv("STARPU_NCUDA");
    free(saved);
    p.vram_budget = 0;
    char path[256];
    path_in(path, sizeof path, "missing.gguf");
    p.placement_path = path;
    rc = si_context_init(llm, p, &ctx);
    CHECK(rc == SI_E_NOT_FOUND && ctx == NULL && contains(si_last_error(), "missing.gguf"),
          "missing placement file: %d %s", rc, si_last_error());
    p.engine = SI_ENGINE_REF;
    p.sparsity = SI_SPARSE_DENSE;
    rc = si_context_init(llm, p, &ctx);
    CHECK(rc == SI_E_INVALID && contains(si_last_error(), "placement_path"),
          "a placement on the reference: %d %s", rc, si_last_error());
    CHECK(!starpu_is_initialized(), "a refused placement left StarPU running");
}

/* Generate greedily through the API and compare with the reference's tokens. */
static void test_generate(struct si_llm *llm, const char *model_path, enum si_engine_kind engine,
                          enum si_sparsity_mode mode, const char *prompt, bool exact)
{
    const int n_gen = 12;
    int32_t toks[64];
    int64_t np = si_llm_tokenize(llm, prompt, strlen(prompt), si_llm_adds_bos(llm), true, toks, 64);
    int32_t want[32];
    CHECK(np > 0 && ref_greedy(model_path, toks, (int)np, n_gen, want) == 0, "reference run");

    struct si_context_params p = si_context_default_params();
    p.engine = engine;
    p.sparsity = mode;
    p.n_ctx = 128;
    p.sampling.temp = 0.0f;
    p.prefill = exact ? SI_PREFILL_EXACT : SI_PREFILL_AUTO;
    struct si_context *ctx = NULL;
    int rc = si_context_init(llm, p, &ctx);
    CHECK(rc == SI_OK, "context (%s, %s): %s", si_engine_kind_name(engine),
          si_sparsity_mode_name(mode), si_last_error());
    if (rc != SI_OK)
        return;
    if (engine == SI_ENGINE_STARPU)
        CHECK(starpu_is_initialized(), "the StarPU context did not start StarPU");
    struct si_generate_params gp = si_generate_default_params();
    gp.n_predict = n_gen;
    gp.ignore_eos = true;
    struct collect c = {0};
    struct si_generate_result res;
    rc = si_generate(ctx, prompt, gp, collect_cb, &c, &res);
    CHECK(rc == SI_OK, "generate: %s", si_last_error());
    CHECK(res.n_prompt == np && res.n_generated == n_gen && res.stop == SI_STOP_LENGTH,
          "result: %d prompt, %d generated, stop %d", res.n_prompt, res.n_generated, res.stop);
    CHECK(c.n == n_gen && !memcmp(c.ids, want, sizeof(int32_t) * (size_t)n_gen),
          "%s %s: greedy tokens differ from the reference's (first %d vs %d)",
          si_engine_kind_name(engine), si_sparsity_mode_name(mode), c.ids[0], want[0]);
    /* The text: whole characters per call, together the tokens' text. */
    char text[4096];
    int64_t tl = si_llm_detokenize(llm, c.ids, (size_t)c.n, false, text, sizeof text);
    CHECK(tl == (int64_t)c.len && !memcmp(text, c.text, c.len), "streamed text != detokenized");
    CHECK(!c.split_char, "a callback's text ended inside a UTF-8 character");
    /* The cache: the prompt and every generated token but the last. */
    CHECK(si_context_n_past(ctx) == np + n_gen - 1, "n_past %d", si_context_n_past(ctx));
    CHECK(!memcmp(si_context_tokens(ctx), toks, sizeof(int32_t) * (size_t)np) &&
              !memcmp(si_context_tokens(ctx) + np, want, sizeof(int32_t) * (size_t)(n_gen - 1)),
          "the cache's tokens");

    struct si_stats st;
    si_context_get_stats(ctx, &st);
    CHECK(st.engine == engine && st.sparsity == mode, "stats: engine and mode");
    CHECK(st.prefill_tokens == np && st.decode_tokens == n_gen - 1, "stats: %lld + %lld tokens",
          (long long)st.prefill_tokens, (long long)st.decode_tokens);
    CHECK(st.prefill_tokens_per_s > 0 && st.decode_tokens_per_s > 0, "stats: tokens/s");
    CHECK(st.neurons_total > 0 && st.neurons_cpu > 0 && st.neurons_cpu <= st.neurons_total,
          "stats: neurons %lld of %lld", (long long)st.neurons_cpu, (long long)st.neurons_total);
    if (engine == SI_ENGINE_REF) {
        CHECK(st.neurons_total == (np + n_gen - 1) * 2 * 256 && st.n_task_kinds == 0 &&
                  st.neurons_cpu < st.neurons_total / 2,
              "reference stats: %lld neurons", (long long)st.neurons_total);
    } else {
        CHECK(st.n_cpu_workers > 0 && st.n_task_kinds > 0, "engine stats: workers, kinds");
        int64_t attn = 0;
        for (int k = 0; k < st.n_task_kinds; k++)
            if (!strcmp(st.tasks[k].name, "attn") || !strcmp(st.tasks[k].name, "attn_batch"))
                attn += st.tasks[k].count;
        CHECK(attn >= 2, "engine stats: %lld attention tasks", (long long)attn);
        CHECK(st.step_tokens + st.batch_tokens == np + n_gen - 1, "engine tokens %lld + %lld",
              (long long)st.step_tokens, (long long)st.batch_tokens);
        /* the submitting thread's CPU time: some, and no more than its wall time */
        CHECK(st.step_tokens == 0 || (st.step_submit_cpu_seconds > 0 &&
                                      st.step_submit_cpu_seconds <= st.step_submit_seconds + 1e-6),
              "engine stats: submission %.6f s of CPU in %.6f s", st.step_submit_cpu_seconds,
              st.step_submit_seconds);
        if (st.n_cuda_workers == 0)
            CHECK(st.neurons_gpu == 0 && st.gpu_share == 0.0, "no GPU, no GPU neurons");
        if (mode == SI_SPARSE_GATE)
            CHECK(st.neurons_cpu < st.neurons_total / 2, "gate mode computed %lld of %lld",
                  (long long)st.neurons_cpu, (long long)st.neurons_total);
    }
    si_context_reset_stats(ctx);
    si_context_get_stats(ctx, &st);
    CHECK(st.prefill_tokens == 0 && st.decode_tokens == 0 && st.neurons_total == 0 &&
              st.step_tokens == 0,
          "stats after reset");

    /* One process: rank 0 of 1; sharing leaves the bytes as they are. */
    char shared[8] = "abcdefg";
    CHECK(si_context_mpi_rank(ctx) == 0 && si_context_mpi_size(ctx) == 1 &&
              si_context_share(ctx, shared, sizeof shared) == SI_OK && !strcmp(shared, "abcdefg") &&
              si_context_share(ctx, NULL, 0) == SI_OK &&
              si_context_share(ctx, NULL, 4) == SI_E_INVALID &&
              si_context_share(NULL, shared, 1) == SI_E_INVALID,
          "mpi rank, size and share in one process");

    /* Callback stop: after 3 tokens. */
    si_context_reset(ctx);
    CHECK(si_context_n_past(ctx) == 0 && si_context_logits(ctx) == NULL, "reset");
    struct collect s = {.stop_after = 3};
    rc = si_generate(ctx, prompt, gp, collect_cb, &s, &res);
    CHECK(rc == SI_OK && res.stop == SI_STOP_CALLBACK && res.n_generated == 3 && s.n == 3 &&
              !memcmp(s.ids, want, 3 * sizeof(int32_t)),
          "stop from the callback: %d, %d generated", (int)res.stop, res.n_generated);
    si_context_free(ctx);
}

/* Rewind and prefix reuse: the logits of a re-evaluated position are the
 * same as the first time (the reference: bit for bit). */
static void test_rewind(struct si_llm *llm)
{
    struct si_context_params p = si_context_default_params();
    p.engine = SI_ENGINE_REF;
    p.n_ctx = 32;
    p.sampling.temp = 0.0f;
    struct si_context *ctx = NULL;
    if (si_context_init(llm, p, &ctx) != SI_OK) {
        CHECK(false, "context: %s", si_last_error());
        return;
    }
    const int32_t a[] = {1, 72, 101, 108, 108, 111}, b[] = {1, 72, 101, 120, 121};
    const int nv = si_llm_n_vocab(llm);
    CHECK(si_context_logits(ctx) == NULL, "no logits before any evaluation");
    int32_t tok;
    CHECK(si_context_sample(ctx, &tok) == SI_E_INVALID, "sampling without logits");
    CHECK(si_context_eval_batch(ctx, a, 3) == SI_OK, "eval_batch: %s", si_last_error());
    float *l3 = malloc((size_t)nv * sizeof *l3);
    memcpy(l3, si_context_logits(ctx), (size_t)nv * sizeof *l3);
    CHECK(si_context_eval(ctx, a[3]) == SI_OK && si_context_eval(ctx, a[4]) == SI_OK, "eval");
    CHECK(si_context_n_past(ctx) == 5, "n_past 5");
    CHECK(si_context_rewind(ctx, 6) == SI_E_INVALID, "rewind past the end");
    CHECK(si_context_rewind(ctx, 2) == SI_OK && si_context_n_past(ctx) == 2 &&
              si_context_logits(ctx) == NULL,
          "rewind to 2");
    CHECK(si_context_eval(ctx, a[2]) == SI_OK &&
              !memcmp(si_context_logits(ctx), l3, (size_t)nv * sizeof *l3),
          "the logits at position 3 after a rewind differ");
    /* b shares 3 tokens with the cache (1 72 101). */
    int32_t k = si_context_reuse_prefix(ctx, b, 5);
    CHECK(k == 3 && si_context_n_past(ctx) == 3, "reuse_prefix: %d", k);
    /* A sequence equal to the cache keeps n - 1, so one token gives logits. */
    CHECK(si_context_reuse_prefix(ctx, a, 3) == 2, "reuse_prefix keeps one to evaluate");
    CHECK(si_context_eval(ctx, a[2]) == SI_OK && si_context_sample(ctx, &tok) == SI_OK, "sample");
    CHECK(si_context_accept(ctx, tok) == SI_OK && si_context_accept(ctx, nv) == SI_E_INVALID,
          "accept");
    CHECK(si_context_eval(ctx, nv) == SI_E_INVALID && contains(si_last_error(), "vocabulary"),
          "eval of a bad token: %s", si_last_error());
    /* The cache is full: a batch that does not fit is refused whole. */
    int32_t many[40];
    for (int i = 0; i < 40; i++)
        many[i] = 100 + i;
    CHECK(si_context_eval_batch(ctx, many, 30) == SI_E_BUDGET && si_context_n_past(ctx) == 3,
          "a batch past the context: %s", si_last_error());
    struct si_generate_params gp = si_generate_default_params();
    gp.n_predict = 100;
    gp.ignore_eos = true;
    struct si_generate_result res;
    CHECK(si_generate_tokens(ctx, many, 20, gp, NULL, NULL, &res) == SI_OK &&
              res.stop == SI_STOP_CONTEXT && si_context_n_past(ctx) == 32,
          "generation stops at a full context: stop %d, n_past %d", (int)res.stop,
          si_context_n_past(ctx));
    struct si_sampling_params sp = si_sampling_default_params();
    sp.top_k = -1;
    CHECK(si_context_set_sampling(ctx, sp) == SI_E_INVALID, "bad sampling");
    sp.top_k = 5;
    CHECK(si_context_set_sampling(ctx, sp) == SI_OK, "set sampling");
    si_context_free(ctx);
    free(l3);
}

/*
 * A conversation's second turn through si_context_reuse_prefix against the
 * same tokens evaluated from an empty cache: the logits must be the same
 * bits (f32 KV cache and token-by-token evaluation, so that the arithmetic
 * does not depend on how the tokens were grouped).  The second sequence
 * differs from the cache inside the first answer, as a re-tokenized answer
 * can, so the cache is cut back there.
 */
static void test_reuse_logits(struct si_llm *llm, enum si_engine_kind engine)
{
    struct si_context_params p = si_context_default_params();
    p.engine = engine;
    p.n_ctx = 96;
    p.kv_f32 = true;
    p.n_batch = 1;
    p.sampling.temp = 0.0f;
    struct si_context *a = NULL, *b = NULL;
    if (si_context_init(llm, p, &a) != SI_OK || si_context_init(llm, p, &b) != SI_OK) {
        CHECK(false, "contexts (%s): %s", si_engine_kind_name(engine), si_last_error());
        si_context_free(a);
        return;
    }
    const char *t1 = "hello there, how";
    int32_t seq[96];
    int32_t n1 = (int32_t)si_llm_tokenize(llm, t1, strlen(t1), true, true, seq, 96);
    struct si_generate_params gp = si_generate_default_params();
    gp.n_predict = 5;
    gp.ignore_eos = true;
    CHECK(si_generate_tokens(a, seq, n1, gp, NULL, NULL, NULL) == SI_OK, "turn 1: %s",
          si_last_error());
    /* The cache: the prompt and 4 of the 5 answer tokens. */
    int32_t past = si_context_n_past(a);
    CHECK(past == n1 + 4, "n_past after turn 1: %d", past);
    memcpy(seq, si_context_tokens(a), (size_t)past * sizeof *seq);
    seq[n1 + 2] = seq[n1 + 2] == 'x' ? 'y' : 'x';
    const char *t2 = " and then some more";
    int32_t n2 = past + (int32_t)si_llm_tokenize(llm, t2, strlen(t2), false, true, seq + past,
                                                 (size_t)(96 - past));
    int32_t k = si_context_reuse_prefix(a, seq, n2);
    CHECK(k == n1 + 2, "reused %d tokens, expected %d", k, n1 + 2);
    CHECK(si_context_eval_batch(a, seq + k, n2 - k) == SI_OK, "turn 2: %s", si_last_error());
    CHECK(si_context_eval_batch(b, seq, n2) == SI_OK, "from scratch: %s", si_last_error());
    const size_t bytes = (size_t)si_llm_n_vocab(llm) * sizeof(float);
    CHECK(si_context_n_past(a) == n2 && si_context_n_past(b) == n2 &&
              !memcmp(si_context_tokens(a), si_context_tokens(b), (size_t)n2 * sizeof *seq),
          "the caches' tokens differ");
    CHECK(!memcmp(si_context_logits(a), si_context_logits(b), bytes),
          "%s: the logits after a reused prefix differ from those from scratch",
          si_engine_kind_name(engine));
    si_context_free(a);
    si_context_free(b);
}

/* Two StarPU contexts: StarPU stays up until the last one goes. */
static void test_runtime_lifecycle(struct si_llm *llm)
{
    struct si_context_params p = si_context_default_params();
    p.n_ctx = 32;
    struct si_context *c1 = NULL, *c2 = NULL;
    CHECK(!starpu_is_initialized(), "StarPU running before any context");
    CHECK(si_context_init(llm, p, &c1) == SI_OK, "context 1: %s", si_last_error());
    CHECK(si_context_init(llm, p, &c2) == SI_OK, "context 2: %s", si_last_error());
    CHECK(starpu_is_initialized(), "StarPU not started");
    si_context_free(c1);
    CHECK(starpu_is_initialized(), "StarPU stopped while a context uses it");
    int32_t t[] = {1, 65, 66};
    CHECK(si_context_eval_batch(c2, t, 3) == SI_OK, "the second context after the first went");
    si_context_free(c2);
    CHECK(!starpu_is_initialized(), "StarPU still running after the last context");
}

struct eval_arg {
    struct si_context *ctx;
    int rc;
    char msg[512]; /* si_last_error() is per thread */
};

static void *eval_elsewhere(void *v)
{
    struct eval_arg *a = v;
    a->rc = si_context_eval(a->ctx, 66);
    snprintf(a->msg, sizeof a->msg, "%s", si_last_error());
    return NULL;
}

/* caller_worker: the creating thread is StarPU's CPU worker 0; it evaluates
 * (the same logits as without it), another thread is refused. */
static void test_caller_worker(struct si_llm *llm)
{
    struct si_context_params p = si_context_default_params();
    p.n_ctx = 32;
    struct si_context *plain = NULL, *cw = NULL;
    int32_t t[] = {1, 65, 66, 67};
    CHECK(si_context_init(llm, p, &plain) == SI_OK, "plain: %s", si_last_error());
    CHECK(plain != NULL && si_context_eval_batch(plain, t, 4) == SI_OK, "plain eval");
    float *want = NULL;
    const int32_t nv = si_llm_n_vocab(llm);
    if (plain != NULL && (want = malloc((size_t)nv * sizeof *want)) != NULL)
        memcpy(want, si_context_logits(plain), (size_t)nv * sizeof *want);
    si_context_free(plain);
    CHECK(!starpu_is_initialized(), "StarPU still running");

    p.caller_worker = true;
    CHECK(si_context_init(llm, p, &cw) == SI_OK, "caller_worker: %s", si_last_error());
    if (cw == NULL) {
        free(want);
        return;
    }
    CHECK(si_context_eval_batch(cw, t, 4) == SI_OK, "caller_worker eval: %s", si_last_error());
    CHECK(want != NULL && memcmp(want, si_context_logits(cw), (size_t)nv * sizeof *want) == 0,
          "caller_worker: other logits");
    struct eval_arg a = {cw, SI_OK, ""};
    pthread_t th;
    CHECK(pthread_create(&th, NULL, eval_elsewhere, &a) == 0, "thread");
    pthread_join(th, NULL);
    CHECK(a.rc == SI_E_RUNTIME, "eval on another thread: %d", a.rc);
    CHECK(strstr(a.msg, "evaluate on that thread") != NULL, "message: %s", a.msg);
    CHECK(si_context_eval(cw, 67) == SI_OK, "eval after the refusal: %s", si_last_error());
    si_context_free(cw);
    CHECK(!starpu_is_initialized(), "StarPU still running after caller_worker");
    free(want);
}

/* Bytes of the process's memory that map `path` and are resident, summed
 * over its mappings (/proc/self/smaps); -1 without /proc. */
static int64_t mapped_rss(const char *path)
{
    FILE *f = fopen("/proc/self/smaps", "r");
    if (f == NULL)
        return -1;
    char line[1024];
    bool in = false;
    int64_t kb = 0;
    while (fgets(line, sizeof line, f) != NULL) {
        long long v;
        if (strchr(line, '-') != NULL && strchr(line, '-') < strchr(line, ' ') &&
            strchr(line, ' ') != NULL) { /* a mapping's header: "start-end perms ... path" */
            size_t n = strlen(line), pl = strlen(path);
            while (n > 0 && line[n - 1] == '\n')
                line[--n] = '\0';
            in = n >= pl && strcmp(line + n - pl, path) == 0;
        } else if (in && sscanf(line, "Rss: %lld kB", &v) == 1) {
            kb += v;
        }
    }
    fclose(f);
    return kb * 1024;
}

/*
 * The FFN rows that gate mode copies into its neuron records leave the
 * file's mapping: before, a model in a sparse mode was resident twice.  A
 * model whose FFN is most of its bytes (F32, 3 x 128 x 2048 floats a
 * layer); after the context starts, the mapping may hold at most the file's
 * other bytes, plus a page at each end of each FFN tensor (one shared with
 * its neighbour).
 */
/*
 * si_context_shift on a one-layer model, whose cached K and V depend on
 * each token and its position alone: 40 tokens, positions [5, 22) dropped,
 * then 6 more, against a fresh context given the kept tokens and the same 6.
 * The shifted keys were rotated twice (RoPE(p), then RoPE(-17)) where the
 * fresh ones were rotated once (RoPE(p - 17)); with an fp16 cache each is
 * rounded to fp16 once more: a key lands on the fresh one's fp16 value or a
 * neighbour, 2^-10 of its size, and the logits move by that through the
 * scores and the weighted values, within 2^-8 (two roundings of 2^-9, the
 * bound test-engine takes for one).  In f32 only the angles differ: p and
 * 17 times the frequencies against p - 17, a float's rounding of angles of
 * at most 40 radians (2^-24 x 40, about 2.4e-6, through sin and cos): 1e-4
 * leaves a margin.  Then the refusals and the history.
 */
static void test_context_shift(enum si_engine_kind engine, bool kv_f32)
{
    char path[256], err[512];
    path_in(path, sizeof path, "one-layer.gguf");
    struct si_synth_params sp = si_synth_default_params();
    si_synth_preset("tiny", &sp);
    sp.arch = SI_SYNTH_LLAMA_RELU;
    sp.type = SI_TYPE_F16;
    sp.n_layer = 1;
    sp.seed = 12;
    int rc = si_synth_write(&sp, path, err, sizeof err);
    CHECK(rc == SI_OK, "synth (one layer): %s", err);
    struct si_llm *llm = NULL;
    if (rc != SI_OK || si_llm_load(path, si_llm_default_params(), &llm) != SI_OK) {
        CHECK(false, "load (one layer): %s", si_last_error());
        unlink(path);
        return;
    }
    struct si_context_params p = si_context_default_params();
    p.engine = engine;
    p.n_ctx = 64;
    p.kv_f32 = kv_f32;
    p.sampling.temp = 0.0f;
    struct si_context *a = NULL, *b = NULL;
    CHECK(si_context_init(llm, p, &a) == SI_OK && si_context_init(llm, p, &b) == SI_OK,
          "contexts: %s", si_last_error());
    enum { N = 40, KEEP = 5, DROP = 17, MORE = 6 };
    const int32_t nv = si_llm_n_vocab(llm);
    int32_t toks[N + MORE], kept[N - DROP + MORE];
    for (int i = 0; i < N + MORE; i++)
        toks[i] = (int32_t)((i * 31 + 7) % nv);
    int k = 0;
    for (int i = 0; i < N + MORE; i++)
        if (i < KEEP || i >= KEEP + DROP)
            kept[k++] = toks[i];
    if (a != NULL && b != NULL) {
        CHECK(si_context_eval_batch(a, toks, N) == SI_OK, "eval: %s", si_last_error());
        CHECK(si_context_shift(a, KEEP, DROP) == SI_OK, "shift: %s", si_last_error());
        CHECK(si_context_n_past(a) == N - DROP, "n_past %d after the shift, not %d",
              si_context_n_past(a), N - DROP);
        CHECK(memcmp(si_context_tokens(a), kept, (N - DROP) * sizeof *kept) == 0,
              "the history after the shift is not the kept tokens");
        for (int i = 0; i < MORE; i++)
            CHECK(si_context_eval(a, toks[N + i]) == SI_OK, "eval after the shift: %s",
                  si_last_error());
        CHECK(si_context_eval_batch(b, kept, N - DROP) == SI_OK, "fresh eval: %s",
              si_last_error());
        for (int i = 0; i < MORE; i++)
            CHECK(si_context_eval(b, toks[N + i]) == SI_OK, "fresh eval: %s", si_last_error());
        const float *la = si_context_logits(a), *lb = si_context_logits(b);
        const double e = la != NULL && lb != NULL ? test_rel_err(la, lb, nv) : 1.0,
                     tol = kv_f32 ? 1e-4 : 1.0 / 256;
        CHECK(e <= tol, "%s, %s cache: logits after the shift differ from a fresh evaluation "
                        "of the kept tokens by %.3g (tolerance %.3g)",
              si_engine_kind_name(engine), kv_f32 ? "f32" : "fp16", e, tol);
        printf("context shift (%s, %s cache): logits within %.2e of a fresh evaluation\n",
               si_engine_kind_name(engine), kv_f32 ? "f32" : "fp16", e);
        CHECK(si_context_shift(a, 0, 0) == SI_E_INVALID &&
                  strstr(si_last_error(), "nothing to drop") != NULL,
              "shift of nothing: %s", si_last_error());
        CHECK(si_context_shift(a, 10, 1000) == SI_E_INVALID &&
                  strstr(si_last_error(), "more than it holds") != NULL,
              "shift past n_past: %s", si_last_error());
        CHECK(si_context_shift(a, -1, 2) == SI_E_INVALID, "negative keep");
        CHECK(si_context_n_past(a) == N - DROP + MORE, "a refused shift changed n_past");
        /* generation past the context: a shift, then on */
        si_context_reset(a);
        struct si_generate_params gp = si_generate_default_params();
        gp.n_predict = 100;
        gp.ignore_eos = true;
        gp.context_shift = true;
        gp.n_keep = 3;
        struct si_generate_result res;
        CHECK(si_generate_tokens(a, toks, 10, gp, NULL, NULL, &res) == SI_OK &&
                  res.n_generated == 100 && res.n_shifted > 0 && res.stop == SI_STOP_LENGTH,
              "generation past the context: %s (%d generated, %d shifted)", si_last_error(),
              res.n_generated, res.n_shifted);
        CHECK(memcmp(si_context_tokens(a), toks, 3 * sizeof *toks) == 0,
              "the kept tokens are not the first 3");
        gp.context_shift = false;
        si_context_reset(a);
        CHECK(si_generate_tokens(a, toks, 10, gp, NULL, NULL, &res) == SI_OK &&
                  res.stop == SI_STOP_CONTEXT && res.n_shifted == 0,
              "without context_shift: stop %d", (int)res.stop);
    }
    si_context_free(a);
    si_context_free(b);
    si_llm_free(llm);
    unlink(path);
}

static void test_resident(void)
{
    char path[256], err[512];
    path_in(path, sizeof path, "ffn.gguf");
    struct si_synth_params sp = si_synth_default_params();
    si_synth_preset("tiny", &sp);
    sp.n_embd = 128;
    sp.n_ff = 2048;
    sp.seed = 9;
    int rc = si_synth_write(&sp, path, err, sizeof err);
    CHECK(rc == SI_OK, "synth (resident pages): %s", err);
    struct si_model *m = NULL;
    if (rc != SI_OK || si_model_load(&m, path, err, sizeof err) != SI_OK) {
        CHECK(false, "load (resident pages): %s", err);
        unlink(path);
        return;
    }
    const int64_t file = (int64_t)m->gguf->size, page = sysconf(_SC_PAGESIZE);
    int64_t ffn = 0, n_t = 0;
    for (int l = 0; l < m->hp.n_layer; l++) {
        const struct si_layer *W = &m->w.layers[l];
        const struct si_tensor *t[4] = {&W->ffn_gate, &W->ffn_up, &W->ffn_down, &W->ffn_down_t};
        for (int i = 0; i < 4; i++)
            if (t[i]->data != NULL) {
                ffn += (int64_t)t[i]->nbytes;
                n_t++;
            }
    }
    si_model_free(m);
    struct si_llm *llm = NULL;
    CHECK(si_llm_load(path, si_llm_default_params(), &llm) == SI_OK, "load: %s", si_last_error());
    struct si_context_params p = si_context_default_params();
    p.engine = SI_ENGINE_STARPU;
    p.sparsity = SI_SPARSE_GATE;
    p.n_ctx = 32;
    struct si_context *ctx = NULL;
    if (llm != NULL && si_context_init(llm, p, &ctx) == SI_OK) {
        const int64_t rss = mapped_rss(path), bound = file - ffn + 2 * n_t * page;
        if (rss < 0)
            printf("skipped the resident-pages check: no /proc/self/smaps\n");
        else
            CHECK(rss <= bound,
                  "gate mode keeps %lld bytes of the file mapped (bound %lld: its %lld bytes "
                  "less the %lld of its FFN, copied into the records)",
                  (long long)rss, (long long)bound, (long long)file, (long long)ffn);
    } else {
        CHECK(false, "gate context (resident pages): %s", si_last_error());
    }
    si_context_free(ctx);
    si_llm_free(llm);
    unlink(path);
}

int main(void)
{
    if (mkdtemp(dir) == NULL) {
        perror("mkdtemp");
        return 1;
    }
    char model_path[256], err[512];
    path_in(model_path, sizeof model_path, "tiny.gguf");
    struct si_synth_params sp = si_synth_default_params();
    si_synth_preset("tiny", &sp);
    sp.arch = SI_SYNTH_LLAMA_RELU;
    /* F16 weights: on this tiny random model the greedy tokens depend on the
     * whole context (with Q4_0 they mostly follow the last token alone, which
     * would let a wrong prefill go unnoticed). */
    sp.type = SI_TYPE_F16;
    sp.seed = 5;
    int rc = si_synth_write(&sp, model_path, err, sizeof err);
    CHECK(rc == SI_OK, "synth: %s", err);
    CHECK(!strcmp(si_last_error(), ""), "a last error before any failure");

    struct si_llm *llm = NULL;
    if (rc == SI_OK) {
        test_load_errors(model_path);
        test_predictor_file(model_path);
        rc = si_llm_load(model_path, si_llm_default_params(), &llm);
        CHECK(rc == SI_OK, "load: %s", si_last_error());
    }
    if (llm != NULL) {
        test_model_queries(llm);
        test_tokens(llm);
        test_bad_params(llm);
        struct si_model *m = NULL;
        CHECK(si_model_load(&m, model_path, err, sizeof err) == SI_OK, "internal load: %s", err);
        if (m != NULL)
            test_dram_budget(llm, &m->hp);
        si_model_free(m);
        test_vram_budget(llm);
        test_rewind(llm);
        /* Short prompts: the engine's prefill of fewer than 8 tokens is the
         * reference's arithmetic; a longer one with SI_PREFILL_EXACT. */
        test_generate(llm, model_path, SI_ENGINE_REF, SI_SPARSE_DENSE, "hello", false);
        test_generate(llm, model_path, SI_ENGINE_STARPU, SI_SPARSE_DENSE, "hello", false);
        test_generate(llm, model_path, SI_ENGINE_STARPU, SI_SPARSE_GATE, "hey", false);
        test_generate(llm, model_path, SI_ENGINE_STARPU, SI_SPARSE_DENSE,
                      "a longer prompt of more than eight tokens", true);
        test_reuse_logits(llm, SI_ENGINE_REF);
        test_reuse_logits(llm, SI_ENGINE_STARPU);
        test_runtime_lifecycle(llm);
        test_caller_worker(llm);
        si_llm_free(llm);
        test_context_shift(SI_ENGINE_REF, false);
        test_context_shift(SI_ENGINE_REF, true);
        test_context_shift(SI_ENGINE_STARPU, false);
        test_context_shift(SI_ENGINE_STARPU, true);
        test_resident();
        /* The model read into memory instead of mapped: the same tokens. */
        struct si_llm_params lp = si_llm_default_params();
        lp.use_mmap = false;
        llm = NULL;
        CHECK(si_llm_load(model_path, lp, &llm) == SI_OK, "load without mmap: %s",
              si_last_error());
        if (llm != NULL)
            test_generate(llm, model_path, SI_ENGINE_REF, SI_SPARSE_DENSE, "hello", false);
        si_llm_free(llm);
    }
    const char *files[] = {"tiny.gguf", "missing.gguf", "text.gguf", "empty.gguf", "cut.gguf"};
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        char path[256];
        path_in(path, sizeof path, files[i]);
        unlink(path);
    }
    rmdir(dir);
    return test_result();
}
