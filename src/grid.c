/* The 4D process grid and its group communicators (docs/design.md §1). */
#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "util/file.h"

static const char *const kind_names[FF_NGROUPS] = {"X",  "Y",     "Z",     "D",   "ZD",
                                                   "TP", "WORLD", "STAGE", "PIPE"};

const char *ff_group_kind_name(ff_group_kind kind)
{
    return (kind >= 0 && kind < FF_NGROUPS) ? kind_names[kind] : "?";
}

int ff_dims_product(ff_dims s) { return s.x * s.y * s.z * s.d; }

/* The product of positive sizes, or cap + 1 as soon as it exceeds cap (so a
 * huge grid cannot overflow). */
static long long product_capped(ff_dims s, long long cap)
{
    const int v[4] = {s.x, s.y, s.z, s.d};
    long long p = 1;
    for (int i = 0; i < 4; i++) {
        p *= v[i]; /* p <= cap <= INT_MAX before, v <= INT_MAX: fits */
        if (p > cap)
            return cap + 1;
    }
    return p;
}

/* "needs 16 ranks" or "needs more than 8 ranks" */
static void needs_text(char *buf, size_t len, ff_dims s, int world)
{
    long long p = product_capped(s, (long long)world * 4);
    if (p > (long long)world * 4)
        snprintf(buf, len, "needs more than %lld ranks", (long long)world * 4);
    else
        snprintf(buf, len, "needs %lld ranks", p);
}

int ff_grid_rank_of(ff_dims s, ff_dims c) { return c.x + s.x * (c.y + s.y * (c.z + s.z * c.d)); }

ff_dims ff_grid_coords_of(ff_dims s, int rank)
{
    ff_dims c;
    c.x = rank % s.x;
    rank /= s.x;
    c.y = rank % s.y;
    rank /= s.y;
    c.z = rank % s.z;
    c.d = rank / s.z;
    return c;
}

/* ---- parsing ---- */

static const char grid_help[] =
    "expected four sizes Gx x Gy x Gz x Gd such as 2x2x2x1, or a preset: serial, data, fsdp, "
    "hsdp[:Z], megatron[:X]";

/* Parses a positive decimal integer occupying [s, end). */
static int parse_size(const char *s, const char *end, int *out)
{
    if (s == end)
        return -1;
    long v = 0;
    int negative = 0;
    if (*s == '-' || *s == '+') {
        negative = *s == '-';
        s++;
        if (s == end)
            return -1;
    }
    for (; s < end; s++) {
        if (!isdigit((unsigned char)*s))
            return -1;
        v = v * 10 + (*s - '0');
        if (v > INT_MAX)
            return -2;
    }
    *out = negative ? -(int)v : (int)v;
    return 0;
}

/* "name" or "name:N"; returns 1 if spec is the preset, with *arg = N or 0. */
static int preset_match(const char *spec, const char *name, int *arg, int *bad_arg)
{
    size_t n = strlen(name);
    if (strncmp(spec, name, n) != 0)
        return 0;
    *arg = 0;
    *bad_arg = 0;
    if (spec[n] == '\0')
        return 1;
    if (spec[n] != ':')
        return 0;
    const char *a = spec + n + 1;
    if (parse_size(a, a + strlen(a), arg) != 0 || *arg <= 0)
        *bad_arg = 1;
    return 1;
}

/* "but the job has 8 (mpirun -np 8)", or with stages "but each of the 2
 * stages has 4 (the job's 8 ranks)" */
static void has_text(char *buf, size_t len, int world, int stages)
{
    if (stages > 1)
        snprintf(buf, len, "but each of the %d stages has %d (the job's %d ranks)", stages, world,
                 world * stages);
    else
        snprintf(buf, len, "but the job has %d (mpirun -np %d)", world, world);
}

int ff_grid_parse(const char *spec, int world, int ranks_per_node, ff_dims *out, char *err,
                  size_t err_len)
{
    return ff_grid_parse_staged(spec, world, 1, ranks_per_node, out, err, err_len);
}

