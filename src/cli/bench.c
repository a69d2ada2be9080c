/* fourfold bench: measurements that never fail on speed (STYLE). This file:
 * the dispatcher and `bench coll`, an
 * nccl-tests-style table of every collective algorithm over a size sweep.
 *
 * Columns follow nccl-tests: size is the largest buffer of one rank in
 * bytes (all-gather: the output, p*count; reduce-scatter and all-to-all:
 * the input, p*count; all-reduce: the vector), count = size / 4 elements,
 * time the median over iterations of the slowest rank's time (after
 * warm-up, a barrier before each iteration), algbw = size / time, busbw =
 * algbw * (p-1)/p (all-gather, reduce-scatter, all-to-all) or 2(p-1)/p
 * (all-reduce), #wrong = elements that differ from the exact result, summed
 * over ranks (inputs are small integers: every algorithm must be exact, on
 * the bf16 wire too). */
#include "bench.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- bench coll ---- */

typedef struct {
    int colls[FF_NCOLL];
    int algos[FF_NALGO + 1]; /* index algo+1: BENCH_MPI_BLOCKING at 0 */
    size_t min_bytes, max_bytes;
    double factor;
    int iters, warmup, place; /* place: 1 out, 2 in, 3 both */
    double max_seconds;
    ff_wire wire;
    const char *json;
} coll_opts;

static const char help_coll[] =
    "usage: mpirun -np N fourfold bench coll [options]\n\n"
    "nccl-tests-style table of all-gather, reduce-scatter, all-reduce and all-to-all\n"
    "on all ranks of the job, for the MPI library (mpi-blk: its blocking collective,\n"
    "mpi: its non-blocking one) and each of fourfold's algorithms, out of place and\n"
    "in place, with a correctness check (#wrong) of every result. Exits 1 if any\n"
    "result is wrong; never fails on speed.\n\n"
    "options:\n"
    "  --colls LIST      allgather,reduce_scatter,allreduce,alltoall (or ag,rs,ar,a2a;\n"
    "                    default all)\n"
    "  --algos LIST      mpi-blk,mpi,ring,rec,rec-whole,direct,hier-ring,hier-rec,\n"
    "                    auto (default all; rec-whole: all-reduce only)\n"
    "  -b, --minbytes S  smallest size, bytes per rank (default 4K)\n"
    "  -e, --maxbytes S  largest size (default 64M)\n"
    "  -f, --factor F    size multiplier (default 4)\n"
    "  -n, --iters N     timed iterations (default 20)\n"
    "  -w, --warmup N    untimed iterations first (default 5)\n"
    "  --max-seconds S   fewer iterations (at least 3) when one would exceed S seconds\n"
    "                    per size and algorithm (default 0: off)\n"
    "  --place P         out, in or both (default both)\n"
    "  --wire W          fp32 or bf16 (default fp32)\n"
    "  --json FILE       also append one JSON line per row to FILE\n\n"
    "Environment: FF_RANKS_PER_NODE=k pretends nodes of k ranks; FF_PROFILE=file\n"
    "sets the model behind auto and the pred column; FF_STRICT_VOLUME=0 lets auto\n"
    "pick algorithms whose bytes the planner does not predict (docs/collectives.md).\n";

static int parse_list(const char *text, const char *const *names, const char *const *alias, int n,
                      int *on, const char *opt)
{
    char buf[256];
    snprintf(buf, sizeof buf, "%s", text);
    for (int i = 0; i < n; i++)
        on[i] = 0;
    for (char *tok = strtok(buf, ","); tok; tok = strtok(NULL, ",")) {
        int found = 0;
        for (int i = 0; i < n; i++)
            if (!strcmp(tok, names[i]) || (alias && alias[i] && !strcmp(tok, alias[i])))
                on[i] = found = 1;
        if (!found) {
            cli_error("--%s: unknown name '%s'", opt, tok);
            return -1;
        }
    }
    return 0;
}

static const char *const coll_alias[FF_NCOLL] = {"ag", "rs", "ar", "a2a"};
/* rows in this order; index = algo + 1 */
static const char *const algo_row_names[FF_NALGO + 1] = {
    "mpi-blk", "auto", "mpi", "ring", "rec", "hier-ring", "hier-rec", "rec-whole", "direct"};
