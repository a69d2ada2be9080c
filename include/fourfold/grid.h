/* The 4D process grid (docs/design.md §1).
 *
 *     rank = x + Gx * (y + Gy * (z + Gz * d))
 *
 * X is fastest (X groups are contiguous ranks, so they share a node), D is
 * outermost. The grid owns one communicator per group:
 *
 *   X   ranks that share (y, z, d)   - all-reduce of transposed layers' outputs
 *   Y   ranks that share (x, z, d)   - all-reduce of normal layers' outputs
 *   Z   ranks that share (x, y, d)   - all-gather / reduce-scatter of weights
 *   D   ranks that share (x, y, z)   - data-parallel gradient all-reduce
 *   ZD  ranks that share (x, y)      - non-Z-sharded gradients, loss; rank in
 *                                      ZD is the row-block index q = z + Gz*d
 *   TP  ranks that share d           - the whole tensor-parallel slice; rank in
 *                                      TP is x + Gx*(y + Gy*z)
 *   WORLD every rank of the context
 *   STAGE the ranks of this rank's pipeline stage (= WORLD without stages)
 *   PIPE  ranks that share (x, y, z, d) across stages; rank in PIPE is the
 *         stage (size 1 without stages)
 *
 * Pipeline stages (docs/pipeline.md) are a fifth, outermost dimension: P
 * copies of the 4D grid, stage s holding ranks [s*G, (s+1)*G), G = Gx*Gy*Gz*Gd,
 *
 *     rank = x + Gx * (y + Gy * (z + Gz * (d + Gd * s)))
 *
 * so the groups X..TP lie inside a stage and a stage fills whole nodes when
 * G is a multiple of the ranks per node: only the pipeline's point-to-point
 * messages, the smallest traffic, cross a stage boundary.
 */
#ifndef FOURFOLD_GRID_H
#define FOURFOLD_GRID_H

#include <stddef.h>

#include "fourfold/ctx.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Four sizes or four coordinates, in grid order. */
typedef struct {
    int x, y, z, d;
} ff_dims;

typedef enum {
    FF_GROUP_X = 0,
    FF_GROUP_Y,
    FF_GROUP_Z,
    FF_GROUP_D,
    FF_GROUP_ZD,
    FF_GROUP_TP,
    FF_GROUP_WORLD,
    FF_GROUP_STAGE,
    FF_GROUP_PIPE,
    FF_NGROUPS
} ff_group_kind;

typedef struct ff_grid ff_grid;
typedef struct ff_group ff_group;

/* Parses a grid: "Gx x Gy x Gz x Gd" written as e.g. "2x2x2x1", or a named preset:
 *   serial        1x1x1x1
 *   data          1x1x1xG         pure data parallelism
 *   fsdp          1x1xGx1         FSDP / ZeRO-3
 *   hsdp[:Z]      1x1xZx(G/Z)     hybrid sharded DP; Z defaults to ranks_per_node
 *   megatron[:X]  Xx1x1x(G/X)     Megatron-style 1D tensor parallelism (with
 *                                 alternating layers); X defaults to ranks_per_node
 * `world_size` is the number of ranks the grid must cover; `ranks_per_node`
 * (>= 1) is used only by the presets. Pure: no MPI. On error returns FF_EGRID
 * and writes one sentence naming the problem into err. */
int ff_grid_parse(const char *spec, int world_size, int ranks_per_node, ff_dims *out, char *err,
                  size_t err_len);
/* The same for a job of `job` ranks split into `stages` pipeline stages:
 * the grid (and a preset's sizes) covers one stage, job / stages ranks;
 * stages that do not divide the job are refused, and the messages speak of
 * a stage's ranks. stages = 1 is ff_grid_parse. */
int ff_grid_parse_staged(const char *spec, int job, int stages, int ranks_per_node, ff_dims *out,
                         char *err, size_t err_len);

/* Creates the grid and its communicators on the context's communicator
 * (collective). Checks the shape first, identically on every rank, so a bad
 * shape fails on all ranks before any communicator is built; then builds
 * each group's node layout and agrees on it, so a rank that cannot (out of
 * memory) fails the call on every rank. */
int ff_grid_create(ff_ctx *ctx, ff_dims shape, ff_grid **out);
/* The same with `stages` pipeline stages (>= 1; 1 is ff_grid_create): the
 * job must have Gx*Gy*Gz*Gd*stages ranks. */
int ff_grid_create_staged(ff_ctx *ctx, ff_dims shape, int stages, ff_grid **out);
void ff_grid_destroy(ff_grid *grid);

ff_dims ff_grid_shape(const ff_grid *grid);
/* This rank's coordinates in its stage's 4D grid. */
ff_dims ff_grid_coords(const ff_grid *grid);
ff_ctx *ff_grid_ctx(const ff_grid *grid);
/* Pipeline stages (1 without) and this rank's stage (0-based). */
int ff_grid_stages(const ff_grid *grid);
int ff_grid_stage(const ff_grid *grid);
ff_group *ff_grid_group(const ff_grid *grid, ff_group_kind kind);

/* Rank <-> coordinates for a given shape (pure arithmetic). */
int ff_grid_rank_of(ff_dims shape, ff_dims coords);
ff_dims ff_grid_coords_of(ff_dims shape, int rank);
int ff_dims_product(ff_dims dims);

/* Name of a group kind ("X", "ZD", ...). */
const char *ff_group_kind_name(ff_group_kind kind);

/* A one-line description: "2x2x2x1 (Gx=2 Gy=2 Gz=2 Gd=1, 8 ranks)", with
 * stages "2x1x1x1 x 4 stages (Gx=2 Gy=1 Gz=1 Gd=1, 2 ranks per stage, 8 ranks)". */
void ff_grid_describe(const ff_grid *grid, char *buf, size_t len);

/* Size of a group, this rank's index in it, and its MPI communicator. */
int ff_group_size(const ff_group *group);
int ff_group_rank(const ff_group *group);
MPI_Comm ff_group_comm(const ff_group *group);
const char *ff_group_name(const ff_group *group);

/* A group on an arbitrary communicator (duplicated), e.g. for benchmarks.
 * Collective over comm; fails on every member if one cannot build the
 * group's node layout. */
int ff_group_create(ff_ctx *ctx, MPI_Comm comm, const char *name, ff_group **out);
void ff_group_destroy(ff_group *group);

#ifdef __cplusplus
}
#endif
#endif
