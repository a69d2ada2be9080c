/* The search for a per-layer plan on one grid (ff_plan_per_layer, plan.h;
 * docs/planner.md, "Per-layer plans").
 *
 * The space: each block's checkpointing and, for each linear layer of each
 * block and the head, its decomposition, OAR, ORS, OAG, AG cache, wire and
 * the reduce-scatter collective matmul (not the head's: its dW's
 * reduce-scatter follows the embedding lookup's backward).
 * A point is an ff_layer_plan, its cost the full model's step time
 * (plan_eval_full), or +inf where it does not fit in memory. The two
 * heuristics of AutoDDL (Chen et al., §4.6), over single options rather
 * than a layer's whole strategy: coordinate descent sets one option at a
 * time to its best candidate, the others fixed, and sweeps until nothing
 * changes (the cost falls monotonically to a fixed point; no restarts);
 * Metropolis-Hastings proposes a random option's random other value and
 * accepts a slower plan with probability exp(-slowdown / (T * current)),
 * keeping the best plan seen. Both are deterministic (MH's draws are
 * ff_rng_uniform(seed, 0, i)). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "fourfold/rng.h"
#include "plan/plan_internal.h"

/* One option of the plan: a block's checkpointing (which = CHECKPOINT) or
 * one of a layer's options; block -1 is the head. */
enum { O_DECOMPOSE, O_OAR, O_ORS, O_OAG, O_CACHE, O_WIRE, O_RS_CMM, O_CHECKPOINT };

typedef struct {
    int block, layer, which;
} coord;

typedef struct {
    ff_plan_config cfg; /* the caller's, with layers = &plan */
    ff_dims g;
    ff_layer_plan plan;  /* the point being evaluated */
    plan_ops ops;        /* scratch, and the node layouts, kept across evaluations */
    ff_plan_result *res; /* scratch */
    coord *coords;
    int n_coords;
    int values[O_CHECKPOINT + 1][PLAN_MAX_CANDIDATES];
    int n_values[O_CHECKPOINT + 1];
    long evaluations;
    char *err;
    size_t err_len;
} search;

void plan_search_space_default(plan_search_space *sp)
{
    memset(sp, 0, sizeof *sp);
    sp->vary = PLAN_VARY_ALL;
    static const int dec[] = {0, 2, 3, 4, 8};
    sp->n_decompose = (int)(sizeof dec / sizeof dec[0]);
    memcpy(sp->decompose, dec, sizeof dec);
    sp->max_sweeps = 20;
    sp->mh_iters = 0;
    sp->mh_temp = 1e-4;
}

static int *field(ff_layer_plan *p, const coord *c)
{
    if (c->which == O_CHECKPOINT)
        return &p->blocks[c->block].checkpoint;
    ff_layer_opts *o = c->block < 0 ? &p->head : &p->blocks[c->block].layer[c->layer];
    switch (c->which) {
    case O_DECOMPOSE: return &o->decompose;
    case O_OAR: return &o->oar;
    case O_ORS: return &o->ors;
    case O_OAG: return &o->oag;
    case O_CACHE: return &o->ag_cache;
    case O_RS_CMM: return &o->rs_cmm;
    default: return &o->wire_bytes;
    }
}

/* The step time of S->plan; +inf if it does not fit. */
static int evaluate(search *S, double *t)
{
    memset(S->res, 0, sizeof *S->res);
    S->res->grid = S->g;
    S->evaluations++;
    int rc = plan_eval_full(&S->cfg, S->g, S->res, &S->ops, S->err, S->err_len);
    *t = S->res->rejected ? INFINITY : S->res->step_s;
    return rc;
}

/* The options the search visits: those sp allows that can change the step
 * on this grid (nothing is gathered or reduce-scattered without Gz > 1;
 * the layers' all-reduces are over X and Y). */
