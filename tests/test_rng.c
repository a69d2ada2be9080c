/* The counter-based generator against Random123's published known-answer
 * vectors for Philox4x32-10 (tests/kat_vectors in the Random123
 * distribution), and the normal deviates against their distribution: over
 * N = 200000 draws the sample mean must be within 5 standard errors of 0
 * (5/sqrt(N)), the variance within 5 standard errors of 1 (the variance of
 * the sample variance of a normal is 2/N), and the fraction beyond 1.96
 * within 5 binomial standard errors of 0.05.
 * Permutations (ff_rng_permutation, the U-Net's epochs): every value once
 * (n = 60000, Fashion-MNIST's training images, three keys), the same for
 * the same key, another for another; and for n = 3 over K = 60000 keys each
 * of the 6 orders within 5 binomial standard errors (sqrt(K/6 (5/6))) of
 * K/6: a shuffle with j < i (Sattolo's, cycles only) or j drawn from all n
 * (27 equally likely paths over 6 orders) is off by far more. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fourfold/rng.h"

int main(void)
{
    static const struct {
        uint32_t ctr[4], key[2], out[4];
    } kat[] = {
        {{0, 0, 0, 0}, {0, 0}, {0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u}},
        {{0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu},
         {0xffffffffu, 0xffffffffu},
         {0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu}},
        {{0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u},
         {0xa4093822u, 0x299f31d0u},
         {0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u}},
    };
    int failures = 0;
    for (int i = 0; i < 3; i++) {
        uint32_t out[4];
        ff_philox4x32(kat[i].ctr, kat[i].key, out);
        for (int j = 0; j < 4; j++)
            if (out[j] != kat[i].out[j]) {
                printf("FAIL: Philox KAT %d word %d: %08x, expected %08x\n", i, j, out[j],
                       kat[i].out[j]);
                failures++;
            }
    }
    enum { N = 200000 };
    double sum = 0, sum2 = 0, tail = 0;
    for (uint64_t i = 0; i < N; i++) {
        double z = ff_rng_normal(2026, 3, i);
        sum += z, sum2 += z * z, tail += fabs(z) > 1.959964;
    }
    double mean = sum / N, var = sum2 / N - mean * mean, frac = tail / N;
    double se_mean = 1 / sqrt(N), se_var = sqrt(2.0 / N), se_tail = sqrt(0.05 * 0.95 / N);
    printf("normal: mean %.5f (5 s.e. = %.5f), variance %.5f (5 s.e. = %.5f), beyond 1.96: %.5f "
           "(0.05 +- %.5f)\n",
           mean, 5 * se_mean, var, 5 * se_var, frac, 5 * se_tail);
    if (fabs(mean) > 5 * se_mean || fabs(var - 1) > 5 * se_var || fabs(frac - 0.05) > 5 * se_tail) {
        printf("FAIL: normal deviates off their distribution\n");
        failures++;
    }
    /* distinct streams and seeds give distinct values */
    if (ff_rng_normal(1, 0, 5) == ff_rng_normal(1, 1, 5) ||
        ff_rng_normal(1, 0, 5) == ff_rng_normal(2, 0, 5)) {
        printf("FAIL: stream or seed ignored\n");
        failures++;
    }
    enum { NP = 60000 };
    int64_t *perm = malloc(3 * NP * sizeof *perm);
    char *seen = malloc(NP);
    for (int key = 0; key < 3 && perm && seen; key++) {
        ff_rng_permutation(51, 9, (uint64_t)key, NP, perm + key * NP);
        memset(seen, 0, NP);
        int64_t bad = 0;
        for (int64_t i = 0; i < NP; i++) {
            int64_t v = perm[key * NP + i];
            bad += v < 0 || v >= NP || seen[v];
            if (v >= 0 && v < NP)
                seen[v] = 1;
        }
        if (bad) {
            printf("FAIL: permutation of key %d: %lld values out of range or repeated\n", key,
                   (long long)bad);
            failures++;
        }
    }
    if (perm && seen) {
        ff_rng_permutation(51, 9, 1, NP, perm + 2 * NP); /* key 1 again, over key 2's */
        if (memcmp(perm + NP, perm + 2 * NP, NP * sizeof *perm) ||
            !memcmp(perm, perm + NP, NP * sizeof *perm)) {
            printf("FAIL: a permutation is not a function of its key\n");
            failures++;
        }
    }
    free(perm), free(seen);
    enum { K = 60000 };
    long count[6] = {0};
    for (uint64_t key = 0; key < K; key++) {
        int64_t p[3];
        ff_rng_permutation(7, 9, key, 3, p);
        count[p[0] * 2 + (p[1] > p[2])]++; /* the order's rank among the 6 */
    }
    double worst = 0, se = sqrt(K / 6.0 * (5.0 / 6.0));
    for (int i = 0; i < 6; i++)
        worst = fmax(worst, fabs(count[i] - K / 6.0) / se);
    printf("permutations of 3 over %d keys: %ld %ld %ld %ld %ld %ld, worst %.2f standard errors "
           "from %d\n",
           K, count[0], count[1], count[2], count[3], count[4], count[5], worst, K / 6);
    if (worst > 5) {
        printf("FAIL: the orders of 3 are not equally likely\n");
        failures++;
    }
    printf("test_rng: %s (%d failed checks)\n", failures ? "FAILED" : "passed", failures);
    return failures ? 1 : 0;
}
