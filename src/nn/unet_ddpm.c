/* The DDPM objective of the U-Net (Ho et al. 2020, "simple" loss):
 * x_t = sqrt(abar_t) x0 + sqrt(1 - abar_t) eps, the mean squared error of
 * the predicted noise (include/fourfold/unet.h, docs/unet.md "DDPM"). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "fourfold/rng.h"
#include "internal.h"
#include "unet_internal.h"

/* the RNG's streams of the objective (a layer's streams are 5100 + its
 * index, src/nn/unet.c) */
enum { STREAM_T = 0xDD01, STREAM_NOISE = 0xDD02, STREAM_SAMPLE = 0xDD03 };

void ff_ddpm_alpha_bar(const ff_unet_config *cfg, double *abar)
{
    const int T = cfg->timesteps;
    double a = 1.0;
    for (int i = 0; i < T; i++) {
        double beta;
        if (cfg->schedule == FF_SCHEDULE_COSINE) {
            /* Nichol and Dhariwal (improved DDPM, eq. 17), s = 0.008, betas
             * clipped at 0.999 */
            const double s = 0.008, h = acos(-1.0) / 2;
            double f0 = cos(((double)i / T + s) / (1 + s) * h),
                   f1 = cos(((double)(i + 1) / T + s) / (1 + s) * h);
            beta = 1.0 - (f1 * f1) / (f0 * f0);
            if (beta > 0.999)
                beta = 0.999;
        } else {
            beta = T > 1 ? cfg->beta_first + (cfg->beta_last - cfg->beta_first) * i / (T - 1)
                         : cfg->beta_first;
        }
        a *= 1.0 - beta;
        abar[i] = a;
    }
}

int ff_ddpm_draw(const ff_unet_config *cfg, uint64_t seed, int64_t step, int64_t batch, int64_t g,
                 float *noise)
{
    const uint64_t image = (uint64_t)(step * batch + g);
    int t = (int)(ff_rng_uniform(seed, STREAM_T, image) * cfg->timesteps);
    if (t >= cfg->timesteps)
        t = cfg->timesteps - 1;
    const int64_t per = cfg->image_size * cfg->image_size * cfg->img_channels;
    for (int64_t e = 0; e < per; e++)
        noise[e] = ff_rng_normal(seed, STREAM_NOISE, image * (uint64_t)per + (uint64_t)e);
    return t;
}

/* x_t of this rank's images x0 with the draws of `step` into acts[0].x
 * (its block of the padded channels, layout X) and their timesteps into
 * u->t; the noise into u->noise. */
static void noised(ff_unet *u, const float *x0, uint64_t seed, int64_t step)
{
    const ff_unet_config *cfg = &u->cfg;
    const int64_t n = u->images, hw = cfg->image_size * cfg->image_size, ci = cfg->img_channels;
    const int64_t pl = cfg->img_channels_pad / u->g.x, c0 = u->c.x * pl; /* layout X */
    float *xt = u->acts[0].x;
    memset(xt, 0, (size_t)(n * hw * pl) * sizeof(float));
    for (int64_t b = 0; b < n; b++) {
        float *eps = u->noise + b * hw * ci;
        u->t[b] = ff_ddpm_draw(cfg, seed, step, u->batch, u->first + b, eps);
        double sa = sqrt(u->abar[u->t[b]]), sb = sqrt(1.0 - u->abar[u->t[b]]);
        for (int64_t q = 0; q < hw; q++)
            for (int64_t j = 0; j < pl && c0 + j < ci; j++) {
                int64_t e = (b * hw + q) * ci + c0 + j;
                xt[(b * hw + q) * pl + j] = (float)(sa * x0[e] + sb * eps[e - b * hw * ci]);
            }
    }
}

/* The sum over this rank's values of (pred - eps)^2 (the data channels of
 * its layout-X block), and with grad its gradient 2 (pred - eps) / N into
 * u->dpred, N the batch's values. */
