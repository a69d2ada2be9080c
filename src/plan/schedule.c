/* One training step of one rank as a list of operations, in execution order:
 * the collectives (group, kind, count) fourfold's GPT issues per docs/design.md §3
 * and §4, the GEMMs with their local shapes, attention and elementwise work.
 *
 * This file is the planner's only statement of what a step does, so both the
 * byte counts (cost_full.c: ff_plan_traffic) and the timeline come from it.
 * Where docs/design.md leaves a detail open the choice is written here and in
 * docs/planner.md ("Conventions of the step"): what src/nn/gpt.c and
 * linear.c do. tests/test_plan_vs_run.c compares ff_plan_traffic with the
 * counters of real steps of the GPT on every grid of 8 ranks; a difference
 * is settled in this file.
 *
 * Notation (per rank): m rows (tokens) per micro-batch, C hidden, Vp padded
 * vocabulary, T sequence length, grid Gx, Gy, Gz, Gd. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "fourfold/gpt.h"    /* FF_ATTENTION_ROWS */
#include "fourfold/linear.h" /* FF_DECOMPOSE_MAX */
#include "plan/plan_internal.h"

enum { F32 = 4 }; /* statistics and losses stay fp32 */

/* The weight gradients' reduce-scatter of a layer on `wire`: bf16-mixed
 * reduces gradients in fp32 (docs/design.md §13) */
static int grad_wire(const plan_shape *s, int wire) { return s->act == 2 ? F32 : wire; }

typedef plan_sched sched; /* (plan_internal.h: the U-Net's schedule, unet.c, uses it too) */

/* A linear layer O = I W, W of k x n (docs/design.md §3). */
typedef struct {
    int transposed;
    int64_t k, n;
} linear;

static plan_op *push(plan_ops *o)
{
    if (o->oom)
        return NULL;
    if (o->n == o->cap) {
        size_t cap = o->cap ? 2 * o->cap : 1024;
        plan_op *ops = realloc(o->ops, cap * sizeof *ops);
        if (!ops) {
            o->oom = 1;
            return NULL;
        }
        o->ops = ops;
        o->cap = cap;
    }
    plan_op *op = &o->ops[o->n++];
    memset(op, 0, sizeof *op);
    return op;
}

void plan_ops_free(plan_ops *o)
{
    plan_topos_free(o);
    free(o->ops);
    free(o->spare);
    free(o->play);
    memset(o, 0, sizeof *o);
}

/* Rows [r0, r0 + rows) of the product (m x k) times (k x n): the work of
 * its rows at the efficiency of the whole product. A chunk of whole panels
 * (decomposition) makes the very BLAS calls the whole product makes, so it
 * runs at the same rate. */
/* The GEMM op just pushed runs in src/nn/gemm.c's row panels of a
 * (rows x k) times (k x n) product, with a progress call between them. */
static void set_panels(sched *c, int64_t rows, int64_t n, int64_t k)
{
    if (c->o->oom)
        return;
    plan_op *op = &c->o->ops[c->o->n - 1];
    int64_t p = c->s->panel_rows > 0 ? c->s->panel_rows : ff_gemm_panel_rows(INT64_MAX, n, k);
    op->panels = (int)((rows + p - 1) / p);
    op->first = rows > p ? (double)p / (double)rows : 1.0;
}

static void gemm_rows(sched *c, int64_t rows, int64_t m, int64_t n, int64_t k)
{
    plan_op *op = push(c->o);
    if (!op)
        return;
    op->kind = OP_GEMM;
    op->m = m, op->n = n, op->k = k;
    op->work = 2.0 * (double)rows * (double)n * (double)k;
    set_panels(c, rows, n, k); /* (a chunk's rows are whole panels) */
}

/* (m x k) times (k x n) */
static void gemm(sched *c, int64_t m, int64_t n, int64_t k) { gemm_rows(c, m, m, n, k); }

/* A weight gradient dW = I^T dO, (kl x m) times (m x nl): the model stores
 * W^T (NK), so the engine computes dW^T = dO^T I, nl rows in panels */
static void weight_gradient(sched *c, int64_t kl, int64_t nl, int64_t m)
{
    gemm(c, kl, nl, m);
    set_panels(c, nl, kl, m);
}

static void attention(sched *c, double flops)
{
    plan_op *op = push(c->o);
    if (!op)
        return;
    op->kind = OP_ATTN;
    op->m = c->s->T, op->n = c->s->T, op->k = c->s->hd;
    op->work = flops;
}

/* Elementwise work: `passes` passes over `elems` values of the run's
 * format (fp32, or bf16 in bf16-mixed). */
static void elem(sched *c, double passes, double elems)
{
    plan_op *op = push(c->o);
    if (!op)
        return;
    op->kind = OP_ELEM;
    op->work = passes * elems * c->s->act;
}

/* AdamW over n parameters, the gradients zeroed: fp32 reads parameter,
 * gradient and two moments and writes three of them and the zeroed
 * gradient (32 bytes); bf16-mixed reads the fp32 master, the bf16 gradient
 * and the moments and writes master, moments and the bf16 copy (28). */
static void optimizer(sched *c, double n)
{
    plan_op *op = push(c->o);
    if (!op)
        return;
    op->kind = OP_ELEM;
    op->optimizer = 1;
    op->work = (c->s->act == 2 ? 28.0 : 32.0) * n;
}

static plan_op *coll_op(sched *c, ff_group_kind g, ff_coll kind, int64_t count, int wire,
                        coll_mode mode)
{
    /* the collective layer returns at once from a collective of no
     * elements (an expert that received no rows), uncounted */
    if (count == 0 && kind != FF_COLL_P2P)
        return NULL;
    plan_op *op = push(c->o);
    if (!op)
        return NULL;
    op->kind = OP_COLL;
    op->group = (uint8_t)g;
    op->coll = (uint8_t)kind;
    op->count = count;
    op->wire = (uint8_t)wire;
    op->mode = (uint8_t)mode;
    op->tag = mode == MODE_BACKGROUND || mode == MODE_CHUNK ? c->o->tags++ : -1;
    return op;
}

static int coll(sched *c, ff_group_kind g, ff_coll kind, int64_t count, int wire, coll_mode mode)
{
    plan_op *op = coll_op(c, g, kind, count, wire, mode);
    return op ? op->tag : -1;
}

static void wait_for(sched *c, int tag)
{
    if (tag < 0) /* (a collective not listed: no elements) */
        return;
    plan_op *op = push(c->o);
    if (op) {
        op->kind = OP_WAIT;
        op->tag = tag;
    }
}

static void wait_all(sched *c)
{
    plan_op *op = push(c->o);
    if (op)
        op->kind = OP_WAIT_ALL;
}

/* Local sizes: a normal layer reads (m, k/Gy) and writes (m, n/Gx); a
 * transposed one reads (m, k/Gx) and writes (m, n/Gy). */
static int64_t k_local(const sched *c, const linear *w)
{
    return w->transposed ? w->k / c->gx : w->k / c->gy;
}
static int64_t n_local(const sched *c, const linear *w)
{
    return w->transposed ? w->n / c->gy : w->n / c->gx;
}
static int64_t shard(const sched *c, const linear *w)
{
    return w->k * w->n / (c->gx * c->gy * c->gz);
}

