/* The DDPM U-Net (include/fourfold/unet.h) on every grid of the job's rank
 * count (or the grids named) against the serial model.
 *
 *   usage: test_unet [all | GxxGyxGzxGd ...]
 *          test_unet --dump DIR   (1 rank: the serial model's step for
 *                                  tools/unet_oracle.py, PyTorch in float64)
 *
 * The "tiny" preset (8x8 images, C0 8, two levels, 8 residual blocks, skip
 * concatenations, 1x1 skips, attention in the middle) with attention also
 * after each of the 3 blocks at 4x4 (attn_levels, down and up), a batch of 8 images from the
 * counter-based RNG and parameters drawn per canonical tensor (GroupNorm gains and biases away from
 * 1 and 0), scattered on every grid; one step of the DDPM objective (its timesteps and noise drawn
 * per image, the same on every grid). Every rank also runs the serial model (a 1x1x1x1 grid on
 * MPI_COMM_SELF).
 *
 * Bound (docs/testing.md, "The bounds of the U-Net"), the GPT's model of
 * stages: a reduction of at most K terms and the elementwise roundings
 * around it is a stage of gamma_{K+8}; the forward's longest chain has F = 6
 * stages per residual block (two GroupNorms of 2, two convolutions) and 8
 * outside them (the embedding's three products, conv_in, the output
 * GroupNorm and conv_out, the loss); the loss is within (F + 1) gamma, a
 * gradient (norm-wise per tensor) within (2F + 1) gamma (the backward
 * retraces the chain and ends with a sum over pixels). The grid and the
 * serial run each within it of the exact value: their sum is the test's.
 * Refused, with one message: an image size the levels cannot halve, a batch
 * Gz*Gd does not divide, channels X or Y does not divide, a width the
 * GroupNorm group width does not divide, more blocks than the model's
 * tables hold, bf16-mixed products.
 * Bit for bit: the step with every overlap off (OAR, ORS, OAG, AG cache)
 * against all on, both with the GEMM tuner (below), as the serial run;
 * on the 1x1x1x1 grid (--threads N: the element-wise work on N threads) the
 * serial run's bits. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "fourfold/unet.h"
#include "test_util.h"

static int world_rank, team_threads = 1;
static double worst_ratio;
static ff_unet_config cfg;
enum { BATCH = 8, SEED = 51 };
static float *x0;        /* (BATCH, S, S, img_channels) */
static float **params;   /* canonical, per tensor */
static float **ser_grad; /* the serial run's canonical gradients */
static float ser_loss;
static int ntensors;
static double gam_loss, gam_grad;

static double urand(uint32_t stream, uint64_t i)
{
    return 2.0 * ff_rng_uniform(777, stream, i) - 1;
}

static void make_params(ff_unet *u)
{
    ntensors = ff_unet_tensors(u);
    params = calloc((size_t)ntensors, sizeof *params);
    ser_grad = calloc((size_t)ntensors, sizeof *ser_grad);
    for (int i = 0; i < ntensors; i++) {
        ff_unet_tensor_info t = ff_unet_tensor(u, i);
        params[i] = test_floats((size_t)t.numel);
        ser_grad[i] = test_floats((size_t)t.numel);
        int gain = strstr(t.name, "norm") && strstr(t.name, ".weight");
        double fan = t.ndim >= 2 ? (double)(t.numel / t.shape[0]) : 1;
        for (int64_t e = 0; e < t.numel; e++) {
            double r = urand(300 + (uint32_t)i, (uint64_t)e);
            params[i][e] = (float)(t.ndim >= 2 ? r * sqrt(3.0 / fan)
                                   : gain      ? 1 + 0.3 * r
                                               : 0.3 * r);
        }
    }
}

/* The model's canonical parameters (which 0) or gradients (1) into out (rank
 * 0) unless rc, a failure reported; the model destroyed. */
static int gather_all(ff_grid *grid, ff_unet *u, int rc, int which, float **out)
{
    for (int i = 0; i < ntensors && !rc; i++)
        rc = ff_unet_gather(u, i, which, out[i]);
    if (rc)
        fprintf(stderr, "rank %d: %s\n", world_rank, ff_ctx_error(ff_grid_ctx(grid)));
    ff_unet_destroy(u);
    return rc;
}

