/* A team of threads for a rank's work outside the BLAS (docs/design.md §8):
 * element-wise passes, attention's heads, the embedding, cross-entropy and
 * AdamW. The caller is thread 0; the others never call MPI. Two kinds:
 *   OpenMP: the runs are parallel regions on OpenMP's threads, the same
 *     threads as the BLAS's when OpenBLAS is its OpenMP build, so that one
 *     pool of threads serves both (their brief spin after a region keeps
 *     them awake for the next product or pass);
 *   own threads: threads-1 workers that sleep on a condition variable
 *     between runs (they never spin, leaving the cores to a BLAS with
 *     threads of its own). With OpenBLAS's pthreads build this is the only
 *     safe kind: OpenMP's spinning threads beside OpenBLAS's took twice the
 *     time of a step (docs/results.md).
 *
 * Results must not depend on the number of threads: a loop run on a team
 * gives each index to exactly one thread, and a function that reduces over
 * indices must reduce in an order fixed by the indices alone (fixed-size
 * blocks summed in order), never per thread. Not installed. */
#ifndef FF_TEAM_H
#define FF_TEAM_H

#include <stdint.h>

typedef struct ff_team ff_team;

/* fn(arg, begin, end, thread): the indices [begin, end) on thread `thread`
 * (0 = the caller; < ff_team_size), for per-thread scratch. */
typedef void (*ff_team_fn)(void *arg, int64_t begin, int64_t end, int thread);

/* A team of `threads` >= 1: on OpenMP if `openmp` and the library was
 * built with it, else with threads-1 workers of its own; NULL if out of
 * memory or a thread cannot start. */
ff_team *ff_team_create(int threads, int openmp);
void ff_team_destroy(ff_team *t);
int ff_team_size(const ff_team *t);
/* "openmp" or "own threads" */
const char *ff_team_kind(const ff_team *t);

/* Runs fn over [0, n) in contiguous ranges, at least `grain` indices each
 * (fewer ranges than threads when n is small; one range runs on the caller
 * without waking anyone), and returns when all are done. A NULL team runs
 * fn(arg, 0, n, 0) on the caller. */
void ff_team_run(ff_team *t, int64_t n, int64_t grain, ff_team_fn fn, void *arg);

#endif
