/* The GPT's mixture-of-experts blocks in 4D (docs/moe.md, issue 27): the
 * MLP of a block replaced by E experts behind a router, every expert's two
 * layers 3D parallel linear layers like the dense MLP's.
 *
 * The rank's rows are whole sequences (Z and D split the batch by
 * sequences), the capacity is per sequence, so each rank routes its own
 * tokens, and a sequence whose tokens choose as in the serial program drops
 * the same assignments (the choices themselves may differ at near ties:
 * docs/moe.md, "Routing across grids"). What must agree across a group:
 *  - the ranks of an X and a Y group hold the same rows and must route them
 *    identically (their experts' all-reduces over X and Y have one row count
 *    per expert). The router's logits are therefore summed from partial
 *    products (each Y rank's columns of ln2 times its columns of the router)
 *    all-gathered over Y and added in rank order, the same bits everywhere;
 *  - the load-balancing loss is over the whole micro-batch: its counts and
 *    probability sums are all-reduced over ZD (2E + 1 floats per block).
 * The router's weight (E, C) is split over Y by columns like a LayerNorm
 * gain, replicated over X, Z and D; its gradient joins the ZD all-reduce of
 * the other replicated parameters. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "device.h"
#include "gpt_internal.h"
#include "gpt_ops.h"
#include "moe.h"

int64_t ff_gpt_moe_rows(const ff_gpt *g)
{
    /* this rank's assignments, or with expert parallelism what its local
     * experts receive: at most R from each of the ge sources for each */
    return g->ge > 1 ? g->E * g->moe_R : g->m * g->top_k;
}

int ff_gpt_moe_alloc(ff_gpt *g, ff_gpt_moe_acts *a, float *shared_A, size_t *acc)
{
    const size_t m = (size_t)g->m, E = (size_t)g->E, k = (size_t)g->top_k, assign = m * k;
    const size_t cy = (size_t)g->cy, fx = (size_t)g->fx;
    /* the experts' rows; O: this rank's assignments, or all-to-all blocks */
    const size_t own = (size_t)ff_gpt_moe_rows(g), outs = g->ge > 1 ? E * (size_t)g->moe_R : assign;
    a->probs = malloc(m * E * sizeof(float));
    a->choice = malloc(assign * sizeof(int));
    a->row = malloc(assign * sizeof(int64_t));
    a->gate = malloc(assign * sizeof(float));
    a->start = malloc((E + 1) * sizeof(int64_t));
    a->row_token = malloc(assign * sizeof(int64_t));
    a->f_over_n = malloc(E * sizeof(double));
    a->count_in = calloc(E + 1, sizeof(float));
    a->own0 = calloc((size_t)g->el + 1, sizeof(int64_t));
    /* the experts' activations, which their products and passes touch: on
     * the model's device (device.h) */
    a->X = ff_fbuf_alloc(g->ctx, own * cy + 1);
    a->O = ff_fbuf_alloc(g->ctx, outs * cy + 1);
    a->Hp = ff_fbuf_alloc(g->ctx, own * fx + 1);
    a->A = shared_A ? shared_A : ff_fbuf_alloc(g->ctx, own * fx + 1);
    a->A_shared = shared_A != NULL;
    *acc += m * E * sizeof(float) + assign * (sizeof(int) + 2 * sizeof(int64_t) + sizeof(float)) +
            (E + 1) * sizeof(int64_t) + E * sizeof(double) + (E + 1) * sizeof(float) +
            (own * (cy + (shared_A ? 1 : 2) * fx) + outs * cy) * sizeof(float);
    return a->probs && a->choice && a->row && a->gate && a->start && a->row_token && a->f_over_n &&
                   a->count_in && a->own0 && a->X && a->O && a->Hp && a->A
               ? FF_OK
               : FF_ENOMEM;
}

void ff_gpt_moe_free(ff_gpt_moe_acts *a)
{
    if (a->A_shared)
        a->A = NULL;
    void *p[] = {a->probs, a->choice, a->row_token, a->row, a->gate,     a->start, a->f_over_n,
                 a->X,     a->O,      a->Hp,        a->A,   a->count_in, a->own0};
    for (size_t i = 0; i < sizeof p / sizeof *p; i++)
        ff_fbuf_free(p[i]); /* A may be the model's (ff_fbuf_alloc) */
    memset(a, 0, sizeof *a);
}

