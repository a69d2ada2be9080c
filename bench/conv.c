/* Convolution benchmark: one 3x3 (or 1x1) convolution of the serial grid
 * (1x1x1x1, one rank, one core) as im2col + the linear layer's sgemm,
 * against the linear layer alone on the same im2col matrix, so the
 * difference is what im2col (forward) and im2col + col2im (backward) cost.
 *
 *   ff_bench_conv [--images 8] [--size 32] [--cin 128] [--cout 128]
 *                 [--ksize 3] [--stride 1] [--reps 9]
 *
 * Prints the median of --reps timed steps (after one untimed step that also
 * tunes the GEMM modes) of each phase, in ms and GFLOP/s (2 P k n flops per
 * product, P output pixels, k = k*k*cin), and one JSON line. */
#include "fourfold/conv.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fourfold/fourfold.h"

static int cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static void fail(ff_ctx *ctx, const char *what)
{
    fprintf(stderr, "ff_bench_conv: %s: %s\n", what, ff_ctx_error(ctx));
    MPI_Abort(MPI_COMM_WORLD, 1);
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    long images = 8, size = 32, cin = 128, cout = 128, ksize = 3, stride = 1, reps = 9;
    for (int i = 1; i + 1 < argc; i += 2) {
        long v = atol(argv[i + 1]);
        if (!strcmp(argv[i], "--images"))
            images = v;
        else if (!strcmp(argv[i], "--size"))
            size = v;
        else if (!strcmp(argv[i], "--cin"))
            cin = v;
        else if (!strcmp(argv[i], "--cout"))
            cout = v;
        else if (!strcmp(argv[i], "--ksize"))
            ksize = v;
        else if (!strcmp(argv[i], "--stride"))
            stride = v;
        else if (!strcmp(argv[i], "--reps"))
            reps = v < 1 ? 1 : v > 99 ? 99 : v;
        else {
            fprintf(stderr, "ff_bench_conv: unknown option %s\n", argv[i]);
            MPI_Abort(MPI_COMM_WORLD, 2);
        }
    }
    ff_ctx_options o;
    ff_ctx_options_default(&o);
    ff_ctx *ctx;
    ff_grid *grid;
    if (ff_ctx_create(&ctx, MPI_COMM_SELF, &o) || ff_grid_create(ctx, (ff_dims){1, 1, 1, 1}, &grid))
        fail(ctx, "set-up");
    ff_linear_seq *sc, *sl;
    ff_conv *cv;
    ff_linear *lin;
    ff_conv_desc d = {"conv", FF_LINEAR_N, cin, cout, size, size, (int)ksize, (int)stride, 1, 1};
    if (ff_linear_seq_create(grid, NULL, &sc) || ff_conv_create(sc, grid, &d, &cv))
        fail(ctx, "conv");
    ff_conv_sizes cz = ff_conv_local_sizes(cv);
    int64_t k = ksize * ksize * cin, px = images * cz.out_height * cz.out_width;
    ff_linear_desc ld = {"linear", FF_LINEAR_N, k, cout, 1, FF_WEIGHT_NK, NULL, 2};
    if (ff_linear_seq_create(grid, NULL, &sl) || ff_linear_add(sl, &ld, &lin))
        fail(ctx, "linear");
    ff_linear_sizes z = ff_linear_local_sizes(lin);
    size_t ncol = (size_t)(px * k), nin = (size_t)(images * size * size * cin);
    float *w = ff_floats_alloc(z.w_shard), *dw = ff_floats_alloc(z.w_shard);
    float *b = ff_floats_alloc(z.bias), *db = ff_floats_alloc(z.bias);
    float *w2 = ff_floats_alloc(z.w_shard), *dw2 = ff_floats_alloc(z.w_shard);
    float *b2 = ff_floats_alloc(z.bias), *db2 = ff_floats_alloc(z.bias);
    float *x = ff_floats_alloc(nin), *dx = ff_floats_alloc(nin);
    float *col = ff_floats_alloc(ncol), *dcol = ff_floats_alloc(ncol);
    float *out = ff_floats_alloc((size_t)(px * cout)), *dout = ff_floats_alloc((size_t)(px * cout));
    for (size_t i = 0; i < nin; i++)
        x[i] = (float)((i * 7) % 13) * 0.1f - 0.6f;
    for (size_t i = 0; i < (size_t)(px * cout); i++)
        dout[i] = (float)((i * 5) % 11) * 0.1f - 0.5f;
    ff_linear_bind(ff_conv_linear(cv), w, b, dw, db);
    ff_linear_bind(lin, w2, b2, dw2, db2);
    if (ff_linear_init(ff_conv_linear(cv), 1, 0.02f) || ff_linear_init(lin, 1, 0.02f) ||
        ff_linear_seq_program_standard(sc, 0) || ff_linear_seq_program_standard(sl, 0))
        fail(ctx, "init");
    double t[4][100];
    for (long r = 0; r <= reps; r++) {
        double t0 = MPI_Wtime();
        if (ff_linear_seq_begin(sc) || ff_conv_forward(cv, out, x, images, col))
            fail(ctx, "conv forward");
        double t1 = MPI_Wtime();
        if (ff_conv_backward(cv, dx, dout, x, images, col, dcol) || ff_linear_seq_end(sc) ||
            ff_linear_seq_wait_grads(sc))
            fail(ctx, "conv backward");
        double t2 = MPI_Wtime();
        if (ff_linear_seq_begin(sl) || ff_linear_forward(lin, out, col, px))
            fail(ctx, "linear forward");
        double t3 = MPI_Wtime();
        if (ff_linear_backward(lin, dcol, dout, col, px) || ff_linear_seq_end(sl) ||
            ff_linear_seq_wait_grads(sl))
            fail(ctx, "linear backward");
        double t4 = MPI_Wtime();
        if (r > 0) {
            t[0][r - 1] = t1 - t0, t[1][r - 1] = t2 - t1;
            t[2][r - 1] = t3 - t2, t[3][r - 1] = t4 - t3;
        }
    }
    for (int i = 0; i < 4; i++)
        qsort(t[i], (size_t)reps, sizeof(double), cmp);
    double med[4], fl = 2.0 * (double)px * (double)k * (double)cout;
    for (int i = 0; i < 4; i++)
        med[i] = t[i][reps / 2];
    printf("# %ld images %ldx%ld, %ld -> %ld channels, %ldx%ld kernel, stride %ld: %lld pixel "
           "rows, k = %lld; median of %ld, 1 rank\n",
           images, size, size, cin, cout, ksize, ksize, stride, (long long)px, (long long)k, reps);
    printf("%-34s %9s %9s\n", "phase", "ms", "GFLOP/s");
    printf("%-34s %9.3f %9.1f\n", "conv forward (im2col + sgemm)", 1e3 * med[0], fl / med[0] / 1e9);
    printf("%-34s %9.3f %9.1f\n", "linear forward (sgemm)", 1e3 * med[2], fl / med[2] / 1e9);
    printf("%-34s %9.3f %9.1f\n", "conv backward (+ im2col, col2im)", 1e3 * med[1],
           2 * fl / med[1] / 1e9);
    printf("%-34s %9.3f %9.1f\n", "linear backward (2 sgemm)", 1e3 * med[3], 2 * fl / med[3] / 1e9);
    printf("{\"bench\":\"conv\",\"images\":%ld,\"size\":%ld,\"cin\":%ld,\"cout\":%ld,\"ksize\":%ld,"
           "\"stride\":%ld,\"conv_fwd_ms\":%.4f,\"linear_fwd_ms\":%.4f,\"conv_bwd_ms\":%.4f,"
           "\"linear_bwd_ms\":%.4f}\n",
           images, size, cin, cout, ksize, stride, 1e3 * med[0], 1e3 * med[2], 1e3 * med[1],
           1e3 * med[3]);
    ff_linear_seq_destroy(sc), ff_linear_seq_destroy(sl);
    ff_conv_destroy(cv);
    ff_floats_free(w), ff_floats_free(dw), ff_floats_free(b), ff_floats_free(db);
    ff_floats_free(w2), ff_floats_free(dw2), ff_floats_free(b2), ff_floats_free(db2);
    ff_floats_free(x), ff_floats_free(dx), ff_floats_free(col), ff_floats_free(dcol);
    ff_floats_free(out), ff_floats_free(dout);
    ff_grid_destroy(grid);
    ff_ctx_destroy(ctx);
    MPI_Finalize();
    return 0;
}
