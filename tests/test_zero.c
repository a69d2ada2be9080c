/* ZeRO over D (issue 52, docs/design.md "ZeRO over D"): --zero 1 and 2
 * against --zero 0 on 8 ranks: every grid of 8 with D > 1, three grids of a
 * mixture of experts (expert parallelism 1, 2 and 4: the experts' buckets
 * over EDP), two grids of 2 pipeline stages (the tied embedding's two
 * copies; the norm skipping the second), the context's
 * collectives forced to the ring (ZeRO's reduce-scatter and all-gather are
 * the ring all-reduce's two phases, so the sums are added in the same
 * order). Three models from the same initialisation, STEPS AdamW steps of
 * MICRO micro-batches each with clipping active; after every step
 *   - the losses and gradient norms are bitwise equal, and the parameters,
 *     both AdamW moments and then the gradients gathered to canonical
 *     layout are bitwise equal (a transfer between steps passes through the
 *     gradient buffer, which must be given back); after the steps, zero 0's
 *     moments scattered into the ZeRO models leave their gradients and
 *     give back the moments;
 *   - the bytes this rank sent over D are the same: zero 0's all-reduce,
 *     ZeRO's reduce-scatter plus all-gather (and ZeRO all-reduces nothing
 *     over D but an MoE model's experts' biases without expert parallelism);
 * before the steps each rank's moments are the formula 8 (n - nz + sum over
 * the data-parallel ranges of the rank's ring chunk), n the rank's
 * parameters, nz its linear weight shards, the ranges each block's shards
 * and wte's (counted here from the layers), and 8 n for zero 0.
 * Resume across values and grids: the state of a zero 1 run on one grid
 * (parameters, moments) gathered and scattered into a zero 2 and a zero 0
 * model on another grid, which give back the same canonical state and then
 * take a bitwise equal step.
 * In bf16-mixed (1x2x2x2 with experts over EP 2, 1x1x2x2 in two stages)
 * the same, with the fp32 master sliced as the moments are (its bytes the
 * formula's) and the gather over D moving the 2-byte copy (half the
 * all-reduce's gather phase): a gather left out, or a copy made from a
 * stale master, fails the losses.
 * With two stages (1x1x2x2, 2x1x1x2), each rank's counters of a zero 1 and
 * a zero 2 step equal ff_plan_traffic_stage exactly (AUTO's algorithms).
 * Refusals, on every rank: zero 3; ZeRO on the bf16 wire, with a forced
 * algorithm other than the ring; a mask, SAMO under ZeRO. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fourfold/fourfold.h"
#include "fourfold/plan.h"
#include "test_util.h"

enum { B = 8, T = 16, STEPS = 3, MICRO = 2, MAX_GRIDS = 32 };
/* C = 128: a block's weight shards span several blocks of the gradient
 * norm's sums (16384), so both of ZeRO's ways of summing one (whole on its
 * owner, or passed along its owners) run */
static const ff_gpt_config CFG = {.L = 2, .C = 128, .NH = 8, .V = 64, .Vp = 64, .maxT = 16};

static int32_t token_at(int64_t s, int64_t t)
{
    return (int32_t)(ff_rng_uniform(17, 5, (uint64_t)(s * (T + 1) + t)) * CFG.V);
}

static size_t chunk_len(size_t n, int p, int i)
{
    return n / (size_t)p + ((size_t)i < n % (size_t)p ? 1 : 0);
}

/* The moments' floats under ZeRO by the test's reading of the layout: the
 * rank's ring chunk of each data-parallel range (block l's linear weight
 * shards together, wte's shard), the rest (n - nz) whole. */
