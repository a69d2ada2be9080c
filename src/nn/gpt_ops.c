/* The GPT's operations outside the linear layers (gpt_ops.h). Each runs on
 * the rank's rows and columns; the only communication is the row statistics
 * of LayerNorm (Y), the embedding's sum (X) and cross-entropy's triples (X). */
#include "gpt_ops.h"

#include <cblas.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "device.h"
#include "fourfold/gemm.h"
#include "fourfold/gpt.h" /* FF_ATTENTION_ROWS */
#include "internal.h"
#include "passes.h"
#include "util/team.h"

/* A pass on the GPU when the context has one and its buffers are there,
 * else on the team (device.h). */
#define RUN(ctx, id, n, grain, fn, job)                                                            \
    do {                                                                                           \
        if (!ff_dev_pass(ctx, id, n, job))                                                         \
            ff_team_run((ctx)->team, n, grain, fn, job);                                           \
    } while (0)

/* ---- LayerNorm -------------------------------------------------------------
 * Rows run on the context's team (util/team.h), each row on one thread; the
 * gradients of w and b, sums over rows, run by column blocks, each column
 * summing its rows in order: the same bits for any number of threads. */

enum { ROW_GRAIN = 8, COL_GRAIN = 64 };

static void ln_sums(void *p, int64_t i0, int64_t i1, int th) /* pass 1: row sums */
{
    (void)th;
    for (int64_t i = i0; i < i1; i++)
        ff_ln_sums_at(p, i);
}

static void ln_squares(void *p, int64_t i0, int64_t i1, int th) /* pass 2: about the mean */
{
    (void)th;
    for (int64_t i = i0; i < i1; i++)
        ff_ln_squares_at(p, i);
}

static void ln_normalize(void *p, int64_t i0, int64_t i1, int th)
{
    (void)th;
    for (int64_t i = i0; i < i1; i++)
        ff_ln_normalize_at(p, i, 1);
}

static void ln_apply_rows(void *p, int64_t i0, int64_t i1, int th)
{
    (void)th;
    for (int64_t i = i0; i < i1; i++)
        ff_ln_normalize_at(p, i, 0);
}

void ff_ln_apply(ff_ctx *ctx, float *out, const float *mean, const float *rstd, const float *inp,
                 const float *w, const float *b, int64_t m, int64_t cl)
{
    ln_job j = {.out = out,
                .mean = (float *)mean,
                .rstd = (float *)rstd,
                .inp = inp,
                .w = w,
                .b = b,
                .m = m,
                .cl = cl};
    RUN(ctx, FF_PASS_LN_APPLY, m, ROW_GRAIN, ln_apply_rows, &j);
}

int ff_ln_forward(ff_group *gy, float *out, float *mean, float *rstd, const float *inp,
                  const float *w, const float *b, int64_t m, int64_t cl, int64_t C)
{
    ff_ctx *ctx = gy->ctx;
    ln_job j = {.out = out,
                .mean = mean,
                .rstd = rstd,
                .inp = inp,
                .w = w,
                .b = b,
                .m = m,
                .cl = cl,
                .C = C};
    /* the mean (sums in double, one float per row crosses Y), then the
     * variance about it (stable where E[x^2] - mean^2 is not) */
    RUN(ctx, FF_PASS_LN_SUMS, m, ROW_GRAIN, ln_sums, &j);
    int rc = ff_allreduce(gy, mean, mean, (size_t)m, NULL);
    if (rc)
        return rc;
    RUN(ctx, FF_PASS_LN_SQUARES, m, ROW_GRAIN, ln_squares, &j);
    if ((rc = ff_allreduce(gy, rstd, rstd, (size_t)m, NULL)))
        return rc;
    RUN(ctx, FF_PASS_LN_NORMALIZE, m, ROW_GRAIN, ln_normalize, &j);
    return FF_OK;
}

static void ln_back_sums(void *p, int64_t i0, int64_t i1, int th)
{
    (void)th;
    for (int64_t i = i0; i < i1; i++)
        ff_ln_back_sums_at(p, i);
}

