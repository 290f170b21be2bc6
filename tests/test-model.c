/*
 * test-model.c - loading models: hyperparameters and weights of tiny files
 * written here for each architecture, the reference forward pass on them
 * (finite, deterministic, cache-consistent), and one clear error for each way
 * a model file can be inconsistent.
 */
#include "model/forward.h"
#include "model/gguf_write.h"
#include "model/model.h"
#include "model/types.h"
#include "starinfer.h"
#include "test.h"
#include "tiny-model.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void expect_load_error(const char *path, const char *arch, enum fault fault,
                              const char *needle)
{
    write_model(path, arch, fault);
    struct si_model *m = (struct si_model *)1;
    char err[512] = "";
    int rc = si_model_load(&m, path, err, sizeof err);
    CHECK(rc < 0 && m == NULL, "fault %d: loaded anyway", fault);
    CHECK(strstr(err, needle) != NULL, "fault %d: message '%s' lacks '%s'", fault, err, needle);
    CHECK(strncmp(err, path, strlen(path)) == 0, "message names the file: %s", err);
    si_model_free(m == (struct si_model *)1 ? NULL : m);
}

/* Load, run a few tokens twice, check finiteness and repeatability. */
static void check_arch(const char *path, const char *arch)
{
    write_model(path, arch, FAULT_NONE);
    struct si_model *m = NULL;
    char err[512];
    int rc = si_model_load(&m, path, err, sizeof err);
    CHECK(rc == SI_OK, "%s: %s", arch, err);
    if (rc != SI_OK)
        return;
    CHECK(m->hp.n_layer == NL && m->hp.n_embd == D && m->hp.n_ff == FF && m->hp.n_vocab == NV,
          "%s: hyperparameters", arch);
    CHECK(m->hp.head_dim == HD, "%s: head size %d", arch, m->hp.head_dim);
    CHECK(!strcmp(si_arch_name(m->hp.arch), arch), "%s: arch name", arch);

    struct si_ref *r = NULL;
    struct si_ref_params p = si_ref_default_params();
    p.n_ctx = 8;
    CHECK(si_ref_init(&r, m, p, err, sizeof err) == SI_OK, "%s: init %s", arch, err);
    if (r == NULL) {
        si_model_free(m);
        return;
    }
    const int32_t seq[6] = {3, 17, 5, 39, 0, 22};
    float first[6][NV];
    for (int pass = 0; pass < 2; pass++) {
        si_ref_reset(r);
        for (int t = 0; t < 6; t++) {
            CHECK(si_ref_eval(r, seq[t]) == SI_OK, "%s: eval", arch);
            int finite = 1;
            for (int k = 0; k < NV; k++)
                finite &= isfinite(r->logits[k]);
            CHECK(finite, "%s: non-finite logits at %d", arch, t);
            if (pass == 0)
                memcpy(first[t], r->logits, sizeof first[t]);
            else
                CHECK(memcmp(first[t], r->logits, sizeof first[t]) == 0,
                      "%s: position %d differs between runs", arch, t);
        }
    }
    /* Different histories give different logits (attention reads the cache). */
    si_ref_reset(r);
    si_ref_eval(r, 9);
    si_ref_eval(r, seq[1]);
    CHECK(memcmp(first[1], r->logits, sizeof first[1]) != 0, "%s: the cache has no effect", arch);
    CHECK(si_ref_eval(r, NV) == SI_E_INVALID, "%s: token outside the vocabulary", arch);
    CHECK(si_ref_eval(r, -1) == SI_E_INVALID, "%s: negative token", arch);
    for (int t = 2; t < 8; t++)
        si_ref_eval(r, 1);
    CHECK(si_ref_eval(r, 1) == SI_E_BUDGET, "%s: full cache", arch);
    si_ref_free(r);
    si_model_free(m);
}

int main(void)
{
    char path[] = "/tmp/si-test-model-XXXXXX";
    int fd = mkstemp(path);
    CHECK(fd >= 0, "mkstemp");
    close(fd);

    check_arch(path, "llama");
    check_arch(path, "bamboo");
    check_arch(path, "opt");
    check_arch(path, "gemma3");
    check_arch(path, "falcon");

    expect_load_error(path, "llama", FAULT_NO_BLOCK_COUNT, "missing metadata key llama.block_count");
    expect_load_error(path, "llama", FAULT_HEADS_NOT_DIVIDING, "not a multiple of head_count 3");
    expect_load_error(path, "llama", FAULT_KV_NOT_DIVIDING, "not a multiple of head_count_kv 3");
    expect_load_error(path, "llama", FAULT_BAD_ARCH, "architecture 'gpt-17' is not supported");
    expect_load_error(path, "llama", FAULT_SHAPE, "tensor blk.1.attn_q.weight has shape [16, 17");
    expect_load_error(path, "llama", FAULT_MISSING_TENSOR, "missing tensor blk.1.ffn_up.weight");
    expect_load_error(path, "llama", FAULT_VOCAB_MISMATCH, "the vocabulary has 41 tokens");
    expect_load_error(path, "llama", FAULT_BAD_ACTIVATION, "unknown starinfer.ffn_activation");
    expect_load_error(path, "opt", FAULT_NEGATIVE_FF, "opt.feed_forward_length = -5 is out of range");
    expect_load_error(path, "llama", FAULT_BAD_PREDICTOR_INPUT,
                      "starinfer.predictor.input 'attention' is not 'ffn', 'layer' or 'residual'");
    expect_load_error(path, "llama", FAULT_PREDICTOR_INPUT_TYPE,
                      "starinfer.predictor.input is not a string");
    unlink(path);
    si_model_free(NULL);
    return test_result();
}
