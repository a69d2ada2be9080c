/* One GPT-2 training step (forward, backward, clipping, AdamW) on a grid:
 * the median of --reps steps after --warmup, tokens/s, and model FLOP/s as a
 * fraction of the sgemm rate measured in the same run (every rank at once,
 * with the same BLAS threads).
 *
 * Model FLOPs per step = (6 N + 12 L C T) * B * T, N = parameters without
 * positions (ff_gpt_flops_per_token).
 *
 *   mpirun -np R ff_bench_gpt --grid 1x1x1x1 --L 12 --C 768 --NH 12 --V 50257
 *          --maxT 1024 --B 4 --T 64 [--threads 1] [--reps 5] [--warmup 2]
 *          [--checkpoint] [--label TEXT] [--decompose K] [--plan FILE] [--gemm-report]
 *          [--panel ROWS] [--progress poll|thread] [--micro M]
 *          [--cmm 0|1] [--oag 0|1] [--rs-cmm 0|1] [--ors 0|1]
 *          [--stages P --schedule message|1f1b --limit K --slow-stage S --slow-ms T
 *          --pass-ms E --slow-jitter 0|1]
 *          [--experts E --expert-every K --top-k 1|2 --capacity F --ep Ge --dtd 0|1
 *          --cac 0|1] [--precision fp32|bf16-mixed] [--bf16-products auto|emulated|onednn]
 *          [--sparsity P [--samo]] [--rss] [--zero 0|1|2]
 * (--decompose: every linear layer's all-reduced products in K chunks;
 * --cmm, --rs-cmm: the collective matmuls of the weight gathers and of the
 * weight gradients' reduce-scatters (docs/linear.md); --oag, --ors: those
 * overlaps (default 1);
 * --plan: a per-layer plan file; --gemm-report: rank 0's GEMM tuner's
 * choices and timings at the end (ff_gemm_report); --panel: GEMM panel height, 0 = by shape;
 * --micro: micro-batches of B sequences per step (default 1); --stages:
 * pipeline stages, the grid being one stage's (docs/pipeline.md), with
 * their schedule, limit, a straggler (stage S sleeps T ms after each pass)
 * and E ms of sleep after every stage's every pass: compute emulated by
 * sleeping, for more stages than cores; --slow-jitter 1: the straggler's
 * delay uniform in [0, 2T] per pass; --experts: a mixture of experts
 * (docs/moe.md), every K-th block (default 2), top-k (default 1), capacity
 * factor F (default 1.25, or a percentage given as an integer: --capacity
 * 125), expert parallelism Ge, DTD (default 1) and CAC (with --checkpoint).)
 * Prints a line per step, a summary and one JSON line; with stages the JSON
 * has each stage's mean time per step in its forward and backward passes
 * (ff_gpt_pipeline_times: 1 - busy / step is the stage's bubble), and for
 * a mixture of experts the ms per step rank 0 waited in the expert group's
 * all-to-alls and in the X group's all-gathers (DTD's).
 *
 * --sparsity P: the initialised model pruned by magnitude (global, the
 * blocks' matrices: ff_prune) and trained masked, with --samo with SAMO
 * (docs/samo.md). --rss: rank 0's resident set (VmRSS, and the peak VmHWM
 * of /proc/self/status, reset through /proc/self/clear_refs before each
 * phase) at the start, around each step's forward and backward and around
 * its optimizer step (gradient norm, clipping, AdamW, the bf16 copy: what
 * the dissertation's §7.2 tiles), against ff_gpt_memory_total (docs/design.md
 * §13, "The optimizer step's memory"; the layers' pool and the GEMMs'
 * scratch as allocated after the steps). --zero: ZeRO over D (docs/design.md
 * "ZeRO over D"). */
#include "fourfold/gpt.h"

#include <cblas.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "device.h" /* ff_fbuf_live_bytes: what the library's allocator has live */
#include "fourfold/fourfold.h"