/* Blocks of FF_LN_BLOCK rows: dinp for its rows, and the block's own sums of
 * the w and b gradients (from zero, rows in order) into `part`; the blocks'
 * sums are then added in block order. The blocks do not depend on the
 * threads, so neither do the bits. */
static void ln_back_blocks(void *p, int64_t b0, int64_t b1, int th)
{
    (void)th;
    for (int64_t blk = b0; blk < b1; blk++)
        ff_ln_back_block_at(p, blk);
}

static void ln_back_sum_blocks(void *p, int64_t c0, int64_t c1, int th)
{
    (void)th;
    const ln_job *j = p;
    const int64_t cl = j->cl, nb = (j->m + FF_LN_BLOCK - 1) / FF_LN_BLOCK;
    for (int64_t blk = 0; blk < nb; blk++) {
        const float *pdw = j->part + 2 * blk * cl, *pdb = pdw + cl;
        for (int64_t c = c0; c < c1; c++) {
            j->dw[c] += pdw[c];
            j->db[c] += pdb[c];
        }
    }
}

int ff_ln_backward(ff_group *gy, float *dinp, float *dw, float *db, const float *dout,
                   const float *inp, const float *w, const float *mean, const float *rstd,
                   int64_t m, int64_t cl, int64_t C, float *scratch)
{
    ff_ctx *ctx = gy->ctx;
    ln_job j = {.dinp = dinp,
                .dw = dw,
                .db = db,
                .stats = scratch,
                .part = scratch + 2 * m,
                .dout = dout,
                .inp = inp,
                .w = w,
                .mean = (float *)mean,
                .rstd = (float *)rstd,
                .m = m,
                .cl = cl,
                .C = C};
    RUN(ctx, FF_PASS_LN_BACK_SUMS, m, ROW_GRAIN, ln_back_sums, &j);
    int rc = ff_allreduce(gy, scratch, scratch, (size_t)(2 * m), NULL);
    if (rc)
        return rc;
    RUN(ctx, FF_PASS_LN_BACK_BLOCKS, (m + FF_LN_BLOCK - 1) / FF_LN_BLOCK, 1, ln_back_blocks, &j);
    RUN(ctx, FF_PASS_LN_BACK_SUM_BLOCKS, cl, COL_GRAIN, ln_back_sum_blocks, &j);
    return FF_OK;
}

/* ---- the QKV permutation ------------------------------------------------- */

int64_t *ff_qkv_permutation(int64_t C, int gx)
{
    int64_t *perm = malloc((size_t)(3 * C) * sizeof *perm), cx = C / gx;
    if (!perm)
        return NULL;
    for (int64_t x = 0; x < gx; x++)
        for (int64_t j = 0; j < 3 * cx; j++)
            perm[x * 3 * cx + j] = (j / cx) * C + x * cx + j % cx;
    return perm;
}

/* ---- attention ---------------------------------------------------------------
 * Per sequence and head, with BLAS, in blocks of ATT_ROWS query rows: block
 * [r0, r1) computes its scores S = Q K^T / sqrt(hs) against keys [0, r1)
 * only (the later keys are masked), the causal softmax by rows, and O = P V
 * over those r1 keys; the backward likewise by row blocks (dP, dQ) and by
 * column blocks of P (dV, dK: only the queries from the block's first key
 * on see it). At T = 1024 that is 17/32 of the full T x T products. The
 * blocks depend only on T. The (sequence, head) pairs run on the team, each
 * calling the BLAS on one thread (the BLAS's own threads are set to 1
 * around the region, so the products are the same calls whatever the
 * team's size); thread 0 polls between its pairs. */
enum { ATT_ROWS = FF_ATTENTION_ROWS };

