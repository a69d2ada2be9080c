/* The jobs of the model's element-wise passes (gpt_ops.c, gpt_optim.c,
 * linear.c), shared with their GPU kernels (cuda/backend.cu): a pass runs
 * over indices [0, n) of its job (rows, columns, blocks or elements), the
 * CPU's in ranges on the context's team. The per-element functions below
 * are each output element's arithmetic for both devices; the GPU runs them
 * a thread per element (or per block of rows and column), and where a row
 * has a single sum (LayerNorm's statistics, cross-entropy's, the softmax)
 * a warp per row that adds in another order (docs/cuda.md, "Kernels"). Plain
 * C, also read as C++ by nvcc. Internal to the library. */
#ifndef FF_PASSES_H
#define FF_PASSES_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#ifdef __CUDACC__
#define FF_HD __host__ __device__
#else
#define FF_HD
#endif

/* LayerNorm (gpt_ops.c): rows i in [0, m), columns c in [0, cl) */
typedef struct {
    float *out, *mean, *rstd, *dinp, *dw, *db, *stats, *part;
    const float *inp, *w, *b, *dout;
    int64_t m, cl, C;
} ln_job;

/* element-wise: GELU, add, zero */
typedef struct {
    float *out;
    const float *inp, *dout;
} elem_job;

/* the embedding: rows of B T tokens, cl columns, the vocabulary block [v0, v0 + vl) */
typedef struct {
    float *out, *dwte, *dwpe;
    const float *wte, *wpe, *dout;
    const uint16_t *wte16; /* in place of wte: its bf16 copy (bf16-mixed; CPU) */
    const int32_t *tokens;
    int64_t T, v0, vl, cl, m;
} embed_job;

/* cross-entropy: m rows of vl logits, of which `valid` are vocabulary */
typedef struct {
    float *losses, *logits, *mine, *all, *rows;
    const int32_t *targets;
    int64_t m, v0, vl, valid;
    float dscale;
    int gxn;
} ce_job;

/* attention over B sequences of T, nh heads of hs; causal 0: every query
 * sees every key (the U-Net's, over an image's pixels; CPU only) */
struct ff_ctx;
typedef struct {
    struct ff_ctx *ctx;
    float *out, *att, *dqkv, *scratch;
    const float *qkv, *dout, *patt;
    int B, T, nh, hs;
    int causal;
    float *bf16; /* bf16-mixed: the rounded operands' scratch per thread; NULL: fp32 */
} attn_job;

/* the gradient norm's sums of squares, in blocks of FF_SUM_BLOCK */
enum { FF_SUM_BLOCK = 1 << 14 };
typedef struct {
    const float *p;
    size_t n;
    double *part;
} sumsq_job;

/* AdamW over the flat buffer; decay on [0, n_decay) */
typedef struct {
    float *p, *m, *v;
    const float *gr;
    float lr, b1, b2, bc1, bc2, eps, wd, grad_scale;
    size_t n_decay;
} adamw_job;

/* One AdamW update: parameter *p, moments *m and *v, the scaled gradient
 * `grad`, decoupled decay `decay` (the dense pass and SAMO's compressed one
 * share it, so their entries get the same bits) */
static inline FF_HD void ff_adamw_at(float *p, float *m, float *v, float grad, float b1, float b2,
                                     float bc1, float bc2, float lr, float eps, float decay)
{
    *m = b1 * *m + (1.0f - b1) * grad;
    *v = b2 * *v + (1.0f - b2) * grad * grad;
    float mhat = *m / bc1, vhat = *v / bc2;
    *p -= lr * (mhat / (sqrtf(vhat) + eps) + decay * *p);
}

/* a linear layer's bias: out (rows, nl) += b, or db (nl) += column sums of
 * dout: in blocks of FF_BIAS_BLOCK rows, each block's sum from zero (rows in
 * order), added to db block by block (so the GPU, a thread per block and
 * column, gives the CPU's bits) */
