/* The model's element-wise passes on the context's device (FF_DEVICE=cuda:
 * the GPU's kernels, docs/cuda.md) against the CPU's passes, on odd sizes
 * (rows not a multiple of the 32-row blocks or of a warp, columns not a
 * multiple of a warp or of the vector width, a padded vocabulary), every
 * output the pass overwrites filled with NaN first, so an element it leaves
 * unwritten fails.
 *
 * Two kinds of check, as the kernels claim (src/cuda/backend.cu):
 * - bits: the kernel runs the CPU's arithmetic for each element in the same
 *   order (GELU, add, the embedding, LayerNorm applied from given statistics
 *   and its w, b gradients, the bias and its gradient); every element must
 *   equal the CPU's;
 * - accuracy: the kernel sums in another order (row sums, softmax, the
 *   products): both devices' results are compared with the same pass in
 *   float64 computed here, and the device's norm-wise error must be at most
 *   4 times the CPU's, or 4 units of float's roundoff where the CPU's is
 *   smaller: two fp32 implementations of one formula whose error bounds
 *   (gamma_K times the same condition) are equal.
 * On the CPU (no FF_DEVICE) both sides are the CPU: a run of the harness,
 * not a test of a GPU; scripts/test_cuda.sh runs it with FF_DEVICE=cuda.
 *   usage: mpirun -np 1 test_passes */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "device.h"
#include "fourfold/fourfold.h"
#include "fourfold/rng.h"
#include "nn/gpt_ops.h"
#include "test_util.h"

/* odd sizes: B sequences of T (74 rows; T above a warp, so a warp's lanes
 * take a softmax row in more than one stride), C columns, nh heads of hs, a
 * vocabulary of V in a padded block of VL */
enum { B = 2, T = 37, M = B * T, C = 77, NH = 3, HS = 7, V = 97, VL = 103 };
static const double U = 5.9604644775390625e-08; /* 2^-24 */

typedef struct {
    ff_ctx *ctx;
    ff_grid *grid;
} side;

static side dev, cpu;
static uint64_t seed = 1;

static double frand(void) /* uniform in [-1, 1) */
{
    seed = seed * 6364136223846793005ULL + 1442695040888963407ULL;
    return (double)(seed >> 11) / 9007199254740992.0 * 2.0 - 1.0;
}

static float *buf(side *s, size_t n)
{
    float *p = ff_fbuf_alloc(s->ctx, n);
    CHECK(p != NULL, "out of memory (%zu floats)", n);
    return p;
}

static void nan_fill(float *p, size_t n)
{
    for (size_t i = 0; i < n; i++)
        p[i] = NAN;
}

/* the same random values (scaled) in a buffer on each side */
static void same_random(float *a, float *b, size_t n, double scale)
{
    for (size_t i = 0; i < n; i++)
        a[i] = b[i] = (float)(scale * frand());
}

/* every element of d equal to c's, bit for bit */
static void bits(const char *what, const float *d, const float *c, size_t n)
{
    size_t differ = 0, unwritten = 0;
    for (size_t i = 0; i < n; i++) {
        unwritten += isnan(d[i]) && !isnan(c[i]);
        differ += memcmp(&d[i], &c[i], sizeof(float)) != 0;
    }
    printf("  %-28s %6zu elements: %zu differ from the CPU's bits, %zu unwritten\n", what, n,
           differ, unwritten);
    CHECK(differ == 0 && unwritten == 0, "%s: %zu of %zu differ from the CPU's (%zu unwritten)",
          what, differ, n, unwritten);
}

static double rel_err(const float *x, const double *ref, size_t n)
{
    double e = 0, r = 0;
    for (size_t i = 0; i < n; i++) {
        double d = (double)x[i] - ref[i];
        e += d * d;
        r += ref[i] * ref[i];
    }
    return r > 0 ? sqrt(e / r) : sqrt(e);
}

/* d's norm-wise error against the float64 reference at most 4 times c's (or
 * 4 u); no NaN where the CPU has none */