int ff_grid_parse_staged(const char *spec, int job, int stages, int ranks_per_node, ff_dims *out,
                         char *err, size_t err_len)
{
    if (stages < 1)
        return ff_format_error(err, err_len, FF_EGRID, "%d pipeline stages: at least one", stages);
    if (job >= 1 && job % stages)
        return ff_format_error(err, err_len, FF_EGRID,
                               "%d pipeline stages: %d does not divide the job's %d ranks (each "
                               "stage runs the grid on an equal share)",
                               stages, stages, job);
    const int world = job / stages; /* the ranks of one stage */
    if (!spec || !*spec)
        return ff_format_error(err, err_len, FF_EGRID, "grid is empty: %s", grid_help);
    if (world < 1)
        return ff_format_error(err, err_len, FF_EGRID, "grid '%s': the job has %d ranks", spec,
                               world);
    if (ranks_per_node < 1)
        ranks_per_node = 1;

    int arg, bad;
    ff_dims s = {1, 1, 1, 1};
    if (strcmp(spec, "serial") == 0) {
        /* the shape check below reports a world size other than 1 */
    } else if (strcmp(spec, "data") == 0) {
        s.d = world;
    } else if (strcmp(spec, "fsdp") == 0) {
        s.z = world;
    } else if (preset_match(spec, "hsdp", &arg, &bad) ||
               preset_match(spec, "megatron", &arg, &bad)) {
        int is_hsdp = spec[0] == 'h';
        if (bad)
            return ff_format_error(err, err_len, FF_EGRID,
                                   "grid '%s': the size after ':' must be a positive integer",
                                   spec);
        int inner = arg ? arg : (ranks_per_node < world ? ranks_per_node : world);
        if (world % inner != 0)
            return ff_format_error(
                err, err_len, FF_EGRID,
                "grid '%s': its inner size %d does not divide the job's %d ranks", spec, inner,
                world);
        if (is_hsdp)
            s.z = inner;
        else
            s.x = inner;
        s.d = world / inner;
    } else {
        int v[4], n = 0;
        const char *p = spec;
        for (;;) {
            const char *q = p;
            while (*q && *q != 'x' && *q != 'X')
                q++;
            if (n == 4)
                return ff_format_error(err, err_len, FF_EGRID,
                                       "grid '%s' has more than four sizes; %s", spec, grid_help);
            int prc = parse_size(p, q, &v[n]);
            if (prc == -2)
                return ff_format_error(err, err_len, FF_EGRID, "grid '%s': size %d is too large",
                                       spec, n + 1);
            if (prc != 0)
                return ff_format_error(err, err_len, FF_EGRID,
                                       "grid '%s' is malformed (size %d is not a number); %s", spec,
                                       n + 1, grid_help);
            n++;
            if (!*q)
                break;
            p = q + 1;
        }
        if (n != 4)
            return ff_format_error(
                err, err_len, FF_EGRID,
                "grid '%s' has %d sizes; it needs four, Gx x Gy x Gz x Gd (e.g. 2x2x2x1)", spec, n);
        static const char axis[4] = {'X', 'Y', 'Z', 'D'};
        for (int i = 0; i < 4; i++)
            if (v[i] <= 0) {
                return ff_format_error(err, err_len, FF_EGRID,
                                       "grid '%s': size of %c is %d; every size must be >= 1", spec,
                                       axis[i], v[i]);
            }
        s.x = v[0];
        s.y = v[1];
        s.z = v[2];
        s.d = v[3];
    }
    char shape[64], needs[64], has[96];
    snprintf(shape, sizeof shape, "%dx%dx%dx%d", s.x, s.y, s.z, s.d);
    needs_text(needs, sizeof needs, s, world);
    has_text(has, sizeof has, world, stages);
    if (product_capped(s, world) != world && strcmp(shape, spec) == 0)
        return ff_format_error(err, err_len, FF_EGRID, "grid %s %s, %s", spec, needs, has);
    if (product_capped(s, world) != world)
        return ff_format_error(err, err_len, FF_EGRID, "grid '%s' = %s %s, %s", spec, shape, needs,
                               has);
    *out = s;
    return FF_OK;
}

/* ---- groups ---- */

int ff_group_init(ff_group *g, ff_ctx *ctx, MPI_Comm comm, const char *name)
{
    memset(g, 0, sizeof *g);
    g->ctx = ctx;
    g->comm = comm;
    MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN);
    MPI_Comm_size(comm, &g->size);
    MPI_Comm_rank(comm, &g->rank);
    snprintf(g->name, sizeof g->name, "%s", name);
    return FF_OK;
}

void ff_group_fini(ff_group *g)
{
    ff_topo_free(g->topo);
    g->topo = NULL;
    if (g->comm != MPI_COMM_NULL && g->comm != 0)
        MPI_Comm_free(&g->comm);
    g->comm = MPI_COMM_NULL;
}

