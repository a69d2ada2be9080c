/* fourfold train: the training program. Model, grid, data, schedule and
 * checkpoints from the command line; a table of every setting at start; one
 * line per step on rank 0 and the same as JSON lines in the output folder;
 * checkpoints that resume on any grid (docs/train.md). */
#include <errno.h>
#include <glob.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "bench.h"
#include "cli.h"

typedef struct {
    cli_run_opts run;
    const char *model;
    long layers, hidden, heads, vocab, max_seq; /* overrides; 0: the preset's */
    long batch, micro, seq, steps;
    ff_adamw hyper;
    const char *data, *val_data, *out, *resume_from, *init_from;
    int resume, overwrite, grid_auto;
    long ag_cache_blocks; /* the planner's unit; -1: every layer, wte included */
    long seed, val_every, val_batches, save_every, keep, log_every, sample_tokens;
    ff_gpt_opts gpt;
} train_opts;

static const char help[] =
    "usage: mpirun -np N fourfold train [options]\n\n"
    "Trains a GPT-2 shaped model on llm.c token shards over a 4D grid; with no\n"
    "--data, on the default corpus (the fortune(6) files, byte-level tokens).\n\n"
    "model:\n"
    "  --model NAME      preset: mini (default: L=4 C=128 NH=4, byte vocabulary 257),\n"
    "                    tiny, gpt2-124m, gpt2-350m, ..., gpt-5b ... gpt-640b\n"
    "  --layers N --hidden N --heads N --vocab N --max-seq N   override the preset\n"
    "  --init-from FILE  start from an llm.c gpt2_*.bin v3 checkpoint (its shape)\n"
    "batch and schedule:\n"
    "  --batch N         sequences per step, whole grid (default 16)\n"
    "  --micro-batch N   sequences per micro-batch (default: --batch; N must divide it)\n"
    "  --seq N           tokens per sequence (default 64)\n"
    "  --steps N         optimizer steps (default 200)\n"
    "  --lr F            peak learning rate (default 1e-3)\n"
    "  --warmup N        linear warm-up steps (default 0)\n"
    "  --min-lr-frac F   cosine decays to lr*F at the last step (default 0.1)\n"
    "  --weight-decay F  AdamW decay of the 2-D weights (default 0.1)\n"
    "  --clip F          gradient-norm clipping, 0 = none (default 1)\n"
    "  --seed N          initialisation and sampling seed (default 1337)\n"
    "data:\n"
    "  --data GLOB       training shards (llm.c .bin, uint16 tokens)\n"
    "  --val-data GLOB   validation shards (default: GLOB with 'train' -> 'val', if any)\n"
    "  --val-every N     validation loss every N steps and at the end (default 50; 0 = end only)\n"
    "  --val-batches N   micro-batches per validation (default 8)\n"
    "output and checkpoints:\n"
    "  --out DIR         log.jsonl and checkpoints (default out)\n"
    "  --save-every N    checkpoint every N steps and at the end (default 0 = end only)\n"
    "  --keep N          complete checkpoints kept (default 2)\n"
    "  --resume          continue from the newest checkpoint in --out (any grid)\n"
    "  --resume-from DIR continue from the newest checkpoint in DIR\n"
    "  --overwrite       start afresh in an --out that holds checkpoints (removes them)\n"
    "  --log-every N     print every N-th step (default 1; JSON gets every step)\n"
    "  --sample N        print N sampled tokens at the end (default 0)\n"
    "parallelism:\n"
    "  --checkpoint on|off   activation checkpointing (default off)\n"
    "  --overlap on|off      all overlaps: OAR, ORS, OAG, data-parallel buckets (default on)\n"
    "  --ag-cache N          the last N blocks keep their gathered weights from the forward\n"
    "                        to the backward (-1: every layer and wte; default -1)\n"
    "  --wire fp32|bf16      element format of the linear layers' collectives (default fp32)\n"
    "  --grid auto           the planner's first choice for this model, batch and job\n";

static void defaults(train_opts *o)
{
    memset(o, 0, sizeof *o);
    cli_run_opts_default(&o->run);
    o->model = "mini";
    o->batch = 16;
    o->seq = 64;
    o->steps = 200;
    ff_adamw_default(&o->hyper);
    o->hyper.lr = 1e-3f;
    o->out = "out";
    o->seed = 1337;
    o->val_every = 50;
    o->val_batches = 8;
    o->keep = 2;
    o->ag_cache_blocks = -1;
    o->log_every = 1;
    ff_gpt_opts_default(&o->gpt);
}

static int parse_onoff(const char *opt, const char *v, int *out)
{
    if (!strcmp(v, "on") || !strcmp(v, "1"))
        *out = 1;
    else if (!strcmp(v, "off") || !strcmp(v, "0"))
        *out = 0;
    else {
        cli_error("--%s %s: expected on or off", opt, v);
        return -1;
    }
    return 0;
}

