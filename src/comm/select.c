/* Which algorithm a collective runs: node layout, the alpha-beta cost model,
 * the FF_ALGO_AUTO choice. (The machine profile that sets the model is read
 * by src/plan/profile.c, ff_coll_model_read.)
 *
 * Node layout. At ff_ctx_create every rank learns the node of every other
 * (MPI_Comm_split_type(MPI_COMM_TYPE_SHARED), one all-gather), or pretends
 * nodes of k consecutive ranks when FF_RANKS_PER_NODE=k. A group's layout is
 * then derived locally when the group is made (ff_group_topo_init,
 * MPI_Group_translate_ranks, no communication; the members agree on the
 * outcome) and freed with it, so posting never blocks.
 *
 * Cost model (AutoDDL §3: alpha-beta, fitted by `fourfold bench profile`).
 * A step costs alpha + bytes/beta at its level (with a second (alpha, beta)
 * for messages up to small_max bytes where the profile found two regimes,
 * comm/fit.c); a step whose messages leave a
 * node costs alpha_inter + s*bytes/beta_inter where s is the number of the
 * busiest node's ranks sending off-node in that step (they share its link:
 * docs/design.md §6's beta_inter / min(g, P)). Each algorithm's time is the sum of
 * its steps, with s counted from the group's actual layout:
 *   ring              (p-1) steps of one block, s = ring edges leaving a node
 *   recursive         lg p steps of 1, 2, 4, ... blocks, s per step from the
 *                     layout; a non-power-of-two p adds the fold's two steps
 *   hierarchical      inter phase: N-1 (ring) or lg N (recursive) steps of
 *                     one block with s = k, then k-1 intra steps of N blocks
 *   all-reduce        reduce-scatter + all-gather of chunks of n/p
 *   rec-whole         lg p steps of the whole vector (+ the fold's two)
 *   direct            rounds of up to `window` partners as the all-to-all's
 *                     (a2a_time), one block per message (all-reduce: twice,
 *                     on chunks); priced for `bench coll`, not chosen by
 *                     the model (ff_coll_pick)
 * plus (p-1) blocks of additions at reduce_Bps for reductions (rec-whole:
 * lg p whole vectors, one more in a fold). Copies and the hierarchical
 * reordering are not modelled (beta_intra absorbs them).
 *
 * Measured picks (`fourfold bench tune`, ff_coll_model.picks) come first:
 * where one covers the call (its collective, the group's layout, the size)
 * and strict_volume allows its algorithm, AUTO runs it; the model decides
 * elsewhere. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "algo.h"

/* ---- the model ---- */

void ff_coll_model_default(ff_coll_model *m)
{
    /* shared memory as `bench profile` fitted it on the 2-core VM of
     * 2026-11-22 (alpha 3.2-3.5 us, beta 2.8-3.5 GB/s; the VM of 2026-11-23
     * fits 3.7 us and 13 GB/s, profiles/vm-2rank.json: the defaults stay
     * the slower, which changes no choice on one node, where the ring and
     * recursive doubling move the same bytes and alpha decides); between
     * nodes the emulated cluster's 1 Gbit/s links (116 MB/s measured by
     * the cluster emulator (docs/design.md §8), alpha about the 38-48 us fitted there without
     * delay). docs/coll-bench.md. Additions: `bench profile`'s fit does not resolve them (0, or
     * 87-208 GB/s), but rec-whole adds twice the ring's bytes on 2 ranks, and measured 1.14-1.29x
     * the ring's time from 4 MiB on one node of this VM: its extra time over the extra V/2 added
     * bytes was 10-15 GB/s at 4-64 MiB (docs/coll-bench.md; bench/coll.sh one-node-ar), so 10 GB/s.
     */
    m->alpha_intra_s = 3.5e-6;
    m->beta_intra_Bps = 3.5e9;
    m->alpha_inter_s = 3e-5;
    m->beta_inter_Bps = 1.16e8;
    m->reduce_Bps = 1e10;
    m->small_max_intra_B = m->alpha_intra_small_s = m->beta_intra_small_Bps = 0;
    m->small_max_inter_B = m->alpha_inter_small_s = m->beta_inter_small_Bps = 0;
    m->strict_volume = 1;
    m->n_picks = 0;
}

