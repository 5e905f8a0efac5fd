/* Per-block exponents: MX (mx.py), block_fp (block_fp.py) and block_minifloat (block_minifloat.py). */
#include "block_common.h"

/* ---- MX (mx.py): E8M0 scale 2^s per block, elements on the float grid scaled by 2^s ------------------ */
/* The shared exponent's rule, numbered as lowbit.native.interface.SCALE_RULES. */
enum { LB_SCALE_RULE_FLOOR, LB_SCALE_RULE_CEIL, LB_SCALE_RULE_EVEN };

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
    if (job->rule == LB_SCALE_RULE_CEIL) increment = mantissa * pow2_float(job->emax + 1) > job->element_max;
    else if (job->rule == LB_SCALE_RULE_EVEN) {
        float top = pow2_float(job->mantissa_bits + 1);
        increment = rintf(mantissa * top) == top;
    }
    int shared = exponent - job->emax + increment;
    return shared < -127 ? -127 : (shared > 127 ? 127 : shared);
}

/* One block's shared exponent s (its grid and limit follow from it): a plain int32 array across a group's
 * blocks, which the loops across blocks read and write as vectors (a struct of an int and a float became
 * shuffles there). */
typedef int32_t mx_params;

LB_INLINE mx_params mx_stat(const mx_job *job, int64_t index, const float *restrict x, int64_t length, int mode) {
    (void)index, (void)mode;
    return mx_shared_exponent(finite_abs_max_of(x, length), job);
}

/* _block_limit: the output dtype's max rounded down onto the block grid, capped at the element max (which is
 * on that grid: the cap alone when it is not above the dtype's max). */
static inline float mx_limit(const mx_job *job, int shared) {
    int min_exponent = shared + job->element_min_exponent, m = job->mantissa_bits;
    float element_max = job->element_max * pow2_float(shared);
    if (element_max <= job->dtype_max) return element_max;
    int top = floor_log2_float(job->dtype_max);
    float top_step = pow2_float((top > min_exponent ? top : min_exponent) - m);
    return lb_clamp(floorf(job->dtype_max / top_step) * top_step, element_max);
}

LB_INLINE void mx_apply(const mx_job *job, mx_params shared, const float *restrict x, float *restrict out,
                        int64_t length, int mode) {
    grid_block(x, out, length, job->mantissa_bits, shared + job->element_min_exponent, mx_limit(job, shared), mode);
}

/* mx_stat for a group of blocks: the blocks' finite maxima across blocks (group_maxima), then, in one loop
 * without branches (it vectorises), mx_shared_exponent on the bits of every block whose max is a normal
 * float32; mx_stat for the others. */
LB_INLINE void mx_group(const mx_job *job, int64_t first, const float *restrict x, int64_t count, int64_t length,
                        mx_params *params, int mode) {
    int32_t largest[LB_GROUP_BLOCKS], usual[LB_GROUP_BLOCKS], all_usual = 1;
    group_maxima(x, count, length, 0x7f7fffff, largest); /* finite elements only */
    const int32_t emax = job->emax, rule = job->rule;
    const float ceiling_factor = pow2_float(emax + 1), top = pow2_float(job->mantissa_bits + 1);
    const float element_max = job->element_max;
    for (int64_t item = 0; item < count; item++) {
        int32_t bits = largest[item];
        float mantissa = lb_float(((uint32_t)bits & 0x007fffffu) | (126u << 23)); /* frexp: [0.5, 1) */
        int32_t ceiling = mantissa * ceiling_factor > element_max, even = rintf(mantissa * top) == top;
        int32_t shared = (bits >> 23) - 127 - emax + (rule == LB_SCALE_RULE_CEIL ? ceiling : (rule == LB_SCALE_RULE_EVEN ? even : 0));
        shared = shared < -127 ? -127 : (shared > 127 ? 127 : shared);
        usual[item] = bits >= 0x00800000;
        all_usual &= usual[item];
        params[item] = shared;
    }
    if (!LB_LIKELY(all_usual)) LB_GROUP_REDO(mx_stat, job, first, x, count, length, params, mode, usual);
}

/* A group's elements: each block's grid and limit first (a loop across the blocks), then grid_group_bits where
 * every element max is within the output dtype; else block after block. */
