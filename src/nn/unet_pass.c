/* The U-Net's forward and backward passes (include/fourfold/unet.h,
 * docs/unet.md "The U-Net"): the timestep embedding, the residual blocks
 * with their skip concatenations as sums over the parts, resampling, the
 * output; the backward the exact reverse of the forward's layer uses (the
 * sequence's standard program). */
#include <math.h>
#include <string.h>

#include "gpt_ops.h" /* attention */
#include "internal.h"
#include "unet_internal.h"
#include "unet_ops.h"

static const float GN_EPS = 1e-5f; /* torch.nn.GroupNorm's */

/* dst (px, C/G_to) in layout `to` = src (px, C/G_from) in layout `from`: an
 * all-gather over the group that splits src's channels, then this rank's
 * block of the other layout. Moves values only: the same bits. */
static int relayout(ff_unet *u, float *dst, const float *src, int64_t px, int64_t C, int from_x)
{
    int gf = from_x ? u->g.x : u->g.y, gt = from_x ? u->g.y : u->g.x;
    int rt = from_x ? u->c.y : u->c.x;
    int64_t cf = C / gf, ct = C / gt;
    const float *all = src;
    if (gf > 1) {
        int rc = ff_allgather(ff_grid_group(u->grid, from_x ? FF_GROUP_X : FF_GROUP_Y), src,
                              u->full, (size_t)(px * cf), NULL);
        if (rc)
            return rc;
        all = u->full;
    }
    for (int64_t p = 0; p < px; p++)
        for (int64_t j = 0; j < ct; j++) {
            int64_t c = rt * ct + j;
            dst[p * ct + j] = all[(c / cf) * px * cf + p * cf + c % cf];
        }
    return FF_OK;
}

static void add_into(float *dst, const float *src, size_t n)
{
    for (size_t i = 0; i < n; i++)
        dst[i] += src[i];
}

static int gn_fwd(ff_unet *u, unet_gn *n, float *out, const float *inp, int64_t hw)
{
    const float *w = u->params + n->off;
    return ff_gn_forward(gn_group(u, n), out, n->mean, n->rstd, inp, w, w + n->cl, u->images, hw,
                         n->cl, n->C, n->G, GN_EPS);
}

static int gn_bwd(ff_unet *u, unet_gn *n, float *dinp, const float *dout, const float *inp,
                  int64_t hw)
{
    float *dw = u->grads + n->off;
    return ff_gn_backward(gn_group(u, n), dinp, dw, dw + n->cl, dout, inp, u->params + n->off,
                          n->mean, n->rstd, u->images, hw, n->cl, n->C, n->G, u->gscr);
}

