/* The two facts behind decomposition's design (docs/linear.md,
 * "Decomposition"), measured:
 *
 *   ff_bench_decompose_facts rows
 *       A product computed in row pieces against the whole product, both
 *       through cblas_sgemm: how many elements differ, for pieces cut at
 *       rows*i/k. OpenBLAS picks kernels by shape (and by
 *       OPENBLAS_CORETYPE), so a shorter call may round differently; this
 *       is why chunks are cut at GEMM panel boundaries. One rank.
 *
 *   mpirun -np 2 ff_bench_decompose_facts progress
 *       A 16 MiB all-reduce posted before a 1024x1024x1024 GEMM computed in
 *       1 or 8 panels (ff_gemm_run, default progress mode: ff_poll between
 *       panels), then waited: the wait left after the GEMM, against the
 *       all-reduce alone; medians of 3. A GEMM of one panel gives the
 *       collective in flight no progress call. */
#include <cblas.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fourfold/fourfold.h"

static float *filled(size_t n, unsigned seed)
{
    float *p = malloc(n * sizeof(float));
    for (size_t i = 0; p && i < n; i++) {
        seed = seed * 1103515245u + 12345u;
        p[i] = (float)((seed >> 8) & 0xffff) / 65536.0f - 0.5f;
    }
    return p;
}

/* C (m x n) = A (m x k) op(B), row-major; op(B) = B (k x n) or, with tb,
 * B^T for B stored n x k. */
static void product(int tb, int m, int n, int k, const float *a, const float *b, float *c)
{
    cblas_sgemm(CblasRowMajor, CblasNoTrans, tb ? CblasTrans : CblasNoTrans, m, n, k, 1.0f, a, k, b,
                tb ? k : n, 0.0f, c, n);
}

static int rows(void)
{
    static const int shapes[][3] = {{256, 64, 64}, {256, 192, 64}, {64, 64, 64}, {512, 256, 256}};
    printf("OpenBLAS core %s: elements of C = A op(B) that differ when its rows are computed in "
           "k pieces [m i/k, m (i+1)/k)\n",
           openblas_get_corename());
    printf("%5s %5s %5s %3s %8s %8s %8s\n", "m", "n", "k", "op", "k=2", "k=3", "k=4");
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
        for (int tb = 0; tb < 2; tb++) {
            int m = shapes[s][0], n = shapes[s][1], k = shapes[s][2];
            float *a = filled((size_t)m * k, 1), *b = filled((size_t)k * n, 2);
            float *whole = malloc((size_t)m * n * sizeof(float));
            float *cut = malloc((size_t)m * n * sizeof(float));
            if (!a || !b || !whole || !cut)
                return 1;
            product(tb, m, n, k, a, b, whole);
            printf("%5d %5d %5d %3s", m, n, k, tb ? "NT" : "NN");
            for (int pieces = 2; pieces <= 4; pieces++) {
                for (int i = 0; i < pieces; i++) {
                    int r0 = m * i / pieces, r1 = m * (i + 1) / pieces;
                    product(tb, r1 - r0, n, k, a + (size_t)r0 * k, b, cut + (size_t)r0 * n);
                }
                long differ = 0;
                for (size_t e = 0; e < (size_t)m * n; e++)
                    differ += whole[e] != cut[e];
                printf(" %8ld", differ);
            }
            printf("  of %d\n", m * n);
            free(a), free(b), free(whole), free(cut);
        }
    return 0;
}

static int cmp(const void *x, const void *y)
{
    double a = *(const double *)x, b = *(const double *)y;
    return (a > b) - (a < b);
}

static int progress(void)
{
    int rank, size;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    ff_ctx *ctx;
    ff_grid *grid;
    ff_gemm *g;
    if (ff_ctx_create(&ctx, MPI_COMM_WORLD, NULL) ||
        ff_grid_create(ctx, (ff_dims){size, 1, 1, 1}, &grid) ||
        ff_gemm_create(ctx, FF_GEMM_TUNE_OFF, &g))
        return 1;
    ff_group *gx = ff_grid_group(grid, FF_GROUP_X);
    const size_t count = (size_t)1 << 22; /* 16 MiB of floats */
    const int m = 1024, n = 1024, k = 1024;
    float *v = filled(count, 3), *a = filled((size_t)m * k, 4), *b = filled((size_t)k * n, 5);
    float *c = malloc((size_t)m * n * sizeof(float));
    if (!v || !a || !b || !c)
        return 1;
    if (rank == 0)
        printf("%d ranks, progress mode poll: 16 MiB all-reduce posted before a %dx%dx%d GEMM, "
               "medians of 3\n",
               size, m, n, k);
    for (int panels = 1; panels <= 8; panels *= 8) {
        double gemm[3], left[3], alone[3];
        ff_gemm_set_panel_rows(g, m / panels);
        for (int rep = 0; rep < 3; rep++) {
            ff_request *r = NULL;
            MPI_Barrier(MPI_COMM_WORLD);
            double t0 = MPI_Wtime();
            ff_iallreduce(gx, v, v, count, NULL, &r);
            double t1 = MPI_Wtime();
            ff_gemm_run(g, "facts", 0, 0, m, n, k, 1.0f, a, k, b, n, 0.0f, c, n);
            double t2 = MPI_Wtime();
            ff_wait(&r);
            double t3 = MPI_Wtime();
            MPI_Barrier(MPI_COMM_WORLD);
            double u0 = MPI_Wtime();
            ff_allreduce(gx, v, v, count, NULL);
            alone[rep] = MPI_Wtime() - u0;
            gemm[rep] = t2 - t1, left[rep] = t3 - t2;
            (void)t0;
        }
        qsort(gemm, 3, sizeof(double), cmp);
        qsort(left, 3, sizeof(double), cmp);
        qsort(alone, 3, sizeof(double), cmp);
        if (rank == 0)
            printf("  GEMM in %d panel(s): GEMM %.1f ms, wait left after it %.1f ms (all-reduce "
                   "alone %.1f ms)\n",
                   panels, gemm[1] * 1e3, left[1] * 1e3, alone[1] * 1e3);
    }
    free(v), free(a), free(b), free(c);
    ff_gemm_destroy(g);
    ff_grid_destroy(grid);
    ff_ctx_destroy(ctx);
    return 0;
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    int rc = 2;
    if (argc == 2 && !strcmp(argv[1], "rows"))
        rc = rows();
    else if (argc == 2 && !strcmp(argv[1], "progress"))
        rc = progress();
    else
        fprintf(stderr, "usage: ff_bench_decompose_facts rows | progress\n");
    MPI_Finalize();
    return rc;
}