LB_INLINE void mx_apply_group(const mx_job *job, const mx_params *params, const float *restrict x,
                              float *restrict out, int64_t count, int64_t length, int mode) {
    int32_t min_exponents[LB_GROUP_BLOCKS], element_min_exponent = job->element_min_exponent, usual = 1;
    float limits[LB_GROUP_BLOCKS], element_max = job->element_max, dtype_max = job->dtype_max;
    for (int64_t item = 0; item < count; item++) {
        min_exponents[item] = params[item] + element_min_exponent;
        limits[item] = element_max * pow2_float(params[item]);
        usual &= limits[item] <= dtype_max;
    }
    if (!grid_group_bits(x, out, count, length, job->mantissa_bits, min_exponents, limits, usual, mode))
        LB_EACH_BLOCK(mx_apply, job, params, x, out, count, length, mode);
}
#define MX_APPLY_GROUP(APPLY, job, params, x, out, count, length, MODE) \
    mx_apply_group(job, params, x, out, count, length, MODE)

#define MX_LOOP(MODE) LB_FOR_GROUPED_BLOCKS(job, begin, end, mx_params, mx_stat, mx_group, mx_apply, MX_APPLY_GROUP, MODE)

static void mx_range(const void *context, int64_t begin, int64_t end) {
    const mx_job local = *(const mx_job *)context, *job = &local; /* a copy: no store to out can change it */
    LB_FOR_EACH_MODE(job->mode, MX_LOOP)
}

/* rule: LB_SCALE_RULE_*; dtype_max: the output dtype's largest finite value; mantissa_bits >= 1. */
int lb_mx_f32(const float *x, float *out, int64_t rows, int64_t row_length, int64_t block_length,
               int mantissa_bits, int element_min_exponent, int emax, float element_max, int rule, float dtype_max,
               int mode, int half, int threads) {
    int64_t blocks_per_row = (row_length + block_length - 1) / block_length;
    mx_job job = {{x, out, row_length, block_length, blocks_per_row, 0}, mantissa_bits, element_min_exponent, emax,
                  rule, mode, element_max, dtype_max};
    return run_blocks(&job.geometry, rows, half, threads, mx_range, &job, sizeof job);
}

/* ---- block_fp: integer codes times 2^(e - M + 1) per block ------------------------------------------- */
typedef struct {
    block_geometry geometry;
    int mantissa_bits, min_exponent, max_exponent, in_float, mode;
    double top_code;
    float float_top; /* top_code as a float32 (the float32 path's clamp) */
} block_fp_job;

/* One block's step 2^p as its power p: a plain int32 array across a group's blocks (a struct of the step, its
 * inverse and p became shuffles in the loop across blocks). */
typedef int32_t block_fp_params;

LB_INLINE block_fp_params block_fp_stat(const block_fp_job *job, int64_t index, const float *restrict x,
                                        int64_t length, int mode) {
    (void)index;
    int exponent = block_exponent(x, length, job->mantissa_bits, mode, job->min_exponent, job->max_exponent);
    return exponent - job->mantissa_bits + 1;
}

LB_INLINE void block_fp_apply(const block_fp_job *job, block_fp_params power, const float *restrict x,
                              float *restrict out, int64_t length, int mode) {
    if (job->in_float) { /* _float32_blocks: the step 2^p is a float32 (in_float) */
        /* x / step as x times 1 / step where that is a float32 too: the same correctly rounded quotient */
        float step = pow2_float(power), inverse = power >= -127 ? pow2_float(-power) : 0.0f, top = job->float_top;
        if (inverse != 0.0f) {
            LB_BLOCK_LOOP for (int64_t k = 0; k < length; k++)
                out[k] = lb_clamp(lb_round(x[k] * inverse, mode), top) * step;
        } else {
            LB_BLOCK_LOOP for (int64_t k = 0; k < length; k++)
                out[k] = lb_clamp(lb_round(x[k] / step, mode), top) * step;
        }
    } else { /* _quantize_blocks in float64, cast back */
        double step = pow2_double(power), top = job->top_code;
        LB_BLOCK_LOOP for (int64_t k = 0; k < length; k++)
            out[k] = (float)(clamp_double(round_double((double)x[k] / step, mode), top) * step);
    }
}

/* block_fp_stat for a group of blocks: under nearest_even (float32 path), every block whose |max| is a normal
 * float32 and whose step and 1 / step are normal floats in one loop across the blocks (it vectorises); block_fp_stat
 * for the others. */
