/* bfloat16 / float16 storage around float32 arithmetic (cast.c; stream.h's element passes over halves):
 * widening is exact; narrowing follows casting.saturating_cast (finite values beyond the narrow type's range
 * become its largest finite value of their sign; inf stays inf, NaN stays NaN), rounded to nearest even.
 *
 * Narrowing to bfloat16 is the float32 bit pattern rounded at bit 16, which is correct for subnormals too
 * (the two types share the exponent range). float16 uses F16C's conversions where the build has them, else
 * the same rounding written out on the bits (normal and subnormal halves). */
#ifndef LOWBIT_HALF_H
#define LOWBIT_HALF_H

#include <stdint.h>
#if defined(__F16C__) || defined(__AVX512F__)
#include <immintrin.h>
#endif

enum { CAST_BFLOAT16, CAST_FLOAT16 };

#define BF16_MAX_BITS 0x7f7f0000u /* the largest finite bfloat16, as float32 bits */
#define F16_MAX_BITS 0x477fe000u  /* 65504 */

/* bits of a finite |v| beyond the narrow type's largest finite value, brought down to it (sign kept) */
static inline uint32_t saturated(uint32_t bits, uint32_t max_bits) {
    uint32_t magnitude = bits & 0x7fffffffu, sign = bits & 0x80000000u;
    return (magnitude < 0x7f800000u) & (magnitude > max_bits) ? sign | max_bits : bits;
}

/* no branch: the loop vectorises (NaN kept quiet, the rest rounded at bit 16) */
static inline uint16_t bfloat16_of(uint32_t bits) {
    bits = saturated(bits, BF16_MAX_BITS);
    uint32_t rounded = (bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16, quiet = (bits >> 16) | 0x40u;
    return (uint16_t)((bits & 0x7fffffffu) > 0x7f800000u ? quiet : rounded);
}

#if defined(__AVX512F__)
/* bfloat16_of on 16 lanes (GCC packed the plain loop's results with a cross-lane word permute per 32 lanes:
 * half the speed of torch's own cast). Builds with AVX512-BF16 take its conversion first where it is exact
 * (it flushes subnormals to zero: bfloat16_instruction_exact). */
/* Nearest even at bit 16, in the low half of each lane: every finite float32 within bfloat16's range. */
static inline __m512i bfloat16_rounded(__m512i bits) {
    __m512i odd = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
    return _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(bits, _mm512_set1_epi32(0x7fff)), odd), 16);
}

/* Whether a lane of either vector is NaN, inf or a finite value past bfloat16's range (rare: one test). */
static inline int beyond_bfloat16(__m512i a, __m512i b) {
    const __m512i magnitude = _mm512_set1_epi32(0x7fffffff), largest = _mm512_set1_epi32((int)BF16_MAX_BITS);
    __m512i top = _mm512_max_epu32(_mm512_and_si512(a, magnitude), _mm512_and_si512(b, magnitude));
    return _mm512_cmpgt_epu32_mask(top, largest) != 0;
}

#if defined(__AVX512BF16__)
/* Whether AVX512-BF16's conversion (nearest even, but subnormals flushed to zero) gives bfloat16_of's bits
 * for every lane of both vectors: none NaN, inf, past bfloat16's range or a nonzero subnormal (the magnitude
 * minus one below 2^23 - 1, unsigned, zero wrapping to the top). */
static inline int bfloat16_instruction_exact(__m512i a, __m512i b) {
    const __m512i magnitude = _mm512_set1_epi32(0x7fffffff), one = _mm512_set1_epi32(1);
    __m512i ma = _mm512_and_si512(a, magnitude), mb = _mm512_and_si512(b, magnitude);
    __m512i top = _mm512_max_epu32(ma, mb);
    __m512i bottom = _mm512_min_epu32(_mm512_sub_epi32(ma, one), _mm512_sub_epi32(mb, one));
    return !(_mm512_cmpgt_epu32_mask(top, _mm512_set1_epi32((int)BF16_MAX_BITS)) |
             _mm512_cmplt_epu32_mask(bottom, _mm512_set1_epi32(0x007fffff)));
}
#endif

static inline __m512i bfloat16_lanes(__m512i bits) {
    const __m512i infinity = _mm512_set1_epi32(0x7f800000), largest = _mm512_set1_epi32((int)BF16_MAX_BITS);
    __m512i magnitude = _mm512_and_si512(bits, _mm512_set1_epi32(0x7fffffff));
    __mmask16 beyond = _mm512_mask_cmpgt_epu32_mask(_mm512_cmplt_epu32_mask(magnitude, infinity), magnitude, largest);
    bits = _mm512_mask_ternarylogic_epi32(bits, beyond, largest, _mm512_set1_epi32((int)0x80000000u), 0xec); /* max | (bits & sign) */
    __m512i rounded = bfloat16_rounded(bits);
    __m512i quiet = _mm512_or_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(0x40));
    rounded = _mm512_mask_mov_epi32(rounded, _mm512_cmpgt_epu32_mask(magnitude, infinity), quiet);
    return rounded; /* in the low half of each lane */
}
#endif