static size_t zero_state(ff_gpt *g, size_t n, ff_dims shape, ff_dims me, int ge, size_t *nz_out)
{
    ff_linear_seq *s = ff_gpt_linear_seq(g);
    size_t range[64] = {0}, erange[64] = {0}, nz = 0, wte = 0;
    for (int i = 0; ff_linear_seq_layer(s, i); i++) {
        ff_linear *l = ff_linear_seq_layer(s, i);
        const size_t shard = ff_linear_local_sizes(l).w_shard;
        int blk = 0, e = 0;
        nz += shard;
        if (!strcmp(ff_linear_name(l), "wte"))
            wte += shard;
        else if (sscanf(ff_linear_name(l), "h%d.e%d.", &blk, &e) == 2 && blk >= 0 && blk < 64)
            erange[blk] += shard;
        else if (sscanf(ff_linear_name(l), "h%d.", &blk) == 1 && blk >= 0 && blk < 64)
            range[blk] += shard;
    }
    /* the experts' buckets over their replicas: D/Ge ranks, rank d/Ge */
    const int edp = shape.d / ge;
    if (nz_out)
        *nz_out = nz;
    size_t state = n - nz + chunk_len(wte, shape.d, me.d);
    for (int l = 0; l < 64; l++)
        state += chunk_len(range[l], shape.d, me.d) + chunk_len(erange[l], edp, me.d / ge);
    return state;
}

static void batch(ff_gpt *g, int s, int32_t *tok, int32_t *tgt)
{
    int first = 0, count = 0;
    ff_gpt_local_sequences(g, &first, &count);
    const int m = count * T;
    for (int u = 0; u < MICRO; u++)
        for (int q = 0; q < count; q++)
            for (int t = 0; t < T; t++) {
                int64_t seq = ((int64_t)s * MICRO + u) * B + first + q;
                tok[u * m + q * T + t] = token_at(seq, t);
                tgt[u * m + q * T + t] = token_at(seq, t + 1);
            }
}

static void hyper(ff_adamw *h)
{
    ff_adamw_default(h);
    h->lr = 1e-2f;
    h->steps = STEPS + 1;
    h->clip = 0.05f; /* below the norms: the clipping scale is used */
}

static const ff_gpt_buffer WHICH[4] = {FF_GPT_PARAMS, FF_GPT_GRADS, FF_GPT_ADAM_M, FF_GPT_ADAM_V};
static const char *NAMES[4] = {"parameters", "gradients", "AdamW m", "AdamW v"};

/* Canonical buffers w (of WHICH) of models a and b bitwise equal on rank 0. */
static int same_state(ff_gpt *a, ff_gpt *b, int w, float *ba, float *bb, size_t cn,
                      const char *what)
{
    int rc = ff_gpt_gather(a, WHICH[w], ba, 0);
    if (rc == FF_OK)
        rc = ff_gpt_gather(b, WHICH[w], bb, 0);
    size_t at = 0;
    while (ba && rc == FF_OK && at < cn && !memcmp(&ba[at], &bb[at], sizeof(float)))
        at++;
    CHECK(rc || !ba || at == cn, "%s: %s differ at canonical %zu: %.9g and %.9g", what, NAMES[w],
          at, ba && at < cn ? ba[at] : 0.0, bb && at < cn ? bb[at] : 0.0);
    return rc;
}

typedef struct {
    ff_dims shape;
    int stages, experts, ge;
    int bf16; /* bf16-mixed: the fp32 master sliced too, the 2-byte copy gathered */
} grid_case;

