/* The U-Net's operations besides its convolutions (unet_ops.h). */
#include "unet_ops.h"

#include <math.h>
#include <string.h>

#include "internal.h"

/* ---- GroupNorm ---------------------------------------------------------------
 * Per image, the rank's channels ch = 0..cl-1 are canonical channels c0 + ch,
 * of group (c0 + ch) / cg. Sums run over pixels in order, then channels in
 * order, in double, and are rounded to float once. */

typedef struct {
    int64_t images, hw, cl, C, G, cg, c0;
    int spans; /* a group's channels lie on several ranks: sums cross gs */
} gn_shape;

static int gn_shape_of(ff_group *gs, gn_shape *s, int64_t images, int64_t hw, int64_t cl, int64_t C,
                       int G)
{
    int n = ff_group_size(gs);
    if (images < 0 || hw < 1)
        return ff_set_error(gs->ctx, FF_EINVAL, "GroupNorm: %lld images of %lld pixels",
                            (long long)images, (long long)hw);
    if (G < 1 || C % G || cl * n != C)
        return ff_set_error(gs->ctx, FF_EDIVIDE,
                            "GroupNorm: %d groups of %lld channels held %lld per rank over %d "
                            "ranks (%s) do not divide",
                            G, (long long)C, (long long)cl, n, gs->name);
    *s = (gn_shape){images, hw, cl, C, G, C / G, (int64_t)ff_group_rank(gs) * cl, 0};
    s->spans = cl % s->cg != 0;
    return FF_OK;
}

/* The first and one past the last group this rank holds channels of. */
static void gn_groups(const gn_shape *s, int64_t *g0, int64_t *g1)
{
    *g0 = s->c0 / s->cg;
    *g1 = (s->c0 + s->cl - 1) / s->cg + 1;
}

/* sums (images, G) of f(x) over each group's values on this rank */
static void gn_sums(const gn_shape *s, float *sums, const float *inp, const float *center)
{
    int64_t g0, g1;
    gn_groups(s, &g0, &g1);
    memset(sums, 0, (size_t)(s->images * s->G) * sizeof(float));
    for (int64_t i = 0; i < s->images; i++)
        for (int64_t g = g0; g < g1; g++) {
            int64_t lo = g * s->cg - s->c0, hi = lo + s->cg;
            lo = lo < 0 ? 0 : lo, hi = hi > s->cl ? s->cl : hi;
            double acc = 0, m = center ? center[i * s->G + g] : 0;
            for (int64_t p = 0; p < s->hw; p++) {
                const float *x = inp + (i * s->hw + p) * s->cl;
                for (int64_t ch = lo; ch < hi; ch++) {
                    double d = center ? (double)(x[ch] - (float)m) : x[ch];
                    acc += center ? d * d : d;
                }
            }
            sums[i * s->G + g] = (float)acc;
        }
}

int ff_gn_forward(ff_group *gs, float *out, float *mean, float *rstd, const float *inp,
                  const float *w, const float *b, int64_t images, int64_t hw, int64_t cl, int64_t C,
                  int G, float eps)
{
    gn_shape s = {0};
    int rc = gn_shape_of(gs, &s, images, hw, cl, C, G);
    if (rc)
        return rc;
    const size_t ng = (size_t)(images * G);
    const float inv_n = 1.0f / (float)(hw * s.cg);
    int64_t g0, g1;
    gn_groups(&s, &g0, &g1);
    gn_sums(&s, mean, inp, NULL);
    if (s.spans && (rc = ff_allreduce(gs, mean, mean, ng, NULL)))
        return rc;
    for (size_t k = 0; k < ng; k++)
        mean[k] *= inv_n;
    gn_sums(&s, rstd, inp, mean);
    if (s.spans && (rc = ff_allreduce(gs, rstd, rstd, ng, NULL)))
        return rc;
    for (int64_t i = 0; i < images; i++)
        for (int64_t g = 0; g < G; g++) {
            float *r = &rstd[i * G + g];
            *r = g >= g0 && g < g1 ? 1.0f / sqrtf(*r * inv_n + eps) : 0.0f;
            if (!(g >= g0 && g < g1))
                mean[i * G + g] = 0.0f;
        }
    for (int64_t i = 0; i < images; i++)
        for (int64_t p = 0; p < hw; p++) {
            const float *x = inp + (i * hw + p) * cl;
            float *y = out + (i * hw + p) * cl;
            for (int64_t ch = 0; ch < cl; ch++) {
                int64_t k = i * G + (s.c0 + ch) / s.cg;
                y[ch] = (x[ch] - mean[k]) * rstd[k] * w[ch] + b[ch];
            }
        }
    return FF_OK;
}