/* alpha >= 0 and beta > 0, finite; a second regime only with small_max > 0 */
static int level_ok(double alpha, double beta, double small_max, double alpha_small,
                    double beta_small)
{
    int ok = alpha >= 0 && beta > 0 && isfinite(alpha) && isfinite(beta) && small_max >= 0 &&
             isfinite(small_max);
    if (small_max > 0)
        ok &= alpha_small >= 0 && beta_small > 0 && isfinite(alpha_small) && isfinite(beta_small);
    return ok;
}

/* A measured pick names a collective, an algorithm of ours that implements
 * it (not AUTO or MPI), a layout of at least 2 ranks and a size range. */
static int pick_ok(const ff_coll_pick_rule *r)
{
    return r->coll >= 0 && r->coll < FF_NCOLL && r->algo != FF_ALGO_AUTO &&
           r->algo != FF_ALGO_MPI && ff_algo_supports(r->algo, r->coll) && r->nodes >= 1 &&
           r->per_node >= 1 && r->nodes <= (1 << 24) / r->per_node && r->nodes * r->per_node >= 2 &&
           r->min_B >= 0 && r->max_B > r->min_B && isfinite(r->max_B);
}

int ff_coll_model_ok(const ff_coll_model *m)
{
    int ok = m->n_picks >= 0 && m->n_picks <= FF_COLL_MAX_PICKS;
    for (int i = 0; ok && i < m->n_picks; i++)
        ok = pick_ok(&m->picks[i]);
    return ok &&
           level_ok(m->alpha_intra_s, m->beta_intra_Bps, m->small_max_intra_B,
                    m->alpha_intra_small_s, m->beta_intra_small_Bps) &&
           level_ok(m->alpha_inter_s, m->beta_inter_Bps, m->small_max_inter_B,
                    m->alpha_inter_small_s, m->beta_inter_small_Bps) &&
           m->reduce_Bps >= 0 && isfinite(m->reduce_Bps);
}

int ff_ctx_set_coll_model(ff_ctx *ctx, const ff_coll_model *m)
{
    if (!m || !ff_coll_model_ok(m))
        return ff_set_error(ctx, FF_EINVAL,
                            "collective model: alphas, small_max and reduce_Bps must be >= 0 and "
                            "betas > 0 (small betas too where small_max > 0), all finite; at "
                            "most %d picks, each of an algorithm that implements its "
                            "collective (not auto or mpi), on 2 or more ranks, min_B < max_B",
                            FF_COLL_MAX_PICKS);
    ctx->coll->model = *m;
    return FF_OK;
}

void ff_ctx_coll_model(const ff_ctx *ctx, ff_coll_model *m)
{
    if (ctx && ctx->coll)
        *m = ctx->coll->model;
    else
        ff_coll_model_default(m);
}

/* The machine profile (FF_PROFILE) is read by the profile module,
 * src/plan/profile.c: ff_coll_model_read there parses the file with the
 * planner's parser and merges its keys and picks into a model. */

/* ---- the context's layer ---- */

/* A string setting of the collective layer: the option if set, else
 * (unless the environment is ignored) its variable, else NULL. */
static const char *str_setting(const ff_ctx *ctx, const char *field, const char *var)
{
    const char *v = field || ctx->opt.ignore_env ? field : getenv(var);
    return v && *v ? v : NULL;
}

/* An integer setting in [1, max] the same way: 1 and *out if set, 0 if
 * unset, FF_EINVAL (message set) if out of range. */
static int int_setting(ff_ctx *ctx, int field, const char *var, int max, int *out)
{
    if (field) {
        *out = field;
        return field >= 1 && field <= max
                   ? 1
                   : ff_set_error(ctx, FF_EINVAL, "the option for %s is %d: expected 1 to %d", var,
                                  field, max);
    }
    const char *v = ctx->opt.ignore_env ? NULL : getenv(var);
    if (!v || !*v)
        return 0;
    char *end;
    errno = 0;
    long x = strtol(v, &end, 10);
    if (errno || *end || x < 1 || x > max)
        return ff_set_error(ctx, FF_EINVAL, "%s=%s: expected an integer from 1 to %d", var, v, max);
    *out = (int)x;
    return 1;
}

