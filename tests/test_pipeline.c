/* Pipeline stages against the serial program (issue 26), on 8 ranks.
 *
 * Rank 0 alone runs the 1x1x1x1 program without stages (MPI_COMM_SELF) for
 * each number of micro-batches M used below. Then, for every P in {2, 4, 8}
 * and every 4D grid of 8/P ranks, with M in {P, 2P, 3P+1} (with the
 * argument `quick`, as the sanitizer build runs it: every other grid, M =
 * 3P+1 only), four variants
 * (message-driven and 1F1B schedule, activation checkpointing off and on)
 * run STEPS AdamW steps of M micro-batches each, and three more: the
 * pipeline limit at P/2 (message-driven) and at 1 (1F1B), and an uneven
 * split of the blocks. Compared on rank 0,
 * gathered to canonical layout:
 *  - the evaluation loss before training and each step's loss: relative
 *    error <= 1e-5, as for the 4D grids (tests/test_gpt.c);
 *  - step 0's gradient and the parameters after the steps, per tensor:
 *    max|a - ref| / max|ref| (parameters: over the change max|ref - init|)
 *    <= tol = 2 (4L + 4) gamma_K, K the longest sum (M B T rows of a step,
 *    4C, or V): tests/test_gpt.c derives it. Stages change only the order
 *    of sums: the tied embedding's gradient adds the lookup's and the LM
 *    head's contributions per stage and then the two, where the serial
 *    program adds them micro-batch by micro-batch;
 *  - the first six variants of one (grid, P, M): bitwise identical
 *    (schedules, limits and checkpointing change when a micro-batch's
 *    passes run, never their arithmetic: backward passes run in micro-batch
 *    order in every schedule). The uneven split is held to the serial
 *    bounds instead: it changes the length of each stage's all-reduce of
 *    its LayerNorm and bias gradients, and with it the ring's chunks and
 *    the order of additions;
 *  - padded vocabulary rows exactly zero;
 *  - the point-to-point counters of a step: every stage boundary carries one
 *    activation forward and one gradient back per micro-batch, each
 *    (B/(Gz Gd)) T (C/Gy) floats, so a rank sends and receives exactly
 *    M (first ? 0 : 1) + M (last ? 0 : 1) messages of that size each way;
 *    the first and the last stage also exchange their tied embedding's
 *    gradient shard (Vp C / (Gx Gy Gz) floats), one message each way.
 * After every run's steps, the tied embedding's two copies (wte on the first
 * and on the last stage, rank r of one holding the shard of rank r of the
 * other) have bitwise equal parameters, gradients and AdamW moments: the
 * gather reads the first stage's copy only, so nothing above would see the
 * last stage's drift.
 * Then: the canonical state (parameters, both AdamW moments) moves between
 * every P and back without changing a bit (checkpoints across stages), and
 * bad input (more stages than blocks, a split that does not add up to L,
 * M < 1, the per-micro-batch call with stages) fails on every rank with one
 * message. AdamW runs with eps = 1, where the update is Lipschitz in the
 * gradient (tests/test_gpt.c explains why).
 *
 * `test_pipeline [moe] --bf16-mixed`: every run, the serial ones too, in
 * bf16-mixed precision, with tests/test_gpt.c's bf16-mixed bound for the
 * tensors (in place of 2 depth gamma_K) and its bound of the losses (in
 * place of 1e-5: 2 tol max|logit| of the serial run's forwards, plus
 * rounding; tests/test_gpt.c's header, "The loss"), on every P and grid as
 * in fp32 (the evaluations after a scatter across stage counts, of fp32
 * models, still 1e-5);
 * the variants still bitwise identical and the point-to-point and collective
 * counters still the planner's. */
#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fourfold/fourfold.h"
#include "fourfold/gpt.h"
#include "fourfold/plan.h"
#include "fourfold/rng.h"
#include "nn/gpt_internal.h" /* ff_gpt_wte_shard: a stage's copy of the tied embedding */
#include "test_util.h"

enum { STEPS = 2, VARIANTS = 7, UNEVEN = 6, MAX_M = 25, B = 4, T = 8 };
static ff_gpt_config CFG = {.L = 8, .C = 32, .NH = 4, .V = 100, .Vp = 0, .maxT = 8};
/* `test_pipeline moe`: the same with 4 experts in every second block, top-2,
 * capacity factor 1 (tokens dropped, 4 per expert and sequence of 8),
 * expert parallelism over D where Gd > 1 divides E, for M = 3P + 1 only
 * and four variants (message-driven with and without checkpointing, 1F1B
 * with checkpointing and CAC, the uneven split) only (time); the planner
 * has no MoE model yet (issue 27), so its traffic is not compared */
static const ff_gpt_config CFG_MOE = {.L = 8,
                                      .C = 32,
                                      .NH = 4,
                                      .V = 100,
                                      .Vp = 0,
                                      .maxT = 8,
                                      .experts = 4,
                                      .expert_every = 2,
                                      .top_k = 2,
                                      .capacity_factor = 1.0f,
                                      .aux_coef = 0.01f};

