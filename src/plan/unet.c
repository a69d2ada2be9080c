/* The planner's U-Net (docs/planner.md, "The U-Net"): the step of
 * src/nn/unet*.c (ff_unet_step) as the planner's list of operations, so the
 * GPT's engine (cost_full.c: the timeline, the links, the exact traffic)
 * plays it unchanged. The model is described by what its run does:
 *
 *   - its linear layers (the convolutions on their im2col rows, the
 *     timestep MLP and projections, attention's QKV and output), in the
 *     order src/nn/unet.c adds them, which is their forward order; each is
 *     the GPT's linear layer (schedule.c's plan_sched_linear_*): the Z
 *     gather, the forward all-reduce, the backward's (none without an
 *     input gradient: conv_in and temb.lin1), the Z reduce-scatter;
 *   - GroupNorm's statistics: two all-reduces of images*G floats forward
 *     and one of 2*images*G backward over the group that splits its
 *     channels (Y in layout Y, X in layout X), only when a group's
 *     channels span ranks (src/nn/unet_ops.c);
 *   - the 1x1 skips' move to layout Y: an all-gather over X of the skip's
 *     output forward, over Y of the gradient backward (src/nn/unet_pass.c);
 *   - the loss (over X, then ZD), the data-parallel all-reduces (every
 *     weight shard over D, every bias over ZD, in the order of the layers,
 *     then GroupNorm's gains and biases over ZD), the norm (WORLD), AdamW.
 *
 * tests/test_plan_vs_run.c compares ff_plan_traffic with the counters of a
 * real ff_unet_step on every grid of 8 ranks; a difference is settled here. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "plan/plan_internal.h"

enum { U_LIN, U_GN, U_MOVE, U_ATTN };

typedef struct {
    int kind;
    int transposed;      /* U_LIN: T; U_GN: layout X */
    int64_t k, n;        /* U_LIN: the matrix; U_GN, U_MOVE, U_ATTN: n the channels */
    int64_t px;          /* rows (pixels) per image */
    int dinp, bias;      /* U_LIN */
    int64_t groups;      /* U_GN */
    int64_t heads, head; /* U_ATTN */
} uop;

typedef struct {
    uop *op;
    int n, cap, oom;
} ulist;

static void add(ulist *l, uop u)
{
    if (l->oom)
        return;
    if (l->n == l->cap) {
        int cap = l->cap ? 2 * l->cap : 256;
        uop *p = realloc(l->op, (size_t)cap * sizeof *p);
        if (!p) {
            l->oom = 1;
            return;
        }
        l->op = p, l->cap = cap;
    }
    l->op[l->n++] = u;
}

static void lin(ulist *l, int t, int64_t k, int64_t n, int64_t px, int dinp, int bias)
{
    add(l, (uop){U_LIN, t, k, n, px, dinp, bias, 0, 0, 0});
}

static void gn(ulist *l, const ff_unet_config *c, int layout_x, int64_t C, int64_t px)
{
    add(l, (uop){U_GN, layout_x, 0, C, px, 0, 0, C / c->group_channels, 0, 0});
}

static void block(ulist *l, const ff_unet_config *c, const int64_t *cin, int parts, int64_t cout,
                  int64_t size)
{
    const int64_t px = size * size, temb = (int64_t)c->base * c->temb_mult;
    int64_t all = 0;
    for (int p = 0; p < parts; p++)
        gn(l, c, 0, cin[p], px), all += cin[p];
    for (int p = 0; p < parts; p++)
        lin(l, 0, 9 * cin[p], cout, px, 1, p == 0);
    lin(l, 0, temb, cout, 1, 1, 1);
    gn(l, c, 1, cout, px);
    lin(l, 1, 9 * cout, cout, px, 1, 1);
    if (all != cout) {
        for (int p = 0; p < parts; p++)
            lin(l, 0, cin[p], cout, px, 1, p == 0);
        add(l, (uop){U_MOVE, 0, 0, cout, px, 0, 0, 0, 0, 0});
    }
}

/* Self-attention on h channels of size x size pixels: GroupNorm, QKV,
 * the heads, the projection. */
static void attention(ulist *l, const ff_unet_config *c, int64_t h, int64_t size)
{
    gn(l, c, 0, h, size * size);
    lin(l, 0, h, 3 * h, size * size, 1, 1);
    add(l, (uop){U_ATTN, 0, 0, h, size * size, 0, 0, 0, h / c->attn_head_channels,
                 c->attn_head_channels});
    lin(l, 1, h, h, size * size, 1, 1);
}

