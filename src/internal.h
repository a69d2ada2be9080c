/* Definitions shared by the library's translation units; not installed. */
#ifndef FF_INTERNAL_H
#define FF_INTERNAL_H

#include <pthread.h>
#include <stdint.h>

#include "fourfold/fourfold.h"

#define FF_ERRMSG_LEN     512
#define FF_POOL_SLOTS     16
#define FF_POOL_MAX_BYTES ((size_t)1 << 30) /* scratch kept for reuse, at most */

/* ---- trace (trace.c) ---- */

enum { FF_TRACE_NAME_LEN = 40 };

typedef struct {
    char name[FF_TRACE_NAME_LEN];
    char cat; /* 'c' compute, 'w' wait, 'm' collective in flight */
    uint8_t track;
    double t0, t1; /* seconds since the trace's zero */
} ff_trace_event;

enum { FF_TRACE_DEPTH = 16, FF_TRACE_TRACKS = 32 };

typedef struct {
    int enabled;
    double zero;
    ff_trace_event *events;
    size_t count, cap, dropped;
    /* open compute regions */
    char open_name[FF_TRACE_DEPTH][FF_TRACE_NAME_LEN];
    double open_t0[FF_TRACE_DEPTH];
    int depth;
    /* which collective tracks (1..) are occupied */
    uint8_t track_busy[FF_TRACE_TRACKS];
    char label[96]; /* the process's name in the viewer */
} ff_trace;

/* Called by the engine; no-ops when tracing is off. */
int ff_trace_track_acquire(ff_ctx *ctx);
void ff_trace_track_release(ff_ctx *ctx, int track);
void ff_trace_record(ff_ctx *ctx, const char *name, char cat, int track, double t0, double t1);
void ff_trace_free(ff_trace *trace);

/* ---- context (ctx.c) ---- */

struct ff_team;
struct ff_ctx {
    MPI_Comm comm;
    int rank, size;
    int err_code;
    char err[FF_ERRMSG_LEN];
    ff_ctx_options opt;

    /* engine (comm/engine.c): requests in flight, a doubly linked list */
    pthread_mutex_t lock;
    struct ff_request *active;
    int n_active;
    double last_poll;
    pthread_t thread;
    int thread_running;
    volatile int thread_stop;

    MPI_Op bf16_sum;      /* for FF_ALGO_MPI reductions on the bf16 wire */
    struct ff_team *team; /* the element-wise work's threads (util/team.h) */
    struct ff_cuda *cuda; /* the GPU this context computes on, or NULL (device.h) */

    /* scratch buffers of finished requests, reused by later ones: a fresh
     * large malloc is an mmap whose pages fault and are zeroed on every
     * collective (caller holds lock) */
    struct {
        void *ptr;
        size_t bytes;
    } pool[FF_POOL_SLOTS];
    int pool_n;
    size_t pool_bytes;
    /* scratch of requests abandoned after an error: a cancelled receive may
     * still write into it, so it is never reused, only freed at destroy */
    void **parked;
    int n_parked;

    ff_trace trace;

    /* node layout, cost model and forced algorithm of the collective
     * algorithms (comm/select.c) */
    struct ff_coll_layer *coll;
};

/* Records an error on the context and returns `code` (ff_ctx_set_error). */
#define ff_set_error ff_ctx_set_error
/* ff_ctx_agree on a communicator of some of the context's ranks (a
 * stage's): collective over comm only; messages name context ranks. */
int ff_agree_on(ff_ctx *ctx, MPI_Comm comm, int rc);
/* Turns an MPI error code into FF_EMPI with the MPI library's message. */
int ff_mpi_error(ff_ctx *ctx, int mpi_rc, const char *what);

/* Chunk i of n elements split into p nearly equal pieces (the first n mod p
 * one longer), as the ring all-reduce cuts its vector (and
 * ZeRO over D its slices, src/nn/gpt_zero.c). */
static inline size_t ff_chunk_off(size_t n, int p, int i)
{
    size_t q = n / (size_t)p, rem = n % (size_t)p;
    return (size_t)i * q + ((size_t)i < rem ? (size_t)i : rem);
}

/* ---- groups (grid.c) ---- */

typedef struct {
    uint64_t calls, bytes_sent, bytes_recv;
    double wait_s, flight_s;
} ff_counter_acc;

