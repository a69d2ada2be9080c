/* ff_plan_traffic: the calls and bytes per (group, collective) of one rank in
 * one step, against a derivation by hand from docs/design.md §3 and §4 for a small
 * GPT, and the ring's volumes derived here again from the ring's rule (not
 * from the library's function). Also the rejection reasons and the memory
 * arithmetic. Runs without MPI.
 *
 * Which algorithm the collective layer runs decides an all-reduce's bytes
 * (rec-whole sends lg p whole vectors); the tests of the GPT's traffic give
 * the planner a collective model without latency and with one bandwidth,
 * in which the ring's bytes are the cheapest, and test_rec_whole gives it one in which short
 * all-reduces between nodes run rec-whole, with their volumes derived by
 * hand.
 *
 * Model: L=2 blocks, C=8, NH=2, V=100 (padded to 128), T=3, fp32 wire.
 * Per block the linear layers are QKV (N, 8 -> 24), projection (T, 8 -> 8),
 * MLP up (N, 8 -> 32), MLP down (T, 32 -> 8); the tied LM head is N (8 -> 128). */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "fourfold/plan.h"
#include "test_util.h"

/* ---- the ring, derived again ----
 * A ring all-reduce of n over p ranks cuts n into p chunks, chunk i of
 * floor(n/p) elements plus one if i < n mod p. Data flows from r to r+1 and
 * rank r ends the reduce-scatter phase owning chunk r, so in that phase it
 * forwards every chunk but its own (p-1 sends) and receives every chunk but
 * r-1's (the one its left neighbour keeps); in the all-gather phase it sends
 * every chunk but the one that completes the ring at r+1 (chunk r+1), and
 * receives every chunk but its own. */
static long chunk(long n, int p, int i) { return n / p + (i < n % p ? 1 : 0); }

static void ring_ar(long n, int p, int r, long *sent, long *recv)
{
    *sent = *recv = 0;
    if (p == 1)
        return;
    for (int i = 0; i < p; i++) {
        if (i != r)
            *sent += chunk(n, p, i); /* reduce-scatter phase */
        if (i != (r + 1) % p)
            *sent += chunk(n, p, i); /* all-gather phase */
        if (i != (r - 1 + p) % p)
            *recv += chunk(n, p, i);
        if (i != r)
            *recv += chunk(n, p, i);
    }
}

typedef struct {
    long calls, sent, recv; /* elements */
} expect;

static void add_ar(expect *e, long n, int p, int r)
{
    long s, v;
    ring_ar(n, p, r, &s, &v);
    e->calls++, e->sent += s, e->recv += v;
}

/* all-gather of `count` per rank, or reduce-scatter to `count`: p-1 blocks */
static void add_block(expect *e, long count, int p)
{
    e->calls++, e->sent += (p - 1) * count, e->recv += (p - 1) * count;
}

static void compare(const char *label, ff_plan_coll got[FF_PLAN_NGROUPS][FF_NCOLL],
                    expect want[FF_PLAN_NGROUPS][FF_NCOLL])
{
    static const char *const c[FF_NCOLL] = {"AG", "RS", "AR", "A2A"};
    for (int k = 0; k < FF_PLAN_NGROUPS; k++)
        for (int j = 0; j < FF_NCOLL; j++) {
            const expect *w = &want[k][j];
            const ff_plan_coll *p = &got[k][j];
            CHECK(p->calls == (uint64_t)w->calls && p->bytes_sent == (uint64_t)(4 * w->sent) &&
                      p->bytes_recv == (uint64_t)(4 * w->recv),
                  "%s: %s %s: %llu calls, %llu B sent, %llu B received; by hand %ld, %ld, %ld",
                  label, ff_plan_group_name(k), c[j], (unsigned long long)p->calls,
                  (unsigned long long)p->bytes_sent, (unsigned long long)p->bytes_recv, w->calls,
                  4 * w->sent, 4 * w->recv);
            if (w->calls)
                printf("  %-34s %-5s %-3s %3ld calls %7ld B sent %7ld B received\n", label,
                       ff_plan_group_name(k), c[j], w->calls, 4 * w->sent, 4 * w->recv);
        }
}

static void base_config(ff_plan_config *cfg)
{
    ff_plan_config_default(cfg);
    snprintf(cfg->model.name, sizeof cfg->model.name, "small");
    cfg->model.layers = 2;
    cfg->model.hidden = 8;
    cfg->model.heads = 2;
    cfg->model.vocab = 100;
    cfg->batch = 4;
    cfg->seq = 3;
    cfg->checkpoint = 0;
    cfg->ag_cache = FF_PLAN_AUTO; /* every block, wte too: the model's default */
    /* no latency and one bandwidth: a step costs its bytes (times the
     * streams sharing a node's link, at most 1 for the ring on nodes of
     * consecutive ranks), so rec-whole's 2 or more whole vectors never beat
     * the ring's 2(p-1)/p of one (and ties keep the ring). With a faster
     * link within nodes they could: on 3 ranks over nodes of 2, its fold
     * stays on the node. */
    cfg->coll.alpha_intra_s = cfg->coll.alpha_inter_s = 0;
    cfg->coll.beta_intra_Bps = cfg->coll.beta_inter_Bps;
}

