/* Linear-layer benchmark: one training step of the 3D parallel linear layer
 * (forward, backward, gradient reductions) on one grid, with every overlap
 * off and with every overlap on.
 *
 *   ff_bench_linear --grid 2x2x1x1 [--k 2048] [--n 2048] [--rows 4096]
 *                   [--layers 1|2] [--reps 5] [--trace step.json] [--label TEXT]
 *
 * --layers 1 is one N layer (k -> n); 2 is an N layer followed by a T layer
 * (k -> n -> k), which gives OAG and ORS something to overlap with.
 * --rows is the global batch: each rank holds rows / (Gz*Gd) of them.
 *
 * Per step (barrier before, maximum over ranks, median over --reps after one
 * untimed warm-up step that also tunes the GEMM modes):
 *   step ms     wall time of the step
 *   wait ms     time blocked in ff_wait (all collectives), max over ranks
 *   gemm/peak   GFLOP/s of the slowest rank's sgemms inside the step, as a
 *               fraction of the sgemm rate measured on the layer's forward
 *               shape with every rank computing at once (the same contention;
 *               median of 7 calls, measured before and after, the higher)
 *   MiB         bytes each rank received per step, per group and collective
 * hidden = 1 - (step_on - compute) / (step_off - compute), compute being the
 * slowest rank's GEMM time in a step with overlaps off: the part of the
 * exposed communication that the overlaps removed. A JSON line per configuration follows the table.
 */
#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fourfold/fourfold.h"

typedef struct {
    const char *grid, *trace, *label;
    long k, n, rows, layers, reps;
} options;

static double now(void) { return MPI_Wtime(); }

static void die(int rank, const char *msg)
{
    if (rank == 0)
        fprintf(stderr, "ff_bench_linear: %s\n", msg);
    MPI_Abort(MPI_COMM_WORLD, 2);
}

/* The sgemm rate of the forward's local shape, every rank at once: the
 * median of 7 calls. */
static double sgemm_rate(long m, long n, long k)
{
    float *a = ff_floats_alloc((size_t)(m * k)), *b = ff_floats_alloc((size_t)(k * n)),
          *c = ff_floats_alloc((size_t)(m * n));
    for (long i = 0; i < m * k; i++)
        a[i] = (float)(i % 7) * 0.1f;
    for (long i = 0; i < k * n; i++)
        b[i] = (float)(i % 5) * 0.1f;
    double t[7];
    for (int r = 0; r < 8; r++) {
        MPI_Barrier(MPI_COMM_WORLD);
        double t0 = now();
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)m, (int)n, (int)k, 1.0f, a,
                    (int)k, b, (int)n, 0.0f, c, (int)n);
        if (r > 0)
            t[r - 1] = now() - t0;
    }
    ff_floats_free(a), ff_floats_free(b), ff_floats_free(c);
    return 2.0 * m * n * k / ff_median(t, 7);
}

typedef struct {
    double step_ms, wait_ms, gemm_s, gemm_flops;
    double mib[FF_NGROUPS][FF_NCOLL];
} result;

