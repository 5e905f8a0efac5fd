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

/* lb_grid_round with the division by the step (a power of two) done as a multiplication by its reciprocal,
 * which is exact whenever the reciprocal is a normal float (both give the one correctly rounded v / step);
 * the one step whose reciprocal is not (2^127, from inf with M = 1) leaves v as it is, as v / step does. */
static inline float grid_round_fast(float v, int32_t mantissa_shift, int32_t smallest_field, int mode) {
    int32_t field = (int32_t)(lb_bits(v) & 0x7f800000u) - mantissa_shift;
    field = field < smallest_field ? smallest_field : field;
    float step = lb_float((uint32_t)field), inverse = lb_float((uint32_t)((254 << 23) - field));
    float scaled = field >= (254 << 23) ? v : v * inverse;
    return lb_round(scaled, mode) * step;
}

/* The grid step 2^(max(floor_log2 |v|, min_exponent) - M) with min_exponent - M >= -149 (any v). */
static inline float general_step(float v, int min_exponent, int mantissa_bits) {
    int exponent = floor_log2_float(v);
    return pow2_float((exponent > min_exponent ? exponent : min_exponent) - mantissa_bits);
}

#define LB_INLINE static inline __attribute__((always_inline))

/* Per block: finite min widened to zero, finite max widened to zero, and whether an inf is present. */
typedef struct { float low, high; int has_inf; } block_extremes;

LB_INLINE block_extremes extremes_of(const float *restrict x, int64_t length) {
    /* bit patterns (signed: the reductions vectorise): the largest non-negative finite value, the largest
     * magnitude of a negative one */
    int32_t high = 0, low = 0, infinite = 0;
    for (int64_t k = 0; k < length; k++) {
        uint32_t bits = lb_bits(x[k]);
        int32_t magnitude = (int32_t)(bits & 0x7fffffffu);
        int32_t finite = magnitude < 0x7f800000 ? magnitude : 0;
        int32_t positive = (int32_t)bits < 0 ? 0 : finite, negative = (int32_t)bits < 0 ? finite : 0;
        high = positive > high ? positive : high;
        low = negative > low ? negative : low;
        infinite |= magnitude == 0x7f800000;
    }
    block_extremes result = {-lb_float((uint32_t)low), lb_float((uint32_t)high), infinite};
    return result;
}

/* max |x| over the elements that are not NaN, as bits: 0x7f800000 when the block holds an inf. */
LB_INLINE int32_t non_nan_abs_max_bits(const float *restrict x, int64_t length) {
    int32_t largest = 0;
    for (int64_t k = 0; k < length; k++) {
        int32_t magnitude = (int32_t)(lb_bits(x[k]) & 0x7fffffffu);
        magnitude = magnitude <= 0x7f800000 ? magnitude : 0;
        largest = magnitude > largest ? magnitude : largest;
    }
    return largest;
}

/* The largest magnitude bit pattern: >= 0x7f800000 when the block holds an inf or a NaN. */
LB_INLINE int32_t abs_max_bits(const float *restrict x, int64_t length) {
    int32_t largest = 0;
    for (int64_t k = 0; k < length; k++) {
        int32_t magnitude = (int32_t)(lb_bits(x[k]) & 0x7fffffffu);
        largest = magnitude > largest ? magnitude : largest;
    }
    return largest;
}

