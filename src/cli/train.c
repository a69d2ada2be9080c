/* fourfold train: the training program. Model, grid, data, schedule and
 * checkpoints from the command line; a table of every setting at start; one
 * line per step on rank 0 and the same as JSON lines in the output folder;
 * checkpoints that resume on any grid (docs/train.md). */
#include <glob.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli.h"
#include "fourfold/image.h"
#include "util/file.h"

typedef struct {
    cli_run_opts run;
    const char *model;
    long layers, hidden, heads, vocab, max_seq; /* overrides; 0: the preset's */
    /* mixture of experts (docs/moe.md): -1 the preset's (experts 0: dense) */
    long experts, expert_every, router_top_k;
    float capacity_factor, aux_coef;
    int moe_model;         /* the model built has experts (print_event) */
    const char *peak_name; /* what the step's FLOP/s are a fraction of (print_event) */
    const char *rate_unit; /* the step's samples per second (print_event): NULL tok/s */
    long batch, micro, micro_batches, seq, steps;
    const char *schedule, *stage_layers;
    int stage_split[1024]; /* --stage-layers, parsed */
    float slow_ms;
    ff_adamw hyper;
    const char *data, *val_data, *out, *resume_from, *init_from, *plan, *mask;
    float prune_to;
    long prune_every, prune_steps;
    int prune_per_layer, samo;
    int resume, overwrite, grid_auto;
    long ag_cache_blocks; /* the planner's unit; -1: every layer, wte included */
    long seed, val_every, val_batches, save_every, keep, log_every, sample_tokens, top_k;
    long sample_steps; /* a U-Net's samples.png: reverse steps; 0: the default */
    float temperature;
    ff_gpt_opts gpt;
} train_opts;

static const char help[] =
    "usage: mpirun -np N fourfold train [options]\n\n"
    "Trains a GPT-2 shaped model on llm.c token shards over a 4D grid; with no\n"
    "--data, on the default corpus (the fortune(6) files, byte-level tokens).\n\n"
    "model:\n"
    "  --model NAME      preset: mini (default: L=4 C=128 NH=4, byte vocabulary 257),\n"
    "                    mini-moe (mini with 4 experts in every second block), tiny,\n"
    "                    gpt2-124m, gpt2-350m, ..., gpt-5b ... gpt-640b;\n"
    "                    unet-tiny, unet-fmnist, unet-50m: the DDPM U-Net on Fashion-MNIST\n"
    "                    (fp32; --data/--val-data IDX image files; OUT/samples.png;\n"
    "                    docs/unet.md); unet-250m ... unet-4b: Table II's, RGB (planner)\n"
    "  --sample-steps K  a U-Net's samples.png in K of its T reverse steps (improved\n"
    "                    DDPM's respacing; default 100, or T if less)\n"
    "  --layers N --hidden N --heads N --vocab N --max-seq N   override the preset\n"
    "mixture of experts (docs/moe.md; override the preset):\n"
    "  --experts E       experts per MoE block (0 = a dense model)\n"
    "  --expert-every K  blocks K-1, 2K-1, ... are MoE blocks (default 2)\n"
    "  --router-top-k K  experts per token, 1 or 2 (default 1)\n"
    "  --capacity-factor F  an expert takes ceil(F k T / E) tokens of a sequence (default 1.25)\n"
    "  --aux-loss-coef A    weight of the load-balancing loss (default 0.01)\n"
    "  --expert-parallel G  G ranks of D share the experts, E/G each (default 1)\n"
    "  --dtd on|off      duplicate token dropping: with Gx > 1, each X rank sends 1/Gx of\n"
    "                    the tokens through the all-to-alls (default on)\n"
    "  --balanced-routing on|off  token t's choices are experts tk..tk+k-1 mod E, as\n"
    "                    fourfold plan assumes (benchmarks; default off)\n"
    "  --init-from FILE  start from an llm.c gpt2_*.bin v3 checkpoint or an MoE one (its\n"
    "                    shape; an MoE file's routing options may be changed)\n"
    "  --mask FILE|auto  masked training: pruned weights stay zero (a mask of fourfold\n"
    "                    prune; auto: the --init-from checkpoint's, FILE.mask;\n"
    "                    a run's checkpoints keep it: --resume finds it; docs/samo.md)\n"
    "  --prune-to P      iterative magnitude pruning: every --prune-every N steps, --prune-steps\n"
    "                    K times, prune to 1-(1-P)^(i/K) (pruned weights stay pruned), then\n"
    "                    train on with the mask (default: none; --prune-per-layer: each\n"
    "                    matrix on its own)\n"
    "  --samo            SAMO: the weight matrices' gradients and moments kept only where\n"
    "                    the mask keeps weights (the same training in less memory; needs\n"
    "                    --mask, a masked run to resume, or --prune-to: after its last round)\n"
    "";

