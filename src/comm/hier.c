/* FF_ALGO_HIER_RING and FF_ALGO_HIER_REC: the two-level all-gather and
 * reduce-scatter of PCCL (dissertation ch. 6, §6.2.1), and all-reduce as the
 * one then the other.
 *
 * The group spans N nodes with k of its ranks on each; rank (j, i) is the one
 * with local index i on node j (algo.h: nodes in order of their lowest group
 * rank). All-gather:
 *   1. inter-node: the k sets of ranks with the same local index (one per
 *      node) all-gather their blocks at once, each set over its own
 *      connections (ring, or recursive doubling for HIER_REC), so every
 *      node's k ranks use the network concurrently (§6.2.1's point: all NICs
 *      busy; here k streams share one link);
 *   2. intra-node: a ring all-gather over the node's k ranks of the N blocks
 *      each now holds;
 *   3. local reordering: the blocks sit in "local index major" order, stage
 *      position i*N + j for rank (j, i); they are copied to group-rank order.
 * Reduce-scatter: the reverse (reorder the input, intra-node ring
 * reduce-scatter, inter-node reduce-scatter). All-reduce: intra RS, inter RS,
 * inter AG, intra AG on the vector cut into p chunks in stage order, so no
 * reordering at all (it does not matter which rank finishes which chunk).
 *
 * Bytes per rank equal the flat ring's: (N-1) blocks between nodes plus
 * (k-1)*N blocks within the node = (p-1) blocks; but only (N-1)*k blocks per
 * node cross its link instead of the ring's p-1, in N-1 (or lg N) inter-node
 * steps instead of p-1. The ring stays ahead where inter-node bandwidth
 * dominates with k = 1, i.e. never here: hierarchical needs N > 1 and k > 1 to
 * differ from the flat algorithms.
 *
 * A group whose nodes hold different numbers of its ranks runs the flat
 * algorithm of its inter-node phase (RING or REC) instead; req->algo says so,
 * and docs/collectives.md explains why. */
#include <string.h>

#include "algo.h"

typedef struct {
    int N, k, j, i;
    const int *member;
} layout;

static size_t stage_pos(const layout *l, int node, int local)
{
    return (size_t)local * l->N + node;
}

/* Scratch does not know the layout; keep it next to the schedule. The
 * layout lives as long as its group, which outlives its requests. */
static const ff_topo *topo_of(const ff_request *req) { return req->group->topo; }

static layout layout_of(const ff_topo *t)
{
    layout l = {t->n_nodes, t->per_node, t->my_node, t->my_local, t->member};
    return l;
}

/* Views: inter-node = the N ranks with local index i, intra-node = the k
 * ranks of node j. `off(pos)` is the element offset of stage position pos. */
static void set_views(ff_sched *s, const layout *l, ff_phase_kind inter_kind,
                      ff_phase_kind intra_kind, size_t c, size_t n_ar, int p)
{
    int *ip = s->ints, *ap = s->ints + l->N;
    size_t *ib = s->sizes, *ab = s->sizes + l->N + 1;
    for (int jj = 0; jj < l->N; jj++)
        ip[jj] = l->member[jj * l->k + l->i];
    for (int ii = 0; ii < l->k; ii++)
        ap[ii] = l->member[l->j * l->k + ii];
    for (int jj = 0; jj <= l->N; jj++) {
        size_t pos = stage_pos(l, 0, l->i) + (size_t)jj;
        ib[jj] = n_ar ? ff_chunk_off(n_ar, p, (int)pos) : pos * c;
    }
    for (int ii = 0; ii <= l->k; ii++) {
        size_t pos = (size_t)ii * l->N;
        ab[ii] = n_ar ? ff_chunk_off(n_ar, p, (int)pos) : pos * c;
    }
    ff_phase inter = {inter_kind, l->N, l->j, ip, ib, 0, 0, 0};
    ff_phase intra = {intra_kind, l->k, l->i, ap, ab, 0, 0, 0};
    s->ph[0] = inter; /* callers order and adjust them */
    s->ph[1] = intra;
}

static int ag_finish(ff_request *req, ff_sched *s)
{
    layout l = layout_of(topo_of(req));
    size_t c = req->count;
    for (int jj = 0; jj < l.N; jj++)
        for (int ii = 0; ii < l.k; ii++) {
            float *dst = req->recv + (size_t)l.member[jj * l.k + ii] * c;
            size_t pos = stage_pos(&l, jj, ii) * c;
            if (req->wire == FF_WIRE_BF16)
                ff_bf16_unpack(dst, (const uint16_t *)s->stage + pos, c);
            else
                memcpy(dst, (const float *)s->stage + pos, c * sizeof(float));
        }
    return FF_OK;
}

static int rs_finish(ff_request *req, ff_sched *s)
{
    layout l = layout_of(topo_of(req));
    memcpy(req->recv, s->W + stage_pos(&l, l.j, l.i) * req->count, req->count * sizeof(float));
    return FF_OK;
}