static const int row_order[] = {BENCH_MPI_BLOCKING, FF_ALGO_MPI,       FF_ALGO_RING,
                                FF_ALGO_REC,        FF_ALGO_REC_WHOLE, FF_ALGO_DIRECT,
                                FF_ALGO_HIER_RING,  FF_ALGO_HIER_REC,  FF_ALGO_AUTO};
enum { NROWS = sizeof row_order / sizeof row_order[0] };

static int parse_coll_opts(int argc, char **argv, coll_opts *o)
{
    memset(o, 0, sizeof *o);
    for (int i = 0; i < FF_NCOLL; i++)
        o->colls[i] = 1;
    for (int i = 0; i <= FF_NALGO; i++)
        o->algos[i] = 1;
    o->min_bytes = 4096;
    o->max_bytes = 64u << 20;
    o->factor = 4;
    o->iters = 20;
    o->warmup = 5;
    o->place = 3;
    o->wire = FF_WIRE_FP32;
    cli_args a;
    cli_args_init(&a, argc, argv);
    while (cli_next(&a)) {
        const char *v;
        long n;
        bench_short_option(&a);
        if (cli_is(&a, "help")) {
            cli_print("%s", help_coll);
            return -1;
        }
        if (!a.name)
            return cli_unknown(&a, "bench coll");
        if (!(v = cli_value(&a)))
            return CLI_USAGE;
        if (cli_is(&a, "colls")) {
            const char *names[FF_NCOLL];
            for (int i = 0; i < FF_NCOLL; i++)
                names[i] = ff_coll_name((ff_coll)i);
            if (parse_list(v, names, coll_alias, FF_NCOLL, o->colls, "colls"))
                return CLI_USAGE;
        } else if (cli_is(&a, "algos")) {
            if (parse_list(v, algo_row_names, NULL, FF_NALGO + 1, o->algos, "algos"))
                return CLI_USAGE;
        } else if (cli_is(&a, "minbytes")) {
            if (cli_parse_size("minbytes", v, &o->min_bytes))
                return CLI_USAGE;
        } else if (cli_is(&a, "maxbytes")) {
            if (cli_parse_size("maxbytes", v, &o->max_bytes))
                return CLI_USAGE;
        } else if (cli_is(&a, "factor")) {
            if (cli_parse_double("factor", v, 1.01, 1024, &o->factor))
                return CLI_USAGE;
        } else if (cli_is(&a, "iters")) {
            if (cli_parse_int("iters", v, 1, 1000000, &n))
                return CLI_USAGE;
            o->iters = (int)n;
        } else if (cli_is(&a, "warmup")) {
            if (cli_parse_int("warmup", v, 0, 1000000, &n))
                return CLI_USAGE;
            o->warmup = (int)n;
        } else if (cli_is(&a, "max-seconds")) {
            if (cli_parse_double("max-seconds", v, 0, 1e6, &o->max_seconds))
                return CLI_USAGE;
        } else if (cli_is(&a, "place")) {
            o->place = !strcmp(v, "out") ? 1 : !strcmp(v, "in") ? 2 : !strcmp(v, "both") ? 3 : 0;
            if (!o->place) {
                cli_error("--place %s: expected out, in or both", v);
                return CLI_USAGE;
            }
        } else if (cli_is(&a, "wire")) {
            if (!strcmp(v, "fp32") || !strcmp(v, "bf16")) {
                o->wire = !strcmp(v, "bf16") ? FF_WIRE_BF16 : FF_WIRE_FP32;
            } else {
                cli_error("--wire %s: expected fp32 or bf16", v);
                return CLI_USAGE;
            }
        } else if (cli_is(&a, "json")) {
            o->json = v;
        } else {
            return cli_unknown(&a, "bench coll");
        }
    }
    if (o->min_bytes < 4 || o->max_bytes < o->min_bytes) {
        cli_error("sizes: need 4 <= --minbytes <= --maxbytes");
        return CLI_USAGE;
    }
    return CLI_OK;
}

/* sum over ranks q < p of bench_value(q, m), for m = i mod 11 */
static void column_sums(int p, double *S)
{
    for (int m = 0; m < 11; m++) {
        S[m] = 0;
        for (int q = 0; q < p; q++)
            S[m] += bench_value(q, (size_t)m);
    }
}