static const char help_rest[] =
    "batch and schedule:\n"
    "  --batch N         sequences per step, whole grid (default 16)\n"
    "  --micro-batch N   sequences per micro-batch (default: --batch; N must divide it)\n"
    "  --micro-batches M micro-batches per step (instead of --micro-batch: batch/M each)\n"
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
    "  --val-batches N   micro-batches per validation, spread over the data (default 8)\n"
    "output and checkpoints:\n"
    "  --out DIR         log.jsonl and checkpoints (default out)\n"
    "  --save-every N    checkpoint every N steps and at the end (default 0 = end only)\n"
    "  --keep N          complete checkpoints kept (default 2)\n"
    "  --resume          continue from the newest checkpoint in --out (any grid)\n"
    "  --resume-from DIR continue from the newest checkpoint in DIR\n"
    "  --overwrite       start afresh in an --out that holds checkpoints (removes them)\n"
    "  --log-every N     print every N-th step (default 1; JSON gets every step)\n"
    "  --sample N        print N sampled tokens at the end (default 0)\n"
    "  --temperature F   of that sample (default 0.8; 0 = greedy)\n"
    "  --top-k N         sample from the N most likely tokens (default 40; 0 = all)\n"
    "parallelism:\n"
    "  --checkpoint on|off   activation checkpointing (default off)\n"
    "  --cac on|off          with it, keep what each block's collectives produced, so the\n"
    "                        recompute communicates nothing (default off)\n"
    "  --overlap on|off      all overlaps: OAR, ORS, OAG, data-parallel buckets (default on)\n"
    "  --ag-cache N          the last N blocks keep their gathered weights from the forward\n"
    "                        to the backward (-1: every layer and wte; default -1)\n"
    "  --precision P         fp32 or bf16-mixed: bf16 products, fp32 master weights and\n"
    "                        AdamW state (default fp32; docs/design.md §13)\n"
    "  --bf16-products P     bf16-mixed's products: emulated (the BLAS on bf16 values),\n"
    "                        onednn (oneDNN's bf16 matmul) or auto (the faster, timed at\n"
    "                        start; default)\n"
    "  --wire fp32|bf16      element format of the linear layers' collectives (default fp32;\n"
    "                        bf16-mixed sets it per collective)\n"
    "  --zero 0|1|2          ZeRO over D: 1 shards AdamW's moments over the data-parallel\n"
    "                        ranks, 2 also the gradients after their reduce-scatter (default 0);\n"
    "                        with --samo the compressed states (not with masked training)\n"
    "  --decompose K         compute each layer's all-reduced product in K chunks of rows,\n"
    "                        each chunk's all-reduce beside the next chunk (default 0 = off)\n"
    "  --cmm on|off          collective matmul: a forward whose weight all-gather was not\n"
    "                        prefetched multiplies each Z-shard as it arrives (default off)\n"
    "  --rs-cmm on|off       reduce-scatter collective matmul: a weight gradient computed\n"
    "                        Z-shard by Z-shard, each fed to its reduce-scatter (default off)\n"
    "  --plan FILE           a per-layer plan (`fourfold plan --per-layer --out FILE`): its\n"
    "                        checkpointing and layer options replace the five above\n"
    "  --grid auto           the planner's first choice for this model, batch and job\n";

static const char help_pipeline[] = /* (a string of its own: C's 4095 characters) */
    "pipeline (with --stages P, docs/pipeline.md):\n"
    "  --schedule message|1f1b   message-driven (AxoNN) or fixed 1F1B (default message)\n"
    "  --pipeline-limit K    micro-batches in flight per stage (default: P)\n"
    "  --stage-layers A,B,.. blocks of each stage (default: as even as possible)\n"
    "  --slow-stage S --slow-ms T   stage S sleeps T ms after each pass (a straggler,\n"
    "                        for measurements)\n";

