/* The planner's U-Net (src/plan/unet.c) against values derived by hand:
 * the parameters of unet-tiny, the traffic of one step on two grids of 2
 * ranks, its memory of parameters, gradients and moments, and the grids it
 * rejects. Runs without MPI.
 *
 * unet-tiny (src/nn/unet.c: 8x8 images, C0 8, temb 32, mult 1,2, one block
 * per level, GroupNorm of 4 channels, attention of 2-channel heads in the
 * middle, image channels padded to 8). Its 43 linear layers as k x n (a 3x3
 * convolution's k is 9 Cin), by block:
 *   temb.lin1 8x32, temb.lin2 32x32, conv_in 72x8                    1856
 *   down0.res0 (8 -> 8): conv1 72x8, temb 32x8, conv2 72x8             1408
 *   down1.res0 (8 -> 16): conv1 72x16, temb 32x16, conv2 144x16,
 *                         skip 8x16                                    4096
 *   mid.res0, mid.res1: conv1 144x16, temb 32x16, conv2 144x16    2 x 5120
 *   mid.attn: qkv 16x48, proj 16x16                                    1024
 *   up1.res0 (16 + 16 -> 16): conv1 144x16, conv1b 144x16, temb 32x16,
 *                             conv2 144x16, skip 16x16, skipb 16x16    7936
 *   up1.res1 (16 + 8 -> 16): 144x16, 72x16, 32x16, 144x16, 16x16, 8x16 6656
 *   up0.res0 (16 + 8 -> 8): 144x8, 72x8, 32x8, 72x8, 16x8, 8x8         2752
 *   up0.res1 (8 + 8 -> 8): 72x8, 72x8, 32x8, 72x8, 8x8, 8x8             2112
 *   conv_out 72x8                                                       576
 * weights 38656; biases (35 layers: every one but the split parts conv1b,
 * skipb) 520; GroupNorm (22 of them, 272 channels) 544: 39720.
 *
 * A step's collectives on a group of 2 ranks under the ring (the collective
 * model below: no latency, one bandwidth, so rec-whole never wins): an
 * all-reduce of n sends n and receives n (the two halves), an all-gather of
 * a shard s sends and receives s, a reduce-scatter of a shard s sends and
 * receives s. */
#include <stdio.h>
#include <string.h>

#include "fourfold/plan.h"

static int failures;
#define CHECK(c, ...)                                                                              \
    do {                                                                                           \
        if (!(c)) {                                                                                \
            failures++;                                                                            \
            fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__);                                   \
            fprintf(stderr, __VA_ARGS__);                                                          \
            fputc('\n', stderr);                                                                   \
        }                                                                                          \
    } while (0)

enum { WEIGHTS = 38656, BIASES = 520, GN = 544, LAYERS = 43, BIAS_LAYERS = 35, GNS = 22 };

static void config(ff_plan_config *cfg, int64_t batch)
{
    char err[256];
    ff_plan_config_default(cfg);
    int rc = ff_model_preset("unet-tiny", &cfg->model, err, sizeof err);
    CHECK(rc == FF_OK, "unet-tiny: %s", err);
    cfg->batch = batch;
    cfg->ranks = 2;
    cfg->micro_batches = 1;
    cfg->coll.alpha_intra_s = cfg->coll.alpha_inter_s = 0;
    cfg->coll.beta_intra_Bps = cfg->coll.beta_inter_Bps;
}

static void expect(ff_plan_coll t[FF_PLAN_NGROUPS][FF_NCOLL], int group, ff_coll coll,
                   uint64_t calls, uint64_t bytes, const char *what)
{
    const ff_plan_coll *c = &t[group][coll];
    CHECK(c->calls == calls && c->bytes_sent == bytes && c->bytes_recv == bytes,
          "%s: %llu calls, %llu B sent, %llu B received; want %llu calls, %llu B each way", what,
          (unsigned long long)c->calls, (unsigned long long)c->bytes_sent,
          (unsigned long long)c->bytes_recv, (unsigned long long)calls, (unsigned long long)bytes);
}

static uint64_t total_calls(ff_plan_coll t[FF_PLAN_NGROUPS][FF_NCOLL])
{
    uint64_t n = 0;
    for (int k = 0; k < FF_PLAN_NGROUPS; k++)
        for (int c = 0; c < FF_NCOLL; c++)
            n += t[k][c].calls;
    return n;
}

