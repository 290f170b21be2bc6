/*
 * internal.h - helpers shared inside the library (not installed).
 */
#ifndef SI_INTERNAL_H
#define SI_INTERNAL_H

#include <stdarg.h>
#include <stddef.h>

/*
 * Write a one-line message into err[0..err_size) (nothing when err is NULL
 * or err_size is 0) and return `status`: the way library functions report
 * what went wrong along with their si_status.
 */
int si__errf(char *err, size_t err_size, int status, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
int si__verrf(char *err, size_t err_size, int status, const char *fmt, va_list ap)
    __attribute__((format(printf, 4, 0)));

#endif /* SI_INTERNAL_H */
