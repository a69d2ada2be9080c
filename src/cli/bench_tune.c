/* fourfold bench tune: measured picks for the collective selector.
 *
 * AUTO ranks the algorithms with the profile's alpha-beta model (comm/
 * select.c). Where the network is not alpha-beta (a shaper's burst, a
 * delay line, an eager/rendezvous switch) the fit's error reaches 30 % and
 * more at a few KiB (docs/coll-bench.md), and the ranking there can be
 * wrong. MPI libraries meet this with tuning tables measured on the machine
 * (Open MPI's coll/tuned rules file, MPICH's JSON tuning files); this is
 * fourfold's.
 *
 * For each layout the grid's groups take on this job: all ranks (N nodes of
 * k), one node's ranks (1 x k, every node at once) and one rank per node
 * (N x 1, the k groups of one local index each at once, as a grid's
 * cross-node groups run), for all-gather, reduce-scatter and all-reduce over
 * a size sweep, it times every algorithm AUTO may run there (ff_coll_allowed)
 * interleaved, the whole sweep --repeats times (the median over them
 * decides: on the emulated cluster one sweep's times of one algorithm
 * differ from another's by a median 1.1-1.26x, docs/coll-bench.md), and
 * where the model's choice measured more than `margin`
 * slower than the fastest (not its twin: the same messages), it records a
 * pick: that collective on that layout runs the fastest for sizes up to the
 * geometric midpoints to the neighbouring sizes, never beyond the smallest
 * and largest measured (the model decides outside). Adjacent picks of one
 * algorithm merge. With --history, the decision is instead on this job and
 * the earlier jobs recorded there (the ranking moves between jobs on the
 * emulated cluster, which repeats inside one job do not sample): each job's
 * times are taken over that job's fastest, and the model's choice stands
 * where it is within the margin of the fastest in the worst case (the 90th
 * percentile over the jobs); elsewhere the algorithm with the smallest
 * worst case is picked. This job's times are added to it. The profile named by
 * --profile gives the model; it is written back (to --out, atomically)
 * with its picks replaced by these, by the profile module (plan/profile.h),
 * which keeps every other key. The selector and the planner both read
 * them (ff_coll_model.picks), so the planner's byte counts keep matching
 * what runs. Rank 0's node stands for every node. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench.h"
#include "plan/profile.h"
#include "util/file.h"

static const char help_tune[] =
    "usage: mpirun -np N fourfold bench tune --profile FILE [options]\n\n"
    "Times every algorithm AUTO may choose for all-gather, reduce-scatter and\n"
    "all-reduce on this job's group layouts (all ranks; one node's ranks; one rank\n"
    "per node) over a size sweep, and where the model's choice measured more than\n"
    "--margin slower than the fastest, adds a measured pick to the profile: AUTO and\n"
    "the planner then run the fastest there. Run it after `bench profile`, with the\n"
    "ranks and nodes of the real job (FF_RANKS_PER_NODE=k pretends nodes of k).\n\n"
    "options:\n"
    "  --profile FILE    the machine profile to tune (required)\n"
    "  --out FILE        where to write the tuned profile (default: --profile itself,\n"
    "                    replaced atomically; its old picks are dropped)\n"
    "  -b, --minbytes S  smallest size, the largest buffer of one rank (default 4K)\n"
    "  -e, --maxbytes S  largest size (default 4M)\n"
    "  -f, --factor F    size multiplier, an integer (default 4)\n"
    "  -n, --iters N     timed iterations per size (default 9, after 1 warm-up)\n"
    "  --repeats R       sweeps of all sizes, one after another; each time is the\n"
    "                    median over them (default 3)\n"
    "  --margin M        a pick where the model's choice is more than M slower, as a\n"
    "                    fraction (default 0.1)\n"
    "  --history FILE    decide on this job and the earlier jobs whose times FILE holds\n"
    "                    (same job shape, every algorithm timed; each job's times over\n"
    "                    its fastest): keep the model's choice where it is within\n"
    "                    --margin of the fastest in 90% of the jobs (in all of up to 9),\n"
    "                    else pick the algorithm with the smallest 90th percentile; then\n"
    "                    add this job's times to FILE (atomically; a missing FILE is\n"
    "                    started). Run tune several times with one FILE to tune across\n"
    "                    jobs.\n"
    "  --rewrite         measure nothing: check the profile and write it to --out as\n"
    "                    read, its picks kept, in the form `bench tune` writes\n";

typedef struct {
    const char *profile, *out, *history;
    size_t min_bytes, max_bytes;
    long factor, iters, repeats;
    double margin;
    int rewrite; /* --rewrite: write the profile as read, measure nothing */
} tune_opts;