/* Sums the Y ranks' partial products (m, w each) in rank order into out:
 * the same bits on every rank of the group. */
static int sum_over_y(ff_gpt *g, float *out, const float *part, int64_t n)
{
    if (g->gy == 1) {
        memcpy(out, part, (size_t)n * sizeof(float));
        return FF_OK;
    }
    float *all = g->moe_gather;
    int rc = ff_allgather(g->grp_y, part, all, (size_t)n, NULL);
    if (rc)
        return rc;
    memcpy(out, all, (size_t)n * sizeof(float));
    for (int y = 1; y < g->gy; y++)
        for (int64_t i = 0; i < n; i++)
            out[i] += all[(int64_t)y * n + i];
    return FF_OK;
}

/* Router, routing and the load-balancing statistics of block l's ln2. */
static int route(ff_gpt *g, int l, ff_gpt_moe_acts *a, const float *ln2, int recompute)
{
    const int E = g->E, k = g->top_k;
    const int64_t m = g->m;
    ff_gemm *gm = ff_linear_seq_gemm(g->seq);
    // logits (m, E) = ln2 (m, C/Gy) Wr^T, Wr's columns of this Y rank (E, C/Gy)
    int rc = ff_gemm_run(gm, "moe router", 0, 1, m, E, g->cy, 1.0f, ln2, g->cy, g->pv.routerw[l],
                         g->cy, 0.0f, g->moe_part, E);
    if (rc || (rc = sum_over_y(g, a->probs, g->moe_part, m * E)))
        return rc;
    ff_moe_route(E, k, m, a->probs, a->choice, a->gate);
    if (g->opt.balanced_routing)
        ff_moe_route_balanced(E, k, g->T, m, a->probs, a->choice, a->gate);
    int64_t dropped =
        ff_moe_place(E, k, g->moe_cap, g->T, m, a->choice, a->row, a->start, a->row_token);
    /* over the micro-batch: first choices and probabilities of each expert,
     * the assignments dropped */
    float *st = g->moe_stats;
    memset(st, 0, (size_t)(2 * E + 1) * sizeof(float));
    for (int e = 0; e < E; e++) { /* (the probabilities summed in double) */
        double p = 0;
        for (int64_t t = 0; t < m; t++)
            p += a->probs[t * E + e];
        st[E + e] = (float)p;
    }
    for (int64_t t = 0; t < m; t++)
        st[a->choice[t * k]] += 1;
    st[2 * E] = (float)dropped;
    if ((rc = ff_allreduce(g->grp_zd, st, st, (size_t)(2 * E + 1), NULL)))
        return rc;
    const double n = (double)g->B * g->T; /* the micro-batch's tokens */
    double aux = 0;
    for (int e = 0; e < E; e++) {
        a->f_over_n[e] = st[e] / n / n;
        aux += st[e] / n * (st[E + e] / n);
    }
    if (!recompute) {
        g->moe_aux_sum += g->cfg.aux_coef * E * aux;
        g->moe_dropped_sum += st[2 * E];
        g->moe_assign_sum += n * k;
    }
    return FF_OK;
}

/* ---- expert parallelism ----------------------------------------------------
 * The ge ranks of an expert group (EP) hold el = E / ge experts each. A
 * rank sends each expert's rows to the expert's rank in a block of R rows
 * (R = B/(Gz Gd) sequences times min(capacity, T): no expert takes more of
 * them), whatever the count, so every all-to-all has one size: send block e
 * (e R rows on) goes to rank e / el as its local expert e mod el, and the
 * block from source j for local expert le arrives at (j el + le) R. The
 * counts go first, el floats to each rank. The local experts compute on
 * their rows packed together, expert by expert, source by source, and the
 * outputs return the same way. */

/* One all-to-all of E blocks of R rows, send to recv. With DTD (duplicate
 * token dropping, dissertation §7.3.1): the rows are replicated over X, so
 * X rank x moves only rows [x ch, (x + 1) ch) of each block (ch = R / Gx
 * rounded up) and the X group all-gathers the pieces: the all-to-all's
 * bytes fall by Gx, and the same rows arrive. send is overwritten. */
