/* The planner's entry points: configuration, grid enumeration, evaluation of
 * one grid under the chosen cost model, and the ranked list of every grid. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h" /* ff_coll_model_ok */
#include "plan/plan_internal.h"

enum { MAX_RANKS = 1 << 24 };

static const char *const cost_names[FF_NCOST] = {"full", "paper", "axonn", "axonn-corrected"};

const char *ff_cost_name(ff_cost cost)
{
    return (unsigned)cost < FF_NCOST ? cost_names[cost] : "?";
}

int ff_cost_parse(const char *name)
{
    for (int i = 0; name && i < FF_NCOST; i++)
        if (!strcmp(name, cost_names[i]))
            return i;
    return -1;
}

void ff_plan_config_default(ff_plan_config *cfg)
{
    memset(cfg, 0, sizeof *cfg);
    cfg->batch = 8;
    cfg->seq = 1024;
    cfg->ranks = 1;
    ff_profile_preset("this", &cfg->machine, NULL, 0);
    cfg->cost = FF_COST_FULL;
    cfg->checkpoint = FF_PLAN_AUTO;
    cfg->ag_cache = FF_PLAN_AUTO;
    cfg->micro_batches = 1;
    cfg->wire_bytes = 4;
    cfg->overlap = FF_OVERLAP_ALL;
    cfg->min_tp = 0;
    cfg->grad_acc = 1;
    cfg->stages = 1;
    cfg->precision = FF_PLAN_AUTO;
    cfg->expert_parallel = 1;
    cfg->dtd = 1;
    cfg->progress = FF_PROGRESS_POLL;
    ff_coll_model_default(&cfg->coll);
}

int ff_plan_precision(const ff_plan_config *cfg)
{
    if (cfg->precision != FF_PLAN_AUTO)
        return cfg->precision;
    if (cfg->model.kind == FF_MODEL_UNET) /* (the U-Net trains in fp32 only) */
        return FF_PLAN_FP32;
    return cfg->cost == FF_COST_FULL ? cfg->machine.precision : FF_PLAN_FP32;
}

const char *ff_plan_group_name(int kind)
{
    if (kind == FF_PLAN_GROUP_EP)
        return "EP";
    if (kind == FF_PLAN_GROUP_EDP)
        return "EDP";
    return ff_group_kind_name((ff_group_kind)kind);
}

size_t ff_plan_grids(int ranks, ff_dims *out, size_t cap)
{
    size_t n = 0;
    if (ranks < 1)
        return 0;
    for (int x = 1; x <= ranks; x++) {
        if (ranks % x)
            continue;
        int rx = ranks / x;
        for (int y = 1; y <= rx; y++) {
            if (rx % y)
                continue;
            int ry = rx / y;
            for (int z = 1; z <= ry; z++) {
                if (ry % z)
                    continue;
                if (out && n < cap)
                    out[n] = (ff_dims){x, y, z, ry / z};
                n++;
            }
        }
    }
    return n;
}

/* ---- configuration ---- */

static int check_profile(const ff_profile *p, char *err, size_t len)
{
    if (p->ranks_per_node < 1)
        return ff_format_error(err, len, FF_EINVAL, "machine %s: ranks per node must be positive",
                               p->name);
    if (!(p->memory_bytes > 0) || !(p->gemm_flops > 0) || !(p->peak_flops > 0) ||
        !(p->mem_Bps > 0) || !(p->beta_intra_Bps > 0) || !(p->beta_inter_Bps > 0))
        return ff_format_error(err, len, FF_EINVAL,
                               "machine %s: memory, rates and bandwidths must be positive",
                               p->name);
    if (!(p->alpha_intra_s >= 0) || !(p->alpha_inter_s >= 0) || !(p->gemm_half_dim >= 0) ||
        !(p->gemm_call_s >= 0) || !(p->intra_overlap >= 0 && p->intra_overlap <= 1) ||
        p->cores_per_node < 0 || (p->attention_fused != 0 && p->attention_fused != 1))
        return ff_format_error(err, len, FF_EINVAL,
                               "machine %s: a latency or option is out of range", p->name);
    if (p->precision != FF_PLAN_FP32 && p->precision != FF_PLAN_BF16_MIXED)
        return ff_format_error(err, len, FF_EINVAL,
                               "machine %s: precision %d: expected fp32 or bf16-mixed", p->name,
                               p->precision);
    for (int i = 0; i < p->n_intra_bw; i++)
        if (!(p->intra_bw[i].Bps > 0))
            return ff_format_error(err, len, FF_EINVAL,
                                   "machine %s: intra-node bandwidths must be "
                                   "positive",
                                   p->name);
    return FF_OK;
}

