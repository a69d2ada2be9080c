/* The 3D parallel linear layer and its sequence (include/fourfold/linear.h).
 *
 * Weight uses follow a program fixed before the run, so every overlap is a
 * decision about *when* a collective is posted or waited on, never about what
 * is computed: results are bitwise identical with any switch combination.
 * Decomposition also cuts the dependent all-reduces into chunks, which is
 * bitwise identical where the all-reduce's order of additions does not
 * depend on the vector's length (docs/linear.md, "Decomposition"). The
 * collective matmul (opts.cmm) computes a layer's forwards in Z-shard
 * slices: other BLAS calls, so bounded rather than bitwise against it off,
 * but the same for every forward and recompute of the layer, prefetched or
 * not; the reduce-scatter collective matmul (opts.rs_cmm) computes a
 * layer's weight gradient in Z-shard slices fed to the ring reduce-scatter
 * one by one, also bounded rather than bitwise against it off. */
#include "fourfold/linear.h"

#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "device.h"
#include "fourfold/rng.h"
#include "fourfold/trace.h"
#include "gpt_ops.h"
#include "internal.h"
#include "passes.h"

enum { POOL_SLOTS = 32, NAME_LEN = 32 };

struct ff_linear {
    ff_linear_seq *seq;
    int index;
    char name[NAME_LEN];
    ff_linear_kind kind;
    ff_weight_layout layout;
    int64_t k, n;
    int has_bias;
    int64_t *col_perm; /* NULL: identity */
    uint32_t stream;

    ff_group *grp_r, *grp_c, *grp_z; /* rows of W split over R, columns over C */
    int gr, gc, gz;
    int64_t kl, nl;      /* block rows and columns */
    size_t block, shard; /* kl*nl, block/gz */

    float *w, *b, *dw, *db; /* bound views */
    /* SAMO (ff_linear_bind_sparse; dw NULL): the gradient kept at the
     * shard's offsets sidx[k] - sbase, k < sn, in sg */
    const uint32_t *sidx;
    size_t sn;
    uint32_t sbase;
    float *sg;

    /* run state */
    float *w_gathered; /* pool buffer holding W_rc (gz > 1) */
    ff_request *ag;    /* its all-gather, if in flight */
    int held;          /* w_gathered is allocated (gathered or in flight) */
    float *dw_block;   /* dW_rc of this run, accumulating over its backward uses */
    int dw_contributions;
    ff_request *rs; /* the reduce-scatter in flight (ORS), possibly from an earlier run */
    float *rs_send; /* the dW_rc it reads */
    float *rs_out;  /* its result, added into dw when it completes */
    int cached;     /* AG cache member */
    /* the layer's options: the sequence's, or its own (ff_linear_set_options) */
    int decompose, oar, ors, oag, rs_cmm;
    int cache_forced; /* 1: AG cache member whatever ag_cache_layers says; 0: never; -1: by it */
    ff_coll_opts coll;
    int last_backward; /* program index of the last backward use, -1 none */
    /* bf16-mixed: the shard's 2-byte copy that gathers and products read
     * (ff_linear_bind_bf16), or NULL: w itself */
    const uint16_t *w_bf16;
    float *w_wide; /* Gz = 1 with w_bf16: the block widened for this use (pool) */
    /* bf16-mixed on oneDNN (ff_gemm_bf16_direct), during a use: the 2-byte
     * operands its products read in place of the fp32 ones (NULL: none) */
    const uint16_t *in16, *dout16, *w16;
    int want16; /* ff_linear_use_begin_bf16: the 2-byte shard itself, if Gz = 1 */
};

struct ff_linear_seq {
    ff_grid *grid;
    ff_ctx *ctx;
    ff_linear_opts opt;
    ff_gemm *gemm;
    ff_linear **layers;
    int n_layers, cap_layers;

    ff_linear_use *prog;
    unsigned char *need_gather, *keep_after;
    int n_prog;
    int cursor, running;

    struct {
        float *ptr;
        size_t elems;
    } pool[POOL_SLOTS];
    int n_pool;
    size_t mem_cur, mem_peak;
    size_t mem_held; /* the pool's buffers as allocated: in use and kept */
    int gathers, reused;
    long cmm_uses;                 /* forwards run as collective matmuls, since creation */
    long rs_cmm_uses;              /* weight gradients run as reduce-scatter collective matmuls */
    ff_linear_weight_fn weight_fn; /* before a weight shard is read (ZeRO's gathers) */
    void *weight_arg;
};

void ff_linear_opts_default(ff_linear_opts *o)
{
    memset(o, 0, sizeof *o);
    o->oar = o->ors = o->oag = 1;
    o->ag_cache_layers = -1;
    o->tune = FF_GEMM_TUNE_LAYOUTS;
    o->coll.wire = FF_WIRE_FP32;
    o->coll.algo = FF_ALGO_AUTO;
}

/* ---- buffers ----------------------------------------------------------------
 * Gathered weights and gradient blocks come and go every layer; keeping freed
 * ones avoids a fresh mmap (page faults and zeroing) per use. */

static float *buf_take(ff_linear_seq *s, size_t elems)
{
    int best = -1;
    for (int i = 0; i < s->n_pool; i++)
        if (s->pool[i].elems >= elems && (best < 0 || s->pool[i].elems < s->pool[best].elems))
            best = i;
    float *p;
    /* a request does not pin a buffer more than twice its size (bf16-mixed's
     * widened wte block would otherwise hold the LM head's output gradient,
     * and a second one be made for the block) */
    if (best >= 0 && s->pool[best].elems / 2 > elems)
        best = -1;
    if (best >= 0) {
        p = s->pool[best].ptr;
        s->pool[best] = s->pool[--s->n_pool];
    } else {
        p = ff_fbuf_alloc(s->ctx, elems);
        if (!p) {
            ff_set_error(s->ctx, FF_ENOMEM, "out of memory for a %zu-float layer buffer", elems);
            return NULL;
        }
        s->mem_held += elems * sizeof(float);
    }
    s->mem_cur += elems * sizeof(float);
    if (s->mem_cur > s->mem_peak)
        s->mem_peak = s->mem_cur;
    return p;
}

/* The pool does not record capacities of handed-out buffers, so callers give
 * back the size they asked for; a buffer is reused only for requests no
 * larger than that. */
static void buf_give(ff_linear_seq *s, float *p, size_t elems)
{
    if (!p)
        return;
    s->mem_cur -= elems * sizeof(float);
    if (s->n_pool < POOL_SLOTS) {
        s->pool[s->n_pool].ptr = p;
        s->pool[s->n_pool].elems = elems;
        s->n_pool++;
    } else {
        /* (its size as made: a kept buffer may serve a smaller request) */
        s->mem_held -= ff_fbuf_bytes(p);
        ff_fbuf_free(p);
    }
}

/* ---- sequence and layers ------------------------------------------------------ */

int ff_linear_seq_create(ff_grid *grid, const ff_linear_opts *opts, ff_linear_seq **out)
{
    *out = NULL;
    ff_ctx *ctx = ff_grid_ctx(grid);
    ff_linear_seq *s = calloc(1, sizeof *s);
    if (!s)
        return ff_set_error(ctx, FF_ENOMEM, "out of memory for a layer sequence");
    s->grid = grid;
    s->ctx = ctx;
    if (opts)
        s->opt = *opts;
    else
        ff_linear_opts_default(&s->opt);
    if (s->opt.decompose < 0 || s->opt.decompose > FF_DECOMPOSE_MAX) {
        free(s);
        return ff_set_error(ctx, FF_EINVAL, "decompose %d: expected 0 to %d chunks",
                            opts->decompose, FF_DECOMPOSE_MAX);
    }
    int rc = ff_gemm_create(ctx, s->opt.tune, &s->gemm);
    if (rc) {
        free(s);
        return rc;
    }
    *out = s;
    return FF_OK;
}

static void layer_free(ff_linear *l)
{
    free(l->col_perm);
    free(l);
}

void ff_linear_seq_destroy(ff_linear_seq *s)
{
    if (!s)
        return;
    for (int i = 0; i < s->n_layers; i++) {
        ff_linear *l = s->layers[i];
        ff_wait(&l->ag);
        ff_wait(&l->rs);
        ff_fbuf_free(l->w_gathered);
        ff_fbuf_free(l->w_wide);
        ff_fbuf_free(l->dw_block);
        ff_fbuf_free(l->rs_send);
        ff_fbuf_free(l->rs_out);
        layer_free(l);
    }
    for (int i = 0; i < s->n_pool; i++)
        ff_fbuf_free(s->pool[i].ptr);
    free(s->layers);
    free(s->prog);
    free(s->need_gather);
    free(s->keep_after);
    ff_gemm_destroy(s->gemm);
    free(s);
}

static const char *kind_name(ff_linear_kind k) { return k == FF_LINEAR_N ? "N" : "T"; }