static void attn_fwd(void *arg, int64_t k0, int64_t k1, int th)
{
    const attn_job *j = arg;
    const int T = j->T, hs = j->hs;
    const int64_t c = (int64_t)j->nh * hs, c3 = 3 * c;
    const float scale = 1.0f / sqrtf((float)hs);
    for (int64_t k = k0; k < k1; k++) {
        const int64_t b = k / j->nh, h = k % j->nh;
        const float *q = j->qkv + b * T * c3 + h * hs;
        const float *kk = q + c, *v = q + 2 * c;
        float *p = j->att + k * T * T, *o = j->out + b * T * c + h * hs;
        for (int r0 = 0; r0 < T; r0 += ATT_ROWS) {
            const int r1 = r0 + ATT_ROWS < T ? r0 + ATT_ROWS : T, n = r1 - r0;
            const int keys = j->causal ? r1 : T; /* without the mask: every key */
            // p[r0:r1, 0:keys] = q[r0:r1] (n, hs) k[0:keys]^T (hs, keys) * scale
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, keys, hs, scale, q + r0 * c3,
                        (int)c3, kk, (int)c3, 0.0f, p + (int64_t)r0 * T, T);
            for (int t = r0; t < r1; t++)
                ff_softmax_causal_row(p + (int64_t)t * T, j->causal ? t : T - 1, T);
            // o[r0:r1] (n, hs) = p[r0:r1, 0:keys] v[0:keys] (keys, hs)
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, hs, keys, 1.0f,
                        p + (int64_t)r0 * T, T, v, (int)c3, 0.0f, o + r0 * c, (int)c);
        }
        if (th == 0)
            ff_poll(j->ctx); /* collectives in flight advance between heads */
    }
}

static void attn_bwd(void *arg, int64_t k0, int64_t k1, int th)
{
    const attn_job *j = arg;
    const int T = j->T, hs = j->hs;
    const int64_t c = (int64_t)j->nh * hs, c3 = 3 * c;
    const float scale = 1.0f / sqrtf((float)hs);
    float *dp = j->scratch + (int64_t)th * T * T;
    for (int64_t k = k0; k < k1; k++) {
        const int64_t b = k / j->nh, h = k % j->nh, off = b * T * c3 + h * hs;
        const float *q = j->qkv + off, *kk = q + c, *v = q + 2 * c;
        float *dq = j->dqkv + off, *dk = dq + c, *dv = dq + 2 * c;
        const float *pa = j->patt + k * T * T;
        const float *g = j->dout + b * T * c + h * hs;
        for (int r0 = 0; r0 < T; r0 += ATT_ROWS) {
            const int r1 = r0 + ATT_ROWS < T ? r0 + ATT_ROWS : T, n = r1 - r0;
            const int keys = j->causal ? r1 : T;
            float *dpr = dp + (int64_t)r0 * T;
            // dp[r0:r1, 0:keys] = g[r0:r1] (n, hs) v[0:keys]^T
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, keys, hs, 1.0f, g + r0 * c,
                        (int)c, v, (int)c3, 0.0f, dpr, T);
            // softmax backward: ds = p * (dp - sum_u p dp), zero above the diagonal (causal)
            for (int t = r0; t < r1; t++)
                ff_softmax_causal_back_row(dp + (int64_t)t * T, pa + (int64_t)t * T,
                                           j->causal ? t : T - 1, T);
            // dq[r0:r1] (n, hs) = ds[r0:r1, 0:keys] k[0:keys] * scale
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, hs, keys, scale, dpr, T, kk,
                        (int)c3, 0.0f, dq + r0 * c3, (int)c3);
        }
        // keys [c0, c1) are seen by queries [c0, T) (causal; without the mask
        // by all): dv = p^T g, dk = ds^T q * scale there
        for (int c0 = 0; c0 < T; c0 += ATT_ROWS) {
            const int q0 = j->causal ? c0 : 0;
            const int c1 = c0 + ATT_ROWS < T ? c0 + ATT_ROWS : T, n = c1 - c0, rows = T - q0;
            const int64_t at = (int64_t)q0 * T + c0;
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, n, hs, rows, 1.0f, pa + at, T,
                        g + q0 * c, (int)c, 0.0f, dv + c0 * c3, (int)c3);
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, n, hs, rows, scale, dp + at, T,
                        q + q0 * c3, (int)c3, 0.0f, dk + c0 * c3, (int)c3);
        }
        if (th == 0)
            ff_poll(j->ctx);
    }
}