/* The options that take one number or string, as a table. */
typedef struct {
    const char *name;
    char kind; /* 'l' long, 'i' int, 'f' float, 's' string */
    void *field;
    double lo, hi;
} option;

static int parse_table(cli_args *a, const option *t, size_t n, int *bad)
{
    for (size_t i = 0; i < n; i++) {
        if (!cli_is(a, t[i].name))
            continue;
        const char *v = cli_value(a);
        long l;
        double d;
        if (!v)
            *bad = 1;
        else if (t[i].kind == 's')
            *(const char **)t[i].field = v;
        else if (t[i].kind == 'f') {
            if (cli_parse_double(t[i].name, v, t[i].lo, t[i].hi, &d))
                *bad = 1;
            else
                *(float *)t[i].field = (float)d;
        } else if (cli_parse_int(t[i].name, v, (long)t[i].lo, (long)t[i].hi, &l))
            *bad = 1;
        else if (t[i].kind == 'i')
            *(int *)t[i].field = (int)l;
        else
            *(long *)t[i].field = l;
        return 1;
    }
    return 0;
}

/* Returns CLI_OK, CLI_USAGE, or -1 for --help. */
static int parse(int argc, char **argv, train_opts *o)
{
    const double big = 1L << 30;
    const option table[] = {
        {"model", 's', &o->model, 0, 0},
        {"layers", 'l', &o->layers, 1, 10000},
        {"hidden", 'l', &o->hidden, 1, 1 << 20},
        {"heads", 'l', &o->heads, 1, 1 << 16},
        {"vocab", 'l', &o->vocab, 1, 1 << 24},
        {"max-seq", 'l', &o->max_seq, 1, 1 << 20},
        {"batch", 'l', &o->batch, 1, 1 << 24},
        {"micro-batch", 'l', &o->micro, 1, 1 << 24},
        {"seq", 'l', &o->seq, 1, 1 << 20},
        {"steps", 'l', &o->steps, 0, big},
        {"lr", 'f', &o->hyper.lr, 0, 1e38},
        {"warmup", 'i', &o->hyper.warmup, 0, big},
        {"min-lr-frac", 'f', &o->hyper.min_lr_frac, 0, 1},
        {"weight-decay", 'f', &o->hyper.weight_decay, 0, 1e6},
        {"clip", 'f', &o->hyper.clip, 0, 1e38},
        {"seed", 'l', &o->seed, 0, 0x7fffffff},
        {"data", 's', &o->data, 0, 0},
        {"val-data", 's', &o->val_data, 0, 0},
        {"val-every", 'l', &o->val_every, 0, big},
        {"val-batches", 'l', &o->val_batches, 1, 1 << 20},
        {"out", 's', &o->out, 0, 0},
        {"save-every", 'l', &o->save_every, 0, big},
        {"keep", 'l', &o->keep, 0, 1 << 20},
        {"resume-from", 's', &o->resume_from, 0, 0},
        {"init-from", 's', &o->init_from, 0, 0},
        {"log-every", 'l', &o->log_every, 1, big},
        {"sample", 'l', &o->sample_tokens, 0, 1 << 20},
        {"ag-cache", 'l', &o->ag_cache_blocks, -1, 1 << 20},
    };
    cli_args a;
    cli_args_init(&a, argc, argv);
    int bad = 0;
    while (!bad && cli_next(&a)) {
        const char *v;
        int on;
        if (cli_run_option(&a, &o->run, &bad) ||
            parse_table(&a, table, sizeof table / sizeof table[0], &bad))
            continue;
        if (!a.name)
            return cli_unknown(&a, "train");
        if (cli_is(&a, "help"))
            return -1;
        if (cli_is(&a, "resume")) {
            o->resume = 1;
        } else if (cli_is(&a, "overwrite")) {
            o->overwrite = 1;
        } else if (cli_is(&a, "checkpoint")) {
            bad = !(v = cli_value(&a)) || parse_onoff("checkpoint", v, &o->gpt.checkpoint);
        } else if (cli_is(&a, "overlap")) {
            bad = !(v = cli_value(&a)) || parse_onoff("overlap", v, &on);
            if (!bad)
                o->gpt.dp_overlap = o->gpt.linear.oar = o->gpt.linear.ors = o->gpt.linear.oag = on;
        } else if (cli_is(&a, "wire")) {
            if (!(v = cli_value(&a)))
                bad = 1;
            else if (!strcmp(v, "fp32") || !strcmp(v, "bf16"))
                o->gpt.linear.coll.wire = !strcmp(v, "bf16") ? FF_WIRE_BF16 : FF_WIRE_FP32;
            else {
                cli_error("--wire %s: expected fp32 or bf16", v);
                bad = 1;
            }
        } else {
            return cli_unknown(&a, "train");
        }
    }
    if (bad)
        return CLI_USAGE;
    if (!o->micro)
        o->micro = o->batch;
    if (o->batch % o->micro) {
        cli_error("--batch %ld is not a multiple of --micro-batch %ld", o->batch, o->micro);
        return CLI_USAGE;
    }
    if (o->resume && o->resume_from) {
        cli_error("--resume and --resume-from: give one");
        return CLI_USAGE;
    }
    if (o->resume && o->overwrite) {
        cli_error("--overwrite starts a new run; it cannot be combined with --resume");
        return CLI_USAGE;
    }
    if ((o->resume || o->resume_from) && o->init_from) {
        cli_error("--init-from starts a new run; it cannot be combined with --resume");
        return CLI_USAGE;
    }
    o->hyper.steps = (int)o->steps;
    /* the model counts layers (four per block; wte is cached only with "all") */
    o->gpt.linear.ag_cache_layers = o->ag_cache_blocks < 0 ? -1 : (int)(4 * o->ag_cache_blocks);
    return CLI_OK;
}