/* One step on grid: the loss and the canonical gradients (rank 0). */
static int run(ff_grid *grid, const ff_linear_opts *opts, float *loss, float **grads)
{
    ff_unet *u;
    int rc = ff_unet_create(grid, &cfg, opts, BATCH, &u);
    if (rc)
        return rc;
    for (int i = 0; i < ntensors && !rc; i++)
        rc = ff_unet_scatter(u, i, params[i]);
    int64_t first, n;
    ff_unet_images(u, &first, &n);
    const int64_t per = cfg.image_size * cfg.image_size * cfg.img_channels;
    ff_unet_zero_grads(u);
    if (!rc)
        rc = ff_unet_ddpm_loss(u, x0 + first * per, SEED, 0, loss);
    /* validation's forward-only loss of the same batch: the same bits, and
     * the gradients (checked below) untouched */
    float val = 0;
    if (!rc)
        rc = ff_unet_ddpm_eval(u, x0 + first * per, SEED, 0, &val);
    if (!rc)
        CHECK(!memcmp(&val, loss, sizeof val),
              "rank %d: the forward-only loss %.9g is not the step's %.9g", world_rank, val, *loss);
    if (!rc)
        rc = ff_unet_allreduce_grads(u);
    return gather_all(grid, u, rc, 1, grads);
}

static double norm2(const float *a, const float *b, int64_t n)
{
    double s = 0;
    for (int64_t e = 0; e < n; e++) {
        double d = (double)a[e] - (b ? (double)b[e] : 0);
        s += d * d;
    }
    return sqrt(s);
}

static ff_unet *shape_model; /* the serial model, for the tensors' shapes */

/* ---- one AdamW step (eps 1, no clipping) ----------------------------------
 * At step 0, r = m^/(sqrt(v^) + 1) = g/(|g| + 1), whose derivative is at
 * most 1: |dr| <= |dg| + 6u|r|. So a parameter after the step, p - lr (r +
 * wd p), differs from the serial run's by at most lr (2 gamma_grad |g| +
 * 12u |r|) + 16u (|p| + lr (|r| + wd |p|)) norm-wise (both runs' roundings
 * of the update's five operations). */
static ff_adamw hyper;
static float **ser_after, ser_norm;

static int run_step(ff_grid *grid, float **after, float *norm)
{
    ff_unet *u;
    int rc = ff_unet_create(grid, &cfg, NULL, BATCH, &u);
    if (rc)
        return rc;
    for (int i = 0; i < ntensors && !rc; i++)
        rc = ff_unet_scatter(u, i, params[i]);
    int64_t first, n;
    ff_unet_images(u, &first, &n);
    ff_unet_step_info info;
    if (!rc)
        rc = ff_unet_step(u, x0 + first * cfg.image_size * cfg.image_size * cfg.img_channels, SEED,
                          0, &hyper, &info);
    *norm = info.grad_norm;
    return gather_all(grid, u, rc, 0, after);
}

static void check_step(const char *name, ff_grid *grid)
{
    float **a = calloc((size_t)(ntensors < 1 ? 1 : ntensors), sizeof *a), norm = 0;
    for (int i = 0; i < ntensors; i++)
        a[i] = test_floats((size_t)ff_unet_tensor(shape_model, i).numel);
    int rc = run_step(grid, a, &norm);
    CHECK(rc == FF_OK, "grid %s: the AdamW step failed", name);
    const double u = 1.0 / 16777216.0;
    if (rc == FF_OK) {
        double r = fabs((double)norm - ser_norm) / (2 * gam_grad * ser_norm);
        CHECK(r <= 1, "grid %s rank %d: gradient norm %.9g, serial %.9g (%.2f of the bound)", name,
              world_rank, norm, ser_norm, r);
        if (r > worst_ratio)
            worst_ratio = r;
    }
    for (int i = 0; i < ntensors && rc == FF_OK && world_rank == 0; i++) {
        ff_unet_tensor_info t = ff_unet_tensor(shape_model, i);
        double wd = t.ndim >= 2 ? hyper.weight_decay : 0, g2 = 0, r2 = 0, p2 = 0;
        for (int64_t e = 0; e < t.numel; e++) {
            double g = ser_grad[i][e], r = g / (fabs(g) + 1);
            g2 += g * g, r2 += r * r, p2 += (double)params[i][e] * params[i][e];
        }
        double lr = hyper.lr;
        double bound = lr * (2 * gam_grad * sqrt(g2) + 12 * u * sqrt(r2)) +
                       16 * u * (sqrt(p2) + lr * (sqrt(r2) + wd * sqrt(p2)));
        double err = norm2(a[i], ser_after[i], t.numel), ratio = err / bound;
        if (ratio > worst_ratio)
            worst_ratio = ratio;
        CHECK(ratio <= 1, "grid %s: %s after the AdamW step differs by %.3g, bound %.3g", name,
              t.name, err, bound);
    }
    for (int i = 0; i < ntensors; i++)
        free(a[i]);
    free(a);
}