static void accuracy(const char *what, const float *d, const float *c, const double *ref, size_t n)
{
    size_t unwritten = 0;
    for (size_t i = 0; i < n; i++)
        unwritten += !isfinite(d[i]) && isfinite(c[i]);
    double ed = rel_err(d, ref, n), ec = rel_err(c, ref, n);
    double bound = 4 * (ec > U ? ec : U);
    printf("  %-28s %6zu elements: error %.2e, the CPU's %.2e (bound %.2e), %zu unwritten\n", what,
           n, ed, ec, bound, unwritten);
    CHECK(unwritten == 0 && ed <= bound, "%s: error %.3e against the CPU's %.3e (bound %.3e), "
          "%zu unwritten", what, ed, ec, bound, unwritten);
}

/* ---- LayerNorm ------------------------------------------------------------ */

static void test_layernorm(void)
{
    printf("LayerNorm, %d rows of %d\n", M, C);
    float *x[2], *w[2], *b[2], *out[2], *mean[2], *rstd[2], *dout[2], *dinp[2], *dw[2], *db[2],
        *scr[2];
    side *s[2] = {&dev, &cpu};
    for (int k = 0; k < 2; k++) {
        x[k] = buf(s[k], M * C), w[k] = buf(s[k], C), b[k] = buf(s[k], C);
        out[k] = buf(s[k], M * C), mean[k] = buf(s[k], M), rstd[k] = buf(s[k], M);
        dout[k] = buf(s[k], M * C), dinp[k] = buf(s[k], M * C);
        dw[k] = buf(s[k], C), db[k] = buf(s[k], C), scr[k] = buf(s[k], FF_LN_SCRATCH(M, C));
        if (!scr[k])
            return;
    }
    for (int64_t i = 0; i < M; i++) /* rows with an offset: the mean matters */
        for (int64_t c = 0; c < C; c++)
            x[0][i * C + c] = x[1][i * C + c] = (float)(0.5 * (i % 5) + frand());
    same_random(w[0], w[1], C, 1.0);
    same_random(b[0], b[1], C, 0.5);
    same_random(dout[0], dout[1], M * C, 1.0);
    same_random(dinp[0], dinp[1], M * C, 1.0); /* the backward adds to it */
    same_random(dw[0], dw[1], C, 1.0);
    same_random(db[0], db[1], C, 1.0);
    for (int k = 0; k < 2; k++) {
        nan_fill(out[k], M * C), nan_fill(mean[k], M), nan_fill(rstd[k], M);
        CHECK(ff_ln_forward(ff_grid_group(s[k]->grid, FF_GROUP_Y), out[k], mean[k], rstd[k], x[k],
                            w[k], b[k], M, C, C) == FF_OK,
              "ff_ln_forward");
    }
    double *rm = calloc(M, sizeof *rm), *rr = calloc(M, sizeof *rr), *ro = calloc(M * C, sizeof *ro);
    double *rd = calloc(M * C, sizeof *rd), *rw = calloc(C, sizeof *rw), *rb = calloc(C, sizeof *rb);
    for (int64_t i = 0; i < M; i++) {
        const float *xi = x[1] + i * C;
        double s1 = 0, s2 = 0;
        for (int c = 0; c < C; c++)
            s1 += xi[c];
        rm[i] = s1 / C;
        for (int c = 0; c < C; c++)
            s2 += (xi[c] - rm[i]) * (xi[c] - rm[i]);
        rr[i] = 1.0 / sqrt(s2 / C + 1e-5);
        for (int c = 0; c < C; c++)
            ro[i * C + c] = (xi[c] - rm[i]) * rr[i] * w[1][c] + b[1][c];
    }
    accuracy("forward mean", mean[0], mean[1], rm, M);
    accuracy("forward rstd", rstd[0], rstd[1], rr, M);
    accuracy("forward out", out[0], out[1], ro, M * C);

    /* from here both sides use the CPU's statistics */
    memcpy(mean[0], mean[1], M * sizeof(float));
    memcpy(rstd[0], rstd[1], M * sizeof(float));
    for (int k = 0; k < 2; k++) {
        nan_fill(out[k], M * C);
        ff_ln_apply(s[k]->ctx, out[k], mean[k], rstd[k], x[k], w[k], b[k], M, C);
    }
    bits("apply (given statistics)", out[0], out[1], M * C);

    for (int64_t i = 0; i < M * C; i++)
        rd[i] = dinp[1][i];
    for (int c = 0; c < C; c++)
        rw[c] = dw[1][c], rb[c] = db[1][c];
    for (int k = 0; k < 2; k++)
        CHECK(ff_ln_backward(ff_grid_group(s[k]->grid, FF_GROUP_Y), dinp[k], dw[k], db[k], dout[k],
                             x[k], w[k], mean[k], rstd[k], M, C, C, scr[k]) == FF_OK,
              "ff_ln_backward");
    for (int64_t i = 0; i < M; i++) {
        const float *xi = x[1] + i * C, *g = dout[1] + i * C;
        double s1 = 0, s2 = 0;
        for (int c = 0; c < C; c++) {
            double norm = ((double)xi[c] - mean[1][i]) * rstd[1][i], dn = (double)w[1][c] * g[c];
            s1 += dn, s2 += dn * norm;
        }
        s1 /= C, s2 /= C;
        for (int c = 0; c < C; c++) {
            double norm = ((double)xi[c] - mean[1][i]) * rstd[1][i], dn = (double)w[1][c] * g[c];
            rd[i * C + c] += (dn - s1 - norm * s2) * rstd[1][i];
            rw[c] += norm * g[c];
            rb[c] += g[c];
        }
    }
    accuracy("backward dinp (+=)", dinp[0], dinp[1], rd, M * C);
    bits("backward dw (+=)", dw[0], dw[1], C);
    bits("backward db (+=)", db[0], db[1], C);
    free(rm), free(rr), free(ro), free(rd), free(rw), free(rb);
    for (int k = 0; k < 2; k++) {
        float *all[] = {x[k], w[k], b[k], out[k], mean[k], rstd[k], dout[k], dinp[k], dw[k], db[k],
                        scr[k]};
        for (size_t i = 0; i < sizeof all / sizeof *all; i++)
            ff_fbuf_free(all[i]);
    }
}

