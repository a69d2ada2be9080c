/* The U-Net's operations besides its convolutions (unet_ops.h). */
#include "unet_ops.h"

#include <math.h>
#include <string.h>

#include "internal.h"
#include "util/team.h"

/* Every pass runs on the context's team (util/team.h), each index on one
 * thread; sums run in an order fixed by the indices alone, so the bits do
 * not depend on the number of threads. */
#define TEAM(ctx) ((ctx) ? (ctx)->team : NULL)
enum { ELEM_GRAIN = 4096, PIXEL_GRAIN = 64 };

/* ---- GroupNorm ---------------------------------------------------------------
 * Per image, the rank's channels ch = 0..cl-1 are canonical channels c0 + ch,
 * of group (c0 + ch) / cg. Sums run over pixels in order per channel, then
 * over channels in order, in double, and are rounded to float once. */

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

typedef struct {
    const gn_shape *s;
    float *out, *dinp, *dw, *db, *sums, *sums2;
    const float *inp, *dout, *w, *b, *mean, *rstd;
} gn_job;

/* GN_BLOCK channels at a time, with each channel's statistics of one image
 * gathered first (the elementwise passes then vectorise over channels; a
 * group's index per element made them 10 % of the U-Net's step, issue 51).
 * The arithmetic of each element is unchanged, and so are its bits. */
enum { GN_BLOCK = 64 };

/* dst[n][ch] = src[n][k] for the channels [cb, cb + nc) of image i,
 * k = i*G + group of the channel, for the n arrays given */
static void gn_gather(const gn_shape *s, int64_t i, int64_t cb, int64_t nc, int n,
                      const float *const *src, float (*dst)[GN_BLOCK])
{
    for (int64_t ch = 0; ch < nc; ch++) {
        int64_t k = i * s->G + (s->c0 + cb + ch) / s->cg;
        for (int a = 0; a < n; a++)
            dst[a][ch] = src[a][k];
    }
}

/* Adds acc[0..nc) (the channels [cb, cb + nc) of image i) into the groups'
 * running sums in channel order: *g is the group being summed (-1: none
 * yet), *run its sum; a finished group goes to out[i*G + group]. */
static void gn_fold(const gn_shape *s, int64_t i, int64_t cb, int64_t nc, const double *acc,
                    int64_t *g, double *run, float *out)
{
    for (int64_t ch = 0; ch < nc; ch++) {
        int64_t gc = (s->c0 + cb + ch) / s->cg;
        if (gc != *g) {
            if (*g >= 0)
                out[i * s->G + *g] = (float)*run;
            *g = gc, *run = 0;
        }
        *run += acc[ch];
    }
}

/* per image: sums (images, G) of x over each group's values here, or of
 * (x - mean)^2 when j->mean is set: per channel over the pixels in order
 * (vectorised over channels), then over the group's channels in order */
static void gn_sums(void *arg, int64_t i0, int64_t i1, int th)
{
    (void)th;
    const gn_job *j = arg;
    const gn_shape *s = j->s;
    const float *stats[1] = {j->mean};
    float st[1][GN_BLOCK];
    double acc[GN_BLOCK];
    for (int64_t i = i0; i < i1; i++) {
        memset(j->sums + i * s->G, 0, (size_t)s->G * sizeof(float));
        int64_t g = -1;
        double run = 0;
        for (int64_t cb = 0; cb < s->cl; cb += GN_BLOCK) {
            const int64_t nc = s->cl - cb < GN_BLOCK ? s->cl - cb : GN_BLOCK;
            for (int64_t ch = 0; ch < nc; ch++)
                acc[ch] = 0;
            if (j->mean) {
                gn_gather(s, i, cb, nc, 1, stats, st);
                for (int64_t p = 0; p < s->hw; p++) {
                    const float *x = j->inp + (i * s->hw + p) * s->cl + cb;
                    for (int64_t ch = 0; ch < nc; ch++) {
                        double d = (double)(x[ch] - st[0][ch]);
                        acc[ch] += d * d;
                    }
                }
            } else {
                for (int64_t p = 0; p < s->hw; p++) {
                    const float *x = j->inp + (i * s->hw + p) * s->cl + cb;
                    for (int64_t ch = 0; ch < nc; ch++)
                        acc[ch] += x[ch];
                }
            }
            gn_fold(s, i, cb, nc, acc, &g, &run, j->sums);
        }
        if (g >= 0)
            j->sums[i * s->G + g] = (float)run;
    }
}