/* Pipeline stages (docs/pipeline.md) and what the planner takes with them
 * (traffic_only: bytes, which only the cost model's automatic precision
 * changes: ff_plan_precision). */
static int check_stages(const ff_plan_config *cfg, int traffic_only, char *err, size_t len)
{
    const int P = cfg->stages, L = cfg->model.layers;
    if (P < 1 && P != FF_PLAN_AUTO)
        return ff_format_error(err, len, FF_EINVAL, "stages must be at least 1 or automatic");
    if (cfg->schedule != 0 && cfg->schedule != 1)
        return ff_format_error(err, len, FF_EINVAL,
                               "schedule %d: expected 0 (message-driven) or 1 (1F1B)",
                               cfg->schedule);
    if (cfg->pipe_limit < 0)
        return ff_format_error(err, len, FF_EINVAL, "the pipeline limit must be >= 0");
    if ((P != 1 || cfg->micro_batches == FF_PLAN_AUTO) && cfg->cost != FF_COST_FULL &&
        !traffic_only)
        return ff_format_error(err, len, FF_EINVAL,
                               "stages and automatic micro-batches need the full cost model, "
                               "not %s",
                               ff_cost_name(cfg->cost));
    if (P != 1 && cfg->layers)
        return ff_format_error(err, len, FF_EINVAL,
                               "a per-layer plan does not take pipeline stages");
    if (P != 1 && cfg->ag_cache != FF_PLAN_AUTO && cfg->ag_cache != 0 && cfg->ag_cache < L)
        return ff_format_error(err, len, FF_EINVAL,
                               "with stages the AG cache holds every block or none, not %d of %d",
                               cfg->ag_cache, L);
    if (!cfg->stage_layers)
        return FF_OK;
    if (P == FF_PLAN_AUTO)
        return ff_format_error(err, len, FF_EINVAL,
                               "blocks per stage need a number of stages, not automatic");
    int sum = 0;
    for (int k = 0; k < P; k++) {
        if (cfg->stage_layers[k] < 1)
            return ff_format_error(err, len, FF_EINVAL, "stage %d has %d blocks", k,
                                   cfg->stage_layers[k]);
        sum += cfg->stage_layers[k];
    }
    if (sum != L)
        return ff_format_error(err, len, FF_EINVAL,
                               "the stages' blocks add up to %d, but the model has L=%d", sum, L);
    return FF_OK;
}

/* A mixture of experts: the full cost model, no stages (not modelled
 * yet), expert parallelism where there are experts. */
static int check_experts(const ff_plan_config *cfg, char *err, size_t len)
{
    const int E = cfg->model.experts;
    if (cfg->expert_parallel < 0 && cfg->expert_parallel != FF_PLAN_AUTO)
        return ff_format_error(err, len, FF_EINVAL,
                               "expert parallelism %d: expected 1 or more (0: none), or automatic",
                               cfg->expert_parallel);
    if (!E && cfg->expert_parallel > 1)
        return ff_format_error(err, len, FF_EINVAL,
                               "expert parallelism %d needs a model with experts",
                               cfg->expert_parallel);
    if (!(cfg->sparsity >= 0 && cfg->sparsity < 1))
        return ff_format_error(err, len, FF_EINVAL, "sparsity %g: expected 0 <= p < 1",
                               cfg->sparsity);
    if (cfg->samo && !(cfg->sparsity > 0))
        return ff_format_error(err, len, FF_EINVAL, "SAMO needs a pruned model: a sparsity > 0");
    if (cfg->sparsity > 0 && cfg->cost != FF_COST_FULL)
        return ff_format_error(err, len, FF_EINVAL,
                               "a pruned model needs the full cost model, not %s",
                               ff_cost_name(cfg->cost));
    if (E && cfg->cost != FF_COST_FULL)
        return ff_format_error(err, len, FF_EINVAL,
                               "a mixture of experts needs the full cost model, not %s",
                               ff_cost_name(cfg->cost));
    if (E && cfg->stages != 1)
        return ff_format_error(err, len, FF_EINVAL,
                               "the planner does not model a mixture of experts with pipeline "
                               "stages yet");
    if (cfg->cac && cfg->checkpoint == 0)
        return ff_format_error(err, len, FF_EINVAL, "CAC needs activation checkpointing");
    if (cfg->zero < 0 || cfg->zero > 2)
        return ff_format_error(err, len, FF_EINVAL, "zero %d: the choices are 0, 1 and 2",
                               cfg->zero);
    const char *zwhy = !cfg->zero                  ? NULL
                       : cfg->cost != FF_COST_FULL ? "a cost model other than full"
                       : cfg->sparsity > 0 && !cfg->samo
                           ? "masked training (a pruned model without SAMO)"
                           : NULL;
    if (zwhy)
        return ff_format_error(err, len, FF_EUNSUPPORTED,
                               "ZeRO (zero %d) with %s is not supported yet", cfg->zero, zwhy);
    return FF_OK;
}

