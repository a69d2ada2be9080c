/* Ring collectives on point-to-point messages, as explicit state machines.
 *
 * Why our own: libnbc's non-blocking reduce-scatter is a binomial reduce plus
 * a scatter, its all-gather a one-round linear exchange that copies the own
 * block synchronously in the start call (docs/design.md §11),
 * and a library collective cannot tell us what it sent. A ring moves the
 * bandwidth-optimal volume of docs/design.md §3, every byte is counted as it is posted,
 * and each step is small enough for polling to keep it moving.
 *
 * Notation: p ranks, this rank r, right = r+1, left = r-1 (mod p). Data only
 * flows rightwards. Step s of p-1:
 *   all-gather      sends block r-s, receives block r-s-1
 *   reduce-scatter  sends the partial sum of block r-s-1, receives block r-s-2
 *                   and adds its own contribution; block r is complete at r.
 *                   So it reads its send blocks in the order r-1, r-2, ...,
 *                   r, one per step: a fed one (ff_ireduce_scatter_fed)
 *                   waits for the caller to write each before that step
 *   all-reduce      a reduce-scatter over p chunks of the vector, then an
 *                   all-gather of the chunks (2(p-1) steps); either phase
 *                   alone is ff_iallreduce_half (ZeRO over D); the gather
 *                   phase also on 2-byte values, ff_iallgather_half16
 *   all-to-all      pairwise exchange: step s sends to r+s, receives from r-s;
 *                   up to FF_A2A_WINDOW steps are posted at once (below)
 *
 * bf16 wire: values are rounded to bf16 before every send and accumulated in
 * fp32 on receipt; a delivered block is rounded on its owner too, so every
 * replica holds the same bits. */
#include <string.h>

#include "algo.h"

static int mod(long a, long p)
{
    long m = a % p;
    return (int)(m < 0 ? m + p : m);
}

/* Chunk i of a vector of n split into p nearly equal pieces. */
static size_t chunk_off(size_t n, int p, int i)
{
    size_t q = n / (size_t)p, rem = n % (size_t)p;
    return (size_t)i * q + ((size_t)i < rem ? (size_t)i : rem);
}

static size_t chunk_len(size_t n, int p, int i)
{
    return n / (size_t)p + ((size_t)i < n % (size_t)p ? 1 : 0);
}

#define P(req)     ((req)->group->size)
#define R(req)     ((req)->group->rank)
#define RIGHT(req) mod(R(req) + 1, P(req))
#define LEFT(req)  mod(R(req) - 1, P(req))

/* The send is posted before the receive, as in every algorithm (see
 * ff_post_send in internal.h for why). */
static int post_pair(ff_request *req, const void *sbuf, size_t sn, int to, void *rbuf, size_t rn,
                     int from)
{
    int rc = ff_post_send(req, sbuf, sn, to);
    if (rc == FF_OK)
        rc = ff_post_recv(req, rbuf, rn, from);
    return rc;
}

/* ---- all-gather ---- */

static int ag_post_step(ff_request *req)
{
    int p = P(req), r = R(req), s = req->step;
    size_t c = req->count;
    int sb = mod(r - s, p), rb = mod(r - s - 1, p);
    if (req->wire == FF_WIRE_BF16) {
        uint16_t *stage = req->scratch;
        return post_pair(req, stage + (size_t)sb * c, c, RIGHT(req), stage + (size_t)rb * c, c,
                         LEFT(req));
    }
    return post_pair(req, req->recv + (size_t)sb * c, c, RIGHT(req), req->recv + (size_t)rb * c, c,
                     LEFT(req));
}

static int ag_advance(ff_request *req)
{
    int p = P(req), r = R(req);
    size_t c = req->count;
    if (req->wire == FF_WIRE_BF16) { /* unpack the block that just arrived */
        int rb = mod(r - req->step - 1, p);
        ff_bf16_unpack(req->recv + (size_t)rb * c, (uint16_t *)req->scratch + (size_t)rb * c, c);
    }
    if (++req->step == p - 1) {
        req->done = 1;
        return FF_OK;
    }
    return ag_post_step(req);
}

static int ag_start(ff_request *req)
{
    int r = R(req);
    size_t c = req->count;
    float *own = req->recv + (size_t)r * c;
    if (req->wire == FF_WIRE_BF16) {
        int rc = ff_request_scratch(req, (size_t)P(req) * c * sizeof(uint16_t));
        if (rc != FF_OK)
            return rc;
        uint16_t *stage = (uint16_t *)req->scratch + (size_t)r * c;
        ff_bf16_pack(stage, req->send, c);
        ff_bf16_unpack(own, stage, c);
    } else if (req->send != own) {
        memcpy(own, req->send, c * sizeof(float));
    }
    req->advance = ag_advance;
    return ag_post_step(req);
}

