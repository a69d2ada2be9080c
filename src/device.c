/* The compute device's allocation and lookup (device.h); the GPU's side is
 * cuda/backend.cu. */
#include "device.h"

#include <stdlib.h>

#include "internal.h"

struct ff_cuda *ff_ctx_cuda(const ff_ctx *ctx) { return ctx ? ctx->cuda : NULL; }

const char *ff_ctx_device(const ff_ctx *ctx)
{
#ifdef FF_CUDA
    if (ctx->cuda)
        return ff_cuda_describe(ctx->cuda);
#endif
    (void)ctx;
    return "cpu";
}

void ff_ctx_device_work(const ff_ctx *ctx, long long *gpu, long long *cpu)
{
    int64_t g = 0, c = 0;
#ifdef FF_CUDA
    if (ctx->cuda)
        ff_cuda_counts(ctx->cuda, &g, &c);
#endif
    (void)ctx;
    *gpu = (long long)g;
    *cpu = (long long)c;
}

float *ff_fbuf_alloc(const ff_ctx *ctx, size_t n)
{
#ifdef FF_CUDA
    if (ctx && ctx->cuda)
        return ff_cuda_alloc(ctx->cuda, n ? n : 1);
#else
    (void)ctx;
#endif
    return calloc(n ? n : 1, sizeof(float));
}

void ff_fbuf_free(void *p)
{
    if (!p)
        return;
#ifdef FF_CUDA
    if (ff_cuda_free(p))
        return;
#endif
    free(p);
}
