/*
 * starinfer.h - the public API of starinfer.
 *
 * starinfer runs large language models whose weights do not fit in GPU memory
 * on one PC, by exploiting FFN activation sparsity: hot neurons on the GPU,
 * cold ones on the CPU, each layer's work expressed as StarPU tasks.
 *
 * A tour (examples/simple.c is this, complete):
 *
 *     struct si_llm *llm;
 *     if (si_llm_load("model.gguf", si_llm_default_params(), &llm) != SI_OK) {
 *         fprintf(stderr, "%s\n", si_last_error());   // "model.gguf: not a GGUF file ..."
 *         return 1;
 *     }
 *     struct si_context *ctx;
 *     si_context_init(llm, si_context_default_params(), &ctx);
 *     struct si_generate_params gp = si_generate_default_params();
 *     gp.n_predict = 64;
 *     si_generate(ctx, "Once upon a time", gp, print_text, NULL, NULL);
 *     struct si_stats st;
 *     si_context_get_stats(ctx, &st);               // tokens/s, tasks, GPU share
 *     si_context_free(ctx);
 *     si_llm_free(llm);
 *
 * Conventions of this header:
 *  - Every call that can fail returns an `si_status`: 0 (SI_OK) on success, a
 *    negative value on failure.  si_status_str() turns a code into a generic
 *    message; si_last_error() gives the one-line message of the calling
 *    thread's last failure, naming what was wrong ("m.gguf: truncated file:
 *    ...").  Calls that return a length or a count return a negative
 *    si_status instead on failure.
 *  - Objects are opaque handles created by `si_<object>_load/init` and released
 *    by `si_<object>_free`; `si_<object>_free(NULL)` is a no-op.
 *  - Options travel in small `struct si_*_params` passed by value, obtained
 *    from `si_*_default_params()` and then changed field by field, so that
 *    fields added later keep their defaults in old code.
 *  - Names.  The library's internal code already uses `si_model`,
 *    `si_tokenizer`, `si_sampler`, `si_engine` (the weights, the tokenizer,
 *    the sampler and the StarPU engine); the shared library exports only what
 *    this header marks SI_API (everything else is built with
 *    -fvisibility=hidden), but public and internal names still share one
 *    namespace inside the library.  So the public handle of a loaded model
 *    (the weights and their tokenizer) is `struct si_llm`, and everything
 *    public lives under si_llm_*, si_context_*, si_generate*, si_stats and a
 *    few enums with their own prefixes (SI_ENGINE_, SI_SPARSE_, SI_STOP_).
 *
 * Thread safety.  si_last_error() is per thread.  A loaded si_llm is only
 * read after si_llm_load() and may be shared by contexts on any threads; a
 * si_context must be used by one thread at a time.  Contexts on the StarPU
 * engine share the process's single StarPU instance: each evaluation waits
 * for every submitted StarPU task, the host's included (correct, not
 * concurrent).  Contexts on one model in several threads give each the
 * tokens it gives alone (tests/test-api-threads, also under ThreadSanitizer).
 *
 * Misuse.  The library keeps the set of its live handles and checks a handle
 * against it before touching it, so these are a status (SI_E_INVALID, or
 * nothing done for the calls that return nothing) with si_last_error()
 * saying what happened, never a crash: a context freed twice, or used by any
 * si_context_* / si_generate* call after its free; a model freed twice, or
 * given to si_context_init() after its free (the si_llm_* queries do not
 * check: they are plain reads of a handle the caller holds); si_llm_free()
 * while contexts of the model are live (refused: the model is kept, free
 * them first); a second call into a context while one runs (another thread's,
 * or the generation's own callback calling back into its context).  A
 * failed evaluation (a bad token, a full context) leaves the context as it
 * was before the call.  What the check cannot see: an address that a later
 * si_llm_load() or si_context_init() reused is that new handle.
 *
 * StarPU.  Contexts on the StarPU engine (the default) need StarPU running.
 * When the host program has already called starpu_init(), the library uses
 * that instance as it is (its workers, its scheduler) and never shuts it
 * down: the host must free its contexts before calling starpu_shutdown().
 * Otherwise the first StarPU context calls starpu_init() (StarPU's
 * environment variables apply: STARPU_NCPU, STARPU_NCUDA, STARPU_SCHED, ...)
 * and freeing the last one calls starpu_shutdown().  Contexts on the
 * reference engine (SI_ENGINE_REF) never touch StarPU.
 */
#ifndef STARINFER_H
#define STARINFER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define SI_API __attribute__((visibility("default")))
#else
#define SI_API
#endif

/* Version of the library, as "MAJOR.MINOR.PATCH". */
#define SI_VERSION_MAJOR 0
#define SI_VERSION_MINOR 1
#define SI_VERSION_PATCH 0

/*
 * Status codes.  One X-macro generates the enum and the messages; values only
 * ever grow at the end of the list.
 */
