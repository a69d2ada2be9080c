/* A training step agrees among the ranks once (issue 31, item 6): ff_ctx_agree
 * is an all-reduce of the whole job that the planner does not model, so
 * ff_gpt_step checks the tokens of all its micro-batches and agrees on the
 * outcome in one call, not once per micro-batch. Counted by interposing
 * MPI_Allreduce and MPI_Iallreduce (the test's definitions win over the MPI
 * library's for the statically linked fourfold): an agreement is the one
 * all-reduce of a single MPI_INT with MPI_MIN the library makes. Also: a bad token on one
 * rank stops every rank with that rank's message, before any collective of
 * the step. Run on 4 ranks. */
#include <mpi.h>
#include <stdlib.h>
#include <string.h>

#include "fourfold/fourfold.h"
#include "fourfold/gpt.h"
#include "test_util.h"

static int agreements;

int MPI_Allreduce(const void *send, void *recv, int count, MPI_Datatype type, MPI_Op op,
                  MPI_Comm comm)
{
    if (count == 1 && type == MPI_INT && op == MPI_MIN)
        agreements++;
    return PMPI_Allreduce(send, recv, count, type, op, comm);
}

/* (under --timeout the agreement is non-blocking: counted the same) */
int MPI_Iallreduce(const void *send, void *recv, int count, MPI_Datatype type, MPI_Op op,
                   MPI_Comm comm, MPI_Request *req)
{
    if (count == 1 && type == MPI_INT && op == MPI_MIN)
        agreements++;
    return PMPI_Iallreduce(send, recv, count, type, op, comm, req);
}

enum { MICRO = 3, B = 4, T = 8 };

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    int rank, size;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (size % 2) {
        if (rank == 0)
            fprintf(stderr, "usage: mpirun -np 4 test_agree (an even number of ranks)\n");
        MPI_Finalize();
        return 2;
    }
    ff_ctx *ctx;
    ff_grid *grid = NULL;
    ff_gpt *g = NULL;
    const ff_gpt_config cfg = {.L = 2, .C = 32, .NH = 2, .V = 64, .Vp = 0, .maxT = T};
    int rc = ff_ctx_create(&ctx, MPI_COMM_WORLD, NULL);
    if (rc == FF_OK)
        rc = ff_grid_create(ctx, (ff_dims){1, 2, 1, size / 2}, &grid);
    if (rc == FF_OK)
        rc = ff_gpt_create(grid, &cfg, NULL, B, T, &g);
    if (rc == FF_OK)
        rc = ff_gpt_init(g, 7);
    CHECK(rc == FF_OK, "set-up: %s", ff_ctx_error(ctx));
    if (rc == FF_OK) {
        int first, count;
        ff_gpt_local_sequences(g, &first, &count);
        size_t n = (size_t)MICRO * count * T;
        int32_t *tok = malloc(n * sizeof *tok), *tgt = malloc(n * sizeof *tgt);
        for (size_t i = 0; i < n; i++)
            tok[i] = (int32_t)((i * 7 + 3) % 64), tgt[i] = (int32_t)((i * 5 + 1) % 64);
        ff_adamw h;
        ff_adamw_default(&h);
        h.steps = 2;
        ff_gpt_step_info info;
        for (int s = 0; s < 2; s++) {
            int before = agreements;
            rc = ff_gpt_step(g, tok, tgt, MICRO, &h, s, &info);
            CHECK(rc == FF_OK, "step %d: %s", s, ff_ctx_error(ctx));
            CHECK(agreements - before == 1, "step %d of %d micro-batches: %d agreements, want 1", s,
                  MICRO, agreements - before);
        }
        /* one bad target in the last micro-batch of rank 1 */
        if (rank == 1)
            tgt[n - 1] = 64;
        rc = ff_gpt_step(g, tok, tgt, MICRO, &h, 1, &info);
        CHECK(rc == FF_EINVAL && strstr(ff_ctx_error(ctx), "outside the vocabulary") &&
                  (rank == 1 || strstr(ff_ctx_error(ctx), "rank 1: ")),
              "a bad target on rank 1: %s, \"%s\"", ff_strerror(rc), ff_ctx_error(ctx));
        free(tok);
        free(tgt);
    }
    ff_gpt_destroy(g);
    ff_grid_destroy(grid);
    ff_ctx_destroy(ctx);
    if (rank == 0)
        printf("grid 1x2x1x%d, %d micro-batches of B=%d T=%d per step: want exactly 1 "
               "agreement per step (exact count, no tolerance); %d in the whole test\n",
               size / 2, MICRO, B, T, agreements);
    int code = test_finish("agree");
    MPI_Finalize();
    return code;
}