/* The forward's operations in src/nn/unet.c's order (ff_unet_create). */
static int build(const ff_unet_config *c, ulist *l)
{
    const int64_t S = c->image_size, C0 = c->base, temb = C0 * c->temb_mult;
    lin(l, 0, C0, temb, 1, 0, 1);                                 /* temb.lin1 */
    lin(l, 1, temb, temb, 1, 1, 1);                               /* temb.lin2 */
    lin(l, 1, 9 * (int64_t)c->img_channels_pad, C0, S * S, 0, 1); /* conv_in */
    int64_t stack[2 * FF_UNET_MAX_LEVELS * 64], sp = 0, h = C0, size = S;
    stack[sp++] = h;
    for (int i = 0; i < c->levels; i++) {
        for (int r = 0; r < c->nres; r++) {
            block(l, c, &h, 1, C0 * c->mult[i], size);
            stack[sp++] = h = C0 * c->mult[i];
            if ((c->attn_levels >> i) & 1)
                attention(l, c, h, size);
        }
        if (i != c->levels - 1)
            stack[sp++] = h, size /= 2;
    }
    for (int r = 0; r < 2; r++) {
        block(l, c, &h, 1, C0 * c->mult[c->levels - 1], size);
        h = C0 * c->mult[c->levels - 1];
        if (r == 0 && c->attn_head_channels)
            attention(l, c, h, size);
    }
    for (int i = c->levels - 1; i >= 0; i--) {
        for (int r = 0; r < c->nres + 1; r++) {
            int64_t parts[2] = {h, stack[--sp]};
            block(l, c, parts, 2, C0 * c->mult[i], size);
            h = C0 * c->mult[i];
            if ((c->attn_levels >> i) & 1)
                attention(l, c, h, size);
        }
        if (i != 0)
            size *= 2;
    }
    gn(l, c, 0, C0, S * S);
    lin(l, 0, 9 * C0, c->img_channels_pad, S * S, 1, 1); /* conv_out */
    return l->oom ? FF_ENOMEM : FF_OK;
}

int plan_unet_model_check(const ff_unet_config *c, char *err, size_t len)
{
    if (c->levels < 1 || c->levels > FF_UNET_MAX_LEVELS || c->nres < 1 || c->nres > 64 ||
        c->base < 2 || c->base % 2 || c->base > (1 << 16) || c->img_channels < 1 ||
        c->img_channels > c->img_channels_pad || c->img_channels_pad > (1 << 12) ||
        c->temb_mult < 1 || c->temb_mult > 64 || c->group_channels < 1 ||
        c->attn_head_channels < 0 || c->image_size < 1 || c->image_size > (1 << 14))
        return ff_format_error(err, len, FF_EINVAL,
                               "U-Net: a configuration out of range (levels 1-%d, blocks, an "
                               "even base width, image channels at most the padded ones)",
                               FF_UNET_MAX_LEVELS);
    for (int i = 0; i < c->levels; i++)
        if (c->mult[i] < 1 || c->mult[i] > 64)
            return ff_format_error(err, len, FF_EINVAL, "U-Net: channel multiplier %d: 1 to 64",
                                   c->mult[i]);
    int64_t s = c->image_size;
    for (int i = 0; i < c->levels - 1; i++, s /= 2)
        if (s < 2 || s % 2)
            return ff_format_error(
                err, len, FF_EDIVIDE, "U-Net: %lldx%lld images cannot be halved %d times",
                (long long)c->image_size, (long long)c->image_size, c->levels - 1);
    if (c->attn_levels < 0 || c->attn_levels >> c->levels ||
        (c->attn_levels && !c->attn_head_channels))
        return ff_format_error(err, len, FF_EINVAL,
                               "U-Net: attention at levels 0x%x of %d levels, heads of %d "
                               "channels (attention needs heads, at levels that exist)",
                               (unsigned)c->attn_levels, c->levels, c->attn_head_channels);
    for (int i = 0; i < c->levels && c->attn_head_channels; i++)
        if ((i == c->levels - 1 || (c->attn_levels >> i) & 1) &&
            (int64_t)c->base * c->mult[i] % c->attn_head_channels)
            return ff_format_error(
                err, len, FF_EDIVIDE,
                "U-Net: attention heads of %d channels do not divide %lld channels",
                c->attn_head_channels, (long long)c->base * c->mult[i]);
    /* every GroupNorm's width (each part of a concatenation) */
    int64_t widths[FF_UNET_MAX_LEVELS + 1];
    widths[0] = c->base;
    for (int i = 0; i < c->levels; i++)
        widths[i + 1] = (int64_t)c->base * c->mult[i];
    for (int i = 0; i <= c->levels; i++)
        if (widths[i] % c->group_channels)
            return ff_format_error(err, len, FF_EDIVIDE,
                                   "U-Net: GroupNorm of %lld channels in groups of %d does not "
                                   "divide",
                                   (long long)widths[i], c->group_channels);
    return FF_OK;
}

