/* 2D convolutions as the 3D parallel linear layer on im2col rows
 * (include/fourfold/conv.h, docs/unet.md). */
#include "fourfold/conv.h"

#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "util/team.h"

struct ff_conv {
    ff_linear *lin;
    ff_grid *grid;
    int64_t h, w, ho, wo, cin_local, cout_local;
    int ksize, stride;
    float *zeros; /* cin_local zeros: the padding's taps read them */
};

int ff_conv_create(ff_linear_seq *s, ff_grid *grid, const ff_conv_desc *d, ff_conv **out)
{
    *out = NULL;
    ff_ctx *ctx = ff_grid_ctx(grid);
    const char *name = d->name ? d->name : "conv";
    if (d->cin < 1 || d->cout < 1 || d->height < 1 || d->width < 1)
        return ff_set_error(ctx, FF_EINVAL,
                            "convolution %s: %lld -> %lld channels on %lld x %lld images: sizes "
                            "must be at least 1",
                            name, (long long)d->cin, (long long)d->cout, (long long)d->height,
                            (long long)d->width);
    if (!((d->ksize == 3 && (d->stride == 1 || d->stride == 2)) ||
          (d->ksize == 1 && d->stride == 1)))
        return ff_set_error(ctx, FF_EUNSUPPORTED,
                            "convolution %s: a %dx%d kernel with stride %d is not supported yet "
                            "(3x3 with stride 1 or 2, 1x1 with stride 1)",
                            name, d->ksize, d->ksize, d->stride);
    ff_dims g = ff_grid_shape(grid);
    int r = d->kind == FF_LINEAR_N ? g.y : g.x, c = d->kind == FF_LINEAR_N ? g.x : g.y;
    if (d->cin % r || d->cout % c)
        return ff_set_error(ctx, FF_EDIVIDE,
                            "convolution %s: %lld input channels over %d ranks (%s) and %lld "
                            "output channels over %d (%s) do not divide",
                            name, (long long)d->cin, r, d->kind == FF_LINEAR_N ? "Y" : "X",
                            (long long)d->cout, c, d->kind == FF_LINEAR_N ? "X" : "Y");
    ff_conv *cv = calloc(1, sizeof *cv);
    if (!cv)
        return ff_set_error(ctx, FF_ENOMEM, "convolution %s: out of memory", name);
    const int taps = d->ksize * d->ksize, pad = d->ksize / 2;
    /* the canonical weight W^T (cout x taps*cin) is PyTorch's (cout, cin, k, k) */
    ff_linear_desc ld = {name,    d->kind,      taps * d->cin, d->cout,
                         d->bias, FF_WEIGHT_NK, NULL,          d->rng_stream};
    int rc = ff_linear_add(s, &ld, &cv->lin);
    if (rc != FF_OK) {
        free(cv);
        return rc;
    }
    cv->grid = grid;
    cv->h = d->height, cv->w = d->width;
    cv->ho = (d->height + 2 * pad - d->ksize) / d->stride + 1;
    cv->wo = (d->width + 2 * pad - d->ksize) / d->stride + 1;
    cv->cin_local = d->cin / r, cv->cout_local = d->cout / c;
    cv->ksize = d->ksize, cv->stride = d->stride;
    if (cv->ksize != 1 && !(cv->zeros = calloc((size_t)cv->cin_local, sizeof(float)))) {
        free(cv);
        return ff_set_error(ctx, FF_ENOMEM, "convolution %s: out of memory", name);
    }
    *out = cv;
    return FF_OK;
}

void ff_conv_destroy(ff_conv *c)
{
    if (c)
        free(c->zeros);
    free(c);
}

ff_linear *ff_conv_linear(const ff_conv *c) { return c->lin; }

ff_conv_sizes ff_conv_local_sizes(const ff_conv *c)
{
    ff_conv_sizes z = {c->cin_local, c->cout_local, c->ho, c->wo, 0};
    if (c->ksize != 1)
        z.col_per_image = c->ho * c->wo * c->ksize * c->ksize * c->cin_local;
    return z;
}

/* Where the 9 input pixels that output pixel (oy, ox) of image b reads
 * start in an (images, H, W, cl) array: tap t = ky*3 + kx at
 * (oy*s + ky - 1, ox*s + kx - 1); -1 outside the image (padding). */
static void taps_of(const ff_conv *c, int64_t b, int64_t oy, int64_t ox, int64_t at[9])
{
    for (int t = 0; t < 9; t++) {
        int64_t iy = oy * c->stride + t / 3 - 1, ix = ox * c->stride + t % 3 - 1;
        at[t] = iy < 0 || iy >= c->h || ix < 0 || ix >= c->w
                    ? -1
                    : ((b * c->h + iy) * c->w + ix) * c->cin_local;
    }
}

/* The passes run on the context's team (util/team.h): im2col by output
 * pixels, col2im by images (an image's input pixels receive only from its
 * own output pixels), so every element is written by one thread, in the
 * same order for any number of threads. */
