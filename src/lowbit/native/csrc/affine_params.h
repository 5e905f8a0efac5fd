/* Affine parameters for csrc/affine.c: one element's rounding, scale rounding (formats/scaling.py) and the
 * parameters derived from a block's min-max (Affine.parameters_from_block), as static inline functions. */
#ifndef LOWBIT_AFFINE_PARAMS_H
#define LOWBIT_AFFINE_PARAMS_H

#include <float.h>
#include "common.h"

/* Numbered as lowbit.native.interface.AFFINE_KINDS, AFFINE_SCALE_DTYPES and AFFINE_LAYOUTS. */
enum { KIND_ASYMMETRIC, KIND_SYMMETRIC, KIND_FULL_RANGE };
enum { SCALE_F32, SCALE_F16, SCALE_BF16 };
enum { LAYOUT_TENSOR, LAYOUT_ROWS, LAYOUT_CHANNELS, LAYOUT_GIVEN };
#define STAT_GRAIN 65536
#define MAX_PARTS 64
#define BATCH 64 /* blocks of a row chunk taken together */

static inline int is_directed(int mode) { return mode >= LB_TOWARD_ZERO; }

/* ---- one element -------------------------------------------------------------------------------------- */
/* rounding.correct_directed: one step of correction against the grid value steps * scale. Each condition is
 * added as 0.0 / 1.0 exactly as eager does (steps + 0.0 turns -0.0 into +0.0 there too). */
static inline float directed_steps(float v, float scale, float steps, int mode) {
    int not_above = mode == LB_DOWN ? 1 : (mode == LB_UP ? 0 : (mode == LB_TOWARD_ZERO ? v >= 0.0f : v < 0.0f));
    steps = steps - (float)(not_above & (steps * scale > v));
    steps = steps + (float)(not_above & ((steps + 1.0f) * scale <= v));
    steps = steps + (float)(!not_above & (steps * scale < v));
    return steps - (float)(!not_above & ((steps - 1.0f) * scale >= v));
}

static inline float round_steps(float v, float scale, float inverse, int mode) {
    float steps = lb_round(v * inverse, mode);
    return is_directed(mode) ? directed_steps(v, scale, steps, mode) : steps;
}

/* bounded: every code's value is finite (checked per parameter set), so the final clamp to +-FLT_MAX cannot
 * change a result and is left out. */
static inline float affine_value(float v, float scale, float inverse, float zero_point, float low, float high,
                                 int mode, int bounded) {
    float codes = lb_clamp_range(round_steps(v, scale, inverse, mode) + zero_point, low, high);
    float value = (codes - zero_point) * scale;
    return bounded ? value : lb_clamp(value, FLT_MAX);
}

/* conditions joined by & (no branch): derive_nearest's loops across blocks vectorise with these helpers */
static inline int values_bounded(float scale, float zero_point, float low, float high) {
    return (fabsf((high - zero_point) * scale) <= FLT_MAX) & (fabsf((low - zero_point) * scale) <= FLT_MAX);
}

/* ---- scales (formats/scaling.py) ---------------------------------------------------------------------- */
static inline float power_of_two(int exponent) { /* 2^exponent as torch.ldexp gives it in float32 */
    if (exponent > 127) return INFINITY;
    if (exponent >= -126) return lb_float((uint32_t)(exponent + 127) << 23);
    return exponent >= -149 ? lb_float(1u << (exponent + 149)) : 0.0f;
}

/* frexp's exponent of a positive normal float32 (mantissa in [0.5, 1)) */
static inline int frexp_exponent(float v) { return (int)(lb_bits(v) >> 23) - 126; }
static inline int is_power_of_two(float v) { return (lb_bits(v) & 0x7fffffu) == 0; }

static inline float safe_scale(float s) { return (fabsf(s) <= FLT_MAX) & (s >= FLT_MIN) ? s : FLT_MIN; }

/* s positive, normal: s where it is a power of two, else power_of_two(frexp_exponent(s)), the next binade's
 * power, built on the bits without a branch (exponent field 254 gives the infinity, as power_of_two(128)) */
static inline float ceil_power_of_two(float s) {
    uint32_t bits = lb_bits(s);
    return (bits & 0x7fffffu) ? lb_float(((bits >> 23) + 1u) << 23) : s;
}

