/* The 3D parallel linear layer against a serial reference, on every grid of
 * the job's rank count (or the grids named on the command line).
 *
 *   usage: test_linear [all | GxxGyxGzxGd ...] [--combos]
 *
 * Data: canonical weights, biases, inputs and output gradients are drawn from
 * the counter-based RNG (the same on every rank and grid), so every rank can
 * compute the serial reference itself, in double precision.
 *
 * Tolerance, derived from fp32 summation error (Higham, Accuracy and
 * Stability, §3.1): a sum of K products computed in fp32 in any order and
 * grouping, from exact fp32 inputs, is within gamma_K * sum|terms| of the
 * exact value, gamma_K = K u / (1 - K u), u = 2^-24. Each checked element e
 * must satisfy |got - ref| <= gamma_K * (|A||B|)_e, with K the number of
 * terms plus the partial sums the collectives add:
 *   O  = I W + b:        K = k + |R| + 1   (|R| partial sums, then the bias)
 *   dI = dO W^T:         K = n + |C|
 *   dW = sum_rows I^T dO: K = rows + Gz + Gd + micro-batches
 *   db = sum_rows dO:     K = rows + Gz*Gd + micro-batches
 * The test prints the worst |err| / bound it saw (1 = at the bound).
 *
 * Also: shard -> gather round trip is the identity (with an output-column
 * permutation), RNG initialisation gathered to canonical layout equals the
 * RNG evaluated at canonical indices (hence the same on every grid), per-rank
 * byte counters after one forward+backward equal docs/design.md §3's volumes, and a
 * shape the grid does not divide or a use out of program order is refused.
 * With --combos (on one grid): all 16 combinations of OAR, ORS, OAG and AG
 * cache, under activation checkpointing and with every GEMM mode, give
 * bitwise-identical outputs and gradients. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "test_util.h"

#define U32 (1.0 / 16777216.0)

static int world_rank, world_size;
static double worst_ratio;
static long checked_elems;

static double gamma_k(double k) { return k * U32 / (1.0 - k * U32); }

/* uniform in (-1, 1), the same everywhere */
static void fill(float *a, size_t n, uint32_t stream)
{
    for (size_t i = 0; i < n; i++)
        a[i] = (float)(2.0 * ff_rng_uniform(12345, stream, i) - 1.0);
}

static float *falloc(size_t n)
{
    float *p = calloc(n ? n : 1, sizeof(float));
    if (!p) {
        fprintf(stderr, "out of memory\n");
        MPI_Abort(MPI_COMM_WORLD, 3);
    }
    return p;
}

/* ---- a layer under test ------------------------------------------------------ */

typedef struct {
    ff_linear *l;
    ff_linear_sizes sz;
    int64_t k, n;
    ff_linear_kind kind;
    int64_t *perm; /* output permutation, or NULL */
    uint32_t stream;
    ff_weight_layout layout;
    float *w, *b, *dw, *db; /* shard, bias slice, their gradients */
    float *W, *B;           /* canonical (all ranks) */
} layer;

static void layer_alloc(layer *t)
{
    t->sz = ff_linear_local_sizes(t->l);
    t->w = falloc(t->sz.w_shard);
    t->dw = falloc(t->sz.w_shard);
    t->b = falloc(t->sz.bias);
    t->db = falloc(t->sz.bias);
    ff_linear_bind(t->l, t->w, t->sz.bias ? t->b : NULL, t->dw, t->sz.bias ? t->db : NULL);
}

static void layer_free(layer *t)
{
    free(t->w), free(t->dw), free(t->b), free(t->db), free(t->W), free(t->B), free(t->perm);
}

/* W[row][col] of the canonical matrix, stored k x n (KN) or n x k (NK) */
static double wval(const layer *t, int64_t row, int64_t col)
{
    return t->layout == FF_WEIGHT_KN ? t->W[row * t->n + col] : t->W[col * t->k + row];
}

/* columns of the input and output layouts on this rank */
static int64_t in_block(const layer *t, ff_dims c) { return t->kind == FF_LINEAR_N ? c.y : c.x; }
static int64_t out_block(const layer *t, ff_dims c) { return t->kind == FF_LINEAR_N ? c.x : c.y; }
static int64_t out_col(const layer *t, ff_dims c, int64_t j)
{
    int64_t p = out_block(t, c) * t->sz.out_local + j;
    return t->perm ? t->perm[p] : p;
}

/* Compares `got` with `ref` under `bound` (all count elements); prints a
 * failure with the first offending element. */
static void check_close(const char *what, const char *grid, const float *got, const double *ref,
                        const double *bound, size_t count)
{
    double worst = 0;
    size_t worst_i = 0;
    for (size_t i = 0; i < count; i++) {
        double err = fabs((double)got[i] - ref[i]);
        double r = bound[i] > 0 ? err / bound[i] : (err > 0 ? INFINITY : 0);
        if (!(r <= worst)) { /* also catches NaN */
            worst = isnan(r) ? INFINITY : r;
            worst_i = i;
        }
    }
    checked_elems += (long)count;
    if (worst > worst_ratio)
        worst_ratio = worst;
    CHECK(worst <= 1.0,
          "grid %s rank %d %s: element %zu = %.9g, reference %.9g, bound %.3g (%.2fx)", grid,
          world_rank, what, worst_i, count ? got[worst_i] : 0.0, count ? ref[worst_i] : 0.0,
          count ? bound[worst_i] : 0.0, worst);
}

/* ---- the serial reference (double) ------------------------------------------------
 * Values and bounds for the elements this rank holds (out, dI) or for the
 * whole canonical gradient (dW, db). */

static double *dalloc(size_t n)
{
    double *p = calloc(n ? n : 1, sizeof(double));
    if (!p)
        MPI_Abort(MPI_COMM_WORLD, 3);
    return p;
}

typedef struct {
    double *val, *bound;
} refmat;

static void ref_free(refmat *r) { free(r->val), free(r->bound), r->val = r->bound = NULL; }

/* out = I W + b on rows [r0, r0+m) of I (canonical, k columns) and this
 * rank's output columns */
