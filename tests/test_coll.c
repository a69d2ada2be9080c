/* Every collective, on every group of every grid of the job's rank count,
 * against the MPI library's blocking collective; and the byte counters
 * against docs/design.md §3 and §7.
 *
 *   usage: test_coll [wait|poll|thread]   (progress mode, default poll)
 *
 * fp32: inputs are small integers, so any summation order is exact and the
 * result must equal the reference bit for bit. bf16 wire: all-gather and
 * all-to-all must deliver exactly bf16(reference); reductions must lie within
 * ((1 + 2^-8)^p - 1) * sum|x| (at most p roundings to bf16, unit roundoff
 * 2^-8, of partial sums bounded by sum|x|; about p * 2^-8 * sum|x|) plus
 * 2p * 2^-24 * sum|x| for the fp32 reference's own error. All-gather and
 * all-reduce results must be bitwise identical on every rank of the group.
 *
 * Counters, elements per rank for p ranks (ring, docs/design.md §7): all-gather,
 * reduce-scatter and all-to-all send and receive (p-1)*count; all-reduce of n
 * divisible by p sends and receives 2(p-1)/p * n; for other n, every chunk
 * but one in each phase (chunks of n/p, the first n mod p one larger). A group
 * of one counts nothing.
 *
 * Also: the ring all-reduce's two halves (ff_iallreduce_half) against it,
 * and the gather phase on 2-byte values (ff_iallgather_half16);
 * all-reduce of lengths 1, p-1, p+1 and 1031 (empty and uneven chunks);
 * six mixed collectives in flight on one group, waited on in reverse order;
 * and, in poll mode, ring collectives driven to their last step by ff_poll()
 * alone (ff_test and ff_wait also progress, so they must not be used there). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "test_util.h"

enum { COUNT = 37, AR_COUNT = 840 /* divisible by 1..8 */ };

typedef struct {
    ff_ctx *ctx;
    int world_rank;
    int poll_mode;
    long checks;
    double worst_bf16_ratio;
} env;

typedef struct {
    ff_coll coll;
    ff_algo algo;
    ff_wire wire;
    int in_place;
    size_t n;
} spec;

static float value(int rank, size_t i, int salt, ff_wire w)
{
    if (w == FF_WIRE_FP32)
        return (float)((rank * 29 + (int)i * 11 + salt * 5) % 23 - 11);
    return (float)cos(0.1 + rank * 0.77 + (double)i * 1.31 + salt);
}

