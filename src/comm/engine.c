/* The collective engine: posting, progress, waiting, counters.
 *
 * Every collective is a state machine (struct ff_request). A step posts some
 * MPI point-to-point requests; when they have all completed, the algorithm's
 * advance() does the step's local work (a reduction, a format conversion) and
 * posts the next step. Nothing moves unless someone calls ff_progress(): on
 * Open MPI without asynchronous progress, data moves only inside MPI calls
 * (docs/design.md §11), and the next step of a multi-step
 * algorithm is posted only by us. Hence ff_poll() for compute loops, and the
 * optional progress thread.
 *
 * Progress always advances every request of the context, never only the one
 * being waited on: two ranks waiting on different collectives that each need
 * the other's participation would otherwise deadlock. */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "internal.h"

static const char *const coll_names[FF_NCOLL + 1] = {"allgather", "reduce_scatter", "allreduce",
                                                     "alltoall", "p2p"};
static const char *const algo_names[FF_NALGO] = {"auto",      "mpi",      "ring",      "rec",
                                                 "hier-ring", "hier-rec", "rec-whole", "direct"};

const char *ff_coll_name(ff_coll c) { return (c >= 0 && c <= FF_COLL_P2P) ? coll_names[c] : "?"; }
const char *ff_algo_name(ff_algo a) { return (a >= 0 && a < FF_NALGO) ? algo_names[a] : "?"; }

int ff_algo_parse(const char *name)
{
    for (int a = 0; a < FF_NALGO; a++)
        if (strcmp(name, algo_names[a]) == 0)
            return a;
    return -1;
}

/* ---- counters ---- */

ff_counters ff_group_counters(const ff_group *g, ff_coll coll)
{
    ff_counters c = {0, 0, 0, 0.0, 0.0};
    if (!g || coll < 0 || coll > FF_COLL_P2P)
        return c;
    pthread_mutex_lock(&g->ctx->lock); /* the progress thread updates them */
    const ff_counter_acc *a = &g->counters[coll];
    c.calls = a->calls;
    c.bytes_sent = a->bytes_sent;
    c.bytes_recv = a->bytes_recv;
    c.wait_s = a->wait_s;
    c.flight_s = a->flight_s;
    pthread_mutex_unlock(&g->ctx->lock);
    return c;
}

void ff_group_counters_reset(ff_group *g)
{
    pthread_mutex_lock(&g->ctx->lock);
    memset(g->counters, 0, sizeof g->counters);
    pthread_mutex_unlock(&g->ctx->lock);
}

void ff_count_bytes(ff_request *req, size_t sent, size_t recv)
{
    ff_counter_acc *a = &req->group->counters[req->coll];
    a->bytes_sent += sent;
    a->bytes_recv += recv;
}

/* ---- posting point-to-point steps ---- */

static size_t wire_elem_size(ff_wire w) { return w == FF_WIRE_BF16 ? 2 : 4; }

static int post_p2p(ff_request *req, void *buf, size_t n, int peer, int is_send)
{
    if (n == 0)
        return FF_OK;
    ff_ctx *ctx = req->group->ctx;
    if (req->n_mpi >= FF_REQ_MAX_MPI)
        return ff_set_error(ctx, FF_EINVAL, "internal: too many MPI requests in one step");
    if (n > (size_t)0x7fffffff)
        return ff_set_error(ctx, FF_EINVAL,
                            "%s on group %s: one message of %zu elements exceeds MPI's int count",
                            ff_coll_name(req->coll), req->group->name, n);
    MPI_Datatype t = req->wire == FF_WIRE_BF16 ? MPI_UINT16_T : MPI_FLOAT;
    MPI_Request *r = &req->mpi[req->n_mpi];
    int rc = is_send ? MPI_Isend(buf, (int)n, t, peer, req->tag, req->group->comm, r)
                     : MPI_Irecv(buf, (int)n, t, peer, req->tag, req->group->comm, r);
    if (rc != MPI_SUCCESS)
        return ff_mpi_error(ctx, rc, is_send ? "MPI_Isend" : "MPI_Irecv");
    req->n_mpi++;
    size_t bytes = n * wire_elem_size(req->wire);
    ff_count_bytes(req, is_send ? bytes : 0, is_send ? 0 : bytes);
    return FF_OK;
}