static int parse_tune_opts(int argc, char **argv, tune_opts *o)
{
    *o = (tune_opts){NULL, NULL, NULL, 4096, 4u << 20, 4, 9, 3, 0.1, 0};
    cli_args a;
    cli_args_init(&a, argc, argv);
    while (cli_next(&a)) {
        const char *v;
        bench_short_option(&a);
        if (cli_is(&a, "help")) {
            cli_print("%s", help_tune);
            return -1;
        }
        if (cli_is(&a, "rewrite")) {
            o->rewrite = 1;
            continue;
        }
        if (!a.name)
            return cli_unknown(&a, "bench tune");
        if (!(v = cli_value(&a)))
            return CLI_USAGE;
        if (cli_is(&a, "profile")) {
            o->profile = v;
        } else if (cli_is(&a, "out")) {
            o->out = v;
        } else if (cli_is(&a, "minbytes")) {
            if (cli_parse_size("minbytes", v, &o->min_bytes))
                return CLI_USAGE;
        } else if (cli_is(&a, "maxbytes")) {
            if (cli_parse_size("maxbytes", v, &o->max_bytes))
                return CLI_USAGE;
        } else if (cli_is(&a, "factor")) {
            if (cli_parse_int("factor", v, 2, 1024, &o->factor))
                return CLI_USAGE;
        } else if (cli_is(&a, "iters")) {
            if (cli_parse_int("iters", v, 1, 1000000, &o->iters))
                return CLI_USAGE;
        } else if (cli_is(&a, "repeats")) {
            if (cli_parse_int("repeats", v, 1, 99, &o->repeats))
                return CLI_USAGE;
        } else if (cli_is(&a, "history")) {
            o->history = v;
        } else if (cli_is(&a, "margin")) {
            if (cli_parse_double("margin", v, 0, 100, &o->margin))
                return CLI_USAGE;
        } else {
            return cli_unknown(&a, "bench tune");
        }
    }
    if (!o->profile) {
        cli_error("bench tune: --profile FILE is required (the profile to add picks to)");
        return CLI_USAGE;
    }
    if (o->min_bytes < 4 || o->max_bytes < o->min_bytes || o->max_bytes > (1u << 30)) {
        cli_error("sizes: need 4 <= --minbytes <= --maxbytes <= 1G");
        return CLI_USAGE;
    }
    if (!o->out)
        o->out = o->profile;
    return CLI_OK;
}

/* Same messages on this layout: no pick between them (noise). */
static int twins(ff_algo a, ff_algo b, int p, int nodes)
{
    if (a == b)
        return 1;
    if (nodes == 2 && (a == FF_ALGO_HIER_RING || a == FF_ALGO_HIER_REC) &&
        (b == FF_ALGO_HIER_RING || b == FF_ALGO_HIER_REC))
        return 1;
    return p == 2 && (a == FF_ALGO_RING || a == FF_ALGO_REC) &&
           (b == FF_ALGO_RING || b == FF_ALGO_REC);
}

/* A pick as the profile keeps it (plan/profile.h): the rule, the model's
 * choice at its smallest measured size, and the measured sizes it covers. */
typedef ff_profile_pick pick;

enum { NCAND = 6, NSIZES = 64 };
static const ff_algo cands[NCAND] = {FF_ALGO_RING,   FF_ALGO_REC,       FF_ALGO_REC_WHOLE,
                                     FF_ALGO_DIRECT, FF_ALGO_HIER_RING, FF_ALGO_HIER_REC};
static const ff_coll colls[3] = {FF_COLL_ALLGATHER, FF_COLL_REDUCE_SCATTER, FF_COLL_ALLREDUCE};

/* One collective's sweep on a layout: sizes, and per size the algorithms
 * AUTO may run (the model's choice at index m; none if fewer than two). */
typedef struct {
    int n;
    double sz[NSIZES]; /* the largest buffer of one rank, bytes */
    size_t cnt[NSIZES];
    int na[NSIZES], m[NSIZES], algos[NSIZES][NCAND];
    ff_algo model[NSIZES];
} coll_sweep;