int main(void)
{
    ff_plan_config cfg;
    ff_plan_coll t[FF_PLAN_NGROUPS][FF_NCOLL];
    char err[256];
    config(&cfg, 2);
    CHECK(ff_model_params(&cfg.model, 0) == WEIGHTS + BIASES + GN, "parameters %lld, want %d",
          (long long)ff_model_params(&cfg.model, 0), WEIGHTS + BIASES + GN);

    /* 1x1x1x2: data parallelism only. D: every weight's all-reduce (43,
     * 38656 floats); ZD: the loss (1), every bias (35 layers, 520) and
     * GroupNorm's gains and biases (22, 544); WORLD: the norm. X is one
     * rank: the loss's sum over X is not counted. */
    int rc =
        ff_plan_traffic(&cfg, (ff_dims){1, 1, 1, 2}, (ff_dims){0, 0, 0, 1}, t, err, sizeof err);
    CHECK(rc == FF_OK, "1x1x1x2: %s", err);
    expect(t, FF_GROUP_D, FF_COLL_ALLREDUCE, LAYERS, 4ull * WEIGHTS, "1x1x1x2 D all-reduce");
    expect(t, FF_GROUP_ZD, FF_COLL_ALLREDUCE, 1 + BIAS_LAYERS + GNS, 4ull * (1 + BIASES + GN),
           "1x1x1x2 ZD all-reduce");
    expect(t, FF_GROUP_WORLD, FF_COLL_ALLREDUCE, 1, 4, "1x1x1x2 WORLD all-reduce");
    CHECK(total_calls(t) == LAYERS + 1 + BIAS_LAYERS + GNS + 1, "1x1x1x2: %llu calls in all",
          (unsigned long long)total_calls(t));

    /* 1x1x2x1: weights sharded over Z. Z: one gather per layer (the AG
     * cache keeps every one to the backward) and one reduce-scatter, each
     * of half the weight (the shard sent, the other received); ZD as above;
     * no D. */
    rc = ff_plan_traffic(&cfg, (ff_dims){1, 1, 2, 1}, (ff_dims){0, 0, 1, 0}, t, err, sizeof err);
    CHECK(rc == FF_OK, "1x1x2x1: %s", err);
    expect(t, FF_GROUP_Z, FF_COLL_ALLGATHER, LAYERS, 4ull * WEIGHTS / 2, "1x1x2x1 Z all-gather");
    expect(t, FF_GROUP_Z, FF_COLL_REDUCE_SCATTER, LAYERS, 4ull * WEIGHTS / 2,
           "1x1x2x1 Z reduce-scatter");
    expect(t, FF_GROUP_ZD, FF_COLL_ALLREDUCE, 1 + BIAS_LAYERS + GNS, 4ull * (1 + BIASES + GN),
           "1x1x2x1 ZD all-reduce");
    CHECK(total_calls(t) == 2 * LAYERS + 1 + BIAS_LAYERS + GNS + 1, "1x1x2x1: %llu calls in all",
          (unsigned long long)total_calls(t));
    /* without the AG cache every backward but conv_out's (the last
     * forward, whose backward follows at once) gathers again */
    cfg.ag_cache = 0;
    rc = ff_plan_traffic(&cfg, (ff_dims){1, 1, 2, 1}, (ff_dims){0, 0, 0, 0}, t, err, sizeof err);
    CHECK(rc == FF_OK, "1x1x2x1, no AG cache: %s", err);
    expect(t, FF_GROUP_Z, FF_COLL_ALLGATHER, 2 * LAYERS - 1, 4ull * (2 * WEIGHTS - 576) / 2,
           "1x1x2x1 no AG cache: Z all-gather");
    cfg.ag_cache = FF_PLAN_AUTO;

    /* memory on 1x1x2x1: half the weights, every bias and GroupNorm
     * parameter; gradients the same; AdamW's two moments */
    ff_plan_result r;
    rc = ff_plan_evaluate(&cfg, (ff_dims){1, 1, 2, 1}, &r, err, sizeof err);
    const double held = 4.0 * (WEIGHTS / 2 + BIASES + GN);
    CHECK(rc == FF_OK && !r.rejected, "1x1x2x1: %s", rc ? err : r.reason);
    CHECK(r.mem_params == held && r.mem_grads == held && r.mem_optimizer == 2 * held,
          "1x1x2x1 memory: parameters %.0f, gradients %.0f, moments %.0f B; want %.0f, %.0f, %.0f",
          r.mem_params, r.mem_grads, r.mem_optimizer, held, held, 2 * held);
    CHECK(r.step_s > 0, "1x1x2x1: a step of %g s", r.step_s);

    /* FLOPs of a step (the trainer's step report, ff_plan_unet_flops): per
     * image, each layer of the list above is a product of px pixel rows by
     * k x n: 2 px k n forward, as much for dW, and as much again for dI
     * where there is an input gradient (all but temb.lin1 and conv_in); the
     * attention (8 heads of 2 channels over the 16 pixels of 4x4) 4 px^2
     * head per head forward (QK^T, PV) and 8 backward. Images of 8x8 (px 64)
     * at level 0, 4x4 (16) at level 1 and in the middle; the timestep
     * projections one row per image. */
    /* clang-format off */
    static const struct {
        int k, n, px, dinp;
    } prods[] = {
        {8, 32, 1, 0}, {32, 32, 1, 1}, {72, 8, 64, 0},                        /* temb, conv_in */
        {72, 8, 64, 1}, {32, 8, 1, 1}, {72, 8, 64, 1},                        /* down0.res0 */
        {72, 16, 16, 1}, {32, 16, 1, 1}, {144, 16, 16, 1}, {8, 16, 16, 1},    /* down1.res0 */
        {144, 16, 16, 1}, {32, 16, 1, 1}, {144, 16, 16, 1},                   /* mid.res0 */
        {16, 48, 16, 1}, {16, 16, 16, 1},                                     /* mid.attn */
        {144, 16, 16, 1}, {32, 16, 1, 1}, {144, 16, 16, 1},                   /* mid.res1 */
        {144, 16, 16, 1}, {144, 16, 16, 1}, {32, 16, 1, 1}, {144, 16, 16, 1},
        {16, 16, 16, 1}, {16, 16, 16, 1},                                     /* up1.res0 */
        {144, 16, 16, 1}, {72, 16, 16, 1}, {32, 16, 1, 1}, {144, 16, 16, 1},
        {16, 16, 16, 1}, {8, 16, 16, 1},                                      /* up1.res1 */
        {144, 8, 64, 1}, {72, 8, 64, 1}, {32, 8, 1, 1}, {72, 8, 64, 1},
        {16, 8, 64, 1}, {8, 8, 64, 1},                                        /* up0.res0 */
        {72, 8, 64, 1}, {72, 8, 64, 1}, {32, 8, 1, 1}, {72, 8, 64, 1},
        {8, 8, 64, 1}, {8, 8, 64, 1},                                         /* up0.res1 */
        {72, 8, 64, 1}};                                                      /* conv_out */
    /* clang-format on */
    double per_image = 12.0 * 8 * 16 * 16 * 2; /* the attention */
    int nprods = (int)(sizeof prods / sizeof prods[0]);
    for (int i = 0; i < nprods; i++)
        per_image += (4.0 + 2.0 * prods[i].dinp) * prods[i].px * prods[i].k * prods[i].n;
    CHECK(nprods == LAYERS, "the table lists %d layers, want %d", nprods, LAYERS);
    CHECK(r.model_flops == 2 * per_image && ff_plan_unet_flops(&cfg.model.unet, 8) == 8 * per_image,
          "FLOPs of a step: %.0f for 2 images, %.0f for 8; want %.0f per image", r.model_flops,
          ff_plan_unet_flops(&cfg.model.unet, 8), per_image);

    /* rejected: 8 channels over X = 16; a batch of 2 over Gd = 4; the GPT's
     * options the U-Net does not have */
    rc = ff_plan_evaluate(&cfg, (ff_dims){16, 1, 1, 1}, &r, err, sizeof err);
    CHECK(rc == FF_OK && r.rejected && strstr(r.reason, "channels"), "16x1x1x1: %s",
          rc ? err : r.reason);
    rc = ff_plan_evaluate(&cfg, (ff_dims){1, 1, 1, 4}, &r, err, sizeof err);
    CHECK(rc == FF_OK && r.rejected && strstr(r.reason, "batch"), "1x1x1x4: %s",
          rc ? err : r.reason);
    rc = ff_plan_traffic(&cfg, (ff_dims){1, 1, 1, 4}, (ff_dims){0, 0, 0, 0}, t, err, sizeof err);
    CHECK(rc == FF_EDIVIDE, "1x1x1x4 traffic: %d (%s), want FF_EDIVIDE", rc, err);
    cfg.cost = FF_COST_PAPER;
    rc = ff_plan_evaluate(&cfg, (ff_dims){1, 1, 2, 1}, &r, err, sizeof err);
    CHECK(rc == FF_EUNSUPPORTED, "the paper's cost model for a U-Net: %d, want FF_EUNSUPPORTED",
          rc);
    cfg.cost = FF_COST_FULL;
    ff_layer_plan lp;
    rc = ff_plan_per_layer(&cfg, (ff_dims){1, 1, 2, 1}, 0, 1, &lp, &r, err, sizeof err);
    CHECK(rc == FF_EUNSUPPORTED, "a per-layer plan for a U-Net: %d, want FF_EUNSUPPORTED", rc);
    /* every unet- preset the planner lists is a U-Net of src/nn/unet.c's */
    int unets = 0;
    for (size_t i = 0; ff_model_preset_name(i); i++) {
        const char *name = ff_model_preset_name(i);
        ff_model m;
        if (strncmp(name, "unet-", 5))
            continue;
        unets++;
        CHECK(ff_model_preset(name, &m, err, sizeof err) == FF_OK && m.kind == FF_MODEL_UNET,
              "preset %s: %s", name, err);
    }
    CHECK(unets == 8, "%d U-Net presets, want 8 (tiny, fmnist, 50m, 250m ... 4b)", unets);
    cfg.model.unet.image_size = 5; /* 2 levels halve it once */
    rc = ff_plan_evaluate(&cfg, (ff_dims){1, 1, 2, 1}, &r, err, sizeof err);
    CHECK(rc == FF_EDIVIDE, "5x5 images over 2 levels: %d, want FF_EDIVIDE", rc);

    if (failures)
        fprintf(stderr, "%d failures\n", failures);
    else
        printf("the planner's U-Net: every hand-derived value equal\n");
    return failures ? 1 : 0;
}
