/* SAMO (issue 28, docs/samo.md): compressed gradients and AdamW moments
 * against masked training, which test_prune checks against the serial
 * program. Run on 8 ranks, on every grid of 8, two MoE grids (expert
 * replicas of 2 and 1), two grids of 2 pipeline stages (the tied
 * embedding's two copies, with the embedding pruned too) and two grids of
 * one stage with the embedding pruned (one compressed wte gradient that the
 * LM head and the lookup both add to): two models from the same
 * initialisation and the same global 0.8 mask, one masked, one with
 * ff_gpt_samo, STEPS AdamW steps of two micro-batches each; the arithmetic
 * of every kept entry is the same (docs/samo.md), so after every step
 *   - the losses and gradient norms are bitwise equal, and the parameters,
 *     gradients and both AdamW moments gathered to canonical layout are
 *     bitwise equal (a pruned gradient is -0 or +0) and pruned parameters
 *     exactly zero;
 *   - the bytes sent over D are equal, and equal the kept entries' exact
 *     ring count 8 (D - 1) per kept entry of the replica's Z-sharded weights
 *     per step (f x the dense bytes);
 *   - each rank's model state is the derived formula: SAMO's parameters
 *     4 n, gradients 4 (n - nz + z0 + k), moments 8 (n - nz + z0 + k),
 *     offsets 4 k, masked training's mask and packing 4 n + 8 (k + z0) with
 *     D > 1 (dense models), where n is the dense model's parameters, nz the
 *     rank's linear weight shards, z0 its wte shard if nothing of it is
 *     pruned (kept dense) and k the other kept entries of its shards,
 *     counted here from the canonical mask and each shard entry's canonical
 *     index (ff_linear_canonical_index); summed over a replica, k + z0 is
 *     the mask's kept count of the Z-sharded weights;
 *   - what is allocated, measured by the library's allocator
 *     (ff_fbuf_live_bytes, src/device.c: the float buffers, whichever way
 *     they were made) around each model's set-up and the allocation of its
 *     AdamW moments: the masked model holds exactly
 *     12 (n - dense) + 4 n + 4 packed bytes more than the SAMO model
 *     (dense = n - nz + z0 + k: its dense gradients and moments against
 *     SAMO's dense rest and compressed entries, the float mask, the
 *     packing's float buffer); the 32-bit offsets (the packing's, SAMO's)
 *     are malloc'd and not in that count, and nothing else differs before
 *     the first step (the layers' pools, which SAMO with Gz = 1 uses more,
 *     fill in the steps);
 *   - what the steps allocate and keep (ff_fbuf_live_bytes after them less
 *     before) is exactly the two models' layers' pools as ff_gpt_memory
 *     counts them (linear_held: the buffers in use and kept for reuse, as
 *     allocated), at least their peaks in use (linear_peak);
 * and, on one grid, pruned weights zero again after ff_gpt_init and a
 * scatter of dense values under SAMO, and the refusals: ff_gpt_samo without
 * a mask, a mask that prunes a bias, and a mask changed under SAMO, each on
 * every rank. */
#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "device.h" /* ff_fbuf_live_bytes: the library's allocator, internal */
#include "fourfold/fourfold.h"
#include "nn/gpt_internal.h" /* the bf16 copy, compared directly */
#include "test_util.h"

enum { B = 8, T = 16, STEPS = 3, MICRO = 2, MAX_GRIDS = 32 };
static const ff_gpt_config CFG = {.L = 2, .C = 32, .NH = 8, .V = 64, .Vp = 64, .maxT = 16};
/* SAMO with ZeRO on 2x1x2x2: wide enough that a rank's chunk of a bucket
 * spans more than one of the gradient norm's blocks (FF_SUM_BLOCK), so
 * that blocks owned whole by one rank of D are summed, besides straddling
 * ones (as zero_np8's C = 128) */
static const ff_gpt_config ZCFG = {.L = 2, .C = 128, .NH = 8, .V = 64, .Vp = 64, .maxT = 16};

static int32_t token_at(int64_t s, int64_t t)
{
    return (int32_t)(ff_rng_uniform(13, 7, (uint64_t)(s * (T + 1) + t)) * CFG.V);
}

/* step s's MICRO micro-batches of this rank's count sequences from first,
 * rows micro-batch rows apart: the tokens and their next tokens */
static void fill_batch(int32_t *tok, int32_t *tgt, int s, int64_t first, int64_t count,
                       int64_t rows)
{
    for (int u = 0; u < MICRO; u++)
        for (int64_t q = 0; q < count; q++)
            for (int t = 0; t < T; t++) {
                int64_t seq = ((int64_t)s * MICRO + u) * B + first + q;
                tok[u * rows + q * T + t] = token_at(seq, t);
                tgt[u * rows + q * T + t] = token_at(seq, t + 1);
            }
}

/* The global mask of sparsity p (the embedding too with `embedding`) of
 * the model initialised from 1234, on rank 0 alone; its Z-sharded kept
 * entries (wte and the weight matrices) into *kept_z, its entries into *n. */
