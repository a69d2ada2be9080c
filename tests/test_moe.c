/* The serial mixture-of-experts layer (src/nn/moe.c, issue 27).
 *
 * Without arguments: the routing on cases worked out by hand (choices,
 * capacity per sequence with first choices before second ones, the dropped
 * fraction, the load-balancing loss, a token whose assignments are all
 * dropped leaving the layer as 0) and bad shapes refused.
 * With --dump DIR: writes four random cases (top-1 and top-2, with and
 * without dropping) with their outputs and gradients for
 * tools/moe_oracle.py, which recomputes them in float64 with PyTorch
 * (tests/moe_oracle.sh). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nn/moe.h"
#include "test_util.h"

static ff_ctx *ctx;
static ff_gemm *gemm;

typedef struct {
    ff_moe_shape s;
    int64_t m;
    float *x, *dy, *y, *dx;
    float *par, *grad; /* wr, w1, b1, w2, b2 one after another */
    ff_moe_params p, g;
    int *choice;
} moe_case;

static uint64_t rng = 88172645463325252ull;
static double uniform(void)
{
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (double)(rng >> 11) / 9007199254740992.0;
}
static float normal(float sd)
{
    double u = uniform() + 1e-300, v = uniform();
    return (float)(sd * sqrt(-2 * log(u)) * cos(6.283185307179586 * v));
}

static void views(moe_case *c)
{
    int64_t n[5];
    ff_moe_sizes(&c->s, n);
    float *at[2] = {c->par, c->grad};
    ff_moe_params *v[2] = {&c->p, &c->g};
    for (int i = 0; i < 2; i++) {
        v[i]->wr = at[i];
        v[i]->w1 = v[i]->wr + n[0];
        v[i]->b1 = v[i]->w1 + n[1];
        v[i]->w2 = v[i]->b1 + n[2];
        v[i]->b2 = v[i]->w2 + n[3];
    }
}

static int64_t n_params(const ff_moe_shape *s)
{
    int64_t n[5];
    ff_moe_sizes(s, n);
    return n[0] + n[1] + n[2] + n[3] + n[4];
}

static void case_alloc(moe_case *c, ff_moe_shape s, int64_t m)
{
    c->s = s, c->m = m;
    size_t mc = (size_t)(m * s.C), np = (size_t)n_params(&s);
    c->x = calloc(mc, sizeof(float)), c->dy = calloc(mc, sizeof(float));
    c->y = calloc(mc, sizeof(float)), c->dx = calloc(mc, sizeof(float));
    c->par = calloc(np, sizeof(float)), c->grad = calloc(np, sizeof(float));
    c->choice = calloc((size_t)(m * s.top_k), sizeof(int));
    views(c);
}

static void case_free(moe_case *c)
{
    free(c->x), free(c->dy), free(c->y), free(c->dx), free(c->par), free(c->grad), free(c->choice);
}

/* ---- cases by hand ---- */

/* E = 3, C = 3, the router the identity (wr = I): token t's probabilities
 * are the softmax of its input row, so rows (5, 0, 0) choose expert 0 and
 * (0, 5, 0) expert 1, the second choice the larger of the rest (ties to the
 * lower index). T = 4, top-2, factor 0.75: capacity ceil(0.75 2 4 / 3) = 2
 * per expert and sequence. Sequence 0: tokens choose 0,0,0,1 first, so the
 * third token's first choice (expert 0) is dropped (0 is full after two
 * tokens); second choices: token 0 (5,0,1) -> 2, token 1 (5,1,0) -> 1,
 * token 2 (5,0,0) -> 1 (tie to the lower index), token 3 (0,5,0) -> 0. After
 * the first choices expert 1 holds 1 of 2, so token 1's second choice
 * fills it and token 2's is dropped: token 2 loses both assignments and
 * leaves the layer as 0. Expert 0 is full, so token 3's second choice is
 * dropped too. 3 of 8 assignments dropped. */
