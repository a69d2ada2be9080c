/* The collective algorithms of issue 7 (recursive, hierarchical, and the
 * AUTO choice) on every group size 1..P, where P is the job's rank count
 * (CTest runs 9), against the MPI library's blocking collective.
 *
 *   usage: test_coll_algos [wait|poll|thread]     (default poll)
 *   FF_RANKS_PER_NODE=k pretends nodes of k consecutive ranks (CTest: 2, 3);
 *   without it the nodes are the MPI library's shared-memory domains, found
 *   here independently of the library (one on a single machine; the emulated
 *   cluster's nodes under the external cluster emulator, docs/design.md §8)
 *
 * Groups: for each p, ranks 0..p-1 in order ("contiguous"), and for p >= 3
 * the same ranks with the even ones first ("interleaved"), so that a node's
 * ranks are not consecutive in the group and the hierarchical algorithms
 * must reorder. With k = 2 or 3 the groups span 1 to 5 nodes, regular (every
 * node holding the same number of the group's ranks, e.g. p = 4, 6, 8 with k
 * = 2: 2, 3, 4 nodes; p = 6, 9 with k = 3: 2, 3 nodes) or not (which must
 * run the flat algorithm, and count its bytes).
 *
 * Per group: all-gather, reduce-scatter, all-reduce; algorithms ring, rec,
 * hier-ring, hier-rec, rec-whole (all-reduce only), direct, auto; fp32 and bf16
 * wire; in and out of place; several counts (all-reduce: 1, p-1, p+1, 4p,
 * 1031: empty and uneven chunks).
 * Checked: fp32 results bitwise equal to the MPI library's (integer inputs:
 * every summation order is exact); bf16 all-gather exactly bf16(x);
 * bf16 reductions within ((1+2^-8)^p - 1 + 2p 2^-24) sum|x| (each algorithm
 * rounds a contribution at most p times: ring p-1 sends + 1, recursive lg p
 * + 2, direct 2, hierarchical (k-1) + lg N + 2 or (k-1) + (N-1) + 1); replicas of
 * all-gather and all-reduce bitwise identical; the byte counters equal to the
 * volume derived below from each algorithm's definition (not from the
 * library's code), their sum over the group's ranks sent == received; AUTO's
 * counters, with the default rule, equal to the ring's whatever it picks,
 * except for an all-reduce it runs as rec-whole, which the planner
 * predicts (docs/design.md §7; tests/test_plan_vs_run.c); with FF_STRICT_VOLUME=0
 * (CTest: the np6 run) it may move other bytes. Every run must see AUTO
 * pick rec-whole somewhere (the short all-reduces, on 3 or more ranks).
 * Also: mixed algorithms in flight at once on one group,
 * waited in reverse order; in poll mode, half of the collectives driven to
 * their last step by ff_poll() alone. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "test_util.h"

typedef struct {
    ff_ctx *ctx;
    int world_rank, world_size, per_node, poll_mode;
    int strict;      /* FF_STRICT_VOLUME is not 0 */
    long auto_whole; /* AUTO calls that ran rec-whole */
    int node_of[64]; /* world rank -> an id of its node, found independently */
    long checks;
    double worst_bf16_ratio;
} env;

static float value(int rank, size_t i, int salt, ff_wire w)
{
    if (w == FF_WIRE_FP32)
        return (float)((rank * 29 + (int)i * 11 + salt * 5) % 23 - 11);
    return (float)cos(0.1 + rank * 0.77 + (double)i * 1.31 + salt);
}

/* ---- expected volumes (elements), from each algorithm's definition ----
 * Blocks b[0..n) of a phase (lengths), total T. */

typedef struct {
    uint64_t sent, recv;
} vol;

static uint64_t sum_range(const size_t *b, int from, int to)
{
    uint64_t s = 0;
    for (int i = from; i < to; i++)
        s += b[i];
    return s;
}

/* Ring over n participants; me's share. kind: 0 AG, 1 RS, 2 AR (RS then AG).
 * RS sends every block but me, receives every block but me-1; AG sends
 * every block but me+1, receives every block but me. */
