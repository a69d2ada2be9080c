/* The profile fit (ff_coll_fit) and the selector's use of its two regimes.
 *
 * Part 1, rank 0, no communication: samples shaped like `bench profile`'s
 * (ring all-gather, reduce-scatter, all-reduce on p = 2..4 ranks, blocks of
 * 1 KiB .. 1 MiB by factors of 2) are generated from known parameters, with
 * and without a deterministic multiplicative noise, and the fit must give
 * the parameters back: exactly generated data to 1e-6, noisy data to the
 * tolerances printed with each check; data from one line must not be split,
 * data from two regimes must be split at the generator's threshold.
 *
 * Part 2, every rank (run with FF_RANKS_PER_NODE=1: each rank a node): with
 * a two-regime inter-node model set on the context, ff_coll_predict of the
 * ring and of recursive doubling must equal the step sums written out here
 * from the model's definition (docs/collectives.md), and ff_coll_choose must
 * pick the ring where recursive doubling's one double-size message crosses
 * the threshold and recursive doubling where it does not. For all-reduce,
 * the same for rec-whole (2 steps of the whole vector): AUTO must pick the
 * fastest of the three, with strict_volume (rec-whole's bytes are the
 * planner's to predict; recursive halving moves the ring's, 4 dividing the
 * counts) and without; on a count 4 does not divide, strict_volume leaves
 * recursive halving out (the ring instead), and without it AUTO takes it.
 *
 * Part 3, every rank: measured picks (ff_coll_model.picks, `fourfold bench
 * tune`) read from a profile, applied only to their collective, layout and
 * size range (bytes on the wire) and where strict_volume allows them, each
 * case one where the model alone would choose differently; malformed picks
 * refused with a message. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "test_util.h"

typedef struct {
    double alpha, beta, small_max, alpha_small, beta_small, reduce;
} truth;

static double gen_time(const truth *t, const ff_coll_sample *s)
{
    int small = t->small_max > 0 && s->msg_bytes <= t->small_max;
    double a = small ? t->alpha_small : t->alpha, b = small ? t->beta_small : t->beta;
    return s->steps * (a + s->msg_bytes / b) + (t->reduce > 0 ? s->add_bytes / t->reduce : 0);
}

/* A fixed pseudo-random factor in [1 - amp, 1 + amp] (xorshift). */
static double noise(unsigned *state, double amp)
{
    unsigned x = *state;
    x ^= x << 13;
    x ^= x >> 17;
    x ^= x << 5;
    *state = x;
    return 1 + amp * (2.0 * (x / 4294967296.0) - 1);
}

static int make_samples(const truth *t, double amp, unsigned seed, ff_coll_sample *s)
{
    int n = 0;
    unsigned state = seed;
    for (int p = 2; p <= 4; p++)
        for (int c = 0; c < 3; c++) /* AG, RS, AR as bench profile times them */
            for (double b = 1024; b <= 1048576; b *= 2) {
                ff_coll_sample *x = &s[n++];
                x->steps = (c == 2 ? 2.0 : 1.0) * (p - 1);
                x->msg_bytes = b;
                x->add_bytes = c == 0 ? 0 : (p - 1) * b;
                x->t_s = gen_time(t, x) * noise(&state, amp);
            }
    return n;
}

static int close_rel(double got, double want, double tol)
{
    return fabs(got - want) <= tol * fabs(want);
}

static void check_fit(const char *what, const ff_coll_fit_result *f, const truth *t, double tol)
{
    printf("  %-34s alpha %.4g beta %.4g small_max %.0f alpha_s %.4g beta_s %.4g reduce %.4g "
           "(RMS %.2f%%, tolerance %g)\n",
           what, f->alpha_s, f->beta_Bps, f->small_max_B, f->alpha_small_s, f->beta_small_Bps,
           f->reduce_Bps, 100 * f->rms_rel, tol);
    CHECK(f->ok, "%s: no fit", what);
    CHECK(f->small_max_B == t->small_max, "%s: threshold %.0f, generated %.0f", what,
          f->small_max_B, t->small_max);
    CHECK(close_rel(f->alpha_s, t->alpha, tol), "%s: alpha %.6g, generated %.6g", what, f->alpha_s,
          t->alpha);
    CHECK(close_rel(f->beta_Bps, t->beta, tol), "%s: beta %.6g, generated %.6g", what, f->beta_Bps,
          t->beta);
    if (t->small_max > 0) {
        CHECK(close_rel(f->alpha_small_s, t->alpha_small, tol), "%s: alpha_small %.6g, gen %.6g",
              what, f->alpha_small_s, t->alpha_small);
        CHECK(close_rel(f->beta_small_Bps, t->beta_small, tol), "%s: beta_small %.6g, gen %.6g",
              what, f->beta_small_Bps, t->beta_small);
    }
    if (t->reduce > 0)
        CHECK(close_rel(f->reduce_Bps, t->reduce, tol), "%s: reduce %.6g, generated %.6g", what,
              f->reduce_Bps, t->reduce);
}