static int exchange(ff_gpt *g, float *send, float *recv)
{
    const int64_t R = g->moe_R, cy = g->cy, E = g->E;
    if (!g->moe_dtd)
        return ff_alltoall(g->grp_ep, send, recv, (size_t)(g->el * R * cy), &g->opt.linear.coll);
    const int64_t ch = g->moe_ch, x0 = (int64_t)g->me.x * ch;
    for (int64_t b = 0; b < E; b++) /* this rank's piece of each block, packed (in place) */
        memmove(send + b * ch * cy, send + (b * R + x0) * cy,
                (size_t)((x0 < R ? (R - x0 < ch ? R - x0 : ch) : 0) * cy) * sizeof(float));
    int rc =
        ff_alltoall(g->grp_ep, send, g->moe_recv, (size_t)(g->el * ch * cy), &g->opt.linear.coll);
    if (rc || (rc = ff_allgather(g->grp_x, g->moe_recv, g->moe_gath, (size_t)(E * ch * cy),
                                 &g->opt.linear.coll)))
        return rc;
    for (int64_t x = 0; x < g->gx; x++)
        for (int64_t b = 0; b < E && x * ch < R; b++)
            memcpy(recv + (b * R + x * ch) * cy, g->moe_gath + ((x * E + b) * ch) * cy,
                   (size_t)((R - x * ch < ch ? R - x * ch : ch) * cy) * sizeof(float));
    return FF_OK;
}

/* Between all-to-all blocks (a row of block b at (b R + i)) and the local
 * experts' packed rows: to_packed 1 packs what arrived, 0 lays packed rows
 * out for the return. */
static void repack(ff_gpt *g, const ff_gpt_moe_acts *a, float *blocks, float *packed, int64_t w,
                   int to_packed)
{
    for (int le = 0; le < g->el; le++) {
        int64_t r = a->own0[le];
        for (int j = 0; j < g->ge; j++) {
            const int64_t b = (int64_t)j * g->el + le, n = (int64_t)a->count_in[b];
            float *blk = blocks + b * g->moe_R * w, *pk = packed + r * w;
            if (to_packed)
                memcpy(pk, blk, (size_t)(n * w) * sizeof(float));
            else
                memcpy(blk, pk, (size_t)(n * w) * sizeof(float));
            r += n;
        }
    }
}

/* The output row of this rank's assignment in row r (expert e's). */
static const float *out_row(const ff_gpt *g, const ff_gpt_moe_acts *a, int e, int64_t r)
{
    const int64_t i = g->ge > 1 ? (int64_t)e * g->moe_R + (r - a->start[e]) : r;
    return a->O + i * g->cy;
}

/* The local experts' forward on their packed rows (X in, O out). */
static int experts_forward(ff_gpt *g, int l, ff_gpt_moe_acts *a, float *O)
{
    const int64_t cy = g->cy, fx = g->fx;
    int rc = FF_OK;
    for (int le = 0; le < g->el && rc == FF_OK; le++) {
        const int64_t r0 = a->own0[le], n = a->own0[le + 1] - r0;
        float *X = a->X + r0 * cy, *Hp = a->Hp + r0 * fx, *A = a->A + r0 * fx;
        if ((rc = ff_linear_forward(g->efc[l * g->el + le], Hp, X, n)))
            break;
        ff_gelu_forward(g->ctx, A, Hp, n * fx);
        rc = ff_linear_forward(g->efcproj[l * g->el + le], O + r0 * cy, A, n);
    }
    return rc;
}

