/* Block-scaled formats along contiguous runs (formats/ocp_float.py, mx.py, block_fp.py, block_minifloat.py):
 * each block's statistics and the rounding of its elements in one pass over the block, which sits in L1.
 *
 * Geometry: the tensor is `rows` rows of `row_length` contiguous floats, each cut into blocks of
 * `block_length` (the last one shorter: the eager path's zero padding changes no statistic). Every function
 * mirrors the eager float operations in order, so the results are bit-identical. */
#include "common.h"

typedef struct {
    const float *x;
    float *out;
    int64_t row_length, block_length, blocks_per_row;
} block_geometry;

/* ---- exact helpers -------------------------------------------------------------------------------------- */
static inline double round_double(double v, int mode) { /* lb_round for doubles */
    double nearest, step;
    switch (mode) {
    case LB_NEAREST_EVEN: return rint(v);
    case LB_TOWARD_ZERO: return trunc(v);
    case LB_UP: return ceil(v);
    case LB_DOWN: return floor(v);
    case LB_AWAY_FROM_ZERO: return v >= 0.0 ? ceil(v) : floor(v);
    default: break;
    }
    nearest = rint(v);
    double sign = v > 0.0 ? 1.0 : (v < 0.0 ? -1.0 : v);
    switch (mode) {
    case LB_NEAREST_UP: step = 1.0; break;
    case LB_NEAREST_DOWN: step = -1.0; break;
    case LB_NEAREST_AWAY: step = sign; break;
    default: step = -sign; break;
    }
    return copysign(fabs(v - nearest) == 0.5 ? v + 0.5 * step : nearest, v);
}

/* floor(log2 |v|) exactly (subnormals too); zero: -1000; inf / NaN: -1 (as _float_grid.floor_log2). */
static inline int floor_log2_float(float v) {
    uint32_t magnitude = lb_bits(v) & 0x7fffffffu, field = magnitude >> 23;
    if (field == 255) return -1;
    if (field) return (int)field - 127;
    if (!magnitude) return -1000;
    return 31 - __builtin_clz(magnitude) - 149;
}

static inline float pow2_float(int k) { /* 2^k for k in [-149, 127] */
    return k >= -126 ? lb_float((uint32_t)(k + 127) << 23) : lb_float(1u << (k + 149));
}

static inline double pow2_double(int k) { /* torch.ldexp(1.0, k) in float64: inf above, 0 far below */
    uint64_t bits;
    double value;
    if (k > 1023) return INFINITY;
    if (k < -1074) return 0.0;
    bits = k >= -1022 ? (uint64_t)(k + 1023) << 52 : 1ull << (k + 1074);
    memcpy(&value, &bits, 8);
    return value;
}

static inline double clamp_double(double v, double limit) { return v > limit ? limit : (v < -limit ? -limit : v); }

/* The grid step 2^(max(floor_log2 |v|, min_exponent) - M) with min_exponent - M >= -149 (any v). */
static inline float general_step(float v, int min_exponent, int mantissa_bits) {
    int exponent = floor_log2_float(v);
    return pow2_float((exponent > min_exponent ? exponent : min_exponent) - mantissa_bits);
}

/* Per block: finite min widened to zero, finite max widened to zero, and whether an inf is present. */
typedef struct { float low, high; int has_inf; } block_extremes;

static inline block_extremes extremes_of(const float *x, int64_t length) {
    float low = 0.0f, high = 0.0f;
    int infinite = 0;
    for (int64_t k = 0; k < length; k++) {
        uint32_t magnitude = lb_bits(x[k]) & 0x7fffffffu;
        int finite = magnitude < 0x7f800000u;
        float v = finite ? x[k] : 0.0f;
        low = v < low ? v : low;
        high = v > high ? v : high;
        infinite |= magnitude == 0x7f800000u;
    }
    block_extremes result = {low, high, infinite};
    return result;
}

/* max |x| over the finite elements (>= +0). */
static inline float finite_abs_max_of(const float *x, int64_t length) {
    uint32_t largest = 0;
    for (int64_t k = 0; k < length; k++) {
        uint32_t magnitude = lb_bits(x[k]) & 0x7fffffffu;
        magnitude = magnitude < 0x7f800000u ? magnitude : 0u;
        largest = magnitude > largest ? magnitude : largest;
    }
    return lb_float(largest);
}

