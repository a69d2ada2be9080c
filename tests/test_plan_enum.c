/* ff_plan_grids: every (Gx, Gy, Gz, Gd) whose product is the rank count.
 *
 * The count is checked three ways: hand values, a brute-force loop over all
 * 4-tuples, and the closed form. An ordered factorisation of
 * n = prod p_i^a_i into 4 factors distributes each prime's a_i copies over 4
 * slots independently: C(a_i + 3, 3) ways per prime, so the count is
 * prod C(a_i + 3, 3). Hand values: 1 -> 1; 7 (prime) -> 4 (which slot holds
 * the 7); 8 = 2^3 -> C(6,3) = 20; 12 = 2^2 * 3 -> C(5,3) * C(4,3) = 10 * 4 = 40;
 * 1024 = 2^10 -> C(13,3) = 286; 720 = 2^4 3^2 5 -> C(7,3) C(5,3) C(4,3) =
 * 35 * 10 * 4 = 1400. Runs without MPI. */
#include <stdio.h>
#include <stdlib.h>

#include "fourfold/plan.h"
#include "test_util.h"

static long choose3(long n) { return n * (n - 1) * (n - 2) / 6; }

static long closed_form(int n)
{
    long count = 1;
    for (int p = 2; n > 1; p++) {
        int a = 0;
        while (n % p == 0) {
            n /= p;
            a++;
        }
        if (a)
            count *= choose3(a + 3);
    }
    return count;
}

static long brute_force(int n)
{
    long count = 0;
    for (int x = 1; x <= n; x++)
        for (int y = 1; y <= n; y++)
            for (int z = 1; z <= n; z++)
                for (int d = 1; d <= n; d++)
                    count += (long)x * y * z * d == n;
    return count;
}

/* Every entry has the product, entries are distinct and in the documented
 * order: Gx, then Gy, then Gz ascending (Gd follows from the others). */
static void check_list(int n)
{
    size_t count = ff_plan_grids(n, NULL, 0);
    ff_dims *g = malloc(count * sizeof *g);
    CHECK(g != NULL, "out of memory");
    if (!g)
        return;
    size_t again = ff_plan_grids(n, g, count);
    CHECK(again == count, "n=%d: %zu grids on the second call, %zu on the first", n, again, count);
    for (size_t i = 0; i < count; i++) {
        CHECK((long)g[i].x * g[i].y * g[i].z * g[i].d == n,
              "n=%d: %dx%dx%dx%d has the wrong product", n, g[i].x, g[i].y, g[i].z, g[i].d);
        if (i > 0) {
            const ff_dims *a = &g[i - 1], *b = &g[i];
            int ordered = a->x < b->x || (a->x == b->x && a->y < b->y) ||
                          (a->x == b->x && a->y == b->y && a->z < b->z);
            CHECK(ordered, "n=%d: %dx%dx%dx%d before %dx%dx%dx%d is out of order (or repeated)", n,
                  a->x, a->y, a->z, a->d, b->x, b->y, b->z, b->d);
        }
    }
    /* a capacity smaller than the count fills only what fits */
    if (count > 2) {
        ff_dims two[2];
        CHECK(ff_plan_grids(n, two, 2) == count, "n=%d: truncated call must still count all", n);
        CHECK(two[0].x == g[0].x && two[1].z == g[1].z, "n=%d: truncated call differs", n);
    }
    free(g);
}

int main(void)
{
    static const struct {
        int n;
        long want;
    } hand[] = {{1, 1}, {7, 4}, {8, 20}, {12, 40}, {1024, 286}, {720, 1400}};
    for (size_t i = 0; i < sizeof hand / sizeof hand[0]; i++) {
        long got = (long)ff_plan_grids(hand[i].n, NULL, 0);
        CHECK(got == hand[i].want, "%d ranks: %ld grids, by hand %ld", hand[i].n, got,
              hand[i].want);
        printf("%5d ranks: %5ld grids (by hand %ld)\n", hand[i].n, got, hand[i].want);
    }
    for (int n = 1; n <= 60; n++) {
        long got = (long)ff_plan_grids(n, NULL, 0), bf = brute_force(n), cf = closed_form(n);
        CHECK(got == bf && got == cf, "%d ranks: %ld grids, brute force %ld, closed form %ld", n,
              got, bf, cf);
        check_list(n);
    }
    static const int big[] = {96, 360, 1024, 4096, 6144, 65536, 720720};
    for (size_t i = 0; i < sizeof big / sizeof big[0]; i++) {
        long got = (long)ff_plan_grids(big[i], NULL, 0), cf = closed_form(big[i]);
        CHECK(got == cf, "%d ranks: %ld grids, closed form %ld", big[i], got, cf);
        printf("%6d ranks: %6ld grids (closed form %ld)\n", big[i], got, cf);
        if (big[i] <= 6144)
            check_list(big[i]);
    }
    CHECK(ff_plan_grids(0, NULL, 0) == 0, "0 ranks must have no grid");
    CHECK(ff_plan_grids(-3, NULL, 0) == 0, "negative ranks must have no grid");
    printf("brute force and closed form agree for 1..60 ranks\n");
    return test_finish("test_plan_enum");
}