typedef struct {
    float *out, *db;
    const float *b, *dout;
    const uint16_t *dout16; /* in place of dout: its bf16 values (bf16-mixed on oneDNN; CPU) */
    int64_t r0, rows, nl;
} bias_job;
enum { FF_BIAS_BLOCK = 32 };

/* exp(x) for the wide element-wise loops (GELU, cross-entropy): Cody-Waite
 * reduction x = k ln2 + r and Cephes' degree-6 polynomial; inputs clamped to
 * [-87, 88]. Relative error against double exp at most 8.3e-8 (1.4 units
 * of 2^-24), measured on a 1e-4 grid over that range. Inline and call-free,
 * cheaper than libm's expf/tanhf here; GCC vectorizes the loops that call it
 * because the library is built with -fno-trapping-math (CMakeLists.txt:
 * without it the clamps count as control flow). A NaN input gives NaN: the
 * clamp would turn it into a finite number (and converting NaN to an integer
 * is undefined), so the arithmetic runs on the clamped value and NaN is
 * passed through at the end; a diverging run must still see its NaN loss.
 * The GPU runs the same arithmetic (built without contractions). */
static inline FF_HD float ff_exp_fast(float x_in)
{
    float x = x_in < -87.0f ? -87.0f : (x_in > 88.0f ? 88.0f : x_in);
    x = x == x ? x : 0.0f;
    /* round x / ln 2 to nearest: adding 1.5 * 2^23 leaves no fraction bits */
    float kf = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
    int32_t k = (int32_t)kf;
    float r = x - kf * 0.693359375f + kf * 2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    float y = p * r * r + r + 1.0f;
    int32_t bits = (k + 127) << 23; /* 2^k, k in [-126, 127] after the clamp */
#ifdef __CUDA_ARCH__
    float scale = __int_as_float(bits);
#else
    float scale;
    memcpy(&scale, &bits, sizeof scale);
#endif
    return x_in == x_in ? y * scale : x_in;
}

/* tanh(u) = 1 - 2 / (exp(2u) + 1) */
static inline FF_HD float ff_tanh_fast(float u)
{
    return 1.0f - 2.0f / (ff_exp_fast(2.0f * u) + 1.0f);
}

#define FF_GELU_SCALE 0.7978845608028654f /* sqrt(2/pi) */

static inline FF_HD float ff_gelu(float x)
{
    return 0.5f * x * (1.0f + ff_tanh_fast(FF_GELU_SCALE * (x + 0.044715f * x * x * x)));
}

/* d GELU(x) / dx */
static inline FF_HD float ff_gelu_grad(float x)
{
    float cube = 0.044715f * x * x * x;
    float th = ff_tanh_fast(FF_GELU_SCALE * (x + cube));
    float sech2 = 1.0f - th * th;
    return 0.5f * (1.0f + th) +
           x * 0.5f * sech2 * FF_GELU_SCALE * (1.0f + 3.0f * 0.044715f * x * x);
}

/* ---- the passes' work per index, the CPU's and the GPU's ------------------ */

/* LayerNorm's backward works in blocks of rows (ln_job.part). */
enum { FF_LN_BLOCK = 32 };

/* row i: the sum of its columns, in double (the mean's pass 1) */
static inline FF_HD void ff_ln_sums_at(const ln_job *j, int64_t i)
{
    const float *x = j->inp + i * j->cl;
    double s = 0;
    for (int64_t c = 0; c < j->cl; c++)
        s += x[c];
    j->mean[i] = (float)s;
}

/* row i: the mean from the all-reduced sum, the squared deviations about it */
static inline FF_HD void ff_ln_squares_at(const ln_job *j, int64_t i)
{
    const float *x = j->inp + i * j->cl;
    j->mean[i] /= (float)j->C;
    double s = 0;
    for (int64_t c = 0; c < j->cl; c++) {
        double dx = (double)x[c] - j->mean[i];
        s += dx * dx;
    }
    j->rstd[i] = (float)s;
}

