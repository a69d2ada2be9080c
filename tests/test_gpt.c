/* The GPT model in 4D against its serial self (issue 4).
 *
 *   test_gpt CONFIG GRID... | all   serial equality on the grids
 *   test_gpt --dump DIR              files for the PyTorch oracle (1 rank)
 *
 * Serial equality: rank 0 alone runs the 1x1x1x1 program (the same code on
 * MPI_COMM_SELF); then every grid runs the same three AdamW steps of two
 * micro-batches each, in four variants (activation checkpointing on/off x
 * every overlap on/off, the AG cache partial under checkpointing). Compared
 * on rank 0, gathered to canonical layout:
 *  - the loss of each step: relative error <= 1e-5 (issue 4);
 *  - every gradient tensor of step 0 and every parameter tensor after the
 *    three steps: max|a - ref| / max|ref| <= the bound derived below;
 *  - the four variants of one grid: bitwise identical (overlaps and
 *    recomputation change when things happen, never what is computed);
 *  - padded vocabulary rows: exactly zero.
 *
 * The bound. A grid changes only the order of floating-point sums: dot
 * products split over X or Y and finished by all-reduces, sums over token
 * rows split over Z and D, LayerNorm and softmax statistics. Two orders of a
 * K-term sum differ by at most 2 gamma_K sum|terms| (Higham §3.1, gamma_K =
 * K u / (1 - K u), u = 2^-24); with K at most K_max (the longest sum: the
 * rows of the whole step, 2 micro-batches x B x T, or 4C) and at most
 * depth = 4L + 4 such reductions in sequence between the input and any
 * gradient (4 products per block, the embedding, LayerNorms, the head and the
 * loss), and without amplification by the intervening functions, a tensor's
 * error relative to its largest element is at most
 *      tol = 2 * depth * gamma_{K_max}.
 * The global gradient norm is held to the same bound.
 *
 * The parameters are compared by their change over the steps:
 * max|theta - theta_ref| / max|theta_ref - theta_init| per tensor. With
 * AdamW's usual eps = 1e-8 the update m/(sqrt(v) + eps) divides each
 * gradient element by its own size, so a rounding difference of 1e-6 of the
 * largest gradient becomes a difference of order one in the update of an
 * element whose gradient is near zero: that is Adam's sensitivity, not the
 * grid's. These steps therefore use eps = 1, where the update is a Lipschitz
 * function of the gradient (d update / d m <= 1) and the same bound holds,
 * plus the rounding of each update into the stored parameter (at most
 * u |theta| per step and run: 2 STEPS u max|theta| / max|theta - theta_init|
 * for a tensor); the code path is the one every run takes. (The PyTorch oracle test runs
 * AdamW with eps = 1e-8 for ten steps.) */
#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "fourfold/fourfold.h"
#include "fourfold/gpt.h"
#include "fourfold/rng.h"
#include "test_util.h"

enum { STEPS = 3, MICRO = 2, VARIANTS = 4, MAX_GRIDS = 64 };

typedef struct {
    const char *name;
    ff_gpt_config cfg;
    int B, T; /* micro-batch */
} test_config;

static const test_config configs[] = {
    /* every grid of 8: NH and C divisible by 8, Vp = 512 by 8 */
    {"small8", {2, 64, 8, 500, 0, 32}, 8, 32},
    /* grids with a 3: NH = 6, C = 96, Vp = 384 divisible by 3; B = 6 */
    {"small6", {2, 96, 6, 380, 0, 32}, 6, 32},
    /* the oracle's model (1 rank) */
    {"oracle", {2, 64, 4, 500, 0, 32}, 4, 32},
};

typedef struct {
    float loss[STEPS], norm;
    float *grads, *params, *init; /* canonical, rank 0 only */
} result;

static const char *variant_name(int v)
{
    static const char *const names[VARIANTS] = {
        "overlaps on, no checkpointing", "overlaps on, checkpointing (AG cache 2 layers)",
        "overlaps off, no checkpointing", "overlaps off, checkpointing"};
    return names[v];
}

static void variant_opts(int v, ff_gpt_opts *o)
{
    ff_gpt_opts_default(o);
    o->checkpoint = v & 1;
    if (v == 1)
        o->linear.ag_cache_layers = 2;
    if (v >= 2) {
        o->linear.oar = o->linear.ors = o->linear.oag = 0;
        o->linear.ag_cache_layers = 0;
        o->dp_overlap = 0;
    }
}

