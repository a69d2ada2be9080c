/* Magnitude pruning, mask files and masked training (issue 28,
 * docs/samo.md). Run on 8 ranks:
 *   - rank 0, the serial model: ff_prune's masks against a brute-force
 *     reference (every candidate sorted by magnitude, ties by canonical
 *     index, the first round(p n) pruned), global and per layer, on the
 *     initial weights and on weights rounded to quarters (many ties), with
 *     and without the embedding, and for a mixture of experts (each expert's
 *     matrices apart); pruning 0.5 then 0.8 equals pruning 0.8;
 *     bad sparsities and a non-finite weight refused; mask files written and
 *     read back, a flipped byte, a truncated file, another model's mask and
 *     a missing file refused;
 *   - every grid of 8 ranks: two AdamW steps (eps 1, as test_gpt's) of the
 *     model trained with the global 0.8 mask from the same initialisation
 *     as the serial masked run: pruned parameters zero once the mask is set,
 *     and pruned parameters, gradients and both AdamW
 *     moments exactly zero after each step, the reported gradient norm that
 *     of the masked gradients (within 1e-5), the losses within 1e-5 and the
 *     parameters' updates per tensor within test_gpt's bound 2(4L+4)gamma_K
 *     (docs/testing.md) of the serial masked run's. */
#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fourfold/fourfold.h"
#include "test_util.h"

enum { B = 8, T = 16, STEPS = 2, MAX_GRIDS = 32 };
static const ff_gpt_config CFG = {.L = 2, .C = 32, .NH = 8, .V = 64, .Vp = 64, .maxT = 16};

static int32_t token_at(int64_t s, int64_t t)
{
    return (int32_t)(ff_rng_uniform(11, 5, (uint64_t)(s * (T + 1) + t)) * CFG.V);
}

/* The candidates by the test's own reading of the layout (include/
 * fourfold/gpt.h): qkvw and attprojw one matrix per block, fcw and fcprojw
 * one per dense block, efcw and efcprojw one per expert of each MoE block
 * (blocks K-1, 2K-1, ...), and wte's V rows. */
typedef struct {
    size_t off, len;
} span;

static int spans_of(ff_gpt *g, const ff_gpt_config *c, int embedding, span *out)
{
    const int Lm = c->experts ? c->L / c->expert_every : 0;
    int n = 0;
    size_t off = 0;
    for (int i = 0; i < FF_GPT_NTENSORS; i++) {
        const char *name = ff_gpt_tensor_name(i);
        size_t size = ff_gpt_tensor_size(g, i);
        int matrices = !strcmp(name, "qkvw") || !strcmp(name, "attprojw")   ? c->L
                       : !strcmp(name, "fcw") || !strcmp(name, "fcprojw")   ? c->L - Lm
                       : !strcmp(name, "efcw") || !strcmp(name, "efcprojw") ? Lm * c->experts
                                                                            : 0;
        if (!strcmp(name, "wte") && embedding)
            out[n++] = (span){off, (size_t)c->V * c->C};
        for (int l = 0; l < matrices; l++)
            out[n++] = (span){off + (size_t)l * (size / matrices), size / matrices};
        off += size;
    }
    return n;
}

typedef struct {
    float mag;
    size_t idx;
} entry;

static int by_mag(const void *a, const void *b)
{
    const entry *x = a, *y = b;
    if (x->mag != y->mag)
        return x->mag < y->mag ? -1 : 1;
    return x->idx < y->idx ? -1 : (x->idx > y->idx);
}

/* The reference: over each group of spans (all of them, or each one), the
 * first round(p n) of the candidates sorted by (|w|, index) pruned. */