/* The model shape: a preset with overrides (the checkpoint's, with --init-from). */
static int model_config(const train_opts *o, ff_gpt_config *cfg)
{
    ff_model m;
    char err[512];
    if (ff_model_preset(o->model, &m, err, sizeof err)) {
        cli_error("%s", err);
        return CLI_USAGE;
    }
    memset(cfg, 0, sizeof *cfg);
    cfg->L = o->layers ? (int)o->layers : m.layers;
    cfg->C = o->hidden ? (int)o->hidden : (int)m.hidden;
    cfg->NH = o->heads ? (int)o->heads : m.heads;
    cfg->V = o->vocab ? (int)o->vocab : (int)m.vocab;
    cfg->maxT = o->max_seq ? (int)o->max_seq : m.max_seq ? (int)m.max_seq : (int)o->seq;
    if (o->seq > cfg->maxT) {
        cli_error("--seq %ld is longer than the model's %d positions", o->seq, cfg->maxT);
        return CLI_USAGE;
    }
    return CLI_OK;
}

/* --grid auto: the planner's first choice for this model, batch and job, on
 * the profile of this machine. */
static int resolve_auto_grid(train_opts *o, const ff_gpt_config *cfg, char *buf, size_t len)
{
    ff_plan_config pc;
    ff_plan_config_default(&pc);
    char err[512];
    if (ff_profile_preset("this", &pc.machine, err, sizeof err))
        goto fail;
    ff_gpt_config from_file;
    if (o->init_from) {
        /* plan for the checkpoint's shape: its header, read here on every
         * rank (no context yet; the same file, so the same outcome) */
        int32_t h[8];
        FILE *f = fopen(o->init_from, "rb");
        int ok = f && fread(h, sizeof h, 1, f) == 1 && h[0] == 20240326;
        if (f)
            fclose(f);
        if (!ok) {
            snprintf(err, sizeof err, "cannot read the model shape of '%s'", o->init_from);
            goto fail;
        }
        from_file = (ff_gpt_config){.maxT = h[2], .V = h[3], .L = h[4], .NH = h[5], .C = h[6]};
        cfg = &from_file;
    }
    memset(&pc.model, 0, sizeof pc.model);
    snprintf(pc.model.name, sizeof pc.model.name, "%s", o->model);
    pc.model.layers = cfg->L;
    pc.model.heads = cfg->NH;
    pc.model.hidden = cfg->C;
    pc.model.vocab = cfg->V;
    pc.model.max_seq = cfg->maxT;
    pc.batch = o->batch;
    pc.seq = o->seq;
    pc.micro_batches = (int)(o->batch / o->micro);
    MPI_Comm_size(MPI_COMM_WORLD, &pc.ranks);
    pc.machine.ranks_per_node = cli_ranks_per_node(MPI_COMM_WORLD);
    const char *k = getenv("FF_RANKS_PER_NODE"); /* as the run's nodes */
    if (k && atoi(k) > 0)
        pc.machine.ranks_per_node = atoi(k);
    if (cli_coll_model(&pc.coll, err, sizeof err) != FF_OK)
        goto fail;
    pc.checkpoint = o->gpt.checkpoint;
    pc.ag_cache = o->ag_cache_blocks < 0 ? cfg->L : (int)o->ag_cache_blocks;
    if (!o->gpt.linear.oar || !o->gpt.dp_overlap)
        pc.overlap = 0; /* --overlap off */
    ff_plan *plan = NULL;
    int rc = ff_plan_create(&plan, &pc);
    if (rc || ff_plan_accepted(plan) == 0) {
        snprintf(err, sizeof err, "%s",
                 rc ? ff_plan_error(plan) : "no grid of this job divides the model and batch");
        ff_plan_destroy(plan);
        goto fail;
    }
    ff_dims gd = ff_plan_get(plan, 0)->grid;
    ff_plan_destroy(plan);
    snprintf(buf, len, "%dx%dx%dx%d", gd.x, gd.y, gd.z, gd.d);
    o->run.grid = buf;
    o->grid_auto = 1;
    return CLI_OK;
fail:
    cli_error("--grid auto: %s", err);
    return CLI_FAIL;
}

