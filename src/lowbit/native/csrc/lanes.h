/* Sixteen float / int32 lanes in GCC vector types (AVX-512: one register; AVX2: two), shared by the sign
 * kernels (sign.c) and binary_residual (residual.c). Portable to GCC 9+ and clang: __builtin_shufflevector
 * where the compiler has it (clang, GCC 12+), else __builtin_shuffle and halves through memcpy. */
#ifndef LOWBIT_LANES_H
#define LOWBIT_LANES_H

#include "common.h"

/* The lanes' order does not matter to the sign statistics: maxima, minima and counts are exact, and the sum
 * is certified for any order (sign.c, certified_mean). Compares give -1 / 0 per lane. A run's last partial
 * vector is padded with NaN, which no selection keeps. */
typedef float lanes_f __attribute__((vector_size(64)));
typedef int32_t lanes_i __attribute__((vector_size(64)));
typedef float half_f __attribute__((vector_size(32)));
typedef double half_d __attribute__((vector_size(64)));
#define LANES 16
#define NONE 0x7fffffff /* bits above every magnitude: the key of a lane left out of a minimum */
#define ALWAYS_INLINE static inline __attribute__((always_inline)) /* one copy per selection constant */

/* These static helpers inline; GCC's note that 64-byte vector arguments pass differently without AVX-512
 * (AVX2-only machines) concerns exported functions only. */
#pragma GCC diagnostic ignored "-Wpsabi"

#if defined(__clang__) || __GNUC__ >= 12
#define LANES_SHUFFLE(v, ...) __builtin_shufflevector(v, v, __VA_ARGS__)
#else
#define LANES_SHUFFLE(v, ...) __builtin_shuffle(v, (lanes_i){__VA_ARGS__})
#endif

static inline lanes_i lanes_min(lanes_i a, lanes_i b) { lanes_i m = a < b; return (a & m) | (b & ~m); }
static inline lanes_i lanes_max(lanes_i a, lanes_i b) { lanes_i m = a > b; return (a & m) | (b & ~m); }
static inline lanes_i lanes_of(int32_t v) { return (lanes_i){0} + v; }
static inline lanes_i lanes_load(const float *x) { lanes_i v; memcpy(&v, x, sizeof v); return v; }

/* The lanes' max / min / sum: halves folded onto each other, lane 0 holding the result. */
static inline lanes_i lanes_add(lanes_i a, lanes_i b) { return a + b; }
#define LANES_FOLD(NAME, OP) \
    static inline int32_t NAME(lanes_i v) { \
        v = OP(v, LANES_SHUFFLE(v, 8, 9, 10, 11, 12, 13, 14, 15, 0, 1, 2, 3, 4, 5, 6, 7)); \
        v = OP(v, LANES_SHUFFLE(v, 4, 5, 6, 7, 0, 1, 2, 3, 4, 5, 6, 7, 0, 1, 2, 3)); \
        v = OP(v, LANES_SHUFFLE(v, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3, 0, 1)); \
        v = OP(v, LANES_SHUFFLE(v, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0)); \
        return v[0]; \
    }
LANES_FOLD(lanes_max_of, lanes_max)
LANES_FOLD(lanes_min_of, lanes_min)
LANES_FOLD(lanes_sum_of, lanes_add)

/* The last length < 16 elements of a run, padded with NaN (a call: kept out of the loops' bodies). */
static __attribute__((noinline, unused)) lanes_i lanes_load_tail(const float *x, int64_t length) {
    lanes_i v = lanes_of(0x7fc00000);
    memcpy(&v, x, (size_t)length * sizeof(float));
    return v;
}

/* The low / high eight lanes widened to double (halves by memcpy where __builtin_shufflevector is missing:
 * GCC before 12; a few per cent slower there). */
#if defined(__clang__) || __GNUC__ >= 12
static inline half_d lanes_low(lanes_f v) { return __builtin_convertvector(__builtin_shufflevector(v, v, 0, 1, 2, 3, 4, 5, 6, 7), half_d); }
static inline half_d lanes_high(lanes_f v) { return __builtin_convertvector(__builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15), half_d); }
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
