/* Min / max of the finite elements of whole blocks whose length is a multiple of 16 (affine.c's blocks along
 * rows), one block at a time or LB_LANES consecutive blocks at once. Non-finite elements count as +0 and every
 * lane starts at +0.0, so no lane ever holds -0.0 (-0.0 < +0.0 is false) and every value is finite: min and
 * max are exact in any order, which lets the reductions below take theirs. Vectors are as wide as the
 * target's registers (GCC lowers wider generic vectors through the stack): 16 lanes with AVX-512, 8 with
 * AVX, else 4. */
#ifndef LOWBIT_MIN_MAX_LANES_H
#define LOWBIT_MIN_MAX_LANES_H

#include <float.h>
#include "common.h"

#if defined(__AVX512F__)
#define LB_LANES 16
#elif defined(__AVX__)
#define LB_LANES 8
#else
#define LB_LANES 4
#endif
typedef float lb_fv __attribute__((vector_size(4 * LB_LANES)));
typedef int32_t lb_iv __attribute__((vector_size(4 * LB_LANES)));
typedef float lb_f8 __attribute__((vector_size(32)));
typedef int32_t lb_i8 __attribute__((vector_size(32)));
typedef float lb_f4 __attribute__((vector_size(16)));
typedef int32_t lb_i4 __attribute__((vector_size(16)));

#define LB_SELECT(mask, yes, no, F, I) ((F)(((I)(yes) & (mask)) | ((I)(no) & ~(mask))))
#define LB_ALWAYS_INLINE static inline __attribute__((always_inline))

/* Two-vector shuffles (indices from 0: a's lanes, then b's): __builtin_shufflevector where the compiler has
 * it (clang, GCC 12+), else GCC's __builtin_shuffle. */
#if defined(__clang__) || __GNUC__ >= 12
#define LB_SHUFFLE2(a, b, ...) __builtin_shufflevector(a, b, __VA_ARGS__)
#else
#define LB_SHUFFLE2(a, b, ...) __builtin_shuffle(a, b, (lb_iv){__VA_ARGS__})
#endif

/* One vector of x with its non-finite lanes set to +0 (|v| > FLT_MAX: the infinities and NaN fail <=). */
LB_ALWAYS_INLINE lb_fv finite_lanes(const float *x) {
    const lb_fv zero = {0};
    lb_fv v, limit = zero + FLT_MAX;
    memcpy(&v, x, sizeof v);
    lb_fv magnitude = LB_SELECT((lb_iv)v < 0, -v, v, lb_fv, lb_iv);
    return LB_SELECT(magnitude <= limit, v, zero, lb_fv, lb_iv);
}

LB_ALWAYS_INLINE lb_fv lanes_min(lb_fv a, lb_fv b) { return LB_SELECT(b < a, b, a, lb_fv, lb_iv); }
LB_ALWAYS_INLINE lb_fv lanes_max(lb_fv a, lb_fv b) { return LB_SELECT(b > a, b, a, lb_fv, lb_iv); }

/* One block's lanes: min / max per lane over x[0, n), n a multiple of LB_LANES. */
LB_ALWAYS_INLINE void block_lanes(const float *restrict x, int64_t n, lb_fv *lows, lb_fv *highs) {
    const lb_fv zero = {0};
    lb_fv low = zero, high = zero;
    for (int64_t i = 0; i < n; i += LB_LANES) {
        lb_fv v = finite_lanes(x + i);
        low = lanes_min(low, v), high = lanes_max(high, v);
    }
    *lows = low, *highs = high;
}

/* lanes -> half as many (the low half against the high half) */
#define LB_FOLD(LOWS, HIGHS, F, I, FH, IH) \
    FH LOWS##h, HIGHS##h; \
    { \
        FH low_parts[2], high_parts[2]; \
        memcpy(low_parts, &LOWS, sizeof LOWS); \
        memcpy(high_parts, &HIGHS, sizeof HIGHS); \
        LOWS##h = LB_SELECT(low_parts[1] < low_parts[0], low_parts[1], low_parts[0], FH, IH); \
        HIGHS##h = LB_SELECT(high_parts[1] > high_parts[0], high_parts[1], high_parts[0], FH, IH); \
    }

