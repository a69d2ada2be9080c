/* ZeRO over the data-parallel ranks (ff_gpt_opts.zero, docs/design.md
 * "ZeRO over D"; TED, dissertation §7.1): the gradients of the weights
 * sharded over Z, which plain data parallelism all-reduces over D, are
 * reduce-scattered instead (the ring all-reduce's reduce phase, so every sum
 * is added in the all-reduce's order), AdamW updates the rank's chunk of
 * each range with moments held for that chunk only, and the all-reduce's
 * gather phase returns the updated parameters. Everything else (the
 * parameters replicated over Z and D, and whatever no D collective covers)
 * keeps its whole moments.
 *
 * The state is a list of segments of the flat buffers, in increasing
 * offset: the rank's chunk of each data-parallel range, whole runs between
 * them, and [n_zsharded, n_params). A sliced buffer (AdamW's moments; in
 * bf16-mixed training the fp32 master weights too, whose ranges then move
 * over D as their bf16 copy) holds the segments one after another,
 * ff_gpt_zero_state floats.
 *
 * Under SAMO (samo.c, docs/samo.md "SAMO with ZeRO") the compressed
 * gradients' ranges are ranges of SAMO's kept-entry index, not of flat
 * offsets: the ring all-reduce of --zero 0 --samo runs on each bucket's
 * compressed vector, so the reduce phase and the rank's chunk are that
 * vector's. There are then two spaces of segments: space 0 the dense
 * buffers (grads, adam_m, adam_v and in bf16-mixed the master's dense rest:
 * [0, samo_zc0), then [n_zsharded, n_params); offsets below samo_zc0 are
 * flat offsets), space 1 the compressed ones (samo_g, samo_m, samo_v and in
 * bf16-mixed samo_p, [0, samo_k)). The updated compressed values reach the
 * other ranks of D through a compressed staging vector (fp32: the weights'
 * values; bf16-mixed: their bf16 bits), expanded into the dense weights or
 * the bf16 copy when the range is waited for. */
#define _DEFAULT_SOURCE /* madvise */
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "device.h"
#include "gpt_internal.h"
#include "passes.h"
#include "util/team.h"

typedef struct {
    size_t off, len; /* in the space's buffers (space 0 without SAMO: the flat ones) */
    size_t at;       /* in a sliced buffer */
    int chunk;       /* the rank's chunk of a range (else a whole run) */
} zero_seg;

/* A data-parallel range (dp_range's, with its group) and this rank's chunk
 * of it. */
typedef struct {
    ff_group *grp;
    size_t off, len, c_off, c_len; /* in its space's buffers */
    size_t c_at;                   /* the chunk's place in a sliced buffer */
    int space;                     /* 0: the dense buffers, 1: SAMO's compressed ones */
    size_t f_off, f_len;           /* the parameters it covers (flat offsets) */
} zero_range;

/* A run of a region with one owner: the group rank whose chunk it is (0
 * where no range covers it: every rank holds it whole). */
typedef struct {
    size_t off, len;
    int owner;
} zero_run;

/* A part of the gradient norm as the plain pass sums it (gpt_optim.c): the
 * gradients [a, b) in blocks of FF_SUM_BLOCK from a, on group rank 0 of
 * grp (the dense weights over D, on d = 0; the experts' over EDP, on
 * d = eslot). Each block's owner (-1: it straddles owners), the
 * straddling ones, each block's sum of squares. */
typedef struct {
    ff_group *grp;
    size_t a, b;
    zero_run *runs;
    int n_runs;
    int64_t n_blk, n_strad;
    int *blk_owner, *blk_run; /* blk_run: the first run a block touches */
    int64_t *strad;
    double *part;
} zero_region;

struct ff_gpt_zero {
    int level;
    zero_range *ranges; /* in offset order (flat, and so in each space) */
    int n_ranges;
    zero_seg *segs[2]; /* space 0, the dense buffers; space 1, SAMO's compressed ones */
    int n_segs[2];
    size_t state[2];
    zero_region reg[2]; /* the dense weights', the local experts' */
    int reduced;        /* the step's gradients reduce-scattered (ff_gpt_zero_reduced) */
    /* the parameters' gathers after AdamW, one per range, in flight until
     * the range's first reader (ff_gpt_zero_params_wait); NULL: done */
    ff_request **gathers;
    float *kept; /* during a transfer: the gradients' slices (state floats) */
    /* bf16-mixed: the fp32 master sliced too (g->params: state floats);
     * while a reader has it whole (ff_gpt_zero_master_whole), g->params is
     * the full buffer and the slices wait in `sliced` */
    int master, whole;
    float *sliced;
    float *gkept; /* the gradients' slices while the whole master is the gradient buffer */
    /* SAMO: the compressed vector the gathers after AdamW move, samo_k
     * entries (fp32: the weights' values; bf16-mixed: their bf16 bits) */
    float *stage;
    uint16_t *stage16;
};

static size_t chunk_len(size_t n, int p, int i)
{
    return ff_chunk_off(n, p, i + 1) - ff_chunk_off(n, p, i);
}

static int cmp_range(const void *a, const void *b)
{
    const zero_range *x = a, *y = b;
    return (x->f_off > y->f_off) - (x->f_off < y->f_off);
}