int ff_gpt_moe_forward(ff_gpt *g, int l, ff_gpt_acts *act, float *out, int recompute)
{
    ff_gpt_moe_acts *a = &act->moe;
    const int E = g->E, k = g->top_k;
    const int64_t m = g->m, cy = g->cy, R = g->moe_R;
    int rc = route(g, l, a, act->ln2, recompute);
    if (rc)
        return rc;
    /* each local expert on its rows (every expert runs, with no rows if
     * none: its weight's all-gather is collective over Z) */
    if (g->ge == 1) {
        for (int e = 0; e <= E; e++)
            a->own0[e] = a->start[e];
        for (int64_t r = 0; r < a->start[E]; r++)
            memcpy(a->X + r * cy, act->ln2 + a->row_token[r] * cy, (size_t)cy * sizeof(float));
        if ((rc = experts_forward(g, l, a, a->O)))
            return rc;
    } else {
        float *cnt = g->moe_part;
        for (int e = 0; e < E; e++) {
            const int64_t n = a->start[e + 1] - a->start[e];
            cnt[e] = (float)n;
            for (int64_t i = 0; i < n; i++)
                memcpy(g->moe_send + (e * R + i) * cy,
                       act->ln2 + a->row_token[a->start[e] + i] * cy, (size_t)cy * sizeof(float));
        }
        if ((rc = ff_alltoall(g->grp_ep, cnt, a->count_in, (size_t)g->el, NULL)) ||
            (rc = exchange(g, g->moe_send, g->moe_recv)))
            return rc;
        a->own0[0] = 0;
        for (int le = 0; le < g->el; le++) {
            a->own0[le + 1] = a->own0[le];
            for (int j = 0; j < g->ge; j++)
                a->own0[le + 1] += (int64_t)a->count_in[j * g->el + le];
        }
        repack(g, a, g->moe_recv, a->X, cy, 1);
        // the local experts' outputs (packed, into recv), back to their tokens' ranks
        if ((rc = experts_forward(g, l, a, g->moe_recv)))
            return rc;
        repack(g, a, g->moe_send, g->moe_recv, cy, 0);
        if ((rc = exchange(g, g->moe_send, a->O)))
            return rc;
    }
    if (recompute)
        return FF_OK;
    // out (m, C/Gy) = mid + each token's kept outputs times their gates, in slot order
    memcpy(out, act->mid, (size_t)(m * cy) * sizeof(float));
    for (int64_t t = 0; t < m; t++)
        for (int j = 0; j < k; j++) {
            int64_t r = a->row[t * k + j];
            if (r < 0)
                continue;
            float gt = a->gate[t * k + j], *o = out + t * cy;
            const float *x = out_row(g, a, a->choice[t * k + j], r);
            for (int64_t c = 0; c < cy; c++)
                o[c] += gt * x[c];
        }
    return FF_OK;
}

