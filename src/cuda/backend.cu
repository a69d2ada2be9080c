/* The CUDA backend (device.h, docs/cuda.md): the model's passes as CUDA
 * kernels, its matrix products through cuBLAS, its buffers in managed
 * memory.
 *
 * Each kernel runs the CPU pass's arithmetic for each output element (nn/passes.h,
 * built without contractions into FMAs), spread over the GPU in one of two
 * ways (docs/cuda.md, "Kernels"): a thread per element or per block of rows
 * and column, where each output has a sum of its own (the CPU's bits for
 * given inputs, but where CUDA's expf, exp or log enter, whose last bits may
 * differ from glibc's), or a warp per row, where a row has one sum (the
 * CPU's sum in another order, as another grid's). The matrix products are
 * cuBLAS's, in fp32 without TF32: their sums run in another order than
 * OpenBLAS's, which the tests' bounds allow for as they do for another grid.
 *
 * Every call returns after its work has finished (the stream is
 * synchronised), so the host code around it (the collectives, the passes
 * without a kernel) reads finished results. A CUDA error inside a call is a
 * bug or a lost device: the process stops with its name. */
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

extern "C" {
#include "device.h"
#include "fourfold/gemm.h"
#include "nn/gpt_ops.h"
}
#include "nn/passes.h"

struct ff_cuda {
    int dev, pageable, concurrent;
    cudaStream_t st;
    cublasHandle_t blas;
    void *scratch; /* device memory: staged tokens, attention's scores */
    size_t scratch_bytes;
    int64_t n_gpu, n_cpu;
    int64_t cpu_by[FF_PASS_COUNT + 1]; /* passes on the CPU by id; the products last */
    int profile;                        /* FF_CUDA_PROFILE=1: time each call (they are synchronous) */
    double sec_by[FF_PASS_COUNT + 1];   /* seconds on the GPU by id; the products last */
    int64_t calls_by[FF_PASS_COUNT + 1];
    char desc[1024];
};

/* set once managed memory has been allocated: until then ff_cuda_free needs
 * not ask the runtime about a pointer */
static int any_managed;

static void die(const char *what, const char *err)
{
    fprintf(stderr, "fourfold: CUDA error in %s: %s\n", what, err);
    abort();
}

#define CK(call)                                                                                   \
    do {                                                                                           \
        cudaError_t e_ = (call);                                                                   \
        if (e_ != cudaSuccess)                                                                     \
            die(#call, cudaGetErrorString(e_));                                                    \
    } while (0)

#define CKB(call)                                                                                  \
    do {                                                                                           \
        cublasStatus_t s_ = (call);                                                                \
        if (s_ != CUBLAS_STATUS_SUCCESS)                                                           \
            die(#call, cublasGetStatusString(s_));                                                 \
    } while (0)

static void finish(ff_cuda *cu, const char *what)
{
    cudaError_t e = cudaGetLastError();
    if (e == cudaSuccess)
        e = cudaStreamSynchronize(cu->st);
    if (e != cudaSuccess)
        die(what, cudaGetErrorString(e));
}

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* FF_CUDA_PROFILE=1: the GPU's calls by pass (each returns finished, so the
 * host's clock around it is the call's time, launch included) */
static void account(ff_cuda *cu, int id, double t0)
{
    if (!cu->profile)
        return;
    cu->sec_by[id] += now_s() - t0;
    cu->calls_by[id]++;
}

/* ---- opening, memory ------------------------------------------------------------- */

extern "C" int ff_cuda_open(ff_ctx *ctx, ff_cuda **out)
{
    *out = NULL;
    MPI_Comm node;
    int local = 0;
    if (MPI_Comm_split_type(ff_ctx_comm(ctx), MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node) ==
        MPI_SUCCESS) {
        MPI_Comm_rank(node, &local);
        MPI_Comm_free(&node);
    }
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess || n == 0)
        return ff_ctx_set_error(ctx, FF_EUNSUPPORTED, "device 'cuda': no GPU found (%s)",
                                e != cudaSuccess ? cudaGetErrorString(e) : "none listed");
    ff_cuda *cu = (ff_cuda *)calloc(1, sizeof *cu);
    if (!cu)
        return ff_ctx_set_error(ctx, FF_ENOMEM, "out of memory opening the GPU");
    cu->dev = local % n;
    cudaDeviceProp prop;
    if ((e = cudaSetDevice(cu->dev)) != cudaSuccess ||
        (e = cudaGetDeviceProperties(&prop, cu->dev)) != cudaSuccess ||
        (e = cudaStreamCreateWithFlags(&cu->st, cudaStreamNonBlocking)) != cudaSuccess) {
        free(cu);
        return ff_ctx_set_error(ctx, FF_EUNSUPPORTED, "device 'cuda': GPU %d: %s", local % n,
                                cudaGetErrorString(e));
    }
    cudaDeviceGetAttribute(&cu->pageable, cudaDevAttrPageableMemoryAccess, cu->dev);
    cudaDeviceGetAttribute(&cu->concurrent, cudaDevAttrConcurrentManagedAccess, cu->dev);
    if (!cu->concurrent) {
        cudaStreamDestroy(cu->st);
        free(cu);
        return ff_ctx_set_error(ctx, FF_EUNSUPPORTED,
                                "device 'cuda': GPU %d cannot share managed memory with the host "
                                "while it computes (concurrentManagedAccess 0)",
                                local % n);
    }
    if (cublasCreate(&cu->blas) != CUBLAS_STATUS_SUCCESS) {
        cudaStreamDestroy(cu->st);
        free(cu);
        return ff_ctx_set_error(ctx, FF_EUNSUPPORTED, "device 'cuda': cuBLAS did not start");
    }
    const char *prof = getenv("FF_CUDA_PROFILE");
    cu->profile = prof && *prof == '1';
    /* fp32 products in fp32: no TF32 (docs/cuda.md) */
    CKB(cublasSetMathMode(cu->blas, CUBLAS_DEFAULT_MATH));
    CKB(cublasSetStream(cu->blas, cu->st));
    snprintf(cu->desc, sizeof cu->desc,
             "GPU %d of %d: %s, %.1f GiB, compute capability %d.%d, %d multiprocessors; managed "
             "memory shared while computing: %d, pageable host memory readable: %d",
             cu->dev, n, prop.name, (double)prop.totalGlobalMem / (1 << 30), prop.major, prop.minor,
             prop.multiProcessorCount, cu->concurrent, cu->pageable);
    *out = cu;
    return FF_OK;
}

