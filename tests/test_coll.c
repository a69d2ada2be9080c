/* Every collective, on every group of every grid of the job's rank count,
 * against the MPI library's blocking collective; and the byte counters
 * against DESIGN §3.
 *
 *   usage: test_coll [wait|poll|thread]   (progress mode, default poll)
 *
 * fp32: inputs are small integers, so any summation order is exact and the
 * result must equal the reference bit for bit. bf16 wire: all-gather and
 * all-to-all must deliver exactly bf16(reference); reductions must lie within
 * p * 2^-8 * sum|x| (p roundings to bf16, unit roundoff 2^-8, of partial sums
 * bounded by sum|x|) plus 2p * 2^-24 * sum|x| for the fp32 reference itself.
 *
 * Counters, elements per rank for p ranks (ring, DESIGN §3): all-gather,
 * reduce-scatter and all-to-all send and receive (p-1)*count; all-reduce of n
 * divisible by p sends and receives 2(p-1)/p * n. A group of one counts
 * nothing. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "test_util.h"

enum { COUNT = 37, AR_COUNT = 840 /* divisible by 1..8 */ };

typedef struct {
    ff_ctx *ctx;
    int world_rank;
    int use_poll; /* complete by polling instead of ff_wait, alternately */
    long checks;
    double worst_bf16_ratio;
} env;

static float value(int rank, size_t i, int salt, ff_wire w)
{
    if (w == FF_WIRE_FP32)
        return (float)((rank * 29 + (int)i * 11 + salt * 5) % 23 - 11);
    return (float)cos(0.1 + rank * 0.77 + (double)i * 1.31 + salt);
}

static int post(ff_group *g, ff_coll coll, const float *s, float *r, size_t n, ff_coll_opts *o,
                ff_request **q)
{
    switch (coll) {
    case FF_COLL_ALLGATHER: return ff_iallgather(g, s, r, n, o, q);
    case FF_COLL_REDUCE_SCATTER: return ff_ireduce_scatter(g, s, r, n, o, q);
    case FF_COLL_ALLREDUCE: return ff_iallreduce(g, s, r, n, o, q);
    default: return ff_ialltoall(g, s, r, n, o, q);
    }
}

static void reference(MPI_Comm comm, ff_coll coll, const float *s, float *r, int n)
{
    switch (coll) {
    case FF_COLL_ALLGATHER: MPI_Allgather(s, n, MPI_FLOAT, r, n, MPI_FLOAT, comm); break;
    case FF_COLL_REDUCE_SCATTER: MPI_Reduce_scatter_block(s, r, n, MPI_FLOAT, MPI_SUM, comm); break;
    case FF_COLL_ALLREDUCE: MPI_Allreduce(s, r, n, MPI_FLOAT, MPI_SUM, comm); break;
    default: MPI_Alltoall(s, n, MPI_FLOAT, r, n, MPI_FLOAT, comm); break;
    }
}

