/*
 * internal.h - helpers shared inside the library (not installed).
 */
#ifndef SI_INTERNAL_H
#define SI_INTERNAL_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

/*
 * Write a one-line message into err[0..err_size) (nothing when err is NULL
 * or err_size is 0) and return `status`: the way library functions report
 * what went wrong along with their si_status.
 */
int si__errf(char *err, size_t err_size, int status, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
int si__verrf(char *err, size_t err_size, int status, const char *fmt, va_list ap)
    __attribute__((format(printf, 4, 0)));

/* Seconds on the monotonic clock: for durations. */
static inline double si__now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Seconds of the calling thread's CPU time: for costs where the cores
 * are shared. */
static inline double si__thread_cpu(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Drops the whole pages of [p, p + n) from the process: for a read-only
 * file mapping whose pages were read (they come back from the file if read
 * again), so that what was copied is not resident twice. */
static inline void si__drop_pages(const void *p, size_t n)
{
    const uintptr_t ps = (uintptr_t)sysconf(_SC_PAGESIZE);
    const uintptr_t a = ((uintptr_t)p + ps - 1) / ps * ps, b = ((uintptr_t)p + n) / ps * ps;
    if (b > a)
        madvise((void *)a, b - a, MADV_DONTNEED);
}

/*
 * An option of struct si_context_params that only the StarPU engine has:
 * the field's name (the API's errors), the CLI flag that sets it (the CLI's
 * errors) and, when it needs a part of that engine, the part.
 */
struct si_context_params;
struct si__engine_option {
    const char *field, *flag, *part;
};
/* The first such option p sets, or NULL: one table for the API and the CLI. */
const struct si__engine_option *si__engine_only_option(const struct si_context_params *p);

/*
 * The live public handles (live.c): add one when it is made (false: out of
 * memory), remove it when it is freed (false: it was not live), ask whether
 * it is live.  kind tells the handle types apart (SI__LIVE_LLM, _CONTEXT).
 */
enum { SI__LIVE_LLM, SI__LIVE_CONTEXT };
bool si__live_add(const void *p, int kind);
bool si__live_remove(const void *p, int kind);
bool si__live_has(const void *p, int kind);

/* The tensor type (enum si_type) of a KV cache type (enum si_kv_type;
 * api.c). */
uint32_t si__kv_type_of(int kv_type);

/* FNV-1a 64 of the n bytes at p, continuing from h (start: SI_FNV_BASIS). */
#define SI_FNV_BASIS 14695981039346656037ull
static inline uint64_t si__fnv1a(uint64_t h, const void *p, size_t n)
{
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++)
        h = (h ^ b[i]) * 1099511628211ull;
    return h;
}

#endif /* SI_INTERNAL_H */
