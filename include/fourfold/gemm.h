/* Local matrix products through the BLAS, with two things added:
 *
 * - Progress: a long product is computed in panels of output rows, with
 *   ff_poll() between panels, so collectives in flight advance (docs/design.md §11:
 *   nothing advances in the background). Panel boundaries depend only on the
 *   shape, never on whether anything is in flight, because OpenBLAS rounds a
 *   product split into row panels differently from the whole product.
 * - Mode tuning (dissertation §5.1.3): C = op(A) op(B) can be computed with
 *   either operand explicitly transposed first, i.e. as NN, NT, TN or TT
 *   sgemm calls on different memory layouts. On first use of a shape every
 *   candidate runs once untimed, then timed; another mode than the direct
 *   call is kept where it is at least 3% faster and its result equals the
 *   direct call's bit for bit (OpenBLAS's AVX2 kernels give all four the
 *   same bits, its AVX-512 ones not always: tests/test_gemm.c), so tuning
 *   never changes a result. FF_GEMM_TUNE_ALL adds the transposed product
 *   (C^T = op(B)^T op(A)^T, then transposed back), which rounds differently:
 *   results then depend on timing, so it is off unless asked for.
 *
 * Row-major throughout. Not thread-safe: one ff_gemm per thread. */
#ifndef FOURFOLD_GEMM_H
#define FOURFOLD_GEMM_H

#include <stdint.h>
#include <stdio.h>

#include "fourfold/ctx.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
    FF_GEMM_TUNE_OFF = 0, /* always the direct call */
    FF_GEMM_TUNE_LAYOUTS, /* NN/NT/TN/TT by explicit transposition (default) */
    FF_GEMM_TUNE_ALL      /* also the transposed product (changes rounding) */
} ff_gemm_tune;

/* How a product was computed: bit 0 = A transposed explicitly first, bit 1 = B
 * transposed explicitly first, FF_GEMM_MODE_TPROD = transposed product. */
enum { FF_GEMM_MODE_DIRECT = 0, FF_GEMM_MODE_TPROD = 4, FF_GEMM_NMODES = 5 };

/* Shapes a tuner times at most; later new shapes run the direct call
 * (mixture-of-experts layers see a new row count almost every step). */
enum { FF_GEMM_TUNE_MAX_SHAPES = 256 };

typedef struct ff_gemm ff_gemm;

int ff_gemm_create(ff_ctx *ctx, ff_gemm_tune tune, ff_gemm **out);
void ff_gemm_destroy(ff_gemm *g);

/* C (m x n) = alpha op(A) op(B) + beta C; op(A) is m x k, op(B) is k x n.
 * `name` labels the trace region and the tuning report. */
int ff_gemm_run(ff_gemm *g, const char *name, int trans_a, int trans_b, int64_t m, int64_t n,
                int64_t k, float alpha, const float *a, int64_t lda, const float *b, int64_t ldb,
                float beta, float *c, int64_t ldc);

/* Forces one mode for every later product (-1: back to tuning); for tests. */
void ff_gemm_force_mode(ff_gemm *g, int mode);
/* Overrides the panel height for every later product (0: by shape); for
 * tests and experiments. */
void ff_gemm_set_panel_rows(ff_gemm *g, int64_t rows);
/* Rows per panel for a product of this shape (m rows, inner k, n columns). */
int64_t ff_gemm_panel_rows(int64_t m, int64_t n, int64_t k);
/* The panel height this tuner uses for products of n columns and inner k,
 * however many rows they have: panels start at its multiples, so a product
 * cut into row ranges at its multiples makes the same BLAS calls as the
 * whole product (decomposition, docs/linear.md). */
int64_t ff_gemm_panel_height(const ff_gemm *g, int64_t n, int64_t k);
/* The mode names: "direct", "A^T", "B^T", "A^T B^T", "C^T". */
const char *ff_gemm_mode_name(int mode);
/* Prints one line per tuned shape: name, shape, mode chosen, time of each. */
void ff_gemm_report(const ff_gemm *g, FILE *out);
/* Bytes of the scratch the explicit-transpose modes hold (they grow to the
 * largest operand they transposed and are kept) and of the bf16 products'
 * operands (ff_gemm_set_bf16's): ff_gpt_memory's gemm_scratch. */
size_t ff_gemm_scratch_bytes(const ff_gemm *g);
/* Flops and seconds spent in ff_gemm_run since creation (or reset). */
void ff_gemm_totals(const ff_gemm *g, double *flops, double *seconds);
void ff_gemm_totals_reset(ff_gemm *g);