/* Elements of this rank's result that differ from the exact one. */
static long count_wrong(ff_coll coll, int p, int r, const float *recv, size_t c, const double *S)
{
    long bad = 0;
    switch (coll) {
    case FF_COLL_ALLGATHER:
        for (int b = 0; b < p; b++)
            for (size_t i = 0; i < c; i++)
                bad += recv[(size_t)b * c + i] != bench_value(b, i);
        break;
    case FF_COLL_REDUCE_SCATTER:
        for (size_t i = 0; i < c; i++)
            bad += recv[i] != (float)S[((size_t)r * c + i) % 11];
        break;
    case FF_COLL_ALLREDUCE:
        for (size_t i = 0; i < c; i++)
            bad += recv[i] != (float)S[i % 11];
        break;
    default:
        for (int b = 0; b < p; b++)
            for (size_t i = 0; i < c; i++)
                bad += recv[(size_t)b * c + i] != bench_value(b, (size_t)r * c + i);
    }
    return bad;
}

typedef struct {
    double t;   /* seconds, < 0 if not run */
    long wrong; /* summed over ranks */
} cell;

/* Times every algorithm of algos[0..na) on one (collective, size, place),
 * interleaved: iteration i runs each algorithm once in turn, so that the
 * noise of a shared machine falls on all of them alike. In place, the
 * rank's input is restored before every run (outside the timed region). The
 * results of the last iteration are checked. */
static void measure_all(ff_ctx *ctx, ff_group *g, const coll_opts *o, ff_coll coll, int ip,
                        const int *algos, int na, float *send, float *recv, size_t c,
                        const double *S, cell *cells)
{
    int p = ff_group_size(g), r = ff_group_rank(g);
    size_t ns = (coll == FF_COLL_REDUCE_SCATTER || coll == FF_COLL_ALLTOALL) ? p * c : c;
    float *slot = coll == FF_COLL_ALLGATHER ? recv + (size_t)r * c : recv;
    const float *src = ip ? slot : send;
    MPI_Comm comm = ff_group_comm(g);
    for (size_t i = 0; i < ns; i++)
        send[i] = bench_value(r, i);
    int warmup = o->warmup, iters = o->iters;
    if (o->max_seconds > 0 && warmup < 1)
        warmup = 1; /* the last warm-up is the probe */
    double probe = 0;
    for (int a = 0; a < na; a++)
        for (int w = 0; w < warmup; w++) {
            if (ip)
                memcpy(slot, send, c * sizeof(float));
            MPI_Barrier(comm);
            double t0 = MPI_Wtime();
            int rc = bench_run_once(g, coll, algos[a], o->wire, src, recv, c);
            if (rc != FF_OK)
                bench_die_in_collective(ctx, rc);
            if (w == warmup - 1)
                probe += MPI_Wtime() - t0;
        }
    if (o->max_seconds > 0) { /* agreed: every rank must run as many */
        MPI_Allreduce(MPI_IN_PLACE, &probe, 1, MPI_DOUBLE, MPI_MAX, comm);
        if (probe * iters > o->max_seconds) {
            iters = (int)(o->max_seconds / probe);
            iters = iters < 3 ? 3 : iters;
        }
    }
    double *t = malloc((size_t)na * (size_t)iters * sizeof *t);
    long *bad = calloc((size_t)na, sizeof *bad);
    if (!t || !bad)
        bench_die_in_collective(ctx, FF_ENOMEM);
    for (int it = 0; it < iters; it++)
        for (int a = 0; a < na; a++) {
            if (ip)
                memcpy(slot, send, c * sizeof(float));
            MPI_Barrier(comm);
            double t0 = MPI_Wtime();
            int rc = bench_run_once(g, coll, algos[a], o->wire, src, recv, c);
            t[(size_t)a * iters + it] = MPI_Wtime() - t0;
            if (rc != FF_OK)
                bench_die_in_collective(ctx, rc);
            if (it == iters - 1)
                bad[a] = count_wrong(coll, p, r, recv, c, S);
        }
    MPI_Allreduce(MPI_IN_PLACE, t, na * iters, MPI_DOUBLE, MPI_MAX, comm);
    MPI_Allreduce(MPI_IN_PLACE, bad, na, MPI_LONG, MPI_SUM, comm);
    for (int a = 0; a < na; a++) {
        cells[a].t = ff_median(t + (size_t)a * iters, iters);
        cells[a].wrong = bad[a];
    }
    free(t);
    free(bad);
}