/* ---- attention ------------------------------------------------------------ */

static void test_attention(void)
{
    const int c = NH * HS, c3 = 3 * c;
    printf("attention, %d sequences of %d, %d heads of %d\n", B, T, NH, HS);
    side *s[2] = {&dev, &cpu};
    float *qkv[2], *out[2], *att[2], *dout[2], *dqkv[2], *scr[2];
    const size_t natt = (size_t)B * NH * T * T;
    const size_t nscr = (size_t)T * T * (size_t)ff_ctx_threads(cpu.ctx) + (size_t)T * T * 64;
    for (int k = 0; k < 2; k++) {
        qkv[k] = buf(s[k], M * c3), out[k] = buf(s[k], M * c), att[k] = buf(s[k], natt);
        dout[k] = buf(s[k], M * c), dqkv[k] = buf(s[k], M * c3), scr[k] = buf(s[k], nscr);
        if (!scr[k])
            return;
    }
    same_random(qkv[0], qkv[1], M * c3, 2.0);
    same_random(dout[0], dout[1], M * c, 1.0);
    for (int k = 0; k < 2; k++) {
        nan_fill(out[k], M * c), nan_fill(att[k], natt), nan_fill(dqkv[k], M * c3);
        ff_attention_forward(s[k]->ctx, out[k], att[k], qkv[k], B, T, NH, HS);
        ff_attention_backward(s[k]->ctx, dqkv[k], scr[k], dout[k], qkv[k], att[k], B, T, NH, HS);
    }
    /* float64: P = softmax(q k^T / sqrt(hs)) causal, out = P v; the backward */
    double *rp = calloc(natt, sizeof *rp), *ro = calloc(M * c, sizeof *ro);
    double *rdq = calloc(M * c3, sizeof *rdq), *dp = calloc(T, sizeof *dp);
    const double scale = 1.0 / sqrt((double)HS);
    const float *Q = qkv[1];
    for (int bb = 0; bb < B; bb++)
        for (int h = 0; h < NH; h++)
            for (int t = 0; t < T; t++) {
                double *p = rp + (((size_t)bb * NH + h) * T + t) * T, mx = -INFINITY, sum = 0;
                const float *q = Q + ((size_t)bb * T + t) * c3 + h * HS;
                for (int u = 0; u <= t; u++) {
                    const float *kk = Q + ((size_t)bb * T + u) * c3 + c + h * HS;
                    double d = 0;
                    for (int e = 0; e < HS; e++)
                        d += (double)q[e] * kk[e];
                    p[u] = d * scale;
                    mx = p[u] > mx ? p[u] : mx;
                }
                for (int u = 0; u <= t; u++)
                    sum += p[u] = exp(p[u] - mx);
                for (int u = 0; u <= t; u++)
                    p[u] /= sum;
                for (int e = 0; e < HS; e++) {
                    double o = 0;
                    for (int u = 0; u <= t; u++)
                        o += p[u] * Q[((size_t)bb * T + u) * c3 + 2 * c + h * HS + e];
                    ro[((size_t)bb * T + t) * c + h * HS + e] = o;
                }
                /* backward of row t: dv += p^T g, dp = g v^T, ds = p (dp - p.dp) */
                const float *g = dout[1] + ((size_t)bb * T + t) * c + h * HS;
                double dot = 0;
                for (int u = 0; u <= t; u++) {
                    const float *v = Q + ((size_t)bb * T + u) * c3 + 2 * c + h * HS;
                    dp[u] = 0;
                    for (int e = 0; e < HS; e++) {
                        dp[u] += (double)g[e] * v[e];
                        rdq[((size_t)bb * T + u) * c3 + 2 * c + h * HS + e] += p[u] * g[e];
                    }
                    dot += p[u] * dp[u];
                }
                for (int u = 0; u <= t; u++) {
                    double ds = p[u] * (dp[u] - dot) * scale;
                    const float *kk = Q + ((size_t)bb * T + u) * c3 + c + h * HS;
                    for (int e = 0; e < HS; e++) {
                        rdq[((size_t)bb * T + t) * c3 + h * HS + e] += ds * kk[e];
                        rdq[((size_t)bb * T + u) * c3 + c + h * HS + e] += ds * q[e];
                    }
                }
            }
    accuracy("forward probabilities", att[0], att[1], rp, natt);
    accuracy("forward out", out[0], out[1], ro, M * c);
    accuracy("backward dqkv", dqkv[0], dqkv[1], rdq, M * c3);
    free(rp), free(ro), free(rdq), free(dp);
    for (int k = 0; k < 2; k++) {
        float *all[] = {qkv[k], out[k], att[k], dout[k], dqkv[k], scr[k]};
        for (size_t i = 0; i < sizeof all / sizeof *all; i++)
            ff_fbuf_free(all[i]);
    }
}

