/* The GPT-2 model in 4D (include/fourfold/gpt.h, docs/design.md §4): parameters,
 * activations, the program of weight uses, forward and backward of a
 * micro-batch, and the gradient collectives around it. */
#include "fourfold/gpt.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "device.h"
#include "fourfold/rng.h"
#include "gpt_internal.h"
#include "gpt_ops.h"
#include "moe.h"
#include "passes.h"

void ff_gpt_opts_default(ff_gpt_opts *o)
{
    memset(o, 0, sizeof *o);
    o->dp_overlap = 1;
    o->dtd = 1;
    o->pipe.slow_stage = -1;
    ff_linear_opts_default(&o->linear);
}

ff_gpt_config ff_gpt_get_config(const ff_gpt *g) { return g->cfg; }

void ff_gpt_config_moe(ff_gpt_config *c, int E)
{
    c->experts = E;
    c->expert_every = 2;
    c->top_k = 1;
    c->capacity_factor = 1.25f;
    c->aux_coef = 0.01f;
}

int ff_gpt_block_is_moe(const ff_gpt_config *c, int l)
{
    return c->experts > 0 && c->expert_every > 0 && (l + 1) % c->expert_every == 0;
}
ff_ctx *ff_gpt_ctx(const ff_gpt *g) { return g->ctx; }
ff_linear_seq *ff_gpt_linear_seq(ff_gpt *g) { return g->seq; }

void ff_gpt_local_sequences(const ff_gpt *g, int *first, int *count)
{
    *first = (g->me.z + g->gz * g->me.d) * g->Bl;
    *count = g->Bl;
}

/* ---- creation ------------------------------------------------------------------- */

/* The per-block arrays of an ff_gpt_views: 13 of L entries (routerw last),
 * then 4 of L E (the experts'). */
enum { VIEW_ARRAYS = 17 };

static int check_shape(ff_ctx *ctx, const ff_gpt_config *c, ff_dims s, int B, int T)
{
    if (c->L <= 0 || c->C <= 0 || c->NH <= 0 || c->V <= 0 || c->maxT <= 0 || B <= 0 || T <= 0)
        return ff_set_error(ctx, FF_EINVAL,
                            "model L=%d C=%d NH=%d V=%d maxT=%d, batch B=%d T=%d: every size "
                            "must be positive",
                            c->L, c->C, c->NH, c->V, c->maxT, B, T);
    if (c->Vp < c->V)
        return ff_set_error(ctx, FF_EINVAL, "padded vocabulary %d is smaller than V=%d", c->Vp,
                            c->V);
    if (T > c->maxT)
        return ff_set_error(ctx, FF_EINVAL, "sequence length T=%d exceeds the model's maxT=%d", T,
                            c->maxT);
    if (c->C % c->NH)
        return ff_set_error(ctx, FF_EDIVIDE, "C=%d is not divisible by NH=%d", c->C, c->NH);
    if (c->NH % s.x)
        return ff_set_error(ctx, FF_EDIVIDE,
                            "NH=%d heads are not divisible by Gx=%d (each X rank takes whole "
                            "heads)",
                            c->NH, s.x);
    if (c->C % s.y)
        return ff_set_error(ctx, FF_EDIVIDE, "C=%d is not divisible by Gy=%d", c->C, s.y);
    if (c->Vp % s.x)
        return ff_set_error(ctx, FF_EDIVIDE,
                            "the padded vocabulary Vp=%d is not divisible by Gx=%d", c->Vp, s.x);
    if (B % (s.z * s.d))
        return ff_set_error(ctx, FF_EDIVIDE,
                            "the micro-batch of B=%d sequences is not divisible by Gz*Gd=%d", B,
                            s.z * s.d);
    if (c->experts < 0)
        return ff_set_error(ctx, FF_EINVAL, "%d experts: expected 0 (dense) or more", c->experts);
    if (c->experts > 0) {
        if (c->expert_every < 1 || c->expert_every > c->L)
            return ff_set_error(ctx, FF_EINVAL,
                                "experts in one block of every %d: expected 1 to the %d blocks",
                                c->expert_every, c->L);
        ff_moe_shape ms = {.C = c->C,
                           .H = 4 * (int64_t)c->C,
                           .E = c->experts,
                           .top_k = c->top_k,
                           .factor = c->capacity_factor,
                           .aux_coef = c->aux_coef,
                           .T = T};
        char why[256];
        int rc = ff_moe_check(&ms, why, sizeof why);
        if (rc)
            return ff_set_error(ctx, rc, "%s", why);
    }
    return FF_OK;
}

/* RNG streams: wte 1, block l's layer i 2 + 4l + i, expert e of MoE block
 * l: STREAM_EXPERTS + 2 (l E + e) + {0 up, 1 down}; positions STREAM_WPE,
 * block l's router STREAM_ROUTER + l. The same on every grid and stage. */
enum { STREAM_WPE = 1u << 20, STREAM_ROUTER = 1u << 21, STREAM_EXPERTS = 1u << 24 };

/* stream: the layer's RNG stream (above) */
static int add_layer(ff_gpt *g, const char *name, ff_linear_kind kind, int64_t k, int64_t n,
                     int bias, const int64_t *perm, uint32_t stream, ff_linear **out)
{
    ff_linear_desc d = {0};
    d.name = name;
    d.kind = kind;
    d.k = k;
    d.n = n;
    d.bias = bias;
    d.layout = FF_WEIGHT_NK; /* llm.c and torch store (out, in) */
    d.col_perm = perm;
    d.rng_stream = stream;
    return ff_linear_add(g->seq, &d, out);
}

static float *falloc(const ff_gpt *g, size_t n, size_t *acc)
{
    if (acc)
        *acc += n * sizeof(float);
    return ff_fbuf_alloc(g->ctx, n);
}