/* The forward's stages (docs/testing.md, "The bounds of the U-Net"): 6 per
 * residual block, 7 per self-attention (GroupNorm 2, QKV, scores, softmax,
 * P V, projection), and 7 outside them (the embedding's three products,
 * conv_in, the output GroupNorm and conv_out; the loss is the eighth). */
static double stages(void)
{
    int blocks = cfg.levels * cfg.nres + 2 + cfg.levels * (cfg.nres + 1);
    int attns = cfg.attn_head_channels ? 1 : 0;
    for (int i = 0; i < cfg.levels; i++)
        attns += ((cfg.attn_levels >> i) & 1) * (2 * cfg.nres + 1);
    return 6.0 * blocks + 7 * attns + 7;
}

/* ---- sampling: one reverse step (T = 1, beta 0.5) -------------------------
 * At t = 0 improved DDPM's posterior mean is x0^ itself: out = clip(r x_T -
 * k eps), r = 1/sqrt(abar), k = sqrt(1/abar - 1), clip to [-1, 1] (active:
 * r = 1.41 on x_T ~ N(0, 1)). eps is the forward's output (F stages), the
 * clip is 1-Lipschitz, and the update is computed in double (two products
 * and a difference: within 3 2^-53 (r|x_T| + k|eps|)) and rounded once to
 * float (u|out|), so norm-wise per rank's images |d out| <= 2 k F gamma
 * |eps| + 2u |out| + 6 2^-53 (r |x_T| + k |eps|), the two runs' bounds
 * added, eps the serial run's (ff_unet_sample_partial gives it back), x_T
 * the sampler's draws. */
static ff_unet_config cfg_s;
static float *ser_sample, *ser_eps;

static int run_sample(ff_grid *grid, float *out_local, float *eps_local)
{
    ff_unet *u;
    int rc = ff_unet_create(grid, &cfg_s, NULL, BATCH, &u);
    for (int i = 0; i < ntensors && !rc; i++)
        rc = ff_unet_scatter(u, i, params[i]);
    if (!rc)
        rc =
            ff_unet_sample_partial(u, SEED, cfg_s.timesteps, FF_UNET_DDPM, 0, out_local, eps_local);
    if (rc)
        fprintf(stderr, "rank %d: %s\n", world_rank, ff_ctx_error(ff_grid_ctx(grid)));
    ff_unet_destroy(u);
    return rc;
}

static void check_sample(const char *name, ff_grid *grid)
{
    ff_dims g = ff_grid_shape(grid), c = ff_grid_coords(grid);
    const int64_t per = cfg.image_size * cfg.image_size * cfg.img_channels;
    const int64_t n = BATCH / (g.z * g.d), first = (c.z + (int64_t)g.z * c.d) * n;
    float *out = test_floats((size_t)(n * per)), *z = test_floats((size_t)per);
    int rc = run_sample(grid, out, NULL);
    CHECK(rc == FF_OK, "grid %s: sampling failed", name);
    double ab = 1 - cfg_s.beta_first, r = 1 / sqrt(ab), k = sqrt(1 / ab - 1);
    double x2 = 0, o2 = 0, e2 = 0, d2 = 0, F = stages();
    for (int64_t b = 0; b < n && rc == FF_OK; b++) {
        ff_ddpm_sample_noise(&cfg_s, SEED, first + b, 1, z);
        for (int64_t e = 0; e < per; e++) {
            double s = ser_sample[(first + b) * per + e], eps = ser_eps[(first + b) * per + e];
            double d = (double)out[b * per + e] - s;
            x2 += (double)z[e] * z[e], o2 += s * s, e2 += eps * eps, d2 += d * d;
        }
    }
    const double u = 1.0 / 16777216.0, K = BATCH * cfg.image_size * cfg.image_size + 8;
    double bound = 2 * k * F * test_gamma(K) * sqrt(e2) + 2 * u * sqrt(o2) +
                   6 * ldexp(1, -53) * (r * sqrt(x2) + k * sqrt(e2));
    if (rc == FF_OK) {
        CHECK(sqrt(d2) <= bound, "grid %s rank %d: the samples differ by %.3g, bound %.3g", name,
              world_rank, sqrt(d2), bound);
        if (sqrt(d2) / bound > worst_ratio)
            worst_ratio = sqrt(d2) / bound;
    }
    free(out), free(z);
}

/* ---- initialisation ---------------------------------------------------------
 * ff_unet_init (PyTorch's default of each unsplit layer, drawn by canonical
 * index) on every grid gives the serial model's canonical tensors bit for
 * bit; the serial tensors against the oracle's own draws and torch's fan-in
 * (tools/unet_oracle.py, DIR/unet_init.bin). */