/* block_fp.exponent_from_extremes: the smallest exponent in [low_e, high_e] at which nothing overflows. */
static int exponent_from_extremes(block_extremes ex, int significand_bits, int mode, int min_exponent,
                                  int max_exponent) {
    double low = ex.low, high = ex.high;
    double magnitude = high > -low ? high : -low;
    int exponent = magnitude > 0.0 ? floor_log2_float((float)magnitude)
                                   : (ex.has_inf ? max_exponent : min_exponent);
    exponent = exponent < min_exponent ? min_exponent : (exponent > max_exponent ? max_exponent : exponent);
    double top_code = pow2_double(significand_bits) - 1.0;
    double factor = pow2_double(significand_bits - 1 - exponent);
    int overflow = round_double(high * factor, mode) > top_code || round_double(low * factor, mode) < -top_code;
    exponent += overflow;
    return exponent > max_exponent ? max_exponent : exponent;
}

#define LB_FOR_BLOCKS(job, begin, end, ...) \
    for (int64_t index = (begin) / (job)->geometry.block_length; index < (end) / (job)->geometry.block_length; index++) { \
        int64_t row = index / (job)->geometry.blocks_per_row, column = index - row * (job)->geometry.blocks_per_row; \
        int64_t first = column * (job)->geometry.block_length; \
        int64_t length = (job)->geometry.row_length - first; \
        length = length < (job)->geometry.block_length ? length : (job)->geometry.block_length; \
        const float *x = (job)->geometry.x + row * (job)->geometry.row_length + first; \
        float *out = (job)->geometry.out + row * (job)->geometry.row_length + first; \
        __VA_ARGS__ \
    }

/* lb_parallel counts elements (it threads from 2^20 of them): each block counts as block_length units, so
 * every chunk boundary is a whole block. */
static void run_blocks(const block_geometry *geometry, int64_t rows, int threads, lb_range_fn fn, const void *job) {
    int64_t blocks = rows * geometry->blocks_per_row;
    int64_t grain = geometry->block_length >= 4096 ? 1 : 4096 / geometry->block_length;
    lb_parallel(blocks * geometry->block_length, grain * geometry->block_length, threads, fn, job);
}

/* ---- OCP elements (ocp_float.round_element) ----------------------------------------------------------- */
typedef struct {
    int32_t mantissa_shift, smallest_field;
    float max_value;
    int saturating, overflow_inf, past_positive, past_negative;
} ocp_element;

static ocp_element make_element(int mantissa_bits, int min_exponent, float max_value, int overflow_kind,
                                int saturate, int mode) {
    /* overflow_kind: 0 the type saturates, 1 overflow -> +-inf (e5m2), 2 overflow -> NaN (e4m3) */
    ocp_element element = {mantissa_bits << 23, (min_exponent - mantissa_bits + 127) << 23, max_value,
                           saturate || overflow_kind == 0, overflow_kind == 1,
                           mode != LB_TOWARD_ZERO && mode != LB_DOWN, mode != LB_TOWARD_ZERO && mode != LB_UP};
    return element;
}

static inline float round_element(float y, const ocp_element *element, int mode) {
    float unbounded = lb_grid_round(y, element->mantissa_shift, element->smallest_field, mode);
    if (element->saturating) return lb_clamp(unbounded, element->max_value);
    float special = element->overflow_inf ? copysignf(INFINITY, y) : NAN;
    int goes_past = y > 0.0f ? element->past_positive : element->past_negative;
    float bounded = element->max_value * lb_sign(y);
    float result = fabsf(unbounded) > element->max_value ? (goes_past ? special : bounded) : unbounded;
    return isinf(y) ? special : result;
}

typedef struct {
    const float *x;
    float *out;
    ocp_element element;
    int mode;
} element_job;

#define ELEMENT_LOOP(MODE) \
    for (int64_t i = begin; i < end; i++) job->out[i] = round_element(job->x[i], &job->element, MODE)

static void element_range(const void *context, int64_t begin, int64_t end) {
    const element_job *job = context;
    LB_FOR_EACH_MODE(job->mode, ELEMENT_LOOP)
}