extern "C" void ff_cuda_close(ff_cuda *cu)
{
    if (!cu)
        return;
    const char *report = getenv("FF_CUDA_REPORT"); /* which calls ran on the CPU */
    for (int i = 0; report && *report == '1' && i <= FF_PASS_COUNT; i++)
        if (cu->cpu_by[i])
            fprintf(stderr, "fourfold: CUDA: %s %d ran %lld times on the CPU\n",
                    i < FF_PASS_COUNT ? "pass" : "products", i, (long long)cu->cpu_by[i]);
    double total = 0;
    for (int i = 0; cu->profile && i <= FF_PASS_COUNT; i++)
        total += cu->sec_by[i];
    for (int i = 0; cu->profile && i <= FF_PASS_COUNT; i++)
        if (cu->calls_by[i])
            fprintf(stderr, "fourfold: CUDA profile: %s %2d: %8lld calls %10.3f s %5.1f %%\n",
                    i < FF_PASS_COUNT ? "pass" : "products", i, (long long)cu->calls_by[i],
                    cu->sec_by[i], 100 * cu->sec_by[i] / (total > 0 ? total : 1));
    cudaStreamSynchronize(cu->st);
    if (cu->scratch)
        cudaFree(cu->scratch);
    cublasDestroy(cu->blas);
    cudaStreamDestroy(cu->st);
    free(cu);
}

extern "C" const char *ff_cuda_describe(const ff_cuda *cu) { return cu->desc; }

extern "C" void ff_cuda_counts(const ff_cuda *cu, int64_t *gpu, int64_t *cpu)
{
    *gpu = cu->n_gpu;
    *cpu = cu->n_cpu;
}

extern "C" float *ff_cuda_alloc(ff_cuda *cu, size_t n)
{
    size_t bytes = n * sizeof(float), avail = 0, total = 0;
    CK(cudaSetDevice(cu->dev));
    void *p = NULL;
    if (cudaMemGetInfo(&avail, &total) != cudaSuccess || bytes + ((size_t)256 << 20) > avail ||
        cudaMallocManaged(&p, bytes, cudaMemAttachGlobal) != cudaSuccess) {
        cudaGetLastError(); /* clear it: the caller reports out of memory */
        return NULL;
    }
    any_managed = 1;
    CK(cudaMemsetAsync(p, 0, bytes, cu->st));
    finish(cu, "zeroing a new buffer");
    return (float *)p;
}

static int is_managed(const void *p)
{
    cudaPointerAttributes a;
    if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
        cudaGetLastError(); /* clear it */
        return 0;
    }
    return a.type == cudaMemoryTypeManaged;
}

extern "C" int ff_cuda_free(void *p)
{
    if (!any_managed || !is_managed(p))
        return 0;
    CK(cudaFree(p));
    return 1;
}

/* p can be read by the GPU's kernels: managed or device memory, or any
 * memory where the GPU reads pageable host memory */
static int reach(const ff_cuda *cu, const void *p)
{
    if (!p || cu->pageable)
        return 1;
    cudaPointerAttributes a;
    if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
        cudaGetLastError();
        return 0;
    }
    return a.type == cudaMemoryTypeManaged || a.type == cudaMemoryTypeDevice;
}

