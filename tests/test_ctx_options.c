/* The collective layer's settings through ff_ctx_options and through their
 * environment variables (include/fourfold/ctx.h): each field reaches the
 * layer, a set field wins over its variable, ignore_env ignores the
 * variables, and a bad value in either is refused with a message that names
 * its source. Run on 4 ranks: test_ctx_options PROFILE (a profile whose
 * alpha_inter_s is 0.00015291, profiles/tb-2x2-1gbit-d100us.json). */
#include <math.h>
#include <mpi.h>
#include <stdlib.h>
#include <string.h>

#include "fourfold/fourfold.h"
#include "test_util.h"

/* Creates a context with o; returns its code and copies its message. */
static int create(const ff_ctx_options *o, ff_ctx **ctx, char *msg, size_t len)
{
    int rc = ff_ctx_create(ctx, MPI_COMM_WORLD, o);
    snprintf(msg, len, "%s", ff_ctx_error(*ctx));
    return rc;
}

/* Nodes the context sees with o (-1 if it could not be created). */
static int nodes_with(const ff_ctx_options *o)
{
    ff_ctx *ctx;
    char msg[512];
    int rc = create(o, &ctx, msg, sizeof msg), n = rc == FF_OK ? ff_ctx_nodes(ctx) : -1;
    CHECK(rc == FF_OK, "ff_ctx_create: %s", msg);
    ff_ctx_destroy(ctx);
    return n;
}