/* ---- cross-entropy -------------------------------------------------------- */

static void test_crossentropy(void)
{
    printf("cross-entropy, %d rows of %d logits (%d padding)\n", M, VL, VL - V);
    side *s[2] = {&dev, &cpu};
    float *logits[2], *losses[2], *scr[2];
    int32_t targets[M];
    const size_t nscr = 3 * M + 3 * M + (size_t)VL * (size_t)ff_ctx_threads(cpu.ctx) + VL * 64;
    for (int k = 0; k < 2; k++) {
        logits[k] = buf(s[k], M * VL), losses[k] = buf(s[k], M), scr[k] = buf(s[k], nscr);
        if (!scr[k])
            return;
    }
    for (int i = 0; i < M; i++)
        targets[i] = (int32_t)((i * 37 + 11) % V);
    same_random(logits[0], logits[1], M * VL, 4.0);
    double *rl = calloc(M, sizeof *rl), *rg = calloc(M * VL, sizeof *rg);
    const float dscale = 1.0f / M;
    for (int i = 0; i < M; i++) {
        const float *l = logits[1] + (size_t)i * VL;
        double mx = -INFINITY, sum = 0;
        for (int v = 0; v < V; v++)
            mx = l[v] > mx ? l[v] : mx;
        for (int v = 0; v < V; v++)
            sum += exp(l[v] - mx);
        rl[i] = mx + log(sum) - l[targets[i]];
        for (int v = 0; v < V; v++)
            rg[(size_t)i * VL + v] = dscale * (exp(l[v] - mx) / sum - (v == targets[i]));
    }
    for (int k = 0; k < 2; k++) {
        nan_fill(losses[k], M);
        for (int i = 0; i < M; i++) /* the padding's logits: NaN, to be zeroed */
            for (int v = V; v < VL; v++)
                logits[k][(size_t)i * VL + v] = NAN;
        CHECK(ff_crossentropy(ff_grid_group(s[k]->grid, FF_GROUP_X), losses[k], logits[k], targets,
                              M, 0, VL, V, dscale, scr[k]) == FF_OK,
              "ff_crossentropy");
    }
    accuracy("losses", losses[0], losses[1], rl, M);
    accuracy("gradient of the logits", logits[0], logits[1], rg, M * VL);
    free(rl), free(rg);
    for (int k = 0; k < 2; k++)
        ff_fbuf_free(logits[k]), ff_fbuf_free(losses[k]), ff_fbuf_free(scr[k]);
}