static refmat ref_out(const layer *t, ff_dims c, ff_dims g, const float *I, int64_t r0, int64_t m)
{
    int64_t nl = t->sz.out_local, k = t->k;
    int gr = t->kind == FF_LINEAR_N ? g.y : g.x;
    refmat r = {dalloc((size_t)(m * nl)), dalloc((size_t)(m * nl))};
    double gam = gamma_k((double)(k + gr + 1));
    for (int64_t i = 0; i < m; i++)
        for (int64_t j = 0; j < nl; j++) {
            int64_t col = out_col(t, c, j);
            double sum = 0, a = 0;
            for (int64_t p = 0; p < k; p++) {
                double v = (double)I[(r0 + i) * k + p] * wval(t, p, col);
                sum += v, a += fabs(v);
            }
            if (t->B)
                sum += t->B[col], a += fabs(t->B[col]);
            r.val[i * nl + j] = sum;
            r.bound[i * nl + j] = gam * a;
        }
    return r;
}

/* dI = dO W^T on rows [r0, r0+m) of dO (canonical, n columns, canonical
 * column order) and this rank's input columns */
static refmat ref_din(const layer *t, ff_dims c, ff_dims g, const float *dO, int64_t r0, int64_t m)
{
    int64_t kl = t->sz.in_local, n = t->n;
    int gc = t->kind == FF_LINEAR_N ? g.x : g.y;
    refmat r = {dalloc((size_t)(m * kl)), dalloc((size_t)(m * kl))};
    double gam = gamma_k((double)(n + gc));
    for (int64_t i = 0; i < m; i++)
        for (int64_t j = 0; j < kl; j++) {
            int64_t row = in_block(t, c) * kl + j;
            double sum = 0, a = 0;
            for (int64_t p = 0; p < n; p++) {
                double v = (double)dO[(r0 + i) * n + p] * wval(t, row, p);
                sum += v, a += fabs(v);
            }
            r.val[i * kl + j] = sum;
            r.bound[i * kl + j] = gam * a;
        }
    return r;
}

/* dW = I^T dO (k x n) and db = column sums of dO over all M rows (every
 * micro-batch concatenated) */
static void ref_grads(const layer *t, ff_dims g, const float *I, const float *dO, int64_t M,
                      int micro, refmat *dw, refmat *db)
{
    int64_t k = t->k, n = t->n;
    *dw = (refmat){dalloc((size_t)(k * n)), dalloc((size_t)(k * n))};
    double gam = gamma_k((double)(M + g.z + g.d + micro));
    for (int64_t p = 0; p < k; p++)
        for (int64_t q = 0; q < n; q++) {
            double sum = 0, a = 0;
            for (int64_t i = 0; i < M; i++) {
                double v = (double)I[i * k + p] * dO[i * n + q];
                sum += v, a += fabs(v);
            }
            int64_t at = t->layout == FF_WEIGHT_KN ? p * n + q : q * k + p;
            dw->val[at] = sum;
            dw->bound[at] = gam * a;
        }
    *db = (refmat){dalloc((size_t)n), dalloc((size_t)n)};
    gam = gamma_k((double)(M + g.z * g.d + micro));
    for (int64_t q = 0; q < n; q++) {
        double sum = 0, a = 0;
        for (int64_t i = 0; i < M; i++)
            sum += dO[i * n + q], a += fabs(dO[i * n + q]);
        db->val[q] = sum;
        db->bound[q] = gam * a;
    }
}

/* local slice: rows [r0, r0+m), columns [c0, c0+w) of a (rows x cols) matrix */
static float *slice(const float *A, int64_t cols, int64_t r0, int64_t m, int64_t c0, int64_t w)
{
    float *s = falloc((size_t)(m * w));
    for (int64_t i = 0; i < m; i++)
        memcpy(s + i * w, A + (r0 + i) * cols + c0, (size_t)w * sizeof(float));
    return s;
}

/* local output-gradient slice of dO (M x n) for the output layout */
static float *out_slice(const layer *t, ff_dims c, const float *dO, int64_t r0, int64_t m)
{
    int64_t nl = t->sz.out_local;
    float *s = falloc((size_t)(m * nl));
    for (int64_t i = 0; i < m; i++)
        for (int64_t j = 0; j < nl; j++)
            s[i * nl + j] = dO[(r0 + i) * t->n + out_col(t, c, j)];
    return s;
}

/* Gathers dW and db to canonical layout on rank 0 and checks them there. */
static void check_grads(const layer *t, const char *grid, const char *what, const refmat *dw,
                        const refmat *db)
{
    float *dW = world_rank == 0 ? falloc((size_t)(t->k * t->n)) : NULL;
    float *dB = world_rank == 0 ? falloc((size_t)t->n) : NULL;
    int rc = ff_linear_gather(t->l, t->dw, t->sz.bias ? t->db : NULL, dW, dB, 0);
    CHECK(rc == FF_OK, "grid %s: gather of %s gradients failed", grid, what);
    if (world_rank == 0 && rc == FF_OK) {
        char name[96];
        snprintf(name, sizeof name, "%s dW", what);
        check_close(name, grid, dW, dw->val, dw->bound, (size_t)(t->k * t->n));
        if (t->sz.bias) {
            snprintf(name, sizeof name, "%s db", what);
            check_close(name, grid, dB, db->val, db->bound, (size_t)t->n);
        }
    }
    free(dW);
    free(dB);
}