void ff_gpt_zero_destroy(ff_gpt *g)
{
    ff_gpt_zero *z = g->zr;
    if (!z)
        return;
    for (int k = 0; k < 2; k++) {
        zero_region *e = &z->reg[k];
        free(e->runs), free(e->blk_owner), free(e->blk_run), free(e->strad), free(e->part);
    }
    ff_gpt_zero_params_settle(g);
    ff_gpt_zero_master_slice(g, 0);
    free(z->ranges), free(z->segs[0]), free(z->segs[1]), free(z->gathers);
    ff_fbuf_free(z->stage), ff_fbuf_free((float *)z->stage16);
    free(z);
    g->zr = NULL;
}

int ff_gpt_zero_check(const ff_gpt *g)
{
    const int zero = g->opt.zero;
    if (zero < 0 || zero > 2)
        return ff_set_error(g->ctx, FF_EINVAL, "zero %d: the choices are 0, 1 and 2", zero);
    if (zero == 0 || g->gd <= 1)
        return FF_OK;
    const char *why =
        ff_ctx_cuda(g->ctx)                       ? "a GPU context"
        : g->opt.linear.coll.wire != FF_WIRE_FP32 ? "the bf16 wire"
        : g->opt.linear.coll.algo != FF_ALGO_AUTO && g->opt.linear.coll.algo != FF_ALGO_RING
            ? "a collective algorithm other than the ring"
            : NULL;
    return why ? ff_set_error(g->ctx, FF_EUNSUPPORTED,
                              "ZeRO (zero %d) with %s is not supported yet", zero, why)
               : FF_OK;
}

/* Where chunk i of range q begins in flat offsets (i = p: its end). A
 * compressed range's chunk is a run of kept entries: it begins at its
 * first kept entry's offset (the first chunk at the range's start), so the
 * chunks cut the range's flat offsets into runs, each holding one chunk's
 * kept entries and pruned ones, which add nothing to the norm. */
static size_t chunk_flat(const ff_gpt *g, const zero_range *q, int p, int i)
{
    if (i == 0 || i == p)
        return q->f_off + (i ? q->f_len : 0);
    const size_t k = q->off + ff_chunk_off(q->len, p, i);
    if (q->space == 0)
        return k;
    return k < q->off + q->len ? g->samo_idx[k] : q->f_off + q->f_len;
}

/* The owners of a region (flat offsets): the chunks of its group's ranges,
 * whole runs (owner 0) between. */
static int build_runs(const ff_gpt *g, const ff_gpt_zero *z, zero_region *e)
{
    size_t cap = 1, at = e->a;
    for (int r = 0; r < z->n_ranges; r++)
        cap += (size_t)ff_group_size(z->ranges[r].grp) + 1;
    if (!(e->runs = malloc(cap * sizeof *e->runs)))
        return FF_ENOMEM;
    int k = 0;
    for (int r = 0; r < z->n_ranges; r++) {
        const zero_range *q = &z->ranges[r];
        if (q->grp != e->grp || q->f_off + q->f_len <= e->a || q->f_off >= e->b)
            continue;
        if (q->f_off > at)
            e->runs[k++] = (zero_run){at, q->f_off - at, 0};
        const int p = ff_group_size(q->grp);
        for (int i = 0; i < p; i++) {
            size_t lo = chunk_flat(g, q, p, i), hi = chunk_flat(g, q, p, i + 1);
            lo = lo > e->a ? lo : e->a;
            hi = hi < e->b ? hi : e->b;
            if (hi > lo)
                e->runs[k++] = (zero_run){lo, hi - lo, i};
        }
        at = q->f_off + q->f_len;
    }
    if (e->b > at)
        e->runs[k++] = (zero_run){at, e->b - at, 0};
    e->n_runs = k;
    return FF_OK;
}

/* The region's blocks: whose each is, which straddle. */
static int build_blocks(zero_region *e)
{
    const size_t n = e->b - e->a;
    e->n_blk = (int64_t)((n + FF_SUM_BLOCK - 1) / FF_SUM_BLOCK);
    const size_t nb = (size_t)(e->n_blk ? e->n_blk : 1);
    e->blk_owner = malloc(nb * sizeof(int));
    e->blk_run = malloc(nb * sizeof(int));
    e->part = malloc(nb * sizeof(double));
    e->strad = malloc(nb * sizeof(int64_t));
    if (!e->blk_owner || !e->blk_run || !e->part || !e->strad)
        return FF_ENOMEM;
    for (int64_t b = 0; b < e->n_blk; b++)
        e->blk_owner[b] = -2;
    for (int k = 0; k < e->n_runs; k++) {
        const zero_run *u = &e->runs[k];
        const size_t lo = u->off - e->a;
        for (size_t b = lo / FF_SUM_BLOCK; b * FF_SUM_BLOCK < lo + u->len; b++) {
            if (e->blk_owner[b] == -2)
                e->blk_owner[b] = u->owner, e->blk_run[b] = k;
            else if (e->blk_owner[b] != u->owner)
                e->blk_owner[b] = -1;
        }
    }
    e->n_strad = 0;
    for (int64_t b = 0; b < e->n_blk; b++)
        if (e->blk_owner[b] == -1)
            e->strad[e->n_strad++] = b;
    return FF_OK;
}

static void move_state(const ff_gpt_zero *z, int sp, float *full, float *sliced, int to_full);

/* Entries of space sp's whole buffers. */
static size_t space_size(const ff_gpt *g, int sp) { return sp ? g->samo_k : ff_gpt_dense_state(g); }

/* The flat offset of entry i of space 0's buffers (under SAMO they hold
 * [0, samo_zc0), then [n_zsharded, n_params)). */
