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
 *    options changes what is computed. Since an ignored plan would pass
 *    that too, every layer must report the plan's options
 *    (ff_linear_options), and the X and Y all-reduce calls must be the
 *    uniform run's plus exactly what the plan's chunks and its checkpointed
 *    block's recompute add (plan_extra_calls).
 * 4. On every grid with Gz > 1, the collective matmul with OAG (every
 *    product's weight prefetched) and without OAG under activation
 *    checkpointing (each forward's gather in flight during its products,
 *    the recomputes on the weight the AG cache kept), each within the bound
 *    of the run with the same OAG without it (and without checkpointing),
 *    with the same Z all-gathers, and the two bitwise equal: the shards are
 *    multiplied in one fixed order whether the weight was prefetched or
 *    not, and a recompute is such a forward.
 * 5. On every grid with Gz > 1, the reduce-scatter collective matmul
 *    (dW_rc computed shard by shard, each shard fed to the ring
 *    reduce-scatter over Z): every collective on the ring, it adds each
 *    element's Gz terms in the plain ring reduce-scatter's order, so it
 *    differs from the run without it only where a shard's product (a BLAS
 *    call on nl/Gz rows of dW_rc^T) rounds otherwise than the whole
 *    product's panels of PANEL rows: bitwise where every layer's shard
 *    is whole panels (nl/Gz a multiple of PANEL), else within the bound
 *    of part 2 (two orders of the same sums); in fp32, and in bf16-mixed
 *    (whose weight gradients are reduced in fp32 either way) on the grids
 *    with Gd > 1, over two
 *    micro-batches. The Z
 *    reduce-scatters are the same calls and bytes, and every layer whose
 *    last backward use is its product ran as one (not wte: the lookup's
 *    gradient is its last use). A per-layer plan turning it on in some
 *    layers (FF_ALGO_AUTO) runs exactly those, within the bound of the
 *    run without. */
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
    /* reduce-scatters of the Z groups, and the reduce-scatter collective
     * matmuls run and expected (the layers with rs_cmm whose Z-shards are
     * whole rows and whose last backward use is the product, once per
     * micro-batch), summed; the
     * layers whose shard is not whole GEMM panels, summed */
    unsigned long long rs[3];
    long rs_cmm, rs_cmm_want, rs_unaligned;
    /* with a plan: the layers whose options (ff_linear_options) are not the
     * plan's, the first of them named in why */
    int plan_missed;
    char why[160];
} result;

static int32_t token_at(int64_t s, int64_t t) { return (int32_t)((s * 131 + t * 17 + 7) % cfg.V); }

/* The plan's options of layer `name` ("wte", "h<l>.qkv", ...); NULL if none. */
static const ff_layer_opts *plan_layer(const ff_layer_plan *p, const char *name)
{
    static const char *const kinds[FF_BLOCK_LAYERS] = {"qkv", "attproj", "fc", "fcproj"};
    char what[16];
    int l;
    if (!strcmp(name, "wte"))
        return &p->head;
    if (sscanf(name, "h%d.%15s", &l, what) != 2 || l < 0 || l >= p->layers)
        return NULL;
    for (int i = 0; i < FF_BLOCK_LAYERS; i++)
        if (!strcmp(what, kinds[i]))
            return &p->blocks[l].layer[i];
    return NULL;
}

/* Every layer of g runs with the plan's options (decomposition, overlaps,
 * AG cache, wire), as the layer itself reports them. */
static void plan_reached(ff_gpt *g, const ff_layer_plan *p, result *r)
{
    ff_linear_seq *s = ff_gpt_linear_seq(g);
    for (int i = 0; i < ff_linear_seq_count(s); i++) {
        ff_linear *l = ff_linear_seq_layer(s, i);
        const ff_layer_opts *want = plan_layer(p, ff_linear_name(l));
        ff_layer_opts got;
        ff_linear_options(l, &got);
        if (want && got.decompose == want->decompose && got.oar == want->oar &&
            got.ors == want->ors && got.oag == want->oag && got.ag_cache == want->ag_cache &&
            got.wire_bytes == want->wire_bytes && got.rs_cmm == want->rs_cmm)
            continue;
        if (!r->plan_missed++)
            snprintf(r->why, sizeof r->why,
                     "layer %s runs with decompose %d, OAR %d, ORS %d, OAG %d, AG cache %d, wire "
                     "%d; the plan says %d %d %d %d %d %d",
                     ff_linear_name(l), got.decompose, got.oar, got.ors, got.oag, got.ag_cache,
                     got.wire_bytes, want ? want->decompose : -1, want ? want->oar : -1,
                     want ? want->ors : -1, want ? want->oag : -1, want ? want->ag_cache : -1,
                     want ? want->wire_bytes : -1);
    }
}