#define SI_STATUS_LIST(X)                                                                          \
    X(SI_OK, 0, "success")                                                                         \
    X(SI_E_INVALID, -1, "invalid argument")                                                        \
    X(SI_E_NOMEM, -2, "out of memory")                                                             \
    X(SI_E_IO, -3, "input/output error")                                                           \
    X(SI_E_FORMAT, -4, "malformed or unsupported file")                                            \
    X(SI_E_UNSUPPORTED, -5, "unsupported feature")                                                 \
    X(SI_E_NOT_FOUND, -6, "not found")                                                             \
    X(SI_E_RUNTIME, -7, "StarPU runtime error")                                                    \
    X(SI_E_NO_DEVICE, -8, "no suitable device")                                                    \
    X(SI_E_BUDGET, -9, "memory budget too small")

enum si_status {
#define SI_STATUS_ENUM_(name, value, msg) name = value,
    SI_STATUS_LIST(SI_STATUS_ENUM_)
#undef SI_STATUS_ENUM_
};

/* Message for a status code; never NULL ("unknown status" for other values). */
SI_API const char *si_status_str(int status);

/* The library's version string, "MAJOR.MINOR.PATCH". */
SI_API const char *si_version(void);

/*
 * The one-line message of the calling thread's last failed call (a
 * thread-local buffer, overwritten by the next failure on this thread; ""
 * before any).  Never NULL.
 */
SI_API const char *si_last_error(void);

/* ------------------------------------------------------------------ models */

/* A model file loaded with its tokenizer: opaque. */
struct si_llm;

struct si_llm_params {
    /* true (default): map the file (the page cache holds the weights, shared
     * between processes).  false: read the whole file into allocated memory
     * (for file systems without mmap, or to keep the weights from being
     * evicted and re-read). */
    bool use_mmap;
    /* NULL (default): the model's own predictors, if it has any.  Else the
     * path of a predictor file (`starinfer train-predictor
     * --predictors-only`) whose predictors and threshold replace or add to
     * the model's; it must have been made for this model (same shape and
     * FFN weights: SI_E_FORMAT otherwise).  It is always mapped. */
    const char *predictors;
};

SI_API struct si_llm_params si_llm_default_params(void);

/*
 * Load the GGUF (or PowerInfer "PWRI") file at `path`, check its
 * hyperparameters and tensors and load its tokenizer.  On success *out owns
 * everything (free it with si_llm_free()).  Errors: SI_E_INVALID (NULL
 * argument), SI_E_NOT_FOUND (no such file), SI_E_IO (unreadable, not a
 * regular file), SI_E_FORMAT (malformed or truncated file, missing key or
 * tensor), SI_E_UNSUPPORTED (architecture, tensor type or tokenizer it does
 * not know), SI_E_NOMEM; *out is then NULL and si_last_error() says, for
 * example, "m.gguf: not a GGUF file (magic 'hell')".
 */
SI_API int si_llm_load(const char *path, struct si_llm_params params, struct si_llm **out);

/* Free a model; every context made from it must be freed first (while one is
 * live the call is refused and the model kept: see "Misuse" above). */
SI_API void si_llm_free(struct si_llm *llm);

/* Metadata.  Strings belong to the model and live as long as it does. */
SI_API const char *si_llm_arch(const struct si_llm *llm); /* "llama", "bamboo", "opt", ... */
SI_API const char *si_llm_name(const struct si_llm *llm); /* general.name, "" when absent */
SI_API int32_t si_llm_n_ctx_train(const struct si_llm *llm); /* trained context length */
struct si_context_params;
/* Bytes of KV cache one position takes with p's kv_f32 and cache types
 * (every layer's K and V), or a negative SI_E_* for invalid types. */
SI_API int64_t si_llm_kv_bytes_per_token(const struct si_llm *llm,
                                         const struct si_context_params *p);
SI_API int32_t si_llm_n_vocab(const struct si_llm *llm);
SI_API int32_t si_llm_n_embd(const struct si_llm *llm);
SI_API int32_t si_llm_n_layer(const struct si_llm *llm);
SI_API int32_t si_llm_n_head(const struct si_llm *llm);
SI_API int32_t si_llm_n_ff(const struct si_llm *llm); /* FFN neurons per layer */
SI_API bool si_llm_has_predictor(const struct si_llm *llm); /* PowerInfer fc1/fc2 tensors */
SI_API int64_t si_llm_weight_bytes(const struct si_llm *llm); /* tensor data in the file */

/*
 * The string value of metadata key `key` (e.g. "tokenizer.chat_template")
 * into buf[0..cap), NUL-terminated when it fits.  Returns its length
 * (which may be >= cap: then buf holds what fits, truncated, still
 * NUL-terminated when cap > 0), SI_E_NOT_FOUND or SI_E_FORMAT (not a string).
 */
