/* A team of threads for a rank's work outside the BLAS (docs/design.md §8):
 * element-wise passes, attention's heads, the embedding, cross-entropy and
 * AdamW. The caller is thread 0; threads-1 workers sleep on a condition
 * variable between runs (they never spin, so they leave the cores to the
 * BLAS's own threads) and never call MPI.
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

/* A team of `threads` >= 1 (threads-1 workers started); NULL if out of
 * memory or a thread cannot start. */
ff_team *ff_team_create(int threads);
void ff_team_destroy(ff_team *t);
int ff_team_size(const ff_team *t);

/* Runs fn over [0, n) in contiguous ranges, at least `grain` indices each
 * (fewer ranges than threads when n is small; one range runs on the caller
 * without waking anyone), and returns when all are done. A NULL team runs
 * fn(arg, 0, n, 0) on the caller. */
void ff_team_run(ff_team *t, int64_t n, int64_t grain, ff_team_fn fn, void *arg);

#endif