static void plan_sweep(ff_group *g, ff_coll coll, const tune_opts *o, coll_sweep *w)
{
    int p = ff_group_size(g), spread = coll != FF_COLL_ALLREDUCE;
    w->n = 0;
    if (spread && p == 2)
        return; /* every all-gather and reduce-scatter of 2 is one exchange */
    for (double s = (double)o->min_bytes; s <= (double)o->max_bytes * 1.0000001 && w->n < NSIZES;
         s *= (double)o->factor) {
        size_t c = (size_t)s / 4 / (spread ? (size_t)p : 1);
        c = c ? c : 1;
        double actual = (double)c * 4 * (spread ? p : 1);
        if ((w->n > 0 && actual <= w->sz[w->n - 1]) || actual > (double)o->max_bytes)
            continue; /* a repeat, or more than the buffers hold (p > size/4) */
        int i = w->n++;
        w->cnt[i] = c, w->sz[i] = actual, w->na[i] = 0, w->m[i] = -1;
        w->model[i] = ff_coll_choose(g, coll, c, FF_WIRE_FP32);
        for (int k = 0; k < NCAND; k++)
            if (ff_coll_allowed(g, coll, cands[k], c)) {
                if (cands[k] == w->model[i])
                    w->m[i] = w->na[i];
                w->algos[i][w->na[i]++] = (int)cands[k];
            }
        if (w->m[i] < 0)
            w->na[i] = 0;
    }
}

static size_t tune_times_len(const tune_opts *o)
{
    return (size_t)3 * NSIZES * NCAND * (size_t)o->repeats;
}

/* --history: the times of earlier jobs, one line each, written below:
 *   {"job":"2x2","nodes":2,"per_node":2,"coll":"allreduce","bytes":16384,
 *    "algo":"ring","us":536.21442,"time":1795000000}
 * job: the nodes x ranks per node of the job that measured it; nodes and
 * per_node: the layout's groups; us: that job's median over its repeats;
 * time: when (seconds since 1970), one job's lines share it and no other
 * job's do (it names the job). Only rank 0 reads and writes it. */
typedef struct {
    int job_nodes, job_k, nodes, per_node;
    ff_coll coll;
    ff_algo algo;
    double bytes, us;
    long long time;
} hist_rec;

typedef struct {
    char *text;    /* the file as read ("" if there was none) */
    hist_rec *rec; /* its n lines */
    int n;
    double *scratch; /* n + 1 values, for a median */
    long long *jt;   /* n + 1 jobs' times, for one decision */
    double *jv;      /* their times of each candidate, (n + 1) x NCAND */
    char *add;       /* this job's lines */
    size_t len, cap;
    int oom;              /* a line could not be added */
    int job_nodes, job_k; /* this job's shape */
    long long now;        /* this job's "time" */
} history;

static char *read_text(const char *path, size_t *len);

/* One line of a history; 0, or -1 if it is not one this command writes. */
static int history_line(const char *line, hist_rec *h)
{
    char coll[32], algo[32];
    int end = -1;
    if (sscanf(line,
               "{\"job\":\"%dx%d\",\"nodes\":%d,\"per_node\":%d,\"coll\":\"%31[a-z_]\","
               "\"bytes\":%lf,\"algo\":\"%31[a-z-]\",\"us\":%lf,\"time\":%lld}%n",
               &h->job_nodes, &h->job_k, &h->nodes, &h->per_node, coll, &h->bytes, algo, &h->us,
               &h->time, &end) != 9 ||
        end < 0)
        return -1;
    for (line += end; *line == ' ' || *line == '\t' || *line == '\r'; line++)
        ;
    int a = ff_algo_parse(algo), c = FF_NCOLL;
    for (int k = 0; k < FF_NCOLL; k++)
        if (!strcmp(coll, ff_coll_name((ff_coll)k)))
            c = k;
    h->coll = (ff_coll)c, h->algo = (ff_algo)a;
    return *line == '\0' && a >= 0 && c < FF_NCOLL && h->job_nodes >= 1 && h->job_k >= 1 &&
                   h->nodes >= 1 && h->per_node >= 1 && h->bytes >= 1 && isfinite(h->bytes) &&
                   h->us > 0 && isfinite(h->us) && h->time >= 0 && h->time < (1LL << 53)
               ? 0
               : -1;
}

/* Reads the history at path (none: empty) into h; 0, or -1 with a message
 * in err. */