/* bf16-mixed: rows [0, n) of hs values at stride ld rounded to bf16 into
 * dst (n, hs) */
static void round_rows(float *dst, const float *src, int64_t ld, int n, int hs)
{
    for (int t = 0; t < n; t++)
        ff_bf16_round_copy(dst + (int64_t)t * hs, src + t * ld, (size_t)hs);
}

/* attn_fwd with the products' operands rounded to bf16 (gpt_ops.h): the
 * head's Q, K and V rounded once into the thread's scratch, a block's
 * probabilities rounded into its end before O = P V; att keeps them in fp32
 * for the softmax's backward. The same calls for any team size. */
static void attn_fwd_bf16(void *arg, int64_t k0, int64_t k1, int th)
{
    const attn_job *j = arg;
    const int T = j->T, hs = j->hs;
    const int64_t c = (int64_t)j->nh * hs, c3 = 3 * c, head_n = (int64_t)T * hs;
    const float scale = 1.0f / sqrtf((float)hs);
    float *qb = j->bf16 + th * FF_ATTN_BF16_SCRATCH(T, hs), *kb = qb + head_n, *vb = kb + head_n;
    float *pb = vb + 2 * head_n; /* (ATT_ROWS, keys) */
    for (int64_t k = k0; k < k1; k++) {
        const int64_t b = k / j->nh, h = k % j->nh;
        const float *q = j->qkv + b * T * c3 + h * hs;
        float *p = j->att + k * T * T, *o = j->out + b * T * c + h * hs;
        round_rows(qb, q, c3, T, hs);
        round_rows(kb, q + c, c3, T, hs);
        round_rows(vb, q + 2 * c, c3, T, hs);
        for (int r0 = 0; r0 < T; r0 += ATT_ROWS) {
            const int r1 = r0 + ATT_ROWS < T ? r0 + ATT_ROWS : T, n = r1 - r0;
            const int keys = j->causal ? r1 : T;
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, keys, hs, scale, qb + r0 * hs,
                        hs, kb, hs, 0.0f, p + (int64_t)r0 * T, T);
            for (int t = r0; t < r1; t++)
                ff_softmax_causal_row(p + (int64_t)t * T, j->causal ? t : T - 1, T);
            for (int t = 0; t < n; t++) /* P rounded, as autocast's P V */
                ff_bf16_round_copy(pb + (int64_t)t * keys, p + (int64_t)(r0 + t) * T, (size_t)keys);
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, hs, keys, 1.0f, pb, keys, vb,
                        hs, 0.0f, o + r0 * c, (int)c);
        }
        if (th == 0)
            ff_poll(j->ctx);
    }
}

/* attn_bwd with the products' operands rounded to bf16 (gpt_ops.h): dS
 * rounded in place once the softmax's backward made it (only products read
 * it), a column block of P rounded into the scratch's end for dV. */