/* mkdir -p: the folder and its missing parents. */
static int make_dirs(const char *dir)
{
    char path[4200];
    snprintf(path, sizeof path, "%s", dir);
    for (char *p = path + 1; *p; p++)
        if (*p == '/') {
            *p = '\0';
            if (mkdir(path, 0777) != 0 && errno != EEXIST)
                return -1;
            *p = '/';
        }
    return mkdir(path, 0777) != 0 && errno != EEXIST ? -1 : 0;
}

/* Rank 0 makes the output folder and checks that it can write there. */
static int prepare_out(ff_ctx *ctx, const char *dir)
{
    int rc = FF_OK;
    if (ff_ctx_rank(ctx) == 0) {
        char probe[4200];
        snprintf(probe, sizeof probe, "%s/.fourfold-probe", dir);
        struct stat sb;
        FILE *f = NULL;
        if (make_dirs(dir) != 0)
            rc = ff_ctx_set_error(ctx, FF_EIO, "cannot create the output folder '%s': %s", dir,
                                  strerror(errno));
        else if (stat(dir, &sb) != 0 || !S_ISDIR(sb.st_mode))
            rc = ff_ctx_set_error(ctx, FF_EIO, "the output folder '%s' is not a folder", dir);
        else if (!(f = fopen(probe, "w")))
            rc = ff_ctx_set_error(ctx, FF_EIO, "cannot write in the output folder '%s': %s", dir,
                                  strerror(errno));
        if (f) {
            fclose(f);
            remove(probe);
        }
    }
    return ff_ctx_agree(ctx, rc);
}

/* Communication of one step on this rank, from the group counters: time
 * blocked in waits, and time collectives were in flight while the rank did
 * something else (flight - wait, summed over collectives; concurrent ones
 * count separately). */
typedef struct {
    double wait_s, flight_s;
    uint64_t calls, sent, recv;
} comm_totals;

static comm_totals totals(ff_grid *grid)
{
    comm_totals t = {0};
    for (int k = 0; k < FF_NGROUPS; k++) {
        ff_group *g = ff_grid_group(grid, (ff_group_kind)k);
        if (!g)
            continue;
        for (int c = 0; c < FF_NCOLL; c++) {
            ff_counters n = ff_group_counters(g, (ff_coll)c);
            t.wait_s += n.wait_s;
            t.flight_s += n.flight_s;
            t.calls += n.calls;
            t.sent += n.bytes_sent;
            t.recv += n.bytes_recv;
        }
    }
    return t;
}

static void log_bytes(FILE *log, ff_grid *grid)
{
    for (int k = 0; k < FF_NGROUPS; k++) {
        ff_group *g = ff_grid_group(grid, (ff_group_kind)k);
        if (!g)
            continue;
        for (int c = 0; c < FF_NCOLL; c++) {
            ff_counters n = ff_group_counters(g, (ff_coll)c);
            if (n.calls)
                fprintf(log,
                        "{\"type\":\"bytes\",\"group\":\"%s\",\"coll\":\"%s\",\"calls\":%llu,"
                        "\"bytes_sent\":%llu,\"bytes_recv\":%llu,\"wait_s\":%.6f}\n",
                        ff_group_kind_name((ff_group_kind)k), ff_coll_name((ff_coll)c),
                        (unsigned long long)n.calls, (unsigned long long)n.bytes_sent,
                        (unsigned long long)n.bytes_recv, n.wait_s);
        }
    }
}

/* The mean loss over the first --val-batches micro-batches of the
 * validation data (the same batches every time). */
static int validate(ff_ctx *ctx, ff_gpt *g, ff_data *val, const train_opts *o, int vocab,
                    int32_t *tok, int32_t *tgt, float *loss)
{
    int first, count, rc = ff_data_seek(val, (ff_data_pos){0, 0, 0});
    ff_gpt_local_sequences(g, &first, &count);
    double sum = 0;
    for (long i = 0; rc == FF_OK && i < o->val_batches; i++) {
        float l = 0;
        /* a bad token may be on one rank's sequences only: agree first */
        rc = ff_ctx_agree(
            ctx, ff_data_next(val, 1, (int)o->micro, (int)o->seq, first, count, vocab, tok, tgt));
        if (rc == FF_OK)
            rc = ff_gpt_eval(g, tok, tgt, &l);
        sum += l;
    }
    *loss = (float)(sum / (double)o->val_batches);
    return rc;
}

