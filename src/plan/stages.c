/* The step of a pipeline of stages (docs/planner.md, "Pipeline stages";
 * docs/pipeline.md): each stage's runs timed as the 4D step is, then the
 * schedule of src/nn/gpt_pipe.c played between the stages with the flight
 * of their point-to-point messages; memory per stage. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "plan/plan_internal.h"

/* ---- the schedule ---- */

typedef struct {
    int nf, nb;        /* next forward, next backward */
    int inject;        /* message-driven, first stage: a forward follows a backward */
    int pos;           /* 1F1B: passes done */
    double free_at;    /* the end of the pass it runs */
    double busy;       /* the sum of its passes */
    double last_start; /* the start of the last micro-batch's pass that posts the buckets */
} stage_state;

/* The 1F1B order of stage s (src/nn/gpt_pipe.c, schedule_1f1b): pass i is
 * a forward (1) or a backward (0). */
static int f1b1_is_forward(int P, int M, int K, int s, int i)
{
    if (s == P - 1)
        return 1;
    int warmup = P - s - 1;
    if (warmup > K - 1)
        warmup = K - 1;
    if (warmup > M)
        warmup = M;
    if (i < warmup)
        return 1;
    int j = i - warmup; /* then F B F B ... while forwards remain */
    if (j < 2 * (M - warmup))
        return j % 2 == 0;
    return 0;
}

/* What stage s starts at `now`: 1 a forward, 2 a backward, 0 nothing. */
static int decide(const plan_pipe *pp, const stage_state *st, int s, double now,
                  const double *in_at, const double *grad_at)
{
    const int P = pp->P, M = pp->M, K = pp->K, first = s == 0, last = s == P - 1;
    const stage_state *t = &st[s];
    int can_f = t->nf < M && (first || in_at[(size_t)s * M + t->nf] <= now) && t->nf < t->nb + K;
    int can_b = !last && t->nb < t->nf && grad_at[(size_t)s * M + t->nb] <= now;
    if (pp->schedule == 1) {
        int passes = last ? M : 2 * M;
        if (t->pos >= passes)
            return 0;
        if (f1b1_is_forward(P, M, K, s, t->pos))
            return t->nf < M && (first || in_at[(size_t)s * M + t->nf] <= now) ? 1 : 0;
        return can_b ? 2 : 0;
    }
    if (first && t->inject && can_f)
        return 1;
    return can_b ? 2 : can_f ? 1 : 0;
}

int plan_pipe_simulate(const plan_pipe *pp, double *end, double *busy, double *last_start)
{
    const int P = pp->P, M = pp->M;
    stage_state *st = calloc((size_t)P, sizeof *st);
    double *in_at = malloc((size_t)P * M * sizeof *in_at);
    double *grad_at = malloc((size_t)P * M * sizeof *grad_at);
    int rc = -1;
    if (!st || !in_at || !grad_at)
        goto out;
    for (size_t i = 0; i < (size_t)P * M; i++)
        in_at[i] = grad_at[i] = INFINITY;
    double now = 0;
    for (;;) {
        /* every idle stage starts what it can at `now` */
        int started = 1;
        while (started) {
            started = 0;
            for (int s = 0; s < P; s++) {
                stage_state *t = &st[s];
                if (t->free_at > now)
                    continue;
                int what = decide(pp, st, s, now, in_at, grad_at);
                if (!what)
                    continue;
                int u = what == 1 ? t->nf++ : t->nb++, lm = u == M - 1;
                double d = what == 1 ? pp->fwd[2 * s + lm] : pp->bwd[2 * s + lm];
                double done = now + d;
                t->free_at = done;
                t->busy += d;
                t->pos++;
                if (what == 1 && s == P - 1)
                    t->nb = t->nf; /* the last stage's run holds the backward */
                if (what == 1 && s < P - 1)
                    in_at[(size_t)(s + 1) * M + u] = done + pp->msg_s;
                if ((what == 2 || s == P - 1) && s > 0)
                    grad_at[(size_t)(s - 1) * M + u] = done + pp->msg_s;
                t->inject = what == 2 && s == 0;
                if (lm && (what == 2 || s == P - 1))
                    t->last_start = now;
                started = 1;
            }
        }
        /* the next event: a pass ends or an awaited message arrives */
        double next = INFINITY;
        int running = 0;
        for (int s = 0; s < P; s++) {
            const stage_state *t = &st[s];
            if (t->free_at > now) {
                next = fmin(next, t->free_at);
                running = 1;
                continue;
            }
            if (t->nb >= M)
                continue; /* done */
            if (t->nf < M && s > 0 && in_at[(size_t)s * M + t->nf] > now)
                next = fmin(next, in_at[(size_t)s * M + t->nf]);
            if (t->nb < t->nf && s < P - 1 && grad_at[(size_t)s * M + t->nb] > now)
                next = fmin(next, grad_at[(size_t)s * M + t->nb]);
        }
        if (next == INFINITY) {
            int done = !running;
            for (int s = 0; s < P; s++)
                done &= st[s].nb >= M;
            rc = done ? 0 : -2; /* a schedule that waits forever (a bug) */
            break;
        }
        now = next;
    }
    for (int s = 0; rc == 0 && s < P; s++) {
        end[s] = st[s].free_at;
        busy[s] = st[s].busy;
        last_start[s] = st[s].last_start;
    }
out:
    free(st);
    free(in_at);
    free(grad_at);
    return rc;
}

