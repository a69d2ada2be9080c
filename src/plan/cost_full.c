/* The full cost model: placement-aware links, ring collectives with latency,
 * compute from the GEMM rate with a shape-dependent efficiency, the overlap
 * schedule played on a timeline, and memory per rank (docs/design.md §6). */
#include <float.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h" /* ff_ring_volume: the counters' own formula */
#include "plan/plan_internal.h"

void plan_reject(ff_plan_result *r, const char *fmt, ...)
{
    size_t used = strlen(r->reason);
    if (used + 3 >= sizeof r->reason)
        return;
    if (r->rejected)
        used += (size_t)snprintf(r->reason + used, sizeof r->reason - used, "; ");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(r->reason + used, sizeof r->reason - used, fmt, ap);
    va_end(ap);
    r->rejected = 1;
}

/* ---- groups and placement ---- */

int plan_group_size(ff_dims g, ff_group_kind kind)
{
    switch (kind) {
    case FF_GROUP_X: return g.x;
    case FF_GROUP_Y: return g.y;
    case FF_GROUP_Z: return g.z;
    case FF_GROUP_D: return g.d;
    case FF_GROUP_ZD: return g.z * g.d;
    case FF_GROUP_TP: return g.x * g.y * g.z;
    case FF_GROUP_PIPE: return 1; /* a grid is one stage's; stages.c adds the pipe */
    default: return g.x * g.y * g.z * g.d;
    }
}

int plan_group_rank(ff_dims g, ff_dims c, ff_group_kind kind)
{
    switch (kind) {
    case FF_GROUP_X: return c.x;
    case FF_GROUP_Y: return c.y;
    case FF_GROUP_Z: return c.z;
    case FF_GROUP_D: return c.d;
    case FF_GROUP_ZD: return c.z + g.z * c.d;
    case FF_GROUP_TP: return c.x + g.x * (c.y + g.y * c.z);
    case FF_GROUP_PIPE: return 0;
    default: return c.x + g.x * (c.y + g.y * (c.z + g.z * c.d));
    }
}

/* Members of a group are `inner` ranks apart (the product of the sizes of
 * the groups nested inside it, X innermost). */
static int64_t group_inner(ff_dims g, ff_group_kind kind)
{
    switch (kind) {
    case FF_GROUP_Y: return g.x;
    case FF_GROUP_Z:
    case FF_GROUP_ZD: return (int64_t)g.x * g.y;
    case FF_GROUP_D: return (int64_t)g.x * g.y * g.z;
    default: return 1; /* X, TP, WORLD */
    }
}

/* Paper §V-B / dissertation eq. 5.7: a group whose span inner*size fits in a
 * node uses the measured intra-node bandwidth of (inner, size); otherwise the
 * node's inter-node bandwidth is shared by min(ranks_per_node, inner) rings.
 * With a span that does not tile the node (3 ranks of a 4-rank node), some
 * groups straddle two nodes; unless paper_rule is set they are treated as
 * spanning nodes, since a collective is as slow as its slowest group. */
/* Across nodes: the node's injection bandwidth shared by the groups that
 * leave it at once, min(ranks_per_node, inner) of them. */
static void inter_link(const ff_profile *p, ff_plan_link *l)
{
    int64_t rpn = p->ranks_per_node;
    l->alpha_s = p->alpha_inter_s;
    l->beta_Bps = p->beta_inter_Bps / (double)(l->inner < rpn ? l->inner : rpn);
}

ff_plan_link plan_link(const ff_profile *p, int ranks, int64_t inner, int size, int paper_rule)
{
    ff_plan_link l;
    memset(&l, 0, sizeof l);
    l.size = size;
    l.inner = inner;
    int64_t rpn = p->ranks_per_node, span = inner * size;
    if (paper_rule)
        l.intra = span <= rpn;
    else
        l.intra = ranks <= rpn || (span <= rpn && rpn % span == 0);
    if (l.intra) {
        l.alpha_s = p->alpha_intra_s;
        l.beta_Bps = p->beta_intra_Bps;
        for (int i = 0; i < p->n_intra_bw; i++)
            if (p->intra_bw[i].inner == inner && p->intra_bw[i].size == size)
                l.beta_Bps = p->intra_bw[i].Bps;
    } else {
        inter_link(p, &l);
    }
    return l;
}

/* The expert groups' sizes, ranks and strides (plan.h: EP is Ge
 * consecutive ranks of D, EDP the D/Ge ranks Ge apart); ge 1: EP is one
 * rank, EDP all of D. */
static int expert_size(ff_dims g, int ge, int kind)
{
    return kind == FF_PLAN_GROUP_EP ? ge : g.d / ge;
}
static int expert_rank(ff_dims c, int ge, int kind)
{
    return kind == FF_PLAN_GROUP_EP ? c.d % ge : c.d / ge;
}
static int64_t expert_inner(ff_dims g, int ge, int kind)
{
    return group_inner(g, FF_GROUP_D) * (kind == FF_PLAN_GROUP_EP ? 1 : ge);
}

void plan_links(const ff_profile *p, ff_dims g, int ge, int paper_rule,
                ff_plan_link out[FF_PLAN_NGROUPS])
{
    int ranks = plan_group_size(g, FF_GROUP_WORLD);
    for (int k = 0; k < FF_NGROUPS; k++)
        out[k] = plan_link(p, ranks, group_inner(g, (ff_group_kind)k),
                           plan_group_size(g, (ff_group_kind)k), paper_rule);
    for (int k = FF_NGROUPS; k < FF_PLAN_NGROUPS; k++)
        out[k] = plan_link(p, ranks, expert_inner(g, ge, k), expert_size(g, ge, k), paper_rule);
}

void plan_links_staged(const ff_profile *p, ff_dims g, int P, ff_plan_link out[FF_PLAN_NGROUPS])
{
    const int G = plan_group_size(g, FF_GROUP_WORLD), world = G * P, rpn = p->ranks_per_node;
    /* stage s is ranks [s G, (s+1) G): its groups tile nodes as a lone
     * grid's do only if the stages do (G a multiple or divisor of a node) */
    const int aligned = world <= rpn || G % rpn == 0 || rpn % G == 0;
    for (int k = 0; k < FF_NGROUPS; k++) {
        out[k] = plan_link(p, world, group_inner(g, (ff_group_kind)k),
                           plan_group_size(g, (ff_group_kind)k), 0);
        if (!aligned && out[k].intra && out[k].size > 1) {
            out[k].intra = 0;
            inter_link(p, &out[k]);
        }
    }
    out[FF_GROUP_WORLD] = plan_link(p, world, 1, world, 0);
    out[FF_GROUP_PIPE] = plan_link(p, world, G, P, 0);
    for (int k = FF_NGROUPS; k < FF_PLAN_NGROUPS; k++) /* (no experts with stages) */
        out[k] = plan_link(p, world, expert_inner(g, 1, k), expert_size(g, 1, k), 0);
}

/* Ring algorithms (the collective layer's default): all-gather and
 * reduce-scatter take p-1 steps of `count` elements; all-reduce 2(p-1) steps
 * of a chunk of count/p, the largest chunk setting the pace. The layer's
 * automatic choice (issue 7) also runs recursive doubling/halving where it
 * moves exactly the ring's bytes (p a power of two; for all-reduce, p
 * dividing count): the same volume in lg p steps, so only the latency term
 * changes. The faster of the two is the prediction, unless AUTO runs the
 * all-reduce as rec-whole (`whole`, plan_whole): lg p steps of the whole
 * vector, two more for the fold of a p that is not a power of two. */