/* 1 if creating a context with o fails with FF_EINVAL and a message containing want. */
static int refused(const ff_ctx_options *o, const char *want)
{
    ff_ctx *ctx;
    char msg[512];
    int rc = create(o, &ctx, msg, sizeof msg);
    ff_ctx_destroy(ctx);
    int ok = rc != FF_OK && strstr(msg, want) != NULL;
    CHECK(ok, "expected a refusal with \"%s\", got %s: \"%s\"", want, ff_strerror(rc), msg);
    return ok;
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    int size;
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (size != 4 || argc != 2) {
        fprintf(stderr, "usage: mpirun -np 4 test_ctx_options PROFILE\n");
        MPI_Finalize();
        return 2;
    }
    const char *vars[] = {"FF_PROFILE",    "FF_ALGO",          "FF_RANKS_PER_NODE",
                          "FF_A2A_WINDOW", "FF_STRICT_VOLUME", "FF_DEVICE"};
    for (size_t i = 0; i < sizeof vars / sizeof *vars; i++)
        unsetenv(vars[i]);
    ff_ctx_options o;

    /* ranks per node: the machine's one node; the option; the variable; the
     * option over the variable; the variable ignored */
    ff_ctx_options_default(&o);
    CHECK(nodes_with(&o) == 1, "one node by default");
    o.ranks_per_node = 2;
    CHECK(nodes_with(&o) == 2, "ranks_per_node 2: 2 nodes");
    setenv("FF_RANKS_PER_NODE", "1", 1);
    CHECK(nodes_with(&o) == 2, "the option wins over FF_RANKS_PER_NODE=1");
    o.ranks_per_node = 0;
    CHECK(nodes_with(&o) == 4, "FF_RANKS_PER_NODE=1: 4 nodes");
    o.ignore_env = 1;
    CHECK(nodes_with(&o) == 1, "ignore_env: one node");
    unsetenv("FF_RANKS_PER_NODE");

    /* the forced algorithm: AUTO's choice on the world group becomes it */
    ff_ctx_options_default(&o);
    o.algo = "direct";
    ff_ctx *ctx;
    char msg[512];
    int rc = create(&o, &ctx, msg, sizeof msg);
    CHECK(rc == FF_OK, "algo direct: %s", msg);
    ff_grid *grid = NULL;
    if (rc == FF_OK && ff_grid_create(ctx, (ff_dims){4, 1, 1, 1}, &grid) == FF_OK) {
        ff_group *g = ff_grid_group(grid, FF_GROUP_WORLD);
        ff_algo a = ff_coll_choose(g, FF_COLL_ALLGATHER, 1024, FF_WIRE_FP32);
        CHECK(a == FF_ALGO_DIRECT, "algo direct: AUTO runs %s", ff_algo_name(a));
    } else {
        CHECK(0, "grid: %s", ff_ctx_error(ctx));
    }
    ff_grid_destroy(grid);
    ff_ctx_destroy(ctx);

    /* the profile: its alpha reaches the model, from the option or FF_PROFILE */
    for (int from_env = 0; from_env < 2; from_env++) {
        ff_ctx_options_default(&o);
        if (from_env)
            setenv("FF_PROFILE", argv[1], 1);
        else
            o.profile = argv[1];
        rc = create(&o, &ctx, msg, sizeof msg);
        CHECK(rc == FF_OK, "profile: %s", msg);
        ff_coll_model m;
        ff_ctx_coll_model(ctx, &m);
        CHECK(rc == FF_OK && fabs(m.alpha_inter_s - 0.00015291) < 1e-12,
              "profile from %s: alpha_inter_s %g", from_env ? "FF_PROFILE" : "the option",
              m.alpha_inter_s);
        ff_ctx_destroy(ctx);
        unsetenv("FF_PROFILE");
    }

    /* the volume rule */
    for (int k = 0; k < 4; k++) {
        ff_ctx_options_default(&o);
        const ff_volume_rule rules[] = {FF_VOLUME_UNSET, FF_VOLUME_ANY, FF_VOLUME_UNSET,
                                        FF_VOLUME_STRICT};
        o.volume = rules[k];
        if (k >= 2)
            setenv("FF_STRICT_VOLUME", "0", 1); /* the variable; then the option over it */
        rc = create(&o, &ctx, msg, sizeof msg);
        ff_coll_model m;
        ff_ctx_coll_model(ctx, &m);
        const int want[] = {1, 0, 0, 1};
        CHECK(rc == FF_OK && m.strict_volume == want[k], "volume case %d: strict %d, want %d", k,
              m.strict_volume, want[k]);
        ff_ctx_destroy(ctx);
    }
    unsetenv("FF_STRICT_VOLUME");

    /* bad values, from each source, with the source named; none left over */
    ff_ctx_options_default(&o);
    o.a2a_window = 9;
    refused(&o, "the option for FF_A2A_WINDOW is 9: expected 1 to 8");
    o.a2a_window = 0;
    setenv("FF_A2A_WINDOW", "9", 1);
    refused(&o, "FF_A2A_WINDOW=9: expected an integer from 1 to 8");
    o.a2a_window = 3; /* a valid option wins over the bad variable */
    CHECK(nodes_with(&o) == 1, "a2a_window 3 over FF_A2A_WINDOW=9");
    o.a2a_window = 0;
    o.ignore_env = 1;
    CHECK(nodes_with(&o) == 1, "ignore_env: FF_A2A_WINDOW=9 not read");
    unsetenv("FF_A2A_WINDOW");
    ff_ctx_options_default(&o);
    o.algo = "fastest";
    refused(&o, "the algo option fastest: expected auto");
    o.algo = NULL;
    setenv("FF_ALGO", "fastest", 1);
    refused(&o, "FF_ALGO=fastest: expected auto");
    unsetenv("FF_ALGO");
    o.profile = "/nonexistent/profile.json";
    refused(&o, "the profile option: ");
    o.profile = NULL;
    o.volume = (ff_volume_rule)7;
    refused(&o, "unknown volume rule 7");

    /* the device: the CPU by default; a bad name from either source; cuda
     * is refused where this build has no CUDA backend or there is no GPU */
    ff_ctx_options_default(&o);
    rc = create(&o, &ctx, msg, sizeof msg);
    CHECK(rc == FF_OK && strcmp(ff_ctx_device(ctx), "cpu") == 0, "default device: %s",
          rc == FF_OK ? ff_ctx_device(ctx) : msg);
    ff_ctx_destroy(ctx);
    o.device = "gpu";
    refused(&o, "the device option 'gpu': expected cpu or cuda");
    o.device = NULL;
    setenv("FF_DEVICE", "gpu", 1);
    refused(&o, "FF_DEVICE=gpu: expected cpu or cuda");
    o.device = "cpu"; /* the option wins over the variable */
    CHECK(nodes_with(&o) == 1, "device cpu over FF_DEVICE=gpu");
    o.device = NULL;
    o.ignore_env = 1;
    CHECK(nodes_with(&o) == 1, "ignore_env: FF_DEVICE=gpu not read");
    unsetenv("FF_DEVICE");
    ff_ctx_options_default(&o);
    o.device = "cuda";
    rc = create(&o, &ctx, msg, sizeof msg);
    if (rc == FF_OK) /* a CUDA build on a GPU machine */
        CHECK(strcmp(ff_ctx_device(ctx), "cpu") != 0, "device cuda: runs on the cpu");
    else
        CHECK(strstr(msg, "device 'cuda': ") != NULL, "device cuda refused with: %s", msg);
    ff_ctx_destroy(ctx);

    int code = test_finish("ctx_options");
    MPI_Finalize();
    return code;
}