int ff_linear_add(ff_linear_seq *s, const ff_linear_desc *d, ff_linear **out)
{
    *out = NULL;
    ff_ctx *ctx = s->ctx;
    const char *name = d->name ? d->name : "linear";
    if (s->n_prog)
        return ff_set_error(ctx, FF_EINVAL, "layer '%s' added after the program was set", name);
    if (d->k <= 0 || d->n <= 0)
        return ff_set_error(ctx, FF_EINVAL, "layer '%s': sizes k=%lld n=%lld must be positive",
                            name, (long long)d->k, (long long)d->n);
    if (d->kind != FF_LINEAR_N && d->kind != FF_LINEAR_T)
        return ff_set_error(ctx, FF_EINVAL, "layer '%s': kind must be N or T", name);
    ff_dims shape = ff_grid_shape(s->grid), me = ff_grid_coords(s->grid);
    int n_kind = d->kind == FF_LINEAR_N;
    int gr = n_kind ? shape.y : shape.x, gc = n_kind ? shape.x : shape.y;
    const char *rname = n_kind ? "Gy" : "Gx", *cname = n_kind ? "Gx" : "Gy";
    if (d->k % gr)
        return ff_set_error(
            ctx, FF_EDIVIDE, "layer '%s' (%s, k=%lld, n=%lld): k=%lld is not divisible by %s=%d",
            name, kind_name(d->kind), (long long)d->k, (long long)d->n, (long long)d->k, rname, gr);
    if (d->n % gc)
        return ff_set_error(
            ctx, FF_EDIVIDE, "layer '%s' (%s, k=%lld, n=%lld): n=%lld is not divisible by %s=%d",
            name, kind_name(d->kind), (long long)d->k, (long long)d->n, (long long)d->n, cname, gc);
    int64_t kl = d->k / gr, nl = d->n / gc;
    if ((kl * nl) % shape.z)
        return ff_set_error(ctx, FF_EDIVIDE,
                            "layer '%s' (%s, k=%lld, n=%lld): its %lldx%lld weight block is not "
                            "divisible into Gz=%d pieces",
                            name, kind_name(d->kind), (long long)d->k, (long long)d->n,
                            (long long)kl, (long long)nl, shape.z);
    for (int i = 0; i < s->n_layers; i++)
        if (s->layers[i]->stream == d->rng_stream)
            return ff_set_error(ctx, FF_EINVAL,
                                "layers '%s' and '%s' have the same rng_stream %u: they would be "
                                "initialised with the same values",
                                s->layers[i]->name, name, (unsigned)d->rng_stream);
    ff_linear *l = calloc(1, sizeof *l);
    if (!l)
        return ff_set_error(ctx, FF_ENOMEM, "out of memory for layer '%s'", name);
    if (d->col_perm) {
        l->col_perm = malloc((size_t)d->n * sizeof(int64_t));
        unsigned char *seen = calloc((size_t)d->n, 1);
        int bad = !l->col_perm || !seen;
        for (int64_t j = 0; !bad && j < d->n; j++) {
            int64_t c = d->col_perm[j];
            if (c < 0 || c >= d->n || seen[c])
                bad = 2;
            else
                seen[c] = 1, l->col_perm[j] = c;
        }
        free(seen);
        if (bad) {
            layer_free(l);
            return bad == 1 ? ff_set_error(ctx, FF_ENOMEM, "out of memory for layer '%s'", name)
                            : ff_set_error(ctx, FF_EINVAL,
                                           "layer '%s': col_perm is not a permutation of 0..%lld",
                                           name, (long long)d->n - 1);
        }
    }
    if (s->n_layers == s->cap_layers) {
        int cap = s->cap_layers ? 2 * s->cap_layers : 16;
        ff_linear **p = realloc(s->layers, (size_t)cap * sizeof *p);
        if (!p) {
            layer_free(l);
            return ff_set_error(ctx, FF_ENOMEM, "out of memory for layer '%s'", name);
        }
        s->layers = p;
        s->cap_layers = cap;
    }
    l->seq = s;
    l->index = s->n_layers;
    snprintf(l->name, sizeof l->name, "%s", name);
    l->kind = d->kind;
    l->layout = d->layout;
    l->k = d->k;
    l->n = d->n;
    l->has_bias = d->bias != 0;
    l->stream = d->rng_stream;
    l->grp_r = ff_grid_group(s->grid, n_kind ? FF_GROUP_Y : FF_GROUP_X);
    l->grp_c = ff_grid_group(s->grid, n_kind ? FF_GROUP_X : FF_GROUP_Y);
    l->grp_z = ff_grid_group(s->grid, FF_GROUP_Z);
    l->gr = gr;
    l->gc = gc;
    l->gz = shape.z;
    l->kl = kl;
    l->nl = nl;
    l->block = (size_t)(kl * nl);
    l->shard = l->block / (size_t)shape.z;
    l->last_backward = -1;
    l->decompose = s->opt.decompose;
    l->oar = s->opt.oar;
    l->ors = s->opt.ors;
    l->rs_cmm = s->opt.rs_cmm;
    l->oag = s->opt.oag;
    l->cache_forced = -1;
    l->coll = s->opt.coll;
    if (s->opt.bf16) /* gathers and activations: bf16 (docs/design.md §13) */
        l->coll.wire = FF_WIRE_BF16;
    (void)me;
    s->layers[s->n_layers++] = l;
    *out = l;
    return FF_OK;
}

ff_linear *ff_linear_seq_layer(const ff_linear_seq *s, int i)
{
    return i >= 0 && i < s->n_layers ? s->layers[i] : NULL;
}
int ff_linear_seq_count(const ff_linear_seq *s) { return s->n_layers; }
const char *ff_linear_name(const ff_linear *l) { return l->name; }
ff_gemm *ff_linear_seq_gemm(ff_linear_seq *s) { return s->gemm; }

int ff_linear_set_options(ff_linear *l, const ff_layer_opts *o)
{
    ff_linear_seq *s = l->seq;
    if (s->n_prog)
        return ff_set_error(s->ctx, FF_EINVAL, "layer '%s': options set after the program",
                            l->name);
    int sw = o->oar | o->ors | o->oag | o->ag_cache | o->rs_cmm;
    if (o->decompose < 0 || o->decompose > FF_DECOMPOSE_MAX || (sw & ~1) ||
        (o->wire_bytes != 4 && o->wire_bytes != 2))
        return ff_set_error(s->ctx, FF_EINVAL,
                            "layer '%s': decompose %d (expected 0 to %d), switches 0 or 1, wire "
                            "%d bytes (expected 4 or 2)",
                            l->name, o->decompose, FF_DECOMPOSE_MAX, o->wire_bytes);
    l->decompose = o->decompose;
    l->oar = o->oar;
    l->ors = o->ors;
    l->oag = o->oag;
    l->rs_cmm = o->rs_cmm;
    l->cache_forced = o->ag_cache;
    l->coll.wire = o->wire_bytes == 2 || s->opt.bf16 ? FF_WIRE_BF16 : FF_WIRE_FP32;
    return FF_OK;
}

void ff_linear_options(const ff_linear *l, ff_layer_opts *o)
{
    o->decompose = l->decompose;
    o->oar = l->oar;
    o->ors = l->ors;
    o->oag = l->oag;
    o->ag_cache = l->cache_forced >= 0 ? l->cache_forced : l->cached;
    o->wire_bytes = l->coll.wire == FF_WIRE_BF16 ? 2 : 4;
    o->rs_cmm = l->rs_cmm;
}

ff_linear_sizes ff_linear_local_sizes(const ff_linear *l)
{
    ff_linear_sizes z;
    z.w_shard = l->shard;
    z.bias = l->has_bias ? (size_t)l->nl : 0;
    z.block_rows = z.in_local = l->kl;
    z.block_cols = z.out_local = l->nl;
    return z;
}

void ff_linear_bind(ff_linear *l, float *w_shard, float *b, float *dw_shard, float *db)
{
    l->w = w_shard;
    l->w_bf16 = NULL;
    l->b = b;
    l->dw = dw_shard;
    l->db = db;
    l->sidx = NULL, l->sn = 0, l->sbase = 0, l->sg = NULL;
}

void ff_linear_bind_bf16(ff_linear *l, const uint16_t *w_bf16) { l->w_bf16 = w_bf16; }

void ff_linear_bind_sparse(ff_linear *l, const uint32_t *idx, size_t n, uint32_t base, float *g)
{
    l->dw = NULL;
    l->sidx = idx, l->sn = n, l->sbase = base, l->sg = g;
}

/* A bound weight gradient: dense or compressed. */
static int has_grad(const ff_linear *l) { return l->dw || l->sidx; }

/* ---- the program ---------------------------------------------------------------- */

