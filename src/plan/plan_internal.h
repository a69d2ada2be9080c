/* Definitions shared by the planner's files (src/plan/); not installed. */
#ifndef FF_PLAN_INTERNAL_H
#define FF_PLAN_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "fourfold/plan.h"
#include "util/file.h" /* ff_format_error */

/* ---- the step as a list of operations (schedule.c) ----
 *
 * One step of one rank, in execution order: GEMMs, attention, elementwise
 * work, collectives and waits. The same list gives the exact traffic (every
 * collective's group, kind and count) and, played on a timeline, the time. */

typedef enum { OP_GEMM, OP_ATTN, OP_ELEM, OP_COLL, OP_WAIT, OP_WAIT_ALL } op_kind;

typedef enum {
    MODE_BLOCKING,  /* post, then wait at once */
    MODE_OAR,       /* beside the GEMM that follows (OAR) */
    MODE_BACKGROUND /* posted; a later OP_WAIT / OP_WAIT_ALL completes it */
} coll_mode;

typedef struct {
    uint8_t kind;      /* op_kind */
    uint8_t group;     /* ff_group_kind (OP_COLL) */
    uint8_t coll;      /* ff_coll (OP_COLL) */
    uint8_t mode;      /* coll_mode (OP_COLL) */
    uint8_t wire;      /* bytes per element on the wire (OP_COLL) */
    uint8_t optimizer; /* OP_ELEM: the optimizer's update (reported apart) */
    int tag;           /* OP_COLL in the background, and the OP_WAIT for it */
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
    unsigned overlap;
} plan_shape;

/* Builds the operation list (appends to ops, which the caller frees). */
void plan_schedule(const plan_shape *s, plan_ops *ops);
void plan_ops_free(plan_ops *ops);

/* Elements of the Z-sharded weights (Ŵ) and of the other parameters on one
 * rank (plan_shape's grid; docs/design.md §4). */
int64_t plan_zsharded_params(const plan_shape *s);
int64_t plan_other_params(const plan_shape *s);

/* ---- placement and collective time (cost_full.c) ---- */

/* Link of a group of `size` ranks whose members are `inner` ranks apart
 * (`ranks` in all), by the rule of docs/design.md §6. paper_rule: the paper's
 * condition inner*size <= ranks_per_node alone; otherwise the group must also
 * tile the node (so no group straddles two nodes). */
ff_plan_link plan_link(const ff_profile *p, int ranks, int64_t inner, int size, int paper_rule);
/* The links of the seven groups of a grid. */
void plan_links(const ff_profile *p, ff_dims g, int paper_rule, ff_plan_link out[FF_NGROUPS]);
/* Seconds for one collective on a group of p ranks: the ring's or
 * recursive doubling's (the faster), or with `whole` (an all-reduce that
 * AUTO runs as rec-whole) lg p steps of the whole vector. */
double plan_coll_time(const ff_plan_link *l, ff_coll coll, int p, int64_t count, int wire,
                      int whole);
/* Frees ops->topos (plan_ops_free calls it). */
void plan_topos_free(plan_ops *ops);

/* Size of a group and the rank's index in it (grid.h's conventions). */
int plan_group_size(ff_dims g, ff_group_kind kind);
int plan_group_rank(ff_dims g, ff_dims c, ff_group_kind kind);

/* Evaluates one grid with the full model. */
int plan_eval_full(const ff_plan_config *cfg, ff_dims g, ff_plan_result *r, plan_ops *scratch,
                   char *err, size_t err_len);
/* The traffic of one rank (ff_plan_traffic without the checks of cfg). */
int plan_traffic_of(const ff_plan_config *cfg, ff_dims g, ff_dims coords,
                    ff_plan_coll out[FF_NGROUPS][FF_NCOLL], char *err, size_t err_len);
/* Checks that the grid divides the model and batch; appends reasons to r. */
int plan_check_divides(const ff_plan_config *cfg, ff_dims g, ff_plan_result *r);
/* Resolves checkpointing and the AG cache, fills the memory fields of r and
 * rejects if the step does not fit. Returns 1 if it fits. */
int plan_fit_memory(const ff_plan_config *cfg, ff_dims g, ff_plan_result *r, plan_shape *s);
void plan_shape_init(const ff_plan_config *cfg, ff_dims g, plan_shape *s);
void plan_reject(ff_plan_result *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* ---- the reference cost models (cost_ref.c) ---- */

void plan_eval_paper(const ff_plan_config *cfg, ff_dims g, ff_plan_result *r);
/* AxoNN's grid (Gr, Gc, Gd, Gdata) = (x, y, z, d) of r->grid. Returns the
 * tool's sort key, the time of one block. */
double plan_eval_axonn(const ff_plan_config *cfg, int gr, int gc, int gd, int gdata, int corrected,
                       ff_plan_result *r);
/* AxoNN's bandwidth, GB/s, for a group of `size` at stride `inner`. */
double plan_axonn_bw(const ff_profile *p, int inner, int size);

#endif
