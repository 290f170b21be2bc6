/* io.c - the flash store's reads: io_uring, or a pool of pread threads (see io.h). */
#include "config.h"

#include "flash/io.h"

#include "flash/store.h"
#include "internal.h"
#include "starinfer.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#ifdef SI_HAVE_LIBURING
#include <liburing.h>
#endif

struct si_flash_io {
    pthread_mutex_t call; /* one si_flash_io_read at a time */
    int fd;
    char name[160];
#ifdef SI_HAVE_LIBURING
    bool uring;
    struct io_uring ring;
    unsigned depth;
    size_t *done; /* (depth) bytes read of the request in each slot */
    int64_t *slot_req; /* (depth) the request in each slot, -1: free */
#endif
    /* The pread pool. */
    pthread_mutex_t lock;
    pthread_cond_t work, finished_cond;
    pthread_t *threads;
    int n_threads;
    bool quit;
    const struct si_flash_req *req;
    int64_t n_req;
    atomic_llong next; /* the next request to take */
    int64_t finished;  /* requests done (under lock) */
    int err_no;        /* the first failure's errno (EIO for a short file) */
    uint64_t gen;      /* jobs started: a thread works once per job */
};

/* ------------------------------------------------------------ pread pool */

int si_flash_io_pread(int fd, const struct si_flash_req *r)
{
    size_t got = 0;
    while (got < r->len) {
        ssize_t n = pread(fd, (char *)r->dst + got, r->len - got, (off_t)(r->off + got));
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            return errno;
        if (n == 0)
            return EIO; /* the store is shorter than its header says */
        got += (size_t)n;
    }
    return 0;
}

/* Take requests until none is left; returns how many this thread did. */
static int64_t drain(struct si_flash_io *io, int *err_no)
{
    int64_t did = 0;
    for (;;) {
        const long long k = atomic_fetch_add(&io->next, 1);
        if (k >= io->n_req)
            return did;
        int e = si_flash_io_pread(io->fd, &io->req[k]);
        if (e != 0 && *err_no == 0)
            *err_no = e;
        did++;
    }
}

static void *pool_main(void *arg)
{
    struct si_flash_io *io = arg;
    uint64_t seen = 0;
    pthread_mutex_lock(&io->lock);
    for (;;) {
        while (!io->quit && io->gen == seen)
            pthread_cond_wait(&io->work, &io->lock);
        if (io->quit)
            break;
        seen = io->gen;
        pthread_mutex_unlock(&io->lock);
        int e = 0;
        const int64_t did = drain(io, &e);
        pthread_mutex_lock(&io->lock);
        if (e != 0 && io->err_no == 0)
            io->err_no = e;
        io->finished += did;
        if (io->finished == io->n_req)
            pthread_cond_signal(&io->finished_cond);
    }
    pthread_mutex_unlock(&io->lock);
    return NULL;
}

static bool pool_start(struct si_flash_io *io, int n)
{
    io->threads = calloc((size_t)n, sizeof *io->threads);
    if (io->threads == NULL)
        return false;
    for (int i = 0; i < n; i++) {
        if (pthread_create(&io->threads[i], NULL, pool_main, io) != 0)
            break;
        io->n_threads++;
    }
    return io->n_threads > 0;
}

static int pool_read(struct si_flash_io *io, const struct si_flash_req *req, int64_t n)
{
    pthread_mutex_lock(&io->lock);
    io->req = req;
    io->n_req = n;
    atomic_store(&io->next, 0);
    io->finished = 0;
    io->err_no = 0;
    io->gen++;
    pthread_cond_broadcast(&io->work);
    while (io->finished < io->n_req)
        pthread_cond_wait(&io->finished_cond, &io->lock);
    const int e = io->err_no;
    io->n_req = 0;
    pthread_mutex_unlock(&io->lock);
    return e;
}

/* -------------------------------------------------------------- io_uring */

#ifdef SI_HAVE_LIBURING
/* Queue the read of what is left of request k in slot s. */
static void uring_queue(struct si_flash_io *io, const struct si_flash_req *req, int64_t k,
                        unsigned s)
{
    struct io_uring_sqe *sqe = io_uring_get_sqe(&io->ring);
    const struct si_flash_req *r = &req[k];
    const size_t got = io->done[s];
    io_uring_prep_read(sqe, io->fd, (char *)r->dst + got, (unsigned)(r->len - got),
                       r->off + got);
    io_uring_sqe_set_data64(sqe, s);
    io->slot_req[s] = k;
}