typedef struct {
    const ff_conv *c;
    float *dst;
    const float *src;
} conv_job;

enum { PIXEL_GRAIN = 64 };

/* col (images*Ho*Wo, 9*cl) = im2col(inp (images, H, W, cl)): column
 * ch*9 + t of an output pixel is channel ch of its tap t, 0 in the padding.
 * Written in order from 9 rows of channels at once; a padding tap reads the
 * layer's row of zeros, so the loop has no branch (a branch per element
 * made this pass 11 % of the U-Net's step, issue 51). */
static void im2col_rows(void *arg, int64_t p0, int64_t p1, int th)
{
    (void)th;
    const conv_job *j = arg;
    const ff_conv *c = j->c;
    const int64_t cl = c->cin_local;
    for (int64_t p = p0; p < p1; p++) {
        float *restrict row = j->dst + p * 9 * cl;
        int64_t at[9];
        taps_of(c, p / (c->ho * c->wo), p / c->wo % c->ho, p % c->wo, at);
        const float *x[9];
        for (int t = 0; t < 9; t++)
            x[t] = at[t] < 0 ? c->zeros : j->src + at[t];
        for (int64_t ch = 0; ch < cl; ch++, row += 9) {
            row[0] = x[0][ch], row[1] = x[1][ch], row[2] = x[2][ch];
            row[3] = x[3][ch], row[4] = x[4][ch], row[5] = x[5][ch];
            row[6] = x[6][ch], row[7] = x[7][ch], row[8] = x[8][ch];
        }
    }
}

static void im2col(const ff_conv *c, float *col, const float *inp, int64_t images)
{
    conv_job j = {c, col, inp};
    ff_team_run(ff_grid_ctx(c->grid)->team, images * c->ho * c->wo, PIXEL_GRAIN, im2col_rows, &j);
}

/* dinp (images, H, W, cl) = col2im(dcol): each input pixel's channel sums
 * the columns im2col copied it to, in output-pixel order (an output pixel's
 * taps are different input pixels), so the order does not depend on the
 * loops inside a pixel. */
static void col2im_images(void *arg, int64_t b0, int64_t b1, int th)
{
    (void)th;
    const conv_job *j = arg;
    const ff_conv *c = j->c;
    const int64_t cl = c->cin_local;
    memset(j->dst + b0 * c->h * c->w * cl, 0,
           (size_t)((b1 - b0) * c->h * c->w * cl) * sizeof(float));
    for (int64_t b = b0; b < b1; b++)
        for (int64_t oy = 0; oy < c->ho; oy++)
            for (int64_t ox = 0; ox < c->wo; ox++) {
                const float *row = j->src + ((b * c->ho + oy) * c->wo + ox) * 9 * cl;
                int64_t at[9];
                taps_of(c, b, oy, ox, at);
                for (int t = 0; t < 9; t++) {
                    if (at[t] < 0)
                        continue;
                    float *dst = j->dst + at[t];
                    for (int64_t ch = 0; ch < cl; ch++)
                        dst[ch] += row[ch * 9 + t];
                }
            }
}

static void col2im(const ff_conv *c, float *dinp, const float *dcol, int64_t images)
{
    conv_job j = {c, dinp, dcol};
    ff_team_run(ff_grid_ctx(c->grid)->team, images, 1, col2im_images, &j);
}

static int check_images(ff_conv *c, int64_t images, const float *col, int need_col)
{
    if (images < 0 || (need_col && c->ksize != 1 && !col))
        return ff_set_error(ff_grid_ctx(c->grid), FF_EINVAL, "convolution %s: %lld images%s",
                            ff_linear_name(c->lin), (long long)images,
                            images < 0 ? "" : ", and no im2col workspace for a 3x3 kernel");
    return FF_OK;
}

int ff_conv_forward(ff_conv *c, float *out, const float *inp, int64_t images, float *col)
{
    int rc = check_images(c, images, col, 1);
    if (rc != FF_OK)
        return rc;
    if (c->ksize == 1)
        return ff_linear_forward(c->lin, out, inp, images * c->h * c->w);
    im2col(c, col, inp, images);
    return ff_linear_forward(c->lin, out, col, images * c->ho * c->wo);
}

int ff_conv_backward(ff_conv *c, float *dinp, const float *dout, const float *inp, int64_t images,
                     float *col, float *dcol)
{
    int rc = check_images(c, images, dinp ? dcol : col, 1);
    if (rc == FF_OK)
        rc = check_images(c, images, col, 1);
    if (rc != FF_OK)
        return rc;
    if (c->ksize == 1)
        return ff_linear_backward(c->lin, dinp, dout, inp, images * c->h * c->w);
    im2col(c, col, inp, images);
    rc = ff_linear_backward(c->lin, dinp ? dcol : NULL, dout, col, images * c->ho * c->wo);
    if (rc == FF_OK && dinp)
        col2im(c, dinp, dcol, images);
    return rc;
}