static void reference(const float *canon, size_t n, const span *s, int ns, int per_layer, double p,
                      unsigned char *keep)
{
    memset(keep, 1, n);
    for (int a = 0; a < ns; a += per_layer ? 1 : ns) {
        int group = per_layer ? 1 : ns;
        size_t m = 0;
        for (int b = a; b < a + group; b++)
            m += s[b].len;
        entry *e = malloc(m * sizeof *e);
        size_t k = 0;
        for (int b = a; b < a + group; b++)
            for (size_t i = s[b].off; i < s[b].off + s[b].len; i++)
                e[k++] = (entry){fabsf(canon[i]), i};
        qsort(e, m, sizeof *e, by_mag);
        size_t cut = (size_t)llround(p * (double)m);
        for (size_t i = 0; i < cut; i++)
            keep[e[i].idx] = 0;
        free(e);
    }
}

static void check_mask(ff_gpt *g, const ff_gpt_config *c, const float *canon, int per_layer,
                       int embedding, double p, const char *what)
{
    size_t n = ff_gpt_canonical_size(g);
    span s[64];
    int ns = spans_of(g, c, embedding, s);
    unsigned char *got = malloc(n), *want = malloc(n);
    memset(got, 1, n);
    ff_prune_opts o = {.sparsity = p, .per_layer = per_layer, .embedding = embedding};
    char err[512];
    int64_t cand = 0, pruned = 0;
    int rc = ff_prune(g, canon, &o, got, &cand, &pruned, err, sizeof err);
    CHECK(rc == FF_OK, "%s: %s", what, err);
    reference(canon, n, s, ns, per_layer, p, want);
    size_t differ = 0, total = 0;
    for (int a = 0; a < ns; a++)
        total += s[a].len;
    for (size_t i = 0; i < n; i++)
        differ += got[i] != want[i];
    int64_t expect = 0;
    for (int a = 0; a < ns; a += per_layer ? 1 : ns) {
        size_t m = 0;
        for (int b = a; b < a + (per_layer ? 1 : ns); b++)
            m += s[b].len;
        expect += llround(p * (double)m);
    }
    CHECK(differ == 0, "%s: %zu entries differ from the reference", what, differ);
    CHECK(cand == (int64_t)total && pruned == expect,
          "%s: %lld candidates, %lld pruned; expected %zu and %lld", what, (long long)cand,
          (long long)pruned, total, (long long)expect);
    printf("  %-44s %lld of %lld pruned, equal to the reference\n", what, (long long)pruned,
           (long long)cand);
    free(got);
    free(want);
}

