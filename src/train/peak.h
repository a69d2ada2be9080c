/* The empirical peak that `fourfold train` divides its model FLOP/s by
 * (docs/design.md §8, "Empirical peak"). Not installed. */
#ifndef FF_TRAIN_PEAK_H
#define FF_TRAIN_PEAK_H

#include <mpi.h>

#include "fourfold/gemm.h"

typedef struct {
    double flops; /* this rank's sgemm FLOP/s, all ranks computing at once */
    double share; /* the share of a core each compute thread has (ff_core_share) */
} ff_sgemm_peak;

/* What a compute thread gets of the node's cores when `ranks` ranks of
 * `threads` threads each share `cpus` of them: min(1, cpus / (ranks threads)). */
double ff_core_share(int cpus, int ranks, int threads);

/* Collective on comm: every rank multiplies 512 x 512 matrices on
 * `threads` BLAS threads for `seconds` at once, timing each product by the
 * calling thread's CPU time (what the scheduler gave it, so neither time
 * slices among the ranks nor other programs on the machine move it); the
 * median product's rate times the share of a core (the node's ranks and
 * the CPUs their affinity masks allow). The BLAS is left on `threads`.
 * With bf16 (not NULL), the products are that handle's (oneDNN's bf16
 * matmul, the operands rounded in each call): the peak of a bf16-mixed run
 * whose products run there. */
ff_sgemm_peak ff_sgemm_peak_measure(MPI_Comm comm, int threads, double seconds, ff_bf16_gemm *bf16);

#endif
