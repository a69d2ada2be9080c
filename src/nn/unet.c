/* The DDPM U-Net on the 4D grid: building the model and its parameters as
 * canonical tensors (include/fourfold/unet.h, docs/unet.md "The U-Net");
 * its forward and backward are unet_pass.c. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fourfold/rng.h"
#include "gpt_ops.h" /* ff_qkv_permutation */
#include "internal.h"
#include "unet_internal.h"
#include "util/team.h"

int ff_unet_preset(const char *name, ff_unet_config *cfg)
{
    memset(cfg, 0, sizeof *cfg);
    cfg->img_channels = 1, cfg->img_channels_pad = 8, cfg->temb_mult = 4;
    cfg->schedule = FF_SCHEDULE_LINEAR, cfg->beta_first = 1e-4, cfg->beta_last = 0.02;
    if (name && !strcmp(name, "tiny")) {
        cfg->image_size = 8, cfg->base = 8, cfg->levels = 2, cfg->mult[0] = 1, cfg->mult[1] = 2;
        cfg->nres = 1, cfg->group_channels = 4, cfg->timesteps = 100;
        cfg->attn_head_channels = 2;
        cfg->beta_last = 0.2; /* T = 100: the same total noise as Ho et al.'s 1000 x 0.02 */
        return FF_OK;
    }
    if (name && !strcmp(name, "fmnist")) {
        cfg->image_size = 32, cfg->base = 32, cfg->levels = 3;
        cfg->mult[0] = 1, cfg->mult[1] = 2, cfg->mult[2] = 2;
        cfg->nres = 2, cfg->group_channels = 8, cfg->timesteps = 1000;
        cfg->attn_head_channels = 8;
        return FF_OK;
    }
    /* The paper's U-Nets (docs/unet.md, "Presets"): Figure 8's ~50M one as
     * improved DDPM's CIFAR-10 model (32x32, C0 128, mult 1,2,2,2, 3 blocks,
     * attention at 16x16 and 8x8, 32 groups at C0; here Fashion-MNIST's one
     * channel: 45,976,328 parameters), and Table II's, of which the paper
     * gives only C0, in improved DDPM's ImageNet-64 layout (64x64 RGB, mult
     * 1,2,3,4, 3 blocks, attention at 16x16 and 8x8, 32 groups at C0). Heads
     * of 64 channels (4 at C0 128; guided diffusion's num_head_channels). */
    static const struct {
        const char *name;
        int base;
    } table2[] = {{"250m", 256}, {"500m", 384}, {"1b", 512}, {"2b", 768}, {"4b", 1024}};
    const int fig8 = name && !strcmp(name, "50m");
    int base = fig8 ? 128 : 0;
    for (size_t i = 0; name && i < sizeof table2 / sizeof table2[0]; i++)
        if (!strcmp(name, table2[i].name))
            base = table2[i].base;
    if (!base)
        return FF_EINVAL;
    static const int cifar[4] = {1, 2, 2, 2}, imagenet[4] = {1, 2, 3, 4};
    cfg->image_size = fig8 ? 32 : 64, cfg->img_channels = fig8 ? 1 : 3;
    cfg->base = base, cfg->levels = 4, cfg->nres = 3;
    memcpy(cfg->mult, fig8 ? cifar : imagenet, sizeof cifar);
    cfg->group_channels = base / 32, cfg->attn_head_channels = 64;
    cfg->attn_levels = fig8 ? (1 << 1 | 1 << 2) : (1 << 2 | 1 << 3); /* 16x16 and 8x8 */
    cfg->timesteps = 1000;
    return FF_OK;
}

/* ---- building ------------------------------------------------------------ */

/* perm: the output columns' permutation (ff_linear_desc.col_perm), NULL:
 * none */
static unet_layer *add_layer_perm(ff_unet *u, const char *name, int conv, ff_linear_kind kind,
                                  int64_t cin, int64_t cout, int64_t size, int ksize, int bias,
                                  const int64_t *perm, int *rc)
{
    if (*rc)
        return NULL;
    if (u->nlayers == UNET_MAX_LAYERS) {
        *rc = ff_set_error(u->ctx, FF_EINVAL, "U-Net: more than %d layers", UNET_MAX_LAYERS);
        return NULL;
    }
    unet_layer *l = &u->layers[u->nlayers];
    uint32_t stream = 5100 + (uint32_t)u->nlayers;
    if (conv) {
        ff_conv_desc d = {name, kind, cin, cout, size, size, ksize, 1, bias, stream};
        *rc = ff_conv_create(u->seq, u->grid, &d, &l->conv);
        if (*rc)
            return NULL;
        l->lin = ff_conv_linear(l->conv);
    } else {
        ff_linear_desc d = {name, kind, cin, cout, bias, FF_WEIGHT_NK, perm, stream};
        *rc = ff_linear_add(u->seq, &d, &l->lin);
        if (*rc)
            return NULL;
    }
    ff_linear_sizes z = ff_linear_local_sizes(l->lin);
    l->nw = z.w_shard, l->nb = z.bias, l->cin = cin, l->cout = cout;
    l->taps = conv ? (int64_t)ksize * ksize : 1, l->kind = kind;
    l->off_w = u->nparams, u->nparams += l->nw;
    l->off_b = u->nparams, u->nparams += l->nb;
    u->nlayers++;
    return l;
}

