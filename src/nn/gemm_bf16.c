/* bf16 products on oneDNN's matmul (include/fourfold/gemm.h, "bf16
 * products"): operands rounded to bfloat16 into this handle's scratch,
 * multiplied with fp32 accumulation, written as fp32. oneDNN builds (and
 * caches, by shape and strides) one primitive per product shape; a product
 * runs in the same row panels as ff_gemm_run's, with a progress call
 * between them. */
#include <stdlib.h>
#include <string.h>

#include "fourfold/comm.h"
#include "fourfold/gemm.h"
#include "fourfold/trace.h"
#include "internal.h"

#ifdef FF_ONEDNN
#include <oneapi/dnnl/dnnl.h>

struct ff_bf16_gemm {
    ff_ctx *ctx;
    dnnl_engine_t engine;
    dnnl_stream_t stream;
    uint16_t *a, *b; /* the operands in bf16 */
    size_t cap_a, cap_b;
    int64_t panel_rows; /* 0: ff_gemm_panel_rows() */
    char impl[64];      /* the implementation oneDNN chose for the last primitive */
    double flops, seconds;
};

int ff_bf16_gemm_available(void) { return 1; }

int ff_bf16_gemm_native(void)
{
    const unsigned isa = (unsigned)dnnl_get_effective_cpu_isa(),
                   bf16 = dnnl_cpu_isa_avx512_core_bf16;
    return (isa & bf16) == bf16; /* (AMX's value includes AVX512_BF16's bits) */
}

static int dnnl_fail(ff_ctx *ctx, const char *what, dnnl_status_t s)
{
    int rc = s == dnnl_out_of_memory   ? FF_ENOMEM
             : s == dnnl_unimplemented ? FF_EUNSUPPORTED
                                       : FF_EINVAL;
    return ff_set_error(ctx, rc, "oneDNN: %s failed (status %d)", what, (int)s);
}

int ff_bf16_gemm_create(ff_ctx *ctx, ff_bf16_gemm **out)
{
    *out = NULL;
    ff_bf16_gemm *h = calloc(1, sizeof *h);
    if (!h)
        return ff_set_error(ctx, FF_ENOMEM, "out of memory (bf16 products)");
    h->ctx = ctx;
    dnnl_status_t s = dnnl_engine_create(&h->engine, dnnl_cpu, 0);
    if (s == dnnl_success &&
        (s = dnnl_stream_create(&h->stream, h->engine, dnnl_stream_default_flags)) != dnnl_success)
        dnnl_engine_destroy(h->engine);
    if (s != dnnl_success) {
        free(h);
        return dnnl_fail(ctx, "creating the CPU engine", s);
    }
    *out = h;
    return FF_OK;
}

void ff_bf16_gemm_destroy(ff_bf16_gemm *h)
{
    if (!h)
        return;
    dnnl_stream_destroy(h->stream);
    dnnl_engine_destroy(h->engine);
    free(h->a);
    free(h->b);
    free(h);
}

/* rows x cols of src (leading dimension ld) rounded into dst, packed; or,
 * from 2-byte bf16 (src16), copied */
static void pack(uint16_t *dst, const float *src, const uint16_t *src16, int64_t rows, int64_t cols,
                 int64_t ld)
{
    for (int64_t i = 0; i < rows; i++)
        if (src16)
            memcpy(dst + i * cols, src16 + i * ld, (size_t)cols * sizeof *dst);
        else
            ff_bf16_pack(dst + i * cols, src + i * ld, (size_t)cols);
}

/* The transpose of rows x cols of src rounded into dst (cols x rows,
 * packed): tiles rounded a row at a time, then transposed in cache */
static void pack_transposed(uint16_t *dst, const float *src, const uint16_t *src16, int64_t rows,
                            int64_t cols, int64_t ld)
{
    enum { TILE = 64 };
    uint16_t tile[TILE][TILE];
    for (int64_t i0 = 0; i0 < rows; i0 += TILE)
        for (int64_t j0 = 0; j0 < cols; j0 += TILE) {
            int64_t ni = rows - i0 < TILE ? rows - i0 : TILE;
            int64_t nj = cols - j0 < TILE ? cols - j0 : TILE;
            for (int64_t i = 0; i < ni; i++)
                if (src16)
                    memcpy(tile[i], src16 + (i0 + i) * ld + j0, (size_t)nj * sizeof **tile);
                else
                    ff_bf16_pack(tile[i], src + (i0 + i) * ld + j0, (size_t)nj);
            for (int64_t j = 0; j < nj; j++)
                for (int64_t i = 0; i < ni; i++)
                    dst[(j0 + j) * rows + i0 + i] = tile[i][j];
        }
}

