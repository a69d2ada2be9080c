/* Convolutions as Algorithm 1 (include/fourfold/conv.h) on every grid of the
 * job's rank count (or the grids named) against the serial layer.
 *
 *   usage: test_conv [all | GxxGyxGzxGd ...]
 *          test_conv --dump DIR   (1 rank: the serial layer's cases for
 *                                  tools/conv_oracle.py, PyTorch's conv2d)
 *
 * Data: canonical input, weight (PyTorch's layout, Cout x Cin x k x k),
 * bias and output gradient from the counter-based RNG, the same on every
 * rank. Every rank also runs the serial layer (a 1x1x1x1 grid on
 * MPI_COMM_SELF) on the whole batch.
 *
 * Tolerance, derived as test_linear's (Higham §3.1): a float32 sum whose
 * terms each pass through at most K - 1 additions and one product is within
 * gamma_K * sum|terms| of the exact value, gamma_K = K u / (1 - K u),
 * u = 2^-24; the grid's result and the serial one are each within their
 * bound of the exact value, so they differ by at most
 * (gamma_K(grid) + gamma_K(serial)) * sum|terms|, sum|terms| computed here in
 * double from the definition of the convolution. With |R|, |C| the groups
 * splitting input and output channels and P the pixels of the batch:
 *   out = im2col(I) W + b:  K = 9 Cin + |R| + 1
 *   dI  = col2im(dO W^T):   K = Cout + |C| + 9   (a pixel sums <= 9 taps)
 *   dW  = im2col(I)^T dO:   K = P + Gz + Gd
 *   db  = sum dO:           K = P + Gz Gd + 1
 * (1x1: 9 Cin -> Cin, no taps.) The test prints the worst |err| / bound.
 *
 * Bit for bit: replicas (the output on the ranks that split the input's
 * channels, the input gradient on those that split the output's) hold the
 * same bits; a chain of two convolutions gives the same bits with every
 * overlap off as with all on (OAR, ORS, OAG, AG cache); the weight and bias
 * scattered from PyTorch's layout and gathered back are unchanged.
 * Refusals: channels the grid does not divide, unsupported kernels. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "fourfold/conv.h"
#include "test_util.h"

static int world_rank, world_size;
static int team_threads = 1; /* the world context's element-wise threads */
static double worst_ratio;

static void fill(float *a, size_t n, uint32_t stream)
{
    for (size_t i = 0; i < n; i++)
        a[i] = (float)(2.0 * ff_rng_uniform(777, stream, i) - 1.0);
}

/* ---- a case: shape, canonical data, the terms' magnitudes ---------------------------- */

typedef struct {
    const char *name;
    ff_linear_kind kind;
    int ksize, stride, bias;
    int64_t B, H, W, cin, cout;
    /* derived */
    int64_t ho, wo, taps;
    float *X, *Wt, *b, *dO; /* (B,H,W,cin), (cout, cin*taps), cout, (B,Ho,Wo,cout) */
    double *out_abs, *din_abs, *dw_abs, *db_abs; /* sum|terms| per element */
} tcase;

