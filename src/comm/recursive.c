/* FF_ALGO_REC: recursive doubling all-gather, recursive halving
 * reduce-scatter, and all-reduce as the two in sequence over p chunks of the
 * vector (Rabenseifner), for any group size (the non-power-of-two fold is
 * in phase.c).
 *
 * Why: lg p steps instead of the ring's p-1, for latency-bound sizes (the
 * inter-node phase of PCCL, dissertation §6.2.3). For a power-of-two group
 * they move exactly the ring's bytes ((p-1) blocks; 2(p-1)/p of the vector
 * for all-reduce when p divides it). For other p the fold costs the extra
 * ranks and their partners one more message of up to the whole vector.
 *
 * Buffers: all-gather works in recv (fp32) or a bf16 copy of it; the
 * reduce-scatter accumulates in fp32 scratch (filled by its first step from
 * send, not copied) and copies the rank's block out at the end; all-reduce
 * accumulates in recv itself.
 * bf16 wire: as in ring.c, values are rounded before every send and summed in
 * fp32; the all-reduce rounds each completed chunk before the all-gather so
 * every replica holds the same bits.
 *
 * FF_ALGO_REC_WHOLE (all-reduce only): recursive doubling on the whole
 * vector, one FF_PH_AR_REC phase in recv: lg p steps instead of 2 lg p, for
 * vectors so short that a step's alpha outweighs its bytes (MPICH and Open
 * MPI run it for small all-reduces); it sends lg p whole vectors where
 * Rabenseifner sends 2(p-1)/p of one. On the bf16 wire both ends of an
 * exchange round their own partial sum too, and the result is rounded once
 * more at the end, so every replica (the fold's extra included) holds the
 * same bits.
 *
 * FF_ALGO_DIRECT: the same schedules with direct phases (phase.c) in place
 * of the recursive ones: every partner at once (up to the all-to-all's
 * window per round), so one latency where the ring pays p-1 and rec lg p,
 * for the ring's bytes. What the MPI library's non-blocking all-gather
 * does (a one-round linear exchange), and what beat our ring and rec at
 * 4-64 KiB on 4 emulated nodes with a 100 us delay (docs/coll-bench.md).
 * The reduce-scatter receives a round's contributions to its block into
 * scratch (as many blocks as the round has partners, at most the window)
 * and adds them in order when the round completes, into an accumulator of
 * just its own block (w_base): each is rounded once on the bf16 wire, and
 * an all-reduce chunk once more before the all-gather. */
#include <string.h>

#include "algo.h"

static int ag_finish_bf16(ff_request *req, ff_sched *s)
{
    ff_bf16_unpack(req->recv, s->stage, (size_t)req->group->size * req->count);
    return FF_OK;
}

static int rs_finish(ff_request *req, ff_sched *s)
{
    size_t own = (size_t)req->group->rank * req->count;
    memcpy(req->recv, s->W + (own - s->w_base), req->count * sizeof(float));
    return FF_OK;
}

/* All-reduce, bf16 wire, between the two phases: round the chunks this rank
 * completed into the staging buffer of the all-gather. */
static int ar_round_owned(ff_request *req, ff_sched *s)
{
    (void)req;
    size_t off, len;
    ff_phase_owned(&s->ph[0], &off, &len);
    ff_bf16_pack((uint16_t *)s->stage + off, s->W + off, len);
    return FF_OK;
}

static int ar_finish_bf16(ff_request *req, ff_sched *s)
{
    ff_bf16_unpack(req->recv, s->stage, req->count);
    return FF_OK;
}

static int whole_finish_bf16(ff_request *req, ff_sched *s)
{
    (void)s;
    ff_bf16_round(req->recv, req->count);
    return FF_OK;
}