static size_t dense_flat(const ff_gpt *g, size_t i)
{
    return g->samo && i >= g->samo_zc0 ? i + g->n_zsharded - g->samo_zc0 : i;
}

/* The state's segments in space sp: the rank's chunk of each range, whole
 * runs between, the rest. */
static int build_segs(ff_gpt *g, ff_gpt_zero *z, int sp)
{
    if (!(z->segs[sp] = malloc((size_t)(2 * z->n_ranges + 2) * sizeof(zero_seg))))
        return FF_ENOMEM;
    zero_seg *segs = z->segs[sp];
    int k = 0;
    size_t at = 0, off = 0;
    const size_t n = space_size(g, sp);
    for (int r = 0; r < z->n_ranges; r++) {
        zero_range *q = &z->ranges[r];
        if (q->space != sp)
            continue;
        if (q->off > off)
            segs[k++] = (zero_seg){off, q->off - off, at, 0}, at += q->off - off;
        q->c_at = at;
        if (q->c_len)
            segs[k++] = (zero_seg){q->c_off, q->c_len, at, 1}, at += q->c_len;
        off = q->off + q->len;
    }
    if (n > off)
        segs[k++] = (zero_seg){off, n - off, at, 0}, at += n - off;
    z->n_segs[sp] = k;
    z->state[sp] = at;
    return FF_OK;
}

/* SAMO: the rank's slices of the compressed moments and master and of the
 * dense ones (whole until now: the switch, samo.c), and the staging vector
 * of the gathers after AdamW. */
static int samo_slice(ff_gpt *g, ff_gpt_zero *z)
{
    const int moments = g->adam_m != NULL, master = g->samo_p != NULL;
    float *b[6] = {NULL};
    if (moments)
        b[0] = ff_fbuf_alloc(g->ctx, z->state[0]), b[1] = ff_fbuf_alloc(g->ctx, z->state[0]),
        b[2] = ff_fbuf_alloc(g->ctx, z->state[1]), b[3] = ff_fbuf_alloc(g->ctx, z->state[1]);
    if (master)
        b[4] = ff_fbuf_alloc(g->ctx, z->state[0]), b[5] = ff_fbuf_alloc(g->ctx, z->state[1]);
    if (master)
        z->stage16 = (uint16_t *)ff_fbuf_alloc(g->ctx, (g->samo_k + 1) / 2);
    else
        z->stage = ff_fbuf_alloc(g->ctx, g->samo_k);
    int ok = (!moments || (b[0] && b[1] && b[2] && b[3])) && (!master || (b[4] && b[5])) &&
             (z->stage || z->stage16);
    if (!ok) {
        for (int i = 0; i < 6; i++)
            ff_fbuf_free(b[i]);
        return FF_ENOMEM;
    }
    float **whole[6] = {&g->adam_m, &g->adam_v, &g->samo_m, &g->samo_v, &g->samo_prest, &g->samo_p};
    static const int space[6] = {0, 0, 1, 1, 0, 1};
    for (int i = 0; i < 6; i++)
        if (b[i]) {
            move_state(z, space[i], *whole[i], b[i], 0);
            ff_fbuf_free(*whole[i]);
            *whole[i] = b[i];
        }
    if (master) {
        g->params = g->samo_prest;
        z->master = 1;
    }
    return FF_OK;
}

int ff_gpt_zero_setup(ff_gpt *g)
{
    int rc = ff_gpt_zero_check(g);
    if (rc || g->opt.zero == 0 || g->gd <= 1)
        return rc;
    ff_gpt_zero *z = calloc(1, sizeof *z);
    if (!z)
        return ff_set_error(g->ctx, FF_ENOMEM, "out of memory for ZeRO's layout");
    g->zr = z;
    z->level = g->opt.zero;
    const int nr = 2 * g->nb + 1;
    if (!(z->ranges = calloc((size_t)nr, sizeof *z->ranges)) ||
        !(z->gathers = calloc((size_t)nr, sizeof *z->gathers))) {
        ff_gpt_zero_destroy(g);
        return ff_set_error(g->ctx, FF_ENOMEM, "out of memory for ZeRO's layout");
    }
    /* the ranges plain data parallelism all-reduces: the blocks' buckets
     * and the embedding's over D, the local experts' over their replicas
     * EDP (where there are several); under SAMO those of compressed
     * weights are their kept entries (as gpt.c's reduce_range sends them) */
    for (int r = 0; r < nr; r++) {
        size_t off, len;
        ff_gpt_dp_range(g, r, &off, &len);
        const int sp = g->samo && off >= g->samo_zc0;
        const size_t s_off = sp ? ff_gpt_samo_lower(g, off) : off;
        const size_t s_len = sp ? ff_gpt_samo_lower(g, off + len) - s_off : len;
        if (s_len == 0)
            continue;
        zero_range *q = &z->ranges[z->n_ranges++];
        ff_group *grp = r % 2 && r < 2 * g->nb ? g->grp_edp : g->grp_d;
        const int p = ff_group_size(grp), me = ff_group_rank(grp);
        *q = (zero_range){
            grp, s_off, s_len, s_off + ff_chunk_off(s_len, p, me), chunk_len(s_len, p, me), 0,
            sp,  off,   len};
    }
    qsort(z->ranges, (size_t)z->n_ranges, sizeof *z->ranges, cmp_range);
    /* the norm's parts (gpt_optim.c): the dense weights' from the tied
     * embedding's first copy (the last of several stages skips its own),
     * the experts' */
    const size_t skip =
        g->P > 1 && g->last && !g->first && g->wte ? ff_linear_local_sizes(g->wte).w_shard : 0;
    z->reg[0] = (zero_region){.grp = g->grp_d, .a = skip, .b = g->n_dense_z};
    z->reg[1] = (zero_region){
        .grp = g->grp_edp ? g->grp_edp : g->grp_d, .a = g->n_dense_z, .b = g->n_zsharded};
    for (int sp = 0; sp < 2 && rc == FF_OK; sp++)
        rc = build_segs(g, z, sp);
    for (int k = 0; k < 2 && rc == FF_OK; k++)
        if ((rc = build_runs(g, z, &z->reg[k])) == FF_OK)
            rc = build_blocks(&z->reg[k]);
    if (rc == FF_OK && g->samo)
        rc = samo_slice(g, z);
    /* bf16-mixed: the products read the bf16 copy only, so the master is
     * sliced as the moments are (docs/design.md "ZeRO over D") */
    float *sliced = rc == FF_OK && g->wbf16 && !g->samo ? ff_fbuf_alloc(g->ctx, z->state[0]) : NULL;
    if (rc || (g->wbf16 && !g->samo && !sliced)) {
        ff_gpt_zero_destroy(g);
        return ff_set_error(g->ctx, FF_ENOMEM, "out of memory for ZeRO's layout");
    }
    if (sliced) {
        move_state(z, 0, g->params, sliced, 0);
        ff_fbuf_free(g->params);
        g->params = sliced;
        z->master = 1;
    }
    if (sliced || g->samo)
        ff_gpt_bind_views(g);
    return FF_OK;
}