static void case_init(tcase *t, uint32_t stream)
{
    int pad = t->ksize / 2;
    t->ho = (t->H + 2 * pad - t->ksize) / t->stride + 1;
    t->wo = (t->W + 2 * pad - t->ksize) / t->stride + 1;
    t->taps = (int64_t)t->ksize * t->ksize;
    size_t nx = (size_t)(t->B * t->H * t->W * t->cin), nw = (size_t)(t->cout * t->cin * t->taps),
           no = (size_t)(t->B * t->ho * t->wo * t->cout);
    t->X = test_floats(nx), t->Wt = test_floats(nw), t->b = test_floats((size_t)t->cout),
    t->dO = test_floats(no);
    fill(t->X, nx, stream), fill(t->Wt, nw, stream + 1), fill(t->dO, no, stream + 3);
    if (t->bias)
        fill(t->b, (size_t)t->cout, stream + 2);
    t->out_abs = test_doubles(no), t->din_abs = test_doubles(nx), t->dw_abs = test_doubles(nw);
    t->db_abs = test_doubles((size_t)t->cout);
    /* the definition: out[b,oy,ox,co] = sum_{ci,ky,kx} X[b, oy*s+ky-p, ox*s+kx-p, ci]
     * W[co,ci,ky,kx] + b[co] */
    for (int64_t b = 0; b < t->B; b++)
        for (int64_t oy = 0; oy < t->ho; oy++)
            for (int64_t ox = 0; ox < t->wo; ox++) {
                int64_t o = ((b * t->ho + oy) * t->wo + ox) * t->cout;
                for (int64_t co = 0; co < t->cout; co++) {
                    t->out_abs[o + co] += fabs(t->b[co]);
                    t->db_abs[co] += fabs(t->dO[o + co]);
                }
                for (int ky = 0; ky < t->ksize; ky++)
                    for (int kx = 0; kx < t->ksize; kx++) {
                        int64_t iy = oy * t->stride + ky - pad, ix = ox * t->stride + kx - pad;
                        if (iy < 0 || iy >= t->H || ix < 0 || ix >= t->W)
                            continue;
                        int64_t i = ((b * t->H + iy) * t->W + ix) * t->cin;
                        for (int64_t co = 0; co < t->cout; co++)
                            for (int64_t ci = 0; ci < t->cin; ci++) {
                                int64_t w = (co * t->cin + ci) * t->taps + ky * t->ksize + kx;
                                double xv = fabs(t->X[i + ci]), wv = fabs(t->Wt[w]),
                                       dv = fabs(t->dO[o + co]);
                                t->out_abs[o + co] += xv * wv;
                                t->din_abs[i + ci] += dv * wv;
                                t->dw_abs[w] += xv * dv;
                            }
                    }
            }
}

static void case_free(tcase *t)
{
    free(t->X), free(t->Wt), free(t->b), free(t->dO);
    free(t->out_abs), free(t->din_abs), free(t->dw_abs), free(t->db_abs);
}

/* ---- one run of a case on a grid ------------------------------------------------------ */

typedef struct {
    float *out, *din;       /* this rank's blocks */
    float *dw, *db;         /* canonical, on rank 0 of the grid's context */
    float *w_back, *b_back; /* the weight and bias scattered and gathered back */
    int64_t images, img0, in_c0, out_c0, cin_l, cout_l;
} result;

static void result_free(result *r)
{
    free(r->out), free(r->din), free(r->dw), free(r->db), free(r->w_back), free(r->b_back);
    memset(r, 0, sizeof *r);
}

/* Runs `n` cases as a chain (case i's output is not case i+1's input: each
 * reads its own canonical data; the chain only shares one sequence, so the
 * overlaps act across layers) with options o. */