static void part_fit(void)
{
    ff_coll_sample s[3 * 3 * 11];
    ff_coll_fit_result f;
    /* one line: shared memory-like, additions as costly as copies */
    truth one = {3e-6, 3e9, 0, 0, 0, 6e9};
    int n = make_samples(&one, 0, 1, s);
    ff_coll_fit(s, n, 1, &f);
    check_fit("one regime, exact", &f, &one, 1e-6);
    CHECK(f.rms_rel < 1e-9, "exact data fitted with RMS %g", f.rms_rel);
    /* noisy: the split must not chase the noise, for any of these seeds */
    for (unsigned seed = 1; seed <= 10; seed++) {
        char what[64];
        snprintf(what, sizeof what, "one regime, +-10%% noise, seed %u", seed);
        make_samples(&one, 0.10, seed * 7919u, s);
        ff_coll_fit(s, n, 1, &f);
        check_fit(what, &f, &one, 0.2);
    }
    /* two regimes: the emulated 1 Gbit/s link's shape (docs/coll-bench.md) */
    truth two = {2e-4, 8e7, 16384, 3e-5, 6e8, 0};
    make_samples(&two, 0, 2, s);
    ff_coll_fit(s, n, 1, &f);
    check_fit("two regimes, exact", &f, &two, 1e-6);
    for (unsigned seed = 1; seed <= 10; seed++) {
        char what[64];
        snprintf(what, sizeof what, "two regimes, +-10%% noise, seed %u", seed);
        make_samples(&two, 0.10, seed * 104729u, s);
        ff_coll_fit(s, n, 1, &f);
        check_fit(what, &f, &two, 0.2);
    }
    /* the large messages' alpha is never below the small ones': on noisy
     * data whose large alpha is a sliver of the large messages' time (an
     * unconstrained fit puts it below the small one, or at 0, for these
     * seeds), and on exact data generated with the order broken, where the
     * fit must tie them */
    truth sliver = {1e-6, 8e7, 16384, 3e-5, 6e8, 0};
    for (unsigned seed = 1; seed <= 10; seed++) {
        make_samples(&sliver, 0.10, seed * 7u, s);
        ff_coll_fit(s, n, 1, &f);
        CHECK(f.ok && (f.small_max_B == 0 || f.alpha_s >= f.alpha_small_s),
              "large alpha 1 us, 10%% noise, seed %u: large alpha %.6g below small alpha %.6g",
              seed, f.alpha_s, f.alpha_small_s);
    }
    truth broken = {1e-5, 8e7, 16384, 6e-5, 6e8, 0};
    make_samples(&broken, 0, 3, s);
    ff_coll_fit(s, n, 1, &f);
    printf("  large alpha generated below small: alpha %.4g alpha_small %.4g small_max %.0f "
           "RMS %.1f%%\n",
           f.alpha_s, f.alpha_small_s, f.small_max_B, 100 * f.rms_rel);
    CHECK(f.ok && f.small_max_B > 0 && f.alpha_s == f.alpha_small_s,
          "large alpha generated below small: fitted %.6g and %.6g, not tied", f.alpha_s,
          f.alpha_small_s);
    /* refusing a second regime when asked for one */
    make_samples(&two, 0, 2, s);
    ff_coll_fit(s, n, 0, &f);
    printf("  two regimes fitted with one: RMS %.1f%%\n", 100 * f.rms_rel);
    CHECK(f.ok && f.small_max_B == 0, "two_regimes = 0 still split at %.0f", f.small_max_B);
    CHECK(f.rms_rel > 0.2, "one line fits two regimes with RMS %g: the test data are too easy",
          f.rms_rel);
    /* the prediction is the generator's formula */
    make_samples(&two, 0, 2, s);
    ff_coll_fit(s, n, 1, &f);
    double worst = 0;
    for (int i = 0; i < n; i++) {
        double d = fabs(ff_coll_fit_predict(&f, &s[i]) - s[i].t_s) / s[i].t_s;
        worst = d > worst ? d : worst;
    }
    CHECK(worst < 1e-6, "ff_coll_fit_predict differs from the generator by %g", worst);
    /* too few or unusable samples */
    for (int i = 0; i < n; i++)
        s[i].t_s = -1;
    ff_coll_fit(s, n, 1, &f);
    CHECK(!f.ok && f.n == 0, "a fit from no usable sample");
    ff_coll_fit(s, 0, 1, &f);
    CHECK(!f.ok, "a fit from zero samples");
}