SI_API int64_t si_llm_meta_str(const struct si_llm *llm, const char *key, char *buf, size_t cap);

/* ------------------------------------------------------------------ tokens */

SI_API int32_t si_llm_token_bos(const struct si_llm *llm); /* -1 when none */
SI_API int32_t si_llm_token_eos(const struct si_llm *llm); /* -1 when none */
/* True for end-of-generation tokens (EOS, EOT, <|im_end|>, <end_of_turn>, ...). */
SI_API bool si_llm_token_is_eog(const struct si_llm *llm, int32_t token);
/* Whether the model asks for BOS before a text (tokenizer.ggml.add_bos_token). */
SI_API bool si_llm_adds_bos(const struct si_llm *llm);

/*
 * Tokenize `len` bytes of UTF-8 text into ids[0..cap).  add_bos prepends
 * BOS (when the model has one); parse_special matches special tokens such
 * as "<|im_start|>" whole in the text.  Returns the number of tokens, which
 * may exceed cap (then only cap were written: call again with room; ids may
 * be NULL with cap 0 to count), or a negative si_status (SI_E_INVALID for
 * NULL arguments).
 */
SI_API int64_t si_llm_tokenize(const struct si_llm *llm, const char *text, size_t len,
                               bool add_bos, bool parse_special, int32_t *ids, size_t cap);

/*
 * The bytes of one token into buf[0..cap) (not NUL-terminated; a piece may
 * be part of a UTF-8 character).  Special tokens give their text only when
 * `special`.  Returns the length (may exceed cap: then cap bytes were
 * written) or SI_E_INVALID for an id outside the vocabulary.
 */
SI_API int64_t si_llm_token_to_piece(const struct si_llm *llm, int32_t token, bool special,
                                     char *buf, size_t cap);

/*
 * The text of ids[0..n) into buf[0..cap), NUL-terminated when it fits (the
 * pieces put together).  Returns the text's length (may be >= cap: call
 * again with length + 1 bytes) or SI_E_INVALID for an id outside the
 * vocabulary.
 */
SI_API int64_t si_llm_detokenize(const struct si_llm *llm, const int32_t *ids, size_t n,
                                 bool special, char *buf, size_t cap);

/* One message of a conversation; role "system", "user" or "assistant". */
struct si_chat_message {
    const char *role;
    const char *content;
};

/*
 * Format a conversation with the model's chat template (tokenizer.chat_template:
 * chatml as SmolLM2's, gemma's turns, llama-2's [INST]) into buf[0..cap),
 * NUL-terminated when it fits, ending with the assistant's opening when
 * add_assistant.  Returns the length (may be >= cap), SI_E_INVALID, or
 * SI_E_UNSUPPORTED for a template it does not know.
 */
SI_API int64_t si_llm_chat_apply(const struct si_llm *llm, const struct si_chat_message *msgs,
                                 size_t n, bool add_assistant, char *buf, size_t cap);

/* ---------------------------------------------------------------- contexts */

/* An evaluation state on a model: KV cache, engine, sampler, stats: opaque. */
struct si_context;

/* What evaluates the model. */
enum si_engine_kind {
    SI_ENGINE_REF,    /* the plain-C reference forward pass: one thread, no StarPU */
    SI_ENGINE_STARPU, /* the StarPU task graph over the CPU (and CUDA) workers */
    SI_ENGINE_COUNT
};

/* Which FFN neurons are computed (the StarPU engine only; the reference is dense). */
enum si_sparsity_mode {
    SI_SPARSE_DENSE,     /* every neuron */
    SI_SPARSE_GATE,      /* the gate densely; neurons whose activation is 0 (ReLU) or at most
                          * the gate threshold in magnitude (SiLU/GELU) are skipped */
    SI_SPARSE_PREDICTOR, /* the neurons the model's PowerInfer predictor picks */
    SI_SPARSE_COUNT
};

/*
 * How the StarPU engine multiplies a prompt's batches (decoding is not
 * affected).  The reference converts each matrix product's input to the
 * weights' dot type (Q8_0 for most quantized types) and sums each dot in
 * its own order; a batch can keep both, keep the conversion and sum in
 * another order, or multiply float inputs.
 */
enum si_prefill_mode {
    SI_PREFILL_AUTO,  /* int8 where this CPU has AVX-512 VNNI and a weight
                       * type its batched kernel (Q4_0, Q4_1, Q8_0, Q4_K,
                       * Q5_K, Q6_K), else blas (default) */
    SI_PREFILL_EXACT, /* the reference's own dots on converted inputs: bit
                       * for bit the token-by-token result */
    SI_PREFILL_INT8,  /* converted inputs, as the reference's, through the
                       * batched integer kernel (AVX-512 VNNI; SI_E_UNSUPPORTED
                       * without it), sums in its order; the reference's dots
                       * for types it has no kernel for */
    SI_PREFILL_BLAS,  /* float inputs times dequantized rows, OpenBLAS sgemm */
    SI_PREFILL_COUNT
};