static int add_layer_as(ff_linear_seq *s, layer *t, const char *name, ff_linear_kind kind,
                        int64_t k, int64_t n, int bias, uint32_t stream, int permute,
                        ff_weight_layout layout)
{
    memset(t, 0, sizeof *t);
    t->k = k, t->n = n, t->kind = kind, t->stream = stream, t->layout = layout;
    if (permute) {
        /* a fixed random permutation of the output columns (Fisher-Yates) */
        t->perm = malloc((size_t)n * sizeof(int64_t));
        for (int64_t j = 0; j < n; j++)
            t->perm[j] = j;
        for (int64_t j = n - 1; j > 0; j--) {
            int64_t i = (int64_t)(ff_rng_uniform(777, 1, (uint64_t)j) * (double)(j + 1));
            int64_t tmp = t->perm[i];
            t->perm[i] = t->perm[j], t->perm[j] = tmp;
        }
    }
    ff_linear_desc d = {name, kind, k, n, bias, layout, t->perm, stream};
    int rc = ff_linear_add(s, &d, &t->l);
    if (rc)
        return rc;
    layer_alloc(t);
    t->W = falloc((size_t)(k * n));
    fill(t->W, (size_t)(k * n), 100 + stream);
    if (bias) {
        t->B = falloc((size_t)n);
        fill(t->B, (size_t)n, 200 + stream);
    }
    return FF_OK;
}

static int add_layer(ff_linear_seq *s, layer *t, const char *name, ff_linear_kind kind, int64_t k,
                     int64_t n, int bias, uint32_t stream, int permute, ff_dims g)
{
    (void)g;
    return add_layer_as(s, t, name, kind, k, n, bias, stream, permute, FF_WEIGHT_KN);
}

/* Scatters the canonical weights, gathers them back (must be the identity),
 * and checks that RNG initialisation is the RNG at canonical indices. */
static void check_shard_roundtrip(layer *t, const char *grid)
{
    int root = world_size - 1; /* not rank 0, to exercise the root argument */
    int rc = ff_linear_scatter(t->l, t->W, t->B, t->w, t->sz.bias ? t->b : NULL, root);
    CHECK(rc == FF_OK, "grid %s: scatter failed", grid);
    float *W = world_rank == root ? falloc((size_t)(t->k * t->n)) : NULL;
    float *B = world_rank == root ? falloc((size_t)t->n) : NULL;
    rc = ff_linear_gather(t->l, t->w, t->sz.bias ? t->b : NULL, W, B, root);
    CHECK(rc == FF_OK, "grid %s: gather failed", grid);
    if (world_rank == root) {
        CHECK(!memcmp(W, t->W, (size_t)(t->k * t->n) * sizeof(float)),
              "grid %s: shard -> gather of %s is not the identity", grid, ff_linear_name(t->l));
        if (t->B)
            CHECK(!memcmp(B, t->B, (size_t)t->n * sizeof(float)),
                  "grid %s: bias shard -> gather of %s is not the identity", grid,
                  ff_linear_name(t->l));
    }
    /* initialisation: the gathered matrix must be the RNG at canonical indices */
    float *w_saved = falloc(t->sz.w_shard), *b_saved = falloc(t->sz.bias);
    memcpy(w_saved, t->w, t->sz.w_shard * sizeof(float));
    memcpy(b_saved, t->b, t->sz.bias * sizeof(float));
    rc = ff_linear_init(t->l, 4242, 0.02f);
    CHECK(rc == FF_OK, "grid %s: init failed", grid);
    rc = ff_linear_gather(t->l, t->w, t->sz.bias ? t->b : NULL, W, B, root);
    CHECK(rc == FF_OK, "grid %s: gather after init failed", grid);
    if (world_rank == root) {
        int64_t bad = 0, first = -1;
        for (int64_t i = 0; i < t->k * t->n; i++)
            if (W[i] != 0.02f * ff_rng_normal(4242, t->stream, (uint64_t)i) && bad++ == 0)
                first = i;
        for (int64_t j = 0; t->B && j < t->n; j++)
            bad += B[j] != 0.0f;
        CHECK(bad == 0,
              "grid %s: initialised %s differs from the RNG at %lld elements (first %lld)", grid,
              ff_linear_name(t->l), (long long)bad, (long long)first);
    }
    memcpy(t->w, w_saved, t->sz.w_shard * sizeof(float));
    memcpy(t->b, b_saved, t->sz.bias * sizeof(float));
    free(w_saved), free(b_saved);
    free(W);
    free(B);
}

/* ---- shapes ------------------------------------------------------------------------ */

static int64_t lcm(int64_t a, int64_t b)
{
    int64_t x = a, y = b;
    while (y)
        x %= y, x ^= y, y ^= x, x ^= y; /* gcd by swapping remainders */
    return a / x * b;
}

typedef struct {
    const char *name;
    ff_grid *grid;
    ff_dims g, c;
    int64_t L;  /* lcm(Gx, Gy) */
    int64_t m;  /* rows per rank */
    int64_t r0; /* first row of this rank */
    int64_t M;  /* rows of the whole batch */
} env;

static void env_rows(env *e, int64_t m)
{
    e->m = m;
    e->M = m * e->g.z * e->g.d;
    e->r0 = (int64_t)(e->c.z + e->g.z * e->c.d) * m;
}

/* Assembles a layout-X or layout-Y activation (this rank's rows and block of
 * columns, replicated over the other group) into the canonical (M x cols)
 * matrix on every rank: each element is contributed by exactly one rank (the
 * replica with coordinate 0), so the sum is exact. */
