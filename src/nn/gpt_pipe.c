/* Pipeline stages (docs/pipeline.md): a step's micro-batches through the
 * stages of the grid, each stage running the 4D model on its blocks.
 *
 * Micro-batch u uses activation slot u mod K on every stage (K: the
 * pipeline limit, micro-batches in flight per stage). Stage s > 0 receives
 * u's input into the slot's first block input, and stage s < P-1 sends the
 * slot's last block output on; gradients go the other way through the
 * slot's grad_in / grad_out. A receive into a slot is posted once the slot
 * is free (the backward of u - K is done), so the messages of up to K
 * micro-batches can arrive while the stage computes. Backward passes run
 * in micro-batch order on every stage (the last stage runs each backward
 * right after its forward, and messages between two ranks keep their
 * order), so slot u mod K is free when u arrives: the first stage starts
 * u only after the backward of u - K. */
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpt_internal.h"

enum { TAG_ACT = 0, TAG_GRAD = 1 };

static int tag_of(int u, int kind) { return 2 * (u % FF_GPT_TAG_SPAN) + kind; }

typedef struct {
    ff_gpt *g;
    const int32_t *tokens, *targets;
    int M, K;       /* micro-batches, limit */
    int next_fwd;   /* the next micro-batch to run forward on this stage */
    int next_bwd;   /* the next to run backward (not on the last stage) */
    int posted_act; /* receives of inputs posted for micro-batches below this */
    float dscale;
} pipe_run;

static int64_t mc(const ff_gpt *g) { return g->m * g->cy; }

/* ff_gpt_pipeline_order's record */
static void record(ff_gpt *g, int pass)
{
    if (g->pipe_order_n < FF_GPT_PIPE_ORDER_MAX)
        g->pipe_order[g->pipe_order_n] = pass;
    g->pipe_order_n++;
}

/* Posts the input receives of the micro-batches whose slots are free. */
static int post_act_receives(pipe_run *r)
{
    ff_gpt *g = r->g;
    int rc = FF_OK;
    while (rc == FF_OK && g->stage > 0 && r->posted_act < r->M &&
           r->posted_act < r->next_bwd + r->K) {
        int u = r->posted_act++, slot = u % r->K;
        rc = ff_irecv(g->grp_pipe, ff_gpt_resid(g, slot, 0), (size_t)mc(g), g->stage - 1,
                      tag_of(u, TAG_ACT), &g->req_act_in[slot]);
    }
    return rc;
}

/* Micro-batch u's forward on this stage (its input has arrived); the last
 * stage runs its backward too and sends the gradient back. */
static int run_forward(pipe_run *r)
{
    ff_gpt *g = r->g;
    const int u = r->next_fwd++, slot = u % r->K;
    const int64_t off = (int64_t)u * g->m;
    int rc;
    /* the slot's previous output and gradient messages have left */
    if ((rc = ff_wait(&g->req_act_out[slot])) || (rc = ff_wait(&g->req_grad_out[slot])))
        return rc;
    double t0 = ff_now();
    rc = ff_gpt_stage_forward(g, slot, r->tokens + off, r->targets + off, r->dscale, u == r->M - 1);
    g->pipe_busy_s += ff_now() - t0;
    if (rc)
        return rc;
    record(g, u);
    if (g->last)
        record(g, -(u + 1)); /* (its backward ran inside) */
    if (!g->last) {
        if ((rc = ff_isend(g->grp_pipe, ff_gpt_resid(g, slot, g->nb), (size_t)mc(g), g->stage + 1,
                           tag_of(u, TAG_ACT), &g->req_act_out[slot])))
            return rc;
        return ff_irecv(g->grp_pipe, g->grad_in + slot * mc(g), (size_t)mc(g), g->stage + 1,
                        tag_of(u, TAG_GRAD), &g->req_grad_in[slot]);
    }
    r->next_bwd = r->next_fwd;
    if (!g->first && (rc = ff_isend(g->grp_pipe, g->grad_out + slot * mc(g), (size_t)mc(g),
                                    g->stage - 1, tag_of(u, TAG_GRAD), &g->req_grad_out[slot])))
        return rc;
    return post_act_receives(r);
}

/* The backward of micro-batch next_bwd (its gradient has arrived), on a
 * stage other than the last. */
static int run_backward(pipe_run *r)
{
    ff_gpt *g = r->g;
    const int u = r->next_bwd++, slot = u % r->K;
    double t0 = ff_now();
    int rc = ff_gpt_stage_backward(g, slot, r->tokens + (int64_t)u * g->m, u == r->M - 1);
    g->pipe_busy_s += ff_now() - t0;
    if (rc)
        return rc;
    record(g, -(u + 1));
    if (!g->first && (rc = ff_isend(g->grp_pipe, g->grad_out + slot * mc(g), (size_t)mc(g),
                                    g->stage - 1, tag_of(u, TAG_GRAD), &g->req_grad_out[slot])))
        return rc;
    return post_act_receives(r);
}