int ff_linear_seq_set_program(ff_linear_seq *s, const ff_linear_use *uses, int n)
{
    ff_ctx *ctx = s->ctx;
    if (s->running)
        return ff_set_error(ctx, FF_EINVAL, "the program cannot change during a run");
    if (n <= 0)
        return ff_set_error(ctx, FF_EINVAL, "a program needs at least one use");
    /* A backward before a forward of the same layer in the program is
     * refused; a layer with no forward in it (a pipeline stage's backward
     * run, whose forward ran in an earlier run) is allowed. seen_fwd[i]:
     * first "has a forward in the program", then "may be used backward". */
    int *seen_fwd = calloc((size_t)s->n_layers + 1, sizeof(int));
    if (!seen_fwd)
        return ff_set_error(ctx, FF_ENOMEM, "out of memory for the program");
    for (int u = 0; u < n; u++) {
        int li = uses[u].layer;
        if (li < 0 || li >= s->n_layers || uses[u].kind < FF_USE_FORWARD ||
            uses[u].kind > FF_USE_GRAD) {
            free(seen_fwd);
            return ff_set_error(ctx, FF_EINVAL, "program use %d names no layer or kind", u);
        }
        if (uses[u].kind == FF_USE_FORWARD || uses[u].kind == FF_USE_RECOMPUTE)
            seen_fwd[li] = 2;
    }
    for (int i = 0; i < s->n_layers; i++)
        seen_fwd[i] = !seen_fwd[i];
    for (int u = 0; u < n; u++) {
        int li = uses[u].layer;
        int bwd = uses[u].kind == FF_USE_BACKWARD || uses[u].kind == FF_USE_GRAD;
        if (bwd && !seen_fwd[li]) {
            free(seen_fwd);
            return ff_set_error(ctx, FF_EINVAL,
                                "program use %d: backward of '%s' before its forward", u,
                                s->layers[li]->name);
        }
        if (!bwd)
            seen_fwd[li] = 1;
    }
    free(seen_fwd);

    ff_linear_use *prog = malloc((size_t)n * sizeof *prog);
    unsigned char *need = calloc((size_t)n, 1), *keep = calloc((size_t)n, 1);
    int *first_fwd = malloc((size_t)s->n_layers * sizeof(int));
    if (!prog || !need || !keep || !first_fwd) {
        free(prog), free(need), free(keep), free(first_fwd);
        return ff_set_error(ctx, FF_ENOMEM, "out of memory for the program");
    }
    memcpy(prog, uses, (size_t)n * sizeof *prog);

    /* AG cache: the last ag_cache_layers layers in order of first forward use;
     * their weights are released first in the backward (paper IV-D) */
    int n_fwd_layers = 0;
    for (int i = 0; i < s->n_layers; i++)
        first_fwd[i] = -1, s->layers[i]->cached = 0, s->layers[i]->last_backward = -1;
    for (int u = 0; u < n; u++)
        if (prog[u].kind == FF_USE_FORWARD && first_fwd[prog[u].layer] < 0)
            first_fwd[prog[u].layer] = n_fwd_layers++;
    int cache = s->opt.ag_cache_layers < 0 ? n_fwd_layers : s->opt.ag_cache_layers;
    for (int i = 0; i < s->n_layers; i++) {
        ff_linear *l = s->layers[i];
        if (first_fwd[i] >= 0)
            l->cached =
                l->cache_forced >= 0 ? l->cache_forced : first_fwd[i] >= n_fwd_layers - cache;
    }
    free(first_fwd);

    /* keep the gathered weight from use u to the layer's next weight use q
     * when no other use lies between, when u recomputes and q is the
     * backward, or when the layer is cached and u is its first forward.
     * Gradient-only uses (FF_USE_GRAD) neither read nor hold the weight. */
    for (int u = 0; u < n; u++) {
        ff_linear *l = s->layers[prog[u].layer];
        if (prog[u].kind == FF_USE_BACKWARD || prog[u].kind == FF_USE_GRAD)
            l->last_backward = u;
        if (prog[u].kind == FF_USE_GRAD)
            continue;
        int q = u + 1;
        while (q < n && (prog[q].layer != prog[u].layer || prog[q].kind == FF_USE_GRAD))
            q++;
        if (q < n)
            keep[u] = q == u + 1 ||
                      (prog[u].kind == FF_USE_RECOMPUTE && prog[q].kind == FF_USE_BACKWARD) ||
                      (l->cached && prog[u].kind == FF_USE_FORWARD);
    }
    for (int u = 0; u < n; u++) {
        if (prog[u].kind == FF_USE_GRAD)
            continue;
        int p = u - 1;
        while (p >= 0 && (prog[p].layer != prog[u].layer || prog[p].kind == FF_USE_GRAD))
            p--;
        need[u] = !(p >= 0 && keep[p]);
    }
    s->gathers = s->reused = 0;
    for (int u = 0; u < n; u++)
        if (s->layers[prog[u].layer]->gz > 1 && prog[u].kind != FF_USE_GRAD) {
            if (need[u])
                s->gathers++;
            else
                s->reused++;
        }
    free(s->prog), free(s->need_gather), free(s->keep_after);
    s->prog = prog;
    s->need_gather = need;
    s->keep_after = keep;
    s->n_prog = n;
    return FF_OK;
}

int ff_linear_seq_program_standard(ff_linear_seq *s, int block_layers)
{
    int L = s->n_layers, n = 0;
    ff_linear_use *uses = malloc((size_t)(3 * L + 1) * sizeof *uses);
    if (!uses)
        return ff_set_error(s->ctx, FF_ENOMEM, "out of memory for the program");
    for (int i = 0; i < L; i++)
        uses[n++] = (ff_linear_use){i, FF_USE_FORWARD};
    if (block_layers <= 0) {
        for (int i = L - 1; i >= 0; i--)
            uses[n++] = (ff_linear_use){i, FF_USE_BACKWARD};
    } else {
        int n_blocks = (L + block_layers - 1) / block_layers;
        for (int blk = n_blocks - 1; blk >= 0; blk--) {
            int lo = blk * block_layers, hi = lo + block_layers < L ? lo + block_layers : L;
            for (int i = lo; i < hi; i++)
                uses[n++] = (ff_linear_use){i, FF_USE_RECOMPUTE};
            for (int i = hi - 1; i >= lo; i--)
                uses[n++] = (ff_linear_use){i, FF_USE_BACKWARD};
        }
    }
    int rc = ff_linear_seq_set_program(s, uses, n);
    free(uses);
    return rc;
}

void ff_linear_seq_gather_stats(const ff_linear_seq *s, int *gathers, int *reused)
{
    if (gathers)
        *gathers = s->gathers;
    if (reused)
        *reused = s->reused;
}

long ff_linear_seq_cmm_uses(const ff_linear_seq *s) { return s->cmm_uses; }
long ff_linear_seq_rs_cmm_uses(const ff_linear_seq *s) { return s->rs_cmm_uses; }

void ff_linear_seq_set_weight_hook(ff_linear_seq *s, ff_linear_weight_fn fn, void *arg)
{
    s->weight_fn = fn;
    s->weight_arg = arg;
}

/* The shard is about to be read (ff_linear_seq_set_weight_hook). */
static int weight_ready(const ff_linear *l)
{
    const ff_linear_seq *s = l->seq;
    return s->weight_fn ? s->weight_fn(s->weight_arg, l->w, l->w_bf16, l->shard) : FF_OK;
}

size_t ff_linear_seq_held(const ff_linear_seq *s) { return s->mem_held; }

void ff_linear_seq_memory(const ff_linear_seq *s, size_t *current, size_t *peak)
{
    if (current)
        *current = s->mem_cur;
    if (peak)
        *peak = s->mem_peak;
}

/* ---- weight gathers ---------------------------------------------------------------- */

/* ring: run by the ring, whose blocks the collective matmul takes as they
 * arrive (ff_allgather_ready) */
static int post_gather(ff_linear *l, int ring)
{
    ff_linear_seq *s = l->seq;
    int rc = weight_ready(l);
    if (rc)
        return rc;
    l->w_gathered = buf_take(s, l->block);
    if (!l->w_gathered)
        return FF_ENOMEM;
    l->held = 1;
    ff_coll_opts o = l->coll;
    if (ring)
        o.algo = FF_ALGO_RING;
    /* W_rc = AllGather_Z(W_shard): piece z lands at offset z * shard. A
     * 2-byte shard is widened into its own piece and gathered in place: the
     * bf16 wire moves those same values, exactly */
    if (l->w_bf16) {
        float *mine = l->w_gathered + (size_t)ff_group_rank(l->grp_z) * l->shard;
        ff_bf16_unpack(mine, l->w_bf16, l->shard);
        return ff_iallgather(l->grp_z, mine, l->w_gathered, l->shard, &o, &l->ag);
    }
    return ff_iallgather(l->grp_z, l->w, l->w_gathered, l->shard, &o, &l->ag);
}

/* The collective matmul applies to a forward of this layer whose gather is
 * posted at its use: each Z-shard must be whole rows of the stored block
 * (rows of W for KN: a slice of the inner dimension; rows of W^T for NK:
 * a slice of the output's columns). */
static int cmm_fits(const ff_linear *l)
{
    return l->seq->opt.cmm && l->gz > 1 &&
           (l->layout == FF_WEIGHT_KN ? l->kl % l->gz : l->nl % l->gz) == 0;
}

/* The reduce-scatter collective matmul applies to the layer's last
 * backward use of a run when it is the layer's product (backward) and its
 * Z-shards are whole rows of the stored block, as for cmm_fits. */
static int rs_cmm_fits(const ff_linear *l)
{
    return l->rs_cmm && l->gz > 1 &&
           (l->layout == FF_WEIGHT_KN ? l->kl % l->gz : l->nl % l->gz) == 0 &&
           l->seq->cursor == l->last_backward;
}

static void drop_wide(ff_linear *l)
{
    buf_give(l->seq, l->w_wide, l->block);
    l->w_wide = NULL;
}

static void drop_gathered(ff_linear *l)
{
    buf_give(l->seq, l->w_gathered, l->block);
    l->w_gathered = NULL;
    l->held = 0;
}