int ff_post_send(ff_request *req, const void *buf, size_t n, int peer)
{
    return post_p2p(req, (void *)buf, n, peer, 1);
}

int ff_post_recv(ff_request *req, void *buf, size_t n, int peer)
{
    return post_p2p(req, buf, n, peer, 0);
}

/* ---- the scratch pool ---- */

void *ff_pool_take(ff_ctx *ctx, size_t bytes, size_t *got)
{
    int best = -1;
    for (int i = 0; i < ctx->pool_n; i++) /* the smallest buffer that fits */
        if (ctx->pool[i].bytes >= bytes && (best < 0 || ctx->pool[i].bytes < ctx->pool[best].bytes))
            best = i;
    /* a small request does not pin a much larger buffer */
    if (best >= 0 && (ctx->pool[best].bytes <= 4 * bytes || ctx->pool[best].bytes <= 65536)) {
        void *p = ctx->pool[best].ptr;
        *got = ctx->pool[best].bytes;
        ctx->pool_bytes -= *got;
        ctx->pool[best] = ctx->pool[--ctx->pool_n];
        return p;
    }
    *got = bytes;
    return malloc(bytes ? bytes : 1);
}

void ff_pool_give(ff_ctx *ctx, void *ptr, size_t bytes)
{
    if (!ptr)
        return;
    if (bytes > FF_POOL_MAX_BYTES) {
        free(ptr);
        return;
    }
    /* make room: drop the smallest buffers (the large ones cost the most
     * page faults to recreate) until both limits hold */
    while (ctx->pool_n > 0 &&
           (ctx->pool_n == FF_POOL_SLOTS || ctx->pool_bytes + bytes > FF_POOL_MAX_BYTES)) {
        int smallest = 0;
        for (int i = 1; i < ctx->pool_n; i++)
            if (ctx->pool[i].bytes < ctx->pool[smallest].bytes)
                smallest = i;
        if (ctx->pool[smallest].bytes >= bytes) { /* the newcomer is the smallest */
            free(ptr);
            return;
        }
        ctx->pool_bytes -= ctx->pool[smallest].bytes;
        free(ctx->pool[smallest].ptr);
        ctx->pool[smallest] = ctx->pool[--ctx->pool_n];
    }
    ctx->pool[ctx->pool_n].ptr = ptr;
    ctx->pool[ctx->pool_n].bytes = bytes;
    ctx->pool_n++;
    ctx->pool_bytes += bytes;
}

void ff_pool_free(ff_ctx *ctx)
{
    for (int i = 0; i < ctx->pool_n; i++)
        free(ctx->pool[i].ptr);
    ctx->pool_n = 0;
    ctx->pool_bytes = 0;
    for (int i = 0; i < ctx->n_parked; i++)
        free(ctx->parked[i]);
    free(ctx->parked);
    ctx->parked = NULL;
    ctx->n_parked = 0;
}

int ff_request_scratch(ff_request *req, size_t bytes)
{
    ff_ctx *ctx = req->group->ctx;
    ff_pool_give(ctx, req->scratch, req->scratch_bytes);
    req->scratch = ff_pool_take(ctx, bytes, &req->scratch_bytes);
    if (!req->scratch)
        return ff_set_error(req->group->ctx, FF_ENOMEM,
                            "out of memory: %zu bytes of scratch for %s on group %s", bytes,
                            ff_coll_name(req->coll), req->group->name);
    return FF_OK;
}

/* ---- the list of requests in flight (caller holds ctx->lock) ---- */

static void list_add(ff_ctx *ctx, ff_request *req)
{
    req->prev = NULL;
    req->next = ctx->active;
    if (ctx->active)
        ctx->active->prev = req;
    ctx->active = req;
    ctx->n_active++;
}

static void list_remove(ff_ctx *ctx, ff_request *req)
{
    if (req->prev)
        req->prev->next = req->next;
    else
        ctx->active = req->next;
    if (req->next)
        req->next->prev = req->prev;
    ctx->n_active--;
}

