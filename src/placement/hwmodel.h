/*
 * hwmodel.h - the hardware model of neuron placement: memory bandwidths, the
 * host-device link and T_sync, measured on this machine or given.
 *
 * What each value is and how it is measured:
 *  - cpu_bw: bytes/s the CPU streams from DRAM with `threads` threads (the
 *    engine's CPU workers): each thread sums its share of a buffer of at
 *    least 8 times the last-level cache (64 to 256 MiB), for about 0.2 s.
 *  - gpu_bw: bytes/s of GPU memory: a device-to-device copy of 256 MiB
 *    counted as read plus write (CUDA builds with a device only).
 *  - h2d_bw, h2d_lat: host-to-device copies from pinned memory: 64 MiB for
 *    the bandwidth, 4 bytes for the latency (median of 50).
 *  - t_sync: one hand-off of a layer's partial result between the units and
 *    its merge: a synchronised host-to-device copy of n_embd floats plus the
 *    CPU adding n_embd floats into the layer output (the engine's merge
 *    task), median of 50.
 * Without a GPU (or a CUDA build), gpu_bw, h2d_bw and h2d_lat take the
 * assumed defaults below and t_sync = h2d_lat + 4 n_embd / h2d_bw + the
 * measured CPU add; the source of each value says "assumed".  Every value
 * may be given instead (source "given").
 *
 * C_l of the placement ILP follows from them: T_l^j = M_l / bandwidth_j
 * (M_l: bytes of one neuron of layer l), and C_l is the least whole C with
 * C * T_l^GPU + T_sync <= C * T_l^CPU, i.e. ceil(T_sync / (T_l^CPU - T_l^GPU));
 * when the GPU is not faster per neuron no C exists and the layer stays on
 * the CPU.
 */
#ifndef SI_PLACEMENT_HWMODEL_H
#define SI_PLACEMENT_HWMODEL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Assumed when nothing measures them: a PCIe 4.0 x16 link and a GPU of the
 * RTX 4090 / A100 class. */
#define SI_HW_DEFAULT_GPU_BW 1.0e12
#define SI_HW_DEFAULT_H2D_BW 25.0e9
#define SI_HW_DEFAULT_H2D_LAT 10.0e-6
/* Assumed CPU bandwidth when the probe is skipped (a dual-channel DDR5 PC). */
#define SI_HW_DEFAULT_CPU_BW 50.0e9

enum si_hw_field {
    SI_HW_CPU_BW,
    SI_HW_GPU_BW,
    SI_HW_H2D_BW,
    SI_HW_H2D_LAT,
    SI_HW_T_SYNC,
    SI_HW_FIELD_COUNT
};

enum si_hw_source { SI_HW_ASSUMED, SI_HW_MEASURED, SI_HW_GIVEN, SI_HW_SOURCE_COUNT };

struct si_hwmodel {
    double value[SI_HW_FIELD_COUNT];           /* bytes/s, or seconds (lat, t_sync) */
    enum si_hw_source source[SI_HW_FIELD_COUNT];
    int32_t threads;                           /* CPU threads of the cpu_bw probe */
    char gpu_name[64];                         /* "" without a GPU */
};

/* "cpu_bw", "gpu_bw", "h2d_bw", "h2d_lat", "t_sync" (also the file's key suffixes) */
const char *si_hw_field_name(enum si_hw_field f);
/* "assumed", "measured", "given" */
const char *si_hw_source_name(enum si_hw_source s);

/* Every value assumed (t_sync for n_embd with no CPU add). */
void si_hwmodel_defaults(struct si_hwmodel *hw, int64_t n_embd);

/*
 * Measure what was not given (source SI_HW_GIVEN is kept): the CPU probe
 * with `threads` threads (>= 1), the GPU probes when a CUDA device is there
 * (else assumed values), t_sync for partial results of n_embd floats.
 * SI_OK, SI_E_INVALID or SI_E_NOMEM.  A failing GPU probe is not an error:
 * its values stay assumed and `note` (when not NULL) says why.
 */
int si_hwmodel_measure(struct si_hwmodel *hw, int32_t threads, int64_t n_embd, char *note,
                       size_t note_size, char *err, size_t err_size);

/* The streaming probe alone: bytes/s with `threads` threads over `bytes`
 * bytes (0: the default size) for about `seconds`.  -1 if out of memory. */
double si_hwmodel_probe_cpu(int32_t threads, size_t bytes, double seconds);

/*
 * C_l for neurons of `neuron_bytes` bytes: ceil(T_sync / (T_CPU - T_GPU)),
 * at least 1; INT64_MAX when the GPU is not faster per neuron.
 */
int64_t si_hwmodel_c_min(const struct si_hwmodel *hw, int64_t neuron_bytes);

#endif /* SI_PLACEMENT_HWMODEL_H */
