/* fourfold plan: ranks every 4D grid of a rank count for a model, batch and
 * machine with the planner (include/fourfold/plan.h, docs/planner.md).
 *
 * Runs without MPI: main() does not initialise MPI for this command, so it
 * works from a plain shell. Started under mpirun anyway, only the process
 * whose launcher rank is 0 prints. */
#include "fourfold/plan.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "util/file.h" /* ff_file_writable */
#include "util/text.h"

static const char help[] =
    "usage: fourfold plan --model NAME [options]\n"
    "       fourfold plan --layers L --hidden C --heads NH [--vocab V] [options]\n\n"
    "Ranks every grid Gx x Gy x Gz x Gd of --ranks ranks by the predicted time of one\n"
    "training step (no MPI needed; docs/planner.md).\n\n"
    "model:\n"
    "  --model NAME         gpt-5b gpt-10b gpt-20b gpt-40b gpt-60b gpt-80b gpt-160b gpt-320b\n"
    "                       gpt-640b gpt2 gpt2-medium gpt2-large gpt2-xl tiny mini mini-moe\n"
    "  --layers N --hidden N --heads N --vocab N --positions N   (override or define)\n"
    "mixture of experts (docs/moe.md; full cost model, balanced routing assumed):\n"
    "  --experts E          E experts in every --expert-every K-th block (default 2)\n"
    "  --router-top-k K     1 (default) or 2 experts per token\n"
    "  --capacity-factor F  tokens per expert and sequence: ceil(F k T / E) (default 1.25)\n"
    "  --expert-parallel G  ranks of D that share the experts, or auto (default): every G\n"
    "                       dividing Gd and E, each grid once per G (shown as EP<G>)\n"
    "  --dtd on|off         duplicate token dropping (default on)\n"
    "training:\n"
    "  --batch N            global batch in sequences (default 8)\n"
    "  --seq N              tokens per sequence (default 1024)\n"
    "  --micro-batches N    per step, or auto: the fastest for each grid (default 1)\n"
    "  --panel-rows N       GEMM panel height the run forces (0: by shape, the default);\n"
    "                       decomposition cuts products at panel boundaries\n"
    "  --checkpoint M       activation checkpointing: on, off, auto (default auto: only\n"
    "                       where the step does not fit without it)\n"
    "  --ag-cache N         blocks whose gathered weights are kept for the recompute,\n"
    "                       or auto (default: as many as fit)\n"
    "  --wire W             fp32 or bf16 for weights, activations, gradients (default fp32)\n"
    "  --precision P        auto (default: the machine's, bf16-mixed on the GPU presets),\n"
    "                       fp32 (fourfold's own training) or bf16-mixed (bf16\n"
    "                       values and transfers, fp32 master weights and moments)\n"
    "  --overlap LIST       oar,ors,oag,dp, all or none (default all)\n"
    "  --cmm on|off         the collective matmul of unprefetched gathers (train --cmm)\n"
    "  --rs-cmm on|off      the reduce-scatter collective matmul of the weight gradients\n"
    "                       (train --rs-cmm; --per-layer chooses it per layer)\n"
    "  --progress M         how the run's collectives advance (train --progress): poll\n"
    "                       (default; with --plan, the plan's), thread or wait; decides\n"
    "                       when a decomposed all-reduce's chunks can overlap\n"
    "  --cac on|off         communication-aware checkpointing: no collective in a\n"
    "                       recompute (train --cac; default off)\n"
    "  --sparsity P         a pruned model: the fraction P of the blocks' weight matrices\n"
    "                       pruned, trained masked (train --mask; docs/samo.md)\n"
    "  --samo               with --sparsity: SAMO's compressed states (train --samo)\n"
    "  --zero 0|1|2         ZeRO over D (train --zero): AdamW's moments sharded over the\n"
    "                       data-parallel ranks (default 0)\n"
    "  --zero-gather overlap|blocking  ZeRO's gathers after AdamW beside the next\n"
    "                       forward, as the run does (default), or timed blocking\n";
/* (in two: C99 promises string literals of 4095 characters) */
static const char help_more[] =
    "pipeline stages (docs/pipeline.md):\n"
    "  --stages P           stages, each running a grid of ranks/P (default 1), or auto:\n"
    "                       every P that divides the ranks, ranked together\n"
    "  --schedule S         message (default) or 1f1b\n"
    "  --pipeline-limit K   micro-batches in flight per stage (default P)\n"
    "  --stage-layers A,B,.. blocks of each stage (default: as even as possible)\n"
    "machine:\n"
    "  --ranks N            ranks to plan for (default 1, or the product of --grid)\n"
    "  --machine M          perlmutter, frontier, alps, this, or a profile FILE.json\n"
    "                       (default this)\n"
    "  --ranks-per-node N   override the machine's\n"
    "  --memory SIZE        memory per rank, e.g. 40GiB (override the machine's)\n"
    "  --print-machine      print the machine profile as JSON and exit\n"
    "output:\n"
    "  --cost C             full (default), paper (dissertation eq. 5.1-5.7), axonn\n"
    "                       (AxoNN's tool), axonn-corrected (its transposed layers fixed)\n"
    "  --top N              grids to show (default 10)\n"
    "  --json               every grid, as JSON\n"
    "  --grid GxxGyxGzxGd   explain one grid in detail (axonn: Gr x Gc x Gd x Gdata;\n"
    "                       with --stages, one stage's grid)\n"
    "  --rejected           list the rejected grids and why (also --why-rejected)\n"
    "  --explain            the first grid in detail, with its time budget: compute by kind,\n"
    "                       each collective's exposed and hidden time, the bubble\n"
    "  --min-tp N           axonn: minimum Gr*Gc*Gd (default: the tool's value per model)\n"
    "  --grad-acc N         axonn: gradient accumulation steps (default 1)\n"
    "per-layer plans (full cost model; docs/planner.md, \"Per-layer plans\"):\n"
    "  --per-layer          search each block's checkpointing and each linear layer's\n"
    "                       decomposition, overlaps, AG cache and wire on --grid (default:\n"
    "                       the best grid of the ranking); print it and the gain\n"
    "  --search S           descent (coordinate descent, default) or mh (Metropolis-Hastings)\n"
    "  --seed N             mh's random draws (default 1)\n"
    "  --out FILE.json      write the plan there (atomically), for fourfold train --plan\n"
    "  --plan FILE.json     evaluate a plan on its grid (or --grid, which must be its own)\n"
    "                       and in its progress mode (or --progress)\n\n"
    "Environment: FF_PROFILE=file, the collective model a run reads, decides which\n"
    "all-reduces the collective layer runs as rec-whole, and so their bytes and time\n"
    "(full); without it, the built-in model (docs/planner.md).\n";

/* ---- formatting ---- */

static const char *fmt_time(char *buf, size_t len, double s)
{
    if (s <= 0)
        snprintf(buf, len, "0");
    else if (s >= 100)
        snprintf(buf, len, "%.0f s", s);
    else if (s >= 1)
        snprintf(buf, len, "%.2f s", s);
    else if (s >= 1e-3)
        snprintf(buf, len, "%.3g ms", s * 1e3);
    else
        snprintf(buf, len, "%.3g us", s * 1e6);
    return buf;
}

static const char *fmt_bytes(char *buf, size_t len, double b)
{
    const double K = 1024, M = K * K, G = M * K, T = G * K;
    if (b >= T)
        snprintf(buf, len, "%.2f TiB", b / T);
    else if (b >= G)
        snprintf(buf, len, "%.2f GiB", b / G);
    else if (b >= M)
        snprintf(buf, len, "%.1f MiB", b / M);
    else if (b >= K)
        snprintf(buf, len, "%.1f KiB", b / K);
    else
        snprintf(buf, len, "%.0f B", b);
    return buf;
}

static const char *fmt_flops(char *buf, size_t len, double f)
{
    if (f >= 1e12)
        snprintf(buf, len, "%.1f T", f / 1e12);
    else if (f >= 1e9)
        snprintf(buf, len, "%.1f G", f / 1e9);
    else
        snprintf(buf, len, "%.1f M", f / 1e6);
    return buf;
}

static const char *fmt_grid(char *buf, size_t len, ff_dims g)
{
    snprintf(buf, len, "%dx%dx%dx%d", g.x, g.y, g.z, g.d);
    return buf;
}

/* With stages or automatic micro-batches, a row is a grid, a number of
 * stages and of micro-batches. */
static int is_piped(const ff_plan_config *cfg)
{
    return cfg->stages != 1 || cfg->micro_batches == FF_PLAN_AUTO;
}

/* A row's configuration: the grid, with stages P<stages> M<micro-batches>,
 * with experts EP<expert parallelism>. */
static const char *fmt_config(char *buf, size_t len, const ff_plan_config *cfg,
                              const ff_plan_result *r)
{
    ff_dims g = r->grid;
    int n = snprintf(buf, len, "%dx%dx%dx%d", g.x, g.y, g.z, g.d);
    if (is_piped(cfg) && n > 0 && (size_t)n < len)
        n += snprintf(buf + n, len - (size_t)n, " P%d M%d", r->stages, r->micro_batches);
    if (cfg->model.experts && n > 0 && (size_t)n < len)
        snprintf(buf + n, len - (size_t)n, " EP%d", r->expert_parallel);
    return buf;
}

/* The width of fmt_config's column. */
static int config_width(const ff_plan_config *cfg)
{
    return (is_piped(cfg) ? 20 : 14) + (cfg->model.experts ? 5 : 0);
}

static void json_string(FILE *f, const char *s)
{
    ff_text t = {0};
    ff_text_json_string(&t, s, 0);
    fputs(t.failed ? "\"\"" : t.s, f);
    ff_text_free(&t);
}

/* ---- options ---- */