/* "ref", "starpu"; "dense", "gate", "predictor"; "auto", "exact", "int8",
 * "blas"; "?" for other values. */
SI_API const char *si_engine_kind_name(enum si_engine_kind e);
SI_API const char *si_sparsity_mode_name(enum si_sparsity_mode m);
SI_API const char *si_prefill_mode_name(enum si_prefill_mode m);

/*
 * The sampler's chain, in order: repetition penalty over the last
 * repeat_last_n accepted tokens, top-k, top-p, min-p, temperature, then a
 * draw, reproducible from the seed.  temp 0 is greedy (the highest logit
 * after the penalty; ties to the lowest id).
 */
struct si_sampling_params {
    float temp;             /* >= 0; default 0.8 */
    int32_t top_k;          /* >= 0, 0: off; default 40 */
    float top_p;            /* [0, 1], 1: off; default 0.95 */
    float min_p;            /* [0, 1], 0: off; default 0.05 */
    float repeat_penalty;   /* > 0, 1: off (default) */
    int32_t repeat_last_n;  /* >= 0; default 64 */
    uint64_t seed;          /* default 0 */
};

SI_API struct si_sampling_params si_sampling_default_params(void);

/* The KV cache's element types (llama.cpp's --cache-type-k/-v names:
 * si_kv_type_name, si_kv_type_parse). */
enum si_kv_type {
    SI_KV_F16 = 0, /* default */
    SI_KV_Q8_0,    /* blocks of 32: 8-bit values and an fp16 scale (34 bytes) */
    SI_KV_Q4_0,    /* blocks of 32: 4-bit values and an fp16 scale (18 bytes) */
    SI_KV_TYPE_COUNT
};

SI_API const char *si_kv_type_name(enum si_kv_type t); /* "f16", "q8_0", "q4_0" */
/* SI_OK and *t, or SI_E_INVALID for a name that is none of them. */
SI_API int si_kv_type_parse(const char *name, enum si_kv_type *t);