static void attn_bwd_bf16(void *arg, int64_t k0, int64_t k1, int th)
{
    const attn_job *j = arg;
    const int T = j->T, hs = j->hs;
    const int64_t c = (int64_t)j->nh * hs, c3 = 3 * c, head_n = (int64_t)T * hs;
    const float scale = 1.0f / sqrtf((float)hs);
    float *dp = j->scratch + (int64_t)th * T * T;
    float *qb = j->bf16 + th * FF_ATTN_BF16_SCRATCH(T, hs), *kb = qb + head_n, *vb = kb + head_n;
    float *gb = vb + head_n, *pb = gb + head_n; /* pb (T, ATT_ROWS) */
    for (int64_t k = k0; k < k1; k++) {
        const int64_t b = k / j->nh, h = k % j->nh, off = b * T * c3 + h * hs;
        const float *q = j->qkv + off;
        float *dq = j->dqkv + off, *dk = dq + c, *dv = dq + 2 * c;
        const float *pa = j->patt + k * T * T;
        round_rows(qb, q, c3, T, hs);
        round_rows(kb, q + c, c3, T, hs);
        round_rows(vb, q + 2 * c, c3, T, hs);
        round_rows(gb, j->dout + b * T * c + h * hs, c, T, hs);
        for (int r0 = 0; r0 < T; r0 += ATT_ROWS) {
            const int r1 = r0 + ATT_ROWS < T ? r0 + ATT_ROWS : T, n = r1 - r0;
            const int keys = j->causal ? r1 : T;
            float *dpr = dp + (int64_t)r0 * T;
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, keys, hs, 1.0f, gb + r0 * hs,
                        hs, vb, hs, 0.0f, dpr, T);
            for (int t = r0; t < r1; t++) {
                ff_softmax_causal_back_row(dp + (int64_t)t * T, pa + (int64_t)t * T,
                                           j->causal ? t : T - 1, T);
                ff_bf16_round(dp + (int64_t)t * T, (size_t)keys);
            }
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, hs, keys, scale, dpr, T, kb,
                        hs, 0.0f, dq + r0 * c3, (int)c3);
        }
        for (int c0 = 0; c0 < T; c0 += ATT_ROWS) {
            const int q0 = j->causal ? c0 : 0;
            const int c1 = c0 + ATT_ROWS < T ? c0 + ATT_ROWS : T, n = c1 - c0, rows = T - q0;
            const int64_t at = (int64_t)q0 * T + c0;
            for (int t = 0; t < rows; t++)
                ff_bf16_round_copy(pb + (int64_t)t * n, pa + at + (int64_t)t * T, (size_t)n);
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, n, hs, rows, 1.0f, pb, n,
                        gb + q0 * hs, hs, 0.0f, dv + c0 * c3, (int)c3);
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, n, hs, rows, scale, dp + at, T,
                        qb + q0 * hs, hs, 0.0f, dk + c0 * c3, (int)c3);
        }
        if (th == 0)
            ff_poll(j->ctx);
    }
}

/* Runs the pairs on the team with the BLAS on one thread meanwhile. */
static void attn_run(attn_job *j, ff_team_fn fn, ff_pass_id id)
{
    if (j->causal && !j->bf16 && ff_dev_pass(j->ctx, id, (int64_t)j->B * j->nh, j))
        return; /* (the device's kernels are causal only, fp32 only) */
    ff_team *team = j->ctx->team;
    int wide = ff_team_size(team) > 1;
    if (wide)
        ff_blas_set_threads(1);
    ff_team_run(team, (int64_t)j->B * j->nh, 1, fn, j);
    if (wide)
        ff_blas_set_threads(ff_ctx_blas_threads(j->ctx));
}

void ff_attention_forward(ff_ctx *ctx, float *out, float *att, const float *qkv, int B, int T,
                          int nh, int hs)
{
    attn_job j = {.ctx = ctx,
                  .out = out,
                  .att = att,
                  .qkv = qkv,
                  .B = B,
                  .T = T,
                  .nh = nh,
                  .hs = hs,
                  .causal = 1};
    attn_run(&j, attn_fwd, FF_PASS_ATTN_FWD);
}

void ff_attention_forward_bf16(ff_ctx *ctx, float *out, float *att, const float *qkv, int B, int T,
                               int nh, int hs, float *bscratch)
{
    attn_job j = {.ctx = ctx,
                  .out = out,
                  .att = att,
                  .qkv = qkv,
                  .B = B,
                  .T = T,
                  .nh = nh,
                  .hs = hs,
                  .causal = 1,
                  .bf16 = bscratch};
    attn_run(&j, attn_fwd_bf16, FF_PASS_ATTN_FWD);
}

void ff_attention_backward_bf16(ff_ctx *ctx, float *dqkv, float *scratch, const float *dout,
                                const float *qkv, const float *att, int B, int T, int nh, int hs,
                                float *bscratch)
{
    attn_job j = {.ctx = ctx,
                  .dqkv = dqkv,
                  .scratch = scratch,
                  .dout = dout,
                  .qkv = qkv,
                  .patt = att,
                  .B = B,
                  .T = T,
                  .nh = nh,
                  .hs = hs,
                  .causal = 1,
                  .bf16 = bscratch};
    attn_run(&j, attn_bwd_bf16, FF_PASS_ATTN_BWD);
}