static void gn_normalize(void *arg, int64_t r0, int64_t r1, int th)
{
    (void)th;
    const gn_job *j = arg;
    const gn_shape *s = j->s;
    const float *stats[2] = {j->mean, j->rstd};
    float st[2][GN_BLOCK];
    for (int64_t cb = 0; cb < s->cl; cb += GN_BLOCK) {
        const int64_t nc = s->cl - cb < GN_BLOCK ? s->cl - cb : GN_BLOCK;
        const float *w = j->w + cb, *b = j->b + cb;
        for (int64_t r = r0, i = -1; r < r1; r++) {
            if (r / s->hw != i)
                gn_gather(s, i = r / s->hw, cb, nc, 2, stats, st);
            const float *x = j->inp + r * s->cl + cb;
            float *y = j->out + r * s->cl + cb;
            for (int64_t ch = 0; ch < nc; ch++)
                y[ch] = (x[ch] - st[0][ch]) * st[1][ch] * w[ch] + b[ch];
        }
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
    ff_team *team = TEAM(gs->ctx);
    const size_t ng = (size_t)(images * G);
    const float inv_n = 1.0f / (float)(hw * s.cg);
    int64_t g0, g1;
    gn_groups(&s, &g0, &g1);
    gn_job j = {.s = &s, .out = out, .sums = mean, .inp = inp, .w = w, .b = b};
    ff_team_run(team, images, 1, gn_sums, &j);
    if (s.spans && (rc = ff_allreduce(gs, mean, mean, ng, NULL)))
        return rc;
    for (size_t k = 0; k < ng; k++)
        mean[k] *= inv_n;
    j.sums = rstd, j.mean = mean;
    ff_team_run(team, images, 1, gn_sums, &j);
    if (s.spans && (rc = ff_allreduce(gs, rstd, rstd, ng, NULL)))
        return rc;
    for (int64_t i = 0; i < images; i++)
        for (int64_t g = 0; g < G; g++) {
            int here = g >= g0 && g < g1;
            rstd[i * G + g] = here ? 1.0f / sqrtf(rstd[i * G + g] * inv_n + eps) : 0.0f;
            if (!here)
                mean[i * G + g] = 0.0f;
        }
    j.rstd = rstd;
    ff_team_run(team, images * hw, PIXEL_GRAIN, gn_normalize, &j);
    return FF_OK;
}

/* per image and group: s1 = sum g, s2 = sum g xhat, g = dout w (per
 * channel over the pixels in order, then over the group's channels) */
static void gn_back_sums(void *arg, int64_t i0, int64_t i1, int th)
{
    (void)th;
    const gn_job *j = arg;
    const gn_shape *s = j->s;
    const float *stats[2] = {j->mean, j->rstd};
    float st[2][GN_BLOCK];
    double a1[GN_BLOCK], a2[GN_BLOCK];
    for (int64_t i = i0; i < i1; i++) {
        memset(j->sums + i * s->G, 0, (size_t)s->G * sizeof(float));
        memset(j->sums2 + i * s->G, 0, (size_t)s->G * sizeof(float));
        int64_t g1 = -1, g2 = -1;
        double run1 = 0, run2 = 0;
        for (int64_t cb = 0; cb < s->cl; cb += GN_BLOCK) {
            const int64_t nc = s->cl - cb < GN_BLOCK ? s->cl - cb : GN_BLOCK;
            const float *w = j->w + cb;
            for (int64_t ch = 0; ch < nc; ch++)
                a1[ch] = a2[ch] = 0;
            gn_gather(s, i, cb, nc, 2, stats, st);
            for (int64_t p = 0; p < s->hw; p++) {
                const int64_t e = (i * s->hw + p) * s->cl + cb;
                const float *x = j->inp + e, *dy = j->dout + e;
                for (int64_t ch = 0; ch < nc; ch++) {
                    float xhat = (x[ch] - st[0][ch]) * st[1][ch], gr = dy[ch] * w[ch];
                    a1[ch] += gr;
                    a2[ch] += (double)gr * xhat;
                }
            }
            gn_fold(s, i, cb, nc, a1, &g1, &run1, j->sums);
            gn_fold(s, i, cb, nc, a2, &g2, &run2, j->sums2);
        }
        if (g1 >= 0)
            j->sums[i * s->G + g1] = (float)run1, j->sums2[i * s->G + g2] = (float)run2;
    }
}

/* per channel: dw += sum dout xhat, db += sum dout, over images and pixels
 * in order (a block of channels at a time, reading rows) */
static void gn_back_params(void *arg, int64_t c0, int64_t c1, int th)
{
    (void)th;
    const gn_job *j = arg;
    const gn_shape *s = j->s;
    const float *stats[2] = {j->mean, j->rstd};
    float st[2][GN_BLOCK];
    double aw[GN_BLOCK], ab[GN_BLOCK];
    for (int64_t cb = c0; cb < c1; cb += GN_BLOCK) {
        const int64_t nc = c1 - cb < GN_BLOCK ? c1 - cb : GN_BLOCK;
        for (int64_t ch = 0; ch < nc; ch++)
            aw[ch] = ab[ch] = 0;
        for (int64_t i = 0; i < s->images; i++) {
            gn_gather(s, i, cb, nc, 2, stats, st);
            for (int64_t p = 0; p < s->hw; p++) {
                const int64_t e = (i * s->hw + p) * s->cl + cb;
                const float *x = j->inp + e, *dy = j->dout + e;
                for (int64_t ch = 0; ch < nc; ch++) {
                    float xhat = (x[ch] - st[0][ch]) * st[1][ch];
                    aw[ch] += (double)dy[ch] * xhat;
                    ab[ch] += dy[ch];
                }
            }
        }
        for (int64_t ch = 0; ch < nc; ch++) {
            j->dw[cb + ch] += (float)aw[ch];
            j->db[cb + ch] += (float)ab[ch];
        }
    }
}

static void gn_back_input(void *arg, int64_t r0, int64_t r1, int th)
{
    (void)th;
    const gn_job *j = arg;
    const gn_shape *s = j->s;
    const float inv_n = 1.0f / (float)(s->hw * s->cg);
    const float *stats[4] = {j->mean, j->rstd, j->sums, j->sums2};
    float st[4][GN_BLOCK];
    for (int64_t cb = 0; cb < s->cl; cb += GN_BLOCK) {
        const int64_t nc = s->cl - cb < GN_BLOCK ? s->cl - cb : GN_BLOCK;
        const float *w = j->w + cb;
        for (int64_t r = r0, i = -1; r < r1; r++) {
            if (r / s->hw != i)
                gn_gather(s, i = r / s->hw, cb, nc, 4, stats, st);
            const int64_t e = r * s->cl + cb;
            const float *x = j->inp + e, *dy = j->dout + e;
            float *dx = j->dinp + e;
            for (int64_t ch = 0; ch < nc; ch++) {
                float xhat = (x[ch] - st[0][ch]) * st[1][ch];
                dx[ch] +=
                    st[1][ch] * (dy[ch] * w[ch] - st[2][ch] * inv_n - xhat * st[3][ch] * inv_n);
            }
        }
    }
}

int ff_gn_backward(ff_group *gs, float *dinp, float *dw, float *db, const float *dout,
                   const float *inp, const float *w, const float *mean, const float *rstd,
                   int64_t images, int64_t hw, int64_t cl, int64_t C, int G, float *scratch)
{
    gn_shape s = {0};
    int rc = gn_shape_of(gs, &s, images, hw, cl, C, G);
    if (rc)
        return rc;
    ff_team *team = TEAM(gs->ctx);
    gn_job j = {.s = &s,
                .dinp = dinp,
                .dw = dw,
                .db = db,
                .sums = scratch,
                .sums2 = scratch + images * G,
                .inp = inp,
                .dout = dout,
                .w = w,
                .mean = mean,
                .rstd = rstd};
    ff_team_run(team, images, 1, gn_back_sums, &j);
    if (s.spans && (rc = ff_allreduce(gs, scratch, scratch, (size_t)(2 * images * G), NULL)))
        return rc;
    ff_team_run(team, cl, 1, gn_back_params, &j);
    if (dinp)
        ff_team_run(team, images * hw, PIXEL_GRAIN, gn_back_input, &j);
    return FF_OK;
}

/* ---- SiLU ------------------------------------------------------------------ */

typedef struct {
    float *dst;
    const float *src, *dout;
    int64_t h, w, cl;
    float scale;
} elem_job;

/* e^t in a form the compiler vectorises (libm's expf is a call per element,
 * which made SiLU's passes 11 % of the U-Net's step, issue 51). t = n ln2 + r,
 * |r| <= ln2/2, with ln2 in two parts (n ln2_hi and t - n ln2_hi exact); e^r
 * by its Taylor polynomial of degree 7 (truncation r^8/8! < 0.1 u) in
 * Horner's form; e^t = e^r 2^(n-1) 2, exact scalings (the result is normal
 * or overflows). Relative error at most 3 u (u = 2^-24: 0.4 u from the
 * reduction, 2.5 u from Horner's roundings with the polynomial in
 * [0.70, 1.42]), against libm's 1 u: SiLU's bound (docs/testing.md, "exp,
 * an addition, a division" within gamma_8) holds. Below -86 it returns 0,
 * where 1 + e^t rounds to 1 (e^t < 2^-124), the only use here; above
 * ln(FLT_MAX) infinity, as expf; NaN gives NaN. No contraction (ISO C
 * mode): the vector and scalar loops give the same bits, so the result
 * does not depend on where a thread's range starts. */
static inline float exp_silu(float t)
{
    const float hi = 88.72283f, lo = -86.0f, shift = 12582912.0f; /* 1.5 * 2^23 */
    float tc = t > hi ? hi : t < lo ? lo : t;
    float z = tc * 1.44269504f + shift; /* round(tc / ln2) in its low bits */
    float n = z - shift;
    int32_t zi;
    memcpy(&zi, &z, sizeof zi);
    int32_t bits = (zi - 0x4B400000 - 1 + 127) << 23; /* 2^(n-1), n-1 in [-125, 127] */
    float scale;
    memcpy(&scale, &bits, sizeof scale);
    float r = (tc - n * 0.693359375f) - n * -2.12194440e-4f;
    float p = 1.0f / 5040;
    p = p * r + 1.0f / 720;
    p = p * r + 1.0f / 120;
    p = p * r + 1.0f / 24;
    p = p * r + 1.0f / 6;
    p = p * r + 0.5f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    float e = p * scale * 2.0f;
    return t > hi ? INFINITY : t < lo ? 0.0f : e;
}

static void silu_fwd(void *arg, int64_t i0, int64_t i1, int th)
{
    (void)th;
    const elem_job *j = arg;
    const float *x = j->src;
    float *y = j->dst;
    for (int64_t i = i0; i < i1; i++)
        y[i] = x[i] / (1.0f + exp_silu(-x[i]));
}

static void silu_bwd(void *arg, int64_t i0, int64_t i1, int th)
{
    (void)th;
    const elem_job *j = arg;
    const float *x = j->src, *dy = j->dout;
    float *dx = j->dst;
    for (int64_t i = i0; i < i1; i++) {
        float sg = 1.0f / (1.0f + exp_silu(-x[i]));
        dx[i] = dy[i] * sg * (1.0f + x[i] * (1.0f - sg));
    }
}

void ff_silu_forward(ff_ctx *ctx, float *out, const float *inp, int64_t n)
{
    elem_job j = {out, inp, NULL, 0, 0, 0, 1.0f};
    ff_team_run(TEAM(ctx), n, ELEM_GRAIN, silu_fwd, &j);
}

void ff_silu_backward(ff_ctx *ctx, float *dinp, const float *dout, const float *inp, int64_t n)
{
    elem_job j = {dinp, inp, dout, 0, 0, 0, 1.0f};
    ff_team_run(TEAM(ctx), n, ELEM_GRAIN, silu_bwd, &j);
}

/* ---- resampling --------------------------------------------------------------
 * Indices are pixels of the larger image (h, w the smaller one's sizes). */

static void up_fwd(void *arg, int64_t p0, int64_t p1, int th)
{
    (void)th;
    const elem_job *j = arg;
    const int64_t h = j->h, w = j->w, cl = j->cl;
    for (int64_t p = p0; p < p1; p++) {
        int64_t i = p / (4 * h * w), y = p / (2 * w) % (2 * h), x = p % (2 * w);
        memcpy(j->dst + p * cl, j->src + ((i * h + y / 2) * w + x / 2) * cl,
               (size_t)cl * sizeof(float));
    }
}

/* out pixel p = (sum of the 2x2 block of src at it, row-major) * scale:
 * the up-sampling's gradient (scale 1, exact) and the down-sampling */
static void sum_blocks(void *arg, int64_t p0, int64_t p1, int th)
{
    (void)th;
    const elem_job *j = arg;
    const int64_t h = j->h, w = j->w, cl = j->cl;
    for (int64_t p = p0; p < p1; p++) {
        int64_t i = p / (h * w), y = p / w % h, x = p % w;
        const float *a = j->src + ((i * 2 * h + 2 * y) * 2 * w + 2 * x) * cl;
        const float *c = a + 2 * w * cl;
        float *o = j->dst + p * cl;
        for (int64_t ch = 0; ch < cl; ch++)
            o[ch] = (a[ch] + a[cl + ch] + c[ch] + c[cl + ch]) * j->scale;
    }
}

static void down_bwd(void *arg, int64_t p0, int64_t p1, int th)
{
    (void)th;
    const elem_job *j = arg;
    const int64_t h = j->h, w = j->w, cl = j->cl;
    for (int64_t p = p0; p < p1; p++) {
        int64_t i = p / (4 * h * w), y = p / (2 * w) % (2 * h), x = p % (2 * w);
        const float *g = j->src + ((i * h + y / 2) * w + x / 2) * cl;
        float *d = j->dst + p * cl;
        for (int64_t ch = 0; ch < cl; ch++)
            d[ch] = g[ch] * j->scale;
    }
}

void ff_upsample_forward(ff_ctx *ctx, float *out, const float *inp, int64_t images, int64_t h,
                         int64_t w, int64_t cl)
{
    elem_job j = {out, inp, NULL, h, w, cl, 1.0f};
    ff_team_run(TEAM(ctx), images * 4 * h * w, PIXEL_GRAIN, up_fwd, &j);
}

void ff_upsample_backward(ff_ctx *ctx, float *dinp, const float *dout, int64_t images, int64_t h,
                          int64_t w, int64_t cl)
{
    elem_job j = {dinp, dout, NULL, h, w, cl, 1.0f};
    ff_team_run(TEAM(ctx), images * h * w, PIXEL_GRAIN, sum_blocks, &j);
}

void ff_downsample_forward(ff_ctx *ctx, float *out, const float *inp, int64_t images, int64_t h,
                           int64_t w, int64_t cl)
{
    elem_job j = {out, inp, NULL, h / 2, w / 2, cl, 0.25f};
    ff_team_run(TEAM(ctx), images * (h / 2) * (w / 2), PIXEL_GRAIN, sum_blocks, &j);
}

void ff_downsample_backward(ff_ctx *ctx, float *dinp, const float *dout, int64_t images, int64_t h,
                            int64_t w, int64_t cl)
{
    elem_job j = {dinp, dout, NULL, h / 2, w / 2, cl, 0.25f};
    ff_team_run(TEAM(ctx), images * h * w, PIXEL_GRAIN, down_bwd, &j);
}