/* An unscaled OCP element cast: x, out n contiguous float32. */
void lb_ocp_element_f32(const float *x, float *out, int64_t n, int mantissa_bits, int min_exponent,
                        float max_value, int overflow_kind, int saturate, int mode, int threads) {
    element_job job = {x, out, make_element(mantissa_bits, min_exponent, max_value, overflow_kind, saturate, mode),
                       mode};
    lb_parallel(n, 16, threads, element_range, &job);
}

/* ---- scaled OCP elements: s * element(x / s) ----------------------------------------------------------- */
typedef struct {
    block_geometry geometry;
    ocp_element element, nearest;
    int mode, directed, inward, clamp_inf;
    const float *scales; /* given scales (one per group of blocks), or NULL: derived per block */
    int64_t blocks_per_scale;
} scaled_job;

static inline float next_up(float v) { return lb_float(lb_bits(v) + 1); }   /* v > 0 finite */
static inline float next_down(float v) { return lb_float(lb_bits(v) - 1); } /* v > 0 */

/* ocp_float.covering_scale (f32 scales) and _inward_scale for the directed modes that need it. */
static float derived_scale(const float *x, int64_t length, const scaled_job *job) {
    block_extremes ex = extremes_of(x, length);
    float element_max = job->element.max_value;
    float amax = fabsf(ex.high > -ex.low ? ex.high : -ex.low);
    float scale = amax / element_max;
    if (!(isfinite(scale) && scale >= 1.17549435e-38f)) scale = 1.17549435e-38f;
    float larger = next_up(scale);
    if (scale * element_max < amax && isfinite(larger)) scale = larger;
    float smaller = next_down(scale);
    if (smaller * element_max >= amax && smaller >= 1.17549435e-38f) scale = smaller;
    if (!job->inward) return scale;
    smaller = next_down(scale);
    int usable = smaller >= 1.17549435e-38f && scale * element_max != amax;
    int inward = 1;
    if (job->mode != LB_TOWARD_ZERO) {
        int positive = ex.high >= -ex.low;
        int rounded_inward = job->mode == LB_DOWN ? positive : !positive;
        float other = positive ? -ex.low : ex.high;
        inward = rounded_inward && other <= smaller * element_max;
    }
    return usable && inward ? smaller : scale;
}

static inline float scaled_value(float v, float scale, const scaled_job *job, int mode, int directed) {
    float y = v / scale;
    float result = round_element(y, &job->element, mode) * scale;
    if (directed) {
        float nearest = round_element(y, &job->nearest, LB_NEAREST_EVEN) * scale;
        result = nearest == v ? nearest : result;
    }
    if (job->clamp_inf && isinf(result) && isfinite(v)) result = lb_clamp(result, 3.40282347e+38f);
    return result;
}

#define SCALED_LOOP(MODE) \
    LB_FOR_BLOCKS(job, begin, end, { \
        float scale = job->scales ? job->scales[index / job->blocks_per_scale] : derived_scale(x, length, job); \
        if (job->directed) for (int64_t k = 0; k < length; k++) out[k] = scaled_value(x[k], scale, job, MODE, 1); \
        else for (int64_t k = 0; k < length; k++) out[k] = scaled_value(x[k], scale, job, MODE, 0); \
    })

static void scaled_range(const void *context, int64_t begin, int64_t end) {
    const scaled_job *job = context;
    LB_FOR_EACH_MODE(job->mode, SCALED_LOOP)
}

/* Scaled OCP elements over `rows` rows of row_length floats in blocks of block_length; scales: NULL (each
 * block derives its f32 scale, clamp_inf as _quantize_block) or one given scale per blocks_per_scale blocks. */
void lb_ocp_scaled_f32(const float *x, float *out, int64_t rows, int64_t row_length, int64_t block_length,
                       const float *scales, int64_t blocks_per_scale, int mantissa_bits, int min_exponent,
                       float max_value, int overflow_kind, int saturate, int mode, int threads) {
    int64_t blocks_per_row = (row_length + block_length - 1) / block_length;
    scaled_job job = {{x, out, row_length, block_length, blocks_per_row},
                      make_element(mantissa_bits, min_exponent, max_value, overflow_kind, saturate, mode),
                      make_element(mantissa_bits, min_exponent, max_value, overflow_kind, 1, LB_NEAREST_EVEN),
                      mode, mode == LB_UP || mode == LB_DOWN || mode == LB_TOWARD_ZERO || mode == LB_AWAY_FROM_ZERO,
                      mode == LB_UP || mode == LB_DOWN || mode == LB_TOWARD_ZERO, scales == NULL, scales,
                      blocks_per_scale > 0 ? blocks_per_scale : 1};
    run_blocks(&job.geometry, rows, threads, scaled_range, &job);
}

