/* hwmodel.c - measuring the placement's hardware model (hwmodel.h). */
#include "placement/hwmodel.h"

#include "config.h"
#include "internal.h"
#include "starinfer.h"

#ifdef SI_USE_CUDA
#include <cuda_runtime_api.h>
#endif

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

const char *si_hw_field_name(enum si_hw_field f)
{
    static const char *const names[] = {"cpu_bw", "gpu_bw", "h2d_bw", "h2d_lat", "t_sync"};
    return (unsigned)f < SI_HW_FIELD_COUNT ? names[f] : "?";
}

const char *si_hw_source_name(enum si_hw_source s)
{
    static const char *const names[] = {"assumed", "measured", "given"};
    return (unsigned)s < SI_HW_SOURCE_COUNT ? names[s] : "?";
}

void si_hwmodel_defaults(struct si_hwmodel *hw, int64_t n_embd)
{
    memset(hw, 0, sizeof *hw);
    hw->value[SI_HW_CPU_BW] = SI_HW_DEFAULT_CPU_BW;
    hw->value[SI_HW_GPU_BW] = SI_HW_DEFAULT_GPU_BW;
    hw->value[SI_HW_H2D_BW] = SI_HW_DEFAULT_H2D_BW;
    hw->value[SI_HW_H2D_LAT] = SI_HW_DEFAULT_H2D_LAT;
    hw->value[SI_HW_T_SYNC] =
        SI_HW_DEFAULT_H2D_LAT + 4.0 * (double)(n_embd > 0 ? n_embd : 0) / SI_HW_DEFAULT_H2D_BW;
    hw->threads = 1;
}

int64_t si_hwmodel_c_min(const struct si_hwmodel *hw, int64_t neuron_bytes)
{
    const double tc = (double)neuron_bytes / hw->value[SI_HW_CPU_BW];
    const double tg = (double)neuron_bytes / hw->value[SI_HW_GPU_BW];
    if (!(tc > tg))
        return INT64_MAX;
    const double c = ceil(hw->value[SI_HW_T_SYNC] / (tc - tg));
    if (!(c < 9e18))
        return INT64_MAX;
    return c < 1 ? 1 : (int64_t)c;
}

/* ------------------------------------------------------------ CPU probe */

struct stream_arg {
    const uint64_t *p;
    size_t n;        /* words */
    double seconds;  /* run for about this long */
    uint64_t sum;    /* keeps the reads alive */
    double bytes;    /* read */
};

static void *stream_thread(void *v)
{
    struct stream_arg *a = v;
    const double t0 = si__now();
    uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
    double done = 0;
    do {
        /* four independent sums so the adds do not serialise the loads */
        size_t i = 0;
        for (; i + 4 <= a->n; i += 4) {
            s0 += a->p[i];
            s1 += a->p[i + 1];
            s2 += a->p[i + 2];
            s3 += a->p[i + 3];
        }
        for (; i < a->n; i++)
            s0 += a->p[i];
        done += (double)a->n * sizeof(uint64_t);
    } while (si__now() - t0 < a->seconds);
    a->sum = s0 + s1 + s2 + s3;
    a->bytes = done;
    return NULL;
}

double si_hwmodel_probe_cpu(int32_t threads, size_t bytes, double seconds)
{
    if (threads < 1)
        threads = 1;
    if (bytes == 0) {
        /* Much larger than the last-level cache, so the sums read DRAM. */
        long llc = sysconf(_SC_LEVEL3_CACHE_SIZE);
        if (llc <= 0)
            llc = sysconf(_SC_LEVEL2_CACHE_SIZE);
        bytes = llc > 0 ? 8 * (size_t)llc : 0;
        bytes = bytes < ((size_t)64 << 20) ? (size_t)64 << 20 : bytes;
        bytes = bytes > ((size_t)256 << 20) ? (size_t)256 << 20 : bytes;
    }
    const size_t words = bytes / sizeof(uint64_t);
    uint64_t *buf = malloc(words * sizeof *buf);
    struct stream_arg *arg = calloc((size_t)threads, sizeof *arg);
    pthread_t *tid = calloc((size_t)threads, sizeof *tid);
    double bw = -1;
    if (words == 0 || buf == NULL || arg == NULL || tid == NULL)
        goto out;
    for (size_t i = 0; i < words; i++) /* touch every page before timing */
        buf[i] = i;
    for (int32_t t = 0; t < threads; t++) {
        const size_t lo = words * (size_t)t / (size_t)threads,
                     hi = words * (size_t)(t + 1) / (size_t)threads;
        arg[t] = (struct stream_arg){buf + lo, hi - lo, seconds, 0, 0};
    }
    /* Each thread reads its share for `seconds`; the bandwidth is all
     * the bytes over the wall time from the first start to the last end.
     * A thread that cannot be started has its share read by this one. */
    const double t0 = si__now();
    int32_t started = 0;
    for (int32_t t = 1; t < threads; t++, started++)
        if (pthread_create(&tid[t], NULL, stream_thread, &arg[t]) != 0)
            break;
    for (int32_t t = 1 + started; t < threads; t++)
        arg[0].n = (size_t)(arg[t].p + arg[t].n - arg[0].p);
    stream_thread(&arg[0]);
    double total = arg[0].bytes;
    for (int32_t t = 1; t <= started; t++) {
        pthread_join(tid[t], NULL);
        total += arg[t].bytes;
    }
    const double el = si__now() - t0;
    bw = el > 0 ? total / el : -1;
out:
    free(buf);
    free(arg);
    free(tid);
    return bw;
}