/* Part 2: the selector with a two-regime inter-node model. */
static double step(const ff_coll_model *m, double bytes)
{
    /* every rank is a node: one stream per link in every step */
    if (bytes <= m->small_max_inter_B)
        return m->alpha_inter_small_s + bytes / m->beta_inter_small_Bps;
    return m->alpha_inter_s + bytes / m->beta_inter_Bps;
}

static void part_select(ff_ctx *ctx)
{
    ff_group *g = NULL;
    int p = ff_ctx_size(ctx);
    if (ff_group_create(ctx, ff_ctx_comm(ctx), "all", &g) != FF_OK) {
        CHECK(0, "ff_group_create: %s", ff_ctx_error(ctx));
        return;
    }
    int nodes, per_node;
    ff_group_topology(g, &nodes, &per_node);
    CHECK(nodes == p && per_node == 1, "run with FF_RANKS_PER_NODE=1: %d nodes of %d", nodes,
          per_node);
    ff_coll_model m;
    ff_coll_model_default(&m);
    m.reduce_Bps = 0; /* the step sums below leave additions out */
    m.alpha_inter_s = 2e-4, m.beta_inter_Bps = 8e7;
    m.small_max_inter_B = 16384, m.alpha_inter_small_s = 3e-5, m.beta_inter_small_Bps = 6e8;
    CHECK(ff_ctx_set_coll_model(ctx, &m) == FF_OK, "set model: %s", ff_ctx_error(ctx));
    ff_coll_model bad = m;
    bad.beta_inter_small_Bps = 0;
    CHECK(ff_ctx_set_coll_model(ctx, &bad) == FF_EINVAL, "a zero small beta was accepted");
    if (p != 4) {
        CHECK(0, "part 2 needs 4 ranks, has %d", p);
        ff_group_destroy(g);
        return;
    }
    /* all-gather blocks around the threshold: 16 KiB (rec's second message
     * 32 KiB is large), 8 KiB (both small), 256 KiB (both large) */
    static const size_t blocks_B[] = {4096, 8192, 16384, 65536, 262144};
    for (size_t i = 0; i < sizeof blocks_B / sizeof blocks_B[0]; i++) {
        double B = (double)blocks_B[i];
        size_t count = blocks_B[i] / 4;
        double ring = 3 * step(&m, B), rec = step(&m, B) + step(&m, 2 * B);
        double got_ring = ff_coll_predict(g, FF_COLL_ALLGATHER, FF_ALGO_RING, count, FF_WIRE_FP32);
        double got_rec = ff_coll_predict(g, FF_COLL_ALLGATHER, FF_ALGO_REC, count, FF_WIRE_FP32);
        ff_algo pick = ff_coll_choose(g, FF_COLL_ALLGATHER, count, FF_WIRE_FP32);
        ff_algo want = rec < ring ? FF_ALGO_REC : FF_ALGO_RING;
        if (ff_ctx_rank(ctx) == 0)
            printf("  all-gather block %7zu B on 4 nodes: ring %.1f us (model %.1f), rec %.1f us "
                   "(model %.1f), picks %s\n",
                   blocks_B[i], ring * 1e6, got_ring * 1e6, rec * 1e6, got_rec * 1e6,
                   ff_algo_name(pick));
        CHECK(close_rel(got_ring, ring, 1e-12) && close_rel(got_rec, rec, 1e-12),
              "block %zu: predictions %g/%g, expected %g/%g", blocks_B[i], got_ring, got_rec, ring,
              rec);
        CHECK(pick == want, "block %zu: picked %s, expected %s", blocks_B[i], ff_algo_name(pick),
              ff_algo_name(want));
        if (blocks_B[i] == 16384)
            CHECK(pick == FF_ALGO_RING, "16 KiB blocks: rec's 32 KiB message is large, the "
                                        "ring must win here");
        if (blocks_B[i] == 4096)
            CHECK(pick == FF_ALGO_REC, "4 KiB blocks: all small, rec's fewer steps must win");
    }
    /* all-reduce of V bytes: ring 6 steps of V/4; rec halves then doubles
     * (V/2, V/4, V/4, V/2); rec-whole 2 steps of V */
    static const size_t vec_B[] = {4096, 65536, 1 << 20};
    static const ff_algo algo[3] = {FF_ALGO_RING, FF_ALGO_REC, FF_ALGO_REC_WHOLE};
    for (int strict = 1; strict >= 0; strict--) {
        m.strict_volume = strict;
        ff_ctx_set_coll_model(ctx, &m);
        for (size_t i = 0; i < sizeof vec_B / sizeof vec_B[0]; i++) {
            double V = (double)vec_B[i];
            size_t count = vec_B[i] / 4;
            double t[3] = {6 * step(&m, V / 4), 2 * step(&m, V / 4) + 2 * step(&m, V / 2),
                           2 * step(&m, V)};
            int best = 0;
            for (int a = 0; a < 3; a++) {
                double got = ff_coll_predict(g, FF_COLL_ALLREDUCE, algo[a], count, FF_WIRE_FP32);
                CHECK(close_rel(got, t[a], 1e-12), "all-reduce %zu B: %s predicted %g, expected %g",
                      vec_B[i], ff_algo_name(algo[a]), got, t[a]);
                if (t[a] < t[best] * (1 - 1e-9))
                    best = a;
            }
            ff_algo pick = ff_coll_choose(g, FF_COLL_ALLREDUCE, count, FF_WIRE_FP32);
            if (ff_ctx_rank(ctx) == 0)
                printf("  all-reduce %7zu B on 4 nodes, strict_volume %d: ring %.1f us, rec %.1f, "
                       "rec-whole %.1f, picks %s\n",
                       vec_B[i], strict, t[0] * 1e6, t[1] * 1e6, t[2] * 1e6, ff_algo_name(pick));
            CHECK(pick == algo[best], "all-reduce %zu B, strict_volume %d: picked %s, expected %s",
                  vec_B[i], strict, ff_algo_name(pick), ff_algo_name(algo[best]));
        }
    }
    /* a count 4 does not divide: Rabenseifner's bytes differ from the
     * ring's, so strict_volume leaves it out (ring and rec-whole only) */
    size_t odd = (1 << 18) - 1;
    double t_odd[3];
    for (int a = 0; a < 3; a++)
        t_odd[a] = ff_coll_predict(g, FF_COLL_ALLREDUCE, algo[a], odd, FF_WIRE_FP32);
    CHECK(t_odd[1] < t_odd[0] && t_odd[0] < t_odd[2],
          "1 MiB - 4 B: expected rec < ring < rec-whole, model %g %g %g", t_odd[0], t_odd[1],
          t_odd[2]);
    for (int strict = 1; strict >= 0; strict--) {
        m.strict_volume = strict;
        ff_ctx_set_coll_model(ctx, &m);
        ff_algo pick = ff_coll_choose(g, FF_COLL_ALLREDUCE, odd, FF_WIRE_FP32);
        CHECK(pick == (strict ? FF_ALGO_RING : FF_ALGO_REC),
              "all-reduce of %zu floats, strict_volume %d: picked %s", odd, strict,
              ff_algo_name(pick));
    }
    CHECK(ff_coll_choose(g, FF_COLL_ALLREDUCE, 1024, FF_WIRE_FP32) == FF_ALGO_REC_WHOLE,
          "all-reduce 4 KiB, all messages small: rec-whole's 2 steps must win");
    CHECK(ff_coll_choose(g, FF_COLL_ALLREDUCE, 1 << 18, FF_WIRE_FP32) != FF_ALGO_REC_WHOLE,
          "all-reduce 1 MiB: rec-whole's 2 whole vectors (rec: 1.5) must lose");
    /* additions at reduce_Bps: rec-whole adds the whole vector at each of
     * its 2 steps, the ring 3 chunks; and on 3 nodes rec-whole's fold: one
     * exchange plus the fold in and out, 3 steps of V and 2 additions */
    m.reduce_Bps = 1e9;
    ff_ctx_set_coll_model(ctx, &m);
    double V = 65536, want_w = 2 * step(&m, V) + 2 * V / 1e9,
           want_r = 6 * step(&m, V / 4) + 3 * (V / 4) / 1e9;
    double got_w = ff_coll_predict(g, FF_COLL_ALLREDUCE, FF_ALGO_REC_WHOLE, 16384, FF_WIRE_FP32);
    double got_r = ff_coll_predict(g, FF_COLL_ALLREDUCE, FF_ALGO_RING, 16384, FF_WIRE_FP32);
    CHECK(close_rel(got_w, want_w, 1e-12) && close_rel(got_r, want_r, 1e-12),
          "with reduce_Bps: rec-whole %g (expected %g), ring %g (expected %g)", got_w, want_w,
          got_r, want_r);
    MPI_Comm c3;
    int r = ff_ctx_rank(ctx);
    MPI_Comm_split(ff_ctx_comm(ctx), r < 3 ? 0 : MPI_UNDEFINED, r, &c3);
    if (r < 3) {
        ff_group *g3 = NULL;
        CHECK(ff_group_create(ctx, c3, "three", &g3) == FF_OK, "group of 3: %s", ff_ctx_error(ctx));
        double V3 = 12288; /* chunks of 4 KiB */
        double w3 = 3 * step(&m, V3) + 2 * V3 / 1e9, r3 = 4 * step(&m, V3 / 3) + 2 * (V3 / 3) / 1e9;
        double gw3 = ff_coll_predict(g3, FF_COLL_ALLREDUCE, FF_ALGO_REC_WHOLE, 3072, FF_WIRE_FP32);
        double gr3 = ff_coll_predict(g3, FF_COLL_ALLREDUCE, FF_ALGO_RING, 3072, FF_WIRE_FP32);
        CHECK(close_rel(gw3, w3, 1e-12) && close_rel(gr3, r3, 1e-12),
              "3 nodes: rec-whole %g (expected %g), ring %g (expected %g)", gw3, w3, gr3, r3);
        ff_group_destroy(g3);
        MPI_Comm_free(&c3);
    }
    m.reduce_Bps = 0;
    m.strict_volume = 1;
    ff_ctx_set_coll_model(ctx, &m);
    /* direct: one round in which each node's link carries 3 blocks (the
     * regime is the block's); the model prices it but never chooses it,
     * even where it predicts it fastest (only a measured pick runs it) */
    for (size_t i = 0; i < sizeof blocks_B / sizeof blocks_B[0]; i++) {
        double B = (double)blocks_B[i];
        size_t count = blocks_B[i] / 4;
        double want = B <= m.small_max_inter_B
                          ? m.alpha_inter_small_s + 3 * B / m.beta_inter_small_Bps
                          : m.alpha_inter_s + 3 * B / m.beta_inter_Bps;
        double ag = ff_coll_predict(g, FF_COLL_ALLGATHER, FF_ALGO_DIRECT, count, FF_WIRE_FP32);
        double ar = ff_coll_predict(g, FF_COLL_ALLREDUCE, FF_ALGO_DIRECT, 4 * count, FF_WIRE_FP32);
        double ring = ff_coll_predict(g, FF_COLL_ALLGATHER, FF_ALGO_RING, count, FF_WIRE_FP32);
        CHECK(close_rel(ag, want, 1e-12) && close_rel(ar, 2 * want, 1e-12),
              "direct, blocks of %zu B: all-gather %g, all-reduce %g, expected %g and twice it",
              blocks_B[i], ag, ar, want);
        if (B == 4096)
            CHECK(ag < ring, "direct at 4 KiB blocks: %g, not below the ring's %g", ag, ring);
        for (int c = 0; c < 3; c++)
            CHECK(ff_coll_choose(g, (ff_coll)c, c == 2 ? 4 * count : count, FF_WIRE_FP32) !=
                      FF_ALGO_DIRECT,
                  "the model chose direct for %s, blocks of %zu B", ff_coll_name((ff_coll)c),
                  blocks_B[i]);
    }
    /* one regime again: recursive doubling's fewer steps win at 16 KiB */
    m.small_max_inter_B = 0;
    ff_ctx_set_coll_model(ctx, &m);
    CHECK(ff_coll_choose(g, FF_COLL_ALLGATHER, 4096, FF_WIRE_FP32) == FF_ALGO_REC,
          "one regime: the ring was picked at 16 KiB");
    ff_group_destroy(g);
}

