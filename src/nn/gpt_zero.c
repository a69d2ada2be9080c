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
 * ff_gpt_zero_state floats. */
#define _DEFAULT_SOURCE /* madvise */
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "device.h"
#include "gpt_internal.h"
#include "passes.h"
#include "util/team.h"

typedef struct {
    size_t off, len; /* in the flat buffers */
    size_t at;       /* in a sliced buffer */
    int chunk;       /* the rank's chunk of a range (else a whole run) */
} zero_seg;

/* A data-parallel range (dp_range's, with its group) and this rank's chunk
 * of it. */
typedef struct {
    ff_group *grp;
    size_t off, len, c_off, c_len;
    size_t c_at; /* the chunk's place in a sliced buffer */
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
    zero_range *ranges; /* in offset order */
    int n_ranges;
    zero_seg *segs;
    int n_segs;
    size_t state;
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
};

static size_t chunk_len(size_t n, int p, int i)
{
    return ff_chunk_off(n, p, i + 1) - ff_chunk_off(n, p, i);
}

static int cmp_range(const void *a, const void *b)
{
    const zero_range *x = a, *y = b;
    return (x->off > y->off) - (x->off < y->off);
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
    free(z->ranges), free(z->segs), free(z->gathers);
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

/* The owners of a region: the chunks of its group's ranges, whole runs
 * (owner 0) between. */
static int build_runs(const ff_gpt_zero *z, zero_region *e)
{
    size_t cap = 1, at = e->a;
    for (int r = 0; r < z->n_ranges; r++)
        cap += (size_t)ff_group_size(z->ranges[r].grp) + 1;
    if (!(e->runs = malloc(cap * sizeof *e->runs)))
        return FF_ENOMEM;
    int k = 0;
    for (int r = 0; r < z->n_ranges; r++) {
        const zero_range *q = &z->ranges[r];
        if (q->grp != e->grp || q->off + q->len <= e->a || q->off >= e->b)
            continue;
        if (q->off > at)
            e->runs[k++] = (zero_run){at, q->off - at, 0};
        const int p = ff_group_size(q->grp);
        for (int i = 0; i < p; i++) {
            size_t lo = q->off + ff_chunk_off(q->len, p, i), hi = lo + chunk_len(q->len, p, i);
            lo = lo > e->a ? lo : e->a;
            hi = hi < e->b ? hi : e->b;
            if (hi > lo)
                e->runs[k++] = (zero_run){lo, hi - lo, i};
        }
        at = q->off + q->len;
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

static void move_state(const ff_gpt_zero *z, float *full, float *sliced, int to_full);

/* The state's segments: the rank's chunk of each range, whole runs
 * between, the rest. */
static int build_segs(ff_gpt *g, ff_gpt_zero *z)
{
    if (!(z->segs = malloc((size_t)(2 * z->n_ranges + 2) * sizeof *z->segs)))
        return FF_ENOMEM;
    int k = 0;
    size_t at = 0, off = 0;
    for (int r = 0; r < z->n_ranges; r++) {
        zero_range *q = &z->ranges[r];
        if (q->off > off)
            z->segs[k++] = (zero_seg){off, q->off - off, at, 0}, at += q->off - off;
        q->c_at = at;
        if (q->c_len)
            z->segs[k++] = (zero_seg){q->c_off, q->c_len, at, 1}, at += q->c_len;
        off = q->off + q->len;
    }
    if (g->n_params > off)
        z->segs[k++] = (zero_seg){off, g->n_params - off, at, 0}, at += g->n_params - off;
    z->n_segs = k;
    z->state = at;
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
     * EDP (where there are several) */
    for (int r = 0; r < nr; r++) {
        size_t off, len;
        ff_gpt_dp_range(g, r, &off, &len);
        if (len == 0)
            continue;
        zero_range *q = &z->ranges[z->n_ranges++];
        ff_group *grp = r % 2 && r < 2 * g->nb ? g->grp_edp : g->grp_d;
        const int p = ff_group_size(grp), me = ff_group_rank(grp);
        *q = (zero_range){grp, off, len, off + ff_chunk_off(len, p, me), chunk_len(len, p, me), 0};
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
    rc = build_segs(g, z);
    for (int k = 0; k < 2 && rc == FF_OK; k++)
        if ((rc = build_runs(z, &z->reg[k])) == FF_OK)
            rc = build_blocks(&z->reg[k]);
    /* bf16-mixed: the products read the bf16 copy only, so the master is
     * sliced as the moments are (docs/design.md "ZeRO over D") */
    float *sliced = rc == FF_OK && g->wbf16 && !g->samo ? ff_fbuf_alloc(g->ctx, z->state) : NULL;
    if (rc || (g->wbf16 && !g->samo && !sliced)) {
        ff_gpt_zero_destroy(g);
        return ff_set_error(g->ctx, FF_ENOMEM, "out of memory for ZeRO's layout");
    }
    if (sliced) {
        move_state(z, g->params, sliced, 0);
        ff_fbuf_free(g->params);
        g->params = sliced;
        z->master = 1;
        ff_gpt_bind_views(g);
    }
    return FF_OK;
}

size_t ff_gpt_zero_state(const ff_gpt *g) { return g->zr->state; }

int ff_gpt_zero_reduce(ff_gpt *g, ff_group *grp, size_t off, size_t len, ff_request **req)
{
    return ff_iallreduce_half(grp, g->grads + off, len, 0, NULL, req);
}

/* The gather phase of every range over a flat buffer whose chunks are
 * this rank's (blocking). */
static int gather_ranges(ff_gpt *g, float *flat)
{
    ff_gpt_zero *z = g->zr;
    int rc = FF_OK;
    ff_request *req = NULL;
    for (int r = 0; r < z->n_ranges && rc == FF_OK; r++) {
        const zero_range *q = &z->ranges[r];
        if ((rc = ff_iallreduce_half(q->grp, flat + q->off, q->len, 1, NULL, &req)) == FF_OK)
            rc = ff_wait(&req);
    }
    return rc;
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
        for (int k = 0; k < 2; k++) {
            uintptr_t a = (uintptr_t)(g->grads + cut[k][0]), b = (uintptr_t)(g->grads + cut[k][1]);
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

static void owned_sumsq(void *arg, int64_t b0, int64_t b1, int th)
{
    (void)th;
    const owned_job *o = arg;
    const zero_region *e = o->e;
    const sumsq_job j = {o->g->grads + e->a, e->b - e->a, e->part};
    const int me = ff_group_rank(e->grp);
    for (int64_t b = b0; b < b1; b++)
        if (e->blk_owner[b] == me)
            ff_sumsq_block_at(&j, b);
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
        for (size_t i = a; me == o && i < (end < hi ? end : hi); i++)
            s[(i - lo) % FF_SUM_CHAINS] += (double)g->grads[i] * g->grads[i];
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
 * rounds the range's updated master into the products' copy. */
static int wait_gather(ff_gpt *g, int r)
{
    ff_gpt_zero *z = g->zr;
    if (!z->gathers[r])
        return FF_OK;
    int rc = ff_wait(&z->gathers[r]);
    const zero_range *q = &z->ranges[r];
    if (g->wbf16 && !z->master) /* (a sliced master's gather moved the copy itself) */
        ff_bf16_pack(g->wbf16 + q->off, g->params + q->off, q->len);
    return rc;
}

int ff_gpt_zero_params_wait(ff_gpt *g, size_t off, size_t len)
{
    ff_gpt_zero *z = g->zr;
    int rc = FF_OK;
    for (int r = 0; z && z->gathers && r < z->n_ranges; r++) {
        const zero_range *q = &z->ranges[r];
        if (q->off < off + len && off < q->off + q->len) {
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
    int rc = FF_OK;
    if (z->master) { /* the sliced master: its chunks rounded, the copy gathered */
        for (int r = 0; r < z->n_ranges && rc == FF_OK; r++) {
            const zero_range *q = &z->ranges[r];
            ff_bf16_pack(g->wbf16 + q->c_off, g->params + q->c_at, q->c_len);
            rc = ff_iallgather_half16(q->grp, g->wbf16 + q->off, q->len, &z->gathers[r]);
        }
        for (int k = 0; k < z->n_segs && rc == FF_OK; k++) { /* the whole runs' copy */
            const zero_seg *e = &z->segs[k];
            if (!e->chunk && e->off < g->n_zsharded)
                ff_bf16_pack(g->wbf16 + e->off, g->params + e->at,
                             (e->off + e->len < g->n_zsharded ? e->off + e->len : g->n_zsharded) -
                                 e->off);
        }
        return rc;
    }
    for (int r = 0; r < z->n_ranges && rc == FF_OK; r++) {
        const zero_range *q = &z->ranges[r];
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
    for (int k = 0; k < z->n_segs; k++) {
        const zero_seg *s = &z->segs[k];
        adamw_job w = *j;
        w.p = j->p + (z->master ? s->at : s->off), w.gr = j->gr + s->off;
        w.m = j->m + s->at, w.v = j->v + s->at;
        w.n_decay = j->n_decay > s->off ? j->n_decay - s->off : 0;
        if (w.n_decay > s->len)
            w.n_decay = s->len;
        ff_gpt_adamw_run(g, &w, (int64_t)s->len);
    }
    /* a mask is applied to the whole parameters right after AdamW
     * (gpt_optim.c): then the gather is blocking */
    if (!g->mask)
        return post_gathers(g);
    int rc = gather_ranges(g, g->params);
    ff_gpt_bf16_weights(g);
    return rc;
}

/* A sliced buffer into the flat positions of `full`, or back. */
static void move_state(const ff_gpt_zero *z, float *full, float *sliced, int to_full)
{
    for (int k = 0; k < z->n_segs; k++) {
        const zero_seg *s = &z->segs[k];
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
        z->kept = ff_fbuf_alloc(g->ctx, z->state);
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
        move_state(z, g->grads, z->kept, 0);
        full = g->grads;
    }
    float *moments = which == FF_GPT_ADAM_M ? g->adam_m : g->adam_v;
    if (!gather)
        memset(full, 0, g->n_params * sizeof(float));
    else if (which != FF_GPT_GRADS)
        move_state(z, full, moments, 1);
    else if (full != g->grads)
        memcpy(full, g->grads, g->n_params * sizeof(float));
    if (gather)
        rc = ff_ctx_agree(g->ctx, gather_ranges(g, full));
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
            move_state(z, full, which == FF_GPT_ADAM_M ? g->adam_m : g->adam_v, 0);
        if (scratch)
            move_state(z, g->grads, z->kept, 1);
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

int ff_gpt_zero_master_sliced(const ff_gpt *g) { return g->zr && g->zr->master && !g->zr->whole; }

float *ff_gpt_zero_master_at(const ff_gpt *g, float *base, size_t off, size_t n)
{
    const ff_gpt_zero *z = g->zr;
    for (int k = 0; k < z->n_segs; k++) {
        const zero_seg *s = &z->segs[k];
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
        z->gkept = ff_fbuf_alloc(g->ctx, z->state);
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
        move_state(z, g->grads, z->gkept, 0);
        full = g->grads;
    }
    move_state(z, full, g->params, 1);
    rc = ff_ctx_agree(g->ctx, gather_ranges(g, full));
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
    move_state(z, g->params, z->sliced, 0);
    if (z->gkept) { /* the gradient buffer: its slices back */
        move_state(z, g->grads, z->gkept, 1);
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