static vol ring_vol(int kind, int n, int me, const size_t *b)
{
    vol v = {0, 0};
    if (n <= 1)
        return v;
    uint64_t T = sum_range(b, 0, n);
#define B(i) b[(((i) % n) + n) % n]
    if (kind != 0) { /* reduce-scatter */
        v.sent += T - B(me);
        v.recv += T - B(me - 1);
    }
    if (kind != 1) { /* all-gather */
        v.sent += T - B(me + 1);
        v.recv += T - B(me);
    }
#undef B
    return v;
}

/* n = pof2 + rem with pof2 = 2^L the largest power of two <= n. */
static int floor_pow2(int n, int *L)
{
    int pof2 = 1;
    for (*L = 0; pof2 * 2 <= n; (*L)++)
        pof2 *= 2;
    return pof2;
}

/* Recursive doubling/halving with the fold (n = 2^L + rem: the first 2 rem
 * participants pair up, the even one is the "extra"; virtual rank w owns
 * participants 2w, 2w+1 if w < rem, else w + rem). R_l = the elements of the
 * aligned run of 2^l virtual ranks containing me's, W = R_0, T = all.
 *   AG: extra sends its block, receives T - own; the others receive T - W
 *       (plus the extra's block for a partner), send sum_{l<L} R_l (plus,
 *       for a partner, T minus the extra's block, its fold out).
 *   RS: extra sends T, receives its block; others receive sum_{l<L} R_l
 *       (partner: + T), send T - W (partner: + the extra's block).
 *   AR: RS without fold out, then AG without fold in, with a fold out of T:
 *       extra sends T and receives T. */
static vol rec_vol(int kind, int n, int me, const size_t *b)
{
    vol v = {0, 0};
    if (n <= 1)
        return v;
    int L, pof2 = floor_pow2(n, &L), rem = n - pof2;
    uint64_t T = sum_range(b, 0, n);
    if (me < 2 * rem && me % 2 == 0) { /* extra */
        if (kind == 0)
            v.sent = b[me], v.recv = T - b[me];
        else if (kind == 1)
            v.sent = T, v.recv = b[me];
        else
            v.sent = T, v.recv = T;
        return v;
    }
    int w = me < 2 * rem ? me / 2 : me - rem, partner = me < 2 * rem;
#define LO(x) ((x) >= pof2 ? n : (x) < rem ? 2 * (x) : (x) + rem)
    uint64_t sumR = 0, W = sum_range(b, LO(w), LO(w + 1));
    for (int l = 0; l < L; l++) {
        int a = w & ~((1 << l) - 1);
        sumR += sum_range(b, LO(a), LO(a + (1 << l)));
    }
#undef LO
    uint64_t ex = partner ? b[me - 1] : 0;
    if (kind == 0 || kind == 2) { /* all-gather part */
        v.recv += T - W + (kind == 0 ? ex : 0);
        v.sent += sumR + (partner ? (kind == 0 ? T - ex : T) : 0);
    }
    if (kind == 1 || kind == 2) { /* reduce-scatter part */
        v.recv += sumR + (partner ? T : 0);
        v.sent += T - W + (kind == 1 ? ex : 0);
    }
    return v;
}

/* rec-whole: the fold and the lg p steps each move the whole vector (T
 * elements) once each way; the extra sends T and receives T, its partner
 * also receives T (fold in) and sends T (fold out). */
static vol whole_vol(int n, int me, uint64_t T)
{
    vol v = {0, 0};
    if (n <= 1)
        return v;
    int L, pof2 = floor_pow2(n, &L), rem = n - pof2;
    if (me < 2 * rem && me % 2 == 0) {
        v.sent = v.recv = T;
        return v;
    }
    v.sent = v.recv = (uint64_t)L * T + (me < 2 * rem ? T : 0);
    return v;
}

/* direct: one message with every other participant. RS sends each its
 * block (T - own) and receives n-1 contributions to its own; AG sends its
 * block to n-1 and receives all the others (T - own). */