typedef struct {
    ff_plan_config cfg;
    const char *model_name, *machine, *grid, *overlap;
    long layers, hidden, heads, vocab, positions; /* -1: not given */
    long experts, expert_every, top_k;            /* -1: not given */
    double capacity;                              /* 0: not given */
    int have_ep;
    long ranks, rpn;
    size_t memory;
    int have_memory, top, json, rejected, print_machine, explain;
    /* per-layer plans */
    int per_layer, method, have_search; /* method: 0 descent, 1 mh */
    long seed;
    const char *out, *plan_file;
    char plan_grid[64]; /* --plan without --grid: the plan's */
    int progress_given; /* --progress given (else --plan takes the plan's) */
    const char *stage_layers;
    int stage_split[1024]; /* --stage-layers, parsed */
} plan_opts;

static int parse_on_off(const char *opt, const char *v, int *out)
{
    if (!strcmp(v, "on") || !strcmp(v, "1"))
        *out = 1;
    else if (!strcmp(v, "off") || !strcmp(v, "0"))
        *out = 0;
    else if (!strcmp(v, "auto"))
        *out = FF_PLAN_AUTO;
    else {
        cli_error("--%s %s: expected on, off or auto", opt, v);
        return -1;
    }
    return 0;
}

static int parse_overlap(const char *v, unsigned *out)
{
    if (!strcmp(v, "all")) {
        *out = FF_OVERLAP_ALL;
        return 0;
    }
    *out = 0;
    if (!strcmp(v, "none"))
        return 0;
    char buf[128];
    snprintf(buf, sizeof buf, "%s", v);
    for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok;
         tok = strtok_r(NULL, ",", &save)) {
        if (!strcmp(tok, "oar"))
            *out |= FF_OVERLAP_OAR;
        else if (!strcmp(tok, "ors"))
            *out |= FF_OVERLAP_ORS;
        else if (!strcmp(tok, "oag"))
            *out |= FF_OVERLAP_OAG;
        else if (!strcmp(tok, "dp"))
            *out |= FF_OVERLAP_DP;
        else {
            cli_error("--overlap %s: '%s' is not one of oar, ors, oag, dp, all, none", v, tok);
            return -1;
        }
    }
    return 0;
}

/* A positive count or "auto" (FF_PLAN_AUTO); 0, or -1 with the message
 * printed. */
static int parse_count_or_auto(const char *opt, const char *v, int *out)
{
    char *end;
    errno = 0;
    long n = strtol(v, &end, 10);
    if (!strcmp(v, "auto")) {
        *out = FF_PLAN_AUTO;
    } else if (errno || end == v || *end || n < 1 || n > (1L << 20)) {
        cli_error("--%s %s: expected a number from 1 to %ld, or auto", opt, v, 1L << 20);
        return -1;
    } else {
        *out = (int)n;
    }
    return 0;
}

/* Returns CLI_OK, or an exit code (the message is printed). */
static int parse_args(int argc, char **argv, plan_opts *o)
{
    cli_args a;
    cli_args_init(&a, argc, argv);
    const char *v;
    long n;
    while (cli_next(&a)) {
        struct {
            const char *name;
            long *dst, lo, hi;
        } ints[] = {
            {"layers", &o->layers, 1, 100000},
            {"hidden", &o->hidden, 1, 1L << 20},
            {"heads", &o->heads, 1, 1L << 20},
            {"vocab", &o->vocab, 1, 1L << 30},
            {"positions", &o->positions, 1, 1L << 24},
            {"ranks", &o->ranks, 1, 1L << 24},
            {"ranks-per-node", &o->rpn, 1, 1L << 20},
            {"experts", &o->experts, 0, 4096},
            {"expert-every", &o->expert_every, 1, 100000},
            {"router-top-k", &o->top_k, 1, 2},
        };
        int done = 0;
        for (size_t i = 0; i < sizeof ints / sizeof ints[0] && !done; i++)
            if (cli_is(&a, ints[i].name)) {
                if (!(v = cli_value(&a)) ||
                    cli_parse_int(ints[i].name, v, ints[i].lo, ints[i].hi, ints[i].dst))
                    return CLI_USAGE;
                done = 1;
            }
        if (done)
            continue;
        if (cli_is(&a, "help")) {
            cli_print("%s%s", help, help_more);
            return -1;
        } else if (cli_is(&a, "model")) {
            if (!(o->model_name = cli_value(&a)))
                return CLI_USAGE;
        } else if (cli_is(&a, "batch")) {
            if (!(v = cli_value(&a)) || cli_parse_int("batch", v, 1, 1L << 40, &n))
                return CLI_USAGE;
            o->cfg.batch = n;
        } else if (cli_is(&a, "seq")) {
            if (!(v = cli_value(&a)) || cli_parse_int("seq", v, 1, 1L << 24, &n))
                return CLI_USAGE;
            o->cfg.seq = n;
        } else if (cli_is(&a, "panel-rows")) {
            if (!(v = cli_value(&a)) || cli_parse_int("panel-rows", v, 0, 1L << 30, &n))
                return CLI_USAGE;
            o->cfg.panel_rows = n;
        } else if (cli_is(&a, "micro-batches") || cli_is(&a, "stages")) {
            int stages = cli_is(&a, "stages");
            if (!(v = cli_value(&a)) ||
                parse_count_or_auto(stages ? "stages" : "micro-batches", v,
                                    stages ? &o->cfg.stages : &o->cfg.micro_batches))
                return CLI_USAGE;
        } else if (cli_is(&a, "schedule")) {
            if (!(v = cli_value(&a)))
                return CLI_USAGE;
            if (!strcmp(v, "message") || !strcmp(v, "1f1b"))
                o->cfg.schedule = v[0] == '1';
            else {
                cli_error("--schedule %s: expected message or 1f1b", v);
                return CLI_USAGE;
            }
        } else if (cli_is(&a, "pipeline-limit")) {
            if (!(v = cli_value(&a)) || cli_parse_int("pipeline-limit", v, 1, 1L << 20, &n))
                return CLI_USAGE;
            o->cfg.pipe_limit = (int)n;
        } else if (cli_is(&a, "stage-layers")) {
            if (!(o->stage_layers = cli_value(&a)))
                return CLI_USAGE;
        } else if (cli_is(&a, "checkpoint")) {
            if (!(v = cli_value(&a)) || parse_on_off("checkpoint", v, &o->cfg.checkpoint))
                return CLI_USAGE;
        } else if (cli_is(&a, "precision")) {
            if (!(v = cli_value(&a)))
                return CLI_USAGE;
            if (!strcmp(v, "fp32") || !strcmp(v, "bf16-mixed") || !strcmp(v, "auto"))
                o->cfg.precision = v[0] == 'b'   ? FF_PLAN_BF16_MIXED
                                   : v[0] == 'a' ? FF_PLAN_AUTO
                                                 : FF_PLAN_FP32;
            else {
                cli_error("--precision %s: expected fp32, bf16-mixed or auto", v);
                return CLI_USAGE;
            }
        } else if (cli_is(&a, "sparsity")) {
            char *end;
            if (!(v = cli_value(&a)))
                return CLI_USAGE;
            o->cfg.sparsity = strtod(v, &end);
            if (end == v || *end || !(o->cfg.sparsity >= 0 && o->cfg.sparsity < 1)) {
                cli_error("--sparsity %s: expected 0 <= P < 1", v);
                return CLI_USAGE;
            }
        } else if (cli_is(&a, "samo")) {
            o->cfg.samo = 1;
        } else if (cli_is(&a, "zero")) {
            if (!(v = cli_value(&a)))
                return CLI_USAGE;
            if (strlen(v) != 1 || v[0] < '0' || v[0] > '2') {
                cli_error("--zero %s: expected 0, 1 or 2", v);
                return CLI_USAGE;
            }
            o->cfg.zero = v[0] - '0';
        } else if (cli_is(&a, "zero-gather")) {
            if (!(v = cli_value(&a)))
                return CLI_USAGE;
            if (strcmp(v, "overlap") && strcmp(v, "blocking")) {
                cli_error("--zero-gather %s: expected overlap or blocking", v);
                return CLI_USAGE;
            }
            o->cfg.zero_blocking = !strcmp(v, "blocking");
        } else if (cli_is(&a, "capacity-factor")) {
            char *end;
            if (!(v = cli_value(&a)))
                return CLI_USAGE;
            o->capacity = strtod(v, &end);
            if (end == v || *end || !(o->capacity > 0 && o->capacity <= 1e6)) {
                cli_error("--capacity-factor %s: expected a number above 0, at most 1e6", v);
                return CLI_USAGE;
            }
        } else if (cli_is(&a, "expert-parallel")) {
            if (!(v = cli_value(&a)) ||
                parse_count_or_auto("expert-parallel", v, &o->cfg.expert_parallel))
                return CLI_USAGE;
            o->have_ep = 1;
        } else if (cli_is(&a, "dtd") || cli_is(&a, "cac")) {
            const char *name = cli_is(&a, "dtd") ? "dtd" : "cac";
            int *dst = name[0] == 'd' ? &o->cfg.dtd : &o->cfg.cac;
            if (!(v = cli_value(&a)) || (strcmp(v, "on") && strcmp(v, "off"))) {
                if (v)
                    cli_error("--%s %s: expected on or off", name, v);
                return CLI_USAGE;
            }
            *dst = v[1] == 'n';
        } else if (cli_is(&a, "progress")) {
            if (!(v = cli_value(&a)))
                return CLI_USAGE;
            ff_progress_mode mode;
            if (cli_parse_progress(v, &mode))
                return CLI_USAGE;
            o->cfg.progress = mode;
            o->progress_given = 1;
        } else if (cli_is(&a, "cmm")) {
            if (!(v = cli_value(&a)) || (strcmp(v, "on") && strcmp(v, "off"))) {
                if (v)
                    cli_error("--cmm %s: expected on or off", v);
                return CLI_USAGE;
            }
            o->cfg.cmm = v[1] == 'n';
        } else if (cli_is(&a, "rs-cmm")) {
            if (!(v = cli_value(&a)) || (strcmp(v, "on") && strcmp(v, "off"))) {
                if (v)
                    cli_error("--rs-cmm %s: expected on or off", v);
                return CLI_USAGE;
            }
            o->cfg.rs_cmm = v[1] == 'n';
        } else if (cli_is(&a, "ag-cache")) {
            if (!(v = cli_value(&a)))
                return CLI_USAGE;
            if (!strcmp(v, "auto"))
                o->cfg.ag_cache = FF_PLAN_AUTO;
            else if (cli_parse_int("ag-cache", v, 0, 100000, &n))
                return CLI_USAGE;
            else
                o->cfg.ag_cache = (int)n;
        } else if (cli_is(&a, "wire")) {
            if (!(v = cli_value(&a)))
                return CLI_USAGE;
            if (!strcmp(v, "fp32"))
                o->cfg.wire_bytes = 4;
            else if (!strcmp(v, "bf16"))
                o->cfg.wire_bytes = 2;
            else {
                cli_error("--wire %s: expected fp32 or bf16", v);
                return CLI_USAGE;
            }
        } else if (cli_is(&a, "overlap")) {
            if (!(v = cli_value(&a)) || parse_overlap(v, &o->cfg.overlap))
                return CLI_USAGE;
        } else if (cli_is(&a, "machine")) {
            if (!(o->machine = cli_value(&a)))
                return CLI_USAGE;
        } else if (cli_is(&a, "memory")) {
            if (!(v = cli_value(&a)) || cli_parse_size("memory", v, &o->memory))
                return CLI_USAGE;
            if (o->memory == 0) {
                cli_error("--memory %s: must be positive", v);
                return CLI_USAGE;
            }
            o->have_memory = 1;
        } else if (cli_is(&a, "cost")) {
            if (!(v = cli_value(&a)))
                return CLI_USAGE;
            int c = ff_cost_parse(v);
            if (c < 0) {
                cli_error("--cost %s: expected full, paper, axonn or axonn-corrected", v);
                return CLI_USAGE;
            }
            o->cfg.cost = (ff_cost)c;
        } else if (cli_is(&a, "top")) {
            if (!(v = cli_value(&a)) || cli_parse_int("top", v, 1, 1L << 30, &n))
                return CLI_USAGE;
            o->top = (int)n;
        } else if (cli_is(&a, "min-tp")) {
            if (!(v = cli_value(&a)) || cli_parse_int("min-tp", v, 1, 1L << 24, &n))
                return CLI_USAGE;
            o->cfg.min_tp = (int)n;
        } else if (cli_is(&a, "grad-acc")) {
            if (!(v = cli_value(&a)) || cli_parse_int("grad-acc", v, 1, 1L << 20, &n))
                return CLI_USAGE;
            o->cfg.grad_acc = (int)n;
        } else if (cli_is(&a, "grid")) {
            if (!(o->grid = cli_value(&a)))
                return CLI_USAGE;
        } else if (cli_is(&a, "json")) {
            o->json = 1;
        } else if (cli_is(&a, "rejected") || cli_is(&a, "why-rejected")) {
            o->rejected = 1;
        } else if (cli_is(&a, "explain")) {
            o->explain = 1;
        } else if (cli_is(&a, "print-machine")) {
            o->print_machine = 1;
        } else if (cli_is(&a, "per-layer")) {
            o->per_layer = 1;
        } else if (cli_is(&a, "search")) {
            if (!(v = cli_value(&a)))
                return CLI_USAGE;
            if (!strcmp(v, "descent"))
                o->method = 0;
            else if (!strcmp(v, "mh"))
                o->method = 1;
            else {
                cli_error("--search %s: expected descent or mh", v);
                return CLI_USAGE;
            }
            o->have_search = 1;
        } else if (cli_is(&a, "seed")) {
            if (!(v = cli_value(&a)) || cli_parse_int("seed", v, 0, 2147483647L, &o->seed))
                return CLI_USAGE;
        } else if (cli_is(&a, "out")) {
            if (!(o->out = cli_value(&a)))
                return CLI_USAGE;
        } else if (cli_is(&a, "plan")) {
            if (!(o->plan_file = cli_value(&a)))
                return CLI_USAGE;
        } else {
            return cli_unknown(&a, "plan");
        }
    }
    if (o->stage_layers) {
        if (o->cfg.stages == FF_PLAN_AUTO) {
            cli_error("--stage-layers needs a number of --stages, not auto");
            return CLI_USAGE;
        }
        if (cli_parse_stage_layers(o->stage_layers, o->cfg.stages, o->stage_split,
                                   (int)(sizeof o->stage_split / sizeof o->stage_split[0])))
            return CLI_USAGE;
        o->cfg.stage_layers = o->stage_split;
    }
    return CLI_OK;
}