/* Writes text to a fresh file in /tmp and reads it as a profile into *m
 * (from the defaults); returns ff_coll_model_read's code, err its message. */
static int read_profile_text(const char *text, ff_coll_model *m, char *err, size_t len)
{
    char path[] = "/tmp/ff_picks_XXXXXX";
    int fd = mkstemp(path);
    FILE *f = fd >= 0 ? fdopen(fd, "w") : NULL;
    if (!f) {
        snprintf(err, len, "cannot create a temporary file");
        return -1;
    }
    fputs(text, f);
    fclose(f);
    ff_coll_model_default(m);
    err[0] = '\0';
    int rc = ff_coll_model_read(path, m, err, len);
    remove(path);
    return rc;
}

/* Part 3: measured picks (ff_coll_model.picks, `fourfold bench tune`). The
 * reader takes them from a profile and refuses malformed ones with a
 * message naming the pick; AUTO runs a pick that covers the call (its
 * collective, the group's layout, min_B < largest buffer <= max_B) where
 * strict_volume allows it, and the model's choice everywhere else. */
static void part_picks(ff_ctx *ctx)
{
    ff_coll_model m;
    char err[512];
    const char *good =
        "{\"format\":\"fourfold-profile\",\"version\":1,\"alpha_inter_s\":2e-4,"
        "\"beta_inter_Bps\":8e7,\"small_max_inter_B\":16384,\"alpha_inter_small_s\":3e-5,"
        "\"beta_inter_small_Bps\":6e8,\n \"picks\":[\n"
        "  {\"coll\":\"allgather\",\"nodes\":4,\"per_node\":1,\"min_B\":32768,"
        "\"max_B\":65536,\"algo\":\"rec\",\"model_algo\":\"ring\",\"sizes\":1},\n"
        "  {\"coll\":\"allreduce\",\"nodes\":2,\"per_node\":2,\"min_B\":0,\"max_B\":1e12,"
        "\"algo\":\"ring\"},\n"
        "  {\"algo\":\"ring\",\"max_B\":1048576,\"min_B\":4096,\"per_node\":1,\"nodes\":4,"
        "\"coll\":\"allreduce\"},\n"
        "  {\"coll\":\"allreduce\",\"nodes\":4,\"per_node\":1,\"min_B\":1048576,"
        "\"max_B\":4194304,\"algo\":\"rec\"},\n"
        "  {\"coll\":\"reduce_scatter\",\"nodes\":4,\"per_node\":1,\"min_B\":0,"
        "\"max_B\":32768,\"algo\":\"direct\"},\n"
        "  {\"coll\":\"allreduce\",\"nodes\":4,\"per_node\":1,\"min_B\":0,"
        "\"max_B\":2048,\"algo\":\"direct\"}]}\n";
    int rc = read_profile_text(good, &m, err, sizeof err);
    CHECK(rc == FF_OK && m.n_picks == 6, "a profile with 6 picks: rc %d, %d picks, %s", rc,
          m.n_picks, err);
    if (rc != FF_OK || m.n_picks != 6)
        return;
    CHECK(m.picks[0].coll == FF_COLL_ALLGATHER && m.picks[0].algo == FF_ALGO_REC &&
              m.picks[0].nodes == 4 && m.picks[0].per_node == 1 && m.picks[0].min_B == 32768 &&
              m.picks[0].max_B == 65536,
          "pick 1 read wrongly");
    CHECK(m.picks[2].coll == FF_COLL_ALLREDUCE && m.picks[2].algo == FF_ALGO_RING &&
              m.picks[2].min_B == 4096 && m.picks[2].max_B == 1048576,
          "pick 3 (keys in another order) read wrongly");
    CHECK(m.alpha_inter_s == 2e-4 && m.small_max_inter_B == 16384, "the model beside the picks");
    m.reduce_Bps = 0, m.strict_volume = 1;
    CHECK(ff_ctx_set_coll_model(ctx, &m) == FF_OK, "set model with picks: %s", ff_ctx_error(ctx));
    ff_group *g = NULL;
    if (ff_group_create(ctx, ff_ctx_comm(ctx), "all", &g) != FF_OK) {
        CHECK(0, "ff_group_create: %s", ff_ctx_error(ctx));
        return;
    }
    /* all-gather on 4 nodes of 1: the model picks the ring for blocks of
     * 16 KiB (part 2); the pick covers largest buffers in (32 KiB, 64 KiB] */
    ff_coll_model none = m;
    none.n_picks = 0;
    struct {
        ff_coll coll;
        size_t count; /* elements: a block for all-gather, the vector for all-reduce */
        int picked;   /* 1: the pick's algorithm, 0: the model's */
        ff_algo algo;
    } cases[] = {
        {FF_COLL_ALLGATHER, 4096, 1, FF_ALGO_REC},          /* 64 KiB: the upper end is in */
        {FF_COLL_ALLGATHER, 2048 + 1, 1, FF_ALGO_REC},      /* 32 KiB + 16 B */
        {FF_COLL_ALLGATHER, 2048, 0, FF_ALGO_RING},         /* 32 KiB: the lower end is out */
        {FF_COLL_ALLGATHER, 4096 + 1, 0, FF_ALGO_RING},     /* above the range */
        {FF_COLL_ALLREDUCE, 1 << 16, 1, FF_ALGO_RING},      /* 256 KiB (the model: rec) */
        {FF_COLL_ALLREDUCE, 1024, 0, FF_ALGO_RING},         /* 4 KiB: the lower end is out */
        {FF_COLL_ALLREDUCE, (1 << 18) + 1, 0, FF_ALGO_REC}, /* 4 does not divide: strict */
        {FF_COLL_REDUCE_SCATTER, 4096, 0, FF_ALGO_RING},    /* 64 KiB: no pick covers it */
        {FF_COLL_REDUCE_SCATTER, 1024, 1, FF_ALGO_DIRECT},  /* 16 KiB: direct */
        {FF_COLL_ALLREDUCE, 512, 1, FF_ALGO_DIRECT},        /* 2 KiB: direct */
        {FF_COLL_ALLREDUCE, 511, 0, FF_ALGO_REC_WHOLE},     /* 4 does not divide: strict */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        CHECK(ff_ctx_set_coll_model(ctx, &none) == FF_OK, "set model without picks");
        ff_algo model = ff_coll_choose(g, cases[i].coll, cases[i].count, FF_WIRE_FP32);
        CHECK(ff_ctx_set_coll_model(ctx, &m) == FF_OK, "set model with picks");
        ff_algo got = ff_coll_choose(g, cases[i].coll, cases[i].count, FF_WIRE_FP32);
        ff_algo want = cases[i].picked ? cases[i].algo : model;
        CHECK(got == want, "case %zu (%s, %zu elements): picked %s, expected %s", i,
              ff_coll_name(cases[i].coll), cases[i].count, ff_algo_name(got), ff_algo_name(want));
        if (cases[i].picked)
            CHECK(model != cases[i].algo,
                  "case %zu: the model alone picks %s too: the case "
                  "cannot tell a pick from the model",
                  i, ff_algo_name(model));
    }
    /* sizes are bytes on the wire: a block of 8192 bf16 elements is 16 KiB,
     * the all-gather's output 64 KiB, in the range, where the model runs
     * the ring (part 2) */
    ff_ctx_set_coll_model(ctx, &none);
    ff_algo bf_model = ff_coll_choose(g, FF_COLL_ALLGATHER, 8192, FF_WIRE_BF16);
    ff_ctx_set_coll_model(ctx, &m);
    ff_algo bf_got = ff_coll_choose(g, FF_COLL_ALLGATHER, 8192, FF_WIRE_BF16);
    CHECK(bf_model == FF_ALGO_RING && bf_got == FF_ALGO_REC,
          "bf16 wire, blocks of 8192 elements: picked %s, the model alone %s", ff_algo_name(bf_got),
          ff_algo_name(bf_model));
    ff_group_destroy(g);

    /* malformed picks: refused, the message names the pick */
    static const char *const bad[] = {
        "{\"format\":\"fourfold-profile\",\"picks\":[{\"coll\":\"allgather\",\"nodes\":2,"
        "\"per_node\":2,\"min_B\":0,\"max_B\":1,\"algo\":\"rec-whole\"}]}",
        "{\"format\":\"fourfold-profile\",\"picks\":[{\"coll\":\"allgather\",\"nodes\":2,"
        "\"per_node\":2,\"min_B\":0,\"max_B\":1,\"algo\":\"mpi\"}]}",
        "{\"format\":\"fourfold-profile\",\"picks\":[{\"coll\":\"allgather\",\"nodes\":2,"
        "\"per_node\":2,\"min_B\":8,\"max_B\":8,\"algo\":\"ring\"}]}",
        "{\"format\":\"fourfold-profile\",\"picks\":[{\"coll\":\"allgather\",\"nodes\":1.5,"
        "\"per_node\":2,\"min_B\":0,\"max_B\":8,\"algo\":\"ring\"}]}",
        "{\"format\":\"fourfold-profile\",\"picks\":[{\"coll\":\"gather\",\"nodes\":2,"
        "\"per_node\":2,\"min_B\":0,\"max_B\":8,\"algo\":\"ring\"}]}",
        "{\"format\":\"fourfold-profile\",\"picks\":[{\"coll\":\"allgather\",\"nodes\":1,"
        "\"per_node\":1,\"min_B\":0,\"max_B\":8,\"algo\":\"ring\"}]}",
        "{\"format\":\"fourfold-profile\",\"picks\":[{\"coll\":\"allgather\",\"nodes\":2,"
        "\"per_node\":2,\"max_B\":8,\"algo\":\"ring\"}]}",
        "{\"format\":\"fourfold-profile\",\"picks\":{\"coll\":\"allgather\"}}",
        "{\"format\":\"fourfold-profile\",\"picks\":[{\"coll\":\"allgather\",\"nodes\":2,"
        "\"per_node\":2,\"min_B\":0,\"max_B\":8,\"algo\":\"ring\"} {}]}",
        "{\"format\":\"fourfold-profile\",\"picks\":[{\"coll\":\"allgather\",\"nodes\":2,"
        "\"per_node\":2,\"min_B\":0,\"max_B\":8,\"algo\":\"ring\"},]}",
        "{\"format\":\"fourfold-profile\",\"picks\":[{\"coll\":\"allgather\",\"nodes\":1e30,"
        "\"per_node\":2,\"min_B\":0,\"max_B\":8,\"algo\":\"ring\"}]}",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        rc = read_profile_text(bad[i], &m, err, sizeof err);
        CHECK(rc == FF_ECORRUPT && strstr(err, "pick"), "bad picks %zu: rc %d, message '%s'", i, rc,
              err);
        if (ff_ctx_rank(ctx) == 0 && i == 0)
            printf("  a bad pick: %s\n", err);
    }
    /* a string value "picks" is not the key; spaces around ':' are fine;
     * picks of 511 and 1500 characters are read (no fixed buffer) */
    rc = read_profile_text("{\"format\" : \"fourfold-profile\", \"name\" : \"picks\", \"picks\" :"
                           " [ { \"coll\" : \"allreduce\" , \"nodes\" : 2, \"per_node\" : 1, "
                           "\"min_B\" : 0, \"max_B\" : 8, \"algo\" : \"rec-whole\" } ] }",
                           &m, err, sizeof err);
    CHECK(rc == FF_OK && m.n_picks == 1 && m.picks[0].algo == FF_ALGO_REC_WHOLE,
          "spaced picks after a \"picks\" value: rc %d, %d picks, %s", rc, m.n_picks, err);
    for (int len = 511; len <= 1500; len += 989) {
        const char *pk = "{\"coll\":\"allreduce\",\"nodes\":2,\"per_node\":1,\"min_B\":0,"
                         "\"max_B\":8,\"algo\":\"ring\"";
        char text[2048];
        int k = snprintf(text, sizeof text, "{\"format\":\"fourfold-profile\",\"picks\":[%s", pk);
        int pad = len - (int)strlen(pk) - 1; /* spaces before the closing brace */
        for (int i = 0; i < pad; i++)
            text[k++] = ' ';
        snprintf(text + k, sizeof text - (size_t)k, "}]}");
        rc = read_profile_text(text, &m, err, sizeof err);
        CHECK(rc == FF_OK && m.n_picks == 1, "a pick of %d characters: rc %d, %s", len, rc, err);
    }
    ff_coll_model one = none;
    one.n_picks = 1;
    one.picks[0] = (ff_coll_pick_rule){FF_COLL_ALLGATHER, 2, 2, 0, 8, FF_ALGO_AUTO};
    CHECK(ff_ctx_set_coll_model(ctx, &one) == FF_EINVAL, "a pick of AUTO was accepted");
    one.n_picks = FF_COLL_MAX_PICKS + 1;
    CHECK(ff_ctx_set_coll_model(ctx, &one) == FF_EINVAL, "too many picks were accepted");
    if (ff_ctx_rank(ctx) == 0)
        printf("  picks: read, applied within their range and layout, refused when malformed\n");
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    int rank;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    if (rank == 0) {
        printf("part 1: ff_coll_fit on generated samples (p = 2..4, 1 KiB .. 1 MiB by 2x)\n");
        part_fit();
    }
    ff_ctx *ctx = NULL;
    if (ff_ctx_create(&ctx, MPI_COMM_WORLD, NULL) != FF_OK) {
        fprintf(stderr, "ff_ctx_create: %s\n", ff_ctx_error(ctx));
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    if (rank == 0)
        printf("part 2: the selector with a two-regime inter-node model, FF_RANKS_PER_NODE=%s\n",
               getenv("FF_RANKS_PER_NODE") ? getenv("FF_RANKS_PER_NODE") : "unset");
    part_select(ctx);
    if (rank == 0)
        printf("part 3: measured picks\n");
    part_picks(ctx);
    ff_ctx_destroy(ctx);
    int rc = test_finish("coll_fit_np4");
    MPI_Finalize();
    return rc;
}
