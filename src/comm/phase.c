/* The phase machine behind the recursive, direct and hierarchical
 * algorithms.
 *
 * An algorithm is a schedule of up to four phases (algo.h), each a ring,
 * recursive or direct all-gather or reduce-scatter over a "view": a list of
 * participants and the element range of each one's block in a shared
 * buffer. The flat recursive and direct algorithms are one or two phases over the whole
 * group; the hierarchical ones chain an inter-node and an intra-node phase
 * over different views of the same buffer. Like ring.c, one step posts at
 * most a send and a receive per peer (two of each in a fold; sends first,
 * see ff_post_send), its local
 * work (adding a received partial sum) runs when the step has completed,
 * and every message is counted by ff_post_send/ff_post_recv as it is posted.
 *
 * Recursive phases, n participants, 2^L <= n < 2^(L+1), rem = n - 2^L
 * (steps 0 .. L+1):
 *   step 0      fold in: among the first 2*rem participants, the even one of
 *               each pair (the extra) sends its block (all-gather) or its
 *               whole vector (reduce-scatter) to the odd one (its partner);
 *   steps 1..L  the 2^L virtual ranks (partners and participants >= 2*rem)
 *               exchange with the virtual rank that differs in one bit:
 *               all-gather doubles a range (bit 0 first), reduce-scatter
 *               halves it (highest bit first) and adds the partner's partial
 *               sums of the half it keeps;
 *   step L+1    fold out: the partner sends the extra its result.
 * Virtual rank v owns participants lo(v) .. lo(v+1)-1, lo(v) = 2v for v <
 * rem and v + rem after: contiguous, so every range is one message.
 * FF_PH_AR_REC has the same steps on the whole vector: the fold in adds the
 * extra's vector into its partner's, each step 1..L exchanges and adds the
 * whole partial sum (bit 0 first), the fold out sends the extra the result.
 *
 * Direct phases (FF_ALGO_DIRECT): ceil((n-1)/width) steps, each a round of
 * up to `width` partners posted at once, as the all-to-all's rounds
 * (ring.c): step q exchanges with the participants at distance d = q*width
 * + 1 .. q*width + width (sends to me+d, receives from me-d). All-gather:
 * block me out to each, their blocks in. Reduce-scatter: block me+d of the
 * input to me+d, and me-d's contribution to block me into tmp; when the
 * round has completed the received blocks are added in order of distance,
 * after the rank's own value. */
#include <stdlib.h>
#include <string.h>

#include "algo.h"

static int mod(long a, long n)
{
    long m = a % n;
    return (int)(m < 0 ? m + n : m);
}

typedef struct {
    int pof2, rem, L;
    int vme; /* this participant's virtual rank, -1 for an extra */
} fold;

static void fold_of(int n, int me, fold *f)
{
    f->pof2 = ff_floor_pow2(n);
    f->rem = n - f->pof2;
    f->L = 0;
    while ((1 << f->L) < f->pof2)
        f->L++;
    if (me < 2 * f->rem)
        f->vme = (me % 2) ? me / 2 : -1;
    else
        f->vme = me - f->rem;
}

/* First participant of virtual rank v (n for v = 2^L). */
static int lo_of(const fold *f, int n, int v)
{
    if (v >= f->pof2)
        return n;
    return v < f->rem ? 2 * v : v + f->rem;
}

/* The participant that acts for virtual rank v. */
static int part_of(const fold *f, int v) { return v < f->rem ? 2 * v + 1 : v + f->rem; }

static int is_direct(const ff_phase *ph)
{
    return ph->kind == FF_PH_AG_DIRECT || ph->kind == FF_PH_RS_DIRECT;
}

/* Partners of a direct phase's busiest step. */
static int direct_width(const ff_phase *ph)
{
    return ph->n - 1 < ph->width ? ph->n - 1 : ph->width;
}

static int phase_steps(const ff_phase *ph)
{
    if (ph->kind == FF_PH_AG_RING || ph->kind == FF_PH_RS_RING)
        return ph->n - 1;
    if (is_direct(ph))
        return ph->n <= 1 ? 0 : (ph->n - 1 + ph->width - 1) / ph->width;
    fold f;
    fold_of(ph->n, ph->me, &f);
    return f.L + 2;
}

