/* Overlap benchmark: how much of a collective is hidden behind computation,
 * for each way of making collectives progress.
 *
 * Each rank computes a fixed amount of real work (a loop of sgemm calls,
 * calibrated so that the loop takes --compute-ms of wall time with every rank
 * computing at once) while one collective is in flight. Per mechanism, each
 * repetition measures, with a barrier before each and the maximum over ranks:
 *
 *   comm     post + wait, nothing else            (the collective alone)
 *   compute  the sgemm loop with its poll calls   (the compute alone)
 *   total    post, the sgemm loop, wait
 *   wait     the part of total spent in the final wait
 *   cpu      CPU time of total minus CPU time of compute, summed over
 *            ranks: what the collective cost the processors (copies,
 *            reductions, polling), excluding the kernel's network work
 *
 * hidden = 1 - (total - compute) / comm, from the medians over repetitions
 * (1: fully hidden; 0: no overlap; negative: overlap made things slower).
 *
 * Mechanisms: wait (FF_PROGRESS_WAIT: no progress until the wait), poll-N
 * (FF_PROGRESS_POLL, ff_poll() after every sgemm, progress at most every N
 * us), thread-N (FF_PROGRESS_THREAD, the helper thread polls every N us),
 * and the same with the MPI library's algorithm (algo mpi).
 *
 * --idle replaces the sgemm calls by 50 us sleeps: the CPU is free, as on a
 * rank whose host thread waits for GPU kernels. */
#include <cblas.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#include "fourfold/fourfold.h"


typedef struct {
    const char *name;
    ff_progress_mode mode;
    double interval_us;
    ff_algo algo;
} mechanism;

static const mechanism all_mechanisms[] = {
    {"wait", FF_PROGRESS_WAIT, 0, FF_ALGO_RING},
    {"poll-1000us", FF_PROGRESS_POLL, 1000, FF_ALGO_RING},
    {"poll-200us", FF_PROGRESS_POLL, 200, FF_ALGO_RING},
    {"poll-50us", FF_PROGRESS_POLL, 50, FF_ALGO_RING},
    {"thread-20us", FF_PROGRESS_THREAD, 20, FF_ALGO_RING},
    {"thread-200us", FF_PROGRESS_THREAD, 200, FF_ALGO_RING},
    {"mpi-wait", FF_PROGRESS_WAIT, 0, FF_ALGO_MPI},
    {"mpi-poll-200us", FF_PROGRESS_POLL, 200, FF_ALGO_MPI},
    {"mpi-thread-20us", FF_PROGRESS_THREAD, 20, FF_ALGO_MPI},
};
enum { N_MECH = sizeof all_mechanisms / sizeof all_mechanisms[0] };

typedef struct {
    int idle;   /* sleep instead of computing (a rank waiting on an accelerator) */
    int gemm;   /* sgemm size (square) */
    long iters; /* sgemm calls in the compute loop */
    float *a, *b, *c;
} compute;

static void compute_run(compute *w, ff_ctx *ctx)
{
    int n = w->gemm;
    const struct timespec slice = {0, 50000};
    for (long i = 0; i < w->iters; i++) {
        if (w->idle)
            nanosleep(&slice, NULL);
        else
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, w->a, n, w->b, n,
                        0.0f, w->c, n);
        if (ctx)
            ff_poll(ctx);
    }
}

/* CPU seconds (user + system, all threads) this process has used. */
static double cpu_seconds(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)ru.ru_utime.tv_sec + 1e-6 * (double)ru.ru_utime.tv_usec +
           (double)ru.ru_stime.tv_sec + 1e-6 * (double)ru.ru_stime.tv_usec;
}

