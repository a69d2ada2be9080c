/* fourfold selftest: builds the grid, prints it, and checks every collective
 * on every group against the MPI library's blocking collective.
 *
 * fp32 inputs are small integers, so every summation order gives the exact
 * same sum: the check is equality. bf16 inputs are not representable in
 * bf16; all-gather and all-to-all must then deliver exactly bf16(x), and the
 * reductions must lie within ((1 + 2^-8)^p - 1) * sum|x| of the fp32 sum (at
 * most p roundings of a partial sum whose magnitude is at most sum|x|:
 * docs/collectives.md), plus the fp32 reference's own error, 2p 2^-24 sum|x|.
 * The byte counters must equal the ring volumes, derived here again from the
 * algorithm (not from the library's own function). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

typedef struct {
    ff_ctx *ctx;
    size_t count;
    int algos[FF_NALGO], wires[2];
    int n_checks, n_failed;
} selftest;

static size_t ring_chunk(size_t n, int p, int i)
{
    return n / (size_t)p + ((size_t)i < n % (size_t)p ? 1 : 0);
}

/* Elements a ring sends and receives (docs/design.md §7, uneven chunks included). */
static void expected_elems(ff_coll coll, int p, int r, size_t n, size_t *sent, size_t *recv)
{
    if (p == 1) {
        *sent = *recv = 0;
    } else if (coll == FF_COLL_ALLREDUCE) {
        /* reduce-scatter sends every chunk but r and receives every chunk but
         * r-1; the all-gather sends every chunk but r+1, receives all but r */
        *sent = (n - ring_chunk(n, p, r)) + (n - ring_chunk(n, p, (r + 1) % p));
        *recv = (n - ring_chunk(n, p, (r + p - 1) % p)) + (n - ring_chunk(n, p, r));
    } else {
        *sent = *recv = (size_t)(p - 1) * n;
    }
}

static float input_value(int world_rank, size_t i, ff_wire wire)
{
    if (wire == FF_WIRE_FP32)
        return (float)((long)((world_rank * 131 + (long)i * 17) % 41) - 20);
    return (float)(sin(world_rank * 1.7 + (double)i * 0.37) * (1.0 + (double)(i % 5)));
}

