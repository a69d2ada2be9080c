/* Local products: every mode the tuner may pick (operands transposed
 * explicitly first), for all four transpose combinations, beta 0 and 1,
 * shapes that do not fill a panel and shapes split into several panels of
 * 96 rows, and larger shapes with their own panels and inner sizes beyond
 * OpenBLAS's k blocking. A mode equals the direct call bit for bit on the
 * OpenBLAS kernels for AVX2 (Haswell), but not always on its AVX-512 ones
 * (Cooperlake: small products go to kernels of their own per transpose, and
 * 130x70x100 in panels of 96 differs): so each mode must either equal the
 * direct call or agree with one unpanelled sgemm within fp32 summation error
 * (gamma_{k+2} * sum|terms|), and whatever a fresh tuner picks must give the
 * direct call's result bit for bit (it may only pick the modes that do, which
 * keeps a run's results independent of the tuner's timings). The panelled
 * direct call and the transposed product (which rounds differently) must
 * agree with one sgemm within the same bound. And the tuner must pick one of
 * the candidates it timed and report it.
 * Also the library's buffers (ff_floats_alloc): zeroed, those of 2 MiB and
 * more aligned to a huge page (but in the sanitizer build, whose buffers
 * are calloc's), writable to their last float, and freed, 70 at once in
 * another order than allocated (with 400 small ones), the allocator's live
 * bytes (ff_fbuf_live_bytes) exactly those asked for, and after the frees
 * what they were before. */
#include <cblas.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "device.h" /* ff_fbuf_live_bytes: the allocator's count, internal */
#include "test_util.h"

static float *rnd(size_t n, uint32_t stream)
{
    float *p = malloc(n * sizeof(float) + 4);
    for (size_t i = 0; i < n; i++)
        p[i] = (float)(2 * ff_rng_uniform(9, stream, i) - 1);
    return p;
}

/* The bound on |x - ref| for each element, where ref is one unpanelled sgemm
 * of op(A) op(B) + beta C_init and x and ref are both within
 * gamma_{k+2} sum|terms| of the exact value (O(mnk) work). */
static double *bounds(int ta, int tb, int64_t m, int64_t n, int64_t k, const float *a, int64_t lda,
                      const float *b, int64_t ldb, float beta, const float *c_init)
{
    double u = 1.0 / 16777216.0, gam = (k + 2) * u / (1 - (k + 2) * u);
    double *bound = malloc((size_t)(m * n) * sizeof *bound + 8);
    for (int64_t i = 0; i < m; i++)
        for (int64_t j = 0; j < n; j++) {
            double s = beta * fabs(c_init[i * n + j]);
            for (int64_t p = 0; p < k; p++)
                s += fabs((double)(ta ? a[p * lda + i] : a[i * lda + p]) *
                          (tb ? b[j * ldb + p] : b[p * ldb + j]));
            bound[i * n + j] = 2 * gam * s;
        }
    return bound;
}

/* The largest |x - ref| over its bound. */
static double off_by(size_t mn, const double *bound, const float *ref, const float *x)
{
    double worst = 0;
    for (size_t i = 0; i < mn; i++) {
        double r = fabs((double)x[i] - ref[i]) / (bound[i] > 0 ? bound[i] : 1e-300);
        worst = r > worst ? r : worst;
    }
    return worst;
}

typedef struct {
    int same, differ; /* mode products equal to the direct call, and not */
    int marked;       /* modes a tuner marked as differing */
    double worst;     /* the largest off_by of those checked against the bound */
    long checked;     /* elements checked against it */
} tally;

/* The modes ff_gemm_report marks as differing from the direct call ('*'). */
static int differing_marks(const ff_gemm *g)
{
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    if (!f)
        return -1;
    ff_gemm_report(g, f);
    fclose(f);
    int marks = 0;
    const char *body = strchr(text, '\n'); /* after the header's own '*' */
    for (const char *p = body ? body : ""; *p; p++)
        marks += *p == '*';
    free(text);
    return marks;
}

/* One product (m x n x k, transposes ta, tb, beta) on gemm g (panel rows set
 * by the caller) in the direct mode and in modes 1..nmodes-1, and on a fresh
 * tuner of the layouts with the same panels; streams s.. seed the operands.
 * The direct call is held to the bound too if bound_direct (O(mnk) work:
 * the small shapes only). */