/* Rank 0 alone: pruning and mask files on the serial model. */
static void serial_checks(float **mask_canon_out, unsigned char **keep_out)
{
    ff_ctx *ctx;
    ff_grid *grid;
    ff_gpt *g = NULL;
    ff_ctx_options co;
    ff_ctx_options_default(&co);
    co.device = "cpu";
    if (ff_ctx_create(&ctx, MPI_COMM_SELF, &co) ||
        ff_grid_create(ctx, (ff_dims){1, 1, 1, 1}, &grid) ||
        ff_gpt_create(grid, &CFG, NULL, B, T, &g) || ff_gpt_init(g, 1234)) {
        CHECK(0, "serial model: %s", ff_ctx_error(ctx));
        return;
    }
    size_t n = ff_gpt_canonical_size(g);
    float *canon = malloc(n * sizeof *canon), *quarters = malloc(n * sizeof *canon);
    ff_gpt_gather(g, FF_GPT_PARAMS, canon, 0);
    for (size_t i = 0; i < n; i++) /* magnitudes in a few values: ties everywhere */
        quarters[i] = roundf(canon[i] * 40.0f) / 4.0f;
    check_mask(g, &CFG, canon, 0, 0, 0.8, "global 0.8");
    check_mask(g, &CFG, canon, 1, 0, 0.6, "per layer 0.6");
    check_mask(g, &CFG, canon, 0, 1, 0.5, "global 0.5 with the embedding");
    check_mask(g, &CFG, quarters, 0, 0, 0.8, "global 0.8, ties");
    check_mask(g, &CFG, quarters, 1, 1, 0.7, "per layer 0.7 with the embedding, ties");
    { /* a mixture of experts: each expert's matrices apart, the routers never */
        ff_gpt_config mc = CFG;
        ff_gpt_config_moe(&mc, 4);
        ff_gpt *moe = NULL;
        if (ff_gpt_create(grid, &mc, NULL, B, T, &moe) == FF_OK && ff_gpt_init(moe, 99) == FF_OK) {
            size_t nm = ff_gpt_canonical_size(moe);
            float *mcanon = malloc(nm * sizeof *mcanon);
            ff_gpt_gather(moe, FF_GPT_PARAMS, mcanon, 0);
            check_mask(moe, &mc, mcanon, 0, 0, 0.8, "MoE (4 experts), global 0.8");
            check_mask(moe, &mc, mcanon, 1, 0, 0.6, "MoE (4 experts), per layer 0.6");
            free(mcanon);
        } else {
            CHECK(0, "the MoE model: %s", ff_ctx_error(ctx));
        }
        ff_gpt_destroy(moe);
    }

    /* iterative: 0.5 then 0.8 is 0.8 */
    ff_prune_opts o = {.sparsity = 0.5};
    char err[512];
    unsigned char *a = malloc(n), *b = malloc(n);
    for (int q = 0; q < 2; q++) {
        const float *w = q ? quarters : canon;
        memset(a, 1, n);
        memset(b, 1, n);
        o.sparsity = 0.5;
        ff_prune(g, w, &o, a, NULL, NULL, err, sizeof err);
        o.sparsity = 0.8;
        ff_prune(g, w, &o, a, NULL, NULL, err, sizeof err);
        ff_prune(g, w, &o, b, NULL, NULL, err, sizeof err);
        CHECK(memcmp(a, b, n) == 0, "pruning 0.5 then 0.8 differs from 0.8 at once%s",
              q ? " (ties)" : "");
    }
    printf("  pruning 0.5 then 0.8 equals 0.8 at once (initial weights and ties)\n");

    /* bad input */
    const double bad[] = {1.0, -0.1, NAN};
    for (int i = 0; i < 3; i++) {
        o.sparsity = bad[i];
        CHECK(ff_prune(g, canon, &o, b, NULL, NULL, err, sizeof err) == FF_EINVAL &&
                  strstr(err, "sparsity"),
              "sparsity %g: not refused (%s)", bad[i], err);
    }
    o.sparsity = 0.5;
    float keep_w = canon[ff_gpt_tensor_size(g, 0) + ff_gpt_tensor_size(g, 1) +
                         ff_gpt_tensor_size(g, 2) + ff_gpt_tensor_size(g, 3)];
    size_t qkv0 = ff_gpt_tensor_size(g, 0) + ff_gpt_tensor_size(g, 1) + ff_gpt_tensor_size(g, 2) +
                  ff_gpt_tensor_size(g, 3);
    canon[qkv0] = NAN;
    CHECK(ff_prune(g, canon, &o, b, NULL, NULL, err, sizeof err) == FF_EINVAL &&
              strstr(err, "not finite"),
          "a NaN weight: not refused (%s)", err);
    canon[qkv0] = keep_w;

    /* mask files */
    unsigned char *keep = malloc(n), *back = malloc(n);
    memset(keep, 1, n);
    o.sparsity = 0.8;
    ff_prune(g, canon, &o, keep, NULL, NULL, err, sizeof err);
    char path[256], bad_path[300];
    snprintf(path, sizeof path, "/tmp/ff_test_prune_%d.mask", (int)getpid());
    int rc = ff_mask_write(g, path, keep, &o, err, sizeof err);
    CHECK(rc == FF_OK, "mask write: %s", err);
    int64_t kept = 0;
    rc = ff_mask_read(g, path, back, &kept, err, sizeof err);
    CHECK(rc == FF_OK && memcmp(keep, back, n) == 0, "mask read back: %s", err);
    FILE *f = fopen(path, "rb");
    fseek(f, 0, SEEK_END);
    long size = ftell(f);
    unsigned char *bytes = malloc((size_t)size);
    fseek(f, 0, SEEK_SET);
    CHECK(fread(bytes, 1, (size_t)size, f) == (size_t)size, "reading the mask file");
    fclose(f);
    snprintf(bad_path, sizeof bad_path, "%s.bad", path);
    bytes[size - 3] ^= 0x10; /* a bit of the mask */
    f = fopen(bad_path, "wb");
    fwrite(bytes, 1, (size_t)size, f);
    fclose(f);
    rc = ff_mask_read(g, bad_path, back, NULL, err, sizeof err);
    CHECK(rc == FF_ECORRUPT && strstr(err, "checksum"), "a flipped bit: %s", err);
    bytes[size - 3] ^= 0x10;
    f = fopen(bad_path, "wb");
    fwrite(bytes, 1, (size_t)size - 5, f);
    fclose(f);
    rc = ff_mask_read(g, bad_path, back, NULL, err, sizeof err);
    CHECK(rc == FF_ECORRUPT && strstr(err, "truncated"), "a truncated mask: %s", err);
    remove(bad_path);
    rc = ff_mask_read(g, "/nonexistent/x.mask", back, NULL, err, sizeof err);
    CHECK(rc == FF_EIO, "a missing mask: %s", err);
    ff_gpt *other = NULL;
    ff_gpt_config oc = CFG;
    oc.C = 64;
    if (ff_gpt_create(grid, &oc, NULL, B, T, &other) == FF_OK) {
        unsigned char *ob = malloc(ff_gpt_canonical_size(other));
        rc = ff_mask_read(other, path, ob, NULL, err, sizeof err);
        CHECK(rc == FF_EINVAL && strstr(err, "another model"), "another model's mask: %s", err);
        free(ob);
    }
    ff_gpt_destroy(other);
    remove(path);
    printf("  mask file: read back equal (%lld kept); a flipped bit, a truncated file, another "
           "model's mask and a missing file refused\n",
           (long long)kept);

    float *mc = malloc(n * sizeof *mc);
    for (size_t i = 0; i < n; i++)
        mc[i] = keep[i];
    *mask_canon_out = mc;
    *keep_out = keep;
    free(bytes);
    free(back);
    free(a);
    free(b);
    free(canon);
    free(quarters);
    ff_gpt_destroy(g);
    ff_grid_destroy(grid);
    ff_ctx_destroy(ctx);
}