/* ---- MX (mx.py): E8M0 scale 2^s per block, elements on the float grid scaled by 2^s ------------------ */
typedef struct {
    block_geometry geometry;
    int mantissa_bits, element_min_exponent, emax, rule, mode;
    float element_max, dtype_max;
} mx_job;

static int mx_shared_exponent(float amax, const mx_job *job) {
    if (!(amax > 0.0f)) return -127;
    int exponent = floor_log2_float(amax), increment = 0;
    float normal = lb_bits(amax) >= 0x00800000u ? amax : amax * 16777216.0f;
    float mantissa = lb_float((lb_bits(normal) & 0x007fffffu) | (126u << 23)); /* frexp: [0.5, 1) */
    if (job->rule == 1) increment = mantissa * pow2_float(job->emax + 1) > job->element_max;
    else if (job->rule == 2) {
        float top = pow2_float(job->mantissa_bits + 1);
        increment = rintf(mantissa * top) == top;
    }
    int shared = exponent - job->emax + increment;
    return shared < -127 ? -127 : (shared > 127 ? 127 : shared);
}

#define MX_LOOP(MODE) \
    LB_FOR_BLOCKS(job, begin, end, { \
        int shared = mx_shared_exponent(finite_abs_max_of(x, length), job); \
        int min_exponent = shared + job->element_min_exponent, m = job->mantissa_bits; \
        float element_max = job->element_max * pow2_float(shared); \
        int top = floor_log2_float(job->dtype_max); \
        float top_step = pow2_float((top > min_exponent ? top : min_exponent) - m); \
        float limit = lb_clamp(floorf(job->dtype_max / top_step) * top_step, element_max); \
        if (min_exponent - m >= -126) { \
            int32_t smallest = (min_exponent - m + 127) << 23; \
            for (int64_t k = 0; k < length; k++) out[k] = lb_clamp(lb_grid_round(x[k], m << 23, smallest, MODE), limit); \
        } else { \
            for (int64_t k = 0; k < length; k++) { \
                float step = general_step(x[k], min_exponent, m); \
                out[k] = lb_clamp(lb_round(x[k] / step, MODE) * step, limit); \
            } \
        } \
    })

static void mx_range(const void *context, int64_t begin, int64_t end) {
    const mx_job *job = context;
    LB_FOR_EACH_MODE(job->mode, MX_LOOP)
}

/* rule: 0 floor, 1 ceil, 2 even; dtype_max: the output dtype's largest finite value; mantissa_bits >= 1. */
void lb_mx_f32(const float *x, float *out, int64_t rows, int64_t row_length, int64_t block_length,
               int mantissa_bits, int element_min_exponent, int emax, float element_max, int rule, float dtype_max,
               int mode, int threads) {
    int64_t blocks_per_row = (row_length + block_length - 1) / block_length;
    mx_job job = {{x, out, row_length, block_length, blocks_per_row}, mantissa_bits, element_min_exponent, emax,
                  rule, mode, element_max, dtype_max};
    run_blocks(&job.geometry, rows, threads, mx_range, &job);
}

/* ---- block_fp: integer codes times 2^(e - M + 1) per block ------------------------------------------- */
typedef struct {
    block_geometry geometry;
    int mantissa_bits, min_exponent, max_exponent, in_float, mode;
    double top_code;
} block_fp_job;

#define BLOCK_FP_LOOP(MODE) \
    LB_FOR_BLOCKS(job, begin, end, { \
        int exponent = exponent_from_extremes(extremes_of(x, length), job->mantissa_bits, job->mode, \
                                              job->min_exponent, job->max_exponent); \
        int power = exponent - job->mantissa_bits + 1; \
        if (job->in_float) { /* _float32_blocks */ \
            float step = pow2_float(power), top = (float)job->top_code; \
            for (int64_t k = 0; k < length; k++) out[k] = lb_clamp(lb_round(x[k] / step, MODE), top) * step; \
        } else { /* _quantize_blocks in float64, cast back */ \
            double step = pow2_double(power), top = job->top_code; \
            for (int64_t k = 0; k < length; k++) \
                out[k] = (float)(clamp_double(round_double((double)x[k] / step, MODE), top) * step); \
        } \
    })

