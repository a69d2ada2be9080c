/* The U-Net's operations besides convolutions (src/nn/unet_ops.h):
 * GroupNorm over channel shards, SiLU, nearest up-sampling, average
 * down-sampling, on every grid of the job's rank count (or those named)
 * against the serial operations.
 *
 *   usage: test_unet_ops [all | GxxGyxGzxGd ...]
 *          test_unet_ops --dump DIR   (1 rank: cases for
 *                                      tools/unet_ops_oracle.py)
 *
 * Activations are NHWC, images over ZD (rank q = z + Gz d holds images
 * [q B/(Gz Gd), ...)) and channels over the group that splits them.
 * GroupNorm runs twice: channels over Y (C = 24, G = 6: groups of 4
 * channels, which span two ranks and start inside a rank's block with
 * Gy = 4 and 8) and over X (C = 16, G = 4). Every rank also runs the serial
 * operation on the whole batch (a 1x1x1x1 grid on MPI_COMM_SELF).
 *
 * Tolerance (docs/testing.md, "The bounds of the U-Net's operations"): the
 * GPT's model of stages, norm-wise per tensor and per rank: a reduction of
 * at most K terms and the elementwise roundings around it is a stage of
 * gamma_{K+8}; GroupNorm's output passes 2 (mean, variance), the input
 * gradient 3 (and the sums of the gradient formula), the weight gradient 3,
 * the bias gradient 1, with K = max(hw C/G + |S|, P + Gz Gd), P the pixels
 * of the batch. The grid and the serial run are each within that of the
 * exact value, so they differ by at most the sum of their bounds. Replicas
 * (over the group that does not split the channels) hold the same bits.
 * SiLU and the resampling are local to a pixel block: the grid's bits are
 * the serial run's. Refusals: groups that do not divide the channels. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "nn/unet_ops.h"
#include "test_util.h"

static int world_rank, world_size;
static int team_threads = 1; /* the world context's element-wise threads */
static double worst_ratio;

static void fill(float *a, size_t n, uint32_t stream, double lo, double hi)
{
    for (size_t i = 0; i < n; i++)
        a[i] = (float)(lo + (hi - lo) * ff_rng_uniform(4242, stream, i));
}

/* rows [r0, r0 + rows) and columns [c0, c0 + cl) of a (.., C) matrix */
static void block(float *dst, const float *src, int64_t r0, int64_t rows, int64_t C, int64_t c0,
                  int64_t cl)
{
    for (int64_t r = 0; r < rows; r++)
        memcpy(dst + r * cl, src + (r0 + r) * C + c0, (size_t)cl * sizeof(float));
}

/* ||a - b|| <= bound ||b||, norm-wise; keeps the worst ratio */
static void check_norm(const char *grid, const char *what, const float *a, const float *b, size_t n,
                       double bound)
{
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        double d = (double)a[i] - b[i];
        num += d * d, den += (double)b[i] * b[i];
    }
    double r = den > 0 ? sqrt(num / den) / bound : (num > 0 ? INFINITY : 0);
    if (isnan(r))
        r = INFINITY;
    if (r > worst_ratio)
        worst_ratio = r;
    CHECK(r <= 1.0, "grid %s rank %d %s: norm-wise error %.3g of the bound %.3g", grid, world_rank,
          what, r * bound, bound);
}

/* ---- GroupNorm ---------------------------------------------------------------------------- */

typedef struct {
    const char *name;
    ff_group_kind split; /* the group that splits the channels */
    int64_t B, H, W, C;
    int G;
    float eps;
    double lo, hi;             /* the inputs' range */
    float *x, *w, *b, *dout;   /* canonical: (B, H*W, C), C, C, (B, H*W, C) */
    float *out, *dx, *dw, *db; /* the serial run's */
} gn_case;