int ff_gpt_moe_backward(ff_gpt *g, int l, ff_gpt_acts *act)
{
    ff_gpt_moe_acts *a = &act->moe;
    const int E = g->E, k = g->top_k, ep = g->ge > 1;
    const int64_t m = g->m, cy = g->cy, fx = g->fx, R = g->moe_R;
    const float *dy = g->dres;
    /* dO: the gradients of this rank's assignments' outputs, by row (or in
     * all-to-all blocks); then the local experts' packed */
    float *dO = ep ? g->moe_send : g->moe_dO, *dgate = g->moe_dgate;
    int rc;
    // d gate (m k) = <dy_t, O_r> over C (partial over this Y rank's columns);
    // dO (rows, C/Gy) = gate dy_t
    for (int64_t t = 0; t < m; t++)
        for (int j = 0; j < k; j++) {
            const int64_t r = a->row[t * k + j];
            const int e = a->choice[t * k + j];
            float d = 0;
            if (r >= 0) {
                const float *o = out_row(g, a, e, r), *dyt = dy + t * cy;
                float gt = a->gate[t * k + j];
                float *dOr = dO + (ep ? (int64_t)e * R + (r - a->start[e]) : r) * cy;
                for (int64_t c = 0; c < cy; c++) {
                    d += dyt[c] * o[c];
                    dOr[c] = gt * dyt[c];
                }
            }
            g->moe_part[t * k + j] = d;
        }
    if ((rc = sum_over_y(g, dgate, g->moe_part, m * k)))
        return rc;
    if (ep) { /* to the experts' ranks, packed */
        if ((rc = exchange(g, g->moe_send, g->moe_recv)))
            return rc;
        repack(g, a, g->moe_recv, g->moe_dO, cy, 1);
    }
    // the local experts backward, last first (the program's order)
    for (int le = g->el - 1; le >= 0; le--) {
        const int64_t r0 = a->own0[le], n = a->own0[le + 1] - r0;
        float *dA = g->moe_dA, *dX = ep ? g->moe_dO + r0 * cy : g->moe_dX;
        if ((rc = ff_linear_backward(g->efcproj[l * g->el + le], dA, g->moe_dO + r0 * cy,
                                     a->A + r0 * fx, n)))
            return rc;
        ff_gelu_backward(g->ctx, dA, a->Hp + r0 * fx, dA, n * fx);
        /* (with expert parallelism dX overwrites this expert's dO, read) */
        if ((rc = ff_linear_backward(g->efc[l * g->el + le], dX, dA, a->X + r0 * cy, n)))
            return rc;
        if (ep)
            continue;
        if (le == g->el - 1)
            memset(g->dln, 0, (size_t)(m * cy) * sizeof(float));
        for (int64_t i = 0; i < n; i++) {
            float *d = g->dln + a->row_token[r0 + i] * cy;
            for (int64_t c = 0; c < cy; c++)
                d[c] += dX[i * cy + c];
        }
    }
    if (ep) { /* the input gradients back to their tokens' ranks: dln */
        repack(g, a, g->moe_send, g->moe_dO, cy, 0);
        if ((rc = exchange(g, g->moe_send, g->moe_recv)))
            return rc;
        memset(g->dln, 0, (size_t)(m * cy) * sizeof(float));
        for (int e = E - 1; e >= 0; e--)
            for (int64_t r = a->start[e]; r < a->start[e + 1]; r++) {
                const float *dX = g->moe_recv + (e * R + (r - a->start[e])) * cy;
                float *d = g->dln + a->row_token[r] * cy;
                for (int64_t c = 0; c < cy; c++)
                    d[c] += dX[c];
            }
    }
    // d logits (m, E): the gates, the load-balancing loss (weight g->moe_aux_wt), the softmax
    float *dp = g->moe_part;
    ff_moe_gate_backward(E, k, m, a->probs, a->choice, a->row, dgate, a->f_over_n,
                         (double)g->moe_aux_wt * g->cfg.aux_coef * E, dp);
    // router: dWr (E, C/Gy) += dlogits^T ln2; dln += dlogits Wr
    ff_gemm *gm = ff_linear_seq_gemm(g->seq);
    if ((rc = ff_gemm_run(gm, "moe dwr", 1, 0, E, cy, m, 1.0f, dp, E, act->ln2, cy, 1.0f,
                          g->gv.routerw[l], cy)))
        return rc;
    return ff_gemm_run(gm, "moe dx", 0, 0, m, cy, E, 1.0f, dp, E, g->pv.routerw[l], cy, 1.0f,
                       g->dln, cy);
}

void ff_gpt_moe_stats(const ff_gpt *g, float *aux_loss, float *dropped)
{
    *aux_loss = g->moe_aux;
    *dropped = g->moe_dropped;
}

int ff_gpt_moe_routing(const ff_gpt *g, int l, int *choice, float *probs)
{
    const int lo = l - g->l0; /* the block on this stage */
    if (lo < 0 || lo >= g->nb || !g->is_moe[lo])
        return ff_set_error(g->ctx, FF_EINVAL, "block %d is not an MoE block of this rank's stage",
                            l);
    if (g->P > 1 || g->set_of[lo] < 0)
        return ff_set_error(g->ctx, FF_EINVAL,
                            "block %d's routing is not kept: its activations are shared (%s)", l,
                            g->P > 1 ? "pipeline stages" : "checkpointing without CAC");
    const ff_gpt_moe_acts *a = &g->acts[g->set_of[lo]].moe; /* one slot without stages */
    const int64_t n = g->m * g->top_k;
    for (int64_t i = 0; i < n; i++)
        choice[i] = a->row[i] < 0 ? ~a->choice[i] : a->choice[i];
    if (probs)
        memcpy(probs, a->probs, (size_t)(g->m * g->E) * sizeof(float));
    return FF_OK;
}

ff_group *ff_gpt_expert_group(const ff_gpt *g, int replicas)
{
    return g->E ? (replicas ? g->grp_edp : g->grp_ep) : NULL;
}