/* Grid 2x2x2x1 (Gd = 1: no data parallelism), rank (x, y, z, 0).
 * m = B T/(Gz Gd) = 6 rows per micro-batch (u micro-batches of m/u).
 *   X (N backward, T forward, embedding, LM head backward, cross-entropy):
 *     embedding forward AR of m C/Gy = 4m; per block forward: projection and
 *     MLP down AR of m C/Gy = 4m each; backward: QKV and MLP up dI AR of
 *     m C/Gy = 4m each; LM head dI 4m; cross-entropy: one all-gather in
 *     which each rank contributes 3 floats per row (local max, local sum of
 *     exponentials, target logit), count 3m, so (Gx - 1) 3m = 3m each way
 *   Y (N forward, T backward, LayerNorm statistics):
 *     a LayerNorm forward is two-pass: AR of m (row sums: the mean), then AR
 *     of m (sums of squared deviations: the variance); its backward one AR of
 *     2m (the gradient's two row sums);
 *     per block forward: LN1 m + m, QKV m 3C/Gx = 12m, LN2 m + m, MLP up
 *     m 4C/Gx = 16m; backward: MLP down dI m 4C/Gx = 16m, LN2 2m, projection
 *     dI m C/Gx = 4m, LN1 2m;
 *     final LN m + m forward and 2m backward, LM head forward m Vp/Gx = 64m
 *     (with u = 2, m = 3 splits unevenly over Y's 2 ranks: chunks 2 and 1)
 *   Z: all-gather of each weight's shard k n/(Gx Gy Gz): QKV 24, projection 8,
 *     MLP 32 and 32 (96 per block), wte 128*8/8 = 128; reduce-scatter of the same
 *   ZD (2 ranks, index z): the gradients of the other parameters,
 *     L (6C/Gy + 7C/Gx) + 2C/Gy + T C/Gy = 2 (24 + 28) + 8 + 12 = 124, and the loss (1)
 *   WORLD (8 ranks): the gradient norm (1)
 * Checkpointing adds the forward of every block again as far as the GELU
 * (its X and Y calls but the MLP down's X all-reduce: the MLP down's output
 * is the next block's input, which is kept) and, for the blocks outside the
 * AG cache, the all-gathers of those three layers and of the MLP down, whose
 * backward must gather it again. Without checkpointing a block outside the
 * AG cache gathers its four weights again for the backward (the forward's
 * were released): the same four sizes. Unless the cache holds every block
 * (`cached` = L), wte is not kept from the lookup to the LM head either,
 * and the head gathers it again (src/nn/linear.c keeps a gathered weight
 * from one use to the layer's next only when they are adjacent, or a
 * recompute precedes its backward, or the layer is cached). */
static void expect_2221(expect w[FF_PLAN_NGROUPS][FF_NCOLL], ff_dims c, int ckpt, int cached, int u)
{
    memset(w, 0, sizeof(expect) * FF_PLAN_NGROUPS * FF_NCOLL);
    const int L = 2;
    const long m = 6 / u;
    expect *x = &w[FF_GROUP_X][FF_COLL_ALLREDUCE], *y = &w[FF_GROUP_Y][FF_COLL_ALLREDUCE];
    for (int mb = 0; mb < u; mb++) {
        add_ar(x, 4 * m, 2, c.x);                      /* embedding */
        for (int l = 0; l < L * (ckpt ? 2 : 1); l++) { /* forward (and recompute) */
            add_ar(x, 4 * m, 2, c.x);                  /* attention projection */
            if (l < L)
                add_ar(x, 4 * m, 2, c.x); /* MLP down: not recomputed */
            add_ar(y, m, 2, c.y);         /* LN1: mean */
            add_ar(y, m, 2, c.y);         /* LN1: variance */
            add_ar(y, 12 * m, 2, c.y);
            add_ar(y, m, 2, c.y); /* LN2: mean */
            add_ar(y, m, 2, c.y); /* LN2: variance */
            add_ar(y, 16 * m, 2, c.y);
        }
        for (int l = 0; l < L; l++) { /* backward */
            add_ar(x, 4 * m, 2, c.x);
            add_ar(x, 4 * m, 2, c.x);
            add_ar(y, 16 * m, 2, c.y);
            add_ar(y, 2 * m, 2, c.y);
            add_ar(y, 4 * m, 2, c.y);
            add_ar(y, 2 * m, 2, c.y);
        }
        add_ar(x, 4 * m, 2, c.x); /* LM head backward */
        /* cross-entropy: 3 floats per row from each of the Gx = 2 ranks */
        add_block(&w[FF_GROUP_X][FF_COLL_ALLGATHER], 3 * m, 2);
        add_ar(y, m, 2, c.y);      /* final LayerNorm forward: mean */
        add_ar(y, m, 2, c.y);      /* final LayerNorm forward: variance */
        add_ar(y, 64 * m, 2, c.y); /* LM head forward */
        add_ar(y, 2 * m, 2, c.y);  /* final LayerNorm backward */
        expect *ag = &w[FF_GROUP_Z][FF_COLL_ALLGATHER],
               *rs = &w[FF_GROUP_Z][FF_COLL_REDUCE_SCATTER];
        add_block(ag, 128, 2);
        if (cached < L)
            add_block(ag, 128, 2); /* the LM head's own gather */
        /* the forward, then the recompute (or the backward) */
        for (int pass = 0; pass < 2; pass++)
            for (int l = 0; l < L; l++)
                if (pass == 0 || l < L - cached) {
                    add_block(ag, 24, 2), add_block(ag, 8, 2);
                    add_block(ag, 32, 2);
                    add_block(ag, 32, 2); /* MLP down: in the recompute pass its
                                             backward's gather, not a recompute */
                }
        for (int l = 0; l < L; l++) {
            add_block(rs, 24, 2), add_block(rs, 8, 2);
            add_block(rs, 32, 2), add_block(rs, 32, 2);
        }
        add_block(rs, 128, 2);
    }
    add_ar(&w[FF_GROUP_ZD][FF_COLL_ALLREDUCE], 124, 2, c.z);
    add_ar(&w[FF_GROUP_ZD][FF_COLL_ALLREDUCE], 1, 2, c.z);
    add_ar(&w[FF_GROUP_WORLD][FF_COLL_ALLREDUCE], 1, 8, c.x + 2 * (c.y + 2 * c.z));
}