double plan_ring_time(const ff_plan_link *l, ff_coll coll, int p, int64_t count, int wire)
{
    int ar = coll == FF_COLL_ALLREDUCE;
    double step_elems = ar ? (double)((count + p - 1) / p) : (double)count;
    double steps = ar ? 2.0 * (p - 1) : (double)(p - 1);
    return steps * (l->alpha_s + step_elems * wire / l->beta_Bps);
}

double plan_coll_time(const ff_plan_link *l, ff_coll coll, int p, int64_t count, int wire,
                      int whole)
{
    if (p <= 1)
        return 0;
    int ar = coll == FF_COLL_ALLREDUCE;
    if (ar && whole) {
        int lg = 0;
        while ((2 << lg) <= p)
            lg++;
        int steps = lg + ((1 << lg) < p ? 2 : 0);
        return steps * (l->alpha_s + (double)count * wire / l->beta_Bps);
    }
    double step_elems = ar ? (double)((count + p - 1) / p) : (double)count;
    double steps = ar ? 2.0 * (p - 1) : (double)(p - 1);
    double ring = plan_ring_time(l, coll, p, count, wire);
    if ((p & (p - 1)) == 0 && (!ar || count % p == 0)) {
        int lg = 0;
        while ((1 << lg) < p)
            lg++;
        double rec =
            (ar ? 2.0 * lg : (double)lg) * l->alpha_s + steps * step_elems * wire / l->beta_Bps;
        if (rec < ring)
            return rec;
    }
    return ring;
}

/* ---- which algorithm AUTO runs ----
 * The collective layer picks per call by its cost model (ff_coll_pick,
 * comm/select.c), which reads the group's node layout. Ranks are numbered X
 * innermost (grid.h) and nodes hold machine.ranks_per_node consecutive
 * ranks, so the group of kind k through a rank has members base + i*inner.
 * Only all-reduces are asked: under the default rule (strict_volume) every
 * all-gather and reduce-scatter AUTO may run moves the ring's bytes, and
 * their time is plan_coll_time's. */

/* A group layout and AUTO's all-reduce picks on it so far (count, wire ->
 * rec-whole or not; a step repeats the same collectives for every
 * micro-batch, so the picks, each a run of the collective layer's model,
 * are looked up instead: open addressing, MEMO slots, count -1 free). */
enum { MEMO = 256 };
struct plan_topo {
    int p;
    int64_t inner, base;
    ff_topo *t;
    struct plan_topo *next;
    struct {
        int64_t count;
        int wire, whole;
    } memo[MEMO];
    int memo_used;
};

void plan_topos_free(plan_ops *ops)
{
    while (ops->topos) {
        struct plan_topo *e = ops->topos;
        ops->topos = e->next;
        ff_topo_free(e->t);
        free(e);
    }
    memset(ops->last, 0, sizeof ops->last);
}

/* Size of the rank's group of `kind` and its index in it, with the stages
 * of ops (WORLD spans them; PIPE is the rank's column across them). */
static int staged_size(const plan_ops *ops, ff_dims g, ff_group_kind kind)
{
    int P = ops->P > 1 ? ops->P : 1;
    if ((int)kind >= FF_NGROUPS)
        return expert_size(g, ops->ge > 1 ? ops->ge : 1, (int)kind);
    if (kind == FF_GROUP_WORLD)
        return plan_group_size(g, kind) * P;
    return kind == FF_GROUP_PIPE ? P : plan_group_size(g, kind);
}

static int staged_rank(const plan_ops *ops, ff_dims g, ff_dims c, ff_group_kind kind)
{
    int G = plan_group_size(g, FF_GROUP_STAGE), in_stage = plan_group_rank(g, c, FF_GROUP_WORLD);
    if ((int)kind >= FF_NGROUPS)
        return expert_rank(c, ops->ge > 1 ? ops->ge : 1, (int)kind);
    if (kind == FF_GROUP_WORLD)
        return ops->stage * G + in_stage;
    return kind == FF_GROUP_PIPE ? ops->stage : plan_group_rank(g, c, kind);
}

/* The layout of the rank's group of `kind`; NULL if out of memory. */
static struct plan_topo *plan_topo(plan_ops *ops, const ff_plan_config *cfg, ff_dims g, ff_dims c,
                                   ff_group_kind kind)
{
    int p = staged_size(ops, g, kind), G = plan_group_size(g, FF_GROUP_STAGE);
    int64_t inner = kind == FF_GROUP_PIPE ? G
                    : (int)kind >= FF_NGROUPS
                        ? expert_inner(g, ops->ge > 1 ? ops->ge : 1, (int)kind)
                        : group_inner(g, kind);
    int64_t rpn = cfg->machine.ranks_per_node;
    int64_t base = staged_rank(ops, g, c, FF_GROUP_WORLD) - staged_rank(ops, g, c, kind) * inner;
    for (struct plan_topo *e = ops->topos; e; e = e->next)
        if (e->p == p && e->inner == inner && e->base == base)
            return e;
    struct plan_topo *e = calloc(1, sizeof *e);
    int *node = malloc((size_t)p * sizeof *node);
    if (e && node) {
        /* node ids 0, 1, ... (a member's node never precedes the one
         * before it's), so that ff_topo_new's id range is at most p */
        int64_t prev = base / rpn;
        node[0] = 0;
        for (int i = 1; i < p; i++) {
            int64_t n = (base + i * inner) / rpn;
            node[i] = node[i - 1] + (n != prev);
            prev = n;
        }
        e->t = ff_topo_new(node, p, 0);
    }
    free(node);
    if (!e || !e->t) {
        free(e);
        return NULL;
    }
    e->p = p, e->inner = inner, e->base = base;
    for (int i = 0; i < MEMO; i++)
        e->memo[i].count = -1;
    e->next = ops->topos;
    ops->topos = e;
    return e;
}

/* 1 if AUTO runs the collective `op` of the rank at c as rec-whole; -1 if
 * out of memory. */
static int plan_whole(plan_ops *ops, const ff_plan_config *cfg, ff_dims g, ff_dims c,
                      const plan_op *op)
{
    if (op->coll != FF_COLL_ALLREDUCE || staged_size(ops, g, (ff_group_kind)op->group) <= 1)
        return 0;
    /* the layout the group kind found last, if for the same rank of the
     * same grid (a list repeats its groups), else the kept layouts' */
    const int k = op->group;
    struct plan_topo *e = ops->last[k];
    if (!e || memcmp(&ops->lg[k], &g, sizeof g) || memcmp(&ops->lc[k], &c, sizeof c) ||
        ops->lstage[k] != ops->stage || ops->lP[k] != ops->P || ops->lge[k] != ops->ge) {
        if (!(e = plan_topo(ops, cfg, g, c, (ff_group_kind)op->group)))
            return -1;
        ops->last[k] = e, ops->lg[k] = g, ops->lc[k] = c;
        ops->lstage[k] = ops->stage, ops->lP[k] = ops->P, ops->lge[k] = ops->ge;
    }
    /* the pick depends on the layout, the count and the wire (and the
     * configuration's model, the same for the whole plan) */
    unsigned h =
        (unsigned)((((uint64_t)op->count * 2 + (op->wire == 2)) * 0x9E3779B97F4A7C15ull) >> 56) %
        MEMO; /* (the high bits: counts have many trailing zeros) */
    for (int i = 0; i < MEMO; i++, h = (h + 1) % MEMO) {
        if (e->memo[h].count == op->count && e->memo[h].wire == op->wire)
            return e->memo[h].whole;
        if (e->memo[h].count < 0)
            break;
    }
    /* the default rule, strict_volume; the ~4 KB model (its picks) is
     * copied only where the configuration says otherwise */
    const ff_coll_model *m = &cfg->coll;
    ff_coll_model strict;
    if (!m->strict_volume) {
        strict = *m;
        strict.strict_volume = 1;
        m = &strict;
    }
    ff_wire w = op->wire == 2 ? FF_WIRE_BF16 : FF_WIRE_FP32;
    int whole = ff_coll_pick(e->t, m, FF_COLL_ALLREDUCE, (size_t)op->count, w) == FF_ALGO_REC_WHOLE;
    if (e->memo[h].count < 0 &&
        e->memo_used < MEMO / 2) { /* (h: a free slot, or the table is full) */
        e->memo[h].count = op->count, e->memo[h].wire = op->wire, e->memo[h].whole = whole;
        e->memo_used++;
    }
    return whole;
}