static size_t blen(const ff_phase *ph, int i) { return ph->bound[i + 1] - ph->bound[i]; }

size_t ff_phase_max_rs_msg(const ff_phase *ph)
{
    const size_t *b = ph->bound;
    size_t m = 0;
    if (ph->kind == FF_PH_RS_RING || ph->kind == FF_PH_AG_RING || is_direct(ph)) {
        for (int i = 0; i < ph->n; i++)
            if (blen(ph, i) > m)
                m = blen(ph, i);
        /* direct: a step's blocks, received (tmp) or packed for sending
         * (sbuf on the bf16 wire), side by side */
        return is_direct(ph) ? m * (size_t)direct_width(ph) : m;
    }
    fold f;
    fold_of(ph->n, ph->me, &f);
    if (ph->kind == FF_PH_AR_REC || (f.rem > 0 && ph->me < 2 * f.rem)) /* a whole vector */
        return b[ph->n] - b[0];
    for (int st = 1; st <= f.L; st++) { /* both halves of every range */
        int mask = f.pof2 >> st, a = f.vme & ~(2 * mask - 1);
        size_t lower = b[lo_of(&f, ph->n, a + mask)] - b[lo_of(&f, ph->n, a)];
        size_t upper = b[lo_of(&f, ph->n, a + 2 * mask)] - b[lo_of(&f, ph->n, a + mask)];
        if (lower > m)
            m = lower;
        if (upper > m)
            m = upper;
    }
    return m;
}

void ff_phase_owned(const ff_phase *ph, size_t *off, size_t *len)
{
    const size_t *b = ph->bound;
    if (ph->kind == FF_PH_AG_RING || ph->kind == FF_PH_RS_RING || is_direct(ph)) {
        *off = b[ph->me];
        *len = blen(ph, ph->me);
        return;
    }
    fold f;
    fold_of(ph->n, ph->me, &f);
    if (f.vme < 0) {
        *off = b[0];
        *len = 0;
        return;
    }
    *off = b[lo_of(&f, ph->n, f.vme)];
    *len = b[lo_of(&f, ph->n, f.vme + 1)] - *off;
}

ff_sched *ff_sched_new(ff_request *req, size_t n_ints, size_t n_sizes)
{
    /* one block, so that the engine frees it with free(req->state) */
    size_t head = ff_align64(sizeof(ff_sched)), ints = ff_align64(n_ints * sizeof(int));
    char *block = calloc(1, head + ints + n_sizes * sizeof(size_t) + 1);
    if (!block)
        return NULL;
    ff_sched *s = (ff_sched *)(void *)block;
    s->ints = (int *)(void *)(block + head);
    s->sizes = (size_t *)(void *)(block + head + ints);
    req->state = s;
    return s;
}

/* Carves tmp (and sbuf, and a bf16 stage of stage_elems) out of one scratch
 * allocation, after W (w_elems floats, 0 if W is not scratch). */
int ff_sched_carve(ff_request *req, ff_sched *s, size_t w_elems, size_t msg_elems,
                   size_t stage_elems)
{
    size_t es = ff_wire_size(req->wire);
    size_t wb = ff_align64(w_elems * sizeof(float)), tb = ff_align64(msg_elems * es);
    size_t sb = req->wire == FF_WIRE_BF16 ? ff_align64(msg_elems * sizeof(uint16_t)) : 0;
    size_t gb = ff_align64(stage_elems * es);
    int rc = ff_request_scratch(req, wb + tb + sb + gb);
    if (rc != FF_OK)
        return rc;
    char *base = req->scratch;
    if (w_elems)
        s->W = (float *)(void *)base;
    s->tmp = base + wb;
    s->sbuf = sb ? (uint16_t *)(void *)(base + wb + tb) : NULL;
    if (stage_elems)
        s->stage = base + wb + tb + sb;
    return FF_OK;
}

static void *welem(const ff_request *req, void *base, size_t off)
{
    return (char *)base + off * ff_wire_size(req->wire);
}

/* Reduce-scatter messages: partial sums leave from W (packed to bf16 on that
 * wire: this is where a partial sum is rounded) and arrive in tmp. */