/* The weight all-gather over Z, posted in the background and waited for at
 * once; with the layer's OAG, plan_prefetch() later moves the post one
 * gather earlier. */
static void gather(sched *c, int64_t count, const ff_layer_opts *o)
{
    if (c->gz == 1)
        return;
    c->gathers++;
    plan_op *op = coll_op(c, FF_GROUP_Z, FF_COLL_ALLGATHER, count, o->wire_bytes, MODE_BACKGROUND);
    if (!op)
        return;
    op->prefetch = (uint8_t)(o->oag != 0);
    wait_for(c, op->tag);
}

int plan_chunk_bounds(int decompose, int64_t panel_rows, int64_t m, int64_t n, int64_t k,
                      int64_t bounds[FF_DECOMPOSE_MAX + 1])
{
    int64_t p = panel_rows > 0 ? panel_rows : ff_gemm_panel_rows(INT64_MAX, n, k);
    return ff_decompose_bounds(decompose, p, m, bounds);
}

/* O (m, nl) = I (m, kl) W, then O = AllReduce over `group`, then `passes`
 * elementwise passes over O (the bias). Decomposed into k chunks of rows
 * (src/nn/linear.c): GEMM 0, post AR 0, GEMM 1, post AR 1, wait AR 0 (and
 * its bias), GEMM 2, ...; the last chunk's all-reduce is exposed. */
static void forward_product(sched *c, ff_group_kind group, int64_t nl, int64_t kl,
                            const ff_layer_opts *o, double passes, int slices)
{
    const int64_t m = c->m;
    int64_t at[FF_DECOMPOSE_MAX + 1];
    const int k = plan_chunk_bounds(o->decompose, c->s->panel_rows, m, nl, kl, at);
    if (k == 1) {
        gemm(c, m, nl, kl);
        if (!c->o->oom)
            c->o->ops[c->o->n - 1].slices = slices;
        coll(c, group, FF_COLL_ALLREDUCE, m * nl, o->wire_bytes, MODE_BLOCKING);
        if (passes > 0)
            elem(c, passes, (double)(m * nl));
        return;
    }
    int tag[FF_DECOMPOSE_MAX];
    for (int i = 0; i <= k; i++) {
        if (i < k) {
            int64_t rows = at[i + 1] - at[i];
            gemm_rows(c, rows, m, nl, kl);
            tag[i] = coll(c, group, FF_COLL_ALLREDUCE, rows * nl, o->wire_bytes, MODE_CHUNK);
        }
        if (i > 0) {
            wait_for(c, tag[i - 1]);
            if (passes > 0)
                elem(c, passes, (double)((at[i] - at[i - 1]) * nl));
        }
    }
}

/* A forward product of nl output and kl input columns, after its weight's
 * gather (if do_gather). With the collective matmul (src/nn/linear.c)
 * every forward of a layer whose Z-shards are whole rows of its stored
 * block (the model's blocks store W^T: Gz divides nl) is computed in Gz
 * column slices and not decomposed, and a gather that is not prefetched
 * (the layer's OAG off, or the run's first gather) runs on the ring beside
 * those slices. */
static void product(sched *c, ff_group_kind group, int64_t nl, int64_t kl, int64_t count,
                    int do_gather, const ff_layer_opts *o, double passes)
{
    const int sliced = c->s->cmm && c->gz > 1 && nl % c->gz == 0;
    ff_layer_opts whole = *o;
    if (sliced)
        whole.decompose = 0;
    if (do_gather && sliced && (!o->oag || !c->gathers)) {
        plan_op *op =
            coll_op(c, FF_GROUP_Z, FF_COLL_ALLGATHER, count, o->wire_bytes, MODE_BACKGROUND);
        if (op) {
            op->cmm = 1;
            wait_for(c, op->tag);
        }
        c->gathers++;
    } else if (do_gather) {
        gather(c, count, o);
    }
    forward_product(c, group, nl, kl, &whole, passes, sliced ? (int)c->gz : 1);
}

/* forward: W = AllGather_Z(Ŵ); Ô = I W; O = AllReduce_Y(Ô) (N) or
 * AllReduce_X(Ô) (T); O += b */
static void linear_forward(sched *c, const linear *w, int do_gather, const ff_layer_opts *o)
{
    product(c, w->transposed ? FF_GROUP_X : FF_GROUP_Y, n_local(c, w), k_local(c, w), shard(c, w),
            do_gather, o, 2);
}

/* The reduce-scatter collective matmul: dŴ = ReduceScatter_Z(dW) on the
 * ring, posted before the dW GEMM, which computes it in Gz slices (the
 * timeline, cost_full.c, starts each ring step as its slice is done);
 * waited after the backward (ORS) or at once. */
static void scatter_gradient(sched *c, const linear *w, const ff_layer_opts *o, int64_t kl,
                             int64_t nl, int64_t m)
{
    plan_op *op = coll_op(c, FF_GROUP_Z, FF_COLL_REDUCE_SCATTER, shard(c, w),
                          grad_wire(c->s, o->wire_bytes), MODE_BACKGROUND);
    if (op)
        op->rs_cmm = 1;
    const int tag = op ? op->tag : -1;
    weight_gradient(c, kl, nl, m);
    if (!c->o->oom)
        c->o->ops[c->o->n - 1].slices = (int)c->gz;
    if (!o->ors)
        wait_for(c, tag);
}

/* backward: db = column sums of dO; dÎ = dO Wᵀ; dI = AllReduce_X(dÎ) (N) or
 * AllReduce_Y (T), beside dW = Iᵀ dO (OAR); dŴ = ReduceScatter_Z(dW),
 * waited after the backward (ORS). Decomposed, dÎ is computed in k chunks
 * of rows, each chunk's all-reduce posted after its GEMM (beside the next
 * chunks' GEMMs), and all are waited after the dW GEMM (OAR) or before it.
 * `scatter` = 0 for the LM head, whose dW accumulates into the embedding's
 * gathered gradient. */
