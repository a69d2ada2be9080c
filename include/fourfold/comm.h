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
 * they record the bandwidth-optimal volume of a ring, which is what docs/design.md §3
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
    FF_NCOLL,
    /* not a collective: the point-to-point messages of ff_isend/ff_irecv
     * (pipeline stages), counted and traced under this name ("p2p") */
    FF_COLL_P2P = FF_NCOLL
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
    /* recursive doubling all-gather, recursive halving reduce-scatter,
     * all-reduce = the two in sequence (Rabenseifner); any group size */
    FF_ALGO_REC,
    /* two-level (PCCL, dissertation ch. 6): an inter-node phase among the
     * ranks with the same index on their node, an intra-node ring, a local
     * reordering; reduce-scatter in the reverse order. HIER_RING runs the
     * inter-node phase as a ring, HIER_REC recursively. A group whose nodes
     * hold different numbers of its ranks runs the flat RING or REC. */
    FF_ALGO_HIER_RING,
    FF_ALGO_HIER_REC,
    /* all-reduce only: recursive doubling on the whole vector, lg p steps
     * (plus a fold for non-powers of two) of `count` elements each; fewer
     * steps than REC's 2 lg p, more bytes than the ring's (as many on 2
     * ranks). AUTO considers it by default: the planner predicts where it
     * runs and counts its bytes (ff_plan_traffic). */
    FF_ALGO_REC_WHOLE,
    /* one round: every rank sends its block (all-gather) or each rank's
     * block of its input (reduce-scatter) straight to that rank, up to
     * FF_A2A_WINDOW partners at a time as the all-to-all does; all-reduce
     * = the two in sequence on p chunks. The ring's bytes in one latency
     * instead of p-1 (the MPI library's non-blocking all-gather is such an
     * exchange). AUTO runs it only where a measured pick says so: the
     * model has no per-message cost to weigh one round of p-1 messages
     * against p-1 rounds of one (docs/collectives.md). */
    FF_ALGO_DIRECT,
    FF_NALGO
} ff_algo;
/* All-to-all exists only as FF_ALGO_MPI and FF_ALGO_RING (and AUTO), and
 * FF_ALGO_REC_WHOLE only for all-reduce; the others refuse it with
 * FF_EUNSUPPORTED. docs/collectives.md. */

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
/* The reduce-scatter collective matmul's collective (docs/linear.md): the
 * reduce-scatter above on the ring (whatever opt->algo says), whose send
 * blocks the caller writes while it runs, in the order the ring reads
 * them: block r-1, r-2, ..., r (mod p, r this rank's group rank), one per
 * step. Nothing is read or sent until ff_reduce_scatter_feed says a block
 * is written, and a block fed must not change until the request is done.
 * Messages, bytes and order of additions are ff_ireduce_scatter's on the
 * ring. FF_EINVAL on a group of one rank. */
int ff_ireduce_scatter_fed(ff_group *g, const float *send, float *recv, size_t count,
                           const ff_coll_opts *opt, ff_request **req);
/* Says that the first `blocks` send blocks in the ring's order are written
 * (never fewer than before), and advances the collectives. Waiting on the
 * request before all p are fed never ends. */
int ff_reduce_scatter_feed(ff_request *req, int blocks);
/* recv[0..count) = sum over ranks of send[0..count). In place when send == recv. */
int ff_iallreduce(ff_group *g, const float *send, float *recv, size_t count,
                  const ff_coll_opts *opt, ff_request **req);
/* One half of the ring all-reduce of buf[0..count), in place, with the
 * ring's chunks (chunk i: the i-th of p nearly equal pieces, the first
 * count mod p one longer). gather 0: the reduce phase, after which chunk
 * `rank` holds the sum over the ranks, added in exactly the order
 * ff_iallreduce's ring adds it (the other chunks hold partial sums);
 * counted as a reduce-scatter. gather 1: the gather phase, which gives
 * every rank every rank's chunk; counted as an all-gather. Together they
 * are the ring all-reduce, and ZeRO over D (docs/design.md) runs them with
 * the optimizer between. The ring on the fp32 wire only (FF_ALGO_AUTO or
 * FF_ALGO_RING; anything else is FF_EUNSUPPORTED). */
int ff_iallreduce_half(ff_group *g, float *buf, size_t count, int gather, const ff_coll_opts *opt,
                       ff_request **req);
/* The gather phase of ff_iallreduce_half (gather 1) on 2-byte values
 * (bf16 bits, moved as they are): the same chunks, steps and messages, 2
 * bytes an element on the wire; counted as an all-gather. ZeRO over D in
 * bf16-mixed gathers the weights' bf16 copy with it (docs/design.md). */