/* One block x[0, n), n a multiple of 16: its min into *low, its max into *high. */
LB_ALWAYS_INLINE void block_min_max(const float *restrict x, int64_t n, float *low, float *high) {
    lb_fv lows, highs;
    block_lanes(x, n, &lows, &highs);
#if LB_LANES == 16
    LB_FOLD(lows, highs, lb_fv, lb_iv, lb_f8, lb_i8)
    LB_FOLD(lowsh, highsh, lb_f8, lb_i8, lb_f4, lb_i4)
    lb_f4 lo4 = lowshh, hi4 = highshh;
#elif LB_LANES == 8
    LB_FOLD(lows, highs, lb_fv, lb_iv, lb_f4, lb_i4)
    lb_f4 lo4 = lowsh, hi4 = highsh;
#else
    lb_f4 lo4 = lows, hi4 = highs;
#endif
    float a = lo4[0] < lo4[1] ? lo4[0] : lo4[1], b = lo4[2] < lo4[3] ? lo4[2] : lo4[3];
    float c = hi4[0] > hi4[1] ? hi4[0] : hi4[1], d = hi4[2] > hi4[3] ? hi4[2] : hi4[3];
    *low = a < b ? a : b;
    *high = c > d ? c : d;
}

/* Transposed reduction: LB_LANES vectors (one per block) to one vector whose lane j reduces vector j. Each
 * level pairs vectors 2i and 2i + 1 and halves every block's segment of partial results: `lo` takes the first
 * half of each segment of a, then of b, `hi` the second halves; their min (max) keeps the blocks in order. */
#if LB_LANES == 16
#define LB_LEVEL_16_LO 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23
#define LB_LEVEL_16_HI 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31
#define LB_LEVEL_8_LO 0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27
#define LB_LEVEL_8_HI 4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29, 30, 31
#define LB_LEVEL_4_LO 0, 1, 4, 5, 8, 9, 12, 13, 16, 17, 20, 21, 24, 25, 28, 29
#define LB_LEVEL_4_HI 2, 3, 6, 7, 10, 11, 14, 15, 18, 19, 22, 23, 26, 27, 30, 31
#define LB_LEVEL_2_LO 0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30
#define LB_LEVEL_2_HI 1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31
#elif LB_LANES == 8
#define LB_LEVEL_8_LO 0, 1, 2, 3, 8, 9, 10, 11
#define LB_LEVEL_8_HI 4, 5, 6, 7, 12, 13, 14, 15
#define LB_LEVEL_4_LO 0, 1, 4, 5, 8, 9, 12, 13
#define LB_LEVEL_4_HI 2, 3, 6, 7, 10, 11, 14, 15
#define LB_LEVEL_2_LO 0, 2, 4, 6, 8, 10, 12, 14
#define LB_LEVEL_2_HI 1, 3, 5, 7, 9, 11, 13, 15
#else
#define LB_LEVEL_4_LO 0, 1, 4, 5
#define LB_LEVEL_4_HI 2, 3, 6, 7
#define LB_LEVEL_2_LO 0, 2, 4, 6
#define LB_LEVEL_2_HI 1, 3, 5, 7
#endif

/* One level over the WIDTH vectors of lows and highs whose segments are WIDTH lanes long, leaving WIDTH / 2. */
#define LB_LEVEL(WIDTH) \
    for (int k = 0; k < (WIDTH) / 2; k++) { \
        lb_fv a = lows[2 * k], b = lows[2 * k + 1], c = highs[2 * k], d = highs[2 * k + 1]; \
        lows[k] = lanes_min(LB_SHUFFLE2(a, b, LB_LEVEL_##WIDTH##_LO), LB_SHUFFLE2(a, b, LB_LEVEL_##WIDTH##_HI)); \
        highs[k] = lanes_max(LB_SHUFFLE2(c, d, LB_LEVEL_##WIDTH##_LO), LB_SHUFFLE2(c, d, LB_LEVEL_##WIDTH##_HI)); \
    }

/* LB_LANES consecutive blocks of n elements each (n a multiple of 16) from x: block j's min into low[j], its
 * max into high[j]. */
LB_ALWAYS_INLINE void blocks_min_max(const float *restrict x, int64_t n, float *low, float *high) {
    lb_fv lows[LB_LANES], highs[LB_LANES];
    for (int j = 0; j < LB_LANES; j++) block_lanes(x + j * n, n, lows + j, highs + j);
#if LB_LANES == 16
    LB_LEVEL(16)
#endif
#if LB_LANES >= 8
    LB_LEVEL(8)
#endif
    LB_LEVEL(4)
    LB_LEVEL(2)
    memcpy(low, lows, sizeof lows[0]);
    memcpy(high, highs, sizeof highs[0]);
}

#endif