static void linear_backward_of(sched *c, const linear *w, int scatter, int dinp,
                               const ff_layer_opts *o)
{
    const int64_t m = c->m, kl = k_local(c, w), nl = n_local(c, w);
    const ff_group_kind group = w->transposed ? FF_GROUP_Y : FF_GROUP_X;
    int64_t at[FF_DECOMPOSE_MAX + 1];
    const int k = plan_chunk_bounds(o->decompose, c->s->panel_rows, m, nl, kl, at);
    /* the reduce-scatter collective matmul (src/nn/linear.c): where the
     * layer's Z-shards are whole rows of its stored block (W^T: Gz divides
     * nl) and this use ends with dW's reduce-scatter, the dW GEMM runs in
     * Gz slices feeding the ring; the LM head's dW (scatter 0) goes to the
     * embedding's gradient instead */
    const int rs_sliced = scatter && c->gz > 1 && o->rs_cmm && nl % c->gz == 0;
    elem(c, 1, (double)(m * nl));
    if (!dinp) { /* no input gradient (a model's first layer): dW alone */
        if (rs_sliced)
            scatter_gradient(c, w, o, kl, nl, m);
        else
            weight_gradient(c, kl, nl, m);
    } else if (k == 1) {
        gemm(c, m, kl, nl);
        coll(c, group, FF_COLL_ALLREDUCE, m * kl, o->wire_bytes, o->oar ? MODE_OAR : MODE_BLOCKING);
        if (rs_sliced)
            scatter_gradient(c, w, o, kl, nl, m);
        else
            weight_gradient(c, kl, nl, m);
    } else {
        int tag[FF_DECOMPOSE_MAX];
        for (int i = 0; i < k; i++) {
            int64_t rows = at[i + 1] - at[i];
            gemm_rows(c, rows, m, kl, nl);
            tag[i] = coll(c, group, FF_COLL_ALLREDUCE, rows * kl, o->wire_bytes, MODE_CHUNK);
        }
        for (int i = 0; !o->oar && i < k; i++)
            wait_for(c, tag[i]);
        if (rs_sliced)
            scatter_gradient(c, w, o, kl, nl, m);
        else
            weight_gradient(c, kl, nl, m);
        for (int i = 0; o->oar && i < k; i++)
            wait_for(c, tag[i]);
    }
    if (scatter && c->gz > 1 && !rs_sliced)
        coll(c, FF_GROUP_Z, FF_COLL_REDUCE_SCATTER, shard(c, w), grad_wire(c->s, o->wire_bytes),
             o->ors ? MODE_BACKGROUND : MODE_BLOCKING);
}

static void linear_backward(sched *c, const linear *w, int scatter, const ff_layer_opts *o)
{
    linear_backward_of(c, w, scatter, 1, o);
}

/* LayerNorm on the residual (layout Y): the row statistics need the whole
 * row, which is split over Y. The forward is the model's two-pass, stable
 * form (src/nn): the row sums give the mean (one all-reduce of m floats over
 * Y), and only then can the sums of squared deviations from it be formed
 * (a second all-reduce of m); so it reads the input once more than a one-pass
 * sum and sum of squares would (4 passes: two for the statistics, then read
 * and write to normalise). The backward all-reduces the two row sums of the
 * gradient formula together, 2m floats. */
static void layernorm(sched *c, int backward)
{
    int64_t m = c->s->m;
    double local = (double)(m * c->s->C / c->gy);
    if (backward) {
        elem(c, 5, local);
        coll(c, FF_GROUP_Y, FF_COLL_ALLREDUCE, 2 * m, F32, MODE_BLOCKING);
        return;
    }
    elem(c, 1, local); /* row sums */
    coll(c, FF_GROUP_Y, FF_COLL_ALLREDUCE, m, F32, MODE_BLOCKING);
    elem(c, 1, local); /* row sums of (x - mean)^2 */
    coll(c, FF_GROUP_Y, FF_COLL_ALLREDUCE, m, F32, MODE_BLOCKING);
    elem(c, 2, local); /* normalise, scale and shift */
}

/* Causal attention of the rank's NH/Gx heads, replicated over Y: QKᵀ and
 * A V on the lower triangle in blocks of FF_ATTENTION_ROWS queries (src/nn/
 * gpt_ops.c), (n + 1)/2n of the T^2 square for n blocks, so
 * 2 T^2 hd (n + 1)/n flops per head and sequence forward, twice that
 * backward. The softmax makes 3 passes over its T^2/2 scores in memory.
 * A fused kernel (the profile's attention_fused) makes none, and its
 * backward recomputes the scores QKᵀ from the kept log-sum-exps: 2.5 times
 * the forward's flops, as FlashAttention counts them. */
static void attention_pass(sched *c, int backward)
{
    const plan_shape *s = c->s;
    double heads = (double)s->b_mb * (double)(s->NH / c->gx);
    double blocks = ceil((double)s->T / FF_ATTENTION_ROWS);
    double fwd = heads * 2.0 * (double)s->T * (double)s->T * (double)s->hd * (blocks + 1) / blocks;
    attention(c, backward ? (s->fused_attn ? 2.5 : 2) * fwd : fwd);
    if (!s->fused_attn) /* a fused kernel keeps its scores on the chip */
        elem(c, 3, heads * (double)s->T * (double)s->T / 2);
}

static void plan_layer_opts_uniform(const plan_shape *s, int64_t l, ff_layer_opts *o)
{
    o->decompose = 0;
    o->oar = (s->overlap & FF_OVERLAP_OAR) != 0;
    o->ors = (s->overlap & FF_OVERLAP_ORS) != 0;
    o->oag = (s->overlap & FF_OVERLAP_OAG) != 0;
    o->ag_cache = l < 0 ? s->ag_cache >= s->L : l >= s->L - s->ag_cache;
    o->wire_bytes = s->act == 2 ? 2 : s->wire; /* bf16-mixed: gathers and activations bf16 */
    o->rs_cmm = s->rs_cmm;
}

void plan_layer_opts(const plan_shape *s, int64_t l, int i, ff_layer_opts *o)
{
    if (s->plan) {
        *o = l < 0 ? s->plan->head : s->plan->blocks[l].layer[i];
        if (s->act == 2) /* bf16-mixed: gathers and activations bf16 whatever the plan's wire */
            o->wire_bytes = 2;
        return;
    }
    plan_layer_opts_uniform(s, l, o);
    /* on a stage before the last a micro-batch's forward and backward are
     * separate runs (docs/pipeline.md): nothing is kept from one to the
     * other */
    if (s->P > 1 && !s->last)
        o->ag_cache = 0;
}

int plan_block_checkpoint(const plan_shape *s, int64_t l)
{
    return s->plan ? s->plan->blocks[l].checkpoint : s->checkpoint;
}

/* ---- mixture-of-experts blocks (src/nn/gpt_moe.c; docs/moe.md) ---- */

int plan_block_moe(const plan_shape *s, int64_t l) { return s->E > 0 && (l + 1) % s->every == 0; }

int64_t plan_expert_rows(const plan_shape *s, int le)
{
    const int64_t kt = (int64_t)s->top_k * s->T;
    const int e = s->eslot * s->el + le;
    const int64_t n = kt / s->E + (e < kt % s->E);
    return (n < s->cap ? n : s->cap) * s->b_mb * s->ge;
}

/* Rows of all the local experts together. */
static int64_t expert_rows_all(const plan_shape *s)
{
    int64_t n = 0;
    for (int le = 0; le < s->el; le++)
        n += plan_expert_rows(s, le);
    return n;
}

/* One all-to-all of E blocks of R rows over EP: with DTD this rank's piece
 * of ch rows of each block, then the X all-gather of the pieces. */
static void moe_exchange(sched *c)
{
    const plan_shape *s = c->s;
    const int64_t cy = s->C / c->gy;
    if (!s->dtd) {
        coll(c, (ff_group_kind)FF_PLAN_GROUP_EP, FF_COLL_ALLTOALL, s->el * s->R * cy, s->wire,
             MODE_BLOCKING);
        return;
    }
    elem(c, 2, (double)(s->E * s->ch * cy)); /* the pieces, packed */
    coll(c, (ff_group_kind)FF_PLAN_GROUP_EP, FF_COLL_ALLTOALL, s->el * s->ch * cy, s->wire,
         MODE_BLOCKING);
    coll(c, FF_GROUP_X, FF_COLL_ALLGATHER, s->E * s->ch * cy, s->wire, MODE_BLOCKING);
    elem(c, 2, (double)(s->E * s->R * cy)); /* into the blocks */
}

