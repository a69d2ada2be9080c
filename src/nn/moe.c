/* The mixture-of-experts feed-forward layer, serial (moe.h; docs/moe.md). */
#include "moe.h"

#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpt_ops.h"   /* ff_gelu_forward, ff_gelu_backward */
#include "internal.h"  /* ff_set_error */
#include "util/file.h" /* ff_format_error */

struct ff_moe_state {
    int64_t m, cap; /* tokens of the last forward; allocated for */
    int E, k;
    int64_t C, H;
    float *probs;          /* m E: the router's softmax */
    int *choice;           /* m k: expert of each assignment */
    int64_t *row;          /* m k: its row in the experts' buffers, -1 dropped */
    float *gate;           /* m k */
    int64_t *start;        /* E + 1: expert e's rows are [start[e], start[e+1]) */
    int64_t *row_token;    /* the token of each row */
    float *X, *Hp, *A, *O; /* rows: input, pre-GELU, post-GELU, output */
    float *dO, *dA, *dp;   /* backward scratch: rows C, rows H, m E */
    float *dgate;          /* m k */
    double *f, *P;         /* E: first-choice fractions, mean probabilities */
    float aux;
    double dropped;
};

void ff_moe_sizes(const ff_moe_shape *s, int64_t sizes[5])
{
    sizes[0] = s->C * s->E;
    sizes[1] = (int64_t)s->E * s->C * s->H;
    sizes[2] = (int64_t)s->E * s->H;
    sizes[3] = (int64_t)s->E * s->H * s->C;
    sizes[4] = (int64_t)s->E * s->C;
}

int64_t ff_moe_capacity(const ff_moe_shape *s)
{
    /* F k T / E rounded up; a product a rounding above an integer is that
     * integer: 1.1 x 10 is 11.000000000000002 in double, and a factor given
     * as a float (the GPT's) is off by up to 2^-24 of itself (1.2f x 1000
     * / 8 is 150.000006), so within 4 float epsilons */
    double x = s->factor * s->top_k * (double)s->T / s->E;
    return (int64_t)ceil(x - 4 * FLT_EPSILON * x);
}

int ff_moe_check(const ff_moe_shape *s, char *err, size_t err_len)
{
    if (s->E < 1 || s->E > FF_MOE_MAX_EXPERTS)
        return ff_format_error(err, err_len, FF_EINVAL, "%d experts: expected 1 to %d", s->E,
                               FF_MOE_MAX_EXPERTS);
    if (s->top_k < 1 || s->top_k > 2 || s->top_k > s->E)
        return ff_format_error(err, err_len, FF_EINVAL,
                               "top-%d routing with %d expert%s: expected top-1 or top-2, at "
                               "most the number of experts",
                               s->top_k, s->E, s->E == 1 ? "" : "s");
    if (!(s->factor > 0) || s->factor > 1e6)
        return ff_format_error(err, err_len, FF_EINVAL,
                               "capacity factor %g: expected a number above 0, at most 1e6",
                               s->factor);
    if (!(s->aux_coef >= 0) || !isfinite(s->aux_coef))
        return ff_format_error(err, err_len, FF_EINVAL,
                               "auxiliary loss coefficient %g: expected >= 0", s->aux_coef);
    if (s->C < 1 || s->H < 1 || s->T < 1)
        return ff_format_error(err, err_len, FF_EINVAL, "MoE sizes C=%lld H=%lld T=%lld",
                               (long long)s->C, (long long)s->H, (long long)s->T);
    return FF_OK;
}

void ff_moe_state_free(ff_moe_state *st)
{
    if (!st)
        return;
    void *p[] = {st->probs, st->choice, st->row, st->gate, st->start, st->row_token,
                 st->X,     st->Hp,     st->A,   st->O,    st->dO,    st->dA,
                 st->dp,    st->f,      st->P,   st->dgate};
    for (size_t i = 0; i < sizeof p / sizeof p[0]; i++)
        free(p[i]);
    free(st);
}