/* Device scratch of at least `bytes`, or NULL (the pass then runs on the CPU). */
static void *scratch(ff_cuda *cu, size_t bytes)
{
    if (bytes > cu->scratch_bytes) {
        if (cu->scratch)
            CK(cudaFree(cu->scratch));
        cu->scratch = NULL;
        cu->scratch_bytes = 0;
        if (cudaMalloc(&cu->scratch, bytes) != cudaSuccess) {
            cudaGetLastError();
            cu->scratch = NULL;
            return NULL;
        }
        cu->scratch_bytes = bytes;
    }
    return cu->scratch;
}

/* host or managed integers to device scratch at byte offset `at` */
static const int32_t *stage_ints(ff_cuda *cu, const int32_t *v, int64_t n, size_t at)
{
    int32_t *d = (int32_t *)((char *)cu->scratch + at);
    CK(cudaMemcpyAsync(d, v, (size_t)n * sizeof(int32_t), cudaMemcpyDefault, cu->st));
    return d;
}

/* ---- kernels ------------------------------------------------------------------------ */

/* blocks of `threads` for n threads' work (the kernels loop past 65535 blocks) */
static int grid_for(int64_t n, int threads)
{
    int64_t b = (n + threads - 1) / threads;
    return (int)(b < 1 ? 1 : (b > 65535 ? 65535 : b));
}

#define FOR_INDEX(i, n)                                                                            \
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n);                      \
         i += (int64_t)gridDim.x * blockDim.x)

/* A warp per row for the row reductions: lane l takes columns l, l + 32, ...
 * and the lanes' partial sums meet in a butterfly. The sums are the CPU's
 * (in double where its are) in another order, as another grid's are. */
#define WARP 32
#define FOR_ROW_WARP(i, n)                                                                         \
    for (int64_t i = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) / WARP; i < (n);             \
         i += (int64_t)gridDim.x * blockDim.x / WARP)