static float **ser_init;

static int run_init(ff_grid *grid, float **out)
{
    ff_unet *u;
    int rc = ff_unet_create(grid, &cfg, NULL, BATCH, &u);
    if (rc)
        return rc;
    return gather_all(grid, u, ff_unet_init(u, SEED), 0, out);
}

static float **tensor_buffers(void)
{
    float **a = calloc((size_t)(ntensors < 1 ? 1 : ntensors), sizeof *a);
    for (int i = 0; i < ntensors; i++)
        a[i] = test_floats((size_t)ff_unet_tensor(shape_model, i).numel);
    return a;
}

static void free_tensors(float **a)
{
    for (int i = 0; a && i < ntensors; i++)
        free(a[i]);
    free(a);
}

static void check_init(const char *name, ff_grid *grid)
{
    float **a = tensor_buffers();
    int rc = run_init(grid, a), same = 1;
    CHECK(rc == FF_OK, "grid %s: ff_unet_init failed", name);
    for (int i = 0; i < ntensors && rc == FF_OK && world_rank == 0; i++)
        same &= !memcmp(a[i], ser_init[i], (size_t)ff_unet_tensor(shape_model, i).numel * 4);
    CHECK(same, "grid %s: ff_unet_init's parameters are not the serial model's bits", name);
    free_tensors(a);
}

/* Shapes the model refuses, each with one message naming the size (a
 * refusal after layers were added frees them: the sanitizer build). */
static void refusals(const char *name, ff_grid *grid)
{
    ff_dims g = ff_grid_shape(grid);
    ff_ctx *ctx = ff_grid_ctx(grid);
    ff_unet *u = NULL;
    struct {
        const char *what, *says;
        ff_unet_config c;
        int64_t batch;
        int applies;
    } cases[6];
    for (int i = 0; i < 6; i++)
        cases[i].c = cfg, cases[i].batch = BATCH, cases[i].applies = 1;
    cases[0].what = "image size 10 for 3 levels", cases[0].says = "cannot be halved";
    cases[0].c.image_size = 10, cases[0].c.levels = 3, cases[0].c.mult[2] = 2;
    cases[1].what = "a batch of 7", cases[1].says = "a batch of 7 images";
    cases[1].batch = 7, cases[1].applies = g.z * g.d > 1;
    cases[2].what = "12 base channels", cases[2].says = "do not divide";
    cases[2].c.base = 12, cases[2].applies = 12 % g.x || 12 % g.y;
    cases[3].what = "groups of 3 channels", cases[3].says = "in groups of 3 does not divide";
    cases[3].c.group_channels = 3;
    cases[4].what = "20 blocks a level", cases[4].says = "more than";
    cases[4].c.nres = 20;
    cases[5].what = "attention at a third level of 2", cases[5].says = "attention at levels 0x6";
    cases[5].c.attn_levels = 6;
    for (int i = 0; i < 6; i++) {
        if (!cases[i].applies)
            continue;
        int rc = ff_unet_create(grid, &cases[i].c, NULL, cases[i].batch, &u);
        CHECK(rc != FF_OK && !u && strstr(ff_ctx_error(ctx), cases[i].says),
              "grid %s: %s gave %d '%s'", name, cases[i].what, rc, ff_ctx_error(ctx));
        ff_unet_destroy(u), u = NULL;
    }
    ff_linear_opts o;
    ff_linear_opts_default(&o);
    o.bf16 = 1;
    int rc = ff_unet_create(grid, &cfg, &o, BATCH, &u);
    CHECK(rc == FF_EUNSUPPORTED && !u && strstr(ff_ctx_error(ctx), "bf16-mixed"),
          "grid %s: bf16-mixed gave %d '%s'", name, rc, ff_ctx_error(ctx));
    ff_unet_destroy(u);
}

