/* The compute device of a context (docs/cuda.md): the CPU, or one GPU
 * through CUDA when the library is built with FF_CUDA and the context's
 * options ask for it (ff_ctx_options.device, FF_DEVICE).
 *
 * The model's code stays one: each element-wise pass (nn/passes.h), each
 * matrix product and the attention go to ff_dev_* first, which runs them on
 * the GPU and returns 1, or returns 0 and the caller runs its CPU code. A
 * context on the GPU allocates the buffers the passes touch with
 * ff_fbuf_alloc: CUDA managed memory, which the GPU's kernels and the host's
 * code (the collectives, whatever has no GPU kernel yet) can both read, the
 * pages moving to whichever touches them; a pass whose buffers are not such
 * memory runs on the CPU (where the GPU reads pageable host memory, as with
 * HMM, any buffer will do). Every GPU call returns after its work is done, so
 * host code that follows sees its results. Internal to the library. */
#ifndef FF_DEVICE_H
#define FF_DEVICE_H

#include <stddef.h>
#include <stdint.h>

#include "fourfold/ctx.h"

struct ff_cuda;

/* The element-wise passes with a GPU twin: pass id, then its job (passes.h). */
typedef enum {
    FF_PASS_LN_SUMS,
    FF_PASS_LN_SQUARES,
    FF_PASS_LN_NORMALIZE,
    FF_PASS_LN_APPLY,
    FF_PASS_LN_BACK_SUMS,
    FF_PASS_LN_BACK_BLOCKS,
    FF_PASS_LN_BACK_SUM_BLOCKS,
    FF_PASS_GELU_FWD,
    FF_PASS_GELU_BWD,
    FF_PASS_ADD,
    FF_PASS_MUL,
    FF_PASS_ZERO,
    FF_PASS_EMBED_LOOKUP,
    FF_PASS_EMBED_ADD_POS,
    FF_PASS_EMBED_BACK,
    FF_PASS_CE_LOCAL,
    FF_PASS_CE_COMBINE,
    FF_PASS_SUMSQ,
    FF_PASS_ADAMW,
    FF_PASS_BIAS_ADD,
    FF_PASS_BIAS_GRAD,
    FF_PASS_ATTN_FWD,
    FF_PASS_ATTN_BWD,
    FF_PASS_COUNT
} ff_pass_id;

#ifdef FF_CUDA
/* Opens the GPU for a context (the node-local rank's device, round robin
 * over the node's GPUs): FF_OK, or an error on the context. */
int ff_cuda_open(ff_ctx *ctx, struct ff_cuda **out);
void ff_cuda_close(struct ff_cuda *cu);
/* Runs pass `id` over indices [0, n) of its job on the GPU: 1, or 0 where a
 * buffer of the job is not device-accessible (the caller runs the CPU's). */
int ff_cuda_pass(struct ff_cuda *cu, ff_pass_id id, int64_t n, const void *job);
/* C (m, n) = alpha op(A) op(B) + beta C, row-major as ff_gemm_run: 1 or 0. */
int ff_cuda_gemm(struct ff_cuda *cu, int ta, int tb, int64_t m, int64_t n, int64_t k, float alpha,
                 const float *a, int64_t lda, const float *b, int64_t ldb, float beta, float *c,
                 int64_t ldc);
/* The GPU's fp32 matrix-product rate (FLOP/s): the median of products of
 * m x k by k x n (zeros, TF32 off) timed with CUDA events, at least 3 and
 * until min_seconds have passed. */
double ff_cuda_sgemm_rate(struct ff_cuda *cu, int m, int n, int k, double min_seconds);
/* n floats of managed memory, zeroed; NULL unless the GPU has that much
 * free and 256 MiB more (a managed allocation beyond its memory can hang the
 * device). */
float *ff_cuda_alloc(struct ff_cuda *cu, size_t n);
/* Frees p if it is managed memory (1), else returns 0. */
int ff_cuda_free(void *p);
/* What ran where since the context opened: passes and products on the GPU,
 * and on the CPU for want of device-accessible buffers. */
void ff_cuda_counts(const struct ff_cuda *cu, int64_t *gpu, int64_t *cpu);
/* One line naming the device (name, memory, compute capability). */
const char *ff_cuda_describe(const struct ff_cuda *cu);
#endif

struct ff_cuda *ff_ctx_cuda(const ff_ctx *ctx);

/* A pass on the context's device: 1 if the GPU ran it. */
static inline int ff_dev_pass(const ff_ctx *ctx, ff_pass_id id, int64_t n, const void *job)
{
#ifdef FF_CUDA
    struct ff_cuda *cu = ff_ctx_cuda(ctx);
    return cu ? ff_cuda_pass(cu, id, n, job) : 0;
#else
    (void)ctx, (void)id, (void)n, (void)job;
    return 0;
#endif
}

/* Buffers the passes may touch (zeroed): managed memory on a GPU context,
 * on the CPU calloc, or a mapping on huge pages from 2 MiB (device.c).
 * ff_fbuf_free frees any kind. */
float *ff_fbuf_alloc(const ff_ctx *ctx, size_t n);
void ff_fbuf_free(void *p);
/* The bytes asked for (4 per float) of the buffers ff_fbuf_alloc has handed
 * out and ff_fbuf_free not yet taken back, in this process, whichever way
 * they were made (a mapping, calloc, managed memory); thread-safe. What the
 * allocator itself adds (a mapping's rounding to 4 KiB pages, calloc's
 * headers, one float for n = 0) is not counted. */
size_t ff_fbuf_live_bytes(void);
/* The bytes asked for (4 per float) when the live buffer p was made, as
 * ff_fbuf_live_bytes counts them; 0 for NULL or a pointer not handed out. */
size_t ff_fbuf_bytes(const void *p);

#endif
