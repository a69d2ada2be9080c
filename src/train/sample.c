/* Drawing the next token from the model's vocab-parallel logits
 * (include/fourfold/train.h). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "fourfold/rng.h"
#include "fourfold/train.h"
#include "nn/gpt_internal.h"

typedef struct {
    float logit;
    int32_t token;
} scored;

/* Descending logit; ties to the lower token, so the order is total. */
static int by_logit(const void *a, const void *b)
{
    const scored *x = a, *y = b;
    if (x->logit != y->logit)
        return x->logit > y->logit ? -1 : 1;
    return x->token < y->token ? -1 : x->token > y->token;
}

/* One draw from row (V logits): greedy, or softmax(row / temperature) over
 * the top_k, inverted at the uniform u. */
static int32_t draw(const float *row, int64_t V, const ff_sampler *s, double u, scored *work)
{
    if (s->temperature <= 0.0f) {
        int64_t best = 0;
        for (int64_t v = 1; v < V; v++)
            if (row[v] > row[best])
                best = v;
        return (int32_t)best;
    }
    for (int64_t v = 0; v < V; v++)
        work[v] = (scored){row[v], (int32_t)v};
    int64_t k = V;
    if (s->top_k > 0 && s->top_k < V) {
        qsort(work, (size_t)V, sizeof *work, by_logit);
        k = s->top_k;
    }
    double mx = -INFINITY, total = 0;
    for (int64_t i = 0; i < k; i++)
        mx = fmax(mx, work[i].logit);
    for (int64_t i = 0; i < k; i++)
        total += exp((work[i].logit - mx) / s->temperature);
    double target = u * total, acc = 0;
    for (int64_t i = 0; i < k; i++) {
        acc += exp((work[i].logit - mx) / s->temperature);
        if (acc > target)
            return work[i].token;
    }
    return work[k - 1].token;
}

int ff_gpt_sample_next(ff_gpt *g, const int32_t *tokens, int pos, const ff_sampler *s,
                       uint64_t draw_index, int32_t *next)
{
    if (pos < 0 || pos >= g->T)
        return ff_set_error(g->ctx, FF_EINVAL, "sampling position %d outside 0..%d", pos, g->T - 1);
    int first, count;
    ff_gpt_local_sequences(g, &first, &count);
    const int64_t T = g->T, vx = g->vx, Vp = vx * g->gx, V = g->cfg.V;
    /* targets only feed the loss, which is not used */
    int32_t *targets = calloc((size_t)count * (size_t)T, sizeof *targets);
    float *mine = malloc((size_t)count * (size_t)vx * sizeof(float));
    float *all = malloc((size_t)count * (size_t)Vp * sizeof(float));
    float *row = malloc((size_t)Vp * sizeof(float));
    scored *work = malloc((size_t)V * sizeof *work);
    int rc = targets && mine && all && row && work
                 ? FF_OK
                 : ff_set_error(g->ctx, FF_ENOMEM, "out of memory for sampling");
    rc = ff_ctx_agree(g->ctx, rc);
    float loss;
    if (rc == FF_OK)
        rc = ff_gpt_eval(g, tokens, targets, &loss);
    if (rc == FF_OK && g->last) { /* with stages, the last has the logits */
        /* the rank's vocabulary block of each sequence's row `pos`, then all
         * X blocks: all[x][j][0..vx) */
        for (int j = 0; j < count; j++)
            memcpy(mine + (size_t)j * vx, g->logits + ((size_t)j * T + pos) * vx,
                   (size_t)vx * sizeof(float));
        rc = ff_allgather(g->grp_x, mine, all, (size_t)count * vx, NULL);
    }
    for (int j = 0; rc == FF_OK && g->last && j < count; j++) {
        for (int x = 0; x < g->gx; x++)
            memcpy(row + (size_t)x * vx, all + ((size_t)x * count + j) * vx,
                   (size_t)vx * sizeof(float));
        double u = ff_rng_uniform(s->seed, (uint32_t)(first + j), draw_index);
        next[j] = draw(row, V, s, u, work);
    }
    if (rc == FF_OK && g->P > 1 &&
        MPI_Bcast(next, count, MPI_INT32_T, g->P - 1, ff_group_comm(g->grp_pipe)) != MPI_SUCCESS)
        rc = ff_set_error(g->ctx, FF_EMPI, "MPI_Bcast of the drawn tokens to the stages failed");
    free(targets);
    free(mine);
    free(all);
    free(row);
    free(work);
    return rc;
}
