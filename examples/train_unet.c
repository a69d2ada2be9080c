/* Training the DDPM U-Net with libfourfold's trainer on Fashion-MNIST
 * (Debian's dataset-fashion-mnist, padded to 32x32) on the grid given on
 * the command line: the same trainer, checkpoints and log as the GPT's,
 * through the model interface (include/fourfold/model.h; docs/unet.md).
 * The model is a smaller `fmnist` than `fourfold train --model unet-fmnist`
 * (C0 16, one block per level), to show a configuration of one's own.
 * Writes OUT/log.jsonl, loss.svg, checkpoints and samples.png.
 *
 *   cc train_unet.c $(pkg-config --cflags --libs fourfold) -o train_unet
 *   mpirun -np 4 ./train_unet 2x1x1x2 [steps] [out folder]
 */
#include <fourfold/fourfold.h>
#include <fourfold/trainer.h>
#include <fourfold/unet.h>
#include <stdio.h>
#include <stdlib.h>

static void print_step(const ff_train_event *ev, void *user)
{
    if (*(const int *)user != 0) /* rank 0 prints */
        return;
    if (ev->kind == FF_TRAIN_STEP)
        printf("step %4lld  loss %.4f  norm %.3f  lr %.2e  %.0f ms\n", (long long)ev->step->step,
               ev->step->loss, ev->step->grad_norm, ev->step->lr, ev->step->ms);
    else if (ev->kind == FF_TRAIN_VAL)
        printf("validation loss %.4f\n", ev->val_loss);
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    ff_ctx *ctx;
    ff_grid *grid = NULL;
    ff_dims shape;
    char err[512], png[4200];
    int rc = ff_ctx_create(&ctx, MPI_COMM_WORLD, NULL);
    if (!ctx) {
        MPI_Finalize();
        return 1;
    }
    const int rank = ff_ctx_rank(ctx);
    if (rc == FF_OK) {
        rc = ff_grid_parse(argc > 1 ? argv[1] : "data", ff_ctx_size(ctx), 1, &shape, err,
                           sizeof err);
        if (rc != FF_OK)
            ff_ctx_set_error(ctx, rc, "%s", err);
    }
    if (rc == FF_OK)
        rc = ff_grid_create(ctx, shape, &grid);

    ff_trainer_config c;
    ff_trainer_config_default(&c);
    c.kind = FF_NET_UNET;
    ff_unet_preset("fmnist", &c.unet);
    c.unet.base = 16, c.unet.nres = 1, c.unet.group_channels = 4;
    c.batch = c.micro_batch = 16; /* images per step */
    c.steps = argc > 2 ? atoi(argv[2]) : 50;
    c.hyper.lr = 2e-3f, c.hyper.warmup = 10, c.hyper.weight_decay = 0.0f;
    c.val_every = 0, c.val_batches = 2; /* at the end, on the test images */
    c.out = argc > 3 ? argv[3] : "unet-out";
    c.overwrite = 1;
    c.hook = print_step;
    c.user = (void *)&rank;
    ff_trainer *t = NULL;
    if (rc == FF_OK)
        rc = ff_trainer_create(grid, &c, &t);
    if (rc == FF_OK)
        rc = ff_trainer_run(t);
    snprintf(png, sizeof png, "%s/samples.png", c.out);
    if (rc == FF_OK && (rc = ff_trainer_write_samples(t, png, 7)) == FF_OK && rank == 0)
        printf("wrote %s\n", png);
    if (rc != FF_OK && rank == 0)
        fprintf(stderr, "train_unet: %s\n", ff_ctx_error(ctx));
    ff_trainer_destroy(t);
    ff_grid_destroy(grid);
    ff_ctx_destroy(ctx);
    MPI_Finalize();
    return rc == FF_OK ? 0 : 1;
}
