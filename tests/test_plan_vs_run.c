/* The planner's bytes against a real training step (issue 6; docs/design.md
 * §3 and §10: what each rank counts as sent and received, per group and
 * collective, equals what the planner predicts for the same model, batch and
 * grid).
 *
 * For every grid of 8 ranks (ff_plan_grids: 20 of them) and every variant
 * below, each rank builds a small GPT, runs one warm-up step (ff_gpt_step),
 * resets every group's counters, runs one more step and compares, for each
 * of the 7 groups x 4 collectives, the counters' calls, bytes sent and bytes
 * received with ff_plan_traffic for its own coordinates and a plan
 * configuration describing the same model, batch, sequence length,
 * micro-batches, checkpointing, AG cache, overlaps and wire (fp32; one
 * variant sends the linear layers' collectives and the data-parallel
 * buckets as bf16, the rest stays fp32; the last runs a per-layer plan,
 * mixed_plan() below, with GEMM panels of PANEL rows in the run and in the
 * planner, so that decomposition cuts the few rows here into up to 4
 * chunks; three more in bf16-mixed precision, whose layers gather and
 * all-reduce activations on bf16 and reduce gradients in fp32, one of them
 * with the per-layer plan; two run ZeRO over D, --zero 1 and 2, whose
 * reduce-scatter and all-gather over D are the ring all-reduce's halves;
 * three, and the per-layer plan in half its layers, run the reduce-scatter
 * collective matmul, whose Z reduce-scatters are the plain ones).
 * Each run also compares the bytes of the parameters and gradients the
 * model holds (ff_gpt_memory) with the planner's (ff_plan_evaluate): in
 * bf16-mixed the fp32 master, a 2-byte copy of the Z-sharded weights and
 * fp32 gradients (docs/design.md §13).
 * Equality is exact: tolerance 0.
 * Rank 0 prints one line per grid and variant and, for a mismatch, every
 * differing (group, collective) of the first rank that differs.
 *
 * Run on 6 ranks instead (micro-batches of 12 sequences), it does the same
 * for the grids of 6 that divide a model whose sizes split three ways, so
 * that every group kind has 3 or 6 ranks on some grid: rec-whole's fold and
 * the other algorithms' handling of a p that is not a power of two are
 * predicted and run on X, Y and Z (the linear layers) as well as on D, ZD
 * and WORLD. The test requires a grid with a 3 in each of X, Y, Z and D.
 *
 * With the argument `moe` (8 ranks) the model's block 1 holds 8 experts,
 * top-2, with balanced routing (ff_gpt_opts.balanced_routing), which the
 * planner assumes: moe_variants below run expert parallelism (Ge = Gd, and
 * 2 where Gd is 4 or 8), DTD on and off, checkpointing with and without
 * CAC and a capacity that drops tokens, and bf16-mixed, and the counters of the model's
 * expert groups (EP, EDP) are compared too.
 *
 * Model on 8 ranks: L=2, C=64, NH=8 (whole heads for every Gx up to 8),
 * V=500 (padded 512), 24 positions, T=8, micro-batches of B=8 sequences
 * (Gz*Gd up to 8 divides them). On 6 ranks: C=96, NH=6, V=700 (padded 768 =
 * 6 x 128), micro-batches of B=12. The AG cache is given to the planner in blocks and to the
 * model in layers: c blocks are their layers in forward order (4 of a
 * dense block, 2 + 2 E/Ge of an MoE block), and every block is "every
 * layer" (-1), wte included.
 *
 * What the counters record: the collective layer's automatic choice
 * (FF_ALGO_AUTO) runs either an algorithm whose per-rank byte counts are
 * the ring's or, for an all-reduce, rec-whole, which sends lg p whole
 * vectors (ff_coll_model's strict_volume, the default). Which one depends
 * on the collective model and the nodes, so the planner is given the run's:
 * the context's model (FF_PROFILE, if set) as ff_plan_config.coll and its
 * nodes as machine.ranks_per_node (they must be blocks of consecutive
 * ranks: one node, or FF_RANKS_PER_NODE). CTest runs it on one node with
 * the default model, with FF_RANKS_PER_NODE=2 and the emulated 2x2
 * cluster's profile, and on 6 ranks with FF_RANKS_PER_NODE=3 and
 * tests/picks-nodes3.json: the default model plus measured picks (`bench
 * tune`) that move some layouts' all-reduces to rec-whole and others off
 * it, which the planner must follow (with the planner blind to the picks,
 * 56 of the 112 runs differ). The test requires some (group, collective) pair whose
 * prediction is not the ring's, so that the planner's rec-whole is
 * exercised. FF_ALGO, which forces one algorithm where AUTO would choose,
 * and FF_STRICT_VOLUME=0, which lets AUTO pick algorithms of other volumes,
 * are unset, so that the model's collectives run as a user's do by
 * default. */
