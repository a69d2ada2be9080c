/* A line plot as a plain SVG file (no plotting dependency): the loss
 * curves of a training run. Not installed. */
#ifndef FF_PLOT_H
#define FF_PLOT_H

#include <stddef.h>
#include <stdio.h>

typedef struct {
    const char *name;  /* the legend's label */
    const char *color; /* an SVG colour, e.g. "#1f77b4" */
    const double *x, *y;
    int n;
    int markers; /* 1: a dot at every point (sparse series) */
} ff_plot_series;

/* Writes the series on shared axes (a series of more than 400 points is
 * drawn as the means of consecutive runs of points) to `path` atomically (temporary file,
 * fsync, rename). The title, labels, names and colours may hold any text:
 * they are XML-escaped. 0, or -1 with a message in err. */
int ff_plot_svg(const char *path, const char *title, const char *xlabel, const char *ylabel,
                const ff_plot_series *s, int ns, char *err, size_t errlen);

#endif
