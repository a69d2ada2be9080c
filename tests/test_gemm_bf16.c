/* bf16 products on oneDNN (ff_bf16_gemm_run) against the exact product of
 * the bf16-rounded operands, computed here in double: a product of two bf16
 * values is exact in fp32 and in double, so the only error is the fp32 sum's,
 * and each element must be within gamma_{k+2} sum|terms| (the terms including
 * beta C) of the exact value, u = 2^-24; the emulated path (the same rounded
 * operands through ff_gemm_run, i.e. the BLAS) within the same bound, and the
 * two within twice it of each other. All four transpose combinations, alpha
 * 1 and 0.5, beta 0 and 1, a shape of one element, odd shapes, leading
 * dimensions wider than the rows, operands that are not bf16 values (the
 * product must round them to nearest first), and a product of several row
 * panels (transposed and not), whose panel offsets a wrong stride would
 * break. And a panel's rows the same bits inside a larger product and on
 * 2 threads as on 1 (the model's bitwise claims rest on it). Every
 * product also from 2-byte operands (ff_bf16_gemm_run2: both, or A alone,
 * read in place where packed as oneDNN reads them, else copied): the same
 * bits as from the fp32 ones (bf16-mixed keeps its weights and the
 * products' inputs so, docs/design.md §13). Where the
 * build has no oneDNN, creating the handle must fail with
 * FF_EUNSUPPORTED and the test says so. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "test_util.h"

static float *rnd(size_t n, uint32_t stream)
{
    float *p = malloc(n * sizeof(float) + 4);
    for (size_t i = 0; i < n; i++)
        p[i] = (float)(2 * ff_rng_uniform(11, stream, i) - 1);
    return p;
}

static float round_bf16(float x) { return ff_bf16_to_float(ff_bf16_from_float(x)); }

typedef struct {
    double worst_dnnl, worst_blas, worst_pair; /* largest error over its bound */
    long elements;
} tally;

/* One product: A (op: m x k) and B (op: k x n) with leading dimensions
 * widened by `pad`, C m x n with ldc n + pad; operands bf16 values unless
 * raw. */