/* ---- reduce-scatter ----
 * scratch: a receive buffer and a send buffer of one block each (fp32 or
 * bf16). The receive of step s+1 is posted only after step s completed, so
 * one of each suffices. */

static int rs_post_step(ff_request *req)
{
    int p = P(req), r = R(req), s = req->step;
    size_t c = req->count;
    req->need = s + 2; /* rs_advance of this step reads block r-s-2, the (s+2)-th fed */
    if (req->wire == FF_WIRE_BF16) {
        uint16_t *rbuf = req->scratch, *sbuf = rbuf + c;
        if (s == 0)
            ff_bf16_pack(sbuf, req->send + (size_t)mod(r - 1, p) * c, c);
        return post_pair(req, sbuf, c, RIGHT(req), rbuf, c, LEFT(req));
    }
    float *rbuf = req->scratch, *sbuf = rbuf + c;
    const float *src = s == 0 ? req->send + (size_t)mod(r - 1, p) * c : sbuf;
    return post_pair(req, src, c, RIGHT(req), rbuf, c, LEFT(req));
}

static int rs_advance(ff_request *req)
{
    int p = P(req), r = R(req), s = req->step;
    size_t c = req->count;
    int b = mod(r - s - 2, p); /* the block that arrived */
    const float *mine = req->send + (size_t)b * c;
    int last = s == p - 2;
    if (req->wire == FF_WIRE_BF16) {
        uint16_t *rbuf = req->scratch, *sbuf = rbuf + c;
        if (last) {
            for (size_t i = 0; i < c; i++)
                req->recv[i] = ff_bf16_to_float(rbuf[i]) + mine[i];
        } else {
            for (size_t i = 0; i < c; i++)
                sbuf[i] = ff_bf16_from_float(ff_bf16_to_float(rbuf[i]) + mine[i]);
        }
    } else {
        float *rbuf = req->scratch, *sbuf = rbuf + c;
        float *dst = last ? req->recv : sbuf;
        for (size_t i = 0; i < c; i++)
            dst[i] = rbuf[i] + mine[i];
    }
    if (last) {
        req->done = 1;
        return FF_OK;
    }
    req->step++;
    return rs_post_step(req);
}

/* A fed reduce-scatter's first step, once block r-1 is written. */
static int rs_first(ff_request *req)
{
    req->advance = rs_advance;
    return rs_post_step(req);
}

static int rs_start(ff_request *req)
{
    size_t es = req->wire == FF_WIRE_BF16 ? sizeof(uint16_t) : sizeof(float);
    int rc = ff_request_scratch(req, 2 * req->count * es);
    if (rc != FF_OK)
        return rc;
    if (req->feeding) { /* nothing is posted before the caller feeds block r-1 */
        req->need = 1;
        req->advance = rs_first;
        return FF_OK;
    }
    req->advance = rs_advance;
    return rs_post_step(req);
}

/* ---- all-reduce: reduce-scatter then all-gather over p chunks ----
 * Steps 0..p-2 reduce, p-1..2p-3 gather. scratch: two chunk buffers
 * (fp32: one receive buffer; bf16: send and receive, ping-pong in the
 * gather phase). */

static size_t ar_max_chunk(const ff_request *req) { return chunk_len(req->count, P(req), 0); }