LB_INLINE void block_fp_group(const block_fp_job *job, int64_t first, const float *restrict x, int64_t count,
                              int64_t length, block_fp_params *params, int mode) {
    int m = job->mantissa_bits, min_exponent = job->min_exponent, max_exponent = job->max_exponent;
    if (mode != LB_NEAREST_EVEN || !job->in_float || m > 23) {
        LB_GROUP_BY_STAT(block_fp_stat, job, first, x, count, length, params, mode);
        return;
    }
    int32_t largest[LB_GROUP_BLOCKS], usual[LB_GROUP_BLOCKS], all_usual = 1;
    group_maxima(x, count, length, 0x7f800000, largest); /* inf, not NaN */
    int32_t parity_mask = m > 1, bias = (1 << (23 - m)) - parity_mask;
    for (int64_t item = 0; item < count; item++) {
        int32_t bits = largest[item];
        int32_t exponent = usual_nearest_even_exponent(bits, 24 - m, parity_mask, bias, min_exponent, max_exponent);
        int32_t power = exponent - m + 1;
        usual[item] = (bits >= 0x00800000) & (bits < 0x7f800000) & (power >= -126) & (power <= 126);
        all_usual &= usual[item];
        params[item] = power;
    }
    if (!LB_LIKELY(all_usual)) LB_GROUP_REDO(block_fp_stat, job, first, x, count, length, params, mode, usual);
}

/* A group's elements: where every block's step and 1 / step are normal float32 (float32 path), both first (a
 * loop across the blocks), then the elements with no per-block test; else block after block. */
LB_INLINE void block_fp_apply_group(const block_fp_job *job, const block_fp_params *params, const float *restrict x,
                                    float *restrict out, int64_t count, int64_t length, int mode) {
    float steps[LB_GROUP_BLOCKS], inverses[LB_GROUP_BLOCKS], top = job->float_top;
    int all_normal = job->in_float;
    for (int64_t item = 0; item < count; item++) {
        int32_t power = params[item];
        all_normal &= (power >= -126) & (power <= 126);
        steps[item] = lb_float((uint32_t)(power + 127) << 23);
        inverses[item] = lb_float((uint32_t)(127 - power) << 23);
    }
    if (!LB_LIKELY(all_normal)) {
        LB_EACH_BLOCK(block_fp_apply, job, params, x, out, count, length, mode);
        return;
    }
    for (int64_t item = 0; item < count; item++) {
        const float *restrict block_x = x + item * length;
        float *restrict block_out = out + item * length;
        float step = steps[item], inverse = inverses[item];
        LB_BLOCK_LOOP for (int64_t k = 0; k < length; k++)
            block_out[k] = lb_clamp(lb_round(block_x[k] * inverse, mode), top) * step;
    }
}
#define BLOCK_FP_APPLY_GROUP(APPLY, job, params, x, out, count, length, MODE) \
    block_fp_apply_group(job, params, x, out, count, length, MODE)

#define BLOCK_FP_LOOP(MODE) \
    LB_FOR_GROUPED_BLOCKS(job, begin, end, block_fp_params, block_fp_stat, block_fp_group, block_fp_apply, \
                          BLOCK_FP_APPLY_GROUP, MODE)

static void block_fp_range(const void *context, int64_t begin, int64_t end) {
    const block_fp_job local = *(const block_fp_job *)context, *job = &local;
    LB_FOR_EACH_MODE(job->mode, BLOCK_FP_LOOP)
}

/* in_float: the eager float32 path applies (nearest mode, M <= 23, smallest step >= 2^-149). */
int lb_block_fp_f32(const float *x, float *out, int64_t rows, int64_t row_length, int64_t block_length,
                     int mantissa_bits, int min_exponent, int max_exponent, double top_code, int in_float, int mode,
                     int half, int threads) {
    int64_t blocks_per_row = (row_length + block_length - 1) / block_length;
    block_fp_job job = {{x, out, row_length, block_length, blocks_per_row, 0}, mantissa_bits, min_exponent,
                        max_exponent, in_float, mode, top_code, (float)top_code};
    return run_blocks(&job.geometry, rows, half, threads, block_fp_range, &job, sizeof job);
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
    LB_BLOCK_LOOP for (int64_t k = 0; k < length; k++) {
        int exponent = floor_log2_float(x[k]);
        double step = pow2_double((exponent > min_exponent ? exponent : min_exponent) - m);
        out[k] = (float)clamp_double(round_double((double)x[k] / step, mode) * step, max_value);
    }
}

/* One block's top binade t (its max, (2 - 2^-M) 2^t, follows from it): a plain int32 array across a group's
 * blocks, which the loops across blocks read and write as vectors (a struct of an int and a float became
 * shuffles there). */
typedef int32_t minifloat_params;

static inline float minifloat_limit(int mantissa_bits, int shared) { /* float32 path: 2^t normal or subnormal */
    return (2.0f - pow2_float(-mantissa_bits)) * pow2_float(shared);
}

LB_INLINE minifloat_params block_minifloat_stat(const block_minifloat_job *job, int64_t index, const float *restrict x,
                                                int64_t length, int mode) {
    (void)index;
    int m = job->mantissa_bits;
    return block_exponent(x, length, m + 1, mode, job->min_shared, job->max_shared);
}

