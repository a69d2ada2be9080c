/* What threads change (issue 33, issue 48), with 1, 2, 3 and 4 compute
 * threads per rank, on the same short training run (three AdamW steps of
 * two micro-batches, then an evaluation):
 *  - the element-wise work (ff_ctx_options.threads, the BLAS kept on one
 *    thread: blas_threads 1): bitwise identical losses, gradient norms,
 *    parameters, gradients, AdamW moments and evaluation loss. This holds
 *    by design: every pass splits its indices into ranges fixed by the
 *    index and thread counts, and sums over indices run in fixed blocks;
 *  - the products too (the BLAS on as many threads): OpenBLAS's threaded
 *    sgemm splits a product by the thread count, and some of its kernels
 *    (Haswell's) then add in another order, so the runs are held to the
 *    bound of another order of the sums (test_pipeline.c's: 2 (4L + 4)
 *    gamma_K, K the longest sum; losses within 1e-5 relative, as another
 *    grid's), and the test prints whether they happened to be bitwise equal
 *    on this machine's kernels.
 * The model has rows enough for several LayerNorm blocks and several
 * threads' ranges in every pass, more heads than threads, and a vocabulary
 * split over X. AdamW runs with eps = 1, where an update is Lipschitz in
 * the gradient (tests/test_gpt.c). The OpenBLAS loaded must run its threads
 * as expected (openmp, pthreads, or any), and the team that ran the passes
 * (ff_ctx_team) must follow it: OpenMP's threads in a build with OpenMP
 * unless the BLAS has pthreads of its own, else threads of its own.
 *   mpirun -np 2 test_threads openmp|pthreads|any   (grid 2x1x1x1) */
#include <math.h>
#include <mpi.h>
#include <stdlib.h>
#include <string.h>

#include "fourfold/fourfold.h"
#include "fourfold/gpt.h"
#include "test_util.h"

enum { STEPS = 3, MICRO = 2, B = 8, T = 16, NRUNS = 4, L = 2, C = 64, V = 300 };

typedef struct {
    float loss[STEPS], norm[STEPS], eval;
    float *buf[4]; /* params, grads, m, v: canonical, rank 0 */
    float *init;   /* params before the steps */
} run_result;

static const char *expected_team;
/* "bf16-mixed" as the optional second argument: every run in bf16-mixed,
 * products emulated (attention's rounded operands on each thread's scratch) */
static int mixed;

#ifdef FF_TEST_OPENMP
enum { BUILT_WITH_OPENMP = 1 };
#else
enum { BUILT_WITH_OPENMP = 0 };
#endif