/* Room for m tokens (rows: at most m k assignments). */
static int reserve(ff_moe_state **pst, const ff_moe_shape *s, int64_t m)
{
    ff_moe_state *st = *pst;
    if (st && st->cap >= m && st->E == s->E && st->k == s->top_k && st->C == s->C && st->H == s->H)
        return FF_OK;
    ff_moe_state_free(st);
    *pst = st = calloc(1, sizeof *st);
    if (!st)
        return FF_ENOMEM;
    const size_t E = (size_t)s->E, k = (size_t)s->top_k, M = (size_t)m, rows = M * k;
    const size_t C = (size_t)s->C, H = (size_t)s->H;
    st->cap = m, st->E = s->E, st->k = s->top_k, st->C = s->C, st->H = s->H;
    st->probs = malloc(M * E * sizeof(float));
    st->choice = malloc(rows * sizeof(int));
    st->row = malloc(rows * sizeof(int64_t));
    st->gate = malloc(rows * sizeof(float));
    st->start = malloc((E + 1) * sizeof(int64_t));
    st->row_token = malloc((rows + 1) * sizeof(int64_t));
    st->X = malloc((rows * C + 1) * sizeof(float));
    st->Hp = malloc((rows * H + 1) * sizeof(float));
    st->A = malloc((rows * H + 1) * sizeof(float));
    st->O = malloc((rows * C + 1) * sizeof(float));
    st->dO = malloc((rows * C + 1) * sizeof(float));
    st->dA = malloc((rows * H + 1) * sizeof(float));
    st->dp = malloc(M * E * sizeof(float));
    st->dgate = malloc(rows * sizeof(float));
    st->f = malloc(E * sizeof(double));
    st->P = malloc(E * sizeof(double));
    if (!st->probs || !st->choice || !st->row || !st->gate || !st->start || !st->row_token ||
        !st->X || !st->Hp || !st->A || !st->O || !st->dO || !st->dA || !st->dp || !st->f ||
        !st->dgate || !st->P) {
        ff_moe_state_free(st);
        *pst = NULL;
        return FF_ENOMEM;
    }
    return FF_OK;
}

void ff_moe_route(int E, int k, int64_t m, float *probs, int *choice, float *gate)
{
    for (int64_t t = 0; t < m; t++) {
        float *p = probs + t * E, mx = p[0];
        for (int e = 1; e < E; e++)
            mx = p[e] > mx ? p[e] : mx;
        float sum = 0;
        for (int e = 0; e < E; e++)
            sum += p[e] = expf(p[e] - mx);
        for (int e = 0; e < E; e++)
            p[e] /= sum;
        int *c = choice + t * k;
        c[0] = 0;
        for (int e = 1; e < E; e++)
            c[0] = p[e] > p[c[0]] ? e : c[0];
        if (k == 2) {
            c[1] = c[0] == 0 ? 1 : 0;
            for (int e = 0; e < E; e++)
                if (e != c[0] && p[e] > p[c[1]])
                    c[1] = e;
            float s2 = p[c[0]] + p[c[1]];
            gate[t * 2] = p[c[0]] / s2;
            gate[t * 2 + 1] = p[c[1]] / s2;
        } else {
            gate[t] = p[c[0]];
        }
    }
}

void ff_moe_route_balanced(int E, int k, int64_t T, int64_t m, const float *probs, int *choice,
                           float *gate)
{
    for (int64_t t = 0; t < m; t++) {
        const float *p = probs + t * E;
        int *c = choice + t * k;
        for (int j = 0; j < k; j++)
            c[j] = (int)(((t % T) * k + j) % E);
        if (k == 2) {
            float s2 = p[c[0]] + p[c[1]];
            gate[t * 2] = p[c[0]] / s2;
            gate[t * 2 + 1] = p[c[1]] / s2;
        } else {
            gate[t] = p[c[0]];
        }
    }
}