struct ff_group {
    ff_ctx *ctx;
    MPI_Comm comm;
    int size, rank;
    char name[16];
    unsigned seq; /* collectives posted, to give each its own tag */
    /* node layout, built with the group (ff_group_topo_init), freed with
     * it (ff_group_fini) */
    struct ff_topo *topo;
    ff_counter_acc counters[FF_NCOLL + 1]; /* the collectives, then FF_COLL_P2P */
};

/* Builds a group around an existing communicator (takes ownership of comm). */
int ff_group_init(ff_group *g, ff_ctx *ctx, MPI_Comm comm, const char *name);
void ff_group_fini(ff_group *g);
/* Builds the group's node layout, which every choice of algorithm reads (no
 * communication). The callers agree on the result across the group before
 * using it: a member that failed alone and fell back to another algorithm
 * than its peers' would hang the group. */
int ff_group_topo_init(ff_group *g);

struct ff_grid {
    ff_ctx *ctx;
    ff_dims shape, coords;
    int stages, stage; /* pipeline stages (1: none) and this rank's */
    ff_group groups[FF_NGROUPS];
};

/* ---- engine (comm/engine.c, comm/ring.c, comm/mpilib.c) ---- */

/* MPI requests one step of a request may have in flight: a send and a
 * receive per partner; the all-to-all and the direct algorithm post up to
 * FF_A2A_WINDOW partners at once (comm/ring.c, comm/phase.c), every other
 * algorithm at most two partners (a fold). */
enum { FF_A2A_WINDOW = 8, FF_REQ_MAX_MPI = 2 * FF_A2A_WINDOW };

typedef struct ff_request ff_request;
typedef int (*ff_advance_fn)(ff_request *req);

struct ff_request {
    ff_group *group;
    ff_coll coll;
    ff_algo algo;
    ff_wire wire;
    const float *send;
    float *recv;
    size_t count;
    int tag;

    /* the state machine: advance() runs when every MPI request of the current
     * step has completed; it does the local work of the step and posts the
     * next one, or sets done. */
    ff_advance_fn advance;
    int step;
    /* 0, or one half of the ring all-reduce (ff_iallreduce_half): 1 its
     * reduce phase, counted as a reduce-scatter, 2 its gather phase, counted
     * as an all-gather, 3 that phase on 2-byte values (ff_iallgather_half16) */
    int half;
    /* a fed reduce-scatter (ff_ireduce_scatter_fed): feeding 1, fed the
     * send blocks the caller has written, in the ring's reading order;
     * advance() runs only once fed >= need (set by the algorithm) */
    int feeding, fed, need;
    int done;
    int error;
    MPI_Request mpi[FF_REQ_MAX_MPI];
    int n_mpi;
    void *scratch; /* from the context's pool; returned with the request */
    size_t scratch_bytes;
    /* algorithm-private (malloc), freed with the request */
    void *state;
    MPI_Datatype dtype; /* MPI_DATATYPE_NULL unless owned by the request */

    double t_post, t_done;
    int track;
    struct ff_request *prev, *next;
};

/* Adds to the counters of the request's group/collective. */
void ff_count_bytes(ff_request *req, size_t sent, size_t recv);
/* Posts an Isend/Irecv as part of the current step, counting its bytes.
 * Every algorithm posts a step's sends before its receives: over Open MPI's
 * TCP transport a step that exchanges MiB-sized messages took 35 ms with
 * the send first and 46-50 ms with the receive first (Rabenseifner
 * all-reduce of 4 MiB, emulated 2x2 and 4x1 nodes at 1 Gbit/s; no
 * difference up to 1 MiB or over shared memory; docs/collectives.md). */
int ff_post_send(ff_request *req, const void *buf, size_t bytes, int peer);
int ff_post_recv(ff_request *req, void *buf, size_t bytes, int peer);
/* Gives the request `bytes` of scratch (caller holds ctx->lock). */
int ff_request_scratch(ff_request *req, size_t bytes);

/* Algorithm starters: set up req (advance, scratch) and post the first step. */
int ff_ring_start(ff_request *req);
int ff_mpilib_start(ff_request *req);
int ff_rec_start(ff_request *req);  /* comm/recursive.c */
int ff_hier_start(ff_request *req); /* comm/hier.c */
/* The algorithm FF_ALGO_AUTO runs (comm/select.c). */
ff_algo ff_coll_select(ff_group *g, ff_coll coll, size_t count, ff_wire wire);
/* Node layout and cost model, set up by ff_ctx_create (collective) and freed
 * by ff_ctx_destroy (comm/select.c). */