/* max |x| over the finite elements (>= +0). */
LB_INLINE float finite_abs_max_of(const float *restrict x, int64_t length) {
    int32_t largest = 0;
    for (int64_t k = 0; k < length; k++) {
        int32_t magnitude = (int32_t)(lb_bits(x[k]) & 0x7fffffffu);
        magnitude = magnitude < 0x7f800000 ? magnitude : 0;
        largest = magnitude > largest ? magnitude : largest;
    }
    return lb_float((uint32_t)largest);
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

/* Every block of [begin, end) (in units of block_length elements): BLOCK(job, index, x, out, length, MODE);
 */
/* block_fp.nearest_even_exponent for a block without inf: |max| rounded half to even onto
 * significand_bits - 1 fraction bits by an integer add on its float64 bits (the carry moves the exponent). */
static inline int nearest_even_exponent(block_extremes ex, int significand_bits, int min_exponent,
                                        int max_exponent) {
    double magnitude = fabsf(ex.high > -ex.low ? ex.high : -ex.low);
    uint64_t bits;
    memcpy(&bits, &magnitude, 8);
    int dropped = 53 - significand_bits;
    bits += significand_bits == 1 ? 1ull << (dropped - 1) : ((bits >> dropped) & 1) + (1ull << (dropped - 1)) - 1;
    int exponent = (int)(bits >> 52) - 1023;
    return exponent < min_exponent ? min_exponent : (exponent > max_exponent ? max_exponent : exponent);
}

/* The shared exponent of block_fp (significand_bits M) and block_minifloat (M + 1): under nearest_even from
 * one reduction (|max|) unless the block holds an inf; otherwise from the block's extremes. */
LB_INLINE int block_exponent(const float *restrict x, int64_t length, int significand_bits, int mode,
                             int min_exponent, int max_exponent) {
    if (mode == LB_NEAREST_EVEN) {
        int32_t largest = non_nan_abs_max_bits(x, length);
        if (largest < 0x7f800000) {
            block_extremes ex = {0.0f, lb_float((uint32_t)largest), 0};
            return nearest_even_exponent(ex, significand_bits, min_exponent, max_exponent);
        }
    }
    return exponent_from_extremes(extremes_of(x, length), significand_bits, mode, min_exponent, max_exponent);
}

#define LB_FOR_BLOCKS(job, begin, end, BLOCK, MODE) \
    do { \
        const block_geometry geometry = (job)->geometry; \
        int64_t first_index = (begin) / geometry.block_length, last_index = (end) / geometry.block_length; \
        int64_t row = first_index / geometry.blocks_per_row, column = first_index - row * geometry.blocks_per_row; \
        for (int64_t index = first_index; index < last_index; index++) { \
            int64_t start = column * geometry.block_length, length = geometry.row_length - start; \
            const float *block_x = geometry.x + row * geometry.row_length + start; \
            float *block_out = geometry.out + row * geometry.row_length + start; \
            BLOCK(job, index, block_x, block_out, length < geometry.block_length ? length : geometry.block_length, \
                  MODE); \
            if (++column == geometry.blocks_per_row) { column = 0; row++; } \
        } \
    } while (0)

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

static inline float round_saturating(float y, ocp_element element, int mode) {
    return lb_clamp(grid_round_fast(y, element.mantissa_shift, element.smallest_field, mode), element.max_value);
}

/* Without saturation: an overflow goes past max (to inf / NaN) unless the mode stops it at max. */
static inline float round_overflowing(float y, ocp_element element, int mode) {
    float unbounded = grid_round_fast(y, element.mantissa_shift, element.smallest_field, mode);
    float special = element.overflow_inf ? copysignf(INFINITY, y) : NAN;
    int goes_past = y > 0.0f ? element.past_positive : element.past_negative;
    float bounded = element.max_value * lb_sign(y);
    float result = fabsf(unbounded) > element.max_value ? (goes_past ? special : bounded) : unbounded;
    return isinf(y) ? special : result; /* an infinite input is Inf (e5m2) or NaN (e4m3) in every mode */
}

typedef struct {
    const float *x;
    float *out;
    ocp_element element;
    int mode;
} element_job;

#define ELEMENT_LOOP(MODE) \
    do { \
        const float *restrict x = job->x; \
        float *restrict out = job->out; \
        const ocp_element element = job->element; \
        if (element.saturating) for (int64_t i = begin; i < end; i++) out[i] = round_saturating(x[i], element, MODE); \
        else for (int64_t i = begin; i < end; i++) out[i] = round_overflowing(x[i], element, MODE); \
    } while (0)

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

#define LB_FLOAT32_TINY 1.17549435e-38f
#define LB_FLOAT32_MAX 3.40282347e+38f

/* ocp_float.covering_scale (f32 scales) and _inward_scale for the directed modes that need it. */
LB_INLINE float derived_scale(const float *restrict x, int64_t length, const scaled_job *job) {
    block_extremes ex = {0.0f, 0.0f, 0};
    if (job->inward) ex = extremes_of(x, length);
    else ex.high = finite_abs_max_of(x, length);
    float element_max = job->element.max_value;
    float amax = fabsf(ex.high > -ex.low ? ex.high : -ex.low);
    float scale = amax / element_max;
    if (!(isfinite(scale) && scale >= LB_FLOAT32_TINY)) scale = LB_FLOAT32_TINY;
    float larger = next_up(scale);
    if (scale * element_max < amax && isfinite(larger)) scale = larger;
    float smaller = next_down(scale);
    if (smaller * element_max >= amax && smaller >= LB_FLOAT32_TINY) scale = smaller;
    if (!job->inward) return scale;
    smaller = next_down(scale);
    int usable = smaller >= LB_FLOAT32_TINY && scale * element_max != amax;
    int inward = 1;
    if (job->mode != LB_TOWARD_ZERO) {
        int positive = ex.high >= -ex.low;
        int rounded_inward = job->mode == LB_DOWN ? positive : !positive;
        float other = positive ? -ex.low : ex.high;
        inward = rounded_inward && other <= smaller * element_max;
    }
    return usable && inward ? smaller : scale;
}

/* One block's elements; SATURATING and DIRECTED are constants in each copy (the loops vectorise). */
LB_INLINE void scaled_elements(const float *restrict x, float *restrict out, int64_t length, float scale,
                                   ocp_element element, ocp_element nearest, int clamp_inf, int mode,
                                   int saturating, int directed) {
    for (int64_t k = 0; k < length; k++) {
        float v = x[k], y = v / scale;
        float result = (saturating ? round_saturating(y, element, mode) : round_overflowing(y, element, mode)) * scale;
        if (directed) {
            float on_grid = round_saturating(y, nearest, LB_NEAREST_EVEN) * scale;
            result = on_grid == v ? on_grid : result;
        }
        if (clamp_inf) result = isinf(result) & isfinite(v) ? lb_clamp(result, LB_FLOAT32_MAX) : result;
        out[k] = result;
    }
}

LB_INLINE void scaled_block(const scaled_job *job, int64_t index, const float *x, float *out, int64_t length,
                                int mode) {
    float scale = job->scales ? job->scales[index / job->blocks_per_scale] : derived_scale(x, length, job);
    int saturating = job->element.saturating, directed = job->directed, clamp_inf = job->clamp_inf;
    if (saturating && !directed) scaled_elements(x, out, length, scale, job->element, job->nearest, clamp_inf, mode, 1, 0);
    else if (saturating) scaled_elements(x, out, length, scale, job->element, job->nearest, clamp_inf, mode, 1, 1);
    else if (!directed) scaled_elements(x, out, length, scale, job->element, job->nearest, clamp_inf, mode, 0, 0);
    else scaled_elements(x, out, length, scale, job->element, job->nearest, clamp_inf, mode, 0, 1);
}

#define SCALED_LOOP(MODE) LB_FOR_BLOCKS(job, begin, end, scaled_block, MODE)

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

/* ---- shared by the per-block float grids (MX, block_minifloat) --------------------------------------- */
/* round(v / step) * step clamped to +-limit, step = 2^(max(floor_log2 |v|, min_exponent) - M). */
LB_INLINE void grid_block(const float *restrict x, float *restrict out, int64_t length, int mantissa_bits,
                              int min_exponent, float limit, int mode) {
    if (mantissa_bits >= 1 && min_exponent - mantissa_bits >= -126) { /* the bit path: every step normal */
        int32_t shift = mantissa_bits << 23, smallest = (min_exponent - mantissa_bits + 127) << 23;
        for (int64_t k = 0; k < length; k++) out[k] = lb_clamp(grid_round_fast(x[k], shift, smallest, mode), limit);
    } else {
        for (int64_t k = 0; k < length; k++) {
            float step = general_step(x[k], min_exponent, mantissa_bits);
            out[k] = lb_clamp(lb_round(x[k] / step, mode) * step, limit);
        }
    }
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

LB_INLINE void mx_block(const mx_job *job, int64_t index, const float *x, float *out, int64_t length, int mode) {
    (void)index;
    int shared = mx_shared_exponent(finite_abs_max_of(x, length), job);
    int min_exponent = shared + job->element_min_exponent, m = job->mantissa_bits;
    float element_max = job->element_max * pow2_float(shared);
    /* _block_limit: the output dtype's max rounded down onto the block grid, capped at the element max
     * (which is on that grid: the cap alone when it is not above the dtype's max) */
    float limit = element_max;
    if (!(element_max <= job->dtype_max)) {
        int top = floor_log2_float(job->dtype_max);
        float top_step = pow2_float((top > min_exponent ? top : min_exponent) - m);
        limit = lb_clamp(floorf(job->dtype_max / top_step) * top_step, element_max);
    }
    grid_block(x, out, length, m, min_exponent, limit, mode);
}

#define MX_LOOP(MODE) LB_FOR_BLOCKS(job, begin, end, mx_block, MODE)

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

LB_INLINE void block_fp_block(const block_fp_job *job, int64_t index, const float *restrict x,
                                  float *restrict out, int64_t length, int mode) {
    (void)index;
    int exponent = block_exponent(x, length, job->mantissa_bits, mode, job->min_exponent, job->max_exponent);
    int power = exponent - job->mantissa_bits + 1;
    if (job->in_float) { /* _float32_blocks */
        float step = pow2_float(power), top = (float)job->top_code;
        for (int64_t k = 0; k < length; k++) out[k] = lb_clamp(lb_round(x[k] / step, mode), top) * step;
    } else { /* _quantize_blocks in float64, cast back */
        double step = pow2_double(power), top = job->top_code;
        for (int64_t k = 0; k < length; k++)
            out[k] = (float)(clamp_double(round_double((double)x[k] / step, mode), top) * step);
    }
}

#define BLOCK_FP_LOOP(MODE) LB_FOR_BLOCKS(job, begin, end, block_fp_block, MODE)

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

LB_INLINE void minifloat_block_double(const float *restrict x, float *restrict out, int64_t length, int shared,
                                          const block_minifloat_job *job, int mode) {
    int m = job->mantissa_bits, min_exponent = shared - job->binades_below_top;
    double max_value = (2.0 - pow2_double(-m)) * pow2_double(shared);
    for (int64_t k = 0; k < length; k++) {
        int exponent = floor_log2_float(x[k]);
        double step = pow2_double((exponent > min_exponent ? exponent : min_exponent) - m);
        out[k] = (float)clamp_double(round_double((double)x[k] / step, mode) * step, max_value);
    }
}

LB_INLINE void block_minifloat_block(const block_minifloat_job *job, int64_t index, const float *x, float *out,
                                         int64_t length, int mode) {
    (void)index;
    int m = job->mantissa_bits;
    int shared = block_exponent(x, length, m + 1, mode, job->min_shared, job->max_shared);
    if (job->in_float) /* _float32_blocks: max (2 - 2^-M) * 2^t, smallest normal binade t - (2^E - 2) */
        grid_block(x, out, length, m, shared - job->binades_below_top, (2.0f - pow2_float(-m)) * pow2_float(shared),
                   mode);
    else
        minifloat_block_double(x, out, length, shared, job, mode);
}

#define BLOCK_MINIFLOAT_LOOP(MODE) LB_FOR_BLOCKS(job, begin, end, block_minifloat_block, MODE)

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

/* ---- block_log: powers of two with a bias per block (block_log.py, log.round_to_power_of_two) --------- */
typedef struct {
    block_geometry geometry;
    int top_code, max_bias, log_domain, mode;
    float below_sqrt2; /* the largest float32 below sqrt(2) (log_domain, nearest modes) */
} block_log_job;

/* _float_grid.exact_pow2 in float32: exponents below the normal range built 64 binades higher, scaled down. */
static inline float exact_pow2_float(int k) {
    if (k < -126) {
        int shifted = k + 64 < -127 ? -127 : k + 64;
        return lb_float((uint32_t)(shifted + 127) << 23) * 0x1p-64f;
    }
    return lb_float((uint32_t)((k > 128 ? 128 : k) + 127) << 23);
}

static inline int magnitude_mode(int mode, int negative) { /* log._MAGNITUDE_MODES */
    if (!negative) return mode;
    switch (mode) {
    case LB_UP: return LB_DOWN;
    case LB_DOWN: return LB_UP;
    case LB_NEAREST_UP: return LB_NEAREST_DOWN;
    case LB_NEAREST_DOWN: return LB_NEAREST_UP;
    default: return mode;
    }
}

/* log.round_to_power_of_two for one float32 value, the exponents of this block given. */
static inline float power_of_two(float v, int min_exponent, int max_exponent, const block_log_job *job, int mode) {
    float magnitude = fabsf(v);
    magnitude = isfinite(magnitude) ? magnitude : 0.0f;
    int nonzero = magnitude > 0.0f;
    int exponent = nonzero ? floor_log2_float(magnitude) + 1 : 0;
    float mantissa = nonzero ? magnitude / exact_pow2_float(exponent - 1) * 0.5f : 0.0f;
    int below = exponent <= min_exponent || magnitude == 0.0f;
    int lower_code = below ? 0 : exponent - min_exponent;
    float fraction = 2.0f * mantissa - 1.0f;
    if (job->log_domain && mode <= LB_NEAREST_DOWN) fraction = 2.0f * mantissa > job->below_sqrt2 ? 1.0f : 0.0f;
    if (below) { /* _fraction_below_smallest */
        int shift = exponent - min_exponent > 0 ? 0 : exponent - min_exponent;
        float small = mantissa * exact_pow2_float(shift);
        fraction = magnitude > 0.0f && small < LB_FLOAT32_TINY ? LB_FLOAT32_TINY : small;
    }
    float parity = (float)(lower_code % 2);
    float step = lb_round(parity + fraction, magnitude_mode(mode, v < 0.0f)) - parity;
    int top_code = (max_exponent > 127 ? 127 : max_exponent) - min_exponent + 1;
    int code = lower_code + (int)step;
    code = code < top_code ? code : top_code;
    code = isinf(v) ? top_code : code;
    float power = exact_pow2_float(min_exponent + code - 1);
    float value = copysignf(code == 0 ? 0.0f : power, v);
    return isnan(v) ? v : value;
}

/* log.nearest_power_of_two_finite (finite blocks, 2^(min_exponent - 1) normal): rounding the significand to
 * no fraction bits, ties to the even exponent code, by an integer add; clamp; zero below the midpoint. */
LB_INLINE void nearest_power_float(const float *restrict x, float *restrict out, int64_t length, int min_exponent,
                                   int max_exponent) {
    uint32_t parity_offset = (uint32_t)(min_exponent & 1);
    float smallest = exact_pow2_float(min_exponent), largest = exact_pow2_float(max_exponent > 127 ? 127 : max_exponent);
    float midpoint = exact_pow2_float(min_exponent - 1);
    for (int64_t k = 0; k < length; k++) {
        float magnitude = fabsf(x[k]);
        uint32_t bits = lb_bits(magnitude), parity = ((bits >> 23) + parity_offset) & 1u;
        float power = lb_float((parity + bits + (1u << 22) - 1u) & 0x7f800000u);
        power = power < smallest ? smallest : (power > largest ? largest : power);
        out[k] = copysignf(power * (magnitude > midpoint ? 1.0f : 0.0f), x[k]);
    }
}

/* The same in float64 (blocks whose smallest powers are float32 subnormals), cast back to float32. */
LB_INLINE void nearest_power_double(const float *restrict x, float *restrict out, int64_t length, int min_exponent,
                                    int max_exponent) {
    uint64_t parity_offset = (uint64_t)(min_exponent & 1);
    double smallest = pow2_double(min_exponent), largest = pow2_double(max_exponent > 127 ? 127 : max_exponent);
    double midpoint = pow2_double(min_exponent - 1);
    for (int64_t k = 0; k < length; k++) {
        double magnitude = fabs((double)x[k]), power;
        uint64_t bits, parity;
        memcpy(&bits, &magnitude, 8);
        parity = ((bits >> 52) + parity_offset) & 1u;
        bits = (parity + bits + (1ull << 51) - 1u) & 0x7ff0000000000000ull;
        memcpy(&power, &bits, 8);
        power = power < smallest ? smallest : (power > largest ? largest : power);
        out[k] = (float)copysign(power * (magnitude > midpoint ? 1.0 : 0.0), (double)x[k]);
    }
}

LB_INLINE void block_log_block(const block_log_job *job, int64_t index, const float *restrict x, float *restrict out,
                               int64_t length, int mode) {
    (void)index;
    float amax = finite_abs_max_of(x, length);
    int ceil_log2 = -(1 << 20); /* block_log.ceil_log2: an all-zero block */
    if (amax > 0.0f) {
        uint32_t bits = lb_bits(amax);
        int power_of_two_max = bits >= 0x00800000u ? (bits & 0x007fffffu) == 0 : (bits & (bits - 1)) == 0;
        ceil_log2 = floor_log2_float(amax) + !power_of_two_max;
    }
    int bias = job->top_code - ceil_log2;
    bias = bias < 0 ? 0 : (bias > job->max_bias ? job->max_bias : bias);
    int min_exponent = 1 - bias, max_exponent = job->top_code - bias;
    if (mode == LB_NEAREST_EVEN && !job->log_domain && abs_max_bits(x, length) < 0x7f800000) { /* finite */
        if (min_exponent - 1 >= -126) nearest_power_float(x, out, length, min_exponent, max_exponent);
        else nearest_power_double(x, out, length, min_exponent, max_exponent);
        return;
    }
    for (int64_t k = 0; k < length; k++) out[k] = power_of_two(x[k], min_exponent, max_exponent, job, mode);
}

#define BLOCK_LOG_LOOP(MODE) LB_FOR_BLOCKS(job, begin, end, block_log_block, MODE)

static void block_log_range(const void *context, int64_t begin, int64_t end) {
    const block_log_job *job = context;
    LB_FOR_EACH_MODE(job->mode, BLOCK_LOG_LOOP)
}

/* top_code: 2^(W-1) - 1; max_bias: 2^Bw - 1; below_sqrt2 is read under log_domain with a nearest mode. */
void lb_block_log_f32(const float *x, float *out, int64_t rows, int64_t row_length, int64_t block_length,
                      int top_code, int max_bias, int log_domain, float below_sqrt2, int mode, int threads) {
    int64_t blocks_per_row = (row_length + block_length - 1) / block_length;
    block_log_job job = {{x, out, row_length, block_length, blocks_per_row}, top_code, max_bias, log_domain, mode,
                         below_sqrt2};
    run_blocks(&job.geometry, rows, threads, block_log_range, &job);
}