static int build_coords(search *S, const plan_search_space *sp)
{
    const ff_dims g = S->g;
    const int L = S->plan.layers, xy = g.x > 1 || g.y > 1, z = g.z > 1;
    /* (in bf16-mixed precision everything is sent bf16: no choice) */
    const int bf16 = S->cfg.wire_bytes == 2 && ff_plan_precision(&S->cfg) == FF_PLAN_FP32;
    const int on[O_CHECKPOINT + 1] = {
        [O_DECOMPOSE] = (sp->vary & PLAN_VARY_DECOMPOSE) && xy && sp->n_decompose > 1,
        [O_OAR] = (sp->vary & PLAN_VARY_OAR) && xy,
        [O_ORS] = (sp->vary & PLAN_VARY_ORS) && z,
        [O_OAG] = (sp->vary & PLAN_VARY_OAG) && z,
        [O_CACHE] = (sp->vary & PLAN_VARY_CACHE) && z,
        [O_WIRE] = (sp->vary & PLAN_VARY_WIRE) && bf16 && (xy || z),
        [O_RS_CMM] = (sp->vary & PLAN_VARY_RS_CMM) && z,
        [O_CHECKPOINT] = (sp->vary & PLAN_VARY_CHECKPOINT) != 0,
    };
    for (int w = 0; w <= O_CHECKPOINT; w++) {
        S->n_values[w] = 2;
        S->values[w][0] = 0, S->values[w][1] = 1;
    }
    S->n_values[O_DECOMPOSE] = sp->n_decompose;
    for (int i = 0; i < sp->n_decompose; i++)
        S->values[O_DECOMPOSE][i] = sp->decompose[i];
    S->values[O_WIRE][0] = 4, S->values[O_WIRE][1] = 2;

    S->coords = malloc(((size_t)L * (FF_BLOCK_LAYERS * O_CHECKPOINT + 1) + O_CHECKPOINT) *
                       sizeof *S->coords);
    if (!S->coords)
        return ff_format_error(S->err, S->err_len, FF_ENOMEM, "out of memory for the search");
    /* in execution order of the forward: the head's lookup, then the blocks */
    for (int l = -1; l < L; l++) {
        if (l >= 0 && on[O_CHECKPOINT])
            S->coords[S->n_coords++] = (coord){l, 0, O_CHECKPOINT};
        for (int i = 0; i < (l < 0 ? 1 : FF_BLOCK_LAYERS); i++)
            for (int w = 0; w < O_CHECKPOINT; w++)
                /* (the head's dW goes to the embedding's gradient: its
                 * reduce-scatter follows the lookup, not a product) */
                if (on[w] && !(l < 0 && w == O_RS_CMM))
                    S->coords[S->n_coords++] = (coord){l, i, w};
    }
    return FF_OK;
}

/* Coordinate descent: each option in turn set to its fastest candidate
 * (the others fixed; a change only if strictly faster), sweeps until one
 * changes nothing. */
static int descend(search *S, int max_sweeps, double *t_cur)
{
    for (int sweep = 0; sweep < max_sweeps; sweep++) {
        int changed = 0;
        for (int c = 0; c < S->n_coords; c++) {
            const coord *x = &S->coords[c];
            int *f = field(&S->plan, x), was = *f, best = was;
            double t_best = *t_cur;
            for (int v = 0; v < S->n_values[x->which]; v++) {
                int value = S->values[x->which][v];
                if (value == was)
                    continue;
                *f = value;
                double t;
                int rc = evaluate(S, &t);
                if (rc != FF_OK)
                    return rc;
                if (t < t_best)
                    t_best = t, best = value;
            }
            *f = best;
            if (best != was) {
                *t_cur = t_best;
                changed = 1;
            }
        }
        if (!changed)
            break;
    }
    return FF_OK;
}

/* Metropolis-Hastings over single-option moves; S->plan ends as the best
 * plan seen. */