/* Caller holds ctx->lock. A request that did not complete (an error, or a
 * context destroyed with it in flight) still has MPI operations pending on its
 * buffers: they are cancelled and released, and its scratch is parked until
 * the context is destroyed instead of being reused. The group it ran on is
 * unusable after that (its peers are mid-collective). */
static void request_free(ff_request *req)
{
    if (!req)
        return;
    ff_ctx *ctx = req->group->ctx;
    int pending = 0;
    for (int i = 0; i < req->n_mpi; i++)
        if (req->mpi[i] != MPI_REQUEST_NULL) {
            MPI_Cancel(&req->mpi[i]);
            MPI_Request_free(&req->mpi[i]);
            pending = 1;
        }
    if (!pending) {
        ff_pool_give(ctx, req->scratch, req->scratch_bytes);
    } else if (req->scratch) {
        void **p = realloc(ctx->parked, (size_t)(ctx->n_parked + 1) * sizeof *p);
        if (p) {
            ctx->parked = p;
            ctx->parked[ctx->n_parked++] = req->scratch;
        } /* else: leak it; freeing memory MPI may still write is worse */
    }
    free(req->state);
    free(req);
}

void ff_engine_abandon_all(ff_ctx *ctx)
{
    pthread_mutex_lock(&ctx->lock);
    while (ctx->active) {
        ff_request *req = ctx->active;
        list_remove(ctx, req);
        request_free(req);
    }
    pthread_mutex_unlock(&ctx->lock);
}

static void mark_done(ff_request *req)
{
    ff_ctx *ctx = req->group->ctx;
    req->done = 1;
    req->t_done = ff_now();
    req->group->counters[req->coll].flight_s += req->t_done - req->t_post;
    if (req->track > 0) {
        char name[FF_TRACE_NAME_LEN];
        snprintf(name, sizeof name, "%s %s n=%zu %s%s", ff_coll_name(req->coll), req->group->name,
                 req->count, ff_algo_name(req->algo), req->wire == FF_WIRE_BF16 ? " bf16" : "");
        ff_trace_record(ctx, name, 'm', req->track, req->t_post, req->t_done);
        ff_trace_track_release(ctx, req->track);
        req->track = 0;
    }
}

/* Runs one request's state machine as far as it goes without blocking. */
static void advance_request(ff_request *req)
{
    while (!req->done && !req->error) {
        if (req->n_mpi > 0) {
            int flag = 0;
            int rc = MPI_Testall(req->n_mpi, req->mpi, &flag, MPI_STATUSES_IGNORE);
            if (rc != MPI_SUCCESS) {
                req->error = ff_mpi_error(req->group->ctx, rc, "MPI_Testall");
                return;
            }
            if (!flag)
                return;
            req->n_mpi = 0;
        }
        if (req->feeding && req->fed < req->need)
            return; /* the next step reads a block the caller has not written yet */
        int rc = req->advance(req);
        if (rc != FF_OK) {
            req->error = rc;
            return;
        }
        if (req->done)
            mark_done(req);
    }
}

static void progress_locked(ff_ctx *ctx)
{
    for (ff_request *r = ctx->active; r; r = r->next)
        advance_request(r);
}

int ff_progress(ff_ctx *ctx)
{
    pthread_mutex_lock(&ctx->lock);
    progress_locked(ctx);
    pthread_mutex_unlock(&ctx->lock);
    return FF_OK;
}

void ff_poll(ff_ctx *ctx)
{
    /* Only the caller's thread touches the context in POLL mode, so the
     * unlocked reads are safe there. */
    if (ctx->opt.progress != FF_PROGRESS_POLL || ctx->n_active == 0)
        return;
    double t = ff_now();
    if (t - ctx->last_poll < ctx->opt.poll_interval_s)
        return;
    ctx->last_poll = t;
    ff_progress(ctx);
}

int ff_in_flight(const ff_ctx *ctx) { return ctx->n_active; }

