/* fourfold bench profile: measures this machine and writes the profile the
 * planner (src/plan/) and the collective selector (FF_PROFILE) read.
 *
 * What is measured, on the nodes as the library sees them (MPI shared-memory
 * domains, or FF_RANKS_PER_NODE):
 *   intra-node level: fourfold's ring all-gather, reduce-scatter and
 *     all-reduce on groups of G = 2 .. g ranks of one node (every node at
 *     once), over a size sweep;
 *   inter-node level: the same on groups of M = 2 .. N nodes made of the
 *     ranks with local index 0 (one stream per link: beta_inter is the
 *     single-stream rate of the model, comm/select.c);
 *   intra_bw: for each (P, G) with P*G <= g, a large ring all-gather on the
 *     groups of G ranks at stride P inside every node, all at once (the
 *     planner's placement-aware bandwidth, docs/design.md §6): bytes received per
 *     rank per second;
 *   gemm: sgemm 1024^3 (quick: 256^3) with one thread on every rank at
 *     once, and 8 shapes with one or all three sides 64 or 256 (quick: 32
 *     or 64), whose rates fit the planner's GEMM curve (gemm_half_dim,
 *     gemm_call_s; ff_profile_fit_gemm) and the large-shape rate it
 *     approaches (gemm_flops, which predicts the 1024^3 rate measured).
 * The fit (AutoDDL §3, plus the additions): a ring collective of p ranks on
 * blocks of B bytes takes s*alpha + s*B/beta + a*B/reduce with s = p-1 steps
 * (2(p-1) for all-reduce, B = n/p) and a = p-1 blocks added (0 for
 * all-gather), so every sample is one linear equation in (alpha, 1/beta,
 * 1/reduce) per level; least squares on the relative error (each equation
 * divided by its measured time, so that microsecond and second samples count
 * alike), with every parameter >= 0. Over shared memory the additions are as
 * costly as the copies, which a two-parameter fit would fold into beta.
 * Where the cost is not one line in the message size (an eager protocol, a
 * shaper's burst), the fit takes a second (alpha, beta) for messages up to a
 * threshold it searches (comm/fit.c, ff_coll_fit).
 * Each sample is the median over iterations of the slowest rank's time, with
 * a barrier before each iteration over the node (intra-node samples) or the
 * job (inter-node samples). Printed: every sample with its fitted time and
 * residual, and the RMS and
 * largest relative residual per level, also stored under "fit".
 * The profile's reduce_Bps is not the fit's: the additions are a sliver of
 * a step's time and the fit rarely resolves them (0, or 87-208 GB/s on
 * this VM), so they are timed directly (time_additions). */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "bench.h"
#include "plan/profile.h"
#include "util/file.h"

typedef struct {
    int level; /* 0 intra, 1 inter */
    ff_coll coll;
    int p;
    ff_coll_sample s; /* steps of one block, the additions, the time */
} sample;

/* Bytes of received partial sums a rank adds per second: acc[i] +=
 * in[i] in fp32, as a reduce-scatter step does, on every rank at once
 * (they share the node's memory, as in a collective); the median over
 * repetitions of the slowest rank's time. 16 MiB vectors (1 MiB with
 * --quick). */
static double time_additions(MPI_Comm world, int quick)
{
    size_t n = quick ? (size_t)1 << 18 : (size_t)1 << 22;
    enum { REPS = 9 };
    float *acc = malloc(n * sizeof *acc), *in = malloc(n * sizeof *in);
    if (!acc || !in)
        MPI_Abort(MPI_COMM_WORLD, CLI_FAIL);
    for (size_t i = 0; i < n; i++)
        acc[i] = 0, in[i] = (float)(i % 7);
    double t[REPS];
    for (int r = 0; r < REPS; r++) {
        MPI_Barrier(world);
        double t0 = MPI_Wtime();
        for (size_t i = 0; i < n; i++)
            acc[i] += in[i];
        double mine = MPI_Wtime() - t0;
        MPI_Allreduce(&mine, &t[r], 1, MPI_DOUBLE, MPI_MAX, world);
    }
    volatile float sink = acc[n - 1]; /* the sums are used */
    (void)sink;
    free(acc), free(in);
    double med = ff_median(t, REPS);
    return med > 0 ? (double)(n * sizeof(float)) / med : 0;
}