static unet_layer *add_layer(ff_unet *u, const char *name, int conv, ff_linear_kind kind,
                             int64_t cin, int64_t cout, int64_t size, int ksize, int bias, int *rc)
{
    return add_layer_perm(u, name, conv, kind, cin, cout, size, ksize, bias, NULL, rc);
}

static unet_gn *add_gn(ff_unet *u, int64_t C, int layout_x, int *rc)
{
    if (*rc)
        return NULL;
    int64_t gc = u->cfg.group_channels;
    if (u->ngn == UNET_MAX_GN) {
        *rc = ff_set_error(u->ctx, FF_EINVAL, "U-Net: more than %d GroupNorms", UNET_MAX_GN);
        return NULL;
    }
    if (C % gc) {
        *rc = ff_set_error(u->ctx, FF_EDIVIDE,
                           "U-Net: GroupNorm of %lld channels in groups of %lld does not divide",
                           (long long)C, (long long)gc);
        return NULL;
    }
    unet_gn *n = &u->gns[u->ngn++];
    n->C = C, n->G = (int)(C / gc), n->layout_x = layout_x, n->cl = local_c(u, C, layout_x);
    n->off = u->nparams, u->nparams += 2 * (size_t)n->cl;
    return n;
}

static int add_act(ff_unet *u, int64_t size, int64_t C, int layout_x)
{
    u->acts[u->nacts] = (unet_act){size, C, layout_x, NULL, NULL};
    return u->nacts++;
}

static void add_tensor(ff_unet *u, const char *name, int kind, unet_layer *l0, unet_layer *l1,
                       unet_gn *n0, unet_gn *n1)
{
    unet_tensor *t = &u->tensors[u->ntensors++];
    snprintf(t->name, sizeof t->name, "%s", name);
    t->kind = kind, t->layer[0] = l0, t->layer[1] = l1, t->gn[0] = n0, t->gn[1] = n1;
    t->parts = (l1 || n1) ? 2 : 1;
    ff_unet_tensor_info *i = &t->info;
    i->name = t->name;
    if (l0)
        t->fan_in = (l0->cin + (l1 ? l1->cin : 0)) * l0->taps;
    if (kind == 0) {
        int64_t cin = l0->cin + (l1 ? l1->cin : 0);
        i->numel = l0->cout * cin * l0->taps;
        i->shape[0] = l0->cout, i->shape[1] = cin, i->ndim = 2;
        if (l0->taps > 1 || l0->conv)
            i->shape[2] = i->shape[3] = l0->taps == 9 ? 3 : 1, i->ndim = 4;
    } else if (kind == 1) {
        i->numel = l0->cout, i->shape[0] = l0->cout, i->ndim = 1;
    } else {
        i->numel = n0->C + (n1 ? n1->C : 0), i->shape[0] = i->numel, i->ndim = 1;
    }
}

/* Names as PyTorch's state_dict of tools/unet_oracle.py's model. */
static void layer_tensors(ff_unet *u, const char *name, unet_layer *l0, unet_layer *l1)
{
    char s[48];
    snprintf(s, sizeof s, "%s.weight", name);
    add_tensor(u, s, 0, l0, l1, NULL, NULL);
    if (l0->nb) {
        snprintf(s, sizeof s, "%s.bias", name);
        add_tensor(u, s, 1, l0, NULL, NULL, NULL);
        u->tensors[u->ntensors - 1].fan_in = u->tensors[u->ntensors - 2].fan_in; /* the layer's */
    }
}

static void gn_tensors(ff_unet *u, const char *name, unet_gn *n0, unet_gn *n1)
{
    char s[48];
    snprintf(s, sizeof s, "%s.weight", name);
    add_tensor(u, s, 2, NULL, NULL, n0, n1);
    snprintf(s, sizeof s, "%s.bias", name);
    add_tensor(u, s, 3, NULL, NULL, n0, n1);
}