static int history_read(const char *path, history *h, char *err, size_t err_len)
{
    size_t len = 0;
    h->text = read_text(path, &len);
    if (!h->text && errno == ENOENT)
        h->text = calloc(1, 1);
    else if (!h->text)
        return snprintf(err, err_len, "cannot read --history %s: %s", path, strerror(errno)), -1;
    if (!h->text)
        return snprintf(err, err_len, "out of memory reading %s", path), -1;
    if (strlen(h->text) != len)
        return snprintf(err, err_len, "--history %s: not a text file (a NUL byte)", path), -1;
    int lines = 0;
    for (const char *c = h->text; *c; c++)
        lines += *c == '\n';
    h->rec = malloc(((size_t)lines + 1) * sizeof *h->rec);
    h->scratch = malloc(((size_t)lines + 2) * sizeof *h->scratch);
    h->jt = malloc(((size_t)lines + 2) * sizeof *h->jt);
    h->jv = malloc(((size_t)lines + 2) * NCAND * sizeof *h->jv);
    if (!h->rec || !h->scratch || !h->jt || !h->jv)
        return snprintf(err, err_len, "out of memory reading %s", path), -1;
    int no = 0;
    for (char *line = h->text; *line;) {
        char *nl = strchr(line, '\n'), keep = 0;
        no++;
        if (nl)
            keep = *nl, *nl = '\0';
        int blank = strspn(line, " \t\r") == strlen(line),
            bad = !blank && history_line(line, &h->rec[h->n]) != 0;
        if (nl)
            *nl = keep;
        if (bad)
            return snprintf(err, err_len,
                            "--history %s, line %d: not a line of `bench tune --history` "
                            "(start a new file, or remove the line)",
                            path, no),
                   -1;
        if (!blank && h->rec[h->n].time >= h->now) /* a later clock: still a new name */
            h->now = h->rec[h->n].time + 1;
        h->n += !blank;
        if (!nl)
            break;
        line = nl + 1;
    }
    return 0;
}

/* Each of t[0..na) over the smallest (1 where that is not positive). */
static void over_fastest(const double *t, int na, double *r)
{
    double lo = t[0];
    for (int k = 1; k < na; k++)
        lo = t[k] < lo ? t[k] : lo;
    for (int k = 0; k < na; k++)
        r[k] = lo > 0 ? t[k] / lo : 1;
}

/* The 90th percentile of v[0..n) by nearest rank (the largest below 10);
 * sorts v. */
static double high_percentile(double *v, int n)
{
    ff_median(v, n); /* sorts */
    return v[(9 * n + 9) / 10 - 1];
}

/* Decides one size of one collective on one layout from this job's times
 * mine[0..na) (s) of the algorithms algos[0..na) and, with a history h,
 * every job of h with the same job shape that timed all of them there:
 * med[k], the median over those jobs of algos[k]'s time, and worst[k], the
 * 90th percentile over them of its time over that job's fastest (each job
 * judged on its own: on the emulated cluster a job's own speed moves all
 * its times, by up to 2-3x at a few KiB, docs/coll-bench.md). Returns the
 * number of jobs. */
static int decide(history *h, int nodes, int per_node, ff_coll coll, double bytes, const int *algos,
                  int na, const double *mine, double *med, double *worst)
{
    if (!h) {
        over_fastest(mine, na, worst);
        memcpy(med, mine, (size_t)na * sizeof *med);
        return 1;
    }
    int nj = 0;
    for (int i = 0; i < h->n; i++) {
        const hist_rec *q = &h->rec[i];
        if (q->job_nodes != h->job_nodes || q->job_k != h->job_k || q->nodes != nodes ||
            q->per_node != per_node || q->coll != coll || q->bytes != bytes)
            continue;
        int k = 0, j = nj - 1;
        while (k < na && algos[k] != (int)q->algo)
            k++;
        if (k == na)
            continue;
        while (j >= 0 && h->jt[j] != q->time) /* a job's lines are together: found at once */
            j--;
        if (j < 0 || h->jv[(size_t)j * NCAND + k] > 0) { /* a new time, or two jobs had one */
            j = nj++;
            h->jt[j] = q->time;
            for (int l = 0; l < na; l++)
                h->jv[(size_t)j * NCAND + l] = -1;
        }
        h->jv[(size_t)j * NCAND + k] = q->us * 1e-6;
    }
    int full = 0; /* the jobs that timed every algorithm, then this one */
    for (int j = 0; j < nj; j++) {
        double *t = &h->jv[(size_t)j * NCAND];
        int all = 1;
        for (int k = 0; k < na; k++)
            all &= t[k] > 0;
        if (all)
            memmove(&h->jv[(size_t)full++ * NCAND], t, (size_t)na * sizeof *t);
    }
    memcpy(&h->jv[(size_t)full++ * NCAND], mine, (size_t)na * sizeof *mine);
    for (int k = 0; k < na; k++) {
        for (int j = 0; j < full; j++)
            h->scratch[j] = h->jv[(size_t)j * NCAND + k];
        med[k] = ff_median(h->scratch, full);
    }
    for (int j = 0; j < full; j++)
        over_fastest(&h->jv[(size_t)j * NCAND], na, &h->jv[(size_t)j * NCAND]);
    for (int k = 0; k < na; k++) {
        for (int j = 0; j < full; j++)
            h->scratch[j] = h->jv[(size_t)j * NCAND + k];
        worst[k] = high_percentile(h->scratch, full);
    }
    return full;
}