static int ends_with(const char *s, const char *suffix)
{
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && !strcmp(s + n - k, suffix);
}

/* Fills cfg.model and cfg.machine from the options. */
static int resolve(plan_opts *o)
{
    char err[512];
    ff_plan_config *cfg = &o->cfg;
    if (o->model_name) {
        if (ff_model_preset(o->model_name, &cfg->model, err, sizeof err) != FF_OK) {
            cli_error("--model: %s", err);
            return CLI_USAGE;
        }
    } else if (o->layers < 0 || o->hidden < 0 || o->heads < 0) {
        if (!o->print_machine) {
            cli_error("fourfold plan needs --model NAME, or --layers, --hidden and --heads "
                      "(see fourfold plan --help)");
            return CLI_USAGE;
        }
    } else {
        snprintf(cfg->model.name, sizeof cfg->model.name, "custom");
        cfg->model.vocab = 50257;
    }
    if (o->layers >= 0)
        cfg->model.layers = (int)o->layers;
    if (o->hidden >= 0)
        cfg->model.hidden = o->hidden;
    if (o->heads >= 0)
        cfg->model.heads = (int)o->heads;
    if (o->vocab >= 0)
        cfg->model.vocab = o->vocab;
    if (o->positions >= 0)
        cfg->model.max_seq = o->positions;
    if (cfg->model.kind == FF_MODEL_UNET &&
        (o->layers >= 0 || o->hidden >= 0 || o->heads >= 0 || o->vocab >= 0 || o->positions >= 0 ||
         o->experts >= 0)) {
        cli_error("--layers, --hidden, --heads, --vocab, --positions and --experts describe a "
                  "GPT, not the U-Net %s",
                  cfg->model.name);
        return CLI_USAGE;
    }
    if (o->model_name && (o->layers >= 0 || o->hidden >= 0 || o->heads >= 0 || o->vocab >= 0))
        snprintf(cfg->model.name, sizeof cfg->model.name, "%.20s*", o->model_name);
    /* experts: the preset's, or --experts with the training program's
     * defaults, then the routing options */
    ff_model *md = &cfg->model;
    if (o->experts > 0 && !md->experts)
        ff_model_moe(md, (int)o->experts);
    else if (o->experts >= 0)
        md->experts = (int)o->experts;
    if (!md->experts && (o->expert_every > 0 || o->top_k > 0 || o->capacity > 0 || o->have_ep)) {
        cli_error("--expert-every, --router-top-k, --capacity-factor and --expert-parallel need a "
                  "model with experts (--experts E or --model mini-moe)");
        return CLI_USAGE;
    }
    if (o->expert_every > 0)
        md->expert_every = (int)o->expert_every;
    if (o->top_k > 0)
        md->top_k = (int)o->top_k;
    if (o->capacity > 0)
        md->capacity_factor = o->capacity;
    if (md->experts && !o->have_ep)
        cfg->expert_parallel = FF_PLAN_AUTO;

    const char *m = o->machine ? o->machine : "this";
    int rc = (ends_with(m, ".json") || strchr(m, '/'))
                 ? ff_profile_load(m, &cfg->machine, err, sizeof err)
                 : ff_profile_preset(m, &cfg->machine, err, sizeof err);
    if (rc != FF_OK) {
        cli_error("--machine: %s", err);
        return rc == FF_EINVAL && !strchr(m, '/') && !ends_with(m, ".json") ? CLI_USAGE : CLI_FAIL;
    }
    if (o->rpn > 0)
        cfg->machine.ranks_per_node = (int)o->rpn;
    /* AUTO's choice of all-reduce decides bytes: the run's model */
    if (cli_coll_model(&cfg->coll, err, sizeof err) != FF_OK) {
        cli_error("%s", err);
        return CLI_FAIL;
    }
    if (o->have_memory)
        cfg->machine.memory_bytes = (double)o->memory;
    return CLI_OK;
}

/* "2x2x4x8" alone (no preset): its four sizes. */
static int explicit_grid(const char *spec, ff_dims *g)
{
    long v[4];
    const char *p = spec;
    for (int i = 0; i < 4; i++) {
        char *end;
        v[i] = strtol(p, &end, 10);
        if (end == p || v[i] < 1 || v[i] > (1L << 24))
            return -1;
        p = end;
        if (i < 3) {
            if (*p != 'x' && *p != 'X')
                return -1;
            p++;
        }
    }
    if (*p || (double)v[0] * v[1] * v[2] * v[3] > (double)(1L << 24))
        return -1;
    *g = (ff_dims){(int)v[0], (int)v[1], (int)v[2], (int)v[3]};
    return 0;
}

/* ---- output ---- */