/* float32 bits (already saturated) to float16 bits, rounded to nearest even, without F16C. */
static inline uint16_t float16_of_bits(uint32_t bits) {
    uint32_t sign = (bits >> 16) & 0x8000u, magnitude = bits & 0x7fffffffu;
    if (magnitude >= 0x7f800000u) /* inf, or NaN kept quiet with its payload's top bits */
        return (uint16_t)(sign | (magnitude > 0x7f800000u ? 0x7e00u | ((magnitude & 0x7fffffu) >> 13) : 0x7c00u));
    if (magnitude >= 0x38800000u) /* a normal half: rebias, round at bit 13 (at most 65504: no overflow) */
        return (uint16_t)(sign | ((magnitude - 0x38000000u + 0xfffu + ((magnitude >> 13) & 1u)) >> 13));
    if (magnitude <= 0x33000000u) return (uint16_t)sign; /* at most half the smallest subnormal: to zero */
    /* a subnormal half: v / 2^-24 rounded to an integer, the mantissa shifted by 126 - exponent (14..24) */
    uint32_t mantissa = (magnitude & 0x7fffffu) | 0x800000u, shift = 126u - (magnitude >> 23);
    uint32_t kept = mantissa >> shift, rest = mantissa & ((1u << shift) - 1u), half = 1u << (shift - 1u);
    kept += (rest > half) | ((rest == half) & (kept & 1u));
    return (uint16_t)(sign | kept);
}

/* out[0, n) = x[0, n) narrowed by casting.saturating_cast's rule. */
static inline void lb_narrow_halves(const float *restrict values, uint16_t *restrict out, int64_t n, int kind) {
    const uint32_t *restrict x = (const uint32_t *)values;
    int64_t i = 0, end = n;
    if (kind == CAST_BFLOAT16) {
#if defined(__AVX512F__)
        for (; i + 32 <= end; i += 32) { /* two vectors packed in-lane, then the 64-bit quarters put in order */
            __m512i low = _mm512_loadu_si512(x + i), high = _mm512_loadu_si512(x + i + 16);
#if defined(__AVX512BF16__)
            if (bfloat16_instruction_exact(low, high)) { /* one instruction, lanes in order */
                __m512bh both = _mm512_cvtne2ps_pbh(_mm512_castsi512_ps(high), _mm512_castsi512_ps(low));
                _mm512_storeu_si512(out + i, (__m512i)both);
                continue;
            }
#endif
            __m512i packed = beyond_bfloat16(low, high) ? _mm512_packus_epi32(bfloat16_lanes(low), bfloat16_lanes(high))
                                                        : _mm512_packus_epi32(bfloat16_rounded(low), bfloat16_rounded(high));
            _mm512_storeu_si512(out + i, _mm512_permutexvar_epi64(_mm512_setr_epi64(0, 2, 4, 6, 1, 3, 5, 7), packed));
        }
#endif
        for (; i < end; i++) out[i] = bfloat16_of(x[i]);
        return;
    }
#if defined(__F16C__)
    for (; i + 8 <= end; i += 8) {
        uint32_t bits[8];
        for (int k = 0; k < 8; k++) bits[k] = saturated(x[i + k], F16_MAX_BITS);
        __m128i halves = _mm256_cvtps_ph(_mm256_loadu_ps((const float *)bits), _MM_FROUND_TO_NEAREST_INT);
        _mm_storeu_si128((__m128i *)(out + i), halves);
    }
#endif
    for (; i < end; i++) out[i] = float16_of_bits(saturated(x[i], F16_MAX_BITS));
}

/* float16 bits to float32 without F16C: exact (every half is a float). */
static inline uint32_t float32_of_half(uint16_t half) {
    uint32_t sign = (uint32_t)(half & 0x8000u) << 16, exponent = (half >> 10) & 0x1fu, mantissa = half & 0x3ffu;
    if (exponent == 0x1fu) return sign | 0x7f800000u | (mantissa << 13); /* inf, NaN */
    if (exponent) return sign | ((exponent + 112u) << 23) | (mantissa << 13);
    if (!mantissa) return sign;
    int top = 31 - __builtin_clz(mantissa); /* a subnormal: mantissa * 2^-24, normalised */
    return sign | ((uint32_t)(top + 103) << 23) | ((mantissa << (23 - top)) & 0x7fffffu);
}

/* out[0, n) = x[0, n) widened to float32 (exact). */
static inline void lb_widen_halves(const uint16_t *restrict x, float *restrict values, int64_t n, int kind) {
    uint32_t *restrict out = (uint32_t *)values;
    int64_t i = 0;
    if (kind == CAST_BFLOAT16) {
        for (; i < n; i++) out[i] = (uint32_t)x[i] << 16;
        return;
    }
#if defined(__F16C__)
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(values + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(x + i))));
#endif
    for (; i < n; i++) out[i] = float32_of_half(x[i]);
}

#endif