static int run(ff_grid *grid, tcase *cases, int n, const ff_linear_opts *o, result *res)
{
    ff_ctx *ctx = ff_grid_ctx(grid);
    ff_dims g = ff_grid_shape(grid), c = ff_grid_coords(grid);
    ff_linear_seq *s;
    int rc = ff_linear_seq_create(grid, o, &s);
    if (rc)
        return rc;
    enum { MAXC = 4 };
    ff_conv *cv[MAXC] = {0};
    float *w[MAXC] = {0}, *b[MAXC] = {0}, *dw[MAXC] = {0}, *db[MAXC] = {0};
    float *x[MAXC] = {0}, *dout[MAXC] = {0}, *col = NULL, *dcol = NULL;
    size_t colmax = 1;
    memset(res, 0, (size_t)n * sizeof *res);
    for (int i = 0; i < n && rc == FF_OK; i++) {
        tcase *t = &cases[i];
        ff_conv_desc d = {t->name, t->kind,  t->cin,    t->cout, t->H,
                          t->W,    t->ksize, t->stride, t->bias, 60 + (uint32_t)i};
        rc = ff_conv_create(s, grid, &d, &cv[i]);
        if (rc)
            break;
        ff_linear *l = ff_conv_linear(cv[i]);
        ff_linear_sizes z = ff_linear_local_sizes(l);
        ff_conv_sizes cz = ff_conv_local_sizes(cv[i]);
        w[i] = test_floats(z.w_shard), dw[i] = test_floats(z.w_shard);
        b[i] = test_floats(z.bias), db[i] = test_floats(z.bias);
        ff_linear_bind(l, w[i], z.bias ? b[i] : NULL, dw[i], z.bias ? db[i] : NULL);
        rc = ff_linear_scatter(l, t->Wt, t->bias ? t->b : NULL, w[i], z.bias ? b[i] : NULL, 0);
        result *r = &res[i];
        int q = c.z + g.z * c.d;
        r->images = t->B / (g.z * g.d), r->img0 = q * r->images;
        r->cin_l = cz.cin_local, r->cout_l = cz.cout_local;
        r->in_c0 = (t->kind == FF_LINEAR_N ? c.y : c.x) * r->cin_l;
        r->out_c0 = (t->kind == FF_LINEAR_N ? c.x : c.y) * r->cout_l;
        size_t in_px = (size_t)(r->images * t->H * t->W),
               out_px = (size_t)(r->images * t->ho * t->wo);
        x[i] = test_floats(in_px * (size_t)r->cin_l),
        dout[i] = test_floats(out_px * (size_t)r->cout_l);
        r->out = test_floats(out_px * (size_t)r->cout_l),
        r->din = test_floats(in_px * (size_t)r->cin_l);
        for (size_t p = 0; p < in_px; p++)
            for (int64_t ch = 0; ch < r->cin_l; ch++)
                x[i][p * (size_t)r->cin_l + (size_t)ch] =
                    t->X[((size_t)(r->img0 * t->H * t->W) + p) * (size_t)t->cin +
                         (size_t)(r->in_c0 + ch)];
        for (size_t p = 0; p < out_px; p++)
            for (int64_t ch = 0; ch < r->cout_l; ch++)
                dout[i][p * (size_t)r->cout_l + (size_t)ch] =
                    t->dO[((size_t)(r->img0 * t->ho * t->wo) + p) * (size_t)t->cout +
                          (size_t)(r->out_c0 + ch)];
        if ((size_t)(cz.col_per_image * r->images) > colmax)
            colmax = (size_t)(cz.col_per_image * r->images);
    }
    col = test_floats(colmax), dcol = test_floats(colmax);
    if (rc == FF_OK)
        rc = ff_linear_seq_program_standard(s, 0);
    if (rc == FF_OK)
        rc = ff_linear_seq_begin(s);
    for (int i = 0; i < n && rc == FF_OK; i++)
        rc = ff_conv_forward(cv[i], res[i].out, x[i], res[i].images, col);
    for (int i = n - 1; i >= 0 && rc == FF_OK; i--)
        rc = ff_conv_backward(cv[i], res[i].din, dout[i], x[i], res[i].images, col, dcol);
    if (rc == FF_OK)
        rc = ff_linear_seq_end(s);
    if (rc == FF_OK)
        rc = ff_linear_seq_allreduce_grads(s);
    for (int i = 0; i < n && rc == FF_OK; i++) {
        tcase *t = &cases[i];
        size_t nw = (size_t)(t->cout * t->cin * t->taps);
        res[i].dw = test_floats(nw), res[i].db = test_floats((size_t)t->cout);
        res[i].w_back = test_floats(nw), res[i].b_back = test_floats((size_t)t->cout);
        ff_linear *l = ff_conv_linear(cv[i]);
        rc = ff_linear_gather(l, dw[i], t->bias ? db[i] : NULL, res[i].dw,
                              t->bias ? res[i].db : NULL, 0);
        if (rc == FF_OK)
            rc = ff_linear_gather(l, w[i], t->bias ? b[i] : NULL, res[i].w_back,
                                  t->bias ? res[i].b_back : NULL, 0);
    }
    if (rc)
        fprintf(stderr, "rank %d: %s\n", world_rank, ff_ctx_error(ctx));
    for (int i = 0; i < n; i++) {
        ff_conv_destroy(cv[i]);
        free(w[i]), free(b[i]), free(dw[i]), free(db[i]), free(x[i]), free(dout[i]);
    }
    free(col), free(dcol);
    ff_linear_seq_destroy(s);
    return rc;
}

