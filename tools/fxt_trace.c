/*
 * fxt_trace.c - `--trace DIR`: record a run with StarPU's FxT tracing, then
 * convert it for ViTE and StarVZ and draw its panels (the C twin of
 * the tools/trace script, hence the name).
 *
 * StarPU reads STARPU_FXT_TRACE and STARPU_FXT_PREFIX when it starts and
 * writes the raw trace (DIR/prof_file_<user>_<rank>) when it shuts down, so
 * the work is split in two: si_trace_begin() before StarPU starts, and
 * si_trace_finish() after it stopped.  The conversion runs the same programs
 * as tools/trace: starpu_fxt_tool (paje.trace for ViTE; tasks.rec, dag.dot and
 * the others for StarVZ), then starinfer-trace-plot (tools/trace-plot: the
 * panels and the summary of where the workers' time went).
 */
#include "config.h"

#include "cli.h"

#include <errno.h>
#include <fcntl.h>
#include <glob.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#define PLOT "starinfer-trace-plot"

/* The picture's program: beside this binary (the build folder, or where it
 * is installed), else in PATH. */
static bool plot_program(char *buf, size_t size)
{
    ssize_t n = readlink("/proc/self/exe", buf, size - 1);
    if (n > 0) {
        buf[n] = '\0';
        char *slash = strrchr(buf, '/');
        if (slash != NULL && (size_t)(slash - buf) + sizeof "/" PLOT <= size) {
            strcpy(slash + 1, PLOT);
            if (access(buf, X_OK) == 0)
                return true;
        }
    }
    return si_cli_find_in_path(PLOT, buf, size);
}

/* Run argv with stdout and stderr into a pipe; its exit status (-1: not
 * run) and its last line of output in line. */
static int run_capture(char *const argv[], char *line, size_t size)
{
    line[0] = '\0';
    int fd[2];
    if (pipe(fd) != 0)
        return -1;
    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0) {
        close(fd[0]);
        close(fd[1]);
        return -1;
    }
    if (pid == 0) {
        dup2(fd[1], 1);
        dup2(fd[1], 2);
        close(fd[0]);
        close(fd[1]);
        execv(argv[0], argv);
        _exit(127);
    }
    close(fd[1]);
    char cur[512], c;
    size_t n = 0;
    ssize_t r;
    while ((r = read(fd[0], &c, 1)) == 1 || (r < 0 && errno == EINTR)) {
        if (r < 0)
            continue;
        if (c != '\n' && n + 1 < sizeof cur) {
            cur[n++] = c;
        } else if (c == '\n' && n > 0) {
            cur[n] = '\0';
            snprintf(line, size, "%s", cur);
            n = 0;
        }
    }
    if (n > 0) {
        cur[n] = '\0';
        snprintf(line, size, "%s", cur);
    }
    close(fd[0]);
    int status;
    while (waitpid(pid, &status, 0) < 0)
        if (errno != EINTR)
            return -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

/* mkdir -p */
static int make_dirs(const char *dir)
{
    char buf[4096];
    if (strlen(dir) >= sizeof buf) {
        errno = ENAMETOOLONG;
        return -1;
    }
    strcpy(buf, dir);
    for (char *p = buf + 1; *p != '\0'; p++) {
        if (*p != '/')
            continue;
        *p = '\0';
        if (mkdir(buf, 0777) != 0 && errno != EEXIST)
            return -1;
        *p = '/';
    }
    if (mkdir(buf, 0777) != 0 && errno != EEXIST)
        return -1;
    struct stat st;
    if (stat(buf, &st) != 0)
        return -1;
    if (!S_ISDIR(st.st_mode)) {
        errno = ENOTDIR;
        return -1;
    }
    return 0;
}

/* Remove the raw traces of an earlier run in dir, so that only this run's
 * are converted. */
static void remove_old_traces(const char *dir)
{
    char pat[4200];
    snprintf(pat, sizeof pat, "%s/prof_file_*", dir);
    glob_t g;
    if (glob(pat, 0, NULL, &g) == 0)
        for (size_t i = 0; i < g.gl_pathc; i++)
            unlink(g.gl_pathv[i]);
    globfree(&g);
}

int si_trace_check(const char *dir)
{
#ifndef SI_HAVE_FXT
    (void)dir;
    return si_cli_error("--trace: this StarPU was built without FxT, so it records no traces "
                        "(tools/install-deps builds it with FxT)");
#else
    char path[4096], line[512];
    if (!si_cli_find_in_path("starpu_fxt_tool", path, sizeof path))
        return si_cli_error("--trace: starpu_fxt_tool not found in PATH (tools/install-deps "
                            "installs it; source ~/.cache/starinfer/env.sh)");
    if (!plot_program(path, sizeof path))
        return si_cli_error("--trace: " PLOT " not found beside starinfer or in PATH (`make` "
                            "puts it in the build folder, `make install` beside the binary)");
    char *check[] = {path, (char *)"--check", NULL};
    if (run_capture(check, line, sizeof line) != 0)
        return si_cli_error("--trace: %s", line[0] ? line : PLOT " --check failed");
    if (getenv("STARPU_FXT_TRACE") != NULL && !strcmp(getenv("STARPU_FXT_TRACE"), "0"))
        return si_cli_error("--trace: STARPU_FXT_TRACE=0 in the environment turns tracing off");
    if (make_dirs(dir) != 0)
        return si_cli_error("--trace: cannot create %s: %s", dir, strerror(errno));
    if (access(dir, W_OK) != 0)
        return si_cli_error("--trace: cannot write into %s: %s", dir, strerror(errno));
    return 0;
#endif
}