size_t ff_gpt_zero_state(const ff_gpt *g) { return g->zr->state[0]; }

size_t ff_gpt_zero_samo_state(const ff_gpt *g) { return g->zr->state[1]; }

size_t ff_gpt_zero_stage_floats(const ff_gpt *g)
{
    const ff_gpt_zero *z = g->zr;
    return !z || !g->samo ? 0 : z->stage16 ? (g->samo_k + 1) / 2 : g->samo_k;
}

int ff_gpt_zero_samo_master(const ff_gpt *g) { return g->zr && g->samo && g->zr->master; }

int ff_gpt_zero_reduce(ff_gpt *g, ff_group *grp, size_t off, size_t len, ff_request **req)
{
    if (g->samo && off >= g->samo_zc0) { /* the kept entries, as --zero 0 --samo sends them */
        const size_t k0 = ff_gpt_samo_lower(g, off), k1 = ff_gpt_samo_lower(g, off + len);
        return ff_iallreduce_half(grp, g->samo_g + k0, k1 - k0, 0, NULL, req);
    }
    return ff_iallreduce_half(grp, g->grads + off, len, 0, NULL, req);
}

/* The gather phase of every range of space sp over a whole buffer of that
 * space whose chunks are this rank's (blocking). */
static int gather_ranges(ff_gpt *g, int sp, float *whole)
{
    ff_gpt_zero *z = g->zr;
    int rc = FF_OK;
    ff_request *req = NULL;
    for (int r = 0; r < z->n_ranges && rc == FF_OK; r++) {
        const zero_range *q = &z->ranges[r];
        if (q->space == sp &&
            (rc = ff_iallreduce_half(q->grp, whole + q->off, q->len, 1, NULL, &req)) == FF_OK)
            rc = ff_wait(&req);
    }
    return rc;
}

int ff_gpt_zero_whole(ff_gpt *g, int sp, const float *src, int sliced, float *whole)
{
    if (sliced)
        move_state(g->zr, sp, whole, (float *)src, 1);
    else if (whole != src)
        memcpy(whole, src, space_size(g, sp) * sizeof(float));
    return gather_ranges(g, sp, whole);
}

void ff_gpt_zero_slice_flat(const ff_gpt *g, int sp, const float *flat, float *sliced)
{
    const ff_gpt_zero *z = g->zr;
    for (int k = 0; k < z->n_segs[sp]; k++) {
        const zero_seg *e = &z->segs[sp][k];
        for (size_t i = 0; i < e->len; i++)
            sliced[e->at + i] = flat[sp ? g->samo_idx[e->off + i] : dense_flat(g, e->off + i)];
    }
}

/* ZeRO-2: the gradients outside the rank's chunks are not kept after the
 * reduce-scatter; their whole pages go back to the system (they read as
 * zeros, which ff_gpt_zero_grad writes anyway). Huge-page granularity, so
 * that a mapping on huge pages is released whole or not at all. */
static void release_grads(ff_gpt *g)
{
    const ff_gpt_zero *z = g->zr;
    if (!z || z->level < 2)
        return;
    const uintptr_t page = (uintptr_t)2 << 20;
    for (int r = 0; r < z->n_ranges; r++) {
        const zero_range *q = &z->ranges[r];
        const size_t cut[2][2] = {{q->off, q->c_off}, {q->c_off + q->c_len, q->off + q->len}};
        float *grads = q->space ? g->samo_g : g->grads; /* (SAMO's compressed ones) */
        for (int k = 0; k < 2; k++) {
            uintptr_t a = (uintptr_t)(grads + cut[k][0]), b = (uintptr_t)(grads + cut[k][1]);
            a = (a + page - 1) & ~(page - 1);
            b &= ~(page - 1);
            if (b > a)
                madvise((void *)a, b - a, MADV_DONTNEED);
        }
    }
}

