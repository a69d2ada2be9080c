/* Local matrix products: panelled for progress, with mode tuning
 * (include/fourfold/gemm.h). */
#include "fourfold/gemm.h"

#include <cblas.h>
#include <stdlib.h>
#include <string.h>

#include "device.h"
#include "fourfold/comm.h"
#include "fourfold/trace.h"
#include "internal.h"
#include "util/team.h"

/* A panel is about this many flops (~5 ms of one core here), and at least
 * FF_GEMM_PANEL_MIN_ROWS rows: every panel packs the whole other operand
 * again, which costs about 16/rows of the rate here (80 GFLOP/s against
 * ~10 GB/s of packing; measured: 10-40% below 128 rows, docs/linear.md). A
 * collective in flight gets a progress call between panels. */
#define FF_GEMM_PANEL_FLOPS    400e6
#define FF_GEMM_PANEL_MIN_ROWS 256
/* Tuning times candidates on a scratch output of at most this many floats;
 * larger products are timed on their first rows only. */
#define FF_GEMM_TUNE_MAX_ELEMS ((int64_t)1 << 24)

typedef struct {
    int ta, tb;
    int64_t m, n, k;
    char name[32];
    double seconds[FF_GEMM_NMODES]; /* < 0: not a candidate */
    int differs[FF_GEMM_NMODES];    /* 1: result not bitwise equal to direct's */
    int mode;
    int64_t tuned_rows; /* rows the candidates were timed on */
    uint64_t calls;
} tuned_shape;

struct ff_gemm {
    ff_ctx *ctx;
    ff_gemm_tune tune;
    int forced;         /* -1 or a mode */
    int64_t panel_rows; /* 0: ff_gemm_panel_rows() */
    tuned_shape *shapes;
    int n_shapes, cap_shapes;
    float *tr_a, *tr_b, *tr_c; /* scratch for explicit transposes */
    ff_bf16_gemm *bf16;        /* bf16 products on oneDNN (not owned), or NULL */
    int bf16_operands;         /* > 0: the products now have bf16 operands */
    size_t cap_a, cap_b, cap_c;
    double flops, seconds;
};

static const char *const mode_names[FF_GEMM_NMODES] = {"direct", "A^T", "B^T", "A^T B^T", "C^T"};

const char *ff_gemm_mode_name(int mode)
{
    return mode >= 0 && mode < FF_GEMM_NMODES ? mode_names[mode] : "?";
}

int ff_gemm_create(ff_ctx *ctx, ff_gemm_tune tune, ff_gemm **out)
{
    *out = NULL;
    ff_gemm *g = calloc(1, sizeof *g);
    if (!g)
        return ff_set_error(ctx, FF_ENOMEM, "out of memory for the GEMM tuner");
    g->ctx = ctx;
    g->tune = tune;
    g->forced = -1;
    *out = g;
    return FF_OK;
}

void ff_gemm_destroy(ff_gemm *g)
{
    if (!g)
        return;
    free(g->shapes);
    free(g->tr_a);
    free(g->tr_b);
    free(g->tr_c);
    free(g);
}

void ff_gemm_force_mode(ff_gemm *g, int mode)
{
    g->forced = (mode >= 0 && mode < FF_GEMM_NMODES) ? mode : -1;
}

void ff_gemm_set_panel_rows(ff_gemm *g, int64_t rows) { g->panel_rows = rows > 0 ? rows : 0; }

void ff_gemm_set_bf16(ff_gemm *g, ff_bf16_gemm *h) { g->bf16 = h; }

void ff_gemm_bf16_operands(ff_gemm *g, int on) { g->bf16_operands += on ? 1 : -1; }

int ff_gemm_bf16_direct(const ff_gemm *g) { return g->bf16 != NULL && !ff_ctx_cuda(g->ctx); }

int64_t ff_gemm_panel_height(const ff_gemm *g, int64_t n, int64_t k)
{
    return g->panel_rows > 0 ? g->panel_rows : ff_gemm_panel_rows(INT64_MAX, n, k);
}