int ff_coll_layer_init(ff_ctx *ctx)
{
    /* The communication first, on every rank whatever happens locally. */
    int size = ctx->size, leader = ctx->rank, ok, all_ok;
    struct ff_coll_layer *L = calloc(1, sizeof *L);
    int *leaders = malloc((size_t)size * sizeof(int));
    int *node_of = malloc((size_t)size * sizeof(int));
    MPI_Comm node_comm = MPI_COMM_NULL;
    int mrc = MPI_Comm_split_type(ctx->comm, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node_comm);
    if (mrc == MPI_SUCCESS) {
        mrc = MPI_Allreduce(&ctx->rank, &leader, 1, MPI_INT, MPI_MIN, node_comm);
        MPI_Comm_free(&node_comm);
    }
    ok = mrc == MPI_SUCCESS && L && leaders && node_of;
    mrc = MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_MIN, ctx->comm);
    if (mrc == MPI_SUCCESS && all_ok)
        mrc = MPI_Allgather(&leader, 1, MPI_INT, leaders, 1, MPI_INT, ctx->comm);
    if (mrc != MPI_SUCCESS || !all_ok) {
        free(L), free(leaders), free(node_of);
        return mrc != MPI_SUCCESS ? ff_mpi_error(ctx, mrc, "finding the nodes")
                                  : ff_set_error(ctx, FF_ENOMEM, "out of memory finding the nodes");
    }
    ctx->coll = L;
    L->node_of = node_of;
    /* nodes numbered in the order of their lowest rank (the leader) */
    for (int r = 0; r < size; r++) {
        if (leaders[r] == r)
            leaders[r] = -1 - L->n_nodes++; /* marks node index */
    }
    for (int r = 0; r < size; r++)
        node_of[r] = leaders[r] < 0 ? -1 - leaders[r] : -1 - leaders[leaders[r]];
    free(leaders);

    const ff_ctx_options *o = &ctx->opt;
    int k = 0, rc = int_setting(ctx, o->ranks_per_node, "FF_RANKS_PER_NODE", 1 << 20, &k);
    if (rc < 0)
        return rc;
    if (rc > 0) {
        L->per_node_override = k;
        for (int r = 0; r < size; r++)
            node_of[r] = r / k;
        L->n_nodes = (size + k - 1) / k;
    }
    ff_coll_model_default(&L->model);
    const char *profile = str_setting(ctx, o->profile, "FF_PROFILE");
    if (profile) {
        char err[512];
        int prc = ff_coll_model_read(profile, &L->model, err, sizeof err);
        if (prc != FF_OK)
            return ff_set_error(ctx, prc, "%s: %s",
                                o->profile ? "the profile option" : "FF_PROFILE", err);
    }
    /* all-to-all partners in flight (comm/ring.c); fewer for experiments
     * and for the tests' groups of up to 9 ranks to run several rounds */
    L->a2a_window = FF_A2A_WINDOW;
    int w = 0;
    rc = int_setting(ctx, o->a2a_window, "FF_A2A_WINDOW", FF_A2A_WINDOW, &w);
    if (rc < 0)
        return rc;
    if (rc > 0)
        L->a2a_window = w;
    /* FF_STRICT_VOLUME=0 lets AUTO pick algorithms whose bytes the
     * planner does not predict (ff_coll_model.strict_volume) */
    if (o->volume != FF_VOLUME_UNSET) {
        if (o->volume != FF_VOLUME_STRICT && o->volume != FF_VOLUME_ANY)
            return ff_set_error(ctx, FF_EINVAL, "unknown volume rule %d", (int)o->volume);
        L->model.strict_volume = o->volume == FF_VOLUME_STRICT;
    } else {
        const char *sv = str_setting(ctx, NULL, "FF_STRICT_VOLUME");
        if (sv && strcmp(sv, "0") != 0 && strcmp(sv, "1") != 0)
            return ff_set_error(ctx, FF_EINVAL, "FF_STRICT_VOLUME=%s: expected 0 or 1", sv);
        if (sv)
            L->model.strict_volume = sv[0] == '1';
    }
    L->forced = FF_ALGO_AUTO;
    const char *algo = str_setting(ctx, o->algo, "FF_ALGO");
    if (algo) {
        int a = ff_algo_parse(algo);
        if (a < 0)
            return ff_set_error(ctx, FF_EINVAL,
                                "%s%s: expected auto, mpi, ring, rec, hier-ring, hier-rec, "
                                "rec-whole or direct",
                                o->algo ? "the algo option " : "FF_ALGO=", algo);
        L->forced = (ff_algo)a;
    }
    return FF_OK;
}