/* ---- compute ---- */

double plan_gemm_rate(const ff_profile *p, double busy_ranks)
{
    double rate = p->gemm_flops;
    if (p->cores_per_node > 0 && busy_ranks > p->cores_per_node)
        rate *= (double)p->cores_per_node / busy_ranks; /* ranks share the cores */
    return rate;
}

/* Efficiency of a GEMM of (m x k)(k x n): 1 / (1 + h/m + h/n + h/k), a
 * smooth penalty for thin dimensions (h = gemm_half_dim; 0 = always 1). */
static double gemm_efficiency(const ff_profile *p, int64_t m, int64_t n, int64_t k)
{
    double h = p->gemm_half_dim;
    if (m < 1 || n < 1 || k < 1)
        return 1;
    return 1.0 / (1.0 + h / (double)m + h / (double)n + h / (double)k);
}

double plan_gemm_time(const ff_profile *p, double rate, double flops, int64_t m, int64_t n,
                      int64_t k, int calls)
{
    if (!(flops > 0))
        return 0; /* an empty product (an expert without rows) is not called */
    return calls * p->gemm_call_s + flops / (rate * gemm_efficiency(p, m, n, k));
}

/* ---- checks ---- */

int plan_check_divides(const ff_plan_config *cfg, ff_dims g, ff_plan_result *r)
{
    const ff_model *md = &cfg->model;
    int64_t C = md->hidden, Vp = ff_model_padded_vocab(md), B = cfg->batch;
    int64_t zd = (int64_t)g.z * g.d;
    if (B % zd)
        plan_reject(r, "batch %lld does not divide over Gz*Gd = %lld", (long long)B, (long long)zd);
    else if ((B / zd) % cfg->micro_batches)
        plan_reject(r, "the %lld sequences per rank do not split into %d micro-batches",
                    (long long)(B / zd), cfg->micro_batches);
    if (C % g.x)
        plan_reject(r, "hidden size %lld does not divide over Gx = %d", (long long)C, g.x);
    if (C % g.y)
        plan_reject(r, "hidden size %lld does not divide over Gy = %d", (long long)C, g.y);
    if (md->heads % g.x)
        plan_reject(r, "the %d heads do not divide over Gx = %d", md->heads, g.x);
    if (Vp % g.x)
        plan_reject(r, "padded vocabulary %lld does not divide over Gx = %d", (long long)Vp, g.x);
    if (md->experts > 0) {
        int ge = cfg->expert_parallel > 1 ? cfg->expert_parallel : 1;
        if (g.d % ge)
            plan_reject(r, "expert parallelism %d does not divide Gd = %d", ge, g.d);
        if (md->experts % ge)
            plan_reject(r, "expert parallelism %d does not divide the %d experts", ge, md->experts);
    }
    if (C % g.x == 0 && C % g.y == 0 && Vp % g.x == 0) {
        /* each weight block W_yx is cut into Gz equal pieces (docs/design.md §3) */
        static const char *const names[4] = {"QKV", "attention projection", "MLP", "wte"};
        int64_t xy = (int64_t)g.x * g.y;
        int64_t block[4] = {3 * C * C / xy, C * C / xy, 4 * C * C / xy, Vp * C / xy};
        for (int i = 0; i < 4; i++)
            if (block[i] % g.z) {
                plan_reject(r,
                            "the %s weight block of %lld elements does not split into Gz = %d "
                            "pieces",
                            names[i], (long long)block[i], g.z);
                break;
            }
    }
    return r->rejected;
}

void plan_shape_init(const ff_plan_config *cfg, ff_dims g, plan_shape *s)
{
    const ff_model *md = &cfg->model;
    memset(s, 0, sizeof *s);
    s->g = g;
    s->L = md->layers;
    s->C = md->hidden;
    s->NH = md->heads;
    s->hd = md->hidden / md->heads;
    s->Vp = ff_model_padded_vocab(md);
    s->T = cfg->seq;
    s->positions = md->max_seq > 0 ? md->max_seq : cfg->seq;
    s->micro = cfg->micro_batches;
    s->b_mb = cfg->batch / ((int64_t)g.z * g.d) / cfg->micro_batches;
    s->m = s->b_mb * s->T;
    s->act = ff_plan_precision(cfg) == FF_PLAN_BF16_MIXED ? 2 : 4;
    /* the data-parallel buckets' and experts' tokens': bf16-mixed reduces
     * gradients in fp32 (docs/design.md §13); its layers' gathers
     * and activations are bf16 (plan_layer_opts) */
    s->wire = s->act == 2 ? 4 : cfg->wire_bytes;
    s->overlap = cfg->overlap;
    s->plan = cfg->layers;
    /* the run's panels: forced by the configuration, else the plan's */
    s->panel_rows = cfg->panel_rows > 0 ? cfg->panel_rows
                    : cfg->layers       ? cfg->layers->panel_rows
                                        : 0;
    s->cmm = cfg->cmm;
    s->rs_cmm = cfg->rs_cmm;
    s->P = 1, s->stage = 0, s->first = s->last = 1;
    s->l0 = 0, s->nb = s->L;
    s->ge = s->el = 1;
    if (md->experts > 0) {
        s->E = md->experts;
        s->every = md->expert_every;
        s->top_k = md->top_k;
        s->ge = cfg->expert_parallel > 1 ? cfg->expert_parallel : 1;
        s->el = s->E / s->ge;
        /* src/nn/moe.c's capacity, and the all-to-all blocks of
         * src/nn/gpt.c: a sequence sends an expert at most min(cap, T) */
        double x = md->capacity_factor * s->top_k * (double)s->T / s->E;
        s->cap = (int64_t)ceil(x - 4 * FLT_EPSILON * x);
        s->R = s->b_mb * (s->cap < s->T ? s->cap : s->T);
        s->ch = (s->R + g.x - 1) / g.x;
        s->dtd = cfg->dtd && s->ge > 1 && g.x > 1;
    }
    s->cac = cfg->cac != 0; /* (every checkpointed block, dense or not) */
    s->keep = 1.0 - cfg->sparsity;
    s->samo = cfg->samo && cfg->sparsity > 0;
    s->zero = g.d > 1 ? cfg->zero : 0;
    s->zero_overlap = s->zero && !cfg->zero_blocking && s->P == 1;
    s->fused_attn = cfg->machine.attention_fused != 0;
}

