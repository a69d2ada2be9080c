/* What the `fourfold bench` subcommands share (bench.h): the timing loops
 * of collectives, nccl-tests' short options, atomic file writing. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench.h"
#include "util/file.h"

int bench_run_once(ff_group *g, ff_coll coll, int algo, ff_wire wire, const float *send,
                   float *recv, size_t count)
{
    if (algo == BENCH_MPI_BLOCKING) {
        MPI_Comm comm = ff_group_comm(g);
        int n = (int)count, r = ff_group_rank(g), rc;
        switch (coll) {
        case FF_COLL_ALLGATHER:
            rc = MPI_Allgather(send == recv + (size_t)r * count ? MPI_IN_PLACE : send, n, MPI_FLOAT,
                               recv, n, MPI_FLOAT, comm);
            break;
        case FF_COLL_REDUCE_SCATTER:
            rc = MPI_Reduce_scatter_block(send, recv, n, MPI_FLOAT, MPI_SUM, comm);
            break;
        case FF_COLL_ALLREDUCE:
            rc = MPI_Allreduce(send == recv ? MPI_IN_PLACE : send, recv, n, MPI_FLOAT, MPI_SUM,
                               comm);
            break;
        default: rc = MPI_Alltoall(send, n, MPI_FLOAT, recv, n, MPI_FLOAT, comm); break;
        }
        return rc == MPI_SUCCESS ? FF_OK : FF_EMPI;
    }
    ff_coll_opts o = {wire, (ff_algo)algo};
    ff_request *req = NULL;
    int rc;
    switch (coll) {
    case FF_COLL_ALLGATHER: rc = ff_iallgather(g, send, recv, count, &o, &req); break;
    case FF_COLL_REDUCE_SCATTER: rc = ff_ireduce_scatter(g, send, recv, count, &o, &req); break;
    case FF_COLL_ALLREDUCE: rc = ff_iallreduce(g, send, recv, count, &o, &req); break;
    default: rc = ff_ialltoall(g, send, recv, count, &o, &req); break;
    }
    return rc == FF_OK ? ff_wait(&req) : rc;
}

/* A failure inside a collective leaves the group's other ranks waiting in
 * it (STYLE: MPI_Abort only then). */
void bench_die_in_collective(ff_ctx *ctx, int rc)
{
    fprintf(stderr, "fourfold: error: rank %d: %s (%s)\n", cli_world_rank(),
            ctx ? ff_ctx_error(ctx) : "", ff_strerror(rc));
    MPI_Abort(MPI_COMM_WORLD, CLI_FAIL);
}

void bench_time_algos(ff_ctx *ctx, ff_group *g, MPI_Comm sync, ff_coll coll, const int *algos,
                      int na, ff_wire wire, const float *send, float *recv, size_t count,
                      int warmup, int iters, double *med)
{
    if (iters < 1)
        iters = 1;
    double *t = calloc((size_t)na * (size_t)iters, sizeof *t);
    if (!t)
        bench_die_in_collective(ctx, FF_ENOMEM);
    for (int it = -warmup; it < iters; it++)
        for (int a = 0; a < na; a++) {
            MPI_Barrier(sync);
            double t0 = MPI_Wtime();
            int rc = g ? bench_run_once(g, coll, algos[a], wire, send, recv, count) : FF_OK;
            double dt = g ? MPI_Wtime() - t0 : 0;
            if (rc != FF_OK)
                bench_die_in_collective(ctx, rc);
            if (it >= 0)
                t[(size_t)a * iters + it] = dt;
        }
    MPI_Allreduce(MPI_IN_PLACE, t, na * iters, MPI_DOUBLE, MPI_MAX, sync);
    for (int a = 0; a < na; a++)
        med[a] = ff_median(t + (size_t)a * iters, iters);
    free(t);
}

double bench_time_coll(ff_ctx *ctx, ff_group *g, MPI_Comm sync, ff_coll coll, int algo,
                       ff_wire wire, const float *send, float *recv, size_t count, int warmup,
                       int iters)
{
    double med;
    bench_time_algos(ctx, g, sync, coll, &algo, 1, wire, send, recv, count, warmup, iters, &med);
    return med;
}

void bench_short_option(cli_args *a)
{
    if (a->name || !a->value || a->value[0] != '-' || !a->value[1] || a->value[2])
        return;
    const char c = a->value[1];
    a->name = c == 'b'   ? "minbytes"
              : c == 'e' ? "maxbytes"
              : c == 'f' ? "factor"
              : c == 'n' ? "iters"
              : c == 'w' ? "warmup"
                         : NULL;
}
