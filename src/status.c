/* status.c - status messages and the version string of the public API. */
#include "starinfer.h"

#include "internal.h"

#include <stdio.h>

#define SI_STR_(x) #x
#define SI_XSTR_(x) SI_STR_(x)

const char *si_status_str(int status)
{
    switch (status) {
#define SI_STATUS_CASE_(name, value, msg)                                                          \
    case value:                                                                                    \
        return msg;
        SI_STATUS_LIST(SI_STATUS_CASE_)
#undef SI_STATUS_CASE_
    }
    return "unknown status";
}

const char *si_version(void)
{
    return SI_XSTR_(SI_VERSION_MAJOR) "." SI_XSTR_(SI_VERSION_MINOR) "." SI_XSTR_(SI_VERSION_PATCH);
}

int si__verrf(char *err, size_t err_size, int status, const char *fmt, va_list ap)
{
    if (err != NULL && err_size > 0)
        vsnprintf(err, err_size, fmt, ap);
    return status;
}

int si__errf(char *err, size_t err_size, int status, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    si__verrf(err, err_size, status, fmt, ap);
    va_end(ap);
    return status;
}
