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
 * them, and [n_zsharded, n_params). A sliced buffer (AdamW's moments now;
 * in bf16-mixed training the fp32 master weights too) holds the segments one
 * after another, ff_gpt_zero_state floats. */
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
} zero_seg;

/* A data-parallel range (dp_range's, with its group) and this rank's chunk
 * of it. */
typedef struct {
    ff_group *grp;
    size_t off, len, c_off, c_len;
} zero_range;

/* A run of [0, n_dense_z) with one owner: the rank of D whose chunk it is
 * (0 where no range covers it: every rank holds it whole). */
typedef struct {
    size_t off, len;
    int owner;
} zero_run;

struct ff_gpt_zero {
    int level;
    zero_range *ranges;
    int n_ranges;
    zero_seg *segs;
    int n_segs;
    size_t state;
    /* the gradient norm: the blocks of FF_SUM_BLOCK of [0, n_dense_z), each
     * block's owner (-1: it straddles owners), the straddling ones, each
     * block's sum of squares */
    zero_run *runs;
    int n_runs;
    int64_t n_blk, n_strad;
    int *blk_owner, *blk_run; /* blk_run: the first run a block touches */
    int64_t *strad;
    double *part;
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
    free(z->ranges), free(z->segs), free(z->runs);
    free(z->blk_owner), free(z->blk_run), free(z->strad), free(z->part);
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
    const char *why = g->P > 1                                  ? "pipeline stages"
                      : g->E > 0                                ? "a mixture of experts"
                      : ff_ctx_cuda(g->ctx)                     ? "a GPU context"
                      : g->opt.linear.coll.wire != FF_WIRE_FP32 ? "the bf16 wire"
                      : g->opt.linear.coll.algo != FF_ALGO_AUTO &&
                              g->opt.linear.coll.algo != FF_ALGO_RING
                          ? "a collective algorithm other than the ring"
                          : NULL;
    return why ? ff_set_error(g->ctx, FF_EUNSUPPORTED,
                              "ZeRO (zero %d) with %s is not supported yet", zero, why)
               : FF_OK;
}

/* The owners of [0, n): the ranges' chunks, whole runs (owner 0) between. */
static int build_runs(ff_gpt_zero *z, size_t n)
{
    size_t cap = 1, at = 0;
    for (int r = 0; r < z->n_ranges; r++)
        cap += (size_t)ff_group_size(z->ranges[r].grp) + 1;
    if (!(z->runs = malloc(cap * sizeof *z->runs)))
        return FF_ENOMEM;
    int k = 0;
    for (int r = 0; r < z->n_ranges; r++) {
        const zero_range *q = &z->ranges[r];
        if (q->off > at)
            z->runs[k++] = (zero_run){at, q->off - at, 0};
        const int p = ff_group_size(q->grp);
        for (int i = 0; i < p; i++)
            if (chunk_len(q->len, p, i))
                z->runs[k++] = (zero_run){q->off + ff_chunk_off(q->len, p, i),
                                          chunk_len(q->len, p, i), i};
        at = q->off + q->len;
    }
    if (n > at)
        z->runs[k++] = (zero_run){at, n - at, 0};
    z->n_runs = k;
    return FF_OK;
}

/* The gradient norm's blocks: whose each is, which straddle. */
static int build_blocks(ff_gpt_zero *z, size_t n)
{
    z->n_blk = (int64_t)((n + FF_SUM_BLOCK - 1) / FF_SUM_BLOCK);
    const size_t nb = (size_t)(z->n_blk ? z->n_blk : 1);
    z->blk_owner = malloc(nb * sizeof(int));
    z->blk_run = malloc(nb * sizeof(int));
    z->part = malloc(nb * sizeof(double));
    z->strad = malloc(nb * sizeof(int64_t));
    if (!z->blk_owner || !z->blk_run || !z->part || !z->strad)
        return FF_ENOMEM;
    for (int64_t b = 0; b < z->n_blk; b++)
        z->blk_owner[b] = -2;
    for (int k = 0; k < z->n_runs; k++) {
        const zero_run *u = &z->runs[k];
        for (size_t b = u->off / FF_SUM_BLOCK; b * FF_SUM_BLOCK < u->off + u->len; b++) {
            if (z->blk_owner[b] == -2)
                z->blk_owner[b] = u->owner, z->blk_run[b] = k;
            else if (z->blk_owner[b] != u->owner)
                z->blk_owner[b] = -1;
        }
    }
    z->n_strad = 0;
    for (int64_t b = 0; b < z->n_blk; b++)
        if (z->blk_owner[b] == -1)
            z->strad[z->n_strad++] = b;
    return FF_OK;
}