static void check_product(ff_ctx *ctx, ff_gemm *g, int64_t panel, int nmodes, int bound_direct,
                          int ta, int tb, int64_t m, int64_t n, int64_t k, float beta, uint32_t s,
                          tally *t)
{
    int64_t lda = ta ? m : k, ldb = tb ? k : n;
    size_t mn = (size_t)(m * n);
    float *a = rnd((size_t)(m * k), s), *b = rnd((size_t)(k * n), s + 1);
    float *c_init = rnd(mn, s + 2), *c0 = malloc(mn * 4), *c = malloc(mn * 4),
          *ref = malloc(mn * 4);
    memcpy(ref, c_init, mn * 4);
    cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans,
                (int)m, (int)n, (int)k, 1.0f, a, (int)lda, b, (int)ldb, beta, ref, (int)n);
    const char *core = openblas_get_corename();
    memcpy(c0, c_init, mn * 4);
    ff_gemm_force_mode(g, FF_GEMM_MODE_DIRECT);
    ff_gemm_run(g, "direct", ta, tb, m, n, k, 1.0f, a, lda, b, ldb, beta, c0, n);
    double r = 0, *bound = NULL; /* computed once, when first needed */
    if (bound_direct) {
        bound = bounds(ta, tb, m, n, k, a, lda, b, ldb, beta, c_init);
        r = off_by(mn, bound, ref, c0);
        t->worst = r > t->worst ? r : t->worst, t->checked += (long)mn;
    }
    for (int mode = 1; mode < nmodes; mode++) {
        memcpy(c, c_init, mn * 4);
        ff_gemm_force_mode(g, mode);
        ff_gemm_run(g, "mode", ta, tb, m, n, k, 1.0f, a, lda, b, ldb, beta, c, n);
        int same = mode != FF_GEMM_MODE_TPROD && !memcmp(c, c0, mn * 4);
        t->same += same, t->differ += !same && mode != FF_GEMM_MODE_TPROD;
        if (same)
            continue;
        if (!bound)
            bound = bounds(ta, tb, m, n, k, a, lda, b, ldb, beta, c_init);
        r = off_by(mn, bound, ref, c);
        t->worst = r > t->worst ? r : t->worst, t->checked += (long)mn;
        CHECK(r <= 1.0,
              "%lldx%lldx%lld tA=%d tB=%d beta=%g (panels of %lld rows, %s): mode %s off by "
              "%.2f x the fp32 bound",
              (long long)m, (long long)n, (long long)k, ta, tb, beta, (long long)panel, core,
              ff_gemm_mode_name(mode), r);
    }
    ff_gemm *tuned;
    ff_gemm_create(ctx, FF_GEMM_TUNE_LAYOUTS, &tuned);
    ff_gemm_set_panel_rows(tuned, panel);
    memcpy(c, c_init, mn * 4);
    ff_gemm_run(tuned, "tuned", ta, tb, m, n, k, 1.0f, a, lda, b, ldb, beta, c, n);
    CHECK(!memcmp(c, c0, mn * 4),
          "%lldx%lldx%lld tA=%d tB=%d beta=%g (panels of %lld rows, %s): the tuner's choice "
          "differs from the direct call",
          (long long)m, (long long)n, (long long)k, ta, tb, beta, (long long)panel, core);
    /* a tuner that first sees zero operands (on which every mode agrees)
     * marks the same modes as differing: its check is not on the caller's
     * data, so it admits no mode that differs on later data */
    ff_gemm *blind;
    ff_gemm_create(ctx, FF_GEMM_TUNE_LAYOUTS, &blind);
    ff_gemm_set_panel_rows(blind, panel);
    float *za = calloc((size_t)(m * k), 4), *zb = calloc((size_t)(k * n), 4);
    memcpy(c, c_init, mn * 4);
    ff_gemm_run(blind, "blind", ta, tb, m, n, k, 1.0f, za, lda, zb, ldb, beta, c, n);
    int marks_tuned = differing_marks(tuned), marks_blind = differing_marks(blind);
    CHECK(marks_blind == marks_tuned,
          "%lldx%lldx%lld tA=%d tB=%d beta=%g (panels of %lld rows, %s): tuned on zero operands "
          "the tuner marks %d modes as differing, on random ones %d",
          (long long)m, (long long)n, (long long)k, ta, tb, beta, (long long)panel, core,
          marks_blind, marks_tuned);
    t->marked += marks_tuned;
    ff_gemm_destroy(blind);
    free(za), free(zb);
    ff_gemm_destroy(tuned);
    free(a), free(b), free(c_init), free(c0), free(c), free(ref), free(bound);
}

#if defined(__SANITIZE_ADDRESS__)
enum { SANITIZED = 1 };
#else
enum { SANITIZED = 0 };
#endif