static void gn_init(gn_case *t, uint32_t stream)
{
    size_t n = (size_t)(t->B * t->H * t->W * t->C);
    t->x = test_floats(n), t->dout = test_floats(n), t->w = test_floats((size_t)t->C),
    t->b = test_floats((size_t)t->C);
    fill(t->x, n, stream, t->lo, t->hi);
    fill(t->dout, n, stream + 1, -1, 1);
    fill(t->w, (size_t)t->C, stream + 2, 0.5, 1.5);
    fill(t->b, (size_t)t->C, stream + 3, -0.5, 0.5);
}

static void gn_free(gn_case *t)
{
    free(t->x), free(t->w), free(t->b), free(t->dout);
    free(t->out), free(t->dx), free(t->dw), free(t->db);
}

/* The case on `grid`: this rank's blocks of out and dx, and dw, db all-reduced
 * over ZD (this rank's channels). */
static int gn_run(ff_grid *grid, const gn_case *t, float **out, float **dx, float **dw, float **db)
{
    ff_dims g = ff_grid_shape(grid), c = ff_grid_coords(grid);
    ff_group *gs = ff_grid_group(grid, t->split);
    int ns = ff_group_size(gs), rs = ff_group_rank(gs);
    int64_t cl = t->C / ns, c0 = rs * cl, images = t->B / (g.z * g.d);
    int64_t i0 = (c.z + g.z * c.d) * images, hw = t->H * t->W, px = images * hw;
    float *x = test_floats((size_t)(px * cl)), *dout = test_floats((size_t)(px * cl));
    float *w = test_floats((size_t)cl), *b = test_floats((size_t)cl);
    float *mean = test_floats((size_t)(images * t->G)),
          *rstd = test_floats((size_t)(images * t->G));
    float *scratch = test_floats((size_t)(2 * images * t->G));
    *out = test_floats((size_t)(px * cl)), *dx = test_floats((size_t)(px * cl));
    *dw = test_floats((size_t)cl), *db = test_floats((size_t)cl);
    block(x, t->x, i0 * hw, px, t->C, c0, cl);
    block(dout, t->dout, i0 * hw, px, t->C, c0, cl);
    memcpy(w, t->w + c0, (size_t)cl * sizeof(float));
    memcpy(b, t->b + c0, (size_t)cl * sizeof(float));
    int rc = ff_gn_forward(gs, *out, mean, rstd, x, w, b, images, hw, cl, t->C, t->G, t->eps);
    if (rc == FF_OK)
        rc = ff_gn_backward(gs, *dx, *dw, *db, dout, x, w, mean, rstd, images, hw, cl, t->C, t->G,
                            scratch);
    ff_group *zd = ff_grid_group(grid, FF_GROUP_ZD);
    if (rc == FF_OK)
        rc = ff_allreduce(zd, *dw, *dw, (size_t)cl, NULL);
    if (rc == FF_OK)
        rc = ff_allreduce(zd, *db, *db, (size_t)cl, NULL);
    free(x), free(dout), free(w), free(b), free(mean), free(rstd), free(scratch);
    return rc;
}

/* the stages of each tensor, and the longest reduction */
static double gn_bound(const gn_case *t, ff_dims g, int ns, int stages)
{
    double n = (double)(t->H * t->W * (t->C / t->G)) + ns,
           p = (double)(t->B * t->H * t->W) + g.z * g.d;
    return stages * test_gamma((n > p ? n : p) + 8);
}