int64_t ff_gemm_panel_rows(int64_t m, int64_t n, int64_t k)
{
    double per_row = 2.0 * (double)(n > 0 ? n : 1) * (double)(k > 0 ? k : 1);
    int64_t rows = (int64_t)(FF_GEMM_PANEL_FLOPS / per_row) + 1;
    rows = (rows + 15) / 16 * 16;
    if (rows < FF_GEMM_PANEL_MIN_ROWS)
        rows = FF_GEMM_PANEL_MIN_ROWS;
    return rows >= m ? (m > 0 ? m : 1) : rows;
}

size_t ff_gemm_scratch_bytes(const ff_gemm *g)
{
    return (g->cap_a + g->cap_b + g->cap_c) * sizeof(float) + ff_bf16_gemm_scratch_bytes(g->bf16);
}

static int grow(ff_gemm *g, float **buf, size_t *cap, size_t elems)
{
    if (*cap >= elems)
        return FF_OK;
    float *p = realloc(*buf, elems * sizeof(float));
    if (!p)
        return ff_set_error(g->ctx, FF_ENOMEM, "out of memory for a %zu-float GEMM scratch", elems);
    *buf = p;
    *cap = elems;
    return FF_OK;
}

/* dst (cols x rows, leading dim rows) = src (rows x cols, leading dim lds)^T,
 * in tiles so both sides stay in cache */
typedef struct {
    float *dst;
    const float *src;
    int64_t rows, cols, lds;
} transpose_job;

enum { TILE = 32 };

/* tile rows [t0, t1) of the source: a copy, so any split gives the same bits */
static void transpose_tiles(void *arg, int64_t t0, int64_t t1, int th)
{
    (void)th;
    const transpose_job *t = arg;
    for (int64_t i0 = t0 * TILE; i0 < t1 * TILE && i0 < t->rows; i0 += TILE)
        for (int64_t j0 = 0; j0 < t->cols; j0 += TILE) {
            int64_t i1 = i0 + TILE < t->rows ? i0 + TILE : t->rows;
            int64_t j1 = j0 + TILE < t->cols ? j0 + TILE : t->cols;
            for (int64_t i = i0; i < i1; i++)
                for (int64_t j = j0; j < j1; j++)
                    t->dst[j * t->rows + i] = t->src[i * t->lds + j];
        }
}

static void transpose(ff_ctx *ctx, float *dst, const float *src, int64_t rows, int64_t cols,
                      int64_t lds)
{
    transpose_job t = {dst, src, rows, cols, lds};
    ff_team_run(ctx->team, (rows + TILE - 1) / TILE, 1, transpose_tiles, &t);
}

static enum CBLAS_TRANSPOSE tr(int t) { return t ? CblasTrans : CblasNoTrans; }