/* The MoE part of block l's forward, from ln2: the router (its partial
 * logits all-gathered over Y), the load-balancing statistics over ZD, the
 * tokens to their experts (all-to-all with expert parallelism), each local
 * expert's two layers on its rows (the MLP's options), the outputs back
 * and, unless recomputing, combined into the residual. */
static void moe_forward(sched *c, const linear *w, const ff_layer_opts *o, int recompute)
{
    const plan_shape *s = c->s;
    const int64_t m = s->m, E = s->E, cy = s->C / c->gy, fx = 4 * s->C / c->gx;
    const double rows = (double)expert_rows_all(s);
    gemm(c, m, E, cy);
    coll(c, FF_GROUP_Y, FF_COLL_ALLGATHER, m * E, F32, MODE_BLOCKING);
    elem(c, (double)c->gy + 4, (double)(m * E)); /* the sum, the softmax, the choices */
    coll(c, FF_GROUP_ZD, FF_COLL_ALLREDUCE, 2 * E + 1, F32, MODE_BLOCKING);
    elem(c, 2, (double)(m * s->top_k * cy)); /* the rows to their experts */
    if (s->ge > 1) {
        coll(c, (ff_group_kind)FF_PLAN_GROUP_EP, FF_COLL_ALLTOALL, s->el, F32, MODE_BLOCKING);
        moe_exchange(c);
        elem(c, 2, rows * (double)cy); /* packed by local expert */
    }
    for (int le = 0; le < s->el; le++) {
        c->m = plan_expert_rows(s, le);
        linear_forward(c, &w[2], !recompute || !o[2].ag_cache, &o[2]);
        elem(c, 2, (double)(c->m * fx)); /* GELU */
        linear_forward(c, &w[3], !recompute || !o[3].ag_cache, &o[3]);
    }
    c->m = m;
    if (s->ge > 1) {
        elem(c, 2, rows * (double)cy);
        moe_exchange(c);
    }
    if (!recompute)
        elem(c, 3, (double)(m * s->top_k * cy)); /* gates times outputs, added */
}

/* The MoE part of block l's backward, to d ln2: the gates' gradients
 * (their partial sums all-gathered over Y), the outputs' gradients to the
 * experts and the inputs' back (all-to-all), the local experts last first,
 * the router. regather: the experts' weights are gathered again outside
 * the AG cache. */
static void moe_backward(sched *c, const linear *w, const ff_layer_opts *o, int regather)
{
    const plan_shape *s = c->s;
    const int64_t m = s->m, E = s->E, cy = s->C / c->gy, fx = 4 * s->C / c->gx;
    const double rows = (double)expert_rows_all(s);
    elem(c, 3, (double)(m * s->top_k * cy));
    coll(c, FF_GROUP_Y, FF_COLL_ALLGATHER, m * s->top_k, F32, MODE_BLOCKING);
    if (s->ge > 1) {
        moe_exchange(c);
        elem(c, 2, rows * (double)cy);
    }
    for (int le = s->el - 1; le >= 0; le--) {
        c->m = plan_expert_rows(s, le);
        if (regather && !o[3].ag_cache)
            gather(c, shard(c, &w[3]), &o[3]);
        linear_backward(c, &w[3], 1, &o[3]);
        elem(c, 3, (double)(c->m * fx)); /* GELU */
        if (regather && !o[2].ag_cache)
            gather(c, shard(c, &w[2]), &o[2]);
        linear_backward(c, &w[2], 1, &o[2]);
    }
    c->m = m;
    if (s->ge > 1) {
        elem(c, 2, rows * (double)cy);
        moe_exchange(c);
    }
    elem(c, 2, rows * (double)cy); /* into d ln2, by token */
    elem(c, 6, (double)(m * E));   /* the gates, the softmax */
    gemm(c, E, cy, m);             /* d router */
    gemm(c, m, cy, E);             /* d ln2 += d logits Wr */
}

/* Block l's forward; a recompute (activation checkpointing) stops after
 * the GELU: the MLP down's output is the next block's input, which is kept,
 * and its backward needs only its input (src/nn/gpt.c). The first forward
 * gathers every weight; the recompute those outside the AG cache. An MoE
 * block recomputes its experts whole (their outputs weigh the gates'
 * gradients). Under CAC (communication-aware checkpointing) a recompute
 * runs only the local work between the collectives, whose outputs were
 * kept: the LayerNorms' normalisation, attention and the GELUs. */
static void block_forward(sched *c, const linear *w, int64_t l, int recompute)
{
    const plan_shape *s = c->s;
    double y = (double)(s->m * s->C / c->gy), x4 = (double)(s->m * 4 * s->C / c->gx);
    const int moe = plan_block_moe(s, l);
    ff_layer_opts o[FF_BLOCK_LAYERS];
    for (int i = 0; i < FF_BLOCK_LAYERS; i++)
        plan_layer_opts(s, l, i, &o[i]);
    if (recompute && s->cac) {
        elem(c, 2, y);
        attention_pass(c, 0);
        elem(c, 2, y);
        elem(c, 2, moe ? (double)(expert_rows_all(s) * 4 * s->C / c->gx) : x4);
        return;
    }
    layernorm(c, 0);
    linear_forward(c, &w[0], !recompute || !o[0].ag_cache, &o[0]); /* QKV, N */
    attention_pass(c, 0);
    linear_forward(c, &w[1], !recompute || !o[1].ag_cache, &o[1]); /* attention projection, T */
    elem(c, 3, y);                                                 /* residual */
    layernorm(c, 0);
    if (moe) {
        moe_forward(c, w, o, recompute);
        return;
    }
    linear_forward(c, &w[2], !recompute || !o[2].ag_cache, &o[2]); /* MLP up, N */
    elem(c, 2, x4);                                                /* GELU */
    if (recompute)
        return;
    linear_forward(c, &w[3], 1, &o[3]); /* MLP down, T */
    elem(c, 3, y);                      /* residual */
}

/* Block l's backward. A layer outside the AG cache gathers its weight again
 * before its backward without checkpointing (the forward's gathered weight
 * was released), and with it only the MLP down (it was not recomputed; the
 * recompute's gathered weights of the other three stay for their
 * backward). */