static void gn_compare(const char *grid, ff_grid *gr, const gn_case *t)
{
    float *out, *dx, *dw, *db;
    int rc = gn_run(gr, t, &out, &dx, &dw, &db);
    CHECK(rc == FF_OK, "grid %s %s: %s", grid, t->name, ff_ctx_error(ff_grid_ctx(gr)));
    ff_dims g = ff_grid_shape(gr), c = ff_grid_coords(gr);
    ff_group *gs = ff_grid_group(gr, t->split);
    int ns = ff_group_size(gs);
    int64_t cl = t->C / ns, c0 = ff_group_rank(gs) * cl, images = t->B / (g.z * g.d);
    int64_t q = c.z + g.z * c.d, hw = t->H * t->W, px = images * hw;
    float *ref = test_floats((size_t)(px * cl));
    ff_dims one = {1, 1, 1, 1};
    char what[96];
    if (rc == FF_OK) {
        block(ref, t->out, q * px, px, t->C, c0, cl);
        snprintf(what, sizeof what, "%s output", t->name);
        check_norm(grid, what, out, ref, (size_t)(px * cl),
                   gn_bound(t, g, ns, 2) + gn_bound(t, one, 1, 2));
        block(ref, t->dx, q * px, px, t->C, c0, cl);
        snprintf(what, sizeof what, "%s input gradient", t->name);
        check_norm(grid, what, dx, ref, (size_t)(px * cl),
                   gn_bound(t, g, ns, 3) + gn_bound(t, one, 1, 3));
        snprintf(what, sizeof what, "%s weight gradient", t->name);
        check_norm(grid, what, dw, t->dw + c0, (size_t)cl,
                   gn_bound(t, g, ns, 3) + gn_bound(t, one, 1, 3));
        snprintf(what, sizeof what, "%s bias gradient", t->name);
        check_norm(grid, what, db, t->db + c0, (size_t)cl,
                   gn_bound(t, g, ns, 1) + gn_bound(t, one, 1, 1));
    }
    /* the serial grid: the serial run's code on another team of threads */
    size_t all = (size_t)(px * cl) * sizeof(float);
    CHECK(g.x * g.y * g.z * g.d > 1 || (!memcmp(out, t->out, all) && !memcmp(dx, t->dx, all) &&
                                        !memcmp(dw, t->dw, (size_t)cl * sizeof(float)) &&
                                        !memcmp(db, t->db, (size_t)cl * sizeof(float))),
          "grid %s %s: not the serial run's bits (threads %d against 1)", grid, t->name,
          team_threads);
    /* replicas: the same images and channels on the ranks of the other group */
    int64_t key = q * 1000 + c0;
    int d1 = test_replicas_differ(key, out, (size_t)(px * cl));
    int d2 = test_replicas_differ(key, dx, (size_t)(px * cl));
    CHECK(!d1 && !d2, "grid %s rank %d %s: output or input gradient differs from %d, %d replicas",
          grid, world_rank, t->name, d1, d2);
    free(ref), free(out), free(dx), free(dw), free(db);
}

/* ---- SiLU and resampling: local, the serial bits ------------------------------------------- */

enum { RB = 8, RH = 4, RW = 6, RC = 8 };

typedef struct {
    float *x, *dup, *ddown; /* (RB, RH, RW, RC), (RB, 2RH, 2RW, RC), (.., RH/2, RW/2, ..) */
    float *silu, *dsilu, *up, *dxup, *down, *dxdown; /* results on the batch given */
} local_ops;

static void local_run(ff_ctx *ctx, local_ops *o, const float *x, const float *dup,
                      const float *ddown, int64_t images, int64_t cl)
{
    size_t n = (size_t)(images * RH * RW * cl);
    o->silu = test_floats(n), o->dsilu = test_floats(n), o->dxup = test_floats(n),
    o->dxdown = test_floats(n);
    o->up = test_floats(4 * n), o->down = test_floats(n / 4);
    ff_silu_forward(ctx, o->silu, x, (int64_t)n);
    ff_silu_backward(ctx, o->dsilu, x, x, (int64_t)n); /* x as the output gradient too */
    ff_upsample_forward(ctx, o->up, x, images, RH, RW, cl);
    ff_upsample_backward(ctx, o->dxup, dup, images, RH, RW, cl);
    ff_downsample_forward(ctx, o->down, x, images, RH, RW, cl);
    ff_downsample_backward(ctx, o->dxdown, ddown, images, RH, RW, cl);
}

static void local_free(local_ops *o)
{
    free(o->x), free(o->dup), free(o->ddown), free(o->silu), free(o->dsilu), free(o->up);
    free(o->dxup), free(o->down), free(o->dxdown);
}

static local_ops serial_local;