/* ---- comparisons ------------------------------------------------------------------------ */

/* |got - ref| <= bound[e] for `count` elements; keeps the worst ratio */
static void check_bound(const char *grid, const char *what, const float *got, const float *ref,
                        const double *abs_terms, double gam, size_t count)
{
    double worst = 0;
    size_t wi = 0;
    for (size_t e = 0; e < count; e++) {
        double err = fabs((double)got[e] - (double)ref[e]), bound = gam * abs_terms[e];
        double r = bound > 0 ? err / bound : (err > 0 ? INFINITY : 0);
        if (!(r <= worst)) {
            worst = isnan(r) ? INFINITY : r;
            wi = e;
        }
    }
    if (worst > worst_ratio)
        worst_ratio = worst;
    CHECK(worst <= 1.0, "grid %s rank %d %s: element %zu = %.9g, serial %.9g, bound %.3g (%.2fx)",
          grid, world_rank, what, wi, count ? got[wi] : 0.0, count ? ref[wi] : 0.0,
          count ? gam * abs_terms[wi] : 0.0, worst);
}

/* the serial result's and bounds' elements at this rank's block */
static void block_of(const float *canon, const double *abs_canon, int64_t px0, int64_t px,
                     int64_t cols, int64_t c0, int64_t cl, float *ref, double *abs)
{
    for (int64_t p = 0; p < px; p++)
        for (int64_t ch = 0; ch < cl; ch++) {
            ref[p * cl + ch] = canon[(px0 + p) * cols + c0 + ch];
            abs[p * cl + ch] = abs_canon[(px0 + p) * cols + c0 + ch];
        }
}

static void compare(const char *grid, ff_dims g, const tcase *t, const result *r, const result *ser)
{
    char what[96];
    int gr = t->kind == FF_LINEAR_N ? g.y : g.x, gc = t->kind == FF_LINEAR_N ? g.x : g.y;
    double kin = t->ksize == 3 ? 9.0 * (double)t->cin : (double)t->cin;
    double taps = t->ksize == 3 ? 9 : 0, pixels = (double)(t->B * t->ho * t->wo);
    int64_t opx = r->images * t->ho * t->wo, ipx = r->images * t->H * t->W;
    float *ref = test_floats((size_t)(ipx * r->cin_l + opx * r->cout_l));
    double *abs = test_doubles((size_t)(ipx * r->cin_l + opx * r->cout_l));
    block_of(ser->out, t->out_abs, r->img0 * t->ho * t->wo, opx, t->cout, r->out_c0, r->cout_l, ref,
             abs);
    snprintf(what, sizeof what, "%s output", t->name);
    check_bound(grid, what, r->out, ref, abs, test_gamma(kin + gr + 1) + test_gamma(kin + 2),
                (size_t)(opx * r->cout_l));
    block_of(ser->din, t->din_abs, r->img0 * t->H * t->W, ipx, t->cin, r->in_c0, r->cin_l, ref,
             abs);
    snprintf(what, sizeof what, "%s input gradient", t->name);
    check_bound(grid, what, r->din, ref, abs,
                test_gamma((double)t->cout + gc + taps) + test_gamma((double)t->cout + 1 + taps),
                (size_t)(ipx * r->cin_l));
    /* Not bit for bit even where |R| = |C| = 1 (the 1x1xZxD grids): OpenBLAS
     * rounds a product of fewer rows otherwise (its small-matrix kernels,
     * docs/linear.md), so the serial layer's order is not the grid's. */
    /* replicas: the output over R, the input gradient over C */
    int q = (int)(r->img0 / r->images);
    int differ = test_replicas_differ(q * 1000 + r->out_c0, r->out, (size_t)(opx * r->cout_l));
    CHECK(!differ, "grid %s rank %d %s: the output differs from %d replicas", grid, world_rank,
          t->name, differ);
    differ = test_replicas_differ(q * 1000 + r->in_c0, r->din, (size_t)(ipx * r->cin_l));
    CHECK(!differ, "grid %s rank %d %s: the input gradient differs from %d replicas", grid,
          world_rank, t->name, differ);
    if (world_rank == 0) {
        size_t nw = (size_t)(t->cout * t->cin * t->taps);
        snprintf(what, sizeof what, "%s weight gradient", t->name);
        check_bound(grid, what, r->dw, ser->dw, t->dw_abs,
                    test_gamma(pixels + g.z + g.d) + test_gamma(pixels + 2), nw);
        if (t->bias) {
            snprintf(what, sizeof what, "%s bias gradient", t->name);
            check_bound(grid, what, r->db, ser->db, t->db_abs,
                        test_gamma(pixels + g.z * g.d + 1) + test_gamma(pixels + 2),
                        (size_t)t->cout);
        }
        CHECK(!memcmp(r->w_back, t->Wt, nw * sizeof(float)) &&
                  (!t->bias || !memcmp(r->b_back, t->b, (size_t)t->cout * sizeof(float))),
              "grid %s %s: PyTorch's weight scattered and gathered back changed", grid, t->name);
    }
    free(ref), free(abs);
}