void ff_attention_full_forward(ff_ctx *ctx, float *out, float *att, const float *qkv, int B, int T,
                               int nh, int hs)
{
    attn_job j = {
        .ctx = ctx, .out = out, .att = att, .qkv = qkv, .B = B, .T = T, .nh = nh, .hs = hs};
    attn_run(&j, attn_fwd, FF_PASS_ATTN_FWD);
}

void ff_attention_backward(ff_ctx *ctx, float *dqkv, float *scratch, const float *dout,
                           const float *qkv, const float *att, int B, int T, int nh, int hs)
{
    attn_job j = {.ctx = ctx,
                  .dqkv = dqkv,
                  .scratch = scratch,
                  .dout = dout,
                  .qkv = qkv,
                  .patt = att,
                  .B = B,
                  .T = T,
                  .nh = nh,
                  .hs = hs,
                  .causal = 1};
    attn_run(&j, attn_bwd, FF_PASS_ATTN_BWD);
}

void ff_attention_full_backward(ff_ctx *ctx, float *dqkv, float *scratch, const float *dout,
                                const float *qkv, const float *att, int B, int T, int nh, int hs)
{
    attn_job j = {.ctx = ctx,
                  .dqkv = dqkv,
                  .scratch = scratch,
                  .dout = dout,
                  .qkv = qkv,
                  .patt = att,
                  .B = B,
                  .T = T,
                  .nh = nh,
                  .hs = hs};
    attn_run(&j, attn_bwd, FF_PASS_ATTN_BWD);
}

/* ---- GELU ------------------------------------------------------------------------ */

enum { ELEM_GRAIN = 4096 };

static void gelu_fwd(void *p, int64_t i0, int64_t i1, int th)
{
    (void)th;
    const elem_job *j = p;
    for (int64_t i = i0; i < i1; i++) {
        j->out[i] = ff_gelu(j->inp[i]);
    }
}

static void gelu_bwd(void *p, int64_t i0, int64_t i1, int th)
{
    (void)th;
    const elem_job *j = p;
    for (int64_t i = i0; i < i1; i++) {
        j->out[i] = ff_gelu_grad(j->inp[i]) * j->dout[i];
    }
}

void ff_gelu_forward(ff_ctx *ctx, float *out, const float *inp, int64_t n)
{
    elem_job j = {out, inp, NULL};
    RUN(ctx, FF_PASS_GELU_FWD, n, ELEM_GRAIN, gelu_fwd, &j);
}

void ff_gelu_backward(ff_ctx *ctx, float *dinp, const float *inp, const float *dout, int64_t n)
{
    elem_job j = {dinp, inp, dout};
    RUN(ctx, FF_PASS_GELU_BWD, n, ELEM_GRAIN, gelu_bwd, &j);
}

static void add_fn(void *p, int64_t i0, int64_t i1, int th)
{
    (void)th;
    const elem_job *j = p;
    for (int64_t i = i0; i < i1; i++)
        j->out[i] = j->inp[i] + j->dout[i];
}

void ff_add(ff_ctx *ctx, float *out, const float *a, const float *b, int64_t n)
{
    elem_job j = {out, a, b};
    RUN(ctx, FF_PASS_ADD, n, ELEM_GRAIN, add_fn, &j);
}

static void mul_fn(void *p, int64_t i0, int64_t i1, int th)
{
    (void)th;
    const elem_job *j = p;
    for (int64_t i = i0; i < i1; i++)
        j->out[i] = j->inp[i] * j->dout[i];
}

void ff_mul(ff_ctx *ctx, float *out, const float *a, const float *b, int64_t n)
{
    elem_job j = {out, a, b};
    RUN(ctx, FF_PASS_MUL, n, ELEM_GRAIN, mul_fn, &j);
}

static void zero_fn(void *p, int64_t i0, int64_t i1, int th)
{
    (void)th;
    const elem_job *j = p;
    memset(j->out + i0, 0, (size_t)(i1 - i0) * sizeof(float));
}

