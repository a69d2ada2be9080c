/* Decomposition of the dependent all-reduces and per-layer plans (issue 25)
 * on every grid of the world size.
 *
 *   test_decompose all | GRID...
 *
 * Each run is one training micro-batch of a small GPT (forward, backward,
 * the gradient collectives): its loss and its gradients, gathered to
 * canonical layout on rank 0, and the all-reduce counters of the X and Y
 * groups (the groups of the linear layers' dependent all-reduces), summed
 * over the ranks. The GEMMs run in panels of PANEL rows (the default panel,
 * at least 256 rows, is more than a rank's rows here): decomposition cuts at
 * panel boundaries, so each rank's 32 to 256 rows give 4 to 32 panels and
 * every k below is used as given.
 *
 * 1. With the linear layers' collectives on FF_ALGO_REC, whose order of
 *    additions is the same for every element whatever the vector's length
 *    (a fixed butterfly), decomposition into k = 2, 3, 4 chunks is bitwise
 *    identical to none, and the counters show k times as many of those
 *    all-reduces with the same bytes: per micro-batch the X group and the Y
 *    group each carry 4L + 1 of them (Y: the forward of QKV, MLP up and the
 *    LM head, the input gradient of the projection and MLP down; X the
 *    others), so calls grow by (k - 1)(4L + 1) on each group of more than
 *    one rank, and REC's bytes are linear in the count, so their sum over
 *    the ranks does not change.
 * 2. With FF_ALGO_AUTO, a chunk may run another algorithm than the whole
 *    vector (the ring's order of additions depends on the block an element
 *    falls in): k = 3 against none, per tensor max|a - b| / max|b| within
 *    the bound of tests/test_gpt.c for two orders of the same sums,
 *    2 (4L + 4) gamma_K, K the longest sum.
 * 3. A per-layer plan with mixed settings (checkpointing in one block,
 *    different chunk counts, overlap switches, AG cache per layer) equals,
 *    bitwise, the uniform run without decomposition (on REC): none of these
 *    options changes what is computed. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "test_util.h"

enum { MAX_GRIDS = 64, PANEL = 8 };

static const ff_gpt_config cfg = {.L = 2, .C = 64, .NH = 8, .V = 500, .Vp = 0, .maxT = 32};
static const int B = 8, T = 32;

typedef struct {
    float loss;
    float *grads;                      /* canonical, rank 0 */
    size_t n, tensor[FF_GPT_NTENSORS]; /* canonical sizes */
    /* all-reduces of the X and Y groups, summed over the ranks */
    unsigned long long calls[2], sent[2], recv[2];
    /* all-gathers of the Z groups, and the collective matmuls, summed */
    unsigned long long ag[3];
    long cmm;
} result;

static int32_t token_at(int64_t s, int64_t t) { return (int32_t)((s * 131 + t * 17 + 7) % cfg.V); }