static int check_config_for(const ff_plan_config *cfg, int traffic_only, char *err, size_t len)
{
    int rc = ff_model_check(&cfg->model, err, len);
    if (rc != FF_OK)
        return rc;
    if (cfg->model.kind == FF_MODEL_UNET) { /* the U-Net's own checks (unet.c) */
        if ((rc = plan_unet_check(cfg, err, len)) != FF_OK)
            return rc;
        if (cfg->wire_bytes != 4 && cfg->wire_bytes != 2)
            return ff_format_error(err, len, FF_EINVAL, "wire must be 4 (fp32) or 2 (bf16) bytes");
        if (cfg->overlap > FF_OVERLAP_ALL)
            return ff_format_error(err, len, FF_EINVAL, "unknown overlap bits 0x%x", cfg->overlap);
        if (cfg->ag_cache < FF_PLAN_AUTO)
            return ff_format_error(err, len, FF_EINVAL,
                                   "AG cache must be a number of layers or automatic");
        if (!ff_coll_model_ok(&cfg->coll))
            return ff_format_error(err, len, FF_EINVAL,
                                   "collective model: alphas, small_max and reduce_Bps must be "
                                   ">= 0 and betas > 0, all finite");
        return check_profile(&cfg->machine, err, len);
    }
    if (cfg->batch < 1 || cfg->batch > ((int64_t)1 << 40))
        return ff_format_error(err, len, FF_EINVAL, "batch %lld: expected 1 to 2^40 sequences",
                               (long long)cfg->batch);
    if (cfg->seq < 1 || cfg->seq > ((int64_t)1 << 24))
        return ff_format_error(err, len, FF_EINVAL, "sequence length %lld: expected 1 to 2^24",
                               (long long)cfg->seq);
    if (cfg->model.max_seq > 0 && cfg->seq > cfg->model.max_seq)
        return ff_format_error(err, len, FF_EINVAL,
                               "sequence length %lld exceeds the %lld positions of model %s",
                               (long long)cfg->seq, (long long)cfg->model.max_seq, cfg->model.name);
    double tokens = (double)cfg->batch * (double)cfg->seq;
    double widest =
        fmax((double)ff_model_padded_vocab(&cfg->model),
             fmax(4.0 * (double)cfg->model.hidden, (double)cfg->model.heads * (double)cfg->seq));
    if (tokens * widest > 4e18)
        return ff_format_error(err, len, FF_EINVAL, "batch x sequence length is too large to plan");
    if ((unsigned)cfg->cost >= FF_NCOST)
        return ff_format_error(err, len, FF_EINVAL, "unknown cost model %d", (int)cfg->cost);
    if (cfg->checkpoint < FF_PLAN_AUTO || cfg->checkpoint > 1)
        return ff_format_error(err, len, FF_EINVAL, "checkpoint must be 0, 1 or automatic");
    if (cfg->ag_cache < FF_PLAN_AUTO)
        return ff_format_error(err, len, FF_EINVAL,
                               "AG cache must be a number of blocks or automatic");
    if (cfg->micro_batches < 1 && cfg->micro_batches != FF_PLAN_AUTO)
        return ff_format_error(err, len, FF_EINVAL, "micro-batches must be at least 1");
    if ((rc = check_stages(cfg, traffic_only, err, len)) != FF_OK)
        return rc;
    if (cfg->precision != FF_PLAN_FP32 && cfg->precision != FF_PLAN_BF16_MIXED &&
        cfg->precision != FF_PLAN_AUTO)
        return ff_format_error(err, len, FF_EINVAL,
                               "precision %d: expected fp32, bf16-mixed or automatic",
                               cfg->precision);
    if (cfg->precision == FF_PLAN_BF16_MIXED && cfg->cost != FF_COST_FULL)
        return ff_format_error(err, len, FF_EINVAL,
                               "bf16-mixed precision needs the full cost model, not %s",
                               ff_cost_name(cfg->cost));
    if (cfg->wire_bytes != 2 && cfg->wire_bytes != 4)
        return ff_format_error(err, len, FF_EINVAL, "wire must be 4 (fp32) or 2 (bf16) bytes");
    if (cfg->overlap > FF_OVERLAP_ALL)
        return ff_format_error(err, len, FF_EINVAL, "unknown overlap bits 0x%x", cfg->overlap);
    if (cfg->progress != FF_PROGRESS_POLL && cfg->progress != FF_PROGRESS_THREAD &&
        cfg->progress != FF_PROGRESS_WAIT)
        return ff_format_error(err, len, FF_EINVAL,
                               "progress %d: expected FF_PROGRESS_POLL, _THREAD or _WAIT",
                               cfg->progress);
    if (cfg->min_tp < 0 || cfg->grad_acc < 1)
        return ff_format_error(err, len, FF_EINVAL, "min-tp must be >= 0 and grad-acc >= 1");
    if (!ff_coll_model_ok(&cfg->coll))
        return ff_format_error(
            err, len, FF_EINVAL,
            "collective model: alphas, small_max and reduce_Bps must be >= 0 and "
            "betas > 0, all finite");
    if (cfg->layers) {
        const ff_model *md = &cfg->model;
        if (cfg->cost != FF_COST_FULL)
            return ff_format_error(err, len, FF_EINVAL,
                                   "a per-layer plan needs the full cost model, not %s",
                                   ff_cost_name(cfg->cost));
        /* the model only here; the grid where it is known */
        ff_dims its = cfg->layers->grid;
        if ((rc = ff_layer_plan_check(cfg->layers, err, len)) != FF_OK ||
            (rc = ff_layer_plan_match(cfg->layers, md->layers, md->heads, md->hidden, md->vocab,
                                      its, err, len)) != FF_OK)
            return rc;
    }
    if ((rc = check_experts(cfg, err, len)) != FF_OK)
        return rc;
    return check_profile(&cfg->machine, err, len);
}