int ff_group_create(ff_ctx *ctx, MPI_Comm comm, const char *name, ff_group **out)
{
    *out = NULL;
    /* the collectives first, whatever happens here, so that a rank out of
     * memory does not leave its peers in them */
    MPI_Comm dup;
    int rc = MPI_Comm_dup(comm, &dup);
    if (rc != MPI_SUCCESS)
        return ff_mpi_error(ctx, rc, "MPI_Comm_dup");
    ff_group *g = calloc(1, sizeof *g);
    int ok = g != NULL, all_ok = 0;
    if (g) {
        ff_group_init(g, ctx, dup, name);
        ok = ff_group_topo_init(g) == FF_OK;
    }
    /* agreed across the group (collective over comm, not over the context) */
    rc = MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_MIN, dup);
    if (!g) {
        MPI_Comm_free(&dup);
        return ff_set_error(ctx, FF_ENOMEM, "out of memory creating group %s", name);
    }
    if (rc != MPI_SUCCESS || !all_ok) {
        ff_group_destroy(g);
        if (rc != MPI_SUCCESS)
            return ff_mpi_error(ctx, rc, "MPI_Allreduce (creating a group)");
        return ok ? ff_set_error(ctx, FF_ENOMEM,
                                 "out of memory on another rank finding the nodes of group %s",
                                 name)
                  : FF_ENOMEM;
    }
    *out = g;
    return FF_OK;
}

void ff_group_destroy(ff_group *g)
{
    if (!g)
        return;
    ff_group_fini(g);
    free(g);
}

int ff_group_size(const ff_group *g) { return g->size; }
int ff_group_rank(const ff_group *g) { return g->rank; }
MPI_Comm ff_group_comm(const ff_group *g) { return g->comm; }
const char *ff_group_name(const ff_group *g) { return g->name; }

/* ---- the grid ---- */

int ff_grid_create(ff_ctx *ctx, ff_dims s, ff_grid **out)
{
    return ff_grid_create_staged(ctx, s, 1, out);
}

