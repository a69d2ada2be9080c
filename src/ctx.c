/* The context: communicator, error state, options, progress thread. */
#include <limits.h>
#include <stdatomic.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "device.h"
#include "fourfold/gemm.h"
#include "internal.h"
#include "util/team.h"

double ff_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

const char *ff_strerror(int code)
{
    switch (code) {
    case FF_OK: return "FF_OK";
    case FF_EINVAL: return "FF_EINVAL";
    case FF_EGRID: return "FF_EGRID";
    case FF_EDIVIDE: return "FF_EDIVIDE";
    case FF_ENOMEM: return "FF_ENOMEM";
    case FF_EMPI: return "FF_EMPI";
    case FF_EIO: return "FF_EIO";
    case FF_ECORRUPT: return "FF_ECORRUPT";
    case FF_ENUMERIC: return "FF_ENUMERIC";
    case FF_EREMOTE: return "FF_EREMOTE";
    case FF_EUNSUPPORTED: return "FF_EUNSUPPORTED";
    default: return "FF_E(unknown)";
    }
}

int ff_ctx_set_error(ff_ctx *ctx, int code, const char *fmt, ...)
{
    if (ctx) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(ctx->err, sizeof ctx->err, fmt, ap);
        va_end(ap);
        ctx->err_code = code;
    }
    return code;
}

int ff_mpi_error(ff_ctx *ctx, int mpi_rc, const char *what)
{
    char msg[MPI_MAX_ERROR_STRING];
    int len = 0;
    if (MPI_Error_string(mpi_rc, msg, &len) != MPI_SUCCESS)
        snprintf(msg, sizeof msg, "MPI error %d", mpi_rc);
    return ff_set_error(ctx, FF_EMPI, "%s failed: %s", what, msg);
}

void ff_ctx_options_default(ff_ctx_options *opt)
{
    memset(opt, 0, sizeof *opt);
    opt->progress = FF_PROGRESS_POLL;
    opt->poll_interval_s = 200e-6;
    opt->thread_interval_s = 200e-6;
}

/* The compute device (ff_ctx_options.device, else FF_DEVICE): collective,
 * since the node-local rank picks the GPU (device.h). */
static int open_device(ff_ctx *ctx)
{
    const char *name = ctx->opt.device;
    int from_env = 0;
    if (!name && !ctx->opt.ignore_env && (name = getenv("FF_DEVICE")))
        from_env = 1;
    /* 0 the CPU, 1 cuda, -1 a bad name; every rank must ask for the same
     * (opening a GPU is collective) */
    int want = !name || !*name || strcmp(name, "cpu") == 0 ? 0 : (strcmp(name, "cuda") ? -1 : 1);
    int lo = want, hi = want;
    MPI_Allreduce(&want, &lo, 1, MPI_INT, MPI_MIN, ctx->comm);
    MPI_Allreduce(&want, &hi, 1, MPI_INT, MPI_MAX, ctx->comm);
    if (want < 0)
        return ff_set_error(ctx, FF_EINVAL, "%s%s%s: expected cpu or cuda",
                            from_env ? "FF_DEVICE=" : "the device option '", name,
                            from_env ? "" : "'");
    if (lo != hi)
        return ff_set_error(ctx, FF_EINVAL,
                            "the ranks ask for different devices (FF_DEVICE or the device "
                            "option differs between them)");
    if (want == 0)
        return FF_OK;
#ifdef FF_CUDA
    return ff_cuda_open(ctx, &ctx->cuda);
#else
    return ff_set_error(ctx, FF_EUNSUPPORTED,
                        "device 'cuda': this build has no CUDA backend (configure with "
                        "-DFF_CUDA=ON; docs/cuda.md)");
#endif
}

