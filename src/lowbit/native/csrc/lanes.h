/* A machine vector of float / int32 lanes in GCC vector types, shared by the sign kernels (sign.c) and
 * binary_residual (residual.c): sixteen lanes (one register) where the compiler targets AVX-512, eight
 * elsewhere (one AVX2 register, two SSE or NEON ones). Without AVX-512, GCC splits a 64-byte vector type
 * through the stack and general registers: several times slower than eight lanes. Maxima, minima and the
 * widening to double use the instruction set's intrinsics where it has them (GCC's generic lowering takes
 * two or three instructions for each), plain vector code elsewhere. Portable to GCC 9+ and clang:
 * __builtin_shufflevector where the compiler has it (clang, GCC 12+), else __builtin_shuffle and memcpy. */
#ifndef LOWBIT_LANES_H
#define LOWBIT_LANES_H

#include "common.h"
#if defined(__AVX2__) || defined(__AVX512F__)
#include <immintrin.h>
#endif

/* The lanes' order does not matter to the sign statistics: maxima, minima and counts are exact, and the sum
 * is certified for any order (sign.c, certified_mean). Compares give -1 / 0 per lane. A run's last partial
 * vector is padded with NaN, which no selection keeps. */
#if defined(__AVX512F__)
#define LANES 16
#else
#define LANES 8
#endif
typedef float lanes_f __attribute__((vector_size(LANES * 4)));
typedef int32_t lanes_i __attribute__((vector_size(LANES * 4)));
typedef float half_f __attribute__((vector_size(LANES * 2)));
typedef double half_d __attribute__((vector_size(LANES * 4))); /* half the lanes, widened */
#define NONE 0x7fffffff /* bits above every magnitude: the key of a lane left out of a minimum */
#define ALWAYS_INLINE static inline __attribute__((always_inline)) /* one copy per selection constant */

/* These static helpers inline; GCC's note that 64-byte vector arguments pass differently without AVX-512
 * concerns exported functions only. */
#pragma GCC diagnostic ignored "-Wpsabi"

#if defined(__clang__) || __GNUC__ >= 12
#define LANES_SHUFFLE(v, ...) __builtin_shufflevector(v, v, __VA_ARGS__)
#else
#define LANES_SHUFFLE(v, ...) __builtin_shuffle(v, (lanes_i){__VA_ARGS__})
#endif

#if defined(__AVX512F__)
static inline lanes_i lanes_min(lanes_i a, lanes_i b) { return (lanes_i)_mm512_min_epi32((__m512i)a, (__m512i)b); }
static inline lanes_i lanes_max(lanes_i a, lanes_i b) { return (lanes_i)_mm512_max_epi32((__m512i)a, (__m512i)b); }
#elif defined(__AVX2__)
static inline lanes_i lanes_min(lanes_i a, lanes_i b) { return (lanes_i)_mm256_min_epi32((__m256i)a, (__m256i)b); }
static inline lanes_i lanes_max(lanes_i a, lanes_i b) { return (lanes_i)_mm256_max_epi32((__m256i)a, (__m256i)b); }
#else
static inline lanes_i lanes_min(lanes_i a, lanes_i b) { lanes_i m = a < b; return (a & m) | (b & ~m); }
static inline lanes_i lanes_max(lanes_i a, lanes_i b) { lanes_i m = a > b; return (a & m) | (b & ~m); }
#endif
static inline lanes_i lanes_of(int32_t v) { return (lanes_i){0} + v; }
/* Every lane v (not {0} + v: that turns -0 into +0). */
static inline lanes_f lanes_float(float v) { return (lanes_f)lanes_of((int32_t)lb_bits(v)); }
static inline lanes_i lanes_load(const float *x) { lanes_i v; memcpy(&v, x, sizeof v); return v; }

/* The lanes' max / min / sum: halves folded onto each other, lane 0 holding the result. */
static inline lanes_i lanes_add(lanes_i a, lanes_i b) { return a + b; }
#if LANES == 16
#define LANES_FOLD(NAME, OP) \
    static inline int32_t NAME(lanes_i v) { \
        v = OP(v, LANES_SHUFFLE(v, 8, 9, 10, 11, 12, 13, 14, 15, 0, 1, 2, 3, 4, 5, 6, 7)); \
        v = OP(v, LANES_SHUFFLE(v, 4, 5, 6, 7, 0, 1, 2, 3, 4, 5, 6, 7, 0, 1, 2, 3)); \
        v = OP(v, LANES_SHUFFLE(v, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3, 0, 1)); \
        v = OP(v, LANES_SHUFFLE(v, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0)); \
        return v[0]; \
    }
#else
#define LANES_FOLD(NAME, OP) \
    static inline int32_t NAME(lanes_i v) { \
        v = OP(v, LANES_SHUFFLE(v, 4, 5, 6, 7, 0, 1, 2, 3)); \
        v = OP(v, LANES_SHUFFLE(v, 2, 3, 0, 1, 2, 3, 0, 1)); \
        v = OP(v, LANES_SHUFFLE(v, 1, 0, 1, 0, 1, 0, 1, 0)); \
        return v[0]; \
    }
#endif
LANES_FOLD(lanes_max_of, lanes_max)
LANES_FOLD(lanes_min_of, lanes_min)
LANES_FOLD(lanes_sum_of, lanes_add)

/* The last length < LANES elements of a run, padded with NaN (a call: kept out of the loops' bodies). */
static __attribute__((noinline, unused)) lanes_i lanes_load_tail(const float *x, int64_t length) {
    lanes_i v = lanes_of(0x7fc00000);
    memcpy(&v, x, (size_t)length * sizeof(float));
    return v;
}

/* The low / high half of the lanes widened to double. */
#if defined(__AVX512F__)
static inline half_d lanes_low(lanes_f v) { return (half_d)_mm512_cvtps_pd(_mm512_castps512_ps256((__m512)v)); }
static inline half_d lanes_high(lanes_f v) {
    return (half_d)_mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd((__m512)v), 1)));
}
#elif defined(__AVX2__)
static inline half_d lanes_low(lanes_f v) { return (half_d)_mm256_cvtps_pd(_mm256_castps256_ps128((__m256)v)); }
static inline half_d lanes_high(lanes_f v) { return (half_d)_mm256_cvtps_pd(_mm256_extractf128_ps((__m256)v, 1)); }
#else
static inline half_d lanes_low(lanes_f v) {
    half_f half;
    memcpy(&half, &v, sizeof half);
    return __builtin_convertvector(half, half_d);
}
static inline half_d lanes_high(lanes_f v) {
    half_f half;
    memcpy(&half, (const char *)&v + sizeof half, sizeof half);
    return __builtin_convertvector(half, half_d);
}
#endif

#endif