static int rs_send(ff_request *req, ff_sched *s, size_t off, size_t len, int peer)
{
    const float *src = (s->in ? s->in : s->W) + off;
    if (req->wire == FF_WIRE_BF16) {
        ff_bf16_pack(s->sbuf, src, len);
        return ff_post_send(req, s->sbuf, len, peer);
    }
    return ff_post_send(req, src, len, peer);
}

static int rs_recv(ff_request *req, ff_sched *s, size_t off, size_t len, int peer, int set)
{
    s->acc_off = off;
    s->acc_len = len;
    s->acc_set = set;
    s->acc_n = 1;
    return ff_post_recv(req, s->tmp, len, peer);
}

/* After a reduce-scatter step: W[range] (+)= tmp (a direct step: += each of
 * its acc_n received blocks, in order). While W is still empty
 * (s->in set), the first addition reads the rank's own values from `in`. A
 * rank's first reduce-scatter step receives into exactly the range it keeps
 * working on (the whole vector for a fold partner, the kept half for a
 * halving step), and only its subranges are read later; the ring phases of
 * the hierarchical algorithms never use `in`. */
static void apply_recv(const ff_request *req, ff_sched *s)
{
    size_t n = s->acc_len;
    if (n == 0)
        return;
    float *w = s->W + (s->acc_off - s->w_base);
    const float *own = s->in ? s->in + s->acc_off : w;
    int m = s->acc_n; /* 1, or a direct round's blocks: added in order, one pass */
    if (req->wire == FF_WIRE_BF16) {
        const uint16_t *t = s->tmp;
        if (s->acc_set)
            ff_bf16_unpack(w, t, n);
        else if (s->round_own)
            for (size_t i = 0; i < n; i++)
                w[i] = ff_bf16_to_float(ff_bf16_from_float(own[i])) + ff_bf16_to_float(t[i]);
        else
            for (size_t i = 0; i < n; i++) {
                float v = own[i];
                for (int k = 0; k < m; k++)
                    v += ff_bf16_to_float(t[(size_t)k * n + i]);
                w[i] = v;
            }
    } else {
        const float *t = s->tmp;
        if (s->acc_set)
            memcpy(w, t, n * sizeof(float));
        else
            for (size_t i = 0; i < n; i++) {
                float v = own[i];
                for (int k = 0; k < m; k++)
                    v += t[(size_t)k * n + i];
                w[i] = v;
            }
    }
    s->acc_len = 0;
    if (!s->acc_set)
        s->in = NULL; /* W is the accumulator from now on */
}

static int post_ring(ff_request *req, ff_sched *s, const ff_phase *ph, int st)
{
    int n = ph->n, me = ph->me, left = ph->peer[mod(me - 1, n)], right = ph->peer[mod(me + 1, n)];
    const size_t *b = ph->bound;
    int rc;
    if (ph->kind == FF_PH_AG_RING) { /* send block me-st, receive me-st-1 */
        int sb = mod(me - st, n), rb = mod(me - st - 1, n);
        rc = ff_post_send(req, welem(req, s->stage, b[sb]), blen(ph, sb), right);
        if (rc == FF_OK)
            rc = ff_post_recv(req, welem(req, s->stage, b[rb]), blen(ph, rb), left);
        return rc;
    }
    /* reduce-scatter: send the partial sum of block me-st-1, receive that
     * of block me-st-2 and add it; block me is complete after n-1 steps */
    int sb = mod(me - st - 1, n), rb = mod(me - st - 2, n);
    rc = rs_send(req, s, b[sb], blen(ph, sb), right);
    if (rc == FF_OK)
        rc = rs_recv(req, s, b[rb], blen(ph, rb), left, 0);
    return rc;
}

