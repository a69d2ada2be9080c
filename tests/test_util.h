/* Small helpers shared by the C tests: checks that count failures and print
 * what they compared, and enumeration of grid shapes. */
#ifndef FF_TEST_UTIL_H
#define FF_TEST_UTIL_H

#include <mpi.h>
#include <stdio.h>

#include "fourfold/fourfold.h"

static int test_failures = 0;

#define CHECK(cond, ...)                                                                           \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            test_failures++;                                                                       \
            fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__);                                   \
            fprintf(stderr, __VA_ARGS__);                                                          \
            fputc('\n', stderr);                                                                   \
        }                                                                                          \
    } while (0)

/* Every (Gx, Gy, Gz, Gd) with product n, in a fixed order. Returns the count;
 * fills at most max shapes. */
static inline int test_all_grids(int n, ff_dims *out, int max)
{
    int k = 0;
    for (int x = 1; x <= n; x++)
        for (int y = 1; x * y <= n; y++)
            for (int z = 1; x * y * z <= n; z++) {
                if (n % (x * y * z))
                    continue;
                int d = n / (x * y * z);
                if (x * y * z * d != n)
                    continue;
                if (k < max)
                    out[k] = (ff_dims){x, y, z, d};
                k++;
            }
    return k;
}

/* Sums the failures over all ranks; rank 0 prints the verdict. Returns the
 * process exit code. */
static inline int test_finish(const char *name)
{
    int rank = 0, total = test_failures, init = 0;
    MPI_Initialized(&init);
    if (init) {
        MPI_Comm_rank(MPI_COMM_WORLD, &rank);
        MPI_Allreduce(&test_failures, &total, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    }
    if (rank == 0)
        printf("%s: %s (%d failed checks over all ranks)\n", name, total ? "FAILED" : "passed",
               total);
    return total ? 1 : 0;
}

#endif
