/*
 * engine-test.h - what test-engine.c (the comparison against the reference,
 * main) and test-engine-cases.c (the models and their configurations) share.
 */
#ifndef SI_TESTS_ENGINE_TEST_H
#define SI_TESTS_ENGINE_TEST_H

#define SI_TEST_SHARED_COUNTERS /* CHECK counts for the whole program (test.h) */

#include "graph/engine.h"
#include "model/model.h"
#include "model/synth.h"
#include "test.h"

#include <stdbool.h>
#include <stdint.h>

/* gate mode's per-layer thresholds in the cats configurations: CATS_STEP * (l + 1) */
#define CATS_STEP 0.0513f

/* The prompt's arithmetic in a configuration (config.prefill). */
enum prefill {
    PF_NONE,  /* token by token */
    PF_EXACT, /* SI_PREFILL_EXACT: the reference's, the same bits */
    PF_FLOAT, /* float activations everywhere, the reference's too (act_quant
               * off): OpenBLAS against float dots */
    PF_INT8,  /* SI_PREFILL_INT8: the reference's converted inputs, the batched
               * integer kernel (skipped without AVX-512 VNNI) */
    PF_BLAS,  /* SI_PREFILL_BLAS: float inputs through OpenBLAS in the prompt
               * (the reference's are float there too), converted ones in
               * decoding: what auto does without AVX-512 VNNI */
};

/* One configuration of the engine to compare (compare), written with designated
 * initialisers: a field left out is 0 (false, PF_NONE, the engine's choice). */
struct config {
    enum si_sparsity mode;
    int32_t n_slices;
    bool hot;     /* a profile and a hot slice (run on a CPU worker) */
    bool redux;   /* STARPU_REDUX instead of the merge task */
    int prefill;  /* the prompt through si_engine_eval_batch (enum prefill) */
    int attn;     /* attn_split (0: the engine's choice) */
    bool gpu;     /* with hot: the hot slice on a CUDA worker (skipped without) */
    bool cats;    /* gate mode on a SiLU model: per-layer thresholds in the profile */
    int attn_gpu; /* with hot: the layers whose attention runs on the GPU (a CPU
                   * worker without gpu): 0 the engine's choice, -1 none, N */
    bool twin;    /* without gpu: that CPU worker runs the GPU form's steps with the
                   * CPU twins of its kernels (gpu_twin) */
};

/* SI_TEST_ENGINE_QUICK=1: the shorter run test-engine.sh makes most often. */
bool quick_run(void);

/* The engine in configuration cf against the reference on m: logits within
 * tol (raised where the configuration's arithmetic differs: see there) and
 * the greedy tokens. */
void compare(const char *what, const struct si_model *m, struct config cf, double tol);

/* The synthetic model p, written to a temporary file (its name into path,
 * at least 32 bytes) and loaded; NULL (the failure checked, the file gone)
 * when either step fails.  The caller frees the model and unlinks path. */
struct si_model *synth_model(const struct si_synth_params *p, const char *what, char *path);

/* si_engine_eval_batch_logits against the reference's token by token. */
void batch_logits(const char *what, const struct si_model *m, double tol);

/* test-engine-cases.c */
void synthetic(const char *arch, uint32_t type, int64_t n_ff, int32_t n_slices, double tol);
void synthetic_types(void);
void powerinfer_layout(const char *arch, uint32_t type);
void attn_auto(void);
void tiny_models(void);

#endif /* SI_TESTS_ENGINE_TEST_H */