static int check_config(const ff_plan_config *cfg, char *err, size_t len)
{
    return check_config_for(cfg, 0, err, len);
}

/* A per-layer plan is for one grid. */
static int check_plan_grid(const ff_plan_config *cfg, ff_dims g, char *err, size_t len)
{
    const ff_model *md = &cfg->model;
    if (!cfg->layers)
        return FF_OK;
    return ff_layer_plan_match(cfg->layers, md->layers, md->heads, md->hidden, md->vocab, g, err,
                               len);
}

static int is_pow2(int v) { return v > 0 && (v & (v - 1)) == 0; }

static int axonn_min_tp(const ff_plan_config *cfg)
{
    return cfg->min_tp > 0 ? cfg->min_tp : ff_model_axonn_min_tp(&cfg->model);
}

/* The tool's search space: powers of two, Gr*Gc*Gd >= min_tp, batch divisible
 * by Gd*Gdata. A grid outside it is rejected with the rule it breaks. */
static double eval_axonn(const ff_plan_config *cfg, ff_dims g, ff_plan_result *r)
{
    int gr = g.x, gc = g.y, gd = g.z, gdata = g.d;
    r->grid = g;
    if (!is_pow2(gr) || !is_pow2(gc) || !is_pow2(gd) || !is_pow2(gdata))
        plan_reject(r, "AxoNN's tool searches powers of two only");
    int min_tp = axonn_min_tp(cfg);
    if ((int64_t)gr * gc * gd < min_tp)
        plan_reject(r, "Gr*Gc*Gd = %lld is below the tool's minimum tensor parallelism %d",
                    (long long)gr * gc * gd, min_tp);
    if (cfg->batch % ((int64_t)gd * gdata))
        plan_reject(r, "batch %lld does not divide over Gd*Gdata = %lld", (long long)cfg->batch,
                    (long long)gd * gdata);
    if (r->rejected)
        return 0;
    return plan_eval_axonn(cfg, gr, gc, gd, gdata, cfg->cost == FF_COST_AXONN_CORRECTED, r);
}

/* Evaluates one grid for the micro-batches of cfg; *key is what grids are
 * ranked by. */