/* The row chunks of a layer's dependent all-reduces. */
static int chunks(const ff_layer_opts *o) { return o->decompose >= 2 ? o->decompose : 1; }

/* The all-reduces the plan adds to the uniform run's on each rank, X and Y
 * (the dependent all-reduces of part 1): a layer cut into c chunks
 * (decompose >= 2; every layer here has at least 4 panels) runs c - 1 more
 * for its forward and c - 1 more for its input gradient, one on each of the
 * two groups (QKV, MLP up and the LM head forward on Y, the projections on
 * X); a checkpointed block recomputes QKV, the projection and MLP up (c
 * each), and its two LayerNorms, two all-reduces over Y each where Gy > 1. */
static void plan_extra_calls(const ff_layer_plan *p, int gy, unsigned long long extra[2])
{
    unsigned long long cut = (unsigned long long)chunks(&p->head) - 1;
    extra[0] = extra[1] = 0;
    for (int l = 0; l < p->layers; l++) {
        const ff_block_opts *b = &p->blocks[l];
        for (int i = 0; i < FF_BLOCK_LAYERS; i++)
            cut += (unsigned long long)chunks(&b->layer[i]) - 1;
        if (!b->checkpoint)
            continue;
        extra[0] += (unsigned long long)chunks(&b->layer[FF_BLOCK_ATTPROJ]);
        extra[1] += (unsigned long long)(chunks(&b->layer[FF_BLOCK_QKV]) +
                                         chunks(&b->layer[FF_BLOCK_FC]) + (gy > 1 ? 4 : 0));
    }
    extra[0] += cut, extra[1] += cut;
}

/* One training step of n_micro micro-batches (the same tokens each). */
static int run_micro(ff_grid *grid, const ff_gpt_opts *o, int n_micro, result *r)
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
    if (o->plan)
        plan_reached(g, o->plan, r);
    long rs_mine[3] = {0, 0, 0}, rs_sum[3];
    for (int i = 0; i < ff_linear_seq_count(ff_gpt_linear_seq(g)); i++) {
        ff_linear *l = ff_linear_seq_layer(ff_gpt_linear_seq(g), i);
        ff_layer_opts got;
        ff_linear_options(l, &got);
        const int gz = ff_grid_shape(grid).z;
        const int64_t nl = (int64_t)ff_linear_local_sizes(l).block_cols; /* W^T blocks */
        if (got.rs_cmm && gz > 1 && nl % gz == 0 && strcmp(ff_linear_name(l), "wte")) {
            rs_mine[1]++;
            rs_mine[2] += (nl / gz) % PANEL != 0;
        }
    }
    rc = ff_gpt_init(g, 99);
    if (rc == FF_OK)
        rc = ff_gpt_zero_grad(g);
    for (int m = 0; m < n_micro && rc == FF_OK; m++)
        rc = ff_gpt_forward_backward(g, tok, tgt, m, n_micro);
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
        c = ff_group_counters(groups[2], FF_COLL_REDUCE_SCATTER);
        unsigned long long rs[3] = {c.calls, c.bytes_sent, c.bytes_recv};
        MPI_Allreduce(rs, r->rs, 3, MPI_UNSIGNED_LONG_LONG, MPI_SUM, MPI_COMM_WORLD);
        rs_mine[0] = ff_linear_seq_rs_cmm_uses(ff_gpt_linear_seq(g));
        MPI_Allreduce(rs_mine, rs_sum, 3, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
        r->rs_cmm = rs_sum[0], r->rs_cmm_want = rs_sum[1] * n_micro;
        r->rs_unaligned = rs_sum[2];
    }
    if (rc == FF_OK)
        rc = ff_gpt_gather(g, FF_GPT_GRADS, r->grads, 0);
    free(tok);
    free(tgt);
    ff_gpt_destroy(g);
    return rc;
}

static int run(ff_grid *grid, const ff_gpt_opts *o, result *r) { return run_micro(grid, o, 1, r); }

/* tests/test_gpt.c's bound for two orders of the step's sums (one micro-batch) */
static double tol_bound(void)
{
    const double u = ldexp(1.0, -24);
    double kmax = (double)B * T;
    kmax = 4.0 * cfg.C > kmax ? 4.0 * cfg.C : kmax;
    kmax = (double)cfg.V > kmax ? cfg.V : kmax;
    return 2 * (4.0 * cfg.L + 4) * (kmax * u / (1 - kmax * u));
}