static const float stored_tiny[3] = {FLT_MIN, 6.103515625e-05f, FLT_MIN};
static const float stored_max[3] = {FLT_MAX, 65504.0f, 3.38953139e38f};
static const int stored_bits[3] = {24, 11, 8};

static inline float round_scale(float s, int dtype) {
    if (dtype == SCALE_F32) return s;
    s = s < stored_tiny[dtype] ? stored_tiny[dtype] : (s > stored_max[dtype] ? stored_max[dtype] : s);
    if (dtype == SCALE_F16) return (float)(_Float16)s;
    uint32_t bits = lb_bits(s);
    return lb_float((bits + 0x7fffu + ((bits >> 16) & 1u)) & 0xffff0000u);
}

static inline float round_scale_up(float s, int dtype) {
    float rounded = round_scale(s, dtype);
    if (dtype == SCALE_F32 || !(rounded < s && rounded < stored_max[dtype])) return rounded;
    return rounded + power_of_two(frexp_exponent(rounded) - stored_bits[dtype]);
}

static inline float round_scale_down(float s, int dtype) {
    float rounded = round_scale(s, dtype);
    if (dtype == SCALE_F32 || !(rounded > s && rounded > stored_tiny[dtype])) return rounded;
    int exponent = frexp_exponent(rounded) - is_power_of_two(rounded);
    return rounded - power_of_two(exponent - stored_bits[dtype]);
}

static inline float shorten_scale(float s, int code_bits) { /* 0: unchanged; s positive, normal */
    return code_bits ? lb_float(lb_bits(s) & ~((1u << code_bits) - 1u)) : s;
}

/* ---- derived parameters (Affine.parameters_from_block) ------------------------------------------------ */
/* The format's constants, prepared once per spec by lowbit.native.integer (a ctypes structure). */
typedef struct {
    float q_min, q_max, clamp_low, clamp_high; /* code range; codes outputs take (Affine.clamp_range) */
    int32_t kind, power_of_two, scale_dtype, shorten_bits, mode, unused;
    const float *scales, *zero_points; /* given parameters: one value or one per channel */
    int64_t scale_count, zero_point_count;
} lb_affine_spec;

typedef struct { float scale, inverse, zero_point; int bounded; } affine_params;

/* A batch of blocks' parameters as arrays, one per field (the loops across blocks write them as vectors; an
 * array of affine_params became a scalar store per field and block there). */
typedef struct {
    float scale[BATCH], inverse[BATCH], zero_point[BATCH];
    int32_t bounded[BATCH];
} affine_batch;

static float derived_zero_point(const lb_affine_spec *c, float low, float scale, int pins) {
    if (c->kind != KIND_ASYMMETRIC) return 0.0f;
    float inverse = 1.0f / scale;
    float steps = pins ? rintf(low * inverse) : round_steps(low, scale, inverse, c->mode);
    return lb_clamp_range(c->q_min - steps, c->q_min, c->q_max);
}

static affine_params fit_scale(const lb_affine_spec *c, float raw, float low, float high, int pins) {
    affine_params p;
    raw = safe_scale(raw);
    if (c->power_of_two) raw = ceil_power_of_two(raw);
    if (is_directed(c->mode)) {
        p.scale = shorten_scale(safe_scale(round_scale_down(raw, c->scale_dtype)), c->shorten_bits);
    } else {
        p.scale = safe_scale(round_scale(raw, c->scale_dtype));
        if (c->scale_dtype != SCALE_F32) {
            float zero_point = derived_zero_point(c, low, p.scale, pins), inverse = 1.0f / p.scale;
            if ((high * inverse + zero_point > c->clamp_high + 0.5f) | (low * inverse + zero_point < c->clamp_low - 0.5f))
                p.scale = safe_scale(round_scale_up(raw, c->scale_dtype));
        }
        p.scale = shorten_scale(p.scale, c->shorten_bits);
    }
    p.zero_point = derived_zero_point(c, low, p.scale, pins);
    return p;
}