typedef struct {
    float loss[STEPS];
    float *init, *params; /* canonical, rank 0 */
    double dp_bytes;      /* sent in the steps' all-reduces over D, all ranks together */
} run_result;

/* STEPS masked AdamW steps on a grid from init 1234 with keep (rank 0's);
 * checks the invariants on the way. */
static int masked_run_cfg(ff_ctx *ctx, ff_dims shape, const ff_gpt_config *cfg, int ge,
                          const unsigned char *keep, run_result *r, const char *desc)
{
    ff_grid *grid = NULL;
    ff_gpt *g = NULL;
    ff_gpt_opts go;
    ff_gpt_opts_default(&go);
    go.expert_parallel = ge;
    int rc = ff_grid_create(ctx, shape, &grid);
    if (rc == FF_OK)
        rc = ff_gpt_create(grid, cfg, &go, B, T, &g);
    if (rc == FF_OK)
        rc = ff_gpt_init(g, 1234);
    int root = ff_ctx_rank(ctx) == 0;
    size_t n = g ? ff_gpt_canonical_size(g) : 0;
    float *buf = root ? calloc(n, sizeof(float)) : NULL;
    if (rc == FF_OK)
        rc = ff_gpt_set_mask(g, root ? keep : NULL, 0);
    if (rc == FF_OK)
        rc = ff_gpt_gather(g, FF_GPT_PARAMS, r->init, 0);
    size_t pruned_nonzero = 0; /* ff_gpt_set_mask zeroes them at once */
    for (size_t i = 0; root && rc == FF_OK && i < n; i++)
        pruned_nonzero += !keep[i] && r->init[i] != 0.0f;
    CHECK(pruned_nonzero == 0, "%s: %zu pruned parameters not zero after ff_gpt_set_mask", desc,
          pruned_nonzero);
    int first = 0, count = 0;
    if (g)
        ff_gpt_local_sequences(g, &first, &count);
    ff_group *gd = grid ? ff_grid_group(grid, FF_GROUP_D) : NULL;
    if (gd)
        ff_group_counters_reset(gd);
    int32_t *tok = malloc((size_t)count * T * sizeof *tok),
            *tgt = malloc((size_t)count * T * sizeof *tgt);
    ff_adamw h;
    ff_adamw_default(&h);
    h.lr = 3e-3f;
    h.warmup = 1;
    h.steps = STEPS;
    h.eps = 1.0f; /* test_gpt's reason: the update is Lipschitz in the gradient */
    for (int s = 0; s < STEPS && rc == FF_OK; s++) {
        for (int q = 0; q < count; q++)
            for (int t = 0; t < T; t++) {
                tok[q * T + t] = token_at((int64_t)s * B + first + q, t);
                tgt[q * T + t] = token_at((int64_t)s * B + first + q, t + 1);
            }
        ff_gpt_step_info info;
        rc = ff_gpt_step(g, tok, tgt, 1, &h, s, &info);
        r->loss[s] = info.loss;
        const ff_gpt_buffer which[4] = {FF_GPT_PARAMS, FF_GPT_GRADS, FF_GPT_ADAM_M, FF_GPT_ADAM_V};
        const char *names[4] = {"parameter", "gradient", "AdamW m", "AdamW v"};
        for (int k = 0; k < 4 && rc == FF_OK; k++) {
            rc = ff_gpt_gather(g, which[k], buf, 0);
            size_t nonzero = 0;
            double ss = 0;
            for (size_t i = 0; root && rc == FF_OK && i < n; i++) {
                nonzero += !keep[i] && buf[i] != 0.0f;
                ss += (double)buf[i] * buf[i];
            }
            CHECK(nonzero == 0, "%s step %d: %zu pruned %ss not zero", desc, s, nonzero, names[k]);
            if (root && which[k] == FF_GPT_GRADS)
                CHECK(fabs(sqrt(ss) - info.grad_norm) <= 1e-5 * sqrt(ss),
                      "%s step %d: gradient norm %.8f, of the masked gradients %.8f", desc, s,
                      info.grad_norm, sqrt(ss));
        }
    }
    double sent = gd ? (double)ff_group_counters(gd, FF_COLL_ALLREDUCE).bytes_sent : 0;
    MPI_Allreduce(&sent, &r->dp_bytes, 1, MPI_DOUBLE, MPI_SUM, ff_ctx_comm(ctx));
    if (rc == FF_OK)
        rc = ff_gpt_gather(g, FF_GPT_PARAMS, r->params, 0);
    if (rc)
        CHECK(0, "%s: %s", desc, ff_ctx_error(ctx));
    free(tok);
    free(tgt);
    free(buf);
    ff_gpt_destroy(g);
    ff_grid_destroy(grid);
    return rc;
}