/* The default corpus when no --data is given: the fortune(6) files, made
 * into byte-level shards under OUT/corpus on first use (rank 0). */
static int default_data(ff_ctx *ctx, train_opts *o, char *train, char *val, size_t len)
{
    char dir[4200], err[512] = "";
    snprintf(dir, sizeof dir, "%s/corpus", o->out);
    int rc = FF_OK;
    if (ff_ctx_rank(ctx) == 0 && cli_default_corpus(dir, err, sizeof err) != 0)
        rc = ff_ctx_set_error(ctx, FF_EIO, "%s", err);
    snprintf(train, len, "%s/fortunes_train.bin", dir);
    snprintf(val, len, "%s/fortunes_val.bin", dir);
    o->data = train;
    if (!o->val_data)
        o->val_data = val;
    return ff_ctx_agree(ctx, rc);
}

/* --val-data by default: the training glob with its last "train" replaced
 * by "val" (llm.c's names: fineweb_train_*.bin, fineweb_val_*.bin). */
static void guess_val(train_opts *o, char *buf, size_t len)
{
    const char *name = strrchr(o->data, '/'), *p = NULL;
    const char *q = name ? name + 1 : o->data; /* in the file name only */
    while ((q = strstr(q, "train")))
        p = q++;
    if (!p || o->val_data)
        return;
    snprintf(buf, len, "%.*sval%s", (int)(p - o->data), o->data, p + 5);
    o->val_data = buf;
}

static void print_settings(const train_opts *o, ff_gpt *g, ff_grid *grid, double sgemm_rank,
                           int ranks, int start_step)
{
    ff_gpt_config c = ff_gpt_get_config(g);
    ff_gpt_memory mem;
    ff_gpt_memory_report(g, &mem);
    ff_dims s = ff_grid_shape(grid);
    double mib = 1.0 / (1 << 20);
    cli_print(
        "+-----------------------+------------------------------------------------------------+\n");
#define ROW(name, ...)                                                                             \
    do {                                                                                           \
        char v_[256];                                                                              \
        snprintf(v_, sizeof v_, __VA_ARGS__);                                                      \
        cli_print("| %-21s | %-58s |\n", name, v_);                                                \
    } while (0)
    ROW("model", "%s  L=%d C=%d NH=%d V=%d (Vp %d) maxT=%d", o->init_from ? o->init_from : o->model,
        c.L, c.C, c.NH, c.V, c.Vp, c.maxT);
    ROW("parameters", "%lld", (long long)ff_gpt_num_params(g));
    ROW("grid (x y z d)", "%dx%dx%dx%d on %d ranks%s", s.x, s.y, s.z, s.d, ranks,
        o->grid_auto ? " (--grid auto: the planner's first choice)" : "");
    ROW("batch", "%ld sequences x %ld tokens = %ld tokens", o->batch, o->seq, o->batch * o->seq);
    ROW("micro-batches", "%ld of %ld sequences", o->batch / o->micro, o->micro);
    ROW("steps", "%d to %ld", start_step, o->steps);
    ROW("learning rate", "%g, warm-up %d, cosine to %g", o->hyper.lr, o->hyper.warmup,
        o->hyper.lr * o->hyper.min_lr_frac);
    ROW("AdamW", "betas %g %g, eps %g, decay %g, clip %g", o->hyper.beta1, o->hyper.beta2,
        o->hyper.eps, o->hyper.weight_decay, o->hyper.clip);
    ROW("data", "%s", o->data);
    ROW("validation", "%s, every %ld steps, %ld batches", o->val_data ? o->val_data : "none",
        o->val_every, o->val_batches);
    ROW("output", "%s (checkpoint every %ld, keep %ld)", o->out, o->save_every, o->keep);
    ROW("seed", "%ld", o->seed);
    ROW("activation ckpt", "%s", o->gpt.checkpoint ? "on" : "off");
    char agc[32] = "all";
    if (o->ag_cache_blocks >= 0)
        snprintf(agc, sizeof agc, "last %ld blocks", o->ag_cache_blocks);
    ROW("overlaps", "OAR %s ORS %s OAG %s DP %s, AG cache %s", o->gpt.linear.oar ? "on" : "off",
        o->gpt.linear.ors ? "on" : "off", o->gpt.linear.oag ? "on" : "off",
        o->gpt.dp_overlap ? "on" : "off", agc);
    ROW("wire", "%s", o->gpt.linear.coll.wire == FF_WIRE_BF16 ? "bf16" : "fp32");
    ROW("memory per rank", "params %.1f grads %.1f adam %.1f act %.1f MiB", mem.params * mib,
        mem.grads * mib, mem.adam * mib, mem.activations * mib);
    ROW("sgemm per rank", "%.1f GFLOP/s (%s, %d thread(s), all ranks at once)", sgemm_rank * 1e-9,
        cli_blas_core(), o->run.blas_threads);
    ROW("model FLOPs", "6N + 12LCT = %.3g per token", ff_gpt_flops_per_token(g, (int)o->seq));
#undef ROW
    cli_print(
        "+-----------------------+------------------------------------------------------------+\n");
}