#define _POSIX_C_SOURCE 200809L
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fourfold/fourfold.h"
#include "test_util.h"

/* `batch` sequences of T tokens per micro-batch, at most MAX_MICRO
 * micro-batches */
enum { MAX_GRIDS = 32, DETAIL = 2048, MAX_B = 12, T = 8, MAX_MICRO = 2 };

/* The job: 8 ranks and micro-batches of 8 sequences, or 6 ranks and 12 (set
 * in main). */
static int world, batch;

/* L C NH V Vp maxT; on 6 ranks the sizes that split three ways (set in main) */
static ff_gpt_config model_cfg = {.L = 2, .C = 64, .NH = 8, .V = 500, .Vp = 0, .maxT = 24};

typedef struct {
    const char *name;
    int micro;      /* micro-batches per step */
    int checkpoint; /* activation checkpointing */
    int ag_cache;   /* blocks; FF_PLAN_AUTO: every layer (the model's default) */
    int overlaps;   /* 1: every overlap on (the default); 0: every one off */
    int wire;       /* bytes per element of the linear layers' collectives: 4 fp32, 2 bf16 */
    int plan;       /* 1: the per-layer plan of mixed_plan() (the fields above ignored) */
    int cmm;        /* 1: the collective matmul (its forwards do not decompose) */
    /* the mixture of experts (`moe`): expert parallelism (0: Gd, the whole
     * of D; run only where it divides Gd and is more than 1), DTD,
     * CAC, the capacity factor */
    int ge, dtd, cac;
    float capacity;
    int mixed;  /* 1: bf16-mixed precision (its own wires: docs/design.md §13) */
    int zero;   /* ZeRO over D (ff_gpt_opts.zero): D's halves of the ring all-reduce */
    int rs_cmm; /* 1: the reduce-scatter collective matmul (the same Z reduce-scatters) */
    int samo;   /* 1: SAMO with samo_mask's sparsity 3/4 (docs/samo.md "SAMO with ZeRO") */
} variant;

enum { PANEL = 4 };

static const variant dense_variants[] = {
    {"plain", 1, 0, FF_PLAN_AUTO, 1, 4, 0, 0, 1, 1, 0, 0, 0, 0, 0, 0},
    {"2 micro-batches", 2, 0, FF_PLAN_AUTO, 1, 4, 0, 0, 1, 1, 0, 0, 0, 0, 0, 0},
    {"checkpointing", 1, 1, FF_PLAN_AUTO, 1, 4, 0, 0, 1, 1, 0, 0, 0, 0, 0, 0},
    {"checkpointing, AG cache 1, 2 micro", 2, 1, 1, 1, 4, 0, 0, 1, 1, 0, 0, 0, 0, 0, 0},
    {"checkpointing, no AG cache", 1, 1, 0, 1, 4, 0, 0, 1, 1, 0, 0, 0, 0, 0, 0},
    {"no AG cache, overlaps off", 1, 0, 0, 0, 4, 0, 0, 1, 1, 0, 0, 0, 0, 0, 0},
    {"bf16 wire", 1, 0, FF_PLAN_AUTO, 1, 2, 0, 0, 1, 1, 0, 0, 0, 0, 0, 0},
    {"checkpointing, CAC, AG cache 1", 1, 1, 1, 1, 4, 0, 0, 1, 1, 1, 0, 0, 0, 0, 0},
    {"per-layer plan, 2 micro", 2, 0, FF_PLAN_AUTO, 1, 4, 1, 0, 1, 1, 0, 0, 0, 0, 0, 0},
    {"per-layer plan, collective matmul", 1, 0, FF_PLAN_AUTO, 1, 4, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0},
    {"bf16-mixed", 1, 0, FF_PLAN_AUTO, 1, 4, 0, 0, 1, 1, 0, 0, 1, 0, 0, 0},
    {"bf16-mixed, checkpointing, AG cache 1, 2 micro, rs-cmm", 2, 1, 1, 1, 4, 0, 0, 1, 1, 0, 0, 1,
     0, 1, 0},
    {"bf16-mixed, per-layer plan", 1, 0, FF_PLAN_AUTO, 1, 4, 1, 0, 1, 1, 0, 0, 1, 0, 0, 0},
    {"zero 1", 1, 0, FF_PLAN_AUTO, 1, 4, 0, 0, 1, 1, 0, 0, 0, 1, 0, 0},
    {"zero 2, 2 micro, overlaps off, rs-cmm", 2, 0, FF_PLAN_AUTO, 0, 4, 0, 0, 1, 1, 0, 0, 0, 2, 1,
     0},
    {"bf16-mixed, zero 1", 1, 0, FF_PLAN_AUTO, 1, 4, 0, 0, 1, 1, 0, 0, 1, 1, 0, 0},
    {"samo, zero 1", 1, 0, FF_PLAN_AUTO, 1, 4, 0, 0, 1, 1, 0, 0, 0, 1, 0, 1},
    {"bf16-mixed, samo, zero 2", 1, 0, FF_PLAN_AUTO, 1, 4, 0, 0, 1, 1, 0, 0, 1, 2, 0, 1},
};