static int block_forward(ff_unet *u, unet_op *k)
{
    const int64_t n = u->images, hw = k->size * k->size, px = n * hw;
    const int64_t cx = local_c(u, k->cout, 1), cy = local_c(u, k->cout, 0);
    float *out = u->acts[k->out].x;
    int rc = FF_OK;
    for (int p = 0; p < k->nparts && !rc; p++) {
        rc = gn_fwd(u, &k->gn1[p], k->g1[p], u->acts[k->in[p]].x, hw);
        ff_silu_forward(u->ctx, k->s1[p], k->g1[p], px * k->gn1[p].cl);
    }
    // h1 (px, cout/Gx) = conv1(s1[0]) + conv1b(s1[1]) + Lin(SiLU(emb))
    if (!rc)
        rc = ff_conv_forward(k->conv1[0]->conv, k->h1, k->s1[0], n, u->col);
    if (!rc && k->nparts == 2) {
        rc = ff_conv_forward(k->conv1[1]->conv, u->tmp[0], k->s1[1], n, u->col);
        add_into(k->h1, u->tmp[0], (size_t)(px * cx));
    }
    if (!rc)
        rc = ff_linear_forward(k->tproj->lin, u->tmp[0], u->semb, n);
    for (int64_t b = 0; b < n && !rc; b++)
        for (int64_t q = 0; q < hw; q++)
            add_into(k->h1 + (b * hw + q) * cx, u->tmp[0] + b * cx, (size_t)cx);
    if (!rc)
        rc = gn_fwd(u, &k->gn2, k->g2, k->h1, hw);
    if (!rc) {
        ff_silu_forward(u->ctx, k->s2, k->g2, px * cx);
        rc = ff_conv_forward(k->conv2->conv, out, k->s2, n, u->col);
    }
    if (rc || !k->skip[0]) {
        if (!rc)
            add_into(out, u->acts[k->in[0]].x, (size_t)(px * cy));
        return rc;
    }
    // out += relayout_{X->Y}(skip(x0) + skipb(x1))
    rc = ff_conv_forward(k->skip[0]->conv, u->tmp[0], u->acts[k->in[0]].x, n, NULL);
    if (!rc && k->nparts == 2) {
        rc = ff_conv_forward(k->skip[1]->conv, u->tmp[1], u->acts[k->in[1]].x, n, NULL);
        add_into(u->tmp[0], u->tmp[1], (size_t)(px * cx));
    }
    if (!rc)
        rc = relayout(u, u->tmp[1], u->tmp[0], px, k->cout, 1);
    if (!rc)
        add_into(out, u->tmp[1], (size_t)(px * cy));
    return rc;
}

/* The reverse of block_forward, its layers' uses in reverse order. */
static int block_backward(ff_unet *u, unet_op *k)
{
    const int64_t n = u->images, hw = k->size * k->size, px = n * hw;
    const int64_t cx = local_c(u, k->cout, 1), cy = local_c(u, k->cout, 0);
    const float *dout = u->acts[k->out].dx;
    float *t0 = u->tmp[0], *t1 = u->tmp[1], *t2 = u->tmp[2];
    int rc = FF_OK;
    if (k->skip[0]) {
        rc = relayout(u, t2, dout, px, k->cout, 0);
        for (int p = k->nparts - 1; p >= 0 && !rc; p--) {
            unet_act *x = &u->acts[k->in[p]];
            rc = ff_conv_backward(k->skip[p]->conv, t0, t2, x->x, n, NULL, NULL);
            if (!rc)
                add_into(x->dx, t0, (size_t)(px * local_c(u, x->C, 0)));
        }
    } else {
        add_into(u->acts[k->in[0]].dx, dout, (size_t)(px * cy));
    }
    // ds2 -> dg2 -> dh1
    if (!rc)
        rc = ff_conv_backward(k->conv2->conv, t0, dout, k->s2, n, u->col, u->dcol);
    if (!rc) {
        ff_silu_backward(u->ctx, t1, t0, k->g2, px * cx);
        memset(t0, 0, (size_t)(px * cx) * sizeof(float));
        rc = gn_bwd(u, &k->gn2, t0, t1, k->h1, hw);
    }
    // the timestep projection: de (n, cout/Gx) = sum over pixels of dh1
    if (!rc) {
        float *de = t2;
        memset(de, 0, (size_t)(n * cx) * sizeof(float));
        for (int64_t b = 0; b < n; b++)
            for (int64_t q = 0; q < hw; q++)
                add_into(de + b * cx, t0 + (b * hw + q) * cx, (size_t)cx);
        rc = ff_linear_backward(k->tproj->lin, t1, de, u->semb, n);
        if (!rc)
            add_into(u->dsemb, t1, (size_t)(n * local_c(u, u->temb, 0)));
    }
    for (int p = k->nparts - 1; p >= 0 && !rc; p--) {
        unet_act *x = &u->acts[k->in[p]];
        size_t f = (size_t)(px * k->gn1[p].cl);
        rc = ff_conv_backward(k->conv1[p]->conv, t1, t0, k->s1[p], n, u->col, u->dcol);
        if (!rc) {
            ff_silu_backward(u->ctx, t2, t1, k->g1[p], (int64_t)f);
            rc = gn_bwd(u, &k->gn1[p], x->dx, t2, x->x, hw);
        }
    }
    return rc;
}

