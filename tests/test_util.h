/* Small helpers shared by the C tests: checks that count failures and print
 * what they compared, and enumeration of grid shapes. */
#ifndef FF_TEST_UTIL_H
#define FF_TEST_UTIL_H

#include <math.h>
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fourfold/fourfold.h"
#include "fourfold/gpt.h"

static int test_failures = 0;

#define CHECK(cond, ...)                                                                           \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            test_failures++;                                                                       \
            fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__);                                   \
            fprintf(stderr, __VA_ARGS__);                                                          \
            fputc('\n', stderr);                                                                   \
        }                                                                                          \
    } while (0)

/* Every (Gx, Gy, Gz, Gd) with product n, in a fixed order. Returns the count;
 * fills at most max shapes. */
static inline int test_all_grids(int n, ff_dims *out, int max)
{
    int k = 0;
    for (int x = 1; x <= n; x++)
        for (int y = 1; x * y <= n; y++)
            for (int z = 1; x * y * z <= n; z++) {
                if (n % (x * y * z))
                    continue;
                int d = n / (x * y * z);
                if (x * y * z * d != n)
                    continue;
                if (k < max)
                    out[k] = (ff_dims){x, y, z, d};
                k++;
            }
    return k;
}

/* bf16-mixed: the bound on the difference of two runs' mean cross-entropy
 * (tests/test_gpt.c's header, "The loss", derives it): 2 max|dz| for the
 * logits' difference, max|dz| <= tol zmax (zmax the largest |logit| of the
 * reference's forward, tol the tensors' relative bound), plus each run's
 * fp32 rounding of its cross-entropy and mean, 2 gamma_K (|loss| + 2 zmax
 * + 1), K the longest of their sums. */
static inline double test_ce_bound(double tol, double K, double zmax, double loss)
{
    const double u = ldexp(1.0, -24), gamma = K * u / (1 - K * u);
    return 2 * tol * zmax + 2 * 2 * gamma * (fabs(loss) + 2 * zmax + 1);
}

/* The largest |logit| (of the V real columns) of n forwards (ff_gpt_eval)
 * of micro-batches of `per` tokens at tok + u per, at g's parameters now;
 * ff_gpt_eval changes no state a step reads. For the model of one rank. */
static inline int test_logit_max(ff_gpt *g, const int32_t *tok, const int32_t *tgt, int n,
                                 size_t per, int V, double *zmax)
{
    *zmax = 0;
    for (int u = 0; u < n; u++) {
        float loss;
        int64_t rows = 0, cols = 0;
        int rc = ff_gpt_eval(g, tok + (size_t)u * per, tgt + (size_t)u * per, &loss);
        const float *z = rc ? NULL : ff_gpt_logits(g, &rows, &cols);
        if (rc)
            return rc;
        for (int64_t i = 0; z && i < rows; i++)
            for (int64_t j = 0; j < cols && j < V; j++)
                *zmax = fmax(*zmax, fabs((double)z[i * cols + j]));
    }
    return FF_OK;
}

/* Sums the failures over all ranks; rank 0 prints the verdict. Returns the
 * process exit code. */
static inline int test_finish(const char *name)
{
    int rank = 0, total = test_failures, init = 0;
    MPI_Initialized(&init);
    if (init) {
        MPI_Comm_rank(MPI_COMM_WORLD, &rank);
        MPI_Allreduce(&test_failures, &total, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    }
    if (rank == 0)
        printf("%s: %s (%d failed checks over all ranks)\n", name, total ? "FAILED" : "passed",
               total);
    return total ? 1 : 0;
}

/* float32's gamma_K = K u / (1 - K u), u = 2^-24 (Higham §3.1): the bound
 * on the relative error of a sum whose terms pass through K roundings. */
static inline double test_gamma(double k)
{
    const double u = 1.0 / 16777216.0;
    return k * u / (1.0 - k * u);
}

/* Zeroed arrays; abort on failure (a test has nothing to fall back to). */
static inline float *test_floats(size_t n)
{
    float *p = (float *)calloc(n ? n : 1, sizeof(float));
    if (!p)
        MPI_Abort(MPI_COMM_WORLD, 3);
    return p;
}

static inline double *test_doubles(size_t n)
{
    double *p = (double *)calloc(n ? n : 1, sizeof(double));
    if (!p)
        MPI_Abort(MPI_COMM_WORLD, 3);
    return p;
}

/* MPI (funneled), then a context on the world and, where self is not NULL,
 * one of one thread on MPI_COMM_SELF for each rank's serial reference runs.
 * Leading arguments "--threads N" (taken off argv) give the world's context
 * N threads for the element-wise work (the BLAS stays on one). Returns the
 * world's threads; aborts on failure. */
static inline int test_mpi_start(int *argc, char ***argv, ff_ctx **world, ff_ctx **self)
{
    int provided, threads = 1;
    MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided);
    if (*argc > 2 && !strcmp((*argv)[1], "--threads")) {
        threads = atoi((*argv)[2]);
        (*argv)[2] = (*argv)[0];
        *argc -= 2, *argv += 2;
    }
    ff_ctx_options o;
    ff_ctx_options_default(&o);
    if (self && ff_ctx_create(self, MPI_COMM_SELF, &o) != FF_OK)
        MPI_Abort(MPI_COMM_WORLD, 1);
    o.threads = threads;
    o.blas_threads = 1;
    if (ff_ctx_create(world, MPI_COMM_WORLD, &o) != FF_OK)
        MPI_Abort(MPI_COMM_WORLD, 1);
    return threads;
}