/* Grid 1x1x1xGd (pure data parallelism), rank d: m = 4*3/Gd rows; only D
 * (a bucket per block of its 12 C^2 = 768 weights, then wte's 128*8 = 1024),
 * ZD = D (the other parameters: 2 (48 + 56) + 16 + 3*8 = 248, the loss) and
 * WORLD = D (the norm). */
static void expect_data(expect w[FF_PLAN_NGROUPS][FF_NCOLL], int gd, int d)
{
    memset(w, 0, sizeof(expect) * FF_PLAN_NGROUPS * FF_NCOLL);
    add_ar(&w[FF_GROUP_D][FF_COLL_ALLREDUCE], 768, gd, d);
    add_ar(&w[FF_GROUP_D][FF_COLL_ALLREDUCE], 768, gd, d);
    add_ar(&w[FF_GROUP_D][FF_COLL_ALLREDUCE], 1024, gd, d);
    add_ar(&w[FF_GROUP_ZD][FF_COLL_ALLREDUCE], 248, gd, d);
    add_ar(&w[FF_GROUP_ZD][FF_COLL_ALLREDUCE], 1, gd, d);
    add_ar(&w[FF_GROUP_WORLD][FF_COLL_ALLREDUCE], 1, gd, d);
}

/* rec-whole's all-reduce of n on p ranks, by its rule: with p = 2^L + rem,
 * ranks 0..2 rem - 1 pair up, the even one of each pair sends its vector to
 * the odd one and receives the result at the end; the 2^L others exchange
 * the whole vector L times. */
static void add_whole(expect *e, long n, int p, int r)
{
    int L = 0;
    while ((2 << L) <= p)
        L++;
    int rem = p - (1 << L);
    long v = r < 2 * rem && r % 2 == 0 ? n : (L + (r < 2 * rem)) * n;
    e->calls++, e->sent += v, e->recv += v;
}

/* 1x1x1xGd (gd = 3 or 4) when the short all-reduces run rec-whole: the
 * wte and block buckets (1024, 768) stay rings, the loss and the norm (1
 * element) are rec-whole, and the 248 others too on 4 ranks (see
 * test_rec_whole for the thresholds) */
static void expect_data_whole(expect w[FF_PLAN_NGROUPS][FF_NCOLL], int gd, int d)
{
    memset(w, 0, sizeof(expect) * FF_PLAN_NGROUPS * FF_NCOLL);
    add_ar(&w[FF_GROUP_D][FF_COLL_ALLREDUCE], 768, gd, d);
    add_ar(&w[FF_GROUP_D][FF_COLL_ALLREDUCE], 768, gd, d);
    add_ar(&w[FF_GROUP_D][FF_COLL_ALLREDUCE], 1024, gd, d);
    if (gd == 4)
        add_whole(&w[FF_GROUP_ZD][FF_COLL_ALLREDUCE], 248, gd, d);
    else
        add_ar(&w[FF_GROUP_ZD][FF_COLL_ALLREDUCE], 248, gd, d);
    add_whole(&w[FF_GROUP_ZD][FF_COLL_ALLREDUCE], 1, gd, d);
    add_whole(&w[FF_GROUP_WORLD][FF_COLL_ALLREDUCE], 1, gd, d);
}

static void run(const char *label, const ff_plan_config *cfg, ff_dims g, ff_dims c,
                expect want[FF_PLAN_NGROUPS][FF_NCOLL])
{
    ff_plan_coll got[FF_PLAN_NGROUPS][FF_NCOLL];
    char err[256];
    int rc = ff_plan_traffic(cfg, g, c, got, err, sizeof err);
    CHECK(rc == FF_OK, "%s: %s", label, err);
    if (rc == FF_OK)
        compare(label, got, want);
}