/* ---- the cases ------------------------------------------------------------------------ */

enum { NCASES = 4 };
static tcase cases[NCASES] = {
    {"conv3", FF_LINEAR_N, 3, 1, 1, 8, 6, 6, 8, 8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0},
    {"conv3s2", FF_LINEAR_T, 3, 2, 1, 8, 7, 6, 8, 8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0},
    {"conv1", FF_LINEAR_N, 1, 1, 0, 8, 5, 4, 8, 16, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0},
    {"conv1t", FF_LINEAR_T, 1, 1, 1, 8, 4, 4, 16, 8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0},
};
static result serial[NCASES];

static int bits_equal(const result *a, const result *b, const tcase *t)
{
    size_t opx = (size_t)(a->images * t->ho * t->wo), ipx = (size_t)(a->images * t->H * t->W);
    size_t nw = (size_t)(t->cout * t->cin * t->taps);
    int same = !memcmp(a->out, b->out, opx * (size_t)a->cout_l * sizeof(float)) &&
               !memcmp(a->din, b->din, ipx * (size_t)a->cin_l * sizeof(float));
    if (world_rank == 0)
        same &= !memcmp(a->dw, b->dw, nw * sizeof(float)) &&
                (!t->bias || !memcmp(a->db, b->db, (size_t)t->cout * sizeof(float)));
    return same;
}

static void refusals(const char *name, ff_grid *grid, ff_dims g)
{
    ff_ctx *ctx = ff_grid_ctx(grid);
    ff_linear_seq *s;
    if (ff_linear_seq_create(grid, NULL, &s) != FF_OK)
        return;
    ff_conv *cv;
    ff_conv_desc d = {"odd", FF_LINEAR_N, 8, 8, 6, 6, 5, 1, 1, 90};
    int rc = ff_conv_create(s, grid, &d, &cv);
    CHECK(rc == FF_EUNSUPPORTED && strstr(ff_ctx_error(ctx), "odd: a 5x5 kernel") &&
              strstr(ff_ctx_error(ctx), "not supported yet"),
          "grid %s: a 5x5 kernel gave %d '%s'", name, rc, ff_ctx_error(ctx));
    d.ksize = 1, d.stride = 2;
    rc = ff_conv_create(s, grid, &d, &cv);
    CHECK(rc == FF_EUNSUPPORTED, "grid %s: a strided 1x1 gave %d '%s'", name, rc,
          ff_ctx_error(ctx));
    if (g.y > 1) {
        d.ksize = 3, d.stride = 1, d.cin = g.y + 1;
        rc = ff_conv_create(s, grid, &d, &cv);
        CHECK(rc == FF_EDIVIDE && strstr(ff_ctx_error(ctx), "convolution odd: ") &&
                  strstr(ff_ctx_error(ctx), "input channels over"),
              "grid %s: %lld input channels over Y=%d gave %d '%s'", name, (long long)d.cin, g.y,
              rc, ff_ctx_error(ctx));
    }
    CHECK(ff_linear_seq_count(s) == 0, "grid %s: a refused convolution left a layer", name);
    ff_linear_seq_destroy(s);
}