typedef struct {
    float loss[STEPS], eval;
    /* bf16-mixed, the serial runs: the largest |logit| of each step's
     * forwards and of the evaluation's (the losses' bound) */
    double zmax[STEPS], zeval;
    float *grads, *params, *init; /* canonical, rank 0 only */
    size_t tied_diff;             /* floats of this rank's wte copy unlike the other's */
    char tied_why[200];
} result;

static void result_free(result *r)
{
    free(r->grads), free(r->params), free(r->init);
    memset(r, 0, sizeof *r);
}

static int32_t token_at(int64_t s, int64_t t)
{
    return (int32_t)(ff_rng_uniform(11, 7, (uint64_t)(s * (T + 1) + t)) * CFG.V);
}

/* This rank's tokens for `steps` steps of M micro-batches (micro-batch u
 * at offset u * count * T). */
static void local_batch(ff_gpt *g, int M, int steps, int32_t **tok, int32_t **tgt)
{
    int first, count;
    ff_gpt_local_sequences(g, &first, &count);
    size_t n = (size_t)steps * M * count * T, k = 0;
    *tok = malloc(n * sizeof(int32_t));
    *tgt = malloc(n * sizeof(int32_t));
    for (int u = 0; u < steps * M; u++)
        for (int s = 0; s < count; s++)
            for (int t = 0; t < T; t++, k++) {
                int64_t seq = (int64_t)u * B + first + s;
                (*tok)[k] = token_at(seq, t);
                (*tgt)[k] = token_at(seq, t + 1);
            }
}

static float *gather_new(ff_gpt *g, ff_gpt_buffer which, int *rc)
{
    int root = ff_ctx_rank(ff_gpt_ctx(g)) == 0;
    float *c = root ? calloc(ff_gpt_canonical_size(g), sizeof(float)) : NULL;
    if (*rc == FF_OK)
        *rc = ff_gpt_gather(g, which, c, 0);
    return c;
}

/* Variants 0-3: message-driven or 1F1B, without or with checkpointing (1F1B
 * with CAC); 4: message-driven, limit P/2; 5: 1F1B, limit 1; 6:
 * message-driven with an uneven split of the blocks. */
static int uneven[8];
static int mixed; /* --bf16-mixed */
static int quick; /* quick: M = 3P + 1 only, every other grid (the sanitizer build: less time) */
static void opts_of(int variant, int P, ff_gpt_opts *o)
{
    ff_gpt_opts_default(o);
    o->precision = mixed ? FF_PRECISION_BF16_MIXED : FF_PRECISION_FP32;
    o->pipe.schedule = variant & 1 ? FF_PIPE_1F1B : FF_PIPE_MESSAGE;
    o->checkpoint = variant < 4 && ((variant >> 1) & 1);
    o->cac = variant == 3; /* 1F1B checkpointing with CAC */
    if (variant == 4)
        o->pipe.limit = P / 2;
    if (variant == 5)
        o->pipe.limit = 1;
    if (variant == 6) { /* the first stage one block more, the last one less */
        for (int s = 0; s < P; s++)
            uneven[s] = CFG.L / P + (s == 0 && P < CFG.L) - (s == P - 1 && P < CFG.L);
        o->pipe.stage_layers = uneven;
    }
}

static const char *variant_name(int v)
{
    static const char *const names[VARIANTS] = {
        "message",           "1f1b",         "message ckpt",        "1f1b ckpt CAC",
        "message limit P/2", "1f1b limit 1", "message uneven split"};
    return names[v];
}

/* The planner's traffic of this rank's stage against the counters of a
 * whole step (every group and collective, and the p2p messages): equal. */
static int planned_bytes_match(ff_grid *grid, const ff_gpt_opts *o, int M, char *why, size_t len)
{
    ff_ctx *ctx = ff_grid_ctx(grid);
    ff_plan_config pc;
    ff_plan_config_default(&pc);
    ff_ctx_coll_model(ctx, &pc.coll);
    pc.machine.ranks_per_node = ff_ctx_size(ctx) / ff_ctx_nodes(ctx);
    snprintf(pc.model.name, sizeof pc.model.name, "test");
    pc.model.layers = CFG.L, pc.model.heads = CFG.NH, pc.model.hidden = CFG.C;
    pc.model.vocab = CFG.V, pc.model.max_seq = CFG.maxT;
    pc.batch = (int64_t)B * M, pc.seq = T, pc.micro_batches = M;
    pc.checkpoint = o->checkpoint, pc.ag_cache = CFG.L; /* the model's default: every layer */
    pc.cac = o->cac;
    pc.precision = o->precision == FF_PRECISION_BF16_MIXED ? FF_PLAN_BF16_MIXED : FF_PLAN_FP32;
    pc.stages = ff_grid_stages(grid), pc.stage_layers = o->pipe.stage_layers;
    ff_plan_coll want[FF_PLAN_NGROUPS][FF_NCOLL], want_p2p;
    char err[256];
    if (ff_plan_traffic_stage(&pc, ff_grid_shape(grid), ff_grid_coords(grid), ff_grid_stage(grid),
                              want, &want_p2p, err, sizeof err)) {
        snprintf(why, len, "ff_plan_traffic_stage: %.200s", err);
        return 0;
    }
    for (int k = 0; k < FF_NGROUPS; k++)
        for (int c = 0; c <= FF_COLL_P2P; c++) {
            ff_counters n = ff_group_counters(ff_grid_group(grid, (ff_group_kind)k), (ff_coll)c);
            const ff_plan_coll *w =
                c == FF_COLL_P2P ? (k == FF_GROUP_PIPE ? &want_p2p : NULL) : &want[k][c];
            uint64_t wc = w ? w->calls : 0, ws = w ? w->bytes_sent : 0, wr = w ? w->bytes_recv : 0;
            if (n.calls != wc || n.bytes_sent != ws || n.bytes_recv != wr) {
                snprintf(why, len,
                         "%s %s: %llu calls, %llu B sent, %llu B received; planned %llu, %llu, "
                         "%llu",
                         ff_group_kind_name((ff_group_kind)k), ff_coll_name((ff_coll)c),
                         (unsigned long long)n.calls, (unsigned long long)n.bytes_sent,
                         (unsigned long long)n.bytes_recv, (unsigned long long)wc,
                         (unsigned long long)ws, (unsigned long long)wr);
                return 0;
            }
        }
    return 1;
}