static double squared_error(ff_unet *u, int grad)
{
    const ff_unet_config *cfg = &u->cfg;
    const int64_t n = u->images, hw = cfg->image_size * cfg->image_size, ci = cfg->img_channels;
    const int64_t pl = cfg->img_channels_pad / u->g.x, c0 = u->c.x * pl;
    const double N = (double)u->batch * (double)(hw * ci);
    double sum = 0;
    if (grad)
        memset(u->dpred, 0, (size_t)(n * hw * pl) * sizeof(float));
    for (int64_t b = 0; b < n; b++)
        for (int64_t q = 0; q < hw; q++)
            for (int64_t j = 0; j < pl && c0 + j < ci; j++) {
                int64_t i = (b * hw + q) * pl + j;
                float d = u->pred[i] - u->noise[(b * hw + q) * ci + c0 + j];
                sum += (double)d * d;
                if (grad)
                    u->dpred[i] = (float)(2.0 * d / N);
            }
    return sum;
}

/* The batch's mean from each rank's sum: over X (the data channels'
 * blocks), then ZD (the images). */
static int mean_loss(ff_unet *u, double sum, float *loss)
{
    const double N =
        (double)u->batch * (double)(u->cfg.image_size * u->cfg.image_size * u->cfg.img_channels);
    float s = (float)sum;
    int rc = ff_allreduce(ff_grid_group(u->grid, FF_GROUP_X), &s, &s, 1, NULL);
    if (!rc)
        rc = ff_allreduce(ff_grid_group(u->grid, FF_GROUP_ZD), &s, &s, 1, NULL);
    *loss = (float)(s / N);
    return rc;
}

int ff_unet_ddpm_loss(ff_unet *u, const float *x0, uint64_t seed, int64_t step, float *loss)
{
    noised(u, x0, seed, step);
    int rc = ff_unet_forward_(u);
    if (rc)
        return rc;
    double sum = squared_error(u, 1);
    rc = ff_unet_backward_(u);
    return rc ? rc : mean_loss(u, sum, loss);
}

static int forward_program(ff_unet *u);

int ff_unet_ddpm_eval(ff_unet *u, const float *x0, uint64_t seed, int64_t step, float *loss)
{
    noised(u, x0, seed, step);
    int rc = forward_program(u);
    if (!rc)
        rc = ff_unet_forward_(u);
    if (!rc)
        rc = ff_linear_seq_end(u->seq);
    int rc2 = ff_linear_seq_program_standard(u->seq, 0);
    if (!rc)
        rc = rc2;
    return rc ? rc : mean_loss(u, squared_error(u, 0), loss);
}

void ff_ddpm_sample_noise(const ff_unet_config *cfg, uint64_t seed, int64_t g, int t, float *z)
{
    const uint64_t per = (uint64_t)(cfg->image_size * cfg->image_size * cfg->img_channels);
    const uint64_t at = ((uint64_t)g * (uint64_t)(cfg->timesteps + 1) + (uint64_t)t) * per;
    for (uint64_t e = 0; e < per; e++)
        z[e] = ff_rng_normal(seed, STREAM_SAMPLE, at + e);
}

/* improved DDPM's space_timesteps (Nichol and Dhariwal 2021, respace.py)
 * for one section: K of the T steps, t_k = round(k (T-1)/(K-1)) with the
 * stride added up in double and Python's rounding (half to even:
 * nearbyint in the default mode), so t_0 = 0 and t_{K-1} = T-1; and the
 * betas of the kept steps from their alpha_bar: beta_k = 1 - abar(t_k) /
 * abar(t_{k-1}), abar(t_{-1}) = 1 (beta NULL: not wanted). */
static int respace(const double *abar, int T, int K, int *t, double *beta)
{
    const double stride = K > 1 ? (double)(T - 1) / (double)(K - 1) : 1;
    double at = 0, prev = 1;
    for (int k = 0; k < K; k++, at += stride) {
        t[k] = (int)nearbyint(at);
        if (t[k] > T - 1 || (k && t[k] <= t[k - 1]))
            return FF_EINVAL; /* (not for 1 <= K <= T: the stride is at least 1) */
        if (beta)
            beta[k] = 1 - abar[t[k]] / prev;
        prev = abar[t[k]];
    }
    return FF_OK;
}

