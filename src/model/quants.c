/*
 * quants.c - the entry points of quants.h: the one dispatch table (the
 * portable kernels of quants_scalar.c, overlaid once with the AVX2 and VNNI
 * ones of quants_avx2.c where this CPU runs them, unless SI_NO_SIMD or
 * SI_NO_VNNI says no), the calls through it, and the activation types.
 * The kernel files call nothing here; model/kernels.c takes its fast
 * attention from here.  Block layouts: quants_scalar.c.
 */
#include "model/quants.h"

#include "model/quants_impl.h"
#include "model/types.h"

#include <assert.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

#if defined(__x86_64__) || defined(__i386__)
/* F16C from CPUID leaf 1 (ECX bit 29): some compilers' __builtin_cpu_supports() lack "f16c". */
static bool cpu_has_f16c(void)
{
    unsigned a, b, c, d;
    return __get_cpuid(1, &a, &b, &c, &d) && (c & bit_F16C);
}
#endif

bool si__quants_avx2_usable(void)
{
#if defined(__x86_64__) || defined(__i386__)
    if (!si__quants_avx2.compiled)
        return false;
    /* The "avx2" test also checks that the OS saves the YMM registers. */
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && cpu_has_f16c();
#else
    return false;
#endif
}

bool si__quants_vnni_usable(void)
{
#if defined(__x86_64__) || defined(__i386__)
    if (!si__quants_vnni.compiled || !si__quants_avx2_usable())
        return false;
    /* "avx512f" also checks that the OS saves the AVX-512 state. */
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") &&
           __builtin_cpu_supports("avx512vnni");
#else
    return false;
#endif
}

/* The kernels in use: AVX2 ones where usable (with VNNI's integer dots where
 * that is usable too), scalar ones elsewhere. */
static struct si__quants_table active;
static pthread_once_t active_once = PTHREAD_ONCE_INIT;

/* Whether the environment variable `name` is set to something but 0. */
static bool env_set(const char *name)
{
    const char *v = getenv(name);
    return v != NULL && v[0] != '\0' && strcmp(v, "0") != 0;
}

/* Every kernel table t has replaces the active one. */
static void overlay(const struct si__quants_table *t)
{
    active.name = t->name;
    for (int k = 0; k < SI_TYPE_COUNT; k++) {
        const struct si__quants_kernels *src = &t->type[k];
        struct si__quants_kernels *dst = &active.type[k];
        if (src->dequantize != NULL)
            dst->dequantize = src->dequantize;
        if (src->dot != NULL)
            dst->dot = src->dot;
        if (src->quantize_act != NULL)
            dst->quantize_act = src->quantize_act;
        if (src->dot_act != NULL)
            dst->dot_act = src->dot_act;
        if (src->mad != NULL)
            dst->mad = src->mad;
        if (src->mad4 != NULL)
            dst->mad4 = src->mad4;
        if (src->dot_act2 != NULL)
            dst->dot_act2 = src->dot_act2;
    }
    if (t->attn_f16 != NULL)
        active.attn_f16 = t->attn_f16;
}

static void choose_kernels(void)
{
    active = si__quants_scalar;
    if (env_set("SI_NO_SIMD") || !si__quants_avx2_usable())
        return;
    overlay(&si__quants_avx2);
    if (!env_set("SI_NO_VNNI") && si__quants_vnni_usable())
        overlay(&si__quants_vnni);
}

si__attn_tiled_fn si__quants_attn_tiled(void)
{
    /* Not tied to the table in use: both codes give the same bits. */
    static int usable = -1;
    if (usable < 0)
        usable = si__quants_avx2_usable();
    return usable ? si__quants_avx2.attn_tiled : NULL;
}

/* The kernels of type t, after checking (in debug builds) the row length. */
static const struct si__quants_kernels *kernels(uint32_t t, int64_t n)
{
    pthread_once(&active_once, choose_kernels);
    assert(n >= 0 && n % si_type_get(t)->block == 0 && "row length not a multiple of the block");
    (void)n;
    return &active.type[t];
}

void si_dequantize_row(uint32_t t, const void *src, float *dst, int64_t n)
{
    if (!si_type_supported(t)) {
        assert(!"unsupported tensor type");
        return;
    }
    kernels(t, n)->dequantize(src, dst, n);
}

