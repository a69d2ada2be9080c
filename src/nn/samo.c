/* SAMO: sparse model states for a pruned model (fourfold/prune.h,
 * docs/samo.md; the dissertation's chapter 4).
 *
 * The weights the products use stay dense (pruned entries exactly zero), so
 * the BLAS runs as before; the Z-sharded weights' gradient and AdamW moments
 * live only at the kept entries, all three indexed by one array of 32-bit
 * offsets into the rank's Z-sharded weights. Every kept entry goes through
 * the arithmetic masked training gives it, so a SAMO run is bitwise a
 * masked run (tests/test_samo.c): the linear layers add their gradient
 * contributions into the compressed entries (linear.c), the data-parallel
 * all-reduces send the compressed ranges as masked training packs them,
 * AdamW shares its per-entry code with the dense pass, and the gradient
 * norm sums the compressed squares in the dense pass's blocks and lanes. */
#include <stdlib.h>
#include <string.h>

#include "device.h"
#include "fourfold/prune.h"
#include "gpt_internal.h"
#include "gpt_ops.h"
#include "passes.h"
#include "util/team.h"

size_t ff_gpt_samo_lower(const ff_gpt *g, size_t off)
{
    size_t lo = 0, hi = g->samo_k;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (g->samo_idx[mid] < off)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

/* ---- the gradient norm ------------------------------------------------------------ */

typedef struct {
    const ff_gpt *g;
    size_t a, b; /* the dense offsets */
    double *part;
} sumsq_samo_job;

/* Dense block bl of [a, b): its kept entries' squares in the lanes the dense
 * pass (ff_sumsq_block_at) puts them, (offset - a) mod FF_SUM_CHAINS, in its order (the
 * dense prefix's, then the compressed ones); the pruned entries it adds are
 * zeros, which leave a sum of squares as it is. */
static void sumsq_samo_blocks(void *arg, int64_t b0, int64_t b1, int th)
{
    (void)th;
    const sumsq_samo_job *j = arg;
    const ff_gpt *g = j->g;
    for (int64_t bl = b0; bl < b1; bl++) {
        const size_t lo = j->a + (size_t)bl * FF_SUM_BLOCK;
        const size_t hi = lo + FF_SUM_BLOCK < j->b ? lo + FF_SUM_BLOCK : j->b;
        double s[FF_SUM_CHAINS] = {0};
        for (size_t i = lo; i < hi && i < g->samo_zc0; i++)
            s[(i - j->a) % FF_SUM_CHAINS] += (double)g->grads[i] * g->grads[i];
        for (size_t k = ff_gpt_samo_lower(g, lo), k1 = ff_gpt_samo_lower(g, hi); k < k1; k++)
            s[(g->samo_idx[k] - j->a) % FF_SUM_CHAINS] += (double)g->samo_g[k] * g->samo_g[k];
        j->part[bl] = ff_sum_chains(s);
    }
}

void ff_gpt_samo_sumsq(ff_gpt *g, size_t a, size_t b, double *out)
{
    const int64_t nb = (int64_t)((b - a + FF_SUM_BLOCK - 1) / FF_SUM_BLOCK);
    sumsq_samo_job j = {g, a, b, g->norm_part};
    ff_team_run(g->ctx->team, nb, 1, sumsq_samo_blocks, &j);
    for (int64_t bl = 0; bl < nb; bl++) /* in order, as the dense pass adds them */
        *out += j.part[bl];
}

/* ---- AdamW -------------------------------------------------------------------------- */

typedef struct {
    const ff_gpt *g;
    const adamw_job *j;
    size_t k0, at; /* the first entry; its moments' (and master's) place */
} adamw_samo_job;

static void adamw_samo_range(void *arg, int64_t i0, int64_t i1, int th)
{
    (void)th;
    const adamw_samo_job *s = arg;
    const adamw_job *j = s->j;
    const uint32_t *restrict idx = s->g->samo_idx + s->k0;
    float *restrict m = s->g->samo_m + s->at, *restrict v = s->g->samo_v + s->at,
                    *restrict p = j->p;
    const float *restrict gr = s->g->samo_g + s->k0;
    float *restrict pc = s->g->samo_p ? s->g->samo_p + s->at : NULL; /* bf16-mixed: the master */
    for (int64_t k = i0; k < i1; k++) {
        const uint32_t i = idx[k];
        ff_adamw_at(pc ? &pc[k] : &p[i], &m[k], &v[k], gr[k] * j->grad_scale, j->b1, j->b2, j->bc1,
                    j->bc2, j->lr, j->eps, i < j->n_decay ? j->wd : 0.0f);
    }
}

void ff_gpt_samo_adamw(ff_gpt *g, const void *job, size_t k0, size_t n, size_t at)
{
    adamw_samo_job s = {g, job, k0, at};
    ff_team_run(g->ctx->team, (int64_t)n, 1 << 14, adamw_samo_range, &s);
}

/* ---- dense forms for files -------------------------------------------------------- */

/* The compressed and the dense (rest) part of `which`. */
static void parts(ff_gpt *g, ff_gpt_buffer which, float **comp, float **rest)
{
    *comp = which == FF_GPT_GRADS ? g->samo_g : which == FF_GPT_ADAM_M ? g->samo_m : g->samo_v;
    *rest = which == FF_GPT_GRADS ? g->grads : which == FF_GPT_ADAM_M ? g->adam_m : g->adam_v;
}

float *ff_gpt_samo_expand(ff_gpt *g, ff_gpt_buffer which)
{
    /* under ZeRO the whole compressed and dense parts are made first, the
     * other ranks' chunks gathered over D (the moments are sliced; of the
     * gradients, reduced, only the rank's chunks are current) */
    const int moments = which == FF_GPT_ADAM_M || which == FF_GPT_ADAM_V;
    const int zr = g->zr && which != FF_GPT_MASK;
    int rc = moments ? ff_gpt_adam_ensure(g) : FF_OK;
    float *d = rc ? NULL : ff_fbuf_alloc(g->ctx, g->n_params);
    float *wc = zr && d ? ff_fbuf_alloc(g->ctx, g->samo_k) : NULL;
    float *wr = zr && d ? ff_fbuf_alloc(g->ctx, ff_gpt_dense_state(g)) : NULL;
    if (rc == FF_OK && (!d || (zr && (!wc || !wr))))
        rc = ff_set_error(g->ctx, FF_ENOMEM, "out of memory for a dense copy of the model's state");
    float *comp = NULL, *rest = NULL;
    if (which != FF_GPT_MASK)
        parts(g, which, &comp, &rest);
    if (zr && (rc = ff_ctx_agree(g->ctx, rc)) == FF_OK) {
        rc = ff_gpt_zero_whole(g, 1, comp, which != FF_GPT_GRADS, wc);
        int r2 = ff_gpt_zero_whole(g, 0, rest, which != FF_GPT_GRADS, wr);
        rc = ff_ctx_agree(g->ctx, rc ? rc : r2);
        comp = wc, rest = wr;
    }
    if (rc) {
        ff_fbuf_free(d), ff_fbuf_free(wc), ff_fbuf_free(wr);
        return NULL;
    }
    const size_t nz = g->n_zsharded, z0 = g->samo_zc0;
    if (which == FF_GPT_MASK) {
        for (size_t k = 0; k < g->samo_k; k++)
            d[g->samo_idx[k]] = 1.0f;
        for (size_t i = 0; i < g->n_params; i++)
            if (i < z0 || i >= nz)
                d[i] = 1.0f;
        return d;
    }
    for (size_t k = 0; k < g->samo_k; k++)
        d[g->samo_idx[k]] = comp[k];
    memcpy(d, rest, z0 * sizeof(float));
    memcpy(d + nz, rest + z0, (g->n_params - nz) * sizeof(float));
    ff_fbuf_free(wc), ff_fbuf_free(wr);
    return d;
}

void ff_gpt_samo_compress(ff_gpt *g, ff_gpt_buffer which, const float *d)
{
    float *comp, *rest;
    const size_t nz = g->n_zsharded, z0 = g->samo_zc0;
    parts(g, which, &comp, &rest);
    if (g->zr && which != FF_GPT_GRADS) { /* ZeRO: the moments' slices */
        ff_gpt_zero_slice_flat(g, 1, d, comp);
        ff_gpt_zero_slice_flat(g, 0, d, rest);
        return;
    }
    for (size_t k = 0; k < g->samo_k; k++)
        comp[k] = d[g->samo_idx[k]];
    memcpy(rest, d, z0 * sizeof(float));
    memcpy(rest + z0, d + nz, (g->n_params - nz) * sizeof(float));
}

void ff_gpt_samo_zero_pruned(ff_gpt *g)
{
    if (g->samo_p && !g->samo_dense)
        return; /* (a compressed master has no pruned entries) */
    size_t i = g->samo_zc0;
    for (size_t k = 0; k <= g->samo_k; k++) {
        const size_t next = k < g->samo_k ? g->samo_idx[k] : g->n_zsharded;
        for (; i < next; i++)
            g->params[i] = 0.0f;
        i = next + 1;
    }
}

/* ---- bf16-mixed: the compressed master -------------------------------------------- */

/* The copy the products read (the dissertation's §4.1.3: "expand" the
 * compressed master's bf16 values into the uncompressed bf16 weights):
 * wte's dense shard, then, block by block of [samo_zc0, n_zsharded) on the
 * team, +0 over the block and each run of consecutive kept entries rounded
 * into its place; all of the copy is written. */
enum { COPY_BLOCK = 1 << 16 };

typedef struct {
    ff_gpt *g;
    const float *comp, *dense; /* the master: compressed (entry k), or dense (offset idx[k]) */
} copy_job;

static void copy_blocks(void *arg, int64_t b0, int64_t b1, int th)
{
    (void)th;
    const copy_job *j = arg;
    ff_gpt *g = j->g;
    const uint32_t *idx = g->samo_idx;
    for (int64_t bl = b0; bl < b1; bl++) {
        const size_t lo = g->samo_zc0 + (size_t)bl * COPY_BLOCK;
        const size_t hi = lo + COPY_BLOCK < g->n_zsharded ? lo + COPY_BLOCK : g->n_zsharded;
        ff_gpt_bf16_zero(g, lo, hi - lo);
        for (size_t a = ff_gpt_samo_lower(g, lo), k1 = ff_gpt_samo_lower(g, hi), b; a < k1; a = b) {
            for (b = a + 1; b < k1 && idx[b] == idx[b - 1] + 1;)
                b++;
            ff_gpt_bf16_weights_at(g, idx[a], j->comp ? j->comp + a : j->dense + idx[a], b - a);
        }
    }
}

/* The copy from the whole master: compressed (comp, with the dense rest
 * `rest`) or dense. */
static void make_copy(ff_gpt *g, const float *comp, const float *rest, const float *dense)
{
    ff_gpt_bf16_weights_at(g, 0, dense ? dense : rest, g->samo_zc0); /* (the first entries) */
    const size_t n = g->n_zsharded - g->samo_zc0;
    copy_job j = {g, comp, dense};
    ff_team_run(g->ctx->team, (int64_t)((n + COPY_BLOCK - 1) / COPY_BLOCK), 1, copy_blocks, &j);
}

void ff_gpt_samo_bf16_weights(ff_gpt *g) { make_copy(g, g->samo_p, g->params, NULL); }

int ff_gpt_samo_master_dense(ff_gpt *g)
{
    if (!g->samo_p || g->samo_dense)
        return FF_OK; /* (the same on every rank) */
    /* ZeRO: the whole compressed master and dense rest first, gathered over D */
    const int zr = ff_gpt_zero_samo_master(g);
    float *d = ff_fbuf_alloc(g->ctx, g->n_params);
    float *wc = zr && d ? ff_fbuf_alloc(g->ctx, g->samo_k) : NULL;
    float *wr = zr && d ? ff_fbuf_alloc(g->ctx, ff_gpt_dense_state(g)) : NULL;
    int rc = ff_ctx_agree(g->ctx, d && (!zr || (wc && wr))
                                      ? FF_OK
                                      : ff_set_error(g->ctx, FF_ENOMEM,
                                                     "out of memory for a dense copy of the "
                                                     "model's master weights"));
    if (rc == FF_OK && zr) {
        rc = ff_gpt_zero_whole(g, 1, g->samo_p, 1, wc);
        int r2 = ff_gpt_zero_whole(g, 0, g->samo_prest, 1, wr);
        rc = ff_ctx_agree(g->ctx, rc ? rc : r2);
    }
    if (rc) {
        ff_fbuf_free(d), ff_fbuf_free(wc), ff_fbuf_free(wr);
        return rc;
    }
    const float *pc = zr ? wc : g->samo_p, *pr = zr ? wr : g->samo_prest;
    const size_t nz = g->n_zsharded, z0 = g->samo_zc0;
    memcpy(d, pr, z0 * sizeof(float));
    memcpy(d + nz, pr + z0, (g->n_params - nz) * sizeof(float));
    for (size_t k = 0; k < g->samo_k; k++) /* (the pruned ones: ff_fbuf_alloc's zeros) */
        d[g->samo_idx[k]] = pc[k];
    ff_fbuf_free(wc), ff_fbuf_free(wr);
    g->params = d;
    g->samo_dense = 1;
    ff_gpt_bind_views(g);
    return FF_OK;
}

void ff_gpt_samo_master_compress(ff_gpt *g, int changed)
{
    if (!g->samo_dense)
        return;
    float *d = g->params;
    const size_t nz = g->n_zsharded, z0 = g->samo_zc0;
    const int zr = ff_gpt_zero_samo_master(g);
    if (zr) { /* ZeRO: the rank's slices; the copy from the dense master's kept entries */
        ff_gpt_zero_slice_flat(g, 1, d, g->samo_p);
        ff_gpt_zero_slice_flat(g, 0, d, g->samo_prest);
        if (changed)
            make_copy(g, NULL, NULL, d);
    } else {
        for (size_t k = 0; k < g->samo_k; k++)
            g->samo_p[k] = d[g->samo_idx[k]];
        memcpy(g->samo_prest, d, z0 * sizeof(float));
        memcpy(g->samo_prest + z0, d + nz, (g->n_params - nz) * sizeof(float));
    }
    g->params = g->samo_prest;
    g->samo_dense = 0;
    ff_fbuf_free(d);
    ff_gpt_bind_views(g);
    if (changed && !zr)
        ff_gpt_samo_bf16_weights(g);
}

/* ---- switching on ----------------------------------------------------------------- */

/* Why this rank cannot train with SAMO (FF_OK: it can). */
static int samo_check(ff_gpt *g)
{
    if (!g->mask)
        return ff_set_error(g->ctx, FF_EINVAL,
                            "SAMO needs a mask: prune the model (fourfold prune, --prune-to) or "
                            "give one (--mask)");
    if (g->n_zsharded > UINT32_MAX)
        return ff_set_error(g->ctx, FF_EUNSUPPORTED,
                            "SAMO's 32-bit offsets: this rank holds %zu weights, more than 2^32",
                            g->n_zsharded);
    for (size_t i = g->n_zsharded; i < g->n_params; i++)
        if (g->mask[i] != 1.0f)
            return ff_set_error(g->ctx, FF_EINVAL,
                                "the mask prunes parameters other than the weight matrices; "
                                "SAMO compresses only those");
    return FF_OK;
}

int ff_gpt_samo(ff_gpt *g)
{
    if (g->samo)
        return FF_OK; /* (the same on every rank) */
    int rc = ff_ctx_agree(g->ctx, samo_check(g));
    /* nothing in flight from here (ff_gpt_zero_grad's waits, without
     * touching the dense gradients about to be freed) */
    int rc0 = ff_linear_seq_wait_grads(g->seq);
    for (int l = 0; l <= g->nb; l++)
        ff_wait(&g->bucket_req[l]);
    for (int l = 0; l < g->nb; l++)
        ff_wait(&g->ebucket_req[l]);
    if (rc || (rc = ff_ctx_agree(g->ctx, rc0)))
        return rc;
    /* ZeRO over D: the switch works on whole moments and master, and SAMO's
     * layout of the slices is built after it (docs/samo.md "SAMO with ZeRO") */
    if ((rc = ff_gpt_zero_unset(g)))
        return rc;
    /* wte's shard (first in the buffer) stays dense when nothing of it is
     * pruned, as by default: compressing it would only add its offsets */
    const size_t nz = g->n_zsharded, w = g->wte ? ff_linear_local_sizes(g->wte).w_shard : 0;
    size_t z0 = 0, k = 0;
    while (z0 < w && g->mask[z0] != 0.0f)
        z0++;
    z0 = z0 == w ? w : 0;
    const size_t nr = z0 + g->n_params - nz; /* the dense state */
    for (size_t i = z0; i < nz; i++)
        k += g->mask[i] != 0.0f;
    const int moments = g->adam_m != NULL, master = g->wbf16 != NULL;
    uint32_t *idx = malloc((k ? k : 1) * sizeof *idx);
    float *sg = ff_fbuf_alloc(g->ctx, k), *gr = ff_fbuf_alloc(g->ctx, nr);
    /* bf16-mixed: the products read the bf16 copy, so the master of the
     * compressed weights is compressed too (the dissertation's eq. 4.1) */
    float *sp = master ? ff_fbuf_alloc(g->ctx, k) : NULL,
          *pr = master ? ff_fbuf_alloc(g->ctx, nr) : NULL;
    float *sm = moments ? ff_fbuf_alloc(g->ctx, k) : NULL,
          *sv = moments ? ff_fbuf_alloc(g->ctx, k) : NULL;
    float *rm = moments ? ff_fbuf_alloc(g->ctx, nr) : NULL,
          *rv = moments ? ff_fbuf_alloc(g->ctx, nr) : NULL;
    int local = idx && sg && gr && (!moments || (sm && sv && rm && rv)) && (!master || (sp && pr))
                    ? FF_OK
                    : ff_set_error(g->ctx, FF_ENOMEM, "out of memory for SAMO's compressed states");
    if ((rc = ff_ctx_agree(g->ctx, local))) {
        free(idx);
        float *made[8] = {sg, gr, sm, sv, rm, rv, sp, pr};
        for (int i = 0; i < 8; i++)
            ff_fbuf_free(made[i]);
        return rc;
    }
    for (size_t i = z0, n = 0; i < nz; i++)
        if (g->mask[i] != 0.0f)
            idx[n++] = (uint32_t)i;
    g->samo_idx = idx, g->samo_k = k, g->samo_g = sg, g->samo_zc0 = z0;
    if (moments) { /* resuming: the moments keep their kept entries */
        for (size_t n = 0; n < k; n++)
            sm[n] = g->adam_m[idx[n]], sv[n] = g->adam_v[idx[n]];
        memcpy(rm, g->adam_m, z0 * sizeof(float));
        memcpy(rv, g->adam_v, z0 * sizeof(float));
        memcpy(rm + z0, g->adam_m + nz, (nr - z0) * sizeof(float));
        memcpy(rv + z0, g->adam_v + nz, (nr - z0) * sizeof(float));
        ff_fbuf_free(g->adam_m), ff_fbuf_free(g->adam_v);
        g->adam_m = rm, g->adam_v = rv, g->samo_m = sm, g->samo_v = sv;
    }
    if (master) {
        for (size_t n = 0; n < k; n++)
            sp[n] = g->params[idx[n]];
        memcpy(pr, g->params, z0 * sizeof(float));
        memcpy(pr + z0, g->params + nz, (nr - z0) * sizeof(float));
        ff_fbuf_free(g->params);
        g->params = g->samo_prest = pr, g->samo_p = sp;
    }
    ff_fbuf_free(g->grads);
    g->grads = gr; /* zero (ff_fbuf_alloc's), and so is sg */
    ff_fbuf_free(g->mask);
    g->mask = NULL;
    g->samo = 1;
    ff_gpt_pack_build(g); /* (frees the packing: the compressed ranges are packed) */
    ff_gpt_bind_views(g);
    ff_gpt_bf16_weights(g); /* (from the compressed master: the masked run's copy) */
    return g->opt.zero && g->gd > 1 ? ff_ctx_agree(g->ctx, ff_gpt_zero_setup(g)) : FF_OK;
}

int ff_gpt_is_samo(const ff_gpt *g) { return g->samo; }