static void print_header(const ff_plan_config *cfg, size_t grids, size_t accepted)
{
    const ff_model *md = &cfg->model;
    const ff_profile *p = &cfg->machine;
    char b1[32], b2[32], b3[32];
    const ff_unet_config *u = &md->unet;
    if (md->kind == FF_MODEL_UNET) {
        char mult[64] = "";
        size_t used = 0;
        for (int i = 0; i < u->levels && used < sizeof mult; i++)
            used +=
                (size_t)snprintf(mult + used, sizeof mult - used, "%s%d", i ? "," : "", u->mult[i]);
        char att[128] = "none";
        used = 0;
        if (u->attn_head_channels)
            used = (size_t)snprintf(att, sizeof att, "in the middle");
        for (int i = 0, n = 0; u->attn_head_channels && i < u->levels && used < sizeof att; i++)
            if ((u->attn_levels >> i) & 1)
                used += (size_t)snprintf(att + used, sizeof att - used, "%s%lldx%lld",
                                         n++ ? ", " : " and at ", (long long)u->image_size >> i,
                                         (long long)u->image_size >> i);
        cli_print("model %s: a U-Net of %lldx%lld images, %d channels x %s, %d blocks per level, "
                  "GroupNorm of %d channels, attention %s; %.4g parameters\n",
                  md->name, (long long)u->image_size, (long long)u->image_size, u->base, mult,
                  u->nres, u->group_channels, att, (double)ff_model_params(md, cfg->seq));
    } else {
        cli_print("model %s: L=%d C=%lld NH=%d V=%lld (padded %lld), %.3g parameters\n", md->name,
                  md->layers, (long long)md->hidden, md->heads, (long long)md->vocab,
                  (long long)ff_model_padded_vocab(md), (double)ff_model_params(md, cfg->seq));
    }
    if (md->experts) {
        char ge[16];
        snprintf(ge, sizeof ge, cfg->expert_parallel == FF_PLAN_AUTO ? "auto" : "%d",
                 cfg->expert_parallel);
        cli_print("experts: %d in every %d%s block, top-%d, capacity factor %g; expert "
                  "parallelism %s, DTD %s, CAC %s; balanced routing assumed\n",
                  md->experts, md->expert_every,
                  md->expert_every == 1   ? ""
                  : md->expert_every == 2 ? "nd"
                  : md->expert_every == 3 ? "rd"
                                          : "th",
                  md->top_k, md->capacity_factor, ge, cfg->dtd ? "on" : "off",
                  cfg->cac ? "on" : "off");
    } else if (cfg->cac) {
        cli_print("communication-aware checkpointing (CAC): no collective in a recompute\n");
    }
    if (cfg->sparsity > 0)
        cli_print("pruned: %g of the blocks' weight matrices, trained %s (docs/samo.md)\n",
                  cfg->sparsity,
                  cfg->samo ? "with SAMO: their gradients and moments compressed"
                            : "masked: dense state, a mask, packed data-parallel all-reduces");
    if (cfg->zero)
        cli_print("ZeRO %d over D: AdamW's moments%s sharded over the data-parallel ranks\n",
                  cfg->zero,
                  cfg->zero == 2 ? " and, after their reduce-scatter, the gradients" : "");
    if (cfg->zero && cfg->zero_blocking)
        cli_print("ZeRO's gathers after AdamW timed blocking (--zero-gather blocking)\n");
    char mb[48];
    if (cfg->micro_batches == FF_PLAN_AUTO)
        snprintf(mb, sizeof mb, "micro-batches the fastest per grid");
    else
        snprintf(mb, sizeof mb, "%d micro-batch%s", cfg->micro_batches,
                 cfg->micro_batches > 1 ? "es" : "");
    if (md->kind == FF_MODEL_UNET)
        cli_print("batch %lld images, %s; %d ranks, %d per node; fp32\n", (long long)cfg->batch, mb,
                  cfg->ranks, p->ranks_per_node);
    else
        cli_print("batch %lld sequences x %lld tokens, %s; %d ranks, %d per node; %s\n",
                  (long long)cfg->batch, (long long)cfg->seq, mb, cfg->ranks, p->ranks_per_node,
                  ff_plan_precision(cfg) == FF_PLAN_BF16_MIXED ? "bf16-mixed precision" : "fp32");
    if (cfg->stages != 1) {
        if (cfg->stages == FF_PLAN_AUTO)
            snprintf(mb, sizeof mb, "every number of stages");
        else
            snprintf(mb, sizeof mb, "%d stages of %d ranks", cfg->stages, cfg->ranks / cfg->stages);
        char lim[32];
        snprintf(lim, sizeof lim, cfg->pipe_limit ? "%d" : "P", cfg->pipe_limit);
        cli_print("pipeline: %s, %s schedule, at most %s micro-batches in flight per stage\n", mb,
                  cfg->schedule ? "1F1B" : "message-driven", lim);
    }
    cli_print("machine %s: %s per rank, GEMM %sFLOP/s, peak %sFLOP/s, links %.3g GB/s in a node, "
              "%.3g GB/s out of one\n",
              p->name, fmt_bytes(b1, sizeof b1, p->memory_bytes),
              fmt_flops(b2, sizeof b2, p->gemm_flops), fmt_flops(b3, sizeof b3, p->peak_flops),
              p->beta_intra_Bps / 1e9, p->beta_inter_Bps / 1e9);
    const char *coll = getenv("FF_PROFILE");
    if (cfg->cost == FF_COST_FULL)
        cli_print("collectives: AUTO's choices under %s%s\n",
                  coll && *coll ? "FF_PROFILE=" : "the default collective model",
                  coll && *coll ? coll : "");
    if ((cfg->cost == FF_COST_AXONN || cfg->cost == FF_COST_AXONN_CORRECTED) && grids)
        cli_print("cost model %s: AxoNN's search space (powers of two, Gr*Gc*Gd >= %d): %zu "
                  "grids, %zu accepted; bandwidths %s\n",
                  ff_cost_name(cfg->cost),
                  cfg->min_tp > 0 ? cfg->min_tp : ff_model_axonn_min_tp(md), grids, accepted,
                  p->axonn_table ? "from the tool's table"
                                 : "from the profile (the tool has "
                                   "no table for this machine)");
    else if (grids)
        cli_print("cost model %s: %zu grids %s %d ranks, %zu fit, %zu rejected%s\n",
                  ff_cost_name(cfg->cost), grids, cfg->stages == 1 ? "of" : "of the stages of",
                  cfg->ranks, accepted, grids - accepted,
                  grids > accepted ? " (--rejected says why)" : "");
    else
        cli_print("cost model %s\n", ff_cost_name(cfg->cost));
}

static void print_table(const ff_plan *plan, int top)
{
    const ff_plan_config *cfg = ff_plan_config_of(plan);
    size_t shown = ff_plan_accepted(plan) < (size_t)top ? ff_plan_accepted(plan) : (size_t)top;
    char g[96], t[12][24];
    if (shown == 0) {
        cli_print("\nno grid fits%s\n", ff_plan_count(plan) ? " (--rejected says why)" : "");
        return;
    }
    cli_print("\n");
    const int piped = is_piped(cfg);
    if (cfg->cost == FF_COST_FULL) {
        cli_print("%4s %-*s %9s %9s %9s %9s%s | %8s %8s %8s %8s %8s %8s | %10s %10s %5s %8s "
                  "%6s\n",
                  "rank", config_width(cfg),
                  piped ? (cfg->model.experts ? "grid stages micro EP" : "grid stages micro")
                        : (cfg->model.experts ? "grid EP" : "grid"),
                  "step", "compute", "exposed", "hidden", piped ? "    bubble" : "", "AR X", "AR Y",
                  "AG Z", "RS Z", "AR D", "other", "recv/rank", "mem/rank", "ckpt", "FLOP/s",
                  "%peak");
        for (size_t i = 0; i < shown; i++) {
            const ff_plan_result *r = ff_plan_get(plan, i);
            double other = 0;
            for (int k = 0; k < FF_PLAN_NGROUPS; k++)
                for (int c = 0; c < FF_NCOLL; c++)
                    other += r->coll[k][c].time_s;
            double arx = r->coll[FF_GROUP_X][FF_COLL_ALLREDUCE].time_s;
            double ary = r->coll[FF_GROUP_Y][FF_COLL_ALLREDUCE].time_s;
            double agz = r->coll[FF_GROUP_Z][FF_COLL_ALLGATHER].time_s;
            double rsz = r->coll[FF_GROUP_Z][FF_COLL_REDUCE_SCATTER].time_s;
            double ard = r->coll[FF_GROUP_D][FF_COLL_ALLREDUCE].time_s;
            other -= arx + ary + agz + rsz + ard;
            char ck[16], fl[24];
            if (r->checkpoint)
                snprintf(ck, sizeof ck, "c%d", r->ag_cache);
            else
                snprintf(ck, sizeof ck, "off");
            char bubble[32] = "";
            if (piped)
                snprintf(bubble, sizeof bubble, " %9s", fmt_time(t[4], 24, r->bubble_s));
            cli_print("%4zu %-*s %9s %9s %9s %9s%s | %8s %8s %8s %8s %8s %8s | %10s %10s %5s %8s "
                      "%5.1f%%\n",
                      i + 1, config_width(cfg), fmt_config(g, sizeof g, cfg, r),
                      fmt_time(t[0], 24, r->step_s), fmt_time(t[1], 24, r->compute_s),
                      fmt_time(t[2], 24, r->exposed_s), fmt_time(t[3], 24, r->hidden_s), bubble,
                      fmt_time(t[4], 24, arx), fmt_time(t[5], 24, ary), fmt_time(t[6], 24, agz),
                      fmt_time(t[7], 24, rsz), fmt_time(t[8], 24, ard),
                      fmt_time(t[9], 24, other > 0 ? other : 0),
                      fmt_bytes(t[10], 24, (double)r->bytes_recv),
                      fmt_bytes(t[11], 24, r->mem_total), ck,
                      fmt_flops(fl, sizeof fl, r->flops_per_rank_s), 100 * r->peak_fraction);
        }
        cli_print("\nstep = compute + exposed communication; hidden = communication beside "
                  "compute (OAR/ORS/OAG/DP).\nAR X ... other: time of each collective kind "
                  "per step; ckpt: off, or c<N> = checkpointing with\nN blocks' gathered "
                  "weights cached; FLOP/s: model FLOP/s per rank (%s).\n",
                  cfg->model.kind == FF_MODEL_UNET ? "the U-Net's products, forward and backward"
                                                   : "6 N tokens + 6 L B T^2 C");
        if (piped)
            cli_print("With stages: grid is one stage's, then P<stages> M<micro-batches>; "
                      "compute ... other are the\nbusiest stage's, and bubble is the time it "
                      "waits for the other stages' messages.\n");
    } else if (cfg->cost == FF_COST_PAPER) {
        cli_print("%4s %-14s %10s | %9s %9s %9s %9s %9s | %10s\n", "rank", "grid", "comm",
                  "AG Z 5.1", "RS Z 5.2", "AR Y", "AR X", "AR D 5.5", "mem/rank");
        for (size_t i = 0; i < shown; i++) {
            const ff_plan_result *r = ff_plan_get(plan, i);
            char mem[24];
            cli_print("%4zu %-14s %10s | %9s %9s %9s %9s %9s | %10s\n", i + 1,
                      fmt_grid(g, sizeof g, r->grid), fmt_time(t[0], 24, r->step_s),
                      fmt_time(t[1], 24, r->coll[FF_GROUP_Z][FF_COLL_ALLGATHER].time_s),
                      fmt_time(t[2], 24, r->coll[FF_GROUP_Z][FF_COLL_REDUCE_SCATTER].time_s),
                      fmt_time(t[3], 24, r->coll[FF_GROUP_Y][FF_COLL_ALLREDUCE].time_s),
                      fmt_time(t[4], 24, r->coll[FF_GROUP_X][FF_COLL_ALLREDUCE].time_s),
                      fmt_time(t[5], 24, r->coll[FF_GROUP_D][FF_COLL_ALLREDUCE].time_s),
                      fmt_bytes(mem, sizeof mem, r->mem_total));
        }
        cli_print("\ncommunication time of equations 5.1-5.5 summed over the four linear layers "
                  "of every block\n(5.3 and 5.4 booked on the group that carries them: Y and X "
                  "swap in transposed layers).\n");
    } else {
        cli_print("%4s %4s %4s %4s %6s %14s | %10s %10s %10s %10s\n", "rank", "Gr", "Gc", "Gd",
                  "Gdata", "Comm-Time(s)", "col (Gc)", "row (Gr)", "depth (Gd)", "data");
        for (size_t i = 0; i < shown; i++) {
            const ff_plan_result *r = ff_plan_get(plan, i);
            cli_print("%4zu %4d %4d %4d %6d %14.6g | %10.4g %10.4g %10.4g %10.4g\n", i + 1,
                      r->grid.x, r->grid.y, r->grid.z, r->grid.d, r->step_s, r->axonn_col_s,
                      r->axonn_row_s, r->axonn_depth_s, r->axonn_data_s);
        }
        cli_print("\nthe tool's unit: GiB over GB/s, summed over the four layers times L. Its "
                  "Gc is fourfold's Y,\nGr its X, Gd its Z, Gdata its D, but nested Gc "
                  "innermost (docs/planner.md).\n");
    }
}