/* Median of n doubles (sorts them). */
static int cmp_double(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return v[n / 2];
}

/* The merge's CPU part: adding n floats into the layer output, in seconds
 * (median of 50; cache-warm, as the merge task finds its inputs). */
static double merge_seconds(int64_t n)
{
    float *y = calloc((size_t)n + 1, sizeof *y), *p = calloc((size_t)n + 1, sizeof *p);
    double t[50], r = 0;
    if (y == NULL || p == NULL)
        goto out;
    for (int64_t i = 0; i < n; i++)
        p[i] = (float)i * 1e-3f;
    for (int k = 0; k < 50; k++) {
        const double t0 = si__now();
        for (int64_t i = 0; i < n; i++)
            y[i] += p[i];
        t[k] = si__now() - t0;
    }
    r = median(t, 50);
    /* read y so the adds are not optimised away */
    if (y[n > 1 ? 1 : 0] < -1.0f)
        r += 1;
out:
    free(y);
    free(p);
    return r;
}

#ifdef SI_USE_CUDA
/* The GPU probes; SI_OK, or SI_E_NO_DEVICE / SI_E_RUNTIME with a note. */
static int probe_gpu(struct si_hwmodel *hw, int64_t n_embd, double merge, char *note,
                     size_t note_size)
{
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n < 1)
        return si__errf(note, note_size, SI_E_NO_DEVICE, "no CUDA device: GPU values assumed");
    struct cudaDeviceProp prop;
    if (cudaGetDeviceProperties(&prop, 0) == cudaSuccess)
        snprintf(hw->gpu_name, sizeof hw->gpu_name, "%.63s", prop.name);
    const size_t big = (size_t)256 << 20, link = (size_t)64 << 20;
    void *d0 = NULL, *d1 = NULL, *h = NULL;
    cudaEvent_t e0 = NULL, e1 = NULL;
    cudaStream_t st = NULL;
    int rc = SI_OK;
    if (cudaMalloc(&d0, big) != cudaSuccess || cudaMalloc(&d1, big) != cudaSuccess ||
        cudaMallocHost(&h, link) != cudaSuccess || cudaEventCreate(&e0) != cudaSuccess ||
        cudaEventCreate(&e1) != cudaSuccess || cudaStreamCreate(&st) != cudaSuccess) {
        rc = si__errf(note, note_size, SI_E_RUNTIME, "CUDA probe: allocation failed: GPU values "
                      "assumed");
        goto out;
    }
    memset(h, 1, link);
    cudaMemset(d0, 1, big);
    float ms = 0, best = INFINITY;
    /* GPU memory: device-to-device copies (read + write), best of 5 */
    for (int k = 0; k < 6; k++) {
        cudaEventRecord(e0, st);
        cudaMemcpyAsync(d1, d0, big, cudaMemcpyDeviceToDevice, st);
        cudaEventRecord(e1, st);
        cudaEventSynchronize(e1);
        cudaEventElapsedTime(&ms, e0, e1);
        if (k > 0 && ms < best) /* the first warms up */
            best = ms;
    }
    if (!(best > 0 && isfinite(best))) {
        rc = si__errf(note, note_size, SI_E_RUNTIME, "CUDA probe: no timing: GPU values assumed");
        goto out;
    }
    if (hw->source[SI_HW_GPU_BW] != SI_HW_GIVEN) {
        hw->value[SI_HW_GPU_BW] = 2.0 * (double)big / (1e-3 * best);
        hw->source[SI_HW_GPU_BW] = SI_HW_MEASURED;
    }
    /* host to device from pinned memory */
    best = INFINITY;
    for (int k = 0; k < 6; k++) {
        cudaEventRecord(e0, st);
        cudaMemcpyAsync(d0, h, link, cudaMemcpyHostToDevice, st);
        cudaEventRecord(e1, st);
        cudaEventSynchronize(e1);
        cudaEventElapsedTime(&ms, e0, e1);
        if (k > 0 && ms < best)
            best = ms;
    }
    if (hw->source[SI_HW_H2D_BW] != SI_HW_GIVEN && best > 0 && isfinite(best)) {
        hw->value[SI_HW_H2D_BW] = (double)link / (1e-3 * best);
        hw->source[SI_HW_H2D_BW] = SI_HW_MEASURED;
    }
    /* latency: 4 bytes, synchronised, as the host sees it */
    double t[50];
    for (int k = 0; k < 50; k++) {
        const double t0 = si__now();
        cudaMemcpyAsync(d0, h, 4, cudaMemcpyHostToDevice, st);
        cudaStreamSynchronize(st);
        t[k] = si__now() - t0;
    }
    if (hw->source[SI_HW_H2D_LAT] != SI_HW_GIVEN) {
        hw->value[SI_HW_H2D_LAT] = median(t, 50);
        hw->source[SI_HW_H2D_LAT] = SI_HW_MEASURED;
    }
    /* T_sync: a partial result of n_embd floats handed over, then merged */
    const size_t part = (size_t)(n_embd > 0 ? n_embd : 1) * sizeof(float);
    for (int k = 0; k < 50; k++) {
        const double t0 = si__now();
        cudaMemcpyAsync(d0, h, part < link ? part : link, cudaMemcpyHostToDevice, st);
        cudaStreamSynchronize(st);
        t[k] = si__now() - t0;
    }
    if (hw->source[SI_HW_T_SYNC] != SI_HW_GIVEN) {
        hw->value[SI_HW_T_SYNC] = median(t, 50) + merge;
        hw->source[SI_HW_T_SYNC] = SI_HW_MEASURED;
    }
    if (cudaGetLastError() != cudaSuccess)
        rc = si__errf(note, note_size, SI_E_RUNTIME, "CUDA probe: a CUDA call failed");