int ff_ddpm_respace(const ff_unet_config *cfg, int steps, int *t, double *beta)
{
    const int T = cfg->timesteps;
    if (T < 1 || steps < 1 || steps > T)
        return FF_EINVAL;
    double *abar = malloc((size_t)T * sizeof *abar);
    if (!abar)
        return FF_ENOMEM;
    ff_ddpm_alpha_bar(cfg, abar);
    int rc = respace(abar, T, steps, t, beta);
    free(abar);
    return rc;
}

/* the program of a forward-only run: every layer's forward, in order */
static int forward_program(ff_unet *u)
{
    int n = ff_linear_seq_count(u->seq);
    ff_linear_use *uses = malloc((size_t)n * sizeof *uses);
    if (!uses)
        return ff_set_error(u->ctx, FF_ENOMEM, "U-Net: out of memory");
    for (int i = 0; i < n; i++)
        uses[i] = (ff_linear_use){i, FF_USE_FORWARD};
    int rc = ff_linear_seq_set_program(u->seq, uses, n);
    free(uses);
    return rc;
}

int ff_unet_sample(ff_unet *u, uint64_t seed, int steps, ff_unet_sampler sampler, float *out)
{
    return ff_unet_sample_partial(u, seed, steps, sampler, 0, out, NULL);
}

/* One reverse step's coefficients from the kept steps' alpha_bar (improved
 * DDPM, Nichol and Dhariwal 2021, its gaussian_diffusion.py on the respaced
 * betas; Ho et al. 2020 eqs. 6-7 and 15 for the posterior q(x_{t-1} | x_t,
 * x_0)): abar the kept step's, prev its predecessor's (1 at the first),
 * beta = 1 - abar/prev the respaced beta. DDIM (Song et al. 2021, eq. 12
 * with sigma = 0; improved DDPM's ddim_sample, whose eps is x0^'s):
 * sqrt(prev) x0^ + sqrt(1 - prev) (rsa x_t - x0^)/rsb, the same form. */
typedef struct {
    double rsa, rsb; /* x0^ = rsa x_t - rsb eps: 1/sqrt(abar), sqrt(1/abar - 1) */
    double c1, c2;   /* the posterior mean c1 clip(x0^) + c2 x_t */
    double sigma;    /* sqrt of the posterior variance beta~ = beta (1 - prev)/(1 - abar) */
} reverse_coefs;

static reverse_coefs reverse_step_coefs(ff_unet_sampler sampler, double abar, double prev)
{
    reverse_coefs c = {1 / sqrt(abar), sqrt(1 / abar - 1), 0, 1, 0};
    const double alpha = abar / prev, beta = 1 - alpha;
    if (1 - abar > 0 && sampler == FF_UNET_DDIM) {
        c.c1 = sqrt(prev) - sqrt(1 - prev) / c.rsb;
        c.c2 = sqrt(1 - prev) * c.rsa / c.rsb;
    } else if (1 - abar > 0) { /* (abar = 1: no noise up to this step, which is then x_t itself) */
        c.c1 = beta * sqrt(prev) / (1 - abar);
        c.c2 = (1 - prev) * sqrt(alpha) / (1 - abar);
        c.sigma = sqrt(beta * (1 - prev) / (1 - abar));
    }
    return c;
}

/* (images, S, S, img_channels) with every channel, from this rank's layout-X
 * block (images, S, S, pad/Gx) of x: an all-gather over X when X splits */
static int gather_images(ff_unet *u, const float *x, float *out)
{
    const ff_unet_config *cfg = &u->cfg;
    const int64_t n = u->images, hw = cfg->image_size * cfg->image_size, ci = cfg->img_channels;
    const int64_t pl = cfg->img_channels_pad / u->g.x;
    const float *all = x;
    if (u->g.x > 1) {
        int rc = ff_allgather(ff_grid_group(u->grid, FF_GROUP_X), x, u->full, (size_t)(n * hw * pl),
                              NULL);
        if (rc)
            return rc;
        all = u->full;
    }
    for (int64_t b = 0; b < n; b++)
        for (int64_t q = 0; q < hw; q++)
            for (int64_t c = 0; c < ci; c++)
                out[(b * hw + q) * ci + c] =
                    all[(c / pl) * n * hw * pl + (b * hw + q) * pl + c % pl];
    return FF_OK;
}

