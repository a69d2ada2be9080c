/* bf16-mixed precision of the GPT model (docs/design.md §13): the
 * names, what the model refuses in it, and the weights' bf16 copy that the
 * linear layers use in place of the fp32 master. The products' rounding is
 * the linear layer's (ff_linear_opts.bf16, src/nn/linear.c). */
#include <stdlib.h>
#include <string.h>

#include "device.h"
#include "gpt_internal.h"

static const char *const names[] = {"fp32", "bf16-mixed"};

const char *ff_precision_name(ff_precision p)
{
    return p >= FF_PRECISION_FP32 && p <= FF_PRECISION_BF16_MIXED ? names[p] : NULL;
}

int ff_precision_parse(const char *s, ff_precision *out)
{
    for (int p = FF_PRECISION_FP32; s && p <= FF_PRECISION_BF16_MIXED; p++)
        if (!strcmp(s, names[p])) {
            *out = (ff_precision)p;
            return FF_OK;
        }
    return FF_EINVAL;
}

static const char *const product_names[] = {"auto", "emulated", "onednn"};

const char *ff_bf16_products_name(ff_bf16_products p)
{
    return p >= FF_BF16_PRODUCTS_AUTO && p <= FF_BF16_PRODUCTS_ONEDNN ? product_names[p] : NULL;
}

int ff_bf16_products_parse(const char *s, ff_bf16_products *out)
{
    for (int p = FF_BF16_PRODUCTS_AUTO; s && p <= FF_BF16_PRODUCTS_ONEDNN; p++)
        if (!strcmp(s, product_names[p])) {
            *out = (ff_bf16_products)p;
            return FF_OK;
        }
    return FF_EINVAL;
}

int ff_gpt_precision_check(ff_gpt *g)
{
    const ff_precision p = g->opt.precision;
    if (!ff_precision_name(p))
        return ff_set_error(g->ctx, FF_EINVAL, "precision %d: expected " FF_PRECISION_CHOICES,
                            (int)p);
    if (!ff_bf16_products_name(g->opt.bf16_products))
        return ff_set_error(g->ctx, FF_EINVAL,
                            "bf16 products %d: expected " FF_BF16_PRODUCTS_CHOICES,
                            (int)g->opt.bf16_products);
    if (p == FF_PRECISION_FP32)
        return FF_OK;
    /* the precision chooses each collective's format itself */
    if (g->opt.linear.coll.wire != FF_WIRE_FP32)
        return ff_set_error(g->ctx, FF_EINVAL,
                            "bf16-mixed precision sets the format of each collective itself "
                            "(docs/design.md §13): leave the wire fp32");
    if (ff_ctx_cuda(g->ctx))
        return ff_set_error(g->ctx, FF_EUNSUPPORTED,
                            "bf16-mixed precision on the GPU backend: not supported yet");
    g->opt.linear.bf16 = 1;
    return FF_OK;
}

int ff_gpt_bf16_alloc(ff_gpt *g)
{
    if (g->opt.precision != FF_PRECISION_BF16_MIXED)
        return FF_OK;
    /* 2 bytes a weight, in floats' storage (the allocator's unit) */
    if (!(g->wbf16 = (uint16_t *)ff_fbuf_alloc(g->ctx, ff_gpt_bf16_floats(g))))
        return ff_set_error(g->ctx, FF_ENOMEM, "out of memory for the weights' bf16 copy");
    return FF_OK;
}

size_t ff_gpt_bf16_floats(const ff_gpt *g)
{
    return g->opt.precision == FF_PRECISION_BF16_MIXED ? (g->n_zsharded + 1) / 2 : 0;
}

const uint16_t *ff_gpt_used_weight(const ff_gpt *g, size_t off)
{
    return g->wbf16 ? g->wbf16 + off : NULL;
}

/* The copy step of the recipe: after every change of the master weights
 * (initialization, a scatter or load, each optimizer step) the Z-sharded
 * weights' bf16 values, 2 bytes each, which the layers gather and
 * multiply (src/nn/linear.c widens them where a product reads fp32). Under
 * SAMO with its compressed master, from that (samo.c). */
