/* bfloat16: the top 16 bits of an IEEE float32, rounded to nearest even.
 * Relative rounding error is at most 2^-8 (8 significant bits, half an ulp). */
#include <string.h>

#include "internal.h"

uint16_t ff_bf16_from_float(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u) /* NaN: keep it a (quiet) NaN */
        return (uint16_t)((u >> 16) | 0x0040u);
    u += 0x7fffu + ((u >> 16) & 1u); /* round to nearest, ties to even */
    return (uint16_t)(u >> 16);
}

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
        dst[i] = ff_bf16_from_float(src[i]);
}

void ff_bf16_unpack(float *dst, const uint16_t *src, size_t n)
{
    for (size_t i = 0; i < n; i++)
        dst[i] = ff_bf16_to_float(src[i]);
}

void ff_bf16_round(float *x, size_t n)
{
    for (size_t i = 0; i < n; i++)
        x[i] = ff_bf16_to_float(ff_bf16_from_float(x[i]));
}

void ff_bf16_round_copy(float *dst, const float *src, size_t n)
{
    for (size_t i = 0; i < n; i++)
        dst[i] = ff_bf16_to_float(ff_bf16_from_float(src[i]));
}