int64_t ff_moe_place(int E, int k, int64_t cap, int64_t T, int64_t m, const int *choice,
                     int64_t *row, int64_t *start, int64_t *row_token)
{
    int64_t count[FF_MOE_MAX_EXPERTS], dropped = 0;
    for (int64_t q = 0; q < m; q += T) {
        memset(count, 0, (size_t)E * sizeof count[0]);
        for (int j = 0; j < k; j++)
            for (int64_t t = q; t < q + T; t++) {
                int e = choice[t * k + j];
                int keep = count[e] < cap;
                count[e] += keep;
                row[t * k + j] = keep ? 0 : -1;
                dropped += !keep;
            }
    }
    /* rows expert by expert, each expert's in token order: count, then
     * place (a token has at most one assignment per expert) */
    for (int e = 0; e <= E; e++)
        start[e] = 0;
    for (int64_t a = 0; a < m * k; a++)
        if (row[a] >= 0)
            start[choice[a] + 1]++;
    for (int e = 0; e < E; e++)
        start[e + 1] += start[e];
    for (int e = 0; e < E; e++)
        count[e] = start[e];
    for (int64_t a = 0; a < m * k; a++)
        if (row[a] >= 0) {
            int64_t r = count[choice[a]]++;
            row[a] = r;
            row_token[r] = a / k;
        }
    return dropped;
}

void ff_moe_gate_backward(int E, int k, int64_t m, const float *probs, const int *choice,
                          const int64_t *row, const float *dgate, const double *f_over_n,
                          double aux_scale, float *dp)
{
    for (int64_t t = 0; t < m; t++) {
        const float *pt = probs + t * E, *dg = dgate + t * k;
        const int *ch = choice + t * k;
        float *dpt = dp + t * E, d0 = row[t * k] < 0 ? 0 : dg[0];
        for (int e = 0; e < E; e++)
            dpt[e] = 0;
        if (k == 1) {
            dpt[ch[0]] += d0;
        } else { /* g0 = p0 / (p0 + p1), g1 = p1 / (p0 + p1) */
            float d1 = row[t * k + 1] < 0 ? 0 : dg[1];
            float p0 = pt[ch[0]], p1 = pt[ch[1]], s2 = (p0 + p1) * (p0 + p1);
            dpt[ch[0]] += (d0 - d1) * p1 / s2;
            dpt[ch[1]] += (d1 - d0) * p0 / s2;
        }
        for (int e = 0; e < E; e++) /* aux = scale sum_e f_e sum_t p_te / n */
            dpt[e] += (float)(aux_scale * f_over_n[e]);
        /* through the softmax */
        float dot = 0;
        for (int e = 0; e < E; e++)
            dot += pt[e] * dpt[e];
        for (int e = 0; e < E; e++)
            dpt[e] = pt[e] * (dpt[e] - dot);
    }
}

