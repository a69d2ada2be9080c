/* A minimal program using libfourfold: build a grid from the command line,
 * all-reduce each rank's number over the Y group and print the result.
 *
 *   cc hello_grid.c $(pkg-config --cflags --libs fourfold) -o hello_grid
 *   mpirun -np 4 ./hello_grid 2x2x1x1
 */
#include <fourfold/fourfold.h>
#include <stdio.h>

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    ff_ctx *ctx;
    ff_grid *grid = NULL;
    ff_dims shape;
    char err[256];
    int rc = ff_ctx_create(&ctx, MPI_COMM_WORLD, NULL);
    if (rc == FF_OK) {
        rc = ff_grid_parse(argc > 1 ? argv[1] : "data", ff_ctx_size(ctx), 1, &shape, err,
                           sizeof err);
        if (rc != FF_OK)
            ff_ctx_set_error(ctx, rc, "%s", err);
    }
    if (rc == FF_OK)
        rc = ff_grid_create(ctx, shape, &grid);
    if (rc != FF_OK) {
        if (ff_ctx_rank(ctx) == 0)
            fprintf(stderr, "hello_grid: %s\n", ff_ctx_error(ctx));
        ff_ctx_destroy(ctx);
        MPI_Finalize();
        return 1;
    }
    ff_dims c = ff_grid_coords(grid);
    float mine = (float)ff_ctx_rank(ctx), sum = 0;
    rc = ff_allreduce(ff_grid_group(grid, FF_GROUP_Y), &mine, &sum, 1, NULL);
    printf("rank %d (x=%d y=%d z=%d d=%d): sum of ranks in my Y group = %g\n", ff_ctx_rank(ctx),
           c.x, c.y, c.z, c.d, sum);
    ff_grid_destroy(grid);
    ff_ctx_destroy(ctx);
    MPI_Finalize();
    return rc == FF_OK ? 0 : 1;
}