static int post_rec_ag(ff_request *req, ff_sched *s, const ff_phase *ph, int st)
{
    int n = ph->n, me = ph->me, rc;
    const size_t *b = ph->bound;
    fold f;
    fold_of(n, me, &f);
    int folded = f.rem > 0 && me < 2 * f.rem;
    if (st == 0) {
        if (!ph->fold_in || !folded)
            return FF_OK;
        if (f.vme < 0)
            return ff_post_send(req, welem(req, s->stage, b[me]), blen(ph, me), ph->peer[me + 1]);
        return ff_post_recv(req, welem(req, s->stage, b[me - 1]), blen(ph, me - 1),
                            ph->peer[me - 1]);
    }
    if (st <= f.L) {
        if (f.vme < 0)
            return FF_OK;
        int mask = 1 << (st - 1);
        int a = f.vme & ~(mask - 1), pv = f.vme ^ mask, pa = pv & ~(mask - 1);
        size_t so = b[lo_of(&f, n, a)], sl = b[lo_of(&f, n, a + mask)] - so;
        size_t ro = b[lo_of(&f, n, pa)], rl = b[lo_of(&f, n, pa + mask)] - ro;
        int peer = ph->peer[part_of(&f, pv)];
        rc = ff_post_send(req, welem(req, s->stage, so), sl, peer);
        if (rc == FF_OK)
            rc = ff_post_recv(req, welem(req, s->stage, ro), rl, peer);
        return rc;
    }
    if (!ph->fold_out || !folded)
        return FF_OK;
    if (f.vme >= 0) { /* partner of extra x = me-1 */
        int x = me - 1, peer = ph->peer[x];
        if (ph->fold_out == 2)
            return ff_post_send(req, welem(req, s->stage, b[0]), b[n] - b[0], peer);
        rc = ff_post_send(req, welem(req, s->stage, b[0]), b[x] - b[0], peer);
        if (rc == FF_OK)
            rc = ff_post_send(req, welem(req, s->stage, b[x + 1]), b[n] - b[x + 1], peer);
        return rc;
    }
    int peer = ph->peer[me + 1];
    if (ph->fold_out == 2)
        return ff_post_recv(req, welem(req, s->stage, b[0]), b[n] - b[0], peer);
    rc = ff_post_recv(req, welem(req, s->stage, b[0]), b[me] - b[0], peer);
    if (rc == FF_OK)
        rc = ff_post_recv(req, welem(req, s->stage, b[me + 1]), b[n] - b[me + 1], peer);
    return rc;
}

/* Step 0 of a reduction's fold: the extra sends its whole vector, its
 * partner adds it. */
static int fold_in_whole(ff_request *req, ff_sched *s, const ff_phase *ph, const fold *f)
{
    int n = ph->n, me = ph->me;
    size_t off = ph->bound[0], len = ph->bound[n] - off;
    if (f->rem == 0 || me >= 2 * f->rem)
        return FF_OK;
    if (f->vme < 0)
        return rs_send(req, s, off, len, ph->peer[me + 1]);
    return rs_recv(req, s, off, len, ph->peer[me - 1], 0);
}

/* The last step of a reduction's fold: the partner sends the extra its
 * result, elements [off, off+len) of W (fp32: received in place). */
static int fold_out_result(ff_request *req, ff_sched *s, const ff_phase *ph, const fold *f,
                           size_t off, size_t len)
{
    int me = ph->me;
    if (f->vme >= 0)
        return rs_send(req, s, off, len, ph->peer[me - 1]);
    if (req->wire == FF_WIRE_FP32)
        return ff_post_recv(req, s->W + off, len, ph->peer[me + 1]);
    return rs_recv(req, s, off, len, ph->peer[me + 1], 1);
}

/* Recursive halving (FF_PH_RS_REC: the kept half shrinks, highest bit
 * first) or doubling on the whole vector (FF_PH_AR_REC: bit 0 first). */
static int post_rec_reduce(ff_request *req, ff_sched *s, const ff_phase *ph, int st)
{
    int n = ph->n, me = ph->me, rc, whole = ph->kind == FF_PH_AR_REC;
    const size_t *b = ph->bound;
    fold f;
    fold_of(n, me, &f);
    int folded = f.rem > 0 && me < 2 * f.rem;
    if (st == 0)
        return fold_in_whole(req, s, ph, &f);
    if (st <= f.L) {
        if (f.vme < 0)
            return FF_OK;
        size_t go = b[0], gl = b[n] - b[0], ko = go, kl = gl;
        int mask = 1 << (st - 1);
        if (!whole) {
            mask = f.pof2 >> st;
            int a = f.vme & ~(2 * mask - 1);
            int keep = (f.vme & mask) ? a + mask : a, give = (f.vme & mask) ? a : a + mask;
            ko = b[lo_of(&f, n, keep)], kl = b[lo_of(&f, n, keep + mask)] - ko;
            go = b[lo_of(&f, n, give)], gl = b[lo_of(&f, n, give + mask)] - go;
        }
        int peer = ph->peer[part_of(&f, f.vme ^ mask)];
        rc = rs_send(req, s, go, gl, peer);
        if (rc == FF_OK)
            rc = rs_recv(req, s, ko, kl, peer, 0);
        return rc;
    }
    if (!ph->fold_out || !folded)
        return FF_OK;
    if (whole)
        return fold_out_result(req, s, ph, &f, b[0], b[n] - b[0]);
    int x = f.vme >= 0 ? me - 1 : me; /* the extra: its block */
    return fold_out_result(req, s, ph, &f, b[x], blen(ph, x));
}