static int evaluate_one(const ff_plan_config *cfg, ff_dims g, ff_plan_result *r, plan_ops *ops,
                        double *key, char *err, size_t len)
{
    memset(r, 0, sizeof *r);
    r->grid = g;
    r->stages = cfg->stages;
    r->micro_batches = cfg->micro_batches;
    r->expert_parallel = cfg->expert_parallel > 1 ? cfg->expert_parallel : 1;
    const ff_model *md = &cfg->model;
    double B = (double)cfg->batch, T = (double)cfg->seq;
    r->model_flops = 6.0 * (double)ff_model_matmul_params(md) * B * T +
                     6.0 * md->layers * B * T * T * (double)md->hidden;
    int rc = FF_OK;
    switch (cfg->cost) {
    case FF_COST_FULL: rc = plan_eval_full(cfg, g, r, ops, err, len); break;
    case FF_COST_PAPER:
        plan_links(&cfg->machine, g, 1, 1, r->link);
        if (!plan_check_divides(cfg, g, r)) {
            plan_shape s;
            plan_shape_init(cfg, g, &s);
            if (plan_fit_memory(cfg, g, r, &s))
                plan_eval_paper(cfg, g, r);
        }
        break;
    default: *key = eval_axonn(cfg, g, r); return FF_OK;
    }
    *key = r->step_s;
    if (cfg->cost == FF_COST_FULL && !r->rejected && r->step_s > 0) {
        r->flops_per_rank_s =
            r->model_flops / plan_group_size(g, FF_GROUP_WORLD) / cfg->stages / r->step_s;
        r->peak_fraction = r->flops_per_rank_s / cfg->machine.peak_flops;
    }
    return rc;
}

/* Whether candidate t (m_t micro-batches) beats the kept r (m_r): one that
 * fits beats one that does not; of two that fit the faster, of two that do
 * not the one that needs less memory; on a tie the fewer micro-batches. */
static int better_micro(const ff_plan_result *t, double k_t, int64_t m_t, const ff_plan_result *r,
                        double k_r, int64_t m_r)
{
    if (t->rejected != r->rejected)
        return r->rejected;
    if (!t->rejected && k_t != k_r)
        return k_t < k_r;
    if (t->rejected && t->mem_total != r->mem_total)
        return t->mem_total < r->mem_total;
    return m_t < m_r;
}

typedef struct {
    double bound;
    int64_t M;
} micro_bound;

static int by_bound(const void *a, const void *b)
{
    const micro_bound *p = a, *q = b;
    if (p->bound != q->bound)
        return p->bound < q->bound ? -1 : 1;
    return p->M < q->M ? -1 : p->M > q->M;
}

/* Evaluates one grid; with automatic micro-batches, every count that
 * divides the grid's sequences per rank, the fastest that fits kept (on a
 * tie the fewest; if none fits, the one that needs least memory, rejected).
 * With the full model on one stage, the counts that fit are evaluated in
 * the order of a lower bound of their step (plan_full_bound, from lists of
 * one and two micro-batches), and once the bound exceeds the fastest step
 * found the rest cannot beat it and are not built: the same answer as
 * evaluating every count, without the lists of thousands of micro-batches
 * (GPT-80B on 1024 ranks: docs/planner.md). */
static int evaluate(const ff_plan_config *cfg, ff_dims g, ff_plan_result *r, plan_ops *ops,
                    double *key, char *err, size_t len)
{
    if (cfg->model.kind == FF_MODEL_UNET) { /* one micro-batch, the full model (unet.c) */
        memset(r, 0, sizeof *r);
        r->grid = g;
        r->stages = 1;
        int rc = plan_unet_eval(cfg, g, r, ops, err, len);
        *key = r->step_s;
        return rc;
    }
    if (cfg->micro_batches != FF_PLAN_AUTO)
        return evaluate_one(cfg, g, r, ops, key, err, len);
    ff_plan_config one = *cfg;
    int64_t per_rank = cfg->batch / ((int64_t)g.z * g.d);
    if (cfg->batch % ((int64_t)g.z * g.d) || per_rank > (1 << 20))
        per_rank = 1; /* rejected for the batch below, or too many counts to try */
    int n_div = 0;
    for (int64_t M = 1; M <= per_rank; M++)
        n_div += per_rank % M == 0;
    ff_plan_result *t = malloc(sizeof *t);
    micro_bound *fit = malloc((size_t)n_div * sizeof *fit);
    if (!t || !fit) {
        free(t), free(fit);
        return ff_format_error(err, len, FF_ENOMEM, "out of memory");
    }
    int rc = FF_OK, n_fit = 0;
    const int bounded = cfg->cost == FF_COST_FULL && cfg->stages == 1;
    for (int64_t M = 1; bounded && M <= per_rank && rc == FF_OK; M++) {
        if (per_rank % M)
            continue;
        one.micro_batches = (int)M;
        double b;
        rc = plan_full_bound(&one, g, ops, &b, err, len);
        if (rc == FF_OK && b >= 0)
            fit[n_fit++] = (micro_bound){b, M};
    }
    int have = 0;
    int64_t best_M = 0;
    if (n_fit > 0) {
        /* rounding: the bound is within a relative 1e-12 of what it bounds */
        qsort(fit, (size_t)n_fit, sizeof *fit, by_bound);
        for (int i = 0; i < n_fit && rc == FF_OK; i++) {
            if (have && !r->rejected && fit[i].bound * (1 - 1e-9) > *key)
                break;
            one.micro_batches = (int)fit[i].M;
            double k;
            rc = evaluate_one(&one, g, t, ops, &k, err, len);
            if (rc == FF_OK && (!have || better_micro(t, k, fit[i].M, r, *key, best_M))) {
                *r = *t;
                *key = k;
                best_M = fit[i].M;
                have = 1;
            }
        }
    } else {
        /* every count (none fits: the least memory, or no bound) */
        for (int64_t M = 1; M <= per_rank && rc == FF_OK; M++) {
            if (per_rank % M)
                continue;
            one.micro_batches = (int)M;
            double k;
            rc = evaluate_one(&one, g, t, ops, &k, err, len);
            if (rc == FF_OK && (!have || better_micro(t, k, M, r, *key, best_M))) {
                *r = *t;
                *key = k;
                best_M = M;
                have = 1;
            }
        }
    }
    free(t);
    free(fit);
    return rc;
}