/* The MoE model (`moe`): block 1 of 2 holds E = 8 experts, top-2 routing,
 * balanced (each expert gets 2 tokens of every sequence of 8); capacity
 * factor 1 keeps them all, 0.5 one of the two. Expert parallelism runs
 * DTD where Gx > 1 (one variant without); the CAC variant keeps the
 * collectives' outputs of the checkpointed blocks. */
static const variant moe_variants[] = {
    {"moe", 1, 0, FF_PLAN_AUTO, 1, 4, 0, 0, 1, 1, 0, 1.0f, 0, 0, 0, 0},
    {"moe, 2 micro, checkpointing, rs-cmm", 2, 1, FF_PLAN_AUTO, 1, 4, 0, 0, 1, 1, 0, 1.0f, 0, 0, 1,
     0},
    {"moe, EP=Gd", 1, 0, FF_PLAN_AUTO, 1, 4, 0, 0, 0, 1, 0, 1.0f, 0, 0, 0, 0},
    {"moe, EP=2", 1, 0, FF_PLAN_AUTO, 1, 4, 0, 0, 2, 1, 0, 1.0f, 0, 0, 0, 0},
    {"moe, EP=Gd, DTD off, bf16 wire", 1, 0, FF_PLAN_AUTO, 1, 2, 0, 0, 0, 0, 0, 1.0f, 0, 0, 0, 0},
    {"moe, EP=Gd, checkpointing", 1, 1, FF_PLAN_AUTO, 1, 4, 0, 0, 0, 1, 0, 1.0f, 0, 0, 0, 0},
    {"moe, EP=Gd, checkpointing, CAC, no AG cache", 1, 1, 0, 1, 4, 0, 0, 0, 1, 1, 1.0f, 0, 0, 0, 0},
    {"moe, EP=Gd, checkpointing, AG cache 1", 1, 1, 1, 1, 4, 0, 0, 0, 1, 0, 1.0f, 0, 0, 0, 0},
    {"moe, EP=Gd, F 0.5, 2 micro, overlaps off, no AG cache", 2, 0, 0, 0, 4, 0, 0, 0, 1, 0, 0.5f, 0,
     0, 0, 0},
    {"moe, EP=Gd, checkpointing, bf16-mixed", 1, 1, FF_PLAN_AUTO, 1, 4, 0, 0, 0, 1, 0, 1.0f, 1, 0,
     0, 0},
    {"moe, zero 1", 1, 0, FF_PLAN_AUTO, 1, 4, 0, 0, 1, 1, 0, 1.0f, 0, 1, 0, 0},
    {"moe, EP=2, zero 2, overlaps off", 1, 0, FF_PLAN_AUTO, 0, 4, 0, 0, 2, 1, 0, 1.0f, 0, 2, 0, 0},
};

static const variant *variants = dense_variants;
static int n_variants = (int)(sizeof dense_variants / sizeof dense_variants[0]);

/* A per-layer plan that mixes every option: checkpointing in block 0,
 * decomposition 0, 2, 3 and 4 (cut at panels of PANEL rows), each overlap
 * switch and the AG cache off somewhere (the LM head's OAG and AG cache
 * too), one layer on bf16; for the grid being run (set before each grid). */
static ff_block_opts mixed_blocks[8];
static ff_layer_plan mixed = {.blocks = mixed_blocks};

static void mixed_plan(ff_dims grid)
{
    mixed.layers = model_cfg.L, mixed.heads = model_cfg.NH;
    mixed.hidden = model_cfg.C, mixed.vocab = model_cfg.V;
    mixed.grid = grid;
    mixed.panel_rows = PANEL; /* the run takes its panels from the plan */
    ff_layer_opts o = {
        .decompose = 3, .oar = 1, .ors = 1, .oag = 1, .ag_cache = 1, .wire_bytes = 4};
    mixed.head = o;
    mixed.head.oag = mixed.head.ag_cache = 0; /* the LM head gathers wte at its use */
    for (int l = 0; l < model_cfg.L; l++) {
        mixed.blocks[l].checkpoint = l == 0;
        for (int i = 0; i < FF_BLOCK_LAYERS; i++) {
            ff_layer_opts *x = &mixed.blocks[l].layer[i];
            *x = o;
            x->decompose = (int[]){0, 2, 3, 4}[(l + i) % 4];
            x->oar = i != 0, x->ors = i != 1, x->oag = i != 2, x->ag_cache = l != 1 || i == 3;
            x->wire_bytes = l == 1 && i == 2 ? 2 : 4;
            x->rs_cmm = (l + i) % 2;
        }
    }
}