static int alloc_buffers(ff_gpt *g)
{
    const int64_t m = g->m, T = g->T, mc = g->m * g->cy, hm = g->last ? m : 0;
    size_t *act = &g->act_bytes, *scr = &g->scratch_bytes;
    /* bf16-mixed: the products' inputs kept in 2 bytes (ff_gpt_acts) */
    const int half = g->opt.precision == FF_PRECISION_BF16_MIXED;
    int ok = 1;
#define A(ptr, n, acc) ok &= ((ptr) = falloc(g, (size_t)(n), acc)) != NULL
    /* n 2-byte values in (n + 1) / 2 floats; none in fp32 */
#define H(ptr, n, acc)                                                                             \
    ok &= !half || ((ptr) = (uint16_t *)falloc(g, ((size_t)(n) + 1) / 2, acc)) != NULL
    A(g->act32y, half ? m * g->cy : 0, scr);
    A(g->act32x, half ? m * (g->fx > g->cx ? g->fx : g->cx) : 0, scr);
    A(g->params, g->n_params, NULL);
    A(g->grads, g->n_params, NULL);
    /* the last stage runs a micro-batch's backward right after its forward:
     * K input slots (the arriving activations) and one set of the rest */
    A(g->resid, (g->act_slots == 1 ? g->n_slots + g->nb : (int64_t)g->n_slots * (g->nb + 1)) * mc,
      act);
    A(g->grad_in, g->last ? 0 : (int64_t)g->n_slots * mc, act);
    A(g->grad_out, g->first ? 0 : (int64_t)g->n_slots * mc, act);
    A(g->emb_peer, g->P > 1 && g->wte ? (int64_t)ff_linear_local_sizes(g->wte).w_shard : 0, scr);
    /* which kinds of block use each set: a block's own sets, and the shared
     * one of the blocks under checkpointing. The shared set first: under
     * CAC a checkpointed block's own sets keep what its communication
     * produced and take the rest (what its recompute recomputes) from it. */
    const int shared = g->act_slots * g->n_own;
    for (int k = 0; k < g->n_sets; k++) {
        const int s = (k + shared) % g->n_sets; /* the shared set (if any) first */
        ff_gpt_acts *a = &g->acts[s], *sh = &g->acts[shared];
        int uses_dense = 0, uses_moe = 0;
        for (int l = 0; l < g->nb; l++) {
            int mine = s == shared ? g->ckpt[l] : g->set_of[l] >= 0 && s % g->n_own == g->set_of[l];
            uses_dense |= mine && !g->is_moe[l];
            uses_moe |= mine && g->is_moe[l];
            a->aliased |= mine && s != shared && g->ckpt[l]; /* a CAC block's */
        }
#define LOCAL(field, n)                                                                            \
    do {                                                                                           \
        if (a->aliased)                                                                            \
            a->field = sh->field;                                                                  \
        else                                                                                       \
            A(a->field, n, act);                                                                   \
    } while (0)
        /* bf16-mixed: kept in 2 bytes, made in fp32 in `home` */
#define LOCAL_H(field, n, home)                                                                    \
    do {                                                                                           \
        if (a->aliased)                                                                            \
            a->field##h = sh->field##h;                                                            \
        else                                                                                       \
            H(a->field##h, n, act);                                                                \
        a->field = home;                                                                           \
    } while (0)
        /* under CAC the shared set holds only what a recompute recomputes */
        const int64_t kept = s == shared && g->opt.cac ? 0 : 1;
        if (half)
            LOCAL_H(ln1, m * g->cy, g->act32y);
        else
            LOCAL(ln1, m * g->cy);
        A(a->ln1_mean, kept * m, act);
        A(a->ln1_rstd, kept * m, act);
        A(a->qkv, kept * m * g->c3x, act);
        LOCAL(att, (int64_t)g->Bl * g->nhx * T * T);
        if (half)
            LOCAL_H(atty, m * g->cx, g->act32x);
        else
            LOCAL(atty, m * g->cx);
        A(a->mid, kept * m * g->cy, act);
        /* an MoE block's router and experts read ln2 in fp32, the backward too */
        if (half && !uses_moe)
            LOCAL_H(ln2, m * g->cy, g->act32y);
        else
            LOCAL(ln2, m * g->cy);
        if (half && uses_moe && uses_dense) /* (a shared set: both) */
            LOCAL_H(ln2, m * g->cy, a->ln2);
        A(a->ln2_mean, kept * m, act);
        A(a->ln2_rstd, kept * m, act);
        A(a->fch, uses_dense ? kept * m * g->fx : 0, act);
        if (half && uses_dense)
            LOCAL_H(fch_gelu, m * g->fx, g->act32x);
        else
            LOCAL(fch_gelu, uses_dense ? m * g->fx : 0);
#undef LOCAL_H
#undef LOCAL
        if (uses_moe && !kept)
            A(a->moe.A, ff_gpt_moe_rows(g) * g->fx, act);
        else if (uses_moe && ff_gpt_moe_alloc(g, &a->moe, a->aliased ? sh->moe.A : NULL, act))
            ok = 0;
    }
    if (half)
        g->lnf = g->act32y;
    else
        A(g->lnf, hm * g->cy, act);
    H(g->lnfh, hm * g->cy, act);
    A(g->lnf_mean, hm, act);
    A(g->lnf_rstd, hm, act);
    A(g->logits, hm * g->vx, act);
    A(g->losses, hm, scr);
    A(g->dres, m * g->cy, scr);
    A(g->dln, m * g->cy, scr);
    A(g->tmp, m * g->cy, scr);
    A(g->dqkv, m * g->c3x, scr);
    A(g->datty, m * g->cx, scr);
    A(g->dfch, m * g->fx, scr);
    const int64_t threads = ff_ctx_threads(g->ctx);
    A(g->att_scratch, T * T * threads, scr);
    A(g->att_bf16, half ? FF_ATTN_BF16_SCRATCH(T, g->hs) * threads : 0, scr);
    A(g->ce_scratch, g->last ? 3 * m + (int64_t)g->gx * 3 * m + g->vx * threads : 0, scr);
    A(g->ln_scratch, FF_LN_SCRATCH(m, g->cy), scr);
    /* two floats hold each block's double */
    ok &= (g->norm_part = (double *)falloc(g, 2 * (g->n_params / FF_SUM_BLOCK + 1), scr)) != NULL;
    if (g->E) {
        const int64_t rows = m * g->top_k, w = g->E > g->top_k ? g->E : g->top_k;
        A(g->moe_part, m * w, scr);
        A(g->moe_gather, g->gy > 1 ? g->gy * m * w : 0, scr);
        A(g->moe_stats, 2 * g->E + 1, scr);
        /* with expert parallelism: the local experts' rows, at most E R,
         * and one expert's, at most ge R */
        const int64_t own = g->ge > 1 ? g->E * g->moe_R : rows;
        const int64_t one = g->ge > 1 && g->ge * g->moe_R > m ? g->ge * g->moe_R : m;
        A(g->moe_dO, own * g->cy, scr);
        A(g->moe_dA, one * g->fx, scr);
        A(g->moe_dX, m * g->cy, scr);
        A(g->moe_dgate, rows, scr);
        A(g->moe_send, g->ge > 1 ? g->E * g->moe_R * g->cy : 0, scr);
        A(g->moe_recv, g->ge > 1 ? g->E * g->moe_R * g->cy : 0, scr);
        A(g->moe_gath, g->moe_dtd ? g->gx * g->E * g->moe_ch * g->cy : 0, scr);
    }
#undef H
#undef A
    return ok ? FF_OK : ff_set_error(g->ctx, FF_ENOMEM, "out of memory for the model's buffers");
}

/* Block l's linear layers in the order of its forward: QKV, projection,
 * then the MLP's up and down, or each expert's. */
int ff_gpt_block_nlin(const ff_gpt *g, int l) { return g->is_moe[l] ? 2 + 2 * g->el : 4; }

ff_linear *ff_gpt_block_lin(const ff_gpt *g, int l, int i)
{
    if (i < 2)
        return i ? g->attproj[l] : g->qkv[l];
    if (!g->is_moe[l])
        return i == 2 ? g->fc[l] : g->fcproj[l];
    int e = (i - 2) / 2;
    return (i % 2 ? g->efcproj : g->efc)[(int64_t)l * g->el + e];
}

/* Where block l's layer i keeps its weight shard and bias in views v. */
void ff_gpt_lin_views(const ff_gpt *g, ff_gpt_views *v, int l, int i, float ***w, float ***b)
{
    const int64_t x = (int64_t)l * g->el + (i - 2) / 2;
    if (i < 2)
        *w = i ? &v->attprojw[l] : &v->qkvw[l], *b = i ? &v->attprojb[l] : &v->qkvb[l];
    else if (!g->is_moe[l])
        *w = i == 2 ? &v->fcw[l] : &v->fcprojw[l], *b = i == 2 ? &v->fcb[l] : &v->fcprojb[l];
    else
        *w = i % 2 ? &v->efcprojw[x] : &v->efcw[x], *b = i % 2 ? &v->efcprojb[x] : &v->efcb[x];
}

/* Entry `off` of a flat buffer (rest: off >= n_zsharded); with rest_only a
 * SAMO run's dense gradients, which hold [0, samo_zc0) and the rest; with
 * rest_only 2 ZeRO's sliced master (gpt_zero.c: NULL for a view of n
 * entries in a range sliced over D); with 3 a bf16-mixed SAMO run's dense
 * rest of the master sliced by ZeRO (its offsets those of the dense
 * gradients, then as 2). */
static float *view_at(const ff_gpt *g, float *base, int rest_only, int rest, size_t off, size_t n)
{
    if (base && rest_only == 2)
        return ff_gpt_zero_master_at(g, base, off, n);
    if (base && rest_only == 3)
        return rest || off < g->samo_zc0
                   ? ff_gpt_zero_master_at(g, base, rest ? off - g->n_zsharded + g->samo_zc0 : off,
                                           n)
                   : NULL;
    if (!base || !rest_only)
        return base ? base + off : NULL;
    if (rest)
        return base + (off - g->n_zsharded + g->samo_zc0);
    return off < g->samo_zc0 ? base + off : NULL;
}

/* The flat buffers' layout, as views into base (NULL: only counted):
 * Z-sharded weights first (wte, then each block's shards other than its
 * experts': one data-parallel bucket per block; then the local experts'
 * shards, one bucket per MoE block, all-reduced over the experts' own
 * replicas), then positions and the routers (decayed), the final LayerNorm
 * and each block's LayerNorms and layout-Y biases, then the layout-X
 * biases. Returns the size. With rest_only (a SAMO run's gradients) base
 * (or a bf16-mixed SAMO run's compressed master) base holds [0, samo_zc0)
 * and [n_zsharded, n_params) only and the other Z-sharded views are NULL. */
static size_t layout(ff_gpt *g, float *base, int rest_only, ff_gpt_views *v)
{
    const int L = g->nb, E = g->E;
    size_t off = 0;
    int rest = 0; /* past the Z-sharded weights */
    float **w, **b;
#define VIEW(field, n)                                                                             \
    ((field) = view_at(g, base, rest_only, rest, off, (size_t)(n)), off += (size_t)(n))
    if (g->wte) {
        g->woff[0] = off;
        VIEW(v->wte, ff_linear_local_sizes(g->wte).w_shard);
    }
    for (int pass = 0; pass < 2; pass++) /* the blocks' own layers, then the experts */
        for (int l = 0; l < L; l++) {
            size_t *boff = pass ? g->ebucket_off : g->bucket_off;
            size_t *blen = pass ? g->ebucket_len : g->bucket_len;
            boff[l] = off;
            for (int i = 0; i < ff_gpt_block_nlin(g, l); i++) {
                if ((i >= 2 && g->is_moe[l]) != pass)
                    continue;
                ff_gpt_lin_views(g, v, l, i, &w, &b);
                g->woff[g->layer0[l] + i] = off;
                VIEW(*w, ff_linear_local_sizes(ff_gpt_block_lin(g, l, i)).w_shard);
            }
            blen[l] = off - boff[l];
            g->n_dense_z = pass ? g->n_dense_z : off;
        }
    g->n_zsharded = off;
    rest = 1;
    if (g->first)
        VIEW(v->wpe, (size_t)g->cfg.maxT * g->cy);
    for (int l = 0; l < L; l++)
        if (g->is_moe[l])
            VIEW(v->routerw[l], (size_t)E * g->cy);
    g->n_decay = off; /* weight decay: the Z-sharded weights, positions and routers */
    if (g->last) {
        VIEW(v->lnfw, g->cy);
        VIEW(v->lnfb, g->cy);
    }
    for (int l = 0; l < L; l++) {
        VIEW(v->ln1w[l], g->cy);
        VIEW(v->ln1b[l], g->cy);
        VIEW(v->ln2w[l], g->cy);
        VIEW(v->ln2b[l], g->cy);
        for (int i = 1; i < ff_gpt_block_nlin(g, l); i += 2) { /* the T layers' biases */
            if (i >= 2 && g->is_moe[l])
                continue;
            ff_gpt_lin_views(g, v, l, i, &w, &b);
            VIEW(*b, g->cy);
        }
    }
    g->n_ytype = off; /* up to here: layout Y (or Z-sharded); then layout X */
    for (int l = 0; l < L; l++)
        for (int i = 0; i < ff_gpt_block_nlin(g, l); i += 2) { /* the N layers' biases */
            if (i >= 2 && g->is_moe[l])
                continue;
            ff_gpt_lin_views(g, v, l, i, &w, &b);
            VIEW(*b, i ? g->fx : g->c3x);
        }
    /* the local experts' biases, replicated over Z and the experts' own
     * replicas (EDP): layout Y (down layers), then layout X (up layers) */
    for (int x = 0; x < 2; x++) {
        if (x)
            g->n_ebx = off;
        else
            g->n_eby = off;
        for (int l = 0; l < L; l++)
            for (int i = 2 + !x; g->is_moe[l] && i < ff_gpt_block_nlin(g, l); i += 2) {
                ff_gpt_lin_views(g, v, l, i, &w, &b);
                VIEW(*b, x ? g->fx : g->cy);
            }
    }
#undef VIEW
    return off;
}

void ff_gpt_bind_views(ff_gpt *g)
{
    const int samo_master = g->samo_p && !g->samo_dense;
    layout(g, g->params,
           ff_gpt_zero_master_sliced(g) ? 2
           : samo_master                ? (ff_gpt_zero_samo_master(g) ? 3 : 1)
                                        : 0,
           &g->pv);
    layout(g, g->grads, g->samo, &g->gv);
    int n = 0;
    for (int l = 0; l < g->nb; l++)
        for (int e = 0; g->is_moe[l] && e < g->E; e++)
            g->router_rows[n++] = g->pv.routerw[l] + (int64_t)e * g->cy;
    /* (a weight whose master is compressed has no dense shard: the layer
     * has its bf16 copy, which is all it reads) */
    if (g->wte) {
        ff_linear_bind(g->wte, g->pv.wte, NULL, g->gv.wte, NULL);
        ff_linear_bind_bf16(g->wte, ff_gpt_used_weight(g, g->woff[0]));
    }
    float **w, **b, **dw, **db;
    for (int l = 0; l < g->nb; l++)
        for (int i = 0; i < ff_gpt_block_nlin(g, l); i++) {
            ff_gpt_lin_views(g, &g->pv, l, i, &w, &b);
            ff_gpt_lin_views(g, &g->gv, l, i, &dw, &db);
            ff_linear_bind(ff_gpt_block_lin(g, l, i), *w, *b, *dw, *db);
            ff_linear_bind_bf16(ff_gpt_block_lin(g, l, i),
                                ff_gpt_used_weight(g, g->woff[g->layer0[l] + i]));
        }
    if (!g->samo)
        return;
    /* SAMO: each layer's share of the compressed gradient (wte's, kept
     * whole, stays dense) */
    for (int l = -1; l < g->nb; l++)
        for (int i = 0; i < (l < 0 ? g->wte && !g->samo_zc0 : ff_gpt_block_nlin(g, l)); i++) {
            ff_linear *lin = l < 0 ? g->wte : ff_gpt_block_lin(g, l, i);
            const size_t a = g->woff[l < 0 ? 0 : g->layer0[l] + i];
            const size_t k0 = ff_gpt_samo_lower(g, a);
            const size_t k1 = ff_gpt_samo_lower(g, a + ff_linear_local_sizes(lin).w_shard);
            ff_linear_bind_sparse(lin, g->samo_idx + k0, k1 - k0, (uint32_t)a, g->samo_g + k0);
        }
}

static int create_layers(ff_gpt *g)
{
    const int L = g->nb;
    const int64_t C = g->cfg.C;
    int rc = ff_linear_seq_create(g->grid, &g->opt.linear, &g->seq);
    if (rc)
        return rc;
    int64_t *perm = ff_qkv_permutation(C, g->gx);
    if (!perm)
        return ff_set_error(g->ctx, FF_ENOMEM, "out of memory for the QKV permutation");
    char name[48];
    if (g->first || g->last)
        rc = add_layer(g, "wte", FF_LINEAR_N, C, g->cfg.Vp, 0, NULL, 1, &g->wte);
    for (int l = 0; l < L && rc == FF_OK; l++) {
        const int gl = g->l0 + l; /* the block's index in the model */
        const uint32_t stream = 2 + 4 * (uint32_t)gl;
        snprintf(name, sizeof name, "h%d.qkv", gl);
        rc = add_layer(g, name, FF_LINEAR_N, C, 3 * C, 1, perm, stream, &g->qkv[l]);
        snprintf(name, sizeof name, "h%d.attproj", gl);
        if (rc == FF_OK)
            rc = add_layer(g, name, FF_LINEAR_T, C, C, 1, NULL, stream + 1, &g->attproj[l]);
        if (g->is_moe[l]) {
            for (int le = 0; le < g->el && rc == FF_OK; le++) {
                /* local expert le: the model's expert e */
                const int64_t x = (int64_t)l * g->el + le, e = (int64_t)g->eslot * g->el + le;
                uint32_t es = STREAM_EXPERTS + 2 * (uint32_t)((int64_t)gl * g->E + e);
                snprintf(name, sizeof name, "h%d.e%d.fc", gl, (int)e);
                rc = add_layer(g, name, FF_LINEAR_N, C, 4 * C, 1, NULL, es, &g->efc[x]);
                snprintf(name, sizeof name, "h%d.e%d.fcproj", gl, (int)e);
                if (rc == FF_OK)
                    rc = add_layer(g, name, FF_LINEAR_T, 4 * C, C, 1, NULL, es + 1, &g->efcproj[x]);
            }
            continue;
        }
        snprintf(name, sizeof name, "h%d.fc", gl);
        if (rc == FF_OK)
            rc = add_layer(g, name, FF_LINEAR_N, C, 4 * C, 1, NULL, stream + 2, &g->fc[l]);
        snprintf(name, sizeof name, "h%d.fcproj", gl);
        if (rc == FF_OK)
            rc = add_layer(g, name, FF_LINEAR_T, 4 * C, C, 1, NULL, stream + 3, &g->fcproj[l]);
    }
    /* the program's numbering: wte 0 where the stage has it, then each
     * block's layers in the order added */
    for (int l = 0, n = g->wte != NULL; l < L; l++)
        g->layer0[l] = n, n += ff_gpt_block_nlin(g, l);
    free(perm);
    return rc;
}

/* The programs of weight uses (layer index: wte 0 where the stage has it,
 * then block l's layers from layer0[l] in the order of block_lin).
 * PROG_WHOLE, a micro-batch on the last stage (everything without stages):
 * the lookup, the blocks, the LM head's forward and backward, the blocks
 * backward (under checkpointing each recomputes its forward first, a dense
 * block only up to the MLP's up layer), the lookup's gradient. PROG_FORWARD and PROG_BACKWARD: the
 * two halves of it on the other stages, run apart because other micro-batches' passes come between.
 * PROG_EVAL: the forward only. */
enum { PROG_WHOLE = 0, PROG_FORWARD, PROG_BACKWARD, PROG_EVAL };

static int build_programs(ff_gpt *g)
{
    const int L = g->nb;
    int uses = 4;
    for (int l = 0; l < L; l++)
        uses += 3 * ff_gpt_block_nlin(g, l);
    for (int p = 0; p < 4; p++)
        if (!(g->progs[p] = malloc((size_t)uses * sizeof(ff_linear_use))))
            return ff_set_error(g->ctx, FF_ENOMEM, "out of memory for the model's program");
    int n[4] = {0, 0, 0, 0};
#define USE(p, layer, kind)                                                                        \
    g->progs[p][n[p]++] = (ff_linear_use) { layer, kind }
    for (int p = PROG_WHOLE; p <= PROG_EVAL; p++) {
        int fwd = p != PROG_BACKWARD, bwd = p == PROG_WHOLE || p == PROG_BACKWARD;
        if (fwd && g->first)
            USE(p, 0, FF_USE_FORWARD);
        for (int l = 0; fwd && l < L; l++)
            for (int i = 0; i < ff_gpt_block_nlin(g, l); i++)
                USE(p, g->layer0[l] + i, FF_USE_FORWARD);
        if (fwd && g->last && p != PROG_FORWARD)
            USE(p, 0, FF_USE_FORWARD);
        if (bwd && g->last)
            USE(p, 0, FF_USE_BACKWARD);
        for (int l = L - 1; bwd && l >= 0; l--) {
            /* a dense block recomputes up to the MLP's up layer (its down
             * layer's output is the next block's input, which is kept); an
             * MoE block every layer (its backward needs the experts' outputs);
             * under CAC none: their outputs were kept */
            int nl = ff_gpt_block_nlin(g, l), nr = g->is_moe[l] ? nl : 3;
            for (int i = 0; g->ckpt[l] && !g->opt.cac && i < nr; i++)
                USE(p, g->layer0[l] + i, FF_USE_RECOMPUTE);
            for (int i = nl - 1; i >= 0; i--)
                USE(p, g->layer0[l] + i, FF_USE_BACKWARD);
        }
        if (bwd && g->first)
            USE(p, 0, FF_USE_GRAD);
    }
#undef USE
    for (int p = 0; p < 4; p++)
        g->n_prog[p] = n[p];
    g->prog_mode = -1;
    return FF_OK;
}

static int use_program(ff_gpt *g, int mode)
{
    if (g->prog_mode == mode)
        return FF_OK;
    int rc = ff_linear_seq_set_program(g->seq, g->progs[mode], g->n_prog[mode]);
    if (rc == FF_OK)
        g->prog_mode = mode;
    return rc;
}

/* Each block's checkpointing (the plan's, else the option) and the
 * activation sets: per activation slot one for each block without it, and
 * one shared by those with it. */
static int plan_blocks(ff_gpt *g)
{
    const ff_gpt_config *c = &g->cfg;
    const ff_layer_plan *p = g->opt.plan;
    char why[512];
    if (p && (ff_layer_plan_check(p, why, sizeof why) ||
              ff_layer_plan_match(p, c->L, c->NH, c->C, c->V, g->shape, why, sizeof why)))
        return ff_set_error(g->ctx, FF_EINVAL, "%s", why);
    g->ckpt = calloc((size_t)g->nb, sizeof(int));
    g->set_of = calloc((size_t)g->nb, sizeof(int));
    if (!g->ckpt || !g->set_of)
        return ff_set_error(g->ctx, FF_ENOMEM, "out of memory for the model");
    int shared = 0;
    g->n_own = 0;
    for (int l = 0; l < g->nb; l++) {
        g->ckpt[l] = p ? p->blocks[g->l0 + l].checkpoint : g->opt.checkpoint != 0;
        shared |= g->ckpt[l];
        /* under CAC a checkpointed block keeps what its communication
         * produced in sets of its own, and recomputes into the shared one */
        g->set_of[l] = g->ckpt[l] && !g->opt.cac ? -1 : g->n_own++;
    }
    g->n_sets = g->act_slots * g->n_own + shared;
    return FF_OK;
}

ff_gpt_acts *ff_gpt_acts_of(ff_gpt *g, int l)
{
    int slot = g->act_slots > 1 ? g->slot : 0;
    return &g->acts[g->set_of[l] < 0 ? g->act_slots * g->n_own : slot * g->n_own + g->set_of[l]];
}

/* The plan's options of each linear layer. */
static int plan_layers(ff_gpt *g)
{
    const ff_layer_plan *p = g->opt.plan;
    int rc = p && g->wte ? ff_linear_set_options(g->wte, &p->head) : FF_OK;
    if (p && p->panel_rows > 0) /* the panels it was planned with: they set the chunks */
        ff_gemm_set_panel_rows(ff_linear_seq_gemm(g->seq), p->panel_rows);
    /* an expert's layers take the options of the MLP's */
    for (int l = 0; p && l < g->nb && rc == FF_OK; l++)
        for (int i = 0; i < ff_gpt_block_nlin(g, l) && rc == FF_OK; i++)
            rc = ff_linear_set_options(ff_gpt_block_lin(g, l, i),
                                       &p->blocks[g->l0 + l].layer[i < 2 ? i : 2 + i % 2]);
    g->opt.plan = NULL; /* the caller's; not kept */
    return rc;
}

/* This stage's blocks, the activation slots and the pipeline options; the
 * same checks on every rank. */
static int plan_stages(ff_gpt *g)
{
    const ff_pipe_opts *o = &g->opt.pipe;
    const int L = g->cfg.L, P = g->P;
    if (P > L)
        return ff_set_error(g->ctx, FF_EINVAL,
                            "%d pipeline stages for %d blocks: each stage needs at least one", P,
                            L);
    if (o->schedule != FF_PIPE_MESSAGE && o->schedule != FF_PIPE_1F1B)
        return ff_set_error(g->ctx, FF_EINVAL, "unknown pipeline schedule %d", (int)o->schedule);
    if (o->limit < 0)
        return ff_set_error(g->ctx, FF_EINVAL,
                            "pipeline limit %d: it must be at least 1 (0: the %d stages)", o->limit,
                            P);
    if (o->slow_stage >= P || o->slow_s < 0 || o->pass_s < 0)
        return ff_set_error(g->ctx, FF_EINVAL,
                            "slow stage %d of %d (%.3g s, every pass %.3g s): no such stage or a "
                            "negative time",
                            o->slow_stage, P, o->slow_s, o->pass_s);
    if (o->stage_layers) {
        int sum = 0;
        for (int k = 0; k < P; k++) {
            if (o->stage_layers[k] < 1)
                return ff_set_error(g->ctx, FF_EINVAL,
                                    "stage %d is given %d blocks: every stage needs at least one",
                                    k, o->stage_layers[k]);
            sum += o->stage_layers[k];
        }
        if (sum != L)
            return ff_set_error(g->ctx, FF_EINVAL,
                                "the stages' blocks add up to %d, but the model has L=%d", sum, L);
    }
    if (!(g->stage_l0 = malloc((size_t)(P + 1) * sizeof(int))))
        return ff_set_error(g->ctx, FF_ENOMEM, "out of memory for the model");
    g->stage_l0[0] = 0;
    for (int s = 0; s < P; s++)
        g->stage_l0[s + 1] =
            g->stage_l0[s] + (o->stage_layers ? o->stage_layers[s] : L / P + (s < L % P));
    g->l0 = g->stage_l0[g->stage];
    g->nb = g->stage_l0[g->stage + 1] - g->l0;
    g->first = g->stage == 0;
    g->last = g->stage == P - 1;
    g->n_slots = P == 1 ? 1 : (o->limit ? o->limit : P);
    g->act_slots = g->last ? 1 : g->n_slots;
    g->slot = 0;
    return FF_OK;
}

/* Expert parallelism: checks Ge against the grid and the model, and builds
 * the EP and EDP groups out of D (every rank of D calls this). */
static int expert_groups(ff_gpt *g)
{
    const int ge = g->opt.expert_parallel > 1 ? g->opt.expert_parallel : 1;
    if (g->opt.expert_parallel < 0 || (ge > 1 && !g->E))
        return ff_set_error(g->ctx, FF_EINVAL,
                            "expert parallelism %d: expected 1 or more, and a model with experts",
                            g->opt.expert_parallel);
    if (g->gd % ge)
        return ff_set_error(g->ctx, FF_EDIVIDE,
                            "expert parallelism %d does not divide the data-parallel size Gd=%d",
                            ge, g->gd);
    if (g->E % ge)
        return ff_set_error(g->ctx, FF_EDIVIDE,
                            "expert parallelism %d does not divide the %d experts", ge, g->E);
    g->ge = ge;
    g->el = g->E / ge;
    g->eslot = g->me.d % ge;
    g->moe_dtd = g->opt.dtd && ge > 1 && g->gx > 1;
    g->moe_ch = (g->moe_R + g->gx - 1) / g->gx;
    g->grp_edp = g->grp_d; /* without expert parallelism: all of D, no group of its own */
    if (ge == 1)
        return FF_OK;
    g->grp_edp = NULL;
    MPI_Comm dcomm = ff_group_comm(g->grp_d), ep, edp;
    if (MPI_Comm_split(dcomm, g->me.d / ge, g->me.d, &ep) != MPI_SUCCESS)
        return ff_set_error(g->ctx, FF_EMPI, "MPI_Comm_split (the expert group) failed");
    if (MPI_Comm_split(dcomm, g->eslot, g->me.d, &edp) != MPI_SUCCESS) {
        MPI_Comm_free(&ep);
        return ff_set_error(g->ctx, FF_EMPI, "MPI_Comm_split (the experts' replicas) failed");
    }
    /* both, whatever the first gave (their collectives are over different
     * ranks), then agreed */
    int rc = ff_group_create(g->ctx, ep, "EP", &g->grp_ep);
    int rc2 = ff_group_create(g->ctx, edp, "EDP", &g->grp_edp);
    MPI_Comm_free(&ep);
    MPI_Comm_free(&edp);
    return ff_ctx_agree(g->ctx, rc ? rc : rc2);
}

int ff_gpt_sync(ff_gpt *g) { return ff_gpt_zero_params_settle(g); }

/* The linear layers' weight hook under ZeRO over D: a weight shard about
 * to be read waits for its range's gather after AdamW (gpt_zero.c). */
static int zero_weight_ready(void *arg, const float *w_shard, const uint16_t *w_bf16, size_t n)
{
    ff_gpt *g = arg;
    /* bf16-mixed: the copy's offset (the master may be sliced, w_shard NULL) */
    if (g->wbf16 && w_bf16 >= g->wbf16 && w_bf16 < g->wbf16 + g->n_zsharded)
        return ff_gpt_zero_params_wait(g, (size_t)(w_bf16 - g->wbf16), n);
    if (!w_shard || w_shard < g->params || w_shard >= g->params + g->n_params)
        return FF_OK;
    return ff_gpt_zero_params_wait(g, (size_t)(w_shard - g->params), n);
}

static int gpt_create_local(ff_gpt *g)
{
    const ff_gpt_config *c = &g->cfg;
    /* every rank passes exactly one of the two agreements below before any
     * collective: the checks give the same answer everywhere, but an
     * allocation (plan_stages', or the arrays here) may fail on one rank */
    int rc = check_shape(g->ctx, c, g->shape, g->B, g->T);
    if (rc == FF_OK)
        rc = ff_gpt_precision_check(g);
    if (rc == FF_OK)
        rc = plan_stages(g);
    if (rc)
        return ff_ctx_agree(g->ctx, rc);
    g->Bl = g->B / (g->gz * g->gd);
    g->m = (int64_t)g->Bl * g->T;
    g->cy = c->C / g->gy;
    g->cx = c->C / g->gx;
    g->c3x = 3 * g->cx;
    g->fx = 4 * g->cx;
    g->vx = c->Vp / g->gx;
    g->nhx = c->NH / g->gx;
    g->hs = c->C / c->NH;
    const size_t L = (size_t)g->nb;
    g->E = c->experts;
    g->top_k = c->experts ? c->top_k : 0;
    g->is_moe = calloc(L ? L : 1, sizeof(int));
    g->layer0 = calloc(L ? L : 1, sizeof(int));
    g->router_rows = calloc(L * (size_t)g->E + 1, sizeof(float *));
    rc = !g->is_moe || !g->layer0 || !g->router_rows
             ? ff_set_error(g->ctx, FF_ENOMEM, "out of memory for the model")
             : FF_OK;
    if ((rc = ff_ctx_agree(g->ctx, rc)))
        return rc;
    for (int l = 0; l < g->nb; l++)
        g->is_moe[l] = ff_gpt_block_is_moe(c, g->l0 + l);
    if (g->E) {
        ff_moe_shape ms = {.E = g->E, .top_k = g->top_k, .factor = c->capacity_factor, .T = g->T};
        g->moe_cap = ff_moe_capacity(&ms);
        /* a rank sends an expert at most its capacity of each sequence, and
         * no more than the sequence (a token picks distinct experts) */
        g->moe_R = g->Bl * (g->moe_cap < g->T ? g->moe_cap : g->T);
    }
    if ((rc = expert_groups(g)))
        return rc;
    if ((rc = plan_blocks(g)))
        return rc;
    const size_t LE = L * (size_t)g->el;
    ff_linear ***lists[6] = {&g->qkv, &g->attproj, &g->fc, &g->fcproj, &g->efc, &g->efcproj};
    for (int i = 0; i < 6; i++)
        if (!(*lists[i] = calloc(i < 4 ? L : LE + 1, sizeof(ff_linear *))))
            return ff_set_error(g->ctx, FF_ENOMEM, "out of memory for the model");
    ff_gpt_views *vs[2] = {&g->pv, &g->gv};
    for (int b = 0; b < 2; b++) {
        float ***arrs[VIEW_ARRAYS] = {
            &vs[b]->qkvw,     &vs[b]->attprojw, &vs[b]->fcw,     &vs[b]->fcprojw,  &vs[b]->ln1w,
            &vs[b]->ln1b,     &vs[b]->ln2w,     &vs[b]->ln2b,    &vs[b]->attprojb, &vs[b]->fcprojb,
            &vs[b]->qkvb,     &vs[b]->fcb,      &vs[b]->routerw, &vs[b]->efcw,     &vs[b]->efcprojw,
            &vs[b]->efcprojb, &vs[b]->efcb};
        for (int i = 0; i < VIEW_ARRAYS; i++)
            if (!(*arrs[i] = calloc(i < 13 ? L : LE + 1, sizeof(float *))))
                return ff_set_error(g->ctx, FF_ENOMEM, "out of memory for the model");
    }
    g->acts = calloc((size_t)g->n_sets, sizeof *g->acts);
    g->bucket_off = calloc(L + 1, sizeof(size_t));
    g->bucket_len = calloc(L + 1, sizeof(size_t));
    g->bucket_req = calloc(L + 1, sizeof(ff_request *));
    g->ebucket_off = calloc(L + 1, sizeof(size_t));
    g->ebucket_len = calloc(L + 1, sizeof(size_t));
    g->ebucket_req = calloc(L + 1, sizeof(ff_request *));
    ff_request ***reqs[4] = {&g->req_act_in, &g->req_act_out, &g->req_grad_in, &g->req_grad_out};
    for (int i = 0; i < 4; i++)
        if (!(*reqs[i] = calloc((size_t)g->n_slots, sizeof(ff_request *))))
            return ff_set_error(g->ctx, FF_ENOMEM, "out of memory for the model");
    if (!g->acts || !g->bucket_off || !g->bucket_len || !g->bucket_req || !g->ebucket_off ||
        !g->ebucket_len || !g->ebucket_req)
        return ff_set_error(g->ctx, FF_ENOMEM, "out of memory for the model");
    if ((rc = create_layers(g)) || (rc = plan_layers(g)) || (rc = build_programs(g)))
        return rc;
    size_t n_lin = g->wte != NULL;
    for (int l = 0; l < g->nb; l++)
        n_lin += (size_t)ff_gpt_block_nlin(g, l);
    if (!(g->woff = calloc(n_lin ? n_lin : 1, sizeof(size_t))))
        return ff_set_error(g->ctx, FF_ENOMEM, "out of memory for the model");
    ff_gpt_views counted = g->pv; /* the same arrays; pointers are reset by ff_gpt_bind_views */
    g->n_params = layout(g, NULL, 0, &counted);
    rc = alloc_buffers(g);
    if (rc == FF_OK)
        rc = ff_gpt_bf16_alloc(g);
    if ((rc = ff_gpt_bf16_choose(g, rc)))
        return rc;
    ff_gpt_bind_views(g);
    if ((rc = ff_gpt_zero_setup(g)) == FF_OK && g->zr)
        ff_linear_seq_set_weight_hook(g->seq, zero_weight_ready, g);
    return rc;
}

int ff_gpt_create(ff_grid *grid, const ff_gpt_config *cfg, const ff_gpt_opts *opts, int B, int T,
                  ff_gpt **out)
{
    *out = NULL;
    ff_ctx *ctx = ff_grid_ctx(grid);
    ff_gpt *g = calloc(1, sizeof *g);
    int rc = FF_OK;
    if (!g) { /* (the agreement gpt_create_local's peers reach first) */
        rc = ff_set_error(ctx, FF_ENOMEM, "out of memory for the model");
        ff_ctx_agree(ctx, rc);
    }
    if (rc == FF_OK) {
        g->grid = grid;
        g->ctx = ctx;
        g->ln_ready = -1;
        g->cfg = *cfg;
        if (g->cfg.Vp == 0)
            g->cfg.Vp = (cfg->V + 127) / 128 * 128;
        if (opts)
            g->opt = *opts;
        else
            ff_gpt_opts_default(&g->opt);
        g->B = B;
        g->T = T;
        g->shape = ff_grid_shape(grid);
        g->me = ff_grid_coords(grid);
        g->gx = g->shape.x, g->gy = g->shape.y, g->gz = g->shape.z, g->gd = g->shape.d;
        g->grp_x = ff_grid_group(grid, FF_GROUP_X);
        g->grp_y = ff_grid_group(grid, FF_GROUP_Y);
        g->grp_d = ff_grid_group(grid, FF_GROUP_D);
        g->grp_zd = ff_grid_group(grid, FF_GROUP_ZD);
        g->grp_world = ff_grid_group(grid, FF_GROUP_WORLD);
        g->grp_pipe = ff_grid_group(grid, FF_GROUP_PIPE);
        g->P = ff_grid_stages(grid);
        g->stage = ff_grid_stage(grid);
        rc = gpt_create_local(g);
    }
    /* the checks give the same answer everywhere; allocation may not.
     * Every rank has passed exactly one agreement in gpt_create_local (or
     * above) before this one. */
    rc = ff_ctx_agree(ctx, rc);
    if (rc) {
        ff_gpt_destroy(g);
        return rc;
    }
    *out = g;
    return FF_OK;
}

void ff_gpt_destroy(ff_gpt *g)
{
    if (!g)
        return;
    ff_gpt_zero_params_settle(g); /* (before the buffers go) */
    for (int l = 0; g->bucket_req && l <= g->nb; l++)
        ff_wait(&g->bucket_req[l]);
    for (int l = 0; g->ebucket_req && l < g->nb; l++)
        ff_wait(&g->ebucket_req[l]);
    /* Messages still in flight (a step stopped by an error): left to
     * ff_ctx_destroy, which cancels them; their buffers are not freed. */
    ff_request **reqs[4] = {g->req_act_in, g->req_act_out, g->req_grad_in, g->req_grad_out};
    int pending = 0;
    for (int i = 0; i < 4; i++) {
        for (int k = 0, done; reqs[i] && k < g->n_slots; k++)
            if (reqs[i][k] && ff_test(reqs[i][k], &done) == FF_OK && done)
                ff_wait(&reqs[i][k]);
            else
                pending |= reqs[i][k] != NULL;
        free(reqs[i]);
    }
    if (pending)
        g->resid = g->grad_in = g->grad_out = NULL;
    ff_linear_seq_destroy(g->seq);
    ff_bf16_gemm_destroy(g->bf16mm); /* (the sequence's tuner used it) */
    if (g->samo_prest == g->params)  /* (else a dense master of the moment is params) */
        g->samo_prest = NULL;
    ff_fbuf_free(g->params), ff_fbuf_free(g->grads), ff_fbuf_free(g->wbf16);
    ff_fbuf_free(g->adam_m), ff_fbuf_free(g->adam_v);
    ff_fbuf_free(g->resid), ff_fbuf_free(g->grad_in), ff_fbuf_free(g->grad_out);
    ff_fbuf_free(g->emb_peer);
    for (int s = 0; g->acts && s < g->n_sets; s++) {
        ff_gpt_acts *a = &g->acts[s];
        if (a->aliased) /* the shared set's */
            a->ln1 = a->att = a->atty = a->ln2 = a->fch_gelu = NULL;
        if (a->aliased)
            a->ln1h = a->attyh = a->ln2h = a->fch_geluh = NULL;
        /* (bf16-mixed: fp32 homes of the model's) */
        float **homes[] = {&a->ln1, &a->atty, &a->ln2, &a->fch_gelu};
        for (size_t i = 0; i < sizeof homes / sizeof *homes; i++)
            if (*homes[i] && (*homes[i] == g->act32y || *homes[i] == g->act32x))
                *homes[i] = NULL;
        ff_fbuf_free(a->ln1h), ff_fbuf_free(a->attyh), ff_fbuf_free(a->ln2h);
        ff_fbuf_free(a->fch_geluh);
        float *p[] = {a->ln1, a->ln1_mean, a->ln1_rstd, a->qkv,      a->att, a->atty,
                      a->mid, a->ln2,      a->ln2_mean, a->ln2_rstd, a->fch, a->fch_gelu};
        for (size_t i = 0; i < sizeof p / sizeof *p; i++)
            ff_fbuf_free(p[i]);
        ff_gpt_moe_free(&a->moe);
    }
    free(g->acts);
    free(g->ckpt);
    free(g->set_of);
    if (g->lnf == g->act32y)
        g->lnf = NULL;
    ff_fbuf_free(g->lnfh), ff_fbuf_free(g->act32y), ff_fbuf_free(g->act32x);
    float *bufs[] = {g->lnf,      g->lnf_mean,    g->lnf_rstd,  g->logits,     g->losses,
                     g->dres,     g->dln,         g->tmp,       g->dqkv,       g->datty,
                     g->dfch,     g->att_scratch, g->att_bf16,  g->ce_scratch, g->ln_scratch,
                     g->moe_part, g->moe_gather,  g->moe_stats, g->moe_dO,     g->moe_dA,
                     g->moe_dX,   g->moe_dgate,   g->moe_send,  g->moe_recv,   g->moe_gath};
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++)
        ff_fbuf_free(bufs[i]);
    ff_fbuf_free(g->norm_part);
    ff_fbuf_free(g->mask);
    free(g->pack_idx), free(g->pack_off), ff_fbuf_free(g->pack_buf);
    free(g->samo_idx), free(g->woff);
    ff_fbuf_free(g->samo_g), ff_fbuf_free(g->samo_m), ff_fbuf_free(g->samo_v);
    ff_fbuf_free(g->samo_p), ff_fbuf_free(g->samo_prest);
    ff_gpt_views *vs[2] = {&g->pv, &g->gv};
    for (int b = 0; b < 2; b++) {
        float **arrs[VIEW_ARRAYS] = {
            vs[b]->qkvw,     vs[b]->attprojw, vs[b]->fcw,     vs[b]->fcprojw,  vs[b]->ln1w,
            vs[b]->ln1b,     vs[b]->ln2w,     vs[b]->ln2b,    vs[b]->attprojb, vs[b]->fcprojb,
            vs[b]->qkvb,     vs[b]->fcb,      vs[b]->routerw, vs[b]->efcw,     vs[b]->efcprojw,
            vs[b]->efcprojb, vs[b]->efcb};
        for (int i = 0; i < VIEW_ARRAYS; i++)
            free(arrs[i]);
    }
    free(g->qkv), free(g->attproj), free(g->fc), free(g->fcproj), free(g->efc), free(g->efcproj);
    free(g->is_moe), free(g->layer0), free(g->router_rows);
    ff_gpt_zero_destroy(g);
    free(g->bucket_off), free(g->bucket_len), free(g->bucket_req);
    free(g->ebucket_off), free(g->ebucket_len), free(g->ebucket_req);
    if (g->ge > 1) /* (created with expert parallelism only) */
        ff_group_destroy(g->grp_ep), ff_group_destroy(g->grp_edp);
    for (int p = 0; p < 4; p++)
        free(g->progs[p]);
    free(g->stage_l0);
    free(g);
}

