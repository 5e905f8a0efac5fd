/* The logarithmic format (formats/log.py): element passes onto signed powers of two, in every deterministic
 * rounding mode, linear or log domain. */
#include <float.h>
#include <stdlib.h>
#include "common.h"
#include "stream.h"

/* ---------------------------------------------------------------- log: powers of two ------------------- */

/* formats/_float_grid.exact_pow2 for float32: exponents below the normal range are built 64 binades up and
 * scaled down (so 2^-150 rounds to 0 as there), above it inf. */
static inline float log_pow2(int32_t e) {
    int low = e < -126;
    int32_t shifted = low ? e + 64 : e;
    shifted = shifted < -127 ? -127 : (shifted > 128 ? 128 : shifted);
    float power = lb_float((uint32_t)(shifted + 127) << 23), lowered = power * 0x1p-64f; /* both: vectorises */
    return low ? lowered : power;
}

/* lb_round for a position in [0, 2] (never NaN), written so that its loops vectorise: the directed modes by
 * an integer conversion (floorf / ceilf stay calls here), the nearest modes with both tie candidates. */
static inline float log_round(float position, int mode) {
    float whole = (float)(int32_t)position; /* floor for nonnegative positions */
    switch (mode) {
    case LB_TOWARD_ZERO: case LB_DOWN: return whole;
    case LB_AWAY_FROM_ZERO: case LB_UP: return whole < position ? whole + 1.0f : whole;
    case LB_NEAREST_EVEN: return rintf(position);
    default: break;
    }
    /* a tie (a half) goes up for nearest_away / nearest_up and down otherwise, the position being >= 0; both
     * candidates computed for every lane, so the loop vectorises */
    float nearest = rintf(position), higher = position + 0.5f, lower = position - 0.5f;
    float tie_value = mode == LB_NEAREST_AWAY || mode == LB_NEAREST_UP ? higher : lower;
    return fabsf(position - nearest) == 0.5f ? tie_value : nearest;
}

typedef struct {
    const float *x;
    float *out;
    int32_t min_exponent, top_code;
    float below_sqrt2; /* the largest float32 below sqrt(2) */
    int log_domain, mode, streamed;
} log_job;

/* The exponent code of v: the lower code plus its rounding by the fraction of the way to the next power
 * (ties to the even code by the parity), clamped to top_code. */
static inline int32_t log_code(float v, int32_t lower_code, float fraction, int32_t top_code, int mode) {
    float parity = (float)(lower_code & 1);
    float position = parity + fraction;
    float negative = log_round(position, lb_mirrored_mode(mode)), positive = log_round(position, mode);
    float rounded = v < 0.0f ? negative : positive;
    int32_t code = lower_code + (int32_t)(rounded - parity);
    return code < top_code ? code : top_code;
}

/* round_to_power_of_two for one float32, its operations in the same order. Tests on the magnitude are done
 * on its bits (integer selects on float compares keep GCC from vectorising). */
static inline float log_value(float v, int32_t min_exponent, int32_t top_code, float below_sqrt2, int log_domain,
                              int mode) {
    uint32_t bits = lb_bits(v) & 0x7fffffffu;
    int finite = bits < 0x7f800000u, subnormal = bits < 0x00800000u;
    float magnitude = finite ? lb_float(bits) : 0.0f;
    uint32_t kept = finite ? bits : 0u; /* magnitude's bits */
    int nonzero = kept != 0u;
    float raised = magnitude * 0x1p64f; /* computed for every lane: a conditional product does not vectorise */
    uint32_t scaled = subnormal ? lb_bits(raised) : kept;
    int32_t exponent = ((int32_t)(scaled >> 23) - 126 - 64 * subnormal) & -nonzero;
    /* mantissa = magnitude / 2^exponent in [0.5, 1): the scaled value's bits with the exponent field of 0.5 */
    float mantissa = nonzero ? lb_float((scaled & 0x007fffffu) | 0x3f000000u) : 0.0f;
    int32_t above_smallest = exponent - min_exponent; /* > 0 at and above 2^min_exponent */
    int32_t lower_code = (above_smallest > 0 ? above_smallest : 0) & -nonzero;
    int below = lower_code == 0; /* zero, or under 2^min_exponent */
    float fraction = 2.0f * mantissa - 1.0f;
    if (log_domain) fraction = 2.0f * mantissa > below_sqrt2 ? 1.0f : 0.0f;
    int32_t shift = above_smallest < 0 ? above_smallest : 0;
    float small = mantissa * log_pow2(shift);
    small = nonzero ? (small < FLT_MIN ? FLT_MIN : small) : small;
    fraction = below ? small : fraction;
    int32_t code = log_code(v, lower_code, fraction, top_code, mode);
    code = bits == 0x7f800000u ? top_code : code;
    float power = log_pow2(min_exponent + code - 1);
    float value = copysignf(code == 0 ? 0.0f : power, v);
    return v != v ? v : value;
}