void ff_gpt_bf16_weights(ff_gpt *g)
{
    if (g->samo_p && !g->samo_dense)
        ff_gpt_samo_bf16_weights(g);
    else if (g->wbf16)
        ff_bf16_pack(g->wbf16, g->params, g->n_zsharded);
}

void ff_gpt_bf16_weights_at(ff_gpt *g, size_t off, const float *master, size_t n)
{
    ff_bf16_pack(g->wbf16 + off, master, n);
}

void ff_gpt_bf16_zero(ff_gpt *g, size_t off, size_t n)
{
    memset(g->wbf16 + off, 0, n * sizeof *g->wbf16);
}

/* The products' path (ff_bf16_products). AUTO takes oneDNN only where
 * every rank's CPU has native bf16 instructions (ff_bf16_gemm_native), so
 * that all ranks run the same kernels. It is not chosen by a timing: the two
 * paths sum in other orders, and where their rates are close (8 ranks on 2
 * cores with AMX, the test models) the faster one changed from one model to
 * the next, so two runs that must agree bit for bit (the variants of
 * tests/test_gpt.c and test_decompose.c, a resume, --zero 1 against 0) ran
 * different kernels. Both are still timed on the model's MLP product (this
 * rank's rows, 4C/Gx columns, C/Gy inner; 0.05 s each on the run's BLAS
 * threads) for the report (ff_gpt_bf16_products). */
int ff_gpt_bf16_choose(ff_gpt *g, int rc)
{
    if (g->opt.precision != FF_PRECISION_BF16_MIXED)
        return rc;
    if ((rc = ff_ctx_agree(g->ctx, rc)))
        return rc;
    g->bf16_path = FF_BF16_PRODUCTS_EMULATED;
    g->bf16_rate[0] = g->bf16_rate[1] = 0;
    if (g->opt.bf16_products == FF_BF16_PRODUCTS_EMULATED)
        return FF_OK;
    if (!ff_bf16_gemm_available() && g->opt.bf16_products == FF_BF16_PRODUCTS_AUTO)
        return FF_OK; /* (a property of the build: alike on every rank) */
    if ((rc = ff_ctx_agree(g->ctx, ff_bf16_gemm_create(g->ctx, &g->bf16mm))))
        return rc;
    int onednn = 1;
    if (g->opt.bf16_products == FF_BF16_PRODUCTS_AUTO) {
        const int threads = ff_ctx_blas_threads(g->ctx);
        int m = (int)(g->m < 64 ? 64 : g->m > 2048 ? 2048 : g->m);
        int n = (int)(g->fx < 16 ? 16 : g->fx), k = (int)(g->cy < 16 ? 16 : g->cy);
        g->bf16_rate[0] = ff_bf16_gemm_rate(g->bf16mm, m, n, k, threads, 0.05);
        g->bf16_rate[1] = ff_sgemm_rate(m, n, k, threads, 0.05);
        ff_blas_set_threads(threads); /* (the rates leave the BLAS on one) */
        onednn = ff_bf16_gemm_native();
        if (MPI_Allreduce(MPI_IN_PLACE, &onednn, 1, MPI_INT, MPI_MIN, ff_ctx_comm(g->ctx)) !=
            MPI_SUCCESS)
            return ff_set_error(g->ctx, FF_EMPI,
                                "MPI_Allreduce (the bf16 products' choice) failed");
    }
    if (!onednn) {
        ff_bf16_gemm_destroy(g->bf16mm);
        g->bf16mm = NULL;
        return FF_OK;
    }
    g->bf16_path = FF_BF16_PRODUCTS_ONEDNN;
    ff_gemm_set_bf16(ff_linear_seq_gemm(g->seq), g->bf16mm);
    return FF_OK;
}

ff_bf16_products ff_gpt_bf16_products(const ff_gpt *g, double *onednn_flops, double *blas_flops)
{
    if (onednn_flops)
        *onednn_flops = g->bf16_rate[0];
    if (blas_flops)
        *blas_flops = g->bf16_rate[1];
    return g->opt.precision == FF_PRECISION_BF16_MIXED ? g->bf16_path : FF_BF16_PRODUCTS_AUTO;
}