/* Tokens of sequence s (of the whole run), position t: a fixed function of
 * (s, t), so every grid reads the same batch. Targets are the next token. */
static int32_t token_at(const test_config *tc, int64_t s, int64_t t)
{
    return (int32_t)(ff_rng_uniform(7, 99, (uint64_t)(s * (tc->T + 1) + t)) * tc->cfg.V);
}

/* This rank's tokens for `steps` steps of `micro` micro-batches. */
static void local_batch(const test_config *tc, ff_gpt *g, int steps, int micro, int32_t **tok,
                        int32_t **tgt)
{
    int first, count;
    ff_gpt_local_sequences(g, &first, &count);
    size_t n = (size_t)steps * micro * count * tc->T;
    *tok = malloc(n * sizeof(int32_t));
    *tgt = malloc(n * sizeof(int32_t));
    size_t k = 0;
    for (int u = 0; u < steps * micro; u++)
        for (int s = 0; s < count; s++)
            for (int t = 0; t < tc->T; t++, k++) {
                int64_t seq = (int64_t)u * tc->B + first + s;
                (*tok)[k] = token_at(tc, seq, t);
                (*tgt)[k] = token_at(tc, seq, t + 1);
            }
}

static void hparams(ff_adamw *h, int steps)
{
    ff_adamw_default(h);
    h->lr = 3e-3f;
    h->warmup = steps < 3 ? 1 : 3;
    h->steps = steps;
}

/* Runs the steps on `grid`, gathering step 0's gradients and the final
 * parameters to rank 0 of the grid's world. */
static int run(ff_grid *grid, const test_config *tc, const ff_gpt_opts *o, result *r)
{
    ff_ctx *ctx = ff_grid_ctx(grid);
    ff_gpt *g;
    int rc = ff_gpt_create(grid, &tc->cfg, o, tc->B, tc->T, &g);
    if (rc)
        return rc;
    int root = ff_ctx_rank(ctx) == 0;
    size_t n = ff_gpt_canonical_size(g);
    r->grads = root ? calloc(n, sizeof(float)) : NULL;
    r->params = root ? calloc(n, sizeof(float)) : NULL;
    r->init = root ? calloc(n, sizeof(float)) : NULL;
    int32_t *tok, *tgt;
    local_batch(tc, g, STEPS, MICRO, &tok, &tgt);
    int first, count;
    ff_gpt_local_sequences(g, &first, &count);
    const size_t per_step = (size_t)MICRO * count * tc->T;
    ff_adamw h;
    hparams(&h, STEPS);
    h.eps = 1.0f; /* see the header */
    rc = ff_gpt_init(g, 1234);
    if (rc == FF_OK)
        rc = ff_gpt_gather(g, FF_GPT_PARAMS, r->init, 0);
    /* step 0 by hand, to see the gradients before the update */
    if (rc == FF_OK)
        rc = ff_gpt_zero_grad(g);
    for (int u = 0; u < MICRO && rc == FF_OK; u++)
        rc = ff_gpt_forward_backward(g, tok + (size_t)u * count * tc->T,
                                     tgt + (size_t)u * count * tc->T, u, MICRO);
    float norm = 0;
    if (rc == FF_OK)
        rc = ff_gpt_finish_grads(g, &r->loss[0]);
    if (rc == FF_OK)
        rc = ff_gpt_gather(g, FF_GPT_GRADS, r->grads, 0);
    if (rc == FF_OK)
        rc = ff_gpt_grad_norm(g, &norm);
    r->norm = norm;
    if (rc == FF_OK) {
        float coef = h.clip / (norm + 1e-6f);
        rc = ff_gpt_adamw_update(g, &h, 0, coef < 1.0f ? coef : 1.0f);
    }
    for (int s = 1; s < STEPS && rc == FF_OK; s++) {
        ff_gpt_step_info info;
        rc = ff_gpt_step(g, tok + s * per_step, tgt + s * per_step, MICRO, &h, s, &info);
        r->loss[s] = info.loss;
    }
    if (rc == FF_OK)
        rc = ff_gpt_gather(g, FF_GPT_PARAMS, r->params, 0);
    free(tok);
    free(tgt);
    ff_gpt_destroy(g);
    return rc;
}