static vol direct_vol(int kind, int n, int me, const size_t *b)
{
    vol v = {0, 0};
    if (n <= 1)
        return v;
    uint64_t T = sum_range(b, 0, n), mine = b[me] * (uint64_t)(n - 1);
    if (kind != 0)
        v.sent += T - b[me], v.recv += mine;
    if (kind != 1)
        v.sent += mine, v.recv += T - b[me];
    return v;
}

static size_t chunk(size_t n, int p, int i) { return n / (size_t)p + ((size_t)i < n % (size_t)p); }

/* The group's nodes as the library should see them: node ids of the world
 * ranks (node_of), nodes numbered by first appearance in group order, local
 * index by group rank. */
typedef struct {
    int N, k, j, i; /* k = 0 if irregular */
    int member[64];
} layout;

static layout layout_of(const int *world_of, int p, int me, const int *node_of)
{
    layout l = {0, 0, 0, 0, {0}};
    int node_id[64], count[64] = {0}, nd[64];
    for (int r = 0; r < p; r++) {
        int id = node_of[world_of[r]], j;
        for (j = 0; j < l.N && node_id[j] != id; j++)
            ;
        if (j == l.N)
            node_id[l.N++] = id;
        nd[r] = j;
        count[j]++;
    }
    l.k = count[0];
    for (int j = 1; j < l.N; j++)
        if (count[j] != l.k)
            l.k = 0;
    int seen[64] = {0};
    for (int r = 0; r < p && l.k; r++) {
        int j = nd[r], i = seen[j]++;
        l.member[j * l.k + i] = r;
        if (r == me)
            l.j = j, l.i = i;
    }
    return l;
}

/* Elements this rank sends/receives: coll 0 AG, 1 RS, 2 AR. */
static vol expected(ff_algo algo, int coll, int p, int me, size_t n, const layout *l)
{
    vol v = {0, 0};
    size_t b[64];
    if (p == 1)
        return v;
    if (algo == FF_ALGO_REC_WHOLE)
        return whole_vol(p, me, n);
    if ((algo == FF_ALGO_HIER_RING || algo == FF_ALGO_HIER_REC) && l->k == 0)
        algo = algo == FF_ALGO_HIER_REC ? FF_ALGO_REC : FF_ALGO_RING;
    if (algo == FF_ALGO_RING || algo == FF_ALGO_REC || algo == FF_ALGO_DIRECT) {
        for (int i = 0; i < p; i++)
            b[i] = coll == 2 ? chunk(n, p, i) : n;
        return algo == FF_ALGO_RING  ? ring_vol(coll, p, me, b)
               : algo == FF_ALGO_REC ? rec_vol(coll, p, me, b)
                                     : direct_vol(coll, p, me, b);
    }
    /* hierarchical: stage position of rank (j, i) is i*N + j */
    int N = l->N, k = l->k, rec = algo == FF_ALGO_HIER_REC;
    size_t intra[64], inter[64];
    for (int ii = 0; ii < k; ii++) {
        intra[ii] = 0;
        for (int jj = 0; jj < N; jj++)
            intra[ii] += coll == 2 ? chunk(n, p, ii * N + jj) : n;
    }
    for (int jj = 0; jj < N; jj++)
        inter[jj] = coll == 2 ? chunk(n, p, l->i * N + jj) : n;
    vol a = ring_vol(coll, k, l->i, intra);
    vol e = rec ? rec_vol(coll, N, l->j, inter) : ring_vol(coll, N, l->j, inter);
    v.sent = a.sent + e.sent;
    v.recv = a.recv + e.recv;
    return v;
}

/* ---- one collective ---- */

typedef struct {
    int coll; /* 0 AG, 1 RS, 2 AR */
    ff_algo algo;
    ff_wire wire;
    int in_place;
    size_t n;
} spec;

static const ff_coll colls[3] = {FF_COLL_ALLGATHER, FF_COLL_REDUCE_SCATTER, FF_COLL_ALLREDUCE};

typedef struct {
    spec s;
    size_t ns, nr;
    float *in, *out, *want, *bound;
    const float *src;
} job;