/* A residual block on acts in[0..nparts) (layout Y) to cout channels. */
static int add_block(ff_unet *u, const char *name, const int *in, int nparts, int64_t cout, int *rc)
{
    if (*rc)
        return -1;
    if (u->nops == UNET_MAX_OPS) {
        *rc = ff_set_error(u->ctx, FF_EINVAL, "U-Net: more than %d blocks", UNET_MAX_OPS);
        return -1;
    }
    unet_op *k = &u->ops[u->nops++];
    char s[64];
    k->kind = OP_BLOCK, k->nparts = nparts, k->cout = cout, k->size = u->acts[in[0]].size;
    int64_t cin = 0;
    for (int p = 0; p < nparts; p++)
        k->in[p] = in[p], k->cin[p] = u->acts[in[p]].C, cin += k->cin[p];
    for (int p = 0; p < nparts; p++) {
        unet_gn *n = add_gn(u, k->cin[p], 0, rc); /* the block keeps a copy: same views */
        if (n)
            k->gn1[p] = *n;
    }
    for (int p = 0; p < nparts; p++) {
        snprintf(s, sizeof s, "%s.conv1%s", name, p ? "b" : "");
        k->conv1[p] = add_layer(u, s, 1, FF_LINEAR_N, k->cin[p], cout, k->size, 3, p == 0, rc);
    }
    snprintf(s, sizeof s, "%s.temb", name);
    k->tproj = add_layer(u, s, 0, FF_LINEAR_N, u->temb, cout, 1, 1, 1, rc);
    unet_gn *n2 = add_gn(u, cout, 1, rc);
    if (n2)
        k->gn2 = *n2;
    snprintf(s, sizeof s, "%s.conv2", name);
    k->conv2 = add_layer(u, s, 1, FF_LINEAR_T, cout, cout, k->size, 3, 1, rc);
    k->skip[0] = k->skip[1] = NULL;
    if (cin != cout)
        for (int p = 0; p < nparts; p++) {
            snprintf(s, sizeof s, "%s.skip%s", name, p ? "b" : "");
            k->skip[p] = add_layer(u, s, 1, FF_LINEAR_N, k->cin[p], cout, k->size, 1, p == 0, rc);
        }
    if (*rc)
        return -1;
    snprintf(s, sizeof s, "%s.norm1", name);
    gn_tensors(u, s, &u->gns[u->ngn - 1 - nparts], nparts == 2 ? &u->gns[u->ngn - 2] : NULL);
    snprintf(s, sizeof s, "%s.conv1", name);
    layer_tensors(u, s, k->conv1[0], nparts == 2 ? k->conv1[1] : NULL);
    snprintf(s, sizeof s, "%s.temb", name);
    layer_tensors(u, s, k->tproj, NULL);
    snprintf(s, sizeof s, "%s.norm2", name);
    gn_tensors(u, s, &u->gns[u->ngn - 1], NULL);
    snprintf(s, sizeof s, "%s.conv2", name);
    layer_tensors(u, s, k->conv2, NULL);
    if (k->skip[0]) {
        snprintf(s, sizeof s, "%s.skip", name);
        layer_tensors(u, s, k->skip[0], nparts == 2 ? k->skip[1] : NULL);
    }
    k->out = add_act(u, k->size, cout, 0);
    return k->out;
}

static int add_resample(ff_unet *u, unet_op_kind kind, int in, int *rc)
{
    if (u->nops == UNET_MAX_OPS) {
        *rc = ff_set_error(u->ctx, FF_EINVAL, "U-Net: more than %d blocks", UNET_MAX_OPS);
        return -1;
    }
    unet_op *k = &u->ops[u->nops++];
    memset(k, 0, sizeof *k);
    k->kind = kind, k->in[0] = in, k->nparts = 1;
    int64_t size = u->acts[in].size;
    k->out = add_act(u, kind == OP_DOWN ? size / 2 : size * 2, u->acts[in].C, 0);
    return k->out;
}

/* Self-attention on act `in` (layout Y, C channels): GroupNorm, the QKV
 * projection (N, each X rank's columns whole heads), attention without a
 * mask, the output projection (T). */
static int add_attn(ff_unet *u, const char *name, int in, int *rc)
{
    if (*rc)
        return -1;
    if (u->nops == UNET_MAX_OPS) {
        *rc = ff_set_error(u->ctx, FF_EINVAL, "U-Net: more than %d blocks", UNET_MAX_OPS);
        return -1;
    }
    const int64_t C = u->acts[in].C;
    unet_op *k = &u->ops[u->nops++];
    memset(k, 0, sizeof *k);
    k->kind = OP_ATTN, k->in[0] = in, k->nparts = 1, k->size = u->acts[in].size, k->cout = C;
    k->heads = (int)(C / u->cfg.attn_head_channels);
    unet_gn *n = add_gn(u, C, 0, rc);
    if (n)
        k->gn1[0] = *n;
    int64_t *perm = *rc ? NULL : ff_qkv_permutation(C, u->g.x);
    if (!*rc && !perm)
        *rc = ff_set_error(u->ctx, FF_ENOMEM, "U-Net: out of memory");
    char s[64];
    snprintf(s, sizeof s, "%s.qkv", name);
    k->qkv = add_layer_perm(u, s, 0, FF_LINEAR_N, C, 3 * C, 1, 1, 1, perm, rc);
    free(perm);
    snprintf(s, sizeof s, "%s.proj", name);
    k->proj = add_layer(u, s, 0, FF_LINEAR_T, C, C, 1, 1, 1, rc);
    if (*rc)
        return -1;
    snprintf(s, sizeof s, "%s.norm", name);
    gn_tensors(u, s, &u->gns[u->ngn - 1], NULL);
    snprintf(s, sizeof s, "%s.qkv", name);
    layer_tensors(u, s, k->qkv, NULL);
    snprintf(s, sizeof s, "%s.proj", name);
    layer_tensors(u, s, k->proj, NULL);
    k->out = add_act(u, k->size, C, 0);
    return k->out;
}