/* Memory of one rank, bytes, for the shape's checkpointing and AG cache
 * (or its plan's, per block and layer). fp32 everywhere: parameters,
 * gradients, AdamW's two moments; gathered weights (only when Gz > 1; with
 * Gz = 1 a layer uses its shard); activations as llm.c keeps them, in the
 * 4D layouts. With stages, the stage's blocks; a stage before the last
 * keeps the activations of K micro-batches (its slots), the last one set
 * (its backward follows at once) and K inputs (src/nn/gpt.c). */
/* Block l's weights in units of C^2/(Gx Gy): QKV 3, projection 1, MLP 4
 * and 4 (12), or an MoE block's el experts' 8 each. */
static int64_t block_units(const plan_shape *s, int64_t l)
{
    return plan_block_moe(s, l) ? 4 + 8 * (int64_t)s->el : 12;
}

/* Gathered weights held at once, in units (block_units): the AG-cached
 * layers (kept from the forward to the backward), and the block being
 * recomputed or run backward and the next one (OAG), at most every block. */
static int64_t gathered_units(const plan_shape *s, int64_t cached)
{
    /* MoE blocks: those of [l0, l0 + nb) with (l + 1) a multiple of K */
    const int64_t n_moe = s->E ? (s->l0 + s->nb) / s->every - s->l0 / s->every : 0;
    const int64_t u_moe = 4 + 8 * (int64_t)s->el, n_dense = s->nb - n_moe;
    const int64_t total = n_moe * u_moe + n_dense * 12;
    int64_t widest = n_dense > 0 ? 12 : 0;
    widest = n_moe > 0 && u_moe > widest ? u_moe : widest;
    return cached + 2 * widest < total ? cached + 2 * widest : total;
}

void plan_memory(const plan_shape *s, ff_plan_result *r)
{
    double gx = s->g.x, gy = s->g.y, C = (double)s->C, m = (double)s->m;
    const int64_t l1 = s->l0 + s->nb;
    static const int units[FF_BLOCK_LAYERS] = {3, 1, 4, 4};
    int64_t cached_units = 0;
    for (int64_t l = s->l0; l < l1; l++) {
        for (int i = 0; i < FF_BLOCK_LAYERS; i++) {
            ff_layer_opts o;
            plan_layer_opts(s, l, i, &o);
            /* (an MoE block's experts: el of each MLP layer) */
            cached_units +=
                o.ag_cache ? units[i] * (i >= 2 && plan_block_moe(s, l) ? s->el : 1) : 0;
        }
    }
    /* fp32: parameter, gradient, two moments; bf16-mixed as the run keeps
     * them (docs/design.md §13): the fp32 master, a copy of the Z-sharded
     * weights in 2 bytes each (in whole floats: src/nn/gpt_precision.c),
     * fp32 gradients, two fp32 moments. (Its activations and gathered
     * buffers below are counted in 2 bytes, as a GPU run would keep them;
     * the CPU run keeps only the products' inputs so, docs/design.md §13.) */
    const int64_t zsharded = plan_zsharded_params(s);
    double params = (double)(zsharded + plan_other_params(s)), a = s->act;
    r->mem_params = 4 * params + (a == 2 ? 4 * (double)((zsharded + 1) / 2) : 0);
    r->mem_grads = 4 * params;
    r->mem_optimizer = 8 * params;
    if (s->zero) /* the moments of the largest slices; in bf16-mixed the master's too */
        r->mem_optimizer = 8 * plan_optimizer_entries(s);
    if (s->zero && a == 2)
        r->mem_params = 4 * plan_optimizer_entries(s) + 4 * (double)((zsharded + 1) / 2);
    r->mem_mask = 0;
    if (s->keep < 1) {
        /* a pruned model (docs/samo.md): the blocks' matrices keep f of
         * their entries, the embedding all of its */
        const double matrices = (double)plan_block_matrices(s);
        const double kept = params - (1 - s->keep) * matrices;
        if (s->samo) { /* the state of the kept entries, 32-bit offsets to the
                          matrices' (the embedding, kept whole, stays dense) */
            r->mem_params = 4 * params;
            r->mem_grads = 4 * kept;
            r->mem_optimizer = 8 * kept;
            r->mem_mask = 4 * s->keep * matrices;
            if (a == 2) { /* bf16-mixed as fourfold runs it (docs/samo.md): the
                             fp32 master and gradients of the kept entries,
                             the uncompressed copy of the Z-sharded weights */
                r->mem_params =
                    (double)FF_BF16_COPY_BYTES * (double)plan_zsharded_params(s) + 4 * kept;
            }
            if (s->zero) { /* docs/samo.md "SAMO with ZeRO": the kept entries
                              bucket by bucket, the moments' (and bf16-mixed
                              master's) largest slices, the staging vector of
                              the gathers after AdamW (4 or 2 bytes an entry) */
                const double k = (double)plan_samo_kept(s), e = plan_optimizer_entries(s);
                r->mem_grads = 4 * (params - (double)plan_block_matrices(s) + k);
                r->mem_optimizer = 8 * e;
                r->mem_mask = 4 * k;
                r->mem_params = a == 2 ? 4 * e + 4 * (double)((zsharded + 1) / 2) +
                                             4 * (double)((plan_samo_kept(s) + 1) / 2)
                                       : 4 * params + 4 * k;
            }
        } else { /* a mask of every parameter; the packed all-reduces' offsets and values */
            const double zk = (double)plan_zsharded_params(s) - (1 - s->keep) * matrices;
            r->mem_mask = 4 * params + (s->g.d > 1 ? 8 * zk : 0);
        }
    }
    double buffers = 0;
    if (s->g.z > 1) {
        double wte = (double)s->Vp * C / (gx * gy);
        double gathered = (double)gathered_units(s, cached_units) * C * C / (gx * gy);
        /* gradients before the reduce-scatter: the LM head's, kept until the
         * embedding's backward adds to it, and two layers in flight (ORS) */
        double dw = (s->first || s->last ? wte : 0) + 2 * 4 * C * C / (gx * gy);
        buffers = a * ((s->first || s->last ? wte : 0) + gathered + dw);
    } else if (s->samo) {
        /* SAMO with Gz = 1: a layer's products accumulate on a dense block
         * expanded from its compressed gradient (src/nn/linear.c), one at a
         * time, the widest 4C x C (fp32 gradients, in bf16-mixed too) */
        buffers = 4 * 4 * C * C / (gx * gy);
    }
    r->mem_weight_buffers = buffers;
    /* per block: ln1, projection output, residual, ln2, MLP output, residual
     * in layout Y (6C/Gy); qkv, attention output, MLP hidden before and after
     * GELU in layout X (12C/Gx); 4 LayerNorm statistics per row; the
     * attention probabilities of the rank's heads (T x T per head), or with
     * a fused kernel each row's log-sum-exp (T per head) */
    double heads = (double)s->b_mb * (double)(s->NH / s->g.x);
    double attn = heads * (double)s->T * (s->fused_attn ? 1.0 : (double)s->T);
    /* what every block keeps, and a dense block's MLP hidden (8C/Gx) */
    double common = m * (6 * C / gy + 4 * C / gx + 4) + attn, mlp = m * 8 * C / gx;
    double block_acts = common + mlp;
    /* an MoE block (src/nn/gpt_moe.c): in place of the MLP hidden, the
     * router's probabilities (E per row), each assignment's choice, row,
     * gate and token (6 values), and the experts' rows: input and output
     * (C/Gy each, as all-to-all blocks of E R rows with expert
     * parallelism), hidden before and after GELU (4C/Gx each) */
    double own = s->E ? (s->ge > 1 ? (double)(s->E * s->R) : m * s->top_k) : 0;
    double experts = m * (s->E + 6.0 * s->top_k) + own * (2 * C / gy + 8 * C / gx);
    /* what a recompute produces (under CAC a checkpointed block keeps the
     * rest, its collectives' outputs): the LayerNorms' outputs, attention's
     * and the GELU's */
    double redo = m * 2 * C / gy + m * C / gx + attn, redo_mlp = m * 4 * C / gx;
    double redo_experts = own * 4 * C / gx;
    double kept = 0;
    int ckpt_dense = 0, ckpt_moe = 0;
    for (int64_t l = s->l0; l < l1; l++) {
        int moe = plan_block_moe(s, l), ckpt = plan_block_checkpoint(s, l);
        double acts = common + (moe ? experts : mlp);
        if (!ckpt)
            kept += acts;
        else if (s->cac)
            kept += acts - redo - (moe ? redo_experts : redo_mlp);
        else
            kept += m * C / gy;
        ckpt_dense |= ckpt && !moe;
        ckpt_moe |= ckpt && moe;
    }
    /* the checkpointed blocks' shared set, the fields of each kind of
     * block it serves (src/nn/gpt.c): what a recompute produces under CAC,
     * else a whole block's */
    double kept_shared = 0;
    if (ckpt_dense || ckpt_moe)
        kept_shared = s->cac ? redo + ckpt_dense * redo_mlp + ckpt_moe * redo_experts
                             : common + ckpt_dense * mlp + ckpt_moe * experts;
    /* encoded (the first stage), lnf and logits (the last) */
    double head =
        m * ((double)s->first * C / gy + (double)s->last * (C / gy + 2 + (double)s->Vp / gx));
    /* one block's gradients, the residual's; with experts their scratch
     * (src/nn/gpt.c: the rows' gradients, one expert's hidden gradient,
     * d ln2, the router's partial logits and their Y gather, the gates'
     * gradients, the all-to-all blocks and DTD's gathers) */
    double work = block_acts + m * C / gy;
    if (s->E) {
        double wide = s->E > s->top_k ? s->E : s->top_k;
        double one = s->ge > 1 && (double)(s->ge * s->R) > m ? (double)(s->ge * s->R) : m;
        work += own * C / gy + one * 4 * C / gx + m * C / gy + m * wide * (gy > 1 ? gy + 1 : 1) +
                m * s->top_k +
                (s->ge > 1 ? (double)(2 * s->E * s->R) * C / gy +
                                 (s->dtd ? (double)(gx * s->E * s->ch) * C / gy : 0)
                           : 0);
    }
    /* a block with checkpointing keeps its input, and they share one set
     * of activations for the recompute; the others keep theirs, per slot */
    double slots = s->P > 1 && !s->last ? s->slots : 1;
    double stored = slots * kept + kept_shared;
    /* with stages, (m, C/Gy) buffers: the gradients to and from the
     * neighbours, K each way; the block inputs and outputs of K slots
     * beyond the one set counted above (src/nn/gpt.c: K (nb + 1) sets of
     * residuals, or K + nb on the last stage) */
    double K = s->slots, sets = s->P > 1 ? K * (!s->first + !s->last) + (s->last ? K - 1 : K) : 0;
    double messages = sets * m * C / gy;
    r->mem_activations = a * (stored + head + work + messages);
    r->mem_total = r->mem_params + r->mem_grads + r->mem_optimizer + r->mem_weight_buffers +
                   r->mem_activations + r->mem_mask;
}