void ff_zero(ff_ctx *ctx, float *out, int64_t n)
{
    elem_job j = {out, NULL, NULL};
    RUN(ctx, FF_PASS_ZERO, n, 1 << 16, zero_fn, &j);
}

/* ---- embedding -------------------------------------------------------------------- */

static void embed_lookup(void *p, int64_t i0, int64_t i1, int th)
{
    (void)th;
    const embed_job *j = p;
    for (int64_t i = i0; i < i1; i++) {
        int64_t v = (int64_t)j->tokens[i] - j->v0;
        float *o = j->out + i * j->cl;
        if (v >= 0 && v < j->vl && j->wte16)
            ff_bf16_unpack(o, j->wte16 + v * j->cl, (size_t)j->cl);
        else if (v >= 0 && v < j->vl)
            memcpy(o, j->wte + v * j->cl, (size_t)j->cl * sizeof(float));
        else
            memset(o, 0, (size_t)j->cl * sizeof(float));
    }
}

static void embed_add_pos(void *p, int64_t i0, int64_t i1, int th)
{
    (void)th;
    const embed_job *j = p;
    for (int64_t i = i0; i < i1; i++) {
        const float *pos = j->wpe + (i % j->T) * j->cl;
        float *o = j->out + i * j->cl;
        for (int64_t c = 0; c < j->cl; c++)
            o[c] += pos[c];
    }
}

static int embed_forward(ff_group *gx, float *out, const int32_t *tokens, const float *wte_block,
                         const uint16_t *wte16, const float *wpe, int64_t B, int64_t T, int64_t v0,
                         int64_t vl, int64_t cl)
{
    const int64_t m = B * T;
    embed_job j = {.out = out,
                   .wte = wte_block,
                   .wte16 = wte16,
                   .wpe = wpe,
                   .tokens = tokens,
                   .T = T,
                   .v0 = v0,
                   .vl = vl,
                   .cl = cl,
                   .m = m};
    RUN(gx->ctx, FF_PASS_EMBED_LOOKUP, m, ROW_GRAIN, embed_lookup, &j);
    /* exactly one X rank holds each token's row: the sum is exact */
    int rc = ff_allreduce(gx, out, out, (size_t)(m * cl), NULL);
    if (rc)
        return rc;
    RUN(gx->ctx, FF_PASS_EMBED_ADD_POS, m, ROW_GRAIN, embed_add_pos, &j);
    return FF_OK;
}

int ff_embed_forward(ff_group *gx, float *out, const int32_t *tokens, const float *wte_block,
                     const float *wpe, int64_t B, int64_t T, int64_t v0, int64_t vl, int64_t cl)
{
    return embed_forward(gx, out, tokens, wte_block, NULL, wpe, B, T, v0, vl, cl);
}

int ff_embed_forward_bf16(ff_group *gx, float *out, const int32_t *tokens, const uint16_t *wte16,
                          const float *wpe, int64_t B, int64_t T, int64_t v0, int64_t vl,
                          int64_t cl)
{
    return embed_forward(gx, out, tokens, NULL, wte16, wpe, B, T, v0, vl, cl);
}

/* columns [c0, c1) of every row, rows in order: the same sums for any split */
static void embed_back(void *p, int64_t c0, int64_t c1, int th)
{
    (void)th;
    const embed_job *j = p;
    for (int64_t i = 0; i < j->m; i++) {
        const float *g = j->dout + i * j->cl;
        float *dp = j->dwpe + (i % j->T) * j->cl;
        for (int64_t c = c0; c < c1; c++)
            dp[c] += g[c];
        int64_t v = (int64_t)j->tokens[i] - j->v0;
        if (v >= 0 && v < j->vl) {
            float *dw = j->dwte + v * j->cl;
            for (int64_t c = c0; c < c1; c++)
                dw[c] += g[c];
        }
    }
}