out:
    if (st != NULL)
        cudaStreamDestroy(st);
    if (e0 != NULL)
        cudaEventDestroy(e0);
    if (e1 != NULL)
        cudaEventDestroy(e1);
    cudaFree(d0);
    cudaFree(d1);
    if (h != NULL)
        cudaFreeHost(h);
    return rc;
}
#endif

int si_hwmodel_measure(struct si_hwmodel *hw, int32_t threads, int64_t n_embd, char *note,
                       size_t note_size, char *err, size_t err_size)
{
    if (threads < 1 || n_embd < 1)
        return si__errf(err, err_size, SI_E_INVALID,
                        "hardware model: threads (%d) and n_embd (%lld) must be >= 1", (int)threads,
                        (long long)n_embd);
    if (note != NULL && note_size > 0)
        note[0] = '\0';
    hw->threads = threads;
    if (hw->source[SI_HW_CPU_BW] != SI_HW_GIVEN) {
        const double bw = si_hwmodel_probe_cpu(threads, 0, 0.2);
        if (bw <= 0)
            return si__errf(err, err_size, SI_E_NOMEM, "hardware model: out of memory for the "
                            "CPU bandwidth probe");
        hw->value[SI_HW_CPU_BW] = bw;
        hw->source[SI_HW_CPU_BW] = SI_HW_MEASURED;
    }
    const double merge = merge_seconds(n_embd);
    bool gpu = false;
#ifdef SI_USE_CUDA
    gpu = probe_gpu(hw, n_embd, merge, note, note_size) == SI_OK;
#else
    si__errf(note, note_size, SI_E_NO_DEVICE, "built without CUDA: GPU values assumed");
#endif
    if (!gpu && hw->source[SI_HW_T_SYNC] != SI_HW_GIVEN) {
        /* assumed: the link's latency and bandwidth (given or assumed) and
         * the measured CPU add */
        hw->value[SI_HW_T_SYNC] = hw->value[SI_HW_H2D_LAT] +
                                  4.0 * (double)n_embd / hw->value[SI_HW_H2D_BW] + merge;
        hw->source[SI_HW_T_SYNC] = SI_HW_ASSUMED;
    }
    return SI_OK;
}