static void defaults(train_opts *o)
{
    memset(o, 0, sizeof *o);
    cli_run_opts_default(&o->run);
    o->model = "mini";
    o->experts = o->expert_every = o->router_top_k = -1;
    o->capacity_factor = o->aux_coef = -1;
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
    o->temperature = 0.8f;
    o->top_k = 40;
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

/* --schedule, --stage-layers and --slow-ms (the stage count comes with the
 * grid: the model checks the split against it). */
static int parse_pipeline(train_opts *o)
{
    if (o->schedule) {
        if (!strcmp(o->schedule, "message"))
            o->gpt.pipe.schedule = FF_PIPE_MESSAGE;
        else if (!strcmp(o->schedule, "1f1b"))
            o->gpt.pipe.schedule = FF_PIPE_1F1B;
        else {
            cli_error("--schedule %s: expected message or 1f1b", o->schedule);
            return CLI_USAGE;
        }
    }
    if (o->stage_layers) {
        if (cli_parse_stage_layers(o->stage_layers, o->run.stages, o->stage_split,
                                   (int)(sizeof o->stage_split / sizeof o->stage_split[0])))
            return CLI_USAGE;
        o->gpt.pipe.stage_layers = o->stage_split;
    }
    if (o->slow_ms > 0 && o->gpt.pipe.slow_stage < 0) {
        cli_error("--slow-ms needs --slow-stage");
        return CLI_USAGE;
    }
    o->gpt.pipe.slow_s = (double)o->slow_ms * 1e-3;
    return CLI_OK;
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
        {"experts", 'l', &o->experts, 0, 4096},
        {"expert-every", 'l', &o->expert_every, 1, 10000},
        {"router-top-k", 'l', &o->router_top_k, 1, 2},
        {"capacity-factor", 'f', &o->capacity_factor, 1e-6, 1e6},
        {"aux-loss-coef", 'f', &o->aux_coef, 0, 1e6},
        {"expert-parallel", 'i', &o->gpt.expert_parallel, 1, 1 << 20},
        {"batch", 'l', &o->batch, 1, 1 << 24},
        {"micro-batch", 'l', &o->micro, 1, 1 << 24},
        {"micro-batches", 'l', &o->micro_batches, 1, 1 << 24},
        {"schedule", 's', &o->schedule, 0, 0},
        {"pipeline-limit", 'i', &o->gpt.pipe.limit, 1, 1 << 20},
        {"stage-layers", 's', &o->stage_layers, 0, 0},
        {"slow-stage", 'i', &o->gpt.pipe.slow_stage, 0, 1 << 20},
        {"slow-ms", 'f', &o->slow_ms, 0, 1e7},
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
        {"mask", 's', &o->mask, 0, 0},
        {"prune-to", 'f', &o->prune_to, 0, 0.999999},
        {"prune-every", 'l', &o->prune_every, 1, big},
        {"prune-steps", 'l', &o->prune_steps, 1, 1 << 20},
        {"log-every", 'l', &o->log_every, 1, big},
        {"sample", 'l', &o->sample_tokens, 0, 1 << 20},
        {"sample-steps", 'l', &o->sample_steps, 1, 0x7fffffff},
        {"temperature", 'f', &o->temperature, 0, 100},
        {"top-k", 'l', &o->top_k, 0, 1 << 24},
        {"ag-cache", 'l', &o->ag_cache_blocks, -1, 1 << 20},
        {"decompose", 'i', &o->gpt.linear.decompose, 0, FF_DECOMPOSE_MAX},
        {"plan", 's', &o->plan, 0, 0},
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
        } else if (cli_is(&a, "prune-per-layer")) {
            o->prune_per_layer = 1;
        } else if (cli_is(&a, "samo")) {
            o->samo = 1;
        } else if (cli_is(&a, "overwrite")) {
            o->overwrite = 1;
        } else if (cli_is(&a, "checkpoint")) {
            bad = !(v = cli_value(&a)) || parse_onoff("checkpoint", v, &o->gpt.checkpoint);
        } else if (cli_is(&a, "cac")) {
            bad = !(v = cli_value(&a)) || parse_onoff("cac", v, &o->gpt.cac);
        } else if (cli_is(&a, "dtd")) {
            bad = !(v = cli_value(&a)) || parse_onoff("dtd", v, &o->gpt.dtd);
        } else if (cli_is(&a, "balanced-routing")) {
            bad = !(v = cli_value(&a)) ||
                  parse_onoff("balanced-routing", v, &o->gpt.balanced_routing);
        } else if (cli_is(&a, "cmm")) {
            bad = !(v = cli_value(&a)) || parse_onoff("cmm", v, &o->gpt.linear.cmm);
        } else if (cli_is(&a, "rs-cmm")) {
            bad = !(v = cli_value(&a)) || parse_onoff("rs-cmm", v, &o->gpt.linear.rs_cmm);
        } else if (cli_is(&a, "overlap")) {
            bad = !(v = cli_value(&a)) || parse_onoff("overlap", v, &on);
            if (!bad)
                o->gpt.dp_overlap = o->gpt.linear.oar = o->gpt.linear.ors = o->gpt.linear.oag = on;
        } else if (cli_is(&a, "precision")) {
            bad = !(v = cli_value(&a)) || cli_parse_precision(v, &o->gpt.precision);
        } else if (cli_is(&a, "bf16-products")) {
            bad = !(v = cli_value(&a)) || cli_parse_bf16_products(v, &o->gpt.bf16_products);
        } else if (cli_is(&a, "zero")) {
            if (!(v = cli_value(&a)))
                bad = 1;
            else if (strlen(v) == 1 && v[0] >= '0' && v[0] <= '2')
                o->gpt.zero = v[0] - '0';
            else {
                cli_error("--zero %s: expected 0, 1 or 2", v);
                bad = 1;
            }
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
    if (o->micro_batches) {
        if (o->micro && o->micro * o->micro_batches != o->batch) {
            cli_error("--micro-batch %ld and --micro-batches %ld: give one (they make %ld "
                      "sequences, not --batch %ld)",
                      o->micro, o->micro_batches, o->micro * o->micro_batches, o->batch);
            return CLI_USAGE;
        }
        if (o->batch % o->micro_batches) {
            cli_error("--batch %ld is not a multiple of --micro-batches %ld", o->batch,
                      o->micro_batches);
            return CLI_USAGE;
        }
        o->micro = o->batch / o->micro_batches;
    }
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
    if ((o->prune_to > 0) != (o->prune_every > 0 && o->prune_steps > 0) ||
        (o->prune_per_layer && !(o->prune_to > 0))) {
        cli_error("--prune-to, --prune-every and --prune-steps go together (and "
                  "--prune-per-layer with them)");
        return CLI_USAGE;
    }
    if ((o->resume || o->resume_from) && o->init_from) {
        cli_error("--init-from starts a new run; it cannot be combined with --resume");
        return CLI_USAGE;
    }
    if (parse_pipeline(o) != CLI_OK)
        return CLI_USAGE;
    o->hyper.steps = (int)o->steps;
    /* the model counts layers (set from blocks in cmd_train, once the model's
     * shape is known; wte is cached only with "all") */
    o->gpt.linear.ag_cache_layers = -1;
    return CLI_OK;
}

/* The model shape: a preset with overrides (the checkpoint's, with --init-from). */
static int model_config(const train_opts *o, ff_gpt_config *cfg)
{
    ff_model m;
    char err[512];
    /* (mini-moe: the mini model with 4 experts in every second block) */
    if (ff_model_preset(o->model, &m, err, sizeof err)) {
        cli_error("%s", err);
        return CLI_USAGE;
    }
    if (m.kind != FF_MODEL_GPT) { /* (a planner's U-Net preset: fourfold plan knows it) */
        cli_error("model %s is a U-Net: fourfold train trains the GPT presets here", o->model);
        return CLI_USAGE;
    }
    memset(cfg, 0, sizeof *cfg);
    ff_gpt_config_moe(cfg, m.experts);
    const int moe_opts = o->expert_every > 0 || o->router_top_k > 0 || o->capacity_factor > 0 ||
                         o->aux_coef >= 0 || o->gpt.expert_parallel > 1 || o->gpt.balanced_routing;
    int32_t h[13] = {0}; /* --init-from: the checkpoint's header, if it reads */
    if (o->init_from) {
        /* its shape, its experts and its routing unless given here (read on
         * every rank; the trainer checks the file properly) */
        FILE *f = ff_fopen_regular(o->init_from);
        int got = f && fread(h, sizeof h, 1, f) == 1;
        if (f)
            fclose(f);
        if (got && h[0] == FF_GPT_MAGIC_MOE) {
            cfg->experts = h[8];
            cfg->expert_every = h[9];
            cfg->top_k = h[10];
            memcpy(&cfg->capacity_factor, &h[11], sizeof(float));
            memcpy(&cfg->aux_coef, &h[12], sizeof(float));
        }
        if (got && h[0] != FF_GPT_MAGIC_MOE && (moe_opts || o->experts > 0)) {
            cli_error("--init-from %s is a dense model: the mixture-of-experts options need "
                      "an MoE checkpoint (or no --init-from)",
                      o->init_from);
            return CLI_USAGE;
        }
        if (got && h[0] == FF_GPT_MAGIC_MOE && o->experts == 0) {
            cli_error("--experts 0, but --init-from %s has %d experts", o->init_from, h[8]);
            return CLI_USAGE;
        }
        if (!got)
            h[0] = 0;
    }
    if (o->experts >= 0)
        cfg->experts = (int)o->experts;
    if (o->gpt.cac && !o->gpt.checkpoint) {
        cli_error("--cac on needs --checkpoint on (it changes what checkpointing keeps)");
        return CLI_USAGE;
    }
    if (cfg->experts == 0 && moe_opts) {
        cli_error("--expert-every, --router-top-k, --capacity-factor, --aux-loss-coef, "
                  "--expert-parallel and --balanced-routing need a model with experts (--experts "
                  "E or --model mini-moe)");
        return CLI_USAGE;
    }
    if (o->expert_every > 0)
        cfg->expert_every = (int)o->expert_every;
    if (o->router_top_k > 0)
        cfg->top_k = (int)o->router_top_k;
    if (o->capacity_factor > 0)
        cfg->capacity_factor = o->capacity_factor;
    if (o->aux_coef >= 0)
        cfg->aux_coef = o->aux_coef;
    cfg->L = o->layers ? (int)o->layers : m.layers;
    cfg->C = o->hidden ? (int)o->hidden : (int)m.hidden;
    cfg->NH = o->heads ? (int)o->heads : m.heads;
    cfg->V = o->vocab ? (int)o->vocab : (int)m.vocab;
    cfg->maxT = o->max_seq ? (int)o->max_seq : m.max_seq ? (int)m.max_seq : (int)o->seq;
    if (h[0] == 20240326 || h[0] == FF_GPT_MAGIC_MOE) { /* --init-from: the file's shape */
        /* a shape option that says otherwise is refused, not ignored */
        const struct {
            const char *opt, *field;
            long given;
            int file;
        } shape[] = {{"layers", "L", o->layers, h[4]},
                     {"hidden", "C", o->hidden, h[6]},
                     {"heads", "NH", o->heads, h[5]},
                     {"vocab", "V", o->vocab, h[3]},
                     {"max-seq", "maxT", o->max_seq, h[2]}};
        for (size_t i = 0; i < sizeof shape / sizeof *shape; i++)
            if (shape[i].given && shape[i].given != shape[i].file) {
                cli_error("--%s %ld, but --init-from %s has %s=%d (the model is the file's: "
                          "drop --%s)",
                          shape[i].opt, shape[i].given, o->init_from, shape[i].field, shape[i].file,
                          shape[i].opt);
                return CLI_USAGE;
            }
        cfg->maxT = h[2], cfg->V = h[3], cfg->L = h[4], cfg->NH = h[5], cfg->C = h[6],
        cfg->Vp = h[7];
    }
    if (o->seq > cfg->maxT) {
        cli_error("--seq %ld is longer than the model's %d positions", o->seq, cfg->maxT);
        return CLI_USAGE;
    }
    return CLI_OK;
}

/* --grid auto: the planner's first choice for this model, batch and job, on
 * the profile of this machine (and with experts, its expert parallelism
 * unless --expert-parallel gives one). */
static int resolve_auto_grid(train_opts *o, const ff_gpt_config *cfg, char *buf, size_t len)
{
    ff_plan_config pc;
    ff_plan_config_default(&pc);
    char err[512];
    if (ff_profile_preset("this", &pc.machine, err, sizeof err))
        goto fail;
    if (o->init_from) {
        /* plan for the checkpoint's shape (model_config took it from the
         * header, read on every rank: the same file, so the same outcome) */
        int32_t h[8];
        FILE *f = ff_fopen_regular(o->init_from);
        int ok =
            f && fread(h, sizeof h, 1, f) == 1 && (h[0] == 20240326 || h[0] == FF_GPT_MAGIC_MOE);
        if (f)
            fclose(f);
        if (!ok) {
            snprintf(err, sizeof err, "cannot read the model shape of '%s'", o->init_from);
            goto fail;
        }
    }
    memset(&pc.model, 0, sizeof pc.model);
    snprintf(pc.model.name, sizeof pc.model.name, "%s", o->model);
    pc.model.layers = cfg->L;
    pc.model.heads = cfg->NH;
    pc.model.hidden = cfg->C;
    pc.model.vocab = cfg->V;
    pc.model.max_seq = cfg->maxT;
    pc.model.experts = cfg->experts;
    pc.model.expert_every = cfg->expert_every;
    pc.model.top_k = cfg->top_k;
    pc.model.capacity_factor = cfg->capacity_factor;
    /* (--expert-parallel given: that one) */
    pc.expert_parallel = o->gpt.expert_parallel >= 1 ? o->gpt.expert_parallel
                         : cfg->experts              ? FF_PLAN_AUTO
                                                     : 1;
    pc.dtd = o->gpt.dtd;
    pc.cac = o->gpt.cac;
    pc.batch = o->batch;
    pc.seq = o->seq;
    pc.micro_batches = (int)(o->batch / o->micro);
    MPI_Comm_size(MPI_COMM_WORLD, &pc.ranks);
    /* with stages: the best grid of one stage for this pipeline */
    pc.stages = o->run.stages;
    pc.stage_layers = o->gpt.pipe.stage_layers;
    pc.schedule = o->gpt.pipe.schedule == FF_PIPE_1F1B;
    pc.pipe_limit = o->gpt.pipe.limit;
    pc.machine.ranks_per_node = cli_ranks_per_node(MPI_COMM_WORLD);
    const char *k = getenv("FF_RANKS_PER_NODE"); /* as the run's nodes */
    if (k && atoi(k) > 0)
        pc.machine.ranks_per_node = atoi(k);
    if (cli_coll_model(&pc.coll, err, sizeof err) != FF_OK)
        goto fail;
    pc.checkpoint = o->gpt.checkpoint;
    pc.ag_cache = o->ag_cache_blocks < 0 ? cfg->L : (int)o->ag_cache_blocks;
    pc.cmm = o->gpt.linear.cmm;
    pc.rs_cmm = o->gpt.linear.rs_cmm;
    /* the run's traffic (docs/design.md §13; the planner's bf16-mixed memory
     * is the accelerator's 2-byte storage, below this run's) */
    pc.precision = o->gpt.precision == FF_PRECISION_BF16_MIXED ? FF_PLAN_BF16_MIXED : FF_PLAN_FP32;
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
    o->gpt.expert_parallel = ff_plan_get(plan, 0)->expert_parallel;
    ff_plan_destroy(plan);
    snprintf(buf, len, "%dx%dx%dx%d", gd.x, gd.y, gd.z, gd.d);
    o->run.grid = buf;
    o->grid_auto = 1;
    return CLI_OK;
fail:
    cli_error("--grid auto: %s", err);
    return CLI_FAIL;
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

/* A settings row whose value may be longer than the column: continued on
 * rows without a name, broken at spaces. */
static void row_wrapped(const char *name, const char *v)
{
    enum { W = 66 };
    while (*v) {
        int n = (int)strlen(v);
        if (n > W) {
            n = W;
            while (n > W / 2 && v[n] != ' ')
                n--;
            if (v[n] != ' ')
                n = W;
        }
        cli_print("| %-21s | %-66.*s |\n", name, n, v);
        name = "";
        v += n;
        while (*v == ' ')
            v++;
    }
}

static void print_settings(const train_opts *o, ff_trainer *t, ff_grid *grid, int ranks)
{
    ff_gpt *g = ff_trainer_gpt(t);
    ff_trainer_info ti;
    ff_trainer_get_info(t, &ti);
    ff_gpt_config c = ff_gpt_get_config(g);
    ff_gpt_memory mem;
    ff_gpt_memory_report(g, &mem);
    ff_dims s = ff_grid_shape(grid);
    double mib = 1.0 / (1 << 20);
    cli_print("+-----------------------+-----------------------------------------------------------"
              "---------+\n");
#define ROW(name, ...)                                                                             \
    do {                                                                                           \
        char v_[256];                                                                              \
        snprintf(v_, sizeof v_, __VA_ARGS__);                                                      \
        cli_print("| %-21s | %-66s |\n", name, v_);                                                \
    } while (0)
    ROW("model", "%s  L=%d C=%d NH=%d V=%d (Vp %d) maxT=%d", o->init_from ? o->init_from : o->model,
        c.L, c.C, c.NH, c.V, c.Vp, c.maxT);
    ROW("parameters", "%lld", (long long)ff_gpt_num_params(g));
    ROW("device", "%.66s", ff_ctx_device(ff_grid_ctx(grid)));
    if (c.experts > 0)
        ROW("experts",
            "%d in one block of every %d, top-%d, capacity factor %g, aux loss %g; %d per rank",
            c.experts, c.expert_every, c.top_k, c.capacity_factor, c.aux_coef,
            c.experts / (o->gpt.expert_parallel > 1 ? o->gpt.expert_parallel : 1));
    char ep[48] = "";
    if (c.experts > 0)
        snprintf(ep, sizeof ep, ", expert parallelism %d",
                 o->gpt.expert_parallel > 1 ? o->gpt.expert_parallel : 1);
    ROW("grid (x y z d)", "%dx%dx%dx%d on %d ranks%s%s", s.x, s.y, s.z, s.d, ranks, ep,
        o->grid_auto ? " (--grid auto: the planner's first choice)" : "");
    const int P = ff_grid_stages(grid);
    int *even = P > 1 ? malloc((size_t)P * sizeof(int)) : NULL;
    if (even) {
        const int *split = o->gpt.pipe.stage_layers;
        if (!split) {
            ff_pipe_split(c.L, P, even);
            split = even;
        }
        char blocks[160] = "";
        for (int st = 0, n = 0; st < P && n < (int)sizeof blocks - 12; st++)
            n += snprintf(blocks + n, sizeof blocks - (size_t)n, "%s%d", st ? "," : "", split[st]);
        ROW("pipeline", "%d stages of %d ranks, blocks %s, %s, limit %d", P, ranks / P, blocks,
            o->gpt.pipe.schedule == FF_PIPE_1F1B ? "1F1B" : "message-driven",
            o->gpt.pipe.limit ? o->gpt.pipe.limit : P);
        if (o->gpt.pipe.slow_s > 0)
            ROW("straggler", "stage %d sleeps %.1f ms after each pass", o->gpt.pipe.slow_stage,
                o->gpt.pipe.slow_s * 1e3);
    }
    free(even);
    ROW("batch", "%ld sequences x %ld tokens = %ld tokens", o->batch, o->seq, o->batch * o->seq);
    ROW("micro-batches", "%ld of %ld sequences", o->batch / o->micro, o->micro);
    ROW("steps", "%lld to %ld", (long long)ti.start_step, o->steps);
    ROW("learning rate", "%g, warm-up %d, cosine to %g", o->hyper.lr, o->hyper.warmup,
        o->hyper.lr * o->hyper.min_lr_frac);
    ROW("AdamW", "betas %g %g, eps %g, decay %g, clip %g", o->hyper.beta1, o->hyper.beta2,
        o->hyper.eps, o->hyper.weight_decay, o->hyper.clip);
    ROW("data", "%s", ti.data);
    ROW("validation", "%s, every %ld steps, %ld batches", ti.val_data ? ti.val_data : "none",
        o->val_every, o->val_batches);
    ROW("output", "%s (checkpoint every %ld, keep %ld)", o->out, o->save_every, o->keep);
    ROW("seed", "%ld", o->seed);
    ROW("activation ckpt", "%s",
        !o->gpt.checkpoint ? "off"
        : o->gpt.cac       ? "on, communication-aware (CAC: no collective in the recompute)"
                           : "on");
    char agc[32] = "all";
    if (o->ag_cache_blocks >= 0)
        snprintf(agc, sizeof agc, "last %ld blocks", o->ag_cache_blocks);
    ROW("overlaps", "OAR %s ORS %s OAG %s DP %s, AG cache %s", o->gpt.linear.oar ? "on" : "off",
        o->gpt.linear.ors ? "on" : "off", o->gpt.linear.oag ? "on" : "off",
        o->gpt.dp_overlap ? "on" : "off", agc);
    char products[160];
    ROW("precision", "%s%s", ff_precision_name(o->gpt.precision),
        cli_bf16_products(g, products, sizeof products));
    ROW("wire", "%s",
        o->gpt.precision == FF_PRECISION_BF16_MIXED
            ? "bf16 for weight gathers and activations, fp32 for gradients"
        : o->gpt.linear.coll.wire == FF_WIRE_BF16 ? "bf16"
                                                  : "fp32");
    if (o->gpt.zero)
        ROW("ZeRO", "%d over D (%s)", o->gpt.zero,
            o->gpt.zero == 1 ? "AdamW's moments sharded" : "moments and gradients sharded");
    if (o->gpt.linear.decompose > 1)
        ROW("decomposition", "%d chunks of rows per all-reduced product", o->gpt.linear.decompose);
    else
        ROW("decomposition", "off");
    if (o->gpt.linear.cmm)
        ROW("collective matmul", "%s", "on: forwards multiply shard by shard");
    if (o->gpt.linear.rs_cmm)
        ROW("reduce-scatter cmm", "%s", "on: weight gradients fed to their reduce-scatter");
    if (o->plan)
        ROW("per-layer plan",
            "%s (its checkpointing, overlaps, AG cache, wire, decomposition and "
            "reduce-scatter cmm replace the rows above)",
            o->plan);
    /* (the layers' pool and the GEMMs' scratch: a note after the first step) */
    ROW("memory per rank", "params %.1f grads %.1f adam %.1f act %.1f scratch %.1f MiB",
        mem.params * mib, mem.grads * mib, mem.adam * mib, mem.activations * mib,
        mem.scratch * mib);
    if (mem.mask && !ff_gpt_is_samo(g))
        ROW("mask", "%.1f MiB (masked training: the mask and the packed all-reduces)",
            mem.mask * mib);
    if (ff_gpt_is_samo(g))
        ROW("SAMO",
            "%zu kept weights compressed on this rank (%sgradient, moments); offsets %.1f MiB; "
            "model state %.1f MiB",
            mem.mask / sizeof(uint32_t),
            o->gpt.precision == FF_PRECISION_BF16_MIXED ? "master, " : "", mem.mask * mib,
            (mem.params + mem.grads + mem.adam + mem.mask) * mib);
    if (strcmp(ff_ctx_device(ff_grid_ctx(grid)), "cpu") != 0)
        ROW("sgemm per rank", "%.1f GFLOP/s (cuBLAS fp32 4096^3 on the GPU)", ti.sgemm_rate * 1e-9);
    else {
        if (ff_gpt_bf16_products(g, NULL, NULL) == FF_BF16_PRODUCTS_ONEDNN)
            ROW("bf16 matmul per rank",
                "%.1f GFLOP/s (oneDNN, %d thread(s), all ranks at once: the products' peak)",
                ti.sgemm_rate * 1e-9, ff_ctx_blas_threads(ff_grid_ctx(grid)));
        else
            ROW("sgemm per rank", "%.1f GFLOP/s (%s, %d thread(s) on %s, all ranks at once)",
                ti.sgemm_rate * 1e-9, ff_blas_core(), ff_ctx_blas_threads(ff_grid_ctx(grid)),
                ff_blas_threading());
        if (ti.sgemm_core_share < 1)
            ROW("", "(each rank's CPU-time rate times its share of a core, %.3g)",
                ti.sgemm_core_share);
        row_wrapped("BLAS kernels", ff_blas_kernels());
    }
    ROW("model FLOPs", "6N + 12LCT = %.3g per token", ff_gpt_flops_per_token(g, (int)o->seq));
#undef ROW
    cli_print("+-----------------------+-----------------------------------------------------------"
              "---------+\n");
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

/* Hours, minutes and seconds: "1:02:03", "2:03", "0:05". */
static void format_eta(double s, char *buf, size_t len)
{
    long t = (long)(s + 0.5);
    if (t >= 3600)
        snprintf(buf, len, "%ld:%02ld:%02ld", t / 3600, t / 60 % 60, t % 60);
    else
        snprintf(buf, len, "%ld:%02ld", t / 60, t % 60);
}

/* The trainer's events as lines on rank 0. */
static void print_event(const ff_train_event *ev, void *user)
{
    const train_opts *o = user;
    const ff_train_step_info *s = ev->step;
    char eta[32];
    switch (ev->kind) {
    case FF_TRAIN_STEP:
        if (s->step % o->log_every != 0 && s->step != s->steps && s->step != 1)
            break;
        format_eta(s->eta_s, eta, sizeof eta);
        /* (a model whose FLOPs are not known: no FLOP/s) */
        char flops[96] = "";
        if (s->model_flops_per_s > 0)
            snprintf(flops, sizeof flops, "%.2f GFLOP/s %4.1f%% of %s | ",
                     s->model_flops_per_s * 1e-9, 100 * s->sgemm_fraction, o->peak_name);
        cli_print("step %5lld/%lld | loss %.4f | lr %.2e | norm %.3f | %7.1f ms | %7.0f %s | "
                  "%scompute %.1f wait %.1f hidden %.1f ms | eta %s\n",
                  (long long)s->step, (long long)s->steps, s->loss, s->lr, s->grad_norm, s->ms,
                  s->tokens_per_s, o->rate_unit ? o->rate_unit : "tok/s", flops, s->compute_ms,
                  s->wait_ms, s->hidden_ms, eta);
        if (o->moe_model)
            cli_print("           | load-balancing loss %.5f | dropped %.1f%% of token-expert "
                      "assignments\n",
                      s->aux_loss, 100 * s->dropped);
        break;
    case FF_TRAIN_VAL:
        cli_print("step %5lld/%ld | validation loss %.4f (%ld batches)\n", (long long)ev->at,
                  o->steps, ev->val_loss, o->val_batches);
        break;
    case FF_TRAIN_SAVE:
        cli_print("step %5lld/%ld | checkpoint %s\n", (long long)ev->at, o->steps, ev->path);
        break;
    case FF_TRAIN_NOTE: cli_print("note: %s\n", ev->text); break;
    }
}

/* Every rank reads the plan and checks it is for this model and grid; one
 * rank's failure is everyone's. */
static int read_plan(ff_ctx *ctx, const char *path, const ff_gpt_config *cfg, ff_dims shape,
                     ff_layer_plan *plan)
{
    char err[512];
    int rc = ff_layer_plan_read(path, plan, err, sizeof err);
    if (rc == FF_OK &&
        (rc = ff_layer_plan_match(plan, cfg->L, cfg->NH, cfg->C, cfg->V, shape, err, sizeof err)))
        ff_ctx_set_error(ctx, rc, "--plan %s: %s", path, err);
    else if (rc)
        ff_ctx_set_error(ctx, rc, "%s", err);
    return ff_ctx_agree(ctx, rc);
}

/* A plan searched for another progress mode runs; say so once. */
static void note_plan_progress(ff_ctx *ctx, const char *path, const ff_layer_plan *plan)
{
    int mode = (int)ff_ctx_progress_mode(ctx);
    if (plan->progress >= 0 && plan->progress != mode)
        cli_print("note: --plan %s was searched for --progress %s; this run uses --progress %s "
                  "(its options still apply; its predicted step assumed the other mode)\n",
                  path, cli_progress_name(plan->progress), cli_progress_name(mode));
}

/* --model unet-NAME: the U-Net (docs/unet.md) through the same trainer, on
 * Fashion-MNIST (or --data/--val-data IDX files); OUT/samples.png at the
 * end. The GPT's model, pipeline, MoE, pruning and plan options are refused. */
static int train_unet(train_opts *o)
{
    ff_unet_config ucfg;
    if (ff_unet_preset(o->model + 5, &ucfg) != FF_OK) {
        cli_error("--model %s: the U-Net presets are unet-tiny, unet-fmnist, unet-50m, "
                  "unet-250m, unet-500m, unet-1b, unet-2b and unet-4b",
                  o->model);
        return CLI_USAGE;
    }
    if (o->sample_steps > ucfg.timesteps) {
        cli_error("--sample-steps %ld: %s has T = %d timesteps, so 1 .. %d", o->sample_steps,
                  o->model, ucfg.timesteps, ucfg.timesteps);
        return CLI_USAGE;
    }
    if (o->layers || o->hidden || o->heads || o->vocab || o->max_seq || o->experts >= 0 ||
        o->init_from || o->mask || o->prune_to > 0 || o->samo || o->plan || o->micro != o->batch ||
        o->schedule || o->stage_layers || o->sample_tokens > 0 || !strcmp(o->run.grid, "auto")) {
        cli_error("--model %s is a U-Net: the GPT's options (--layers, --hidden, --heads, "
                  "--vocab, --max-seq, --experts, --init-from, --mask, --prune-*, --samo, --plan, "
                  "--micro-batch(es), pipelines, --sample, --grid auto) do not apply",
                  o->model);
        return CLI_USAGE;
    }
    ff_ctx *ctx;
    ff_grid *grid;
    if (cli_setup(&o->run, &ctx, &grid) != CLI_OK)
        return CLI_FAIL;
    ff_trainer_config tc;
    ff_trainer_config_default(&tc);
    tc.kind = FF_NET_UNET;
    tc.unet = ucfg;
    tc.gpt = o->gpt; /* (its precision: the trainer refuses bf16-mixed for a U-Net) */
    tc.batch = tc.micro_batch = (int)o->batch;
    tc.seq = 1;
    tc.steps = (int)o->steps;
    tc.hyper = o->hyper;
    tc.seed = (uint64_t)o->seed;
    tc.sample_steps = (int)o->sample_steps;
    tc.data = o->data;
    tc.val_data = o->data ? o->val_data : NULL;
    tc.val_every = (int)o->val_every;
    tc.val_batches = (int)o->val_batches;
    tc.out = o->out;
    tc.save_every = (int)o->save_every;
    tc.keep = (int)o->keep;
    tc.overwrite = o->overwrite;
    tc.resume_from = o->resume ? o->out : o->resume_from;
    tc.hook = print_event;
    tc.user = o;
    o->peak_name = "sgemm";
    o->rate_unit = "img/s";
    ff_trainer *t = NULL;
    int rc = ff_trainer_create(grid, &tc, &t);
    if (rc == FF_OK) {
        ff_dims s = ff_grid_shape(grid);
        cli_print("model      %s: %lldx%lld images, C0=%d, %d levels, %d blocks each, T=%d, "
                  "%zu parameters on this rank\n",
                  o->model, (long long)ucfg.image_size, (long long)ucfg.image_size, ucfg.base,
                  ucfg.levels, ucfg.nres, ucfg.timesteps, ff_unet_params_count(ff_trainer_unet(t)));
        ff_trainer_info ti;
        ff_trainer_get_info(t, &ti);
        cli_print("data       %s, validation %s\n", ti.data ? ti.data : "none",
                  ti.val_data ? ti.val_data : "none");
        cli_print("grid       %dx%dx%dx%d (X x Y x Z x D) on %d ranks; batch %ld images, %ld "
                  "steps, lr %g, fp32\n",
                  s.x, s.y, s.z, s.d, ff_ctx_size(ctx), o->batch, o->steps, o->hyper.lr);
        rc = ff_trainer_run(t);
    }
    if (rc == FF_OK && o->out) {
        char png[4300];
        long fewer = FF_UNET_SAMPLE_STEPS < ucfg.timesteps ? FF_UNET_SAMPLE_STEPS : ucfg.timesteps;
        snprintf(png, sizeof png, "%s/samples.png", o->out);
        if ((rc = ff_trainer_write_samples(t, png, (uint64_t)o->seed)) == FF_OK)
            cli_print("samples: %s (%ld DDPM samples, %ld of %d reverse steps)\n", png, o->batch,
                      o->sample_steps ? o->sample_steps : fewer, ucfg.timesteps);
    }
    if (rc)
        cli_error("%s", ff_ctx_error(ctx));
    ff_trainer_destroy(t);
    return cli_teardown(&o->run, ctx, grid, rc ? CLI_FAIL : CLI_OK);
}

int cmd_train(int argc, char **argv)
{
    train_opts o;
    defaults(&o);
    int code = parse(argc, argv, &o);
    if (code == -1) {
        cli_print("%s%s%s%s", help, help_rest, help_pipeline, cli_run_help);
        return CLI_OK;
    }
    if (code != CLI_OK)
        return code;
    if (!strncmp(o.model, "unet-", 5))
        return train_unet(&o);
    if (o.sample_steps) {
        cli_error("--sample-steps is for a U-Net's samples (--model unet-...); a GPT samples "
                  "text: --sample N");
        return CLI_USAGE;
    }
    ff_gpt_config cfg;
    if ((code = model_config(&o, &cfg)) != CLI_OK)
        return code;
    char auto_grid[64]; /* (before the AG cache's layers: it may choose Ge) */
    if (!strcmp(o.run.grid, "auto") &&
        (code = resolve_auto_grid(&o, &cfg, auto_grid, sizeof auto_grid)) != CLI_OK)
        return code;
    /* --ag-cache N: the layers of the last N blocks (four, or an MoE block's
     * QKV, projection and its local experts' two each) */
    if (o.ag_cache_blocks >= 0) {
        const int ge = o.gpt.expert_parallel > 1 ? o.gpt.expert_parallel : 1;
        o.gpt.linear.ag_cache_layers = 0;
        for (long i = 0, l = cfg.L - 1; i < o.ag_cache_blocks && i < 1 << 20; i++, l--)
            o.gpt.linear.ag_cache_layers +=
                l >= 0 && ff_gpt_block_is_moe(&cfg, (int)l) ? 2 + 2 * (cfg.experts / ge) : 4;
    }
    ff_ctx *ctx;
    ff_grid *grid;
    if (cli_setup(&o.run, &ctx, &grid) != CLI_OK)
        return CLI_FAIL;

    char val_glob[4300];
    if (o.data) {
        guess_val(&o, val_glob, sizeof val_glob);
        if (o.val_data == val_glob && !matches_everywhere(o.val_data))
            o.val_data = NULL; /* a guess that matches nothing: no validation */
    }
    ff_trainer_config tc;
    ff_trainer_config_default(&tc);
    tc.model = cfg;
    tc.gpt = o.gpt;
    tc.batch = (int)o.batch;
    tc.micro_batch = (int)o.micro;
    tc.seq = (int)o.seq;
    tc.steps = (int)o.steps;
    tc.hyper = o.hyper;
    tc.seed = (uint64_t)o.seed;
    tc.data = o.data;
    tc.val_data = o.val_data;
    tc.val_every = (int)o.val_every;
    tc.val_batches = (int)o.val_batches;
    tc.out = o.out;
    tc.save_every = (int)o.save_every;
    tc.keep = (int)o.keep;
    tc.overwrite = o.overwrite;
    tc.resume_from = o.resume ? o.out : o.resume_from;
    tc.init_from = o.init_from;
    tc.mask = o.mask;
    tc.prune.sparsity = o.prune_to;
    tc.prune.per_layer = o.prune_per_layer;
    tc.prune_every = (int)o.prune_every;
    tc.prune_steps = (int)o.prune_steps;
    tc.samo = o.samo;
    tc.hook = print_event;
    tc.user = &o;
    ff_layer_plan plan = {0};
    ff_trainer *t = NULL;
    int rc = o.plan ? read_plan(ctx, o.plan, &cfg, ff_grid_shape(grid), &plan) : FF_OK;
    tc.gpt.plan = o.plan ? &plan : NULL;
    if (rc == FF_OK)
        rc = ff_trainer_create(grid, &tc, &t);
    if (rc == FF_OK) {
        o.moe_model = ff_gpt_get_config(ff_trainer_gpt(t)).experts > 0;
        o.peak_name = ff_gpt_bf16_products(ff_trainer_gpt(t), NULL, NULL) == FF_BF16_PRODUCTS_ONEDNN
                          ? "bf16 matmul"
                          : "sgemm";
        print_settings(&o, t, grid, ff_ctx_size(ctx));
        if (o.plan)
            note_plan_progress(ctx, o.plan, &plan);
        rc = ff_trainer_run(t);
    }
    if (rc == FF_OK && o.sample_tokens > 0) {
        ff_sampler smp = {o.temperature, (int)o.top_k, (uint64_t)o.seed};
        cli_print("sample (%ld tokens, temperature %.1f, top-k %d):\n", o.sample_tokens,
                  smp.temperature, smp.top_k);
        rc = cli_generate(ff_trainer_gpt(t), NULL, 0, o.sample_tokens, &smp, 1);
    }
    if (rc)
        cli_error("%s", ff_ctx_error(ctx));
    ff_trainer_destroy(t);
    ff_layer_plan_free(&plan);
    return cli_teardown(&o.run, ctx, grid, rc ? CLI_FAIL : CLI_OK);
}
