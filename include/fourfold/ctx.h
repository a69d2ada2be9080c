/* The fourfold context: the handle every other part of the library hangs off.
 *
 * A context wraps one MPI communicator (duplicated, so fourfold's traffic never
 * mixes with the caller's), keeps the last error message, owns the engine that
 * advances non-blocking collectives, and the timeline (trace). The library never
 * calls exit() or MPI_Abort(): every function returns 0 or a negative FF_E* code
 * and leaves a message on the context; the caller decides what to do.
 *
 * Thread-safety: one thread calls into a context at a time. The optional
 * progress thread (FF_PROGRESS_THREAD) is internal and synchronised with the
 * caller by the context itself. */
#ifndef FOURFOLD_CTX_H
#define FOURFOLD_CTX_H

#include <mpi.h>
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Error codes. 0 is success; every error is negative. */
enum {
    FF_OK = 0,
    FF_EINVAL = -1,       /* a bad argument or option */
    FF_EGRID = -2,        /* a grid that is malformed or does not match the job */
    FF_EDIVIDE = -3,      /* a size that does not divide as required */
    FF_ENOMEM = -4,       /* out of memory */
    FF_EMPI = -5,         /* the MPI library returned an error */
    FF_EIO = -6,          /* a file could not be read or written */
    FF_ECORRUPT = -7,     /* a file is truncated or fails its checksum */
    FF_ENUMERIC = -8,     /* NaN or Inf where a finite number is required */
    FF_EREMOTE = -9,      /* another rank failed (its message is copied here) */
    FF_EUNSUPPORTED = -10 /* valid, but not available in this build or MPI */
};

/* How posted collectives advance between their start and their wait.
 * Open MPI without asynchronous progress moves data only inside MPI calls
 * (see docs/overlap.md for the measurements behind the default). */
typedef enum {
    FF_PROGRESS_WAIT = 0, /* only inside ff_test/ff_wait (no overlap) */
    FF_PROGRESS_POLL,     /* also inside ff_poll(), called from compute loops */
    FF_PROGRESS_THREAD    /* a helper thread polls (needs MPI_THREAD_MULTIPLE) */
} ff_progress_mode;

/* Which algorithms FF_ALGO_AUTO may pick (FF_STRICT_VOLUME). */
typedef enum {
    FF_VOLUME_UNSET = 0, /* FF_STRICT_VOLUME, else strict */
    FF_VOLUME_STRICT,    /* only those whose bytes the planner predicts */
    FF_VOLUME_ANY        /* any algorithm the model ranks first */
} ff_volume_rule;

/* A context's settings. The collective layer's five, and the device, can
 * also come from environment variables, as NCCL's do (table: docs/collectives.md,
 * "Settings"): a field left unset (NULL or 0) takes its variable's value
 * unless `ignore_env` is 1, else the built-in default; a field that is set
 * wins over its variable. The strings are read during ff_ctx_create only. */
typedef struct {
    ff_progress_mode progress;
    double poll_interval_s;   /* ff_poll() does nothing if called sooner than this */
    double thread_interval_s; /* the progress thread sleeps this long between polls */
    /* FF_PROFILE: a machine profile (`fourfold bench profile`) whose
     * alpha-beta model and measured picks drive FF_ALGO_AUTO (unset: the
     * built-in model) */
    const char *profile;
    /* FF_ALGO: every collective runs this algorithm: "auto" (unset), "mpi",
     * "ring", "rec", "hier-ring", "hier-rec", "rec-whole" or "direct" */
    const char *algo;
    /* FF_RANKS_PER_NODE: rank r of the communicator counts as on node
     * r / ranks_per_node, to emulate nodes on one machine (unset: the nodes
     * MPI reports, MPI_COMM_TYPE_SHARED) */
    int ranks_per_node;
    /* FF_A2A_WINDOW: all-to-all partners in flight at once, 1 to 8 (unset: 8) */
    int a2a_window;
    ff_volume_rule volume; /* FF_STRICT_VOLUME=1 or 0 */
    int ignore_env;        /* 1: unset fields take the built-in defaults */
    /* This rank's compute threads, for the BLAS (process-wide with
     * OpenBLAS's pthreads build; with its OpenMP build, OpenMP's thread
     * count of the thread that creates the context, which OpenBLAS follows:
     * the last context created sets it) and for the element-wise work
     * alike (docs/design.md §8); the element-wise work's results do not
     * depend on it, the products' only as the BLAS's threaded kernels do
     * (OpenBLAS's Haswell kernels split sums by the thread count). 0: unset,
     * one thread (the BLAS is set to one thread too: OpenBLAS's OpenMP
     * build would otherwise use every core in every rank). */
    int threads;
    /* The BLAS's threads alone, where they should differ from `threads`
     * (0: `threads`). The element-wise work's results never depend on its
     * threads; the products' depend on the BLAS's where its threaded kernels
     * split sums by the thread count (docs/design.md §8, "Threads"). */
    int blas_threads;
    /* FF_DEVICE: where the model computes, "cpu" (unset) or "cuda" (a build
     * with -DFF_CUDA=ON: one GPU per rank, the node's GPUs shared round
     * robin; docs/cuda.md) */
    const char *device;
    /* A watchdog (off at 0): a rank that waits longer than this many seconds
     * for one collective or message (ff_wait) prints which one, on which
     * group, and aborts the whole job (MPI_Abort): a rank that stopped
     * (SIGSTOP, a hung device, a dead node that MPI does not notice) must
     * not leave its peers spinning forever. `--timeout S` in the program. */
    double timeout_s;
} ff_ctx_options;