/* One product in one mode, in row panels with a progress call between them. */
static int run_mode(ff_gemm *g, int mode, int ta, int tb, int64_t m, int64_t n, int64_t k,
                    float alpha, const float *a, int64_t lda, const float *b, int64_t ldb,
                    float beta, float *c, int64_t ldc)
{
    int rc;
    if (mode & 1) { /* store op(A) the other way round */
        int64_t rows = ta ? k : m, cols = ta ? m : k;
        if ((rc = grow(g, &g->tr_a, &g->cap_a, (size_t)(rows * cols))))
            return rc;
        transpose(g->ctx, g->tr_a, a, rows, cols, lda);
        a = g->tr_a;
        lda = rows;
        ta = !ta;
    }
    if (mode & 2) {
        int64_t rows = tb ? n : k, cols = tb ? k : n;
        if ((rc = grow(g, &g->tr_b, &g->cap_b, (size_t)(rows * cols))))
            return rc;
        transpose(g->ctx, g->tr_b, b, rows, cols, ldb);
        b = g->tr_b;
        ldb = rows;
        tb = !tb;
    }
    int64_t panel = g->panel_rows > 0 ? g->panel_rows : ff_gemm_panel_rows(m, n, k);
    if (mode == FF_GEMM_MODE_TPROD && (rc = grow(g, &g->tr_c, &g->cap_c, (size_t)(n * panel))))
        return rc;
    for (int64_t r0 = 0; r0 < m; r0 += panel) {
        int64_t rows = m - r0 < panel ? m - r0 : panel;
        const float *ap = ta ? a + r0 : a + r0 * lda;
        float *cp = c + r0 * ldc;
        if (mode == FF_GEMM_MODE_TPROD) {
            /* T (n x rows) = op(B)^T op(A_panel)^T, then C_panel = alpha T^T + beta C_panel */
            cblas_sgemm(CblasRowMajor, tr(!tb), tr(!ta), (int)n, (int)rows, (int)k, 1.0f, b,
                        (int)ldb, ap, (int)lda, 0.0f, g->tr_c, (int)rows);
            for (int64_t i = 0; i < rows; i++)
                for (int64_t j = 0; j < n; j++) {
                    float t = alpha * g->tr_c[j * rows + i];
                    cp[i * ldc + j] = beta == 0.0f ? t : beta * cp[i * ldc + j] + t;
                }
        } else {
            cblas_sgemm(CblasRowMajor, tr(ta), tr(tb), (int)rows, (int)n, (int)k, alpha, ap,
                        (int)lda, b, (int)ldb, beta, cp, (int)ldc);
        }
        if (r0 + panel < m)
            ff_poll(g->ctx);
    }
    return FF_OK;
}

static tuned_shape *find_shape(ff_gemm *g, int ta, int tb, int64_t m, int64_t n, int64_t k)
{
    for (int i = 0; i < g->n_shapes; i++) {
        tuned_shape *s = &g->shapes[i];
        if (s->ta == ta && s->tb == tb && s->m == m && s->n == n && s->k == k)
            return s;
    }
    return NULL;
}

/* Makes *buf hold `elems` floats and touches them, so that no timed call
 * pays for its first page faults. */
static int grow_touched(ff_gemm *g, float **buf, size_t *cap, size_t elems)
{
    int rc = grow(g, buf, cap, elems);
    if (rc == FF_OK && elems)
        memset(*buf, 0, elems * sizeof(float));
    return rc;
}

/* Fills x[0..n) with multiples of 2^-23 in [-1, 1), pseudo-random, the same on
 * every call: operands whose sums round (docs/linear.md, "The GEMM tuner"). */
static void probe_values(float *x, size_t n)
{
    uint64_t st = 0x9e3779b97f4a7c15u;
    for (size_t i = 0; i < n; i++) {
        st = st * 6364136223846793005u + 1442695040888963407u;
        x[i] = (float)((int32_t)(st >> 40) - (1 << 23)) * 0x1p-23f;
    }
}

/* Times every candidate on a scratch output and records the fastest of
 * those whose result equals the direct call's bit for bit (all of them with
 * OpenBLAS's AVX2 kernels; with its AVX-512 ones a small NN product goes to a
 * kernel of its own, and at 130x70x100 in panels of 96 it differs from NT, TN
 * and TT, docs/linear.md: so this is checked, not assumed, at beta 0; the
 * difference seen is the same at beta 1). The transposed product is exempt
 * under FF_GEMM_TUNE_ALL. Every candidate runs once untimed (the equality
 * check), then TUNE_ROUNDS times in turn, and its fastest time counts:
 * timed once each on freshly allocated buffers, the first candidates paid
 * the page faults, and a 768x3072x256 weight gradient went to an explicit
 * transpose 18 % slower than the direct call (docs/linear.md). The
 * candidates multiply operands of random values of full precision, not the
 * caller's (but for a B larger than FF_GEMM_TUNE_MAX_ELEMS, the caller's B,
 * by a random A): on the caller's operands two orders of
 * summation can agree by chance (bf16-rounded values, whose products and
 * short sums are exact; pruned weights, mostly zeros), and a mode admitted
 * so would then give other bits on later data, and, being chosen by its
 * time, not the same mode in every run (a resumed bf16-mixed run from a
 * pruned checkpoint differed from the uninterrupted one). */