static float *assemble(const env *e, const float *local, int64_t cols, int64_t cols_local,
                       int64_t col_block, int replica_coord)
{
    float *full = falloc((size_t)(e->M * cols));
    if (replica_coord == 0)
        for (int64_t i = 0; i < e->m; i++)
            memcpy(full + (e->r0 + i) * cols + col_block * cols_local, local + i * cols_local,
                   (size_t)cols_local * sizeof(float));
    MPI_Allreduce(MPI_IN_PLACE, full, (int)(e->M * cols), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    return full;
}

/* ---- one layer alone: N (with a permutation) or T --------------------------------------- */

static void case_single(env *e, ff_linear_kind kind, ff_weight_layout layout)
{
    const char *what = kind == FF_LINEAR_N ? (layout == FF_WEIGHT_KN ? "N layer" : "N layer (NK)")
                                           : (layout == FF_WEIGHT_KN ? "T layer" : "T layer (NK)");
    ff_linear_seq *s;
    int rc = ff_linear_seq_create(e->grid, NULL, &s);
    CHECK(rc == FF_OK, "seq create");
    layer t;
    int64_t k = 5 * e->L * e->g.z, n = 7 * e->L;
    rc = add_layer_as(s, &t, kind == FF_LINEAR_N ? "n1" : "t1", kind, k, n, 1, 1, 1, layout);
    CHECK(rc == FF_OK, "grid %s: add %s: %s", e->name, what, ff_ctx_error(ff_grid_ctx(e->grid)));
    if (rc) {
        ff_linear_seq_destroy(s);
        return;
    }
    check_shard_roundtrip(&t, e->name);
    env_rows(e, 5);
    float *I = falloc((size_t)(e->M * k)), *dO = falloc((size_t)(e->M * n));
    fill(I, (size_t)(e->M * k), 11);
    fill(dO, (size_t)(e->M * n), 12);
    int64_t kl = t.sz.in_local, nl = t.sz.out_local;
    float *inp = slice(I, k, e->r0, e->m, in_block(&t, e->c) * kl, kl);
    float *dout = out_slice(&t, e->c, dO, e->r0, e->m);
    float *out = falloc((size_t)(e->m * nl)), *din = falloc((size_t)(e->m * kl));

    rc = ff_linear_seq_program_standard(s, 0);
    if (!rc)
        rc = ff_linear_seq_begin(s);
    if (!rc)
        rc = ff_linear_forward(t.l, out, inp, e->m);
    if (!rc)
        rc = ff_linear_backward(t.l, din, dout, inp, e->m);
    if (!rc)
        rc = ff_linear_seq_end(s);
    if (!rc)
        rc = ff_linear_seq_allreduce_grads(s);
    CHECK(rc == FF_OK, "grid %s %s: %s", e->name, what, ff_ctx_error(ff_grid_ctx(e->grid)));
    if (rc == FF_OK) {
        char name[64];
        refmat r = ref_out(&t, e->c, e->g, I, e->r0, e->m);
        snprintf(name, sizeof name, "%s out", what);
        check_close(name, e->name, out, r.val, r.bound, (size_t)(e->m * nl));
        ref_free(&r);
        r = ref_din(&t, e->c, e->g, dO, e->r0, e->m);
        snprintf(name, sizeof name, "%s dI", what);
        check_close(name, e->name, din, r.val, r.bound, (size_t)(e->m * kl));
        ref_free(&r);
        refmat dw, db;
        ref_grads(&t, e->g, I, dO, e->M, 1, &dw, &db);
        check_grads(&t, e->name, what, &dw, &db);
        ref_free(&dw), ref_free(&db);
    }
    free(I), free(dO), free(inp), free(dout), free(out), free(din);
    layer_free(&t);
    ff_linear_seq_destroy(s);
}

/* ---- an N -> T pair, two micro-batches ----------------------------------------------------
 * Each layer is checked against a reference computed from the fp32 input it
 * actually received (the other layer's result, assembled), so the per-layer
 * bounds apply exactly. */

static void case_pair(env *e)
{
    ff_linear_seq *s;
    int rc = ff_linear_seq_create(e->grid, NULL, &s);
    CHECK(rc == FF_OK, "seq create");
    layer a, b;
    int64_t k0 = 5 * e->L, h = 3 * e->L * e->g.z, k2 = 7 * e->L;
    rc = add_layer(s, &a, "pairN", FF_LINEAR_N, k0, h, 1, 2, 0, e->g);
    if (!rc)
        rc = add_layer(s, &b, "pairT", FF_LINEAR_T, h, k2, 1, 3, 0, e->g);
    CHECK(rc == FF_OK, "grid %s: add pair: %s", e->name, ff_ctx_error(ff_grid_ctx(e->grid)));
    if (rc) {
        ff_linear_seq_destroy(s);
        return;
    }
    for (layer *t = &a; t; t = t == &a ? &b : NULL) {
        rc = ff_linear_scatter(t->l, t->W, t->B, t->w, t->b, 0);
        CHECK(rc == FF_OK, "scatter");
    }
    /* the T layer's dW by the reduce-scatter collective matmul (its own
     * option, ff_linear_set_options), where its Z-shards are whole rows of
     * its KN block: the same bound (Gz partial sums added in a ring order) */
    ff_layer_opts lo;
    ff_linear_options(b.l, &lo);
    lo.rs_cmm = 1;
    rc = ff_linear_set_options(b.l, &lo);
    CHECK(rc == FF_OK, "set_options");
    const int rs_fits = e->g.z > 1 && b.sz.block_rows % e->g.z == 0;
    rc = ff_linear_seq_program_standard(s, 0);
    CHECK(rc == FF_OK, "program");
    env_rows(e, 4);
    enum { MICRO = 2 };
    int64_t M = e->M, Mall = MICRO * M;
    /* canonical data of both micro-batches, rows concatenated */
    float *I = falloc((size_t)(Mall * k0)), *dY = falloc((size_t)(Mall * k2));
    float *H = falloc((size_t)(Mall * h)), *dH = falloc((size_t)(Mall * h));
    fill(I, (size_t)(Mall * k0), 21);
    fill(dY, (size_t)(Mall * k2), 22);
    int64_t k0l = a.sz.in_local, hl = a.sz.out_local, k2l = b.sz.out_local;
    for (int mb = 0; mb < MICRO && rc == FF_OK; mb++) {
        const float *Imb = I + mb * M * k0, *dYmb = dY + mb * M * k2;
        float *inp = slice(Imb, k0, e->r0, e->m, e->c.y * k0l, k0l);
        float *hid = falloc((size_t)(e->m * hl)), *y = falloc((size_t)(e->m * k2l));
        float *dy = out_slice(&b, e->c, dYmb, e->r0, e->m);
        float *dhid = falloc((size_t)(e->m * hl)), *din = falloc((size_t)(e->m * k0l));
        rc = ff_linear_seq_begin(s);
        if (!rc)
            rc = ff_linear_forward(a.l, hid, inp, e->m);
        if (!rc)
            rc = ff_linear_forward(b.l, y, hid, e->m);
        if (!rc)
            rc = ff_linear_backward(b.l, dhid, dy, hid, e->m);
        if (!rc)
            rc = ff_linear_backward(a.l, din, dhid, inp, e->m);
        if (!rc)
            rc = ff_linear_seq_end(s);
        CHECK(rc == FF_OK, "grid %s pair: %s", e->name, ff_ctx_error(ff_grid_ctx(e->grid)));
        if (rc == FF_OK) {
            /* the hidden activation and its gradient, as the other layer saw them */
            float *Hmb = assemble(e, hid, h, hl, e->c.x, e->c.y);
            float *dHmb = assemble(e, dhid, h, hl, e->c.x, e->c.y);
            memcpy(H + mb * M * h, Hmb, (size_t)(M * h) * sizeof(float));
            memcpy(dH + mb * M * h, dHmb, (size_t)(M * h) * sizeof(float));
            refmat r = ref_out(&a, e->c, e->g, Imb, e->r0, e->m);
            check_close("pair N out", e->name, hid, r.val, r.bound, (size_t)(e->m * hl));
            ref_free(&r);
            r = ref_out(&b, e->c, e->g, Hmb, e->r0, e->m);
            check_close("pair T out", e->name, y, r.val, r.bound, (size_t)(e->m * k2l));
            ref_free(&r);
            r = ref_din(&b, e->c, e->g, dYmb, e->r0, e->m);
            check_close("pair T dI", e->name, dhid, r.val, r.bound, (size_t)(e->m * hl));
            ref_free(&r);
            r = ref_din(&a, e->c, e->g, dHmb, e->r0, e->m);
            check_close("pair N dI", e->name, din, r.val, r.bound, (size_t)(e->m * k0l));
            ref_free(&r);
            free(Hmb), free(dHmb);
        }
        free(inp), free(hid), free(y), free(dy), free(dhid), free(din);
    }
    CHECK(ff_linear_seq_rs_cmm_uses(s) == (rs_fits ? MICRO : 0),
          "grid %s pair: %ld reduce-scatter collective matmuls, want %d", e->name,
          ff_linear_seq_rs_cmm_uses(s), rs_fits ? MICRO : 0);
    if (rc == FF_OK)
        rc = ff_linear_seq_allreduce_grads(s);
    CHECK(rc == FF_OK, "grid %s pair grads: %s", e->name, ff_ctx_error(ff_grid_ctx(e->grid)));
    if (rc == FF_OK) {
        refmat dw, db;
        ref_grads(&a, e->g, I, dH, Mall, MICRO, &dw, &db);
        check_grads(&a, e->name, "pair N (2 micro-batches)", &dw, &db);
        ref_free(&dw), ref_free(&db);
        ref_grads(&b, e->g, H, dY, Mall, MICRO, &dw, &db);
        check_grads(&b, e->name, "pair T (2 micro-batches)", &dw, &db);
        ref_free(&dw), ref_free(&db);
    }
    free(I), free(dY), free(H), free(dH);
    layer_free(&a), layer_free(&b);
    ff_linear_seq_destroy(s);
}

/* ---- byte counters (docs/design.md §3) -----------------------------------------------------
 * One forward+backward of an N (k0 -> h) and T (h -> k0) pair with biases,
 * then the data-parallel reductions, ring algorithms. Elements received per
 * rank (and sent, for a ring), m rows per rank, b = (k0/Gy)(h/Gx) elements in
 * either layer's block:
 *   Z  all-gather      gathers * (Gz-1)/Gz * b   gathers: F0, F1 and, unless
 *                      the AG cache holds both layers, B0 again (B1 follows F1
 *                      directly, so it keeps the weight; a cache of one layer
 *                      holds the last in forward order, the T layer)
 *   Y  all-reduce      N forward + T backward:  2 * 2(Gy-1)/Gy * m*h/Gx
 *   X  all-reduce      T forward + N backward:  2 * 2(Gx-1)/Gx * m*k0/Gy
 *   Z  reduce-scatter  2 * (Gz-1)/Gz * b
 *   D  all-reduce      2 * 2(Gd-1)/Gd * b/Gz
 *   ZD all-reduce      2(p-1)/p * (h/Gx + k0/Gy), p = Gz*Gd  (biases: the ZD
 *                      row of docs/design.md §3's table)
 * Shapes are chosen so every count divides by its group size. */

static void case_bytes(env *e, int cache)
{
    ff_linear_opts o;
    ff_linear_opts_default(&o);
    o.coll.algo = FF_ALGO_RING;
    o.ag_cache_layers = cache;
    ff_linear_seq *s;
    int rc = ff_linear_seq_create(e->grid, &o, &s);
    CHECK(rc == FF_OK, "seq create");
    layer a, b;
    const int64_t k0 = 96, h = 192;
    env_rows(e, 24);
    rc = add_layer(s, &a, "bytesN", FF_LINEAR_N, k0, h, 1, 4, 0, e->g);
    if (!rc)
        rc = add_layer(s, &b, "bytesT", FF_LINEAR_T, h, k0, 1, 5, 0, e->g);
    if (!rc)
        rc = ff_linear_seq_program_standard(s, 0);
    CHECK(rc == FF_OK, "grid %s bytes: %s", e->name, ff_ctx_error(ff_grid_ctx(e->grid)));
    if (rc) {
        ff_linear_seq_destroy(s);
        return;
    }
    ff_linear_init(a.l, 1, 0.02f);
    ff_linear_init(b.l, 1, 0.02f);
    int64_t k0l = a.sz.in_local, hl = a.sz.out_local;
    float *inp = falloc((size_t)(e->m * k0l)), *hid = falloc((size_t)(e->m * hl));
    float *y = falloc((size_t)(e->m * k0l)), *dy = falloc((size_t)(e->m * k0l));
    float *dhid = falloc((size_t)(e->m * hl)), *din = falloc((size_t)(e->m * k0l));
    fill(inp, (size_t)(e->m * k0l), 31);
    fill(dy, (size_t)(e->m * k0l), 32);
    for (int g = 0; g < FF_NGROUPS; g++)
        ff_group_counters_reset(ff_grid_group(e->grid, (ff_group_kind)g));
    rc = ff_linear_seq_begin(s);
    if (!rc)
        rc = ff_linear_forward(a.l, hid, inp, e->m);
    if (!rc)
        rc = ff_linear_forward(b.l, y, hid, e->m);
    if (!rc)
        rc = ff_linear_backward(b.l, dhid, dy, hid, e->m);
    if (!rc)
        rc = ff_linear_backward(a.l, din, dhid, inp, e->m);
    if (!rc)
        rc = ff_linear_seq_end(s);
    if (!rc)
        rc = ff_linear_seq_allreduce_grads(s);
    CHECK(rc == FF_OK, "grid %s bytes run: %s", e->name, ff_ctx_error(ff_grid_ctx(e->grid)));

    ff_dims g = e->g;
    int64_t m = e->m, blk = (k0 / g.y) * (h / g.x), gathers = cache < 0 || cache >= 2 ? 2 : 3;
    int pzd = g.z * g.d;
    struct {
        ff_group_kind grp;
        ff_coll coll;
        int64_t elems, calls;
    } want[] = {
        {FF_GROUP_Z, FF_COLL_ALLGATHER, gathers * (g.z - 1) * blk / g.z, g.z > 1 ? gathers : 0},
        {FF_GROUP_Y, FF_COLL_ALLREDUCE, 2 * 2 * (g.y - 1) * (m * h / g.x) / g.y, g.y > 1 ? 2 : 0},
        {FF_GROUP_X, FF_COLL_ALLREDUCE, 2 * 2 * (g.x - 1) * (m * k0 / g.y) / g.x, g.x > 1 ? 2 : 0},
        {FF_GROUP_Z, FF_COLL_REDUCE_SCATTER, 2 * (g.z - 1) * blk / g.z, g.z > 1 ? 2 : 0},
        {FF_GROUP_D, FF_COLL_ALLREDUCE, 2 * 2 * (g.d - 1) * (blk / g.z) / g.d, g.d > 1 ? 2 : 0},
        {FF_GROUP_ZD, FF_COLL_ALLREDUCE, 2 * (pzd - 1) * (h / g.x + k0 / g.y) / pzd,
         pzd > 1 ? 2 : 0},
    };
    int64_t total_want = 0, total_got = 0;
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        ff_counters c = ff_group_counters(ff_grid_group(e->grid, want[i].grp), want[i].coll);
        CHECK(c.bytes_recv == (uint64_t)(4 * want[i].elems) &&
                  c.bytes_sent == (uint64_t)(4 * want[i].elems) &&
                  c.calls == (uint64_t)want[i].calls,
              "grid %s (AG cache %d) %s %s: %llu calls, %llu bytes received, %llu sent; "
              "docs/design.md §3 gives %lld calls, %lld bytes",
              e->name, cache, ff_group_kind_name(want[i].grp), ff_coll_name(want[i].coll),
              (unsigned long long)c.calls, (unsigned long long)c.bytes_recv,
              (unsigned long long)c.bytes_sent, (long long)want[i].calls,
              (long long)(4 * want[i].elems));
        total_want += want[i].calls;
    }
    /* nothing else was sent: all calls on all groups are the ones above */
    for (int gk = 0; gk < FF_NGROUPS; gk++)
        for (int cl = 0; cl < FF_NCOLL; cl++)
            total_got +=
                (int64_t)ff_group_counters(ff_grid_group(e->grid, (ff_group_kind)gk), (ff_coll)cl)
                    .calls;
    CHECK(total_got == total_want, "grid %s: %lld collectives posted, expected %lld", e->name,
          (long long)total_got, (long long)total_want);
    free(inp), free(hid), free(y), free(dy), free(dhid), free(din);
    layer_free(&a), layer_free(&b);
    ff_linear_seq_destroy(s);
}