static void test_routing(void)
{
    ff_moe_shape s = {.C = 3, .H = 2, .E = 3, .top_k = 2, .factor = 0.75, .aux_coef = 1, .T = 4};
    moe_case c;
    case_alloc(&c, s, 4);
    CHECK(ff_moe_capacity(&s) == 2, "capacity %lld", (long long)ff_moe_capacity(&s));
    const float rows[4][3] = {{5, 0, 1}, {5, 1, 0}, {5, 0, 0}, {0, 5, 0}};
    memcpy(c.x, rows, sizeof rows);
    for (int i = 0; i < 3; i++)
        c.p.wr[i * 3 + i] = 1;
    for (int64_t i = 0; i < 2 * 3 * 2; i++) /* experts: any nonzero weights */
        c.p.w1[i] = 0.1f * (float)(i % 5 + 1), c.p.w2[i] = 0.2f * (float)(i % 3 + 1);
    ff_moe_state *st = NULL;
    int rc = ff_moe_forward(ctx, gemm, &s, &c.p, c.x, 4, c.y, &st);
    CHECK(rc == FF_OK, "forward: %s", ff_ctx_error(ctx));
    if (rc == FF_OK) {
        ff_moe_choices(st, c.choice);
        const int want[8] = {0, 2, 0, 1, -1, -1, 1, -1};
        for (int i = 0; i < 8; i++)
            CHECK(c.choice[i] == want[i], "assignment %d: expert %d, want %d", i, c.choice[i],
                  want[i]);
        CHECK(fabs(ff_moe_dropped(st) - 3.0 / 8) < 1e-12, "dropped %g, want 3/8",
              ff_moe_dropped(st));
        printf("  hand case (E=3, top-2, T=4, capacity 2): assignments %d %d | %d %d | %d %d | "
               "%d %d, dropped %.3f (want 0.375)\n",
               c.choice[0], c.choice[1], c.choice[2], c.choice[3], c.choice[4], c.choice[5],
               c.choice[6], c.choice[7], ff_moe_dropped(st));
        for (int i = 0; i < 3; i++)
            CHECK(c.y[2 * 3 + i] == 0, "token 2 (every assignment dropped) leaves as %g",
                  c.y[2 * 3 + i]);
        /* aux = E sum_e f_e P_e: f = (3/4, 1/4, 0), P the mean probabilities */
        double P[3] = {0}, e5 = exp(5.0), e1 = exp(1.0);
        const double probs[4][3] = {{e5 / (e5 + 1 + e1), 1 / (e5 + 1 + e1), e1 / (e5 + 1 + e1)},
                                    {e5 / (e5 + e1 + 1), e1 / (e5 + e1 + 1), 1 / (e5 + e1 + 1)},
                                    {e5 / (e5 + 2), 1 / (e5 + 2), 1 / (e5 + 2)},
                                    {1 / (e5 + 2), e5 / (e5 + 2), 1 / (e5 + 2)}};
        for (int t = 0; t < 4; t++)
            for (int e = 0; e < 3; e++)
                P[e] += probs[t][e] / 4;
        double aux = 3 * (0.75 * P[0] + 0.25 * P[1]);
        CHECK(fabs(ff_moe_aux_loss(st) - aux) < 1e-6, "aux %.9g, want %.9g", ff_moe_aux_loss(st),
              aux);
        printf("  load-balancing loss %.9g, by hand %.9g (tolerance 1e-6)\n", ff_moe_aux_loss(st),
               aux);
        /* the state reused: the same again; for a wider layer, reallocated */
        float y2[12];
        CHECK(ff_moe_forward(ctx, gemm, &s, &c.p, c.x, 4, y2, &st) == FF_OK &&
                  !memcmp(y2, c.y, sizeof y2),
              "a second forward on the same state differs");
        moe_case w;
        ff_moe_shape sw = s;
        sw.C = 6, sw.H = 12;
        case_alloc(&w, sw, 8);
        CHECK(ff_moe_forward(ctx, gemm, &sw, &w.p, w.x, 8, w.y, &st) == FF_OK,
              "a wider layer on the state: %s", ff_ctx_error(ctx));
        case_free(&w);
    }
    ff_moe_state_free(st);
    st = NULL;
    /* bad shapes and token counts */
    s.top_k = 3;
    CHECK(ff_moe_forward(ctx, gemm, &s, &c.p, c.x, 4, c.y, &st) == FF_EINVAL, "top-3");
    s.top_k = 2, s.factor = 0;
    CHECK(ff_moe_forward(ctx, gemm, &s, &c.p, c.x, 4, c.y, &st) == FF_EINVAL, "factor 0");
    s.factor = 1;
    CHECK(ff_moe_forward(ctx, gemm, &s, &c.p, c.x, 3, c.y, &st) == FF_EINVAL &&
              strstr(ff_ctx_error(ctx), "whole sequences"),
          "3 tokens of sequences of 4: %s", ff_ctx_error(ctx));
    CHECK(ff_moe_forward(ctx, gemm, &s, &c.p, c.x, 0, c.y, &st) == FF_EINVAL, "no tokens");
    /* capacity: 1.1 x 1 x 10 / 1 is 11 (in doubles 11.000000000000002) */
    ff_moe_shape q = {.C = 1, .H = 1, .E = 1, .top_k = 1, .factor = 1.1, .T = 10};
    CHECK(ff_moe_capacity(&q) == 11, "capacity of 1.1 x 10: %lld", (long long)ff_moe_capacity(&q));
    q.factor = 1.15;
    CHECK(ff_moe_capacity(&q) == 12, "capacity of 1.15 x 10: %lld", (long long)ff_moe_capacity(&q));
    ff_moe_state_free(st);
    case_free(&c);
}

