/* ff_grid_parse: every accepted form and every rejection, with its message.
 * Pure arithmetic: runs without MPI. */
#include <stdio.h>
#include <string.h>

#include "test_util.h"

static void accept(const char *spec, int world, int per_node, int x, int y, int z, int d)
{
    ff_dims s;
    char err[256] = "";
    int rc = ff_grid_parse(spec, world, per_node, &s, err, sizeof err);
    CHECK(rc == FF_OK, "'%s' on %d ranks: rejected: %s", spec, world, err);
    if (rc == FF_OK)
        CHECK(s.x == x && s.y == y && s.z == z && s.d == d,
              "'%s' on %d ranks (%d per node): got %dx%dx%dx%d, want %dx%dx%dx%d", spec, world,
              per_node, s.x, s.y, s.z, s.d, x, y, z, d);
    printf("accept  %-14s on %2d ranks -> %dx%dx%dx%d\n", spec, world, x, y, z, d);
}

/* Rejected, with a message that contains `needle`. */
static void reject(const char *spec, int world, const char *needle)
{
    ff_dims s;
    char err[256] = "";
    int rc = ff_grid_parse(spec, world, 2, &s, err, sizeof err);
    CHECK(rc == FF_EGRID, "'%s' on %d ranks: accepted, should be refused", spec, world);
    CHECK(strstr(err, needle) != NULL, "'%s': message '%s' lacks '%s'", spec, err, needle);
    printf("reject  %-14s on %2d ranks: %s\n", spec ? spec : "(null)", world, err);
}

int main(void)
{
    accept("2x2x2x1", 8, 2, 2, 2, 2, 1);
    accept("1x1x1x1", 1, 1, 1, 1, 1, 1);
    accept("3x1x2x2", 12, 4, 3, 1, 2, 2);
    accept("2X3X1X1", 6, 2, 2, 3, 1, 1);
    accept("serial", 1, 1, 1, 1, 1, 1);
    accept("data", 8, 2, 1, 1, 1, 8);
    accept("fsdp", 8, 2, 1, 1, 8, 1);
    accept("hsdp", 8, 4, 1, 1, 4, 2);
    accept("hsdp:2", 8, 4, 1, 1, 2, 4);
    accept("megatron", 8, 4, 4, 1, 1, 2);
    accept("megatron:8", 8, 4, 8, 1, 1, 1);
    accept("megatron", 2, 4, 2, 1, 1, 1); /* per-node larger than the job */

    reject("2x2x2x2", 8, "needs 16 ranks, but the job has 8");
    reject("2x2x2", 8, "has 3 sizes");
    reject("2x2x2x1x1", 8, "more than four sizes");
    reject("2x0x2x1", 8, "size of Y is 0");
    reject("2x-2x2x1", 8, "size of Y is -2");
    reject("2xax2x1", 8, "malformed");
    reject("2x2x2x", 8, "malformed");
    reject("", 8, "empty");
    reject("99999999999x1x1x1", 8, "too large");
    reject("3000000x3000000x3000000x1", 8, "needs more than 32 ranks");
    reject("2147483647x2147483647x2147483647x2147483647", 8, "needs more than");
    reject("hsdp:3", 8, "does not divide");
    reject("hsdp:0", 8, "positive integer");
    reject("megatron:x", 8, "positive integer");
    reject("serial", 4, "needs 1 ranks, but the job has 4");
    reject("zero", 4, "malformed");

    /* rank <-> coordinates: X fastest, D outermost (docs/design.md §1) */
    ff_dims s = {2, 3, 2, 2};
    for (int r = 0; r < ff_dims_product(s); r++) {
        ff_dims c = ff_grid_coords_of(s, r);
        CHECK(c.x >= 0 && c.x < s.x && c.y >= 0 && c.y < s.y && c.z >= 0 && c.z < s.z && c.d >= 0 &&
                  c.d < s.d,
              "coords of %d out of range", r);
        CHECK(r == c.x + s.x * (c.y + s.y * (c.z + s.z * c.d)), "coords of %d", r);
        CHECK(ff_grid_rank_of(s, c) == r, "rank_of(coords_of(%d))", r);
    }
    ff_dims all[64];
    CHECK(test_all_grids(8, all, 64) == 20, "8 ranks have 20 grids");
    CHECK(test_all_grids(12, all, 64) == 40, "12 ranks have 40 grids");
    return test_finish("grid_parse");
}