/* The first canonical gradient whose bits differ (a->n if none). */
static size_t first_diff(const result *a, const result *b)
{
    size_t i = 0;
    while (i < a->n && !memcmp(&a->grads[i], &b->grads[i], sizeof(float)))
        i++;
    return i;
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

/* Part 5 on one grid: every collective on the ring, the reduce-scatter
 * collective matmul against the run without it, in fp32 or bf16-mixed,
 * two micro-batches (the second's reduce-scatter posted after the first's
 * result is added, as ORS orders them). */
static void rs_cmm_check(ff_grid *grid, const char *desc, double tol, int bf16)
{
    ff_ctx *ctx = ff_grid_ctx(grid);
    result base = {0}, rs = {0};
    ff_gpt_opts o;
    ff_gpt_opts_default(&o);
    o.linear.coll.algo = FF_ALGO_RING;
    if (bf16)
        o.precision = FF_PRECISION_BF16_MIXED;
    int rc = run_micro(grid, &o, 2, &base);
    o.linear.rs_cmm = 1;
    if (rc == FF_OK)
        rc = run_micro(grid, &o, 2, &rs);
    CHECK(rc == FF_OK, "%s, rs-cmm%s: %s", desc, bf16 ? " bf16" : "", ff_ctx_error(ctx));
    if (rc == FF_OK && ff_ctx_rank(ctx) == 0) {
        char what[48];
        snprintf(what, sizeof what, "rs-cmm, ring, 2 micro%s", bf16 ? ", bf16-mixed" : "");
        /* (bf16-mixed: both runs round the same operands to bf16, and only
         * the order of dW's fp32 sums differs: the same bound) */
        double worst = within_bound(&rs, &base, tol, desc, what);
        CHECK(rs.rs_cmm == rs.rs_cmm_want && rs.rs_cmm > 0 && base.rs_cmm == 0,
              "%s, %s: %ld reduce-scatter collective matmuls, want %ld (%ld without)", desc, what,
              rs.rs_cmm, rs.rs_cmm_want, base.rs_cmm);
        CHECK(memcmp(rs.rs, base.rs, sizeof rs.rs) == 0,
              "%s, %s: Z reduce-scatters %llu calls %llu/%llu bytes, without %llu %llu/%llu", desc,
              what, rs.rs[0], rs.rs[1], rs.rs[2], base.rs[0], base.rs[1], base.rs[2]);
        if (!rs.rs_unaligned) {
            const size_t at = first_diff(&rs, &base);
            CHECK(bitwise(&rs, &base),
                  "%s, %s: every shard is whole panels, yet it differs from the plain reduce-"
                  "scatter: loss %.9g and %.9g, gradient %zu %.9g and %.9g",
                  desc, what, rs.loss, base.loss, at, at < rs.n ? rs.grads[at] : 0.0,
                  at < rs.n ? base.grads[at] : 0.0);
        }
        printf("  %-34s %s: %ld of them (%ld shards not whole panels), %s (error/bound %.3f)\n",
               desc, what, rs.rs_cmm, rs.rs_unaligned, bitwise(&rs, &base) ? "bitwise" : "bounded",
               worst);
    }
    free(base.grads);
    free(rs.grads);
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
    CHECK(rc == FF_OK, "%s, mixed plan: %s", desc, ff_ctx_error(ctx));
    /* the plan reached the layers (as they report their options) and
     * acted: its chunks and its checkpointed block's recompute in the X and
     * Y all-reduces (an ignored plan computes the same bits) */
    CHECK(rc || !r.plan_missed, "%s, mixed plan: %d layers not as planned: %s", desc, r.plan_missed,
          r.why);
    if (rc == FF_OK && rank == 0) {
        CHECK(bitwise(&r, &base), "%s: the mixed plan differs from the uniform run", desc);
        unsigned long long extra[2];
        plan_extra_calls(&plan, shape.y, extra);
        for (int i = 0; i < 2; i++) {
            unsigned long long want =
                base.calls[i] +
                (groups_gt1[i] ? extra[i] * (unsigned long long)ff_ctx_size(ctx) : 0);
            CHECK(r.calls[i] == want,
                  "%s, mixed plan: %c all-reduce calls %llu, want %llu (uniform %llu, %llu more "
                  "a rank)",
                  desc, "XY"[i], r.calls[i], want, base.calls[i], extra[i]);
        }
    }
    free(plan.blocks);
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
     * without (every forward's) under checkpointing (the recomputes on the
     * weights the AG cache kept), against the run without it (without
     * checkpointing): within the bound, the same all-gathers (calls and
     * bytes); and the two bitwise equal, since every forward is computed
     * shard by shard in one fixed order whether its weight was prefetched
     * or arrives during the products, and a recompute is such a forward
     * (docs/linear.md) */
    result cm[2]; /* OAG off with checkpointing, OAG on */
    memset(cm, 0, sizeof cm);
    for (int oag = 1; shape.z > 1 && oag >= 0; oag--) {
        result *c = &cm[oag];
        ff_gpt_opts_default(&o);
        o.linear.oag = oag;
        if (!oag) {
            free(a0.grads);
            if ((rc = run(grid, &o, &a0)))
                break;
            /* (the recomputes gather nothing: the AG cache keeps each
             * forward's weight, so the all-gathers stay a0's) */
            o.checkpoint = 1;
        }
        o.linear.cmm = 1;
        rc = run(grid, &o, c);
        CHECK(rc == FF_OK, "%s, cmm: %s", desc, ff_ctx_error(ctx));
        if (rc == FF_OK && rank == 0) {
            char what[48];
            snprintf(what, sizeof what, "cmm, OAG %s", oag ? "on" : "off, checkpointing");
            double worst = within_bound(c, &a0, tol, desc, what);
            CHECK(c->ag[0] == a0.ag[0] && c->ag[1] == a0.ag[1] && c->ag[2] == a0.ag[2],
                  "%s, %s: Z all-gathers %llu calls %llu bytes, without %llu calls %llu bytes",
                  desc, what, c->ag[0], c->ag[1], a0.ag[0], a0.ag[1]);
            /* with OAG the run's first gather is the embedding's lookup,
             * not a product, and every other is prefetched: none runs
             * beside its gather then (the products are still sliced) */
            CHECK((oag ? c->cmm == 0 : c->cmm > 0) && a0.cmm == 0,
                  "%s, %s: %ld collective matmuls (%ld without)", desc, what, c->cmm, a0.cmm);
            printf("  %-34s %s: %ld collective matmuls, %s (error/bound %.3f)%s\n", desc, what,
                   c->cmm, bitwise(c, &a0) ? "bitwise" : "bounded", worst,
                   oag                  ? ""
                   : bitwise(c, &cm[1]) ? "; bitwise OAG on"
                                        : "");
            if (!oag) {
                const size_t at = first_diff(c, &cm[1]);
                CHECK(bitwise(c, &cm[1]),
                      "%s: the collective matmul with OAG off and checkpointing (%ld of them: "
                      "gathers during the products, recomputes) differs from OAG on (prefetched, "
                      "no recompute): loss %.9g and %.9g, gradient %zu %.9g and %.9g",
                      desc, c->cmm, c->loss, cm[1].loss, at, at < c->n ? c->grads[at] : 0.0,
                      at < c->n ? cm[1].grads[at] : 0.0);
            }
        }
    }
    CHECK(rc == FF_OK, "%s, cmm: %s", desc, ff_ctx_error(ctx));
    free(cm[0].grads), free(cm[1].grads);

    /* 5: the reduce-scatter collective matmul */
    /* (bf16-mixed only where Gd > 1, 4 of the 10 grids: CI's time) */
    for (int bf16 = 0; shape.z > 1 && bf16 <= (shape.d > 1); bf16++)
        rs_cmm_check(grid, desc, tol, bf16);
    if (shape.z > 1) {
        result rp = {0};
        ff_gpt_opts_default(&o);
        rc = mixed_plan(&plan, shape);
        for (int l = 0; rc == FF_OK && l < cfg.L; l++)
            for (int i = 0; i < FF_BLOCK_LAYERS; i++) {
                plan.blocks[l].layer[i].decompose = 0;
                plan.blocks[l].layer[i].rs_cmm = (l + i) % 2;
            }
        plan.head.decompose = 0;
        o.plan = &plan;
        if (rc == FF_OK)
            rc = run(grid, &o, &rp);
        CHECK(rc == FF_OK, "%s, rs-cmm plan: %s", desc, ff_ctx_error(ctx));
        CHECK(rc || !rp.plan_missed, "%s, rs-cmm plan: %d layers not as planned: %s", desc,
              rp.plan_missed, rp.why);
        if (rc == FF_OK && rank == 0) {
            double worst = within_bound(&rp, &a0, tol, desc, "rs-cmm plan");
            CHECK(rp.rs_cmm == rp.rs_cmm_want && rp.rs_cmm > 0 &&
                      rp.rs_cmm < (long)ff_ctx_size(ctx) * 4 * cfg.L,
                  "%s, rs-cmm plan: %ld reduce-scatter collective matmuls, want %ld", desc,
                  rp.rs_cmm, rp.rs_cmm_want);
            CHECK(memcmp(rp.rs, a0.rs, sizeof rp.rs) == 0,
                  "%s, rs-cmm plan: Z reduce-scatters %llu calls %llu bytes, without %llu %llu",
                  desc, rp.rs[0], rp.rs[1], a0.rs[0], a0.rs[1]);
            printf("  %-34s rs-cmm plan: %ld of them, %s (error/bound %.3f)\n", desc, rp.rs_cmm,
                   bitwise(&rp, &a0) ? "bitwise" : "bounded", worst);
        }
        free(plan.blocks);
        free(rp.grads);
    }
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