static const char *const coll_names[FF_NCOLL] = {"all-gather", "reduce-scatter", "all-reduce",
                                                 "all-to-all"};

/* What one rank found, gathered to rank 0. */
typedef struct {
    int mismatches;          /* (group, collective) pairs that differ */
    int not_ring;            /* pairs whose prediction is not the ring's volume */
    int with_traffic;        /* pairs with at least one call, measured */
    unsigned long long sent; /* bytes sent, measured, every pair */
    char detail[DETAIL];     /* the differing pairs, one per line */
} rank_report;

static void model_opts(const variant *v, int ge, ff_gpt_opts *o)
{
    ff_gpt_opts_default(o);
    o->checkpoint = v->checkpoint;
    o->expert_parallel = ge;
    /* blocks -> layers: the last c blocks' layers in forward order (after
     * wte, layer 0): four of a dense block, 2 + 2 E/Ge of an MoE block */
    o->linear.ag_cache_layers = 0;
    for (int l = model_cfg.L - 1; l >= model_cfg.L - v->ag_cache && l >= 0; l--)
        o->linear.ag_cache_layers +=
            ff_gpt_block_is_moe(&model_cfg, l) ? 2 + 2 * model_cfg.experts / ge : 4;
    if (v->ag_cache == FF_PLAN_AUTO || v->ag_cache >= model_cfg.L)
        o->linear.ag_cache_layers = -1;
    if (!v->overlaps) {
        o->linear.oar = o->linear.ors = o->linear.oag = 0;
        o->dp_overlap = 0;
    }
    o->linear.coll.wire = v->wire == 2 ? FF_WIRE_BF16 : FF_WIRE_FP32;
    o->plan = v->plan ? &mixed : NULL;
    o->linear.cmm = v->cmm;
    o->linear.rs_cmm = v->rs_cmm;
    o->dtd = v->dtd;
    o->cac = v->cac;
    o->balanced_routing = 1;
    o->precision = v->mixed ? FF_PRECISION_BF16_MIXED : FF_PRECISION_FP32;
    o->zero = v->zero;
}

/* The variant's expert parallelism on a grid of Gd (0: not run there). */
static int ge_of(const variant *v, int gd)
{
    if (!model_cfg.experts)
        return 1;
    int ge = v->ge ? v->ge : gd;
    if (ge == 1)
        return v->ge == 1 ? 1 : 0; /* (EP=Gd on Gd = 1 is the plain variant) */
    return gd % ge == 0 && (v->ge != 2 || gd > 2) ? ge : 0;
}

/* The run's collective model and ranks per node (set in main). */
static ff_coll_model run_model;
static int run_per_node;

static void plan_config(const variant *v, ff_plan_config *pc)
{
    ff_plan_config_default(pc);
    pc->coll = run_model;
    pc->machine.ranks_per_node = run_per_node;
    snprintf(pc->model.name, sizeof pc->model.name, "test");
    pc->model.layers = model_cfg.L;
    pc->model.heads = model_cfg.NH;
    pc->model.hidden = model_cfg.C;
    pc->model.vocab = model_cfg.V;
    pc->model.max_seq = model_cfg.maxT;
    pc->batch = (int64_t)batch * v->micro; /* the step's global batch */
    pc->seq = T;
    pc->ranks = world;
    pc->micro_batches = v->micro;
    pc->checkpoint = v->checkpoint;
    pc->ag_cache = v->ag_cache == FF_PLAN_AUTO ? model_cfg.L : v->ag_cache;
    pc->wire_bytes = v->wire;
    pc->overlap = v->overlaps ? FF_OVERLAP_ALL : 0;
    pc->layers = v->plan ? &mixed : NULL;
    pc->cmm = v->cmm;
    pc->rs_cmm = v->rs_cmm;
    pc->model.experts = model_cfg.experts;
    pc->model.expert_every = model_cfg.expert_every;
    pc->model.top_k = model_cfg.top_k;
    pc->model.capacity_factor = v->capacity;
    pc->dtd = v->dtd;
    pc->cac = v->cac;
    pc->precision = v->mixed ? FF_PLAN_BF16_MIXED : FF_PLAN_FP32;
    pc->zero = v->zero;
    pc->sparsity = v->samo ? 0.75 : 0;
    pc->samo = v->samo;
}

/* Canonical offset of tensor `name`. */
static size_t tensor_off(ff_gpt *g, const char *name)
{
    size_t off = 0;
    for (int i = 0; i < FF_GPT_NTENSORS && strcmp(ff_gpt_tensor_name(i), name); i++)
        off += ff_gpt_tensor_size(g, i);
    return off;
}