int ff_moe_forward(ff_ctx *ctx, ff_gemm *g, const ff_moe_shape *s, const ff_moe_params *p,
                   const float *x, int64_t m, float *y, ff_moe_state **pst)
{
    char err[256];
    int rc = ff_moe_check(s, err, sizeof err);
    if (rc)
        return ff_set_error(ctx, rc, "%s", err);
    if (m < 1 || m % s->T)
        return ff_set_error(ctx, FF_EINVAL,
                            "MoE layer: %lld tokens are not whole sequences of %lld", (long long)m,
                            (long long)s->T);
    if ((rc = reserve(pst, s, m)))
        return ff_set_error(ctx, rc, "out of memory for the MoE layer's %lld tokens", (long long)m);
    ff_moe_state *st = *pst;
    const int E = s->E, k = s->top_k;
    const int64_t C = s->C, H = s->H;
    st->m = m;
    if ((rc =
             ff_gemm_run(g, "moe router", 0, 0, m, E, C, 1.0f, x, C, p->wr, E, 0.0f, st->probs, E)))
        return rc;
    ff_moe_route(E, k, m, st->probs, st->choice, st->gate);
    int64_t dropped = ff_moe_place(E, k, ff_moe_capacity(s), s->T, m, st->choice, st->row,
                                   st->start, st->row_token);
    st->dropped = (double)dropped / (double)(m * k);
    /* the experts, each on its rows */
    for (int e = 0; e < E; e++) {
        int64_t r0 = st->start[e], n = st->start[e + 1] - r0;
        if (n == 0)
            continue;
        float *X = st->X + r0 * C, *Hp = st->Hp + r0 * H, *A = st->A + r0 * H, *O = st->O + r0 * C;
        for (int64_t i = 0; i < n; i++)
            memcpy(X + i * C, x + st->row_token[r0 + i] * C, (size_t)C * sizeof(float));
        const float *w1 = p->w1 + (int64_t)e * C * H, *b1 = p->b1 + (int64_t)e * H;
        const float *w2 = p->w2 + (int64_t)e * H * C, *b2 = p->b2 + (int64_t)e * C;
        for (int64_t i = 0; i < n; i++)
            memcpy(Hp + i * H, b1, (size_t)H * sizeof(float));
        if ((rc = ff_gemm_run(g, "moe w1", 0, 0, n, H, C, 1.0f, X, C, w1, H, 1.0f, Hp, H)))
            return rc;
        ff_gelu_forward(ctx, A, Hp, n * H);
        for (int64_t i = 0; i < n; i++)
            memcpy(O + i * C, b2, (size_t)C * sizeof(float));
        if ((rc = ff_gemm_run(g, "moe w2", 0, 0, n, C, H, 1.0f, A, H, w2, C, 1.0f, O, C)))
            return rc;
    }
    /* combine: each token's kept outputs, weighted by their gates, in slot order */
    memset(y, 0, (size_t)(m * C) * sizeof(float));
    for (int64_t t = 0; t < m; t++)
        for (int j = 0; j < k; j++) {
            int64_t r = st->row[t * k + j];
            if (r < 0)
                continue;
            float gt = st->gate[t * k + j], *yt = y + t * C;
            const float *o = st->O + r * C;
            for (int64_t c = 0; c < C; c++)
                yt[c] += gt * o[c];
        }
    /* load balancing (Switch Transformer): coef E sum_e f_e P_e */
    double aux = 0;
    for (int e = 0; e < E; e++)
        st->f[e] = st->P[e] = 0;
    for (int64_t t = 0; t < m; t++) {
        st->f[st->choice[t * k]] += 1;
        for (int e = 0; e < E; e++)
            st->P[e] += st->probs[t * E + e];
    }
    for (int e = 0; e < E; e++) {
        st->f[e] /= (double)m;
        st->P[e] /= (double)m;
        aux += st->f[e] * st->P[e];
    }
    st->aux = (float)(s->aux_coef * E * aux);
    return FF_OK;
}

float ff_moe_aux_loss(const ff_moe_state *st) { return st ? st->aux : 0; }
double ff_moe_dropped(const ff_moe_state *st) { return st ? st->dropped : 0; }

void ff_moe_choices(const ff_moe_state *st, int *choice)
{
    for (int64_t i = 0; st && i < st->m * st->k; i++)
        choice[i] = st->row[i] < 0 ? -1 : st->choice[i];
}

/* Column sums of a (n, w) into acc (w). */
static void add_colsums(float *acc, const float *a, int64_t n, int64_t w)
{
    for (int64_t i = 0; i < n; i++)
        for (int64_t c = 0; c < w; c++)
            acc[c] += a[i * w + c];
}

