/* The U-Net's optimizer side: the global gradient norm and AdamW on the
 * local shards, with the GPT's per-element update and schedule (passes.h,
 * gpt_optim.c): one AdamW, two models. */
#include <math.h>
#include <stdlib.h>

#include "internal.h"
#include "passes.h"
#include "unet_internal.h"

static void sumsq(const float *a, size_t n, double *s)
{
    for (size_t i = 0; i < n; i++)
        *s += (double)a[i] * a[i];
}

int ff_unet_grad_norm(ff_unet *u, float *norm)
{
    const ff_dims c = u->c;
    double s = 0;
    for (int l = 0; l < u->nlayers; l++) {
        const unet_layer *L = &u->layers[l];
        if (c.d == 0)
            sumsq(u->grads + L->off_w, L->nw, &s);
        /* the bias slice b_c: replicated over Z, D and the group R */
        if (c.d == 0 && c.z == 0 && (L->kind == FF_LINEAR_N ? c.y : c.x) == 0)
            sumsq(u->grads + L->off_b, L->nb, &s);
    }
    for (int i = 0; i < u->ngn; i++) {
        const unet_gn *n = &u->gns[i];
        if (c.d == 0 && c.z == 0 && (n->layout_x ? c.y : c.x) == 0)
            sumsq(u->grads + n->off, 2 * (size_t)n->cl, &s);
    }
    float f = (float)s;
    int rc = ff_allreduce(ff_grid_group(u->grid, FF_GROUP_WORLD), &f, &f, 1, NULL);
    *norm = sqrtf(f);
    return rc;
}

static void adamw_range(ff_unet *u, size_t a, size_t n, const adamw_job *j, float decay)
{
    for (size_t i = a; i < a + n; i++)
        ff_adamw_at(&u->params[i], &u->adam_m[i], &u->adam_v[i], u->grads[i] * j->grad_scale, j->b1,
                    j->b2, j->bc1, j->bc2, j->lr, j->eps, decay);
}

int ff_unet_step(ff_unet *u, const float *x0, uint64_t seed, int step, const ff_adamw *h,
                 ff_unet_step_info *info)
{
    int rc = ff_unet_alloc_moments(u);
    float loss = 0, norm = 0;
    ff_unet_zero_grads(u);
    if (!rc)
        rc = ff_unet_ddpm_loss(u, x0, seed, step, &loss);
    if (!rc)
        rc = ff_unet_allreduce_grads(u);
    if (!rc)
        rc = ff_unet_grad_norm(u, &norm);
    if (rc)
        return rc;
    if (info)
        info->loss = loss, info->grad_norm = norm, info->lr = ff_adamw_lr(h, step);
    if (!isfinite(loss) || !isfinite(norm))
        return ff_set_error(u->ctx, FF_ENUMERIC,
                            "step %d: the %s is not finite; parameters left as they were", step + 1,
                            isfinite(loss) ? "gradient norm" : "loss");
    float scale = 1.0f; /* clipping as torch.nn.utils.clip_grad_norm_ */
    if (h->clip > 0 && h->clip / (norm + 1e-6f) < 1.0f)
        scale = h->clip / (norm + 1e-6f);
    adamw_job j = {.lr = ff_adamw_lr(h, step),
                   .b1 = h->beta1,
                   .b2 = h->beta2,
                   .bc1 = 1.0f - powf(h->beta1, (float)(step + 1)),
                   .bc2 = 1.0f - powf(h->beta2, (float)(step + 1)),
                   .eps = h->eps,
                   .wd = h->weight_decay,
                   .grad_scale = scale};
    for (int l = 0; l < u->nlayers; l++) {
        const unet_layer *L = &u->layers[l];
        adamw_range(u, L->off_w, L->nw, &j, j.wd);
        adamw_range(u, L->off_b, L->nb, &j, 0.0f);
    }
    for (int i = 0; i < u->ngn; i++)
        adamw_range(u, u->gns[i].off, 2 * (size_t)u->gns[i].cl, &j, 0.0f);
    return FF_OK;
}