/* One sgemm shape with one thread on every rank at once: the median rate
 * over the ranks. */
static double gemm_rate(MPI_Comm world, int size, int m, int n, int k, double seconds)
{
    MPI_Barrier(world);
    double rate = ff_sgemm_rate(m, n, k, 1, seconds), med;
    double *rates = malloc((size_t)size * sizeof *rates);
    if (!rates)
        MPI_Abort(MPI_COMM_WORLD, CLI_FAIL);
    MPI_Allgather(&rate, 1, MPI_DOUBLE, rates, 1, MPI_DOUBLE, world);
    med = ff_median(rates, size);
    free(rates);
    return med;
}

/* Measured values are written to 6 significant digits: their noise is
 * larger, and the file stays readable. */
static double sig6(double v)
{
    char t[32];
    snprintf(t, sizeof t, "%.6g", v);
    return strtod(t, NULL);
}

/* The fit of one level (ff_coll_fit on its samples). */
static void fit_level(const sample *smp, int n, int level, ff_coll_fit_result *f)
{
    ff_coll_sample *s = malloc((size_t)(n > 0 ? n : 1) * sizeof *s);
    int m = 0;
    if (!s)
        MPI_Abort(MPI_COMM_WORLD, CLI_FAIL);
    for (int i = 0; i < n; i++)
        if (smp[i].level == level)
            s[m++] = smp[i].s;
    if (ff_coll_fit(s, m, 1, f) != FF_OK)
        MPI_Abort(MPI_COMM_WORLD, CLI_FAIL);
    free(s);
}

static const char help_profile[] =
    "usage: mpirun -np N fourfold bench profile [options]\n\n"
    "Measures collectives within and between nodes and sgemm, fits alpha and beta\n"
    "per level by least squares (two regimes, small and large messages, where the\n"
    "data call for it), prints every sample's residual and writes the\n"
    "machine profile (JSON) that `fourfold plan` and FF_PROFILE read. Run it with\n"
    "the ranks per node of the real job; FF_RANKS_PER_NODE=k pretends nodes of k.\n\n"
    "options:\n"
    "  --out FILE        where to write the profile (default profile.json)\n"
    "  --name NAME       the profile's name (default: the host name)\n"
    "  --max-bytes S     largest block per rank (default 4M)\n"
    "  --factor F        block sizes from 1K by factors of F (default 2)\n"
    "  --iters N         timed iterations per sample (default 7, after 2 warm-ups)\n"
    "  --cores-per-node N  cores the ranks of one node share (default: this host's;\n"
    "                    on an emulated cluster, the host's cores / nodes)\n"
    "  --quick           3 sizes, 3 iterations, small sgemm (for tests)\n";

/* Times fourfold's ring `coll` on the group this rank is in (NULL: none)
 * for a block of `block` floats per rank; every rank of `world` calls it. */
static double time_ring(ff_ctx *ctx, ff_group *g, MPI_Comm world, ff_coll coll, size_t block,
                        int iters, float *send, float *recv)
{
    size_t c = block;
    int p = g ? ff_group_size(g) : 1;
    if (coll == FF_COLL_ALLREDUCE)
        c = block * (size_t)p; /* a vector of p blocks */
    if (g) {
        size_t ns = coll == FF_COLL_REDUCE_SCATTER ? c * p : c;
        for (size_t i = 0; i < ns; i++)
            send[i] = bench_value(ff_group_rank(g), i);
    }
    return bench_time_coll(ctx, g, world, coll, FF_ALGO_RING, FF_WIRE_FP32, send, recv, c, 2,
                           iters);
}

