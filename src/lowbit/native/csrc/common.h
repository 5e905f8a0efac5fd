/* Shared by lowbit's native quantizers: rounding modes and a parallel loop.
 *
 * Every kernel evaluates the same IEEE float operations as the eager torch path, in the same order, so the
 * results are bit-identical (built without fast-math and without FMA contraction; see build.py). */
#ifndef LOWBIT_COMMON_H
#define LOWBIT_COMMON_H

#include <math.h>
#include <stdint.h>
#include <string.h>

/* Rounding modes, numbered as lowbit.native.interface.ROUNDING_CODES. */
enum {
    LB_NEAREST_EVEN, LB_NEAREST_AWAY, LB_NEAREST_TOWARD_ZERO, LB_NEAREST_UP, LB_NEAREST_DOWN,
    LB_TOWARD_ZERO, LB_AWAY_FROM_ZERO, LB_UP, LB_DOWN
};

/* The kernels' `half` argument: what x and out hold, numbered as lowbit.native.interface.STORAGE_CODES. */
enum { LB_STORE_FLOAT32, LB_STORE_BFLOAT16, LB_STORE_FLOAT16 };

#define LB_INLINE static inline __attribute__((always_inline)) /* one copy per constant argument */

static inline float lb_sign(float v) { return v > 0.0f ? 1.0f : (v < 0.0f ? -1.0f : v); } /* torch.sign */

/* floor and ceil built on rintf: the same values and zero signs as floorf / ceilf (each result carries the
 * sign of its input), but GCC 12 vectorises rintf and not floorf under the default -ftrapping-math (floorf
 * must not raise "inexact"), which made the directed modes several times slower. */
static inline float lb_floor(float v) { float r = rintf(v); return copysignf(r > v ? r - 1.0f : r, v); }
static inline float lb_ceil(float v) { float r = rintf(v); return copysignf(r < v ? r + 1.0f : r, v); }

/* rounding.round_to_integer for one float32 value (the mode is a constant in each unswitched loop). */
static inline float lb_round(float v, int mode) {
    float nearest, step;
    switch (mode) {
    case LB_NEAREST_EVEN: return rintf(v);
    case LB_TOWARD_ZERO: return copysignf(lb_floor(fabsf(v)), v);
    case LB_UP: return lb_ceil(v);
    case LB_DOWN: return lb_floor(v);
    case LB_AWAY_FROM_ZERO: return copysignf(lb_ceil(fabsf(v)), v);
    default: break;
    }
    nearest = rintf(v);
    switch (mode) {
    case LB_NEAREST_UP: step = 1.0f; break;
    case LB_NEAREST_DOWN: step = -1.0f; break;
    case LB_NEAREST_AWAY: step = lb_sign(v); break;
    default: step = -lb_sign(v); break; /* LB_NEAREST_TOWARD_ZERO */
    }
    return copysignf(fabsf(v - nearest) == 0.5f ? v + 0.5f * step : nearest, v);
}

/* One copy of LOOP(MODE) per rounding mode, chosen once: each copy vectorises with its mode a constant. */
#define LB_FOR_EACH_MODE(mode, LOOP) \
    switch (mode) { \
    case LB_NEAREST_EVEN: LOOP(LB_NEAREST_EVEN); break; \
    case LB_NEAREST_AWAY: LOOP(LB_NEAREST_AWAY); break; \
    case LB_NEAREST_TOWARD_ZERO: LOOP(LB_NEAREST_TOWARD_ZERO); break; \
    case LB_NEAREST_UP: LOOP(LB_NEAREST_UP); break; \
    case LB_NEAREST_DOWN: LOOP(LB_NEAREST_DOWN); break; \
    case LB_TOWARD_ZERO: LOOP(LB_TOWARD_ZERO); break; \
    case LB_AWAY_FROM_ZERO: LOOP(LB_AWAY_FROM_ZERO); break; \
    case LB_UP: LOOP(LB_UP); break; \
    default: LOOP(LB_DOWN); break; \
    }

/* The mode that rounds the magnitude of a negative value as `mode` rounds the value (up <-> down). */
static inline int lb_mirrored_mode(int mode) {
    switch (mode) {
    case LB_UP: return LB_DOWN;
    case LB_DOWN: return LB_UP;
    case LB_NEAREST_UP: return LB_NEAREST_DOWN;
    case LB_NEAREST_DOWN: return LB_NEAREST_UP;
    default: return mode;
    }
}

static inline uint32_t lb_bits(float v) { uint32_t b; memcpy(&b, &v, 4); return b; }
static inline float lb_float(uint32_t b) { float v; memcpy(&v, &b, 4); return v; }

/* torch.clamp(v, low, high) for low <= high, NaN kept: the value of v < low ? low : (v > high ? high : v),
 * signed zeros included, as a min then a max, each written so that a NaN v compares false and passes through:
 * one instruction each on x86 (minps / maxps keep their second operand when either is NaN), where the nested
 * form takes four compares and three blends without AVX-512 masks. */
static inline float lb_clamp_range(float v, float low, float high) {
    float below = high < v ? high : v;
    return low > below ? low : below;
}

/* torch.clamp(v, -limit, limit), limit >= 0. */
static inline float lb_clamp(float v, float limit) { return lb_clamp_range(v, -limit, limit); }

/* round(v / step) * step on a binary float grid (formats/_float_grid.py's bit path): step is v's exponent
 * field lowered by M binades (mantissa_shift = M << 23), clamped below at smallest_field = the biased
 * exponent of the smallest step << 23 (a normal float32). No clamp to the grid's max: callers add it. */
static inline float lb_grid_round(float v, int32_t mantissa_shift, int32_t smallest_field, int mode) {
    int32_t field = (int32_t)(lb_bits(v) & 0x7f800000u) - mantissa_shift;
    float step = lb_float((uint32_t)(field < smallest_field ? smallest_field : field));
    return lb_round(v / step, mode) * step;
}

/* fn(context, begin, end) over [0, n) in chunks that are multiples of grain, on up to `threads` threads
 * (the caller's thread included); small jobs run on the caller's thread alone. */
typedef void (*lb_range_fn)(const void *context, int64_t begin, int64_t end);
void lb_parallel(int64_t n, int64_t grain, int threads, lb_range_fn fn, const void *context);
/* lb_parallel with threads of our own from `minimum` elements (kernels doing more work per element than a
 * copy); on torch's OpenMP pool (parallel.c) every kernel threads from 2^16 elements. */
void lb_parallel_from(int64_t n, int64_t grain, int threads, int64_t minimum, lb_range_fn fn, const void *context);

#endif