static void run_grid(const char *name, ff_grid *grid)
{
    ff_dims gs = ff_grid_shape(grid);
    float loss = 0, loss_off = 0, **g = calloc((size_t)ntensors, sizeof *g),
          **g_off = calloc((size_t)ntensors, sizeof *g_off);
    for (int i = 0; i < ntensors; i++) {
        g[i] = test_floats((size_t)ff_unet_tensor(shape_model, i).numel);
        g_off[i] = test_floats((size_t)ff_unet_tensor(shape_model, i).numel);
    }
    /* The GEMM tuner on in both: it admits only modes that give the direct
     * call's bits (checked on random operands, docs/linear.md; when it
     * checked on the first product's, mostly the zero channels of a
     * padded image, 3 of 100 tensors differed once in six runs) */
    ff_linear_opts on, off;
    ff_linear_opts_default(&on);
    off = on;
    off.oar = off.ors = off.oag = 0, off.ag_cache_layers = 0;
    int rc = run(grid, &on, &loss, g);
    CHECK(rc == FF_OK, "grid %s: the step failed", name);
    int rc_off = run(grid, &off, &loss_off, g_off);
    CHECK(rc_off == FF_OK, "grid %s: the step with every overlap off failed", name);
    /* the overlaps move when data moves, not what is added: the same bits */
    int same = rc || rc_off || !memcmp(&loss, &loss_off, sizeof loss);
    for (int i = 0; i < ntensors && !rc && !rc_off && world_rank == 0; i++)
        same &= !memcmp(g[i], g_off[i], (size_t)ff_unet_tensor(shape_model, i).numel * 4);
    CHECK(same, "grid %s rank %d: every overlap off (OAR, ORS, OAG, AG cache) gave other bits",
          name, world_rank);
    /* the serial grid: the serial run's code on the world's team of threads */
    if (gs.x * gs.y * gs.z * gs.d == 1 && !rc) {
        same = !memcmp(&loss, &ser_loss, sizeof loss);
        for (int i = 0; i < ntensors; i++)
            same &= !memcmp(g[i], ser_grad[i], (size_t)ff_unet_tensor(shape_model, i).numel * 4);
        CHECK(same, "grid %s: not the serial run's bits (threads %d against 1)", name,
              team_threads);
    }
    if (rc == FF_OK) {
        double r = fabs((double)loss - ser_loss) / (2 * gam_loss * ser_loss);
        if (r > worst_ratio)
            worst_ratio = r;
        CHECK(r <= 1, "grid %s rank %d: loss %.9g, serial %.9g (%.2f of the bound)", name,
              world_rank, loss, ser_loss, r);
    }
    for (int i = 0; i < ntensors && rc == FF_OK && world_rank == 0; i++) {
        ff_unet_tensor_info t = ff_unet_tensor(shape_model, i);
        double err = norm2(g[i], ser_grad[i], t.numel), ref = norm2(ser_grad[i], NULL, t.numel);
        double r = ref > 0 ? err / (2 * gam_grad * ref) : (err > 0 ? INFINITY : 0);
        if (r > worst_ratio)
            worst_ratio = r;
        CHECK(r <= 1, "grid %s: gradient %s differs by %.3g of its norm %.3g (%.2f of the bound)",
              name, t.name, ref > 0 ? err / ref : err, ref, r);
    }
    for (int i = 0; i < ntensors; i++)
        free(g[i]), free(g_off[i]);
    free(g), free(g_off);
    check_step(name, grid);
    check_sample(name, grid);
    check_init(name, grid);
    refusals(name, grid);
}

static int write_all(FILE *f, const void *p, size_t bytes)
{
    return fwrite(p, 1, bytes, f) == bytes;
}

/* For tools/unet_oracle.py, little-endian: int32 S, img_channels, pad, base,
 * levels, mult[levels], nres, group_channels, temb_mult, T, schedule,
 * batch, ntensors, attn_head_channels, attn_levels; float64 beta_first, beta_last; float32 x0
 * (B,S,S,ci); int32 t (B); float32 noise (B,S,S,ci); per tensor int32 name length, the name, int32
 * ndim, int32 shape, float32 values and fourfold's gradient; float32 fourfold's loss; per tensor
 * float32 the parameters after one AdamW step (below); int32 1000, float64 alpha_bar of the cosine
 * and of the linear (1e-4 .. 0.02) schedules at T = 1000; float32 x_T (B,S,S,ci) and fourfold's
 * sample of one reverse step (T = 1, beta 0.5); int32 the number of respaced schedules, each int32
 * T, schedule, K, float64
 * beta_first, beta_last, int32 the K kept timesteps, float64 their betas
 * (ff_ddpm_respace); int32 seed, T, K, schedule, float64 beta_first,
 * beta_last and float32 fourfold's images before and after each step of
 * sampling in K = 4 of the preset's T = 100 steps (kept 0, 33, 66, 99), K + 1
 * of them: x_T, then after the steps at t = 99, 66, 33 (its noise added) and
 * 0 (ff_unet_sample_partial stopped at K .. 0); then the same K + 1 images of
 * DDIM's chain (FF_UNET_DDIM, eta = 0). */