/* The tied embedding's two copies, on the first and the last stage (rank r
 * of one holds the shard of rank r of the other): the first stage's
 * parameters, gradients and AdamW moments of wte, sent over PIPE, against
 * the last stage's, bit for bit (docs/pipeline.md: both add the lookup's
 * and the head's gradient in one order and run the same AdamW). Returns the
 * floats that differ on this rank (0 on the other stages), the first of
 * them described in why. Collective over the first and the last stage. */
static size_t tied_copies_differ(ff_gpt *g, ff_grid *grid, char *why, size_t len)
{
    enum { TAG = 4242 };
    const int P = ff_grid_stages(grid), stage = ff_grid_stage(grid);
    if (P < 2 || (stage != 0 && stage != P - 1))
        return 0;
    MPI_Comm pipe = ff_group_comm(ff_grid_group(grid, FF_GROUP_PIPE));
    const ff_gpt_buffer which[4] = {FF_GPT_PARAMS, FF_GPT_GRADS, FF_GPT_ADAM_M, FF_GPT_ADAM_V};
    const char *names[4] = {"parameters", "gradients", "AdamW m", "AdamW v"};
    size_t bad = 0;
    for (int k = 0; k < 4; k++) {
        size_t n = 0;
        const float *mine = ff_gpt_wte_shard(g, which[k], &n);
        unsigned long long count = mine ? n : 0, peer_count = 0;
        if (stage == 0) {
            MPI_Send(&count, 1, MPI_UNSIGNED_LONG_LONG, P - 1, TAG, pipe);
            MPI_Send(mine, (int)count, MPI_FLOAT, P - 1, TAG, pipe);
            continue;
        }
        MPI_Recv(&peer_count, 1, MPI_UNSIGNED_LONG_LONG, 0, TAG, pipe, MPI_STATUS_IGNORE);
        float *peer = malloc((peer_count ? peer_count : 1) * sizeof(float));
        MPI_Recv(peer, (int)peer_count, MPI_FLOAT, 0, TAG, pipe, MPI_STATUS_IGNORE);
        size_t first = count, differ = 0;
        for (size_t i = 0; peer_count == count && i < count; i++)
            if (memcmp(&peer[i], &mine[i], sizeof(float)) && differ++ == 0)
                first = i;
        if (peer_count != count || count == 0) {
            differ = 1;
            if (!bad)
                snprintf(why, len, "wte %s: %llu floats on the first stage, %llu on the last",
                         names[k], peer_count, count);
        } else if (differ && !bad) {
            snprintf(why, len,
                     "wte %s: %zu of %llu floats of the two copies differ, the first at %zu: "
                     "%.9g on the first stage, %.9g on the last",
                     names[k], differ, count, first, (double)peer[first], (double)mine[first]);
        }
        bad += differ;
        free(peer);
    }
    return bad;
}

/* STEPS steps of M micro-batches; p2p: the PIPE counters of step 0; the
 * counters of step 1 against the planner's traffic into *planned (1: equal). */