static void print_rejected(const ff_plan *plan)
{
    size_t n = ff_plan_count(plan), a = ff_plan_accepted(plan);
    const ff_plan_config *cfg = ff_plan_config_of(plan);
    char g[96];
    cli_print("\nrejected grids (%zu):\n", n - a);
    for (size_t i = a; i < n; i++) {
        const ff_plan_result *r = ff_plan_get(plan, i);
        cli_print("  %-*s %s\n", config_width(cfg), fmt_config(g, sizeof g, cfg, r), r->reason);
    }
}

static const char *const coll_names[FF_NCOLL] = {"all-gather", "reduce-scatter", "all-reduce",
                                                 "all-to-all"};

static void print_detail(const ff_plan_config *cfg, const ff_plan_result *r)
{
    char g[48], t[6][24];
    int ranks = r->grid.x * r->grid.y * r->grid.z * r->grid.d;
    int axonn = cfg->cost == FF_COST_AXONN || cfg->cost == FF_COST_AXONN_CORRECTED;
    cli_print("\ngrid %s: ", fmt_grid(g, sizeof g, r->grid));
    if (axonn)
        cli_print("Gr=%d Gc=%d Gd=%d Gdata=%d (AxoNN's terms), %d ranks\n", r->grid.x, r->grid.y,
                  r->grid.z, r->grid.d, ranks);
    else
        cli_print("Gx=%d Gy=%d Gz=%d Gd=%d, %d ranks%s", r->grid.x, r->grid.y, r->grid.z, r->grid.d,
                  ranks, cfg->model.experts ? "" : "\n");
    if (!axonn && cfg->model.experts)
        cli_print(", expert parallelism %d (%d expert%s per rank)\n", r->expert_parallel,
                  cfg->model.experts / r->expert_parallel,
                  cfg->model.experts / r->expert_parallel == 1 ? "" : "s");
    if (r->rejected) {
        cli_print("rejected: %s\n", r->reason);
        return;
    }
    if (axonn) {
        cli_print("  Comm-Time(s) %.6g = col %.6g + row %.6g + depth %.6g + data %.6g\n", r->step_s,
                  r->axonn_col_s, r->axonn_row_s, r->axonn_depth_s, r->axonn_data_s);
        cli_print(
            "  bandwidths (GB/s): Gc %g, Gr %g, Gd %g, Gdata %g\n",
            r->grid.y > 1 ? ff_plan_axonn_bandwidth(&cfg->machine, 1, r->grid.y) : 0.0,
            r->grid.x > 1 ? ff_plan_axonn_bandwidth(&cfg->machine, r->grid.y, r->grid.x) : 0.0,
            r->grid.z > 1 ? ff_plan_axonn_bandwidth(&cfg->machine, r->grid.y * r->grid.x, r->grid.z)
                          : 0.0,
            r->grid.d > 1 ? ff_plan_axonn_bandwidth(&cfg->machine,
                                                    r->grid.y * r->grid.x * r->grid.z, r->grid.d)
                          : 0.0);
        return;
    }
    if (cfg->model.kind == FF_MODEL_UNET)
        cli_print("per rank: %lld images; AG cache %d layers; no activation checkpointing\n",
                  (long long)(cfg->batch / ((int64_t)r->grid.z * r->grid.d)), r->ag_cache);
    int64_t rows = cfg->batch / ((int64_t)r->grid.z * r->grid.d) * cfg->seq;
    if (cfg->model.kind != FF_MODEL_UNET) {
        cli_print("per rank: %lld sequences x %lld tokens = %lld rows; ",
                  (long long)(cfg->batch / ((int64_t)r->grid.z * r->grid.d)), (long long)cfg->seq,
                  (long long)rows);
        if (r->stages > 1 || cfg->micro_batches == FF_PLAN_AUTO)
            cli_print("%d micro-batches; ", r->micro_batches);
        if (cfg->layers) {
            int ckpt = 0, cached = cfg->layers->head.ag_cache;
            for (int l = 0; l < cfg->layers->layers; l++) {
                ckpt += cfg->layers->blocks[l].checkpoint;
                for (int i = 0; i < FF_BLOCK_LAYERS; i++)
                    cached += cfg->layers->blocks[l].layer[i].ag_cache;
            }
            cli_print("per-layer plan: activation checkpointing in %d of %d blocks, AG cache %d of "
                      "%d layers\n",
                      ckpt, cfg->model.layers, cached, 4 * cfg->model.layers + 1);
        } else if (r->checkpoint) {
            cli_print("activation checkpointing, AG cache %d of %d blocks\n", r->ag_cache,
                      cfg->model.layers);
        } else {
            cli_print("no activation checkpointing\n");
        }
    }
    cli_print("\n  group  size  inner  placement      alpha      bandwidth\n");
    for (int k = 0; k < FF_PLAN_NGROUPS; k++) {
        const ff_plan_link *l = &r->link[k];
        if (k == FF_GROUP_STAGE || (k == FF_GROUP_PIPE && r->stages <= 1) ||
            (k >= FF_NGROUPS && !cfg->model.experts))
            continue; /* a stage's ranks: no collective of the step */
        if (l->size == 1) {
            cli_print("  %-5s %5d %6lld  -\n", ff_plan_group_name(k), l->size, (long long)l->inner);
            continue;
        }
        cli_print("  %-5s %5d %6lld  %-13s %6s %10.3g GB/s\n", ff_plan_group_name(k), l->size,
                  (long long)l->inner, l->intra ? "inside a node" : "across nodes",
                  fmt_time(t[0], 24, l->alpha_s), l->beta_Bps / 1e9);
    }
    if (r->stages > 1)
        cli_print("\n  pipeline: %d stages of %d ranks (%d in all), %s schedule, %d micro-batches "
                  "in flight per stage;\n  one activation message between stages %s; the "
                  "busiest stage is stage %d\n",
                  r->stages, ranks, ranks * r->stages, cfg->schedule ? "1F1B" : "message-driven",
                  cfg->pipe_limit ? cfg->pipe_limit : r->stages, fmt_time(t[0], 24, r->p2p_s),
                  r->busiest_stage);
    if (cfg->cost == FF_COST_PAPER) {
        cli_print("\n  communication %s (equations 5.1-5.5 over every layer)\n",
                  fmt_time(t[0], 24, r->step_s));
    } else {
        cli_print("\n  step %s = compute %s + exposed communication %s "
                  "(hidden beside compute: %s)\n",
                  fmt_time(t[0], 24, r->step_s), fmt_time(t[1], 24, r->compute_s),
                  fmt_time(t[2], 24, r->exposed_s), fmt_time(t[3], 24, r->hidden_s));
        if (r->stages > 1)
            cli_print("  (those of the busiest stage) + its wait for the other stages (the "
                      "bubble) %s\n",
                      fmt_time(t[0], 24, r->bubble_s));
        cli_print("  compute: GEMM %s, attention %s, elementwise %s, optimizer %s\n",
                  fmt_time(t[0], 24, r->gemm_s), fmt_time(t[1], 24, r->attention_s),
                  fmt_time(t[2], 24, r->elementwise_s), fmt_time(t[3], 24, r->optimizer_s));
    }
    cli_print(
        "\n  collectives of rank 0 per step    calls         sent     received        time%s\n",
        r->stages > 1 ? " (on the busiest stage)" : "");
    for (int k = 0; k < FF_PLAN_NGROUPS; k++)
        for (int c = 0; c < FF_NCOLL; c++) {
            const ff_plan_coll *pc = &r->coll[k][c];
            if (!pc->calls && pc->time_s <= 0)
                continue;
            char s1[24], s2[24];
            cli_print(
                "  %-5s %-24s %8llu %12s %12s %11s\n", ff_plan_group_name(k), coll_names[c],
                (unsigned long long)pc->calls, fmt_bytes(s1, sizeof s1, (double)pc->bytes_sent),
                fmt_bytes(s2, sizeof s2, (double)pc->bytes_recv), fmt_time(t[0], 24, pc->time_s));
        }
    if (r->p2p.calls) {
        char s1[24], s2[24];
        cli_print("  %-5s %-24s %8llu %12s %12s\n", "PIPE", "point-to-point",
                  (unsigned long long)r->p2p.calls,
                  fmt_bytes(s1, sizeof s1, (double)r->p2p.bytes_sent),
                  fmt_bytes(s2, sizeof s2, (double)r->p2p.bytes_recv));
    }
    cli_print("\n  memory per rank%s %s of %s: parameters %s, gradients %s, AdamW moments %s,\n"
              "  gathered weights and gradients %s, activations %s\n",
              r->stages > 1 ? " (the largest stage)" : "", fmt_bytes(t[0], 24, r->mem_total),
              fmt_bytes(t[1], 24, cfg->machine.memory_bytes), fmt_bytes(t[2], 24, r->mem_params),
              fmt_bytes(t[3], 24, r->mem_grads), fmt_bytes(t[4], 24, r->mem_optimizer),
              fmt_bytes(t[5], 24, r->mem_weight_buffers),
              fmt_bytes(g, sizeof g, r->mem_activations));
    if (r->mem_mask > 0)
        cli_print("  %s %s\n",
                  cfg->samo ? "SAMO's offsets of the kept weights"
                            : "the mask and the packed all-reduces' offsets and values",
                  fmt_bytes(t[0], 24, r->mem_mask));
    if (cfg->cost == FF_COST_FULL)
        cli_print("\n  model FLOPs per step (%s) %.4g; per rank %sFLOP/s, "
                  "%.1f%% of the peak %sFLOP/s\n",
                  cfg->model.kind == FF_MODEL_UNET ? "the U-Net's products"
                                                   : "6 N tokens + 6 L B T^2 C",
                  r->model_flops, fmt_flops(t[0], 24, r->flops_per_rank_s), 100 * r->peak_fraction,
                  fmt_flops(t[1], 24, cfg->machine.peak_flops));
}