static int masked_run(ff_ctx *ctx, ff_dims shape, const unsigned char *keep, run_result *r,
                      const char *desc)
{
    return masked_run_cfg(ctx, shape, &CFG, 1, keep, r, desc);
}

/* Each tensor's update against the reference run's within tol of the
 * reference's largest update plus the parameters' rounding in each step
 * (test_gpt's form); returns the worst error/bound. */
static double compare_updates(const run_result *r, const run_result *ref, const size_t *sizes,
                              double tol, const char *desc)
{
    const double u = ldexp(1.0, -24);
    double worst = 0;
    size_t off = 0;
    for (int i = 0; i < FF_GPT_NTENSORS; i++) {
        double err = 0, upd = 0, pmax = 0;
        for (size_t j = off; j < off + sizes[i]; j++) {
            double d = fabs((double)r->params[j] - ref->params[j]);
            double up = fabs((double)ref->params[j] - ref->init[j]);
            err = d > err ? d : err;
            upd = up > upd ? up : upd;
            pmax = fabs(ref->params[j]) > pmax ? fabs(ref->params[j]) : pmax;
        }
        double bound = tol * upd + 2 * STEPS * u * pmax;
        if (sizes[i] && upd > 0) {
            worst = err / bound > worst ? err / bound : worst;
            CHECK(err <= bound, "%s: %s update differs by %.3e (bound %.3e)", desc,
                  ff_gpt_tensor_name(i), err, bound);
        }
        off += sizes[i];
    }
    return worst;
}