/* The SAMO variants' mask, sparsity 3/4: of each block matrix's shard on
 * each rank every fourth entry kept (shard offsets 0, 4, 8, ...), wte kept
 * whole, so that every bucket keeps round(f x shard) entries as the
 * planner counts them (each layer's shard is a multiple of 4 here); each
 * rank marks its shards' pruned canonical entries, a MAX over the world
 * joins them (every replica marks the same). Then SAMO. */
static int samo_mask(ff_gpt *g)
{
    const size_t n = ff_gpt_canonical_size(g), C = (size_t)model_cfg.C;
    unsigned char *pruned = calloc(n, 1), *keep = malloc(n);
    ff_linear_seq *sq = ff_gpt_linear_seq(g);
    for (int i = 0; pruned && ff_linear_seq_layer(sq, i); i++) {
        ff_linear *l = ff_linear_seq_layer(sq, i);
        int blk = 0;
        char what[16] = "";
        if (sscanf(ff_linear_name(l), "h%d.%15s", &blk, what) != 2)
            continue; /* (wte) */
        const size_t base = !strcmp(what, "qkv")       ? tensor_off(g, "qkvw") + blk * 3 * C * C
                            : !strcmp(what, "attproj") ? tensor_off(g, "attprojw") + blk * C * C
                            : !strcmp(what, "fc")      ? tensor_off(g, "fcw") + blk * 4 * C * C
                                                       : tensor_off(g, "fcprojw") + blk * 4 * C * C;
        for (size_t x = 0; x < ff_linear_local_sizes(l).w_shard; x++)
            pruned[base + (size_t)ff_linear_canonical_index(l, x)] = x % 4 != 0;
    }
    MPI_Allreduce(MPI_IN_PLACE, pruned, (int)n, MPI_UNSIGNED_CHAR, MPI_MAX, MPI_COMM_WORLD);
    for (size_t i = 0; keep && pruned && i < n; i++)
        keep[i] = !pruned[i];
    int rc = ff_gpt_set_mask(g, keep, 0);
    if (rc == FF_OK)
        rc = ff_gpt_samo(g);
    free(pruned), free(keep);
    return rc;
}

/* This rank's tokens for one step: n_micro micro-batches of its sequences. */
static void fill_tokens(ff_gpt *g, int micro, int32_t *tok, int32_t *tgt)
{
    int first, count;
    ff_gpt_local_sequences(g, &first, &count);
    size_t k = 0;
    for (int u = 0; u < micro; u++)
        for (int s = 0; s < count; s++)
            for (int t = 0; t < T; t++, k++) {
                int64_t seq = (int64_t)u * batch + first + s;
                tok[k] = (int32_t)((seq * 131 + t * 17) % model_cfg.V);
                tgt[k] = (int32_t)((seq * 131 + (t + 1) * 17) % model_cfg.V);
            }
}

/* An error here leaves the other ranks in a collective: report and abort. */
static void die(ff_ctx *ctx, const char *what, int rc)
{
    fprintf(stderr, "%s failed (%d): %s\n", what, rc, ctx ? ff_ctx_error(ctx) : ff_strerror(rc));
    MPI_Abort(MPI_COMM_WORLD, 1);
}

static void step(ff_ctx *ctx, ff_gpt *g, int micro, int index)
{
    int32_t tok[MAX_MICRO * MAX_B * T], tgt[MAX_MICRO * MAX_B * T]; /* a rank holds <= batch */
    fill_tokens(g, micro, tok, tgt);
    ff_adamw h;
    ff_adamw_default(&h);
    h.lr = 1e-4f;
    h.steps = 2;
    ff_gpt_step_info info;
    int rc = ff_gpt_step(g, tok, tgt, micro, &h, index, &info);
    if (rc == FF_OK) /* (ZeRO's gathers over D: this step's bytes alone) */
        rc = ff_gpt_sync(g);
    if (rc)
        die(ctx, "ff_gpt_step", rc);
}

/* Compares this rank's counters with the planner's prediction. */
/* The group of the planner's kind k on this rank: the grid's, or the
 * model's expert groups (NULL without expert parallelism: EP is then one
 * rank and the experts' replicas are all of D, counted there). */
static ff_group *group_of(ff_grid *grid, const ff_gpt *g, int k)
{
    if (k < FF_NGROUPS)
        return ff_grid_group(grid, (ff_group_kind)k);
    return ff_gpt_expert_group(g, 0) ? ff_gpt_expert_group(g, k == FF_PLAN_GROUP_EDP) : NULL;
}