/* The time budget of a step (full cost model): every part, summing to the
 * step (for the busiest stage with stages). */
static void print_budget(const ff_plan_result *r)
{
    char t[2][24];
    double step = r->step_s > 0 ? r->step_s : 1;
    cli_print("\n  time budget of a step%s        time   of step\n",
              r->stages > 1 ? " (busiest stage)" : "");
    const struct {
        const char *name;
        double s;
    } parts[] = {{"GEMM", r->gemm_s},
                 {"attention", r->attention_s},
                 {"elementwise", r->elementwise_s},
                 {"optimizer", r->optimizer_s}};
    for (size_t i = 0; i < sizeof parts / sizeof parts[0]; i++)
        cli_print("  %-34s %10s %7.1f%%\n", parts[i].name, fmt_time(t[0], 24, parts[i].s),
                  100 * parts[i].s / step);
    double booked = 0;
    for (int k = 0; k < FF_PLAN_NGROUPS; k++)
        for (int c = 0; c < FF_NCOLL; c++) {
            const ff_plan_coll *pc = &r->coll[k][c];
            if (pc->time_s <= 0)
                continue;
            char name[64];
            snprintf(name, sizeof name, "%s %s exposed", ff_plan_group_name(k),
                     ff_coll_name((ff_coll)c));
            cli_print("  %-34s %10s %7.1f%%   (hidden %s)\n", name,
                      fmt_time(t[0], 24, pc->exposed_s), 100 * pc->exposed_s / step,
                      fmt_time(t[1], 24, pc->time_s - pc->exposed_s));
            booked += pc->exposed_s;
        }
    double rest = r->exposed_s - booked; /* with stages: message copies, the wte exchange */
    if (rest > 1e-9 * step)
        cli_print("  %-34s %10s %7.1f%%\n", "point-to-point messages", fmt_time(t[0], 24, rest),
                  100 * rest / step);
    if (r->stages > 1)
        cli_print("  %-34s %10s %7.1f%%\n", "bubble (waiting for other stages)",
                  fmt_time(t[0], 24, r->bubble_s), 100 * r->bubble_s / step);
    cli_print("  %-34s %10s %7.1f%%\n", "step", fmt_time(t[0], 24, r->step_s), 100.0);
}

static void print_json_result(FILE *f, const ff_plan_config *cfg, const ff_plan_result *r)
{
    char g[48];
    fprintf(f, "{\"grid\": \"%s\", ", fmt_grid(g, sizeof g, r->grid));
    if (cfg->cost == FF_COST_AXONN || cfg->cost == FF_COST_AXONN_CORRECTED)
        fprintf(f, "\"Gr\": %d, \"Gc\": %d, \"Gd\": %d, \"Gdata\": %d, ", r->grid.x, r->grid.y,
                r->grid.z, r->grid.d);
    else
        fprintf(f, "\"gx\": %d, \"gy\": %d, \"gz\": %d, \"gd\": %d, ", r->grid.x, r->grid.y,
                r->grid.z, r->grid.d);
    fprintf(f, "\"rejected\": %s, \"reason\": ", r->rejected ? "true" : "false");
    json_string(f, r->reason);
    fprintf(f,
            ", \"checkpoint\": %s, \"ag_cache\": %d, \"step_s\": %.9g, \"compute_s\": %.9g, "
            "\"exposed_s\": %.9g, \"hidden_s\": %.9g, \"comm_s\": %.9g, \"gemm_s\": %.9g, "
            "\"attention_s\": %.9g, \"elementwise_s\": %.9g, \"optimizer_s\": %.9g, "
            "\"bytes_recv\": %llu, ",
            r->checkpoint ? "true" : "false", r->ag_cache, r->step_s, r->compute_s, r->exposed_s,
            r->hidden_s, r->comm_s, r->gemm_s, r->attention_s, r->elementwise_s, r->optimizer_s,
            (unsigned long long)r->bytes_recv);
    fprintf(f,
            "\"memory\": {\"params\": %.6g, \"grads\": %.6g, \"optimizer\": %.6g, "
            "\"weight_buffers\": %.6g, \"activations\": %.6g, \"mask\": %.6g, \"total\": %.6g}, ",
            r->mem_params, r->mem_grads, r->mem_optimizer, r->mem_weight_buffers,
            r->mem_activations, r->mem_mask, r->mem_total);
    fprintf(f, "\"model_flops\": %.6g, \"flops_per_rank_s\": %.6g, \"peak_fraction\": %.6g, ",
            r->model_flops, r->flops_per_rank_s, r->peak_fraction);
    fprintf(f,
            "\"axonn\": {\"col_s\": %.9g, \"row_s\": %.9g, \"depth_s\": %.9g, \"data_s\": %.9g}, ",
            r->axonn_col_s, r->axonn_row_s, r->axonn_depth_s, r->axonn_data_s);
    fprintf(f, "\"links\": [");
    for (int k = 0; k < (cfg->model.experts ? FF_PLAN_NGROUPS : FF_NGROUPS); k++)
        fprintf(f,
                "%s{\"group\": \"%s\", \"size\": %d, \"inner\": %lld, \"intra\": %s, "
                "\"alpha_s\": %.6g, \"beta_Bps\": %.6g}",
                k ? ", " : "", ff_plan_group_name(k), r->link[k].size, (long long)r->link[k].inner,
                r->link[k].intra ? "true" : "false", r->link[k].alpha_s, r->link[k].beta_Bps);
    fprintf(f, "], \"collectives\": [");
    int first = 1;
    for (int k = 0; k < FF_PLAN_NGROUPS; k++)
        for (int c = 0; c < FF_NCOLL; c++) {
            const ff_plan_coll *pc = &r->coll[k][c];
            if (!pc->calls && pc->time_s <= 0)
                continue;
            fprintf(f,
                    "%s{\"group\": \"%s\", \"collective\": \"%s\", \"calls\": %llu, "
                    "\"bytes_sent\": %llu, \"bytes_recv\": %llu, \"time_s\": %.9g, "
                    "\"exposed_s\": %.9g}",
                    first ? "" : ", ", ff_plan_group_name(k), ff_coll_name((ff_coll)c),
                    (unsigned long long)pc->calls, (unsigned long long)pc->bytes_sent,
                    (unsigned long long)pc->bytes_recv, pc->time_s, pc->exposed_s);
            first = 0;
        }
    fprintf(f,
            "], \"expert_parallel\": %d, \"stages\": %d, \"micro_batches\": %d, "
            "\"bubble_s\": %.9g, \"p2p_s\": %.9g, "
            "\"busiest_stage\": %d, \"p2p\": {\"calls\": %llu, \"bytes_sent\": %llu, "
            "\"bytes_recv\": %llu}}",
            r->expert_parallel, r->stages, r->micro_batches, r->bubble_s, r->p2p_s,
            r->busiest_stage, (unsigned long long)r->p2p.calls,
            (unsigned long long)r->p2p.bytes_sent, (unsigned long long)r->p2p.bytes_recv);
}