static int run(ff_grid *grid, const ff_gpt_opts *o, int M, result *r, ff_counters *p2p,
               int *planned, char *why, size_t why_len)
{
    ff_gpt *g = NULL;
    /* a mixture of experts with expert parallelism over all of D where E
     * allows (the stages' all-to-alls inside the schedule) */
    ff_gpt_opts eo = *o;
    const int gd = ff_grid_shape(grid).d;
    if (CFG.experts && gd > 1 && CFG.experts % gd == 0)
        eo.expert_parallel = gd;
    int rc = ff_gpt_create(grid, &CFG, &eo, B, T, &g);
    if (rc)
        return rc;
    int32_t *tok, *tgt;
    local_batch(g, M, STEPS, &tok, &tgt);
    int first, count;
    ff_gpt_local_sequences(g, &first, &count);
    const int64_t per = (int64_t)M * count * T;
    ff_adamw h;
    ff_adamw_default(&h);
    h.lr = 3e-3f, h.eps = 1.0f, h.steps = STEPS;
    if ((rc = ff_gpt_init(g, 5)) == FF_OK)
        r->init = gather_new(g, FF_GPT_PARAMS, &rc);
    if (rc == FF_OK)
        rc = ff_gpt_eval(g, tok, tgt, &r->eval);
    /* bf16-mixed, a serial run (one rank): the logits the losses' bound needs */
    const int logits = mixed && ff_ctx_size(ff_grid_ctx(grid)) == 1;
    if (rc == FF_OK && logits)
        rc = test_logit_max(g, tok, tgt, 1, 0, CFG.V, &r->zeval);
    ff_group *pipe = ff_grid_group(grid, FF_GROUP_PIPE);
    ff_group_counters_reset(pipe);
    float loss0;
    if (rc == FF_OK && (rc = ff_gpt_grads(g, tok, tgt, M, &loss0)) == FF_OK) {
        if (p2p)
            *p2p = ff_group_counters(pipe, FF_COLL_P2P);
        r->grads = gather_new(g, FF_GPT_GRADS, &rc);
    }
    for (int s = 0; s < STEPS && rc == FF_OK; s++) {
        ff_gpt_step_info info;
        for (int k = 0; s == 1 && planned && k < FF_NGROUPS; k++)
            ff_group_counters_reset(ff_grid_group(grid, (ff_group_kind)k));
        if (logits && (rc = test_logit_max(g, tok + s * per, tgt + s * per, M, (size_t)count * T,
                                           CFG.V, &r->zmax[s])))
            break;
        rc = ff_gpt_step(g, tok + s * per, tgt + s * per, M, &h, s, &info);
        if (s == 1 && planned && rc == FF_OK)
            *planned = CFG.experts || planned_bytes_match(grid, o, M, why, why_len);
        r->loss[s] = info.loss;
        if (s == 0 && rc == FF_OK && loss0 != info.loss)
            rc = ff_ctx_set_error(ff_gpt_ctx(g), FF_EINVAL, "ff_gpt_grads loss %.9g, step %.9g",
                                  loss0, info.loss);
    }
    if (rc == FF_OK)
        r->tied_diff = tied_copies_differ(g, grid, r->tied_why, sizeof r->tied_why);
    if (rc == FF_OK)
        r->params = gather_new(g, FF_GPT_PARAMS, &rc);
    free(tok), free(tgt);
    ff_gpt_destroy(g);
    return rc;
}

/* Worst error/bound over the tensors (update: compare the change from init). */
static double compare(ff_gpt *shape, const float *a, const float *ref, const float *init,
                      double tol, const char *what, const char *desc)
{
    double worst = 0;
    size_t off = 0;
    for (int i = 0; i < FF_GPT_NTENSORS; i++) {
        size_t n = ff_gpt_tensor_size(shape, i);
        double err = 0, scale = 0, mag = 0;
        for (size_t j = off; j < off + n; j++) {
            double d = fabs((double)a[j] - ref[j]);
            double s = init ? fabs((double)ref[j] - init[j]) : fabs((double)ref[j]);
            err = d > err ? d : err, scale = s > scale ? s : scale;
            mag = fabs((double)ref[j]) > mag ? fabs((double)ref[j]) : mag;
        }
        double bound = tol + (init && scale > 0 ? 2.0 * STEPS * ldexp(1.0, -24) * mag / scale : 0);
        double rel = scale > 0 ? err / scale : err;
        CHECK(rel <= bound, "%s: %s %s rel err %.3e > %.3e", desc, what, ff_gpt_tensor_name(i), rel,
              bound);
        if (rel / bound > worst)
            worst = rel / bound;
        off += n;
    }
    return worst;
}

static void check_padding(ff_gpt *shape, const float *a, const char *desc)
{
    ff_gpt_config c = ff_gpt_get_config(shape);
    for (int64_t v = c.V; v < c.Vp; v++)
        for (int64_t j = 0; j < c.C; j++)
            if (a[v * c.C + j] != 0.0f) {
                CHECK(0, "%s: padded vocabulary row %lld is not zero", desc, (long long)v);
                return;
            }
}

/* The longest sum of a step of M micro-batches: its rows, 4C, or V */
static double k_of(int M) { return fmax(fmax((double)M * B * T, 4.0 * CFG.C), (double)CFG.V); }

static double tol_of(int M)
{
    const double K = k_of(M), u = ldexp(1.0, -24);
    /* an MoE block has two sums more (tests/test_gpt.c) */
    double moe_blocks = CFG.experts ? CFG.L / CFG.expert_every : 0;
    const double depth = 4 * CFG.L + 4 + 2 * moe_blocks, gamma = K * u / (1 - K * u);
    if (mixed) { /* tests/test_gpt.c's bf16-mixed bound, groups of at most 8 */
        const double ub = ldexp(1.0, -8);
        return depth * (2 * gamma + 4 * ub + pow(1 + ub, 8) - 1);
    }
    return 2.0 * depth * gamma;
}