/* OAG: post the all-gather of the next use after `after` that needs one,
 * unless that layer still holds its buffer (it is released first) or has
 * OAG off (its use posts it). */
static int prefetch(ff_linear_seq *s, int after)
{
    for (int v = after + 1; v < s->n_prog; v++) {
        ff_linear *l = s->layers[s->prog[v].layer];
        if (!s->need_gather[v] || l->gz == 1)
            continue;
        if (l->held || !l->oag)
            return FF_OK;
        /* the run's first gather: a forward with the collective matmul
         * gathers it at its use, computing beside the ring */
        if (after < 0 &&
            (s->prog[v].kind == FF_USE_FORWARD || s->prog[v].kind == FF_USE_RECOMPUTE) &&
            cmm_fits(l))
            return FF_OK;
        return post_gather(l, 0);
    }
    return FF_OK;
}

/* Adds a completed reduce-scatter into the gradient shard, or its kept
 * entries into the compressed gradient (the same additions). */
static void finish_rs(ff_linear *l)
{
    if (l->sidx)
        for (size_t k = 0; k < l->sn; k++)
            l->sg[k] += l->rs_out[l->sidx[k] - l->sbase];
    else
        for (size_t e = 0; e < l->shard; e++)
            l->dw[e] += l->rs_out[e];
    buf_give(l->seq, l->rs_out, l->shard);
    buf_give(l->seq, l->rs_send, l->block);
    l->rs_out = l->rs_send = NULL;
}

/* Waits for the layer's reduce-scatter, if any, and adds its result. */
static int wait_rs(ff_linear *l)
{
    if (!l->rs)
        return FF_OK;
    int rc = ff_wait(&l->rs);
    if (rc == FF_OK)
        finish_rs(l);
    return rc;
}

int ff_linear_wait_grad(ff_linear *l) { return wait_rs(l); }

int ff_linear_seq_wait_grads(ff_linear_seq *s)
{
    int rc = FF_OK;
    for (int i = 0; i < s->n_layers; i++) {
        int r = wait_rs(s->layers[i]);
        if (r && rc == FF_OK)
            rc = r;
    }
    return rc;
}

/* Completes reduce-scatters that have finished, without waiting. */
static int reap(ff_linear_seq *s)
{
    for (int i = 0; i < s->n_layers; i++) {
        ff_linear *l = s->layers[i];
        if (!l->rs)
            continue;
        int done = 0, rc = ff_test(l->rs, &done);
        if (rc)
            return rc;
        if (done) {
            if ((rc = ff_wait(&l->rs)))
                return rc;
            finish_rs(l);
        }
    }
    return FF_OK;
}

/* The program's next use must be (l, kind), where kind FF_USE_FORWARD also
 * accepts a recompute; returns the gathered weight, ready (NULL for a
 * gradient-only use), or, for a product that allows it (allow_cmm), NULL
 * with the gather in flight on the ring: the collective matmul. */
static int acquire(ff_linear *l, ff_use_kind want, int allow_cmm, const float **w)
{
    l->w16 = NULL;
    ff_linear_seq *s = l->seq;
    ff_ctx *ctx = s->ctx;
    if (!s->running)
        return ff_set_error(ctx, FF_EINVAL, "layer '%s' used outside ff_linear_seq_begin/end",
                            l->name);
    if (s->cursor >= s->n_prog)
        return ff_set_error(ctx, FF_EINVAL, "layer '%s' used after the program's last use",
                            l->name);
    const ff_linear_use *u = &s->prog[s->cursor];
    ff_use_kind kind = u->kind == FF_USE_RECOMPUTE ? FF_USE_FORWARD : u->kind;
    if (u->layer != l->index || kind != want) {
        static const char *const kinds[] = {"forward", "recompute", "backward", "gradient use"};
        return ff_set_error(
            ctx, FF_EINVAL, "layer '%s' %s called out of program order: use %d is the %s of '%s'",
            l->name, kinds[want], s->cursor, kinds[u->kind], s->layers[u->layer]->name);
    }
    int rc = reap(s);
    if (rc)
        return rc;
    if (want == FF_USE_GRAD) {
        *w = NULL;
        return prefetch(s, s->cursor);
    }
    if (l->gz == 1) {
        if ((rc = weight_ready(l)))
            return rc;
        *w = l->w;
        /* a product on oneDNN reads the 2-byte shard itself (l->w16; what it
         * is given in fp32 is not read) */
        if (l->w_bf16 && (l->in16 || l->want16) && want != FF_USE_GRAD)
            l->w16 = l->w_bf16;
        else if (l->w_bf16) { /* a group of one: the 2-byte shard widened for this use */
            if (!(l->w_wide = buf_take(s, l->block)))
                return FF_ENOMEM;
            ff_bf16_unpack(l->w_wide, l->w_bf16, l->block);
            *w = l->w_wide;
        }
        return prefetch(s, s->cursor);
    }
    if (s->need_gather[s->cursor] && !l->held) {
        /* not prefetched: a forward with the collective matmul computes
         * while the ring delivers the shards (ff_linear_forward_rows) */
        int cmm = allow_cmm && want == FF_USE_FORWARD && cmm_fits(l);
        if ((rc = post_gather(l, cmm)))
            return rc;
        if (cmm) {
            s->cmm_uses++;
            *w = NULL;
            return prefetch(s, s->cursor);
        }
    }
    if (!l->held)
        return ff_set_error(ctx, FF_EINVAL, "layer '%s': gathered weight missing (internal)",
                            l->name);
    /* OAG: the next layer's gather goes out before this one waits or computes */
    if ((rc = prefetch(s, s->cursor)))
        return rc;
    if ((rc = ff_wait(&l->ag)))
        return rc;
    *w = l->w_gathered;
    return FF_OK;
}

static int release(ff_linear *l)
{
    ff_linear_seq *s = l->seq;
    if (l->gz > 1 && s->prog[s->cursor].kind != FF_USE_GRAD && !s->keep_after[s->cursor])
        drop_gathered(l);
    drop_wide(l);
    l->w16 = NULL;
    s->cursor++;
    /* a gather the prefetch skipped because its buffer was still in use */
    return prefetch(s, s->cursor - 1);
}

int ff_linear_seq_begin(ff_linear_seq *s)
{
    if (!s->n_prog)
        return ff_set_error(s->ctx, FF_EINVAL, "no program set for the layer sequence");
    if (s->running)
        return ff_set_error(s->ctx, FF_EINVAL, "ff_linear_seq_begin called twice without end");
    for (int i = 0; i < s->n_layers; i++) {
        ff_linear *l = s->layers[i];
        if (!(l->w || l->w_bf16) || (l->has_bias && !l->b)) /* (SAMO: the copy alone) */
            return ff_set_error(s->ctx, FF_EINVAL, "layer '%s' has no bound %s", l->name,
                                l->w || l->w_bf16 ? "bias" : "weight");
    }
    s->running = 1;
    s->cursor = 0;
    return prefetch(s, -1);
}

int ff_linear_seq_end(ff_linear_seq *s)
{
    if (!s->running)
        return ff_set_error(s->ctx, FF_EINVAL, "ff_linear_seq_end without begin");
    s->running = 0;
    int rc = FF_OK;
    for (int i = 0; i < s->n_layers; i++) {
        ff_linear *l = s->layers[i];
        /* reduce-scatters stay in flight (ORS): ff_linear_seq_wait_grads */
        if (l->ag) {
            int r = ff_wait(&l->ag);
            if (r && rc == FF_OK)
                rc = r;
        }
        if (l->held)
            drop_gathered(l);
        drop_wide(l);
        if (l->dw_block) {
            buf_give(s, l->dw_block, l->block);
            l->dw_block = NULL;
        }
    }
    if (rc == FF_OK && s->cursor != s->n_prog)
        rc = ff_set_error(s->ctx, FF_EINVAL, "the run ended after %d of the program's %d uses",
                          s->cursor, s->n_prog);
    return rc;
}

/* ---- forward and backward ------------------------------------------------------------- */

/* out (m, cols of op(W)) = a (m, rows of op(W)) op(W), op(W) = W_rc (kl, nl)
 * or, with `transposed`, W_rc^T; the stored block is W_rc (KN) or W_rc^T (NK) */
static int times_weight(ff_linear *l, const char *name, int transposed, const float *w,
                        const float *a, const uint16_t *a16, int64_t m, float *out)
{
    int64_t inner = transposed ? l->nl : l->kl, cols = transposed ? l->kl : l->nl;
    int stored_t = l->layout == FF_WEIGHT_NK;
    int64_t ldw = stored_t ? l->kl : l->nl;
    return ff_gemm_run2(l->seq->gemm, name, 0, transposed != stored_t, m, cols, inner, 1.0f, a, a16,
                        inner, w, l->w16, ldw, 0.0f, out, cols);
}

/* p + off, or NULL for NULL (an operand absent in one of its formats) */
static const float *at_f(const float *p, int64_t off) { return p ? p + off : NULL; }
static const uint16_t *at_h(const uint16_t *p, int64_t off) { return p ? p + off : NULL; }