void *ff_engine_thread_main(void *arg)
{
    ff_ctx *ctx = arg;
    struct timespec ts;
    double s = ctx->opt.thread_interval_s;
    ts.tv_sec = (time_t)s;
    ts.tv_nsec = (long)((s - (double)ts.tv_sec) * 1e9);
    while (!ctx->thread_stop) {
        pthread_mutex_lock(&ctx->lock);
        if (ctx->n_active)
            progress_locked(ctx);
        pthread_mutex_unlock(&ctx->lock);
        nanosleep(&ts, NULL);
    }
    return NULL;
}

/* ---- public entry points ---- */

static int ranges_overlap(const void *a, size_t na, const void *b, size_t nb)
{
    const char *pa = a, *pb = b;
    return pa < pb + nb && pb < pa + na;
}

/* Checks arguments, handles the trivial cases, and posts the collective. */
static int post(ff_group *g, ff_coll coll, const float *send, float *recv, size_t count,
                const ff_coll_opts *opt, int half, int fed, ff_request **out)
{
    *out = NULL;
    if (!g)
        return FF_EINVAL;
    ff_ctx *ctx = g->ctx;
    ff_wire wire = opt ? opt->wire : FF_WIRE_FP32;
    ff_algo algo = opt ? opt->algo : FF_ALGO_AUTO;
    if (wire != FF_WIRE_FP32 && wire != FF_WIRE_BF16)
        return ff_set_error(ctx, FF_EINVAL, "unknown wire format %d", (int)wire);
    if (algo < 0 || algo >= FF_NALGO)
        return ff_set_error(ctx, FF_EINVAL, "unknown collective algorithm %d", (int)algo);
    if (!ff_algo_supports(algo, coll))
        return ff_set_error(ctx, FF_EUNSUPPORTED,
                            "%s on group %s: algorithm %s does not implement it",
                            ff_coll_name(coll), g->name, ff_algo_name(algo));
    if (count == 0)
        return FF_OK;
    if (!send || !recv)
        return ff_set_error(ctx, FF_EINVAL, "%s on group %s: NULL buffer", ff_coll_name(coll),
                            g->name);
    size_t p = (size_t)g->size, r = (size_t)g->rank;
    if (count > SIZE_MAX / 4 / p)
        return ff_set_error(ctx, FF_EINVAL, "%s on group %s: count %zu overflows",
                            ff_coll_name(coll), g->name, count);
    size_t sb = count * 4, rb = count * 4; /* buffer extents in bytes */
    if (coll == FF_COLL_ALLGATHER)
        rb *= p;
    if (coll == FF_COLL_REDUCE_SCATTER || coll == FF_COLL_ALLTOALL)
        sb *= p;
    if (coll == FF_COLL_ALLTOALL)
        rb *= p;
    if (half == 3) /* the gather phase on 2-byte values: sent as they are */
        wire = FF_WIRE_BF16;
    if (half) { /* one buffer of count elements, cut as the ring all-reduce cuts it */
        if (algo != FF_ALGO_AUTO && algo != FF_ALGO_RING)
            return ff_set_error(ctx, FF_EUNSUPPORTED,
                                "half an all-reduce on group %s: only the ring (not %s)", g->name,
                                ff_algo_name(algo));
        if (wire != FF_WIRE_FP32 && half != 3)
            return ff_set_error(ctx, FF_EUNSUPPORTED,
                                "half an all-reduce on group %s: the fp32 wire only", g->name);
        algo = FF_ALGO_RING;
        sb = rb = count * (half == 3 ? 2 : 4);
    }
    if (fed) { /* the ring alone reads its send blocks one at a time, in a known order */
        if (p == 1)
            return ff_set_error(ctx, FF_EINVAL, "a fed reduce-scatter on group %s of one rank",
                                g->name);
        algo = FF_ALGO_RING;
    }
    int in_place = (coll == FF_COLL_ALLGATHER && send == recv + r * count) ||
                   (coll == FF_COLL_ALLREDUCE && send == recv) || half;
    if (!in_place && ranges_overlap(send, sb, recv, rb))
        return ff_set_error(ctx, FF_EINVAL,
                            "%s on group %s: send and receive buffers overlap (in place is %s)",
                            ff_coll_name(coll), g->name,
                            coll == FF_COLL_ALLGATHER   ? "send == recv + rank*count"
                            : coll == FF_COLL_ALLREDUCE ? "send == recv"
                                                        : "not supported");

    if (p == 1) { /* a group of one: no communication, no counter */
        if (!in_place)
            memcpy(recv, send, rb);
        return FF_OK;
    }

    /* AUTO: the cost model's choice (comm/select.c; docs/collectives.md).
     * It depends only on what every rank of the group knows alike. */
    if (algo == FF_ALGO_AUTO)
        algo = ff_coll_select(g, coll, count, wire);

    /* The largest single message, checked before anything is posted so that
     * every rank refuses it alike (all-reduce chunks differ in size by one;
     * the recursive and hierarchical algorithms send up to a whole buffer). */
    size_t largest = coll == FF_COLL_ALLREDUCE || half ? count / p + (count % p != 0) : count;
    if (algo != FF_ALGO_RING && algo != FF_ALGO_MPI && algo != FF_ALGO_DIRECT)
        largest = coll == FF_COLL_ALLREDUCE ? count : count * p;
    if (largest > (size_t)INT_MAX)
        return ff_set_error(ctx, FF_EINVAL,
                            "%s on group %s: a message of %zu elements exceeds MPI's int count",
                            ff_coll_name(coll), g->name, largest);

    ff_request *req = calloc(1, sizeof *req);
    if (!req)
        return ff_set_error(ctx, FF_ENOMEM, "out of memory posting %s", ff_coll_name(coll));
    req->group = g;
    req->coll = coll;
    req->algo = algo;
    req->wire = wire;
    req->send = send;
    req->recv = recv;
    req->count = count;
    req->half = half;
    req->feeding = fed;
    req->tag = (int)(g->seq++ % 30000u) + 1; /* MPI guarantees tags up to 32767 */
    for (int i = 0; i < FF_REQ_MAX_MPI; i++)
        req->mpi[i] = MPI_REQUEST_NULL;

    pthread_mutex_lock(&ctx->lock);
    req->t_post = ff_now();
    req->track = ff_trace_track_acquire(ctx);
    int rc;
    switch (algo) {
    case FF_ALGO_MPI: rc = ff_mpilib_start(req); break;
    case FF_ALGO_REC:
    case FF_ALGO_REC_WHOLE:
    case FF_ALGO_DIRECT: rc = ff_rec_start(req); break;
    case FF_ALGO_HIER_RING:
    case FF_ALGO_HIER_REC: rc = ff_hier_start(req); break;
    default: rc = ff_ring_start(req); break;
    }
    if (rc == FF_OK) {
        list_add(ctx, req);
        advance_request(req); /* a step with nothing to wait for runs now */
        rc = req->error;
        if (rc != FF_OK)
            list_remove(ctx, req);
    }
    if (rc != FF_OK) {
        if (req->track > 0)
            ff_trace_track_release(ctx, req->track);
        request_free(req);
    } else {
        g->counters[coll].calls++;
        *out = req;
    }
    pthread_mutex_unlock(&ctx->lock);
    return rc;
}