int plan_fit_memory(const ff_plan_config *cfg, ff_dims g, ff_plan_result *r, plan_shape *s)
{
    double avail = cfg->machine.memory_bytes;
    int L = cfg->model.layers;
    if (s->plan) {
        /* reported: checkpointing if a block has it, and the blocks whose
         * four layers are all cached */
        s->checkpoint = s->ag_cache = 0;
        for (int l = 0; l < L; l++) {
            const ff_block_opts *b = &s->plan->blocks[l];
            s->checkpoint |= b->checkpoint;
            s->ag_cache += b->layer[0].ag_cache && b->layer[1].ag_cache && b->layer[2].ag_cache &&
                           b->layer[3].ag_cache;
        }
        plan_memory(s, r);
        goto done;
    }
    if (cfg->checkpoint == 0 || cfg->checkpoint == FF_PLAN_AUTO) {
        /* the AG cache applies without checkpointing too (the model keeps a
         * gathered weight from the forward to the backward only for cached
         * layers); automatic: every block, the model's default */
        s->checkpoint = 0;
        if (g.z == 1 || cfg->ag_cache == FF_PLAN_AUTO)
            s->ag_cache = g.z == 1 ? 0 : L;
        else
            s->ag_cache = cfg->ag_cache < L ? cfg->ag_cache : L;
        plan_memory(s, r);
        if (r->mem_total <= avail || cfg->checkpoint == 0)
            goto done;
    }
    s->checkpoint = 1;
    if (g.z == 1) {
        s->ag_cache = 0; /* nothing is gathered */
    } else if (cfg->ag_cache == FF_PLAN_AUTO) {
        /* as many blocks as fit, the last first: each cached block adds
         * its gathered weights beyond the two blocks' the recompute holds
         * anyway (gathered_units) */
        s->ag_cache = 0;
        plan_memory(s, r);
        if (r->mem_total <= avail) {
            double unit = s->act * (double)s->C * (double)s->C / ((double)g.x * g.y);
            double room = floor((avail - r->mem_total) / unit); /* in units */
            int64_t base = gathered_units(s, 0), cached = 0;
            for (int c = 1; c <= L; c++) {
                cached += block_units(s, L - c);
                if ((double)(gathered_units(s, cached) - base) > room)
                    break;
                s->ag_cache = c;
            }
        }
    } else {
        s->ag_cache = cfg->ag_cache < L ? cfg->ag_cache : L;
    }
    plan_memory(s, r);
done:
    r->checkpoint = s->checkpoint;
    r->ag_cache = s->ag_cache;
    r->micro_batches = s->micro;
    if (r->mem_total > avail) {
        plan_reject(r, "needs %.1f GiB per rank%s, more than the %.1f GiB available",
                    r->mem_total / PLAN_GIB,
                    s->plan         ? " with the per-layer plan"
                    : s->checkpoint ? " with activation checkpointing"
                                    : " without checkpointing",
                    avail / PLAN_GIB);
        return 0;
    }
    return 1;
}

/* ---- the timeline ---- */

typedef struct {
    const ff_plan_config *cfg;
    plan_ops *ops; /* the layouts plan_whole asks about (rank 0's groups) */
    ff_dims g;
    const ff_profile *prof;
    const ff_plan_link *link;
    double rate;
    double cursor; /* the rank's own thread */
    /* lower bounds of the step: what the thread spends whatever the
     * channels do (compute, the blocking collectives and the CPU's share
     * of the others, OAR's max with its GEMM: cursor without the waits),
     * and the background channel's busy time (the step waits for it all) */
    double serial, bg_busy;
    double bg_free;    /* when the background channel (weights, gradients) is free */
    double chunk_free; /* when the last chunk of a decomposed all-reduce is done */
    double pending;    /* an OAR collective waiting for its GEMM */
    double cmm_s;      /* a collective matmul's gather, for the GEMM that follows */
    int cmm_p;
    /* which collective (group FF_NCOLL + kind) each wait is for, to book
     * the time the rank waits as that collective's exposed time */
    struct channel {
        double *start, *end; /* its transfers in posting order (= running order) */
        int *gc, n;
    } ch[2];              /* 0: the background channel, 1: the chunks' */
    int *tag_ch, *tag_at; /* each tag's channel and index there */
    int pending_gc, cmm_gc, cmm_prev_gc;
    double cmm_own;
    /* a reduce-scatter collective matmul's ring, for the GEMM that feeds it */
    double rs_s;
    int rs_p, rs_gc, rs_tag;
    double *tag_end; /* completion of background collectives and chunks */
    /* chunks posted but not advancing yet (progress poll or wait): their
     * tags in posting order, q_head..q_n, each with its time and collective */
    int *queue, q_head, q_n;
    double *q_time;
    int *q_gc;
} timeline;