/* The block gradient this run's backward uses accumulate into: with Gz = 1
 * the shard itself (beta 1, micro-batches add up), else a pool buffer that
 * the first contribution overwrites (beta 0). A compressed gradient with
 * Gz = 1 (SAMO) goes through a pool buffer that starts as the dense shard
 * would be, its kept entries expanded into zeros (beta 1), so every kept
 * entry sees the dense arithmetic; backward_use_done takes them back. */
static int grad_block(ff_linear *l, float **block, float *beta)
{
    *block = l->dw;
    *beta = 1.0f;
    if (l->gz == 1 && !l->sidx)
        return FF_OK;
    if (!l->dw_block) {
        if (!(l->dw_block = buf_take(l->seq, l->block)))
            return FF_ENOMEM;
        l->dw_contributions = 0;
        if (l->gz == 1) {
            memset(l->dw_block, 0, l->block * sizeof(float));
            for (size_t k = 0; k < l->sn; k++)
                l->dw_block[l->sidx[k] - l->sbase] = l->sg[k];
        }
    }
    *block = l->dw_block;
    *beta = l->dw_contributions || l->gz == 1 ? 1.0f : 0.0f;
    return FF_OK;
}

static int backward_use_done(ff_linear *l);

/* Decomposition (docs/linear.md, "Decomposition"): a product whose result
 * is all-reduced is computed in k chunks of rows, and chunk i's all-reduce
 * is posted as soon as its GEMM is done, so it is in flight during the next
 * chunk's GEMM. The chunks are whole GEMM panels: with t panels of P rows
 * (the last one shorter), chunk i is panels [t i / k, t (i + 1) / k), so the
 * BLAS calls are those of the whole product and no element's arithmetic
 * changes (a BLAS may round a shorter call differently: OpenBLAS does). At
 * most t chunks. The all-reduce of a chunk may still add an element's terms
 * in another order than the whole vector's (docs/linear.md). Fills
 * bounds[0..k] (row offsets) and returns k. The forward (rows x nl, inner
 * kl) and the input gradient (rows x kl, inner nl) have the same panels. */
int ff_decompose_bounds(int decompose, int64_t panel, int64_t rows,
                        int64_t bounds[FF_DECOMPOSE_MAX + 1])
{
    int64_t p = panel > 0 ? panel : 1;
    int64_t t = rows > 0 ? (rows + p - 1) / p : 1;
    int k = decompose > 1 ? (decompose < FF_DECOMPOSE_MAX ? decompose : FF_DECOMPOSE_MAX) : 1;
    if (k > t)
        k = (int)t;
    for (int i = 0; i < k; i++) {
        int64_t r = p * (t * i / k);
        bounds[i] = r < rows ? r : rows;
    }
    bounds[k] = rows;
    return k;
}

static int chunk_bounds(const ff_linear *l, int64_t rows, int64_t bounds[FF_DECOMPOSE_MAX + 1])
{
    return ff_decompose_bounds(l->decompose, ff_gemm_panel_height(l->seq->gemm, l->nl, l->kl), rows,
                               bounds);
}

/* A bias pass (passes.h) on the GPU or here, rows in order: out rows
 * [r0, r0 + rows) += b, or db += the column sums of dout's rows. */
void ff_bias_pass(ff_ctx *ctx, ff_pass_id id, const bias_job *j)
{
    if (ff_dev_pass(ctx, id, j->nl, j))
        return;
    if (id == FF_PASS_BIAS_ADD)
        for (int64_t i = j->r0; i < j->r0 + j->rows; i++) {
            float *o = j->out + i * j->nl;
            for (int64_t c = 0; c < j->nl; c++)
                o[c] += j->b[c];
        }
    else { /* in blocks of rows (passes.h), columns in chunks of `part` */
        enum { CHUNK = 512 };
        float part[CHUNK];
        for (int64_t c0 = 0; c0 < j->nl; c0 += CHUNK) {
            const int64_t w = j->nl - c0 < CHUNK ? j->nl - c0 : CHUNK;
            for (int64_t i0 = 0; i0 < j->rows; i0 += FF_BIAS_BLOCK) {
                const int64_t i1 = i0 + FF_BIAS_BLOCK < j->rows ? i0 + FF_BIAS_BLOCK : j->rows;
                for (int64_t c = 0; c < w; c++)
                    part[c] = 0.0f;
                for (int64_t i = i0; i < i1; i++) {
                    if (j->dout16) {
                        const uint16_t *g = j->dout16 + i * j->nl + c0;
                        for (int64_t c = 0; c < w; c++)
                            part[c] += ff_bf16_to_float(g[c]);
                        continue;
                    }
                    const float *g = j->dout + i * j->nl + c0;
                    for (int64_t c = 0; c < w; c++)
                        part[c] += g[c];
                }
                for (int64_t c = 0; c < w; c++)
                    j->db[c0 + c] += part[c];
            }
        }
    }
}

/* Chunk i of the forward is complete: bias, then the caller's row-wise work. */
static void forward_chunk_done(ff_linear *l, float *out, int64_t r0, int64_t r1,
                               ff_linear_rows_fn done, void *arg)
{
    if (l->has_bias)
        ff_bias_pass(l->seq->ctx, FF_PASS_BIAS_ADD,
                     &(bias_job){.out = out, .b = l->b, .r0 = r0, .rows = r1 - r0, .nl = l->nl});
    if (done)
        done(arg, r0, r1 - r0);
}

/* The collective matmul (docs/linear.md): out = inp W_rc with the gather of
 * W_rc in flight on the ring, multiplying shard b = z, z-1, ... (the ring's
 * order, fixed, so the bits do not depend on timing) as soon as it is
 * there. KN: shard b is rows [b kz, (b+1) kz) of W_rc, a slice of the inner
 * dimension, and the partial products add up in out; NK: it is rows of
 * W_rc^T, the output's columns [b nz, (b+1) nz). */
static int cmm_forward(ff_linear *l, const char *name, const float *w, float *out, const float *inp,
                       int64_t rows)
{
    const int p = l->gz, z = ff_group_rank(l->grp_z), kn = l->layout == FF_WEIGHT_KN;
    const int64_t piece = (kn ? l->kl : l->nl) / p;
    int rc = FF_OK;
    for (int i = 0; i < p && rc == FF_OK; i++) {
        int b = (z - i + p) % p, ready = l->ag ? 0 : p;
        while (rc == FF_OK && ready <= i)
            rc = ff_allgather_ready(l->ag, &ready);
        if (rc)
            break;
        const float *wb = w + (size_t)b * l->shard;
        if (kn)
            rc = ff_gemm_run2(l->seq->gemm, name, 0, 0, rows, l->nl, piece, 1.0f,
                              at_f(inp, b * piece), at_h(l->in16, b * piece), l->kl, wb, NULL,
                              l->nl, i ? 1.0f : 0.0f, out, l->nl);
        else
            rc = ff_gemm_run2(l->seq->gemm, name, 0, 1, rows, piece, l->kl, 1.0f, inp, l->in16,
                              l->kl, wb, NULL, l->kl, 0.0f, out + b * piece, l->nl);
    }
    int rc2 = ff_wait(&l->ag);
    return rc ? rc : rc2;
}

static int forward_rows(ff_linear *l, float *out, const float *inp, int64_t rows,
                        ff_linear_rows_fn done, void *arg)
{
    const float *w;
    int rc = acquire(l, FF_USE_FORWARD, 1, &w);
    if (rc)
        return rc;
    char name[NAME_LEN + 8];
    /* With the collective matmul every forward of the layer is computed
     * shard by shard, whether its gather is in flight (w NULL) or done, so
     * that its bits (a forward's and its recompute's alike) do not depend
     * on prefetching; then the whole output's all-reduce. */
    if (cmm_fits(l)) {
        snprintf(name, sizeof name, "cmm %s", l->name);
        ff_request *req = NULL;
        if ((rc = cmm_forward(l, name, w ? w : l->w_gathered, out, inp, rows)) ||
            (rc = ff_iallreduce(l->grp_r, out, out, (size_t)(rows * l->nl), &l->coll, &req)) ||
            (rc = ff_wait(&req)))
            return rc;
        forward_chunk_done(l, out, 0, rows, done, arg);
        return release(l);
    }
    snprintf(name, sizeof name, "fwd %s", l->name);
    /* out (rows, nl) = inp (rows, kl) W_rc, the partial sum over this rank's
     * rows of W, then O = AllReduce_R(O), chunk by chunk: chunk i's GEMM,
     * post its all-reduce, then finish chunk i - 1 (OAG's next gather
     * advances during the waits) */
    int64_t at[FF_DECOMPOSE_MAX + 1];
    const int k = chunk_bounds(l, rows, at);
    ff_request *req[FF_DECOMPOSE_MAX] = {0};
    for (int i = 0; i <= k && rc == FF_OK; i++) {
        if (i < k) {
            int64_t r0 = at[i], n = at[i + 1] - r0;
            float *o = out + r0 * l->nl;
            if ((rc = times_weight(l, name, 0, w, at_f(inp, r0 * l->kl), at_h(l->in16, r0 * l->kl),
                                   n, o)) ||
                (rc = ff_iallreduce(l->grp_r, o, o, (size_t)(n * l->nl), &l->coll, &req[i])))
                break;
        }
        if (i > 0 && (rc = ff_wait(&req[i - 1])) == FF_OK)
            forward_chunk_done(l, out, at[i - 1], at[i], done, arg);
    }
    int rc2 = ff_waitall(req, k);
    return rc ? rc : rc2 ? rc2 : release(l);
}