/* ---- initialization -------------------------------------------------------------- */

int ff_gpt_init(ff_gpt *g, uint64_t seed)
{
    int rc0 = ff_gpt_zero_params_settle(g); /* (ZeRO's gathers after AdamW) */
    if (rc0)
        return rc0;
    const ff_gpt_config *c = &g->cfg;
    const float std = 0.02f, resid_std = 0.02f / sqrtf(2.0f * (float)c->L);
    int rc = ff_gpt_samo_master_dense(g); /* (bf16-mixed SAMO: written dense, then compressed) */
    if (rc == FF_OK)                      /* (bf16-mixed ZeRO: written whole, then sliced) */
        rc = ff_gpt_zero_master_whole(g);
    if (rc)
        return rc;
    if (g->wte)
        rc = ff_linear_init(g->wte, seed, std);
    /* padded vocabulary rows stay zero (NK: canonical index = v * C + c) */
    size_t wte_shard = g->wte ? ff_linear_local_sizes(g->wte).w_shard : 0;
    for (size_t e = 0; e < wte_shard; e++)
        if (ff_linear_canonical_index(g->wte, e) / c->C >= c->V)
            g->pv.wte[e] = 0.0f;
    for (int l = 0; l < g->nb && rc == FF_OK; l++) {
        /* the up layers (QKV, MLP or expert up) N(0, std), the residual
         * projections (odd i) N(0, resid_std) */
        for (int i = 0; i < ff_gpt_block_nlin(g, l) && rc == FF_OK; i++)
            rc = ff_linear_init(ff_gpt_block_lin(g, l, i), seed, i % 2 ? resid_std : std);
        if (rc)
            break;
        /* the router N(0, std): canonical (E, C), this rank's columns */
        for (int64_t e = 0; g->is_moe[l] && e < g->E; e++)
            for (int64_t j = 0; j < g->cy; j++) {
                uint64_t canon = (uint64_t)(e * c->C + g->me.y * g->cy + j);
                g->pv.routerw[l][e * g->cy + j] =
                    std * ff_rng_normal(seed, STREAM_ROUTER + (uint32_t)(g->l0 + l), canon);
            }
        for (int64_t j = 0; j < g->cy; j++)
            g->pv.ln1w[l][j] = g->pv.ln2w[l][j] = 1.0f, g->pv.ln1b[l][j] = g->pv.ln2b[l][j] = 0.0f;
    }
    for (int64_t t = 0; g->first && t < c->maxT; t++)
        for (int64_t j = 0; j < g->cy; j++) {
            uint64_t canon = (uint64_t)(t * c->C + g->me.y * g->cy + j);
            g->pv.wpe[t * g->cy + j] = 0.01f * ff_rng_normal(seed, STREAM_WPE, canon);
        }
    for (int64_t j = 0; g->last && j < g->cy; j++)
        g->pv.lnfw[j] = 1.0f, g->pv.lnfb[j] = 0.0f;
    float *moments[4] = {g->adam_m, g->adam_v, g->samo_m, g->samo_v};
    for (int k = 0; k < 4; k++)
        if (moments[k])
            memset(moments[k], 0,
                   (k < 2 ? ff_gpt_moment_state(g) : ff_gpt_samo_state(g)) * sizeof(float));
    if (g->samo_dense) {
        ff_gpt_samo_master_compress(g, 1);
    } else {
        if (g->samo)
            ff_gpt_samo_zero_pruned(g);
        ff_gpt_bf16_weights(g);
        ff_gpt_zero_master_slice(g, 0); /* (the copy is made: from the whole master) */
    }
    return rc;
}

