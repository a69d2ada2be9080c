/* The planner's pipeline stages (issue 26, docs/planner.md "Pipeline
 * stages"): the schedule's simulation against timelines worked out by hand,
 * and the planner's stages (ranking, memory per stage, rank 0's traffic)
 * against its own single-stage functions. Pure arithmetic, no MPI. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fourfold/plan.h"
#include "plan/plan_internal.h"
#include "test_util.h"

enum { MAXP = 8 };

/* Every stage takes f for a forward run and b for a backward run; the last
 * stage's run holds both (f + b). */
static int simulate(int P, int M, int K, int schedule, double f, double b, double msg, double *end,
                    double *busy)
{
    double fwd[2 * MAXP], bwd[2 * MAXP], last_start[MAXP];
    for (int s = 0; s < P; s++)
        for (int lm = 0; lm < 2; lm++) {
            fwd[2 * s + lm] = s == P - 1 ? f + b : f;
            bwd[2 * s + lm] = b;
        }
    plan_pipe pp = {
        .P = P, .M = M, .K = K, .schedule = schedule, .fwd = fwd, .bwd = bwd, .msg_s = msg};
    return plan_pipe_simulate(&pp, end, busy, last_start);
}

static double makespan(int P, const double *end)
{
    double t = 0;
    for (int s = 0; s < P; s++)
        t = fmax(t, end[s]);
    return t;
}

/* Equal stages, no message time: the 1F1B result (M + P - 1)(f + b) (the
 * last stage is busy from (P-1) f until its M runs are done, then the last
 * gradient walks back through P-1 backward runs), for both schedules; each
 * stage busy M (f + b). One micro-batch in flight (K = 1): no overlap at
 * all, M P (f + b). One micro-batch with messages: the forward walk and
 * the backward walk each cross P-1 links. */
static void test_simulation(void)
{
    const double f = 1, b = 2;
    double end[MAXP], busy[MAXP];
    for (int P = 2; P <= 4; P++)
        for (int schedule = 0; schedule < 2; schedule++) {
            const int Ms[3] = {1, P, 2 * P + 1};
            for (int i = 0; i < 3; i++) {
                int M = Ms[i];
                CHECK(simulate(P, M, P, schedule, f, b, 0, end, busy) == 0, "simulate");
                double want = (M + P - 1) * (f + b);
                CHECK(fabs(makespan(P, end) - want) < 1e-12,
                      "P=%d M=%d schedule %d: makespan %g, want (M+P-1)(f+b) = %g", P, M, schedule,
                      makespan(P, end), want);
                for (int s = 0; s < P; s++)
                    CHECK(fabs(busy[s] - M * (f + b)) < 1e-12, "P=%d M=%d stage %d busy %g", P, M,
                          s, busy[s]);
                CHECK(simulate(P, M, 1, schedule, f, b, 0, end, busy) == 0, "simulate K=1");
                want = M * P * (f + b);
                CHECK(fabs(makespan(P, end) - want) < 1e-12,
                      "P=%d M=%d K=1 schedule %d: makespan %g, want M P (f+b) = %g", P, M, schedule,
                      makespan(P, end), want);
            }
            printf("  P=%d %-8s M=1,P,2P+1 makespans (M+P-1)(f+b), K=1 M P (f+b): %s "
                   "(tolerance 1e-12)\n",
                   P, schedule ? "1F1B" : "message", test_failures ? "FAILED" : "ok");
            const double msg = 0.25;
            CHECK(simulate(P, 1, P, schedule, f, b, msg, end, busy) == 0, "simulate msg");
            double want = P * (f + b) + 2 * (P - 1) * msg;
            CHECK(fabs(makespan(P, end) - want) < 1e-12,
                  "P=%d M=1 schedule %d with messages: %g, want P(f+b) + 2(P-1) msg = %g", P,
                  schedule, makespan(P, end), want);
        }
    /* A slow first stage (forward 3, backward 3; the others 1 and 1), P =
     * 2, M = 2, K = 2: stage 0 runs F0 [0,3], F1 [3,6]; stage 1 runs
     * FB0 [3,5], FB1 [6,8]; the gradients arrive at 5 and 8, so stage 0
     * runs B0 [6,9] and B1 [9,12] under both schedules. */
    double fwd[4] = {3, 3, 2, 2}, bwd[4] = {3, 3, 0, 0}, last_start[2];
    for (int schedule = 0; schedule < 2; schedule++) {
        plan_pipe pp = {.P = 2, .M = 2, .K = 2, .schedule = schedule, .fwd = fwd, .bwd = bwd};
        CHECK(plan_pipe_simulate(&pp, end, busy, last_start) == 0, "simulate slow stage");
        CHECK(end[0] == 12 && end[1] == 8 && busy[0] == 12 && busy[1] == 4 && last_start[0] == 9 &&
                  last_start[1] == 6,
              "slow first stage, schedule %d: ends %g %g, busy %g %g, last starts %g %g", schedule,
              end[0], end[1], busy[0], busy[1], last_start[0], last_start[1]);
    }
}