/* ---- refusals -------------------------------------------------------------------------- */

static void case_refusals(env *e)
{
    ff_ctx *ctx = ff_grid_ctx(e->grid);
    ff_linear_seq *s;
    int rc = ff_linear_seq_create(e->grid, NULL, &s);
    CHECK(rc == FF_OK, "seq create");
    ff_linear *l = NULL;
    if (e->g.x > 1) {
        ff_linear_desc d = {
            "odd", FF_LINEAR_N, 4 * e->L * e->g.z, e->g.x * 3 + 1, 0, FF_WEIGHT_KN, NULL, 9};
        rc = ff_linear_add(s, &d, &l);
        CHECK(rc == FF_EDIVIDE && strstr(ff_ctx_error(ctx), "'odd'") &&
                  strstr(ff_ctx_error(ctx), "not divisible by Gx"),
              "grid %s: n not divisible by Gx gave %d '%s'", e->name, rc, ff_ctx_error(ctx));
    }
    if (e->g.z > 1) {
        /* block 1 x 1: cannot be cut into Gz pieces */
        ff_linear_desc d = {"tiny", FF_LINEAR_T, e->g.x, e->g.y, 0, FF_WEIGHT_KN, NULL, 9};
        rc = ff_linear_add(s, &d, &l);
        CHECK(rc == FF_EDIVIDE && strstr(ff_ctx_error(ctx), "Gz="),
              "grid %s: block not divisible by Gz gave %d '%s'", e->name, rc, ff_ctx_error(ctx));
    }
    {
        ff_linear *first = NULL, *second = NULL;
        ff_linear_desc d1 = {"same1", FF_LINEAR_N, 2 * e->L * e->g.z, 2 * e->L, 0, FF_WEIGHT_KN,
                             NULL,    77};
        ff_linear_desc d2 = d1;
        d2.name = "same2";
        ff_linear_seq *s2;
        ff_linear_seq_create(e->grid, NULL, &s2);
        rc = ff_linear_add(s2, &d1, &first);
        CHECK(rc == FF_OK, "add");
        rc = ff_linear_add(s2, &d2, &second);
        CHECK(rc == FF_EINVAL && strstr(ff_ctx_error(ctx), "same rng_stream"),
              "grid %s: two layers with one RNG stream gave %d '%s'", e->name, rc,
              ff_ctx_error(ctx));
        ff_linear_seq_destroy(s2);
    }
    /* a backward before its forward is refused when the program is set, and
     * a use out of program order when it is made */
    layer t;
    rc = add_layer(s, &t, "order", FF_LINEAR_N, 2 * e->L * e->g.z, 2 * e->L, 0, 9, 0, e->g);
    CHECK(rc == FF_OK, "add");
    ff_linear_use bad[] = {{0, FF_USE_BACKWARD}, {0, FF_USE_FORWARD}};
    rc = ff_linear_seq_set_program(s, bad, 2);
    CHECK(rc == FF_EINVAL, "grid %s: backward before forward accepted", e->name);
    rc = ff_linear_seq_program_standard(s, 0);
    CHECK(rc == FF_OK, "program");
    env_rows(e, 2);
    float *buf = falloc((size_t)(e->m * 4 * e->L * e->g.z * e->L));
    rc = ff_linear_seq_begin(s);
    CHECK(rc == FF_OK, "begin");
    rc = ff_linear_backward(t.l, NULL, buf, buf, e->m);
    CHECK(rc == FF_EINVAL && strstr(ff_ctx_error(ctx), "out of program order"),
          "grid %s: backward out of order gave %d '%s'", e->name, rc, ff_ctx_error(ctx));
    rc = ff_linear_seq_end(s);
    CHECK(rc == FF_EINVAL, "grid %s: a run missing its uses ended without error", e->name);
    free(buf);
    layer_free(&t);
    ff_linear_seq_destroy(s);
}

