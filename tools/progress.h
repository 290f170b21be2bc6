/*
 * progress.h - the progress line of long commands (synth, profile,
 * train-predictor, eval, convert): one line on stderr, redrawn in place
 * at most ten times a second, only when stderr is a terminal (so logs and
 * pipes get none), with a bar, the count, the rate and the time left.
 */
#ifndef SI_TOOLS_PROGRESS_H
#define SI_TOOLS_PROGRESS_H

#include <stdbool.h>
#include <stdint.h>

struct si_progress {
    bool on;          /* stderr is a terminal (and STARINFER_PROGRESS is not 0) */
    bool drawn;       /* a line is on the screen */
    double t0, last;  /* start, last redraw (s) */
    int64_t total;
    double scale;     /* shown values are done / scale (1 << 30 for GiB) */
    const char *unit; /* "tokens", "GiB", ... */
    char label[48];
};

/* Whether progress lines are drawn: stderr is a terminal and
 * STARINFER_PROGRESS is not "0" ("1" forces them, for tests). */
bool si_progress_wanted(void);

/* Start a line: `label`, `total` units of `unit` (shown divided by scale). */
void si_progress_begin(struct si_progress *p, const char *label, int64_t total, const char *unit,
                       double scale);

/* `done` of the total; redrawn when 0.1 s passed or when done reaches total. */
void si_progress_update(struct si_progress *p, int64_t done);

/* End the line (a newline after the last drawing). */
void si_progress_end(struct si_progress *p);

#endif /* SI_TOOLS_PROGRESS_H */