int ff_moe_backward(ff_ctx *ctx, ff_gemm *g, const ff_moe_shape *s, const ff_moe_params *p,
                    const float *x, const float *dy, float *dx, const ff_moe_params *grad,
                    ff_moe_state *st)
{
    if (!st || st->E != s->E || st->k != s->top_k || st->C != s->C || st->H != s->H)
        return ff_set_error(ctx, FF_EINVAL, "MoE backward without its forward's shape");
    const int E = s->E, k = s->top_k;
    const int64_t C = s->C, H = s->H, m = st->m;
    int rc;
    /* the gates' gradients and each row's output gradient */
    memset(dx, 0, (size_t)(m * C) * sizeof(float));
    float *dgate = st->dgate;
    for (int64_t t = 0; t < m; t++) {
        const float *dyt = dy + t * C;
        for (int j = 0; j < k; j++) {
            int64_t r = st->row[t * k + j];
            dgate[t * k + j] = 0;
            if (r < 0)
                continue;
            const float *o = st->O + r * C;
            float gt = st->gate[t * k + j], *dO = st->dO + r * C, d = 0;
            for (int64_t c = 0; c < C; c++) {
                d += dyt[c] * o[c];
                dO[c] = gt * dyt[c];
            }
            dgate[t * k + j] = d;
        }
    }
    for (int e = 0; e < E; e++) /* f_e / m */
        st->f[e] /= (double)m;
    ff_moe_gate_backward(E, k, m, st->probs, st->choice, st->row, dgate, st->f, s->aux_coef * E,
                         st->dp);
    for (int e = 0; e < E; e++)
        st->f[e] *= (double)m;
    /* the experts backward */
    for (int e = 0; e < E; e++) {
        int64_t r0 = st->start[e], n = st->start[e + 1] - r0;
        if (n == 0)
            continue;
        const float *X = st->X + r0 * C, *Hp = st->Hp + r0 * H, *A = st->A + r0 * H;
        float *dO = st->dO + r0 * C, *dA = st->dA + r0 * H;
        const float *w1 = p->w1 + (int64_t)e * C * H, *w2 = p->w2 + (int64_t)e * H * C;
        float *gw1 = grad->w1 + (int64_t)e * C * H, *gb1 = grad->b1 + (int64_t)e * H;
        float *gw2 = grad->w2 + (int64_t)e * H * C, *gb2 = grad->b2 + (int64_t)e * C;
        if ((rc = ff_gemm_run(g, "moe dw2", 1, 0, H, C, n, 1.0f, A, H, dO, C, 1.0f, gw2, C)))
            return rc;
        add_colsums(gb2, dO, n, C);
        if ((rc = ff_gemm_run(g, "moe dA", 0, 1, n, H, C, 1.0f, dO, C, w2, C, 0.0f, dA, H)))
            return rc;
        ff_gelu_backward(ctx, dA, Hp, dA, n * H);
        if ((rc = ff_gemm_run(g, "moe dw1", 1, 0, C, H, n, 1.0f, X, C, dA, H, 1.0f, gw1, H)))
            return rc;
        add_colsums(gb1, dA, n, H);
        /* dX into this expert's dO rows (dw2, db2 and dA have read them),
         * then into dx */
        float *dX = st->dO + r0 * C;
        if ((rc = ff_gemm_run(g, "moe dX", 0, 1, n, C, H, 1.0f, dA, H, w1, H, 0.0f, dX, C)))
            return rc;
        for (int64_t i = 0; i < n; i++) {
            float *d = dx + st->row_token[r0 + i] * C;
            for (int64_t c = 0; c < C; c++)
                d[c] += dX[i * C + c];
        }
    }
    /* the router */
    if ((rc = ff_gemm_run(g, "moe dwr", 1, 0, C, E, m, 1.0f, x, C, st->dp, E, 1.0f, grad->wr, E)))
        return rc;
    return ff_gemm_run(g, "moe dx", 0, 1, m, C, E, 1.0f, st->dp, E, p->wr, E, 1.0f, dx, C);
}