/* ---- bf16 products on oneDNN ---------------------------------------------------
 * The second way bf16-mixed precision runs its products (docs/design.md,
 * "Mixed precision"; the first is the exact emulation: operands rounded to
 * bf16, widened back and multiplied by ff_gemm_run). Both operands are
 * rounded to bfloat16 (nearest, ties to even: unchanged if they already hold
 * bf16 values), multiplied by oneDNN's matmul with fp32 accumulation, and
 * C = alpha op(A) op(B) + beta C written in fp32; row panels and progress
 * calls as ff_gemm_run's. Its sums run in another order than the BLAS's, so
 * the two agree within fp32 summation error (tests/test_gemm_bf16.c). Built
 * only with oneDNN (Debian's libdnnl-dev; FF_ONEDNN): otherwise create
 * returns FF_EUNSUPPORTED. Not thread-safe: one per thread. */
typedef struct ff_bf16_gemm ff_bf16_gemm;
/* 1 if this build has oneDNN (FF_ONEDNN). */
int ff_bf16_gemm_available(void);
/* 1 if this build has oneDNN and oneDNN finds native bf16 instructions on
 * this CPU (AVX512_BF16, or AMX: dnnl_get_effective_cpu_isa), where its bf16
 * matmul runs them; a property of the machine, not a timing. */
int ff_bf16_gemm_native(void);
int ff_bf16_gemm_create(ff_ctx *ctx, ff_bf16_gemm **out);
void ff_bf16_gemm_destroy(ff_bf16_gemm *h);
int ff_bf16_gemm_run(ff_bf16_gemm *h, const char *name, int trans_a, int trans_b, int64_t m,
                     int64_t n, int64_t k, float alpha, const float *a, int64_t lda, const float *b,
                     int64_t ldb, float beta, float *c, int64_t ldc);
/* The same with either operand given as 2-byte bf16 values instead (a16,
 * b16; NULL: the fp32 one, rounded), same layout and leading dimension: no
 * rounding pass, and one laid out as oneDNN reads it (op(A) not transposed
 * with lda = k; B with ldb = n, or k transposed) is read in place, not
 * copied. The same bits as ff_bf16_gemm_run on the widened values. */
int ff_bf16_gemm_run2(ff_bf16_gemm *h, const char *name, int trans_a, int trans_b, int64_t m,
                      int64_t n, int64_t k, float alpha, const float *a, const uint16_t *a16,
                      int64_t lda, const float *b, const uint16_t *b16, int64_t ldb, float beta,
                      float *c, int64_t ldc);
/* oneDNN's name for the kernels of the last product ("brg:avx512_core_bf16":
 * the CPU's bf16 dot products; "brg:avx512_core" or "gemm:jit" without
 * them, where oneDNN converts and runs fp32), "?" before any, "none"
 * without oneDNN. */
const char *ff_bf16_gemm_impl(const ff_bf16_gemm *h);
void ff_bf16_gemm_totals(const ff_bf16_gemm *h, double *flops, double *seconds);
/* Bytes of the operands' bf16 buffers h keeps (grown to the largest). */
size_t ff_bf16_gemm_scratch_bytes(const ff_bf16_gemm *h);
/* Overrides the panel height (0: ff_gemm_panel_rows, as ff_gemm_run's). */
void ff_bf16_gemm_set_panel_rows(ff_bf16_gemm *h, int64_t rows);
/* bf16-mixed precision: with h set (NULL: none; not owned), the products
 * g runs between ff_gemm_bf16_operands(g, 1) and ff_gemm_bf16_operands(g, 0)
 * (which nest) run on h, in g's panels, untuned; their operands must hold
 * bf16 values (the layers round them). Without h they run on the BLAS: the
 * exact emulation. */
void ff_gemm_set_bf16(ff_gemm *g, ff_bf16_gemm *h);
void ff_gemm_bf16_operands(ff_gemm *g, int on);
/* 1 if g's products with bf16 operands run on oneDNN (ff_gemm_set_bf16):
 * they can then take 2-byte operands (ff_gemm_run2). */
int ff_gemm_bf16_direct(const ff_gemm *g);
/* ff_gemm_run with either operand also given as 2-byte bf16 values (a16,
 * b16, same layout; NULL: none): on oneDNN (ff_gemm_bf16_direct, between
 * ff_gemm_bf16_operands 1 and 0) these are read and the fp32 one may be
 * NULL; on the BLAS the fp32 ones are, and must hold the same values. */