static int check_config(ff_ctx *ctx, const ff_unet_config *c, ff_dims g, int64_t batch)
{
    if (c->levels < 1 || c->levels > FF_UNET_MAX_LEVELS || c->nres < 1 || c->base < 2 ||
        c->base % 2 || c->img_channels < 1 || c->img_channels > c->img_channels_pad ||
        c->timesteps < 1 || c->temb_mult < 1 || c->group_channels < 1 || batch < 1)
        return ff_set_error(ctx, FF_EINVAL,
                            "U-Net: a configuration out of range (levels 1-%d, blocks, an even "
                            "base width, image channels at most the padded ones, timesteps, "
                            "batch at least 1)",
                            FF_UNET_MAX_LEVELS);
    int64_t s = c->image_size;
    for (int i = 0; i < c->levels - 1; i++, s /= 2)
        if (s < 2 || s % 2)
            return ff_set_error(
                ctx, FF_EDIVIDE, "U-Net: %lldx%lld images cannot be halved %d times for %d levels",
                (long long)c->image_size, (long long)c->image_size, c->levels - 1, c->levels);
    if (c->attn_head_channels < 0 || c->attn_levels < 0 || c->attn_levels >> c->levels ||
        (c->attn_levels && !c->attn_head_channels))
        return ff_set_error(ctx, FF_EINVAL,
                            "U-Net: attention at levels 0x%x of %d levels, heads of %d channels "
                            "(attention needs heads, at levels that exist)",
                            (unsigned)c->attn_levels, c->levels, c->attn_head_channels);
    for (int i = 0; i < c->levels && c->attn_head_channels; i++) {
        const int64_t w = (int64_t)c->base * c->mult[i];
        if (i != c->levels - 1 && !((c->attn_levels >> i) & 1))
            continue; /* (the middle's: the last level's width) */
        if (w % c->attn_head_channels)
            return ff_set_error(ctx, FF_EDIVIDE,
                                "U-Net: attention heads of %d channels do not divide %lld channels",
                                c->attn_head_channels, (long long)w);
        if ((w / c->attn_head_channels) % g.x)
            return ff_set_error(ctx, FF_EDIVIDE,
                                "U-Net: %lld attention heads over X=%d do not divide",
                                (long long)(w / c->attn_head_channels), g.x);
    }
    if (batch % ((int64_t)g.z * g.d))
        return ff_set_error(ctx, FF_EDIVIDE, "U-Net: a batch of %lld images over Gz*Gd = %d",
                            (long long)batch, g.z * g.d);
    int64_t widths[FF_UNET_MAX_LEVELS + 3];
    int nw = 0;
    widths[nw++] = c->img_channels_pad, widths[nw++] = c->base,
    widths[nw++] = (int64_t)c->base * c->temb_mult;
    for (int i = 0; i < c->levels; i++)
        widths[nw++] = (int64_t)c->base * c->mult[i];
    for (int i = 0; i < nw; i++)
        if (widths[i] < 1 || widths[i] % g.x || widths[i] % g.y)
            return ff_set_error(ctx, FF_EDIVIDE,
                                "U-Net: %lld channels over X=%d and Y=%d do not divide",
                                (long long)widths[i], g.x, g.y);
    return FF_OK;
}

static float *alloc_f(size_t n, int *rc)
{
    if (*rc)
        return NULL;
    float *p = calloc(n ? n : 1, sizeof(float));
    if (!p)
        *rc = FF_ENOMEM;
    return p;
}