/* ---- element-wise, embedding, bias ---------------------------------------- */

static void test_elementwise(void)
{
    const int64_t n = (int64_t)M * C + 5;
    printf("GELU, add, multiply, zero, the embedding, the bias: %lld elements, %d rows of %d\n",
           (long long)n, M, C);
    side *s[2] = {&dev, &cpu};
    float *x[2], *y[2], *o[2], *wte[2], *wpe[2], *dwte[2], *dwpe[2], *bias[2], *dbias[2];
    int32_t tokens[M];
    for (int k = 0; k < 2; k++) {
        x[k] = buf(s[k], n), y[k] = buf(s[k], n), o[k] = buf(s[k], n);
        wte[k] = buf(s[k], VL * C), wpe[k] = buf(s[k], T * C), dwte[k] = buf(s[k], VL * C);
        dwpe[k] = buf(s[k], T * C), bias[k] = buf(s[k], C), dbias[k] = buf(s[k], C);
        if (!dbias[k])
            return;
    }
    same_random(x[0], x[1], n, 6.0);
    same_random(y[0], y[1], n, 1.0);
    for (int k = 0; k < 2; k++) {
        nan_fill(o[k], n);
        ff_gelu_forward(s[k]->ctx, o[k], x[k], n);
    }
    bits("GELU forward", o[0], o[1], n);
    for (int k = 0; k < 2; k++) {
        nan_fill(o[k], n);
        ff_gelu_backward(s[k]->ctx, o[k], x[k], y[k], n);
    }
    bits("GELU backward", o[0], o[1], n);
    for (int k = 0; k < 2; k++) {
        nan_fill(o[k], n);
        ff_add(s[k]->ctx, o[k], x[k], y[k], n);
    }
    bits("add", o[0], o[1], n);
    for (int k = 0; k < 2; k++) {
        nan_fill(o[k], n);
        ff_mul(s[k]->ctx, o[k], x[k], y[k], n);
    }
    bits("multiply", o[0], o[1], n);
    for (int k = 0; k < 2; k++) {
        nan_fill(o[k], n);
        ff_zero(s[k]->ctx, o[k], n);
    }
    bits("zero", o[0], o[1], n);
    for (int i = 0; i < M; i++) /* some outside the block [0, VL - 7): zeros before the all-reduce */
        tokens[i] = (int32_t)((i * 53 + 3) % VL);
    same_random(wte[0], wte[1], VL * C, 1.0);
    same_random(wpe[0], wpe[1], T * C, 1.0);
    same_random(dwte[0], dwte[1], VL * C, 1.0);
    same_random(dwpe[0], dwpe[1], T * C, 1.0);
    for (int k = 0; k < 2; k++) {
        nan_fill(o[k], M * C);
        CHECK(ff_embed_forward(ff_grid_group(s[k]->grid, FF_GROUP_X), o[k], tokens, wte[k], wpe[k],
                               B, T, 0, VL - 7, C) == FF_OK,
              "ff_embed_forward");
        ff_embed_backward(s[k]->ctx, dwte[k], dwpe[k], y[k], tokens, B, T, 0, VL - 7, C);
    }
    bits("embedding forward", o[0], o[1], M * C);
    bits("embedding backward wte (+=)", dwte[0], dwte[1], VL * C);
    bits("embedding backward wpe (+=)", dwpe[0], dwpe[1], T * C);
    same_random(bias[0], bias[1], C, 1.0);
    same_random(dbias[0], dbias[1], C, 1.0);
    same_random(o[0], o[1], M * C, 1.0);
    for (int k = 0; k < 2; k++) {
        ff_bias_pass(s[k]->ctx, FF_PASS_BIAS_ADD,
                     &(bias_job){.out = o[k], .b = bias[k], .r0 = 3, .rows = M - 5, .nl = C});
        ff_bias_pass(s[k]->ctx, FF_PASS_BIAS_GRAD,
                     &(bias_job){.db = dbias[k], .dout = y[k], .rows = M, .nl = C});
    }
    bits("bias add (rows 3..71)", o[0], o[1], M * C);
    bits("bias gradient (+=)", dbias[0], dbias[1], C);
    for (int k = 0; k < 2; k++) {
        float *all[] = {x[k], y[k], o[k], wte[k], wpe[k], dwte[k], dwpe[k], bias[k], dbias[k]};
        for (size_t i = 0; i < sizeof all / sizeof *all; i++)
            ff_fbuf_free(all[i]);
    }
}

