/*
 * fuzz-main.c - the standalone runner of a fuzz target (see fuzz.h): every
 * seed file, then a fixed number of mutations of them, each one a pure
 * function of (seed, iteration), so any input it ever ran can be made again.
 *
 *   fuzz-X [-n N] [-s SEED] [-t SECONDS] [--min-accepted K] PATH...
 *   fuzz-X --only I [--save FILE] [-s SEED] PATH...
 *   fuzz-X --write-seeds DIR
 *
 * PATH: seed files or directories of them.  The run ends after N mutations
 * (default 2000) or SECONDS (default no limit), and fails when fewer than K
 * of the seeds were accepted by the reader (a corpus gone stale).  On a crash
 * (a signal or a sanitizer report) it names the iteration to pass to --only.
 */
#include "fuzz.h"

#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define MAX_LEN (1u << 20)

struct seed {
    char *path;
    uint8_t *data;
    size_t size;
};

static struct seed *seeds;
static size_t n_seeds;
static const char *prog = "fuzz";
static long long current = -1; /* -1 while running the seeds */

static void die(const char *fmt, const char *arg)
{
    fprintf(stderr, "%s: error: ", prog);
    fprintf(stderr, fmt, arg);
    fputc('\n', stderr);
    exit(2);
}

/* ------------------------------------------------------------------ seeds */

static void add_file(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (f == NULL)
        die("cannot open %s", path);
    uint8_t *buf = malloc(MAX_LEN);
    if (buf == NULL)
        die("out of memory for %s", path);
    size_t n = fread(buf, 1, MAX_LEN, f);
    bool big = n == MAX_LEN && fgetc(f) != EOF;
    fclose(f);
    if (big)
        die("%s: a seed above 1 MiB", path);
    seeds = realloc(seeds, (n_seeds + 1) * sizeof *seeds);
    if (seeds == NULL || (seeds[n_seeds].path = strdup(path)) == NULL)
        die("out of memory for %s", path);
    seeds[n_seeds].data = buf;
    seeds[n_seeds].size = n;
    n_seeds++;
}