static void block_backward(sched *c, const linear *w, int64_t l, int checkpoint)
{
    const plan_shape *s = c->s;
    double y = (double)(s->m * s->C / c->gy), x4 = (double)(s->m * 4 * s->C / c->gx);
    const int moe = plan_block_moe(s, l);
    /* recomputed layers keep their gathered weights for the backward: all
     * of an MoE block's, a dense block's but the MLP down; none under CAC */
    const int recomputed = checkpoint && !s->cac;
    ff_layer_opts o[FF_BLOCK_LAYERS];
    int regather[FF_BLOCK_LAYERS];
    for (int i = 0; i < FF_BLOCK_LAYERS; i++) {
        plan_layer_opts(s, l, i, &o[i]);
        regather[i] = !o[i].ag_cache && (!recomputed || (!moe && i == FF_BLOCK_FCPROJ));
    }
    elem(c, 2, y); /* residual */
    if (moe) {
        moe_backward(c, w, o, !recomputed);
    } else {
        if (regather[3])
            gather(c, shard(c, &w[3]), &o[3]);
        linear_backward(c, &w[3], 1, &o[3]);
        elem(c, 3, x4); /* GELU */
        if (regather[2])
            gather(c, shard(c, &w[2]), &o[2]);
        linear_backward(c, &w[2], 1, &o[2]);
    }
    layernorm(c, 1);
    elem(c, 2, y); /* residual */
    if (regather[1])
        gather(c, shard(c, &w[1]), &o[1]);
    linear_backward(c, &w[1], 1, &o[1]);
    attention_pass(c, 1);
    if (regather[0])
        gather(c, shard(c, &w[0]), &o[0]);
    linear_backward(c, &w[0], 1, &o[0]);
    layernorm(c, 1);
}

/* A block's Z-sharded weights on one rank other than its experts'
 * (QKV and projection, and the MLP's in a dense block), and its local
 * experts' (el of 8 C^2 each). */
static int64_t block_shard_of(const plan_shape *s, int64_t l)
{
    int64_t tp = (int64_t)s->g.x * s->g.y * s->g.z;
    return (plan_block_moe(s, l) ? 4 : 12) * s->C * s->C / tp;
}
static int64_t expert_shard_of(const plan_shape *s, int64_t l)
{
    int64_t tp = (int64_t)s->g.x * s->g.y * s->g.z;
    return plan_block_moe(s, l) ? s->el * (8 * s->C * s->C / tp) : 0;
}

int64_t plan_zsharded_params(const plan_shape *s)
{
    int64_t tp = (int64_t)s->g.x * s->g.y * s->g.z, wte = s->first || s->last, n = 0;
    for (int64_t l = s->l0; l < s->l0 + s->nb; l++)
        n += block_shard_of(s, l) + expert_shard_of(s, l);
    return n + wte * s->Vp * s->C / tp;
}

/* The largest of n's ring chunks over p ranks (rank 0's). */
static int64_t chunk0(int64_t n, int p) { return (n + p - 1) / p; }

/* The entries of block l's bucket (a = 0) or its experts' (a = 1) that
 * the data-parallel collectives carry: under a mask the kept ones, as
 * round(f x shard) (docs/samo.md, "The planner"). */
static int64_t bucket_entries(const plan_shape *s, int64_t l, int a)
{
    const int64_t n = a ? expert_shard_of(s, l) : block_shard_of(s, l);
    return s->keep < 1 ? llround(s->keep * (double)n) : n;
}

int64_t plan_samo_kept(const plan_shape *s)
{
    int64_t k = 0;
    for (int64_t l = s->l0; l < s->l0 + s->nb; l++)
        k += bucket_entries(s, l, 0) + bucket_entries(s, l, 1);
    return k;
}

double plan_optimizer_entries(const plan_shape *s)
{
    if (s->zero) { /* the ring chunk of each bucket and of wte, the rest whole
                      (with SAMO of each bucket's kept entries: docs/samo.md) */
        const int64_t tp = (int64_t)s->g.x * s->g.y * s->g.z, edp = s->g.d / s->ge;
        int64_t n =
            plan_other_params(s) + (s->first || s->last) * chunk0(s->Vp * s->C / tp, s->g.d);
        for (int64_t l = s->l0; l < s->l0 + s->nb; l++)
            n +=
                chunk0(bucket_entries(s, l, 0), s->g.d) + chunk0(bucket_entries(s, l, 1), (int)edp);
        return (double)n;
    }
    double n = (double)(plan_zsharded_params(s) + plan_other_params(s));
    return s->samo ? n - (1 - s->keep) * (double)plan_block_matrices(s) : n;
}

int64_t plan_block_matrices(const plan_shape *s)
{
    int64_t n = 0;
    for (int64_t l = s->l0; l < s->l0 + s->nb; l++)
        n += block_shard_of(s, l) + expert_shard_of(s, l);
    return n;
}

int64_t plan_expert_bias_params(const plan_shape *s)
{
    int64_t n = 0;
    for (int64_t l = s->l0; l < s->l0 + s->nb; l++)
        n += plan_block_moe(s, l) ? s->el * (s->C / s->g.y + 4 * s->C / s->g.x) : 0;
    return n;
}

/* LayerNorm gains and biases, biases of T layers and positions are in
 * layout Y (C/Gy per row); biases of N layers in layout X. Per block:
 * 2 LayerNorms (4C/Gy), projection and MLP-down biases (2C/Gy), QKV and
 * MLP-up biases (7C/Gx); then the final LayerNorm and the positions. */
int64_t plan_other_params(const plan_shape *s)
{
    int64_t gx = s->g.x, gy = s->g.y, C = s->C, n = 0;
    /* an MoE block: no MLP biases, the router (E, C/Gy), the experts' */
    for (int64_t l = s->l0; l < s->l0 + s->nb; l++)
        n += plan_block_moe(s, l) ? 5 * C / gy + 3 * C / gx + s->E * C / gy
                                  : 6 * C / gy + 7 * C / gx;
    return n + plan_expert_bias_params(s) + s->last * 2 * C / gy + s->first * s->positions * C / gy;
}

/* A data-parallel bucket of n gradients over D: all-reduced, or under
 * ZeRO the ring all-reduce's reduce phase (ZERO_REDUCE) and, after the
 * optimizer, its gather phase for the parameters (ZERO_GATHER; in
 * bf16-mixed on their 2-byte copy, ff_iallgather_half16). */
enum { DP_ALLREDUCE = 0, ZERO_REDUCE = 1, ZERO_GATHER = 2 };
static int dp_coll(sched *c, ff_group_kind g, int64_t n, int phase, coll_mode mode)
{
    if (!phase)
        return coll(c, g, FF_COLL_ALLREDUCE, n, c->s->wire, mode);
    /* bf16-mixed: the gather moves the weights' 2-byte copy, the fp32
     * master staying sliced (docs/design.md "ZeRO over D") */
    const int wire = phase == ZERO_GATHER && c->s->act == 2 ? 2 : c->s->wire;
    plan_op *op = coll_op(c, g, phase == ZERO_GATHER ? FF_COLL_ALLGATHER : FF_COLL_REDUCE_SCATTER,
                          n, wire, mode);
    if (op)
        op->half = (uint8_t)phase;
    return op ? op->tag : -1;
}

/* The gradients of wte's shard over D. */
static void dp_wte(sched *c, int64_t n, coll_mode mode)
{
    dp_coll(c, FF_GROUP_D, n, c->s->zero ? ZERO_REDUCE : DP_ALLREDUCE, mode);
}

