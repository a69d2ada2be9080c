/* The MPI library's own non-blocking collectives (FF_ALGO_MPI), for
 * comparison and for MPIs whose collectives beat ours. One step: the MPI
 * request. The library does not report what it sends, so the counters get
 * the ring volume (ff_ring_volume), the bandwidth-optimal figure of
 * docs/design.md §3. The bf16 wire reduces with a user-defined MPI_Op that adds in
 * fp32 and rounds each partial sum back to bf16. */
#include <limits.h>
#include <string.h>

#include "internal.h"

void ff_bf16_sum_op(void *in, void *inout, int *len, MPI_Datatype *type)
{
    (void)type;
    const uint16_t *a = in;
    uint16_t *b = inout;
    for (int i = 0; i < *len; i++)
        b[i] = ff_bf16_from_float(ff_bf16_to_float(a[i]) + ff_bf16_to_float(b[i]));
}

static size_t recv_elems(const ff_request *req)
{
    size_t p = (size_t)req->group->size;
    switch (req->coll) {
    case FF_COLL_ALLGATHER:
    case FF_COLL_ALLTOALL: return p * req->count;
    default: return req->count;
    }
}

static size_t send_elems(const ff_request *req)
{
    size_t p = (size_t)req->group->size;
    switch (req->coll) {
    case FF_COLL_REDUCE_SCATTER:
    case FF_COLL_ALLTOALL: return p * req->count;
    default: return req->count;
    }
}

static int mpilib_advance(ff_request *req)
{
    if (req->wire == FF_WIRE_BF16) {
        const uint16_t *rbuf = (const uint16_t *)req->scratch + send_elems(req);
        ff_bf16_unpack(req->recv, rbuf, recv_elems(req));
    }
    req->done = 1;
    return FF_OK;
}

int ff_mpilib_start(ff_request *req)
{
    ff_group *g = req->group;
    ff_ctx *ctx = g->ctx;
    size_t c = req->count, ns = send_elems(req), nr = recv_elems(req);
    if (c > INT_MAX)
        return ff_set_error(ctx, FF_EINVAL, "%s on group %s: count %zu exceeds MPI's int count",
                            ff_coll_name(req->coll), g->name, c);
    int n = (int)c, rc;
    MPI_Request *mr = &req->mpi[0];
    if (req->wire == FF_WIRE_BF16) {
        rc = ff_request_scratch(req, (ns + nr) * sizeof(uint16_t));
        if (rc != FF_OK)
            return rc;
        uint16_t *sbuf = req->scratch, *rbuf = sbuf + ns;
        ff_bf16_pack(sbuf, req->send, ns);
        MPI_Datatype t = MPI_UINT16_T;
        switch (req->coll) {
        case FF_COLL_ALLGATHER: rc = MPI_Iallgather(sbuf, n, t, rbuf, n, t, g->comm, mr); break;
        case FF_COLL_REDUCE_SCATTER:
            rc = MPI_Ireduce_scatter_block(sbuf, rbuf, n, t, ctx->bf16_sum, g->comm, mr);
            break;
        case FF_COLL_ALLREDUCE:
            rc = MPI_Iallreduce(sbuf, rbuf, n, t, ctx->bf16_sum, g->comm, mr);
            break;
        default: rc = MPI_Ialltoall(sbuf, n, t, rbuf, n, t, g->comm, mr); break;
        }
    } else {
        MPI_Datatype t = MPI_FLOAT;
        const void *s = req->send;
        switch (req->coll) {
        case FF_COLL_ALLGATHER:
            if (req->send == req->recv + (size_t)g->rank * c)
                s = MPI_IN_PLACE;
            rc = MPI_Iallgather(s, n, t, req->recv, n, t, g->comm, mr);
            break;
        case FF_COLL_REDUCE_SCATTER:
            rc = MPI_Ireduce_scatter_block(s, req->recv, n, t, MPI_SUM, g->comm, mr);
            break;
        case FF_COLL_ALLREDUCE:
            if (req->send == req->recv)
                s = MPI_IN_PLACE;
            rc = MPI_Iallreduce(s, req->recv, n, t, MPI_SUM, g->comm, mr);
            break;
        default: rc = MPI_Ialltoall(s, n, t, req->recv, n, t, g->comm, mr); break;
        }
    }
    if (rc != MPI_SUCCESS)
        return ff_mpi_error(ctx, rc, "posting the MPI library's collective");
    req->n_mpi = 1;
    size_t sent, recv;
    ff_ring_volume(req->coll, g->size, g->rank, c, &sent, &recv);
    size_t es = req->wire == FF_WIRE_BF16 ? 2 : 4;
    ff_count_bytes(req, sent * es, recv * es);
    req->advance = mpilib_advance;
    return FF_OK;
}