/* The canonical tensors' sizes and their total (a serial probe). */
static size_t probe_sizes(size_t sizes[FF_GPT_NTENSORS])
{
    ff_ctx *self;
    ff_grid *one = NULL;
    ff_gpt *probe = NULL;
    ff_ctx_options co;
    ff_ctx_options_default(&co);
    co.device = "cpu";
    size_t n = 0;
    if (ff_ctx_create(&self, MPI_COMM_SELF, &co) == FF_OK &&
        ff_grid_create(self, (ff_dims){1, 1, 1, 1}, &one) == FF_OK &&
        ff_gpt_create(one, &CFG, NULL, B, T, &probe) == FF_OK) {
        for (int j = 0; j < FF_GPT_NTENSORS; j++)
            sizes[j] = ff_gpt_tensor_size(probe, j);
        n = ff_gpt_canonical_size(probe);
    }
    ff_gpt_destroy(probe);
    ff_grid_destroy(one);
    ff_ctx_destroy(self);
    return n;
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    int world, rank;
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    float *mask_canon = NULL;
    unsigned char *keep = NULL;
    run_result ref = {0};
    size_t sizes[FF_GPT_NTENSORS] = {0}, n = 0;
    if (rank == 0) {
        printf("model L=%d C=%d NH=%d V=%d, B=%d T=%d; %d masked AdamW steps (eps 1) per grid\n",
               CFG.L, CFG.C, CFG.NH, CFG.V, B, T, STEPS);
        serial_checks(&mask_canon, &keep);
        n = probe_sizes(sizes);
        /* the serial masked run, on a context of rank 0 alone */
        ff_ctx *self = NULL;
        ff_ctx_options co;
        ff_ctx_options_default(&co);
        co.device = "cpu";
        ref.init = calloc(n, sizeof(float));
        ref.params = calloc(n, sizeof(float));
        if (keep && ff_ctx_create(&self, MPI_COMM_SELF, &co) == FF_OK &&
            masked_run(self, (ff_dims){1, 1, 1, 1}, keep, &ref, "serial") == FF_OK)
            printf("serial 1x1x1x1 with the global 0.8 mask: losses %.6f %.6f\n", ref.loss[0],
                   ref.loss[1]);
        else
            CHECK(0, "the serial masked run failed");
        ff_ctx_destroy(self);
    }
    MPI_Bcast(ref.loss, STEPS, MPI_FLOAT, 0, MPI_COMM_WORLD);
    /* the kept entries of the Z-sharded weights (wte with its padded rows,
     * and the four matrices): what a replica's ranks all-reduce over D */
    double kept_z = 0;
    for (int i = 0, off = 0; rank == 0 && keep && i < FF_GPT_NTENSORS; off += (int)sizes[i], i++) {
        const char *nm = ff_gpt_tensor_name(i);
        if (!strcmp(nm, "wte") || !strcmp(nm, "qkvw") || !strcmp(nm, "attprojw") ||
            !strcmp(nm, "fcw") || !strcmp(nm, "fcprojw"))
            for (size_t j = (size_t)off; j < (size_t)off + sizes[i]; j++)
                kept_z += keep[j];
    }
    MPI_Bcast(&kept_z, 1, MPI_DOUBLE, 0, MPI_COMM_WORLD);
    /* the ring for every collective: its all-reduce of n floats over p ranks
     * sends 2 (p - 1) n floats summed over the group, for any n */
    ff_ctx *ctx;
    ff_ctx_options wo;
    ff_ctx_options_default(&wo);
    wo.algo = "ring";
    if (ff_ctx_create(&ctx, MPI_COMM_WORLD, &wo) != FF_OK) {
        CHECK(0, "context: %s", ff_ctx_error(ctx));
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    /* test_gpt's bound for one micro-batch: 2 (4L + 4) gamma_K */
    const double u = ldexp(1.0, -24);
    double kmax = (double)B * T > 4.0 * CFG.C ? (double)B * T : 4.0 * CFG.C;
    kmax = kmax > CFG.V ? kmax : CFG.V;
    const double tol = 2 * (4.0 * CFG.L + 4) * (kmax * u / (1 - kmax * u));
    ff_dims grids[MAX_GRIDS];
    int ng = test_all_grids(world, grids, MAX_GRIDS), ran = 0, dp_checked = 0;
    double worst_loss = 0, worst_update = 0;
    for (int k = 0; k < ng && k < MAX_GRIDS; k++) {
        char desc[64];
        snprintf(desc, sizeof desc, "%dx%dx%dx%d", grids[k].x, grids[k].y, grids[k].z, grids[k].d);
        if (CFG.NH % grids[k].x || B % (grids[k].z * grids[k].d))
            continue;
        ran++;
        run_result r = {0};
        if (rank == 0) {
            r.init = calloc(n, sizeof(float));
            r.params = calloc(n, sizeof(float));
        }
        int ok = masked_run(ctx, grids[k], rank == 0 ? keep : NULL, &r, desc) == FF_OK;
        /* the data-parallel all-reduces send the kept entries only */
        const double want_dp = (double)STEPS * 8.0 * (grids[k].d - 1) * kept_z;
        CHECK(!ok || r.dp_bytes == want_dp, "%s: %.0f bytes sent over D, the kept entries' %.0f",
              desc, r.dp_bytes, want_dp);
        if (ok && grids[k].d > 1)
            dp_checked++;
        if (ok && rank == 0) {
            for (int s = 0; s < STEPS; s++) {
                double e = fabs(r.loss[s] - ref.loss[s]) / fabs(ref.loss[s]);
                worst_loss = e > worst_loss ? e : worst_loss;
                CHECK(e <= 1e-5, "%s: step %d loss %.8f, serial %.8f", desc, s, r.loss[s],
                      ref.loss[s]);
            }
            double w = compare_updates(&r, &ref, sizes, tol, desc);
            worst_update = w > worst_update ? w : worst_update;
        }
        free(r.init);
        free(r.params);
    }
    /* a mixture of experts (4 experts in block 1 of 2, top-1) with its own
     * global 0.8 mask, against its serial masked run, on grids whose expert
     * replicas (EDP) have 1, 2 and 4 ranks (1: no all-reduce of theirs) */
    {
        ff_gpt_config mc = CFG;
        ff_gpt_config_moe(&mc, 4);
        size_t msizes[FF_GPT_NTENSORS] = {0}, mn = 0;
        unsigned char *mkeep = NULL;
        run_result mref = {0};
        if (rank == 0) {
            ff_ctx *self = NULL;
            ff_grid *one = NULL;
            ff_gpt *probe = NULL;
            ff_ctx_options co;
            ff_ctx_options_default(&co);
            co.device = "cpu";
            if (ff_ctx_create(&self, MPI_COMM_SELF, &co) == FF_OK &&
                ff_grid_create(self, (ff_dims){1, 1, 1, 1}, &one) == FF_OK &&
                ff_gpt_create(one, &mc, NULL, B, T, &probe) == FF_OK &&
                ff_gpt_init(probe, 1234) == FF_OK) {
                mn = ff_gpt_canonical_size(probe);
                for (int j = 0; j < FF_GPT_NTENSORS; j++)
                    msizes[j] = ff_gpt_tensor_size(probe, j);
                float *mc0 = malloc(mn * sizeof *mc0);
                mkeep = malloc(mn);
                memset(mkeep, 1, mn);
                ff_prune_opts o = {.sparsity = 0.8};
                char err[256];
                ff_gpt_gather(probe, FF_GPT_PARAMS, mc0, 0);
                ff_prune(probe, mc0, &o, mkeep, NULL, NULL, err, sizeof err);
                free(mc0);
            }
            ff_gpt_destroy(probe);
            ff_grid_destroy(one);
            mref.init = calloc(mn ? mn : 1, sizeof(float));
            mref.params = calloc(mn ? mn : 1, sizeof(float));
            if (!mkeep || masked_run_cfg(self, (ff_dims){1, 1, 1, 1}, &mc, 1, mkeep, &mref,
                                         "serial MoE") != FF_OK)
                CHECK(0, "the serial masked MoE run failed");
            ff_ctx_destroy(self);
        }
        MPI_Bcast(mref.loss, STEPS, MPI_FLOAT, 0, MPI_COMM_WORLD);
        /* test_gpt's MoE bound: two reductions more per MoE block */
        const double mtol = 2 * (4.0 * CFG.L + 4 + 2) * (kmax * u / (1 - kmax * u));
        const struct {
            ff_dims shape;
            int ge;
        } cases[] = {{{2, 1, 1, 4}, 4}, {{2, 1, 1, 4}, 2}, {{1, 2, 1, 4}, 1}};
        for (int k = 0; world == 8 && k < 3; k++) {
            char desc[96];
            snprintf(desc, sizeof desc, "MoE %dx%dx%dx%d, expert parallelism %d", cases[k].shape.x,
                     cases[k].shape.y, cases[k].shape.z, cases[k].shape.d, cases[k].ge);
            run_result r = {0};
            if (rank == 0) {
                r.init = calloc(mn ? mn : 1, sizeof(float));
                r.params = calloc(mn ? mn : 1, sizeof(float));
            }
            if (masked_run_cfg(ctx, cases[k].shape, &mc, cases[k].ge, rank == 0 ? mkeep : NULL, &r,
                               desc) == FF_OK &&
                rank == 0) {
                for (int s = 0; s < STEPS; s++)
                    CHECK(fabs(r.loss[s] - mref.loss[s]) <= 1e-5 * fabs(mref.loss[s]),
                          "%s: step %d loss %.8f, serial %.8f", desc, s, r.loss[s], mref.loss[s]);
                double w = compare_updates(&r, &mref, msizes, mtol, desc);
                printf("%s: losses %.6f %.6f, update error/bound %.3f\n", desc, r.loss[0],
                       r.loss[1], w);
            }
            free(r.init);
            free(r.params);
        }
        free(mref.init);
        free(mref.params);
        free(mkeep);
    }
    CHECK(dp_checked >= 10 || world != 8, "the bytes over D were checked on %d grids only",
          dp_checked);
    if (rank == 0)
        printf("%d grids with the mask: pruned parameters, gradients and moments zero after every "
               "step; worst loss %.2e (tol 1e-5), worst update error/bound %.3f (bound %.2e per "
               "tensor plus the parameters' rounding); on the %d with D > 1 the all-reduces over D "
               "sent exactly the kept entries (%.0f of the Z-sharded weights, ring algorithm)\n",
               ran, worst_loss, worst_update, tol, dp_checked, kept_z);
    CHECK(ran >= 20 || world != 8, "only %d grids of 8 ran", ran);
    free(ref.init);
    free(ref.params);
    free(mask_canon);
    free(keep);
    ff_ctx_destroy(ctx);
    int code = test_finish("prune");
    MPI_Finalize();
    return code;
}
