/* The GPT's operations outside the linear layers (gpt_ops.h). Each runs on
 * the rank's rows and columns; the only communication is the row statistics
 * of LayerNorm (Y), the embedding's sum (X) and cross-entropy's triples (X). */
#include "gpt_ops.h"

#include <cblas.h>
#include <math.h>
#include <string.h>

#include "internal.h"

/* exp(x) for the wide elementwise loops (GELU, cross-entropy): Cody-Waite
 * reduction x = k ln2 + r and Cephes' degree-6 polynomial; inputs clamped to
 * [-87, 88]. Relative error against double exp at most 8.3e-8 (1.4 units
 * of 2^-24), measured on a 1e-4 grid over that range. Inline and call-free,
 * cheaper than libm's expf/tanhf here; GCC vectorizes the loops that call it
 * because the library is built with -fno-trapping-math (CMakeLists.txt:
 * without it the clamps count as control flow). A NaN input
 * gives NaN: the clamp would turn it into a finite number (and converting
 * NaN to an integer is undefined), so the arithmetic runs on the clamped
 * value and NaN is passed through at the end; a diverging run must still
 * see its NaN loss. */
static inline float exp_fast(float x_in)
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
    float scale;
    memcpy(&scale, &bits, sizeof scale);
    return x_in == x_in ? y * scale : x_in;
}

/* tanh(u) = 1 - 2 / (exp(2u) + 1) */
static inline float tanh_fast(float u) { return 1.0f - 2.0f / (exp_fast(2.0f * u) + 1.0f); }

/* ---- LayerNorm ------------------------------------------------------------- */

int ff_ln_forward(ff_group *gy, float *out, float *mean, float *rstd, const float *inp,
                  const float *w, const float *b, int64_t m, int64_t cl, int64_t C)
{
    /* pass 1: mean. Sums in double, one float per row crosses Y. */
    for (int64_t i = 0; i < m; i++) {
        const float *x = inp + i * cl;
        double s = 0;
        for (int64_t j = 0; j < cl; j++)
            s += x[j];
        mean[i] = (float)s;
    }
    int rc = ff_allreduce(gy, mean, mean, (size_t)m, NULL);
    if (rc)
        return rc;
    for (int64_t i = 0; i < m; i++)
        mean[i] /= (float)C;
    /* pass 2: variance about the mean (stable where E[x^2] - mean^2 is not) */
    for (int64_t i = 0; i < m; i++) {
        const float *x = inp + i * cl;
        double s = 0;
        for (int64_t j = 0; j < cl; j++) {
            double dx = (double)x[j] - mean[i];
            s += dx * dx;
        }
        rstd[i] = (float)s;
    }
    if ((rc = ff_allreduce(gy, rstd, rstd, (size_t)m, NULL)))
        return rc;
    for (int64_t i = 0; i < m; i++) {
        rstd[i] = 1.0f / sqrtf(rstd[i] / (float)C + 1e-5f);
        const float *x = inp + i * cl;
        float *o = out + i * cl, mu = mean[i], r = rstd[i];
        for (int64_t j = 0; j < cl; j++)
            o[j] = (x[j] - mu) * r * w[j] + b[j];
    }
    return FF_OK;
}

int ff_ln_backward(ff_group *gy, float *dinp, float *dw, float *db, const float *dout,
                   const float *inp, const float *w, const float *mean, const float *rstd,
                   int64_t m, int64_t cl, int64_t C, float *scratch)
{
    /* per row: sum(dnorm) and sum(dnorm * norm), dnorm = dout * w */
    for (int64_t i = 0; i < m; i++) {
        const float *x = inp + i * cl, *g = dout + i * cl;
        float mu = mean[i], r = rstd[i];
        double s1 = 0, s2 = 0;
        for (int64_t j = 0; j < cl; j++) {
            float norm = (x[j] - mu) * r, dnorm = w[j] * g[j];
            s1 += dnorm;
            s2 += (double)dnorm * norm;
        }
        scratch[2 * i] = (float)s1;
        scratch[2 * i + 1] = (float)s2;
    }
    int rc = ff_allreduce(gy, scratch, scratch, (size_t)(2 * m), NULL);
    if (rc)
        return rc;
    for (int64_t i = 0; i < m; i++) {
        const float *x = inp + i * cl, *g = dout + i * cl;
        float *d = dinp + i * cl;
        float mu = mean[i], r = rstd[i];
        float dnorm_mean = scratch[2 * i] / (float)C,
              dnorm_norm_mean = scratch[2 * i + 1] / (float)C;
        for (int64_t j = 0; j < cl; j++) {
            float norm = (x[j] - mu) * r, dnorm = w[j] * g[j];
            db[j] += g[j];
            dw[j] += norm * g[j];
            d[j] += (dnorm - dnorm_mean - norm * dnorm_norm_mean) * r;
        }
    }
    return FF_OK;
}

