/* The planner's U-Net against a real training step (issue 51; docs/planner.md,
 * "The U-Net"): on every grid of 8 ranks (ff_plan_grids: 20; with `quick`,
 * the sanitizer build's, every fourth), each rank builds the tiny U-Net
 * (unet-tiny with attention also after each block at 4x4, attn_levels;
 * 8 images per step), runs one step (ff_unet_step: the DDPM
 * loss, the data-parallel all-reduces, the norm, AdamW), resets every
 * group's counters, runs one more and compares, for each group and
 * collective, the calls, bytes sent and bytes received with ff_plan_traffic
 * for its own coordinates. Exact: tolerance 0. Two variants: the run's
 * defaults (every overlap, every layer in the AG cache) and none of them
 * (no overlap, AG cache 0: the backward gathers again). The tiny U-Net
 * exercises every kind of traffic the planner lists: its GroupNorms of 8
 * channels in groups of 4 span ranks for Y = 4 and 8 (the statistics'
 * all-reduces), its up blocks' 1x1 skips move to layout Y (all-gathers
 * over X and Y), the timestep MLP and attention are linear layers.
 * Each run also compares the parameters and gradients the model holds
 * (ff_unet_params_count floats each) with the planner's mem_params and
 * mem_grads (ff_plan_evaluate), exactly.
 *
 * The nodes and the collective model are the run's, as in
 * tests/test_plan_vs_run.c (blocks of consecutive ranks). */
#define _POSIX_C_SOURCE 200809L
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fourfold/fourfold.h"
#include "fourfold/unet.h"
#include "test_util.h"

enum { BATCH = 8, MAX_GRIDS = 32 };

static const char *const coll_names[FF_NCOLL] = {"all-gather", "reduce-scatter", "all-reduce",
                                                 "p2p"};

static int world_rank;
static ff_coll_model run_model;
static int run_per_node;

static void die(ff_ctx *ctx, const char *what, int rc)
{
    fprintf(stderr, "%s failed (%d): %s\n", what, rc, ctx ? ff_ctx_error(ctx) : ff_strerror(rc));
    MPI_Abort(MPI_COMM_WORLD, 1);
}

