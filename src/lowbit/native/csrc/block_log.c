/* block_log (block_log.py): powers of two with a bias per block. */
#include "block_common.h"

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
    float step = lb_round(parity + fraction, (v < 0.0f ? lb_mirrored_mode(mode) : mode)) - parity;
    int top_code = (max_exponent > 127 ? 127 : max_exponent) - min_exponent + 1;
    int code = lower_code + (int)step;
    code = code < top_code ? code : top_code;
    code = isinf(v) ? top_code : code;
    float power = exact_pow2_float(min_exponent + code - 1);
    float value = copysignf(code == 0 ? 0.0f : power, v);
    return isnan(v) ? v : value;
}

/* log.nearest_power_of_two_finite (finite blocks, 2^(min_exponent - 1) normal): rounding the significand to
 * no fraction bits, ties to the even exponent code, by an integer add; clamp; zero below the midpoint. All on
 * the bits: a nonnegative float orders as its bits do, and the powers are normal, so the clamp is an integer
 * min / max, "zero below the midpoint" a select, and the sign x's sign bit. */
LB_INLINE void nearest_power_float(const float *restrict x, float *restrict out, int64_t length, int min_exponent,
                                   int max_exponent) {
    uint32_t parity_offset = (uint32_t)(min_exponent & 1);
    int32_t smallest = (min_exponent + 127) << 23, midpoint = (min_exponent - 1 + 127) << 23;
    int32_t largest = ((max_exponent > 127 ? 127 : max_exponent) + 127) << 23;
    LB_BLOCK_LOOP for (int64_t k = 0; k < length; k++) {
        uint32_t raw = lb_bits(x[k]), bits = raw & 0x7fffffffu, parity = ((bits >> 23) + parity_offset) & 1u;
        int32_t power = (int32_t)((parity + bits + (1u << 22) - 1u) & 0x7f800000u);
        power = power > smallest ? power : smallest; /* a max then a min (smallest <= largest) */
        power = power < largest ? power : largest;
        power = (int32_t)bits > midpoint ? power : 0;
        out[k] = lb_float((uint32_t)power | (raw & 0x80000000u));
    }
}