int si_trace_begin(const char *dir)
{
    if (si_trace_check(dir) != 0)
        return 1;
    remove_old_traces(dir);
    char prefix[4200];
    snprintf(prefix, sizeof prefix, "%s/", dir);
    setenv("STARPU_FXT_TRACE", "1", 1);
    setenv("STARPU_FXT_PREFIX", prefix, 1);
    return 0;
}

/* Run argv in folder dir with stdout and stderr into dir/log; true when it
 * exits with 0. */
static bool run_in(const char *dir, const char *log, char *const argv[])
{
    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0)
        return false;
    if (pid == 0) {
        if (chdir(dir) != 0)
            _exit(126);
        int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0666);
        if (fd >= 0) {
            dup2(fd, 1);
            dup2(fd, 2);
            close(fd);
        }
        execvp(argv[0], argv);
        _exit(127);
    }
    int status;
    while (waitpid(pid, &status, 0) < 0)
        if (errno != EINTR)
            return false;
    return WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

int si_trace_finish(const char *dir, bool another_run)
{
    char pat[4200];
    snprintf(pat, sizeof pat, "%s/prof_file_*", dir);
    glob_t g;
    if (glob(pat, 0, NULL, &g) != 0 || g.gl_pathc == 0 || (g.gl_pathc == 1 && strstr(g.gl_pathv[0], ".run") != NULL)) {
        globfree(&g);
        return si_cli_error("--trace: StarPU wrote no FxT trace into %s", dir);
    }
    /* FxT remembers the file it wrote and, when StarPU starts again in this
     * process with another prefix, moves that file to the new name and
     * overwrites it: this run's files get a name of their own, and when
     * another traced run follows, an empty file takes the old name for FxT
     * to move. */
    for (size_t i = 0; i < g.gl_pathc; i++) {
        if (strstr(g.gl_pathv[i], ".run") != NULL)
            continue;
        char kept[4300];
        snprintf(kept, sizeof kept, "%s.run", g.gl_pathv[i]);
        if (rename(g.gl_pathv[i], kept) != 0) {
            globfree(&g);
            return si_cli_error("--trace: cannot rename %s: %s", kept, strerror(errno));
        }
        if (another_run) {
            int fd = open(g.gl_pathv[i], O_WRONLY | O_CREAT | O_TRUNC, 0666);
            if (fd >= 0)
                close(fd);
        }
        free(g.gl_pathv[i]);
        g.gl_pathv[i] = strdup(kept);
        if (g.gl_pathv[i] == NULL) {
            globfree(&g);
            return si_cli_error("out of memory");
        }
    }
    /* starpu_fxt_tool -i FILE... (run in dir: its outputs land there). */
    char **argv = calloc(g.gl_pathc + 3, sizeof *argv);
    if (argv == NULL) {
        globfree(&g);
        return si_cli_error("out of memory");
    }
    argv[0] = (char *)"starpu_fxt_tool";
    argv[1] = (char *)"-i";
    for (size_t i = 0; i < g.gl_pathc; i++) {
        const char *slash = strrchr(g.gl_pathv[i], '/');
        argv[2 + i] = slash != NULL ? (char *)slash + 1 : g.gl_pathv[i];
    }
    bool ok = run_in(dir, "fxt-tool.log", argv);
    free(argv);
    globfree(&g);
    if (!ok)
        return si_cli_error("--trace: starpu_fxt_tool failed (see %s/fxt-tool.log)", dir);

    char plot[4096];
    if (!plot_program(plot, sizeof plot))
        return si_cli_error("--trace: " PLOT " not found beside starinfer or in PATH");
    char *draw[] = {plot, (char *)".", NULL};
    if (!run_in(dir, "trace-plot.log", draw))
        return si_cli_error("--trace: " PLOT " failed (see %s/trace-plot.log)", dir);
    fprintf(stderr,
            "trace: %s/trace.png: the workers' tasks by kind and layer, tasks ready and "
            "submitted, and the summary in %s/trace-summary.md (two decoded tokens after the "
            "first; " PLOT " %s --token K or --window T0:T1|all draws another)\n"
            "trace: ViTE: vite %s/paje.trace\n"
            "trace: StarVZ (R): library(starvz); starvz_phase1(\"%s\"); "
            "starvz_plot(starvz_read(\"%s\"))\n",
            dir, dir, dir, dir, dir, dir);
    return 0;
}
