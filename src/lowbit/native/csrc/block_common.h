/* Shared by the block kernels (block_ocp.c, block_scaled.c, block_log.c): block-scaled formats along
 * contiguous runs, each block's statistics and the rounding of its elements in one pass over the block (which
 * sits in L1).
 *
 * Geometry: the tensor is `rows` rows of `row_length` contiguous floats, each cut into blocks of
 * `block_length` (the last one shorter: the eager path's zero padding changes no statistic). Every function
 * mirrors the eager float operations in order, so the results are bit-identical. */
#ifndef LOWBIT_BLOCK_COMMON_H
#define LOWBIT_BLOCK_COMMON_H

#include "common.h"
#include "lanes.h"
#include "stream.h"

#define LB_LIKELY(condition) __builtin_expect(!!(condition), 1) /* the usual case (code layout only) */
#define LB_UNLIKELY(condition) __builtin_expect(!!(condition), 0)

typedef struct {
    const float *x;
    float *out;
    int64_t row_length, block_length, blocks_per_row;
    int streamed; /* stream.h's lb_storage: out written past the cache, or halves (set by run_blocks) */
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
    return LB_LIKELY(k >= -126) ? lb_float((uint32_t)(k + 127) << 23) : lb_float(1u << (k + 149));
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

/* lb_grid_round (M >= 1) with the division by the step (a power of two) done as a multiplication by its
 * reciprocal, which is exact whenever the reciprocal is a normal float (both give the one correctly rounded
 * v / step). A finite v's step is at most 2^(127 - M) <= 2^126; the one step whose reciprocal is not normal
 * (2^127, from inf or NaN with M = 1) is lowered to 2^126, which leaves inf and NaN as they are, as v / step
 * does. */
static inline float grid_round_fast(float v, int32_t mantissa_shift, int32_t smallest_field, int mode) {
    int32_t field = (int32_t)(lb_bits(v) & 0x7f800000u) - mantissa_shift;
    field = field < smallest_field ? smallest_field : field;
    field = field > (253 << 23) ? (253 << 23) : field;
    float step = lb_float((uint32_t)field), inverse = lb_float((uint32_t)((254 << 23) - field));
    return lb_round(v * inverse, mode) * step;
}

/* The grid step 2^(max(floor_log2 |v|, min_exponent) - M) with min_exponent - M >= -149 (any v). */
static inline float general_step(float v, int min_exponent, int mantissa_bits) {
    int exponent = floor_log2_float(v);
    return pow2_float((exponent > min_exponent ? exponent : min_exponent) - mantissa_bits);
}

/* Before a loop over one block's elements: GCC would otherwise peel a loop of a constant 16 or 32 iterations
 * into scalar code before vectorising it (and then vectorise the loop over blocks instead, lanes across 16
 * blocks: several times slower); kept a loop, it becomes one or two whole-vector iterations. */
#define LB_BLOCK_LOOP _Pragma("GCC unroll 1")

/* Per block: finite min widened to zero, finite max widened to zero, and whether an inf is present. */
typedef struct { float low, high; int has_inf; } block_extremes;

LB_INLINE block_extremes extremes_of(const float *restrict x, int64_t length) {
    /* bit patterns (signed: the reductions vectorise): the largest non-negative finite value, the largest
     * magnitude of a negative one */
    int32_t high = 0, low = 0, infinite = 0;
    LB_BLOCK_LOOP for (int64_t k = 0; k < length; k++) {
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

/* The largest magnitude bit pattern of x[0, length) among those <= limit (others count as +0): limit
 * 0x7f7fffff keeps the finite elements, 0x7f800000 every element but NaN, 0x7fffffff all of them. */
LB_INLINE int32_t abs_max_bits_upto(const float *restrict x, int64_t length, int32_t limit) {
    int32_t largest = 0;
    LB_BLOCK_LOOP for (int64_t k = 0; k < length; k++) { /* every element first: nothing to drop, mostly */
        int32_t magnitude = (int32_t)(lb_bits(x[k]) & 0x7fffffffu);
        largest = magnitude > largest ? magnitude : largest;
    }
    if (LB_LIKELY(largest <= limit)) return largest;
    largest = 0;
    LB_BLOCK_LOOP for (int64_t k = 0; k < length; k++) {
        int32_t magnitude = (int32_t)(lb_bits(x[k]) & 0x7fffffffu);
        magnitude = magnitude <= limit ? magnitude : 0;
        largest = magnitude > largest ? magnitude : largest;
    }
    return largest;
}

/* max |x| over the finite elements (>= +0). */
LB_INLINE float finite_abs_max_of(const float *restrict x, int64_t length) {
    return lb_float((uint32_t)abs_max_bits_upto(x, length, 0x7f7fffff));
}

/* block_fp.exponent_from_extremes: the smallest exponent in [low_e, high_e] at which nothing overflows. */
static inline int exponent_from_extremes(block_extremes ex, int significand_bits, int mode, int min_exponent,
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

/* The usual case of block_exponent (nearest_even, a normal finite |max| with bit pattern `largest`,
 * significand_bits <= 23) without a branch, for loops across blocks: parity_mask is 0 for significand_bits 1,
 * else 1, and bias 2^(23 - significand_bits) minus that. */
static inline int32_t usual_nearest_even_exponent(int32_t largest, int dropped, int32_t parity_mask, int32_t bias,
                                                  int min_exponent, int max_exponent) {
    int32_t exponent = ((largest + ((largest >> dropped) & parity_mask) + bias) >> 23) - 127;
    return exponent < min_exponent ? min_exponent : (exponent > max_exponent ? max_exponent : exponent);
}

/* The shared exponent of block_fp (significand_bits M) and block_minifloat (M + 1): under nearest_even from
 * one reduction (|max|) unless the block holds an inf; otherwise from the block's extremes. */
LB_INLINE int block_exponent(const float *restrict x, int64_t length, int significand_bits, int mode,
                             int min_exponent, int max_exponent) {
    if (mode == LB_NEAREST_EVEN) {
        int32_t largest = abs_max_bits_upto(x, length, 0x7f800000); /* inf, not NaN */
        if (LB_LIKELY(largest >= 0x00800000 && largest < 0x7f800000 && significand_bits <= 23)) {
            /* a normal float32 |max|: the same rounding on its float32 bits (their fraction is the float64
             * one's top 23 bits, the rest zero, so the carry into the exponent happens alike) */
            int32_t parity_mask = significand_bits > 1;
            int32_t bias = (1 << (23 - significand_bits)) - parity_mask;
            return usual_nearest_even_exponent(largest, 24 - significand_bits, parity_mask, bias, min_exponent,
                                               max_exponent);
        }
        if (largest < 0x7f800000) {
            block_extremes ex = {0.0f, lb_float((uint32_t)largest), 0};
            return nearest_even_exponent(ex, significand_bits, min_exponent, max_exponent);
        }
    }
    return exponent_from_extremes(extremes_of(x, length), significand_bits, mode, min_exponent, max_exponent);
}

/* Every block of [begin, end) (in units of block_length elements), in two steps: STAT(job, index, x, length,
 * MODE) returns the block's parameters (a PARAM: its exponent, scale, ...), APPLY(job, params, x, out, length,
 * MODE) rounds its elements (GROUP: STAT for a group of blocks, below). Blocks of 16 and 32 elements (the
 * common sizes) under nearest_even (the formats' default; one copy per length and mode would make the build
 * several times longer) get the length a compile-time constant, so each block's reductions and element
 * loops become straight vector code; a row's shorter last block and other lengths take the same STAT / APPLY with a
 * run-time length. Rows of whole blocks put every block right after the one before (the tensor is
 * contiguous): they go by groups, first every block's parameters, then every block's elements, so the
 * processor overlaps the reductions of several blocks (each a chain of dependent steps) instead of waiting on
 * one before the elements of the next. */
#define LB_GROUP_BLOCKS 32
#define LB_FOR_BLOCKS(job, begin, end, PARAM, STAT, GROUP, APPLY, MODE) \
    LB_FOR_GROUPED_BLOCKS(job, begin, end, PARAM, STAT, GROUP, APPLY, LB_EACH_BLOCK, MODE)

/* LB_FOR_BLOCKS where a group's elements go through APPLY_GROUP(APPLY, job, params, x, out, count, length, MODE)
 * (LB_EACH_BLOCK: APPLY block after block), for a kernel with a loop of its own across a group's blocks. */
#define LB_FOR_GROUPED_BLOCKS(job, begin, end, PARAM, STAT, GROUP, APPLY, APPLY_GROUP, MODE) \
    do { \
        int64_t block_length_ = (job)->geometry.block_length; \
        if (block_length_ == 16 && (MODE) == LB_NEAREST_EVEN) \
            LB_BLOCKS_OF(job, begin, end, PARAM, STAT, GROUP, APPLY, APPLY_GROUP, MODE, 16); \
        else if (block_length_ == 32 && (MODE) == LB_NEAREST_EVEN) \
            LB_BLOCKS_OF(job, begin, end, PARAM, STAT, GROUP, APPLY, APPLY_GROUP, MODE, 32); \
        else LB_BLOCKS_OF(job, begin, end, PARAM, STAT, GROUP, APPLY, APPLY_GROUP, MODE, 0); \
    } while (0)

#define LB_EACH_BLOCK(APPLY, job, params, x, out, count, length, MODE) \
    for (int64_t item_ = 0; item_ < (count); item_++) \
        APPLY(job, (params)[item_], (x) + item_ * (length), (out) + item_ * (length), length, MODE)

/* GROUP(job, first_index, x, count, length, params, MODE): the parameters of `count` blocks back to back
 * from x, each kernel's own (a loop across the group that vectorises). LB_GROUP_BY_STAT calls STAT block
 * after block for every block, LB_GROUP_REDO for the blocks whose usual[item] is 0 (those the loop across the
 * group left out). */
#define LB_GROUP_BY_STAT(STAT, job, first, x, count, length, params, mode) \
    for (int64_t item_ = 0; item_ < (count); item_++) \
        (params)[item_] = STAT(job, (first) + item_, (x) + item_ * (length), length, mode)
#define LB_GROUP_REDO(STAT, job, first, x, count, length, params, mode, usual) \
    for (int64_t item_ = 0; item_ < (count); item_++) \
        if (!(usual)[item_]) (params)[item_] = STAT(job, (first) + item_, (x) + item_ * (length), length, mode)

/* Each block's largest magnitude bits among those <= limit (abs_max_bits_upto), for a GROUP of its own. */
LB_INLINE void group_maxima(const float *restrict x, int64_t count, int64_t length, int32_t limit, int32_t *largest) {
    int64_t item = 0;
    if (length % LANES == 0) /* LANES blocks at a time: lanes of maxima, then reduced across (lanes.h) */
        for (; item + LANES <= count; item += LANES) {
            lanes_i maxima[LANES];
            for (int j = 0; j < LANES; j++) {
                const float *block = x + (item + j) * length;
                lanes_i top = lanes_of(0);
                LB_BLOCK_LOOP for (int64_t k = 0; k < length; k += LANES) top = lanes_max(top, lanes_load(block + k) & 0x7fffffff);
                maxima[j] = top;
            }
            LANES_ACROSS(maxima, lanes_max);
            memcpy(largest + item, maxima, sizeof maxima[0]);
            if (LB_UNLIKELY(lanes_any(maxima[0] > limit))) /* one test for the LANES blocks, then block by block */
                for (int j = 0; j < LANES; j++) /* a magnitude above the limit: that block's maximum of the rest */
                    if (largest[item + j] > limit)
                        largest[item + j] = abs_max_bits_upto(x + (item + j) * length, length, limit);
        }
    for (; item < count; item++) largest[item] = abs_max_bits_upto(x + item * length, length, limit);
}

#define LB_STAT_APPLY(job, index, x, out, length, PARAM, STAT, APPLY, MODE) \
    do { \
        PARAM params_ = STAT(job, index, x, length, MODE); \
        APPLY(job, params_, x, out, length, MODE); \
    } while (0)

#define LB_BLOCKS_OF(job, begin, end, PARAM, STAT, GROUP, APPLY, APPLY_GROUP, MODE, LENGTH) \
    do { \
        const block_geometry geometry = (job)->geometry; \
        const int64_t full = (LENGTH) ? (LENGTH) : geometry.block_length; \
        int64_t first_index = (begin) / full, last_index = (end) / full; \
        const int streamed_ = geometry.streamed && full <= LB_TILE; /* a group's blocks fit the tile */ \
        const int64_t ahead_ = streamed_ ? lb_prefetch_distance() : 0; /* read once a range */ \
        int64_t per_group_ = streamed_ && full * LB_GROUP_BLOCKS > LB_TILE ? LB_TILE / full : LB_GROUP_BLOCKS; \
        lb_sink sink_; \
        lb_sink_open(&sink_, geometry.out, streamed_); \
        if (geometry.row_length % full == 0) { \
            for (int64_t group = first_index; group < last_index; group += per_group_) { \
                int64_t count = last_index - group < per_group_ ? last_index - group : per_group_; \
                const float *group_x = geometry.x + group * full; \
                float *group_out = lb_sink_next(&sink_, group * full, count * full); \
                if (ahead_) lb_prefetch(group_x, count * full, ahead_); \
                PARAM params_[LB_GROUP_BLOCKS]; \
                GROUP(job, group, group_x, count, full, params_, MODE); \
                APPLY_GROUP(APPLY, job, params_, group_x, group_out, count, full, MODE); \
            } \
        } else { \
            int64_t row = first_index / geometry.blocks_per_row; \
            int64_t column = first_index - row * geometry.blocks_per_row; \
            for (int64_t index = first_index; index < last_index; index++) { \
                int64_t start = column * full, length = geometry.row_length - start; \
                length = length < full ? length : full; \
                const float *block_x = geometry.x + row * geometry.row_length + start; \
                float *block_out = lb_sink_next(&sink_, row * geometry.row_length + start, length); \
                if ((LENGTH) && length == full) \
                    LB_STAT_APPLY(job, index, block_x, block_out, full, PARAM, STAT, APPLY, MODE); \
                else LB_STAT_APPLY(job, index, block_x, block_out, length, PARAM, STAT, APPLY, MODE); \
                if (++column == geometry.blocks_per_row) { column = 0; row++; } \
            } \
        } \
        lb_sink_close(&sink_); \
    } while (0)

/* lb_parallel counts elements (it threads from 2^20 of them): each block counts as block_length units, so
 * every chunk boundary is a whole block. `half` (1 bfloat16, 2 float16; 0 float32): x and out hold halves,
 * taken for blocks of at most a tile (stream.h's lb_half_tiles_range runs fn on float32 tiles); returns 0,
 * doing nothing, for longer ones. `job` (job_size bytes) holds `geometry`. */
static inline int run_blocks(block_geometry *geometry, int64_t rows, int half, int threads, lb_range_fn fn,
                             const void *job, size_t job_size) {
    int64_t blocks = rows * geometry->blocks_per_row, full = geometry->block_length;
    int usable;
    geometry->streamed = lb_storage(rows * geometry->row_length, threads, half);
    lb_half_tiles plan = lb_half_tiles_of(fn, job, job_size, &geometry->x, &geometry->out, &geometry->streamed, full,
                                          geometry->blocks_per_row, geometry->row_length, &usable);
    if (half && !usable) return 0;
    int64_t grain = full >= 4096 ? 1 : 4096 / full;
    lb_parallel(blocks * full, grain * full, threads, half ? lb_half_tiles_range : fn, half ? (const void *)&plan : job);
    return 1;
}

#define LB_FLOAT32_TINY 1.17549435e-38f
#define LB_FLOAT32_MAX 3.40282347e+38f

/* ---- shared by the per-block float grids (MX, block_minifloat) --------------------------------------- */
/* grid_block's bit path, taken where every step is normal (the smallest, 2^(min_exponent - M), included), and
 * the smallest step's exponent field it needs. */
static inline int grid_bit_path(int mantissa_bits, int min_exponent) {
    return mantissa_bits >= 1 && min_exponent - mantissa_bits >= -126;
}
static inline int32_t grid_smallest_field(int mantissa_bits, int min_exponent) {
    return (min_exponent - mantissa_bits + 127) << 23;
}

/* The bit path: shift = M << 23, smallest = grid_smallest_field. */
LB_INLINE void grid_block_bits(const float *restrict x, float *restrict out, int64_t length, int32_t shift,
                               int32_t smallest, float limit, int mode) {
    LB_BLOCK_LOOP for (int64_t k = 0; k < length; k++) out[k] = lb_clamp(grid_round_fast(x[k], shift, smallest, mode), limit);
}

/* grid_block over a group of blocks back to back (block `item`: min_exponents[item], limits[item]) where every
 * block takes the bit path and `usual` is set: the smallest step fields first (a loop across the blocks), then
 * the elements with no per-block test. Returns 0, writing nothing, otherwise: the caller goes block by block.
 * Shared by the grouped applies of MX and block_minifloat. */
LB_INLINE int grid_group_bits(const float *restrict x, float *restrict out, int64_t count, int64_t length,
                              int mantissa_bits, const int32_t *min_exponents, const float *limits, int usual, int mode) {
    int32_t smallest[LB_GROUP_BLOCKS], shift = mantissa_bits << 23;
    for (int64_t item = 0; item < count; item++) {
        usual &= grid_bit_path(mantissa_bits, min_exponents[item]);
        smallest[item] = grid_smallest_field(mantissa_bits, min_exponents[item]);
    }
    if (!LB_LIKELY(usual)) return 0;
    for (int64_t item = 0; item < count; item++)
        grid_block_bits(x + item * length, out + item * length, length, shift, smallest[item], limits[item], mode);
    return 1;
}

/* round(v / step) * step clamped to +-limit, step = 2^(max(floor_log2 |v|, min_exponent) - M). */
LB_INLINE void grid_block(const float *restrict x, float *restrict out, int64_t length, int mantissa_bits,
                              int min_exponent, float limit, int mode) {
    if (grid_bit_path(mantissa_bits, min_exponent)) {
        grid_block_bits(x, out, length, mantissa_bits << 23, grid_smallest_field(mantissa_bits, min_exponent), limit, mode);
    } else {
        LB_BLOCK_LOOP for (int64_t k = 0; k < length; k++) {
            float step = general_step(x[k], min_exponent, mantissa_bits);
            out[k] = lb_clamp(lb_round(x[k] / step, mode) * step, limit);
        }
    }
}

#endif