int ff_gemm_run2(ff_gemm *g, const char *name, int trans_a, int trans_b, int64_t m, int64_t n,
                 int64_t k, float alpha, const float *a, const uint16_t *a16, int64_t lda,
                 const float *b, const uint16_t *b16, int64_t ldb, float beta, float *c,
                 int64_t ldc);
/* Sustained rate (FLOP/s) of h's products C(m,n) = A(m,k) B(k,n) from fp32
 * operands (their rounding included) with `threads` threads, measured as
 * ff_sgemm_rate measures the BLAS's; 0 if a product failed. */
double ff_bf16_gemm_rate(ff_bf16_gemm *h, int m, int n, int k, int threads, double min_seconds);

/* ---- the machine's BLAS ------------------------------------------------------ */

/* Threads of every later BLAS call of this process (OpenBLAS). */
void ff_blas_set_threads(int n);
/* The BLAS's kernel family ("Haswell", "Cooperlake"): timings are comparable
 * only between runs with the same kernels. */
const char *ff_blas_core(void);
/* Whether the BLAS's kernels fit the CPU (docs/design.md §8, "The BLAS's
 * kernels"): the facts, and what to do about them. */
typedef struct {
    const char *core;      /* the kernel family the BLAS chose */
    int cpu_avx2;          /* the CPU has AVX2 and FMA */
    int cpu_avx512;        /* ... and AVX-512 F, BW, DQ and VL */
    const char *user_core; /* OPENBLAS_CORETYPE as the user set it, or NULL */
} ff_blas_facts;
typedef struct {
    const char *better; /* the kernels to ask for ("SkylakeX", "Haswell"), or NULL */
    char why[200];      /* one line: what was found, and why */
} ff_blas_advice;
/* The decision: switch only when the BLAS fell back to SSE or AVX kernels
 * on a CPU with AVX2 or AVX-512, and the user set no OPENBLAS_CORETYPE; a
 * kernel family it does not know is left alone. */
ff_blas_advice ff_blas_advise(const ff_blas_facts *f);
/* This process's facts: the loaded BLAS, cpuid, the environment. */
ff_blas_facts ff_blas_facts_here(void);
/* For a program's main(), before MPI_Init: where the BLAS fell back, set
 * OPENBLAS_CORETYPE to the better kernels and execute the program again
 * (execv of /proc/self/exe with argv, once; FF_BLAS_REEXEC marks it); the
 * new process checks that the BLAS took them and computes a product
 * exactly, else executes itself once more without the variable. Returns
 * in the process that runs on. */
void ff_blas_reexec(char **argv);
/* One line for a settings table: the kernels and why ("SkylakeX (chosen by
 * fourfold: ...)", "Cooperlake (OpenBLAS's choice, for a CPU with
 * AVX-512)", or the fallback and the variable that fixes it). */
const char *ff_blas_kernels(void);
/* 1 if this process runs on fallback kernels that fourfold neither chose
 * nor tried to replace (a library user's program: ff_ctx_create warns once). */
int ff_blas_fallback(void);
/* How the loaded OpenBLAS runs its threads: "openmp", "pthreads" or
 * "sequential". With "openmp" (or "sequential"), in a library built with
 * OpenMP (FF_OPENMP), a context's element-wise work runs on OpenMP too,
 * sharing the BLAS's threads (ff_ctx_team). */
const char *ff_blas_threading(void);
/* Sustained sgemm rate (FLOP/s) of C(m,n) = A(m,k) B(k,n) with `threads`
 * BLAS threads: the median of runs totalling at least min_seconds (at least
 * 3). Leaves the BLAS on one thread. The peak that model FLOP/s are quoted
 * against (docs/design.md). */
double ff_sgemm_rate(int m, int n, int k, int threads, double min_seconds);
/* n zeroed floats, allocated as the library allocates its own large
 * buffers (parameters, gradients, moments, activations): from 2 MiB up on
 * a mapping of their own with transparent huge pages asked for
 * (MADV_HUGEPAGE; the system's setting decides), so that a rate measured
 * on them is the library's. Free with ff_floats_free. NULL if out of memory. */
float *ff_floats_alloc(size_t n);
void ff_floats_free(void *p);
/* The median of v[0..n) (sorts v); 0 for n <= 0. */
double ff_median(double *v, int n);

#ifdef __cplusplus
}
#endif
#endif