void ff_coll_layer_free(ff_ctx *ctx)
{
    struct ff_coll_layer *L = ctx->coll;
    if (!L)
        return;
    free(L->node_of);
    free(L);
    ctx->coll = NULL;
}

/* ---- a group's layout ---- */

static int max_count(const int *count, int n)
{
    int m = 0;
    for (int i = 0; i < n; i++)
        if (count[i] > m)
            m = count[i];
    return m;
}

/* The busiest node's count of off-node messages, for the cost model. */
static void cross_counts(ff_topo *t, int *count)
{
    int p = t->p, N = t->n_nodes;
    const int *nd = t->node;
    memset(count, 0, (size_t)N * sizeof *count);
    for (int r = 0; r < p && N > 1; r++)
        count[nd[r]] += nd[r] != nd[(r + 1) % p];
    t->ring_cross = max_count(count, N);
    int pof2 = ff_floor_pow2(p), rem = p - pof2;
#define PART(v) ((v) < rem ? 2 * (v) + 1 : (v) + rem)
    for (int l = 0; l < FF_MAX_LOG2 && (1 << l) < pof2; l++) {
        memset(count, 0, (size_t)N * sizeof *count);
        for (int v = 0; v < pof2; v++)
            count[nd[PART(v)]] += nd[PART(v)] != nd[PART(v ^ (1 << l))];
        t->rd_cross[l] = max_count(count, N);
    }
#undef PART
    memset(count, 0, (size_t)N * sizeof *count);
    for (int e = 0; e < 2 * rem; e += 2)
        count[nd[e]] += nd[e] != nd[e + 1];
    t->fold_cross = max_count(count, N);
}

/* The layout of p members, member r on the node with id id[r] (0 <= id <
 * n_ids, any numbering), seen from member `me`. NULL if out of memory. */
static ff_topo *topo_build(const int *id, int n_ids, int p, int me)
{
    ff_topo *t = calloc(1, sizeof *t);
    int *map = malloc((size_t)n_ids * sizeof(int));
    int *count = calloc((size_t)p, sizeof(int));
    if (t)
        t->node = malloc((size_t)p * sizeof(int));
    if (!t || !map || !count || !t->node) {
        ff_topo_free(t);
        free(map), free(count);
        return NULL;
    }
    t->p = p;
    /* group-local node numbers, in order of first appearance */
    for (int i = 0; i < n_ids; i++)
        map[i] = -1;
    for (int r = 0; r < p; r++) {
        if (map[id[r]] < 0)
            map[id[r]] = t->n_nodes++;
        t->node[r] = map[id[r]];
        count[t->node[r]]++;
    }
    t->per_node = count[0];
    for (int j = 1; j < t->n_nodes; j++)
        if (count[j] != t->per_node)
            t->per_node = 0;
    t->my_node = t->node[me];
    if (t->per_node > 0) {
        t->member = malloc((size_t)p * sizeof(int));
        if (!t->member) {
            ff_topo_free(t);
            free(map), free(count);
            return NULL;
        }
        memset(count, 0, (size_t)t->n_nodes * sizeof(int));
        for (int r = 0; r < p; r++) {
            int j = t->node[r], i = count[j]++;
            t->member[j * t->per_node + i] = r;
            if (r == me)
                t->my_local = i;
        }
    }
    cross_counts(t, count);
    free(map), free(count);
    return t;
}

ff_topo *ff_topo_new(const int *node, int p, int me)
{
    if (!node || p < 1 || me < 0 || me >= p)
        return NULL;
    int n_ids = 0;
    for (int r = 0; r < p; r++) {
        if (node[r] < 0)
            return NULL;
        if (node[r] >= n_ids)
            n_ids = node[r] + 1;
    }
    ff_topo *t = topo_build(node, n_ids, p, me);
    if (t) { /* the counts are what ff_coll_pick reads */
        free(t->node), free(t->member);
        t->node = t->member = NULL;
    }
    return t;
}

void ff_topo_free(ff_topo *t)
{
    if (!t)
        return;
    free(t->node);
    free(t->member);
    free(t);
}

/* FF_FAULT_TOPO=R: the context's rank R fails to build its groups' layouts
 * as if out of memory (for the test that creating a grid or a group then
 * fails on every rank, tests/bad_input.sh). Only in test builds. */
