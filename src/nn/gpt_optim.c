/* The GPT's optimizer side: the global gradient norm, AdamW on the local
 * shards, the learning-rate schedule, a whole training step and evaluation. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "device.h"
#include "gpt_internal.h"
#include "gpt_ops.h"
#include "passes.h"
#include "util/team.h"

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

/* Sums of squares in blocks of FF_SUM_BLOCK elements (double, in order),
 * the blocks' sums added in order: the same bits for any number of threads. */
static void sumsq_blocks(void *arg, int64_t b0, int64_t b1, int th)
{
    (void)th;
    for (int64_t b = b0; b < b1; b++)
        ff_sumsq_block_at(arg, b);
}

static void sumsq(ff_gpt *g, const float *p, size_t n, double *out)
{
    int64_t nb = (int64_t)((n + FF_SUM_BLOCK - 1) / FF_SUM_BLOCK);
    sumsq_job j = {p, n, g->norm_part}; /* room for every block of the flat buffer */
    if (!ff_dev_pass(g->ctx, FF_PASS_SUMSQ, nb, &j))
        ff_team_run(g->ctx->team, nb, 1, sumsq_blocks, &j);
    for (int64_t b = 0; b < nb; b++)
        *out += j.part[b];
}

/* The gradients at offsets [a, b): Z-sharded weights (compressed under
 * SAMO), or the rest. */
static void zsumsq(ff_gpt *g, size_t a, size_t b, double *out)
{
    if (g->samo)
        ff_gpt_samo_sumsq(g, a, b, out);
    else
        sumsq(g, g->grads + a, b - a, out);
}

static void rsumsq(ff_gpt *g, size_t a, size_t b, double *out)
{
    sumsq(g, ff_gpt_rest(g, g->grads, a), b - a, out);
}