static int uring_read(struct si_flash_io *io, const struct si_flash_req *req, int64_t n)
{
    int64_t next = 0, in_flight = 0;
    int err_no = 0;
    unsigned free_slots[1024], n_free = 0;
    for (unsigned s = io->depth; s-- > 0;)
        free_slots[n_free++] = s;
    /* After a failure nothing more is queued: wait only for what is in flight. */
    while ((err_no == 0 && next < n) || in_flight > 0) {
        /* Fill the ring: the requests (none after a failure). */
        while (err_no == 0 && next < n && n_free > 0) {
            const unsigned s = free_slots[--n_free];
            io->done[s] = 0;
            uring_queue(io, req, next++, s);
            in_flight++;
        }
        const int rc = io_uring_submit_and_wait(&io->ring, 1);
        if (rc < 0 && rc != -EINTR && rc != -EAGAIN && rc != -EBUSY) {
            /* The ring itself failed (not seen: a valid ring only returns
             * those three).  The run ends with this error; a read still in
             * flight may yet land in its record, which nothing reads then. */
            if (err_no == 0)
                err_no = -rc;
            break;
        }
        struct io_uring_cqe *cqe;
        unsigned head, seen = 0;
        io_uring_for_each_cqe(&io->ring, head, cqe)
        {
            seen++;
            const unsigned s = (unsigned)io_uring_cqe_get_data64(cqe);
            const int64_t k = io->slot_req[s];
            const int res = cqe->res;
            bool finished = true;
            if (res < 0 && res != -EINTR && res != -EAGAIN) {
                if (err_no == 0)
                    err_no = -res;
            } else if (res == 0) {
                if (err_no == 0)
                    err_no = EIO; /* past the end of the file */
            } else {
                if (res > 0)
                    io->done[s] += (size_t)res;
                if (io->done[s] < req[k].len && err_no == 0) {
                    uring_queue(io, req, k, s); /* a short read: the rest */
                    finished = false;
                }
            }
            if (finished) {
                io->slot_req[s] = -1;
                free_slots[n_free++] = s;
                in_flight--;
            }
        }
        io_uring_cq_advance(&io->ring, seen);
    }
    return err_no;
}
#endif

/* ------------------------------------------------------------ the calls */

int si_flash_io_init(struct si_flash_io **out, int fd, int depth, int n_threads, char *err,
                     size_t err_size)
{
    *out = NULL;
    const char *want = getenv("STARINFER_FLASH_IO");
    if (want != NULL && want[0] == '\0')
        want = NULL;
    if (want != NULL && strcmp(want, "uring") != 0 && strcmp(want, "threads") != 0)
        return si__errf(err, err_size, SI_E_INVALID,
                        "STARINFER_FLASH_IO=%s: say uring (io_uring) or threads (pread threads)",
                        want);
    struct si_flash_io *io = calloc(1, sizeof *io);
    if (io == NULL)
        return si__errf(err, err_size, SI_E_NOMEM, "out of memory");
    io->fd = fd;
    pthread_mutex_init(&io->call, NULL);
    pthread_mutex_init(&io->lock, NULL);
    pthread_cond_init(&io->work, NULL);
    pthread_cond_init(&io->finished_cond, NULL);
    char why[96] = "";
#ifdef SI_HAVE_LIBURING
    if (want == NULL || strcmp(want, "uring") == 0) {
        io->depth = depth > 0 ? (unsigned)depth : 128;
        if (io->depth > 1024)
            io->depth = 1024;
        io->done = calloc(io->depth, sizeof *io->done);
        io->slot_req = malloc(io->depth * sizeof *io->slot_req);
        const int rc = io->done != NULL && io->slot_req != NULL
                           ? io_uring_queue_init(io->depth, &io->ring, 0)
                           : -ENOMEM;
        if (rc == 0) {
            io->uring = true;
            snprintf(io->name, sizeof io->name, "io_uring, %u in flight", io->depth);
            *out = io;
            return SI_OK;
        }
        snprintf(why, sizeof why, " (io_uring refused: %s)", strerror(-rc));
        free(io->done);
        free(io->slot_req);
        io->done = NULL;
        io->slot_req = NULL;
        if (want != NULL) {
            si_flash_io_free(io);
            return si__errf(err, err_size, SI_E_UNSUPPORTED, "STARINFER_FLASH_IO=uring:%s", why);
        }
    }
#else
    (void)depth;
    if (want != NULL && strcmp(want, "uring") == 0) {
        si_flash_io_free(io);
        return si__errf(err, err_size, SI_E_UNSUPPORTED,
                        "STARINFER_FLASH_IO=uring: starinfer was built without liburing");
    }
    snprintf(why, sizeof why, " (built without liburing)");
#endif
    const int nt = n_threads > 0 ? n_threads : 16;
    if (!pool_start(io, nt)) {
        si_flash_io_free(io);
        return si__errf(err, err_size, SI_E_NOMEM, "cannot start the flash reader threads");
    }
    snprintf(io->name, sizeof io->name, "%d pread threads%s", io->n_threads,
             want == NULL ? why : "");
    *out = io;
    return SI_OK;
}

void si_flash_io_free(struct si_flash_io *io)
{
    if (io == NULL)
        return;
#ifdef SI_HAVE_LIBURING
    if (io->uring)
        io_uring_queue_exit(&io->ring);
    free(io->done);
    free(io->slot_req);
#endif
    pthread_mutex_lock(&io->lock);
    io->quit = true;
    pthread_cond_broadcast(&io->work);
    pthread_mutex_unlock(&io->lock);
    for (int i = 0; i < io->n_threads; i++)
        pthread_join(io->threads[i], NULL);
    pthread_mutex_destroy(&io->lock);
    pthread_mutex_destroy(&io->call);
    pthread_cond_destroy(&io->work);
    pthread_cond_destroy(&io->finished_cond);
    free(io->threads);
    free(io);
}

int si_flash_io_read(struct si_flash_io *io, const struct si_flash_req *req, int64_t n)
{
    if (n <= 0)
        return 0;
    pthread_mutex_lock(&io->call);
    int e;
#ifdef SI_HAVE_LIBURING
    if (io->uring)
        e = uring_read(io, req, n);
    else
#endif
        e = pool_read(io, req, n);
    pthread_mutex_unlock(&io->call);
    return e;
}

const char *si_flash_io_name(const struct si_flash_io *io)
{
    return io->name;
}