/* The local experts' replicas: EDP with expert parallelism, else D. */
static ff_group_kind experts_group(const plan_shape *s)
{
    return s->ge > 1 ? (ff_group_kind)FF_PLAN_GROUP_EDP : FF_GROUP_D;
}

/* ZeRO: the updated parameters' gather phases, bucket by bucket (a
 * block's, its experts'), then wte's (wte_shard 0: a stage without it). */
static void zero_gathers(sched *c, int64_t wte_shard)
{
    const plan_shape *s = c->s;
    for (int64_t l = s->l0; s->zero && l < s->l0 + s->nb; l++) {
        /* (with SAMO the kept entries, through its staging vector) */
        dp_coll(c, FF_GROUP_D, bucket_entries(s, l, 0), ZERO_GATHER, MODE_BLOCKING);
        if (plan_block_moe(s, l))
            dp_coll(c, experts_group(s), bucket_entries(s, l, 1), ZERO_GATHER, MODE_BLOCKING);
    }
    if (s->zero)
        dp_coll(c, FF_GROUP_D, wte_shard, ZERO_GATHER, MODE_BLOCKING);
}

/* ZeRO's gathers beside the next forward (s->zero_overlap; docs/planner.md,
 * "ZeRO's gathers"): the run posts them after AdamW, one per range in the
 * flat buffer's order (wte's, the blocks' buckets, then the blocks'
 * experts': src/nn/gpt_zero.c), and the next forward waits for a range's
 * where it first reads the range (a layer's weight hook, src/nn/gpt.c). In
 * the timeline of one step, the steady state's: the previous step's
 * gathers posted on the background channel at the step's start, in that
 * order, ahead of the forward's Z gathers; tags[2 l], tags[2 l + 1] block
 * l's and its experts', tags[2 L] wte's (-1: none). The same collectives
 * as zero_gathers(): the same bytes. */
static void zero_gathers_post(sched *c, int64_t wte_shard, int *tags)
{
    const plan_shape *s = c->s;
    tags[2 * s->L] = dp_coll(c, FF_GROUP_D, wte_shard, ZERO_GATHER, MODE_BACKGROUND);
    for (int64_t l = s->l0; l < s->l0 + s->nb; l++)
        tags[2 * l] = dp_coll(c, FF_GROUP_D, bucket_entries(s, l, 0), ZERO_GATHER, MODE_BACKGROUND);
    for (int64_t l = s->l0; l < s->l0 + s->nb; l++)
        tags[2 * l + 1] = plan_block_moe(s, l)
                              ? dp_coll(c, experts_group(s), bucket_entries(s, l, 1), ZERO_GATHER,
                                        MODE_BACKGROUND)
                              : -1;
}

/* Block l's data-parallel all-reduces (its gradient shards, one bucket
 * over D; then its local experts', over their own replicas: EDP, or D
 * without expert parallelism). */
static void dp_buckets(sched *c, int64_t l, coll_mode mode)
{
    const plan_shape *s = c->s;
    /* a pruned model's buckets carry the kept entries (docs/samo.md) */
    const int phase = s->zero ? ZERO_REDUCE : DP_ALLREDUCE;
    dp_coll(c, FF_GROUP_D, bucket_entries(s, l, 0), phase, mode);
    if (plan_block_moe(s, l))
        dp_coll(c, experts_group(s), bucket_entries(s, l, 1), phase, mode);
}

/* After the backward: every parameter that is not Z-sharded, one
 * all-reduce over ZD, but the local experts' biases, over Z and over their
 * replicas (EDP, or D). */
static void other_grads(sched *c)
{
    const plan_shape *s = c->s;
    const int64_t eb = plan_expert_bias_params(s);
    coll(c, FF_GROUP_ZD, FF_COLL_ALLREDUCE, plan_other_params(s) - eb, F32, MODE_BLOCKING);
    if (eb) {
        coll(c, FF_GROUP_Z, FF_COLL_ALLREDUCE, eb, F32, MODE_BLOCKING);
        coll(c, s->ge > 1 ? (ff_group_kind)FF_PLAN_GROUP_EDP : FF_GROUP_D, FF_COLL_ALLREDUCE, eb,
             F32, MODE_BLOCKING);
    }
}

/* OAG (docs/design.md §5): the all-gather of the next layer that needs one is
 * posted right after this layer's own gather completed, in execution order
 * (so across the forward, the recompute and into the next micro-batch).
 * Reorders the list: each gather but the first whose layer has OAG
 * (`prefetch`) moves to just after the wait for the gather before it; one
 * without stays where it is needed, waited for at once. Only Z's weight
 * gathers move: the cross-entropy's all-gather over X needs the logits
 * just computed. */
static void plan_prefetch(plan_ops *o)
{
    size_t n_ag = 0;
    for (size_t i = 0; i < o->n; i++)
        n_ag += o->ops[i].kind == OP_COLL && o->ops[i].coll == FF_COLL_ALLGATHER &&
                o->ops[i].group == FF_GROUP_Z;
    if (n_ag < 2)
        return;
    size_t *ag = malloc(n_ag * sizeof *ag);
    if (o->spare_cap < o->cap) { /* the second list, as long as the first */
        free(o->spare);
        o->spare = malloc(o->cap * sizeof *o->spare);
        o->spare_cap = o->spare ? o->cap : 0;
    }
    plan_op *out = o->spare;
    if (!ag || !out) {
        free(ag);
        o->oom = 1;
        return;
    }
    size_t k = 0;
    for (size_t i = 0; i < o->n; i++)
        if (o->ops[i].kind == OP_COLL && o->ops[i].coll == FF_COLL_ALLGATHER &&
            o->ops[i].group == FF_GROUP_Z)
            ag[k++] = i;
    /* gathers are met in order: when gather j is met, those before it are
     * emitted (in place or earlier), so j <= a */
    size_t n = 0, a = 0, j = 0; /* a: gathers already emitted; j: gathers met */
    for (size_t i = 0; i < o->n; i++) {
        const plan_op *op = &o->ops[i];
        if (op->kind == OP_COLL && op->coll == FF_COLL_ALLGATHER && op->group == FF_GROUP_Z) {
            if (j++ < a)
                continue; /* already posted earlier */
            a = j;
        }
        out[n++] = *op;
        /* the wait of gather a-1 is followed by the post of gather a */
        if (op->kind == OP_WAIT && a > 0 && a < n_ag && op->tag == o->ops[ag[a - 1]].tag &&
            o->ops[ag[a]].prefetch)
            out[n++] = o->ops[ag[a++]];
    }
    free(ag);
    plan_op *old = o->ops; /* the two lists swap */
    const size_t old_cap = o->cap;
    o->ops = out, o->cap = o->spare_cap;
    o->spare = old, o->spare_cap = old_cap;
}

/* A point-to-point message of the pipeline (PIPE; mode 0 send, 1 receive). */
static void p2p(sched *c, int64_t count, int recv)
{
    coll_op(c, FF_GROUP_PIPE, FF_COLL_P2P, count, F32, (coll_mode)recv); /* (the residual) */
}