static void compare(ff_grid *grid, const ff_gpt *g, const variant *v, rank_report *rep)
{
    memset(rep, 0, sizeof *rep);
    ff_dims shape = ff_grid_shape(grid), me = ff_grid_coords(grid);
    ff_plan_config pc;
    plan_config(v, &pc);
    pc.expert_parallel = ge_of(v, shape.d);
    ff_plan_coll want[FF_PLAN_NGROUPS][FF_NCOLL];
    char err[256];
    size_t used = 0;
    int rc = ff_plan_traffic(&pc, shape, me, want, err, sizeof err);
    /* the same with a model in which rec-whole never wins (no latency, one
     * bandwidth, free additions: its lg p whole vectors against the ring's
     * 2(p-1)/p; tests/test_plan_bytes.c), for not_ring */
    ff_plan_coll ring[FF_PLAN_NGROUPS][FF_NCOLL];
    pc.coll.alpha_intra_s = pc.coll.alpha_inter_s = 0;
    pc.coll.small_max_intra_B = pc.coll.small_max_inter_B = 0;
    pc.coll.beta_intra_Bps = pc.coll.beta_inter_Bps;
    pc.coll.reduce_Bps = 0;
    if (rc == FF_OK)
        rc = ff_plan_traffic(&pc, shape, me, ring, err, sizeof err);
    if (rc != FF_OK) {
        rep->mismatches = 1;
        snprintf(rep->detail, sizeof rep->detail, "    ff_plan_traffic: %s\n", err);
        return;
    }
    for (int k = 0; k < FF_PLAN_NGROUPS; k++)
        for (int c = 0; c < FF_NCOLL; c++) {
            ff_group *gr = group_of(grid, g, k);
            ff_counters got = {0};
            if (gr)
                got = ff_group_counters(gr, (ff_coll)c);
            const ff_plan_coll *w = &want[k][c];
            rep->not_ring += w->bytes_sent != ring[k][c].bytes_sent;
            rep->with_traffic += got.calls > 0;
            rep->sent += got.bytes_sent;
            if (got.calls == w->calls && got.bytes_sent == w->bytes_sent &&
                got.bytes_recv == w->bytes_recv)
                continue;
            rep->mismatches++;
            if (used < sizeof rep->detail)
                used += (size_t)snprintf(
                    rep->detail + used, sizeof rep->detail - used,
                    "    %-5s %-14s predicted %4llu calls %9llu B sent %9llu B received; "
                    "measured %4llu calls %9llu B sent %9llu B received\n",
                    k == FF_PLAN_GROUP_EP    ? "EP"
                    : k == FF_PLAN_GROUP_EDP ? "EDP"
                                             : ff_group_kind_name((ff_group_kind)k),
                    coll_names[c], (unsigned long long)w->calls, (unsigned long long)w->bytes_sent,
                    (unsigned long long)w->bytes_recv, (unsigned long long)got.calls,
                    (unsigned long long)got.bytes_sent, (unsigned long long)got.bytes_recv);
        }
    /* the memory of parameters and gradients (bf16-mixed: the fp32 master
     * and gradients, the 2-byte copy of the Z-sharded weights) as the model
     * holds it, exactly */
    plan_config(v, &pc);
    pc.expert_parallel = ge_of(v, shape.d);
    ff_plan_result pr;
    ff_gpt_memory mem;
    ff_gpt_memory_report(g, &mem);
    rc = ff_plan_evaluate(&pc, shape, &pr, err, sizeof err);
    if (rc != FF_OK || pr.mem_params != (double)mem.params || pr.mem_grads != (double)mem.grads)
        rep->mismatches++;
    if ((rc != FF_OK || pr.mem_params != (double)mem.params || pr.mem_grads != (double)mem.grads) &&
        used < sizeof rep->detail)
        used += (size_t)snprintf(rep->detail + used, sizeof rep->detail - used,
                                 "    memory: predicted parameters %.0f B, gradients %.0f B; the "
                                 "model's %zu B, %zu B %s\n",
                                 pr.mem_params, pr.mem_grads, mem.params, mem.grads,
                                 rc == FF_OK ? "" : err);
    /* a sanity check that does not go through the planner: one gradient
     * norm per step over the world */
    ff_counters norm = ff_group_counters(ff_grid_group(grid, FF_GROUP_WORLD), FF_COLL_ALLREDUCE);
    CHECK(norm.calls == 1, "%dx%dx%dx%d %s: %llu world all-reduces, want 1 (the norm)", shape.x,
          shape.y, shape.z, shape.d, v->name, (unsigned long long)norm.calls);
}

/* Gathers the reports to rank 0, which prints the grid's line. Returns the
 * number of ranks that differ; adds the pairs predicted as rec-whole to
 * *not_ring. */