/* Adds this job's time to the lines to append (sets oom if it cannot). */
static void history_add(history *h, int nodes, int per_node, ff_coll coll, double bytes,
                        ff_algo algo, double s)
{
    char line[512];
    int n = snprintf(line, sizeof line,
                     "{\"job\":\"%dx%d\",\"nodes\":%d,\"per_node\":%d,\"coll\":\"%s\","
                     "\"bytes\":%.0f,\"algo\":\"%s\",\"us\":%.9g,\"time\":%lld}\n",
                     h->job_nodes, h->job_k, nodes, per_node, ff_coll_name(coll), bytes,
                     ff_algo_name(algo), s * 1e6, h->now);
    if (n < 0 || (size_t)n >= sizeof line) {
        h->oom = 1;
        return;
    }
    if (h->cap - h->len <= (size_t)n) {
        size_t cap = 2 * h->cap + sizeof line;
        char *more = realloc(h->add, cap);
        if (!more) {
            h->oom = 1;
            return;
        }
        h->add = more, h->cap = cap;
    }
    memcpy(h->add + h->len, line, (size_t)n + 1);
    h->len += (size_t)n;
}

/* The file's lines and this job's, written atomically; 0, or -1 (errno). */
static int history_write(const char *path, const history *h)
{
    size_t n = strlen(h->text);
    char *all = h->oom ? NULL : malloc(n + h->len + 2);
    if (!all)
        return errno = ENOMEM, -1;
    memcpy(all, h->text, n);
    if (n && h->text[n - 1] != '\n')
        all[n++] = '\n';
    memcpy(all + n, h->add ? h->add : "", h->len);
    all[n + h->len] = '\0';
    int rc = ff_write_file_atomic(path, all, strlen(all));
    free(all);
    return rc;
}

static void history_free(history *h)
{
    free(h->text), free(h->rec), free(h->scratch), free(h->jt), free(h->jv), free(h->add);
}

/* Sweeps one layout: every collective and size on the group g of this rank
 * (all ranks of `sync` are in some group of the same layout), the whole
 * sweep --repeats times (the repeat the outer loop, so that a slow spell
 * of the machine hits one repeat of many sizes rather than every repeat of
 * one), and decides on the median over the repeats (with a history h,
 * over that and the history's jobs). Appends to picks (rank 0's view,
 * which is what is written). w: 3 sweeps, t: the times, tune_times_len(o)
 * doubles. */