static void expose(ff_plan_result *r, int gc, double dt)
{
    if (gc >= 0 && dt > 0)
        r->coll[gc / FF_NCOLL][gc % FF_NCOLL].exposed_s += dt;
}

/* A transfer on channel c over [start, end); returns its index. */
static int channel_add(timeline *tl, int c, double start, double end, int gc)
{
    struct channel *h = &tl->ch[c];
    h->start[h->n] = start, h->end[h->n] = end, h->gc[h->n] = gc;
    return h->n++;
}

/* The rank waits from `from` until `until` for transfer `at` of channel c:
 * books the wait to the transfers moving on the channel then, those queued
 * before it included (a channel runs one at a time, in posting order). */
static void expose_wait(timeline *tl, ff_plan_result *r, int c, int at, double from, double until)
{
    const struct channel *h = &tl->ch[c];
    for (int i = at; i >= 0 && h->end[i] > from; i--) {
        double a = h->start[i] > from ? h->start[i] : from;
        double b = h->end[i] < until ? h->end[i] : until;
        expose(r, h->gc[i], b - a);
    }
}

/* The queued chunks up to tag `upto` (-1: all) start advancing, one after
 * another on their channel, the first no earlier than `at`. */
static void start_chunks(timeline *tl, double at, int upto)
{
    while (tl->q_head < tl->q_n) {
        const int tag = tl->queue[tl->q_head++];
        double start = at > tl->chunk_free ? at : tl->chunk_free;
        tl->chunk_free = start + tl->q_time[tag];
        tl->tag_end[tag] = tl->chunk_free;
        tl->tag_ch[tag] = 1;
        tl->tag_at[tag] = channel_add(tl, 1, start, tl->chunk_free, tl->q_gc[tag]);
        if (tag == upto)
            break;
    }
}

/* Plays the step; -1 if out of memory. */
static int play(timeline *tl, const plan_ops *o, ff_plan_result *r)
{
    const int progress = tl->cfg->progress;
    const ff_profile *p = tl->prof;
    for (size_t i = 0; i < o->n; i++) {
        const plan_op *op = &o->ops[i];
        double t;
        switch (op->kind) {
        case OP_GEMM:
        case OP_ATTN: {
            /* a product in column slices (the collective matmul's shards)
             * runs at the efficiency of a slice's thinner shape */
            int64_t n = op->slices > 1 ? op->n / op->slices : op->n;
            t = plan_gemm_time(p, tl->rate, op->work, op->m, n > 0 ? n : 1, op->k,
                               op->slices > 1 ? op->slices : 1);
            if (op->kind == OP_GEMM)
                r->gemm_s += t;
            else
                r->attention_s += t;
            /* polling: the queued chunks advance from the GEMM's first
             * panel boundary, its first ff_poll */
            if (progress == FF_PROGRESS_POLL && op->kind == OP_GEMM && op->panels > 1 &&
                tl->q_head < tl->q_n)
                start_chunks(tl, tl->cursor + t * op->first, -1);
            if (tl->rs_p > 1 && op->kind == OP_GEMM) {
                /* the reduce-scatter collective matmul: p slices' products;
                 * ring step s goes out once slice s is done and step s - 1
                 * has ended (the sum it sends needs both), on the Z links
                 * once they are free; the last addition needs the last
                 * slice, the rank's own shard. The thread never waits for
                 * the ring here (src/nn/linear.c feeds it); an OAR
                 * all-reduce still runs beside the whole GEMM, below. */
                const int q = tl->rs_p;
                const double g = t / q, step = tl->rs_s / (q - 1);
                double e = tl->cursor + g > tl->bg_free ? tl->cursor + g : tl->bg_free;
                const double start = e;
                for (int s = 0; s < q - 1; s++) {
                    const double ready = tl->cursor + (s + 1) * g;
                    e = (e > ready ? e : ready) + step;
                }
                if (e < tl->cursor + t)
                    e = tl->cursor + t;
                tl->bg_free = e;
                tl->bg_busy += tl->rs_s;
                tl->tag_end[tl->rs_tag] = e;
                tl->tag_ch[tl->rs_tag] = 0;
                tl->tag_at[tl->rs_tag] = channel_add(tl, 0, start, e, tl->rs_gc);
                tl->rs_p = 0;
            }
            if (tl->cmm_p > 1 && op->kind == OP_GEMM) {
                /* the collective matmul: p slices' products, the ring's
                 * p - 1 steps beside all but the first */
                int q = tl->cmm_p;
                double g = t / q, step = tl->cmm_s / (q - 1);
                tl->cursor += g + (q - 1) * (g > step ? g : step);
                tl->serial += t;
                /* its own steps first, the channel's queue before it after */
                double wait = (q - 1) * (step - g);
                if (wait > 0) {
                    double own = wait < tl->cmm_own ? wait : tl->cmm_own;
                    expose(r, tl->cmm_gc, own);
                    expose(r, tl->cmm_prev_gc, wait - own);
                }
                tl->cmm_p = 0;
                break;
            }
            tl->cursor += tl->pending > t ? tl->pending : t; /* OAR: beside this GEMM */
            tl->serial += tl->pending > t ? tl->pending : t;
            expose(r, tl->pending_gc, tl->pending - t);
            tl->pending = 0;
            break;
        }
        case OP_ELEM:
            t = op->work / p->mem_Bps;
            if (op->optimizer)
                r->optimizer_s += t;
            else
                r->elementwise_s += t;
            tl->cursor += t;
            tl->serial += t;
            break;
        case OP_COLL: {
            if (op->coll == FF_COLL_P2P) /* the pipeline's schedule times them (stages.c) */
                break;
            const ff_plan_link *l = &tl->link[op->group];
            int whole = plan_whole(tl->ops, tl->cfg, tl->g, (ff_dims){0, 0, 0, 0}, op);
            if (whole < 0)
                return -1;
            t = plan_coll_time(l, (ff_coll)op->coll, l->size, op->count, op->wire, whole);
            if (op->cmm || op->rs_cmm) /* the engine runs it on the ring */
                t = plan_ring_time(l, (ff_coll)op->coll, l->size, op->count, op->wire);
            if (op->half) /* half a ring all-reduce: a ring RS or AG of count/p each */
                t = plan_ring_time(l, (ff_coll)op->coll, l->size,
                                   (op->count + l->size - 1) / l->size, op->wire);
            if (t <= 0)
                break;
            r->coll[op->group][op->coll].time_s += t;
            r->comm_s += t;
            /* over shared memory the transfer is the CPU's own copy: only
             * the fraction intra_overlap of it can run beside compute */
            double fixed = l->intra ? (1 - p->intra_overlap) * t : 0, free_part = t - fixed;
            const int gc = op->group * FF_NCOLL + op->coll;
            tl->cursor += fixed;
            tl->serial += fixed;
            expose(r, gc, fixed);
            if (op->rs_cmm) { /* placed by the GEMM that feeds it (above) */
                tl->rs_s = free_part;
                tl->rs_p = l->size;
                tl->rs_gc = gc;
                tl->rs_tag = op->tag;
            } else if (op->cmm) {
                struct channel *h = &tl->ch[0];
                tl->cmm_gc = gc;
                tl->cmm_prev_gc = h->n ? h->gc[h->n - 1] : -1;
                tl->cmm_own = free_part;
                /* beside the next GEMM (above), once the background
                 * channel (the Z links) is free; its wait is then free */
                double start = tl->cursor > tl->bg_free ? tl->cursor : tl->bg_free;
                tl->bg_free = start + free_part;
                tl->bg_busy += free_part;
                channel_add(tl, 0, start, tl->bg_free, gc);
                tl->cmm_s = tl->bg_free - tl->cursor;
                tl->cmm_p = l->size;
                tl->tag_end[op->tag] = 0;
            } else if (op->mode == MODE_BLOCKING) {
                tl->cursor += free_part;
                tl->serial += free_part;
                expose(r, gc, free_part);
            } else if (op->mode == MODE_OAR) {
                tl->pending = free_part;
                tl->pending_gc = gc;
            } else if (op->mode == MODE_CHUNK && progress != FF_PROGRESS_THREAD) {
                /* without a progress thread a chunk advances only in the
                 * engine's progress calls: queued until a GEMM polls, or
                 * its wait */
                tl->queue[tl->q_n++] = op->tag;
                tl->q_time[op->tag] = free_part;
                tl->q_gc[op->tag] = gc;
                tl->tag_end[op->tag] = INFINITY;
            } else if (op->mode == MODE_CHUNK) {
                /* decomposition: a layer's chunks follow one another on
                 * its X or Y links, beside the GEMMs until their waits */
                double start = tl->cursor > tl->chunk_free ? tl->cursor : tl->chunk_free;
                tl->chunk_free = start + free_part;
                tl->tag_end[op->tag] = tl->chunk_free;
                tl->tag_ch[op->tag] = 1;
                tl->tag_at[op->tag] = channel_add(tl, 1, start, tl->chunk_free, gc);
            } else {
                double start = tl->cursor > tl->bg_free ? tl->cursor : tl->bg_free;
                tl->bg_free = start + free_part;
                tl->bg_busy += free_part;
                tl->tag_end[op->tag] = tl->bg_free;
                tl->tag_ch[op->tag] = 0;
                tl->tag_at[op->tag] = channel_add(tl, 0, start, tl->bg_free, gc);
            }
            break;
        }
        case OP_WAIT:
            /* queued: the wait advances it, and while polling every chunk
             * queued after it too (they then run beside what follows);
             * progress wait advances only the one waited for */
            if (tl->tag_end[op->tag] == INFINITY)
                start_chunks(tl, tl->cursor, progress == FF_PROGRESS_WAIT ? op->tag : -1);
            if (tl->tag_end[op->tag] > tl->cursor) {
                expose_wait(tl, r, tl->tag_ch[op->tag], tl->tag_at[op->tag], tl->cursor,
                            tl->tag_end[op->tag]);
                tl->cursor = tl->tag_end[op->tag];
            }
            break;
        case OP_WAIT_ALL:
            if (tl->bg_free > tl->cursor) {
                expose_wait(tl, r, 0, tl->ch[0].n - 1, tl->cursor, tl->bg_free);
                tl->cursor = tl->bg_free;
            }
            break;
        }
    }
    tl->cursor += tl->pending;
    tl->serial += tl->pending;
    expose(r, tl->pending_gc, tl->pending);
    return 0;
}