int ff_rec_start(ff_request *req)
{
    ff_group *g = req->group;
    int p = g->size, r = g->rank, rc;
    size_t c = req->count;
    int bf16 = req->wire == FF_WIRE_BF16;
    ff_sched *s = ff_sched_new(req, (size_t)p, (size_t)p + 1);
    if (!s)
        return ff_set_error(g->ctx, FF_ENOMEM, "out of memory posting %s", ff_coll_name(req->coll));
    for (int i = 0; i < p; i++)
        s->ints[i] = i;
    int direct = req->algo == FF_ALGO_DIRECT;
    ff_phase_kind ag = direct ? FF_PH_AG_DIRECT : FF_PH_AG_REC;
    ff_phase_kind rs = direct ? FF_PH_RS_DIRECT : FF_PH_RS_REC;
    ff_phase view = {ag, p, r, s->ints, s->sizes, 0, 0, g->ctx->coll->a2a_window};
    s->din = req->send; /* a direct reduce-scatter's sends */
    for (int i = 0; i <= p; i++)
        s->sizes[i] = req->coll == FF_COLL_ALLREDUCE ? ff_chunk_off(c, p, i) : (size_t)i * c;

    switch (req->coll) {
    case FF_COLL_ALLGATHER: {
        float *own = req->recv + (size_t)r * c;
        s->ph[0] = view;
        s->ph[0].fold_in = 1;
        s->ph[0].fold_out = 1;
        s->nph = 1;
        if (bf16) {
            if ((rc = ff_sched_carve(req, s, 0, 0, (size_t)p * c)) != FF_OK)
                return rc;
            ff_bf16_pack((uint16_t *)s->stage + (size_t)r * c, req->send, c);
            s->finish = ag_finish_bf16;
        } else {
            s->stage = req->recv;
            if (req->send != own)
                memcpy(own, req->send, c * sizeof(float));
        }
        break;
    }
    case FF_COLL_REDUCE_SCATTER:
        s->ph[0] = view;
        s->ph[0].kind = rs;
        s->ph[0].fold_out = 1;
        s->nph = 1;
        /* direct adds into the rank's block only: W holds just that */
        if (direct)
            s->w_base = (size_t)r * c;
        if ((rc = ff_sched_carve(req, s, direct ? c : (size_t)p * c, ff_phase_max_rs_msg(&s->ph[0]),
                                 0)) != FF_OK)
            return rc;
        s->in = req->send; /* W fills as the first step adds into it */
        s->finish = rs_finish;
        break;
    case FF_COLL_ALLREDUCE:
        if (req->algo == FF_ALGO_REC_WHOLE) {
            s->ph[0] = view;
            s->ph[0].kind = FF_PH_AR_REC;
            s->ph[0].fold_out = 1; /* the extra gets the whole result */
            s->nph = 1;
            if ((rc = ff_sched_carve(req, s, 0, c, 0)) != FF_OK)
                return rc;
            s->W = req->recv;
            if (req->send != req->recv)
                s->in = req->send;
            s->round_own = bf16;
            if (bf16)
                s->finish = whole_finish_bf16;
            break;
        }
        s->ph[0] = view;
        s->ph[0].kind = rs;
        s->ph[1] = view;
        s->ph[1].fold_out = 2; /* the extra gave all its data away */
        s->nph = 2;
        if ((rc = ff_sched_carve(req, s, 0, ff_phase_max_rs_msg(&s->ph[0]), bf16 ? c : 0)) != FF_OK)
            return rc;
        s->W = req->recv;
        if (req->send != req->recv)
            s->in = req->send;
        if (bf16) {
            s->before[1] = ar_round_owned;
            s->finish = ar_finish_bf16;
        } else {
            s->stage = req->recv;
        }
        break;
    default:
        return ff_set_error(g->ctx, FF_EUNSUPPORTED, "%s has no recursive algorithm",
                            ff_coll_name(req->coll));
    }
    return ff_sched_run(req, s);
}

void ff_rec_whole_volume(int p, int r, size_t count, size_t *sent, size_t *recv)
{
    *sent = *recv = 0;
    if (p <= 1)
        return;
    int pof2 = ff_floor_pow2(p), rem = p - pof2, steps = 0;
    while ((1 << steps) < pof2)
        steps++;
    if (r < 2 * rem && r % 2 == 0) { /* an extra: its vector out, the result back */
        *sent = *recv = count;
        return;
    }
    *sent = *recv = (size_t)(steps + (r < 2 * rem)) * count;
}