static int fault_topo(const ff_ctx *ctx)
{
#ifdef FF_TEST_HOOKS
    const char *v = getenv("FF_FAULT_TOPO");
    char *end;
    long r = v && *v ? strtol(v, &end, 10) : -1;
    return v && *v && !*end && r == ctx->rank;
#else
    (void)ctx;
    return 0;
#endif
}

int ff_group_topo_init(ff_group *g)
{
    ff_ctx *ctx = g->ctx;
    struct ff_coll_layer *L = ctx->coll;
    if (!L || g->topo)
        return FF_OK;
    int p = g->size;
    int *idx = malloc((size_t)p * sizeof(int)), *crank = malloc((size_t)p * sizeof(int));
    if (!idx || !crank || fault_topo(ctx)) {
        free(idx), free(crank);
        return ff_set_error(ctx, FF_ENOMEM, "out of memory finding the nodes of group %s", g->name);
    }
    MPI_Group gg, cg;
    MPI_Comm_group(g->comm, &gg);
    MPI_Comm_group(ctx->comm, &cg);
    for (int i = 0; i < p; i++)
        idx[i] = i;
    MPI_Group_translate_ranks(gg, p, idx, cg, crank);
    MPI_Group_free(&gg);
    MPI_Group_free(&cg);
    /* node ids: a member that is not in the context's communicator counts
     * as a node of its own */
    for (int r = 0; r < p; r++)
        idx[r] = (crank[r] == MPI_UNDEFINED || crank[r] < 0 || crank[r] >= ctx->size)
                     ? L->n_nodes + r
                     : L->node_of[crank[r]];
    ff_topo *t = topo_build(idx, L->n_nodes + p, p, g->rank);
    free(idx), free(crank);
    if (!t)
        return ff_set_error(ctx, FF_ENOMEM, "out of memory finding the nodes of group %s", g->name);
    g->topo = t;
    return FF_OK;
}

const ff_topo *ff_group_topo(ff_group *g) { return g->topo; }

void ff_group_topology(ff_group *g, int *nodes, int *ranks_per_node)
{
    const ff_topo *t = ff_group_topo(g);
    *nodes = t ? t->n_nodes : 1;
    *ranks_per_node = t ? t->per_node : g->size;
}

int ff_ctx_node_of(const ff_ctx *ctx, int rank)
{
    if (!ctx || !ctx->coll || rank < 0 || rank >= ctx->size)
        return 0;
    return ctx->coll->node_of[rank];
}

int ff_ctx_nodes(const ff_ctx *ctx) { return ctx && ctx->coll ? ctx->coll->n_nodes : 1; }

/* ---- predicted times ---- */

/* `n` messages of `bytes` at once, within a node (through its memory) or
 * between nodes (through one link), for one alpha; the regime is the
 * message's. */
static double step_n(const ff_coll_model *m, double bytes, int inter, int n)
{
    if (!inter) {
        if (m->small_max_intra_B > 0 && bytes <= m->small_max_intra_B)
            return m->alpha_intra_small_s + bytes * n / m->beta_intra_small_Bps;
        return m->alpha_intra_s + bytes * n / m->beta_intra_Bps;
    }
    if (m->small_max_inter_B > 0 && bytes <= m->small_max_inter_B)
        return m->alpha_inter_small_s + bytes * n / m->beta_inter_small_Bps;
    return m->alpha_inter_s + bytes * n / m->beta_inter_Bps;
}

/* One step: messages of `bytes` within a node (streams 0) or leaving it with
 * `streams` of the busiest node's ranks sharing its link; the regime is the
 * message's (a protocol or a shaper's burst acts per message). */
static double step_t(const ff_coll_model *m, double bytes, int streams)
{
    return step_n(m, bytes, streams > 0, streams > 0 ? streams : 1);
}

/* Additions of whole vectors by a rec-whole all-reduce's busiest rank: lg
 * of the power of two below p, plus the fold's one. */
static int rec_steps(int p)
{
    int pof2 = ff_floor_pow2(p), L = 0;
    while ((1 << L) < pof2)
        L++;
    return L + (p > pof2);
}

/* Recursive doubling (or halving: the same steps in reverse) over the whole
 * group, blocks of B bytes; the fold moves fold_in and fold_out blocks. */