static double tol_bound(const test_config *tc)
{
    const double u = ldexp(1.0, -24);
    double kmax = (double)MICRO * tc->B * tc->T;
    if (4.0 * tc->cfg.C > kmax)
        kmax = 4.0 * tc->cfg.C;
    double gamma = kmax * u / (1 - kmax * u), depth = 4.0 * tc->cfg.L + 4;
    return 2 * depth * gamma;
}

/* Per tensor max|a-b| / max|b - base| (base NULL: zero) against its bound;
 * returns the worst ratio of error to bound. */
static double compare_tensors(ff_gpt *shape, const float *a, const float *b, const float *base,
                              const char *what, double tol, int verbose)
{
    double worst = 0;
    size_t off = 0;
    for (int i = 0; i < FF_GPT_NTENSORS; i++) {
        size_t n = ff_gpt_tensor_size(shape, i);
        double maxref = 0, maxdiff = 0;
        for (size_t e = 0; e < n; e++) {
            double d = fabs((double)a[off + e] - b[off + e]);
            if (!(d <= maxdiff))
                maxdiff = d; /* NaN propagates */
            double ref = fabs((double)b[off + e] - (base ? base[off + e] : 0.0));
            if (ref > maxref)
                maxref = ref;
        }
        double rel = maxref > 0 ? maxdiff / maxref : maxdiff, tol_t = tol;
        if (base) { /* the parameter's own rounding, see the header */
            double maxp = 0;
            for (size_t e = 0; e < n; e++)
                maxp = fabs(b[off + e]) > maxp ? fabs(b[off + e]) : maxp;
            if (maxref > 0)
                tol_t += 2.0 * STEPS * ldexp(1.0, -24) * maxp / maxref;
        }
        if (!(rel / tol_t <= worst))
            worst = rel / tol_t;
        CHECK(rel <= tol_t, "%s %s: rel max error %.3e > %.3e", what, ff_gpt_tensor_name(i), rel,
              tol_t);
        if (verbose)
            printf("    %-8s %-9s rel max err %.2e\n", what, ff_gpt_tensor_name(i), rel);
        off += n;
    }
    return worst;
}

static void check_padding(ff_gpt *shape, const float *canon, const char *what)
{
    ff_gpt_config c = ff_gpt_get_config(shape);
    size_t bad = 0;
    for (size_t e = (size_t)c.V * c.C; e < (size_t)c.Vp * c.C; e++)
        bad += canon[e] != 0.0f;
    CHECK(bad == 0, "%s: %zu padded wte elements are not zero", what, bad);
}

static ff_ctx *serial_ctx;
static ff_grid *serial_grid;

static int run_serial(const test_config *tc, result *ref, ff_gpt **shape_out)
{
    ff_dims one = {1, 1, 1, 1};
    int rc = ff_ctx_create(&serial_ctx, MPI_COMM_SELF, NULL);
    ff_ctx *ctx = serial_ctx;
    ff_grid *grid = NULL;
    if (rc)
        return rc;
    if ((rc = ff_grid_create(ctx, one, &serial_grid)) == FF_OK) {
        grid = serial_grid;
        ff_gpt_opts o;
        variant_opts(0, &o);
        rc = run(grid, tc, &o, ref);
        if (rc)
            fprintf(stderr, "serial run: %s\n", ff_ctx_error(ctx));
        /* a model kept for its shape (tensor sizes) */
        if (rc == FF_OK)
            rc = ff_gpt_create(grid, &tc->cfg, &o, tc->B, tc->T, shape_out);
    }
    return rc;
}