static void test_traffic(void)
{
    ff_plan_config cfg;
    expect want[FF_PLAN_NGROUPS][FF_NCOLL];
    base_config(&cfg);
    ff_dims g = {2, 2, 2, 1};
    ff_dims ranks[3] = {{0, 0, 0, 0}, {1, 0, 1, 0}, {1, 1, 1, 0}};
    for (int i = 0; i < 3; i++) {
        char label[64];
        snprintf(label, sizeof label, "2x2x2x1 rank (%d,%d,%d,0)", ranks[i].x, ranks[i].y,
                 ranks[i].z);
        expect_2221(want, ranks[i], 0, 2, 1);
        run(label, &cfg, g, ranks[i], want);
    }
    cfg.checkpoint = 1;
    cfg.ag_cache = 1;
    expect_2221(want, ranks[1], 1, 1, 1);
    run("2x2x2x1 checkpointing, AG cache 1", &cfg, g, ranks[1], want);
    cfg.ag_cache = 0;
    expect_2221(want, ranks[0], 1, 0, 1);
    run("2x2x2x1 checkpointing, no AG cache", &cfg, g, ranks[0], want);
    cfg.checkpoint = 0;
    cfg.ag_cache = FF_PLAN_AUTO;
    cfg.micro_batches = 2;
    expect_2221(want, ranks[2], 0, 2, 2);
    run("2x2x2x1 2 micro-batches", &cfg, g, ranks[2], want);
    /* the overlaps move collectives in time, never change them */
    cfg.micro_batches = 1;
    cfg.overlap = 0;
    expect_2221(want, ranks[0], 0, 2, 1);
    run("2x2x2x1 overlaps off", &cfg, g, ranks[0], want);
    cfg.overlap = FF_OVERLAP_ALL;
    cfg.ag_cache = 0;
    expect_2221(want, ranks[1], 0, 0, 1);
    run("2x2x2x1 no AG cache", &cfg, g, ranks[1], want);

    base_config(&cfg);
    for (int d = 0; d < 4; d++) {
        char label[64];
        snprintf(label, sizeof label, "1x1x1x4 rank d=%d", d);
        expect_data(want, 4, d);
        run(label, &cfg, (ff_dims){1, 1, 1, 4}, (ff_dims){0, 0, 0, d}, want);
    }
    /* three ranks: wte's 1024 and the 248 others split unevenly (342/341/341,
     * 83/83/82) */
    cfg.batch = 3;
    for (int d = 0; d < 3; d++) {
        char label[64];
        snprintf(label, sizeof label, "1x1x1x3 rank d=%d (uneven)", d);
        expect_data(want, 3, d);
        run(label, &cfg, (ff_dims){1, 1, 1, 3}, (ff_dims){0, 0, 0, d}, want);
    }
    /* the cross-entropy's all-gather on Gx = 4 (4 heads so they divide):
     * m = B T = 12 rows, each rank contributes count 3m = 36 and the ring
     * passes on Gx - 1 = 3 such pieces: 108 floats = 432 B each way; with
     * Gz = 1 it is the step's only all-gather */
    {
        ff_plan_config c4;
        base_config(&c4);
        c4.model.heads = 4;
        ff_plan_coll got[FF_PLAN_NGROUPS][FF_NCOLL];
        char err[256];
        int rc = ff_plan_traffic(&c4, (ff_dims){4, 1, 1, 1}, (ff_dims){2, 0, 0, 0}, got, err,
                                 sizeof err);
        CHECK(rc == FF_OK, "4x1x1x1: %s", err);
        const ff_plan_coll *ag = &got[FF_GROUP_X][FF_COLL_ALLGATHER];
        CHECK(rc == FF_OK && ag->calls == 1 && ag->bytes_sent == 432 && ag->bytes_recv == 432,
              "4x1x1x1 X all-gather: %llu calls, %llu B sent, %llu B received; by hand 1, 432, "
              "432",
              (unsigned long long)ag->calls, (unsigned long long)ag->bytes_sent,
              (unsigned long long)ag->bytes_recv);
        printf("  %-34s %-5s %-3s %3d calls %7d B sent %7d B received\n", "4x1x1x1 rank x=2", "X",
               "AG", 1, 432, 432);
    }

    /* the serial grid communicates nothing */
    memset(want, 0, sizeof want);
    run("1x1x1x1", &cfg, (ff_dims){1, 1, 1, 1}, (ff_dims){0, 0, 0, 0}, want);

    /* what the ring sends on three ranks, by hand: chunks of 1024 are
     * 342, 341, 341; rank 1 sends all but chunks 1 and 2 twice... */
    long s, v;
    ring_ar(1024, 3, 1, &s, &v);
    CHECK(s == 2048 - 341 - 341 && v == 2048 - 342 - 341, "ring on 3: sent %ld recv %ld", s, v);
}

/* The planner predicts the collective layer's choice: with the model below,
 * between nodes (alpha 1 us, 500 MB/s, additions free) an all-reduce of n
 * floats on 4 ranks costs
 *   ring 6 (alpha + n/beta) (blocks of 4n/4 bytes); recursive halving and
 *   doubling (4 divides n) 4 alpha + 6n/beta; rec-whole 2 (alpha + 4n/beta)
 * so rec-whole wins below n = alpha beta = 500 (248 and 1; not 768, 1024;
 * a count that 4 does not divide leaves the ring and rec-whole, which
 * wins below n = 2 alpha beta = 1000: 1); on 3 ranks ring 4 (alpha + 4n/3/beta), rec-whole 3 (alpha
 * + 4n/beta) (one exchange and the fold's two), so below n = 75 (1; not 248). Within a node alpha
 * is 0, and rec-whole never wins. So one node of 4 gives the ring's volumes and nodes of one rank
 * rec-whole's. */
static void test_rec_whole(void)
{
    printf("rec-whole predicted where the collective layer picks it\n");
    ff_plan_config cfg;
    expect want[FF_PLAN_NGROUPS][FF_NCOLL];
    base_config(&cfg);
    cfg.coll.alpha_intra_s = 0, cfg.coll.beta_intra_Bps = 5e8;
    cfg.coll.alpha_inter_s = 1e-6, cfg.coll.beta_inter_Bps = 5e8;
    cfg.coll.reduce_Bps = 0;
    cfg.coll.small_max_intra_B = cfg.coll.small_max_inter_B = 0;
    for (int gd = 4; gd >= 3; gd--) {
        cfg.batch = gd;
        for (int d = 0; d < gd; d++) {
            char label[64];
            cfg.machine.ranks_per_node = 4;
            snprintf(label, sizeof label, "1x1x1x%d d=%d, one node", gd, d);
            expect_data(want, gd, d);
            run(label, &cfg, (ff_dims){1, 1, 1, gd}, (ff_dims){0, 0, 0, d}, want);
            cfg.machine.ranks_per_node = 1;
            snprintf(label, sizeof label, "1x1x1x%d d=%d, %d nodes", gd, d, gd);
            expect_data_whole(want, gd, d);
            run(label, &cfg, (ff_dims){1, 1, 1, gd}, (ff_dims){0, 0, 0, d}, want);
        }
    }
    /* the planner applies the default rule (strict_volume) whatever the
     * configuration says, as the run does unless FF_STRICT_VOLUME=0: a pick
     * of rec, which the rule refuses on 3 ranks, leaves the model's choices */
    cfg.batch = 3;
    cfg.machine.ranks_per_node = 1;
    cfg.coll.strict_volume = 0;
    cfg.coll.n_picks = 1;
    cfg.coll.picks[0] = (ff_coll_pick_rule){FF_COLL_ALLREDUCE, 3, 1, 0, 1e12, FF_ALGO_REC};
    for (int d = 0; d < 3; d++) {
        char label[80];
        snprintf(label, sizeof label, "1x1x1x3 d=%d, 3 nodes, strict_volume 0, a pick of rec", d);
        expect_data_whole(want, 3, d);
        run(label, &cfg, (ff_dims){1, 1, 1, 3}, (ff_dims){0, 0, 0, d}, want);
    }
    cfg.coll.strict_volume = 1, cfg.coll.n_picks = 0;
    /* the time follows the choice, on the machine's link (alpha, beta):
     * rank 0's norm, 1 float on 4 ranks, 2 (alpha + 4/beta) as rec-whole,
     * 6 (alpha + 4/beta) as the ring (chunks of 1) */
    cfg.batch = 4;
    cfg.machine.ranks_per_node = 1;
    ff_plan_result whole, ring;
    char err[256];
    int rc = ff_plan_evaluate(&cfg, (ff_dims){1, 1, 1, 4}, &whole, err, sizeof err);
    cfg.coll.alpha_inter_s = 0;
    rc |= ff_plan_evaluate(&cfg, (ff_dims){1, 1, 1, 4}, &ring, err, sizeof err);
    CHECK(rc == FF_OK, "evaluate: %s", err);
    const ff_plan_link *l = &whole.link[FF_GROUP_WORLD];
    double tw = whole.coll[FF_GROUP_WORLD][FF_COLL_ALLREDUCE].time_s,
           tr = ring.coll[FF_GROUP_WORLD][FF_COLL_ALLREDUCE].time_s;
    printf("  WORLD all-reduce time: %.3g us with rec-whole's choice, %.3g us with the ring\n",
           tw * 1e6, tr * 1e6);
    CHECK(fabs(tw - 2 * (l->alpha_s + 4 / l->beta_Bps)) <= 1e-12 * tw &&
              fabs(tr - 6 * (l->alpha_s + 4 / l->beta_Bps)) <= 1e-12 * tr,
          "norm time %g and %g, by hand %g and %g", tw, tr, 2 * (l->alpha_s + 4 / l->beta_Bps),
          6 * (l->alpha_s + 4 / l->beta_Bps));
    CHECK(whole.coll[FF_GROUP_WORLD][FF_COLL_ALLREDUCE].bytes_sent == 8 &&
              ring.coll[FF_GROUP_WORLD][FF_COLL_ALLREDUCE].bytes_sent == 4,
          "rank 0's norm: %llu and %llu B sent, by hand 8 (rec-whole) and 4 (ring)",
          (unsigned long long)whole.coll[FF_GROUP_WORLD][FF_COLL_ALLREDUCE].bytes_sent,
          (unsigned long long)ring.coll[FF_GROUP_WORLD][FF_COLL_ALLREDUCE].bytes_sent);
}