/* The pieces of one stage's step (docs/pipeline.md; src/nn/gpt_pipe.c). A
 * stage before the last runs each micro-batch's forward and backward as
 * separate runs of its layers (plan_layer_opts: no AG cache across them; the
 * first stage's embedding gathers wte for the lookup and reduce-scatters its
 * gradient at the end of each backward run); the last runs both in one, its
 * LM head gathering wte (no lookup before it) and reduce-scattering its
 * gradient right after the head's backward. Messages: an activation of
 * m C/Gy floats per micro-batch and boundary forward, a gradient back; at
 * the end the first and the last stage exchange their wte gradient shards,
 * and the loss is summed over PIPE. */
typedef struct {
    sched c;
    linear w[4], head;
    ff_layer_opts head_opts;
    int64_t wte_shard, act, l1;
    int has_wte;
    double y, logits;
} stage_ctx;

static void stage_ctx_init(stage_ctx *t, const plan_shape *s, plan_ops *o)
{
    const int64_t C = s->C, m = s->m;
    memset(t, 0, sizeof *t);
    t->c = (sched){s, o, s->g.x, s->g.y, s->g.z, s->g.d, 0, s->m};
    const linear w[4] = {{0, C, 3 * C}, {1, C, C}, {0, C, 4 * C}, {1, 4 * C, C}};
    memcpy(t->w, w, sizeof w);
    t->head = (linear){0, C, s->Vp};
    plan_layer_opts(s, -1, 0, &t->head_opts);
    t->wte_shard = s->Vp * C / (t->c.gx * t->c.gy * t->c.gz);
    t->act = m * C / t->c.gy;
    t->l1 = s->l0 + s->nb;
    t->has_wte = s->first || s->last;
    t->y = (double)(m * C / t->c.gy);
    t->logits = (double)(m * s->Vp / t->c.gx);
}

/* A micro-batch's backward run on a stage before the last, or the backward
 * half of the last stage's run; the last micro-batch's posts the
 * data-parallel buckets. */
static void stage_backward(stage_ctx *t, int last_micro)
{
    const plan_shape *s = t->c.s;
    sched *c = &t->c;
    const int dp = (s->overlap & FF_OVERLAP_DP) && c->gd > 1;
    if (!s->last)
        p2p(c, t->act, 1);
    for (int64_t l = t->l1 - 1; l >= s->l0; l--) {
        int checkpoint = plan_block_checkpoint(s, l);
        if (checkpoint)
            block_forward(c, t->w, l, 1);
        block_backward(c, t->w, l, checkpoint);
        if (last_micro && dp)
            dp_buckets(c, l, MODE_BACKGROUND);
    }
    if (s->first) {
        elem(c, 3, t->y);
        if (c->gz > 1)
            coll(c, FF_GROUP_Z, FF_COLL_REDUCE_SCATTER, t->wte_shard,
                 grad_wire(s, t->head_opts.wire_bytes),
                 t->head_opts.ors ? MODE_BACKGROUND : MODE_BLOCKING);
    } else {
        p2p(c, t->act, 0);
    }
    if (last_micro && t->has_wte && dp)
        dp_wte(c, t->wte_shard, MODE_BACKGROUND);
}

/* A micro-batch's forward run (on the last stage with its backward). */
static void stage_forward(stage_ctx *t, int last_micro)
{
    const plan_shape *s = t->c.s;
    sched *c = &t->c;
    const int64_t m = s->m;
    if (s->first) {
        gather(c, t->wte_shard, &t->head_opts);
        elem(c, 4, t->y);
        coll(c, FF_GROUP_X, FF_COLL_ALLREDUCE, m * s->C / c->gy, F32, MODE_BLOCKING);
    } else {
        p2p(c, t->act, 1);
    }
    for (int64_t l = s->l0; l < t->l1; l++)
        block_forward(c, t->w, l, 0);
    if (!s->last) {
        p2p(c, t->act, 0);
        return;
    }
    layernorm(c, 0);
    product(c, FF_GROUP_Y, s->Vp / c->gx, s->C / c->gy, t->wte_shard, 1, &t->head_opts, 0);
    elem(c, 2, t->logits);
    coll(c, FF_GROUP_X, FF_COLL_ALLGATHER, 3 * m, F32, MODE_BLOCKING);
    elem(c, 2, t->logits);
    linear_backward(c, &t->head, 1, &t->head_opts);
    layernorm(c, 1);
    stage_backward(t, last_micro);
}

/* After the last pass: the gradients' reductions, the tied embedding's two
 * contributions, the loss, the norm and the optimizer. */
static void stage_tail(stage_ctx *t)
{
    const plan_shape *s = t->c.s;
    sched *c = &t->c;
    wait_all(c);
    if (!(s->overlap & FF_OVERLAP_DP) && c->gd > 1) {
        for (int64_t l = t->l1 - 1; l >= s->l0; l--)
            dp_buckets(c, l, MODE_BLOCKING);
        if (t->has_wte)
            dp_wte(c, t->wte_shard, MODE_BLOCKING);
    }
    other_grads(c);
    if (t->has_wte) {
        p2p(c, t->wte_shard, 0);
        p2p(c, t->wte_shard, 1);
        elem(c, 3, (double)t->wte_shard);
    }
    coll(c, FF_GROUP_ZD, FF_COLL_ALLREDUCE, 1, F32, MODE_BLOCKING);
    coll(c, FF_GROUP_PIPE, FF_COLL_ALLREDUCE, 1, F32, MODE_BLOCKING);
    coll(c, FF_GROUP_WORLD, FF_COLL_ALLREDUCE, 1, F32, MODE_BLOCKING);
    optimizer(c, plan_optimizer_entries(s));
    zero_gathers(c, t->has_wte ? t->wte_shard : 0);
}

void plan_schedule_piece(const plan_shape *s, plan_ops *o, plan_piece piece, int last_micro)
{
    stage_ctx t;
    stage_ctx_init(&t, s, o);
    switch (piece) {
    case PIECE_FORWARD: stage_forward(&t, last_micro); break;
    case PIECE_BACKWARD: stage_backward(&t, last_micro); break;
    case PIECE_TAIL: stage_tail(&t); return;
    }
    plan_prefetch(o);
}

/* One stage's step: the order of the micro-batches' passes (the schedule)
 * does not change the traffic, so this list runs them one micro-batch after
 * another. */
static void plan_schedule_stage(const plan_shape *s, plan_ops *o)
{
    stage_ctx t;
    stage_ctx_init(&t, s, o);
    for (int u = 0; u < s->micro; u++) {
        t.c.gathers = 0; /* each run begins anew (the collective matmul's first gather) */
        stage_forward(&t, u == s->micro - 1);
        t.c.gathers = 0;
        if (!s->last)
            stage_backward(&t, u == s->micro - 1);
    }
    stage_tail(&t);
    plan_prefetch(o);
}