/* ---- byte counters ----------------------------------------------------------------------
 * The chain's step (forward, backward, gradient all-reduces) once as
 * convolutions and once as plain linear layers of the same k = taps*cin, n =
 * cout and rows = images*Ho*Wo: every group's collectives, calls and bytes,
 * must be the same (the linear layer's own are checked against docs/design.md
 * §3 in test_linear). Data are zeros: only the counts matter. */

enum { NCOUNTS = FF_NGROUPS * FF_NCOLL * 3 };

static int run_counts(ff_grid *grid, int as_linear, uint64_t counts[NCOUNTS])
{
    ff_linear_seq *s;
    int rc = ff_linear_seq_create(grid, NULL, &s);
    if (rc)
        return rc;
    ff_conv *cv[NCASES] = {0};
    ff_linear *l[NCASES] = {0};
    float *buf[NCASES][6] = {{0}};
    int64_t images = cases[0].B / (ff_grid_shape(grid).z * ff_grid_shape(grid).d);
    for (int i = 0; i < NCASES && rc == FF_OK; i++) {
        tcase *t = &cases[i];
        ff_conv_desc d = {t->name, t->kind,  t->cin,    t->cout, t->H,
                          t->W,    t->ksize, t->stride, t->bias, 60 + (uint32_t)i};
        ff_linear_desc ld = {t->name,      t->kind, t->taps * t->cin, t->cout, t->bias,
                             FF_WEIGHT_NK, NULL,    70 + (uint32_t)i};
        rc = as_linear ? ff_linear_add(s, &ld, &l[i]) : ff_conv_create(s, grid, &d, &cv[i]);
        if (rc)
            break;
        if (!as_linear)
            l[i] = ff_conv_linear(cv[i]);
        ff_linear_sizes z = ff_linear_local_sizes(l[i]);
        int64_t in_px = images * (as_linear ? t->ho * t->wo : t->H * t->W);
        int64_t col =
            as_linear || t->ksize == 1 ? 1 : images * ff_conv_local_sizes(cv[i]).col_per_image;
        buf[i][0] = test_floats(z.w_shard), buf[i][1] = test_floats(z.w_shard);
        buf[i][2] = test_floats(z.bias + 1), buf[i][3] = test_floats(z.bias + 1);
        buf[i][4] = test_floats(
            (size_t)(2 * in_px * z.in_local + 2 * images * t->ho * t->wo * z.out_local));
        buf[i][5] = test_floats((size_t)(2 * col));
        ff_linear_bind(l[i], buf[i][0], z.bias ? buf[i][2] : NULL, buf[i][1],
                       z.bias ? buf[i][3] : NULL);
    }
    if (rc == FF_OK)
        rc = ff_linear_seq_program_standard(s, 0);
    for (int g = 0; g < FF_NGROUPS; g++)
        ff_group_counters_reset(ff_grid_group(grid, (ff_group_kind)g));
    if (rc == FF_OK)
        rc = ff_linear_seq_begin(s);
    for (int pass = 0; pass < 2; pass++)
        for (int j = 0; j < NCASES && rc == FF_OK; j++) {
            int i = pass ? NCASES - 1 - j : j;
            tcase *t = &cases[i];
            ff_linear_sizes z = ff_linear_local_sizes(l[i]);
            int64_t in_px = images * (as_linear ? t->ho * t->wo : t->H * t->W),
                    out_px = images * t->ho * t->wo;
            float *x = buf[i][4], *dx = x + in_px * z.in_local, *y = dx + in_px * z.in_local,
                  *dy = y + out_px * z.out_local, *col = buf[i][5];
            if (as_linear)
                rc = pass ? ff_linear_backward(l[i], dx, dy, x, out_px)
                          : ff_linear_forward(l[i], y, x, out_px);
            else
                rc = pass
                         ? ff_conv_backward(cv[i], dx, dy, x, images, col,
                                            col + images * ff_conv_local_sizes(cv[i]).col_per_image)
                         : ff_conv_forward(cv[i], y, x, images, col);
        }
    if (rc == FF_OK)
        rc = ff_linear_seq_end(s);
    if (rc == FF_OK)
        rc = ff_linear_seq_allreduce_grads(s);
    for (int g = 0; g < FF_NGROUPS; g++)
        for (int c = 0; c < FF_NCOLL; c++) {
            ff_counters k = ff_group_counters(ff_grid_group(grid, (ff_group_kind)g), (ff_coll)c);
            uint64_t *o = counts + 3 * (g * FF_NCOLL + c);
            o[0] = k.calls, o[1] = k.bytes_sent, o[2] = k.bytes_recv;
        }
    for (int i = 0; i < NCASES; i++) {
        ff_conv_destroy(cv[i]);
        for (int b = 0; b < 6; b++)
            free(buf[i][b]);
    }
    ff_linear_seq_destroy(s);
    return rc;
}