static double sum_over_ranks(double t)
{
    double m;
    MPI_Allreduce(&t, &m, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
    return m;
}

static double max_over_ranks(double t)
{
    double m;
    MPI_Allreduce(&t, &m, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    return m;
}


/* Sets w->iters so the loop takes `ms` of wall time with all ranks computing:
 * rescale by the median of three timed runs until within 3%. */
static void calibrate(compute *w, double ms)
{
    w->iters = 8;
    for (int round = 0; round < 8; round++) {
        double t[3];
        for (int k = 0; k < 3; k++) {
            MPI_Barrier(MPI_COMM_WORLD);
            double t0 = ff_now();
            compute_run(w, NULL);
            t[k] = max_over_ranks(ff_now() - t0);
        }
        long want = (long)((double)w->iters * ms * 1e-3 / ff_median(t, 3));
        if (want < 1)
            want = 1;
        MPI_Bcast(&want, 1, MPI_LONG, 0, MPI_COMM_WORLD);
        int close = fabs((double)want - (double)w->iters) < 0.03 * (double)w->iters;
        w->iters = want;
        if (close)
            break;
    }
}

static int post(ff_group *g, ff_coll coll, float *send, float *recv, size_t n, ff_algo algo,
                ff_request **req)
{
    ff_coll_opts o = {FF_WIRE_FP32, algo};
    switch (coll) {
    case FF_COLL_ALLGATHER: return ff_iallgather(g, send, recv, n, &o, req);
    case FF_COLL_REDUCE_SCATTER: return ff_ireduce_scatter(g, send, recv, n, &o, req);
    case FF_COLL_ALLREDUCE: return ff_iallreduce(g, send, recv, n, &o, req);
    default: return ff_ialltoall(g, send, recv, n, &o, req);
    }
}

static void usage(void)
{
    fprintf(stderr,
            "usage: mpirun -np N ff_bench_overlap [--coll allreduce|allgather|reduce_scatter|"
            "alltoall]\n"
            "       [--size BYTES_PER_RANK (e.g. 16MiB)] [--compute-ms 300] [--reps 5]\n"
            "       [--gemm 128] [--mech name,name,...] [--label TEXT] [--idle]\n"
            "       [--trace PREFIX: one Chrome trace per mechanism, PREFIX-<mechanism>.json]\n");
}

int main(int argc, char **argv)
{
    int provided;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
    int rank, size;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    ff_blas_set_threads(1);

    ff_coll coll = FF_COLL_ALLREDUCE;
    double size_bytes = 16.0 * 1024 * 1024, compute_ms = 300;
    int reps = 5, gemm = 128, idle = 0;
    const char *mech_list = NULL, *label = "", *trace = NULL;
    for (int i = 1; i < argc; i++) {
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(argv[i], "--coll") && v) {
            int found = 0;
            for (int c = 0; c < FF_NCOLL; c++)
                if (!strcmp(v, ff_coll_name((ff_coll)c)))
                    coll = (ff_coll)c, found = 1;
            if (!found) {
                usage();
                MPI_Abort(MPI_COMM_WORLD, 2);
            }
        } else if (!strcmp(argv[i], "--size") && v) {
            char *end;
            size_bytes = strtod(v, &end);
            if (!strcmp(end, "KiB") || !strcmp(end, "K"))
                size_bytes *= 1024;
            if (!strcmp(end, "MiB") || !strcmp(end, "M"))
                size_bytes *= 1024 * 1024;
        } else if (!strcmp(argv[i], "--compute-ms") && v) {
            compute_ms = atof(v);
        } else if (!strcmp(argv[i], "--reps") && v) {
            reps = atoi(v);
        } else if (!strcmp(argv[i], "--gemm") && v) {
            gemm = atoi(v);
        } else if (!strcmp(argv[i], "--mech") && v) {
            mech_list = v;
        } else if (!strcmp(argv[i], "--idle")) {
            idle = 1;
            continue;
        } else if (!strcmp(argv[i], "--label") && v) {
            label = v;
        } else if (!strcmp(argv[i], "--trace") && v) {
            trace = v;
        } else {
            if (rank == 0)
                usage();
            MPI_Finalize();
            return 2;
        }
        i++;
    }
    if (reps < 1 || reps > 1000 || gemm < 8 || size_bytes < 4) {
        if (rank == 0)
            usage();
        MPI_Finalize();
        return 2;
    }

    /* the collective's buffers: `size` bytes per rank as the notes define it
     * (all-gather: contribution; reduce-scatter: received block; all-reduce:
     * the vector; all-to-all: whole send buffer) */
    size_t n = (size_t)(size_bytes / 4);
    if (coll == FF_COLL_ALLTOALL)
        n /= (size_t)size;
    size_t n_send = (coll == FF_COLL_REDUCE_SCATTER || coll == FF_COLL_ALLTOALL) ? n * size : n;
    size_t n_recv = (coll == FF_COLL_ALLGATHER || coll == FF_COLL_ALLTOALL) ? n * size : n;
    float *send = malloc(n_send * sizeof(float)), *recv = malloc(n_recv * sizeof(float));
    compute w = {idle, gemm, 0, NULL, NULL, NULL};
    size_t gg = (size_t)gemm * (size_t)gemm;
    w.a = malloc(gg * sizeof(float));
    w.b = malloc(gg * sizeof(float));
    w.c = malloc(gg * sizeof(float));
    if (!send || !recv || !w.a || !w.b || !w.c) {
        fprintf(stderr, "out of memory\n");
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    for (size_t i = 0; i < n_send; i++)
        send[i] = (float)((i + (size_t)rank) % 13);
    for (size_t i = 0; i < gg; i++)
        w.a[i] = w.b[i] = (float)(i % 7) * 0.01f;
    memset(recv, 0, n_recv * sizeof(float));
    memset(w.c, 0, gg * sizeof(float));

    calibrate(&w, compute_ms);
    double gemm_flops = 2.0 * gemm * gemm * gemm * (double)w.iters;
    char host[MPI_MAX_PROCESSOR_NAME];
    int hl;
    MPI_Get_processor_name(host, &hl);
    if (rank == 0) {
        printf("# overlap benchmark %s: %s of %.1f MiB per rank on %d ranks, %.0f ms of compute "
               "(%ld %s per rank), %d repetitions, medians; OpenBLAS core %s, 1 "
               "thread per rank; MPI_THREAD_MULTIPLE\n",
               label, ff_coll_name(coll), size_bytes / 1048576.0, size, compute_ms, w.iters,
               idle ? "sleeps of 50 us" : "sgemm calls", reps, ff_blas_core());
        if (!idle)
            printf("# sgemm %dx%dx%d\n", gemm, gemm, gemm);
        printf("%-16s %10s %10s %10s %10s %8s %12s\n", "mechanism", "comm ms", "compute ms",
               "total ms", "wait ms", "hidden", "comm cpu ms");
    }

    for (int m = 0; m < N_MECH; m++) {
        const mechanism *mech = &all_mechanisms[m];
        if (mech_list) { /* a comma-separated list of names */
            const char *p = strstr(mech_list, mech->name);
            size_t len = strlen(mech->name);
            if (!p || (p != mech_list && p[-1] != ',') || (p[len] != '\0' && p[len] != ','))
                continue;
        }
        ff_ctx_options o;
        ff_ctx_options_default(&o);
        o.progress = mech->mode;
        o.poll_interval_s = mech->interval_us * 1e-6;
        o.thread_interval_s = mech->interval_us * 1e-6;
        ff_ctx *ctx;
        ff_group *g;
        if (ff_ctx_create(&ctx, MPI_COMM_WORLD, &o) != FF_OK ||
            ff_group_create(ctx, ff_ctx_comm(ctx), "WORLD", &g) != FF_OK) {
            fprintf(stderr, "rank %d: %s\n", rank, ff_ctx_error(ctx));
            MPI_Abort(MPI_COMM_WORLD, 1);
        }
        double *t_comm = malloc(sizeof(double) * (size_t)reps * 5);
        double *t_comp = t_comm + reps, *t_total = t_comp + reps, *t_wait = t_total + reps;
        double *t_cpu = t_wait + reps;
        if (trace)
            ff_trace_enable(ctx);
        ff_request *req;
        /* warm-up: one collective and one compute loop */
        post(g, coll, send, recv, n, mech->algo, &req);
        ff_wait(&req);
        for (int r = 0; r < reps; r++) {
            MPI_Barrier(MPI_COMM_WORLD);
            double t0 = ff_now();
            post(g, coll, send, recv, n, mech->algo, &req);
            ff_wait(&req);
            t_comm[r] = max_over_ranks(ff_now() - t0);

            MPI_Barrier(MPI_COMM_WORLD);
            double c0 = cpu_seconds();
            t0 = ff_now();
            ff_trace_begin(ctx, "compute alone");
            compute_run(&w, ctx);
            ff_trace_end(ctx);
            t_comp[r] = max_over_ranks(ff_now() - t0);
            double cpu_compute = cpu_seconds() - c0;

            MPI_Barrier(MPI_COMM_WORLD);
            c0 = cpu_seconds();
            t0 = ff_now();
            post(g, coll, send, recv, n, mech->algo, &req);
            ff_trace_begin(ctx, "compute");
            compute_run(&w, ctx);
            ff_trace_end(ctx);
            double tw = ff_now();
            ff_wait(&req);
            double t1 = ff_now();
            double cpu_total = cpu_seconds() - c0;
            t_total[r] = max_over_ranks(t1 - t0);
            t_wait[r] = max_over_ranks(t1 - tw);
            t_cpu[r] = sum_over_ranks(cpu_total - cpu_compute);
        }
        double comm = ff_median(t_comm, reps), comp = ff_median(t_comp, reps);
        double total = ff_median(t_total, reps), wait = ff_median(t_wait, reps);
        double cpu = ff_median(t_cpu, reps);
        double hidden = 1.0 - (total - comp) / comm;
        if (rank == 0) {
            printf("%-16s %10.1f %10.1f %10.1f %10.1f %8.2f %12.1f\n", mech->name, comm * 1e3,
                   comp * 1e3, total * 1e3, wait * 1e3, hidden, cpu * 1e3);
            printf(
                "{\"bench\":\"overlap\",\"label\":\"%s\",\"coll\":\"%s\",\"bytes_per_rank\":%.0f,"
                "\"ranks\":%d,\"idle\":%d,\"mechanism\":\"%s\",\"comm_ms\":%.3f,\"compute_ms\":%."
                "3f,"
                "\"total_ms\":%.3f,\"wait_ms\":%.3f,\"hidden\":%.4f,\"comm_cpu_ms\":%.3f,"
                "\"gflops_per_rank\":%.2f}\n",
                label, ff_coll_name(coll), size_bytes, size, idle, mech->name, comm * 1e3,
                comp * 1e3, total * 1e3, wait * 1e3, hidden, cpu * 1e3, gemm_flops / comp * 1e-9);
            fflush(stdout);
        }
        free(t_comm);
        if (trace) {
            char path[512];
            snprintf(path, sizeof path, "%s-%s.json", trace, mech->name);
            if (ff_trace_write(ctx, path) != FF_OK && rank == 0)
                fprintf(stderr, "%s\n", ff_ctx_error(ctx));
        }
        ff_group_destroy(g);
        ff_ctx_destroy(ctx);
    }
    free(send), free(recv), free(w.a), free(w.b), free(w.c);
    MPI_Finalize();
    return 0;
}