static int check_grid(ff_dims g, char *err, size_t len)
{
    if (g.x < 1 || g.y < 1 || g.z < 1 || g.d < 1)
        return ff_format_error(err, len, FF_EGRID, "grid %dx%dx%dx%d: every size must be positive",
                               g.x, g.y, g.z, g.d);
    if ((double)g.x * g.y * g.z * g.d > MAX_RANKS)
        return ff_format_error(err, len, FF_EGRID, "grid %dx%dx%dx%d: more than %d ranks", g.x, g.y,
                               g.z, g.d, MAX_RANKS);
    return FF_OK;
}

int ff_plan_evaluate(const ff_plan_config *cfg, ff_dims grid, ff_plan_result *out, char *err,
                     size_t err_len)
{
    int rc = check_config(cfg, err, err_len);
    if (rc == FF_OK && cfg->stages == FF_PLAN_AUTO)
        rc = ff_format_error(err, err_len, FF_EINVAL,
                             "one grid is evaluated for a number of stages, not automatic");
    if (rc == FF_OK && cfg->expert_parallel == FF_PLAN_AUTO)
        rc = ff_format_error(err, err_len, FF_EINVAL,
                             "one grid is evaluated for one expert parallelism, not automatic");
    if (rc == FF_OK)
        rc = check_grid(grid, err, err_len);
    if (rc == FF_OK)
        rc = check_plan_grid(cfg, grid, err, err_len);
    if (rc != FF_OK)
        return rc;
    plan_ops ops = {0};
    double key;
    rc = evaluate(cfg, grid, out, &ops, &key, err, err_len);
    plan_ops_free(&ops);
    return rc;
}

static int check_coords(ff_dims grid, ff_dims coords, char *err, size_t err_len)
{
    if (coords.x < 0 || coords.x >= grid.x || coords.y < 0 || coords.y >= grid.y || coords.z < 0 ||
        coords.z >= grid.z || coords.d < 0 || coords.d >= grid.d)
        return ff_format_error(
            err, err_len, FF_EINVAL, "coordinates (%d, %d, %d, %d) lie outside grid %dx%dx%dx%d",
            coords.x, coords.y, coords.z, coords.d, grid.x, grid.y, grid.z, grid.d);
    return FF_OK;
}

int ff_plan_traffic(const ff_plan_config *cfg, ff_dims grid, ff_dims coords,
                    ff_plan_coll out[FF_PLAN_NGROUPS][FF_NCOLL], char *err, size_t err_len)
{
    memset(out, 0, sizeof(ff_plan_coll) * FF_PLAN_NGROUPS * FF_NCOLL);
    int rc = check_config(cfg, err, err_len);
    if (rc == FF_OK)
        rc = check_grid(grid, err, err_len);
    if (rc == FF_OK)
        rc = check_plan_grid(cfg, grid, err, err_len);
    if (rc != FF_OK)
        return rc;
    if ((rc = check_coords(grid, coords, err, err_len)))
        return rc;
    if (cfg->model.kind == FF_MODEL_UNET)
        return plan_unet_traffic(cfg, grid, coords, out, err, err_len);
    if (cfg->micro_batches == FF_PLAN_AUTO || cfg->expert_parallel == FF_PLAN_AUTO)
        return ff_format_error(err, err_len, FF_EINVAL,
                               "traffic is for a number of micro-batches and an expert "
                               "parallelism, not automatic");
    if (cfg->stages != 1)
        return ff_format_error(err, err_len, FF_EINVAL,
                               "with pipeline stages, ff_plan_traffic_stage gives a stage's "
                               "traffic");
    return plan_traffic_of(cfg, grid, coords, 0, out, NULL, err, err_len);
}