/* The state's segments: the chunks, the runs between, the rest. */
static int build_segs(ff_gpt *g, ff_gpt_zero *z, int d)
{
    if (!(z->segs = malloc((size_t)(z->n_runs + 1) * sizeof *z->segs)))
        return FF_ENOMEM;
    int k = 0;
    size_t at = 0;
    for (int i = 0; i < z->n_runs; i++) {
        const zero_run *u = &z->runs[i];
        int covered = 0; /* a range's chunk, not a whole run between ranges */
        for (int r = 0; r < z->n_ranges; r++)
            covered |= u->off >= z->ranges[r].off && u->off < z->ranges[r].off + z->ranges[r].len;
        if (covered && u->owner != d)
            continue;
        z->segs[k++] = (zero_seg){u->off, u->len, at};
        at += u->len;
    }
    if (g->n_params > g->n_zsharded) {
        z->segs[k++] = (zero_seg){g->n_zsharded, g->n_params - g->n_zsharded, at};
        at += g->n_params - g->n_zsharded;
    }
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
    if (!(z->ranges = calloc((size_t)nr, sizeof *z->ranges))) {
        ff_gpt_zero_destroy(g);
        return ff_set_error(g->ctx, FF_ENOMEM, "out of memory for ZeRO's layout");
    }
    /* the ranges plain data parallelism all-reduces over D (without experts:
     * the blocks' buckets and the embedding's) */
    for (int r = 0; r < nr; r++) {
        size_t off, len;
        ff_gpt_dp_range(g, r, &off, &len);
        if (len == 0 || r % 2)
            continue;
        zero_range *q = &z->ranges[z->n_ranges++];
        const int p = g->gd, me = ff_group_rank(g->grp_d);
        *q = (zero_range){g->grp_d, off, len, off + ff_chunk_off(len, p, me), chunk_len(len, p, me)};
    }
    qsort(z->ranges, (size_t)z->n_ranges, sizeof *z->ranges, cmp_range);
    if (build_runs(z, g->n_dense_z) || build_blocks(z, g->n_dense_z) ||
        build_segs(g, z, ff_group_rank(g->grp_d))) {
        ff_gpt_zero_destroy(g);
        return ff_set_error(g->ctx, FF_ENOMEM, "out of memory for ZeRO's layout");
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
void ff_gpt_zero_release_grads(ff_gpt *g)
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
static void owned_sumsq(void *arg, int64_t b0, int64_t b1, int th)
{
    (void)th;
    ff_gpt *g = arg;
    ff_gpt_zero *z = g->zr;
    const sumsq_job j = {g->grads, g->n_dense_z, z->part};
    for (int64_t b = b0; b < b1; b++)
        if (z->blk_owner[b] == ff_group_rank(g->grp_d))
            ff_sumsq_block_at(&j, b);
}

/* A block that straddles owners: its running sums (FF_SUM_CHAINS of them,
 * element i to sum (i - start) mod FF_SUM_CHAINS, as ff_sumsq_block_at
 * adds) start on the owner of its first run, pass from owner to owner along
 * the block and end on the last, which adds them pairwise: every addition
 * the plain pass makes, in its order. Blocking messages in the same order
 * on every rank of D. */
enum { ZERO_TAG = 31000 }; /* beyond the collectives' tags (1..30000) */

static int straddling_sumsq(ff_gpt *g, int64_t b)
{
    ff_gpt_zero *z = g->zr;
    const MPI_Comm comm = ff_group_comm(g->grp_d);
    const int me = ff_group_rank(g->grp_d);
    const size_t lo = (size_t)b * FF_SUM_BLOCK;
    const size_t hi = lo + FF_SUM_BLOCK < g->n_dense_z ? lo + FF_SUM_BLOCK : g->n_dense_z;
    double s[FF_SUM_CHAINS] = {0};
    int holder = -1;
    for (int u = z->blk_run[b]; u < z->n_runs && z->runs[u].off < hi; u++) {
        const zero_run *run = &z->runs[u];
        const int o = run->owner;
        if (holder >= 0 && holder != o &&
            ((me == holder && MPI_Send(s, FF_SUM_CHAINS, MPI_DOUBLE, o, ZERO_TAG, comm)) ||
             (me == o && MPI_Recv(s, FF_SUM_CHAINS, MPI_DOUBLE, holder, ZERO_TAG, comm,
                                  MPI_STATUS_IGNORE))))
            return ff_set_error(g->ctx, FF_EMPI, "the gradient norm's message over D failed");
        holder = o;
        const size_t a = run->off > lo ? run->off : lo, e = run->off + run->len;
        for (size_t i = a; me == o && i < (e < hi ? e : hi); i++)
            s[(i - lo) % FF_SUM_CHAINS] += (double)g->grads[i] * g->grads[i];
    }
    if (me == holder)
        z->part[b] = ff_sum_chains(s);
    return FF_OK;
}

int ff_gpt_zero_sumsq(ff_gpt *g, double *out)
{
    ff_gpt_zero *z = g->zr;
    for (int64_t b = 0; b < z->n_blk; b++)
        z->part[b] = 0;
    ff_team_run(g->ctx->team, z->n_blk, 1, owned_sumsq, g);
    for (int64_t k = 0; k < z->n_strad; k++) {
        int rc = straddling_sumsq(g, z->strad[k]);
        if (rc)
            return rc;
    }
    /* each block's sum is on one rank, zeros elsewhere: the sum over D is exact */
    const int d = ff_group_rank(g->grp_d);
    if (MPI_Reduce(d == 0 ? MPI_IN_PLACE : z->part, z->part, (int)z->n_blk, MPI_DOUBLE, MPI_SUM, 0,
                   ff_group_comm(g->grp_d)) != MPI_SUCCESS)
        return ff_set_error(g->ctx, FF_EMPI, "MPI_Reduce of the gradient norm's blocks failed");
    double s = 0; /* in block order, as the plain pass adds them */
    for (int64_t b = 0; d == 0 && b < z->n_blk; b++)
        s += z->part[b];
    *out = s;
    return FF_OK;
}

int ff_gpt_zero_adamw(ff_gpt *g, const void *job)
{
    const ff_gpt_zero *z = g->zr;
    const adamw_job *j = job;
    for (int k = 0; k < z->n_segs; k++) {
        const zero_seg *s = &z->segs[k];
        adamw_job w = *j;
        w.p = j->p + s->off, w.gr = j->gr + s->off;
        w.m = j->m + s->at, w.v = j->v + s->at;
        w.n_decay = j->n_decay > s->off ? j->n_decay - s->off : 0;
        if (w.n_decay > s->len)
            w.n_decay = s->len;
        ff_gpt_adamw_run(g, &w, (int64_t)s->len);
    }
    return gather_ranges(g, g->params);
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

int ff_gpt_zero_expand(ff_gpt *g, ff_gpt_buffer which, float **out)
{
    float *full = ff_fbuf_alloc(g->ctx, g->n_params);
    int rc = ff_ctx_agree(g->ctx, full ? FF_OK
                                       : ff_set_error(g->ctx, FF_ENOMEM,
                                                      "out of memory gathering ZeRO's slices"));
    if (rc == FF_OK) {
        if (which == FF_GPT_GRADS)
            memcpy(full, g->grads, g->n_params * sizeof(float));
        else
            move_state(g->zr, full, which == FF_GPT_ADAM_M ? g->adam_m : g->adam_v, 1);
        rc = ff_ctx_agree(g->ctx, gather_ranges(g, full));
    }
    if (rc)
        ff_fbuf_free(full), full = NULL;
    *out = full;
    return rc;
}

void ff_gpt_zero_compress(ff_gpt *g, ff_gpt_buffer which, const float *full)
{
    if (which == FF_GPT_GRADS)
        memcpy(g->grads, full, g->n_params * sizeof(float));
    else
        move_state(g->zr, (float *)full, which == FF_GPT_ADAM_M ? g->adam_m : g->adam_v, 0);
}
