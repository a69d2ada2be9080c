/* Non-blocking collectives of float32 on a group of the grid.
 *
 * Every call posts the collective and returns a request; ff_wait() completes
 * and frees it. Between the two the collective advances inside ff_test(),
 * ff_wait(), ff_progress() and, in FF_PROGRESS_POLL mode, ff_poll() (which
 * compute loops call), or on the context's progress thread.
 *
 * All ranks of a group must post the collectives of that group in the same
 * order with the same sizes (as with MPI). Several collectives may be in flight
 * at once, on the same or different groups, and may be waited on in any order.
 *
 * Errors: arguments are checked before anything is posted, identically on
 * every rank given the same arguments. An error after posting (MPI failure,
 * out of memory for scratch) is local to a rank: the request is cancelled,
 * the receive buffer is undefined, and the group is unusable (its peers are
 * mid-collective); the caller should report and abort. Wait on every request
 * before ff_ctx_destroy(), which cancels any still in flight.
 *
 * A group of size 1 costs nothing: no MPI call, no counter; the result is a
 * copy (or nothing, in place), and for the bf16 wire no rounding either.
 *
 * Counters (per group and collective) record the bytes this rank actually
 * posted to the wire with MPI_Isend/MPI_Irecv for fourfold's own algorithms;
 * for FF_ALGO_MPI (the library's algorithm, whose traffic is not observable)
 * they record the bandwidth-optimal volume of a ring, which is what DESIGN §3
 * tabulates. See docs/collectives.md. */
#ifndef FOURFOLD_COMM_H
#define FOURFOLD_COMM_H

#include <stddef.h>
#include <stdint.h>

#include "fourfold/ctx.h"
#include "fourfold/grid.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
    FF_COLL_ALLGATHER = 0,
    FF_COLL_REDUCE_SCATTER,
    FF_COLL_ALLREDUCE,
    FF_COLL_ALLTOALL,
    FF_NCOLL
} ff_coll;

/* Element format on the wire. FF_WIRE_BF16 rounds each value to bfloat16
 * (round to nearest even) before it is sent and accumulates in fp32.
 * All-gather and all-to-all deliver exactly bf16(x) (the rank's own block
 * too), and all-reduce results are rounded once more at the end, so replicas
 * stay bitwise identical; a reduce-scatter result (one owner, no replicas) is
 * the fp32 sum of a rounded partial and the owner's own value. Error bound:
 * docs/collectives.md. */
typedef enum { FF_WIRE_FP32 = 0, FF_WIRE_BF16 } ff_wire;

typedef enum {
    FF_ALGO_AUTO = 0, /* let the layer choose */
    FF_ALGO_MPI,      /* the MPI library's non-blocking collective */
    FF_ALGO_RING,     /* fourfold's ring (pairwise exchange for all-to-all) */
    FF_NALGO
} ff_algo;

typedef struct {
    ff_wire wire;
    ff_algo algo;
} ff_coll_opts; /* NULL means {FF_WIRE_FP32, FF_ALGO_AUTO} */

typedef struct ff_request ff_request;

/* recv[r*count .. (r+1)*count) = send of group rank r. In place when
 * send == recv + rank*count. */
int ff_iallgather(ff_group *g, const float *send, float *recv, size_t count,
                  const ff_coll_opts *opt, ff_request **req);
/* recv[0..count) = sum over ranks of send[rank*count .. (rank+1)*count). */
int ff_ireduce_scatter(ff_group *g, const float *send, float *recv, size_t count,
                       const ff_coll_opts *opt, ff_request **req);
/* recv[0..count) = sum over ranks of send[0..count). In place when send == recv. */
int ff_iallreduce(ff_group *g, const float *send, float *recv, size_t count,
                  const ff_coll_opts *opt, ff_request **req);
/* recv[r*count ..) on rank s = send[s*count ..) on rank r. Not in place. */
int ff_ialltoall(ff_group *g, const float *send, float *recv, size_t count, const ff_coll_opts *opt,
                 ff_request **req);

/* Completes *req, frees it and sets *req = NULL. A NULL *req is a no-op, so a
 * request slot can be waited on unconditionally. Time spent here is counted as
 * "blocked waiting" for the request's group and collective. */
int ff_wait(ff_request **req);
int ff_waitall(ff_request **reqs, int n);
/* *done = 1 if the collective has completed (the request stays valid). */
int ff_test(ff_request *req, int *done);

/* Advances every posted collective of the context as far as it can go now. */
int ff_progress(ff_ctx *ctx);
/* Cheap to call often: in FF_PROGRESS_POLL mode, calls ff_progress() if any
 * collective is in flight and the poll interval has passed; otherwise returns
 * at once. Compute loops call it between chunks of work. */
void ff_poll(ff_ctx *ctx);
/* Number of collectives posted and not yet waited on. */
int ff_in_flight(const ff_ctx *ctx);

/* Blocking convenience wrappers (post + wait). */
int ff_allgather(ff_group *g, const float *send, float *recv, size_t count,
                 const ff_coll_opts *opt);
int ff_reduce_scatter(ff_group *g, const float *send, float *recv, size_t count,
                      const ff_coll_opts *opt);
int ff_allreduce(ff_group *g, const float *send, float *recv, size_t count,
                 const ff_coll_opts *opt);
int ff_alltoall(ff_group *g, const float *send, float *recv, size_t count, const ff_coll_opts *opt);

/* Per (group, collective) counters. */
typedef struct {
    uint64_t calls;      /* collectives posted on a group of size > 1 */
    uint64_t bytes_sent; /* bytes this rank sent */
    uint64_t bytes_recv; /* bytes this rank received */
    double wait_s;       /* seconds blocked in ff_wait/ff_waitall */
    double flight_s;     /* seconds from post to observed completion */
} ff_counters;

ff_counters ff_group_counters(const ff_group *g, ff_coll coll);
void ff_group_counters_reset(ff_group *g);

const char *ff_coll_name(ff_coll coll);
const char *ff_algo_name(ff_algo algo);
/* Parses "mpi", "ring", "auto"; returns -1 if unknown. */
int ff_algo_parse(const char *name);

/* bfloat16 conversion (round to nearest even; NaN stays NaN). */
uint16_t ff_bf16_from_float(float f);
float ff_bf16_to_float(uint16_t h);

#ifdef __cplusplus
}
#endif
#endif
