/* Definitions shared by the planner's files (src/plan/); not installed. */
#ifndef FF_PLAN_INTERNAL_H
#define FF_PLAN_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "fourfold/linear.h" /* FF_DECOMPOSE_MAX, ff_gemm_panel_rows */
#include "fourfold/plan.h"
#include "util/file.h" /* ff_format_error */

#define PLAN_GIB (1024.0 * 1024.0 * 1024.0)

/* ---- the step as a list of operations (schedule.c) ----
 *
 * One step of one rank, in execution order: GEMMs, attention, elementwise
 * work, collectives and waits. The same list gives the exact traffic (every
 * collective's group, kind and count) and, played on a timeline, the time. */

typedef enum { OP_GEMM, OP_ATTN, OP_ELEM, OP_COLL, OP_WAIT, OP_WAIT_ALL } op_kind;

typedef enum {
    MODE_BLOCKING,   /* post, then wait at once */
    MODE_OAR,        /* beside the GEMM that follows (OAR) */
    MODE_BACKGROUND, /* posted; a later OP_WAIT / OP_WAIT_ALL completes it */
    MODE_CHUNK       /* a chunk of a decomposed all-reduce: posted, a later OP_WAIT
                        completes it; the chunks run one after another beside the GEMMs */
} coll_mode;

typedef struct {
    uint8_t kind;      /* op_kind */
    uint8_t group;     /* ff_group_kind (OP_COLL) */
    uint8_t coll;      /* ff_coll (OP_COLL) */
    uint8_t mode;      /* coll_mode (OP_COLL) */
    uint8_t wire;      /* bytes per element on the wire (OP_COLL) */
    uint8_t optimizer; /* OP_ELEM: the optimizer's update (reported apart) */
    uint8_t prefetch;  /* Z all-gather: posted during the previous use (the layer's OAG) */
    uint8_t cmm;       /* Z all-gather run as a collective matmul with the next GEMM */
    uint8_t rs_cmm;    /* Z reduce-scatter fed by the next GEMM's slices (the
                          reduce-scatter collective matmul), on the ring */
    uint8_t half;      /* ZeRO: 1 the reduce, 2 the gather phase of a ring all-reduce of
                          `count` (ff_iallreduce_half), counted as coll (RS, AG) */
    int tag;           /* OP_COLL in the background or a chunk, and the OP_WAIT for it */
    int panels;        /* OP_GEMM: row panels the engine computes it in (ff_poll between) */
    double first;      /* OP_GEMM: the first panel's share of its rows (its first poll) */
    int slices;        /* OP_GEMM: computed in this many column slices (the collective
                          matmul's shards); 0 or 1: whole */
    int64_t count;     /* OP_COLL: the count argument of ff_i<coll> */
    int64_t m, n, k;   /* OP_GEMM, OP_ATTN: product (m x k) (k x n), for the efficiency */
    double work;       /* OP_GEMM, OP_ATTN: flops; OP_ELEM: bytes of memory traffic */
} plan_op;

struct plan_topo; /* cost_full.c */

typedef struct {
    plan_op *ops;
    size_t n, cap;
    int tags;
    int oom;
    /* the node layouts of the groups the all-reduces ran on, kept from one
     * grid to the next (the world group is the same for all) */
    struct plan_topo *topos;
    /* with pipeline stages: their number (0 or 1: none) and the stage whose
     * ranks the layouts and volumes are for (the world is then P stages of
     * the grid, stage outermost) */
    int P, stage;
    /* expert parallelism Ge (the EP and EDP groups' sizes); 0 or 1: none */
    int ge;
    /* reused from one list to the next (a plan plays thousands): the
     * reordering's second list, the timeline's per-tag arrays, and the
     * group layout each group kind found last, for grid lg, rank lc */
    plan_op *spare;
    size_t spare_cap;
    void *play;
    size_t play_cap;
    struct plan_topo *last[FF_PLAN_NGROUPS];
    ff_dims lg[FF_PLAN_NGROUPS], lc[FF_PLAN_NGROUPS];
    int lstage[FF_PLAN_NGROUPS], lP[FF_PLAN_NGROUPS], lge[FF_PLAN_NGROUPS];
} plan_ops;