static void job_init(job *j, const spec *s, ff_group *g, int world_rank, int salt)
{
    int p = ff_group_size(g), r = ff_group_rank(g);
    MPI_Comm comm = ff_group_comm(g);
    j->s = *s;
    j->ns = s->coll == 1 ? p * s->n : s->n;
    j->nr = s->coll == 0 ? p * s->n : s->n;
    j->in = malloc(j->ns * sizeof(float));
    float *mag = malloc(j->ns * sizeof(float));
    j->out = malloc(j->nr * sizeof(float));
    j->want = malloc(j->nr * sizeof(float));
    j->bound = calloc(j->nr, sizeof(float));
    for (size_t i = 0; i < j->ns; i++) {
        j->in[i] = value(world_rank, i, salt, s->wire);
        mag[i] = fabsf(j->in[i]);
    }
    int n = (int)s->n;
    if (s->coll == 0) {
        MPI_Allgather(j->in, n, MPI_FLOAT, j->want, n, MPI_FLOAT, comm);
    } else if (s->coll == 1) {
        MPI_Reduce_scatter_block(j->in, j->want, n, MPI_FLOAT, MPI_SUM, comm);
        MPI_Reduce_scatter_block(mag, j->bound, n, MPI_FLOAT, MPI_SUM, comm);
    } else {
        MPI_Allreduce(j->in, j->want, n, MPI_FLOAT, MPI_SUM, comm);
        MPI_Allreduce(mag, j->bound, n, MPI_FLOAT, MPI_SUM, comm);
    }
    free(mag);
    j->src = j->in;
    if (s->in_place) {
        float *slot = s->coll == 0 ? j->out + (size_t)r * s->n : j->out;
        memcpy(slot, j->in, s->n * sizeof(float));
        j->src = slot;
    }
}

static void job_free(job *j) { free(j->in), free(j->out), free(j->want), free(j->bound); }

static int post(ff_group *g, const spec *s, const float *src, float *dst, ff_request **q)
{
    ff_coll_opts o = {s->wire, s->algo};
    switch (s->coll) {
    case 0: return ff_iallgather(g, src, dst, s->n, &o, q);
    case 1: return ff_ireduce_scatter(g, src, dst, s->n, &o, q);
    default: return ff_iallreduce(g, src, dst, s->n, &o, q);
    }
}

static const char *coll_short[3] = {"allgather", "reduce_scatter", "allreduce"};