enum { TUNE_ROUNDS = 1 };
/* Another mode is chosen only when it beats the direct call by this much:
 * the near ties are timing noise, and a transposing mode moves more memory. */
#define TUNE_MARGIN 0.03

static int tune_shape(ff_gemm *g, const char *name, int ta, int tb, int64_t m, int64_t n, int64_t k,
                      const float *a, int64_t lda, const float *b, int64_t ldb, tuned_shape **out)
{
    if (g->n_shapes == g->cap_shapes) {
        int cap = g->cap_shapes ? 2 * g->cap_shapes : 16;
        tuned_shape *p = realloc(g->shapes, (size_t)cap * sizeof *p);
        if (!p)
            return ff_set_error(g->ctx, FF_ENOMEM, "out of memory for the GEMM tuner");
        g->shapes = p;
        g->cap_shapes = cap;
    }
    tuned_shape *s = &g->shapes[g->n_shapes];
    memset(s, 0, sizeof *s);
    s->ta = ta, s->tb = tb, s->m = m, s->n = n, s->k = k;
    snprintf(s->name, sizeof s->name, "%s", name ? name : "gemm");
    for (int i = 0; i < FF_GEMM_NMODES; i++)
        s->seconds[i] = -1.0;
    s->mode = FF_GEMM_MODE_DIRECT;

    int n_modes = g->tune == FF_GEMM_TUNE_ALL ? FF_GEMM_NMODES : 4;
    int64_t rows = m;
    if (rows * n > FF_GEMM_TUNE_MAX_ELEMS)
        rows = FF_GEMM_TUNE_MAX_ELEMS / (n > 0 ? n : 1) > 0 ? FF_GEMM_TUNE_MAX_ELEMS / n : 1;
    s->tuned_rows = rows;
    size_t elems = (size_t)(rows * n);
    float *ref = malloc(elems * sizeof(float) + 1), *scratch = malloc(elems * sizeof(float) + 1);
    /* random operands: A always, B where it is no larger than the output */
    const int probe_b = k * n <= FF_GEMM_TUNE_MAX_ELEMS;
    float *probe = malloc((size_t)(rows * k + (probe_b ? k * n : 0)) * sizeof(float) + 1);
    int rc = ref && scratch && probe
                 ? FF_OK
                 : ff_set_error(g->ctx, FF_ENOMEM, "out of memory for GEMM tuning");
    if (rc == FF_OK) {
        memset(ref, 0, elems * sizeof(float));
        memset(scratch, 0, elems * sizeof(float));
        probe_values(probe, (size_t)(rows * k + (probe_b ? k * n : 0)));
        a = probe, lda = ta ? rows : k; /* op(A): rows x k */
        if (probe_b)
            b = probe + rows * k, ldb = tb ? k : n; /* op(B): k x n */
        int64_t panel = g->panel_rows > 0 ? g->panel_rows : ff_gemm_panel_rows(rows, n, k);
        if ((rc = grow_touched(g, &g->tr_a, &g->cap_a, (size_t)(rows * k))) == FF_OK &&
            (rc = grow_touched(g, &g->tr_b, &g->cap_b, (size_t)(k * n))) == FF_OK &&
            n_modes > FF_GEMM_MODE_TPROD)
            rc = grow_touched(g, &g->tr_c, &g->cap_c, (size_t)(n * panel));
    }
    for (int round = 0; round <= TUNE_ROUNDS && rc == FF_OK; round++)
        for (int mode = 0; mode < n_modes && rc == FF_OK; mode++) {
            float *dst = mode ? scratch : ref;
            double t0 = ff_now();
            rc = run_mode(g, mode, ta, tb, rows, n, k, 1.0f, a, lda, b, ldb, 0.0f, dst, n);
            double t = ff_now() - t0;
            if (round == 0)
                s->differs[mode] = mode && memcmp(dst, ref, elems * sizeof(float)) != 0;
            else if (s->seconds[mode] < 0 || t < s->seconds[mode])
                s->seconds[mode] = t;
        }
    double best = (1.0 - TUNE_MARGIN) * s->seconds[FF_GEMM_MODE_DIRECT];
    for (int mode = 1; mode < n_modes && rc == FF_OK; mode++) {
        int allowed = !s->differs[mode] || mode == FF_GEMM_MODE_TPROD;
        if (allowed && s->seconds[mode] >= 0 && s->seconds[mode] < best)
            s->mode = mode, best = s->seconds[mode];
    }
    free(ref);
    free(scratch);
    free(probe);
    if (rc)
        return rc;
    g->n_shapes++;
    *out = s;
    return FF_OK;
}