/* out = x + proj(attention(QKV(GN(x)))): x and out (px, C/Gy); the heads
 * are this X rank's whole ones, the pixels of each image the tokens. */
static int attn_forward(ff_unet *u, unet_op *k)
{
    const int64_t n = u->images, hw = k->size * k->size, px = n * hw;
    const int64_t cy = local_c(u, k->cout, 0), hs = u->cfg.attn_head_channels;
    const float *x = u->acts[k->in[0]].x;
    float *out = u->acts[k->out].x;
    int rc = gn_fwd(u, &k->gn1[0], k->g1[0], x, hw);
    if (!rc)
        rc = ff_linear_forward(k->qkv->lin, k->qkv_out, k->g1[0], px);
    if (!rc) {
        ff_attention_full_forward(u->ctx, k->att_out, k->att, k->qkv_out, (int)n, (int)hw,
                                  k->heads / u->g.x, (int)hs);
        rc = ff_linear_forward(k->proj->lin, out, k->att_out, px);
    }
    if (!rc)
        add_into(out, x, (size_t)(px * cy));
    return rc;
}

static int attn_backward(ff_unet *u, unet_op *k)
{
    const int64_t n = u->images, hw = k->size * k->size, px = n * hw;
    const int64_t cy = local_c(u, k->cout, 0), hs = u->cfg.attn_head_channels;
    unet_act *x = &u->acts[k->in[0]];
    const float *dout = u->acts[k->out].dx;
    float *t0 = u->tmp[0], *t1 = u->tmp[1];
    add_into(x->dx, dout, (size_t)(px * cy));
    // d(heads' output) (px, C/Gx), d qkv (px, 3C/Gx), d GN's output (px, C/Gy)
    int rc = ff_linear_backward(k->proj->lin, t0, dout, k->att_out, px);
    if (!rc) {
        ff_attention_full_backward(u->ctx, t1, u->att_scratch, t0, k->qkv_out, k->att, (int)n,
                                   (int)hw, k->heads / u->g.x, (int)hs);
        rc = ff_linear_backward(k->qkv->lin, t0, t1, k->g1[0], px);
    }
    if (!rc)
        rc = gn_bwd(u, &k->gn1[0], x->dx, t0, x->x, hw);
    return rc;
}

int ff_unet_forward_(ff_unet *u)
{
    const ff_unet_config *cfg = &u->cfg;
    const int64_t n = u->images, S = cfg->image_size, C0 = cfg->base;
    const int64_t cy0 = local_c(u, C0, 0), tx = local_c(u, u->temb, 1), ty = local_c(u, u->temb, 0);
    /* the sinusoid (improved DDPM's timestep_embedding): channel i < C0/2 is
     * cos(t f_i), i >= C0/2 sin(t f_{i - C0/2}), f_i = 10000^(-i / (C0/2)) */
    const int64_t half = C0 / 2;
    for (int64_t b = 0; b < n; b++)
        for (int64_t j = 0; j < cy0; j++) {
            int64_t i = u->c.y * cy0 + j, f = i < half ? i : i - half;
            double a = (double)u->t[b] * exp(-log(10000.0) * (double)f / (double)half);
            u->sinus[b * cy0 + j] = (float)(i < half ? cos(a) : sin(a));
        }
    int rc = ff_linear_seq_begin(u->seq);
    if (!rc)
        rc = ff_linear_forward(u->lin1->lin, u->l1, u->sinus, n);
    if (!rc) {
        ff_silu_forward(u->ctx, u->sl1, u->l1, n * tx);
        rc = ff_linear_forward(u->lin2->lin, u->emb, u->sl1, n);
    }
    if (!rc) {
        ff_silu_forward(u->ctx, u->semb, u->emb, n * ty);
        rc = ff_conv_forward(u->conv_in->conv, u->acts[1].x, u->acts[0].x, n, u->col);
    }
    for (int o = 0; o < u->nops && !rc; o++) {
        unet_op *k = &u->ops[o];
        unet_act *in = &u->acts[k->in[0]];
        int64_t cl = local_c(u, in->C, 0);
        if (k->kind == OP_BLOCK)
            rc = block_forward(u, k);
        else if (k->kind == OP_ATTN)
            rc = attn_forward(u, k);
        else if (k->kind == OP_DOWN)
            ff_downsample_forward(u->ctx, u->acts[k->out].x, in->x, n, in->size, in->size, cl);
        else
            ff_upsample_forward(u->ctx, u->acts[k->out].x, in->x, n, in->size, in->size, cl);
    }
    const unet_act *last = &u->acts[u->nacts - 1];
    if (!rc)
        rc = gn_fwd(u, u->gn_out, u->go, last->x, S * S);
    if (!rc) {
        ff_silu_forward(u->ctx, u->so, u->go, n * S * S * cy0);
        rc = ff_conv_forward(u->conv_out->conv, u->pred, u->so, n, u->col);
    }
    return rc;
}

