/* progress.c - the progress line of long commands (see progress.h). */
#include "progress.h"

#include "internal.h" /* si__now */

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

bool si_progress_wanted(void)
{
    const char *e = getenv("STARINFER_PROGRESS");
    if (e != NULL && *e != '\0')
        return strcmp(e, "0") != 0;
    return isatty(STDERR_FILENO);
}

void si_progress_begin(struct si_progress *p, const char *label, int64_t total, const char *unit,
                       double scale)
{
    memset(p, 0, sizeof *p);
    p->on = si_progress_wanted();
    p->t0 = si__now();
    p->last = -1.0;
    p->total = total > 0 ? total : 0;
    p->scale = scale > 0 ? scale : 1.0;
    p->unit = unit != NULL ? unit : "";
    snprintf(p->label, sizeof p->label, "%s", label != NULL ? label : "");
}

static void amount(char *buf, size_t n, const struct si_progress *p, int64_t v)
{
    if (p->scale == 1.0)
        snprintf(buf, n, "%" PRId64, v);
    else
        snprintf(buf, n, "%.2f", (double)v / p->scale);
}

void si_progress_update(struct si_progress *p, int64_t done)
{
    if (!p->on)
        return;
    const double t = si__now();
    if (done < p->total && p->last >= 0.0 && t - p->last < 0.1)
        return;
    p->last = t;
    if (done > p->total)
        done = p->total;
    enum { WIDTH = 30 };
    const int fill = p->total > 0 ? (int)((double)WIDTH * (double)done / (double)p->total) : WIDTH;
    /* No rate before a quarter second: a stage whose first report comes
     * after its first step would show nonsense. */
    const double el = t - p->t0, rate = el >= 0.25 ? (double)done / el : 0.0;
    const double eta = rate > 0 ? (double)(p->total - done) / rate : 0.0;
    char d[32], tot[32], r[64] = "";
    amount(d, sizeof d, p, done);
    amount(tot, sizeof tot, p, p->total);
    if (rate > 0)
        snprintf(r, sizeof r, ", %.*f %s/s", p->scale == 1.0 && rate >= 10 ? 0 : 1, rate / p->scale,
                 p->unit);
    char bar[WIDTH + 1];
    memset(bar, '#', (size_t)fill);
    memset(bar + fill, '.', (size_t)(WIDTH - fill));
    bar[WIDTH] = '\0';
    /* \033[K clears what a longer earlier line left. */
    char left[32] = "";
    if (rate > 0)
        snprintf(left, sizeof left, ", %d:%02d left", (int)eta / 60, (int)eta % 60);
    fprintf(stderr, "\r%-28s [%s] %s/%s %s%s%s\033[K", p->label, bar, d, tot, p->unit, r, left);
    fflush(stderr);
    p->drawn = true;
}

void si_progress_end(struct si_progress *p)
{
    if (p->on && p->drawn) {
        fputc('\n', stderr);
        fflush(stderr);
    }
    p->drawn = false;
}