static int report(ff_grid *grid, const variant *v, const rank_report *mine, rank_report *all,
                  long *not_ring)
{
    MPI_Gather(mine, (int)sizeof *mine, MPI_BYTE, all, (int)sizeof *mine, MPI_BYTE, 0,
               MPI_COMM_WORLD);
    int rank, bad = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    if (rank != 0)
        return 0;
    ff_dims s = ff_grid_shape(grid);
    unsigned long long sent = 0;
    int first_bad = -1, pairs = 0;
    for (int r = 0; r < world; r++) {
        sent += all[r].sent;
        *not_ring += all[r].not_ring;
        pairs += all[r].with_traffic;
        if (all[r].mismatches) {
            bad++;
            if (first_bad < 0)
                first_bad = r;
        }
    }
    char gname[32];
    snprintf(gname, sizeof gname, "%dx%dx%dx%d", s.x, s.y, s.z, s.d);
    printf("%-8s %-35s %3d (group, coll) pairs compared (%3d with traffic) %10llu B sent  %s\n",
           gname, v->name, world * FF_PLAN_NGROUPS * FF_NCOLL, pairs, sent, bad ? "FAIL" : "PASS");
    if (bad) {
        ff_dims c = ff_grid_coords_of(s, first_bad);
        printf("  %d of %d ranks differ; rank %d (%d,%d,%d,%d), %d pairs:\n%s", bad, world,
               first_bad, c.x, c.y, c.z, c.d, all[first_bad].mismatches, all[first_bad].detail);
    }
    fflush(stdout);
    return bad;
}