static int ar_post_step(ff_request *req)
{
    int p = P(req), r = R(req), s = req->step;
    size_t n = req->count, mc = ar_max_chunk(req);
    if (s < p - 1) { /* reduce phase; step 0 sends the rank's own contribution */
        int sc = mod(r - 1 - s, p), rc_ = mod(r - 2 - s, p);
        size_t sn = chunk_len(n, p, sc), rn = chunk_len(n, p, rc_);
        const float *src = (s == 0 ? req->send : req->recv) + chunk_off(n, p, sc);
        if (req->wire == FF_WIRE_BF16) {
            uint16_t *sbuf = req->scratch, *rbuf = sbuf + mc;
            if (s == 0)
                ff_bf16_pack(sbuf, src, sn);
            return post_pair(req, sbuf, sn, RIGHT(req), rbuf, rn, LEFT(req));
        }
        return post_pair(req, src, sn, RIGHT(req), req->scratch, rn, LEFT(req));
    }
    int g = s - (p - 1); /* gather phase step */
    int sc = mod(r - g, p), rc_ = mod(r - g - 1, p);
    size_t sn = chunk_len(n, p, sc), rn = chunk_len(n, p, rc_);
    if (req->half == 3) { /* ff_iallgather_half16: 2-byte values in place */
        uint16_t *b16 = (uint16_t *)(void *)req->recv;
        return post_pair(req, b16 + chunk_off(n, p, sc), sn, RIGHT(req), b16 + chunk_off(n, p, rc_),
                         rn, LEFT(req));
    }
    if (req->wire == FF_WIRE_BF16) {
        uint16_t *buf0 = req->scratch, *buf1 = buf0 + mc;
        uint16_t *sbuf = (g % 2) ? buf1 : buf0, *rbuf = (g % 2) ? buf0 : buf1;
        return post_pair(req, sbuf, sn, RIGHT(req), rbuf, rn, LEFT(req));
    }
    return post_pair(req, req->recv + chunk_off(n, p, sc), sn, RIGHT(req),
                     req->recv + chunk_off(n, p, rc_), rn, LEFT(req));
}

static int ar_advance(ff_request *req)
{
    int p = P(req), r = R(req), s = req->step;
    size_t n = req->count, mc = ar_max_chunk(req);
    if (s < p - 1) {
        /* chunk b arrived: recv[b] = incoming partial sum + own contribution
         * (read from send, so an out-of-place call needs no initial copy) */
        int b = mod(r - 2 - s, p);
        size_t len = chunk_len(n, p, b), off = chunk_off(n, p, b);
        float *acc = req->recv + off;
        const float *own = req->send + off;
        if (req->wire == FF_WIRE_BF16) {
            uint16_t *sbuf = req->scratch, *rbuf = sbuf + mc;
            for (size_t i = 0; i < len; i++)
                acc[i] = ff_bf16_to_float(rbuf[i]) + own[i];
            ff_bf16_pack(sbuf, acc, len); /* forward the partial sum next step */
            if (s == p - 2)               /* chunk r is complete: keep it rounded */
                ff_bf16_unpack(acc, sbuf, len);
        } else {
            const float *in = req->scratch;
            for (size_t i = 0; i < len; i++)
                acc[i] = in[i] + own[i];
        }
    } else if (req->wire == FF_WIRE_BF16 && req->half != 3) {
        int g = s - (p - 1), b = mod(r - g - 1, p);
        uint16_t *buf0 = req->scratch, *buf1 = buf0 + mc;
        ff_bf16_unpack(req->recv + chunk_off(n, p, b), (g % 2) ? buf0 : buf1, chunk_len(n, p, b));
    }
    if (++req->step == (req->half == 1 ? p - 1 : 2 * (p - 1))) {
        req->done = 1;
        return FF_OK;
    }
    return ar_post_step(req);
}

static int ar_start(ff_request *req)
{
    size_t mc = ar_max_chunk(req);
    int rc = req->half == 3              ? FF_OK /* (in place, nothing staged) */
             : req->wire == FF_WIRE_BF16 ? ff_request_scratch(req, 2 * mc * sizeof(uint16_t))
                                         : ff_request_scratch(req, mc * sizeof(float));
    if (rc != FF_OK)
        return rc;
    req->advance = ar_advance;
    if (req->half >= 2) /* the gather phase alone: chunk r is this rank's already */
        req->step = P(req) - 1;
    return ar_post_step(req);
}

/* ---- all-to-all: pairwise exchange, up to FF_A2A_WINDOW partners at a time ----
 *
 * Round q exchanges with the partners s = qW+1 .. qW+W (sends to r+s,
 * receives from r-s), all posted at once, so a group of up to W+1 ranks
 * finishes in one round: p-1 dependent steps cost p-1 latencies, which is
 * what made the pairwise exchange 1.3-1.7x slower than the MPI library's
 * one-round exchange at 4-16 KiB (docs/coll-bench.md). The window bounds
 * the requests in flight, as MPICH throttles its all-at-once all-to-all. */

/* Partners per round (the context's FF_A2A_WINDOW setting, at most the
 * compiled-in FF_A2A_WINDOW), rounds, and the most partners of a round
 * (the bf16 staging holds that many blocks each way). */
static int a2a_window(const ff_request *req) { return req->group->ctx->coll->a2a_window; }

static int a2a_rounds(const ff_request *req)
{
    int w = a2a_window(req);
    return (P(req) - 1 + w - 1) / w;
}