/* ---- cases for the oracle ---- */

static int dump(const char *dir, int index, moe_case *c)
{
    char path[4200];
    snprintf(path, sizeof path, "%s/moe_%d.bin", dir, index);
    FILE *f = fopen(path, "wb");
    if (!f)
        return -1;
    int32_t h[6] = {(int32_t)c->s.C, (int32_t)c->s.H, c->s.E,
                    c->s.top_k,      (int32_t)c->s.T, (int32_t)c->m};
    double factor = c->s.factor, coef = c->s.aux_coef;
    size_t mc = (size_t)(c->m * c->s.C), np = (size_t)n_params(&c->s);
    ff_moe_state *st = NULL;
    int rc = ff_moe_forward(ctx, gemm, &c->s, &c->p, c->x, c->m, c->y, &st);
    if (rc == FF_OK) {
        ff_moe_choices(st, c->choice);
        memset(c->grad, 0, np * sizeof(float));
        rc = ff_moe_backward(ctx, gemm, &c->s, &c->p, c->x, c->dy, c->dx, &c->g, st);
    }
    float aux = ff_moe_aux_loss(st);
    double dropped = ff_moe_dropped(st);
    ff_moe_state_free(st);
    int ok = rc == FF_OK && fwrite(h, sizeof h, 1, f) == 1 && fwrite(&factor, 8, 1, f) == 1 &&
             fwrite(&coef, 8, 1, f) == 1 && fwrite(c->x, 4, mc, f) == mc &&
             fwrite(c->par, 4, np, f) == np && fwrite(c->dy, 4, mc, f) == mc &&
             fwrite(c->y, 4, mc, f) == mc && fwrite(&aux, 4, 1, f) == 1 &&
             fwrite(&dropped, 8, 1, f) == 1 &&
             fwrite(c->choice, 4, (size_t)(c->m * c->s.top_k), f) == (size_t)(c->m * c->s.top_k) &&
             fwrite(c->dx, 4, mc, f) == mc && fwrite(c->grad, 4, np, f) == np;
    printf("case %d: top-%d, factor %g: %.1f%% of assignments dropped, aux %.6g\n", index,
           c->s.top_k, c->s.factor, 100 * dropped, aux);
    return fclose(f) == 0 && ok ? 0 : -1;
}

static int dump_cases(const char *dir)
{
    const struct {
        int k;
        double factor;
    } cases[4] = {{1, 1.0}, {2, 1.0}, {1, 100}, {2, 100}};
    for (int i = 0; i < 4; i++) {
        ff_moe_shape s = {.C = 8,
                          .H = 32,
                          .E = 4,
                          .top_k = cases[i].k,
                          .factor = cases[i].factor,
                          .aux_coef = 0.01f,
                          .T = 8};
        moe_case c;
        case_alloc(&c, s, 24);
        for (int64_t e = 0; e < c.m * s.C; e++)
            c.x[e] = normal(1), c.dy[e] = normal(1);
        int64_t n[5];
        ff_moe_sizes(&s, n);
        const float sd[5] = {0.7f, 0.3f, 0.1f, 0.2f, 0.1f};
        float *at[5] = {c.p.wr, c.p.w1, c.p.b1, c.p.w2, c.p.b2};
        for (int t = 0; t < 5; t++)
            for (int64_t e = 0; e < n[t]; e++)
                at[t][e] = normal(sd[t]);
        int rc = dump(dir, i, &c);
        case_free(&c);
        if (rc)
            return rc;
    }
    return 0;
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    if (ff_ctx_create(&ctx, MPI_COMM_WORLD, NULL) != FF_OK ||
        ff_gemm_create(ctx, FF_GEMM_TUNE_OFF, &gemm) != FF_OK) {
        fprintf(stderr, "cannot create a context\n");
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    int code = 0;
    if (argc == 3 && !strcmp(argv[1], "--dump")) {
        code = dump_cases(argv[2]) ? 1 : 0;
        if (code)
            fprintf(stderr, "test_moe: writing the cases failed\n");
    } else {
        test_routing();
        code = test_finish("test_moe");
    }
    ff_gemm_destroy(gemm);
    ff_ctx_destroy(ctx);
    MPI_Finalize();
    return code;
}