/* ---- overlap switches: bitwise identity ----------------------------------------------------
 * Four layers N, T, N, T under activation checkpointing in blocks of two, for
 * all 16 combinations of OAR, ORS, OAG and AG cache (all layers or none),
 * each with a different forced GEMM mode, and all on with the AG cache
 * holding two of the four layers. Every output, recomputed output,
 * input gradient and parameter gradient must equal the first combination's
 * bit for bit, and every recompute must equal its forward. */

enum { CHAIN = 4 };

typedef struct {
    float *act[CHAIN + 1], *dact[CHAIN + 1];
    float *dw[CHAIN], *db[CHAIN];
    size_t act_n[CHAIN + 1], w_n[CHAIN], b_n[CHAIN];
} chain_result;

static void chain_free(chain_result *r)
{
    for (int i = 0; i <= CHAIN; i++)
        free(r->act[i]), free(r->dact[i]);
    for (int i = 0; i < CHAIN; i++)
        free(r->dw[i]), free(r->db[i]);
}

static int run_chain(env *e, int mask, chain_result *res)
{
    ff_linear_opts o;
    ff_linear_opts_default(&o);
    o.oar = mask & 1;
    o.ors = (mask >> 1) & 1;
    o.oag = (mask >> 2) & 1;
    o.ag_cache_layers = mask == 16 ? 2 : (mask >> 3) & 1 ? -1 : 0;
    ff_linear_seq *s;
    int rc = ff_linear_seq_create(e->grid, &o, &s);
    if (rc)
        return rc;
    ff_gemm_force_mode(ff_linear_seq_gemm(s), mask % 4);
    /* panels of 128 rows: products are cut, with progress calls between
     * panels while collectives are in flight */
    ff_gemm_set_panel_rows(ff_linear_seq_gemm(s), 128);
    int64_t d0 = 96 * e->L, d1 = 160 * e->L;
    env_rows(e, 512);
    layer t[CHAIN];
    for (int i = 0; i < CHAIN && rc == FF_OK; i++) {
        char name[16];
        snprintf(name, sizeof name, "chain%d", i);
        int even = i % 2 == 0;
        rc = add_layer(s, &t[i], name, even ? FF_LINEAR_N : FF_LINEAR_T, even ? d0 : d1,
                       even ? d1 : d0, 1, 40 + (uint32_t)i, 0, e->g);
        if (rc == FF_OK)
            rc = ff_linear_scatter(t[i].l, t[i].W, t[i].B, t[i].w, t[i].b, 0);
    }
    if (rc == FF_OK)
        rc = ff_linear_seq_program_standard(s, 2);
    memset(res, 0, sizeof *res);
    for (int i = 0; i <= CHAIN && rc == FF_OK; i++) {
        int64_t w = i == 0 ? t[0].sz.in_local : t[i - 1].sz.out_local;
        res->act_n[i] = (size_t)(e->m * w);
        res->act[i] = falloc(res->act_n[i]);
        res->dact[i] = falloc(res->act_n[i]);
    }
    if (rc == FF_OK) {
        fill(res->act[0], res->act_n[0], 51 + (uint32_t)e->c.y + 7u * (uint32_t)e->r0);
        fill(res->dact[CHAIN], res->act_n[CHAIN], 52 + (uint32_t)e->c.y + 7u * (uint32_t)e->r0);
        rc = ff_linear_seq_begin(s);
    }
    for (int i = 0; i < CHAIN && rc == FF_OK; i++)
        rc = ff_linear_forward(t[i].l, res->act[i + 1], res->act[i], e->m);
    float *again =
        rc == FF_OK ? falloc(res->act_n[1] > res->act_n[2] ? res->act_n[1] : res->act_n[2]) : NULL;
    for (int blk = CHAIN / 2 - 1; blk >= 0 && rc == FF_OK; blk--) {
        for (int i = 2 * blk; i < 2 * blk + 2 && rc == FF_OK; i++) {
            rc = ff_linear_forward(t[i].l, again, res->act[i], e->m);
            CHECK(rc || !memcmp(again, res->act[i + 1], res->act_n[i + 1] * sizeof(float)),
                  "grid %s switches %d: recompute of layer %d differs from its forward", e->name,
                  mask, i);
        }
        for (int i = 2 * blk + 1; i >= 2 * blk && rc == FF_OK; i--)
            rc = ff_linear_backward(t[i].l, res->dact[i], res->dact[i + 1], res->act[i], e->m);
    }
    free(again);
    if (rc == FF_OK)
        rc = ff_linear_seq_end(s);
    if (rc == FF_OK)
        rc = ff_linear_seq_allreduce_grads(s);
    for (int i = 0; i < CHAIN && rc == FF_OK; i++) {
        res->w_n[i] = t[i].sz.w_shard;
        res->b_n[i] = t[i].sz.bias;
        res->dw[i] = t[i].dw, t[i].dw = NULL;
        res->db[i] = t[i].db, t[i].db = NULL;
    }
    if (rc == FF_OK && mask == 15 && world_rank == 0) {
        int gathers, reused;
        ff_linear_seq_gather_stats(s, &gathers, &reused);
        size_t cur, peak;
        ff_linear_seq_memory(s, &cur, &peak);
        printf("  all overlaps on: %d all-gathers per step, %d uses served by the cache, "
               "peak %zu bytes of layer buffers\n",
               gathers, reused, peak);
    }
    for (int i = 0; i < CHAIN; i++)
        layer_free(&t[i]);
    ff_linear_seq_destroy(s);
    return rc;
}