/* ---- forward and backward ----------------------------------------------------------- */

float *ff_gpt_resid(ff_gpt *g, int slot, int l)
{
    const int64_t mc = g->m * g->cy;
    if (g->act_slots == 1) /* [the n_slots inputs][blocks 1..nb: one set] */
        return g->resid + (l == 0 ? (int64_t)slot * mc : ((int64_t)g->n_slots + l - 1) * mc);
    return g->resid + ((int64_t)slot * (g->nb + 1) + l) * mc;
}

static float *resid_at(ff_gpt *g, int l) { return ff_gpt_resid(g, g->slot, l); }

/* Row-wise work on a linear layer's output, run on each chunk of rows as
 * soon as the layer has finished it (ff_linear_forward_rows): a residual
 * sum = a + b, or an activation out = GELU(a); `width` columns. */
typedef struct {
    ff_gpt *g;
    float *out;
    const float *a, *b;
    int64_t width;
} rows_work;

static void rows_add(void *arg, int64_t row0, int64_t n)
{
    rows_work *w = arg;
    int64_t off = row0 * w->width;
    ff_add(w->g->ctx, w->out + off, w->a + off, w->b + off, n * w->width);
}

/* A residual sum and the LayerNorm that reads it, chunk by chunk: where a
 * row is whole on the rank (Gy = 1) its statistics need no collective, so
 * the LayerNorm runs on each chunk while the next chunks' all-reduces are
 * in flight (ln NULL: it runs after the product; with Gy > 1 a chunk's
 * statistics would need two all-reduces over Y of their own). Row by row
 * the same arithmetic as on the whole. */