/* The resolved sizes of one rank's step. */
typedef struct {
    ff_dims g;
    int64_t L, C, NH, hd, Vp, T, positions;
    int64_t b_mb;   /* sequences per micro-batch on this rank */
    int64_t m;      /* rows per micro-batch: b_mb * T */
    int micro;      /* micro-batches */
    int checkpoint; /* 0 or 1 */
    int ag_cache;   /* blocks, 0..L */
    int wire;       /* bytes */
    int act;        /* bytes of an activation, weight or gradient value: 4, or 2 (bf16-mixed) */
    unsigned overlap;
    /* A per-layer plan (ff_plan_config.layers), or NULL: then every layer
     * has the options above (plan_layer_opts) */
    const ff_layer_plan *plan;
    int64_t panel_rows; /* ff_plan_config.panel_rows */
    int cmm;            /* ff_plan_config.cmm */
    int rs_cmm;         /* ff_plan_config.rs_cmm (without a per-layer plan) */
    /* pipeline stages: this is stage `stage` of P, holding blocks
     * [l0, l0 + nb); P = 1: the whole model */
    int P, stage, first, last;
    int64_t l0, nb;
    int slots; /* K, micro-batches in flight (activation slots) per stage */
    /* A mixture of experts (E > 0; docs/moe.md): block l is one when
     * (l + 1) % every == 0; top_k choices per token; cap assignments per
     * expert and sequence; Ge ranks of D share the experts, el = E/Ge on
     * each, this rank's slot eslot (its EP rank, d mod Ge); all-to-all
     * blocks of R rows, DTD pieces of ch rows (dtd: in effect); cac:
     * communication-aware checkpointing. */
    int E, every, top_k, ge, el, eslot, dtd, cac;
    /* a pruned model (ff_plan_config.sparsity; keep 1: dense): the kept
     * fraction of the blocks' weight matrices, trained with SAMO or masked */
    double keep;
    int samo;
    int64_t cap, R, ch;
    int fused_attn;   /* the machine's attention_fused */
    int zero;         /* ZeRO over D in effect (ff_plan_config.zero with Gd > 1), else 0 */
    int zero_overlap; /* its gathers beside the next forward (one stage, not zero_blocking) */
} plan_shape;

/* ---- the list's builder for a second model (schedule.c; unet.c) ----
 * A model other than the GPT lists its step through these: the linear
 * layers' collectives, GEMMs and overlaps are the GPT's (one home). */
typedef struct {
    const plan_shape *s; /* only its options are read: g, overlap, wire, act, panel_rows,
                            cmm, rs_cmm */
    plan_ops *o;
    int64_t gx, gy, gz, gd;
    int gathers; /* Z all-gathers of weights listed so far */
    int64_t m;   /* rows of the linear layers' products: the micro-batch's, or an expert's */
} plan_sched;
/* A linear layer (k x n; transposed: T) forward on c->m rows, after its
 * weight's gather if do_gather; its backward (a gather first if
 * do_gather; dinp 0: no input gradient, so no dI product and no
 * all-reduce), its dW reduce-scatter over Z. */
void plan_sched_linear_forward(plan_sched *c, int transposed, int64_t k, int64_t n, int do_gather,
                               const ff_layer_opts *o);
void plan_sched_linear_backward(plan_sched *c, int transposed, int64_t k, int64_t n, int do_gather,
                                int dinp, const ff_layer_opts *o);
/* A blocking fp32 collective of count elements on group g. */
void plan_sched_coll(plan_sched *c, ff_group_kind g, ff_coll kind, int64_t count);
void plan_sched_elem(plan_sched *c, double passes, double elems);
void plan_sched_attention(plan_sched *c, double flops, int64_t tokens, int64_t head_dim);
void plan_sched_optimizer(plan_sched *c, double n);
/* Waits for every background collective (the end of a backward). */
void plan_sched_finish(plan_sched *c);
/* OAG: the gathers of the layers with it moved one gather earlier. */
void plan_sched_prefetch(plan_ops *o);

/* ---- the U-Net (unet.c) ---- */
/* Its sizes in range (the run's refusals that do not depend on the grid). */
int plan_unet_model_check(const ff_unet_config *u, char *err, size_t len);
/* Its parameters (the canonical tensors' elements). */
int64_t plan_unet_params(const ff_unet_config *u);
int plan_unet_check(const ff_plan_config *cfg, char *err, size_t len);
int plan_unet_eval(const ff_plan_config *cfg, ff_dims g, ff_plan_result *r, plan_ops *ops,
                   char *err, size_t len);
int plan_unet_traffic(const ff_plan_config *cfg, ff_dims g, ff_dims coords,
                      ff_plan_coll out[FF_PLAN_NGROUPS][FF_NCOLL], char *err, size_t len);