typedef struct {
    const char *grid, *label, *plan, *progress, *schedule;
    ff_precision precision;
    ff_bf16_products bf16_products;
    int L, C, NH, V, maxT, B, T, threads, reps, warmup, checkpoint, decompose, panel, cmm, oag;
    int rs_cmm, ors;
    int gemm_report;
    int micro, stages, limit, slow_stage, slow_ms, pass_ms, jitter;
    int experts, expert_every, top_k, capacity_pct, ep, dtd, cac;
    double sparsity;
    int samo, rss, zero;
} options;

/* The groups a step communicates on, k < N_GROUPS: the grid's, then a
 * mixture of experts' expert group and its replicas; NULL where none. */
enum { N_GROUPS = FF_NGROUPS + 2 };
static ff_group *step_group(const ff_grid *grid, const ff_gpt *g, int k)
{
    if (k < FF_NGROUPS)
        return ff_grid_group(grid, (ff_group_kind)k);
    return ff_gpt_expert_group(g, 0) ? ff_gpt_expert_group(g, k > FF_NGROUPS) : NULL;
}

/* /proc/self/status's `key` (VmRSS, VmHWM) in MiB; -1 where unreadable. */
static double status_mib(const char *key)
{
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    double kb = -1;
    const size_t n = strlen(key);
    while (f && fgets(line, sizeof line, f))
        if (!strncmp(line, key, n) && line[n] == ':')
            kb = atof(line + n + 1);
    if (f)
        fclose(f);
    return kb < 0 ? -1 : kb / 1024.0;
}

/* The peak VmHWM set back to the resident set now (Linux's clear_refs 5). */
static void reset_peak(void)
{
    FILE *f = fopen("/proc/self/clear_refs", "w");
    if (f) {
        fputs("5", f);
        fclose(f);
    }
}

static void die(int rank, const char *msg)
{
    if (rank == 0)
        fprintf(stderr, "ff_bench_gpt: %s\n", msg);
    MPI_Abort(MPI_COMM_WORLD, 2);
}

/* sgemm rate of a square product of side n, every rank at once: the median
 * of 5 after one warm-up. */
static double sgemm_rate(int n)
{
    size_t e = (size_t)n * n;
    float *a = ff_floats_alloc(e), *b = ff_floats_alloc(e), *c = ff_floats_alloc(e);
    for (size_t i = 0; i < e; i++)
        a[i] = (float)(i % 7) * 0.1f, b[i] = (float)(i % 5) * 0.1f;
    double t[5];
    for (int r = 0; r < 6; r++) {
        MPI_Barrier(MPI_COMM_WORLD);
        double t0 = MPI_Wtime();
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, a, n, b, n, 0.0f, c,
                    n);
        if (r > 0)
            t[r - 1] = MPI_Wtime() - t0;
    }
    ff_floats_free(a), ff_floats_free(b), ff_floats_free(c);
    return 2.0 * n * (double)n * n / ff_median(t, 5);
}