/* Creates the group of this rank's color (MPI_UNDEFINED: none). */
static ff_group *split_group(ff_ctx *ctx, int color, int key, const char *name)
{
    MPI_Comm comm;
    MPI_Comm_split(ff_ctx_comm(ctx), color, key, &comm);
    if (comm == MPI_COMM_NULL)
        return NULL;
    ff_group *g = NULL;
    if (ff_group_create(ctx, comm, name, &g) != FF_OK) {
        fprintf(stderr, "fourfold: error: %s\n", ff_ctx_error(ctx));
        MPI_Abort(MPI_COMM_WORLD, CLI_FAIL);
    }
    MPI_Comm_free(&comm);
    return g;
}

int cmd_bench_profile(int argc, char **argv)
{
    const char *out = "profile.json", *name = NULL;
    size_t max_bytes = 4u << 20;
    int iters = 7, quick = 0, factor = 2;
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    cli_args a;
    cli_args_init(&a, argc, argv);
    while (cli_next(&a)) {
        const char *v;
        long n;
        if (cli_is(&a, "help")) {
            cli_print("%s", help_profile);
            return CLI_OK;
        }
        if (cli_is(&a, "quick")) {
            quick = 1;
            continue;
        }
        if (!a.name)
            return cli_unknown(&a, "bench profile");
        if (!(v = cli_value(&a)))
            return CLI_USAGE;
        if (cli_is(&a, "out")) {
            out = v;
        } else if (cli_is(&a, "name")) {
            name = v;
        } else if (cli_is(&a, "max-bytes")) {
            if (cli_parse_size("max-bytes", v, &max_bytes) || max_bytes < 1024) {
                cli_error("--max-bytes: at least 1K");
                return CLI_USAGE;
            }
        } else if (cli_is(&a, "cores-per-node")) {
            if (cli_parse_int("cores-per-node", v, 1, 1 << 20, &cores))
                return CLI_USAGE;
        } else if (cli_is(&a, "factor")) {
            if (cli_parse_int("factor", v, 2, 16, &n))
                return CLI_USAGE;
            factor = (int)n;
        } else if (cli_is(&a, "iters")) {
            if (cli_parse_int("iters", v, 1, 10000, &n))
                return CLI_USAGE;
            iters = (int)n;
        } else {
            return cli_unknown(&a, "bench profile");
        }
    }
    if (quick) {
        iters = 3;
        if (max_bytes > (256u << 10))
            max_bytes = 256u << 10;
    }

    ff_ctx *ctx;
    ff_ctx_options co;
    ff_ctx_options_default(&co);
    co.progress = FF_PROGRESS_WAIT;
    if (ff_ctx_create(&ctx, MPI_COMM_WORLD, &co) != FF_OK) {
        cli_error("%s", ff_ctx_error(ctx));
        ff_ctx_destroy(ctx);
        return CLI_FAIL;
    }
    MPI_Comm world = ff_ctx_comm(ctx);
    int size = ff_ctx_size(ctx), me = ff_ctx_rank(ctx), N = ff_ctx_nodes(ctx);
    /* rank 0 writes the profile: refused before measuring if it cannot */
    int unwritable = me == 0 && ff_file_writable(out) != 0, err_no = errno;
    MPI_Bcast(&unwritable, 1, MPI_INT, 0, world);
    if (unwritable) {
        cli_error("cannot write %s: %s", out, strerror(err_no));
        ff_ctx_destroy(ctx);
        return CLI_FAIL;
    }
    int my_node = ff_ctx_node_of(ctx, me), local = 0, g = size;
    int *on_node = calloc((size_t)N, sizeof(int));
    if (!on_node)
        MPI_Abort(MPI_COMM_WORLD, CLI_FAIL);
    for (int r = 0; r < size; r++) {
        int j = ff_ctx_node_of(ctx, r);
        if (r < me && j == my_node)
            local++;
        on_node[j]++;
    }
    for (int j = 0; j < N; j++)
        g = on_node[j] < g ? on_node[j] : g; /* ranks per node: the smallest node */
    free(on_node);
    cli_print("# fourfold bench profile: %d ranks, %d node(s), %d rank(s) per node "
              "(smallest node)%s\n",
              size, N, g, getenv("FF_RANKS_PER_NODE") ? " (FF_RANKS_PER_NODE)" : "");

    /* Intra-node samples synchronise (barrier, slowest rank) within their
     * node only: a barrier across a slow link releases the ranks up to a
     * one-way latency apart, which would count as intra-node time. */
    MPI_Comm node_comm;
    MPI_Comm_split(world, my_node, me, &node_comm);

    /* sizes: block bytes from 1K by `factor` to max_bytes (quick: 3 sizes);
     * factor 2 by default, so that a regime boundary (comm/fit.c) falls
     * within a factor of two of where it is */
    size_t blocks[48];
    int nb = 0;
    for (size_t b = 1024; b <= max_bytes && nb < 48; b *= quick ? 16 : (size_t)factor)
        blocks[nb++] = b / 4;
    int gmax = g > N ? g : N;
    size_t max_block = blocks[nb - 1];
    size_t ib_block = quick ? max_block : (max_bytes / 4 > (1u << 20) ? (1u << 20) : max_bytes / 4);
    size_t big = (max_block > ib_block ? max_block : ib_block) * (size_t)(gmax > 1 ? gmax : 2);
    float *send = malloc(big * sizeof(float)); /* RS input, AR vector: p blocks */
    float *recv = malloc(big * sizeof(float));
    sample *smp = malloc(sizeof(sample) * (size_t)(3 * nb * (gmax + 1)));
    if (!send || !recv || !smp)
        MPI_Abort(MPI_COMM_WORLD, CLI_FAIL);
    int ns = 0;
    static const ff_coll colls[3] = {FF_COLL_ALLGATHER, FF_COLL_REDUCE_SCATTER, FF_COLL_ALLREDUCE};
    for (int level = 0; level < 2; level++) {
        int top = level == 0 ? g : N;
        for (int p = 2; p <= top; p++) {
            /* intra: the first p ranks of every node; inter: local index 0
             * of the first p nodes */
            int in = level == 0 ? local < p : (local == 0 && my_node < p);
            ff_group *grp = split_group(ctx, in ? (level == 0 ? my_node : 0) : MPI_UNDEFINED, me,
                                        level == 0 ? "intra" : "inter");
            for (int ci = 0; ci < 3; ci++)
                for (int bi = 0; bi < nb; bi++) {
                    double t = time_ring(ctx, grp, level == 0 ? node_comm : world, colls[ci],
                                         blocks[bi], iters, send, recv);
                    sample *s = &smp[ns++];
                    s->level = level;
                    s->coll = colls[ci];
                    s->p = p;
                    s->s.msg_bytes = (double)blocks[bi] * 4;
                    s->s.steps = (colls[ci] == FF_COLL_ALLREDUCE ? 2.0 : 1.0) * (p - 1);
                    s->s.t_s = t;
                    /* a ring reduce-scatter adds p-1 received blocks */
                    s->s.add_bytes = colls[ci] == FF_COLL_ALLGATHER ? 0 : (p - 1) * s->s.msg_bytes;
                }
            ff_group_destroy(grp);
        }
    }
    ff_coll_fit_result fit[2];
    fit_level(smp, ns, 0, &fit[0]);
    fit_level(smp, ns, 1, &fit[1]);
    ff_coll_model dflt;
    ff_coll_model_default(&dflt);
    if (!fit[0].ok) {
        fit[0].alpha_s = dflt.alpha_intra_s;
        fit[0].beta_Bps = dflt.beta_intra_Bps;
        fit[0].small_max_B = 0;
        fit[0].reduce_Bps = dflt.reduce_Bps;
    }
    if (!fit[1].ok) {
        fit[1].alpha_s = dflt.alpha_inter_s;
        fit[1].beta_Bps = dflt.beta_inter_Bps;
        fit[1].small_max_B = 0;
        fit[1].reduce_Bps = dflt.reduce_Bps;
    }
    /* the additions are the CPU's: timed (the fit's value is printed) */
    double reduce = time_additions(world, quick);
    cli_print("\n# samples: fourfold ring, median of %d iterations of the slowest rank\n"
              "#%5s %-14s %3s %12s %12s %12s %9s %s\n",
              iters, "level", "collective", "p", "block(B)", "time(us)", "fit(us)", "residual",
              "regime");
    for (int i = 0; i < ns; i++) {
        const sample *s = &smp[i];
        const ff_coll_fit_result *f = &fit[s->level];
        double pred = ff_coll_fit_predict(f, &s->s), t = s->s.t_s;
        int small = f->small_max_B > 0 && s->s.msg_bytes <= f->small_max_B;
        cli_print(" %5s %-14s %3d %12.0f %12.1f %12.1f %8.1f%% %s\n", s->level ? "inter" : "intra",
                  ff_coll_name(s->coll), s->p, s->s.msg_bytes, t * 1e6, pred * 1e6,
                  100 * (pred - t) / t, f->small_max_B > 0 ? (small ? "small" : "large") : "-");
    }
    for (int l = 0; l < 2; l++) {
        const ff_coll_fit_result *f = &fit[l];
        const char *lname = l ? "inter" : "intra";
        if (!f->ok) {
            cli_print("# %s: not measured (%s); the defaults are written: alpha %.3g s, beta "
                      "%.4g B/s\n",
                      lname, l ? "one node" : "one rank per node", f->alpha_s, f->beta_Bps);
            continue;
        }
        if (f->small_max_B > 0)
            cli_print("# %s: two regimes: messages <= %.0f B alpha %.3g s, beta %.4g B/s; larger "
                      "alpha %.3g s, beta %.4g B/s",
                      lname, f->small_max_B, f->alpha_small_s, f->beta_small_Bps, f->alpha_s,
                      f->beta_Bps);
        else
            cli_print("# %s: alpha %.3g s, beta %.4g B/s (%.3f GB/s)", lname, f->alpha_s,
                      f->beta_Bps, f->beta_Bps * 1e-9);
        cli_print("; additions %.4g B/s; relative residual RMS %.1f%%, largest %.1f%%, %d "
                  "samples\n",
                  f->reduce_Bps, 100 * f->rms_rel, 100 * f->max_rel, f->n);
    }

    cli_print("# additions, timed on every rank at once: %.4g B/s (%.2f GB/s), written as "
              "reduce_Bps (the fits' above are not)\n",
              reduce, reduce * 1e-9);

    /* intra_bw: (P, G) with P*G <= g, all groups of every node at once */
    ff_profile_doc doc; /* the profile (plan/profile.h), written by rank 0 below */
    ff_profile_doc_init(&doc);
    doc.has[FF_PK_INTRA_BW] = 1; /* an empty list where nothing is measured */
    cli_print("\n# intra-node bandwidth: ring all-gather of %zu B per rank, all groups at once\n"
              "#%5s %5s %14s\n",
              ib_block * 4, "inner", "size", "B/s per rank");
    for (int P = 1; P <= g; P++)
        for (int G = 2; P * G <= g; G++) {
            int span = P * G, blocks_per_node = g / span;
            int in = local < blocks_per_node * span;
            int color = in ? (my_node * g + local % P + P * (local / span)) : MPI_UNDEFINED;
            ff_group *grp = split_group(ctx, color, (local / P) % G, "intra_bw");
            double t = bench_time_coll(ctx, grp, node_comm, FF_COLL_ALLGATHER, FF_ALGO_RING,
                                       FF_WIRE_FP32, send, recv, ib_block, 2, iters);
            ff_group_destroy(grp);
            double Bps = (double)(G - 1) * (double)ib_block * 4 / t;
            cli_print(" %5d %5d %14.4g\n", P, G, Bps);
            if (ff_profile_doc_add_intra_bw(&doc, P, G, sig6(Bps)) != FF_OK)
                cli_print("# (not written: a profile holds %d intra_bw entries)\n",
                          FF_PROFILE_MAX_BW);
        }

    /* sgemm, every rank at once */
    int dim = quick ? 256 : 1024;
    double med = gemm_rate(world, size, dim, dim, dim, quick ? 0.1 : 1.0);
    cli_print("\n# sgemm %dx%dx%d, 1 thread, all ranks at once: %.2f GFLOP/s per rank (median), "
              "OpenBLAS core %s\n",
              dim, dim, dim, med * 1e-9, ff_blas_core());
    /* the profile's gemm_flops is one rank's rate on a core of its own; the
     * planner shares it among the ranks of a node that compute at once
     * (docs/planner.md, "Machine profiles"). Measured with more ranks than
     * cores on a node, each rank had cores/ranks of one. */
    double share = cores > 0 && g > cores ? (double)g / (double)cores : 1;
    if (share > 1) {
        med *= share;
        cli_print("# %d ranks shared %ld cores: %.2f GFLOP/s per rank on a core of its own\n", g,
                  cores, med * 1e-9);
    }
    /* the GEMM curve (gemm_half_dim, gemm_call_s): shapes with one or three
     * sides thin, the search bench/gemm_shape_fit.py runs, and the large-
     * shape rate the curve approaches (gemm_flops) the one that predicts
     * the dim^3 shape as measured. Every rate is scaled by the cores' share,
     * as dim^3's (small shapes are likely less slowed by sharing, which
     * would make the fit too flat where ranks outnumber cores). */
    const int thin[2] = {quick ? 32 : 64, quick ? 64 : 256};
    double shapes[9][4];
    int nshape = 0;
    for (int t = 0; t < 2; t++) {
        for (int side = 0; side < 3; side++) {
            int d[3] = {dim, dim, dim};
            d[side] = thin[t];
            shapes[nshape][0] = d[0], shapes[nshape][1] = d[1], shapes[nshape][2] = d[2];
            shapes[nshape++][3] =
                share * gemm_rate(world, size, d[0], d[1], d[2], quick ? 0.05 : 0.3);
        }
        shapes[nshape][0] = shapes[nshape][1] = shapes[nshape][2] = thin[t];
        shapes[nshape++][3] =
            share * gemm_rate(world, size, thin[t], thin[t], thin[t], quick ? 0.05 : 0.3);
    }
    shapes[nshape][0] = shapes[nshape][1] = shapes[nshape][2] = dim, shapes[nshape++][3] = med;
    double gemm_flops = med, half_dim = 0, call_s = 0, fitted[9], gemm_med = 0, gemm_max = 0;
    int curve = ff_profile_fit_gemm((const double(*)[4])shapes, nshape, nshape - 1, &gemm_flops,
                                    &half_dim, &call_s, fitted, &gemm_med, &gemm_max) == FF_OK;
    if (!curve) {
        gemm_flops = med;
        cli_print("# GEMM curve: not fitted (a shape's rate is not positive)\n");
    } else {
        cli_print("# GEMM curve: gemm_flops %.2f GFLOP/s, gemm_half_dim %g, gemm_call_s %.3g%s "
                  "(median error %.1f %%, largest %.1f %%)\n"
                  "#%21s %12s %12s   (per rank on a core of its own)\n",
                  gemm_flops * 1e-9, half_dim, call_s,
                  half_dim >= 2000 || call_s >= 30e-6 ? ", at the search's edge" : "",
                  100 * gemm_med, 100 * gemm_max, "m x n x k", "GFLOP/s", "fitted");
        for (int i = 0; i < nshape; i++) {
            char shape[48];
            snprintf(shape, sizeof shape, "%.0fx%.0fx%.0f", shapes[i][0], shapes[i][1],
                     shapes[i][2]);
            cli_print(" %21s %12.2f %12.2f\n", shape, shapes[i][3] * 1e-9, fitted[i] * 1e-9);
        }
    }
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
    double mem = pages > 0 && page > 0 ? (double)pages * (double)page / (g > 0 ? g : 1) : 0;

    int code = CLI_OK;
    if (me == 0) {
        char host[256] = "machine";
        gethostname(host, sizeof host - 1);
        char date[32] = "";
        time_t now = time(NULL);
        struct tm tmv;
        if (gmtime_r(&now, &tmv))
            strftime(date, sizeof date, "%Y-%m-%dT%H:%M:%SZ", &tmv);
        ff_profile_doc_set_name(&doc, name ? name : host);
        ff_profile_doc_set(&doc, FF_PK_RANKS_PER_NODE, g);
        ff_profile_doc_set(&doc, FF_PK_CORES_PER_NODE, (double)cores);
        ff_profile_doc_set(&doc, FF_PK_MEMORY_BYTES, sig6(mem));
        ff_profile_doc_set(&doc, FF_PK_GEMM_FLOPS, sig6(gemm_flops));
        ff_profile_doc_set(&doc, FF_PK_PEAK_FLOPS, sig6(gemm_flops));
        if (curve)
            ff_profile_doc_set(&doc, FF_PK_GEMM_HALF_DIM, half_dim);
        if (curve && call_s > 0)
            ff_profile_doc_set(&doc, FF_PK_GEMM_CALL_S, call_s);
        static const ff_profile_key level[2][5] = {
            {FF_PK_ALPHA_INTRA, FF_PK_BETA_INTRA, FF_PK_SMALL_MAX_INTRA, FF_PK_ALPHA_INTRA_SMALL,
             FF_PK_BETA_INTRA_SMALL},
            {FF_PK_ALPHA_INTER, FF_PK_BETA_INTER, FF_PK_SMALL_MAX_INTER, FF_PK_ALPHA_INTER_SMALL,
             FF_PK_BETA_INTER_SMALL}};
        for (int l = 0; l < 2; l++) {
            ff_profile_doc_set(&doc, level[l][0], sig6(fit[l].alpha_s));
            ff_profile_doc_set(&doc, level[l][1], sig6(fit[l].beta_Bps));
            if (fit[l].small_max_B > 0) { /* a second regime */
                ff_profile_doc_set(&doc, level[l][2], sig6(fit[l].small_max_B));
                ff_profile_doc_set(&doc, level[l][3], sig6(fit[l].alpha_small_s));
                ff_profile_doc_set(&doc, level[l][4], sig6(fit[l].beta_small_Bps));
            }
        }
        ff_profile_doc_set(&doc, FF_PK_REDUCE_BPS, sig6(reduce));
        char shape[64], err[512] = "out of memory";
        snprintf(shape, sizeof shape, "%dx%dx%d", dim, dim, dim);
        ff_profile_fit about = {
            .method = "least squares on relative error, one or two regimes per level (BIC), "
                      "ring all-gather, reduce-scatter, all-reduce",
            .date = date,
            .host = host,
            .gemm_shape = shape,
            .ranks = size,
            .nodes = N,
            .iters = iters,
            .level = {{fit[0].ok, fit[0].n, fit[0].rms_rel, fit[0].max_rel},
                      {fit[1].ok, fit[1].n, fit[1].rms_rel, fit[1].max_rel}},
            .curve_shapes = curve ? nshape : 0,
            .curve_median_rel = gemm_med,
            .curve_max_rel = gemm_max};
        if (ff_profile_doc_set_fit(&doc, &about) != FF_OK ||
            ff_profile_doc_save(out, &doc, err, sizeof err) != FF_OK) {
            fprintf(stderr, "fourfold: error: %s\n", err);
            code = CLI_FAIL;
        } else {
            printf("\nprofile written to %s\n", out);
            fflush(stdout);
        }
    }
    ff_profile_doc_free(&doc);
    MPI_Bcast(&code, 1, MPI_INT, 0, world);
    free(send), free(recv), free(smp);
    MPI_Comm_free(&node_comm);
    ff_ctx_destroy(ctx);
    return code;
}