static double rec_time(const ff_topo *t, const ff_coll_model *m, double B, double fold_in,
                       double fold_out)
{
    int p = t->p, pof2 = ff_floor_pow2(p);
    double scale = (double)p / pof2, T = 0;
    for (int l = 0; (1 << l) < pof2; l++)
        T += step_t(m, B * (double)(1 << l) * scale, t->rd_cross[l]);
    if (p > pof2 && fold_in > 0)
        T += step_t(m, B * fold_in, t->fold_cross);
    if (p > pof2 && fold_out > 0)
        T += step_t(m, B * fold_out, t->fold_cross);
    return T;
}

/* The inter-node phase of a hierarchical algorithm: N nodes, k streams. */
static double inter_time(const ff_topo *t, const ff_coll_model *m, double B, int rec,
                         double fold_in, double fold_out)
{
    int N = t->n_nodes, k = t->per_node;
    if (N <= 1)
        return 0;
    if (!rec)
        return (N - 1) * step_t(m, B, k);
    int pof2 = ff_floor_pow2(N);
    double scale = (double)N / pof2, T = 0;
    for (int l = 0; (1 << l) < pof2; l++)
        T += step_t(m, B * (double)(1 << l) * scale, k);
    if (N > pof2 && fold_in > 0)
        T += step_t(m, B * fold_in, k);
    if (N > pof2 && fold_out > 0)
        T += step_t(m, B * fold_out, k);
    return T;
}

static double predict_comm(const ff_topo *t, const ff_coll_model *m, ff_coll coll, ff_algo algo,
                           double B, int ar, int window);

/* fourfold's all-to-all (comm/ring.c): rounds of up to `window` partners
 * posted at once. A round costs the slower of its two parts, which
 * run side by side: the copies within nodes (the rank with the most
 * on-node messages sent or received) and the busiest node's link (all its
 * ranks' off-node messages share it; a round is a set of cyclic shifts, so
 * a node sends off as many as it receives). Each part pays one alpha per
 * round however many messages it posts: optimistic where alpha is mostly
 * per-message software overhead rather than latency, and the regime is the
 * single message's although a link carries several at once (a shaper's
 * burst is shared by them; docs/coll-bench.md measured the window 3-11 %
 * slower from 64 KiB on 4 emulated nodes). It also prices the direct
 * algorithm's rounds (the same shifts). AUTO does not use it (the
 * all-to-all has one algorithm; direct runs only from measured picks);
 * `bench coll` prints it. -1 if out of memory. */
static double a2a_time(const ff_topo *t, const ff_coll_model *m, double B, int window)
{
    int p = t->p, N = t->n_nodes;
    int *link = calloc((size_t)N, sizeof *link);
    if (!link)
        return -1;
    double T = 0;
    for (int s0 = 1; s0 < p; s0 += window) {
        int w = p - s0 < window ? p - s0 : window, most_local = 0;
        memset(link, 0, (size_t)N * sizeof *link);
        for (int r = 0; r < p; r++) {
            int local_out = 0, local_in = 0;
            for (int i = 0; i < w; i++) {
                int off = t->node[(r + s0 + i) % p] != t->node[r];
                link[t->node[r]] += off;
                local_out += !off;
                local_in += t->node[((r - s0 - i) % p + p) % p] == t->node[r];
            }
            if (local_out > most_local)
                most_local = local_out;
            if (local_in > most_local)
                most_local = local_in;
        }
        int busiest = max_count(link, N);
        double intra = most_local > 0 ? step_n(m, B, 0, most_local) : 0;
        double inter = busiest > 0 ? step_n(m, B, 1, busiest) : 0;
        T += intra > inter ? intra : inter;
    }
    free(link);
    return T;
}

/* The model's time of `algo`; `window`: the all-to-all's partners per round. */
static double predict(const ff_topo *t, const ff_coll_model *m, ff_coll coll, ff_algo algo,
                      size_t count, ff_wire wire, int window)
{
    int p = t->p;
    double e = (double)ff_wire_size(wire);
    if (p <= 1)
        return 0;
    int ar = coll == FF_COLL_ALLREDUCE;
    double B = ar ? (double)count * e / p : (double)count * e; /* one block */
    if ((algo == FF_ALGO_HIER_RING || algo == FF_ALGO_HIER_REC) && t->per_node == 0)
        algo = algo == FF_ALGO_HIER_REC ? FF_ALGO_REC : FF_ALGO_RING;
    /* additions: every algorithm adds (p-1) blocks into the accumulator of
     * a reduce-scatter (the fold's one whole-vector addition is ignored);
     * rec-whole adds the whole vector at each of its lg p steps */
    double adds = 0;
    if (coll != FF_COLL_ALLGATHER && m->reduce_Bps > 0)
        adds = (algo == FF_ALGO_REC_WHOLE ? rec_steps(p) * p : p - 1) * B / m->reduce_Bps;
    double T = predict_comm(t, m, coll, algo, B, ar, window);
    return T < 0 ? T : T + adds;
}

