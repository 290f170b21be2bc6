/*
 * test.h - the few helpers every test program uses.
 *
 * CHECK(cond, fmt, ...) records a failure with its location and goes on;
 * a test's main() ends with `return test_result();`.  Tests that cannot run
 * here call test_skip(reason), which exits 77 (Automake's SKIP).
 */
#ifndef SI_TESTS_TEST_H
#define SI_TESTS_TEST_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

/* A test program of several files defines SI_TEST_SHARED_COUNTERS before
 * including this, in each, and defines the two counters in one of them. */
#ifdef SI_TEST_SHARED_COUNTERS
extern int test_failures;
extern int test_checks;
#else
static int test_failures;
static int test_checks;
#endif

#define CHECK(cond, ...)                                                                           \
    do {                                                                                           \
        test_checks++;                                                                             \
        if (!(cond)) {                                                                             \
            test_failures++;                                                                       \
            fprintf(stderr, "%s:%d: check failed: %s: ", __FILE__, __LINE__, #cond);               \
            fprintf(stderr, __VA_ARGS__);                                                          \
            fputc('\n', stderr);                                                                   \
        }                                                                                          \
    } while (0)

static inline void test_skip(const char *reason)
{
    printf("SKIP: %s\n", reason);
    exit(77);
}

/* The largest |a[i] - b[i]| over the largest |b[i]| (logits against a
 * reference's). */
static inline double test_rel_err(const float *a, const float *b, int64_t n)
{
    double worst = 0, scale = 0;
    for (int64_t i = 0; i < n; i++) {
        worst = fmax(worst, fabs((double)a[i] - (double)b[i]));
        scale = fmax(scale, fabs((double)b[i]));
    }
    return scale > 0 ? worst / scale : worst;
}

static inline int test_result(void)
{
    printf("%d checks, %d failed\n", test_checks, test_failures);
    return test_failures == 0 ? 0 : 1;
}

#endif /* SI_TESTS_TEST_H */
