/* The DDPM objective of the U-Net (Ho et al. 2020, "simple" loss):
 * x_t = sqrt(abar_t) x0 + sqrt(1 - abar_t) eps, the mean squared error of
 * the predicted noise (include/fourfold/unet.h, docs/unet.md "DDPM"). */
#include <math.h>
#include <string.h>

#include "fourfold/rng.h"
#include "internal.h"
#include "unet_internal.h"

/* the RNG's streams of the objective (a layer's streams are 5100 + its
 * index, src/nn/unet.c) */
enum { STREAM_T = 0xDD01, STREAM_NOISE = 0xDD02 };

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

int ff_unet_ddpm_loss(ff_unet *u, const float *x0, uint64_t seed, int64_t step, float *loss)
{
    const ff_unet_config *cfg = &u->cfg;
    const int64_t n = u->images, S = cfg->image_size, hw = S * S, ci = cfg->img_channels;
    const int64_t pl = cfg->img_channels_pad / u->g.x, c0 = u->c.x * pl; /* layout X */
    const double *abar = u->abar;
    // x_t (n, S, S, pad/Gx): this rank's block of the padded channels
    float *xt = u->acts[0].x;
    memset(xt, 0, (size_t)(n * hw * pl) * sizeof(float));
    for (int64_t b = 0; b < n; b++) {
        float *eps = u->noise + b * hw * ci;
        u->t[b] = ff_ddpm_draw(cfg, seed, step, u->batch, u->first + b, eps);
        double sa = sqrt(abar[u->t[b]]), sb = sqrt(1.0 - abar[u->t[b]]);
        for (int64_t q = 0; q < hw; q++)
            for (int64_t j = 0; j < pl && c0 + j < ci; j++) {
                int64_t e = (b * hw + q) * ci + c0 + j;
                xt[(b * hw + q) * pl + j] = (float)(sa * x0[e] + sb * eps[e - b * hw * ci]);
            }
    }
    int rc = ff_unet_forward_(u);
    if (rc)
        return rc;
    // the mean over the batch's B*S*S*ci values of (pred - eps)^2 and its gradient
    const double N = (double)u->batch * (double)(hw * ci);
    double sum = 0;
    memset(u->dpred, 0, (size_t)(n * hw * pl) * sizeof(float));
    for (int64_t b = 0; b < n; b++)
        for (int64_t q = 0; q < hw; q++)
            for (int64_t j = 0; j < pl && c0 + j < ci; j++) {
                int64_t i = (b * hw + q) * pl + j;
                float d = u->pred[i] - u->noise[(b * hw + q) * ci + c0 + j];
                sum += (double)d * d;
                u->dpred[i] = (float)(2.0 * d / N);
            }
    rc = ff_unet_backward_(u);
    float s = (float)sum;
    if (!rc)
        rc = ff_allreduce(ff_grid_group(u->grid, FF_GROUP_X), &s, &s, 1, NULL);
    if (!rc)
        rc = ff_allreduce(ff_grid_group(u->grid, FF_GROUP_ZD), &s, &s, 1, NULL);
    *loss = (float)(s / N);
    return rc;
}
