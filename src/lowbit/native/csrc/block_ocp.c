/* OCP element formats (formats/ocp_float.py): unscaled casts and s * element(x / s) per block. */
#include "block_common.h"

/* ---- OCP elements (ocp_float.round_element) ----------------------------------------------------------- */
typedef struct {
    int32_t mantissa_shift, smallest_field;
    float max_value;
    int saturating, overflow_inf, past_positive, past_negative;
} ocp_element;

/* What an element past max becomes: the type saturates, +-inf (e5m2) or NaN (e4m3); numbered as
 * lowbit.native.interface.OVERFLOW_KINDS. */
enum { LB_OVERFLOW_SATURATE, LB_OVERFLOW_INF, LB_OVERFLOW_NAN };

static ocp_element make_element(int mantissa_bits, int min_exponent, float max_value, int overflow_kind,
                                int saturate, int mode) {
    ocp_element element = {mantissa_bits << 23, (min_exponent - mantissa_bits + 127) << 23, max_value,
                           saturate || overflow_kind == LB_OVERFLOW_SATURATE, overflow_kind == LB_OVERFLOW_INF,
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
    int mode, streamed;
} element_job;

#define ELEMENT_LOOP(MODE) \
    do { \
        const ocp_element element = job->element; \
        if (element.saturating) for (int64_t i = 0; i < n; i++) out[i] = round_saturating(x[i], element, MODE); \
        else for (int64_t i = 0; i < n; i++) out[i] = round_overflowing(x[i], element, MODE); \
    } while (0)

static void element_span(const void *context, const float *restrict x, float *restrict out, int64_t n) {
    const element_job *job = context;
    LB_FOR_EACH_MODE(job->mode, ELEMENT_LOOP)
}

static void element_range(const void *context, int64_t begin, int64_t end) {
    const element_job *job = context;
    lb_spans(job, job->x, job->out, job->streamed, begin, end, element_span);
}

/* An unscaled OCP element cast: x, out n contiguous float32. */
void lb_ocp_element_f32(const float *x, float *out, int64_t n, int mantissa_bits, int min_exponent,
                        float max_value, int overflow_kind, int saturate, int mode, int half, int threads) {
    element_job job = {x, out, make_element(mantissa_bits, min_exponent, max_value, overflow_kind, saturate, mode),
                       mode, lb_storage(n, threads, half)};
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

/* ocp_float.covering_scale for a block's finite |max| amax: the steps on the scale's bit pattern (positive: a
 * neighbour is one bit pattern away), with conditions joined by & and no branch (they go either way from
 * block to block, and a loop across blocks vectorises). */
LB_INLINE float covering_scale(float amax, float element_max) {
    float quotient = amax / element_max;
    uint32_t tiny = lb_bits(LB_FLOAT32_TINY);
    uint32_t bits = (fabsf(quotient) <= LB_FLOAT32_MAX) & (quotient >= LB_FLOAT32_TINY) ? lb_bits(quotient) : tiny;
    bits += (lb_float(bits) * element_max < amax) & (bits + 1 < 0x7f800000u);    /* next up, if finite */
    bits -= (lb_float(bits - 1) * element_max >= amax) & (bits - 1 >= tiny); /* next down, if normal */
    return lb_float(bits);
}

/* ocp_float.covering_scale (f32 scales) and _inward_scale for the directed modes that need it. */
LB_INLINE float derived_scale(const float *restrict x, int64_t length, const scaled_job *job) {
    block_extremes ex = {0.0f, 0.0f, 0};
    if (job->inward) ex = extremes_of(x, length);
    else ex.high = finite_abs_max_of(x, length);
    float element_max = job->element.max_value;
    float amax = fabsf(ex.high > -ex.low ? ex.high : -ex.low);
    float scale = covering_scale(amax, element_max);
    if (!job->inward) return scale;
    float smaller = next_down(scale);
    int usable = (smaller >= LB_FLOAT32_TINY) & (scale * element_max != amax);
    int inward = 1;
    if (job->mode != LB_TOWARD_ZERO) {
        int positive = ex.high >= -ex.low;
        int rounded_inward = job->mode == LB_DOWN ? positive : !positive;
        float other = positive ? -ex.low : ex.high;
        inward = rounded_inward & (other <= smaller * element_max);
    }
    return usable & inward ? smaller : scale;
}

/* One block's elements; SATURATING and DIRECTED are constants in each copy (the loops vectorise). */
LB_INLINE void scaled_elements(const float *restrict x, float *restrict out, int64_t length, float scale,
                                   ocp_element element, ocp_element nearest, int clamp_inf, int mode,
                                   int saturating, int directed) {
    LB_BLOCK_LOOP for (int64_t k = 0; k < length; k++) {
        float v = x[k], y = v / scale;
        float result = (saturating ? round_saturating(y, element, mode) : round_overflowing(y, element, mode)) * scale;
        if (directed) {
            float on_grid = round_saturating(y, nearest, LB_NEAREST_EVEN) * scale;
            result = on_grid == v ? on_grid : result;
        }
        /* an inf from a finite v becomes +-max (the clamp leaves finite values and NaN as they are) */
        if (clamp_inf) result = isfinite(v) ? lb_clamp(result, LB_FLOAT32_MAX) : result;
        out[k] = result;
    }
}

LB_INLINE float scaled_stat(const scaled_job *job, int64_t index, const float *restrict x, int64_t length,
                            int mode) {
    (void)mode;
    return job->scales ? job->scales[index / job->blocks_per_scale] : derived_scale(x, length, job);
}

LB_INLINE void scaled_apply(const scaled_job *job, float scale, const float *restrict x, float *restrict out,
                            int64_t length, int mode) {
    int saturating = job->element.saturating, directed = job->directed, clamp_inf = job->clamp_inf;
    ocp_element element = job->element, nearest = job->nearest;
    /* saturated elements times a scale whose product with the element max is finite stay finite: no clamp (a
     * derived covering scale always passes: checked over the top 3M float32 maxima for every OCP element) */
    if (saturating && !directed && (!clamp_inf || scale * element.max_value <= LB_FLOAT32_MAX))
        scaled_elements(x, out, length, scale, element, nearest, 0, mode, 1, 0);
    else if (saturating && !directed) scaled_elements(x, out, length, scale, element, nearest, 1, mode, 1, 0);
    else if (saturating) scaled_elements(x, out, length, scale, element, nearest, clamp_inf, mode, 1, 1);
    else if (!directed) scaled_elements(x, out, length, scale, element, nearest, clamp_inf, mode, 0, 0);
    else scaled_elements(x, out, length, scale, element, nearest, clamp_inf, mode, 0, 1);
}

/* A group's scales: derived ones (not inward) from the blocks' finite maxima taken across blocks (group_maxima)
 * in one loop over the group; given or inward scales block by block. */
LB_INLINE void scaled_group(const scaled_job *job, int64_t first, const float *restrict x, int64_t count,
                            int64_t length, float *params, int mode) {
    if (job->scales || job->inward) {
        LB_GROUP_BY_STAT(scaled_stat, job, first, x, count, length, params, mode);
        return;
    }
    int32_t largest[LB_GROUP_BLOCKS];
    float element_max = job->element.max_value;
    group_maxima(x, count, length, 0x7f7fffff, largest);
    for (int64_t item = 0; item < count; item++) params[item] = covering_scale(lb_float((uint32_t)largest[item]), element_max);
}
#define SCALED_LOOP(MODE) LB_FOR_BLOCKS(job, begin, end, float, scaled_stat, scaled_group, scaled_apply, MODE)

static void scaled_range(const void *context, int64_t begin, int64_t end) {
    const scaled_job local = *(const scaled_job *)context, *job = &local;
    LB_FOR_EACH_MODE(job->mode, SCALED_LOOP)
}

/* Scaled OCP elements over `rows` rows of row_length floats in blocks of block_length; scales: NULL (each
 * block derives its f32 scale, clamp_inf as _quantize_block) or one given scale per blocks_per_scale blocks. */
int lb_ocp_scaled_f32(const float *x, float *out, int64_t rows, int64_t row_length, int64_t block_length,
                       const float *scales, int64_t blocks_per_scale, int mantissa_bits, int min_exponent,
                       float max_value, int overflow_kind, int saturate, int mode, int half, int threads) {
    int64_t blocks_per_row = (row_length + block_length - 1) / block_length;
    scaled_job job = {{x, out, row_length, block_length, blocks_per_row, 0},
                      make_element(mantissa_bits, min_exponent, max_value, overflow_kind, saturate, mode),
                      make_element(mantissa_bits, min_exponent, max_value, overflow_kind, 1, LB_NEAREST_EVEN),
                      mode, mode == LB_UP || mode == LB_DOWN || mode == LB_TOWARD_ZERO || mode == LB_AWAY_FROM_ZERO,
                      mode == LB_UP || mode == LB_DOWN || mode == LB_TOWARD_ZERO, scales == NULL, scales,
                      blocks_per_scale > 0 ? blocks_per_scale : 1};
    return run_blocks(&job.geometry, rows, half, threads, scaled_range, &job, sizeof job);
}


/* ---- scaled OCP elements per channel along the last dimension: a column of [rows, columns] per scale ---- */
typedef struct {
    const float *x;
    float *out;
    int64_t rows, columns, part_rows;
    int32_t *parts; /* [parts][columns]: each part's largest finite magnitude bits per column */
    float *scales;
    ocp_element element;
    int mode, streamed, clamp_inf; /* streamed: stream.h's lb_storage */
} column_job;

static void column_maxima(const void *context, int64_t begin, int64_t end) { /* begin, end: elements, whole parts */
    const column_job *job = context;
    int64_t columns = job->columns;
    float wide[LB_TILE] __attribute__((aligned(64)));
    for (int64_t first = begin / columns; first < end / columns; first += job->part_rows) {
        int64_t stop = first + job->part_rows < end / columns ? first + job->part_rows : end / columns;
        int32_t *restrict part = job->parts + (first / job->part_rows) * columns;
        for (int64_t k = 0; k < columns; k++) part[k] = 0;
        for (int64_t row = first; row < stop; row++)
            for (int64_t column = 0, n; column < columns; column += n) { /* a tile at most, for halves */
                n = columns - column < LB_TILE ? columns - column : LB_TILE;
                const float *restrict x = job->x + row * columns + column;
                if (job->streamed < 0) { /* halves: widened first */
                    lb_widen_halves((const uint16_t *)(const void *)job->x + row * columns + column, wide, n,
                                    lb_half_kind(job->streamed));
                    x = wide;
                }
                int32_t *restrict largest = part + column;
                for (int64_t k = 0; k < n; k++) { /* finite magnitudes only (NaN and inf count as 0) */
                    int32_t magnitude = (int32_t)(lb_bits(x[k]) & 0x7fffffffu);
                    magnitude = magnitude <= 0x7f7fffff ? magnitude : 0;
                    largest[k] = magnitude > largest[k] ? magnitude : largest[k];
                }
            }
    }
}

#define COLUMN_LOOP(MODE) \
    do { \
        const ocp_element element = job->element; \
        if (element.saturating && !job->clamp_inf) \
            for (int64_t k = 0; k < n; k++) out[k] = round_saturating(x[k] / scale[k], element, MODE) * scale[k]; \
        else if (element.saturating) \
            for (int64_t k = 0; k < n; k++) { \
                float result = round_saturating(x[k] / scale[k], element, MODE) * scale[k]; \
                out[k] = isfinite(x[k]) ? lb_clamp(result, LB_FLOAT32_MAX) : result; \
            } \
        else /* an inf from a finite x becomes +-max, as scaled_elements does for derived scales */ \
            for (int64_t k = 0; k < n; k++) { \
                float result = round_overflowing(x[k] / scale[k], element, MODE) * scale[k]; \
                out[k] = isfinite(x[k]) ? lb_clamp(result, LB_FLOAT32_MAX) : result; \
            } \
    } while (0)

/* Elements x[0, n) from column `column` on (within one row) with their columns' scales. */
static void column_span(const column_job *job, const float *restrict x, float *restrict out, int64_t n, int64_t column) {
    const float *restrict scale = job->scales + column;
    LB_FOR_EACH_MODE(job->mode, COLUMN_LOOP);
}

/* column_elements over halves: a tile at a time widened, computed, narrowed. */
static void column_half_elements(const column_job *job, int64_t begin, int64_t end) {
    float wide[LB_TILE] __attribute__((aligned(64))), result[LB_TILE] __attribute__((aligned(64)));
    int kind = lb_half_kind(job->streamed);
    for (int64_t at = begin, n; at < end; at += n) {
        int64_t column = at % job->columns;
        n = job->columns - column < LB_TILE ? job->columns - column : LB_TILE;
        lb_widen_halves((const uint16_t *)(const void *)job->x + at, wide, n, kind);
        column_span(job, wide, result, n, column);
        lb_narrow_halves(result, (uint16_t *)(void *)job->out + at, n, kind);
    }
}

static void column_elements(const void *context, int64_t begin, int64_t end) { /* begin, end: whole rows */
    const column_job *job = context;
    if (job->streamed < 0) {
        column_half_elements(job, begin, end);
        return;
    }
    lb_sink sink;
    lb_sink_open(&sink, job->out, job->streamed);
    for (int64_t at = begin, n; at < end; at += n) {
        int64_t column = at % job->columns;
        n = lb_sink_span(&sink, job->columns - column);
        column_span(job, job->x + at, lb_sink_next(&sink, at, n), n, column);
    }
    lb_sink_close(&sink);
}

/* Scaled OCP elements with one derived f32 scale per column of x viewed as [rows, columns] (per channel along
 * the last dimension): the columns' finite maxima over every row, ocp_float.covering_scale, then the elements.
 * Nearest modes only (the directed ones adjust against the grid and, some, the scale): 0 declines, as where
 * memory is short; the caller then runs the eager path. half: as run_blocks. */
int lb_ocp_columns_f32(const float *x, float *out, int64_t rows, int64_t columns, int mantissa_bits,
                       int min_exponent, float max_value, int overflow_kind, int saturate, int mode, int half,
                       int threads) {
    if (mode != LB_NEAREST_EVEN && mode != LB_NEAREST_AWAY && mode != LB_NEAREST_TOWARD_ZERO && mode != LB_NEAREST_UP &&
        mode != LB_NEAREST_DOWN)
        return 0;
    int64_t part_rows = (rows + 63) / 64, parts = (rows + part_rows - 1) / part_rows;
    column_job job = {x, out, rows, columns, part_rows, NULL, NULL,
                      make_element(mantissa_bits, min_exponent, max_value, overflow_kind, saturate, mode), mode,
                      lb_storage(rows * columns, threads, half), 0};
    char *memory = malloc((size_t)columns * (sizeof(int32_t) * (size_t)parts + sizeof(float)));
    if (!memory) return 0;
    job.parts = (int32_t *)memory, job.scales = (float *)(job.parts + parts * columns);
    lb_parallel(rows * columns, part_rows * columns, threads, column_maxima, &job);
    for (int64_t k = 0; k < columns; k++) {
        int32_t largest = 0;
        for (int64_t p = 0; p < parts; p++) largest = job.parts[p * columns + k] > largest ? job.parts[p * columns + k] : largest;
        job.scales[k] = covering_scale(lb_float((uint32_t)largest), max_value);
        /* as scaled_apply: saturated elements times a scale whose product with the max is finite stay finite */
        job.clamp_inf |= !(job.scales[k] * max_value <= LB_FLOAT32_MAX);
    }
    lb_parallel(rows * columns, columns, threads, column_elements, &job);
    free(memory);
    return 1;
}