static double bus_factor(ff_coll coll, int p)
{
    return coll == FF_COLL_ALLREDUCE ? 2.0 * (p - 1) / p : (double)(p - 1) / p;
}

static void print_cell(char *buf, size_t len, cell c, double size, double bf)
{
    if (c.t < 0) {
        snprintf(buf, len, "  %9s %7s %7s %6s", "-", "-", "-", "-");
        return;
    }
    double algbw = size / c.t * 1e-9;
    snprintf(buf, len, "  %9.1f %7.3f %7.3f %6ld", c.t * 1e6, algbw, algbw * bf, c.wrong);
}

int cmd_bench_coll(int argc, char **argv)
{
    coll_opts o;
    int prc = parse_coll_opts(argc, argv, &o);
    if (prc != CLI_OK)
        return prc < 0 ? CLI_OK : prc;
    ff_ctx *ctx;
    ff_ctx_options co;
    ff_ctx_options_default(&co);
    co.progress = FF_PROGRESS_WAIT;
    if (ff_ctx_create(&ctx, MPI_COMM_WORLD, &co) != FF_OK) {
        cli_error("%s", ff_ctx_error(ctx));
        ff_ctx_destroy(ctx);
        return CLI_FAIL;
    }
    ff_group *g;
    if (ff_group_create(ctx, ff_ctx_comm(ctx), "WORLD", &g) != FF_OK) {
        cli_error("%s", ff_ctx_error(ctx));
        ff_ctx_destroy(ctx);
        return CLI_FAIL;
    }
    int p = ff_group_size(g), r = ff_group_rank(g), nodes, per_node;
    ff_group_topology(g, &nodes, &per_node);
    FILE *json = NULL;
    int opened = !o.json || r != 0 || (json = fopen(o.json, "a")) != NULL;
    MPI_Bcast(&opened, 1, MPI_INT, 0, ff_ctx_comm(ctx));
    if (!opened) { /* before any collective is timed */
        cli_error("--json %s: cannot open for appending", o.json);
        ff_group_destroy(g);
        ff_ctx_destroy(ctx);
        return CLI_FAIL;
    }
    double S[11];
    column_sums(p, S);
    long total_wrong = 0;
    const char *wire = o.wire == FF_WIRE_BF16 ? "bf16" : "fp32";
    char shape[48];
    if (per_node)
        snprintf(shape, sizeof shape, "%d node(s) x %d", nodes, per_node);
    else
        snprintf(shape, sizeof shape, "%d nodes of uneven size", nodes);
    cli_print("# fourfold bench coll: %d ranks (%s), wire %s, %d+%d iterations (median of the "
              "slowest rank)%s\n",
              p, shape, wire, o.warmup, o.iters,
              getenv("FF_RANKS_PER_NODE") ? ", FF_RANKS_PER_NODE" : "");

    for (int ci = 0; ci < FF_NCOLL; ci++) {
        if (!o.colls[ci])
            continue;
        ff_coll coll = (ff_coll)ci;
        int spread = coll != FF_COLL_ALLREDUCE; /* size = p * count */
        size_t max_count = o.max_bytes / 4 / (spread ? (size_t)p : 1);
        if (max_count == 0)
            max_count = 1;
        size_t ns = (coll == FF_COLL_REDUCE_SCATTER || coll == FF_COLL_ALLTOALL) ? p * max_count
                                                                                 : max_count;
        size_t nr =
            (coll == FF_COLL_ALLGATHER || coll == FF_COLL_ALLTOALL) ? p * max_count : max_count;
        float *send = malloc(ns * sizeof(float)), *recv = malloc(nr * sizeof(float));
        int ok = send && recv, all_ok;
        MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
        if (!all_ok) {
            cli_error("out of memory for %s buffers of %zu bytes", ff_coll_name(coll),
                      (ns + nr) * 4);
            free(send), free(recv);
            total_wrong = -1;
            break;
        }
        int can_ip = coll == FF_COLL_ALLGATHER || coll == FF_COLL_ALLREDUCE;
        cli_print("\n# %s\n#%12s %12s %6s %5s %-16s %9s   %-33s   %-33s\n", ff_coll_name(coll),
                  "size", "count", "type", "redop", "algo", "pred", "out-of-place", "in-place");
        cli_print("#%12s %12s %6s %5s %-16s %9s  %9s %7s %7s %6s  %9s %7s %7s %6s\n", "(B)",
                  "(elements)", "", "", "", "(us)", "time(us)", "algbw", "busbw", "#wrong",
                  "time(us)", "algbw", "busbw", "#wrong");
        /* the rows: every algorithm asked for that implements coll */
        int algos[NROWS], na = 0;
        for (int ri = 0; ri < NROWS; ri++) {
            int algo = row_order[ri];
            if (!o.algos[algo + 1] || (algo >= 0 && !ff_algo_supports((ff_algo)algo, coll)))
                continue;
            if (algo == BENCH_MPI_BLOCKING && o.wire == FF_WIRE_BF16)
                continue; /* the library has no bf16 sum */
            algos[na++] = algo;
        }
        char summary[64][160];
        int nsum = 0;
        for (double sz = (double)o.min_bytes; sz <= (double)o.max_bytes * 1.0000001;
             sz *= o.factor) {
            size_t c = (size_t)sz / 4 / (spread ? (size_t)p : 1);
            if (c == 0)
                c = 1;
            size_t size = c * 4 * (spread ? (size_t)p : 1);
            cell out[NROWS], in[NROWS];
            for (int i = 0; i < na; i++)
                out[i] = in[i] = (cell){-1, 0};
            if (o.place & 1)
                measure_all(ctx, g, &o, coll, 0, algos, na, send, recv, c, S, out);
            if ((o.place & 2) && can_ip)
                measure_all(ctx, g, &o, coll, 1, algos, na, send, recv, c, S, in);
            /* what AUTO runs, and how it compares (out of place) */
            int pick = (int)ff_coll_choose(g, coll, c, o.wire);
            if ((pick == FF_ALGO_HIER_RING || pick == FF_ALGO_HIER_REC) && !per_node)
                pick = pick == FF_ALGO_HIER_REC ? FF_ALGO_REC : FF_ALGO_RING;
            double best = -1, t_pick = -1, t_mpi = -1;
            int best_algo = 0;
            for (int i = 0; i < na; i++) {
                int algo = algos[i];
                total_wrong +=
                    (out[i].wrong > 0 ? out[i].wrong : 0) + (in[i].wrong > 0 ? in[i].wrong : 0);
                int ran = algo == FF_ALGO_AUTO ? pick : algo; /* what actually ran */
                if ((ran == FF_ALGO_HIER_RING || ran == FF_ALGO_HIER_REC) && !per_node)
                    ran = ran == FF_ALGO_HIER_REC ? FF_ALGO_REC : FF_ALGO_RING;
                char name[32], pred[16], oc[64], icell[64];
                if (ran != algo)
                    snprintf(name, sizeof name, "%s>%s", algo_row_names[algo + 1],
                             ff_algo_name((ff_algo)ran));
                else
                    snprintf(name, sizeof name, "%s", algo_row_names[algo + 1]);
                double pt = algo >= 0 ? ff_coll_predict(g, coll, (ff_algo)algo, c, o.wire) : -1;
                if (pt >= 0)
                    snprintf(pred, sizeof pred, "%9.1f", pt * 1e6);
                else
                    snprintf(pred, sizeof pred, "%9s", "-");
                double bf = bus_factor(coll, p);
                print_cell(oc, sizeof oc, out[i], (double)size, bf);
                print_cell(icell, sizeof icell, in[i], (double)size, bf);
                cli_print(" %12zu %12zu %6s %5s %-16s %s%s%s\n", size, size / 4, "float",
                          coll == FF_COLL_REDUCE_SCATTER || coll == FF_COLL_ALLREDUCE ? "sum"
                                                                                      : "none",
                          name, pred, oc, icell);
                if (json)
                    fprintf(json,
                            "{\"bench\":\"coll\",\"coll\":\"%s\",\"algo\":\"%s\",\"ran\":\"%s\","
                            "\"ranks\":%d,\"nodes\":%d,\"per_node\":%d,\"wire\":\"%s\","
                            "\"size\":%zu,\"count\":%zu,\"pred_us\":%.3f,\"oop_us\":%.3f,"
                            "\"oop_wrong\":%ld,\"ip_us\":%.3f,\"ip_wrong\":%ld}\n",
                            ff_coll_name(coll), algo_row_names[algo + 1],
                            algo >= 0 ? ff_algo_name((ff_algo)ran) : "mpi-blk", p, nodes, per_node,
                            wire, size, c, pt * 1e6, out[i].t * 1e6, out[i].wrong, in[i].t * 1e6,
                            in[i].wrong);
                if (out[i].t < 0)
                    continue;
                if (algo == FF_ALGO_MPI || algo == BENCH_MPI_BLOCKING) {
                    if (t_mpi < 0 || out[i].t < t_mpi)
                        t_mpi = out[i].t;
                } else if (algo != FF_ALGO_AUTO) {
                    if (best < 0 || out[i].t < best)
                        best = out[i].t, best_algo = algo;
                    if (algo == pick)
                        t_pick = out[i].t;
                }
            }
            if (best > 0 && t_pick > 0 && nsum < 64) {
                char mpi[32] = "-";
                if (t_mpi > 0)
                    snprintf(mpi, sizeof mpi, "%10.1f %8.2f", t_mpi * 1e6, t_pick / t_mpi);
                snprintf(summary[nsum++], sizeof summary[0],
                         "#%12zu %-10s %10.1f %-10s %10.1f %8.2f %s", size,
                         ff_algo_name((ff_algo)best_algo), best * 1e6, ff_algo_name((ff_algo)pick),
                         t_pick * 1e6, t_pick / best, mpi);
            }
        }
        if (nsum > 0) {
            cli_print("# %s, out of place: the algorithm AUTO picks (its row's time) against "
                      "fourfold's fastest and the MPI library's fastest\n"
                      "#%12s %-10s %10s %-10s %10s %8s %10s %8s\n",
                      ff_coll_name(coll), "size", "fastest", "time(us)", "pick", "time(us)",
                      "pick/best", "mpi(us)", "pick/mpi");
            for (int i = 0; i < nsum; i++)
                cli_print("%s\n", summary[i]);
        }
        free(send);
        free(recv);
    }
    if (json)
        fclose(json);
    cli_print("\n# total #wrong: %ld\n", total_wrong);
    ff_group_destroy(g);
    ff_ctx_destroy(ctx);
    return total_wrong != 0 ? CLI_FAIL : CLI_OK;
}

