/* Threads change no bit (issue 33): the same short training run (three
 * AdamW steps of two micro-batches, then an evaluation) with 1, 2 and 4
 * compute threads per rank (ff_ctx_options.threads: the BLAS's and the
 * element-wise work's) gives bitwise identical losses, gradient norms,
 * parameters, gradients, AdamW moments and evaluation loss. The model has
 * rows enough for several LayerNorm blocks and several threads' ranges in
 * every pass, more heads than threads, and a vocabulary split over X.
 * The OpenBLAS loaded must run its threads as expected (openmp, pthreads,
 * or any), and the team that ran the passes (ff_ctx_team) must follow it:
 * OpenMP's threads in a build with OpenMP unless the BLAS has pthreads of
 * its own, else threads of its own.
 *   mpirun -np 2 test_threads openmp|pthreads|any   (grid 2x1x1x1) */
#include <mpi.h>
#include <stdlib.h>
#include <string.h>

#include "fourfold/fourfold.h"
#include "fourfold/gpt.h"
#include "test_util.h"

enum { STEPS = 3, MICRO = 2, B = 8, T = 16, NRUNS = 3 };

typedef struct {
    float loss[STEPS], norm[STEPS], eval;
    float *buf[4]; /* params, grads, m, v: canonical, rank 0 */
} run_result;

static const char *expected_team;

#ifdef FF_TEST_OPENMP
enum { BUILT_WITH_OPENMP = 1 };
#else
enum { BUILT_WITH_OPENMP = 0 };
#endif

static int run(int threads, run_result *res)
{
    ff_ctx_options o;
    ff_ctx_options_default(&o);
    o.threads = threads;
    ff_ctx *ctx;
    ff_grid *grid = NULL;
    ff_gpt *g = NULL;
    const ff_gpt_config cfg = {.L = 2, .C = 64, .NH = 4, .V = 300, .Vp = 0, .maxT = T};
    int rc = ff_ctx_create(&ctx, MPI_COMM_WORLD, &o);
    if (rc == FF_OK)
        rc = ff_grid_create(ctx, (ff_dims){2, 1, 1, 1}, &grid);
    if (rc == FF_OK)
        rc = ff_gpt_create(grid, &cfg, NULL, B, T, &g);
    if (rc == FF_OK)
        rc = ff_gpt_init(g, 11);
    CHECK(rc == FF_OK, "%d threads, set-up: %s", threads, ff_ctx_error(ctx));
    CHECK(rc != FF_OK || ff_ctx_threads(ctx) == threads, "ff_ctx_threads %d, want %d",
          ff_ctx_threads(ctx), threads);
    CHECK(rc != FF_OK || !strcmp(ff_ctx_team(ctx), expected_team),
          "the passes ran on %s (the BLAS's threads: %s), expected %s", ff_ctx_team(ctx),
          ff_blas_threading(), expected_team);
    if (rc == FF_OK) {
        int first, count;
        ff_gpt_local_sequences(g, &first, &count);
        size_t n = (size_t)STEPS * MICRO * count * T;
        int32_t *tok = malloc(n * sizeof *tok), *tgt = malloc(n * sizeof *tgt);
        for (size_t i = 0; i < n; i++) /* a fixed pseudo-random stream */
            tok[i] = (int32_t)((i * 2654435761u) % 300), tgt[i] = (int32_t)((i * 40503u + 7) % 300);
        ff_adamw h;
        ff_adamw_default(&h);
        h.lr = 3e-3f;
        h.steps = STEPS;
        for (int s = 0; s < STEPS && rc == FF_OK; s++) {
            size_t off = (size_t)s * MICRO * count * T;
            ff_gpt_step_info info;
            rc = ff_gpt_step(g, tok + off, tgt + off, MICRO, &h, s, &info);
            res->loss[s] = info.loss, res->norm[s] = info.grad_norm;
        }
        if (rc == FF_OK)
            rc = ff_gpt_eval(g, tok, tgt, &res->eval);
        size_t canon = ff_gpt_canonical_size(g);
        for (int k = 0; k < 4 && rc == FF_OK; k++) {
            res->buf[k] = malloc(canon * sizeof(float));
            rc = ff_gpt_gather(g, (ff_gpt_buffer)k, res->buf[k], 0);
        }
        CHECK(rc == FF_OK, "%d threads: %s", threads, ff_ctx_error(ctx));
        free(tok);
        free(tgt);
    }
    size_t canon = g ? ff_gpt_canonical_size(g) : 0;
    ff_gpt_destroy(g);
    ff_grid_destroy(grid);
    ff_ctx_destroy(ctx);
    return rc == FF_OK ? (int)canon : -1;
}

int main(int argc, char **argv)
{
    int provided;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
    int rank, size;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (size != 2 || argc != 2) {
        if (rank == 0)
            fprintf(stderr, "usage: mpirun -np 2 test_threads openmp|pthreads|any\n");
        MPI_Finalize();
        return 2;
    }
    const char *blas = ff_blas_threading();
    CHECK(!strcmp(argv[1], "any") || !strcmp(argv[1], blas), "the BLAS runs on %s, expected %s",
          blas, argv[1]);
    expected_team = BUILT_WITH_OPENMP && strcmp(blas, "pthreads") ? "openmp" : "own threads";
    const int threads[NRUNS] = {1, 2, 4};
    run_result r[NRUNS];
    memset(r, 0, sizeof r);
    int canon = 0;
    for (int i = 0; i < NRUNS; i++)
        canon = run(threads[i], &r[i]);
    const char *names[4] = {"parameters", "gradients", "AdamW m", "AdamW v"};
    for (int i = 1; i < NRUNS && canon > 0 && rank == 0; i++) {
        CHECK(!memcmp(r[i].loss, r[0].loss, sizeof r[0].loss), "%d threads: losses differ",
              threads[i]);
        CHECK(!memcmp(r[i].norm, r[0].norm, sizeof r[0].norm), "%d threads: norms differ",
              threads[i]);
        CHECK(r[i].eval == r[0].eval, "%d threads: evaluation %.9g, 1 thread %.9g", threads[i],
              r[i].eval, r[0].eval);
        for (int k = 0; k < 4; k++) {
            size_t bad = 0;
            for (int e = 0; e < canon; e++)
                bad += memcmp(&r[i].buf[k][e], &r[0].buf[k][e], sizeof(float)) != 0;
            CHECK(bad == 0, "%d threads: %zu of %d %s differ from 1 thread's", threads[i], bad,
                  canon, names[k]);
        }
    }
    if (rank == 0 && canon > 0)
        printf("grid 2x1x1x1, 1, 2, 4 threads per rank (BLAS %s, passes on %s), tolerance 0 (bit "
               "for bit): losses %.7f %.7f %.7f, eval %.7f; %d canonical elements of 4 buffers "
               "compared\n",
               blas, expected_team, r[0].loss[0], r[0].loss[1], r[0].loss[2], r[0].eval, canon);
    for (int i = 0; i < NRUNS; i++)
        for (int k = 0; k < 4; k++)
            free(r[i].buf[k]);
    int code = test_finish("threads");
    MPI_Finalize();
    return code;
}