/* The message-driven schedule takes a gradient before an input when both
 * are there (it frees a slot). P = 3, M = 3, K = 3, every run 1 (the last
 * stage's too), no message time: stage 0 injects F0 F1 F2 in [0, 3];
 * stage 1 runs F0 [1,2], F1 [2,3]; stage 2 FB0 [2,3], FB1 [3,4]. At 3,
 * stage 1 has the input of 2 and the gradient of 0, and runs B0 [3,4],
 * then B1 [4,5] (gradient 1 came at 4), F2 [5,6]; stage 2 FB2 [6,7];
 * stage 1 B2 [7,8]; stage 0 B0 [4,5], B1 [5,6], B2 [8,9]. (Inputs first
 * would end at 8, 7, 5.) */
static void test_gradient_first(void)
{
    double fwd[6] = {1, 1, 1, 1, 1, 1}, bwd[6] = {1, 1, 1, 1, 0, 0};
    double end[3], busy[3], last_start[3];
    plan_pipe pp = {.P = 3, .M = 3, .K = 3, .schedule = 0, .fwd = fwd, .bwd = bwd};
    CHECK(plan_pipe_simulate(&pp, end, busy, last_start) == 0, "simulate");
    CHECK(end[0] == 9 && end[1] == 8 && end[2] == 7 && last_start[0] == 8 && last_start[1] == 7,
          "gradient first: ends %g %g %g, last backwards at %g %g", end[0], end[1], end[2],
          last_start[0], last_start[1]);
}

static void config(ff_plan_config *cfg)
{
    char err[256];
    ff_plan_config_default(cfg);
    CHECK(ff_model_preset("mini", &cfg->model, err, sizeof err) == FF_OK, "%s", err);
    cfg->model.layers = 8;
    cfg->batch = 16;
    cfg->seq = 64;
    cfg->ranks = 8;
    cfg->machine.ranks_per_node = 8;
    cfg->checkpoint = 0;
}

/* Rank 0's traffic in a staged evaluation is ff_plan_traffic_stage's (the
 * function test_pipeline checks against the counters); a pipeline that
 * lets one micro-batch in flight is slower, with a larger bubble. */
