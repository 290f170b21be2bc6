/*
 * buf.h - a growing NUL-terminated byte string: chat's turns, the server's
 * request bodies and the text its slots generate.
 */
#ifndef SI_TOOLS_BUF_H
#define SI_TOOLS_BUF_H

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

struct si_buf {
    char *p;
    size_t n, cap;
};

/* Append s[0..n), keeping a NUL after it (the first allocation 4 KiB);
 * false when out of memory, b unchanged. */
static inline bool si_buf_add(struct si_buf *b, const char *s, size_t n)
{
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 4096;
        while (cap < b->n + n + 1)
            cap *= 2;
        char *p = realloc(b->p, cap);
        if (p == NULL)
            return false;
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = '\0';
    return true;
}

#endif /* SI_TOOLS_BUF_H */
