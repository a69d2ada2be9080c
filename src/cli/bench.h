/* Shared by the `fourfold bench` subcommands (bench.c, bench_gemm.c,
 * bench_profile.c, bench_tune.c); implemented in bench_common.c. */
#ifndef FF_CLI_BENCH_H
#define FF_CLI_BENCH_H

#include <stddef.h>

#include "cli.h"

/* The MPI library's blocking collective (coll/tuned), a row of its own in
 * `bench coll`: FF_ALGO_MPI is the library's non-blocking one (libnbc). */
enum { BENCH_MPI_BLOCKING = -1 };

/* Integer-valued test data: |value| <= 5, so sums over up to 51 ranks are
 * exact in fp32 and in bf16 (integers up to 256), whatever the order. */
static inline float bench_value(int rank, size_t i)
{
    return (float)((rank * 7 + (int)(i % 11) * 5) % 11 - 5);
}

/* Runs `coll` once on g with `algo` (an ff_algo or BENCH_MPI_BLOCKING) and
 * waits for it. */
int bench_run_once(ff_group *g, ff_coll coll, int algo, ff_wire wire, const float *send,
                   float *recv, size_t count);
/* A failure inside a collective leaves the group's other ranks waiting in
 * it: prints the context's error and aborts the job (STYLE: MPI_Abort only then). */
void bench_die_in_collective(ff_ctx *ctx, int rc);

/* Times `coll` on g: `warmup` untimed runs, then `iters` timed ones, each
 * after a barrier on `sync` (the communicator every concurrently measured
 * group belongs to); an iteration's time is the maximum over the ranks of
 * `sync`. Returns the median in seconds. A failed collective prints the
 * context's error and aborts the job (the other ranks would wait in it). algo: an ff_algo or
 * BENCH_MPI_BLOCKING. In place when send is recv's own slot (all-gather) or
 * recv itself (all-reduce). A rank outside every measured group passes g =
 * NULL and takes part in the barriers only. */
double bench_time_coll(ff_ctx *ctx, ff_group *g, MPI_Comm sync, ff_coll coll, int algo,
                       ff_wire wire, const float *send, float *recv, size_t count, int warmup,
                       int iters);

/* Times every algorithm of algos[0..na) on g, interleaved (iteration i runs
 * each once in turn, a barrier on `sync` before each run), `warmup`
 * untimed iterations first; med[a] gets the median over iterations of the
 * slowest rank of `sync`. Ranks outside every measured group pass g = NULL
 * and take part in the barriers only. Aborts the job if a collective
 * fails. */
void bench_time_algos(ff_ctx *ctx, ff_group *g, MPI_Comm sync, ff_coll coll, const int *algos,
                      int na, ff_wire wire, const float *send, float *recv, size_t count,
                      int warmup, int iters, double *med);

/* nccl-tests' short options: -b, -e, -f, -n, -w become --minbytes,
 * --maxbytes, --factor, --iters, --warmup (a->name set; others untouched). */
void bench_short_option(cli_args *a);

int cmd_bench_coll(int argc, char **argv);
int cmd_bench_gemm(int argc, char **argv);
int cmd_bench_profile(int argc, char **argv);
int cmd_bench_tune(int argc, char **argv);

#endif