static float pinned_scale(const lb_affine_spec *c, affine_params p, float low, float high) {
    float above = c->q_max - p.zero_point, below = p.zero_point - c->q_min;
    float from_high = above > 0.0f ? high / (above < 1.0f ? 1.0f : above) : INFINITY;
    float from_low = below > 0.0f ? -low / (below < 1.0f ? 1.0f : below) : INFINITY;
    float pinned = from_high < from_low ? from_high : from_low;
    pinned = pinned < p.scale ? pinned : p.scale;
    pinned = round_scale_down(safe_scale(pinned), c->scale_dtype);
    return shorten_scale(safe_scale(pinned), c->shorten_bits);
}

/* The raw min-max scale of a block whose finite extremes, widened to include zero, are low <= 0 <= high; low /
 * high become the extremes _fit_scale sees (+-max|x| for a symmetric scale). Divisions only, so that a loop
 * over blocks vectorises. */
static inline float raw_scale(const lb_affine_spec *c, float *low, float *high) {
    if (c->kind == KIND_FULL_RANGE) {
        float from_low = *low / c->q_min, from_high = *high / c->q_max;
        return from_low > from_high ? from_low : from_high;
    }
    if (c->kind == KIND_SYMMETRIC) {
        float amax = *high > -*low ? *high : -*low;
        *low = -amax, *high = amax;
        return amax / c->q_max;
    }
    float span = *high - *low, levels = c->q_max - c->q_min; /* span is never NaN: fabsf > max is isinf */
    return fabsf(span) > FLT_MAX ? *high / levels - *low / levels : span / levels;
}

/* the fitted scale and zero point from the raw scale (inverse and bounded: see complete) */
static affine_params fitted(const lb_affine_spec *c, float raw, float low, float high) {
    int pins = c->kind == KIND_ASYMMETRIC && c->mode == LB_TOWARD_ZERO && !c->power_of_two;
    affine_params p = fit_scale(c, raw, low, high, pins);
    if (pins) p.scale = pinned_scale(c, p, low, high);
    return p;
}

static inline void complete(const lb_affine_spec *c, affine_params *p, float inverse) {
    p->inverse = inverse;
    p->bounded = values_bounded(p->scale, p->zero_point, c->clamp_low, c->clamp_high);
}

static affine_params derive(const lb_affine_spec *c, float low, float high) {
    float raw = raw_scale(c, &low, &high);
    affine_params p = fitted(c, raw, low, high);
    complete(c, &p, 1.0f / p.scale);
    return p;
}

/* derive for `count` blocks at once: the divisions in loops of their own (vector divisions) */
static void derive_batch(const lb_affine_spec *c, float *lows, float *highs, int64_t count, affine_params *params) {
    float raws[BATCH], inverses[BATCH];
    for (int64_t k = 0; k < count; k++) raws[k] = raw_scale(c, lows + k, highs + k);
    for (int64_t k = 0; k < count; k++) params[k] = fitted(c, raws[k], lows[k], highs[k]);
    for (int64_t k = 0; k < count; k++) inverses[k] = params[k].scale;
    for (int64_t k = 0; k < count; k++) inverses[k] = 1.0f / inverses[k];
    for (int64_t k = 0; k < count; k++) complete(c, params + k, inverses[k]);
}

/* derive_batch under a nearest mode (`mode`, a constant where inlined) for float32 and bfloat16 scales, as
 * loops without branches (vectorised): per block the operations of fitted and complete in the same order, the
 * helpers below giving the same values as their branching counterparts for the inputs they get. (Directed
 * modes pin or shorten differently, and a float16 scale needs a conversion: derive_batch.) */

/* round_scale / round_scale_up for SCALE_BF16 (s >= FLT_MIN): round_scale_up's step 2^(e - 8), for the
 * rounded scale's frexp exponent e, is one bfloat16 step: the next bfloat16 value, whose bits are the rounded
 * scale's plus 1 << 16 (the rounded scale is at least FLT_MIN and below the largest bfloat16 where it is taken).
 * On the bits, without a branch: the loop across blocks vectorises (a step chosen by exponent field did not). */
LB_INLINE float bf16_scale(float s) {
    s = s > stored_max[SCALE_BF16] ? stored_max[SCALE_BF16] : s;
    uint32_t bits = lb_bits(s);
    return lb_float((bits + 0x7fffu + ((bits >> 16) & 1u)) & 0xffff0000u);
}