/* The bound on |loss - serial loss| with M micro-batches: in fp32 1e-5
 * relative, in bf16-mixed from the serial run's largest |logit| zmax
 * (tests/test_gpt.c's header, "The loss") */
static double loss_bound(int M, double zmax, double loss)
{
    return mixed ? test_ce_bound(tol_of(M), k_of(M), zmax, loss) : 1e-5 * fabs(loss);
}

static int same_bits(ff_gpt *shape, const float *a, const float *b)
{
    return memcmp(a, b, ff_gpt_canonical_size(shape) * sizeof(float)) == 0;
}

/* The state of a model: canonical parameters, m and v of a run on `from`,
 * scattered into a model on every other stage count and gathered back. */
static void check_moves(ff_ctx *ctx, ff_gpt *shape)
{
    const int P[4] = {1, 2, 4, 8};
    const ff_dims grid_of[4] = {{2, 2, 2, 1}, {1, 2, 1, 2}, {2, 1, 1, 1}, {1, 1, 1, 1}};
    const ff_gpt_buffer bufs[3] = {FF_GPT_PARAMS, FF_GPT_ADAM_M, FF_GPT_ADAM_V};
    int rank = ff_ctx_rank(ctx);
    float *canon[3] = {0}, *back = NULL, loss1 = 0;
    if (rank == 0) { /* random values; the padded vocabulary rows are zero in any model */
        size_t n = ff_gpt_canonical_size(shape), pad = (size_t)CFG.V * CFG.C;
        back = malloc(n * sizeof(float));
        for (int k = 0; k < 3; k++) {
            canon[k] = malloc(n * sizeof(float));
            for (size_t j = 0; j < n; j++)
                canon[k][j] = ff_rng_normal(3, (uint32_t)k + 1, j);
            memset(canon[k] + pad, 0, (ff_gpt_tensor_size(shape, 0) - pad) * sizeof(float));
        }
    }
    for (int i = 0; i < 4; i++) {
        ff_grid *grid;
        ff_gpt *g;
        if (ff_grid_create_staged(ctx, grid_of[i], P[i], &grid)) {
            CHECK(0, "grid for %d stages: %s", P[i], ff_ctx_error(ctx));
            continue;
        }
        if (ff_gpt_create(grid, &CFG, NULL, B, T, &g) == FF_OK) {
            /* the scattered parameters evaluate as on one stage (the tied
             * embedding's second copy, on the last stage, included) */
            int32_t *tok, *tgt;
            local_batch(g, 1, 1, &tok, &tgt);
            float loss = 0;
            int rc = ff_gpt_scatter(g, FF_GPT_PARAMS, canon[0], 0);
            if (rc == FF_OK)
                rc = ff_gpt_eval(g, tok, tgt, &loss);
            free(tok), free(tgt);
            if (i == 0)
                loss1 = loss;
            /* (fp32 models, also under --bf16-mixed: 1e-5 relative) */
            CHECK(rc == FF_OK && fabs((double)loss - loss1) <= 1e-5 * fabs(loss1),
                  "%d stages: evaluation after a scatter %.8f, one stage %.8f (%s)", P[i], loss,
                  loss1, rc ? ff_ctx_error(ctx) : "");
            for (int k = 0; k < 3; k++) {
                rc = ff_gpt_scatter(g, bufs[k], canon[k], 0);
                if (rc == FF_OK)
                    rc = ff_gpt_gather(g, bufs[k], back, 0);
                CHECK(rc == FF_OK, "%d stages: %s", P[i], ff_ctx_error(ctx));
                if (rank == 0 && rc == FF_OK)
                    CHECK(same_bits(shape, back, canon[k]),
                          "%d stages: buffer %d changed on its way through the stages", P[i], k);
            }
            ff_gpt_destroy(g);
        } else {
            CHECK(0, "model on %d stages: %s", P[i], ff_ctx_error(ctx));
        }
        ff_grid_destroy(grid);
    }
    if (rank == 0)
        printf("canonical state scattered to and gathered from 1, 2, 4 and 8 stages: exact; "
               "evaluation after the scatter as on one stage\n");
    for (int k = 0; k < 3; k++)
        free(canon[k]);
    free(back);
}

