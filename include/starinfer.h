/*
 * starinfer.h - the public API of starinfer.
 *
 * starinfer runs large language models whose weights do not fit in GPU memory
 * on one PC, by exploiting FFN activation sparsity: hot neurons on the GPU,
 * cold ones on the CPU, each layer's work expressed as StarPU tasks.
 *
 * Conventions of this header:
 *  - Every call that can fail returns an `si_status`: 0 (SI_OK) on success, a
 *    negative value on failure.  si_status_str() turns it into a message.
 *  - Objects are opaque handles created by `si_<object>_load/init` and released
 *    by `si_<object>_free`; `si_<object>_free(NULL)` is a no-op.
 *  - Options travel in small `struct si_*_params` passed by value, obtained
 *    from `si_*_default_params()` and then changed field by field.
 *
 * This header grows with the library; what it declares today is what the
 * library implements today.
 */
#ifndef STARINFER_H
#define STARINFER_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define SI_API __attribute__((visibility("default")))
#else
#define SI_API
#endif

/* Version of the library, as "MAJOR.MINOR.PATCH". */
#define SI_VERSION_MAJOR 0
#define SI_VERSION_MINOR 1
#define SI_VERSION_PATCH 0

/*
 * Status codes.  One X-macro generates the enum and the messages; values only
 * ever grow at the end of the list.
 */
#define SI_STATUS_LIST(X)                                                                          \
    X(SI_OK, 0, "success")                                                                         \
    X(SI_E_INVALID, -1, "invalid argument")                                                        \
    X(SI_E_NOMEM, -2, "out of memory")                                                             \
    X(SI_E_IO, -3, "input/output error")                                                           \
    X(SI_E_FORMAT, -4, "malformed or unsupported file")                                            \
    X(SI_E_UNSUPPORTED, -5, "unsupported feature")                                                 \
    X(SI_E_NOT_FOUND, -6, "not found")                                                             \
    X(SI_E_RUNTIME, -7, "StarPU runtime error")                                                    \
    X(SI_E_NO_DEVICE, -8, "no suitable device")                                                    \
    X(SI_E_BUDGET, -9, "memory budget too small")

enum si_status {
#define SI_STATUS_ENUM_(name, value, msg) name = value,
    SI_STATUS_LIST(SI_STATUS_ENUM_)
#undef SI_STATUS_ENUM_
};

/* Message for a status code; never NULL ("unknown status" for other values). */
SI_API const char *si_status_str(int status);

/* The library's version string, "MAJOR.MINOR.PATCH". */
SI_API const char *si_version(void);

#ifdef __cplusplus
}
#endif

#endif /* STARINFER_H */