typedef struct {
    rows_work add;
    float *ln, *mean, *rstd;
    const float *w, *b;
    int rc;
} rows_norm;

static void rows_add_norm(void *arg, int64_t row0, int64_t n)
{
    rows_norm *r = arg;
    ff_gpt *g = r->add.g;
    rows_add(&r->add, row0, n);
    if (r->ln && r->rc == FF_OK) {
        int64_t off = row0 * g->cy;
        r->rc = ff_ln_forward(g->grp_y, r->ln + off, r->mean + row0, r->rstd + row0,
                              r->add.out + off, r->w, r->b, n, g->cy, g->cfg.C);
    }
}

/* The LayerNorm after block l's residual, run per chunk where it can be:
 * a block's LN2 after its attention, the next block's LN1 (or on the last
 * stage the final LayerNorm) after its MLP. */
static rows_norm norm_after(ff_gpt *g, float *out, const float *a, float *ln, float *mean,
                            float *rstd, const float *w, const float *b)
{
    rows_norm r = {{g, out, a, g->tmp, g->cy}, NULL, NULL, NULL, NULL, NULL, FF_OK};
    if (g->gy == 1 && ln)
        r.ln = ln, r.mean = mean, r.rstd = rstd, r.w = w, r.b = b;
    return r;
}