/* The checks and set-up that need no communication. */
static int create_local(ff_ctx *ctx)
{
    if (ctx->opt.progress < FF_PROGRESS_WAIT || ctx->opt.progress > FF_PROGRESS_THREAD)
        return ff_set_error(ctx, FF_EINVAL, "unknown progress mode %d", (int)ctx->opt.progress);
    if (!(ctx->opt.poll_interval_s >= 0) || !(ctx->opt.thread_interval_s >= 0))
        return ff_set_error(ctx, FF_EINVAL, "progress intervals must be >= 0");
    if (ctx->opt.threads < 0 || ctx->opt.threads > 1024)
        return ff_set_error(ctx, FF_EINVAL, "threads %d: expected 1 to 1024 (0: unset)",
                            ctx->opt.threads);
    /* every context sets the BLAS's threads: OpenBLAS's OpenMP build would
     * otherwise take OpenMP's default, every core, in each rank */
    if (ctx->opt.blas_threads < 0 || ctx->opt.blas_threads > 1024)
        return ff_set_error(ctx, FF_EINVAL, "BLAS threads %d: expected 1 to 1024 (0: threads)",
                            ctx->opt.blas_threads);
    ff_blas_set_threads(ff_ctx_blas_threads(ctx));
    /* one pool of threads where the BLAS's are OpenMP's (util/team.h) */
    int openmp = strcmp(ff_blas_threading(), "pthreads") != 0;
    if (!(ctx->team = ff_team_create(ctx->opt.threads > 0 ? ctx->opt.threads : 1, openmp)))
        return ff_set_error(ctx, FF_ENOMEM, "cannot start %d compute threads", ctx->opt.threads);
    if (ctx->opt.progress == FF_PROGRESS_THREAD) {
        int provided = MPI_THREAD_SINGLE;
        MPI_Query_thread(&provided);
        if (provided < MPI_THREAD_MULTIPLE)
            return ff_set_error(ctx, FF_EUNSUPPORTED,
                                "progress mode 'thread' needs MPI initialised with "
                                "MPI_THREAD_MULTIPLE (MPI_Init_thread)");
        ctx->thread_stop = 0;
        if (pthread_create(&ctx->thread, NULL, ff_engine_thread_main, ctx) != 0)
            return ff_set_error(ctx, FF_ENOMEM, "cannot start the progress thread");
        ctx->thread_running = 1;
    }
    return FF_OK;
}

int ff_ctx_create(ff_ctx **out, MPI_Comm comm, const ff_ctx_options *opt)
{
    *out = NULL;
    ff_ctx *ctx = calloc(1, sizeof *ctx);
    if (!ctx)
        return FF_ENOMEM;
    *out = ctx;
    ctx->comm = MPI_COMM_NULL;
    ctx->bf16_sum = MPI_OP_NULL;
    if (opt)
        ctx->opt = *opt;
    else
        ff_ctx_options_default(&ctx->opt);
    pthread_mutex_init(&ctx->lock, NULL);

    int rc = MPI_Comm_dup(comm, &ctx->comm);
    if (rc != MPI_SUCCESS)
        return ff_mpi_error(ctx, rc, "MPI_Comm_dup");
    /* Errors come back as codes; the caller decides (STYLE: never abort). */
    MPI_Comm_set_errhandler(ctx->comm, MPI_ERRORS_RETURN);
    MPI_Comm_rank(ctx->comm, &ctx->rank);
    MPI_Comm_size(ctx->comm, &ctx->size);
    rc = MPI_Op_create(ff_bf16_sum_op, 1, &ctx->bf16_sum);
    rc = rc == MPI_SUCCESS ? create_local(ctx) : ff_mpi_error(ctx, rc, "MPI_Op_create");
    /* some failures (the thread) could happen on one rank only */
    rc = ff_ctx_agree(ctx, rc);
    if (rc == FF_OK)
        rc = ff_ctx_agree(ctx, open_device(ctx));
    /* collective: the node layout of the hierarchical algorithms */
    if (rc == FF_OK)
        rc = ff_ctx_agree(ctx, ff_coll_layer_init(ctx));
    /* a program on the BLAS's fallback kernels hears it once (src/blas.c) */
    static atomic_int warned;
    int world = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &world);
    if (rc == FF_OK && world == 0 && ff_blas_fallback() && !atomic_exchange(&warned, 1))
        fprintf(stderr, "fourfold: warning: BLAS kernels %s\n", ff_blas_kernels());
    return rc;
}