void plan_schedule(const plan_shape *s, plan_ops *o)
{
    if (s->P > 1) {
        plan_schedule_stage(s, o);
        return;
    }
    sched c = {s, o, s->g.x, s->g.y, s->g.z, s->g.d, 0, s->m};
    const int64_t C = s->C, m = s->m;
    const linear w[4] = {{0, C, 3 * C}, {1, C, C}, {0, C, 4 * C}, {1, 4 * C, C}};
    const linear head = {0, C, s->Vp}; /* the tied LM head: block (y, x) of wte, transposed */
    const int64_t wte_shard = s->Vp * C / (c.gx * c.gy * c.gz);
    const unsigned ov = s->overlap;
    const double y = (double)(m * C / c.gy), logits = (double)(m * s->Vp / c.gx);

    /* the head's (wte's) options; without a plan the AG cache holds the
     * last ag_cache blocks (the model's last 4 ag_cache layers in forward
     * order) and, when it holds every block, wte too (the model's "every
     * layer", its default) */
    ff_layer_opts head_opts;
    plan_layer_opts(s, -1, 0, &head_opts);
    /* ZeRO: the previous step's gathers, beside this forward */
    int *ztag = s->zero_overlap ? malloc((size_t)(2 * s->L + 1) * sizeof *ztag) : NULL;
    if (ztag)
        zero_gathers_post(&c, wte_shard, ztag);

    for (int u = 0; u < s->micro; u++) {
        int last = u == s->micro - 1;
        c.gathers = 0;      /* a micro-batch is a run of the layers' program */
        if (ztag && u == 0) /* the lookup reads wte */
            wait_for(&c, ztag[2 * s->L]);
        /* embedding: the gathered wte block serves the lookup and the LM
         * head; in the AG cache it stays from the lookup to the head's
         * backward (one gather per micro-batch), else the head gathers it
         * again and keeps it for its backward; vocab-parallel lookup, then
         * AllReduce_X gives layout Y */
        gather(&c, wte_shard, &head_opts);
        elem(&c, 4, y); /* lookup rows, zeros elsewhere, add positions */
        coll(&c, FF_GROUP_X, FF_COLL_ALLREDUCE, m * C / c.gy, F32,
             MODE_BLOCKING); /* exact in fp32 (one nonzero term per element) */
        for (int64_t l = 0; l < s->L; l++) {
            if (ztag && u == 0) /* its first read of block l's bucket (and experts') */
                wait_for(&c, ztag[2 * l]), wait_for(&c, ztag[2 * l + 1]);
            block_forward(&c, w, l, 0);
        }
        layernorm(&c, 0); /* final LayerNorm */
        /* the logits: the LM head's forward (decomposed as the layer is; the
         * embedding's all-reduce above is not a linear forward), gathering
         * wte again outside the AG cache */
        product(&c, FF_GROUP_Y, s->Vp / c.gx, C / c.gy, wte_shard, !head_opts.ag_cache, &head_opts,
                0);
        /* vocab-parallel cross-entropy over X, as the model does it: each
         * rank forms per row its local max, its sum of exp(logit - local
         * max) and its target logit (0 outside its vocabulary block), and
         * one all-gather of those 3 floats per row (count 3m per rank into
         * a buffer of Gx*3m) lets every rank combine the Gx triples in rank
         * order.
         * The collective layer's all-reduce only sums, so the max cannot
         * travel with the sums in one; the gather takes a single call. */
        elem(&c, 2, logits);
        coll(&c, FF_GROUP_X, FF_COLL_ALLGATHER, 3 * m, F32, MODE_BLOCKING);

        elem(&c, 2, logits); /* dlogits = softmax - onehot, local */
        linear_backward(&c, &head, 0, &head_opts);
        layernorm(&c, 1);
        for (int64_t l = s->L - 1; l >= 0; l--) {
            /* checkpointing keeps the block input and recomputes the block;
             * the AG cache keeps a layer's gathered weight from the forward,
             * so its recompute and backward gather nothing; outside it the
             * recompute gathers again, or without checkpointing the
             * backward */
            int checkpoint = plan_block_checkpoint(s, l);
            if (checkpoint)
                block_forward(&c, w, l, 1);
            block_backward(&c, w, l, checkpoint);
            if (last && (ov & FF_OVERLAP_DP) && c.gd > 1) /* a bucket per block */
                dp_buckets(&c, l, MODE_BACKGROUND);
        }
        elem(&c, 3, y); /* embedding backward: scatter-add into the wte gradient */
        if (c.gz > 1)
            coll(&c, FF_GROUP_Z, FF_COLL_REDUCE_SCATTER, wte_shard,
                 grad_wire(s, head_opts.wire_bytes),
                 head_opts.ors ? MODE_BACKGROUND : MODE_BLOCKING);
        if (last && (ov & FF_OVERLAP_DP) && c.gd > 1)
            dp_wte(&c, wte_shard, MODE_BACKGROUND);
    }
    wait_all(&c);
    if (!(ov & FF_OVERLAP_DP) && c.gd > 1) {
        for (int64_t l = s->L - 1; l >= 0; l--)
            dp_buckets(&c, l, MODE_BLOCKING);
        dp_wte(&c, wte_shard, MODE_BLOCKING);
    }
    /* parameters that are not Z-sharded: one all-reduce of their gradients
     * over ZD (one flat buffer); the loss (a sum over ZD); the gradient norm
     * for clipping (a sum of squares over every rank) */
    other_grads(&c);
    coll(&c, FF_GROUP_ZD, FF_COLL_ALLREDUCE, 1, F32, MODE_BLOCKING);
    coll(&c, FF_GROUP_WORLD, FF_COLL_ALLREDUCE, 1, F32, MODE_BLOCKING);
    /* AdamW reads parameter, gradient and two moments and writes three of
     * them; the gradients are zeroed: 8 passes */
    optimizer(&c, plan_optimizer_entries(s));
    if (!ztag) /* (blocking after AdamW: their upper bound) */
        zero_gathers(&c, wte_shard);
    free(ztag);
    plan_prefetch(o); /* the gathers of the layers with OAG */
}

/* ---- for a second model's schedule (unet.c; plan_internal.h) ---- */

void plan_sched_linear_forward(plan_sched *c, int transposed, int64_t k, int64_t n, int do_gather,
                               const ff_layer_opts *o)
{
    const linear w = {transposed, k, n};
    linear_forward(c, &w, do_gather, o);
}

void plan_sched_linear_backward(plan_sched *c, int transposed, int64_t k, int64_t n, int do_gather,
                                int dinp, const ff_layer_opts *o)
{
    const linear w = {transposed, k, n};
    if (do_gather)
        gather(c, shard(c, &w), o);
    linear_backward_of(c, &w, 1, dinp, o);
}

void plan_sched_coll(plan_sched *c, ff_group_kind g, ff_coll kind, int64_t count)
{
    coll(c, g, kind, count, F32, MODE_BLOCKING);
}

void plan_sched_elem(plan_sched *c, double passes, double elems) { elem(c, passes, elems); }

void plan_sched_attention(plan_sched *c, double flops, int64_t tokens, int64_t head_dim)
{
    plan_op *op = push(c->o);
    if (!op)
        return;
    op->kind = OP_ATTN;
    op->m = tokens, op->n = tokens, op->k = head_dim;
    op->work = flops;
}

void plan_sched_optimizer(plan_sched *c, double n) { optimizer(c, n); }

void plan_sched_finish(plan_sched *c) { wait_all(c); }

void plan_sched_prefetch(plan_ops *o) { plan_prefetch(o); }