static int a2a_width(const ff_request *req)
{
    int w = a2a_window(req);
    return P(req) - 1 < w ? P(req) - 1 : w;
}

static int a2a_post_step(ff_request *req)
{
    int p = P(req), r = R(req), W = a2a_window(req), s0 = req->step * W + 1;
    int w = p - s0 < W ? p - s0 : W, bf16 = req->wire == FF_WIRE_BF16;
    size_t c = req->count;
    /* bf16: staged in scratch, w blocks out, then w in */
    uint16_t *sbuf = bf16 ? req->scratch : NULL;
    uint16_t *rbuf = bf16 ? sbuf + (size_t)a2a_width(req) * c : NULL;
    int rc = FF_OK;
    for (int i = 0; i < w && rc == FF_OK; i++) { /* the sends first */
        int to = mod(r + s0 + i, p);
        const float *src = req->send + (size_t)to * c;
        if (bf16)
            ff_bf16_pack(sbuf + (size_t)i * c, src, c);
        rc = ff_post_send(req, bf16 ? (const void *)(sbuf + (size_t)i * c) : src, c, to);
    }
    for (int i = 0; i < w && rc == FF_OK; i++) {
        int from = mod(r - s0 - i, p);
        rc = ff_post_recv(req, bf16 ? (void *)(rbuf + (size_t)i * c) : req->recv + (size_t)from * c,
                          c, from);
    }
    return rc;
}

static int a2a_advance(ff_request *req)
{
    int p = P(req), r = R(req), W = a2a_window(req), s0 = req->step * W + 1;
    int w = p - s0 < W ? p - s0 : W;
    size_t c = req->count;
    if (req->wire == FF_WIRE_BF16) {
        const uint16_t *rbuf = (const uint16_t *)req->scratch + (size_t)a2a_width(req) * c;
        for (int i = 0; i < w; i++)
            ff_bf16_unpack(req->recv + (size_t)mod(r - s0 - i, p) * c, rbuf + (size_t)i * c, c);
    }
    if (++req->step == a2a_rounds(req)) {
        req->done = 1;
        return FF_OK;
    }
    return a2a_post_step(req);
}

static int a2a_start(ff_request *req)
{
    int r = R(req);
    size_t c = req->count;
    memcpy(req->recv + (size_t)r * c, req->send + (size_t)r * c, c * sizeof(float));
    if (req->wire == FF_WIRE_BF16) {
        ff_bf16_round(req->recv + (size_t)r * c, c);
        /* 2 * min(p-1, window) blocks: at most twice the caller's send
         * buffer in bf16; beyond the context's pool limit it is malloc'd
         * per call */
        int rc = ff_request_scratch(req, 2 * (size_t)a2a_width(req) * c * sizeof(uint16_t));
        if (rc != FF_OK)
            return rc;
    }
    req->advance = a2a_advance;
    return a2a_post_step(req);
}

int ff_ring_start(ff_request *req)
{
    req->step = 0;
    if (req->half) /* ff_iallreduce_half */
        return ar_start(req);
    switch (req->coll) {
    case FF_COLL_ALLGATHER: return ag_start(req);
    case FF_COLL_REDUCE_SCATTER: return rs_start(req);
    case FF_COLL_ALLREDUCE: return ar_start(req);
    case FF_COLL_ALLTOALL: return a2a_start(req);
    default: return ff_set_error(req->group->ctx, FF_EINVAL, "unknown collective");
    }
}

void ff_ring_volume(ff_coll coll, int p, int r, size_t count, size_t *sent, size_t *recv)
{
    size_t n = count;
    if (p <= 1) {
        *sent = *recv = 0;
        return;
    }
    if (coll == FF_COLL_ALLREDUCE) { /* every chunk but one, twice */
        *sent = 2 * n - chunk_len(n, p, r) - chunk_len(n, p, mod(r + 1, p));
        *recv = 2 * n - chunk_len(n, p, mod(r - 1, p)) - chunk_len(n, p, r);
        return;
    }
    *sent = *recv = (size_t)(p - 1) * n; /* p-1 blocks of count */
}

void ff_ring_half_volume(int gather, int p, int r, size_t count, size_t *sent, size_t *recv)
{
    size_t n = count;
    if (p <= 1) {
        *sent = *recv = 0;
        return;
    }
    /* reduce: every chunk but r sent, but r-1 received; gather: every chunk
     * but r+1 sent, but r received (ff_ring_volume's all-reduce is both) */
    *sent = n - chunk_len(n, p, mod(r + gather, p));
    *recv = n - chunk_len(n, p, mod(r - 1 + gather, p));
}