static int run_grid(ff_ctx *ctx, const grid_case *gc, const char *desc)
{
    const int root = ff_ctx_rank(ctx) == 0;
    const ff_dims shape = gc->shape;
    ff_grid *grid = NULL;
    ff_gpt *g[3] = {NULL, NULL, NULL};
    ff_gpt_config cfg = CFG;
    ff_gpt_config_moe(&cfg, gc->experts);
    int rc = gc->stages > 1 ? ff_grid_create_staged(ctx, shape, gc->stages, &grid)
                            : ff_grid_create(ctx, shape, &grid);
    for (int z = 0; z < 3 && rc == FF_OK; z++) {
        ff_gpt_opts go;
        ff_gpt_opts_default(&go);
        go.zero = z;
        go.expert_parallel = gc->ge;
        go.dp_overlap = z != 2; /* zero 2 posts its reduce-scatters after the backward */
        go.precision = gc->bf16 ? FF_PRECISION_BF16_MIXED : FF_PRECISION_FP32;
        if ((rc = ff_gpt_create(grid, &cfg, &go, B, T, &g[z])) == FF_OK)
            rc = ff_gpt_init(g[z], 99);
    }
    if (rc) {
        CHECK(0, "%s: %s", desc, ff_ctx_error(ctx));
        for (int z = 0; z < 3; z++)
            ff_gpt_destroy(g[z]);
        ff_grid_destroy(grid);
        return rc;
    }
    const ff_dims me = ff_grid_coords(grid);
    ff_gpt_memory mem[3];
    for (int z = 0; z < 3; z++)
        ff_gpt_memory_report(g[z], &mem[z]);
    /* bf16-mixed: the master's bytes too are the moments' slices (and the
     * 2-byte copy of the nz Z-sharded weights, in whole floats) */
    size_t nz = 0, n = mem[0].grads / 4, want = zero_state(g[1], n, shape, me, gc->ge, &nz);
    const size_t copy = gc->bf16 ? 4 * ((nz + 1) / 2) : 0;
    CHECK(mem[0].params == 4 * n + copy && mem[1].params == (gc->bf16 ? 4 * want : 4 * n) + copy &&
              mem[2].params == mem[1].params,
          "%s rank d=%d: master and copy %zu %zu %zu bytes, want %zu and %zu", desc, me.d,
          mem[0].params, mem[1].params, mem[2].params, 4 * n + copy,
          (gc->bf16 ? 4 * want : 4 * n) + copy);
    CHECK(mem[0].adam == 8 * n && mem[1].adam == 8 * want && mem[2].adam == 8 * want &&
              mem[1].grads == 4 * n && mem[2].grads == 4 * n,
          "%s rank d=%d: moments %zu %zu %zu bytes, the formula %zu and 8 (n - nz + chunks) = "
          "%zu (n %zu); gradients %zu %zu %zu",
          desc, me.d, mem[0].adam, mem[1].adam, mem[2].adam, 8 * n, 8 * want, n, mem[0].grads,
          mem[1].grads, mem[2].grads);

    int first = 0, count = 0;
    ff_gpt_local_sequences(g[0], &first, &count);
    int32_t *tok = malloc((size_t)MICRO * count * T * sizeof *tok);
    int32_t *tgt = malloc((size_t)MICRO * count * T * sizeof *tgt);
    const size_t cn = ff_gpt_canonical_size(g[0]);
    float *buf[2] = {root ? malloc(cn * sizeof(float)) : NULL,
                     root ? malloc(cn * sizeof(float)) : NULL};
    ff_group *gd = ff_grid_group(grid, FF_GROUP_D);
    ff_adamw h;
    hyper(&h);
    for (int s = 0; s < STEPS && rc == FF_OK; s++) {
        batch(g[0], s, tok, tgt);
        ff_gpt_step_info info[3];
        double sent[3], ar[3];
        for (int z = 0; z < 3 && rc == FF_OK; z++) {
            ff_group_counters_reset(gd);
            rc = ff_gpt_step(g[z], tok, tgt, MICRO, &h, s, &info[z]);
            if (rc == FF_OK) /* (the step's gathers over D, in flight otherwise) */
                rc = ff_gpt_sync(g[z]);
            ar[z] = (double)ff_group_counters(gd, FF_COLL_ALLREDUCE).bytes_sent;
            /* (bf16-mixed: the gather moves the 2-byte copy, half the
             * all-reduce's gather phase) */
            sent[z] = ar[z] + (double)ff_group_counters(gd, FF_COLL_REDUCE_SCATTER).bytes_sent +
                      (gc->bf16 && z ? 2.0 : 1.0) *
                          (double)ff_group_counters(gd, FF_COLL_ALLGATHER).bytes_sent;
        }
        if (rc)
            break;
        for (int z = 1; z < 3; z++) {
            CHECK(!memcmp(&info[0].loss, &info[z].loss, sizeof(float)) &&
                      !memcmp(&info[0].grad_norm, &info[z].grad_norm, sizeof(float)),
                  "%s step %d: loss %.9g norm %.9g zero 0, %.9g %.9g zero %d", desc, s,
                  info[0].loss, info[0].grad_norm, info[z].loss, info[z].grad_norm, z);
            /* (an MoE model's experts' biases are all-reduced over EDP: D without
             * expert parallelism) */
            CHECK(sent[z] == sent[0] && (ar[z] == 0 || (gc->experts && gc->ge == 1)),
                  "%s step %d rank d=%d: %.0f bytes over D with zero 0, %.0f with zero %d (%.0f "
                  "all-reduced)",
                  desc, s, me.d, sent[0], sent[z], z, ar[z]);
        }
        CHECK(info[0].grad_norm > h.clip, "%s step %d: norm %g does not clip", desc, s,
              info[0].grad_norm);
        char what[96];
        /* the moments before the gradients: a transfer between steps passes
         * through the gradient buffer and must give it back */
        static const int order[4] = {0, 2, 3, 1};
        for (int z = 1; z < 3; z++)
            for (int k = 0; k < 4 && rc == FF_OK; k++) {
                snprintf(what, sizeof what, "%s step %d zero %d", desc, s, z);
                rc = same_state(g[0], g[z], order[k], buf[0], buf[1], cn, what);
            }
    }
    /* a scatter between steps (through the gradient buffer too): zero 0's
     * moments into the ZeRO models, which then give back zero 0's
     * gradients and moments */
    for (int z = 1; z < 3 && rc == FF_OK; z++)
        for (int w = 2; w < 4 && rc == FF_OK; w++) {
            if ((rc = ff_gpt_gather(g[0], WHICH[w], buf[0], 0)) == FF_OK &&
                (rc = ff_gpt_scatter(g[z], WHICH[w], buf[0], 0)) == FF_OK) {
                char what[96];
                snprintf(what, sizeof what, "%s after a scatter of %s, zero %d", desc, NAMES[w], z);
                if ((rc = same_state(g[0], g[z], 1, buf[0], buf[1], cn, what)) == FF_OK)
                    rc = same_state(g[0], g[z], w, buf[0], buf[1], cn, what);
            }
        }
    if (rc)
        CHECK(0, "%s: %s", desc, ff_ctx_error(ctx));
    if (root)
        printf("  %-16s zero 1 and 2 bitwise zero 0 over %d steps; rank 0's moments %zu bytes, "
               "%zu with zero 0\n",
               desc, STEPS, mem[1].adam, mem[0].adam);
    free(tok), free(tgt), free(buf[0]), free(buf[1]);
    for (int z = 0; z < 3; z++)
        ff_gpt_destroy(g[z]);
    ff_grid_destroy(grid);
    return rc;
}