static int dump(ff_ctx *self, const char *dir)
{
    ff_grid *one;
    if (ff_grid_create(self, (ff_dims){1, 1, 1, 1}, &one) != FF_OK)
        return 1;
    float loss;
    if (run(one, NULL, &loss, ser_grad) != FF_OK)
        return 1;
    char path[1024];
    snprintf(path, sizeof path, "%s/unet.bin", dir);
    FILE *f = fopen(path, "wb");
    if (!f)
        return 1;
    int32_t h[32], k = 0;
    h[k++] = (int32_t)cfg.image_size, h[k++] = cfg.img_channels, h[k++] = cfg.img_channels_pad;
    h[k++] = cfg.base, h[k++] = cfg.levels;
    for (int i = 0; i < cfg.levels; i++)
        h[k++] = cfg.mult[i];
    h[k++] = cfg.nres, h[k++] = cfg.group_channels, h[k++] = cfg.temb_mult;
    h[k++] = cfg.timesteps, h[k++] = (int32_t)cfg.schedule, h[k++] = BATCH, h[k++] = ntensors;
    h[k++] = cfg.attn_head_channels, h[k++] = cfg.attn_levels;
    double betas[2] = {cfg.beta_first, cfg.beta_last};
    const int64_t per = cfg.image_size * cfg.image_size * cfg.img_channels;
    int ok = write_all(f, h, (size_t)k * 4) && write_all(f, betas, sizeof betas) &&
             write_all(f, x0, (size_t)(BATCH * per) * 4);
    float *noise = test_floats((size_t)(BATCH * per));
    int32_t t[BATCH];
    for (int b = 0; b < BATCH; b++)
        t[b] = ff_ddpm_draw(&cfg, SEED, 0, BATCH, b, noise + b * per);
    ok = ok && write_all(f, t, sizeof t) && write_all(f, noise, (size_t)(BATCH * per) * 4);
    for (int i = 0; i < ntensors && ok; i++) {
        ff_unet_tensor_info ti = ff_unet_tensor(shape_model, i);
        int32_t len = (int32_t)strlen(ti.name), nd = ti.ndim, sh[4];
        for (int d = 0; d < nd; d++)
            sh[d] = (int32_t)ti.shape[d];
        ok = write_all(f, &len, 4) && write_all(f, ti.name, (size_t)len) && write_all(f, &nd, 4) &&
             write_all(f, sh, (size_t)nd * 4) && write_all(f, params[i], (size_t)ti.numel * 4) &&
             write_all(f, ser_grad[i], (size_t)ti.numel * 4);
    }
    ok = ok && write_all(f, &loss, 4);
    /* one AdamW step (lr 1e-2, betas 0.9 and 0.95, eps 1e-8, decay 0.1 on
     * the weights, no clipping): the parameters after it, per tensor */
    ff_adamw_default(&hyper);
    hyper.lr = 1e-2f, hyper.clip = 0, hyper.steps = 1;
    float **after = calloc((size_t)(ntensors < 1 ? 1 : ntensors), sizeof *after), norm;
    for (int i = 0; i < ntensors; i++)
        after[i] = test_floats((size_t)ff_unet_tensor(shape_model, i).numel);
    ok = ok && run_step(one, after, &norm) == FF_OK;
    for (int i = 0; i < ntensors && ok; i++)
        ok = write_all(f, after[i], (size_t)ff_unet_tensor(shape_model, i).numel * 4);
    for (int i = 0; i < ntensors; i++)
        free(after[i]);
    free(after);
    /* the schedules at T = 1000: cosine, then linear 1e-4 .. 0.02 */
    ff_unet_config sc = cfg;
    double abar[2][1000];
    int32_t nT = 1000;
    sc.timesteps = 1000, sc.beta_first = 1e-4, sc.beta_last = 0.02;
    sc.schedule = FF_SCHEDULE_COSINE;
    ff_ddpm_alpha_bar(&sc, abar[0]);
    sc.schedule = FF_SCHEDULE_LINEAR;
    ff_ddpm_alpha_bar(&sc, abar[1]);
    ok = ok && write_all(f, &nT, 4) && write_all(f, abar, sizeof abar);
    /* one reverse step (T = 1, beta 0.5): x_T and the sample */
    cfg_s = cfg;
    cfg_s.timesteps = 1, cfg_s.beta_first = 0.5;
    float *xT = test_floats((size_t)(BATCH * per)), *smp = test_floats((size_t)(BATCH * per));
    for (int b = 0; b < BATCH; b++)
        ff_ddpm_sample_noise(&cfg_s, SEED, b, 1, xT + b * per);
    ok = ok && run_sample(one, smp, NULL) == FF_OK && write_all(f, xT, (size_t)(BATCH * per) * 4) &&
         write_all(f, smp, (size_t)(BATCH * per) * 4);
    /* respaced schedules (improved DDPM's space_timesteps and betas) */
    static const struct {
        int T, schedule, K;
        double b0, b1;
    } rs[] = {
        {1000, FF_SCHEDULE_LINEAR, 100, 1e-4, 0.02},  {1000, FF_SCHEDULE_COSINE, 50, 0, 0},
        {1000, FF_SCHEDULE_LINEAR, 1000, 1e-4, 0.02}, {1000, FF_SCHEDULE_LINEAR, 1, 1e-4, 0.02},
        {1000, FF_SCHEDULE_COSINE, 999, 0, 0},        {100, FF_SCHEDULE_LINEAR, 7, 1e-4, 0.2},
        {10, FF_SCHEDULE_LINEAR, 4, 0.1, 0.2},        {1000, FF_SCHEDULE_LINEAR, 250, 1e-4, 0.02}};
    int32_t nrs = (int32_t)(sizeof rs / sizeof rs[0]);
    ok = ok && write_all(f, &nrs, 4);
    for (int i = 0; i < nrs && ok; i++) {
        ff_unet_config rcfg = cfg;
        rcfg.timesteps = rs[i].T, rcfg.schedule = (ff_schedule)rs[i].schedule;
        rcfg.beta_first = rs[i].b0, rcfg.beta_last = rs[i].b1;
        int32_t head[3] = {rs[i].T, rs[i].schedule, rs[i].K}, *kept = malloc(1000 * 4);
        double b[2] = {rs[i].b0, rs[i].b1}, *beta = malloc(1000 * 8);
        int ts[1000];
        ok = kept && beta && ff_ddpm_respace(&rcfg, rs[i].K, ts, beta) == FF_OK;
        for (int j = 0; j < rs[i].K && ok; j++)
            kept[j] = ts[j];
        ok = ok && write_all(f, head, sizeof head) && write_all(f, b, sizeof b) &&
             write_all(f, kept, (size_t)rs[i].K * 4) && write_all(f, beta, (size_t)rs[i].K * 8);
        free(kept), free(beta);
    }
    /* sampling in 4 of the T = 100 steps, each state of the chain */
    enum { CHAIN_K = 4 };
    int32_t chain[4] = {SEED, (int32_t)cfg.timesteps, CHAIN_K, (int32_t)cfg.schedule};
    ff_unet *u = NULL;
    ok = ok && ff_unet_create(one, &cfg, NULL, BATCH, &u) == FF_OK;
    for (int i = 0; i < ntensors && ok; i++)
        ok = ff_unet_scatter(u, i, params[i]) == FF_OK;
    ok = ok && write_all(f, chain, sizeof chain) && write_all(f, betas, sizeof betas);
    for (int ddim = 0; ddim < 2; ddim++)
        for (int stop = CHAIN_K; stop >= 0 && ok; stop--)
            ok = ff_unet_sample_partial(u, SEED, CHAIN_K, ddim ? FF_UNET_DDIM : FF_UNET_DDPM, stop,
                                        smp, NULL) == FF_OK &&
                 write_all(f, smp, (size_t)(BATCH * per) * 4);
    ff_unet_destroy(u);
    free(xT), free(smp);
    ok = fclose(f) == 0 && ok;
    /* DIR/unet_init.bin: int32 seed, ntensors; per tensor int32 name
     * length, the name, int32 ndim, int32 shape, float32 ff_unet_init's
     * values (the serial model's) */
    snprintf(path, sizeof path, "%s/unet_init.bin", dir);
    float **init = tensor_buffers();
    ok = ok && run_init(one, init) == FF_OK && (f = fopen(path, "wb")) != NULL;
    int32_t ih[2] = {SEED, ntensors};
    if (ok) {
        ok = write_all(f, ih, sizeof ih);
        for (int i = 0; i < ntensors && ok; i++) {
            ff_unet_tensor_info ti = ff_unet_tensor(shape_model, i);
            int32_t len = (int32_t)strlen(ti.name), nd = ti.ndim, sh[4];
            for (int d = 0; d < nd; d++)
                sh[d] = (int32_t)ti.shape[d];
            ok = write_all(f, &len, 4) && write_all(f, ti.name, (size_t)len) &&
                 write_all(f, &nd, 4) && write_all(f, sh, (size_t)nd * 4) &&
                 write_all(f, init[i], (size_t)ti.numel * 4);
        }
        ok = fclose(f) == 0 && ok;
    }
    free_tensors(init);
    free(noise);
    ff_grid_destroy(one);
    if (!ok)
        fprintf(stderr, "cannot write %s\n", path);
    return !ok;
}