int ff_unet_sample_partial(ff_unet *u, uint64_t seed, int steps, ff_unet_sampler sampler, int stop,
                           float *out, float *eps)
{
    const ff_unet_config *cfg = &u->cfg;
    const int T = cfg->timesteps;
    const int64_t n = u->images, hw = cfg->image_size * cfg->image_size, ci = cfg->img_channels;
    const int64_t pl = cfg->img_channels_pad / u->g.x, c0 = u->c.x * pl; /* layout X */
    if (steps < 1 || steps > T)
        return ff_set_error(
            u->ctx, FF_EINVAL,
            "sampling in %d steps: the U-Net has T = %d timesteps, so 1 .. %d steps", steps, T, T);
    if (stop < 0 || stop > steps)
        return ff_set_error(u->ctx, FF_EINVAL, "sampling stopped at step %d of 0 .. %d", stop,
                            steps);
    int *ts = malloc((size_t)steps * sizeof *ts);
    int rc = ts ? respace(u->abar, T, steps, ts, NULL)
                : ff_set_error(u->ctx, FF_ENOMEM, "U-Net: out of memory");
    float *x = u->acts[0].x; /* x_t, (n, S, S, pad/Gx), zero beyond the data's channels */
    memset(x, 0, (size_t)(n * hw * pl) * sizeof(float));
    for (int64_t b = 0; b < n && !rc; b++) {
        float *z = u->noise + b * hw * ci;
        ff_ddpm_sample_noise(cfg, seed, u->first + b, T, z);
        for (int64_t q = 0; q < hw; q++)
            for (int64_t j = 0; j < pl && c0 + j < ci; j++)
                x[(b * hw + q) * pl + j] = z[q * ci + c0 + j];
    }
    if (!rc)
        rc = forward_program(u);
    /* step i of the respaced process at the model's own timestep t = ts[i]
     * (improved DDPM's p_sample with clip_denoised and the fixed small
     * variance): x0^ from the predicted noise, clipped to the data's
     * [-1, 1], the posterior mean from it and x_t, and the posterior's
     * variance beta~; or DDIM's step, without noise (docs/unet.md,
     * "Sampling"). All in double, rounded once. */
    for (int i = steps - 1; i >= stop && !rc; i--) {
        const int t = ts[i];
        for (int64_t b = 0; b < n; b++)
            u->t[b] = t;
        rc = ff_unet_forward_(u);
        if (!rc)
            rc = ff_linear_seq_end(u->seq);
        const reverse_coefs k =
            reverse_step_coefs(sampler, u->abar[t], i ? u->abar[ts[i - 1]] : 1.0);
        for (int64_t b = 0; b < n && !rc; b++) {
            float *z = u->noise + b * hw * ci;
            if (k.sigma > 0)
                ff_ddpm_sample_noise(cfg, seed, u->first + b, t, z);
            for (int64_t q = 0; q < hw; q++)
                for (int64_t j = 0; j < pl && c0 + j < ci; j++) {
                    int64_t e = (b * hw + q) * pl + j;
                    double x0 = k.rsa * x[e] - k.rsb * u->pred[e];
                    x0 = x0 < -1 ? -1 : x0 > 1 ? 1 : x0;
                    double zv = k.sigma > 0 ? z[q * ci + c0 + j] : 0.0;
                    x[e] = (float)(k.c1 * x0 + k.c2 * x[e] + k.sigma * zv);
                }
        }
    }
    free(ts);
    int rc2 = ff_linear_seq_program_standard(u->seq, 0);
    if (!rc)
        rc = rc2;
    // every channel on every rank: gather the X blocks
    if (!rc)
        rc = gather_images(u, x, out);
    if (!rc && eps && stop < steps)
        rc = gather_images(u, u->pred, eps);
    return rc;
}