static int job_check(env *e, const job *j, ff_group *g, const char *gname)
{
    const spec *s = &j->s;
    int p = ff_group_size(g), failures = 0;
    const double rel = expm1(p * log1p(ldexp(1.0, -8))) + 2.0 * p * ldexp(1.0, -24);
    long bad = 0;
    double worst = 0;
    for (size_t i = 0; i < j->nr; i++) {
        double w = j->want[i], tol = 0;
        if (s->wire == FF_WIRE_BF16 && p > 1) {
            if (s->coll != 0)
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
    gname, p, coll_short[s->coll], ff_algo_name(s->algo),                                          \
        s->wire == FF_WIRE_BF16 ? "bf16" : "fp32", s->in_place ? "in-place" : "out-of-place", s->n
    if (bad) {
        failures++;
        fprintf(stderr, "FAIL rank %d: %ld wrong values: group %s(%d) %s %s %s %s n=%zu\n",
                e->world_rank, bad, WHAT);
    }
    if (s->coll != 1) { /* replicas: AND == OR over the group */
        unsigned *and_ = malloc(j->nr * sizeof *and_), *or_ = malloc(j->nr * sizeof *or_);
        MPI_Allreduce(j->out, and_, (int)j->nr, MPI_UNSIGNED, MPI_BAND, ff_group_comm(g));
        MPI_Allreduce(j->out, or_, (int)j->nr, MPI_UNSIGNED, MPI_BOR, ff_group_comm(g));
        if (memcmp(and_, or_, j->nr * sizeof *and_) != 0) {
            failures++;
            fprintf(stderr, "FAIL rank %d: replicas differ: group %s(%d) %s %s %s %s n=%zu\n",
                    e->world_rank, WHAT);
        }
        free(and_), free(or_);
    }
#undef WHAT
    return failures;
}

typedef struct {
    const char *name;
    ff_group *g;
    layout l;
} group_info;

static void run_one(env *e, group_info *gi, const spec *s, int salt)
{
    ff_group *g = gi->g;
    int p = ff_group_size(g), r = ff_group_rank(g);
    ff_coll coll = colls[s->coll];
    uint64_t es = s->wire == FF_WIRE_BF16 ? 2 : 4;
    ff_algo ran = s->algo == FF_ALGO_AUTO ? ff_coll_choose(g, coll, s->n, s->wire) : s->algo;
    vol want = expected(ran, s->coll, p, r, s->n, &gi->l);
    job j;
    job_init(&j, s, g, e->world_rank, salt);
    ff_counters c0 = ff_group_counters(g, coll);
    ff_request *req = NULL;
    int rc = post(g, s, j.src, j.out, &req);
    e->checks++;
    if (rc == FF_OK && e->poll_mode && (e->checks & 1)) {
        double t0 = ff_now();
        while (ff_group_counters(g, coll).bytes_sent - c0.bytes_sent < want.sent * es) {
            ff_poll(e->ctx);
            if (ff_now() - t0 > 20) {
                CHECK(0, "ff_poll alone did not advance %s %s on group %s", coll_short[s->coll],
                      ff_algo_name(s->algo), gi->name);
                e->poll_mode = 0;
                break;
            }
        }
    }
    int wrc = ff_wait(&req);
    if (rc == FF_OK)
        rc = wrc;
    CHECK(rc == FF_OK, "group %s %s %s: %s", gi->name, coll_short[s->coll], ff_algo_name(s->algo),
          ff_ctx_error(e->ctx));
    if (rc != FF_OK)
        MPI_Abort(MPI_COMM_WORLD, 1); /* the group's peers would wait forever */
    test_failures += job_check(e, &j, g, gi->name);
    ff_counters c1 = ff_group_counters(g, coll);
    uint64_t sent = c1.bytes_sent - c0.bytes_sent, recv = c1.bytes_recv - c0.bytes_recv;
    if (sent != want.sent * es || recv != want.recv * es || c1.calls - c0.calls != (p > 1)) {
        test_failures++;
        fprintf(stderr,
                "FAIL rank %d: counters sent %llu recv %llu, want %llu/%llu: group %s(%d) %s %s "
                "(ran %s) %s n=%zu\n",
                e->world_rank, (unsigned long long)sent, (unsigned long long)recv,
                (unsigned long long)(want.sent * es), (unsigned long long)(want.recv * es),
                gi->name, p, coll_short[s->coll], ff_algo_name(s->algo), ff_algo_name(ran),
                s->wire == FF_WIRE_BF16 ? "bf16" : "fp32", s->n);
    }
    /* AUTO with the default rule moves exactly the ring's bytes, or
     * rec-whole's (checked above, as `want`) */
    if (s->algo == FF_ALGO_AUTO && ran == FF_ALGO_REC_WHOLE)
        e->auto_whole++;
    if (s->algo == FF_ALGO_AUTO && e->strict && ran != FF_ALGO_REC_WHOLE) {
        vol ring = expected(FF_ALGO_RING, s->coll, p, r, s->n, &gi->l);
        CHECK(sent == ring.sent * es && recv == ring.recv * es,
              "auto (ran %s) on group %s(%d) %s n=%zu: %llu/%llu bytes, ring %llu/%llu",
              ff_algo_name(ran), gi->name, p, coll_short[s->coll], s->n, (unsigned long long)sent,
              (unsigned long long)recv, (unsigned long long)(ring.sent * es),
              (unsigned long long)(ring.recv * es));
    }
    /* conservation over the group */
    uint64_t mine[2] = {sent, recv}, tot[2];
    MPI_Allreduce(mine, tot, 2, MPI_UINT64_T, MPI_SUM, ff_group_comm(g));
    CHECK(tot[0] == tot[1], "group %s %s %s: %llu bytes sent but %llu received", gi->name,
          coll_short[s->coll], ff_algo_name(s->algo), (unsigned long long)tot[0],
          (unsigned long long)tot[1]);
    job_free(&j);
}

/* Several algorithms in flight at once on one group, waited in reverse. */
static void run_many(env *e, group_info *gi)
{
    int p = ff_group_size(gi->g);
    const spec specs[] = {
        {0, FF_ALGO_REC, FF_WIRE_FP32, 0, 13},
        {2, FF_ALGO_HIER_RING, FF_WIRE_FP32, 1, 101},
        {1, FF_ALGO_HIER_REC, FF_WIRE_BF16, 0, 19},
        {2, FF_ALGO_REC, FF_WIRE_BF16, 0, 57},
        {0, FF_ALGO_HIER_REC, FF_WIRE_FP32, 1, 7},
        {1, FF_ALGO_RING, FF_WIRE_FP32, 0, 11},
        {2, FF_ALGO_REC_WHOLE, FF_WIRE_BF16, 1, 23},
        {1, FF_ALGO_DIRECT, FF_WIRE_BF16, 0, 9},
        {2, FF_ALGO_DIRECT, FF_WIRE_FP32, 1, 45},
        {2, FF_ALGO_AUTO, FF_WIRE_FP32, 0, (size_t)(4 * p)},
    };
    enum { N = sizeof specs / sizeof specs[0] };
    job jobs[N];
    ff_request *req[N] = {0};
    int rc = FF_OK;
    for (int i = 0; i < N; i++)
        job_init(&jobs[i], &specs[i], gi->g, e->world_rank, 50 + i);
    for (int i = 0; i < N && rc == FF_OK; i++)
        rc = post(gi->g, &specs[i], jobs[i].src, jobs[i].out, &req[i]);
    for (int i = N - 1; i >= 0; i--) {
        int wrc = ff_wait(&req[i]);
        if (rc == FF_OK)
            rc = wrc;
    }
    CHECK(rc == FF_OK, "group %s, %d in flight: %s", gi->name, N, ff_ctx_error(e->ctx));
    if (rc != FF_OK)
        MPI_Abort(MPI_COMM_WORLD, 1);
    for (int i = 0; i < N; i++) {
        test_failures += job_check(e, &jobs[i], gi->g, gi->name);
        job_free(&jobs[i]);
    }
    e->checks += N;
}

static void run_group(env *e, group_info *gi)
{
    int p = ff_group_size(gi->g);
    static const ff_algo algos[] = {FF_ALGO_RING,     FF_ALGO_REC,       FF_ALGO_HIER_RING,
                                    FF_ALGO_HIER_REC, FF_ALGO_REC_WHOLE, FF_ALGO_DIRECT,
                                    FF_ALGO_AUTO};
    const size_t ag_counts[] = {1, 5, 37};
    const size_t ar_counts[] = {1, (size_t)(p > 1 ? p - 1 : 2), (size_t)p + 1, (size_t)(4 * p),
                                1031};
    int salt = 0;
    for (size_t a = 0; a < sizeof algos / sizeof algos[0]; a++)
        for (int coll = 0; coll < 3; coll++)
            for (int wire = 0; wire < 2; wire++)
                for (int ip = 0; ip < 2; ip++) {
                    if ((ip && coll == 1) || !ff_algo_supports(algos[a], colls[coll]))
                        continue;
                    const size_t *counts = coll == 2 ? ar_counts : ag_counts;
                    int nc = coll == 2 ? 5 : 3;
                    for (int ci = 0; ci < nc; ci++) {
                        spec s = {coll, algos[a], (ff_wire)wire, ip, counts[ci]};
                        run_one(e, gi, &s, salt++);
                    }
                }
    run_many(e, gi);
}

int main(int argc, char **argv)
{
    const char *mode = argc > 1 ? argv[1] : "poll";
    int thread = !strcmp(mode, "thread"), provided;
    MPI_Init_thread(&argc, &argv, thread ? MPI_THREAD_MULTIPLE : MPI_THREAD_FUNNELED, &provided);
    env e = {0};
    MPI_Comm_rank(MPI_COMM_WORLD, &e.world_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &e.world_size);
    const char *sv = getenv("FF_STRICT_VOLUME");
    e.strict = !(sv && !strcmp(sv, "0"));
    const char *pn = getenv("FF_RANKS_PER_NODE");
    e.per_node = pn ? atoi(pn) : 0;
    if (e.world_size > 64)
        MPI_Abort(MPI_COMM_WORLD, 1);
    /* nodes: FF_RANKS_PER_NODE's k consecutive ranks, or the MPI library's
     * shared-memory domains (on the emulated cluster, its nodes), each named
     * by its lowest world rank */
    int leader = e.world_rank;
    if (!e.per_node) {
        MPI_Comm node;
        MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node);
        MPI_Allreduce(&e.world_rank, &leader, 1, MPI_INT, MPI_MIN, node);
        MPI_Comm_free(&node);
    } else {
        leader = e.world_rank / e.per_node;
    }
    MPI_Allgather(&leader, 1, MPI_INT, e.node_of, 1, MPI_INT, MPI_COMM_WORLD);
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

    for (int p = 1; p <= e.world_size; p++)
        for (int variant = 0; variant < (p >= 3 ? 2 : 1); variant++) {
            int in = e.world_rank < p;
            /* interleaved: even ranks first, then odd */
            int key = variant ? (e.world_rank % 2) * p + e.world_rank : e.world_rank;
            MPI_Comm comm;
            MPI_Comm_split(MPI_COMM_WORLD, in ? 0 : MPI_UNDEFINED, key, &comm);
            int failures_before = test_failures;
            long checks_before = e.checks;
            group_info gi = {variant ? "interleaved" : "contiguous", NULL, {0, 0, 0, 0, {0}}};
            char desc[64] = "";
            if (in) {
                rc = ff_group_create(e.ctx, comm, gi.name, &gi.g);
                CHECK(rc == FF_OK, "ff_group_create: %s", ff_ctx_error(e.ctx));
                int world_of[64], me = ff_group_rank(gi.g);
                MPI_Allgather(&e.world_rank, 1, MPI_INT, world_of, 1, MPI_INT, comm);
                gi.l = layout_of(world_of, p, me, e.node_of);
                int nodes, per;
                ff_group_topology(gi.g, &nodes, &per);
                CHECK(nodes == gi.l.N && per == gi.l.k,
                      "group %s(%d): library sees %d nodes x %d, test %d x %d", gi.name, p, nodes,
                      per, gi.l.N, gi.l.k);
                if (gi.l.k)
                    snprintf(desc, sizeof desc, "%d node(s) x %d", gi.l.N, gi.l.k);
                else
                    snprintf(desc, sizeof desc, "%d uneven nodes (flat)", gi.l.N);
                run_group(&e, &gi);
                ff_group_destroy(gi.g);
                MPI_Comm_free(&comm);
            }
            int local_bad = test_failures - failures_before, bad;
            long nchecks = e.checks - checks_before, total;
            MPI_Allreduce(&local_bad, &bad, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
            MPI_Reduce(&nchecks, &total, 1, MPI_LONG, MPI_MAX, 0, MPI_COMM_WORLD);
            if (e.world_rank == 0)
                printf("p=%d %-11s %-22s progress %-6s %4ld collectives: %s\n", p, gi.name, desc,
                       mode, total, bad ? "FAILED" : "ok");
        }
    double worst;
    MPI_Allreduce(&e.worst_bf16_ratio, &worst, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    if (e.world_rank == 0)
        printf("nodes: %s; bf16 reductions: worst error %.3f of the bound\n",
               e.per_node ? "FF_RANKS_PER_NODE" : "the MPI library's shared-memory domains", worst);
    long whole = 0;
    MPI_Allreduce(&e.auto_whole, &whole, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
    if (e.world_rank == 0)
        printf("strict_volume %d: AUTO ran rec-whole %ld times (summed over ranks)\n", e.strict,
               whole);
    if (e.world_size >= 3)
        CHECK(whole > 0, "AUTO never ran rec-whole (strict_volume %d)", e.strict);
    ff_ctx_destroy(e.ctx);
    int code = test_finish("coll_algos");
    MPI_Finalize();
    return code;
}