/* ---- one grid ---- */

/* A point-to-point message of `bytes` on link l. */
static double message_s(const ff_plan_link *l, double bytes)
{
    return l->alpha_s + bytes / l->beta_Bps;
}

void plan_shape_stage(const ff_plan_config *cfg, plan_shape *s, int stage)
{
    const int P = cfg->stages, L = (int)s->L;
    int64_t l0 = 0;
    for (int k = 0; k < stage; k++)
        l0 += cfg->stage_layers ? cfg->stage_layers[k] : L / P + (k < L % P);
    s->P = P, s->stage = stage, s->first = stage == 0, s->last = stage == P - 1;
    s->l0 = l0;
    s->nb = cfg->stage_layers ? cfg->stage_layers[stage] : L / P + (stage < L % P);
    s->slots = cfg->pipe_limit > 0 ? cfg->pipe_limit : P;
}

int plan_fit_stages(const ff_plan_config *cfg, ff_dims g, ff_plan_result *r, plan_shape *base)
{
    const int L = cfg->model.layers;
    int ck_lo = cfg->checkpoint == FF_PLAN_AUTO ? 0 : cfg->checkpoint;
    int ck_hi = cfg->checkpoint == FF_PLAN_AUTO ? 1 : cfg->checkpoint;
    int caches[2] = {g.z == 1 ? 0 : cfg->ag_cache == FF_PLAN_AUTO || cfg->ag_cache >= L ? L : 0, 0};
    int n_caches = cfg->ag_cache == FF_PLAN_AUTO && g.z > 1 ? 2 : 1;
    ff_plan_result worst;
    memset(&worst, 0, sizeof worst);
    for (int ck = ck_lo; ck <= ck_hi; ck++)
        for (int i = 0; i < n_caches; i++) {
            memset(&worst, 0, sizeof worst);
            base->checkpoint = ck;
            base->ag_cache = caches[i];
            for (int k = 0; k < cfg->stages; k++) {
                plan_shape s = *base;
                ff_plan_result m;
                memset(&m, 0, sizeof m);
                plan_shape_stage(cfg, &s, k);
                plan_memory(&s, &m);
                if (m.mem_total > worst.mem_total)
                    worst = m;
            }
            if (worst.mem_total <= cfg->machine.memory_bytes)
                goto done;
        }
done:
    r->mem_params = worst.mem_params;
    r->mem_grads = worst.mem_grads;
    r->mem_optimizer = worst.mem_optimizer;
    r->mem_weight_buffers = worst.mem_weight_buffers;
    r->mem_activations = worst.mem_activations;
    r->mem_total = worst.mem_total;
    r->mem_mask = worst.mem_mask;
    r->checkpoint = base->checkpoint;
    r->ag_cache = base->ag_cache;
    r->micro_batches = base->micro;
    if (r->mem_total > cfg->machine.memory_bytes) {
        plan_reject(r,
                    "needs %.1f GiB per rank on its largest stage%s, more than the %.1f GiB "
                    "available",
                    r->mem_total / PLAN_GIB,
                    base->checkpoint ? " with activation checkpointing" : " without checkpointing",
                    cfg->machine.memory_bytes / PLAN_GIB);
        return 0;
    }
    return 1;
}

/* One stage's pieces played apart: its forward and backward runs (a
 * micro-batch before the last, the last) and its tail, accumulated into
 * acc as many times as the step runs them. */
typedef struct {
    double fwd[2], bwd[2]; /* the runs' ends */
    double bg;             /* the last micro-batch's background work, from its run's start */
    double tail;
} stage_pieces;