int main(int argc, char **argv)
{
    ff_ctx *ctx, *self;
    int world_size;
    team_threads = test_mpi_start(&argc, &argv, &ctx, &self);
    MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &world_size);
    ff_unet_preset("tiny", &cfg);
    cfg.attn_levels = 1 << 1; /* and after each block at 4x4, down and up */
    const int64_t per = cfg.image_size * cfg.image_size * cfg.img_channels;
    x0 = test_floats((size_t)(BATCH * per));
    for (int64_t e = 0; e < BATCH * per; e++)
        x0[e] = (float)urand(299, (uint64_t)e);
    ff_grid *one;
    if (ff_grid_create(self, (ff_dims){1, 1, 1, 1}, &one) != FF_OK ||
        ff_unet_create(one, &cfg, NULL, BATCH, &shape_model) != FF_OK)
        MPI_Abort(MPI_COMM_WORLD, 1);
    make_params(shape_model);
    /* the stages of the bound */
    double F = stages() + 1, K = BATCH * cfg.image_size * cfg.image_size + 8;
    gam_loss = (F + 1) * test_gamma(K), gam_grad = (2 * F + 1) * test_gamma(K);
    /* step counts outside 1 .. T refused, naming the range */
    float *none = test_floats((size_t)(BATCH * per));
    int tsteps[2];
    double tbeta[2];
    for (int k = 0; k < 2; k++) {
        int steps = k ? cfg.timesteps + 1 : 0,
            rc = ff_unet_sample(shape_model, SEED, steps, FF_UNET_DDPM, none);
        char want[64];
        snprintf(want, sizeof want, "so 1 .. %d steps", cfg.timesteps);
        CHECK(rc == FF_EINVAL && strstr(ff_ctx_error(self), want),
              "sampling in %d steps of T = %d gave %d '%s'", steps, cfg.timesteps, rc,
              ff_ctx_error(self));
        CHECK(ff_ddpm_respace(&cfg, steps, tsteps, tbeta) == FF_EINVAL,
              "ff_ddpm_respace accepted %d steps of T = %d", steps, cfg.timesteps);
    }
    free(none);
    int code;
    if (argc == 3 && !strcmp(argv[1], "--dump")) {
        code = world_size != 1 || dump(self, argv[2]) || test_failures;
    } else {
        ff_linear_opts serial_opts;
        ff_linear_opts_default(&serial_opts);
        if (run(one, &serial_opts, &ser_loss, ser_grad) != FF_OK)
            MPI_Abort(MPI_COMM_WORLD, 1);
        ff_adamw_default(&hyper);
        hyper.lr = 1e-2f, hyper.eps = 1.0f, hyper.clip = 0, hyper.steps = 1;
        ser_after = calloc((size_t)ntensors, sizeof *ser_after);
        for (int i = 0; i < ntensors; i++)
            ser_after[i] = test_floats((size_t)ff_unet_tensor(shape_model, i).numel);
        cfg_s = cfg;
        cfg_s.timesteps = 1, cfg_s.beta_first = 0.5;
        ser_sample = test_floats((size_t)(BATCH * per));
        ser_eps = test_floats((size_t)(BATCH * per));
        ser_init = tensor_buffers();
        if (run_step(one, ser_after, &ser_norm) != FF_OK ||
            run_sample(one, ser_sample, ser_eps) != FF_OK || run_init(one, ser_init) != FF_OK)
            MPI_Abort(MPI_COMM_WORLD, 1);
        test_run_grids(argc, argv, ctx, &worst_ratio,
                       "the DDPM loss, every gradient, an AdamW step and a reverse step against "
                       "the serial U-Net",
                       run_grid);
        if (world_rank == 0)
            printf("serial loss %.6f; worst |err|/bound over all grids %.4f (loss (F+1) gamma, "
                   "gradients (2F+1) gamma norm-wise, F = %.0f, K = %.0f)\n",
                   ser_loss, worst_ratio, F, K);
        code = test_finish("test_unet");
        for (int i = 0; i < ntensors; i++)
            free(ser_after[i]);
        free(ser_after), free(ser_sample), free(ser_eps), free_tensors(ser_init);
    }
    ff_unet_destroy(shape_model);
    ff_grid_destroy(one);
    for (int i = 0; i < ntensors; i++)
        free(params[i]), free(ser_grad[i]);
    free(params), free(ser_grad), free(x0);
    ff_ctx_destroy(self);
    ff_ctx_destroy(ctx);
    MPI_Finalize();
    return code;
}