/* log_value where -125 <= min_exponent <= 126 (the caller checks): every power is a normal float32, so the
 * same decisions come from the bits with fewer steps (and this loop vectorises). */
static inline float log_value_normal(float v, int32_t min_exponent, int32_t top_code, float below_sqrt2,
                                     int log_domain, int mode) {
    uint32_t bits = lb_bits(v) & 0x7fffffffu;
    /* inf (and NaN, whose result is replaced) as the largest float: it rounds to the top code as inf must */
    uint32_t kept = bits < 0x7f7fffffu ? bits : 0x7f7fffffu;
    int32_t lower_code = (int32_t)(kept >> 23) - 126 - min_exponent;
    lower_code = lower_code > 0 ? lower_code : 0; /* 0 under 2^min_exponent */
    float doubled = lb_float(0x3f800000u | (kept & 0x007fffffu)); /* 2 * mantissa, in [1, 2) */
    float fraction = log_domain ? (doubled > below_sqrt2 ? 1.0f : 0.0f) : doubled - 1.0f;
    /* |x| / 2^min_exponent, rounded once as mantissa * 2^shift is; anything under the smallest normal becomes
     * it (the eager clamp), so fractions that the eager power 2^shift flushes to 0 agree too */
    float small = lb_float(kept) * lb_float((uint32_t)(127 - min_exponent) << 23);
    small = small < FLT_MIN ? FLT_MIN : small;
    small = kept == 0u ? 0.0f : small;
    fraction = lower_code == 0 ? small : fraction;
    int32_t code = log_code(v, lower_code, fraction, top_code, mode);
    float power = lb_float((uint32_t)(min_exponent + code - 1 + 127) << 23);
    float value = copysignf(code == 0 ? 0.0f : power, v);
    return v != v ? v : value;
}

/* log.nearest_power_of_two (the eager path of nearest_even in the linear domain, 2^(min_exponent - 1) a
 * normal float32): round the significand to no fraction bits, ties to the even exponent code by adding the
 * parity, clamp, zero at or under the midpoint 2^(min_exponent - 1), sign copied, NaN kept. */
static inline float log_nearest_even(float v, uint32_t parity_add, float smallest, float largest, float half) {
    uint32_t bits = lb_bits(v) & 0x7fffffffu;
    uint32_t parity = ((bits >> 23) + parity_add) & 1u;
    float power = lb_float((parity + bits + 0x3fffffu) & 0x7f800000u);
    power = power < smallest ? smallest : power;
    power = power > largest ? largest : power;
    power = lb_float(bits) <= half ? 0.0f : power;
    power = copysignf(power, v);
    return v != v ? v : power;
}

#define LOG_LOOP(MODE) \
    if (normal && log_domain) \
        for (int64_t i = begin; i < end; i++) out[i] = log_value_normal(x[i], min_exponent, top_code, below_sqrt2, 1, MODE); \
    else if (normal) \
        for (int64_t i = begin; i < end; i++) out[i] = log_value_normal(x[i], min_exponent, top_code, below_sqrt2, 0, MODE); \
    else if (log_domain) \
        for (int64_t i = begin; i < end; i++) out[i] = log_value(x[i], min_exponent, top_code, below_sqrt2, 1, MODE); \
    else \
        for (int64_t i = begin; i < end; i++) out[i] = log_value(x[i], min_exponent, top_code, below_sqrt2, 0, MODE)

static void log_span(const void *context, const float *x, float *out, int64_t n) {
    const log_job *job = context;
    int64_t begin = 0, end = n;
    int32_t min_exponent = job->min_exponent, top_code = job->top_code;
    float below_sqrt2 = job->below_sqrt2;
    int log_domain = job->log_domain, normal = min_exponent >= -125 && min_exponent <= 126;
    if (job->mode == LB_NEAREST_EVEN && !log_domain && min_exponent >= -125 && min_exponent <= 127) {
        uint32_t parity_add = (uint32_t)min_exponent & 1u;
        float smallest = lb_float((uint32_t)(min_exponent + 127) << 23), half = lb_float((uint32_t)(min_exponent + 126) << 23);
        float largest = lb_float((uint32_t)(min_exponent + top_code - 1 + 127) << 23);
        for (int64_t i = begin; i < end; i++) out[i] = log_nearest_even(x[i], parity_add, smallest, largest, half);
        return;
    }
    LB_FOR_EACH_MODE(job->mode, LOG_LOOP)
}

static void log_range(const void *context, int64_t begin, int64_t end) {
    const log_job *job = context;
    lb_spans(job, job->x, job->out, job->streamed, begin, end, log_span);
}

/* log_domain only for the nearest modes (the caller passes 0 otherwise). */
void lb_log_f32(const float *x, float *out, int64_t n, int min_exponent, int top_code, float below_sqrt2,
                int log_domain, int mode, int half, int threads) {
    log_job job = {x, out, min_exponent, top_code, below_sqrt2, log_domain, mode, lb_storage(n, threads, half)};
    lb_parallel(n, 16, threads, log_range, &job);
}