int ff_coll_layer_init(ff_ctx *ctx);
void ff_coll_layer_free(ff_ctx *ctx);

/* Elements a ring algorithm sends and receives on rank r of p (what the
 * counters record for FF_ALGO_MPI). */
void ff_ring_volume(ff_coll coll, int p, int r, size_t count, size_t *sent, size_t *recv);
/* The same for rec-whole's all-reduce of `count` (comm/recursive.c): lg p
 * whole vectors each way, the fold's pairs one more (the extra of a pair
 * sends and receives the vector once). */
void ff_rec_whole_volume(int p, int r, size_t count, size_t *sent, size_t *recv);
/* The same for one half of the ring all-reduce of `count`
 * (ff_iallreduce_half: gather 0 the reduce phase, 1 the gather phase). */
void ff_ring_half_volume(int gather, int p, int r, size_t count, size_t *sent, size_t *recv);

/* 1 if the model's alphas, small_max and reduce_Bps are >= 0 and its betas
 * > 0, all finite (what ff_ctx_set_coll_model accepts). */
int ff_coll_model_ok(const ff_coll_model *m);

/* A group's node layout (comm/algo.h), built from the node of each member:
 * what the planner asks the selector with (src/plan/cost_full.c). */
typedef struct ff_topo ff_topo;
/* Member r of p lives on the node with id node[r] (>= 0, any numbering);
 * `me` is the caller's index. Keeps the counts the cost model reads, not the
 * member lists: for ff_coll_pick only, not for running an algorithm. NULL
 * if out of memory or out of range. */
ff_topo *ff_topo_new(const int *node, int p, int me);
void ff_topo_free(ff_topo *t);
/* What FF_ALGO_AUTO runs for this call under model m, without FF_ALGO (the
 * same on every member: the layout, not `me`, decides). */
ff_algo ff_coll_pick(const ff_topo *t, const ff_coll_model *m, ff_coll coll, size_t count,
                     ff_wire wire);
void ff_bf16_sum_op(void *in, void *inout, int *len, MPI_Datatype *type);

/* bf16 helpers (comm/bf16.c) */
void ff_bf16_pack(uint16_t *dst, const float *src, size_t n);
void ff_bf16_unpack(float *dst, const uint16_t *src, size_t n);
void ff_bf16_round(float *x, size_t n); /* x = float(bf16(x)) in place */
/* dst = float(bf16(src)): an operand of a bf16-mixed product, widened back */
void ff_bf16_round_copy(float *dst, const float *src, size_t n);
/* Bytes per entry of bf16-mixed's copy of the weights (docs/design.md §13),
 * as the planner's SAMO memory (src/plan/cost_full.c) and the tests count
 * it; the model allocates the copy in whole floats (ff_gpt_bf16_floats:
 * 2 bytes more where the Z-sharded count is odd). */
#define FF_BF16_COPY_BYTES 2

/* The scratch pool (caller holds ctx->lock). */
void *ff_pool_take(ff_ctx *ctx, size_t bytes, size_t *got);
void ff_pool_give(ff_ctx *ctx, void *ptr, size_t bytes);
void ff_pool_free(ff_ctx *ctx);

/* Cancels and frees every request still in flight (ff_ctx_destroy). */
void ff_engine_abandon_all(ff_ctx *ctx);

/* The progress thread (FF_PROGRESS_THREAD). */
void *ff_engine_thread_main(void *arg);

/* ---- clock ---- */
/* The median of run(arg)'s times after one untimed call: at least 3 runs,
 * and runs until min_seconds in all (src/nn/gemm.c; the rates of products). */
double ff_median_seconds(void (*run)(void *), void *arg, double min_seconds);
/* The operands the product rates are measured on (fixed values). */
void ff_rate_operands(float *A, float *B, size_t na, size_t nb);
double ff_now(void);
/* The watchdog (ff_ctx_options.timeout_s): a rank that has waited since t0
 * longer than the timeout for `what` on `group` prints it and aborts the
 * job; otherwise nothing. */
void ff_watchdog(const ff_ctx *ctx, double t0, const char *what, const char *group);
/* Completes a non-blocking MPI call: MPI_Wait, or under the watchdog a
 * loop of MPI_Test that aborts the job past the timeout. An MPI code. */
int ff_mpi_complete(const ff_ctx *ctx, MPI_Request *req, const char *what);

#endif