static int run(ff_grid *grid, const ff_gpt_opts *o, result *r)
{
    ff_ctx *ctx = ff_grid_ctx(grid);
    ff_gpt *g;
    memset(r, 0, sizeof *r);
    int rc = ff_gpt_create(grid, &cfg, o, B, T, &g);
    if (rc)
        return rc;
    int first, count;
    ff_gpt_local_sequences(g, &first, &count);
    int32_t *tok = malloc((size_t)count * T * sizeof(int32_t));
    int32_t *tgt = malloc((size_t)count * T * sizeof(int32_t));
    for (int s = 0; s < count; s++)
        for (int t = 0; t < T; t++) {
            tok[s * T + t] = token_at(first + s, t);
            tgt[s * T + t] = token_at(first + s, t + 1);
        }
    r->n = ff_gpt_canonical_size(g);
    for (int t = 0; t < FF_GPT_NTENSORS; t++)
        r->tensor[t] = ff_gpt_tensor_size(g, t);
    r->grads = ff_ctx_rank(ctx) == 0 ? calloc(r->n, sizeof(float)) : NULL;
    ff_group *groups[3] = {ff_grid_group(grid, FF_GROUP_X), ff_grid_group(grid, FF_GROUP_Y),
                           ff_grid_group(grid, FF_GROUP_Z)};
    for (int i = 0; i < 3; i++)
        ff_group_counters_reset(groups[i]);
    ff_gemm_set_panel_rows(ff_linear_seq_gemm(ff_gpt_linear_seq(g)), PANEL);
    rc = ff_gpt_init(g, 99);
    if (rc == FF_OK)
        rc = ff_gpt_zero_grad(g);
    if (rc == FF_OK)
        rc = ff_gpt_forward_backward(g, tok, tgt, 0, 1);
    if (rc == FF_OK)
        rc = ff_gpt_finish_grads(g, &r->loss);
    for (int i = 0; i < 2 && rc == FF_OK; i++) {
        ff_counters c = ff_group_counters(groups[i], FF_COLL_ALLREDUCE);
        unsigned long long mine[3] = {c.calls, c.bytes_sent, c.bytes_recv}, sum[3];
        MPI_Allreduce(mine, sum, 3, MPI_UNSIGNED_LONG_LONG, MPI_SUM, MPI_COMM_WORLD);
        r->calls[i] = sum[0];
        r->sent[i] = sum[1];
        r->recv[i] = sum[2];
    }
    if (rc == FF_OK) {
        ff_counters c = ff_group_counters(groups[2], FF_COLL_ALLGATHER);
        unsigned long long mine[4] = {c.calls, c.bytes_sent, c.bytes_recv,
                                      (unsigned long long)ff_linear_seq_cmm_uses(
                                          ff_gpt_linear_seq(g))},
                           sum[4];
        MPI_Allreduce(mine, sum, 4, MPI_UNSIGNED_LONG_LONG, MPI_SUM, MPI_COMM_WORLD);
        memcpy(r->ag, sum, sizeof r->ag);
        r->cmm = (long)sum[3];
    }
    if (rc == FF_OK)
        rc = ff_gpt_gather(g, FF_GPT_GRADS, r->grads, 0);
    free(tok);
    free(tgt);
    ff_gpt_destroy(g);
    return rc;
}

/* tests/test_gpt.c's bound for two orders of the step's sums (one micro-batch) */
static double tol_bound(void)
{
    const double u = ldexp(1.0, -24);
    double kmax = (double)B * T;
    kmax = 4.0 * cfg.C > kmax ? 4.0 * cfg.C : kmax;
    kmax = (double)cfg.V > kmax ? cfg.V : kmax;
    return 2 * (4.0 * cfg.L + 4) * (kmax * u / (1 - kmax * u));
}

static int bitwise(const result *a, const result *b)
{
    return a->n == b->n && memcmp(&a->loss, &b->loss, sizeof a->loss) == 0 &&
           memcmp(a->grads, b->grads, a->n * sizeof(float)) == 0;
}

/* The gradients of a against b's, each tensor's largest difference
 * relative to its largest value, within tol, and the loss within 1e-5;
 * returns the worst ratio to tol. */
static double within_bound(const result *a, const result *b, double tol, const char *desc,
                           const char *what)
{
    double worst = 0;
    size_t off = 0;
    for (int t = 0; t < FF_GPT_NTENSORS; t++) {
        size_t m = b->tensor[t];
        double maxref = 0, maxdiff = 0;
        for (size_t e = 0; e < m; e++) {
            double d = fabs((double)a->grads[off + e] - b->grads[off + e]);
            maxdiff = !(d <= maxdiff) ? d : maxdiff;
            maxref = fabs(b->grads[off + e]) > maxref ? fabs(b->grads[off + e]) : maxref;
        }
        double rel = maxref > 0 ? maxdiff / maxref : maxdiff;
        CHECK(rel <= tol, "%s, %s: gradient %s rel max error %.3e > %.3e", desc, what,
              ff_gpt_tensor_name(t), rel, tol);
        worst = !(rel / tol <= worst) ? rel / tol : worst;
        off += m;
    }
    double le = fabs((double)a->loss - b->loss) / fabs((double)b->loss);
    CHECK(le <= 1e-5, "%s, %s: loss %.9g, without %.9g", desc, what, a->loss, b->loss);
    return worst;
}