static void test_evaluate(void)
{
    ff_plan_config cfg;
    config(&cfg);
    char err[256];
    ff_dims grids[32];
    for (int P = 2; P <= 8; P *= 2)
        for (int schedule = 0; schedule < 2; schedule++) {
            cfg.stages = P;
            cfg.schedule = schedule;
            cfg.micro_batches = P;
            size_t n = ff_plan_grids(8 / P, grids, 32);
            for (size_t i = 0; i < n; i++) {
                ff_plan_result r;
                int rc = ff_plan_evaluate(&cfg, grids[i], &r, err, sizeof err);
                CHECK(rc == FF_OK, "evaluate: %s", err);
                if (rc != FF_OK || r.rejected)
                    continue;
                ff_plan_coll coll[FF_PLAN_NGROUPS][FF_NCOLL], p2p;
                rc = ff_plan_traffic_stage(&cfg, grids[i], (ff_dims){0, 0, 0, 0}, 0, coll, &p2p,
                                           err, sizeof err);
                CHECK(rc == FF_OK, "traffic: %s", err);
                CHECK(r.stages == P && r.micro_batches == P, "stages %d micro %d", r.stages,
                      r.micro_batches);
                CHECK(p2p.calls == r.p2p.calls && p2p.bytes_sent == r.p2p.bytes_sent &&
                          p2p.bytes_recv == r.p2p.bytes_recv,
                      "P=%d: p2p of rank 0 differs", P);
                uint64_t recv = p2p.bytes_recv;
                for (int k = 0; k < FF_NGROUPS; k++)
                    for (int c = 0; c < FF_NCOLL; c++) {
                        CHECK(coll[k][c].calls == r.coll[k][c].calls &&
                                  coll[k][c].bytes_sent == r.coll[k][c].bytes_sent,
                              "P=%d group %d coll %d differs", P, k, c);
                        recv += coll[k][c].bytes_recv;
                    }
                CHECK(recv == r.bytes_recv, "bytes received %llu, want %llu",
                      (unsigned long long)r.bytes_recv, (unsigned long long)recv);
                printf("  P=%d %-8s grid %dx%dx%dx%d: step %.4g s, bubble %.4g s; rank 0's "
                       "traffic = ff_plan_traffic_stage (exact)\n",
                       P, schedule ? "1F1B" : "message", grids[i].x, grids[i].y, grids[i].z,
                       grids[i].d, r.step_s, r.bubble_s);
                CHECK(r.step_s > 0 && r.bubble_s >= 0 && r.p2p_s > 0,
                      "P=%d: step %g, bubble %g, message %g", P, r.step_s, r.bubble_s, r.p2p_s);
                /* one micro-batch in flight: no two stages compute at once */
                ff_plan_result one;
                cfg.pipe_limit = 1;
                CHECK(ff_plan_evaluate(&cfg, grids[i], &one, err, sizeof err) == FF_OK, "%s", err);
                cfg.pipe_limit = 0;
                CHECK(one.step_s > r.step_s && one.bubble_s > r.bubble_s,
                      "P=%d: limit 1 takes %g (bubble %g), limit P %g (bubble %g)", P, one.step_s,
                      one.bubble_s, r.step_s, r.bubble_s);
            }
        }
}

/* Memory per stage: a stage holds its blocks' parameters and K
 * micro-batches' activations. With memory between the largest stage's of
 * P = 2 and the whole model's on one rank, the ranking of every P for 2
 * ranks (a pipeline of two 1x1x1x1 stages and the 4 grids of 2 ranks)
 * accepts the pipeline, and one rank cannot hold the model. */
static void test_memory(void)
{
    ff_plan_config cfg;
    config(&cfg);
    cfg.ranks = 2;
    char err[256];
    ff_plan_result one, two;
    CHECK(ff_plan_evaluate(&cfg, (ff_dims){1, 1, 1, 1}, &one, err, sizeof err) == FF_OK, "%s", err);
    cfg.stages = 2;
    CHECK(ff_plan_evaluate(&cfg, (ff_dims){1, 1, 1, 1}, &two, err, sizeof err) == FF_OK, "%s", err);
    CHECK(two.mem_params < one.mem_params && two.mem_total < one.mem_total,
          "a stage holds less: %g of %g", two.mem_total, one.mem_total);
    /* the stages keep K micro-batches' activations: a larger limit needs more */
    ff_plan_result more;
    cfg.pipe_limit = 4;
    CHECK(ff_plan_evaluate(&cfg, (ff_dims){1, 1, 1, 1}, &more, err, sizeof err) == FF_OK, "%s",
          err);
    CHECK(more.mem_activations > two.mem_activations, "limit 4: %g, limit 2: %g",
          more.mem_activations, two.mem_activations);
    cfg.pipe_limit = 0;

    cfg.stages = FF_PLAN_AUTO;
    cfg.machine.memory_bytes = (two.mem_total + one.mem_total) / 2;
    ff_plan *plan;
    CHECK(ff_plan_create(&plan, &cfg) == FF_OK, "%s", ff_plan_error(plan));
    int found = 0;
    for (size_t i = 0; i < ff_plan_count(plan); i++) {
        const ff_plan_result *r = ff_plan_get(plan, i);
        if (r->stages == 2) {
            found = 1;
            CHECK(!r->rejected, "the pipeline fits: %s", r->reason);
        }
    }
    cfg.stages = 1;
    CHECK(ff_plan_evaluate(&cfg, (ff_dims){1, 1, 1, 1}, &one, err, sizeof err) == FF_OK &&
              one.rejected && strstr(one.reason, "GiB"),
          "the whole model on one rank does not fit: %s", one.reason);
    CHECK(found && ff_plan_count(plan) == 5, "%zu configurations", ff_plan_count(plan));
    ff_plan_destroy(plan);
}