int ff_iallgather_half16(ff_group *g, uint16_t *buf, size_t count, ff_request **req);
/* recv[r*count ..) on rank s = send[s*count ..) on rank r. Not in place. */
int ff_ialltoall(ff_group *g, const float *send, float *recv, size_t count, const ff_coll_opts *opt,
                 ff_request **req);

/* Advances the collectives and sets *ready to the blocks of an all-gather
 * already in its recv buffer, counted in the order the ring delivers them:
 * this rank's block r, then r-1, r-2, ... (mod p). Only an all-gather run
 * by FF_ALGO_RING delivers blocks before it is done; any other request
 * reports 0 until done, then the group's size. The collective matmul
 * (docs/linear.md) computes with each block as it arrives. */
int ff_allgather_ready(ff_request *req, int *ready);

/* Point-to-point messages between two ranks of a group (the pipeline's
 * activations and gradients): `count` floats to or from group rank `peer`,
 * matched by `tag` (0 to 1999) in posting order, as MPI matches them. They
 * complete like collectives (ff_test, ff_wait) and are counted under
 * FF_COLL_P2P (one call per message, the bytes on the side that moved them)
 * and traced. A message to oneself is refused. */
int ff_isend(ff_group *g, const float *buf, size_t count, int peer, int tag, ff_request **req);
int ff_irecv(ff_group *g, float *buf, size_t count, int peer, int tag, ff_request **req);

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

/* coll may be FF_COLL_P2P. */
ff_counters ff_group_counters(const ff_group *g, ff_coll coll);
void ff_group_counters_reset(ff_group *g);

const char *ff_coll_name(ff_coll coll);
const char *ff_algo_name(ff_algo algo);
/* Parses "auto", "mpi", "ring", "rec", "hier-ring", "hier-rec",
 * "rec-whole", "direct"; returns -1 if unknown. */
int ff_algo_parse(const char *name);
/* 1 if `algo` implements `coll` (AUTO and MPI implement all four). */
int ff_algo_supports(ff_algo algo, ff_coll coll);

/* ---- algorithm selection (docs/collectives.md) ----
 *
 * FF_ALGO_AUTO picks, per (collective, group, count, wire), the algorithm with
 * the smallest predicted time under an alpha-beta model with one (alpha,
 * beta) pair per level: within a node and between nodes. A step of an
 * algorithm costs alpha + bytes/beta at the level of its slowest message,
 * with `s` concurrent inter-node streams out of one node sharing beta_inter;
 * a reduce-scatter step adds bytes/reduce_Bps for its additions.
 *
 * The context's model starts from ff_coll_model_default() and, in
 * ff_ctx_create, from the machine profile of ff_ctx_options.profile (or the
 * environment variable FF_PROFILE). The option algo (FF_ALGO) makes AUTO run
 * that algorithm wherever it implements the collective; ranks_per_node
 * (FF_RANKS_PER_NODE=k) pretends that nodes hold k consecutive ranks of the
 * context (for tests on one machine). All must be the same on every rank
 * (include/fourfold/ctx.h). */
/* One measured pick of ff_coll_model (below). */
enum { FF_COLL_MAX_PICKS = 96 };
typedef struct {
    ff_coll coll;
    int nodes, per_node;
    double min_B, max_B;
    ff_algo algo;
} ff_coll_pick_rule;

typedef struct {
    double alpha_intra_s, beta_intra_Bps; /* within a node */
    double alpha_inter_s, beta_inter_Bps; /* between nodes, one stream */
    /* A second regime per level: messages of at most small_max_*_B bytes
     * cost alpha_*_small_s + bytes/beta_*_small_Bps instead (an eager
     * protocol, a shaper's burst). small_max 0 = one regime, the default. */
    double small_max_intra_B, alpha_intra_small_s, beta_intra_small_Bps;
    double small_max_inter_B, alpha_inter_small_s, beta_inter_small_Bps;
    /* bytes per second of a reduction's local additions (received partial
     * sums added into the accumulator); 0 = free. Not a level: the CPU's. */
    double reduce_Bps;
    /* 1 (default): AUTO considers only algorithms whose per-rank byte
     * counts the planner predicts (ff_plan_traffic; docs/design.md §3): those
     * that move the ring's bytes for that call (recursive ones only for
     * power-of-two groups and node counts, all-reduce only when p divides
     * count), and REC_WHOLE for all-reduce. 0: every algorithm. */
    int strict_volume;
    /* Measured picks (`fourfold bench tune`, docs/collectives.md): where
     * the model's choice measured slower than another algorithm on this
     * machine, the algorithm that measured fastest, for a collective on a
     * group laid out as `nodes` nodes of `per_node` ranks and sizes in
     * (min_B, max_B] (the largest buffer of one rank in bytes on the
     * wire: count x the wire's element size, x p for all-gather and
     * reduce-scatter). AUTO runs a pick that covers the
     * call (and is allowed by strict_volume) instead of the model's
     * choice; elsewhere the model decides. */
    int n_picks;
    ff_coll_pick_rule picks[FF_COLL_MAX_PICKS];
} ff_coll_model;