static void expect_reject(ff_plan_config *cfg, ff_dims g, const char *needle)
{
    ff_plan_result r;
    char err[256];
    int rc = ff_plan_evaluate(cfg, g, &r, err, sizeof err);
    CHECK(rc == FF_OK, "%dx%dx%dx%d: %s", g.x, g.y, g.z, g.d, err);
    CHECK(r.rejected && strstr(r.reason, needle), "%dx%dx%dx%d: rejected %d '%s', want '%s'", g.x,
          g.y, g.z, g.d, r.rejected, r.reason, needle);
    printf("  %dx%dx%dx%d rejected: %s\n", g.x, g.y, g.z, g.d, r.reason);
}

static void test_rejections(void)
{
    ff_plan_config cfg;
    base_config(&cfg);
    printf("rejections\n");
    expect_reject(&cfg, (ff_dims){3, 1, 1, 1}, "hidden size 8 does not divide over Gx = 3");
    expect_reject(&cfg, (ff_dims){3, 1, 1, 1}, "the 2 heads do not divide over Gx = 3");
    expect_reject(&cfg, (ff_dims){3, 1, 1, 1}, "padded vocabulary 128 does not divide over Gx = 3");
    expect_reject(&cfg, (ff_dims){1, 3, 1, 1}, "hidden size 8 does not divide over Gy = 3");
    expect_reject(&cfg, (ff_dims){1, 1, 1, 8}, "batch 4 does not divide over Gz*Gd = 8");
    expect_reject(&cfg, (ff_dims){4, 1, 1, 1}, "the 2 heads do not divide over Gx = 4");
    cfg.batch = 6;
    /* Gz = 3: QKV block 3*64 = 192 splits, the projection's 64 does not */
    expect_reject(&cfg, (ff_dims){1, 1, 3, 1},
                  "the attention projection weight block of 64 elements does not split into "
                  "Gz = 3 pieces");
    cfg.batch = 4;
    cfg.micro_batches = 3;
    expect_reject(&cfg, (ff_dims){1, 1, 1, 2}, "the 2 sequences per rank do not split into 3");
    cfg.micro_batches = 1;
    cfg.machine.memory_bytes = 1000;
    expect_reject(&cfg, (ff_dims){1, 1, 1, 1}, "GiB available");
    cfg.checkpoint = FF_PLAN_AUTO;
    expect_reject(&cfg, (ff_dims){1, 1, 1, 1}, "with activation checkpointing");

    /* errors (not rejections): a bad configuration */
    ff_plan_result r;
    char err[256] = "";
    cfg.seq = 0;
    CHECK(ff_plan_evaluate(&cfg, (ff_dims){1, 1, 1, 1}, &r, err, sizeof err) == FF_EINVAL &&
              strstr(err, "sequence length 0"),
          "seq 0: '%s'", err);
    base_config(&cfg);
    CHECK(ff_plan_evaluate(&cfg, (ff_dims){0, 1, 1, 1}, &r, err, sizeof err) == FF_EGRID &&
              strstr(err, "positive"),
          "grid 0: '%s'", err);
    cfg.model.heads = 3;
    CHECK(ff_plan_evaluate(&cfg, (ff_dims){1, 1, 1, 1}, &r, err, sizeof err) == FF_EINVAL &&
              strstr(err, "not divisible by the 3 heads"),
          "heads 3: '%s'", err);
    ff_model md;
    CHECK(ff_model_preset("gpt2", &md, err, sizeof err) == FF_OK, "gpt2 preset");
    base_config(&cfg);
    cfg.model = md;
    cfg.seq = 2048;
    CHECK(ff_plan_evaluate(&cfg, (ff_dims){1, 1, 1, 1}, &r, err, sizeof err) == FF_EINVAL &&
              strstr(err, "exceeds the 1024 positions"),
          "gpt2 seq 2048: '%s'", err);
    CHECK(ff_model_preset("gpt-99b", &md, err, sizeof err) == FF_EINVAL &&
              strstr(err, "unknown model 'gpt-99b'"),
          "unknown preset: '%s'", err);
    base_config(&cfg);
    ff_plan_coll traffic[FF_PLAN_NGROUPS][FF_NCOLL];
    CHECK(ff_plan_traffic(&cfg, (ff_dims){3, 1, 1, 1}, (ff_dims){0, 0, 0, 0}, traffic, err,
                          sizeof err) == FF_EDIVIDE &&
              strstr(err, "does not divide"),
          "traffic on a grid that does not divide: '%s'", err);
    CHECK(ff_plan_traffic(&cfg, (ff_dims){2, 1, 1, 1}, (ff_dims){2, 0, 0, 0}, traffic, err,
                          sizeof err) == FF_EINVAL &&
              strstr(err, "outside"),
          "coordinates outside the grid: '%s'", err);
}