/* 1 if the pattern matches a file on every rank. */
static int matches_everywhere(const char *pattern)
{
    glob_t gl;
    int local = glob(pattern, 0, NULL, &gl) == 0 && gl.gl_pathc > 0, all = 0;
    if (local || gl.gl_pathv)
        globfree(&gl);
    MPI_Allreduce(&local, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    return all;
}

/* Starts the run: from a checkpoint (--resume), an llm.c file (--init-from)
 * or GPT-2's initialisation. */
static int start_run(ff_ctx *ctx, ff_gpt *g, ff_data *data, const train_opts *o,
                     const char *resume_dir, ff_train_state *st)
{
    int rc;
    memset(st, 0, sizeof *st);
    if (resume_dir) {
        int64_t step;
        if ((rc = ff_ckpt_latest(ctx, resume_dir, &step)))
            return rc;
        if (step < 0)
            return ff_ctx_agree(ctx, ff_ctx_set_error(ctx, FF_EIO,
                                                      "no complete checkpoint to resume in '%s' "
                                                      "(no DONE_* marker)",
                                                      resume_dir));
        if ((rc = ff_ckpt_load(g, resume_dir, step, st)))
            return rc;
        const ff_adamw *h = &st->hyper, *n = &o->hyper;
        if (h->lr != n->lr || h->warmup != n->warmup || h->steps != n->steps ||
            h->min_lr_frac != n->min_lr_frac || h->weight_decay != n->weight_decay ||
            h->clip != n->clip)
            cli_print("note: the schedule differs from the checkpoint's (--lr %g --warmup %d "
                      "--steps %d --min-lr-frac %g --weight-decay %g --clip %g); continuing "
                      "with this command line's, so the run is not the one that was saved\n",
                      h->lr, h->warmup, h->steps, h->min_lr_frac, h->weight_decay, h->clip);
        if (st->batch != o->batch || st->seq != o->seq)
            cli_print("note: the checkpoint was trained with --batch %d --seq %d; continuing with "
                      "--batch %ld --seq %ld from its data position\n",
                      st->batch, st->seq, o->batch, o->seq);
        cli_print("resumed from step %lld of %s\n", (long long)st->step, resume_dir);
        return ff_ctx_agree(ctx, ff_data_seek(data, st->data));
    }
    if (o->init_from)
        return ff_gpt_load(g, o->init_from);
    return ff_gpt_init(g, (uint64_t)o->seed);
}

int cmd_train(int argc, char **argv)
{
    train_opts o;
    defaults(&o);
    int code = parse(argc, argv, &o);
    if (code == -1) {
        cli_print("%s%s", help, cli_run_help);
        return CLI_OK;
    }
    if (code != CLI_OK)
        return code;
    ff_gpt_config cfg;
    if ((code = model_config(&o, &cfg)) != CLI_OK)
        return code;
    char auto_grid[64];
    if (!strcmp(o.run.grid, "auto") &&
        (code = resolve_auto_grid(&o, &cfg, auto_grid, sizeof auto_grid)) != CLI_OK)
        return code;
    ff_ctx *ctx;
    ff_grid *grid;
    if (cli_setup(&o.run, &ctx, &grid) != CLI_OK)
        return CLI_FAIL;

    const int world = ff_ctx_size(ctx), root = ff_ctx_rank(ctx) == 0;
    const int n_micro = (int)(o.batch / o.micro), T = (int)o.seq;
    const char *resume_dir = o.resume ? o.out : o.resume_from;
    char train_glob[4300], val_glob[4300], path[4300];
    ff_gpt *g = NULL;
    ff_data *data = NULL, *val = NULL;
    int32_t *tok = NULL, *tgt = NULL;
    FILE *log = NULL;
    ff_train_state st;
    int rc, first = 0, count = 0;
    /* the last two checkpoints written or loaded: checkpoint s is known good
     * once step s + 1 has a finite loss */
    char ck_last[4300] = "", ck_prev[4300] = "";
    int64_t saved = -1;

    if ((rc = prepare_out(ctx, o.out)))
        goto done;
    if (resume_dir != o.out) {
        /* a new run (or one resumed from elsewhere) must not mix its
         * checkpoints with an older run's: --resume would pick the wrong one */
        int64_t newest;
        if ((rc = ff_ckpt_latest(ctx, o.out, &newest)))
            goto done;
        if (newest >= 0 && o.overwrite)
            rc = ff_ckpt_clear(ctx, o.out);
        else if (newest >= 0)
            rc = ff_ctx_agree(ctx, ff_ctx_set_error(ctx, FF_EINVAL,
                                                    "'%s' holds the checkpoints of another run "
                                                    "(newest: step %lld); --resume continues it, "
                                                    "--overwrite removes them",
                                                    o.out, (long long)newest));
        if (rc)
            goto done;
    }
    if (!o.data)
        rc = default_data(ctx, &o, train_glob, val_glob, sizeof train_glob);
    else
        guess_val(&o, val_glob, sizeof val_glob);
    if (rc)
        goto done;
    if (o.val_data == val_glob && !matches_everywhere(o.val_data))
        o.val_data = NULL; /* a guess that matches nothing: no validation */
    if (o.init_from && (rc = ff_gpt_read_config(ctx, o.init_from, &cfg)) == FF_OK &&
        o.seq > cfg.maxT)
        rc = ff_ctx_agree(ctx, ff_ctx_set_error(ctx, FF_EINVAL,
                                                "--seq %ld is longer than the %d positions of '%s'",
                                                o.seq, cfg.maxT, o.init_from));
    if (rc || (rc = ff_gpt_create(grid, &cfg, &o.gpt, (int)o.micro, T, &g)))
        goto done;
    cfg = ff_gpt_get_config(g);
    if ((rc = ff_data_open(ctx, o.data, o.batch * o.seq + 1, &data)))
        goto done;
    if (o.val_data && (rc = ff_data_open(ctx, o.val_data, o.micro * o.seq + 1, &val)))
        goto done;
    ff_gpt_local_sequences(g, &first, &count);
    tok = malloc((size_t)n_micro * count * T * sizeof *tok);
    tgt = malloc((size_t)n_micro * count * T * sizeof *tgt);
    if ((rc = ff_ctx_agree(
             ctx,
             tok && tgt ? FF_OK : ff_ctx_set_error(ctx, FF_ENOMEM, "out of memory for a batch"))))
        goto done;
    if ((rc = start_run(ctx, g, data, &o, resume_dir, &st)))
        goto done;
    if (resume_dir) {
        saved = st.step;
        ff_ckpt_path(ck_last, sizeof ck_last, resume_dir, "model", saved);
        if (st.step >= o.steps)
            cli_print("note: the checkpoint is at step %lld, --steps is %ld: nothing to train\n",
                      (long long)st.step, o.steps);
    }
    st.seed = (uint64_t)o.seed;
    st.batch = (int)o.batch;
    st.micro_batch = (int)o.micro;
    st.seq = T;
    st.hyper = o.hyper;

    /* the empirical peak: sgemm on every rank at once, as the step runs */
    MPI_Barrier(MPI_COMM_WORLD);
    double sgemm = bench_sgemm_rate(512, 512, 512, o.run.blas_threads, 0.2), sgemm_med;
    cli_set_blas_threads(o.run.blas_threads);
    MPI_Allreduce(&sgemm, &sgemm_med, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
    sgemm_med /= world; /* mean over ranks */
    print_settings(&o, g, grid, sgemm_med, world, (int)st.step);

    int io = FF_OK;
    if (root) {
        snprintf(path, sizeof path, "%s/log.jsonl", o.out);
        if (!(log = fopen(path, resume_dir ? "a" : "w")))
            io = ff_ctx_set_error(ctx, FF_EIO, "cannot write '%s'", path);
        else {
            ff_dims s = ff_grid_shape(grid);
            fprintf(log,
                    "{\"type\":\"config\",\"grid\":\"%dx%dx%dx%d\",\"L\":%d,\"C\":%d,\"NH\":%d,"
                    "\"V\":%d,\"maxT\":%d,\"batch\":%ld,\"micro_batch\":%ld,\"seq\":%d,"
                    "\"steps\":%ld,\"lr\":%g,\"start_step\":%lld,\"sgemm_flops_per_rank\":%.4g,"
                    "\"blas_core\":\"%s\",\"ranks\":%d}\n",
                    s.x, s.y, s.z, s.d, cfg.L, cfg.C, cfg.NH, cfg.V, cfg.maxT, o.batch, o.micro, T,
                    o.steps, o.hyper.lr, (long long)st.step, sgemm_med, cli_blas_core(), world);
            if (resume_dir)
                fprintf(log, "{\"type\":\"resume\",\"step\":%lld,\"from\":\"%s\"}\n",
                        (long long)st.step, resume_dir);
            fflush(log);
        }
    }
    if ((rc = ff_ctx_agree(ctx, io)))
        goto done;

    const double flops_step = ff_gpt_flops_per_token(g, T) * (double)o.batch * T;
    for (int64_t step = st.step; step < o.steps; step++) {
        comm_totals c0 = totals(grid);
        double t0 = ff_now();
        rc = ff_ctx_agree(
            ctx, ff_data_next(data, n_micro, (int)o.micro, T, first, count, cfg.V, tok, tgt));
        if (rc)
            goto done;
        ff_gpt_step_info info;
        rc = ff_gpt_step(g, tok, tgt, n_micro, &o.hyper, (int)step, &info);
        double dt = ff_now() - t0;
        if (rc == FF_ENUMERIC) {
            /* the checkpoint of the previous step holds the parameters that
             * gave this loss; an older one was followed by a finite loss */
            const char *good = saved >= 0 && saved < step ? ck_last : ck_prev;
            if (good == ck_prev && o.keep == 1)
                good = ""; /* removed when the newer one was written */
            char why[1024];
            snprintf(why, sizeof why, "%s", ff_ctx_error(ctx)); /* names the step */
            ff_ctx_set_error(ctx, rc, "%s; stopping (the last good checkpoint: %s)", why,
                             *good ? good : "none");
            goto done;
        }
        if (rc)
            goto done;
        comm_totals c1 = totals(grid);
        double wait = c1.wait_s - c0.wait_s;
        /* in flight beside compute: summed over collectives (concurrent ones
         * each count), so capped at the compute time it hid behind */
        double hidden = fmin(fmax(0.0, (c1.flight_s - c0.flight_s) - wait), dt - wait);
        double tok_s = (double)o.batch * T / dt, flops = flops_step / dt;
        double frac = flops / (sgemm_med * world);
        if (root && (step % o.log_every == 0 || step + 1 == o.steps))
            cli_print("step %5lld/%ld | loss %.4f | lr %.2e | norm %.3f | %7.1f ms | %7.0f tok/s | "
                      "%.2f GFLOP/s %4.1f%% of sgemm | compute %.1f wait %.1f hidden %.1f ms\n",
                      (long long)step + 1, o.steps, info.loss, info.lr, info.grad_norm, dt * 1e3,
                      tok_s, flops * 1e-9, 100 * frac, (dt - wait) * 1e3, wait * 1e3, hidden * 1e3);
        if (log) {
            fprintf(log,
                    "{\"type\":\"step\",\"step\":%lld,\"loss\":%.9g,\"lr\":%.9g,\"grad_norm\":%.9g,"
                    "\"ms\":%.3f,\"tokens_per_s\":%.1f,\"model_flops_per_s\":%.4g,"
                    "\"sgemm_fraction\":%.4f,\"compute_ms\":%.3f,\"wait_ms\":%.3f,"
                    "\"hidden_ms\":%.3f}\n",
                    (long long)step + 1, info.loss, info.lr, info.grad_norm, dt * 1e3, tok_s, flops,
                    frac, (dt - wait) * 1e3, wait * 1e3, hidden * 1e3);
            fflush(log);
        }
        const int last = step + 1 == o.steps;
        if (val && ((o.val_every && (step + 1) % o.val_every == 0) || last)) {
            float vl;
            if ((rc = validate(ctx, g, val, &o, cfg.V, tok, tgt, &vl)))
                goto done;
            cli_print("step %5lld/%ld | validation loss %.4f (%ld batches)\n", (long long)step + 1,
                      o.steps, vl, o.val_batches);
            if (log) {
                fprintf(log, "{\"type\":\"val\",\"step\":%lld,\"val_loss\":%.9g}\n",
                        (long long)step + 1, vl);
                fflush(log);
            }
        }
        if ((o.save_every && (step + 1) % o.save_every == 0) || last) {
            st.step = step + 1;
            st.data = ff_data_tell(data);
            if ((rc = ff_ckpt_save(g, o.out, &st, (int)o.keep)))
                goto done;
            saved = st.step;
            memcpy(ck_prev, ck_last, sizeof ck_prev);
            ff_ckpt_path(ck_last, sizeof ck_last, o.out, "model", saved);
            cli_print("step %5lld/%ld | checkpoint %s\n", (long long)saved, o.steps, ck_last);
        }
    }
    if (log) {
        log_bytes(log, grid);
        fflush(log);
    }
    if (o.sample_tokens > 0) {
        ff_sampler smp = {0.8f, 40, (uint64_t)o.seed};
        cli_print("sample (%ld tokens, temperature %.1f, top-k %d):\n", o.sample_tokens,
                  smp.temperature, smp.top_k);
        rc = cli_generate(g, NULL, 0, o.sample_tokens, &smp, 1);
    }
done:
    if (rc)
        cli_error("%s", ff_ctx_error(ctx));
    if (log)
        fclose(log);
    free(tok);
    free(tgt);
    ff_data_close(data);
    ff_data_close(val);
    ff_gpt_destroy(g);
    return cli_teardown(&o.run, ctx, grid, rc ? CLI_FAIL : CLI_OK);
}