/* ---- attention ---------------------------------------------------------------
 * Per sequence and head, with BLAS: S = Q K^T / sqrt(hs) over the full T x T
 * (the masked half is computed and discarded, as a batched-matmul
 * implementation does), causal softmax by rows, O = P V. */

void ff_attention_forward(ff_ctx *ctx, float *out, float *att, const float *qkv, int B, int T,
                          int nh, int hs)
{
    const int64_t c = (int64_t)nh * hs, c3 = 3 * c;
    const float scale = 1.0f / sqrtf((float)hs);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < nh; h++) {
            const float *q = qkv + (int64_t)b * T * c3 + (int64_t)h * hs;
            const float *k = q + c, *v = q + 2 * c;
            float *p = att + ((int64_t)b * nh + h) * T * T;
            // p (T, T) = q (T, hs) k^T (hs, T) * scale
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, T, hs, scale, q, (int)c3, k,
                        (int)c3, 0.0f, p, T);
            for (int t = 0; t < T; t++) {
                float *row = p + (int64_t)t * T, mx = row[0], sum = 0;
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
            // o (T, hs) = p (T, T) v (T, hs)
            float *o = out + (int64_t)b * T * c + (int64_t)h * hs;
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, T, hs, T, 1.0f, p, T, v, (int)c3,
                        0.0f, o, (int)c);
            ff_poll(ctx); /* collectives in flight advance between heads */
        }
}

void ff_attention_backward(ff_ctx *ctx, float *dqkv, float *scratch, const float *dout,
                           const float *qkv, const float *att, int B, int T, int nh, int hs)
{
    const int64_t c = (int64_t)nh * hs, c3 = 3 * c;
    const float scale = 1.0f / sqrtf((float)hs);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < nh; h++) {
            const int64_t off = (int64_t)b * T * c3 + (int64_t)h * hs;
            const float *q = qkv + off, *k = q + c, *v = q + 2 * c;
            float *dq = dqkv + off, *dk = dq + c, *dv = dq + 2 * c;
            const float *p = att + ((int64_t)b * nh + h) * T * T;
            const float *g = dout + (int64_t)b * T * c + (int64_t)h * hs;
            float *dp = scratch;
            // dp (T, T) = g (T, hs) v^T; dv (T, hs) = p^T g
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, T, hs, 1.0f, g, (int)c, v,
                        (int)c3, 0.0f, dp, T);
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, T, hs, T, 1.0f, p, T, g, (int)c,
                        0.0f, dv, (int)c3);
            // softmax backward: ds = p * (dp - sum_u p dp), zero above the diagonal
            for (int t = 0; t < T; t++) {
                const float *pr = p + (int64_t)t * T;
                float *dr = dp + (int64_t)t * T, dot = 0;
                for (int u = 0; u <= t; u++)
                    dot += pr[u] * dr[u];
                for (int u = 0; u <= t; u++)
                    dr[u] = pr[u] * (dr[u] - dot);
                for (int u = t + 1; u < T; u++)
                    dr[u] = 0.0f;
            }
            // dq (T, hs) = ds k * scale; dk (T, hs) = ds^T q * scale
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, T, hs, T, scale, dp, T, k,
                        (int)c3, 0.0f, dq, (int)c3);
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, T, hs, T, scale, dp, T, q, (int)c3,
                        0.0f, dk, (int)c3);
            ff_poll(ctx);
        }
}

/* ---- GELU ------------------------------------------------------------------------ */

#define GELU_SCALE 0.7978845608028654f /* sqrt(2/pi) */

void ff_gelu_forward(float *out, const float *inp, int64_t n)
{
    for (int64_t i = 0; i < n; i++) {
        float x = inp[i];
        out[i] = 0.5f * x * (1.0f + tanh_fast(GELU_SCALE * (x + 0.044715f * x * x * x)));
    }
}

void ff_gelu_backward(float *dinp, const float *inp, const float *dout, int64_t n)
{
    for (int64_t i = 0; i < n; i++) {
        float x = inp[i], cube = 0.044715f * x * x * x;
        float th = tanh_fast(GELU_SCALE * (x + cube));
        float sech2 = 1.0f - th * th;
        float local =
            0.5f * (1.0f + th) + x * 0.5f * sech2 * GELU_SCALE * (1.0f + 3.0f * 0.044715f * x * x);
        dinp[i] = local * dout[i];
    }
}