int ff_iallgather(ff_group *g, const float *send, float *recv, size_t count,
                  const ff_coll_opts *opt, ff_request **req)
{
    return post(g, FF_COLL_ALLGATHER, send, recv, count, opt, 0, 0, req);
}

int ff_ireduce_scatter(ff_group *g, const float *send, float *recv, size_t count,
                       const ff_coll_opts *opt, ff_request **req)
{
    return post(g, FF_COLL_REDUCE_SCATTER, send, recv, count, opt, 0, 0, req);
}

int ff_ireduce_scatter_fed(ff_group *g, const float *send, float *recv, size_t count,
                           const ff_coll_opts *opt, ff_request **req)
{
    return post(g, FF_COLL_REDUCE_SCATTER, send, recv, count, opt, 0, 1, req);
}

int ff_reduce_scatter_feed(ff_request *req, int blocks)
{
    if (!req) /* (a reduce-scatter of nothing) */
        return FF_OK;
    if (!req->feeding || blocks < req->fed || blocks > req->group->size)
        return FF_EINVAL;
    ff_ctx *ctx = req->group->ctx;
    pthread_mutex_lock(&ctx->lock);
    req->fed = blocks; /* the lock orders the caller's writes before the ring's reads */
    progress_locked(ctx);
    int rc = req->error;
    pthread_mutex_unlock(&ctx->lock);
    return rc;
}