int64_t plan_unet_params(const ff_unet_config *c)
{
    ulist l = {0};
    int64_t n = 0;
    if (build(c, &l) == FF_OK)
        for (int i = 0; i < l.n; i++)
            n += l.op[i].kind == U_LIN  ? l.op[i].k * l.op[i].n + (l.op[i].bias ? l.op[i].n : 0)
                 : l.op[i].kind == U_GN ? 2 * l.op[i].n
                                        : 0;
    free(l.op);
    return n;
}

/* 0 with the grid's refusal in r (the run's: ff_unet_create, ff_conv_create,
 * ff_linear_add), else 1. */
static int fits_grid(const ff_plan_config *cfg, const ulist *l, ff_dims g, ff_plan_result *r)
{
    const ff_unet_config *c = &cfg->model.unet;
    const int64_t gx = g.x, gy = g.y;
    if (cfg->batch % ((int64_t)g.z * g.d))
        plan_reject(r, "a batch of %lld images does not divide over Gz*Gd = %d",
                    (long long)cfg->batch, g.z * g.d);
    int64_t w[FF_UNET_MAX_LEVELS + 3];
    int nw = 0;
    w[nw++] = c->img_channels_pad, w[nw++] = c->base, w[nw++] = (int64_t)c->base * c->temb_mult;
    for (int i = 0; i < c->levels; i++)
        w[nw++] = (int64_t)c->base * c->mult[i];
    for (int i = 0; i < nw; i++)
        if (w[i] % gx || w[i] % gy) {
            plan_reject(r, "%lld channels do not divide over X=%d and Y=%d", (long long)w[i], g.x,
                        g.y);
            break;
        }
    for (int i = 0; i < c->levels && c->attn_head_channels && !r->rejected; i++) {
        const int64_t heads = (int64_t)c->base * c->mult[i] / c->attn_head_channels;
        if ((i == c->levels - 1 || (c->attn_levels >> i) & 1) && heads % gx)
            plan_reject(r, "%lld attention heads do not divide over X=%d", (long long)heads, g.x);
    }
    for (int i = 0; !r->rejected && i < l->n; i++) {
        const uop *u = &l->op[i];
        if (u->kind == U_LIN &&
            (u->k / (u->transposed ? gx : gy)) * (u->n / (u->transposed ? gy : gx)) % g.z) {
            plan_reject(r, "a weight block of %lld x %lld does not divide over Z=%d",
                        (long long)(u->k / (u->transposed ? gx : gy)),
                        (long long)(u->n / (u->transposed ? gy : gx)), g.z);
            break;
        }
    }
    return !r->rejected;
}

static int64_t n_layers(const ulist *l)
{
    int64_t n = 0;
    for (int i = 0; i < l->n; i++)
        n += l->op[i].kind == U_LIN;
    return n;
}

/* The AG cache's layers: the last `cache` in forward order (src/nn/linear.c);
 * FF_PLAN_AUTO: every one (ff_linear_opts_default's -1). */
static int64_t cached_layers(const ff_plan_config *cfg, int64_t nl)
{
    return cfg->ag_cache == FF_PLAN_AUTO || cfg->ag_cache > nl ? nl : cfg->ag_cache;
}

static void layer_opts(const plan_shape *s, int cached, ff_layer_opts *o)
{
    memset(o, 0, sizeof *o);
    o->oar = (s->overlap & FF_OVERLAP_OAR) != 0;
    o->ors = (s->overlap & FF_OVERLAP_ORS) != 0;
    o->oag = (s->overlap & FF_OVERLAP_OAG) != 0;
    o->ag_cache = cached;
    o->wire_bytes = s->wire;
    o->rs_cmm = s->rs_cmm;
}

typedef struct {
    double params, gathered_cached, gathered_max, acts;
} umem;