static int grow(ff_bf16_gemm *h, uint16_t **buf, size_t *cap, size_t elems)
{
    if (elems <= *cap)
        return FF_OK;
    uint16_t *p = realloc(*buf, elems * sizeof *p);
    if (!p)
        return ff_set_error(h->ctx, FF_ENOMEM, "out of memory (bf16 products)");
    *buf = p, *cap = elems;
    return FF_OK;
}

/* C (rows x n, leading dimension ldc) = alpha op(A) op(B) + beta C with the
 * packed bf16 operands: rows r0.. of op(A), packed m x k (a transposed A was
 * transposed when packed: oneDNN then runs the same kernels on a panel
 * whatever rows surround it), op(B) packed k x n or, transposed, n x k; a
 * and b, the packed ones (h's, or the caller's when they were packed). */
static int matmul(ff_bf16_gemm *h, const uint16_t *a, const uint16_t *b, int tb, int64_t r0,
                  int64_t rows, int64_t n, int64_t k, float alpha, float beta, float *c,
                  int64_t ldc)
{
    dnnl_dims_t ad = {rows, k}, bd = {k, n}, cd = {rows, n};
    dnnl_dims_t as = {k, 1}, bs = {tb ? 1 : n, tb ? k : 1}, cs = {ldc, 1};
    const uint16_t *ap = a + r0 * k;
    dnnl_memory_desc_t amd, bmd, cmd;
    dnnl_matmul_desc_t md;
    dnnl_primitive_attr_t attr = NULL;
    dnnl_post_ops_t po = NULL;
    dnnl_primitive_desc_t pd = NULL;
    dnnl_primitive_t prim = NULL;
    dnnl_memory_t am = NULL, bm = NULL, cm = NULL;
    const char *step = "describing a bf16 matmul";
    dnnl_status_t s = dnnl_memory_desc_init_by_strides(&amd, 2, ad, dnnl_bf16, as);
    if (s == dnnl_success)
        s = dnnl_memory_desc_init_by_strides(&bmd, 2, bd, dnnl_bf16, bs);
    if (s == dnnl_success)
        s = dnnl_memory_desc_init_by_strides(&cmd, 2, cd, dnnl_f32, cs);
    if (s == dnnl_success)
        s = dnnl_matmul_desc_init(&md, &amd, &bmd, NULL, &cmd);
    if (s == dnnl_success)
        s = dnnl_primitive_attr_create(&attr);
    if (s == dnnl_success && alpha != 1.0f)
        s = dnnl_primitive_attr_set_output_scales(attr, 1, 0, &alpha);
    if (s == dnnl_success && beta != 0.0f) { /* C = alpha A B + beta C: a sum post-op */
        s = dnnl_post_ops_create(&po);
        if (s == dnnl_success)
            s = dnnl_post_ops_append_sum(po, beta);
        if (s == dnnl_success)
            s = dnnl_primitive_attr_set_post_ops(attr, po);
    }
    if (s == dnnl_success) {
        step = "creating a bf16 matmul";
        s = dnnl_primitive_desc_create(&pd, &md, attr, h->engine, NULL);
    }
    if (s == dnnl_success)
        s = dnnl_primitive_create(&prim, pd);
    if (s == dnnl_success) {
        const char *impl = NULL;
        if (dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &impl) == dnnl_success &&
            impl)
            snprintf(h->impl, sizeof h->impl, "%s", impl);
        step = "running a bf16 matmul";
        s = dnnl_memory_create(&am, &amd, h->engine, (void *)ap);
    }
    if (s == dnnl_success)
        s = dnnl_memory_create(&bm, &bmd, h->engine, (void *)b);
    if (s == dnnl_success)
        s = dnnl_memory_create(&cm, &cmd, h->engine, c);
    if (s == dnnl_success) {
        dnnl_exec_arg_t args[3] = {{DNNL_ARG_SRC, am}, {DNNL_ARG_WEIGHTS, bm}, {DNNL_ARG_DST, cm}};
        s = dnnl_primitive_execute(prim, h->stream, 3, args);
    }
    if (s == dnnl_success)
        s = dnnl_stream_wait(h->stream);
    dnnl_memory_destroy(am), dnnl_memory_destroy(bm), dnnl_memory_destroy(cm);
    dnnl_primitive_destroy(prim);
    dnnl_primitive_desc_destroy(pd);
    dnnl_post_ops_destroy(po);
    dnnl_primitive_attr_destroy(attr);
    return s == dnnl_success ? FF_OK : dnnl_fail(h->ctx, step, s);
}