static void check_bad_input(ff_ctx *ctx)
{
    ff_grid *grid;
    if (ff_grid_create_staged(ctx, (ff_dims){1, 1, 1, 1}, 8, &grid)) {
        CHECK(0, "8 stages: %s", ff_ctx_error(ctx));
        return;
    }
    ff_gpt *g = NULL;
    ff_gpt_config small = CFG;
    small.L = 4;
    int rc = ff_gpt_create(grid, &small, NULL, B, T, &g);
    CHECK(rc == FF_EINVAL && strstr(ff_ctx_error(ctx), "8 pipeline stages for 4 blocks"),
          "more stages than blocks: %d %s", rc, ff_ctx_error(ctx));
    ff_gpt_opts o;
    ff_gpt_opts_default(&o);
    int split[8] = {1, 1, 1, 1, 1, 1, 1, 2};
    o.pipe.stage_layers = split;
    rc = ff_gpt_create(grid, &CFG, &o, B, T, &g);
    CHECK(rc == FF_EINVAL && strstr(ff_ctx_error(ctx), "add up to 9, but the model has L=8"),
          "a split of 9 blocks: %d %s", rc, ff_ctx_error(ctx));
    split[7] = 1;
    rc = ff_gpt_create(grid, &CFG, &o, B, T, &g);
    CHECK(rc == FF_OK, "the split 1x8: %s", ff_ctx_error(ctx));
    if (rc == FF_OK) {
        int32_t *tok, *tgt;
        local_batch(g, 1, 1, &tok, &tgt);
        float loss;
        rc = ff_gpt_grads(g, tok, tgt, 0, &loss);
        CHECK(rc == FF_EINVAL && strstr(ff_ctx_error(ctx), "0 micro-batches"), "M = 0: %d %s", rc,
              ff_ctx_error(ctx));
        rc = ff_gpt_forward_backward(g, tok, tgt, 0, 1);
        CHECK(rc == FF_EUNSUPPORTED && strstr(ff_ctx_error(ctx), "micro-batches run together"),
              "per-micro-batch call with stages: %d %s", rc, ff_ctx_error(ctx));
        free(tok), free(tgt);
        ff_gpt_destroy(g);
    }
    ff_grid_destroy(grid);
    if (ff_ctx_rank(ctx) == 0)
        printf("bad input refused on every rank\n");
}

/* The schedules' order of passes (ff_gpt_pipeline_order), on 4 stages of 2
 * ranks (2x1x1x1), M = K = 4, the last stage slowed by 0.25 s after each
 * pass. 1F1B runs its fixed order on every stage: min(P - s - 1, K - 1)
 * forwards, then a forward and a backward in turn, then the backwards.
 * The message-driven schedule (dissertation, Algorithm 2) runs what the
 * messages call for: with the last stage slow, every input reaches a stage
 * before the first gradient, so each stage before the last runs the K
 * forwards before its first backward (1F1B, on stages 1 and 2, one or two
 * backwards earlier); the last stage runs each forward and backward in turn. */
static void expect_1f1b(int P, int s, int K, int M, int *e, int *n)
{
    int w = P - s - 1, f = 0, b = 0;
    *n = 0;
    if (s == P - 1) {
        for (int u = 0; u < M; u++)
            e[(*n)++] = u, e[(*n)++] = -(u + 1);
        return;
    }
    if (w > K - 1)
        w = K - 1;
    if (w > M)
        w = M;
    while (f < w)
        e[(*n)++] = f++;
    while (f < M) {
        e[(*n)++] = f++;
        e[(*n)++] = -(++b);
    }
    while (b < M)
        e[(*n)++] = -(++b);
}

static void order_text(const int *o, int n, char *buf, size_t len)
{
    size_t at = 0;
    buf[0] = 0;
    for (int i = 0; i < n && at + 8 < len; i++)
        at += (size_t)snprintf(buf + at, len - at, "%s%c%d", i ? " " : "", o[i] >= 0 ? 'F' : 'B',
                               o[i] >= 0 ? o[i] : -o[i] - 1);
}