static unsigned char *make_mask(const ff_gpt_config *c, int embedding, double *kept_z,
                                uint64_t *n_out)
{
    ff_ctx *self = NULL;
    ff_grid *one = NULL;
    ff_gpt *g = NULL;
    ff_ctx_options co;
    ff_ctx_options_default(&co);
    co.device = "cpu";
    unsigned char *keep = NULL;
    if (ff_ctx_create(&self, MPI_COMM_SELF, &co) == FF_OK &&
        ff_grid_create(self, (ff_dims){1, 1, 1, 1}, &one) == FF_OK &&
        ff_gpt_create(one, c, NULL, B, T, &g) == FF_OK && ff_gpt_init(g, 1234) == FF_OK) {
        size_t n = ff_gpt_canonical_size(g);
        *n_out = n;
        float *canon = malloc(n * sizeof *canon);
        keep = malloc(n);
        memset(keep, 1, n);
        ff_prune_opts o = {.sparsity = 0.8, .embedding = embedding};
        char err[256];
        if (ff_gpt_gather(g, FF_GPT_PARAMS, canon, 0) != FF_OK ||
            ff_prune(g, canon, &o, keep, NULL, NULL, err, sizeof err) != FF_OK)
            CHECK(0, "pruning the probe failed");
        *kept_z = 0;
        for (int i = 0, off = 0; i < FF_GPT_NTENSORS; off += (int)ff_gpt_tensor_size(g, i), i++) {
            const char *nm = ff_gpt_tensor_name(i);
            if (!strcmp(nm, "wte") || strstr(nm, "qkvw") || strstr(nm, "attprojw") ||
                !strcmp(nm, "fcw") || !strcmp(nm, "fcprojw") || !strcmp(nm, "efcw") ||
                !strcmp(nm, "efcprojw"))
                for (size_t j = (size_t)off; j < (size_t)off + ff_gpt_tensor_size(g, i); j++)
                    *kept_z += keep[j];
        }
        free(canon);
    } else {
        CHECK(0, "the probe model failed");
    }
    ff_gpt_destroy(g);
    ff_grid_destroy(one);
    ff_ctx_destroy(self);
    return keep;
}

typedef struct {
    ff_dims shape;
    int stages, ge, moe, embedding;
} grid_case;

/* Canonical offset of tensor `name`. */
static size_t tensor_off(ff_gpt *g, const char *name)
{
    size_t off = 0;
    for (int i = 0; i < FF_GPT_NTENSORS && strcmp(ff_gpt_tensor_name(i), name); i++)
        off += ff_gpt_tensor_size(g, i);
    return off;
}

/* By the test's reading of the layout (include/fourfold/gpt.h): the rank's
 * linear weight shards (*nz entries: the Z-sharded part of its flat
 * buffer), the kept entries of them that SAMO compresses (*k) and wte's
 * shard where nothing of it is pruned (*z0, kept dense), from the canonical
 * mask and each shard entry's canonical index. */
static void rank_counts(ff_gpt *g, const ff_gpt_config *c, const unsigned char *keep, size_t *nz,
                        size_t *k, size_t *z0, size_t *kblk, size_t *kwte)
{
    ff_linear_seq *s = ff_gpt_linear_seq(g);
    const size_t C = (size_t)c->C;
    *nz = *k = *z0 = 0;
    for (int i = 0; ff_linear_seq_layer(s, i); i++) {
        ff_linear *l = ff_linear_seq_layer(s, i);
        const char *name = ff_linear_name(l);
        int blk = 0, e = 0;
        char what[16] = "";
        size_t base = 0;
        if (!strcmp(name, "wte")) {
            base = 0;
        } else if (sscanf(name, "h%d.e%d.%15s", &blk, &e, what) == 3) {
            int m = 0; /* MoE blocks before blk */
            for (int b = 0; b < blk; b++)
                m += ff_gpt_block_is_moe(c, b);
            size_t per = 4 * C * C;
            base = tensor_off(g, strcmp(what, "fc") ? "efcprojw" : "efcw") +
                   ((size_t)m * c->experts + (size_t)e) * per;
        } else if (sscanf(name, "h%d.%15s", &blk, what) == 2) {
            int d = 0; /* dense blocks before blk (fcw, fcprojw hold those only) */
            for (int b = 0; b < blk; b++)
                d += !ff_gpt_block_is_moe(c, b);
            if (!strcmp(what, "qkv"))
                base = tensor_off(g, "qkvw") + (size_t)blk * 3 * C * C;
            else if (!strcmp(what, "attproj"))
                base = tensor_off(g, "attprojw") + (size_t)blk * C * C;
            else
                base =
                    tensor_off(g, strcmp(what, "fc") ? "fcprojw" : "fcw") + (size_t)d * 4 * C * C;
        }
        const size_t shard = ff_linear_local_sizes(l).w_shard;
        size_t kept = 0;
        for (size_t x = 0; x < shard; x++)
            kept += keep[base + (size_t)ff_linear_canonical_index(l, x)];
        *nz += shard;
        /* (for ZeRO's slices: each dense block's kept entries, wte's) */
        if (kblk && !strcmp(name, "wte"))
            *kwte = kept;
        else if (kblk && strchr(name, '.') && !strstr(name, ".e"))
            kblk[blk] += kept;
        if (!strcmp(name, "wte") && kept == shard)
            *z0 = shard;
        else
            *k += kept;
    }
}

/* Bitwise equal, but for the sign of zero: masked training's pruned
 * gradients are g x 0 (-0 for a negative g), SAMO's are not stored (+0). */
static int bits_equal(const float *a, const float *b, size_t n, size_t *first)
{
    for (size_t i = 0; i < n; i++)
        if (memcmp(&a[i], &b[i], sizeof(float)) && !(a[i] == 0.0f && b[i] == 0.0f)) {
            *first = i;
            return 0;
        }
    return 1;
}