/* The mixed plan of part 3. */
static int mixed_plan(ff_layer_plan *p, ff_dims shape)
{
    memset(p, 0, sizeof *p);
    p->blocks = calloc((size_t)cfg.L, sizeof *p->blocks);
    if (!p->blocks)
        return FF_ENOMEM;
    p->layers = cfg.L, p->heads = cfg.NH, p->hidden = cfg.C, p->vocab = cfg.V;
    p->grid = shape;
    p->batch = B, p->seq = T, p->micro_batches = 1;
    ff_layer_opts o = {
        .decompose = 0, .oar = 1, .ors = 1, .oag = 1, .ag_cache = 1, .wire_bytes = 4};
    p->head = o;
    p->head.decompose = 2;
    for (int l = 0; l < cfg.L; l++) {
        p->blocks[l].checkpoint = l == 0;
        for (int i = 0; i < FF_BLOCK_LAYERS; i++) {
            ff_layer_opts *x = &p->blocks[l].layer[i];
            *x = o;
            x->decompose = (l + i) % 4; /* 0, 1 (off), 2, 3 */
            x->oar = i != 1;
            x->ors = i != 2;
            x->oag = (l + i) % 2;
            x->ag_cache = l == 1 && i < 2;
        }
    }
    return FF_OK;
}

