/*
 * quants_dispatch.c - the CPU checks and the one-time choice of the kernel
 * table in use (quants_dispatch.h).
 *
 * Built with the library's ordinary flags, never the AVX2 ones: it runs on
 * every CPU, to find out whether the AVX2 tables may run.  It reads the
 * tables (quants_scalar.c, quants_avx2.c, quants_avx2_act.c) and calls none
 * of their kernels.
 */
#include "model/quants_dispatch.h"

#include "model/quants_impl.h"
#include "model/types.h"

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
        if (src->dot_act8 != NULL)
            dst->dot_act8 = src->dot_act8;
        if (src->dequantize8 != NULL)
            dst->dequantize8 = src->dequantize8;
        if (src->gemm8 != NULL)
            dst->gemm8 = src->gemm8;
        if (src->dot_act8p != NULL)
            dst->dot_act8p = src->dot_act8p;
        if (src->dot_act8_next != NULL)
            dst->dot_act8_next = src->dot_act8_next;
    }
    if (t->attn_f16 != NULL)
        active.attn_f16 = t->attn_f16;
    if (t->cb_block != NULL)
        active.cb_block = t->cb_block;
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

const char *si__quants_vnni_missing(void)
{
    if (!si__quants_vnni.compiled)
        return "this build has no AVX-512 VNNI kernels";
    if (env_set("SI_NO_SIMD"))
        return "SI_NO_SIMD is set";
    if (!si__quants_vnni_usable())
        return "this CPU has no AVX-512 VNNI";
    if (env_set("SI_NO_VNNI"))
        return "SI_NO_VNNI is set";
    return NULL;
}

const struct si__quants_table *si__quants_active(void)
{
    pthread_once(&active_once, choose_kernels);
    return &active;
}

si__attn_tiled_fn si__quants_attn_tiled(void)
{
    /* Not tied to the table in use: both codes give the same bits.  The
     * answer is asked once; tasks on several workers may ask at once. */
    static int usable = -1;
    int u = __atomic_load_n(&usable, __ATOMIC_RELAXED);
    if (u < 0) {
        u = si__quants_avx2_usable();
        __atomic_store_n(&usable, u, __ATOMIC_RELAXED);
    }
    return u ? si__quants_avx2.attn_tiled : NULL;
}