/* Masked and SAMO side by side on one grid; returns FF_OK or the first failure. */
static int run_case(ff_ctx *ctx, const grid_case *gc, const ff_gpt_config *cfg,
                    const unsigned char *keep, double kept_z, ff_precision prec, const char *desc0)
{
    const int rank = ff_ctx_rank(ctx), root = rank == 0, bf16 = prec == FF_PRECISION_BF16_MIXED;
    char desc[96];
    snprintf(desc, sizeof desc, "%s%s", desc0, bf16 ? " bf16-mixed" : "");
    ff_grid *grid = NULL;
    ff_gpt *g[2] = {NULL, NULL}; /* masked, SAMO */
    ff_gpt_opts go;
    ff_gpt_opts_default(&go);
    go.expert_parallel = gc->ge;
    go.precision = prec;
    go.bf16_products = FF_BF16_PRODUCTS_EMULATED; /* (the same products for both models) */
    int rc = gc->stages > 1 ? ff_grid_create_staged(ctx, gc->shape, gc->stages, &grid)
                            : ff_grid_create(ctx, gc->shape, &grid);
    /* the allocator's live bytes: before, after each model's set-up, after
     * the SAMO switch */
    size_t live[4] = {ff_fbuf_live_bytes(), 0, 0, 0};
    for (int k = 0; k < 2 && rc == FF_OK; k++) {
        if ((rc = ff_gpt_create(grid, cfg, &go, B, T, &g[k])) == FF_OK &&
            (rc = ff_gpt_init(g[k], 1234)) == FF_OK)
            rc = ff_gpt_set_mask(g[k], root ? keep : NULL, 0);
        live[k + 1] = ff_fbuf_live_bytes();
    }
    if (rc == FF_OK)
        rc = ff_gpt_samo(g[1]);
    live[3] = ff_fbuf_live_bytes();
    if (rc) {
        CHECK(0, "%s: %s", desc, ff_ctx_error(ctx));
        ff_gpt_destroy(g[0]), ff_gpt_destroy(g[1]);
        ff_grid_destroy(grid);
        return rc;
    }
    CHECK(ff_gpt_is_samo(g[1]) && !ff_gpt_is_samo(g[0]) && ff_gpt_has_mask(g[1]),
          "%s: the SAMO switch", desc);

    /* the model state, against the formula with k and z0 counted here */
    ff_gpt_memory md, ms;
    ff_gpt_memory_report(g[0], &md);
    ff_gpt_memory_report(g[1], &ms);
    size_t nz = 0, k = 0, z0 = 0, packed = 0;
    rank_counts(g[1], cfg, keep, &nz, &k, &z0, NULL, NULL);
    const size_t n = md.grads / 4, copy = bf16 ? (size_t)FF_BF16_COPY_BYTES * nz : 0;
    /* masked training packs the kept entries of every bucket it all-reduces
     * over D (without experts: all the Z-sharded weights) */
    if (!gc->moe && gc->shape.d > 1)
        packed = k + z0;
    CHECK(md.params == 4 * n + copy && md.adam == 8 * n &&
              (gc->moe || md.mask == 4 * n + 8 * packed),
          "%s: masked state %zu %zu %zu bytes, mask and packing %zu, for %zu parameters (%zu "
          "packed)",
          desc, md.params, md.grads, md.adam, md.mask, n, packed);
    /* the dense state and the compressed entries; in bf16-mixed the master
     * too (the dissertation's eq. 4.1 with fp32 gradients), beside the
     * uncompressed bf16 copy of the Z-sharded weights */
    const size_t dense = n - nz + z0 + k, master = bf16 ? dense : n;
    CHECK(ms.params == 4 * master + copy && ms.grads == 4 * dense && ms.adam == 8 * dense &&
              ms.mask == 4 * k,
          "%s: SAMO state params %zu grads %zu adam %zu offsets %zu bytes, the formula %zu %zu "
          "%zu %zu (n %zu, nz %zu, wte dense %zu, k %zu)",
          desc, ms.params, ms.grads, ms.adam, ms.mask, 4 * master + copy, 4 * dense, 8 * dense,
          4 * k, n, nz, z0, k);
    /* without stages and expert parallelism every Z-sharded weight lives
     * on one rank of each replica */
    ff_dims me = ff_grid_coords(grid);
    double mine = me.d == 0 ? (double)(k + z0) : 0, sum = 0;
    MPI_Allreduce(&mine, &sum, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
    if (gc->stages == 1 && gc->ge == 1)
        CHECK(sum == kept_z, "%s: %.0f kept weights over a replica, the mask keeps %.0f", desc, sum,
              kept_z);

    const size_t cn = ff_gpt_canonical_size(g[0]);
    float *buf[2] = {root ? calloc(cn, sizeof(float)) : NULL,
                     root ? calloc(cn, sizeof(float)) : NULL};
    /* what is allocated: the moments are made at their first use (here a
     * gather; zeros, as the first step would make them) */
    size_t moments[2] = {0, 0};
    for (int v = 0; v < 2 && rc == FF_OK; v++) {
        const size_t before = ff_fbuf_live_bytes();
        rc = ff_gpt_gather(g[v], FF_GPT_ADAM_M, buf[v], 0);
        moments[v] = ff_fbuf_live_bytes() - before;
    }
    if (rc == FF_OK) {
        /* entries the masked model packs: md.mask is 4 n + 8 of them (checked
         * above where the test counts them itself), 4 bytes each malloc'd */
        const size_t pk = gc->moe ? (md.mask - 4 * n) / 8 : packed;
        const size_t made[2] = {live[1] - live[0] + moments[0], live[3] - live[1] + moments[1]};
        const long long want = (long long)(12 * (n - dense) + 4 * n + 4 * pk + 4 * (n - master)),
                        less = (long long)made[0] - (long long)made[1];
        CHECK(live[2] - live[1] == live[1] - live[0] && less == want,
              "%s: allocated %zu bytes for the masked model, %zu for SAMO's (%zu before its "
              "switch, moments %zu and %zu): %lld less, the formula 12 (n - dense) + 4 n + 4 "
              "packed (+ 4 (n - dense) in bf16-mixed) = %lld (n %zu, dense %zu, packed %zu)",
              desc, made[0], made[1], live[2] - live[1], moments[0], moments[1], less, want, n,
              dense, pk);
        if (root)
            printf(
                "  %-44s rank 0 allocated %zu bytes masked, %zu SAMO: %lld less (formula %lld)\n",
                desc, made[0], made[1], less, want);
    }

    int first = 0, count = 0;
    ff_gpt_local_sequences(g[0], &first, &count);
    const int m = count * T;
    int32_t *tok = malloc((size_t)MICRO * m * sizeof *tok);
    int32_t *tgt = malloc((size_t)MICRO * m * sizeof *tgt);
    ff_group *gd = ff_grid_group(grid, FF_GROUP_D);
    double sent[2] = {0, 0};
    ff_adamw h;
    ff_adamw_default(&h);
    h.lr = 3e-3f;
    h.warmup = 1;
    h.steps = STEPS;
    const ff_gpt_buffer which[4] = {FF_GPT_PARAMS, FF_GPT_GRADS, FF_GPT_ADAM_M, FF_GPT_ADAM_V};
    const char *names[4] = {"parameters", "gradients", "AdamW m", "AdamW v"};
    /* what the steps allocate and keep is the layers' pool (everything
     * else was made before): ff_gpt_memory's linear_held, as allocated */
    const size_t live_steps = ff_fbuf_live_bytes();
    for (int s = 0; s < STEPS && rc == FF_OK; s++) {
        fill_batch(tok, tgt, s, first, count, m);
        ff_gpt_step_info info[2];
        for (int v = 0; v < 2 && rc == FF_OK; v++) {
            ff_group_counters_reset(gd);
            rc = ff_gpt_step(g[v], tok, tgt, MICRO, &h, s, &info[v]);
            sent[v] = (double)ff_group_counters(gd, FF_COLL_ALLREDUCE).bytes_sent;
        }
        if (rc)
            break;
        CHECK(!memcmp(&info[0].loss, &info[1].loss, sizeof(float)) &&
                  !memcmp(&info[0].grad_norm, &info[1].grad_norm, sizeof(float)),
              "%s step %d: loss %.9g norm %.9g masked, %.9g %.9g SAMO", desc, s, info[0].loss,
              info[0].grad_norm, info[1].loss, info[1].grad_norm);
        double tot[2];
        MPI_Allreduce(sent, tot, 2, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
        CHECK(tot[0] == tot[1], "%s step %d: %.0f bytes over D masked, %.0f SAMO", desc, s, tot[0],
              tot[1]);
        if (gc->stages == 1 && !gc->moe)
            CHECK(tot[1] == 8.0 * (gc->shape.d - 1) * kept_z,
                  "%s step %d: %.0f bytes over D, the kept entries' ring count %.0f", desc, s,
                  tot[1], 8.0 * (gc->shape.d - 1) * kept_z);
        /* the copies the products read, on every rank (the pruned weights +0) */
        CHECK(!bf16 || (g[0]->n_zsharded == g[1]->n_zsharded &&
                        !memcmp(g[0]->wbf16, g[1]->wbf16, g[0]->n_zsharded * FF_BF16_COPY_BYTES)),
              "%s step %d rank %d: the bf16 copies differ", desc, s, rank);
        for (int w = 0; w < 4 && rc == FF_OK; w++) {
            for (int v = 0; v < 2 && rc == FF_OK; v++)
                rc = ff_gpt_gather(g[v], which[w], buf[v], 0);
            size_t at = 0, pruned_nonzero = 0;
            for (size_t i = 0; root && w == 0 && i < cn; i++)
                pruned_nonzero += !keep[i] && buf[1][i] != 0.0f;
            CHECK(rc || !root || bits_equal(buf[0], buf[1], cn, &at),
                  "%s step %d: %s differ at canonical %zu: %.9g masked, %.9g SAMO", desc, s,
                  names[w], at, root ? buf[0][at] : 0.0, root ? buf[1][at] : 0.0);
            CHECK(pruned_nonzero == 0, "%s step %d: %zu pruned weights not zero", desc, s,
                  pruned_nonzero);
        }
    }
    if (rc)
        CHECK(0, "%s: %s", desc, ff_ctx_error(ctx));
    else {
        ff_gpt_memory m0, m1;
        ff_gpt_memory_report(g[0], &m0);
        ff_gpt_memory_report(g[1], &m1);
        const size_t grown = ff_fbuf_live_bytes() - live_steps;
        CHECK(grown == m0.linear_held + m1.linear_held && m0.linear_held >= m0.linear_peak &&
                  m1.linear_held >= m1.linear_peak,
              "%s rank %d: the steps kept %zu bytes; the layers' pools count %zu + %zu (peaks in "
              "use %zu, %zu)",
              desc, rank, grown, m0.linear_held, m1.linear_held, m0.linear_peak, m1.linear_peak);
    }
    free(tok), free(tgt), free(buf[0]), free(buf[1]);
    ff_gpt_destroy(g[0]), ff_gpt_destroy(g[1]);
    ff_grid_destroy(grid);
    return rc;
}

/* Chunk q of n entries cut into p as the ring all-reduce cuts them: the
 * first n mod p one longer. */
static size_t chunk_of(size_t n, int p, int q)
{
    return n / (size_t)p + ((size_t)q < n % (size_t)p);
}

/* SAMO with ZeRO over D (docs/samo.md "SAMO with ZeRO"): a SAMO model with
 * --zero 0 and one with `zero` from the same initialisation and mask
 * train STEPS steps; after each the losses and norms, the parameters,
 * gradients and both moments gathered, and on every rank the bf16 copies
 * are bitwise equal; the bytes over D are the all-reduce's, as its
 * reduce-scatter and all-gather halves (the gather of 2-byte values in
 * bf16-mixed: half of them); each rank's state is the formula (without
 * experts): the moments 8 (s0 + s1) with s0 = n - nz (+ the rank's chunk
 * of wte's shard where it is dense) and s1 = the rank's chunk of each
 * range's kept entries (the blocks', a pruned wte's), gradients 4 (n - nz
 * + z0 + k) as --zero 0's, offsets 4 k, parameters 4 n + 4 k in fp32 (the
 * dense weights and the staging vector of the gathers after AdamW) and
 * 4 (s0 + s1) + c nz + 4 ceil(k / 2) in bf16-mixed (the master's slices,
 * the copy, the 2-byte staging vector). */
static int run_zero_case(ff_ctx *ctx, const grid_case *gc, const ff_gpt_config *cfg,
                         const unsigned char *keep, ff_precision prec, int zero, const char *desc0)
{
    const int root = ff_ctx_rank(ctx) == 0, bf16 = prec == FF_PRECISION_BF16_MIXED;
    char desc[128];
    snprintf(desc, sizeof desc, "%s zero %d%s", desc0, zero, bf16 ? " bf16-mixed" : "");
    ff_grid *grid = NULL;
    ff_gpt *g[2] = {NULL, NULL}; /* --zero 0, --zero `zero` */
    int rc = gc->stages > 1 ? ff_grid_create_staged(ctx, gc->shape, gc->stages, &grid)
                            : ff_grid_create(ctx, gc->shape, &grid);
    for (int v = 0; v < 2 && rc == FF_OK; v++) {
        ff_gpt_opts go;
        ff_gpt_opts_default(&go);
        go.expert_parallel = gc->ge;
        go.precision = prec;
        go.bf16_products = FF_BF16_PRODUCTS_EMULATED;
        go.zero = v ? zero : 0;
        if ((rc = ff_gpt_create(grid, cfg, &go, B, T, &g[v])) == FF_OK &&
            (rc = ff_gpt_init(g[v], 1234)) == FF_OK &&
            (rc = ff_gpt_set_mask(g[v], root ? keep : NULL, 0)) == FF_OK)
            rc = ff_gpt_samo(g[v]);
    }
    if (rc) {
        CHECK(0, "%s: %s", desc, ff_ctx_error(ctx));
        ff_gpt_destroy(g[0]), ff_gpt_destroy(g[1]);
        ff_grid_destroy(grid);
        return rc;
    }
    const ff_dims me = ff_grid_coords(grid);
    if (!gc->moe) { /* the state of the formula */
        ff_gpt_memory m;
        ff_gpt_memory_report(g[1], &m);
        size_t nz = 0, k = 0, z0 = 0, kw = 0, kb[16] = {0};
        rank_counts(g[1], cfg, keep, &nz, &k, &z0, kb, &kw);
        const size_t n = g[1]->n_params, dense = n - nz + z0 + k;
        const int p = gc->shape.d, q = me.d;
        size_t s0 = n - nz + (z0 ? chunk_of(z0, p, q) : 0), s1 = 0, ranged = 0;
        if (!z0 && kw) /* a pruned wte: a compressed range */
            s1 += chunk_of(kw, p, q), ranged += kw;
        for (int l = 0; l < cfg->L && l < 16; l++)
            s1 += chunk_of(kb[l], p, q), ranged += kb[l];
        s1 += k - ranged;
        const size_t copy = bf16 ? (size_t)FF_BF16_COPY_BYTES * nz : 0;
        const size_t params = bf16 ? 4 * (s0 + s1) + copy + 4 * ((k + 1) / 2) : 4 * n + 4 * k;
        CHECK(m.params == params && m.grads == 4 * dense && m.adam == 8 * (s0 + s1) &&
                  m.mask == 4 * k,
              "%s rank %d: state params %zu grads %zu adam %zu offsets %zu bytes, the formula "
              "%zu %zu %zu %zu (n %zu, nz %zu, wte dense %zu, k %zu, slices %zu + %zu)",
              desc, ff_ctx_rank(ctx), m.params, m.grads, m.adam, m.mask, params, 4 * dense,
              8 * (s0 + s1), 4 * k, n, nz, z0, k, s0, s1);
    }
    const size_t cn = ff_gpt_canonical_size(g[0]);
    float *buf[2] = {root ? calloc(cn, sizeof(float)) : NULL,
                     root ? calloc(cn, sizeof(float)) : NULL};
    int first = 0, count = 0;
    ff_gpt_local_sequences(g[0], &first, &count);
    const int mrows = count * T;
    int32_t *tok = malloc((size_t)MICRO * mrows * sizeof *tok);
    int32_t *tgt = malloc((size_t)MICRO * mrows * sizeof *tgt);
    ff_group *gd = ff_grid_group(grid, FF_GROUP_D);
    ff_adamw h;
    ff_adamw_default(&h);
    h.lr = 3e-3f;
    h.warmup = 1;
    h.steps = STEPS;
    const ff_gpt_buffer which[4] = {FF_GPT_PARAMS, FF_GPT_GRADS, FF_GPT_ADAM_M, FF_GPT_ADAM_V};
    const char *names[4] = {"parameters", "gradients", "AdamW m", "AdamW v"};
    for (int s = 0; s < STEPS && rc == FF_OK; s++) {
        fill_batch(tok, tgt, s, first, count, mrows);
        ff_gpt_step_info info[2];
        /* over D: all-reduce (zero 0); reduce-scatter, all-gather, all-reduce */
        double bytes[4] = {0, 0, 0, 0};
        for (int v = 0; v < 2 && rc == FF_OK; v++) {
            ff_group_counters_reset(gd);
            if ((rc = ff_gpt_step(g[v], tok, tgt, MICRO, &h, s, &info[v])) == FF_OK)
                rc = ff_gpt_sync(g[v]); /* (the gathers after AdamW: counted, the copy made) */
            if (v == 0) {
                bytes[0] = (double)ff_group_counters(gd, FF_COLL_ALLREDUCE).bytes_sent;
            } else {
                bytes[1] = (double)ff_group_counters(gd, FF_COLL_REDUCE_SCATTER).bytes_sent;
                bytes[2] = (double)ff_group_counters(gd, FF_COLL_ALLGATHER).bytes_sent;
                bytes[3] = (double)ff_group_counters(gd, FF_COLL_ALLREDUCE).bytes_sent;
            }
        }
        if (rc)
            break;
        CHECK(!memcmp(&info[0].loss, &info[1].loss, sizeof(float)) &&
                  !memcmp(&info[0].grad_norm, &info[1].grad_norm, sizeof(float)),
              "%s step %d: loss %.9g norm %.9g with zero 0, %.9g %.9g", desc, s, info[0].loss,
              info[0].grad_norm, info[1].loss, info[1].grad_norm);
        double tot[4];
        MPI_Allreduce(bytes, tot, 4, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
        /* the ring's two halves send the same floats; the gather's are 2
         * bytes in bf16-mixed. What ZeRO does not slice stays all-reduced:
         * the experts' biases, over D without expert parallelism (EDP is D) */
        const double sliced = tot[0] - tot[3];
        CHECK(sliced > 0 && tot[1] == sliced / 2 && tot[2] == sliced / (bf16 ? 4 : 2) &&
                  (gc->moe || tot[3] == 0),
              "%s step %d: bytes over D %.0f all-reduced with zero 0; reduce-scatter %.0f, "
              "all-gather %.0f, all-reduce %.0f",
              desc, s, tot[0], tot[1], tot[2], tot[3]);
        CHECK(!bf16 || !memcmp(g[0]->wbf16, g[1]->wbf16, g[0]->n_zsharded * FF_BF16_COPY_BYTES),
              "%s step %d rank %d: the bf16 copies differ", desc, s, ff_ctx_rank(ctx));
        for (int w = 0; w < 4 && rc == FF_OK; w++) {
            for (int v = 0; v < 2 && rc == FF_OK; v++)
                rc = ff_gpt_gather(g[v], which[w], buf[v], 0);
            size_t at = 0;
            while (rc == FF_OK && root && at < cn && !memcmp(&buf[0][at], &buf[1][at], 4))
                at++;
            CHECK(rc || !root || at == cn, "%s step %d: %s differ at canonical %zu: %.9g, %.9g",
                  desc, s, names[w], at, root && at < cn ? buf[0][at] : 0.0,
                  root && at < cn ? buf[1][at] : 0.0);
        }
    }
    if (rc)
        CHECK(0, "%s: %s", desc, ff_ctx_error(ctx));
    free(tok), free(tgt), free(buf[0]), free(buf[1]);
    ff_gpt_destroy(g[0]), ff_gpt_destroy(g[1]);
    ff_grid_destroy(grid);
    return rc;
}

/* The refusals, each on every rank with the same code. */
static void refusals(ff_ctx *ctx, const unsigned char *keep, ff_precision prec)
{
    const int root = ff_ctx_rank(ctx) == 0;
    ff_grid *grid = NULL;
    ff_gpt *g = NULL;
    ff_gpt_opts go;
    ff_gpt_opts_default(&go);
    go.precision = prec;
    go.bf16_products = FF_BF16_PRODUCTS_EMULATED;
    if (ff_grid_create(ctx, (ff_dims){2, 1, 2, 2}, &grid) != FF_OK ||
        ff_gpt_create(grid, &CFG, &go, B, T, &g) != FF_OK || ff_gpt_init(g, 1234) != FF_OK) {
        CHECK(0, "refusals: %s", ff_ctx_error(ctx));
        return;
    }
    const size_t n = ff_gpt_canonical_size(g);
    int rc = ff_gpt_samo(g), all;
    MPI_Allreduce(&rc, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    CHECK(rc == FF_EINVAL && all == rc && strstr(ff_ctx_error(ctx), "needs a mask"),
          "SAMO without a mask: %d, '%s'", rc, ff_ctx_error(ctx));
    unsigned char *bad = root ? malloc(n) : NULL;
    if (bad) { /* a bias pruned: the last canonical entry (lnfb) */
        memcpy(bad, keep, n);
        bad[n - 1] = 0;
    }
    rc = ff_gpt_set_mask(g, bad, 0);
    if (rc == FF_OK)
        rc = ff_gpt_samo(g);
    MPI_Allreduce(&rc, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    CHECK(rc == FF_EINVAL && all == rc && strstr(ff_ctx_error(ctx), "other than the weight"),
          "SAMO with a pruned bias: %d, '%s'", rc, ff_ctx_error(ctx));
    rc = ff_gpt_set_mask(g, root ? keep : NULL, 0);
    if (rc == FF_OK)
        rc = ff_gpt_samo(g);
    CHECK(rc == FF_OK, "SAMO with the mask: %s", ff_ctx_error(ctx));
    /* parameters written under SAMO (an initialisation, a scatter of dense
     * values) come back with the pruned weights zero */
    float *canon = root ? malloc(n * sizeof(float)) : NULL;
    for (int w = 0; w < 2 && rc == FF_OK; w++) {
        if (w == 0)
            rc = ff_gpt_init(g, 99);
        for (size_t i = 0; w == 1 && root && i < n; i++)
            canon[i] = 0.5f + (float)(i % 7);
        if (w == 1)
            rc = ff_gpt_scatter(g, FF_GPT_PARAMS, canon, 0);
        if (rc == FF_OK)
            rc = ff_gpt_gather(g, FF_GPT_PARAMS, canon, 0);
        size_t pruned_nonzero = 0, kept_zero = 0;
        for (size_t i = 0; rc == FF_OK && root && i < n; i++) {
            pruned_nonzero += !keep[i] && canon[i] != 0.0f;
            kept_zero += w == 1 && keep[i] && canon[i] == 0.0f;
        }
        CHECK(rc == FF_OK && pruned_nonzero == 0 && kept_zero == 0,
              "%s under SAMO: %zu pruned weights not zero, %zu kept ones zero (%s)",
              w ? "a scatter" : "ff_gpt_init", pruned_nonzero, kept_zero, ff_ctx_error(ctx));
        /* bf16-mixed: the copy, made from the compressed master, is its
         * bf16 values at the kept entries and +0 elsewhere, on every rank */
        size_t wrong = 0;
        uint16_t want;
        for (size_t i = 0; g->wbf16 && i < g->samo_zc0; i++) { /* wte's dense shard */
            ff_bf16_pack(&want, &g->params[i], 1);
            wrong += want != g->wbf16[i];
        }
        for (size_t q = 0, i = g->samo_zc0; g->wbf16 && g->samo_p && q <= g->samo_k; q++) {
            const size_t next = q < g->samo_k ? g->samo_idx[q] : g->n_zsharded;
            for (; i < next; i++)
                wrong += g->wbf16[i] != 0; /* +0 */
            if (q < g->samo_k) {
                ff_bf16_pack(&want, &g->samo_p[q], 1);
                wrong += want != g->wbf16[next];
                i = next + 1;
            }
        }
        CHECK(!g->wbf16 || (g->samo_p && wrong == 0),
              "%s under bf16-mixed SAMO, rank %d: %zu entries of the bf16 copy wrong",
              w ? "a scatter" : "ff_gpt_init", ff_ctx_rank(ctx), wrong);
    }
    free(canon);
    rc = ff_gpt_set_mask(g, root ? keep : NULL, 0);
    MPI_Allreduce(&rc, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    CHECK(rc == FF_EUNSUPPORTED && all == rc && strstr(ff_ctx_error(ctx), "fixed"),
          "a new mask under SAMO: %d, '%s'", rc, ff_ctx_error(ctx));
    free(bad);
    ff_gpt_destroy(g);
    ff_grid_destroy(grid);
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    int world, rank;
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    ff_gpt_config mc = CFG;
    ff_gpt_config_moe(&mc, 4);
    double kept[4] = {0, 0, 0, 0};
    uint64_t nk[4] = {0, 0, 0, 0};
    unsigned char *keep[4] = {NULL, NULL, NULL, NULL}; /* dense, dense with wte, MoE, ZCFG */
    if (rank == 0) {
        printf("model L=%d C=%d NH=%d V=%d, B=%d T=%d; %d AdamW steps of %d micro-batches, "
               "masked and SAMO with the global 0.8 mask, per grid\n",
               CFG.L, CFG.C, CFG.NH, CFG.V, B, T, STEPS, MICRO);
        keep[0] = make_mask(&CFG, 0, &kept[0], &nk[0]);
        keep[1] = make_mask(&CFG, 1, &kept[1], &nk[1]);
        keep[2] = make_mask(&mc, 0, &kept[2], &nk[2]);
        keep[3] = make_mask(&ZCFG, 0, &kept[3], &nk[3]);
    }
    MPI_Bcast(kept, 4, MPI_DOUBLE, 0, MPI_COMM_WORLD);
    /* every rank counts its own kept entries from the masks */
    MPI_Bcast(nk, 4, MPI_UINT64_T, 0, MPI_COMM_WORLD);
    for (int i = 0; i < 4; i++) {
        const uint64_t n = nk[i];
        if (rank != 0)
            keep[i] = malloc(n ? n : 1);
        MPI_Bcast(keep[i], (int)n, MPI_UNSIGNED_CHAR, 0, MPI_COMM_WORLD);
    }
    ff_ctx *ctx;
    ff_ctx_options wo;
    ff_ctx_options_default(&wo);
    wo.algo = "ring"; /* the byte count below is the ring's */
    if (ff_ctx_create(&ctx, MPI_COMM_WORLD, &wo) != FF_OK) {
        CHECK(0, "context: %s", ff_ctx_error(ctx));
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    ff_dims grids[MAX_GRIDS];
    int ng = test_all_grids(world, grids, MAX_GRIDS), ran = 0;
    for (int i = 0; i < ng && i < MAX_GRIDS; i++) {
        if (CFG.NH % grids[i].x || B % (grids[i].z * grids[i].d))
            continue;
        char desc[64];
        snprintf(desc, sizeof desc, "%dx%dx%dx%d", grids[i].x, grids[i].y, grids[i].z, grids[i].d);
        grid_case gc = {grids[i], 1, 1, 0, 0};
        for (int p = 0; p < 2; p++)
            ran += run_case(ctx, &gc, &CFG, keep[0], kept[0],
                            p ? FF_PRECISION_BF16_MIXED : FF_PRECISION_FP32, desc) == FF_OK;
    }
    const struct {
        grid_case gc;
        int mask;
        const char *desc;
    } more[] = {
        {{{2, 1, 1, 4}, 1, 2, 1, 0}, 2, "MoE 2x1x1x4, expert parallelism 2"},
        {{{1, 2, 1, 4}, 1, 1, 1, 0}, 2, "MoE 1x2x1x4, no expert parallelism"},
        {{{1, 1, 2, 2}, 2, 1, 0, 1}, 1, "2 stages of 1x1x2x2, the embedding pruned"},
        {{{2, 1, 1, 2}, 2, 1, 0, 1}, 1, "2 stages of 2x1x1x2, the embedding pruned"},
        /* one stage: the lookup and the LM head share one compressed wte
         * (Gz = 1: its pool block held through the backward; Gz = 2: the
         * reduce-scatter added into the kept entries) */
        {{{1, 2, 1, 4}, 1, 1, 0, 1}, 1, "1x2x1x4, the embedding pruned"},
        {{{2, 1, 2, 2}, 1, 1, 0, 1}, 1, "2x1x2x2, the embedding pruned"},
    };
    for (size_t i = 0; world == 8 && i < sizeof more / sizeof *more; i++)
        for (int p = 0; p < 2; p++)
            ran += run_case(ctx, &more[i].gc, more[i].mask == 2 ? &mc : &CFG, keep[more[i].mask],
                            kept[more[i].mask], p ? FF_PRECISION_BF16_MIXED : FF_PRECISION_FP32,
                            more[i].desc) == FF_OK;
    for (int p = 0; world == 8 && p < 2; p++)
        refusals(ctx, keep[0], p ? FF_PRECISION_BF16_MIXED : FF_PRECISION_FP32);
    /* SAMO with ZeRO: every grid with D > 1 (or those named: the sanitizer
     * build's subset), fp32 with --zero 1 and bf16-mixed with --zero 2 on
     * one grid, the other way on the next; then experts, stages and a
     * pruned embedding */
    int zran = 0, zwant = 0;
    for (int i = 0, at = 0; i < ng && i < MAX_GRIDS; i++) {
        char desc[64];
        snprintf(desc, sizeof desc, "%dx%dx%dx%d", grids[i].x, grids[i].y, grids[i].z, grids[i].d);
        int named = argc <= 1;
        for (int a = 1; a < argc; a++)
            named |= !strcmp(argv[a], desc);
        if (grids[i].d < 2 || CFG.NH % grids[i].x || B % (grids[i].z * grids[i].d) || !named)
            continue;
        grid_case gc = {grids[i], 1, 1, 0, 0};
        const int wide = !strcmp(desc, "2x1x2x2");
        if (wide)
            strcat(desc, " C=128");
        for (int p = 0; p < 2; p++, zwant++)
            zran += run_zero_case(ctx, &gc, wide ? &ZCFG : &CFG, keep[wide ? 3 : 0],
                                  p ? FF_PRECISION_BF16_MIXED : FF_PRECISION_FP32,
                                  1 + ((p + at) % 2), desc) == FF_OK;
        at++;
    }
    for (size_t i = 0; world == 8 && argc <= 1 && i < sizeof more / sizeof *more; i++)
        for (int p = 0; p < 2; p++, zwant++)
            zran +=
                run_zero_case(ctx, &more[i].gc, more[i].mask == 2 ? &mc : &CFG, keep[more[i].mask],
                              p ? FF_PRECISION_BF16_MIXED : FF_PRECISION_FP32, 1 + p,
                              more[i].desc) == FF_OK;
    if (rank == 0)
        printf("%d of %d cases: SAMO with ZeRO over D bitwise SAMO with --zero 0 (losses, norms, "
               "parameters, gradients, moments, bf16 copies after each of %d steps), the "
               "all-reduce's bytes as reduce-scatter and all-gather, the state of the formula\n",
               zran, zwant, STEPS);
    CHECK(zran == zwant && zwant > 0, "SAMO with ZeRO: %d of %d cases passed", zran, zwant);
    if (rank == 0)
        printf(
            "%d grids: SAMO bitwise masked training (losses, norms, parameters, gradients, "
            "moments after each of %d steps), the same bytes over D (%.0f kept Z-sharded "
            "weights per replica, ring), the model state of the formula and what the allocator has "
            "live as it says, on every rank\n",
            ran, STEPS, kept[0]);
    CHECK(ran >= 52 || world != 8, "only %d grids of 8 (fp32 and bf16-mixed) passed", ran);
    for (int i = 0; i < 4; i++)
        free(keep[i]);
    ff_ctx_destroy(ctx);
    int code = test_finish("samo");
    MPI_Finalize();
    return code;
}