static void check(ff_gemm *g, ff_bf16_gemm *h, int ta, int tb, int64_t m, int64_t n, int64_t k,
                  float alpha, float beta, int64_t pad, int raw, uint32_t s, tally *t)
{
    int64_t ar = ta ? k : m, ac = ta ? m : k, br = tb ? n : k, bc = tb ? k : n;
    int64_t lda = ac + pad, ldb = bc + pad, ldc = n + pad;
    float *a = rnd((size_t)(ar * lda), s), *b = rnd((size_t)(br * ldb), s + 1);
    float *c0 = rnd((size_t)(m * ldc), s + 2);
    float *ra = malloc((size_t)(ar * lda) * 4), *rb = malloc((size_t)(br * ldb) * 4);
    for (int64_t i = 0; i < ar * lda; i++)
        ra[i] = round_bf16(a[i]);
    for (int64_t i = 0; i < br * ldb; i++)
        rb[i] = round_bf16(b[i]);
    if (!raw)
        memcpy(a, ra, (size_t)(ar * lda) * 4), memcpy(b, rb, (size_t)(br * ldb) * 4);
    size_t cn = (size_t)(m * ldc);
    float *cd = malloc(cn * 4), *cb = malloc(cn * 4);
    memcpy(cd, c0, cn * 4), memcpy(cb, c0, cn * 4);
    int rc = ff_bf16_gemm_run(h, "bf16", ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, cd, ldc);
    CHECK(rc == FF_OK, "ff_bf16_gemm_run returned %d", rc);
    { /* the same from 2-byte operands: both, or A alone (odd streams) */
        uint16_t *a16 = malloc((size_t)(ar * lda) * 2), *b16 = malloc((size_t)(br * ldb) * 2);
        for (int64_t i = 0; i < ar * lda; i++)
            a16[i] = ff_bf16_from_float(a[i]);
        for (int64_t i = 0; i < br * ldb; i++)
            b16[i] = ff_bf16_from_float(b[i]);
        float *ch = malloc(cn * 4);
        memcpy(ch, c0, cn * 4);
        rc = ff_bf16_gemm_run2(h, "bf16 2-byte", ta, tb, m, n, k, alpha, NULL, a16, lda,
                               s % 2 ? b : NULL, s % 2 ? NULL : b16, ldb, beta, ch, ldc);
        CHECK(rc == FF_OK && !memcmp(ch, cd, cn * 4),
              "2-byte operands (%s) tA %d tB %d %lldx%lldx%lld pad %lld: rc %d, %s bits",
              s % 2 ? "A" : "A and B", ta, tb, (long long)m, (long long)n, (long long)k,
              (long long)pad, rc, rc ? "no" : "other");
        free(a16), free(b16), free(ch);
    }
    ff_gemm_run(g, "fp32", ta, tb, m, n, k, alpha, ra, lda, rb, ldb, beta, cb, ldc);
    double u = 1.0 / 16777216.0, gam = (k + 2) * u / (1 - (k + 2) * u);
    double wd = 0, wb = 0, wp = 0;
    for (int64_t i = 0; i < m; i++)
        for (int64_t j = 0; j < n; j++) {
            double exact = 0, mag = 0;
            for (int64_t p = 0; p < k; p++) {
                double x = (double)(ta ? ra[p * lda + i] : ra[i * lda + p]) *
                           (tb ? rb[j * ldb + p] : rb[p * ldb + j]);
                exact += x, mag += fabs(x);
            }
            exact *= alpha, mag *= fabs(alpha);
            exact += beta * (double)c0[i * ldc + j], mag += fabs(beta * (double)c0[i * ldc + j]);
            double bound = gam * mag + 1e-300;
            double ed = fabs(cd[i * ldc + j] - exact) / bound;
            double eb = fabs(cb[i * ldc + j] - exact) / bound;
            double ep = fabs((double)cd[i * ldc + j] - cb[i * ldc + j]) / (2 * bound);
            wd = ed > wd ? ed : wd, wb = eb > wb ? eb : wb, wp = ep > wp ? ep : wp;
        }
    /* the padding columns of C stay as they were */
    int pad_kept = 1;
    for (int64_t i = 0; i < m; i++)
        for (int64_t j = n; j < ldc; j++)
            pad_kept &= cd[i * ldc + j] == c0[i * ldc + j];
    CHECK(wd <= 1.0 && wb <= 1.0 && wp <= 1.0 && pad_kept,
          "%lldx%lldx%lld tA=%d tB=%d alpha=%g beta=%g pad %lld%s: oneDNN %.3f, BLAS %.3f, "
          "apart %.3f of the fp32 bound%s",
          (long long)m, (long long)n, (long long)k, ta, tb, alpha, beta, (long long)pad,
          raw ? " (operands not bf16)" : "", wd, wb, wp, pad_kept ? "" : "; padding overwritten");
    t->worst_dnnl = wd > t->worst_dnnl ? wd : t->worst_dnnl;
    t->worst_blas = wb > t->worst_blas ? wb : t->worst_blas;
    t->worst_pair = wp > t->worst_pair ? wp : t->worst_pair;
    t->elements += (long)(m * n);
    free(a), free(b), free(c0), free(ra), free(rb), free(cd), free(cb);
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    ff_ctx *ctx;
    ff_ctx_create(&ctx, MPI_COMM_WORLD, NULL);
    ff_bf16_gemm *h = NULL;
    int rc = ff_bf16_gemm_create(ctx, &h);
    if (rc == FF_EUNSUPPORTED) {
        CHECK(h == NULL, "a handle returned with FF_EUNSUPPORTED");
        printf("test_gemm_bf16: built without oneDNN (%s): skipped\n", ff_ctx_error(ctx));
        ff_ctx_destroy(ctx);
        int failed = test_finish("test_gemm_bf16");
        MPI_Finalize();
        return failed;
    }
    CHECK(rc == FF_OK, "ff_bf16_gemm_create: %s", ff_ctx_error(ctx));
    ff_gemm *g;
    ff_gemm_create(ctx, FF_GEMM_TUNE_OFF, &g);
    tally t = {0};
    uint32_t s = 0;
    for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++) {
            check(g, h, ta, tb, 1, 1, 1, 1.0f, 0.0f, 0, 0, s += 3, &t);
            check(g, h, ta, tb, 37, 29, 301, 1.0f, 0.0f, 0, 0, s += 3, &t);
            check(g, h, ta, tb, 37, 29, 301, 1.0f, 1.0f, 3, 0, s += 3, &t);
            check(g, h, ta, tb, 64, 48, 96, 0.5f, 1.0f, 0, 0, s += 3, &t);
            check(g, h, ta, tb, 23, 17, 19, 1.0f, 0.0f, 5, 1, s += 3, &t);
        }
    /* two row panels (256 and 44 rows: ff_gemm_panel_rows) */
    int64_t pm = 300, pn = 1600, pk = 512;
    CHECK(ff_gemm_panel_rows(pm, pn, pk) < pm, "the panel shape fits one panel");
    check(g, h, 0, 1, pm, pn, pk, 1.0f, 1.0f, 0, 0, s += 3, &t);
    check(g, h, 1, 0, pm, pn, pk, 1.0f, 0.0f, 0, 0, s += 3, &t);
    /* what the model's bitwise claims rest on (docs/design.md §8, "bf16
     * products"): a panel's rows the same bits inside a product of more rows
     * (decomposition cuts products at panel multiples), and the same bits on
     * 1 and 2 threads; A transposed or not */
    for (int ta = 0; ta < 2; ta++) {
        int64_t m = 96, n = 64, k = 2048;
        ff_bf16_gemm_set_panel_rows(h, 32);
        float *a = rnd((size_t)(2 * m * k), 90 + ta), *b = rnd((size_t)(k * n), 92);
        float *c1 = calloc((size_t)(2 * m * n), 4), *c2 = calloc((size_t)(2 * m * n), 4),
              *c3 = calloc((size_t)(2 * m * n), 4);
        int64_t lda = ta ? 2 * m : k;
        ff_bf16_gemm_run(h, "rows", ta, 0, m, n, k, 1.0f, a, lda, b, n, 0.0f, c1, n);
        ff_bf16_gemm_run(h, "rows", ta, 0, 2 * m, n, k, 1.0f, a, lda, b, n, 0.0f, c2, n);
        ff_blas_set_threads(2);
        ff_bf16_gemm_run(h, "rows", ta, 0, m, n, k, 1.0f, a, lda, b, n, 0.0f, c3, n);
        ff_blas_set_threads(1);
        ff_bf16_gemm_set_panel_rows(h, 0);
        CHECK(!memcmp(c1, c2, (size_t)(m * n) * 4),
              "tA=%d: the first %lld rows differ inside a product of %lld", ta, (long long)m,
              (long long)(2 * m));
        CHECK(!memcmp(c1, c3, (size_t)(m * n) * 4), "tA=%d: 2 threads give other bits", ta);
        free(a), free(b), free(c1), free(c2), free(c3);
    }
    printf("test_gemm_bf16: oneDNN's %s; %ld elements: oneDNN within %.3f, the BLAS (emulated) "
           "within %.3f of the fp32 bound from the exact product, apart %.3f of twice it\n",
           ff_bf16_gemm_impl(h), t.elements, t.worst_dnnl, t.worst_blas, t.worst_pair);
    ff_gemm_destroy(g);
    ff_bf16_gemm_destroy(h);
    ff_ctx_destroy(ctx);
    int failed = test_finish("test_gemm_bf16");
    MPI_Finalize();
    return failed;
}
