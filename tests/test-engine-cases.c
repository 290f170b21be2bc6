/*
 * test-engine-cases.c - the models test-engine compares the engine on, and
 * each one's configurations: synthetic ones of every architecture synth
 * writes and every type (synthetic, synthetic_types), the engine's own
 * choice of attention layers for the GPU (attn_auto), and hand-built tiny
 * models of the other architectures (tiny_models).
 */
#include "engine-test.h"

#include "graph/runtime.h"
#include "model/types.h"
#include "predict/profile.h"
#include "starinfer.h"
#include "test.h"
#include "tiny-model.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* compare() on each of the n configurations configs, with n_slices slices
 * (synthetic's configurations leave them to its caller). */
static void compare_sliced(const char *what, const struct si_model *m, const struct config *configs,
                           size_t n, int32_t n_slices, double tol)
{
    for (size_t k = 0; k < n; k++) {
        struct config cf = configs[k];
        cf.n_slices = n_slices;
        compare(what, m, cf, tol);
    }
}

void synthetic(const char *arch, uint32_t type, int64_t n_ff, int32_t n_slices, double tol)
{
    struct si_synth_params p = si_synth_default_params();
    si_synth_preset("tiny", &p);
    si_synth_arch_parse(arch, &p.arch);
    p.type = type;
    p.n_layer = 3;
    p.n_ff = n_ff; /* chunks of 256 neurons: several slices */
    p.seed = 11;
    p.predictor_rank = 32; /* fc1/fc2 and ffn_down_t */
    if (p.arch == SI_SYNTH_OPT)
        p.n_head_kv = p.n_head; /* OPT has no grouped-query attention */
    char path[32], what[96];
    snprintf(what, sizeof what, "synthetic %s %s", arch, si_type_name(type));
    struct si_model *m = synth_model(&p, what, path);
    if (m != NULL) {
        const struct config silu[] = {
            {.mode = SI_SPARSITY_DENSE},
            {.mode = SI_SPARSITY_GATE, .cats = true},
            {.mode = SI_SPARSITY_GATE, .hot = true, .cats = true},
            {.mode = SI_SPARSITY_GATE, .hot = true, .prefill = PF_EXACT, .cats = true},
        };
        if (p.arch == SI_SYNTH_LLAMA_SILU) {
            compare_sliced(what, m, silu, sizeof silu / sizeof silu[0], n_slices, tol);
            si_model_free(m);
            unlink(path);
            return;
        }
        const struct config configs[] = {
            {.mode = SI_SPARSITY_DENSE},
            {.mode = SI_SPARSITY_GATE},
            {.mode = SI_SPARSITY_PREDICTOR},
            {.mode = SI_SPARSITY_DENSE, .hot = true},
            {.mode = SI_SPARSITY_GATE, .hot = true},
            {.mode = SI_SPARSITY_PREDICTOR, .hot = true},
            {.mode = SI_SPARSITY_GATE, .redux = true},
            {.mode = SI_SPARSITY_DENSE, .hot = true, .prefill = PF_EXACT},
            {.mode = SI_SPARSITY_GATE, .hot = true, .prefill = PF_EXACT},
            {.mode = SI_SPARSITY_DENSE, .prefill = PF_FLOAT},
            {.mode = SI_SPARSITY_GATE, .hot = true, .prefill = PF_FLOAT},
            {.mode = SI_SPARSITY_DENSE, .prefill = PF_INT8},
            {.mode = SI_SPARSITY_DENSE, .prefill = PF_BLAS},
            {.mode = SI_SPARSITY_GATE, .prefill = PF_INT8},
            {.mode = SI_SPARSITY_GATE, .prefill = PF_BLAS},
            {.mode = SI_SPARSITY_PREDICTOR, .prefill = PF_INT8},
            {.mode = SI_SPARSITY_PREDICTOR, .prefill = PF_BLAS},
            {.mode = SI_SPARSITY_PREDICTOR, .hot = true, .prefill = PF_INT8},
            {.mode = SI_SPARSITY_PREDICTOR, .hot = true, .prefill = PF_BLAS},
            {.mode = SI_SPARSITY_PREDICTOR, .hot = true, .prefill = PF_EXACT},
            {.mode = SI_SPARSITY_DENSE, .attn = 3},
            {.mode = SI_SPARSITY_PREDICTOR, .hot = true, .attn = 2},
            {.mode = SI_SPARSITY_DENSE, .hot = true, .gpu = true},
            {.mode = SI_SPARSITY_GATE, .hot = true, .gpu = true},
            {.mode = SI_SPARSITY_PREDICTOR, .hot = true, .gpu = true},
            /* Attention on the GPU's layers (a CPU worker in its stead
             * without one): none, two of the three (the third split over
             * the workers), all, after a batched prompt, and on the GPU. */
            {.mode = SI_SPARSITY_GATE, .hot = true, .attn_gpu = -1},
            {.mode = SI_SPARSITY_GATE, .hot = true, .attn = 2, .attn_gpu = 2},
            {.mode = SI_SPARSITY_PREDICTOR, .hot = true, .attn_gpu = 3},
            {.mode = SI_SPARSITY_DENSE, .hot = true, .attn = 2, .attn_gpu = 2},
            {.mode = SI_SPARSITY_PREDICTOR, .hot = true, .prefill = PF_INT8, .attn_gpu = 3},
            {.mode = SI_SPARSITY_PREDICTOR, .hot = true, .prefill = PF_BLAS, .attn_gpu = 3},
            {.mode = SI_SPARSITY_DENSE, .hot = true, .gpu = true, .attn_gpu = 3},
            {.mode = SI_SPARSITY_GATE, .hot = true, .attn = 2, .gpu = true, .attn_gpu = 2},
            {.mode = SI_SPARSITY_PREDICTOR, .hot = true, .gpu = true, .attn_gpu = 3},
            {.mode = SI_SPARSITY_GATE,
             .hot = true,
             .prefill = PF_EXACT,
             .gpu = true,
             .attn_gpu = 3},
            /* ... and the GPU's steps with its kernels' CPU twins */
            {.mode = SI_SPARSITY_GATE, .hot = true, .attn = 2, .attn_gpu = 2, .twin = true},
            {.mode = SI_SPARSITY_PREDICTOR, .hot = true, .attn_gpu = 3, .twin = true},
            {.mode = SI_SPARSITY_DENSE, .hot = true, .attn_gpu = 3, .twin = true},
            {.mode = SI_SPARSITY_PREDICTOR,
             .hot = true,
             .prefill = PF_INT8,
             .attn_gpu = 3,
             .twin = true},
            {.mode = SI_SPARSITY_PREDICTOR,
             .hot = true,
             .prefill = PF_BLAS,
             .attn_gpu = 3,
             .twin = true},
            {.mode = SI_SPARSITY_GATE,
             .hot = true,
             .prefill = PF_EXACT,
             .attn_gpu = -1,
             .twin = true},
            {.mode = SI_SPARSITY_PREDICTOR,
             .hot = true,
             .prefill = PF_FLOAT,
             .attn_gpu = -1,
             .twin = true},
        };
        compare_sliced(what, m, configs, sizeof configs / sizeof configs[0], n_slices, tol);
        /* Lookahead predictors (the same fc1/fc2 on the attention's input):
         * the predictor task beside the attention, alone, with a hot slice,
         * after a batched prompt, and with the attention in one task. */
        const struct config ahead[] = {
            {.mode = SI_SPARSITY_PREDICTOR},
            {.mode = SI_SPARSITY_PREDICTOR, .hot = true},
            {.mode = SI_SPARSITY_PREDICTOR, .hot = true, .prefill = PF_INT8},
            {.mode = SI_SPARSITY_PREDICTOR, .hot = true, .prefill = PF_BLAS},
            {.mode = SI_SPARSITY_PREDICTOR, .attn = 1},
        };
        char what_ahead[128];
        snprintf(what_ahead, sizeof what_ahead, "%s, lookahead predictors", what);
        m->pred_input = SI_PRED_LAYER;
        compare_sliced(what_ahead, m, ahead, sizeof ahead / sizeof ahead[0], n_slices, tol);
        si_model_free(m);
        unlink(path);
    }
}

/*
 * PowerInfer's layout (synth --powerinfer): ffn_down_t alone, the
 * predictors reading the residual the FFN's norm reads (files without
 * starinfer.predictor.input).  Every mode: dense runs on the records as
 * gate mode does (every neuron whose activation is not 0), against the
 * reference's down_t arithmetic; prompts in each arithmetic; hot slices.
 */
void powerinfer_layout(const char *arch, uint32_t type)
{
    struct si_synth_params p = si_synth_default_params();
    si_synth_preset("tiny", &p);
    si_synth_arch_parse(arch, &p.arch);
    p.type = type;
    p.n_layer = 3;
    p.n_ff = 1024;
    p.seed = 7;
    p.predictor_rank = 32;
    p.powerinfer = true;
    if (p.arch == SI_SYNTH_OPT)
        p.n_head_kv = p.n_head;
    char path[32], what[96];
    snprintf(what, sizeof what, "PowerInfer-layout %s %s", arch, si_type_name(type));
    struct si_model *m = synth_model(&p, what, path);
    if (m == NULL)
        return;
    CHECK(si_model_down_t_only(m) && m->pred_input == SI_PRED_RESIDUAL,
          "%s: down_t only %d, predictor input %d", what, si_model_down_t_only(m), m->pred_input);
    const struct config configs[] = {
        {.mode = SI_SPARSITY_DENSE},
        {.mode = SI_SPARSITY_GATE},
        {.mode = SI_SPARSITY_PREDICTOR},
        {.mode = SI_SPARSITY_DENSE, .hot = true},
        {.mode = SI_SPARSITY_PREDICTOR, .hot = true},
        {.mode = SI_SPARSITY_DENSE, .prefill = PF_EXACT},
        {.mode = SI_SPARSITY_DENSE, .prefill = PF_INT8},
        {.mode = SI_SPARSITY_DENSE, .prefill = PF_BLAS},
        {.mode = SI_SPARSITY_PREDICTOR, .hot = true, .prefill = PF_INT8},
        {.mode = SI_SPARSITY_PREDICTOR, .attn = 2},
    };
    for (size_t k = 0; k < sizeof configs / sizeof configs[0]; k++)
        compare(what, m, configs[k], 1e-4);
    si_model_free(m);
    unlink(path);
}

/*
 * Every type synth writes, and the Q4_K_M / Q5_K_M mixes (attn_v and
 * ffn_down in Q6_K in some layers: types differ from layer to layer), on
 * each synthetic architecture, in dense and gate modes (gate with a hot
 * slice too, and prefill).  512 wide: the K types' blocks are 256 and the
 * planted channel takes one.
 */
void synthetic_types(void)
{
    static const struct {
        const char *arch;
        uint32_t type;
        bool mix_m;
    } cases[] = {
        {"llama-relu", SI_TYPE_BF16, false}, {"llama-relu", SI_TYPE_Q8_0, false},
        {"llama-relu", SI_TYPE_Q4_1, false}, {"llama-relu", SI_TYPE_Q5_0, false},
        {"llama-relu", SI_TYPE_Q5_1, false}, {"llama-relu", SI_TYPE_Q4_K, false},
        {"llama-relu", SI_TYPE_Q5_K, false}, {"llama-relu", SI_TYPE_Q6_K, false},
        {"llama-relu", SI_TYPE_Q4_K, true},  {"llama-silu", SI_TYPE_Q4_K, true},
        {"bamboo", SI_TYPE_Q5_K, true},      {"opt", SI_TYPE_Q4_K, true},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        struct si_synth_params p = si_synth_default_params();
        si_synth_preset("tiny", &p);
        si_synth_arch_parse(cases[c].arch, &p.arch);
        p.type = cases[c].type;
        p.mix_m = cases[c].mix_m;
        p.n_embd = 512;
        p.n_ff = 1024;
        p.n_layer = 4; /* the mix: layers 0, 1 in the base type, 2, 3 in Q6_K */
        p.n_head = 8;
        p.n_head_kv = p.arch == SI_SYNTH_OPT ? 8 : 4;
        p.seed = 5;
        p.predictor_rank = 32; /* fc1/fc2, and ffn_down_t in each layer's down type */
        char path[32], what[96];
        snprintf(what, sizeof what, "synthetic %s %s", cases[c].arch, si_synth_type_name(&p));
        struct si_model *m = synth_model(&p, what, path);
        if (m != NULL) {
            const bool silu = p.arch == SI_SYNTH_LLAMA_SILU;
            if (p.mix_m)
                CHECK(m->w.layers[0].ffn_down.type != m->w.layers[3].ffn_down.type,
                      "%s: ffn_down of one type in every layer", what);
            /* One cold slice and no hot one: the sums in the reference's
             * order, so the same bits in every mode (tolerance 0).  With
             * several slices the partial outputs add in another order and
             * the next layer's Q8 input turns last-bit differences into
             * quantization steps: up to 1.6e-2 of the logits measured (opt
             * Q4_K_M, predictor, hot slice) with 2 workers, 2.4e-2 with 4
             * (STARPU_NCPU=4, here and on the 16-core GPU machine), the
             * greedy tokens equal. */
            const struct config exact[] = {
                {.mode = SI_SPARSITY_DENSE},
                {.mode = SI_SPARSITY_GATE, .n_slices = 1, .cats = silu},
                {.mode = SI_SPARSITY_PREDICTOR, .n_slices = 1},
                {.mode = SI_SPARSITY_DENSE, .prefill = PF_EXACT},
            };
            /* (gate +hot prefill keeps the attention on the CPU: with the
             * engine's choice, opt Q4_K_M's first layer goes to the GPU, the
             * hot slices shrink, and their reordered sums turn a near tie
             * of two tokens at step 36; the same configuration with the
             * attention on the GPU passes above in the other modes) */
            const struct config reordered[] = {
                {.mode = SI_SPARSITY_GATE, .hot = true, .cats = silu},
                {.mode = SI_SPARSITY_PREDICTOR, .hot = true},
                {.mode = SI_SPARSITY_GATE,
                 .hot = true,
                 .prefill = PF_EXACT,
                 .cats = silu,
                 .attn_gpu = -1},
                {.mode = SI_SPARSITY_GATE, .prefill = PF_INT8, .cats = silu},
                {.mode = SI_SPARSITY_GATE, .prefill = PF_BLAS, .cats = silu},
                {.mode = SI_SPARSITY_DENSE, .prefill = PF_INT8},
                {.mode = SI_SPARSITY_DENSE, .prefill = PF_BLAS},
                /* the attention of layers 0 and 1 on the GPU (its K-quant
                 * matvecs), or on a CPU worker in its stead */
                {.mode = SI_SPARSITY_GATE, .hot = true, .cats = silu, .attn_gpu = 2},
                {.mode = SI_SPARSITY_PREDICTOR, .hot = true, .gpu = true, .attn_gpu = 2},
                {.mode = SI_SPARSITY_PREDICTOR, .hot = true, .attn_gpu = 2, .twin = true},
            };
            for (size_t k = 0; k < sizeof exact / sizeof exact[0]; k++)
                compare(what, m, exact[k], 0);
            for (size_t k = 0; k < sizeof reordered / sizeof reordered[0]; k++)
                compare(what, m, reordered[k], 3e-2);
            if (p.mix_m) /* dequantized rows in sgemm against block dots */
                batch_logits(what, m, 3e-3);
            si_model_free(m);
            unlink(path);
        }
    }
}

/*
 * How many layers' attention the engine puts on the GPU by itself
 * (attn_gpu 0; graph/attn_gpu.c), a CPU worker standing in for the GPU:
 * none in dense mode; with a profile, none when every neuron fires every
 * token (a neuron then keeps its bytes off the CPU every token, and an
 * attention layer pays its KV cache as well), every layer the budget holds
 * when they rarely fire; without a profile, every layer it holds.
 */
void attn_auto(void)
{
    struct si_synth_params p = si_synth_default_params();
    si_synth_preset("tiny", &p);
    si_synth_arch_parse("llama-relu", &p.arch);
    p.type = SI_TYPE_F16;
    p.n_embd = 512; /* attention's tensors large beside StarPU's 16 KiB blocks */
    p.n_head = 8;
    p.n_head_kv = 4;
    p.n_layer = 3;
    p.n_ff = 1024;
    p.seed = 11;
    p.predictor_rank = 32;
    char path[32];
    struct si_model *m = synth_model(&p, "attention's layers", path);
    if (m == NULL)
        return;
    const struct si_hparams *hp = &m->hp;
    const int64_t nl = hp->n_layer, ff = hp->n_ff;
    int64_t *counts = calloc((size_t)(nl * ff), sizeof *counts);
    struct si_profile pr = {
        .n_layer = (int32_t)nl, .n_ff = (int32_t)ff, .n_tokens = 100, .counts = counts};
    const struct si_layer *W = &m->w.layers[0];
    const int64_t ffn = (int64_t)(W->ffn_gate.nbytes + W->ffn_up.nbytes + W->ffn_down.nbytes);
    struct {
        const char *what;
        enum si_sparsity mode;
        int64_t count; /* of every neuron; -1: no profile */
        bool all;      /* every layer, else none */
    } cases[] = {
        {"predictor mode, neurons that always fire", SI_SPARSITY_PREDICTOR, 100, false},
        {"predictor mode, neurons that fire 1% of the time", SI_SPARSITY_PREDICTOR, 1, true},
        {"gate mode, neurons that fire 1% of the time", SI_SPARSITY_GATE, 1, true},
        {"predictor mode without a profile", SI_SPARSITY_PREDICTOR, -1, true},
        {"dense mode", SI_SPARSITY_DENSE, 1, false},
    };
    for (size_t c = 0; counts != NULL && c < sizeof cases / sizeof cases[0]; c++) {
        for (int64_t i = 0; i < nl * ff; i++)
            counts[i] = cases[c].count;
        struct si_engine_params ep = si_engine_default_params();
        ep.ref.n_ctx = 96;
        ep.mode = cases[c].mode;
        ep.hot_on_cpu = true;
        ep.profile = cases[c].count >= 0 ? &pr : NULL;
        /* the buffers (a chunk of StarPU's allocator), then room for two
         * thirds of the FFN: less than all neurons, more than the attention
         * of every layer (half as many bytes) */
        ep.vram_budget = ((int64_t)32 << 20) + nl * ffn * 2 / 3;
        struct si_engine *e = NULL;
        char err[512];
        const int rc = si_engine_init(&e, m, ep, err, sizeof err);
        CHECK(rc == SI_OK, "attention's layers, %s: %s", cases[c].what, err);
        if (rc != SI_OK)
            continue;
        const struct si_engine_stats st = si_engine_get_stats(e);
        printf("attention on the GPU by the engine's choice, %s: %d of %d layers\n", cases[c].what,
               st.attn_gpu_layers, hp->n_layer);
        CHECK(st.attn_gpu_layers == (cases[c].all ? hp->n_layer : 0), "attention's layers, %s: %d",
              cases[c].what, st.attn_gpu_layers);
        CHECK(st.gpu_accounted <= ep.vram_budget, "attention's layers, %s: %lld GPU bytes",
              cases[c].what, (long long)st.gpu_accounted);
        si_engine_free(e);
    }
    free(counts);
    si_model_free(m);
    unlink(path);
}

void tiny_models(void)
{
    static const char *archs[] = {"llama", "opt", "gemma3", "falcon"};
    const struct config configs[] = {
        {.mode = SI_SPARSITY_DENSE, .attn = 1},
        {.mode = SI_SPARSITY_DENSE, .attn = 2},
        {.mode = SI_SPARSITY_DENSE, .attn = 4},
        {.mode = SI_SPARSITY_DENSE, .redux = true, .attn = 2},
        {.mode = SI_SPARSITY_DENSE, .prefill = PF_EXACT, .attn = 2},
    };
    /* Gate mode where a gate's activation can be thresholded: llama's SiLU,
     * gemma3's GELU, with per-layer thresholds (opt's ReLU is synthetic
     * opt's; falcon's plain FFN has no gate: its gate mode is dense). */
    const struct config gated[] = {
        {.mode = SI_SPARSITY_GATE, .cats = true},
        {.mode = SI_SPARSITY_GATE, .hot = true, .cats = true},
        {.mode = SI_SPARSITY_GATE, .prefill = PF_EXACT, .cats = true},
        {.mode = SI_SPARSITY_GATE, .hot = true, .prefill = PF_EXACT, .attn = 2, .cats = true},
        {.mode = SI_SPARSITY_GATE, .hot = true, .cats = true, .attn_gpu = 1}, /* gemma3: refused */
    };
    for (size_t a = 0; a < sizeof archs / sizeof archs[0]; a++) {
        char path[] = "/tmp/si-test-engine-tiny-XXXXXX";
        int fd = mkstemp(path);
        CHECK(fd >= 0, "mkstemp");
        if (fd < 0)
            return;
        close(fd);
        write_model(path, archs[a], FAULT_NONE);
        struct si_model *m = NULL;
        char err[512], what[64];
        CHECK(si_model_load(&m, path, err, sizeof err) == SI_OK, "tiny %s: %s", archs[a], err);
        snprintf(what, sizeof what, "tiny %s F32", archs[a]);
        for (size_t k = 0; m != NULL && k < sizeof configs / sizeof configs[0]; k++)
            compare(what, m, configs[k], 1e-4);
        const bool gate = !strcmp(archs[a], "llama") || !strcmp(archs[a], "gemma3");
        for (size_t k = 0; m != NULL && gate && k < sizeof gated / sizeof gated[0]; k++)
            compare(what, m, gated[k], 1e-4);
        si_model_free(m);
        unlink(path);
    }
}
