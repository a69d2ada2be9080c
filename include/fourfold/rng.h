/* Counter-based random numbers (Philox4x32-10, Salmon et al., SC'11).
 *
 * A value is a pure function of (seed, stream, index): no state, so any rank
 * can produce exactly the values of any part of a tensor, and a weight
 * initialised on any grid equals the one a serial program initialises. */
#ifndef FOURFOLD_RNG_H
#define FOURFOLD_RNG_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* One Philox4x32 block with 10 rounds: out = philox(ctr, key). */
void ff_philox4x32(const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4]);

/* Uniform in (0, 1) and standard normal (Box-Muller, computed in double),
 * keyed by seed, with the counter (index, stream). */
double ff_rng_uniform(uint64_t seed, uint32_t stream, uint64_t index);
float ff_rng_normal(uint64_t seed, uint32_t stream, uint64_t index);

/* A permutation of 0 .. n-1 into perm, by Fisher-Yates (Durstenfeld's: for
 * i = n-1 .. 1, swap perm[i] with perm[j], j = floor(u (i + 1)), u the
 * uniform of (seed, stream, key * n + i)): a pure function of (seed,
 * stream, key, n), so every rank draws the same one (the U-Net's epochs:
 * key = the epoch). */
void ff_rng_permutation(uint64_t seed, uint32_t stream, uint64_t key, int64_t n, int64_t *perm);

#ifdef __cplusplus
}
#endif
#endif
