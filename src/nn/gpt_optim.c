/* The GPT's optimizer side: the global gradient norm, AdamW on the local
 * shards, the learning-rate schedule, a whole training step and evaluation. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "gpt_internal.h"

void ff_adamw_default(ff_adamw *h)
{
    h->lr = 3e-4f;
    h->min_lr_frac = 0.1f;
    h->warmup = 0;
    h->steps = 1;
    h->beta1 = 0.9f;
    h->beta2 = 0.95f;
    h->eps = 1e-8f;
    h->weight_decay = 0.1f;
    h->clip = 1.0f;
}

float ff_adamw_lr(const ff_adamw *h, int step)
{
    if (step < h->warmup)
        return h->lr * (float)(step + 1) / (float)h->warmup;
    int span = h->steps - h->warmup;
    double ratio = (double)(step - h->warmup) / (double)(span > 1 ? span : 1);
    if (ratio > 1)
        ratio = 1;
    double coeff = 0.5 * (1.0 + cos(3.14159265358979323846 * ratio));
    double min_lr = (double)h->lr * h->min_lr_frac;
    return (float)(min_lr + coeff * ((double)h->lr - min_lr));
}

static double sumsq(const float *p, size_t n)
{
    double s = 0;
    for (size_t i = 0; i < n; i++)
        s += (double)p[i] * p[i];
    return s;
}

int ff_gpt_grad_norm(ff_gpt *g, float *norm)
{
    /* each parameter once: a weight element lives on one (x, y, z) of each
     * D replica; layout-Y parameters are replicated over X and Z, layout-X
     * ones over Y and Z. Only d = 0 (and x = 0 or y = 0, z = 0) count. */
    double s = 0;
    if (g->me.d == 0) {
        s += sumsq(g->grads, g->n_zsharded);
        if (g->me.z == 0 && g->me.x == 0)
            s += sumsq(g->grads + g->n_zsharded, g->n_ytype - g->n_zsharded);
        if (g->me.z == 0 && g->me.y == 0)
            s += sumsq(g->grads + g->n_ytype, g->n_params - g->n_ytype);
    }
    float f = (float)s;
    int rc = ff_allreduce(g->grp_world, &f, &f, 1, NULL);
    *norm = sqrtf(f);
    return rc;
}

int ff_gpt_adam_ensure(ff_gpt *g)
{
    if (g->adam_m)
        return FF_OK;
    g->adam_m = calloc(g->n_params ? g->n_params : 1, sizeof(float));
    g->adam_v = calloc(g->n_params ? g->n_params : 1, sizeof(float));
    if (!g->adam_m || !g->adam_v) {
        free(g->adam_m), free(g->adam_v);
        g->adam_m = g->adam_v = NULL;
        return ff_set_error(g->ctx, FF_ENOMEM, "out of memory for AdamW's moments");
    }
    return FF_OK;
}

int ff_gpt_adamw_update(ff_gpt *g, const ff_adamw *h, int step, float grad_scale)
{
    int rc = ff_gpt_adam_ensure(g);
    if (rc)
        return rc;
    const float lr = ff_adamw_lr(h, step);
    const float b1 = h->beta1, b2 = h->beta2;
    const float bc1 = 1.0f - powf(b1, (float)(step + 1)), bc2 = 1.0f - powf(b2, (float)(step + 1));
    float *p = g->params, *m = g->adam_m, *v = g->adam_v;
    const float *gr = g->grads;
    /* decoupled weight decay on the 2-D weights only: [0, n_decay) */
    for (size_t i = 0; i < g->n_params; i++) {
        float grad = gr[i] * grad_scale;
        m[i] = b1 * m[i] + (1.0f - b1) * grad;
        v[i] = b2 * v[i] + (1.0f - b2) * grad * grad;
        float mhat = m[i] / bc1, vhat = v[i] / bc2;
        float decay = i < g->n_decay ? h->weight_decay : 0.0f;
        p[i] -= lr * (mhat / (sqrtf(vhat) + h->eps) + decay * p[i]);
    }
    return FF_OK;
}

int ff_gpt_step(ff_gpt *g, const int32_t *tokens, const int32_t *targets, int n_micro,
                const ff_adamw *h, int step, ff_gpt_step_info *info)
{
    return ff_gpt_step_agreed(g, FF_OK, tokens, targets, n_micro, h, step, info);
}

int ff_gpt_step_agreed(ff_gpt *g, int local_rc, const int32_t *tokens, const int32_t *targets,
                       int n_micro, const ff_adamw *h, int step, ff_gpt_step_info *info)
{
    const int64_t per = g->m;
    if (local_rc == FF_OK && n_micro <= 0)
        local_rc = ff_set_error(g->ctx, FF_EINVAL, "%d micro-batches in a step", n_micro);
    if (local_rc == FF_OK)
        local_rc = ff_gpt_tokens_local(g, tokens, targets, n_micro * per);
    int rc = ff_gpt_zero_grad(g);                  /* (waits for the last step's collectives) */
    rc = ff_ctx_agree(g->ctx, rc ? rc : local_rc); /* the step's one agreement */
    for (int u = 0; u < n_micro && rc == FF_OK; u++)
        rc = ff_gpt_forward_backward_agreed(g, tokens + u * per, targets + u * per, u, n_micro);
    float loss = 0, norm = 0;
    if (rc == FF_OK)
        rc = ff_gpt_finish_grads(g, &loss);
    if (rc == FF_OK)
        rc = ff_gpt_grad_norm(g, &norm);
    if (rc)
        return rc;
    if (info) {
        info->loss = loss;
        info->grad_norm = norm;
        info->lr = ff_adamw_lr(h, step);
    }
    /* the loss and the norm are the same on every rank: so is this outcome */
    if (!isfinite(loss) || !isfinite(norm))
        return ff_set_error(g->ctx, FF_ENUMERIC,
                            "step %d: the %s is %s; parameters left as they were", step + 1,
                            isfinite(loss) ? "gradient norm" : "loss",
                            isnan(isfinite(loss) ? norm : loss) ? "NaN" : "infinite");
    /* clipping as torch.nn.utils.clip_grad_norm_ computes it */
    float scale = 1.0f;
    if (h->clip > 0) {
        float coef = h->clip / (norm + 1e-6f);
        if (coef < 1.0f)
            scale = coef;
    }
    return ff_gpt_adamw_update(g, h, step, scale);
}

int ff_gpt_eval(ff_gpt *g, const int32_t *tokens, const int32_t *targets, float *loss)
{
    int rc;
    if ((rc = ff_gpt_check_tokens(g, tokens, targets)) ||
        (rc = ff_gpt_run_forward(g, tokens, targets)))
        return rc;
    double s = 0;
    for (int64_t i = 0; i < g->m; i++)
        s += g->losses[i];
    float f = (float)s;
    if ((rc = ff_allreduce(g->grp_zd, &f, &f, 1, NULL)))
        return rc;
    *loss = f / ((float)g->B * (float)g->T);
    return FF_OK;
}

const float *ff_gpt_logits(const ff_gpt *g, int64_t *rows, int64_t *cols)
{
    *rows = g->m;
    *cols = g->vx;
    return g->logits;
}