int ff_unet_create(ff_grid *grid, const ff_unet_config *cfg, const ff_linear_opts *opts,
                   int64_t batch, ff_unet **out)
{
    *out = NULL;
    ff_ctx *ctx = ff_grid_ctx(grid);
    int rc = check_config(ctx, cfg, ff_grid_shape(grid), batch);
    if (rc)
        return rc;
    if (opts && opts->bf16) /* its layers would read a bf16 copy nobody keeps */
        return ff_set_error(ctx, FF_EUNSUPPORTED,
                            "U-Net: bf16-mixed products are not supported yet");
    ff_unet *u = calloc(1, sizeof *u);
    if (!u)
        return ff_set_error(ctx, FF_ENOMEM, "U-Net: out of memory");
    u->grid = grid, u->ctx = ctx, u->cfg = *cfg, u->batch = batch;
    u->g = ff_grid_shape(grid), u->c = ff_grid_coords(grid);
    u->images = batch / ((int64_t)u->g.z * u->g.d);
    u->first = (u->c.z + (int64_t)u->g.z * u->c.d) * u->images;
    u->temb = (int64_t)cfg->base * cfg->temb_mult;
    rc = ff_linear_seq_create(grid, opts, &u->seq);
    if (rc) {
        free(u);
        return rc;
    }
    /* layers in the order of their forward uses (the standard program) */
    const int64_t S = cfg->image_size, C0 = cfg->base;
    u->lin1 = add_layer(u, "temb.lin1", 0, FF_LINEAR_N, C0, u->temb, 1, 1, 1, &rc);
    u->lin2 = add_layer(u, "temb.lin2", 0, FF_LINEAR_T, u->temb, u->temb, 1, 1, 1, &rc);
    if (!rc)
        layer_tensors(u, "temb.lin1", u->lin1, NULL), layer_tensors(u, "temb.lin2", u->lin2, NULL);
    add_act(u, S, cfg->img_channels_pad, 1); /* acts[0]: x_t, layout X */
    u->conv_in = add_layer(u, "conv_in", 1, FF_LINEAR_T, cfg->img_channels_pad, C0, S, 3, 1, &rc);
    if (!rc)
        layer_tensors(u, "conv_in", u->conv_in, NULL);
    int h = add_act(u, S, C0, 0), stack[UNET_MAX_OPS], sp = 0;
    stack[sp++] = h;
    char name[32];
    for (int i = 0; i < cfg->levels && !rc; i++) {
        for (int r = 0; r < cfg->nres; r++) {
            snprintf(name, sizeof name, "down%d.res%d", i, r);
            h = add_block(u, name, &h, 1, C0 * cfg->mult[i], &rc);
            if ((cfg->attn_levels >> i) & 1 && !rc) {
                snprintf(name, sizeof name, "down%d.attn%d", i, r);
                h = add_attn(u, name, h, &rc);
            }
            stack[sp++] = h;
        }
        if (i != cfg->levels - 1 && !rc)
            stack[sp++] = h = add_resample(u, OP_DOWN, h, &rc);
    }
    for (int r = 0; r < 2 && !rc; r++) {
        snprintf(name, sizeof name, "mid.res%d", r);
        h = add_block(u, name, &h, 1, C0 * cfg->mult[cfg->levels - 1], &rc);
        if (r == 0 && cfg->attn_head_channels && !rc)
            h = add_attn(u, "mid.attn", h, &rc);
    }
    for (int i = cfg->levels - 1; i >= 0 && !rc; i--) {
        for (int r = 0; r < cfg->nres + 1 && !rc; r++) {
            snprintf(name, sizeof name, "up%d.res%d", i, r);
            int parts[2] = {h, stack[--sp]};
            h = add_block(u, name, parts, 2, C0 * cfg->mult[i], &rc);
            if ((cfg->attn_levels >> i) & 1 && !rc) {
                snprintf(name, sizeof name, "up%d.attn%d", i, r);
                h = add_attn(u, name, h, &rc);
            }
        }
        if (i != 0 && !rc)
            h = add_resample(u, OP_UP, h, &rc);
    }
    if (!rc) {
        u->gn_out = add_gn(u, C0, 0, &rc);
        if (!rc)
            gn_tensors(u, "norm_out", u->gn_out, NULL);
        u->conv_out =
            add_layer(u, "conv_out", 1, FF_LINEAR_N, C0, cfg->img_channels_pad, S, 3, 1, &rc);
        if (!rc)
            layer_tensors(u, "conv_out", u->conv_out, NULL);
    }
    if (!rc)
        rc = ff_linear_seq_program_standard(u->seq, 0);
    /* buffers */
    const int64_t n = u->images;
    size_t maxact = 0, maxcol = 1;
    u->params = alloc_f(u->nparams, &rc), u->grads = alloc_f(u->nparams, &rc);
    for (int a = 0; a < u->nacts && !rc; a++) {
        unet_act *A = &u->acts[a];
        size_t f = (size_t)(n * A->size * A->size * local_c(u, A->C, A->layout_x));
        /* every width in either layout, for the scratch */
        size_t fw = (size_t)(n * A->size * A->size * A->C);
        if (fw > maxact)
            maxact = fw;
        A->x = alloc_f(f, &rc), A->dx = alloc_f(f, &rc);
    }
    for (int l = 0; l < u->nlayers && !rc; l++) {
        unet_layer *L = &u->layers[l];
        ff_linear_bind(L->lin, u->params + L->off_w, L->nb ? u->params + L->off_b : NULL,
                       u->grads + L->off_w, L->nb ? u->grads + L->off_b : NULL);
        if (L->conv) {
            size_t cf = (size_t)(n * ff_conv_local_sizes(L->conv).col_per_image);
            if (cf > maxcol)
                maxcol = cf;
        }
    }
    int maxg = 1;
    for (int i = 0; i < u->ngn; i++)
        if (u->gns[i].G > maxg)
            maxg = u->gns[i].G;
    size_t att_hw = 0;
    for (int o = 0; o < u->nops && !rc; o++) {
        unet_op *k = &u->ops[o];
        if (k->kind == OP_ATTN) {
            const size_t px = (size_t)(n * k->size * k->size), hw = (size_t)(k->size * k->size);
            const size_t cx = (size_t)local_c(u, k->cout, 1);
            k->g1[0] = alloc_f(px * (size_t)local_c(u, k->cout, 0), &rc);
            k->gn1[0].mean = alloc_f((size_t)(n * k->gn1[0].G), &rc);
            k->gn1[0].rstd = alloc_f((size_t)(n * k->gn1[0].G), &rc);
            k->qkv_out = alloc_f(3 * px * cx, &rc), k->att_out = alloc_f(px * cx, &rc);
            k->att = alloc_f((size_t)n * (size_t)(k->heads / u->g.x) * hw * hw, &rc);
            if (3 * px * cx > maxact)
                maxact = 3 * px * cx;
            if (hw > att_hw)
                att_hw = hw;
        }
        if (k->kind != OP_BLOCK)
            continue;
        size_t px = (size_t)(n * k->size * k->size);
        for (int p = 0; p < k->nparts; p++) {
            size_t f = px * (size_t)local_c(u, k->cin[p], 0);
            k->g1[p] = alloc_f(f, &rc), k->s1[p] = alloc_f(f, &rc);
            k->gn1[p].mean = alloc_f((size_t)(n * k->gn1[p].G), &rc);
            k->gn1[p].rstd = alloc_f((size_t)(n * k->gn1[p].G), &rc);
        }
        size_t f = px * (size_t)local_c(u, k->cout, 1);
        k->h1 = alloc_f(f, &rc), k->g2 = alloc_f(f, &rc), k->s2 = alloc_f(f, &rc);
        k->gn2.mean = alloc_f((size_t)(n * k->gn2.G), &rc);
        k->gn2.rstd = alloc_f((size_t)(n * k->gn2.G), &rc);
        if (px * (size_t)k->cout > maxact)
            maxact = px * (size_t)k->cout;
    }
    if (u->gn_out) {
        u->gn_out->mean = alloc_f((size_t)(n * u->gn_out->G), &rc);
        u->gn_out->rstd = alloc_f((size_t)(n * u->gn_out->G), &rc);
    }
    const size_t px0 = (size_t)(n * S * S);
    u->t = rc ? NULL : calloc((size_t)n, sizeof(int));
    if (!rc && !u->t)
        rc = FF_ENOMEM;
    u->sinus = alloc_f((size_t)(n * C0), &rc);
    u->l1 = alloc_f((size_t)(n * u->temb), &rc), u->sl1 = alloc_f((size_t)(n * u->temb), &rc);
    u->emb = alloc_f((size_t)(n * u->temb), &rc), u->semb = alloc_f((size_t)(n * u->temb), &rc);
    u->dsemb = alloc_f((size_t)(n * u->temb), &rc);
    u->go = alloc_f(px0 * (size_t)C0, &rc), u->so = alloc_f(px0 * (size_t)C0, &rc);
    u->pred = alloc_f(px0 * (size_t)cfg->img_channels_pad, &rc);
    u->dpred = alloc_f(px0 * (size_t)cfg->img_channels_pad, &rc);
    u->tmp_floats = maxact > (size_t)(n * u->temb) ? maxact : (size_t)(n * u->temb);
    for (int i = 0; i < 3; i++)
        u->tmp[i] = alloc_f(u->tmp_floats, &rc);
    u->full = alloc_f(u->tmp_floats, &rc);
    u->col = alloc_f(maxcol, &rc), u->dcol = alloc_f(maxcol, &rc);
    u->gscr = alloc_f((size_t)(2 * n * maxg), &rc);
    u->att_scratch = alloc_f((size_t)ff_team_size(ctx->team) * att_hw * att_hw, &rc);
    u->noise = alloc_f(px0 * (size_t)cfg->img_channels, &rc);
    u->abar = rc ? NULL : calloc((size_t)cfg->timesteps, sizeof(double));
    if (!rc && !u->abar)
        rc = FF_ENOMEM;
    if (!rc)
        ff_ddpm_alpha_bar(cfg, u->abar);
    if (rc == FF_ENOMEM)
        rc = ff_set_error(ctx, FF_ENOMEM, "U-Net: out of memory");
    if (rc) {
        ff_unet_destroy(u);
        return rc;
    }
    *out = u;
    return FF_OK;
}