/* Play the list of ops (cost_full.c's timeline) and count its traffic at coords. */
int plan_count_traffic_at(const ff_plan_config *cfg, plan_ops *ops, ff_dims g, ff_dims coords,
                          ff_plan_coll out[FF_PLAN_NGROUPS][FF_NCOLL]);

/* 1 if block l of the shape is a mixture of experts. */
int plan_block_moe(const plan_shape *s, int64_t l);
/* Rows local expert le computes on per micro-batch under balanced routing
 * (ff_gpt_opts.balanced_routing): of every sequence, expert e receives
 * floor(k T / E) assignments, one more if e < k T mod E, and keeps at most
 * cap; with expert parallelism from each of the Ge ranks of its group. */
int64_t plan_expert_rows(const plan_shape *s, int le);
/* The local experts' biases (replicated over Z and EDP; part of
 * plan_other_params, all-reduced apart). */
int64_t plan_expert_bias_params(const plan_shape *s);

/* The options of block l's linear layer i (FF_BLOCK_QKV ...), or with l < 0
 * of the head (wte): the plan's, or those the uniform settings of the shape
 * give (no decomposition; overlaps from `overlap`; the AG cache holds the
 * last ag_cache blocks, and wte when it holds every block; `wire`). */
void plan_layer_opts(const plan_shape *s, int64_t l, int i, ff_layer_opts *o);
/* 1 if block l recomputes its forward before its backward. */
int plan_block_checkpoint(const plan_shape *s, int64_t l);
/* The chunks of a decomposed product of m rows, n columns and inner k, as
 * src/nn/linear.c cuts it: whole GEMM panels of P rows (panel_rows, or
 * ff_gemm_panel_rows of the shape), t = ceil(m / P) of them, at most t
 * chunks, chunk i the panels [t i / chunks, t (i + 1) / chunks). Fills
 * bounds[0..chunks] (row offsets) and returns the number of chunks (1 when
 * decompose < 2). */
int plan_chunk_bounds(int decompose, int64_t panel_rows, int64_t m, int64_t n, int64_t k,
                      int64_t bounds[FF_DECOMPOSE_MAX + 1]);

/* Builds the operation list (appends to ops, which the caller frees). With
 * stages (s->P > 1), one stage's step: its point-to-point messages are
 * OP_COLL on FF_GROUP_PIPE with coll FF_COLL_P2P and mode 0 (send) or 1
 * (receive). */
void plan_schedule(const plan_shape *s, plan_ops *ops);

/* The pieces of a stage's step that the pipeline's timing plays apart
 * (stages.c): a micro-batch's forward run (on the last stage with its
 * backward), a backward run (stages before the last), and the tail after
 * the last pass. The data-parallel buckets are posted in the last
 * micro-batch's runs. Fills ops, which must be empty (plan_prefetch
 * reorders the whole list): gathers prefetched within the piece, as a run
 * of the layers' program prefetches within itself. */
typedef enum { PIECE_FORWARD, PIECE_BACKWARD, PIECE_TAIL } plan_piece;
void plan_schedule_piece(const plan_shape *s, plan_ops *ops, plan_piece piece, int last_micro);
void plan_ops_free(plan_ops *ops);

/* Elements of the Z-sharded weights (Ŵ) and of the other parameters on one
 * rank (plan_shape's grid; docs/design.md §4). */
int64_t plan_zsharded_params(const plan_shape *s);
int64_t plan_other_params(const plan_shape *s);
/* The blocks' weight matrices among the Z-sharded weights (what pruning
 * prunes; the embedding not). */
int64_t plan_block_matrices(const plan_shape *s);
/* The entries AdamW updates: every parameter, under SAMO the kept ones. */
double plan_optimizer_entries(const plan_shape *s);
/* A pruned model's kept entries of the blocks' buckets, round(f x shard)
 * each (SAMO's compressed entries; the embedding is kept whole). */
int64_t plan_samo_kept(const plan_shape *s);

/* ---- placement and collective time (cost_full.c) ---- */

/* Link of a group of `size` ranks whose members are `inner` ranks apart
 * (`ranks` in all), by the rule of docs/design.md §6. paper_rule: the paper's
 * condition inner*size <= ranks_per_node alone; otherwise the group must also
 * tile the node (so no group straddles two nodes). */