int ff_gemm_run(ff_gemm *g, const char *name, int trans_a, int trans_b, int64_t m, int64_t n,
                int64_t k, float alpha, const float *a, int64_t lda, const float *b, int64_t ldb,
                float beta, float *c, int64_t ldc)
{
    return ff_gemm_run2(g, name, trans_a, trans_b, m, n, k, alpha, a, NULL, lda, b, NULL, ldb, beta,
                        c, ldc);
}

int ff_gemm_run2(ff_gemm *g, const char *name, int trans_a, int trans_b, int64_t m, int64_t n,
                 int64_t k, float alpha, const float *a, const uint16_t *a16, int64_t lda,
                 const float *b, const uint16_t *b16, int64_t ldb, float beta, float *c,
                 int64_t ldc)
{
    if (m <= 0 || n <= 0)
        return FF_OK;
    if (m > INT32_MAX || n > INT32_MAX || k > INT32_MAX || lda > INT32_MAX || ldb > INT32_MAX ||
        ldc > INT32_MAX)
        return ff_set_error(g->ctx, FF_EINVAL,
                            "GEMM %s: a dimension exceeds the BLAS's 32-bit integers",
                            name ? name : "gemm");
    ff_trace_begin(g->ctx, name ? name : "gemm");
    int mode = FF_GEMM_MODE_DIRECT, rc = FF_OK;
    /* on a GPU context cuBLAS runs the product (the CPU's modes are not tuned) */
    struct ff_cuda *cu = ff_ctx_cuda(g->ctx);
    if (!cu && g->forced >= 0) {
        mode = g->forced;
    } else if (!cu && g->tune != FF_GEMM_TUNE_OFF && k > 0 && !(g->bf16 && g->bf16_operands > 0)) {
        tuned_shape *s = find_shape(g, trans_a ? 1 : 0, trans_b ? 1 : 0, m, n, k);
        /* beyond FF_GEMM_TUNE_MAX_SHAPES shapes (an expert's rows change
         * with the routing, docs/moe.md) new ones run direct: the same bits
         * as a tuned mode, which must equal it (but for the transposed
         * product, admitted under FF_GEMM_TUNE_ALL) */
        if (!s && g->n_shapes < FF_GEMM_TUNE_MAX_SHAPES)
            rc = tune_shape(g, name, trans_a ? 1 : 0, trans_b ? 1 : 0, m, n, k, a, lda, b, ldb, &s);
        if (rc == FF_OK && s) {
            mode = s->mode;
            s->calls++;
        }
    }
    double t0 = ff_now();
    int on_gpu = 0;
#ifdef FF_CUDA
    on_gpu = cu && ff_cuda_gemm(cu, trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
#endif
    if (rc == FF_OK && !on_gpu && g->bf16 && g->bf16_operands > 0) {
        ff_bf16_gemm_set_panel_rows(g->bf16, g->panel_rows);
        rc = ff_bf16_gemm_run2(g->bf16, NULL, trans_a, trans_b, m, n, k, alpha, a, a16, lda, b, b16,
                               ldb, beta, c, ldc);
    } else if (rc == FF_OK && !on_gpu)
        rc = run_mode(g, mode, trans_a ? 1 : 0, trans_b ? 1 : 0, m, n, k, alpha, a, lda, b, ldb,
                      beta, c, ldc);
    g->seconds += ff_now() - t0;
    g->flops += 2.0 * (double)m * (double)n * (double)k;
    ff_trace_end(g->ctx);
    return rc;
}

void ff_gemm_report(const ff_gemm *g, FILE *out)
{
    fprintf(out, "%-20s %2s %2s %7s %7s %7s %6s  %-8s", "gemm", "tA", "tB", "m", "n", "k", "calls",
            "chosen");
    for (int i = 0; i < FF_GEMM_NMODES; i++)
        fprintf(out, " %9s", mode_names[i]);
    fprintf(
        out,
        "  (ms per candidate: the fastest of its timings on `rows` rows; * = result differs)\n");
    for (int i = 0; i < g->n_shapes; i++) {
        const tuned_shape *s = &g->shapes[i];
        fprintf(out, "%-20s %2d %2d %7lld %7lld %7lld %6llu  %-8s", s->name, s->ta, s->tb,
                (long long)s->m, (long long)s->n, (long long)s->k, (unsigned long long)s->calls,
                mode_names[s->mode]);
        for (int j = 0; j < FF_GEMM_NMODES; j++) {
            if (s->seconds[j] < 0)
                fprintf(out, " %9s", "-");
            else
                fprintf(out, " %8.3f%c", 1e3 * s->seconds[j], s->differs[j] ? '*' : ' ');
        }
        fprintf(out, "  rows %lld\n", (long long)s->tuned_rows);
    }
}

void ff_gemm_totals(const ff_gemm *g, double *flops, double *seconds)
{
    if (flops)
        *flops = g->flops;
    if (seconds)
        *seconds = g->seconds;
}

void ff_gemm_totals_reset(ff_gemm *g) { g->flops = g->seconds = 0.0; }

/* ---- the machine's BLAS ---- */

/* its threads and kernels: src/blas.c */

static int cmp_double(const void *x, const void *y)
{
    double a = *(const double *)x, b = *(const double *)y;
    return (a > b) - (a < b);
}

double ff_median(double *v, int n)
{
    if (n <= 0)
        return 0;
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

double ff_median_seconds(void (*run)(void *), void *arg, double min_seconds)
{
    run(arg); /* warm-up: page faults, thread start, a primitive's creation */
    enum { MAX_RUNS = 1000 };
    double t[MAX_RUNS], total = 0;
    int runs = 0;
    while (runs < MAX_RUNS && (runs < 3 || total < min_seconds)) {
        double t0 = ff_now();
        run(arg);
        t[runs] = ff_now() - t0;
        total += t[runs++];
    }
    return ff_median(t, runs);
}

typedef struct {
    int m, n, k;
    const float *A, *B;
    float *C;
} sgemm_job;

static void sgemm_once(void *arg)
{
    sgemm_job *j = arg;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, j->m, j->n, j->k, 1.0f, j->A, j->k, j->B,
                j->n, 0.0f, j->C, j->n);
}

double ff_sgemm_rate(int m, int n, int k, int threads, double min_seconds)
{
    ff_blas_set_threads(threads);
    size_t na = (size_t)m * k, nb = (size_t)k * n, nc = (size_t)m * n;
    float *A = ff_floats_alloc(na), *B = ff_floats_alloc(nb), *C = ff_floats_alloc(nc);
    double rate = 0;
    if (A && B && C) {
        ff_rate_operands(A, B, na, nb);
        sgemm_job j = {m, n, k, A, B, C};
        rate = 2.0 * m * n * k / ff_median_seconds(sgemm_once, &j, min_seconds);
    }
    ff_floats_free(A), ff_floats_free(B), ff_floats_free(C);
    ff_blas_set_threads(1);
    return rate;
}

void ff_rate_operands(float *A, float *B, size_t na, size_t nb)
{
    for (size_t i = 0; i < na; i++)
        A[i] = (float)((i * 7) % 13) * 0.01f;
    for (size_t i = 0; i < nb; i++)
        B[i] = (float)((i * 5) % 11) * 0.01f;
}