/* The list of one step of the rank (every rank lists the same). */
static void schedule(const ff_plan_config *cfg, const ulist *l, const plan_shape *s, plan_ops *o,
                     umem *mem)
{
    plan_sched c = {s, o, s->g.x, s->g.y, s->g.z, s->g.d, 0, 0};
    const int64_t n = cfg->batch / ((int64_t)s->g.z * s->g.d); /* images on the rank */
    const int64_t nl = n_layers(l), cache = cached_layers(cfg, nl),
                  gc = cfg->model.unet.group_channels;
    const int64_t gx = c.gx, gy = c.gy, gz = c.gz;
    ff_layer_opts lo;
    memset(mem, 0, sizeof *mem);
    /* forward */
    int64_t li = 0;
    for (int i = 0; i < l->n; i++) {
        const uop *u = &l->op[i];
        const int64_t px = n * u->px;
        if (u->kind == U_LIN) {
            const int64_t kl = u->k / (u->transposed ? gx : gy),
                          nl_ = u->n / (u->transposed ? gy : gx);
            layer_opts(s, li >= nl - cache, &lo);
            c.m = px;
            plan_sched_linear_forward(&c, u->transposed, u->k, u->n, 1, &lo);
            mem->params += (double)(kl * nl_ / gz + (u->bias ? nl_ : 0));
            double gathered = gz > 1 ? (double)(kl * nl_) : 0; /* Gz = 1: the shard itself */
            if (li >= nl - cache)
                mem->gathered_cached += gathered;
            mem->gathered_max = fmax(mem->gathered_max, gathered);
            /* the layer's input and its im2col (3x3), output and their gradients */
            mem->acts += 2.0 * (double)(px * (kl + nl_));
            li++;
        } else if (u->kind == U_GN) {
            const int64_t cl = u->n / (u->transposed ? gx : gy);
            if (cl % gc) {
                ff_group_kind gk = u->transposed ? FF_GROUP_X : FF_GROUP_Y;
                plan_sched_coll(&c, gk, FF_COLL_ALLREDUCE, n * u->groups);
                plan_sched_coll(&c, gk, FF_COLL_ALLREDUCE, n * u->groups);
            }
            plan_sched_elem(&c, 4, (double)(px * cl));
            mem->params += (double)(2 * cl);
            mem->acts += 2.0 * (double)(px * cl);
        } else if (u->kind == U_MOVE) {
            if (gx > 1)
                plan_sched_coll(&c, FF_GROUP_X, FF_COLL_ALLGATHER, px * (u->n / gx));
            plan_sched_elem(&c, 2, (double)(px * u->n / gy));
        } else { /* attention over an image's pixels, the X rank's heads */
            const double hl = (double)(u->heads / gx), hw = (double)u->px;
            plan_sched_attention(&c, 4.0 * (double)n * hl * hw * hw * (double)u->head, u->px,
                                 u->head);
            mem->acts += (double)n * hl * hw * hw;
        }
    }
    /* backward, the reverse */
    li = nl - 1;
    for (int i = l->n - 1; i >= 0; i--) {
        const uop *u = &l->op[i];
        const int64_t px = n * u->px;
        if (u->kind == U_LIN) {
            const int cached = li >= nl - cache;
            layer_opts(s, cached, &lo);
            c.m = px;
            /* outside the AG cache the backward gathers again, but the last
             * forward's layer, whose backward follows at once */
            plan_sched_linear_backward(&c, u->transposed, u->k, u->n, !cached && li != nl - 1,
                                       u->dinp, &lo);
            li--;
        } else if (u->kind == U_GN) {
            const int64_t cl = u->n / (u->transposed ? gx : gy);
            if (cl % gc)
                plan_sched_coll(&c, u->transposed ? FF_GROUP_X : FF_GROUP_Y, FF_COLL_ALLREDUCE,
                                2 * n * u->groups);
            plan_sched_elem(&c, 5, (double)(px * cl));
        } else if (u->kind == U_MOVE) {
            if (gy > 1)
                plan_sched_coll(&c, FF_GROUP_Y, FF_COLL_ALLGATHER, px * (u->n / gy));
            plan_sched_elem(&c, 2, (double)(px * u->n / gx));
        } else {
            const double hl = (double)(u->heads / gx), hw = (double)u->px;
            plan_sched_attention(&c, 8.0 * (double)n * hl * hw * hw * (double)u->head, u->px,
                                 u->head);
        }
    }
    plan_sched_finish(&c);
    /* the loss: summed over X (the data channels' blocks), then ZD */
    plan_sched_coll(&c, FF_GROUP_X, FF_COLL_ALLREDUCE, 1);
    plan_sched_coll(&c, FF_GROUP_ZD, FF_COLL_ALLREDUCE, 1);
    /* ff_unet_allreduce_grads: each layer's weight shard over D and its
     * bias over ZD, then every GroupNorm's gain and bias over ZD */
    for (int i = 0; i < l->n; i++) {
        const uop *u = &l->op[i];
        if (u->kind != U_LIN)
            continue;
        const int64_t kl = u->k / (u->transposed ? gx : gy), nl_ = u->n / (u->transposed ? gy : gx);
        plan_sched_coll(&c, FF_GROUP_D, FF_COLL_ALLREDUCE, kl * nl_ / gz);
        if (u->bias)
            plan_sched_coll(&c, FF_GROUP_ZD, FF_COLL_ALLREDUCE, nl_);
    }
    for (int i = 0; i < l->n; i++)
        if (l->op[i].kind == U_GN)
            plan_sched_coll(&c, FF_GROUP_ZD, FF_COLL_ALLREDUCE,
                            2 * (l->op[i].n / (l->op[i].transposed ? gx : gy)));
    /* the norm over every rank, then AdamW */
    plan_sched_coll(&c, FF_GROUP_WORLD, FF_COLL_ALLREDUCE, 1);
    plan_sched_optimizer(&c, mem->params);
    plan_sched_prefetch(o);
}