static void block_fp_range(const void *context, int64_t begin, int64_t end) {
    const block_fp_job *job = context;
    LB_FOR_EACH_MODE(job->mode, BLOCK_FP_LOOP)
}

/* in_float: the eager float32 path applies (nearest mode, M <= 23, smallest step >= 2^-149). */
void lb_block_fp_f32(const float *x, float *out, int64_t rows, int64_t row_length, int64_t block_length,
                     int mantissa_bits, int min_exponent, int max_exponent, double top_code, int in_float, int mode,
                     int threads) {
    int64_t blocks_per_row = (row_length + block_length - 1) / block_length;
    block_fp_job job = {{x, out, row_length, block_length, blocks_per_row}, mantissa_bits, min_exponent,
                        max_exponent, in_float, mode, top_code};
    run_blocks(&job.geometry, rows, threads, block_fp_range, &job);
}

/* ---- block_minifloat: minifloat elements whose top binade t is shared per block ---------------------- */
typedef struct {
    block_geometry geometry;
    int mantissa_bits, binades_below_top, min_shared, max_shared, in_float, mode;
} block_minifloat_job;

static inline void minifloat_block_float(const float *x, float *out, int64_t length, int shared,
                                         const block_minifloat_job *job, int mode) {
    int m = job->mantissa_bits, min_exponent = shared - job->binades_below_top;
    float max_value = (2.0f - pow2_float(-m)) * pow2_float(shared);
    if (m >= 1 && min_exponent - m >= -126) {
        int32_t smallest = (min_exponent - m + 127) << 23;
        for (int64_t k = 0; k < length; k++) out[k] = lb_clamp(lb_grid_round(x[k], m << 23, smallest, mode), max_value);
    } else {
        for (int64_t k = 0; k < length; k++) {
            float step = general_step(x[k], min_exponent, m);
            out[k] = lb_clamp(lb_round(x[k] / step, mode) * step, max_value);
        }
    }
}

static inline void minifloat_block_double(const float *x, float *out, int64_t length, int shared,
                                          const block_minifloat_job *job, int mode) {
    int m = job->mantissa_bits, min_exponent = shared - job->binades_below_top;
    double max_value = (2.0 - pow2_double(-m)) * pow2_double(shared);
    for (int64_t k = 0; k < length; k++) {
        int exponent = floor_log2_float(x[k]);
        double step = pow2_double((exponent > min_exponent ? exponent : min_exponent) - m);
        out[k] = (float)clamp_double(round_double((double)x[k] / step, mode) * step, max_value);
    }
}

#define BLOCK_MINIFLOAT_LOOP(MODE) \
    LB_FOR_BLOCKS(job, begin, end, { \
        int shared = exponent_from_extremes(extremes_of(x, length), job->mantissa_bits + 1, job->mode, \
                                            job->min_shared, job->max_shared); \
        if (job->in_float) minifloat_block_float(x, out, length, shared, job, MODE); \
        else minifloat_block_double(x, out, length, shared, job, MODE); \
    })

static void block_minifloat_range(const void *context, int64_t begin, int64_t end) {
    const block_minifloat_job *job = context;
    LB_FOR_EACH_MODE(job->mode, BLOCK_MINIFLOAT_LOOP)
}

/* binades_below_top: 2^E - 2; in_float: the eager float32 path applies (nearest mode, M <= 22, smallest
 * step >= 2^-149). */
void lb_block_minifloat_f32(const float *x, float *out, int64_t rows, int64_t row_length, int64_t block_length,
                            int mantissa_bits, int binades_below_top, int min_shared, int max_shared, int in_float,
                            int mode, int threads) {
    int64_t blocks_per_row = (row_length + block_length - 1) / block_length;
    block_minifloat_job job = {{x, out, row_length, block_length, blocks_per_row}, mantissa_bits,
                               binades_below_top, min_shared, max_shared, in_float, mode};
    run_blocks(&job.geometry, rows, threads, block_minifloat_range, &job);
}