static void run_grid(ff_ctx *ctx, ff_dims shape, const test_config *tc, const result *ref,
                     ff_gpt *tshape, double tol, double *worst)
{
    int rank = ff_ctx_rank(ctx);
    char desc[96];
    ff_grid *grid;
    if (ff_grid_create(ctx, shape, &grid) != FF_OK) {
        CHECK(0, "grid %dx%dx%dx%d: %s", shape.x, shape.y, shape.z, shape.d, ff_ctx_error(ctx));
        return;
    }
    ff_grid_describe(grid, desc, sizeof desc);
    result first = {{0}, 0, NULL, NULL, NULL};
    for (int v = 0; v < VARIANTS; v++) {
        ff_gpt_opts o;
        variant_opts(v, &o);
        result r = {{0}, 0, NULL, NULL, NULL};
        int rc = run(grid, tc, &o, &r);
        CHECK(rc == FF_OK, "%s, %s: %s", desc, variant_name(v), ff_ctx_error(ctx));
        if (rc == FF_OK && rank == 0) {
            double lw = 0;
            for (int s = 0; s < STEPS; s++) {
                double e = fabs((double)r.loss[s] - ref->loss[s]) / fabs((double)ref->loss[s]);
                lw = e > lw ? e : lw;
                CHECK(e <= 1e-5, "%s, %s: step %d loss %.8f, serial %.8f (rel %.2e > 1e-5)", desc,
                      variant_name(v), s, r.loss[s], ref->loss[s], e);
            }
            if (v == 0) {
                double gw = compare_tensors(tshape, r.grads, ref->grads, NULL, "gradient", tol, 0);
                double pw =
                    compare_tensors(tshape, r.params, ref->params, ref->init, "update", tol, 0);
                double ne = fabs((double)r.norm - ref->norm) / ref->norm;
                CHECK(ne <= tol, "%s: gradient norm %.8f, serial %.8f (rel %.2e > %.2e)", desc,
                      r.norm, ref->norm, ne, tol);
                gw = ne / tol > gw ? ne / tol : gw;
                check_padding(tshape, r.grads, "gradients");
                check_padding(tshape, r.params, "parameters");
                printf("  %-40s loss rel err %.1e (tol 1e-5); error/bound: gradients and norm "
                       "%.3f, updates over %d steps %.3f\n",
                       desc, lw, gw, STEPS, pw);
                worst[0] = lw > worst[0] ? lw : worst[0];
                worst[1] = gw > worst[1] ? gw : worst[1];
                worst[2] = pw > worst[2] ? pw : worst[2];
                first = r;
                continue;
            }
            size_t n = ff_gpt_canonical_size(tshape);
            int same = first.grads && memcmp(r.grads, first.grads, n * sizeof(float)) == 0 &&
                       memcmp(r.params, first.params, n * sizeof(float)) == 0 &&
                       memcmp(r.loss, first.loss, sizeof r.loss) == 0;
            CHECK(same, "%s: %s differs from '%s' (must be bitwise identical)", desc,
                  variant_name(v), variant_name(0));
        }
        free(r.grads);
        free(r.params);
        free(r.init);
    }
    if (rank == 0)
        printf("  %-40s %d variants bitwise identical\n", "", VARIANTS);
    free(first.grads);
    free(first.params);
    free(first.init);
    ff_grid_destroy(grid);
}

/* Bad input is refused on every rank, with one message, and nothing hangs:
 * a shape whose heads do not divide over X, and a token outside the
 * vocabulary on one rank only. */
static void check_refusals(ff_ctx *ctx, const test_config *tc, int world)
{
    ff_grid *grid;
    ff_dims all_x = {world, 1, 1, 1};
    if (ff_grid_create(ctx, all_x, &grid) != FF_OK) {
        CHECK(0, "grid %dx1x1x1: %s", world, ff_ctx_error(ctx));
        return;
    }
    ff_gpt_config bad = tc->cfg;
    bad.NH = 4; /* divides C, not Gx = 6 or 8 */
    ff_gpt *g = NULL;
    int rc = ff_gpt_create(grid, &bad, NULL, tc->B, tc->T, &g);
    CHECK(rc == FF_EDIVIDE && strstr(ff_ctx_error(ctx), "NH=4"), "NH=4 on %dx1x1x1: got %s '%s'",
          world, ff_strerror(rc), ff_ctx_error(ctx));
    if (ff_ctx_rank(ctx) == 0)
        printf("refused on every rank: %s\n", ff_ctx_error(ctx));
    if (ff_gpt_create(grid, &tc->cfg, NULL, tc->B, tc->T, &g) == FF_OK) {
        int32_t *tok, *tgt;
        local_batch(tc, g, 1, 1, &tok, &tgt);
        if (ff_ctx_rank(ctx) == world - 1)
            tok[3] = tc->cfg.V; /* one bad token on the last rank */
        rc = ff_gpt_forward_backward(g, tok, tgt, 0, 1);
        CHECK(rc == FF_EINVAL, "a bad token on rank %d: got %s on rank %d", world - 1,
              ff_strerror(rc), ff_ctx_rank(ctx));
        if (ff_ctx_rank(ctx) == 0)
            printf("refused on every rank: %s\n", ff_ctx_error(ctx));
        free(tok);
        free(tgt);
        ff_gpt_destroy(g);
    }
    ff_grid_destroy(grid);
}