/* bf16-mixed (docs/design.md §13): an operand of the products, n values
 * rounded to bf16 in a pool buffer: for the emulation bf16 values in fp32
 * words, whose products the BLAS forms exactly in fp32; for oneDNN
 * (ff_gemm_bf16_direct) 2 bytes each, which it reads without rounding
 * them again. Returns the buffer (*half: 2-byte) and its size in floats. */
static void *bf16_operand(ff_linear *l, const float *x, size_t n, int half, size_t *floats)
{
    *floats = half ? (n + 1) / 2 : n;
    void *b = buf_take(l->seq, *floats);
    if (b && half)
        ff_bf16_pack(b, x, n);
    else if (b)
        ff_bf16_round_copy(b, x, n);
    return b;
}

/* A 2-byte input (rows x kl) as the products read it: in place on oneDNN
 * (l->in16; NULL returned), else widened into a pool buffer (*floats). */
static int bf16_input(ff_linear *l, const uint16_t *inp16, int64_t rows, float **wide,
                      size_t *floats)
{
    *wide = NULL;
    *floats = 0;
    if (ff_gemm_bf16_direct(l->seq->gemm)) {
        l->in16 = inp16;
        return FF_OK;
    }
    *floats = (size_t)(rows * l->kl);
    if (!(*wide = buf_take(l->seq, *floats)))
        return FF_ENOMEM;
    ff_bf16_unpack(*wide, inp16, *floats);
    return FF_OK;
}

static int forward_bf16(ff_linear *l, float *out, const float *inp, const uint16_t *inp16,
                        int64_t rows, ff_linear_rows_fn done, void *arg)
{
    size_t nf = 0;
    void *inp_b = NULL;
    float *wide = NULL;
    int rc;
    if (inp16) {
        if ((rc = bf16_input(l, inp16, rows, &wide, &nf)))
            return rc;
        inp_b = wide;
    } else {
        const int half = ff_gemm_bf16_direct(l->seq->gemm);
        if (!(inp_b = bf16_operand(l, inp, (size_t)(rows * l->kl), half, &nf)))
            return FF_ENOMEM;
        l->in16 = half ? inp_b : NULL;
        wide = half ? NULL : inp_b;
    }
    ff_gemm_bf16_operands(l->seq->gemm, 1);
    rc = forward_rows(l, out, wide, rows, done, arg);
    ff_gemm_bf16_operands(l->seq->gemm, 0);
    l->in16 = NULL;
    buf_give(l->seq, inp_b, nf);
    return rc;
}

int ff_linear_forward_rows(ff_linear *l, float *out, const float *inp, int64_t rows,
                           ff_linear_rows_fn done, void *arg)
{
    if (!l->seq->opt.bf16)
        return forward_rows(l, out, inp, rows, done, arg);
    return forward_bf16(l, out, inp, NULL, rows, done, arg);
}

int ff_linear_forward_keep(ff_linear *l, float *out, const float *inp, uint16_t *keep, int64_t rows,
                           ff_linear_rows_fn done, void *arg)
{
    if (!l->seq->opt.bf16)
        return ff_set_error(l->seq->ctx, FF_EINVAL, "layer '%s': a 2-byte input needs bf16-mixed",
                            l->name);
    ff_bf16_pack(keep, inp, (size_t)(rows * l->kl));
    return forward_bf16(l, out, NULL, keep, rows, done, arg);
}

int ff_linear_forward(ff_linear *l, float *out, const float *inp, int64_t rows)
{
    return ff_linear_forward_rows(l, out, inp, rows, NULL, NULL);
}

static int backward(ff_linear *l, float *dinp, const float *dout, const float *inp, int64_t rows);
/* bf16-mixed: the products and the bias's sums read the input and the output
 * gradient rounded to bf16 (the input as the forward read it; inp16: kept
 * so by ff_linear_forward_keep) */
static int backward_bf16(ff_linear *l, float *dinp, const float *dout, const float *inp,
                         const uint16_t *inp16, int64_t rows)
{
    const int half = ff_gemm_bf16_direct(l->seq->gemm);
    size_t ni = 0, no = 0;
    void *inp_b = NULL;
    float *wide = NULL;
    int rc = FF_OK;
    if (inp16)
        rc = bf16_input(l, inp16, rows, &wide, &ni), inp_b = wide;
    else if ((inp_b = bf16_operand(l, inp, (size_t)(rows * l->kl), half, &ni)))
        l->in16 = half ? inp_b : NULL, wide = half ? NULL : inp_b;
    else
        rc = FF_ENOMEM;
    void *dout_b = rc ? NULL : bf16_operand(l, dout, (size_t)(rows * l->nl), half, &no);
    l->dout16 = half ? dout_b : NULL;
    ff_gemm_bf16_operands(l->seq->gemm, 1);
    if (rc == FF_OK)
        rc = dout_b ? backward(l, dinp, half ? NULL : dout_b, wide, rows) : FF_ENOMEM;
    ff_gemm_bf16_operands(l->seq->gemm, 0);
    l->in16 = l->dout16 = NULL;
    buf_give(l->seq, dout_b, no);
    buf_give(l->seq, inp_b, ni);
    return rc;
}

int ff_linear_backward(ff_linear *l, float *dinp, const float *dout, const float *inp, int64_t rows)
{
    if (!l->seq->opt.bf16)
        return backward(l, dinp, dout, inp, rows);
    return backward_bf16(l, dinp, dout, inp, NULL, rows);
}

int ff_linear_backward_bf16(ff_linear *l, float *dinp, const float *dout, const uint16_t *inp16,
                            int64_t rows)
{
    if (!l->seq->opt.bf16)
        return ff_set_error(l->seq->ctx, FF_EINVAL, "layer '%s': a 2-byte input needs bf16-mixed",
                            l->name);
    return backward_bf16(l, dinp, dout, NULL, inp16, rows);
}

/* The wire of the weight gradients' reduce-scatter: fp32 in bf16-mixed
 * (docs/design.md §13) */
static ff_coll_opts grad_coll(const ff_linear *l)
{
    ff_coll_opts grad = l->coll;
    if (l->seq->opt.bf16)
        grad.wire = FF_WIRE_FP32;
    return grad;
}

/* The reduce-scatter collective matmul (docs/linear.md; seed 003's
 * decomposed reduce-scatter): dW_shard += ReduceScatter_Z(dW_rc) with
 * dW_rc (the block, beta 1 onto this run's earlier contributions) computed
 * shard by shard in the order the ring reduce-scatter reads them, b = z-1,
 * z-2, ..., z (this rank's own shard last), each fed to the ring as soon
 * as its product is done: step s's transfer and the addition of the
 * received partial sum into shard z-s-2 run during the next products. KN:
 * shard b is rows [b kz, (b+1) kz) of dW_rc = I^T dO, the product of I's
 * columns of that slice; NK: rows [b nz, (b+1) nz) of dW_rc^T = dO^T I.
 * The ring's messages, bytes and additions are the plain reduce-scatter's;
 * only the products are other BLAS calls. */
static int rs_cmm_grad(ff_linear *l, const char *name, float *block, float beta, const float *dout,
                       const float *inp, int64_t rows)
{
    ff_linear_seq *s = l->seq;
    /* the previous micro-batch's result is added first (ORS's order) */
    int rc = wait_rs(l);
    if (rc)
        return rc;
    if (!(l->rs_out = buf_take(s, l->shard)))
        return FF_ENOMEM;
    l->rs_send = block;
    l->dw_block = NULL; /* backward_use_done: the reduce-scatter is posted */
    ff_coll_opts grad = grad_coll(l);
    if ((rc = ff_ireduce_scatter_fed(l->grp_z, block, l->rs_out, l->shard, &grad, &l->rs))) {
        buf_give(s, l->rs_out, l->shard);
        buf_give(s, l->rs_send, l->block);
        l->rs_out = l->rs_send = NULL;
        return rc;
    }
    s->rs_cmm_uses++;
    const int p = l->gz, z = ff_group_rank(l->grp_z), kn = l->layout == FF_WEIGHT_KN;
    const int64_t piece = (kn ? l->kl : l->nl) / p;
    for (int i = 0; i < p && rc == FF_OK; i++) {
        const int b = (z - 1 - i + 2 * p) % p;
        float *db = block + (size_t)b * l->shard;
        /* (bf16-mixed on oneDNN: the 2-byte operands, as the plain product's) */
        if (kn)
            rc = ff_gemm_run2(s->gemm, name, 1, 0, piece, l->nl, rows, 1.0f, at_f(inp, b * piece),
                              at_h(l->in16, b * piece), l->kl, dout, l->dout16, l->nl, beta, db,
                              l->nl);
        else
            rc = ff_gemm_run2(s->gemm, name, 1, 0, piece, l->kl, rows, 1.0f, at_f(dout, b * piece),
                              at_h(l->dout16, b * piece), l->nl, inp, l->in16, l->kl, beta, db,
                              l->kl);
        if (rc == FF_OK)
            rc = ff_reduce_scatter_feed(l->rs, i + 1);
    }
    if (rc) /* the other ranks' rings need every block: feed them (the error is returned) */
        ff_reduce_scatter_feed(l->rs, p);
    return rc;
}

