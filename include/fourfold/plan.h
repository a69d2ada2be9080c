/* The planner (docs/design.md §6, docs/planner.md): a performance model of one
 * training step of fourfold's GPT on a 4D grid, the enumeration of every grid
 * (Gx, Gy, Gz, Gd) of a rank count, machine profiles, and two reference cost
 * models from the literature.
 *
 * Pure computation: nothing here calls MPI, so a program may plan without
 * MPI_Init. There is no context before MPI, so functions that take no handle
 * return 0 or a negative FF_E* code and write one sentence into a caller's
 * buffer (err, err_len); a plan handle keeps its own message (ff_plan_error).
 *
 * Thread-safety: no shared state; distinct handles may be used concurrently. */
#ifndef FOURFOLD_PLAN_H
#define FOURFOLD_PLAN_H

#include <stddef.h>
#include <stdint.h>

#include "fourfold/comm.h"      /* ff_coll, FF_NCOLL */
#include "fourfold/grid.h"      /* ff_dims, ff_group_kind, FF_NGROUPS */
#include "fourfold/layerplan.h" /* ff_layer_plan */
#include "fourfold/unet.h"      /* ff_unet_config */

#ifdef __cplusplus
extern "C" {
#endif

/* ---- models ---------------------------------------------------------------- */

/* The kinds of model the planner knows (docs/planner.md, "The U-Net"). */
typedef enum { FF_MODEL_GPT = 0, FF_MODEL_UNET = 1 } ff_model_kind;

/* A GPT-2 shaped model (docs/design.md §4), or with kind FF_MODEL_UNET the
 * U-Net of `unet` (include/fourfold/unet.h; the GPT's fields unused, the
 * plan's batch in images, its seq unused). */
typedef struct {
    char name[32];
    ff_model_kind kind;
    ff_unet_config unet;
    int layers;      /* L, transformer blocks */
    int heads;       /* NH */
    int64_t hidden;  /* C */
    int64_t vocab;   /* V; the program pads it to a multiple of 128 */
    int64_t max_seq; /* rows of the position table; 0: the planned sequence length */
    /* A mixture of experts (docs/moe.md; experts 0: dense): the MLP of
     * block l is E experts when (l + 1) % expert_every == 0, top_k 1 or 2
     * of them per token, capacity_factor F (ceil(F k T / E) tokens per
     * expert and sequence). */
    int experts, expert_every, top_k;
    double capacity_factor;
} ff_model;

/* Presets: gpt-5b ... gpt-640b (table 5.1 of the dissertation), gpt2,
 * gpt2-medium, gpt2-large, gpt2-xl (also gpt2-124m, -350m, -774m, -1558m),
 * tiny, mini and mini-moe (mini with 4 experts in every second block);
 * U-Nets: unet-NAME for each of ff_unet_preset's names (unet-tiny,
 * unet-fmnist, unet-50m, unet-250m, unet-500m, unet-1b, unet-2b, unet-4b).
 * Returns FF_EINVAL (message listing the names) if unknown. */
int ff_model_preset(const char *name, ff_model *out, char *err, size_t err_len);
/* Makes m a mixture of E experts with the training program's defaults
 * (ff_gpt_config_moe: every second block, top-1, capacity factor 1.25). */
void ff_model_moe(ff_model *m, int E);
/* 1 if block l of m is a mixture of experts. */
int ff_model_block_is_moe(const ff_model *m, int l);
/* The i-th preset name, or NULL past the end. */
const char *ff_model_preset_name(size_t i);
/* Checks sizes (positive, C divisible by NH, no overflow). */
int ff_model_check(const ff_model *m, char *err, size_t err_len);
/* V rounded up to a multiple of 128, as llm.c pads it. */
int64_t ff_model_padded_vocab(const ff_model *m);
/* Parameters of the model (with the padded vocabulary and `seq` positions
 * when max_seq is 0, every expert); the N of the 6*N*tokens formula
 * excludes positions and counts the top_k experts a token runs through
 * (and the routers). */
int64_t ff_model_params(const ff_model *m, int64_t seq);
/* Model FLOPs of one training step of the U-Net c on `batch` images (the
 * trainer's step report and the planner's): every convolution's and linear
 * layer's products (2 k n per pixel row forward, twice that backward, once
 * without an input gradient: conv_in, temb.lin1) and the attention's. */
double ff_plan_unet_flops(const ff_unet_config *c, int64_t batch);
int64_t ff_model_matmul_params(const ff_model *m);
/* The minimum tensor-parallel degree AxoNN's tool requires for a preset of
 * the paper (gpt-20b: 16, ...); 1 for other models. */
int ff_model_axonn_min_tp(const ff_model *m);

/* ---- machine profiles ------------------------------------------------------ */

enum { FF_PROFILE_MAX_BW = 64 };

/* A measured intra-node bandwidth: groups of `size` ranks whose members are
 * `inner` ranks apart (the product of the sizes of the groups nested inside). */
typedef struct {
    int inner, size;
    double Bps;
} ff_intra_bw;

/* Which of AxoNN's published bandwidth tables a machine has (presets only). */
typedef enum {
    FF_AXONN_TABLE_NONE = 0,
    FF_AXONN_TABLE_PERLMUTTER,
    FF_AXONN_TABLE_FRONTIER
} ff_axonn_table;

typedef struct {
    char name[64];
    int ranks_per_node;
    double memory_bytes; /* available to one rank */
    double gemm_flops;   /* sustained GEMM rate of one rank, large shapes */
    double peak_flops;   /* advertised (or empirical) peak of one rank */
    double alpha_intra_s, beta_intra_Bps;
    double alpha_inter_s, beta_inter_Bps; /* beta_inter: one node's injection bandwidth */
    int n_intra_bw;
    ff_intra_bw intra_bw[FF_PROFILE_MAX_BW];
    /* optional keys, the planner's own (defaults in docs/planner.md) */
    double mem_Bps;       /* memory bandwidth of one rank, for elementwise work */
    double gemm_half_dim; /* h in the GEMM efficiency 1/(1 + h/m + h/n + h/k) */
    double gemm_call_s;   /* fixed time of one GEMM call (launch, tail), 0 on a CPU */
    int cores_per_node;   /* 0: a rank never shares a core; else ranks share cores */
    double intra_overlap; /* 1: intra-node transfers run beside compute; 0: they are CPU copies */
    /* 1: attention is one fused kernel whose scores never leave the chip
     * (FlashAttention): no passes over the T x T scores in memory, and only
     * a row's log-sum-exp kept for the backward. 0: the scores are written
     * and kept, as fourfold's CPU engine does. */
    int attention_fused;
    ff_axonn_table axonn_table;
    /* the number formats the machine's runs train in, what ff_plan_config's
     * automatic precision plans for: FF_PLAN_FP32 (0, a CPU like this
     * one, fourfold's own training) or FF_PLAN_BF16_MIXED (the GPU
     * presets, as the papers' runs) */
    int precision;
} ff_profile;

/* Presets: perlmutter, frontier, alps, this (this machine; docs/planner.md
 * says where each number comes from). FF_EINVAL if unknown. */
int ff_profile_preset(const char *name, ff_profile *out, char *err, size_t err_len);
const char *ff_profile_preset_name(size_t i);
/* Parses a profile (JSON, format "fourfold-profile", version 1; schema in
 * docs/planner.md) for the planner. `source` names the text in messages (a
 * file name). FF_ECORRUPT on malformed JSON, FF_EINVAL on a missing,
 * duplicated or out-of-range key. One parser reads every profile: the keys
 * the planner does not use (the collective model's, "picks", "fit") are
 * checked as strictly and ignored here; unknown keys are ignored. */
int ff_profile_parse(const char *text, size_t len, const char *source, ff_profile *out, char *err,
                     size_t err_len);
/* Reads and parses a file (FF_EIO if unreadable). */
int ff_profile_load(const char *path, ff_profile *out, char *err, size_t err_len);
/* Writes the planner's keys of p as a profile (the one writer of the
 * schema) into buf; returns the length it needs (excluding the NUL), like
 * snprintf, or 0 if out of memory. */
size_t ff_profile_to_json(const ff_profile *p, char *buf, size_t len);

/* ---- the plan -------------------------------------------------------------- */

typedef enum {
    FF_COST_FULL = 0,        /* fourfold's step: compute, alpha-beta, placement, overlap, memory */
    FF_COST_PAPER,           /* equations 5.1-5.7 of the dissertation only */
    FF_COST_AXONN,           /* AxoNN's tool as published */
    FF_COST_AXONN_CORRECTED, /* the same with its transposed-layer terms corrected */
    FF_NCOST
} ff_cost;

const char *ff_cost_name(ff_cost cost);
int ff_cost_parse(const char *name); /* -1 if unknown */

/* The overlaps of docs/design.md §5 the step model applies. */
enum {
    FF_OVERLAP_OAR = 1, /* backward all-reduce of dI beside the dW GEMM */
    FF_OVERLAP_ORS = 2, /* reduce-scatter of dW waited after the backward */
    FF_OVERLAP_OAG = 4, /* all-gather of the next layer's weight beside this layer */
    FF_OVERLAP_DP = 8,  /* data-parallel buckets during the backward */
    FF_OVERLAP_ALL = 15
};

enum { FF_PLAN_AUTO = -1 };

/* The number formats a planned run trains in. FF_PLAN_FP32: everything fp32,
 * as fourfold's CPU program trains. FF_PLAN_BF16_MIXED (Micikevicius et
 * al.): bf16 weights, activations, gradients and transfers, fp32 master
 * weights and AdamW moments, as the GPU runs of the papers; its bytes and
 * memory are a prediction for such a run, not for fourfold's program. */
enum { FF_PLAN_FP32 = 0, FF_PLAN_BF16_MIXED = 1 };

typedef struct {
    ff_model model;
    int64_t batch; /* global batch, in sequences */
    int64_t seq;   /* tokens per sequence */
    int ranks;
    ff_profile machine; /* ranks_per_node and memory_bytes as planned for */
    ff_cost cost;
    int checkpoint;    /* 0, 1, or FF_PLAN_AUTO: off where the step fits without it */
    int ag_cache;      /* blocks whose gathered weights are kept; FF_PLAN_AUTO: as many as fit */
    int precision;     /* FF_PLAN_FP32 (fourfold's own training), FF_PLAN_BF16_MIXED, or
                          FF_PLAN_AUTO (the default): the machine's (ff_profile.precision)
                          with the full cost model, fp32 with the others */
    int micro_batches; /* per step, >= 1; FF_PLAN_AUTO (full cost model): for each
                          grid, the fastest count that divides its sequences per rank
                          (with more than 2^20 of them, 1) */
    int wire_bytes;    /* 4 (fp32) or 2 (bf16) for weights, activations and gradients */
    unsigned overlap;  /* FF_OVERLAP_* */
    int min_tp;        /* axonn: minimum Gx*Gy*Gz; 0: the tool's value for the model */
    int grad_acc;      /* axonn: micro-batches the tool multiplies the depth term by */
    /* The collective layer's model (comm.h), which decides the algorithm
     * FF_ALGO_AUTO runs on each all-reduce, and so its bytes (rec-whole
     * sends lg p whole vectors where the ring sends 2(p-1)/p of one) and,
     * for full, its time. For ff_plan_traffic to equal the counters, give
     * the run's model (ff_ctx_coll_model; the run's FF_PROFILE) and its
     * nodes (machine.ranks_per_node: nodes of consecutive ranks). The
     * planner applies the default rule strict_volume = 1 whatever this
     * says: a run with FF_STRICT_VOLUME=0 or FF_ALGO may move other bytes. */
    ff_coll_model coll;
    /* A per-layer plan (layerplan.h; docs/planner.md, "Per-layer plans"),
     * or NULL. With one, each block's checkpointing and each linear layer's
     * decomposition, OAR, ORS, OAG, AG cache and wire are the plan's, and
     * `checkpoint`, `ag_cache`, the oar/ors/oag bits of `overlap` and
     * `wire_bytes` apply only where the plan has no say: the data-parallel
     * all-reduces keep `wire_bytes` and FF_OVERLAP_DP. Only the full cost
     * model takes one, and only for the grid it is for (ff_plan_evaluate,
     * ff_plan_traffic; ff_plan_create refuses it). Not owned. */
    const ff_layer_plan *layers;
    /* GEMM panel height the run forces (ff_gemm_set_panel_rows), or 0: the
     * panels of ff_gemm_panel_rows, as a run has them. Decomposition cuts
     * a product at panel boundaries (docs/linear.md), so the panels decide
     * how many chunks a product of few rows can have. */
    int64_t panel_rows;
    /* 1: the run's collective matmul (ff_linear_opts.cmm, `fourfold train
     * --cmm on`): the forwards of a layer whose Z-shards are whole rows are
     * computed in Gz column slices and not decomposed (so the forward
     * all-reduces are whole), and one whose weight gather was not
     * prefetched (its layer's OAG off, or a run's first gather) runs beside
     * the ring that delivers the shards. The gathers are the same. */
    int cmm;
    /* 1: the run's reduce-scatter collective matmul (ff_linear_opts.rs_cmm,
     * `fourfold train --rs-cmm on`): the weight gradient of a layer whose
     * Z-shards are whole rows is computed in Gz slices fed to the ring
     * reduce-scatter over Z as they are done. The bytes are the same. A
     * per-layer plan sets it per layer (ff_layer_opts.rs_cmm). */
    int rs_cmm;
    /* Pipeline stages (docs/pipeline.md; 1: none). With P > 1, `ranks` is
     * the whole job and a grid is one stage's (ranks / P ranks); the step
     * is the pipeline's: each stage's forward and backward runs timed as
     * without stages, then the schedule played with the point-to-point
     * messages between them (docs/planner.md, "Pipeline stages").
     * FF_PLAN_AUTO (ff_plan_create only): every P dividing `ranks` with
     * P <= L. stage_layers: `stages` entries summing to L, or NULL for
     * src/nn/gpt.c's even split (only with a fixed P). With stages the
     * full cost model only, no per-layer plan, and the AG cache of every
     * block or of none (FF_PLAN_AUTO: every block if it fits). Not owned. */
    int stages;
    const int *stage_layers;
    int schedule;   /* FF_PIPE_MESSAGE (0) or FF_PIPE_1F1B (1), gpt.h's ff_pipe_schedule */
    int pipe_limit; /* micro-batches in flight per stage, K; 0: P */
    /* With a mixture of experts (model.experts > 0; docs/moe.md): expert
     * parallelism Ge (1: none; it must divide Gd and E; FF_PLAN_AUTO,
     * ff_plan_create only: every Ge that divides, each grid once per Ge),
     * duplicate token dropping (dtd, default 1) and communication-aware
     * checkpointing (cac, default 0), as ff_gpt_opts has them. The
     * planner assumes balanced routing (ff_gpt_opts.balanced_routing:
     * each expert receives min(its share, its capacity) of every
     * sequence), so its bytes equal a run's counters with that routing;
     * with learned routing only the expert layers' X and Y all-reduces
     * differ (they carry the rows each expert actually received).
     * The full cost model only, without stages. */
    int expert_parallel, dtd, cac;
    /* A pruned model (docs/samo.md; default sparsity 0: dense): the
     * fraction `sparsity` of the blocks' weight matrices pruned (the
     * embedding kept), trained masked (samo 0: the dense state and a mask
     * of every parameter, the data-parallel all-reduces packed to the kept
     * entries) or with SAMO (samo 1: the matrices' gradients and moments,
     * and under bf16-mixed their fp32 master, kept for the kept weights
     * only, with 32-bit offsets). The data-parallel bytes of the blocks'
     * buckets are round(f x shard) with f = 1 - sparsity, a prediction: a
     * global mask keeps more of one rank's shard than of another's. The
     * full cost model only. */
    double sparsity;
    int samo;
    /* How the run's collectives advance (ff_ctx_options.progress, `train
     * --progress`; ff_plan_config_default's FF_PROGRESS_POLL, as a run's;
     * a zeroed configuration has FF_PROGRESS_WAIT, 0): for a decomposed
     * all-reduce's chunks, which the engine only advances in its progress
     * calls (docs/planner.md, "What the model assumes about progress"):
     * FF_PROGRESS_THREAD, beside the following compute from their post;
     * FF_PROGRESS_POLL, from the first panel boundary of a following GEMM
     * of two or more panels (a GEMM polls between its panels), else inside
     * a wait, whose polls advance the chunks queued after the one waited
     * for too; FF_PROGRESS_WAIT, each inside its own wait. The other
     * background collectives are taken to advance from their post in every
     * mode. */
    int progress;
    /* ZeRO over D (ff_gpt_opts.zero, `train --zero`; docs/design.md): 1
     * and 2 shard AdamW's moments of the Z-sharded weights (and under
     * bf16-mixed their fp32 master) over D, each rank holding its ring
     * chunk of each data-parallel bucket; their gradients are
     * reduce-scattered over D and the updated parameters all-gathered (the
     * two phases of the ring all-reduce: the same bytes, counted as a
     * reduce-scatter and an all-gather). 2's peak memory is 1's (the
     * gradients are released only after the step's reduce-scatter). The
     * full cost model only, without pruning (as the program); the
     * experts' buckets over their replicas (EDP, or D). Nothing changes
     * with Gd = 1. With SAMO (samo, sparsity) the buckets' kept entries
     * (docs/samo.md "SAMO with ZeRO"); not with masked training. */
    int zero;
    /* ZeRO's gathers of the updated parameters: 0 (default) posted after
     * AdamW and waited for by the next forward where it first reads each
     * bucket, as the run does (docs/planner.md, "ZeRO's gathers"); 1 timed
     * as blocking after AdamW (their upper bound, for comparison). The
     * bytes are the same. With pipeline stages they are timed blocking. */
    int zero_blocking;
} ff_plan_config;

/* batch 8, seq 1024, 1 rank, machine "this", cost full, checkpoint, AG
 * cache and precision automatic, 1 micro-batch, fp32 wire, every overlap,
 * model unset, collectives ff_coll_model_default, no per-layer plan, one
 * stage, no expert parallelism, DTD on, CAC off. */
void ff_plan_config_default(ff_plan_config *cfg);
/* The precision cfg plans for (FF_PLAN_FP32 or FF_PLAN_BF16_MIXED): its
 * own, or if automatic the machine's with the full cost model and fp32
 * with the others (and for a U-Net, which trains in fp32 only). */
int ff_plan_precision(const ff_plan_config *cfg);

/* The planner's groups: the grid's (grid.h) and a mixture of experts'
 * expert group (EP: the Ge ranks of D that share the experts, members
 * consecutive in D) and the experts' replicas (EDP: D/Ge ranks, Ge apart
 * in D), which exist with expert parallelism only (without it an expert's
 * gradient is all-reduced over D). */
enum { FF_PLAN_GROUP_EP = FF_NGROUPS, FF_PLAN_GROUP_EDP, FF_PLAN_NGROUPS };
/* "X" ... "PIPE" (ff_group_kind_name), "EP", "EDP"; "?" otherwise. */
const char *ff_plan_group_name(int kind);

/* (The traffic arrays, ff_plan_result.coll and ff_plan_traffic's out,
 * have FF_PLAN_NGROUPS rows since 2026-11-25; they had FF_NGROUPS.) */

/* One collective kind on one group, per step, for one rank. */
typedef struct {
    uint64_t calls;      /* posted on a group of more than one rank */
    uint64_t bytes_sent; /* what fourfold's counters would record */
    uint64_t bytes_recv;
    double time_s;    /* predicted time of these collectives (hidden or not) */
    double exposed_s; /* of which on the rank's critical path (full cost model) */
} ff_plan_coll;

/* Where a group lies and the link the model gives it. */
typedef struct {
    int size;
    int64_t inner; /* product of the sizes of the groups nested inside */
    int intra;     /* every group of this kind lies inside one node */
    double alpha_s, beta_Bps;
} ff_plan_link;

typedef struct {
    ff_dims grid; /* one stage's; axonn: x = Gr, y = Gc, z = Gd, d = Gdata */
    int stages;   /* P: the job has P x the grid's ranks */
    int rejected;
    char reason[320]; /* every reason, "; "-separated */
    int checkpoint, ag_cache, micro_batches;
    int expert_parallel; /* Ge (1 for a dense model) */

    /* time of one step (full); paper and axonn fill step_s = comm_s only */
    double step_s, compute_s, exposed_s, hidden_s, comm_s;
    double gemm_s, attention_s, elementwise_s, optimizer_s;
    ff_plan_coll coll[FF_PLAN_NGROUPS][FF_NCOLL]; /* traffic of rank 0 */
    ff_plan_link link[FF_PLAN_NGROUPS];
    uint64_t bytes_recv; /* rank 0, every group and collective, and p2p */

    /* with stages: rank 0's point-to-point messages; the flight of one
     * activation (or its gradient) between two stages; the step's time in
     * which the busiest stage waits for messages (the bubble). The times
     * above (compute_s ... optimizer_s, exposed_s, coll[][].time_s) are the
     * busiest stage's, and the memory the largest stage's. */
    ff_plan_coll p2p;
    double p2p_s, bubble_s;
    int busiest_stage;

    /* memory of one rank, bytes */
    double mem_params, mem_grads, mem_optimizer, mem_weight_buffers, mem_activations, mem_total;
    double mem_mask; /* a pruned model's mask and packing, or SAMO's offsets (in mem_total) */

    double model_flops;      /* per step: 6 N tokens + 6 L B T^2 C */
    double flops_per_rank_s; /* model_flops / ranks / step_s */
    double peak_fraction;    /* of the profile's peak_flops */

    /* axonn: the four terms of the tool, summed over the four layers, times L,
     * in its unit (GiB over GB/s) */
    double axonn_col_s, axonn_row_s, axonn_depth_s, axonn_data_s;
} ff_plan_result;

/* Every (Gx, Gy, Gz, Gd) whose product is `ranks`, Gx outermost, each size
 * ascending. Returns the count; fills at most `cap` entries of out (may be
 * NULL). */
size_t ff_plan_grids(int ranks, ff_dims *out, size_t cap);

/* Evaluates one grid under cfg (cfg->ranks is ignored; the grid's product,
 * times cfg->stages, is the rank count). A grid that does not divide or fit is a result with
 * rejected = 1, not an error; errors are bad configurations, and a
 * per-layer plan (cfg->layers) for another model or grid: FF_EINVAL with
 * ff_layer_plan_match's sentence. */
int ff_plan_evaluate(const ff_plan_config *cfg, ff_dims grid, ff_plan_result *out, char *err,
                     size_t err_len);

/* The traffic of the rank at `coords` in one step: calls and bytes per
 * (group, collective), exactly what fourfold's counters will record for an
 * fp32 plan (ff_plan_precision; a bf16-mixed plan, a GPU preset's by
 * default, predicts the bytes of such a run, which fourfold's CPU program
 * does not train): the ring's volumes (uneven chunks included), or
 * rec-whole's for the
 * all-reduces that AUTO runs as FF_ALGO_REC_WHOLE under cfg->coll on nodes
 * of machine.ranks_per_node consecutive ranks. Checkpointing and AG cache
 * as cfg says (FF_PLAN_AUTO resolved as ff_plan_evaluate does), or its
 * per-layer plan: an all-reduce decomposed into k chunks is k calls, each
 * of its chunk's rows. */
int ff_plan_traffic(const ff_plan_config *cfg, ff_dims grid, ff_dims coords,
                    ff_plan_coll out[FF_PLAN_NGROUPS][FF_NCOLL], char *err, size_t err_len);
/* The same for the rank at `coords` of stage `stage` of cfg->stages
 * (docs/pipeline.md), whose grid is `grid`: its collectives (WORLD spanning
 * every stage) and in *p2p its point-to-point messages on PIPE (calls,
 * bytes sent and received), exactly what its counters record. Needs a
 * number of stages and of micro-batches, checkpointing on or off, the AG
 * cache of every block or of none and no per-layer plan (FF_EINVAL
 * otherwise); any cost model (bytes do not depend on it). */
int ff_plan_traffic_stage(const ff_plan_config *cfg, ff_dims grid, ff_dims coords, int stage,
                          ff_plan_coll out[FF_PLAN_NGROUPS][FF_NCOLL], ff_plan_coll *p2p, char *err,
                          size_t err_len);

/* The search for a per-layer plan on one grid (docs/planner.md, "Per-layer
 * plans"): from cfg->layers if set, else the uniform plan of cfg (its
 * checkpointing and AG cache resolved as ff_plan_evaluate does, its
 * overlaps and wire), change one option of one layer, or one block's
 * checkpointing, at a time and keep what the full model predicts faster
 * within the machine's memory. method 0: coordinate descent (sweeps over
 * every option, each set to its fastest candidate, until a sweep changes
 * nothing; at most 20 sweeps; a local optimum); 1: Metropolis-Hastings
 * (random single-option proposals, a slower one accepted with probability
 * exp(-relative slowdown / 1e-4), the best plan seen kept; 20 proposals
 * per option, 400 to 20000, drawn from `seed`). Candidates: decompose 0, 2, 3, 4, 8; oar,
 * ors, oag, ag_cache and checkpoint 0 and 1; wire fp32, and bf16 only if
 * cfg->wire_bytes is 2. Options that cannot change the step on this grid
 * are not visited (no all-gather without Gz > 1, ...).
 *
 * Fills *out (its identification from cfg and grid, predicted_step_s;
 * free it with ff_layer_plan_free) and *res (the plan's evaluation).
 * Deterministic. FF_EINVAL for a bad configuration or method, FF_EDIVIDE
 * if the grid does not divide the model or batch, FF_EINVAL if even the
 * start does not fit in memory (res says why), FF_ENOMEM. */
int ff_plan_per_layer(const ff_plan_config *cfg, ff_dims grid, int method, uint64_t seed,
                      ff_layer_plan *out, ff_plan_result *res, char *err, size_t err_len);

/* The bandwidth, GB/s, AxoNN's tool gives a group of `size` ranks at stride
 * `inner` (its tables for perlmutter and frontier; otherwise the profile's
 * link by the paper's rule). */
double ff_plan_axonn_bandwidth(const ff_profile *p, int inner, int size);

typedef struct ff_plan ff_plan;

/* Evaluates every grid of cfg->ranks (axonn: the tool's own search space;
 * with stages, every grid of ranks / P for each P) and sorts them: accepted grids by predicted time
 * (ties keep enumeration order), then rejected ones in enumeration order. On failure *out is still
 * set (unless FF_ENOMEM) so that ff_plan_error() can be read; destroy it. */
int ff_plan_create(ff_plan **out, const ff_plan_config *cfg);
void ff_plan_destroy(ff_plan *plan);
const char *ff_plan_error(const ff_plan *plan);
size_t ff_plan_count(const ff_plan *plan);    /* every grid evaluated */
size_t ff_plan_accepted(const ff_plan *plan); /* the first ones */
const ff_plan_result *ff_plan_get(const ff_plan *plan, size_t i);
const ff_plan_config *ff_plan_config_of(const ff_plan *plan);

#ifdef __cplusplus
}
#endif
#endif