/* ---- dispatch ---- */

static const char help[] =
    "usage: mpirun -np N fourfold bench coll|gemm|profile|tune [options]\n\n"
    "  coll      nccl-tests-style table of every collective algorithm\n"
    "  gemm      sgemm GFLOP/s over shapes and thread counts\n"
    "  profile   measure and fit a machine profile (alpha, beta per level, sgemm\n"
    "            rate) for the planner and the collective selector\n"
    "  tune      time every algorithm on this machine's group layouts and add\n"
    "            measured picks to a profile where the model's choice loses\n\n"
    "fourfold bench SUBCOMMAND --help for its options.\n";

int cmd_bench(int argc, char **argv)
{
    if (argc < 1 || !strcmp(argv[0], "--help") || !strcmp(argv[0], "-h")) {
        cli_print("%s", help);
        return argc < 1 ? CLI_USAGE : CLI_OK;
    }
    if (!strcmp(argv[0], "coll"))
        return cmd_bench_coll(argc - 1, argv + 1);
    if (!strcmp(argv[0], "gemm"))
        return cmd_bench_gemm(argc - 1, argv + 1);
    if (!strcmp(argv[0], "profile"))
        return cmd_bench_profile(argc - 1, argv + 1);
    if (!strcmp(argv[0], "tune"))
        return cmd_bench_tune(argc - 1, argv + 1);
    cli_error("unknown bench '%s' (expected coll, gemm, profile or tune)", argv[0]);
    return CLI_USAGE;
}