/* Calls and bytes of one rank (what the counters record: no call and no
 * byte on a group of one; ring volumes with uneven all-reduce chunks, or
 * rec-whole's where AUTO runs it). -1 if out of memory. */
static int count_traffic(const ff_plan_config *cfg, plan_ops *o, ff_dims g, ff_dims coords,
                         ff_plan_coll out[FF_PLAN_NGROUPS][FF_NCOLL], ff_plan_coll *p2p)
{
    for (size_t i = 0; i < o->n; i++) {
        const plan_op *op = &o->ops[i];
        if (op->kind != OP_COLL)
            continue;
        if (op->coll == FF_COLL_P2P) { /* mode 0: a send, 1: a receive */
            if (p2p) {
                p2p->calls++;
                *(op->mode ? &p2p->bytes_recv : &p2p->bytes_sent) += (uint64_t)op->count * op->wire;
            }
            continue;
        }
        int p = staged_size(o, g, (ff_group_kind)op->group);
        if (p <= 1)
            continue;
        int me = staged_rank(o, g, coords, (ff_group_kind)op->group);
        int whole = plan_whole(o, cfg, g, coords, op);
        if (whole < 0)
            return -1;
        size_t sent, recv;
        if (op->half)
            ff_ring_half_volume(op->half == 2, p, me, (size_t)op->count, &sent, &recv);
        else if (whole)
            ff_rec_whole_volume(p, me, (size_t)op->count, &sent, &recv);
        else
            ff_ring_volume((ff_coll)op->coll, p, me, (size_t)op->count, &sent, &recv);
        ff_plan_coll *c = &out[op->group][op->coll];
        c->calls++;
        c->bytes_sent += (uint64_t)sent * op->wire;
        c->bytes_recv += (uint64_t)recv * op->wire;
    }
    return 0;
}

int plan_play(const ff_plan_config *cfg, ff_dims g, plan_ops *ops, const ff_plan_link *link,
              double rate, ff_plan_result *acc, double weight, double *end_s, double *bg_s,
              double lower_s[2])
{
    const size_t nt = (size_t)ops->tags + 1, need = nt * (6 * sizeof(double) + 6 * sizeof(int));
    if (!ops->oom && ops->play_cap < need) { /* (kept for the next play) */
        free(ops->play);
        ops->play = malloc(need);
        ops->play_cap = ops->play ? need : 0;
    }
    double *tag_end = ops->oom || !ops->play ? NULL : ops->play;
    double *times = tag_end ? tag_end + nt : NULL;      /* 5 nt: the channels', the queue's */
    int *ints = times ? (int *)(times + 5 * nt) : NULL; /* 6 nt */
    ff_plan_result *t = calloc(1, sizeof *t);
    int rc = -1;
    if (tag_end)
        memset(tag_end, 0, nt * sizeof *tag_end);
    if (tag_end && times && ints && t) {
        timeline tl = {
            .cfg = cfg,
            .ops = ops,
            .g = g,
            .prof = &cfg->machine,
            .link = link,
            .rate = rate,
            .tag_end = tag_end,
            .ch = {{times, times + nt, ints, 0}, {times + 2 * nt, times + 3 * nt, ints + nt, 0}},
            .tag_ch = ints + 2 * nt,
            .tag_at = ints + 3 * nt,
            .queue = ints + 4 * nt,
            .q_gc = ints + 5 * nt,
            .q_time = times + 4 * nt,
            .pending_gc = -1,
            .cmm_gc = -1,
            .cmm_prev_gc = -1};
        rc = play(&tl, ops, t);
        *end_s = tl.cursor;
        *bg_s = tl.bg_free;
        if (lower_s)
            lower_s[0] = tl.serial, lower_s[1] = tl.bg_busy;
    }
    if (rc == 0) {
        acc->gemm_s += weight * t->gemm_s;
        acc->attention_s += weight * t->attention_s;
        acc->elementwise_s += weight * t->elementwise_s;
        acc->optimizer_s += weight * t->optimizer_s;
        acc->comm_s += weight * t->comm_s;
        for (int k = 0; k < FF_PLAN_NGROUPS; k++)
            for (int c = 0; c < FF_NCOLL; c++) {
                acc->coll[k][c].time_s += weight * t->coll[k][c].time_s;
                acc->coll[k][c].exposed_s += weight * t->coll[k][c].exposed_s;
            }
    }
    free(t);
    return rc;
}

