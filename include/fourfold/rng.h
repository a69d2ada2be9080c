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

#ifdef __cplusplus
}
#endif
#endif