/* The sums of squares of the blocks this rank owns whole. */
typedef struct {
    ff_gpt *g;
    zero_region *e;
} owned_job;

/* The squares of the gradients at flat offsets [a, b) into the running
 * sums of the block that starts at lo, in the dense pass's lanes and order:
 * under SAMO the dense ones below samo_zc0, then the kept entries, as
 * samo.c's norm pass adds them. */
static void add_squares(const ff_gpt *g, size_t lo, size_t a, size_t b, double *s)
{
    const size_t dense_end = g->samo && b > g->samo_zc0 ? g->samo_zc0 : b;
    for (size_t i = a; i < dense_end; i++)
        s[(i - lo) % FF_SUM_CHAINS] += (double)g->grads[i] * g->grads[i];
    if (!g->samo)
        return;
    for (size_t k = ff_gpt_samo_lower(g, a > g->samo_zc0 ? a : g->samo_zc0),
                k1 = ff_gpt_samo_lower(g, b);
         k < k1; k++)
        s[(g->samo_idx[k] - lo) % FF_SUM_CHAINS] += (double)g->samo_g[k] * g->samo_g[k];
}

static void owned_sumsq(void *arg, int64_t b0, int64_t b1, int th)
{
    (void)th;
    const owned_job *o = arg;
    const zero_region *e = o->e;
    const sumsq_job j = {o->g->grads + e->a, e->b - e->a, e->part};
    const int me = ff_group_rank(e->grp);
    for (int64_t b = b0; b < b1; b++) {
        if (e->blk_owner[b] != me)
            continue;
        if (!o->g->samo) {
            ff_sumsq_block_at(&j, b);
            continue;
        }
        const size_t lo = e->a + (size_t)b * FF_SUM_BLOCK;
        double s[FF_SUM_CHAINS] = {0};
        add_squares(o->g, lo, lo, lo + FF_SUM_BLOCK < e->b ? lo + FF_SUM_BLOCK : e->b, s);
        e->part[b] = ff_sum_chains(s);
    }
}

/* A block that straddles owners: its running sums (FF_SUM_CHAINS of them,
 * element i to sum (i - start) mod FF_SUM_CHAINS, as ff_sumsq_block_at
 * adds) start on the owner of its first run, pass from owner to owner along
 * the block and end on the last, which adds them pairwise: every addition
 * the plain pass makes, in its order. Blocking messages in the same order
 * on every rank of the group. */
enum { ZERO_TAG = 31000 }; /* beyond the collectives' tags (1..30000) */

static int straddling_sumsq(ff_gpt *g, zero_region *e, int64_t b)
{
    const MPI_Comm comm = ff_group_comm(e->grp);
    const int me = ff_group_rank(e->grp);
    const size_t lo = e->a + (size_t)b * FF_SUM_BLOCK;
    const size_t hi = lo + FF_SUM_BLOCK < e->b ? lo + FF_SUM_BLOCK : e->b;
    double s[FF_SUM_CHAINS] = {0};
    int holder = -1;
    for (int u = e->blk_run[b]; u < e->n_runs && e->runs[u].off < hi; u++) {
        const zero_run *run = &e->runs[u];
        const int o = run->owner;
        if (holder >= 0 && holder != o &&
            ((me == holder && MPI_Send(s, FF_SUM_CHAINS, MPI_DOUBLE, o, ZERO_TAG, comm)) ||
             (me == o &&
              MPI_Recv(s, FF_SUM_CHAINS, MPI_DOUBLE, holder, ZERO_TAG, comm, MPI_STATUS_IGNORE))))
            return ff_set_error(g->ctx, FF_EMPI, "the gradient norm's message over %s failed",
                                ff_group_name(e->grp));
        holder = o;
        const size_t a = run->off > lo ? run->off : lo, end = run->off + run->len;
        if (me == o)
            add_squares(g, lo, a, end < hi ? end : hi, s);
    }
    if (me == holder)
        e->part[b] = ff_sum_chains(s);
    return FF_OK;
}

int ff_gpt_zero_sumsq(ff_gpt *g, int part, double *out)
{
    zero_region *e = &g->zr->reg[part];
    if (e->n_blk == 0)
        return FF_OK;
    for (int64_t b = 0; b < e->n_blk; b++)
        e->part[b] = 0;
    owned_job o = {g, e};
    ff_team_run(g->ctx->team, e->n_blk, 1, owned_sumsq, &o);
    for (int64_t k = 0; k < e->n_strad; k++) {
        int rc = straddling_sumsq(g, e, e->strad[k]);
        if (rc)
            return rc;
    }
    /* each block's sum is on one rank, zeros elsewhere: the sum is exact */
    const int me = ff_group_rank(e->grp);
    if (ff_group_size(e->grp) > 1 &&
        MPI_Reduce(me == 0 ? MPI_IN_PLACE : e->part, e->part, (int)e->n_blk, MPI_DOUBLE, MPI_SUM, 0,
                   ff_group_comm(e->grp)) != MPI_SUCCESS)
        return ff_set_error(g->ctx, FF_EMPI, "MPI_Reduce of the gradient norm's blocks failed");
    for (int64_t b = 0; me == 0 && b < e->n_blk; b++) /* in block order, as the plain pass */
        *out += e->part[b];
    return FF_OK;
}

/* Waits for the gather of range r, if in flight; in bf16-mixed then
 * rounds the range's updated master into the products' copy. Under SAMO
 * the range's staged compressed values go to their places: the weights'
 * (fp32) or the copy's (bf16-mixed; the pruned entries there stay +0). */