float si_vec_dot(uint32_t t, const void *row, const float *x, int64_t n)
{
    if (!si_type_supported(t)) {
        assert(!"unsupported tensor type");
        return 0.0f;
    }
    return kernels(t, n)->dot(row, x, n);
}

uint32_t si_act_type(uint32_t t)
{
    switch (t) {
    case SI_TYPE_Q4_0:
    case SI_TYPE_Q5_0:
    case SI_TYPE_Q8_0:
        return SI_TYPE_Q8_0;
    case SI_TYPE_Q4_1:
    case SI_TYPE_Q5_1:
        return SI_TYPE_Q8_1;
    case SI_TYPE_Q4_K:
    case SI_TYPE_Q5_K:
    case SI_TYPE_Q6_K:
        return SI_TYPE_Q8_K;
    case SI_TYPE_F16:
    case SI_TYPE_BF16:
    case SI_TYPE_F32:
        return t;
    default:
        return SI_TYPE_COUNT;
    }
}

void si_quantize_act(uint32_t at, const float *x, void *dst, int64_t n)
{
    if (at >= SI_TYPE_COUNT || si__quants_scalar.type[at].quantize_act == NULL) {
        assert(!"not an activation type");
        return;
    }
    kernels(at, n)->quantize_act(x, dst, n);
}

float si_vec_dot_act(uint32_t t, const void *row, const void *xa, int64_t n)
{
    if (!si_type_supported(t)) {
        assert(!"unsupported tensor type");
        return 0.0f;
    }
    return kernels(t, n)->dot_act(row, xa, n);
}

void si_vec_dot_act2(uint32_t t, const void *const rows[2], const void *xa, int64_t n, float out[2],
                     const void *const ahead[2])
{
    if (!si_type_supported(t)) {
        assert(!"unsupported tensor type");
        out[0] = out[1] = 0.0f;
        return;
    }
    const struct si__quants_kernels *k = kernels(t, n);
    if (k->dot_act2 != NULL) {
        k->dot_act2(rows, xa, n, out, ahead);
        return;
    }
    size_t bytes = 0;
    si_type_row_size(t, n, &bytes);
    for (int r = 0; r < 2; r++) {
#if defined(__GNUC__)
        /* All of the next row at once: the fused kernels spread these over
         * their loop instead, which keeps fewer requests waiting. */
        if (ahead != NULL && ahead[r] != NULL) {
            for (size_t o = 0; o < bytes; o += 64)
                __builtin_prefetch((const char *)ahead[r] + o, 0, 3);
        }
#endif
        out[r] = k->dot_act(rows[r], xa, n);
    }
}

void si_vec_mad(uint32_t t, const void *row, float a, float *y, int64_t n)
{
    if (!si_type_supported(t)) {
        assert(!"unsupported tensor type");
        return;
    }
    kernels(t, n)->mad(row, a, y, n);
}

void si_vec_mad4(uint32_t t, const void *const rows[4], const float a[4], float *y, int64_t n)
{
    if (!si_type_supported(t)) {
        assert(!"unsupported tensor type");
        return;
    }
    const struct si__quants_kernels *k = kernels(t, n);
    if (k->mad4 != NULL) {
        k->mad4(rows, a, y, n);
        return;
    }
    for (int r = 0; r < 4; r++)
        k->mad(rows[r], a[r], y, n);
}

si__attn_f16_fn si__quants_attn_f16(void)
{
    pthread_once(&active_once, choose_kernels);
    return active.attn_f16;
}

const char *si_quants_impl(void)
{
    pthread_once(&active_once, choose_kernels);
    return active.name;
}


float si_vec_dot_act_batch(uint32_t t, const void *row, const void *xa, int64_t n, int32_t n_tok,
                           bool group4)
{
    if (t == SI_TYPE_Q4_K && group4)
        return si__k_dot_act_q4_k_groups(row, xa, n, 2);
    if (t == SI_TYPE_Q6_K && n_tok >= 8)
        return si__k_dot_act_q6_k_tiled(row, xa, n);
    return si_vec_dot_act(t, row, xa, n);
}
