/* profile_svg.c - the activation CDF of a profile as an SVG picture (profile.h). */
#include "predict/profile.h"

#include "internal.h"
#include "starinfer.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Picture geometry (SVG user units = pixels). */
#define W 720
#define H 540
#define X0 80.0  /* plot area: left, top, width, height */
#define Y0 70.0
#define PW 600.0
#define PH 400.0
#define MAX_POINTS 400 /* per curve, evenly spaced along x */

static int cmp_desc(const void *a, const void *b)
{
    const int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x < y) - (x > y);
}

/* Text with &, <, >, " escaped. */
static void put_text(FILE *f, const char *s)
{
    for (; *s; s++) {
        switch (*s) {
        case '&': fputs("&amp;", f); break;
        case '<': fputs("&lt;", f); break;
        case '>': fputs("&gt;", f); break;
        case '"': fputs("&quot;", f); break;
        default: fputc(*s, f);
        }
    }
}

/* The curve of counts c[0..n) (sorted here, most active first): point k is
 * (k / n, sum of the first k counts / sum of all).  Returns the share of
 * activations the first `at` fraction of neurons carry. */
static double curve(FILE *f, int64_t *c, size_t n, const char *style, double at)
{
    qsort(c, n, sizeof *c, cmp_desc);
    double sum = 0;
    for (size_t k = 0; k < n; k++)
        sum += (double)c[k];
    const size_t step = n > MAX_POINTS ? (n + MAX_POINTS - 1) / MAX_POINTS : 1;
    const size_t k_at = (size_t)(at * (double)n + 0.5);
    double acc = 0, share_at = 0;
    fprintf(f, "<polyline %s points=\"", style);
    for (size_t k = 0; k <= n; k++) {
        if (k == k_at)
            share_at = sum > 0 ? acc / sum : 0;
        if (k % step == 0 || k == n)
            fprintf(f, "%.1f,%.1f ", X0 + PW * (double)k / (double)n,
                    Y0 + PH * (1.0 - (sum > 0 ? acc / sum : 0)));
        if (k < n)
            acc += (double)c[k];
    }
    fputs("\"/>\n", f);
    return share_at;
}