struct si_context_params {
    int32_t n_ctx;    /* KV cache length in tokens; 0 (default): the model's
                       * training context, cut (in steps of 256, not below
                       * 4096) to keep the KV cache within 1 GiB */
    bool kv_f32;      /* KV cache in f32 (default false: fp16, as llama.cpp) */
    /* Without kv_f32: K's and V's types (default SI_KV_F16).  A quantized
     * cache is written quantized and read by the tiled attention, whose
     * arithmetic every query then takes (docs/attention.md#kv-cache-types). */
    enum si_kv_type cache_type_k, cache_type_v;
    enum si_engine_kind engine; /* default SI_ENGINE_STARPU: it decodes 1.3x and
                                 * prefills 3.5x faster than the reference on
                                 * SmolLM2-135M with 2 CPU workers (docs/library.md) */
    enum si_sparsity_mode sparsity; /* default SI_SPARSE_DENSE */
    float gate_threshold; /* gate mode on SiLU/GELU models: |act(gate)| must exceed
                           * it; 0 (default): the profile's per-layer thresholds
                           * when it has them, else exact zeros only */
    int64_t vram_budget;  /* bytes the GPU may hold: the engine's reserve (buffers,
                           * and the attention of gpu_attention's layers with their
                           * KV caches) plus FFN neurons, the hottest first (or the
                           * placement's); 0 (default): none, every neuron on the
                           * CPU.  Below the reserve: SI_E_BUDGET; without a CUDA
                           * worker: SI_E_NO_DEVICE */
    int32_t gpu_attention; /* with vram_budget: the layers (the first ones) whose
                            * attention runs on the GPU; 0 (default): as many as
                            * pay against the hottest neurons (none in dense mode
                            * or with a placement); -1: none; N: the first N (all
                            * of them when N is at least the model's layers) */
    int64_t dram_budget;  /* bytes of host memory the model may keep resident;
                           * 0 (default): unlimited.  When the file's tensor data
                           * plus the KV cache exceed it, the flash tier serves
                           * the CPU's FFN neurons from the flash store
                           * (flash_store): attention, embeddings, norms,
                           * predictors, gating rows (gate mode), hot neurons and
                           * the KV cache stay resident, and per layer a cache of
                           * the neurons active in the last flash_window tokens
                           * gets what the budget leaves.  It needs the StarPU
                           * engine and the gate or predictor mode; SI_E_BUDGET
                           * when even the resident part does not fit */
    const char *flash_store; /* the flash store (`starinfer convert --bundle`);
                              * NULL (default): the model's path + ".flash",
                              * used when the budget asks for it.  When set,
                              * the flash tier is used whatever the budget
                              * (without one, the caches may grow to every
                              * cold neuron); read during init only */
    int32_t flash_window; /* tokens whose active neurons stay in the flash caches
                           * (k); 0 (default): 5, the paper's; -1: none (every
                           * active neuron is read for every token); set on the
                           * reference engine, SI_E_INVALID (as flash_store) */
    float flash_pin;      /* share (0..1] of each layer's flash cache kept for its
                           * hottest cold neurons by the profile (profile_path):
                           * read once, never evicted, as PowerInfer keeps its
                           * hot neurons; the window gets the rest.  0
                           * (default): none, the window only.  It pays with
                           * a profile that foretells the predictor's choices
                           * (7B, trained predictors: 21% fewer bytes read)
                           * and costs where it does not (docs/flash.md).
                           * Needs profile_path and the flash tier
                           * (SI_E_INVALID otherwise) */
    float input_sparsity; /* training-free input sparsity (TEAL), the target
                           * share S of each matrix product's input entries
                           * set to 0 (the smallest in magnitude, by the
                           * profile's per-layer thresholds: `starinfer
                           * profile --input-sparsity`; needs profile_path),
                           * in [0, 0.9]; 0 (default): off.  Dense mode: every
                           * product of a layer; gate and predictor modes:
                           * the attention's (the FFN keeps their sparsity).
                           * Products read only their non-zero inputs' rows
                           * of the model's transposed copies (`starinfer
                           * convert --transpose`); a model without them
                           * gets the zeros, not the speed.  Decoding only:
                           * prompt batches (n_batch > 1) are dense */
    const char *profile_path; /* activation profile (`starinfer profile`): orders
                               * the neurons hottest first; NULL (default): none;
                               * read during si_context_init only */
    const char *placement_path; /* the GPU's neurons (`starinfer place`, or
                                 * PowerInfer's GPU index file), gate and predictor
                                 * modes; its capacity is the VRAM budget unless
                                 * vram_budget is set; NULL (default): the hottest
                                 * neurons of the profile; read during init only */
    int32_t n_batch;    /* prefill: tokens per batch of GEMM tasks; 0 (default): 128;
                         * 1: token by token */
    int32_t n_slices;   /* cold FFN slices per layer; 0 (default): one per CPU worker */
    int32_t attn_split; /* attention's products in this many row slices; 0
                         * (default): one per CPU worker when worth it; 1: one
                         * task per layer */
    enum si_prefill_mode prefill; /* the prompt batches' arithmetic (default
                                   * SI_PREFILL_AUTO; see the enum) */
    enum si_prefill_mode shared_arith; /* the steps' arithmetic once contexts
                                   * share this one's engine
                                   * (si_context_init_shared): SI_PREFILL_EXACT,
                                   * decoding's (each context's tokens those it
                                   * gets on its own, bit for bit); INT8, the
                                   * batched integer kernels for every token
                                   * of a step (AVX-512 VNNI; SI_E_UNSUPPORTED
                                   * without), where the types have them, else
                                   * the reference's dots: several contexts'
                                   * tokens for less than their cost alone,
                                   * each context's tokens independent of the
                                   * others' but not decoding's bit for bit;
                                   * AUTO (default), INT8 where the CPU has
                                   * the kernels, else EXACT.  BLAS: refused
                                   * (sgemm sums a row differently beside
                                   * other rows) */
    bool redux;         /* add the FFN slices' outputs with STARPU_REDUX instead of
                         * a merge task (default false; not deterministic) */
    bool caller_worker; /* when this context starts StarPU (the first StarPU
                         * context, StarPU not started by the host): the
                         * calling thread becomes StarPU's CPU worker 0 and
                         * runs tasks while it waits for an evaluation,
                         * instead of StarPU starting a thread of its own
                         * beside it, so that the process keeps one busy
                         * thread per CPU worker.  Every evaluation and the
                         * last si_context_free must then come from this
                         * thread (evaluations on another thread fail with
                         * SI_E_RUNTIME).  Default false; the CLI sets it
                         * (docs/cli.md: STARINFER_CALLER_WORKER) */
    bool mpi;           /* run the model across the ranks of MPI_COMM_WORLD (the program
                         * started by mpirun) with StarPU-MPI: a pipeline of layers, each
                         * rank the layers of about 1/N of the weights' bytes and only
                         * those read; every rank makes the same calls, rank 0 gets the
                         * logits (the other ranks' are not this token's), and the token
                         * it samples (si_context_sample, si_generate) is every rank's;
                         * so is rank 0's callback's answer in si_generate.
                         * StarPU-MPI starts with the first context and stops with the
                         * last (once per process: MPI starts once).  The StarPU engine
                         * on CPU workers, in memory (no VRAM budget, flash tier, input
                         * sparsity); prompts token by token.  Default
                         * false; SI_E_UNSUPPORTED when this library has no StarPU-MPI */
    struct si_sampling_params sampling;
    /* Notices that are not errors ("no CUDA worker: vram_budget ignored",
     * the profile's thresholds, ...), one line each without a newline; NULL
     * (default): dropped.  Called from si_context_init on its thread. */
    void (*log)(void *user, const char *line);
    void *log_user;
};

