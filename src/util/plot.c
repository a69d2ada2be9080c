/* Line plots as plain SVG (src/util/plot.h). */
#include "plot.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "file.h"

/* A tick step of 1, 2 or 5 times a power of ten that cuts `range` into about `n` parts. */
static double tick_step(double range, int n)
{
    double raw = range / n, p = pow(10, floor(log10(raw))), f = raw / p;
    return p * (f < 1.5 ? 1 : f < 3.5 ? 2 : f < 7.5 ? 5 : 10);
}

enum { W = 720, H = 400, ML = 64, MR = 24, MT = 36, MB = 48, MAXPTS = 400 };

/* Text as XML character data or an attribute value: & < > " ' as
 * entities, and the control characters XML 1.0 does not allow (all below
 * 0x20 but tab, newline and carriage return) as '?'. */
static void put_xml(FILE *f, const char *s)
{
    for (; s && *s; s++) {
        unsigned char c = (unsigned char)*s;
        switch (c) {
        case '&': fputs("&amp;", f); break;
        case '<': fputs("&lt;", f); break;
        case '>': fputs("&gt;", f); break;
        case '"': fputs("&quot;", f); break;
        case '\'': fputs("&apos;", f); break;
        default: fputc(c < 0x20 && c != '\t' && c != '\n' && c != '\r' ? '?' : c, f);
        }
    }
}

int ff_plot_svg(const char *path, const char *title, const char *xlabel, const char *ylabel,
                const ff_plot_series *s, int ns, char *err, size_t errlen)
{
    double x0 = INFINITY, x1 = -INFINITY, y0 = INFINITY, y1 = -INFINITY;
    for (int k = 0; k < ns; k++)
        for (int i = 0; i < s[k].n; i++)
            if (isfinite(s[k].x[i]) && isfinite(s[k].y[i])) {
                x0 = fmin(x0, s[k].x[i]);
                x1 = fmax(x1, s[k].x[i]);
                y0 = fmin(y0, s[k].y[i]);
                y1 = fmax(y1, s[k].y[i]);
            }
    if (!(x0 <= x1)) {
        snprintf(err, errlen, "nothing to plot in '%s'", path);
        return -1;
    }
    if (x1 == x0)
        x1 = x0 + 1;
    if (y1 == y0)
        y1 = y0 + 1;
    double ys = tick_step(y1 - y0, 6), xs = tick_step(x1 - x0, 8);
    y0 = floor(y0 / ys) * ys;
    y1 = ceil(y1 / ys) * ys;
    const double pw = W - ML - MR, ph = H - MT - MB;
#define PX(v) (ML + ((v)-x0) / (x1 - x0) * pw)
#define PY(v) (MT + (y1 - (v)) / (y1 - y0) * ph)
    char tmp[FF_TMP_PATH_MAX];
    FILE *f = ff_atomic_open(path, tmp);
    if (!f) {
        snprintf(err, errlen, "cannot write '%s'", path);
        return -1;
    }
    fprintf(f,
            "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" "
            "viewBox=\"0 0 %d %d\" font-family=\"sans-serif\" font-size=\"12\">\n"
            "<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n"
            "<text x=\"%d\" y=\"22\" text-anchor=\"middle\" font-size=\"14\">",
            W, H, W, H, W / 2);
    put_xml(f, title);
    fputs("</text>\n", f);
    /* ticks by count (a step below the values' resolution cannot loop) */
    const int ny = (int)fmin(50, floor((y1 - y0) / ys + 0.5));
    for (int i = 0; i <= ny; i++) {
        const double v = y0 + i * ys;
        fprintf(f,
                "<line x1=\"%d\" x2=\"%d\" y1=\"%.1f\" y2=\"%.1f\" stroke=\"#ddd\"/>"
                "<text x=\"%d\" y=\"%.1f\" text-anchor=\"end\">%g</text>\n",
                ML, W - MR, PY(v), PY(v), ML - 6, PY(v) + 4, v);
    }
    const double xt0 = ceil(x0 / xs) * xs;
    const int nx = (int)fmin(50, floor((x1 - xt0) / xs + 0.5));
    for (int i = 0; i <= nx; i++) {
        const double v = xt0 + i * xs;
        fprintf(f,
                "<line x1=\"%.1f\" x2=\"%.1f\" y1=\"%d\" y2=\"%d\" stroke=\"#ddd\"/>"
                "<text x=\"%.1f\" y=\"%d\" text-anchor=\"middle\">%g</text>\n",
                PX(v), PX(v), MT, H - MB, PX(v), H - MB + 16, v);
    }
    fprintf(f,
            "<rect x=\"%d\" y=\"%d\" width=\"%.0f\" height=\"%.0f\" fill=\"none\" "
            "stroke=\"#444\"/>\n<text x=\"%.0f\" y=\"%d\" text-anchor=\"middle\">",
            ML, MT, pw, ph, ML + pw / 2, H - 10);
    put_xml(f, xlabel);
    fprintf(f,
            "</text>\n<text x=\"16\" y=\"%.0f\" text-anchor=\"middle\" "
            "transform=\"rotate(-90 16 %.0f)\">",
            MT + ph / 2, MT + ph / 2);
    put_xml(f, ylabel);
    fputs("</text>\n", f);
    for (int k = 0; k < ns; k++) {
        fputs("<polyline fill=\"none\" stroke=\"", f);
        put_xml(f, s[k].color);
        fprintf(f, "\" stroke-width=\"%s\" points=\"", s[k].markers ? "2" : "1");
        /* at most MAXPTS points: a long series is drawn as the means of
         * consecutive runs of points (smoother, and a small file) */
        const int n = s[k].n, per = (n + MAXPTS - 1) / MAXPTS;
        for (int i = 0; i < n; i += per) {
            double sx = 0, sy = 0;
            int m = 0;
            for (int j = i; j < i + per && j < n; j++)
                if (isfinite(s[k].x[j]) && isfinite(s[k].y[j])) {
                    sx += s[k].x[j];
                    sy += s[k].y[j];
                    m++;
                }
            if (m)
                fprintf(f, "%.1f,%.1f ", PX(sx / m), PY(sy / m));
        }
        fprintf(f, "\"/>\n");
        for (int i = 0; s[k].markers && i < s[k].n; i++)
            if (isfinite(s[k].x[i]) && isfinite(s[k].y[i])) {
                fprintf(f, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"3\" fill=\"", PX(s[k].x[i]),
                        PY(s[k].y[i]));
                put_xml(f, s[k].color);
                fputs("\"/>\n", f);
            }
        /* the legend, top right */
        double ly = MT + 16 + 18 * k;
        fprintf(f, "<line x1=\"%d\" x2=\"%d\" y1=\"%.0f\" y2=\"%.0f\" stroke=\"", W - MR - 150,
                W - MR - 126, ly, ly);
        put_xml(f, s[k].color);
        fprintf(f, "\" stroke-width=\"2\"/><text x=\"%d\" y=\"%.0f\">", W - MR - 120, ly + 4);
        put_xml(f, s[k].name);
        fputs("</text>\n", f);
    }
#undef PX
#undef PY
    fprintf(f, "</svg>\n");
    if (ff_atomic_commit(f, tmp, path) != 0) {
        snprintf(err, errlen, "cannot write '%s'", path);
        return -1;
    }
    return 0;
}