static void tune_layout(ff_ctx *ctx, ff_group *g, MPI_Comm sync, const char *what,
                        const tune_opts *o, float *send, float *recv, coll_sweep *w, double *t,
                        history *h, pick *picks, int *np, int *dropped)
{
    int p = ff_group_size(g), r = ff_group_rank(g), nodes, per_node, R = (int)o->repeats;
    ff_group_topology(g, &nodes, &per_node);
#define T(ci, i, k, rep) t[(((size_t)(ci)*NSIZES + (size_t)(i)) * NCAND + (size_t)(k)) * R + (rep)]
    for (int ci = 0; ci < 3; ci++)
        plan_sweep(g, colls[ci], o, &w[ci]);
    for (int rep = 0; rep < R; rep++)
        for (int ci = 0; ci < 3; ci++)
            for (int i = 0; i < w[ci].n; i++) {
                if (w[ci].na[i] < 2)
                    continue;
                size_t c = w[ci].cnt[i];
                size_t ns = colls[ci] == FF_COLL_REDUCE_SCATTER ? c * (size_t)p : c;
                for (size_t e = 0; e < ns; e++)
                    send[e] = bench_value(r, e);
                double med[NCAND];
                bench_time_algos(ctx, g, sync, colls[ci], w[ci].algos[i], w[ci].na[i], FF_WIRE_FP32,
                                 send, recv, c, 1, (int)o->iters, med);
                for (int k = 0; k < w[ci].na[i]; k++)
                    T(ci, i, k, rep) = med[k];
            }
    cli_print("\n# %s: %d ranks, %d node(s) x %d; median of %d repeat(s)\n"
              "#%-14s %12s %-10s %-10s %10s %10s %7s %4s %s\n",
              what, p, nodes, per_node, R, "collective", "size(B)", "model", "fastest", "model(us)",
              "fastest(us)", "ratio", "jobs", "times of all (us)");
    for (int ci = 0; ci < 3; ci++) {
        const coll_sweep *s = &w[ci];
        ff_coll coll = colls[ci];
        for (int i = 0; i < s->n; i++) {
            int na = s->na[i], m = s->m[i];
            if (na < 2)
                continue;
            double mine[NCAND], med[NCAND], worst[NCAND];
            for (int k = 0; k < na; k++) {
                mine[k] = ff_median(&T(ci, i, k, 0), R);
                if (h)
                    history_add(h, nodes, per_node, coll, s->sz[i], (ff_algo)s->algos[i][k],
                                mine[k]);
            }
            int jobs =
                decide(h, nodes, per_node, coll, s->sz[i], s->algos[i], na, mine, med, worst);
            int best = 0; /* the smallest worst case; of equals, the fastest */
            for (int k = 1; k < na; k++)
                if (worst[k] < worst[best] || (worst[k] == worst[best] && med[k] < med[best]))
                    best = k;
            char all[200] = "";
            size_t len = 0;
            for (int k = 0; k < na && len < sizeof all; k++)
                len += (size_t)snprintf(all + len, sizeof all - len, " %s %.1f",
                                        ff_algo_name((ff_algo)s->algos[i][k]), med[k] * 1e6);
            ff_algo fastest = (ff_algo)s->algos[i][best];
            double ratio = worst[m];
            int want = ratio > 1 + o->margin && !twins(fastest, s->model[i], p, nodes);
            cli_print(" %-14s %12.0f %-10s %-10s %10.1f %10.1f %7.2f %4d%s%s\n", ff_coll_name(coll),
                      s->sz[i], ff_algo_name(s->model[i]), ff_algo_name(fastest), med[m] * 1e6,
                      med[best] * 1e6, ratio, jobs, all, want ? "  -> pick" : "");
            if (!want)
                continue;
            /* up to the geometric midpoints, no further than was measured */
            double lo = i == 0 ? s->sz[i] - 1 : sqrt(s->sz[i - 1] * s->sz[i]);
            double hi = i == s->n - 1 ? s->sz[i] : sqrt(s->sz[i] * s->sz[i + 1]);
            pick *last = *np > 0 ? &picks[*np - 1] : NULL;
            if (last && last->rule.coll == coll && last->rule.nodes == nodes &&
                last->rule.per_node == per_node && last->rule.algo == fastest &&
                last->rule.max_B == lo) {
                last->rule.max_B = hi, last->sizes++;
                continue;
            }
            if (*np == FF_COLL_MAX_PICKS) {
                (*dropped)++;
                continue;
            }
            picks[(*np)++] = (pick){{coll, nodes, per_node, lo, hi, fastest}, (int)s->model[i], 1};
        }
    }
#undef T
}

/* The whole file (the --history), NUL-terminated, its length in *len (if
 * len); NULL with errno on failure (EFBIG beyond 16 MiB). */
static char *read_text(const char *path, size_t *len)
{
    FILE *f = ff_fopen_regular(path);
    if (!f)
        return NULL;
    size_t cap = 1 << 16, n = 0;
    char *text = malloc(cap + 1);
    while (text) {
        n += fread(text + n, 1, cap - n, f);
        if (n < cap)
            break;
        char *more = cap < (1u << 24) ? realloc(text, 2 * cap + 1) : NULL;
        if (!more) {
            free(text);
            text = NULL;
            errno = cap < (1u << 24) ? ENOMEM : EFBIG;
            break;
        }
        text = more, cap *= 2;
    }
    int bad = ferror(f);
    fclose(f);
    if (bad && text) {
        free(text);
        errno = EIO;
        return NULL;
    }
    if (text)
        text[n] = '\0';
    if (text && len)
        *len = n;
    return text;
}