SI_API struct si_context_params si_context_default_params(void);

/*
 * Make a context on `llm` (which must outlive it).  Starts StarPU or adopts
 * the host's instance for the StarPU engine (see the top of this header).
 * Errors: SI_E_INVALID (a parameter out of range, with its name; sparsity,
 * a VRAM budget, a profile, a placement, a prefill mode or redux on the
 * reference engine;
 * predictor mode on a model without predictor tensors), SI_E_BUDGET
 * (dram_budget too small, or a VRAM budget below what the engine keeps on
 * the GPU besides FFN neurons, or a placement that does not fit it),
 * SI_E_NOT_FOUND / SI_E_FORMAT (profile or placement file), SI_E_NO_DEVICE
 * (a VRAM budget or placement without a CUDA worker), SI_E_RUNTIME
 * (StarPU), SI_E_NOMEM; *out is then NULL.
 */
SI_API int si_context_init(struct si_llm *llm, struct si_context_params params,
                           struct si_context **out);

/*
 * Another context on first's engine: the same model, weights and options,
 * with a KV cache, position, sampler and history of its own, so that it
 * costs a KV cache (n_ctx positions) and not another copy of the engine.
 * Contexts sharing an engine that evaluate at the same time, each on its
 * own thread, are decoded together: a step takes the next token of every
 * one of them as one batch, which reads the weights once.  A prompt goes
 * in the batches it would have alone (n_batch tokens), a step each, which
 * alternate with the others' steps.  A step waits for the contexts inside
 * si_generate* to have their next token in, for at most 5 ms; a context
 * evaluating outside one is not waited for.  Each context's results are
 * those it gets alone, bit for bit (tests/test-shared.c): its decoding in
 * the reference's arithmetic whatever the step's size, its prompt in its
 * own batches.  first: a StarPU-engine context made with caller_worker
 * false, whose engine takes batches (not n_batch 1, the flash tier or MPI):
 * else SI_E_INVALID or SI_E_UNSUPPORTED with the reason; SI_E_NOMEM.  The
 * contexts are freed in any order; the engine goes with the last.
 */
SI_API int si_context_init_shared(struct si_context *first, struct si_context **out);

/* Free a context (the last StarPU context the library started StarPU for stops it). */
SI_API void si_context_free(struct si_context *ctx);

SI_API const struct si_llm *si_context_llm(const struct si_context *ctx);
SI_API int32_t si_context_n_ctx(const struct si_context *ctx);  /* KV cache length */
SI_API int32_t si_context_n_past(const struct si_context *ctx); /* tokens in the cache */
/* The tokens in the cache, n_past of them (valid until the next call on ctx). */
SI_API const int32_t *si_context_tokens(const struct si_context *ctx);

/*
 * Across MPI ranks (params.mpi): this process's rank and the number of
 * ranks (0 and 1 otherwise).  Every rank makes the same calls with the same
 * arguments; what only rank 0 knows (a line a user typed) reaches the others
 * with si_context_share: size bytes at buf as rank 0 has them, on every rank
 * (each passes the same size; nothing happens with one rank).  SI_E_INVALID
 * for buf NULL with size > 0.
 */
SI_API int si_context_mpi_rank(const struct si_context *ctx);
SI_API int si_context_mpi_size(const struct si_context *ctx);
SI_API int si_context_share(struct si_context *ctx, void *buf, size_t size);

/*
 * Evaluate one token at the next position (decoding).  The logits of the
 * next token are then si_context_logits().  SI_E_INVALID (token outside the
 * vocabulary), SI_E_BUDGET (the cache is full), SI_E_RUNTIME.
 */
SI_API int si_context_eval(struct si_context *ctx, int32_t token);

/*
 * Evaluate tokens[0..n) at the next positions (prefill): on the StarPU
 * engine in batches of n_batch tokens of GEMM tasks; on the reference one by
 * one.  The logits are the last token's.  SI_E_INVALID (n < 1, a token
 * outside the vocabulary: nothing is evaluated), SI_E_BUDGET (the cache
 * cannot hold them: nothing is evaluated), SI_E_RUNTIME.
 */
SI_API int si_context_eval_batch(struct si_context *ctx, const int32_t *tokens, int32_t n);

/* The n_vocab logits after the last evaluation; NULL when nothing was
 * evaluated since the context was made, reset or rewound.  Valid until the
 * next call on ctx. */
SI_API const float *si_context_logits(const struct si_context *ctx);

/* Empty the KV cache and the sampler's history of accepted tokens. */
SI_API void si_context_reset(struct si_context *ctx);

/*
 * Keep the first n_keep tokens of the cache and forget the rest (the next
 * token goes to position n_keep); the sampler's history becomes those
 * tokens.  The logits are gone until the next evaluation.  SI_E_INVALID
 * unless 0 <= n_keep <= n_past.
 */