static int wait_gather(ff_gpt *g, int r)
{
    ff_gpt_zero *z = g->zr;
    if (!z->gathers[r])
        return FF_OK;
    int rc = ff_wait(&z->gathers[r]);
    const zero_range *q = &z->ranges[r];
    if (q->space) {
        const uint32_t *idx = g->samo_idx;
        for (size_t k = q->off; k < q->off + q->len; k++)
            if (z->stage16)
                g->wbf16[idx[k]] = z->stage16[k];
            else
                g->params[idx[k]] = z->stage[k];
    } else if (g->wbf16 && !z->master) { /* (a sliced master's gather moved the copy itself) */
        ff_bf16_pack(g->wbf16 + q->off, g->params + q->off, q->len);
    }
    return rc;
}

int ff_gpt_zero_params_wait(ff_gpt *g, size_t off, size_t len)
{
    ff_gpt_zero *z = g->zr;
    int rc = FF_OK;
    for (int r = 0; z && z->gathers && r < z->n_ranges; r++) {
        const zero_range *q = &z->ranges[r];
        if (q->f_off < off + len && off < q->f_off + q->f_len) {
            int r2 = wait_gather(g, r);
            rc = rc ? rc : r2;
        }
    }
    return rc;
}

int ff_gpt_zero_params_settle(ff_gpt *g)
{
    ff_gpt_zero *z = g->zr;
    int rc = FF_OK;
    for (int r = 0; z && z->gathers && r < z->n_ranges; r++) {
        int r2 = wait_gather(g, r);
        rc = rc ? rc : r2;
    }
    return rc;
}

/* SAMO: the gathers of the compressed ranges, through the staging vector
 * (the rank's chunk of it the updated values: the weights' in fp32, their
 * bf16 bits from the compressed master in bf16-mixed); in bf16-mixed the
 * copy of the kept entries no range covers (experts without replicas) is
 * rounded at once. */
static int post_samo_gathers(ff_gpt *g)
{
    ff_gpt_zero *z = g->zr;
    const uint32_t *idx = g->samo_idx;
    int rc = FF_OK;
    for (int r = 0; r < z->n_ranges && rc == FF_OK; r++) {
        const zero_range *q = &z->ranges[r];
        if (!q->space)
            continue;
        if (z->stage16) {
            ff_bf16_pack(z->stage16 + q->c_off, g->samo_p + q->c_at, q->c_len);
            rc = ff_iallgather_half16(q->grp, z->stage16 + q->off, q->len, &z->gathers[r]);
        } else {
            for (size_t k = q->c_off; k < q->c_off + q->c_len; k++)
                z->stage[k] = g->params[idx[k]];
            rc = ff_iallreduce_half(q->grp, z->stage + q->off, q->len, 1, NULL, &z->gathers[r]);
        }
    }
    for (int k = 0; z->stage16 && k < z->n_segs[1]; k++) {
        const zero_seg *e = &z->segs[1][k];
        for (size_t i = 0; !e->chunk && i < e->len; i++)
            ff_bf16_pack(g->wbf16 + idx[e->off + i], g->samo_p + e->at + i, 1);
    }
    return rc;
}

/* The gathers of the updated parameters, posted and left in flight: each
 * range is waited for by its first reader (the next forward's gather over
 * Z of a layer in it, through the linear layers' weight hook; everything
 * else settles them all first), so they run beside the next forward as
 * OAG's gathers do. The values are the blocking gather's: a reader waits
 * before it reads. In bf16-mixed the products' copy of a range is rounded
 * when its gather is waited for, the rest of [0, n_zsharded) at once. */
static int post_gathers(ff_gpt *g)
{
    ff_gpt_zero *z = g->zr;
    int rc = g->samo ? post_samo_gathers(g) : FF_OK;
    /* the dense copy's end: under SAMO space 0 holds [0, samo_zc0) of it */
    const size_t zend = g->samo ? g->samo_zc0 : g->n_zsharded;
    if (z->master) { /* the sliced master: its chunks rounded, the copy gathered */
        for (int r = 0; r < z->n_ranges && rc == FF_OK; r++) {
            const zero_range *q = &z->ranges[r];
            if (q->space)
                continue;
            ff_bf16_pack(g->wbf16 + q->c_off, g->params + q->c_at, q->c_len);
            rc = ff_iallgather_half16(q->grp, g->wbf16 + q->off, q->len, &z->gathers[r]);
        }
        for (int k = 0; k < z->n_segs[0] && rc == FF_OK; k++) { /* the whole runs' copy */
            const zero_seg *e = &z->segs[0][k];
            if (!e->chunk && e->off < zend)
                ff_bf16_pack(g->wbf16 + e->off, g->params + e->at,
                             (e->off + e->len < zend ? e->off + e->len : zend) - e->off);
        }
        return rc;
    }
    for (int r = 0; r < z->n_ranges && rc == FF_OK; r++) {
        const zero_range *q = &z->ranges[r];
        if (!q->space)
            rc = ff_iallreduce_half(q->grp, g->params + q->off, q->len, 1, NULL, &z->gathers[r]);
    }
    if (rc != FF_OK || !g->wbf16)
        return rc;
    size_t at = 0; /* the ranges are in offset order and do not overlap */
    for (int r = 0; r <= z->n_ranges; r++) {
        const size_t end = r < z->n_ranges ? z->ranges[r].off : g->n_zsharded;
        if (end > at)
            ff_bf16_pack(g->wbf16 + at, g->params + at, end - at);
        if (r < z->n_ranges)
            at = z->ranges[r].off + z->ranges[r].len;
    }
    return FF_OK;
}