static void run_grid(ff_ctx *ctx, ff_dims shape, double tol)
{
    int rank = ff_ctx_rank(ctx);
    char desc[96];
    ff_grid *grid;
    if (ff_grid_create(ctx, shape, &grid) != FF_OK) {
        CHECK(0, "grid %dx%dx%dx%d: %s", shape.x, shape.y, shape.z, shape.d, ff_ctx_error(ctx));
        return;
    }
    ff_grid_describe(grid, desc, sizeof desc);
    const int groups_gt1[2] = {shape.x > 1, shape.y > 1};
    const unsigned long long per_group = 4ull * cfg.L + 1;
    result base = {0}, r = {0};
    for (int k = 0; k <= 4; k++) {
        if (k == 1)
            continue;
        ff_gpt_opts o;
        ff_gpt_opts_default(&o);
        o.linear.coll.algo = FF_ALGO_REC;
        o.linear.decompose = k;
        result *dst = k ? &r : &base;
        int rc = run(grid, &o, dst);
        CHECK(rc == FF_OK, "%s, REC, decompose %d: %s", desc, k, ff_ctx_error(ctx));
        if (rc || k == 0) {
            if (rc) { /* a failed run may have allocated */
                free(r.grads);
                r.grads = NULL;
            }
            continue;
        }
        if (rank == 0) {
            CHECK(bitwise(&r, &base), "%s, REC: decompose %d differs from none (loss %.9g, %.9g)",
                  desc, k, r.loss, base.loss);
            for (int i = 0; i < 2; i++) {
                unsigned long long want =
                    base.calls[i] + (groups_gt1[i] ? (unsigned long long)(k - 1) * per_group *
                                                         (unsigned long long)ff_ctx_size(ctx)
                                                   : 0);
                CHECK(r.calls[i] == want, "%s, decompose %d: %c all-reduce calls %llu, want %llu",
                      desc, k, "XY"[i], r.calls[i], want);
                CHECK(r.sent[i] == base.sent[i] && r.recv[i] == base.recv[i],
                      "%s, decompose %d: %c all-reduce bytes sent %llu and received %llu, "
                      "without %llu and %llu",
                      desc, k, "XY"[i], r.sent[i], r.recv[i], base.sent[i], base.recv[i]);
            }
        }
        free(r.grads);
        r.grads = NULL;
    }

    /* 3: the mixed plan against the uniform run (REC) */
    ff_layer_plan plan;
    ff_gpt_opts o;
    ff_gpt_opts_default(&o);
    o.linear.coll.algo = FF_ALGO_REC;
    int rc = mixed_plan(&plan, shape);
    o.plan = &plan;
    if (rc == FF_OK)
        rc = run(grid, &o, &r);
    free(plan.blocks);
    CHECK(rc == FF_OK, "%s, mixed plan: %s", desc, ff_ctx_error(ctx));
    if (rc == FF_OK && rank == 0)
        CHECK(bitwise(&r, &base), "%s: the mixed plan differs from the uniform run", desc);
    free(r.grads);
    free(base.grads);

    /* 2: AUTO, decompose 3 against none, within the bound */
    result a0 = {0}, a3 = {0};
    ff_gpt_opts_default(&o);
    rc = run(grid, &o, &a0);
    o.linear.decompose = 3;
    if (rc == FF_OK)
        rc = run(grid, &o, &a3);
    CHECK(rc == FF_OK, "%s, AUTO: %s", desc, ff_ctx_error(ctx));
    if (rc == FF_OK && rank == 0) {
        double worst = within_bound(&a3, &a0, tol, desc, "AUTO decompose 3");
        printf("  %-34s REC k=2,3,4 and mixed plan bitwise; AUTO k=3 %s (error/bound %.3f)\n", desc,
               bitwise(&a3, &a0) ? "bitwise" : "bounded", worst);
    }
    free(a3.grads);

    /* 4: the collective matmul, with OAG (the run's first gather) and
     * without (every forward's), against the same run without it: within
     * the bound, the same all-gathers (calls and bytes) */
    for (int oag = 1; shape.z > 1 && oag >= 0; oag--) {
        result c = {0};
        ff_gpt_opts_default(&o);
        o.linear.oag = oag;
        if (!oag) {
            free(a0.grads);
            if ((rc = run(grid, &o, &a0)))
                break;
        }
        o.linear.cmm = 1;
        rc = run(grid, &o, &c);
        CHECK(rc == FF_OK, "%s, cmm: %s", desc, ff_ctx_error(ctx));
        if (rc == FF_OK && rank == 0) {
            char what[48];
            snprintf(what, sizeof what, "cmm, OAG %s", oag ? "on" : "off");
            double worst = within_bound(&c, &a0, tol, desc, what);
            CHECK(c.ag[0] == a0.ag[0] && c.ag[1] == a0.ag[1] && c.ag[2] == a0.ag[2],
                  "%s, %s: Z all-gathers %llu calls %llu bytes, without %llu calls %llu bytes",
                  desc, what, c.ag[0], c.ag[1], a0.ag[0], a0.ag[1]);
            /* with OAG the run's first gather is the embedding's lookup,
             * not a product, and every other is prefetched: none runs
             * beside its gather then (the products are still sliced) */
            CHECK((oag ? c.cmm == 0 : c.cmm > 0) && a0.cmm == 0,
                  "%s, %s: %ld collective matmuls (%ld without)", desc, what, c.cmm, a0.cmm);
            printf("  %-34s %s: %ld collective matmuls, %s (error/bound %.3f)\n", desc, what, c.cmm,
                   bitwise(&c, &a0) ? "bitwise" : "bounded", worst);
        }
        free(c.grads);
    }
    CHECK(rc == FF_OK, "%s, cmm: %s", desc, ff_ctx_error(ctx));
    free(a0.grads);
    ff_grid_destroy(grid);
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    int world = 0;
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    ff_ctx *ctx = NULL;
    if (ff_ctx_create(&ctx, MPI_COMM_WORLD, NULL)) {
        fprintf(stderr, "test_decompose: no context\n");
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    const double tol = tol_bound();
    if (argc >= 2 && !strcmp(argv[1], "all")) {
        ff_dims grids[MAX_GRIDS];
        int ng = test_all_grids(world, grids, MAX_GRIDS);
        for (int i = 0; i < ng; i++)
            run_grid(ctx, grids[i], tol);
        if (ff_ctx_rank(ctx) == 0)
            printf("%d grids of %d ranks (bound %.2e)\n", ng, world, tol);
    } else {
        for (int i = 1; i < argc; i++) {
            ff_dims s;
            char err[256];
            if (ff_grid_parse(argv[i], world, 0, &s, err, sizeof err)) {
                CHECK(0, "bad grid '%s'", argv[i]);
                continue;
            }
            run_grid(ctx, s, tol);
        }
    }
    ff_ctx_destroy(ctx);
    int code = test_finish("test_decompose");
    MPI_Finalize();
    return code;
}