static int play_stage(const ff_plan_config *cfg, ff_dims g, const plan_shape *s, plan_ops *ops,
                      const ff_plan_link *link, double rate, ff_plan_result *acc, stage_pieces *out)
{
    const int M = s->micro;
    memset(out, 0, sizeof *out);
    for (int piece = PIECE_FORWARD; piece <= PIECE_TAIL; piece++)
        for (int lm = 0; lm < 2; lm++) {
            if (piece == PIECE_BACKWARD && s->last)
                continue;
            if (piece == PIECE_TAIL && lm)
                continue;
            double weight = piece == PIECE_TAIL ? 1 : lm ? 1 : M - 1, end, bg;
            ops->n = 0;
            ops->tags = 0;
            plan_schedule_piece(s, ops, (plan_piece)piece, lm);
            if (ops->oom || plan_play(cfg, g, ops, link, rate, acc, weight, &end, &bg, NULL))
                return -1;
            /* a run leaves its reduce-scatters in flight (ORS; waited for
             * before the gradients are reduced, src/nn/linear.c), and the
             * last micro-batch's buckets (posted in its backward, on the
             * last stage in its one run) run on into the tail; earlier
             * runs' background work is taken to finish beside later runs */
            if (piece == PIECE_TAIL)
                out->tail = end;
            else if (lm && (piece == PIECE_BACKWARD || s->last))
                out->bg = bg;
            if (piece != PIECE_TAIL)
                (piece == PIECE_FORWARD ? out->fwd : out->bwd)[lm] = end;
        }
    return 0;
}

/* The pipeline's step at the stages' GEMM rates: every stage's pieces
 * (per[k]: its times, accumulated), the schedule, the tails. Fills the
 * step, the busiest stage and the time it spends in runs and tail, and
 * per stage the fraction of the step it spends so (used). -1 if out of
 * memory, -2 if the schedule does not finish. */
typedef struct {
    double step, most;
    int busiest;
} pipe_step;

static int play_pipeline(const ff_plan_config *cfg, ff_dims g, const ff_plan_link *link,
                         const plan_shape *shapes, plan_ops *ops, const double *rate,
                         ff_plan_result *per, stage_pieces *pieces, double *times, pipe_step *out,
                         double *used)
{
    const int P = cfg->stages;
    const ff_plan_link *pl = &link[FF_GROUP_PIPE];
    const plan_shape *base = &shapes[0];
    const double msg = message_s(pl, (double)base->act * (double)(base->m * base->C / g.y));
    const double copy = pl->intra ? (1 - cfg->machine.intra_overlap) * msg : 0; /* the sender's */
    double *fwd = times, *bwd = times + 2 * P, *end = times + 4 * P, *busy = times + 5 * P,
           *last_start = times + 6 * P;
    memset(per, 0, (size_t)P * sizeof *per);
    for (int k = 0; k < P; k++) {
        ops->stage = k;
        if (play_stage(cfg, g, &shapes[k], ops, link, rate[k], &per[k], &pieces[k]))
            return -1;
        for (int lm = 0; lm < 2; lm++) {
            /* a pass that sends a message copies it (over shared memory):
             * every forward run sends an activation or (the last stage's)
             * a gradient, every backward run but the first stage's */
            fwd[2 * k + lm] = pieces[k].fwd[lm] + copy;
            bwd[2 * k + lm] = pieces[k].bwd[lm] + (k > 0 ? copy : 0);
        }
    }
    plan_pipe pp = {.P = P,
                    .M = base->micro,
                    .K = base->slots,
                    .schedule = cfg->schedule,
                    .fwd = fwd,
                    .bwd = bwd,
                    .msg_s = msg};
    int rc = plan_pipe_simulate(&pp, end, busy, last_start);
    if (rc)
        return rc;
    /* the tied embedding's exchange between the first and the last stage */
    const double wte_msg = message_s(
        pl, (double)base->act * (double)(base->Vp * base->C / ((int64_t)g.x * g.y * g.z)));
    memset(out, 0, sizeof *out);
    out->most = -1;
    for (int k = 0; k < P; k++) {
        double ready = fmax(end[k], last_start[k] + pieces[k].bg);
        double tail = pieces[k].tail + (k == 0 || k == P - 1 ? wte_msg : 0);
        out->step = fmax(out->step, ready + tail);
        busy[k] += tail;
        if (busy[k] > out->most)
            out->most = busy[k], out->busiest = k;
    }
    for (int k = 0; k < P; k++)
        used[k] = busy[k] / out->step;
    return 0;
}

/* Where ranks share a node's cores, a stage that waits for a message
 * yields them (mpi_yield_when_idle; src/nn/gpt_pipe.c's polling), so a
 * node's cores are shared by its ranks in proportion to the time each is
 * busy: the ranks of stage k count used[k] (stages fill the ranks in
 * order, stage outermost). A stage on several nodes gets its slowest
 * node's rate. */
