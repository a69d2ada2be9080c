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

int ff_gpt_precision_check(ff_gpt *g)
{
    const ff_precision p = g->opt.precision;
    if (!ff_precision_name(p))
        return ff_set_error(g->ctx, FF_EINVAL, "precision %d: expected " FF_PRECISION_CHOICES,
                            (int)p);
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

int ff_gpt_refuse_mixed(ff_gpt *g, const char *what)
{
    if (g->opt.precision == FF_PRECISION_FP32)
        return FF_OK;
    return ff_set_error(g->ctx, FF_EUNSUPPORTED, "%s in bf16-mixed precision: not supported yet",
                        what);
}

int ff_gpt_bf16_alloc(ff_gpt *g)
{
    if (g->opt.precision != FF_PRECISION_BF16_MIXED)
        return FF_OK;
    if (!(g->wbf16 = ff_fbuf_alloc(g->ctx, g->n_zsharded ? g->n_zsharded : 1)))
        return ff_set_error(g->ctx, FF_ENOMEM, "out of memory for the weights' bf16 copy");
    return FF_OK;
}

float *ff_gpt_used_weight(const ff_gpt *g, float *master)
{
    return g->wbf16 && master ? g->wbf16 + (master - g->params) : master;
}

/* The copy step of the recipe: after every change of the master weights
 * (initialization, a scatter or load, each optimizer step) the Z-sharded
 * weights' bf16 values, which the layers multiply and gather. (The
 * emulation keeps them widened to fp32 words, as the BLAS reads them.) */
void ff_gpt_bf16_weights(ff_gpt *g)
{
    if (g->wbf16)
        ff_bf16_round_copy(g->wbf16, g->params, g->n_zsharded);
}
