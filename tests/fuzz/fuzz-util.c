/* fuzz-util.c - what the fuzz targets share (see fuzz.h). */
#include "fuzz.h"

#include "../tiny-model.h"
#include "model/model.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

uint64_t fuzz_accepted;
volatile uint64_t fuzz_sink;

void fuzz_fail(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fputs("fuzz: broken promise: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    abort();
}

void fuzz_check_refusal(const char *err)
{
    if (err[0] == '\0' || strchr(err, '\n') != NULL)
        fuzz_fail("the refusal is not one line: '%s'", err);
}

uint64_t fuzz_touch(const void *p, size_t n)
{
    const uint8_t *b = p;
    uint64_t h = 0;
    for (size_t i = 0; i < n; i++)
        h = h * 31 + b[i];
    return h;
}

const char *fuzz_file(const uint8_t *data, size_t size)
{
    static int fd = -1;
    static char path[64];
    if (fd < 0) {
        if ((fd = memfd_create("fuzz-input", MFD_CLOEXEC)) < 0) {
            perror("fuzz: memfd_create");
            abort();
        }
        snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
    }
    if (ftruncate(fd, 0) != 0) {
        perror("fuzz: ftruncate");
        abort();
    }
    size_t done = 0;
    while (done < size) {
        ssize_t w = pwrite(fd, data + done, size - done, (off_t)done);
        if (w <= 0) {
            perror("fuzz: pwrite");
            abort();
        }
        done += (size_t)w;
    }
    return path;
}

struct si_model *fuzz_tiny_model(void)
{
    static struct si_model *m;
    if (m != NULL)
        return m;
    char path[] = "/tmp/si-fuzz-model-XXXXXX";
    int fd = mkstemp(path);
    if (fd < 0) {
        perror("fuzz: mkstemp");
        abort();
    }
    close(fd);
    write_model(path, "llama", FAULT_NONE);
    char err[256];
    int rc = si_model_load(&m, path, err, sizeof err);
    unlink(path); /* the mapping stays */
    if (rc != 0) {
        fprintf(stderr, "fuzz: the tiny model: %s\n", err);
        abort();
    }
    return m;
}

int fuzz_write_file(const char *path, const void *p, size_t n)
{
    FILE *f = fopen(path, "wb");
    int ok = f != NULL && fwrite(p, 1, n, f) == n;
    if (f != NULL && fclose(f) != 0)
        ok = 0;
    return ok ? 0 : -1;
}