static int metropolis(search *S, const plan_search_space *sp, uint64_t seed, double *t_cur)
{
    long iters = sp->mh_iters;
    if (iters <= 0) {
        iters = 20L * S->n_coords;
        iters = iters < 400 ? 400 : iters > 20000 ? 20000 : iters;
    }
    size_t bytes = (size_t)S->plan.layers * sizeof *S->plan.blocks;
    ff_block_opts *best = malloc(bytes);
    if (!best)
        return ff_format_error(S->err, S->err_len, FF_ENOMEM, "out of memory for the search");
    memcpy(best, S->plan.blocks, bytes);
    ff_layer_opts best_head = S->plan.head;
    double t_best = *t_cur;
    int rc = FF_OK;
    for (long it = 0; it < iters && S->n_coords > 0 && rc == FF_OK; it++) {
        /* three draws per proposal: the option, its new value, acceptance */
        double u[3];
        for (int k = 0; k < 3; k++)
            u[k] = ff_rng_uniform(seed, 0, 3 * (uint64_t)it + (uint64_t)k);
        const coord *x = &S->coords[(int)(u[0] * S->n_coords) % S->n_coords];
        int *f = field(&S->plan, x), was = *f;
        int n = S->n_values[x->which], v = 0;
        if (n < 2)
            continue;
        int pick = (int)(u[1] * (n - 1)) % (n - 1);
        /* the pick-th candidate other than the current value */
        for (int seen = -1; v < n; v++)
            if (S->values[x->which][v] != was && ++seen == pick)
                break;
        if (v == n)
            continue; /* the current value is not a candidate: no move */
        *f = S->values[x->which][v];
        double t;
        if ((rc = evaluate(S, &t)) != FF_OK)
            break;
        int accept =
            t <= *t_cur || (isfinite(t) && u[2] < exp(-(t - *t_cur) / (sp->mh_temp * *t_cur)));
        if (!accept) {
            *f = was;
            continue;
        }
        *t_cur = t;
        if (t < t_best) {
            t_best = t;
            memcpy(best, S->plan.blocks, bytes);
            best_head = S->plan.head;
        }
    }
    memcpy(S->plan.blocks, best, bytes);
    S->plan.head = best_head;
    *t_cur = t_best;
    free(best);
    return rc;
}

/* The uniform plan of cfg on grid g, as ff_plan_evaluate resolves it
 * (r: its evaluation). */
static int uniform_start(const ff_plan_config *cfg, ff_dims g, const ff_plan_result *r,
                         ff_layer_plan *p, char *err, size_t err_len)
{
    const int L = cfg->model.layers;
    ff_layer_opts o;
    o.decompose = 0;
    o.oar = (cfg->overlap & FF_OVERLAP_OAR) != 0;
    o.ors = (cfg->overlap & FF_OVERLAP_ORS) != 0;
    o.oag = (cfg->overlap & FF_OVERLAP_OAG) != 0;
    o.ag_cache = 1;
    o.wire_bytes = ff_plan_precision(cfg) == FF_PLAN_BF16_MIXED ? 2 : cfg->wire_bytes;
    o.rs_cmm = cfg->rs_cmm;
    int rc = ff_layer_plan_uniform(p, L, &o, r->checkpoint, err, err_len);
    if (rc != FF_OK || g.z == 1) /* nothing is gathered: the run's default, cached */
        return rc;
    /* the AG cache holds the last ag_cache blocks, and wte if every block */
    p->head.ag_cache = r->ag_cache >= L;
    for (int l = 0; l < L; l++)
        for (int i = 0; i < FF_BLOCK_LAYERS; i++)
            p->blocks[l].layer[i].ag_cache = l >= L - r->ag_cache;
    return FF_OK;
}