static int backward(ff_linear *l, float *dinp, const float *dout, const float *inp, int64_t rows)
{
    ff_linear_seq *s = l->seq;
    ff_ctx *ctx = s->ctx;
    if (!has_grad(l) || (l->has_bias && !l->db))
        return ff_set_error(ctx, FF_EINVAL, "layer '%s' has no bound gradient", l->name);
    const float *w;
    int rc = acquire(l, FF_USE_BACKWARD, 0, &w);
    if (rc)
        return rc;
    char name[NAME_LEN + 8];
    ff_request *ar[FF_DECOMPOSE_MAX] = {0};
    int64_t at[FF_DECOMPOSE_MAX + 1];
    const int k = dinp ? chunk_bounds(l, rows, at) : 0;
    /* dI (rows, kl) = dO (rows, nl) W_rc^T, then AllReduce_C, in k chunks
     * of rows: each chunk's all-reduce is in flight during the next GEMMs */
    snprintf(name, sizeof name, "dI %s", l->name);
    for (int i = 0; i < k && rc == FF_OK; i++) {
        int64_t r0 = at[i], n = at[i + 1] - r0;
        float *d = dinp + r0 * l->kl;
        if ((rc = times_weight(l, name, 1, w, at_f(dout, r0 * l->nl), at_h(l->dout16, r0 * l->nl),
                               n, d)) == FF_OK)
            rc = ff_iallreduce(l->grp_c, d, d, (size_t)(n * l->kl), &l->coll, &ar[i]);
    }
    /* OAR: the all-reduces run while dW is computed (paper IV-A) */
    if (rc == FF_OK && !l->oar)
        rc = ff_waitall(ar, k);

    /* dW_rc (kl, nl) = I^T dO, accumulated over this run's backward uses */
    float *block, beta;
    if (rc || (rc = grad_block(l, &block, &beta))) {
        ff_waitall(ar, k);
        return rc;
    }
    if (rs_cmm_fits(l)) {
        snprintf(name, sizeof name, "rs-cmm %s", l->name);
        rc = rs_cmm_grad(l, name, block, beta, dout, inp, rows);
    } else {
        snprintf(name, sizeof name, "dW %s", l->name);
        if (l->layout == FF_WEIGHT_KN)
            rc = ff_gemm_run2(s->gemm, name, 1, 0, l->kl, l->nl, rows, 1.0f, inp, l->in16, l->kl,
                              dout, l->dout16, l->nl, beta, block, l->nl);
        else /* dW_rc^T (nl, kl) = dO^T I */
            rc = ff_gemm_run2(s->gemm, name, 1, 0, l->nl, l->kl, rows, 1.0f, dout, l->dout16, l->nl,
                              inp, l->in16, l->kl, beta, block, l->kl);
    }
    l->dw_contributions++;
    if (rc) {
        ff_waitall(ar, k);
        return rc;
    }
    /* db (nl) += column sums of dO: this rank's rows; summed over ZD later */
    if (l->has_bias)
        ff_bias_pass(
            s->ctx, FF_PASS_BIAS_GRAD,
            &(bias_job){.db = l->db, .dout = dout, .dout16 = l->dout16, .rows = rows, .nl = l->nl});
    if ((rc = ff_waitall(ar, k)))
        return rc;
    return backward_use_done(l);
}

int ff_linear_use_begin(ff_linear *l, const float **w_block, float **dw_block)
{
    ff_linear_seq *s = l->seq;
    *w_block = NULL;
    *dw_block = NULL;
    int grad = s->running && s->cursor < s->n_prog && s->prog[s->cursor].kind == FF_USE_GRAD;
    if (grad && !has_grad(l))
        return ff_set_error(s->ctx, FF_EINVAL, "layer '%s' has no bound gradient", l->name);
    int rc = acquire(l, grad ? FF_USE_GRAD : FF_USE_FORWARD, 0, w_block);
    if (rc || !grad)
        return rc;
    float beta;
    if ((rc = grad_block(l, dw_block, &beta)))
        return rc;
    if (beta == 0.0f)
        memset(*dw_block, 0, l->block * sizeof(float));
    l->dw_contributions++;
    return FF_OK;
}

int ff_linear_use_begin_bf16(ff_linear *l, const uint16_t **w16_block, const float **w_block,
                             float **dw_block)
{
    l->want16 = 1;
    int rc = ff_linear_use_begin(l, w_block, dw_block);
    l->want16 = 0;
    *w16_block = rc ? NULL : l->w16;
    if (*w16_block)
        *w_block = NULL;
    return rc;
}

int ff_linear_use_end(ff_linear *l)
{
    ff_linear_seq *s = l->seq;
    if (!s->running || s->cursor >= s->n_prog || s->prog[s->cursor].layer != l->index)
        return ff_set_error(s->ctx, FF_EINVAL, "ff_linear_use_end on '%s' without a use", l->name);
    if (s->prog[s->cursor].kind == FF_USE_GRAD)
        return backward_use_done(l);
    return release(l);
}

/* After a backward use: releases the weight; after the layer's last
 * backward use of the run, posts the gradient's reduce-scatter. */
static int backward_use_done(ff_linear *l)
{
    ff_linear_seq *s = l->seq;
    int rc, last = s->cursor == l->last_backward;
    if ((rc = release(l)))
        return rc;
    if (last && l->gz == 1 && l->dw_block) { /* SAMO: the kept entries back */
        for (size_t k = 0; k < l->sn; k++)
            l->sg[k] = l->dw_block[l->sidx[k] - l->sbase];
        buf_give(s, l->dw_block, l->block);
        l->dw_block = NULL;
    }
    if (!last || l->gz == 1)
        return FF_OK;
    if (!l->dw_block) /* the reduce-scatter collective matmul posted it (rs_cmm_grad) */
        return l->ors ? FF_OK : wait_rs(l);
    /* dW_shard += ReduceScatter_Z(dW_rc); ORS defers the wait until the
     * gradient is needed (paper IV-B). The previous micro-batch's result is
     * added first, so the order of the additions never changes. */
    if ((rc = wait_rs(l)))
        return rc;
    if (!(l->rs_out = buf_take(s, l->shard)))
        return FF_ENOMEM;
    l->rs_send = l->dw_block;
    l->dw_block = NULL;
    ff_coll_opts grad = grad_coll(l); /* weight gradients in fp32 (docs/design.md §13) */
    if ((rc = ff_ireduce_scatter(l->grp_z, l->rs_send, l->rs_out, l->shard, &grad, &l->rs))) {
        buf_give(s, l->rs_out, l->shard);
        buf_give(s, l->rs_send, l->block);
        l->rs_out = l->rs_send = NULL;
        return rc;
    }
    return l->ors ? FF_OK : wait_rs(l);
}

int ff_linear_seq_allreduce_grads(ff_linear_seq *s)
{
    if (s->running)
        return ff_set_error(s->ctx, FF_EINVAL, "gradients are reduced after ff_linear_seq_end");
    int rc0 = ff_linear_seq_wait_grads(s);
    if (rc0)
        return rc0;
    ff_request **reqs = calloc((size_t)(2 * s->n_layers + 1), sizeof *reqs);
    if (!reqs)
        return ff_set_error(s->ctx, FF_ENOMEM, "out of memory for gradient all-reduces");
    ff_group *gd = ff_grid_group(s->grid, FF_GROUP_D), *gzd = ff_grid_group(s->grid, FF_GROUP_ZD);
    ff_coll_opts grad = s->opt.coll;
    if (s->opt.bf16) /* gradients in fp32 (docs/design.md §13) */
        grad.wire = FF_WIRE_FP32;
    int rc = FF_OK, n = 0;
    for (int i = 0; i < s->n_layers && rc == FF_OK; i++) {
        ff_linear *l = s->layers[i];
        if (l->dw) /* (a compressed gradient is the model's to reduce) */
            rc = ff_iallreduce(gd, l->dw, l->dw, l->shard, &grad, &reqs[n++]);
        if (rc == FF_OK && l->has_bias && l->db)
            rc = ff_iallreduce(gzd, l->db, l->db, (size_t)l->nl, &grad, &reqs[n++]);
    }
    int rc2 = ff_waitall(reqs, n);
    free(reqs);
    return rc ? rc : rc2;
}

/* ---- canonical layout -------------------------------------------------------------------- */

static int64_t canon_col(const ff_linear *l, int64_t permuted)
{
    return l->col_perm ? l->col_perm[permuted] : permuted;
}

static int64_t canon_index_at(const ff_linear *l, ff_dims c, size_t e)
{
    int n_kind = l->kind == FF_LINEAR_N;
    int64_t rb = n_kind ? c.y : c.x, cb = n_kind ? c.x : c.y;
    int64_t f = (int64_t)c.z * (int64_t)l->shard + (int64_t)e, i, j;
    if (l->layout == FF_WEIGHT_KN)
        i = f / l->nl, j = f % l->nl;
    else
        j = f / l->kl, i = f % l->kl;
    int64_t row = rb * l->kl + i, col = canon_col(l, cb * l->nl + j);
    return l->layout == FF_WEIGHT_KN ? row * l->n + col : col * l->k + row;
}