void ff_unet_destroy(ff_unet *u)
{
    if (!u)
        return;
    for (int l = 0; l < u->nlayers; l++)
        ff_conv_destroy(u->layers[l].conv);
    for (int a = 0; a < u->nacts; a++)
        free(u->acts[a].x), free(u->acts[a].dx);
    for (int o = 0; o < u->nops; o++) {
        unet_op *k = &u->ops[o];
        for (int p = 0; p < 2; p++)
            free(k->g1[p]), free(k->s1[p]), free(k->gn1[p].mean), free(k->gn1[p].rstd);
        free(k->h1), free(k->g2), free(k->s2), free(k->gn2.mean), free(k->gn2.rstd);
        free(k->qkv_out), free(k->att_out), free(k->att);
    }
    if (u->gn_out)
        free(u->gn_out->mean), free(u->gn_out->rstd);
    free(u->params), free(u->grads), free(u->adam_m), free(u->adam_v), free(u->t), free(u->sinus),
        free(u->l1), free(u->sl1);
    free(u->emb), free(u->semb), free(u->dsemb), free(u->go), free(u->so), free(u->pred);
    free(u->dpred), free(u->full), free(u->col), free(u->dcol), free(u->gscr);
    free(u->noise), free(u->abar), free(u->att_scratch);
    for (int i = 0; i < 3; i++)
        free(u->tmp[i]);
    ff_linear_seq_destroy(u->seq);
    free(u);
}