/* A round of a direct phase: the sends first (ff_post_send), then the
 * receives; 2 * width requests at most. */
_Static_assert(FF_REQ_MAX_MPI >= 2 * FF_A2A_WINDOW, "a direct round must fit a request");
static int post_direct(ff_request *req, ff_sched *s, const ff_phase *ph, int st)
{
    int n = ph->n, me = ph->me, d0 = st * ph->width + 1, rc = FF_OK;
    int w = n - d0 < ph->width ? n - d0 : ph->width, bf16 = req->wire == FF_WIRE_BF16;
    const size_t *b = ph->bound;
    size_t mine = blen(ph, me), packed = 0;
    for (int i = 0; i < w && rc == FF_OK; i++) {
        int to = mod(me + d0 + i, n);
        if (ph->kind == FF_PH_AG_DIRECT) {
            rc = ff_post_send(req, welem(req, s->stage, b[me]), mine, ph->peer[to]);
        } else if (bf16) { /* each block packed into its own part of sbuf */
            ff_bf16_pack(s->sbuf + packed, s->din + b[to], blen(ph, to));
            rc = ff_post_send(req, s->sbuf + packed, blen(ph, to), ph->peer[to]);
            packed += blen(ph, to);
        } else {
            rc = ff_post_send(req, s->din + b[to], blen(ph, to), ph->peer[to]);
        }
    }
    for (int i = 0; i < w && rc == FF_OK; i++) {
        int from = mod(me - d0 - i, n);
        if (ph->kind == FF_PH_AG_DIRECT)
            rc = ff_post_recv(req, welem(req, s->stage, b[from]), blen(ph, from), ph->peer[from]);
        else
            rc = ff_post_recv(req, welem(req, s->tmp, (size_t)i * mine), mine, ph->peer[from]);
    }
    if (ph->kind == FF_PH_RS_DIRECT) {
        s->acc_off = b[me];
        s->acc_len = mine;
        s->acc_set = 0;
        s->acc_n = w;
    }
    return rc;
}

static int post_step(ff_request *req, ff_sched *s)
{
    const ff_phase *ph = &s->ph[s->cur];
    switch (ph->kind) {
    case FF_PH_AG_RING:
    case FF_PH_RS_RING: return post_ring(req, s, ph, s->step);
    case FF_PH_AG_REC: return post_rec_ag(req, s, ph, s->step);
    case FF_PH_AG_DIRECT:
    case FF_PH_RS_DIRECT: return post_direct(req, s, ph, s->step);
    default: return post_rec_reduce(req, s, ph, s->step);
    }
}

/* Runs when the step in flight has completed (or, right after the start,
 * when nothing is in flight: step -1). A step that posts nothing (an empty
 * block, a rank sitting out a fold) completes at once: the engine calls
 * this again. */
static int sched_advance(ff_request *req)
{
    ff_sched *s = req->state;
    apply_recv(req, s);
    s->step++;
    while (s->cur < s->nph && s->step >= phase_steps(&s->ph[s->cur])) {
        s->cur++;
        s->step = 0;
        if (s->cur < s->nph && s->before[s->cur]) {
            int rc = s->before[s->cur](req, s);
            if (rc != FF_OK)
                return rc;
        }
    }
    if (s->cur == s->nph) {
        int rc = s->finish ? s->finish(req, s) : FF_OK;
        req->done = rc == FF_OK;
        return rc;
    }
    return post_step(req, s);
}

int ff_sched_run(ff_request *req, ff_sched *s)
{
    req->advance = sched_advance;
    s->cur = 0;
    s->step = -1; /* the engine calls sched_advance at once: step 0 */
    if (s->nph > 0 && s->before[0])
        return s->before[0](req, s);
    return FF_OK;
}