static void print_json_head(FILE *f, const ff_plan_config *cfg)
{
    const ff_model *md = &cfg->model;
    char machine[8192];
    ff_profile_to_json(&cfg->machine, machine, sizeof machine);
    size_t n = strlen(machine);
    while (n && (machine[n - 1] == '\n'))
        machine[--n] = '\0';
    fprintf(f, "{\"format\": \"fourfold-plan\", \"version\": 1,\n \"model\": {\"name\": ");
    json_string(f, md->name);
    if (md->kind == FF_MODEL_UNET) { /* (a key added for the U-Net; GPTs unchanged) */
        const ff_unet_config *u = &md->unet;
        fprintf(f,
                ", \"kind\": \"unet\", \"image_size\": %lld, \"base_channels\": %d, "
                "\"levels\": %d, \"blocks_per_level\": %d, \"group_channels\": %d, "
                "\"attention_head_channels\": %d",
                (long long)u->image_size, u->base, u->levels, u->nres, u->group_channels,
                u->attn_head_channels);
    }
    fprintf(f,
            ", \"layers\": %d, \"hidden\": %lld, \"heads\": %d, \"vocab\": %lld, "
            "\"padded_vocab\": %lld, \"params\": %lld, \"experts\": %d, \"expert_every\": %d, "
            "\"top_k\": %d, \"capacity_factor\": %g},\n",
            md->layers, (long long)md->hidden, md->heads, (long long)md->vocab,
            (long long)ff_model_padded_vocab(md), (long long)ff_model_params(md, cfg->seq),
            md->experts, md->experts ? md->expert_every : 0, md->experts ? md->top_k : 0,
            md->experts ? md->capacity_factor : 0.0);
    char mb[16], st[16];
    snprintf(mb, sizeof mb, cfg->micro_batches == FF_PLAN_AUTO ? "\"auto\"" : "%d",
             cfg->micro_batches);
    snprintf(st, sizeof st, cfg->stages == FF_PLAN_AUTO ? "\"auto\"" : "%d", cfg->stages);
    char ge[16];
    snprintf(ge, sizeof ge, cfg->expert_parallel == FF_PLAN_AUTO ? "\"auto\"" : "%d",
             cfg->expert_parallel > 1 ? cfg->expert_parallel : 1);
    fprintf(f,
            " \"batch\": %lld, \"seq\": %lld, \"ranks\": %d, \"micro_batches\": %s, "
            "\"stages\": %s, \"schedule\": \"%s\", \"pipeline_limit\": %d, "
            "\"wire_bytes\": %d, \"precision\": \"%s\", \"overlap\": %u, \"cost\": \"%s\", "
            "\"expert_parallel\": %s, \"dtd\": %s, \"cac\": %s, \"sparsity\": %g, "
            "\"samo\": %s, \"zero\": %d, \"progress\": \"%s\",\n \"machine\": %s,\n",
            (long long)cfg->batch, (long long)cfg->seq, cfg->ranks, mb, st,
            cfg->schedule ? "1f1b" : "message", cfg->pipe_limit,
            ff_plan_precision(cfg) == FF_PLAN_BF16_MIXED ? 2 : cfg->wire_bytes,
            ff_plan_precision(cfg) == FF_PLAN_BF16_MIXED ? "bf16-mixed" : "fp32", cfg->overlap,
            ff_cost_name(cfg->cost), ge, cfg->dtd ? "true" : "false", cfg->cac ? "true" : "false",
            cfg->sparsity, cfg->samo ? "true" : "false", cfg->zero,
            cli_progress_name(cfg->progress), machine);
}

/* ---- per-layer plans ---- */

/* The combinations that make no sense, before anything is computed. */
static int check_per_layer_options(const plan_opts *o)
{
    const char *bad = NULL;
    if (o->have_search && !o->per_layer)
        bad = "--search needs --per-layer";
    else if (o->out && !o->per_layer)
        bad = "--out needs --per-layer (it writes the plan found)";
    else if (o->per_layer && o->plan_file)
        bad = "--per-layer searches a plan and --plan evaluates one: give one of them";
    else if ((o->per_layer || o->plan_file) && o->cfg.cost != FF_COST_FULL)
        bad = "per-layer plans need the full cost model (--cost full)";
    else if ((o->per_layer || o->plan_file) && o->print_machine)
        bad = "--print-machine prints the machine only: without --per-layer or --plan";
    if (!bad)
        return CLI_OK;
    cli_error("%s", bad);
    return CLI_USAGE;
}

static const char *const layer_names[FF_BLOCK_LAYERS] = {"qkv", "attproj", "fc", "fcproj"};

static void print_layer_row(const char *block, const char *ckpt, const char *name,
                            const ff_layer_opts *o)
{
    cli_print("  %5s %4s  %-8s %9d %4d %4d %4d %6d  %s %6d\n", block, ckpt, name, o->decompose,
              o->oar, o->ors, o->oag, o->ag_cache, o->wire_bytes == 2 ? "bf16" : "fp32", o->rs_cmm);
}

/* The plan, one row per linear layer, and its prediction against the
 * uniform configuration's (u, rejected or not). */
static void print_layer_plan(const ff_layer_plan *p, const char *how, const ff_plan_result *u,
                             const ff_plan_result *r)
{
    char g[48], t[2][24];
    cli_print("\nper-layer plan (%s) for grid %s:\n", how, fmt_grid(g, sizeof g, p->grid));
    cli_print("  %5s %4s  %-8s %9s %4s %4s %4s %6s  %s %6s\n", "block", "ckpt", "layer",
              "decompose", "oar", "ors", "oag", "cache", "wire", "rs-cmm");
    print_layer_row("-", "-", "wte", &p->head);
    for (int l = 0; l < p->layers; l++) {
        char num[16];
        snprintf(num, sizeof num, "%d", l);
        for (int i = 0; i < FF_BLOCK_LAYERS; i++)
            print_layer_row(i ? "" : num,
                            i                         ? ""
                            : p->blocks[l].checkpoint ? "on"
                                                      : "off",
                            layer_names[i], &p->blocks[l].layer[i]);
    }
    if (r->rejected) {
        cli_print("\npredicted step: the per-layer plan is rejected: %s\n", r->reason);
        return;
    }
    if (u->rejected)
        cli_print("\npredicted step: per-layer plan %s; the uniform configuration is rejected "
                  "(%s)\n",
                  fmt_time(t[0], 24, r->step_s), u->reason);
    else
        cli_print("\npredicted step: uniform configuration %s, per-layer plan %s (%+.1f%%)\n",
                  fmt_time(t[0], 24, u->step_s), fmt_time(t[1], 24, r->step_s),
                  100 * (r->step_s / u->step_s - 1));
}

static void print_plan_json(const ff_plan_config *cfg, const ff_layer_plan *p,
                            const ff_plan_result *u, const ff_plan_result *r)
{
    char *text = ff_layer_plan_to_json(p);
    print_json_head(stdout, cfg);
    fprintf(stdout, " \"grids\": [");
    print_json_result(stdout, cfg, r);
    fprintf(stdout, "],\n \"uniform\": ");
    print_json_result(stdout, cfg, u);
    fprintf(stdout, ",\n \"layer_plan\": %s}\n", text ? text : "null");
    free(text);
}

/* --plan FILE: the plan evaluated on its grid, beside the uniform
 * configuration of the options. */
static int run_given_plan(plan_opts *o, ff_dims grid, const ff_layer_plan *p)
{
    ff_plan_config *cfg = &o->cfg;
    const ff_model *md = &cfg->model;
    char err[512];
    if (ff_layer_plan_match(p, md->layers, md->heads, md->hidden, md->vocab, grid, err,
                            sizeof err) != FF_OK) {
        cli_error("--plan %s: %s", o->plan_file, err);
        return CLI_USAGE;
    }
    ff_plan_result u, r;
    int rc = ff_plan_evaluate(cfg, grid, &u, err, sizeof err);
    if (rc == FF_OK) {
        cfg->layers = p;
        rc = ff_plan_evaluate(cfg, grid, &r, err, sizeof err);
    }
    if (rc != FF_OK) {
        cli_error("%s", err);
        return rc == FF_ENOMEM ? CLI_FAIL : CLI_USAGE;
    }
    if (o->json) {
        print_plan_json(cfg, p, &u, &r);
        return CLI_OK;
    }
    print_header(cfg, 0, 0);
    if (p->progress >= 0 && p->progress != cfg->progress)
        cli_print("note: the plan was searched for --progress %s; evaluated with --progress %s\n",
                  cli_progress_name(p->progress), cli_progress_name(cfg->progress));
    else
        cli_print("progress mode %s (%s)\n", cli_progress_name(cfg->progress),
                  p->progress >= 0 ? "the plan's" : "the plan does not record one");
    print_detail(cfg, &r);
    print_layer_plan(p, o->plan_file, &u, &r);
    return CLI_OK;
}

/* --per-layer: the search on the grid (given, or the ranking's best), the
 * plan printed and written. */
/* Ranks every grid of cfg; on failure prints the reason and returns the
 * exit code. */