/* The memory of one rank on 2x2x2x1, without checkpointing (docs/planner.md):
 *   parameters: Z-shards (2*12*64 + 128*8)/8 = 320, others 124 (above): 444
 *     -> 444*4 = 1776 B each for parameters and gradients, 3552 for AdamW
 *   gathered (Gz > 1): wte block 128*8/4 = 256, every block's weights 2 * 768/4 = 384,
 *     gradients before the reduce-scatter: the LM head's 256 and two layers of
 *     4*64/4 = 64: 384 -> (256 + 384 + 384) * 4 = 4096 B
 *   activations, m = 6, 2 sequences of 1 head each per rank:
 *     per block 6 (6*8/2 + 12*8/2 + 4) + 2*1*3*3 = 474; the head 6 (2*8/2 + 2 + 128/2) = 444;
 *     work space 474 + 6*8/2 = 498; stored 2 * 474 -> (948 + 444 + 498) * 4 = 7560 B
 *   total 1776 + 1776 + 3552 + 4096 + 7560 = 18760 B
 * With checkpointing and AG cache 0: stored 2*6*4 + 474 = 522 instead of 948
 * (-1704 B) and gathered weights min(0 + 2, 2) blocks (unchanged here). */
static void test_memory(void)
{
    ff_plan_config cfg;
    ff_plan_result r;
    char err[256];
    base_config(&cfg);
    int rc = ff_plan_evaluate(&cfg, (ff_dims){2, 2, 2, 1}, &r, err, sizeof err);
    CHECK(rc == FF_OK && !r.rejected, "memory: %s %s", err, r.reason);
    printf("memory of 2x2x2x1: %.0f B (hand 18760)\n", r.mem_total);
    CHECK(r.mem_params == 1776 && r.mem_grads == 1776 && r.mem_optimizer == 3552 &&
              r.mem_weight_buffers == 4096 && r.mem_activations == 7560 && r.mem_total == 18760,
          "memory: params %g grads %g opt %g buffers %g acts %g total %g", r.mem_params,
          r.mem_grads, r.mem_optimizer, r.mem_weight_buffers, r.mem_activations, r.mem_total);
    cfg.checkpoint = 1;
    cfg.ag_cache = 0;
    ff_plan_evaluate(&cfg, (ff_dims){2, 2, 2, 1}, &r, err, sizeof err);
    CHECK(r.mem_total == 18760 - 1704, "checkpointing: %g, want %d", r.mem_total, 18760 - 1704);
    /* automatic: exactly 18760 B available fits without checkpointing; one
     * byte less needs it */
    cfg.checkpoint = FF_PLAN_AUTO;
    cfg.ag_cache = FF_PLAN_AUTO;
    cfg.machine.memory_bytes = 18760;
    ff_plan_evaluate(&cfg, (ff_dims){2, 2, 2, 1}, &r, err, sizeof err);
    CHECK(!r.rejected && r.checkpoint == 0, "18760 B: checkpoint %d", r.checkpoint);
    cfg.machine.memory_bytes = 18759;
    ff_plan_evaluate(&cfg, (ff_dims){2, 2, 2, 1}, &r, err, sizeof err);
    CHECK(!r.rejected && r.checkpoint == 1 && r.ag_cache == 2, "18759 B: checkpoint %d cache %d",
          r.checkpoint, r.ag_cache);
    /* L = 4 blocks, checkpointing: 2 blocks' gathered weights (the recompute
     * and the prefetch) are counted at cache 0, and each further cached block
     * adds its 12 C^2/(Gx Gy) = 192 floats = 768 B; a budget of the cache-0
     * total plus 1.5 blocks caches 1 */
    cfg.model.layers = 4;
    cfg.checkpoint = 1;
    cfg.ag_cache = 0;
    cfg.machine.memory_bytes = 1e9;
    ff_plan_evaluate(&cfg, (ff_dims){2, 2, 2, 1}, &r, err, sizeof err);
    double base = r.mem_total;
    cfg.ag_cache = FF_PLAN_AUTO;
    cfg.machine.memory_bytes = base + 1.5 * 768;
    ff_plan_evaluate(&cfg, (ff_dims){2, 2, 2, 1}, &r, err, sizeof err);
    CHECK(!r.rejected && r.ag_cache == 1 && r.mem_total == base + 768,
          "L=4: cache %d, memory %g (cache 0: %g)", r.ag_cache, r.mem_total, base);
    cfg.machine.memory_bytes = base + 2 * 768;
    ff_plan_evaluate(&cfg, (ff_dims){2, 2, 2, 1}, &r, err, sizeof err);
    CHECK(!r.rejected && r.ag_cache == 4 && r.mem_total == base + 2 * 768,
          "L=4, two blocks of room: cache %d (all four: the last two are held anyway)", r.ag_cache);
    /* without checkpointing the AG cache counts the same way: every block
     * (automatic) holds 4 blocks' gathered weights, none holds 2 (the block
     * run backward and the next one) */
    cfg.checkpoint = 0;
    cfg.ag_cache = FF_PLAN_AUTO;
    cfg.machine.memory_bytes = 1e9;
    ff_plan_evaluate(&cfg, (ff_dims){2, 2, 2, 1}, &r, err, sizeof err);
    double all = r.mem_total;
    cfg.ag_cache = 0;
    ff_plan_evaluate(&cfg, (ff_dims){2, 2, 2, 1}, &r, err, sizeof err);
    CHECK(!r.rejected && r.ag_cache == 0 && r.mem_total == all - 2 * 768,
          "L=4 without checkpointing: cache 0 needs %g, every block %g (want 1536 B less)",
          r.mem_total, all);
}