/* All-reduce on the bf16 wire, before the inter-node all-gather: round what
 * the inter-node reduce-scatter completed into the all-gather's stage. */
static int ar_round_owned(ff_request *req, ff_sched *s)
{
    (void)req;
    size_t off, len;
    ff_phase_owned(&s->ph[1], &off, &len);
    ff_bf16_pack((uint16_t *)s->stage + off, s->W + off, len);
    return FF_OK;
}

static int ar_finish_bf16(ff_request *req, ff_sched *s)
{
    ff_bf16_unpack(req->recv, s->stage, req->count);
    return FF_OK;
}

static size_t max2(size_t a, size_t b) { return a > b ? a : b; }

int ff_hier_start(ff_request *req)
{
    ff_group *g = req->group;
    ff_ctx *ctx = g->ctx;
    const ff_topo *t = ff_group_topo(g);
    if (!t)
        return ff_set_error(ctx, FF_ENOMEM, "out of memory posting %s", ff_coll_name(req->coll));
    int rec = req->algo == FF_ALGO_HIER_REC;
    if (t->per_node == 0) { /* uneven nodes: the flat algorithm (see above) */
        req->algo = rec ? FF_ALGO_REC : FF_ALGO_RING;
        return rec ? ff_rec_start(req) : ff_ring_start(req);
    }
    layout l = layout_of(t);
    int p = g->size, rc;
    size_t c = req->count;
    int bf16 = req->wire == FF_WIRE_BF16;
    ff_sched *s = ff_sched_new(req, (size_t)(l.N + l.k), (size_t)(l.N + l.k + 2));
    if (!s)
        return ff_set_error(ctx, FF_ENOMEM, "out of memory posting %s", ff_coll_name(req->coll));
    ff_phase_kind inter_ag = rec ? FF_PH_AG_REC : FF_PH_AG_RING;
    ff_phase_kind inter_rs = rec ? FF_PH_RS_REC : FF_PH_RS_RING;

    switch (req->coll) {
    case FF_COLL_ALLGATHER:
        set_views(s, &l, inter_ag, FF_PH_AG_RING, c, 0, p);
        s->ph[0].fold_in = 1;
        s->ph[0].fold_out = 1;
        s->nph = 2;
        if ((rc = ff_sched_carve(req, s, 0, 0, (size_t)p * c)) != FF_OK)
            return rc;
        if (bf16)
            ff_bf16_pack((uint16_t *)s->stage + stage_pos(&l, l.j, l.i) * c, req->send, c);
        else
            memcpy((float *)s->stage + stage_pos(&l, l.j, l.i) * c, req->send, c * sizeof(float));
        s->finish = ag_finish;
        break;
    case FF_COLL_REDUCE_SCATTER: {
        set_views(s, &l, inter_rs, FF_PH_RS_RING, c, 0, p);
        ff_phase inter = s->ph[0];
        s->ph[0] = s->ph[1]; /* intra-node first */
        s->ph[1] = inter;
        s->ph[1].fold_out = 1;
        s->nph = 2;
        size_t msg = max2(ff_phase_max_rs_msg(&s->ph[0]), ff_phase_max_rs_msg(&s->ph[1]));
        if ((rc = ff_sched_carve(req, s, (size_t)p * c, msg, 0)) != FF_OK)
            return rc;
        for (int jj = 0; jj < l.N; jj++) /* the input in stage order */
            for (int ii = 0; ii < l.k; ii++)
                memcpy(s->W + stage_pos(&l, jj, ii) * c,
                       req->send + (size_t)l.member[jj * l.k + ii] * c, c * sizeof(float));
        s->finish = rs_finish;
        break;
    }
    case FF_COLL_ALLREDUCE: {
        set_views(s, &l, inter_rs, FF_PH_RS_RING, 0, c, p);
        ff_phase inter = s->ph[0], intra = s->ph[1];
        s->ph[0] = intra;
        s->ph[1] = inter;
        s->ph[2] = inter;
        s->ph[2].kind = inter_ag;
        s->ph[2].fold_out = 2;
        s->ph[3] = intra;
        s->ph[3].kind = FF_PH_AG_RING;
        s->nph = 4;
        size_t msg = max2(ff_phase_max_rs_msg(&s->ph[0]), ff_phase_max_rs_msg(&s->ph[1]));
        if ((rc = ff_sched_carve(req, s, 0, msg, bf16 ? c : 0)) != FF_OK)
            return rc;
        s->W = req->recv;
        if (req->send != req->recv)
            memcpy(req->recv, req->send, c * sizeof(float));
        if (bf16) {
            s->before[2] = ar_round_owned;
            s->finish = ar_finish_bf16;
        } else {
            s->stage = req->recv;
        }
        break;
    }
    default:
        return ff_set_error(ctx, FF_EUNSUPPORTED, "%s has no hierarchical algorithm",
                            ff_coll_name(req->coll));
    }
    return ff_sched_run(req, s);
}