static double predict_comm(const ff_topo *t, const ff_coll_model *m, ff_coll coll, ff_algo algo,
                           double B, int ar, int window)
{
    int p = t->p;
    switch (algo) {
    case FF_ALGO_RING:
        if (coll == FF_COLL_ALLTOALL)
            return a2a_time(t, m, B, window);
        return (ar ? 2.0 : 1.0) * (p - 1) * step_t(m, B, t->ring_cross);
    case FF_ALGO_REC:
        if (ar) /* RS with the fold in of the whole vector, AG with its fold out */
            return rec_time(t, m, B, p, 0) + rec_time(t, m, B, 0, p);
        return coll == FF_COLL_ALLGATHER ? rec_time(t, m, B, 1, p - 1) : rec_time(t, m, B, p, 1);
    case FF_ALGO_REC_WHOLE: { /* lg p steps of the whole vector, fold in and out */
        int pof2 = ff_floor_pow2(p);
        double V = B * p, T = 0;
        for (int l = 0; (1 << l) < pof2; l++)
            T += step_t(m, V, t->rd_cross[l]);
        if (p > pof2)
            T += 2 * step_t(m, V, t->fold_cross);
        return T;
    }
    case FF_ALGO_DIRECT: { /* (a layout without members, ff_topo_new: unpriced) */
        double T = t->node ? a2a_time(t, m, B, window) : -1;
        return T < 0 || !ar ? T : 2 * T;
    }
    case FF_ALGO_HIER_RING:
    case FF_ALGO_HIER_REC: {
        int rec = algo == FF_ALGO_HIER_REC, N = t->n_nodes, k = t->per_node;
        double intra = (k - 1) * step_t(m, N * B, 0);
        if (ar)
            return 2 * intra + inter_time(t, m, B, rec, N, 0) + inter_time(t, m, B, rec, 0, N);
        return intra + (coll == FF_COLL_ALLGATHER ? inter_time(t, m, B, rec, 1, N - 1)
                                                  : inter_time(t, m, B, rec, N, 1));
    }
    default: return -1;
    }
}

/* 1 if AUTO may pick `algo` (see ff_coll_model.strict_volume): with
 * strict_volume, the algorithms whose byte counts the planner predicts
 * (src/plan/cost_full.c): those that move the ring's, and rec-whole. */
static int eligible(const ff_topo *t, const ff_coll_model *m, ff_coll coll, ff_algo algo,
                    size_t count)
{
    int p = t->p, even = coll != FF_COLL_ALLREDUCE || count % (size_t)p == 0;
    /* the recursive and hierarchical ones send up to a whole buffer at once */
    size_t whole = coll == FF_COLL_ALLREDUCE ? count : count * (size_t)p;
    if (whole > 0x7fffffff && algo != FF_ALGO_DIRECT) /* direct sends blocks */
        return 0;
    switch (algo) {
    case FF_ALGO_REC: return !m->strict_volume || (ff_is_pow2(p) && even);
    case FF_ALGO_REC_WHOLE: return coll == FF_COLL_ALLREDUCE;
    case FF_ALGO_DIRECT: /* on 2 ranks the ring's exchange */
        return coll != FF_COLL_ALLTOALL && p > 2 && (!m->strict_volume || even);
    case FF_ALGO_HIER_RING:
    case FF_ALGO_HIER_REC:
        if (t->per_node == 0 || t->n_nodes < 2 || t->per_node < 2)
            return 0; /* not different from a flat algorithm */
        return !m->strict_volume || (even && (algo == FF_ALGO_HIER_RING || ff_is_pow2(t->n_nodes)));
    default: return 0;
    }
}

int ff_algo_supports(ff_algo algo, ff_coll coll)
{
    if (algo < 0 || algo >= FF_NALGO || coll < 0 || coll >= FF_NCOLL)
        return 0;
    if (algo == FF_ALGO_REC_WHOLE)
        return coll == FF_COLL_ALLREDUCE;
    return coll != FF_COLL_ALLTOALL || algo <= FF_ALGO_RING; /* direct: not all-to-all */
}

