/* The mixture-of-experts feed-forward layer (issue 27, dissertation ch. 7):
 * a router C -> E with a softmax, top-1 or top-2 routing, a capacity per
 * expert and sequence, E expert MLPs of the dense block's shape, and the
 * Switch Transformer's load-balancing loss. Serial for now: every expert on
 * one rank, the foundation the 4D and expert-parallel forms build on.
 *
 * Decisions (docs/moe.md):
 * - Capacity per expert and sequence: ceil(F k T / E) assignments. A
 *   sequence is never split across ranks, so the tokens dropped depend on
 *   the choices of its tokens alone, not on how the grid splits the batch
 *   (the choices are floats' decisions: docs/moe.md, "Routing across
 *   grids"). Within a sequence, every token's first choice is
 *   placed before any second choice (GShard), each in position order.
 * - Gates: top-1 the chosen probability (Switch); top-2 the two
 *   probabilities renormalised to sum to 1 (GShard). A dropped assignment
 *   contributes nothing; a token whose every assignment is dropped leaves
 *   the layer as 0 (the residual carries it).
 * - Load balancing: aux = coef E sum_e f_e P_e over the tokens of the call,
 *   f_e the fraction whose first choice is e (before capacity), P_e the mean
 *   router probability of e. Ties between experts go to the lower index.
 * - Parameters are stored in (in, out) order: router (C, E); expert e's
 *   w1 (C, H), b1 (H), w2 (H, C), b2 (C), the experts one after another. */
#ifndef FF_NN_MOE_H
#define FF_NN_MOE_H

#include <stdint.h>

#include "fourfold/ctx.h"
#include "fourfold/gemm.h"

typedef struct {
    int64_t C, H;  /* hidden width; an expert's inner width (4C in the GPT) */
    int E, top_k;  /* experts; 1 or 2 */
    double factor; /* capacity factor, > 0 */
    float aux_coef;
    int64_t T; /* tokens per sequence: the capacity's unit */
} ff_moe_shape;

/* Views of the parameters or their gradients (see above for the layout). */
typedef struct {
    float *wr, *w1, *b1, *w2, *b2;
} ff_moe_params;

/* Elements of each tensor: wr C E, w1 E C H, b1 E H, w2 E H C, b2 E C. */
void ff_moe_sizes(const ff_moe_shape *s, int64_t sizes[5]);
/* Assignments per expert and sequence. */
int64_t ff_moe_capacity(const ff_moe_shape *s);

typedef struct ff_moe_state ff_moe_state;

/* Checks the shape (FF_EINVAL with one sentence in err otherwise). */
int ff_moe_check(const ff_moe_shape *s, char *err, size_t err_len);

/* y (m, C) = the layer on x (m, C), m a positive multiple of T; keeps what
 * the backward needs in *st (created here, or reused when given again). */
int ff_moe_forward(ff_ctx *ctx, ff_gemm *g, const ff_moe_shape *s, const ff_moe_params *p,
                   const float *x, int64_t m, float *y, ff_moe_state **st);
/* The forward's load-balancing loss (already times aux_coef), the fraction
 * of assignments dropped, and each token's k choices (-1: dropped) if
 * `choice` is not NULL (m k entries). */
float ff_moe_aux_loss(const ff_moe_state *st);
double ff_moe_dropped(const ff_moe_state *st);
void ff_moe_choices(const ff_moe_state *st, int *choice);
/* dx (m, C) = dL/dx for dL/dy = dy and the aux loss added to L with weight
 * 1; the parameters' gradients are added into grad. dx must not alias x or
 * dy (it is zeroed first). */
int ff_moe_backward(ff_ctx *ctx, ff_gemm *g, const ff_moe_shape *s, const ff_moe_params *p,
                    const float *x, const float *dy, float *dx, const ff_moe_params *grad,
                    ff_moe_state *st);
void ff_moe_state_free(ff_moe_state *st);

/* ---- the routing steps, shared with the GPT's MoE blocks (gpt_moe.c) ---- */

enum { FF_MOE_MAX_EXPERTS = 4096 };
/* probs (m, E): the router's logits in, its softmax out; each token's k
 * choices (ties to the lower index) and gates (m k). */
void ff_moe_route(int E, int k, int64_t m, float *probs, int *choice, float *gate);
/* Balanced routing (ff_gpt_opts.balanced_routing): on probs (the softmax,
 * as ff_moe_route leaves it), assignment j of the token at position t of
 * its sequence of T tokens chooses expert (t k + j) mod E; the gates as
 * ff_moe_route forms them from the chosen probabilities. */
void ff_moe_route_balanced(int E, int k, int64_t T, int64_t m, const float *probs, int *choice,
                           float *gate);
/* Capacity `cap` per expert and sequence of T tokens (m a multiple of T):
 * row (m k) the assignment's row in the experts' buffers, -1 dropped;
 * expert e's rows are [start[e], start[e + 1]) (E + 1), in token order;
 * row_token (at most m k) the token of each row. Returns the number
 * dropped. */
int64_t ff_moe_place(int E, int k, int64_t cap, int64_t T, int64_t m, const int *choice,
                     int64_t *row, int64_t *start, int64_t *row_token);
/* dp (m, E) = d loss / d logits, from dgate (m k: d loss / d gate, read
 * only where kept) and the load-balancing loss aux_scale sum_e f_e P_e,
 * f_e the fraction of the n tokens counted whose first choice is e and P_e
 * their mean probability of e: d aux / d p_te = aux_scale f_over_n[e] with
 * f_over_n[e] = f_e / n. */
void ff_moe_gate_backward(int E, int k, int64_t m, const float *probs, const int *choice,
                          const int64_t *row, const float *dgate, const double *f_over_n,
                          double aux_scale, float *dp);

#endif