static void rows_gelu(void *arg, int64_t row0, int64_t n)
{
    rows_work *w = arg;
    int64_t off = row0 * w->width;
    ff_gelu_forward(w->g->ctx, w->out + off, w->a + off, n * w->width);
}

/* A product whose input only products read again (bf16-mixed: kept in
 * 2 bytes in keep, docs/design.md §13; fp32: inp itself) */
static int forward_keep(ff_linear *l, float *out, const float *inp, uint16_t *keep, int64_t rows,
                        ff_linear_rows_fn done, void *arg)
{
    return keep ? ff_linear_forward_keep(l, out, inp, keep, rows, done, arg)
                : ff_linear_forward_rows(l, out, inp, rows, done, arg);
}

static int backward_kept(ff_linear *l, float *dinp, const float *dout, const float *inp,
                         const uint16_t *kept, int64_t rows)
{
    return kept ? ff_linear_backward_bf16(l, dinp, dout, kept, rows)
                : ff_linear_backward(l, dinp, dout, inp, rows);
}

/* bf16-mixed: an activation made outside its product's forward (a
 * recompute that stops before it, CAC's local work) kept in 2 bytes */
static void keep_bf16(uint16_t *keep, const float *x, int64_t n)
{
    if (keep)
        ff_bf16_pack(keep, x, (size_t)n);
}

/* The rank's heads: atty from qkv, in bf16-mixed on bf16 operands */
static void attention_forward(ff_gpt *g, ff_gpt_acts *a)
{
    if (g->opt.precision == FF_PRECISION_BF16_MIXED)
        ff_attention_forward_bf16(g->ctx, a->atty, a->att, a->qkv, g->Bl, g->T, (int)g->nhx,
                                  (int)g->hs, g->att_bf16);
    else
        ff_attention_forward(g->ctx, a->atty, a->att, a->qkv, g->Bl, g->T, (int)g->nhx, (int)g->hs);
}

/* Block l from resid[l]: to resid[l + 1], or under recompute only as far as
 * the backward needs (the MLP down's input). */
static int block_forward(ff_gpt *g, int l, ff_gpt_acts *a, int recompute)
{
    const int64_t m = g->m, cy = g->cy, C = g->cfg.C;
    const float *h = resid_at(g, l);
    int rc;
    if (recompute && g->opt.cac) { /* only the local work, from what was kept */
        ff_ln_apply(g->ctx, a->ln1, a->ln1_mean, a->ln1_rstd, h, g->pv.ln1w[l], g->pv.ln1b[l], m,
                    cy);
        keep_bf16(a->ln1h, a->ln1, m * cy);
        attention_forward(g, a);
        keep_bf16(a->attyh, a->atty, m * g->cx);
        ff_ln_apply(g->ctx, a->ln2, a->ln2_mean, a->ln2_rstd, a->mid, g->pv.ln2w[l], g->pv.ln2b[l],
                    m, cy);
        if (g->is_moe[l])
            ff_gelu_forward(g->ctx, a->moe.A, a->moe.Hp, a->moe.own0[g->el] * g->fx);
        else {
            keep_bf16(a->ln2h, a->ln2, m * cy);
            ff_gelu_forward(g->ctx, a->fch_gelu, a->fch, m * g->fx);
            keep_bf16(a->fch_geluh, a->fch_gelu, m * g->fx);
        }
        return FF_OK;
    }
    // ln1 (m, C/Gy) = LayerNorm(h), unless the previous block's MLP made it;
    // qkv (m, 3C/Gx) = ln1 Wqkv + b
    const int ln1_made = !recompute && g->ln_ready == l;
    g->ln_ready = -1;
    if ((!ln1_made && (rc = ff_ln_forward(g->grp_y, a->ln1, a->ln1_mean, a->ln1_rstd, h,
                                          g->pv.ln1w[l], g->pv.ln1b[l], m, cy, C))) ||
        (rc = forward_keep(g->qkv[l], a->qkv, a->ln1, a->ln1h, m, NULL, NULL)))
        return rc;
    // atty (m, C/Gx): the rank's heads
    attention_forward(g, a);
    // mid (m, C/Gy) = h + atty Wproj + b; ln2 = LayerNorm(mid), per chunk where it can
    rows_norm mid =
        norm_after(g, a->mid, h, a->ln2, a->ln2_mean, a->ln2_rstd, g->pv.ln2w[l], g->pv.ln2b[l]);
    if ((rc = forward_keep(g->attproj[l], g->tmp, a->atty, a->attyh, m, rows_add_norm, &mid)) ||
        (rc = mid.rc))
        return rc;
    // fch (m, 4C/Gx) = ln2 Wfc + b; fch_gelu = GELU(fch)
    rows_work act = {g, a->fch_gelu, a->fch, NULL, g->fx};
    if ((!mid.ln && (rc = ff_ln_forward(g->grp_y, a->ln2, a->ln2_mean, a->ln2_rstd, a->mid,
                                        g->pv.ln2w[l], g->pv.ln2b[l], m, cy, C))) ||
        (!g->is_moe[l] &&
         (rc = forward_keep(g->fc[l], a->fch, a->ln2, a->ln2h, m, rows_gelu, &act))))
        return rc;
    if (g->is_moe[l]) // resid[l+1] = mid + the experts' output (gpt_moe.c)
        return ff_gpt_moe_forward(g, l, a, resid_at(g, l + 1), recompute);
    if (recompute) { /* (the MLP down's input, kept as its forward would keep it) */
        keep_bf16(a->fch_geluh, a->fch_gelu, m * g->fx);
        return FF_OK;
    }
    // resid[l+1] (m, C/Gy) = mid + fch_gelu Wfcproj + b, and per chunk where
    // it can the LayerNorm that reads it: the next block's LN1, or the final one
    rows_norm out;
    if (l + 1 < g->nb) {
        ff_gpt_acts *next = ff_gpt_acts_of(g, l + 1);
        out = norm_after(g, resid_at(g, l + 1), a->mid, next->ln1, next->ln1_mean, next->ln1_rstd,
                         g->pv.ln1w[l + 1], g->pv.ln1b[l + 1]);
    } else {
        out = norm_after(g, resid_at(g, l + 1), a->mid, g->last ? g->lnf : NULL, g->lnf_mean,
                         g->lnf_rstd, g->pv.lnfw, g->pv.lnfb);
    }
    if ((rc = forward_keep(g->fcproj[l], g->tmp, a->fch_gelu, a->fch_geluh, m, rows_add_norm,
                           &out)) ||
        (rc = out.rc))
        return rc;
    if (out.ln)
        g->ln_ready = l + 1;
    return FF_OK;
}

/* dres (m, C/Gy) holds d loss / d resid[l + 1]; leaves d loss / d resid[l]. */
static int block_backward(ff_gpt *g, int l, ff_gpt_acts *a)
{
    const int64_t m = g->m, cy = g->cy, C = g->cfg.C;
    int rc;
    // MLP: dfch (m, 4C/Gx) = dres Wfcproj^T, then through GELU; dln (m, C/Gy)
    if (g->is_moe[l]) {
        if ((rc = ff_gpt_moe_backward(g, l, a)))
            return rc;
    } else {
        if ((rc = backward_kept(g->fcproj[l], g->dfch, g->dres, a->fch_gelu, a->fch_geluh, m)))
            return rc;
        ff_gelu_backward(g->ctx, g->dfch, a->fch, g->dfch, m * g->fx);
        if ((rc = backward_kept(g->fc[l], g->dln, g->dfch, a->ln2, a->ln2h, m)))
            return rc;
    }
    if ((rc = ff_ln_backward(g->grp_y, g->dres, g->gv.ln2w[l], g->gv.ln2b[l], g->dln, a->mid,
                             g->pv.ln2w[l], a->ln2_mean, a->ln2_rstd, m, cy, C, g->ln_scratch)))
        return rc;
    // attention: datty (m, C/Gy) = dres Wproj^T; dqkv (m, 3C/Gx)
    if ((rc = backward_kept(g->attproj[l], g->datty, g->dres, a->atty, a->attyh, m)))
        return rc;
    if (g->opt.precision == FF_PRECISION_BF16_MIXED)
        ff_attention_backward_bf16(g->ctx, g->dqkv, g->att_scratch, g->datty, a->qkv, a->att, g->Bl,
                                   g->T, (int)g->nhx, (int)g->hs, g->att_bf16);
    else
        ff_attention_backward(g->ctx, g->dqkv, g->att_scratch, g->datty, a->qkv, a->att, g->Bl,
                              g->T, (int)g->nhx, (int)g->hs);
    if ((rc = backward_kept(g->qkv[l], g->dln, g->dqkv, a->ln1, a->ln1h, m)))
        return rc;
    return ff_ln_backward(g->grp_y, g->dres, g->gv.ln1w[l], g->gv.ln1b[l], g->dln, resid_at(g, l),
                          g->pv.ln1w[l], a->ln1_mean, a->ln1_rstd, m, cy, C, g->ln_scratch);
}