int ff_gn_backward(ff_group *gs, float *dinp, float *dw, float *db, const float *dout,
                   const float *inp, const float *w, const float *mean, const float *rstd,
                   int64_t images, int64_t hw, int64_t cl, int64_t C, int G, float *scratch)
{
    gn_shape s = {0};
    int rc = gn_shape_of(gs, &s, images, hw, cl, C, G);
    if (rc)
        return rc;
    int64_t g0, g1;
    gn_groups(&s, &g0, &g1);
    /* per image and group: s1 = sum g, s2 = sum g xhat, g = dout w */
    float *s1 = scratch, *s2 = scratch + images * G;
    memset(scratch, 0, (size_t)(2 * images * G) * sizeof(float));
    for (int64_t i = 0; i < images; i++)
        for (int64_t g = g0; g < g1; g++) {
            int64_t lo = g * s.cg - s.c0, hi = lo + s.cg, k = i * G + g;
            lo = lo < 0 ? 0 : lo, hi = hi > cl ? cl : hi;
            double a1 = 0, a2 = 0;
            for (int64_t p = 0; p < hw; p++)
                for (int64_t ch = lo; ch < hi; ch++) {
                    int64_t e = (i * hw + p) * cl + ch;
                    float xhat = (inp[e] - mean[k]) * rstd[k], gr = dout[e] * w[ch];
                    a1 += gr;
                    a2 += (double)gr * xhat;
                }
            s1[k] = (float)a1, s2[k] = (float)a2;
        }
    if (s.spans && (rc = ff_allreduce(gs, scratch, scratch, (size_t)(2 * images * G), NULL)))
        return rc;
    const float inv_n = 1.0f / (float)(hw * s.cg);
    for (int64_t ch = 0; ch < cl; ch++) {
        double aw = 0, ab = 0;
        for (int64_t i = 0; i < images; i++) {
            int64_t k = i * G + (s.c0 + ch) / s.cg;
            for (int64_t p = 0; p < hw; p++) {
                int64_t e = (i * hw + p) * cl + ch;
                float xhat = (inp[e] - mean[k]) * rstd[k];
                aw += (double)dout[e] * xhat;
                ab += dout[e];
                if (dinp)
                    dinp[e] += rstd[k] * (dout[e] * w[ch] - s1[k] * inv_n - xhat * s2[k] * inv_n);
            }
        }
        dw[ch] += (float)aw;
        db[ch] += (float)ab;
    }
    return FF_OK;
}

/* ---- SiLU ------------------------------------------------------------------ */

void ff_silu_forward(float *out, const float *inp, int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        out[i] = inp[i] / (1.0f + expf(-inp[i]));
}

void ff_silu_backward(float *dinp, const float *dout, const float *inp, int64_t n)
{
    for (int64_t i = 0; i < n; i++) {
        float sg = 1.0f / (1.0f + expf(-inp[i]));
        dinp[i] = dout[i] * sg * (1.0f + inp[i] * (1.0f - sg));
    }
}

/* ---- resampling -------------------------------------------------------------- */

void ff_upsample_forward(float *out, const float *inp, int64_t images, int64_t h, int64_t w,
                         int64_t cl)
{
    for (int64_t i = 0; i < images; i++)
        for (int64_t y = 0; y < 2 * h; y++)
            for (int64_t x = 0; x < 2 * w; x++)
                memcpy(out + ((i * 2 * h + y) * 2 * w + x) * cl,
                       inp + ((i * h + y / 2) * w + x / 2) * cl, (size_t)cl * sizeof(float));
}

void ff_upsample_backward(float *dinp, const float *dout, int64_t images, int64_t h, int64_t w,
                          int64_t cl)
{
    for (int64_t i = 0; i < images; i++)
        for (int64_t y = 0; y < h; y++)
            for (int64_t x = 0; x < w; x++) {
                const float *a = dout + ((i * 2 * h + 2 * y) * 2 * w + 2 * x) * cl;
                const float *c = a + 2 * w * cl;
                float *d = dinp + ((i * h + y) * w + x) * cl;
                for (int64_t ch = 0; ch < cl; ch++)
                    d[ch] = a[ch] + a[cl + ch] + c[ch] + c[cl + ch];
            }
}

void ff_downsample_forward(float *out, const float *inp, int64_t images, int64_t h, int64_t w,
                           int64_t cl)
{
    const int64_t ho = h / 2, wo = w / 2;
    for (int64_t i = 0; i < images; i++)
        for (int64_t y = 0; y < ho; y++)
            for (int64_t x = 0; x < wo; x++) {
                const float *a = inp + ((i * h + 2 * y) * w + 2 * x) * cl;
                const float *c = a + w * cl;
                float *o = out + ((i * ho + y) * wo + x) * cl;
                for (int64_t ch = 0; ch < cl; ch++)
                    o[ch] = (a[ch] + a[cl + ch] + c[ch] + c[cl + ch]) * 0.25f;
            }
}

void ff_downsample_backward(float *dinp, const float *dout, int64_t images, int64_t h, int64_t w,
                            int64_t cl)
{
    const int64_t ho = h / 2, wo = w / 2;
    for (int64_t i = 0; i < images; i++)
        for (int64_t y = 0; y < h; y++)
            for (int64_t x = 0; x < w; x++) {
                const float *g = dout + ((i * ho + y / 2) * wo + x / 2) * cl;
                float *d = dinp + ((i * h + y) * w + x) * cl;
                for (int64_t ch = 0; ch < cl; ch++)
                    d[ch] = g[ch] * 0.25f;
            }
}