int ff_gpt_zero_adamw(ff_gpt *g, const void *job)
{
    const ff_gpt_zero *z = g->zr;
    const adamw_job *j = job;
    for (int k = 0; k < z->n_segs[0]; k++) {
        const zero_seg *s = &z->segs[0][k];
        const size_t flat = dense_flat(g, s->off); /* (a segment lies on one side of samo_zc0) */
        adamw_job w = *j;
        w.p = j->p + (z->master ? s->at : flat), w.gr = j->gr + s->off;
        w.m = j->m + s->at, w.v = j->v + s->at;
        w.n_decay = j->n_decay > flat ? j->n_decay - flat : 0;
        if (w.n_decay > s->len)
            w.n_decay = s->len;
        ff_gpt_adamw_run(g, &w, (int64_t)s->len);
    }
    for (int k = 0; g->samo && k < z->n_segs[1]; k++) { /* SAMO's compressed entries */
        const zero_seg *s = &z->segs[1][k];
        ff_gpt_samo_adamw(g, j, s->off, s->len, s->at);
    }
    /* a mask is applied to the whole parameters right after AdamW
     * (gpt_optim.c): then the gather is blocking */
    if (!g->mask)
        return post_gathers(g);
    int rc = gather_ranges(g, 0, g->params);
    ff_gpt_bf16_weights(g);
    return rc;
}

/* A sliced buffer of space sp into the positions of the whole `full`, or back. */
static void move_state(const ff_gpt_zero *z, int sp, float *full, float *sliced, int to_full)
{
    for (int k = 0; k < z->n_segs[sp]; k++) {
        const zero_seg *s = &z->segs[sp][k];
        if (to_full)
            memcpy(full + s->off, sliced + s->at, s->len * sizeof(float));
        else
            memcpy(sliced + s->at, full + s->off, s->len * sizeof(float));
    }
}

/* A transfer (ff_gpt_gather, ff_gpt_scatter of the gradients or moments)
 * goes through a full flat buffer. Once the step's gradients are reduced,
 * that is the gradient buffer itself: outside the rank's slices it holds
 * partial sums nothing reads, and the slices (with the whole runs and the
 * rest) wait in a buffer of the state's size until
 * ff_gpt_zero_transfer_end puts them back. So a checkpoint costs 1/Gd of
 * the gradients, not all of them. Before that (during a step's
 * accumulation) the gradients are all needed, and a buffer is allocated. */
int ff_gpt_zero_transfer_begin(ff_gpt *g, ff_gpt_buffer which, int gather, float **out)
{
    ff_gpt_zero *z = g->zr;
    float *full = NULL;
    int rc0 = ff_gpt_zero_params_settle(g);
    if (rc0)
        return rc0;
    z->kept = NULL;
    if (z->reduced)
        z->kept = ff_fbuf_alloc(g->ctx, z->state[0]);
    else
        full = ff_fbuf_alloc(g->ctx, g->n_params);
    int rc = ff_ctx_agree(g->ctx, full || z->kept ? FF_OK
                                                  : ff_set_error(g->ctx, FF_ENOMEM,
                                                                 "out of memory moving ZeRO's "
                                                                 "slices"));
    if (rc) {
        ff_fbuf_free(full), ff_fbuf_free(z->kept);
        z->kept = NULL;
        return rc;
    }
    if (z->kept) {
        move_state(z, 0, g->grads, z->kept, 0);
        full = g->grads;
    }
    float *moments = which == FF_GPT_ADAM_M ? g->adam_m : g->adam_v;
    if (!gather)
        memset(full, 0, g->n_params * sizeof(float));
    else if (which != FF_GPT_GRADS)
        move_state(z, 0, full, moments, 1);
    else if (full != g->grads)
        memcpy(full, g->grads, g->n_params * sizeof(float));
    if (gather)
        rc = ff_ctx_agree(g->ctx, gather_ranges(g, 0, full));
    *out = full;
    return rc;
}

void ff_gpt_zero_transfer_end(ff_gpt *g, ff_gpt_buffer which, float *full, int scattered)
{
    ff_gpt_zero *z = g->zr;
    const int scratch = full == g->grads;
    if (scattered && which == FF_GPT_GRADS) { /* the whole of them: nothing to put back */
        if (!scratch)
            memcpy(g->grads, full, g->n_params * sizeof(float));
    } else {
        if (scattered)
            move_state(z, 0, full, which == FF_GPT_ADAM_M ? g->adam_m : g->adam_v, 0);
        if (scratch)
            move_state(z, 0, g->grads, z->kept, 1);
    }
    if (!scratch)
        ff_fbuf_free(full);
    ff_fbuf_free(z->kept);
    z->kept = NULL;
    if (scratch)
        release_grads(g);
}

void ff_gpt_zero_reduced(ff_gpt *g, int reduced)
{
    if (!g->zr)
        return;
    g->zr->reduced = reduced;
    if (reduced)
        release_grads(g);
}

/* ---- bf16-mixed: the sliced master -------------------------------------------------- */

int ff_gpt_zero_master_sliced(const ff_gpt *g)
{
    return g->zr && g->zr->master && !g->zr->whole && !g->samo; /* (SAMO's: samo.c) */
}