/* Runs one check; returns 1 if it passed (on every rank). */
static int check_one(selftest *st, ff_group *g, ff_coll coll, ff_algo algo, ff_wire wire,
                     int in_place)
{
    int p = ff_group_size(g), r = ff_group_rank(g), world_rank = cli_world_rank();
    MPI_Comm comm = ff_group_comm(g);
    size_t c = st->count;
    size_t n_send = (coll == FF_COLL_REDUCE_SCATTER || coll == FF_COLL_ALLTOALL) ? p * c : c;
    size_t n_recv = (coll == FF_COLL_ALLGATHER || coll == FF_COLL_ALLTOALL) ? p * c : c;
    float *send = malloc(n_send * sizeof(float)), *recv = malloc(n_recv * sizeof(float));
    float *ref = malloc(n_recv * sizeof(float)), *absin = malloc(n_send * sizeof(float));
    float *sumabs = malloc(n_recv * sizeof(float));
    if (!send || !recv || !ref || !absin || !sumabs) {
        fprintf(stderr, "fourfold selftest: out of memory\n");
        MPI_Abort(MPI_COMM_WORLD, 1); /* other ranks would block in the next check */
    }
    for (size_t i = 0; i < n_send; i++) {
        send[i] = input_value(world_rank, i, wire);
        absin[i] = fabsf(send[i]);
    }
    /* the reference: the MPI library's blocking collective on the same data */
    int n = (int)c;
    switch (coll) {
    case FF_COLL_ALLGATHER: MPI_Allgather(send, n, MPI_FLOAT, ref, n, MPI_FLOAT, comm); break;
    case FF_COLL_REDUCE_SCATTER:
        MPI_Reduce_scatter_block(send, ref, n, MPI_FLOAT, MPI_SUM, comm);
        MPI_Reduce_scatter_block(absin, sumabs, n, MPI_FLOAT, MPI_SUM, comm);
        break;
    case FF_COLL_ALLREDUCE:
        MPI_Allreduce(send, ref, n, MPI_FLOAT, MPI_SUM, comm);
        MPI_Allreduce(absin, sumabs, n, MPI_FLOAT, MPI_SUM, comm);
        break;
    default: MPI_Alltoall(send, n, MPI_FLOAT, ref, n, MPI_FLOAT, comm); break;
    }

    /* ours */
    ff_counters before = ff_group_counters(g, coll);
    ff_coll_opts opt = {wire, algo};
    const float *src = send;
    if (in_place) {
        if (coll == FF_COLL_ALLGATHER) {
            memcpy(recv + (size_t)r * c, send, c * sizeof(float));
            src = recv + (size_t)r * c;
        } else { /* all-reduce */
            memcpy(recv, send, c * sizeof(float));
            src = recv;
        }
    }
    ff_request *req = NULL;
    int rc;
    switch (coll) {
    case FF_COLL_ALLGATHER: rc = ff_iallgather(g, src, recv, c, &opt, &req); break;
    case FF_COLL_REDUCE_SCATTER: rc = ff_ireduce_scatter(g, src, recv, c, &opt, &req); break;
    case FF_COLL_ALLREDUCE: rc = ff_iallreduce(g, src, recv, c, &opt, &req); break;
    default: rc = ff_ialltoall(g, src, recv, c, &opt, &req); break;
    }
    if (rc == FF_OK)
        rc = ff_wait(&req);
    if (rc != FF_OK) {
        /* This rank's peers are inside the same collective or the next
         * check's reference and would wait forever (STYLE: MPI_Abort only
         * when other ranks could otherwise block). */
        fprintf(stderr, "fourfold: error: rank %d: %s\n", world_rank, ff_ctx_error(st->ctx));
        MPI_Abort(MPI_COMM_WORLD, CLI_FAIL);
    }
    ff_counters after = ff_group_counters(g, coll);

    /* compare */
    double max_err = 0, max_ratio = 0;
    long wrong = 0;
    int exact =
        wire == FF_WIRE_FP32 || p == 1 || coll == FF_COLL_ALLGATHER || coll == FF_COLL_ALLTOALL;
    const double u = ldexp(1.0, -8), u32 = ldexp(1.0, -24);
    for (size_t i = 0; rc == FF_OK && i < n_recv; i++) {
        double expect = ref[i];
        if (wire == FF_WIRE_BF16 && p > 1 && exact)
            expect = ff_bf16_to_float(ff_bf16_from_float(ref[i]));
        double err = fabs((double)recv[i] - expect);
        double bound = exact ? 0.0 : (expm1(p * log1p(u)) + 2.0 * p * u32) * sumabs[i];
        if (err > max_err)
            max_err = err;
        if (!exact && bound > 0 && err / bound > max_ratio)
            max_ratio = err / bound;
        if (err > bound || recv[i] != recv[i])
            wrong++;
    }
    size_t es = wire == FF_WIRE_BF16 ? 2 : 4, e_sent, e_recv;
    expected_elems(coll, p, r, c, &e_sent, &e_recv);
    long bytes_bad = (after.bytes_sent - before.bytes_sent != e_sent * es ||
                      after.bytes_recv - before.bytes_recv != e_recv * es);

    long local[3] = {rc != FF_OK, wrong, bytes_bad}, global[3];
    MPI_Allreduce(local, global, 3, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
    double errs[2] = {max_err, max_ratio}, gerrs[2];
    MPI_Allreduce(errs, gerrs, 2, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    int ok = global[0] == 0 && global[1] == 0 && global[2] == 0;

    char bound_text[32], bytes_text[48];
    if (exact)
        snprintf(bound_text, sizeof bound_text, "exact");
    else
        snprintf(bound_text, sizeof bound_text, "%.2f of bound", gerrs[1]);
    snprintf(bytes_text, sizeof bytes_text, "%llu/%llu",
             (unsigned long long)(after.bytes_sent - before.bytes_sent),
             (unsigned long long)(after.bytes_recv - before.bytes_recv));
    char verdict[96];
    if (global[0])
        snprintf(verdict, sizeof verdict, "FAILED (error on %ld ranks)", global[0]);
    else if (global[1])
        snprintf(verdict, sizeof verdict, "FAILED (%ld wrong values)", global[1]);
    else if (global[2])
        snprintf(verdict, sizeof verdict, "FAILED (byte counters wrong on %ld ranks)", global[2]);
    else
        snprintf(verdict, sizeof verdict, "ok");
    cli_print("%-5s %4d  %-14s %-4s %-4s %-5s %10.3g  %-14s %15s  %s\n", ff_group_name(g), p,
              ff_coll_name(coll), ff_algo_name(algo), wire == FF_WIRE_BF16 ? "bf16" : "fp32",
              in_place ? "in" : "out", gerrs[0], bound_text, bytes_text, verdict);
    free(send), free(recv), free(ref), free(absin), free(sumabs);
    st->n_checks++;
    st->n_failed += !ok;
    return ok;
}

/* Posts one all-reduce on every group at once, polls until all are done, then
 * waits in reverse order: collectives in flight together must not mix. */
static int check_concurrent(selftest *st, ff_ctx *ctx, ff_grid *grid)
{
    size_t c = st->count;
    float *buf[FF_NGROUPS], *ref[FF_NGROUPS];
    ff_request *req[FF_NGROUPS] = {0};
    int rc = FF_OK, world_rank = cli_world_rank();
    for (int k = 0; k < FF_NGROUPS; k++) {
        buf[k] = malloc(c * sizeof(float));
        ref[k] = malloc(c * sizeof(float));
        if (!buf[k] || !ref[k])
            MPI_Abort(MPI_COMM_WORLD, 1);
        for (size_t i = 0; i < c; i++)
            buf[k][i] = input_value(world_rank + 7 * k, i, FF_WIRE_FP32);
        MPI_Allreduce(buf[k], ref[k], (int)c, MPI_FLOAT, MPI_SUM,
                      ff_group_comm(ff_grid_group(grid, (ff_group_kind)k)));
    }
    for (int k = 0; k < FF_NGROUPS && rc == FF_OK; k++)
        rc = ff_iallreduce(ff_grid_group(grid, (ff_group_kind)k), buf[k], buf[k], c, NULL, &req[k]);
    for (int pending = 1; pending && rc == FF_OK;) {
        ff_progress(ctx);
        pending = 0;
        for (int k = 0; k < FF_NGROUPS && rc == FF_OK; k++) {
            int done;
            rc = ff_test(req[k], &done);
            pending |= !done;
        }
    }
    for (int k = FF_NGROUPS - 1; k >= 0; k--) {
        int wrc = ff_wait(&req[k]);
        if (rc == FF_OK)
            rc = wrc;
    }
    if (rc != FF_OK) { /* see check_one */
        fprintf(stderr, "fourfold: error: rank %d: %s\n", world_rank, ff_ctx_error(ctx));
        MPI_Abort(MPI_COMM_WORLD, CLI_FAIL);
    }
    long wrong = rc != FF_OK, gwrong;
    for (int k = 0; k < FF_NGROUPS; k++) {
        wrong += memcmp(buf[k], ref[k], c * sizeof(float)) != 0;
        free(buf[k]);
        free(ref[k]);
    }
    MPI_Allreduce(&wrong, &gwrong, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
    cli_print(
        "all groups at once: %d all-reduces in flight together, waited in reverse order: %s\n",
        FF_NGROUPS, gwrong ? "FAILED" : "ok");
    st->n_checks++;
    st->n_failed += gwrong != 0;
    return gwrong == 0;
}

static void print_grid(ff_ctx *ctx, ff_grid *grid)
{
    int size = ff_ctx_size(ctx);
    char desc[128], host[MPI_MAX_PROCESSOR_NAME] = {0};
    int len;
    ff_grid_describe(grid, desc, sizeof desc);
    cli_print("grid      %s\n", desc);
    MPI_Get_processor_name(host, &len);
    char *hosts = cli_world_rank() == 0 ? malloc((size_t)size * MPI_MAX_PROCESSOR_NAME) : NULL;
    MPI_Gather(host, MPI_MAX_PROCESSOR_NAME, MPI_CHAR, hosts, MPI_MAX_PROCESSOR_NAME, MPI_CHAR, 0,
               ff_ctx_comm(ctx));
    ff_dims s = ff_grid_shape(grid);
    const int G = ff_dims_product(s), staged = ff_grid_stages(grid) > 1;
    if (size <= 64) {
        cli_print("\n rank  %s x  y  z  d  host\n", staged ? "stage " : "");
        for (int i = 0; hosts && i < size; i++) {
            ff_dims c = ff_grid_coords_of(s, i % G); /* the stage is outermost */
            char stage[16] = "";
            if (staged)
                snprintf(stage, sizeof stage, "%5d ", i / G);
            cli_print("%5d  %s%2d %2d %2d %2d  %s\n", i, stage, c.x, c.y, c.z, c.d,
                      hosts + (size_t)i * MPI_MAX_PROCESSOR_NAME);
        }
    }
    free(hosts);
    cli_print("\ngroup  size  world ranks in rank 0's group\n");
    for (int k = 0; k < FF_NGROUPS; k++) {
        ff_group *g = ff_grid_group(grid, (ff_group_kind)k);
        int p = ff_group_size(g), me = cli_world_rank();
        int *members = malloc((size_t)p * sizeof(int));
        MPI_Allgather(&me, 1, MPI_INT, members, 1, MPI_INT, ff_group_comm(g));
        char line[512];
        size_t used = 0;
        for (int i = 0; i < p && used + 16 < sizeof line; i++)
            used += (size_t)snprintf(line + used, sizeof line - used, " %d", members[i]);
        if (used + 16 >= sizeof line)
            snprintf(line + used, sizeof line - used, " ...");
        cli_print("%-5s  %4d %s\n", ff_group_name(g), p, line);
        free(members);
    }
}

static const char help[] =
    "usage: mpirun -np N fourfold selftest [options]\n\n"
    "Builds the grid, prints every rank's coordinates and the groups, then checks\n"
    "all-gather, reduce-scatter, all-reduce and all-to-all on every group, with each\n"
    "algorithm and wire format, against the MPI library's blocking collective, and\n"
    "the byte counters against the ring volumes. Exits 1 if any check fails.\n\n"
    "options:\n"
    "  --count N         floats per rank per collective (default 1031)\n"
    "  --algo A          ring, mpi or all (default all)\n"
    "  --wire W          fp32, bf16 or all (default all)\n";

int cmd_selftest(int argc, char **argv)
{
    cli_run_opts run;
    cli_run_opts_default(&run);
    selftest st = {.count = 1031};
    const char *algo = "all", *wire = "all";
    cli_args a;
    cli_args_init(&a, argc, argv);
    while (cli_next(&a)) {
        int bad = 0;
        long v;
        if (cli_run_option(&a, &run, &bad)) {
            if (bad)
                return CLI_USAGE;
        } else if (cli_is(&a, "help")) {
            cli_print("%s%s", help, cli_run_help);
            return CLI_OK;
        } else if (cli_is(&a, "count")) {
            if (!cli_value(&a) || cli_parse_int("count", a.value, 1, 1L << 26, &v))
                return CLI_USAGE;
            st.count = (size_t)v;
        } else if (cli_is(&a, "algo")) {
            if (!(algo = cli_value(&a)))
                return CLI_USAGE;
        } else if (cli_is(&a, "wire")) {
            if (!(wire = cli_value(&a)))
                return CLI_USAGE;
        } else {
            return cli_unknown(&a, "selftest");
        }
    }
    st.algos[FF_ALGO_RING] = !strcmp(algo, "all") || !strcmp(algo, "ring");
    st.algos[FF_ALGO_MPI] = !strcmp(algo, "all") || !strcmp(algo, "mpi");
    st.wires[FF_WIRE_FP32] = !strcmp(wire, "all") || !strcmp(wire, "fp32");
    st.wires[FF_WIRE_BF16] = !strcmp(wire, "all") || !strcmp(wire, "bf16");
    if (!st.algos[FF_ALGO_RING] && !st.algos[FF_ALGO_MPI]) {
        cli_error("--algo %s: expected ring, mpi or all", algo);
        return CLI_USAGE;
    }
    if (!st.wires[FF_WIRE_FP32] && !st.wires[FF_WIRE_BF16]) {
        cli_error("--wire %s: expected fp32, bf16 or all", wire);
        return CLI_USAGE;
    }

    ff_ctx *ctx;
    ff_grid *grid;
    if (cli_setup(&run, &ctx, &grid) != CLI_OK)
        return CLI_FAIL;
    st.ctx = ctx;
    static const char *const modes[] = {"wait", "poll", "thread"};
    cli_print("fourfold %s selftest on %d ranks\n", FF_VERSION_STRING, ff_ctx_size(ctx));
    print_grid(ctx, grid);
    cli_print("\nprogress  %s; %zu floats per rank per collective; OpenBLAS core %s\n\n",
              modes[ff_ctx_progress_mode(ctx)], st.count, ff_blas_core());
    cli_print("%-5s %4s  %-14s %-4s %-4s %-5s %10s  %-14s %15s  %s\n", "group", "size",
              "collective", "algo", "wire", "place", "max |err|", "error", "bytes sent/recv",
              "result");

    ff_trace_begin(ctx, "selftest");
    for (int k = 0; k < FF_NGROUPS; k++) {
        ff_group *g = ff_grid_group(grid, (ff_group_kind)k);
        for (int coll = 0; coll < FF_NCOLL; coll++)
            for (int al = FF_ALGO_MPI; al < FF_NALGO; al++)
                for (int w = 0; w < 2; w++)
                    for (int ip = 0; ip < 2; ip++) {
                        int can_in_place = coll == FF_COLL_ALLGATHER || coll == FF_COLL_ALLREDUCE;
                        if (!st.algos[al] || !st.wires[w] || (ip && !can_in_place))
                            continue;
                        check_one(&st, g, (ff_coll)coll, (ff_algo)al, (ff_wire)w, ip);
                    }
    }
    cli_print("\n");
    check_concurrent(&st, ctx, grid);
    ff_trace_end(ctx);
    if (st.n_failed)
        cli_print("selftest: %d of %d checks FAILED\n", st.n_failed, st.n_checks);
    else
        cli_print("selftest: all %d checks passed\n", st.n_checks);
    return cli_teardown(&run, ctx, grid, st.n_failed ? CLI_FAIL : CLI_OK);
}