/* ---- embedding -------------------------------------------------------------------- */

int ff_embed_forward(ff_group *gx, float *out, const int32_t *tokens, const float *wte_block,
                     const float *wpe, int64_t B, int64_t T, int64_t v0, int64_t vl, int64_t cl)
{
    const int64_t m = B * T;
    for (int64_t i = 0; i < m; i++) {
        int64_t v = (int64_t)tokens[i] - v0;
        float *o = out + i * cl;
        if (v >= 0 && v < vl)
            memcpy(o, wte_block + v * cl, (size_t)cl * sizeof(float));
        else
            memset(o, 0, (size_t)cl * sizeof(float));
    }
    /* exactly one X rank holds each token's row: the sum is exact */
    int rc = ff_allreduce(gx, out, out, (size_t)(m * cl), NULL);
    if (rc)
        return rc;
    for (int64_t i = 0; i < m; i++) {
        const float *pos = wpe + (i % T) * cl;
        float *o = out + i * cl;
        for (int64_t j = 0; j < cl; j++)
            o[j] += pos[j];
    }
    return FF_OK;
}

void ff_embed_backward(float *dwte_block, float *dwpe, const float *dout, const int32_t *tokens,
                       int64_t B, int64_t T, int64_t v0, int64_t vl, int64_t cl)
{
    for (int64_t i = 0; i < B * T; i++) {
        const float *g = dout + i * cl;
        float *dp = dwpe + (i % T) * cl;
        for (int64_t j = 0; j < cl; j++)
            dp[j] += g[j];
        int64_t v = (int64_t)tokens[i] - v0;
        if (v >= 0 && v < vl) {
            float *dw = dwte_block + v * cl;
            for (int64_t j = 0; j < cl; j++)
                dw[j] += g[j];
        }
    }
}

/* ---- cross-entropy ------------------------------------------------------------------ */

int ff_crossentropy(ff_group *gx, float *losses, float *logits, const int32_t *targets, int64_t m,
                    int64_t v0, int64_t vl, int64_t V, float dscale, float *scratch)
{
    const int gxn = ff_group_size(gx);
    const int64_t valid = v0 >= V ? 0 : (v0 + vl <= V ? vl : V - v0); /* real columns */
    float *mine = scratch, *all = scratch + 3 * m;
    for (int64_t i = 0; i < m; i++) {
        float *row = logits + i * vl, mx = -INFINITY;
        for (int64_t j = 0; j < valid; j++)
            mx = row[j] > mx ? row[j] : mx;
        int64_t t = (int64_t)targets[i] - v0;
        mine[3 * i] = mx;
        mine[3 * i + 2] = t >= 0 && t < valid ? row[t] : 0.0f;
        /* training keeps exp(l - local max) in place of the logits: the
         * gradient is a rescaling of it. Two loops: the first vectorizes. */
        float *e = row;
        if (dscale == 0.0f) {
            e = scratch + 3 * m + (int64_t)gxn * 3 * m; /* a row of scratch */
        }
        for (int64_t j = 0; j < valid; j++)
            e[j] = exp_fast(row[j] - mx);
        double sum = 0;
        for (int64_t j = 0; j < valid; j++)
            sum += e[j];
        mine[3 * i + 1] = (float)sum;
    }
    int rc = ff_allgather(gx, mine, all, (size_t)(3 * m), NULL);
    if (rc)
        return rc;
    /* combine in rank order: M = max M_x, S = sum S_x exp(M_x - M) */
    for (int64_t i = 0; i < m; i++) {
        float mx = -INFINITY, target = 0;
        for (int r = 0; r < gxn; r++)
            mx = all[(int64_t)r * 3 * m + 3 * i] > mx ? all[(int64_t)r * 3 * m + 3 * i] : mx;
        double sum = 0;
        for (int r = 0; r < gxn; r++) {
            const float *tr = all + (int64_t)r * 3 * m + 3 * i;
            if (tr[1] > 0)
                sum += (double)tr[1] * exp((double)tr[0] - mx);
            target += tr[2];
        }
        float lse = mx + (float)log(sum);
        losses[i] = lse - target;
        if (dscale == 0.0f)
            continue;
        float *row = logits + i * vl;
        int64_t t = (int64_t)targets[i] - v0;
        /* softmax = exp(l - local max) * exp(local max - lse) */
        const float f = dscale * expf(mine[3 * i] - lse);
        for (int64_t j = 0; j < valid; j++)
            row[j] *= f;
        if (t >= 0 && t < valid)
            row[t] -= dscale;
        for (int64_t j = valid; j < vl; j++)
            row[j] = 0.0f;
    }
    return FF_OK;
}