/* The options the planner reads of a plan_shape for a U-Net. */
static void shape_of(const ff_plan_config *cfg, ff_dims g, plan_shape *s)
{
    memset(s, 0, sizeof *s);
    s->g = g;
    s->micro = 1;
    s->wire = cfg->wire_bytes;
    s->act = 4;
    s->overlap = cfg->overlap;
    s->panel_rows = cfg->panel_rows;
    s->cmm = cfg->cmm;
    s->rs_cmm = cfg->rs_cmm;
    s->P = 1, s->nb = 0, s->first = s->last = 1;
    s->ge = 1, s->keep = 1;
}

int plan_unet_check(const ff_plan_config *cfg, char *err, size_t len)
{
    const char *why =
        cfg->cost != FF_COST_FULL ? "a cost model other than full"
        : cfg->stages != 1        ? "pipeline stages"
        : cfg->layers             ? "a per-layer plan"
        : cfg->micro_batches != 1 && cfg->micro_batches != FF_PLAN_AUTO ? "micro-batches"
        : cfg->checkpoint == 1                                          ? "checkpointing"
        : cfg->precision == FF_PLAN_BF16_MIXED                          ? "bf16-mixed precision"
        : cfg->sparsity > 0                                             ? "pruning"
        : cfg->zero                                                     ? "ZeRO"
        : cfg->cmm                                                      ? "the collective matmul"
        : cfg->expert_parallel != 1 && cfg->expert_parallel != FF_PLAN_AUTO ? "expert parallelism"
                                                                            : NULL;
    if (why)
        return ff_format_error(err, len, FF_EUNSUPPORTED,
                               "the planner's U-Net with %s is not supported yet", why);
    if (cfg->batch < 1 || cfg->batch > ((int64_t)1 << 30))
        return ff_format_error(err, len, FF_EINVAL, "batch %lld: expected 1 to 2^30 images",
                               (long long)cfg->batch);
    return FF_OK;
}

