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
typedef uint32_t lanes_u __attribute__((vector_size(LANES * 4))); /* wrapping adds */
typedef float half_f __attribute__((vector_size(LANES * 2)));
typedef double half_d __attribute__((vector_size(LANES * 4))); /* half the lanes, widened */
#define NONE 0x7fffffff /* bits above every magnitude: the key of a lane left out of a minimum */
#define ALWAYS_INLINE LB_INLINE /* one copy per selection constant */

/* These static helpers inline; GCC's note that 64-byte vector arguments pass differently without AVX-512
 * concerns exported functions only. */
#pragma GCC diagnostic ignored "-Wpsabi"

#if defined(__clang__) || __GNUC__ >= 12
#define LANES_SHUFFLE(v, ...) __builtin_shufflevector(v, v, __VA_ARGS__)
#else
#define LANES_SHUFFLE(v, ...) __builtin_shuffle(v, (lanes_i){__VA_ARGS__})
#endif

/* Two-vector shuffles (indices from 0: a's lanes, then b's). */
#if defined(__clang__) || __GNUC__ >= 12
#define LANES_SHUFFLE2(a, b, ...) __builtin_shufflevector(a, b, __VA_ARGS__)
#else
#define LANES_SHUFFLE2(a, b, ...) __builtin_shuffle(a, b, (lanes_i){__VA_ARGS__})
#endif

/* Across vectors: LANES vectors v[0..LANES) (one per block, say) reduced by OP to v[0], whose lane j is the
 * reduction of v[j]'s lanes (for an order-free OP: max / min). Each level pairs v[2k] and v[2k + 1] and halves
 * every vector's segment of partial results: LO takes the first half of each segment of a, then of b, HI the
 * second halves; OP(LO, HI) keeps the vectors' order. LANES_LEVEL_W_*: the level whose segments are W lanes. */
#if LANES == 16
#define LANES_LEVEL_16_LO 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23
#define LANES_LEVEL_16_HI 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31
#define LANES_LEVEL_8_LO 0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27
#define LANES_LEVEL_8_HI 4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29, 30, 31
#define LANES_LEVEL_4_LO 0, 1, 4, 5, 8, 9, 12, 13, 16, 17, 20, 21, 24, 25, 28, 29
#define LANES_LEVEL_4_HI 2, 3, 6, 7, 10, 11, 14, 15, 18, 19, 22, 23, 26, 27, 30, 31
#define LANES_LEVEL_2_LO 0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30
#define LANES_LEVEL_2_HI 1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31
#else
#define LANES_LEVEL_8_LO 0, 1, 2, 3, 8, 9, 10, 11
#define LANES_LEVEL_8_HI 4, 5, 6, 7, 12, 13, 14, 15
#define LANES_LEVEL_4_LO 0, 1, 4, 5, 8, 9, 12, 13
#define LANES_LEVEL_4_HI 2, 3, 6, 7, 10, 11, 14, 15
#define LANES_LEVEL_2_LO 0, 2, 4, 6, 8, 10, 12, 14
#define LANES_LEVEL_2_HI 1, 3, 5, 7, 9, 11, 13, 15
#endif
#define LANES_LEVEL(v, OP, WIDTH) \
    for (int k_ = 0; k_ < (WIDTH) / 2; k_++) \
        (v)[k_] = OP(LANES_SHUFFLE2((v)[2 * k_], (v)[2 * k_ + 1], LANES_LEVEL_##WIDTH##_LO), \
                     LANES_SHUFFLE2((v)[2 * k_], (v)[2 * k_ + 1], LANES_LEVEL_##WIDTH##_HI));
#if LANES == 16
#define LANES_ACROSS(v, OP) \
    do { LANES_LEVEL(v, OP, 16) LANES_LEVEL(v, OP, 8) LANES_LEVEL(v, OP, 4) LANES_LEVEL(v, OP, 2) } while (0)
#else
#define LANES_ACROSS(v, OP) do { LANES_LEVEL(v, OP, 8) LANES_LEVEL(v, OP, 4) LANES_LEVEL(v, OP, 2) } while (0)
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

/* Whether any lane of v is nonzero (one test instruction where the instruction set has one). */
#if defined(__AVX512F__)
static inline int lanes_any(lanes_i v) { return _mm512_test_epi32_mask((__m512i)v, (__m512i)v) != 0; }
#elif defined(__AVX2__)
static inline int lanes_any(lanes_i v) { return !_mm256_testz_si256((__m256i)v, (__m256i)v); }
#else
static inline lanes_i lanes_or(lanes_i a, lanes_i b) { return a | b; }
LANES_FOLD(lanes_or_of, lanes_or)
static inline int lanes_any(lanes_i v) { return lanes_or_of(v) != 0; }
#endif

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