void ff_embed_backward(ff_ctx *ctx, float *dwte_block, float *dwpe, const float *dout,
                       const int32_t *tokens, int64_t B, int64_t T, int64_t v0, int64_t vl,
                       int64_t cl)
{
    embed_job j = {.dwte = dwte_block,
                   .dwpe = dwpe,
                   .dout = dout,
                   .tokens = tokens,
                   .T = T,
                   .v0 = v0,
                   .vl = vl,
                   .cl = cl,
                   .m = B * T};
    RUN(ctx, FF_PASS_EMBED_BACK, cl, COL_GRAIN, embed_back, &j);
}

/* ---- cross-entropy ------------------------------------------------------------------ */

/* per row: the local max, the sum of exp(l - max) over the rank's columns,
 * the target's logit if it is the rank's */
static void ce_local(void *p, int64_t i0, int64_t i1, int th)
{
    const ce_job *j = p;
    const int64_t n = j->valid, n16 = n / 16 * 16;
    for (int64_t i = i0; i < i1; i++) {
        /* the max in 16 lanes (any order gives the same max) */
        float *row = j->logits + i * j->vl, lane[16], mx = -INFINITY;
        for (int k = 0; k < 16; k++)
            lane[k] = -INFINITY;
        for (int64_t c = 0; c < n16; c += 16)
            for (int k = 0; k < 16; k++)
                lane[k] = row[c + k] > lane[k] ? row[c + k] : lane[k];
        for (int64_t c = n16; c < n; c++)
            mx = row[c] > mx ? row[c] : mx;
        for (int k = 0; k < 16; k++)
            mx = lane[k] > mx ? lane[k] : mx;
        int64_t t = (int64_t)j->targets[i] - j->v0;
        j->mine[3 * i] = mx;
        j->mine[3 * i + 2] = t >= 0 && t < j->valid ? row[t] : 0.0f;
        /* training keeps exp(l - local max) in place of the logits: the
         * gradient is a rescaling of it. Two loops: the first vectorizes. */
        float *e = j->dscale == 0.0f ? j->rows + (int64_t)th * j->vl : row;
        for (int64_t c = 0; c < n; c++)
            e[c] = ff_exp_fast(row[c] - mx);
        /* their sum in double, element c to running sum c mod 8 (independent
         * chains, which vectorize; one long chain took ~7 % of the small
         * model's step), added in a fixed order */
        double s[8] = {0, 0, 0, 0, 0, 0, 0, 0};
        int64_t c = 0;
        for (; c + 8 <= n; c += 8)
            for (int k = 0; k < 8; k++)
                s[k] += (double)e[c + k];
        for (int k = 0; c < n; c++, k++)
            s[k] += (double)e[c];
        double sum = ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
        j->mine[3 * i + 1] = (float)sum;
    }
}

/* combine in rank order: M = max M_x, S = sum S_x exp(M_x - M); then the
 * gradient in place */
static void ce_combine(void *p, int64_t i0, int64_t i1, int th)
{
    (void)th;
    for (int64_t i = i0; i < i1; i++)
        ff_ce_combine_at(p, i);
}

int ff_crossentropy(ff_group *gx, float *losses, float *logits, const int32_t *targets, int64_t m,
                    int64_t v0, int64_t vl, int64_t V, float dscale, float *scratch)
{
    const int gxn = ff_group_size(gx);
    ce_job j = {.losses = losses,
                .logits = logits,
                .mine = scratch,
                .all = scratch + 3 * m,
                .rows = scratch + 3 * m + (int64_t)gxn * 3 * m,
                .targets = targets,
                .m = m,
                .v0 = v0,
                .vl = vl,
                .valid = v0 >= V ? 0 : (v0 + vl <= V ? vl : V - v0),
                .dscale = dscale,
                .gxn = gxn};
    RUN(gx->ctx, FF_PASS_CE_LOCAL, m, 1, ce_local, &j);
    int rc = ff_allgather(gx, j.mine, j.all, (size_t)(3 * m), NULL);
    if (rc)
        return rc;
    RUN(gx->ctx, FF_PASS_CE_COMBINE, m, 1, ce_combine, &j);
    return FF_OK;
}