static __device__ double warp_sum(double v)
{
    for (int o = WARP / 2; o > 0; o /= 2)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

static __device__ float warp_sumf(float v)
{
    for (int o = WARP / 2; o > 0; o /= 2)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

static __device__ float warp_max(float v)
{
    for (int o = WARP / 2; o > 0; o /= 2) {
        float u = __shfl_xor_sync(0xffffffffu, v, o);
        v = u > v ? u : v;
    }
    return v;
}

/* row i: the sum of its columns in double (ff_ln_sums_at) */
__global__ void k_ln_sums(ln_job j, int64_t n)
{
    const int lane = threadIdx.x % WARP;
    FOR_ROW_WARP(i, n)
    {
        const float *x = j.inp + i * j.cl;
        double s = 0;
        for (int64_t c = lane; c < j.cl; c += WARP)
            s += x[c];
        s = warp_sum(s);
        if (lane == 0)
            j.mean[i] = (float)s;
    }
}

/* row i: the mean, the sum of squared deviations in double (ff_ln_squares_at) */
__global__ void k_ln_squares(ln_job j, int64_t n)
{
    const int lane = threadIdx.x % WARP;
    FOR_ROW_WARP(i, n)
    {
        const float *x = j.inp + i * j.cl;
        const float mu = j.mean[i] / (float)j.C;
        double s = 0;
        for (int64_t c = lane; c < j.cl; c += WARP) {
            double dx = (double)x[c] - mu;
            s += dx * dx;
        }
        s = warp_sum(s);
        __syncwarp();
        if (lane == 0) {
            j.mean[i] = mu;
            j.rstd[i] = (float)s;
        }
    }
}

/* rstd from the all-reduced squares (ff_ln_normalize_at's finish) */
__global__ void k_ln_rstd(ln_job j, int64_t n)
{
    FOR_INDEX(i, n) { ff_ln_rstd_at(&j, i); }
}

/* a thread per element */
__global__ void k_ln_normalize(ln_job j, int64_t n)
{
    FOR_INDEX(e, n * j.cl) { ff_ln_out_at(&j, e / j.cl, e % j.cl); }
}

/* row i: sum(dnorm) and sum(dnorm * norm) in double (ff_ln_back_sums_at) */
__global__ void k_ln_back_sums(ln_job j, int64_t n)
{
    const int lane = threadIdx.x % WARP;
    FOR_ROW_WARP(i, n)
    {
        const float *x = j.inp + i * j.cl, *g = j.dout + i * j.cl;
        const float mu = j.mean[i], r = j.rstd[i];
        double s1 = 0, s2 = 0;
        for (int64_t c = lane; c < j.cl; c += WARP) {
            float norm = (x[c] - mu) * r, dnorm = j.w[c] * g[c];
            s1 += dnorm;
            s2 += (double)dnorm * norm;
        }
        s1 = warp_sum(s1);
        s2 = warp_sum(s2);
        if (lane == 0) {
            j.stats[2 * i] = (float)s1;
            j.stats[2 * i + 1] = (float)s2;
        }
    }
}

/* a thread per (block of rows, column): ff_ln_back_block_at's sums for its
 * column, rows in order, so the CPU's bits */
__global__ void k_ln_back_blocks(ln_job j, int64_t n)
{
    const int64_t cl = j.cl;
    FOR_INDEX(e, n * cl)
    {
        const int64_t blk = e / cl, c = e % cl;
        float *pdw = j.part + 2 * blk * cl, *pdb = pdw + cl;
        float sw = 0.0f, sb = 0.0f;
        const int64_t end = (blk + 1) * FF_LN_BLOCK < j.m ? (blk + 1) * FF_LN_BLOCK : j.m;
        for (int64_t i = blk * FF_LN_BLOCK; i < end; i++)
            ff_ln_back_at(&j, i, c, &sw, &sb);
        pdw[c] = sw;
        pdb[c] = sb;
    }
}

__global__ void k_ln_back_sum_blocks(ln_job j, int64_t n)
{
    const int64_t cl = j.cl, nb = (j.m + FF_LN_BLOCK - 1) / FF_LN_BLOCK;
    FOR_INDEX(c, n)
    {
        for (int64_t blk = 0; blk < nb; blk++) {
            const float *pdw = j.part + 2 * blk * cl, *pdb = pdw + cl;
            j.dw[c] += pdw[c];
            j.db[c] += pdb[c];
        }
    }
}

__global__ void k_elem(elem_job j, int64_t n, int op)
{
    FOR_INDEX(i, n)
    {
        if (op == FF_PASS_GELU_FWD)
            j.out[i] = ff_gelu(j.inp[i]);
        else if (op == FF_PASS_GELU_BWD)
            j.out[i] = ff_gelu_grad(j.inp[i]) * j.dout[i];
        else if (op == FF_PASS_MUL)
            j.out[i] = j.inp[i] * j.dout[i];
        else
            j.out[i] = j.inp[i] + j.dout[i];
    }
}

__global__ void k_embed_lookup(embed_job j, int64_t n)
{
    FOR_INDEX(e, n * j.cl)
    {
        int64_t i = e / j.cl, c = e % j.cl, v = (int64_t)j.tokens[i] - j.v0;
        j.out[e] = v >= 0 && v < j.vl ? j.wte[v * j.cl + c] : 0.0f;
    }
}

__global__ void k_embed_add_pos(embed_job j, int64_t n)
{
    FOR_INDEX(e, n * j.cl)
    {
        int64_t i = e / j.cl, c = e % j.cl;
        j.out[e] += j.wpe[(i % j.T) * j.cl + c];
    }
}

__global__ void k_embed_back(embed_job j, int64_t n)
{
    FOR_INDEX(c, n)
    {
        for (int64_t i = 0; i < j.m; i++) {
            float g = j.dout[i * j.cl + c];
            j.dwpe[(i % j.T) * j.cl + c] += g;
            int64_t v = (int64_t)j.tokens[i] - j.v0;
            if (v >= 0 && v < j.vl)
                j.dwte[v * j.cl + c] += g;
        }
    }
}

/* a warp per row: the local max, the target's logit, exp(l - max) in place
 * (training) and its sum in double */
__global__ void k_ce_local(ce_job j, int64_t n)
{
    const int lane = threadIdx.x % WARP;
    FOR_ROW_WARP(i, n)
    {
        float *row = j.logits + i * j.vl, mx = -INFINITY;
        for (int64_t c = lane; c < j.valid; c += WARP)
            mx = row[c] > mx ? row[c] : mx;
        mx = warp_max(mx);
        double sum = 0;
        for (int64_t c = lane; c < j.valid; c += WARP) {
            float e = ff_exp_fast(row[c] - mx);
            sum += e;
            if (j.dscale != 0.0f) /* the target's logit is read before (below: lane 0) */
                row[c] = e;
        }
        sum = warp_sum(sum);
        if (lane == 0) {
            j.mine[3 * i] = mx;
            j.mine[3 * i + 1] = (float)sum;
        }
    }
}

/* the target's logit, before k_ce_local overwrites the row (a thread per row) */
__global__ void k_ce_target(ce_job j, int64_t n)
{
    FOR_INDEX(i, n)
    {
        const int64_t t = (int64_t)j.targets[i] - j.v0;
        j.mine[3 * i + 2] = t >= 0 && t < j.valid ? j.logits[i * j.vl + t] : 0.0f;
    }
}

/* a warp per row: the loss (every lane computes it, lane 0 writes), then the
 * row's gradient strided over the lanes (ff_ce_grad_at: the CPU's formula;
 * its factor comes through CUDA's expf, exp and log) */
__global__ void k_ce_combine(ce_job j, int64_t n)
{
    const int lane = threadIdx.x % WARP;
    FOR_ROW_WARP(i, n)
    {
        const float f = ff_ce_loss_at(&j, i); /* every lane writes losses[i], the same value */
        if (j.dscale != 0.0f)
            for (int64_t c = lane; c < j.vl; c += WARP)
                ff_ce_grad_at(&j, i, c, f);
    }
}

__global__ void k_sumsq(sumsq_job j, int64_t n)
{
    FOR_INDEX(b, n) { ff_sumsq_block_at(&j, b); }
}

__global__ void k_adamw(adamw_job j, int64_t n)
{
    FOR_INDEX(i, n)
    {
        const float decay = (size_t)i < j.n_decay ? j.wd : 0.0f;
        ff_adamw_at(&j.p[i], &j.m[i], &j.v[i], j.gr[i] * j.grad_scale, j.b1, j.b2, j.bc1, j.bc2,
                    j.lr, j.eps, decay);
    }
}

__global__ void k_bias_add(bias_job j)
{
    FOR_INDEX(e, j.rows * j.nl) { j.out[j.r0 * j.nl + e] += j.b[e % j.nl]; }
}

/* the bias gradient (passes.h): a thread per (block of rows, column) sums
 * its block from zero into part, then a thread per column adds the blocks to
 * db in order: the CPU's bits */
__global__ void k_bias_grad_blocks(bias_job j, float *part, int64_t nb)
{
    FOR_INDEX(e, nb * j.nl)
    {
        const int64_t blk = e / j.nl, c = e % j.nl;
        const int64_t i1 = (blk + 1) * FF_BIAS_BLOCK < j.rows ? (blk + 1) * FF_BIAS_BLOCK : j.rows;
        float s = 0.0f;
        for (int64_t i = blk * FF_BIAS_BLOCK; i < i1; i++)
            s += j.dout[i * j.nl + c];
        part[e] = s;
    }
}

__global__ void k_bias_grad(bias_job j, const float *part, int64_t nb)
{
    FOR_INDEX(c, j.nl)
    {
        float d = j.db[c];
        for (int64_t blk = 0; blk < nb; blk++)
            d += part[blk * j.nl + c];
        j.db[c] = d;
    }
}

/* causal softmax of the rows of (B nh) T x T scores, as attn_fwd's
 * (ff_softmax_causal_row), a warp per row: the sum in another order */
__global__ void k_softmax(float *att, int64_t rows, int T)
{
    const int lane = threadIdx.x % WARP;
    FOR_ROW_WARP(r, rows)
    {
        float *row = att + r * T;
        const int t = (int)(r % T);
        float mx = -INFINITY, sum = 0.0f;
        for (int u = lane; u <= t; u += WARP)
            mx = row[u] > mx ? row[u] : mx;
        mx = warp_max(mx);
        for (int u = lane; u <= t; u += WARP) {
            row[u] = expf(row[u] - mx);
            sum += row[u];
        }
        const float inv = 1.0f / warp_sumf(sum);
        for (int u = lane; u < T; u += WARP)
            row[u] = u <= t ? row[u] * inv : 0.0f;
    }
}

/* ds = p * (dp - sum_u p dp), zero above the diagonal, as attn_bwd's
 * (ff_softmax_causal_back_row), a warp per row */
__global__ void k_softmax_back(float *dp, const float *pa, int64_t rows, int T)
{
    const int lane = threadIdx.x % WARP;
    FOR_ROW_WARP(r, rows)
    {
        float *dr = dp + r * T;
        const float *pr = pa + r * T;
        const int t = (int)(r % T);
        float dot = 0.0f;
        for (int u = lane; u <= t; u += WARP)
            dot += pr[u] * dr[u];
        dot = warp_sumf(dot);
        for (int u = lane; u < T; u += WARP)
            dr[u] = u <= t ? pr[u] * (dr[u] - dot) : 0.0f;
    }
}

/* ---- products ------------------------------------------------------------------------ */

/* Row-major C (m, n) = alpha op(A) op(B) + beta C as cuBLAS's column-major
 * C^T = op(B)^T op(A)^T, `batch` times with the given strides. */
static void rm_gemm(ff_cuda *cu, int ta, int tb, int64_t m, int64_t n, int64_t k, float alpha,
                    const float *a, int64_t lda, long long sa, const float *b, int64_t ldb,
                    long long sb, float beta, float *c, int64_t ldc, long long sc, int batch)
{
    cublasOperation_t oa = ta ? CUBLAS_OP_T : CUBLAS_OP_N, ob = tb ? CUBLAS_OP_T : CUBLAS_OP_N;
    if (batch == 1)
        CKB(cublasSgemm(cu->blas, ob, oa, (int)n, (int)m, (int)k, &alpha, b, (int)ldb, a, (int)lda,
                        &beta, c, (int)ldc));
    else
        CKB(cublasSgemmStridedBatched(cu->blas, ob, oa, (int)n, (int)m, (int)k, &alpha, b, (int)ldb,
                                      sb, a, (int)lda, sa, &beta, c, (int)ldc, sc, batch));
}

extern "C" int ff_cuda_gemm(ff_cuda *cu, int ta, int tb, int64_t m, int64_t n, int64_t k,
                            float alpha, const float *a, int64_t lda, const float *b, int64_t ldb,
                            float beta, float *c, int64_t ldc)
{
    if (!reach(cu, a) || !reach(cu, b) || !reach(cu, c)) {
        cu->n_cpu++;
        cu->cpu_by[FF_PASS_COUNT]++;
        return 0;
    }
    const double t0 = cu->profile ? now_s() : 0;
    rm_gemm(cu, ta, tb, m, n, k, alpha, a, lda, 0, b, ldb, 0, beta, c, ldc, 0, 1);
    finish(cu, "a matrix product");
    account(cu, FF_PASS_COUNT, t0);
    cu->n_gpu++;
    return 1;
}

extern "C" double ff_cuda_sgemm_rate(ff_cuda *cu, int m, int n, int k, double min_seconds)
{
    float *a, *b, *c;
    CK(cudaMalloc(&a, (size_t)m * k * sizeof(float)));
    CK(cudaMalloc(&b, (size_t)k * n * sizeof(float)));
    CK(cudaMalloc(&c, (size_t)m * n * sizeof(float)));
    CK(cudaMemsetAsync(a, 0, (size_t)m * k * sizeof(float), cu->st));
    CK(cudaMemsetAsync(b, 0, (size_t)k * n * sizeof(float), cu->st));
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    rm_gemm(cu, 0, 0, m, n, k, 1.0f, a, k, 0, b, n, 0, 0.0f, c, n, 0, 1); /* warm-up */
    enum { MAX_RUNS = 1000 };
    double t[MAX_RUNS], total = 0;
    int runs = 0;
    while (runs < MAX_RUNS && (runs < 3 || total < min_seconds)) {
        float ms = 0;
        CK(cudaEventRecord(e0, cu->st));
        rm_gemm(cu, 0, 0, m, n, k, 1.0f, a, k, 0, b, n, 0, 0.0f, c, n, 0, 1);
        CK(cudaEventRecord(e1, cu->st));
        CK(cudaEventSynchronize(e1));
        CK(cudaEventElapsedTime(&ms, e0, e1));
        t[runs] = ms * 1e-3;
        total += t[runs++];
    }
    CK(cudaEventDestroy(e0));
    CK(cudaEventDestroy(e1));
    CK(cudaFree(a));
    CK(cudaFree(b));
    CK(cudaFree(c));
    return 2.0 * m * n * k / ff_median(t, runs);
}

/* attention (attn_fwd, attn_bwd): per sequence, the heads as one batch */
static void attention(ff_cuda *cu, const attn_job *j, int backward)
{
    const int T = j->T, hs = j->hs, nh = j->nh;
    const int64_t c = (int64_t)nh * hs, c3 = 3 * c, tt = (int64_t)T * T;
    const float scale = 1.0f / sqrtf((float)hs);
    const int threads = 256;
    const int64_t rows = (int64_t)nh * T;
    const int blocks = grid_for(rows * WARP, threads);
    float *dp = (float *)cu->scratch; /* backward: nh T T floats, reserved by the caller */
    for (int b = 0; b < j->B; b++) {
        const float *q = j->qkv + (int64_t)b * T * c3, *kk = q + c, *v = q + 2 * c;
        if (!backward) {
            float *p = j->att + (int64_t)b * nh * tt;
            rm_gemm(cu, 0, 1, T, T, hs, scale, q, c3, hs, kk, c3, hs, 0.0f, p, T, tt, nh);
            k_softmax<<<blocks, threads, 0, cu->st>>>(p, rows, T);
            rm_gemm(cu, 0, 0, T, hs, T, 1.0f, p, T, tt, v, c3, hs, 0.0f,
                    j->out + (int64_t)b * T * c, c, hs, nh);
            continue;
        }
        const float *pa = j->patt + (int64_t)b * nh * tt, *g = j->dout + (int64_t)b * T * c;
        float *dq = j->dqkv + (int64_t)b * T * c3, *dk = dq + c, *dv = dq + 2 * c;
        rm_gemm(cu, 0, 1, T, T, hs, 1.0f, g, c, hs, v, c3, hs, 0.0f, dp, T, tt, nh);
        rm_gemm(cu, 1, 0, T, hs, T, 1.0f, pa, T, tt, g, c, hs, 0.0f, dv, c3, hs, nh);
        k_softmax_back<<<blocks, threads, 0, cu->st>>>(dp, pa, rows, T);
        rm_gemm(cu, 0, 0, T, hs, T, scale, dp, T, tt, kk, c3, hs, 0.0f, dq, c3, hs, nh);
        rm_gemm(cu, 1, 0, T, hs, T, scale, dp, T, tt, q, c3, hs, 0.0f, dk, c3, hs, nh);
    }
}

/* ---- passes ----------------------------------------------------------------------------- */


extern "C" int ff_cuda_pass(ff_cuda *cu, ff_pass_id id, int64_t n, const void *job)
{
    const int th = 128;
    const float *p[8] = {0};
    double t0;
    if (n <= 0) /* nothing to do (and its pointers may be one past a buffer) */
        return 1;
    switch (id) { /* the buffers the kernel reads or writes */
    case FF_PASS_LN_SUMS:
    case FF_PASS_LN_SQUARES:
    case FF_PASS_LN_NORMALIZE:
    case FF_PASS_LN_APPLY:
    case FF_PASS_LN_BACK_SUMS:
    case FF_PASS_LN_BACK_BLOCKS:
    case FF_PASS_LN_BACK_SUM_BLOCKS: {
        const ln_job *j = (const ln_job *)job;
        const float *q[8] = {j->out, j->mean, j->rstd, j->dinp, j->dw, j->db, j->stats, j->part};
        const float *r[4] = {j->inp, j->w, j->b, j->dout};
        for (int i = 0; i < 8; i++)
            if (!reach(cu, q[i]))
                goto cpu;
        for (int i = 0; i < 4; i++)
            if (!reach(cu, r[i]))
                goto cpu;
        break;
    }
    case FF_PASS_GELU_FWD:
    case FF_PASS_GELU_BWD:
    case FF_PASS_ADD:
    case FF_PASS_MUL:
    case FF_PASS_ZERO: {
        const elem_job *j = (const elem_job *)job;
        p[0] = j->out, p[1] = j->inp, p[2] = j->dout;
        break;
    }
    case FF_PASS_EMBED_LOOKUP:
    case FF_PASS_EMBED_ADD_POS:
    case FF_PASS_EMBED_BACK: {
        const embed_job *j = (const embed_job *)job;
        p[0] = j->out, p[1] = j->dwte, p[2] = j->dwpe, p[3] = j->wte, p[4] = j->wpe, p[5] = j->dout;
        break;
    }
    case FF_PASS_CE_LOCAL:
    case FF_PASS_CE_COMBINE: {
        const ce_job *j = (const ce_job *)job;
        p[0] = j->losses, p[1] = j->logits, p[2] = j->mine, p[3] = j->all;
        break;
    }
    case FF_PASS_SUMSQ: {
        const sumsq_job *j = (const sumsq_job *)job;
        p[0] = j->p, p[1] = (const float *)j->part;
        break;
    }
    case FF_PASS_ADAMW: {
        const adamw_job *j = (const adamw_job *)job;
        p[0] = j->p, p[1] = j->m, p[2] = j->v, p[3] = j->gr;
        break;
    }
    case FF_PASS_BIAS_ADD:
    case FF_PASS_BIAS_GRAD: {
        const bias_job *j = (const bias_job *)job;
        p[0] = j->out, p[1] = j->db, p[2] = j->b, p[3] = j->dout;
        break;
    }
    case FF_PASS_ATTN_FWD:
    case FF_PASS_ATTN_BWD: {
        const attn_job *j = (const attn_job *)job;
        p[0] = j->out, p[1] = j->att, p[2] = j->dqkv, p[3] = j->qkv, p[4] = j->dout, p[5] = j->patt;
        break;
    }
    default: goto cpu;
    }
    for (int i = 0; i < 8; i++)
        if (!reach(cu, p[i]))
            goto cpu;
    { /* device scratch: the staged tokens or targets, attention's scores */
        size_t need = 0;
        if (id == FF_PASS_EMBED_LOOKUP || id == FF_PASS_EMBED_BACK)
            need = (size_t)((const embed_job *)job)->m * sizeof(int32_t);
        else if (id == FF_PASS_CE_LOCAL || id == FF_PASS_CE_COMBINE)
            need = (size_t)((const ce_job *)job)->m * sizeof(int32_t);
        else if (id == FF_PASS_BIAS_GRAD) {
            const bias_job *j = (const bias_job *)job;
            need = (size_t)((j->rows + FF_BIAS_BLOCK - 1) / FF_BIAS_BLOCK) * j->nl * sizeof(float);
        } else if (id == FF_PASS_ATTN_BWD) {
            const attn_job *j = (const attn_job *)job;
            need = (size_t)j->nh * j->T * j->T * sizeof(float);
        }
        if (need && !scratch(cu, need))
            goto cpu;
    }

    t0 = cu->profile ? now_s() : 0;
    switch (id) {
    case FF_PASS_LN_SUMS:
        k_ln_sums<<<grid_for(n * WARP, 256), 256, 0, cu->st>>>(*(const ln_job *)job, n);
        break;
    case FF_PASS_LN_SQUARES:
        k_ln_squares<<<grid_for(n * WARP, 256), 256, 0, cu->st>>>(*(const ln_job *)job, n);
        break;
    case FF_PASS_LN_NORMALIZE:
    case FF_PASS_LN_APPLY:
        if (id == FF_PASS_LN_NORMALIZE)
            k_ln_rstd<<<grid_for(n, th), th, 0, cu->st>>>(*(const ln_job *)job, n);
        k_ln_normalize<<<grid_for(n * ((const ln_job *)job)->cl, 256), 256, 0, cu->st>>>(
            *(const ln_job *)job, n);
        break;
    case FF_PASS_LN_BACK_SUMS:
        k_ln_back_sums<<<grid_for(n * WARP, 256), 256, 0, cu->st>>>(*(const ln_job *)job, n);
        break;
    case FF_PASS_LN_BACK_BLOCKS:
        k_ln_back_blocks<<<grid_for(n * ((const ln_job *)job)->cl, 256), 256, 0, cu->st>>>(
            *(const ln_job *)job, n);
        break;
    case FF_PASS_LN_BACK_SUM_BLOCKS:
        k_ln_back_sum_blocks<<<grid_for(n, th), th, 0, cu->st>>>(*(const ln_job *)job, n);
        break;
    case FF_PASS_GELU_FWD:
    case FF_PASS_GELU_BWD:
    case FF_PASS_ADD:
    case FF_PASS_MUL:
        k_elem<<<grid_for(n, 256), 256, 0, cu->st>>>(*(const elem_job *)job, n, (int)id);
        break;
    case FF_PASS_ZERO:
        CK(cudaMemsetAsync(((const elem_job *)job)->out, 0, (size_t)n * sizeof(float), cu->st));
        break;
    case FF_PASS_EMBED_LOOKUP:
    case FF_PASS_EMBED_ADD_POS:
    case FF_PASS_EMBED_BACK: {
        embed_job j = *(const embed_job *)job;
        if (id != FF_PASS_EMBED_ADD_POS)
            j.tokens = stage_ints(cu, j.tokens, j.m, 0);
        if (id == FF_PASS_EMBED_LOOKUP)
            k_embed_lookup<<<grid_for(n * j.cl, 256), 256, 0, cu->st>>>(j, n);
        else if (id == FF_PASS_EMBED_ADD_POS)
            k_embed_add_pos<<<grid_for(n * j.cl, 256), 256, 0, cu->st>>>(j, n);
        else
            k_embed_back<<<grid_for(n, th), th, 0, cu->st>>>(j, n);
        break;
    }
    case FF_PASS_CE_LOCAL:
    case FF_PASS_CE_COMBINE: {
        ce_job j = *(const ce_job *)job;
        j.targets = stage_ints(cu, j.targets, j.m, 0);
        if (id == FF_PASS_CE_LOCAL) {
            k_ce_target<<<grid_for(n, th), th, 0, cu->st>>>(j, n);
            k_ce_local<<<grid_for(n * WARP, 256), 256, 0, cu->st>>>(j, n);
        } else
            k_ce_combine<<<grid_for(n * WARP, 256), 256, 0, cu->st>>>(j, n);
        break;
    }
    case FF_PASS_SUMSQ:
        k_sumsq<<<grid_for(n, 64), 64, 0, cu->st>>>(*(const sumsq_job *)job, n);
        break;
    case FF_PASS_ADAMW:
        k_adamw<<<grid_for(n, 256), 256, 0, cu->st>>>(*(const adamw_job *)job, n);
        break;
    case FF_PASS_BIAS_ADD: {
        const bias_job *j = (const bias_job *)job;
        k_bias_add<<<grid_for(j->rows * j->nl, 256), 256, 0, cu->st>>>(*j);
        break;
    }
    case FF_PASS_BIAS_GRAD: {
        const bias_job *j = (const bias_job *)job;
        const int64_t nb = (j->rows + FF_BIAS_BLOCK - 1) / FF_BIAS_BLOCK;
        float *part = (float *)cu->scratch;
        k_bias_grad_blocks<<<grid_for(nb * j->nl, 256), 256, 0, cu->st>>>(*j, part, nb);
        k_bias_grad<<<grid_for(j->nl, th), th, 0, cu->st>>>(*j, part, nb);
        break;
    }
    case FF_PASS_ATTN_FWD:
    case FF_PASS_ATTN_BWD: attention(cu, (const attn_job *)job, id == FF_PASS_ATTN_BWD); break;
    default: goto cpu;
    }
    finish(cu, "a pass");
    account(cu, id, t0);
    cu->n_gpu++;
    return 1;
cpu:
    cu->n_cpu++;
    cu->cpu_by[id < FF_PASS_COUNT ? id : 0]++;
    return 0;
}