SI_API int si_context_rewind(struct si_context *ctx, int32_t n_keep);

/*
 * For a whole token sequence (a conversation so far, say): rewind the cache
 * to the longest prefix it shares with tokens[0..n), keeping at most n - 1
 * so that at least one token remains to evaluate and give logits.  Returns
 * that prefix's length k (evaluate tokens[k..n) next), or SI_E_INVALID.
 */
SI_API int32_t si_context_reuse_prefix(struct si_context *ctx, const int32_t *tokens, int32_t n);

/*
 * Context shift: drop the cache's tokens [n_keep, n_keep + n_discard) and
 * move the later ones down, as llama.cpp's context shift does: their values
 * move as they are, their keys are rotated back by n_discard positions
 * (RoPE's rotation by -n_discard, in f32; an fp16 cache rounds them once
 * more), so that they read as if evaluated at their new positions.  The
 * history (si_context_tokens) and n_past follow; the logits stay.  The
 * cache's later evaluations then differ from a fresh evaluation of the kept
 * tokens by that rounding, and by what the dropped tokens had put into the
 * kept ones' values.  SI_E_INVALID: n_discard < 1 or past n_past;
 * SI_E_UNSUPPORTED: a model with learned positions (no RoPE: OPT), or a
 * context across MPI ranks.
 */
SI_API int si_context_shift(struct si_context *ctx, int32_t n_keep, int32_t n_discard);

/*
 * Choose the next token from the current logits with the context's sampler
 * (it does not accept it).  SI_E_INVALID when there are no logits.
 */
SI_API int si_context_sample(struct si_context *ctx, int32_t *token);

/* Add a token to the sampler's history (the repetition penalty's window). */
SI_API int si_context_accept(struct si_context *ctx, int32_t token);

/* Replace the sampling parameters (the history is kept; the random stream
 * restarts from the new seed).  SI_E_INVALID for a value out of range. */
SI_API int si_context_set_sampling(struct si_context *ctx, struct si_sampling_params p);

/* -------------------------------------------------------------- generation */

/*
 * Called once per generated token with its id and the text it completes:
 * `text[0..len)` is the UTF-8 that became whole with this token (empty when
 * a character's bytes continue in the next token; not NUL-terminated).  At
 * the end, bytes of a character left incomplete come in one last call with
 * token -1.  Return true to go on, false to stop at once.
 */
typedef bool (*si_token_fn)(void *user, int32_t token, const char *text, size_t len);

struct si_generate_params {
    int32_t n_predict;  /* most tokens to generate; default 128 */
    bool ignore_eos;    /* go on past end-of-generation tokens (default false) */
    bool parse_special; /* si_generate: special tokens in the prompt text are
                         * matched whole (default true) */
    bool context_shift; /* a full context shifts (si_context_shift) instead of
                         * stopping: half the tokens past the first n_keep
                         * are dropped, and generation goes on (default
                         * false: SI_STOP_CONTEXT) */
    int32_t n_keep;     /* tokens a shift keeps at the start, the BOS among
                         * them (default 0: the BOS alone, where the model
                         * adds one) */
};

SI_API struct si_generate_params si_generate_default_params(void);

enum si_stop_reason {
    SI_STOP_LENGTH,   /* n_predict tokens generated */
    SI_STOP_EOG,      /* an end-of-generation token was sampled (not passed on) */
    SI_STOP_CALLBACK, /* the callback returned false */
    SI_STOP_CONTEXT,  /* the KV cache is full */
    SI_STOP_COUNT
};

struct si_generate_result {
    int32_t n_prompt;        /* tokens of the prompt evaluated */
    int32_t n_generated;     /* tokens passed to the callback */
    enum si_stop_reason stop;
    double prompt_seconds;   /* wall time of the prompt's evaluation */
    double generate_seconds; /* wall time of the generation loop (sampling,
                              * evaluations and callbacks) */
    int32_t n_shifted;       /* tokens context shifts dropped (context_shift) */
};

/*
 * Continue the context with `prompt` (tokenized with BOS when the cache is
 * empty and the model asks for it), then generate: sample, pass the token to
 * `cb` (may be NULL), accept it, evaluate it, until a stop reason.  The
 * prompt's tokens are accepted into the sampler's history too.  The last
 * generated token is not evaluated (nothing needs its logits): the cache
 * ends with the token before it.  `res` (may be NULL) receives the counts and
 * times.  SI_E_INVALID (NULL ctx or prompt, empty prompt), SI_E_BUDGET (the
 * prompt does not fit the cache), SI_E_RUNTIME; tokens already passed to cb
 * stay generated.
 */
SI_API int si_generate(struct si_context *ctx, const char *prompt, struct si_generate_params gp,
                       si_token_fn cb, void *user, struct si_generate_result *res);