/* ---- the oracle's files ---------------------------------------------------------- */

static int write_raw(const char *dir, const char *name, const void *p, size_t bytes)
{
    char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    int ok = f && fwrite(p, 1, bytes, f) == bytes;
    if (f)
        fclose(f);
    return ok ? 0 : -1;
}

enum { ORACLE_STEPS = 10 };

static int dump(const char *dir)
{
    const test_config *tc = &configs[2];
    ff_ctx *ctx;
    ff_grid *grid;
    ff_dims one = {1, 1, 1, 1};
    if (ff_ctx_create(&ctx, MPI_COMM_WORLD, NULL) || ff_grid_create(ctx, one, &grid)) {
        fprintf(stderr, "dump: needs 1 rank\n");
        return 1;
    }
    ff_gpt *g;
    int rc = ff_gpt_create(grid, &tc->cfg, NULL, tc->B, tc->T, &g);
    if (rc == FF_OK)
        rc = ff_gpt_init(g, 42);
    char path[512];
    mkdir(dir, 0755);
    snprintf(path, sizeof path, "%s/model.bin", dir);
    if (rc == FF_OK)
        rc = ff_gpt_save(g, FF_GPT_PARAMS, path);
    int32_t *tok, *tgt;
    local_batch(tc, g, ORACLE_STEPS, 1, &tok, &tgt);
    const size_t n_tok = (size_t)ORACLE_STEPS * tc->B * tc->T;
    int32_t hdr[256] = {20241122, 1, ORACLE_STEPS * tc->B, tc->T};
    size_t hb = sizeof hdr, tb = n_tok * sizeof(int32_t);
    char *batch = malloc(hb + 2 * tb);
    memcpy(batch, hdr, hb);
    memcpy(batch + hb, tok, tb);
    memcpy(batch + hb + tb, tgt, tb);
    if (rc == FF_OK && write_raw(dir, "batch.bin", batch, hb + 2 * tb))
        rc = FF_EIO;
    free(batch);
    /* logits and loss of step 0's batch, before any update */
    float loss0 = 0, losses[ORACLE_STEPS];
    if (rc == FF_OK)
        rc = ff_gpt_eval(g, tok, tgt, &loss0);
    if (rc == FF_OK) {
        int64_t rows, cols;
        const float *lg = ff_gpt_logits(g, &rows, &cols);
        if (write_raw(dir, "ff_logits.bin", lg, (size_t)(rows * cols) * sizeof(float)))
            rc = FF_EIO;
    }
    ff_adamw h;
    hparams(&h, ORACLE_STEPS);
    for (int s = 0; s < ORACLE_STEPS && rc == FF_OK; s++) {
        size_t off = (size_t)s * tc->B * tc->T;
        if (s == 0) { /* the gradients of step 0, before clipping */
            float loss, norm;
            rc = ff_gpt_zero_grad(g);
            if (rc == FF_OK)
                rc = ff_gpt_forward_backward(g, tok, tgt, 0, 1);
            if (rc == FF_OK)
                rc = ff_gpt_finish_grads(g, &loss);
            snprintf(path, sizeof path, "%s/ff_grads.bin", dir);
            if (rc == FF_OK)
                rc = ff_gpt_save(g, FF_GPT_GRADS, path);
            if (rc == FF_OK)
                rc = ff_gpt_grad_norm(g, &norm);
            losses[0] = loss;
            if (rc == FF_OK) {
                float coef = h.clip / (norm + 1e-6f);
                rc = ff_gpt_adamw_update(g, &h, 0, coef < 1.0f ? coef : 1.0f);
            }
            continue;
        }
        ff_gpt_step_info info;
        rc = ff_gpt_step(g, tok + off, tgt + off, 1, &h, s, &info);
        losses[s] = info.loss;
    }
    if (rc == FF_OK) {
        snprintf(path, sizeof path, "%s/ff.json", dir);
        FILE *f = fopen(path, "w");
        if (!f) {
            rc = FF_EIO;
        } else {
            fprintf(f, "{\"loss\": %.9g, \"B\": %d, \"T\": %d, \"losses\": [", loss0, tc->B, tc->T);
            for (int s = 0; s < ORACLE_STEPS; s++)
                fprintf(f, "%s%.9g", s ? ", " : "", losses[s]);
            fprintf(f, "]}\n");
            fclose(f);
        }
    }
    if (rc)
        fprintf(stderr, "dump: %s (%s)\n", ff_ctx_error(ctx), ff_strerror(rc));
    else
        printf("dump: model L=%d C=%d NH=%d V=%d, B=%d T=%d, %d steps written to %s; loss %.6f\n",
               tc->cfg.L, tc->cfg.C, tc->cfg.NH, tc->cfg.V, tc->B, tc->T, ORACLE_STEPS, dir, loss0);
    free(tok);
    free(tgt);
    ff_gpt_destroy(g);
    ff_grid_destroy(grid);
    ff_ctx_destroy(ctx);
    return rc ? 1 : 0;
}