LB_INLINE void block_minifloat_apply(const block_minifloat_job *job, minifloat_params shared, const float *restrict x,
                                     float *restrict out, int64_t length, int mode) {
    int m = job->mantissa_bits;
    if (job->in_float) /* _float32_blocks: max (2 - 2^-M) * 2^t, smallest normal binade t - (2^E - 2) */
        grid_block(x, out, length, m, shared - job->binades_below_top, minifloat_limit(m, shared), mode);
    else
        minifloat_block_double(x, out, length, shared, job, mode);
}

/* block_minifloat_stat for a group of blocks, as block_fp_group: the usual blocks (a normal |max|, a normal
 * 2^t) in one loop across the blocks, block_minifloat_stat for the others. */
LB_INLINE void block_minifloat_group(const block_minifloat_job *job, int64_t first, const float *restrict x,
                                     int64_t count, int64_t length, minifloat_params *params, int mode) {
    int m = job->mantissa_bits, min_shared = job->min_shared, max_shared = job->max_shared;
    if (mode != LB_NEAREST_EVEN || !job->in_float || m + 1 > 23) {
        LB_GROUP_BY_STAT(block_minifloat_stat, job, first, x, count, length, params, mode);
        return;
    }
    int32_t largest[LB_GROUP_BLOCKS], usual[LB_GROUP_BLOCKS], all_usual = 1;
    group_maxima(x, count, length, 0x7f800000, largest); /* inf, not NaN */
    int32_t parity_mask = m > 0, bias = (1 << (22 - m)) - parity_mask; /* significand_bits m + 1 */
    for (int64_t item = 0; item < count; item++) {
        int32_t bits = largest[item];
        int32_t shared = usual_nearest_even_exponent(bits, 23 - m, parity_mask, bias, min_shared, max_shared);
        usual[item] = (bits >= 0x00800000) & (bits < 0x7f800000) & (shared >= -126);
        all_usual &= usual[item];
        params[item] = shared;
    }
    if (!LB_LIKELY(all_usual)) LB_GROUP_REDO(block_minifloat_stat, job, first, x, count, length, params, mode, usual);
}

/* A group's elements: each block's grid and max first (what block_minifloat_apply gives grid_block, a loop
 * across the blocks), then grid_group_bits on the float32 path; else block after block. */
LB_INLINE void block_minifloat_apply_group(const block_minifloat_job *job, const minifloat_params *params,
                                           const float *restrict x, float *restrict out, int64_t count,
                                           int64_t length, int mode) {
    int32_t min_exponents[LB_GROUP_BLOCKS], m = job->mantissa_bits, below_top = job->binades_below_top;
    float limits[LB_GROUP_BLOCKS];
    for (int64_t item = 0; item < count; item++) {
        min_exponents[item] = params[item] - below_top;
        limits[item] = minifloat_limit(m, params[item]);
    }
    if (!grid_group_bits(x, out, count, length, m, min_exponents, limits, job->in_float, mode))
        LB_EACH_BLOCK(block_minifloat_apply, job, params, x, out, count, length, mode);
}
#define BLOCK_MINIFLOAT_APPLY_GROUP(APPLY, job, params, x, out, count, length, MODE) \
    block_minifloat_apply_group(job, params, x, out, count, length, MODE)

#define BLOCK_MINIFLOAT_LOOP(MODE) \
    LB_FOR_GROUPED_BLOCKS(job, begin, end, minifloat_params, block_minifloat_stat, block_minifloat_group, \
                          block_minifloat_apply, BLOCK_MINIFLOAT_APPLY_GROUP, MODE)

static void block_minifloat_range(const void *context, int64_t begin, int64_t end) {
    const block_minifloat_job local = *(const block_minifloat_job *)context, *job = &local;
    LB_FOR_EACH_MODE(job->mode, BLOCK_MINIFLOAT_LOOP)
}

/* binades_below_top: 2^E - 2; in_float: the eager float32 path applies (nearest mode, M <= 22, smallest
 * step >= 2^-149). */
int lb_block_minifloat_f32(const float *x, float *out, int64_t rows, int64_t row_length, int64_t block_length,
                            int mantissa_bits, int binades_below_top, int min_shared, int max_shared, int in_float,
                            int mode, int half, int threads) {
    int64_t blocks_per_row = (row_length + block_length - 1) / block_length;
    block_minifloat_job job = {{x, out, row_length, block_length, blocks_per_row, 0}, mantissa_bits,
                               binades_below_top, min_shared, max_shared, in_float, mode};
    return run_blocks(&job.geometry, rows, half, threads, block_minifloat_range, &job, sizeof job);
}

