/* Min / max of the finite elements of whole blocks whose length is a multiple of LANES (affine.c's blocks of
 * 16, 32, ... along rows), LANES consecutive blocks at once or one block alone. Non-finite elements count as +0
 * and every lane starts at +0.0, so no lane ever holds -0.0 (-0.0 < +0.0 is false) and every value is finite:
 * min and max are exact in any order, which lets the reductions take theirs (lanes.h). */
#ifndef LOWBIT_MIN_MAX_LANES_H
#define LOWBIT_MIN_MAX_LANES_H

#include <float.h>
#include "lanes.h"

#define FLOAT_SELECT(mask, yes, no) ((lanes_f)(((lanes_i)(yes) & (mask)) | ((lanes_i)(no) & ~(mask))))

ALWAYS_INLINE lanes_f float_min(lanes_f a, lanes_f b) { return FLOAT_SELECT(b < a, b, a); }
ALWAYS_INLINE lanes_f float_max(lanes_f a, lanes_f b) { return FLOAT_SELECT(b > a, b, a); }

/* One block's lanes: min / max per lane over x[0, n) with non-finite elements as +0, n a multiple of LANES. */
ALWAYS_INLINE void block_lanes(const float *restrict x, int64_t n, lanes_f *lows, lanes_f *highs) {
    const lanes_f zero = {0};
    lanes_f low = zero, high = zero, limit = zero + FLT_MAX;
    for (int64_t i = 0; i < n; i += LANES) {
        lanes_f v = (lanes_f)lanes_load(x + i);
        lanes_f magnitude = FLOAT_SELECT((lanes_i)v < 0, -v, v); /* |v| for the finiteness test */
        v = FLOAT_SELECT(magnitude <= limit, v, zero);          /* the infinities and NaN fail <= */
        low = float_min(low, v), high = float_max(high, v);
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