int ff_iallreduce(ff_group *g, const float *send, float *recv, size_t count,
                  const ff_coll_opts *opt, ff_request **req)
{
    return post(g, FF_COLL_ALLREDUCE, send, recv, count, opt, 0, 0, req);
}

int ff_iallreduce_half(ff_group *g, float *buf, size_t count, int gather, const ff_coll_opts *opt,
                       ff_request **req)
{
    return post(g, gather ? FF_COLL_ALLGATHER : FF_COLL_REDUCE_SCATTER, buf, buf, count, opt,
                gather ? 2 : 1, 0, req);
}

int ff_iallgather_half16(ff_group *g, uint16_t *buf, size_t count, ff_request **req)
{
    /* (the engine's buffers are floats: this one is read and written as
     * 2-byte values only, ring.c) */
    return post(g, FF_COLL_ALLGATHER, (const float *)(void *)buf, (float *)(void *)buf, count, NULL,
                3, 0, req);
}

int ff_ialltoall(ff_group *g, const float *send, float *recv, size_t count, const ff_coll_opts *opt,
                 ff_request **req)
{
    return post(g, FF_COLL_ALLTOALL, send, recv, count, opt, 0, 0, req);
}

/* ---- point-to-point ---- */

enum { P2P_TAG_BASE = 30001, P2P_TAGS = 2000 }; /* above the collectives' tags 1..30000 */

static int p2p_finished(ff_request *req)
{
    req->done = 1;
    return FF_OK;
}

static int post_one(ff_group *g, float *buf, size_t count, int peer, int tag, int is_send,
                    ff_request **out)
{
    *out = NULL;
    if (!g)
        return FF_EINVAL;
    ff_ctx *ctx = g->ctx;
    const char *what = is_send ? "send" : "receive";
    if (peer < 0 || peer >= g->size || peer == g->rank)
        return ff_set_error(ctx, FF_EINVAL, "%s on group %s: peer %d is not another rank of its %d",
                            what, g->name, peer, g->size);
    if (tag < 0 || tag >= P2P_TAGS)
        return ff_set_error(ctx, FF_EINVAL, "%s on group %s: tag %d is outside [0, %d)", what,
                            g->name, tag, P2P_TAGS);
    if (count > (size_t)INT_MAX)
        return ff_set_error(ctx, FF_EINVAL,
                            "%s on group %s: a message of %zu elements exceeds MPI's int count",
                            what, g->name, count);
    if (count && !buf)
        return ff_set_error(ctx, FF_EINVAL, "%s on group %s: NULL buffer", what, g->name);
    ff_request *req = calloc(1, sizeof *req);
    if (!req)
        return ff_set_error(ctx, FF_ENOMEM, "out of memory posting a %s", what);
    req->group = g;
    req->coll = FF_COLL_P2P;
    req->algo = FF_ALGO_MPI;
    req->wire = FF_WIRE_FP32;
    req->send = is_send ? buf : NULL;
    req->recv = is_send ? NULL : buf;
    req->count = count;
    req->tag = P2P_TAG_BASE + tag;
    req->advance = p2p_finished;
    for (int i = 0; i < FF_REQ_MAX_MPI; i++)
        req->mpi[i] = MPI_REQUEST_NULL;
    pthread_mutex_lock(&ctx->lock);
    req->t_post = ff_now();
    req->track = ff_trace_track_acquire(ctx);
    int rc = is_send ? ff_post_send(req, buf, count, peer) : ff_post_recv(req, buf, count, peer);
    if (rc == FF_OK) {
        list_add(ctx, req);
        advance_request(req);
        g->counters[FF_COLL_P2P].calls++;
        *out = req;
    } else {
        if (req->track > 0)
            ff_trace_track_release(ctx, req->track);
        request_free(req);
    }
    pthread_mutex_unlock(&ctx->lock);
    return rc;
}