/* With stages, the planner's traffic of each rank's stage against a step's
 * counters under zero 1 and 2 (ctx: AUTO's algorithms, as the planner
 * predicts them; ZeRO's halves are the ring's anyway): every group and
 * collective and the point-to-point messages, exactly. */
static void staged_traffic(ff_ctx *ctx, ff_dims shape, int stages)
{
    ff_grid *grid = NULL;
    int rc = ff_grid_create_staged(ctx, shape, stages, &grid);
    for (int z = 1; z <= 2 && rc == FF_OK; z++) {
        ff_gpt *g = NULL;
        ff_gpt_opts go;
        ff_gpt_opts_default(&go);
        go.zero = z;
        go.dp_overlap = z != 2;
        int32_t *tok = NULL, *tgt = NULL;
        ff_gpt_config cfg = CFG;
        cfg.Vp = 0; /* padded to 128, as the planner pads it */
        if ((rc = ff_gpt_create(grid, &cfg, &go, B, T, &g)) == FF_OK &&
            (rc = ff_gpt_init(g, 5)) == FF_OK) {
            int first = 0, count = 0;
            ff_gpt_local_sequences(g, &first, &count);
            tok = malloc((size_t)MICRO * count * T * sizeof *tok);
            tgt = malloc((size_t)MICRO * count * T * sizeof *tgt);
            ff_adamw h;
            hyper(&h);
            for (int s = 0; s < 2 && rc == FF_OK; s++) {
                batch(g, s, tok, tgt);
                for (int k = 0; s == 1 && k < FF_NGROUPS; k++)
                    ff_group_counters_reset(ff_grid_group(grid, (ff_group_kind)k));
                rc = ff_gpt_step(g, tok, tgt, MICRO, &h, s, NULL);
                if (rc == FF_OK)
                    rc = ff_gpt_sync(g);
            }
        }
        ff_plan_config pc;
        ff_plan_config_default(&pc);
        ff_ctx_coll_model(ctx, &pc.coll);
        pc.machine.ranks_per_node = ff_ctx_size(ctx) / ff_ctx_nodes(ctx);
        snprintf(pc.model.name, sizeof pc.model.name, "test");
        pc.model.layers = CFG.L, pc.model.heads = CFG.NH, pc.model.hidden = CFG.C;
        pc.model.vocab = CFG.V, pc.model.max_seq = CFG.maxT;
        pc.batch = (int64_t)B * MICRO, pc.seq = T, pc.micro_batches = MICRO;
        pc.checkpoint = 0, pc.ag_cache = CFG.L;
        pc.overlap = go.dp_overlap ? FF_OVERLAP_ALL : FF_OVERLAP_ALL & ~FF_OVERLAP_DP;
        pc.stages = stages, pc.zero = z;
        ff_plan_coll want[FF_PLAN_NGROUPS][FF_NCOLL], want_p2p;
        char err[256] = "";
        if (rc == FF_OK &&
            ff_plan_traffic_stage(&pc, shape, ff_grid_coords(grid), ff_grid_stage(grid), want,
                                  &want_p2p, err, sizeof err))
            CHECK(0, "ff_plan_traffic_stage: %s", err);
        int bad = 0;
        for (int k = 0; rc == FF_OK && !err[0] && k < FF_NGROUPS; k++)
            for (int c = 0; c <= FF_COLL_P2P; c++) {
                ff_counters n =
                    ff_group_counters(ff_grid_group(grid, (ff_group_kind)k), (ff_coll)c);
                const ff_plan_coll *w =
                    c == FF_COLL_P2P ? (k == FF_GROUP_PIPE ? &want_p2p : NULL) : &want[k][c];
                const uint64_t wc = w ? w->calls : 0, ws = w ? w->bytes_sent : 0,
                               wr = w ? w->bytes_recv : 0;
                bad += n.calls != wc || n.bytes_sent != ws || n.bytes_recv != wr;
                CHECK(n.calls == wc && n.bytes_sent == ws && n.bytes_recv == wr,
                      "%dx%dx%dx%d P%d zero %d stage %d: %s %s %llu calls, %llu B sent, %llu B "
                      "received; planned %llu, %llu, %llu",
                      shape.x, shape.y, shape.z, shape.d, stages, z, ff_grid_stage(grid),
                      ff_group_kind_name((ff_group_kind)k), ff_coll_name((ff_coll)c),
                      (unsigned long long)n.calls, (unsigned long long)n.bytes_sent,
                      (unsigned long long)n.bytes_recv, (unsigned long long)wc,
                      (unsigned long long)ws, (unsigned long long)wr);
            }
        int any = 0;
        MPI_Allreduce(&bad, &any, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
        if (ff_ctx_rank(ctx) == 0)
            printf("  %dx%dx%dx%d P%d zero %d: every rank's counters %s the planner's\n", shape.x,
                   shape.y, shape.z, shape.d, stages, z, any ? "DIFFER FROM" : "equal");
        if (rc)
            CHECK(0, "staged traffic: %s", ff_ctx_error(ctx));
        free(tok), free(tgt);
        ff_gpt_destroy(g);
    }
    ff_grid_destroy(grid);
}

/* A zero 1 run's state on grid a, resumed with zero 2 and zero 0 on grid b. */
static void resume_case(ff_ctx *ctx, ff_dims a, ff_dims b)
{
    const int root = ff_ctx_rank(ctx) == 0;
    ff_grid *ga = NULL, *gb = NULL;
    ff_gpt *src = NULL, *dst[2] = {NULL, NULL}; /* zero 2, zero 0 */
    ff_gpt_opts go;
    ff_gpt_opts_default(&go);
    go.zero = 1;
    ff_adamw h;
    hyper(&h);
    int rc = ff_grid_create(ctx, a, &ga);
    if (rc == FF_OK && (rc = ff_gpt_create(ga, &CFG, &go, B, T, &src)) == FF_OK)
        rc = ff_gpt_init(src, 7);
    int first = 0, count = 0;
    int32_t *tok = NULL, *tgt = NULL;
    for (int s = 0; s < 2 && rc == FF_OK; s++) {
        ff_gpt_local_sequences(src, &first, &count);
        free(tok), free(tgt);
        tok = malloc((size_t)MICRO * count * T * sizeof *tok);
        tgt = malloc((size_t)MICRO * count * T * sizeof *tgt);
        batch(src, s, tok, tgt);
        rc = ff_gpt_step(src, tok, tgt, MICRO, &h, s, NULL);
    }
    const size_t cn = src ? ff_gpt_canonical_size(src) : 0;
    float *state[3] = {NULL, NULL, NULL}; /* parameters, m, v of the zero 1 run */
    for (int w = 0; w < 3 && rc == FF_OK; w++) {
        state[w] = root ? malloc(cn * sizeof(float)) : NULL;
        rc = ff_gpt_gather(src, WHICH[w == 0 ? 0 : w + 1], state[w], 0);
    }
    if (rc == FF_OK)
        rc = ff_grid_create(ctx, b, &gb);
    for (int k = 0; k < 2 && rc == FF_OK; k++) {
        go.zero = k == 0 ? 2 : 0;
        rc = ff_gpt_create(gb, &CFG, &go, B, T, &dst[k]);
        for (int w = 0; w < 3 && rc == FF_OK; w++)
            rc = ff_gpt_scatter(dst[k], WHICH[w == 0 ? 0 : w + 1], state[w], 0);
    }
    float *back = root ? malloc(cn * sizeof(float)) : NULL;
    for (int k = 0; k < 2; k++)
        for (int w = 0; w < 3 && rc == FF_OK; w++) {
            rc = ff_gpt_gather(dst[k], WHICH[w == 0 ? 0 : w + 1], back, 0);
            CHECK(rc || !root || !memcmp(back, state[w], cn * sizeof(float)),
                  "resume %dx%dx%dx%d -> %dx%dx%dx%d: %s not given back by the zero %d model", a.x,
                  a.y, a.z, a.d, b.x, b.y, b.z, b.d, NAMES[w == 0 ? 0 : w + 1], k == 0 ? 2 : 0);
        }
    ff_gpt_step_info info[2];
    for (int k = 0; k < 2 && rc == FF_OK; k++) {
        ff_gpt_local_sequences(dst[k], &first, &count);
        free(tok), free(tgt);
        tok = malloc((size_t)MICRO * count * T * sizeof *tok);
        tgt = malloc((size_t)MICRO * count * T * sizeof *tgt);
        batch(dst[k], 2, tok, tgt);
        rc = ff_gpt_step(dst[k], tok, tgt, MICRO, &h, 2, &info[k]);
    }
    if (rc == FF_OK) {
        CHECK(!memcmp(&info[0], &info[1], 2 * sizeof(float)),
              "resumed step: loss %.9g norm %.9g zero 2, %.9g %.9g zero 0", info[0].loss,
              info[0].grad_norm, info[1].loss, info[1].grad_norm);
        float *other = root ? malloc(cn * sizeof(float)) : NULL;
        for (int w = 0; w < 4 && rc == FF_OK; w++)
            rc = same_state(dst[0], dst[1], w, back, other, cn, "resumed step");
        free(other);
    }
    if (rc)
        CHECK(0, "resume: %s", ff_ctx_error(ctx));
    if (root)
        printf("  resume: zero 1 on %dx%dx%dx%d -> zero 2 and zero 0 on %dx%dx%dx%d: state "
               "given back, next step bitwise\n",
               a.x, a.y, a.z, a.d, b.x, b.y, b.z, b.d);
    free(back), free(tok), free(tgt);
    for (int w = 0; w < 3; w++)
        free(state[w]);
    ff_gpt_destroy(src), ff_gpt_destroy(dst[0]), ff_gpt_destroy(dst[1]);
    ff_grid_destroy(ga), ff_grid_destroy(gb);
}

/* Each refusal on every rank, with its code and a message naming it. */
static void refusals(ff_ctx *ctx)
{
    struct {
        int zero, wire, algo, mask;
        int code;
        const char *says;
    } cases[4] = {{3, FF_WIRE_FP32, FF_ALGO_AUTO, 0, FF_EINVAL, "the choices are 0, 1 and 2"},
                  {1, FF_WIRE_BF16, FF_ALGO_AUTO, 0, FF_EUNSUPPORTED, "with the bf16 wire"},
                  {2, FF_WIRE_FP32, FF_ALGO_MPI, 0, FF_EUNSUPPORTED, "other than the ring"},
                  /* a masked step (SAMO with ZeRO is built: test_samo.c) */
                  {1, FF_WIRE_FP32, FF_ALGO_AUTO, 1, FF_EUNSUPPORTED, "masked training with ZeRO"}};
    for (int c = 0; c < 4; c++) {
        ff_grid *grid = NULL;
        ff_gpt *g = NULL;
        ff_gpt_opts go;
        ff_gpt_opts_default(&go);
        go.zero = cases[c].zero;
        go.linear.coll.wire = (ff_wire)cases[c].wire;
        go.linear.coll.algo = (ff_algo)cases[c].algo;
        int rc = ff_grid_create(ctx, (ff_dims){1, 1, 2, 4}, &grid);
        if (rc == FF_OK)
            rc = ff_gpt_create(grid, &CFG, &go, B, T, &g);
        if (rc == FF_OK && cases[c].mask == 1) {
            const size_t cn = ff_gpt_canonical_size(g);
            unsigned char *keep = malloc(cn);
            memset(keep, 1, cn);
            rc = ff_gpt_set_mask(g, keep, 0);
            free(keep);
            int first = 0, count = 0;
            ff_gpt_local_sequences(g, &first, &count);
            int32_t *tok = calloc((size_t)count * T, sizeof *tok);
            ff_adamw h;
            ff_adamw_default(&h);
            if (rc == FF_OK && (rc = ff_gpt_init(g, 1)) == FF_OK)
                rc = ff_gpt_step(g, tok, tok, 1, &h, 0, NULL);
            free(tok);
        }
        int codes[2] = {rc, -rc}, agreed[2];
        MPI_Allreduce(codes, agreed, 2, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
        CHECK(agreed[0] == cases[c].code && -agreed[1] == cases[c].code &&
                  strstr(ff_ctx_error(ctx), cases[c].says),
              "refusal %d: codes %d..%d, want %d; message \"%s\"", c, -agreed[1], agreed[0],
              cases[c].code, ff_ctx_error(ctx));
        if (ff_ctx_rank(ctx) == 0)
            printf("  refused on every rank (%d): %s\n", rc, ff_ctx_error(ctx));
        ff_gpt_destroy(g);
        ff_grid_destroy(grid);
    }
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    int world, rank;
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    ff_ctx *ctx;
    ff_ctx_options wo;
    ff_ctx_options_default(&wo);
    wo.algo = "ring"; /* zero 0's all-reduce the ring's: ZeRO adds in its order */
    if (ff_ctx_create(&ctx, MPI_COMM_WORLD, &wo) != FF_OK) {
        CHECK(0, "context: %s", ff_ctx_error(ctx));
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    if (rank == 0)
        printf("model L=%d C=%d NH=%d V=%d, B=%d T=%d; %d AdamW steps of %d micro-batches, "
               "zero 0, 1 and 2 per grid\n",
               CFG.L, CFG.C, CFG.NH, CFG.V, B, T, STEPS, MICRO);
    ff_dims grids[MAX_GRIDS];
    int ng = test_all_grids(world, grids, MAX_GRIDS), ran = 0;
    for (int i = 1; i < argc; i++) /* a subset: GxxGyxGzxGd arguments */
        if (sscanf(argv[i], "%dx%dx%dx%d", &grids[i - 1].x, &grids[i - 1].y, &grids[i - 1].z,
                   &grids[i - 1].d) != 4)
            CHECK(0, "bad grid %s", argv[i]);
    if (argc > 1)
        ng = argc - 1;
    for (int i = 0; i < ng && i < MAX_GRIDS; i++) {
        const ff_dims s = grids[i];
        if (s.d < 2 || CFG.NH % s.x || B % (s.z * s.d))
            continue;
        char desc[32];
        snprintf(desc, sizeof desc, "%dx%dx%dx%d", s.x, s.y, s.z, s.d);
        run_grid(ctx, &(grid_case){s, 1, 0, 1, 0}, desc);
        ran++;
    }
    CHECK(ran > 0, "no grid with D > 1 ran");
    /* experts in block 1 (expert parallelism 1, 2, 4), two stages of 4 ranks */
    /* and bf16-mixed (the master sliced, its copy gathered): Gz = 2 with
     * experts over EP 2, two stages */
    const grid_case more[7] = {{{1, 1, 1, 8}, 1, 4, 1, 0}, {{1, 1, 2, 4}, 1, 4, 2, 0},
                               {{2, 1, 1, 4}, 1, 4, 4, 0}, {{1, 1, 2, 2}, 2, 0, 1, 0},
                               {{2, 1, 1, 2}, 2, 0, 1, 0}, {{1, 2, 2, 2}, 1, 4, 2, 1},
                               {{1, 1, 2, 2}, 2, 0, 1, 1}};
    for (int i = 0; world == 8 && i < 7; i++) {
        const grid_case *c = &more[i];
        char desc[48];
        snprintf(desc, sizeof desc, "%dx%dx%dx%d%s%s%s", c->shape.x, c->shape.y, c->shape.z,
                 c->shape.d,
                 c->experts ? (c->ge == 1   ? " E4"
                               : c->ge == 2 ? " E4 EP2"
                                            : " E4 EP4")
                            : "",
                 c->stages > 1 ? " P2" : "", c->bf16 ? " bf16" : "");
        run_grid(ctx, c, desc);
    }
    if (world == 8) {
        ff_ctx *actx = NULL; /* AUTO's algorithms */
        if (ff_ctx_create(&actx, MPI_COMM_WORLD, NULL) == FF_OK) {
            staged_traffic(actx, (ff_dims){1, 1, 2, 2}, 2);
            staged_traffic(actx, (ff_dims){2, 1, 1, 2}, 2);
        } else {
            CHECK(0, "context: %s", ff_ctx_error(actx));
        }
        ff_ctx_destroy(actx);
        resume_case(ctx, (ff_dims){2, 1, 1, 4}, (ff_dims){1, 2, 2, 2});
        refusals(ctx);
    }
    int rc = test_finish("test_zero");
    ff_ctx_destroy(ctx);
    MPI_Finalize();
    return rc;
}