float *ff_unet_params(ff_unet *u) { return u->params; }
float *ff_unet_grads(ff_unet *u) { return u->grads; }
size_t ff_unet_params_count(const ff_unet *u) { return u->nparams; }
void ff_unet_zero_grads(ff_unet *u) { memset(u->grads, 0, u->nparams * sizeof(float)); }
int ff_unet_tensors(const ff_unet *u) { return u->ntensors; }
ff_unet_tensor_info ff_unet_tensor(const ff_unet *u, int i) { return u->tensors[i].info; }
void ff_unet_images(const ff_unet *u, int64_t *first, int64_t *count)
{
    *first = u->first, *count = u->images;
}

/* ---- canonical tensors --------------------------------------------------- */

static int gn_rank(const ff_unet *u, const unet_gn *n) { return n->layout_x ? u->c.x : u->c.y; }

/* Part p's weight (cout, cin_p * taps) from / into the canonical (cout,
 * (cin_0 + cin_1) * taps). */
static void part_rows(const unet_tensor *t, int p, float *part, float *canon, int to_part)
{
    int64_t cout = t->layer[0]->cout, taps = t->layer[0]->taps, w = t->info.shape[1] * taps;
    int64_t c0 = p ? t->layer[0]->cin * taps : 0, wp = t->layer[p]->cin * taps;
    for (int64_t o = 0; o < cout; o++)
        if (to_part)
            memcpy(part + o * wp, canon + o * w + c0, (size_t)wp * sizeof(float));
        else
            memcpy(canon + o * w + c0, part + o * wp, (size_t)wp * sizeof(float));
}

int ff_unet_scatter(ff_unet *u, int i, const float *canon)
{
    return ff_unet_scatter_to(u, i, 0, canon);
}

int ff_unet_alloc_moments(ff_unet *u)
{
    if (!u->adam_m) {
        u->adam_m = calloc(u->nparams ? u->nparams : 1, sizeof(float));
        u->adam_v = calloc(u->nparams ? u->nparams : 1, sizeof(float));
    }
    return ff_ctx_agree(u->ctx,
                        u->adam_m && u->adam_v
                            ? FF_OK
                            : ff_set_error(u->ctx, FF_ENOMEM, "out of memory for AdamW's moments"));
}

int ff_unet_scatter_to(ff_unet *u, int i, int which, const float *canon)
{
    unet_tensor *t = &u->tensors[i];
    int rc = FF_OK;
    if (which != 0 && which != 2 && which != 3)
        return ff_set_error(u->ctx, FF_EINVAL, "U-Net: no such data to scatter to");
    if (which && (rc = ff_unet_alloc_moments(u)))
        return rc;
    float *base = which == 0 ? u->params : which == 2 ? u->adam_m : u->adam_v;
    if (t->kind >= 2) {
        int64_t c0 = 0;
        for (int p = 0; p < t->parts; p++) {
            unet_gn *n = t->gn[p];
            float *dst = base + n->off + (t->kind == 3 ? (size_t)n->cl : 0);
            memcpy(dst, canon + c0 + gn_rank(u, n) * n->cl, (size_t)n->cl * sizeof(float));
            c0 += n->C;
        }
        return FF_OK;
    }
    for (int p = 0; p < t->parts && !rc; p++) {
        unet_layer *L = t->layer[p];
        size_t nw = (size_t)(L->cout * L->cin * L->taps);
        float *wc = calloc(nw, sizeof(float)), *bc = calloc((size_t)L->cout, sizeof(float));
        float *ws = calloc(L->nw + 1, sizeof(float)), *bs = calloc(L->nb + 1, sizeof(float));
        if (!wc || !bc || !ws || !bs)
            rc = ff_set_error(u->ctx, FF_ENOMEM, "U-Net: out of memory");
        if (!rc && t->kind == 0)
            part_rows(t, p, wc, (float *)canon, 1);
        if (!rc && t->kind == 1)
            memcpy(bc, canon, (size_t)L->cout * sizeof(float));
        if (!rc)
            rc = ff_linear_scatter(L->lin, wc, L->nb ? bc : NULL,
                                   t->kind == 0 ? base + L->off_w : ws,
                                   L->nb ? (t->kind == 1 ? base + L->off_b : bs) : NULL, 0);
        free(wc), free(bc), free(ws), free(bs);
    }
    return rc;
}