/* The next forward's input is here (the first stage's always is); the time
 * blocked counts as the stage's idle time. */
static int wait_input(pipe_run *r)
{
    if (r->g->first)
        return FF_OK;
    double t0 = ff_now();
    int rc = ff_wait(&r->g->req_act_in[r->next_fwd % r->K]);
    r->g->pipe_idle_s += ff_now() - t0;
    return rc;
}

static int wait_gradient(pipe_run *r)
{
    double t0 = ff_now();
    int rc = ff_wait(&r->g->req_grad_in[r->next_bwd % r->K]);
    r->g->pipe_idle_s += ff_now() - t0;
    return rc;
}

/* The fixed schedule: `warmup` forwards, then one forward and one backward
 * in turn, then the remaining backwards. */
static int schedule_1f1b(pipe_run *r)
{
    ff_gpt *g = r->g;
    int warmup = g->P - g->stage - 1, rc = FF_OK;
    if (warmup > r->K - 1)
        warmup = r->K - 1;
    if (warmup > r->M)
        warmup = r->M;
    for (int i = 0; i < warmup && rc == FF_OK; i++)
        if ((rc = wait_input(r)) == FF_OK)
            rc = run_forward(r);
    while (rc == FF_OK && r->next_fwd < r->M) {
        if ((rc = wait_input(r)) || (rc = run_forward(r)))
            break;
        if (!g->last && (rc = wait_gradient(r)) == FF_OK)
            rc = run_backward(r);
    }
    while (rc == FF_OK && r->next_bwd < r->M)
        if ((rc = wait_gradient(r)) == FF_OK)
            rc = run_backward(r);
    return rc;
}

/* The ranks of a stage's tensor-parallel group (TP: X, Y and Z) run their
 * layers' collectives together, so they must pick the same pass, though
 * each receives its own messages from its own neighbours. They share what
 * has arrived (the maximum over the group): one rank's gradient of
 * micro-batch v means the next stage's group ran v's backward on all its
 * ranks, so every rank's gradient is on its way, and the same for inputs.
 * A mixture of experts all-reduces its routing statistics over ZD in every
 * forward (gpt_moe.c), so there the whole stage (TP and D) agrees.
 * An all-reduce of three ints per poll, outside the counters: a gradient,
 * an input, and a failure: a rank whose test of a message failed takes part
 * all the same (got[2] = 1), so its group stops with it instead of waiting
 * for it in the next agreement. */
static int agree_arrivals(ff_gpt *g, int got[3], int rc)
{
    ff_group *tp = ff_grid_group(g->grid, g->E ? FF_GROUP_STAGE : FF_GROUP_TP);
    got[2] = rc != FF_OK;
    MPI_Request req;
    int mrc = MPI_SUCCESS;
    if (ff_group_size(tp) > 1 && g->ctx->opt.timeout_s <= 0)
        mrc = MPI_Allreduce(MPI_IN_PLACE, got, 3, MPI_INT, MPI_MAX, ff_group_comm(tp));
    else if (ff_group_size(tp) > 1) { /* under the watchdog, non-blocking */
        mrc = MPI_Iallreduce(MPI_IN_PLACE, got, 3, MPI_INT, MPI_MAX, ff_group_comm(tp), &req);
        if (mrc == MPI_SUCCESS)
            mrc = ff_mpi_complete(g->ctx, &req, "the stage's agreement on its next pass");
    }
    if (mrc != MPI_SUCCESS)
        return ff_ctx_set_error(g->ctx, FF_EMPI, "MPI_Allreduce (the stage's next pass) failed");
    if (got[2] && rc == FF_OK)
        return ff_ctx_set_error(g->ctx, FF_EREMOTE,
                                "another rank of this stage failed to receive a message");
    return rc;
}

/* A message's test, failing on world rank FF_FAULT_PIPE_TEST in its first
 * test (test builds only: FF_TEST_HOOKS). */
static int test_message(ff_gpt *g, ff_request *req, int *done)
{
#ifdef FF_TEST_HOOKS
    static int fired;
    const char *e = getenv("FF_FAULT_PIPE_TEST");
    int world = -1;
    MPI_Comm_rank(MPI_COMM_WORLD, &world);
    if (e && !fired && atoi(e) == world) {
        fired = 1;
        *done = 0;
        return ff_ctx_set_error(g->ctx, FF_EMPI, "a receive failed (FF_FAULT_PIPE_TEST)");
    }
#endif
    (void)g;
    return ff_test(req, done);
}

