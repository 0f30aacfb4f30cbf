/* float16 and bfloat16 <-> float, in portable C (no F16C, no special
 * flags): reductions on half types combine in float and round back to
 * nearest even, as torch does. */
#ifndef SLIME_COLL_HALF_H
#define SLIME_COLL_HALF_H

#include <stdint.h>
#include <string.h>

static inline uint32_t f32_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static inline float f32_of(uint32_t u) {
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static inline float bf16_to_f32(uint16_t h) { return f32_of((uint32_t)h << 16); }

static inline uint16_t f32_to_bf16(float f) {
    uint32_t u = f32_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) /* NaN: keep it a (quiet) NaN */
        return (uint16_t)((u >> 16) | 0x40u);
    /* adding 0x7fff plus the lowest kept bit rounds to nearest, ties to
     * even; a carry into the exponent is the right result too */
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

static inline float f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t man = h & 0x3ffu;
    if (exp == 0x1f) /* inf, NaN */
        return f32_of(sign | 0x7f800000u | man << 13);
    if (exp == 0) { /* zero or subnormal: man * 2^-24, exact in float */
        float v = (float)man * 0x1p-24f;
        return f32_of(f32_bits(v) | sign);
    }
    return f32_of(sign | (exp + 112u) << 23 | man << 13);
}

static inline uint16_t f32_to_f16(float f) {
    uint32_t u = f32_bits(f);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    u &= 0x7fffffffu;
    if (u >= 0x7f800000u) /* inf stays inf, NaN stays a quiet NaN */
        return (uint16_t)(sign | 0x7c00u | (u > 0x7f800000u ? 0x200u | ((u >> 13) & 0x3ffu) : 0u));
    if (u >= 0x477ff000u) /* 65520 and up round to inf */
        return (uint16_t)(sign | 0x7c00u);
    if (u < 0x38800000u) {
        /* below 2^-14 the result is subnormal: adding 0.5 puts the half's
         * mantissa in the float's low bits, rounded by the FPU (nearest
         * even, the default mode) */
        float v = f32_of(u) + 0.5f;
        return (uint16_t)(sign | (uint16_t)(f32_bits(v) - 0x3f000000u));
    }
    /* normal: rebias the exponent and round the 13 dropped bits to
     * nearest even; a carry into the exponent is the right result */
    u += ((uint32_t)(15 - 127) << 23) + 0xfffu + ((u >> 13) & 1u);
    return (uint16_t)(sign | (uint16_t)(u >> 13));
}

#endif