static int open_side(side *s, const char *device)
{
    ff_ctx_options o;
    ff_ctx_options_default(&o);
    o.device = device;
    ff_dims one = {1, 1, 1, 1};
    int rc = ff_ctx_create(&s->ctx, MPI_COMM_SELF, &o);
    if (rc == FF_OK)
        rc = ff_grid_create(s->ctx, one, &s->grid);
    if (rc != FF_OK)
        fprintf(stderr, "context on '%s': %s\n", device ? device : "(FF_DEVICE)",
                s->ctx ? ff_ctx_error(s->ctx) : "out of memory");
    return rc;
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    int rc = open_side(&dev, NULL); /* FF_DEVICE's */
    CHECK(rc == FF_OK, "the device's context");
    if (rc == FF_OK) {
        CHECK(open_side(&cpu, "cpu") == FF_OK, "the CPU's context");
        printf("passes on '%s' against the CPU's\n", ff_ctx_device(dev.ctx));
        test_layernorm();
        test_attention();
        test_crossentropy();
        test_elementwise();
        long long on_gpu = 0, on_cpu = 0;
        ff_ctx_device_work(dev.ctx, &on_gpu, &on_cpu);
        printf("the device's context: %lld calls on the GPU, %lld on the CPU\n",
               on_gpu, on_cpu);
        if (strcmp(ff_ctx_device(dev.ctx), "cpu") != 0)
            CHECK(on_cpu == 0 && on_gpu > 0, "%lld passes ran on the CPU", on_cpu);
    }
    for (side *s = &dev; s; s = s == &dev ? &cpu : NULL) {
        if (s->grid)
            ff_grid_destroy(s->grid);
        if (s->ctx)
            ff_ctx_destroy(s->ctx);
    }
    rc = test_finish("passes");
    MPI_Finalize();
    return rc;
}