void ff_ctx_destroy(ff_ctx *ctx)
{
    if (!ctx)
        return;
    if (ctx->thread_running) {
        ctx->thread_stop = 1;
        pthread_join(ctx->thread, NULL);
    }
    ff_engine_abandon_all(ctx);
    ff_team_destroy(ctx->team);
#ifdef FF_CUDA
    ff_cuda_close(ctx->cuda);
#endif
    ff_coll_layer_free(ctx);
    ff_trace_free(&ctx->trace);
    ff_pool_free(ctx);
    if (ctx->bf16_sum != MPI_OP_NULL)
        MPI_Op_free(&ctx->bf16_sum);
    if (ctx->comm != MPI_COMM_NULL)
        MPI_Comm_free(&ctx->comm);
    pthread_mutex_destroy(&ctx->lock);
    free(ctx);
}

const char *ff_ctx_error(const ff_ctx *ctx) { return ctx ? ctx->err : "out of memory"; }
int ff_ctx_rank(const ff_ctx *ctx) { return ctx->rank; }
int ff_ctx_size(const ff_ctx *ctx) { return ctx->size; }
MPI_Comm ff_ctx_comm(const ff_ctx *ctx) { return ctx->comm; }
ff_progress_mode ff_ctx_progress_mode(const ff_ctx *ctx) { return ctx->opt.progress; }
int ff_ctx_threads(const ff_ctx *ctx) { return ff_team_size(ctx->team); }
int ff_ctx_blas_threads(const ff_ctx *ctx)
{
    return ctx->opt.blas_threads > 0 ? ctx->opt.blas_threads
           : ctx->opt.threads > 0    ? ctx->opt.threads
                                     : 1;
}
const char *ff_ctx_team(const ff_ctx *ctx) { return ff_team_kind(ctx->team); }

int ff_ctx_agree(ff_ctx *ctx, int rc) { return ff_agree_on(ctx, ctx->comm, rc); }

int ff_mpi_complete(const ff_ctx *ctx, MPI_Request *req, const char *what)
{
    if (ctx->opt.timeout_s <= 0)
        return MPI_Wait(req, MPI_STATUS_IGNORE);
    const double t0 = ff_now();
    int done = 0, mrc = MPI_SUCCESS;
    while (mrc == MPI_SUCCESS && !done) {
        mrc = MPI_Test(req, &done, MPI_STATUS_IGNORE);
        if (mrc == MPI_SUCCESS && !done)
            ff_watchdog(ctx, t0, what, "the context's ranks");
    }
    return mrc;
}

int ff_agree_on(ff_ctx *ctx, MPI_Comm comm, int rc)
{
    /* The lowest failing rank speaks for all: its code and message. */
    int me, mine, first;
    MPI_Comm_rank(comm, &me);
    mine = rc < 0 ? me : INT_MAX;
    /* (non-blocking under a watchdog: a stopped peer must not hold this
     * rank here beyond --timeout) */
    const int watched = ctx->opt.timeout_s > 0;
    MPI_Request req;
    int mrc = watched ? MPI_Iallreduce(&mine, &first, 1, MPI_INT, MPI_MIN, comm, &req)
                      : MPI_Allreduce(&mine, &first, 1, MPI_INT, MPI_MIN, comm);
    if (mrc == MPI_SUCCESS && watched)
        mrc = ff_mpi_complete(ctx, &req, "an agreement (an all-reduce of every rank's status)");
    if (mrc != MPI_SUCCESS)
        return ff_mpi_error(ctx, mrc, "MPI_Allreduce (agreeing on an error)");
    if (first == INT_MAX)
        return FF_OK;
    struct {
        int code, rank; /* rank: in the context */
        char msg[FF_ERRMSG_LEN];
    } shared;
    shared.code = rc;
    shared.rank = ctx->rank;
    memcpy(shared.msg, ctx->err, sizeof shared.msg);
    mrc = watched ? MPI_Ibcast(&shared, (int)sizeof shared, MPI_BYTE, first, comm, &req)
                  : MPI_Bcast(&shared, (int)sizeof shared, MPI_BYTE, first, comm);
    if (mrc == MPI_SUCCESS && watched)
        mrc = ff_mpi_complete(ctx, &req, "an agreement (the failing rank's message)");
    if (mrc != MPI_SUCCESS)
        return ff_mpi_error(ctx, mrc, "MPI_Bcast (sharing an error)");
    shared.msg[sizeof shared.msg - 1] = '\0';
    if (first != me)
        return ff_set_error(ctx, shared.code, "rank %d: %s", shared.rank, shared.msg);
    return shared.code;
}