static int same_block(const float *got, const float *canon, int64_t r0, int64_t rows, int64_t C,
                      int64_t c0, int64_t cl)
{
    float *ref = test_floats((size_t)(rows * cl));
    block(ref, canon, r0, rows, C, c0, cl);
    int same = !memcmp(got, ref, (size_t)(rows * cl) * sizeof(float));
    free(ref);
    return same;
}

static void local_compare(const char *grid, ff_grid *gr)
{
    ff_dims g = ff_grid_shape(gr), c = ff_grid_coords(gr);
    int64_t cl = RC / g.y, c0 = c.y * cl, images = RB / (g.z * g.d);
    int64_t q = c.z + g.z * c.d, px = images * RH * RW;
    local_ops o = {test_floats((size_t)(px * cl)),
                   test_floats((size_t)(4 * px * cl)),
                   test_floats((size_t)(px * cl / 4)),
                   0,
                   0,
                   0,
                   0,
                   0,
                   0};
    const local_ops *s = &serial_local;
    block(o.x, s->x, q * px, px, RC, c0, cl);
    block(o.dup, s->dup, 4 * q * px, 4 * px, RC, c0, cl);
    block(o.ddown, s->ddown, q * px / 4, px / 4, RC, c0, cl);
    local_run(ff_grid_ctx(gr), &o, o.x, o.dup, o.ddown, images, cl);
    int same = same_block(o.silu, s->silu, q * px, px, RC, c0, cl) &&
               same_block(o.dsilu, s->dsilu, q * px, px, RC, c0, cl) &&
               same_block(o.up, s->up, 4 * q * px, 4 * px, RC, c0, cl) &&
               same_block(o.dxup, s->dxup, q * px, px, RC, c0, cl) &&
               same_block(o.down, s->down, q * px / 4, px / 4, RC, c0, cl) &&
               same_block(o.dxdown, s->dxdown, q * px, px, RC, c0, cl);
    CHECK(same, "grid %s rank %d: SiLU or resampling differs from the serial bits", grid,
          world_rank);
    local_free(&o);
}

/* ---- cases ------------------------------------------------------------------------------------
 */

enum { NGN = 2 };
static gn_case gn_cases[NGN] = {
    /* a mean of 0.5 (the centring matters); a variance of 0.013 (so does eps) */
    {"groupnorm-y", FF_GROUP_Y, 8, 3, 3, 24, 6, 1e-5f, -0.5, 1.5, 0, 0, 0, 0, 0, 0, 0, 0},
    {"groupnorm-x", FF_GROUP_X, 8, 2, 4, 16, 4, 1e-5f, 0.3, 0.7, 0, 0, 0, 0, 0, 0, 0, 0},
};

static void refusals(const char *grid, ff_grid *gr)
{
    ff_group *gy = ff_grid_group(gr, FF_GROUP_Y);
    float buf[64] = {0};
    int rc =
        ff_gn_forward(gy, buf, buf, buf, buf, buf, buf, 1, 1, 5, 5 * ff_group_size(gy), 3, 1e-5f);
    CHECK(rc == FF_EDIVIDE && strstr(ff_ctx_error(ff_grid_ctx(gr)), "GroupNorm: 3 groups"),
          "grid %s: 3 groups of %d channels gave %d '%s'", grid, 5 * ff_group_size(gy), rc,
          ff_ctx_error(ff_grid_ctx(gr)));
}

static void run_grid(const char *name, ff_grid *grid)
{
    for (int i = 0; i < NGN; i++)
        gn_compare(name, grid, &gn_cases[i]);
    local_compare(name, grid);
    refusals(name, grid);
}