int ff_unet_gather(ff_unet *u, int i, int which, float *canon)
{
    unet_tensor *t = &u->tensors[i];
    const float *src = which == 0   ? u->params
                       : which == 1 ? u->grads
                       : which == 2 ? u->adam_m
                                    : u->adam_v;
    if (which < 0 || which > 3 || !src)
        return ff_set_error(u->ctx, FF_EINVAL, "U-Net: no %s to gather",
                            which == 2 || which == 3 ? "AdamW moments before a step" : "such data");
    int rc = FF_OK;
    if (t->kind >= 2) {
        int64_t c0 = 0;
        for (int p = 0; p < t->parts && !rc; p++) {
            unet_gn *n = t->gn[p];
            const float *s = src + n->off + (t->kind == 3 ? (size_t)n->cl : 0);
            rc = ff_allgather(gn_group(u, n), s, canon + c0, (size_t)n->cl, NULL);
            c0 += n->C;
        }
        return rc;
    }
    for (int p = 0; p < t->parts && !rc; p++) {
        unet_layer *L = t->layer[p];
        size_t nw = (size_t)(L->cout * L->cin * L->taps);
        float *wc = calloc(nw, sizeof(float)), *bc = calloc((size_t)L->cout, sizeof(float));
        if (!wc || !bc)
            rc = ff_set_error(u->ctx, FF_ENOMEM, "U-Net: out of memory");
        if (!rc)
            rc = ff_linear_gather(L->lin, src + L->off_w, L->nb ? src + L->off_b : NULL, wc,
                                  L->nb ? bc : NULL, 0);
        if (!rc && t->kind == 0)
            part_rows(t, p, wc, canon, 0);
        if (!rc && t->kind == 1)
            memcpy(canon, bc, (size_t)L->cout * sizeof(float));
        free(wc), free(bc);
    }
    return rc;
}

/* PyTorch's default initialisation of the unsplit layer (torch.nn.Conv2d's
 * and Linear's reset_parameters: kaiming_uniform_ with a = sqrt(5) for the
 * weight, whose bound gain * sqrt(3 / fan_in) = sqrt(1/3) sqrt(3 / fan_in)
 * is 1/sqrt(fan_in), and the bias U(-1/sqrt(fan_in), 1/sqrt(fan_in))),
 * fan_in = in channels x taps of the whole layer: a split convolution's
 * parts draw from the canonical tensor of the concatenation. Element e of
 * canonical tensor i is (2 u - 1) / sqrt(fan_in), u = ff_rng_uniform(seed,
 * INIT_STREAM + i, e), in double, rounded once; then scattered: the same on
 * every grid (tools/unet_oracle.py draws the same values). */
enum { INIT_STREAM = 0xD000 }; /* + the tensor index (the layers' own streams are 5100 + i) */
int ff_unet_init(ff_unet *u, uint64_t seed)
{
    int64_t most = 1;
    for (int i = 0; i < u->ntensors; i++)
        most = u->tensors[i].info.numel > most ? u->tensors[i].info.numel : most;
    float *canon = calloc((size_t)most, sizeof(float));
    int rc = ff_ctx_agree(u->ctx,
                          canon ? FF_OK : ff_set_error(u->ctx, FF_ENOMEM, "U-Net: out of memory"));
    /* the scatter reads a layer's canonical tensors on rank 0 only
     * (ff_linear_scatter's root), GroupNorm's on every rank */
    const int root = ff_ctx_rank(u->ctx) == 0;
    for (int i = 0; i < u->ntensors && !rc; i++) {
        const unet_tensor *t = &u->tensors[i];
        const double bound = t->kind < 2 ? 1.0 / sqrt((double)t->fan_in) : 0;
        for (int64_t e = 0; e < t->info.numel && (root || t->kind >= 2); e++) {
            double r =
                t->kind < 2 ? ff_rng_uniform(seed, INIT_STREAM + (uint32_t)i, (uint64_t)e) : 0;
            canon[e] = t->kind == 2   ? 1.0f /* GroupNorm: gain 1, bias 0 */
                       : t->kind == 3 ? 0.0f
                                      : (float)((2 * r - 1) * bound);
        }
        rc = ff_unet_scatter(u, i, canon);
    }
    free(canon);
    return rc;
}

int ff_unet_allreduce_grads(ff_unet *u)
{
    int rc = ff_linear_seq_allreduce_grads(u->seq);
    ff_group *zd = ff_grid_group(u->grid, FF_GROUP_ZD);
    for (int i = 0; i < u->ngn && !rc; i++) {
        float *g = u->grads + u->gns[i].off;
        rc = ff_allreduce(zd, g, g, 2 * (size_t)u->gns[i].cl, NULL);
    }
    return rc;
}

ff_unet_config ff_unet_get_config(const ff_unet *u) { return u->cfg; }