int cmd_bench_tune(int argc, char **argv)
{
    tune_opts o;
    int prc = parse_tune_opts(argc, argv, &o);
    if (prc != CLI_OK)
        return prc < 0 ? CLI_OK : prc;
    const char *forced = getenv("FF_ALGO");
    if (!o.rewrite && forced && *forced && strcmp(forced, "auto") != 0) {
        cli_error("bench tune: FF_ALGO=%s forces the algorithm; unset it to tune AUTO", forced);
        return CLI_FAIL;
    }
    /* the profile, read on every rank (plan/profile.h): the model to tune,
     * whose picks start empty; rank 0 writes it back with the new picks */
    ff_profile_doc doc;
    ff_coll_model model;
    ff_coll_model_default(&model);
    char err[512];
    int rc = ff_profile_doc_load(o.profile, FF_PROFILE_FOR_COLL, &doc, err, sizeof err);
    if (rc == FF_OK)
        rc = ff_profile_doc_coll_model(&doc, &model, err, sizeof err);
    int worst = rc != FF_OK;
    MPI_Allreduce(MPI_IN_PLACE, &worst, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    if (worst) {
        if (rc != FF_OK)
            cli_error("%s", err);
        else
            cli_error("--profile %s: not readable on every rank", o.profile);
        ff_profile_doc_free(&doc);
        return CLI_FAIL;
    }
    if (o.rewrite) { /* no measurement: the profile as read, in the writer's form */
        int code = CLI_OK;
        if (cli_world_rank() == 0 && ff_profile_doc_save(o.out, &doc, err, sizeof err) != FF_OK) {
            cli_error("%s", err);
            code = CLI_FAIL;
        }
        if (code == CLI_OK)
            cli_print("profile with %d pick(s) written to %s\n", doc.n_picks, o.out);
        MPI_Bcast(&code, 1, MPI_INT, 0, MPI_COMM_WORLD);
        ff_profile_doc_free(&doc);
        return code;
    }
    model.n_picks = 0;

    ff_ctx *ctx;
    ff_ctx_options co;
    ff_ctx_options_default(&co);
    co.progress = FF_PROGRESS_WAIT;
    int ctx_ok = ff_ctx_create(&ctx, MPI_COMM_WORLD, &co) == FF_OK;
    if (ctx_ok) { /* FF_STRICT_VOLUME as the context read it: AUTO's candidates at run time */
        ff_coll_model env;
        ff_ctx_coll_model(ctx, &env);
        model.strict_volume = env.strict_volume;
    }
    if (!ctx_ok || ff_ctx_set_coll_model(ctx, &model) != FF_OK) {
        cli_error("%s", ff_ctx_error(ctx));
        ff_ctx_destroy(ctx);
        ff_profile_doc_free(&doc);
        return CLI_FAIL;
    }
    MPI_Comm world = ff_ctx_comm(ctx);
    int size = ff_ctx_size(ctx), me = ff_ctx_rank(ctx), N = ff_ctx_nodes(ctx);
    /* the history: rank 0 reads, decides and writes it */
    history hist = {0};
    hist.now = (long long)time(NULL);
    int refuse = me == 0 && o.history && history_read(o.history, &hist, err, sizeof err) != 0;
    /* both files writable, or nothing is measured */
    const char *unwritable = NULL;
    if (me == 0 && !refuse) {
        if (ff_file_writable(o.out) != 0)
            unwritable = o.out;
        else if (o.history && ff_file_writable(o.history) != 0)
            unwritable = o.history;
    }
    if (unwritable) {
        snprintf(err, sizeof err, "cannot write %s: %s", unwritable, strerror(errno));
        refuse = 1;
    }
    MPI_Bcast(&refuse, 1, MPI_INT, 0, world);
    if (refuse) {
        cli_error("%s", err);
        history_free(&hist);
        ff_ctx_destroy(ctx);
        ff_profile_doc_free(&doc);
        return CLI_FAIL;
    }
    history *hp = me == 0 && o.history ? &hist : NULL;
    int my_node = ff_ctx_node_of(ctx, me), local = 0;
    for (int q = 0; q < me; q++)
        local += ff_ctx_node_of(ctx, q) == my_node;
    size_t elems = o.max_bytes / 4 + 64;
    float *send = malloc(elems * sizeof(float)), *recv = malloc(elems * sizeof(float));
    pick *picks = malloc(FF_COLL_MAX_PICKS * sizeof *picks);
    coll_sweep *sweeps = malloc(3 * sizeof *sweeps);
    double *times = malloc(tune_times_len(&o) * sizeof *times);
    int ok = send && recv && picks && sweeps && times, all_ok;
    MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_MIN, world);
    if (!all_ok) {
        cli_error("out of memory for buffers of %zu bytes", 2 * elems * sizeof(float));
        free(send), free(recv), free(picks), free(sweeps), free(times);
        ff_ctx_destroy(ctx);
        ff_profile_doc_free(&doc);
        return CLI_FAIL;
    }
    MPI_Comm node_comm;
    MPI_Comm_split(world, my_node, me, &node_comm);
    cli_print("# fourfold bench tune: %d ranks, %d node(s)%s; model from %s; %ld iterations "
              "after 1 warm-up, median of the slowest rank, median over %ld repeat(s) of the "
              "sweep; a pick where the model's choice is more than %.0f%% slower\n",
              size, N, getenv("FF_RANKS_PER_NODE") ? " (FF_RANKS_PER_NODE)" : "", o.profile,
              o.iters, o.repeats, 100 * o.margin);

    /* the layouts: all ranks; one node's (every node at once); one rank
     * per node (each local index at once) */
    int np = 0, dropped = 0, failed = 0, nodes_all = 1, k_all = 0;
    for (int set = 0; set < 3; set++) {
        int color = set == 0 ? 0 : set == 1 ? my_node : local;
        MPI_Comm sync = set == 1 ? node_comm : world;
        MPI_Comm comm;
        MPI_Comm_split(world, color, me, &comm);
        ff_group *g = NULL;
        static const char *const names[3] = {"all ranks", "one node's ranks, every node at once",
                                             "one rank per node, every local index at once"};
        /* agreed over all ranks: the groups of a set fail or not together
         * only within themselves */
        int made = ff_group_create(ctx, comm, names[set], &g) == FF_OK, all_made;
        MPI_Comm_free(&comm);
        MPI_Allreduce(&made, &all_made, 1, MPI_INT, MPI_MIN, world);
        if (!all_made) {
            if (me == 0)
                cli_error("%s",
                          made ? "could not make the groups of another node" : ff_ctx_error(ctx));
            ff_group_destroy(g);
            failed = 1;
            break;
        }
        int nodes, per_node, uniform;
        ff_group_topology(g, &nodes, &per_node);
        if (set == 0)
            nodes_all = hist.job_nodes = nodes, k_all = hist.job_k = per_node;
        /* every group of the set must be laid out alike */
        int lay[2] = {per_node, -per_node}, agree[2];
        MPI_Allreduce(lay, agree, 2, MPI_INT, MPI_MAX, sync);
        uniform = per_node > 0 && agree[0] == -agree[1];
        int skip = ff_group_size(g) < 2 || (set > 0 && (nodes_all < 2 || k_all < 2));
        if (!skip && !uniform)
            cli_print("\n# %s: nodes of different sizes, left to the model\n", names[set]);
        else if (!skip)
            tune_layout(ctx, g, sync, names[set], &o, send, recv, sweeps, times, hp, picks, &np,
                        &dropped);
        ff_group_destroy(g);
    }
    MPI_Comm_free(&node_comm);
    free(send), free(recv), free(sweeps), free(times);

    int code = failed ? CLI_FAIL : CLI_OK;
    if (code == CLI_OK && me == 0) {
        if (dropped)
            fprintf(stderr, "fourfold: warning: more than %d picks; %d left to the model\n",
                    FF_COLL_MAX_PICKS, dropped);
        /* the profile as read, its picks replaced by these */
        (void)ff_profile_doc_set_picks(&doc, picks, np); /* np <= FF_COLL_MAX_PICKS */
        if (ff_profile_doc_save(o.out, &doc, err, sizeof err) != FF_OK) {
            cli_error("%s", err);
            code = CLI_FAIL;
        } else {
            printf("\n%d measured pick(s) written to %s\n", np, o.out);
            fflush(stdout);
            /* after the profile: a failed profile leaves the history as it
             * was, so that a second try does not count this job twice */
            if (hp && history_write(o.history, hp) != 0) {
                cli_error("cannot write --history %s: %s (the profile was written)", o.history,
                          hp->oom ? "out of memory" : strerror(errno));
                code = CLI_FAIL;
            }
        }
    }
    MPI_Bcast(&code, 1, MPI_INT, 0, world);
    history_free(&hist);
    free(picks);
    ff_ctx_destroy(ctx);
    ff_profile_doc_free(&doc);
    return code;
}