static void case_combos(env *e)
{
    chain_result first, r;
    int rc = run_chain(e, 0, &first);
    CHECK(rc == FF_OK, "grid %s switches 0: %s", e->name, ff_ctx_error(ff_grid_ctx(e->grid)));
    if (rc)
        return;
    int identical = 0;
    /* 16: all on, with an AG cache of two of the four layers */
    for (int mask = 1; mask <= 16; mask++) {
        rc = run_chain(e, mask, &r);
        CHECK(rc == FF_OK, "grid %s switches %d: %s", e->name, mask,
              ff_ctx_error(ff_grid_ctx(e->grid)));
        if (rc)
            continue;
        int same = 1;
        for (int i = 0; i <= CHAIN; i++)
            same &= !memcmp(first.act[i], r.act[i], r.act_n[i] * sizeof(float)) &&
                    !memcmp(first.dact[i], r.dact[i], r.act_n[i] * sizeof(float));
        for (int i = 0; i < CHAIN; i++)
            same &= !memcmp(first.dw[i], r.dw[i], r.w_n[i] * sizeof(float)) &&
                    !memcmp(first.db[i], r.db[i], r.b_n[i] * sizeof(float));
        CHECK(same,
              "grid %s rank %d: switches oar=%d ors=%d oag=%d cache=%d (GEMM mode %s) "
              "change the result",
              e->name, world_rank, mask & 1, (mask >> 1) & 1, (mask >> 2) & 1, (mask >> 3) & 1,
              ff_gemm_mode_name(mask % 4));
        identical += same;
        chain_free(&r);
    }
    chain_free(&first);
    if (world_rank == 0)
        printf("grid %s: overlap switches: %d of 16 combinations bitwise identical to all-off "
               "(tolerance: none, exact)\n",
               e->name, identical);
}