int plan_count_traffic_at(const ff_plan_config *cfg, plan_ops *ops, ff_dims g, ff_dims coords,
                          ff_plan_coll out[FF_PLAN_NGROUPS][FF_NCOLL])
{
    return count_traffic(cfg, ops, g, coords, out, NULL);
}

int plan_count_traffic(const ff_plan_config *cfg, plan_ops *ops, ff_dims g, ff_plan_result *r)
{
    if (count_traffic(cfg, ops, g, (ff_dims){0, 0, 0, 0}, r->coll, &r->p2p))
        return -1;
    for (int k = 0; k < FF_PLAN_NGROUPS; k++)
        for (int c = 0; c < FF_NCOLL; c++)
            r->bytes_recv += r->coll[k][c].bytes_recv;
    r->bytes_recv += r->p2p.bytes_recv;
    return 0;
}

/* exposed, hidden and compute from the step and the parts */
void plan_finish_times(ff_plan_result *r, double busy_s)
{
    r->compute_s = r->gemm_s + r->attention_s + r->elementwise_s + r->optimizer_s;
    r->exposed_s = busy_s - r->compute_s;
    if (r->exposed_s < 0) /* rounding */
        r->exposed_s = 0;
    r->hidden_s = r->comm_s - r->exposed_s;
    if (r->hidden_s < 1e-12 * r->step_s) /* rounding of the difference */
        r->hidden_s = 0;
}

int plan_eval_full(const ff_plan_config *cfg, ff_dims g, ff_plan_result *r, plan_ops *ops,
                   char *err, size_t err_len)
{
    if (cfg->stages > 1)
        return plan_eval_stages(cfg, g, r, ops, err, err_len);
    plan_links(&cfg->machine, g, cfg->expert_parallel > 1 ? cfg->expert_parallel : 1, 0, r->link);
    if (plan_check_divides(cfg, g, r))
        return FF_OK;
    plan_shape s;
    plan_shape_init(cfg, g, &s);
    if (!plan_fit_memory(cfg, g, r, &s))
        return FF_OK;
    ops->n = 0;
    ops->tags = 0;
    ops->ge = s.ge;
    plan_schedule(&s, ops);
    double end, bg;
    int ranks = plan_group_size(g, FF_GROUP_WORLD), rpn = cfg->machine.ranks_per_node;
    double rate = plan_gemm_rate(&cfg->machine, ranks < rpn ? ranks : rpn);
    int oom = plan_play(cfg, g, ops, r->link, rate, r, 1, &end, &bg, NULL);
    if (!oom)
        oom = plan_count_traffic(cfg, ops, g, r);
    if (oom)
        return ff_format_error(err, err_len, FF_ENOMEM, "out of memory planning grid %dx%dx%dx%d",
                               g.x, g.y, g.z, g.d);
    r->step_s = end;
    plan_finish_times(r, r->step_s);
    return FF_OK;
}

/* The timeline's two lower bounds of its step (timeline.serial and
 * bg_busy: the step ends after wait_all, and no background transfer is
 * posted after it on one stage) are affine in M for M micro-batches of
 * one shape: every micro-batch lists the same operations (the last adds
 * the data-parallel buckets), OAG's reordering moves only gathers, which
 * the serial part does not see and the channel counts wherever they are,
 * and an OAR collective left over at a micro-batch's end meets the next
 * one's first GEMM the same way at every boundary. So the lists of one and
 * two micro-batches give both for M. */
int plan_full_bound(const ff_plan_config *cfg, ff_dims g, plan_ops *ops, double *bound, char *err,
                    size_t err_len)
{
    *bound = -1;
    ff_plan_result *r = calloc(2, sizeof *r); /* r[1]: the plays' sums, unused */
    if (!r)
        return ff_format_error(err, err_len, FF_ENOMEM, "out of memory");
    plan_links(&cfg->machine, g, cfg->expert_parallel > 1 ? cfg->expert_parallel : 1, 0, r->link);
    plan_shape s;
    int oom = 0;
    if (!plan_check_divides(cfg, g, r)) {
        plan_shape_init(cfg, g, &s);
        if (plan_fit_memory(cfg, g, r, &s)) {
            int ranks = plan_group_size(g, FF_GROUP_WORLD), rpn = cfg->machine.ranks_per_node;
            double rate = plan_gemm_rate(&cfg->machine, ranks < rpn ? ranks : rpn);
            double lower[2][2], end, bg;
            for (int k = 0; k < 2 && !oom; k++) {
                s.micro = k + 1; /* micro-batches of the same rows (s.b_mb, s.m) */
                ops->n = 0;
                ops->tags = 0;
                ops->ge = s.ge;
                plan_schedule(&s, ops);
                oom = plan_play(cfg, g, ops, r->link, rate, &r[1], 1, &end, &bg, lower[k]);
            }
            for (int i = 0; i < 2 && !oom; i++) {
                double b = lower[0][i] + (cfg->micro_batches - 1) * (lower[1][i] - lower[0][i]);
                *bound = b > *bound ? b : *bound;
            }
        }
    }
    free(r);
    return oom ? ff_format_error(err, err_len, FF_ENOMEM, "out of memory planning grid %dx%dx%dx%d",
                                 g.x, g.y, g.z, g.d)
               : FF_OK;
}

int plan_traffic_of(const ff_plan_config *cfg, ff_dims g, ff_dims coords, int stage,
                    ff_plan_coll out[FF_PLAN_NGROUPS][FF_NCOLL], ff_plan_coll *p2p, char *err,
                    size_t err_len)
{
    ff_plan_result *r = calloc(1, sizeof *r);
    if (!r)
        return ff_format_error(err, err_len, FF_ENOMEM, "out of memory");
    int rc = FF_OK;
    if (plan_check_divides(cfg, g, r)) {
        rc = ff_format_error(err, err_len, FF_EDIVIDE, "grid %dx%dx%dx%d: %s", g.x, g.y, g.z, g.d,
                             r->reason);
    } else {
        plan_shape s;
        plan_shape_init(cfg, g, &s);
        plan_ops ops = {0};
        ops.ge = s.ge;
        s.eslot = coords.d % s.ge;          /* this rank's experts */
        if (cfg->stages > 1) {              /* stage `stage`'s blocks (src/nn/gpt.c's split) */
            plan_fit_stages(cfg, g, r, &s); /* resolves the automatic settings */
            plan_shape_stage(cfg, &s, stage);
            ops.P = cfg->stages, ops.stage = stage;
        } else {
            plan_fit_memory(cfg, g, r, &s);
        }
        plan_schedule(&s, &ops);
        if (ops.oom || count_traffic(cfg, &ops, g, coords, out, p2p) < 0)
            rc = ff_format_error(err, err_len, FF_ENOMEM, "out of memory");
        plan_ops_free(&ops);
    }
    free(r);
    return rc;
}
