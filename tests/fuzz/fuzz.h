/*
 * fuzz.h - what the fuzz targets in tests/fuzz/ share.
 *
 * Each target (fuzz-gguf.c, fuzz-tokenizer.c, fuzz-profile.c, fuzz-gpuidx.c,
 * fuzz-flash.c) is one libFuzzer entry point over one reader.  The same file
 * builds two ways:
 *  - with fuzz-main.c, by `make check`, into a standalone program that runs
 *    the seed corpus and a fixed number of deterministic mutations of it
 *    (tests/test-fuzz.sh: the short run);
 *  - with clang's -fsanitize=fuzzer, by tools/fuzz, for coverage-guided runs
 *    of any length.
 */
#ifndef SI_TESTS_FUZZ_H
#define SI_TESTS_FUZZ_H

#include <stddef.h>
#include <stdint.h>

struct si_model;

/* The target: one input.  Returns 0 (libFuzzer's convention); a bug shows as
 * a crash, a sanitizer report or fuzz_fail(). */
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Once before the first input (libFuzzer calls it; so does fuzz-main.c). */
int LLVMFuzzerInitialize(int *argc, char ***argv);

/* Write the target's seed files into the existing directory dir, made with
 * the library's own writers (fuzz-main's --write-seeds); 0 or -1. */
int fuzz_write_seeds(const char *dir);

/* Inputs the reader accepted as valid: the standalone runner reports how
 * many seeds were accepted, so that a stale corpus (every seed refused)
 * does not pass unnoticed. */
extern uint64_t fuzz_accepted;

/* A reader broke a promise that is not a memory error (a value out of the
 * range it checked): print why and abort, so both runners see a crash. */
_Noreturn void fuzz_fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* A reader's refusal must be one line: not empty, no newline (else fuzz_fail). */
void fuzz_check_refusal(const char *err);

/* The input as a file for the readers that take a path: a memory file
 * (memfd) rewritten for each input; the returned path stays valid. */
const char *fuzz_file(const uint8_t *data, size_t size);

/* The tiny llama model of tests/tiny-model.c (2 layers of 32 neurons, F32),
 * written once to a temporary file and loaded; never freed. */
struct si_model *fuzz_tiny_model(void);

/* Keeps reads from being optimised away. */
uint64_t fuzz_touch(const void *p, size_t n);
extern volatile uint64_t fuzz_sink;

/* Write n bytes to path; 0 or -1 (the caller says so). */
int fuzz_write_file(const char *path, const void *p, size_t n);

#endif /* SI_TESTS_FUZZ_H */