static int64_t canon_bias_at(const ff_linear *l, ff_dims c, size_t j)
{
    int64_t cb = l->kind == FF_LINEAR_N ? c.x : c.y;
    return canon_col(l, cb * l->nl + (int64_t)j);
}

int64_t ff_linear_canonical_index(const ff_linear *l, size_t e)
{
    return canon_index_at(l, ff_grid_coords(l->seq->grid), e);
}

int64_t ff_linear_canonical_bias_index(const ff_linear *l, size_t j)
{
    return canon_bias_at(l, ff_grid_coords(l->seq->grid), j);
}

/* above the engine's collective tags (1..30000), below MPI's guaranteed
 * upper bound of 32767, so a collective in flight on the same communicator
 * cannot match */
enum { TAG_SHARD = 32101, TAG_BIAS = 32102 };
#define MAX_MSG_FLOATS ((size_t)1 << 28)

static int send_floats(ff_ctx *ctx, MPI_Comm comm, const float *p, size_t n, int peer, int tag)
{
    for (size_t off = 0; off < n || (n == 0 && off == 0); off += MAX_MSG_FLOATS) {
        size_t len = n - off < MAX_MSG_FLOATS ? n - off : MAX_MSG_FLOATS;
        int rc = MPI_Send(p + off, (int)len, MPI_FLOAT, peer, tag, comm);
        if (rc != MPI_SUCCESS)
            return ff_mpi_error(ctx, rc, "MPI_Send of a shard");
        if (n == 0)
            break;
    }
    return FF_OK;
}

static int recv_floats(ff_ctx *ctx, MPI_Comm comm, float *p, size_t n, int peer, int tag)
{
    for (size_t off = 0; off < n || (n == 0 && off == 0); off += MAX_MSG_FLOATS) {
        size_t len = n - off < MAX_MSG_FLOATS ? n - off : MAX_MSG_FLOATS;
        int rc = MPI_Recv(p + off, (int)len, MPI_FLOAT, peer, tag, comm, MPI_STATUS_IGNORE);
        if (rc != MPI_SUCCESS)
            return ff_mpi_error(ctx, rc, "MPI_Recv of a shard");
        if (n == 0)
            break;
    }
    return FF_OK;
}

/* The ranks a gather or scatter spans: the layer's pipeline stage. */
static ff_group *stage_group(const ff_linear *l)
{
    return ff_grid_group(l->seq->grid, FF_GROUP_STAGE);
}

/* Arguments are checked on every rank and agreed before any message moves,
 * so a mistake on one rank cannot leave the others blocked. */
static int check_transfer(ff_linear *l, int root, int is_root, const void *canon, const void *shard,
                          const void *bcanon, const void *b, float **buf)
{
    ff_ctx *ctx = l->seq->ctx;
    int rc = FF_OK;
    *buf = NULL;
    if (is_root) {
        size_t n = l->shard > (size_t)l->nl ? l->shard : (size_t)l->nl;
        if (!(*buf = malloc(n * sizeof(float) + 1)))
            rc = ff_set_error(ctx, FF_ENOMEM, "out of memory moving layer '%s'", l->name);
    }
    if (rc)
        ;
    else if (root < 0 || root >= ff_group_size(stage_group(l)))
        rc = ff_set_error(ctx, FF_EINVAL, "layer '%s': root %d is not a rank of its stage", l->name,
                          root);
    else if (!shard || (is_root && !canon))
        rc = ff_set_error(ctx, FF_EINVAL, "layer '%s': missing weight buffer", l->name);
    else if (l->has_bias && (!b || (is_root && !bcanon)))
        rc = ff_set_error(ctx, FF_EINVAL, "layer '%s': missing bias buffer", l->name);
    rc = ff_agree_on(ctx, ff_group_comm(stage_group(l)), rc);
    if (rc) {
        free(*buf);
        *buf = NULL;
    }
    return rc;
}

/* The ranks that hold slot `slot` of a layer replicated over D in ge slots
 * (expert parallelism): d mod ge == slot. The first replica: d == slot. */
static int in_slot(ff_dims c, int ge, int slot) { return c.d % ge == slot; }

int ff_linear_scatter_slot(ff_linear *l, const float *w_canon, const float *b_canon, float *w_shard,
                           float *b, int root, int ge, int slot)
{
    ff_ctx *ctx = l->seq->ctx;
    MPI_Comm comm = ff_group_comm(stage_group(l));
    int me = ff_group_rank(stage_group(l)), is_root = me == root;
    float *buf;
    int rc = check_transfer(l, root, is_root, w_canon, w_shard, b_canon, b, &buf);
    if (rc)
        return rc;
    ff_dims shape = ff_grid_shape(l->seq->grid), mine = ff_grid_coords(l->seq->grid);
    if (!is_root) {
        if (!in_slot(mine, ge, slot))
            return FF_OK;
        if ((rc = recv_floats(ctx, comm, w_shard, l->shard, root, TAG_SHARD)))
            return rc;
        if (l->has_bias)
            rc = recv_floats(ctx, comm, b, (size_t)l->nl, root, TAG_BIAS);
        return rc;
    }
    for (int r = 0; r < ff_group_size(stage_group(l)) && rc == FF_OK; r++) {
        ff_dims c = ff_grid_coords_of(shape, r);
        if (!in_slot(c, ge, slot))
            continue;
        float *dst = r == root ? w_shard : buf;
        for (size_t e = 0; e < l->shard; e++)
            dst[e] = w_canon[canon_index_at(l, c, e)];
        if (r != root)
            rc = send_floats(ctx, comm, buf, l->shard, r, TAG_SHARD);
        if (rc == FF_OK && l->has_bias) {
            dst = r == root ? b : buf;
            for (size_t j = 0; j < (size_t)l->nl; j++)
                dst[j] = b_canon[canon_bias_at(l, c, j)];
            if (r != root)
                rc = send_floats(ctx, comm, buf, (size_t)l->nl, r, TAG_BIAS);
        }
    }
    free(buf);
    return rc;
}

int ff_linear_scatter(ff_linear *l, const float *w_canon, const float *b_canon, float *w_shard,
                      float *b, int root)
{
    return ff_linear_scatter_slot(l, w_canon, b_canon, w_shard, b, root, 1, 0);
}

/* The rank that sends a bias slice in a gather: the first replica (d =
 * slot), z = 0 and the coordinate of the group that replicates it (R) = 0. */
static int bias_owner(const ff_linear *l, ff_dims c, int slot)
{
    return c.d == slot && c.z == 0 && (l->kind == FF_LINEAR_N ? c.y : c.x) == 0;
}

int ff_linear_gather_slot(ff_linear *l, const float *w_shard, const float *b, float *w_canon,
                          float *b_canon, int root, int slot)
{
    ff_ctx *ctx = l->seq->ctx;
    MPI_Comm comm = ff_group_comm(stage_group(l));
    int me = ff_group_rank(stage_group(l)), is_root = me == root;
    float *buf;
    int rc = check_transfer(l, root, is_root, w_canon, w_shard, b_canon, b, &buf);
    if (rc)
        return rc;
    ff_dims shape = ff_grid_shape(l->seq->grid), mine = ff_grid_coords(l->seq->grid);
    if (!is_root) {
        if (mine.d == slot && (rc = send_floats(ctx, comm, w_shard, l->shard, root, TAG_SHARD)))
            return rc;
        if (l->has_bias && bias_owner(l, mine, slot))
            rc = send_floats(ctx, comm, b, (size_t)l->nl, root, TAG_BIAS);
        return rc;
    }
    for (int r = 0; r < ff_group_size(stage_group(l)) && rc == FF_OK; r++) {
        ff_dims c = ff_grid_coords_of(shape, r);
        if (c.d == slot) {
            const float *src = w_shard;
            if (r != root) {
                rc = recv_floats(ctx, comm, buf, l->shard, r, TAG_SHARD);
                src = buf;
            }
            for (size_t e = 0; rc == FF_OK && e < l->shard; e++)
                w_canon[canon_index_at(l, c, e)] = src[e];
        }
        if (rc == FF_OK && l->has_bias && bias_owner(l, c, slot)) {
            const float *src = b;
            if (r != root) {
                rc = recv_floats(ctx, comm, buf, (size_t)l->nl, r, TAG_BIAS);
                src = buf;
            }
            for (size_t j = 0; rc == FF_OK && j < (size_t)l->nl; j++)
                b_canon[canon_bias_at(l, c, j)] = src[j];
        }
    }
    free(buf);
    return rc;
}

int ff_linear_gather(ff_linear *l, const float *w_shard, const float *b, float *w_canon,
                     float *b_canon, int root)
{
    return ff_linear_gather_slot(l, w_shard, b, w_canon, b_canon, root, 0);
}

int ff_linear_init(ff_linear *l, uint64_t seed, float std)
{
    if (!l->w)
        return ff_set_error(l->seq->ctx, FF_EINVAL, "layer '%s' has no bound weight", l->name);
    ff_dims c = ff_grid_coords(l->seq->grid);
    for (size_t e = 0; e < l->shard; e++)
        l->w[e] = std * ff_rng_normal(seed, l->stream, (uint64_t)canon_index_at(l, c, e));
    if (l->has_bias && l->b)
        memset(l->b, 0, (size_t)l->nl * sizeof(float));
    return FF_OK;
}