float *ff_gpt_zero_master_at(const ff_gpt *g, float *base, size_t off, size_t n)
{
    const ff_gpt_zero *z = g->zr;
    for (int k = 0; k < z->n_segs[0]; k++) {
        const zero_seg *s = &z->segs[0][k];
        if (off >= s->off && off + n <= s->off + s->len && (n == 0 || !s->chunk))
            return base + s->at + (off - s->off);
    }
    return n == 0 ? base : NULL;
}

int ff_gpt_zero_master_whole(ff_gpt *g)
{
    if (!ff_gpt_zero_master_sliced(g))
        return FF_OK; /* (the same on every rank) */
    ff_gpt_zero *z = g->zr;
    int rc = ff_gpt_zero_params_settle(g);
    /* between steps the gradient buffer holds it (outside the rank's slices
     * it holds partial sums nothing reads; the slices wait aside, as in a
     * transfer): the state's size comes on top, not the parameters' */
    float *full = NULL;
    if (rc == FF_OK && z->reduced)
        z->gkept = ff_fbuf_alloc(g->ctx, z->state[0]);
    else if (rc == FF_OK)
        full = ff_fbuf_alloc(g->ctx, g->n_params);
    const int got = full || z->gkept;
    rc = ff_ctx_agree(g->ctx, rc    ? rc
                              : got ? FF_OK
                                    : ff_set_error(g->ctx, FF_ENOMEM,
                                                   "out of memory for the whole master weights"));
    if (rc) {
        ff_fbuf_free(full), ff_fbuf_free(z->gkept);
        z->gkept = NULL;
        return rc;
    }
    if (z->gkept) {
        move_state(z, 0, g->grads, z->gkept, 0);
        full = g->grads;
    }
    move_state(z, 0, full, g->params, 1);
    rc = ff_ctx_agree(g->ctx, gather_ranges(g, 0, full));
    z->sliced = g->params;
    g->params = full;
    z->whole = 1;
    ff_gpt_bind_views(g);
    return rc;
}

int ff_gpt_zero_master_views(ff_gpt *g)
{
    if (!ff_gpt_zero_master_sliced(g))
        return FF_OK;
    ff_gpt_zero *z = g->zr;
    int rc = ff_ctx_agree(g->ctx, ff_gpt_zero_params_settle(g));
    if (rc)
        return rc;
    /* a buffer of n_params floats to measure offsets in, never read through
     * the views (a transfer reads and writes its own full buffer) */
    z->sliced = g->params;
    g->params = g->grads;
    z->whole = 2;
    ff_gpt_bind_views(g);
    return FF_OK;
}

void ff_gpt_zero_master_slice(ff_gpt *g, int changed)
{
    ff_gpt_zero *z = g->zr;
    if (!z || !z->whole)
        return;
    if (z->whole == 2) { /* (views only) */
        g->params = z->sliced;
        z->sliced = NULL;
        z->whole = 0;
        ff_gpt_bind_views(g);
        return;
    }
    if (changed) /* (the copy from the whole master, before it goes) */
        ff_bf16_pack(g->wbf16, g->params, g->n_zsharded);
    move_state(z, 0, g->params, z->sliced, 0);
    if (z->gkept) { /* the gradient buffer: its slices back */
        move_state(z, 0, g->grads, z->gkept, 1);
        ff_fbuf_free(z->gkept);
        z->gkept = NULL;
        release_grads(g);
    } else {
        ff_fbuf_free(g->params);
    }
    g->params = z->sliced;
    z->sliced = NULL;
    z->whole = 0;
    ff_gpt_bind_views(g);
}

/* ---- SAMO's switch ------------------------------------------------------------------ */

int ff_gpt_zero_unset(ff_gpt *g)
{
    ff_gpt_zero *z = g->zr;
    if (!z)
        return FF_OK;
    int rc = ff_gpt_zero_params_settle(g);
    const int moments = g->adam_m != NULL, master = z->master;
    float *m = moments ? ff_fbuf_alloc(g->ctx, g->n_params) : NULL;
    float *v = moments ? ff_fbuf_alloc(g->ctx, g->n_params) : NULL;
    float *p = master ? ff_fbuf_alloc(g->ctx, g->n_params) : NULL;
    if (rc == FF_OK && ((moments && (!m || !v)) || (master && !p)))
        rc = ff_set_error(g->ctx, FF_ENOMEM, "out of memory for the whole moments (SAMO's switch)");
    if ((rc = ff_ctx_agree(g->ctx, rc))) {
        ff_fbuf_free(m), ff_fbuf_free(v), ff_fbuf_free(p);
        return rc;
    }
    float *whole[3] = {m, v, p}, **sliced[3] = {&g->adam_m, &g->adam_v, &g->params};
    for (int i = 0; i < 3; i++) {
        if (!whole[i])
            continue;
        int r2 = ff_gpt_zero_whole(g, 0, *sliced[i], 1, whole[i]);
        rc = rc ? rc : r2;
        ff_fbuf_free(*sliced[i]);
        *sliced[i] = whole[i];
    }
    z->master = 0;
    ff_gpt_zero_destroy(g);
    ff_gpt_bind_views(g);
    return ff_ctx_agree(g->ctx, rc);
}

int ff_gpt_zero_masked_check(ff_gpt *g)
{
    if (!g->mask || g->samo || g->opt.zero == 0 || g->gd <= 1)
        return FF_OK;
    return ff_set_error(g->ctx, FF_EUNSUPPORTED,
                        "masked training with ZeRO (zero %d) is not supported yet; SAMO is "
                        "(ff_gpt_samo, --samo)",
                        g->opt.zero);
}