/* The same from tokens: evaluates tokens[0..n) then generates; n may be 0
 * when the context already has logits. */
SI_API int si_generate_tokens(struct si_context *ctx, const int32_t *tokens, int32_t n,
                              struct si_generate_params gp, si_token_fn cb, void *user,
                              struct si_generate_result *res);

/* ------------------------------------------------------------------- stats */

#define SI_MAX_TASK_KINDS 32

/* One kind of StarPU task ("attn", "ffn_cold", "merge", ...). */
struct si_task_stat {
    const char *name; /* static string */
    bool batch;       /* a task of batched prefill (attn_batch, ...) */
    int64_t count;    /* tasks run */
    double seconds;   /* time inside the tasks' functions, summed over workers */
};

/*
 * Totals since the context was made or si_context_reset_stats().  Prefill is
 * si_context_eval_batch() (and the prompts of si_generate), decoding is
 * si_context_eval(); their times are the evaluations' wall time (sampling
 * excluded).
 */
struct si_stats {
    enum si_engine_kind engine;
    enum si_sparsity_mode sparsity;
    int64_t prefill_tokens;
    double prefill_seconds;
    double prefill_tokens_per_s; /* 0 when none */
    int64_t decode_tokens;
    double decode_seconds;
    double decode_tokens_per_s; /* 0 when none */

    /* FFN neurons summed over layers and tokens: those that exist, and the
     * active ones (activation not zero after the sparsity mode) computed on
     * GPU workers (hot slices; a GPU slice that does not count its active
     * neurons is charged whole) and on CPU workers.  The StarPU engine counts
     * the tokens it evaluates one by one (not prefill batches); the
     * reference counts every token, all on the CPU. */
    int64_t neurons_total;
    int64_t neurons_gpu;
    int64_t neurons_cpu;
    double gpu_share; /* neurons_gpu / (neurons_gpu + neurons_cpu): PowerInfer's
                       * neuron load on the GPU; 0 when none */

    /* The StarPU engine (zeros on the reference). */
    unsigned n_cpu_workers, n_cuda_workers;
    int32_t n_slices;          /* cold FFN slices per layer */
    int64_t hot_bytes;         /* FFN weights placed in the GPU's hot slices */
    int32_t gpu_attention_layers; /* layers whose attention runs on the GPU */
    int64_t gpu_budget;        /* the VRAM budget the engine placed under (0: none) */
    int64_t gpu_accounted;     /* GPU bytes of the engine's handles: reserve + hot slices */
    int64_t gpu_allocated_peak; /* the most StarPU had allocated on the CUDA nodes */
    int64_t packed_bytes;      /* weights the engine holds packed 8 rows at a time
                                * (its own copy, read faster; docs/engine.md) */
    int64_t step_tokens;       /* tokens the engine evaluated one by one */
    double step_seconds;       /* their wall time */
    int64_t step_tasks;        /* tasks submitted for them */
    double step_submit_seconds; /* the part of step_seconds spent creating and
                                 * submitting those tasks */
    double step_submit_cpu_seconds; /* the submitting thread's CPU time in it
                                     * (without the time it waited for a core:
                                     * the cost where cores are shared) */
    int64_t batch_tokens;      /* tokens it evaluated in prefill batches */
    double batch_seconds;
    int64_t batch_tasks;
    /* Steps of contexts sharing the engine (si_context_init_shared), all of
     * theirs since the reset: how many, their tokens, and the contexts they
     * decoded together (shared_seqs / shared_steps: the mean batch). */
    int64_t shared_steps, shared_tokens, shared_seqs;
    double shared_seconds;
    enum si_prefill_mode prefill; /* their arithmetic: exact, int8 or blas (auto
                                   * as it resolved on this CPU) */
    int n_task_kinds;
    struct si_task_stat tasks[SI_MAX_TASK_KINDS];

    /* The flash tier (zeros without one).  Neurons, bytes, requests and
     * times are totals over the tokens evaluated one by one and their
     * layers: neurons read from the store and found in the caches, bytes
     * read and read requests, the wall time the load tasks waited for the
     * reads (I/O latency) and spent in cache bookkeeping. */
    bool flash;
    bool flash_direct;        /* reads bypass the page cache (O_DIRECT) */
    int32_t flash_window;
    int64_t dram_resident;    /* host bytes resident besides the caches */
    int64_t flash_cache_bytes;
    int64_t flash_cache_records; /* records per layer cache (the smallest) */
    int64_t flash_loads, flash_hits, flash_bytes, flash_reads;
    double flash_io_seconds, flash_manage_seconds;
};

/* Fill *out; both non-NULL (else nothing happens). */
SI_API void si_context_get_stats(const struct si_context *ctx, struct si_stats *out);

/* Start the totals again from zero. */
SI_API void si_context_reset_stats(struct si_context *ctx);

#ifdef __cplusplus
}
#endif

#endif /* STARINFER_H */