static int post_bucket(ff_gpt *g, int l);

/* This stage's part of the forward: the embedding (first stage) into the
 * slot's block input, the blocks, and on the last stage the final
 * LayerNorm, the LM head and the loss (each row's -log p, into g->losses).
 * With dscale != 0 the logits become d loss / d logits. */
static int forward(ff_gpt *g, const int32_t *tokens, const int32_t *targets, float dscale)
{
    const int64_t m = g->m, v0 = (int64_t)g->me.x * g->vx;
    int rc;
    /* the load-balancing loss weighs as the micro-batch's mean loss does */
    g->moe_aux_wt = dscale * (float)g->B * (float)g->T;
    if (g->first) {
        const float *wte_block;
        float *unused;
        const uint16_t *wte16; /* (bf16-mixed with Gz = 1: the copy itself) */
        if ((rc = ff_linear_use_begin_bf16(g->wte, &wte16, &wte_block, &unused)) ||
            (wte16 && (rc = ff_embed_forward_bf16(g->grp_x, resid_at(g, 0), tokens, wte16,
                                                  g->pv.wpe, g->Bl, g->T, v0, g->vx, g->cy))) ||
            (!wte16 && (rc = ff_embed_forward(g->grp_x, resid_at(g, 0), tokens, wte_block,
                                              g->pv.wpe, g->Bl, g->T, v0, g->vx, g->cy))) ||
            (rc = ff_linear_use_end(g->wte)))
            return rc;
    }
    g->ln_ready = -1;
    for (int l = 0; l < g->nb; l++)
        if ((rc = block_forward(g, l, ff_gpt_acts_of(g, l), 0)))
            return rc;
    if (!g->last)
        return FF_OK;
    if ((g->ln_ready != g->nb &&
         (rc = ff_ln_forward(g->grp_y, g->lnf, g->lnf_mean, g->lnf_rstd, resid_at(g, g->nb),
                             g->pv.lnfw, g->pv.lnfb, m, g->cy, g->cfg.C))) ||
        (rc = forward_keep(g->wte, g->logits, g->lnf, g->lnfh, m, NULL, NULL)))
        return rc;
    g->ln_ready = -1;
    return ff_crossentropy(g->grp_x, g->losses, g->logits, targets, m, v0, g->vx, g->cfg.V, dscale,
                           g->ce_scratch);
}

/* This stage's part of the backward: from the loss (last stage) or from
 * d loss / d output in g->dres, through the blocks (recomputing those under
 * checkpointing) to the embedding's gradient (first stage) or to
 * d loss / d input in g->dres. With overlap_dp, each block's gradient
 * bucket is all-reduced over D as soon as it is complete. */
static int backward(ff_gpt *g, const int32_t *tokens, int overlap_dp)
{
    const int L = g->nb;
    const int64_t m = g->m;
    int rc;
    if (g->last) {
        // LM head: dlnf (m, C/Gy) = dlogits wte_block; dwte += dlogits^T lnf
        if ((rc = backward_kept(g->wte, g->dln, g->logits, g->lnf, g->lnfh, m)))
            return rc;
        memset(g->dres, 0, (size_t)(m * g->cy) * sizeof(float));
        if ((rc = ff_ln_backward(g->grp_y, g->dres, g->gv.lnfw, g->gv.lnfb, g->dln, resid_at(g, L),
                                 g->pv.lnfw, g->lnf_mean, g->lnf_rstd, m, g->cy, g->cfg.C,
                                 g->ln_scratch)))
            return rc;
    }
    for (int l = L - 1; l >= 0; l--) {
        ff_gpt_acts *a = ff_gpt_acts_of(g, l);
        if (g->ckpt[l] && (rc = block_forward(g, l, a, 1)))
            return rc;
        if ((rc = block_backward(g, l, a)))
            return rc;
        /* the bucket one block behind: its reduce-scatters had a block's
         * backward to finish (ORS) */
        if (overlap_dp && l + 1 < L && (rc = post_bucket(g, l + 1)))
            return rc;
    }
    if (g->first) {
        // the lookup's gradient: rows of dres into the wte block, positions
        const float *unused;
        float *dwte_block;
        if ((rc = ff_linear_use_begin(g->wte, &unused, &dwte_block)))
            return rc;
        ff_embed_backward(g->ctx, dwte_block, g->gv.wpe, g->dres, tokens, g->Bl, g->T,
                          (int64_t)g->me.x * g->vx, g->vx, g->cy);
        if ((rc = ff_linear_use_end(g->wte)))
            return rc;
    }
    return FF_OK;
}

int ff_gpt_tokens_local(ff_gpt *g, const int32_t *tokens, const int32_t *targets, int64_t rows)
{
    for (int64_t i = 0; i < rows; i++)
        if (tokens[i] < 0 || tokens[i] >= g->cfg.V || targets[i] < 0 || targets[i] >= g->cfg.V)
            return ff_set_error(g->ctx, FF_EINVAL,
                                "token %d or target %d at row %lld is outside the vocabulary "
                                "[0, %d)",
                                tokens[i], targets[i], (long long)i, g->cfg.V);
    return FF_OK;
}

/* Each rank checks its own tokens; the outcome is agreed, so a bad token on
 * one rank stops every rank before any collective of the step. */
int ff_gpt_check_tokens(ff_gpt *g, const int32_t *tokens, const int32_t *targets)
{
    return ff_ctx_agree(g->ctx, ff_gpt_tokens_local(g, tokens, targets, g->m));
}

int ff_gpt_run_forward(ff_gpt *g, const int32_t *tokens, const int32_t *targets)
{
    return g->P > 1 ? ff_gpt_pipeline_eval(g, tokens, targets)
                    : ff_gpt_eval_forward_stage(g, tokens, targets);
}

int ff_gpt_eval_forward_stage(ff_gpt *g, const int32_t *tokens, const int32_t *targets)
{
    int rc;
    g->slot = 0;
    if ((rc = use_program(g, PROG_EVAL)) || (rc = ff_linear_seq_begin(g->seq)))
        return rc;
    rc = forward(g, tokens, targets, 0.0f);
    int rc2 = ff_linear_seq_end(g->seq);
    return rc ? rc : rc2;
}

static double sum_losses(const ff_gpt *g)
{
    double s = 0;
    for (int64_t i = 0; g->last && i < g->m; i++)
        s += g->losses[i];
    return s;
}

/* The data-parallel ranges of the flat gradient buffer: block l's bucket
 * (r = 2l), its local experts' (2l + 1), the embedding's (2 nb). */
static void dp_range(const ff_gpt *g, int r, size_t *off, size_t *len)
{
    if (r == 2 * g->nb) {
        *off = 0; /* (wte's shard comes first) */
        *len = g->wte ? ff_linear_local_sizes(g->wte).w_shard : 0;
    } else {
        *off = r % 2 ? g->ebucket_off[r / 2] : g->bucket_off[r / 2];
        *len = r % 2 ? g->ebucket_len[r / 2] : g->bucket_len[r / 2];
    }
    /* the local experts' bucket is all-reduced only with replicas of them */
    if (r % 2 && r < 2 * g->nb && ff_group_size(g->grp_edp) <= 1)
        *len = 0;
}

void ff_gpt_dp_range(const ff_gpt *g, int r, size_t *off, size_t *len) { dp_range(g, r, off, len); }

int ff_gpt_pack_build(ff_gpt *g)
{
    free(g->pack_idx), free(g->pack_off), ff_fbuf_free(g->pack_buf);
    g->pack_idx = NULL, g->pack_off = NULL, g->pack_buf = NULL;
    if (!g->mask || g->gd <= 1) /* no data-parallel all-reduce to pack */
        return FF_OK;
    const int nr = 2 * g->nb + 1;
    size_t kept = 0, off, len;
    for (int r = 0; r < nr; r++) {
        dp_range(g, r, &off, &len);
        for (size_t i = off; i < off + len; i++)
            kept += g->mask[i] != 0.0f;
    }
    g->pack_off = malloc((size_t)(nr + 1) * sizeof *g->pack_off);
    g->pack_idx = malloc((kept ? kept : 1) * sizeof *g->pack_idx);
    g->pack_buf = ff_fbuf_alloc(g->ctx, kept);
    if (!g->pack_off || !g->pack_idx || !g->pack_buf || g->n_params > UINT32_MAX) {
        free(g->pack_idx), free(g->pack_off), ff_fbuf_free(g->pack_buf);
        g->pack_idx = NULL, g->pack_off = NULL, g->pack_buf = NULL;
        return ff_set_error(g->ctx, FF_ENOMEM, "out of memory for the packed gradients");
    }
    size_t k = 0;
    for (int r = 0; r < nr; r++) {
        g->pack_off[r] = k;
        dp_range(g, r, &off, &len);
        for (size_t i = off; i < off + len; i++)
            if (g->mask[i] != 0.0f)
                g->pack_idx[k++] = (uint32_t)i;
    }
    g->pack_off[nr] = k;
    return FF_OK;
}

/* All-reduces range r of the gradients over `grp`: the whole range, or
 * with a mask its kept entries packed (unpacked by unpack_ranges). */
static int reduce_range(ff_gpt *g, ff_group *grp, int r, ff_request **req)
{
    size_t off, len;
    dp_range(g, r, &off, &len);
    if (g->zr) /* ZeRO: only the rank's slice is summed (docs/design.md) */
        return ff_gpt_zero_reduce(g, grp, off, len, req);
    if (g->samo && off >= g->samo_zc0) { /* the compressed gradients are packed already */
        const size_t k0 = ff_gpt_samo_lower(g, off), k1 = ff_gpt_samo_lower(g, off + len);
        float *c = g->samo_g + k0;
        return ff_iallreduce(grp, c, c, k1 - k0, &g->opt.linear.coll, req);
    }
    float *p = g->grads + off; /* (under SAMO: wte's dense shard) */
    if (!g->pack_idx)
        return ff_iallreduce(grp, p, p, len, &g->opt.linear.coll, req);
    const size_t k0 = g->pack_off[r], k1 = g->pack_off[r + 1];
    float *buf = g->pack_buf + k0;
    for (size_t k = k0; k < k1; k++)
        buf[k - k0] = g->grads[g->pack_idx[k]];
    return ff_iallreduce(grp, buf, buf, k1 - k0, &g->opt.linear.coll, req);
}

/* The packed ranges back into the gradients (their all-reduces done). */
static void unpack_ranges(ff_gpt *g)
{
    for (size_t k = 0; g->pack_idx && k < g->pack_off[2 * g->nb + 1]; k++)
        g->grads[g->pack_idx[k]] = g->pack_buf[k];
}

/* Data parallelism: once a block's reduce-scatters are in, its gradient
 * shards (one contiguous bucket) are all-reduced over D in the background.
 * l = nb: the embedding's. */