/* ---- main ---------------------------------------------------------------------------------- */

static void run_grid(ff_ctx *ctx, ff_dims g, int combos)
{
    char name[32];
    snprintf(name, sizeof name, "%dx%dx%dx%d", g.x, g.y, g.z, g.d);
    ff_grid *grid;
    if (ff_grid_create(ctx, g, &grid) != FF_OK) {
        CHECK(0, "grid %s: %s", name, ff_ctx_error(ctx));
        return;
    }
    env e = {name, grid, g, ff_grid_coords(grid), lcm(g.x, g.y), 0, 0, 0};
    int before = test_failures;
    double worst_before = worst_ratio;
    worst_ratio = 0;
    if (combos) {
        case_combos(&e);
    } else {
        case_single(&e, FF_LINEAR_N, FF_WEIGHT_KN);
        case_single(&e, FF_LINEAR_T, FF_WEIGHT_KN);
        case_single(&e, FF_LINEAR_N, FF_WEIGHT_NK);
        case_single(&e, FF_LINEAR_T, FF_WEIGHT_NK);
        case_pair(&e);
        case_bytes(&e, -1);
        case_bytes(&e, 0);
        case_bytes(&e, 1);
        case_refusals(&e);
    }
    double worst = worst_ratio;
    MPI_Allreduce(MPI_IN_PLACE, &worst, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    int failed = test_failures - before;
    MPI_Allreduce(MPI_IN_PLACE, &failed, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    if (world_rank == 0 && !combos)
        printf("grid %-9s worst |err|/bound %.3f (bound gamma_K * sum|terms|, u = 2^-24)  %s\n",
               name, worst, failed ? "FAILED" : "ok");
    worst_ratio = worst > worst_before ? worst : worst_before;
    ff_grid_destroy(grid);
}

int main(int argc, char **argv)
{
    int provided;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &world_size);
    ff_ctx_options o;
    ff_ctx_options_default(&o);
    ff_ctx *ctx;
    if (ff_ctx_create(&ctx, MPI_COMM_WORLD, &o) != FF_OK)
        MPI_Abort(MPI_COMM_WORLD, 1);

    int combos = 0, named = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--combos")) {
            combos = 1;
            continue;
        }
        if (!strcmp(argv[i], "all"))
            continue;
        ff_dims g;
        char err[256];
        if (ff_grid_parse(argv[i], world_size, world_size, &g, err, sizeof err) != FF_OK) {
            CHECK(0, "%s", err);
            continue;
        }
        named++;
        run_grid(ctx, g, combos);
    }
    if (!named) {
        enum { MAX_GRIDS = 128 };
        ff_dims grids[MAX_GRIDS];
        int ng = test_all_grids(world_size, grids, MAX_GRIDS);
        for (int i = 0; i < ng && i < MAX_GRIDS; i++)
            run_grid(ctx, grids[i], combos);
    }
    if (world_rank == 0)
        printf("%ld elements checked on rank 0; worst |err|/bound over all grids %.3f\n",
               checked_elems, worst_ratio);
    ff_ctx_destroy(ctx);
    int code = test_finish("test_linear");
    MPI_Finalize();
    return code;
}
