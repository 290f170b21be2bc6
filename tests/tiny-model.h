/*
 * tiny-model.h - tiny GGUF models of every architecture, written weight by
 * weight (random F32 weights from a fixed seed), for the tests of the model
 * layer and of the engine.
 */
#ifndef SI_TESTS_TINY_MODEL_H
#define SI_TESTS_TINY_MODEL_H

/* The shape: n_embd, n_ff, layers, heads, kv heads (OPT: heads), head size,
 * vocabulary, context. */
enum { D = 16, FF = 32, NL = 2, NH = 4, NKV = 2, HD = D / NH, NV = 40, NCTX = 128 };

/* What to break in the tiny model. */
enum fault {
    FAULT_NONE,
    FAULT_NO_BLOCK_COUNT,
    FAULT_HEADS_NOT_DIVIDING,
    FAULT_KV_NOT_DIVIDING,
    FAULT_BAD_ARCH,
    FAULT_SHAPE,
    FAULT_MISSING_TENSOR,
    FAULT_VOCAB_MISMATCH,
    FAULT_BAD_ACTIVATION,
    FAULT_NEGATIVE_FF,
    FAULT_BAD_PREDICTOR_INPUT,
    FAULT_PREDICTOR_INPUT_TYPE,
};

/* Write a tiny model of architecture `arch` (llama, bamboo, opt, gemma3,
 * falcon) to path, with one fault; aborts when it cannot be written. */
void write_model(const char *path, const char *arch, enum fault fault);

#endif /* SI_TESTS_TINY_MODEL_H */