int ff_plan_traffic_stage(const ff_plan_config *cfg, ff_dims grid, ff_dims coords, int stage,
                          ff_plan_coll out[FF_PLAN_NGROUPS][FF_NCOLL], ff_plan_coll *p2p, char *err,
                          size_t err_len)
{
    memset(out, 0, sizeof(ff_plan_coll) * FF_PLAN_NGROUPS * FF_NCOLL);
    memset(p2p, 0, sizeof *p2p);
    int rc = check_config_for(cfg, 1, err, err_len);
    if (rc == FF_OK)
        rc = check_grid(grid, err, err_len);
    if (rc != FF_OK)
        return rc;
    const int P = cfg->stages, L = cfg->model.layers;
    if (P == FF_PLAN_AUTO)
        return ff_format_error(err, err_len, FF_EINVAL,
                               "a stage's traffic is for a number of stages, not automatic");
    if (P < 1 || P > L || stage < 0 || stage >= P)
        return ff_format_error(err, err_len, FF_EINVAL, "stage %d of %d stages for %d blocks",
                               stage, P, L);
    if (cfg->checkpoint == FF_PLAN_AUTO || cfg->micro_batches == FF_PLAN_AUTO)
        return ff_format_error(err, err_len, FF_EINVAL,
                               "a stage's traffic is for checkpointing on or off and a number of "
                               "micro-batches, not automatic");
    if ((rc = check_coords(grid, coords, err, err_len)))
        return rc;
    return plan_traffic_of(cfg, grid, coords, stage, out, p2p, err, err_len);
}

/* ---- the ranked list ---- */

struct ff_plan {
    ff_plan_config cfg;
    ff_plan_result *results;
    size_t count, accepted;
    char err[512];
};

typedef struct {
    double key;
    size_t index;
    int rejected;
} rank_entry;

static int by_rank(const void *a, const void *b)
{
    const rank_entry *p = a, *q = b;
    if (p->rejected != q->rejected)
        return p->rejected - q->rejected;
    if (!p->rejected && p->key != q->key)
        return p->key < q->key ? -1 : 1;
    return p->index < q->index ? -1 : p->index > q->index; /* enumeration order */
}

/* AxoNN's loops: Gc outermost, then Gr, Gd, Gdata, each 1, 2, 4, ... */
static size_t axonn_grids(int ranks, ff_dims *out, size_t cap)
{
    size_t n = 0;
    for (int64_t gc = 1; gc <= ranks; gc *= 2)
        for (int64_t gr = 1; gr <= ranks; gr *= 2)
            for (int64_t gd = 1; gd <= ranks; gd *= 2)
                for (int64_t gdata = 1; gdata <= ranks; gdata *= 2)
                    if (gc * gr * gd * gdata == ranks) {
                        if (out && n < cap)
                            out[n] = (ff_dims){(int)gr, (int)gc, (int)gd, (int)gdata};
                        n++;
                    }
    return n;
}

