/* Coordinates and group membership for every grid of the job's rank count
 * (CTest runs it on 1..8, 12 and 16 ranks), and for every split of the job
 * into P pipeline stages times a grid of size/P ranks. Each group's
 * members, gathered through its own communicator, must be exactly the
 * ranks docs/design.md §1 says, in the order it says. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "test_util.h"

/* The world rank of member i of group `kind` that contains coordinates c
 * of stage st (G ranks per stage). */
static int expected_member(ff_dims s, ff_dims c, int st, ff_group_kind kind, int i)
{
    const int G = ff_dims_product(s);
    ff_dims m = c;
    switch (kind) {
    case FF_GROUP_X: m.x = i; break;
    case FF_GROUP_Y: m.y = i; break;
    case FF_GROUP_Z: m.z = i; break;
    case FF_GROUP_D: m.d = i; break;
    case FF_GROUP_ZD: m.z = i % s.z, m.d = i / s.z; break;
    case FF_GROUP_TP: m.x = i % s.x, m.y = (i / s.x) % s.y, m.z = i / (s.x * s.y); break;
    case FF_GROUP_STAGE: return st * G + i;
    case FF_GROUP_PIPE: return i * G + ff_grid_rank_of(s, c);
    default: return i; /* WORLD */
    }
    return st * G + ff_grid_rank_of(s, m);
}

static int expected_size(ff_dims s, int P, ff_group_kind kind)
{
    switch (kind) {
    case FF_GROUP_X: return s.x;
    case FF_GROUP_Y: return s.y;
    case FF_GROUP_Z: return s.z;
    case FF_GROUP_D: return s.d;
    case FF_GROUP_ZD: return s.z * s.d;
    case FF_GROUP_TP: return s.x * s.y * s.z;
    case FF_GROUP_STAGE: return ff_dims_product(s);
    case FF_GROUP_PIPE: return P;
    default: return ff_dims_product(s) * P;
    }
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    int rank, size;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    ff_ctx *ctx;
    int rc = ff_ctx_create(&ctx, MPI_COMM_WORLD, NULL);
    CHECK(rc == FF_OK, "ff_ctx_create: %s", ff_ctx_error(ctx));

    ff_dims grids[128];
    int *members = malloc((size_t)size * sizeof(int)), checked = 0;
    for (int P = 1; P <= size; P++) {
        if (size % P)
            continue;
        int n = test_all_grids(size / P, grids, 128);
        for (int gi = 0; gi < n; gi++, checked++) {
            ff_dims s = grids[gi];
            const int G = ff_dims_product(s);
            ff_grid *grid;
            rc = P == 1 ? ff_grid_create(ctx, s, &grid) : ff_grid_create_staged(ctx, s, P, &grid);
            CHECK(rc == FF_OK, "grid %dx%dx%dx%d x %d: %s", s.x, s.y, s.z, s.d, P,
                  ff_ctx_error(ctx));
            if (rc != FF_OK)
                continue;
            ff_dims c = ff_grid_coords(grid), sh = ff_grid_shape(grid);
            int st = ff_grid_stage(grid);
            CHECK(sh.x == s.x && sh.y == s.y && sh.z == s.z && sh.d == s.d, "shape");
            CHECK(ff_grid_stages(grid) == P && st == rank / G, "stages %d, stage %d",
                  ff_grid_stages(grid), st);
            CHECK(st * G + ff_grid_rank_of(s, c) == rank,
                  "grid %dx%dx%dx%d x %d: rank %d has coords %d,%d,%d,%d in stage %d", s.x, s.y,
                  s.z, s.d, P, rank, c.x, c.y, c.z, c.d, st);
            for (int k = 0; k < FF_NGROUPS; k++) {
                ff_group *g = ff_grid_group(grid, (ff_group_kind)k);
                int p = ff_group_size(g);
                CHECK(p == expected_size(s, P, (ff_group_kind)k),
                      "grid %dx%dx%dx%d x %d group %s size %d", s.x, s.y, s.z, s.d, P,
                      ff_group_name(g), p);
                MPI_Allgather(&rank, 1, MPI_INT, members, 1, MPI_INT, ff_group_comm(g));
                for (int i = 0; i < p; i++) {
                    int want = expected_member(s, c, st, (ff_group_kind)k, i);
                    CHECK(members[i] == want,
                          "grid %dx%dx%dx%d x %d rank %d group %s member %d: %d, want %d", s.x, s.y,
                          s.z, s.d, P, rank, ff_group_name(g), i, members[i], want);
                    if (members[i] == rank)
                        CHECK(ff_group_rank(g) == i, "group %s: own index", ff_group_name(g));
                }
            }
            if (rank == 0) {
                char desc[160];
                ff_grid_describe(grid, desc, sizeof desc);
                printf("grid %-44s coordinates and %d groups checked on every rank\n", desc,
                       FF_NGROUPS);
            }
            ff_grid_destroy(grid);
        }
    }
    /* stages that do not divide the job are refused identically everywhere */
    if (size > 1) {
        ff_grid *bad = NULL;
        rc = ff_grid_create_staged(ctx, (ff_dims){1, 1, 1, 1}, size + 1, &bad);
        CHECK(rc == FF_EGRID && bad == NULL, "%d stages on %d ranks accepted", size + 1, size);
        CHECK(strstr(ff_ctx_error(ctx), "pipeline stages does not cover") != NULL, "message: %s",
              ff_ctx_error(ctx));
    }
    /* a shape that does not match the job is refused identically everywhere */
    ff_grid *bad = NULL;
    rc = ff_grid_create(ctx, (ff_dims){size + 1, 1, 1, 1}, &bad);
    CHECK(rc == FF_EGRID && bad == NULL, "grid of %d ranks on %d accepted", size + 1, size);
    CHECK(strstr(ff_ctx_error(ctx), "but the job has") != NULL, "message: %s", ff_ctx_error(ctx));
    if (rank == 0)
        printf("%d grids (with stages) of %d ranks checked\n", checked, size);
    free(members);
    ff_ctx_destroy(ctx);
    int code = test_finish("grid");
    MPI_Finalize();
    return code;
}