/* rstd of row i from its all-reduced squares */
static inline FF_HD void ff_ln_rstd_at(const ln_job *j, int64_t i)
{
    j->rstd[i] = 1.0f / sqrtf(j->rstd[i] / (float)j->C + 1e-5f);
}

/* row i, column c normalised (the GPU: a thread per element) */
static inline FF_HD void ff_ln_out_at(const ln_job *j, int64_t i, int64_t c)
{
    const int64_t e = i * j->cl + c;
    j->out[e] = (j->inp[e] - j->mean[i]) * j->rstd[i] * j->w[c] + j->b[c];
}

/* row i normalised; with finish, rstd from the all-reduced squares first */
static inline FF_HD void ff_ln_normalize_at(const ln_job *j, int64_t i, int finish)
{
    if (finish)
        ff_ln_rstd_at(j, i);
    for (int64_t c = 0; c < j->cl; c++)
        ff_ln_out_at(j, i, c);
}

/* row i: sum(dnorm) and sum(dnorm * norm), dnorm = dout * w */
static inline FF_HD void ff_ln_back_sums_at(const ln_job *j, int64_t i)
{
    const float *x = j->inp + i * j->cl, *g = j->dout + i * j->cl;
    float mu = j->mean[i], r = j->rstd[i];
    double s1 = 0, s2 = 0;
    for (int64_t c = 0; c < j->cl; c++) {
        float norm = (x[c] - mu) * r, dnorm = j->w[c] * g[c];
        s1 += dnorm;
        s2 += (double)dnorm * norm;
    }
    j->stats[2 * i] = (float)s1;
    j->stats[2 * i + 1] = (float)s2;
}

/* row i, column c of LayerNorm's backward: dinp += its gradient, and the
 * row's terms of the w and b gradients added to *sw and *sb */
static inline FF_HD void ff_ln_back_at(const ln_job *j, int64_t i, int64_t c, float *sw, float *sb)
{
    const int64_t e = i * j->cl + c;
    const float r = j->rstd[i], norm = (j->inp[e] - j->mean[i]) * r, g = j->dout[e];
    const float dnorm = j->w[c] * g, dnorm_mean = j->stats[2 * i] / (float)j->C,
                dnorm_norm_mean = j->stats[2 * i + 1] / (float)j->C;
    *sb += g;
    *sw += norm * g;
    j->dinp[e] += (dnorm - dnorm_mean - norm * dnorm_norm_mean) * r;
}

/* block blk of FF_LN_BLOCK rows: dinp for its rows, and the block's own sums
 * of the w and b gradients (from zero, rows in order) into part (the GPU: a
 * thread per block and column, the same sums) */
static inline FF_HD void ff_ln_back_block_at(const ln_job *j, int64_t blk)
{
    const int64_t cl = j->cl;
    float *pdw = j->part + 2 * blk * cl, *pdb = pdw + cl;
    for (int64_t c = 0; c < 2 * cl; c++)
        pdw[c] = 0.0f;
    int64_t end = (blk + 1) * FF_LN_BLOCK < j->m ? (blk + 1) * FF_LN_BLOCK : j->m;
    for (int64_t i = blk * FF_LN_BLOCK; i < end; i++)
        for (int64_t c = 0; c < cl; c++)
            ff_ln_back_at(j, i, c, &pdw[c], &pdb[c]);
}

/* cross-entropy, row i: combine the X ranks' triples in rank order (M = max
 * M_x, S = sum S_x exp(M_x - M)); the row's loss, and the factor f that
 * turns its exp(l - local max) into dscale * softmax (with the target's
 * dscale then taken off: ff_ce_grad_at) */
static inline FF_HD float ff_ce_loss_at(const ce_job *j, int64_t i)
{
    const int64_t m = j->m;
    float mx = -INFINITY, target = 0;
    for (int r = 0; r < j->gxn; r++)
        mx = j->all[(int64_t)r * 3 * m + 3 * i] > mx ? j->all[(int64_t)r * 3 * m + 3 * i] : mx;
    double sum = 0;
    for (int r = 0; r < j->gxn; r++) {
        const float *tr = j->all + (int64_t)r * 3 * m + 3 * i;
        if (tr[1] > 0)
            sum += (double)tr[1] * exp((double)tr[0] - mx);
        target += tr[2];
    }
    float lse = mx + (float)log(sum);
    j->losses[i] = lse - target;
    /* softmax = exp(l - local max) * exp(local max - lse) */
    return j->dscale * expf(j->mine[3 * i] - lse);
}