static int run(int threads, int blas_threads, run_result *res)
{
    ff_ctx_options o;
    ff_ctx_options_default(&o);
    o.threads = threads;
    o.blas_threads = blas_threads;
    ff_ctx *ctx;
    ff_grid *grid = NULL;
    ff_gpt *g = NULL;
    const ff_gpt_config cfg = {.L = L, .C = C, .NH = 4, .V = V, .Vp = 0, .maxT = T};
    int rc = ff_ctx_create(&ctx, MPI_COMM_WORLD, &o);
    if (rc == FF_OK)
        rc = ff_grid_create(ctx, (ff_dims){2, 1, 1, 1}, &grid);
    if (rc == FF_OK) {
        ff_gpt_opts go;
        ff_gpt_opts_default(&go);
        if (mixed)
            go.precision = FF_PRECISION_BF16_MIXED, go.bf16_products = FF_BF16_PRODUCTS_EMULATED;
        rc = ff_gpt_create(grid, &cfg, &go, B, T, &g);
    }
    if (rc == FF_OK)
        rc = ff_gpt_init(g, 11);
    if (rc == FF_OK) {
        res->init = malloc(ff_gpt_canonical_size(g) * sizeof(float));
        rc = ff_gpt_gather(g, FF_GPT_PARAMS, res->init, 0);
    }
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
        h.eps = 1.0f;
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
    mixed = argc == 3 && !strcmp(argv[2], "bf16-mixed");
    if (size != 2 || (argc != 2 && !mixed)) {
        if (rank == 0)
            fprintf(stderr, "usage: mpirun -np 2 test_threads openmp|pthreads|any [bf16-mixed]\n");
        MPI_Finalize();
        return 2;
    }
    const char *blas = ff_blas_threading();
    CHECK(!strcmp(argv[1], "any") || !strcmp(argv[1], blas), "the BLAS runs on %s, expected %s",
          blas, argv[1]);
    expected_team = BUILT_WITH_OPENMP && strcmp(blas, "pthreads") ? "openmp" : "own threads";
    const int threads[NRUNS] = {1, 2, 3, 4};
    const char *names[4] = {"parameters", "gradients", "AdamW m", "AdamW v"};
    run_result one, r[NRUNS];
    memset(&one, 0, sizeof one);
    memset(r, 0, sizeof r);
    int canon = run(1, 1, &one);
    /* the element-wise work on 1-4 threads, the BLAS on one: bit for bit */
    for (int i = 1; i < NRUNS && canon > 0; i++) {
        run_result x;
        memset(&x, 0, sizeof x);
        if (run(threads[i], 1, &x) > 0 && rank == 0) {
            CHECK(!memcmp(x.loss, one.loss, sizeof one.loss), "%d threads: losses differ",
                  threads[i]);
            CHECK(!memcmp(x.norm, one.norm, sizeof one.norm), "%d threads: norms differ",
                  threads[i]);
            CHECK(x.eval == one.eval, "%d threads: evaluation %.9g, 1 thread %.9g", threads[i],
                  x.eval, one.eval);
            for (int k = 0; k < 4; k++) {
                size_t bad = 0;
                for (int e = 0; e < canon; e++)
                    bad += memcmp(&x.buf[k][e], &one.buf[k][e], sizeof(float)) != 0;
                CHECK(bad == 0, "%d threads (the BLAS on 1): %zu of %d %s differ from 1 thread's",
                      threads[i], bad, canon, names[k]);
            }
        }
        for (int k = 0; k < 4; k++)
            free(x.buf[k]);
        free(x.init);
    }
    if (rank == 0 && canon > 0)
        printf("grid 2x1x1x1, the passes on 1, 2, 3, 4 threads per rank (on %s), the BLAS (%s) on "
               "1, tolerance 0 (bit for bit): losses %.7f %.7f %.7f, eval %.7f; %d canonical "
               "elements of 4 buffers compared\n",
               expected_team, blas, one.loss[0], one.loss[1], one.loss[2], one.eval, canon);
    /* the BLAS on as many threads: within the bound of another order (fp32
     * only: in bf16-mixed another order may round an operand to the other
     * bf16 neighbour, which gpt_bf16_np8's bound covers) */
    double K = (double)MICRO * B * T, u = ldexp(1.0, -24);
    K = K > 4.0 * C ? K : 4.0 * C;
    K = K > V ? K : V;
    const double tol = 2.0 * (4 * L + 4) * (K * u / (1 - K * u));
    for (int i = 1; i < NRUNS && canon > 0 && !mixed; i++) {
        if (run(threads[i], threads[i], &r[i]) <= 0 || rank != 0)
            continue;
        double worst = 0, wl = 0;
        size_t differ = 0;
        for (int s = 0; s < STEPS; s++)
            wl = fmax(wl, fabs((double)r[i].loss[s] - one.loss[s]) / fabs(one.loss[s]));
        wl = fmax(wl, fabs((double)r[i].eval - one.eval) / fabs(one.eval));
        for (int k = 0; k < 4; k++) {
            double num = 0, den = 0;
            for (int e = 0; e < canon; e++) {
                differ += memcmp(&r[i].buf[k][e], &one.buf[k][e], sizeof(float)) != 0;
                num = fmax(num, fabs((double)r[i].buf[k][e] - one.buf[k][e]));
                /* parameters: against the change from the initial values */
                den = fmax(den, fabs((double)one.buf[k][e] - (k == 0 ? one.init[e] : 0.0)));
            }
            double err = den > 0 ? num / den : num;
            worst = fmax(worst, err / tol);
            CHECK(err <= tol, "%d threads (the BLAS too): %s error %.3e, bound %.3e", threads[i],
                  names[k], err, tol);
        }
        CHECK(wl <= 1e-5, "%d threads (the BLAS too): losses %.3e apart (tolerance 1e-5)",
              threads[i], wl);
        printf("the passes and the BLAS (%s kernels) on %d threads: losses %.1e apart (tol 1e-5), "
               "worst error/bound %.3f (bound %.2e); %zu of %d elements %s\n",
               ff_blas_core(), threads[i], wl, worst, tol, differ, 4 * canon,
               differ ? "differ from 1 thread's bits"
                      : "differ: the products were bitwise "
                        "invariant on these kernels");
    }
    for (int i = 0; i < NRUNS; i++) {
        for (int k = 0; k < 4; k++)
            free(r[i].buf[k]);
        free(r[i].init);
    }
    for (int k = 0; k < 4; k++)
        free(one.buf[k]);
    free(one.init);
    int code = test_finish("threads");
    MPI_Finalize();
    return code;
}