static int parse(int argc, char **argv, options *o)
{
    *o = (options){.grid = "1x1x1x1",
                   .label = "",
                   .L = 12,
                   .C = 768,
                   .NH = 12,
                   .V = 50257,
                   .maxT = 1024,
                   .B = 4,
                   .T = 64,
                   .threads = 1,
                   .reps = 5,
                   .warmup = 2,
                   .schedule = "message",
                   .micro = 1,
                   .stages = 1,
                   .slow_stage = -1,
                   .oag = 1,
                   .ors = 1,
                   .expert_every = 2,
                   .top_k = 1,
                   .capacity_pct = 125,
                   .ep = 1,
                   .dtd = 1};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        struct {
            const char *name;
            int *dst;
        } ints[] = {{"--L", &o->L},
                    {"--C", &o->C},
                    {"--NH", &o->NH},
                    {"--V", &o->V},
                    {"--maxT", &o->maxT},
                    {"--B", &o->B},
                    {"--T", &o->T},
                    {"--threads", &o->threads},
                    {"--reps", &o->reps},
                    {"--warmup", &o->warmup},
                    {"--decompose", &o->decompose},
                    {"--cmm", &o->cmm},
                    {"--oag", &o->oag},
                    {"--rs-cmm", &o->rs_cmm},
                    {"--ors", &o->ors},
                    {"--panel", &o->panel},
                    {"--micro", &o->micro},
                    {"--stages", &o->stages},
                    {"--limit", &o->limit},
                    {"--slow-stage", &o->slow_stage},
                    {"--slow-ms", &o->slow_ms},
                    {"--pass-ms", &o->pass_ms},
                    {"--slow-jitter", &o->jitter},
                    {"--experts", &o->experts},
                    {"--expert-every", &o->expert_every},
                    {"--top-k", &o->top_k},
                    {"--capacity", &o->capacity_pct},
                    {"--ep", &o->ep},
                    {"--dtd", &o->dtd},
                    {"--cac", &o->cac}};
        int done = 0;
        for (size_t k = 0; k < sizeof ints / sizeof *ints && !done; k++)
            if (strcmp(a, ints[k].name) == 0 && v) {
                *ints[k].dst = atoi(v);
                i++;
                done = 1;
            }
        if (done)
            continue;
        if (strcmp(a, "--grid") == 0 && v)
            o->grid = argv[++i];
        else if (strcmp(a, "--label") == 0 && v)
            o->label = argv[++i];
        else if (strcmp(a, "--plan") == 0 && v)
            o->plan = argv[++i];
        else if (strcmp(a, "--schedule") == 0 && v && (!strcmp(v, "message") || !strcmp(v, "1f1b")))
            o->schedule = argv[++i];
        else if (strcmp(a, "--progress") == 0 && v && (!strcmp(v, "poll") || !strcmp(v, "thread")))
            o->progress = argv[++i];
        else if (strcmp(a, "--precision") == 0 && v) {
            if (ff_precision_parse(argv[++i], &o->precision))
                return -2;
        } else if (strcmp(a, "--bf16-products") == 0 && v) {
            if (ff_bf16_products_parse(argv[++i], &o->bf16_products))
                return -3;
        } else if (strcmp(a, "--sparsity") == 0 && v) {
            o->sparsity = atof(argv[++i]);
        } else if (strcmp(a, "--samo") == 0) {
            o->samo = 1;
        } else if (strcmp(a, "--rss") == 0) {
            o->rss = 1;
        } else if (strcmp(a, "--zero") == 0 && v) {
            o->zero = atoi(argv[++i]);
        } else if (strcmp(a, "--checkpoint") == 0)
            o->checkpoint = 1;
        else if (strcmp(a, "--gemm-report") == 0)
            o->gemm_report = 1;
        else
            return -1;
    }
    return o->reps > 0 && o->reps <= 100 && o->micro > 0 && o->stages > 0 ? 0 : -1;
}

