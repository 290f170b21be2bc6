/*
 * bench-sparse-ffn.c - dense vs sparse FFN of one layer on one CPU thread.
 *
 * One LLaMA-7B layer (n_embd 4096, n_ff 11008, as PowerInfer's Fig. 16),
 * random weights in F16 and Q4_0, SwiGLU (SiLU, so that h has no zeros for
 * the down kernel to skip).  For each sparsity s, the time of
 *   dense:  x converted, h = act(gate x) * (up x) for all neurons, y = down h
 *           (the reference's matvecs, down in GGUF layout, h converted too);
 *   sparse: x converted, h for a random set of (1 - s) * n_ff neurons
 *           (drawn anew each run, in increasing order as a mask gives it),
 *           y = sum of h[k] * down_t row k (si_k_ffn_down_sparse).
 * Each timed run starts with cold caches (a 128 MiB buffer is written then
 * read, evicting the weights) unless --warm; the best of N runs is kept.
 * GB/s counts the weight bytes each run must read: 3 * rows * row bytes.
 *
 * --huge puts the weights in 2 MiB-aligned memory advised MADV_HUGEPAGE
 * (transparent huge pages: fewer TLB misses on scattered rows).  Weights
 * mapped from a model file on disk do not get huge pages that way (the
 * page cache's file mappings use 4 KiB pages on most kernels), so the
 * default, 4 KiB pages, is the figure that applies to mmap-ed models.
 *
 * Usage: bench-sparse-ffn [-n RUNS] [--warm] [--huge]
 */
#include "codelets/ffn_sparse.h"
#include "model/quants.h"
#include "model/types.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#define N_EMBD 4096
#define N_FF 11008
#define FLUSH_BYTES (128u << 20)

static uint64_t rng_state = 0x5eedfacecafe1234ull;