int main(int argc, char **argv)
{
    int provided;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
    int world_size, rank;
    MPI_Comm_size(MPI_COMM_WORLD, &world_size);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    if (argc >= 3 && strcmp(argv[1], "--dump") == 0) {
        int code = dump(argv[2]);
        MPI_Finalize();
        return code;
    }
    const test_config *tc = NULL;
    for (size_t i = 0; argc >= 2 && i < sizeof configs / sizeof *configs; i++)
        if (strcmp(argv[1], configs[i].name) == 0)
            tc = &configs[i];
    if (!tc || argc < 3) {
        if (rank == 0)
            fprintf(stderr, "usage: test_gpt small8|small6 GRID...|all, or --dump DIR\n");
        MPI_Finalize();
        return 2;
    }
    double tol = tol_bound(tc);
    result ref = {{0}, 0, NULL, NULL, NULL};
    ff_gpt *tshape = NULL;
    int rc = FF_OK;
    if (rank == 0) {
        printf("model %s: L=%d C=%d NH=%d V=%d, micro-batch B=%d T=%d, %d micro-batches, %d "
               "AdamW steps; tolerances: loss 1e-5 relative, tensors %.2e (max|err|/max|ref|)\n",
               tc->name, tc->cfg.L, tc->cfg.C, tc->cfg.NH, tc->cfg.V, tc->B, tc->T, MICRO, STEPS,
               tol);
        rc = run_serial(tc, &ref, &tshape);
        printf("serial 1x1x1x1: losses %.6f %.6f %.6f\n", ref.loss[0], ref.loss[1], ref.loss[2]);
    }
    MPI_Bcast(&rc, 1, MPI_INT, 0, MPI_COMM_WORLD);
    if (rc) {
        CHECK(0, "the serial run failed");
        int code = test_finish("gpt");
        MPI_Finalize();
        return code;
    }
    ff_ctx *ctx;
    ff_ctx_create(&ctx, MPI_COMM_WORLD, NULL);
    double worst[3] = {0, 0, 0};
    int n_run = 0;
    if (strcmp(argv[2], "all") == 0) {
        ff_dims grids[MAX_GRIDS];
        int ng = test_all_grids(world_size, grids, MAX_GRIDS);
        for (int i = 0; i < ng; i++, n_run++)
            run_grid(ctx, grids[i], tc, &ref, tshape, tol, worst);
    } else {
        for (int i = 2; i < argc; i++, n_run++) {
            ff_dims s;
            char err[256];
            if (ff_grid_parse(argv[i], world_size, world_size, &s, err, sizeof err) != FF_OK) {
                CHECK(0, "%s", err);
                continue;
            }
            run_grid(ctx, s, tc, &ref, tshape, tol, worst);
        }
    }
    check_refusals(ctx, tc, world_size);
    if (rank == 0)
        printf("%d grids; worst: loss %.2e (tol 1e-5); error/bound: gradients %.3f, updates "
               "%.3f (bound %.2e per tensor, plus the parameters' rounding for updates)\n",
               n_run, worst[0], worst[1], worst[2], tol);
    free(ref.grads);
    free(ref.params);
    free(ref.init);
    ff_gpt_destroy(tshape);
    ff_grid_destroy(serial_grid);
    ff_ctx_destroy(serial_ctx);
    ff_ctx_destroy(ctx);
    int code = test_finish("gpt");
    MPI_Finalize();
    return code;
}
