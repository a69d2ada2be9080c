/* Training with libfourfold: the `tiny` GPT (2 blocks, 64 channels) for a
 * few dozen steps on the default corpus (Debian's fortune(6) texts, made
 * into byte-level shards under ./corpus on first use), on the grid given on
 * the command line; prints the loss of every step.
 *
 *   cc train_tiny.c $(pkg-config --cflags --libs fourfold) -o train_tiny
 *   mpirun -np 4 ./train_tiny 2x1x1x2 [steps]
 */
#include <fourfold/fourfold.h>
#include <stdio.h>
#include <stdlib.h>

typedef struct {
    int rank;
    float val_loss;
} run_state;

/* Called on every rank after each step and validation; rank 0 prints. */
static void on_event(const ff_train_event *ev, void *user)
{
    run_state *r = user;
    if (ev->kind == FF_TRAIN_VAL)
        r->val_loss = ev->val_loss;
    if (ev->kind == FF_TRAIN_STEP && r->rank == 0)
        printf("step %3lld  loss %.4f  %6.1f ms\n", (long long)ev->step->step, ev->step->loss,
               ev->step->ms);
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    ff_ctx *ctx;
    ff_grid *grid = NULL;
    ff_trainer *trainer = NULL;
    ff_dims shape;
    char err[256];
    int rc = ff_ctx_create(&ctx, MPI_COMM_WORLD, NULL);
    if (!ctx) { /* out of memory: no context to hold a message */
        MPI_Finalize();
        return 1;
    }
    if (rc == FF_OK) {
        rc = ff_grid_parse(argc > 1 ? argv[1] : "data", ff_ctx_size(ctx), 1, &shape, err,
                           sizeof err);
        if (rc != FF_OK)
            ff_ctx_set_error(ctx, rc, "%s", err);
    }
    if (rc == FF_OK)
        rc = ff_grid_create(ctx, shape, &grid);

    run_state state = {ff_ctx_rank(ctx), 0};
    ff_trainer_config c;
    ff_trainer_config_default(&c);
    c.model = (ff_gpt_config){.L = 2, .C = 64, .NH = 4, .V = 512, .maxT = 64}; /* tiny */
    c.batch = c.micro_batch = 8;
    c.seq = 64;
    c.steps = argc > 2 ? atoi(argv[2]) : 40;
    c.hyper.lr = 3e-3f;
    c.hyper.warmup = 5;
    c.val_every = 0; /* validate once, at the end of ff_trainer_run */
    c.val_batches = 4;
    c.hook = on_event;
    c.user = &state;
    if (rc == FF_OK)
        rc = ff_trainer_create(grid, &c, &trainer);
    if (rc == FF_OK)
        rc = ff_trainer_run(trainer);
    if (state.rank == 0) {
        if (rc == FF_OK)
            printf("validation loss %.4f\n", state.val_loss);
        else
            fprintf(stderr, "train_tiny: %s\n", ff_ctx_error(ctx));
    }
    ff_trainer_destroy(trainer);
    ff_grid_destroy(grid);
    ff_ctx_destroy(ctx);
    MPI_Finalize();
    return rc == FF_OK ? 0 : 1;
}