static int post(ff_group *g, const spec *s, const float *src, float *dst, ff_request **q)
{
    ff_coll_opts o = {s->wire, s->algo};
    switch (s->coll) {
    case FF_COLL_ALLGATHER: return ff_iallgather(g, src, dst, s->n, &o, q);
    case FF_COLL_REDUCE_SCATTER: return ff_ireduce_scatter(g, src, dst, s->n, &o, q);
    case FF_COLL_ALLREDUCE: return ff_iallreduce(g, src, dst, s->n, &o, q);
    default: return ff_ialltoall(g, src, dst, s->n, &o, q);
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

/* Elements this rank sends and receives (see the header comment). */
static void volume(ff_coll coll, int p, int r, size_t n, uint64_t *sent, uint64_t *recv)
{
    if (p == 1) {
        *sent = *recv = 0;
    } else if (coll != FF_COLL_ALLREDUCE) {
        *sent = *recv = (uint64_t)(p - 1) * n;
    } else if (n % (size_t)p == 0) { /* docs/design.md §3 as written */
        *sent = *recv = 2 * (uint64_t)(p - 1) * n / (uint64_t)p;
    } else {
#define CHUNK(i) (n / (size_t)p + ((size_t)(((i) % p + p) % p) < n % (size_t)p))
        *sent = 2 * n - CHUNK(r) - CHUNK(r + 1);
        *recv = 2 * n - CHUNK(r - 1) - CHUNK(r);
#undef CHUNK
    }
}

/* A collective's buffers, inputs and expected results. */
typedef struct {
    spec s;
    size_t ns, nr;
    float *in, *out, *want, *bound;
    const float *src;
} job;

static void job_init(job *j, const spec *s, ff_group *g, int world_rank, int salt)
{
    int p = ff_group_size(g);
    j->s = *s;
    int spread_send = s->coll == FF_COLL_REDUCE_SCATTER || s->coll == FF_COLL_ALLTOALL;
    int spread_recv = s->coll == FF_COLL_ALLGATHER || s->coll == FF_COLL_ALLTOALL;
    j->ns = spread_send ? p * s->n : s->n;
    j->nr = spread_recv ? p * s->n : s->n;
    j->in = malloc(j->ns * sizeof(float));
    float *mag = malloc(j->ns * sizeof(float));
    j->out = malloc(j->nr * sizeof(float));
    j->want = malloc(j->nr * sizeof(float));
    j->bound = calloc(j->nr, sizeof(float));
    for (size_t i = 0; i < j->ns; i++) {
        j->in[i] = value(world_rank, i, salt, s->wire);
        mag[i] = fabsf(j->in[i]);
    }
    reference(ff_group_comm(g), s->coll, j->in, j->want, (int)s->n);
    if (s->coll == FF_COLL_REDUCE_SCATTER || s->coll == FF_COLL_ALLREDUCE)
        reference(ff_group_comm(g), s->coll, mag, j->bound, (int)s->n);
    free(mag);
    j->src = j->in;
    if (s->in_place) {
        float *slot =
            s->coll == FF_COLL_ALLGATHER ? j->out + (size_t)ff_group_rank(g) * s->n : j->out;
        memcpy(slot, j->in, s->n * sizeof(float));
        j->src = slot;
    }
}

static void job_free(job *j) { free(j->in), free(j->out), free(j->want), free(j->bound); }

/* Checks a finished job; returns the number of failures found. */
static int job_check(env *e, const job *j, ff_group *g, const char *grid_name)
{
    const spec *s = &j->s;
    int p = ff_group_size(g), failures = 0;
    int reduces = s->coll == FF_COLL_REDUCE_SCATTER || s->coll == FF_COLL_ALLREDUCE;
    const double u16 = ldexp(1.0, -8), u32 = ldexp(1.0, -24);
    const double rel = expm1(p * log1p(u16)) + 2.0 * p * u32;
    long bad = 0;
    double worst = 0;
    for (size_t i = 0; i < j->nr; i++) {
        double w = j->want[i], tol = 0;
        if (s->wire == FF_WIRE_BF16 && p > 1) {
            if (reduces)
                tol = rel * j->bound[i];
            else
                w = ff_bf16_to_float(ff_bf16_from_float(j->want[i]));
        }
        double err = fabs(j->out[i] - w);
        if (tol > 0 && err / tol > worst)
            worst = err / tol;
        bad += !(err <= tol);
    }
    if (worst > e->worst_bf16_ratio)
        e->worst_bf16_ratio = worst;
#define WHAT                                                                                       \
    grid_name, ff_group_name(g), p, ff_coll_name(s->coll), ff_algo_name(s->algo),                  \
        s->wire == FF_WIRE_BF16 ? "bf16" : "fp32", s->in_place ? "in-place" : "out-of-place", s->n
    if (bad) {
        failures++;
        fprintf(stderr, "FAIL rank %d: %ld wrong values: grid %s group %s(%d) %s %s %s %s n=%zu\n",
                e->world_rank, bad, WHAT);
    }
    /* replicas: the same bits on every rank (AND == OR over the group) */
    if (s->coll == FF_COLL_ALLGATHER || s->coll == FF_COLL_ALLREDUCE) {
        size_t nw = j->nr;
        unsigned *and_ = malloc(nw * sizeof *and_), *or_ = malloc(nw * sizeof *or_);
        MPI_Allreduce(j->out, and_, (int)nw, MPI_UNSIGNED, MPI_BAND, ff_group_comm(g));
        MPI_Allreduce(j->out, or_, (int)nw, MPI_UNSIGNED, MPI_BOR, ff_group_comm(g));
        if (memcmp(and_, or_, nw * sizeof *and_) != 0) {
            failures++;
            fprintf(stderr,
                    "FAIL rank %d: replicas differ: grid %s group %s(%d) %s %s %s %s n=%zu\n",
                    e->world_rank, WHAT);
        }
        free(and_), free(or_);
    }
#undef WHAT
    return failures;
}

/* Drives a posted ring collective with ff_poll() only, until every step has
 * been posted (the byte counters reach the full volume); a no-op ff_poll
 * would never get there. 20 s is only a guard against a hang; after one
 * failure the other collectives are waited on normally. */
static int poll_until_posted(env *e, ff_group *g, ff_coll coll, uint64_t sent_before,
                             uint64_t want_sent)
{
    double t0 = ff_now();
    while (ff_group_counters(g, coll).bytes_sent - sent_before < want_sent) {
        ff_poll(e->ctx);
        if (ff_now() - t0 > 20) {
            e->poll_mode = 0;
            return 0;
        }
    }
    return 1;
}

static void run_one(env *e, const char *grid_name, ff_group *g, const spec *s)
{
    int p = ff_group_size(g);
    job j;
    job_init(&j, s, g, e->world_rank, (int)s->coll);
    ff_counters c0 = ff_group_counters(g, s->coll);
    uint64_t vs, vr, es = s->wire == FF_WIRE_BF16 ? 2 : 4;
    volume(s->coll, p, ff_group_rank(g), s->n, &vs, &vr);
    ff_request *req = NULL;
    int rc = post(g, s, j.src, j.out, &req);
    e->checks++;
    if (rc == FF_OK && e->poll_mode && s->algo == FF_ALGO_RING && (e->checks & 1))
        CHECK(poll_until_posted(e, g, s->coll, c0.bytes_sent, vs * es),
              "ff_poll alone did not advance %s on group %s", ff_coll_name(s->coll),
              ff_group_name(g));
    int wrc = ff_wait(&req);
    if (rc == FF_OK)
        rc = wrc;
    ff_counters c1 = ff_group_counters(g, s->coll);
    CHECK(rc == FF_OK, "grid %s group %s %s: %s", grid_name, ff_group_name(g),
          ff_coll_name(s->coll), ff_ctx_error(e->ctx));
    if (rc != FF_OK)
        MPI_Abort(MPI_COMM_WORLD, 1); /* the group's peers would wait forever */
    test_failures += job_check(e, &j, g, grid_name);

    uint64_t sent = c1.bytes_sent - c0.bytes_sent, recv = c1.bytes_recv - c0.bytes_recv;
    uint64_t calls = c1.calls - c0.calls;
    if (sent != vs * es || recv != vr * es || calls != (p > 1 ? 1u : 0u)) {
        test_failures++;
        fprintf(stderr,
                "FAIL rank %d: counters sent %llu recv %llu calls +%llu, want %llu/%llu: grid %s "
                "group %s(%d) %s %s n=%zu\n",
                e->world_rank, (unsigned long long)sent, (unsigned long long)recv,
                (unsigned long long)calls, (unsigned long long)(vs * es),
                (unsigned long long)(vr * es), grid_name, ff_group_name(g), p,
                ff_coll_name(s->coll), ff_algo_name(s->algo), s->n);
    }
    job_free(&j);
}

/* Six collectives in flight on one group at once (mixed kinds, algorithms
 * and wires), one of them tested to completion, then all waited on in
 * reverse order: tags must keep their messages apart. */
static void run_many(env *e, const char *grid_name, ff_group *g)
{
    const spec specs[] = {
        {FF_COLL_ALLGATHER, FF_ALGO_RING, FF_WIRE_FP32, 0, 37},
        {FF_COLL_ALLREDUCE, FF_ALGO_RING, FF_WIRE_FP32, 1, 101},
        {FF_COLL_REDUCE_SCATTER, FF_ALGO_MPI, FF_WIRE_FP32, 0, 19},
        {FF_COLL_ALLTOALL, FF_ALGO_RING, FF_WIRE_BF16, 0, 23},
        {FF_COLL_ALLREDUCE, FF_ALGO_MPI, FF_WIRE_BF16, 0, 57},
        {FF_COLL_REDUCE_SCATTER, FF_ALGO_RING, FF_WIRE_FP32, 0, 41},
    };
    enum { N = sizeof specs / sizeof specs[0] };
    job jobs[N];
    ff_request *req[N] = {0};
    int rc = FF_OK;
    for (int i = 0; i < N; i++)
        job_init(&jobs[i], &specs[i], g, e->world_rank, 100 + i);
    for (int i = 0; i < N && rc == FF_OK; i++)
        rc = post(g, &specs[i], jobs[i].src, jobs[i].out, &req[i]);
    for (int done = 0; rc == FF_OK && !done;)
        rc = ff_test(req[2], &done);
    for (int i = N - 1; i >= 0; i--) {
        int wrc = ff_wait(&req[i]);
        if (rc == FF_OK)
            rc = wrc;
    }
    CHECK(rc == FF_OK, "grid %s group %s, six in flight: %s", grid_name, ff_group_name(g),
          ff_ctx_error(e->ctx));
    if (rc != FF_OK)
        MPI_Abort(MPI_COMM_WORLD, 1);
    for (int i = 0; i < N; i++) {
        test_failures += job_check(e, &jobs[i], g, grid_name);
        job_free(&jobs[i]);
    }
    e->checks += N;
}

/* ff_iallreduce_half (ZeRO over D): the reduce phase then the gather phase
 * give the ring all-reduce's bits (non-integer inputs: the order of the
 * sums matters), the reduce phase alone the rank's chunk of it; counters
 * every chunk but the rank's (reduce-scatter sent) or the next one's
 * (all-gather sent); the MPI algorithm and the bf16 wire refused. */
static void run_halves(env *e, const char *grid_name, ff_group *g)
{
    const int p = ff_group_size(g), r = ff_group_rank(g);
    const size_t lengths[] = {1, (size_t)(p > 1 ? p - 1 : 1), (size_t)p + 1, 1031, AR_COUNT};
    for (int li = 0; li < 5; li++) {
        const size_t n = lengths[li];
        float *half = malloc(n * sizeof(float)), *whole = malloc(n * sizeof(float));
        for (size_t i = 0; i < n; i++)
            half[i] = whole[i] = value(r, i, 7, FF_WIRE_BF16);
        ff_coll_opts ring = {FF_WIRE_FP32, FF_ALGO_RING};
        ff_request *q = NULL;
        int rc = ff_iallreduce(g, whole, whole, n, &ring, &q);
        if (rc == FF_OK)
            rc = ff_wait(&q);
        ff_group_counters_reset(g);
        if (rc == FF_OK && (rc = ff_iallreduce_half(g, half, n, 0, NULL, &q)) == FF_OK)
            rc = ff_wait(&q);
        const size_t c0 =
            n / (size_t)p * (size_t)r + ((size_t)r < n % (size_t)p ? (size_t)r : n % (size_t)p);
        const size_t cl = n / (size_t)p + ((size_t)r < n % (size_t)p);
        CHECK(rc || !memcmp(half + c0, whole + c0, cl * sizeof(float)),
              "grid %s group %s n=%zu: the reduce phase's chunk is not the all-reduce's", grid_name,
              ff_group_name(g), n);
        if (rc == FF_OK && (rc = ff_iallreduce_half(g, half, n, 1, &ring, &q)) == FF_OK)
            rc = ff_wait(&q);
        CHECK(rc == FF_OK && !memcmp(half, whole, n * sizeof(float)),
              "grid %s group %s n=%zu: the two halves are not the ring all-reduce (rc %d)",
              grid_name, ff_group_name(g), n, rc);
        uint64_t ar_sent, ar_recv;
        volume(FF_COLL_ALLREDUCE, p, r, n, &ar_sent, &ar_recv);
        const ff_counters rs = ff_group_counters(g, FF_COLL_REDUCE_SCATTER);
        const ff_counters ag = ff_group_counters(g, FF_COLL_ALLGATHER);
#define CHUNK(i) (n / (size_t)p + ((size_t)(((i) % p + p) % p) < n % (size_t)p))
        const uint64_t want[4] = {
            p > 1 ? 4 * (n - CHUNK(r)) : 0, p > 1 ? 4 * (n - CHUNK(r - 1)) : 0,
            p > 1 ? 4 * (n - CHUNK(r + 1)) : 0, p > 1 ? 4 * (n - CHUNK(r)) : 0};
#undef CHUNK
        CHECK(rs.bytes_sent == want[0] && rs.bytes_recv == want[1] && ag.bytes_sent == want[2] &&
                  ag.bytes_recv == want[3] && rs.bytes_sent + ag.bytes_sent == 4 * ar_sent &&
                  rs.calls == (p > 1) && ag.calls == (p > 1),
              "grid %s group %s n=%zu: halves counted RS %llu/%llu AG %llu/%llu bytes, want "
              "%llu/%llu %llu/%llu",
              grid_name, ff_group_name(g), n, (unsigned long long)rs.bytes_sent,
              (unsigned long long)rs.bytes_recv, (unsigned long long)ag.bytes_sent,
              (unsigned long long)ag.bytes_recv, (unsigned long long)want[0],
              (unsigned long long)want[1], (unsigned long long)want[2],
              (unsigned long long)want[3]);
        e->checks++;
        /* the gather phase on 2-byte values (ff_iallgather_half16): chunk
         * q of every rank is rank q's, the bits as they were; 2 bytes an
         * element, the fp32 gather phase's elements */
        uint16_t *h16 = malloc(n * sizeof *h16);
        for (size_t i = 0; i < n; i++)
            h16[i] = i >= c0 && i < c0 + cl ? (uint16_t)(0x8000u ^ (r * 7919u + i)) : 0x7fc1;
        ff_group_counters_reset(g);
        if (rc == FF_OK && (rc = ff_iallgather_half16(g, h16, n, &q)) == FF_OK)
            rc = ff_wait(&q);
        size_t bad = n;
        for (size_t i = 0, owner = 0; rc == FF_OK && i < n && bad == n; i++) {
            while (owner + 1 < (size_t)p &&
                   i >= n / (size_t)p * (owner + 1) +
                            (owner + 1 < n % (size_t)p ? owner + 1 : n % (size_t)p))
                owner++;
            if (h16[i] != (uint16_t)(0x8000u ^ (owner * 7919u + i)))
                bad = i;
        }
        const ff_counters ag16 = ff_group_counters(g, FF_COLL_ALLGATHER);
        CHECK(rc == FF_OK && bad == n && ag16.bytes_sent == want[2] / 2 &&
                  ag16.bytes_recv == want[3] / 2 && ag16.calls == (p > 1),
              "grid %s group %s n=%zu: the 2-byte gather phase wrong at %zu, or counted %llu/%llu "
              "bytes (rc %d)",
              grid_name, ff_group_name(g), n, bad, (unsigned long long)ag16.bytes_sent,
              (unsigned long long)ag16.bytes_recv, rc);
        free(h16);
        free(half), free(whole);
    }
    if (p > 1) { /* only the ring on the fp32 wire: refused alike on every rank */
        float x[4] = {0, 0, 0, 0};
        ff_request *q = NULL;
        ff_coll_opts mpi = {FF_WIRE_FP32, FF_ALGO_MPI}, bf16 = {FF_WIRE_BF16, FF_ALGO_RING};
        CHECK(ff_iallreduce_half(g, x, 4, 0, &mpi, &q) == FF_EUNSUPPORTED && !q &&
                  ff_iallreduce_half(g, x, 4, 1, &bf16, &q) == FF_EUNSUPPORTED && !q,
              "grid %s group %s: half an all-reduce by MPI or on bf16 not refused", grid_name,
              ff_group_name(g));
    }
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
    e.poll_mode = o.progress == FF_PROGRESS_POLL;
    int rc = ff_ctx_create(&e.ctx, MPI_COMM_WORLD, &o);
    CHECK(rc == FF_OK, "ff_ctx_create: %s", ff_ctx_error(e.ctx));
    if (rc != FF_OK)
        MPI_Abort(MPI_COMM_WORLD, 1);

    enum { MAX_GRIDS = 128 };
    ff_dims grids[MAX_GRIDS];
    int ng = test_all_grids(size, grids, MAX_GRIDS);
    CHECK(ng <= MAX_GRIDS, "%d grids of %d ranks, only %d checked", ng, size, MAX_GRIDS);
    if (ng > MAX_GRIDS)
        ng = MAX_GRIDS;
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
            int p = ff_group_size(g);
            for (int coll = 0; coll < FF_NCOLL; coll++)
                for (int algo = FF_ALGO_MPI; algo <= FF_ALGO_RING; algo++)
                    for (int wire = 0; wire < 2; wire++)
                        for (int ip = 0; ip < 2; ip++) {
                            if (ip && coll != FF_COLL_ALLGATHER && coll != FF_COLL_ALLREDUCE)
                                continue;
                            spec sp = {(ff_coll)coll, (ff_algo)algo, (ff_wire)wire, ip,
                                       coll == FF_COLL_ALLREDUCE ? AR_COUNT : COUNT};
                            run_one(&e, name, g, &sp);
                        }
            /* all-reduce with empty chunks (n < p) and uneven ones */
            const size_t lengths[] = {1, (size_t)(p > 1 ? p - 1 : 1), (size_t)p + 1, 1031};
            for (int li = 0; li < 4; li++)
                for (int algo = FF_ALGO_MPI; algo <= FF_ALGO_RING; algo++)
                    for (int wire = 0; wire < 2; wire++)
                        for (int ip = 0; ip < 2; ip++) {
                            spec sp = {FF_COLL_ALLREDUCE, (ff_algo)algo, (ff_wire)wire, ip,
                                       lengths[li]};
                            run_one(&e, name, g, &sp);
                        }
            run_many(&e, name, g);
            run_halves(&e, name, g);
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
        printf(
            "bf16 reductions: worst error %.3f of the bound ((1+2^-8)^p - 1 + 2p*2^-24)*sum|x|\n",
            worst);
    ff_ctx_destroy(e.ctx);
    int code = test_finish("coll");
    MPI_Finalize();
    return code;
}