/* splitmix64. */
static uint64_t rng(void)
{
    uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static float uniform(float lo, float hi)
{
    return lo + (hi - lo) * (float)((double)(rng() >> 11) * 0x1p-53);
}

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

/* --huge: weights in 2 MiB-aligned memory with madvise(MADV_HUGEPAGE). */
static int huge;

static void *xmalloc(size_t bytes)
{
    void *p = malloc(bytes);
    if (p == NULL) {
        fprintf(stderr, "bench-sparse-ffn: out of memory for %zu bytes\n", bytes);
        exit(1);
    }
    return p;
}

/* A matrix of `rows` random rows of n elements of type t; its row size in *row_bytes. */
static void *random_matrix(uint32_t t, int64_t rows, int64_t n, size_t *row_bytes)
{
    if (!si_type_row_size(t, n, row_bytes)) {
        fprintf(stderr, "bench-sparse-ffn: bad row of %lld %s\n", (long long)n, si_type_name(t));
        exit(1);
    }
    uint8_t *m;
    if (huge) {
        const size_t align = (size_t)2 << 20, bytes = (size_t)rows * *row_bytes;
        m = aligned_alloc(align, (bytes + align - 1) / align * align);
        if (m == NULL) {
            fprintf(stderr, "bench-sparse-ffn: out of memory for %zu bytes\n", bytes);
            exit(1);
        }
#if defined(MADV_HUGEPAGE)
        madvise(m, (bytes + align - 1) / align * align, MADV_HUGEPAGE);
#endif
    } else {
        m = xmalloc((size_t)rows * *row_bytes);
    }
    float *f = xmalloc((size_t)n * sizeof *f);
    for (int64_t r = 0; r < rows; r++) {
        for (int64_t i = 0; i < n; i++)
            f[i] = uniform(-0.05f, 0.05f);
        si_quantize_row(t, f, m + (size_t)r * *row_bytes, n);
    }
    free(f);
    return m;
}

/* Evicts the caches: writes then reads a buffer four times the size of the last level. */
static volatile uint64_t flush_sink;

static void flush_caches(uint64_t *buf)
{
    const size_t n = FLUSH_BYTES / sizeof *buf;
    for (size_t i = 0; i < n; i++)
        buf[i] = i;
    uint64_t s = 0;
    for (size_t i = 0; i < n; i += 8)
        s += buf[i];
    flush_sink = s;
}

static int cmp_i32(const void *a, const void *b)
{
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

/* idx = n_active distinct random neurons of n_ff, in increasing order. */
static void random_active(int32_t *perm, int64_t n_ff, int32_t *idx, int64_t n_active)
{
    for (int64_t i = 0; i < n_active; i++) { /* a partial Fisher-Yates shuffle */
        int64_t j = i + (int64_t)(rng() % (uint64_t)(n_ff - i));
        int32_t t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
    memcpy(idx, perm, (size_t)n_active * sizeof *idx);
    qsort(idx, (size_t)n_active, sizeof *idx, cmp_i32);
}

struct layer {
    uint32_t type;
    void *gate, *up, *down_t; /* [N_FF] rows of N_EMBD */
    void *down;               /* [N_EMBD] rows of N_FF (GGUF layout) */
    size_t row_bytes;         /* of a row of N_EMBD */
    size_t down_row_bytes;    /* of a row of N_FF */
};

struct buffers {
    float *x, *h, *y;
    void *xa, *hq;
    int32_t *idx, *perm;
    uint64_t *flush;
};

/* One dense FFN; returns ms. */
static double run_dense(const struct layer *L, struct buffers *b)
{
    double t0 = now_ms();
    si_quantize_act(si_act_type(L->type), b->x, b->xa, N_EMBD);
    si_k_ffn_act_dense(SI_FFN_GATED, SI_ACT_SILU, L->type, L->gate, L->up, NULL, L->row_bytes,
                       N_EMBD, b->xa, N_FF, b->h);
    si_k_ffn_down_dense(L->type, L->down, L->down_row_bytes, N_FF, N_EMBD, b->h, b->hq, b->y);
    return now_ms() - t0;
}

/* One sparse FFN on the n_active neurons in b->idx; the parts' ms in act and down. */
static double run_sparse(const struct layer *L, struct buffers *b, int64_t n_active, double *act,
                         double *down)
{
    double t0 = now_ms();
    si_quantize_act(si_act_type(L->type), b->x, b->xa, N_EMBD);
    si_k_ffn_act_sparse(SI_FFN_GATED, SI_ACT_SILU, L->type, L->gate, L->up, NULL, L->row_bytes,
                        N_EMBD, b->xa, b->idx, n_active, b->h);
    double t1 = now_ms();
    si_k_ffn_down_sparse(L->type, L->down_t, L->row_bytes, N_EMBD, b->h, b->idx, n_active, b->y);
    double t2 = now_ms();
    *act = t1 - t0;
    *down = t2 - t1;
    return t2 - t0;
}

int main(int argc, char **argv)
{
    int runs = 5;
    int warm = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "-n") == 0 && i + 1 < argc) {
            runs = atoi(argv[++i]);
        } else if (strcmp(argv[i], "--warm") == 0) {
            warm = 1;
        } else if (strcmp(argv[i], "--huge") == 0) {
            huge = 1;
        } else {
            fprintf(stderr, "usage: %s [-n RUNS] [--warm] [--huge]\n", argv[0]);
            return 2;
        }
    }
    if (runs < 1)
        runs = 1;

    struct buffers b;
    b.x = xmalloc(N_EMBD * sizeof *b.x);
    b.h = xmalloc(N_FF * sizeof *b.h);
    b.y = xmalloc(N_EMBD * sizeof *b.y);
    b.xa = xmalloc(4 * N_EMBD + 512); /* F32 is the widest activation type */
    b.hq = xmalloc(4 * N_FF + 512);
    b.idx = xmalloc(N_FF * sizeof *b.idx);
    b.perm = xmalloc(N_FF * sizeof *b.perm);
    b.flush = xmalloc(FLUSH_BYTES);
    for (int64_t i = 0; i < N_FF; i++)
        b.perm[i] = (int32_t)i;
    for (int64_t i = 0; i < N_EMBD; i++)
        b.x[i] = uniform(-1.0f, 1.0f);

    printf("One FFN layer, n_embd %d, n_ff %d, SwiGLU; 1 thread, %s kernels, best of %d runs, "
           "%s caches%s.\n\n",
           N_EMBD, N_FF, si_quants_impl(), runs, warm ? "warm" : "cold",
           huge ? ", weights on huge pages (MADV_HUGEPAGE)" : "");
    printf("| type | sparsity | active | dense ms | sparse ms (act + down) | speed-up | "
           "dense GB/s | sparse GB/s |\n");
    printf("|---|---:|---:|---:|---:|---:|---:|---:|\n");

    const uint32_t types[] = {SI_TYPE_F16, SI_TYPE_Q4_0};
    const int sparsity[] = {0, 50, 80, 90, 95, 99};
    for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++) {
        struct layer L = {.type = types[ti]};
        L.gate = random_matrix(L.type, N_FF, N_EMBD, &L.row_bytes);
        L.up = random_matrix(L.type, N_FF, N_EMBD, &L.row_bytes);
        L.down_t = random_matrix(L.type, N_FF, N_EMBD, &L.row_bytes);
        L.down = random_matrix(L.type, N_EMBD, N_FF, &L.down_row_bytes);

        double dense = 1e30;
        for (int r = 0; r < runs; r++) {
            if (!warm)
                flush_caches(b.flush);
            double t = run_dense(&L, &b);
            dense = t < dense ? t : dense;
        }
        const double dense_bytes = 3.0 * N_FF * (double)L.row_bytes;

        for (size_t si = 0; si < sizeof sparsity / sizeof sparsity[0]; si++) {
            int64_t n_active = (int64_t)((double)N_FF * (100 - sparsity[si]) / 100.0 + 0.5);
            double best = 1e30, best_act = 0, best_down = 0;
            for (int r = 0; r < runs; r++) {
                random_active(b.perm, N_FF, b.idx, n_active);
                if (!warm)
                    flush_caches(b.flush);
                double act, down, t = run_sparse(&L, &b, n_active, &act, &down);
                if (t < best) {
                    best = t;
                    best_act = act;
                    best_down = down;
                }
            }
            const double sparse_bytes = 3.0 * (double)n_active * (double)L.row_bytes;
            printf("| %s | %d%% | %lld | %.2f | %.2f (%.2f + %.2f) | %.2fx | %.1f | %.1f |\n",
                   si_type_name(L.type), sparsity[si], (long long)n_active, dense, best, best_act,
                   best_down, dense / best, dense_bytes / dense * 1e-6,
                   sparse_bytes / best * 1e-6);
        }
        free(L.gate);
        free(L.up);
        free(L.down_t);
        free(L.down);
    }
    free(b.x);
    free(b.h);
    free(b.y);
    free(b.xa);
    free(b.hq);
    free(b.idx);
    free(b.perm);
    free(b.flush);
    return 0;
}
