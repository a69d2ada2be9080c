/* Local products: every mode the tuner may pick (operands transposed
 * explicitly first) must give exactly the direct call's result, for all four
 * transpose combinations, beta 0 and 1, shapes that do not fill a panel and
 * shapes split into several panels of 96 rows; the panelled product must agree with one
 * unpanelled sgemm to within fp32 summation error (gamma_k * sum|terms|); the
 * transposed product (which rounds differently) likewise. And the tuner must
 * pick one of the candidates it timed and report it. */
#include <cblas.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "test_util.h"

static float *rnd(size_t n, uint32_t stream)
{
    float *p = malloc(n * sizeof(float) + 4);
    for (size_t i = 0; i < n; i++)
        p[i] = (float)(2 * ff_rng_uniform(9, stream, i) - 1);
    return p;
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    ff_ctx *ctx;
    ff_ctx_create(&ctx, MPI_COMM_WORLD, NULL);
    ff_gemm *g;
    ff_gemm_create(ctx, FF_GEMM_TUNE_ALL, &g);
    /* small panels, so the larger shapes are cut into several */
    ff_gemm_set_panel_rows(g, 96);
    const int64_t shapes[][3] = {{1, 1, 1},      {7, 5, 3},       {33, 17, 29},    {64, 96, 48},
                                 {130, 70, 100}, {700, 300, 150}, {1200, 257, 131}};
    double worst = 0;
    int checked = 0;
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
        int64_t m = shapes[si][0], n = shapes[si][1], k = shapes[si][2];
        for (int ta = 0; ta < 2; ta++)
            for (int tb = 0; tb < 2; tb++)
                for (int bi = 0; bi < 2; bi++) {
                    float beta = (float)bi;
                    int64_t lda = ta ? m : k, ldb = tb ? k : n;
                    float *a = rnd((size_t)(m * k), 1), *b = rnd((size_t)(k * n), 2);
                    float *c0 = rnd((size_t)(m * n), 3), *c = malloc((size_t)(m * n) * 4);
                    float *whole = malloc((size_t)(m * n) * 4);
                    float *c_init = rnd((size_t)(m * n), 3);
                    ff_gemm_force_mode(g, FF_GEMM_MODE_DIRECT);
                    ff_gemm_run(g, "direct", ta, tb, m, n, k, 1.0f, a, lda, b, ldb, beta, c0, n);
                    for (int mode = 1; mode < FF_GEMM_NMODES; mode++) {
                        memcpy(c, c_init, (size_t)(m * n) * 4);
                        ff_gemm_force_mode(g, mode);
                        ff_gemm_run(g, "mode", ta, tb, m, n, k, 1.0f, a, lda, b, ldb, beta, c, n);
                        if (mode != FF_GEMM_MODE_TPROD)
                            CHECK(!memcmp(c, c0, (size_t)(m * n) * 4),
                                  "%lldx%lldx%lld tA=%d tB=%d beta=%g: mode %s differs from "
                                  "the direct call",
                                  (long long)m, (long long)n, (long long)k, ta, tb, beta,
                                  ff_gemm_mode_name(mode));
                        else
                            memcpy(whole, c, (size_t)(m * n) * 4);
                    }
                    /* panelled (c0) and transposed product (whole) against one
                     * plain sgemm call, within gamma_{k+2} sum|terms| */
                    memcpy(c, c_init, (size_t)(m * n) * 4);
                    cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans,
                                tb ? CblasTrans : CblasNoTrans, (int)m, (int)n, (int)k, 1.0f, a,
                                (int)lda, b, (int)ldb, beta, c, (int)n);
                    double u = 1.0 / 16777216.0, gam = (k + 2) * u / (1 - (k + 2) * u);
                    for (int64_t i = 0; i < m; i++)
                        for (int64_t j = 0; j < n; j++) {
                            double s = beta * fabs(c_init[i * n + j]);
                            for (int64_t p = 0; p < k; p++)
                                s += fabs((double)(ta ? a[p * lda + i] : a[i * lda + p]) *
                                          (tb ? b[j * ldb + p] : b[p * ldb + j]));
                            /* both differ from the exact value by at most gam*s */
                            double bound = 2 * gam * s;
                            double e1 = fabs((double)c0[i * n + j] - c[i * n + j]);
                            double e2 = fabs((double)whole[i * n + j] - c[i * n + j]);
                            double r = (e1 > e2 ? e1 : e2) / (bound > 0 ? bound : 1e-300);
                            if (r > worst)
                                worst = r;
                            checked++;
                        }
                    free(a), free(b), free(c0), free(c), free(whole), free(c_init);
                }
    }
    CHECK(worst <= 1.0, "panelled or transposed product off by %.2f x the fp32 bound", worst);

    /* production panel heights (by shape) and inner sizes beyond OpenBLAS's
     * k blocking: the modes must still agree bit for bit */
    ff_gemm *d;
    ff_gemm_create(ctx, FF_GEMM_TUNE_LAYOUTS, &d);
    const int64_t big[][3] = {{900, 400, 600}, {200, 64, 1100}, {96, 100, 700}, {520, 96, 2048}};
    for (size_t si = 0; si < sizeof big / sizeof big[0]; si++) {
        int64_t m = big[si][0], n = big[si][1], k = big[si][2];
        for (int ta = 0; ta < 2; ta++)
            for (int tb = 0; tb < 2; tb++)
                for (int bi = 0; bi < 2; bi++) {
                    int64_t lda = ta ? m : k, ldb = tb ? k : n;
                    float *a = rnd((size_t)(m * k), 6), *b = rnd((size_t)(k * n), 7);
                    float *c0 = rnd((size_t)(m * n), 8), *c = rnd((size_t)(m * n), 8);
                    ff_gemm_force_mode(d, FF_GEMM_MODE_DIRECT);
                    ff_gemm_run(d, "direct", ta, tb, m, n, k, 1.0f, a, lda, b, ldb, (float)bi, c0,
                                n);
                    for (int mode = 1; mode < 4; mode++) {
                        float *ci = rnd((size_t)(m * n), 8);
                        ff_gemm_force_mode(d, mode);
                        ff_gemm_run(d, "mode", ta, tb, m, n, k, 1.0f, a, lda, b, ldb, (float)bi, ci,
                                    n);
                        CHECK(!memcmp(ci, c0, (size_t)(m * n) * 4),
                              "%lldx%lldx%lld tA=%d tB=%d beta=%d (panels of %lld rows): mode %s "
                              "differs from the direct call",
                              (long long)m, (long long)n, (long long)k, ta, tb, bi,
                              (long long)ff_gemm_panel_rows(m, n, k), ff_gemm_mode_name(mode));
                        free(ci);
                    }
                    free(a), free(b), free(c0), free(c);
                }
    }
    ff_gemm_destroy(d);
    printf("modes bitwise identical on %s; panelled/transposed vs one sgemm: worst %.3f of "
           "the bound over %d elements (panels of 96 rows)\n",
           openblas_get_corename(), worst, checked);

    /* tuning: a fresh tuner picks some candidate and reports it */
    ff_gemm *t;
    ff_gemm_create(ctx, FF_GEMM_TUNE_LAYOUTS, &t);
    float *a = rnd(300 * 200, 4), *b = rnd(200 * 100, 5), *c = calloc(300 * 100, 4);
    ff_gemm_run(t, "tuned", 1, 0, 300, 100, 200, 1.0f, a, 300, b, 100, 0.0f, c, 100);
    ff_gemm_run(t, "tuned", 1, 0, 300, 100, 200, 1.0f, a, 300, b, 100, 0.0f, c, 100);
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    ff_gemm_report(t, f);
    fclose(f);
    printf("%s", text);
    CHECK(strstr(text, "tuned") && strstr(text, "     2  "), "tuning report:\n%s", text);
    double flops, secs;
    ff_gemm_totals(t, &flops, &secs);
    CHECK(flops == 2 * 2.0 * 300 * 100 * 200, "flop count %g", flops);
    free(text), free(a), free(b), free(c);
    ff_gemm_destroy(t);
    ff_gemm_destroy(g);
    ff_ctx_destroy(ctx);
    int code = test_finish("test_gemm");
    MPI_Finalize();
    return code;
}