int si_profile_write_svg(const struct si_profile *p, const char *path, const char *title,
                         char *err, size_t err_size)
{
    const size_t ff = (size_t)p->n_ff, total = (size_t)p->n_layer * ff;
    int64_t *c = malloc(total * sizeof *c);
    if (c == NULL)
        return si__errf(err, err_size, SI_E_NOMEM, "%s: out of memory", path);
    /* Written under a temporary name and renamed: a kill or a full disk
     * never leaves a partial picture under path. */
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid());
    FILE *f = fopen(tmp, "w");
    if (f == NULL) {
        int e = errno;
        free(c);
        return si__errf(err, err_size, e == ENOENT ? SI_E_NOT_FOUND : SI_E_IO, "%s: %s", path,
                        strerror(e));
    }
    fprintf(f,
            "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
            "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" "
            "viewBox=\"0 0 %d %d\" font-family=\"DejaVu Sans, Helvetica, Arial, sans-serif\">\n"
            "<rect x=\"0\" y=\"0\" width=\"%d\" height=\"%d\" fill=\"white\"/>\n",
            W, H, W, H, W, H);
    /* The title, a line for each of its first two lines. */
    for (int line = 0; line < 2 && *title; line++) {
        const char *nl = strchr(title, '\n');
        const size_t len = nl != NULL ? (size_t)(nl - title) : strlen(title);
        char buf[512];
        snprintf(buf, sizeof buf, "%.*s", (int)(len < sizeof buf ? len : sizeof buf - 1), title);
        fprintf(f, "<text x=\"%d\" y=\"%d\" font-size=\"%d\" text-anchor=\"middle\">", W / 2,
                line == 0 ? 26 : 50, line == 0 ? 17 : 14);
        put_text(f, buf);
        fputs("</text>\n", f);
        title += len + (nl != NULL);
    }
    /* Grid, ticks and their labels. */
    for (int i = 0; i <= 5; i++) {
        const double u = i / 5.0, x = X0 + PW * u, y = Y0 + PH * (1 - u);
        fprintf(f,
                "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#e4e4e4\"/>\n"
                "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#e4e4e4\"/>\n"
                "<text x=\"%.1f\" y=\"%.1f\" font-size=\"13\" text-anchor=\"middle\">%d%%</text>\n"
                "<text x=\"%.1f\" y=\"%.1f\" font-size=\"13\" text-anchor=\"end\">%d%%</text>\n",
                x, Y0, x, Y0 + PH, X0, y, X0 + PW, y, x, Y0 + PH + 20, 20 * i, X0 - 8, y + 4,
                20 * i);
    }
    fprintf(f,
            "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"none\" "
            "stroke=\"black\"/>\n"
            "<text x=\"%.1f\" y=\"%.1f\" font-size=\"14\" text-anchor=\"middle\">share of FFN "
            "neurons, most active first</text>\n"
            "<text x=\"%.1f\" y=\"%.1f\" font-size=\"14\" text-anchor=\"middle\" "
            "transform=\"rotate(-90 %.1f %.1f)\">cumulative share of activations</text>\n",
            X0, Y0, PW, PH, X0 + PW / 2, Y0 + PH + 44, 24.0, Y0 + PH / 2, 24.0, Y0 + PH / 2);
    /* Uniform activity: the diagonal. */
    fprintf(f,
            "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#444\" "
            "stroke-dasharray=\"5,4\"/>\n",
            X0, Y0 + PH, X0 + PW, Y0);
    /* Layers thin and grey, then the whole model on top. */
    for (int32_t l = 0; l < p->n_layer; l++) {
        memcpy(c, p->counts + (size_t)l * ff, ff * sizeof *c);
        curve(f, c, ff, "fill=\"none\" stroke=\"#8c8c8c\" stroke-opacity=\"0.7\" stroke-width=\"1\"",
              0.2);
    }
    memcpy(c, p->counts, total * sizeof *c);
    const double top20 =
        curve(f, c, total, "fill=\"none\" stroke=\"#c0392b\" stroke-width=\"3\"", 0.2);
    /* Legend, bottom right (the curves rise at the left). */
    const double lx = X0 + PW - 250, ly = Y0 + PH - 92;
    fprintf(f,
            "<rect x=\"%.1f\" y=\"%.1f\" width=\"238\" height=\"80\" fill=\"white\" "
            "stroke=\"#bbb\"/>\n"
            "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#c0392b\" "
            "stroke-width=\"3\"/>\n"
            "<text x=\"%.1f\" y=\"%.1f\" font-size=\"13\">whole model (top 20%%: %.0f%%)</text>\n"
            "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#8c8c8c\"/>\n"
            "<text x=\"%.1f\" y=\"%.1f\" font-size=\"13\">each of the %" PRId32
            " layers</text>\n"
            "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#444\" "
            "stroke-dasharray=\"5,4\"/>\n"
            "<text x=\"%.1f\" y=\"%.1f\" font-size=\"13\">uniform activity</text>\n",
            lx, ly, lx + 10, ly + 18, lx + 40, ly + 18, lx + 48, ly + 22, 100 * top20, lx + 10,
            ly + 42, lx + 40, ly + 42, lx + 48, ly + 46, p->n_layer, lx + 10, ly + 66, lx + 40,
            ly + 66, lx + 48, ly + 70);
    fputs("</svg>\n", f);
    free(c);
    const int bad = ferror(f) != 0 ? (errno != 0 ? errno : EIO) : 0;
    const int closed = fclose(f) != 0 ? errno : 0;
    if (bad != 0 || closed != 0) {
        unlink(tmp);
        return si__errf(err, err_size, SI_E_IO, "%s: cannot write it: %s", path,
                        strerror(bad != 0 ? bad : closed));
    }
    if (rename(tmp, path) != 0) {
        const int e = errno;
        unlink(tmp);
        return si__errf(err, err_size, SI_E_IO, "cannot rename '%s' to '%s': %s", tmp, path,
                        strerror(e));
    }
    return SI_OK;
}
