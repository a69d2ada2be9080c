/* Philox4x32-10: the counter-based generator of Random123. */
#include "fourfold/rng.h"

#include <math.h>

enum { PHILOX_ROUNDS = 10 };

static const uint32_t PHILOX_M0 = 0xD2511F53u, PHILOX_M1 = 0xCD9E8D57u;
static const uint32_t PHILOX_W0 = 0x9E3779B9u, PHILOX_W1 = 0xBB67AE85u;

void ff_philox4x32(const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4])
{
    uint32_t c0 = ctr[0], c1 = ctr[1], c2 = ctr[2], c3 = ctr[3];
    uint32_t k0 = key[0], k1 = key[1];
    for (int r = 0; r < PHILOX_ROUNDS; r++) {
        uint64_t p0 = (uint64_t)PHILOX_M0 * c0;
        uint64_t p1 = (uint64_t)PHILOX_M1 * c2;
        uint32_t n0 = (uint32_t)(p1 >> 32) ^ c1 ^ k0;
        uint32_t n1 = (uint32_t)p1;
        uint32_t n2 = (uint32_t)(p0 >> 32) ^ c3 ^ k1;
        uint32_t n3 = (uint32_t)p0;
        c0 = n0, c1 = n1, c2 = n2, c3 = n3;
        k0 += PHILOX_W0;
        k1 += PHILOX_W1;
    }
    out[0] = c0, out[1] = c1, out[2] = c2, out[3] = c3;
}

static void block(uint64_t seed, uint32_t stream, uint64_t index, uint32_t out[4])
{
    const uint32_t ctr[4] = {(uint32_t)index, (uint32_t)(index >> 32), stream, 0};
    const uint32_t key[2] = {(uint32_t)seed, (uint32_t)(seed >> 32)};
    ff_philox4x32(ctr, key, out);
}

/* 64 random bits to a double strictly inside (0, 1): 53 bits, centred */
static double to_open_unit(uint32_t hi, uint32_t lo)
{
    uint64_t bits = (((uint64_t)hi << 32) | lo) >> 11;
    return ((double)bits + 0.5) * (1.0 / 9007199254740992.0);
}

double ff_rng_uniform(uint64_t seed, uint32_t stream, uint64_t index)
{
    uint32_t r[4];
    block(seed, stream, index, r);
    return to_open_unit(r[0], r[1]);
}

float ff_rng_normal(uint64_t seed, uint32_t stream, uint64_t index)
{
    uint32_t r[4];
    block(seed, stream, index, r);
    double u1 = to_open_unit(r[0], r[1]), u2 = to_open_unit(r[2], r[3]);
    const double two_pi = 6.283185307179586476925286766559;
    return (float)(sqrt(-2.0 * log(u1)) * cos(two_pi * u2));
}

void ff_rng_permutation(uint64_t seed, uint32_t stream, uint64_t key, int64_t n, int64_t *perm)
{
    for (int64_t i = 0; i < n; i++)
        perm[i] = i;
    for (int64_t i = n - 1; i > 0; i--) {
        int64_t j = (int64_t)(ff_rng_uniform(seed, stream, key * (uint64_t)n + (uint64_t)i) *
                              (double)(i + 1));
        if (j > i) /* (u < 1, so only by rounding) */
            j = i;
        int64_t v = perm[i];
        perm[i] = perm[j], perm[j] = v;
    }
}