/* Automatic stages and micro-batches enumerate every P dividing the ranks
 * (at most L) with every grid of ranks / P; each result's micro-batch count
 * divides its sequences per rank and is the fastest of them. */
static void test_ranking(void)
{
    ff_plan_config cfg;
    config(&cfg);
    cfg.stages = FF_PLAN_AUTO;
    cfg.micro_batches = FF_PLAN_AUTO;
    ff_plan *plan;
    CHECK(ff_plan_create(&plan, &cfg) == FF_OK, "%s", ff_plan_error(plan));
    size_t want = 0;
    for (int P = 1; P <= 8; P *= 2)
        want += ff_plan_grids(8 / P, NULL, 0);
    CHECK(ff_plan_count(plan) == want, "%zu configurations, want %zu", ff_plan_count(plan), want);
    double prev = 0;
    char err[256];
    for (size_t i = 0; i < ff_plan_accepted(plan); i++) {
        const ff_plan_result *r = ff_plan_get(plan, i);
        CHECK(r->step_s >= prev, "ranked by step time");
        prev = r->step_s;
        int64_t per_rank = cfg.batch / ((int64_t)r->grid.z * r->grid.d);
        CHECK(r->micro_batches >= 1 && per_rank % r->micro_batches == 0, "M=%d of %lld",
              r->micro_batches, (long long)per_rank);
        ff_plan_config one = cfg;
        one.stages = r->stages;
        for (int64_t M = 1; M <= per_rank; M++) {
            if (per_rank % M)
                continue;
            one.micro_batches = (int)M;
            ff_plan_result t;
            CHECK(ff_plan_evaluate(&one, r->grid, &t, err, sizeof err) == FF_OK, "%s", err);
            CHECK(t.rejected || t.step_s >= r->step_s, "M=%lld is faster than the chosen %d",
                  (long long)M, r->micro_batches);
        }
    }
    ff_plan_destroy(plan);
}

/* The two lower bounds of the step that plan_play reports, played on the
 * list of cfg's M micro-batches itself (plan_eval_full's path); 0 where
 * the grid is rejected. */
static int lower_direct(const ff_plan_config *cfg, ff_dims g, plan_ops *ops, double lower[2])
{
    ff_plan_result *r = calloc(2, sizeof *r);
    plan_links(&cfg->machine, g, 1, 0, r->link);
    plan_shape s;
    int fits = !plan_check_divides(cfg, g, r);
    if (fits) {
        plan_shape_init(cfg, g, &s);
        fits = plan_fit_memory(cfg, g, r, &s);
    }
    if (fits) {
        ops->n = 0, ops->tags = 0, ops->ge = s.ge;
        plan_schedule(&s, ops);
        int ranks = plan_group_size(g, FF_GROUP_WORLD), rpn = cfg->machine.ranks_per_node;
        double end, bg, rate = plan_gemm_rate(&cfg->machine, ranks < rpn ? ranks : rpn);
        CHECK(plan_play(cfg, g, ops, r->link, rate, &r[1], 1, &end, &bg, lower) == 0, "play");
    }
    free(r);
    return fits;
}