LB_INLINE float bf16_scale_up(float s) {
    float rounded = bf16_scale(s);
    return (rounded < s) & (rounded < stored_max[SCALE_BF16]) ? lb_float(lb_bits(rounded) + 0x10000u) : rounded;
}

LB_INLINE float nearest_zero_point(const lb_affine_spec *c, int kind, float low, float inverse, int mode) {
    return kind != KIND_ASYMMETRIC ? 0.0f : lb_clamp_range(c->q_min - lb_round(low * inverse, mode), c->q_min, c->q_max);
}

/* Per block the bfloat16 scale: the rounded raw scale, or the one above where the rounded one clips a code.
 * KIND is a constant in each copy: with the kind a run-time value, GCC 12 left this loop scalar. */
LB_INLINE void bf16_scales(const lb_affine_spec *c, const float *raws, const float *lows, const float *highs,
                           int64_t count, float *scales, int mode, int kind) {
    const float clamp_low = c->clamp_low - 0.5f, clamp_high = c->clamp_high + 0.5f;
    for (int64_t k = 0; k < count; k++) {
        float scale = safe_scale(bf16_scale(raws[k]));
        float inverse = 1.0f / scale, zero_point = nearest_zero_point(c, kind, lows[k], inverse, mode);
        int clips = (highs[k] * inverse + zero_point > clamp_high) | (lows[k] * inverse + zero_point < clamp_low);
        scales[k] = clips ? bf16_scale_up(raws[k]) : scale; /* in [FLT_MIN, bf16 max]: safe_scale keeps it */
    }
}

LB_INLINE int derive_nearest(const lb_affine_spec *c, float *lows, float *highs, int64_t count,
                                           affine_batch *params, int mode) {
    const int dtype = c->scale_dtype, kind = c->kind, power = c->power_of_two;
    if (is_directed(mode) || dtype == SCALE_F16) return 0;
    float raws[BATCH], *scales = params->scale;
    for (int64_t k = 0; k < count; k++) raws[k] = raw_scale(c, lows + k, highs + k);
    for (int64_t k = 0; k < count; k++) {
        float raw = safe_scale(raws[k]);
        raws[k] = power ? ceil_power_of_two(raw) : raw;
    }
    if (dtype == SCALE_BF16 && kind == KIND_ASYMMETRIC)
        bf16_scales(c, raws, lows, highs, count, scales, mode, KIND_ASYMMETRIC);
    else if (dtype == SCALE_BF16)
        bf16_scales(c, raws, lows, highs, count, scales, mode, KIND_SYMMETRIC);
    else
        for (int64_t k = 0; k < count; k++) scales[k] = raws[k];
    for (int64_t k = 0; k < count; k++) scales[k] = shorten_scale(scales[k], c->shorten_bits);
    for (int64_t k = 0; k < count; k++) {
        float scale = scales[k], inverse = 1.0f / scale;
        float zero_point = nearest_zero_point(c, kind, lows[k], inverse, mode);
        params->inverse[k] = inverse, params->zero_point[k] = zero_point;
        params->bounded[k] = values_bounded(scale, zero_point, c->clamp_low, c->clamp_high);
    }
    return 1;
}

/* derive_batch into a batch's arrays (the directed modes and float16 scales, where derive_nearest does not
 * apply). */
static void derive_batch_arrays(const lb_affine_spec *c, float *lows, float *highs, int64_t count,
                                affine_batch *batch) {
    affine_params params[BATCH];
    derive_batch(c, lows, highs, count, params);
    for (int64_t k = 0; k < count; k++) {
        batch->scale[k] = params[k].scale, batch->inverse[k] = params[k].inverse;
        batch->zero_point[k] = params[k].zero_point, batch->bounded[k] = params[k].bounded;
    }
}

/* derive_nearest as a function of its own, one copy per mode (inlined into a kernel's loops, its body kept
 * GCC from vectorising their element passes) */
#define LB_DERIVE_NEAREST(MODE) return derive_nearest(c, lows, highs, count, params, MODE)
static __attribute__((noinline)) int derive_nearest_batch(const lb_affine_spec *c, float *lows, float *highs,
                                                          int64_t count, affine_batch *params, int mode) {
    LB_FOR_EACH_MODE(mode, LB_DERIVE_NEAREST)
    return 0;
}

#endif