ff_plan_link plan_link(const ff_profile *p, int ranks, int64_t inner, int size, int paper_rule);
/* The links of the groups of a grid. */
void plan_links(const ff_profile *p, ff_dims g, int ge, int paper_rule,
                ff_plan_link out[FF_PLAN_NGROUPS]);
/* The same for a stage of P stages of grid g (the job P times its ranks,
 * stage outermost), with WORLD across the stages and PIPE (a stage's size
 * apart). */
void plan_links_staged(const ff_profile *p, ff_dims g, int P, ff_plan_link out[FF_PLAN_NGROUPS]);
/* Seconds for one collective on a group of p ranks: the ring's or
 * recursive doubling's (the faster), or with `whole` (an all-reduce that
 * AUTO runs as rec-whole) lg p steps of the whole vector. */
double plan_coll_time(const ff_plan_link *l, ff_coll coll, int p, int64_t count, int wire,
                      int whole);
/* The ring's time alone (p - 1 steps of count, or 2(p - 1) of a p-th for
 * an all-reduce), for a collective the engine forces onto the ring. */
double plan_ring_time(const ff_plan_link *l, ff_coll coll, int p, int64_t count, int wire);
/* Frees ops->topos (plan_ops_free calls it). */
void plan_topos_free(plan_ops *ops);

/* Size of a group and the rank's index in it (grid.h's conventions). */
int plan_group_size(ff_dims g, ff_group_kind kind);
int plan_group_rank(ff_dims g, ff_dims c, ff_group_kind kind);

/* Plays the operations of one rank on a timeline from 0, GEMMs at `rate`
 * FLOP/s: *end_s when its own thread is done, *bg_s when its background
 * collectives are; lower_s (if not NULL) two lower bounds of *end_s on one
 * stage: what its thread spends whatever the channels do, and the
 * background channel's busy time. Adds weight x the play's compute and
 * collective times to acc. -1 if out of memory. */
int plan_play(const ff_plan_config *cfg, ff_dims g, plan_ops *ops, const ff_plan_link *link,
              double rate, ff_plan_result *acc, double weight, double *end_s, double *bg_s,
              double lower_s[2]);
/* The GEMM rate of one rank where `busy_ranks` ranks compute at once on
 * a node: they share its cores_per_node cores, if the profile has them. */
double plan_gemm_rate(const ff_profile *p, double busy_ranks);
/* Seconds of `calls` GEMM calls doing `flops` in all on (m x k)(k x n)
 * products at `rate`: calls * gemm_call_s + flops / (rate * efficiency),
 * the efficiency 1 / (1 + h/m + h/n + h/k) of the profile's h; 0 for no
 * flops (no call). */
double plan_gemm_time(const ff_profile *p, double rate, double flops, int64_t m, int64_t n,
                      int64_t k, int calls);
/* Adds the calls and bytes of rank 0 in ops (its collectives and p2p) to
 * r. -1 if out of memory. */
int plan_count_traffic(const ff_plan_config *cfg, plan_ops *ops, ff_dims g, ff_plan_result *r);
/* compute_s, exposed_s (busy_s less compute) and hidden_s of r. */
void plan_finish_times(ff_plan_result *r, double busy_s);
/* Memory of one rank for the shape (its stage's blocks and slots). */
void plan_memory(const plan_shape *s, ff_plan_result *r);

/* Evaluates one grid with the full model (with stages: plan_eval_stages). */
int plan_eval_full(const ff_plan_config *cfg, ff_dims g, ff_plan_result *r, plan_ops *scratch,
                   char *err, size_t err_len);
/* A lower bound of plan_eval_full's step for cfg (one stage), from lists of
 * one and two micro-batches: at most the step up to rounding (a relative
 * 1e-12 or so); -1 where the grid is rejected. */
int plan_full_bound(const ff_plan_config *cfg, ff_dims g, plan_ops *scratch, double *bound,
                    char *err, size_t err_len);
/* The traffic of one rank (ff_plan_traffic without the checks of cfg), of
 * stage `stage` when cfg->stages > 1, its point-to-point messages in *p2p
 * (may be NULL). */
int plan_traffic_of(const ff_plan_config *cfg, ff_dims g, ff_dims coords, int stage,
                    ff_plan_coll out[FF_PLAN_NGROUPS][FF_NCOLL], ff_plan_coll *p2p, char *err,
                    size_t err_len);
/* Checks that the grid divides the model and batch; appends reasons to r. */
int plan_check_divides(const ff_plan_config *cfg, ff_dims g, ff_plan_result *r);
/* Resolves checkpointing and the AG cache, fills the memory fields of r and
 * rejects if the step does not fit. Returns 1 if it fits. */