/* A mixture of experts: the small model with E = 4 experts in block 1 (of
 * 2), top-1, capacity factor 1.25 (ceil(1.25 * 3 / 4) = 1 token per expert
 * and sequence), on 1x1x1x4 (one sequence per rank), by hand:
 *   Z-sharded: wte 128*8 = 1024, block 0 12*64 = 768, block 1's attention
 *     4*64 = 256 and its el = E/Ge experts' 8*64 = 512 each;
 *   others: block 0 104 (above), block 1 5*8 + 3*8 (no MLP biases) + the
 *     router 4*8 = 96, the experts' biases el*(8 + 32), the final LayerNorm
 *     16, 3 positions 24;
 *   Ge = 4 (el 1): 1024 + 768 + 256 + 512 + 104 + 96 + 40 + 16 + 24 = 2840
 *     parameters, 4 B each for values and gradients, 8 for AdamW; Ge = 1
 *     (el 4): + 3*512 + 3*40 = 4496, which is also the whole model's count
 *     (ff_model_params), and with top-1 the 6 N of the FLOPs counts one
 *     expert: 4496 - 24 - 3*552 = 2816 (ff_model_matmul_params).
 *   Traffic of rank 0 with Ge = 4: R = 1 row per block of the all-to-all,
 *     C = 8 columns: per exchange (4 - 1) * 8 floats = 96 B each way; the
 *     forward sends the counts (3 * 1 float = 12 B) and exchanges twice,
 *     the backward twice: 5 calls, 396 B. D: the wte bucket and each
 *     block's (the experts' go over EDP, of one rank here): 3 calls; with
 *     Ge = 1 also block 1's experts' bucket and their biases over D: 5. */