static void check_counts(const char *name, ff_grid *grid)
{
    uint64_t conv[NCOUNTS], lin[NCOUNTS];
    int rc = run_counts(grid, 0, conv);
    if (rc == FF_OK)
        rc = run_counts(grid, 1, lin);
    CHECK(rc == FF_OK, "grid %s: the counting runs failed", name);
    uint64_t total = 0;
    for (int e = 0; e < NCOUNTS && rc == FF_OK; e++) {
        total += conv[e] * (e % 3 != 0);
        CHECK(conv[e] == lin[e],
              "grid %s rank %d: group %d %s %s: %llu as convolutions, %llu as linear layers", name,
              world_rank, e / 3 / FF_NCOLL, ff_coll_name((ff_coll)(e / 3 % FF_NCOLL)),
              e % 3 == 0   ? "calls"
              : e % 3 == 1 ? "bytes sent"
                           : "bytes received",
              (unsigned long long)conv[e], (unsigned long long)lin[e]);
    }
    ff_dims g = ff_grid_shape(grid);
    CHECK(total > 0 || g.x * g.y * g.z * g.d == 1, "grid %s rank %d: nothing counted", name,
          world_rank);
}

static void run_grid(const char *name, ff_grid *grid)
{
    ff_dims g = ff_grid_shape(grid);
    ff_linear_opts on, off;
    ff_linear_opts_default(&on);
    ff_linear_opts_default(&off);
    off.oar = off.ors = off.oag = 0, off.ag_cache_layers = 0;
    result r_on[NCASES], r_off[NCASES];
    int rc = run(grid, cases, NCASES, &on, r_on);
    CHECK(rc == FF_OK, "grid %s: the chain with every overlap on failed", name);
    int rc2 = run(grid, cases, NCASES, &off, r_off);
    CHECK(rc2 == FF_OK, "grid %s: the chain with every overlap off failed", name);
    for (int i = 0; i < NCASES && rc == FF_OK && rc2 == FF_OK; i++) {
        compare(name, g, &cases[i], &r_on[i], &serial[i]);
        CHECK(bits_equal(&r_on[i], &r_off[i], &cases[i]),
              "grid %s rank %d %s: overlaps on and off give different bits", name, world_rank,
              cases[i].name);
        /* the serial grid: the serial run's code on another team of threads */
        CHECK(g.x * g.y * g.z * g.d > 1 || bits_equal(&r_on[i], &serial[i], &cases[i]),
              "grid %s %s: not the serial run's bits (threads %d against 1)", name, cases[i].name,
              team_threads);
    }
    for (int i = 0; i < NCASES; i++)
        result_free(&r_on[i]), result_free(&r_off[i]);
    check_counts(name, grid);
    refusals(name, grid, g);
}

/* ---- the oracle's cases ---------------------------------------------------------------- */

static int write_f32(FILE *f, const float *a, size_t n) { return fwrite(a, 4, n, f) == n; }

/* serial cases of other shapes (odd sizes, channels that are not powers of
 * two) for tools/conv_oracle.py: per case an int32 header (B, H, W, Cin,
 * Cout, k, stride, bias), then float32 X (B,H,W,Cin), W (Cout,Cin,k,k), b,
 * dO (B,Ho,Wo,Cout), and fourfold's out, dI, dW, db */