/* Automatic micro-batches without stages (docs/planner.md, "Pipeline
 * stages"): the lower bound of a count's step, extrapolated from lists of
 * one and two micro-batches, equals the larger of the two bounds the list
 * of M micro-batches gives (they are affine in M) and is at most the step;
 * the counts are tried in the order of the bound and the rest skipped, and
 * the answer is still the fastest count that fits, on a tie the fewest,
 * bit for bit what ff_plan_evaluate gives for it. GPT-2's shape on 16
 * ranks of this machine, 128 sequences (up to 128 micro-batches), under
 * each overlap and progress setting that changes the timeline, and a
 * mixture of experts. */
static void test_micro_bound(void)
{
    const char *variant[] = {"default", "overlaps off", "cmm, progress wait",
                             "bf16 wire, CAC, progress thread", "mixture of experts"};
    plan_ops ops = {0};
    ff_dims grids[64];
    char err[256];
    for (int v = 0; v < 5; v++) {
        ff_plan_config cfg;
        ff_plan_config_default(&cfg);
        CHECK(ff_model_preset(v == 4 ? "mini-moe" : "gpt2", &cfg.model, err, sizeof err) == FF_OK,
              "%s", err);
        CHECK(ff_profile_preset("this", &cfg.machine, err, sizeof err) == FF_OK, "%s", err);
        cfg.model.layers = v == 4 ? 4 : 2; /* (the step's shape per block is what counts) */
        cfg.ranks = 16;
        cfg.batch = 128;
        cfg.seq = v == 4 ? 128 : 256;
        cfg.machine.memory_bytes = v == 4 ? 64e6 : 1e9; /* small counts need checkpointing */
        cfg.overlap = v == 1 ? 0 : cfg.overlap;
        cfg.cmm = v == 2;
        cfg.progress = v == 2 ? FF_PROGRESS_WAIT : v == 3 ? FF_PROGRESS_THREAD : cfg.progress;
        cfg.wire_bytes = v == 3 ? 2 : 4;
        cfg.cac = v == 3;
        cfg.expert_parallel = 1;
        cfg.micro_batches = FF_PLAN_AUTO;
        ff_plan *plan;
        CHECK(ff_plan_create(&plan, &cfg) == FF_OK, "%s: %s", variant[v], ff_plan_error(plan));
        size_t ng = ff_plan_grids(cfg.ranks, grids, 64), checked = 0, counts = 0;
        double worst = 0; /* bound / step */
        for (size_t i = 0; i < ff_plan_count(plan); i++) {
            const ff_plan_result *r = ff_plan_get(plan, i);
            ff_plan_config one = cfg;
            ff_plan_result best, t;
            int have = 0;
            int64_t per_rank = cfg.batch / ((int64_t)r->grid.z * r->grid.d);
            for (int64_t M = 1; M <= per_rank && !r->rejected; M++) {
                if (per_rank % M)
                    continue;
                one.micro_batches = (int)M;
                CHECK(ff_plan_evaluate(&one, r->grid, &t, err, sizeof err) == FF_OK, "%s", err);
                double bound, lower[2];
                CHECK(plan_full_bound(&one, r->grid, &ops, &bound, err, sizeof err) == FF_OK, "%s",
                      err);
                CHECK((bound < 0) == (t.rejected != 0), "%s %dx%dx%dx%d M=%lld: bound %g, %s",
                      variant[v], r->grid.x, r->grid.y, r->grid.z, r->grid.d, (long long)M, bound,
                      t.rejected ? "rejected" : "fits");
                if (t.rejected)
                    continue;
                counts++;
                CHECK(bound <= t.step_s * (1 + 1e-12),
                      "%s %dx%dx%dx%d M=%lld: bound %.17g > step %.17g", variant[v], r->grid.x,
                      r->grid.y, r->grid.z, r->grid.d, (long long)M, bound, t.step_s);
                worst = fmax(worst, bound / t.step_s);
                if (M <= 32 && lower_direct(&one, r->grid, &ops, lower)) {
                    double direct = fmax(lower[0], lower[1]);
                    CHECK(fabs(bound - direct) <= 1e-12 * direct,
                          "%s %dx%dx%dx%d M=%lld: extrapolated bound %.17g, the list's %.17g",
                          variant[v], r->grid.x, r->grid.y, r->grid.z, r->grid.d, (long long)M,
                          bound, direct);
                }
                if (!have || t.step_s < best.step_s)
                    best = t, have = 1; /* (ascending M: a tie keeps the fewest) */
            }
            if (!have)
                continue;
            checked++;
            CHECK(r->micro_batches == best.micro_batches && r->step_s == best.step_s &&
                      r->exposed_s == best.exposed_s && r->mem_total == best.mem_total &&
                      r->checkpoint == best.checkpoint && r->ag_cache == best.ag_cache,
                  "%s %dx%dx%dx%d: automatic M=%d (%.17g s), every count's fastest M=%d (%.17g s)",
                  variant[v], r->grid.x, r->grid.y, r->grid.z, r->grid.d, r->micro_batches,
                  r->step_s, best.micro_batches, best.step_s);
        }
        CHECK(checked > ng / 2, "%s: %zu of %zu grids fit", variant[v], checked, ng);
        printf("  automatic micro-batches, %s: %zu grids, %zu counts: each bound at most its "
               "step (at most %.4f of it), equal to the M-list's (tolerance 1e-12); the "
               "choice is every count's fastest: %s\n",
               variant[v], checked, counts, worst, test_failures ? "FAILED" : "ok");
        ff_plan_destroy(plan);
    }
    plan_ops_free(&ops);
}