static void test_moe(void)
{
    ff_plan_config cfg;
    ff_plan_result r;
    char err[256];
    base_config(&cfg);
    ff_model_moe(&cfg.model, 4);
    CHECK(ff_model_params(&cfg.model, 3) == 4496 && ff_model_matmul_params(&cfg.model) == 2816,
          "MoE parameters %lld, in the FLOPs %lld; by hand 4496, 2816",
          (long long)ff_model_params(&cfg.model, 3), (long long)ff_model_matmul_params(&cfg.model));
    const ff_dims g = {1, 1, 1, 4};
    const struct {
        int ge;
        double params;
        uint64_t d_calls;
    } want[] = {{4, 2840, 3}, {1, 4496, 5}};
    for (int i = 0; i < 2; i++) {
        cfg.expert_parallel = want[i].ge;
        int rc = ff_plan_evaluate(&cfg, g, &r, err, sizeof err);
        CHECK(rc == FF_OK && !r.rejected, "MoE Ge %d: %s %s", want[i].ge, err, r.reason);
        printf("MoE on 1x1x1x4, Ge %d: parameters %.0f B (hand %.0f)\n", want[i].ge, r.mem_params,
               4 * want[i].params);
        CHECK(r.mem_params == 4 * want[i].params && r.mem_grads == 4 * want[i].params &&
                  r.mem_optimizer == 8 * want[i].params && r.expert_parallel == want[i].ge,
              "MoE Ge %d: params %g grads %g opt %g", want[i].ge, r.mem_params, r.mem_grads,
              r.mem_optimizer);
        ff_plan_coll t[FF_PLAN_NGROUPS][FF_NCOLL];
        rc = ff_plan_traffic(&cfg, g, (ff_dims){0, 0, 0, 0}, t, err, sizeof err);
        const ff_plan_coll *a2a = &t[FF_PLAN_GROUP_EP][FF_COLL_ALLTOALL];
        const ff_plan_coll *d = &t[FF_GROUP_D][FF_COLL_ALLREDUCE];
        uint64_t a2a_calls = want[i].ge == 4 ? 5 : 0, a2a_bytes = want[i].ge == 4 ? 396 : 0;
        printf("  EP all-to-all %llu calls %llu B (hand %llu, %llu); D all-reduce %llu calls "
               "(hand %llu)\n",
               (unsigned long long)a2a->calls, (unsigned long long)a2a->bytes_sent,
               (unsigned long long)a2a_calls, (unsigned long long)a2a_bytes,
               (unsigned long long)d->calls, (unsigned long long)want[i].d_calls);
        CHECK(rc == FF_OK && a2a->calls == a2a_calls && a2a->bytes_sent == a2a_bytes &&
                  a2a->bytes_recv == a2a_bytes && d->calls == want[i].d_calls &&
                  t[FF_PLAN_GROUP_EDP][FF_COLL_ALLREDUCE].calls == 0,
              "MoE Ge %d traffic: %s", want[i].ge, err);
    }
    /* CAC keeps what the checkpointed blocks' collectives produced: more
     * activations than checkpointing alone, fewer than none (each block's
     * LayerNorm outputs, attention and GELU are recomputed, one set) */
    double act[3];
    for (int i = 0; i < 3; i++) {
        cfg.checkpoint = i > 0, cfg.cac = i == 2;
        ff_plan_evaluate(&cfg, g, &r, err, sizeof err);
        act[i] = r.mem_activations;
    }
    printf("MoE activations: no checkpointing %.0f B, checkpointing %.0f B, with CAC %.0f B\n",
           act[0], act[1], act[2]);
    CHECK(act[1] < act[2] && act[2] < act[0], "CAC's activations %g, not between %g and %g", act[2],
          act[1], act[0]);
    cfg.checkpoint = FF_PLAN_AUTO, cfg.cac = 0;
    /* an expert with no rows: with T = 3 and top-1, balanced routing gives
     * experts 0-2 one token of each sequence and expert 3 none; its X and
     * Y all-reduces have no elements, which the collective layer neither
     * runs nor counts. On 2x2x1x1 that is, per micro-batch, the down
     * layer's forward (X) and the up layer's (Y), and their backward's
     * input gradients (Y, X): two calls fewer on each of X and Y than with
     * T = 4, where every expert gets a token. */
    cfg.expert_parallel = 1;
    cfg.batch = 2;
    cfg.model.max_seq = 4;
    ff_plan_coll t3[FF_PLAN_NGROUPS][FF_NCOLL], t4[FF_PLAN_NGROUPS][FF_NCOLL];
    const ff_dims g22 = {2, 2, 1, 1};
    int rc3 = ff_plan_traffic(&cfg, g22, (ff_dims){0, 0, 0, 0}, t3, err, sizeof err);
    cfg.seq = 4;
    int rc4 = ff_plan_traffic(&cfg, g22, (ff_dims){0, 0, 0, 0}, t4, err, sizeof err);
    for (int k = FF_GROUP_X; k <= FF_GROUP_Y; k++) {
        uint64_t c3 = t3[k][FF_COLL_ALLREDUCE].calls, c4 = t4[k][FF_COLL_ALLREDUCE].calls;
        printf("MoE, an expert without rows on 2x2x1x1: %s all-reduces %llu (T = 3), %llu (T = 4, "
               "none empty); want 2 fewer\n",
               ff_plan_group_name(k), (unsigned long long)c3, (unsigned long long)c4);
        CHECK(rc3 == FF_OK && rc4 == FF_OK && c3 + 2 == c4, "empty expert: %s %llu vs %llu %s",
              ff_plan_group_name(k), (unsigned long long)c3, (unsigned long long)c4, err);
    }
    base_config(&cfg);
    ff_model_moe(&cfg.model, 4);
    /* refusals */
    cfg.expert_parallel = 3;
    ff_plan_evaluate(&cfg, g, &r, err, sizeof err);
    CHECK(r.rejected && strstr(r.reason, "expert parallelism 3 does not divide Gd = 4") &&
              strstr(r.reason, "does not divide the 4 experts"),
          "Ge 3: '%s'", r.reason);
    cfg.expert_parallel = 2;
    cfg.stages = 2;
    CHECK(ff_plan_evaluate(&cfg, g, &r, err, sizeof err) == FF_EINVAL &&
              strstr(err, "pipeline stages"),
          "MoE with stages: '%s'", err);
    cfg.stages = 1;
    cfg.model.experts = 0;
    CHECK(ff_plan_evaluate(&cfg, g, &r, err, sizeof err) == FF_EINVAL &&
              strstr(err, "needs a model with experts"),
          "Ge 2 without experts: '%s'", err);
}

/* Automatic precision: the machine's with the full cost model (a GPU
 * preset's bf16-mixed, this machine's fp32), fp32 with the others; an
 * explicit bf16-mixed is refused by the others. */
static void test_precision(void)
{
    ff_plan_config cfg;
    ff_plan_result a, b;
    char err[256];
    base_config(&cfg);
    CHECK(cfg.precision == FF_PLAN_AUTO && ff_plan_precision(&cfg) == FF_PLAN_FP32,
          "the default on this machine: %d", ff_plan_precision(&cfg));
    ff_profile_preset("perlmutter", &cfg.machine, NULL, 0);
    CHECK(ff_plan_precision(&cfg) == FF_PLAN_BF16_MIXED, "perlmutter, full: %d",
          ff_plan_precision(&cfg));
    int rc1 = ff_plan_evaluate(&cfg, (ff_dims){1, 1, 1, 1}, &a, err, sizeof err);
    cfg.precision = FF_PLAN_BF16_MIXED;
    int rc2 = ff_plan_evaluate(&cfg, (ff_dims){1, 1, 1, 1}, &b, err, sizeof err);
    CHECK(rc1 == FF_OK && rc2 == FF_OK && !a.rejected && a.mem_total == b.mem_total &&
              a.step_s == b.step_s,
          "perlmutter: automatic %g B %g s, bf16-mixed %g B %g s", a.mem_total, a.step_s,
          b.mem_total, b.step_s);
    cfg.cost = FF_COST_PAPER;
    CHECK(ff_plan_evaluate(&cfg, (ff_dims){1, 1, 1, 1}, &b, err, sizeof err) == FF_EINVAL &&
              strstr(err, "bf16-mixed precision needs the full cost model"),
          "bf16-mixed with the paper's model: '%s'", err);
    cfg.precision = FF_PLAN_AUTO;
    CHECK(ff_plan_precision(&cfg) == FF_PLAN_FP32 &&
              ff_plan_evaluate(&cfg, (ff_dims){1, 1, 1, 1}, &b, err, sizeof err) == FF_OK,
          "automatic with the paper's model: %s", err);
    printf("precision: automatic is bf16-mixed on perlmutter (full), fp32 with --cost paper and "
           "on this machine\n");
}

int main(void)
{
    test_precision();
    test_moe();
    test_traffic();
    test_rec_whole();
    test_rejections();
    test_memory();
    return test_finish("test_plan_bytes");
}