/* The same in float64 (blocks whose smallest powers are float32 subnormals), cast back to float32. */
LB_INLINE void nearest_power_double(const float *restrict x, float *restrict out, int64_t length, int min_exponent,
                                    int max_exponent) {
    uint64_t parity_offset = (uint64_t)(min_exponent & 1);
    double smallest = pow2_double(min_exponent), largest = pow2_double(max_exponent > 127 ? 127 : max_exponent);
    double midpoint = pow2_double(min_exponent - 1);
    LB_BLOCK_LOOP for (int64_t k = 0; k < length; k++) {
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

/* One block's parameters packed in an int32 (a plain array across a group's blocks, which loops across blocks
 * read and write as vectors; a struct of three ints became shuffles there): its bias << 2 | path, path 1
 * where its elements take nearest_power_float, 2 nearest_power_double (finite block, nearest_even, not
 * log_domain), 0 power_of_two. Its exponents: min 1 - bias, max top_code - bias. */
typedef int32_t block_log_params;

static inline int block_log_bias(block_log_params params) { return params >> 2; }
static inline int block_log_path(block_log_params params) { return params & 3; }

/* The path of a finite block of this bias under nearest_even outside the log domain: the float32 one where the
 * smallest power's half, 2^(min_exponent - 1) = 2^-bias, is a normal float32. */
static inline int32_t nearest_path(int bias) { return -bias >= -126 ? 1 : 2; }

LB_INLINE block_log_params block_log_stat(const block_log_job *job, int64_t index, const float *restrict x,
                                          int64_t length, int mode) {
    (void)index;
    int32_t largest = abs_max_bits_upto(x, length, 0x7fffffff); /* NaN and inf included */
    int finite = largest < 0x7f800000;
    float amax = finite ? lb_float((uint32_t)largest) : finite_abs_max_of(x, length);
    int ceil_log2 = -(1 << 20); /* block_log.ceil_log2: an all-zero block */
    if (amax > 0.0f) {
        uint32_t bits = lb_bits(amax);
        int power_of_two_max = bits >= 0x00800000u ? (bits & 0x007fffffu) == 0 : (bits & (bits - 1)) == 0;
        ceil_log2 = floor_log2_float(amax) + !power_of_two_max;
    }
    int bias = job->top_code - ceil_log2;
    bias = bias < 0 ? 0 : (bias > job->max_bias ? job->max_bias : bias);
    int path = mode == LB_NEAREST_EVEN && !job->log_domain && finite ? nearest_path(bias) : 0;
    return bias << 2 | path;
}

/* The blocks that nearest_power_float does not take, out of line: inlined, their code's register needs made
 * the usual blocks' loop set up its constants anew for every block. */
static __attribute__((noinline)) void other_block(const block_log_job *job, block_log_params params,
                                                  const float *restrict x, float *restrict out, int64_t length,
                                                  int mode) {
    int min_exponent = 1 - block_log_bias(params), max_exponent = job->top_code - block_log_bias(params);
    if (block_log_path(params) == 2) nearest_power_double(x, out, length, min_exponent, max_exponent);
    else
#define LB_GENERIC(MODE) \
    LB_BLOCK_LOOP for (int64_t k = 0; k < length; k++) out[k] = power_of_two(x[k], min_exponent, max_exponent, job, MODE)
        LB_FOR_EACH_MODE(mode, LB_GENERIC)
#undef LB_GENERIC
}

LB_INLINE void block_log_apply(const block_log_job *job, block_log_params params, const float *restrict x,
                               float *restrict out, int64_t length, int mode) {
    if (LB_LIKELY(block_log_path(params) == 1))
        nearest_power_float(x, out, length, 1 - block_log_bias(params), job->top_code - block_log_bias(params));
    else other_block(job, params, x, out, length, mode);
}

/* block_log_stat for a group of blocks: those whose |max| (NaN and inf included) is a normal float32 in one loop
 * across the blocks (it vectorises), block_log_stat for the others. */
LB_INLINE void block_log_group(const block_log_job *job, int64_t first, const float *restrict x, int64_t count,
                               int64_t length, block_log_params *params, int mode) {
    int32_t largest[LB_GROUP_BLOCKS], usual[LB_GROUP_BLOCKS], all_usual = 1;
    int top_code = job->top_code, max_bias = job->max_bias, nearest = mode == LB_NEAREST_EVEN && !job->log_domain;
    group_maxima(x, count, length, 0x7fffffff, largest); /* NaN and inf included */
    for (int64_t item = 0; item < count; item++) {
        int32_t bits = largest[item];
        int ceil_log2 = (bits >> 23) - 127 + ((bits & 0x007fffff) != 0); /* floor_log2, +1 off a power of two */
        int bias = top_code - ceil_log2;
        bias = bias < 0 ? 0 : (bias > max_bias ? max_bias : bias);
        usual[item] = (bits >= 0x00800000) & (bits < 0x7f800000);
        all_usual &= usual[item];
        params[item] = bias << 2 | (nearest ? nearest_path(bias) : 0);
    }
    if (!LB_LIKELY(all_usual)) LB_GROUP_REDO(block_log_stat, job, first, x, count, length, params, mode, usual);
}

/* nearest_power_float across a group of blocks of LANES-multiple length, in vector code: the constants set up
 * once for the group, each block's bounds broadcast from its parameters. */
LB_INLINE void nearest_powers(const float *restrict x, float *restrict out, int64_t count, int64_t length,
                              const block_log_params *params, int top_code) {
    const lanes_i magnitude_mask = lanes_of(0x7fffffff), field_mask = lanes_of(0x7f800000);
    const lanes_i half_below = lanes_of((1 << 22) - 1), one = lanes_of(1);
    int32_t parities[LB_GROUP_BLOCKS], smallests[LB_GROUP_BLOCKS], midpoints[LB_GROUP_BLOCKS], largests[LB_GROUP_BLOCKS];
    for (int64_t item = 0; item < count; item++) { /* every block's constants first: a loop across blocks */
        int min_exponent = 1 - block_log_bias(params[item]), max_exponent = top_code - block_log_bias(params[item]);
        parities[item] = min_exponent & 1, smallests[item] = (min_exponent + 127) << 23;
        midpoints[item] = (min_exponent - 1 + 127) << 23;
        largests[item] = ((max_exponent > 127 ? 127 : max_exponent) + 127) << 23;
    }
    for (int64_t item = 0; item < count; item++) {
        lanes_i parity_offset = lanes_of(parities[item]), smallest = lanes_of(smallests[item]);
        lanes_i midpoint = lanes_of(midpoints[item]), largest = lanes_of(largests[item]);
        const float *block_x = x + item * length;
        float *block_out = out + item * length;
        LB_BLOCK_LOOP for (int64_t k = 0; k < length; k += LANES) {
            lanes_i raw = lanes_load(block_x + k), bits = raw & magnitude_mask; /* finite: bits < 0x7f800000 */
            lanes_i power = (((bits >> 23) + parity_offset) & one) + bits + half_below;
            power = lanes_min(lanes_max(power & field_mask, smallest), largest);
            power &= bits > midpoint; /* -1 where above the midpoint */
            lanes_i result = power | (raw & ~magnitude_mask);
            memcpy(block_out + k, &result, sizeof result);
        }
    }
}

/* A group's elements: nearest_powers where every block takes nearest_power_float, else block after block. */
LB_INLINE void block_log_apply_group(const block_log_job *job, const block_log_params *params,
                                     const float *restrict x, float *restrict out, int64_t count, int64_t length,
                                     int mode) {
    int all_float = length % LANES == 0;
    for (int64_t item = 0; item < count; item++) all_float &= block_log_path(params[item]) == 1;
    if (LB_LIKELY(all_float)) nearest_powers(x, out, count, length, params, job->top_code);
    else LB_EACH_BLOCK(block_log_apply, job, params, x, out, count, length, mode);
}
#define BLOCK_LOG_APPLY_GROUP(APPLY, job, params, x, out, count, length, MODE) \
    block_log_apply_group(job, params, x, out, count, length, MODE)

#define BLOCK_LOG_LOOP(MODE) \
    LB_FOR_GROUPED_BLOCKS(job, begin, end, block_log_params, block_log_stat, block_log_group, block_log_apply, \
                          BLOCK_LOG_APPLY_GROUP, MODE)

static void block_log_range(const void *context, int64_t begin, int64_t end) {
    const block_log_job local = *(const block_log_job *)context, *job = &local;
    LB_FOR_EACH_MODE(job->mode, BLOCK_LOG_LOOP)
}

/* top_code: 2^(W-1) - 1; max_bias: 2^Bw - 1; below_sqrt2 is read under log_domain with a nearest mode. */
int lb_block_log_f32(const float *x, float *out, int64_t rows, int64_t row_length, int64_t block_length,
                      int top_code, int max_bias, int log_domain, float below_sqrt2, int mode, int half, int threads) {
    int64_t blocks_per_row = (row_length + block_length - 1) / block_length;
    block_log_job job = {{x, out, row_length, block_length, blocks_per_row, 0}, top_code, max_bias, log_domain, mode,
                         below_sqrt2};
    return run_blocks(&job.geometry, rows, half, threads, block_log_range, &job, sizeof job);
}