static int post_bucket(ff_gpt *g, int l)
{
    int rc;
    if (l == g->nb) {
        if (!g->wte)
            return FF_OK;
        if ((rc = ff_linear_wait_grad(g->wte)))
            return rc;
        return reduce_range(g, g->grp_d, 2 * l, &g->bucket_req[l]);
    }
    for (int i = 0; i < ff_gpt_block_nlin(g, l); i++)
        if ((rc = ff_linear_wait_grad(ff_gpt_block_lin(g, l, i))))
            return rc;
    if ((rc = reduce_range(g, g->grp_d, 2 * l, &g->bucket_req[l])))
        return rc;
    /* the local experts' gradients: over their own replicas (EDP, D/Ge) */
    return g->ebucket_len[l] && ff_group_size(g->grp_edp) > 1
               ? reduce_range(g, g->grp_edp, 2 * l + 1, &g->ebucket_req[l])
               : FF_OK;
}

int ff_gpt_zero_grad(ff_gpt *g)
{
    int rc = ff_linear_seq_wait_grads(g->seq);
    for (int l = 0; l <= g->nb; l++)
        ff_wait(&g->bucket_req[l]);
    for (int l = 0; l < g->nb; l++)
        ff_wait(&g->ebucket_req[l]);
    ff_zero(g->ctx, g->grads, (int64_t)ff_gpt_dense_state(g));
    ff_gpt_zero_reduced(g, 0);
    if (g->samo)
        ff_zero(g->ctx, g->samo_g, (int64_t)g->samo_k);
    g->loss_sum = 0;
    g->moe_aux_sum = g->moe_dropped_sum = g->moe_assign_sum = 0;
    g->micro_done = 0;
    return rc;
}

int ff_gpt_forward_backward(ff_gpt *g, const int32_t *tokens, const int32_t *targets, int micro,
                            int n_micro)
{
    if (g->P > 1)
        return ff_ctx_agree(g->ctx, ff_set_error(g->ctx, FF_EUNSUPPORTED,
                                                 "with pipeline stages a step's micro-batches "
                                                 "run together: ff_gpt_grads or ff_gpt_step"));
    int rc = ff_gpt_check_tokens(g, tokens, targets);
    return rc ? rc : ff_gpt_forward_backward_agreed(g, tokens, targets, micro, n_micro);
}

/* Measurements: every stage sleeps pass_s after each pass, the slowed one
 * slow_s more. */
static void straggle(ff_gpt *g)
{
    double slow = g->opt.pipe.slow_stage == g->stage ? g->opt.pipe.slow_s : 0;
    if (slow > 0 && g->opt.pipe.slow_jitter)
        slow *= 2 * ff_rng_uniform(0x5105, (uint32_t)g->stage, g->n_straggles++);
    double s = g->opt.pipe.pass_s + slow;
    if (s <= 0)
        return;
    struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
    nanosleep(&ts, NULL);
}

int ff_gpt_stage_forward(ff_gpt *g, int slot, const int32_t *tokens, const int32_t *targets,
                         float dscale, int last_micro)
{
    int rc;
    g->slot = slot;
    if ((rc = use_program(g, g->last ? PROG_WHOLE : PROG_FORWARD)) ||
        (rc = ff_linear_seq_begin(g->seq)))
        return rc;
    if ((rc = forward(g, tokens, targets, dscale)))
        return rc;
    if (g->last) {
        straggle(g); /* the forward's; the backward's below */
        g->loss_sum += sum_losses(g);
        int overlap_dp = g->opt.dp_overlap && g->gd > 1 && last_micro;
        if ((rc = backward(g, tokens, overlap_dp)))
            return rc;
        if ((rc = ff_linear_seq_end(g->seq)))
            return rc;
        if (overlap_dp && ((rc = post_bucket(g, 0)) || (rc = post_bucket(g, g->nb))))
            return rc;
        if (!g->first) /* the gradient of the stage's input, for the previous stage */
            memcpy(g->grad_out + (int64_t)slot * g->m * g->cy, g->dres,
                   (size_t)(g->m * g->cy) * sizeof(float));
    } else if ((rc = ff_linear_seq_end(g->seq))) {
        return rc;
    }
    straggle(g);
    return FF_OK;
}

int ff_gpt_stage_backward(ff_gpt *g, int slot, const int32_t *tokens, int last_micro)
{
    const int64_t mc = g->m * g->cy;
    int rc, overlap_dp = g->opt.dp_overlap && g->gd > 1 && last_micro;
    g->slot = slot;
    memcpy(g->dres, g->grad_in + slot * mc, (size_t)mc * sizeof(float));
    if ((rc = use_program(g, PROG_BACKWARD)) || (rc = ff_linear_seq_begin(g->seq)) ||
        (rc = backward(g, tokens, overlap_dp)) || (rc = ff_linear_seq_end(g->seq)))
        return rc;
    if (overlap_dp && ((rc = post_bucket(g, 0)) || (rc = post_bucket(g, g->nb))))
        return rc;
    if (!g->first)
        memcpy(g->grad_out + slot * mc, g->dres, (size_t)mc * sizeof(float));
    straggle(g);
    return FF_OK;
}

int ff_gpt_forward_backward_agreed(ff_gpt *g, const int32_t *tokens, const int32_t *targets,
                                   int micro, int n_micro)
{
    if (n_micro <= 0 || micro < 0 || micro >= n_micro)
        return ff_set_error(g->ctx, FF_EINVAL, "micro-batch %d of %d", micro, n_micro);
    /* d(mean loss)/d(row loss): every token of every micro-batch weighs the same */
    float dscale = 1.0f / ((float)n_micro * (float)g->B * (float)g->T);
    int rc = ff_gpt_stage_forward(g, 0, tokens, targets, dscale, micro == n_micro - 1);
    if (rc == FF_OK)
        g->micro_done = micro + 1;
    return rc;
}

/* The tied embedding's two copies, on the first and the last stage: each
 * sends its gradient (the lookup's, the LM head's) to the other over PIPE
 * and adds the two in the same order, lookup's first, so both copies get
 * the same sum and stay equal after the update. */
static int tie_embedding(ff_gpt *g)
{
    if (g->P == 1 || !g->wte)
        return FF_OK;
    size_t n = ff_linear_local_sizes(g->wte).w_shard;
    float *own = g->gv.wte;
    if (g->samo && !g->samo_zc0) { /* the kept entries: the same on both copies */
        own = g->samo_g;           /* (wte's shard comes first) */
        n = ff_gpt_samo_lower(g, n);
    }
    const int peer = g->first ? g->P - 1 : 0;
    ff_request *req[2] = {NULL, NULL};
    int rc = ff_isend(g->grp_pipe, own, n, peer, FF_GPT_TAG_EMB, &req[0]);
    if (rc == FF_OK)
        rc = ff_irecv(g->grp_pipe, g->emb_peer, n, peer, FF_GPT_TAG_EMB, &req[1]);
    int rc2 = ff_waitall(req, 2);
    if ((rc = rc ? rc : rc2))
        return rc;
    const float *lookup = g->first ? own : g->emb_peer, *head = g->first ? g->emb_peer : own;
    for (size_t i = 0; i < n; i++)
        own[i] = lookup[i] + head[i];
    return FF_OK;
}

int ff_gpt_finish_grads(ff_gpt *g, float *loss)
{
    const int L = g->nb;
    int rc = ff_linear_seq_wait_grads(g->seq);
    if (rc)
        return rc;
    if (g->gd > 1) {
        /* without the overlap: after the backward, block by block, then wte */
        for (int i = 0; !g->opt.dp_overlap && i <= L; i++) {
            int l = i < L ? L - 1 - i : L;
            if ((rc = post_bucket(g, l)) || (rc = ff_wait(&g->bucket_req[l])) ||
                (l < L && (rc = ff_wait(&g->ebucket_req[l]))))
                return rc;
        }
        if ((rc = ff_waitall(g->bucket_req, L + 1)) || (rc = ff_waitall(g->ebucket_req, L)))
            return rc;
        unpack_ranges(g);
        ff_gpt_zero_reduced(g, 1);
    }
    /* everything that is not Z-sharded: one all-reduce over ZD; the local
     * experts' biases over Z and over their own replicas */
    float *others = ff_gpt_rest(g, g->grads, g->n_zsharded);
    float *eb = ff_gpt_rest(g, g->grads, g->n_eby);
    if ((rc = ff_allreduce(g->grp_zd, others, others, g->n_eby - g->n_zsharded, NULL)))
        return rc;
    if (g->n_params > g->n_eby &&
        ((rc = ff_allreduce(ff_grid_group(g->grid, FF_GROUP_Z), eb, eb, g->n_params - g->n_eby,
                            NULL)) ||
         (rc = ff_allreduce(g->grp_edp, eb, eb, g->n_params - g->n_eby, NULL))))
        return rc;
    if ((rc = tie_embedding(g)))
        return rc;
    if (g->mask) /* masked training: pruned weights get no gradient (their
                  * entries were left out of the packed all-reduces) */
        ff_mul(g->ctx, g->grads, g->grads, g->mask, (int64_t)g->n_params);
    float l_sum = (float)g->loss_sum;
    if ((rc = ff_allreduce(g->grp_zd, &l_sum, &l_sum, 1, NULL)))
        return rc;
    /* only the last stage has the loss: the others add zeros */
    if (g->P > 1 && (rc = ff_allreduce(g->grp_pipe, &l_sum, &l_sum, 1, NULL)))
        return rc;
    if (loss)
        *loss = l_sum / ((float)(g->micro_done ? g->micro_done : 1) * (float)g->B * (float)g->T);
    return ff_gpt_moe_finish(g, g->micro_done ? g->micro_done : 1);
}

/* The step's MoE statistics (ff_gpt_moe_stats): the blocks of every stage,
 * mean over n_micro micro-batches. The sums are the same on every rank of a
 * stage (the forward all-reduced them over ZD). */
int ff_gpt_moe_finish(ff_gpt *g, int n_micro)
{
    float s[3] = {(float)g->moe_aux_sum, (float)g->moe_dropped_sum, (float)g->moe_assign_sum};
    int rc = g->E && g->P > 1 ? ff_allreduce(g->grp_pipe, s, s, 3, NULL) : FF_OK;
    g->moe_aux = s[0] / (float)n_micro;
    g->moe_dropped = s[2] > 0 ? s[1] / s[2] : 0.0f;
    return rc;
}

void ff_pipe_split(int L, int P, int *blocks)
{
    for (int s = 0; s < P; s++)
        blocks[s] = L / P + (s < L % P);
}

void ff_gpt_pipeline_times(const ff_gpt *g, ff_pipe_times *t)
{
    t->busy_s = g->pipe_busy_s;
    t->idle_s = g->pipe_idle_s;
}

int ff_gpt_pipeline_order(const ff_gpt *g, int *order, int max)
{
    for (int i = 0; i < g->pipe_order_n && i < max && i < FF_GPT_PIPE_ORDER_MAX; i++)
        order[i] = g->pipe_order[i];
    return g->pipe_order_n;
}

void ff_gpt_stage_blocks(const ff_gpt *g, int *first, int *count)
{
    *first = g->l0;
    *count = g->nb;
}
