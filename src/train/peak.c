/* The empirical peak of `fourfold train` (src/train/peak.h; docs/design.md
 * §8, "Empirical peak"). */
#define _GNU_SOURCE /* sched_getaffinity, CPU_COUNT: the CPUs a rank may use */
#include "peak.h"

#include <cblas.h>
#include <sched.h>
#include <time.h>
#include <unistd.h>

#include "fourfold/ctx.h"
#include "fourfold/gemm.h"

double ff_core_share(int cpus, int ranks, int threads)
{
    double want = (double)ranks * (threads > 1 ? threads : 1);
    return cpus > 0 && want > cpus ? cpus / want : 1;
}

/* The CPUs the ranks of one node may run on: the union of their affinity
 * masks (mpirun may bind each rank to a core of its own), or the online
 * CPUs where the mask is not known. Collective on node. */
static int node_cpus(MPI_Comm node)
{
    long online = sysconf(_SC_NPROCESSORS_ONLN);
#ifdef __linux__
    cpu_set_t mine, all;
    CPU_ZERO(&mine);
    int known = sched_getaffinity(0, sizeof mine, &mine) == 0, everywhere = 0;
    MPI_Allreduce(&known, &everywhere, 1, MPI_INT, MPI_MIN, node);
    if (everywhere &&
        MPI_Allreduce(&mine, &all, (int)sizeof all, MPI_BYTE, MPI_BOR, node) == MPI_SUCCESS)
        return CPU_COUNT(&all);
#else
    (void)node;
#endif
    return online > 0 ? (int)online : 1;
}

static int thread_seconds(double *s)
{
    struct timespec ts;
    if (clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts) != 0)
        return -1;
    *s = (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
    return 0;
}

/* C = A B, n x n, on the BLAS or on bf16's oneDNN */
static void product(ff_bf16_gemm *bf16, int n, const float *A, const float *B, float *C)
{
    if (bf16)
        ff_bf16_gemm_run(bf16, "peak", 0, 0, n, n, n, 1.0f, A, n, B, n, 0.0f, C, n);
    else
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, A, n, B, n, 0.0f, C,
                    n);
}

ff_sgemm_peak ff_sgemm_peak_measure(MPI_Comm comm, int threads, double seconds, ff_bf16_gemm *bf16)
{
    ff_sgemm_peak peak = {0, 1};
    MPI_Comm node;
    int ranks = 1, cpus = 0;
    if (MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node) == MPI_SUCCESS) {
        MPI_Comm_size(node, &ranks);
        cpus = node_cpus(node);
        MPI_Comm_free(&node);
    }
    enum { N = 512, MAX_RUNS = 1000 };
    const size_t nn = (size_t)N * N;
    /* on the allocator of the model's buffers (huge pages), as in a step */
    float *A = ff_floats_alloc(nn), *B = ff_floats_alloc(nn), *C = ff_floats_alloc(nn);
    ff_blas_set_threads(threads);
    int ok = A && B && C;
    for (size_t i = 0; ok && i < nn; i++) {
        A[i] = (float)((i * 7) % 13) * 0.01f;
        B[i] = (float)((i * 5) % 11) * 0.01f;
    }
    if (ok) /* warm-up: page faults, the BLAS's threads, oneDNN's primitive */
        product(bf16, N, A, B, C);
    double t[MAX_RUNS], probe;
    int runs = 0, cpu = ok && thread_seconds(&probe) == 0;
    MPI_Barrier(comm); /* every rank at once, as in a step */
    const double w0 = ff_now();
    while (ok && runs < MAX_RUNS && (runs < 3 || ff_now() - w0 < seconds)) {
        double a = 0, b = 0, wa = ff_now();
        cpu = cpu && thread_seconds(&a) == 0;
        product(bf16, N, A, B, C);
        cpu = cpu && thread_seconds(&b) == 0;
        t[runs++] = cpu ? b - a : ff_now() - wa;
    }
    if (ok) {
        double med = ff_median(t, runs);
        /* CPU time counts what the thread ran; where the ranks' threads
         * outnumber the CPUs each runs that share of the time (without a
         * thread clock, wall time holds the sharing already) */
        peak.share = cpu ? ff_core_share(cpus, ranks, threads) : 1;
        peak.flops = med > 0 ? 2.0 * N * N * N / med * peak.share : 0;
    }
    ff_floats_free(A), ff_floats_free(B), ff_floats_free(C);
    return peak;
}
