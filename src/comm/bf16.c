/* bfloat16: the top 16 bits of an IEEE float32, rounded to nearest even.
 * Relative rounding error is at most 2^-8 (8 significant bits, half an ulp). */
#include <string.h>

#include "internal.h"

/* Branch-free, so that the loops below vectorize (the model's bf16 copies
 * and the oneDNN products' operands pass through them). */
static inline uint16_t from_float(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    uint32_t nan = (u & 0x7fffffffu) > 0x7f800000u;            /* keep it a (quiet) NaN */
    uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16; /* nearest, ties to even */
    return (uint16_t)(nan ? (u >> 16) | 0x0040u : rounded);
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

void ff_bf16_round(float *x, size_t n)
{
    for (size_t i = 0; i < n; i++)
        x[i] = ff_bf16_to_float(from_float(x[i]));
}