int ff_gpt_grad_norm(ff_gpt *g, float *norm)
{
    /* each parameter once: a weight element lives on one (x, y, z) of each
     * D replica (an expert's, of each replica of its slot); layout-Y parameters are replicated over
     * X and Z, layout-X ones over Y and Z. Only d = 0 (and x = 0 or y = 0, z = 0) count. */
    double s = 0;
    /* the tied embedding's second copy (the last of several stages) does not count */
    size_t skip = g->P > 1 && g->last && !g->first ? ff_linear_local_sizes(g->wte).w_shard : 0;
    /* the experts' shards (with expert parallelism each slot's): the first
     * replica, d = the slot */
    int zrc = FF_OK; /* ZeRO: the Z-sharded parts from the slices, in the same order */
    if (g->zr && ((zrc = ff_gpt_zero_sumsq(g, 1, &s)) || (zrc = ff_gpt_zero_sumsq(g, 0, &s))))
        return zrc;
    if (!g->zr && g->me.d == g->eslot && g->n_zsharded > g->n_dense_z)
        zsumsq(g, g->n_dense_z, g->n_zsharded, &s);
    if (g->me.d == 0) {
        if (!g->zr)
            zsumsq(g, skip, g->n_dense_z, &s);
        if (g->me.z == 0 && g->me.x == 0)
            rsumsq(g, g->n_zsharded, g->n_ytype, &s);
        if (g->me.z == 0 && g->me.y == 0)
            rsumsq(g, g->n_ytype, g->n_eby, &s);
    }
    if (g->me.d == g->eslot && g->me.z == 0) { /* the experts' biases */
        if (g->me.x == 0)
            rsumsq(g, g->n_eby, g->n_ebx, &s);
        if (g->me.y == 0)
            rsumsq(g, g->n_ebx, g->n_params, &s);
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
    const size_t n = ff_gpt_moment_state(g), k = g->samo ? ff_gpt_samo_state(g) : 0;
    g->adam_m = ff_fbuf_alloc(g->ctx, n);
    g->adam_v = ff_fbuf_alloc(g->ctx, n);
    if (g->samo) {
        g->samo_m = ff_fbuf_alloc(g->ctx, k);
        g->samo_v = ff_fbuf_alloc(g->ctx, k);
    }
    if (!g->adam_m || !g->adam_v || (g->samo && (!g->samo_m || !g->samo_v))) {
        ff_fbuf_free(g->adam_m), ff_fbuf_free(g->adam_v);
        ff_fbuf_free(g->samo_m), ff_fbuf_free(g->samo_v);
        g->adam_m = g->adam_v = g->samo_m = g->samo_v = NULL;
        return ff_set_error(g->ctx, FF_ENOMEM, "out of memory for AdamW's moments");
    }
    /* zeroed by the team (ff_fbuf_alloc's pages are zero already, but
     * each thread then first touches the pages it updates) */
    ff_zero(g->ctx, g->adam_m, (int64_t)n);
    ff_zero(g->ctx, g->adam_v, (int64_t)n);
    if (g->samo) {
        ff_zero(g->ctx, g->samo_m, (int64_t)k);
        ff_zero(g->ctx, g->samo_v, (int64_t)k);
    }
    return FF_OK;
}

static void adamw_range(void *arg, int64_t i0, int64_t i1, int th)
{
    (void)th;
    const adamw_job *j = arg;
    /* locals and restrict: the loop vectorizes (with the fields read
     * through j, every store could alias them and it stays scalar) */
    float *restrict p = j->p, *restrict m = j->m, *restrict v = j->v;
    const float *restrict gr = j->gr;
    const float b1 = j->b1, b2 = j->b2, bc1 = j->bc1, bc2 = j->bc2, lr = j->lr, eps = j->eps;
    const float scale = j->grad_scale;
    /* decoupled weight decay on the 2-D weights only: [0, n_decay) */
    const int64_t split = (int64_t)j->n_decay;
    for (int part = 0; part < 2; part++) {
        const int64_t a = part ? (i0 > split ? i0 : split) : i0;
        const int64_t b = part ? i1 : (i1 < split ? i1 : split);
        const float decay = part ? 0.0f : j->wd;
        for (int64_t i = a; i < b; i++)
            ff_adamw_at(&p[i], &m[i], &v[i], gr[i] * scale, b1, b2, bc1, bc2, lr, eps, decay);
    }
}

int ff_gpt_adamw_update(ff_gpt *g, const ff_adamw *h, int step, float grad_scale)
{
    int rc = ff_gpt_adam_ensure(g);
    if (rc)
        return rc;
    adamw_job j = {.p = g->params,
                   .m = g->adam_m,
                   .v = g->adam_v,
                   .gr = g->grads,
                   .lr = ff_adamw_lr(h, step),
                   .b1 = h->beta1,
                   .b2 = h->beta2,
                   .bc1 = 1.0f - powf(h->beta1, (float)(step + 1)),
                   .bc2 = 1.0f - powf(h->beta2, (float)(step + 1)),
                   .eps = h->eps,
                   .wd = h->weight_decay,
                   .grad_scale = grad_scale,
                   .n_decay = g->n_decay};
    if (g->zr) { /* (bf16-mixed: it makes the copy of the gathered master) */
        if ((rc = ff_gpt_zero_params_settle(g)))
            return rc;
        return ff_gpt_zero_adamw(g, &j);
    }
    int64_t n = (int64_t)g->n_params;
    if (g->samo) { /* the compressed Z-sharded weights, wte's dense shard, then the rest */
        ff_gpt_samo_adamw(g, &j, 0, g->samo_k, 0);
        const size_t z0 = g->samo_zc0;
        adamw_job w = j;
        w.n_decay = z0; /* (wte is decayed) */
        if (z0 && !ff_dev_pass(g->ctx, FF_PASS_ADAMW, (int64_t)z0, &w))
            ff_team_run(g->ctx->team, (int64_t)z0, 1 << 14, adamw_range, &w);
        j.p += g->samo_p ? z0 : g->n_zsharded; /* (bf16-mixed: the master's dense rest) */
        j.m += z0, j.v += z0, j.gr += z0;
        j.n_decay -= g->n_zsharded;
        n -= (int64_t)g->n_zsharded;
    }
    if (!ff_dev_pass(g->ctx, FF_PASS_ADAMW, n, &j))
        ff_team_run(g->ctx->team, n, 1 << 14, adamw_range, &j);
    if (g->mask) /* pruned weights stay exactly zero, in the bf16 copy too */
        ff_mul(g->ctx, g->params, g->params, g->mask, (int64_t)g->n_params);
    ff_gpt_bf16_weights(g);
    return FF_OK;
}

void ff_gpt_adamw_run(ff_gpt *g, const void *job, int64_t n)
{
    if (!ff_dev_pass(g->ctx, FF_PASS_ADAMW, n, job))
        ff_team_run(g->ctx->team, n, 1 << 14, adamw_range, (void *)job);
}

/* The step's micro-batches, one after another or through the stages. */
static int run_micro_batches(ff_gpt *g, const int32_t *tokens, const int32_t *targets, int n_micro)
{
    if (g->P > 1)
        return ff_gpt_pipeline_run(g, tokens, targets, n_micro);
    int rc = FF_OK;
    for (int u = 0; u < n_micro && rc == FF_OK; u++)
        rc = ff_gpt_forward_backward_agreed(g, tokens + u * g->m, targets + u * g->m, u, n_micro);
    return rc;
}

int ff_gpt_grads(ff_gpt *g, const int32_t *tokens, const int32_t *targets, int n_micro, float *loss)
{
    int rc = n_micro > 0 ? ff_gpt_tokens_local(g, tokens, targets, n_micro * g->m)
                         : ff_set_error(g->ctx, FF_EINVAL, "%d micro-batches in a step", n_micro);
    if (rc == FF_OK)
        rc = ff_gpt_zero_masked_check(g);
    int rc0 = ff_gpt_zero_grad(g);
    if ((rc = ff_ctx_agree(g->ctx, rc0 ? rc0 : rc)) ||
        (rc = run_micro_batches(g, tokens, targets, n_micro)))
        return rc;
    return ff_gpt_finish_grads(g, loss);
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
    if (local_rc == FF_OK)
        local_rc = ff_gpt_zero_masked_check(g);
    int rc = ff_gpt_zero_grad(g);                  /* (waits for the last step's collectives) */
    rc = ff_ctx_agree(g->ctx, rc ? rc : local_rc); /* the step's one agreement */
    if (rc == FF_OK)
        rc = run_micro_batches(g, tokens, targets, n_micro);
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
        ff_gpt_moe_stats(g, &info->aux_loss, &info->dropped);
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
    return ff_gpt_adamw_update(g, h, step, scale); /* (a mask applied there) */
}

int ff_gpt_eval(ff_gpt *g, const int32_t *tokens, const int32_t *targets, float *loss)
{
    int rc;
    g->moe_aux_sum = g->moe_dropped_sum = g->moe_assign_sum = 0;
    if ((rc = ff_gpt_check_tokens(g, tokens, targets)) ||
        (rc = ff_gpt_run_forward(g, tokens, targets)) || (rc = ff_gpt_moe_finish(g, 1)))
        return rc;
    double s = 0;
    for (int64_t i = 0; g->last && i < g->m; i++)
        s += g->losses[i];
    float f = (float)s;
    if ((rc = ff_allreduce(g->grp_zd, &f, &f, 1, NULL)))
        return rc;
    /* only the last stage has the loss: the others add zeros */
    if (g->P > 1 && (rc = ff_allreduce(g->grp_pipe, &f, &f, 1, NULL)))
        return rc;
    *loss = f / ((float)g->B * (float)g->T);
    return FF_OK;
}

const float *ff_gpt_logits(const ff_gpt *g, int64_t *rows, int64_t *cols)
{
    *rows = g->m;
    *cols = g->vx;
    return g->last ? g->logits : NULL;
}