/* What the planner refuses with stages. */
static void test_refusals(void)
{
    ff_plan_config cfg;
    config(&cfg);
    char err[256];
    ff_plan_result r;
    ff_dims g = {1, 1, 2, 1};
    cfg.stages = FF_PLAN_AUTO;
    CHECK(ff_plan_evaluate(&cfg, g, &r, err, sizeof err) == FF_EINVAL, "auto on one grid");
    cfg.stages = 4;
    cfg.ag_cache = 3;
    CHECK(ff_plan_evaluate(&cfg, g, &r, err, sizeof err) == FF_EINVAL && strstr(err, "AG cache"),
          "a partial AG cache: %s", err);
    cfg.ag_cache = FF_PLAN_AUTO;
    int split[4] = {2, 2, 2, 1};
    cfg.stage_layers = split;
    CHECK(ff_plan_evaluate(&cfg, g, &r, err, sizeof err) == FF_EINVAL && strstr(err, "add up"),
          "a split of 7 blocks: %s", err);
    split[3] = 2;
    CHECK(ff_plan_evaluate(&cfg, g, &r, err, sizeof err) == FF_OK && !r.rejected, "%s %s", err,
          r.reason);
    cfg.stage_layers = NULL;
    cfg.cost = FF_COST_PAPER;
    CHECK(ff_plan_evaluate(&cfg, g, &r, err, sizeof err) == FF_EINVAL, "paper with stages");
    cfg.cost = FF_COST_FULL;
    cfg.stages = 16;
    CHECK(ff_plan_evaluate(&cfg, (ff_dims){1, 1, 1, 1}, &r, err, sizeof err) == FF_OK &&
              r.rejected && strstr(r.reason, "16 stages for 8 blocks"),
          "more stages than blocks: %s", r.reason);
    cfg.stages = 3;
    ff_plan *plan;
    CHECK(ff_plan_create(&plan, &cfg) == FF_EINVAL && strstr(ff_plan_error(plan), "3 stages"),
          "8 ranks in 3 stages: %s", ff_plan_error(plan));
    ff_plan_destroy(plan);
}

int main(void)
{
    test_simulation();
    test_gradient_first();
    test_evaluate();
    test_memory();
    test_ranking();
    test_micro_bound();
    test_refusals();
    return test_finish("plan_stages");
}
