/* bfloat16: the top 16 bits of an IEEE float32, rounded to nearest even.
 * Relative rounding error is at most 2^-8 (8 significant bits, half an ulp). */
#include <string.h>

#include "internal.h"

/* float(bf16(x)) on the bits, without a branch, so that the loops below
 * vectorize (bf16-mixed rounds every operand of its products, and oneDNN's
 * products pack theirs): nearest, ties to even; a NaN stays a (quiet) NaN */
static inline uint32_t round_bits(uint32_t u)
{
    const uint32_t r = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
    return (u & 0x7fffffffu) > 0x7f800000u ? (u | 0x00400000u) & 0xffff0000u : r;
}

static inline uint16_t from_float(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return (uint16_t)(round_bits(u) >> 16);
}

uint16_t ff_bf16_from_float(float f) { return from_float(f); }

float ff_bf16_to_float(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

void ff_bf16_pack(uint16_t *dst, const float *src, size_t n)
{
    for (size_t i = 0; i < n; i++)
        dst[i] = from_float(src[i]);
}

void ff_bf16_unpack(float *dst, const uint16_t *src, size_t n)
{
    for (size_t i = 0; i < n; i++)
        dst[i] = ff_bf16_to_float(src[i]);
}

void ff_bf16_round(float *x, size_t n) { ff_bf16_round_copy(x, x, n); }

void ff_bf16_round_copy(float *dst, const float *src, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        uint32_t u;
        memcpy(&u, &src[i], sizeof u);
        u = round_bits(u);
        memcpy(&dst[i], &u, sizeof u);
    }
}