static int create_plan(const ff_plan_config *cfg, ff_plan **plan)
{
    int rc = ff_plan_create(plan, cfg);
    if (rc == FF_OK)
        return CLI_OK;
    cli_error("%s", ff_plan_error(*plan));
    ff_plan_destroy(*plan);
    *plan = NULL;
    return rc == FF_ENOMEM ? CLI_FAIL : CLI_USAGE;
}

static int run_per_layer(plan_opts *o, ff_dims grid, int have_grid)
{
    ff_plan_config *cfg = &o->cfg;
    char err[512], g[48];
    if (!have_grid) {
        ff_plan *plan;
        int code = create_plan(cfg, &plan);
        if (code != CLI_OK)
            return code;
        int none = ff_plan_accepted(plan) == 0;
        if (!none) {
            grid = ff_plan_get(plan, 0)->grid;
            cfg->expert_parallel = ff_plan_get(plan, 0)->expert_parallel;
        }
        ff_plan_destroy(plan);
        if (none) {
            cli_error("--per-layer: no grid of %d ranks fits (fourfold plan --rejected says why)",
                      cfg->ranks);
            return CLI_FAIL;
        }
    }
    /* a file that cannot be written stops before the search */
    const int writer = !cli_quiet_process();
    if (o->out && writer && ff_file_writable(o->out) != 0) {
        cli_error("--out: cannot write %s: %s", o->out, strerror(errno));
        return CLI_FAIL;
    }
    ff_plan_result u, r;
    ff_layer_plan p;
    int rc = ff_plan_evaluate(cfg, grid, &u, err, sizeof err);
    if (rc == FF_OK)
        rc = ff_plan_per_layer(cfg, grid, o->method, (uint64_t)o->seed, &p, &r, err, sizeof err);
    if (rc != FF_OK) {
        cli_error("--per-layer: %s", err);
        return rc == FF_ENOMEM ? CLI_FAIL : CLI_USAGE;
    }
    if (o->out && writer && ff_layer_plan_write(&p, o->out, err, sizeof err) != FF_OK) {
        cli_error("%s", err);
        ff_layer_plan_free(&p);
        return CLI_FAIL;
    }
    if (o->json) {
        print_plan_json(cfg, &p, &u, &r);
    } else {
        print_header(cfg, 0, 0);
        cfg->layers = &p;
        print_detail(cfg, &r);
        cfg->layers = NULL;
        print_layer_plan(&p, o->method ? "Metropolis-Hastings" : "coordinate descent", &u, &r);
        if (o->out) {
            char ep[48] = ""; /* (the plan file does not record Ge) */
            if (cfg->model.experts)
                snprintf(ep, sizeof ep, " --expert-parallel %d",
                         cfg->expert_parallel > 1 ? cfg->expert_parallel : 1);
            char pm[32] = "";
            if (cfg->progress != FF_PROGRESS_POLL)
                snprintf(pm, sizeof pm, " --progress %s", cli_progress_name(cfg->progress));
            cli_print("wrote %s (fourfold train --grid %s%s --plan %s%s%s)\n", o->out,
                      fmt_grid(g, sizeof g, grid), ep, o->out, o->cfg.cmm ? " --cmm on" : "", pm);
        }
    }
    ff_layer_plan_free(&p);
    return CLI_OK;
}

/* --grid with automatic expert parallelism: the fastest Ge that divides
 * Gd and E on it (1 if none fits; an error surfaces when it is evaluated). */
static void pick_expert_parallel(ff_plan_config *cfg, ff_dims grid)
{
    ff_plan_result r;
    int best = 1;
    double best_s = 0;
    for (int ge = 1; ge <= grid.d; ge++) {
        if (grid.d % ge || cfg->model.experts % ge)
            continue;
        cfg->expert_parallel = ge;
        if (ff_plan_evaluate(cfg, grid, &r, NULL, 0) == FF_OK && !r.rejected &&
            (best_s == 0 || r.step_s < best_s))
            best = ge, best_s = r.step_s;
    }
    cfg->expert_parallel = best;
}

/* One grid in detail, or every grid ranked. */
static int run_ranking(plan_opts *o, ff_dims grid, int have_grid)
{
    ff_plan_config *cfg = &o->cfg;
    char err[512];
    if (have_grid) {
        ff_plan_result r;
        int rc = ff_plan_evaluate(cfg, grid, &r, err, sizeof err);
        if (rc != FF_OK) {
            cli_error("%s", err);
            return rc == FF_ENOMEM ? CLI_FAIL : CLI_USAGE;
        }
        if (o->json) {
            if (cli_world_rank() == 0) {
                print_json_head(stdout, cfg);
                fprintf(stdout, " \"grids\": [");
                print_json_result(stdout, cfg, &r);
                fprintf(stdout, "]}\n");
            }
        } else {
            print_header(cfg, 0, 0);
            print_detail(cfg, &r);
            if (cfg->cost == FF_COST_FULL && !r.rejected)
                print_budget(&r);
        }
        /* the one grid asked for cannot run: say so in the exit code too */
        if (r.rejected) {
            cli_error("grid %dx%dx%dx%d cannot run this job: %s", r.grid.x, r.grid.y, r.grid.z,
                      r.grid.d, r.reason);
            return CLI_FAIL;
        }
        return CLI_OK;
    }

    ff_plan *plan;
    int code = create_plan(cfg, &plan);
    if (code != CLI_OK)
        return code;
    if (o->json) {
        print_json_head(stdout, cfg);
        fprintf(stdout, " \"accepted\": %zu,\n \"grids\": [\n", ff_plan_accepted(plan));
        for (size_t i = 0; i < ff_plan_count(plan); i++) {
            fprintf(stdout, "  ");
            print_json_result(stdout, cfg, ff_plan_get(plan, i));
            fprintf(stdout, "%s\n", i + 1 < ff_plan_count(plan) ? "," : "");
        }
        fprintf(stdout, " ]}\n");
    } else {
        print_header(cfg, ff_plan_count(plan), ff_plan_accepted(plan));
        print_table(plan, o->top);
        if (o->rejected)
            print_rejected(plan);
        if (o->explain && ff_plan_accepted(plan) > 0 && cfg->cost == FF_COST_FULL) {
            cli_print("\nthe first choice explained:");
            print_detail(cfg, ff_plan_get(plan, 0));
            print_budget(ff_plan_get(plan, 0));
        }
    }
    ff_plan_destroy(plan);
    return CLI_OK;
}

int cmd_plan(int argc, char **argv)
{
    if (cli_quiet_process()) {
        if (!freopen("/dev/null", "w", stdout) || !freopen("/dev/null", "w", stderr))
            return CLI_FAIL;
    }
    plan_opts o;
    memset(&o, 0, sizeof o);
    ff_plan_config_default(&o.cfg);
    o.layers = o.hidden = o.heads = o.vocab = o.positions = o.ranks = o.rpn = -1;
    o.experts = o.expert_every = o.top_k = -1;
    o.top = 10;
    o.seed = 1;
    int code = parse_args(argc, argv, &o);
    if (code == -1)
        return CLI_OK; /* --help */
    if (code != CLI_OK)
        return code;
    if ((code = check_per_layer_options(&o)) != CLI_OK)
        return code;
    if ((code = resolve(&o)) != CLI_OK)
        return code;
    ff_plan_config *cfg = &o.cfg;
    char err[512];
    if (o.print_machine) {
        char json[8192];
        ff_profile_to_json(&cfg->machine, json, sizeof json);
        cli_print("%s", json);
        return CLI_OK;
    }

    ff_layer_plan given;
    memset(&given, 0, sizeof given);
    if (o.plan_file) {
        /* read first: without --grid, the plan's grid is the one */
        if (ff_layer_plan_read(o.plan_file, &given, err, sizeof err) != FF_OK) {
            cli_error("--plan: %s", err);
            return CLI_FAIL;
        }
        if (!o.grid) {
            snprintf(o.plan_grid, sizeof o.plan_grid, "%dx%dx%dx%d", given.grid.x, given.grid.y,
                     given.grid.z, given.grid.d);
            o.grid = o.plan_grid;
        }
        /* without --progress, the mode it was searched for (a version 2 plan) */
        if (!o.progress_given && given.progress >= 0)
            o.cfg.progress = given.progress;
    }

    ff_dims grid = {0, 0, 0, 0};
    const int P = cfg->stages;
    if (o.grid && P == FF_PLAN_AUTO) {
        cli_error("--grid with --stages auto: give the number of stages (a grid is one stage's)");
        ff_layer_plan_free(&given);
        return CLI_USAGE;
    }
    if (o.grid) {
        if (o.ranks < 0) {
            if (explicit_grid(o.grid, &grid)) {
                cli_error("--grid %s: give four sizes such as 2x2x4x8, or --ranks for a preset",
                          o.grid);
                ff_layer_plan_free(&given);
                return CLI_USAGE;
            }
            o.ranks = (long)grid.x * grid.y * grid.z * grid.d * P;
        }
        if (ff_grid_parse_staged(o.grid, (int)o.ranks, P, cfg->machine.ranks_per_node, &grid, err,
                                 sizeof err) != FF_OK) {
            cli_error("--grid: %s", err);
            ff_layer_plan_free(&given);
            return CLI_USAGE;
        }
    }
    if (o.ranks < 0 && P != 1) {
        cli_error("--stages: give the job's --ranks (or one stage's --grid)");
        ff_layer_plan_free(&given);
        return CLI_USAGE;
    }
    cfg->ranks = o.ranks > 0 ? (int)o.ranks : 1;
    if (o.grid && cfg->expert_parallel == FF_PLAN_AUTO)
        pick_expert_parallel(cfg, grid);

    if (o.plan_file)
        code = run_given_plan(&o, grid, &given);
    else if (o.per_layer)
        code = run_per_layer(&o, grid, o.grid != NULL);
    else
        code = run_ranking(&o, grid, o.grid != NULL);
    ff_layer_plan_free(&given);
    return code;
}
