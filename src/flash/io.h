/*
 * io.h - the flash store's reads: many requests in flight against one file.
 *
 * Two back ends behind one call.  io_uring (liburing, when configure found
 * it and the kernel lets the process make a ring): every request of a call
 * is submitted at once, up to the ring's depth in flight, the short ones
 * resubmitted for the rest, from the calling thread.  The fallback: a pool
 * of threads, each taking the next request and reading it with pread.
 * STARINFER_FLASH_IO=uring or =threads picks one (uring where it cannot be
 * made is an error); unset, io_uring when it can be made, else the threads.
 */
#ifndef SI_FLASH_IO_H
#define SI_FLASH_IO_H

#include <stddef.h>
#include <stdint.h>

struct si_flash_io;
struct si_flash_req;

/*
 * Readers for fd: io_uring with depth entries (0: 128), or n_threads pread
 * threads (0: 16).  SI_OK, SI_E_INVALID (a bad STARINFER_FLASH_IO),
 * SI_E_UNSUPPORTED (uring asked for and not available) or SI_E_NOMEM, with
 * err filled.
 */
int si_flash_io_init(struct si_flash_io **out, int fd, int depth, int n_threads, char *err,
                     size_t err_size);
void si_flash_io_free(struct si_flash_io *io);

/* Read the n requests whole: 0, or the first failure's errno (EIO for a
 * read past the end of the file).  Calls are serialised. */
int si_flash_io_read(struct si_flash_io *io, const struct si_flash_req *req, int64_t n);

/* One request with pread on the calling thread: 0 or an errno as above. */
int si_flash_io_pread(int fd, const struct si_flash_req *r);

/* "io_uring, 128 in flight" or "16 pread threads" (and why not io_uring). */
const char *si_flash_io_name(const struct si_flash_io *io);

#endif /* SI_FLASH_IO_H */