int ff_isend(ff_group *g, const float *buf, size_t count, int peer, int tag, ff_request **req)
{
    return post_one(g, (float *)buf, count, peer, tag, 1, req);
}

int ff_irecv(ff_group *g, float *buf, size_t count, int peer, int tag, ff_request **req)
{
    return post_one(g, buf, count, peer, tag, 0, req);
}

int ff_test(ff_request *req, int *done)
{
    *done = 1;
    if (!req)
        return FF_OK;
    ff_ctx *ctx = req->group->ctx;
    pthread_mutex_lock(&ctx->lock);
    progress_locked(ctx);
    *done = req->done;
    int rc = req->error;
    pthread_mutex_unlock(&ctx->lock);
    return rc;
}

int ff_allgather_ready(ff_request *req, int *ready)
{
    *ready = 0;
    if (!req)
        return FF_EINVAL;
    ff_ctx *ctx = req->group->ctx;
    pthread_mutex_lock(&ctx->lock);
    progress_locked(ctx);
    if (req->done)
        *ready = req->group->size;
    else if (req->coll == FF_COLL_ALLGATHER && req->algo == FF_ALGO_RING && !req->half)
        *ready = req->step + 1; /* ring.c: step s delivers block r - s - 1 */
    int rc = req->error;
    pthread_mutex_unlock(&ctx->lock);
    return rc;
}

void ff_watchdog(const ff_ctx *ctx, double t0, const char *what, const char *group)
{
    const double timeout = ctx->opt.timeout_s, waited = ff_now() - t0;
    if (timeout <= 0 || waited <= timeout)
        return;
    fprintf(stderr,
            "fourfold: error: rank %d waited %.0f s for %s on group %s (more than --timeout "
            "%g): a peer has stopped or hung; aborting the job\n",
            ctx->rank, waited, what, group, timeout);
    fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, 1);
}

int ff_wait(ff_request **preq)
{
    ff_request *req = *preq;
    if (!req)
        return FF_OK;
    *preq = NULL;
    ff_ctx *ctx = req->group->ctx;
    double t0 = ff_now();
    const double timeout = ctx->opt.timeout_s;
    pthread_mutex_lock(&ctx->lock);
    for (unsigned spins = 1;; spins++) {
        progress_locked(ctx);
        if (req->done || req->error)
            break;
        if (timeout > 0 && spins % 1024 == 0)
            ff_watchdog(ctx, t0, ff_coll_name(req->coll), req->group->name);
    }
    double t1 = ff_now();
    req->group->counters[req->coll].wait_s += t1 - t0;
    if (req->done && t1 - t0 > 1e-6) {
        char name[FF_TRACE_NAME_LEN];
        snprintf(name, sizeof name, "wait %s %s", ff_coll_name(req->coll), req->group->name);
        ff_trace_record(ctx, name, 'w', 0, t0, t1);
    }
    if (!req->done && req->track > 0)
        ff_trace_track_release(ctx, req->track);
    int rc = req->error;
    list_remove(ctx, req);
    request_free(req);
    pthread_mutex_unlock(&ctx->lock);
    return rc;
}

int ff_waitall(ff_request **reqs, int n)
{
    int first = FF_OK;
    for (int i = 0; i < n; i++) {
        int rc = ff_wait(&reqs[i]);
        if (rc != FF_OK && first == FF_OK)
            first = rc;
    }
    return first;
}

/* ---- blocking wrappers ---- */

#define FF_BLOCKING(fn, ifn)                                                                       \
    int fn(ff_group *g, const float *send, float *recv, size_t count, const ff_coll_opts *opt)     \
    {                                                                                              \
        ff_request *req;                                                                           \
        int rc = ifn(g, send, recv, count, opt, &req);                                             \
        return rc != FF_OK ? rc : ff_wait(&req);                                                   \
    }

FF_BLOCKING(ff_allgather, ff_iallgather)
FF_BLOCKING(ff_reduce_scatter, ff_ireduce_scatter)
FF_BLOCKING(ff_allreduce, ff_iallreduce)
FF_BLOCKING(ff_alltoall, ff_ialltoall)
