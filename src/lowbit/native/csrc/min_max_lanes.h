/* Min / max of the finite elements of whole blocks whose length is a multiple of LANES (affine.c's blocks of
 * 16, 32, ... along rows), LANES consecutive blocks at once or one block alone. Non-finite elements count as +0
 * and every lane starts at +0.0, so no lane ever holds -0.0 (-0.0 < +0.0 is false) and every value is finite:
 * min and max are exact in any order, which lets the reductions take theirs (lanes.h). */
#ifndef LOWBIT_MIN_MAX_LANES_H
#define LOWBIT_MIN_MAX_LANES_H

#include <float.h>
#include "lanes.h"

#define FLOAT_SELECT(mask, yes, no) ((lanes_f)(((lanes_i)(yes) & (mask)) | ((lanes_i)(no) & ~(mask))))

/* b < a ? b : a, and b > a ? b : a (a where either is NaN, or both are zeros): what x86's min / max
 * instructions compute with b first, one instruction where the compiler's generic code takes two. */
#if defined(__AVX512F__)
ALWAYS_INLINE lanes_f float_min(lanes_f a, lanes_f b) { return (lanes_f)_mm512_min_ps((__m512)b, (__m512)a); }
ALWAYS_INLINE lanes_f float_max(lanes_f a, lanes_f b) { return (lanes_f)_mm512_max_ps((__m512)b, (__m512)a); }
#elif defined(__AVX2__)
ALWAYS_INLINE lanes_f float_min(lanes_f a, lanes_f b) { return (lanes_f)_mm256_min_ps((__m256)b, (__m256)a); }
ALWAYS_INLINE lanes_f float_max(lanes_f a, lanes_f b) { return (lanes_f)_mm256_max_ps((__m256)b, (__m256)a); }
#else
ALWAYS_INLINE lanes_f float_min(lanes_f a, lanes_f b) { return FLOAT_SELECT(b < a, b, a); }
ALWAYS_INLINE lanes_f float_max(lanes_f a, lanes_f b) { return FLOAT_SELECT(b > a, b, a); }
#endif

/* One block's lanes: min / max per lane over x[0, n) with non-finite elements as +0, n a multiple of LANES. */
ALWAYS_INLINE void block_lanes(const float *restrict x, int64_t n, lanes_f *lows, lanes_f *highs) {
    const lanes_f zero = {0};
    lanes_f low = zero, high = zero;
    for (int64_t i = 0; i < n; i += LANES) {
        lanes_i raw = lanes_load(x + i);
#if defined(__AVX512F__)
        /* the non-finite lanes left out: the same as +0, since low <= +0 <= high in every lane */
        __mmask16 finite = _mm512_cmplt_epi32_mask((__m512i)(raw & 0x7fffffff), _mm512_set1_epi32(0x7f800000));
        low = (lanes_f)_mm512_mask_min_ps((__m512)low, finite, (__m512)raw, (__m512)low);
        high = (lanes_f)_mm512_mask_max_ps((__m512)high, finite, (__m512)raw, (__m512)high);
#else
        const lanes_f limit = zero + FLT_MAX;
        lanes_f v = (lanes_f)raw, magnitude = (lanes_f)(raw & 0x7fffffff); /* |v| for the finiteness test */
        v = (lanes_f)(raw & (lanes_i)(magnitude <= limit));                /* the infinities and NaN fail <= */
        low = float_min(low, v), high = float_max(high, v);
#endif
    }
    *lows = low, *highs = high;
}

/* One block x[0, n): its min into *low, its max into *high. */
ALWAYS_INLINE void block_min_max(const float *restrict x, int64_t n, float *low, float *high) {
    lanes_f lows, highs;
    block_lanes(x, n, &lows, &highs);
    float a = 0.0f, b = 0.0f;
    for (int k = 0; k < LANES; k++) a = lows[k] < a ? lows[k] : a, b = highs[k] > b ? highs[k] : b;
    *low = a, *high = b;
}

/* LANES consecutive blocks of n elements each from x: block j's min into low[j], its max into high[j]. */
ALWAYS_INLINE void blocks_min_max(const float *restrict x, int64_t n, float *low, float *high) {
    lanes_f lows[LANES], highs[LANES];
    for (int j = 0; j < LANES; j++) block_lanes(x + j * n, n, lows + j, highs + j);
    LANES_ACROSS(lows, float_min);
    LANES_ACROSS(highs, float_max);
    memcpy(low, lows, sizeof lows[0]);
    memcpy(high, highs, sizeof highs[0]);
}

#endif