int ff_grid_create_staged(ff_ctx *ctx, ff_dims s, int stages, ff_grid **out)
{
    *out = NULL;
    /* The local checks first, then one agreement: a rank given a bad shape
     * must not leave the others waiting in the shape comparison below. */
    int rc = FF_OK;
    char needs[64];
    if (s.x < 1 || s.y < 1 || s.z < 1 || s.d < 1) {
        rc = ff_set_error(ctx, FF_EGRID, "grid %dx%dx%dx%d: every size must be >= 1", s.x, s.y, s.z,
                          s.d);
    } else if (stages < 1) {
        rc = ff_set_error(ctx, FF_EGRID, "%d pipeline stages: there must be at least one", stages);
    } else if (stages == 1 && product_capped(s, ctx->size) != ctx->size) {
        needs_text(needs, sizeof needs, s, ctx->size);
        rc = ff_set_error(ctx, FF_EGRID, "grid %dx%dx%dx%d %s, but the job has %d (mpirun -np %d)",
                          s.x, s.y, s.z, s.d, needs, ctx->size, ctx->size);
    } else if (stages > 1 && (ctx->size % stages ||
                              product_capped(s, ctx->size / stages) != ctx->size / stages)) {
        rc = ff_set_error(ctx, FF_EGRID,
                          "grid %dx%dx%dx%d times %d pipeline stages does not cover the job's %d "
                          "ranks (each stage runs the grid: Gx*Gy*Gz*Gd*stages must be %d)",
                          s.x, s.y, s.z, s.d, stages, ctx->size, ctx->size);
    }
    rc = ff_ctx_agree(ctx, rc);
    if (rc != FF_OK)
        return rc;

    /* Every rank must have been given the same shape: a mismatch (e.g.
     * different command lines) would build inconsistent communicators. */
    int mine[5] = {s.x, s.y, s.z, s.d, stages}, lo[5], hi[5];
    rc = MPI_Allreduce(mine, lo, 5, MPI_INT, MPI_MIN, ctx->comm);
    if (rc == MPI_SUCCESS)
        rc = MPI_Allreduce(mine, hi, 5, MPI_INT, MPI_MAX, ctx->comm);
    if (rc != MPI_SUCCESS)
        return ff_mpi_error(ctx, rc, "MPI_Allreduce (checking the grid)");
    if (memcmp(lo, hi, sizeof lo) != 0)
        return ff_set_error(ctx, FF_EGRID,
                            "ranks were given different grids (%dx%dx%dx%d, %d stages to "
                            "%dx%dx%dx%d, %d stages)",
                            lo[0], lo[1], lo[2], lo[3], lo[4], hi[0], hi[1], hi[2], hi[3], hi[4]);

    ff_grid *grid = calloc(1, sizeof *grid);
    if (!grid)
        return ff_set_error(ctx, FF_ENOMEM, "out of memory creating the grid");
    const int G = ff_dims_product(s);
    grid->ctx = ctx;
    grid->shape = s;
    grid->stages = stages;
    grid->stage = ctx->rank / G; /* the stage is outermost (docs/design.md §1) */
    grid->coords = ff_grid_coords_of(s, ctx->rank % G);
    ff_dims c = grid->coords;
    const int st = grid->stage;

    /* color selects the group, key orders ranks inside it; the 4D groups
     * stay inside the rank's stage */
    int color[FF_NGROUPS], key[FF_NGROUPS];
    color[FF_GROUP_X] = c.y + s.y * (c.z + s.z * c.d);
    key[FF_GROUP_X] = c.x;
    color[FF_GROUP_Y] = c.x + s.x * (c.z + s.z * c.d);
    key[FF_GROUP_Y] = c.y;
    color[FF_GROUP_Z] = c.x + s.x * (c.y + s.y * c.d);
    key[FF_GROUP_Z] = c.z;
    color[FF_GROUP_D] = c.x + s.x * (c.y + s.y * c.z);
    key[FF_GROUP_D] = c.d;
    color[FF_GROUP_ZD] = c.x + s.x * c.y;
    key[FF_GROUP_ZD] = c.z + s.z * c.d;
    color[FF_GROUP_TP] = c.d;
    key[FF_GROUP_TP] = c.x + s.x * (c.y + s.y * c.z);
    for (int k = 0; k <= FF_GROUP_TP; k++)
        color[k] += st * G;
    color[FF_GROUP_WORLD] = 0;
    key[FF_GROUP_WORLD] = ctx->rank;
    color[FF_GROUP_STAGE] = st;
    key[FF_GROUP_STAGE] = ctx->rank % G;
    color[FF_GROUP_PIPE] = ctx->rank % G;
    key[FF_GROUP_PIPE] = st;

    for (int k = 0; k < FF_NGROUPS; k++) {
        MPI_Comm comm;
        rc = MPI_Comm_split(ctx->comm, color[k], key[k], &comm);
        if (rc != MPI_SUCCESS) {
            for (int j = 0; j < k; j++)
                ff_group_fini(&grid->groups[j]);
            free(grid);
            return ff_mpi_error(ctx, rc, "MPI_Comm_split (building the grid's groups)");
        }
        ff_group_init(&grid->groups[k], ctx, comm, kind_names[k]);
    }
    rc = FF_OK;
    for (int k = 0; k < FF_NGROUPS && rc == FF_OK; k++)
        rc = ff_group_topo_init(&grid->groups[k]);
    rc = ff_ctx_agree(ctx, rc);
    if (rc != FF_OK) {
        ff_grid_destroy(grid);
        return rc;
    }
    *out = grid;
    return FF_OK;
}

void ff_grid_destroy(ff_grid *grid)
{
    if (!grid)
        return;
    for (int k = 0; k < FF_NGROUPS; k++)
        ff_group_fini(&grid->groups[k]);
    free(grid);
}

ff_dims ff_grid_shape(const ff_grid *grid) { return grid->shape; }
ff_dims ff_grid_coords(const ff_grid *grid) { return grid->coords; }
ff_ctx *ff_grid_ctx(const ff_grid *grid) { return grid->ctx; }
int ff_grid_stages(const ff_grid *grid) { return grid->stages; }
int ff_grid_stage(const ff_grid *grid) { return grid->stage; }

ff_group *ff_grid_group(const ff_grid *grid, ff_group_kind kind)
{
    if (kind < 0 || kind >= FF_NGROUPS)
        return NULL;
    return (ff_group *)&grid->groups[kind];
}

void ff_grid_describe(const ff_grid *grid, char *buf, size_t len)
{
    ff_dims s = grid->shape;
    if (grid->stages == 1)
        snprintf(buf, len, "%dx%dx%dx%d (Gx=%d Gy=%d Gz=%d Gd=%d, %d ranks)", s.x, s.y, s.z, s.d,
                 s.x, s.y, s.z, s.d, ff_dims_product(s));
    else
        snprintf(buf, len,
                 "%dx%dx%dx%d x %d stages (Gx=%d Gy=%d Gz=%d Gd=%d, %d ranks per stage, %d ranks)",
                 s.x, s.y, s.z, s.d, grid->stages, s.x, s.y, s.z, s.d, ff_dims_product(s),
                 ff_dims_product(s) * grid->stages);
}