static void check_schedule_orders(ff_ctx *ctx)
{
    enum { P = 4, M = 4, K = 4 };
    if (ff_ctx_size(ctx) != 8)
        return;
    ff_grid *grid;
    if (ff_grid_create_staged(ctx, (ff_dims){2, 1, 1, 1}, P, &grid)) {
        CHECK(0, "schedule orders: %s", ff_ctx_error(ctx));
        return;
    }
    const int stage = ff_grid_stage(grid), rank = ff_ctx_rank(ctx);
    for (int sched = 0; sched < 2; sched++) {
        ff_gpt_opts o;
        ff_gpt_opts_default(&o);
        o.precision = mixed ? FF_PRECISION_BF16_MIXED : FF_PRECISION_FP32;
        o.pipe.schedule = sched ? FF_PIPE_1F1B : FF_PIPE_MESSAGE;
        o.pipe.limit = K;
        o.pipe.slow_stage = P - 1;
        o.pipe.slow_s = 0.25;
        ff_gpt *g = NULL;
        int rc = ff_gpt_create(grid, &CFG, &o, B, T, &g);
        int32_t *tok = NULL, *tgt = NULL;
        float loss = 0;
        if (rc == FF_OK && (rc = ff_gpt_init(g, 5)) == FF_OK) {
            local_batch(g, M, 1, &tok, &tgt);
            rc = ff_gpt_grads(g, tok, tgt, M, &loss);
        }
        CHECK(rc == FF_OK, "schedule orders: %s", ff_ctx_error(ctx));
        int got[FF_GPT_PIPE_ORDER_MAX], want[4 * M], nw, n = 0, ok;
        if (rc == FF_OK)
            n = ff_gpt_pipeline_order(g, got, FF_GPT_PIPE_ORDER_MAX);
        if (sched) { /* 1F1B: the whole order */
            expect_1f1b(P, stage, K, M, want, &nw);
            ok = n == nw && !memcmp(got, want, (size_t)n * sizeof(int));
        } else if (stage == P - 1) { /* message-driven, the last stage: F u, B u */
            expect_1f1b(P, stage, K, M, want, &nw);
            ok = n == nw && !memcmp(got, want, (size_t)n * sizeof(int));
        } else { /* the K forwards first, then the first backward */
            for (nw = 0; nw < K; nw++)
                want[nw] = nw;
            want[nw++] = -1;
            ok = n == 2 * M && !memcmp(got, want, (size_t)nw * sizeof(int));
        }
        char text[256], wtext[256];
        order_text(got, n, text, sizeof text);
        order_text(want, nw, wtext, sizeof wtext);
        if (rank % 2 == 0) /* one rank of each stage */
            printf("schedule %s, stage %d of %d (M = K = %d, the last stage slowed): %s%s\n",
                   sched ? "1f1b" : "message", stage, P, M, text, ok ? "" : "  <- FAILED");
        CHECK(ok, "schedule %s, stage %d: order %s, expected %s%s", sched ? "1f1b" : "message",
              stage, text, wtext, sched || stage == P - 1 ? "" : " ...");
        free(tok), free(tgt);
        ff_gpt_destroy(g);
    }
    ff_grid_destroy(grid);
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "moe"))
            CFG = CFG_MOE;
        mixed |= !strcmp(argv[i], "--bf16-mixed");
        quick |= !strcmp(argv[i], "quick");
    }
    int rank, size;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    ff_ctx *ctx;
    int rc = ff_ctx_create(&ctx, MPI_COMM_WORLD, NULL);
    CHECK(rc == FF_OK, "ff_ctx_create: %s", ff_ctx_error(ctx));

    /* the serial runs, on rank 0 */
    static result ref[MAX_M + 1];
    ff_ctx *sctx = NULL;
    ff_grid *sgrid = NULL;
    ff_gpt *shape = NULL;
    if (rank == 0) {
        rc = ff_ctx_create(&sctx, MPI_COMM_SELF, NULL);
        if (rc == FF_OK)
            rc = ff_grid_create(sctx, (ff_dims){1, 1, 1, 1}, &sgrid);
        if (rc == FF_OK)
            rc = ff_gpt_create(sgrid, &CFG, NULL, B, T, &shape);
        for (int P = 2; P <= size && rc == FF_OK; P *= 2) {
            const int Ms[3] = {P, 2 * P, 3 * P + 1};
            for (int i = 0; i < 3 && rc == FF_OK; i++) {
                if ((CFG.experts || quick) && i != 2) /* (MoE, quick: M = 3P + 1 only) */
                    continue;
                ff_gpt_opts o;
                opts_of(0, 1, &o);
                if (!ref[Ms[i]].params)
                    rc = run(sgrid, &o, Ms[i], &ref[Ms[i]], NULL, NULL, NULL, 0);
            }
        }
        CHECK(rc == FF_OK, "serial: %s", sctx ? ff_ctx_error(sctx) : "no context");
    }
    MPI_Bcast(&rc, 1, MPI_INT, 0, MPI_COMM_WORLD);
    if (rc != FF_OK) {
        MPI_Abort(MPI_COMM_WORLD, 1);
        return 1;
    }

    ff_dims grids[64];
    double worst = 0;
    int runs = 0, n_planned = 0, n_tied = 0;
    for (int P = 2; P <= size; P *= 2) {
        int n = test_all_grids(size / P, grids, 64);
        const int Ms[3] = {P, 2 * P, 3 * P + 1};
        for (int gi = 0; gi < n; gi++) {
            if (quick && gi % 2) /* (quick: every other grid of each P) */
                continue;
            ff_grid *grid;
            ff_dims s = grids[gi];
            if (ff_grid_create_staged(ctx, s, P, &grid)) {
                CHECK(0, "grid %dx%dx%dx%d x %d: %s", s.x, s.y, s.z, s.d, P, ff_ctx_error(ctx));
                continue;
            }
            char desc[160];
            ff_grid_describe(grid, desc, sizeof desc);
            for (int mi = 0; mi < 3; mi++) {
                if ((CFG.experts || quick) && mi != 2) /* (time: M = 3P + 1 suffices) */
                    continue;
                const int M = Ms[mi];
                const result *r0 = &ref[M];
                result first = {0};
                double w = 0, lw = 0; /* worst error/bound: tensors, losses */
                int n_same = 0;
                for (int v = 0; v < VARIANTS; v++) {
                    /* MoE (time): message-driven with and without
                     * checkpointing, 1F1B with checkpointing and CAC, the
                     * uneven split */
                    if (CFG.experts && v != 0 && v != 2 && v != 3 && v != UNEVEN)
                        continue;
                    n_same += v != 0 && v != UNEVEN;
                    ff_gpt_opts o;
                    opts_of(v, P, &o);
                    result r = {0};
                    ff_counters p2p = {0, 0, 0, 0, 0};
                    int planned = 1;
                    char why[256] = "";
                    rc = run(grid, &o, M, &r, &p2p, &planned, why, sizeof why);
                    runs++;
                    CHECK(rc == FF_OK, "%s M=%d variant %d: %s", desc, M, v, ff_ctx_error(ctx));
                    CHECK(rc || planned, "%s M=%d %s, stage %d: planner against counters: %s", desc,
                          M, variant_name(v), ff_grid_stage(grid), why);
                    CHECK(rc || !r.tied_diff, "%s M=%d %s, stage %d: %s", desc, M, variant_name(v),
                          ff_grid_stage(grid), r.tied_why);
                    n_tied += rc == FF_OK && !r.tied_diff && ff_grid_stage(grid) == P - 1;
                    n_planned += rc == FF_OK && planned;
                    /* the p2p counters, on every rank */
                    int st = ff_grid_stage(grid), msgs = M * (st > 0) + M * (st < P - 1);
                    uint64_t bytes =
                        (uint64_t)msgs * (B / (s.z * s.d)) * T * (CFG.C / s.y) * sizeof(float);
                    if (st == 0 || st == P - 1) { /* the tied embedding's gradient, both ways */
                        msgs++;
                        bytes += (uint64_t)128 * CFG.C / (s.x * s.y * s.z) * sizeof(float);
                    }
                    CHECK(rc || (p2p.calls == 2 * (uint64_t)msgs && p2p.bytes_sent == bytes &&
                                 p2p.bytes_recv == bytes),
                          "%s M=%d stage %d: p2p %llu calls, %llu B sent, %llu B received; want "
                          "%d, %llu, %llu",
                          desc, M, st, (unsigned long long)p2p.calls,
                          (unsigned long long)p2p.bytes_sent, (unsigned long long)p2p.bytes_recv,
                          2 * msgs, (unsigned long long)bytes, (unsigned long long)bytes);
                    if (rc == FF_OK && rank == 0) {
                        char d[200];
                        snprintf(d, sizeof d, "%s M=%d %s", desc, M, variant_name(v));
                        if (v == 0 || v == UNEVEN) {
                            /* (the evaluation: one micro-batch) */
                            double lb = loss_bound(1, r0->zeval, r0->eval);
                            CHECK(fabs((double)r.eval - r0->eval) <= lb,
                                  "%s: eval loss %.8f, serial %.8f (|difference| at most %.2e)", d,
                                  r.eval, r0->eval, lb);
                            lw = fmax(lw, fabs((double)r.eval - r0->eval) / lb);
                            for (int k = 0; k < STEPS; k++) {
                                lb = loss_bound(M, r0->zmax[k], r0->loss[k]);
                                const double e = fabs((double)r.loss[k] - r0->loss[k]);
                                CHECK(e <= lb,
                                      "%s: step %d loss %.8f, serial %.8f (|difference| %.2e > "
                                      "%.2e)",
                                      d, k, r.loss[k], r0->loss[k], e, lb);
                                lw = fmax(lw, e / lb);
                            }
                            double tol = tol_of(M);
                            double a = compare(shape, r.grads, r0->grads, NULL, tol, "gradient", d);
                            double b =
                                compare(shape, r.params, r0->params, r0->init, tol, "update", d);
                            w = a > w ? a : w;
                            w = b > w ? b : w;
                            check_padding(shape, r.grads, d);
                            check_padding(shape, r.params, d);
                            if (v == 0) {
                                first = r;
                                memset(&r, 0, sizeof r);
                            }
                        } else {
                            CHECK(same_bits(shape, r.grads, first.grads) &&
                                      same_bits(shape, r.params, first.params) &&
                                      r.loss[STEPS - 1] == first.loss[STEPS - 1],
                                  "%s: not bitwise equal to the message-driven schedule without "
                                  "checkpointing",
                                  d);
                        }
                    }
                    result_free(&r);
                }
                if (rank == 0)
                    printf("%-58s M=%-2d %d variants bitwise equal; error/bound %.3f (bound "
                           "%.2e), losses %.1e\n",
                           desc, M, n_same + 1, w, tol_of(M), lw);
                worst = w > worst ? w : worst;
                result_free(&first);
            }
            ff_grid_destroy(grid);
        }
    }
    if (rank == 0)
        printf("%d pipelined runs; worst error/bound against serial %.3f\n", runs, worst);
    MPI_Allreduce(MPI_IN_PLACE, &n_planned, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    if (rank == 0 && CFG.experts)
        printf("the planner's traffic: not compared (no MoE model in the planner yet)\n");
    else if (rank == 0)
        printf("the planner's traffic equals the counters of a step on every rank of every "
               "run: %d rank-runs\n",
               n_planned);
    MPI_Allreduce(MPI_IN_PLACE, &n_tied, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    if (rank == 0)
        printf("the tied embedding's two copies (parameters, gradients, AdamW moments) bitwise "
               "equal after the steps: %d rank-runs of the last stage\n",
               n_tied);
    check_moves(ctx, shape ? shape : NULL);
    if (!CFG.experts)
        check_schedule_orders(ctx);
    check_bad_input(ctx);

    for (int M = 0; M <= MAX_M; M++)
        result_free(&ref[M]);
    ff_gpt_destroy(shape);
    ff_grid_destroy(sgrid);
    if (sctx)
        ff_ctx_destroy(sctx);
    ff_ctx_destroy(ctx);
    int code = test_finish("pipeline");
    MPI_Finalize();
    return code;
}