static void check_floats_alloc(void)
{
    const size_t huge = ((size_t)2 << 20) / sizeof(float);
    const size_t sizes[] = {1, 1000, huge - 1, huge, huge + 1, 3000000};
    int bad = 0;
    for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
        size_t n = sizes[s];
        float *p = ff_floats_alloc(n);
        CHECK(p != NULL, "ff_floats_alloc(%zu) failed", n);
        if (!p)
            continue;
        for (size_t i = 0; i < n; i++)
            bad += p[i] != 0.0f;
        CHECK(n < huge || SANITIZED || (uintptr_t)p % (huge * sizeof(float)) == 0,
              "%zu floats at %p: not aligned to 2 MiB", n, (void *)p);
        for (size_t i = 0; i < n; i++)
            p[i] = (float)i;
        CHECK(p[n - 1] == (float)(n - 1), "%zu floats: the last one not kept", n);
        ff_floats_free(p);
    }
    CHECK(bad == 0, "%d floats of fresh buffers not zero", bad);
    /* many at once, mappings and calloc's mixed (the allocator's table of
     * live buffers grows and loses entries in another order): its live
     * bytes are the bytes asked for, and back where they were after */
    enum { MANY = 70, SMALL = 400 };
    float *many[MANY], *small[SMALL];
    const size_t live0 = ff_fbuf_live_bytes();
    size_t asked = 0;
    for (int i = 0; i < MANY; i++) {
        many[i] = ff_floats_alloc(huge + (size_t)i);
        CHECK(many[i] != NULL, "buffer %d of %d failed", i, MANY);
        asked += many[i] ? (huge + (size_t)i) * sizeof(float) : 0;
    }
    for (int i = 0; i < SMALL; i++) {
        small[i] = ff_floats_alloc((size_t)i);
        asked += small[i] ? (size_t)i * sizeof(float) : 0;
    }
    CHECK(ff_fbuf_live_bytes() - live0 == asked, "%zu bytes live in %d buffers, asked for %zu",
          ff_fbuf_live_bytes() - live0, MANY + SMALL, asked);
    for (int i = 0; i < MANY; i++) /* every second one first, then the others */
        ff_floats_free(many[(2 * i) % MANY + (2 * i >= MANY)]);
    for (int i = 0; i < SMALL; i++)
        ff_floats_free(small[(7 * i) % SMALL]); /* 7 and 400 coprime: each once */
    CHECK(ff_fbuf_live_bytes() == live0, "%zu bytes live after freeing, %zu before",
          ff_fbuf_live_bytes(), live0);
    printf("ff_floats_alloc: %zu sizes zeroed, aligned and freed; %d buffers of 2 MiB and %d "
           "small ones at once, the allocator's live bytes those asked for (%zu), then none\n",
           sizeof sizes / sizeof sizes[0], MANY, SMALL, asked);
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    check_floats_alloc();
    ff_ctx *ctx;
    ff_ctx_create(&ctx, MPI_COMM_WORLD, NULL);
    ff_gemm *g;
    ff_gemm_create(ctx, FF_GEMM_TUNE_ALL, &g);
    /* small panels, so the larger shapes are cut into several */
    ff_gemm_set_panel_rows(g, 96);
    const int64_t shapes[][3] = {{1, 1, 1},      {7, 5, 3},       {33, 17, 29},    {64, 96, 48},
                                 {130, 70, 100}, {700, 300, 150}, {1200, 257, 131}};
    tally small = {0}, large = {0};
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++)
        for (int ta = 0; ta < 2; ta++)
            for (int tb = 0; tb < 2; tb++)
                for (int bi = 0; bi < 2; bi++)
                    check_product(ctx, g, 96, FF_GEMM_NMODES, 1, ta, tb, shapes[si][0],
                                  shapes[si][1], shapes[si][2], (float)bi, 1, &small);
    CHECK(small.worst <= 1.0, "panelled or transposed product off by %.2f x the fp32 bound",
          small.worst);

    /* production panel heights (by shape) and inner sizes beyond OpenBLAS's
     * k blocking */
    ff_gemm *d;
    ff_gemm_create(ctx, FF_GEMM_TUNE_LAYOUTS, &d);
    const int64_t big[][3] = {{900, 400, 600}, {200, 64, 1100}, {96, 100, 700}, {520, 96, 2048}};
    for (size_t si = 0; si < sizeof big / sizeof big[0]; si++) {
        int64_t m = big[si][0], n = big[si][1], k = big[si][2];
        ff_gemm_set_panel_rows(d, ff_gemm_panel_rows(m, n, k));
        for (int ta = 0; ta < 2; ta++)
            for (int tb = 0; tb < 2; tb++)
                for (int bi = 0; bi < 2; bi++)
                    check_product(ctx, d, ff_gemm_panel_rows(m, n, k), 4, 0, ta, tb, m, n, k,
                                  (float)bi, 6, &large);
    }
    ff_gemm_destroy(d);
    printf("on %s: of the mode products, %d equal the direct call bit for bit and %d do not "
           "(small shapes), %d and %d (large); panelled, transposed and differing products vs "
           "one sgemm: worst %.3f of the bound over %ld elements; every tuner's choice equal "
           "to the direct call; %d modes marked as differing, the same when tuned on zeros\n",
           openblas_get_corename(), small.same, small.differ, large.same, large.differ,
           small.worst > large.worst ? small.worst : large.worst, small.checked + large.checked,
           small.marked + large.marked);

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
