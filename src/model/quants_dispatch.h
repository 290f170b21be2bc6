/*
 * quants_dispatch.h - which of the kernel tables of quants_impl.h runs.
 *
 * quants_dispatch.c is the one place that looks at the CPU and the
 * environment: it tells which tables this CPU runs and chooses, once, the
 * table whose kernels the public functions of quants.h (quants.c) and the
 * attention of kernels.c call.  The kernel files (quants_scalar.c,
 * quants_avx2.c, quants_avx2_act.c) know nothing of this choice, and this
 * file calls none of its callers: the calls go quants.c and kernels.c ->
 * quants_dispatch.c -> the tables.  Tests call these too, to check each
 * table this CPU runs.
 */
#ifndef SI_MODEL_QUANTS_DISPATCH_H
#define SI_MODEL_QUANTS_DISPATCH_H

#include "model/quants_impl.h"

#include <stdbool.h>

/* True when si__quants_avx2 is compiled in and this CPU runs it. */
bool si__quants_avx2_usable(void);

/* True when si__quants_vnni is compiled in and this CPU runs it (AVX2 usable
 * and AVX-512 F, VL and VNNI). */
bool si__quants_vnni_usable(void);

/* Why the kernels in use lack si__quants_vnni's: NULL where they have them,
 * else "SI_NO_SIMD is set", "SI_NO_VNNI is set" or "this CPU has no
 * AVX-512 VNNI" (or: the build has no AVX2 kernels). */
const char *si__quants_vnni_missing(void);

/*
 * The kernels in use, chosen on the first call (thread-safe): the scalar
 * table, with every kernel of si__quants_avx2 in its place where that table
 * is usable and SI_NO_SIMD is unset (or 0), and then every kernel of
 * si__quants_vnni in theirs where it is usable too and SI_NO_VNNI is unset
 * (or 0).  Its name is the last table laid over ("scalar", "avx2" or
 * "avx2+vnni"); its attn_f16 is NULL with the scalar kernels (the portable
 * code of kernels.c then runs); its attn_tiled is always NULL (see
 * si__quants_attn_tiled).
 */
const struct si__quants_table *si__quants_active(void);

/* The tiled attention's AVX2 twin when this CPU runs it (NULL: the portable
 * code).  Not tied to the table in use, SI_NO_SIMD included: both codes give
 * the same bits. */
si__attn_tiled_fn si__quants_attn_tiled(void);

#endif /* SI_MODEL_QUANTS_DISPATCH_H */