/* One variant on one grid; returns the mismatches of this rank. */
static int run(ff_ctx *ctx, ff_dims shape, int defaults)
{
    ff_grid *grid;
    int rc = ff_grid_create(ctx, shape, &grid);
    if (rc)
        die(ctx, "ff_grid_create", rc);
    ff_plan_config pc;
    ff_plan_config_default(&pc);
    char err[256];
    if ((rc = ff_model_preset("unet-tiny", &pc.model, err, sizeof err)))
        die(NULL, err, rc);
    pc.model.unet.attn_levels = 1 << 1; /* attention after each block at 4x4 too */
    pc.coll = run_model;
    pc.machine.ranks_per_node = run_per_node;
    pc.batch = BATCH;
    pc.ranks = 8;
    pc.micro_batches = 1;
    ff_linear_opts o;
    ff_linear_opts_default(&o);
    if (!defaults) {
        o.oar = o.ors = o.oag = 0, o.ag_cache_layers = 0;
        pc.overlap = 0, pc.ag_cache = 0;
    }
    ff_unet *u;
    if ((rc = ff_unet_create(grid, &pc.model.unet, &o, BATCH, &u)))
        die(ctx, "ff_unet_create", rc);
    if ((rc = ff_unet_init(u, 7)))
        die(ctx, "ff_unet_init", rc);
    const ff_unet_config *c = &pc.model.unet;
    int64_t first, n;
    ff_unet_images(u, &first, &n);
    const int64_t per = c->image_size * c->image_size * c->img_channels;
    float *x0 = malloc((size_t)(n * per) * sizeof *x0);
    for (int64_t i = 0; i < n * per; i++) /* images in [-1, 1], the same on every grid */
        x0[i] = (float)(((first * per + i) * 37) % 101) / 50.0f - 1.0f;
    ff_adamw h;
    ff_adamw_default(&h);
    ff_unet_step_info info;
    if ((rc = ff_unet_step(u, x0, 1, 0, &h, &info)))
        die(ctx, "ff_unet_step", rc);
    for (int k = 0; k < FF_NGROUPS; k++)
        ff_group_counters_reset(ff_grid_group(grid, (ff_group_kind)k));
    if ((rc = ff_unet_step(u, x0, 1, 1, &h, &info)))
        die(ctx, "ff_unet_step", rc);

    int bad = 0;
    ff_plan_coll want[FF_PLAN_NGROUPS][FF_NCOLL];
    ff_dims me = ff_grid_coords(grid);
    rc = ff_plan_traffic(&pc, shape, me, want, err, sizeof err);
    CHECK(rc == FF_OK, "ff_plan_traffic: %s", err);
    for (int k = 0; k < FF_NGROUPS && rc == FF_OK; k++)
        for (int cl = 0; cl < FF_NCOLL; cl++) {
            ff_counters got = ff_group_counters(ff_grid_group(grid, (ff_group_kind)k), (ff_coll)cl);
            const ff_plan_coll *w = &want[k][cl];
            if (got.calls == w->calls && got.bytes_sent == w->bytes_sent &&
                got.bytes_recv == w->bytes_recv)
                continue;
            bad++;
            fprintf(stderr,
                    "FAIL %dx%dx%dx%d %s rank %d: %-5s %-14s predicted %llu calls %llu B sent "
                    "%llu B received; measured %llu calls %llu B sent %llu B received\n",
                    shape.x, shape.y, shape.z, shape.d, defaults ? "defaults" : "none", world_rank,
                    ff_group_kind_name((ff_group_kind)k), coll_names[cl],
                    (unsigned long long)w->calls, (unsigned long long)w->bytes_sent,
                    (unsigned long long)w->bytes_recv, (unsigned long long)got.calls,
                    (unsigned long long)got.bytes_sent, (unsigned long long)got.bytes_recv);
        }
    ff_plan_result pr;
    rc = ff_plan_evaluate(&pc, shape, &pr, err, sizeof err);
    const double held = 4.0 * (double)ff_unet_params_count(u);
    if (rc != FF_OK || pr.rejected || pr.mem_params != held || pr.mem_grads != held) {
        bad++;
        fprintf(stderr,
                "FAIL %dx%dx%dx%d rank %d: planned parameters %.0f B, gradients %.0f B (%s); "
                "the model holds %.0f B each\n",
                shape.x, shape.y, shape.z, shape.d, world_rank, pr.mem_params, pr.mem_grads,
                rc != FF_OK   ? err
                : pr.rejected ? pr.reason
                              : "accepted",
                held);
    }
    free(x0);
    ff_unet_destroy(u);
    ff_grid_destroy(grid);
    return bad;
}

int main(int argc, char **argv)
{
    int provided, size;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (size != 8) {
        if (world_rank == 0)
            fprintf(stderr, "test_plan_vs_run_unet: run under mpirun -np 8 (got %d)\n", size);
        MPI_Finalize();
        return 2;
    }
    const int quick = argc > 1 && !strcmp(argv[1], "quick");
    unsetenv("FF_ALGO"); /* the planner predicts the automatic choice, default rule */
    unsetenv("FF_STRICT_VOLUME");
    ff_ctx *ctx;
    int rc = ff_ctx_create(&ctx, MPI_COMM_WORLD, NULL);
    if (rc)
        die(ctx, "ff_ctx_create", rc);
    ff_ctx_coll_model(ctx, &run_model);
    run_per_node = size / ff_ctx_nodes(ctx);
    ff_dims grids[MAX_GRIDS];
    int n_grids = (int)ff_plan_grids(size, grids, MAX_GRIDS);
    CHECK(n_grids == 20, "ff_plan_grids(8): %d grids, want 20", n_grids);
    int runs = 0, bad_runs = 0;
    for (int i = 0; i < n_grids; i++) {
        if (quick && i % 4)
            continue;
        for (int v = 0; v < 2; v++) {
            int bad = run(ctx, grids[i], v == 0), any = 0;
            MPI_Allreduce(&bad, &any, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
            runs++;
            bad_runs += any > 0;
            if (world_rank == 0)
                printf("%dx%dx%dx%d %-8s %s\n", grids[i].x, grids[i].y, grids[i].z, grids[i].d,
                       v == 0 ? "defaults" : "none", any ? "DIFFERS" : "exact");
        }
    }
    test_failures += bad_runs;
    if (world_rank == 0)
        printf("%d of %d runs exact\n", runs - bad_runs, runs);
    ff_ctx_destroy(ctx);
    int all = 0;
    MPI_Allreduce(&test_failures, &all, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    MPI_Finalize();
    return all ? 1 : 0;
}