/* AxoNN's message-driven schedule (dissertation, Algorithm 2): the first
 * stage injects K micro-batches, then every stage runs whatever pass the
 * next message calls for: a forward when an input arrives, a backward when
 * a gradient does (the first stage injects another micro-batch after each
 * backward). When both are there, the backward goes first: it frees a slot. */
static int schedule_message(pipe_run *r)
{
    ff_gpt *g = r->g;
    int rc = FF_OK;
    for (int i = 0; g->first && i < r->K && r->next_fwd < r->M && rc == FF_OK; i++)
        rc = run_forward(r);
    while (rc == FF_OK && r->next_bwd < r->M) {
        ff_request *in = !g->first && r->next_fwd < r->M && r->next_fwd < r->posted_act
                             ? g->req_act_in[r->next_fwd % r->K]
                             : NULL;
        ff_request *grad =
            !g->last && r->next_bwd < r->next_fwd ? g->req_grad_in[r->next_bwd % r->K] : NULL;
        int got[3] = {0, 0, 0}; /* a gradient, an input, a failure */
        double t0 = ff_now();
        while (rc == FF_OK && !got[0] && !got[1]) {
            if (grad)
                rc = test_message(g, grad, &got[0]);
            if (rc == FF_OK && in && !got[0])
                rc = test_message(g, in, &got[1]);
            if ((rc = agree_arrivals(g, got, rc)) == FF_OK && !got[0] && !got[1]) {
                ff_watchdog(g->ctx, t0, "the next micro-batch's message", "PIPE");
                sched_yield();
            }
        }
        g->pipe_idle_s += ff_now() - t0;
        int got_grad = got[0];
        if (rc)
            break;
        if (got_grad) {
            if ((rc = wait_gradient(r)) || (rc = run_backward(r)))
                break;
            if (g->first && r->next_fwd < r->M)
                rc = run_forward(r);
        } else if ((rc = wait_input(r)) == FF_OK) {
            rc = run_forward(r);
        }
    }
    return rc;
}

int ff_gpt_pipeline_run(ff_gpt *g, const int32_t *tokens, const int32_t *targets, int n_micro)
{
    pipe_run r = {.g = g,
                  .tokens = tokens,
                  .targets = targets,
                  .M = n_micro,
                  .K = g->n_slots,
                  .dscale = 1.0f / ((float)n_micro * (float)g->B * (float)g->T)};
    g->pipe_order_n = 0;
    int rc = post_act_receives(&r);
    if (rc == FF_OK)
        rc = g->opt.pipe.schedule == FF_PIPE_1F1B ? schedule_1f1b(&r) : schedule_message(&r);
    /* the last messages of the step have left */
    double t0 = ff_now();
    for (int k = 0; rc == FF_OK && k < g->n_slots; k++)
        if ((rc = ff_wait(&g->req_act_out[k])) == FF_OK)
            rc = ff_wait(&g->req_grad_out[k]);
    g->pipe_idle_s += ff_now() - t0;
    if (rc == FF_OK)
        g->micro_done = n_micro;
    else if (g->P > 1 && rc != FF_EREMOTE) {
        /* the other stages wait for this one's messages and would wait
         * forever (STYLE: MPI_Abort where other ranks could block). The
         * rank whose error it is prints it and aborts the job; its
         * tensor-parallel peers (FF_EREMOTE, from agree_arrivals) return,
         * and the abort ends them */
        fprintf(stderr, "fourfold: error: stage %d, rank %d: %s; the other stages would wait for "
                "its messages: aborting the job\n", g->stage, ff_ctx_rank(g->ctx),
                ff_ctx_error(g->ctx));
        fflush(stderr);
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    return rc;
}

int ff_gpt_pipeline_eval(ff_gpt *g, const int32_t *tokens, const int32_t *targets)
{
    int rc = FF_OK;
    ff_request *req = NULL;
    if (!g->first && ((rc = ff_irecv(g->grp_pipe, ff_gpt_resid(g, 0, 0), (size_t)mc(g),
                                     g->stage - 1, tag_of(0, TAG_ACT), &req)) ||
                      (rc = ff_wait(&req))))
        return rc;
    if ((rc = ff_gpt_eval_forward_stage(g, tokens, targets)) || g->last)
        return rc;
    if ((rc = ff_isend(g->grp_pipe, ff_gpt_resid(g, 0, g->nb), (size_t)mc(g), g->stage + 1,
                       tag_of(0, TAG_ACT), &req)))
        return rc;
    return ff_wait(&req);
}