static int evaluate(const ff_plan_config *cfg, ff_dims g, ff_plan_result *r, plan_ops *ops,
                    ff_dims coords, ff_plan_coll traffic[FF_PLAN_NGROUPS][FF_NCOLL], char *err,
                    size_t len)
{
    ulist l = {0};
    int rc = build(&cfg->model.unet, &l);
    if (rc) {
        free(l.op);
        return ff_format_error(err, len, FF_ENOMEM, "out of memory");
    }
    plan_links(&cfg->machine, g, 1, 0, r->link);
    r->checkpoint = 0, r->micro_batches = 1, r->expert_parallel = 1;
    r->ag_cache = (int)cached_layers(cfg, n_layers(&l));
    if (!fits_grid(cfg, &l, g, r)) {
        free(l.op);
        return traffic ? ff_format_error(err, len, FF_EDIVIDE, "grid %dx%dx%dx%d: %s", g.x, g.y,
                                         g.z, g.d, r->reason)
                       : FF_OK;
    }
    plan_shape s;
    shape_of(cfg, g, &s);
    ops->n = 0, ops->tags = 0, ops->ge = 1;
    umem m;
    schedule(cfg, &l, &s, ops, &m);
    free(l.op);
    if (ops->oom)
        return ff_format_error(err, len, FF_ENOMEM, "out of memory");
    if (traffic)
        return plan_count_traffic_at(cfg, ops, g, coords, traffic) ? FF_ENOMEM : FF_OK;
    /* memory: parameters, gradients, AdamW's two moments (fp32); the gathered
     * weights of the AG cache and the largest other one; the activations
     * the run keeps (an estimate: every layer's input, output and
     * gradients, GroupNorm's, the attention scores) */
    r->mem_params = 4.0 * m.params;
    r->mem_grads = 4.0 * m.params;
    r->mem_optimizer = 8.0 * m.params;
    r->mem_weight_buffers = 4.0 * (m.gathered_cached + m.gathered_max);
    r->mem_activations = 4.0 * m.acts;
    r->mem_total = r->mem_params + r->mem_grads + r->mem_optimizer + r->mem_weight_buffers +
                   r->mem_activations;
    if (r->mem_total > cfg->machine.memory_bytes)
        plan_reject(r, "needs %.2f GiB per rank, above the machine's %.2f GiB",
                    r->mem_total / PLAN_GIB, cfg->machine.memory_bytes / PLAN_GIB);
    if (r->rejected)
        return FF_OK;
    int ranks = plan_group_size(g, FF_GROUP_WORLD), rpn = cfg->machine.ranks_per_node;
    double rate = plan_gemm_rate(&cfg->machine, ranks < rpn ? ranks : rpn), end, bg;
    if (plan_play(cfg, g, ops, r->link, rate, r, 1, &end, &bg, NULL) ||
        plan_count_traffic(cfg, ops, g, r))
        return ff_format_error(err, len, FF_ENOMEM, "out of memory planning grid %dx%dx%dx%d", g.x,
                               g.y, g.z, g.d);
    r->step_s = end;
    plan_finish_times(r, r->step_s);
    return FF_OK;
}

/* FLOPs of one step: every product of the list (forward, backward, the
 * attention) per image, 2 k n per row of a product, the dI product only
 * where a layer has an input gradient; the attention's QK^T and PV, 4 px^2
 * head per head forward and twice that backward. */
double ff_plan_unet_flops(const ff_unet_config *c, int64_t batch)
{
    ulist l = {0};
    double f = 0;
    if (build(c, &l) == FF_OK)
        for (int i = 0; i < l.n; i++) {
            const uop *u = &l.op[i];
            if (u->kind == U_LIN)
                f += (2.0 + 2.0 * (u->dinp ? 2 : 1)) * (double)u->px * (double)u->k * (double)u->n;
            else if (u->kind == U_ATTN)
                f += 12.0 * (double)u->heads * (double)u->px * (double)u->px * (double)u->head;
        }
    free(l.op);
    return f * (double)batch;
}

int plan_unet_eval(const ff_plan_config *cfg, ff_dims g, ff_plan_result *r, plan_ops *ops,
                   char *err, size_t len)
{
    int rc = evaluate(cfg, g, r, ops, (ff_dims){0, 0, 0, 0}, NULL, err, len);
    r->model_flops = ff_plan_unet_flops(&cfg->model.unet, cfg->batch);
    if (rc == FF_OK && !r->rejected && r->step_s > 0) {
        r->flops_per_rank_s = r->model_flops / plan_group_size(g, FF_GROUP_WORLD) / r->step_s;
        r->peak_fraction = r->flops_per_rank_s / cfg->machine.peak_flops;
    }
    return rc;
}

int plan_unet_traffic(const ff_plan_config *cfg, ff_dims g, ff_dims coords,
                      ff_plan_coll out[FF_PLAN_NGROUPS][FF_NCOLL], char *err, size_t len)
{
    ff_plan_result *r = calloc(1, sizeof *r);
    if (!r)
        return ff_format_error(err, len, FF_ENOMEM, "out of memory");
    plan_ops ops = {0};
    int rc = evaluate(cfg, g, r, &ops, coords, out, err, len);
    plan_ops_free(&ops);
    free(r);
    return rc;
}