/* Values for this kind of machine (docs/collectives.md). */
void ff_coll_model_default(ff_coll_model *m);
/* Reads the model from a machine profile written by `fourfold bench
 * profile` (keys alpha_intra_s, beta_intra_Bps, alpha_inter_s,
 * beta_inter_Bps, reduce_Bps, and for a second regime small_max_intra_B,
 * alpha_intra_small_s, beta_intra_small_Bps and their _inter_ twins); keys
 * it does not find keep their value in *m, except that a level without
 * small_max gets one regime. A reduce_Bps of 0 (the fit could not resolve
 * the additions) also keeps *m's. The measured picks are the profile's
 * "picks" list (`fourfold bench tune`), none if it has none. The file is
 * read by the planner's parser (one schema, docs/planner.md): it needs
 * "format", not the planner's keys, and every key it has must be valid.
 * Returns FF_OK, FF_EIO, FF_ENOMEM or FF_ECORRUPT (any bad key or pick)
 * with a message in err naming the file, the line and the key. */
int ff_coll_model_read(const char *path, ff_coll_model *m, char *err, size_t err_len);
/* Sets the context's model; must be called with the same values on every
 * rank (the choice of algorithm must agree within a group). */
int ff_ctx_set_coll_model(ff_ctx *ctx, const ff_coll_model *m);
void ff_ctx_coll_model(const ff_ctx *ctx, ff_coll_model *m);
/* What FF_ALGO_AUTO would run for this call. */
ff_algo ff_coll_choose(ff_group *g, ff_coll coll, size_t count, ff_wire wire);
/* 1 if AUTO may run `algo` for this call: the ring always; the others where
 * they differ from a flat algorithm on the group's layout and the model's
 * strict_volume allows them (the candidates of ff_coll_choose, and direct,
 * which only a measured pick makes it run; what `bench tune` times). */
int ff_coll_allowed(ff_group *g, ff_coll coll, ff_algo algo, size_t count);
/* The model's time in seconds for `algo` (AUTO: for its pick; MPI, or an
 * algorithm that does not implement coll: -1). */
double ff_coll_predict(ff_group *g, ff_coll coll, ff_algo algo, size_t count, ff_wire wire);
/* The group's node layout: nodes it spans and its ranks on each node (0 if
 * the nodes hold different numbers of its ranks). */
void ff_group_topology(ff_group *g, int *nodes, int *ranks_per_node);
/* The node of context rank `rank` (nodes numbered in the order of their
 * lowest rank; FF_RANKS_PER_NODE applied) and the number of nodes. */
int ff_ctx_node_of(const ff_ctx *ctx, int rank);
int ff_ctx_nodes(const ff_ctx *ctx);

/* ---- fitting a level's parameters (`fourfold bench profile`) ----
 * A sample: a collective that ran `steps` messages of `msg_bytes` one after
 * another and added `add_bytes` of received partial sums in t_s seconds (a
 * ring all-gather of p ranks: p-1 steps of one block, no additions). */
typedef struct {
    double steps, msg_bytes, add_bytes, t_s;
} ff_coll_sample;
typedef struct {
    int ok;                   /* 0: fewer than 3 usable samples, or no fit with parameters >= 0 */
    int n;                    /* samples used (t_s > 0, steps > 0) */
    double alpha_s, beta_Bps; /* messages above small_max_B (all, if it is 0) */
    double small_max_B, alpha_small_s, beta_small_Bps; /* 0 = one regime */
    double reduce_Bps;                                 /* 0 = additions free */
    double rms_rel, max_rel; /* relative residuals: RMS and largest magnitude */
} ff_coll_fit_result;
/* Least squares on the relative error, all parameters >= 0 (AutoDDL §3);
 * with two_regimes, also searches a threshold between the measured sizes
 * and keeps the split only if the Bayesian information criterion prefers
 * it. FF_OK or
 * FF_ENOMEM. docs/collectives.md. */
int ff_coll_fit(const ff_coll_sample *s, int n, int two_regimes, ff_coll_fit_result *out);
/* The fitted time of a sample. */
double ff_coll_fit_predict(const ff_coll_fit_result *f, const ff_coll_sample *s);

/* bfloat16 conversion (round to nearest even; NaN stays NaN). */
uint16_t ff_bf16_from_float(float f);
float ff_bf16_to_float(uint16_t h);

#ifdef __cplusplus
}
#endif
#endif