int ff_plan_create(ff_plan **out, const ff_plan_config *cfg)
{
    ff_plan *plan = calloc(1, sizeof *plan);
    *out = plan;
    if (!plan)
        return FF_ENOMEM;
    plan->cfg = *cfg;
    int rc = check_config(cfg, plan->err, sizeof plan->err);
    if (rc == FF_OK && (cfg->ranks < 1 || cfg->ranks > MAX_RANKS))
        rc = ff_format_error(plan->err, sizeof plan->err, FF_EINVAL, "ranks %d: expected 1 to %d",
                             cfg->ranks, MAX_RANKS);
    if (rc == FF_OK && cfg->layers)
        rc = ff_format_error(plan->err, sizeof plan->err, FF_EINVAL,
                             "a per-layer plan is for one grid: evaluate it there "
                             "(ff_plan_evaluate), not on every grid");
    plan->cfg.layers = NULL; /* the caller's, not kept */
    plan->cfg.stage_layers = NULL;
    if (rc != FF_OK)
        return rc;
    int axonn = cfg->cost == FF_COST_AXONN || cfg->cost == FF_COST_AXONN_CORRECTED;
    /* the numbers of stages: cfg's, or every one dividing the ranks with a
     * block or more each; the grids of each's ranks per stage */
    int P_lo = cfg->stages == FF_PLAN_AUTO ? 1 : cfg->stages;
    int P_hi = cfg->stages == FF_PLAN_AUTO ? cfg->model.layers : cfg->stages;
    if (cfg->ranks % P_lo)
        rc = ff_format_error(plan->err, sizeof plan->err, FF_EINVAL,
                             "%d ranks do not split into %d stages", cfg->ranks, P_lo);
    if (rc != FF_OK)
        return rc;
    size_t n = 0;
    for (int P = P_lo; P <= P_hi; P++)
        if (cfg->ranks % P == 0)
            n += axonn ? axonn_grids(cfg->ranks / P, NULL, 0)
                       : ff_plan_grids(cfg->ranks / P, NULL, 0);
    /* with automatic expert parallelism each grid once per Ge that divides
     * Gd and E: at most the divisors of the ranks, d(n) < 2 sqrt(n) */
    const int auto_ge = cfg->expert_parallel == FF_PLAN_AUTO;
    int n_ge = 1;
    for (int v = 2; auto_ge && v <= cfg->ranks; v++)
        n_ge += cfg->ranks % v == 0;
    ff_dims *grids = malloc((n ? n : 1) * sizeof *grids);
    int *stages = malloc((n ? n : 1) * sizeof *stages);
    ff_plan_result *res = calloc(n ? n * (size_t)n_ge : 1, sizeof *res);
    rank_entry *order = malloc((n ? n * (size_t)n_ge : 1) * sizeof *order);
    plan_ops ops = {0};
    if (!grids || !stages || !res || !order) {
        rc =
            ff_format_error(plan->err, sizeof plan->err, FF_ENOMEM, "out of memory (%zu grids)", n);
        goto done;
    }
    size_t at = 0;
    for (int P = P_lo; P <= P_hi; P++) {
        if (cfg->ranks % P)
            continue;
        size_t k = axonn ? axonn_grids(cfg->ranks / P, grids + at, n - at)
                         : ff_plan_grids(cfg->ranks / P, grids + at, n - at);
        for (size_t i = 0; i < k; i++)
            stages[at + i] = P;
        at += k;
    }
    ff_plan_config one = *cfg;
    size_t n_eval = 0;
    for (size_t i = 0; i < n && rc == FF_OK; i++) {
        one.stages = stages[i];
        for (int ge = 1; ge <= (auto_ge ? grids[i].d : 1) && rc == FF_OK; ge++) {
            if (auto_ge && (grids[i].d % ge || (ge > 1 && cfg->model.experts % ge) ||
                            (ge > 1 && !cfg->model.experts)))
                continue;
            if (auto_ge)
                one.expert_parallel = ge;
            size_t j = n_eval++;
            rc =
                evaluate(&one, grids[i], &res[j], &ops, &order[j].key, plan->err, sizeof plan->err);
            order[j].index = j;
            order[j].rejected = res[j].rejected;
        }
    }
    n = n_eval;
    if (rc != FF_OK)
        goto done;
    qsort(order, n, sizeof *order, by_rank);
    plan->results = calloc(n ? n : 1, sizeof *plan->results);
    if (!plan->results) {
        rc =
            ff_format_error(plan->err, sizeof plan->err, FF_ENOMEM, "out of memory (%zu grids)", n);
        goto done;
    }
    for (size_t i = 0; i < n; i++) {
        plan->results[i] = res[order[i].index];
        plan->accepted += !order[i].rejected;
    }
    plan->count = n;
done:
    plan_ops_free(&ops);
    free(grids);
    free(stages);
    free(res);
    free(order);
    return rc;
}

void ff_plan_destroy(ff_plan *plan)
{
    if (!plan)
        return;
    free(plan->results);
    free(plan);
}

const char *ff_plan_error(const ff_plan *plan) { return plan ? plan->err : "out of memory"; }
size_t ff_plan_count(const ff_plan *plan) { return plan ? plan->count : 0; }
size_t ff_plan_accepted(const ff_plan *plan) { return plan ? plan->accepted : 0; }
const ff_plan_config *ff_plan_config_of(const ff_plan *plan) { return plan ? &plan->cfg : NULL; }

const ff_plan_result *ff_plan_get(const ff_plan *plan, size_t i)
{
    return plan && i < plan->count ? &plan->results[i] : NULL;
}