int main(int argc, char **argv)
{
    int provided, rank, size;
    int thread = 0; /* a progress thread needs MPI_THREAD_MULTIPLE, asked before parsing */
    for (int i = 1; i + 1 < argc; i++)
        thread |= !strcmp(argv[i], "--progress") && !strcmp(argv[i + 1], "thread");
    MPI_Init_thread(&argc, &argv, thread ? MPI_THREAD_MULTIPLE : MPI_THREAD_FUNNELED, &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    options o;
    int bad = parse(argc, argv, &o);
    if (bad == -2)
        die(rank, "--precision: expected " FF_PRECISION_CHOICES);
    if (bad == -3)
        die(rank, "--bf16-products: expected " FF_BF16_PRODUCTS_CHOICES);
    if (bad)
        die(rank, "bad arguments (see the header of bench/gpt.c)");
    ff_ctx *ctx;
    ff_grid *grid;
    ff_dims shape;
    char err[256];
    ff_ctx_options co;
    ff_ctx_options_default(&co);
    co.threads = o.threads; /* the BLAS's and the element-wise work's */
    if (thread)
        co.progress = FF_PROGRESS_THREAD;
    if (ff_ctx_create(&ctx, MPI_COMM_WORLD, &co) != FF_OK)
        die(rank, "context");
    if (ff_grid_parse_staged(o.grid, size, o.stages, size, &shape, err, sizeof err))
        die(rank, err);
    if (ff_grid_create_staged(ctx, shape, o.stages, &grid) != FF_OK)
        die(rank, ff_ctx_error(ctx));
    ff_gpt_config cfg = {.L = o.L, .C = o.C, .NH = o.NH, .V = o.V, .Vp = 0, .maxT = o.maxT};
    ff_gpt_config_moe(&cfg, o.experts);
    cfg.expert_every = o.expert_every;
    cfg.top_k = o.top_k;
    cfg.capacity_factor = (float)o.capacity_pct / 100.0f;
    ff_gpt_opts opts;
    ff_gpt_opts_default(&opts);
    opts.expert_parallel = o.ep;
    opts.dtd = o.dtd;
    opts.cac = o.cac;
    opts.checkpoint = o.checkpoint;
    opts.precision = o.precision;
    opts.bf16_products = o.bf16_products;
    opts.zero = o.zero;
    opts.linear.decompose = o.decompose;
    opts.linear.cmm = o.cmm;
    opts.linear.oag = o.oag;
    opts.linear.rs_cmm = o.rs_cmm;
    opts.linear.ors = o.ors;
    opts.pipe.schedule = !strcmp(o.schedule, "1f1b") ? FF_PIPE_1F1B : FF_PIPE_MESSAGE;
    opts.pipe.limit = o.limit;
    opts.pipe.slow_stage = o.slow_stage;
    opts.pipe.slow_s = o.slow_ms * 1e-3;
    opts.pipe.pass_s = o.pass_ms * 1e-3;
    opts.pipe.slow_jitter = o.jitter;
    ff_layer_plan plan = {0};
    if (o.plan && ff_layer_plan_read(o.plan, &plan, err, sizeof err) != FF_OK)
        die(rank, err);
    opts.plan = o.plan ? &plan : NULL;
    const double rss_start = status_mib("VmRSS");
    ff_gpt *g;
    if (ff_gpt_create(grid, &cfg, &opts, o.B, o.T, &g) != FF_OK || ff_gpt_init(g, 1))
        die(rank, ff_ctx_error(ctx));
    if (o.sparsity > 0) { /* pruned on rank 0, the mask scattered */
        const size_t n = ff_gpt_canonical_size(g);
        float *canon = rank == 0 ? malloc(n * sizeof *canon) : NULL;
        unsigned char *keep = rank == 0 ? malloc(n) : NULL;
        if (rank == 0 && (!canon || !keep))
            die(rank, "out of memory for the pruning");
        if (keep)
            memset(keep, 1, n);
        ff_prune_opts po;
        ff_prune_opts_default(&po);
        po.sparsity = o.sparsity;
        if (ff_gpt_gather(g, FF_GPT_PARAMS, canon, 0) != FF_OK)
            die(rank, ff_ctx_error(ctx));
        if (rank == 0 && ff_prune(g, canon, &po, keep, NULL, NULL, err, sizeof err) != FF_OK)
            die(rank, err);
        free(canon);
        if (ff_gpt_set_mask(g, keep, 0) != FF_OK || (o.samo && ff_gpt_samo(g) != FF_OK))
            die(rank, ff_ctx_error(ctx));
        free(keep);
    }
    ff_layer_plan_free(&plan);
    if (o.panel > 0)
        ff_gemm_set_panel_rows(ff_linear_seq_gemm(ff_gpt_linear_seq(g)), o.panel);
    int first, count;
    ff_gpt_local_sequences(g, &first, &count);
    size_t n_tok = (size_t)count * o.T * o.micro;
    int32_t *tok = malloc(n_tok * sizeof *tok), *tgt = malloc(n_tok * sizeof *tgt);
    for (size_t i = 0; i < n_tok; i++) {
        tok[i] = (int32_t)((i * 2654435761u + (size_t)first * 97) % (size_t)o.V);
        tgt[i] = (int32_t)((i * 40503u + 7 + (size_t)first) % (size_t)o.V);
    }
    ff_adamw h;
    ff_adamw_default(&h);
    h.steps = o.warmup + o.reps;

    double t[100], busy = 0; /* seconds in the stage's passes over the measured steps */
    /* --rss, rank 0's MiB over the measured steps: the largest resident set
     * before a step, the largest peak in its forward and backward, before
     * its optimizer step, in it and after it; the optimizer step's ms */
    double rss[5] = {0, 0, 0, 0, 0}, opt_ms[100];
    ff_gpt_step_info info = {0};
    ff_group *ep = ff_gpt_expert_group(g, 0), *gx = ff_grid_group(grid, FF_GROUP_X);
    double a2a_wait = 0, ag_wait = 0; /* rank 0's, over the measured steps */
    for (int s = 0; s < o.warmup + o.reps; s++) {
        if (s == o.warmup)
            for (int k = 0; k < N_GROUPS; k++)
                if (step_group(grid, g, k))
                    ff_group_counters_reset(step_group(grid, g, k));
        MPI_Barrier(MPI_COMM_WORLD);
        ff_pipe_times p0, p1;
        ff_gpt_pipeline_times(g, &p0);
        double t0 = MPI_Wtime();
        if (!o.rss) {
            if (ff_gpt_step(g, tok, tgt, o.micro, &h, s, &info) != FF_OK)
                die(rank, ff_ctx_error(ctx));
        } else { /* ff_gpt_step's phases, the resident set around each */
            double r[5], ta;
            reset_peak();
            r[0] = status_mib("VmRSS");
            if (ff_gpt_grads(g, tok, tgt, o.micro, &info.loss) != FF_OK ||
                ff_gpt_grad_norm(g, &info.grad_norm) != FF_OK)
                die(rank, ff_ctx_error(ctx));
            r[1] = status_mib("VmHWM");
            reset_peak();
            r[2] = status_mib("VmRSS");
            ta = MPI_Wtime();
            const float coef = h.clip / (info.grad_norm + 1e-6f);
            if (ff_gpt_adamw_update(g, &h, s, h.clip > 0 && coef < 1.0f ? coef : 1.0f) != FF_OK)
                die(rank, ff_ctx_error(ctx));
            opt_ms[s < o.warmup ? 0 : s - o.warmup] = (MPI_Wtime() - ta) * 1e3;
            r[3] = status_mib("VmHWM");
            r[4] = status_mib("VmRSS");
            for (int k = 0; s >= o.warmup && k < 5; k++)
                rss[k] = r[k] > rss[k] ? r[k] : rss[k];
            if (rank == 0)
                printf("  rss MiB: before %.1f, forward and backward peak %.1f, before the "
                       "optimizer %.1f, its peak %.1f, after %.1f; optimizer %.1f ms\n",
                       r[0], r[1], r[2], r[3], r[4], (MPI_Wtime() - ta) * 1e3);
        }
        double dt = MPI_Wtime() - t0;
        ff_gpt_pipeline_times(g, &p1);
        if (s >= o.warmup)
            busy += p1.busy_s - p0.busy_s;
        MPI_Allreduce(MPI_IN_PLACE, &dt, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
        if (s >= o.warmup)
            t[s - o.warmup] = dt;
        if (rank == 0)
            printf("step %d: %.1f ms, loss %.4f%s\n", s, dt * 1e3, info.loss,
                   s < o.warmup ? " (warm-up)" : "");
    }
    if (ep)
        a2a_wait = ff_group_counters(ep, FF_COLL_ALLTOALL).wait_s / o.reps * 1e3;
    ag_wait = ff_group_counters(gx, FF_COLL_ALLGATHER).wait_s / o.reps * 1e3;
    /* the bytes this rank sent per measured step, on every group; the most any rank sent */
    double sent = 0, sent_max;
    for (int k = 0; k < N_GROUPS; k++)
        for (int c = 0; step_group(grid, g, k) && c <= FF_COLL_P2P; c++)
            sent += (double)ff_group_counters(step_group(grid, g, k), (ff_coll)c).bytes_sent;
    sent /= o.reps;
    MPI_Allreduce(&sent, &sent_max, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    double runs[100];
    memcpy(runs, t, sizeof(double) * (size_t)o.reps);
    double step_s = ff_median(t, o.reps);
    double rate = sgemm_rate(1536); /* per rank, all ranks at once */
    double flops = ff_gpt_flops_per_token(g, o.T) * o.B * o.T * o.micro;
    /* each stage's mean busy ms per step (the mean over its ranks) */
    double stage_busy[64] = {0};
    int G = size / o.stages, st = ff_grid_stage(grid);
    if (o.stages <= 64) {
        stage_busy[st] = busy / o.reps / G * 1e3;
        MPI_Allreduce(MPI_IN_PLACE, stage_busy, o.stages, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
    }
    double frac = flops / step_s / (rate * size);
    ff_gpt_memory mem;
    ff_gpt_memory_report(g, &mem);
    ff_bf16_products products = ff_gpt_bf16_products(g, NULL, NULL);
    if (rank == 0) {
        printf("%s grid %s, %d rank(s) x %d thread(s) (BLAS %s, element-wise work on %s), kernel "
               "%s: L=%d C=%d NH=%d V=%d B=%d T=%d, %s%s%s\n",
               o.label, o.grid, size, o.threads, ff_blas_threading(), ff_ctx_team(ctx),
               ff_blas_core(), o.L, o.C, o.NH, o.V, o.B, o.T, ff_precision_name(o.precision),
               products == FF_BF16_PRODUCTS_ONEDNN     ? " (products on oneDNN)"
               : products == FF_BF16_PRODUCTS_EMULATED ? " (products emulated on the BLAS)"
                                                       : "",
               o.checkpoint ? ", checkpointing" : "");
        printf("  step %.1f ms (median of %d), %.0f tokens/s, model %.1f GFLOP/s = %.3f of sgemm "
               "%.1f GFLOP/s x %d ranks; rank 0 memory: params %.1f MiB, activations %.1f MiB; "
               "sent per step: rank 0 %.2f MiB, most of any rank %.2f MiB\n",
               step_s * 1e3, o.reps, o.B * o.T * o.micro / step_s, flops / step_s / 1e9, frac,
               rate / 1e9, size, mem.params / 1048576.0, mem.activations / 1048576.0,
               sent / 1048576.0, sent_max / 1048576.0);
        if (o.stages > 1)
            printf("  %d stages, %s schedule, %d micro-batches, limit %d%s\n", o.stages, o.schedule,
                   o.micro, o.limit ? o.limit : o.stages,
                   o.slow_stage >= 0 ? " (with a straggler)" : "");
        printf("{\"bench\":\"gpt\",\"label\":\"%s\",\"grid\":\"%s\",\"ranks\":%d,\"threads\":%d,"
               "\"blas_threading\":\"%s\",\"team\":\"%s\",\"kernel\":\"%s\",\"L\":%d,\"C\":%d,"
               "\"NH\":%d,\"V\":%d,\"B\":%d,\"T\":%d,\"precision\":\"%s\",\"bf16_products\":\"%s\","
               "\"checkpoint\":%d,\"progress\":\"%s\",\"decompose\":%d,\"plan\":\"%s\","
               "\"micro\":%d,\"stages\":%d,\"schedule\":\"%s\",\"limit\":%d,\"slow_stage\":%d,"
               "\"slow_ms\":%d,\"slow_jitter\":%d,\"pass_ms\":%d,\"median_ms\":%.2f,"
               "\"runs_ms\":[",
               o.label, o.grid, size, o.threads, ff_blas_threading(), ff_ctx_team(ctx),
               ff_blas_core(), o.L, o.C, o.NH, o.V, o.B, o.T, ff_precision_name(o.precision),
               products == FF_BF16_PRODUCTS_AUTO ? "none" : ff_bf16_products_name(products),
               o.checkpoint, thread ? "thread" : "poll", o.decompose, o.plan ? o.plan : "", o.micro,
               o.stages, o.schedule, o.limit ? o.limit : o.stages, o.slow_stage, o.slow_ms,
               o.jitter, o.pass_ms, step_s * 1e3);
        for (int r = 0; r < o.reps; r++)
            printf("%s%.2f", r ? "," : "", runs[r] * 1e3);
        printf("],\"stage_busy_ms\":[");
        for (int k = 0; k < o.stages && k < 64; k++)
            printf("%s%.2f", k ? "," : "", stage_busy[k]);
        printf("],\"tokens_per_s\":%.1f,\"model_gflops\":%.3f,\"sgemm_gflops_per_rank\":%.3f,"
               "\"fraction\":%.4f,\"experts\":%d,\"ep\":%d,\"dtd\":%d,\"cac\":%d,"
               "\"alltoall_wait_ms\":%.3f,\"x_allgather_wait_ms\":%.3f,\"dropped\":%.4f,"
               "\"params_mib\":%.1f,\"activations_mib\":%.1f,\"sent_per_step\":%.0f,"
               "\"sent_per_step_max\":%.0f}\n",
               o.B * o.T * o.micro / step_s, flops / step_s / 1e9, rate / 1e9, frac, o.experts,
               o.ep, o.dtd, o.cac, a2a_wait, ag_wait, info.dropped, mem.params / 1048576.0,
               mem.activations / 1048576.0, sent, sent_max);
    }
    if (o.rss && rank == 0) {
        const double mib = 1.0 / 1048576.0;
        const double state = (double)(mem.params + mem.grads + mem.adam + mem.mask) * mib;
        const double all = (double)ff_gpt_memory_total(&mem) * mib, held = rss[0] - rss_start;
        printf("  rss MiB (rank 0, largest over the measured steps): at the start %.1f, before a "
               "step %.1f, forward and backward peak %.1f, before the optimizer step %.1f, its "
               "peak %.1f (+%.1f), after %.1f; optimizer step %.1f ms (median)\n",
               rss_start, rss[0], rss[1], rss[2], rss[3], rss[3] - rss[2], rss[4],
               ff_median(opt_ms, o.reps));
        printf("  ff_gpt_memory MiB: params %.1f grads %.1f adam %.1f mask/offsets %.1f = model "
               "state %.1f; activations %.1f scratch %.1f layers' pool %.1f (peak in use %.1f) "
               "GEMMs' transposes and bf16 operands %.1f; all %.1f against the resident set "
               "before a step less the start's, %.1f (%+.1f %%); the library's float buffers "
               "%.1f\n",
               mem.params * mib, mem.grads * mib, mem.adam * mib, mem.mask * mib, state,
               mem.activations * mib, mem.scratch * mib, mem.linear_held * mib,
               mem.linear_peak * mib, mem.gemm_scratch * mib, all, held, 100 * (held / all - 1),
               (double)ff_fbuf_live_bytes() * mib);
    }
    free(tok), free(tgt);
    if (o.gemm_report && rank == 0) /* what rank 0's GEMM tuner chose, and its timings */
        ff_gemm_report(ff_linear_seq_gemm(ff_gpt_linear_seq(g)), stdout);
    ff_gpt_destroy(g);
    ff_grid_destroy(grid);
    ff_ctx_destroy(ctx);
    MPI_Finalize();
    return 0;
}