/* Runs fn(name, grid) on each grid named in argv[1..argc) (GxxGyxGzxGd or
 * a preset; "all" is skipped), or on every grid of the world's size when none
 * is named; a name that does not parse is a failed check. *worst is the
 * test's worst error / bound, which fn raises; after each grid rank 0 prints
 * the grid's worst over all ranks, `what` and its verdict, and *worst
 * becomes the worst over all grids. */
static inline void test_run_grids(int argc, char **argv, ff_ctx *ctx, double *worst,
                                  const char *what, void (*fn)(const char *name, ff_grid *grid))
{
    int size, rank, named = 0;
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    enum { MAX_GRIDS = 128 };
    ff_dims grids[MAX_GRIDS];
    for (int i = 1; i < argc && named < MAX_GRIDS; i++) {
        char err[256];
        if (strcmp(argv[i], "all") &&
            ff_grid_parse(argv[i], size, size, &grids[named++], err, sizeof err) != FF_OK) {
            CHECK(0, "%s", err);
            named--;
        }
    }
    int ng = named ? named : test_all_grids(size, grids, MAX_GRIDS);
    for (int i = 0; i < ng && i < MAX_GRIDS; i++) {
        ff_dims g = grids[i];
        char name[32];
        snprintf(name, sizeof name, "%dx%dx%dx%d", g.x, g.y, g.z, g.d);
        ff_grid *grid;
        if (ff_grid_create(ctx, g, &grid) != FF_OK) {
            CHECK(0, "grid %s: %s", name, ff_ctx_error(ctx));
            continue;
        }
        double before = *worst, w;
        int failures = test_failures, failed;
        *worst = 0;
        fn(name, grid);
        ff_grid_destroy(grid);
        w = *worst;
        failed = test_failures - failures;
        MPI_Allreduce(MPI_IN_PLACE, &w, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
        MPI_Allreduce(MPI_IN_PLACE, &failed, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
        if (rank == 0)
            printf("grid %-9s worst error/bound %.3f; %s  %s\n", name, w, what,
                   failed ? "FAILED" : "ok");
        *worst = w > before ? w : before;
    }
}

/* Replicas: every rank of the world gives a key (which block of data it
 * holds) and its n floats; ranks with the same key must hold the same bits.
 * Compares FNV-1a hashes of the bytes. Returns how many of this rank's
 * replicas differ from it (collective over MPI_COMM_WORLD). */
static inline int test_replicas_differ(int64_t key, const float *a, size_t n)
{
    uint64_t h = 1469598103934665603ull;
    const unsigned char *p = (const unsigned char *)a;
    for (size_t i = 0; i < n * sizeof(float); i++)
        h = (h ^ p[i]) * 1099511628211ull;
    int size, rank, differ = 0;
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    int64_t mine[2] = {key, (int64_t)h}, *all = malloc((size_t)size * sizeof mine);
    if (!all)
        MPI_Abort(MPI_COMM_WORLD, 3);
    MPI_Allgather(mine, 2, MPI_INT64_T, all, 2, MPI_INT64_T, MPI_COMM_WORLD);
    for (int r = 0; r < size; r++)
        differ += r != rank && all[2 * r] == key && all[2 * r + 1] != mine[1];
    free(all);
    return differ;
}

#endif
