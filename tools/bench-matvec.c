/*
 * bench-matvec.c - the matrix-vector kernels' read rate against the memory's.
 *
 * For each type the engine packs (model/pack8.h), a matrix of 4096-wide
 * random rows about 256 MiB big (far past any cache) multiplied by one
 * converted activation vector, as decoding does: row by row
 * (si_vec_dot_act) and packed 8 rows at a time (si_vec_dot_act8), with 1
 * and T threads splitting the rows.  GB/s = the matrix's bytes / the time
 * of one pass, the best of N passes; "% roofline" against the streaming
 * read probe of `starinfer bench --roofline` with the same threads
 * (si_hwmodel_probe_cpu), run again right before each row: on a shared VM
 * the memory's rate drifts by 20% within a minute, so only figures taken
 * side by side compare.  The kernel table is the one this CPU gets
 * (SI_NO_VNNI=1, SI_NO_SIMD=1 choose others).
 *
 * Usage: bench-matvec [-n PASSES] [-t THREADS] [--mib SIZE]
 */
#include "model/pack8.h"
#include "model/quants.h"
#include "model/types.h"
#include "placement/hwmodel.h"

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define N_COLS 4096

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void *xmalloc(size_t bytes)
{
    void *p = NULL;
    if (posix_memalign(&p, 64, bytes) != 0) {
        fprintf(stderr, "bench-matvec: out of memory for %zu bytes\n", bytes);
        exit(1);
    }
    return p;
}

struct job {
    uint32_t type;
    const char *w;      /* the matrix: rows, or packed groups */
    size_t row_bytes;
    int64_t r0, r1;     /* rows [r0, r1), multiples of 8 */
    bool packed;
    const void *xa;
    float *y;
};

static void *run_job(void *arg)
{
    const struct job *j = arg;
    if (j->packed) {
        for (int64_t r = j->r0; r < j->r1; r += 8)
            si_vec_dot_act8(j->type, j->w + (size_t)r * j->row_bytes, j->xa, N_COLS, j->y + r);
    } else {
        for (int64_t r = j->r0; r < j->r1; r++)
            j->y[r] = si_vec_dot_act(j->type, j->w + (size_t)r * j->row_bytes, j->xa, N_COLS);
    }
    return NULL;
}

/* Seconds of the best of `passes` passes over the matrix with `threads` threads. */
static double best_pass(struct job proto, int64_t rows, int threads, int passes)
{
    pthread_t tid[64];
    struct job jobs[64];
    double best = 1e30;
    for (int p = 0; p < passes; p++) {
        const double t0 = now_s();
        for (int i = 0; i < threads; i++) {
            jobs[i] = proto;
            jobs[i].r0 = rows * i / threads / 8 * 8;
            jobs[i].r1 = i + 1 == threads ? rows : rows * (i + 1) / threads / 8 * 8;
            if (pthread_create(&tid[i], NULL, run_job, &jobs[i]) != 0) {
                fprintf(stderr, "bench-matvec: cannot start a thread\n");
                exit(1);
            }
        }
        for (int i = 0; i < threads; i++)
            pthread_join(tid[i], NULL);
        const double dt = now_s() - t0;
        best = dt < best ? dt : best;
    }
    return best;
}

int main(int argc, char **argv)
{
    int passes = 20, threads = (int)sysconf(_SC_NPROCESSORS_ONLN);
    long mib = 256;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-n") && i + 1 < argc)
            passes = atoi(argv[++i]);
        else if (!strcmp(argv[i], "-t") && i + 1 < argc)
            threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--mib") && i + 1 < argc)
            mib = atol(argv[++i]);
        else {
            fprintf(stderr, "usage: bench-matvec [-n PASSES] [-t THREADS] [--mib SIZE]\n");
            return 2;
        }
    }
    if (passes < 1 || threads < 1 || threads > 64 || mib < 16) {
        fprintf(stderr, "bench-matvec: -n at least 1, -t 1 to 64, --mib at least 16\n");
        return 2;
    }
    const int tcount = threads > 1 ? 2 : 1;
    const int tlist[2] = {1, threads};
    printf("kernels: %s; matrix about %ld MiB of %d-wide rows; best of %d passes\n",
           si_quants_impl(), mib, N_COLS, passes);
    printf("\n| type | layout | threads | GB/s | streaming read GB/s | %% of it |\n"
           "|---|---|---|---|---|---|\n");

    const uint32_t types[] = {SI_TYPE_Q4_0, SI_TYPE_Q4_1, SI_TYPE_Q8_0,
                              SI_TYPE_Q4_K, SI_TYPE_Q5_K, SI_TYPE_Q6_K};
    float *x = xmalloc(N_COLS * sizeof *x);
    uint64_t s = 0x9e3779b97f4a7c15ull;
    for (int64_t i = 0; i < N_COLS; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        x[i] = (float)((double)(s >> 11) * 0x1p-53 * 2.0 - 1.0);
    }
    for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++) {
        const uint32_t t = types[ti], at = si_act_type(t);
        size_t rb = 0, ab = 0;
        si_type_row_size(t, N_COLS, &rb);
        si_type_row_size(at, N_COLS, &ab);
        const int64_t rows = (int64_t)(((size_t)mib << 20) / rb) / 8 * 8;
        const size_t bytes = (size_t)rows * rb;
        char *w = xmalloc(bytes), *pk = xmalloc(bytes);
        /* 64 random rows, repeated: the values do not change the time */
        char *seed = xmalloc(64 * rb);
        float *row = xmalloc(N_COLS * sizeof *row);
        for (int r = 0; r < 64; r++) {
            for (int64_t i = 0; i < N_COLS; i++) {
                s = s * 6364136223846793005ull + 1442695040888963407ull;
                row[i] = (float)((double)(s >> 11) * 0x1p-53 * 2.0 - 1.0);
            }
            si_quantize_row(t, row, seed + (size_t)r * rb, N_COLS);
        }
        for (int64_t r = 0; r < rows; r++)
            memcpy(w + (size_t)r * rb, seed + (size_t)(r % 64) * rb, rb);
        for (int64_t g = 0; g < rows / 8; g++)
            si_pack8(t, w + (size_t)g * 8 * rb, rb, N_COLS, pk + (size_t)g * 8 * rb);
        void *xa = xmalloc(ab);
        si_quantize_act(at, x, xa, N_COLS);
        float *y = xmalloc((size_t)rows * sizeof *y);
        for (int layout = 0; layout < 2; layout++)
            for (int k = 0; k < tcount; k++) {
                struct job proto = {t, layout ? pk : w, rb, 0, 0, layout == 1, xa, y};
                const double roof = si_hwmodel_probe_cpu(tlist[k], 0, 0.25);
                const double dt = best_pass(proto, rows, tlist[k], passes);
                const double gbs = (double)bytes / dt;
                printf("| %s | %s | %d | %.1f | %.1f | %.0f%% |\n", si_type_name(t),
                       layout ? "packed 8 rows" : "row by row", tlist[k], gbs / 1e9, roof / 1e9,
                       100.0 * gbs / roof);
                fflush(stdout);
            }
        free(w);
        free(pk);
        free(seed);
        free(row);
        free(xa);
        free(y);
    }
    free(x);
    return 0;
}
