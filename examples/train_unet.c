/* Training the DDPM U-Net with libfourfold on Fashion-MNIST (Debian's
 * dataset-fashion-mnist, padded to 32x32) on the grid given on the command
 * line; prints the loss of every step, then runs the reverse process and
 * writes a PNG grid of the samples. The training loop is this file's own:
 * the library's trainer (include/fourfold/trainer.h) knows only the GPT yet
 * (docs/unet.md, "What is left").
 *
 *   cc train_unet.c $(pkg-config --cflags --libs fourfold) -o train_unet
 *   mpirun -np 4 ./train_unet 2x1x1x2 [steps] [samples.png, or - for none]
 */
#include <fourfold/fourfold.h>
#include <fourfold/image.h>
#include <fourfold/unet.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { BATCH = 16 };

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    ff_ctx *ctx;
    ff_grid *grid = NULL;
    ff_unet *u = NULL;
    ff_dims shape;
    char err[512];
    int rc = ff_ctx_create(&ctx, MPI_COMM_WORLD, NULL);
    if (!ctx) {
        MPI_Finalize();
        return 1;
    }
    const int rank = ff_ctx_rank(ctx), steps = argc > 2 ? atoi(argv[2]) : 50;
    const char *png = argc > 3 ? argv[3] : "samples.png";
    if (rc == FF_OK) {
        rc = ff_grid_parse(argc > 1 ? argv[1] : "data", ff_ctx_size(ctx), 1, &shape, err,
                           sizeof err);
        if (rc != FF_OK)
            ff_ctx_set_error(ctx, rc, "%s", err);
    }
    if (rc == FF_OK)
        rc = ff_grid_create(ctx, shape, &grid);
    /* a small U-Net for 32x32: 16 base channels at 32, 16 and 8 pixels */
    ff_unet_config cfg;
    ff_unet_preset("fmnist", &cfg);
    cfg.base = 16, cfg.nres = 1, cfg.group_channels = 4;
    if (rc == FF_OK)
        rc = ff_unet_create(grid, &cfg, NULL, BATCH, &u);
    if (rc == FF_OK)
        rc = ff_unet_init(u, 1234);
    /* every rank reads the images (a failure: the same on every rank) */
    float *images = NULL;
    int64_t n = 0;
    if (rc == FF_OK && ff_images_load(FF_FASHION_MNIST_DIR "/train-images-idx3-ubyte.gz",
                                      cfg.image_size, &images, &n, err, sizeof err) != FF_OK)
        rc = ff_ctx_set_error(ctx, FF_EIO, "%s", err);
    ff_adamw h;
    ff_adamw_default(&h);
    h.lr = 2e-3f, h.warmup = 10, h.steps = steps, h.weight_decay = 0.0f;
    int64_t first = 0, count = 0;
    if (u)
        ff_unet_images(u, &first, &count);
    const int64_t per = cfg.image_size * cfg.image_size * cfg.img_channels;
    float *x0 = calloc((size_t)(count * per + 1), sizeof(float));
    double t0 = MPI_Wtime();
    for (int s = 0; s < steps && rc == FF_OK; s++) {
        /* the batch: images s*BATCH .. (s+1)*BATCH - 1 of the file, in order */
        for (int64_t b = 0; b < count; b++) {
            int64_t img = ((int64_t)s * BATCH + first + b) % n;
            for (int64_t e = 0; e < per; e++)
                x0[b * per + e] = images[img * per + e];
        }
        ff_unet_step_info info;
        rc = ff_unet_step(u, x0, 42, s, &h, &info);
        if (rc == FF_OK && rank == 0)
            printf("step %4d  loss %.4f  norm %.3f  lr %.2e  %.0f ms/step\n", s + 1, info.loss,
                   info.grad_norm, info.lr, 1e3 * (MPI_Wtime() - t0) / (s + 1));
    }
    /* samples: each rank's images, gathered on rank 0 from the ranks of x =
     * y = 0 (which hold images q = z + Gz d) */
    float *all = rank == 0 ? calloc((size_t)(ff_ctx_size(ctx) * count * per), sizeof(float)) : NULL;
    const int sample = strcmp(png, "-") != 0; /* "-": no samples */
    if (rc == FF_OK && sample) {
        double ts = MPI_Wtime();
        rc = ff_unet_sample(u, 7, x0);
        if (rc == FF_OK && rank == 0)
            printf("sampled %d images in %.1f s\n", BATCH, MPI_Wtime() - ts);
    }
    if (rc == FF_OK && sample)
        MPI_Gather(x0, (int)(count * per), MPI_FLOAT, all, (int)(count * per), MPI_FLOAT, 0,
                   MPI_COMM_WORLD);
    if (rc == FF_OK && sample && rank == 0) {
        float *grid_images = calloc((size_t)(BATCH * per), sizeof(float));
        for (int r = 0; r < ff_ctx_size(ctx); r++) {
            ff_dims c = ff_grid_coords_of(shape, r);
            if (c.x == 0 && c.y == 0)
                for (int64_t e = 0; e < count * per; e++)
                    grid_images[((c.z + (int64_t)shape.z * c.d) * count) * per + e] =
                        all[(int64_t)r * count * per + e];
        }
        if (ff_png_write_grid(png, grid_images, BATCH, cfg.image_size, cfg.image_size, 1, 4, err,
                              sizeof err) != FF_OK)
            fprintf(stderr, "%s\n", err);
        else
            printf("wrote %s\n", png);
        free(grid_images);
    }
    if (rc != FF_OK && rank == 0)
        fprintf(stderr, "train_unet: %s\n", ff_ctx_error(ctx));
    free(all), free(x0), free(images);
    ff_unet_destroy(u);
    ff_grid_destroy(grid);
    ff_ctx_destroy(ctx);
    MPI_Finalize();
    return rc == FF_OK ? 0 : 1;
}