int plan_search(const ff_plan_config *cfg, ff_dims grid, int method, uint64_t seed,
                const plan_search_space *sp, ff_layer_plan *out, ff_plan_result *res,
                long *evaluations, char *err, size_t err_len)
{
    memset(out, 0, sizeof *out);
    if (evaluations)
        *evaluations = 0;
    if (method != 0 && method != 1)
        return ff_format_error(err, err_len, FF_EINVAL,
                               "search method %d: expected 0 (coordinate descent) or 1 "
                               "(Metropolis-Hastings)",
                               method);
    if (cfg->cost != FF_COST_FULL)
        return ff_format_error(err, err_len, FF_EINVAL,
                               "a per-layer plan needs the full cost model, not %s",
                               ff_cost_name(cfg->cost));
    if (cfg->stages != 1 || cfg->micro_batches == FF_PLAN_AUTO)
        return ff_format_error(err, err_len, FF_EINVAL,
                               "a per-layer plan is for a grid without stages and a number of "
                               "micro-batches");
    if (sp->n_decompose < 1 || sp->n_decompose > PLAN_MAX_CANDIDATES || sp->max_sweeps < 1 ||
        !(sp->mh_temp > 0))
        return ff_format_error(err, err_len, FF_EINVAL, "a search space without candidates");
    /* the start, evaluated with every check of the configuration and grid */
    int rc = ff_plan_evaluate(cfg, grid, res, err, err_len);
    if (rc != FF_OK)
        return rc;
    if (res->rejected) {
        ff_plan_result divides;
        memset(&divides, 0, sizeof divides);
        return ff_format_error(err, err_len,
                               plan_check_divides(cfg, grid, &divides) ? FF_EDIVIDE : FF_EINVAL,
                               "grid %dx%dx%dx%d: %s", grid.x, grid.y, grid.z, grid.d, res->reason);
    }

    search S;
    memset(&S, 0, sizeof S);
    S.cfg = *cfg;
    S.g = grid;
    S.err = err;
    S.err_len = err_len;
    if (cfg->layers) {
        rc = ff_layer_plan_uniform(&S.plan, cfg->layers->layers, &cfg->layers->head, 0, err,
                                   err_len);
        if (rc == FF_OK)
            memcpy(S.plan.blocks, cfg->layers->blocks,
                   (size_t)S.plan.layers * sizeof *S.plan.blocks);
    } else {
        rc = uniform_start(cfg, grid, res, &S.plan, err, err_len);
    }
    const ff_model *md = &cfg->model;
    S.plan.layers = md->layers;
    S.plan.heads = md->heads;
    S.plan.hidden = md->hidden;
    S.plan.vocab = md->vocab;
    S.plan.grid = grid;
    S.plan.batch = cfg->batch;
    S.plan.seq = cfg->seq;
    S.plan.micro_batches = cfg->micro_batches;
    S.plan.panel_rows = cfg->panel_rows;
    S.plan.progress = cfg->progress;
    S.cfg.layers = &S.plan;
    S.res = malloc(sizeof *S.res);
    if (rc == FF_OK && !S.res)
        rc = ff_format_error(err, err_len, FF_ENOMEM, "out of memory for the search");
    if (rc == FF_OK)
        rc = build_coords(&S, sp);
    double t = 0;
    if (rc == FF_OK)
        rc = evaluate(&S, &t);
    if (rc == FF_OK && !isfinite(t)) /* a given start that does not fit */
        rc = ff_format_error(err, err_len, FF_EINVAL, "grid %dx%dx%dx%d: %s", grid.x, grid.y,
                             grid.z, grid.d, S.res->reason);
    if (rc == FF_OK)
        rc = method == 0 ? descend(&S, sp->max_sweeps, &t) : metropolis(&S, sp, seed, &t);
    if (rc == FF_OK) {
        rc = ff_plan_evaluate(&S.cfg, grid, res, err, err_len);
        S.plan.predicted_step_s = res->step_s;
    }
    if (evaluations)
        *evaluations = S.evaluations;
    plan_ops_free(&S.ops);
    free(S.res);
    free(S.coords);
    if (rc == FF_OK)
        *out = S.plan;
    else
        ff_layer_plan_free(&S.plan);
    return rc;
}

int ff_plan_per_layer(const ff_plan_config *cfg, ff_dims grid, int method, uint64_t seed,
                      ff_layer_plan *out, ff_plan_result *res, char *err, size_t err_len)
{
    if (cfg->model.kind == FF_MODEL_UNET)
        return ff_format_error(err, err_len, FF_EUNSUPPORTED,
                               "the planner's U-Net with a per-layer plan is not supported yet");
    plan_search_space sp;
    plan_search_space_default(&sp);
    return plan_search(cfg, grid, method, seed, &sp, out, res, NULL, err, err_len);
}
