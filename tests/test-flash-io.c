/*
 * test-flash-io.c - the flash store's readers (flash/io.h), both back ends
 * (io_uring where the kernel allows it, the pread threads): many more
 * requests than the ring's depth read whole and in the right places, and a
 * request that fails (past the end of the file) at the start, in the middle
 * or at the end makes the call return EIO, having waited for what was in
 * flight, never hang (an alarm turns a hang into a failure: a failure
 * early in a long call used to leave io_uring waiting for requests it had
 * not queued).
 */
#include "flash/io.h"
#include "flash/store.h"
#include "starinfer.h"
#include "test.h"

#include <errno.h>
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define FILE_BYTES (256 * 1024)
#define REQ_BYTES  512
#define N_REQ      300

static unsigned char byte_at(uint64_t o)
{
    return (unsigned char)(o * 7u + o / 4096u + 3u);
}

static void on_alarm(int sig)
{
    (void)sig;
    static const char msg[] = "test-flash-io: a read call hung (no return in 20 s)\n";
    if (write(2, msg, sizeof msg - 1) < 0)
        _exit(2);
    _exit(1);
}

/* N_REQ requests at scattered offsets; bad >= 0: that one past the end. */
static void run(struct si_flash_io *io, const char *name, int bad)
{
    static unsigned char buf[N_REQ][REQ_BYTES];
    struct si_flash_req req[N_REQ];
    memset(buf, 0, sizeof buf);
    for (int k = 0; k < N_REQ; k++) {
        const uint64_t off = (uint64_t)((k * 97) % (FILE_BYTES / REQ_BYTES)) * REQ_BYTES;
        req[k] = (struct si_flash_req){k == bad ? FILE_BYTES + 4096 : off, REQ_BYTES, buf[k]};
    }
    alarm(20);
    const int e = si_flash_io_read(io, req, N_REQ);
    alarm(0);
    if (bad >= 0) {
        CHECK(e == EIO, "%s: a read past the end at request %d: error %d, expected EIO", name, bad,
              e);
        return;
    }
    CHECK(e == 0, "%s: error %d", name, e);
    int wrong = 0;
    for (int k = 0; k < N_REQ; k++)
        for (int i = 0; i < REQ_BYTES; i++)
            wrong += buf[k][i] != byte_at(req[k].off + (uint64_t)i);
    CHECK(wrong == 0, "%s: %d bytes read wrong", name, wrong);
}

int main(void)
{
    signal(SIGALRM, on_alarm);
    const char *dir = getenv("TMPDIR") != NULL ? getenv("TMPDIR") : "/tmp";
    char path[4096];
    snprintf(path, sizeof path, "%s/test-flash-io.XXXXXX", dir);
    const int fd = mkstemp(path);
    if (fd < 0)
        test_skip("cannot make a temporary file");
    unlink(path);
    static unsigned char data[FILE_BYTES];
    for (uint64_t o = 0; o < FILE_BYTES; o++)
        data[o] = byte_at(o);
    CHECK(write(fd, data, sizeof data) == (ssize_t)sizeof data, "write the file");

    static const char *const backs[] = {"uring", "threads"};
    for (size_t b = 0; b < 2; b++) {
        setenv("STARINFER_FLASH_IO", backs[b], 1);
        struct si_flash_io *io = NULL;
        char err[256];
        const int rc = si_flash_io_init(&io, fd, 8, 4, err, sizeof err);
        if (rc == SI_E_UNSUPPORTED) { /* no liburing, or the kernel refuses rings */
            printf("%s: not available here (%s): not tested\n", backs[b], err);
            continue;
        }
        CHECK(rc == SI_OK, "%s: init: %s", backs[b], err);
        if (rc != SI_OK)
            continue;
        printf("%s\n", si_flash_io_name(io));
        run(io, backs[b], -1);
        run(io, backs[b], 0);         /* the first: the rest not yet queued */
        run(io, backs[b], N_REQ / 2); /* the middle */
        run(io, backs[b], N_REQ - 1); /* the last */
        run(io, backs[b], -1);        /* and the reader still works */
        si_flash_io_free(io);
    }
    unsetenv("STARINFER_FLASH_IO");
    close(fd);
    return test_result();
}