static void run_one(env *e, const char *grid_name, ff_group *g, ff_coll coll, ff_algo algo,
                    ff_wire wire, int in_place)
{
    int p = ff_group_size(g), me = ff_group_rank(g);
    size_t n = coll == FF_COLL_ALLREDUCE ? AR_COUNT : COUNT;
    int spread_send = coll == FF_COLL_REDUCE_SCATTER || coll == FF_COLL_ALLTOALL;
    int spread_recv = coll == FF_COLL_ALLGATHER || coll == FF_COLL_ALLTOALL;
    size_t ns = spread_send ? p * n : n, nr = spread_recv ? p * n : n;
    float *in = malloc(ns * sizeof *in), *mag = malloc(ns * sizeof *mag);
    float *out = malloc(nr * sizeof *out), *want = malloc(nr * sizeof *want);
    float *bound = malloc(nr * sizeof *bound);
    for (size_t i = 0; i < ns; i++) {
        in[i] = value(e->world_rank, i, (int)coll, wire);
        mag[i] = fabsf(in[i]);
    }
    reference(ff_group_comm(g), coll, in, want, (int)n);
    int reduces = coll == FF_COLL_REDUCE_SCATTER || coll == FF_COLL_ALLREDUCE;
    if (reduces)
        reference(ff_group_comm(g), coll, mag, bound, (int)n);

    const float *src = in;
    if (in_place) {
        float *slot = coll == FF_COLL_ALLGATHER ? out + (size_t)me * n : out;
        memcpy(slot, in, n * sizeof *in);
        src = slot;
    }
    ff_coll_opts opt = {wire, algo};
    ff_counters c0 = ff_group_counters(g, coll);
    ff_request *req = NULL;
    int rc = post(g, coll, src, out, n, &opt, &req);
    if (rc == FF_OK && e->use_poll && (e->checks & 1)) {
        int done = 0;
        while (rc == FF_OK && !done) {
            ff_poll(e->ctx);
            rc = ff_test(req, &done);
        }
    }
    int wrc = ff_wait(&req);
    if (rc == FF_OK)
        rc = wrc;
    ff_counters c1 = ff_group_counters(g, coll);
    e->checks++;
#define WHAT                                                                                       \
    grid_name, ff_group_name(g), p, ff_coll_name(coll), ff_algo_name(algo),                        \
        wire == FF_WIRE_BF16 ? "bf16" : "fp32", in_place ? "in-place" : "out-of-place"
    CHECK(rc == FF_OK, "%s: grid %s group %s(%d) %s %s %s %s", ff_ctx_error(e->ctx), WHAT);

    long bad = 0;
    double worst = 0;
    const double u16 = ldexp(1.0, -8), u32 = ldexp(1.0, -24);
    for (size_t i = 0; rc == FF_OK && i < nr; i++) {
        double w = want[i], tol = 0;
        if (wire == FF_WIRE_BF16 && p > 1) {
            if (reduces)
                tol = (p * u16 + 2.0 * p * u32) * bound[i];
            else
                w = ff_bf16_to_float(ff_bf16_from_float(want[i]));
        }
        double err = fabs(out[i] - w);
        if (tol > 0 && err / tol > worst)
            worst = err / tol;
        bad += !(err <= tol);
    }
    if (worst > e->worst_bf16_ratio)
        e->worst_bf16_ratio = worst;
    if (bad) {
        test_failures++;
        fprintf(stderr, "FAIL rank %d: %ld wrong values: grid %s group %s(%d) %s %s %s %s\n",
                e->world_rank, bad, WHAT);
    }

    /* counters (DESIGN §3, elements -> bytes) */
    size_t es = wire == FF_WIRE_BF16 ? 2 : 4;
    uint64_t vol = p == 1                      ? 0
                   : coll == FF_COLL_ALLREDUCE ? (uint64_t)(2 * (p - 1) * n / p)
                                               : (uint64_t)((p - 1) * n);
    uint64_t sent = c1.bytes_sent - c0.bytes_sent, recv = c1.bytes_recv - c0.bytes_recv;
    if (sent != vol * es || recv != vol * es || c1.calls - c0.calls != (p > 1 ? 1u : 0u)) {
        test_failures++;
        fprintf(stderr,
                "FAIL rank %d: counters sent %llu recv %llu calls +%llu, want %llu bytes: grid %s "
                "group %s(%d) %s %s %s %s\n",
                e->world_rank, (unsigned long long)sent, (unsigned long long)recv,
                (unsigned long long)(c1.calls - c0.calls), (unsigned long long)(vol * es), WHAT);
    }
#undef WHAT
    free(in), free(mag), free(out), free(want), free(bound);
}

/* An all-reduce whose length does not divide by p: chunks differ by one and
 * the counts follow the ring exactly (every chunk but one, in each phase). */