int plan_fit_memory(const ff_plan_config *cfg, ff_dims g, ff_plan_result *r, plan_shape *s);
void plan_shape_init(const ff_plan_config *cfg, ff_dims g, plan_shape *s);
void plan_reject(ff_plan_result *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* ---- pipeline stages (stages.c) ---- */

/* Makes s (from plan_shape_init) stage `stage` of cfg->stages: its blocks
 * (cfg->stage_layers or src/nn/gpt.c's even split) and its slots. */
void plan_shape_stage(const ff_plan_config *cfg, plan_shape *s, int stage);
/* Checkpointing and the AG cache of every stage of cfg->stages in base
 * (from plan_shape_init): without checkpointing if every stage fits (or
 * as cfg says), the AG cache of every block if it fits (or none); the
 * memory of the largest stage into r, rejected if it does not fit.
 * Returns 1 if the step fits. */
int plan_fit_stages(const ff_plan_config *cfg, ff_dims g, ff_plan_result *r, plan_shape *base);
/* Evaluates one grid of a stage with cfg->stages > 1. */
int plan_eval_stages(const ff_plan_config *cfg, ff_dims g, ff_plan_result *r, plan_ops *ops,
                     char *err, size_t err_len);

/* The schedule between the stages: P stages, M micro-batches, limit K,
 * schedule 0 (message-driven) or 1 (1F1B) as src/nn/gpt_pipe.c runs them.
 * fwd[2s + lm], bwd[2s + lm]: the time of stage s's forward run (on the
 * last stage it holds the backward) and backward run of a micro-batch, lm
 * = 1 for the last micro-batch; a message arrives msg_s after its pass
 * ends. */
typedef struct {
    int P, M, K, schedule;
    const double *fwd, *bwd;
    double msg_s;
} plan_pipe;
/* Plays the schedule from time 0: per stage, the end of its last pass,
 * the sum of its passes and the start of its last micro-batch's backward
 * (on the last stage, its run). -1 if out of memory, -2 if the schedule
 * waits forever (a bug). */
int plan_pipe_simulate(const plan_pipe *pp, double *end, double *busy, double *last_start);

/* ---- the search for a per-layer plan (search.c) ---- */

/* What the search visits (ff_plan_per_layer: plan_search_space_default);
 * the tests restrict it to compare with exhaustive enumeration. */
enum {
    PLAN_VARY_CHECKPOINT = 1,
    PLAN_VARY_DECOMPOSE = 2,
    PLAN_VARY_OAR = 4,
    PLAN_VARY_ORS = 8,
    PLAN_VARY_OAG = 16,
    PLAN_VARY_CACHE = 32,
    PLAN_VARY_WIRE = 64, /* only if cfg->wire_bytes is 2 */
    PLAN_VARY_RS_CMM = 128,
    PLAN_VARY_ALL = 255
};

enum { PLAN_MAX_CANDIDATES = 8 };

typedef struct {
    unsigned vary;   /* PLAN_VARY_* */
    int n_decompose; /* candidates of decompose */
    int decompose[PLAN_MAX_CANDIDATES];
    int max_sweeps; /* coordinate descent */
    long mh_iters;  /* Metropolis-Hastings proposals; 0: 20 per option, 400 to 20000 */
    double mh_temp; /* the relative slowdown accepted with probability 1/e */
} plan_search_space;

void plan_search_space_default(plan_search_space *sp);
/* ff_plan_per_layer within sp; *evaluations (may be NULL) counts the
 * plans evaluated. */
int plan_search(const ff_plan_config *cfg, ff_dims grid, int method, uint64_t seed,
                const plan_search_space *sp, ff_layer_plan *out, ff_plan_result *res,
                long *evaluations, char *err, size_t err_len);

/* ---- the reference cost models (cost_ref.c) ---- */

void plan_eval_paper(const ff_plan_config *cfg, ff_dims g, ff_plan_result *r);
/* AxoNN's grid (Gr, Gc, Gd, Gdata) = (x, y, z, d) of r->grid. Returns the
 * tool's sort key, the time of one block. */
double plan_eval_axonn(const ff_plan_config *cfg, int gr, int gc, int gd, int gdata, int corrected,
                       ff_plan_result *r);
/* AxoNN's bandwidth, GB/s, for a group of `size` at stride `inner`. */
double plan_axonn_bw(const ff_profile *p, int inner, int size);

#endif