static void stage_rates(const ff_profile *p, int G, int P, const double *used, double *rate)
{
    const int world = G * P, rpn = p->ranks_per_node;
    for (int k = 0; k < P; k++)
        rate[k] = INFINITY;
    for (int n0 = 0; n0 < world; n0 += rpn) {
        int n1 = n0 + rpn < world ? n0 + rpn : world;
        double busy = 0;
        for (int r = n0; r < n1; r++)
            busy += used[r / G];
        double node = plan_gemm_rate(p, busy);
        for (int k = n0 / G; k <= (n1 - 1) / G; k++)
            rate[k] = fmin(rate[k], node);
    }
}

int plan_eval_stages(const ff_plan_config *cfg, ff_dims g, ff_plan_result *r, plan_ops *ops,
                     char *err, size_t err_len)
{
    const int P = cfg->stages, G = plan_group_size(g, FF_GROUP_WORLD);
    const ff_profile *mach = &cfg->machine;
    r->stages = P;
    plan_links_staged(mach, g, P, r->link);
    if (P > cfg->model.layers)
        plan_reject(r, "%d stages for %d blocks", P, cfg->model.layers);
    if (plan_check_divides(cfg, g, r))
        return FF_OK;
    plan_shape base;
    plan_shape_init(cfg, g, &base);
    if (!plan_fit_stages(cfg, g, r, &base))
        return FF_OK;

    double *times = calloc((size_t)P * 10, sizeof *times);
    ff_plan_result *per = calloc((size_t)P, sizeof *per);
    plan_shape *shapes = malloc((size_t)P * sizeof *shapes);
    stage_pieces *pieces = calloc((size_t)P, sizeof *pieces);
    int rc = FF_OK, sim = 0;
    if (!times || !per || !shapes || !pieces)
        goto oom;
    double *used = times + 7 * P, *rate = times + 8 * P, *next = times + 9 * P;
    ops->P = P;
    for (int k = 0; k < P; k++) {
        shapes[k] = base;
        plan_shape_stage(cfg, &shapes[k], k);
        used[k] = 1;
    }
    /* The shared cores' rates depend on the time the stages are busy, and
     * that on the rates: from every rank busy, a few rounds settle them
     * (the last round's step is taken). Without sharing, one round. */
    pipe_step ps;
    stage_rates(mach, G, P, used, rate);
    for (int round = 0; round < 8; round++) {
        if ((sim =
                 play_pipeline(cfg, g, r->link, shapes, ops, rate, per, pieces, times, &ps, used)))
            goto oom;
        stage_rates(mach, G, P, used, next);
        double change = 0;
        for (int k = 0; k < P; k++)
            change = fmax(change, fabs(next[k] / rate[k] - 1));
        memcpy(rate, next, (size_t)P * sizeof *rate);
        if (change < 1e-3)
            break;
    }
    /* the busiest stage's times; the traffic of rank 0 (stage 0) */
    const ff_plan_result *b = &per[ps.busiest];
    r->gemm_s = b->gemm_s;
    r->attention_s = b->attention_s;
    r->elementwise_s = b->elementwise_s;
    r->optimizer_s = b->optimizer_s;
    r->comm_s = b->comm_s;
    for (int k = 0; k < FF_PLAN_NGROUPS; k++)
        for (int c = 0; c < FF_NCOLL; c++) {
            r->coll[k][c].time_s = b->coll[k][c].time_s;
            r->coll[k][c].exposed_s = b->coll[k][c].exposed_s;
        }
    r->step_s = ps.step;
    r->bubble_s = fmax(0, ps.step - ps.most);
    r->busiest_stage = ps.busiest;
    r->p2p_s =
        message_s(&r->link[FF_GROUP_PIPE], (double)base.act * (double)(base.m * base.C / g.y));
    plan_finish_times(r, ps.most);
    ops->n = 0;
    ops->tags = 0;
    ops->stage = 0;
    plan_schedule(&shapes[0], ops);
    if (ops->oom || plan_count_traffic(cfg, ops, g, r))
        goto oom;
    goto out;
oom:
    if (sim == -2)
        rc = ff_format_error(err, err_len, FF_EINVAL,
                             "grid %dx%dx%dx%d: the pipeline's schedule did not finish (a bug in "
                             "the planner's simulation)",
                             g.x, g.y, g.z, g.d);
    else
        rc = ff_format_error(err, err_len, FF_ENOMEM, "out of memory planning grid %dx%dx%dx%d",
                             g.x, g.y, g.z, g.d);
out:
    ops->P = 0;
    ops->stage = 0;
    free(times);
    free(per);
    free(shapes);
    free(pieces);
    return rc;
}