/* The measured pick (ff_coll_model.picks) that covers this call and that
 * AUTO may run, or -1: one for the collective, measured on a group laid out
 * as this one, whose size range holds the call's largest buffer. */
static int measured_pick(const ff_topo *t, const ff_coll_model *m, ff_coll coll, size_t count,
                         ff_wire wire)
{
    if (m->n_picks <= 0 || t->per_node == 0)
        return -1;
    double size = (double)count * (double)ff_wire_size(wire) *
                  (coll == FF_COLL_ALLREDUCE ? 1.0 : (double)t->p);
    for (int i = 0; i < m->n_picks && i < FF_COLL_MAX_PICKS; i++) {
        const ff_coll_pick_rule *r = &m->picks[i];
        if (r->coll == coll && r->nodes == t->n_nodes && r->per_node == t->per_node &&
            size > r->min_B && size <= r->max_B &&
            (r->algo == FF_ALGO_RING || eligible(t, m, coll, r->algo, count)))
            return (int)r->algo;
    }
    return -1;
}

ff_algo ff_coll_pick(const ff_topo *t, const ff_coll_model *m, ff_coll coll, size_t count,
                     ff_wire wire)
{
    /* the all-to-all has one algorithm; on p = 2 every all-gather and
     * reduce-scatter is the same exchange (an all-reduce may still take
     * rec-whole's one step of the whole vector over two of halves) */
    if (!t || coll == FF_COLL_ALLTOALL || t->p == 1 || (t->p == 2 && coll != FF_COLL_ALLREDUCE))
        return FF_ALGO_RING;
    int measured = measured_pick(t, m, coll, count, wire);
    if (measured >= 0)
        return (ff_algo)measured;
    ff_algo best = FF_ALGO_RING;
    double best_t = predict(t, m, coll, FF_ALGO_RING, count, wire, 1);
    static const ff_algo others[] = {FF_ALGO_REC, FF_ALGO_HIER_RING, FF_ALGO_HIER_REC,
                                     FF_ALGO_REC_WHOLE};
    for (size_t i = 0; i < sizeof others / sizeof others[0]; i++) {
        if (!eligible(t, m, coll, others[i], count))
            continue;
        double tt = predict(t, m, coll, others[i], count, wire, 1);
        if (tt < best_t * (1 - 1e-9)) { /* ties keep the earlier (ring first) */
            best = others[i];
            best_t = tt;
        }
    }
    return best;
}

ff_algo ff_coll_select(ff_group *g, ff_coll coll, size_t count, ff_wire wire)
{
    struct ff_coll_layer *L = g->ctx->coll;
    if (L && L->forced != FF_ALGO_AUTO && ff_algo_supports(L->forced, coll))
        return L->forced;
    if (!L || g->size <= 1 || coll == FF_COLL_ALLTOALL)
        return FF_ALGO_RING;
    return ff_coll_pick(ff_group_topo(g), &L->model, coll, count, wire);
}

ff_algo ff_coll_choose(ff_group *g, ff_coll coll, size_t count, ff_wire wire)
{
    if (!g || coll < 0 || coll >= FF_NCOLL)
        return FF_ALGO_RING;
    return ff_coll_select(g, coll, count, wire);
}

int ff_coll_allowed(ff_group *g, ff_coll coll, ff_algo algo, size_t count)
{
    if (!g || !g->ctx->coll || !ff_algo_supports(algo, coll) || algo == FF_ALGO_AUTO ||
        algo == FF_ALGO_MPI)
        return 0;
    if (algo == FF_ALGO_RING)
        return 1;
    const ff_topo *t = ff_group_topo(g);
    return t && coll != FF_COLL_ALLTOALL && eligible(t, &g->ctx->coll->model, coll, algo, count);
}

double ff_coll_predict(ff_group *g, ff_coll coll, ff_algo algo, size_t count, ff_wire wire)
{
    if (!g || coll < 0 || coll >= FF_NCOLL || !ff_algo_supports(algo, coll))
        return -1;
    if (algo == FF_ALGO_AUTO)
        algo = ff_coll_select(g, coll, count, wire);
    const ff_topo *t = ff_group_topo(g);
    if (!t || algo == FF_ALGO_MPI)
        return -1;
    return predict(t, &g->ctx->coll->model, coll, algo, count, wire, g->ctx->coll->a2a_window);
}