/* row i, column c of the gradient in place, f from ff_ce_loss_at */
static inline FF_HD void ff_ce_grad_at(const ce_job *j, int64_t i, int64_t c, float f)
{
    float *x = j->logits + i * j->vl + c;
    if (c >= j->valid) {
        *x = 0.0f;
        return;
    }
    *x *= f;
    if (c == (int64_t)j->targets[i] - j->v0)
        *x -= j->dscale;
}

/* row i whole: the loss, then (training) the gradient */
static inline FF_HD void ff_ce_combine_at(const ce_job *j, int64_t i)
{
    const float f = ff_ce_loss_at(j, i);
    if (j->dscale == 0.0f)
        return;
    for (int64_t c = 0; c < j->vl; c++)
        ff_ce_grad_at(j, i, c, f);
}

/* Row t of a causal softmax over T scores, in place: the first t + 1
 * normalised, the rest zero (attention, gpt_ops.c; the GPU's kernel runs a
 * warp per row, its sums in another order). */
static inline FF_HD void ff_softmax_causal_row(float *row, int t, int T)
{
    float mx = row[0], sum = 0;
    for (int u = 1; u <= t; u++)
        mx = row[u] > mx ? row[u] : mx;
    for (int u = 0; u <= t; u++) {
        row[u] = expf(row[u] - mx);
        sum += row[u];
    }
    float inv = 1.0f / sum;
    for (int u = 0; u <= t; u++)
        row[u] *= inv;
    for (int u = t + 1; u < T; u++)
        row[u] = 0.0f;
}

/* Its backward for row t, in place: ds = p * (dp - sum_u p dp) on the
 * first t + 1, zero above the diagonal. */
static inline FF_HD void ff_softmax_causal_back_row(float *dr, const float *pr, int t, int T)
{
    float dot = 0;
    for (int u = 0; u <= t; u++)
        dot += pr[u] * dr[u];
    for (int u = 0; u <= t; u++)
        dr[u] = pr[u] * (dr[u] - dot);
    for (int u = t + 1; u < T; u++)
        dr[u] = 0.0f;
}

/* the sum of squares of block b, in double with FF_SUM_CHAINS running sums
 * (element i to sum i mod 32: independent chains the compiler vectorizes
 * into four AVX-512 or eight AVX2 accumulators, enough to keep up with
 * memory; with eight, one accumulator's FMA latency held the pass to
 * 14 GB/s, 35 ms per step at 124M) added pairwise in a fixed order */
enum { FF_SUM_CHAINS = 32 };
/* the running sums added pairwise, in this order (SAMO's pass too) */
static inline FF_HD double ff_sum_chains(double *s)
{
    for (int w = FF_SUM_CHAINS / 2; w >= 1; w /= 2)
        for (int k = 0; k < w; k++)
            s[k] += s[k + w];
    return s[0];
}
static inline FF_HD void ff_sumsq_block_at(const sumsq_job *j, int64_t b)
{
    size_t i0 = (size_t)b * FF_SUM_BLOCK, i1 = i0 + FF_SUM_BLOCK < j->n ? i0 + FF_SUM_BLOCK : j->n;
    double s[FF_SUM_CHAINS] = {0};
    size_t i = i0;
    for (; i + FF_SUM_CHAINS <= i1; i += FF_SUM_CHAINS)
        for (int k = 0; k < FF_SUM_CHAINS; k++)
            s[k] += (double)j->p[i + k] * j->p[i + k];
    for (int k = 0; i < i1; i++, k++)
        s[k] += (double)j->p[i] * j->p[i];
    j->part[b] = ff_sum_chains(s);
}

#endif
