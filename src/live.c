/*
 * live.c - which public handles are alive: the set of the si_llm and
 * si_context objects the library made and has not freed, so that a handle
 * freed twice, or used after its free, is refused with a clear status
 * instead of being dereferenced (api.c asks before it touches a handle).
 *
 * A handle is looked up by address only, never read.  The set is small (a
 * program holds a few models and contexts) and a lookup is one mutex and a
 * scan: far below a token's cost.  Its limit: an address reused by a later
 * allocation of the same kind is that new object.
 */
#include "internal.h"

#include <pthread.h>
#include <stdlib.h>

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static struct entry {
    const void *p;
    int kind;
} *set;
static size_t n, cap;

bool si__live_add(const void *p, int kind)
{
    bool ok = true;
    pthread_mutex_lock(&lock);
    if (n == cap) {
        const size_t c = cap ? 2 * cap : 16;
        struct entry *s = realloc(set, c * sizeof *s);
        if (s != NULL) {
            set = s;
            cap = c;
        } else {
            ok = false;
        }
    }
    if (ok)
        set[n++] = (struct entry){p, kind};
    pthread_mutex_unlock(&lock);
    return ok;
}

static size_t find(const void *p, int kind)
{
    for (size_t i = 0; i < n; i++)
        if (set[i].p == p && set[i].kind == kind)
            return i;
    return SIZE_MAX;
}

bool si__live_remove(const void *p, int kind)
{
    pthread_mutex_lock(&lock);
    const size_t i = find(p, kind);
    if (i != SIZE_MAX)
        set[i] = set[--n];
    if (n == 0) { /* the last handle: nothing left for a leak checker */
        free(set);
        set = NULL;
        cap = 0;
    }
    pthread_mutex_unlock(&lock);
    return i != SIZE_MAX;
}

bool si__live_has(const void *p, int kind)
{
    pthread_mutex_lock(&lock);
    const bool has = find(p, kind) != SIZE_MAX;
    pthread_mutex_unlock(&lock);
    return has;
}
