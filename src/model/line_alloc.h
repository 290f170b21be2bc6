/*
 * line_alloc.h - memory on cache-line boundaries.
 *
 * n bytes at a 64-byte boundary, rounded up to whole lines, for free():
 * the engine leaves no buffer's alignment to malloc, so that the kernels'
 * 32-byte loads split no cache line where the data allows (the attention's
 * tile 16 bytes off a line had made one worker's tasks 30% slower:
 * docs/attention.md).  NULL when out of memory.
 */
#ifndef SI_MODEL_LINE_ALLOC_H
#define SI_MODEL_LINE_ALLOC_H

#include <stddef.h>
#include <stdlib.h>

static inline void *si_line_alloc(size_t n)
{
    return aligned_alloc(64, (n + 63) / 64 * 64);
}

#endif /* SI_MODEL_LINE_ALLOC_H */
