/*
 * fxt_trace.c - `--trace DIR`: record a run with StarPU's FxT tracing, then
 * convert it for ViTE and StarVZ and render a PNG Gantt chart (the C twin of
 * the tools/trace script, hence the name).
 *
 * StarPU reads STARPU_FXT_TRACE and STARPU_FXT_PREFIX when it starts and
 * writes the raw trace (DIR/prof_file_<user>_<rank>) when it shuts down, so
 * the work is split in two: si_trace_begin() before StarPU starts, and
 * si_trace_finish() after it stopped.  The conversion runs the same programs
 * as tools/trace: starpu_fxt_tool (paje.trace for ViTE; tasks.rec, dag.dot and
 * the others for StarVZ), ViTE's headless SVG export, rsvg-convert.
 */
#include "config.h"

#include "cli.h"

#include <errno.h>
#include <fcntl.h>
#include <glob.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

/* The programs the conversion needs, looked up in PATH. */
static const char *const trace_tools[] = {"starpu_fxt_tool", "vite", "rsvg-convert"};

static bool in_path(const char *prog)
{
    const char *path = getenv("PATH");
    if (path == NULL)
        return false;
    char buf[4096];
    for (const char *p = path; *p != '\0';) {
        const char *end = strchr(p, ':');
        size_t n = end != NULL ? (size_t)(end - p) : strlen(p);
        if (n > 0 && n + strlen(prog) + 2 < sizeof buf) {
            memcpy(buf, p, n);
            buf[n] = '/';
            strcpy(buf + n + 1, prog);
            if (access(buf, X_OK) == 0)
                return true;
        }
        p += n;
        if (*p == ':')
            p++;
    }
    return false;
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
    for (size_t i = 0; i < sizeof trace_tools / sizeof trace_tools[0]; i++)
        if (!in_path(trace_tools[i]))
            return si_cli_error("--trace: %s not found in PATH (tools/install-deps installs it; "
                                "source ~/.cache/starinfer/env.sh)",
                                trace_tools[i]);
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

/* Run argv in folder dir with stdout and stderr into dir/log (and
 * QT_QPA_PLATFORM=offscreen, for ViTE); true when it exits with 0. */
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
        setenv("QT_QPA_PLATFORM", "offscreen", 1);
        execvp(argv[0], argv);
        _exit(127);
    }
    int status;
    while (waitpid(pid, &status, 0) < 0)
        if (errno != EINTR)
            return false;
    return WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

/* The interval in which tasks ran, in ms of the trace's clock, from
 * tasks.rec's StartTime/EndTime fields; false when it has no task. */
static bool task_window(const char *dir, double *t0, double *t1)
{
    char path[4200];
    snprintf(path, sizeof path, "%s/tasks.rec", dir);
    FILE *f = fopen(path, "r");
    if (f == NULL)
        return false;
    double lo = INFINITY, hi = -INFINITY, v;
    char line[1024];
    while (fgets(line, sizeof line, f) != NULL) {
        if (sscanf(line, "StartTime: %lf", &v) == 1 && v < lo)
            lo = v;
        else if (sscanf(line, "EndTime: %lf", &v) == 1 && v > hi)
            hi = v;
    }
    fclose(f);
    if (!(lo <= hi))
        return false;
    *t0 = lo - 0.05 > 0 ? lo - 0.05 : 0;
    *t1 = hi + 0.05;
    return true;
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

    double t0, t1;
    char window[64] = "";
    if (task_window(dir, &t0, &t1))
        snprintf(window, sizeof window, "%.3f:%.3f", t0, t1);
    char *vite[] = {(char *)"vite", (char *)"-f", (char *)"paje.trace",     (char *)"-e",
                    (char *)"trace.svg", window[0] ? (char *)"-t" : NULL, window, NULL};
    if (!run_in(dir, "vite.log", vite))
        return si_cli_error("--trace: ViTE's export failed (see %s/vite.log)", dir);
    char *rsvg[] = {(char *)"rsvg-convert", (char *)"-w",      (char *)"1600",
                    (char *)"trace.svg",    (char *)"-o",      (char *)"trace.png",
                    NULL};
    if (!run_in(dir, "rsvg.log", rsvg))
        return si_cli_error("--trace: rsvg-convert failed (see %s/rsvg.log)", dir);
    fprintf(stderr,
            "trace: %s/trace.png: Gantt chart of %s (tasks named by kind and layer, e.g. "
            "attn_L3.0, attn_out_L3, ffn_cold_L3.1)\n"
            "trace: ViTE: vite %s/paje.trace\n"
            "trace: StarVZ (R): library(starvz); starvz_phase1(\"%s\"); "
            "starvz_plot(starvz_read(\"%s\"))\n",
            dir, window[0] ? "the interval in which tasks ran" : "the whole run", dir, dir, dir);
    return 0;
}
