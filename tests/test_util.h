/* Small helpers shared by the C tests: checks that count failures and print
 * what they compared, and enumeration of grid shapes. */
#ifndef FF_TEST_UTIL_H
#define FF_TEST_UTIL_H

#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

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

/* Replicas: every rank of the world gives a key (which block of data it
 * holds) and its n floats; ranks with the same key must hold the same bits.
 * Compares FNV-1a hashes of the bytes. Returns how many of this rank's
 * replicas differ from it (collective over MPI_COMM_WORLD). */
static inline int test_replicas_differ(int64_t key, const float *a, size_t n)
{
    uint64_t h = 1469598103934665603ull;
    const unsigned char *p = (const unsigned char *)a;
    for (size_t i = 0; i < n * sizeof(float); i++)
        h = (h ^ p[i]) * 1099511628211ull;
    int size, rank, differ = 0;
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    int64_t mine[2] = {key, (int64_t)h}, *all = malloc((size_t)size * sizeof mine);
    if (!all)
        MPI_Abort(MPI_COMM_WORLD, 3);
    MPI_Allgather(mine, 2, MPI_INT64_T, all, 2, MPI_INT64_T, MPI_COMM_WORLD);
    for (int r = 0; r < size; r++)
        differ += r != rank && all[2 * r] == key && all[2 * r + 1] != mine[1];
    free(all);
    return differ;
}

#endif