static int dump(ff_ctx *ctx, const char *dir)
{
    tcase oc[3] = {
        {"oracle3", FF_LINEAR_N, 3, 1, 1, 2, 6, 5, 5, 7, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0},
        {"oracle3s2", FF_LINEAR_N, 3, 2, 1, 3, 7, 6, 4, 6, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0},
        {"oracle1", FF_LINEAR_N, 1, 1, 0, 2, 3, 5, 6, 3, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0},
    };
    ff_grid *grid;
    if (ff_grid_create(ctx, (ff_dims){1, 1, 1, 1}, &grid) != FF_OK)
        return 1;
    int bad = 0;
    for (int i = 0; i < 3; i++) {
        tcase *t = &oc[i];
        case_init(t, 200 + 10 * (uint32_t)i);
        result r;
        if (run(grid, t, 1, NULL, &r) != FF_OK) {
            bad = 1;
            case_free(t);
            continue;
        }
        char path[1024];
        snprintf(path, sizeof path, "%s/conv_%d.bin", dir, i);
        FILE *f = fopen(path, "wb");
        int32_t h[8] = {(int32_t)t->B,    (int32_t)t->H, (int32_t)t->W, (int32_t)t->cin,
                        (int32_t)t->cout, t->ksize,      t->stride,     t->bias};
        size_t nx = (size_t)(t->B * t->H * t->W * t->cin),
               nw = (size_t)(t->cout * t->cin * t->taps),
               no = (size_t)(t->B * t->ho * t->wo * t->cout);
        int ok = f && fwrite(h, 4, 8, f) == 8 && write_f32(f, t->X, nx) &&
                 write_f32(f, t->Wt, nw) && write_f32(f, t->b, (size_t)t->cout) &&
                 write_f32(f, t->dO, no) && write_f32(f, r.out, no) && write_f32(f, r.din, nx) &&
                 write_f32(f, r.dw, nw) && write_f32(f, r.db, (size_t)t->cout);
        if (f)
            ok = fclose(f) == 0 && ok;
        if (!ok) {
            fprintf(stderr, "cannot write %s\n", path);
            bad = 1;
        }
        result_free(&r);
        case_free(t);
    }
    ff_grid_destroy(grid);
    return bad;
}

int main(int argc, char **argv)
{
    ff_ctx *ctx, *self;
    team_threads = test_mpi_start(&argc, &argv, &ctx, &self);
    MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &world_size);
    if (argc == 3 && !strcmp(argv[1], "--dump")) {
        int bad = world_size != 1 || dump(self, argv[2]);
        ff_ctx_destroy(self);
        ff_ctx_destroy(ctx);
        MPI_Finalize();
        return bad;
    }
    /* the serial layer, on every rank */
    ff_grid *one;
    if (ff_grid_create(self, (ff_dims){1, 1, 1, 1}, &one) != FF_OK)
        MPI_Abort(MPI_COMM_WORLD, 1);
    for (int i = 0; i < NCASES; i++)
        case_init(&cases[i], 100 + 10 * (uint32_t)i);
    if (run(one, cases, NCASES, NULL, serial) != FF_OK)
        MPI_Abort(MPI_COMM_WORLD, 1);
    ff_grid_destroy(one);

    test_run_grids(argc, argv, ctx, &worst_ratio,
                   "against the serial layer; replicas, overlaps on and off bit for bit; "
                   "counters those of linear layers",
                   run_grid);
    if (world_rank == 0)
        printf("worst |err|/bound over all grids %.3f (bound (gamma_K(grid) + gamma_K(serial)) "
               "* sum|terms|, u = 2^-24)\n",
               worst_ratio);
    for (int i = 0; i < NCASES; i++) {
        result_free(&serial[i]);
        case_free(&cases[i]);
    }
    ff_ctx_destroy(self);
    ff_ctx_destroy(ctx);
    int code = test_finish("test_conv");
    MPI_Finalize();
    return code;
}
