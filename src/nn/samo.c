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
} adamw_samo_job;

static void adamw_samo_range(void *arg, int64_t k0, int64_t k1, int th)
{
    (void)th;
    const adamw_samo_job *s = arg;
    const adamw_job *j = s->j;
    const uint32_t *restrict idx = s->g->samo_idx;
    float *restrict m = s->g->samo_m, *restrict v = s->g->samo_v, *restrict p = j->p;
    const float *restrict gr = s->g->samo_g;
    float *restrict pc = s->g->samo_p; /* bf16-mixed: the compressed master */
    for (int64_t k = k0; k < k1; k++) {
        const uint32_t i = idx[k];
        ff_adamw_at(pc ? &pc[k] : &p[i], &m[k], &v[k], gr[k] * j->grad_scale, j->b1, j->b2, j->bc1,
                    j->bc2, j->lr, j->eps, i < j->n_decay ? j->wd : 0.0f);
    }
}

void ff_gpt_samo_adamw(ff_gpt *g, const void *job)
{
    adamw_samo_job s = {g, job};
    ff_team_run(g->ctx->team, (int64_t)g->samo_k, 1 << 14, adamw_samo_range, &s);
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
    if ((which == FF_GPT_ADAM_M || which == FF_GPT_ADAM_V) && ff_gpt_adam_ensure(g))
        return NULL;
    float *d = ff_fbuf_alloc(g->ctx, g->n_params), *comp, *rest;
    if (!d) {
        ff_set_error(g->ctx, FF_ENOMEM, "out of memory for a dense copy of the model's state");
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
    parts(g, which, &comp, &rest);
    for (size_t k = 0; k < g->samo_k; k++)
        d[g->samo_idx[k]] = comp[k];
    memcpy(d, rest, z0 * sizeof(float));
    memcpy(d + nz, rest + z0, (g->n_params - nz) * sizeof(float));
    return d;
}

void ff_gpt_samo_compress(ff_gpt *g, ff_gpt_buffer which, const float *d)
{
    float *comp, *rest;
    const size_t nz = g->n_zsharded, z0 = g->samo_zc0;
    parts(g, which, &comp, &rest);
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

static void copy_blocks(void *arg, int64_t b0, int64_t b1, int th)
{
    (void)th;
    ff_gpt *g = arg;
    const uint32_t *idx = g->samo_idx;
    for (int64_t bl = b0; bl < b1; bl++) {
        const size_t lo = g->samo_zc0 + (size_t)bl * COPY_BLOCK;
        const size_t hi = lo + COPY_BLOCK < g->n_zsharded ? lo + COPY_BLOCK : g->n_zsharded;
        ff_gpt_bf16_zero(g, lo, hi - lo);
        for (size_t a = ff_gpt_samo_lower(g, lo), k1 = ff_gpt_samo_lower(g, hi), b; a < k1; a = b) {
            for (b = a + 1; b < k1 && idx[b] == idx[b - 1] + 1;)
                b++;
            ff_gpt_bf16_weights_at(g, idx[a], g->samo_p + a, b - a);
        }
    }
}

void ff_gpt_samo_bf16_weights(ff_gpt *g)
{
    ff_gpt_bf16_weights_at(g, 0, g->params, g->samo_zc0); /* (params' first entries) */
    const size_t n = g->n_zsharded - g->samo_zc0;
    ff_team_run(g->ctx->team, (int64_t)((n + COPY_BLOCK - 1) / COPY_BLOCK), 1, copy_blocks, g);
}

int ff_gpt_samo_master_dense(ff_gpt *g)
{
    if (!g->samo_p || g->samo_dense)
        return FF_OK; /* (the same on every rank) */
    float *d = ff_fbuf_alloc(g->ctx, g->n_params);
    int rc = ff_ctx_agree(g->ctx, d ? FF_OK
                                    : ff_set_error(g->ctx, FF_ENOMEM,
                                                   "out of memory for a dense copy of the model's "
                                                   "master weights"));
    if (rc) {
        ff_fbuf_free(d);
        return rc;
    }
    const size_t nz = g->n_zsharded, z0 = g->samo_zc0;
    memcpy(d, g->samo_prest, z0 * sizeof(float));
    memcpy(d + nz, g->samo_prest + z0, (g->n_params - nz) * sizeof(float));
    for (size_t k = 0; k < g->samo_k; k++) /* (the pruned ones: ff_fbuf_alloc's zeros) */
        d[g->samo_idx[k]] = g->samo_p[k];
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
    for (size_t k = 0; k < g->samo_k; k++)
        g->samo_p[k] = d[g->samo_idx[k]];
    memcpy(g->samo_prest, d, z0 * sizeof(float));
    memcpy(g->samo_prest + z0, d + nz, (g->n_params - nz) * sizeof(float));
    g->params = g->samo_prest;
    g->samo_dense = 0;
    ff_fbuf_free(d);
    ff_gpt_bind_views(g);
    if (changed)
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
    if (g->zr)
        return ff_ctx_agree(g->ctx, ff_set_error(g->ctx, FF_EUNSUPPORTED,
                                                 "SAMO with ZeRO (zero %d) is not supported yet",
                                                 g->opt.zero));
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
    return FF_OK;
}

int ff_gpt_is_samo(const ff_gpt *g) { return g->samo; }