typedef struct ff_ctx ff_ctx;

/* Fills the defaults: FF_PROGRESS_POLL, 200 us polling, 200 us thread sleep
 * (measured: docs/overlap.md); the collective settings unset (zero). */
void ff_ctx_options_default(ff_ctx_options *opt);

/* Creates a context on `comm` (collective over it). On success returns 0.
 * On failure returns a negative code; *out is still set (unless FF_ENOMEM) so
 * that ff_ctx_error() can be read, and must be destroyed. Every rank gets the
 * same result. */
int ff_ctx_create(ff_ctx **out, MPI_Comm comm, const ff_ctx_options *opt);
void ff_ctx_destroy(ff_ctx *ctx);

/* Where the context computes: "cpu", or a line naming its GPU. */
const char *ff_ctx_device(const ff_ctx *ctx);
/* On a GPU context, the calls (passes and matrix products) the GPU ran and
 * those that ran on the CPU because a buffer was not one the GPU can read,
 * such as plain host memory (docs/cuda.md); zeros on the CPU. */
void ff_ctx_device_work(const ff_ctx *ctx, long long *gpu, long long *cpu);

/* Records an error (printf-style message) on the context and returns `code`,
 * so that a caller's own failure can be shared with ff_ctx_agree(). */
int ff_ctx_set_error(ff_ctx *ctx, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* The message of the last error, or "" if none. */
const char *ff_ctx_error(const ff_ctx *ctx);
/* A short name for an error code ("FF_EGRID"). */
const char *ff_strerror(int code);

int ff_ctx_rank(const ff_ctx *ctx);
int ff_ctx_size(const ff_ctx *ctx);
MPI_Comm ff_ctx_comm(const ff_ctx *ctx);
ff_progress_mode ff_ctx_progress_mode(const ff_ctx *ctx);
/* The rank's compute threads (ff_ctx_options.threads; 1 if unset). */
int ff_ctx_threads(const ff_ctx *ctx);
/* The BLAS's threads of the context's products (blas_threads, else threads). */
int ff_ctx_blas_threads(const ff_ctx *ctx);
/* What runs the element-wise work on those threads: "openmp" (OpenMP's
 * threads, the BLAS's own when OpenBLAS is its OpenMP build) or "own
 * threads" (workers beside a BLAS with pthreads of its own); the results
 * are the same bits either way (docs/design.md §8). */
const char *ff_ctx_team(const ff_ctx *ctx);

/* Makes every rank agree on an outcome (collective over the context's
 * communicator). Each rank passes its own result; if any rank failed, every
 * rank returns the error of the lowest failing rank, and the context's message
 * becomes that rank's message (prefixed with "rank N: " on the other ranks).
 * Call it before posting any collective whose arguments could be wrong on some
 * ranks only; it is how one rank's error becomes everyone's, without a hang. */
int ff_ctx_agree(ff_ctx *ctx, int rc);

/* Seconds on a monotonic clock, for timing compute regions. */
double ff_now(void);

#ifdef __cplusplus
}
#endif
#endif