static void run(ff_grid *grid, const options *o, int overlaps, result *res, int trace_last)
{
    ff_ctx *ctx = ff_grid_ctx(grid);
    int rank = ff_ctx_rank(ctx);
    ff_dims g = ff_grid_shape(grid);
    ff_linear_opts lo;
    ff_linear_opts_default(&lo);
    lo.oar = lo.ors = lo.oag = overlaps;
    lo.ag_cache_layers = overlaps ? -1 : 0;
    ff_linear_seq *s;
    if (ff_linear_seq_create(grid, &lo, &s))
        die(rank, ff_ctx_error(ctx));
    ff_linear *l[2];
    float *w[2], *dw[2], *b[2], *db[2], *act[3], *dact[3];
    long rows = o->rows / (g.z * g.d);
    for (int i = 0; i < o->layers; i++) {
        ff_linear_desc d = {i ? "T" : "N",
                            i ? FF_LINEAR_T : FF_LINEAR_N,
                            i ? o->n : o->k,
                            i ? o->k : o->n,
                            1,
                            FF_WEIGHT_KN,
                            NULL,
                            (uint32_t)i};
        if (ff_linear_add(s, &d, &l[i]))
            die(rank, ff_ctx_error(ctx));
        ff_linear_sizes z = ff_linear_local_sizes(l[i]);
        w[i] = calloc(z.w_shard, 4), dw[i] = calloc(z.w_shard, 4);
        b[i] = calloc(z.bias, 4), db[i] = calloc(z.bias, 4);
        ff_linear_bind(l[i], w[i], b[i], dw[i], db[i]);
        ff_linear_init(l[i], 7, 0.02f);
        if (i == 0) {
            act[0] = calloc((size_t)(rows * z.in_local), 4);
            dact[0] = calloc((size_t)(rows * z.in_local), 4);
        }
        act[i + 1] = calloc((size_t)(rows * z.out_local), 4);
        dact[i + 1] = calloc((size_t)(rows * z.out_local), 4);
        for (long e = 0; e < rows * z.in_local; e++)
            act[i][e] = (float)((e * 7) % 13) * 0.01f;
        for (long e = 0; e < rows * z.out_local; e++)
            dact[i + 1][e] = (float)((e * 5) % 11) * 0.01f;
    }
    if (ff_linear_seq_program_standard(s, 0))
        die(rank, ff_ctx_error(ctx));
    int reps = (int)o->reps;
    double *step = calloc((size_t)reps, sizeof(double)), *wait = calloc((size_t)reps, 8);
    double *gs = calloc((size_t)reps, 8);
    ff_gemm *gm = ff_linear_seq_gemm(s);
    for (int r = -1; r < reps; r++) {
        for (int k = 0; k < FF_NGROUPS; k++)
            ff_group_counters_reset(ff_grid_group(grid, (ff_group_kind)k));
        ff_gemm_totals_reset(gm);
        if (trace_last && r == reps - 1)
            ff_trace_enable(ctx);
        MPI_Barrier(MPI_COMM_WORLD);
        double t0 = now();
        int rc = ff_linear_seq_begin(s);
        for (int i = 0; i < o->layers && !rc; i++)
            rc = ff_linear_forward(l[i], act[i + 1], act[i], rows);
        for (int i = (int)o->layers - 1; i >= 0 && !rc; i--)
            rc = ff_linear_backward(l[i], dact[i], dact[i + 1], act[i], rows);
        if (!rc)
            rc = ff_linear_seq_end(s);
        if (!rc)
            rc = ff_linear_seq_allreduce_grads(s);
        double t = now() - t0;
        if (rc)
            die(rank, ff_ctx_error(ctx));
        if (r < 0)
            continue;
        double wt = 0;
        for (int k = 0; k < FF_NGROUPS; k++)
            for (int c = 0; c < FF_NCOLL; c++) {
                ff_counters cn = ff_group_counters(ff_grid_group(grid, (ff_group_kind)k), c);
                wt += cn.wait_s;
                res->mib[k][c] = cn.bytes_recv / 1048576.0;
            }
        step[r] = t;
        wait[r] = wt;
        ff_gemm_totals(gm, &res->gemm_flops, &gs[r]);
    }
    MPI_Allreduce(MPI_IN_PLACE, step, reps, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    MPI_Allreduce(MPI_IN_PLACE, wait, reps, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    res->step_ms = 1e3 * ff_median(step, reps);
    res->wait_ms = 1e3 * ff_median(wait, reps);
    /* the slowest rank's GEMM time and rate */
    double my_s = ff_median(gs, reps), my_rate = res->gemm_flops / my_s, min_rate;
    MPI_Allreduce(&my_s, &res->gemm_s, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    MPI_Allreduce(&my_rate, &min_rate, 1, MPI_DOUBLE, MPI_MIN, MPI_COMM_WORLD);
    res->gemm_flops = min_rate; /* from here on: the rate */
    if (rank == 0 && overlaps) {
        printf("GEMM modes chosen on rank 0 (timed once per shape on first use):\n");
        ff_gemm_report(gm, stdout);
    }
    free(step), free(wait), free(gs);
    for (int i = 0; i < o->layers; i++)
        free(w[i]), free(dw[i]), free(b[i]), free(db[i]);
    for (int i = 0; i <= o->layers; i++)
        free(act[i]), free(dact[i]);
    ff_linear_seq_destroy(s);
}

int main(int argc, char **argv)
{
    int provided;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
    int rank, size;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    options o = {NULL, NULL, "", 2048, 2048, 4096, 1, 5};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!v)
            die(rank, "every option takes a value");
        if (!strcmp(a, "--grid"))
            o.grid = v;
        else if (!strcmp(a, "--trace"))
            o.trace = v;
        else if (!strcmp(a, "--label"))
            o.label = v;
        else if (!strcmp(a, "--k"))
            o.k = atol(v);
        else if (!strcmp(a, "--n"))
            o.n = atol(v);
        else if (!strcmp(a, "--rows"))
            o.rows = atol(v);
        else if (!strcmp(a, "--layers"))
            o.layers = atol(v);
        else if (!strcmp(a, "--reps"))
            o.reps = atol(v);
        else
            die(rank, "unknown option (see the comment at the top of bench/linear.c)");
        i++;
    }
    if (o.layers < 1 || o.layers > 2 || o.reps < 1 || o.k < 1 || o.n < 1 || o.rows < 1)
        die(rank, "bad --layers, --reps or size");
    ff_blas_set_threads(1);
    ff_ctx *ctx;
    ff_ctx_options co;
    ff_ctx_options_default(&co);
    if (ff_ctx_create(&ctx, MPI_COMM_WORLD, &co))
        die(rank, ff_ctx_error(ctx));
    ff_dims shape;
    char err[256];
    if (ff_grid_parse(o.grid ? o.grid : "serial", size, size, &shape, err, sizeof err))
        die(rank, err);
    ff_grid *grid;
    if (ff_grid_create(ctx, shape, &grid))
        die(rank, ff_ctx_error(ctx));
    if (o.rows % (shape.z * shape.d))
        die(rank, "--rows must be divisible by Gz*Gd");
    long m = o.rows / (shape.z * shape.d);
    /* measured before and after, the higher counts: the machine is shared */
    double rate = sgemm_rate(m, o.n / shape.x, o.k / shape.y);
    result off, on;
    memset(&off, 0, sizeof off), memset(&on, 0, sizeof on);
    run(grid, &o, 0, &off, 0);
    run(grid, &o, 1, &on, o.trace != NULL);
    double rate2 = sgemm_rate(m, o.n / shape.x, o.k / shape.y);
    if (rate2 > rate)
        rate = rate2;
    if (o.trace) {
        char label[64];
        snprintf(label, sizeof label, "rank %d", rank);
        ff_trace_set_label(ctx, label);
        if (ff_trace_write(ctx, o.trace))
            die(rank, ff_ctx_error(ctx));
    }
    double compute = 1e3 * off.gemm_s;
    double hidden =
        (off.step_ms - compute) > 0 ? 1 - (on.step_ms - compute) / (off.step_ms - compute) : 0;
    if (rank == 0) {
        char g[32];
        snprintf(g, sizeof g, "%dx%dx%dx%d", shape.x, shape.y, shape.z, shape.d);
        printf("# %s: %ld layer(s), k=%ld n=%ld rows=%ld, %d ranks, OpenBLAS %s, sgemm rate "
               "%.1f GFLOP/s per rank (forward shape %ldx%ldx%ld, all ranks at once)\n",
               o.label, o.layers, o.k, o.n, o.rows, size, ff_blas_core(), rate / 1e9, m,
               o.n / shape.x, o.k / shape.y);
        printf("%-9s %-8s %9s %9s %9s %8s", "grid", "overlaps", "step ms", "wait ms", "gemm ms",
               "gemm/peak");
        static const char *const grp[] = {"X", "Y", "Z", "D", "ZD"};
        static const char *const col[] = {"AG", "RS", "AR", "A2A"};
        for (int k = 0; k < 5; k++)
            for (int c = 0; c < 3; c++)
                if (off.mib[k][c] > 0 || on.mib[k][c] > 0)
                    printf(" %5s_%-3s", col[c], grp[k]);
        printf("  (MiB received per rank)\n");
        for (int pass = 0; pass < 2; pass++) {
            result *r = pass ? &on : &off;
            printf("%-9s %-8s %9.1f %9.1f %9.1f %8.2f", g, pass ? "on" : "off", r->step_ms,
                   r->wait_ms, 1e3 * r->gemm_s, r->gemm_flops / rate);
            for (int k = 0; k < 5; k++)
                for (int c = 0; c < 3; c++)
                    if (off.mib[k][c] > 0 || on.mib[k][c] > 0)
                        printf(" %9.1f", r->mib[k][c]);
            printf("\n");
        }
        if (off.step_ms - compute > 0.05 * off.step_ms)
            printf("hidden by overlaps: %.2f of the exposed communication\n", hidden);
        else
            printf("hidden by overlaps: n/a (communication exposed without overlaps is under 5%% "
                   "of the step)\n");
        printf("{\"bench\":\"linear\",\"label\":\"%s\",\"grid\":\"%s\",\"ranks\":%d,\"layers\":%ld,"
               "\"k\":%ld,\"n\":%ld,\"rows\":%ld,\"core\":\"%s\",\"sgemm_gflops\":%.2f,"
               "\"off\":{\"step_ms\":%.2f,\"wait_ms\":%.2f,\"gemm_ms\":%.2f,\"gemm_frac\":%.3f},"
               "\"on\":{\"step_ms\":%.2f,\"wait_ms\":%.2f,\"gemm_ms\":%.2f,\"gemm_frac\":%.3f},"
               "\"hidden\":%.3f}\n",
               o.label, g, size, o.layers, o.k, o.n, o.rows, ff_blas_core(), rate / 1e9,
               off.step_ms, off.wait_ms, 1e3 * off.gemm_s, off.gemm_flops / rate, on.step_ms,
               on.wait_ms, 1e3 * on.gemm_s, on.gemm_flops / rate, hidden);
    }
    ff_grid_destroy(grid);
    ff_ctx_destroy(ctx);
    MPI_Finalize();
    return 0;
}