int ff_bf16_gemm_run(ff_bf16_gemm *h, const char *name, int trans_a, int trans_b, int64_t m,
                     int64_t n, int64_t k, float alpha, const float *a, int64_t lda, const float *b,
                     int64_t ldb, float beta, float *c, int64_t ldc)
{
    return ff_bf16_gemm_run2(h, name, trans_a, trans_b, m, n, k, alpha, a, NULL, lda, b, NULL, ldb,
                             beta, c, ldc);
}

int ff_bf16_gemm_run2(ff_bf16_gemm *h, const char *name, int trans_a, int trans_b, int64_t m,
                      int64_t n, int64_t k, float alpha, const float *a, const uint16_t *a16,
                      int64_t lda, const float *b, const uint16_t *b16, int64_t ldb, float beta,
                      float *c, int64_t ldc)
{
    if (m <= 0 || n <= 0)
        return FF_OK;
    int ta = trans_a ? 1 : 0, tb = trans_b ? 1 : 0, rc = FF_OK;
    /* a 2-byte operand already laid out as packed is read where it is */
    const int a_as_is = a16 && !ta && lda == k, b_as_is = b16 && ldb == (tb ? k : n);
    if ((!a_as_is && (rc = grow(h, &h->a, &h->cap_a, (size_t)(m * k)))) ||
        (!b_as_is && (rc = grow(h, &h->b, &h->cap_b, (size_t)(k * n)))))
        return rc;
    ff_trace_begin(h->ctx, name ? name : "gemm bf16");
    double t0 = ff_now();
    if (ta)
        pack_transposed(h->a, a, a16, k, m, lda);
    else if (!a_as_is)
        pack(h->a, a, a16, m, k, lda);
    if (!b_as_is)
        pack(h->b, b, b16, tb ? n : k, tb ? k : n, ldb);
    const uint16_t *ap = a_as_is ? a16 : h->a, *bp = b_as_is ? b16 : h->b;
    int64_t panel = h->panel_rows > 0 ? h->panel_rows : ff_gemm_panel_rows(m, n, k);
    for (int64_t r0 = 0; r0 < m && rc == FF_OK; r0 += panel) {
        int64_t rows = m - r0 < panel ? m - r0 : panel;
        if (k == 0) { /* no terms: C = beta C (oneDNN refuses an empty inner size) */
            for (int64_t i = r0; i < r0 + rows; i++)
                for (int64_t j = 0; j < n; j++)
                    c[i * ldc + j] = beta == 0.0f ? 0.0f : beta * c[i * ldc + j];
            continue;
        }
        rc = matmul(h, ap, bp, tb, r0, rows, n, k, alpha, beta, c + r0 * ldc, ldc);
        if (r0 + panel < m)
            ff_poll(h->ctx);
    }
    h->seconds += ff_now() - t0;
    h->flops += 2.0 * (double)m * (double)n * (double)k;
    ff_trace_end(h->ctx);
    return rc;
}

const char *ff_bf16_gemm_impl(const ff_bf16_gemm *h) { return h->impl[0] ? h->impl : "?"; }

void ff_bf16_gemm_set_panel_rows(ff_bf16_gemm *h, int64_t rows)
{
    h->panel_rows = rows > 0 ? rows : 0;
}

typedef struct {
    ff_bf16_gemm *h;
    int m, n, k;
    const float *A, *B;
    float *C;
    int rc;
} rate_job;