static int by_name(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static void add_path(const char *path)
{
    struct stat st;
    if (stat(path, &st) != 0)
        die("%s: no such file or directory", path);
    if (!S_ISDIR(st.st_mode)) {
        add_file(path);
        return;
    }
    DIR *d = opendir(path);
    if (d == NULL)
        die("cannot read the directory %s", path);
    char **names = NULL;
    size_t n = 0;
    for (struct dirent *e; (e = readdir(d)) != NULL;) {
        if (e->d_name[0] == '.')
            continue;
        names = realloc(names, (n + 1) * sizeof *names);
        if (names == NULL || asprintf(&names[n], "%s/%s", path, e->d_name) < 0)
            die("out of memory in %s", path);
        n++;
    }
    closedir(d);
    qsort(names, n, sizeof *names, by_name); /* the same order on every machine */
    for (size_t i = 0; i < n; i++) {
        add_file(names[i]);
        free(names[i]);
    }
    free(names);
}

/* -------------------------------------------------------------- mutations */

static uint64_t rng;

static uint64_t next(void)
{
    /* splitmix64 */
    uint64_t z = (rng += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static size_t below(size_t n)
{
    return n == 0 ? 0 : (size_t)(next() % n);
}

static const uint64_t interesting[] = {0,          1,          2,          0x7f,
                                       0x80,       0xff,       0x100,      0x7fff,
                                       0xffff,     0x10000,    0x7fffffff, 0x80000000,
                                       0xffffffff, 1ull << 32, 1ull << 62, UINT64_MAX};

/* One mutation of buf (size *n, capacity MAX_LEN). */
static void mutate(uint8_t *buf, size_t *n)
{
    size_t len = *n;
    if (len == 0) {
        buf[0] = (uint8_t)next();
        *n = 1;
        return;
    }
    size_t at = below(len);
    switch (next() % 10) {
    case 0: /* a bit */
        buf[at] ^= (uint8_t)(1u << below(8));
        break;
    case 1: /* a byte: an interesting value */
        buf[at] = (uint8_t)interesting[below(6)];
        break;
    case 2: /* a u32 or u64 (little-endian): an interesting value, or the size */
    case 3: {
        size_t w = next() & 1 ? 8 : 4;
        if (at + w > len)
            at = len >= w ? len - w : 0;
        uint64_t v = next() % 4 == 0 ? (uint64_t)len - below(3)
                                     : interesting[below(sizeof interesting / sizeof *interesting)];
        for (size_t k = 0; k < w && at + k < len; k++)
            buf[at + k] = (uint8_t)(v >> (8 * k));
        break;
    }
    case 4: /* a small add or subtract */
        buf[at] = (uint8_t)(buf[at] + (uint8_t)(below(33)) - 16);
        break;
    case 5: /* truncate */
        *n = at;
        break;
    case 6: { /* erase a chunk */
        size_t k = 1 + below(len - at < 64 ? len - at : 64);
        memmove(buf + at, buf + at + k, len - at - k);
        *n = len - k;
        break;
    }
    case 7: { /* insert random bytes */
        size_t k = 1 + below(16);
        if (len + k > MAX_LEN)
            break;
        memmove(buf + at + k, buf + at, len - at);
        for (size_t i = 0; i < k; i++)
            buf[at + i] = (uint8_t)next();
        *n = len + k;
        break;
    }
    case 8: { /* copy a chunk of this input over another place */
        size_t from = below(len), k = 1 + below(32);
        if (from + k > len)
            k = len - from;
        if (at + k > len)
            k = len - at;
        memmove(buf + at, buf + from, k);
        break;
    }
    default: { /* splice in a chunk of another seed */
        const struct seed *o = &seeds[below(n_seeds)];
        if (o->size == 0)
            break;
        size_t from = below(o->size), k = 1 + below(64);
        if (from + k > o->size)
            k = o->size - from;
        if (at + k > len)
            k = len - at;
        memcpy(buf + at, o->data + from, k);
        break;
    }
    }
}

/* Input i of the run with seed s: a seed and 1 to 8 mutations of it. */
static size_t make_input(uint64_t s, long long i, uint8_t *buf)
{
    rng = s ^ ((uint64_t)i * 0xd1342543de82ef95ull);
    next();
    const struct seed *src = &seeds[below(n_seeds)];
    memcpy(buf, src->data, src->size);
    size_t n = src->size;
    for (size_t k = 1 + below(8); k > 0; k--)
        mutate(buf, &n);
    return n;
}

/* ---------------------------------------------------------------- crashes */

static void say(const char *s)
{
    ssize_t r = write(2, s, strlen(s));
    (void)r;
}

static void name_input(void)
{
    char num[32], *p = num + sizeof num;
    *--p = '\0';
    if (current < 0) {
        say("\nfuzz: crashed on one of the seeds (run them one by one to see which)\n");
        return;
    }
    long long v = current;
    do {
        *--p = (char)('0' + v % 10);
        v /= 10;
    } while (v > 0);
    say("\nfuzz: crashed on input ");
    say(p);
    say(": make it again with --only ");
    say(p);
    say(" --save FILE (same -s and seeds)\n");
}

static void on_signal(int sig)
{
    name_input();
    signal(sig, SIG_DFL);
    raise(sig);
}

/* Called by AddressSanitizer / UBSan before they exit on a report. */
extern void __sanitizer_set_death_callback(void (*cb)(void)) __attribute__((weak));

/* ------------------------------------------------------------------- main */

static long long number(const char *s, const char *what)
{
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno != 0 || end == s || *end != '\0' || v < 0)
        die("%s must be a whole number >= 0", what);
    return v;
}

int main(int argc, char **argv)
{
    const char *slash = strrchr(argv[0], '/');
    prog = slash != NULL ? slash + 1 : argv[0];
    long long n_iter = 2000, only = -1, min_accepted = 0;
    uint64_t s = 1;
    double max_seconds = 0;
    const char *save = NULL, *seeds_dir = NULL;
    int first = 1;
    for (; first < argc && argv[first][0] == '-'; first++) {
        const char *a = argv[first];
        if (strcmp(a, "--") == 0) {
            first++;
            break;
        }
        if (first + 1 >= argc)
            die("%s needs a value", a);
        const char *v = argv[++first];
        if (strcmp(a, "-n") == 0)
            n_iter = number(v, "-n");
        else if (strcmp(a, "-s") == 0)
            s = (uint64_t)number(v, "-s");
        else if (strcmp(a, "-t") == 0)
            max_seconds = (double)number(v, "-t");
        else if (strcmp(a, "--only") == 0)
            only = number(v, "--only");
        else if (strcmp(a, "--save") == 0)
            save = v;
        else if (strcmp(a, "--min-accepted") == 0)
            min_accepted = number(v, "--min-accepted");
        else if (strcmp(a, "--write-seeds") == 0)
            seeds_dir = v;
        else
            die("unknown option %s", a);
    }
    LLVMFuzzerInitialize(&argc, &argv);
    if (seeds_dir != NULL)
        return fuzz_write_seeds(seeds_dir) == 0 ? 0 : 1;
    for (int i = first; i < argc; i++)
        add_path(argv[i]);
    if (n_seeds == 0)
        die("no seed files given%s", "");

    signal(SIGSEGV, on_signal);
    signal(SIGBUS, on_signal);
    signal(SIGABRT, on_signal);
    signal(SIGFPE, on_signal);
    signal(SIGILL, on_signal);
    if (__sanitizer_set_death_callback != NULL)
        __sanitizer_set_death_callback(name_input);

    uint8_t *buf = malloc(MAX_LEN);
    if (buf == NULL)
        die("out of memory%s", "");
    if (only >= 0) {
        current = only;
        size_t n = make_input(s, only, buf);
        if (save != NULL) {
            if (fuzz_write_file(save, buf, n) != 0)
                die("cannot write %s", save);
            printf("%s: input %lld (%zu bytes) written to %s\n", prog, only, n, save);
        }
        LLVMFuzzerTestOneInput(buf, n);
        printf("%s: input %lld ran\n", prog, only);
        free(buf);
        return 0;
    }

    struct timespec t0, t;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (size_t i = 0; i < n_seeds; i++) {
        /* A copy of exactly its size, so reads past the end are caught. */
        uint8_t *copy = malloc(seeds[i].size ? seeds[i].size : 1);
        if (copy == NULL)
            die("out of memory%s", "");
        memcpy(copy, seeds[i].data, seeds[i].size);
        LLVMFuzzerTestOneInput(copy, seeds[i].size);
        free(copy);
    }
    const uint64_t accepted = fuzz_accepted;
    long long done = 0;
    double secs = 0;
    for (; done < n_iter; done++) {
        current = done;
        size_t n = make_input(s, done, buf);
        uint8_t *in = malloc(n ? n : 1);
        if (in == NULL)
            die("out of memory%s", "");
        memcpy(in, buf, n);
        LLVMFuzzerTestOneInput(in, n);
        free(in);
        if ((done & 15) == 15 && max_seconds > 0) {
            clock_gettime(CLOCK_MONOTONIC, &t);
            if ((double)(t.tv_sec - t0.tv_sec) + 1e-9 * (double)(t.tv_nsec - t0.tv_nsec) >=
                max_seconds) {
                done++;
                break;
            }
        }
    }
    clock_gettime(CLOCK_MONOTONIC, &t);
    secs = (double)(t.tv_sec - t0.tv_sec) + 1e-9 * (double)(t.tv_nsec - t0.tv_nsec);
    printf("%s: %zu seeds (%llu accepted), %lld mutations (%llu accepted) in %.1f s, seed %llu: "
           "no crash\n",
           prog, n_seeds, (unsigned long long)accepted, done,
           (unsigned long long)(fuzz_accepted - accepted), secs, (unsigned long long)s);
    free(buf);
    if ((long long)accepted < min_accepted) {
        fprintf(stderr,
                "%s: error: only %llu of the %zu seeds were accepted (at least %lld expected): "
                "the corpus is stale, write it again with --write-seeds\n",
                prog, (unsigned long long)accepted, n_seeds, min_accepted);
        return 1;
    }
    return 0;
}