static void run_uneven(env *e, const char *grid_name, ff_group *g)
{
    int p = ff_group_size(g), r = ff_group_rank(g);
    if (p == 1)
        return;
    size_t n = 1031;
    float *x = malloc(n * sizeof *x), *want = malloc(n * sizeof *want);
    for (size_t i = 0; i < n; i++)
        x[i] = value(e->world_rank, i, 9, FF_WIRE_FP32);
    MPI_Allreduce(x, want, (int)n, MPI_FLOAT, MPI_SUM, ff_group_comm(g));
    ff_counters c0 = ff_group_counters(g, FF_COLL_ALLREDUCE);
    ff_coll_opts opt = {FF_WIRE_FP32, FF_ALGO_RING};
    int rc = ff_allreduce(g, x, x, n, &opt);
    ff_counters c1 = ff_group_counters(g, FF_COLL_ALLREDUCE);
#define CHUNK(i) (n / p + ((size_t)(((i) % p + p) % p) < n % p))
    uint64_t sent = 4 * (2 * n - CHUNK(r) - CHUNK(r + 1));
    uint64_t recv = 4 * (2 * n - CHUNK(r - 1) - CHUNK(r));
#undef CHUNK
    CHECK(rc == FF_OK && memcmp(x, want, n * sizeof *x) == 0, "uneven all-reduce, grid %s group %s",
          grid_name, ff_group_name(g));
    CHECK(c1.bytes_sent - c0.bytes_sent == sent && c1.bytes_recv - c0.bytes_recv == recv,
          "uneven all-reduce counters grid %s group %s: %llu/%llu want %llu/%llu", grid_name,
          ff_group_name(g), (unsigned long long)(c1.bytes_sent - c0.bytes_sent),
          (unsigned long long)(c1.bytes_recv - c0.bytes_recv), (unsigned long long)sent,
          (unsigned long long)recv);
    free(x), free(want);
}

int main(int argc, char **argv)
{
    const char *mode = argc > 1 ? argv[1] : "poll";
    int thread = !strcmp(mode, "thread"), provided;
    MPI_Init_thread(&argc, &argv, thread ? MPI_THREAD_MULTIPLE : MPI_THREAD_FUNNELED, &provided);
    env e = {0};
    MPI_Comm_rank(MPI_COMM_WORLD, &e.world_rank);
    int size;
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    ff_ctx_options o;
    ff_ctx_options_default(&o);
    o.progress = thread                  ? FF_PROGRESS_THREAD
                 : !strcmp(mode, "wait") ? FF_PROGRESS_WAIT
                                         : FF_PROGRESS_POLL;
    o.poll_interval_s = 0;
    e.use_poll = o.progress == FF_PROGRESS_POLL;
    int rc = ff_ctx_create(&e.ctx, MPI_COMM_WORLD, &o);
    CHECK(rc == FF_OK, "ff_ctx_create: %s", ff_ctx_error(e.ctx));
    if (rc != FF_OK)
        MPI_Abort(MPI_COMM_WORLD, 1);

    ff_dims grids[64];
    int ng = test_all_grids(size, grids, 64);
    for (int gi = 0; gi < ng; gi++) {
        ff_dims s = grids[gi];
        char name[32];
        snprintf(name, sizeof name, "%dx%dx%dx%d", s.x, s.y, s.z, s.d);
        ff_grid *grid;
        if (ff_grid_create(e.ctx, s, &grid) != FF_OK) {
            CHECK(0, "grid %s: %s", name, ff_ctx_error(e.ctx));
            continue;
        }
        int failures_before = test_failures;
        long checks_before = e.checks;
        for (int k = 0; k < FF_NGROUPS; k++) {
            ff_group *g = ff_grid_group(grid, (ff_group_kind)k);
            for (int coll = 0; coll < FF_NCOLL; coll++)
                for (int algo = FF_ALGO_MPI; algo <= FF_ALGO_RING; algo++)
                    for (int wire = 0; wire < 2; wire++)
                        for (int ip = 0; ip < 2; ip++)
                            if (!ip || coll == FF_COLL_ALLGATHER || coll == FF_COLL_ALLREDUCE)
                                run_one(&e, name, g, (ff_coll)coll, (ff_algo)algo, (ff_wire)wire,
                                        ip);
            run_uneven(&e, name, g);
        }
        int local_bad = test_failures - failures_before, bad;
        MPI_Allreduce(&local_bad, &bad, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
        if (e.world_rank == 0)
            printf("grid %-8s progress %-6s %4ld collectives on 7 groups: %s\n", name, mode,
                   e.checks - checks_before, bad ? "FAILED" : "ok");
        ff_grid_destroy(grid);
    }
    double worst;
    MPI_Allreduce(&e.worst_bf16_ratio, &worst, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    if (e.world_rank == 0)
        printf("bf16 reductions: worst error %.3f of the bound p*2^-8*sum|x| + 2p*2^-24*sum|x|\n",
               worst);
    ff_ctx_destroy(e.ctx);
    int code = test_finish("coll");
    MPI_Finalize();
    return code;
}