int main(int argc, char **argv)
{
    int provided, rank, size;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    world = size;
    batch = size == 8 ? 8 : 12;
    if (size == 6)
        model_cfg = (ff_gpt_config){.L = 2, .C = 96, .NH = 6, .V = 700, .Vp = 0, .maxT = 24};
    const int moe = argc > 1 && !strcmp(argv[1], "moe");
    if (moe) { /* block 1 of 2: 8 experts, top-2 (the capacity per variant) */
        ff_gpt_config_moe(&model_cfg, 8);
        model_cfg.top_k = 2;
        variants = moe_variants;
        n_variants = (int)(sizeof moe_variants / sizeof moe_variants[0]);
    }
    /* `nosamo` (the sanitizer build): without the two SAMO variants, the last */
    if (!moe && argc > 1 && !strcmp(argv[argc - 1], "nosamo"))
        n_variants -= 2;
    if (size != 8 && size != 6) {
        if (rank == 0)
            fprintf(stderr, "test_plan_vs_run: run under mpirun -np 8 or 6 (got %d)\n", size);
        MPI_Finalize();
        return 2;
    }
    const char *forced = getenv("FF_ALGO");
    if (forced && *forced && strcmp(forced, "auto") != 0) {
        if (rank == 0)
            printf("FF_ALGO=%s unset: the planner predicts the automatic choice\n", forced);
        unsetenv("FF_ALGO");
    }
    const char *sv = getenv("FF_STRICT_VOLUME");
    if (sv && *sv) {
        if (rank == 0)
            printf("FF_STRICT_VOLUME=%s unset: the planner predicts the default rule\n", sv);
        unsetenv("FF_STRICT_VOLUME");
    }
    ff_ctx *ctx;
    int rc = ff_ctx_create(&ctx, MPI_COMM_WORLD, NULL);
    if (rc)
        die(ctx, "ff_ctx_create", rc);
    /* the nodes as the planner describes them: blocks of consecutive ranks */
    ff_ctx_coll_model(ctx, &run_model);
    run_per_node = world / ff_ctx_nodes(ctx);
    int blocks = world % ff_ctx_nodes(ctx) == 0;
    for (int r = 0; r < world; r++)
        blocks &= ff_ctx_node_of(ctx, r) == r / run_per_node;
    if (!blocks) {
        if (rank == 0)
            fprintf(stderr,
                    "test_plan_vs_run: the %d nodes are not blocks of consecutive ranks; "
                    "the planner cannot describe them\n",
                    ff_ctx_nodes(ctx));
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    ff_dims grids[MAX_GRIDS];
    int n_grids = (int)ff_plan_grids(world, grids, MAX_GRIDS);
    CHECK(n_grids == (world == 8 ? 20 : 16), "ff_plan_grids(%d): %d grids, want %d", world, n_grids,
          world == 8 ? 20 : 16);
    if (rank == 0)
        printf("model L=%d C=%d NH=%d V=%d (padded %d) maxT=%d, %d experts (top-%d, balanced) "
               "in every %d-th block; micro-batches of B=%d x T=%d; "
               "fp32 wire (bf16 where named); %d grids of %d ranks x %d variants; tolerance: "
               "exact\nnodes: %d of %d ranks; collective model: %s (alpha intra %.3g s, inter "
               "%.3g s)\n",
               model_cfg.L, model_cfg.C, model_cfg.NH, model_cfg.V, (model_cfg.V + 127) / 128 * 128,
               model_cfg.maxT, model_cfg.experts, model_cfg.top_k, model_cfg.expert_every, batch, T,
               n_grids, world, n_variants, world / run_per_node, run_per_node,
               getenv("FF_PROFILE") ? getenv("FF_PROFILE") : "the default", run_model.alpha_intra_s,
               run_model.alpha_inter_s);
    rank_report mine, *all = rank == 0 ? malloc((size_t)world * sizeof *all) : NULL;
    double t0 = MPI_Wtime();
    int failed = 0, runs = 0, skipped = 0;
    long not_ring = 0;
    int threes[4] = {0, 0, 0, 0}; /* grids run with a 3 in X, Y, Z, D */
    for (int i = 0; i < n_grids; i++) {
        /* grids whose sizes do not divide the model are skipped (on 8
         * ranks none; on 6, those the planner refuses) */
        ff_plan_config pc;
        plan_config(&variants[0], &pc);
        ff_plan_coll probe[FF_PLAN_NGROUPS][FF_NCOLL];
        char why[256];
        if (ff_plan_traffic(&pc, grids[i], (ff_dims){0, 0, 0, 0}, probe, why, sizeof why) ==
            FF_EDIVIDE) {
            skipped++;
            continue;
        }
        threes[0] += grids[i].x % 3 == 0, threes[1] += grids[i].y % 3 == 0;
        threes[2] += grids[i].z % 3 == 0, threes[3] += grids[i].d % 3 == 0;
        ff_grid *grid;
        if ((rc = ff_grid_create(ctx, grids[i], &grid)))
            die(ctx, "ff_grid_create", rc);
        ff_gpt *g = NULL;
        mixed_plan(grids[i]);
        const variant *prev = NULL;
        for (int v = 0; v < n_variants; v++) {
            const variant *va = &variants[v];
            const int ge = ge_of(va, grids[i].d);
            if (!ge)
                continue; /* (this expert parallelism does not apply here) */
            /* a new model where the options change; its first step warms up */
            int fresh = !g || va->checkpoint != prev->checkpoint ||
                        va->ag_cache != prev->ag_cache || va->overlaps != prev->overlaps ||
                        va->wire != prev->wire || va->plan != prev->plan || va->cmm != prev->cmm ||
                        ge != ge_of(prev, grids[i].d) || va->dtd != prev->dtd ||
                        va->cac != prev->cac || va->capacity != prev->capacity ||
                        va->mixed != prev->mixed || va->samo != prev->samo;
            prev = va;
            if (fresh) {
                ff_gpt_destroy(g);
                ff_gpt_opts o;
                model_opts(va, ge, &o);
                model_cfg.capacity_factor = va->capacity;
                if ((rc = ff_gpt_create(grid, &model_cfg, &o, batch, T, &g)) ||
                    (rc = ff_gpt_init(g, 1234)) || (va->samo && (rc = samo_mask(g))))
                    die(ctx, "creating the model", rc);
                step(ctx, g, va->micro, 0);
            }
            for (int k = 0; k < FF_PLAN_NGROUPS; k++)
                if (group_of(grid, g, k))
                    ff_group_counters_reset(group_of(grid, g, k));
            step(ctx, g, va->micro, 1);
            compare(grid, g, va, &mine);
            int bad = report(grid, va, &mine, all, &not_ring);
            test_failures += mine.mismatches > 0; /* rank 0 printed the differences */
            failed += bad > 0;
            runs++;
        }
        ff_gpt_destroy(g);
        ff_grid_destroy(grid);
    }
    if (rank == 0) {
        printf("%d of %d runs (grid, variant) equal the planner exactly (%d grids that do not "
               "divide the model skipped); %.1f s\n",
               runs - failed, runs, skipped, MPI_Wtime() - t0);
        printf("(rank, group, collective) triples whose prediction is rec-whole's volume, not "
               "the ring's: %ld\n",
               not_ring);
        CHECK(not_ring > 0, "no prediction differs from the ring's: rec-whole was not exercised");
        /* every grid and variant; with experts: the 20 grids run "moe",
         * "moe, 2 micro, checkpointing" and "moe, zero 1" (60), the 10 with
         * Gd > 1 the seven EP=Gd variants (70), the 4 with Gd = 4 or 8 the
         * two EP=2 ones (8) */
        CHECK(runs == (moe ? 138 : (n_grids - skipped) * n_variants), "%d runs", runs);
        if (world == 6)
            CHECK(threes[0] && threes[1] && threes[2] && threes[3],
                  "grids run with a 3 in X, Y, Z, D: %d, %d, %d, %d; want each > 0", threes[0],
                  threes[1], threes[2], threes[3]);
    }
    free(all);
    ff_ctx_destroy(ctx);
    int code = test_finish("plan_vs_run");
    MPI_Finalize();
    return code;
}