static void serial_runs(ff_ctx *self)
{
    ff_grid *one;
    if (ff_grid_create(self, (ff_dims){1, 1, 1, 1}, &one) != FF_OK)
        MPI_Abort(MPI_COMM_WORLD, 1);
    for (int i = 0; i < NGN; i++) {
        gn_case *t = &gn_cases[i];
        gn_init(t, 300 + 10 * (uint32_t)i);
        if (gn_run(one, t, &t->out, &t->dx, &t->dw, &t->db) != FF_OK)
            MPI_Abort(MPI_COMM_WORLD, 1);
    }
    local_ops *s = &serial_local;
    size_t n = RB * RH * RW * RC;
    s->x = test_floats(n), s->dup = test_floats(4 * n), s->ddown = test_floats(n / 4);
    fill(s->x, n, 400, -6, 6);
    fill(s->dup, 4 * n, 401, -1, 1);
    fill(s->ddown, n / 4, 402, -1, 1);
    local_run(self, s, s->x, s->dup, s->ddown, RB, RC);
    ff_grid_destroy(one);
}

/* ---- the oracle's cases ------------------------------------------------------------------------
 */

static int put(FILE *f, const void *a, size_t n) { return f && fwrite(a, 4, n, f) == n; }

/* gn.bin: int32 B, H, W, C, G, float eps, then x, w, b, dout, out, dx, dw, db;
 * local.bin: int32 B, H, W, C, then x, dup, ddown, silu, dsilu (at dout = x),
 * up, dxup, down, dxdown (all float32, NHWC) */
static int dump(const char *dir)
{
    int bad = 0;
    char path[1024];
    for (int i = 0; i < NGN; i++) {
        const gn_case *t = &gn_cases[i];
        snprintf(path, sizeof path, "%s/gn_%d.bin", dir, i);
        FILE *f = fopen(path, "wb");
        int32_t h[5] = {(int32_t)t->B, (int32_t)t->H, (int32_t)t->W, (int32_t)t->C, t->G};
        size_t n = (size_t)(t->B * t->H * t->W * t->C), C = (size_t)t->C;
        int ok = put(f, h, 5) && put(f, &t->eps, 1) && put(f, t->x, n) && put(f, t->w, C) &&
                 put(f, t->b, C) && put(f, t->dout, n) && put(f, t->out, n) && put(f, t->dx, n) &&
                 put(f, t->dw, C) && put(f, t->db, C);
        bad |= !(f && fclose(f) == 0 && ok);
    }
    snprintf(path, sizeof path, "%s/local.bin", dir);
    FILE *f = fopen(path, "wb");
    const local_ops *s = &serial_local;
    int32_t h[4] = {RB, RH, RW, RC};
    size_t n = RB * RH * RW * RC;
    int ok = put(f, h, 4) && put(f, s->x, n) && put(f, s->dup, 4 * n) && put(f, s->ddown, n / 4) &&
             put(f, s->silu, n) && put(f, s->dsilu, n) && put(f, s->up, 4 * n) &&
             put(f, s->dxup, n) && put(f, s->down, n / 4) && put(f, s->dxdown, n);
    bad |= !(f && fclose(f) == 0 && ok);
    if (bad)
        fprintf(stderr, "test_unet_ops: cannot write the cases into %s\n", dir);
    return bad;
}

int main(int argc, char **argv)
{
    ff_ctx *ctx, *self;
    team_threads = test_mpi_start(&argc, &argv, &ctx, &self);
    MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &world_size);
    serial_runs(self);
    int code;
    if (argc == 3 && !strcmp(argv[1], "--dump")) {
        code = world_size != 1 || dump(argv[2]);
    } else {
        test_run_grids(argc, argv, ctx, &worst_ratio,
                       "GroupNorm against the serial run, replicas bit for bit; SiLU, "
                       "resampling the serial bits",
                       run_grid);
        if (world_rank == 0)
            printf("GroupNorm: worst error/bound over all grids %.3f (norm-wise, stages of "
                   "gamma_{K+8}, u = 2^-24)\n",
                   worst_ratio);
        code = test_finish("test_unet_ops");
    }
    for (int i = 0; i < NGN; i++)
        gn_free(&gn_cases[i]);
    local_free(&serial_local);
    ff_ctx_destroy(self);
    ff_ctx_destroy(ctx);
    MPI_Finalize();
    return code;
}