static void run_once(void *arg)
{
    rate_job *j = arg;
    int rc = ff_bf16_gemm_run(j->h, "rate", 0, 0, j->m, j->n, j->k, 1.0f, j->A, j->k, j->B, j->n,
                              0.0f, j->C, j->n);
    j->rc = j->rc ? j->rc : rc;
}

double ff_bf16_gemm_rate(ff_bf16_gemm *h, int m, int n, int k, int threads, double min_seconds)
{
    ff_blas_set_threads(threads);
    size_t na = (size_t)m * k, nb = (size_t)k * n, nc = (size_t)m * n;
    float *A = ff_floats_alloc(na), *B = ff_floats_alloc(nb), *C = ff_floats_alloc(nc);
    double rate = 0;
    if (A && B && C) {
        ff_rate_operands(A, B, na, nb);
        rate_job j = {h, m, n, k, A, B, C, FF_OK};
        double s = ff_median_seconds(run_once, &j, min_seconds);
        rate = j.rc == FF_OK ? 2.0 * m * n * k / s : 0.0;
    }
    ff_floats_free(A), ff_floats_free(B), ff_floats_free(C);
    ff_blas_set_threads(1);
    return rate;
}

void ff_bf16_gemm_totals(const ff_bf16_gemm *h, double *flops, double *seconds)
{
    *flops = h->flops, *seconds = h->seconds;
}

size_t ff_bf16_gemm_scratch_bytes(const ff_bf16_gemm *h)
{
    return h ? (h->cap_a + h->cap_b) * sizeof(uint16_t) : 0;
}

#else /* built without oneDNN */

size_t ff_bf16_gemm_scratch_bytes(const ff_bf16_gemm *h)
{
    (void)h;
    return 0;
}

struct ff_bf16_gemm {
    int unused;
};

int ff_bf16_gemm_available(void) { return 0; }

int ff_bf16_gemm_native(void) { return 0; }

int ff_bf16_gemm_create(ff_ctx *ctx, ff_bf16_gemm **out)
{
    *out = NULL;
    return ff_set_error(ctx, FF_EUNSUPPORTED,
                        "bf16 products on oneDNN: this build has no oneDNN (Debian: libdnnl-dev)");
}

void ff_bf16_gemm_destroy(ff_bf16_gemm *h) { (void)h; }

int ff_bf16_gemm_run(ff_bf16_gemm *h, const char *name, int trans_a, int trans_b, int64_t m,
                     int64_t n, int64_t k, float alpha, const float *a, int64_t lda, const float *b,
                     int64_t ldb, float beta, float *c, int64_t ldc)
{
    return ff_bf16_gemm_run2(h, name, trans_a, trans_b, m, n, k, alpha, a, NULL, lda, b, NULL, ldb,
                             beta, c, ldc);
}

int ff_bf16_gemm_run2(ff_bf16_gemm *h, const char *name, int trans_a, int trans_b, int64_t m,
                      int64_t n, int64_t k, float alpha, const float *a, const uint16_t *a16,
                      int64_t lda, const float *b, const uint16_t *b16, int64_t ldb, float beta,
                      float *c, int64_t ldc)
{
    (void)h, (void)name, (void)trans_a, (void)trans_b, (void)m, (void)n, (void)k, (void)alpha;
    (void)a, (void)a16, (void)lda, (void)b, (void)b16, (void)ldb, (void)beta, (void)c, (void)ldc;
    return FF_EUNSUPPORTED;
}

const char *ff_bf16_gemm_impl(const ff_bf16_gemm *h)
{
    (void)h;
    return "none";
}

void ff_bf16_gemm_set_panel_rows(ff_bf16_gemm *h, int64_t rows) { (void)h, (void)rows; }

double ff_bf16_gemm_rate(ff_bf16_gemm *h, int m, int n, int k, int threads, double min_seconds)
{
    (void)h, (void)m, (void)n, (void)k, (void)threads, (void)min_seconds;
    return 0.0;
}

void ff_bf16_gemm_totals(const ff_bf16_gemm *h, double *flops, double *seconds)
{
    (void)h;
    *flops = *seconds = 0.0;
}

#endif
