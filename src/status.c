/* status.c - status messages and the version string of the public API. */
#include "starinfer.h"

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