int ff_unet_backward_(ff_unet *u)
{
    const ff_unet_config *cfg = &u->cfg;
    const int64_t n = u->images, S = cfg->image_size, C0 = cfg->base;
    const int64_t cy0 = local_c(u, C0, 0), tx = local_c(u, u->temb, 1), ty = local_c(u, u->temb, 0);
    for (int a = 0; a < u->nacts; a++) {
        unet_act *A = &u->acts[a];
        memset(A->dx, 0,
               (size_t)(n * A->size * A->size * local_c(u, A->C, A->layout_x)) * sizeof(float));
    }
    memset(u->dsemb, 0, (size_t)(n * ty) * sizeof(float));
    unet_act *last = &u->acts[u->nacts - 1];
    float *t0 = u->tmp[0], *t1 = u->tmp[1];
    int rc = ff_conv_backward(u->conv_out->conv, t0, u->dpred, u->so, n, u->col, u->dcol);
    if (!rc) {
        ff_silu_backward(u->ctx, t1, t0, u->go, n * S * S * cy0);
        rc = gn_bwd(u, u->gn_out, last->dx, t1, last->x, S * S);
    }
    for (int o = u->nops - 1; o >= 0 && !rc; o--) {
        unet_op *k = &u->ops[o];
        unet_act *in = &u->acts[k->in[0]], *out = &u->acts[k->out];
        int64_t cl = local_c(u, in->C, 0);
        if (k->kind == OP_BLOCK || k->kind == OP_ATTN) {
            rc = k->kind == OP_BLOCK ? block_backward(u, k) : attn_backward(u, k);
            continue;
        }
        if (k->kind == OP_DOWN)
            ff_downsample_backward(u->ctx, t0, out->dx, n, in->size, in->size, cl);
        else
            ff_upsample_backward(u->ctx, t0, out->dx, n, in->size, in->size, cl);
        add_into(in->dx, t0, (size_t)(n * in->size * in->size * cl));
    }
    if (!rc)
        rc = ff_conv_backward(u->conv_in->conv, NULL, u->acts[1].dx, u->acts[0].x, n, u->col,
                              u->dcol);
    // the timestep embedding's MLP
    if (!rc) {
        ff_silu_backward(u->ctx, t0, u->dsemb, u->emb, n * ty);
        rc = ff_linear_backward(u->lin2->lin, t1, t0, u->sl1, n);
    }
    if (!rc) {
        ff_silu_backward(u->ctx, t0, t1, u->l1, n * tx);
        rc = ff_linear_backward(u->lin1->lin, NULL, t0, u->sinus, n);
    }
    if (!rc)
        rc = ff_linear_seq_end(u->seq);
    return rc;
}
